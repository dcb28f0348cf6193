//! What the consolidation and replace tests share: the settings that let consolidation act
//! quickly in the simulation, the nodes running `web` pods, and the annotation that keeps a node.

use crate::support::pod_cluster::Cluster;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use std::time::Duration;
use vmss_capacity_controller::config::{Budget, BudgetNodes, Settings};

/// Scale-down and consolidation on, every wait short, re-validation `validation` after the
/// decision, a budget that lets every node go, groups down to 0.
pub fn consolidating(s: &mut Settings, validation: Duration) {
    s.scan_interval = Duration::from_millis(300);
    s.pod_demand.batch_idle = Duration::from_millis(800);
    s.pod_demand.batch_max = Duration::from_secs(5);
    s.scale_down.enabled = true;
    // cluster-autoscaler's policy alone would keep every node: each is above 5%.
    s.scale_down.utilization_threshold = 0.05;
    s.scale_down.unneeded_time = Duration::from_secs(1);
    s.scale_down.delay_after_add = Duration::ZERO;
    s.scale_down.node_delete_delay_after_taint = Duration::from_millis(300);
    s.scale_down.max_pod_eviction_time = Duration::from_secs(30);
    s.consolidation.enabled = true;
    s.consolidation.validation_delay = validation;
    s.consolidation.budgets = vec![Budget {
        nodes: BudgetNodes::Percent(100),
        reasons: None,
        schedule: None,
    }];
    for g in &mut s.node_groups {
        g.min_size = 0;
    }
}

/// The nodes of the Running `web` pods not being deleted (one entry per pod).
pub fn running_web(c: &Cluster) -> Vec<String> {
    c.kube
        .list_all("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| p.pointer("/metadata/labels/app").and_then(|v| v.as_str()) == Some("web"))
        .filter(|p| p.pointer("/status/phase").and_then(|v| v.as_str()) == Some("Running"))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|p| {
            p.pointer("/spec/nodeName")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect()
}

/// Sets (`Some`) or removes (`None`) the `scale-down-disabled` annotation of `node`.
pub async fn annotate(c: &Cluster, node: &str, disabled: Option<&str>) {
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    let patch = json!({"metadata": {"annotations": {
        "cluster-autoscaler.kubernetes.io/scale-down-disabled": disabled}}});
    api.patch(
        node,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("node annotated");
}
