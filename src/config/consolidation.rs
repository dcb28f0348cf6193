//! `consolidation:`: Karpenter's consolidation, adapted to node groups, as an opt-in beside
//! cluster-autoscaler's scale-down. Off by default, so today's policy (remove a node once it has
//! been under `scaleDown.utilizationThreshold` for `scaleDown.unneededTime`, one drain at a time)
//! stays what a cluster-autoscaler user gets. On, after the empty nodes and unneeded nodes of a
//! pass, several nodes whose pods all fit on the nodes that stay are removed at once, cheapest
//! disruption per dollar saved first, through scale-down's taint, drain and guarded delete.
//! Disruption budgets (`budgets`, `groupBudgets`, `clusterBudgets`) bound how many nodes it may
//! take at a time; the most restrictive one that applies wins.

use super::cron::{parse_budget_duration, CronSchedule};
use super::raw::{HumanDuration, RawBudget, RawConsolidation};
use super::{DemandKind, Problems};
use std::collections::BTreeMap;
use std::time::Duration;

/// `consolidation.policy`: which nodes consolidation may take (Karpenter's
/// `consolidationPolicy` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsolidationPolicy {
    /// Nodes that are empty (no pod that would have to move), or whose pods all fit elsewhere.
    #[default]
    WhenEmptyOrUnderutilized,
    /// Empty nodes only.
    WhenEmpty,
    /// Karpenter's `Balanced`: as `WhenEmptyOrUnderutilized`, but a move is made only when its
    /// share of its groups' cost saved is at least half its share of their disruption
    /// ([`BALANCED_K`]): a move that saves a little and evicts a lot is not made.
    Balanced,
}

/// Karpenter's `BalancedK`: a move's score (savings fraction over disruption fraction) must be
/// at least `1 / BALANCED_K`.
pub const BALANCED_K: f64 = 2.0;

/// Why a node is disrupted: what a budget's `reasons` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DisruptionReason {
    /// The node has no pod that would have to move.
    Empty,
    /// The node's pods move to the nodes that stay.
    Underutilized,
    /// The node goes with others of a dearer group once one new node of a cheaper group that
    /// takes their pods is Ready (consolidation's replace).
    Replace,
}

impl DisruptionReason {
    /// As written in `reasons` (Karpenter's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Replace => "Replace",
        }
    }
}

/// A budget's `nodes`: a count, or a percentage of the nodes it covers (rounded up, as
/// Karpenter rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetNodes {
    /// At most this many nodes disrupted at once.
    Count(u32),
    /// At most this percentage (0-100) of the nodes it covers.
    Percent(u32),
}

impl BudgetNodes {
    /// How many of `total` nodes may be disrupted at once.
    pub fn allowed(self, total: u32) -> u32 {
        match self {
            BudgetNodes::Count(n) => n,
            BudgetNodes::Percent(p) => {
                let scaled = u64::from(total) * u64::from(p);
                u32::try_from(scaled.div_ceil(100)).unwrap_or(u32::MAX)
            }
        }
    }
}

/// A budget's `schedule` and `duration`: when it is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetSchedule {
    /// `schedule`: cron (5 fields or a macro such as `@daily`), UTC.
    pub cron: CronSchedule,
    /// `duration`: how long each window lasts from a time the schedule fires.
    pub duration: Duration,
}

/// One disruption budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// `nodes`.
    pub nodes: BudgetNodes,
    /// `reasons`: the reasons it bounds; `None` (not given): every reason.
    pub reasons: Option<Vec<DisruptionReason>>,
    /// `schedule` and `duration`; `None`: always active.
    pub schedule: Option<BudgetSchedule>,
}

impl Budget {
    /// Whether it is active at `now` (Karpenter's `Budget.IsActive`): always without a schedule;
    /// with one, from each time it fires until `duration` later.
    pub fn active_at(&self, now: time::OffsetDateTime) -> bool {
        self.schedule
            .as_ref()
            .is_none_or(|s| s.cron.active(now, s.duration))
    }

