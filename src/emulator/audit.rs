//! A placement audit: every bind the cluster sees, checked as it happens against the pod's
//! zone-spread constraints and its volumes' zones. It replays the Kubernetes store's change
//! stream in order (so a bind is judged against the cluster as it was at that moment, not as a
//! later sample finds it), with code of its own: neither the simulation's scheduler nor the
//! planner is asked, so a shared misreading cannot pass itself.
//!
//! What it checks, for each pod the first time it gets a node:
//! - each `DoNotSchedule` constraint on `topology.kubernetes.io/zone`: the skew it makes (its
//!   zone's matching pods, itself included, less the fewest in any zone that has a Ready node
//!   its `nodeSelector` admits) stays within `maxSkew`; the largest skew per `app` label is kept;
//! - each claim bound to a volume with a zonal `nodeAffinity`: the node is in that zone.
//!
//! A receiver that lags behind the stream marks the audit incomplete, never passing.

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
    /// Binds that broke a constraint or a volume's zone, in words.
    pub violations: Vec<String>,
    /// The stream was lost for a while: the audit is incomplete.
    pub lagged: bool,
}

type Labels = serde_json::Map<String, Value>;

/// A node as the audit knows it.
struct NodeSeen {
    zone: Option<String>,
    ready: bool,
    labels: Labels,
}

/// A live pod as the audit knows it.
struct PodSeen {
    namespace: String,
    labels: Labels,
    node: Option<String>,
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

fn ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn matches(selector: &Value, labels: &Labels) -> bool {
    selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl Model {
    fn apply(&mut self, c: &Change) {
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
                    self.nodes.insert(
                        name,
                        NodeSeen {
                            zone,
                            ready: ready(&c.object),
                            labels: l,
                        },
                    );
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
                    if live {
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

    fn check_bind(&mut self, pod: &Value, ns: &str, node: &str) {
        self.report.binds += 1;
        let name = s(pod, "/metadata/name").unwrap_or_default();
        let own = labels(pod);
        let app = own
            .get("app")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string();
        let here = self.zone_of(node).map(str::to_string);
        let selector: serde_json::Map<String, Value> = pod
            .pointer("/spec/nodeSelector")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
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
            let Some(here) = &here else { continue };
            // Domains: zones with a Ready node the pod's nodeSelector admits.
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for n in self.nodes.values() {
                let admitted = selector.iter().all(|(k, v)| n.labels.get(k) == Some(v));
                if let (Some(z), true, true) = (&n.zone, n.ready, admitted) {
                    counts.entry(z.clone()).or_insert(0);
                }
            }
            for p in self.pods.values() {
                if p.namespace != ns || !matches(&c["labelSelector"], &p.labels) {
                    continue;
                }
                if let Some(z) = p.node.as_deref().and_then(|n| self.zone_of(n)) {
                    if let Some(n) = counts.get_mut(z) {
                        *n += 1;
                    }
                }
            }
            let min = counts.values().copied().min().unwrap_or(0);
            let mine = counts.get(here).copied().unwrap_or(0)
                + i64::from(matches(&c["labelSelector"], &own));
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
            if let Some(zones) = allowed.filter(|z| !z.is_empty()) {
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
}

impl PlacementAudit {
    /// Starts following `kube`'s changes from now on (what is already there is read first).
    pub fn start(kube: &KubeState) -> PlacementAudit {
        let model = Arc::new(Mutex::new(Model::default()));
        let mut rx = kube.subscribe_changes();
        let shared = model.clone();
        let task = tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(change) => shared.lock().apply(&change),
                    Err(RecvError::Lagged(_)) => shared.lock().report.lagged = true,
                    Err(RecvError::Closed) => return,
                }
            }
        });
        PlacementAudit { task, model }
    }

    /// What is found so far.
    pub fn report(&self) -> AuditReport {
        self.model.lock().report.clone()
    }

    /// Stops the audit and says what it found.
    pub async fn finish(self) -> AuditReport {
        // Let the changes already sent arrive.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
