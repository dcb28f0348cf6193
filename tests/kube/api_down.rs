//! The Kubernetes API down, with leader election on a Lease against the emulator's Kubernetes
//! side and its fault switch ([`KubeState::set_unavailable`]: every Kubernetes request answers
//! 503 while it is on).
//!
//! Durations are scaled down so the test is quick: lease 3 s, renew deadline 2 s, retry 0.3 s
//! stand for cluster-autoscaler's defaults of 15 s, 10 s and 2 s; the outage (4 s) is longer than
//! the lease, as "the API down for a minute" is with the defaults. Real time is unavoidable (real
//! sockets, the fence reads the monotonic clock); every wait is bounded, each test takes under
//! 15 s.
//!
//! What is proven:
//! - while the API is down, the leader's fence (`leadership().check()`, asked before every Azure
//!   write) turns `Err` within the renew deadline of its last successful renewal, so before the
//!   lease could expire for anyone else (lease duration after that renewal);
//! - a follower's fence is never `Ok` while the API is down, nor at any time while another holds
//!   the lease; the two fences are never `Ok` at once;
//! - after the API returns, leadership resumes (the leader renews its own lease, or the standby
//!   takes over an expired one) and a lone leader's fence is `Ok` again.

use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::fence::WriteFence;
use vmss_capacity_controller::kube::lease::{
    LeaderElection, Leadership, LeaseConfig, LeaseError, LeaseStore,
};
use vmss_capacity_controller::kube::KubeLeases;
use vmss_capacity_controller::notify::NoEvents;

const LEASE: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(300);
const OUTAGE: Duration = Duration::from_secs(4);
const SAMPLE: Duration = Duration::from_millis(10);

async fn emulator() -> (kube::Client, KubeState, EmulatorHandle) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kubeconfig = handle.kubeconfig().expect("the Kubernetes side is on");
    let file = kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let state = handle.kube().expect("the Kubernetes side is on");
    (client, state, handle)
}

/// The real Lease store, remembering when each successful acquire or renew was attempted (the
/// start of the attempt's GET: at or after the instant the election stamps as its renewal).
struct Timed {
    inner: KubeLeases,
    attempt_started: Mutex<Option<Instant>>,
    renewals: Mutex<Vec<Instant>>,
}

impl Timed {
    fn new(client: &kube::Client, lease: &str) -> Arc<Self> {
        Arc::new(Self {
            inner: KubeLeases::new(client.clone(), "default", lease),
            attempt_started: Mutex::new(None),
            renewals: Mutex::new(Vec::new()),
        })
    }

    fn succeeded(&self) {
        if let Some(at) = *self.attempt_started.lock() {
            self.renewals.lock().push(at);
        }
    }

    /// The last successful acquire or renew attempted before `t`.
    fn last_renewal_before(&self, t: Instant) -> Option<Instant> {
        self.renewals
            .lock()
            .iter()
            .copied()
            .filter(|r| *r < t)
            .max()
    }
}

#[async_trait::async_trait]
impl LeaseStore for Timed {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        *self.attempt_started.lock() = Some(Instant::now());
        self.inner.get().await
    }
    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let r = self.inner.create(lease).await;
        if r.is_ok() {
            self.succeeded();
        }
        r
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let r = self.inner.replace(lease).await;
        if r.is_ok() {
            self.succeeded();
        }
        r
    }
}

struct Candidate {
    leadership: Arc<Leadership>,
    store: Arc<Timed>,
    task: tokio::task::JoinHandle<()>,
}

fn candidate(client: &kube::Client, lease: &str, id: &str, stop: &CancellationToken) -> Candidate {
    let store = Timed::new(client, lease);
    let election = Arc::new(LeaderElection::new(
        LeaseConfig {
            name: lease.into(),
            identity: id.into(),
            lease_duration: LEASE,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY,
        },
        store.clone(),
        Arc::new(NoEvents),
    ));
    let leadership = election.leadership();
    let stop = stop.clone();
    let task = tokio::spawn(async move { election.run(stop).await });
    Candidate {
        leadership,
        store,
        task,
    }
}

/// One look at every fence: (when, which fences let a write go).
type Sample = (Instant, Vec<bool>);

/// Samples the fences every [`SAMPLE`] until `stop`.
fn sampler(
    fences: Vec<Arc<Leadership>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.is_cancelled() {
            samples.push((
                Instant::now(),
                fences.iter().map(|f| f.check().is_ok()).collect(),
            ));
            tokio::time::sleep(SAMPLE).await;
        }
        samples
    })
}

