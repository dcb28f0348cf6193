//! The scheduler's filters beyond resources, taints and node affinity, written from the
//! Kubernetes documentation apart from the planner's (`src/pods/`), so a shared misreading
//! cannot agree with itself:
//!
//! - **PodTopologySpread** (`whenUnsatisfiable: DoNotSchedule`; `ScheduleAnyway` only scores):
//!   `maxSkew` over the domains of eligible nodes (nodes with every constraint's key that pass
//!   the pod's node selector and affinity, `nodeAffinityPolicy: Honor`; taints only with
//!   `nodeTaintsPolicy: Honor`), `labelSelector` plus `matchLabelKeys`, `minDomains` (fewer
//!   domains than that: the global minimum is 0). A nil selector matches no pod.
//! - **InterPodAffinity** (required terms): existing pods' anti-affinity against the new pod,
//!   the pod's own anti-affinity, and its affinity (a pod whose terms match no pod anywhere may
//!   go where it matches its own terms: the first of a group), with `namespaces` and
//!   `namespaceSelector`.
//! - **NodeVolumeLimits**: the distinct CSI volumes a node's pods use, per driver, stay within
//!   the driver's `allocatable.count` on the node's CSINode.
//! - **VolumeBinding**: a claim that is missing or being deleted, or unbound with `Immediate`
//!   binding, keeps the pod off every node; a bound claim's volume `nodeAffinity` and an unbound
//!   `WaitForFirstConsumer` claim's class `allowedTopologies` must hold for the node. When the
//!   pod is bound, each `WaitForFirstConsumer` claim gets its volume in the node's zone, as a
//!   CSI provisioner makes it.
//!
//! Messages are kube-scheduler's.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use crate::kube::resources;
use crate::kube::select::{label_selector_matches, Selector};
use crate::kube::store::{name_of, Store};

use super::scheduler::{node_selector_terms_match, selector_and_affinity_match, tolerates};

/// `node(s) didn't match pod topology spread constraints`.
pub(crate) const SPREAD: &str = "node(s) didn't match pod topology spread constraints";
/// A node without a constraint's topology key.
pub(crate) const SPREAD_MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";
/// The pod's required affinity.
pub(crate) const AFFINITY: &str = "node(s) didn't match pod affinity rules";
/// The pod's required anti-affinity.
pub(crate) const ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
/// Another pod's required anti-affinity against this one.
pub(crate) const EXISTING_ANTI_AFFINITY: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";
/// A bound volume's node affinity.
pub(crate) const VOLUME_AFFINITY: &str = "node(s) had volume node affinity conflict";
/// An unbound `WaitForFirstConsumer` claim whose class cannot provision for the node.
pub(crate) const NO_VOLUME: &str = "node(s) didn't find available persistent volumes to bind";
/// A node whose CSI attach limit the pod's new volumes would pass.
pub(crate) const VOLUME_COUNT: &str = "node(s) exceed max volume count";

/// The CSI driver of Azure Disk and its topology key.
const DISK_DRIVER: &str = "disk.csi.azure.com";
const DISK_ZONE: &str = "topology.disk.csi.azure.com/zone";
const ZONE: &str = "topology.kubernetes.io/zone";

/// A node as these filters see it.
pub(crate) struct NodeView<'a> {
    pub name: &'a str,
    pub labels: Option<&'a Map<String, Value>>,
    /// `NoSchedule` / `NoExecute` taints.
    pub taints: Vec<&'a Value>,
}

/// A bound pod that counts.
struct Placed {
    namespace: String,
    labels: Option<Map<String, Value>>,
    node: usize,
    /// Its required anti-affinity terms.
    anti: Vec<Value>,
}

/// What one scheduling pass knows beyond the nodes' room: bound pods (updated as the pass binds),
/// namespaces' labels, claims, volumes and classes.
#[derive(Default)]
pub(crate) struct PassState {
    placed: Vec<Placed>,
    namespaces: HashMap<String, Map<String, Value>>,
    claims: HashMap<(String, String), Value>,
    volumes: HashMap<String, Value>,
    classes: HashMap<String, Value>,
    /// Attach limits by node name, then CSI driver (CSINodes' `allocatable.count`).
    limits: HashMap<String, HashMap<String, i64>>,
    /// The CSI volumes in use on each node (by index): (driver, volume).
    attached: HashMap<usize, HashSet<(String, String)>>,
}

fn list(store: &Store, group: &str, plural: &str) -> Vec<Value> {
    resources::find(group, "v1", plural)
        .map(|rt| store.list(rt, None, &Selector::default(), None, None).items)
        .unwrap_or_default()
}

fn namespace_of(obj: &Value) -> String {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn labels_of(obj: &Value) -> Option<Map<String, Value>> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
}

