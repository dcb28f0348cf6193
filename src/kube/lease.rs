//! Leader election on a `coordination.k8s.io/v1` Lease, with Kubernetes' own optimistic
//! concurrency and fencing at the write path.
//!
//! client-go's algorithm (`tryAcquireOrRenew`) with one difference that matters: every acquire
//! and renew is an **update carrying the `resourceVersion` that was read**, so two candidates
//! cannot both win. The API server refuses the second update with 409 Conflict, and the loser
//! re-reads on its next attempt. (kube-lease-manager and kube-leader-election renew without that
//! precondition, which is why this is written here.) Expiry is judged like client-go: by the
//! local monotonic time at which this replica first saw the Lease's current version, never by
//! the timestamps in it, so clock skew between nodes cannot shorten a lease.
//!
//! [`Leadership`] is the [`WriteFence`]: it lets a write go only while this replica holds the
//! Lease and its last successful renewal started less than `renewDeadline` ago on the monotonic
//! clock. A replica frozen past that (SIGSTOP, a partition from the API server) stops writing
//! before anyone else could have acquired the Lease (`renewDeadline` < `leaseDuration`), and a
//! replica that wakes up after losing it sends nothing, even before it has noticed.

use crate::fence::{FenceHold, InFlight, WriteFence, WritePermit};
use crate::notify::{ControllerEvent, EventSink};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What the leader election is told (config `kubernetes.leaderElection`, plus the identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (the pod name plus a random suffix).
    pub identity: String,
    /// How long a Lease is valid after its last renewal (cluster-autoscaler: 15 s).
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up leading (10 s).
    pub renew_deadline: Duration,
    /// Time between attempts (2 s).
    pub retry_period: Duration,
}

/// Why a Lease call failed, as far as the election cares.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// 409 Conflict: the `resourceVersion` sent is stale; somebody else wrote the Lease.
    #[error("409 Conflict: the Lease changed since it was read")]
    Conflict,
    /// 409 AlreadyExists on create: another candidate created it first.
    #[error("409 AlreadyExists: another candidate created the Lease")]
    AlreadyExists,
    /// Anything else (the API server down, 403, a timeout).
    #[error("{0}")]
    Other(String),
}

/// The three Lease calls the election makes. Implemented on the API server by kube-rs
/// ([`crate::kube::KubeLeases`]) and in tests by an in-memory store with the server's rules.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync {
    /// GET; `Ok(None)` on 404.
    async fn get(&self) -> Result<Option<Lease>, LeaseError>;
    /// CREATE.
    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError>;
    /// UPDATE (PUT) carrying `lease.metadata.resourceVersion`.
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError>;
}

/// Whether this replica leads, and since when it last renewed: the write fence.
#[derive(Debug)]
pub struct Leadership {
    identity: String,
    renew_deadline: Duration,
    /// How long the Lease is valid after a renewal: bounds how long an admitted write may be out.
    lease_duration: Duration,
    leader: AtomicBool,
    /// When the last successful acquire or renew was *sent* (conservative for fencing).
    renewed_at: Mutex<Option<Instant>>,
    transitions: AtomicU64,
    /// The first attempt has completed (either way): a standby is ready to lead.
    settled: AtomicBool,
    /// Azure writes admitted and not yet answered: a release waits for them.
    in_flight: Arc<InFlight>,
}

impl Leadership {
    fn new(identity: &str, renew_deadline: Duration, lease_duration: Duration) -> Self {
        Self {
            identity: identity.to_string(),
            renew_deadline,
            lease_duration,
            leader: AtomicBool::new(false),
            renewed_at: Mutex::new(None),
            transitions: AtomicU64::new(0),
            settled: AtomicBool::new(false),
            in_flight: Arc::new(InFlight::default()),
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether this replica believes it holds the Lease (the fence also checks the renewal age).
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// How often this replica became or stopped being the leader.
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }

    /// The election has talked to the API server at least once: this replica leads, or it
    /// knows who does and stands by ready to take over.
    pub fn settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }
}

impl WriteFence for Leadership {
    fn check(&self) -> Result<(), FenceHold> {
        if !self.is_leader() {
            return Err(FenceHold::NotLeader);
        }
        match *self.renewed_at.lock() {
            Some(at) if at.elapsed() < self.renew_deadline => Ok(()),
            _ => Err(FenceHold::RenewalStale),
        }
    }

