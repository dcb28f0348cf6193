//! The reconcile loop, the ETag protocol and the per-class error policy.
//!
//! One pass: refresh the scale-set cache if its TTL has passed (one LIST per resource group),
//! read sizes through the size cache, plan (pure), and actuate with bounded concurrency, never
//! two writes to one scale set at once. Each write follows ARCHITECTURE.md section 3:
//!
//! - flag on: a sparse PUT with `If-Match: <cached ETag>`; no cached ETag → GET first; still none
//!   → no write (never blind);
//! - success → adopt the returned ETag (keep the old one if none came back: the next write then
//!   gets a 412, which is handled, where clearing it would make that write blind), publish the
//!   size, replace the cache entry copy-on-write, invalidate the instance cache, and track the
//!   long-running operation in the background;
//! - 412 → invalidate the instance and size caches, GET fresh, replace the entry and re-plan with
//!   the fresh capacity: satisfied → `skipped`; otherwise one more write with the fresh ETag
//!   (`retried_ok`), refused again → `gave_up` until the next pass; 404 → `gone` (dropped, never
//!   re-created). A 412 is a re-plan signal, never a backoff;
//! - ambiguous outcome (the answer was lost after the PUT was sent) → mark stale and GET before
//!   any further write; never resend blindly;
//! - 429 closes the `Retry-After` gate of that call class (in [`crate::azure::ArmClient`]); a
//!   scale-up refused by it (or held by the gate) then waits its turn: `Retry-After`, a delay
//!   that shrinks as the scale-up ages, and a random part of up to a second ([`retry`]), so
//!   across a fleet sharing the subscription's bucket no place in the second keeps winning and
//!   the scale-ups that waited longer ask first;
//!   409 `OperationNotAllowed` cools the node group down; 5xx and transport errors back it off
//!   exponentially with jitter; a per-scale-set token bucket keeps writes within Azure's limits.

use crate::azure::budget::{BudgetClass, Pacing};
use crate::azure::throttle::CallClass;
use crate::azure::{ArmClient, ArmError};
use crate::cache::ScaleSet;
use crate::config::{NodeGroupSpec, Settings, WriteBudget};
use crate::fence::{Unfenced, WriteFence};
use crate::hold::{HoldReason, WriteRefusal};
use crate::metrics::Metrics;
use crate::node_groups::{rfc3339, NodeGroups};
use crate::notify::{ControllerEvent, EventSink, GroupStatus, NoEvents, WriteRecord};
use crate::planner::{self, CapacityChange, ConfiguredDemand, DemandSource, Hold};
use crate::resource::Resources;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod delete;
mod operation;
pub mod retry;
mod send;
mod write;

pub use delete::{BulkEnd, DeleteEnd, DeleteKind, DeleteRefusal, LastLook, NoLastLook};
pub use retry::{age_delay, AgeOrdered, RetryTurn, Throttled, AGE_HORIZON};
use send::{Sent, WriteKind};
use write::{FreshRead, WriteEnd};

#[cfg(test)]
mod tests;

/// First backoff after a 5xx or transport error; doubles per failure.
const BACKOFF_BASE: Duration = Duration::from_secs(2);
/// Longest backoff.
const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// How long before a throttled scale-up's turn its pass starts: its reads go first, and the
/// write itself waits for the turn ([`Inner::await_turn`]).
const TURN_LEAD: Duration = Duration::from_secs(1);
/// How long a long-running operation is tracked before giving up on it.
const LRO_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// Shortest interval between two polls of one operation.
const LRO_MIN_POLL: Duration = Duration::from_secs(1);
pub use crate::node_groups::WallClock;

/// Why a reconcile pass failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The scale-set LIST failed, so nothing could be planned from fresh data.
    #[error("refreshing the scale-set cache failed")]
    Refresh(#[source] ArmError),
    /// Some writes failed; the rest of the pass completed.
    #[error("{failed} of {planned} capacity writes failed")]
    Writes {
        /// Writes that ended in an error.
        failed: usize,
        /// Writes planned.
        planned: usize,
    },
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Writes the planner asked for.
    pub planned: usize,
    /// Writes ARM accepted.
    pub written: usize,
    /// 412s met.
    pub conflicts: usize,
    /// Writes that ended in an error.
    pub failed: usize,
    /// Writes not sent (budget, offering unavailable, backoff, gate, no ETag, dry run).
    pub held: usize,
}

