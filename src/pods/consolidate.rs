//! Consolidation, pure: Karpenter's multi-node consolidation adapted to node groups. After a
//! scale-down pass has chosen its empty and unneeded nodes, several more nodes may go at once
//! when their pods all fit on the nodes that stay, simulated together (the room one node's pods
//! take is gone for the next, the budgets' disruptions are spent across them, none of the set
//! is a destination) with the same simulation as scale-down (`unneeded::Sim`).
//!
//! Candidates are the nodes scale-down could remove (same blockers: PDBs, `safe-to-evict`,
//! pods without a controller, kube-system pods without a PDB, local storage,
//! `scale-down-disabled`, floors, sizes unknown), less those of groups grown within
//! `consolidation.delayAfterAdd` (0 s by default: Karpenter has no such hold), those a pod
//! marks `karpenter.sh/do-not-disrupt` (`"true"`, or a duration from the pod's start), those
//! whose pods changed within `consolidateAfter`, those a pod is nominated to or a pending pod
//! could run on, those no disruption budget allows, and, while the pods' requests rose within
//! `stabilizationWindow` ([`super::stabilization`]), every node whose pods would move. They are
//! sorted by the price saved over the disruption (Karpenter's `SavingsRatio`: the group's price per hour over
//! `1 + Σ max(0, evictionCost)`), the first [`MAX_CONSOLIDATION_CANDIDATES`] are searched by
//! prefix (binary search: the largest prefix whose pods all fit elsewhere), and when the time
//! limit runs out the last valid answer stands. When no prefix holds, the next
//! [`SINGLE_NODE_TRIALS`] candidates are tried alone (Karpenter's single-node consolidation).
//! With `policy: Balanced` a set is made only when [`score_move`] approves it against the totals
//! of its source groups. [`revalidate`] checks a command again before it is acted on. No I/O, no
//! clock: the time and the time limit come from the caller.

use super::fit::NodeState;
use super::record::{NodeRecord, PodRecord, DO_NOT_DISRUPT, POD_DELETION_COST};
use super::scale_down::{job_blocker, moves, pod_blocker, Hints, SCALE_DOWN_DISABLED};
use super::unneeded::{bare_nodes, listed, Candidate, DownInput, Sim};
use crate::config::{
    ConsolidationPolicy, ConsolidationSettings, DisruptionReason, BALANCED_K,
    MAX_CONSOLIDATION_CANDIDATES,
};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// What one consolidation decision looks at.
#[derive(Clone, Copy)]
pub struct ConsolidationInput<'a> {
    /// The scale-down pass's view. Its groups' `deleting` must count the nodes the pass itself
    /// chose (they are not busy yet), and `busy` every node being removed.
    pub down: DownInput<'a>,
    /// Per group (as `down.groups`), USD per node-hour ([`crate::capacity::PriceBook`]).
    pub prices: &'a [f64],
    /// Nodes this pass's scale-down chose: neither candidates nor destinations.
    pub chosen: &'a HashSet<String>,
    /// Nodes whose pods changed within `consolidateAfter`: not candidates yet.
    pub unsettled: &'a HashSet<String>,
    /// `consolidation:`.
    pub settings: &'a ConsolidationSettings,
    /// Nodes this pass may still remove (`maxScaleDownPerPass` less what it chose).
    pub max_nodes: u32,
    /// The pods' requests rose within `consolidation.stabilizationWindow`
    /// ([`super::stabilization`]): no node whose pods would move is a candidate.
    pub demand_rising: bool,
    /// With `consolidation.emptyFirst` on: the nodes that have been among those consolidation
    /// empties first (deletion-cost hints, soft taint) for that long. A node whose pods would
    /// move is a candidate only once it is here; until then it stays in the drain order, so it
    /// gets there. `None`: off.
    pub ripe: Option<&'a HashSet<String>>,
}

/// Why a node is not consolidated (shown in `Unconsolidatable` Events and `explain node`).
#[derive(Debug, Clone, PartialEq)]
pub enum Unconsolidatable {
    /// Something on the node keeps it: an annotation, a pod that cannot move, the policy.
    Blocked(String),
    /// Its pods changed within `consolidateAfter`.
    Recent,
    /// A pending pod is nominated to it.
    Nominated(String),
    /// A pending pod could run on it.
    PendingFits(String),
    /// Its group: size unknown, grown lately, at its floor.
    Group(String),
    /// A disruption budget allows no more.
    Budget(String),
    /// Its pods do not fit on the nodes that stay, with the other candidates ahead of it.
    Simulation(String),
    /// `policy: Balanced`: what the move would save is too small for what it would disrupt.
    NotWorthIt(String),
    /// Its pods would move while the cluster's demand grows (`stabilizationWindow`).
    DemandRising,
    /// Its pods are being given `emptyFirst` to leave on their own.
    Emptying,
}

impl std::fmt::Display for Unconsolidatable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unconsolidatable::Blocked(why) => f.write_str(why),
            Unconsolidatable::Recent => {
                f.write_str("its pods changed within consolidation.consolidateAfter")
            }
            Unconsolidatable::Nominated(p) => write!(f, "pending pod {p} is nominated to it"),
            Unconsolidatable::PendingFits(p) => write!(f, "pending pod {p} could run on it"),
            Unconsolidatable::Group(why) => f.write_str(why),
            Unconsolidatable::Budget(why) => write!(f, "disruption budget: {why}"),
            Unconsolidatable::Simulation(why) => f.write_str(why),
            Unconsolidatable::NotWorthIt(why) => {
                write!(f, "consolidation.policy Balanced: {why}")
            }
            Unconsolidatable::DemandRising => f.write_str(
                "the pods' requests rose within consolidation.stabilizationWindow: its pods would move to make room that is needed again",
            ),
            Unconsolidatable::Emptying => f.write_str(
                "its pods are given consolidation.emptyFirst to leave on their own (deletion-cost hints, soft taint) before any is evicted",
            ),
        }
    }
}

impl Unconsolidatable {
    /// A short label (Karpenter's validation errors: churn, nomination, budget, scheduling).
    pub fn label(&self) -> &'static str {
        match self {
            Unconsolidatable::Blocked(_) | Unconsolidatable::Recent => "churn",
            Unconsolidatable::Nominated(_) => "nominated",
            Unconsolidatable::PendingFits(_) | Unconsolidatable::Simulation(_) => "scheduling",
            Unconsolidatable::Group(_) => "group",
            Unconsolidatable::Budget(_) => "budget",
            Unconsolidatable::NotWorthIt(_) => "balanced",
            Unconsolidatable::DemandRising => "stabilizing",
            Unconsolidatable::Emptying => "emptying",
        }
    }
}

/// One node a command removes.
#[derive(Debug, Clone, PartialEq)]
pub struct Consolidated {
    /// Node name.
    pub node: String,
    /// Index of its group in the input's groups.
    pub group: usize,
    /// The scale set's instance id.
    pub instance_id: String,
    /// The node's `resourceVersion` as read (the taint is written under it).
    pub resource_version: String,
    /// Uids (or keys) of the pods that move.
    pub pods: Vec<String>,
    /// Its group's price per node-hour.
    pub price: f64,
    /// Its disruption cost ([`node_cost`]).
    pub cost: f64,
    /// Empty or underutilized (what budgets count it as).
    pub reason: DisruptionReason,
}

/// What a command does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Delete the nodes; their pods move to the nodes that stay.
    Delete,
    /// Grow node group `group` (index in the input's groups) by one node first, wait until it
    /// is Ready, then delete the nodes: their pods move to the nodes that stay and the new one.
    Replace {
        /// The cheaper group that grows.
        group: usize,
        /// Its price per node-hour.
        price: f64,
    },
}

/// A node group a replacement may come from: a new node of it as scale-up's planner imagines
/// one ([`crate::pods::scale_up::group_templates`]: live node or shape, zones, taints, labels,
/// DaemonSets taken off), and what it costs. The caller offers only groups that may grow now
/// (below their max, not refused, not backed off).
#[derive(Debug, Clone)]
pub struct ReplaceOption {
    /// Index of the group in the input's groups.
    pub group: usize,
    /// A new node of it.
    pub template: NodeState,
    /// USD per node-hour.
    pub price: f64,
}

/// A consolidation decided: which nodes go, and what it saves.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// What is done.
    pub action: Action,
    /// The nodes, in candidate order.
    pub nodes: Vec<Consolidated>,
    /// USD per hour saved.
    pub savings_per_hour: f64,
}

/// What [`consolidate`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Consolidation {
    /// The nodes to remove, if any.
    pub command: Option<Command>,
    /// Nodes of managed groups that are not consolidated, and why.
    pub unconsolidatable: BTreeMap<String, Unconsolidatable>,
    /// The time limit ran out: `command` is the last valid answer found.
    pub timed_out: bool,
    /// Candidates the search looked at (at most [`MAX_CONSOLIDATION_CANDIDATES`]).
    pub searched: usize,
    /// Sets simulated.
    pub trials: u32,
    /// The candidates with pods to move whose pods could all move, the most saved per unit of
    /// disruption first (the order [`super::deletion_cost`] hints by; empty candidates need no
    /// hint and are left out).
    pub drain_order: Vec<String>,
}

/// Karpenter's eviction cost of one pod: `1 + pod-deletion-cost/2^27 + priority/2^25`, clamped
/// to [-10, 10]. The controller's own deletion-cost hint ([`super::deletion_cost`]) counts as no
/// cost: it orders a scale-in, it does not make the pod cheaper to evict.
pub fn eviction_cost(pod: &PodRecord) -> f64 {
    let mut cost = 1.0;
    if let Some(c) = pod
        .annotation(POD_DELETION_COST)
        .filter(|_| super::deletion_cost::own_hint(pod).is_none())
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        cost += c / 2f64.powi(27);
    }
    cost += f64::from(pod.priority()) / 2f64.powi(25);
    cost.clamp(-10.0, 10.0)
}

/// A node's disruption cost: `1 + Σ max(0, evictionCost)` over the pods that would move.
pub fn node_cost<'a>(pods: impl IntoIterator<Item = &'a Arc<PodRecord>>) -> f64 {
    1.0 + pods
        .into_iter()
        .filter(|p| moves(p))
        .map(|p| eviction_cost(p).max(0.0))
        .sum::<f64>()
}

