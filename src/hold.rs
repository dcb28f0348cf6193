//! Why a write to Azure was not sent: one closed set of reasons.
//!
//! The same value is the `reason` label of `writes_held_total`, the reason in a `WriteHeld`
//! Event, the `held` field of the status ConfigMap and the refusal a delete returns, so adding a
//! reason is one variant here and the compiler finds every place that must say something about
//! it. A leaf module (it depends only on [`crate::fence`] and [`crate::capacity`]'s failure
//! classes): the reconciler, the resources and the notification types all use it without
//! importing each other.

use crate::capacity::AllocationFailure;
use crate::fence::FenceHold;
use std::fmt;

/// Why a node group's resource, as read, must never be written by this controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteRefusal {
    /// An AKS agent pool with `enableAutoScaling: true`: AKS's own autoscaler scales it, and
    /// writing its count would fight that autoscaler.
    AksAutoscaler,
}

impl WriteRefusal {
    /// The `reason` label (`writes_held_total`, the status).
    pub fn label(self) -> &'static str {
        match self {
            WriteRefusal::AksAutoscaler => "aks_autoscaler",
        }
    }
}

impl fmt::Display for WriteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why a planned write (a capacity write, its retry after a 412, an instance delete) was not
/// sent. Nothing was sent for any of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HoldReason {
    /// The fence: not the leader, or the Lease renewal is too old.
    Fenced(FenceHold),
    /// No token could be fetched for the write.
    Credential,
    /// Azure refused the group's offering lately (quota, size not available, no capacity) and
    /// the mark has not run out (capacity writes only: a refused allocation says nothing about
    /// removing an instance, which frees quota).
    Unavailable(AllocationFailure),
    /// The group is backing off after a 5xx or transport error on a write to it.
    Backoff,
    /// The group's write budget (`writeBudget`) is spent.
    Budget,
    /// The subscription's API budget Azure reports is down to this process's reserve
    /// (`armBudgetReservePercentage`) and the write is not urgent: deletions of unneeded nodes
    /// wait below half the reserve, lowering a capacity number below the reserve; scale-ups go.
    ArmBudgetReserve,
    /// The resource must not be written by this controller.
    Refused(WriteRefusal),
    /// Optimistic concurrency is on and even a fresh read carries no ETag: never written blind.
    NoEtag,
    /// `--dry-run`: decided and logged, never sent.
    DryRun,
    /// A scale-up throttled by the subscription's bucket (Azure's 429, or the gate one closed)
    /// waits its turn: `Retry-After`, a delay that shrinks as it ages and a random part of up to
    /// a second, so the fleet's older scale-ups ask first and no place in the second keeps
    /// winning ([`crate::reconciler::retry`]). A delete scale-down would start while that gate
    /// is closed waits for it too (the node is not drained meanwhile).
    RetryTurn,
}

impl HoldReason {
    /// The `reason` label of `writes_held_total`, also the status's `held` and the Event's reason.
    pub fn metric_label(self) -> &'static str {
        match self {
            HoldReason::Fenced(hold) => hold.metric_label(),
            HoldReason::Credential => "credential",
            HoldReason::Unavailable(_) => "offering_unavailable",
            HoldReason::Backoff => "backoff",
            HoldReason::Budget => "budget",
            HoldReason::ArmBudgetReserve => "arm_budget_reserve",
            HoldReason::Refused(why) => why.label(),
            HoldReason::NoEtag => "no_etag",
            HoldReason::DryRun => "dry_run",
            HoldReason::RetryTurn => "retry_turn",
        }
    }

    /// Every reason, for tests and for documentation that lists the labels.
    pub const ALL: [HoldReason; 11] = [
        HoldReason::Fenced(FenceHold::NotLeader),
        HoldReason::Fenced(FenceHold::RenewalStale),
        HoldReason::Credential,
        HoldReason::Unavailable(AllocationFailure::Quota),
        HoldReason::Backoff,
        HoldReason::Budget,
        HoldReason::ArmBudgetReserve,
        HoldReason::Refused(WriteRefusal::AksAutoscaler),
        HoldReason::NoEtag,
        HoldReason::DryRun,
        HoldReason::RetryTurn,
    ];
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.metric_label())
    }
}

impl From<FenceHold> for HoldReason {
    fn from(hold: FenceHold) -> Self {
        HoldReason::Fenced(hold)
    }
}

impl From<WriteRefusal> for HoldReason {
    fn from(why: WriteRefusal) -> Self {
        HoldReason::Refused(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_hold_reason_has_its_own_label_and_the_labels_stay_as_documented() {
        let labels: Vec<&str> = HoldReason::ALL.iter().map(|r| r.metric_label()).collect();
        assert_eq!(
            labels,
            [
                "not_leader",
                "lease_stale",
                "credential",
                "offering_unavailable",
                "backoff",
                "budget",
                "arm_budget_reserve",
                "aks_autoscaler",
                "no_etag",
                "dry_run",
                "retry_turn"
            ]
        );
        assert_eq!(
            labels.iter().collect::<HashSet<_>>().len(),
            labels.len(),
            "two reasons share a label"
        );
    }
}
