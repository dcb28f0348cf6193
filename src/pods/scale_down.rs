//! Which nodes nobody needs, as cluster-autoscaler decides it, with its annotation names so
//! existing workloads keep working. A node is a candidate when it is empty of pods that would
//! have to move, or when the larger of its cpu and memory request utilisation is under
//! `scaleDownUtilizationThreshold` (0.5) and every pod that would have to move fits on the other
//! nodes (the same fit code, against their free room). What blocks a node, in cluster-autoscaler's
//! words: a PodDisruptionBudget that would be violated, a pod without a controller, a kube-system
//! pod that is not a DaemonSet or mirror pod and has no PDB, local storage (hostPath, or emptyDir
//! not in memory), `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`, and the node
//! annotation `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`. Pure code.

use super::estimate::prepare;
use super::fit::{label_selector_matches, NodeState};
use super::record::PodRecord;
use super::topology::{Cluster, Topology};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Pod annotation: `"true"` lets a pod move despite local storage or no controller; `"false"`
/// pins it (and its node).
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// Node annotation: `"true"` keeps the node out of scale-down.
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
pub use crate::config::UTILIZATION_THRESHOLD;

/// Why a node cannot be removed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocker {
    /// The node carries `scale-down-disabled: "true"`.
    ScaleDownDisabled,
    /// A pod says `safe-to-evict: "false"`.
    NotSafeToEvict(String),
    /// A pod has no controller to re-create it.
    NotReplicated(String),
    /// A kube-system pod (not DaemonSet or mirror) without a PodDisruptionBudget.
    KubeSystemWithoutPdb(String),
    /// A pod uses local storage (hostPath, or an emptyDir not in memory).
    LocalStorage(String),
    /// Evicting the node's pods would take a budget below what it allows.
    PdbViolated {
        /// `namespace/name` of the budget.
        pdb: String,
    },
    /// The utilisation is at or above the threshold.
    Utilized(u32),
    /// A pod that would move fits on no other node.
    NoPlaceFor(String),
    /// A pod runs to completion ([`runs_to_completion`]) and consolidation is on with
    /// `consolidation.disruptJobs: false`: its node waits for it to end.
    RunsToCompletion(String),
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::ScaleDownDisabled => write!(f, "node annotated {SCALE_DOWN_DISABLED}=true"),
            Blocker::NotSafeToEvict(p) => write!(f, "pod {p} is annotated {SAFE_TO_EVICT}=false"),
            Blocker::NotReplicated(p) => write!(f, "pod {p} is not backed by a controller"),
            Blocker::KubeSystemWithoutPdb(p) => {
                write!(
                    f,
                    "non-daemonset, non-mirror kube-system pod {p} has no PodDisruptionBudget"
                )
            }
            Blocker::LocalStorage(p) => write!(f, "pod {p} uses local storage"),
            Blocker::PdbViolated { pdb } => write!(
                f,
                "not enough disruptions left in PodDisruptionBudget {pdb}"
            ),
            Blocker::Utilized(pct) => write!(f, "utilization {pct}% is at or above the threshold"),
            Blocker::NoPlaceFor(p) => write!(f, "pod {p} fits on no other node"),
            Blocker::RunsToCompletion(p) => write!(
                f,
                "pod {p} runs to completion (its controller is a Job): evicted, it would start its work again, so its node waits for it to end (consolidation.disruptJobs: false)"
            ),
        }
    }
}

/// The pods that would have to move if the node went (not DaemonSet or mirror pods).
pub fn pods_to_move(node: &NodeState) -> Vec<Arc<PodRecord>> {
    node.pods().iter().filter(|p| moves(p)).cloned().collect()
}

/// Whether `pod` runs to completion: its controller is a `batch` Job (a CronJob's too). Its
/// eviction throws away the work it has done; a Deployment's pod loses only a restart.
pub fn runs_to_completion(pod: &PodRecord) -> bool {
    pod.controller.as_ref().is_some_and(|c| c.kind == "Job")
}

