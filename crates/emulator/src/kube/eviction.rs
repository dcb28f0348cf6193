//! `pods/eviction`: a policy/v1 Eviction deletes the pod unless a PodDisruptionBudget selecting
//! it has no disruption left (429 TooManyRequests, the real server's message). The budget is
//! computed here from the pods themselves, as the disruption controller would. The Eviction's
//! `deleteOptions.preconditions` (`uid`, `resourceVersion`) are checked first: one that does not
//! hold is a 409 Conflict with the real server's message, and nothing is deleted.

use serde_json::{json, Value};

use super::resources;
use super::select::label_selector_matches;
use super::status::{self, KubeError};
use super::store::{name_of, Store};

fn is_healthy(pod: &Value) -> bool {
    let running = pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
    let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
    let ready = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    running && ready && !deleting
}

/// An `IntOrString` of a budget resolved against `total` (percentages round up, as the
/// disruption controller rounds them).
fn resolve(v: &Value, total: i64) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    let pct: i64 = v.as_str()?.strip_suffix('%')?.parse().ok()?;
    Some((pct * total + 99) / 100)
}

/// The budget's arithmetic: (pods it needs healthy, pods healthy now, disruptions allowed).
pub fn budget(pdb: &Value, pods: &[&Value]) -> (i64, i64, i64) {
    let total = pods.len() as i64;
    let healthy = pods.iter().filter(|p| is_healthy(p)).count() as i64;
    let spec = pdb.get("spec").cloned().unwrap_or(json!({}));
    let desired = if let Some(min) = spec.get("minAvailable") {
        resolve(min, total).unwrap_or(total)
    } else if let Some(max) = spec.get("maxUnavailable") {
        total - resolve(max, total).unwrap_or(0)
    } else {
        0
    };
    let desired = desired.max(0);
    (desired, healthy, (healthy - desired).max(0))
}

fn covered_refs<'a>(pods: impl IntoIterator<Item = &'a Value>, pdb: &Value) -> Vec<&'a Value> {
    let selector = pdb.pointer("/spec/selector").cloned().unwrap_or(json!({}));
    pods.into_iter()
        .filter(|p| {
            label_selector_matches(
                &selector,
                p.pointer("/metadata/labels").and_then(Value::as_object),
            )
        })
        .collect()
}

/// `pdb` with the `status` the disruption controller would have written by now
/// (`observedGeneration`, `desiredHealthy`, `currentHealthy`, `disruptionsAllowed`,
/// `expectedPods` and the `DisruptionAllowed` condition), computed from the pods at read time.
/// The emulator fills it on GET and LIST, so `kubectl get pdb` shows what a real cluster shows;
/// computing it on read does not move the `resourceVersion`, where the real controller's status
/// update would.
pub fn with_status(store: &Store, mut pdb: Value) -> Value {
    let Some(pods_rt) = resources::find("", "v1", "pods") else {
        return pdb;
    };
    let namespace = pdb
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let covered = covered_refs(store.iter_in(pods_rt, &namespace), &pdb);
    let (desired, healthy, allowed) = budget(&pdb, &covered);
    let generation = pdb
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let since = pdb
        .pointer("/metadata/creationTimestamp")
        .cloned()
        .unwrap_or(Value::Null);
    let (cond, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    pdb["status"] = json!({
        "observedGeneration": generation,
        "desiredHealthy": desired,
        "currentHealthy": healthy,
        "disruptionsAllowed": allowed,
        "expectedPods": covered.len(),
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": cond,
            "reason": reason,
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }],
    });
    pdb
}

/// An Eviction's `deleteOptions.preconditions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The pod's `metadata.uid`: another pod of the same name is not evicted.
    pub uid: Option<String>,
    /// The pod's `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

/// The real server's 409 for a precondition that does not hold (checked against v1.20.2).
fn precondition_failed(name: &str, what: &str, want: &str, have: &str, hint: &str) -> KubeError {
    status::failure(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on Pod \"{name}\": the {what} in the precondition ({want}) does not match the {what} in record ({have}). The object might have been {hint}"
        ),
        Some(json!({"name": name, "kind": "Pod"})),
    )
}

