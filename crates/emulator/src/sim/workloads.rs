//! Workload owners: Deployments own one ReplicaSet per pod template; ReplicaSets keep
//! `spec.replicas` live pods (re-creating evicted or lost ones, deleting extras, pending ones
//! first); DaemonSets keep one pod on each `Ready` Node whose taints and labels their template
//! accepts, bound there directly; what an owner the simulation knew leaves behind is collected.

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};

use crate::kube::resources::{self, ResourceType};
use crate::kube::select::Selector;
use crate::kube::store::{name_of, Store};

use super::nodes::{is_ready, now_rfc3339};
use super::scheduler::{is_pending, selector_matches, tolerations_of, untolerated_taint};

/// The five random characters of a pod name, from the alphabet Kubernetes uses for them.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<usize>() % ALPHABET.len()] as char)
        .collect()
}

pub(crate) fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The uid of the pod's controller (the ownerReference with `controller: true`).
pub(crate) fn controller_uid(pod: &Value) -> Option<&str> {
    pod.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|r| r.get("uid").and_then(Value::as_str))
}

fn is_live(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && !matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        )
}

pub(crate) fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// `status.phase` as the ReplicaSet controller orders a scale-in: Pending, Unknown, Running
/// (anything else as Pending).
fn phase_ordinal(pod: &Value) -> u8 {
    match pod.pointer("/status/phase").and_then(Value::as_str) {
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    }
}

