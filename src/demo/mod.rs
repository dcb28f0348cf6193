//! `demo`: the zero-setup showcase, like `vault server -dev`.
//!
//! By default ([`pods::compare`]) it shows the product: pending pods on a simulated cluster make
//! one controller grow three scale sets, unneeded nodes are drained and removed, a rival writer
//! changes the scale sets meanwhile, and the same seeded scenario runs twice, with ETags and
//! with blind writes, so the summary puts the lost updates side by side (0 with ETags).
//! `--pods` runs it once.
//!
//! `--plan` is the capacity-plan showcase: it starts the built-in ARM emulator, seeds a handful
//! of scale sets (one with a schedule
//! window that opens and closes during the run), lets a seeded rival writer (think Terraform or
//! the portal) change capacities and tags, and runs the real controller against it through the
//! real credential path (client secret exchanged at the emulator's token endpoint). It prints
//! live progress, then a summary: writes, 412s by outcome, foreign writes, ARM calls, and the
//! emulator's lost-update report. `--no-etag` runs the same scenario with blind writes.
//!
//! `--aks` runs it on the agent pools of one managed cluster instead: the rival writes pools
//! (their count and tags) and the cluster itself (a tag: under AKS's scoping rule that changes
//! every pool's ETag), and the summary says how many 412s followed a cluster-level write.
//!
//! `--kubernetes` (composable with `--aks` and `--no-etag`) turns on the emulator's Kubernetes API and runs two
//! replicas in the process, each wired exactly as `run` wires one ([`crate::app::Replica`]: its
//! own service principal, so the emulator's request log tells their Azure calls apart, its own
//! candidacy on the Lease, Events recorder, status writer and fenced reconciler), with short
//! Lease settings. Halfway the leader is stopped as on SIGTERM (it releases the Lease) and the
//! standby takes over. A referee samples both write fences and the Lease every 10 ms; the summary
//! adds the hand-over time, writes per replica, the status ConfigMap and the Events as
//! `kubectl get events` prints them.

pub mod cost;
pub mod pods;
pub mod report;

use crate::app::{ExitCode, Replica, ReplicaOptions};
use crate::azure::arm::{http_client, ArmTarget};
use crate::azure::{credentials, ArmClient};
use crate::config::{
    AuthSettings, AzureSettings, ConflictStrategy, KubernetesSettings, NodeGroupKind,
    NodeGroupSpec, Schedule, SecretSource, Settings, WriteBudget,
};
use crate::emulator::{EmulatorBuilder, EmulatorState, ScaleSetSeed};
use crate::metrics::Metrics;
use crate::reconciler::Reconciler;
use anyhow::Context;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const SUBSCRIPTION: &str = "00000000-0000-0000-0000-000000000000";
const RESOURCE_GROUP: &str = "rg-demo";
const TENANT: &str = "demo-tenant";
const CLIENT_ID: &str = "vmss-capacity-controller";
const RIVAL: &str = "terraform-rival";
/// The managed cluster of `demo --aks`.
const CLUSTER: &str = "aks-demo";
/// AKS API version of the demo's own rival and seeding calls.
const AKS_API: &str = "2024-09-01";

/// Length of one window of the demo's load pattern.
const PATTERN_WINDOW: Duration = Duration::from_secs(5);

/// The demo's node groups. Demand moves like a load pattern: consecutive schedule windows of
/// [`PATTERN_WINDOW`] with different desired capacities, staggered per group, so writes happen
/// while the cache is older than the rival's last change (as in production, where demand moves
/// at any moment and the cache may be a minute old). One group holds only its bounds, one
/// limits its scale-down step.
fn node_groups(count: usize, run: Duration, aks: bool) -> Vec<NodeGroupSpec> {
    let now = time::OffsetDateTime::now_utc();
    let secs_of_day = |t: time::OffsetDateTime| {
        u32::from(t.hour()) * 3600 + u32::from(t.minute()) * 60 + u32::from(t.second())
    };
    let windows = (run.as_secs() / PATTERN_WINDOW.as_secs()).max(1) + 1;
    let pattern = |offset: Duration, values: &[u32]| -> Vec<Schedule> {
        (0..windows)
            .map(|k| {
                let start = now + offset + PATTERN_WINDOW * k as u32;
                Schedule {
                    start_secs: secs_of_day(start),
                    end_secs: secs_of_day(start + PATTERN_WINDOW),
                    days: vec![],
                    desired_capacity: values[k as usize % values.len()],
                }
            })
            .collect()
    };
    (0..count.max(1))
        .map(|i| {
            let letter = (b'a' + (i % 26) as u8) as char;
            // AKS pool names are lowercase letters and digits only.
            let name = if aks {
                format!("pool{letter}")
            } else {
                format!("pool-{letter}")
            };
            let offset = Duration::from_millis(1300 * i as u64);
            let kind = if aks {
                NodeGroupKind::AksAgentPool {
                    cluster: CLUSTER.into(),
                }
            } else {
                NodeGroupKind::Vmss
            };
            let mut g = NodeGroupSpec {
                name,
                kind,
                resource_group: None,
                min_size: 1,
                max_size: 10,
                desired_capacity: Some(3),
                schedules: vec![],
                max_scale_down_step: None,
            };
            match i % 4 {
                0 => g.schedules = pattern(offset, &[3, 5, 4, 6]),
                1 => {
                    g.desired_capacity = Some(2);
                    g.schedules = pattern(offset, &[2, 6]);
                }
                2 => {
                    g.desired_capacity = None;
                    g.min_size = 2;
                    g.max_size = 6;
                }
                _ => {
                    g.desired_capacity = Some(4);
                    g.max_scale_down_step = Some(2);
                    g.schedules = pattern(offset, &[4, 8, 5]);
                }
            }
            g
        })
        .collect()
}

/// The emulator, seeded: what every variant of the demo starts from.
struct Stage {
    /// Keeps the emulator serving; dropped at the end of the demo.
    _emulator: crate::emulator::EmulatorHandle,
    state: EmulatorState,
    base: String,
    groups: Vec<NodeGroupSpec>,
    pools: PoolRival,
    /// Holds the client secrets (and the kubeconfig); removed at the end.
    dir: std::path::PathBuf,
}