/// The first pod of `pods` that keeps its node while `keep_jobs` ([`DownInput::keep_jobs`]):
/// one that runs to completion and is not being deleted (a terminating pod's run is lost
/// already, and one stuck on a dead kubelet must not keep its node for ever).
///
/// [`DownInput::keep_jobs`]: super::unneeded::DownInput::keep_jobs
pub fn job_blocker<'a>(
    pods: impl IntoIterator<Item = &'a Arc<PodRecord>>,
    keep_jobs: bool,
) -> Option<Blocker> {
    if !keep_jobs {
        return None;
    }
    pods.into_iter()
        .find(|p| moves(p) && !p.terminating && runs_to_completion(p))
        .map(|p| Blocker::RunsToCompletion(p.key()))
}

/// Whether `pod` would have to move if its node went (not a DaemonSet or mirror pod).
pub fn moves(pod: &PodRecord) -> bool {
    !pod.is_daemonset_pod() && !pod.is_mirror()
}

/// Sorts pods to place the largest first, then by name: the same order however the pods were
/// listed (a decision and the re-check after its taint read them from different views, and
/// first-fit in two orders can disagree), and the order first-fit packs best.
pub fn largest_first(pods: &mut [Arc<PodRecord>]) {
    pods.sort_by_cached_key(|p| {
        let r = &p.facts().requests;
        (
            std::cmp::Reverse(r.get("cpu").copied().unwrap_or(0)),
            std::cmp::Reverse(r.get("memory").copied().unwrap_or(0)),
            p.key(),
        )
    });
}

/// Whether `pod`, on a node being removed, still needs room elsewhere: it moves, a controller
/// recreates it (cluster-autoscaler's `IsRecreatablePod`: one without a controller is gone once
/// evicted), and it is not terminating or finished (an evicted pod's replacement is a pod of its
/// own).
pub fn still_to_move(pod: &PodRecord) -> bool {
    moves(pod) && pod.controller.is_some() && !pod.terminating && !pod.finished()
}

/// The larger of cpu and memory request utilisation (all pods counted, as cluster-autoscaler
/// does by default: the node's requested sum is every placed pod's requests).
pub fn utilization(node: &NodeState) -> f64 {
    ["cpu", "memory"]
        .iter()
        .map(|r| {
            let alloc = node.allocatable.get(r).copied().unwrap_or(0);
            let used = node.requested().get(r).copied().unwrap_or(0);
            if alloc <= 0 {
                0.0
            } else {
                used as f64 / alloc as f64
            }
        })
        .fold(0.0, f64::max)
}

fn pdbs_covering<'a>(
    pod: &'a PodRecord,
    pdbs: &'a [Arc<PodDisruptionBudget>],
) -> impl Iterator<Item = &'a Arc<PodDisruptionBudget>> {
    pdbs.iter().filter(move |b| {
        b.metadata.namespace.as_deref().unwrap_or("default") == pod.namespace
            && b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| label_selector_matches(s, &pod.labels))
    })
}

/// Whether budget `b` selects `pod`.
pub(crate) fn covers(b: &Arc<PodDisruptionBudget>, pod: &PodRecord) -> bool {
    pdbs_covering(pod, std::slice::from_ref(b)).next().is_some()
}

/// What keeps one pod from moving, if anything.
pub fn pod_blocker(pod: &PodRecord, pdbs: &[Arc<PodDisruptionBudget>]) -> Option<Blocker> {
    let k = || pod.key();
    match pod.annotation(SAFE_TO_EVICT) {
        Some("false") => return Some(Blocker::NotSafeToEvict(k())),
        Some("true") => return None,
        _ => {}
    }
    if pod.controller.is_none() {
        return Some(Blocker::NotReplicated(k()));
    }
    if pod.namespace == "kube-system" && pdbs_covering(pod, pdbs).next().is_none() {
        return Some(Blocker::KubeSystemWithoutPdb(k()));
    }
    let local = pod.spec().volumes.iter().flatten().any(|v| {
        v.host_path.is_some()
            || v.empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
    });
    if local {
        return Some(Blocker::LocalStorage(k()));
    }
    None
}

/// Whether `node` can go: its blockers are checked in cluster-autoscaler's order, then the
/// utilisation, then whether every pod that would move fits on `others` (those whose index
/// `skip` does not leave out), placed greedily so two pods are never both counted into the same
/// free room. `Ok` carries where each pod would go: its key and the index in `others`. `others`
/// is not copied: only the nodes that take a pod are, so a pass over a large cluster costs the
/// fit checks, not the cluster's size in copies.
pub fn removable(
    node: &NodeState,
    node_annotations: &BTreeMap<String, String>,
    others: &[NodeState],
    skip: impl Fn(usize) -> bool,
    pdbs: &[Arc<PodDisruptionBudget>],
    threshold: f64,
    cluster: Option<&Cluster>,
) -> Result<Vec<(String, usize)>, Blocker> {
    removable_hinted(
        node,
        node_annotations,
        others,
        skip,
        pdbs,
        threshold,
        cluster,
        &mut Hints::default(),
    )
}

