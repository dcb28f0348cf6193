//! Soft taints, as cluster-autoscaler keeps them (`UpdateSoftDeletionTaints`): the nodes
//! scale-down would remove carry a `PreferNoSchedule` taint
//! ([`crate::kube::nodes::DELETION_CANDIDATE_TAINT`]), so kube-scheduler, whose default profile
//! weighs `TaintToleration` three times its least-allocated score, places new pods on other
//! nodes first. Without it the emptiest nodes, exactly the ones about to go, are where the
//! scheduler sends the next pods: a node refilled after it was found unneeded is evicted from
//! later, or kept. Nothing is filtered by a soft taint: a pod that fits nowhere else still lands.
//!
//! This module decides the writes of one pass; the scale-down loop sends them
//! (`autoscale::scale_down`), each a read and a guarded patch. Pure.

use crate::kube::nodes::{has_our_taint_record, has_soft_taint_record};
use crate::node_groups::GroupIndex;
use crate::pods::record::NodeRecord;
use crate::pods::unneeded::DownGroup;
use std::collections::HashSet;
use std::sync::Arc;

/// One node write: add (`on`) or remove the soft taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftTaintWrite {
    /// The node.
    pub node: String,
    /// Add (`true`) or remove.
    pub on: bool,
}

/// The writes of one pass, in cluster-autoscaler's order: first the soft taint comes off the
/// nodes of the groups this controller writes that carry it and are no longer `candidates`, then
/// it goes on the candidates that lack it; at most `max` writes in all (its
/// `--max-bulk-soft-taint-count`: the rest wait for a later pass), each part in node order. A
/// node being removed (our `NoSchedule` taint on it) is left as it is either way.
pub fn plan(
    groups: &[DownGroup],
    nodes: &[Arc<NodeRecord>],
    candidates: &HashSet<&str>,
    max: usize,
) -> Vec<SoftTaintWrite> {
    let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
    let ours = |n: &NodeRecord| {
        index
            .group_of(n)
            .is_some_and(|g| groups[g].refused.is_none())
    };
    let mut sorted: Vec<&Arc<NodeRecord>> = nodes
        .iter()
        .filter(|n| ours(n) && !has_our_taint_record(n))
        .collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let off = sorted
        .iter()
        .filter(|n| has_soft_taint_record(n) && !candidates.contains(n.name.as_str()))
        .map(|n| SoftTaintWrite {
            node: n.name.clone(),
            on: false,
        });
    let on = sorted
        .iter()
        .filter(|n| !has_soft_taint_record(n) && candidates.contains(n.name.as_str()))
        .map(|n| SoftTaintWrite {
            node: n.name.clone(),
            on: true,
        });
    off.chain(on).take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::nodes::{DELETION_CANDIDATE_TAINT, TO_BE_DELETED_TAINT};
    use crate::node_groups::Backing;
    use serde_json::json;

    fn group(name: &str) -> DownGroup {
        DownGroup {
            name: name.into(),
            backing: Backing::ScaleSet {
                name: name.into(),
                resource_group: "rg".into(),
            },
            floor: 0,
            size: Some(5),
            deleting: 0,
            recently_grown: false,
            grown_ago: None,
            refused: None,
        }
    }

    fn node(name: &str, set: &str, taints: &[&str]) -> Arc<NodeRecord> {
        let taints: Vec<serde_json::Value> = taints
            .iter()
            .map(|k| {
                let effect = if *k == TO_BE_DELETED_TAINT {
                    "NoSchedule"
                } else {
                    "PreferNoSchedule"
                };
                json!({"key": k, "value": "1", "effect": effect})
            })
            .collect();
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "resourceVersion": "7"},
                "spec": {
                    "providerID": format!("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/{set}/virtualMachines/0"),
                    "taints": taints,
                },
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn the_taint_comes_off_needed_nodes_first_then_goes_on_candidates_within_the_count() {
        let groups = [group("a")];
        let nodes = [
            node("n4", "a", &[]),
            node("n1", "a", &[DELETION_CANDIDATE_TAINT]),
            node("n2", "a", &[]),
            node("n3", "a", &[]),
            node("n0", "a", &[DELETION_CANDIDATE_TAINT]),
        ];
        let candidates: HashSet<&str> = ["n0", "n2", "n3", "n4"].into();
        let w = plan(&groups, &nodes, &candidates, 10);
        let got: Vec<(&str, bool)> = w.iter().map(|w| (w.node.as_str(), w.on)).collect();
        assert_eq!(
            got,
            [("n1", false), ("n2", true), ("n3", true), ("n4", true)],
            "n0 keeps its taint: written once"
        );
        let w = plan(&groups, &nodes, &candidates, 2);
        let got: Vec<(&str, bool)> = w.iter().map(|w| (w.node.as_str(), w.on)).collect();
        assert_eq!(got, [("n1", false), ("n2", true)]);
        assert!(plan(&groups, &nodes, &candidates, 0).is_empty());
    }

    #[test]
    fn nodes_being_removed_and_nodes_of_other_or_refused_groups_are_left_alone() {
        let mut refused = group("aks");
        refused.refused = Some(crate::hold::WriteRefusal::AksAutoscaler);
        let groups = [group("a"), refused];
        let nodes = [
            node("deleting", "a", &[TO_BE_DELETED_TAINT]),
            node(
                "deleting-soft",
                "a",
                &[TO_BE_DELETED_TAINT, DELETION_CANDIDATE_TAINT],
            ),
            node("foreign", "other", &[DELETION_CANDIDATE_TAINT]),
            node("pool", "aks", &[]),
        ];
        let candidates: HashSet<&str> = ["deleting", "pool"].into();
        assert_eq!(plan(&groups, &nodes, &candidates, 10), []);
    }
}
