//! A cluster for `demand: pods` tests and benchmarks: the emulator's ARM side (scale sets) and
//! Kubernetes side, the reflectors, the scale-up loop, the Events recorder and the reconciler,
//! wired as `run` wires them, in process.

use super::*;
use k8s_openapi::api::events::v1::Event;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vmss_capacity_controller::autoscale::scale_down::ScaleDownLoop;
use vmss_capacity_controller::autoscale::scale_up::{PodDemand, ScaleUpLoop};
use vmss_capacity_controller::config::{DemandKind, Settings};
use vmss_capacity_controller::emulator::arm::{AgentPoolSeed, ClusterSeed};
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::sim::SimSettings;
use vmss_capacity_controller::emulator::{
    EmulatorBuilder, EmulatorHandle, EmulatorState, ScaleSetSeed,
};
use vmss_capacity_controller::kube::events::{EventRecorder, KubeEvents, RecorderConfig};
use vmss_capacity_controller::kube::nodes::KubeNodeActions;
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::reconciler::Reconciler;

pub const GPU_TAINT_TAG: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";

/// A scale set to seed: name, VM size, capacity, tags.
pub type Seed<'a> = (&'a str, &'a str, i64, &'a [(&'a str, &'a str)]);

/// What backs the node groups.
pub enum Groups<'a> {
    /// Scale sets `(name, VM size, capacity, tags)`.
    ScaleSets(&'a [Seed<'a>]),
    /// Scale sets seeded whole (zones, priority, location...).
    Seeds(Vec<ScaleSetSeed>),
    /// Agent pools of managed cluster [`CLUSTER`] (a `System` pool of one node comes first and
    /// is not a node group).
    Pools(Vec<AgentPoolSeed>),
}

/// The emulator's token, re-issued every half hour (the paused-clock schedules run for hours,
/// past a token's lifetime, as a real credential refreshes), each fetch taking as long as
/// `delay_ms` says (tokio clock).
struct DelayedToken {
    state: EmulatorState,
    token: parking_lot::Mutex<Option<(String, tokio::time::Instant)>>,
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for DelayedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayedToken").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl azure_core::auth::TokenCredential for DelayedToken {
    async fn get_token(&self, _: &[&str]) -> azure_core::Result<azure_core::auth::AccessToken> {
        let ms = self.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let token = {
            let mut slot = self.token.lock();
            match slot.as_ref() {
                Some((t, at)) if at.elapsed() < Duration::from_secs(30 * 60) => t.clone(),
                _ => {
                    let t = self.state.issue_token("controller");
                    *slot = Some((t.clone(), tokio::time::Instant::now()));
                    t
                }
            }
        };
        let expires = time::OffsetDateTime::now_utc() + Duration::from_secs(3600);
        Ok(azure_core::auth::AccessToken::new(token, expires))
    }
    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

/// The Lease as a switch: `leader` false holds every write as a standby's would be held; `stale`
/// as a leader's whose renewal is late.
#[derive(Debug)]
struct Switch(
    Arc<std::sync::atomic::AtomicBool>,
    Arc<std::sync::atomic::AtomicBool>,
);

impl vmss_capacity_controller::fence::WriteFence for Switch {
    fn check(&self) -> Result<(), vmss_capacity_controller::fence::FenceHold> {
        use vmss_capacity_controller::fence::FenceHold;
        if !self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Err(FenceHold::NotLeader)
        } else if self.1.load(std::sync::atomic::Ordering::SeqCst) {
            Err(FenceHold::RenewalStale)
        } else {
            Ok(())
        }
    }
}

pub struct Cluster {
    pub _emulator: EmulatorHandle,
    /// Whether the node groups are agent pools.
    pub pools: bool,
    pub state: EmulatorState,
    pub kube: KubeState,
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    pub reconciler: Arc<Reconciler>,
    pub stop: CancellationToken,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    token_delay: Arc<std::sync::atomic::AtomicU64>,
    leader: Arc<std::sync::atomic::AtomicBool>,
    stale: Arc<std::sync::atomic::AtomicBool>,
}

