//! Each group's health and what was observed of it: one closed set of causes ([`Unhealthy`]) in
//! one order ([`Health`]), asked by every decision that lets a group grow or be written (the
//! scale-up decision, scale-down's replacement options and its wait for a new node, the
//! writer's holds), and the per-group observed state the writer reports
//! ([`Observed`]: the ETag it knows, staleness, foreign writes, the last write and 412, the
//! target, the held reason, the write backoff), which the status is drawn from.
//!
//! The writer (the reconciler) decides *when* to back a group off and *why* a write waits; it
//! reports those outcomes here through a handful of methods on
//! [`NodeGroups`](super::NodeGroups), and reads them back through [`Health`]. What only writing
//! needs (a write in flight, the write budget's token bucket, the backoff's attempt count, the
//! budget probes, a 429's turn) stays with the writer.

use crate::capacity::AllocationFailure;
use crate::hold::{HoldReason, WriteRefusal};
use crate::notify::{ConflictRecord, GroupStatus, WriteRecord};
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;
use tokio::time::Instant;

/// Why a node group is unhealthy now: one closed set. [`Health`] keeps them in the order of
/// the variants here, which is the one precedence every decision and the status use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unhealthy {
    /// This controller must not write the group (an agent pool AKS's own autoscaler scales).
    Refused(WriteRefusal),
    /// Azure refused its offering lately (quota, size not available, no capacity): out until
    /// the mark runs out (`left`).
    Unavailable {
        /// Why Azure refused.
        failure: AllocationFailure,
        /// How long the group stays out.
        left: Duration,
    },
    /// Backing off after write errors (5xx, transport, a 412 refused twice under
    /// `retryOnceThenBackoff`), as the writer reported.
    WriteBackoff,
    /// Requested nodes did not register within `maxNodeProvisionTime` (`limit`): backed off
    /// for `left` more.
    ProvisionTimeout {
        /// `maxNodeProvisionTime`.
        limit: Duration,
        /// How long the group stays out.
        left: Duration,
    },
    /// A scale-up of the group did not help some workloads: scale-up passes over it for those
    /// workloads (not for others) for `left` more.
    NotHelped {
        /// How long the longest of those backoffs lasts.
        left: Duration,
    },
    /// The last planned capacity write was not sent, for this reason (the status's `held`, the
    /// `writes_held_total` label of that hold).
    Held(HoldReason),
}

impl Unhealthy {
    /// The `reason` label (metrics, the pods' Events).
    pub fn label(&self) -> &'static str {
        match self {
            Unhealthy::Refused(_) => "refused",
            Unhealthy::Unavailable { failure, .. } => failure.label(),
            Unhealthy::WriteBackoff => "backoff",
            Unhealthy::ProvisionTimeout { .. } => "provision_timeout",
            Unhealthy::NotHelped { .. } => "did_not_help",
            Unhealthy::Held(reason) => reason.metric_label(),
        }
    }

    /// Whether this cause keeps the whole group out of scale-up (and out of scale-down's
    /// replacement options): a refusal, an unavailable offering, a write backoff, a
    /// provisioning timeout. "Did not help" passes it over only for some workloads, and a held
    /// write is retried on the next pass.
    pub fn keeps_out_of_scale_up(&self) -> bool {
        matches!(
            self,
            Unhealthy::Refused(_)
                | Unhealthy::Unavailable { .. }
                | Unhealthy::WriteBackoff
                | Unhealthy::ProvisionTimeout { .. }
        )
    }
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unhealthy::Refused(why) => write!(
                f,
                "not written by this controller ({why}: AKS's own autoscaler scales this pool)"
            ),
            Unhealthy::Unavailable { failure, left } => write!(
                f,
                "offering unavailable: {failure}; passed over for {}s more",
                left.as_secs()
            ),
            Unhealthy::WriteBackoff => f.write_str("backed off after errors"),
            Unhealthy::ProvisionTimeout { limit, left } => write!(
                f,
                "requested nodes did not register within maxNodeProvisionTime ({}s): backed off for {}s more",
                limit.as_secs(),
                left.as_secs()
            ),
            Unhealthy::NotHelped { left } => write!(
                f,
                "a scale-up did not help some workloads: passed over for them for {}s more",
                left.as_secs()
            ),
            Unhealthy::Held(reason) => write!(f, "the last planned write was held ({reason})"),
        }
    }
}

/// A group's health now: every cause that holds, in the one precedence (the order of
/// [`Unhealthy`]'s variants). Built by [`NodeGroups::health`](super::NodeGroups::health).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    causes: Vec<Unhealthy>,
}

impl Health {
    /// From causes in any order: they are kept in the one precedence.
    pub(super) fn of(mut causes: Vec<Unhealthy>) -> Self {
        causes.sort_by_key(rank);
        Self { causes }
    }

    /// Every cause that holds, first the one that decides.
    pub fn causes(&self) -> &[Unhealthy] {
        &self.causes
    }

    /// Nothing holds the group.
    pub fn is_healthy(&self) -> bool {
        self.causes.is_empty()
    }

    /// Why the group is out of scale-up (and of scale-down's replacement options), if it is:
    /// the first cause that [keeps it out](Unhealthy::keeps_out_of_scale_up).
    pub fn out_of_scale_up(&self) -> Option<Unhealthy> {
        self.causes
            .iter()
            .copied()
            .find(Unhealthy::keeps_out_of_scale_up)
    }

