//! Instances become Nodes: one Node per VMSS instance, named as AKS names them, labelled and
//! tainted from the scale set's template tags and its agent pool, `Ready` after the boot delay;
//! a Node whose instance is gone is deleted with every pod bound to it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::arm::inventory::ScaleSetInventory;
use crate::kube::resources;
use crate::kube::select::Selector;
use crate::kube::store::{name_of, Store};

use super::sizes::{self, NodeResources};

/// Annotation marking the Nodes the simulation owns (it never deletes any other Node).
pub const SIMULATED_ANNOTATION: &str = "emulator.vmss-capacity-controller/simulated";
/// The taint a Node carries until it is `Ready`, as the node lifecycle controller sets it.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// A fault: while a scale set is tagged `emulator-never-register: true`, its instances that have
/// no Node yet get none (a broken image, a bootstrap that fails); Nodes already there stay. For
/// the controller's "nodes that never come" handling.
pub const NEVER_REGISTER_TAG: &str = "emulator-never-register";
/// A fault on a Node: while it carries the annotation `emulator-not-ready: "true"` its kubelet
/// is dead: the Node turns `Ready=Unknown` (reason `NodeStatusUnknown`) with the
/// `node.kubernetes.io/unreachable` taints, `NoSchedule` and `NoExecute`, as the node lifecycle
/// controller marks a Node whose kubelet stopped posting, and stays so; its pods, when deleted
/// or evicted, get a `deletionTimestamp` and stay (no kubelet confirms). Removing the annotation
/// lets it turn `Ready` again. Set with `POST /_emulator/kube/nodes/{name}/kubelet
/// {"dead": true}` or `kubectl annotate node NAME emulator-not-ready=true`.
pub const NOT_READY_ANNOTATION: &str = "emulator-not-ready";
/// The taint the node lifecycle controller puts on a Node whose `Ready` condition is `Unknown`
/// (its kubelet stopped posting), with effects `NoSchedule` and `NoExecute`.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// The taint the cloud node lifecycle controller puts on a NotReady Node whose VM the cloud
/// reports shut down (on Azure: stopped or deallocated), as on AKS.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// The label and taint key AKS puts on spot nodes (`=spot`, taint effect `NoSchedule`).
const SPOT_KEY: &str = "kubernetes.azure.com/scalesetpriority";
/// Tag naming the agent pool of a scale set (AKS sets it on its backing scale sets).
const POOL_NAME_TAG: &str = "aks-managed-poolName";
/// cluster-autoscaler's template tags on a scale set.
const LABEL_TAG: &str = "k8s.io_cluster-autoscaler_node-template_label_";
const TAINT_TAG: &str = "k8s.io_cluster-autoscaler_node-template_taint_";
const RESOURCES_TAG: &str = "k8s.io_cluster-autoscaler_node-template_resources_";

/// The kubelet version simulated Nodes report (`status.nodeInfo.kubeletVersion`).
pub const KUBELET_VERSION: &str = "v1.30.6";
/// The container runtime simulated Nodes report.
pub const CONTAINER_RUNTIME: &str = "containerd://1.7.22-1";
/// The OS image simulated Nodes report (AKS's Ubuntu 22.04 node image).
pub const OS_IMAGE: &str = "Ubuntu 22.04.5 LTS";
/// The kernel simulated Nodes report.
pub const KERNEL_VERSION: &str = "5.15.0-1074-azure";

/// What the simulation remembers of instances between ticks: when it first saw each one.
#[derive(Debug, Default)]
pub(crate) struct NodeMemory {
    first_seen: HashMap<String, Instant>,
}