impl Stage {
    /// Starts the emulator (its Kubernetes side too with `--kubernetes`) and seeds the scale
    /// sets, or the managed cluster and its agent pools with `--aks`.
    async fn new(args: &DemoArgs) -> anyhow::Result<Self> {
        let emulator = EmulatorBuilder::new()
            .lro_delay(Duration::from_millis(800))
            .kubernetes(args.kubernetes)
            .start()
            .await
            .context("starting the built-in emulator")?;
        let stage = Self::around(
            emulator,
            node_groups(args.scale_sets, args.duration, args.aks),
        )?;
        let (state, groups) = (&stage.state, &stage.groups);
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        if args.aks {
            let profiles: Vec<serde_json::Value> = groups
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    serde_json::json!({"name": g.name, "count": rng.gen_range(1..=8),
                        "vmSize": "Standard_D4s_v5", "mode": if i == 0 { "System" } else { "User" },
                        "tags": {"team": "platform"}})
                })
                .collect();
            let seeder = PoolRival {
                token: state.issue_token("seeder"),
                ..stage.pools.clone()
            };
            seeder
                .create_cluster(profiles)
                .await
                .context("creating the demo's managed cluster")?;
        } else {
            for g in groups {
                let mut seed =
                    ScaleSetSeed::new(SUBSCRIPTION, RESOURCE_GROUP, &g.name, rng.gen_range(1..=8));
                seed.tags = BTreeMap::from([("team".to_string(), "platform".to_string())]);
                state.seed_scale_set(seed);
            }
        }
        Ok(stage)
    }

    /// A stage around an emulator its caller started (and seeds itself), for `groups`: the
    /// rival's client and the directory for the secrets and the kubeconfig.
    fn around(
        emulator: crate::emulator::EmulatorHandle,
        groups: Vec<NodeGroupSpec>,
    ) -> anyhow::Result<Self> {
        let state = emulator.state();
        let base = emulator.base_url();
        Ok(Self {
            pools: PoolRival {
                http: http_client(Duration::from_secs(10), None)?,
                token: state.issue_token(RIVAL),
                base: base.clone(),
            },
            _emulator: emulator,
            state,
            base,
            groups,
            dir: tempfile_dir()?,
        })
    }

    /// The Kubernetes settings of a demo with one replica: the emulator's cluster through a
    /// kubeconfig written here, no leader election, the status ConfigMap under its default name.
    fn one_replica_kubernetes(&self) -> anyhow::Result<KubernetesSettings> {
        Ok(KubernetesSettings {
            enabled: true,
            kubeconfig: Some(write_kubeconfig(self, self._emulator.kubeconfig())?),
            namespace: NAMESPACE.into(),
            leader_election: crate::config::LeaderElectionSettings {
                enabled: false,
                ..Default::default()
            },
            status_config_map: crate::config::DEFAULT_STATUS_CONFIG_MAP.into(),
            ..KubernetesSettings::default()
        })
    }

    /// Registers service principal `client_id` with a fresh secret, written to a file the
    /// controller reads (the real credential path).
    fn register(&self, client_id: &str) -> anyhow::Result<std::path::PathBuf> {
        let file = self.dir.join(format!("{client_id}.secret"));
        let secret = format!("demo-{}", uuid::Uuid::new_v4());
        std::fs::write(&file, &secret)
            .with_context(|| format!("writing the demo client secret {}", file.display()))?;
        self.state.register_client(client_id, &secret);
        Ok(file)
    }

    /// The controller's settings for this demo, as service principal `client_id`.
    fn settings(
        &self,
        args: &DemoArgs,
        client_id: &str,
        secret_file: std::path::PathBuf,
        kubernetes: KubernetesSettings,
    ) -> anyhow::Result<Settings> {
        let endpoint = url::Url::parse(&self.base).context("emulator URL")?;
        Ok(Settings {
            azure: AzureSettings {
                resource_manager_endpoint: endpoint.clone(),
                authority_host: endpoint.clone(),
                imds_endpoint: endpoint,
                tenant_id: TENANT.into(),
                subscription_id: SUBSCRIPTION.into(),
                resource_group: RESOURCE_GROUP.into(),
                auth: AuthSettings::ClientSecret {
                    client_id: client_id.into(),
                    secret: SecretSource::File(secret_file),
                },
                ca_bundle_file: None,
            },
            enable_vmss_etag: !args.no_etag,
            conflict_strategy: ConflictStrategy::Replan,
            scan_interval: Duration::from_secs(1),
            vmss_cache_ttl: Duration::from_secs(10),
            instance_cache_ttl: Duration::from_secs(30),
            instance_cache_jitter: Duration::from_secs(5),
            metrics_listen: None,
            max_concurrent_writes: 4,
            // Generous for a fast demo; production keeps Azure's 4/min, burst 12 per scale set
            // (0.5/min, burst 10 per agent pool).
            write_budget: WriteBudget {
                per_minute: 120.0,
                burst: 20,
            },
            agent_pool_write_budget: WriteBudget {
                per_minute: 120.0,
                burst: 20,
            },
            shutdown_grace: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            quota_cooldown: Duration::from_secs(30),
            arm_budget_reserve: crate::config::DEFAULT_ARM_BUDGET_RESERVE,
            node_groups: self.groups.clone(),
            auto_discovery: None,
            kubernetes,
            pod_demand: Default::default(),
            scale_down: Default::default(),
            consolidation: Default::default(),
            // The demo runs offline: the embedded list prices.
            prices: crate::config::PriceSettings {
                fetch: false,
                ..Default::default()
            },
        })
    }

    /// Starts the rival writer; it counts its successful writes in `count` until `stop`.
    fn rival(
        &self,
        args: &DemoArgs,
        count: Arc<AtomicU64>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(rival_writer(
            Rival {
                state: self.state.clone(),
                pools: args.aks.then(|| self.pools.clone()),
            },
            self.groups.clone(),
            args.rival_interval,
            args.seed,
            count,
            stop,
        ))
    }

    /// `4 scale sets` or `4 agent pools of managed cluster aks-demo`.
    fn what(&self, args: &DemoArgs) -> String {
        format!(
            "{} {}",
            self.groups.len(),
            if args.aks {
                "agent pools of managed cluster aks-demo"
            } else {
                "scale sets"
            }
        )
    }
}

impl Stage {
    /// Starts recording the run for `--report` (the controllers are these service principals).
    fn recorder(&self, args: &DemoArgs, controllers: &[&str]) -> report::Recorder {
        report::Recorder::start(
            etag_mode(args),
            self.state.clone(),
            None,
            &self.groups,
            report::Writers {
                controllers: controllers.iter().map(|c| c.to_string()).collect(),
                rivals: vec![RIVAL.to_string()],
            },
        )
    }

