//! `scaleDown:`: cluster-autoscaler's `--scale-down-*` flags under their camelCased names, with
//! its defaults, so its users find them where they expect. Scale-down needs the cluster's pods,
//! so it is on by default with `demand: pods` and cannot be switched on without it.

use super::raw::{HumanDuration, RawScaleDown};
use super::validate::positive;
use super::{DemandKind, Problems};
use std::time::Duration;

/// `scaleDown:`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleDownSettings {
    /// `scaleDown.enabled` (default: on with `demand: pods`, as `--scale-down-enabled`).
    pub enabled: bool,
    /// `utilizationThreshold` (0.5): a node whose larger of cpu and memory request utilisation is
    /// under this, and whose pods all fit elsewhere, is unneeded.
    pub utilization_threshold: f64,
    /// `unneededTime` (10 min): how long a node must stay unneeded before it goes.
    pub unneeded_time: Duration,
    /// `delayAfterAdd` (10 min): no scale-down this soon after a scale-up (anywhere, or in the
    /// same group with `delayTypeLocal`).
    pub delay_after_add: Duration,
    /// `delayTypeLocal` (false, as `--scale-down-delay-type-local`): whether `delayAfterAdd`
    /// holds only the group that grew. Off, as in cluster-autoscaler, a scale-up of any group
    /// holds scale-down (and consolidation) in every group.
    pub delay_type_local: bool,
    /// `maxEmptyBulkDelete` (10): empty nodes removed at once per pass.
    pub max_empty_bulk_delete: u32,
    /// `nodeDeleteDelayAfterTaint` (5 s): between the taint and the re-check that a node is still
    /// unneeded (pods can land between listing and tainting: cluster-autoscaler #3886).
    pub node_delete_delay_after_taint: Duration,
    /// `maxPodEvictionTime` (2 min): how long a drain retries evictions a budget refuses.
    pub max_pod_eviction_time: Duration,
    /// `maxScaleDownPerPass` (10, as `--max-scale-down-parallelism`): nodes removed per pass,
    /// empty and drained together.
    pub max_scale_down_per_pass: u32,
    /// `nonEmptyCandidatesCount` (30, as `--scale-down-non-empty-candidates-count`): nodes with
    /// pods simulated per pass (the least utilised, those already unneeded first). A simulation
    /// tries every pod against the other nodes' room, so this bounds a pass on a large cluster;
    /// empty nodes need none and are all considered.
    pub non_empty_candidates_count: u32,
    /// `unreadyTime` (20 min, as `--scale-down-unready-time`): how long a node that is not Ready
    /// (past its startup window) must stay unneeded before it goes.
    pub unready_time: Duration,
    /// `okTotalUnreadyCount` (3, as `--ok-total-unready-count`) and
    /// `maxTotalUnreadyPercentage` (45, as `--max-total-unready-percentage`): with more unready
    /// nodes than both, scale-down halts (scale-up goes on).
    pub ok_total_unready_count: u32,
    /// See [`ScaleDownSettings::ok_total_unready_count`].
    pub max_total_unready_percentage: f64,
    /// `maxBulkSoftTaintCount` (10, as `--max-bulk-soft-taint-count`; 0 switches soft taints
    /// off): node writes per pass that add or remove the `PreferNoSchedule` taint marking the
    /// nodes scale-down would remove, so new pods go elsewhere first.
    pub max_bulk_soft_taint_count: u32,
    /// `maxBulkSoftTaintTime` (3 s, as `--max-bulk-soft-taint-time`): how long one pass's soft
    /// taint writes may take; those not started by then wait for a later pass.
    pub max_bulk_soft_taint_time: Duration,
}

/// cluster-autoscaler's `--scale-down-unneeded-time`.
pub const DEFAULT_UNNEEDED_TIME: Duration = Duration::from_secs(10 * 60);
/// cluster-autoscaler's `--scale-down-delay-after-add`.
pub const DEFAULT_DELAY_AFTER_ADD: Duration = Duration::from_secs(10 * 60);
/// cluster-autoscaler's `--node-delete-delay-after-taint`.
pub const DEFAULT_DELAY_AFTER_TAINT: Duration = Duration::from_secs(5);
/// cluster-autoscaler's `--scale-down-non-empty-candidates-count`.
pub const DEFAULT_NON_EMPTY_CANDIDATES: u32 = 30;
/// cluster-autoscaler's `--max-pod-eviction-time`.
pub const DEFAULT_MAX_POD_EVICTION_TIME: Duration = Duration::from_secs(2 * 60);
/// cluster-autoscaler's `--scale-down-unready-time`.
pub const DEFAULT_UNREADY_TIME: Duration = Duration::from_secs(20 * 60);
/// cluster-autoscaler's `--ok-total-unready-count`.
pub const DEFAULT_OK_TOTAL_UNREADY_COUNT: u32 = 3;
/// cluster-autoscaler's `--max-total-unready-percentage`.
pub const DEFAULT_MAX_TOTAL_UNREADY_PERCENTAGE: f64 = 45.0;
/// cluster-autoscaler's `--max-bulk-soft-taint-count`.
pub const DEFAULT_MAX_BULK_SOFT_TAINT_COUNT: u32 = 10;
/// cluster-autoscaler's `--max-bulk-soft-taint-time`.
pub const DEFAULT_MAX_BULK_SOFT_TAINT_TIME: Duration = Duration::from_secs(3);