#[derive(Debug)]
struct TokenBucket {
    tokens: f64,
    last: Instant,
}

/// What only writing needs of a group. What was observed of it (the ETag known, staleness,
/// foreign writes, the last write and 412, the target, the held reason, the backoff's end) is
/// reported to [`NodeGroups`] and read back from there.
#[derive(Debug)]
struct GroupState {
    in_flight: bool,
    /// Failed writes in a row: how long the next backoff lasts (its end is reported to
    /// [`NodeGroups::set_write_backoff`]).
    backoff_attempts: u32,
    budget: TokenBucket,
    /// The refusal last logged (logged again only when it changes).
    refusal: Option<WriteRefusal>,
    /// When the plan first asked this group for more capacity than it has, while that is still
    /// unmet: the age that orders retries after a 429 (see [`retry`]).
    wanting_since: Option<Instant>,
    /// After a 429 (or the gate it closed) held this group's scale-up: when its turn comes.
    turn_at: Option<Instant>,
    /// When scale-down's look before a drain was granted the budget's probe for this group's
    /// delete (see [`Inner::reserve_hold`]): that delete goes, and no other drain starts for it.
    probe_granted: Option<Instant>,
    /// The budget probe a scale-down delete under way took (granted to its look, or to itself):
    /// given back if the delete ends without being sent.
    probe_taken: Option<Instant>,
}

/// Liveness and readiness, read by `/healthz` and `/readyz`.
#[derive(Debug)]
pub struct Health {
    last_pass: Mutex<Option<Instant>>,
    ready: AtomicBool,
    stale_after: Duration,
}

impl Health {
    fn new(scan_interval: Duration) -> Self {
        Self {
            last_pass: Mutex::new(None),
            ready: AtomicBool::new(false),
            stale_after: (scan_interval * 6).max(Duration::from_secs(60)),
        }
    }

    /// The first full refresh has completed.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// A pass completed recently (or none was due yet since start).
    pub fn live(&self, started: Instant) -> bool {
        let now = Instant::now();
        match *self.last_pass.lock() {
            Some(at) => now.saturating_duration_since(at) < self.stale_after,
            None => now.saturating_duration_since(started) < self.stale_after,
        }
    }
}

/// Builds a [`Reconciler`].
pub struct ReconcilerBuilder {
    settings: Arc<Settings>,
    arm: Arc<ArmClient>,
    metrics: Arc<Metrics>,
    demand: Arc<dyn DemandSource>,
    clock: WallClock,
    dry_run: bool,
    fence: Arc<dyn WriteFence>,
    events: Arc<dyn EventSink>,
    resources: Option<Resources>,
    retry_turn: Arc<dyn RetryTurn>,
}

impl ReconcilerBuilder {
    /// Replaces the resources the groups are backed by (unit tests: a fake resource).
    #[cfg(test)]
    pub(crate) fn resources(mut self, resources: Resources) -> Self {
        self.resources = Some(resources);
        self
    }

    /// The check made immediately before every Azure write (default: none, every write may go).
    /// With leader election it is the Lease: only the leader, freshly renewed, writes.
    pub fn fence(mut self, fence: Arc<dyn WriteFence>) -> Self {
        self.fence = fence;
        self
    }

    /// Where notable moments go (default: nowhere); with Kubernetes, Events.
    pub fn events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = events;
        self
    }

    /// Plans and logs but never writes.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Replaces the demand source (default: schedules and `desiredCapacity`).
    pub fn demand(mut self, demand: Arc<dyn DemandSource>) -> Self {
        self.demand = demand;
        self
    }

    /// Replaces the wall clock the planner reads schedules against.
    pub fn clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces how a throttled scale-up picks when it asks again (default: [`AgeOrdered`];
    /// the fleet benchmark sets the designs it measures beside it).
    pub fn retry_turn(mut self, retry_turn: Arc<dyn RetryTurn>) -> Self {
        self.retry_turn = retry_turn;
        self
    }

    /// The reconciler.
    pub fn build(self) -> Reconciler {
        let settings = self.settings;
        let resources = self
            .resources
            .unwrap_or_else(|| Resources::new(&settings, self.arm.clone()));
        let node_groups = Arc::new(NodeGroups::new(
            settings.clone(),
            resources,
            self.metrics.clone(),
            self.demand.clone(),
            self.clock.clone(),
        ));
        Reconciler {
            inner: Arc::new(Inner {
                node_groups,
                write_slots: Arc::new(Semaphore::new(settings.max_concurrent_writes.max(1))),
                health: Health::new(settings.scan_interval),
                wake: tokio::sync::Notify::new(),
                deletes: tokio::sync::Mutex::new(()),
                demand: self.demand,
                clock: self.clock,
                state: Mutex::new(HashMap::new()),
                lro_tasks: Mutex::new(JoinSet::new()),
                dry_run: self.dry_run,
                fence: self.fence,
                events: self.events,
                retry_turn: self.retry_turn,
                started: Instant::now(),
                arm: self.arm,
                settings,
                metrics: self.metrics,
            }),
        }
    }
}