    /// Writes the plan showcases' report, when `--report` asks for one: the timeline and the
    /// summary as printed.
    fn write_report(
        &self,
        args: &DemoArgs,
        timeline: report::Timeline,
        summary: String,
        notes: Vec<String>,
    ) -> anyhow::Result<()> {
        let Some(path) = &args.report else {
            return Ok(());
        };
        report::write(
            path,
            &report::Report {
                lines: Vec::new(),
                title: format!("vmss-capacity-controller demo: {}", self.what(args)),
                intro: vec![format!(
                    "The built-in ARM emulator held {}; the controller kept them at a capacity plan while a rival changed them every {:?} (seed {}). ETag concurrency {}. The chart shows each one's capacity as Azure held it, sampled every {:?}, and below it every write as the emulator saw it.",
                    self.what(args),
                    args.rival_interval,
                    args.seed,
                    etag_mode(args),
                    report::SAMPLE
                )],
                timelines: vec![timeline],
                table: report::Table::default(),
                preformatted: Some(summary),
                notes,
            },
        )?;
        Ok(())
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `demo` flags.
#[derive(Debug, Clone, clap::Args)]
#[cfg(feature = "emulator")]
pub struct DemoArgs {
    /// How long the scenario runs (each arm of the A/B: the default demo runs it twice).
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration_arg)]
    pub duration: Duration,
    /// Blind writes (no If-Match): shows the lost updates that ETags prevent. With the default
    /// demo: only the blind arm.
    #[arg(long)]
    pub no_etag: bool,
    /// Number of scale sets (agent pools with `--aks`) of the `--plan` showcase.
    #[arg(long, default_value_t = 4)]
    pub scale_sets: usize,
    /// How often the rival writer changes a scale set.
    #[arg(long, default_value = "700ms", value_parser = crate::config::parse_duration_arg)]
    pub rival_interval: Duration,
    /// Seed for the rival writer's choices (same seed, same scenario).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Only the summary, no live progress.
    #[arg(long)]
    pub quiet: bool,
    /// The capacity-plan showcase: four scale sets kept at a static plan (schedule windows)
    /// while a rival writer changes them.
    #[arg(long, conflicts_with = "pods")]
    pub plan: bool,
    /// The plan showcase on the agent pools of one AKS managed cluster, with a rival making
    /// pool-level and cluster-level writes.
    #[arg(long)]
    pub aks: bool,
    /// Two controller replicas electing a leader on the emulator's Kubernetes API (a Lease); the
    /// leader stops halfway and the standby takes over; then the status ConfigMap and the Events.
    #[arg(long)]
    pub kubernetes: bool,
    /// The default demo's pod-driven scenario once, ETags on (off with `--no-etag`), instead of
    /// the A/B: bursts of pending pods over three node groups (general, memory, a tainted GPU
    /// group from zero), then a shrink, with the rival writer still at work.
    #[arg(long, conflicts_with_all = ["aks", "kubernetes"])]
    pub pods: bool,
    /// What consolidation saves: one seeded 24 h diurnal day on a simulated cluster in paused
    /// time, run twice (cluster-autoscaler's policy, then consolidation), dollars, node-hours,
    /// evictions, pending time and PodDisruptionBudget violations side by side against the
    /// lower bound. `BENCH_QUICK=1` runs the first 8 h only.
    #[arg(long, conflicts_with_all = ["aks", "kubernetes", "pods", "plan", "no_etag"])]
    pub cost: bool,
    /// With `--cost`: the consolidation run's `consolidation.stabilizationWindow` (moves that
    /// evict wait until the pods' requests have not risen for this long; default off).
    #[arg(long, requires = "cost", value_name = "DURATION", value_parser = crate::config::parse_duration_arg)]
    pub stabilization_window: Option<Duration>,
    /// With `--cost`: both runs' `scaleDown.maxBulkSoftTaintCount` (default 10, as
    /// cluster-autoscaler's `--max-bulk-soft-taint-count`; 0: no soft taints).
    #[arg(long, requires = "cost", value_name = "COUNT")]
    pub max_bulk_soft_taint_count: Option<u32>,
    /// With `--cost`: the consolidation run's `consolidation.emptyFirst` (its three hinted
    /// nodes get this long to empty before any of their pods is evicted; default off).
    #[arg(long, requires = "cost", value_name = "DURATION", value_parser = crate::config::parse_duration_arg)]
    pub empty_first: Option<Duration>,
    /// With `--cost`: the consolidation run's `consolidation.deletionCostHints` (how many of
    /// its best candidates' pods get a lower `controller.kubernetes.io/pod-deletion-cost`, and
    /// with `--empty-first` how many nodes are given time to empty at once; default 3).
    #[arg(long, requires = "cost", value_name = "COUNT")]
    pub deletion_cost_hints: Option<u32>,
    /// With `--cost`: the consolidation run's `consolidation.delayAfterAdd` (consolidation
    /// held this long after a scale-up of any group; default 0s, as Karpenter; `10m` holds it as
    /// cluster-autoscaler's `--scale-down-delay-after-add` holds its scale-down).
    #[arg(long, requires = "cost", value_name = "DURATION", value_parser = crate::config::parse_duration_arg)]
    pub consolidation_delay_after_add: Option<Duration>,
    /// With `--cost`: the consolidation run's `consolidation.disruptJobs: true` (consolidation
    /// may evict the batch Jobs' running pods, as Karpenter does; by default it waits for them
    /// to end).
    #[arg(long, requires = "cost")]
    pub disrupt_jobs: bool,
    /// With `--cost`: how long the trace's services' pods run before they are Ready (both runs;
    /// default 20s; 0s: Ready as soon as they run).
    #[arg(long, requires = "cost", value_name = "DURATION", value_parser = crate::config::parse_duration_arg)]
    pub ready_after: Option<Duration>,
    /// Write a self-contained HTML report (timelines of capacity, Ready nodes and pending pods,
    /// the writes, 412s, rival writes and lost updates, the summary) to FILE. The default demo
    /// writes `demo-report.html` unless given another FILE.
    #[arg(long, value_name = "FILE")]
    pub report: Option<std::path::PathBuf>,
    /// `report` is the default demo's own choice, not the user's: failing to write it is a
    /// warning, not the demo's failure.
    #[arg(skip)]
    pub report_defaulted: bool,
}

/// Where the default demo writes its report when `--report` is not given.
#[cfg(feature = "emulator")]
pub const DEFAULT_REPORT: &str = "demo-report.html";

/// Which showcase the flags select.
#[cfg(feature = "emulator")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Showcase {
    /// The default: pod-driven scaling twice on one seed, ETags on then blind, side by side.
    PodsAb,
    /// Pod-driven scaling once (`--pods`, or `--no-etag` alone).
    Pods,
    /// The capacity-plan showcase (`--plan`, `--aks`).
    Plan,
    /// Two replicas and a Lease (`--kubernetes`).
    Kubernetes,
    /// What consolidation saves, in dollars (`--cost`).
    Cost,
}

#[cfg(feature = "emulator")]
impl DemoArgs {
    /// The showcase these flags select.
    pub fn showcase(&self) -> Showcase {
        if self.cost {
            Showcase::Cost
        } else if self.kubernetes {
            Showcase::Kubernetes
        } else if self.plan || self.aks {
            Showcase::Plan
        } else if self.pods || self.no_etag {
            Showcase::Pods
        } else {
            Showcase::PodsAb
        }
    }
}

/// `demo`: by default pod-driven scaling as an ETag A/B; the other showcases by flag.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let mut args = args;
    match args.showcase() {
        Showcase::PodsAb => {
            if args.report.is_none() {
                args.report = Some(DEFAULT_REPORT.into());
                args.report_defaulted = true;
            }
            let ab = pods::compare(&args).await?;
            if ab.with_etags.lost_updates > 0 {
                eprintln!(
                    "error: {} updates were lost with ETags on: a defect, please report it with this output",
                    ab.with_etags.lost_updates
                );
                return Ok(ExitCode(1));
            }
        }
        Showcase::Pods => {
            pods::run(&args).await?;
        }
        Showcase::Plan => single(&args).await?,
        Showcase::Kubernetes => {
            kubernetes(&args).await?;
        }
        Showcase::Cost => {
            let r = cost::demo(&args).await?;
            if r.consolidation.lost_updates + r.ca.lost_updates > 0 {
                eprintln!("error: updates were lost with ETags on: a defect, please report it with this output");
                return Ok(ExitCode(1));
            }
        }
    }
    Ok(ExitCode(0))
}

