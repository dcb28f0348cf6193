//! One scale-down pass, pure: which nodes are unneeded now ([`unneeded`]), how long each has
//! been ([`track`]), and which of them go this pass ([`select`]). The caller hands in snapshots
//! and the time; no I/O.
//!
//! cluster-autoscaler's order and limits: nodes are looked at least-utilised first; a node whose
//! pods would move is simulated against the free room of the nodes that stay, and the room its
//! pods take (and the budget disruptions they use) is gone for the nodes looked at after it, so
//! two nodes never both count on the same room. A node goes only after `unneededTime`, never in a
//! group that grew within `delayAfterAdd`, never from a group whose size Azure has not told us,
//! never below the group's floor counting the deletions already in flight; empty nodes go in
//! bulk (`maxEmptyBulkDelete`), nodes that need a drain one at a time, at most
//! `maxScaleDownPerPass` in all.

use super::fit::NodeState;
use super::index::PodIndex;
use super::recheck::{counts, takes_pods, threshold_for, uid_or_key};
use super::record::{NodeRecord, PodRecord};
use super::scale_down::{
    job_blocker, largest_first, moves, place_greedily, pods_to_move, removable_hinted,
    still_to_move, utilization, Blocker, Hints,
};
use super::topology::{Cluster, NamespaceLabels};
use super::volumes::Volumes;
use crate::cache::Instance;
use crate::node_groups::{schedulable, Backing, GroupIndex};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One node group as the scale-down sees it.
#[derive(Debug, Clone)]
pub struct DownGroup {
    /// Node-group name.
    pub name: String,
    /// How its nodes are recognised.
    pub backing: Backing,
    /// The lowest size the group may have: the larger of `minSize`, the configured floor
    /// (schedules, `desiredCapacity`) and what the resource itself requires.
    pub floor: u32,
    /// The size Azure last reported; `None` (unknown, or not read since it was invalidated):
    /// nothing of the group goes.
    pub size: Option<i64>,
    /// Deletions of this group started and not yet confirmed by Azure.
    pub deleting: u32,
    /// Whether the group grew within `scaleDown.delayAfterAdd` (or, without
    /// `scaleDown.delayTypeLocal`, any group did).
    pub recently_grown: bool,
    /// How long ago the group grew (or, without `scaleDown.delayTypeLocal`, any group did), if
    /// it did since the controller started: consolidation holds by its own `delayAfterAdd`.
    pub grown_ago: Option<std::time::Duration>,
    /// Why this controller does not write the group, if it does not (an agent pool that AKS's
    /// own autoscaler scales): none of its nodes or instances is a candidate, since the delete
    /// would be refused after the drain. Its nodes are still room for other nodes' pods.
    pub refused: Option<crate::hold::WriteRefusal>,
}

/// What one pass looks at.
#[derive(Debug, Clone, Copy)]
pub struct DownInput<'a> {
    /// The node groups.
    pub groups: &'a [DownGroup],
    /// Nodes in the cluster.
    pub nodes: &'a [Arc<NodeRecord>],
    /// Pods not finished, by where they are (the pods reflector keeps the index).
    pub pods: &'a PodIndex,
    /// PodDisruptionBudgets, with the status the disruption controller wrote.
    pub pdbs: &'a [Arc<PodDisruptionBudget>],
    /// `scaleDown.utilizationThreshold`.
    pub threshold: f64,
    /// Nodes being removed now: neither candidates nor destinations.
    pub busy: &'a HashSet<String>,
    /// The pass's wall clock: a pod deleted long enough ago
    /// ([`crate::pods::record::PodRecord::long_terminating`]) is no longer on its node as far as
    /// scale-down goes.
    pub now: k8s_openapi::jiff::Timestamp,
    /// Nodes not Ready and past their startup window ([`crate::node_groups::unready_nodes`]):
    /// candidates whatever their utilisation (their pods are served by no one), never a
    /// destination; they wait `scaleDown.unreadyTime` instead of `unneededTime`.
    pub unready: &'a HashSet<String>,
    /// Nodes unneeded as of the last pass: their simulation comes first, so a node's unneeded
    /// time is not broken by the bound below.
    pub previously: &'a HashSet<String>,
    /// `scaleDown.nonEmptyCandidatesCount`: nodes with pods simulated per pass.
    pub non_empty_candidates: u32,
    /// The claims, volumes, storage classes and CSI nodes: a pod moves only where its volumes
    /// can follow (a zonal disk's zone, a node's attach limit).
    pub volumes: &'a Volumes,
    /// Namespaces' labels, for affinity terms that select namespaces by them.
    pub namespaces: &'a NamespaceLabels,
    /// A node running a pod that runs to completion (a Job's) stays until the pod ends, in
    /// consolidation and in the scale-down of underused nodes alike
    /// ([`crate::config::ConsolidationSettings::keeps_jobs`]: consolidation on with
    /// `disruptJobs: false`). Off, cluster-autoscaler's rules alone: its scale-down drains a
    /// Job's pods like any other.
    pub keep_jobs: bool,
}

/// A node nobody needs, as of this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Unneeded {
    /// Node name.
    pub node: String,
    /// Index of its group in [`DownInput::groups`].
    pub group: usize,
    /// The scale set's instance id (from `spec.providerID`).
    pub instance_id: String,
    /// The node's `resourceVersion` as read (the taint is written under it).
    pub resource_version: String,
    /// Uids of the pods that would have to move (empty: the node is empty).
    pub pods: Vec<String>,
    /// The larger of cpu and memory request utilisation.
    pub utilization: f64,
    /// Not Ready (past its startup window): it waits `unreadyTime`.
    pub unready: bool,
}

impl Unneeded {
    /// Whether no pod would have to move.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// What [`unneeded`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// Nodes that could go now, least utilised first.
    pub unneeded: Vec<Unneeded>,
    /// Nodes of managed groups that must stay, and why.
    pub blocked: BTreeMap<String, Blocker>,
}

/// The nodes of managed groups that nobody needs now (see the module documentation).
pub fn unneeded(input: &DownInput) -> Candidates {
    let mut out = Candidates::default();
    let Listed {
        room,
        elsewhere,
        mut candidates,
        not_room,
    } = listed(input);
    // Nodes unneeded last pass first (their unneeded time must stay unbroken), then the least
    // utilised.
    candidates.sort_by(|a, b| {
        b.before
            .cmp(&a.before)
            .then_with(|| a.utilization.total_cmp(&b.utilization))
            .then_with(|| a.node.name.cmp(&b.node.name))
    });
    let bare = bare_nodes(&room, &elsewhere, input);
    let mut sim = Sim::new(room, &elsewhere, &not_room, &bare, input);
    let mut simulated = 0u32;
    let mut hints = Hints::default();
    for c in candidates {
        let state = &sim.room[c.at];
        let n = c.node.name.clone();
        let moves_any = state.pods().iter().any(|p| moves(p));
        // As it is now: pods of nodes looked at before may have been placed on it.
        let u = utilization(state);
        // An unready node's pods are served by no one: its utilisation keeps it nowhere.
        let threshold = threshold_for(input.threshold, c.unready);
        // Cheap first: a non-empty node at or above the threshold needs no simulation.
        if moves_any && u >= threshold {
            out.blocked
                .insert(n, Blocker::Utilized((u * 100.0).round() as u32));
            continue;
        }
        if let Some(b) = job_blocker(state.pods(), input.keep_jobs) {
            out.blocked.insert(n, b);
            continue;
        }
        if moves_any {
            // cluster-autoscaler's bound: a simulation tries every pod against the cluster's
            // room, so only so many nodes with pods are looked at per pass.
            if simulated >= input.non_empty_candidates {
                continue;
            }
            simulated += 1;
        }
        match sim.remove(c.at, &c.node.annotations, threshold, &mut hints) {
            Err(b) => {
                out.blocked.insert(n, b);
            }
            Ok(moving) => {
                out.unneeded.push(Unneeded {
                    node: n,
                    group: c.group,
                    instance_id: c.instance_id,
                    resource_version: c.node.resource_version.clone().unwrap_or_default(),
                    pods: moving.iter().map(|p| uid_or_key(p)).collect(),
                    utilization: u,
                    unready: c.unready,
                });
            }
        }
    }
    out
}