    /// Whether it bounds disruptions for `reason`.
    pub fn applies_to(&self, reason: DisruptionReason) -> bool {
        self.reasons.as_ref().is_none_or(|r| r.contains(&reason))
    }

    /// How many nodes of `total` it lets be disrupted for `reason` at once (`None`: it does not
    /// bound that reason).
    pub fn allowed_for(&self, reason: DisruptionReason, total: u32) -> Option<u32> {
        self.applies_to(reason).then(|| self.nodes.allowed(total))
    }
}

/// Karpenter's default budget: `nodes: "10%"` of each NodePool (here: of each node group).
pub fn default_budgets() -> Vec<Budget> {
    vec![Budget {
        nodes: BudgetNodes::Percent(10),
        reasons: None,
        schedule: None,
    }]
}

/// Karpenter's `commandValidationDelay`.
pub const DEFAULT_VALIDATION_DELAY: Duration = Duration::from_secs(15);
/// Karpenter's `MultiNodeConsolidationTimeoutDuration`.
pub const DEFAULT_CONSOLIDATION_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest `consolidation.stabilizationWindow`: a day (a longer one would hold moves for
/// good in any cluster whose demand follows the day).
pub const MAX_STABILIZATION_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The most nodes `consolidation.deletionCostHints` may name.
pub const MAX_DELETION_COST_HINTS: u32 = 100;
/// Karpenter's cap on the candidates one multi-node search looks at.
pub const MAX_CONSOLIDATION_CANDIDATES: usize = 100;

/// `consolidation:`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsolidationSettings {
    /// `consolidation.enabled` (default false: cluster-autoscaler's policy alone).
    pub enabled: bool,
    /// `consolidation.policy` (`WhenEmptyOrUnderutilized`).
    pub policy: ConsolidationPolicy,
    /// `consolidation.consolidateAfter` (0 s, Karpenter's default): how long a node's pods must
    /// have been unchanged (no pod bound to it or gone from it) before it is a candidate.
    pub consolidate_after: Duration,
    /// `consolidation.validationDelay` (15 s): between a decision and its re-validation.
    pub validation_delay: Duration,
    /// `consolidation.timeout` (1 min): the multi-node search's time limit; when it runs out,
    /// the last valid answer is taken.
    pub timeout: Duration,
    /// `consolidation.budgets` (`[{nodes: "10%"}]`): each node group's budgets, unless
    /// `groupBudgets` names the group.
    pub budgets: Vec<Budget>,
    /// `consolidation.groupBudgets`: node-group name → its budgets (instead of `budgets`).
    pub group_budgets: BTreeMap<String, Vec<Budget>>,
    /// `consolidation.clusterBudgets` (none): budgets over every managed node together.
    pub cluster_budgets: Vec<Budget>,
    /// `consolidation.deletionCostHints` (0: off): the pods of this many of the best
    /// candidates get a `controller.kubernetes.io/pod-deletion-cost` below zero, so a
    /// Deployment's scale-in empties those nodes first ([`crate::pods::deletion_cost`]).
    pub deletion_cost_hints: u32,
    /// `consolidation.stabilizationWindow` (0 s: off): a node whose pods would have to move is
    /// consolidated only when the pods' requests have not risen within this window
    /// ([`crate::pods::stabilization`]); empty nodes are not held.
    pub stabilization_window: Duration,
    /// `consolidation.emptyFirst` (0 s: off; needs `deletionCostHints`): a node whose pods
    /// would have to move is consolidated only once it has been among the hinted nodes (its
    /// pods' deletion cost lowered, the node soft-tainted) this long, so a scale-in or the
    /// pods' own end can empty it without an eviction first.
    pub empty_first: Duration,
    /// `consolidation.delayAfterAdd` (0 s: Karpenter's consolidation has no such hold): how
    /// long after a scale-up consolidation leaves the nodes alone: of the group that grew, or of
    /// every group unless `scaleDown.delayTypeLocal`, as `scaleDown.delayAfterAdd` holds
    /// cluster-autoscaler's scale-down (10 min). The pending pods that a node could take hold it
    /// without this.
    pub delay_after_add: Duration,
    /// `consolidation.disruptJobs` (false): whether consolidation may evict a pod that runs to
    /// completion (its controller a Job). Off, a node running one is left until the pod ends:
    /// an evicted Job pod starts its work again from the beginning, so moving it costs the
    /// hours it ran, and a Job evicted more than its `backoffLimit` fails (Karpenter evicts
    /// them, kubernetes-sigs/karpenter#701; `true` is its behaviour). With consolidation on,
    /// the scale-down of underused nodes waits for them too ([`Self::keeps_jobs`]): one
    /// controller does not evict for cost what it promised to wait for. With consolidation off,
    /// that scale-down drains them as cluster-autoscaler does.
    pub disrupt_jobs: bool,
}