/// Where a pass's simulations may start looking for a pod's destination: per pod shape and
/// labels, the first of `others` that did not refuse it on its own account (selector, taints,
/// ports, anti-affinity, resources). `others` only fills up during a pass, so a node that
/// refused a pod refuses every pod alike after it; a pinned pod then does not scan the cluster
/// again for every candidate. Refusals by spread or affinity never move it (they may not last).
/// Alike: the same shared spec and labels, in the same namespace (others' anti-affinity terms
/// select by namespace).
#[derive(Debug, Default)]
pub struct Hints(rustc_hash::FxHashMap<(usize, usize), (String, usize)>);

impl Hints {
    fn key(pod: &PodRecord) -> (usize, usize) {
        (
            Arc::as_ptr(&pod.shape) as usize,
            Arc::as_ptr(&pod.labels) as usize,
        )
    }
}

/// [`removable`], starting each pod's search where `hints` says (valid while `others` only
/// fills up: one pass of [`super::unneeded::unneeded`]).
#[allow(clippy::too_many_arguments)]
pub fn removable_hinted(
    node: &NodeState,
    node_annotations: &BTreeMap<String, String>,
    others: &[NodeState],
    skip: impl Fn(usize) -> bool,
    pdbs: &[Arc<PodDisruptionBudget>],
    threshold: f64,
    cluster: Option<&Cluster>,
    hints: &mut Hints,
) -> Result<Vec<(String, usize)>, Blocker> {
    if node_annotations
        .get(SCALE_DOWN_DISABLED)
        .map(String::as_str)
        == Some("true")
    {
        return Err(Blocker::ScaleDownDisabled);
    }
    let mut moving = pods_to_move(node);
    largest_first(&mut moving);
    for p in &moving {
        if let Some(b) = pod_blocker(p, pdbs) {
            return Err(b);
        }
    }
    // Each budget allows `disruptionsAllowed` evictions; this node's pods under it must not
    // need more.
    for b in pdbs {
        let allowed = b.status.as_ref().map_or(0, |s| s.disruptions_allowed);
        let here = moving
            .iter()
            .filter(|p| pdbs_covering(p, std::slice::from_ref(b)).next().is_some())
            .count() as i32;
        if here > allowed {
            return Err(Blocker::PdbViolated {
                pdb: format!(
                    "{}/{}",
                    b.metadata.namespace.as_deref().unwrap_or("default"),
                    b.metadata.name.as_deref().unwrap_or("")
                ),
            });
        }
    }
    if moving.is_empty() {
        return Ok(Vec::new());
    }
    let u = utilization(node);
    if u >= threshold {
        return Err(Blocker::Utilized((u * 100.0).round() as u32));
    }
    place_greedily(&moving, others, skip, cluster, hints)
}

