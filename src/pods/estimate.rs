//! How many nodes a node group needs for a set of pending pods: first-fit-decreasing bin packing
//! (cluster-autoscaler's binpacking estimator), first onto the nodes already requested but not
//! registered yet (capacity written minus nodes that exist: a pod is never counted twice), then
//! onto new nodes from the group's template, never beyond the group's max. Pure code.

use super::fit::{pod_requests, NodeState, Unfit};
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

/// What the estimator needs to know of one node group.
#[derive(Debug, Clone)]
pub struct GroupCapacity {
    /// Node-group name.
    pub name: String,
    /// A new node of this group, empty (allocatable minus what DaemonSets would place on it).
    pub template: NodeState,
    /// Capacity Azure has now (written or observed).
    pub capacity: u32,
    /// Nodes of the group registered in the cluster.
    pub registered: u32,
    /// The group's maximum size.
    pub max: u32,
}

impl GroupCapacity {
    /// Nodes requested but not registered yet: they will come empty and can take pods.
    pub fn upcoming(&self) -> u32 {
        self.capacity.saturating_sub(self.registered)
    }

    /// Room to grow before `max`.
    pub fn headroom(&self) -> u32 {
        self.max.saturating_sub(self.capacity)
    }
}

/// The estimate for one group.
#[derive(Debug, Clone)]
pub struct Estimate {
    /// Node-group name.
    pub group: String,
    /// New nodes to add (beyond the upcoming ones).
    pub new_nodes: u32,
    /// Pods that this plan places (on upcoming or new nodes), by `namespace/name`.
    pub placed: Vec<String>,
    /// Pods that cannot go to this group, with the reason (an empty template node refuses
    /// them, or the group is at its max).
    pub refused: Vec<(String, Refusal)>,
    /// The simulated new nodes with their pods (for waste, and for the expander).
    pub nodes: Vec<NodeState>,
}

/// Why a pod does not go to a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Even an empty node of the group cannot take it.
    DoesNotFit(Unfit),
    /// It would fit, but the group is at its max.
    AtMax,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::DoesNotFit(u) => u.fmt(f),
            Refusal::AtMax => f.write_str("node group at its max size"),
        }
    }
}

/// `namespace/name` of a pod.
pub fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pods in decreasing order of their largest share of the template's cpu or memory
/// (cluster-autoscaler sorts by a score of the same kind), ties by key for determinism.
fn decreasing(pods: &[Arc<Pod>], template: &NodeState) -> Vec<Arc<Pod>> {
    let share = |p: &Pod| -> f64 {
        let Some(spec) = &p.spec else { return 0.0 };
        let r = pod_requests(spec);
        ["cpu", "memory"]
            .iter()
            .map(|k| {
                let alloc = template.allocatable.get(*k).copied().unwrap_or(0);
                if alloc <= 0 {
                    0.0
                } else {
                    r.get(*k).copied().unwrap_or(0) as f64 / alloc as f64
                }
            })
            .fold(0.0, f64::max)
    };
    let mut v: Vec<(f64, String, Arc<Pod>)> = pods
        .iter()
        .map(|p| (share(p), pod_key(p), p.clone()))
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    v.into_iter().map(|(_, _, p)| p).collect()
}

/// First-fit decreasing for one group.
pub fn estimate(group: &GroupCapacity, pods: &[Arc<Pod>]) -> Estimate {
    let mut nodes: Vec<NodeState> = (0..group.upcoming())
        .map(|i| {
            let mut n = group.template.clone();
            n.name = format!("{}-upcoming-{i}", group.name);
            n
        })
        .collect();
    let upcoming = nodes.len();
    let mut out = Estimate {
        group: group.name.clone(),
        new_nodes: 0,
        placed: Vec::new(),
        refused: Vec::new(),
        nodes: Vec::new(),
    };
    for pod in decreasing(pods, &group.template) {
        let key = pod_key(&pod);
        if let Some(n) = nodes.iter_mut().find(|n| n.fits(&pod).is_ok()) {
            n.place(pod);
            out.placed.push(key);
            continue;
        }
        if let Err(why) = group.template.fits(&pod) {
            out.refused.push((key, Refusal::DoesNotFit(why)));
            continue;
        }
        if out.new_nodes >= group.headroom() {
            out.refused.push((key, Refusal::AtMax));
            continue;
        }
        let mut n = group.template.clone();
        n.name = format!("{}-new-{}", group.name, out.new_nodes);
        n.place(pod);
        nodes.push(n);
        out.new_nodes += 1;
        out.placed.push(key);
    }
    out.nodes = nodes.split_off(upcoming);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::fit::Resources;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn template(cpu_milli: i128, mem_gi: i128) -> NodeState {
        NodeState::new(
            "t",
            BTreeMap::new(),
            Vec::new(),
            Resources::from([
                ("cpu".into(), cpu_milli),
                ("memory".into(), mem_gi * (1 << 30) * 1000),
                ("pods".into(), 110_000),
            ]),
        )
    }

    fn pods(n: usize, cpu: &str, prefix: &str) -> Vec<Arc<Pod>> {
        (0..n)
            .map(|i| {
                Arc::new(
                    serde_json::from_value(json!({
                        "metadata": {"name": format!("{prefix}-{i}"), "namespace": "default"},
                        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                    }))
                    .unwrap(),
                )
            })
            .collect()
    }

    fn group(capacity: u32, registered: u32, max: u32) -> GroupCapacity {
        GroupCapacity {
            name: "g".into(),
            template: template(4000, 16),
            capacity,
            registered,
            max,
        }
    }

    #[test]
    fn pods_are_packed_first_fit_decreasing_onto_as_few_new_nodes_as_fit() {
        // 3 x 3 cpu and 3 x 1 cpu on 4-cpu nodes: FFD pairs each big pod with a small one.
        let mut p = pods(3, "3", "big");
        p.extend(pods(3, "1", "small"));
        let e = estimate(&group(2, 2, 10), &p);
        assert_eq!(e.new_nodes, 3);
        assert_eq!(e.placed.len(), 6);
        assert!(e.refused.is_empty());
    }

    #[test]
    fn nodes_already_requested_but_not_registered_take_pods_before_new_ones() {
        // Capacity 5 written, 3 nodes registered: 2 upcoming nodes already hold 2 pods each.
        let e = estimate(&group(5, 3, 10), &pods(6, "2", "p"));
        assert_eq!(
            e.new_nodes, 1,
            "4 pods on the 2 upcoming nodes, 2 on one new node"
        );
        assert_eq!(e.placed.len(), 6);
    }

    #[test]
    fn a_group_never_grows_beyond_its_max_and_says_so_per_pod() {
        let e = estimate(&group(9, 9, 10), &pods(3, "3", "p"));
        assert_eq!(e.new_nodes, 1);
        assert_eq!(e.refused.len(), 2);
        assert!(e.refused.iter().all(|(_, r)| *r == Refusal::AtMax));
    }

    #[test]
    fn a_pod_no_node_of_the_group_could_hold_is_refused_with_the_predicate() {
        let e = estimate(&group(1, 1, 10), &pods(1, "5", "huge"));
        assert_eq!(e.new_nodes, 0);
        assert_eq!(e.refused[0].1.to_string(), "Insufficient cpu");
    }

    #[test]
    fn a_thousand_pods_make_one_estimate_in_whole_nodes() {
        let e = estimate(&group(0, 0, 1000), &pods(1000, "500m", "burst"));
        assert_eq!(e.new_nodes, 125, "8 half-cpu pods per 4-cpu node");
        assert_eq!(e.placed.len(), 1000);
    }
}