/// One controller, no Kubernetes.
async fn single(args: &DemoArgs) -> anyhow::Result<()> {
    let stage = Stage::new(args).await?;
    let state = stage.state.clone();
    let groups = stage.groups.clone();
    let secret_file = stage.register(CLIENT_ID)?;
    let settings = Arc::new(stage.settings(args, CLIENT_ID, secret_file, Default::default())?);
    let metrics = Arc::new(Metrics::new());
    let http = http_client(settings.request_timeout, None)?;
    let credential = credentials::build_credential(&settings.azure, http.clone(), None)
        .context("demo credential")?;
    let target = ArmTarget {
        endpoint: settings.azure.resource_manager_endpoint.clone(),
        subscription: SUBSCRIPTION.into(),
        resource_group: RESOURCE_GROUP.into(),
    };
    let arm = Arc::new(ArmClient::new(target, credential, http, metrics.clone()));
    let reconciler = Arc::new(Reconciler::builder(settings.clone(), arm, metrics.clone()).build());

    println!(
        "demo: ARM emulator at {}, {}, rival writer every {:?}, ETag concurrency {} (runs {:?})",
        stage.base,
        stage.what(args),
        args.rival_interval,
        etag_mode(args),
        args.duration
    );

    let stop = CancellationToken::new();
    let controller = {
        let (r, s) = (reconciler.clone(), stop.clone());
        tokio::spawn(async move { r.run(s).await })
    };
    let rival_writes = Arc::new(AtomicU64::new(0));
    let rival = stage.rival(args, rival_writes.clone(), stop.clone());
    let recorder = stage.recorder(args, &[CLIENT_ID]);
    let all_metrics = [metrics];

    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    while started.elapsed() < args.duration {
        tick.tick().await;
        if !args.quiet {
            progress_line(
                started.elapsed(),
                &all_metrics,
                &state,
                &groups,
                rival_writes.load(Ordering::Relaxed),
                None,
            );
        }
    }
    // The rival stops first, so the last passes show convergence.
    stop.cancel();
    let _ = rival.await;
    let _ = controller.await;
    // Settle: re-read everything once the rival is quiet and let the plan converge.
    reconciler.node_groups().scale_sets().invalidate_all();
    for _ in 0..3 {
        let _ = reconciler.run_once().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let timeline = recorder.finish().await?;
    let text = summary(
        args,
        &all_metrics,
        &state,
        &groups,
        rival_writes.load(Ordering::Relaxed),
        &[CLIENT_ID],
        time::OffsetDateTime::now_utc(),
    );
    stage.write_report(args, timeline, text, Vec::new())
}

fn etag_mode(args: &DemoArgs) -> &'static str {
    if args.no_etag {
        "OFF: blind writes"
    } else {
        "ON: If-Match on every write"
    }
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("vmss-demo-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// The demo's rival writer: in-process on scale sets, through the ARM API on agent pools.
struct Rival {
    state: EmulatorState,
    pools: Option<PoolRival>,
}

/// A careful rival on agent pools (read, then write with `If-Match`), as Terraform or the
/// portal would be, through the emulator's ARM API.
#[derive(Clone)]
struct PoolRival {
    http: reqwest::Client,
    token: String,
    base: String,
}

impl PoolRival {
    fn url(&self, tail: &str) -> String {
        format!(
            "{}/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.ContainerService/managedClusters/{CLUSTER}{tail}?api-version={AKS_API}",
            self.base
        )
    }

    async fn call(
        &self,
        method: reqwest::Method,
        tail: &str,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let mut req = self
            .http
            .request(method, self.url(tail))
            .bearer_auth(&self.token);
        if let Some(e) = if_match {
            req = req.header("If-Match", e);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let rsp = req.send().await?;
        let status = rsp.status().as_u16();
        let bytes = rsp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        ))
    }

    async fn create_cluster(&self, profiles: Vec<serde_json::Value>) -> anyhow::Result<()> {
        let body = serde_json::json!({"location": "westeurope", "properties": {
            "kubernetesVersion": "1.30.6", "dnsPrefix": CLUSTER, "agentPoolProfiles": profiles}});
        let (status, answer) = self
            .call(reqwest::Method::PUT, "", Some(&body), None)
            .await?;
        anyhow::ensure!(status < 300, "cluster PUT answered {status}: {answer}");
        Ok(())
    }

    /// Read the pool, change its count or a tag, write it back under `If-Match`.
    async fn pool_write(&self, pool: &str, count: Option<i64>, tag: &str) -> anyhow::Result<bool> {
        let tail = format!("/agentPools/{pool}");
        let (status, mut v) = self.call(reqwest::Method::GET, &tail, None, None).await?;
        anyhow::ensure!(status == 200, "pool GET answered {status}");
        let etag = crate::azure::aks::pool_from_json(CLUSTER, v.clone(), None)
            .map_err(anyhow::Error::msg)?
            .etag;
        if let Some(props) = v.get_mut("properties").and_then(|p| p.as_object_mut()) {
            match count {
                Some(c) => {
                    props.insert("count".into(), c.into());
                }
                None => {
                    let tags = props.entry("tags").or_insert_with(|| serde_json::json!({}));
                    tags["rival-change"] = tag.into();
                }
            }
        }
        let (status, _) = self
            .call(reqwest::Method::PUT, &tail, Some(&v), etag.as_deref())
            .await?;
        Ok(status < 300)
    }

    /// A cluster-level write: a tag on the managed cluster (PATCH under `If-Match`).
    async fn cluster_write(&self, tag: &str) -> anyhow::Result<bool> {
        let (status, v) = self.call(reqwest::Method::GET, "", None, None).await?;
        anyhow::ensure!(status == 200, "cluster GET answered {status}");
        let etag = v
            .get("eTag")
            .or_else(|| v.get("etag"))
            .and_then(|e| e.as_str())
            .map(str::to_string);
        let body = serde_json::json!({"tags": {"rival-change": tag}});
        let (status, _) = self
            .call(reqwest::Method::PATCH, "", Some(&body), etag.as_deref())
            .await?;
        Ok(status < 300)
    }
}

async fn rival_writer(
    rival: Rival,
    groups: Vec<NodeGroupSpec>,
    every: Duration,
    seed: u64,
    count: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(1));
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let g = &groups[rng.gen_range(0..groups.len())];
        n += 1;
        let capacity = rng.gen_bool(0.6).then(|| rng.gen_range(0..=9));
        let ok = match &rival.pools {
            Some(pools) => {
                let cluster_level = rng.gen_bool(0.3);
                let written = if cluster_level {
                    pools.cluster_write(&n.to_string()).await
                } else {
                    pools.pool_write(&g.name, capacity, &n.to_string()).await
                };
                written.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "rival write failed");
                    false
                })
            }
            None => match capacity {
                Some(c) => rival
                    .state
                    .rival_set_capacity(SUBSCRIPTION, RESOURCE_GROUP, &g.name, c, RIVAL)
                    .is_ok(),
                None => {
                    let tags = BTreeMap::from([("rival-change".to_string(), n.to_string())]);
                    rival
                        .state
                        .rival_set_tags(SUBSCRIPTION, RESOURCE_GROUP, &g.name, tags, RIVAL)
                        .is_ok()
                }
            },
        };
        if ok {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The capacity the emulator holds for node group `g` now.
fn capacity_of(state: &EmulatorState, g: &NodeGroupSpec) -> Option<i64> {
    match &g.kind {
        NodeGroupKind::Vmss => state
            .scale_set(SUBSCRIPTION, RESOURCE_GROUP, &g.name)
            .map(|v| v.capacity),
        NodeGroupKind::AksAgentPool { cluster } => {
            state.agent_pool_count(SUBSCRIPTION, RESOURCE_GROUP, cluster, &g.name)
        }
    }
}

/// The controller's 412s on pools, split by the rival write that last touched the pool before
/// each: `(after a cluster-level write, after a pool-level write)`.
fn conflicts_by_cause(state: &EmulatorState, controllers: &[&str]) -> (u64, u64) {
    // Per pool: whether the last rival write that moved its ETag was pool-level.
    let mut last_cause: std::collections::HashMap<String, bool> = Default::default();
    let mut cluster_wide = false;
    let (mut by_cluster, mut by_pool) = (0, 0);
    for r in state.request_log() {
        let path = r.path.to_ascii_lowercase();
        let pool = path.rsplit_once("/agentpools/").map(|(_, p)| p.to_string());
        let ok = (200..300).contains(&r.status);
        match r.writer.as_deref() {
            Some(RIVAL) if ok && r.method == "PATCH" && pool.is_none() => {
                // Every pool's ETag moved: forget the per-pool causes.
                last_cause.clear();
                cluster_wide = true;
            }
            Some(RIVAL) if ok && r.method == "PUT" => {
                if let Some(p) = pool {
                    last_cause.insert(p, true);
                }
            }
            Some(w) if controllers.contains(&w) && r.method == "PUT" && r.status == 412 => {
                let cluster = pool
                    .and_then(|p| last_cause.get(&p).copied())
                    .map(|pool_level| !pool_level)
                    .unwrap_or(cluster_wide);
                if cluster {
                    by_cluster += 1;
                } else {
                    by_pool += 1;
                }
            }
            _ => {}
        }
    }
    (by_cluster, by_pool)
}

/// The sum of one counter over every replica's metrics.
fn total(
    metrics: &[Arc<Metrics>],
    counter: fn(&Metrics) -> &prometheus::IntCounterVec,
    labels: &[(&str, &str)],
) -> u64 {
    metrics
        .iter()
        .map(|m| Metrics::counter_sum(counter(m), labels))
        .sum()
}

fn writes(m: &Metrics) -> &prometheus::IntCounterVec {
    &m.capacity_writes_total
}

fn progress_line(
    elapsed: Duration,
    m: &[Arc<Metrics>],
    state: &EmulatorState,
    groups: &[NodeGroupSpec],
    rival: u64,
    leader: Option<&str>,
) {
    let mut line = format!(
        "[{:>3}s] writes {:>3}  412s {:>3}  foreign {:>3}  rival {:>3}  lost {:>2} |",
        elapsed.as_secs(),
        total(m, writes, &[("result", "ok")]),
        total(m, writes, &[("result", "precondition_failed")]),
        total(m, |m| &m.foreign_writes_total, &[]),
        rival,
        state.lost_updates().len(),
    );
    if let Some(leader) = leader {
        line = format!("{line} leader: {leader:<9} |");
    }
    let now = time::OffsetDateTime::now_utc();
    for g in groups {
        let cap = capacity_of(state, g)
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into());
        let want = crate::planner::desired_capacity(g, &crate::planner::ConfiguredDemand, now)
            .map(|d| d.to_string())
            .unwrap_or_else(|| format!("{}..{}", g.min_size, g.max_size));
        line.push_str(&format!(" {} {}/{}", g.name, cap, want));
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The summary table and totals; `controllers` are the service principals of the replicas;
/// `stopped` is when the controller stopped: the desired column is what the plan wanted then.
fn summary(
    args: &DemoArgs,
    m: &[Arc<Metrics>],
    state: &EmulatorState,
    groups: &[NodeGroupSpec],
    rival: u64,
    controllers: &[&str],
    stopped: time::OffsetDateTime,
) -> String {
    // Printed as it goes, and kept for the report.
    let mut text = String::new();
    macro_rules! println {
        () => {{
            std::println!();
            text.push('\n');
        }};
        ($($t:tt)*) => {{
            let line = format!($($t)*);
            std::println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }};
    }
    let sum = |c: fn(&Metrics) -> &prometheus::IntCounterVec, l: &[(&str, &str)]| total(m, c, l);
    let lost = state.lost_updates();
    println!();
    println!(
        "summary ({}{}):",
        if args.no_etag {
            "blind writes, enableVMSSEtag=false"
        } else {
            "ETag concurrency, enableVMSSEtag=true"
        },
        match (args.aks, args.kubernetes) {
            (true, true) => ", AKS agent pools, two replicas",
            (true, false) => ", AKS agent pools",
            (false, true) => ", two replicas",
            (false, false) => "",
        }
    );
    println!(
        "  {:<10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6}",
        if args.aks { "pool" } else { "scale set" },
        "capacity",
        "desired",
        "writes",
        "412s",
        "foreign",
        "lost"
    );
    let now = stopped;
    for g in groups {
        let n = g.name.as_str();
        let cap = capacity_of(state, g)
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into());
        let want = crate::planner::desired_capacity(g, &crate::planner::ConfiguredDemand, now)
            .map(|d| d.to_string())
            .unwrap_or_else(|| format!("{}..{}", g.min_size, g.max_size));
        println!(
            "  {:<10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6}",
            n,
            cap,
            want,
            sum(writes, &[("scale_set", n), ("result", "ok")]),
            sum(
                writes,
                &[("scale_set", n), ("result", "precondition_failed")]
            ),
            sum(|m| &m.foreign_writes_total, &[("scale_set", n)]),
            lost.iter()
                .filter(|l| l.resource.ends_with(&format!("/{n}")))
                .count(),
        );
    }
    println!();
    println!(
        "  capacity writes accepted     {}",
        sum(writes, &[("result", "ok")])
    );
    println!(
        "  412 Precondition Failed      {}  (skipped {}, retried_ok {}, gave_up {}, gone {})",
        sum(writes, &[("result", "precondition_failed")]),
        sum(|m| &m.etag_conflicts_total, &[("outcome", "skipped")]),
        sum(|m| &m.etag_conflicts_total, &[("outcome", "retried_ok")]),
        sum(|m| &m.etag_conflicts_total, &[("outcome", "gave_up")]),
        sum(|m| &m.etag_conflicts_total, &[("outcome", "gone")]),
    );
    println!(
        "  foreign writes detected      {}",
        sum(|m| &m.foreign_writes_total, &[])
    );
    if args.aks {
        let (by_cluster, by_pool) = conflicts_by_cause(state, controllers);
        println!(
            "  412s after a cluster write   {by_cluster}  (after a pool-level write {by_pool})"
        );
    }
    println!("  rival writes made            {rival}");
    let ops: &[&str] = if args.aks {
        &[
            "list_agent_pools",
            "get_agent_pool",
            "put_agent_pool",
            "get_managed_cluster",
            "list_instances",
            "poll_operation",
        ]
    } else {
        &[
            "list_scale_sets",
            "get_scale_set",
            "put_capacity",
            "list_instances",
            "poll_operation",
        ]
    };
    let calls: Vec<String> = ops
        .iter()
        .map(|op| {
            format!(
                "{op} {}",
                sum(|m| &m.arm_requests_total, &[("operation", op)])
            )
        })
        .collect();
    println!("  ARM calls                    {}", calls.join(", "));
    println!("  lost updates (emulator)      {}", lost.len());
    for l in lost.iter().take(5) {
        println!(
            "    - {} overwrote {} ({}) by {} on {}",
            l.writer, l.replaced_etag, l.replaced_change, l.replaced_writer, l.resource
        );
    }
    if lost.len() > 5 {
        println!("    ... and {} more", lost.len() - 5);
    }
    if args.no_etag {
        println!("\nWith blind writes the controller overwrote changes it had never seen. Run without --no-etag: the same scenario loses nothing.");
    } else if lost.is_empty() {
        println!("\nNo update was lost: every write carried If-Match, and each 412 made the controller re-read and re-plan. Try --no-etag.");
    }
    text
}

// ---------------------------------------------------------------------------------------------
// demo --kubernetes
// ---------------------------------------------------------------------------------------------

/// The demo's replicas: their Lease and Events identities and their service principals (so the
/// emulator's request log tells their Azure calls apart).
const REPLICAS: [&str; 2] = ["replica-a", "replica-b"];
/// Namespace of the Lease, the status ConfigMap and the Events (the controller's default).
const NAMESPACE: &str = crate::config::DEFAULT_NAMESPACE;
/// Short Lease settings, so the demo shows a hand-over in seconds (the defaults: 15 s, 10 s, 2 s).
const LEASE_DURATION: Duration = Duration::from_secs(4);
/// See [`LEASE_DURATION`].
const RENEW_DEADLINE: Duration = Duration::from_secs(3);
/// See [`LEASE_DURATION`].
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// How often the referee samples who may write and who holds the Lease.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// How long the last leader runs on alone once the rival stops, so the plan converges.
const SETTLE: Duration = Duration::from_secs(3);

/// What `demo --kubernetes` measured; its test asserts on it.
#[derive(Debug, Clone, Default)]
pub struct KubernetesReport {
    /// The replicas' identities (also their service principals).
    pub replicas: Vec<String>,
    /// Samples taken by the referee (every 10 ms) of whose fence lets Azure writes go.
    pub samples: u64,
    /// Samples in which more than one replica's fence let writes go (must be 0).
    pub samples_with_two_leaders: u64,
    /// The Lease's holder after each change the referee saw, in order (`None`: released).
    pub lease_holders: Vec<Option<String>>,
    /// The leader stopped halfway.
    pub deposed: Option<String>,
    /// The replica that led after it.
    pub successor: Option<String>,
    /// From the Lease's release to the successor's first renewal, as the API server saw it.
    pub handover: Option<Duration>,
    /// Azure writes sent per replica (PUT, PATCH, POST, DELETE on ARM; the request log).
    pub writes: BTreeMap<String, u64>,
    /// Azure writes the deposed leader sent after it stopped leading (must be 0).
    pub deposed_writes_after_release: u64,
    /// The status ConfigMap's `status` document (YAML), if it exists.
    pub status: Option<String>,
    /// The Events in the namespace, in the API server's order.
    pub events: Vec<EventRow>,
    /// Updates the emulator saw lost.
    pub lost_updates: usize,
}

/// One row of `kubectl get events`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// `LAST SEEN`, e.g. `12s` or `3s (x4 over 20s)`.
    pub last_seen: String,
    /// `TYPE`: `Normal` or `Warning`.
    pub type_: String,
    /// `REASON`, e.g. `LeaderElection`.
    pub reason: String,
    /// `OBJECT`, e.g. `lease/vmss-capacity-controller`.
    pub object: String,
    /// `MESSAGE` (the Event's `note`).
    pub message: String,
    /// Occurrences (the series count, else 1).
    pub count: i32,
}