/// One node group's totals for `policy: Balanced` (Karpenter's `NodePoolTotals`): the price per
/// hour of its nodes and the sum of their disruption costs ([`node_cost`]), taken once per
/// decision.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GroupTotals {
    /// USD per hour of its nodes.
    pub cost: f64,
    /// Σ of its nodes' disruption costs.
    pub disruption: f64,
}

/// Karpenter's `ScoreMove`: the share of `totals.cost` a move saves over the share of
/// `totals.disruption` it disrupts. A move that disrupts nothing and saves something scores
/// `+inf`; one that saves nothing, or whose groups cost nothing, scores 0.
pub fn score_move(savings: f64, disruption: f64, totals: GroupTotals) -> f64 {
    if savings <= 0.0 || totals.cost <= 0.0 {
        return 0.0;
    }
    if disruption <= 0.0 || totals.disruption <= 0.0 {
        return f64::INFINITY;
    }
    (savings / totals.cost) / (disruption / totals.disruption)
}

/// Whether `policy: Balanced` makes a move of this score ([`score_move`] at least
/// `1 / BALANCED_K`).
pub fn balanced_approves(score: f64) -> bool {
    score >= 1.0 / BALANCED_K
}

/// Whether `pod` keeps its node from consolidation by `karpenter.sh/do-not-disrupt`: `"true"`,
/// or a duration (`"4h"`) not yet past since the pod started (a pod not started yet is
/// protected). A value that is neither protects too: a typo never lets a pod be disrupted.
pub fn do_not_disrupt(pod: &PodRecord, now: k8s_openapi::jiff::Timestamp) -> bool {
    match pod.annotation(DO_NOT_DISRUPT).map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => match humantime::parse_duration(v) {
            Ok(d) => match (pod.started, k8s_openapi::jiff::SignedDuration::try_from(d)) {
                (Some(start), Ok(d)) => start.checked_add(d).map_or(true, |until| now < until),
                _ => true,
            },
            Err(_) => true,
        },
    }
}

/// A candidate that passed every check of one node.
struct Cand<'a> {
    c: Candidate<'a>,
    pods: Vec<Arc<PodRecord>>,
    price: f64,
    cost: f64,
    reason: DisruptionReason,
}

impl Cand<'_> {
    fn ratio(&self) -> f64 {
        self.price / self.cost
    }

    fn consolidated(&self) -> Consolidated {
        Consolidated {
            node: self.c.node.name.clone(),
            group: self.c.group,
            instance_id: self.c.instance_id.clone(),
            resource_version: self.c.node.resource_version.clone().unwrap_or_default(),
            pods: self
                .pods
                .iter()
                .map(|p| p.uid.clone().unwrap_or_else(|| p.key()))
                .collect(),
            price: self.price,
            cost: self.cost,
            reason: self.reason,
        }
    }
}

/// What keeps one node out, by itself (annotations, pods, policy, time, pending pods, group).
fn node_check(
    input: &ConsolidationInput,
    node: &NodeRecord,
    state: &NodeState,
    pending: &[&Arc<PodRecord>],
    group: usize,
) -> Result<Vec<Arc<PodRecord>>, Unconsolidatable> {
    let down = &input.down;
    for (key, value) in [(SCALE_DOWN_DISABLED, "true"), (DO_NOT_DISRUPT, "true")] {
        if node.annotations.get(key).map(String::as_str) == Some(value) {
            return Err(Unconsolidatable::Blocked(format!(
                "node annotated {key}={value}"
            )));
        }
    }
    let pods: Vec<Arc<PodRecord>> = state.pods().iter().filter(|p| moves(p)).cloned().collect();
    for p in &pods {
        if let Some(b) = pod_blocker(p, down.pdbs) {
            return Err(Unconsolidatable::Blocked(b.to_string()));
        }
        if do_not_disrupt(p, down.now) {
            return Err(Unconsolidatable::Blocked(format!(
                "pod {} is annotated {DO_NOT_DISRUPT}",
                p.key()
            )));
        }
    }
    if let Some(b) = job_blocker(&pods, down.keep_jobs) {
        return Err(Unconsolidatable::Blocked(b.to_string()));
    }
    if !pods.is_empty() && input.settings.policy == ConsolidationPolicy::WhenEmpty {
        return Err(Unconsolidatable::Blocked(
            "consolidation.policy is WhenEmpty and pods would have to move".into(),
        ));
    }
    if !pods.is_empty() && input.demand_rising {
        return Err(Unconsolidatable::DemandRising);
    }
    if input.unsettled.contains(&node.name) {
        return Err(Unconsolidatable::Recent);
    }
    if let Some(p) = down
        .pods
        .nominated(&node.name)
        .and_then(|n| n.pods().first())
    {
        return Err(Unconsolidatable::Nominated(p.key()));
    }
    if let Some(p) = pending.iter().find(|p| state.fits(p).is_ok()) {
        return Err(Unconsolidatable::PendingFits(p.key()));
    }
    let g = &down.groups[group];
    if g.size.is_none() {
        return Err(Unconsolidatable::Group(format!(
            "the size of node group {} is not known",
            g.name
        )));
    }
    if g.grown_ago
        .is_some_and(|ago| ago < input.settings.delay_after_add)
    {
        return Err(Unconsolidatable::Group(format!(
            "consolidation is held after a scale-up (consolidation.delayAfterAdd): node group {} grew, or (without scaleDown.delayTypeLocal) another group did",
            g.name
        )));
    }
    Ok(pods)
}

/// The candidates of `input`, each checked on its own, sorted by savings over disruption;
/// every node left out is in `out` with its reason. Also gives back the pass's room.
fn survey<'a>(
    input: &ConsolidationInput<'a>,
    out: &mut BTreeMap<String, Unconsolidatable>,
) -> (Vec<Cand<'a>>, super::unneeded::Listed<'a>, Vec<GroupTotals>) {
    let (cands, l, totals, _) = survey_drain(input, out);
    (cands, l, totals)
}

/// [`survey`], and the drain order: the candidates with pods to move and the nodes kept only
/// by `emptyFirst`, the most saved per unit of disruption first.
fn survey_drain<'a>(
    input: &ConsolidationInput<'a>,
    out: &mut BTreeMap<String, Unconsolidatable>,
) -> (
    Vec<Cand<'a>>,
    super::unneeded::Listed<'a>,
    Vec<GroupTotals>,
    Vec<String>,
) {
    let mut l = listed(&input.down);
    // Every node of each group as listed (candidate or not): the totals `Balanced` scores by.
    let mut totals = vec![GroupTotals::default(); input.down.groups.len()];
    for c in &l.candidates {
        if let Some(t) = totals.get_mut(c.group) {
            t.cost += input.prices.get(c.group).copied().unwrap_or(0.0);
            t.disruption += node_cost(l.room[c.at].pods());
        }
    }
    let pending: Vec<&Arc<PodRecord>> = input
        .down
        .pods
        .unplaced()
        .filter(|p| p.unschedulable)
        .collect();
    let mut cands = Vec::new();
    for c in std::mem::take(&mut l.candidates) {
        let name = c.node.name.as_str();
        if c.unready || input.chosen.contains(name) {
            continue;
        }
        match node_check(input, c.node, &l.room[c.at], &pending, c.group) {
            Err(why) => {
                out.insert(name.to_string(), why);
            }
            Ok(pods) => {
                let price = input.prices.get(c.group).copied().unwrap_or(0.0);
                let cost = node_cost(&pods);
                let reason = if pods.is_empty() {
                    DisruptionReason::Empty
                } else {
                    DisruptionReason::Underutilized
                };
                cands.push(Cand {
                    c,
                    pods,
                    price,
                    cost,
                    reason,
                });
            }
        }
    }
    // Karpenter's order: the most saved per unit of disruption first.
    cands.sort_by(|a, b| {
        b.ratio()
            .total_cmp(&a.ratio())
            .then_with(|| a.c.node.name.cmp(&b.c.node.name))
    });
    // Empty candidates need no hint and no time to empty: they would only take places.
    let drain = cands
        .iter()
        .filter(|c| !c.pods.is_empty())
        .map(|c| c.c.node.name.clone())
        .collect();
    if let Some(ripe) = input.ripe {
        cands.retain(|c| {
            let keep = c.pods.is_empty() || ripe.contains(&c.c.node.name);
            if !keep {
                out.insert(c.c.node.name.clone(), Unconsolidatable::Emptying);
            }
            keep
        });
    }
    (cands, l, totals, drain)
}

/// `policy: Balanced`: whether removing `set` to save `savings` per hour is worth its
/// disruption, scored against the totals of the groups the set's nodes come from (Karpenter
/// scores a move against its source NodePool). Any other policy: always. `Err`: why not.
fn worth_it(
    input: &ConsolidationInput,
    totals: &[GroupTotals],
    set: &[Cand],
    savings: f64,
) -> Result<(), String> {
    if input.settings.policy != ConsolidationPolicy::Balanced {
        return Ok(());
    }
    let mut groups: Vec<usize> = set.iter().map(|c| c.c.group).collect();
    groups.sort_unstable();
    groups.dedup();
    let sum = groups
        .iter()
        .filter_map(|g| totals.get(*g))
        .fold(GroupTotals::default(), |a, t| GroupTotals {
            cost: a.cost + t.cost,
            disruption: a.disruption + t.disruption,
        });
    let disruption: f64 = set.iter().map(|c| c.cost).sum();
    let score = score_move(savings, disruption, sum);
    if balanced_approves(score) {
        return Ok(());
    }
    Err(format!(
        "it would save ${savings:.3}/h of its groups' ${:.3}/h for {disruption:.1} of their disruption cost {:.1}: a score of {score:.2}, under 1/{BALANCED_K}",
        sum.cost, sum.disruption
    ))
}

