//! CapacityBuffers end to end: a buffer (a PodTemplate or a Deployment's pods) through the API,
//! to its status and the capacity written, on the emulator's simulated cluster (tokio's paused
//! clock, production scale-down timings) and, for the store protocol (status subresource, 409 on
//! a stale `resourceVersion`, watch, generation, kubectl's table), on a real kube-apiserver 1.20
//! with the CRD from `deploy/base` installed (ignored by plain `cargo test`; run by
//! `.ci/real-apiserver.sh`, which runs every ignored test with `KUBECONFIG` set).

use crate::crd::{install_crd, namespace, real_client, table, unique};
use crate::support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, WatchEvent, WatchParams};
use serde_json::{json, Value};
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;
use vmss_capacity_controller::emulator::sim::SimSettings;
use vmss_capacity_controller::kube::buffer::{api_resource, BufferStore, KubeBuffers};
use vmss_capacity_controller::kube::provreq::ProvReqError;
use vmss_capacity_controller::kube::status_object::StatusStore;

/// PodTemplate `name`: one container asking for `cpu` and 1 GiB.
async fn pod_template(client: &kube::Client, ns: &str, name: &str, cpu: &str) {
    let api: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let t: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "containers": [{"name": "app", "image": "app",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &t)
        .await
        .expect("PodTemplate created");
}

async fn create_buffer(client: &kube::Client, ns: &str, name: &str, spec: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    let o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &o)
        .await
        .expect("CapacityBuffer created");
}

async fn status(client: &kube::Client, ns: &str, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    api.get(name)
        .await
        .map(|o| o.data["status"].clone())
        .unwrap_or(Value::Null)
}

fn condition<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// Waits (at most `patience`, tokio's clock) for `ReadyForProvisioning` to be `want`.
async fn until_ready(
    client: &kube::Client,
    ns: &str,
    name: &str,
    want: &str,
    patience: Duration,
) -> Value {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let s = status(client, ns, name).await;
        if condition(&s, "ReadyForProvisioning").is_some_and(|c| c["status"] == want) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ns}/{name} never had ReadyForProvisioning={want}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn node_of(c: &Cluster, pod: &str) -> Option<String> {
    c.kube
        .get("v1", "pods", "default", pod)
        .ok()?
        .pointer("/spec/nodeName")?
        .as_str()
        .map(str::to_string)
}

/// A simulated cluster serving buffers with production timings (10 s scan, 10 min
/// `scaleDownUnneededTime`), VMs booting in a minute, on tokio's paused clock.
async fn buffered(seeds: &[support::pod_cluster::Seed<'_>], inject: bool) -> Cluster {
    let sim = SimSettings {
        boot_delay: Duration::from_secs(60),
        tick: Duration::from_secs(1),
    };
    Cluster::start_simulated_on_tokio_clock(seeds, 10, sim, |s| {
        s.pod_demand.capacity_buffer_controller = true;
        s.pod_demand.capacity_buffer_pod_injection = inject;
        s.scan_interval = Duration::from_secs(10);
        s.scale_down.enabled = true;
        for g in &mut s.node_groups {
            g.min_size = 0;
        }
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_buffer_grows_a_group_with_no_pending_pod_its_node_is_kept_and_a_real_pod_lands_there_at_once(
) {
    let c = buffered(&[("general", "Standard_D4s_v5", 0, &[])], true).await;
    // 2.5 cpus: one pod per D4s_v5 node (3 whole cpus after AKS's reservations).
    pod_template(&c.client, "default", "web", "2500m").await;
    create_buffer(
        &c.client,
        "default",
        "headroom",
        json!({"podTemplateRef": {"name": "web"}, "replicas": 1}),
    )
    .await;
    let s = until_ready(
        &c.client,
        "default",
        "headroom",
        "True",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(s["replicas"], 1, "{s}");
    assert_eq!(s["podTemplateRef"]["name"], "web");
    assert_eq!(s["provisioningStrategy"], "buffer.x-k8s.io/active-capacity");
    assert_eq!(condition(&s, "Provisioning").unwrap()["status"], "True");
    assert!(
        eventually(Duration::from_secs(180), || c.kube.ready_nodes().len() == 1).await,
        "no node for the buffer: capacity {}",
        c.capacity("general")
    );
    assert_eq!(c.capacity("general"), 1, "one node for the one buffer pod");
    let booted = tokio::time::Instant::now();
    // Past scaleDownUnneededTime (10 min) the node, empty of real pods, is still there.
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    assert_eq!(
        c.capacity("general"),
        1,
        "scale-down removed the buffer's node"
    );
    assert_eq!(c.capacity_puts("general"), 1);
    // A real pod: it lands on the buffered room at once, well before a VM could boot...
    c.pending("real", "2500m", "1Gi", json!({}));
    let placed = tokio::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || node_of(&c, "real").is_some()).await,
        "the real pod did not land on the buffer's room"
    );
    assert!(placed.elapsed() < Duration::from_secs(60));
    assert_eq!(
        c.kube.ready_nodes().len(),
        1,
        "no new node was needed for it"
    );
    // ...and the buffer refills: its pod no longer fits, a second node is asked for.
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("general") == 2).await,
        "the buffer did not refill: capacity {}",
        c.capacity("general")
    );
    assert!(booted.elapsed() >= Duration::from_secs(15 * 60));
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_buffer_of_a_percentage_of_a_deployment_keeps_room_for_that_share_rounded_up() {
    let c = buffered(&[("general", "Standard_D4s_v5", 0, &[])], true).await;
    // A Deployment of 3 replicas (the simulation makes its pods, which ask for nodes of their
    // own): the buffer reads its replicas and template.
    c.kube
        .create(
            "apps/v1",
            "deployments",
            "default",
            json!({"metadata": {"name": "api", "namespace": "default"},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "api"}},
                    "template": {"metadata": {"labels": {"app": "api"}}, "spec": {
                        "containers": [{"name": "api", "image": "api",
                            "resources": {"requests": {"cpu": "2500m", "memory": "1Gi"}}}]}}}}),
        )
        .expect("deployment created");
    create_buffer(
        &c.client,
        "default",
        "api-headroom",
        json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "api"},
            "percentage": 50}),
    )
    .await;
    let s = until_ready(
        &c.client,
        "default",
        "api-headroom",
        "True",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(s["replicas"], 2, "50% of 3, rounded up: {s}");
    assert!(s.get("podTemplateRef").is_none(), "{s}");
    c.stop().await;
}

