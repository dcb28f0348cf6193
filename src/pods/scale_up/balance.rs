//! Balancing a scale-up over similar groups (`balanceSimilarNodeGroups`), as cluster-autoscaler
//! judges "similar" and shares the new nodes out.

use super::GroupInput;
use crate::pods::fit::NodeState;
use std::collections::BTreeMap;

/// Labels that may differ between similar groups (cluster-autoscaler's ignored labels for
/// `--balance-similar-node-groups`, with Azure's): the node's own name, its zone, its pool.
pub const BALANCE_IGNORED_LABELS: [&str; 8] = [
    "kubernetes.io/hostname",
    crate::pods::template::ZONE_LABEL,
    crate::pods::template::DISK_ZONE_LABEL,
    "failure-domain.beta.kubernetes.io/zone",
    crate::node_groups::AGENTPOOL_LABEL,
    "agentpool",
    "kubernetes.azure.com/node-image-version",
    "kubernetes.azure.com/nodepool-type",
];

/// cluster-autoscaler's allocatable tolerance for similar groups (`MaxAllocatableDifferenceRatio`).
const BALANCE_ALLOCATABLE_RATIO: f64 = 0.05;

/// Whether two groups' new nodes are alike enough to balance a scale-up between them, as
/// cluster-autoscaler judges it: cpu and memory allocatable within 5 % of each other, every other
/// resource equal, the same labels apart from [`BALANCE_IGNORED_LABELS`], the same taints.
pub fn similar(a: &NodeState, b: &NodeState) -> bool {
    let near = |r: &str| {
        let (x, y) = (
            a.allocatable.get(r).copied().unwrap_or(0) as f64,
            b.allocatable.get(r).copied().unwrap_or(0) as f64,
        );
        (x - y).abs() <= BALANCE_ALLOCATABLE_RATIO * x.max(y)
    };
    let tolerant = ["cpu", "memory", "ephemeral-storage"];
    let exact = |x: &NodeState, y: &NodeState| {
        x.allocatable
            .iter()
            .filter(|(k, _)| !tolerant.contains(k))
            .all(|(k, v)| y.allocatable.get(k) == Some(&v))
    };
    let labels = |n: &NodeState| -> BTreeMap<String, String> {
        n.labels
            .iter()
            .filter(|(k, _)| !BALANCE_IGNORED_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let taints = |n: &NodeState| {
        let mut t: Vec<(String, Option<String>, String)> = n
            .taints
            .iter()
            .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
            .collect();
        t.sort();
        t
    };
    near("cpu")
        && near("memory")
        && exact(a, b)
        && exact(b, a)
        && labels(a) == labels(b)
        && taints(a) == taints(b)
}

/// cluster-autoscaler's balancing: `new_nodes` spread over `members` (indices into `groups`, the
/// expander's choice first) one at a time to the smallest group below its max, so their sizes
/// end as equal as their maxes allow. Returns each member's share (zero shares left out).
pub(super) fn balance(
    new_nodes: u32,
    members: &[usize],
    groups: &[GroupInput],
    added: &[u32],
) -> Vec<(usize, u32)> {
    let size = |m: usize| groups[m].capacity.unwrap_or(0).max(0) + i64::from(added[m]);
    let mut sizes: Vec<i64> = members.iter().map(|&m| size(m)).collect();
    for _ in 0..new_nodes {
        let Some(k) = (0..members.len())
            .filter(|&k| sizes[k] < i64::from(groups[members[k]].max))
            .min_by_key(|&k| (sizes[k], k))
        else {
            break;
        };
        sizes[k] += 1;
    }
    members
        .iter()
        .zip(sizes)
        .filter_map(|(&m, s)| {
            let share = u32::try_from(s - size(m)).unwrap_or(0);
            (share > 0).then_some((m, share))
        })
        .collect()
}
