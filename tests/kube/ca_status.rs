//! cluster-autoscaler's status ConfigMap, written by a [`Replica`] wired as `run` wires it
//! (Kubernetes, leader election, `demand: pods`, scale-down) against the emulator's simulated
//! cluster: `kube-system/cluster-autoscaler-status` in cluster-autoscaler's layout, node counts
//! from the Nodes, a scale-up in progress, candidates for scale-down, and another writer's key
//! kept (issue 19, item 3). Real time with short waits; every wait is bounded.

use crate::support;

use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::config::{
    AuthSettings, DemandKind, KubernetesSettings, SecretSource,
};
use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed};
use vmss_capacity_controller::kube::ca_status::{
    CA_LAST_UPDATED_ANNOTATION, CA_STATUS_OWNER, CA_STATUS_OWNER_ANNOTATION,
    FALLBACK_CA_STATUS_CONFIG_MAP,
};
use vmss_capacity_controller::metrics::Metrics;

const LABEL_TAG: &str = "k8s.io_cluster-autoscaler_node-template_label_workload";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_writes_cluster_autoscalers_status_in_its_layout_and_keeps_other_writers_keys() {
    let emulator = EmulatorBuilder::new()
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: Duration::from_secs(3),
            tick: Duration::from_millis(20),
        })
        .start()
        .await
        .expect("emulator starts");
    let state = emulator.state();
    let kube = emulator.kube().expect("kubernetes side");
    for (name, capacity, tags) in [
        ("web", 1, vec![(LABEL_TAG.to_string(), "web".to_string())]),
        ("spare", 1, vec![]),
    ] {
        let mut seed = ScaleSetSeed::new(SUB, RG, name, capacity);
        seed.sku_name = "Standard_D2s_v3".into();
        seed.tags = tags.into_iter().collect();
        state.seed_scale_set(seed);
    }
    assert!(
        eventually(Duration::from_secs(15), || kube.ready_nodes().len() == 2).await,
        "the seeded instances never became Ready nodes"
    );
    // Somebody else's key on our ConfigMap already (a runbook's annotation, a dashboard's): ours
    // by its owner annotation, as an earlier leader created it.
    kube.create(
        "v1",
        "configmaps",
        "kube-system",
        json!({"metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system",
                "annotations": {CA_STATUS_OWNER_ANNOTATION: CA_STATUS_OWNER}},
            "data": {"other": "keep me"}}),
    )
    .expect("configmap");
    // Two pods that need the `web` label, one per 2-core node: one needs a new node.
    kube.create_replica_set(
        "default",
        "web",
        2,
        &PodTemplate::new("1500m", "1Gi").node_selector("workload", "web"),
    )
    .expect("replica set");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().unwrap()).unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "ca-status-secret").unwrap();
    state.register_client("controller", "ca-status-secret");

    let mut s = settings(
        &emulator.base_url(),
        vec![group("web", 1, 5, None), group("spare", 0, 5, None)],
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
    s.pod_demand.kind = DemandKind::Pods;
    s.pod_demand.batch_idle = Duration::from_millis(300);
    s.scan_interval = Duration::from_millis(300);
    s.scale_down.enabled = true;
    // `spare` stays a candidate the whole test.
    s.scale_down.unneeded_time = Duration::from_secs(3600);
    let metrics = Arc::new(Metrics::new());
    let (stop, task) = support::serve_replica(s, metrics.clone(), false, "ca-status").await;

    let read = || {
        kube.list_all("v1", "configmaps", Some("kube-system"))
            .into_iter()
            .find(|c| c.pointer("/metadata/name") == Some(&json!("cluster-autoscaler-status")))
    };
    let doc = |cm: &serde_json::Value| -> Option<serde_yaml::Value> {
        serde_yaml::from_str(cm.pointer("/data/status")?.as_str()?).ok()
    };
    // While the new web node boots: a scale-up in progress for web, spare a candidate.
    let in_progress = |d: &serde_yaml::Value| {
        d["autoscalerStatus"] == "Running"
            && d["nodeGroups"]
                .as_sequence()
                .into_iter()
                .flatten()
                .any(|g| g["name"] == "web" && g["scaleUp"]["status"] == "InProgress")
    };
    assert!(
        eventually(Duration::from_secs(20), || read()
            .as_ref()
            .and_then(doc)
            .is_some_and(|d| in_progress(&d)))
        .await,
        "never showed web's scale-up in progress: {:?}",
        read()
    );
    let cm = read().expect("configmap");
    assert_eq!(
        cm.pointer("/data/other"),
        Some(&json!("keep me")),
        "another writer's key is kept"
    );
    let stamped = cm
        .pointer(&format!(
            "/metadata/annotations/{}",
            CA_LAST_UPDATED_ANNOTATION.replace('/', "~1")
        ))
        .and_then(|v| v.as_str())
        .expect("the annotation");
    assert!(stamped.ends_with("+0000 UTC"), "{stamped}");
    let d = doc(&cm).expect("the document");
    let web = d["nodeGroups"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "web")
        .unwrap()
        .clone();
    assert_eq!(web["health"]["status"], "Healthy");
    assert_eq!(web["health"]["cloudProviderTarget"], 2);
    assert_eq!(web["health"]["minSize"], 1);
    assert_eq!(web["health"]["maxSize"], 5);
    assert_eq!(web["health"]["nodeCounts"]["registered"]["ready"], 1);
    assert_eq!(d["clusterWide"]["scaleUp"]["status"], "InProgress");
    assert!(
        d["clusterWide"]["health"]["nodeCounts"]["registered"]["total"]
            .as_u64()
            .is_some_and(|n| n >= 2)
    );
    // Once web's node is up: no scale-up activity; spare is an unneeded candidate.
    assert!(
        eventually(Duration::from_secs(20), || read()
            .as_ref()
            .and_then(doc)
            .is_some_and(|d| d["clusterWide"]["scaleUp"]["status"]
                == "NoActivity"
                && d["clusterWide"]["scaleDown"]["status"]
                    == "CandidatesPresent"))
        .await,
        "never settled: {:?}",
        read()
    );
    let d = doc(&read().unwrap()).unwrap();
    let spare = d["nodeGroups"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "spare")
        .unwrap()
        .clone();
    assert_eq!(spare["scaleDown"]["status"], "CandidatesPresent");
    assert_eq!(spare["scaleDown"]["candidates"], 1);
    assert_eq!(
        read().unwrap().pointer("/data/other"),
        Some(&json!("keep me"))
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the replica stops")
        .unwrap()
        .unwrap();
}

/// Issue 41 item 9: AKS's managed cluster-autoscaler writes `kube-system/cluster-autoscaler-status`.
/// Found without our owner annotation, it is left exactly as it is (same `resourceVersion`, same
/// document), and ours, in the same layout, goes under our own name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_autoscalers_status_config_map_is_left_alone_and_ours_goes_under_our_own_name() {
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
    let mut seed = ScaleSetSeed::new(SUB, RG, "web", 1);
    seed.sku_name = "Standard_D2s_v3".into();
    state.seed_scale_set(seed);
    // As AKS's managed cluster-autoscaler leaves it: its document, its annotation, no owner mark.
    let theirs = kube
        .create(
            "v1",
            "configmaps",
            "kube-system",
            json!({"metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system",
                    "annotations": {CA_LAST_UPDATED_ANNOTATION: "2026-01-01 00:00:00 +0000 UTC"}},
                "data": {"status": "time: aks's own\nautoscalerStatus: Running\n"}}),
        )
        .expect("configmap");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().unwrap()).unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "ca-status-secret").unwrap();
    state.register_client("controller", "ca-status-secret");
    let mut s = settings(&emulator.base_url(), vec![group("web", 1, 5, None)]);
    s.azure.auth = AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::File(secret),
    };
    s.kubernetes = KubernetesSettings {
        enabled: true,
        kubeconfig: Some(kubeconfig),
        ..KubernetesSettings::default()
    };
    s.pod_demand.kind = DemandKind::Pods;
    s.scan_interval = Duration::from_millis(300);
    let metrics = Arc::new(Metrics::new());
    let (stop, task) = support::serve_replica(s, metrics.clone(), false, "ca-status").await;
    let read = |name: &str| {
        kube.list_all("v1", "configmaps", Some("kube-system"))
            .into_iter()
            .find(|c| c.pointer("/metadata/name") == Some(&json!(name)))
    };
    let ours_running = || {
        read(FALLBACK_CA_STATUS_CONFIG_MAP)
            .and_then(|cm| cm.pointer("/data/status")?.as_str().map(str::to_string))
            .and_then(|y| serde_yaml::from_str::<serde_yaml::Value>(&y).ok())
            .is_some_and(|d| {
                d["autoscalerStatus"] == "Running"
                    && d["nodeGroups"]
                        .as_sequence()
                        .is_some_and(|g| g.iter().any(|g| g["name"] == "web"))
            })
    };
    assert!(
        eventually(Duration::from_secs(20), ours_running).await,
        "ours never went under our own name: {:?}",
        read(FALLBACK_CA_STATUS_CONFIG_MAP)
    );
    let ours = read(FALLBACK_CA_STATUS_CONFIG_MAP).unwrap();
    assert_eq!(
        ours.pointer(&format!(
            "/metadata/annotations/{}",
            CA_STATUS_OWNER_ANNOTATION.replace('/', "~1")
        )),
        Some(&json!(CA_STATUS_OWNER)),
        "ours carries the owner annotation"
    );
    // A few more passes: theirs is never written.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = read("cluster-autoscaler-status").expect("theirs is still there");
    assert_eq!(
        now.pointer("/metadata/resourceVersion"),
        theirs.pointer("/metadata/resourceVersion"),
        "another autoscaler's ConfigMap is never written"
    );
    assert_eq!(now.pointer("/data"), theirs.pointer("/data"));
    assert_eq!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &metrics.kube_status_writes_total,
            &[("result", "foreign")]
        ),
        1,
        "found foreign once, then left alone"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the replica stops")
        .unwrap()
        .unwrap();
}