/// The controller: caches, planner input and the ETag protocol. Dropping it aborts the
/// background operation trackers.
pub struct Reconciler {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Arc<Settings>,
    /// The read side: groups, caches, floors.
    node_groups: Arc<NodeGroups>,
    /// The client the resources write through: its token is fetched before a write is admitted.
    arm: Arc<ArmClient>,
    metrics: Arc<Metrics>,
    demand: Arc<dyn DemandSource>,
    clock: WallClock,
    state: Mutex<HashMap<String, GroupState>>,
    write_slots: Arc<Semaphore>,
    lro_tasks: Mutex<JoinSet<()>>,
    dry_run: bool,
    fence: Arc<dyn WriteFence>,
    events: Arc<dyn EventSink>,
    retry_turn: Arc<dyn RetryTurn>,
    started: Instant,
    health: Health,
    /// Ends the pause between passes early (a closed batch of pending pods).
    wake: tokio::sync::Notify,
    /// One instance deletion at a time: its fresh read, checks and delete are one step.
    deletes: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("node_groups", &self.inner.node_groups)
            .finish_non_exhaustive()
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        // The trackers hold the inner state; aborting them breaks that cycle.
        self.inner.lro_tasks.lock().abort_all();
    }
}

impl Reconciler {
    /// A builder for a reconciler of `settings`, writing through `arm`.
    pub fn builder(
        settings: Arc<Settings>,
        arm: Arc<ArmClient>,
        metrics: Arc<Metrics>,
    ) -> ReconcilerBuilder {
        ReconcilerBuilder {
            settings,
            arm,
            metrics,
            demand: Arc::new(ConfiguredDemand),
            clock: Arc::new(OffsetDateTime::now_utc),
            dry_run: false,
            fence: Arc::new(Unfenced),
            events: Arc::new(NoEvents),
            resources: None,
            retry_turn: Arc::new(AgeOrdered::new()),
        }
    }

    /// Liveness and readiness.
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// Operation trackers still running (tests wait for them).
    pub fn operations_in_flight(&self) -> usize {
        let mut tasks = self.inner.lro_tasks.lock();
        while tasks.try_join_next().is_some() {}
        tasks.len()
    }

    /// The node groups and what Azure last said of them (the read side).
    pub fn node_groups(&self) -> &Arc<NodeGroups> {
        &self.inner.node_groups
    }

    /// Starts the next pass now instead of after the scan interval (at most one pass is
    /// pending: wakes while a pass runs start the next one as soon as it ends).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Forgets `group`'s size and instances (a delete was seen to have happened after its
    /// outcome was unknown): the next read is fresh, and the entry is re-read before a write.
    pub fn invalidate_size(&self, group: &str) {
        self.inner.node_groups.sizes().invalidate(group);
        self.inner.node_groups.instances().invalidate(group);
        self.inner.node_groups.set_stale(group, true);
    }

