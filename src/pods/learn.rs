//! What registers against what was predicted: the template a scale-up decision planned a group's
//! new nodes with, compared with the node that then turns Ready ([`mismatches`]), and whether
//! those nodes can take the pods the scale-up was for ([`not_helped`]). Pure code: the scale-up
//! loop keeps the records and acts on the answers.
//!
//! The comparison looks only at what a decision reads: the labels some pod of the cluster selects
//! on (node selectors, node affinity, the topology keys of spreads and pod affinity, and the zone
//! and region labels volumes are placed by), the taints, and allocatable beyond 5 %. A label
//! nobody selects on may differ freely: no decision depends on it.

use super::estimate::{first_fit, prepare};
use super::fit::{NodeState, HOSTNAME};
use super::record::{NodeRecord, PodRecord};
use super::scale_up::ScaleUpInput;
use super::template::{DISK_ZONE_LABEL, REGION_LABEL, ZONE_LABEL};
use super::topology::Topology;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// How far a real node's allocatable may be from the template's before it counts as a
/// mismatch (cluster-autoscaler's `MaxAllocatableDifferenceRatio`).
pub const ALLOCATABLE_TOLERANCE: f64 = 0.05;

/// The resources compared.
const RESOURCES: [&str; 5] = [
    "cpu",
    "memory",
    "pods",
    "ephemeral-storage",
    "nvidia.com/gpu",
];

/// One thing the registered node has otherwise than its template predicted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// What differs: a label key, `taint/<key>` or `allocatable/<resource>` (the
    /// `template_mismatches_total` `key` label).
    pub key: String,
    /// The template's value (`-`: none); for a template spanning zones, its values joined by `|`.
    pub predicted: String,
    /// The node's value (`-`: none).
    pub real: String,
}

impl Mismatch {
    /// Whether what differs is a label (not a taint or an allocatable resource).
    pub fn is_label(&self) -> bool {
        !self.key.starts_with("taint/") && !self.key.starts_with("allocatable/")
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: predicted {}, registered {}",
            self.key, self.predicted, self.real
        )
    }
}

/// The node label keys `pods` select on (node selectors, required and preferred node affinity,
/// the topology keys of spreads and of pod affinity and anti-affinity), plus the zone and region
/// labels volumes are placed by. Never the hostname: each node has its own.
pub fn selected_keys<'a>(pods: impl IntoIterator<Item = &'a Arc<PodRecord>>) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = [ZONE_LABEL, DISK_ZONE_LABEL, REGION_LABEL]
        .into_iter()
        .map(String::from)
        .collect();
    // Pods of one shape share their spec: look at each spec once.
    let mut seen: std::collections::HashSet<*const k8s_openapi::api::core::v1::PodSpec> =
        Default::default();
    for pod in pods {
        let spec = pod.spec();
        if !seen.insert(spec as *const _) {
            continue;
        }
        keys.extend(spec.node_selector.iter().flatten().map(|(k, _)| k.clone()));
        for c in spec.topology_spread_constraints.iter().flatten() {
            keys.insert(c.topology_key.clone());
        }
        let Some(a) = &spec.affinity else {
            continue;
        };
        if let Some(na) = &a.node_affinity {
            let required = na
                .required_during_scheduling_ignored_during_execution
                .iter()
                .flat_map(|s| &s.node_selector_terms);
            let preferred = na
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .map(|p| &p.preference);
            for term in required.chain(preferred) {
                keys.extend(
                    term.match_expressions
                        .iter()
                        .flatten()
                        .map(|e| e.key.clone()),
                );
            }
        }
        let terms = |required: Option<&Vec<_>>, preferred: Option<&Vec<_>>| {
            let mut out: Vec<String> = Vec::new();
            for t in required.into_iter().flatten() {
                let t: &k8s_openapi::api::core::v1::PodAffinityTerm = t;
                out.push(t.topology_key.clone());
            }
            for w in preferred.into_iter().flatten() {
                let w: &k8s_openapi::api::core::v1::WeightedPodAffinityTerm = w;
                out.push(w.pod_affinity_term.topology_key.clone());
            }
            out
        };
        if let Some(pa) = &a.pod_affinity {
            keys.extend(terms(
                pa.required_during_scheduling_ignored_during_execution
                    .as_ref(),
                pa.preferred_during_scheduling_ignored_during_execution
                    .as_ref(),
            ));
        }
        if let Some(pa) = &a.pod_anti_affinity {
            keys.extend(terms(
                pa.required_during_scheduling_ignored_during_execution
                    .as_ref(),
                pa.preferred_during_scheduling_ignored_during_execution
                    .as_ref(),
            ));
        }
    }
    keys.remove(HOSTNAME);
    keys.retain(|k| !k.is_empty());
    keys
}