/// The nodes of one pass as its simulations see them ([`listed`]).
pub(super) struct Listed<'a> {
    /// Every Ready (or unready past its startup window), schedulable node that is not being
    /// removed: the room pods can move to (unready ones only for their own simulation).
    pub(super) room: Vec<NodeState>,
    /// Nodes that take no pod (being drained, not Ready, cordoned): the scheduler still counts
    /// their pods for spread and affinity, so the simulation does. They come after `room` in
    /// the cross-node view, so a destination's index is the same in both.
    pub(super) elsewhere: Vec<NodeState>,
    /// The nodes of managed groups in `room`, as listed.
    pub(super) candidates: Vec<Candidate<'a>>,
    /// Indices in `room` of unready nodes: never a destination.
    pub(super) not_room: Vec<usize>,
}

/// Every node's state with the pods the index keeps bound to it, sorted into room, elsewhere and
/// candidates (shared by [`unneeded`] and consolidation, so both simulate on one view).
pub(super) fn listed<'a>(input: &DownInput<'a>) -> Listed<'a> {
    let index = GroupIndex::of_backings(input.groups.iter().map(|g| &g.backing));
    // Every node's state with the pods the index keeps bound to it (shared, not placed again).
    let states: Vec<NodeState> = input
        .nodes
        .iter()
        .map(|node| {
            let placed = input.pods.bound(&node.name).cloned().unwrap_or_default();
            // Pods deleted long ago that nobody confirms (a dead kubelet) are gone for
            // scale-down: they neither move, nor block, nor count in utilisation.
            let mut state = if placed.pods().iter().any(|p| !counts(p, input.now)) {
                NodeState::from_node(node, placed.pods().iter().filter(|p| counts(p, input.now)))
            } else {
                NodeState::with_placed(node, placed)
            };
            state.set_volume_limits(input.volumes.limits(&node.name));
            state
        })
        .collect();
    let mut out = Listed {
        room: Vec::new(),
        elsewhere: Vec::new(),
        candidates: Vec::new(),
        not_room: Vec::new(),
    };
    for (node, state) in input.nodes.iter().zip(states) {
        let n = node.name.as_str();
        let unready = input.unready.contains(n);
        // An unready node is room for its own simulation only (never a destination: see
        // `not_room`); any other must take pods.
        let room = match unready {
            true => !input.busy.contains(n) && schedulable(node),
            false => takes_pods(node, input.busy),
        };
        if !room {
            out.elsewhere.push(state);
            continue;
        }
        if unready {
            out.not_room.push(out.room.len());
        }
        if let Some(group) = index
            .group_of(node)
            .filter(|g| input.groups[*g].refused.is_none())
        {
            let id = node.instance_id().map(str::to_string);
            if let Some(instance_id) = id {
                out.candidates.push(Candidate {
                    group,
                    node,
                    instance_id,
                    at: out.room.len(),
                    utilization: utilization(&state),
                    before: input.previously.contains(n),
                    unready,
                });
            }
        }
        out.room.push(state);
    }
    out
}

/// The nodes' labels and taints (copied: the room fills up as a pass goes) when any pod has a
/// rule about other nodes' pods or volumes to follow; empty otherwise (no cross-node view).
pub(super) fn bare_nodes(
    room: &[NodeState],
    elsewhere: &[NodeState],
    input: &DownInput,
) -> Vec<NodeState> {
    let cross_node = room
        .iter()
        .chain(elsewhere)
        .any(|n| n.any_cross_node_rules() || (!input.volumes.is_empty() && n.any_claims()));
    if cross_node {
        room.iter().chain(elsewhere).map(NodeState::bare).collect()
    } else {
        Vec::new()
    }
}

/// The state one pass simulates on: the room (filled by the pods of the nodes found removable),
/// which nodes are gone, the budgets' disruptions left, and the cross-node view. Cloned, it is a
/// what-if that leaves the original as it was (consolidation tries one set of nodes per copy).
#[derive(Debug, Clone)]
pub(super) struct Sim<'c> {
    /// See [`Listed::room`].
    pub(super) room: Vec<NodeState>,
    /// Nodes found removable (or never room), by index in `room`: no longer destinations.
    pub(super) gone: Vec<bool>,
    pdbs: Vec<Arc<PodDisruptionBudget>>,
    cluster: Option<Cluster<'c>>,
}

impl<'c> Sim<'c> {
    /// The simulation over `room` (taken), with `elsewhere`'s pods counted for spread and
    /// affinity through `bare` (from [`bare_nodes`]; empty: no cross-node view).
    ///
    /// The pods still to move off the nodes being removed (`input.busy`) take their room
    /// first, as cluster-autoscaler injects the pods of the nodes it drains into its snapshot
    /// and Karpenter simulates the pods of deleting nodes: a later pass must not count on the
    /// room a drain under way relies on, nor remove the node its pods are to go to. Each counts
    /// once for spread and affinity, where it goes. One that fits nowhere takes none and counts
    /// where it runs: once evicted, its replacement is a pending pod the scale-up provides for.
    pub(super) fn new(
        room: Vec<NodeState>,
        elsewhere: &[NodeState],
        not_room: &[usize],
        bare: &'c [NodeState],
        input: &DownInput<'c>,
    ) -> Self {
        // Each with its node's index in the cluster view (`room`, then `elsewhere`).
        let first = room.len();
        let draining: Vec<(usize, Arc<PodRecord>)> = elsewhere
            .iter()
            .enumerate()
            .filter(|(_, n)| input.busy.contains(&n.name))
            .flat_map(|(i, n)| n.pods().iter().map(move |p| (first + i, p)))
            .filter(|(_, p)| still_to_move(p))
            .map(|(i, p)| (i, p.clone()))
            .collect();
        let moving: HashSet<String> = draining.iter().map(|(_, p)| p.key()).collect();
        let cluster = (!bare.is_empty()).then(|| {
            Cluster::of_parts(
                bare,
                room.iter()
                    .chain(elsewhere)
                    .enumerate()
                    .flat_map(|(i, n)| n.pods().iter().map(move |p| (i, p)))
                    .filter(|(_, p)| !moving.contains(&p.key())),
            )
            .with_volumes(input.volumes)
            .with_namespaces(input.namespaces)
        });
        let mut gone = vec![false; room.len()];
        for i in not_room {
            gone[*i] = true;
        }
        let mut sim = Self {
            room,
            gone,
            pdbs: input.pdbs.to_vec(),
            cluster,
        };
        let home: HashMap<String, usize> = draining.iter().map(|(i, p)| (p.key(), *i)).collect();
        let mut pods: Vec<Arc<PodRecord>> = draining.into_iter().map(|(_, p)| p).collect();
        // The largest first, as a removal places its pods.
        largest_first(&mut pods);
        for pod in &pods {
            sim.reserve(pod, home.get(&pod.key()).copied());
        }
        sim
    }

    /// Places `pod` (of a node being removed) where it would go, if it fits anywhere; one that
    /// fits nowhere still runs where it is, and counts there (`home`, its node's index in the
    /// cluster view) for spread and affinity.
    fn reserve(&mut self, pod: &Arc<PodRecord>, home: Option<usize>) {
        let gone = &self.gone;
        let skip = |i: usize| gone.get(i).copied().unwrap_or(false);
        let placed = place_greedily(
            std::slice::from_ref(pod),
            &self.room,
            skip,
            self.cluster.as_ref(),
            &mut Hints::default(),
        );
        match placed {
            Ok(plan) => {
                for (_, dest) in plan {
                    self.room[dest].place(pod.clone());
                    if let Some(cluster) = self.cluster.as_mut() {
                        cluster.place(pod, dest);
                    }
                }
            }
            Err(_) => {
                if let (Some(cluster), Some(home)) = (self.cluster.as_mut(), home) {
                    cluster.place(pod, home);
                }
            }
        }
    }