/// `<vmss name lowercased><instance id in 6 base-36 digits>`, as AKS names a node
/// (`aks-gpu-12345678-vmss00000a`).
pub fn node_name(scale_set: &str, instance: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut n = instance;
    let mut digits = [b'0'; 6];
    for d in digits.iter_mut().rev() {
        *d = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    format!(
        "{}{}",
        scale_set.to_ascii_lowercase(),
        String::from_utf8_lossy(&digits)
    )
}

/// The `spec.providerID` of instance `id` of a scale set.
pub fn provider_id(sub: &str, rg: &str, scale_set: &str, id: u64) -> String {
    format!(
        "azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{id}"
    )
}

/// The scale set named in a providerID, if it is an Azure VMSS one.
pub fn scale_set_of(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("azure:///")?;
    let mut segs = rest.split('/');
    while let Some(s) = segs.next() {
        if s.eq_ignore_ascii_case("virtualMachineScaleSets") {
            return segs.next();
        }
    }
    None
}

/// A tag key's label or taint key: `_` stands for `/` and `~2` for `_` (cluster-autoscaler).
fn decode_tag_key(key: &str) -> String {
    key.replace('_', "/").replace("~2", "_")
}

fn effect_ok(effect: &str) -> bool {
    matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
}

/// A template tag's taint value, `value:Effect` (no effect: `NoSchedule`).
fn tag_taint(key: &str, value: &str) -> Option<Value> {
    let (v, effect) = value.rsplit_once(':').unwrap_or((value, "NoSchedule"));
    effect_ok(effect).then(|| json!({"key": key, "value": v, "effect": effect}))
}

/// An agent pool's `nodeTaints` entry, `key=value:Effect` or `key:Effect`.
fn pool_taint(text: &str) -> Option<Value> {
    let (kv, effect) = text.rsplit_once(':')?;
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    (effect_ok(effect) && !key.is_empty())
        .then(|| json!({"key": key, "value": value, "effect": effect}))
}

fn quantities(r: NodeResources) -> Value {
    let mut q = json!({
        "cpu": format!("{}m", r.cpu_milli),
        "memory": format!("{}Ki", r.memory_bytes / 1024),
        "pods": r.pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    if r.gpus > 0 {
        q["nvidia.com/gpu"] = json!(r.gpus.to_string());
    }
    q
}

fn ready_condition(ready: bool) -> Value {
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready: the node is booting",
        )
    };
    json!({
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now_rfc3339(),
        "lastTransitionTime": now_rfc3339(),
    })
}

pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

/// The CSINode the CSI drivers register for `node` (owned by it): Azure Disk with the VM size's
/// data-disk limit as its `allocatable.count` and its zone key, Azure File without a limit.
fn create_csi_node(store: &mut Store, node: &Value, size: &str) {
    let (Some(rt), Some(name)) = (
        resources::find("storage.k8s.io", "v1", "csinodes"),
        name_of(node),
    ) else {
        return;
    };
    let csi = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
            "name": name, "uid": node.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)}]},
        "spec": {"drivers": [
            {"name": "disk.csi.azure.com", "nodeID": name,
                "topologyKeys": ["topology.disk.csi.azure.com/zone"],
                "allocatable": {"count": super::sizes::max_data_disks(size)}},
            {"name": "file.csi.azure.com", "nodeID": name, "topologyKeys": null},
        ]},
    });
    let _ = store.create(rt, "", csi);
}

