//! Deletion-cost hints (`consolidation.deletionCostHints`): the ReplicaSet controller deletes the
//! pods with the lowest `controller.kubernetes.io/pod-deletion-cost` first when a Deployment
//! scales in (beta and on since Kubernetes 1.22). The controller gives the pods of its best
//! consolidation candidates (Karpenter's order: the most saved per unit of disruption first) a
//! cost below zero, the first candidate's lowest, so a scale-in empties those nodes, which then
//! go as empty nodes with no eviction at all, instead of thinning every node a little
//! (unhinted, the controller's ranking deletes pods doubled up on a node first, which spreads
//! what stays).
//!
//! Only pods a ReplicaSet controls are hinted (the cost orders nothing else), never one whose
//! cost somebody else set: a hint carries [`HINT_ANNOTATION`] with the same value, and a pod
//! whose cost differs from its mark is the user's. Hints of nodes that left the first ranks are
//! taken back. The writes carry the pod's `resourceVersion`: a pod changed since it was read is
//! a 409 and is looked at again at the next decision, never overwritten. Consolidation's own
//! disruption cost ignores its hints ([`own_hint`]).

use super::index::PodIndex;
use super::record::{PodRecord, POD_DELETION_COST};
use std::collections::BTreeMap;

/// The mark of a hint: the cost the controller set. A pod whose cost equals its mark carries
/// the controller's hint; any other cost is somebody else's.
pub const HINT_ANNOTATION: &str = "vmss-capacity-controller/pod-deletion-cost";

/// At most this many pods are written per decision (the rest at the next ones).
pub const MAX_HINT_WRITES: usize = 100;

/// One pod's annotations to change, guarded by its `resourceVersion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintWrite {
    /// The pod's namespace.
    pub namespace: String,
    /// Its name.
    pub pod: String,
    /// The `resourceVersion` it was read at (the write's precondition).
    pub resource_version: String,
    /// The annotations to set (`Some`) or remove (`None`).
    pub annotations: BTreeMap<String, Option<String>>,
}

impl HintWrite {
    /// Whether the write sets a hint (rather than taking one back).
    pub fn sets(&self) -> bool {
        self.annotations
            .get(POD_DELETION_COST)
            .is_some_and(Option::is_some)
    }
}

/// The cost the controller set on `pod`, when the pod carries its hint (its cost equals its
/// mark).
pub fn own_hint(pod: &PodRecord) -> Option<i32> {
    let mark = pod.annotation(HINT_ANNOTATION)?;
    (pod.annotation(POD_DELETION_COST) == Some(mark))
        .then(|| mark.trim().parse().ok())
        .flatten()
}

/// The hint for a pod on the node at `rank` (0: the best candidate) of `nodes` hinted: from
/// `-nodes` to `-1`, the first candidate's pods deleted first.
fn cost_at(rank: usize, nodes: usize) -> i32 {
    let n = i32::try_from(nodes).unwrap_or(i32::MAX);
    i32::try_from(rank).unwrap_or(i32::MAX).saturating_sub(n)
}

/// Whether a hint may be written on `pod`: a ReplicaSet's, not going away, with a version to
/// guard the write, and no cost of somebody else's.
fn hintable(pod: &PodRecord) -> bool {
    pod.controller
        .as_ref()
        .is_some_and(|c| c.kind == "ReplicaSet")
        && !pod.terminating
        && !pod.finished()
        && pod
            .resource_version
            .as_deref()
            .is_some_and(|v| !v.is_empty())
        && (pod.annotation(POD_DELETION_COST).is_none() || own_hint(pod).is_some())
}

/// The writes that bring the hints to `order` (node names, the best consolidation candidate
/// first): the pods of its first `nodes` nodes carry their rank's cost, no other pod carries a
/// hint. At most `max_writes`, the hints to set first, then the ones to take back.
pub fn plan(order: &[&str], pods: &PodIndex, nodes: usize, max_writes: usize) -> Vec<HintWrite> {
    let mut want: BTreeMap<(&str, &str), i32> = BTreeMap::new();
    let mut set = Vec::new();
    for (rank, node) in order.iter().take(nodes).enumerate() {
        let cost = cost_at(rank, nodes);
        let Some(placed) = pods.bound(node) else {
            continue;
        };
        for p in placed.pods().iter().filter(|p| hintable(p)) {
            want.insert((p.namespace.as_str(), p.name.as_str()), cost);
            if own_hint(p) == Some(cost) {
                continue;
            }
            let value = Some(cost.to_string());
            set.push(write(
                p,
                [(POD_DELETION_COST, value.clone()), (HINT_ANNOTATION, value)],
            ));
        }
    }
    let mut clear = Vec::new();
    for p in pods.all() {
        if p.annotation(HINT_ANNOTATION).is_none()
            || want.contains_key(&(p.namespace.as_str(), p.name.as_str()))
            || p.terminating
            || p.resource_version.as_deref().is_none_or(str::is_empty)
        {
            continue;
        }
        // The mark goes in any case; the cost only when it is still ours.
        let cost = own_hint(p).map(|_| (POD_DELETION_COST, None));
        clear.push(write(p, cost.into_iter().chain([(HINT_ANNOTATION, None)])));
    }
    clear.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    set.into_iter().chain(clear).take(max_writes).collect()
}

