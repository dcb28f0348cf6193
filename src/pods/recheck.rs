//! The re-check of a node scale-down tainted, pure: after `nodeDeleteDelayAfterTaint`, no pod
//! landed that the decision did not see (cluster-autoscaler #3886), and the node is still
//! removable against the cluster as it is now. It judges by the rules [`super::unneeded`]
//! decided by, and both call the ones here: which pods still count on a node
//! ([`counts`]), which nodes take pods ([`takes_pods`]), which utilisation keeps a node
//! ([`threshold_for`]); the node itself is judged by [`super::scale_down::removable`]. Both
//! it and the question a drain asks between its rounds ([`room_left`]) first give the pending
//! pods the scheduler is about to place their room ([`reserve_pending`]).

use super::fit::NodeState;
use super::record::{NodeRecord, PodRecord};
use super::scale_down::{largest_first, moves, place_greedily, removable, still_to_move, Hints};
use super::topology::{Cluster, NamespaceLabels};
use super::volumes::Volumes;
use crate::node_groups::{is_ready, schedulable};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Whether `pod` still counts on its node for scale-down: a pod deleted long ago that no
/// kubelet confirms ([`PodRecord::long_terminating`]) neither moves, nor blocks, nor counts in
/// utilisation.
pub fn counts(pod: &PodRecord, now: k8s_openapi::jiff::Timestamp) -> bool {
    !pod.long_terminating(now)
}

/// Whether `node` takes the pods of a node that goes: Ready, schedulable and not being removed
/// (`busy`). The others still count for spread and affinity.
pub fn takes_pods(node: &NodeRecord, busy: &HashSet<String>) -> bool {
    !busy.contains(&node.name) && is_ready(node) && schedulable(node)
}

/// The utilisation at or above which a node stays: `configured`
/// (`scaleDown.utilizationThreshold`), but none for a node whose pods nobody serves (not Ready
/// past its startup window) or one consolidation chose (its decision has no threshold).
pub fn threshold_for(configured: f64, no_threshold: bool) -> f64 {
    if no_threshold {
        f64::INFINITY
    } else {
        configured
    }
}

/// What [`recheck`] looks at: the cluster as it is after the taint.
#[derive(Debug, Clone, Copy)]
pub struct Recheck<'a> {
    /// The tainted node.
    pub node: &'a NodeRecord,
    /// Uids (or `namespace/name` keys) of the pods that were to move when it was decided.
    pub planned: &'a [String],
    /// Every node (the tainted one among them or not).
    pub nodes: &'a [Arc<NodeRecord>],
    /// Every pod, wherever it is.
    pub pods: &'a [Arc<PodRecord>],
    /// PodDisruptionBudgets, with the status the disruption controller wrote.
    pub pdbs: &'a [Arc<PodDisruptionBudget>],
    /// Nodes being removed now (the tainted one among them): never destinations.
    pub busy: &'a HashSet<String>,
    /// What the tainted node's pods' claims ask of a destination.
    pub volumes: &'a Volumes,
    /// Namespaces' labels, for affinity terms that select namespaces by them.
    pub namespaces: &'a NamespaceLabels,
    /// `scaleDown.utilizationThreshold`.
    pub threshold: f64,
    /// Chosen as not Ready past its startup window: its utilisation does not keep it.
    pub unready: bool,
    /// Chosen by consolidation: its utilisation does not keep it.
    pub consolidation: bool,
    /// The wall clock, as the decisions read it.
    pub now: k8s_openapi::jiff::Timestamp,
}

/// `Ok` when the tainted node may still go: no pod on it that was not planned, and every pod
/// that moves still fits on the nodes that take pods once the pending pods have their room
/// ([`reserve_pending`]), no budget nor annotation forbidding it; else why not, for the node's
/// `ScaleDownFailed` Event.
pub fn recheck(input: &Recheck) -> Result<(), String> {
    let name = input.node.name.as_str();
    let world = World::of(input);
    let planned: HashSet<&str> = input.planned.iter().map(String::as_str).collect();
    let now_on: Vec<&Arc<PodRecord>> = world.on(name).filter(|p| moves(p)).collect();
    if let Some(p) = now_on
        .iter()
        .find(|p| !planned.contains(uid_or_key(p).as_str()))
    {
        return Err(format!(
            "pod {} landed on the node after it was chosen",
            p.key()
        ));
    }
    if now_on.is_empty() {
        return Ok(());
    }
    let state = NodeState::from_node(input.node, world.on(name));
    let (others, rest) = world.destinations(input);
    let topology = topology(input, state.pods(), &others, &rest);
    removable(
        &state,
        &input.node.annotations,
        &others,
        |_| false,
        input.pdbs,
        threshold_for(input.threshold, input.unready || input.consolidation),
        topology.as_ref(),
    )
    .map(|_| ())
    .map_err(|b| format!("no longer removable: {b}"))
}

