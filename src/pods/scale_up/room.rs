//! Step 1 of a decision: what is there already. The nodes of each group (registered, still
//! booting, never coming), every node's live state, the pods asking for capacity, each group's
//! template, the nodes on their way, and the pending pods that room takes.

use super::{GroupInput, ScaleUpInput, ScaleUpPlan, WhyNot};
use crate::node_groups::{is_ready, is_starting, schedulable, GroupIndex};
use crate::pods::estimate::{DomainIndex, Prepared};
use crate::pods::fit::NodeState;
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::template::{daemonset_pods, subtract_daemonsets, template_for};
use crate::pods::topology::Topology;
use crate::pods::volumes::{has_claims, Verdict, Volumes};
use k8s_openapi::api::apps::v1::DaemonSet;
use std::collections::HashMap;
use std::sync::Arc;

/// Per group (by index), what its registered nodes say.
pub(super) struct Census<'i> {
    /// Nodes of the group registered.
    registered: Vec<u32>,
    /// Registered but still booting: on their way, like nodes not registered yet.
    starting: Vec<u32>,
    /// `Failed` or stopped instances without a Node: part of the capacity, never coming.
    failed: Vec<u32>,
    /// A Ready schedulable node of the group: the template (cluster-autoscaler's order of
    /// truth).
    live: Vec<Option<&'i NodeRecord>>,
}

impl<'i> Census<'i> {
    /// Counts `input.nodes` by group.
    pub(super) fn of(input: &'i ScaleUpInput) -> Self {
        let groups = &input.groups;
        let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
        let mut c = Census {
            registered: vec![0; groups.len()],
            starting: vec![0; groups.len()],
            failed: groups
                .iter()
                .map(|g| u32::try_from(g.failed.len() + g.stopped.len()).unwrap_or(u32::MAX))
                .collect(),
            live: vec![None; groups.len()],
        };
        for node in &input.nodes {
            let Some(i) = index.group_of(node) else {
                continue;
            };
            c.registered[i] += 1;
            let id = node.instance_id();
            let listed = |ids: &[String]| id.is_some_and(|id| ids.iter().any(|f| f == id));
            let never = listed(&groups[i].stopped);
            if never || listed(&groups[i].failed) {
                c.failed[i] = c.failed[i].saturating_sub(1);
            }
            if !never && is_starting(node, input.now, input.node_startup) {
                c.starting[i] += 1;
            } else if c.live[i].is_none() && is_ready(node) && schedulable(node) {
                c.live[i] = Some(node);
            }
        }
        c
    }

    /// Nodes of group `i` requested and not registered, plus registered and still booting;
    /// not the instances Azure gave up on.
    fn upcoming(&self, i: usize, capacity: i64) -> u32 {
        let settled = self.registered[i].saturating_sub(self.starting[i]);
        u32::try_from(capacity.max(0))
            .unwrap_or(u32::MAX)
            .saturating_sub(settled)
            .saturating_sub(self.failed[i])
    }
}

/// Every node with the pods the index keeps bound to it (shared, not placed again): the ones
/// that take pods (Ready, schedulable; a pod nominated to one, a preemption under way, takes its
/// room there, as it will), and the ones that take none (not Ready, cordoned), whose pods still
/// count for spread and affinity, as the scheduler counts them.
pub(super) fn node_states(input: &ScaleUpInput) -> (Vec<NodeState>, Vec<NodeState>) {
    let mut room = Vec::new();
    let mut elsewhere = Vec::new();
    for n in &input.nodes {
        let placed = input.pods.bound(&n.name).cloned().unwrap_or_default();
        let mut state = NodeState::with_placed(n, placed);
        state.set_volume_limits(input.volumes.limits(&n.name));
        if is_ready(n) && schedulable(n) {
            if let Some(nominated) = input.pods.nominated(&n.name) {
                for pod in nominated.pods() {
                    state.place(pod.clone());
                }
            }
            room.push(state);
        } else {
            elsewhere.push(state);
        }
    }
    (room, elsewhere)
}