/// A change of the Lease's holder, as the referee saw it.
#[derive(Debug, Clone)]
struct HolderChange {
    at: tokio::time::Instant,
    holder: Option<String>,
    /// The last Azure request the emulator had logged when the change was seen.
    seq: u64,
}

/// What the referee saw.
#[derive(Debug, Default)]
struct Referee {
    samples: u64,
    two_leaders: u64,
    /// `None` until the first sample.
    holder: Option<Option<String>>,
    changes: Vec<HolderChange>,
}

/// The Lease's holder, read in process from the emulator's store.
fn lease_holder(kube: &crate::emulator::kube::KubeState) -> Option<String> {
    kube.get(
        "coordination.k8s.io/v1",
        "leases",
        NAMESPACE,
        crate::config::DEFAULT_LEASE_NAME,
    )
    .ok()
    .and_then(|l| {
        l.pointer("/spec/holderIdentity")
            .and_then(|h| h.as_str())
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    })
}

fn last_seq(state: &EmulatorState) -> u64 {
    state.request_log().last().map_or(0, |r| r.seq)
}

/// Samples every [`SAMPLE_EVERY`] whose fence is open and who holds the Lease, until `stop`,
/// and once more then (the last release may land between two ticks).
async fn referee(
    fences: Vec<Arc<crate::kube::lease::Leadership>>,
    kube: crate::emulator::kube::KubeState,
    state: EmulatorState,
    seen: Arc<parking_lot::Mutex<Referee>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        sample(&fences, &kube, &state, &mut seen.lock());
        if last {
            return;
        }
    }
}