/// `Ok` while the pods still on the tainted node ([`still_to_move`]: not those evicted already)
/// fit on the nodes that take pods once the pending pods, the evicted ones' replacements among
/// them, have their room ([`reserve_pending`]); else why not. A drain asks before each round
/// of evictions after the first: room the decision counted on can be taken while a budget
/// paces the drain (a new replica, another node's evicted pods), and a pod evicted then would
/// wait for a new node's boot. Budgets and utilisation are not asked again: the drain itself
/// is what holds the budget at zero.
pub fn room_left(input: &Recheck) -> Result<(), String> {
    let name = input.node.name.as_str();
    let world = World::of(input);
    let mut moving: Vec<Arc<PodRecord>> = world
        .on(name)
        .filter(|p| still_to_move(p))
        .cloned()
        .collect();
    if moving.is_empty() {
        return Ok(());
    }
    largest_first(&mut moving);
    let (others, rest) = world.destinations(input);
    let topology = topology(input, &moving, &others, &rest);
    place_greedily(
        &moving,
        &others,
        |_| false,
        topology.as_ref(),
        &mut Hints::default(),
    )
    .map(|_| ())
    .map_err(|b| format!("no room left for the pods still on the node: {b}"))
}

/// Reserves the room the scheduler is about to hand out: each pending pod it has not found
/// unschedulable (a new replica, an evicted pod's replacement), the largest first, placed on
/// its nominated node or else the first of `others` that takes it. The node's pods are then
/// not counted into room such a pod will take, as cluster-autoscaler's `FilterOutSchedulable`
/// places the schedulable pending pods before it simulates a scale-down. A pod that fits
/// nowhere waits for a scale-up and takes nothing here; one the scheduler marked
/// `Unschedulable` found no node with this room already.
pub fn reserve_pending(others: &mut [NodeState], pods: &[Arc<PodRecord>]) {
    let mut pending: Vec<Arc<PodRecord>> = pods
        .iter()
        .filter(|p| p.node_name.is_none() && !p.unschedulable)
        .filter(|p| moves(p) && !p.terminating && !p.finished())
        .cloned()
        .collect();
    largest_first(&mut pending);
    // Where each kind of pod (same shape and labels, same namespace) may start looking: the
    // nodes before it refused one alike, and they only fill up. A burst of thousands of alike
    // pods that fit nowhere then costs one scan of the nodes, not one per pod.
    let mut from: HashMap<(usize, usize, &str), usize> = HashMap::new();
    for p in &pending {
        let nominated = p
            .nominated_node
            .as_deref()
            .and_then(|n| others.iter().position(|o| o.name == n))
            .filter(|&i| others[i].fits(p).is_ok());
        if let Some(i) = nominated {
            others[i].place(p.clone());
            continue;
        }
        let key = (
            Arc::as_ptr(&p.shape) as usize,
            Arc::as_ptr(&p.labels) as usize,
            p.namespace.as_str(),
        );
        let start = from.get(&key).copied().unwrap_or(0);
        let found = others
            .iter()
            .skip(start)
            .position(|o| o.fits(p).is_ok())
            .map(|i| start + i);
        from.insert(key, found.unwrap_or(others.len()));
        if let Some(i) = found {
            others[i].place(p.clone());
        }
    }
}

/// The cluster as [`recheck`] and [`room_left`] read it: the pods that count, by node.
struct World<'a> {
    by_node: HashMap<&'a str, Vec<&'a Arc<PodRecord>>>,
}

