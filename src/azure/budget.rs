//! The API budget Azure reports, and how close to its reserve this process runs.
//!
//! Every ARM answer carries what is left of the buckets it was charged to:
//! `x-ms-ratelimit-remaining-subscription-reads` / `-writes` / `-deletes` (ARM's per-subscription
//! buckets) and Compute's `x-ms-ratelimit-remaining-resource`
//! (`Microsoft.Compute/<policy>;<count>` entries, one per policy). The buckets are the
//! subscription's, not this process's: every cluster and tool in the subscription spends from
//! them, so the remaining counts are the state a fleet of controllers shares, with no channel
//! between them. Each controller keeps a reserve of every bucket and, as the remaining falls
//! toward it, stretches its refreshes and sends only its most urgent writes; many controllers
//! reading the same counts back off together and converge on a share of what is left.
//!
//! A bucket's size is not reported: it is estimated as the largest remaining count seen (a bucket
//! is full when nobody has spent from it for a while, as at start).
//!
//! Pacing reads ARM's subscription buckets only. Compute's policy entries do not say whose bucket
//! a count is: `UpdateVMScaleSet3Min` is both a scale set's own bucket (4/min, burst 12) and the
//! subscription's (500/min, burst 1,500), under one name, so the counts of different scale sets
//! would overwrite each other here. A scale set's own bucket is already paced by the group's write
//! budget (`writeBudget`) and its `Retry-After` gate; Compute's counts are still exported, per
//! policy, as `arm_ratelimit_remaining` and `arm_budget_remaining{scope,policy}`.

use parking_lot::Mutex;
use std::collections::HashMap;

/// What a bucket pays for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetClass {
    /// GET, LIST, operation polls.
    Reads,
    /// PUT, PATCH, POST other than deletes.
    Writes,
    /// Deletes (of instances by name too).
    Deletes,
}

impl BudgetClass {
    /// The `class` label of `arm_budget_fraction`.
    pub fn label(self) -> &'static str {
        match self {
            BudgetClass::Reads => "reads",
            BudgetClass::Writes => "writes",
            BudgetClass::Deletes => "deletes",
        }
    }

    /// Every class.
    pub const ALL: [BudgetClass; 3] = [
        BudgetClass::Reads,
        BudgetClass::Writes,
        BudgetClass::Deletes,
    ];

    /// The class a subscription bucket (the scope of an `x-ms-ratelimit-remaining-<scope>`
    /// header, `subscription-reads`) pays for; `None` for anything else (tenant buckets, Compute's
    /// policies: see the module's note).
    pub fn of(scope: &str) -> Option<BudgetClass> {
        match scope.to_ascii_lowercase().as_str() {
            "subscription-reads" => Some(BudgetClass::Reads),
            "subscription-writes" => Some(BudgetClass::Writes),
            "subscription-deletes" => Some(BudgetClass::Deletes),
            _ => None,
        }
    }
}

/// Remaining counts by scope, with each bucket's size as estimated.
#[derive(Debug, Default)]
pub struct ArmBudget {
    /// scope → (last remaining, largest remaining seen).
    scopes: Mutex<HashMap<String, (i64, i64)>>,
}

impl ArmBudget {
    /// Records what an answer said is left in `scope`.
    pub fn observe(&self, scope: &str, remaining: i64) {
        let mut scopes = self.scopes.lock();
        let e = scopes.entry(scope.to_string()).or_insert((remaining, 0));
        e.0 = remaining;
        e.1 = e.1.max(remaining);
    }

    /// The share left of the emptiest bucket of `class` (0.0 to 1.0), if one was reported.
    pub fn fraction(&self, class: BudgetClass) -> Option<f64> {
        self.scopes
            .lock()
            .iter()
            .filter(|(scope, (_, max))| *max > 0 && BudgetClass::of(scope) == Some(class))
            .map(|(_, (left, max))| (*left).max(0) as f64 / *max as f64)
            .reduce(f64::min)
    }
}

/// How this process paces itself against the reserve (`armBudgetReservePercentage`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// The share of each bucket kept in reserve (0.0: pacing off).
    pub reserve: f64,
}