impl Default for ScaleDownSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            utilization_threshold: UTILIZATION_THRESHOLD,
            unneeded_time: DEFAULT_UNNEEDED_TIME,
            delay_after_add: DEFAULT_DELAY_AFTER_ADD,
            delay_type_local: false,
            max_empty_bulk_delete: 10,
            node_delete_delay_after_taint: DEFAULT_DELAY_AFTER_TAINT,
            max_pod_eviction_time: DEFAULT_MAX_POD_EVICTION_TIME,
            max_scale_down_per_pass: 10,
            non_empty_candidates_count: DEFAULT_NON_EMPTY_CANDIDATES,
            unready_time: DEFAULT_UNREADY_TIME,
            ok_total_unready_count: DEFAULT_OK_TOTAL_UNREADY_COUNT,
            max_total_unready_percentage: DEFAULT_MAX_TOTAL_UNREADY_PERCENTAGE,
            max_bulk_soft_taint_count: DEFAULT_MAX_BULK_SOFT_TAINT_COUNT,
            max_bulk_soft_taint_time: DEFAULT_MAX_BULK_SOFT_TAINT_TIME,
        }
    }
}

/// A duration that may be zero (`0s` switches the wait off, as cluster-autoscaler allows).
fn non_negative(d: Option<HumanDuration>, default: Duration) -> Duration {
    d.map(|HumanDuration(d)| d).unwrap_or(default)
}

fn at_least_one(v: Option<u32>, default: u32, path: &str, problems: &mut Problems) -> u32 {
    match v {
        Some(0) => {
            problems.push(path, "must be at least 1");
            default
        }
        Some(n) => n,
        None => default,
    }
}

/// The `scaleDown:` block; every problem is pushed with its path.
pub(super) fn scale_down_settings(
    raw: Option<RawScaleDown>,
    demand: DemandKind,
    problems: &mut Problems,
) -> ScaleDownSettings {
    let d = ScaleDownSettings::default();
    let raw = raw.unwrap_or_default();
    let pods = demand == DemandKind::Pods;
    let enabled = match raw.enabled {
        Some(true) if !pods => {
            problems.push(
                "scaleDown.enabled",
                "scale-down chooses nodes from their pods: it needs demand: pods",
            );
            false
        }
        Some(e) => e,
        None => pods,
    };
    let utilization_threshold = match raw.utilization_threshold {
        Some(t) if !(t > 0.0 && t <= 1.0) => {
            problems.push(
                "scaleDown.utilizationThreshold",
                format!("{t} is not a fraction in (0, 1]"),
            );
            d.utilization_threshold
        }
        Some(t) => t,
        None => d.utilization_threshold,
    };
    ScaleDownSettings {
        enabled,
        utilization_threshold,
        unneeded_time: non_negative(raw.unneeded_time, d.unneeded_time),
        delay_after_add: non_negative(raw.delay_after_add, d.delay_after_add),
        delay_type_local: raw.delay_type_local.unwrap_or(d.delay_type_local),
        max_empty_bulk_delete: at_least_one(
            raw.max_empty_bulk_delete,
            d.max_empty_bulk_delete,
            "scaleDown.maxEmptyBulkDelete",
            problems,
        ),
        node_delete_delay_after_taint: non_negative(
            raw.node_delete_delay_after_taint,
            d.node_delete_delay_after_taint,
        ),
        max_pod_eviction_time: positive(
            raw.max_pod_eviction_time,
            d.max_pod_eviction_time,
            "scaleDown.maxPodEvictionTime",
            problems,
        ),
        max_scale_down_per_pass: at_least_one(
            raw.max_scale_down_per_pass,
            d.max_scale_down_per_pass,
            "scaleDown.maxScaleDownPerPass",
            problems,
        ),
        non_empty_candidates_count: at_least_one(
            raw.non_empty_candidates_count,
            d.non_empty_candidates_count,
            "scaleDown.nonEmptyCandidatesCount",
            problems,
        ),
        unready_time: non_negative(raw.unready_time, d.unready_time),
        ok_total_unready_count: raw
            .ok_total_unready_count
            .unwrap_or(d.ok_total_unready_count),
        max_total_unready_percentage: match raw.max_total_unready_percentage {
            Some(p) if !(0.0..=100.0).contains(&p) => {
                problems.push(
                    "scaleDown.maxTotalUnreadyPercentage",
                    format!("{p} is not a percentage in [0, 100]"),
                );
                d.max_total_unready_percentage
            }
            Some(p) => p,
            None => d.max_total_unready_percentage,
        },
        max_bulk_soft_taint_count: raw
            .max_bulk_soft_taint_count
            .unwrap_or(d.max_bulk_soft_taint_count),
        max_bulk_soft_taint_time: positive(
            raw.max_bulk_soft_taint_time,
            d.max_bulk_soft_taint_time,
            "scaleDown.maxBulkSoftTaintTime",
            problems,
        ),
    }
}

/// cluster-autoscaler's `--scale-down-utilization-threshold` default.
pub const UTILIZATION_THRESHOLD: f64 = 0.5;
