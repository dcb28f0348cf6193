//! One scale-up decision for a batch of pending pods: which node groups get how many new nodes.
//! Pure code: the caller hands in snapshots (nodes, pods, DaemonSets, what Azure says each group
//! has) and gets a plan back; no I/O, no clock.
//!
//! The order is cluster-autoscaler's: pods that the room already there can take (free room on
//! Ready nodes, then nodes requested but not registered yet) are taken off first, so a pod is
//! never provisioned twice; then each round asks every healthy group for an estimate, lets the
//! expander pick one, and removes the pods it places, until no group can place more. A pod that
//! no group can take keeps, per group, the reason why.

use super::demand::DemandPods;
use super::estimate::Estimate;
use super::estimate::{
    batches, estimate_prepared, first_fit, prepare, Batch, DomainIndex, GroupCapacity, Refusal,
};
use super::expander::{choose_ref, Costs, Expander, GroupCost};
use super::fit::NodeState;
use super::index::PodIndex;
use super::record::NodeRecord;
use super::record::PodRecord;
use super::template::{daemonset_pods, subtract_daemonsets, template_for, GroupShape};
use super::topology::{NamespaceLabels, Topology};
use super::volumes::{has_claims, Verdict, Volumes};
pub use crate::capacity::QuotaPool;
pub use crate::node_groups::Backing;
use crate::node_groups::{is_ready, is_starting, schedulable, GroupIndex};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// One node group as the scale-up sees it.
#[derive(Debug, Clone)]
pub struct GroupInput<'a> {
    /// Node-group name.
    pub name: String,
    /// How its nodes are recognised.
    pub backing: Backing,
    /// Bounds.
    pub min: u32,
    /// Bounds.
    pub max: u32,
    /// Capacity Azure reported; `None` (unknown): the group is never planned.
    pub capacity: Option<i64>,
    /// VM size, tags or pool properties, for a template when no node of the group is Ready.
    pub shape: Option<GroupShape<'a>>,
    /// Why the group is not to be grown now (failing to provision, quota cool-down), if so.
    pub unhealthy: Option<WhyNot>,
    /// Instance ids Azure lists in the `Failed` provisioning state: counted in the capacity,
    /// but no node is coming from them (unless one already registered).
    pub failed: Vec<String>,
    /// Instance ids stopped and deallocated (a spot VM evicted with policy `Deallocate`):
    /// counted in the capacity, never on their way, and a Node of theirs is not booting,
    /// whatever its age.
    pub stopped: Vec<String>,
    /// The quota pools (indices into [`ScaleUpInput::quota`]) a new node of the group draws
    /// its vCPUs from; empty: not capped by quota (usages unknown).
    pub quota: Vec<usize>,
    /// vCPUs of one node (the VM size's), when the size is known.
    pub vcpus: Option<u32>,
    /// Workloads ([`PodRecord::workload`]) the group is passed over for, with why: an earlier
    /// scale-up of the group for their pods did not help.
    pub passed_over: Arc<BTreeMap<String, String>>,
    /// A node of the group that registered unlike its generated template predicted: the
    /// template when no node of the group is Ready (see [`template_for`]).
    pub learned: Option<Arc<NodeRecord>>,
}

/// Everything one decision looks at.
#[derive(Debug, Clone)]
pub struct ScaleUpInput<'a> {
    /// The node groups.
    pub groups: Vec<GroupInput<'a>>,
    /// Nodes in the cluster.
    pub nodes: Vec<Arc<NodeRecord>>,
    /// Pods not finished, by where they are (the pods reflector keeps the index).
    pub pods: Arc<PodIndex>,
    /// DaemonSets (their pods take room on every new node).
    pub daemonsets: Vec<Arc<DaemonSet>>,
    /// The expander.
    pub expander: Expander,
    /// Where the pods asking for capacity come from: the pending pods
    /// ([`super::demand::PendingPods`], with `expendablePodsPriorityCutoff`), and pods made up
    /// from templates (ProvisioningRequests, their bookings).
    pub sources: Vec<Arc<dyn DemandPods>>,
    /// Seed for the random expander.
    pub seed: u64,
    /// Per group, USD per hour of one new node (the `price` and `least-cost` expanders read
    /// it; a group missing here is one they cannot judge).
    pub prices: Arc<BTreeMap<String, f64>>,
    /// The time of the decision: a node that is not Ready yet counts as on its way (upcoming)
    /// while it is younger than `node_startup`.
    pub now: Timestamp,
    /// How long a registered node may take to turn Ready before it stops counting as upcoming
    /// (`maxNodeProvisionTime`; cluster-autoscaler's `MaxNodeStartupTime` is the same 15 min).
    pub node_startup: std::time::Duration,
    /// What the subscription's vCPU quota leaves, per pool, as last read. Groups draw on it in
    /// the order the expander grows them.
    pub quota: Vec<QuotaPool>,
    /// `balanceSimilarNodeGroups`: split each scale-up across the groups similar to the chosen one.
    pub balance_similar: bool,
    /// The claims, volumes, storage classes and CSI nodes the volume filters read.
    pub volumes: Arc<Volumes>,
    /// Namespaces' labels, for affinity terms that select namespaces by them.
    pub namespaces: Arc<NamespaceLabels>,
}

/// What one decision says.
#[derive(Debug, Clone, Default)]
pub struct ScaleUpPlan {
    /// Per group that grows: the capacity it needs at least (observed capacity + new nodes).
    pub targets: BTreeMap<String, i64>,
    /// Pending pods that asked for capacity.
    pub pending: usize,
    /// Pods a group's new nodes will take: `namespace/name` → group.
    pub triggered: BTreeMap<String, String>,
    /// Pods the room already there takes (free room on nodes, upcoming nodes).
    pub already_provided: Vec<String>,
    /// Pods no group can take, with the reason per group.
    pub unfit: BTreeMap<String, Vec<(String, WhyNot)>>,
    /// Pods whose constraints this planner does not simulate: reported, never planned for.
    pub not_simulated: BTreeMap<String, String>,
    /// Pods waiting for something no new node brings (an unbound claim of an `Immediate`
    /// class, a claim not created yet), with kube-scheduler's words: reported, never planned
    /// for.
    pub waiting: BTreeMap<String, String>,
    /// Groups whose growth quota cut short: group → what it got and which pool ran out. The
    /// pods the cut left over went on to the next group the expander chose.
    pub capped: BTreeMap<String, QuotaCapped>,
    /// Rounds the decision took (one group chosen per round).
    pub rounds: u32,
    /// The template each group in `targets` was planned with (what its new nodes are
    /// predicted to be, DaemonSet pods placed): compared with the nodes that register.
    pub templates: BTreeMap<String, NodeState>,
}

/// A group's growth cut short by quota in one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaCapped {
    /// New nodes the group got.
    pub nodes: u32,
    /// The pool that ran out.
    pub pool: String,
    /// vCPUs that pool had left before this group drew on it.
    pub remaining: i64,
}

impl std::fmt::Display for QuotaCapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "capped at +{} by quota: {} had {} vCPUs left",
            self.nodes, self.pool, self.remaining
        )
    }
}

/// How many new nodes of `g` the quota allows, and the pool that allows fewest
/// (`None`: not capped).
fn quota_room(g: &GroupInput, pools: &[QuotaPool]) -> Option<(u32, usize)> {
    let vcpus = i64::from(g.vcpus?.max(1));
    g.quota
        .iter()
        .filter_map(|&p| Some((pools.get(p)?.remaining.max(0) / vcpus, p)))
        .min_by_key(|(n, _)| *n)
        .map(|(n, p)| (u32::try_from(n).unwrap_or(u32::MAX), p))
}

/// Why a group does not take a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhyNot {
    /// A short, bounded name (the `reason` metric label).
    pub label: &'static str,
    /// In words, for logs and Events.
    pub text: String,
}

impl WhyNot {
    fn new(label: &'static str, text: impl Into<String>) -> Self {
        Self {
            label,
            text: text.into(),
        }
    }
}

impl std::fmt::Display for WhyNot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Which group (index into `groups`) a node belongs to, if any.
pub fn group_of(node: &NodeRecord, groups: &[GroupInput]) -> Option<usize> {
    GroupIndex::of_backings(groups.iter().map(|g| &g.backing)).group_of(node)
}

/// Each group's template: what a new node of it would offer, DaemonSets' pods taken off, from
/// `live[i]` (a Ready node of group `i`) when there is one, else its learned node, else its
/// shape ([`template_for`]). The one place a new node is imagined: scale-up's decision and
/// consolidation's replace (`crate::pods::consolidate`) both read it.
pub fn group_templates(
    groups: &[GroupInput],
    live: &[Option<&NodeRecord>],
    daemonsets: &[Arc<DaemonSet>],
    volumes: &Volumes,
) -> Vec<Result<NodeState, WhyNot>> {
    let daemonsets = daemonset_pods(daemonsets);
    let mut templates: Vec<Result<NodeState, WhyNot>> = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let live = live
            .get(i)
            .copied()
            .flatten()
            .map(|node| (node, volumes.limits(&node.name)))
            .or_else(|| g.learned.as_deref().map(|node| (node, None)));
        let t = template_for(&g.name, live, g.shape.as_ref())
            .map(|(t, _)| t)
            .map_err(|e| WhyNot::new("no_template", e.to_string()));
        templates.push(t.map(|mut t| {
            subtract_daemonsets(&mut t, &daemonsets);
            t
        }));
    }
    templates
}