impl<'a> World<'a> {
    fn of(input: &Recheck<'a>) -> Self {
        let mut by_node: HashMap<&str, Vec<&Arc<PodRecord>>> = HashMap::new();
        for p in input.pods.iter().filter(|p| counts(p, input.now)) {
            if let Some(n) = p.node_name.as_deref() {
                by_node.entry(n).or_default().push(p);
            }
        }
        Self { by_node }
    }

    fn on(&self, node: &str) -> impl Iterator<Item = &'a Arc<PodRecord>> + '_ {
        self.by_node.get(node).into_iter().flatten().copied()
    }

    /// The nodes that take pods, the pending pods' room reserved on them, and the nodes that
    /// take none (but the tainted node, whose pods are the ones moving): those still count for
    /// spread and affinity.
    fn destinations(&self, input: &Recheck<'a>) -> (Vec<NodeState>, Vec<NodeState>) {
        let name = input.node.name.as_str();
        let (others, rest): (Vec<_>, Vec<_>) = input
            .nodes
            .iter()
            .filter(|n| n.name != name)
            .map(|n| {
                let mut state = NodeState::from_node(n, self.on(&n.name));
                state.set_volume_limits(input.volumes.limits(&n.name));
                (takes_pods(n, input.busy), state)
            })
            .partition(|(room, _)| *room);
        let mut others: Vec<NodeState> = others.into_iter().map(|(_, n)| n).collect();
        let rest: Vec<NodeState> = rest.into_iter().map(|(_, n)| n).collect();
        reserve_pending(&mut others, input.pods);
        (others, rest)
    }
}

/// The cluster spread and affinity count over, when `moving` (or a pod already placed) has
/// rules that reach across nodes; none when nobody has.
fn topology<'c>(
    input: &Recheck<'c>,
    moving: &[Arc<PodRecord>],
    others: &'c [NodeState],
    rest: &'c [NodeState],
) -> Option<Cluster<'c>> {
    let cross_node = moving.iter().any(|p| {
        p.facts().has_cross_node_rules()
            || (!input.volumes.is_empty() && super::volumes::has_claims(p.spec()))
    }) || others
        .iter()
        .chain(rest)
        .flat_map(|n| n.pods())
        .any(|p| p.facts().has_remote_anti_affinity());
    cross_node.then(|| {
        Cluster::new(others.iter().chain(rest))
            .with_volumes(input.volumes)
            .with_namespaces(input.namespaces)
    })
}