    fn valid_for(&self) -> Option<Duration> {
        if !self.is_leader() {
            return Some(Duration::ZERO);
        }
        // Dated by when the renewal was sent: a standby that saw it dates it later, never
        // earlier, so it waits at least this long before it takes over.
        let Some(renewed) = *self.renewed_at.lock() else {
            return Some(Duration::ZERO);
        };
        let until = renewed + self.lease_duration;
        Some(
            until
                .saturating_duration_since(Instant::now())
                .saturating_sub(crate::fence::VALIDITY_MARGIN),
        )
    }

    fn admit(&self) -> Result<WritePermit, FenceHold> {
        // Counted first, then checked: see `InFlight::enter`.
        let guard = self.in_flight.enter();
        self.check()?;
        Ok(InFlight::permit(guard))
    }
}

/// One candidate in the election.
pub struct LeaderElection {
    config: LeaseConfig,
    store: Arc<dyn LeaseStore>,
    state: Arc<Leadership>,
    events: Arc<dyn EventSink>,
    /// The Lease version last seen and when (monotonic) it was first seen: expiry is judged
    /// from that, never from the timestamps inside the Lease.
    observed: Mutex<Option<(Option<String>, Instant)>>,
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection")
            .field("config", &self.config)
            .field("leader", &self.state.is_leader())
            .finish_non_exhaustive()
    }
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `leaseDurationSeconds`: rounded up, so a standby never counts a shorter lease than the
/// leader's fence assumes (configuration allows whole seconds only; this is the backstop).
fn secs(d: Duration) -> i32 {
    let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(whole.max(1)).unwrap_or(i32::MAX)
}

impl LeaderElection {
    /// A candidate for `config.name` through `store`, reporting transitions to `events`.
    pub fn new(
        config: LeaseConfig,
        store: Arc<dyn LeaseStore>,
        events: Arc<dyn EventSink>,
    ) -> Self {
        let state = Arc::new(Leadership::new(
            &config.identity,
            config.renew_deadline,
            config.lease_duration,
        ));
        Self {
            config,
            store,
            state,
            events,
            observed: Mutex::new(None),
        }
    }

    /// The fence and the readiness view of this candidate.
    pub fn leadership(&self) -> Arc<Leadership> {
        self.state.clone()
    }

    fn set_leader(&self, leader: bool) {
        let was = self.state.leader.swap(leader, Ordering::AcqRel);
        if was == leader {
            return;
        }
        self.state.transitions.fetch_add(1, Ordering::Relaxed);
        let identity = self.config.identity.clone();
        if leader {
            info!(lease = %self.config.name, %identity, "acquired the lease: leading");
            self.events
                .record(ControllerEvent::LeadershipGained { identity });
        } else {
            warn!(lease = %self.config.name, %identity, "lost the lease: no more Azure writes from this replica");
            *self.state.renewed_at.lock() = None;
            self.events
                .record(ControllerEvent::LeadershipLost { identity });
        }
    }