/// The decision for the pods pending now.
pub fn plan(input: &ScaleUpInput) -> ScaleUpPlan {
    let mut out = ScaleUpPlan::default();
    let groups = &input.groups;

    // Nodes per group, and the live state of every Ready schedulable node.
    let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
    let mut registered = vec![0u32; groups.len()];
    // Registered but still booting: on their way, like nodes not registered yet.
    let mut starting = vec![0u32; groups.len()];
    let mut live_template: Vec<Option<&NodeRecord>> = vec![None; groups.len()];
    // `Failed` instances without a Node: part of the capacity, never coming.
    let mut failed: Vec<u32> = groups
        .iter()
        .map(|g| u32::try_from(g.failed.len() + g.stopped.len()).unwrap_or(u32::MAX))
        .collect();
    for node in &input.nodes {
        let Some(i) = index.group_of(node) else {
            continue;
        };
        registered[i] += 1;
        let id = node.instance_id();
        let listed = |ids: &[String]| id.is_some_and(|id| ids.iter().any(|f| f == id));
        let never = listed(&groups[i].stopped);
        if never || listed(&groups[i].failed) {
            failed[i] = failed[i].saturating_sub(1);
        }
        if !never && is_starting(node, input.now, input.node_startup) {
            starting[i] += 1;
        } else if live_template[i].is_none() && is_ready(node) && schedulable(node) {
            live_template[i] = Some(node);
        }
    }
    // Every node with the pods the index keeps bound to it (shared, not placed again); a pod
    // nominated to a Ready schedulable node (a preemption under way) takes its room there, as it
    // will.
    let mut room: Vec<NodeState> = Vec::new();
    // Nodes that take no pod (not Ready, cordoned): their pods still count for spread and
    // affinity, as the scheduler counts them.
    let mut elsewhere: Vec<NodeState> = Vec::new();
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
    // The pods asking for capacity, from every source; booked ones first, so the room already
    // there goes to them before anyone else (step 1 places pods in this order).
    let mut asking: Vec<Arc<PodRecord>> = Vec::new();
    for source in input.sources.iter().filter(|s| s.booked()) {
        asking.extend(source.asking(&input.pods));
    }
    for source in input.sources.iter().filter(|s| !s.booked()) {
        asking.extend(source.asking(&input.pods));
    }
    let mut pending: Vec<Arc<PodRecord>> = Vec::new();
    for pod in asking {
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
    out.pending = pending.len() + out.not_simulated.len() + out.waiting.len();
    if pending.is_empty() {
        return out;
    }
    let mut pending = prepare(&pending);

    // 1. Room already there: free room on Ready nodes (above), then upcoming nodes of healthy
    // groups.
    let templates = group_templates(groups, &live_template, &input.daemonsets, &input.volumes);
    for (i, g) in groups.iter().enumerate() {
        let (Some(capacity), Ok(template), None) = (g.capacity, &templates[i], &g.unhealthy) else {
            continue;
        };
        // Requested and not registered, plus registered and still booting; not the instances
        // Azure gave up on.
        let settled = registered[i].saturating_sub(starting[i]);
        let upcoming = u32::try_from(capacity.max(0))
            .unwrap_or(u32::MAX)
            .saturating_sub(settled)
            .saturating_sub(failed[i]);
        for k in 0..upcoming {
            let mut n = template.clone();
            n.name = format!("{}-upcoming-{k}", g.name);
            room.push(n);
        }
    }
    // What other nodes' pods say (spread, affinity), counted over the cluster and the nodes on
    // their way, then followed through the decision. The groups that may grow, and by how many
    // nodes (their max and the quota left): a zone only they serve is a domain with no pods
    // yet, and none is when they cannot grow (a zone whose group is out of quota is not one the
    // pods can spread to, and the scheduler will not count it either).
    let growable: Vec<(&GroupInput, &NodeState, u32)> = groups
        .iter()
        .zip(&templates)
        .filter(|(g, _)| g.unhealthy.is_none())
        .filter_map(|(g, t)| {
            let t = t.as_ref().ok()?;
            let headroom = u32::try_from(i64::from(g.max) - g.capacity?).ok()?;
            let headroom = quota_room(g, &input.quota).map_or(headroom, |(q, _)| q.min(headroom));
            Some((g, t, headroom))
        })
        .filter(|(_, _, n)| *n > 0)
        .collect();
    let possible: Vec<&NodeState> = growable.iter().map(|(_, t, _)| *t).collect();
    // What a share-out may count on: a quota pool several of these groups draw on is split
    // evenly between them, so the plan never reserves more than the pool holds (a group that
    // could take more simply gets less of the plan; the rest go a round at a time).
    let mut sharing: HashMap<usize, i64> = HashMap::new();
    for (g, _, _) in &growable {
        for &p in &g.quota {
            *sharing.entry(p).or_default() += 1;
        }
    }
    let offers: Vec<(&NodeState, u32)> = growable
        .iter()
        .map(|(g, t, headroom)| {
            let vcpus = i64::from(g.vcpus.unwrap_or(0).max(1));
            let pooled = g
                .quota
                .iter()
                .filter_map(|p| {
                    let pool = input.quota.get(*p)?;
                    Some(pool.remaining.max(0) / vcpus / sharing[p].max(1))
                })
                .min();
            let n = pooled.map_or(*headroom, |q| {
                u32::try_from(q).unwrap_or(u32::MAX).min(*headroom)
            });
            (*t, n)
        })
        .collect();
    let mut topology = Topology::new(
        &pending,
        room.iter().chain(&elsewhere),
        &possible,
        &input.volumes,
        &input.namespaces,
    );
    let mut start = HashMap::new();
    let mut by_domain = DomainIndex::default();
    pending.retain(
        |pod| match by_domain.first_fit(&mut room, pod, &mut start, &mut topology) {
            Some(_) => {
                out.already_provided.push(pod.key.clone());
                false
            }
            None => true,
        },
    );

    // The spread classes' pods, shared out over the zones the groups that may grow can take
    // them to (a plan the estimates follow, see `Topology::share_out`).
    if !topology.is_empty() {
        topology.share_out(&pending, &offers);
    }

    // What the price-aware expanders weigh: each group's price and size, the cluster's size.
    let costs = Costs {
        groups: groups
            .iter()
            .filter_map(|g| {
                let per_hour = *input.prices.get(&g.name)?;
                Some((
                    g.name.clone(),
                    GroupCost {
                        per_hour,
                        vcpus: g.vcpus,
                    },
                ))
            })
            .collect(),
        cluster_nodes: input.nodes.len(),
    };

    // 2. Rounds of estimate + expander, one group chosen per round. Each round keeps every
    // group's answer; the last round's answers say why the pods left over fit nowhere. A group
    // may be chosen again in a later round (its new nodes so far count toward its max): pods
    // that spread or follow one another may fit it only after other groups grew.
    let mut added = vec![0u32; groups.len()];
    // New nodes of earlier rounds, by group: with cross-node rules, a pod refused by a group
    // then may fit one of them now.
    let mut grown: Vec<NodeState> = Vec::new();
    let mut grown_group: Vec<usize> = Vec::new();
    let mut answers: Vec<(usize, Result<Estimate, WhyNot>)> = Vec::new();
    // The batches the last round's answers were made for.
    let mut round_batches: Vec<Batch> = Vec::new();
    let mut quota = input.quota.clone();
    // Per group, this round: the max the quota allows when it is below the group's own.
    let mut quota_max: Vec<Option<(u32, usize)>> = vec![None; groups.len()];
    loop {
        while !pending.is_empty() {
            out.rounds += 1;
            if !grown.is_empty() {
                let mut start = HashMap::new();
                pending.retain(
                    |pod| match first_fit(&mut grown, pod, &mut start, &mut topology) {
                        Some(n) => {
                            out.triggered
                                .insert(pod.key.clone(), groups[grown_group[n]].name.clone());
                            false
                        }
                        None => true,
                    },
                );
                if pending.is_empty() {
                    break;
                }
            }
            answers.clear();
            round_batches = batches(&pending);
            for (i, g) in groups.iter().enumerate() {
                let why_not = if let Some(c) = out.capped.get(&g.name) {
                    Some(WhyNot::new(
                        "quota",
                        format!("already grown in this decision, {c}"),
                    ))
                } else if let Some(u) = &g.unhealthy {
                    Some(u.clone())
                } else if g.capacity.is_none() {
                    Some(WhyNot::new(
                        "unknown_size",
                        "size unknown: never planned from",
                    ))
                } else {
                    templates[i].as_ref().err().cloned()
                };
                let (Ok(template), None) = (&templates[i], why_not.clone()) else {
                    answers.push((
                        i,
                        Err(why_not.unwrap_or_else(|| WhyNot::new("no_template", "no template"))),
                    ));
                    continue;
                };
                let capacity = g.capacity.unwrap_or(0).max(0);
                let capacity = u32::try_from(capacity)
                    .unwrap_or(u32::MAX)
                    .saturating_add(added[i]);
                let mut max = g.max;
                quota_max[i] = None;
                if let Some((room, pool)) = quota_room(g, &quota) {
                    let allowed = capacity.saturating_add(room);
                    if allowed < g.max && capacity < g.max {
                        if room == 0 {
                            answers.push((
                                i,
                                Err(WhyNot::new(
                                    "quota",
                                    format!(
                                        "no vCPU quota left: {} has {} vCPUs, a node needs {}",
                                        quota[pool],
                                        quota[pool].remaining.max(0),
                                        g.vcpus.unwrap_or(0)
                                    ),
                                )),
                            ));
                            continue;
                        }
                        max = allowed;
                        quota_max[i] = Some((room, pool));
                    }
                }
                // Upcoming nodes were filled in step 1: the estimate starts from new nodes only.
                let e = estimate_prepared(
                    &GroupCapacity {
                        name: g.name.clone(),
                        template: template.clone(),
                        capacity,
                        registered: capacity,
                        max,
                        passed_over: g.passed_over.clone(),
                    },
                    &pending,
                    &round_batches,
                    &topology,
                );
                answers.push((i, Ok(e)));
            }
            let options: Vec<&Estimate> = answers
                .iter()
                .filter_map(|(_, a)| a.as_ref().ok())
                .collect();
            let Some(best) = choose_ref(&input.expander, &options, input.seed, &costs) else {
                break;
            };
            let Some(i) = answers
                .iter()
                .find(|(_, a)| a.as_ref().is_ok_and(|e| std::ptr::eq(e, best)))
                .map(|(i, _)| *i)
            else {
                break;
            };
            // What quota cut short, against the pool as it was before this group drew on it.
            if let Some((room, pool)) = quota_max[i] {
                if best.new_nodes >= room {
                    out.capped.insert(
                        groups[i].name.clone(),
                        QuotaCapped {
                            nodes: best.new_nodes,
                            pool: quota[pool].to_string(),
                            remaining: quota[pool].remaining,
                        },
                    );
                }
            }
            let mut placed = vec![false; pending.len()];
            for &p in &best.placed {
                placed[p] = true;
            }
            // With balanceSimilarNodeGroups, the new nodes are spread over the groups similar to
            // the chosen one that take every placed pod too (not when quota bounds the choice).
            // Not when a placed pod spreads or follows others: its count is in the chosen group's
            // zone.
            let split = if input.balance_similar
                && quota_max[i].is_none()
                && !best
                    .placed
                    .iter()
                    .any(|&p| topology.involves(pending[p].class))
            {
                // One pod per batch is enough: its members are alike.
                let mut seen = HashSet::new();
                let pods: Vec<&Arc<PodRecord>> = best
                    .placed
                    .iter()
                    .map(|&p| &pending[p])
                    .filter(|p| seen.insert(p.class))
                    .map(|p| &p.pod)
                    .collect();
                let members: Vec<usize> = std::iter::once(i)
                    .chain((0..groups.len()).filter(|&j| {
                        j != i
                            && !out.capped.contains_key(&groups[j].name)
                            && groups[j].unhealthy.is_none()
                            && groups[j].capacity.is_some()
                            && quota_max[j].is_none()
                            && match (&templates[i], &templates[j]) {
                                (Ok(a), Ok(b)) => {
                                    similar(a, b) && pods.iter().all(|p| b.fits(p).is_ok())
                                }
                                _ => false,
                            }
                    }))
                    .collect();
                balance(best.new_nodes, &members, groups, &added)
            } else {
                vec![(i, best.new_nodes)]
            };
            for &(m, new_nodes) in &split {
                let g = &groups[m];
                added[m] = added[m].saturating_add(new_nodes);
                let capacity = g.capacity.unwrap_or(0).max(0);
                let target = (capacity + i64::from(added[m])).max(i64::from(g.min));
                out.targets.insert(g.name.clone(), target);
                if let Ok(t) = &templates[m] {
                    out.templates
                        .entry(g.name.clone())
                        .or_insert_with(|| t.clone());
                }
                let drawn = i64::from(new_nodes) * i64::from(g.vcpus.unwrap_or(0));
                for &p in &g.quota {
                    if let Some(pool) = quota.get_mut(p) {
                        pool.remaining -= drawn;
                    }
                }
            }
            for &p in &best.placed {
                out.triggered
                    .insert(pending[p].key.clone(), groups[i].name.clone());
            }
            // The estimate's new nodes, dealt out to the groups that take them (in the order of
            // the split): a node another group adds is that group's template with the same pods,
            // so its labels (zone) are the ones later rounds count, and its pods say which group
            // they triggered.
            let mut nodes = best.nodes.iter();
            // An estimate's node is group i's template (with its DaemonSet pods) and then the
            // pods placed on it: only those move to another group's template.
            let base = templates[i].as_ref().map_or(0, |t| t.pods().len());
            for &(m, k) in &split {
                let first = added[m] - k;
                let capacity = u64::try_from(groups[m].capacity.unwrap_or(0).max(0)).unwrap_or(0);
                for (j, n) in nodes.by_ref().take(k as usize).enumerate() {
                    let n = match (m == i, &templates[m]) {
                        (false, Ok(t)) => {
                            let mut moved = t.clone();
                            moved.name = format!(
                                "{}-new-{}",
                                groups[m].name,
                                capacity + u64::from(first) + j as u64
                            );
                            for p in n.pods().get(base..).unwrap_or_default() {
                                out.triggered.insert(p.key(), groups[m].name.clone());
                                moved.place(p.clone());
                            }
                            moved
                        }
                        _ => n.clone(),
                    };
                    if !topology.is_empty() {
                        grown.push(n);
                        grown_group.push(m);
                    }
                }
            }
            if !topology.is_empty() {
                topology = best.topology.clone();
            }
            let mut k = 0;
            pending.retain(|_| {
                k += 1;
                !placed[k - 1]
            });
        }
        // Pods left over while a share-out plan is in force: the plan may have counted on room the
        // decision could not use (a quota pool several groups share, attach limits); the rest go
        // on the plain skew, a round at a time, as the scheduler would place them.
        if pending.is_empty() || !topology.clear_shares() {
            break;
        }
    }
    // Why each pod left over fits nowhere: per group, the last round's answer (made for these
    // pods and `round_batches`), said once per batch and given to each of its members.
    if pending.is_empty() {
        return out;
    }
    let mut batch_of = vec![usize::MAX; pending.len()];
    for (b, batch) in round_batches.iter().enumerate() {
        for &m in &batch.members {
            batch_of[m] = b;
        }
    }
    // Per batch: which answers gave a reason, and the reasons (members alike get the same; a
    // member another group's estimate placed has one reason fewer, and its own list).
    type Reasons = (Vec<bool>, Vec<(String, WhyNot)>);
    let mut reasons: Vec<Option<Reasons>> = vec![None; round_batches.len()];
    let refusals: Vec<HashMap<usize, &Refusal>> = answers
        .iter()
        .map(|(_, a)| match a {
            Ok(e) => e.refused_pods(&round_batches).collect(),
            Err(_) => HashMap::new(),
        })
        .collect();
    for (k, p) in pending.iter().enumerate() {
        let b = batch_of[k];
        let says: Vec<bool> = answers
            .iter()
            .zip(&refusals)
            .map(|((_, a), refused)| a.is_err() || refused.contains_key(&k))
            .collect();
        let why = match reasons.get(b).and_then(Option::as_ref) {
            Some((same, w)) if *same == says => w.clone(),
            _ => {
                let w: Vec<(String, WhyNot)> = answers
                    .iter()
                    .zip(&refusals)
                    .filter_map(|((i, a), refused)| {
                        let w = match a {
                            Err(w) => w.clone(),
                            Ok(_) => match refused.get(&k)? {
                                Refusal::DoesNotFit(u) => WhyNot::new(u.label(), u.to_string()),
                                Refusal::AtMax => match quota_max[*i] {
                                    Some((_, pool)) => WhyNot::new(
                                        "quota",
                                        format!(
                                            "no vCPU quota left for more nodes: {} has {} vCPUs",
                                            quota[pool],
                                            quota[pool].remaining.max(0)
                                        ),
                                    ),
                                    None => WhyNot::new("max_size", Refusal::AtMax.to_string()),
                                },
                                Refusal::PassedOver(why) => {
                                    WhyNot::new("did_not_help", why.clone())
                                }
                            },
                        };
                        Some((groups[*i].name.clone(), w))
                    })
                    .collect();
                if let Some(slot) = reasons.get_mut(b) {
                    *slot = Some((says, w.clone()));
                }
                w
            }
        };
        out.unfit.insert(p.key.clone(), why);
    }
    out
}

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
fn balance(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_groups::{parse_provider_id, AGENTPOOL_LABEL};
    use serde_json::json;

    const SUB: &str = "00000000-0000-0000-0000-000000000000";

    fn node(
        name: &str,
        vmss: &str,
        id: u32,
        cpu: &str,
        mem: &str,
        taints: serde_json::Value,
    ) -> Arc<NodeRecord> {
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {
                    "providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/MC_RG/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{id}"),
                    "taints": taints,
                },
                "status": {
                    "allocatable": {"cpu": cpu, "memory": mem, "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        ))
    }

    fn pending(name: &str, cpu: &str, mem: &str, extra: serde_json::Value) -> Arc<PodRecord> {
        let mut spec = json!({
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "spec": spec,
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))
            .unwrap(),
        ))
    }

    fn group(name: &str, vm_size: &'static str, capacity: i64, max: u32) -> GroupInput<'static> {
        GroupInput {
            name: name.into(),
            backing: Backing::ScaleSet {
                resource_group: "mc_rg".into(),
                name: name.into(),
            },
            min: 0,
            max,
            capacity: Some(capacity),
            shape: Some(GroupShape {
                name: Box::leak(name.to_string().into_boxed_str()),
                vm_size,
                ..GroupShape::default()
            }),
            unhealthy: None,
            failed: Vec::new(),
            stopped: Vec::new(),
            passed_over: Default::default(),
            learned: None,
            quota: Vec::new(),
            vcpus: crate::pods::template::vm_size(vm_size).map(|s| s.vcpu),
        }
    }

    fn input(
        groups: Vec<GroupInput<'static>>,
        nodes: Vec<Arc<NodeRecord>>,
        pods: Vec<Arc<PodRecord>>,
    ) -> ScaleUpInput<'static> {
        ScaleUpInput {
            groups,
            nodes,
            pods: Arc::new(PodIndex::of(&pods)),
            daemonsets: Vec::new(),
            expander: Expander::LeastWaste,
            sources: crate::pods::demand::pending_only(-10),
            seed: 1,
            prices: Default::default(),
            now: Timestamp::now(),
            node_startup: std::time::Duration::from_secs(900),
            quota: Vec::new(),
            balance_similar: false,
            volumes: Arc::default(),
            namespaces: Arc::default(),
        }
    }

    /// `group` in `zones` of westeurope (leaked: the shape borrows them for the test's life).
    fn zonal(name: &str, zones: &[&str], capacity: i64) -> GroupInput<'static> {
        let mut g = group(name, "Standard_D4s_v5", capacity, 10);
        let zones: Vec<String> = zones.iter().map(|z| z.to_string()).collect();
        if let Some(shape) = g.shape.as_mut() {
            shape.location = "westeurope";
            shape.zones = Box::leak(zones.into_boxed_slice());
        }
        g
    }

    const ZONE: &str = crate::pods::template::ZONE_LABEL;

    /// A pod of Deployment `app` (labels `app: <app>`, one ReplicaSet per app), 3 of a
    /// D4s_v5's 4 vCPUs: one per new node.
    fn app_pod(name: &str, app: &str, extra: serde_json::Value) -> Arc<PodRecord> {
        let mut spec = json!({
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "labels": {"app": app},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": format!("rs-{app}"), "controller": true}]},
                "spec": spec,
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))
            .unwrap(),
        ))
    }

    /// `app_pod` bound to `node`.
    fn running(name: &str, app: &str, node: &str, extra: serde_json::Value) -> Arc<PodRecord> {
        let mut extra = extra;
        extra["nodeName"] = json!(node);
        app_pod(name, app, extra)
    }

    /// A Ready node of the `system` scale set in `zone` of westeurope, with no room left.
    fn system_node(name: &str, id: u32, zone: &str) -> Arc<NodeRecord> {
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                    ZONE: format!("westeurope-{zone}")}},
                "spec": {"providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/MC_RG/providers/Microsoft.Compute/virtualMachineScaleSets/system/virtualMachines/{id}")},
                "status": {
                    "allocatable": {"cpu": "100m", "memory": "1Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        ))
    }

    fn three_zones() -> Vec<GroupInput<'static>> {
        vec![
            zonal("z1", &["1"], 0),
            zonal("z2", &["2"], 0),
            zonal("z3", &["3"], 0),
        ]
    }

    fn spread_by_zone(max_skew: i32) -> serde_json::Value {
        json!({"topologySpreadConstraints": [{"maxSkew": max_skew, "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]})
    }

    fn targets(p: &ScaleUpPlan) -> Vec<(&str, i64)> {
        p.targets.iter().map(|(k, v)| (k.as_str(), *v)).collect()
    }

    #[test]
    fn six_pods_spread_over_three_zones_with_max_skew_one_grow_each_zonal_group_by_two() {
        let pods = (0..6)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let p = plan(&input(three_zones(), vec![], pods));
        assert_eq!(targets(&p), [("z1", 2), ("z2", 2), ("z3", 2)], "{p:?}");
        assert_eq!(p.triggered.len(), 6);
        assert!(p.unfit.is_empty() && p.not_simulated.is_empty());
    }

    /// A regional scale set (no zones) of westeurope whose template tags say its nodes are in
    /// `zone`, as cluster-autoscaler's `..._node-template_label_topology.kubernetes.io_zone` tag
    /// does.
    fn regional_tagged(name: &str, zone: &str, capacity: i64) -> GroupInput<'static> {
        let mut g = group(name, "Standard_D4s_v5", capacity, 10);
        if let Some(shape) = g.shape.as_mut() {
            shape.location = "westeurope";
            shape.tags.insert(
                "k8s.io_cluster-autoscaler_node-template_label_topology.kubernetes.io_zone".into(),
                format!("westeurope-{zone}"),
            );
        }
        g
    }

    /// A Ready node of scale set `vmss` in `zone` of westeurope, as a kubelet registered it.
    fn zoned_node(name: &str, vmss: &str, zone: &str) -> Arc<NodeRecord> {
        let mut n = (*node(name, vmss, 0, "4", "16Gi", json!([]))).clone();
        Arc::make_mut(&mut n.labels).insert(ZONE.into(), format!("westeurope-{zone}"));
        Arc::new(n)
    }

    /// Issue 41's runaway, as a user met it: the template of a regional group was given zone
    /// `0`, overriding both its zone tag and its live node, so every pending spread pod "needed"
    /// that empty domain and each decision grew the groups again.
    #[test]
    fn regional_groups_with_a_live_node_each_grow_only_as_the_zone_spread_needs() {
        let groups = vec![
            regional_tagged("r1", "1", 1),
            regional_tagged("r2", "2", 1),
            regional_tagged("r3", "3", 1),
        ];
        let nodes = vec![
            zoned_node("r1-0", "r1", "1"),
            zoned_node("r2-0", "r2", "2"),
            zoned_node("r3-0", "r3", "3"),
        ];
        let mut pods: Vec<_> = (1..=3)
            .map(|z| {
                running(
                    &format!("web-run-{z}"),
                    "web",
                    &format!("r{z}-0"),
                    spread_by_zone(1),
                )
            })
            .collect();
        pods.extend((0..3).map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1))));
        let p = plan(&input(groups, nodes, pods));
        assert_eq!(targets(&p), [("r1", 2), ("r2", 2), ("r3", 2)], "{p:?}");
        for g in ["r1", "r2", "r3"] {
            let zone = p.templates[g].labels.get(ZONE).cloned();
            assert_eq!(
                zone,
                Some(format!("westeurope-{}", &g[1..])),
                "{g}'s template keeps its node's zone"
            );
        }
    }

    #[test]
    fn a_regional_groups_zone_tag_overrides_the_generated_zone_when_it_scales_from_zero() {
        let groups = vec![
            regional_tagged("r1", "1", 0),
            regional_tagged("r2", "2", 0),
            regional_tagged("r3", "3", 0),
        ];
        let pods = (0..6)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let p = plan(&input(groups, vec![], pods));
        assert_eq!(targets(&p), [("r1", 2), ("r2", 2), ("r3", 2)], "{p:?}");
        assert_eq!(
            p.templates["r2"].labels.get(ZONE).map(String::as_str),
            Some("westeurope-2")
        );
    }

    #[test]
    fn a_workload_a_group_is_passed_over_for_goes_to_another_group_and_says_why() {
        let mut groups = vec![
            group("a", "Standard_D4s_v5", 0, 10),
            group("b", "Standard_D4s_v5", 0, 10),
        ];
        groups[0].passed_over = Arc::new(BTreeMap::from([(
            "default/ReplicaSet/web".to_string(),
            "a scale-up of a for it did not help".to_string(),
        )]));
        let pods = vec![
            app_pod("web-0", "web", json!({})),
            app_pod("api-0", "api", json!({})),
        ];
        let p = plan(&input(groups.clone(), vec![], pods.clone()));
        assert_eq!(p.triggered["default/web-0"], "b");
        // Alone, a group passed over is no option: the pod says why.
        let p = plan(&input(
            vec![groups.remove(0)],
            vec![],
            vec![pods[0].clone()],
        ));
        assert!(p.targets.is_empty(), "{p:?}");
        let why = &p.unfit["default/web-0"];
        assert_eq!((why[0].0.as_str(), why[0].1.label), ("a", "did_not_help"));
    }

    #[test]
    fn a_burst_of_six_hundred_spread_replicas_is_shared_out_over_the_zones_in_one_decision() {
        let pods = (0..600)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let mut groups = three_zones();
        for g in &mut groups {
            g.max = 1000;
        }
        // z3 has only 150 nodes left: the other zones take the rest within the skew (151).
        groups[2].max = 150;
        let p = plan(&input(groups, vec![], pods));
        assert_eq!(
            targets(&p),
            [("z1", 151), ("z2", 151), ("z3", 150)],
            "{:?}",
            targets(&p)
        );
        assert_eq!(p.unfit.len(), 600 - 452);
        assert!(p.unfit.values().all(|why| why
            .iter()
            .all(|(_, w)| w.label == "pod_topology_spread" || w.label == "max_size")));
    }

    /// Pod `i` of StatefulSet `web` (a class of its own: its own pod-name label).
    fn stateful_pod(i: usize, extra: serde_json::Value) -> Arc<PodRecord> {
        let mut p = (*app_pod(&format!("web-{i}"), "web", extra)).clone();
        Arc::make_mut(&mut p.labels).insert(
            "statefulset.kubernetes.io/pod-name".into(),
            format!("web-{i}"),
        );
        if let Some(o) = p.controller.as_mut() {
            o.kind = "StatefulSet".into();
            o.uid = "sts-web".into();
        }
        Arc::new(p)
    }

    #[test]
    fn a_stateful_sets_zone_spread_pods_a_class_each_are_shared_out_as_one() {
        let pods: Vec<_> = (0..6).map(|i| stateful_pod(i, spread_by_zone(1))).collect();
        let p = plan(&input(three_zones(), vec![], pods));
        assert_eq!(targets(&p), [("z1", 2), ("z2", 2), ("z3", 2)], "{p:?}");
        assert_eq!(p.triggered.len(), 6);
        assert!(p.unfit.is_empty(), "{:?}", p.unfit);
        assert_eq!(p.rounds, 3, "one round per zone, not one per pod");
    }

    #[test]
    fn a_quota_pool_the_zonal_groups_share_is_split_between_them_in_the_plan() {
        // 40 vCPUs for three zonal D4s_v5 groups: ten nodes in all, not ten per zone.
        let pods = (0..30)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let mut groups = three_zones();
        for g in &mut groups {
            g.quota = vec![0];
        }
        let mut input = input(groups, vec![], pods);
        input.quota = vec![QuotaPool {
            location: "westeurope".into(),
            name: "standardDSv5Family".into(),
            remaining: 40,
        }];
        let p = plan(&input);
        let sizes: Vec<i64> = ["z1", "z2", "z3"]
            .iter()
            .map(|g| p.targets.get(*g).copied().unwrap_or(0))
            .collect();
        assert_eq!(sizes.iter().sum::<i64>(), 10, "{p:?}");
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(
            max - min <= 1,
            "as the scheduler would fill them: {sizes:?}"
        );
        assert_eq!(p.triggered.len(), 10);
    }

    #[test]
    fn two_revisions_under_one_spread_selector_are_planned_together_and_none_is_stranded() {
        // A rollout: ReplicaSets web-a (6 pods) and web-b (3 pods), both app=web, one spread.
        let pods: Vec<_> = (0..9)
            .map(|i| {
                let rs = if i < 6 { "a" } else { "b" };
                let mut p = (*app_pod(&format!("web-{rs}-{i}"), "web", spread_by_zone(1))).clone();
                Arc::make_mut(&mut p.labels).insert("pod-template-hash".into(), rs.into());
                if let Some(o) = p.controller.as_mut() {
                    o.uid = format!("rs-web-{rs}");
                }
                Arc::new(p)
            })
            .collect();
        let p = plan(&input(three_zones(), vec![], pods));
        assert_eq!(targets(&p), [("z1", 3), ("z2", 3), ("z3", 3)], "{p:?}");
        assert!(p.unfit.is_empty(), "{:?}", p.unfit);
        assert_eq!(p.rounds, 3, "both revisions shared out together");
    }

    #[test]
    fn zone_and_hostname_spread_together_are_shared_out_one_pod_per_new_node() {
        let mut both = spread_by_zone(1);
        both["topologySpreadConstraints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}));
        // Small pods (four would fit a node): the hostname rule keeps them one per node.
        both["containers"] = json!([{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]);
        let pods = (0..300)
            .map(|i| app_pod(&format!("web-{i}"), "web", both.clone()))
            .collect();
        let mut groups = three_zones();
        for g in &mut groups {
            g.max = 200;
        }
        let p = plan(&input(groups, vec![], pods));
        assert_eq!(targets(&p), [("z1", 100), ("z2", 100), ("z3", 100)]);
        assert_eq!(p.triggered.len(), 300);
        assert_eq!(p.rounds, 3, "one round per zone, not one per pod");
    }

    #[test]
    fn a_zone_whose_only_group_is_out_of_quota_is_no_domain_and_the_others_take_the_pods() {
        let pods = (0..6)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let mut groups = three_zones();
        groups[0].quota = vec![0];
        groups[1].quota = vec![0];
        groups[2].quota = vec![1];
        let mut input = input(groups, vec![], pods);
        let pool = |name: &str, remaining| QuotaPool {
            location: "westeurope".into(),
            name: name.into(),
            remaining,
        };
        input.quota = vec![pool("standardDSv5Family", 1000), pool("spent", 0)];
        let p = plan(&input);
        assert_eq!(targets(&p), [("z1", 3), ("z2", 3)], "{p:?}");
        assert!(p.unfit.is_empty(), "{:?}", p.unfit);
    }

    #[test]
    fn a_pod_following_itself_on_a_group_spanning_zones_makes_the_next_one_no_longer_the_first() {
        let together = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("web", ZONE)}}});
        let pods = (0..3)
            .map(|i| app_pod(&format!("web-{i}"), "web", together.clone()))
            .collect();
        // Azure chooses the zone of each new node: only the first pod may go, the others
        // cannot be said to land next to it.
        let p = plan(&input(
            vec![zonal("any", &["1", "2", "3"], 0)],
            vec![],
            pods,
        ));
        assert_eq!(targets(&p), [("any", 1)], "{p:?}");
        assert_eq!(p.unfit.len(), 2);
        for why in p.unfit.values() {
            assert_eq!(why[0].1.label, "pod_affinity", "{why:?}");
        }
    }

    fn with_claim(extra: serde_json::Value, claim: &str) -> serde_json::Value {
        let mut extra = extra;
        extra["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        extra
    }

    #[test]
    fn a_pod_whose_disk_lives_in_one_zone_grows_that_zones_group_only() {
        use crate::pods::volumes::tests::{claim, class, disk};
        let pods = vec![app_pod("db-0", "db", with_claim(json!({}), "data-db-0"))];
        let mut input = input(three_zones(), vec![], pods);
        input.volumes = Arc::new(Volumes::new(
            &[claim("data-db-0", Some("pv-0"), "managed-csi")],
            &[disk("pv-0", "westeurope-2")],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[],
        ));
        let p = plan(&input);
        assert_eq!(targets(&p), [("z2", 1)], "{p:?}");
        // Alone in zone 1 the pod fits nowhere, and says why as the scheduler would.
        input.groups = vec![zonal("z1", &["1"], 0)];
        let p = plan(&input);
        assert!(p.targets.is_empty());
        assert_eq!(
            p.unfit["default/db-0"][0].1.text,
            "node(s) had volume node affinity conflict"
        );
        assert_eq!(p.unfit["default/db-0"][0].1.label, "volume_node_affinity");
    }

    #[test]
    fn a_pod_waiting_for_an_immediate_volume_is_reported_and_not_planned_for() {
        use crate::pods::volumes::tests::{claim, class};
        let pods = vec![app_pod("db-0", "db", with_claim(json!({}), "data-db-0"))];
        let mut input = input(three_zones(), vec![], pods);
        input.volumes = Arc::new(Volumes::new(
            &[claim("data-db-0", None, "managed-premium")],
            &[],
            &[class("managed-premium", "Immediate", &[])],
            &[],
        ));
        let p = plan(&input);
        assert!(p.targets.is_empty() && p.unfit.is_empty());
        assert_eq!(
            p.waiting["default/db-0"],
            "pod has unbound immediate PersistentVolumeClaims"
        );
        assert_eq!(p.pending, 1);
    }

    #[test]
    fn new_nodes_take_no_more_disks_than_their_vm_size_attaches() {
        use crate::pods::volumes::tests::{claim, class};
        // 20 small pods, one new disk each: a D4s_v5 holds them all by cpu, but attaches 8.
        let small =
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]});
        let pods = |claims: bool| -> Vec<_> {
            (0..20)
                .map(|i| {
                    let extra = if claims {
                        with_claim(small.clone(), &format!("c-{i}"))
                    } else {
                        small.clone()
                    };
                    app_pod(&format!("w-{i}"), "w", extra)
                })
                .collect()
        };
        let claims: Vec<_> = (0..20)
            .map(|i| claim(&format!("c-{i}"), None, "managed-csi"))
            .collect();
        let mut with = input(vec![zonal("z1", &["1"], 0)], vec![], pods(true));
        with.volumes = Arc::new(Volumes::new(
            &claims,
            &[],
            &[class("managed-csi", "WaitForFirstConsumer", &[])],
            &[],
        ));
        assert_eq!(targets(&plan(&with)), [("z1", 3)]);
        let without = input(vec![zonal("z1", &["1"], 0)], vec![], pods(false));
        assert_eq!(targets(&plan(&without)), [("z1", 1)]);
    }

    #[test]
    fn spread_counts_the_pods_already_running_so_new_nodes_go_to_the_emptier_zones() {
        let nodes = vec![
            system_node("sys-1", 0, "1"),
            system_node("sys-2", 1, "2"),
            system_node("sys-3", 2, "3"),
        ];
        let mut pods = vec![
            running("web-a", "web", "sys-1", spread_by_zone(1)),
            running("web-b", "web", "sys-1", spread_by_zone(1)),
            running("web-c", "web", "sys-2", spread_by_zone(1)),
        ];
        pods.extend((0..3).map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1))));
        let p = plan(&input(three_zones(), nodes, pods));
        // 2/1/0 running: two new pods go to zone 3, one to zone 2, none to zone 1.
        assert_eq!(targets(&p), [("z2", 1), ("z3", 2)], "{p:?}");
    }

    #[test]
    fn with_fewer_domains_than_min_domains_the_global_minimum_is_zero() {
        let mut spread = spread_by_zone(1);
        spread["topologySpreadConstraints"][0]["minDomains"] = json!(3);
        let pods = (0..3)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread.clone()))
            .collect();
        // Only zone 1 can grow: one pod there, the other two would break the skew.
        let p = plan(&input(vec![zonal("z1", &["1"], 0)], vec![], pods));
        assert_eq!(targets(&p), [("z1", 1)], "{p:?}");
        assert_eq!(p.unfit.len(), 2);
        for why in p.unfit.values() {
            assert_eq!(why[0].1.label, "pod_topology_spread");
            assert_eq!(
                why[0].1.text,
                "node(s) didn't match pod topology spread constraints"
            );
        }
        // Without minDomains, one domain is the whole world: all three go to zone 1.
        let pods = (0..3)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread_by_zone(1)))
            .collect();
        let p = plan(&input(vec![zonal("z1", &["1"], 0)], vec![], pods));
        assert_eq!(targets(&p), [("z1", 3)], "{p:?}");
    }

    #[test]
    fn a_group_spanning_several_zones_takes_no_zone_spread_pod_and_says_why() {
        let pods = vec![app_pod("web-0", "web", spread_by_zone(1))];
        let p = plan(&input(
            vec![zonal("any", &["1", "2", "3"], 0)],
            vec![],
            pods,
        ));
        assert!(p.targets.is_empty(), "{p:?}");
        let why = &p.unfit["default/web-0"][0].1;
        assert_eq!(why.label, "pod_topology_spread");
        assert!(why.text.contains("spans several zones"), "{why}");
    }

    #[test]
    fn schedule_anyway_spread_is_a_preference_and_never_blocks() {
        let mut spread = spread_by_zone(1);
        spread["topologySpreadConstraints"][0]["whenUnsatisfiable"] = json!("ScheduleAnyway");
        let pods = (0..3)
            .map(|i| app_pod(&format!("web-{i}"), "web", spread.clone()))
            .collect();
        let p = plan(&input(vec![zonal("z1", &["1"], 0)], vec![], pods));
        assert_eq!(targets(&p), [("z1", 3)]);
    }

    fn term(app: &str, key: &str) -> serde_json::Value {
        json!([{"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}])
    }

    #[test]
    fn anti_affinity_by_zone_against_pods_in_every_zone_fits_no_group_and_says_so() {
        let nodes = vec![
            system_node("sys-1", 0, "1"),
            system_node("sys-2", 1, "2"),
            system_node("sys-3", 2, "3"),
        ];
        let mut pods: Vec<_> = (1..=3)
            .map(|z| running(&format!("db-{z}"), "db", &format!("sys-{z}"), json!({})))
            .collect();
        pods.push(app_pod(
            "web-0",
            "web",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("db", ZONE)}}}),
        ));
        let p = plan(&input(three_zones(), nodes, pods));
        assert!(p.targets.is_empty(), "{p:?}");
        let why = &p.unfit["default/web-0"];
        assert_eq!(why.len(), 3);
        for (_, w) in why {
            assert_eq!(w.label, "pod_anti_affinity");
            assert_eq!(w.text, "node(s) didn't match pod anti-affinity rules");
        }
    }

    #[test]
    fn a_running_pods_anti_affinity_by_zone_keeps_matching_pods_out_of_its_zone() {
        let nodes = vec![system_node("sys-1", 0, "1")];
        let pods = vec![
            running(
                "loner",
                "loner",
                "sys-1",
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("web", ZONE)}}}),
            ),
            app_pod("web-0", "web", json!({})),
        ];
        let groups = vec![zonal("z1", &["1"], 0), zonal("z2", &["2"], 0)];
        let p = plan(&input(groups.clone(), nodes.clone(), pods));
        assert_eq!(targets(&p), [("z2", 1)], "{p:?}");
        // Only zone 1 to grow: refused, in the scheduler's words for the other pod's rule.
        let pods = vec![
            running(
                "loner",
                "loner",
                "sys-1",
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("web", ZONE)}}}),
            ),
            app_pod("web-0", "web", json!({})),
        ];
        let p = plan(&input(vec![groups[0].clone()], nodes, pods));
        assert_eq!(
            p.unfit["default/web-0"][0].1.text,
            "node(s) didn't satisfy existing pods anti-affinity rules"
        );
    }

    #[test]
    fn pending_pods_with_anti_affinity_by_zone_against_each_other_take_one_zone_each() {
        let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("solo", ZONE)}}});
        let pods = (0..4)
            .map(|i| app_pod(&format!("solo-{i}"), "solo", anti.clone()))
            .collect();
        let p = plan(&input(three_zones(), vec![], pods));
        assert_eq!(targets(&p), [("z1", 1), ("z2", 1), ("z3", 1)], "{p:?}");
        assert_eq!(p.unfit.len(), 1, "the fourth has no zone left: {p:?}");
    }

    #[test]
    fn required_affinity_by_zone_grows_the_group_of_the_zone_its_partner_runs_in() {
        let nodes = vec![system_node("sys-1", 0, "1"), system_node("sys-2", 1, "2")];
        let pods = vec![
            running("cache-0", "cache", "sys-2", json!({})),
            app_pod(
                "web-0",
                "web",
                json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("cache", ZONE)}}}),
            ),
        ];
        let p = plan(&input(three_zones(), nodes, pods));
        assert_eq!(targets(&p), [("z2", 1)], "{p:?}");
        // With no cache pod anywhere, the web pod fits nowhere: it does not match its own term.
        let pods = vec![app_pod(
            "web-0",
            "web",
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("cache", ZONE)}}}),
        )];
        let p = plan(&input(three_zones(), vec![], pods));
        assert!(p.targets.is_empty());
        assert_eq!(p.unfit["default/web-0"][0].1.label, "pod_affinity");
        assert_eq!(
            p.unfit["default/web-0"][0].1.text,
            "node(s) didn't match pod affinity rules"
        );
    }

    #[test]
    fn the_first_pod_of_a_group_that_follows_itself_goes_anywhere_and_the_rest_follow_it() {
        let together = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term("web", ZONE)}}});
        let pods = (0..3)
            .map(|i| app_pod(&format!("web-{i}"), "web", together.clone()))
            .collect();
        let p = plan(&input(three_zones(), vec![], pods));
        // All three in one zone (which one is the expander's choice), on three nodes.
        assert_eq!(p.targets.len(), 1, "{p:?}");
        assert_eq!(p.targets.values().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(p.triggered.len(), 3);
    }

    #[test]
    fn a_pod_that_needs_one_zone_grows_the_group_of_that_zone() {
        let groups = vec![
            zonal("z1", &["1"], 0),
            zonal("z2", &["2"], 0),
            zonal("z3", &["3"], 0),
        ];
        let pod = pending(
            "p",
            "1",
            "1Gi",
            json!({"nodeSelector": {"topology.kubernetes.io/zone": "westeurope-2"}}),
        );
        let plan = plan(&input(groups, vec![], vec![pod]));
        assert_eq!(plan.targets, BTreeMap::from([("z2".to_string(), 1)]));
        let disk = pending(
            "d",
            "1",
            "1Gi",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.disk.csi.azure.com/zone",
                    "operator": "In", "values": ["westeurope-3"]}]}]}}}}),
        );
        let groups = vec![zonal("z1", &["1"], 0), zonal("z3", &["3"], 0)];
        let plan = super::plan(&input(groups, vec![], vec![disk]));
        assert_eq!(plan.targets, BTreeMap::from([("z3".to_string(), 1)]));
    }

    #[test]
    fn a_group_spanning_zones_counts_only_for_pods_that_fit_in_every_zone_it_spans() {
        let one_zone = pending(
            "one",
            "1",
            "1Gi",
            json!({"nodeSelector": {"topology.kubernetes.io/zone": "westeurope-1"}}),
        );
        let plan = plan(&input(
            vec![zonal("multi", &["1", "2", "3"], 0)],
            vec![],
            vec![one_zone],
        ));
        assert!(
            plan.targets.is_empty(),
            "Azure may put the node in zone 2 or 3"
        );
        assert_eq!(plan.unfit["default/one"][0].1.label, "node_selector");
        let in_two = |zones: &[&str]| {
            let p = pending(
                "two",
                "1",
                "1Gi",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone",
                        "operator": "In", "values": ["westeurope-1", "westeurope-2"]}]}]}}}}),
            );
            super::plan(&input(vec![zonal("multi", zones, 0)], vec![], vec![p])).targets
        };
        assert_eq!(
            in_two(&["1", "2"]),
            BTreeMap::from([("multi".to_string(), 1)])
        );
        assert!(in_two(&["1", "2", "3"]).is_empty());
        // Region is known whatever the zones.
        let region = pending(
            "r",
            "1",
            "1Gi",
            json!({"nodeSelector": {"topology.kubernetes.io/region": "westeurope"}}),
        );
        let plan = super::plan(&input(
            vec![zonal("multi", &["1", "2", "3"], 0)],
            vec![],
            vec![region],
        ));
        assert_eq!(plan.targets.len(), 1);
    }

    #[test]
    fn a_live_nodes_zone_is_not_the_next_nodes_in_a_group_spanning_zones() {
        // The group's one Ready node is in zone 1 and full; a pod needing zone 1 cannot count on
        // the next node being there.
        let mut n = (*node("multi-0", "multi", 0, "2", "8Gi", json!([]))).clone();
        std::sync::Arc::make_mut(&mut n.labels)
            .insert("topology.kubernetes.io/zone".into(), "westeurope-1".into());
        let filler = {
            let mut p = (*pending("filler", "1900m", "1Gi", json!({}))).clone();
            p.node_name = Some("multi-0".into());
            p.unschedulable = false;
            Arc::new(p)
        };
        let want = pending(
            "want",
            "1",
            "1Gi",
            json!({"nodeSelector": {"topology.kubernetes.io/zone": "westeurope-1"}}),
        );
        let plan = plan(&input(
            vec![zonal("multi", &["1", "2"], 1)],
            vec![Arc::new(n)],
            vec![filler, want],
        ));
        assert!(plan.targets.is_empty(), "{plan:?}");
    }

    /// Six pods of 3 cpu: one per new D4s_v5 node.
    /// Two new nodes in each of z1, z2 and z3.
    fn two_per_zone() -> BTreeMap<String, i64> {
        ["z1", "z2", "z3"].map(|z| (z.to_string(), 2)).into()
    }

    fn six_big_pods() -> Vec<Arc<PodRecord>> {
        (0..6)
            .map(|k| pending(&format!("p{k}"), "3", "1Gi", json!({})))
            .collect()
    }

    fn balanced(groups: Vec<GroupInput<'static>>, pods: Vec<Arc<PodRecord>>) -> ScaleUpPlan {
        let mut i = input(groups, vec![], pods);
        i.balance_similar = true;
        plan(&i)
    }

    #[test]
    fn balancing_spreads_a_scale_up_over_similar_groups_so_their_sizes_end_equal() {
        let zones = || {
            vec![
                zonal("z1", &["1"], 0),
                zonal("z2", &["2"], 1),
                zonal("z3", &["3"], 0),
            ]
        };
        let one = plan(&input(zones(), vec![], six_big_pods()));
        assert_eq!(
            one.targets.len(),
            1,
            "without balancing one group takes all: {one:?}"
        );
        let p = balanced(zones(), six_big_pods());
        // z2's one node is on its way and takes a pod; five new nodes level the three at 2.
        assert_eq!(p.already_provided.len(), 1);
        assert_eq!(p.targets, two_per_zone());
        assert_eq!(p.triggered.len(), 5);
        // Each pod names the group whose new node it goes to.
        let mut by_group: BTreeMap<&str, u32> = BTreeMap::new();
        for g in p.triggered.values() {
            *by_group.entry(g.as_str()).or_default() += 1;
        }
        assert_eq!(by_group, BTreeMap::from([("z1", 2), ("z2", 1), ("z3", 2)]));
    }

    #[test]
    fn a_node_balancing_moves_to_a_similar_group_carries_that_groups_daemonset_pods_once() {
        let mut i = input(three_zones(), vec![], six_big_pods());
        i.balance_similar = true;
        i.daemonsets = vec![Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "agent", "namespace": "kube-system"},
                "spec": {
                    "selector": {"matchLabels": {"ds": "agent"}},
                    "template": {
                        "metadata": {"labels": {"ds": "agent"}},
                        "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}}}]},
                    },
                },
            }))
            .unwrap(),
        )];
        let p = plan(&i);
        // Six 3-cpu pods, one per D4s_v5 node (its 500m agent beside each): two per zone.
        assert_eq!(p.targets, two_per_zone());
        // Only the pending pods triggered anything: the agent is no pod of the plan's.
        let mut keys: Vec<&str> = p.triggered.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "default/p0",
                "default/p1",
                "default/p2",
                "default/p3",
                "default/p4",
                "default/p5"
            ]
        );
    }

    #[test]
    fn balancing_respects_each_groups_max_and_leaves_dissimilar_groups_alone() {
        let mut z1 = zonal("z1", &["1"], 0);
        z1.max = 1;
        let mut big = zonal("big", &["3"], 0);
        if let Some(s) = big.shape.as_mut() {
            s.vm_size = "Standard_D8s_v5";
        }
        let mut tainted = zonal("tainted", &["2"], 0);
        if let Some(s) = tainted.shape.as_mut() {
            s.tags = BTreeMap::from([(
                "k8s.io_cluster-autoscaler_node-template_taint_dedicated".to_string(),
                "batch:NoSchedule".to_string(),
            )]);
        }
        let p = balanced(
            vec![z1, zonal("z2", &["2"], 0), big, tainted],
            six_big_pods(),
        );
        // least-waste picks a D4s_v5 group; big (other size) and tainted (other taints) are
        // not similar to it.
        assert_eq!(p.targets.get("big"), None, "{p:?}");
        assert_eq!(p.targets.get("tainted"), None, "{p:?}");
        assert_eq!(p.targets.get("z1"), Some(&1), "its max");
        assert_eq!(p.targets.get("z2"), Some(&5));
    }

    #[test]
    fn balancing_never_moves_a_pod_to_a_similar_group_it_does_not_fit() {
        let pods: Vec<_> = (0..4)
            .map(|k| {
                pending(
                    &format!("z{k}"),
                    "3",
                    "1Gi",
                    json!({"nodeSelector": {"topology.kubernetes.io/zone": "westeurope-1"}}),
                )
            })
            .collect();
        let p = balanced(vec![zonal("z1", &["1"], 0), zonal("z2", &["2"], 0)], pods);
        assert_eq!(p.targets, BTreeMap::from([("z1".to_string(), 4)]));
    }

    #[test]
    fn a_provider_id_names_its_resource_group_scale_set_and_instance_in_any_case() {
        assert_eq!(
            parse_provider_id("azure:///subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-np-1-vmss/virtualMachines/7"),
            Some(("MC_rg", "aks-np-1-vmss", "7"))
        );
        assert_eq!(
            parse_provider_id("azure:///subscriptions/s/resourcegroups/mc_rg/providers/microsoft.compute/virtualmachinescalesets/x/virtualmachines/0"),
            Some(("mc_rg", "x", "0"))
        );
        assert_eq!(parse_provider_id("aws:///us-east-1a/i-123"), None);
        assert_eq!(parse_provider_id("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm1"), None);
    }

    #[test]
    fn nodes_belong_to_their_scale_set_whatever_the_resource_groups_case_and_pools_by_label() {
        let groups = vec![
            group("general", "Standard_D4s_v5", 1, 10),
            GroupInput {
                backing: Backing::AgentPool { pool: "gpu".into() },
                ..group("gpu", "Standard_NC6s_v3", 0, 3)
            },
        ];
        let n = node("general-0", "GENERAL", 0, "4", "16Gi", json!([]));
        assert_eq!(group_of(&n, &groups), Some(0));
        let mut p = (*node(
            "aks-gpu-1-vmss000000",
            "aks-gpu-1-vmss",
            0,
            "6",
            "100Gi",
            json!([]),
        ))
        .clone();
        Arc::make_mut(&mut p.labels).insert(AGENTPOOL_LABEL.into(), "gpu".into());
        assert_eq!(group_of(&p, &groups), Some(1));
        let stranger = node("other-0", "other", 0, "4", "16Gi", json!([]));
        assert_eq!(group_of(&stranger, &groups), None);
    }

    #[test]
    fn pending_pods_become_one_target_per_group_counting_every_pod_once() {
        // 10 pods of 1 cpu; a D4s_v5 template takes 3 of them after the system reservation.
        let pods: Vec<_> = (0..10)
            .map(|i| pending(&format!("p{i}"), "1", "1Gi", json!({})))
            .collect();
        let plan = plan(&input(
            vec![group("general", "Standard_D4s_v5", 0, 10)],
            vec![],
            pods,
        ));
        assert_eq!(plan.pending, 10);
        assert_eq!(plan.triggered.len(), 10);
        assert_eq!(plan.targets.len(), 1);
        let target = plan.targets["general"];
        assert!((3..=5).contains(&target), "target {target}");
        assert!(plan.unfit.is_empty());
    }

    #[test]
    fn groups_of_one_family_share_its_quota_and_the_pods_it_cannot_cover_go_to_another_family() {
        let pods: Vec<_> = (0..30)
            .map(|i| pending(&format!("p{i}"), "1", "1Gi", json!({})))
            .collect();
        let pool = |name: &str, remaining| QuotaPool {
            location: "westeurope".into(),
            name: name.into(),
            remaining,
        };
        let with_pools =
            |g: GroupInput<'static>, pools: Vec<usize>| GroupInput { quota: pools, ..g };
        let mut input = input(
            vec![
                with_pools(group("d4", "Standard_D4s_v5", 0, 20), vec![0, 1]),
                with_pools(group("d8", "Standard_D8s_v5", 0, 20), vec![0, 1]),
                with_pools(group("e4", "Standard_E4s_v5", 0, 20), vec![0, 2]),
            ],
            vec![],
            pods,
        );
        input.quota = vec![
            pool("cores", 1000),
            pool("standardDSv5Family", 12),
            pool("standardESv5Family", 1000),
        ];
        let plan = plan(&input);
        let nodes = |g: &str| plan.targets.get(g).copied().unwrap_or(0);
        assert!(
            nodes("d4") * 4 + nodes("d8") * 8 <= 12,
            "the DSv5 groups stay within their family's 12 vCPUs together: {:?}",
            plan.targets
        );
        assert!(nodes("d4") + nodes("d8") > 0, "{:?}", plan.targets);
        assert!(nodes("e4") > 0, "the rest goes to ESv5: {:?}", plan.targets);
        assert_eq!(plan.triggered.len(), 30, "every pod placed in one decision");
        assert!(plan.unfit.is_empty());
        let capped: Vec<&String> = plan.capped.keys().collect();
        assert!(!capped.is_empty(), "the cut is reported: {:?}", plan.capped);
        for g in capped {
            assert_eq!(plan.capped[g].pool, "standardDSv5Family in westeurope");
        }
    }

    #[test]
    fn a_regional_total_caps_every_family_and_spot_draws_only_on_the_spot_total() {
        let pods: Vec<_> = (0..9)
            .map(|i| pending(&format!("p{i}"), "1", "1Gi", json!({})))
            .collect();
        let mut input = input(
            vec![GroupInput {
                quota: vec![0, 1],
                ..group("d4", "Standard_D4s_v5", 0, 20)
            }],
            vec![],
            pods,
        );
        input.quota = vec![
            QuotaPool {
                location: "westeurope".into(),
                name: "cores".into(),
                remaining: 4,
            },
            QuotaPool {
                location: "westeurope".into(),
                name: "standardDSv5Family".into(),
                remaining: 100,
            },
        ];
        let plan = plan(&input);
        assert_eq!(plan.targets["d4"], 1, "4 regional vCPUs: one node");
        assert_eq!(plan.triggered.len(), 3);
        let why = &plan.unfit.values().next().expect("6 pods left")[0].1;
        assert_eq!(why.label, "quota", "{why}");
        assert!(why.text.contains("cores in westeurope"), "{why}");
        // Which pools a spot node draws on is the quota module's rule.
        let spot = crate::capacity::Offering::new("westeurope", "Standard_D4s_v5", &[], true);
        assert_eq!(
            crate::capacity::quota::pools_of(&spot),
            ["lowPriorityCores"]
        );
    }

    #[test]
    fn nodes_requested_but_not_registered_take_pods_before_new_ones_are_asked_for() {
        let pods: Vec<_> = (0..2)
            .map(|i| pending(&format!("p{i}"), "1", "1Gi", json!({})))
            .collect();
        // Capacity 2, one node registered (still booting: NotReady, no room yet): the one
        // upcoming node has room for both pods.
        let mut booting = (*node("general-0", "general", 0, "4", "16Gi", json!([]))).clone();
        booting.ready = false;
        let nodes = vec![Arc::new(booting)];
        let plan = plan(&input(
            vec![group("general", "Standard_D4s_v5", 2, 10)],
            nodes,
            pods,
        ));
        assert!(plan.targets.is_empty(), "{plan:?}");
        assert_eq!(plan.already_provided.len(), 2);
    }

    #[test]
    fn a_pod_nominated_to_a_node_takes_its_room_there_and_triggers_nothing() {
        // One Ready D4s_v5-like node with 4 cpus free. A 3-cpu pod nominated to it (preempting
        // there) and a 3-cpu pod pending: the nominated one will take the node, so the other
        // needs a new node; the nominated one asks for none.
        let n = node("general-0", "general", 0, "4", "16Gi", json!([]));
        let mut nominated = (*pending("nominated", "3", "1Gi", json!({}))).clone();
        nominated.nominated_node = Some("general-0".into());
        let p = plan(&input(
            vec![group("general", "Standard_D4s_v5", 1, 10)],
            vec![n],
            vec![Arc::new(nominated), pending("other", "3", "1Gi", json!({}))],
        ));
        assert_eq!(p.targets.get("general"), Some(&2), "{p:?}");
        assert_eq!(
            p.pending, 1,
            "the nominated pod is not pending for scale-up"
        );
        assert!(!p.triggered.contains_key("default/nominated"));
    }

    #[test]
    fn an_instance_azure_lists_as_failed_is_not_room_on_its_way() {
        // Two pods of 3 cpus, one per D4s_v5. Capacity 2, nothing registered yet, but instance
        // 1 is `Failed`: only instance 0 is coming, so one more node is asked for.
        let pods: Vec<_> = (0..2)
            .map(|i| pending(&format!("p{i}"), "3", "1Gi", json!({})))
            .collect();
        let mut g = group("general", "Standard_D4s_v5", 2, 10);
        g.failed = vec!["1".into()];
        let p = plan(&input(vec![g.clone()], vec![], pods.clone()));
        assert_eq!(p.targets.get("general"), Some(&3), "{p:?}");
        assert_eq!(p.already_provided.len(), 1);
        // A Failed instance that did register (its broken node is there) is counted once, as
        // that node: instance 0 is still coming.
        let mut registered = (*node("general-1", "general", 1, "4", "16Gi", json!([]))).clone();
        registered.ready = false;
        let p = plan(&input(vec![g], vec![Arc::new(registered)], pods));
        assert_eq!(p.targets.get("general"), Some(&3), "{p:?}");
        assert_eq!(p.already_provided.len(), 1);
    }

    #[test]
    fn a_deallocated_instances_young_not_ready_node_is_not_taken_for_one_still_booting() {
        // A node registered a minute ago; Azure evicted its VM (instance 1) with `Deallocate`,
        // so the node turned NotReady while still young enough to pass for booting. Its pod (3 cpu,
        // one per D4s_v5) must get a new node now, not wait for one that will never be Ready.
        let pods = vec![pending("p", "3", "1Gi", json!({}))];
        let nodes = vec![booting("general-1", 1, std::time::Duration::from_secs(60))];
        let mut g = group("general", "Standard_D4s_v5", 1, 10);
        let p = plan(&input(vec![g.clone()], nodes.clone(), pods.clone()));
        assert!(p.targets.is_empty(), "booting, so on its way: {p:?}");
        // A `Failed` instance whose node is booting may still come (an extension that failed,
        // a kubelet that runs): as before.
        g.failed = vec!["1".into()];
        let p = plan(&input(vec![g.clone()], nodes.clone(), pods.clone()));
        assert!(p.targets.is_empty(), "{p:?}");
        g.failed.clear();
        g.stopped = vec!["1".into()];
        let p = plan(&input(vec![g], nodes, pods));
        assert_eq!(p.targets.get("general"), Some(&2), "{p:?}");
    }

    /// `node` NotReady, created `age` before now.
    fn booting(name: &str, id: u32, age: std::time::Duration) -> Arc<NodeRecord> {
        let mut n = (*node(name, "general", id, "4", "16Gi", json!([]))).clone();
        n.ready = false;
        n.created = Some(
            Timestamp::now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(age).unwrap())
                .unwrap(),
        );
        Arc::new(n)
    }

    #[test]
    fn nodes_registered_and_still_booting_are_on_their_way_so_their_pods_are_not_provisioned_twice()
    {
        // Two pods of 3 cpu: one per D4s_v5 node. Both nodes were requested and registered a
        // minute ago and are still booting (AKS nodes register well before they are Ready):
        // counting them as neither room nor upcoming would ask for two more at every re-check.
        let pods: Vec<_> = (0..2)
            .map(|i| pending(&format!("p{i}"), "3", "1Gi", json!({})))
            .collect();
        let nodes = vec![
            booting("general-0", 0, std::time::Duration::from_secs(60)),
            booting("general-1", 1, std::time::Duration::from_secs(60)),
        ];
        let plan = plan(&input(
            vec![group("general", "Standard_D4s_v5", 2, 10)],
            nodes,
            pods,
        ));
        assert!(plan.targets.is_empty(), "{plan:?}");
        assert_eq!(plan.already_provided.len(), 2);
    }

    #[test]
    fn a_node_not_ready_for_longer_than_the_startup_window_is_not_counted_as_coming() {
        let pods = vec![pending("p", "3", "1Gi", json!({}))];
        let nodes = vec![booting(
            "general-0",
            0,
            std::time::Duration::from_secs(20 * 60),
        )];
        let plan = plan(&input(
            vec![group("general", "Standard_D4s_v5", 1, 10)],
            nodes,
            pods,
        ));
        assert_eq!(plan.targets.get("general"), Some(&2), "{plan:?}");
    }

    #[test]
    fn free_room_on_a_ready_node_takes_a_pod_before_any_scale_up() {
        let pods = vec![pending("p", "1", "1Gi", json!({}))];
        let nodes = vec![node("general-0", "general", 0, "4", "16Gi", json!([]))];
        let plan = plan(&input(
            vec![group("general", "Standard_D4s_v5", 1, 10)],
            nodes,
            pods,
        ));
        assert!(plan.targets.is_empty());
        assert_eq!(plan.already_provided, vec!["default/p".to_string()]);
    }

    #[test]
    fn a_tainted_gpu_group_grows_from_zero_only_for_pods_that_tolerate_its_taint() {
        let mut gpu = group("gpu", "Standard_NC6s_v3", 0, 3);
        if let Some(s) = gpu.shape.as_mut() {
            s.tags.insert(
                "k8s.io_cluster-autoscaler_node-template_taint_sku".into(),
                "gpu:NoSchedule".into(),
            );
        }
        let plain = pending("plain", "1", "1Gi", json!({}));
        let cuda = pending(
            "cuda",
            "1",
            "8Gi",
            json!({"tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1", "memory": "8Gi", "nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "1"}}}]}),
        );
        let cuda = (*cuda).clone();
        // Only the GPU group exists: the plain pod must not grow it.
        let only_gpu = plan(&input(vec![gpu.clone()], vec![], vec![plain.clone()]));
        assert!(only_gpu.targets.is_empty());
        let reasons = &only_gpu.unfit["default/plain"];
        assert_eq!(reasons.len(), 1);
        assert!(reasons[0].1.text.contains("taint"), "{reasons:?}");
        // With a general group too, each pod goes where it belongs.
        let both = plan(&input(
            vec![group("general", "Standard_D4s_v5", 0, 10), gpu],
            vec![],
            vec![plain, Arc::new(cuda)],
        ));
        assert_eq!(both.triggered["default/plain"], "general");
        assert_eq!(both.triggered["default/cuda"], "gpu");
        assert_eq!(both.targets["gpu"], 1);
        assert_eq!(both.targets["general"], 1);
    }

    #[test]
    fn a_pod_that_fits_no_group_is_reported_with_a_reason_per_group_and_not_planned() {
        let huge = pending("huge", "64", "1Gi", json!({}));
        let plan = plan(&input(
            vec![
                group("a", "Standard_D4s_v5", 0, 10),
                group("b", "Standard_D8s_v5", 0, 10),
            ],
            vec![],
            vec![huge],
        ));
        assert!(plan.targets.is_empty());
        let reasons = &plan.unfit["default/huge"];
        assert_eq!(
            reasons.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        assert!(
            reasons.iter().all(|r| r.1.label == "insufficient_cpu"),
            "{reasons:?}"
        );
    }

    #[test]
    fn a_group_of_unknown_size_or_marked_failing_is_never_grown() {
        let pods = vec![pending("p", "1", "1Gi", json!({}))];
        let mut unknown = group("unknown", "Standard_D4s_v5", 0, 10);
        unknown.capacity = None;
        let mut failing = group("failing", "Standard_D4s_v5", 0, 10);
        failing.unhealthy = Some(WhyNot::new(
            "provision_timeout",
            "nodes did not register within maxNodeProvisionTime",
        ));
        let p = plan(&input(
            vec![unknown.clone(), failing.clone()],
            vec![],
            pods.clone(),
        ));
        assert!(p.targets.is_empty());
        assert_eq!(p.unfit["default/p"].len(), 2);
        // With a healthy group beside them, planning moves there.
        let p = plan(&input(
            vec![failing, unknown, group("healthy", "Standard_D4s_v5", 0, 10)],
            vec![],
            pods,
        ));
        assert_eq!(p.targets.keys().collect::<Vec<_>>(), vec!["healthy"]);
    }

    #[test]
    fn a_group_at_its_max_is_not_grown_and_the_pod_says_so() {
        // The group's one node is full (a bound pod takes 3.5 of its 4 cpu), and max is 1.
        let mut hog = (*pending("hog", "3500m", "1Gi", json!({}))).clone();
        hog.node_name = Some("general-0".into());
        let pods = vec![pending("p", "1", "1Gi", json!({})), Arc::new(hog)];
        let nodes = vec![node("general-0", "general", 0, "4", "16Gi", json!([]))];
        let p = plan(&input(
            vec![group("general", "Standard_D4s_v5", 1, 1)],
            nodes,
            pods,
        ));
        assert!(p.targets.is_empty());
        assert!(p.unfit["default/p"][0].1.label == "max_size", "{p:?}");
    }

    #[test]
    fn anti_affinity_by_namespace_labels_reads_the_namespaces_labels() {
        // A db pod runs in namespace `data` on the zone-1 node; the pending pod keeps out of
        // zones holding db pods of namespaces labelled team=data.
        let db = Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "data", "labels": {"app": "db"}},
                "spec": {"nodeName": "sys-1", "containers": [{"name": "c"}]},
            }))
            .unwrap(),
        ));
        let shy = app_pod(
            "shy",
            "shy",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"app": "db"}},
                 "namespaceSelector": {"matchLabels": {"team": "data"}}}]}}}),
        );
        let nodes = vec![system_node("sys-1", 0, "1")];
        let groups = || vec![zonal("z1", &["1"], 0), zonal("z2", &["2"], 0)];
        let mut labelled = input(groups(), nodes.clone(), vec![db.clone(), shy.clone()]);
        labelled.namespaces = Arc::new(NamespaceLabels::new([(
            "data".to_string(),
            BTreeMap::from([("team".to_string(), "data".to_string())]),
        )]));
        labelled.expander =
            Expander::Priority(vec![(10, vec!["z1".into()]), (1, vec!["z2".into()])]);
        let p = plan(&labelled);
        assert_eq!(targets(&p), [("z2", 1)], "{p:?}");
        // The same namespace without the label: the db pod is not counted, zone 1 is fine.
        let mut unlabelled = input(groups(), nodes, vec![db, shy]);
        unlabelled.expander =
            Expander::Priority(vec![(10, vec!["z1".into()]), (1, vec!["z2".into()])]);
        unlabelled.namespaces = Arc::new(NamespaceLabels::new([(
            "data".to_string(),
            BTreeMap::new(),
        )]));
        assert_eq!(targets(&plan(&unlabelled)), [("z1", 1)]);
    }

    #[test]
    fn expendable_and_bound_pods_ask_for_nothing() {
        let low = pending("low", "1", "1Gi", json!({"priority": -100}));
        let p = plan(&input(
            vec![group("general", "Standard_D4s_v5", 0, 10)],
            vec![],
            vec![low],
        ));
        assert_eq!(p.pending, 0);
        assert!(p.targets.is_empty());
    }

    #[test]
    fn pods_too_many_for_one_group_spill_to_the_next_in_the_same_decision() {
        let pods: Vec<_> = (0..8)
            .map(|i| pending(&format!("p{i}"), "3", "1Gi", json!({})))
            .collect();
        // Each D4s_v5 takes one 3-cpu pod; a max of 3 leaves 5 pods for the D8s_v5 group.
        let p = plan(&input(
            vec![
                group("small", "Standard_D4s_v5", 0, 3),
                group("big", "Standard_D8s_v5", 0, 10),
            ],
            vec![],
            pods,
        ));
        assert_eq!(p.triggered.len(), 8, "{p:?}");
        assert!(p.unfit.is_empty());
        assert_eq!(p.targets.len(), 2);
    }
}
