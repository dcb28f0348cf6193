//! A placement audit: every bind the cluster sees, checked as it happens against the pod's
//! zone-spread constraints and its volumes' zones. It replays the Kubernetes store's change
//! stream in order (so a bind is judged against the cluster as it was at that moment, not as a
//! later sample finds it), with code of its own: neither the simulation's scheduler nor the
//! planner is asked, so a shared misreading cannot pass itself.
//!
//! What it checks, for each pod the first time it gets a node:
//! - each `DoNotSchedule` constraint on `topology.kubernetes.io/zone`: the skew it makes (its
//!   zone's matching pods, itself included, less the fewest in any zone that has a node its
//!   `nodeSelector` and required node affinity admit; 0 when there are fewer such zones than
//!   `minDomains`) stays within `maxSkew`, with the selector's `matchLabels`,
//!   `matchExpressions` and the constraint's `matchLabelKeys`; the largest skew per `app` label
//!   is kept;
//! - each claim bound to a volume with a zonal `nodeAffinity`: the node is in that zone;
//! - required inter-pod anti-affinity, on any `topologyKey`, both ways: no live pod its terms
//!   select shares the node's domain, and no live pod whose own terms select it does;
//! - required inter-pod affinity: a pod its term selects shares the node's domain, unless no
//!   pod anywhere matches and the pod matches its own term (the first of a group).
//!
//! A term's namespaces are the pod's own, its `namespaces` list, or every namespace for an
//! empty `namespaceSelector`; a term with a non-empty `namespaceSelector` (which needs the
//! Namespaces' labels) is counted as not judged.
//!
//! It starts from what the store holds (read under the same lock as the subscription, so no
//! change falls between), and a receiver that lags behind the stream marks the audit
//! incomplete, never passing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::kube::store::{Change, EventType};
use super::kube::KubeState;

const ZONE: &str = "topology.kubernetes.io/zone";

/// What the audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Binds seen.
    pub binds: usize,
    /// Of those, binds of pods with a zone-spread constraint.
    pub spread_binds: usize,
    /// The largest skew a bind made, by the pod's `app` label.
    pub max_skew: BTreeMap<String, i64>,
    /// Binds of pods onto a zonal disk an earlier bind already used (a pod back on its disk:
    /// the case where the disk's zone, not the node, decides; a first bind makes its disk where
    /// it lands).
    pub volume_binds: usize,
    /// Binds of pods with required inter-pod affinity or anti-affinity terms, or onto a
    /// domain a running pod's anti-affinity term covers (judged both ways).
    pub affinity_binds: usize,
    /// Terms not judged (a non-empty `namespaceSelector`).
    pub terms_not_judged: usize,
    /// Binds that broke a constraint or a volume's zone, in words.
    pub violations: Vec<String>,
    /// The stream was lost for a while: the audit is incomplete.
    pub lagged: bool,
}

type Labels = serde_json::Map<String, Value>;

/// A node as the audit knows it.
struct NodeSeen {
    zone: Option<String>,
    labels: Labels,
}

/// A live pod as the audit knows it.
struct PodSeen {
    namespace: String,
    labels: Labels,
    node: Option<String>,
    /// Its required anti-affinity terms (what it asks of pods that come after it).
    anti: Vec<Value>,
}

const ANTI_TERMS: &str =
    "/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution";
const AFFINITY_TERMS: &str =
    "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution";