/// Keeps, in order, the candidates every limit still allows (the group's floor, its budgets,
/// the cluster's budgets, the pass's limit), spending each limit per node kept; the others go
/// to `out`. Karpenter filters by budget before its search, so every prefix is allowed.
fn within_limits<'a>(
    input: &ConsolidationInput,
    cands: Vec<Cand<'a>>,
    out: &mut BTreeMap<String, Unconsolidatable>,
) -> Vec<Cand<'a>> {
    let groups = input.down.groups;
    let s = input.settings;
    let deleting = |g: usize| i64::from(groups[g].deleting);
    let size = |g: usize| groups[g].size.unwrap_or(0).max(0);
    let total: i64 = (0..groups.len()).map(size).sum();
    let total_deleting: i64 = (0..groups.len()).map(deleting).sum();
    let mut floor_left: Vec<i64> = (0..groups.len())
        .map(|g| size(g) - deleting(g) - i64::from(groups[g].floor))
        .collect();
    let as_u32 = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    // Per (group, budget index) and per cluster budget: how many more it lets go.
    let mut group_left: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (g, group) in groups.iter().enumerate() {
        for (b, budget) in s.budgets_of(&group.name).iter().enumerate() {
            group_left.insert(
                (g, b),
                i64::from(budget.nodes.allowed(as_u32(size(g)))) - deleting(g),
            );
        }
    }
    let mut cluster_left: Vec<i64> = s
        .cluster_budgets
        .iter()
        .map(|b| i64::from(b.nodes.allowed(as_u32(total))) - total_deleting)
        .collect();
    let mut pass_left = i64::from(input.max_nodes);
    let mut kept = Vec::new();
    for c in cands {
        let g = c.c.group;
        let name = &groups[g].name;
        let budgets = s.budgets_of(name);
        let why = if floor_left[g] <= 0 {
            Some(Unconsolidatable::Group(format!(
                "node group {name} is at its floor ({}) counting the deletions under way",
                groups[g].floor
            )))
        } else if let Some((b, _)) = budgets.iter().enumerate().find(|(b, budget)| {
            budget.applies_to(c.reason) && group_left.get(&(g, *b)).copied().unwrap_or(0) <= 0
        }) {
            Some(Unconsolidatable::Budget(format!(
                "node group {name}'s budget {} allows no more {} nodes now",
                budget_text(&budgets[b]),
                c.reason.as_str()
            )))
        } else if let Some((b, _)) = s
            .cluster_budgets
            .iter()
            .enumerate()
            .find(|(b, budget)| budget.applies_to(c.reason) && cluster_left[*b] <= 0)
        {
            Some(Unconsolidatable::Budget(format!(
                "the cluster's budget {} allows no more {} nodes now",
                budget_text(&s.cluster_budgets[b]),
                c.reason.as_str()
            )))
        } else if pass_left <= 0 {
            Some(Unconsolidatable::Group(
                "scaleDown.maxScaleDownPerPass is spent this pass".into(),
            ))
        } else {
            None
        };
        if let Some(why) = why {
            out.insert(c.c.node.name.clone(), why);
            continue;
        }
        floor_left[g] -= 1;
        pass_left -= 1;
        for (b, budget) in budgets.iter().enumerate() {
            if budget.applies_to(c.reason) {
                if let Some(left) = group_left.get_mut(&(g, b)) {
                    *left -= 1;
                }
            }
        }
        for (b, budget) in s.cluster_budgets.iter().enumerate() {
            if budget.applies_to(c.reason) {
                cluster_left[b] -= 1;
            }
        }
        kept.push(c);
    }
    kept
}

fn budget_text(b: &crate::config::Budget) -> String {
    let nodes = match b.nodes {
        crate::config::BudgetNodes::Count(n) => n.to_string(),
        crate::config::BudgetNodes::Percent(p) => format!("{p}%"),
    };
    match &b.reasons {
        None => format!("nodes: {nodes}"),
        Some(r) => format!(
            "nodes: {nodes}, reasons: [{}]",
            r.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Whether every pod of `set` fits on the nodes that stay, the set removed together: on a copy
/// of `base`, every node of the set is gone first (none is a destination), then each node's pods
/// are placed in turn. `Err`: the first node whose pods do not fit, and why.
fn holds(base: &Sim, set: &[Cand]) -> Result<(), (String, String)> {
    simulate(base, set).map(|_| ())
}

/// [`holds`], giving back the simulation as it ends (where the pods went).
fn simulate<'c>(base: &Sim<'c>, set: &[Cand]) -> Result<Sim<'c>, (String, String)> {
    let mut sim = base.clone();
    for c in set {
        sim.gone[c.c.at] = true;
    }
    let mut hints = Hints::default();
    for c in set {
        sim.remove(c.c.at, &c.c.node.annotations, f64::INFINITY, &mut hints)
            .map_err(|b| (c.c.node.name.clone(), b.to_string()))?;
    }
    Ok(sim)
}

/// The pass's room with `template` added last as one more node (named for its group), and the
/// cross-node view over it: the simulation a replace is tried on. Nodes `chosen` are gone.
fn room_with(
    l: &super::unneeded::Listed,
    template: Option<&NodeState>,
    group: &str,
) -> Vec<NodeState> {
    let mut room = l.room.clone();
    if let Some(t) = template {
        let mut t = t.clone();
        t.name = format!("replacement-{group}");
        std::sync::Arc::make_mut(&mut t.labels).insert(super::fit::HOSTNAME.into(), t.name.clone());
        room.push(t);
    }
    room
}

fn base_sim<'c>(
    room: Vec<NodeState>,
    l: &super::unneeded::Listed,
    bare: &'c [NodeState],
    input: &ConsolidationInput<'c>,
) -> Sim<'c> {
    let mut base = Sim::new(room, &l.elsewhere, &l.not_room, bare, &input.down);
    for c in input.chosen {
        if let Some(at) = base.room.iter().position(|n| n.name == *c) {
            base.gone[at] = true;
        }
    }
    base
}

/// Whether `set` can be replaced by one new node of `opt` (on `base`, built by [`room_with`]
/// with its template last): strictly cheaper than the nodes it replaces (and, as Karpenter's
/// `filterOutSameInstanceType`, cheaper than the cheapest of them of its own group), every pod
/// fits on the nodes that stay and the new node, and the new node takes at least one (else it
/// is a delete, not a replace). `Err`: why not.
fn replaces(base: &Sim, set: &[Cand], opt: &ReplaceOption) -> Result<(), String> {
    let sum: f64 = set.iter().map(|c| c.price).sum();
    if opt.price >= sum {
        return Err(format!(
            "a node of it costs ${:.3}/h, not less than the ${sum:.3}/h of the node(s) it would replace",
            opt.price
        ));
    }
    let own = set
        .iter()
        .filter(|c| c.c.group == opt.group)
        .map(|c| c.price)
        .fold(f64::INFINITY, f64::min);
    if opt.price >= own {
        return Err("it is the group of a node it would replace, at no lower price".into());
    }
    let t = base.room.len() - 1;
    match simulate(base, set) {
        Err((node, why)) => {
            // What the new node itself says of the first of that node's pods it would not take
            // (a selector, a taint, its size); nothing when each would fit alone (spread,
            // affinity, or all of them together).
            let own = set
                .iter()
                .find(|c| c.c.node.name == node)
                .and_then(|c| {
                    c.pods
                        .iter()
                        .find_map(|p| base.room[t].fits(p).err().map(|u| (p, u)))
                })
                .map(|(p, u)| format!(" (a new node of it would not take pod {}: {u})", p.key()))
                .unwrap_or_default();
            Err(format!("node {node}'s pods do not fit there: {why}{own}"))
        }
        Ok(sim) if sim.room[t].pods().len() == base.room[t].pods().len() => {
            Err("the new node would take none of their pods".into())
        }
        Ok(_) => Ok(()),
    }
}

/// Consolidation's replace (Karpenter's multi-node and single-node replace, one search): the
/// candidates of [`consolidate`], budgeted as `Replace`, searched by prefix (binary search, the
/// largest valid prefix, the time limit keeping the last valid answer) for a set that one new
/// node of a cheaper group in `options` (cheapest first) replaces (see `replaces`). When none is
/// found every candidate's reason says why.
pub fn replace(
    input: &ConsolidationInput,
    options: &[ReplaceOption],
    timed_out: &mut dyn FnMut() -> bool,
) -> Consolidation {
    let mut out = Consolidation::default();
    let (mut cands, l, totals) = survey(input, &mut out.unconsolidatable);
    for c in &mut cands {
        c.reason = DisruptionReason::Replace;
    }
    let mut cands = within_limits(input, cands, &mut out.unconsolidatable);
    cands.truncate(MAX_CONSOLIDATION_CANDIDATES);
    out.searched = cands.len();
    if cands.is_empty() {
        return out;
    }
    let no_option = || {
        Unconsolidatable::Simulation(
            "no node group that may grow now offers a replacement (each is at its max, refused, backed off, or has no template)".into(),
        )
    };
    if options.is_empty() {
        for c in &cands {
            out.unconsolidatable
                .insert(c.c.node.name.clone(), no_option());
        }
        return out;
    }
    let mut order: Vec<&ReplaceOption> = options.iter().collect();
    order.sort_by(|a, b| a.price.total_cmp(&b.price).then(a.group.cmp(&b.group)));
    let names: Vec<&str> = order
        .iter()
        .map(|o| {
            input
                .down
                .groups
                .get(o.group)
                .map_or("?", |g| g.name.as_str())
        })
        .collect();
    let rooms: Vec<Vec<NodeState>> = order
        .iter()
        .zip(&names)
        .map(|(o, name)| room_with(&l, Some(&o.template), name))
        .collect();
    let bares: Vec<Vec<NodeState>> = rooms
        .iter()
        .map(|r| bare_nodes(r, &l.elsewhere, &input.down))
        .collect();
    let bases: Vec<Sim> = rooms
        .into_iter()
        .zip(&bares)
        .map(|(r, b)| base_sim(r, &l, b, input))
        .collect();
    // Per prefix length that held, the option (index in `order`) that replaces it; why not, for
    // the smallest prefix tried.
    let mut chosen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut smallest: Option<(usize, Vec<String>)> = None;
    let (best, timed, trials) = prefix_search(
        cands.len(),
        |n| {
            let mut why = Vec::new();
            for (o, opt) in order.iter().enumerate() {
                let set = &cands[..n];
                let savings = set.iter().map(|c| c.price).sum::<f64>() - opt.price;
                match replaces(&bases[o], set, opt)
                    .and_then(|()| worth_it(input, &totals, set, savings))
                {
                    Ok(()) => {
                        chosen.insert(n, o);
                        return true;
                    }
                    Err(w) => why.push(format!("{}: {w}", names[o])),
                }
            }
            if smallest.as_ref().is_none_or(|(m, _)| n < *m) {
                smallest = Some((n, why));
            }
            false
        },
        timed_out,
    );
    out.timed_out = timed;
    out.trials = trials;
    let n = best.unwrap_or(0);
    let why_not = smallest.map(|(m, why)| {
        format!(
            "no cheaper node group's new node replaces {}: {}",
            if m == 1 {
                "it".to_string()
            } else {
                format!("the first {m} candidates")
            },
            why.join("; ")
        )
    });
    for c in &cands[n..] {
        let why = why_not
            .clone()
            .unwrap_or_else(|| "not replaced with the candidates ahead of it".into());
        let why = if timed {
            format!("{why} (or the search's time limit, consolidation.timeout, ran out first)")
        } else {
            why
        };
        out.unconsolidatable
            .insert(c.c.node.name.clone(), Unconsolidatable::Simulation(why));
    }
    if let Some(o) = chosen.get(&n).map(|o| order[*o]) {
        let nodes: Vec<Consolidated> = cands[..n].iter().map(Cand::consolidated).collect();
        let sum: f64 = nodes.iter().map(|c| c.price).sum();
        out.command = Some(Command {
            action: Action::Replace {
                group: o.group,
                price: o.price,
            },
            savings_per_hour: sum - o.price,
            nodes,
        });
    }
    out
}