/// `controller.kubernetes.io/pod-deletion-cost`: an int32; missing or invalid, 0 (the
/// controller ignores the parse error).
fn deletion_cost(pod: &Value) -> i32 {
    pod.pointer("/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost")
        .and_then(Value::as_str)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pod from `owner`'s template, owned by it (`api_version` `kind`), named `<owner>-<5 random
/// chars>` (a Job's template carries the labels the API server gave it on create).
fn pod_from_template(owner: &Value, kind: &str, api_version: &str) -> Value {
    let name = name_of(owner).unwrap_or("pod");
    let template = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or(json!({}));
    let mut meta = template.get("metadata").cloned().unwrap_or(json!({}));
    if !meta.is_object() {
        meta = json!({});
    }
    meta["name"] = json!(format!("{name}-{}", random_suffix()));
    meta["generateName"] = json!(format!("{name}-"));
    meta["ownerReferences"] = json!([{
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid_of(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    if let Some(m) = meta.as_object_mut() {
        m.remove("namespace");
    }
    json!({
        "metadata": meta,
        "spec": template.get("spec").cloned().unwrap_or(json!({"containers": []})),
    })
}

/// Creates a pod, retrying on the (unlikely) name collision.
pub(crate) fn create_pod(
    store: &mut Store,
    pods_rt: &ResourceType,
    ns: &str,
    owner: &Value,
    kind: &str,
    api_version: &str,
) -> Option<Value> {
    for _ in 0..5 {
        let pod = pod_from_template(owner, kind, api_version);
        match store.create(pods_rt, ns, pod) {
            Ok(p) => return Some(p),
            Err(e) if e.code == 409 => continue,
            Err(e) => {
                tracing::warn!(
                    owner = name_of(owner).unwrap_or(""),
                    code = e.code,
                    "cannot create a pod from the template"
                );
                return None;
            }
        }
    }
    None
}

/// Writes `status` on `obj` when it differs from what is stored.
pub(crate) fn write_status(store: &mut Store, rt: &ResourceType, obj: &Value, status: Value) {
    let mut want = status;
    if let Some(m) = want.as_object_mut() {
        m.insert(
            "observedGeneration".into(),
            obj.pointer("/metadata/generation")
                .cloned()
                .unwrap_or(json!(1)),
        );
    }
    if obj.get("status") == Some(&want) {
        return;
    }
    let mut write = obj.clone();
    write["status"] = want;
    if let Some(m) = write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let _ = store.update(rt, &ns, name_of(obj).unwrap_or(""), write, Some("status"));
}

fn by_namespace(pods: &[Value]) -> BTreeMap<String, Vec<&Value>> {
    let mut out: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for p in pods {
        let ns = p
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        out.entry(ns.to_string()).or_default().push(p);
    }
    out
}

/// `pod-template-hash`: FNV-1a of the template, in the alphabet Kubernetes encodes it with.
fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h: u32 = 0x811c_9dc5;
    for b in template.to_string().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let mut out = String::new();
    let mut n = h;
    loop {
        out.push(ALPHABET[(n % ALPHABET.len() as u32) as usize] as char);
        n /= ALPHABET.len() as u32;
        if n == 0 {
            break;
        }
    }
    out
}

/// Every Deployment to one ReplicaSet, `<name>-<pod-template-hash>`, with the Deployment's
/// `replicas`: a new template makes a new ReplicaSet and the old ones are deleted with their
/// pods (a replacement, not a rolling update); the status is what `kubectl rollout status`
/// reads.
pub(crate) fn reconcile_deployments(store: &mut Store) {
    let (Some(d_rt), Some(rs_rt)) = (
        resources::find("apps", "v1", "deployments"),
        resources::find("apps", "v1", "replicasets"),
    ) else {
        return;
    };
    let all = Selector::default();
    let deployments = store.list(d_rt, None, &all, None, None).items;
    if deployments.is_empty() {
        return;
    }
    let sets = store.list(rs_rt, None, &all, None, None).items;
    for d in &deployments {
        if d.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let ns = d
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = name_of(d).unwrap_or("").to_string();
        let uid = uid_of(d).to_string();
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0);
        let template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
        // What the API server's validation would refuse: the simulation skips it, never panics.
        let object_or_absent = |v: Option<&Value>| v.is_none_or(|v| v.is_object() || v.is_null());
        let well_formed = template.is_object()
            && object_or_absent(template.get("metadata"))
            && object_or_absent(template.pointer("/metadata/labels"))
            && object_or_absent(d.pointer("/spec/selector"))
            && object_or_absent(d.pointer("/spec/selector/matchLabels"));
        if !well_formed {
            tracing::warn!(deployment = %name, "its template or selector is not an object: skipped");
            continue;
        }
        let hash = template_hash(&template);
        let rs_name = format!("{name}-{hash}");
        let owned: Vec<&Value> = sets
            .iter()
            .filter(|rs| {
                rs.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str())
                    && controller_uid(rs) == Some(uid.as_str())
            })
            .collect();
        let current = owned
            .iter()
            .find(|rs| name_of(rs) == Some(rs_name.as_str()));
        let current = match current {
            Some(rs) => {
                let mut rs = (*rs).clone();
                if !rs.get("spec").is_some_and(Value::is_object) {
                    continue;
                }
                if rs.pointer("/spec/replicas").and_then(Value::as_i64) != Some(replicas) {
                    rs["spec"]["replicas"] = json!(replicas);
                    if let Some(m) = rs["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    if let Ok(stored) = store.update(rs_rt, &ns, &rs_name, rs.clone(), None) {
                        rs = stored;
                    }
                }
                rs
            }
            None => {
                let mut template = template.clone();
                template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut selector = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "metadata": {
                        "name": rs_name,
                        "labels": template["metadata"]["labels"].clone(),
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                            "name": name, "uid": uid, "controller": true,
                            "blockOwnerDeletion": true}],
                    },
                    "spec": {"replicas": replicas, "selector": selector, "template": template},
                });
                match store.create(rs_rt, &ns, rs) {
                    Ok(rs) => rs,
                    Err(e) => {
                        tracing::warn!(deployment = %name, code = e.code, "cannot create the ReplicaSet");
                        continue;
                    }
                }
            }
        };
        for old in owned
            .iter()
            .filter(|rs| name_of(rs) != Some(rs_name.as_str()))
        {
            let _ = store.delete(rs_rt, &ns, name_of(old).unwrap_or(""), None);
        }
        let count = |key: &str| {
            current
                .pointer(&format!("/status/{key}"))
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        let (have, ready) = (count("replicas"), count("readyReplicas"));
        let available = if ready >= replicas { "True" } else { "False" };
        let progressing = if have == replicas {
            "NewReplicaSetAvailable"
        } else {
            "ReplicaSetUpdated"
        };
        // As the Deployment controller keeps them: a condition's transition time while its
        // status stays, its update time while its reason stays too, so a settled Deployment is
        // not rewritten every pass.
        let now = now_rfc3339();
        let condition = |kind: &str, status: &str, reason: &str, message: String| {
            let old = d
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
                .filter(|c| c["status"] == status);
            let kept = |k: &str, same_reason: bool| {
                old.filter(|c| !same_reason || c["reason"] == reason)
                    .and_then(|c| c.get(k))
                    .cloned()
                    .unwrap_or_else(|| json!(now))
            };
            json!({"type": kind, "status": status, "reason": reason, "message": message,
                "lastUpdateTime": kept("lastUpdateTime", true),
                "lastTransitionTime": kept("lastTransitionTime", false)})
        };
        let available_reason = if available == "True" {
            "MinimumReplicasAvailable"
        } else {
            "MinimumReplicasUnavailable"
        };
        let conditions = json!([
            condition(
                "Available",
                available,
                available_reason,
                format!("Deployment has {ready} of {replicas} replicas available.")
            ),
            condition(
                "Progressing",
                "True",
                progressing,
                format!("ReplicaSet \"{rs_name}\" is progressing.")
            ),
        ]);
        write_status(
            store,
            d_rt,
            d,
            json!({
                "replicas": have,
                "updatedReplicas": have,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "unavailableReplicas": (replicas - ready).max(0),
                "conditions": conditions,
            }),
        );
    }
}