impl Default for ConsolidationSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            policy: ConsolidationPolicy::default(),
            consolidate_after: Duration::ZERO,
            validation_delay: DEFAULT_VALIDATION_DELAY,
            timeout: DEFAULT_CONSOLIDATION_TIMEOUT,
            budgets: default_budgets(),
            group_budgets: BTreeMap::new(),
            cluster_budgets: Vec::new(),
            deletion_cost_hints: 0,
            stabilization_window: Duration::ZERO,
            empty_first: Duration::ZERO,
            delay_after_add: Duration::ZERO,
            disrupt_jobs: false,
        }
    }
}

impl ConsolidationSettings {
    /// Whether a node running a Job's pod stays until the pod ends, for consolidation and
    /// for the scale-down of underused nodes: consolidation on, `disruptJobs: false`.
    pub fn keeps_jobs(&self) -> bool {
        self.enabled && !self.disrupt_jobs
    }

    /// The budgets of node group `group`.
    pub fn budgets_of(&self, group: &str) -> &[Budget] {
        self.group_budgets.get(group).unwrap_or(&self.budgets)
    }

    /// These settings with only the budgets active at `now` (UTC, from the caller's clock):
    /// what a decision at `now` counts. Every active budget bounds the decision, so the most
    /// restrictive one wins; an inactive one bounds nothing, and a group (or the cluster) none
    /// of whose budgets is active is bounded by none, as in Karpenter.
    pub fn active_at(&self, now: time::OffsetDateTime) -> ConsolidationSettings {
        let keep = |b: &Vec<Budget>| -> Vec<Budget> {
            b.iter().filter(|b| b.active_at(now)).cloned().collect()
        };
        ConsolidationSettings {
            budgets: keep(&self.budgets),
            group_budgets: self
                .group_budgets
                .iter()
                .map(|(g, b)| (g.clone(), keep(b)))
                .collect(),
            cluster_budgets: keep(&self.cluster_budgets),
            ..self.clone()
        }
    }
}

/// `nodes` as Karpenter validates it: `^((100|[0-9]{1,2})%|[0-9]+)$`.
pub fn parse_budget_nodes(text: &str) -> Result<BudgetNodes, String> {
    let t = text.trim();
    let bad = || {
        format!("{text:?} is neither a count (\"3\") nor a percentage from 0% to 100% (\"10%\")")
    };
    if let Some(p) = t.strip_suffix('%') {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        match p.parse::<u32>() {
            Ok(v) if v <= 100 => Ok(BudgetNodes::Percent(v)),
            _ => Err(bad()),
        }
    } else if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u32>().map(BudgetNodes::Count).map_err(|_| bad())
    } else {
        Err(bad())
    }
}