/// How a planned pod is named in a removal: its uid, else `namespace/name`.
pub fn uid_or_key(p: &PodRecord) -> String {
    p.uid.clone().unwrap_or_else(|| p.key())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::scale_down::tests::pdb;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> Arc<NodeRecord> {
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "resourceVersion": "7", "labels": {"kubernetes.io/hostname": name}},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        ))
    }

    /// A ReplicaSet's pod (movable) of `cpu` on `node`.
    fn pod(name: &str, node: &str, cpu: &str) -> Arc<PodRecord> {
        owned(
            name,
            node,
            cpu,
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}),
        )
    }

    fn owned(name: &str, node: &str, cpu: &str, owner: serde_json::Value) -> Arc<PodRecord> {
        let owners = if owner.is_null() {
            json!([])
        } else {
            json!([owner])
        };
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                    "ownerReferences": owners},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            }))
            .unwrap(),
        ))
    }

    struct World {
        nodes: Vec<Arc<NodeRecord>>,
        pods: Vec<Arc<PodRecord>>,
        pdbs: Vec<Arc<PodDisruptionBudget>>,
        busy: HashSet<String>,
    }

    impl World {
        /// `n1` (tainted, being removed) with `a` (0.2 cpu) planned to move; `n2` with room.
        fn new() -> Self {
            Self {
                nodes: vec![node("n1", "4"), node("n2", "4")],
                pods: vec![pod("a", "n1", "200m")],
                pdbs: Vec::new(),
                busy: HashSet::from(["n1".to_string()]),
            }
        }

        fn check(&self, planned: &[&str], threshold: f64, unready: bool) -> Result<(), String> {
            let planned: Vec<String> = planned.iter().map(|p| format!("uid-{p}")).collect();
            recheck(&Recheck {
                node: &self.nodes[0],
                planned: &planned,
                nodes: &self.nodes,
                pods: &self.pods,
                pdbs: &self.pdbs,
                busy: &self.busy,
                volumes: Volumes::none(),
                namespaces: NamespaceLabels::none(),
                threshold,
                unready,
                consolidation: false,
                now: k8s_openapi::jiff::Timestamp::now(),
            })
        }
    }

    #[test]
    fn a_node_whose_planned_pods_still_fit_elsewhere_passes_its_recheck() {
        assert_eq!(World::new().check(&["a"], 0.5, false), Ok(()));
    }

    /// The loop a traced cost day showed: consolidation decided a node, the re-check after the
    /// taint found a pod "fits on no other node", the node was untainted, and the same decision
    /// came again, five times: the two read the same pods in different orders (a decision from
    /// the pods' index, the re-check from the reflector's map), and first-fit in two orders can
    /// disagree. The pods now go the largest first, then by name, whatever order they come in.
    #[test]
    fn a_recheck_places_the_pods_largest_first_whatever_order_they_are_listed_in() {
        let mut w = World::new();
        w.nodes = vec![node("n1", "4"), node("n2", "2100m"), node("n3", "1100m")];
        for listed in [
            vec![pod("b", "n1", "1"), pod("a", "n1", "2")],
            vec![pod("a", "n1", "2"), pod("b", "n1", "1")],
        ] {
            w.pods = listed;
            // b first would take n2's room and leave a nowhere.
            assert_eq!(w.check(&["a", "b"], 1.0, false), Ok(()));
        }
    }

    #[test]
    fn a_recheck_rejects_a_node_that_gained_a_pod_the_decision_did_not_see() {
        let mut w = World::new();
        // A bare pod (no controller): it could not move at all, and the decision never saw it.
        w.pods
            .push(owned("late", "n1", "100m", serde_json::Value::Null));
        let why = w.check(&["a"], 0.5, false).unwrap_err();
        assert!(why.contains("pod default/late landed"), "{why}");
        // DaemonSet pods come and go with every node: one landing changes nothing.
        let mut w = World::new();
        w.pods.push(owned(
            "ds",
            "n1",
            "100m",
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}),
        ));
        assert_eq!(w.check(&["a"], 0.5, false), Ok(()));
    }

    #[test]
    fn a_recheck_rejects_a_node_whose_pods_budget_no_longer_allows_a_disruption() {
        let mut w = World::new();
        w.pdbs.push(pdb(0));
        let why = w.check(&["a"], 0.5, false).unwrap_err();
        assert!(why.starts_with("no longer removable"), "{why}");
        w.pdbs = vec![pdb(1)];
        assert_eq!(w.check(&["a"], 0.5, false), Ok(()));
    }

    #[test]
    fn a_recheck_never_moves_pods_to_a_node_being_removed_or_cordoned() {
        let mut w = World::new();
        w.busy.insert("n2".into());
        assert!(w.check(&["a"], 0.5, false).is_err(), "n2 is being removed");
        let mut w = World::new();
        let mut cordoned = (*w.nodes[1]).clone();
        cordoned.unschedulable = true;
        w.nodes[1] = Arc::new(cordoned);
        assert!(w.check(&["a"], 0.5, false).is_err(), "n2 is cordoned");
    }

    #[test]
    fn a_node_filled_up_since_it_was_chosen_stays_unless_it_is_unready() {
        let mut w = World::new();
        w.pods.push(pod("b", "n1", "2"));
        // b was planned too: the node is now above the threshold (2.2 of 4 cpu).
        let why = w.check(&["a", "b"], 0.5, false).unwrap_err();
        assert!(why.starts_with("no longer removable"), "{why}");
        // An unready node's pods are served by no one: its utilisation keeps it nowhere.
        assert_eq!(w.check(&["a", "b"], 0.5, true), Ok(()));
        assert_eq!(threshold_for(0.5, true), f64::INFINITY);
        assert_eq!(threshold_for(0.5, false), 0.5);
    }

    /// A ReplicaSet's pod of `cpu` the scheduler has not bound, with `status` as given.
    fn pending(name: &str, cpu: &str, status: serde_json::Value) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                "status": status,
            }))
            .unwrap(),
        ))
    }

    fn room_left_in(w: &World) -> Result<(), String> {
        room_left(&Recheck {
            node: &w.nodes[0],
            planned: &[],
            nodes: &w.nodes,
            pods: &w.pods,
            pdbs: &w.pdbs,
            busy: &w.busy,
            volumes: Volumes::none(),
            namespaces: NamespaceLabels::none(),
            threshold: 0.5,
            unready: false,
            consolidation: false,
            now: k8s_openapi::jiff::Timestamp::now(),
        })
    }

    #[test]
    fn a_pending_pod_the_scheduler_is_about_to_place_keeps_its_room_from_the_recheck() {
        let mut w = World::new();
        w.nodes[1] = node("n2", "1");
        w.pods
            .push(pending("new", "900m", json!({"phase": "Pending"})));
        let why = w.check(&["a"], 0.5, false).unwrap_err();
        assert!(why.contains("default/a"), "{why}");
        // Nominated elsewhere, it takes that node's room instead.
        w.nodes.push(node("n3", "1"));
        w.pods[1] = pending(
            "new",
            "900m",
            json!({"phase": "Pending", "nominatedNodeName": "n3"}),
        );
        assert_eq!(w.check(&["a"], 0.5, false), Ok(()));
    }

    #[test]
    fn pending_pods_the_scheduler_found_no_room_for_or_that_fit_nowhere_take_no_room() {
        let unschedulable = json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        for (cpu, status) in [("900m", unschedulable), ("2", json!({"phase": "Pending"}))] {
            let mut w = World::new();
            w.nodes[1] = node("n2", "1");
            w.pods.push(pending("new", cpu, status));
            assert_eq!(w.check(&["a"], 0.5, false), Ok(()), "{cpu}");
        }
    }

    #[test]
    fn pending_pods_alike_fill_the_nodes_in_order_and_a_smaller_one_still_finds_the_room_left() {
        let nodes = [node("n2", "1"), node("n3", "1")];
        let mut others: Vec<NodeState> = nodes
            .iter()
            .map(|n| NodeState::from_node(n, std::iter::empty()))
            .collect();
        // Three alike (one shape and label map, as the reflector shares them), then a small one.
        let first = pending("a-0", "600m", json!({"phase": "Pending"}));
        let alike = |name: &str| {
            let mut p = (*first).clone();
            p.name = name.into();
            Arc::new(p)
        };
        let pods = vec![
            first.clone(),
            alike("a-1"),
            alike("a-2"),
            pending("small", "300m", json!({"phase": "Pending"})),
        ];
        reserve_pending(&mut others, &pods);
        let on = |i: usize| -> Vec<String> {
            let mut names: Vec<String> = others[i].pods().iter().map(|p| p.name.clone()).collect();
            names.sort();
            names
        };
        assert_eq!(
            on(0),
            ["a-0", "small"],
            "a-2 fits nowhere; small fits beside a-0"
        );
        assert_eq!(on(1), ["a-1"]);
    }

    /// The drain's question between two rounds: `b` was evicted (terminating) and its
    /// replacement waits to be bound; `c` is still on the node.
    fn half_drained(room: &str) -> World {
        let mut w = World::new();
        w.nodes[1] = node("n2", room);
        let mut b = (*pod("b", "n1", "500m")).clone();
        b.terminating = true;
        w.pods = vec![
            Arc::new(b),
            pod("c", "n1", "500m"),
            pending("b-again", "500m", json!({"phase": "Pending"})),
        ];
        // The budget is what paces the drain: it does not count here.
        w.pdbs.push(pdb(0));
        w
    }

    #[test]
    fn the_pods_left_on_a_draining_node_have_room_only_beside_the_evicted_ones_replacements() {
        assert_eq!(room_left_in(&half_drained("1")), Ok(()));
        // Room for one: the replacement takes it, and `c` would wait for a new node.
        let why = room_left_in(&half_drained("700m")).unwrap_err();
        assert!(
            why.starts_with("no room left for the pods still on the node")
                && why.contains("default/c"),
            "{why}"
        );
        // Nothing left to move: nothing to ask.
        let mut w = half_drained("700m");
        w.pods.retain(|p| p.name != "c");
        assert_eq!(room_left_in(&w), Ok(()));
    }

    #[test]
    fn an_empty_node_passes_its_recheck_without_a_destination() {
        let mut w = World::new();
        w.pods.clear();
        w.nodes.truncate(1);
        assert_eq!(w.check(&[], 0.5, false), Ok(()));
    }
}
