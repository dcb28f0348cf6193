//! The write path: one planned write through the ETag protocol (`If-Match` the cached ETag, adopt
//! the returned one), the fresh read before it when the cache cannot be trusted, and the 412: both
//! caches invalidated, a fresh read, the plan asked again, one retry. Each ends in a closed set:
//! [`WriteEnd`] for a write, [`FreshRead`] for a read.

use super::operation::OperationEnd;
use super::{jittered, Inner, Sent, WriteKind, BACKOFF_BASE, BACKOFF_CAP};
use crate::azure::budget::Urgency;
use crate::azure::{ArmError, Precondition, PutAccepted};
use crate::cache::ScaleSet;
use crate::config::{ConflictStrategy, NodeGroupSpec};
use crate::hold::{HoldReason, WriteRefusal};
use crate::node_groups::rfc3339;
use crate::notify::{ConflictRecord, ControllerEvent};
use crate::planner::{self, CapacityChange};
use crate::resource::CapacityResource;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How one planned write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteEnd {
    Written,
    Satisfied,
    Held,
    Failed,
    GaveUp,
}

/// How a 412 ended: the `outcome` label of `etag_conflicts_total`, the status's last conflict
/// and the `Conflict` Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConflictEnd {
    /// The fresh read's capacity already satisfies the plan: nothing to retry.
    Skipped,
    /// The one retry, with the fresh ETag, was accepted.
    RetriedOk,
    /// The resource is gone.
    Gone,
    /// No retry, or the retry failed too: the next pass starts from a fresh read.
    GaveUp,
}

impl ConflictEnd {
    fn label(self) -> &'static str {
        match self {
            ConflictEnd::Skipped => "skipped",
            ConflictEnd::RetriedOk => "retried_ok",
            ConflictEnd::Gone => "gone",
            ConflictEnd::GaveUp => "gave_up",
        }
    }
}

/// What a fresh GET of a group's resource found.
#[derive(Debug)]
pub(super) enum FreshRead {
    /// The resource as it is now: cached, its ETag observed.
    Read(ScaleSet),
    /// It is gone (404): deleted by someone else.
    Gone,
    /// The GET failed.
    Failed(ArmError),
}

impl Inner {
    /// Whether the resource, as read, refuses our write (an agent pool under AKS's own
    /// autoscaler); logs when the refusal starts or changes.
    pub(super) fn refused(
        &self,
        group: &NodeGroupSpec,
        resource: &dyn CapacityResource,
        current: &ScaleSet,
    ) -> Option<WriteRefusal> {
        let reason = resource.write_refusal(current);
        let changed = self.with_state(&group.name, |s| {
            std::mem::replace(&mut s.refusal, reason) != reason
        });
        if changed {
            if let Some(reason) = reason {
                let problem = resource.refusal_problem(&group.name, reason);
                warn!(scale_set = %group.name, kind = group.kind.as_str(), %reason, "{problem}");
            }
        }
        reason
    }

