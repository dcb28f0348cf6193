//! The guarded send: the one way a write to Azure leaves this process, whether it is a capacity
//! write, its retry after a 412, or an instance delete.
//!
//! In this order, each of these is a reason ([`HoldReason`]) the write is not sent:
//!
//! 1. the resource as read refuses to be written by this controller (an agent pool AKS's own
//!    autoscaler scales); logged when the refusal starts or changes;
//! 2. optimistic concurrency is on and the read carries no ETag: never written blind;
//! 3. `--dry-run`;
//! 4. the group's holds ([`Inner::early_hold`]): the fence, an unavailable offering, a backoff,
//!    the budget;
//! 5. no token could be fetched: the token is fetched *before* the fence admits, so a slow
//!    token endpoint delays the admission, not the send after it;
//! 6. the fence does not admit; its permit is then held until Azure answers.
//!
//! Then one budget token is spent and the request goes inside [`crate::fence::sending`], where
//! the HTTP layer asks the fence once more immediately before the bytes leave (a request stopped
//! there was never sent: it is held too). A 429 or a send the fence stopped gives the token back:
//! Azure charges only what it admits.
//!
//! Besides, when a write is planned (with the early holds, before it spends a read on itself), a
//! write that is not urgent waits while the subscription's API budget, as Azure's answers report
//! it, is down to this process's reserve ([`Inner::reserve_hold`], `armBudgetReservePercentage`):
//! scale-ups go, deletions of unneeded nodes wait below half the reserve, lowering a capacity
//! number below the reserve. It is not asked again at the send: a write let through goes.
//!
//! Which holds apply to which write is decided here, once (the three hand-written copies this
//! replaced had drifted apart):
//!
//! - **fence, backoff, budget: every write.** A delete is a write to the same resource; Azure
//!   counts it against the same per-scale-set write limits, so it spends the group's budget, and
//!   a resource that is failing with 5xx (backoff) is not sent a delete either. A delete's own
//!   5xx or transport error backs the group off like a capacity write's.
//! - **an unavailable offering: capacity writes only.** The mark follows Azure refusing an
//!   allocation for the group's offering (quota, size not available, no capacity); it says
//!   nothing about removing one instance, which frees quota.
//! - **A held retry is a held write**: the 412 retry's hold records the metric, the status and
//!   the `WriteHeld` Event like the first attempt's (it used to count the metric only).
//! - **Deletes record the metric only**: the scale-down loop posts its own Event on the node and
//!   the status's `held` describes planned capacity writes.

use super::Inner;
use crate::azure::budget::{BudgetClass, Pacing, Urgency, BUDGET_MEMORY};
use crate::azure::{ArmError, Precondition};
use crate::cache::ScaleSet;
use crate::config::NodeGroupSpec;
use crate::fence::WritePermit;
use crate::hold::HoldReason;
use crate::notify::ControllerEvent;
use crate::resource::CapacityResource;
use std::future::Future;
use tokio::time::Instant;
use tracing::{debug, warn};

/// What a write is, which decides the holds that apply to it (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteKind {
    /// A capacity write or its retry after a 412.
    Capacity,
    /// An instance delete (scale-down).
    Delete,
}

/// How a guarded send ended.
#[derive(Debug)]
pub(super) enum Sent<T> {
    /// The request went out under this precondition; Azure's answer (or the transport's error).
    Answered(Precondition, Result<T, ArmError>),
    /// Nothing was sent, for this reason (already counted and recorded).
    Held(HoldReason),
}

