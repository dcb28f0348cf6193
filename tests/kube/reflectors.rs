//! Reflectors against two servers, the cases written once: the emulator's Kubernetes side (in
//! process, always run) and a real kube-apiserver (ignored by plain `cargo test`; `.ci/run`
//! starts the server and runs the ignored tests with `KUBECONFIG` set). Each case works in its
//! own label (and namespace `default`), so runs on a shared real server do not see each other.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::kube::reflect::{self, Reflected, UNFINISHED_PODS};
use vmss_capacity_controller::metrics::Metrics;

async fn client_from(kubeconfig: &str) -> kube::Client {
    let file = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

async fn real_server() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let text = std::fs::read_to_string(&path).expect("KUBECONFIG is readable");
    client_from(&text).await
}

async fn emulator() -> (kube::Client, EmulatorHandle) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kubeconfig = handle.kubeconfig().expect("the Kubernetes side is on");
    (client_from(&kubeconfig).await, handle)
}

fn run_label() -> String {
    format!("r{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Waits (bounded: 10 s of real time, 50 ms steps) until `cond` holds on the snapshot.
async fn eventually<K>(r: &Reflected<K>, what: &str, cond: impl Fn(&reflect::Objects<K>) -> bool) {
    for _ in 0..200 {
        if r.synced() && cond(&r.snapshot()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn names<K: kube::Resource>(objects: &reflect::Objects<K>) -> Vec<String> {
    let mut v: Vec<String> = objects
        .values()
        .map(|o| o.meta().name.clone().unwrap_or_default())
        .collect();
    v.sort();
    v
}

fn node(name: &str, label: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"test-run": label}},
        "spec": {},
    }))
    .expect("a node")
}

fn pod(name: &str, label: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"test-run": label}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]},
    }))
    .expect("a pod")
}

async fn the_first_full_list_is_published_whole_then_kept_current(client: kube::Client) {
    let label = run_label();
    let nodes: Api<Node> = Api::all(client);
    let pp = PostParams::default();
    for n in ["a", "b"] {
        nodes
            .create(&pp, &node(&format!("{label}-{n}"), &label))
            .await
            .expect("node created");
    }
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let (view, task) = reflect::watch(
        nodes.clone(),
        watcher::Config::default().labels(&format!("test-run={label}")),
        "nodes",
        metrics.clone(),
        stop.clone(),
    );
    eventually(&view, "the first list", |o| o.len() == 2).await;
    assert_eq!(
        names(&view.snapshot()),
        [format!("{label}-a"), format!("{label}-b")]
    );

    nodes
        .create(&pp, &node(&format!("{label}-c"), &label))
        .await
        .expect("node created");
    eventually(&view, "the added node", |o| o.len() == 3).await;
    nodes
        .delete(&format!("{label}-a"), &DeleteParams::default())
        .await
        .expect("node deleted");
    eventually(&view, "the deleted node gone", |o| o.len() == 2).await;
    assert_eq!(
        names(&view.snapshot()),
        [format!("{label}-b"), format!("{label}-c")]
    );
    assert_eq!(
        metrics
            .kube_objects_cached
            .with_label_values(&["nodes"])
            .get(),
        2
    );
    stop.cancel();
    task.await.expect("the reflector ends on stop");
    for n in ["b", "c"] {
        let _ = nodes
            .delete(&format!("{label}-{n}"), &DeleteParams::default())
            .await;
    }
}