    /// One planned write through the ETag protocol. Returns how it ended and whether a 412 was met.
    pub(super) async fn write(
        self: Arc<Self>,
        group: &NodeGroupSpec,
        change: CapacityChange,
    ) -> (WriteEnd, bool) {
        let name = group.name.as_str();
        let resource = self.node_groups.resource(group);
        let cached = self
            .node_groups
            .scale_sets()
            .get(name)
            .map(|c| c.scale_set.clone());
        // More capacity is what pending pods wait for (and what waits its turn after a 429).
        let grows = change.to
            > cached
                .as_ref()
                .and_then(|c| c.capacity)
                .unwrap_or(change.from);
        // Held before any read is spent on it.
        let early = cached
            .as_ref()
            .and_then(|c| self.refused(group, resource.as_ref(), c))
            .map(HoldReason::Refused)
            .or_else(|| self.early_hold(name, WriteKind::Capacity))
            .or_else(|| {
                if grows {
                    self.turn_hold(name)
                        .or_else(|| self.reserve_hold(name, Urgency::ScaleUp, true))
                } else {
                    self.reserve_hold(name, Urgency::Other, true)
                }
            });
        if let Some(reason) = early {
            if reason == HoldReason::DryRun {
                info!(scale_set = name, from = ?cached.as_ref().and_then(|c| c.capacity), to = change.to, reason = %change.reason, "dry run: would write capacity");
            }
            self.record_hold(name, WriteKind::Capacity, reason);
            return (WriteEnd::Held, false);
        }
        let etag_on = self.settings.enable_vmss_etag;
        let stale = self.node_groups.stale(name);
        let mut current = cached;
        let mut target = change.to;
        let needs_get = stale
            || current.is_none()
            || (etag_on && current.as_ref().is_some_and(|c| c.etag.is_none()));
        if needs_get {
            let why = if stale { "stale" } else { "no_etag" };
            match self.fresh_read(group, resource.as_ref(), why).await {
                FreshRead::Read(fresh) => {
                    self.node_groups.set_stale(name, false);
                    match fresh.capacity.and_then(|c| {
                        planner::target_for(group, c, self.demand.as_ref(), (self.clock)())
                    }) {
                        None => {
                            if stale {
                                info!(scale_set = name, capacity = ?fresh.capacity, "stale entry re-read: the capacity already satisfies the plan (an ambiguous write landed)");
                            }
                            return (WriteEnd::Satisfied, false);
                        }
                        Some(c) => target = c.to,
                    }
                    current = Some(fresh);
                }
                FreshRead::Gone => return (self.gone(name), false),
                FreshRead::Failed(e) => return (self.write_error(name, &e), false),
            }
        }
        let Some(current) = current else {
            return (WriteEnd::Failed, false);
        };
        if grows {
            self.await_turn(name).await;
        }
        // The count sent is what the demand asks for now, not what it asked for when the pass
        // planned: the wait for a write slot, a read or a turn may have let it change. One write
        // carries the latest count, however often the demand changed while the budget held it.
        match current
            .capacity
            .map(|c| planner::target_for(group, c, self.demand.as_ref(), (self.clock)()))
        {
            Some(None) => return (WriteEnd::Satisfied, false),
            Some(Some(latest)) if latest.to != target => {
                debug!(
                    scale_set = name,
                    planned = target,
                    latest = latest.to,
                    "the demand changed since the plan: writing its latest count"
                );
                target = latest.to;
            }
            _ => {}
        }
        let (precondition, result) = match self
            .guarded_send(
                group,
                resource.as_ref(),
                &current,
                WriteKind::Capacity,
                |precondition| {
                    let (resource, current) = (&resource, &current);
                    async move {
                        resource
                            .write_capacity(current, target, &precondition)
                            .await
                    }
                },
            )
            .await
        {
            Sent::Held(_) => return (WriteEnd::Held, false),
            Sent::Answered(precondition, result) => (precondition, result),
        };
        self.record_write(name, current.capacity, target, write_result(&result));
        match result {
            Ok(acc) => {
                self.write_ok(group, &resource, &current, target, &precondition, acc);
                (WriteEnd::Written, false)
            }
            Err(ArmError::PreconditionFailed { .. }) => (
                self.conflict(group, &resource, target, &precondition).await,
                true,
            ),
            Err(e) => {
                if grows {
                    self.wait_turn(name, &e);
                }
                (self.write_error(name, &e), false)
            }
        }
    }

    /// GET one node group's resource, replace its cache entry and record what it shows.
    pub(super) async fn fresh_read(
        &self,
        group: &NodeGroupSpec,
        resource: &dyn CapacityResource,
        reason: &str,
    ) -> FreshRead {
        let name = group.name.as_str();
        debug!(
            scale_set = name,
            kind = group.kind.as_str(),
            reason,
            "GET fresh"
        );
        match resource.get(name).await {
            Ok(Some(fresh)) => {
                self.observe(&fresh);
                let now = Instant::now();
                self.node_groups.scale_sets().upsert(fresh.clone(), now);
                if let Some(c) = fresh.capacity {
                    self.node_groups.sizes().publish(name, c, now);
                }
                FreshRead::Read(fresh)
            }
            Ok(None) => FreshRead::Gone,
            Err(e) => FreshRead::Failed(e),
        }
    }