/// Where each of `moving` would go on `others` (those whose index `skip` does not leave out),
/// placed greedily in the order given so two pods are never both counted into the same free
/// room: `namespace/name` and the index in `others`, or the first pod that fits nowhere. Spread
/// and affinity are counted over `cluster` without the nodes `skip` leaves out. `hints` as
/// [`removable_hinted`] keeps them.
pub fn place_greedily(
    moving: &[Arc<PodRecord>],
    others: &[NodeState],
    skip: impl Fn(usize) -> bool,
    cluster: Option<&Cluster>,
    hints: &mut Hints,
) -> Result<Vec<(String, usize)>, Blocker> {
    let moving = prepare(moving);
    let mut topology = match cluster {
        Some(c) => Topology::over(&moving, c, &skip, &[]),
        None => Topology::default(),
    };
    // Copies of the destinations that took a pod in this simulation, by index in `others`.
    let mut taken: rustc_hash::FxHashMap<usize, NodeState> = Default::default();
    let mut plan = Vec::new();
    for p in moving {
        let key = Hints::key(&p.pod);
        let from = match hints.0.get(&key) {
            Some((ns, from)) if *ns == p.pod.namespace => *from,
            _ => 0,
        };
        // The first node that does not refuse the pod as it stands (before this simulation).
        let mut first_open = None;
        let dest = others.iter().enumerate().skip(from).find(|(i, n)| {
            if n.fits(&p.pod).is_err() {
                return false;
            }
            first_open.get_or_insert(*i);
            if skip(*i) {
                return false;
            }
            // A copy this simulation already placed pods on must still take it.
            let n = match taken.get(i) {
                Some(copy) if copy.fits(&p.pod).is_err() => return false,
                Some(copy) => copy,
                None => n,
            };
            topology.fits(p.class, n).is_ok()
        });
        hints.0.insert(
            key,
            (p.pod.namespace.clone(), first_open.unwrap_or(others.len())),
        );
        match dest {
            Some((i, n)) => {
                plan.push((p.key, i));
                let n = taken.entry(i).or_insert_with(|| n.clone());
                n.place(p.pod.clone());
                topology.placed(p.class, n);
            }
            None => return Err(Blocker::NoPlaceFor(p.key)),
        }
    }
    Ok(plan)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::pods::fit::Resources;
    use serde_json::json;

    fn node(name: &str, cpu: i128) -> NodeState {
        NodeState::new(
            name,
            BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]),
            Vec::new(),
            Resources::from([
                ("cpu".into(), cpu),
                ("memory".into(), 16i128 * (1 << 30) * 1000),
                ("pods".into(), 110_000),
            ]),
        )
    }

    fn pod(
        name: &str,
        cpu: &str,
        meta: serde_json::Value,
        spec: serde_json::Value,
    ) -> Arc<PodRecord> {
        let mut m = json!({"name": name, "namespace": "default", "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]});
        for (k, v) in meta.as_object().unwrap() {
            m[k] = v.clone();
        }
        let mut s = json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({"metadata": m, "spec": s})).unwrap(),
        ))
    }

    fn on(mut n: NodeState, pods: Vec<Arc<PodRecord>>) -> NodeState {
        for p in pods {
            n.place(p);
        }
        n
    }

    /// A budget over `app: web` pods with `allowed` disruptions left (also `recheck`'s tests').
    pub(in crate::pods) fn pdb(allowed: i32) -> Arc<PodDisruptionBudget> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2},
            }))
            .unwrap(),
        )
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    #[test]
    fn an_underused_node_whose_pods_fit_elsewhere_can_go_and_says_where_they_would_go() {
        let n = on(node("a", 4000), vec![pod("p1", "1", json!({}), json!({}))]);
        let plan = removable(
            &n,
            &none(),
            &[node("b", 4000)],
            |_| false,
            &[],
            UTILIZATION_THRESHOLD,
            None,
        )
        .unwrap();
        assert_eq!(
            plan,
            [("default/p1".to_string(), 0)],
            "onto b, the first of the others"
        );
    }

    #[test]
    fn a_node_at_or_above_the_threshold_stays() {
        let n = on(node("a", 4000), vec![pod("p1", "2", json!({}), json!({}))]);
        assert_eq!(
            removable(
                &n,
                &none(),
                &[node("b", 4000)],
                |_| false,
                &[],
                UTILIZATION_THRESHOLD,
                None
            ),
            Err(Blocker::Utilized(50))
        );
    }

    #[test]
    fn pods_that_would_move_are_placed_without_double_counting_free_room() {
        // Two 1.5-cpu pods, one 2-cpu node elsewhere: the first fits, the second does not.
        let n = on(
            node("a", 8000),
            vec![
                pod("p1", "1500m", json!({}), json!({})),
                pod("p2", "1500m", json!({}), json!({})),
            ],
        );
        assert_eq!(
            removable(
                &n,
                &none(),
                &[node("b", 2000)],
                |_| false,
                &[],
                UTILIZATION_THRESHOLD,
                None
            ),
            Err(Blocker::NoPlaceFor("default/p2".into()))
        );
    }

    #[test]
    fn an_empty_node_goes_even_with_daemonset_and_mirror_pods_on_it() {
        let ds = pod(
            "ds",
            "3",
            json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]}),
            json!({}),
        );
        let mirror = pod(
            "static",
            "100m",
            json!({"annotations": {"kubernetes.io/config.mirror": "x"}, "ownerReferences": []}),
            json!({}),
        );
        let n = on(node("a", 4000), vec![ds, mirror]);
        assert_eq!(
            removable(
                &n,
                &none(),
                &[],
                |_| false,
                &[],
                UTILIZATION_THRESHOLD,
                None
            ),
            Ok(vec![])
        );
    }

    /// cluster-autoscaler's blockers, by name, each alone on an otherwise removable node.
    #[test]
    fn what_blocks_a_node_is_what_blocks_it_in_cluster_autoscaler() {
        let elsewhere = [node("b", 4000)];
        let blocked = |p: Arc<PodRecord>, pdbs: &[Arc<PodDisruptionBudget>]| {
            removable(
                &on(node("a", 4000), vec![p]),
                &none(),
                &elsewhere,
                |_| false,
                pdbs,
                UTILIZATION_THRESHOLD,
                None,
            )
            .unwrap_err()
        };
        assert!(matches!(
            blocked(
                pod(
                    "p",
                    "1",
                    json!({"annotations": {SAFE_TO_EVICT: "false"}}),
                    json!({})
                ),
                &[]
            ),
            Blocker::NotSafeToEvict(_)
        ));
        assert!(matches!(
            blocked(
                pod("p", "1", json!({"ownerReferences": []}), json!({})),
                &[]
            ),
            Blocker::NotReplicated(_)
        ));
        assert!(matches!(
            blocked(
                pod("p", "1", json!({"namespace": "kube-system"}), json!({})),
                &[]
            ),
            Blocker::KubeSystemWithoutPdb(_)
        ));
        assert!(matches!(
            blocked(
                pod(
                    "p",
                    "1",
                    json!({}),
                    json!({"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]})
                ),
                &[]
            ),
            Blocker::LocalStorage(_)
        ));
        assert!(matches!(
            blocked(
                pod(
                    "p",
                    "1",
                    json!({}),
                    json!({"volumes": [{"name": "v", "emptyDir": {}}]})
                ),
                &[]
            ),
            Blocker::LocalStorage(_)
        ));
        assert!(matches!(
            blocked(pod("p", "1", json!({}), json!({})), &[pdb(0)]),
            Blocker::PdbViolated { .. }
        ));
        // Not blockers: an in-memory emptyDir, a PDB with room, safe-to-evict "true".
        let ok = |p: Arc<PodRecord>, pdbs: &[Arc<PodDisruptionBudget>]| {
            removable(
                &on(node("a", 4000), vec![p]),
                &none(),
                &elsewhere,
                |_| false,
                pdbs,
                UTILIZATION_THRESHOLD,
                None,
            )
            .is_ok()
        };
        assert!(ok(
            pod(
                "p",
                "1",
                json!({}),
                json!({"volumes": [{"name": "v", "emptyDir": {"medium": "Memory"}}]})
            ),
            &[]
        ));
        assert!(ok(pod("p", "1", json!({}), json!({})), &[pdb(1)]));
        assert!(ok(
            pod(
                "p",
                "1",
                json!({"ownerReferences": [], "annotations": {SAFE_TO_EVICT: "true"}}),
                json!({"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]})
            ),
            &[]
        ));
        // The node annotation.
        let ann = BTreeMap::from([(SCALE_DOWN_DISABLED.to_string(), "true".to_string())]);
        assert_eq!(
            removable(
                &node("a", 4000),
                &ann,
                &[],
                |_| false,
                &[],
                UTILIZATION_THRESHOLD,
                None
            ),
            Err(Blocker::ScaleDownDisabled)
        );
    }

    #[test]
    fn a_budget_counts_every_pod_of_the_node_it_covers() {
        let n = on(
            node("a", 8000),
            vec![
                pod("p1", "500m", json!({}), json!({})),
                pod("p2", "500m", json!({}), json!({})),
            ],
        );
        assert!(matches!(
            removable(
                &n,
                &none(),
                &[node("b", 4000)],
                |_| false,
                &[pdb(1)],
                UTILIZATION_THRESHOLD,
                None
            ),
            Err(Blocker::PdbViolated { .. })
        ));
        assert!(removable(
            &n,
            &none(),
            &[node("b", 4000)],
            |_| false,
            &[pdb(2)],
            UTILIZATION_THRESHOLD,
            None
        )
        .is_ok());
    }
}