/// Answers the eviction of `namespace/name`: `Ok(status body)` when the pod was deleted; 409
/// when a precondition does not hold, before any budget is looked at.
pub fn evict(
    store: &mut Store,
    namespace: &str,
    name: &str,
    preconditions: &Preconditions,
) -> Result<Value, KubeError> {
    let pods_rt = resources::find("", "v1", "pods").expect("pods are served");
    let pdb_rt = resources::find("policy", "v1", "poddisruptionbudgets").expect("PDBs are served");
    let pod = store.get(pods_rt, namespace, name)?;
    let field = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    if let Some(want) = preconditions.uid.as_deref() {
        let have = field("/metadata/uid");
        if want != have {
            return Err(precondition_failed(
                name,
                "UID",
                want,
                have,
                "deleted and then recreated",
            ));
        }
    }
    if let Some(want) = preconditions.resource_version.as_deref() {
        let have = field("/metadata/resourceVersion");
        if want != have {
            return Err(precondition_failed(
                name,
                "ResourceVersion",
                want,
                have,
                "modified",
            ));
        }
    }
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    // The real server evicts pods that are not running whatever the budget.
    if phase == "Running" {
        let labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
        let pdbs: Vec<&Value> = store
            .iter_in(pdb_rt, namespace)
            .filter(|pdb| {
                pdb.pointer("/spec/selector")
                    .is_some_and(|sel| label_selector_matches(sel, labels))
            })
            .collect();
        if pdbs.len() > 1 {
            return Err(status::failure(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                None,
            ));
        }
        if let Some(pdb) = pdbs.first() {
            let covered = covered_refs(store.iter_in(pods_rt, namespace), pdb);
            let (desired, healthy, allowed) = budget(pdb, &covered);
            if allowed == 0 {
                let pdb_name = name_of(pdb).unwrap_or("");
                return Err(status::failure(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    Some(json!({"causes": [{
                        "reason": "DisruptionBudget",
                        "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"),
                    }]})),
                ));
            }
        }
    }
    mark_disruption_target(store, &pod);
    delete_pod(store, namespace, name, None)?;
    Ok(status::success(201))
}

/// Before the delete, as the API server does since `PodDisruptionConditions` (GA in 1.31): the
/// pod's status gets `DisruptionTarget=True` (`EvictionByEvictionAPI`), so whoever watches it (a
/// Job controller's `podFailurePolicy`, a kubelet) sees why it goes. A write that fails (the
/// pod changed meanwhile) is skipped: the eviction goes on.
fn mark_disruption_target(store: &mut Store, pod: &Value) {
    let Some(pods_rt) = resources::find("", "v1", "pods") else {
        return;
    };
    let mut write = pod.clone();
    let condition = json!({"type": "DisruptionTarget", "status": "True",
        "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
        "lastProbeTime": null, "lastTransitionTime": crate::sim::nodes::now_rfc3339()});
    match write
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        Some(cs) => {
            cs.retain(|c| c["type"] != "DisruptionTarget");
            cs.push(condition);
        }
        None => write["status"]["conditions"] = json!([condition]),
    }
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let _ = store.update(
        pods_rt,
        namespace,
        name_of(pod).unwrap_or(""),
        write,
        Some("status"),
    );
}

/// Deletes a pod as the API server and a kubelet together do: at once, unless the pod is bound
/// to a node whose kubelet is dead (the emulator's `emulator-not-ready` annotation). Then, as on
/// a real cluster where no kubelet confirms, the pod only gets its `deletionTimestamp` (now plus
/// its grace period: `spec.terminationGracePeriodSeconds`, 30 s by default) and stays
/// until its node goes. Returns the pod as deleted or as marked.
pub fn delete_pod(
    store: &mut Store,
    namespace: &str,
    name: &str,
    precondition_rv: Option<&str>,
) -> Result<Value, KubeError> {
    let pods_rt = resources::find("", "v1", "pods").expect("pods are served");
    let nodes_rt = resources::find("", "v1", "nodes").expect("nodes are served");
    let pod = store.get(pods_rt, namespace, name)?;
    let dead_kubelet = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .and_then(|n| store.get(nodes_rt, "", n).ok())
        .is_some_and(|node| {
            node.pointer("/metadata/annotations")
                .and_then(|a| a.get(crate::sim::nodes::NOT_READY_ANNOTATION))
                .and_then(Value::as_str)
                == Some("true")
        });
    if dead_kubelet {
        let grace = pod
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        return store.mark_deleting(pods_rt, namespace, name, grace, precondition_rv);
    }
    store.delete(pods_rt, namespace, name, precondition_rv)
}