/// The Node for instance `id` of `ss`, `Ready` or not.
fn node_object(ss: &ScaleSetInventory, id: u64, ready: bool) -> Value {
    let name = node_name(&ss.name, id);
    let pool = ss
        .pool
        .as_ref()
        .map(|p| p.name.clone())
        .or_else(|| ss.tags.get(POOL_NAME_TAG).cloned());
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    labels.insert(
        "node.kubernetes.io/instance-type".into(),
        ss.sku_name.clone(),
    );
    labels.insert("topology.kubernetes.io/region".into(), ss.location.clone());
    // As AKS labels them: `<region>-<zone>` on a zonal node; a regional one has zone `0` and an
    // empty disk zone (the Azure Disk CSI driver's label for "no zone").
    let zone = ss
        .instances
        .iter()
        .find(|(i, _, _)| *i == id)
        .and_then(|(_, _, z)| z.as_deref());
    match zone {
        Some(z) => {
            let zone = format!("{}-{z}", ss.location);
            labels.insert("topology.kubernetes.io/zone".into(), zone.clone());
            labels.insert("topology.disk.csi.azure.com/zone".into(), zone);
        }
        None => {
            labels.insert("topology.kubernetes.io/zone".into(), "0".into());
            labels.insert("topology.disk.csi.azure.com/zone".into(), String::new());
        }
    }
    if let Some(pool) = &pool {
        labels.insert("kubernetes.azure.com/agentpool".into(), pool.clone());
        labels.insert("agentpool".into(), pool.clone());
    }
    let mut taints: Vec<Value> = Vec::new();
    // A resources tag names a resource's amount outright (cluster-autoscaler reads it as
    // allocatable); it is set as both capacity and allocatable.
    let mut resource_tags: Vec<(String, String)> = Vec::new();
    for (key, value) in &ss.tags {
        if let Some(k) = key.strip_prefix(LABEL_TAG) {
            labels.insert(decode_tag_key(k), value.clone());
        } else if let Some(k) = key.strip_prefix(TAINT_TAG) {
            taints.extend(tag_taint(&decode_tag_key(k), value));
        } else if let Some(k) = key.strip_prefix(RESOURCES_TAG) {
            if super::quantity::parse_milli(value).is_some() {
                resource_tags.push((decode_tag_key(k), value.clone()));
            }
        }
    }
    let mut max_pods = sizes::DEFAULT_MAX_PODS;
    if let Some(p) = &ss.pool {
        labels.extend(p.node_labels.clone());
        taints.extend(p.node_taints.iter().filter_map(|t| pool_taint(t)));
        max_pods = p.max_pods;
    }
    // What its kubelet registers with beyond the tags (`--node-labels`,
    // `--register-with-taints`): over the tags' and the pool's.
    for (key, value) in &ss.registration.labels {
        match value {
            Some(v) => labels.insert(key.clone(), v.clone()),
            None => labels.remove(key),
        };
    }
    for text in &ss.registration.taints {
        if let Ok((key, value, effect)) = crate::arm::registration::parse_taint(text) {
            taints.retain(|t| !(t["key"] == key.as_str() && t["effect"] == effect.as_str()));
            taints.push(json!({"key": key, "value": value, "effect": effect}));
        }
    }
    if ss.spot {
        labels.insert(SPOT_KEY.into(), "spot".into());
        if !taints.iter().any(|t| t["key"] == SPOT_KEY) {
            taints.push(json!({"key": SPOT_KEY, "value": "spot", "effect": "NoSchedule"}));
        }
    }
    if !ready {
        taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
    let ip = format!("10.224.{}.{}", (id / 250) % 250, id % 250 + 4);
    let mut capacity = quantities(sizes::capacity(&ss.sku_name, max_pods));
    let mut allocatable = quantities(sizes::allocatable(&ss.sku_name, max_pods));
    for (resource, amount) in resource_tags {
        capacity[resource.as_str()] = json!(amount);
        allocatable[resource.as_str()] = json!(amount);
    }
    json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {SIMULATED_ANNOTATION: "true"},
        },
        "spec": {
            "providerID": provider_id(&ss.subscription, &ss.resource_group, &ss.name, id),
            "taints": taints,
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [ready_condition(ready)],
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            // Every field a kubelet reports (the Go API server sends them all, and strict
            // clients require them), with an AKS Ubuntu 22.04 node image's values.
            "nodeInfo": {
                "machineID": uuid::Uuid::new_v4().simple().to_string(),
                "systemUUID": uuid::Uuid::new_v4().to_string(),
                "bootID": uuid::Uuid::new_v4().to_string(),
                "kernelVersion": KERNEL_VERSION,
                "osImage": OS_IMAGE,
                "containerRuntimeVersion": CONTAINER_RUNTIME,
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    })
}

/// Whether a Node's `Ready` condition is `True`.
pub fn is_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

pub(crate) fn is_simulated(node: &Value) -> bool {
    node.pointer("/metadata/annotations")
        .and_then(|a| a.get(SIMULATED_ANNOTATION))
        .is_some()
}