/// The pods asking for capacity, from every source, booked ones first (so the room already
/// there goes to them before anyone else). A pod whose volumes wait for something no node brings,
/// or that the volume filters cannot simulate, is reported in `out` and not asked for.
pub(super) fn asking(input: &ScaleUpInput, out: &mut ScaleUpPlan) -> Vec<Arc<PodRecord>> {
    let booked = input.sources.iter().filter(|s| s.booked());
    let unbooked = input.sources.iter().filter(|s| !s.booked());
    let mut pending = Vec::new();
    for pod in booked.chain(unbooked).flat_map(|s| s.asking(&input.pods)) {
        if has_claims(pod.spec()) {
            match input.volumes.of_pod(&pod) {
                Verdict::Waiting(why) => {
                    out.waiting.insert(pod.key(), why);
                    continue;
                }
                Verdict::NotSimulated(why) => {
                    out.not_simulated.insert(pod.key(), why.to_string());
                    continue;
                }
                Verdict::None | Verdict::Needs(_) => {}
            }
        }
        pending.push(pod);
    }
    pending
}

/// Each group's template, from the census's live nodes ([`group_templates`]).
pub(super) fn templates(input: &ScaleUpInput, census: &Census) -> Vec<Result<NodeState, WhyNot>> {
    group_templates(
        &input.groups,
        &census.live,
        &input.daemonsets,
        &input.volumes,
    )
}

/// Each group's template: what a new node of it would offer, DaemonSets' pods taken off, from
/// `live[i]` (a Ready node of group `i`, with its volume limits) when there is one, else its
/// learned node, else its shape ([`template_for`]). The one place a new node is imagined:
/// scale-up's decision and consolidation's replace (`crate::pods::consolidate`) both read it.
pub fn group_templates(
    groups: &[GroupInput],
    live: &[Option<&NodeRecord>],
    daemonsets: &[Arc<DaemonSet>],
    volumes: &Volumes,
) -> Vec<Result<NodeState, WhyNot>> {
    let daemonsets = daemonset_pods(daemonsets);
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let live = live
                .get(i)
                .copied()
                .flatten()
                .map(|node| (node, volumes.limits(&node.name)))
                .or_else(|| g.learned.as_deref().map(|node| (node, None)));
            let template = template_for(&g.name, live, g.shape.as_ref())
                .map(|(t, _)| t)
                .map_err(|e| WhyNot::new("no_template", e.to_string()));
            template.map(|mut t| {
                subtract_daemonsets(&mut t, &daemonsets);
                t
            })
        })
        .collect()
}

/// The nodes on their way of each healthy group, as copies of its template: room that pending
/// pods take before any group grows.
pub(super) fn add_upcoming(
    room: &mut Vec<NodeState>,
    groups: &[GroupInput],
    census: &Census,
    templates: &[Result<NodeState, WhyNot>],
) {
    for (i, g) in groups.iter().enumerate() {
        let (Some(capacity), Ok(template), None) = (g.capacity, &templates[i], &g.unhealthy) else {
            continue;
        };
        for k in 0..census.upcoming(i, capacity) {
            let mut n = template.clone();
            n.name = format!("{}-upcoming-{k}", g.name);
            room.push(n);
        }
    }
}

/// Takes off `pending` the pods the room already there takes (recorded as already provided).
pub(super) fn take_room_there(
    pending: &mut Vec<Prepared>,
    room: &mut [NodeState],
    topology: &mut Topology,
    out: &mut ScaleUpPlan,
) {
    let mut start = HashMap::new();
    let mut by_domain = DomainIndex::default();
    pending.retain(
        |pod| match by_domain.first_fit(room, pod, &mut start, topology) {
            Some(_) => {
                out.already_provided.push(pod.key.clone());
                false
            }
            None => true,
        },
    );
}