    /// Reads `name`'s resource afresh now (one GET) and forgets its instances: a node of the
    /// group vanished without a delete of ours in view (a spot eviction, an operator), so the
    /// size as cached may count a VM that is gone, and pods would wait for it as "on its way".
    /// A failed read only logs: the entry is then re-read at its TTL.
    pub async fn reread(&self, name: &str, reason: &str) {
        let groups = self.inner.node_groups.groups();
        let Some(group) = groups.iter().find(|g| g.name == name) else {
            return;
        };
        let resource = self.inner.node_groups.resource(group);
        let node_groups = &self.inner.node_groups;
        let before = node_groups.scale_sets().get(name);
        // A write or delete of ours under way explains a shrink by itself: only without one is a
        // spot group's shrink Azure's eviction.
        let ours = self.inner.deletes.try_lock().is_err()
            || self
                .inner
                .state
                .lock()
                .get(name)
                .is_some_and(|s| s.in_flight);
        node_groups.instances().invalidate(name);
        self.inner
            .metrics
            .cache_invalidations_total
            .with_label_values(&["instance", reason])
            .inc();
        let fresh = match self
            .inner
            .fresh_read(group, resource.as_ref(), reason)
            .await
        {
            FreshRead::Read(fresh) => fresh,
            FreshRead::Gone => return,
            FreshRead::Failed(e) => {
                warn!(scale_set = name, reason, error = %e, "could not read the node group afresh; its cache entry is read again at its TTL");
                return;
            }
        };
        let Some(before) = before.map(|b| b.scale_set.clone()) else {
            return;
        };
        let spot = fresh.offering().is_some_and(|o| o.spot);
        if let (false, true, Some(was), Some(now)) = (ours, spot, before.capacity, fresh.capacity) {
            if now < was && fresh.etag != before.etag {
                let evicted = was - now;
                self.inner
                    .metrics
                    .spot_evictions_total
                    .with_label_values(&[name])
                    .inc_by(evicted.unsigned_abs());
                node_groups.mark_unavailable(
                    name,
                    crate::capacity::AllocationFailure::SpotEvicted,
                    &format!("{evicted} spot VM(s) evicted by Azure: capacity {was} -> {now} with no delete of ours"),
                );
            }
        }
    }

    /// When the process started (for liveness).
    pub fn started(&self) -> Instant {
        self.inner.started
    }

    /// Each node group as the reconciler sees it now (what the leader writes to the status
    /// ConfigMap): bounds, the planned target, capacity and ETag, the last write and the last
    /// 412 with their outcomes, foreign writes, backoff, an unavailable offering, and why writes are held.
    pub fn status(&self) -> Vec<GroupStatus> {
        self.inner.node_groups.status()
    }

    /// Runs passes every `scanInterval` (jittered) until `shutdown` is cancelled; a pass under
    /// way when it is gets `shutdownGrace` to finish its writes.
    pub async fn run(&self, shutdown: CancellationToken) {
        let settings = self.inner.settings.clone();
        loop {
            let pass = self.run_once();
            tokio::pin!(pass);
            tokio::select! {
                result = &mut pass => self.log_pass(result),
                _ = shutdown.cancelled() => {
                    info!(grace_secs = settings.shutdown_grace.as_secs(), "shutdown: letting the pass in flight finish");
                    match tokio::time::timeout(settings.shutdown_grace, pass).await {
                        Ok(result) => self.log_pass(result),
                        Err(_) => warn!("shutdown grace expired with writes in flight; their outcome will be read on the next start"),
                    }
                    break;
                }
            }
            let now = Instant::now();
            let pause = jittered(settings.scan_interval, 0.1);
            let pause = self
                .inner
                .retry_wait(now)
                .map_or(pause, |retry| retry.min(pause));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.inner.wake.notified() => debug!("woken before the scan interval"),
                _ = shutdown.cancelled() => break,
            }
        }
        self.inner.lro_tasks.lock().abort_all();
        info!("reconciler stopped");
    }

    fn log_pass(&self, result: Result<PassReport, ReconcileError>) {
        match result {
            Ok(r) => debug!(
                planned = r.planned,
                written = r.written,
                conflicts = r.conflicts,
                held = r.held,
                "pass done"
            ),
            Err(e) => {
                warn!(error = %e, cause = ?std::error::Error::source(&e).map(|s| s.to_string()), "pass failed")
            }
        }
    }

    /// One refresh + plan + actuate pass.
    pub async fn run_once(&self) -> Result<PassReport, ReconcileError> {
        self.inner.clone().run_once().await
    }
}

impl Inner {
    fn groups(&self) -> Arc<Vec<NodeGroupSpec>> {
        self.node_groups.groups()
    }

    /// Records a write that was sent and its `capacity_writes_total` result (status snapshot).
    fn record_write(&self, name: &str, from: Option<i64>, to: i64, result: &str) {
        let record = WriteRecord {
            at: rfc3339(OffsetDateTime::now_utc()),
            from,
            to,
            result: result.to_string(),
        };
        self.node_groups.wrote(name, record);
    }