async fn a_pod_that_finishes_leaves_the_view(client: kube::Client) {
    let label = run_label();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    for n in ["running", "done"] {
        pods.create(&pp, &pod(&format!("{label}-{n}"), &label))
            .await
            .expect("pod created");
    }
    let stop = CancellationToken::new();
    let (view, task) = reflect::watch(
        pods.clone(),
        watcher::Config::default()
            .labels(&format!("test-run={label}"))
            .fields(UNFINISHED_PODS),
        "pods",
        Arc::new(Metrics::new()),
        stop.clone(),
    );
    eventually(&view, "both pods", |o| o.len() == 2).await;
    pods.patch_status(
        &format!("{label}-done"),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .expect("status patched");
    eventually(&view, "the finished pod gone", |o| o.len() == 1).await;
    assert_eq!(names(&view.snapshot()), [format!("{label}-running")]);
    stop.cancel();
    task.await.expect("the reflector ends on stop");
    for n in ["running", "done"] {
        let _ = pods
            .delete(&format!("{label}-{n}"), &DeleteParams::default())
            .await;
    }
}

/// Every kind, including PodDisruptionBudgets: `policy/v1`, or `policy/v1beta1` on a server
/// before 1.21 (the real one here is 1.20).
async fn the_cluster_view_is_ready_once_every_kind_is_listed(client: kube::Client) {
    let stop = CancellationToken::new();
    let (view, tasks) = reflect::start(client, Arc::new(Metrics::new()), stop.clone()).await;
    for _ in 0..200 {
        if view.synced() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(view.synced(), "not listed: {:?}", view.unsynced());
    stop.cancel();
    for t in tasks {
        t.await.expect("reflector ends on stop");
    }
}

/// The kinds the volume and affinity filters read (claims, volumes, classes, namespaces) are
/// listed and then kept current as objects are made after the first list, on both servers.
async fn storage_and_namespaces_made_after_the_first_list_reach_the_view(client: kube::Client) {
    use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let stop = CancellationToken::new();
    let (view, tasks) =
        reflect::start(client.clone(), Arc::new(Metrics::new()), stop.clone()).await;
    for _ in 0..200 {
        if view.synced() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(view.synced(), "not listed: {:?}", view.unsynced());
    let label = run_label();
    let pp = PostParams::default();
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": format!("{label}-zonal")},
        "provisioner": "disk.csi.azure.com",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [
            {"key": "topology.disk.csi.azure.com/zone", "values": ["westeurope-2"]}]}],
    }))
    .unwrap();
    Api::<StorageClass>::all(client.clone())
        .create(&pp, &class)
        .await
        .expect("class");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("{label}-pv")},
        "spec": {"capacity": {"storage": "8Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "disk.csi.azure.com", "volumeHandle": format!("/disks/{label}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": ["westeurope-2"]}]}]}}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&pp, &pv)
        .await
        .expect("volume");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": format!("{label}-data")},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": format!("{label}-zonal"),
            "resources": {"requests": {"storage": "8Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(&pp, &claim)
        .await
        .expect("claim");
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": format!("{label}-team"), "labels": {"team": &label}},
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &ns)
        .await
        .expect("namespace");

    eventually(&view.storage.classes, "the class", |o| {
        names(o).contains(&format!("{label}-zonal"))
    })
    .await;
    eventually(&view.storage.volumes, "the volume", |o| {
        names(o).contains(&format!("{label}-pv"))
    })
    .await;
    eventually(&view.storage.claims, "the claim", |o| {
        names(o).contains(&format!("{label}-data"))
    })
    .await;
    eventually(&view.namespaces, "the namespace and its labels", |o| {
        o.values().any(|n| {
            n.metadata.name.as_deref() == Some(format!("{label}-team").as_str())
                && n.metadata.labels.as_ref().and_then(|l| l.get("team")) == Some(&label)
        })
    })
    .await;
    // What the volume filters read of them: the volume's zone.
    let volumes = view.storage.volumes();
    assert!(
        format!("{volumes:?}").contains("westeurope-2"),
        "{volumes:?}"
    );

    let dp = DeleteParams::default();
    let _ = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .delete(&format!("{label}-data"), &dp)
        .await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&format!("{label}-pv"), &dp)
        .await;
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(&format!("{label}-zonal"), &dp)
        .await;
    let _ = Api::<Namespace>::all(client)
        .delete(&format!("{label}-team"), &dp)
        .await;
    stop.cancel();
    for t in tasks {
        t.await.expect("reflector ends on stop");
    }
}

/// One test per case and server.
macro_rules! against_both_servers {
    ($($case:ident),* $(,)?) => {
        mod on_the_emulator {
            $(
                #[tokio::test]
                async fn $case() {
                    let (client, _emulator) = super::emulator().await;
                    super::$case(client).await;
                }
            )*
        }
        mod on_a_real_api_server {
            $(
                #[tokio::test]
                #[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
                async fn $case() {
                    super::$case(super::real_server().await).await;
                }
            )*
        }
    };
}

against_both_servers!(
    the_first_full_list_is_published_whole_then_kept_current,
    a_pod_that_finishes_leaves_the_view,
    the_cluster_view_is_ready_once_every_kind_is_listed,
    storage_and_namespaces_made_after_the_first_list_reach_the_view,
);