/// A ResourceQuota of `ns` limiting `requests.cpu` to `hard` with `used` already counted: its
/// status written through the status subresource, as kube-controller-manager's quota controller
/// writes it.
async fn resource_quota(client: &kube::Client, ns: &str, name: &str, hard: &str, used: &str) {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let q: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": {"requests.cpu": hard}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &q)
        .await
        .expect("ResourceQuota created");
    // On a real cluster kube-controller-manager's quota controller writes the status too: a
    // write of ours from a version it replaced meets a 409, and is made again from a fresh read.
    for _ in 0..20 {
        let mut current = api.get(name).await.expect("ResourceQuota read");
        current.status = serde_json::from_value(
            json!({"hard": {"requests.cpu": hard}, "used": {"requests.cpu": used}}),
        )
        .unwrap();
        match api
            .replace_status(name, &PostParams::default(), &current)
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("ResourceQuota status not written: {e}"),
        }
    }
    panic!("ResourceQuota status: 409 twenty times in a row");
}

/// A buffer of 3 pods of 2.5 cpus in a namespace whose quota has 5 cpus left: 2 pods, 2 nodes,
/// `LimitedByQuotas` naming the quota; `settle` later, still 2.
async fn a_buffer_cut_by_a_quota_grows_only_what_the_quota_admits(
    c: &Cluster,
    ns: &str,
    settle: Duration,
) {
    pod_template(&c.client, ns, "web", "2500m").await;
    // 5 cpus, none used (as kube-controller-manager's quota controller also counts it: no real pod
    // runs in the namespace): 2 pods of 2.5.
    resource_quota(&c.client, ns, "team", "5", "0").await;
    create_buffer(
        &c.client,
        ns,
        "headroom",
        json!({"podTemplateRef": {"name": "web"}, "replicas": 3}),
    )
    .await;
    let s = until_ready(&c.client, ns, "headroom", "True", Duration::from_secs(60)).await;
    assert_eq!(s["replicas"], 2, "{s}");
    let limited = condition(&s, "LimitedByQuotas").expect("LimitedByQuotas");
    assert_eq!(limited["status"], "True", "{s}");
    assert_eq!(limited["reason"], "ResourceQuotasAllocated");
    assert_eq!(
        limited["message"],
        "Buffer replicas limited from 3 to 2 due to quotas: team"
    );
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("general") == 2).await,
        "capacity {}, expected a node for each admitted buffer pod",
        c.capacity("general")
    );
    // No third node follows.
    tokio::time::sleep(settle).await;
    assert_eq!(c.capacity("general"), 2);
    assert_eq!(c.capacity_puts("general"), 1, "one write for the buffer");
    assert!(c.state.lost_updates().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_buffer_cut_by_its_namespaces_resource_quota_keeps_only_the_room_the_quota_admits() {
    let c = buffered(&[("general", "Standard_D4s_v5", 0, &[])], true).await;
    a_buffer_cut_by_a_quota_grows_only_what_the_quota_admits(
        &c,
        "default",
        Duration::from_secs(30),
    )
    .await;
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_buffer_naming_a_missing_template_says_which_and_grows_nothing() {
    let c = buffered(&[("general", "Standard_D4s_v5", 0, &[])], true).await;
    create_buffer(
        &c.client,
        "default",
        "orphan",
        json!({"podTemplateRef": {"name": "nowhere"}, "replicas": 2}),
    )
    .await;
    create_buffer(
        &c.client,
        "default",
        "foreign",
        json!({"provisioningStrategy": "example.com/cold", "podTemplateRef": {"name": "nowhere"}, "replicas": 2}),
    )
    .await;
    let s = until_ready(
        &c.client,
        "default",
        "orphan",
        "False",
        Duration::from_secs(60),
    )
    .await;
    let ready = condition(&s, "ReadyForProvisioning").unwrap();
    assert_eq!(ready["reason"], "PodTemplateNotFound");
    assert_eq!(
        ready["message"],
        "spec.podTemplateRef: PodTemplate default/nowhere not found"
    );
    assert_eq!(condition(&s, "Provisioning").unwrap()["status"], "False");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(c.capacity_puts("general"), 0);
    assert!(
        status(&c.client, "default", "foreign").await.is_null(),
        "another strategy's buffer is left alone"
    );
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_pod_injection_a_buffer_gets_its_status_but_no_node() {
    let c = buffered(&[("general", "Standard_D4s_v5", 0, &[])], false).await;
    pod_template(&c.client, "default", "web", "1").await;
    create_buffer(
        &c.client,
        "default",
        "headroom",
        json!({"podTemplateRef": {"name": "web"}, "replicas": 2}),
    )
    .await;
    let s = until_ready(
        &c.client,
        "default",
        "headroom",
        "True",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(s["replicas"], 2);
    assert_eq!(
        condition(&s, "Provisioning").unwrap()["reason"],
        "PodInjectionDisabled"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(c.capacity_puts("general"), 0);
    c.stop().await;
}

// --- the store protocol, on either server -------------------------------------------------------

/// A buffer of a strategy nobody serves, so a controller running beside never writes it.
async fn store_protocol(client: &kube::Client, ns: &str) {
    let name = unique("proto");
    pod_template(client, ns, &name, "1").await;
    create_buffer(
        client,
        ns,
        &name,
        json!({"provisioningStrategy": "example.com/other", "podTemplateRef": {"name": name}, "replicas": 1}),
    )
    .await;
    let store = KubeBuffers::new(client.clone());
    let (buffers, _) = store.list().await.expect("listed");
    let read = buffers
        .iter()
        .find(|b| b.name() == name)
        .expect("listed buffer")
        .clone();
    assert_eq!(read.metadata.generation, Some(1));
    // Discovery: the group serves both versions, GA first (kubectl's preferred).
    let req = http::Request::get("/apis/autoscaling.x-k8s.io")
        .body(Vec::new())
        .unwrap();
    let group: Value =
        serde_json::from_str(&client.request_text(req).await.expect("group")).expect("json");
    let versions: Vec<&str> = group["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert!(versions.contains(&"v1beta1"), "{group}");
    assert_eq!(group["preferredVersion"]["version"], versions[0]);
    let req = http::Request::get("/apis/autoscaling.x-k8s.io/v1beta1")
        .body(Vec::new())
        .unwrap();
    let list: Value =
        serde_json::from_str(&client.request_text(req).await.expect("resources")).expect("json");
    let cb = list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "capacitybuffers")
        .expect("capacitybuffers served")
        .clone();
    assert_eq!(cb["shortNames"], json!(["cb"]));
    assert_eq!(cb["namespaced"], true);
    // A watch from the version read sees the status write.
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    let rv = read.metadata.resource_version.clone().unwrap();
    let mut watch = api
        .watch(
            &WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(20),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let mut written = read.object.clone();
    written["status"] = json!({"replicas": 1, "podTemplateRef": {"name": name},
        "conditions": [{"type": "ReadyForProvisioning", "status": "True", "reason": "BufferResolved",
        "message": "1 pods of room kept", "lastTransitionTime": "2026-11-28T00:00:00Z"}]});
    // The status write may not change the spec: the server keeps the stored one.
    written["spec"]["replicas"] = json!(5);
    let fresh = store
        .replace_status(&written)
        .await
        .expect("status written");
    assert_ne!(
        fresh.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    assert_eq!(
        fresh.spec.replicas,
        Some(1),
        "a status write leaves the spec"
    );
    assert_eq!(fresh.object["status"]["replicas"], 1);
    assert_eq!(
        fresh.metadata.generation,
        Some(1),
        "a status write leaves the generation"
    );
    let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("a watch event within 10 s")
        .expect("stream open")
        .expect("event");
    match event {
        WatchEvent::Modified(o) => assert_eq!(o.data["status"]["replicas"], 1),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // kubectl's table: a CRD without printer columns prints NAME and AGE.
    let (columns, cells) = table(
        client,
        &format!("/apis/autoscaling.x-k8s.io/v1beta1/namespaces/{ns}/capacitybuffers/{name}"),
    )
    .await;
    assert_eq!(columns, ["Name", "Age"]);
    assert_eq!(cells[0], json!(name));
    assert!(
        cells[1].as_str().is_some_and(|a| a.ends_with('s')),
        "an age: {cells:?}"
    );
    // The same write from the stale read: 409, never applied.
    let err = store
        .replace_status(&written)
        .await
        .expect_err("stale resourceVersion refused");
    assert!(matches!(err, ProvReqError::Conflict(_)), "{err}");
    // No version at all: refused before it is sent.
    let mut blind = written.clone();
    blind["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    assert!(matches!(
        store.replace_status(&blind).await,
        Err(ProvReqError::Other { .. })
    ));
    // A write of the main resource keeps the stored status, and a spec change bumps the
    // generation.
    let mut main = fresh.object.clone();
    main["status"] = json!({});
    main["spec"]["replicas"] = json!(2);
    let o: DynamicObject = serde_json::from_value(main).unwrap();
    let after = api
        .replace(&name, &PostParams::default(), &o)
        .await
        .expect("main write");
    assert_eq!(
        after.data["status"]["replicas"], 1,
        "the main resource's write keeps the status"
    );
    assert_eq!(after.metadata.generation, Some(2));
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("deleted");
    assert!(store.get(ns, &name).await.expect("read").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_serves_capacity_buffers_as_the_api_server_does() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 10).await;
    store_protocol(&c.client, "default").await;
    c.stop().await;
}

// --- on a real kube-apiserver -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn on_a_real_api_server_the_capacity_buffer_store_protocol_holds() {
    let client = real_client().await;
    install_crd(
        &client,
        "crd-capacitybuffers.yaml",
        "capacitybuffers.autoscaling.x-k8s.io",
    )
    .await;
    let ns = namespace(&client, "buffer-proto").await;
    store_protocol(&client, &ns).await;
}

/// Deletes every active-capacity buffer on the server: a controller lists them in every
/// namespace, and one left by an earlier run would ask the next cluster for room. Buffers of
/// another strategy are no controller's here and stay: the store-protocol test, running beside
/// in the same binary, writes one (deleting it under that test made its status write a 409).
async fn clear_buffers(client: &kube::Client) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    for o in api.list(&Default::default()).await.expect("listed").items {
        let strategy = o.data["spec"]["provisioningStrategy"]
            .as_str()
            .unwrap_or(vmss_capacity_controller::pods::buffer::ACTIVE_CAPACITY);
        if strategy != vmss_capacity_controller::pods::buffer::ACTIVE_CAPACITY {
            continue;
        }
        let ns = o.metadata.namespace.clone().unwrap_or_default();
        let name = o.metadata.name.clone().unwrap_or_default();
        let _ = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &api_resource())
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

/// The whole controller against the real API server (the emulator plays only Azure): a buffer
/// and a ResourceQuota created as a user would, the buffer's status and conditions written
/// under the `resourceVersion` read, and the capacity the quota admits written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn on_a_real_api_server_a_buffer_cut_by_a_resource_quota_grows_what_the_quota_admits() {
    let client = real_client().await;
    install_crd(
        &client,
        "crd-capacitybuffers.yaml",
        "capacitybuffers.autoscaling.x-k8s.io",
    )
    .await;
    clear_buffers(&client).await;
    let ns = namespace(&client, "buffer-quota").await;
    let c = Cluster::start_on(
        &[("general", "Standard_D4s_v5", 0, &[])],
        10,
        client.clone(),
        |s| {
            s.pod_demand.capacity_buffer_controller = true;
            s.pod_demand.capacity_buffer_pod_injection = true;
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
            s.scan_interval = Duration::from_secs(1);
        },
    )
    .await;
    a_buffer_cut_by_a_quota_grows_only_what_the_quota_admits(&c, &ns, Duration::from_secs(5)).await;
    c.stop().await;
    clear_buffers(&client).await;
}