    pub(super) fn invalidate_after_conflict(&self, name: &str) {
        self.node_groups.sizes().invalidate(name);
        self.node_groups.instances().invalidate(name);
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["size", "precondition_failed"])
            .inc();
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["instance", "precondition_failed"])
            .inc();
    }

    fn write_ok(
        self: &Arc<Self>,
        group: &NodeGroupSpec,
        resource: &Arc<dyn CapacityResource>,
        sent_from: &ScaleSet,
        target: i64,
        precondition: &Precondition,
        acc: PutAccepted,
    ) {
        let name = group.name.as_str();
        let now = Instant::now();
        // Keep the previous ETag when none came back: a stale If-Match gets a 412 (handled);
        // no If-Match would be a blind write.
        let etag = acc.etag.clone().or_else(|| sent_from.etag.clone());
        if acc.etag.is_none() {
            warn!(
                scale_set = name,
                "write accepted without an ETag; keeping the previous one"
            );
        }
        let mut entry = acc.scale_set.clone();
        entry.capacity = Some(target);
        entry.etag = etag.clone();
        if entry.location.is_empty() {
            entry.location = sent_from.location.clone();
        }
        self.node_groups.scale_sets().upsert(entry, now);
        self.node_groups.sizes().publish(name, target, now);
        self.node_groups.instances().invalidate(name);
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["instance", "own_write"])
            .inc();
        self.node_groups.adopt_etag(name, etag.clone());
        self.clear_backoff(name);
        self.metrics
            .capacity_writes_total
            .with_label_values(&[name, "ok"])
            .inc();
        self.metrics
            .scale_set_capacity
            .with_label_values(&[name])
            .set(target);
        info!(
            scale_set = name,
            from = ?sent_from.capacity,
            to = target,
            if_match = precondition.if_match().unwrap_or("-"),
            status = acc.status,
            etag = etag.as_deref().unwrap_or("-"),
            "capacity written"
        );
        self.events.record(ControllerEvent::CapacityWritten {
            group: name.to_string(),
            kind: group.kind.as_str(),
            from: sent_from.capacity,
            to: target,
            etag: etag.clone(),
        });
        if let Some(url) = acc.async_operation {
            self.track_operation(name, resource.clone(), url, acc.retry_after, target, etag);
        }
    }

    /// After a 412: the strategy decides; the design's is "refresh and re-plan now".
    async fn conflict(
        self: &Arc<Self>,
        group: &NodeGroupSpec,
        resource: &Arc<dyn CapacityResource>,
        attempted: i64,
        sent: &Precondition,
    ) -> WriteEnd {
        let name = group.name.as_str();
        self.metrics
            .capacity_writes_total
            .with_label_values(&[name, "precondition_failed"])
            .inc();
        info!(
            scale_set = name,
            if_match = sent.if_match().unwrap_or("-"),
            to = attempted,
            "412 Precondition Failed: another writer changed the scale set; refreshing"
        );
        self.invalidate_after_conflict(name);
        let fresh_capacity = Mutex::new(None);
        let outcome = |o: ConflictEnd| {
            let o = o.label();
            let record = ConflictRecord {
                at: rfc3339(OffsetDateTime::now_utc()),
                outcome: o.to_string(),
            };
            self.node_groups.conflicted(name, record);
            self.metrics
                .etag_conflicts_total
                .with_label_values(&[name, o])
                .inc();
            self.events.record(ControllerEvent::Conflict {
                group: name.to_string(),
                outcome: o,
                fresh_capacity: *fresh_capacity.lock(),
            });
        };
        let strategy = self.settings.conflict_strategy;
        if strategy == ConflictStrategy::NextLoop {
            self.node_groups.scale_sets().invalidate_all();
            self.metrics
                .cache_invalidations_total
                .with_label_values(&["scale_set", "precondition_failed"])
                .inc();
            outcome(ConflictEnd::GaveUp);
            return WriteEnd::GaveUp;
        }
        let fresh = match self
            .fresh_read(group, resource.as_ref(), "precondition_failed")
            .await
        {
            FreshRead::Read(f) => f,
            FreshRead::Gone => {
                outcome(ConflictEnd::Gone);
                return self.gone(name);
            }
            FreshRead::Failed(e) => {
                outcome(ConflictEnd::GaveUp);
                self.node_groups.set_stale(name, true);
                return self.write_error(name, &e);
            }
        };
        *fresh_capacity.lock() = fresh.capacity;
        let Some(fresh_capacity) = fresh.capacity else {
            outcome(ConflictEnd::GaveUp);
            return WriteEnd::GaveUp;
        };
        let next = match strategy {
            ConflictStrategy::Replan | ConflictStrategy::NextLoop => {
                planner::target_for(group, fresh_capacity, self.demand.as_ref(), (self.clock)())
                    .map(|c| c.to)
            }
            // cluster-autoscaler: a scale-up already reached by someone else is satisfied.
            ConflictStrategy::RetryOnceThenBackoff { .. } => {
                let satisfied = planner::target_for(
                    group,
                    fresh_capacity,
                    self.demand.as_ref(),
                    (self.clock)(),
                )
                .is_none()
                    || (attempted > fresh_capacity.min(attempted) && fresh_capacity >= attempted);
                (!satisfied).then_some(attempted)
            }
        };
        let Some(next) = next else {
            info!(
                scale_set = name,
                capacity = fresh_capacity,
                "fresh capacity already satisfies the plan: no write"
            );
            outcome(ConflictEnd::Skipped);
            return WriteEnd::Satisfied;
        };
        // The retry is a write like the first: the same guards, the same record of a hold.
        let (precondition, result) = match self
            .guarded_send(
                group,
                resource.as_ref(),
                &fresh,
                WriteKind::Capacity,
                |precondition| {
                    let fresh = &fresh;
                    async move { resource.write_capacity(fresh, next, &precondition).await }
                },
            )
            .await
        {
            Sent::Held(_) => {
                outcome(ConflictEnd::GaveUp);
                return WriteEnd::Held;
            }
            Sent::Answered(precondition, result) => (precondition, result),
        };
        self.record_write(name, fresh.capacity, next, write_result(&result));
        match result {
            Ok(acc) => {
                self.write_ok(group, resource, &fresh, next, &precondition, acc);
                outcome(ConflictEnd::RetriedOk);
                WriteEnd::Written
            }
            Err(ArmError::PreconditionFailed { .. }) => {
                self.metrics
                    .capacity_writes_total
                    .with_label_values(&[name, "precondition_failed"])
                    .inc();
                self.invalidate_after_conflict(name);
                outcome(ConflictEnd::GaveUp);
                if let ConflictStrategy::RetryOnceThenBackoff { backoff } = strategy {
                    self.node_groups
                        .set_write_backoff(name, Some(Instant::now() + backoff));
                    warn!(
                        scale_set = name,
                        backoff_secs = backoff.as_secs(),
                        "retry refused again: node group backed off"
                    );
                } else {
                    info!(
                        scale_set = name,
                        "retry refused again (busy writer): re-planning on the next pass"
                    );
                }
                WriteEnd::GaveUp
            }
            Err(e) => {
                if next > fresh_capacity {
                    self.wait_turn(name, &e);
                }
                self.write_error(name, &e)
            }
        }
    }

    /// The scale set no longer exists: forget it, never re-create it.
    fn gone(&self, name: &str) -> WriteEnd {
        warn!(
            scale_set = name,
            "scale set is gone (404): dropped from the cache, not re-created"
        );
        self.node_groups.scale_sets().remove(name);
        self.node_groups.sizes().remove(name);
        self.node_groups.instances().invalidate(name);
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["scale_set", "gone"])
            .inc();
        self.node_groups.adopt_etag(name, None);
        WriteEnd::Failed
    }

    /// The per-class error policy for everything but 412.
    fn write_error(&self, name: &str, e: &ArmError) -> WriteEnd {
        self.metrics
            .capacity_writes_total
            .with_label_values(&[name, e.metric_label()])
            .inc();
        match e {
            ArmError::Throttled {
                retry_after, local, ..
            } => {
                // The gate in ArmClient already holds every call of this class back.
                info!(
                    scale_set = name,
                    retry_after_secs = retry_after.as_secs_f64(),
                    local,
                    "throttled: holding this call class until Retry-After"
                );
                WriteEnd::Held
            }
            ArmError::Allocation {
                failure,
                code,
                message,
                ..
            } => {
                self.node_groups
                    .refused_allocation(name, *failure, code, message);
                WriteEnd::Failed
            }
            ArmError::Ambiguous { .. } => {
                self.node_groups.set_stale(name, true);
                self.node_groups.sizes().invalidate(name);
                self.metrics
                    .cache_invalidations_total
                    .with_label_values(&["size", "ambiguous_write"])
                    .inc();
                warn!(scale_set = name, error = %e, "write outcome unknown: will GET before any further write, never resend blindly");
                self.backoff(name);
                WriteEnd::Failed
            }
            _ => {
                warn!(scale_set = name, error = %e, cause = ?std::error::Error::source(e).map(|s| s.to_string()), "capacity write failed");
                if e.is_retryable() {
                    self.backoff(name);
                }
                WriteEnd::Failed
            }
        }
    }

    /// A write to `name` succeeded: its backoff ends and starts from the base again.
    pub(super) fn clear_backoff(&self, name: &str) {
        self.with_state(name, |s| s.backoff_attempts = 0);
        self.node_groups.set_write_backoff(name, None);
    }

    pub(super) fn backoff(&self, name: &str) {
        let until = self.with_state(name, |s| {
            s.backoff_attempts = s.backoff_attempts.saturating_add(1);
            let exp =
                BACKOFF_BASE.saturating_mul(1 << s.backoff_attempts.min(10).saturating_sub(1));
            Instant::now() + jittered(exp.min(BACKOFF_CAP), 0.2)
        });
        self.node_groups.set_write_backoff(name, Some(until));
    }

    /// Follows the write's `Azure-AsyncOperation` in the background; adopts the final ETag on
    /// success, invalidates caches otherwise.
    fn track_operation(
        self: &Arc<Self>,
        name: &str,
        resource: Arc<dyn CapacityResource>,
        url: String,
        hint: Option<Duration>,
        written: i64,
        adopted: Option<String>,
    ) {
        let this = self.clone();
        let name = name.to_string();
        let mut tasks = self.lro_tasks.lock();
        // Reap finished trackers so the set does not grow.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            let end = this.follow_operation(resource.as_ref(), &url, hint).await;
            this.operation_ended(resource.as_ref(), &name, end, written, adopted)
                .await;
        });
    }

    async fn operation_ended(
        &self,
        resource: &dyn CapacityResource,
        name: &str,
        end: OperationEnd,
        written: i64,
        adopted: Option<String>,
    ) {
        match end {
            OperationEnd::Succeeded => {
                // Adopt the final ETag (ARM may change it when provisioning completes). If the
                // entry moved on meanwhile (a newer write or read), the newer state wins.
                let Ok(Some(fresh)) = resource.get(name).await else {
                    return;
                };
                let ours =
                    self.node_groups.known_etag(name) == adopted && fresh.capacity == Some(written);
                if ours {
                    self.node_groups.adopt_etag(name, fresh.etag.clone());
                } else {
                    self.observe(&fresh);
                }
                let now = Instant::now();
                self.node_groups.scale_sets().upsert(fresh, now);
                debug!(scale_set = name, "operation succeeded; final ETag adopted");
            }
            OperationEnd::Failed(error) => {
                warn!(scale_set = name, %error, "capacity operation failed: caches invalidated, re-reading before the next write");
                if let Some(failure) = error.allocation_failure() {
                    self.node_groups
                        .refused_allocation(name, failure, &error.code, &error.message);
                }
                self.operation_failed(name);
            }
            OperationEnd::Unknown(why) => {
                warn!(scale_set = name, %why, "could not follow the capacity operation to its end: caches invalidated, re-reading before the next write");
                self.operation_failed(name);
            }
        }
    }
    pub(super) fn operation_failed(&self, name: &str) {
        self.node_groups.sizes().invalidate(name);
        self.node_groups.instances().invalidate(name);
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["size", "operation_failed"])
            .inc();
        self.metrics
            .cache_invalidations_total
            .with_label_values(&["instance", "operation_failed"])
            .inc();
        self.node_groups.set_stale(name, true);
    }
}

/// The `capacity_writes_total` result label of a write's answer.
fn write_result(result: &Result<PutAccepted, ArmError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    }
}