    /// Simulates removing the node at `at` in `room` ([`removable_hinted`] against the nodes
    /// not gone); when it can go, its pods are placed where they would go, the budgets spend
    /// the disruptions they use, and the node is gone: two nodes never count on the same room.
    /// Returns the pods that would move.
    pub(super) fn remove(
        &mut self,
        at: usize,
        annotations: &std::collections::BTreeMap<String, String>,
        threshold: f64,
        hints: &mut Hints,
    ) -> Result<Vec<Arc<super::record::PodRecord>>, Blocker> {
        let gone = &self.gone;
        // Indices past `room` are the nodes that take no pod: never skipped.
        let skip = |i: usize| i == at || gone.get(i).copied().unwrap_or(false);
        let plan = removable_hinted(
            &self.room[at],
            annotations,
            &self.room,
            skip,
            &self.pdbs,
            threshold,
            self.cluster.as_ref(),
            hints,
        )?;
        let moving = pods_to_move(&self.room[at]);
        for ((_, dest), pod) in plan.iter().zip(&moving) {
            self.room[*dest].place(pod.clone());
            if let Some(cluster) = self.cluster.as_mut() {
                cluster.place(pod, *dest);
            }
        }
        for b in self.pdbs.iter_mut() {
            let covered = moving
                .iter()
                .filter(|p| super::scale_down::covers(b, p))
                .count() as i32;
            if covered > 0 {
                let b = Arc::make_mut(b);
                if let Some(s) = b.status.as_mut() {
                    s.disruptions_allowed -= covered;
                }
            }
        }
        self.gone[at] = true;
        Ok(moving)
    }
}

/// A node of a managed group that might be unneeded.
pub(super) struct Candidate<'a> {
    pub(super) group: usize,
    pub(super) node: &'a NodeRecord,
    pub(super) instance_id: String,
    /// Index in the pass's room.
    pub(super) at: usize,
    /// As listed, before any simulation.
    pub(super) utilization: f64,
    /// Unneeded as of the last pass.
    pub(super) before: bool,
    /// Not Ready, past its startup window.
    pub(super) unready: bool,
}

/// An instance of a managed group that no Node stands for: requested, and not registered (yet,
/// or ever: a broken image, a bootstrap that failed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unregistered {
    /// Index of its group in the groups given.
    pub group: usize,
    /// The scale set's instance id.
    pub instance_id: String,
    /// The name its Node would have: the VM's computer name (on AKS, its machine name).
    pub machine: String,
}

/// The instances of `groups` (`instances[i]`: what Azure listed for group `i`, when known) that
/// no Node stands for, matched two ways so a node is never taken for missing: the instance id in
/// a node's providerID (within the node's group), or the VM's computer name as a node's name.
/// Instances Azure is already deleting are left out, and so are stopped ones (deallocated: a
/// VM someone stopped is not a node that failed to register; a spot VM Azure evicted is
/// [`evicted`]'s). cluster-autoscaler's "unregistered nodes".
pub fn unregistered(
    groups: &[DownGroup],
    instances: &[Option<Arc<Vec<Instance>>>],
    nodes: &[Arc<NodeRecord>],
) -> Vec<Unregistered> {
    let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
    let mut registered: HashSet<(usize, &str)> = HashSet::new();
    let mut names: HashSet<&str> = HashSet::new();
    for node in nodes {
        names.insert(node.name.as_str());
        if let (Some(g), Some(id)) = (index.group_of(node), node.instance_id()) {
            registered.insert((g, id));
        }
    }
    let mut out = Vec::new();
    for (g, list) in instances.iter().enumerate().take(groups.len()) {
        if groups[g].refused.is_some() {
            continue;
        }
        for i in list.iter().flat_map(|l| l.iter()) {
            let by_name = i.computer_name.as_deref().is_some_and(|n| {
                names.contains(n) || names.contains(n.to_ascii_lowercase().as_str())
            });
            if i.deleting()
                || i.deallocated()
                || by_name
                || registered.contains(&(g, i.instance_id.as_str()))
            {
                continue;
            }
            out.push(Unregistered {
                group: g,
                instance_id: i.instance_id.clone(),
                machine: i.computer_name.clone().unwrap_or_default(),
            });
        }
    }
    out
}

/// The instances of spot groups (`spot[i]`) that Azure evicted with eviction policy
/// `Deallocate`: listed stopped and deallocated, and not being deleted already. They hold
/// capacity and vCPU quota and will run no pod again unless someone starts them (on capacity
/// Azure just took back), so they are deleted by name at once, whether or not their Node is
/// still there (NotReady): the pods they ran get room elsewhere, and the size is written back up
/// if the delete took the group below its floor.
pub fn evicted(instances: &[Option<Arc<Vec<Instance>>>], spot: &[bool]) -> Vec<Unregistered> {
    let mut out = Vec::new();
    for (g, list) in instances.iter().enumerate() {
        if !spot.get(g).copied().unwrap_or(false) {
            continue;
        }
        for i in list.iter().flat_map(|l| l.iter()) {
            if i.deallocated() && !i.deleting() {
                out.push(Unregistered {
                    group: g,
                    instance_id: i.instance_id.clone(),
                    machine: i.computer_name.clone().unwrap_or_default(),
                });
            }
        }
    }
    out
}

/// Since when each node has been unneeded: nodes new to the list start now, nodes no longer on
/// it are forgotten (an unneeded period must be unbroken).
pub fn track(since: &mut HashMap<String, Instant>, candidates: &Candidates, now: Instant) {
    let current: HashSet<&str> = candidates
        .unneeded
        .iter()
        .map(|u| u.node.as_str())
        .collect();
    since.retain(|n, _| current.contains(n.as_str()));
    for u in &candidates.unneeded {
        since.entry(u.node.clone()).or_insert(now);
    }
}

/// Gives back their unneeded time to the nodes whose removal stopped without making them needed
/// (a taint refused for a moved `resourceVersion`, a throttled or held delete, a Lease renewal
/// hiccup): `started` holds, per node whose removal started, since when it had been unneeded
/// then. A node still being removed (`busy`) waits; one found unneeded again keeps its earlier
/// start; one that is not (it became needed, or it is gone) is forgotten. Called after [`track`].
pub fn resume(
    since: &mut HashMap<String, Instant>,
    started: &mut HashMap<String, Instant>,
    busy: &HashSet<String>,
) {
    started.retain(|node, at| {
        if busy.contains(node) {
            return true;
        }
        if let Some(s) = since.get_mut(node) {
            *s = (*s).min(*at);
        }
        false
    });
}

/// What a fresh instance list says of a VM whose delete's outcome is not known (the answer
/// lost, an operation that failed after deleting part of its batch, a taint a previous leader
/// left): see [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Not listed: the delete happened; the node was removed.
    Gone,
    /// Listed `Succeeded`: the delete did not happen; the node is untainted and stays.
    Healthy,
    /// Listed `Failed`, or still not `Succeeded` after the bound: deleted again through the
    /// guarded delete.
    DeleteAgain,
    /// Listed `Deleting`, `Updating` (or without a state) within the bound: asked again next
    /// pass.
    Wait,
}

/// Settles a VM whose delete's outcome is not known, from its provisioning state on a fresh list
/// (`None`: not listed; `Some("")`: listed without one) and how long it has waited since it was
/// parked: `Failed` is deleted again at once, anything else but `Succeeded` after `stuck_after`
/// (scale-down uses `maxNodeProvisionTime`), so no node stays cordoned for a leadership.
pub fn settle(state: Option<&str>, waited: Duration, stuck_after: Duration) -> Settle {
    match state {
        None => Settle::Gone,
        Some(s) if s.eq_ignore_ascii_case("Succeeded") => Settle::Healthy,
        Some(s) if s.eq_ignore_ascii_case("Failed") => Settle::DeleteAgain,
        Some(_) if waited >= stuck_after => Settle::DeleteAgain,
        Some(_) => Settle::Wait,
    }
}

