//! Pods that take a while to be Ready, as real applications do (image pulls, warm-up, a
//! readiness probe's first success): a pod annotated [`READY_AFTER_ANNOTATION`] (`"20s"`,
//! `"1m"`) runs with `Ready` and `ContainersReady` false (`ContainersNotReady`) and its
//! containers not ready, then turns Ready once that long has passed since the simulation first
//! saw it running. Until then it is no healthy pod for its PodDisruptionBudget (the eviction
//! API counts only Ready pods), no ready replica for its ReplicaSet, and a drain under a budget
//! waits for it, as on a real cluster. Pods without the annotation are Ready when they run.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::kube::resources;
use crate::kube::select::Selector;
use crate::kube::store::Store;

use super::clocks::PodClocks;
use super::nodes::now_rfc3339;
use super::scheduler::write_pod_status;
use super::workloads::uid_of;

/// How long a running pod takes to be Ready (an emulator knob: a real pod's probes decide). A
/// duration such as `20s`, `1m` or `1m30s`.
pub const READY_AFTER_ANNOTATION: &str = "emulator-ready-after";

/// Since each pod not Ready yet was first seen running.
#[derive(Debug, Default)]
pub(crate) struct ReadinessMemory {
    started: PodClocks,
}

/// The pod's time to Ready, if it has one.
pub(crate) fn ready_after(pod: &Value) -> Option<Duration> {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(READY_AFTER_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(super::jobs::parse_duration)
}

/// A `Ready` or `ContainersReady` condition of a running pod whose containers are not ready yet,
/// in the kubelet's words.
pub(crate) fn not_ready(kind: &str, pod: &Value) -> Value {
    let names: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    json!({"type": kind, "status": "False", "reason": "ContainersNotReady",
        "message": format!("containers with unready status: [{}]", names.join(" ")),
        "lastProbeTime": null, "lastTransitionTime": now_rfc3339()})
}

/// Whether `pod` is running and waiting to be Ready (its `Ready` condition false with
/// `ContainersNotReady`, as [`not_ready`] writes it).
fn waiting(pod: &Value) -> bool {
    pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "False"
                        && c["reason"] == "ContainersNotReady"
                })
            })
}

/// Turns Ready the pods whose time has come. Returns when the next one is due.
pub(crate) fn make_ready(
    store: &mut Store,
    memory: &mut ReadinessMemory,
    now: Instant,
) -> Option<Instant> {
    let pods_rt = resources::find("", "v1", "pods")?;
    let pods = store
        .list(pods_rt, None, &Selector::default(), None, None)
        .items;
    for pod in pods.iter().filter(|p| waiting(p)) {
        let Some(delay) = ready_after(pod) else {
            continue;
        };
        if !memory.started.elapsed(uid_of(pod), delay, now) {
            continue;
        }
        let stamp = now_rfc3339();
        let mut status = pod.get("status").cloned().unwrap_or(json!({}));
        if let Some(cs) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in cs.iter_mut() {
                if matches!(c["type"].as_str(), Some("Ready" | "ContainersReady")) {
                    *c = json!({"type": c["type"], "status": "True", "lastProbeTime": null,
                        "lastTransitionTime": stamp});
                }
            }
        }
        if let Some(cs) = status
            .get_mut("containerStatuses")
            .and_then(Value::as_array_mut)
        {
            for c in cs.iter_mut() {
                c["ready"] = json!(true);
            }
        }
        write_pod_status(store, pod, status);
    }
    memory.started.end_pass()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_time_to_ready_comes_from_its_annotation() {
        let pod = |v: &str| json!({"metadata": {"annotations": {READY_AFTER_ANNOTATION: v}}});
        assert_eq!(ready_after(&pod("20s")), Some(Duration::from_secs(20)));
        assert_eq!(ready_after(&pod("1m30s")), Some(Duration::from_secs(90)));
        assert_eq!(ready_after(&pod("soon")), None);
        assert_eq!(ready_after(&json!({"metadata": {}})), None);
    }
}