/// One look at the fences and the Lease.
fn sample(
    fences: &[Arc<crate::kube::lease::Leadership>],
    kube: &crate::emulator::kube::KubeState,
    state: &EmulatorState,
    r: &mut Referee,
) {
    use crate::fence::WriteFence;
    let open: Vec<bool> = fences.iter().map(|f| f.check().is_ok()).collect();
    let holder = lease_holder(kube);
    let now = tokio::time::Instant::now();
    r.samples += 1;
    if open.iter().filter(|o| **o).count() > 1 {
        r.two_leaders += 1;
    }
    if r.holder.as_ref() != Some(&holder) {
        r.holder = Some(holder.clone());
        r.changes.push(HolderChange {
            at: now,
            holder,
            seq: last_seq(state),
        });
    }
}

/// A kubeconfig for the emulator's Kubernetes side, in `dir`.
fn write_kubeconfig(
    stage: &Stage,
    kubeconfig: Option<String>,
) -> anyhow::Result<std::path::PathBuf> {
    let text = kubeconfig.context("the emulator's Kubernetes side is off")?;
    let path = stage.dir.join("kubeconfig");
    std::fs::write(&path, text)
        .with_context(|| format!("writing the demo kubeconfig {}", path.display()))?;
    Ok(path)
}

/// A running replica of the demo.
struct Running {
    name: String,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    leadership: Arc<crate::kube::lease::Leadership>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    fn leads(&self) -> bool {
        use crate::fence::WriteFence;
        self.leadership.check().is_ok()
    }
}

