//! ProvisioningRequests end to end: a request shaped as Kueue creates it (a PodTemplate, then a
//! ProvisioningRequest naming it) through the API, to its conditions and the capacity written,
//! on the emulator's Kubernetes side (real time, bounded waits) and on a real kube-apiserver 1.20
//! with the CRD from `deploy/base` installed (ignored by plain `cargo test`; run by
//! `.ci/real-apiserver.sh`, which runs every ignored test with `KUBECONFIG` set). The store
//! protocol (status subresource, 409 on a stale `resourceVersion`, watch, generation) is checked
//! the same way on both servers, so the emulator answers as the Go API server does.

use crate::crd::{install_crd, namespace, real_client, table, unique};
use crate::support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, WatchEvent, WatchParams};
use serde_json::{json, Value};
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;
use vmss_capacity_controller::kube::provreq::{
    api_resource, KubeProvReqs, ProvReqError, ProvReqStore,
};
use vmss_capacity_controller::kube::status_object::StatusStore;
use vmss_capacity_controller::pods::provreq::{BEST_EFFORT_ATOMIC, CHECK_CAPACITY};

const ATOMIC: &str = BEST_EFFORT_ATOMIC;

/// Kueue's two objects: PodTemplate `name` (one container asking for `cpu`) and a
/// ProvisioningRequest `name` of `class` for `count` of its pods.
async fn kueue_request(
    client: &kube::Client,
    ns: &str,
    name: &str,
    class: &str,
    cpu: &str,
    count: i64,
) {
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), ns);
    let t: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/managed": "true"}},
        "template": {"metadata": {"labels": {"job-name": name}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "train", "image": "train",
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}},
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &t)
        .await
        .expect("PodTemplate created");
    create_request(
        client,
        ns,
        name,
        class,
        json!([{"podTemplateRef": {"name": name}, "count": count}]),
    )
    .await;
}

async fn create_request(client: &kube::Client, ns: &str, name: &str, class: &str, sets: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    let o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"provisioningClassName": class, "podSets": sets,
            "parameters": {"ValidUntilSeconds": "3600"}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &o)
        .await
        .expect("ProvisioningRequest created");
}

/// The request's conditions as `(type, status, reason)`.
async fn conditions(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    let Ok(o) = api.get(name).await else {
        return Vec::new();
    };
    o.data["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                    (s("type"), s("status"), s("reason"))
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn message(client: &kube::Client, ns: &str, name: &str, kind: &str) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource());
    let o = api.get(name).await.expect("request read");
    o.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn has(conds: &[(String, String, String)], kind: &str, status: &str, reason: &str) -> bool {
    conds
        .iter()
        .any(|(k, s, r)| k == kind && s == status && r == reason)
}

/// Waits (at most 20 s) for condition `kind` to be `status` with `reason`.
async fn until_condition(
    client: &kube::Client,
    ns: &str,
    name: &str,
    kind: &str,
    status: &str,
    reason: &str,
) -> Vec<(String, String, String)> {
    let mut last = Vec::new();
    for _ in 0..200 {
        last = conditions(client, ns, name).await;
        if has(&last, kind, status, reason) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{ns}/{name} never had {kind}={status} ({reason}): {last:?}");
}

/// A cluster serving requests, polled every second.
async fn serving(
    seeds: &[support::pod_cluster::Seed<'_>],
    max: u32,
    on: Option<kube::Client>,
) -> Cluster {
    let tweak = |s: &mut vmss_capacity_controller::config::Settings| {
        s.pod_demand.provisioning_requests = true;
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
        s.scan_interval = Duration::from_secs(1);
    };
    match on {
        Some(client) => Cluster::start_on(seeds, max, client, tweak).await,
        None => Cluster::start_with(seeds, max, tweak).await,
    }
}

// --- the scenarios, on either server ------------------------------------------------------------

/// An atomic request for 6 pods of 1 cpu: one write of 2 D4s_v5 nodes (3 whole cpus each after
/// AKS's reservations), then `Accepted` and `Provisioned=True` (`CapacityIsProvisioned`).
async fn atomic_request_is_provisioned_with_one_write(c: &Cluster, ns: &str) {
    let name = unique("train");
    kueue_request(&c.client, ns, &name, ATOMIC, "1", 6).await;
    let conds = until_condition(
        &c.client,
        ns,
        &name,
        "Provisioned",
        "True",
        "CapacityIsProvisioned",
    )
    .await;
    assert!(has(&conds, "Accepted", "True", "Accepted"), "{conds:?}");
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 2).await,
        "capacity {}",
        c.capacity("general")
    );
    // Decided again each second while booked: the booking sits on the new nodes, no new write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        c.capacity_puts("general"),
        1,
        "one write for the whole request"
    );
    assert_eq!(c.capacity("general"), 2);
    assert!(!has(
        &conditions(&c.client, ns, &name).await,
        "Failed",
        "True",
        "CapacityIsNotFound"
    ));
}