fn budgets(raw: Vec<RawBudget>, path: &str, problems: &mut Problems) -> Vec<Budget> {
    if raw.len() > 50 {
        problems.push(path, format!("{} budgets; at most 50", raw.len()));
    }
    let mut out = Vec::new();
    for (i, b) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        let cron = b.schedule.as_deref().map(CronSchedule::parse);
        let duration = b.duration.as_deref().map(parse_budget_duration);
        let schedule = match (cron, duration) {
            (None, None) => None,
            (Some(Ok(cron)), Some(Ok(duration))) => Some(BudgetSchedule { cron, duration }),
            (cron, duration) => {
                match &cron {
                    Some(Err(e)) => problems.push(format!("{at}.schedule"), e.clone()),
                    None => problems.push(
                        format!("{at}.schedule"),
                        "missing: a budget with a duration needs a schedule (cron, UTC)",
                    ),
                    Some(Ok(_)) => {}
                }
                match &duration {
                    Some(Err(e)) => problems.push(format!("{at}.duration"), e.clone()),
                    None => problems.push(
                        format!("{at}.duration"),
                        "missing: a budget with a schedule needs a duration (\"8h\", \"30m\")",
                    ),
                    Some(Ok(_)) => {}
                }
                continue;
            }
        };
        let nodes = match b.nodes.as_deref() {
            None => {
                problems.push(format!("{at}.nodes"), "missing: a count or a percentage");
                continue;
            }
            Some(n) => match parse_budget_nodes(n) {
                Ok(n) => n,
                Err(e) => {
                    problems.push(format!("{at}.nodes"), e);
                    continue;
                }
            },
        };
        let reasons = match b.reasons {
            None => None,
            Some(list) => {
                let mut rs = Vec::new();
                for (j, r) in list.iter().enumerate() {
                    match r.as_str() {
                        "Empty" => rs.push(DisruptionReason::Empty),
                        "Underutilized" => rs.push(DisruptionReason::Underutilized),
                        "Replace" => rs.push(DisruptionReason::Replace),
                        other => problems.push(
                            format!("{at}.reasons[{j}]"),
                            format!(
                                "unknown reason {other:?}; use Empty, Underutilized or Replace"
                            ),
                        ),
                    }
                }
                Some(rs)
            }
        };
        out.push(Budget {
            nodes,
            reasons,
            schedule,
        });
    }
    out
}

