//! Reflectors whose watches are cut lose no object: against the emulator's Kubernetes side, with
//! watches that end every second (`watcher::Config::timeout(1)`, standing for the real server's
//! 5–10 minute watch timeouts and for connections cut by load balancers), while objects are
//! created, modified and deleted in between.
//!
//! - A watch that ends resumes from the last `resourceVersion` it saw (the emulator's watch log
//!   shows the resumes), without a relist, and the reflector's snapshot ends equal to the
//!   server's list.
//! - A resume the server refuses with 410 Gone (the history was compacted while the API was
//!   unreachable and objects changed) makes the reflector relist; the snapshot again ends equal
//!   to the server's list, objects created and deleted during the gap included, and
//!   `kube_watch_restarts_total{reason="relist"}` counts it.
//!
//! Real time, bounded: each test takes a few seconds.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::kube::reflect::{self, Reflected};
use vmss_capacity_controller::metrics::Metrics;

const NS: &str = "default";
const LABEL: &str = "test-run=watched";

async fn emulator() -> (kube::Client, KubeState, EmulatorHandle) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kubeconfig = handle.kubeconfig().expect("the Kubernetes side is on");
    let file = kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let state = handle.kube().expect("the Kubernetes side is on");
    (client, state, handle)
}

fn create(k: &KubeState, name: &str, watched: bool) {
    let run = if watched { "watched" } else { "other" };
    k.create(
        "v1",
        "configmaps",
        NS,
        json!({"metadata": {"name": name, "labels": {"test-run": run}}, "data": {"v": "0"}}),
    )
    .expect("created");
}

fn modify(k: &KubeState, name: &str, v: usize) {
    let mut cm = k.get("v1", "configmaps", NS, name).expect("exists");
    cm["data"]["v"] = json!(v.to_string());
    k.update("v1", "configmaps", NS, cm).expect("updated");
}

fn delete(k: &KubeState, name: &str) {
    k.delete("v1", "configmaps", NS, name).expect("deleted");
}

/// name → resourceVersion, as the reflector holds them.
fn snapshot(r: &Reflected<ConfigMap>) -> BTreeMap<String, String> {
    r.snapshot()
        .values()
        .map(|cm| {
            (
                cm.metadata.name.clone().unwrap_or_default(),
                cm.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// name → resourceVersion, as the server lists them.
async fn server_list(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    api.list(&ListParams::default().labels(LABEL))
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|cm| {
            (
                cm.metadata.name.unwrap_or_default(),
                cm.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits (bounded: `limit` of real time, 50 ms steps) until the snapshot equals the server's list.
async fn converges(r: &Reflected<ConfigMap>, api: &Api<ConfigMap>, limit: Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let want = server_list(api).await;
        let got = snapshot(r);
        if r.synced() && got == want {
            return;
        }
        if start.elapsed() > limit {
            panic!(
                "the reflector did not converge in {limit:?}:\n  held {got:?}\n  server {want:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn restarts(m: &Metrics, reason: &str) -> u64 {
    Metrics::counter_sum(
        &m.kube_watch_restarts_total,
        &[("kind", "configmaps"), ("reason", reason)],
    )
}

fn start_reflector(
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> (
    Api<ConfigMap>,
    Arc<Reflected<ConfigMap>>,
    tokio::task::JoinHandle<()>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let (view, task) = reflect::watch(
        api.clone(),
        watcher::Config::default().labels(LABEL).timeout(1),
        "configmaps",
        metrics.clone(),
        stop.clone(),
    );
    (api, view, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_cut_by_their_timeout_resume_from_their_resource_version_and_lose_no_object() {
    let (client, k, _h) = emulator().await;
    for i in 0..3 {
        create(&k, &format!("seed-{i}"), true);
    }
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let (api, view, task) = start_reflector(&client, &metrics, &stop);
    converges(&view, &api, Duration::from_secs(10)).await;

    // 3.5 s of churn across at least three watch timeouts: creates, modifications, deletes,
    // and changes to objects the watch does not select (the cluster version moves past it).
    for i in 0..70 {
        create(&k, &format!("cm-{i}"), true);
        create(&k, &format!("other-{i}"), false);
        if i % 2 == 1 {
            modify(&k, &format!("cm-{}", i - 1), i);
        }
        if i % 3 == 2 {
            delete(&k, &format!("cm-{}", i - 2));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    converges(&view, &api, Duration::from_secs(10)).await;

    let resumes: Vec<_> = k
        .watch_starts()
        .into_iter()
        .filter(|w| w.plural == "configmaps" && w.from.is_some_and(|v| v > 0))
        .collect();
    assert!(
        resumes.len() >= 3,
        "the watches ended and resumed from a resourceVersion: {resumes:?}"
    );
    assert!(resumes.iter().all(|w| !w.gone), "no resume was refused");
    assert_eq!(restarts(&metrics, "relist"), 0, "no relist was needed");
    assert_eq!(snapshot(&view).len(), 3 + 70 - 23);
    stop.cancel();
    task.await.expect("the reflector ends on stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_refused_with_410_after_a_compaction_relists_and_loses_no_object() {
    let (client, k, _h) = emulator().await;
    for i in 0..5 {
        create(&k, &format!("before-{i}"), true);
    }
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let (api, view, task) = start_reflector(&client, &metrics, &stop);
    converges(&view, &api, Duration::from_secs(10)).await;

    // The API becomes unreachable; the open watch ends at its timeout and every resume fails.
    k.set_unavailable(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Meanwhile objects change, and the history the watch would resume from is compacted away.
    for i in 0..5 {
        create(&k, &format!("during-{i}"), true);
        create(&k, &format!("other-{i}"), false);
    }
    delete(&k, "before-0");
    delete(&k, "during-4");
    modify(&k, "before-1", 1);
    k.compact();
    k.set_unavailable(false);

    // kube-runtime's backoff after the failed resumes is at most a few seconds here.
    converges(&view, &api, Duration::from_secs(20)).await;
    let names: Vec<String> = snapshot(&view).into_keys().collect();
    assert_eq!(
        names,
        [
            "before-1", "before-2", "before-3", "before-4", "during-0", "during-1", "during-2",
            "during-3"
        ]
    );
    let gone: Vec<_> = k
        .watch_starts()
        .into_iter()
        .filter(|w| w.plural == "configmaps" && w.gone)
        .collect();
    assert!(!gone.is_empty(), "a resume was refused with 410 Gone");
    assert!(
        restarts(&metrics, "relist") >= 1,
        "kube_watch_restarts_total{{reason=\"relist\"}} counts the relist"
    );
    assert!(
        restarts(&metrics, "error") >= 1,
        "the failed resumes are counted as errors"
    );
    stop.cancel();
    task.await.expect("the reflector ends on stop");
}