/// The limits of one pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// `scaleDown.unneededTime`.
    pub unneeded_time: Duration,
    /// `scaleDown.unreadyTime`: how long an unready node must stay unneeded.
    pub unready_time: Duration,
    /// `scaleDown.maxEmptyBulkDelete`.
    pub max_empty_bulk_delete: u32,
    /// `scaleDown.maxScaleDownPerPass`.
    pub max_per_pass: u32,
    /// Whether a drain is already under way (nodes with pods go one at a time).
    pub draining: bool,
    /// `balanceSimilarNodeGroups`: among equally unneeded nodes (the same utilisation), those of
    /// the larger group go first, so balanced groups stay balanced as they shrink.
    pub balance: bool,
}

/// `scaleDown.delayAfterAdd`: with each group's `grown_ago` as seen, marks the groups scale-down
/// leaves alone. cluster-autoscaler's default (`--scale-down-delay-type-local=false`): a scale-up
/// of any group holds scale-down in all of them, so every group takes the latest growth.
pub fn hold_after_add(groups: &mut [DownGroup], delay_after_add: Duration, type_local: bool) {
    if !type_local {
        let latest = groups.iter().filter_map(|g| g.grown_ago).min();
        for g in groups.iter_mut() {
            g.grown_ago = latest;
        }
    }
    for g in groups.iter_mut() {
        g.recently_grown = g.grown_ago.is_some_and(|ago| ago < delay_after_add);
    }
}

/// Which unneeded nodes go this pass (indices into `candidates.unneeded`), and why each other
/// one stays, for logs.
pub fn select(
    candidates: &Candidates,
    groups: &[DownGroup],
    since: &HashMap<String, Instant>,
    now: Instant,
    limits: Limits,
) -> (Vec<usize>, BTreeMap<String, &'static str>) {
    let mut chosen = Vec::new();
    let mut waiting = BTreeMap::new();
    let mut taken: Vec<u32> = vec![0; groups.len()];
    let (mut empty, mut drained) = (0u32, 0u32);
    let order: Vec<usize> = if limits.balance {
        larger_groups_first(candidates, groups)
    } else {
        (0..candidates.unneeded.len()).collect()
    };
    for i in order {
        let u = &candidates.unneeded[i];
        let g = &groups[u.group];
        let (wait, label) = if u.unready {
            (limits.unready_time, "unready_time")
        } else {
            (limits.unneeded_time, "unneeded_time")
        };
        let why = if since
            .get(&u.node)
            .is_none_or(|t| now.duration_since(*t) < wait)
        {
            Some(label)
        } else if g.recently_grown {
            Some("delay_after_add")
        } else if g.size.is_none() {
            Some("unknown_size")
        } else if g.size.unwrap_or(0) - i64::from(g.deleting) - i64::from(taken[u.group]) - 1
            < i64::from(g.floor)
        {
            Some("min_size")
        } else if empty + drained >= limits.max_per_pass {
            Some("max_per_pass")
        } else if u.is_empty() && empty >= limits.max_empty_bulk_delete {
            Some("max_empty_bulk_delete")
        } else if !u.is_empty() && (limits.draining || drained >= 1) {
            Some("one_drain_at_a_time")
        } else {
            None
        };
        match why {
            Some(w) => {
                waiting.insert(u.node.clone(), w);
            }
            None => {
                taken[u.group] += 1;
                if u.is_empty() {
                    empty += 1;
                } else {
                    drained += 1;
                }
                chosen.push(i);
            }
        }
    }
    (chosen, waiting)
}