impl Inner {
    /// Whether a write of `urgency` waits for the subscription's API budget: below this
    /// process's reserve of what Azure reports, only the urgent go (see [`Pacing::holds`]).
    /// The budget asked is ARM's and Compute's in the region of `name`'s scale set.
    ///
    /// A write held on a count older than [`BUDGET_MEMORY`] goes as the probe that looks at the
    /// bucket again ([`ArmBudget::probe`]). `take`: the question is the write's own. Otherwise
    /// it is scale-down's look before it drains a node for a delete: a probe granted then is
    /// kept for the group's next delete (no other drain starts for it, and no other write of the
    /// group takes it, meanwhile), so no node is drained for a delete the probe would not let
    /// through.
    ///
    /// [`ArmBudget::probe`]: crate::azure::budget::ArmBudget::probe
    pub(super) fn reserve_hold(
        &self,
        name: &str,
        urgency: Urgency,
        take: bool,
    ) -> Option<HoldReason> {
        let pacing = Pacing {
            reserve: self.settings.arm_budget_reserve,
        };
        let budget = self.arm.budget();
        let (class, region) = self.budget_scope(name, urgency);
        let region = region.as_deref();
        if !pacing.holds(urgency, budget.fraction_in(class, region)) {
            return None;
        }
        let now = Instant::now();
        let goes = self.with_state(name, |s| {
            let granted = s
                .probe_granted
                .filter(|t| now.saturating_duration_since(*t) < BUDGET_MEMORY);
            match (granted, take) {
                // The delete the look before its drain was granted the probe for.
                (Some(t), true) if urgency == Urgency::ScaleDown => {
                    s.probe_granted = None;
                    s.probe_taken = Some(t);
                    true
                }
                // That delete is on its way: no second drain for this group, and no other write
                // of it (a lowered capacity number) takes its probe.
                (Some(_), _) => false,
                (None, _) => {
                    let probe = budget.probe_at(class, region, now);
                    if probe && !take {
                        s.probe_granted = Some(now);
                    }
                    if probe && take && urgency == Urgency::ScaleDown {
                        s.probe_taken = Some(now);
                    }
                    probe
                }
            }
        });
        (!goes).then_some(HoldReason::ArmBudgetReserve)
    }

    /// The budget bucket a write of `urgency` to `name` is paced by: its class, and the region of
    /// `name`'s scale set.
    fn budget_scope(&self, name: &str, urgency: Urgency) -> (BudgetClass, Option<String>) {
        let region = self
            .node_groups
            .scale_sets()
            .get(name)
            .map(|c| c.scale_set.location.clone())
            .filter(|l| !l.is_empty());
        let class = match urgency {
            Urgency::ScaleDown
                if self
                    .arm
                    .budget()
                    .fraction_in(BudgetClass::Deletes, region.as_deref())
                    .is_some() =>
            {
                BudgetClass::Deletes
            }
            _ => BudgetClass::Writes,
        };
        (class, region)
    }

    /// Gives back the probe granted at `at` for a scale-down delete of `name` that was not sent
    /// (see [`crate::azure::budget::ArmBudget::unprobe`]).
    pub(super) fn unprobe(&self, name: &str, at: Instant) {
        let (class, region) = self.budget_scope(name, Urgency::ScaleDown);
        if self.arm.budget().unprobe(class, region.as_deref(), at) {
            debug!(
                scale_set = name,
                "the budget probe of a delete that was not sent is given back"
            );
        }
    }

    /// The group's holds: the fence (asked without a permit: cheap), an unavailable offering (capacity
    /// writes), a backoff, the budget (refilled and peeked, not spent), and `--dry-run`. Asked
    /// before a write spends any read on itself, and again by [`Inner::guarded_send`]. Records
    /// nothing.
    pub(super) fn early_hold(&self, name: &str, kind: WriteKind) -> Option<HoldReason> {
        if self.dry_run {
            return Some(HoldReason::DryRun);
        }
        if let Err(hold) = self.fence.check() {
            return Some(HoldReason::Fenced(hold));
        }
        // The group's own causes (an unavailable offering, a write backoff), as its health says.
        if let Some(hold) = self
            .node_groups
            .health(name)
            .write_hold(kind == WriteKind::Capacity)
        {
            return Some(hold);
        }
        let now = Instant::now();
        let budget = self.write_budget_of(name);
        self.with_state(name, |s| {
            let elapsed = now.saturating_duration_since(s.budget.last).as_secs_f64();
            s.budget.tokens =
                (s.budget.tokens + elapsed * budget.per_minute / 60.0).min(f64::from(budget.burst));
            s.budget.last = now;
            (s.budget.tokens < 1.0).then_some(HoldReason::Budget)
        })
    }