/// The longest a refresh interval is stretched, as a multiple.
pub const MAX_STRETCH: f64 = 4.0;

impl Pacing {
    /// How much longer than usual to wait between refreshes with `left` of the reads budget:
    /// 1 at or above the reserve, growing linearly to [`MAX_STRETCH`] as it runs out.
    pub fn stretch(self, left: Option<f64>) -> f64 {
        match left {
            Some(f) if self.reserve > 0.0 && f < self.reserve => {
                1.0 + (MAX_STRETCH - 1.0) * (1.0 - f / self.reserve).clamp(0.0, 1.0)
            }
            _ => 1.0,
        }
    }

    /// Whether a write of `urgency` waits with `left` of its class's budget. Urgent writes
    /// (capacity for pending pods) always go, until Azure itself says 429; deletions of
    /// unneeded nodes wait below half the reserve; everything else below the reserve.
    pub fn holds(self, urgency: Urgency, left: Option<f64>) -> bool {
        let Some(f) = left else {
            return false;
        };
        match urgency {
            Urgency::ScaleUp => false,
            Urgency::ScaleDown => f < self.reserve / 2.0,
            Urgency::Other => f < self.reserve,
        }
    }
}

/// Which writes go first when the budget runs low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// More capacity: pods wait for it.
    ScaleUp,
    /// Deleting an unneeded node: money, not availability.
    ScaleDown,
    /// Lowering a capacity number (a schedule ending) and anything else.
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_subscription_buckets_count_toward_reads_writes_and_deletes() {
        assert_eq!(
            BudgetClass::of("subscription-reads"),
            Some(BudgetClass::Reads)
        );
        assert_eq!(
            BudgetClass::of("subscription-deletes"),
            Some(BudgetClass::Deletes)
        );
        assert_eq!(
            BudgetClass::of("subscription-writes"),
            Some(BudgetClass::Writes)
        );
        assert_eq!(
            BudgetClass::of("Microsoft.Compute/UpdateVMScaleSet3Min"),
            None
        );
        assert_eq!(BudgetClass::of("tenant-reads"), None);
    }

    #[test]
    fn the_share_left_is_the_emptiest_bucket_against_the_most_it_ever_showed() {
        let b = ArmBudget::default();
        assert_eq!(b.fraction(BudgetClass::Writes), None);
        b.observe("subscription-writes", 1000);
        b.observe("subscription-writes", 250);
        b.observe("Microsoft.Compute/UpdateVMScaleSet3Min", 1);
        assert_eq!(b.fraction(BudgetClass::Writes), Some(0.25));
        b.observe("subscription-deletes", 0);
        assert_eq!(b.fraction(BudgetClass::Deletes), None, "never seen above 0");
        b.observe("subscription-deletes", 500);
        b.observe("subscription-deletes", 50);
        assert_eq!(b.fraction(BudgetClass::Deletes), Some(0.1));
        assert_eq!(b.fraction(BudgetClass::Reads), None);
    }

    #[test]
    fn below_the_reserve_refreshes_stretch_and_only_urgent_writes_go() {
        let p = Pacing { reserve: 0.2 };
        assert_eq!(p.stretch(None), 1.0);
        assert_eq!(p.stretch(Some(0.5)), 1.0);
        assert_eq!(p.stretch(Some(0.1)), 2.5);
        assert_eq!(p.stretch(Some(0.0)), MAX_STRETCH);
        assert!(!p.holds(Urgency::ScaleUp, Some(0.0)));
        assert!(!p.holds(Urgency::ScaleDown, Some(0.15)));
        assert!(p.holds(Urgency::ScaleDown, Some(0.05)));
        assert!(p.holds(Urgency::Other, Some(0.15)));
        assert!(!p.holds(Urgency::Other, Some(0.25)));
        assert!(
            !p.holds(Urgency::Other, None),
            "nothing reported: no pacing"
        );
        let off = Pacing { reserve: 0.0 };
        assert_eq!(off.stretch(Some(0.0)), 1.0);
        assert!(!off.holds(Urgency::Other, Some(0.0)));
    }
}