/// Deletes what owners the simulation has seen and that are gone now leave behind (the garbage
/// collector's work): ReplicaSets of a deleted Deployment, pods of a deleted ReplicaSet or Job. Objects
/// whose owner the simulation never saw (made by hand, or by a test) stay.
pub(crate) fn collect_garbage(
    store: &mut Store,
    seen: &mut BTreeMap<&'static str, HashSet<String>>,
) {
    let all = Selector::default();
    for ((owner_group, owner_plural), dependent) in [
        (("apps", "deployments"), ("apps", "replicasets")),
        (("apps", "replicasets"), ("", "pods")),
        (("batch", "jobs"), ("", "pods")),
    ] {
        let (Some(owner_rt), Some(dep_rt)) = (
            resources::find(owner_group, "v1", owner_plural),
            resources::find(dependent.0, "v1", dependent.1),
        ) else {
            continue;
        };
        let live: HashSet<String> = store
            .list(owner_rt, None, &all, None, None)
            .items
            .iter()
            .map(|o| uid_of(o).to_string())
            .collect();
        let known = seen.entry(owner_plural).or_default();
        let orphans: Vec<(String, String)> = store
            .list(dep_rt, None, &all, None, None)
            .items
            .iter()
            .filter(|o| controller_uid(o).is_some_and(|u| known.contains(u) && !live.contains(u)))
            .map(|o| {
                (
                    o.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name_of(o).unwrap_or("").to_string(),
                )
            })
            .collect();
        for (ns, name) in orphans {
            let _ = store.delete(dep_rt, &ns, &name, None);
        }
        // Owners gone have had their dependents collected: remember only the live ones.
        *known = live;
    }
}

/// Every ReplicaSet to `spec.replicas` live pods.
pub(crate) fn reconcile_replica_sets(store: &mut Store) {
    let (Some(rs_rt), Some(pods_rt)) = (
        resources::find("apps", "v1", "replicasets"),
        resources::find("", "v1", "pods"),
    ) else {
        return;
    };
    let all = Selector::default();
    let sets = store.list(rs_rt, None, &all, None, None).items;
    if sets.is_empty() {
        return;
    }
    let pods = store.list(pods_rt, None, &all, None, None).items;
    let pods_by_ns = by_namespace(&pods);
    for rs in &sets {
        let ns = rs
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let uid = uid_of(rs);
        let want = rs
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(0) as usize;
        let mut live: Vec<&Value> = pods_by_ns
            .get(&ns)
            .map(|ps| {
                ps.iter()
                    .copied()
                    .filter(|p| controller_uid(p) == Some(uid) && is_live(p))
                    .collect()
            })
            .unwrap_or_default();
        let mut created = Vec::new();
        if live.len() < want {
            for _ in live.len()..want {
                if let Some(p) = create_pod(store, pods_rt, &ns, rs, "ReplicaSet", "apps/v1") {
                    created.push(p);
                }
            }
            live.extend(created.iter());
        } else if live.len() > want {
            // As the ReplicaSet controller ranks them (`controller.ActivePodsWithRanks`, 1.22
            // on): unbound first; then by phase (Pending, Unknown, Running); not Ready before
            // Ready; the lower `controller.kubernetes.io/pod-deletion-cost` first (an invalid
            // one is 0); pods doubled up on a node with more of this set's pods (it spreads
            // what stays); then the newest.
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for p in &live {
                if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str) {
                    *per_node.entry(n).or_default() += 1;
                }
            }
            let doubled = |p: &Value| {
                p.pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .and_then(|n| per_node.get(n))
                    .copied()
                    .unwrap_or(0)
            };
            live.sort_by(|a, b| {
                let key = |p: &Value| {
                    (
                        !is_pending(p),
                        phase_ordinal(p),
                        pod_ready(p),
                        deletion_cost(p),
                        std::cmp::Reverse(doubled(p)),
                        std::cmp::Reverse(
                            p.pointer("/metadata/creationTimestamp")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        ),
                        std::cmp::Reverse(name_of(p).unwrap_or("").to_string()),
                    )
                };
                key(a).cmp(&key(b))
            });
            for extra in live.drain(..live.len() - want) {
                let _ = store.delete(pods_rt, &ns, name_of(extra).unwrap_or(""), None);
            }
        }
        let ready = live.iter().filter(|p| pod_ready(p)).count();
        write_status(
            store,
            rs_rt,
            rs,
            json!({
                "replicas": live.len(),
                "fullyLabeledReplicas": live.len(),
                "readyReplicas": ready,
                "availableReplicas": ready,
            }),
        );
    }
}

