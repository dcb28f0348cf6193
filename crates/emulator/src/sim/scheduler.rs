//! A simple scheduler, written apart from the planner's fit code (a shared bug would agree with
//! itself): each pending pod goes to a `Ready`, schedulable Node whose free cpu, memory,
//! `nvidia.com/gpu` and pod slots hold its requests, whose labels satisfy its `nodeSelector` and
//! whose `NoSchedule`/`NoExecute` taints it tolerates; of those, the one kube-scheduler's default
//! scoring prefers (`TaintToleration`, weight 3: fewest untolerated `PreferNoSchedule` taints;
//! then least allocated, weight 1: the most cpu and memory left free; the first in name order on
//! a tie), so pods spread, and avoid soft-tainted nodes, as on a real cluster. Topology spread, inter-pod affinity and volume
//! filters are [`super::placement`]'s. A pod that fits nowhere is marked
//! `PodScheduled=False/Unschedulable` with the real scheduler's kind of message.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::kube::resources;
use crate::kube::select::Selector;
use crate::kube::store::{name_of, Store};

use super::nodes::{is_ready, now_rfc3339};
use super::placement::{NodeView, PassState};
use super::quantity::milli_of;

const GPU: &str = "nvidia.com/gpu";

/// Requests of a pod, or free room on a node: cpu, memory and GPUs in thousandths, pods whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Amounts {
    pub cpu: i128,
    pub memory: i128,
    pub gpu: i128,
    pub pods: i128,
}

impl Amounts {
    fn add(&mut self, o: Amounts) {
        self.cpu += o.cpu;
        self.memory += o.memory;
        self.gpu += o.gpu;
        self.pods += o.pods;
    }
}

/// One container's request of `res`; a limit stands in for a missing request, as the API
/// server defaults it.
fn container_request(c: &Value, res: &str) -> i128 {
    let resources = c.get("resources");
    let pick = |kind: &str| {
        resources
            .and_then(|r| r.get(kind))
            .and_then(|m| m.get(res))
            .and_then(milli_of)
    };
    pick("requests").or_else(|| pick("limits")).unwrap_or(0)
}

/// What a pod asks for: the sum over its containers, or the largest init container if more.
pub(crate) fn pod_requests(pod: &Value) -> Amounts {
    let list = |name: &str| -> Vec<Value> {
        pod.pointer(&format!("/spec/{name}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let containers = list("containers");
    let inits = list("initContainers");
    let mut out = Amounts {
        pods: 1,
        ..Amounts::default()
    };
    for (res, slot) in [("cpu", 0), ("memory", 1), (GPU, 2)] {
        let sum: i128 = containers.iter().map(|c| container_request(c, res)).sum();
        let init = inits
            .iter()
            .map(|c| container_request(c, res))
            .max()
            .unwrap_or(0);
        let v = sum.max(init);
        match slot {
            0 => out.cpu = v,
            1 => out.memory = v,
            _ => out.gpu = v,
        }
    }
    out
}

/// A node's `status.allocatable`.
fn allocatable(node: &Value) -> Amounts {
    let get = |res: &str| {
        node.pointer("/status/allocatable")
            .and_then(|a| a.get(res))
            .and_then(milli_of)
            .unwrap_or(0)
    };
    Amounts {
        cpu: get("cpu"),
        memory: get("memory"),
        gpu: get(GPU),
        pods: get("pods") / 1000,
    }
}

/// Whether `tolerations` tolerate `taint` (operators `Equal` and `Exists`; an empty key with
/// `Exists` tolerates everything; an empty effect matches every effect).
pub(crate) fn tolerates(tolerations: &[Value], taint: &Value) -> bool {
    fn field<'a>(v: &'a Value, k: &str) -> &'a str {
        v.get(k).and_then(Value::as_str).unwrap_or("")
    }
    let (tkey, tvalue, teffect) = (
        field(taint, "key"),
        field(taint, "value"),
        field(taint, "effect"),
    );
    tolerations.iter().any(|t| {
        let effect = field(t, "effect");
        if !effect.is_empty() && effect != teffect {
            return false;
        }
        let key = field(t, "key");
        match field(t, "operator") {
            "Exists" => key.is_empty() || key == tkey,
            "" | "Equal" => key == tkey && field(t, "value") == tvalue,
            _ => false,
        }
    })
}

/// The first `NoSchedule`/`NoExecute` taint of `node` that `tolerations` do not tolerate.
pub(crate) fn untolerated_taint(node: &Value, tolerations: &[Value]) -> Option<Value> {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)?
        .iter()
        .filter(|t| {
            matches!(
                t.get("effect").and_then(Value::as_str),
                Some("NoSchedule" | "NoExecute")
            )
        })
        .find(|t| !tolerates(tolerations, t))
        .cloned()
}