    async fn run_once(self: Arc<Self>) -> Result<PassReport, ReconcileError> {
        let started = Instant::now();
        let result = self.clone().pass().await;
        self.metrics
            .reconcile_duration_seconds
            .with_label_values::<&str>(&[])
            .observe(started.elapsed().as_secs_f64());
        *self.health.last_pass.lock() = Some(Instant::now());
        match &result {
            Ok(_) => {
                self.metrics
                    .reconcile_total
                    .with_label_values(&["ok"])
                    .inc();
                let unix = OffsetDateTime::now_utc().unix_timestamp_nanos() as f64 / 1e9;
                self.metrics
                    .last_successful_reconcile_timestamp_seconds
                    .set(unix);
            }
            Err(_) => self
                .metrics
                .reconcile_total
                .with_label_values(&["error"])
                .inc(),
        }
        result
    }

    async fn pass(self: Arc<Self>) -> Result<PassReport, ReconcileError> {
        // Passes come every scanInterval, so "due" is judged at the pass nearest the TTL rather
        // than the first one after it: one LIST per TTL, not one per TTL + scanInterval.
        // Below the reserve of the reads budget Azure reports, refreshes come less often.
        let stretch = Pacing {
            reserve: self.settings.arm_budget_reserve,
        }
        .stretch(self.arm.budget().fraction(BudgetClass::Reads));
        let ttl = self.settings.vmss_cache_ttl.mul_f64(stretch);
        let due_at = ttl.saturating_sub((self.settings.scan_interval / 2).min(ttl / 2));
        if self
            .node_groups
            .scale_sets()
            .refresh_due(due_at, Instant::now())
        {
            match self.refresh_all().await {
                Ok(()) => {}
                // Throttled after a first full refresh: plan on the cached view, as
                // cluster-autoscaler does; every write still carries its cached ETag, so a
                // stale one ends in a 412 and a fresh read, never in a lost update. The LIST is
                // tried again once its gate opens.
                Err(ArmError::Throttled { retry_after, .. })
                    if self.health.ready.load(Ordering::Acquire) =>
                {
                    debug!(
                        retry_after_secs = retry_after.as_secs(),
                        "refresh throttled: planning on the cached view"
                    );
                }
                Err(e) => return Err(ReconcileError::Refresh(e)),
            }
        }
        let groups = self.node_groups.with_floors(self.groups());
        let now = Instant::now();
        let observed: HashMap<String, Option<i64>> = groups
            .iter()
            .map(|g| (g.name.clone(), self.node_groups.target_size(&g.name)))
            .collect();
        let in_flight: HashSet<String> = self
            .state
            .lock()
            .iter()
            .filter(|(_, s)| s.in_flight)
            .map(|(n, _)| n.clone())
            .collect();
        let wall = (self.clock)();
        let plan = planner::plan(&groups, &observed, &in_flight, self.demand.as_ref(), wall);
        self.node_groups
            .publish_plan(&groups, &plan.held, &plan.changes, now);
        for (name, hold, _) in &plan.held {
            if *hold == Hold::UnknownSize {
                debug!(scale_set = %name, "size unknown (scale set not found or no capacity): no write");
            }
        }

        let mut report = PassReport {
            planned: plan.changes.len(),
            ..PassReport::default()
        };
        let by_name: HashMap<&str, &NodeGroupSpec> =
            groups.iter().map(|g| (g.name.as_str(), g)).collect();
        self.note_wants(&plan.changes, &observed, &in_flight, now);
        let mut tasks = JoinSet::new();
        for change in plan.changes {
            let Some(group) = by_name.get(change.scale_set.as_str()).map(|g| (*g).clone()) else {
                continue;
            };
            if !self.claim(&group.name) {
                continue;
            }
            let this = self.clone();
            tasks.spawn(async move {
                // Closed only if the semaphore is dropped, which cannot happen while `this` lives.
                let _permit = this.write_slots.clone().acquire_owned().await;
                let end = this.clone().write(&group, change).await;
                this.release(&group.name);
                if matches!(end.0, WriteEnd::Written | WriteEnd::Satisfied) {
                    this.with_state(&group.name, |s| {
                        s.wanting_since = None;
                        s.turn_at = None;
                    });
                }
                end
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let (end, conflicted) = match joined {
                Ok(r) => r,
                Err(e) => {
                    warn!(error = %e, "write task failed");
                    (WriteEnd::Failed, false)
                }
            };
            report.conflicts += usize::from(conflicted);
            match end {
                WriteEnd::Written => report.written += 1,
                WriteEnd::Satisfied => {}
                WriteEnd::Held => report.held += 1,
                WriteEnd::Failed | WriteEnd::GaveUp => report.failed += 1,
            }
        }
        // After the writes, so listing instances or usages never delays a capacity change.
        self.node_groups.refresh_instances(&groups, stretch).await;
        self.node_groups.refresh_quota(stretch).await;
        if report.failed > 0 {
            return Err(ReconcileError::Writes {
                failed: report.failed,
                planned: report.planned,
            });
        }
        Ok(report)
    }

    /// Keeps each group's `wanting_since`: set when the plan first asks for more than the group
    /// has, cleared once it no longer does (a write in flight keeps what it had).
    fn note_wants(
        &self,
        changes: &[CapacityChange],
        observed: &HashMap<String, Option<i64>>,
        in_flight: &HashSet<String>,
        now: Instant,
    ) {
        let grows: HashSet<&str> = changes
            .iter()
            .filter(|c| {
                c.to > observed
                    .get(&c.scale_set)
                    .copied()
                    .flatten()
                    .unwrap_or(c.from)
            })
            .map(|c| c.scale_set.as_str())
            .collect();
        let mut state = self.state.lock();
        for name in &grows {
            if !state.contains_key(*name) {
                state.insert(name.to_string(), self.new_group_state(name));
            }
        }
        for (name, s) in state.iter_mut() {
            if in_flight.contains(name) {
                continue;
            }
            if grows.contains(name.as_str()) {
                s.wanting_since.get_or_insert(now);
            } else {
                s.wanting_since = None;
                s.turn_at = None;
            }
        }
    }

    /// How long until the pass of the first scale-up waiting its turn after a 429 starts
    /// ([`TURN_LEAD`] before its turn, or at its turn when that lead has passed: a pass for
    /// another group's turn may have held it): it is woken then rather than at the next scan.
    /// `None` when none waits.
    fn retry_wait(&self, now: Instant) -> Option<Duration> {
        self.state
            .lock()
            .values()
            .filter(|s| s.wanting_since.is_some())
            .filter_map(|s| s.turn_at)
            .filter(|t| *t > now)
            .map(|t| t.checked_sub(TURN_LEAD).filter(|w| *w > now).unwrap_or(t))
            .min()
            .map(|t| t - now)
    }

    /// A scale-up of `name` ended in `e`: when that is a throttle (Azure's 429, or the gate one
    /// closed), its turn comes after `Retry-After`, as [`RetryTurn`] picks it.
    fn wait_turn(&self, name: &str, e: &ArmError) {
        let ArmError::Throttled { retry_after, .. } = e else {
            return;
        };
        let retry_after = *retry_after;
        let now = Instant::now();
        let scan = self.settings.scan_interval;
        // The gate may already stand later than this answer's Retry-After (it never shortens).
        let gate = self.arm.gates().closed_for(CallClass::Write, now);
        let retry_after = gate.map_or(retry_after, |g| g.max(retry_after));
        let mut state = self.state.lock();
        let s = state
            .entry(name.to_string())
            .or_insert_with(|| self.new_group_state(name));
        // A scale-up the plan asked for is wanted from now on, if `note_wants` had not seen it
        // yet, so `retry_wait` wakes the pass for its turn.
        let since = *s.wanting_since.get_or_insert(now);
        let wanting = || {
            state
                .iter()
                .filter_map(|(n, s)| Some((s.wanting_since?, n)))
        };
        let oldest = wanting().map(|(w, _)| w).min().unwrap_or(since);
        let rank = wanting()
            .filter(|&(w, n)| (w, n.as_str()) < (since, name))
            .count();
        let turn = self.retry_turn.turn(&Throttled {
            now,
            retry_after,
            since,
            oldest,
            rank,
            scan_interval: scan,
        });
        // Never before Retry-After, whatever the design.
        let turn = turn.max(now + retry_after);
        if let Some(s) = state.get_mut(name) {
            s.turn_at = Some(turn);
        }
        drop(state);
        info!(
            scale_set = name,
            turn_in_secs = (turn - now).as_secs_f64(),
            "scale-up throttled: waiting its turn (Retry-After, less of a delay the longer it has waited, and a random part)"
        );
    }

    /// A throttled scale-up's write, let through [`TURN_LEAD`] before its turn, leaves at its
    /// turn (no longer than the lead: a turn set meanwhile can only be later, and holds the next
    /// write).
    async fn await_turn(&self, name: &str) {
        let now = Instant::now();
        if let Some(t) = self.with_state(name, |s| s.turn_at) {
            tokio::time::sleep(t.saturating_duration_since(now).min(TURN_LEAD)).await;
        }
    }

    /// `Some(RetryTurn)` while a scale-up of `name` waits its turn after a 429, until
    /// [`TURN_LEAD`] before it (the write then waits for its turn, [`Inner::await_turn`]).
    fn turn_hold(&self, name: &str) -> Option<HoldReason> {
        let now = Instant::now();
        self.with_state(name, |s| s.turn_at.is_some_and(|t| t > now + TURN_LEAD))
            .then_some(HoldReason::RetryTurn)
    }

    fn claim(&self, name: &str) -> bool {
        let mut state = self.state.lock();
        let s = state
            .entry(name.to_string())
            .or_insert_with(|| self.new_group_state(name));
        if s.in_flight {
            return false;
        }
        s.in_flight = true;
        true
    }

    fn release(&self, name: &str) {
        if let Some(s) = self.state.lock().get_mut(name) {
            s.in_flight = false;
        }
    }

    /// The write budget of node group `name`: its kind's ([`Settings::write_budget_of`]); a
    /// scale set's for a name no group has.
    fn write_budget_of(&self, name: &str) -> WriteBudget {
        self.groups()
            .iter()
            .find(|g| g.name == name)
            .map_or(self.settings.write_budget, |g| {
                self.settings.write_budget_of(&g.kind)
            })
    }

    fn new_group_state(&self, name: &str) -> GroupState {
        GroupState {
            in_flight: false,
            backoff_attempts: 0,
            refusal: None,
            wanting_since: None,
            turn_at: None,
            probe_granted: None,
            probe_taken: None,
            budget: TokenBucket {
                tokens: f64::from(self.write_budget_of(name).burst),
                last: Instant::now(),
            },
        }
    }

    fn with_state<R>(&self, name: &str, f: impl FnOnce(&mut GroupState) -> R) -> R {
        let mut state = self.state.lock();
        let s = state
            .entry(name.to_string())
            .or_insert_with(|| self.new_group_state(name));
        f(s)
    }

    /// Records what a read showed; counts an ETag change we did not cause as a foreign write.
    fn observe(&self, fresh: &ScaleSet) {
        let Some(etag) = fresh.etag.clone() else {
            return;
        };
        let managed = self.groups().iter().any(|g| g.name == fresh.name);
        let foreign = self.node_groups.saw_etag(&fresh.name, &etag, managed);
        if foreign && managed {
            self.metrics
                .foreign_writes_total
                .with_label_values(&[&fresh.name])
                .inc();
            info!(scale_set = %fresh.name, etag = %etag, capacity = ?fresh.capacity, "foreign write: another writer changed the scale set");
            self.events.record(ControllerEvent::ForeignWrite {
                group: fresh.name.clone(),
                etag: etag.clone(),
                capacity: fresh.capacity,
            });
        }
    }

    /// One LIST per source, through the node groups; every ETag seen is observed (foreign
    /// writes), refusals are said at once, and the listing becomes the cached view.
    async fn refresh_all(&self) -> Result<(), ArmError> {
        let listing = self.node_groups.list().await?;
        for s in &listing.listed {
            self.observe(s);
        }
        let present = self.node_groups.adopt(listing);
        // Say at once (not only when a write is planned) which groups will never be written.
        let snapshot = self.node_groups.scale_sets().snapshot();
        for g in self.groups().iter() {
            if let Some(entry) = snapshot.get(&g.name) {
                self.refused(g, self.node_groups.resource(g).as_ref(), &entry.scale_set);
            }
        }
        if !self.health.ready.swap(true, Ordering::AcqRel) {
            info!(
                node_groups = present.len(),
                "first full refresh done: ready"
            );
        }
        Ok(())
    }
}

/// `d` plus or minus `fraction` of it, at random.
fn jittered(d: Duration, fraction: f64) -> Duration {
    let f = 1.0 + fraction * (rand::random::<f64>() * 2.0 - 1.0);
    d.mul_f64(f.max(0.0))
}