/// A pod deleted with its Node because the Node's instance went (not evicted through the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLoss {
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub name: String,
    /// The Node it was bound to.
    pub node: String,
    /// The kind of its controller (`ReplicaSet`, `DaemonSet`, ...), if it has one.
    pub owner_kind: Option<String>,
}

/// Deletes every pod bound to `node`, in every namespace; returns them.
pub(crate) fn delete_pods_on(store: &mut Store, node: &str) -> Vec<PodLoss> {
    let Some(pods_rt) = resources::find("", "v1", "pods") else {
        return Vec::new();
    };
    let bound: Vec<(PodLoss, bool)> = store
        .list(pods_rt, None, &Selector::default(), None, None)
        .items
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .map(|p| {
            // A finished pod (`Succeeded`, `Failed`) loses nothing with its node: the pod garbage
            // collector deletes it, as it does one already deleted.
            let deleted = p.pointer("/metadata/deletionTimestamp").is_some()
                || matches!(
                    p.pointer("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                );
            let loss = PodLoss {
                namespace: p
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                name: name_of(p).unwrap_or("").to_string(),
                node: node.to_string(),
                owner_kind: p
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|refs| {
                        refs.iter()
                            .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
                    })
                    .and_then(|r| r.get("kind").and_then(Value::as_str))
                    .map(str::to_string),
            };
            (loss, deleted)
        })
        .collect();
    bound
        .into_iter()
        .filter(|(loss, _)| {
            store
                .delete(pods_rt, &loss.namespace, &loss.name, None)
                .is_ok()
        })
        // A pod already deleted through the API (its kubelet dead, so it waited with a
        // `deletionTimestamp`), or finished, is collected by the pod garbage collector, not lost
        // with its node.
        .filter(|(_, deleted)| !deleted)
        .map(|(loss, _)| loss)
        .collect()
}

/// Brings the Nodes in line with the instances: creates the missing ones, deletes those whose
/// instance is gone (with their pods, recorded in `losses`), and makes booted ones `Ready`.
/// Returns when the next booting Node is due to turn `Ready`, if one is booting.
pub(crate) fn sync(
    store: &mut Store,
    memory: &mut NodeMemory,
    inventory: &[ScaleSetInventory],
    boot_delay: Duration,
    now: Instant,
    losses: &mut Vec<PodLoss>,
) -> Option<Instant> {
    let nodes_rt = resources::find("", "v1", "nodes")?;
    // lowercased providerID -> (scale set, instance id, when it may be Ready)
    let mut wanted: BTreeMap<String, (&ScaleSetInventory, u64, Instant)> = BTreeMap::new();
    for ss in inventory {
        for (id, provisioned_at, _) in &ss.instances {
            let pid = provider_id(&ss.subscription, &ss.resource_group, &ss.name, *id)
                .to_ascii_lowercase();
            let first = *memory.first_seen.entry(pid.clone()).or_insert(now);
            let ready_at = (first + boot_delay).max(*provisioned_at);
            wanted.insert(pid, (ss, *id, ready_at));
        }
    }
    memory.first_seen.retain(|pid, _| wanted.contains_key(pid));

    let existing: Vec<Value> = store
        .list(nodes_rt, None, &Selector::default(), None, None)
        .items
        .into_iter()
        .filter(is_simulated)
        .collect();
    let mut present: HashMap<String, Value> = HashMap::new();
    for node in existing {
        let pid = node
            .pointer("/spec/providerID")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_ascii_lowercase();
        let name = name_of(&node).unwrap_or("").to_string();
        if wanted.contains_key(&pid) {
            present.insert(pid, node);
        } else {
            tracing::debug!(node = %name, "instance gone: deleting its node and pods");
            losses.extend(delete_pods_on(store, &name));
            let _ = store.delete(nodes_rt, "", &name, None);
            if let Some(csi_rt) = resources::find("storage.k8s.io", "v1", "csinodes") {
                let _ = store.delete(csi_rt, "", &name, None);
            }
        }
    }
    let mut next_boot: Option<Instant> = None;
    for (pid, (ss, id, ready_at)) in &wanted {
        let ready = now >= *ready_at;
        if !ready {
            next_boot = Some(next_boot.map_or(*ready_at, |t| t.min(*ready_at)));
        }
        let broken = ss.tags.get(NEVER_REGISTER_TAG).map(String::as_str) == Some("true");
        // A VM listed `Failed` that has no Node never gets one (its operation failed to
        // create it: it never boots); one that turned `Failed` later (an update or a delete
        // Azure failed) keeps the Node it has.
        let never_booted = ss.failed.contains(id);
        match present.get(pid) {
            None if broken || never_booted => {}
            None => {
                let ready = ready && !ss.deallocated.contains(id);
                if let Ok(node) = store.create(nodes_rt, "", node_object(ss, *id, ready)) {
                    create_csi_node(store, &node, &ss.sku_name);
                }
            }
            Some(node) => {
                let stopped = ss.deallocated.contains(id);
                if !stopped && kubelet_dead(node) {
                    if !unreachable(node) {
                        let _ = set_kubelet(store, node, true);
                    }
                    continue;
                }
                let sick = stopped
                    .then_some("the VM is deallocated: its kubelet stopped posting ready status");
                let should = ready && sick.is_none();
                if (should != is_ready(node) && (ready || sick.is_some()))
                    || has_taint(node, SHUTDOWN_TAINT) != stopped
                {
                    set_ready(store, node, sick, stopped);
                }
            }
        }
    }
    next_boot
}

/// Whether a Node carries the dead-kubelet annotation ([`NOT_READY_ANNOTATION`]).
pub(crate) fn kubelet_dead(node: &Value) -> bool {
    node.pointer("/metadata/annotations")
        .and_then(|a| a.get(NOT_READY_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true")
}

/// Whether a Node is marked as one whose kubelet stopped posting: `Ready=Unknown` and both
/// unreachable taints.
fn unreachable(node: &Value) -> bool {
    let ready_unknown = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("Unknown")
            })
        });
    let effects: Vec<&str> = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter(|t| t.get("key").and_then(Value::as_str) == Some(UNREACHABLE_TAINT))
                .filter_map(|t| t.get("effect").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    ready_unknown && effects.contains(&"NoSchedule") && effects.contains(&"NoExecute")
}