    /// Sends one write to `current` (the resource as just read) through every guard (see the
    /// module documentation). `send` builds the request from the precondition the guard chose.
    /// A hold is recorded ([`Inner::record_hold`]) before this returns it.
    pub(super) async fn guarded_send<T, F, Fut>(
        &self,
        group: &NodeGroupSpec,
        resource: &dyn CapacityResource,
        current: &ScaleSet,
        kind: WriteKind,
        send: F,
    ) -> Sent<T>
    where
        F: FnOnce(Precondition) -> Fut,
        Fut: Future<Output = Result<T, ArmError>>,
    {
        let name = group.name.as_str();
        let admitted = match self.admit(group, resource, current, kind).await {
            Ok(a) => a,
            Err(reason) => {
                self.record_hold(name, kind, reason);
                return Sent::Held(reason);
            }
        };
        let (precondition, permit) = admitted;
        self.with_state(name, |s| s.budget.tokens -= 1.0);
        let result = crate::fence::sending(self.fence.clone(), send(precondition.clone())).await;
        drop(permit);
        // Azure charges the requests it admits: a 429 (refused before its bucket) and a send the
        // fence stopped give the token back, so a group the subscription's budget throttles is
        // not then held by its own budget too while the others' writes go.
        if matches!(
            result,
            Err(ArmError::Throttled { .. } | ArmError::Fenced { .. })
        ) {
            self.with_state(name, |s| s.budget.tokens += 1.0);
        }
        match result {
            Err(ArmError::Fenced { hold, .. }) => {
                let reason = HoldReason::Fenced(hold);
                self.record_hold(name, kind, reason);
                Sent::Held(reason)
            }
            answered => Sent::Answered(precondition, answered),
        }
    }

    /// Steps 1 to 6 of the module documentation: the precondition to send under and the fence's
    /// permit, or why the write is not sent.
    async fn admit(
        &self,
        group: &NodeGroupSpec,
        resource: &dyn CapacityResource,
        current: &ScaleSet,
        kind: WriteKind,
    ) -> Result<(Precondition, WritePermit), HoldReason> {
        let name = group.name.as_str();
        if let Some(why) = self.refused(group, resource, current) {
            return Err(HoldReason::Refused(why));
        }
        let precondition = if self.settings.enable_vmss_etag {
            match &current.etag {
                Some(e) => Precondition::IfMatch(e.clone()),
                None => {
                    warn!(
                        scale_set = name,
                        "no ETag even after a fresh read: not writing blind"
                    );
                    return Err(HoldReason::NoEtag);
                }
            }
        } else {
            Precondition::None
        };
        if let Some(reason) = self.early_hold(name, kind) {
            return Err(reason);
        }
        if let Err(e) = self.arm.ready_token().await {
            warn!(scale_set = name, error = %e, "no token for the write: not sent");
            return Err(HoldReason::Credential);
        }
        // The token fetch may have taken a while: the fence is asked as late as possible, and
        // its permit held until the response is in.
        let permit = self.fence.admit().map_err(HoldReason::Fenced)?;
        Ok((precondition, permit))
    }

    /// Counts a write not sent (`writes_held_total`); a capacity write's hold is also the
    /// status's `held` and a `WriteHeld` Event.
    pub(super) fn record_hold(&self, name: &str, kind: WriteKind, reason: HoldReason) {
        debug!(scale_set = name, ?kind, %reason, "write held");
        self.metrics
            .writes_held_total
            .with_label_values(&[name, reason.metric_label()])
            .inc();
        if kind == WriteKind::Capacity {
            self.node_groups.write_held(name, reason);
            self.events.record(ControllerEvent::WriteHeld {
                group: name.to_string(),
                reason,
            });
        }
    }
}