/// Consolidation as the controller runs it, in Karpenter's order: the multi-node delete
/// ([`consolidate`]) first; only when it finds nothing, the replace ([`replace`]) over
/// `options`. A node neither takes is told both reasons.
pub fn decide(
    input: &ConsolidationInput,
    options: &[ReplaceOption],
    timed_out: &mut dyn FnMut() -> bool,
) -> Consolidation {
    let mut out = consolidate(input, timed_out);
    if out.command.is_some() || input.settings.policy == ConsolidationPolicy::WhenEmpty {
        return out;
    }
    let r = replace(input, options, timed_out);
    out.timed_out |= r.timed_out;
    out.trials += r.trials;
    if let Some(command) = r.command {
        for n in &command.nodes {
            out.unconsolidatable.remove(&n.node);
        }
        out.command = Some(command);
    }
    for (node, why) in r.unconsolidatable {
        // What keeps a node out by itself is said once; the replace's own reasons (its budget,
        // its simulation) are added to the delete's.
        if let Some(Unconsolidatable::Simulation(first) | Unconsolidatable::Budget(first)) =
            out.unconsolidatable.get(&node)
        {
            let more = match &why {
                Unconsolidatable::Simulation(w) => w.clone(),
                Unconsolidatable::Budget(w) => format!("not replaced: disruption budget: {w}"),
                _ => continue,
            };
            let joined = format!("{first}; {more}");
            let merged = match out.unconsolidatable.get(&node) {
                Some(Unconsolidatable::Budget(_)) => Unconsolidatable::Budget(joined),
                _ => Unconsolidatable::Simulation(joined),
            };
            out.unconsolidatable.insert(node, merged);
        }
    }
    out
}

/// How many candidates single-node consolidation tries alone after the prefix search found
/// nothing (the prefix search's own trials are about `log2(100) = 7`).
pub const SINGLE_NODE_TRIALS: usize = 10;