/// Kills (`dead`) or revives a Node's kubelet, as a real cluster then shows the Node. Dead: the
/// [`NOT_READY_ANNOTATION`], the two unreachable taints (the not-ready one goes), every
/// condition `Unknown` with reason `NodeStatusUnknown` ("Kubelet stopped posting node
/// status."), as the node lifecycle controller writes them. Revived: no annotation, no
/// unreachable taint, `Ready=True`. Returns the Node as written.
pub(crate) fn set_kubelet(
    store: &mut Store,
    node: &Value,
    dead: bool,
) -> Result<Value, crate::kube::KubeError> {
    let nodes_rt = resources::find("", "v1", "nodes").expect("nodes are served");
    let name = name_of(node).unwrap_or("").to_string();
    let mut spec_write = node.clone();
    if let Some(m) = spec_write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    if dead {
        spec_write["metadata"]["annotations"][NOT_READY_ANNOTATION] = json!("true");
    } else if let Some(a) = spec_write
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(NOT_READY_ANNOTATION);
    }
    let mut taints: Vec<Value> = spec_write
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    taints.retain(|t| {
        let key = t.get("key").and_then(Value::as_str);
        key != Some(UNREACHABLE_TAINT) && key != Some(NOT_READY_TAINT)
    });
    if dead {
        taints.push(json!({"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}));
        taints.push(
            json!({"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": now_rfc3339()}),
        );
    }
    spec_write["spec"]["taints"] = Value::Array(taints);
    let mut current = store.update(nodes_rt, "", &name, spec_write, None)?;
    let mut conditions: Vec<Value> = current
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if dead {
        if !conditions
            .iter()
            .any(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        {
            conditions.push(json!({"type": "Ready"}));
        }
        let now = now_rfc3339();
        for c in &mut conditions {
            if c.get("status").and_then(Value::as_str) != Some("Unknown") {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!("Unknown");
            c["reason"] = json!("NodeStatusUnknown");
            c["message"] = json!("Kubelet stopped posting node status.");
        }
    } else {
        conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("Ready"));
        conditions.push(ready_condition(true));
    }
    current["status"]["conditions"] = Value::Array(conditions);
    if let Some(m) = current["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    store.update(nodes_rt, "", &name, current, Some("status"))
}

fn has_taint(node: &Value, key: &str) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
        })
}

/// Flips a Node's readiness: `Ready` (no `sick` reason) drops the not-ready taint, not `Ready`
/// adds it (as the node lifecycle controller does), then the condition is set. A Node whose VM
/// is `shutdown` (deallocated) also gets the shutdown taint, as the cloud node lifecycle
/// controller sets it.
fn set_ready(store: &mut Store, node: &Value, sick: Option<&str>, shutdown: bool) {
    let ready = sick.is_none();
    let Some(nodes_rt) = resources::find("", "v1", "nodes") else {
        return;
    };
    let name = name_of(node).unwrap_or("").to_string();
    let mut spec_write = node.clone();
    if let Some(m) = spec_write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    if let Some(taints) = spec_write
        .pointer_mut("/spec/taints")
        .and_then(Value::as_array_mut)
    {
        taints.retain(|t| {
            let key = t.get("key").and_then(Value::as_str);
            key != Some(NOT_READY_TAINT)
                && key != Some(SHUTDOWN_TAINT)
                && key != Some(UNREACHABLE_TAINT)
        });
    }
    let mut add = Vec::new();
    if !ready {
        add.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
    if shutdown {
        add.push(json!({"key": SHUTDOWN_TAINT, "effect": "NoSchedule"}));
    }
    for taint in add {
        match spec_write
            .pointer_mut("/spec/taints")
            .and_then(Value::as_array_mut)
        {
            Some(taints) => taints.push(taint),
            None => spec_write["spec"]["taints"] = json!([taint]),
        }
    }
    let Ok(mut current) = store.update(nodes_rt, "", &name, spec_write, None) else {
        return;
    };
    let mut conditions: Vec<Value> = current
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("Ready"));
    let mut condition = ready_condition(ready);
    if let Some(why) = sick {
        condition["message"] = json!(why);
    }
    conditions.push(condition);
    current["status"]["conditions"] = Value::Array(conditions);
    if let Some(m) = current["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let _ = store.update(nodes_rt, "", &name, current, Some("status"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_end_in_six_base_36_digits_of_the_instance_id() {
        assert_eq!(
            node_name("aks-gpu-12345678-vmss", 10),
            "aks-gpu-12345678-vmss00000a"
        );
        assert_eq!(node_name("Workers", 36 * 36 + 1), "workers000101");
    }

    #[test]
    fn tag_keys_decode_slashes_and_underscores_as_cluster_autoscaler_does() {
        assert_eq!(
            decode_tag_key("nvidia.com_gpu~2type"),
            "nvidia.com/gpu_type"
        );
    }

    #[test]
    fn taints_parse_from_tags_and_from_pool_node_taints() {
        assert_eq!(
            tag_taint("sku", "gpu:NoSchedule"),
            Some(json!({"key": "sku", "value": "gpu", "effect": "NoSchedule"}))
        );
        assert_eq!(
            pool_taint("sku=gpu:NoExecute"),
            Some(json!({"key": "sku", "value": "gpu", "effect": "NoExecute"}))
        );
        assert_eq!(
            pool_taint("dedicated:NoSchedule"),
            Some(json!({"key": "dedicated", "value": "", "effect": "NoSchedule"}))
        );
        assert_eq!(pool_taint("sku=gpu:Sometimes"), None);
    }

    #[test]
    fn the_scale_set_is_read_back_from_a_provider_id() {
        let pid = provider_id("s", "rg", "aks-gpu-1-vmss", 3);
        assert_eq!(scale_set_of(&pid), Some("aks-gpu-1-vmss"));
        assert_eq!(scale_set_of("kind://docker/x"), None);
    }
}