/// Whether the node's labels hold every pair of the pod spec's `nodeSelector`.
pub(crate) fn selector_matches(node: &Value, pod_spec: &Value) -> bool {
    selector_and_affinity_match(
        pod_spec,
        node.pointer("/metadata/labels").and_then(Value::as_object),
    )
}

/// Whether node `labels` hold the pod spec's `nodeSelector` and required node affinity.
pub(crate) fn selector_and_affinity_match(
    pod_spec: &Value,
    labels: Option<&Map<String, Value>>,
) -> bool {
    let selected = pod_spec
        .get("nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|sel| {
            sel.iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        });
    selected && affinity_matches(pod_spec, labels)
}

/// Whether one `matchExpressions` requirement of a node selector term holds for `labels`
/// (operators `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`; an unknown one never holds).
fn requirement_holds(req: &Value, labels: Option<&Map<String, Value>>) -> bool {
    let key = req.get("key").and_then(Value::as_str).unwrap_or("");
    let value = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    let values: Vec<&str> = req
        .get("values")
        .and_then(Value::as_array)
        .map(|vs| vs.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
    match req.get("operator").and_then(Value::as_str).unwrap_or("") {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((number(value), number(values.first().copied())), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((number(value), number(values.first().copied())), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// Whether `labels` satisfy the pod spec's required node affinity: any one term whose
/// `matchExpressions` all hold (no required affinity: true).
fn affinity_matches(pod_spec: &Value, labels: Option<&Map<String, Value>>) -> bool {
    let Some(terms) = pod_spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    node_selector_terms_match(terms, labels)
}

/// Whether any one of these node selector terms holds for `labels` (its `matchExpressions` all
/// hold; a term with neither expressions nor fields matches nothing).
pub(crate) fn node_selector_terms_match(
    terms: &[Value],
    labels: Option<&Map<String, Value>>,
) -> bool {
    terms.iter().any(|term| {
        let exprs = term
            .get("matchExpressions")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty());
        let fields = term
            .get("matchFields")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty());
        // A term with neither (or with both empty) matches no node, as the scheduler has it;
        // `matchFields` is not simulated: such a term matches none.
        exprs.is_some()
            && fields.is_none()
            && exprs.is_some_and(|es| es.iter().all(|r| requirement_holds(r, labels)))
    })
}

pub(crate) fn tolerations_of(pod_spec: &Value) -> Vec<Value> {
    pod_spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// Whether the pod waits for the scheduler: unbound, not being deleted, phase Pending.
pub(crate) fn is_pending(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            None | Some("Pending")
        )
}

/// A node as the scheduler sees it, read once per pass.
struct NodeRoom {
    name: String,
    labels: Option<Map<String, Value>>,
    /// `NoSchedule` and `NoExecute` taints, each with its reason text.
    taints: Vec<(Value, String)>,
    /// `PreferNoSchedule` taints: they filter nothing, but the score avoids them.
    soft_taints: Vec<Value>,
    ready: bool,
    unschedulable: bool,
    free: Amounts,
    allocatable: Amounts,
}

impl NodeRoom {
    /// kube-scheduler's default score (`NodeResourcesFit`, `LeastAllocated`): the mean share of
    /// cpu and memory left free once `want` is placed, in thousandths. The emptiest node wins,
    /// so pods spread, as on a real cluster.
    fn least_allocated(&self, want: Amounts) -> i128 {
        let share = |free: i128, total: i128| {
            if total <= 0 {
                0
            } else {
                ((free * 1000) / total).clamp(0, 1000)
            }
        };
        (share(self.free.cpu - want.cpu, self.allocatable.cpu)
            + share(self.free.memory - want.memory, self.allocatable.memory))
            / 2
    }
}

impl NodeRoom {
    /// How many of the node's `PreferNoSchedule` taints `tolerations` do not tolerate
    /// (kube-scheduler's `TaintToleration` score counts these).
    fn soft_taints_untolerated(&self, tolerations: &[Value]) -> i128 {
        self.soft_taints
            .iter()
            .filter(|t| !tolerates(tolerations, t))
            .count() as i128
    }

    fn of(node: &Value) -> NodeRoom {
        let taints = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter(|t| {
                        matches!(
                            t.get("effect").and_then(Value::as_str),
                            Some("NoSchedule" | "NoExecute")
                        )
                    })
                    .map(|t| {
                        let key = t.get("key").and_then(Value::as_str).unwrap_or("");
                        let value = t.get("value").and_then(Value::as_str).unwrap_or("");
                        (
                            t.clone(),
                            format!("node(s) had untolerated taint {{{key}: {value}}}"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let soft_taints = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter(|t| t.get("effect").and_then(Value::as_str) == Some("PreferNoSchedule"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        NodeRoom {
            name: name_of(node).unwrap_or("").to_string(),
            soft_taints,
            labels: node
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .cloned(),
            taints,
            ready: is_ready(node),
            unschedulable: node.pointer("/spec/unschedulable").and_then(Value::as_bool)
                == Some(true),
            free: allocatable(node),
            allocatable: allocatable(node),
        }
    }
}

/// kube-scheduler's weights (its default profile, `kube-scheduler/config/v1`): `TaintToleration`
/// 3, `NodeResourcesFit` (`LeastAllocated`) 1.
const TAINT_TOLERATION_WEIGHT: i128 = 3;

/// Of the `feasible` nodes (index, least-allocated score in thousandths, untolerated
/// `PreferNoSchedule` taints), the one kube-scheduler's default scoring prefers: `TaintToleration`
/// normalised as it does (the node with the most such taints scores 0, one with none the
/// maximum; every node the maximum when none has any), weighted 3 against the least-allocated
/// score's 1; the first in node order on a tie.
fn best_scored(feasible: &[(usize, i128, i128)]) -> Option<usize> {
    let most = feasible.iter().map(|f| f.2).max().unwrap_or(0);
    let mut best: Option<(usize, i128)> = None;
    for &(i, fit, soft) in feasible {
        let taint = if most == 0 {
            1000
        } else {
            1000 - soft * 1000 / most
        };
        let score = TAINT_TOLERATION_WEIGHT * taint + fit;
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// The reason for a Node that is not `Ready` (its not-ready taint, as the scheduler sees it).
const NOT_READY_REASON: &str = "node(s) had untolerated taint {node.kubernetes.io/not-ready: }";

/// Why a pod (asking `want`) does not fit on `room`: the reasons the real scheduler would count
/// (empty: it fits).
fn misfits<'a>(
    room: &'a NodeRoom,
    spec: &Value,
    selector: Option<&Map<String, Value>>,
    tolerations: &[Value],
    want: Amounts,
) -> Vec<&'a str> {
    if room.unschedulable {
        return vec!["node(s) were unschedulable"];
    }
    if let Some((_, reason)) = room.taints.iter().find(|(t, _)| !tolerates(tolerations, t)) {
        return vec![reason.as_str()];
    }
    if !room.ready {
        return vec![NOT_READY_REASON];
    }
    let selected = selector.is_none_or(|sel| {
        sel.iter()
            .all(|(k, v)| room.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
    });
    if !selected || !affinity_matches(spec, room.labels.as_ref()) {
        return vec!["node(s) didn't match Node's node affinity/selector"];
    }
    let mut out = Vec::new();
    if want.pods > room.free.pods {
        out.push("Too many pods");
    }
    if want.cpu > room.free.cpu {
        out.push("Insufficient cpu");
    }
    if want.memory > room.free.memory {
        out.push("Insufficient memory");
    }
    if want.gpu > room.free.gpu {
        out.push("Insufficient nvidia.com/gpu");
    }
    out
}

/// `0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint {sku: gpu}.`
fn fit_error(nodes: usize, reasons: &HashMap<&str, usize>) -> String {
    if nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{nodes} nodes are available: {}.", parts.join(", "))
}

pub(crate) fn namespace_of(obj: &Value) -> String {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Writes `status` as `pod`'s, through the status subresource, whatever its version is now (the
/// simulation's own writes, under the store's lock); a pod gone meanwhile is skipped.
pub(crate) fn write_pod_status(store: &mut Store, pod: &Value, status: Value) {
    let Some(pods_rt) = resources::find("", "v1", "pods") else {
        return;
    };
    let mut write = pod.clone();
    write["status"] = status;
    if let Some(m) = write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let _ = store.update(
        pods_rt,
        &namespace_of(pod),
        name_of(pod).unwrap_or(""),
        write,
        Some("status"),
    );
}

fn condition(kind: &str, status: &str) -> Value {
    json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": now_rfc3339()})
}

/// The status a kubelet on `node` writes for `pod` once its containers run: phase `Running`,
/// every condition `True`, the node's address as `hostIP`, a pod IP, and a `running`, ready status
/// per container (init containers `Completed`), as a real kubelet reports them. A pod annotated
/// [`super::READY_AFTER_ANNOTATION`] runs not Ready yet (`ContainersNotReady`, its containers
/// started, not ready): [`super::readiness`] turns it Ready once that time has passed.
pub(crate) fn kubelet_status(store: &Store, pod: &Value, node: &str) -> Map<String, Value> {
    let now = now_rfc3339();
    let ready = super::readiness::ready_after(pod).is_none();
    let host_ip = resources::find("", "v1", "nodes")
        .and_then(|rt| store.get(rt, "", node).ok())
        .and_then(|n| {
            n.pointer("/status/addresses")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
                .and_then(|x| x.get("address"))
                .cloned()
        });
    let ip = pod_ip(&format!(
        "{}/{}",
        namespace_of(pod),
        name_of(pod).unwrap_or("")
    ));
    let statuses = |list: &str, state: Value| -> Vec<Value> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        json!({
                            "name": c.get("name").cloned().unwrap_or(json!("")),
                            "state": state,
                            "lastState": {},
                            "ready": ready || list != "containers",
                            "restartCount": 0,
                            "image": c.get("image").cloned().unwrap_or(json!("")),
                            "imageID": "",
                            "containerID": format!("containerd://{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()),
                            "started": list == "containers",
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut status = Map::new();
    status.insert("phase".into(), json!("Running"));
    status.insert("startTime".into(), json!(now));
    status.insert(
        "conditions".into(),
        json!([
            condition("Initialized", "True"),
            if ready {
                condition("Ready", "True")
            } else {
                super::readiness::not_ready("Ready", pod)
            },
            if ready {
                condition("ContainersReady", "True")
            } else {
                super::readiness::not_ready("ContainersReady", pod)
            },
            condition("PodScheduled", "True"),
        ]),
    );
    if let Some(host_ip) = host_ip {
        status.insert("hostIP".into(), host_ip);
    }
    status.insert("podIP".into(), json!(ip));
    status.insert("podIPs".into(), json!([{"ip": ip}]));
    let init = statuses(
        "initContainers",
        json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}),
    );
    if !init.is_empty() {
        status.insert("initContainerStatuses".into(), json!(init));
    }
    status.insert(
        "containerStatuses".into(),
        json!(statuses(
            "containers",
            json!({"running": {"startedAt": now}})
        )),
    );
    status
}

/// A pod IP in AKS's default pod CIDR (10.244.0.0/16), stable for a pod's namespace and name.
fn pod_ip(key: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let n = h.finish();
    format!("10.244.{}.{}", (n >> 8) % 256, n % 254 + 1)
}

/// Binds `pod` to `node`: `spec.nodeName`, then a `Running` status with every condition `True`
/// (two writes, as the binding and the kubelet's status are on a real cluster).
pub(crate) fn bind(store: &mut Store, pod: &Value, node: &str) {
    let Some(pods_rt) = resources::find("", "v1", "pods") else {
        return;
    };
    let ns = namespace_of(pod);
    let name = name_of(pod).unwrap_or("").to_string();
    let mut spec_write = pod.clone();
    spec_write["spec"]["nodeName"] = json!(node);
    if let Some(m) = spec_write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let Ok(mut bound) = store.update(pods_rt, &ns, &name, spec_write, None) else {
        return;
    };
    let mut status = bound
        .get("status")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(Map::new);
    status.extend(kubelet_status(store, &bound, node));
    bound["status"] = Value::Object(status);
    if let Some(m) = bound["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let _ = store.update(pods_rt, &ns, &name, bound, Some("status"));
}

/// Writes `PodScheduled=False/Unschedulable` with `message`, unless the pod already says so.
fn mark_unschedulable(store: &mut Store, pod: &Value, message: &str) {
    let mut conditions: Vec<Value> = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let current = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"));
    let same = current.is_some_and(|c| {
        c.get("status").and_then(Value::as_str) == Some("False")
            && c.get("reason").and_then(Value::as_str) == Some("Unschedulable")
            && c.get("message").and_then(Value::as_str) == Some(message)
    });
    if same {
        return;
    }
    conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
    let mut cond = condition("PodScheduled", "False");
    cond["reason"] = json!("Unschedulable");
    cond["message"] = json!(message);
    conditions.push(cond);
    let mut status = pod.get("status").cloned().unwrap_or(json!({}));
    status["conditions"] = Value::Array(conditions);
    write_pod_status(store, pod, status);
}

/// One scheduling pass over every pending pod (higher priority first, then oldest).
pub(crate) fn schedule(store: &mut Store) {
    let (Some(pods_rt), Some(nodes_rt)) = (
        resources::find("", "v1", "pods"),
        resources::find("", "v1", "nodes"),
    ) else {
        return;
    };
    // Claims of `Immediate` classes get their volumes first, as the CSI driver makes them.
    super::placement::bind_immediate_claims(store);
    let all = Selector::default();
    let nodes = store.list(nodes_rt, None, &all, None, None).items;
    let pods = store.list(pods_rt, None, &all, None, None).items;
    let mut rooms: Vec<NodeRoom> = nodes.iter().map(NodeRoom::of).collect();
    let index: HashMap<String, usize> = rooms
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.clone(), i))
        .collect();
    let mut pending = Vec::new();
    let mut bound = Vec::new();
    for pod in pods {
        if is_pending(&pod) {
            // Pods for another scheduler are left to it.
            let ours = pod
                .pointer("/spec/schedulerName")
                .and_then(Value::as_str)
                .is_none_or(|s| s == "default-scheduler");
            if ours {
                pending.push(pod);
            }
            continue;
        }
        if is_terminal(&pod) {
            continue;
        }
        let on = pod.pointer("/spec/nodeName").and_then(Value::as_str);
        if let Some(&i) = on.and_then(|n| index.get(n)) {
            let used = pod_requests(&pod);
            let room = &mut rooms[i];
            room.free.cpu -= used.cpu;
            room.free.memory -= used.memory;
            room.free.gpu -= used.gpu;
            room.free.pods -= used.pods;
            bound.push((pod, i));
        }
    }
    let priority = |p: &Value| {
        p.pointer("/spec/priority")
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let created = |p: &Value| {
        p.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    pending.sort_by(|a, b| {
        priority(b)
            .cmp(&priority(a))
            .then_with(|| created(a).cmp(&created(b)))
            .then_with(|| name_of(a).cmp(&name_of(b)))
    });
    let mut state = PassState::read(store, &bound);
    for pod in pending {
        let spec = pod.get("spec").cloned().unwrap_or(json!({}));
        let tolerations = tolerations_of(&spec);
        let selector = spec.get("nodeSelector").and_then(Value::as_object);
        let want = pod_requests(&pod);
        let mut chosen = None;
        let mut message = None;
        if let Some(why) = state.prefilter(&pod) {
            message = Some(format!("0/{} nodes are available: {why}.", rooms.len()));
        } else {
            let views: Vec<NodeView<'_>> = rooms
                .iter()
                .map(|r| NodeView {
                    name: &r.name,
                    labels: r.labels.as_ref(),
                    taints: r.taints.iter().map(|(t, _)| t).collect(),
                })
                .collect();
            let mut reasons: HashMap<&str, usize> = HashMap::new();
            // The nodes that pass every filter, each with its scores' inputs.
            let mut feasible: Vec<(usize, i128, i128)> = Vec::new();
            for (i, room) in rooms.iter().enumerate() {
                let mut why = misfits(room, &spec, selector, &tolerations, want);
                if why.is_empty() {
                    why.extend(state.misfit(&pod, &views, i));
                }
                if why.is_empty() {
                    feasible.push((
                        i,
                        room.least_allocated(want),
                        room.soft_taints_untolerated(&tolerations),
                    ));
                    continue;
                }
                for r in why {
                    *reasons.entry(r).or_insert(0) += 1;
                }
            }
            chosen = best_scored(&feasible);
            if chosen.is_none() {
                message = Some(fit_error(rooms.len(), &reasons));
            }
        }
        match (chosen, message) {
            (Some(i), _) => {
                let room = &mut rooms[i];
                room.free.add(Amounts {
                    cpu: -want.cpu,
                    memory: -want.memory,
                    gpu: -want.gpu,
                    pods: -want.pods,
                });
                let node = room.name.clone();
                // No pod is bound while a claim of it waits for its volume.
                state.provision_for(store, &pod, &node, rooms[i].labels.as_ref());
                bind(store, &pod, &node);
                state.place(&pod, i);
            }
            (None, Some(m)) => mark_unschedulable(store, &pod, &m),
            (None, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_sum_containers_and_take_the_largest_init_container_if_larger() {
        let pod = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"resources": {"limits": {"cpu": "250m", "nvidia.com/gpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
        }});
        let r = pod_requests(&pod);
        assert_eq!(r.cpu, 2000);
        assert_eq!(r.memory, 1_073_741_824_000);
        assert_eq!(r.gpu, 1000);
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn tolerations_match_by_operator_key_value_and_effect() {
        let taint = json!({"key": "sku", "value": "gpu", "effect": "NoSchedule"});
        let equal = json!({"key": "sku", "operator": "Equal", "value": "gpu"});
        let wrong_value = json!({"key": "sku", "value": "cpu"});
        let exists = json!({"key": "sku", "operator": "Exists", "effect": "NoSchedule"});
        let other_effect = json!({"key": "sku", "operator": "Exists", "effect": "NoExecute"});
        let everything = json!({"operator": "Exists"});
        assert!(tolerates(&[equal], &taint));
        assert!(!tolerates(&[wrong_value], &taint));
        assert!(tolerates(&[exists], &taint));
        assert!(!tolerates(&[other_effect], &taint));
        assert!(tolerates(&[everything], &taint));
        assert!(!tolerates(&[], &taint));
    }

    #[test]
    fn required_node_affinity_needs_one_term_whose_expressions_all_hold() {
        let labels = json!({"zone": "1", "gpu": "a100", "size": "8"});
        let labels = labels.as_object();
        let spec = |exprs: Value| {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": exprs}]
            }}}})
        };
        let holds = |exprs: Value| affinity_matches(&spec(exprs), labels);
        assert!(holds(
            json!([{"key": "zone", "operator": "In", "values": ["1", "2"]}])
        ));
        assert!(!holds(
            json!([{"key": "zone", "operator": "NotIn", "values": ["1"]}])
        ));
        assert!(holds(json!([{"key": "gpu", "operator": "Exists"}])));
        assert!(!holds(json!([{"key": "gpu", "operator": "DoesNotExist"}])));
        assert!(holds(
            json!([{"key": "size", "operator": "Gt", "values": ["4"]}])
        ));
        assert!(!holds(
            json!([{"key": "size", "operator": "Lt", "values": ["4"]}])
        ));
        assert!(!holds(json!([
            {"key": "zone", "operator": "In", "values": ["1"]},
            {"key": "missing", "operator": "Exists"},
        ])));
        assert!(affinity_matches(&json!({}), labels));
        // A term with no expressions matches no node (Kubernetes: an empty term selects nothing).
        assert!(!holds(json!([])));
    }

    #[test]
    fn the_fit_error_counts_reasons_sorted_as_the_scheduler_sorts_them() {
        let mut reasons = HashMap::new();
        reasons.insert("node(s) had untolerated taint {sku: gpu}", 2);
        reasons.insert("Insufficient cpu", 1);
        assert_eq!(
            fit_error(3, &reasons),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint {sku: gpu}."
        );
        assert_eq!(
            fit_error(0, &reasons),
            "no nodes available to schedule pods"
        );
    }
}