fn terms(pod: &Value, at: &str) -> Vec<Value> {
    pod.pointer(at)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Whether `term` (of a pod in `own_ns`) covers a pod in `ns` with `labels`; `None` when the term
/// cannot be judged here (a non-empty `namespaceSelector`).
fn term_selects(term: &Value, own_ns: &str, ns: &str, labels: &Labels) -> Option<bool> {
    let selector = term.get("namespaceSelector").filter(|v| !v.is_null());
    let in_ns = match (selector, term.get("namespaces")) {
        (Some(sel), _) if sel.as_object().is_some_and(|o| !o.is_empty()) => return None,
        (Some(_), _) => true,
        (None, Some(list)) if list.as_array().is_some_and(|l| !l.is_empty()) => list
            .as_array()
            .is_some_and(|l| l.iter().any(|n| n.as_str() == Some(ns))),
        _ => own_ns == ns,
    };
    Some(
        in_ns
            && term
                .get("labelSelector")
                .is_some_and(|sel| matches(sel, labels)),
    )
}

#[derive(Default)]
struct Model {
    /// Node name → what it is.
    nodes: HashMap<String, NodeSeen>,
    /// Pod key → what it is.
    pods: HashMap<String, PodSeen>,
    /// Claim key → volume name.
    claims: HashMap<String, String>,
    /// Volume name → the zones its node affinity allows (empty: any).
    volumes: HashMap<String, Vec<String>>,
    /// Claims a bind has used.
    claims_used: std::collections::HashSet<String>,
    /// The last change applied.
    seen_rv: u64,
    report: AuditReport,
}

fn s(v: &Value, p: &str) -> Option<String> {
    v.pointer(p).and_then(Value::as_str).map(str::to_string)
}

fn labels(v: &Value) -> Labels {
    v.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// A label selector (`matchLabels`, `matchExpressions`); a missing one matches nothing.
fn matches(selector: &Value, labels: &Labels) -> bool {
    if !selector.is_object() {
        return false;
    }
    let pairs = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    pairs
        && selector
            .get("matchExpressions")
            .and_then(Value::as_array)
            .is_none_or(|es| es.iter().all(|e| expression_holds(e, labels)))
}

/// One `matchExpressions` entry (In, NotIn, Exists, DoesNotExist).
fn expression_holds(e: &Value, labels: &Labels) -> bool {
    let have = e["key"]
        .as_str()
        .and_then(|k| labels.get(k))
        .and_then(Value::as_str);
    let values: Vec<&str> = e["values"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match e["operator"].as_str() {
        Some("In") => have.is_some_and(|h| values.contains(&h)),
        Some("NotIn") => have.is_none_or(|h| !values.contains(&h)),
        Some("Exists") => have.is_some(),
        Some("DoesNotExist") => have.is_none(),
        _ => false,
    }
}

/// Whether a node's labels admit the pod: its `nodeSelector` and required node affinity (any
/// term whose expressions all hold).
fn admits(pod: &Value, labels: &Labels) -> bool {
    let selected = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let terms = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array);
    // A term without expressions matches no node.
    selected
        && terms.is_none_or(|ts| {
            ts.iter().any(|t| {
                t["matchExpressions"].as_array().is_some_and(|es| {
                    !es.is_empty() && es.iter().all(|e| expression_holds(e, labels))
                })
            })
        })
}

/// A spread constraint's selector with its `matchLabelKeys` as `In` requirements on the pod's
/// own values.
fn spread_selector(c: &Value, own: &Labels) -> Value {
    let mut selector = c["labelSelector"].clone();
    if !selector.is_object() {
        return Value::Null;
    }
    for k in c["matchLabelKeys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if let Some(v) = own.get(k) {
            let exprs = &mut selector["matchExpressions"];
            if !exprs.is_array() {
                *exprs = Value::Array(Vec::new());
            }
            if let Some(a) = exprs.as_array_mut() {
                a.push(serde_json::json!({"key": k, "operator": "In", "values": [v]}));
            }
        }
    }
    selector
}

impl Model {
    /// Applies a change; a bind it shows is judged.
    fn apply(&mut self, c: &Change) {
        self.apply_as(c, false);
    }

    /// Applies a change; with `initial` (the state the audit starts from) nothing is judged.
    fn apply_as(&mut self, c: &Change, initial: bool) {
        let key = format!(
            "{}/{}",
            c.namespace,
            s(&c.object, "/metadata/name").unwrap_or_default()
        );
        let deleted = matches!(c.event, EventType::Deleted);
        match c.type_id.as_str() {
            "/v1/nodes" => {
                let name = s(&c.object, "/metadata/name").unwrap_or_default();
                if deleted {
                    self.nodes.remove(&name);
                } else {
                    let l = labels(&c.object);
                    let zone = l.get(ZONE).and_then(Value::as_str).map(str::to_string);
                    self.nodes.insert(name, NodeSeen { zone, labels: l });
                }
            }
            "/v1/persistentvolumeclaims" if !deleted => {
                if let Some(v) = s(&c.object, "/spec/volumeName").filter(|v| !v.is_empty()) {
                    self.claims.insert(key, v);
                }
            }
            "/v1/persistentvolumes" if !deleted => {
                let zones = c
                    .object
                    .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
                    .and_then(Value::as_array)
                    .map(|terms| {
                        terms
                            .iter()
                            .flat_map(|t| {
                                t["matchExpressions"]
                                    .as_array()
                                    .cloned()
                                    .unwrap_or_default()
                            })
                            .filter(|e| e["operator"] == "In")
                            .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                self.volumes
                    .insert(s(&c.object, "/metadata/name").unwrap_or_default(), zones);
            }
            "/v1/pods" => {
                let node = s(&c.object, "/spec/nodeName").filter(|n| !n.is_empty());
                let was = self.pods.get(&key).and_then(|p| p.node.clone());
                let live = !deleted
                    && c.object.pointer("/metadata/deletionTimestamp").is_none()
                    && !matches!(
                        c.object.pointer("/status/phase").and_then(Value::as_str),
                        Some("Succeeded" | "Failed")
                    );
                if let (None, Some(n)) = (&was, &node) {
                    if live && !initial {
                        self.check_bind(&c.object, &c.namespace, n);
                    }
                }
                if live {
                    self.pods.insert(
                        key,
                        PodSeen {
                            namespace: c.namespace.clone(),
                            labels: labels(&c.object),
                            node,
                            anti: terms(&c.object, ANTI_TERMS),
                        },
                    );
                } else {
                    self.pods.remove(&key);
                }
            }
            _ => {}
        }
    }

    fn zone_of(&self, node: &str) -> Option<&str> {
        self.nodes.get(node).and_then(|n| n.zone.as_deref())
    }

    /// The value of topology key `key` on node `node`, if it has one.
    fn domain(&self, node: &str, key: &str) -> Option<&Value> {
        self.nodes.get(node).and_then(|n| n.labels.get(key))
    }

    /// Required inter-pod affinity and anti-affinity, judged for `pod` (labels `own`) bound to
    /// `node` against the other live pods.
    fn check_affinity(&mut self, pod: &Value, ns: &str, name: &str, own: &Labels, node: &str) {
        let anti = terms(pod, ANTI_TERMS);
        let affinity = terms(pod, AFFINITY_TERMS);
        let mut judged = !anti.is_empty() || !affinity.is_empty();
        let key = format!("{ns}/{name}");
        let mut violations = Vec::new();
        let mut not_judged = 0;
        // Its anti-affinity: no selected pod in the node's domain.
        for t in &anti {
            let tk = t["topologyKey"].as_str().unwrap_or("");
            let Some(here) = self.domain(node, tk) else {
                continue;
            };
            for (k, p) in &self.pods {
                let Some(m) = p.node.as_deref().filter(|_| *k != key) else {
                    continue;
                };
                if self.domain(m, tk) != Some(here) {
                    continue;
                }
                match term_selects(t, ns, &p.namespace, &p.labels) {
                    Some(true) => violations.push(format!(
                        "{ns}/{name} bound to {node} beside {k} on {m}, which its anti-affinity on {tk} excludes"
                    )),
                    Some(false) => {}
                    None => not_judged += 1,
                }
            }
        }
        // The running pods' anti-affinity: none of them, in the node's domain, selects it.
        for (k, p) in &self.pods {
            let Some(m) = p.node.as_deref().filter(|_| *k != key) else {
                continue;
            };
            for t in &p.anti {
                let tk = t["topologyKey"].as_str().unwrap_or("");
                let Some(theirs) = self.domain(m, tk) else {
                    continue;
                };
                if self.domain(node, tk) != Some(theirs) {
                    continue;
                }
                judged = true;
                match term_selects(t, &p.namespace, ns, own) {
                    Some(true) => violations.push(format!(
                        "{ns}/{name} bound to {node} beside {k} on {m}, whose anti-affinity on {tk} excludes it"
                    )),
                    Some(false) => {}
                    None => not_judged += 1,
                }
            }
        }
        // Its affinity, as the scheduler's filter decides it: the node has every term's key;
        // the pods that match *all* the terms are counted per term's domain; each term's domain
        // here must have one, or (the first of a group) no such pod runs anywhere and the pod
        // matches all its terms itself.
        let all = |p_ns: &str, labels: &Labels| -> Option<bool> {
            affinity.iter().try_fold(true, |acc, t| {
                Some(acc && term_selects(t, ns, p_ns, labels)?)
            })
        };
        if !affinity.is_empty() {
            let mut counts: HashMap<(String, Value), usize> = HashMap::new();
            let mut judgeable = all(ns, own).is_some();
            for (k, p) in &self.pods {
                let Some(m) = p.node.as_deref().filter(|_| *k != key) else {
                    continue;
                };
                match all(&p.namespace, &p.labels) {
                    Some(true) => {
                        for t in &affinity {
                            let tk = t["topologyKey"].as_str().unwrap_or("");
                            if let Some(v) = self.domain(m, tk) {
                                *counts.entry((tk.to_string(), v.clone())).or_default() += 1;
                            }
                        }
                    }
                    Some(false) => {}
                    None => judgeable = false,
                }
            }
            let mut keyed = true;
            let mut beside = true;
            for t in &affinity {
                let tk = t["topologyKey"].as_str().unwrap_or("");
                match self.domain(node, tk) {
                    Some(v) => {
                        beside &= counts
                            .get(&(tk.to_string(), v.clone()))
                            .is_some_and(|n| *n > 0)
                    }
                    None => keyed = false,
                }
            }
            let first = counts.is_empty() && all(ns, own) == Some(true);
            if !judgeable {
                not_judged += 1;
            } else if !keyed || !(beside || first) {
                violations.push(format!(
                    "{ns}/{name} bound to {node}, where the pods its required affinity asks for do not run"
                ));
            }
        }
        self.report.affinity_binds += usize::from(judged);
        self.report.terms_not_judged += not_judged;
        self.report.violations.extend(violations);
    }

    fn check_bind(&mut self, pod: &Value, ns: &str, node: &str) {
        self.report.binds += 1;
        let name = s(pod, "/metadata/name").unwrap_or_default();
        let own = labels(pod);
        self.check_affinity(pod, ns, &name, &own, node);
        let app = own
            .get("app")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let here = self.zone_of(node).map(str::to_string);
        let constraints: Vec<Value> = pod
            .pointer("/spec/topologySpreadConstraints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["whenUnsatisfiable"] == "DoNotSchedule" && c["topologyKey"] == ZONE)
            .collect();
        if !constraints.is_empty() {
            self.report.spread_binds += 1;
        }
        for c in constraints {
            let Some(here) = &here else {
                // kube-scheduler refuses a node without the constraint's key.
                self.report.violations.push(format!(
                    "{ns}/{name} bound to {node}, which has no {ZONE} label, under a zone-spread constraint"
                ));
                continue;
            };
            // Domains: zones with a node the pod's selector and node affinity admit (Ready or
            // not: taints are not looked at by default).
            let selector = spread_selector(&c, &own);
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for n in self.nodes.values() {
                if let (Some(z), true) = (&n.zone, admits(pod, &n.labels)) {
                    counts.entry(z.clone()).or_insert(0);
                }
            }
            // Pods count on the nodes the constraint counts: those the pod's selector and node
            // affinity admit.
            for p in self.pods.values() {
                if p.namespace != ns || !matches(&selector, &p.labels) {
                    continue;
                }
                let counted = p
                    .node
                    .as_deref()
                    .and_then(|n| self.nodes.get(n))
                    .is_some_and(|n| admits(pod, &n.labels));
                if !counted {
                    continue;
                }
                if let Some(z) = p.node.as_deref().and_then(|n| self.zone_of(n)) {
                    if let Some(n) = counts.get_mut(z) {
                        *n += 1;
                    }
                }
            }
            let min_domains = c["minDomains"].as_u64().unwrap_or(1);
            let min = if (counts.len() as u64) < min_domains {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            let mine = counts.get(here).copied().unwrap_or(0) + i64::from(matches(&selector, &own));
            let skew = mine - min;
            let max_skew = c["maxSkew"].as_i64().unwrap_or(1);
            let worst = self.report.max_skew.entry(app.clone()).or_insert(0);
            *worst = (*worst).max(skew);
            if skew > max_skew {
                self.report.violations.push(format!(
                    "{ns}/{name} bound in {here} with skew {skew} (maxSkew {max_skew}; zones {counts:?})"
                ));
            }
        }
        for claim in pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| {
                v.pointer("/persistentVolumeClaim/claimName")
                    .and_then(Value::as_str)
            })
        {
            let allowed = self
                .claims
                .get(&format!("{ns}/{claim}"))
                .and_then(|v| self.volumes.get(v));
            let key = format!("{ns}/{claim}");
            let again = !self.claims_used.insert(key);
            if let Some(zones) = allowed.filter(|z| !z.is_empty()) {
                if again {
                    self.report.volume_binds += 1;
                }
                let disk_zone = self
                    .nodes
                    .get(node)
                    .and_then(|n| n.labels.get("topology.disk.csi.azure.com/zone"))
                    .and_then(Value::as_str);
                if !disk_zone.is_some_and(|z| zones.iter().any(|a| a == z)) {
                    self.report.violations.push(format!(
                        "{ns}/{name} bound to {node} ({disk_zone:?}) but its claim {claim}'s volume lives in {zones:?}"
                    ));
                }
            }
        }
    }
}

/// The audit, running: [`PlacementAudit::finish`] stops it and says what it found.
pub struct PlacementAudit {
    task: JoinHandle<()>,
    model: Arc<Mutex<Model>>,
    kube: KubeState,
}

impl PlacementAudit {
    /// Starts following `kube`'s changes: what the store holds now is read first, under the
    /// lock the subscription is taken under.
    pub fn start(kube: &KubeState) -> PlacementAudit {
        let model = Arc::new(Mutex::new(Model::default()));
        let mut rx = kube.with_store(|store| {
            let rx = store.subscribe();
            let mut m = model.lock();
            for plural in [
                "nodes",
                "persistentvolumes",
                "persistentvolumeclaims",
                "pods",
            ] {
                let Some(rt) = super::kube::resources::find("", "v1", plural) else {
                    continue;
                };
                for object in store
                    .list(
                        rt,
                        None,
                        &super::kube::select::Selector::default(),
                        None,
                        None,
                    )
                    .items
                {
                    let namespace = object
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    let change = Change {
                        rv: store.resource_version(),
                        type_id: rt.id(),
                        namespace,
                        event: EventType::Added,
                        object,
                        prev: None,
                    };
                    m.apply_as(&change, true);
                }
            }
            m.seen_rv = store.resource_version();
            rx
        });
        let shared = model.clone();
        let task = tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(change) => {
                        let mut m = shared.lock();
                        m.apply(&change);
                        m.seen_rv = m.seen_rv.max(change.rv);
                    }
                    Err(RecvError::Lagged(_)) => shared.lock().report.lagged = true,
                    Err(RecvError::Closed) => return,
                }
            }
        });
        PlacementAudit {
            task,
            model,
            kube: kube.clone(),
        }
    }

    /// What is found so far.
    pub fn report(&self) -> AuditReport {
        self.model.lock().report.clone()
    }

    /// Stops the audit, once it has applied every change made so far, and says what it found.
    pub async fn finish(self) -> AuditReport {
        let last = self.kube.resource_version();
        for _ in 0..200 {
            if self.model.lock().seen_rv >= last {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if self.model.lock().seen_rv < last {
            self.model.lock().report.lagged = true;
        }
        let report = self.report();
        self.task.abort();
        let _ = self.task.await;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn change(type_id: &str, ns: &str, event: EventType, object: Value) -> Change {
        Change {
            rv: 0,
            type_id: type_id.into(),
            namespace: ns.into(),
            event,
            object,
            prev: None,
        }
    }

    fn node(name: &str, zone: &str) -> Change {
        change(
            "/v1/nodes",
            "",
            EventType::Added,
            json!({"metadata": {"name": name, "labels": {ZONE: zone,
                "topology.disk.csi.azure.com/zone": zone}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        )
    }

    fn pod(name: &str, node: Option<&str>, spec: Value) -> Change {
        let mut spec = spec;
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        change(
            "/v1/pods",
            "default",
            EventType::Modified,
            json!({"metadata": {"name": name, "labels": {"app": "web"}},
                "spec": spec, "status": {"phase": "Pending"}}),
        )
    }

    fn spread() -> Value {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]})
    }

    fn host_node(name: &str, zone: &str) -> Change {
        change(
            "/v1/nodes",
            "",
            EventType::Added,
            json!({"metadata": {"name": name, "labels": {ZONE: zone,
                "kubernetes.io/hostname": name}}}),
        )
    }

    fn term(key: &str) -> Value {
        json!([{"topologyKey": key, "labelSelector": {"matchLabels": {"app": "web"}}}])
    }

    fn bind(m: &mut Model, name: &str, node: &str, spec: Value) {
        m.apply(&pod(name, None, spec.clone()));
        m.apply(&pod(name, Some(node), spec));
    }

    #[test]
    fn required_anti_affinity_by_hostname_is_judged_both_ways() {
        let mut m = Model::default();
        m.apply(&host_node("n1", "z1"));
        m.apply(&host_node("n2", "z1"));
        let solo = json!({"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": term("kubernetes.io/hostname")}}});
        bind(&mut m, "a", "n1", solo.clone());
        bind(&mut m, "b", "n2", solo.clone());
        assert_eq!(m.report.violations, Vec::<String>::new());
        // Its own term: a second one on n1.
        bind(&mut m, "c", "n1", solo);
        // The running pods' terms: a plain web pod (no terms of its own) beside them.
        bind(&mut m, "d", "n2", json!({}));
        assert_eq!(m.report.violations.len(), 3, "{:?}", m.report.violations);
        assert!(m.report.violations[0].contains("which its anti-affinity"));
        assert!(m.report.violations[2].starts_with("default/d bound to n2 beside default/b"));
        assert!(m.report.violations[2].contains("whose anti-affinity"));
        assert_eq!(m.report.affinity_binds, 4);
    }

    #[test]
    fn required_affinity_by_zone_needs_a_partner_in_the_zone_but_the_first_of_a_group_goes_anywhere(
    ) {
        let mut m = Model::default();
        m.apply(&host_node("n1", "z1"));
        m.apply(&host_node("n2", "z2"));
        let follow = json!({"affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": term(ZONE)}}});
        // The first: nothing matches anywhere, and it matches its own term.
        bind(&mut m, "a", "n1", follow.clone());
        bind(&mut m, "b", "n1", follow.clone());
        assert_eq!(m.report.violations, Vec::<String>::new());
        bind(&mut m, "c", "n2", follow);
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
        assert!(m.report.violations[0].starts_with("default/c bound to n2, where the pods"));
    }

    #[test]
    fn with_several_affinity_terms_only_pods_matching_all_of_them_count() {
        let mut m = Model::default();
        m.apply(&host_node("n1", "z1"));
        m.apply(&host_node("n2", "z2"));
        let two = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "web"}}},
            {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"tier": "x"}}}]}}});
        // A web pod without tier=x runs in z1: it matches one term, not both, so it counts for
        // nothing, and the incoming pod (app=web only) does not match its own terms: no first.
        bind(&mut m, "a", "n1", json!({}));
        bind(&mut m, "b", "n1", two.clone());
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
        // A node without the terms' key is refused whatever runs elsewhere.
        let mut m = Model::default();
        m.apply(&change(
            "/v1/nodes",
            "",
            EventType::Added,
            json!({"metadata": {"name": "bare", "labels": {}}}),
        ));
        let follow = json!({"affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": term(ZONE)}}});
        bind(&mut m, "c", "bare", follow);
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
    }

    #[test]
    fn a_term_with_a_namespace_selector_is_counted_as_not_judged() {
        let mut m = Model::default();
        m.apply(&host_node("n1", "z1"));
        let anti = json!({"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname",
                "namespaceSelector": {"matchLabels": {"team": "x"}},
                "labelSelector": {"matchLabels": {"app": "web"}}}]}}});
        bind(&mut m, "a", "n1", json!({}));
        bind(&mut m, "b", "n1", anti);
        assert!(m.report.violations.is_empty());
        assert_eq!(m.report.terms_not_judged, 1);
    }

    #[test]
    fn a_bind_that_breaks_a_zone_spread_is_a_violation_and_one_that_keeps_it_is_not() {
        let mut m = Model::default();
        m.apply(&node("n1", "z1"));
        m.apply(&node("n2", "z2"));
        for (name, node) in [("a", "n1"), ("b", "n2"), ("c", "n1")] {
            m.apply(&pod(name, None, spread()));
            m.apply(&pod(name, Some(node), spread()));
        }
        assert_eq!(m.report.violations, Vec::<String>::new());
        assert_eq!(m.report.max_skew.get("web"), Some(&1));
        // A fourth in z1 makes 3 against 1.
        m.apply(&pod("d", None, spread()));
        m.apply(&pod("d", Some("n1"), spread()));
        assert_eq!(m.report.max_skew.get("web"), Some(&2));
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
        assert!(m.report.violations[0].starts_with("default/d bound in z1 with skew 2"));
        assert_eq!((m.report.binds, m.report.spread_binds), (4, 4));
    }

    #[test]
    fn pods_on_nodes_the_pod_does_not_admit_are_not_counted_and_a_node_without_a_zone_is_a_violation(
    ) {
        let mut m = Model::default();
        let pooled = |name: &str, zone: &str| {
            change(
                "/v1/nodes",
                "",
                EventType::Added,
                json!({"metadata": {"name": name, "labels": {ZONE: zone, "pool": "x"}}}),
            )
        };
        m.apply(&node("n1", "z1"));
        m.apply(&pooled("x1", "z1"));
        m.apply(&pooled("x2", "z2"));
        // Two pods on n1, outside pool x: a pod that selects pool x does not count them.
        for name in ["a", "b"] {
            m.apply(&pod(name, None, json!({})));
            m.apply(&pod(name, Some("n1"), json!({})));
        }
        let mut picky = spread();
        picky["nodeSelector"] = json!({"pool": "x"});
        m.apply(&pod("c", None, picky.clone()));
        m.apply(&pod("c", Some("x1"), picky.clone()));
        assert!(m.report.violations.is_empty(), "{:?}", m.report.violations);
        assert_eq!(m.report.max_skew.get("web"), Some(&1));
        // A spread pod on a node without the zone label.
        m.apply(&change(
            "/v1/nodes",
            "",
            EventType::Added,
            json!({"metadata": {"name": "bare", "labels": {}}}),
        ));
        m.apply(&pod("d", None, spread()));
        m.apply(&pod("d", Some("bare"), spread()));
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
        assert!(m.report.violations[0].contains("has no topology.kubernetes.io/zone label"));
    }

    #[test]
    fn with_fewer_zones_than_min_domains_the_minimum_is_zero() {
        let mut m = Model::default();
        m.apply(&node("n1", "z1"));
        let mut three = spread();
        three["topologySpreadConstraints"][0]["minDomains"] = json!(3);
        for name in ["a", "b"] {
            m.apply(&pod(name, None, three.clone()));
            m.apply(&pod(name, Some("n1"), three.clone()));
        }
        assert_eq!(m.report.max_skew.get("web"), Some(&2));
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
    }

    #[test]
    fn a_pod_bound_outside_its_volumes_zone_is_a_violation() {
        let mut m = Model::default();
        m.apply(&node("n1", "z1"));
        m.apply(&node("n2", "z2"));
        m.apply(&change(
            "/v1/persistentvolumes",
            "",
            EventType::Added,
            json!({"metadata": {"name": "pv-1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": ["z2"]}]}]}}}}),
        ));
        m.apply(&change(
            "/v1/persistentvolumeclaims",
            "default",
            EventType::Modified,
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1"}}),
        ));
        let with_claim =
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        m.apply(&pod("db", None, with_claim.clone()));
        m.apply(&pod("db", Some("n2"), with_claim.clone()));
        assert!(m.report.violations.is_empty());
        m.apply(&pod("db2", None, with_claim.clone()));
        m.apply(&pod("db2", Some("n1"), with_claim));
        assert_eq!(m.report.violations.len(), 1, "{:?}", m.report.violations);
        assert!(m.report.violations[0].contains("lives in [\"z2\"]"));
    }
}