fn terms(pod: &Value, path: &str) -> Vec<Value> {
    pod.pointer(path)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

const AFFINITY_TERMS: &str =
    "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution";
const ANTI_AFFINITY_TERMS: &str =
    "/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution";

/// The claim names of a pod's volumes.
fn claim_names(pod: &Value) -> Vec<String> {
    terms(pod, "/spec/volumes")
        .iter()
        .filter_map(|v| v.pointer("/persistentVolumeClaim/claimName"))
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

impl PassState {
    /// Reads the store once; `bound` gives each bound, running pod's node index.
    pub(crate) fn read(store: &Store, bound: &[(Value, usize)]) -> PassState {
        let mut s = PassState::default();
        for ns in list(store, "", "namespaces") {
            if let Some(name) = name_of(&ns) {
                s.namespaces
                    .insert(name.to_string(), labels_of(&ns).unwrap_or_default());
            }
        }
        for c in list(store, "", "persistentvolumeclaims") {
            let key = (namespace_of(&c), name_of(&c).unwrap_or("").to_string());
            s.claims.insert(key, c);
        }
        for v in list(store, "", "persistentvolumes") {
            s.volumes.insert(name_of(&v).unwrap_or("").to_string(), v);
        }
        for c in list(store, "storage.k8s.io", "storageclasses") {
            s.classes.insert(name_of(&c).unwrap_or("").to_string(), c);
        }
        for n in list(store, "storage.k8s.io", "csinodes") {
            let drivers = terms(&n, "/spec/drivers")
                .iter()
                .filter_map(|d| {
                    let count = d.pointer("/allocatable/count").and_then(Value::as_i64)?;
                    Some((d.get("name")?.as_str()?.to_string(), count))
                })
                .collect();
            s.limits
                .insert(name_of(&n).unwrap_or("").to_string(), drivers);
        }
        // With the claims known, the bound pods count (and what they attach).
        for (pod, node) in bound {
            s.place(pod, *node);
        }
        s
    }

    /// The CSI volumes `pod`'s claims use: (driver, volume), a bound claim by its volume, an
    /// unbound one by the claim (its volume is yet to be made by its class's provisioner).
    fn csi_volumes(&self, pod: &Value) -> HashSet<(String, String)> {
        let ns = namespace_of(pod);
        claim_names(pod)
            .into_iter()
            .filter_map(|name| {
                let claim = self.claims.get(&(ns.clone(), name.clone()))?;
                match bound_volume(claim) {
                    Some(pv) => {
                        let driver = self
                            .volumes
                            .get(pv)?
                            .pointer("/spec/csi/driver")?
                            .as_str()?;
                        Some((driver.to_string(), pv.to_string()))
                    }
                    None => {
                        let driver = self.class_of(claim)?.get("provisioner")?.as_str()?;
                        Some((driver.to_string(), format!("claim:{ns}/{name}")))
                    }
                }
            })
            .collect()
    }

    fn attach(&mut self, pod: &Value, node: usize) {
        let volumes = self.csi_volumes(pod);
        if !volumes.is_empty() {
            self.attached.entry(node).or_default().extend(volumes);
        }
    }

    /// Counts `pod` as bound to node `node` from now on in this pass.
    pub(crate) fn place(&mut self, pod: &Value, node: usize) {
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        self.placed.push(Placed {
            namespace: namespace_of(pod),
            labels: labels_of(pod),
            node,
            anti: terms(pod, ANTI_AFFINITY_TERMS),
        });
        self.attach(pod, node);
    }

    /// Why the pod can go nowhere whatever the node (its claims), as the scheduler's PreFilter
    /// says it; `None`: the filters decide per node.
    pub(crate) fn prefilter(&self, pod: &Value) -> Option<String> {
        let ns = namespace_of(pod);
        let mut immediate = false;
        for name in claim_names(pod) {
            let Some(claim) = self.claims.get(&(ns.clone(), name.clone())) else {
                return Some(format!("persistentvolumeclaim \"{name}\" not found"));
            };
            if claim.pointer("/metadata/deletionTimestamp").is_some() {
                return Some(format!("persistentvolumeclaim \"{name}\" is being deleted"));
            }
            if bound_volume(claim).is_none() && !self.waits_for_consumer(claim) {
                immediate = true;
            }
        }
        immediate.then(|| "pod has unbound immediate PersistentVolumeClaims".to_string())
    }

    fn class_of(&self, claim: &Value) -> Option<&Value> {
        let name = claim
            .pointer("/spec/storageClassName")
            .and_then(Value::as_str)?;
        self.classes.get(name)
    }

    fn waits_for_consumer(&self, claim: &Value) -> bool {
        self.class_of(claim)
            .and_then(|c| c.get("volumeBindingMode"))
            .and_then(Value::as_str)
            == Some("WaitForFirstConsumer")
    }

    /// The first filter of these the pod fails on node `i` of `nodes` (`None`: it passes).
    pub(crate) fn misfit(
        &self,
        pod: &Value,
        nodes: &[NodeView<'_>],
        i: usize,
    ) -> Option<&'static str> {
        self.volume_count_misfit(pod, &nodes[i], i)
            .or_else(|| self.volumes_misfit(pod, &nodes[i]))
            .or_else(|| self.spread_misfit(pod, nodes, i))
            .or_else(|| self.affinity_misfit(pod, nodes, i))
    }

    fn volume_count_misfit(
        &self,
        pod: &Value,
        node: &NodeView<'_>,
        i: usize,
    ) -> Option<&'static str> {
        let limits = self.limits.get(node.name)?;
        let wanted = self.csi_volumes(pod);
        let none = HashSet::new();
        let attached = self.attached.get(&i).unwrap_or(&none);
        for (driver, limit) in limits {
            let new = wanted
                .iter()
                .filter(|v| &v.0 == driver && !attached.contains(*v))
                .count() as i64;
            if new == 0 {
                continue;
            }
            let used = attached.iter().filter(|v| &v.0 == driver).count() as i64;
            if used + new > *limit {
                return Some(VOLUME_COUNT);
            }
        }
        None
    }

    fn volumes_misfit(&self, pod: &Value, node: &NodeView<'_>) -> Option<&'static str> {
        let ns = namespace_of(pod);
        for name in claim_names(pod) {
            // A missing claim is the PreFilter's answer.
            let Some(claim) = self.claims.get(&(ns.clone(), name)) else {
                continue;
            };
            match bound_volume(claim) {
                Some(pv) => {
                    let terms = self
                        .volumes
                        .get(pv)
                        .and_then(|v| v.pointer("/spec/nodeAffinity/required/nodeSelectorTerms"))
                        .and_then(Value::as_array);
                    if terms.is_some_and(|t| !node_selector_terms_match(t, node.labels)) {
                        return Some(VOLUME_AFFINITY);
                    }
                }
                None => {
                    // Nothing provisions for a `no-provisioner` class: only a static volume
                    // would do, and none is matched here.
                    let provisioner = self
                        .class_of(claim)
                        .and_then(|c| c.get("provisioner"))
                        .and_then(Value::as_str);
                    if provisioner == Some("kubernetes.io/no-provisioner") {
                        return Some(NO_VOLUME);
                    }
                    let allowed = self
                        .class_of(claim)
                        .and_then(|c| c.get("allowedTopologies"))
                        .and_then(Value::as_array);
                    if allowed.is_some_and(|a| !a.is_empty() && !topologies_allow(a, node.labels)) {
                        return Some(NO_VOLUME);
                    }
                }
            }
        }
        None
    }

    fn spread_misfit(&self, pod: &Value, nodes: &[NodeView<'_>], i: usize) -> Option<&'static str> {
        let constraints: Vec<Value> = terms(pod, "/spec/topologySpreadConstraints")
            .into_iter()
            .filter(|c| c.get("whenUnsatisfiable").and_then(Value::as_str) == Some("DoNotSchedule"))
            .collect();
        if constraints.is_empty() {
            return None;
        }
        let keys: Vec<&str> = constraints
            .iter()
            .map(|c| c.get("topologyKey").and_then(Value::as_str).unwrap_or(""))
            .collect();
        let value = |n: &NodeView<'_>, key: &str| -> Option<String> {
            n.labels
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if keys.iter().any(|k| value(&nodes[i], k).is_none()) {
            return Some(SPREAD_MISSING_LABEL);
        }
        let ns = namespace_of(pod);
        let own = labels_of(pod);
        let spec = pod.get("spec").cloned().unwrap_or(json!({}));
        let tolerations = super::scheduler::tolerations_of(&spec);
        for c in &constraints {
            let key = c.get("topologyKey").and_then(Value::as_str).unwrap_or("");
            let eligible = |n: &NodeView<'_>| {
                let honor_affinity =
                    c.get("nodeAffinityPolicy").and_then(Value::as_str) != Some("Ignore");
                let honor_taints =
                    c.get("nodeTaintsPolicy").and_then(Value::as_str) == Some("Honor");
                keys.iter().all(|k| value(n, k).is_some())
                    && (!honor_affinity || selector_and_affinity_match(&spec, n.labels))
                    && (!honor_taints || n.taints.iter().all(|t| tolerates(&tolerations, t)))
            };
            let selector = spread_selector(c, own.as_ref());
            let matches = |labels: Option<&Map<String, Value>>| {
                selector
                    .as_ref()
                    .is_some_and(|s| label_selector_matches(s, labels))
            };
            let mut counts: HashMap<String, i64> = HashMap::new();
            for n in nodes.iter().filter(|n| eligible(n)) {
                counts.entry(value(n, key).unwrap_or_default()).or_insert(0);
            }
            for p in &self.placed {
                if p.namespace != ns || !matches(p.labels.as_ref()) || !eligible(&nodes[p.node]) {
                    continue;
                }
                if let Some(v) = value(&nodes[p.node], key) {
                    *counts.entry(v).or_insert(0) += 1;
                }
            }
            let min_domains = c.get("minDomains").and_then(Value::as_u64).unwrap_or(1);
            let global_min = if (counts.len() as u64) < min_domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            let here = value(&nodes[i], key)
                .and_then(|v| counts.get(&v).copied())
                .unwrap_or(0);
            let self_match = i64::from(matches(own.as_ref()));
            let max_skew = c.get("maxSkew").and_then(Value::as_i64).unwrap_or(1);
            if here + self_match - global_min > max_skew {
                return Some(SPREAD);
            }
        }
        None
    }

    /// The namespaces a term of a pod in `namespace` selects: its `namespaces`, plus those
    /// `namespaceSelector` selects (an empty selector: all); neither: the pod's own.
    fn term_selects(&self, term: &Value, namespace: &str, target_ns: &str) -> bool {
        let listed: Vec<&str> = term
            .get("namespaces")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let selector = term.get("namespaceSelector").filter(|s| !s.is_null());
        if listed.is_empty() && selector.is_none() {
            return target_ns == namespace;
        }
        listed.contains(&target_ns)
            || selector.is_some_and(|s| label_selector_matches(s, self.namespaces.get(target_ns)))
    }

    /// Whether `term` (of a pod in `namespace`) matches a pod in `target_ns` with `labels`.
    fn term_matches(
        &self,
        term: &Value,
        namespace: &str,
        target_ns: &str,
        labels: Option<&Map<String, Value>>,
    ) -> bool {
        let selector = term.get("labelSelector").filter(|s| !s.is_null());
        selector.is_some_and(|s| label_selector_matches(s, labels))
            && self.term_selects(term, namespace, target_ns)
    }

    fn affinity_misfit(
        &self,
        pod: &Value,
        nodes: &[NodeView<'_>],
        i: usize,
    ) -> Option<&'static str> {
        let ns = namespace_of(pod);
        let own = labels_of(pod);
        let value = |n: usize, key: &str| -> Option<&str> {
            nodes[n]
                .labels
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
        };
        // kube-scheduler's order: the pod's affinity, its anti-affinity, then the existing pods'
        // anti-affinity against it. Its affinity: every term needs a pod matching every term in
        // the node's domain.
        let affinity = terms(pod, AFFINITY_TERMS);
        let affinity_holds = affinity.is_empty()
            || 'holds: {
                let key_of = |t: &Value| {
                    t.get("topologyKey")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                if affinity.iter().any(|t| value(i, &key_of(t)).is_none()) {
                    break 'holds false;
                }
                let matching: Vec<&Placed> = self
                    .placed
                    .iter()
                    .filter(|p| {
                        affinity
                            .iter()
                            .all(|t| self.term_matches(t, &ns, &p.namespace, p.labels.as_ref()))
                    })
                    .collect();
                let mut domains: HashSet<(String, String)> = HashSet::new();
                for p in &matching {
                    for t in &affinity {
                        let key = key_of(t);
                        if let Some(v) = value(p.node, &key) {
                            domains.insert((key, v.to_string()));
                        }
                    }
                }
                let satisfied = affinity.iter().all(|t| {
                    let key = key_of(t);
                    let here = value(i, &key).unwrap_or("").to_string();
                    domains.contains(&(key, here))
                });
                if satisfied {
                    break 'holds true;
                }
                // The first pod of a group whose terms select itself may go anywhere they allow.
                domains.is_empty()
                    && affinity
                        .iter()
                        .all(|t| self.term_matches(t, &ns, &ns, own.as_ref()))
            };
        if !affinity_holds {
            return Some(AFFINITY);
        }
        // Its own anti-affinity.
        for term in terms(pod, ANTI_AFFINITY_TERMS) {
            let key = term
                .get("topologyKey")
                .and_then(Value::as_str)
                .unwrap_or("");
            let Some(here) = value(i, key) else { continue };
            if self.placed.iter().any(|p| {
                value(p.node, key) == Some(here)
                    && self.term_matches(&term, &ns, &p.namespace, p.labels.as_ref())
            }) {
                return Some(ANTI_AFFINITY);
            }
        }
        // Existing pods' anti-affinity against this pod.
        for p in &self.placed {
            for term in &p.anti {
                let key = term
                    .get("topologyKey")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if self.term_matches(term, &p.namespace, &ns, own.as_ref())
                    && value(p.node, key).is_some()
                    && value(p.node, key) == value(i, key)
                {
                    return Some(EXISTING_ANTI_AFFINITY);
                }
            }
        }
        None
    }

    /// After `pod` is bound to `node`: every unbound `WaitForFirstConsumer` claim of it gets a
    /// volume in the node's zone (the class's provisioner's topology key) and is bound to it.
    pub(crate) fn provision_for(
        &mut self,
        store: &mut Store,
        pod: &Value,
        node: &str,
        labels: Option<&Map<String, Value>>,
    ) {
        let ns = namespace_of(pod);
        for name in claim_names(pod) {
            let Some(claim) = self.claims.get(&(ns.clone(), name.clone())).cloned() else {
                continue;
            };
            if bound_volume(&claim).is_some() || !self.waits_for_consumer(&claim) {
                continue;
            }
            let provisioner = self
                .class_of(&claim)
                .and_then(|c| c.get("provisioner"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if provisioner == "kubernetes.io/no-provisioner" {
                continue;
            }
            let key = if provisioner == DISK_DRIVER {
                DISK_ZONE
            } else {
                ZONE
            };
            let zone = labels
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if let Some((pv, bound)) = provision(store, &claim, &provisioner, key, &zone, node) {
                self.volumes
                    .insert(name_of(&pv).unwrap_or("").to_string(), pv);
                self.claims.insert((ns.clone(), name), bound);
            }
        }
    }
}

/// The volume a claim is bound to, if it is.
fn bound_volume(claim: &Value) -> Option<&str> {
    claim
        .pointer("/spec/volumeName")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
}

/// A spread constraint's selector with its `matchLabelKeys` added as `In` requirements on the
/// pod's own values (keys the pod lacks are ignored); `None`: a nil selector, matching nothing.
fn spread_selector(c: &Value, own: Option<&Map<String, Value>>) -> Option<Value> {
    let mut selector = c.get("labelSelector").filter(|s| !s.is_null())?.clone();
    let keys: Vec<&str> = c
        .get("matchLabelKeys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for k in keys {
        if let Some(v) = own.and_then(|l| l.get(k)).and_then(Value::as_str) {
            let exprs = selector
                .as_object_mut()?
                .entry("matchExpressions")
                .or_insert_with(|| json!([]));
            if let Some(a) = exprs.as_array_mut() {
                a.push(json!({"key": k, "operator": "In", "values": [v]}));
            }
        }
    }
    Some(selector)
}

/// Whether a class's `allowedTopologies` (any term; a term's `matchLabelExpressions` all hold:
/// the node's label is one of the values) admit a node.
fn topologies_allow(allowed: &[Value], labels: Option<&Map<String, Value>>) -> bool {
    allowed.iter().any(|term| {
        // A term without expressions matches no node.
        term.get("matchLabelExpressions")
            .and_then(Value::as_array)
            .is_some_and(|exprs| {
                !exprs.is_empty()
                    && exprs.iter().all(|e| {
                        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                        let have = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
                        e.get("values").and_then(Value::as_array).is_some_and(|vs| {
                            vs.iter().any(|v| v.as_str() == have && have.is_some())
                        })
                    })
            })
    })
}

/// Creates the volume `pvc-<claim uid>` for `claim` with node affinity `key` = `zone` (none
/// when the node has no zone) and binds the claim to it; the volume and the bound claim.
fn provision(
    store: &mut Store,
    claim: &Value,
    provisioner: &str,
    key: &str,
    zone: &str,
    node: &str,
) -> Option<(Value, Value)> {
    let pv_rt = resources::find("", "v1", "persistentvolumes")?;
    let pvc_rt = resources::find("", "v1", "persistentvolumeclaims")?;
    let ns = namespace_of(claim);
    let claim_name = name_of(claim)?.to_string();
    let uid = claim
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or(&claim_name)
        .to_string();
    let pv_name = format!("pvc-{uid}");
    let size = claim
        .pointer("/spec/resources/requests/storage")
        .cloned()
        .unwrap_or(json!("1Gi"));
    let mut spec = json!({
        "capacity": {"storage": size},
        "accessModes": claim.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": claim.pointer("/spec/storageClassName").cloned().unwrap_or(Value::Null),
        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": claim_name,
            "uid": uid, "apiVersion": "v1"},
        "csi": {"driver": provisioner, "volumeHandle": format!("/subscriptions/emulated/disks/{pv_name}")},
    });
    if !zone.is_empty() {
        spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "In", "values": [zone]}]}
        ]}});
    }
    let pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": provisioner}},
        "spec": spec,
    });
    let pv = store.create(pv_rt, "", pv).ok()?;
    let mut with_status = pv.clone();
    with_status["status"] = json!({"phase": "Bound"});
    if let Some(m) = with_status["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let pv = store
        .update(pv_rt, "", &pv_name, with_status, Some("status"))
        .unwrap_or(pv);
    let mut write = claim.clone();
    write["spec"]["volumeName"] = json!(pv_name);
    if let Some(m) = write["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        let annotations = m.entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.insert("volume.kubernetes.io/selected-node".into(), json!(node));
            a.insert("pv.kubernetes.io/bind-completed".into(), json!("yes"));
        }
    }
    let updated = store.update(pvc_rt, &ns, &claim_name, write, None).ok()?;
    let mut status = updated.clone();
    status["status"] = json!({"phase": "Bound", "accessModes": updated.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])), "capacity": {"storage": size}});
    if let Some(m) = status["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    let bound = store
        .update(pvc_rt, &ns, &claim_name, status, Some("status"))
        .unwrap_or(updated);
    Some((pv, bound))
}