/// The `consolidation:` block; every problem is pushed with its path.
pub(super) fn consolidation_settings(
    raw: Option<RawConsolidation>,
    demand: DemandKind,
    scale_down_enabled: bool,
    problems: &mut Problems,
) -> ConsolidationSettings {
    let d = ConsolidationSettings::default();
    let Some(raw) = raw else {
        return d;
    };
    let mut enabled = raw.enabled.unwrap_or(false);
    if enabled && demand != DemandKind::Pods {
        problems.push(
            "consolidation.enabled",
            "consolidation moves pods: it needs demand: pods",
        );
        enabled = false;
    } else if enabled && !scale_down_enabled {
        problems.push(
            "consolidation.enabled",
            "consolidation removes nodes through scale-down's taint, drain and delete: it needs scaleDown.enabled",
        );
        enabled = false;
    }
    let policy = match raw.policy.as_deref() {
        None => d.policy,
        Some("WhenEmptyOrUnderutilized") => ConsolidationPolicy::WhenEmptyOrUnderutilized,
        Some("WhenEmpty") => ConsolidationPolicy::WhenEmpty,
        Some("Balanced") => ConsolidationPolicy::Balanced,
        Some(other) => {
            problems.push(
                "consolidation.policy",
                format!(
                    "unknown policy {other:?}; use WhenEmptyOrUnderutilized, WhenEmpty or Balanced"
                ),
            );
            d.policy
        }
    };
    let timeout = match raw.timeout {
        Some(HumanDuration(t)) if t.is_zero() => {
            problems.push("consolidation.timeout", "must be more than 0s");
            d.timeout
        }
        Some(HumanDuration(t)) => t,
        None => d.timeout,
    };
    ConsolidationSettings {
        enabled,
        policy,
        consolidate_after: raw
            .consolidate_after
            .map_or(d.consolidate_after, |HumanDuration(t)| t),
        validation_delay: raw
            .validation_delay
            .map_or(d.validation_delay, |HumanDuration(t)| t),
        timeout,
        budgets: raw
            .budgets
            .map(|b| budgets(b, "consolidation.budgets", problems))
            .unwrap_or(d.budgets),
        group_budgets: raw
            .group_budgets
            .unwrap_or_default()
            .into_iter()
            .map(|(g, b)| {
                let path = format!("consolidation.groupBudgets.{g}");
                let parsed = budgets(b, &path, problems);
                (g, parsed)
            })
            .collect(),
        cluster_budgets: raw
            .cluster_budgets
            .map(|b| budgets(b, "consolidation.clusterBudgets", problems))
            .unwrap_or_default(),
        deletion_cost_hints: match raw.deletion_cost_hints {
            Some(n) if n > MAX_DELETION_COST_HINTS => {
                problems.push(
                    "consolidation.deletionCostHints",
                    format!("{n} nodes: at most {MAX_DELETION_COST_HINTS} (each hinted node's pods are written)"),
                );
                d.deletion_cost_hints
            }
            Some(n) => n,
            None => d.deletion_cost_hints,
        },
        stabilization_window: match raw.stabilization_window {
            Some(HumanDuration(t)) if t > MAX_STABILIZATION_WINDOW => {
                problems.push(
                    "consolidation.stabilizationWindow",
                    format!("{}: at most 24h", humantime::format_duration(t)),
                );
                d.stabilization_window
            }
            Some(HumanDuration(t)) => t,
            None => d.stabilization_window,
        },
        empty_first: match raw.empty_first {
            Some(HumanDuration(t)) if t > MAX_STABILIZATION_WINDOW => {
                problems.push(
                    "consolidation.emptyFirst",
                    format!("{}: at most 24h", humantime::format_duration(t)),
                );
                d.empty_first
            }
            Some(HumanDuration(t))
                if !t.is_zero()
                    && raw.deletion_cost_hints.unwrap_or(d.deletion_cost_hints) == 0 =>
            {
                problems.push(
                    "consolidation.emptyFirst",
                    "needs consolidation.deletionCostHints of at least 1: the nodes given time to empty are the hinted ones, and without them no node whose pods would move is ever consolidated",
                );
                d.empty_first
            }
            Some(HumanDuration(t)) => t,
            None => d.empty_first,
        },
        delay_after_add: match raw.delay_after_add {
            Some(HumanDuration(t)) if t > MAX_STABILIZATION_WINDOW => {
                problems.push(
                    "consolidation.delayAfterAdd",
                    format!("{}: at most 24h", humantime::format_duration(t)),
                );
                d.delay_after_add
            }
            Some(HumanDuration(t)) => t,
            None => d.delay_after_add,
        },
        disrupt_jobs: raw.disrupt_jobs.unwrap_or(d.disrupt_jobs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str, scale_down: bool) -> (ConsolidationSettings, Vec<(String, String)>) {
        let raw: RawConsolidation = serde_yaml::from_str(yaml).expect("yaml");
        let mut problems = Problems::default();
        let s = consolidation_settings(Some(raw), DemandKind::Pods, scale_down, &mut problems);
        let found = problems
            .0
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect();
        (s, found)
    }

    #[test]
    fn consolidation_is_off_by_default_and_bad_values_are_named_with_their_path() {
        assert!(!ConsolidationSettings::default().enabled);
        assert_eq!(ConsolidationSettings::default().budgets, default_budgets());
        let (s, found) = parse(
            "enabled: true\nconsolidateAfter: 2m\nclusterBudgets: [{nodes: \"5\", reasons: [Empty]}]\ngroupBudgets: {dear: [{nodes: \"50%\"}]}",
            true,
        );
        assert!(found.is_empty(), "{found:?}");
        assert!(s.enabled);
        assert_eq!(s.consolidate_after, Duration::from_secs(120));
        assert_eq!(s.policy, ConsolidationPolicy::WhenEmptyOrUnderutilized);
        assert_eq!(
            parse("enabled: true\npolicy: Balanced", true).0.policy,
            ConsolidationPolicy::Balanced
        );
        assert_eq!(s.budgets_of("dear")[0].nodes, BudgetNodes::Percent(50));
        assert_eq!(s.budgets_of("other"), default_budgets().as_slice());
        assert_eq!(
            s.cluster_budgets[0].reasons,
            Some(vec![DisruptionReason::Empty])
        );
        let (_, found) = parse(
            "enabled: true\npolicy: Always\ntimeout: 0s\nbudgets: [{nodes: \"110%\"}, {nodes: \"1\", reasons: [Drifted]}, {nodes: \"1\", schedule: \"0 0 30 2 *\", duration: 1h}]",
            false,
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "consolidation.enabled",
                "consolidation.policy",
                "consolidation.timeout",
                "consolidation.budgets[0].nodes",
                "consolidation.budgets[1].reasons[0]",
                "consolidation.budgets[2].schedule",
            ],
            "{found:?}"
        );
        assert!(found[5].1.contains("never fires"), "{found:?}");
        assert!(found[0].1.contains("scaleDown.enabled"), "{found:?}");
        assert!(found[3].1.contains("110%"), "{found:?}");
    }

    #[test]
    fn deletion_cost_hints_are_off_by_default_and_at_most_a_hundred_nodes() {
        assert_eq!(ConsolidationSettings::default().deletion_cost_hints, 0);
        let (s, found) = parse(
            "enabled: true
deletionCostHints: 3",
            true,
        );
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(s.deletion_cost_hints, 3);
        let (s, found) = parse(
            "enabled: true
deletionCostHints: 500",
            true,
        );
        assert_eq!(s.deletion_cost_hints, 0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "consolidation.deletionCostHints");
        assert!(found[0].1.contains("500 nodes"), "{found:?}");
        assert!(
            serde_yaml::from_str::<RawConsolidation>("deletionCostHints: -1").is_err(),
            "a negative count does not parse"
        );
    }

    #[test]
    fn the_stabilization_window_is_off_by_default_and_at_most_a_day() {
        assert_eq!(
            ConsolidationSettings::default().stabilization_window,
            Duration::ZERO
        );
        let (s, found) = parse("enabled: true\nstabilizationWindow: 15m", true);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(s.stabilization_window, Duration::from_secs(900));
        let (s, found) = parse("enabled: true\nstabilizationWindow: 2days", true);
        assert_eq!(s.stabilization_window, Duration::ZERO);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "consolidation.stabilizationWindow");
        assert!(found[0].1.contains("at most 24h"), "{found:?}");
    }

    #[test]
    fn consolidation_is_not_held_after_a_scale_up_unless_delay_after_add_says_so() {
        assert_eq!(
            ConsolidationSettings::default().delay_after_add,
            Duration::ZERO
        );
        let (s, found) = parse("enabled: true\ndelayAfterAdd: 10m", true);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(s.delay_after_add, Duration::from_secs(600));
        let (s, found) = parse("enabled: true\ndelayAfterAdd: 3days", true);
        assert_eq!(s.delay_after_add, Duration::ZERO);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "consolidation.delayAfterAdd");
        assert!(found[0].1.contains("at most 24h"), "{found:?}");
    }

    #[test]
    fn consolidation_waits_for_jobs_pods_unless_disrupt_jobs_is_true() {
        assert!(!ConsolidationSettings::default().disrupt_jobs);
        assert!(!parse("enabled: true", true).0.disrupt_jobs);
        let (s, found) = parse("enabled: true\ndisruptJobs: true", true);
        assert!(s.disrupt_jobs, "{found:?}");
        assert!(found.is_empty(), "{found:?}");
        // Jobs' pods keep their nodes (in the scale-down of underused nodes too) only while
        // consolidation is on: off, cluster-autoscaler's rules alone.
        assert!(!ConsolidationSettings::default().keeps_jobs());
        assert!(parse("enabled: true", true).0.keeps_jobs());
        assert!(!s.keeps_jobs());
    }

    #[test]
    fn empty_first_is_off_by_default_at_most_a_day_and_needs_deletion_cost_hints() {
        assert_eq!(ConsolidationSettings::default().empty_first, Duration::ZERO);
        let (s, found) = parse("enabled: true\ndeletionCostHints: 3\nemptyFirst: 10m", true);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(s.empty_first, Duration::from_secs(600));
        let (s, found) = parse("enabled: true\nemptyFirst: 10m", true);
        assert_eq!(s.empty_first, Duration::ZERO);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "consolidation.emptyFirst");
        assert!(found[0].1.contains("deletionCostHints"), "{found:?}");
        let (_, found) = parse(
            "enabled: true\ndeletionCostHints: 3\nemptyFirst: 2days",
            true,
        );
        assert!(found[0].1.contains("at most 24h"), "{found:?}");
    }

    #[test]
    fn budget_nodes_are_a_count_or_a_percentage_rounded_up_as_karpenter_does() {
        assert_eq!(parse_budget_nodes("10%"), Ok(BudgetNodes::Percent(10)));
        assert_eq!(parse_budget_nodes("3"), Ok(BudgetNodes::Count(3)));
        assert_eq!(parse_budget_nodes("100%"), Ok(BudgetNodes::Percent(100)));
        for bad in ["101%", "%", "-1", "1.5", "ten", ""] {
            assert!(parse_budget_nodes(bad).is_err(), "{bad}");
        }
        assert_eq!(BudgetNodes::Percent(10).allowed(3), 1);
        assert_eq!(BudgetNodes::Percent(10).allowed(20), 2);
        assert_eq!(BudgetNodes::Percent(0).allowed(20), 0);
        assert_eq!(BudgetNodes::Count(4).allowed(2), 4);
    }

    #[test]
    fn a_budget_schedule_needs_a_duration_and_the_reverse_and_both_are_checked_with_their_path() {
        let (s, found) = parse(
            "enabled: true\nbudgets: [{nodes: \"0\", schedule: \"0 9 * * mon-fri\", duration: 8h}, {nodes: \"10%\"}]\ngroupBudgets: {g: [{nodes: \"1\", schedule: \"@daily\", duration: 1h30m}]}",
            true,
        );
        assert!(found.is_empty(), "{found:?}");
        let w = s.budgets[0].schedule.as_ref().expect("scheduled");
        assert_eq!(w.cron.as_str(), "0 9 * * mon-fri");
        assert_eq!(w.duration, Duration::from_secs(8 * 3600));
        assert_eq!(s.budgets[1].schedule, None);
        assert_eq!(
            s.budgets_of("g")[0].schedule.as_ref().map(|w| w.duration),
            Some(Duration::from_secs(5400))
        );
        let (s, found) = parse(
            "enabled: true\nbudgets: [{nodes: \"1\", schedule: \"@daily\"}, {nodes: \"1\", duration: 1h}, {nodes: \"1\", schedule: \"61 * * * *\", duration: 1h}, {nodes: \"1\", schedule: \"@daily\", duration: 10s}, {nodes: \"2\"}]\nclusterBudgets: [{nodes: \"1\", schedule: \"* * * *\", duration: 1d}]",
            true,
        );
        let got: Vec<(&str, &str)> = found
            .iter()
            .map(|(p, m)| (p.as_str(), m.as_str()))
            .collect();
        let paths: Vec<&str> = got.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            paths,
            [
                "consolidation.budgets[0].duration",
                "consolidation.budgets[1].schedule",
                "consolidation.budgets[2].schedule",
                "consolidation.budgets[3].duration",
                "consolidation.clusterBudgets[0].schedule",
                "consolidation.clusterBudgets[0].duration",
            ],
            "{found:?}"
        );
        assert!(got[0].1.contains("needs a duration"), "{got:?}");
        assert!(got[1].1.contains("needs a schedule"), "{got:?}");
        assert!(got[2].1.contains("minute 61"), "{got:?}");
        assert!(got[3].1.contains("hours and minutes"), "{got:?}");
        // The bad budgets are dropped; the good one stays.
        assert_eq!(s.budgets.len(), 1);
        assert_eq!(s.budgets[0].nodes, BudgetNodes::Count(2));
    }

    fn scheduled(nodes: u32, cron: &str, hours: u64) -> Budget {
        Budget {
            nodes: BudgetNodes::Count(nodes),
            reasons: None,
            schedule: Some(BudgetSchedule {
                cron: CronSchedule::parse(cron).expect("cron"),
                duration: Duration::from_secs(hours * 3600),
            }),
        }
    }

    /// What a decision at `now` lets go of `total` nodes of group `g` (the least any active
    /// budget allows: each bounds it, as consolidation's limits count them).
    fn allowed(
        s: &ConsolidationSettings,
        g: &str,
        total: u32,
        now: time::OffsetDateTime,
    ) -> Option<u32> {
        s.active_at(now)
            .budgets_of(g)
            .iter()
            .filter_map(|b| b.allowed_for(DisruptionReason::Underutilized, total))
            .min()
    }

    #[test]
    fn the_most_restrictive_active_budget_wins_and_an_inactive_one_is_ignored() {
        use time::macros::datetime;
        let mut s = ConsolidationSettings {
            enabled: true,
            ..Default::default()
        };
        // Always 50%; business hours (09:00-17:00 UTC, weekdays) none at all; a nightly window
        // 22:00-04:00 that allows 8.
        s.budgets = vec![
            Budget {
                nodes: BudgetNodes::Percent(50),
                reasons: None,
                schedule: None,
            },
            scheduled(0, "0 9 * * 1-5", 8),
            scheduled(8, "0 22 * * *", 6),
        ];
        s.cluster_budgets = vec![scheduled(1, "0 12 * * *", 1)];
        // Tuesday 10:00: business hours: 0 wins over 50%.
        let tue_10 = datetime!(2026-03-10 10:00 UTC);
        assert_eq!(allowed(&s, "g", 10, tue_10), Some(0));
        assert_eq!(s.active_at(tue_10).budgets.len(), 2);
        // Tuesday 18:00: only the 50% (the business window closed at 17:00).
        assert_eq!(
            allowed(&s, "g", 10, datetime!(2026-03-10 18:00 UTC)),
            Some(5)
        );
        // Wednesday 01:00: the night window (opened Tuesday 22:00) and the 50%: 5 wins over 8.
        let wed_1 = datetime!(2026-03-11 01:00 UTC);
        assert_eq!(s.active_at(wed_1).budgets.len(), 2);
        assert_eq!(allowed(&s, "g", 10, wed_1), Some(5));
        // Saturday 10:00: no business window on weekends.
        assert_eq!(
            allowed(&s, "g", 10, datetime!(2026-03-14 10:00 UTC)),
            Some(5)
        );
        // The cluster's budget only from 12:00 to 13:00.
        assert!(s
            .active_at(datetime!(2026-03-10 11:59 UTC))
            .cluster_budgets
            .is_empty());
        assert_eq!(
            s.active_at(datetime!(2026-03-10 12:30 UTC))
                .cluster_budgets
                .len(),
            1
        );
        // A group whose own budgets are all inactive is bounded by none (Karpenter's rule),
        // not by the defaults.
        s.group_budgets
            .insert("night".into(), vec![scheduled(2, "0 22 * * *", 6)]);
        let noon = s.active_at(datetime!(2026-03-10 12:00 UTC));
        assert!(noon.budgets_of("night").is_empty());
        assert_eq!(
            allowed(&s, "night", 10, datetime!(2026-03-10 23:00 UTC)),
            Some(2)
        );
        // Nothing else changes.
        assert_eq!(noon.enabled, s.enabled);
        assert_eq!(noon.validation_delay, s.validation_delay);
    }
}