/// An atomic request whose pods fit no node of any group: `Failed` with the reason, no write.
async fn impossible_atomic_request_fails_and_writes_nothing(c: &Cluster, ns: &str) {
    let name = unique("huge");
    kueue_request(&c.client, ns, &name, ATOMIC, "64", 2).await;
    until_condition(&c.client, ns, &name, "Failed", "True", "CapacityIsNotFound").await;
    let why = message(&c.client, ns, &name, "Failed").await;
    assert!(why.contains("general: ") && why.contains("cpu"), "{why}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.capacity_puts("general"),
        0,
        "nothing written for an atomic request that cannot be met"
    );
    assert_eq!(c.capacity("general"), 0);
}

// --- on the emulator --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kueue_shaped_atomic_request_gets_all_its_nodes_in_one_write_and_is_provisioned() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    atomic_request_is_provisioned_with_one_write(&c, "default").await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_request_that_cannot_be_met_fails_with_the_reason_and_nothing_is_written() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    impossible_atomic_request_fails_and_writes_nothing(&c, "default").await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_request_beyond_the_groups_max_raises_no_capacity_and_waits() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 2, None).await;
    kueue_request(&c.client, "default", "wide", ATOMIC, "1", 10).await;
    until_condition(
        &c.client,
        "default",
        "wide",
        "Provisioned",
        "False",
        "CapacityIsNotFound",
    )
    .await;
    assert!(message(&c.client, "default", "wide", "Provisioned")
        .await
        .contains("max size"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.capacity_puts("general"),
        0,
        "two nodes would take 6 of the 10 pods: none is asked for"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_capacity_request_without_room_on_the_nodes_there_writes_no_capacity() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    kueue_request(&c.client, "default", "check", CHECK_CAPACITY, "1", 2).await;
    until_condition(
        &c.client,
        "default",
        "check",
        "Provisioned",
        "False",
        "CapacityIsNotFound",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.capacity_puts("general"),
        0,
        "check-capacity never writes capacity"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_missing_pod_template_fails_saying_which_and_a_foreign_class_is_left_alone(
) {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    create_request(
        &c.client,
        "default",
        "orphan",
        ATOMIC,
        json!([{"podTemplateRef": {"name": "nowhere"}, "count": 1}]),
    )
    .await;
    create_request(
        &c.client,
        "default",
        "gke",
        "queued-provisioning.gke.io",
        json!([{"podTemplateRef": {"name": "nowhere"}, "count": 1}]),
    )
    .await;
    until_condition(
        &c.client,
        "default",
        "orphan",
        "Failed",
        "True",
        "FailedToCreatePods",
    )
    .await;
    let why = message(&c.client, "default", "orphan", "Failed").await;
    assert!(
        why.contains("PodTemplate default/nowhere not found"),
        "{why}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        conditions(&c.client, "default", "gke").await.is_empty(),
        "not our class: untouched"
    );
    assert_eq!(c.capacity_puts("general"), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_consuming_a_request_do_not_trigger_a_normal_scale_up() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    let pod = |name: &str, annotations: Value| {
        json!({
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"containers": [{"name": "app", "image": "app",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable", "message": "0/0 nodes are available"}]},
        })
    };
    // Left to its request (of a class nobody here serves): no scale-up for it.
    c.kube
        .create(
            "v1",
            "pods",
            "default",
            pod(
                "consumer",
                json!({
            "autoscaling.x-k8s.io/consume-provisioning-request": "elsewhere",
            "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io"}),
            ),
        )
        .expect("consumer created");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        c.capacity_puts("general"),
        0,
        "a consumer's capacity is its request's"
    );
    // The same pod without the annotations gets its node: the loop was listening.
    c.kube
        .create("v1", "pods", "default", pod("plain", json!({})))
        .expect("plain pod created");
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 1).await,
        "capacity {}",
        c.capacity("general")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_empty_nodes_an_atomic_request_grew_are_kept_while_booked_and_an_unbooked_empty_node_goes(
) {
    let c = Cluster::start_simulated(
        &[
            ("general", "Standard_D4s_v5", 0, &[]),
            ("spare", "Standard_D2s_v5", 1, &[]),
        ],
        10,
        |s| {
            s.pod_demand.provisioning_requests = true;
            s.scan_interval = Duration::from_millis(300);
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
            s.scale_down.enabled = true;
            s.scale_down.unneeded_time = Duration::from_secs(1);
            s.scale_down.delay_after_add = Duration::ZERO;
            s.scale_down.node_delete_delay_after_taint = Duration::from_millis(300);
            s.scale_down.max_pod_eviction_time = Duration::from_secs(5);
            for g in &mut s.node_groups {
                g.min_size = 0;
            }
        },
    )
    .await;
    // 2.5 cpus each: one D4s_v5 per pod, none on the D2s_v5 there.
    kueue_request(&c.client, "default", "train", ATOMIC, "2500m", 2).await;
    until_condition(
        &c.client,
        "default",
        "train",
        "Provisioned",
        "True",
        "CapacityIsProvisioned",
    )
    .await;
    assert!(
        eventually(Duration::from_secs(10), || c.kube.ready_nodes().len() == 3).await,
        "the two new nodes never turned Ready: {:?}",
        c.kube.ready_nodes()
    );
    // Scale-down runs: the spare group's empty node goes...
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("spare") == 0).await,
        "the unbooked empty node was not removed"
    );
    // ...while the booked ones, as empty, stay (the booking lasts 10 min).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.capacity("general"), 2, "a booked node was removed");
    assert_eq!(c.capacity_puts("general"), 1);
    c.stop().await;
}

// --- the store protocol, on either server -------------------------------------------------------

/// Requests of a class nobody serves, so a controller running beside never writes them.
async fn store_protocol(client: &kube::Client, ns: &str) {
    let name = unique("proto");
    kueue_request(client, ns, &name, "other.example.com", "1", 1).await;
    let store = KubeProvReqs::new(client.clone());
    let (requests, templates) = store.list().await.expect("listed");
    let read = requests
        .iter()
        .find(|r| r.name() == name)
        .expect("listed request")
        .clone();
    assert!(
        templates.contains_key(&(ns.to_string(), name.clone())),
        "its PodTemplate is listed"
    );
    assert_eq!(read.metadata.generation, Some(1));
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
    written["status"] = json!({"conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
        "message": "Provisioning Request was accepted", "lastTransitionTime": "2026-11-28T00:00:00Z"}]});
    // The status write may not change the spec: the server keeps the stored one.
    written["spec"]["podSets"][0]["count"] = json!(5);
    let fresh = store
        .replace_status(&written)
        .await
        .expect("status written");
    assert_ne!(
        fresh.metadata.resource_version.as_deref(),
        Some(rv.as_str())
    );
    assert_eq!(
        fresh.spec.pod_sets[0].count, 1,
        "a status write leaves the spec"
    );
    assert!(fresh.is_true("Accepted"));
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
        WatchEvent::Modified(o) => {
            assert_eq!(o.data["status"]["conditions"][0]["type"], "Accepted")
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // kubectl's table: the CRD's printer columns, and the PodTemplate printer.
    let (columns, cells) = table(
        client,
        &format!("/apis/autoscaling.x-k8s.io/v1/namespaces/{ns}/provisioningrequests/{name}"),
    )
    .await;
    assert_eq!(
        columns,
        ["Name", "AccessTime", "Accepted", "Provisioned", "Failed"]
    );
    assert_eq!(cells[0], json!(name));
    assert!(
        cells[1].as_str().is_some_and(|a| a.ends_with('s')),
        "an age: {cells:?}"
    );
    assert_eq!(cells[2..], [json!("True"), Value::Null, Value::Null]);
    let (columns, cells) = table(
        client,
        &format!("/api/v1/namespaces/{ns}/podtemplates/{name}"),
    )
    .await;
    assert_eq!(columns, ["Name", "Containers", "Images", "Pod Labels"]);
    assert_eq!(
        cells,
        [
            json!(name),
            json!("train"),
            json!("train"),
            json!(format!("job-name={name}"))
        ]
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
    main["status"] = json!({"conditions": []});
    main["spec"]["podSets"][0]["count"] = json!(2);
    let o: DynamicObject = serde_json::from_value(main).unwrap();
    let after = api
        .replace(&name, &PostParams::default(), &o)
        .await
        .expect("main write");
    assert_eq!(
        after.data["status"]["conditions"][0]["type"], "Accepted",
        "the main resource's write keeps the status"
    );
    assert_eq!(after.metadata.generation, Some(2));
    // Gone: the write carries the uid read, and the server's uid precondition refuses it with a
    // 409 (a 404 only without a uid); the controller reads it afresh and finds nothing.
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("deleted");
    let err = store.replace_status(&fresh.object).await;
    assert!(matches!(err, Err(ProvReqError::Conflict(_))), "{err:?}");
    let mut no_uid = fresh.object.clone();
    no_uid["metadata"].as_object_mut().unwrap().remove("uid");
    let err = store.replace_status(&no_uid).await;
    assert!(matches!(err, Err(ProvReqError::NotFound(_))), "{err:?}");
    assert!(store.get(ns, &name).await.expect("read").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_serves_provisioning_requests_and_pod_templates_as_the_api_server_does() {
    let c = serving(&[("general", "Standard_D4s_v5", 0, &[])], 10, None).await;
    store_protocol(&c.client, "default").await;
    c.stop().await;
}

// --- on a real kube-apiserver -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn on_a_real_api_server_the_store_protocol_holds() {
    let client = real_client().await;
    install_crd(
        &client,
        "crd-provisioningrequests.yaml",
        "provisioningrequests.autoscaling.x-k8s.io",
    )
    .await;
    let ns = namespace(&client, "provreq-proto").await;
    store_protocol(&client, &ns).await;
}

/// Deletes every ProvisioningRequest of the classes served here: a controller lists them in
/// every namespace, and one left booked by an earlier run would ask the next cluster for room.
async fn clear_served_requests(client: &kube::Client) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource());
    for o in api.list(&Default::default()).await.expect("listed").items {
        let class = o.data["spec"]["provisioningClassName"]
            .as_str()
            .unwrap_or_default();
        if class == ATOMIC || class == CHECK_CAPACITY {
            let ns = o.metadata.namespace.clone().unwrap_or_default();
            let name = o.metadata.name.clone().unwrap_or_default();
            let _ = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &api_resource())
                .delete(&name, &DeleteParams::default())
                .await;
        }
    }
}

// One test, scenarios in turn: two controllers on one API server would both serve every
// request (as two cluster-autoscalers would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn on_a_real_api_server_kueue_shaped_requests_are_provisioned_in_one_write_or_fail_writing_nothing(
) {
    let client = real_client().await;
    install_crd(
        &client,
        "crd-provisioningrequests.yaml",
        "provisioningrequests.autoscaling.x-k8s.io",
    )
    .await;
    clear_served_requests(&client).await;
    let ns = namespace(&client, "provreq-atomic").await;
    let c = serving(
        &[("general", "Standard_D4s_v5", 0, &[])],
        10,
        Some(client.clone()),
    )
    .await;
    atomic_request_is_provisioned_with_one_write(&c, &ns).await;
    c.stop().await;
    clear_served_requests(&client).await;
    let c = serving(
        &[("general", "Standard_D4s_v5", 0, &[])],
        10,
        Some(client.clone()),
    )
    .await;
    impossible_atomic_request_fails_and_writes_nothing(&c, &ns).await;
    c.stop().await;
    clear_served_requests(&client).await;
}