/// Binds every unbound claim whose class binds `Immediate`ly and has a provisioner: a volume
/// with the class's first allowed zone (none: no node affinity), as a CSI driver creates it.
pub(crate) fn bind_immediate_claims(store: &mut Store) {
    let classes: HashMap<String, Value> = list(store, "storage.k8s.io", "storageclasses")
        .into_iter()
        .map(|c| (name_of(&c).unwrap_or("").to_string(), c))
        .collect();
    for claim in list(store, "", "persistentvolumeclaims") {
        if bound_volume(&claim).is_some() || claim.pointer("/metadata/deletionTimestamp").is_some()
        {
            continue;
        }
        let Some(class) = claim
            .pointer("/spec/storageClassName")
            .and_then(Value::as_str)
            .and_then(|c| classes.get(c))
        else {
            continue;
        };
        let mode = class
            .get("volumeBindingMode")
            .and_then(Value::as_str)
            .unwrap_or("Immediate");
        let provisioner = class
            .get("provisioner")
            .and_then(Value::as_str)
            .unwrap_or("");
        if mode != "Immediate"
            || provisioner.is_empty()
            || provisioner == "kubernetes.io/no-provisioner"
        {
            continue;
        }
        let first = class
            .pointer("/allowedTopologies/0/matchLabelExpressions/0")
            .cloned();
        let (key, zone) = match &first {
            Some(e) => (
                e.get("key")
                    .and_then(Value::as_str)
                    .unwrap_or(ZONE)
                    .to_string(),
                e.pointer("/values/0")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            ),
            None => (ZONE.to_string(), String::new()),
        };
        let _ = provision(store, &claim, provisioner, &key, &zone, "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: Value) -> Map<String, Value> {
        labels.as_object().cloned().unwrap()
    }

    fn views(nodes: &[Map<String, Value>]) -> Vec<NodeView<'_>> {
        nodes
            .iter()
            .map(|l| NodeView {
                name: l["kubernetes.io/hostname"].as_str().unwrap_or(""),
                labels: Some(l),
                taints: Vec::new(),
            })
            .collect()
    }

    fn pod(labels: Value, spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "default", "labels": labels}, "spec": spec})
    }

    fn zoned(zones: &[&str]) -> Vec<Map<String, Value>> {
        zones
            .iter()
            .enumerate()
            .map(|(i, z)| node(json!({"kubernetes.io/hostname": format!("n{i}"), ZONE: z})))
            .collect()
    }

    fn spread(max_skew: i64, extra: Value) -> Value {
        let mut c = json!({"maxSkew": max_skew, "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}});
        if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        json!({"topologySpreadConstraints": [c]})
    }

    /// The documentation's first example: zones A and B, two `foo` pods in A... here: 2 in z1,
    /// 0 in z2; a new pod with maxSkew 1 may only go to z2.
    #[test]
    fn a_spread_pod_goes_only_where_the_skew_stays_within_max_skew() {
        let nodes = zoned(&["z1", "z1", "z2"]);
        let v = views(&nodes);
        let web = pod(json!({"app": "web"}), spread(1, json!({})));
        let mut s = PassState::default();
        s.place(&web, 0);
        s.place(&web, 1);
        assert_eq!(s.misfit(&web, &v, 0), Some(SPREAD));
        assert_eq!(s.misfit(&web, &v, 1), Some(SPREAD));
        assert_eq!(s.misfit(&web, &v, 2), None);
        // A pod its own selector does not match is still held to the skew it would find:
        // 2 + 0 - 0 > 1 in z1.
        let other = pod(json!({"app": "db"}), spread(1, json!({})));
        assert_eq!(s.misfit(&other, &v, 0), Some(SPREAD));
        assert_eq!(s.misfit(&other, &v, 2), None);
    }

    #[test]
    fn a_node_without_the_key_fails_with_the_missing_label_message() {
        let mut nodes = zoned(&["z1"]);
        nodes.push(node(json!({"kubernetes.io/hostname": "bare"})));
        let v = views(&nodes);
        let web = pod(json!({"app": "web"}), spread(1, json!({})));
        let s = PassState::default();
        assert_eq!(s.misfit(&web, &v, 1), Some(SPREAD_MISSING_LABEL));
        assert_eq!(s.misfit(&web, &v, 0), None);
    }

    #[test]
    fn min_domains_above_the_domains_there_are_makes_the_global_minimum_zero() {
        // Two zones with one pod each: without minDomains a third pod may go to either; with
        // minDomains 3 the minimum is 0, so 1 + 1 - 0 > 1 everywhere.
        let nodes = zoned(&["z1", "z2"]);
        let v = views(&nodes);
        let plain = pod(json!({"app": "web"}), spread(1, json!({})));
        let three = pod(json!({"app": "web"}), spread(1, json!({"minDomains": 3})));
        let mut s = PassState::default();
        s.place(&plain, 0);
        s.place(&plain, 1);
        assert_eq!(s.misfit(&plain, &v, 0), None);
        assert_eq!(s.misfit(&three, &v, 0), Some(SPREAD));
        assert_eq!(s.misfit(&three, &v, 1), Some(SPREAD));
    }

    #[test]
    fn nodes_the_pods_node_affinity_excludes_are_no_domain_unless_the_policy_ignores_them() {
        // z3's node is excluded by the pod's nodeSelector: with Honor (the default) its empty
        // domain does not hold the minimum at 0.
        let mut nodes = zoned(&["z1", "z2"]);
        for n in &mut nodes {
            n.insert("pool".into(), json!("zonal"));
        }
        nodes.push(node(
            json!({"kubernetes.io/hostname": "n2", ZONE: "z3", "pool": "other"}),
        ));
        let v = views(&nodes);
        let mut honor = spread(1, json!({}));
        honor["nodeSelector"] = json!({"pool": "zonal"});
        let mut ignore = spread(1, json!({"nodeAffinityPolicy": "Ignore"}));
        ignore["nodeSelector"] = json!({"pool": "zonal"});
        let honor = pod(json!({"app": "web"}), honor);
        let ignore = pod(json!({"app": "web"}), ignore);
        let mut s = PassState::default();
        s.place(&honor, 0);
        s.place(&honor, 1);
        assert_eq!(s.misfit(&honor, &v, 0), None, "min is 1 over z1, z2");
        assert_eq!(s.misfit(&ignore, &v, 0), Some(SPREAD), "z3 counts: min 0");
    }

    #[test]
    fn match_label_keys_count_only_pods_of_the_same_revision() {
        let nodes = zoned(&["z1", "z2"]);
        let v = views(&nodes);
        let c = spread(1, json!({"matchLabelKeys": ["pod-template-hash"]}));
        let old = pod(json!({"app": "web", "pod-template-hash": "a"}), c.clone());
        let new = pod(json!({"app": "web", "pod-template-hash": "b"}), c);
        let mut s = PassState::default();
        s.place(&old, 0);
        s.place(&old, 0);
        assert_eq!(s.misfit(&old, &v, 0), Some(SPREAD));
        assert_eq!(
            s.misfit(&new, &v, 0),
            None,
            "the old revision is not counted"
        );
    }

    fn anti(key: &str) -> Value {
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": key}
        ]}}})
    }

    fn affine(key: &str, app: &str) -> Value {
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
        ]}}})
    }

    #[test]
    fn anti_affinity_keeps_one_per_domain_both_ways() {
        let nodes = zoned(&["z1", "z1", "z2"]);
        let v = views(&nodes);
        let db = pod(json!({"app": "db"}), anti("kubernetes.io/hostname"));
        let mut s = PassState::default();
        s.place(&db, 0);
        // Its own term is asked first, as kube-scheduler asks.
        assert_eq!(s.misfit(&db, &v, 0), Some(ANTI_AFFINITY));
        assert_eq!(s.misfit(&db, &v, 1), None);
        // A plain db pod is kept away by the existing pod's term.
        let plain = pod(json!({"app": "db"}), json!({}));
        assert_eq!(s.misfit(&plain, &v, 0), Some(EXISTING_ANTI_AFFINITY));
        // Its own term against a plain pod already there.
        let mut s = PassState::default();
        s.place(&plain, 2);
        let zonal = pod(json!({"app": "db"}), anti(ZONE));
        assert_eq!(s.misfit(&zonal, &v, 2), Some(ANTI_AFFINITY));
        assert_eq!(s.misfit(&zonal, &v, 0), None);
    }

    #[test]
    fn affinity_follows_the_pods_it_names_and_the_first_of_a_self_affine_group_goes_anywhere() {
        let nodes = zoned(&["z1", "z2"]);
        let v = views(&nodes);
        let cache = pod(json!({"app": "cache"}), affine(ZONE, "cache"));
        let s = PassState::default();
        assert_eq!(s.misfit(&cache, &v, 0), None, "first of its group");
        assert_eq!(s.misfit(&cache, &v, 1), None, "first of its group");
        let mut s = PassState::default();
        s.place(&cache, 1);
        assert_eq!(s.misfit(&cache, &v, 0), Some(AFFINITY));
        assert_eq!(s.misfit(&cache, &v, 1), None);
        // A pod affine to another app with none running anywhere waits.
        let web = pod(json!({"app": "web"}), affine(ZONE, "cache-not-there"));
        assert_eq!(s.misfit(&web, &v, 0), Some(AFFINITY));
    }

    #[test]
    fn a_namespace_selector_term_matches_pods_by_their_namespaces_labels() {
        let nodes = zoned(&["z1", "z2"]);
        let v = views(&nodes);
        let mut s = PassState::default();
        s.namespaces
            .insert("team-a".into(), node(json!({"team": "a"})));
        s.namespaces.insert("default".into(), Map::new());
        let mut other = pod(json!({"app": "cache"}), json!({}));
        other["metadata"]["namespace"] = json!("team-a");
        s.place(&other, 1);
        let mut spec = affine(ZONE, "cache");
        spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
            ["namespaceSelector"] = json!({"matchLabels": {"team": "a"}});
        let web = pod(json!({"app": "web"}), spec);
        assert_eq!(s.misfit(&web, &v, 1), None);
        assert_eq!(s.misfit(&web, &v, 0), Some(AFFINITY));
        // Without the selector the term looks in the pod's own namespace only.
        let local = pod(json!({"app": "web"}), affine(ZONE, "cache"));
        assert_eq!(s.misfit(&local, &v, 1), Some(AFFINITY));
    }

    #[test]
    fn a_bound_zonal_volume_pins_its_pod_and_an_unbound_claim_follows_its_class() {
        let nodes = zoned(&["westeurope-1", "westeurope-2"]);
        let mut nodes = nodes;
        for n in &mut nodes {
            let z = n[ZONE].clone();
            n.insert(DISK_ZONE.into(), z);
        }
        let v = views(&nodes);
        let mut s = PassState::default();
        s.claims.insert(
            ("default".into(), "data".into()),
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "pv-1", "storageClassName": "managed-csi"}}),
        );
        s.volumes.insert(
            "pv-1".into(),
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": DISK_ZONE, "operator": "In", "values": ["westeurope-2"]}]}
            ]}}}}),
        );
        let db = pod(
            json!({"app": "db"}),
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}),
        );
        assert_eq!(s.prefilter(&db), None);
        assert_eq!(s.misfit(&db, &v, 0), Some(VOLUME_AFFINITY));
        assert_eq!(s.misfit(&db, &v, 1), None);

        // Unbound: WaitForFirstConsumer with allowed zones, Immediate, missing.
        s.classes.insert(
            "zone1-only".into(),
            json!({"provisioner": DISK_DRIVER, "volumeBindingMode": "WaitForFirstConsumer",
                "allowedTopologies": [{"matchLabelExpressions": [{"key": DISK_ZONE, "values": ["westeurope-1"]}]}]}),
        );
        s.classes.insert(
            "now".into(),
            json!({"provisioner": DISK_DRIVER, "volumeBindingMode": "Immediate"}),
        );
        s.claims.insert(
            ("default".into(), "data".into()),
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"storageClassName": "zone1-only"}}),
        );
        assert_eq!(s.prefilter(&db), None);
        assert_eq!(s.misfit(&db, &v, 0), None);
        assert_eq!(s.misfit(&db, &v, 1), Some(NO_VOLUME));
        s.claims.insert(
            ("default".into(), "data".into()),
            json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"storageClassName": "now"}}),
        );
        assert_eq!(
            s.prefilter(&db).as_deref(),
            Some("pod has unbound immediate PersistentVolumeClaims")
        );
        s.claims.clear();
        assert_eq!(
            s.prefilter(&db).as_deref(),
            Some("persistentvolumeclaim \"data\" not found")
        );
    }
}