impl Cluster {
    /// Scale sets `seeds` (name, VM size, capacity, tags); node groups 0..=max for each.
    pub async fn start(seeds: &[Seed<'_>], max: u32) -> Self {
        Self::start_with(seeds, max, |s| {
            // Short enough for quick tests, long enough that a burst created in a few ms is one
            // batch on a loaded machine.
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
        })
        .await
    }

    /// [`Cluster::start`] with `tweak` applied to the settings (default batch windows otherwise).
    pub async fn start_with(
        seeds: &[Seed<'_>],
        max: u32,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(Groups::ScaleSets(seeds), max, None, None, false, tweak).await
    }

    /// [`Cluster::start_with`] for node groups backed by `groups` (seeded whole).
    pub async fn start_groups(
        groups: Groups<'_>,
        max: u32,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(groups, max, None, None, false, tweak).await
    }

    /// A cluster whose instances become Nodes and whose workloads are scheduled and re-created
    /// (the emulator's cluster simulation), with the scale-down loop when `tweak` enables it.
    pub async fn start_simulated(
        seeds: &[Seed<'_>],
        max: u32,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        let sim = SimSettings {
            boot_delay: Duration::from_millis(200),
            tick: Duration::from_millis(20),
        };
        Self::start_full(Groups::ScaleSets(seeds), max, Some(sim), None, false, tweak).await
    }

    /// [`Cluster::start_simulated`] with the simulation's own settings (boot delay, tick): the
    /// paused-clock tests use minutes-long boots and second-long ticks.
    pub async fn start_simulated_with(
        seeds: &[Seed<'_>],
        max: u32,
        sim: SimSettings,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(Groups::ScaleSets(seeds), max, Some(sim), None, false, tweak).await
    }

    /// A simulated cluster whose node groups are `groups` (scale sets or agent pools).
    pub async fn start_simulated_groups(
        groups: Groups<'_>,
        max: u32,
        sim: SimSettings,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(groups, max, Some(sim), None, false, tweak).await
    }

    /// [`Cluster::start_simulated_with`] whose controller's wall clock moves with tokio's (on a
    /// paused clock, conditions' times and bookings age as the test advances).
    pub async fn start_simulated_on_tokio_clock(
        seeds: &[Seed<'_>],
        max: u32,
        sim: SimSettings,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(Groups::ScaleSets(seeds), max, Some(sim), None, true, tweak).await
    }

    /// [`Cluster::start_with`] whose controller talks to the Kubernetes API server behind
    /// `client` (a real one) instead of the emulator's.
    pub async fn start_on(
        seeds: &[Seed<'_>],
        max: u32,
        client: kube::Client,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full(
            Groups::ScaleSets(seeds),
            max,
            None,
            Some(client),
            false,
            tweak,
        )
        .await
    }

    /// [`Cluster::start_groups`] whose long-running operations take `lro_delay` (the VMs a
    /// write creates are `Creating` until then, as Azure lists them while it allocates).
    pub async fn start_groups_with_lro_delay(
        groups: Groups<'_>,
        max: u32,
        lro_delay: Duration,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full_lro(groups, max, None, None, false, lro_delay, tweak).await
    }

    async fn start_full(
        seeds: Groups<'_>,
        max: u32,
        sim: Option<SimSettings>,
        kube_client: Option<kube::Client>,
        tokio_wall_clock: bool,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::start_full_lro(
            seeds,
            max,
            sim,
            kube_client,
            tokio_wall_clock,
            Duration::ZERO,
            tweak,
        )
        .await
    }

    async fn start_full_lro(
        seeds: Groups<'_>,
        max: u32,
        sim: Option<SimSettings>,
        kube_client: Option<kube::Client>,
        tokio_wall_clock: bool,
        lro_delay: Duration,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        let mut builder = EmulatorBuilder::new().kubernetes(true).lro_delay(lro_delay);
        if let Some(sim) = sim {
            builder = builder.cluster_simulation(sim);
        }
        let emulator = builder.start().await.expect("emulator starts");
        let state = emulator.state();
        let kube = emulator.kube().expect("kubernetes side on");
        let mut groups = Vec::new();
        let mut names = Vec::new();
        let pools = matches!(seeds, Groups::Pools(_));
        match seeds {
            Groups::ScaleSets(seeds) => {
                for (name, size, capacity, tags) in seeds {
                    let mut seed = ScaleSetSeed::new(SUB, RG, name, *capacity);
                    seed.sku_name = size.to_string();
                    seed.tags = tags
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>();
                    state.seed_scale_set(seed);
                    groups.push(group(name, 0, max, None));
                    names.push(name.to_string());
                }
            }
            Groups::Seeds(seeds) => {
                for seed in seeds {
                    groups.push(group(&seed.name, 0, max, None));
                    names.push(seed.name.clone());
                    state.seed_scale_set(seed);
                }
            }
            Groups::Pools(seeds) => {
                let mut system = AgentPoolSeed::new("system", 1);
                system.mode = Some("System".into());
                for p in &seeds {
                    groups.push(Kind::AgentPool.group(&p.name, 0, max, None));
                    names.push(p.name.clone());
                }
                let all = std::iter::once(system).chain(seeds).collect();
                state
                    .seed_cluster(ClusterSeed::new(SUB, RG, CLUSTER, all))
                    .expect("cluster seeded");
            }
        }
        let mut s: Settings = settings(&emulator.base_url(), groups);
        s.pod_demand.kind = DemandKind::Pods;
        // Writes come from the loop's wake, not from the scan interval.
        s.scan_interval = Duration::from_secs(30);
        tweak(&mut s);
        let settings = Arc::new(s);
        let metrics = Arc::new(Metrics::new());
        let token_delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let arm = Arc::new(vmss_capacity_controller::azure::ArmClient::new(
            vmss_capacity_controller::azure::arm::ArmTarget {
                endpoint: url::Url::parse(&emulator.base_url()).unwrap(),
                subscription: SUB.into(),
                resource_group: RG.into(),
            },
            Arc::new(DelayedToken {
                state: state.clone(),
                token: parking_lot::Mutex::new(None),
                delay_ms: token_delay.clone(),
            }),
            vmss_capacity_controller::azure::arm::http_client(
                Duration::from_secs(10),
                emulator.ca_pem().as_deref().map(str::as_bytes),
            )
            .unwrap(),
            metrics.clone(),
        ));
        let demand = Arc::new(PodDemand::default());
        let file = kube::config::Kubeconfig::from_yaml(&emulator.kubeconfig().expect("kubeconfig"))
            .expect("kubeconfig parses");
        let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .expect("kubeconfig is usable");
        // As `run` builds it: a 429 from a budget is an answer, not a retry for minutes.
        config.default_retry = false;
        let client = match kube_client {
            Some(c) => c,
            None => kube::Client::try_from(config).expect("client"),
        };
        let (recorder, poster) = EventRecorder::new(
            RecorderConfig {
                namespace: "kube-system".into(),
                identity: "controller-test".into(),
                status_config_map: "vmss-capacity-controller-status".into(),
                lease: None,
            },
            Arc::new(KubeEvents::new(client.clone())),
            metrics.clone(),
            10_000,
        );
        let recorder = Arc::new(recorder);
        let leader = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let stale = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reconciler = Arc::new({
            let mut b = Reconciler::builder(settings.clone(), arm, metrics.clone())
                .fence(Arc::new(Switch(leader.clone(), stale.clone())))
                .demand(demand.clone())
                .events(recorder.clone());
            if tokio_wall_clock {
                let (wall, origin) = (time::OffsetDateTime::now_utc(), tokio::time::Instant::now());
                b = b.clock(Arc::new(move || wall + origin.elapsed()));
            }
            b.build()
        });
        let stop = CancellationToken::new();
        let (view, mut tasks) = vmss_capacity_controller::kube::reflect::start(
            client.clone(),
            metrics.clone(),
            stop.clone(),
        )
        .await;
        tasks.push(tokio::spawn(poster.run(stop.clone())));
        let mut scale_up = ScaleUpLoop::new(
            settings.clone(),
            demand.clone(),
            reconciler.clone(),
            view.clone(),
            metrics.clone(),
            recorder.clone(),
        );
        if settings.pod_demand.provisioning_requests {
            scale_up = scale_up.provisioning_requests(
                vmss_capacity_controller::kube::provreq::KubeProvReqs::new(client.clone()),
            );
        }
        if settings.pod_demand.capacity_buffer_controller {
            scale_up = scale_up.capacity_buffers(
                vmss_capacity_controller::kube::buffer::KubeBuffers::new(client.clone()),
                settings.pod_demand.capacity_buffer_pod_injection,
            );
        }
        let bookings = scale_up.bookings();
        let prices = scale_up.prices();
        tasks.push(tokio::spawn(scale_up.run(stop.clone())));
        if settings.scale_down.enabled {
            tasks.push(tokio::spawn(
                ScaleDownLoop::new(
                    settings.clone(),
                    reconciler.clone(),
                    view.clone(),
                    Arc::new(KubeNodeActions::new(client.clone())),
                    metrics.clone(),
                    recorder,
                )
                .bookings(bookings)
                .prices(prices)
                .demand(Some(demand))
                .run(stop.clone()),
            ));
        }
        {
            let (r, stop) = (reconciler.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { r.run(stop).await }));
        }
        assert!(
            eventually(Duration::from_secs(10), || view.synced()).await,
            "the reflectors never listed"
        );
        // The first pass has read every scale set.
        let r = reconciler.clone();
        assert!(
            eventually(Duration::from_secs(10), || names.iter().all(|n| r
                .node_groups()
                .scale_sets()
                .get(n)
                .is_some()))
            .await,
            "the first pass never read the scale sets"
        );
        Cluster {
            _emulator: emulator,
            pools,
            state,
            kube,
            client,
            metrics,
            reconciler,
            stop,
            tasks,
            token_delay,
            leader,
            stale,
        }
    }

    /// Whether this replica leads (`false`: a standby, every write held by the fence).
    pub fn set_leader(&self, on: bool) {
        self.leader.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the leader's renewal is late (a Lease hiccup: writes held, still the leader).
    pub fn set_renewal_stale(&self, on: bool) {
        self.stale.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes every token fetch of the controller take `d` (a slow token endpoint).
    pub fn set_token_delay(&self, d: Duration) {
        self.token_delay.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// A pending pod the scheduler found no room for.
    pub fn pending(&self, name: &str, cpu: &str, memory: &str, extra: Value) {
        self.pending_labelled(name, json!({}), cpu, memory, extra)
    }

    /// [`Cluster::pending`] with these labels.
    pub fn pending_labelled(
        &self,
        name: &str,
        labels: Value,
        cpu: &str,
        memory: &str,
        extra: Value,
    ) {
        let mut spec = json!({
            "containers": [{"name": "app", "image": "app",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        self.kube
            .create(
                "v1",
                "pods",
                "default",
                json!({
                    "metadata": {"name": name, "namespace": "default", "labels": labels,
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "web", "uid": "rs-uid", "controller": true}]},
                    "spec": spec,
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                        "status": "False", "reason": "Unschedulable",
                        "message": "0/0 nodes are available"}]},
                }),
            )
            .expect("pod created");
    }

    pub fn capacity_puts(&self, name: &str) -> usize {
        capacity_puts_by(&self.state.request_log(), "controller")
            .iter()
            .filter(|r| scale_set_of(&r.path) == Some(name))
            .count()
    }

    /// A node group's capacity (a pool's `count`) on the server; -1 when it is gone.
    pub fn capacity(&self, name: &str) -> i64 {
        if self.pools {
            return self
                .state
                .agent_pool_count(SUB, RG, CLUSTER, name)
                .unwrap_or(-1);
        }
        self.state
            .scale_set(SUB, RG, name)
            .map_or(-1, |v| v.capacity)
    }

    /// The scale set behind a node group (an agent pool's backing scale set).
    pub fn scale_set_name(&self, group: &str) -> String {
        if self.pools {
            return self
                .state
                .agent_pool(SUB, RG, CLUSTER, group)
                .map(|p| p.scale_set_name)
                .unwrap_or_default();
        }
        group.to_string()
    }

    /// The Nodes of a node group, by name.
    pub fn nodes_of(&self, group: &str) -> Vec<String> {
        self.kube
            .nodes_by_scale_set()
            .remove(&self.scale_set_name(group))
            .unwrap_or_default()
    }

    pub async fn events(&self, reason: &str) -> Vec<Event> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), "default");
        api.list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    /// The Events of `reason` once `done` holds of them, or as they are after 10 s (the
    /// controller writes Events beside what it does, not before: a state or metric seen
    /// changed does not mean its Event is written yet).
    pub async fn events_once(&self, reason: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.events(reason).await;
            if done(&events) || tokio::time::Instant::now() >= deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}