    /// When this replica first saw version `rv` of the Lease.
    fn observed_at(&self, rv: &Option<String>, now: Instant) -> Instant {
        let mut o = self.observed.lock();
        match &*o {
            Some((seen, at)) if seen == rv => *at,
            _ => {
                *o = Some((rv.clone(), now));
                now
            }
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = now_micro();
        let ours = previous
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| h == self.config.identity);
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(secs(self.config.lease_duration)),
            acquire_time: if ours {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` when this replica holds the Lease after it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, LeaseError> {
        let sent_at = Instant::now();
        // Bounded by the renew deadline, as client-go bounds each renewal: a call stuck on an
        // API server that is down must not hold the loop past the moment it matters.
        let result =
            match tokio::time::timeout(self.config.renew_deadline, self.attempt(sent_at)).await {
                Ok(r) => r,
                Err(_) => Err(LeaseError::Other(format!(
                    "lease call took longer than the renew deadline ({:?})",
                    self.config.renew_deadline
                ))),
            };
        self.state.settled.store(true, Ordering::Release);
        match &result {
            Ok(true) => {
                *self.state.renewed_at.lock() = Some(sent_at);
                self.set_leader(true);
            }
            Ok(false) => self.set_leader(false),
            // A failed call proves nothing either way: the renew deadline decides.
            Err(e) => debug!(lease = %self.config.name, error = %e, "lease call failed"),
        }
        result
    }

    /// `sent`: when this attempt started (a renewal of ours counts from then: the leader's fence
    /// must close early rather than late). A version held by another replica is dated by when its
    /// GET *answered*, as client-go dates it: a GET queued for seconds (API priority and
    /// fairness) may show a renewal made long after it was sent, and dating that by the send
    /// would expire the other leader's lease early, while its fence is still open.
    async fn attempt(&self, sent: Instant) -> Result<bool, LeaseError> {
        let current = self.store.get().await?;
        let now = Instant::now();
        let Some(current) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None)),
            };
            return match self.store.create(&lease).await {
                Ok(created) => {
                    self.observed_at(&created.metadata.resource_version, sent);
                    Ok(true)
                }
                Err(LeaseError::AlreadyExists) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = current.metadata.resource_version.clone();
        let seen_at = self.observed_at(&rv, now);
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.config.lease_duration);
        let ours = holder == Some(self.config.identity.as_str());
        if let Some(other) = holder.filter(|_| !ours) {
            if now < seen_at + duration {
                debug!(lease = %self.config.name, holder = other, "lease held by another replica");
                return Ok(false);
            }
            info!(lease = %self.config.name, holder = other, "lease expired: taking over");
        }
        let mut next = current.clone();
        next.spec = Some(self.spec(Some(&spec)));
        match self.store.replace(&next).await {
            Ok(written) => {
                self.observed_at(&written.metadata.resource_version, sent);
                Ok(true)
            }
            // Someone else wrote the Lease between our read and our update: they won.
            Err(LeaseError::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Tries every `retryPeriod` (jittered) until `shutdown`; a leader that cannot renew within
    /// `renewDeadline` steps down. On shutdown a leader releases the Lease (clears the holder) so
    /// a standby takes over within one retry period instead of a lease duration.
    pub async fn run(&self, shutdown: CancellationToken) {
        loop {
            let _ = self.try_acquire_or_renew().await;
            if self.state.is_leader() && self.state.check() == Err(FenceHold::RenewalStale) {
                warn!(lease = %self.config.name, "could not renew within the renew deadline: stepping down");
                self.set_leader(false);
            }
            let pause = jitter(self.config.retry_period);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        self.release().await;
    }

    /// Clears the holder if this replica holds the Lease (an update carrying the
    /// `resourceVersion` read, like every other write).
    pub async fn release(&self) {
        if !self.state.is_leader() {
            return;
        }
        // Close the fence, then let the writes it admitted finish: one that passed the fence a
        // moment ago must land while the Lease still names us, not after a successor took over.
        self.set_leader(false);
        if !self
            .state
            .in_flight
            .drained(self.config.renew_deadline)
            .await
        {
            warn!(lease = %self.config.name, writes = self.state.in_flight.count(), "Azure writes still unanswered after the renew deadline: not releasing the lease; it expires on its own");
            return;
        }
        let Ok(Some(current)) = self.store.get().await else {
            return;
        };
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let mut next = current.clone();
        next.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(now_micro()),
            ..spec
        });
        match self.store.replace(&next).await {
            Ok(_) => info!(lease = %self.config.name, "lease released"),
            Err(e) => {
                warn!(lease = %self.config.name, error = %e, "could not release the lease; it expires on its own")
            }
        }
    }
}

/// `d` plus up to 20 % (client-go's JitterFactor is 1.2 for the retry period).
fn jitter(d: Duration) -> Duration {
    d.mul_f64(1.0 + 0.2 * rand::random::<f64>())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::notify::NoEvents;

    /// A Lease store with the API server's rules: one object, a resourceVersion bumped on every
    /// write, create of an existing name → AlreadyExists, update with a stale version → Conflict.
    #[derive(Default)]
    pub(crate) struct MemoryLeases {
        pub lease: Mutex<Option<Lease>>,
        pub version: AtomicU64,
        pub down: AtomicBool,
    }

    impl MemoryLeases {
        fn up(&self) -> Result<(), LeaseError> {
            if self.down.load(Ordering::SeqCst) {
                Err(LeaseError::Other("connection refused".into()))
            } else {
                Ok(())
            }
        }

        fn stamp(&self, mut lease: Lease) -> Lease {
            let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
            lease.metadata.resource_version = Some(v.to_string());
            lease
        }

        pub fn holder(&self) -> Option<String> {
            self.lease
                .lock()
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.clone())
        }
    }

    #[async_trait::async_trait]
    impl LeaseStore for MemoryLeases {
        async fn get(&self) -> Result<Option<Lease>, LeaseError> {
            self.up()?;
            Ok(self.lease.lock().clone())
        }
        async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.up()?;
            let mut slot = self.lease.lock();
            if slot.is_some() {
                return Err(LeaseError::AlreadyExists);
            }
            let stored = self.stamp(lease.clone());
            *slot = Some(stored.clone());
            Ok(stored)
        }
        async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.up()?;
            let mut slot = self.lease.lock();
            let current = slot
                .as_ref()
                .and_then(|l| l.metadata.resource_version.clone());
            if lease.metadata.resource_version.is_none()
                || lease.metadata.resource_version != current
            {
                return Err(LeaseError::Conflict);
            }
            let stored = self.stamp(lease.clone());
            *slot = Some(stored.clone());
            Ok(stored)
        }
    }

    /// [`MemoryLeases`] behind an API server whose GETs wait `delay` in a queue before they are
    /// served (the answer shows the Lease as it is when served, not when sent).
    struct QueuedGets {
        inner: Arc<MemoryLeases>,
        delay: Mutex<Duration>,
    }

    #[async_trait::async_trait]
    impl LeaseStore for QueuedGets {
        async fn get(&self) -> Result<Option<Lease>, LeaseError> {
            let delay = *self.delay.lock();
            tokio::time::sleep(delay).await;
            self.inner.get().await
        }
        async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.inner.create(lease).await
        }
        async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
            self.inner.replace(lease).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_whose_get_was_queued_dates_the_lease_by_the_answer_and_never_takes_over_while_the_leaders_fence_is_open(
    ) {
        let store = Arc::new(MemoryLeases::default());
        let a = candidate(&store, "a");
        let slow = Arc::new(QueuedGets {
            inner: store.clone(),
            delay: Mutex::new(Duration::from_secs(5)),
        });
        let b = Arc::new(LeaderElection::new(
            candidate(&store, "b").config.clone(),
            slow.clone(),
            Arc::new(NoEvents),
        ));
        assert_eq!(a.try_acquire_or_renew().await, Ok(true));
        // b's GET is sent now and served in 5 s; a renews just before it is served, then
        // freezes (no more renewals).
        let asking = {
            let b = b.clone();
            tokio::spawn(async move { b.try_acquire_or_renew().await })
        };
        tokio::time::sleep(Duration::from_millis(4900)).await;
        assert_eq!(a.try_acquire_or_renew().await, Ok(true));
        // The last moment a write of a's may still be on the wire: its fence's deadline.
        let fence_open_until =
            Instant::now() + a.leadership().valid_for().expect("a leader's validity");
        assert_eq!(asking.await.unwrap(), Ok(false), "a renewed: b must wait");
        *slow.delay.lock() = Duration::ZERO;
        let taken_at = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if b.try_acquire_or_renew().await == Ok(true) {
                break Instant::now();
            }
            assert!(Instant::now() < fence_open_until + Duration::from_secs(60));
        };
        assert!(
            taken_at >= fence_open_until,
            "b took over {:?} before a's fence closed",
            fence_open_until - taken_at
        );
    }

    #[test]
    fn lease_duration_seconds_are_rounded_up_never_down() {
        assert_eq!(secs(Duration::from_millis(15_500)), 16);
        assert_eq!(secs(Duration::from_secs(15)), 15);
        assert_eq!(secs(Duration::from_millis(200)), 1);
    }

    fn candidate(store: &Arc<MemoryLeases>, id: &str) -> LeaderElection {
        LeaderElection::new(
            LeaseConfig {
                name: "vmss-capacity-controller".into(),
                identity: id.into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
            store.clone(),
            Arc::new(NoEvents),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn of_two_candidates_exactly_one_leads_and_the_fence_follows() {
        let store = Arc::new(MemoryLeases::default());
        let (a, b) = (candidate(&store, "a"), candidate(&store, "b"));
        assert_eq!(a.try_acquire_or_renew().await, Ok(true));
        assert_eq!(b.try_acquire_or_renew().await, Ok(false));
        assert_eq!(a.leadership().check(), Ok(()));
        assert_eq!(b.leadership().check(), Err(FenceHold::NotLeader));
        assert_eq!(store.holder().as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_closes_the_fence_at_once_but_clears_the_holder_only_after_the_write_in_flight_is_answered(
    ) {
        let store = Arc::new(MemoryLeases::default());
        let a = Arc::new(candidate(&store, "a"));
        a.try_acquire_or_renew().await.unwrap();
        let permit = a.leadership().admit().expect("the leader may write");
        let releasing = {
            let a = a.clone();
            tokio::spawn(async move { a.release().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(a.leadership().admit().err(), Some(FenceHold::NotLeader));
        assert_eq!(
            store.holder().as_deref(),
            Some("a"),
            "released while a write that passed the fence was still out"
        );
        drop(permit);
        releasing.await.unwrap();
        assert_eq!(store.holder(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_never_returns_keeps_the_lease_until_it_expires_instead_of_releasing_it() {
        let store = Arc::new(MemoryLeases::default());
        let a = candidate(&store, "a");
        a.try_acquire_or_renew().await.unwrap();
        let _stuck = a.leadership().admit().unwrap();
        a.release().await;
        assert_eq!(store.holder().as_deref(), Some("a"));
        assert_eq!(a.leadership().check(), Err(FenceHold::NotLeader));
    }

    #[tokio::test(start_paused = true)]
    async fn two_updates_from_the_same_read_cannot_both_win() {
        let store = Arc::new(MemoryLeases::default());
        let a = candidate(&store, "a");
        a.try_acquire_or_renew().await.unwrap();
        a.release().await;
        // Both standbys read the released Lease, then both update from that read.
        let read = store.get().await.unwrap().unwrap();
        let (b, c) = (candidate(&store, "b"), candidate(&store, "c"));
        let mut from_b = read.clone();
        from_b.spec = Some(b.spec(read.spec.as_ref()));
        let mut from_c = read.clone();
        from_c.spec = Some(c.spec(read.spec.as_ref()));
        assert!(store.replace(&from_b).await.is_ok());
        assert_eq!(store.replace(&from_c).await, Err(LeaseError::Conflict));
        assert_eq!(store.holder().as_deref(), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_leader_is_fenced_after_the_renew_deadline_and_replaced_after_the_lease_duration(
    ) {
        let store = Arc::new(MemoryLeases::default());
        let (a, b) = (candidate(&store, "a"), candidate(&store, "b"));
        a.try_acquire_or_renew().await.unwrap();
        assert_eq!(b.try_acquire_or_renew().await, Ok(false));
        // a freezes: no renewals. Before the renew deadline it may still write...
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(a.leadership().check(), Ok(()));
        // ...after it, not a single write, though it still believes it leads.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(a.leadership().is_leader());
        assert_eq!(a.leadership().check(), Err(FenceHold::RenewalStale));
        // b cannot take over before the lease duration (counted from when b saw the version)...
        assert_eq!(b.try_acquire_or_renew().await, Ok(false));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.try_acquire_or_renew().await, Ok(true));
        assert_eq!(store.holder().as_deref(), Some("b"));
        // a wakes up: its renewal carries a stale resourceVersion or finds b's live lease.
        assert_eq!(a.try_acquire_or_renew().await, Ok(false));
        assert_eq!(a.leadership().check(), Err(FenceHold::NotLeader));
        assert_eq!(
            store
                .lease
                .lock()
                .as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.lease_transitions),
            Some(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_over_at_the_next_attempt() {
        let store = Arc::new(MemoryLeases::default());
        let (a, b) = (candidate(&store, "a"), candidate(&store, "b"));
        a.try_acquire_or_renew().await.unwrap();
        assert_eq!(b.try_acquire_or_renew().await, Ok(false));
        a.release().await;
        assert_eq!(a.leadership().check(), Err(FenceHold::NotLeader));
        assert_eq!(store.holder(), None);
        assert_eq!(
            b.try_acquire_or_renew().await,
            Ok(true),
            "no lease duration to wait"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_api_server_down_the_leader_stops_writing_before_its_lease_could_expire() {
        let store = Arc::new(MemoryLeases::default());
        let a = candidate(&store, "a");
        let stop = CancellationToken::new();
        let run = {
            let (stop, a) = (stop.clone(), Arc::new(a));
            let fence = a.leadership();
            let task = tokio::spawn({
                let a = a.clone();
                async move { a.run(stop).await }
            });
            (task, fence)
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(run.1.check(), Ok(()));
        store.down.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_ne!(run.1.check(), Ok(()), "fenced within the renew deadline");
        store.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            run.1.check(),
            Ok(()),
            "leads again once the API server is back"
        );
        stop.cancel();
        run.0.await.unwrap();
        assert_eq!(store.holder(), None, "released on shutdown");
    }
}