/// The candidates in their order, except that within each run of equal utilisation the nodes
/// are interleaved by group, the group with most nodes left (size less deletions, less the nodes
/// ordered before) first: cluster-autoscaler balances only when adding; this keeps similar groups
/// level when removing too.
fn larger_groups_first(candidates: &Candidates, groups: &[DownGroup]) -> Vec<usize> {
    let u = &candidates.unneeded;
    let mut left: Vec<i64> = groups
        .iter()
        .map(|g| g.size.unwrap_or(0) - i64::from(g.deleting))
        .collect();
    let mut order = Vec::with_capacity(u.len());
    let mut start = 0;
    while start < u.len() {
        let end = (start..u.len())
            .find(|&k| u[k].utilization != u[start].utilization)
            .unwrap_or(u.len());
        let mut run: Vec<usize> = (start..end).collect();
        while !run.is_empty() {
            // The largest group's next node; ties keep the listed order.
            let Some(k) =
                (0..run.len()).max_by_key(|&k| (left[u[run[k]].group], std::cmp::Reverse(k)))
            else {
                break;
            };
            let i = run.remove(k);
            left[u[i].group] -= 1;
            order.push(i);
        }
        start = end;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::record::PodRecord;
    use serde_json::json;

    const SUB: &str = "00000000-0000-0000-0000-000000000000";

    #[test]
    fn a_vm_left_failed_is_deleted_again_and_one_stuck_updating_only_after_the_bound() {
        let bound = Duration::from_secs(900);
        let short = Duration::from_secs(10);
        assert_eq!(settle(None, short, bound), Settle::Gone);
        assert_eq!(settle(Some("Succeeded"), short, bound), Settle::Healthy);
        assert_eq!(
            settle(Some("Failed"), Duration::ZERO, bound),
            Settle::DeleteAgain
        );
        for state in ["Updating", "Deleting", ""] {
            assert_eq!(settle(Some(state), short, bound), Settle::Wait, "{state}");
            assert_eq!(
                settle(Some(state), bound, bound),
                Settle::DeleteAgain,
                "{state}"
            );
        }
    }

    fn node(name: &str, vmss: &str, id: u32, cpu: &str) -> Arc<NodeRecord> {
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "resourceVersion": "7", "labels": {"kubernetes.io/hostname": name}},
                "spec": {"providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{id}")},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        ))
    }

    fn pod(name: &str, node: &str, cpu: &str) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            }))
            .unwrap(),
        ))
    }

    fn group(name: &str, size: Option<i64>, floor: u32) -> DownGroup {
        DownGroup {
            name: name.into(),
            backing: Backing::ScaleSet {
                resource_group: "rg".into(),
                name: name.into(),
            },
            floor,
            size,
            deleting: 0,
            recently_grown: false,
            grown_ago: None,
            refused: None,
        }
    }

    fn run(
        groups: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        pods: &[Arc<PodRecord>],
        pdbs: &[Arc<PodDisruptionBudget>],
    ) -> Candidates {
        run_busy(groups, nodes, pods, pdbs, &HashSet::new())
    }

    /// [`run`] with the nodes in `busy` being removed.
    fn run_busy(
        groups: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        pods: &[Arc<PodRecord>],
        pdbs: &[Arc<PodDisruptionBudget>],
        busy: &HashSet<String>,
    ) -> Candidates {
        run_with(groups, nodes, pods, pdbs, busy, false)
    }

    /// [`run_busy`] with [`DownInput::keep_jobs`] as given.
    fn run_with(
        groups: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        pods: &[Arc<PodRecord>],
        pdbs: &[Arc<PodDisruptionBudget>],
        busy: &HashSet<String>,
        keep_jobs: bool,
    ) -> Candidates {
        unneeded(&DownInput {
            now: k8s_openapi::jiff::Timestamp::now(),
            groups,
            nodes,
            pods: &PodIndex::of(pods),
            pdbs,
            threshold: 0.5,
            busy,
            unready: &HashSet::new(),
            previously: &HashSet::new(),
            non_empty_candidates: 30,
            volumes: Volumes::none(),
            namespaces: NamespaceLabels::none(),
            keep_jobs,
        })
    }

    fn names(c: &Candidates) -> Vec<&str> {
        c.unneeded.iter().map(|u| u.node.as_str()).collect()
    }

    const LIMITS: Limits = Limits {
        unneeded_time: Duration::from_secs(600),
        unready_time: Duration::from_secs(1200),
        max_empty_bulk_delete: 10,
        max_per_pass: 10,
        draining: false,
        balance: false,
    };

    fn all_since(c: &Candidates, t: Instant) -> HashMap<String, Instant> {
        c.unneeded.iter().map(|u| (u.node.clone(), t)).collect()
    }

    fn instance(id: &str, machine: &str, state: &str) -> Instance {
        Instance {
            instance_id: id.into(),
            provisioning_state: Some(state.into()),
            computer_name: Some(machine.into()),
            power_state: Some("running".into()),
            zone: None,
        }
    }

    fn stopped(id: &str, machine: &str, state: &str) -> Instance {
        Instance {
            power_state: Some("deallocated".into()),
            ..instance(id, machine, state)
        }
    }

    #[test]
    fn an_underused_node_running_a_jobs_pod_stays_while_consolidation_keeps_jobs_and_goes_otherwise(
    ) {
        // `a` runs a Job's 1-cpu pod (25 %), which would fit beside `b`'s 2-cpu web pod.
        let nodes = vec![node("a", "ss", 0, "4"), node("b", "ss", 1, "4")];
        let mut job = (*pod("j", "a", "1")).clone();
        job.controller = Some(crate::pods::record::Controller {
            kind: "Job".into(),
            name: "nightly".into(),
            uid: "uid-nightly".into(),
        });
        let pods = vec![Arc::new(job.clone()), pod("w", "b", "2")];
        let groups = vec![group("ss", Some(2), 0)];
        let none = HashSet::new();
        // cluster-autoscaler's rules alone (consolidation off, or `disruptJobs: true`): the
        // Job's pod is drained like any other.
        let c = run_with(&groups, &nodes, &pods, &[], &none, false);
        assert_eq!(names(&c), ["a"]);
        // Consolidation on with `disruptJobs: false`: the node waits for the pod to end.
        let c = run_with(&groups, &nodes, &pods, &[], &none, true);
        assert!(names(&c).is_empty(), "{:?}", names(&c));
        let b = c.blocked.get("a").expect("a blocked");
        assert_eq!(b, &Blocker::RunsToCompletion("default/j".into()));
        assert!(
            b.to_string().contains("consolidation.disruptJobs: false"),
            "{b}"
        );
        // A Job's pod being deleted keeps nothing: its run is lost already (and one stuck on a
        // dead kubelet must not keep its node for ever).
        job.terminating = true;
        let pods = vec![Arc::new(job), pod("w", "b", "2")];
        let c = run_with(&groups, &nodes, &pods, &[], &none, true);
        assert_eq!(names(&c), ["a"]);
    }

    #[test]
    fn the_pods_of_a_node_being_removed_keep_the_room_they_go_to_from_a_later_pass() {
        // `going` is being removed and still runs a 2-cpu pod; `spare` is empty, and `full`
        // has 1 of 4 cpus left. The pod can go only to `spare`: a later pass that took `spare`
        // for an empty node would leave it nowhere.
        let nodes = vec![
            node("going", "ss", 0, "4"),
            node("spare", "ss", 1, "4"),
            node("full", "ss", 2, "4"),
        ];
        let mut terminating = (*pod("gone", "going", "2")).clone();
        terminating.terminating = true;
        let pods = vec![
            pod("w", "going", "2"),
            Arc::new(terminating),
            pod("x", "full", "3"),
        ];
        let groups = vec![group("ss", Some(3), 0)];
        let pass = |busy: &HashSet<String>, pods: &[Arc<PodRecord>]| {
            run_busy(&groups, &nodes, pods, &[], busy)
        };
        let busy = HashSet::from(["going".to_string()]);
        let c = pass(&busy, &pods);
        assert!(names(&c).is_empty(), "{:?}", names(&c));
        // `spare` holds the pod in the simulation: half used, at the threshold.
        assert_eq!(c.blocked.get("spare"), Some(&Blocker::Utilized(50)));
        // Once the pod has moved (its replacement runs on `spare`), nothing is held for it; and
        // a terminating pod (its replacement is a pod of its own) holds nothing anyway.
        let moved = vec![pod("w2", "spare", "2"), pod("x", "full", "3")];
        let c = pass(&busy, &moved);
        assert!(names(&c).is_empty(), "{:?}", names(&c));
        let idle = vec![pods[1].clone(), pod("x", "full", "3")];
        let c = pass(&busy, &idle);
        assert_eq!(names(&c), vec!["spare"]);
    }

    #[test]
    fn a_drained_pod_with_no_room_still_counts_for_spread_where_it_runs() {
        // One zone-spread app (`maxSkew: 1`): `s1` runs on `going` (zone a, being removed) and
        // fits nowhere else; `s2` on `cand` (zone b, its only node), `s3` on `dest` (zone c).
        // kube-scheduler still counts `s1` in zone a until it is evicted, so `s2` may go to
        // zone c (a 1, c 2) and `cand` can go. Counted nowhere, zone a would be empty and
        // zone c's second pod a skew of 2: `cand` would be kept for nothing.
        let zoned = |name: &str, id: u32, zone: &str| {
            let mut n = (*node(name, "ss", id, "4")).clone();
            Arc::make_mut(&mut n.labels)
                .insert(crate::pods::template::ZONE_LABEL.into(), zone.into());
            Arc::new(n)
        };
        let spread = |name: &str, node: &str, cpu: &str| {
            Arc::new(PodRecord::of(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
                        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": crate::pods::template::ZONE_LABEL,
                            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]},
                }))
                .unwrap(),
            ))
        };
        let nodes = vec![
            zoned("going", 0, "a"),
            zoned("full", 1, "a"),
            zoned("cand", 2, "b"),
            zoned("dest", 3, "c"),
        ];
        let mut filler = (*pod("x", "full", "4")).clone();
        filler.labels = Arc::new([("app".to_string(), "other".to_string())].into());
        let pods = vec![
            spread("s1", "going", "3"),
            Arc::new(filler),
            spread("s2", "cand", "1"),
            spread("s3", "dest", "1"),
        ];
        let groups = vec![group("ss", Some(4), 0)];
        let busy = HashSet::from(["going".to_string()]);
        let c = run_busy(&groups, &nodes, &pods, &[], &busy);
        assert!(
            names(&c).contains(&"cand"),
            "{:?} {:?}",
            names(&c),
            c.blocked
        );
    }

    #[test]
    fn spot_instances_azure_deallocated_are_evicted_ones_and_never_taken_for_unregistered() {
        // Group 0 is spot: instance 1 was evicted with `Deallocate` (its Node is still there,
        // NotReady), instance 2 too and is being deleted already. Group 1 is on-demand: its
        // stopped VM is someone's (AKS's scale-down mode `Deallocate`), not an eviction.
        let spot = Arc::new(vec![
            instance("0", "spot000000", "Succeeded"),
            stopped("1", "spot000001", "Succeeded"),
            stopped("2", "spot000002", "Deleting"),
        ]);
        let ondemand = Arc::new(vec![stopped("0", "od000000", "Succeeded")]);
        let instances = vec![Some(spot), Some(ondemand)];
        let e = evicted(&instances, &[true, false]);
        assert_eq!(
            e,
            vec![Unregistered {
                group: 0,
                instance_id: "1".into(),
                machine: "spot000001".into()
            }]
        );
        // No Node for any of them: only the running one is "unregistered" (a stopped VM is not
        // a node that failed to register).
        let groups = vec![group("spot", Some(3), 0), group("od", Some(1), 0)];
        let u = unregistered(&groups, &instances, &[]);
        assert_eq!(
            u.iter()
                .map(|u| (u.group, u.instance_id.as_str()))
                .collect::<Vec<_>>(),
            vec![(0, "0")]
        );
    }

    #[test]
    fn an_unready_node_is_a_candidate_whatever_its_load_never_room_and_waits_the_unready_time() {
        // `sick` is NotReady with a pod using 3 of 4 cpus (above the threshold: a Ready node so
        // loaded stays); `ok` has room for that pod. `spare` is Ready and empty, but the
        // unready node's pod must not be planned onto... itself or another unready node.
        let mut sick = (*node("sick", "ss", 0, "4")).clone();
        sick.ready = false;
        let mut dead = (*node("dead", "ss", 2, "4")).clone();
        dead.ready = false;
        let nodes = [Arc::new(sick), node("ok", "ss", 1, "8"), Arc::new(dead)];
        let pods = PodIndex::of(&[pod("p", "sick", "3"), pod("busy", "ok", "6")]);
        let unready = HashSet::from(["sick".to_string(), "dead".to_string()]);
        let groups = [group("ss", Some(3), 0)];
        let none = HashSet::new();
        let input = |unready| DownInput {
            now: k8s_openapi::jiff::Timestamp::now(),
            groups: &groups,
            nodes: &nodes,
            pods: &pods,
            pdbs: &[],
            threshold: 0.5,
            busy: &none,
            unready,
            previously: &none,
            non_empty_candidates: 30,
            volumes: Volumes::none(),
            namespaces: NamespaceLabels::none(),
            keep_jobs: false,
        };
        let c = unneeded(&input(&unready));
        // `p` (3 cpu) fits on no Ready node (ok has 2 left) and never on `dead`: sick stays;
        // `dead` is empty: it goes.
        assert_eq!(names(&c), ["dead"]);
        assert!(c.unneeded[0].unready);
        assert!(
            matches!(c.blocked.get("sick"), Some(Blocker::NoPlaceFor(_))),
            "{:?}",
            c.blocked
        );
        // Not in the unready set (still booting): neither candidate nor room.
        let c = unneeded(&input(&none));
        assert!(names(&c).is_empty(), "{:?}", names(&c));
        // An unready node waits `unready_time`, not `unneeded_time`.
        let c = unneeded(&input(&unready));
        let t0 = Instant::now();
        let since = all_since(&c, t0);
        let (chosen, waiting) = select(&c, &groups, &since, t0 + Duration::from_secs(601), LIMITS);
        assert!(chosen.is_empty());
        assert_eq!(waiting.get("dead"), Some(&"unready_time"));
        let (chosen, _) = select(&c, &groups, &since, t0 + Duration::from_secs(1200), LIMITS);
        assert_eq!(chosen, [0]);
    }

    #[test]
    fn too_many_unready_nodes_means_more_than_both_the_count_and_the_share() {
        use crate::node_groups::too_many_unready;
        // cluster-autoscaler's defaults: 3 and 45 %.
        assert!(
            too_many_unready(3, 4, 3, 45.0).is_none(),
            "3 is ok whatever the share"
        );
        assert!(
            too_many_unready(4, 100, 3, 45.0).is_none(),
            "4 of 100 is a small share"
        );
        let why = too_many_unready(5, 10, 3, 45.0).expect("5 of 10");
        assert!(why.contains("5 of 10 nodes are unready"), "{why}");
        assert!(too_many_unready(0, 0, 3, 45.0).is_none());
    }

    #[test]
    fn an_instance_no_node_stands_for_is_unregistered_and_a_node_found_either_way_is_not() {
        // Instance 0 has its node by providerID, 1 by name only (its providerID not set yet),
        // 2 has none, 3 has none but Azure is deleting it.
        let mut by_name = (*node("ss000001", "other", 9, "4")).clone();
        by_name.set_provider_id(None);
        let nodes = vec![node("ss000000", "ss", 0, "4"), Arc::new(by_name)];
        let listed = Arc::new(vec![
            instance("0", "ss000000", "Succeeded"),
            instance("1", "ss000001", "Succeeded"),
            instance("2", "ss000002", "Creating"),
            instance("3", "ss000003", "Deleting"),
        ]);
        let got = unregistered(&[group("ss", Some(4), 0)], &[Some(listed)], &nodes);
        assert_eq!(
            got,
            [Unregistered {
                group: 0,
                instance_id: "2".into(),
                machine: "ss000002".into()
            }]
        );
        // A group whose instances are not known yet has none.
        assert!(unregistered(&[group("ss", Some(4), 0)], &[None], &nodes).is_empty());
    }

    #[test]
    fn only_so_many_nodes_with_pods_are_simulated_per_pass_those_unneeded_before_first() {
        // Four underused nodes with a 1-cpu pod each, and a big busy node (x, 9 of 16 cpu
        // taken: not a candidate) with room for all their pods.
        let nodes = [
            node("x", "ss", 9, "16"),
            node("a", "ss", 0, "4"),
            node("b", "ss", 1, "4"),
            node("c", "ss", 2, "4"),
            node("d", "ss", 3, "4"),
        ];
        let pods = [
            pod("big", "x", "9"),
            pod("p1", "a", "1"),
            pod("p2", "b", "1"),
            pod("p3", "c", "1"),
            pod("p4", "d", "1"),
        ];
        let previously = HashSet::from(["d".to_string()]);
        let c = unneeded(&DownInput {
            now: k8s_openapi::jiff::Timestamp::now(),
            groups: &[group("ss", Some(5), 0)],
            nodes: &nodes,
            pods: &PodIndex::of(&pods),
            pdbs: &[],
            threshold: 0.5,
            busy: &HashSet::new(),
            unready: &HashSet::new(),
            previously: &previously,
            non_empty_candidates: 2,
            volumes: Volumes::none(),
            namespaces: NamespaceLabels::none(),
            keep_jobs: false,
        });
        // Two simulations: d first (unneeded last pass), then the least utilised by name (a);
        // b and c wait for a later pass.
        assert_eq!(names(&c), ["d", "a"]);
        assert!(!c.blocked.contains_key("b") && !c.blocked.contains_key("c"));
    }

    #[test]
    fn a_node_whose_pod_could_only_move_by_breaking_its_zone_spread_stays() {
        let zoned = |name: &str, id: u32, zone: &str| {
            let mut n = (*node(name, "ss", id, "4")).clone();
            Arc::make_mut(&mut n.labels).insert("topology.kubernetes.io/zone".into(), zone.into());
            Arc::new(n)
        };
        let spread = |name: &str, on: &str| {
            Arc::new(PodRecord::of(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                    "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
                        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]},
                }))
                .unwrap(),
            ))
        };
        // Zone 1: a (one web pod) and b (full of another app); zone 2: c (one web pod).
        let nodes = [zoned("a", 0, "1"), zoned("b", 1, "1"), zoned("c", 2, "2")];
        let full = Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "batch", "namespace": "default", "uid": "uid-batch", "labels": {"app": "batch"},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j", "controller": true}]},
                "spec": {"nodeName": "b", "containers": [{"name": "c", "resources": {"requests": {"cpu": "3900m"}}}]},
            }))
            .unwrap(),
        ));
        let pods = [spread("p1", "a"), full.clone(), spread("p3", "c")];
        let out = run(&[group("ss", Some(3), 0)], &nodes, &pods, &[]);
        // a's pod could only go to c: zone 2 would hold 2 and zone 1 (b is still there) none.
        assert!(
            matches!(out.blocked.get("a"), Some(Blocker::NoPlaceFor(p)) if p == "default/p1"),
            "{out:?}"
        );
        // c's pod may go to a: with c gone, zone 2 has no node and is no domain any more (the
        // scheduler's rule; minDomains is how a workload asks for more).
        assert_eq!(names(&out), ["c"]);
        // Without the constraint, a goes first (its pod to c), and then c's pod has nowhere.
        let plain = [pod("p1", "a", "500m"), full, pod("p3", "c", "500m")];
        let out = run(&[group("ss", Some(3), 0)], &nodes, &plain, &[]);
        assert_eq!(names(&out), ["a"], "{out:?}");
    }

    #[test]
    fn a_cordoned_nodes_pod_still_repels_so_a_pod_is_not_moved_where_it_would_stay_pending() {
        let zoned = |name: &str, id: u32, zone: &str, cordoned: bool| {
            let mut n = (*node(name, "ss", id, "4")).clone();
            Arc::make_mut(&mut n.labels).insert("topology.kubernetes.io/zone".into(), zone.into());
            n.unschedulable = cordoned;
            Arc::new(n)
        };
        // a (zone 1) has a cache pod; b (zone 2) has room for it; c (zone 2, cordoned) runs
        // a pod that keeps cache pods out of its zone.
        let nodes = [
            zoned("a", 0, "1", false),
            zoned("b", 1, "2", false),
            zoned("c", 2, "2", true),
        ];
        let cache = (*pod("cache", "a", "500m")).clone();
        let mut cache = cache;
        Arc::make_mut(&mut cache.labels).insert("app".into(), "cache".into());
        let guard = Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "guard", "namespace": "default", "uid": "uid-guard", "labels": {"app": "guard"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "g", "uid": "g", "controller": true}]},
                "spec": {"nodeName": "c", "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}],
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "cache"}}}]}}},
            }))
            .unwrap(),
        ));
        // b is busy enough to stay (3 of 4 cpu) and has room for the cache pod.
        let busy = pod("busy", "b", "3");
        let out = run(
            &[group("ss", Some(3), 0)],
            &nodes,
            &[Arc::new(cache), guard, busy],
            &[],
        );
        assert!(
            matches!(out.blocked.get("a"), Some(Blocker::NoPlaceFor(p)) if p == "default/cache"),
            "{out:?}"
        );
        assert!(names(&out).is_empty(), "{out:?}");
    }

    #[test]
    fn a_pod_whose_disk_lives_in_its_zone_is_never_moved_to_another_zone() {
        use crate::pods::volumes::tests::{claim, class, disk};
        let zoned = |name: &str, id: u32, zone: &str| {
            let mut n = (*node(name, "ss", id, "4")).clone();
            Arc::make_mut(&mut n.labels)
                .insert("topology.disk.csi.azure.com/zone".into(), zone.into());
            Arc::new(n)
        };
        let nodes = [zoned("a", 0, "westeurope-1"), zoned("b", 1, "westeurope-2")];
        let mut db = (*pod("db-0", "a", "500m")).clone();
        let mut spec = db.spec().clone();
        spec.volumes = Some(vec![serde_json::from_value(
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}),
        )
        .unwrap()]);
        db.shape = Arc::new(crate::pods::record::PodShape::new(spec));
        // b is busy enough to stay, with room for db-0.
        let pods = [Arc::new(db), pod("busy", "b", "3")];
        let volumes = Volumes::new(
            &[claim("data-db-0", Some("pv-0"), "managed-csi")],
            &[disk("pv-0", "westeurope-1")],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[],
        );
        let c = unneeded(&DownInput {
            now: k8s_openapi::jiff::Timestamp::now(),
            groups: &[group("ss", Some(2), 0)],
            nodes: &nodes,
            pods: &PodIndex::of(&pods),
            pdbs: &[],
            threshold: 0.5,
            busy: &HashSet::new(),
            unready: &HashSet::new(),
            previously: &HashSet::new(),
            non_empty_candidates: 30,
            volumes: &volumes,
            namespaces: NamespaceLabels::none(),
            keep_jobs: false,
        });
        assert!(
            matches!(c.blocked.get("a"), Some(Blocker::NoPlaceFor(p)) if p == "default/db-0"),
            "{c:?}"
        );
        // Without the volume's zone, it would have moved.
        let c = run(&[group("ss", Some(2), 0)], &nodes, &pods, &[]);
        assert_eq!(names(&c), ["a"]);
    }

    /// Issue 41: a removal that stopped without making its node needed does not start the node's
    /// unneeded time over; a node that became needed meanwhile starts from scratch.
    #[test]
    fn a_stopped_removal_gives_its_node_back_its_unneeded_time_unless_it_became_needed() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(300);
        let mut started = HashMap::from([
            ("a".to_string(), t0),
            ("b".to_string(), t0),
            ("c".to_string(), t0),
        ]);
        // The pass after: `a` is unneeded again (new to the list, so `track` said "now"), `b`
        // is needed, `c` is still being removed.
        let mut since = HashMap::from([("a".to_string(), later)]);
        let busy = HashSet::from(["c".to_string()]);
        resume(&mut since, &mut started, &busy);
        assert_eq!(since["a"], t0, "a keeps the time it had been unneeded");
        assert!(!since.contains_key("b"));
        assert_eq!(
            started.keys().collect::<Vec<_>>(),
            ["c"],
            "c waits for its end"
        );
        // c's removal ended (the node is gone): forgotten.
        resume(&mut since, &mut started, &HashSet::new());
        assert!(started.is_empty() && !since.contains_key("c"));
    }

    /// `pod` on `node`, deleted `ago` before now with a grace period of `grace` seconds.
    fn deleted(name: &str, node: &str, ago: i64, grace: i64) -> Arc<PodRecord> {
        let at = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(ago))
            .unwrap();
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                    "deletionTimestamp": at.to_string(), "deletionGracePeriodSeconds": grace,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]},
            }))
            .unwrap(),
        ))
    }

    /// Issue 41: cluster-autoscaler's long-terminating rule. A pod deleted more than its grace
    /// period plus 30 s ago (its kubelet dead, nobody confirms) is no pod to move, blocks
    /// nothing and counts in no utilisation; one still within that time is a pod like any.
    #[test]
    fn a_pod_deleted_longer_ago_than_its_grace_period_plus_thirty_seconds_no_longer_holds_its_node()
    {
        let nodes = [node("a", "ss", 0, "4"), node("b", "ss", 1, "4")];
        // `a` holds a 3-cpu pod deleted 61 s ago with a 30 s grace period: long terminating.
        let pods = [deleted("gone", "a", 61, 30), pod("p", "b", "3")];
        let c = run(&[group("ss", Some(2), 0)], &nodes, &pods, &[]);
        assert_eq!(names(&c), ["a"]);
        assert!(
            c.unneeded[0].is_empty(),
            "nothing to move: {:?}",
            c.unneeded[0].pods
        );
        assert_eq!(c.unneeded[0].utilization, 0.0);
        // 59 s ago: still within 30 + 30 s, so it would have to move, and there is no room.
        let pods = [deleted("going", "a", 59, 30), pod("p", "b", "3")];
        let c = run(&[group("ss", Some(2), 0)], &nodes, &pods, &[]);
        assert!(names(&c).is_empty(), "{:?}", names(&c));
    }

    #[test]
    fn empty_nodes_come_first_then_underused_ones_and_busy_nodes_are_left_alone() {
        let nodes = [
            node("a", "ss", 0, "4"),
            node("b", "ss", 1, "4"),
            node("c", "ss", 2, "4"),
            node("d", "ss", 3, "4"),
        ];
        let pods = [pod("p1", "b", "1"), pod("p2", "c", "3")];
        let c = run(&[group("ss", Some(4), 0)], &nodes, &pods, &[]);
        assert_eq!(names(&c), ["a", "d", "b"]);
        assert_eq!(c.unneeded[0].instance_id, "0");
        assert_eq!(c.unneeded[2].pods, ["uid-p1"]);
        // b's pod would move to c, which is then full.
        assert!(matches!(c.blocked.get("c"), Some(Blocker::Utilized(_))));
        let busy = HashSet::from(["a".to_string()]);
        let c = run_busy(&[group("ss", Some(4), 0)], &nodes, &pods, &[], &busy);
        assert_eq!(names(&c), ["d", "b"]);
    }

    #[test]
    fn two_underused_nodes_never_count_on_the_same_free_room() {
        // Each of a and b holds 1.5 cpu; c has room for one of them, not both.
        let nodes = [
            node("a", "ss", 0, "4"),
            node("b", "ss", 1, "4"),
            node("c", "other", 0, "4"),
        ];
        let pods = [
            pod("pa", "a", "1500m"),
            pod("pb", "b", "1500m"),
            pod("pc", "c", "2"),
        ];
        let c = run(&[group("ss", Some(2), 0)], &nodes, &pods, &[]);
        assert_eq!(names(&c), ["a"]);
        assert!(c.blocked.contains_key("b"), "{c:?}");
    }

    #[test]
    fn a_budgets_disruptions_are_spent_across_the_nodes_of_one_pass() {
        let nodes = [
            node("c", "other", 0, "8"),
            node("a", "ss", 0, "4"),
            node("b", "ss", 1, "4"),
        ];
        let pods = [pod("pa", "a", "1"), pod("pb", "b", "1")];
        let pdb: Arc<PodDisruptionBudget> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
                "status": {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2},
            }))
            .unwrap(),
        );
        let c = run(&[group("ss", Some(2), 0)], &nodes, &pods, &[pdb]);
        assert_eq!(names(&c), ["a"]);
        assert_eq!(
            c.blocked.get("b"),
            Some(&Blocker::PdbViolated {
                pdb: "default/web".into()
            })
        );
    }

    #[test]
    fn a_node_goes_only_after_it_has_been_unneeded_for_the_whole_unneeded_time() {
        let nodes = [node("a", "ss", 0, "4")];
        let c = run(&[group("ss", Some(3), 0)], &nodes, &[], &[]);
        let t0 = Instant::now();
        let mut since = HashMap::new();
        track(&mut since, &c, t0);
        let groups = [group("ss", Some(3), 0)];
        let at = |since: &HashMap<String, Instant>, d: u64| {
            select(&c, &groups, since, t0 + Duration::from_secs(d), LIMITS)
        };
        assert_eq!(at(&since, 599).0, Vec::<usize>::new());
        assert_eq!(at(&since, 599).1.get("a"), Some(&"unneeded_time"));
        assert_eq!(at(&since, 600).0, [0]);
        // Needed again for a moment: the clock starts over.
        track(
            &mut since,
            &Candidates::default(),
            t0 + Duration::from_secs(300),
        );
        track(&mut since, &c, t0 + Duration::from_secs(301));
        assert_eq!(at(&since, 700).0, Vec::<usize>::new());
        assert_eq!(at(&since, 901).0, [0]);
    }

    #[test]
    fn no_node_goes_from_a_group_that_grew_recently_or_whose_size_is_unknown() {
        let nodes = [node("a", "ss", 0, "4")];
        let c = run(&[group("ss", Some(3), 0)], &nodes, &[], &[]);
        let t = Instant::now();
        let since = all_since(&c, t);
        let later = t + Duration::from_secs(3600);
        let mut grown = group("ss", Some(3), 0);
        grown.recently_grown = true;
        assert_eq!(
            select(&c, &[grown], &since, later, LIMITS).1.get("a"),
            Some(&"delay_after_add")
        );
        assert_eq!(
            select(&c, &[group("ss", None, 0)], &since, later, LIMITS)
                .1
                .get("a"),
            Some(&"unknown_size")
        );
    }

    #[test]
    fn never_below_the_floor_counting_deletions_in_flight_and_this_pass() {
        let nodes = [
            node("a", "ss", 0, "4"),
            node("b", "ss", 1, "4"),
            node("c", "ss", 2, "4"),
        ];
        let c = run(&[group("ss", Some(5), 2)], &nodes, &[], &[]);
        let t = Instant::now();
        let since = all_since(&c, t);
        let later = t + Duration::from_secs(3600);
        // 5 nodes, floor 2, one deletion already in flight: two more may go, not three.
        let mut g = group("ss", Some(5), 2);
        g.deleting = 1;
        let (chosen, waiting) = select(&c, &[g], &since, later, LIMITS);
        assert_eq!(chosen, [0, 1]);
        assert_eq!(waiting.get("c"), Some(&"min_size"));
    }

    #[test]
    fn with_balancing_equally_unneeded_nodes_of_the_larger_group_go_first() {
        // `small` (3 nodes) lists first by name; `wide` has 5. Two may go this pass.
        let mut nodes: Vec<_> = (0..3)
            .map(|i| node(&format!("a-small-{i}"), "small", i, "4"))
            .collect();
        nodes.extend((0..5).map(|i| node(&format!("b-wide-{i}"), "wide", i, "4")));
        let groups = [group("small", Some(3), 0), group("wide", Some(5), 0)];
        let c = run(&groups, &nodes, &[], &[]);
        let t = Instant::now();
        let since = all_since(&c, t);
        let later = t + Duration::from_secs(3600);
        let pick = |balance| {
            let limits = Limits {
                max_per_pass: 3,
                balance,
                ..LIMITS
            };
            let (chosen, _) = select(&c, &groups, &since, later, limits);
            chosen
                .iter()
                .map(|i| c.unneeded[*i].node.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(false), ["a-small-0", "a-small-1", "a-small-2"]);
        // wide 5 → 4, then 4 vs 3: wide again, then 3 vs 3: the first listed.
        assert_eq!(pick(true), ["b-wide-0", "b-wide-1", "a-small-0"]);
    }

    #[test]
    fn empty_nodes_go_in_bulk_nodes_with_pods_one_at_a_time_and_never_more_than_the_pass_allows() {
        let mut nodes = vec![node("big", "other", 0, "64")];
        nodes.extend((0..6).map(|i| node(&format!("e{i}"), "ss", i, "4")));
        nodes.push(node("p", "ss", 10, "4"));
        nodes.push(node("q", "ss", 11, "4"));
        let pods = [pod("x", "p", "1"), pod("y", "q", "1")];
        let groups = [group("ss", Some(20), 0)];
        let c = run(&groups, &nodes, &pods, &[]);
        let t = Instant::now();
        let since = all_since(&c, t);
        let later = t + Duration::from_secs(3600);
        let limits = Limits {
            max_empty_bulk_delete: 4,
            ..LIMITS
        };
        let (chosen, waiting) = select(&c, &groups, &since, later, limits);
        let chosen: Vec<&str> = chosen
            .iter()
            .map(|i| c.unneeded[*i].node.as_str())
            .collect();
        assert_eq!(chosen, ["e0", "e1", "e2", "e3", "p"]);
        assert_eq!(waiting.get("e4"), Some(&"max_empty_bulk_delete"));
        assert_eq!(waiting.get("q"), Some(&"one_drain_at_a_time"));
        let limits = Limits {
            max_per_pass: 2,
            draining: true,
            ..LIMITS
        };
        let (chosen, waiting) = select(&c, &groups, &since, later, limits);
        assert_eq!(chosen.len(), 2);
        assert_eq!(waiting.get("p"), Some(&"max_per_pass"));
        let (chosen, waiting) = select(
            &c,
            &groups,
            &since,
            later,
            Limits {
                draining: true,
                ..LIMITS
            },
        );
        assert_eq!(chosen.len(), 6);
        assert_eq!(waiting.get("p"), Some(&"one_drain_at_a_time"));
    }

    #[test]
    fn a_scale_up_of_any_group_holds_every_group_unless_the_delay_is_local() {
        let ten = Duration::from_secs(600);
        let groups = || {
            let mut grown = group("grown", Some(2), 0);
            grown.grown_ago = Some(Duration::from_secs(120));
            let mut old = group("old", Some(2), 0);
            old.grown_ago = Some(Duration::from_secs(3600));
            vec![grown, old, group("never", Some(2), 0)]
        };
        let mut all = groups();
        hold_after_add(&mut all, ten, false);
        assert!(all.iter().all(|g| g.recently_grown), "{all:?}");
        assert!(all
            .iter()
            .all(|g| g.grown_ago == Some(Duration::from_secs(120))));
        let mut local = groups();
        hold_after_add(&mut local, ten, true);
        let held: Vec<bool> = local.iter().map(|g| g.recently_grown).collect();
        assert_eq!(held, [true, false, false]);
        let mut past = groups();
        hold_after_add(&mut past, Duration::from_secs(60), false);
        assert!(past.iter().all(|g| !g.recently_grown), "the hold ran out");
    }
}