/// `demo --kubernetes`: two replicas, each wired as `run` wires one ([`Replica`]), elect a
/// leader on a Lease in the emulator's Kubernetes API; halfway the leader stops as on SIGTERM
/// (it releases the Lease) and the standby takes over. Prints live lines (unless `--quiet`),
/// the summary, the hand-over, the status ConfigMap and the Events; returns what it measured.
pub async fn kubernetes(args: &DemoArgs) -> anyhow::Result<KubernetesReport> {
    let stage = Stage::new(args).await?;
    let kube_state = stage
        ._emulator
        .kube()
        .context("the emulator's Kubernetes side is off")?;
    let kubeconfig = write_kubeconfig(&stage, stage._emulator.kubeconfig())?;
    let kubernetes = KubernetesSettings {
        enabled: true,
        kubeconfig: Some(kubeconfig.clone()),
        namespace: NAMESPACE.into(),
        leader_election: crate::config::LeaderElectionSettings {
            enabled: true,
            lease_name: crate::config::DEFAULT_LEASE_NAME.into(),
            lease_duration: LEASE_DURATION,
            renew_deadline: RENEW_DEADLINE,
            retry_period: RETRY_PERIOD,
        },
        status_config_map: crate::config::DEFAULT_STATUS_CONFIG_MAP.into(),
        ..KubernetesSettings::default()
    };
    let mut built = Vec::new();
    for name in REPLICAS {
        let secret = stage.register(name)?;
        let settings = Arc::new(stage.settings(args, name, secret, kubernetes.clone())?);
        let replica = Replica::build(
            settings,
            Arc::new(Metrics::new()),
            ReplicaOptions {
                dry_run: false,
                identity: Some(name.to_string()),
            },
        )
        .await
        .with_context(|| format!("wiring {name}"))?;
        built.push((name, replica));
    }

    println!(
        "demo: ARM emulator and Kubernetes API at {}, {}, rival writer every {:?}, ETag concurrency {} (runs {:?})",
        stage.base,
        stage.what(args),
        args.rival_interval,
        etag_mode(args),
        args.duration
    );
    println!(
        "      {} controller replicas ({}), each wired as `run` wires one, electing a leader on Lease {NAMESPACE}/{}",
        REPLICAS.len(),
        REPLICAS.join(", "),
        crate::config::DEFAULT_LEASE_NAME
    );
    println!(
        "      demo lease settings: leaseDuration {:?}, renewDeadline {:?}, retryPeriod {:?} (defaults 15s, 10s, 2s); halfway the leader stops as on SIGTERM",
        LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD
    );

    let mut replicas = Vec::new();
    for (name, replica) in built {
        let leadership = replica
            .leadership()
            .context("leader election is on in the demo's settings")?;
        let stop = CancellationToken::new();
        let (metrics, reconciler) = (replica.metrics(), replica.reconciler());
        let task = tokio::spawn(replica.serve(stop.clone(), std::future::pending()));
        replicas.push(Running {
            name: name.to_string(),
            metrics,
            reconciler,
            leadership,
            stop,
            task,
        });
    }
    let seen = Arc::new(parking_lot::Mutex::new(Referee::default()));
    let referee_stop = CancellationToken::new();
    let referee_task = tokio::spawn(referee(
        replicas.iter().map(|r| r.leadership.clone()).collect(),
        kube_state.clone(),
        stage.state.clone(),
        seen.clone(),
        referee_stop.clone(),
    ));
    let rival_stop = CancellationToken::new();
    let rival_writes = Arc::new(AtomicU64::new(0));
    let rival = stage.rival(args, rival_writes.clone(), rival_stop.clone());
    let recorder = stage.recorder(args, &REPLICAS);
    let all_metrics: Vec<Arc<Metrics>> = replicas.iter().map(|r| r.metrics.clone()).collect();
    let leader_name =
        |replicas: &[Running]| replicas.iter().find(|r| r.leads()).map(|r| r.name.clone());

    let started = tokio::time::Instant::now();
    let halfway = started + args.duration / 2;
    let mut deposed: Option<usize> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    while started.elapsed() < args.duration {
        tokio::select! {
            _ = tick.tick() => {
                if !args.quiet {
                    let leader = leader_name(&replicas).unwrap_or_else(|| "none".into());
                    progress_line(
                        started.elapsed(),
                        &all_metrics,
                        &stage.state,
                        &stage.groups,
                        rival_writes.load(Ordering::Relaxed),
                        Some(&leader),
                    );
                }
            }
            _ = tokio::time::sleep_until(halfway), if deposed.is_none() => {
                // Stop whoever leads; with no leader yet, look again shortly.
                match replicas.iter().position(|r| r.leads()) {
                    Some(i) => {
                        if !args.quiet {
                            println!(
                                "[{:>3}s] {} leads: stopping it as on SIGTERM (it releases the Lease; the standby should lead within one retry period)",
                                started.elapsed().as_secs(),
                                replicas[i].name
                            );
                        }
                        replicas[i].stop.cancel();
                        deposed = Some(i);
                    }
                    None => tokio::time::sleep(RETRY_PERIOD).await,
                }
            }
        }
    }
    // The rival stops first; the leader re-reads everything and converges on its own.
    rival_stop.cancel();
    let _ = rival.await;
    if let Some(leader) = replicas.iter().find(|r| r.leads()) {
        leader
            .reconciler
            .node_groups()
            .scale_sets()
            .invalidate_all();
    }
    tokio::time::sleep(SETTLE).await;
    let stopped = time::OffsetDateTime::now_utc();
    for r in &replicas {
        r.stop.cancel();
    }
    for r in &mut replicas {
        match (&mut r.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(replica = %r.name, error = %e, "replica ended with an error")
            }
            Err(e) => tracing::warn!(replica = %r.name, error = %e, "replica task failed"),
        }
    }
    referee_stop.cancel();
    let _ = referee_task.await;

    let client = kube_client_from(&kubeconfig).await?;
    let status = read_status(&client).await?;
    let events = read_events(&client).await?;
    let report = measure(
        &replicas,
        &seen.lock(),
        deposed,
        &stage.state,
        status,
        events,
    );
    let timeline = recorder.finish().await?;
    let text = summary(
        args,
        &all_metrics,
        &stage.state,
        &stage.groups,
        rival_writes.load(Ordering::Relaxed),
        &REPLICAS,
        stopped,
    );
    print_kubernetes(&report, &replicas);
    let handover = match (&report.deposed, &report.successor, report.handover) {
        (Some(d), Some(s), Some(t)) => format!(
            "Halfway the leader {d} stopped as on SIGTERM and released the Lease; {s} took it over {t:?} later. Samples with two leaders: {}; writes of the deposed leader after its release: {}.",
            report.samples_with_two_leaders, report.deposed_writes_after_release
        ),
        _ => "No hand-over was seen.".to_string(),
    };
    stage.write_report(args, timeline, text, vec![handover])?;
    Ok(report)
}

/// The report from what the referee saw and the emulator logged.
fn measure(
    replicas: &[Running],
    seen: &Referee,
    deposed: Option<usize>,
    state: &EmulatorState,
    status: Option<String>,
    events: Vec<EventRow>,
) -> KubernetesReport {
    let log = state.request_log();
    let is_write = |r: &crate::emulator::RequestRecord| {
        r.method != "GET" && r.path.to_ascii_lowercase().starts_with("/subscriptions/")
    };
    let mut writes: BTreeMap<String, u64> = replicas.iter().map(|r| (r.name.clone(), 0)).collect();
    for r in log.iter().filter(|r| is_write(r)) {
        if let Some(n) = r.writer.as_ref().and_then(|w| writes.get_mut(w)) {
            *n += 1;
        }
    }
    let deposed_name = deposed.map(|i| replicas[i].name.clone());
    // Its writes the emulator logged after the Lease was seen to stop naming it: the release
    // waits for admitted writes to be answered, so there must be none.
    let released = deposed_name.as_ref().and_then(|name| {
        let held = seen
            .changes
            .iter()
            .position(|c| c.holder.as_deref() == Some(name.as_str()))?;
        seen.changes[held + 1..]
            .iter()
            .find(|c| c.holder.as_deref() != Some(name.as_str()))
            .map(|c| c.seq)
    });
    let deposed_writes_after_release = match (&deposed_name, released) {
        (Some(name), Some(seq)) => log
            .iter()
            .filter(|r| is_write(r) && r.seq > seq && r.writer.as_deref() == Some(name))
            .count() as u64,
        // Stopped but never seen to let go: count everything it sent.
        (Some(name), None) => log
            .iter()
            .filter(|r| is_write(r) && r.writer.as_deref() == Some(name))
            .count() as u64,
        _ => 0,
    };
    // The hand-over on the API server: the deposed leader's release (holder cleared), then the
    // first change naming another holder.
    let mut handover = None;
    let mut successor = None;
    if let Some(name) = &deposed_name {
        let from = seen
            .changes
            .iter()
            .position(|c| c.holder.as_deref() == Some(name.as_str()));
        if let Some(from) = from {
            let release = seen.changes[from + 1..]
                .iter()
                .find(|c| c.holder.as_deref() != Some(name.as_str()));
            let next = seen.changes[from + 1..]
                .iter()
                .find(|c| c.holder.as_ref().is_some_and(|h| h != name));
            if let (Some(release), Some(next)) = (release, next) {
                handover = Some(next.at.saturating_duration_since(release.at));
                successor = next.holder.clone();
            }
        }
    }
    KubernetesReport {
        replicas: replicas.iter().map(|r| r.name.clone()).collect(),
        samples: seen.samples,
        samples_with_two_leaders: seen.two_leaders,
        lease_holders: seen.changes.iter().map(|c| c.holder.clone()).collect(),
        deposed: deposed_name,
        successor,
        handover,
        writes,
        deposed_writes_after_release,
        status,
        events,
        lost_updates: state.lost_updates().len(),
    }
}

async fn kube_client_from(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading the demo kubeconfig {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("the demo kubeconfig {}", path.display()))?;
    let mut config = config;
    // As the controller's client: a 429 (a budget refusing an eviction) is an answer, not
    // something to retry for minutes.
    config.default_retry = false;
    kube::Client::try_from(config).context("building the demo's Kubernetes client")
}