/// Whether a taint is one a node carries only for a while (not Ready, unreachable, cordoned,
/// being deleted, not initialized): never part of a prediction.
fn transient_taint(key: &str) -> bool {
    key.starts_with("node.kubernetes.io/")
        || key.starts_with("node.cloudprovider.kubernetes.io/")
        || key.starts_with("vmss-capacity-controller")
        || key == "ToBeDeletedByClusterAutoscaler"
        || key == "DeletionCandidateOfClusterAutoscaler"
}

/// What `real` (a node of the group, Ready) has otherwise than `predicted` (the template the
/// decision used) on `keys` ([`selected_keys`]), its taints and its allocatable. A template
/// spanning zones predicts any of its zone variants' values.
pub fn mismatches(
    predicted: &NodeState,
    real: &NodeRecord,
    keys: &BTreeSet<String>,
) -> Vec<Mismatch> {
    let show = |v: Option<&String>| v.map_or_else(|| "-".to_string(), Clone::clone);
    let mut out = Vec::new();
    for key in keys {
        let options: Vec<Option<&String>> = match predicted.zone_variants() {
            Some(variants) => {
                let mut o: Vec<Option<&String>> = variants.iter().map(|v| v.get(key)).collect();
                o.dedup();
                o
            }
            None => vec![predicted.labels.get(key)],
        };
        let got = real.labels.get(key);
        if !options.contains(&got) {
            out.push(Mismatch {
                key: key.clone(),
                predicted: options
                    .iter()
                    .map(|v| show(*v))
                    .collect::<Vec<_>>()
                    .join("|"),
                real: show(got),
            });
        }
    }
    let taints = |t: &[k8s_openapi::api::core::v1::Taint]| -> BTreeSet<(String, String, String)> {
        t.iter()
            .filter(|t| !transient_taint(&t.key))
            .map(|t| {
                (
                    t.key.clone(),
                    t.value.clone().unwrap_or_default(),
                    t.effect.clone(),
                )
            })
            .collect()
    };
    let (want, got) = (taints(&predicted.taints), taints(&real.taints));
    let keys: BTreeSet<&String> = want.iter().chain(&got).map(|(k, ..)| k).collect();
    for key in keys {
        let side = |s: &BTreeSet<(String, String, String)>| {
            let v: Vec<String> = s
                .iter()
                .filter(|(k, ..)| k == key)
                .map(|(_, v, e)| format!("{v}:{e}"))
                .collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(",")
            }
        };
        let (p, r) = (side(&want), side(&got));
        if p != r {
            out.push(Mismatch {
                key: format!("taint/{key}"),
                predicted: p,
                real: r,
            });
        }
    }
    for r in RESOURCES {
        let p = predicted.allocatable.get(r).copied().unwrap_or(0);
        let g = real.allocatable.get(r).copied().unwrap_or(0);
        let (pf, gf) = (p as f64, g as f64);
        if (pf - gf).abs() > ALLOCATABLE_TOLERANCE * pf.max(gf) {
            let milli = |q: i128| -> String {
                if q % 1000 == 0 {
                    (q / 1000).to_string()
                } else {
                    format!("{q}m")
                }
            };
            out.push(Mismatch {
                key: format!("allocatable/{r}"),
                predicted: milli(p),
                real: milli(g),
            });
        }
    }
    out
}

/// A pod a scale-up was for that the group's new nodes cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotHelped {
    /// `namespace/name`.
    pub pod: String,
    /// Its workload ([`PodRecord::workload`]).
    pub workload: String,
    /// Why, in the scheduler's words, on the first new node.
    pub why: String,
    /// The node itself refuses it (labels, taints, resources, volumes it cannot attach), not
    /// the spread or affinity rules counted over other nodes, which nodes still on their way
    /// may change.
    pub intrinsic: bool,
}