/// The largest `n` in `1..=len` for which `valid(n)` holds, by binary search over prefixes
/// (Karpenter's multi-node search: valid moves up, invalid down), asking `timed_out` before each
/// trial: when it says so, the last valid `n` found stands. Returns the answer, whether time ran
/// out, and the number of trials.
pub fn prefix_search(
    len: usize,
    mut valid: impl FnMut(usize) -> bool,
    timed_out: &mut dyn FnMut() -> bool,
) -> (Option<usize>, bool, u32) {
    let (mut lo, mut hi) = (1usize, len);
    let mut best = None;
    let mut trials = 0;
    while lo <= hi {
        if timed_out() {
            return (best, true, trials);
        }
        let mid = lo + (hi - lo) / 2;
        trials += 1;
        if valid(mid) {
            best = Some(mid);
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    (best, false, trials)
}

/// The multi-node consolidation of `input` (see the module documentation); `timed_out` is
/// asked before each simulated set (`consolidation.timeout`, on the caller's clock).
pub fn consolidate(
    input: &ConsolidationInput,
    timed_out: &mut dyn FnMut() -> bool,
) -> Consolidation {
    let mut out = Consolidation::default();
    let (cands, l, totals, drain) = survey_drain(input, &mut out.unconsolidatable);
    out.drain_order = drain;
    let mut cands = within_limits(input, cands, &mut out.unconsolidatable);
    for c in cands.iter().skip(MAX_CONSOLIDATION_CANDIDATES) {
        out.unconsolidatable.insert(
            c.c.node.name.clone(),
            Unconsolidatable::Simulation(format!(
                "not among the first {MAX_CONSOLIDATION_CANDIDATES} candidates by savings over disruption"
            )),
        );
    }
    cands.truncate(MAX_CONSOLIDATION_CANDIDATES);
    out.searched = cands.len();
    if cands.is_empty() {
        return out;
    }
    let bare = bare_nodes(&l.room, &l.elsewhere, &input.down);
    let mut base = Sim::new(l.room, &l.elsewhere, &l.not_room, &bare, &input.down);
    for c in input.chosen {
        // The pass's own choices are going: no destination either.
        if let Some(at) = base.room.iter().position(|n| n.name == *c) {
            base.gone[at] = true;
        }
    }
    let mut first_failure: Option<(String, String)> = None;
    // `Balanced`'s refusal of the smallest prefix it refused.
    let mut not_worth: Option<(usize, String)> = None;
    let (best, timed, trials) = prefix_search(
        cands.len(),
        |n| {
            let set = &cands[..n];
            match holds(&base, set) {
                Ok(()) => match worth_it(input, &totals, set, set.iter().map(|c| c.price).sum()) {
                    Ok(()) => true,
                    Err(why) => {
                        if not_worth.as_ref().is_none_or(|(m, _)| n < *m) {
                            not_worth = Some((n, why));
                        }
                        false
                    }
                },
                Err(e) => {
                    first_failure.get_or_insert(e);
                    false
                }
            }
        },
        timed_out,
    );
    out.timed_out = timed;
    out.trials = trials;
    let n = best.unwrap_or(0);
    // Karpenter's single-node consolidation: when no prefix holds, the next candidates alone,
    // in order, until one holds (a first candidate whose pods cannot move hides no other). At
    // most [`SINGLE_NODE_TRIALS`] of them: each trial simulates on a copy of the whole cluster,
    // and the decision must stay well under a second at 5,000 nodes.
    let mut single = None;
    let mut alone: BTreeMap<usize, Unconsolidatable> = BTreeMap::new();
    if n == 0 && !timed {
        for i in 1..cands.len().min(1 + SINGLE_NODE_TRIALS) {
            if timed_out() {
                out.timed_out = true;
                break;
            }
            out.trials += 1;
            let set = &cands[i..=i];
            match holds(&base, set) {
                Err((_, why)) => {
                    alone.insert(
                        i,
                        Unconsolidatable::Simulation(format!(
                            "its pods do not all fit on the nodes that stay: {why}"
                        )),
                    );
                }
                Ok(()) => match worth_it(input, &totals, set, set[0].price) {
                    Err(why) => {
                        alone.insert(
                            i,
                            Unconsolidatable::NotWorthIt(format!("removing it: {why}")),
                        );
                    }
                    Ok(()) => {
                        single = Some(i);
                        break;
                    }
                },
            }
        }
    }
    for (i, c) in cands.iter().enumerate().skip(n) {
        if single == Some(i) {
            continue;
        }
        if let Some(why) = alone.remove(&i) {
            out.unconsolidatable.insert(c.c.node.name.clone(), why);
            continue;
        }
        if let Some((m, why)) = &not_worth {
            if *m == n + 1 {
                out.unconsolidatable.insert(
                    c.c.node.name.clone(),
                    Unconsolidatable::NotWorthIt(if n == 0 {
                        format!("removing it: {why}")
                    } else {
                        format!("removing it with the {n} candidate(s) ahead of it: {why}")
                    }),
                );
                continue;
            }
        }
        let why = match &first_failure {
            Some((node, why)) if *node == c.c.node.name => format!("its pods do not all fit on the nodes that stay: {why}"),
            _ if n == 0 => "its pods do not all fit on the nodes that stay".to_string(),
            _ => format!(
                "its pods do not fit on the nodes that stay once the {n} candidate(s) with more savings over disruption go"
            ),
        };
        let why = if out.timed_out && n < cands.len() {
            format!("{why} (or the search's time limit, consolidation.timeout, ran out first)")
        } else {
            why
        };
        out.unconsolidatable
            .insert(c.c.node.name.clone(), Unconsolidatable::Simulation(why));
    }
    let set = match single {
        Some(i) => &cands[i..=i],
        None => &cands[..n],
    };
    if !set.is_empty() {
        let nodes: Vec<Consolidated> = set.iter().map(Cand::consolidated).collect();
        out.command = Some(Command {
            action: Action::Delete,
            savings_per_hour: nodes.iter().map(|c| c.price).sum(),
            nodes,
        });
    }
    out
}

/// A command decided a while ago checked against the cluster as it is now (Karpenter's
/// validation after `commandValidationDelay`): every node is still a candidate with the same pods
/// (churn), no pending pod is nominated to it or could run on it, the budgets still allow the
/// set, and the set's pods still fit on the nodes that stay. `Err`: the first node that fails,
/// and why.
///
/// A replace is checked so twice: before its launch with [`revalidate_launch`], and once its
/// new node is Ready with this (the new node is then one of the nodes that stay, as it really
/// is); both count the nodes as `Replace` for the budgets.
pub fn revalidate(
    command: &Command,
    input: &ConsolidationInput,
) -> Result<(), (String, Unconsolidatable)> {
    revalidate_with(command, input, None)
}

/// A replace decided a while ago checked before its new node is asked for: as [`revalidate`],
/// with `option`'s new node among the nodes that stay (and taking some of the pods, and
/// cheaper than the nodes it replaces).
pub fn revalidate_launch(
    command: &Command,
    input: &ConsolidationInput,
    option: &ReplaceOption,
) -> Result<(), (String, Unconsolidatable)> {
    revalidate_with(command, input, Some(option))
}

fn revalidate_with(
    command: &Command,
    input: &ConsolidationInput,
    option: Option<&ReplaceOption>,
) -> Result<(), (String, Unconsolidatable)> {
    let mut why = BTreeMap::new();
    let (cands, l, totals) = survey(input, &mut why);
    let replacing = matches!(command.action, Action::Replace { .. });
    let mut set = Vec::new();
    let mut cands: Vec<Option<Cand>> = cands.into_iter().map(Some).collect();
    for planned in &command.nodes {
        let at = cands
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.c.node.name == planned.node));
        let Some(c) = at.and_then(|i| cands[i].take()) else {
            let reason = why.remove(&planned.node).unwrap_or_else(|| {
                Unconsolidatable::Blocked(
                    "no longer a candidate (gone, not Ready, cordoned, or being removed)".into(),
                )
            });
            return Err((planned.node.clone(), reason));
        };
        let now: HashSet<String> = c
            .pods
            .iter()
            .map(|p| p.uid.clone().unwrap_or_else(|| p.key()))
            .collect();
        let then: HashSet<String> = planned.pods.iter().cloned().collect();
        if now != then {
            return Err((
                planned.node.clone(),
                Unconsolidatable::Blocked("its pods changed since the decision".into()),
            ));
        }
        let mut c = c;
        if replacing {
            c.reason = DisruptionReason::Replace;
        }
        set.push(c);
    }
    let mut refused = BTreeMap::new();
    let kept = within_limits(input, set, &mut refused);
    if let Some((node, why)) = refused.into_iter().next() {
        return Err((node, why));
    }
    // A failure of the set as a whole is told on its first node.
    let first = command
        .nodes
        .first()
        .map(|n| n.node.clone())
        .unwrap_or_default();
    // `Balanced` scores the move again on today's totals: before a launch (what the new node
    // would save) and for a delete; once a replace's new node is up, removing the nodes it
    // replaces is what saves, so that is not scored again.
    let savings = kept.iter().map(|c| c.price).sum::<f64>() - option.map_or(0.0, |o| o.price);
    if option.is_some() || !replacing {
        if let Err(why) = worth_it(input, &totals, &kept, savings) {
            return Err((first, Unconsolidatable::NotWorthIt(why)));
        }
    }
    if let Some(opt) = option {
        let name = input
            .down
            .groups
            .get(opt.group)
            .map_or("?", |g| g.name.as_str());
        let room = room_with(&l, Some(&opt.template), name);
        let bare = bare_nodes(&room, &l.elsewhere, &input.down);
        let base = base_sim(room, &l, &bare, input);
        return replaces(&base, &kept, opt).map_err(|why| {
            (
                first,
                Unconsolidatable::Simulation(format!(
                    "a new node of {name} no longer replaces them: {why}"
                )),
            )
        });
    }
    let room = room_with(&l, None, "");
    let bare = bare_nodes(&room, &l.elsewhere, &input.down);
    let base = base_sim(room, &l, &bare, input);
    holds(&base, &kept).map_err(|(node, why)| {
        (
            node,
            Unconsolidatable::Simulation(format!(
                "its pods no longer all fit on the nodes that stay: {why}"
            )),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Budget, BudgetNodes};
    use crate::node_groups::Backing;
    use crate::pods::index::PodIndex;
    use crate::pods::topology::NamespaceLabels;
    use crate::pods::unneeded::DownGroup;
    use crate::pods::volumes::Volumes;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use serde_json::{json, Value};
    use std::time::Duration;

    const SUB: &str = "00000000-0000-0000-0000-000000000000";

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

    /// A ReplicaSet's pod on `node` (none: pending) with `meta` merged into its metadata and
    /// `status` as its status.
    fn pod_with(
        name: &str,
        node: Option<&str>,
        cpu: &str,
        meta: Value,
        status: Value,
    ) -> Arc<PodRecord> {
        let mut m = json!({"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]});
        for (k, v) in meta.as_object().unwrap() {
            m[k] = v.clone();
        }
        let mut spec =
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        if let Some(p) = m.get("priority").cloned() {
            spec["priority"] = p;
            m.as_object_mut().unwrap().remove("priority");
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({"metadata": m, "spec": spec, "status": status})).unwrap(),
        ))
    }

    fn pod(name: &str, node: &str, cpu: &str) -> Arc<PodRecord> {
        pod_with(
            name,
            Some(node),
            cpu,
            json!({}),
            json!({"phase": "Running"}),
        )
    }

    fn group(name: &str, size: i64) -> DownGroup {
        DownGroup {
            name: name.into(),
            backing: Backing::ScaleSet {
                resource_group: "rg".into(),
                name: name.into(),
            },
            floor: 0,
            size: Some(size),
            deleting: 0,
            recently_grown: false,
            grown_ago: None,
            refused: None,
        }
    }

    fn everything() -> Vec<Budget> {
        vec![Budget {
            nodes: BudgetNodes::Percent(100),
            reasons: None,
            schedule: None,
        }]
    }

    fn on() -> ConsolidationSettings {
        ConsolidationSettings {
            enabled: true,
            budgets: everything(),
            ..Default::default()
        }
    }

    struct World {
        groups: Vec<DownGroup>,
        nodes: Vec<Arc<NodeRecord>>,
        pods: PodIndex,
        pdbs: Vec<Arc<PodDisruptionBudget>>,
        prices: Vec<f64>,
        settings: ConsolidationSettings,
        unsettled: HashSet<String>,
        demand_rising: bool,
        ripe: Option<HashSet<String>>,
        now: k8s_openapi::jiff::Timestamp,
    }

    impl World {
        fn new(
            groups: Vec<DownGroup>,
            prices: Vec<f64>,
            nodes: Vec<Arc<NodeRecord>>,
            pods: &[Arc<PodRecord>],
        ) -> Self {
            World {
                groups,
                nodes,
                pods: PodIndex::of(pods),
                pdbs: Vec::new(),
                prices,
                settings: on(),
                unsettled: HashSet::new(),
                demand_rising: false,
                ripe: None,
                now: k8s_openapi::jiff::Timestamp::now(),
            }
        }

        fn with<T>(&self, f: impl FnOnce(&ConsolidationInput) -> T) -> T {
            let none = HashSet::new();
            let input = ConsolidationInput {
                down: DownInput {
                    now: self.now,
                    groups: &self.groups,
                    nodes: &self.nodes,
                    pods: &self.pods,
                    pdbs: &self.pdbs,
                    threshold: 0.5,
                    busy: &none,
                    unready: &none,
                    previously: &none,
                    non_empty_candidates: 30,
                    volumes: Volumes::none(),
                    namespaces: NamespaceLabels::none(),
                    keep_jobs: self.settings.keeps_jobs(),
                },
                prices: &self.prices,
                chosen: &none,
                unsettled: &self.unsettled,
                ripe: self.ripe.as_ref(),
                settings: &self.settings,
                max_nodes: 10,
                demand_rising: self.demand_rising,
            };
            f(&input)
        }

        fn run(&self) -> Consolidation {
            self.with(|i| consolidate(i, &mut || false))
        }
    }

    /// Why `node` is not consolidated, or nothing.
    fn reason(c: &Consolidation, node: &str) -> String {
        c.unconsolidatable
            .get(node)
            .map(|w| w.to_string())
            .unwrap_or_default()
    }

    fn gone(c: &Consolidation) -> Vec<&str> {
        c.command
            .iter()
            .flat_map(|c| c.nodes.iter().map(|n| n.node.as_str()))
            .collect()
    }

    #[test]
    fn the_prefix_search_finds_the_largest_valid_prefix_in_few_trials() {
        let (best, timed, trials) = prefix_search(100, |n| n <= 37, &mut || false);
        assert_eq!(best, Some(37));
        assert!(!timed);
        assert!(trials <= 7, "{trials} trials for 100 candidates");
        assert_eq!(prefix_search(5, |_| false, &mut || false).0, None);
        assert_eq!(prefix_search(5, |_| true, &mut || false).0, Some(5));
        assert_eq!(prefix_search(0, |_| true, &mut || false).0, None);
    }

    #[test]
    fn when_the_time_limit_runs_out_the_last_valid_answer_stands() {
        // Trials: 50 (valid), 75 (invalid), then time is up.
        let mut asked = 0;
        let mut clock = || {
            asked += 1;
            asked > 2
        };
        let (best, timed, trials) = prefix_search(100, |n| n <= 60, &mut clock);
        assert_eq!((best, timed, trials), (Some(50), true, 2));
        // Out of time before any trial: no answer.
        assert_eq!(prefix_search(100, |_| true, &mut || true), (None, true, 0));
    }

    #[test]
    fn a_pods_eviction_cost_and_a_nodes_disruption_cost_are_karpenters() {
        let plain = pod("a", "n", "1");
        assert_eq!(eviction_cost(&plain), 1.0);
        let dear = pod_with(
            "b",
            Some("n"),
            "1",
            json!({"annotations": {"controller.kubernetes.io/pod-deletion-cost": "134217728"}}),
            json!({}),
        );
        assert_eq!(eviction_cost(&dear), 2.0);
        let important = pod_with(
            "c",
            Some("n"),
            "1",
            json!({"priority": 2_000_000_000}),
            json!({}),
        );
        assert_eq!(eviction_cost(&important), 10.0, "clamped");
        let cheap = pod_with(
            "d",
            Some("n"),
            "1",
            json!({"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-2147483648"}}),
            json!({}),
        );
        assert_eq!(eviction_cost(&cheap), -10.0, "clamped");
        // 1 + 1 + 2 + 10 + max(0, -10).
        assert_eq!(node_cost(&[plain, dear, important, cheap]), 14.0);
    }

    #[test]
    fn candidates_are_sorted_by_price_saved_over_disruption() {
        // `c` (an unmanaged group) has room for one 1-cpu pod only.
        let nodes = vec![
            node("a", "cheap", 0, "4"),
            node("b", "dear", 0, "4"),
            node("c", "other", 0, "4"),
        ];
        let pods = [
            pod("pa", "a", "1"),
            pod("pb", "b", "1"),
            pod("pc", "c", "2500m"),
        ];
        let groups = vec![group("cheap", 1), group("dear", 1)];
        // Same disruption: the dearer node goes.
        let w = World::new(groups.clone(), vec![0.3, 1.0], nodes.clone(), &pods);
        let c = w.run();
        assert_eq!(gone(&c), ["b"]);
        assert_eq!(c.command.as_ref().unwrap().savings_per_hour, 1.0);
        assert!(
            matches!(
                c.unconsolidatable.get("a"),
                Some(Unconsolidatable::Simulation(_))
            ),
            "{c:?}"
        );
        // b's pod is costly to disrupt (priority): 1.0 / 11 < 0.3 / 2, so a goes.
        let pods = [
            pod("pa", "a", "1"),
            pod_with(
                "pb",
                Some("b"),
                "1",
                json!({"priority": 2_000_000_000}),
                json!({"phase": "Running"}),
            ),
            pod("pc", "c", "2500m"),
        ];
        let w = World::new(groups, vec![0.3, 1.0], nodes, &pods);
        assert_eq!(gone(&w.run()), ["a"]);
    }

    #[test]
    fn several_nodes_go_together_only_when_all_their_pods_fit_on_the_nodes_that_stay() {
        let nodes: Vec<_> = (0..4)
            .map(|i| node(&format!("n{i}"), "dear", i, "4"))
            .collect();
        // n0..n2 hold 1 cpu each, n3 holds 1 cpu: n3 can take three more, so three go.
        let pods: Vec<_> = (0..4)
            .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "1"))
            .collect();
        let w = World::new(vec![group("dear", 4)], vec![1.0], nodes.clone(), &pods);
        let c = w.run();
        assert_eq!(gone(&c).len(), 3, "{c:?}");
        assert_eq!(c.command.as_ref().unwrap().savings_per_hour, 3.0);
        // With 2.5 cpu on each, no two nodes' pods fit on the others together (one at a time,
        // each would): one goes.
        let pods: Vec<_> = (0..4)
            .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "1500m"))
            .collect();
        let w = World::new(vec![group("dear", 4)], vec![1.0], nodes, &pods);
        let c = w.run();
        assert_eq!(gone(&c).len(), 2, "{c:?}");
    }

    #[test]
    fn balanced_scores_a_move_as_karpenter_does_and_approves_at_one_half() {
        // Karpenter's RFC pool: $58.08 a day, disruption 90 (10 nodes, 80 pods).
        let t = GroupTotals {
            cost: 58.08,
            disruption: 90.0,
        };
        // An oversized node: 7.26 saved for 4 of disruption.
        let s = score_move(7.26, 4.0, t);
        assert!((s - (7.26 / 58.08) / (4.0 / 90.0)).abs() < 1e-9, "{s}");
        assert!(balanced_approves(s));
        // A marginal move: 2.42 saved for 9 (0.42): refused; a well-packed node saving nothing too.
        assert!(!balanced_approves(score_move(2.42, 9.0, t)));
        assert_eq!(score_move(0.0, 11.0, t), 0.0);
        // Disrupting nothing while saving something always goes; a group that costs nothing never.
        assert!(score_move(4.84, 0.0, t).is_infinite());
        assert!(!balanced_approves(score_move(
            4.84,
            5.0,
            GroupTotals {
                cost: 0.0,
                disruption: 90.0
            }
        )));
        // Scale-free: ten times the pool, the same score.
        let ten = GroupTotals {
            cost: 580.8,
            disruption: 900.0,
        };
        assert!((score_move(72.6, 40.0, ten) - s).abs() < 1e-9);
    }

    /// n0: ten small pods (1.5 cpu, disruption 11); n1 and n2 nearly full with one pod each
    /// (disruption 2 each); all 8 cpu at $1/h: only n0's pods can move (onto n1 and n2 together).
    fn one_busy_underused_node() -> (Vec<Arc<NodeRecord>>, Vec<Arc<PodRecord>>) {
        let nodes: Vec<_> = (0..3)
            .map(|i| node(&format!("n{i}"), "g", i, "8"))
            .collect();
        let mut pods: Vec<_> = (0..10)
            .map(|i| pod(&format!("small{i}"), "n0", "150m"))
            .collect();
        pods.push(pod("big1", "n1", "7"));
        pods.push(pod("big2", "n2", "6600m"));
        (nodes, pods)
    }

    #[test]
    fn a_node_whose_pods_can_move_goes_alone_though_the_first_candidate_cannot() {
        let (nodes, pods) = one_busy_underused_node();
        let w = World::new(vec![group("g", 3)], vec![1.0], nodes, &pods);
        let c = w.run();
        // n1 and n2 come first (most saved per disruption) and cannot go; n0 is tried alone.
        assert_eq!(gone(&c), vec!["n0"], "{c:?}");
        assert!(matches!(
            c.unconsolidatable.get("n1"),
            Some(Unconsolidatable::Simulation(_))
        ));
    }

    #[test]
    fn when_the_time_limit_runs_out_before_the_single_node_trials_nothing_goes_and_the_reason_says_so(
    ) {
        let (nodes, pods) = one_busy_underused_node();
        let w = World::new(vec![group("g", 3)], vec![1.0], nodes, &pods);
        // The prefix search asks twice (three candidates); the limit runs out at the third ask,
        // before the first node is tried alone.
        let mut asked = 0;
        let c = w.with(|i| {
            consolidate(i, &mut || {
                asked += 1;
                asked > 2
            })
        });
        assert!(c.command.is_none(), "{c:?}");
        assert!(c.timed_out);
        let why = c.unconsolidatable.get("n0").map(ToString::to_string);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("consolidation.timeout")),
            "{why:?}"
        );
    }

    #[test]
    fn balanced_keeps_a_node_whose_removal_saves_too_little_for_its_disruption_and_takes_an_empty_one(
    ) {
        let (nodes, pods) = one_busy_underused_node();
        let mut w = World::new(vec![group("g", 3)], vec![1.0], nodes.clone(), &pods);
        w.settings.policy = ConsolidationPolicy::Balanced;
        let c = w.run();
        // n0 saves 1/3 of the group's cost for 11/15 of its disruption: 0.45, under one half.
        assert!(c.command.is_none(), "{c:?}");
        match c.unconsolidatable.get("n0") {
            Some(why @ Unconsolidatable::NotWorthIt(text)) => {
                assert!(text.contains("a score of 0.45"), "{text}");
                assert_eq!(why.label(), "balanced");
            }
            other => panic!("{other:?}"),
        }
        // An empty fourth node (disruption 1) saves 1/4 for 1/16: it goes.
        let mut nodes = nodes;
        nodes.push(node("n3", "g", 3, "8"));
        let mut w = World::new(vec![group("g", 4)], vec![1.0], nodes, &pods);
        w.settings.policy = ConsolidationPolicy::Balanced;
        let c = w.run();
        assert_eq!(gone(&c), vec!["n3"], "{c:?}");
    }

    #[test]
    fn a_jobs_running_pod_keeps_its_node_unless_disrupt_jobs_says_consolidation_may_evict_it() {
        let job_pod = pod_with(
            "j",
            Some("a"),
            "1",
            json!({"labels": {"job-name": "nightly"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "nightly", "uid": "j", "controller": true}]}),
            json!({"phase": "Running"}),
        );
        assert!(crate::pods::scale_down::runs_to_completion(&job_pod));
        assert!(!crate::pods::scale_down::runs_to_completion(&pod(
            "q", "a", "1"
        )));
        let nodes = vec![node("a", "dear", 0, "4"), node("b", "dear", 1, "4")];
        let pods = [job_pod, pod("q", "b", "2")];
        // By default: the Job's node stays, and says why; a Deployment's pod would move.
        let w = World::new(vec![group("dear", 2)], vec![1.0], nodes.clone(), &pods);
        let c = w.run();
        assert!(!gone(&c).contains(&"a"), "{c:?}");
        let why = reason(&c, "a");
        assert!(
            why.contains("default/j runs to completion") && why.contains("disruptJobs"),
            "{why}"
        );
        // With disruptJobs, Karpenter's behaviour: the node with least to move goes.
        let mut w = World::new(vec![group("dear", 2)], vec![1.0], nodes, &pods);
        w.settings.disrupt_jobs = true;
        assert_eq!(gone(&w.run()), ["a"]);
    }

    #[test]
    fn do_not_disrupt_and_safe_to_evict_false_keep_their_node() {
        let now = k8s_openapi::jiff::Timestamp::now();
        let started = |h: i64| json!({"phase": "Running", "startTime": now.checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(h)).unwrap().to_string()});
        let annotated = |v: &str, hours: i64| {
            pod_with(
                "p",
                Some("a"),
                "1",
                json!({"annotations": {"karpenter.sh/do-not-disrupt": v}}),
                started(hours),
            )
        };
        assert!(do_not_disrupt(&annotated("true", 1), now));
        assert!(
            do_not_disrupt(&annotated("4h", 1), now),
            "within 4h of its start"
        );
        assert!(
            !do_not_disrupt(&annotated("4h", 5), now),
            "4h past its start"
        );
        assert!(
            do_not_disrupt(&annotated("soon", 5), now),
            "a typo protects"
        );
        assert!(!do_not_disrupt(&annotated("false", 1), now));
        assert!(!do_not_disrupt(&pod("q", "a", "1"), now));
        let nodes = vec![node("a", "dear", 0, "4"), node("b", "dear", 1, "4")];
        let cases = [
            (annotated("true", 1), "karpenter.sh/do-not-disrupt"),
            (
                pod_with(
                    "p",
                    Some("a"),
                    "1",
                    json!({"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}}),
                    json!({}),
                ),
                "safe-to-evict=false",
            ),
        ];
        for (p, words) in cases {
            let w = World::new(
                vec![group("dear", 2)],
                vec![1.0],
                nodes.clone(),
                &[p, pod("q", "b", "3")],
            );
            let c = w.run();
            assert!(!gone(&c).contains(&"a"), "{c:?}");
            let why = reason(&c, "a");
            assert!(why.contains(words), "{why}");
        }
        // The node annotated itself.
        let mut marked = (*nodes[0]).clone();
        marked
            .annotations
            .insert(DO_NOT_DISRUPT.into(), "true".into());
        let w = World::new(
            vec![group("dear", 2)],
            vec![1.0],
            vec![Arc::new(marked), nodes[1].clone()],
            &[pod("p", "a", "1")],
        );
        assert_eq!(gone(&w.run()), ["b"], "only the empty node");
    }

    #[test]
    fn budgets_floors_and_consolidate_after_bound_the_set() {
        let nodes: Vec<_> = (0..5)
            .map(|i| node(&format!("n{i}"), "dear", i, "4"))
            .collect();
        let pods: Vec<_> = (0..5)
            .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "500m"))
            .collect();
        let mut w = World::new(vec![group("dear", 5)], vec![1.0], nodes, &pods);
        assert_eq!(gone(&w.run()).len(), 4);
        // Karpenter's default, 10% of 5 rounded up: one node.
        w.settings.budgets = crate::config::default_budgets();
        let c = w.run();
        assert_eq!(gone(&c).len(), 1);
        assert!(
            matches!(
                c.unconsolidatable.values().next(),
                Some(Unconsolidatable::Budget(_))
            ),
            "{c:?}"
        );
        // A budget for empty nodes only does not bound these.
        w.settings.budgets = vec![Budget {
            nodes: BudgetNodes::Count(0),
            reasons: Some(vec![DisruptionReason::Empty]),
            schedule: None,
        }];
        assert_eq!(gone(&w.run()).len(), 4);
        // The cluster-wide one does; the most restrictive wins.
        w.settings.cluster_budgets = vec![Budget {
            nodes: BudgetNodes::Count(2),
            reasons: None,
            schedule: None,
        }];
        assert_eq!(gone(&w.run()).len(), 2);
        w.settings.cluster_budgets.clear();
        // The floor counts deletions under way.
        w.groups[0].floor = 2;
        w.groups[0].deleting = 1;
        assert_eq!(gone(&w.run()).len(), 2);
        w.groups[0].floor = 0;
        w.groups[0].deleting = 0;
        // Nodes whose pods changed within consolidateAfter wait.
        w.unsettled = ["n0", "n1", "n2"].iter().map(|s| s.to_string()).collect();
        let c = w.run();
        assert_eq!(gone(&c), ["n3", "n4"]);
        assert_eq!(
            c.unconsolidatable.get("n0"),
            Some(&Unconsolidatable::Recent)
        );
    }

    /// Three nodes of one group: n0 and n1 hold a 1-cpu pod each, n2 is empty.
    fn two_busy_and_one_empty() -> World {
        let nodes: Vec<_> = (0..3)
            .map(|i| node(&format!("n{i}"), "dear", i, "4"))
            .collect();
        let pods: Vec<_> = (0..2)
            .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "1"))
            .collect();
        World::new(vec![group("dear", 3)], vec![1.0], nodes, &pods)
    }

    #[test]
    fn a_scale_up_holds_consolidation_only_for_its_own_delay_after_add() {
        let mut w = two_busy_and_one_empty();
        // The group grew a minute ago, and scale-down is held (cluster-autoscaler's 10 min);
        // consolidation, as Karpenter's, is not held by default.
        w.groups[0].grown_ago = Some(Duration::from_secs(60));
        w.groups[0].recently_grown = true;
        assert_eq!(w.settings.delay_after_add, Duration::ZERO);
        assert_eq!(gone(&w.run()).len(), 2);
        // With consolidation.delayAfterAdd at 10 min every node waits, for that reason.
        w.settings.delay_after_add = Duration::from_secs(600);
        let c = w.run();
        assert!(gone(&c).is_empty(), "{c:?}");
        for n in ["n0", "n1", "n2"] {
            assert!(
                matches!(c.unconsolidatable.get(n), Some(Unconsolidatable::Group(why)) if why.contains("consolidation.delayAfterAdd")),
                "{n}: {:?}",
                c.unconsolidatable.get(n)
            );
        }
        // Once the growth is older than the delay, they go.
        w.groups[0].grown_ago = Some(Duration::from_secs(601));
        assert_eq!(gone(&w.run()).len(), 2);
    }

    #[test]
    fn while_demand_rises_a_node_whose_pods_would_move_waits_and_an_empty_node_still_goes() {
        let mut w = two_busy_and_one_empty();
        let command = w.run().command.expect("a command while demand is flat");
        assert_eq!(
            command.nodes.len(),
            2,
            "an empty node and one whose pod moves"
        );
        w.demand_rising = true;
        let c = w.run();
        assert_eq!(gone(&c), ["n2"], "only the empty node goes");
        for n in ["n0", "n1"] {
            assert_eq!(
                c.unconsolidatable.get(n),
                Some(&Unconsolidatable::DemandRising)
            );
        }
        assert!(Unconsolidatable::DemandRising
            .to_string()
            .contains("stabilizationWindow"));
        // A command decided while demand was flat does not survive a rise before it acts.
        let (node, why) = w.with(|i| revalidate(&command, i)).unwrap_err();
        assert_eq!(why, Unconsolidatable::DemandRising, "{node}");
    }

    #[test]
    fn with_empty_first_a_node_whose_pods_would_move_waits_until_it_is_ripe_and_stays_in_the_drain_order(
    ) {
        let mut w = two_busy_and_one_empty();
        w.ripe = Some(HashSet::new());
        let c = w.run();
        assert_eq!(gone(&c), ["n2"], "only the empty node goes");
        let mut order = c.drain_order.clone();
        order.sort();
        assert_eq!(
            order,
            ["n0", "n1"],
            "the unripe still lead the hints; the empty node needs none"
        );
        for n in ["n0", "n1"] {
            assert_eq!(c.unconsolidatable.get(n), Some(&Unconsolidatable::Emptying));
        }
        assert_eq!(Unconsolidatable::Emptying.label(), "emptying");
        w.ripe = Some(["n0".to_string(), "n1".to_string()].into());
        let c = w.run();
        assert_eq!(c.command.map(|c| c.nodes.len()), Some(2), "ripe: moved");
    }

    #[test]
    fn a_decision_is_revalidated_against_the_cluster_as_it_is_later() {
        let nodes: Vec<_> = (0..3)
            .map(|i| node(&format!("n{i}"), "dear", i, "4"))
            .collect();
        let pods: Vec<_> = (0..3)
            .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "1"))
            .collect();
        let w = World::new(vec![group("dear", 3)], vec![1.0], nodes.clone(), &pods);
        let command = w.run().command.expect("a command");
        assert_eq!(command.nodes.len(), 2);
        let first = command.nodes[0].node.clone();
        assert_eq!(w.with(|i| revalidate(&command, i)), Ok(()));
        // Churn: a pod landed on a candidate.
        let mut more = pods.clone();
        more.push(pod("late", &first, "100m"));
        let w2 = World::new(vec![group("dear", 3)], vec![1.0], nodes.clone(), &more);
        let (node, why) = w2.with(|i| revalidate(&command, i)).unwrap_err();
        assert_eq!(node, first);
        assert!(why.to_string().contains("changed"), "{why}");
        // A pending pod nominated to a candidate.
        let mut more = pods.clone();
        more.push(pod_with(
            "preemptor",
            None,
            "1",
            json!({}),
            json!({"phase": "Pending", "nominatedNodeName": first}),
        ));
        let w2 = World::new(vec![group("dear", 3)], vec![1.0], nodes.clone(), &more);
        let (_, why) = w2.with(|i| revalidate(&command, i)).unwrap_err();
        assert!(matches!(why, Unconsolidatable::Nominated(_)), "{why:?}");
        // A new pending pod that could run on a candidate.
        let mut more = pods.clone();
        more.push(pod_with("new", None, "1", json!({}), json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})));
        let w2 = World::new(vec![group("dear", 3)], vec![1.0], nodes.clone(), &more);
        let (_, why) = w2.with(|i| revalidate(&command, i)).unwrap_err();
        assert!(matches!(why, Unconsolidatable::PendingFits(_)), "{why:?}");
        // The budget no longer allows it: a deletion started meanwhile.
        let mut w2 = World::new(vec![group("dear", 3)], vec![1.0], nodes.clone(), &pods);
        w2.settings.budgets = vec![Budget {
            nodes: BudgetNodes::Count(2),
            reasons: None,
            schedule: None,
        }];
        w2.groups[0].deleting = 1;
        let (_, why) = w2.with(|i| revalidate(&command, i)).unwrap_err();
        assert!(matches!(why, Unconsolidatable::Budget(_)), "{why:?}");
        // The simulation no longer holds: the node that stays filled up.
        let mut full = pods.clone();
        let stays = (0..3)
            .map(|i| format!("n{i}"))
            .find(|n| command.nodes.iter().all(|c| c.node != *n))
            .unwrap();
        full.push(pod("filler", &stays, "2500m"));
        let w2 = World::new(vec![group("dear", 3)], vec![1.0], nodes, &full);
        let (_, why) = w2.with(|i| revalidate(&command, i)).unwrap_err();
        assert!(matches!(why, Unconsolidatable::Simulation(_)), "{why:?}");
    }

    /// A node of group `vmss` with `labels` added and `taints`.
    fn node_with(
        name: &str,
        vmss: &str,
        id: u32,
        cpu: &str,
        labels: Value,
        taints: Value,
    ) -> Arc<NodeRecord> {
        let mut l = json!({"kubernetes.io/hostname": name});
        for (k, v) in labels.as_object().unwrap() {
            l[k] = v.clone();
        }
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "resourceVersion": "7", "labels": l},
                "spec": {"taints": taints, "providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{id}")},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        ))
    }

    /// A running `web` pod on `node` with `extra` merged into its spec.
    fn pod_spec(name: &str, node: &str, cpu: &str, extra: Value) -> Arc<PodRecord> {
        let mut spec = json!({"nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
                "spec": spec,
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        ))
    }

    /// A new node of group 1 (`cheap`) as the planner would imagine it.
    fn option(cpu: &str, price: f64, labels: Value, taints: Value) -> ReplaceOption {
        let n = node_with("template-cheap", "cheap", 99, cpu, labels, taints);
        ReplaceOption {
            group: 1,
            template: NodeState::from_node(&n, std::iter::empty()),
            price,
        }
    }

    /// Two nodes of `dear` ($1/h each, 4 cpu) with one 3-cpu pod each (made by `pod`), which no
    /// delete can take (neither fits on the other), and an empty `cheap` group.
    fn two_dear(pod: impl Fn(&str, &str) -> Arc<PodRecord>) -> World {
        let nodes = vec![
            node_with(
                "d0",
                "dear",
                0,
                "4",
                json!({"topology.kubernetes.io/zone": "z1"}),
                json!([]),
            ),
            node_with(
                "d1",
                "dear",
                1,
                "4",
                json!({"topology.kubernetes.io/zone": "z1"}),
                json!([]),
            ),
        ];
        let pods = [pod("p0", "d0"), pod("p1", "d1")];
        World::new(
            vec![group("dear", 2), group("cheap", 0)],
            vec![1.0, 0.5],
            nodes,
            &pods,
        )
    }

    fn plain(name: &str, node: &str) -> Arc<PodRecord> {
        pod(name, node, "3")
    }

    fn z1() -> Value {
        json!({"topology.kubernetes.io/zone": "z1"})
    }

    #[test]
    fn two_dear_nodes_are_replaced_by_one_node_of_a_cheaper_group_that_takes_their_pods() {
        let w = two_dear(plain);
        // Neither can go by a delete.
        assert!(w.run().command.is_none());
        let opts = [option("8", 0.5, z1(), json!([]))];
        let c = w.with(|i| decide(i, &opts, &mut || false));
        let command = c.command.expect("a replace");
        assert_eq!(
            command.action,
            Action::Replace {
                group: 1,
                price: 0.5
            }
        );
        let mut gone: Vec<&str> = command.nodes.iter().map(|n| n.node.as_str()).collect();
        gone.sort();
        assert_eq!(gone, ["d0", "d1"]);
        assert!(command
            .nodes
            .iter()
            .all(|n| n.reason == DisruptionReason::Replace));
        assert_eq!(command.savings_per_hour, 1.5);
        // Re-validated before the launch: it holds; a pod landed on a candidate meanwhile: not.
        assert_eq!(w.with(|i| revalidate_launch(&command, i, &opts[0])), Ok(()));
        let mut late = two_dear(plain);
        late.pods = PodIndex::of(&[
            plain("p0", "d0"),
            plain("p1", "d1"),
            pod("late", "d0", "100m"),
        ]);
        let (_, why) = late
            .with(|i| revalidate_launch(&command, i, &opts[0]))
            .unwrap_err();
        assert!(why.to_string().contains("changed"), "{why}");
        // Once the new node is Ready it is one of the nodes that stay: the command holds on it.
        let mut w2 = two_dear(plain);
        w2.nodes
            .push(node_with("c0", "cheap", 0, "8", z1(), json!([])));
        w2.groups[1].size = Some(1);
        assert_eq!(w2.with(|i| revalidate(&command, i)), Ok(()));
        // A new node too small for both pods (say another pod took its room): it does not.
        let mut w3 = two_dear(plain);
        w3.nodes
            .push(node_with("c0", "cheap", 0, "4", z1(), json!([])));
        let (_, why) = w3.with(|i| revalidate(&command, i)).unwrap_err();
        assert!(matches!(why, Unconsolidatable::Simulation(_)), "{why:?}");
    }

    #[test]
    fn a_delete_goes_before_a_replace_and_a_single_node_can_be_replaced() {
        // d0's pod fits on d1: a delete, even though a replace would also do.
        let nodes = vec![node("d0", "dear", 0, "4"), node("d1", "dear", 1, "4")];
        let pods = [pod("p0", "d0", "1"), pod("p1", "d1", "1")];
        let w = World::new(
            vec![group("dear", 2), group("cheap", 0)],
            vec![1.0, 0.1],
            nodes,
            &pods,
        );
        let opts = [option("8", 0.1, json!({}), json!([]))];
        let c = w.with(|i| decide(i, &opts, &mut || false));
        assert_eq!(c.command.unwrap().action, Action::Delete);
        // One dear node full of a 3.5-cpu pod, one unmanaged node full: one cheaper node
        // replaces the single dear node (Karpenter's single-node replace).
        let nodes = vec![node("d0", "dear", 0, "4"), node("o", "other", 0, "4")];
        let pods = [pod("p0", "d0", "3500m"), pod("q", "o", "3500m")];
        let w = World::new(
            vec![group("dear", 1), group("cheap", 0)],
            vec![1.0, 0.4],
            nodes,
            &pods,
        );
        let c = w.with(|i| decide(i, &[option("4", 0.4, json!({}), json!([]))], &mut || false));
        let command = c.command.expect("a single-node replace");
        assert_eq!(
            gone(&Consolidation {
                command: Some(command.clone()),
                ..Default::default()
            }),
            ["d0"]
        );
        assert!((command.savings_per_hour - 0.6).abs() < 1e-9);
    }

    #[test]
    fn a_replacement_its_pods_cannot_use_is_no_replacement_zone_taint_and_spread() {
        // Zone: the pods must run in z1; the cheaper group's nodes come up in z2.
        let zoned = |name: &str, node: &str| {
            pod_spec(
                name,
                node,
                "3",
                json!({"nodeSelector": {"topology.kubernetes.io/zone": "z1"}}),
            )
        };
        let w = two_dear(zoned);
        let opts = [option(
            "8",
            0.5,
            json!({"topology.kubernetes.io/zone": "z2"}),
            json!([]),
        )];
        let c = w.with(|i| decide(i, &opts, &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        let why = reason(&c, "d0");
        assert!(
            why.contains("no cheaper node group's new node replaces") && why.contains("cheap:"),
            "{why}"
        );
        // The same in z1 replaces them.
        let c = w.with(|i| decide(i, &[option("8", 0.5, z1(), json!([]))], &mut || false));
        assert!(c.command.is_some(), "{c:?}");

        // Taint: the cheaper group's nodes are tainted (spot), the pods do not tolerate it.
        let w = two_dear(plain);
        let spot = json!([{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}]);
        let c = w.with(|i| decide(i, &[option("8", 0.5, z1(), spot.clone())], &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        let why = reason(&c, "d1");
        assert!(why.contains("taint"), "{why}");
        // Pods that tolerate it move.
        let tolerant = |name: &str, node: &str| {
            pod_spec(
                name,
                node,
                "3",
                json!({"tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}]}),
            )
        };
        let w = two_dear(tolerant);
        let c = w.with(|i| decide(i, &[option("8", 0.5, z1(), spot)], &mut || false));
        assert!(c.command.is_some(), "{c:?}");

        // Spread: at most one web pod per zone more than any other zone; an unmanaged node in
        // z2 (full, no web pod) stays, so both pods on a new node in z1 would skew by 2.
        let spread = |name: &str, node: &str| {
            pod_spec(
                name,
                node,
                "1",
                json!({"topologySpreadConstraints": [{"maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}}}]}),
            )
        };
        let mut w = two_dear(spread);
        // d0 and d1 each hold a 2.5-cpu filler, so no delete works; the unmanaged node is full.
        w.nodes.push(node_with(
            "o",
            "other",
            0,
            "4",
            json!({"topology.kubernetes.io/zone": "z2"}),
            json!([]),
        ));
        let filler = |name: &str, node: &str, cpu: &str| {
            Arc::new(PodRecord::of(serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "filler"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "f", "uid": "f", "controller": true}]},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                "status": {"phase": "Running"},
            })).unwrap()))
        };
        w.pods = PodIndex::of(&[
            spread("p0", "d0"),
            spread("p1", "d1"),
            filler("f0", "d0", "2500m"),
            filler("f1", "d1", "2500m"),
            filler("q", "o", "3900m"),
        ]);
        assert!(w.run().command.is_none());
        // Room for everything on the new node, but not for the spread.
        let c = w.with(|i| decide(i, &[option("16", 0.5, z1(), json!([]))], &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        let why = reason(&c, "d0");
        assert!(
            why.contains("no cheaper node group's new node replaces"),
            "{why}"
        );
        // Without the constraint the same replace holds.
        let mut w2 = two_dear(|n, node| pod(n, node, "1"));
        w2.nodes = w.nodes.clone();
        w2.pods = PodIndex::of(&[
            pod("p0", "d0", "1"),
            pod("p1", "d1", "1"),
            filler("f0", "d0", "2500m"),
            filler("f1", "d1", "2500m"),
            filler("q", "o", "3900m"),
        ]);
        let c = w2.with(|i| decide(i, &[option("16", 0.5, z1(), json!([]))], &mut || false));
        assert!(c.command.is_some(), "{c:?}");
    }

    #[test]
    fn a_replacement_that_saves_nothing_is_not_made() {
        let w = two_dear(plain);
        // $2.5/h for one node against $2/h for the two it replaces.
        let c = w.with(|i| decide(i, &[option("8", 2.5, z1(), json!([]))], &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        let why = reason(&c, "d0");
        assert!(why.contains("not less than"), "{why}");
        // Equal is not cheaper either.
        let c = w.with(|i| decide(i, &[option("8", 2.0, z1(), json!([]))], &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        // A bigger node of the candidates' own group at their price is "delete the others".
        let own = ReplaceOption {
            group: 0,
            ..option("8", 1.0, z1(), json!([]))
        };
        let c = w.with(|i| decide(i, &[own], &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        // No group may grow: said so.
        let c = w.with(|i| decide(i, &[], &mut || false));
        let why = reason(&c, "d0");
        assert!(why.contains("may grow"), "{why}");
    }

    #[test]
    fn a_budget_for_replace_bounds_replaces_only() {
        let mut w = two_dear(plain);
        let opts = [option("8", 0.5, z1(), json!([]))];
        w.settings.budgets = vec![Budget {
            nodes: BudgetNodes::Count(0),
            reasons: Some(vec![DisruptionReason::Replace]),
            schedule: None,
        }];
        let c = w.with(|i| decide(i, &opts, &mut || false));
        assert!(c.command.is_none(), "{c:?}");
        let why = reason(&c, "d0");
        assert!(
            why.contains("reasons: [Replace]") && why.contains("not replaced"),
            "{why}"
        );
        // One node at a time for replaces: a single node cannot be replaced here (its pod and
        // the other's do not fit together elsewhere), so nothing.
        w.settings.budgets[0].nodes = BudgetNodes::Count(1);
        let c = w.with(|i| decide(i, &opts, &mut || false));
        assert!(
            c.command.as_ref().is_none_or(|c| c.nodes.len() == 1),
            "{c:?}"
        );
        // A budget for underutilized nodes does not bound a replace.
        w.settings.budgets = vec![Budget {
            nodes: BudgetNodes::Count(0),
            reasons: Some(vec![DisruptionReason::Underutilized]),
            schedule: None,
        }];
        let c = w.with(|i| decide(i, &opts, &mut || false));
        assert_eq!(c.command.map(|c| c.nodes.len()), Some(2));
        // Re-validation counts the set as Replace: a Replace budget spent meanwhile stops it.
        let mut w2 = two_dear(plain);
        let command = w2
            .with(|i| decide(i, &opts, &mut || false))
            .command
            .unwrap();
        w2.settings.budgets = vec![Budget {
            nodes: BudgetNodes::Count(1),
            reasons: Some(vec![DisruptionReason::Replace]),
            schedule: None,
        }];
        let (_, why) = w2
            .with(|i| revalidate_launch(&command, i, &opts[0]))
            .unwrap_err();
        assert!(matches!(why, Unconsolidatable::Budget(_)), "{why:?}");
    }
}