    /// Why capacity writes (`capacity`) or deletes wait for a cause of the group's own: an
    /// unavailable offering (capacity writes only: a refused allocation says nothing about
    /// removing an instance), a write backoff. The refusal is asked of the resource as just
    /// read, by the writer.
    pub fn write_hold(&self, capacity: bool) -> Option<HoldReason> {
        self.causes.iter().find_map(|c| match c {
            Unhealthy::Unavailable { failure, .. } if capacity => {
                Some(HoldReason::Unavailable(*failure))
            }
            Unhealthy::WriteBackoff => Some(HoldReason::Backoff),
            _ => None,
        })
    }

    /// The status's `held`: why the last planned capacity write was not sent, or, with none
    /// recorded, the refusal that will hold every write. Its label is the `writes_held_total`
    /// reason that hold counted.
    pub fn held(&self) -> Option<HoldReason> {
        self.causes
            .iter()
            .find_map(|c| match c {
                Unhealthy::Held(r) => Some(*r),
                _ => None,
            })
            .or_else(|| {
                self.causes.iter().find_map(|c| match c {
                    Unhealthy::Refused(w) => Some(HoldReason::Refused(*w)),
                    _ => None,
                })
            })
    }
}

impl Health {
    /// The causes a running controller's status (`status`, as written to its ConfigMap) shows
    /// at `now`, in the same precedence: what `explain` asks in the loops' stead. An
    /// unavailable offering, a write backoff, a provisioning timeout (`limit`:
    /// `maxNodeProvisionTime`), "did not help"; marks that ran out by `now` are over. The write
    /// refusal is not in a status (`explain` reads the resource itself) and a held write's
    /// reason is shown as written.
    pub fn from_status(status: &GroupStatus, now: Timestamp, limit: Duration) -> Self {
        let left = |until: Option<&String>| -> Option<Duration> {
            let until: Timestamp = until?.parse().ok()?;
            (until > now).then(|| Duration::try_from(until.duration_since(now)).unwrap_or_default())
        };
        let mut causes = Vec::new();
        if let Some(u) = &status.unavailable {
            if let (Some(failure), Some(left)) = (
                AllocationFailure::from_label(&u.reason),
                left(Some(&u.until)),
            ) {
                causes.push(Unhealthy::Unavailable { failure, left });
            }
        }
        if left(status.backoff_until.as_ref()).is_some() {
            causes.push(Unhealthy::WriteBackoff);
        }
        if let Some(left) = left(status.provision_backoff_until.as_ref()) {
            causes.push(Unhealthy::ProvisionTimeout { limit, left });
        }
        if let Some(left) = status
            .not_helped
            .as_ref()
            .and_then(|n| left(Some(&n.until)))
        {
            causes.push(Unhealthy::NotHelped { left });
        }
        Self::of(causes)
    }
}

/// The precedence: the order of the variants.
fn rank(u: &Unhealthy) -> u8 {
    match u {
        Unhealthy::Refused(_) => 0,
        Unhealthy::Unavailable { .. } => 1,
        Unhealthy::WriteBackoff => 2,
        Unhealthy::ProvisionTimeout { .. } => 3,
        Unhealthy::NotHelped { .. } => 4,
        Unhealthy::Held(_) => 5,
    }
}

/// What was observed of one group, as the writer and the loops reported it (the status is drawn
/// from it).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The last ETag seen or produced: a different one on a read means another writer.
    pub known_etag: Option<String>,
    /// An ambiguous write or a failed operation: read before the next write.
    pub stale: bool,
    /// Foreign writes seen.
    pub foreign_writes: u64,
    /// The last write sent and its result.
    pub last_write: Option<WriteRecord>,
    /// The last 412 and how it ended.
    pub last_conflict: Option<ConflictRecord>,
    /// What the last plan wanted for the group.
    pub target: Option<i64>,
    /// Why the last planned capacity write was not sent; cleared when a write is sent or none is
    /// planned.
    pub held: Option<HoldReason>,
    /// The writer backs the group off until then (tokio's clock).
    pub backoff_until: Option<Instant>,
    /// The scale-up loop passes over the group until then: requested nodes did not register
    /// within `maxNodeProvisionTime` (tokio's clock).
    pub provision_backoff_until: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_keep_one_precedence_whatever_order_they_come_in() {
        let h = Health::of(vec![
            Unhealthy::Held(HoldReason::Budget),
            Unhealthy::NotHelped {
                left: Duration::from_secs(1),
            },
            Unhealthy::WriteBackoff,
            Unhealthy::Refused(WriteRefusal::AksAutoscaler),
        ]);
        assert_eq!(
            h.causes().iter().map(Unhealthy::label).collect::<Vec<_>>(),
            ["refused", "backoff", "did_not_help", "budget"]
        );
        assert_eq!(
            h.out_of_scale_up(),
            Some(Unhealthy::Refused(WriteRefusal::AksAutoscaler))
        );
        assert_eq!(h.held(), Some(HoldReason::Budget));
        assert_eq!(h.write_hold(true), Some(HoldReason::Backoff));
    }

    #[test]
    fn an_unavailable_offering_holds_capacity_writes_but_not_deletes() {
        let h = Health::of(vec![Unhealthy::Unavailable {
            failure: AllocationFailure::Quota,
            left: Duration::from_secs(60),
        }]);
        assert_eq!(
            h.write_hold(true),
            Some(HoldReason::Unavailable(AllocationFailure::Quota))
        );
        assert_eq!(h.write_hold(false), None);
        assert_eq!(h.held(), None);
    }

    #[test]
    fn without_a_held_write_the_refusal_is_what_holds() {
        let h = Health::of(vec![Unhealthy::Refused(WriteRefusal::AksAutoscaler)]);
        assert_eq!(
            h.held(),
            Some(HoldReason::Refused(WriteRefusal::AksAutoscaler))
        );
        assert!(Health::default().is_healthy());
        assert_eq!(Health::default().out_of_scale_up(), None);
    }
}