/// The status ConfigMap's document, as `kubectl get configmap ... -o jsonpath='{.data.status}'`.
async fn read_status(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), NAMESPACE);
    let cm = api
        .get_opt(crate::config::DEFAULT_STATUS_CONFIG_MAP)
        .await
        .with_context(|| {
            format!(
                "reading ConfigMap {NAMESPACE}/{}",
                crate::config::DEFAULT_STATUS_CONFIG_MAP
            )
        })?;
    Ok(cm
        .and_then(|cm| cm.data)
        .and_then(|mut d| d.remove(crate::kube::status::STATUS_KEY)))
}

/// The namespace's Events as `kubectl get events` shows them.
async fn read_events(client: &kube::Client) -> anyhow::Result<Vec<EventRow>> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(client.clone(), NAMESPACE);
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .with_context(|| format!("listing events.k8s.io/v1 Events in {NAMESPACE}"))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    Ok(list.items.iter().map(|e| event_row(e, now)).collect())
}

/// kubectl's `printEvent` on the core/v1 view of an `events.k8s.io/v1` Event: LAST SEEN is the
/// series' last observation (else the deprecated last timestamp, else the event time), with
/// `(xN over AGE)` when it happened more than once; OBJECT is `kind/name` in lower case.
fn event_row(
    e: &k8s_openapi::api::events::v1::Event,
    now: k8s_openapi::jiff::Timestamp,
) -> EventRow {
    let age = |t: k8s_openapi::jiff::Timestamp| human_duration(now.duration_since(t).as_secs());
    let first = e
        .deprecated_first_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0));
    let last = e
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or(first);
    let count = e
        .series
        .as_ref()
        .map(|s| s.count)
        .or(e.deprecated_count.filter(|c| *c > 0))
        .unwrap_or(1);
    let last_seen = last.map(age).unwrap_or_else(|| "<unknown>".into());
    let last_seen = if count > 1 {
        format!(
            "{last_seen} (x{count} over {})",
            first.map(age).unwrap_or_else(|| "<unknown>".into())
        )
    } else {
        last_seen
    };
    let object = match &e.regarding {
        Some(r) => {
            let kind = r.kind.as_deref().unwrap_or("").to_ascii_lowercase();
            match r.name.as_deref().filter(|n| !n.is_empty()) {
                Some(name) => format!("{kind}/{name}"),
                None => kind,
            }
        }
        None => String::new(),
    };
    EventRow {
        last_seen,
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        object,
        message: e.note.clone().unwrap_or_default(),
        count,
    }
}

/// apimachinery's `duration.HumanDuration` (what kubectl prints in AGE and LAST SEEN).
fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 60 * 2 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = hours / 24 % 365;
        return match days {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Rows as kubectl's tab writer aligns them: every column but the last padded to its widest
/// cell plus 3 spaces, and to at least 10.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count() + 3)
                .max()
                .unwrap_or(0)
                .max(10)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The Kubernetes part of the summary: leadership, writes per replica, the status ConfigMap and
/// the Events.
fn print_kubernetes(report: &KubernetesReport, replicas: &[Running]) {
    println!();
    println!(
        "leader election (Lease {NAMESPACE}/{}):",
        crate::config::DEFAULT_LEASE_NAME
    );
    // A leading `None` is the Lease before anyone created it, not a release.
    let holders: Vec<String> = report
        .lease_holders
        .iter()
        .skip_while(|h| h.is_none())
        .map(|h| h.clone().unwrap_or_else(|| "(released)".into()))
        .collect();
    println!("  Lease holders in order       {}", holders.join(" -> "));
    println!(
        "  two leaders at once          {}  (of {} samples every {:?} of both replicas' write fences)",
        report.samples_with_two_leaders, report.samples, SAMPLE_EVERY
    );
    match (&report.deposed, &report.successor, report.handover) {
        (Some(d), Some(s), Some(h)) => println!(
            "  handover                     {} ms  ({d} released the Lease, {s} renewed it first; retry period {:?})",
            h.as_millis(),
            RETRY_PERIOD
        ),
        (Some(d), _, _) => println!("  handover                     none seen after {d} stopped"),
        _ => println!("  handover                     none: no replica led at halfway"),
    }
    if let Some(d) = &report.deposed {
        println!(
            "  deposed leader's Azure writes after release  {}  ({d})",
            report.deposed_writes_after_release
        );
    }
    for r in replicas {
        println!(
            "  {:<10} Azure writes sent {:>4}  (accepted {}, 412 {}), leadership changes {}",
            r.name,
            report.writes.get(&r.name).copied().unwrap_or(0),
            Metrics::counter_sum(&r.metrics.capacity_writes_total, &[("result", "ok")]),
            Metrics::counter_sum(
                &r.metrics.capacity_writes_total,
                &[("result", "precondition_failed")]
            ),
            r.leadership.transitions()
        );
    }
    println!();
    println!(
        "status ConfigMap ($ kubectl -n {NAMESPACE} get configmap {} -o jsonpath='{{.data.{}}}'):",
        crate::config::DEFAULT_STATUS_CONFIG_MAP,
        crate::kube::status::STATUS_KEY
    );
    match &report.status {
        Some(doc) => {
            for line in doc.lines() {
                println!("  {line}");
            }
        }
        None => println!("  (not written)"),
    }
    println!();
    println!("Events ($ kubectl -n {NAMESPACE} get events):");
    let mut rows = vec![["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
        .map(String::from)
        .to_vec()];
    rows.extend(report.events.iter().map(|e| {
        vec![
            e.last_seen.clone(),
            e.type_.clone(),
            e.reason.clone(),
            e.object.clone(),
            e.message.clone(),
        ]
    }));
    for line in table(&rows).lines() {
        println!("  {line}");
    }
    println!(
        "  (client-go's spam filter, as the recorder applies it: 25 Event calls per object and replica, then one per 5 min; held-back counts go out on the next minute's flush)"
    );
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_printed_as_kubectl_prints_them() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 5, "3h5m"),
            (9 * 3600, "9h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs} s");
        }
    }

    #[test]
    fn a_repeated_event_shows_its_series_count_and_first_age() {
        use k8s_openapi::api::core::v1::ObjectReference;
        use k8s_openapi::api::events::v1::{Event, EventSeries};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        use k8s_openapi::jiff::{SignedDuration, Timestamp};
        let now = Timestamp::now();
        let ago = |s: i64| MicroTime(now - SignedDuration::from_secs(s));
        let mut e = Event {
            event_time: Some(ago(30)),
            type_: Some("Normal".into()),
            reason: Some("CapacityWritten".into()),
            note: Some("node group pool-a".into()),
            regarding: Some(ObjectReference {
                kind: Some("ConfigMap".into()),
                name: Some("vmss-capacity-controller-status".into()),
                ..ObjectReference::default()
            }),
            ..Event::default()
        };
        let once = event_row(&e, now);
        assert_eq!(once.last_seen, "30s");
        assert_eq!(once.object, "configmap/vmss-capacity-controller-status");
        assert_eq!(once.count, 1);
        e.series = Some(EventSeries {
            count: 4,
            last_observed_time: ago(3),
        });
        assert_eq!(event_row(&e, now).last_seen, "3s (x4 over 30s)");
    }

    #[test]
    fn the_table_pads_like_kubectls_tab_writer() {
        let rows = vec![
            vec!["LAST SEEN".to_string(), "TYPE".into(), "MESSAGE".into()],
            vec!["3s (x4 over 30s)".to_string(), "Normal".into(), "m".into()],
        ];
        assert_eq!(
            table(&rows),
            "LAST SEEN          TYPE      MESSAGE\n3s (x4 over 30s)   Normal    m\n"
        );
    }
}