/// Every PodDisruptionBudget's `status`, written as the disruption controller writes it: the
/// update moves the budget's `resourceVersion` and reaches watchers, so a controller watching
/// budgets sees their allowed disruptions change as pods come and go (reads compute it too).
pub(crate) fn reconcile_disruption_budgets(store: &mut Store) {
    let Some(rt) = resources::find("policy", "v1", "poddisruptionbudgets") else {
        return;
    };
    let budgets = store.list(rt, None, &Selector::default(), None, None).items;
    for pdb in &budgets {
        let computed = crate::kube::eviction::with_status(store, pdb.clone());
        if let Some(status) = computed.get("status").cloned() {
            write_status(store, rt, pdb, status);
        }
    }
}

/// A bound, running pod of `ds` on `node`.
fn daemon_pod(store: &mut Store, pods_rt: &ResourceType, ns: &str, ds: &Value, node: &str) {
    let mut pod = pod_from_template(ds, "DaemonSet", "apps/v1");
    pod["spec"]["nodeName"] = json!(node);
    pod["status"] = Value::Object(super::scheduler::kubelet_status(store, &pod, node));
    if let Err(e) = store.create(pods_rt, ns, pod) {
        tracing::warn!(
            daemon_set = name_of(ds).unwrap_or(""),
            node,
            code = e.code,
            "cannot create a daemon pod"
        );
    }
}

/// One pod of every DaemonSet on each `Ready` Node it accepts.
pub(crate) fn reconcile_daemon_sets(store: &mut Store) {
    let (Some(ds_rt), Some(pods_rt), Some(nodes_rt)) = (
        resources::find("apps", "v1", "daemonsets"),
        resources::find("", "v1", "pods"),
        resources::find("", "v1", "nodes"),
    ) else {
        return;
    };
    let all = Selector::default();
    let sets = store.list(ds_rt, None, &all, None, None).items;
    if sets.is_empty() {
        return;
    }
    let nodes: Vec<Value> = store
        .list(nodes_rt, None, &all, None, None)
        .items
        .into_iter()
        .filter(is_ready)
        .collect();
    let pods = store.list(pods_rt, None, &all, None, None).items;
    for ds in &sets {
        let ns = ds
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let uid = uid_of(ds);
        let spec = ds
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(json!({}));
        // The DaemonSet controller adds this toleration to every daemon pod.
        let mut tolerations = tolerations_of(&spec);
        tolerations.push(json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}));
        let owned: Vec<&Value> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid) && is_live(p))
            .collect();
        let mut desired = 0;
        let mut scheduled = 0;
        let mut ready = 0;
        for node in &nodes {
            let node_name = name_of(node).unwrap_or("");
            let has = owned
                .iter()
                .find(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node_name));
            let accepts =
                untolerated_taint(node, &tolerations).is_none() && selector_matches(node, &spec);
            if accepts {
                desired += 1;
            }
            match has {
                Some(p) => {
                    scheduled += 1;
                    if pod_ready(p) {
                        ready += 1;
                    }
                }
                None if accepts => {
                    daemon_pod(store, pods_rt, &ns, ds, node_name);
                    scheduled += 1;
                    ready += 1;
                }
                None => {}
            }
        }
        write_status(
            store,
            ds_rt,
            ds,
            json!({
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": scheduled,
                "updatedNumberScheduled": scheduled,
                "numberReady": ready,
                "numberAvailable": ready,
                "numberMisscheduled": 0,
            }),
        );
    }
}