/// Of the pods named in `pods` that are still pending in `input`, the ones none of the nodes
/// named in `new_nodes` could take even if the node held nothing but its DaemonSet pods: its
/// labels, taints or allocatable refuse them, or the spread and affinity rules, counted over the
/// whole cluster as it is, do. A pod only waiting for kube-scheduler, or for room that other
/// pods took first, is not here: the nodes would take it.
pub fn not_helped(
    input: &ScaleUpInput,
    new_nodes: &[&str],
    pods: &BTreeSet<String>,
) -> Vec<NotHelped> {
    let wanted: Vec<Arc<PodRecord>> = input
        .pods
        .unplaced()
        .filter(|p| pods.contains(&p.key()))
        .cloned()
        .collect();
    if wanted.is_empty() || new_nodes.is_empty() {
        return Vec::new();
    }
    let prepared = prepare(&wanted);
    let cluster: Vec<NodeState> = input
        .nodes
        .iter()
        .map(|n| NodeState::with_placed(n, input.pods.bound(&n.name).cloned().unwrap_or_default()))
        .collect();
    let topology = Topology::new(
        &prepared,
        cluster.iter(),
        &[],
        &input.volumes,
        &input.namespaces,
    );
    // Each new node as if it held its DaemonSet pods only.
    let fresh: Vec<NodeState> = input
        .nodes
        .iter()
        .filter(|n| new_nodes.contains(&n.name.as_str()))
        .map(|n| {
            let daemons: Vec<&Arc<PodRecord>> = input
                .pods
                .bound(&n.name)
                .map(|p| {
                    p.pods()
                        .iter()
                        .filter(|p| p.controller.as_ref().is_some_and(|c| c.kind == "DaemonSet"))
                        .collect()
                })
                .unwrap_or_default();
            let mut s = NodeState::from_node(n, daemons);
            s.set_volume_limits(input.volumes.limits(&n.name));
            s
        })
        .collect();
    if fresh.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in &prepared {
        // One node at a time, so one pod's placement does not count against the next.
        let mut topology = topology.clone();
        let mut nodes = fresh.clone();
        if first_fit(&mut nodes, p, &mut HashMap::new(), &mut topology).is_some() {
            continue;
        }
        let (why, intrinsic) = match fresh[0].fits(&p.pod) {
            Err(u) => (u.to_string(), true),
            Ok(()) => (
                topology
                    .fits(p.class, &fresh[0])
                    .err()
                    .map_or_else(|| "no room".to_string(), |u| u.to_string()),
                false,
            ),
        };
        out.push(NotHelped {
            pod: p.key.clone(),
            workload: p.pod.workload(),
            why,
            intrinsic,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::fit::Resources;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn node(labels: serde_json::Value, taints: serde_json::Value, cpu: &str) -> NodeRecord {
        NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "n1", "labels": labels},
                "spec": {"taints": taints},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]
                }
            }))
            .unwrap(),
        )
    }

    fn template(labels: &[(&str, &str)]) -> NodeState {
        NodeState::new(
            "template-g",
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Vec::new(),
            Resources::from([
                ("cpu".into(), 4000),
                ("memory".into(), 16 * (1i128 << 30) * 1000),
                ("pods".into(), 110_000),
            ]),
        )
    }

    fn keys(k: &[&str]) -> BTreeSet<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_node_registering_in_another_zone_than_its_template_said_is_a_mismatch_on_the_zone_label() {
        let t = template(&[(ZONE_LABEL, "0")]);
        let n = node(json!({ZONE_LABEL: "westeurope-1"}), json!([]), "4");
        let m = mismatches(&t, &n, &keys(&[ZONE_LABEL]));
        assert_eq!(
            m,
            vec![Mismatch {
                key: ZONE_LABEL.into(),
                predicted: "0".into(),
                real: "westeurope-1".into()
            }]
        );
    }

    #[test]
    fn labels_no_pod_selects_on_may_differ_freely() {
        let t = template(&[("team", "a")]);
        let n = node(json!({"team": "b"}), json!([]), "4");
        assert!(mismatches(&t, &n, &keys(&[])).is_empty());
        assert_eq!(mismatches(&t, &n, &keys(&["team"])).len(), 1);
    }

    #[test]
    fn a_template_spanning_zones_predicts_any_of_its_zones() {
        let mut t = template(&[]);
        t.set_zone_variants(vec![
            BTreeMap::from([(ZONE_LABEL.to_string(), "westeurope-1".to_string())]),
            BTreeMap::from([(ZONE_LABEL.to_string(), "westeurope-2".to_string())]),
        ]);
        let n2 = node(json!({ZONE_LABEL: "westeurope-2"}), json!([]), "4");
        assert!(mismatches(&t, &n2, &keys(&[ZONE_LABEL])).is_empty());
        let n3 = node(json!({ZONE_LABEL: "westeurope-3"}), json!([]), "4");
        assert_eq!(
            mismatches(&t, &n3, &keys(&[ZONE_LABEL]))[0].predicted,
            "westeurope-1|westeurope-2"
        );
    }

    #[test]
    fn an_unexpected_taint_and_allocatable_beyond_five_percent_are_mismatches_but_transient_taints_are_not(
    ) {
        let t = template(&[]);
        let n = node(
            json!({}),
            json!([
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
            ]),
            "3",
        );
        let m: Vec<String> = mismatches(&t, &n, &keys(&[]))
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(m, vec!["taint/dedicated", "allocatable/cpu"]);
        // 3.9 of 4 cores: within 5 %.
        let close = node(json!({}), json!([]), "3900m");
        assert!(mismatches(&t, &close, &keys(&[])).is_empty());
    }

    #[test]
    fn the_keys_pods_select_on_come_from_selectors_affinity_and_spreads() {
        let pod = Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {
                    "containers": [{"name": "c"}],
                    "nodeSelector": {"disk": "ssd"},
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}],
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "tier", "operator": "Exists"}]}]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]}
                    }
                }
            }))
            .unwrap(),
        ));
        let k = selected_keys([&pod]);
        for want in ["disk", "rack", "tier", ZONE_LABEL, REGION_LABEL] {
            assert!(k.contains(want), "{want} in {k:?}");
        }
        assert!(!k.contains(HOSTNAME));
    }
}