/// Production timings on tokio's paused clock: the booking holds the request's empty nodes for
/// 10 minutes, then `BookingExpired` (`CapacityReservationTimeExpired`), and scale-down removes
/// them `unneededTime` (10 min) later.
#[tokio::test(start_paused = true)]
async fn a_booking_ends_after_ten_minutes_and_then_its_empty_nodes_are_scaled_down() {
    use vmss_capacity_controller::emulator::sim::SimSettings;
    let sim = SimSettings {
        boot_delay: Duration::from_secs(60),
        tick: Duration::from_secs(1),
    };
    let c = Cluster::start_simulated_on_tokio_clock(
        &[("general", "Standard_D4s_v5", 0, &[])],
        10,
        sim,
        |s| {
            s.pod_demand.provisioning_requests = true;
            s.scan_interval = Duration::from_secs(10);
            s.scale_down.enabled = true;
            for g in &mut s.node_groups {
                g.min_size = 0;
            }
        },
    )
    .await;
    kueue_request(&c.client, "default", "train", ATOMIC, "2500m", 2).await;
    let provisioned = tokio::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(120), || c.kube.ready_nodes().len() == 2).await,
        "the request's nodes never turned Ready"
    );
    assert!(has(
        &conditions(&c.client, "default", "train").await,
        "Provisioned",
        "True",
        "CapacityIsProvisioned"
    ));
    // Nine minutes in: still booked, nodes kept although empty.
    tokio::time::sleep_until(provisioned + Duration::from_secs(9 * 60)).await;
    let conds = conditions(&c.client, "default", "train").await;
    assert!(
        !conds.iter().any(|(k, _, _)| k == "BookingExpired"),
        "{conds:?}"
    );
    assert_eq!(c.capacity("general"), 2);
    // Past ten minutes: the booking ends.
    let mut expired = false;
    for _ in 0..120 {
        let conds = conditions(&c.client, "default", "train").await;
        if has(
            &conds,
            "BookingExpired",
            "True",
            "CapacityReservationTimeExpired",
        ) {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(expired, "no BookingExpired by 11 min");
    assert!(provisioned.elapsed() >= Duration::from_secs(10 * 60));
    assert_eq!(c.capacity("general"), 2, "not removed while booked");
    // Nothing keeps the empty nodes now: unneededTime later they go.
    assert!(
        eventually(Duration::from_secs(15 * 60), || c.capacity("general") == 0).await,
        "the idle nodes stayed: capacity {}",
        c.capacity("general")
    );
    assert!(
        provisioned.elapsed() >= Duration::from_secs(20 * 60),
        "removed {:?} after provisioning, before the booking and unneededTime were over",
        provisioned.elapsed()
    );
    c.stop().await;
}
