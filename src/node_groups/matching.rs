//! Which nodes are a group's own (cluster-autoscaler's `NodeGroupForNode`), written once for
//! both loops: a scale set's nodes by `spec.providerID` (resource group and scale-set name,
//! case-insensitive as ARM compares them), an AKS agent pool's nodes by the
//! `kubernetes.azure.com/agentpool` label. Pure code: no I/O, no clock.

use crate::config::{NodeGroupKind, NodeGroupSpec, Settings};
use crate::pods::record::NodeRecord;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Arc;

/// The label AKS puts on every node of an agent pool.
pub const AGENTPOOL_LABEL: &str = "kubernetes.azure.com/agentpool";

/// What backs a node group, for matching nodes to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// A scale set in this resource group: nodes match by `spec.providerID`.
    ScaleSet {
        /// Resource group (compared case-insensitively, as ARM does).
        resource_group: String,
        /// Scale-set name (compared case-insensitively).
        name: String,
    },
    /// An AKS agent pool: nodes match by the `kubernetes.azure.com/agentpool` label.
    AgentPool {
        /// Pool name.
        pool: String,
    },
}

/// How `g`'s nodes are recognised.
pub fn backing(settings: &Settings, g: &NodeGroupSpec) -> Backing {
    match &g.kind {
        NodeGroupKind::Vmss => Backing::ScaleSet {
            resource_group: g
                .resource_group
                .clone()
                .unwrap_or_else(|| settings.azure.resource_group.clone()),
            name: g.name.clone(),
        },
        NodeGroupKind::AksAgentPool { .. } => Backing::AgentPool {
            pool: g.name.clone(),
        },
    }
}

pub use crate::pods::record::{parse_provider_id, scale_set_key};

/// Finds a node's group: scale sets by `resource group/name` in lower case, pools by name.
pub struct GroupIndex {
    scale_sets: rustc_hash::FxHashMap<String, usize>,
    pools: rustc_hash::FxHashMap<String, usize>,
}

impl GroupIndex {
    /// The index of groups backed by `backings`, in that order.
    pub fn of_backings<'b>(backings: impl IntoIterator<Item = &'b Backing>) -> Self {
        let mut scale_sets = rustc_hash::FxHashMap::default();
        let mut pools = rustc_hash::FxHashMap::default();
        for (i, backing) in backings.into_iter().enumerate() {
            match backing {
                Backing::ScaleSet {
                    resource_group,
                    name,
                } => {
                    scale_sets
                        .entry(scale_set_key(resource_group, name))
                        .or_insert(i);
                }
                Backing::AgentPool { pool } => {
                    pools.entry(pool.clone()).or_insert(i);
                }
            }
        }
        Self { scale_sets, pools }
    }

    /// The index of `node`'s group, if it is in one.
    pub fn group_of(&self, node: &NodeRecord) -> Option<usize> {
        let by_id = node
            .scale_set_key()
            .and_then(|key| self.scale_sets.get(key).copied());
        by_id.or_else(|| {
            let pool = node.labels.get(AGENTPOOL_LABEL)?;
            self.pools.get(pool).copied()
        })
    }
}

/// Registered nodes per group: `groups` as (name, backing), in index order.
pub fn registered_per_group<'g>(
    nodes: &[Arc<NodeRecord>],
    groups: impl IntoIterator<Item = (&'g str, &'g Backing)> + Clone,
) -> HashMap<String, u32> {
    let index = GroupIndex::of_backings(groups.clone().into_iter().map(|(_, b)| b));
    let names: Vec<&str> = groups.into_iter().map(|(n, _)| n).collect();
    let mut out = HashMap::new();
    for n in nodes {
        if let Some(i) = index.group_of(n) {
            *out.entry(names[i].to_string()).or_default() += 1;
        }
    }
    out
}

/// A Ready node.
pub fn is_ready(node: &NodeRecord) -> bool {
    node.ready
}

/// A registered node still booting: not Ready, and created less than `window` before `now`
/// (cluster-autoscaler's "not started" nodes). It offers no room yet but is on its way, so it
/// counts as upcoming; an older node that is not Ready is broken, not coming.
pub fn is_starting(node: &NodeRecord, now: Timestamp, window: std::time::Duration) -> bool {
    if node.ready {
        return false;
    }
    let Some(created) = node.created else {
        return false;
    };
    let age = now.duration_since(created);
    age.is_negative() || age.unsigned_abs() < window
}

/// Nodes that are not Ready and past their startup window `window` (not booting: broken or
/// lost), by name: cluster-autoscaler's "unready" nodes.
pub fn unready_nodes(
    nodes: &[std::sync::Arc<NodeRecord>],
    now: Timestamp,
    window: std::time::Duration,
) -> std::collections::HashSet<String> {
    nodes
        .iter()
        .filter(|n| !n.ready && !is_starting(n, now, window))
        .map(|n| n.name.clone())
        .collect()
}

/// Why the cluster is too unhealthy to scale down, if it is: cluster-autoscaler's rule, more
/// than `ok_count` unready nodes *and* more than `max_percent` % of all nodes unready
/// (`--ok-total-unready-count`, `--max-total-unready-percentage`). Scale-up goes on: pods still
/// need room, and unready nodes offer none.
pub fn too_many_unready(
    unready: usize,
    total: usize,
    ok_count: u32,
    max_percent: f64,
) -> Option<String> {
    let over_count = unready > ok_count as usize;
    let over_share = unready as f64 > max_percent / 100.0 * total as f64;
    (over_count && over_share).then(|| {
        format!(
            "{unready} of {total} nodes are unready: more than okTotalUnreadyCount ({ok_count}) and maxTotalUnreadyPercentage ({max_percent}%)"
        )
    })
}

/// Not cordoned.
pub fn schedulable(node: &NodeRecord) -> bool {
    !node.unschedulable
}