fn write<'a>(
    pod: &PodRecord,
    annotations: impl IntoIterator<Item = (&'a str, Option<String>)>,
) -> HintWrite {
    HintWrite {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        resource_version: pod.resource_version.clone().unwrap_or_default(),
        annotations: annotations
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn pod(name: &str, node: &str, kind: &str, annotations: serde_json::Value) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                    "resourceVersion": "5", "annotations": annotations,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "web-1",
                        "uid": "rs", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        ))
    }

    fn costs(writes: &[HintWrite]) -> Vec<(String, Option<String>, Option<String>)> {
        writes
            .iter()
            .map(|w| {
                (
                    w.pod.clone(),
                    w.annotations.get(POD_DELETION_COST).cloned().flatten(),
                    w.annotations.get(HINT_ANNOTATION).cloned().flatten(),
                )
            })
            .collect()
    }

    #[test]
    fn the_best_candidates_pods_get_the_lowest_cost_and_other_nodes_pods_none() {
        let pods = PodIndex::of(&[
            pod("a", "n1", "ReplicaSet", json!({})),
            pod("b", "n2", "ReplicaSet", json!({})),
            pod("c", "n3", "ReplicaSet", json!({})),
            pod("d", "n2", "StatefulSet", json!({})),
        ]);
        let w = plan(&["n2", "n1", "n3"], &pods, 2, MAX_HINT_WRITES);
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            costs(&w),
            [
                ("b".into(), s("-2"), s("-2")),
                ("a".into(), s("-1"), s("-1")),
            ],
            "n2 first, then n1; n3 is past the hinted nodes; the StatefulSet's pod is not ordered by a cost"
        );
        assert!(w.iter().all(|w| w.resource_version == "5" && w.sets()));
    }

    #[test]
    fn a_cost_somebody_else_set_is_left_alone_and_a_hint_already_there_is_not_written_again() {
        let pods = PodIndex::of(&[
            pod(
                "users",
                "n1",
                "ReplicaSet",
                json!({POD_DELETION_COST: "100"}),
            ),
            pod(
                "ours",
                "n1",
                "ReplicaSet",
                json!({POD_DELETION_COST: "-1", HINT_ANNOTATION: "-1"}),
            ),
            pod(
                "changed",
                "n1",
                "ReplicaSet",
                json!({POD_DELETION_COST: "7", HINT_ANNOTATION: "-1"}),
            ),
        ]);
        let w = plan(&["n1"], &pods, 1, MAX_HINT_WRITES);
        // "changed": somebody set 7 over the hint; only the mark goes.
        assert_eq!(costs(&w), [("changed".into(), None, None)]);
        assert_eq!(
            w[0].annotations.keys().collect::<Vec<_>>(),
            [HINT_ANNOTATION],
            "the user's cost stays"
        );
    }

    #[test]
    fn hints_of_a_node_that_left_the_first_ranks_are_taken_back_after_the_new_ones_are_set() {
        let pods = PodIndex::of(&[
            pod(
                "old",
                "n1",
                "ReplicaSet",
                json!({POD_DELETION_COST: "-1", HINT_ANNOTATION: "-1"}),
            ),
            pod("new", "n2", "ReplicaSet", json!({})),
        ]);
        let w = plan(&["n2", "n1"], &pods, 1, MAX_HINT_WRITES);
        assert_eq!(
            costs(&w),
            [
                ("new".into(), Some("-1".into()), Some("-1".into())),
                ("old".into(), None, None)
            ]
        );
        assert!(!w[1].sets());
        assert_eq!(w[1].annotations.len(), 2, "both the cost and the mark go");
        assert_eq!(plan(&["n2", "n1"], &pods, 1, 1).len(), 1, "bounded");
        // Hints off (no node hinted): every hint is taken back.
        assert_eq!(
            costs(&plan(&["n2"], &pods, 0, 10)),
            [("old".into(), None, None)]
        );
    }

    #[test]
    fn consolidation_reads_its_own_hint_as_no_cost() {
        let ours = pod(
            "a",
            "n1",
            "ReplicaSet",
            json!({POD_DELETION_COST: "-3", HINT_ANNOTATION: "-3"}),
        );
        assert_eq!(own_hint(&ours), Some(-3));
        let users = pod("b", "n1", "ReplicaSet", json!({POD_DELETION_COST: "-3"}));
        assert_eq!(own_hint(&users), None);
    }
}
