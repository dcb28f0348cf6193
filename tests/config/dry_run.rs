//! `run --dry-run` wired as `run` wires it (a [`Replica`] with Kubernetes, leader election and
//! scale-down on), against the emulator's cluster simulation: with a pod that needs a new node
//! and an empty node past its unneeded time, the replica decides both and writes nothing of any
//! kind: no Lease, no Event, no status ConfigMap, no taint, no eviction, no Azure write (issue 21,
//! item 4). Real time with short waits; every wait is bounded.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::config::{
    AuthSettings, DemandKind, KubernetesSettings, SecretSource,
};
use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed};
use vmss_capacity_controller::kube::nodes::TO_BE_DELETED_TAINT;
use vmss_capacity_controller::metrics::Metrics;

const LABEL_TAG: &str = "k8s.io_cluster-autoscaler_node-template_label_workload";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_decides_a_scale_up_and_a_removal_and_writes_nothing_anywhere() {
    let emulator = EmulatorBuilder::new()
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: Duration::from_millis(200),
            tick: Duration::from_millis(20),
        })
        .start()
        .await
        .expect("emulator starts");
    let state = emulator.state();
    let kube = emulator.kube().expect("kubernetes side");
    for (name, capacity, tags) in [
        ("web", 2, vec![(LABEL_TAG.to_string(), "web".to_string())]),
        ("spare", 1, vec![]),
    ] {
        let mut seed = ScaleSetSeed::new(SUB, RG, name, capacity);
        seed.sku_name = "Standard_D2s_v3".into();
        seed.tags = tags.into_iter().collect();
        state.seed_scale_set(seed);
    }
    assert!(
        eventually(Duration::from_secs(10), || kube.ready_nodes().len() == 3).await,
        "the three seeded instances never became Ready nodes"
    );
    // Three pods that need the `web` label, one per 2-core node: one stays Pending.
    kube.create_replica_set(
        "default",
        "web",
        3,
        &PodTemplate::new("1500m", "1Gi").node_selector("workload", "web"),
    )
    .expect("replica set");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().unwrap()).unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "dry-run-secret").unwrap();
    state.register_client("controller", "dry-run-secret");

    let mut s = settings(
        &emulator.base_url(),
        vec![group("web", 0, 5, None), group("spare", 0, 5, None)],
    );
    s.azure.auth = AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::File(secret),
    };
    s.kubernetes = KubernetesSettings {
        enabled: true,
        kubeconfig: Some(kubeconfig),
        ..KubernetesSettings::default()
    };
    assert!(
        s.kubernetes.leader_election.enabled,
        "the Lease is on by default"
    );
    s.pod_demand.kind = DemandKind::Pods;
    s.pod_demand.batch_idle = Duration::from_millis(300);
    s.scan_interval = Duration::from_millis(300);
    s.scale_down.enabled = true;
    s.scale_down.unneeded_time = Duration::from_secs(1);
    s.scale_down.delay_after_add = Duration::ZERO;
    s.scale_down.node_delete_delay_after_taint = Duration::from_millis(100);
    let metrics = Arc::new(Metrics::new());
    let (stop, task) = support::serve_replica(s, metrics.clone(), true, "dry").await;

    // It decided both: the scale-up was held as a dry run, the empty node is unneeded.
    let held = || {
        metrics
            .writes_held_total
            .with_label_values(&["web", "dry_run"])
            .get()
    };
    assert!(
        eventually(Duration::from_secs(15), || held() > 0).await,
        "the dry run never planned the scale-up the pending pod needs"
    );
    assert!(
        eventually(Duration::from_secs(10), || metrics
            .unneeded_nodes_count
            .with_label_values(&["spare"])
            .get()
            == 1)
        .await,
        "the dry run never found the empty node unneeded"
    );
    // Well past the unneeded time and several scale-down passes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the replica stops")
        .unwrap()
        .unwrap();

    assert_eq!(
        kube.write_requests(),
        Vec::<(String, String)>::new(),
        "a dry run wrote to Kubernetes"
    );
    let azure_writes: Vec<_> = state
        .request_log()
        .into_iter()
        .filter(|r| r.path.starts_with("/subscriptions/") && r.method != "GET")
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(azure_writes, vec![], "a dry run wrote to Azure");
    for (name, capacity) in [("web", 2), ("spare", 1)] {
        assert_eq!(
            state.scale_set(SUB, RG, name).map(|v| v.capacity),
            Some(capacity)
        );
    }
    for node in kube.list_all("v1", "nodes", None) {
        let taints = node.pointer("/spec/taints").cloned().unwrap_or_default();
        assert!(
            !taints.to_string().contains(TO_BE_DELETED_TAINT)
                && node.pointer("/spec/unschedulable") != Some(&serde_json::json!(true)),
            "a node was tainted or cordoned: {node}"
        );
    }
}