/// Waits (bounded by `limit`) until `cond` holds.
async fn until(what: &str, limit: Duration, cond: impl Fn() -> bool) -> Instant {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(SAMPLE).await;
    }
    Instant::now()
}

fn lease_name(test: &str) -> String {
    format!("{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_api_down_the_leader_stops_writing_before_its_lease_could_expire_and_the_follower_never_writes(
) {
    let (client, k, _h) = emulator().await;
    let name = lease_name("down");
    let stop = CancellationToken::new();
    let a = candidate(&client, &name, "replica-a", &stop);
    until("replica-a leads", Duration::from_secs(5), || {
        a.leadership.check().is_ok()
    })
    .await;
    let b = candidate(&client, &name, "replica-b", &stop);
    until(
        "replica-b settles as a follower",
        Duration::from_secs(5),
        || b.leadership.settled(),
    )
    .await;
    let sampling = CancellationToken::new();
    let samples = sampler(
        vec![a.leadership.clone(), b.leadership.clone()],
        sampling.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let down_at = Instant::now();
    k.set_unavailable(true);
    tokio::time::sleep(OUTAGE).await;
    k.set_unavailable(false);
    let up_at = Instant::now();
    let resumed = until(
        "somebody leads again after the API returns",
        LEASE + RETRY * 4,
        || a.leadership.check().is_ok() || b.leadership.check().is_ok(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    sampling.cancel();
    let samples = samples.await.expect("the sampler ends");
    stop.cancel();
    a.task.await.expect("replica-a ends");
    b.task.await.expect("replica-b ends");

    // Never two writers.
    assert!(
        samples.iter().all(|(_, ok)| !(ok[0] && ok[1])),
        "both fences let writes go at once"
    );
    // The follower never writes while the leader holds the lease or the API is down.
    assert!(
        samples
            .iter()
            .filter(|(t, _)| *t < up_at)
            .all(|(_, ok)| !ok[1]),
        "the follower's fence was Ok before the API returned"
    );
    // The leader stops within its renew deadline, before its lease could expire for others.
    let last_renewal = a
        .store
        .last_renewal_before(down_at)
        .expect("replica-a renewed before the outage");
    let stopped = samples
        .iter()
        .find(|(t, ok)| *t > down_at && !ok[0])
        .map(|(t, _)| *t)
        .expect("replica-a's fence turned Err during the outage");
    assert!(
        stopped < last_renewal + LEASE,
        "replica-a stopped writing {:?} after its last renewal: the lease ({LEASE:?}) could have \
         expired for others first",
        stopped - last_renewal
    );
    assert!(
        stopped <= last_renewal + RENEW_DEADLINE + SAMPLE * 5,
        "replica-a stopped writing {:?} after its last renewal, later than its renew deadline \
         ({RENEW_DEADLINE:?})",
        stopped - last_renewal
    );
    assert!(
        samples
            .iter()
            .filter(|(t, _)| *t >= stopped && *t < up_at)
            .all(|(_, ok)| !ok[0]),
        "replica-a wrote again while the API was still down"
    );
    eprintln!(
        "last renewal {:?} before the outage; the fence closed {:?} after it (renew deadline \
         {RENEW_DEADLINE:?}, lease {LEASE:?}); leadership resumed {:?} after the API returned",
        down_at - last_renewal,
        stopped - last_renewal,
        resumed - up_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_resumes_when_it_returns() {
    let (client, k, _h) = emulator().await;
    let name = lease_name("resume");
    let stop = CancellationToken::new();
    let a = candidate(&client, &name, "replica-a", &stop);
    until("replica-a leads", Duration::from_secs(5), || {
        a.leadership.check().is_ok()
    })
    .await;
    k.set_unavailable(true);
    until(
        "replica-a's fence closes",
        RENEW_DEADLINE + Duration::from_secs(1),
        || a.leadership.check().is_err(),
    )
    .await;
    tokio::time::sleep(OUTAGE - RENEW_DEADLINE).await;
    assert!(a.leadership.check().is_err());
    k.set_unavailable(false);
    let up_at = Instant::now();
    let resumed = until(
        "replica-a leads again after the API returns",
        RETRY * 4 + Duration::from_secs(1),
        || a.leadership.check().is_ok(),
    )
    .await;
    eprintln!(
        "replica-a resumed {:?} after the API returned",
        resumed - up_at
    );
    stop.cancel();
    a.task.await.expect("replica-a ends");
}
