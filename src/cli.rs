//! Subcommands and their implementations. `main.rs` parses flags and dispatches here.

use crate::azure::arm::{http_client, ArmTarget};
use crate::azure::{credentials, ArmClient, Precondition};
use crate::config::{self, ConfigSources, Settings};
use crate::metrics::Metrics;
use crate::reconciler::Reconciler;
use crate::resource::{CapacityResource, Resources};
use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Keeps Azure VM Scale Set capacity where a plan says it should be, and never silently
/// overwrites another writer's change: every capacity write carries If-Match with the ETag last
/// read, and a 412 makes the controller re-read and re-plan instead of clobbering.
#[derive(Debug, Parser)]
#[command(
    name = "vmss-capacity-controller",
    version,
    about,
    after_help = "Examples:
  vmss-capacity-controller demo                          zero-setup showcase (about 40 s)
  vmss-capacity-controller demo --no-etag                the same with blind writes: lost updates
  vmss-capacity-controller demo --kubernetes             two replicas, a Lease, a leader change
  vmss-capacity-controller check-config -c config.yaml   every problem, with its path
  vmss-capacity-controller run -c config.yaml --once --dry-run
  vmss-capacity-controller run -c config.yaml            the daemon (/metrics on metricsListen)
  vmss-capacity-controller get -c config.yaml pool-a     capacity and ETag as ARM has them
  vmss-capacity-controller scale -c config.yaml pool-a --to 5 --if-match '\"7\"'

Configuration: config/example.yaml documents every key. Secrets come from the environment or
files (ARM_CLIENT_SECRET, clientSecretFile, workload identity), never from the YAML."
)]
pub struct Cli {
    /// Log format: `json` for production, `text` for people.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `vmss_capacity_controller=debug`.
    #[arg(long, global = true, default_value = "info", env = "RUST_LOG")]
    pub log_level: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller (the daemon). Reads scale sets, plans, writes with If-Match.
    Run(RunArgs),
    /// Zero-setup showcase: built-in ARM emulator, scale sets, a rival writer, the controller.
    #[cfg(feature = "emulator")]
    Demo(DemoArgs),
    /// Run the ARM emulator as a standalone server (for tests, demos and your own CI).
    #[cfg(feature = "emulator")]
    Emulator(EmulatorArgs),
    /// Show one scale set or AKS agent pool as ARM has it (capacity, ETag, state, tags).
    Get(GetArgs),
    /// Set one scale set's capacity or agent pool's count once, optionally conditional like
    /// `az ... --if-match`; exits 3 on 412 Precondition Failed.
    Scale(ScaleArgs),
    /// Validate a configuration; print every problem with its path; exit 2 if any.
    CheckConfig(ConfigArgs),
}

/// Where the configuration comes from.
#[derive(Debug, Args, Clone)]
pub struct ConfigArgs {
    /// YAML configuration file.
    #[arg(long, short = 'c', env = "VMSS_CONTROLLER_CONFIG")]
    pub config: Option<PathBuf>,
    /// An existing cluster-autoscaler `azure.json` cloud-config file.
    #[arg(long)]
    pub cloud_config: Option<PathBuf>,
    /// cluster-autoscaler style node group `MIN:MAX:NAME`; repeatable. NAME is a scale set in
    /// `azure.resourceGroup`; an AKS agent pool is configured in the YAML instead
    /// (`nodeGroups: [{name: POOL, kind: aksAgentPool, cluster: CLUSTER, ...}]`).
    #[arg(long = "nodes", value_name = "MIN:MAX:NAME")]
    pub nodes: Vec<String>,
}

/// `run` flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// One refresh + plan + actuate pass, then exit (non-zero if the pass failed).
    #[arg(long)]
    pub once: bool,
    /// Plan and log, never write.
    #[arg(long)]
    pub dry_run: bool,
    /// Override `metricsListen` (e.g. `127.0.0.1:0`).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// `demo` flags.
#[derive(Debug, Args)]
#[cfg(feature = "emulator")]
pub struct DemoArgs {
    /// How long the scenario runs.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Blind writes (no If-Match): shows the lost updates that ETags prevent.
    #[arg(long)]
    pub no_etag: bool,
    /// Number of scale sets (agent pools with `--aks`).
    #[arg(long, default_value_t = 4)]
    pub scale_sets: usize,
    /// How often the rival writer changes a scale set.
    #[arg(long, default_value = "700ms", value_parser = parse_duration)]
    pub rival_interval: Duration,
    /// Seed for the rival writer's choices (same seed, same scenario).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Only the summary, no live progress.
    #[arg(long)]
    pub quiet: bool,
    /// The same showcase on the agent pools of one AKS managed cluster, with a rival making
    /// pool-level and cluster-level writes.
    #[arg(long)]
    pub aks: bool,
    /// Two controller replicas electing a leader on the emulator's Kubernetes API (a Lease); the
    /// leader stops halfway and the standby takes over; then the status ConfigMap and the Events.
    #[arg(long)]
    pub kubernetes: bool,
    /// Pod-driven demand on a simulated cluster (instances become Nodes, a scheduler binds pods):
    /// bursts of pending pods over three node groups (general, memory, a tainted GPU group from
    /// zero), then a shrink, with the rival writer still at work.
    #[arg(long, conflicts_with_all = ["aks", "kubernetes"])]
    pub pods: bool,
}

/// `emulator` flags (a contract: tests outside the project use them).
#[derive(Debug, Args)]
#[cfg(feature = "emulator")]
pub struct EmulatorArgs {
    /// Address to listen on, e.g. `127.0.0.1:8443` or `127.0.0.1:0`.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// Serve HTTPS with a generated certificate.
    #[arg(long)]
    pub tls: bool,
    /// Write the CA certificate (PEM) here so clients can trust it.
    #[arg(long)]
    pub cert_out: Option<PathBuf>,
    /// How long writes stay `InProgress`.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lro_delay: Duration,
    /// Enforce Azure's compute throttling limits (token buckets, 429 with Retry-After).
    #[arg(long)]
    pub throttling: bool,
    /// Also serve the Kubernetes API (`/api`, `/apis`, `/version`) on the same listener.
    #[arg(long)]
    pub kubernetes: bool,
    /// Write a kubeconfig for the Kubernetes API here (server, bearer token, CA with `--tls`);
    /// implies `--kubernetes`.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
}

/// Which resource `get` and `scale` address.
#[derive(Debug, Args)]
pub struct ResourceArgs {
    /// A scale set in `azure.resourceGroup`, or a configured node group's name (scale set or
    /// agent pool).
    #[arg(required_unless_present = "pool", conflicts_with = "pool")]
    pub name: Option<String>,
    /// The managed cluster of `--pool` (in `azure.resourceGroup`).
    #[arg(long, requires = "pool")]
    pub cluster: Option<String>,
    /// An AKS agent pool of `--cluster`.
    #[arg(long, requires = "cluster")]
    pub pool: Option<String>,
}

/// `get` flags.
#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub resource: ResourceArgs,
}

/// `scale` flags.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub resource: ResourceArgs,
    /// New capacity.
    #[arg(long)]
    pub to: i64,
    /// Write only if the scale set still has this ETag (as printed by `get`).
    #[arg(long, conflicts_with = "if_none_match")]
    pub if_match: Option<String>,
    /// `*`: create only (fails with 412 if the scale set exists).
    #[arg(long)]
    pub if_none_match: Option<String>,
}

#[cfg(feature = "emulator")]
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 1m30s, 500ms)"))
}

/// Loads and validates configuration; on problems prints them all and returns exit code 2.
pub fn load_settings(args: &ConfigArgs) -> Result<Settings, ExitCode> {
    let sources = ConfigSources {
        config_file: args.config.clone(),
        cloud_config_file: args.cloud_config.clone(),
        nodes: args.nodes.clone(),
        env: std::env::vars().collect(),
    };
    config::load(&sources).map_err(|errs| {
        eprintln!("configuration has {} problem(s):", errs.0.len());
        eprintln!("{errs}");
        ExitCode(2)
    })
}

/// A process exit code chosen by a subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(pub u8);

/// Builds the ARM client (HTTP client, credential) for `settings`.
pub fn arm_client(settings: &Settings, metrics: Arc<Metrics>) -> anyhow::Result<Arc<ArmClient>> {
    let extra_root = match &settings.azure.ca_bundle_file {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("reading azure.caBundleFile {}", p.display()))?,
        ),
        None => None,
    };
    let http = http_client(settings.request_timeout, extra_root.as_deref())
        .context("building the HTTP client")?;
    let m = metrics.clone();
    let hook: credentials::MetricsHook = Arc::new(move |kind: &'static str, ok: bool| {
        if !ok {
            m.credential_errors_total.with_label_values(&[kind]).inc();
        }
    });
    let credential = credentials::build_credential(&settings.azure, http.clone(), Some(hook))
        .context("building the Azure credential")?;
    let target = ArmTarget {
        endpoint: settings.azure.resource_manager_endpoint.clone(),
        subscription: settings.azure.subscription_id.clone(),
        resource_group: settings.azure.resource_group.clone(),
    };
    Ok(Arc::new(ArmClient::new(target, credential, http, metrics)))
}

/// `check-config`.
pub fn check_config(args: &ConfigArgs) -> ExitCode {
    match load_settings(args) {
        Ok(s) => {
            println!(
                "configuration OK: {} node group(s){}, ETag concurrency {}",
                s.node_groups.len(),
                if s.auto_discovery.is_some() {
                    " + auto-discovery"
                } else {
                    ""
                },
                if s.enable_vmss_etag {
                    "on"
                } else {
                    "OFF (blind writes)"
                }
            );
            for g in &s.node_groups {
                if let config::NodeGroupKind::AksAgentPool { cluster } = &g.kind {
                    println!(
                        "warning: nodeGroups {}: agent pool of {cluster}: whether AKS's own autoscaler owns it \
                         (enableAutoScaling: true) is only known at run time; the controller checks every \
                         read, never writes such a pool, logs why and counts writes_held_total{{reason=\"aks_autoscaler\"}}",
                        g.name
                    );
                }
            }
            ExitCode(0)
        }
        Err(code) => code,
    }
}

/// `run`: the daemon, or one pass with `--once`.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let mut settings = match load_settings(&args.config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    if let Some(addr) = args.metrics_listen {
        settings.metrics_listen = Some(addr);
    }
    if !settings.enable_vmss_etag {
        tracing::warn!("enableVMSSEtag is off: capacity writes are blind and can overwrite other writers' changes");
    }
    let replica = Replica::build(
        Arc::new(settings),
        Arc::new(Metrics::new()),
        ReplicaOptions {
            dry_run: args.dry_run,
            identity: None,
        },
    )
    .await?;
    if args.once {
        return Ok(replica.once().await);
    }
    replica
        .serve(CancellationToken::new(), wait_for_signal())
        .await?;
    Ok(ExitCode(0))
}

/// How a [`Replica`] is built beyond its settings.
#[derive(Debug, Clone, Default)]
pub struct ReplicaOptions {
    /// Plan and log, never write (`run --dry-run`).
    pub dry_run: bool,
    /// The Lease and Events identity; `None`: the pod name plus a random suffix
    /// ([`crate::kube::identity`]).
    pub identity: Option<String>,
}

/// One controller replica wired as `run` wires it: its ARM client, and with
/// `kubernetes.enabled` its Kubernetes client, Events recorder and poster, leader election on
/// the Lease (the fence of every Azure write), status writer and reflectors. `run` builds one;
/// `demo --kubernetes` builds two in one process.
pub struct Replica {
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    election: Option<Arc<crate::kube::lease::LeaderElection>>,
    /// `run --dry-run`: no write of any kind.
    dry_run: bool,
    identity: Option<String>,
    kube_client: Option<kube::Client>,
    /// Stops the Event poster and the status writer.
    kube_stop: CancellationToken,
    kube_tasks: Option<KubeTasks>,
    /// `demand: pods`: what the scale-up loop publishes to (the reconciler's demand source).
    pod_demand: Option<Arc<crate::pod_demand::PodDemand>>,
    events: Arc<dyn crate::notify::EventSink>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("identity", &self.identity)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// Builds the replica and starts its Event poster and status writer (they write only while
    /// the fence lets this replica write). Nothing reconciles until [`Replica::serve`] or
    /// [`Replica::once`].
    pub async fn build(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        options: ReplicaOptions,
    ) -> anyhow::Result<Self> {
        let arm = arm_client(&settings, metrics.clone())?;
        let kube_side = kube_side(&settings, metrics.clone(), options.identity).await?;
        let identity = kube_side.as_ref().map(|k| k.identity.clone());
        if let Some(id) = &identity {
            // One identity for the Lease, the Events and the Azure calls' User-Agent.
            arm.set_instance(id);
        }
        // A dry run writes nothing anywhere: it takes no Lease (every dry-running replica plans
        // on its own), posts no Event (it logs them) and writes no status ConfigMap; the
        // reconciler holds its Azure writes and scale-down only says what it would remove.
        let election = if options.dry_run {
            if kube_side.is_some() && settings.kubernetes.leader_election.enabled {
                tracing::info!("dry run: no Lease is taken; Events are logged, not posted, and no status is written");
            }
            None
        } else {
            leader_election(&settings, kube_side.as_ref())
        };
        let events: Arc<dyn crate::notify::EventSink> = match &kube_side {
            _ if options.dry_run => Arc::new(crate::notify::LogEvents),
            Some(k) => k.recorder.clone(),
            None => Arc::new(crate::notify::NoEvents),
        };
        let mut builder = Reconciler::builder(settings.clone(), arm, metrics.clone())
            .dry_run(options.dry_run)
            .events(events.clone());
        if let Some(e) = &election {
            builder = builder.fence(e.leadership());
        }
        let pod_demand = crate::pod_demand::demand_source(&settings);
        if let Some(d) = &pod_demand {
            builder = builder.demand(d.clone());
        }
        let reconciler = Arc::new(builder.build());
        let kube_client = kube_side.as_ref().map(|k| k.client.clone());
        // Events and the status ConfigMap: background tasks owned here, stopped by `kube_stop`.
        let kube_stop = CancellationToken::new();
        let kube_tasks = kube_side.filter(|_| !options.dry_run).map(|k| {
            let fence: Arc<dyn crate::fence::WriteFence> = match &election {
                Some(e) => e.leadership(),
                None => Arc::new(crate::fence::Unfenced),
            };
            k.spawn(
                &settings,
                reconciler.clone(),
                fence,
                metrics.clone(),
                kube_stop.clone(),
            )
        });
        Ok(Self {
            settings,
            metrics,
            reconciler,
            election,
            dry_run: options.dry_run,
            identity,
            kube_client,
            kube_stop,
            kube_tasks,
            pod_demand,
            events,
        })
    }

    /// The reconciler (its caches, its status).
    pub fn reconciler(&self) -> Arc<Reconciler> {
        self.reconciler.clone()
    }

    /// The metrics this replica counts in.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether this replica leads, when leader election is on (the fence of its Azure writes).
    pub fn leadership(&self) -> Option<Arc<crate::kube::lease::Leadership>> {
        self.election.as_ref().map(|e| e.leadership())
    }

    /// The Lease and Events identity, when `kubernetes.enabled`.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// `run --once`: one Lease attempt, one pass, the status written, the Lease released.
    pub async fn once(self) -> ExitCode {
        let Replica {
            reconciler,
            election,
            kube_stop,
            kube_tasks,
            ..
        } = self;
        if let Some(e) = &election {
            // One attempt: a pass by a replica that does not get the Lease writes nothing.
            if let Err(err) = e.try_acquire_or_renew().await {
                tracing::warn!(error = %err, "lease attempt failed: this pass will not write");
            }
        }
        let pass = reconciler.run_once().await;
        if let Some(tasks) = &kube_tasks {
            // The leader of this one pass says what it did before it lets go of the Lease.
            tasks.write_status_now(&reconciler).await;
        }
        if let Some(e) = &election {
            e.release().await;
        }
        stop_kube_tasks(kube_stop, kube_tasks).await;
        match pass {
            Ok(report) => {
                tracing::info!(
                    planned = report.planned,
                    written = report.written,
                    conflicts = report.conflicts,
                    held = report.held,
                    "pass complete"
                );
                ExitCode(0)
            }
            Err(e) => {
                tracing::error!(error = %e, cause = ?std::error::Error::source(&e).map(|s| s.to_string()), "pass failed");
                ExitCode(1)
            }
        }
    }

    /// The daemon: reflectors, `/metrics` (when `metricsListen`), the elector, the reconcile
    /// loop, until `shutdown` is cancelled or `signal` completes (SIGTERM in `run`). On the way
    /// out the elector releases the Lease and the Kubernetes tasks stop.
    pub async fn serve(
        self,
        shutdown: CancellationToken,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Replica {
            settings,
            metrics,
            reconciler,
            election,
            dry_run,
            kube_client,
            kube_stop,
            kube_tasks,
            pod_demand,
            events,
            ..
        } = self;
        // The reflectors start before the loop so their first full lists overlap the first
        // scale-set refresh; /readyz waits for both.
        let node_actions: Option<Arc<dyn crate::kube::nodes::NodeActions>> = kube_client
            .as_ref()
            .filter(|_| settings.scale_down.enabled)
            .map(|c| {
                Arc::new(crate::kube::nodes::KubeNodeActions::new(c.clone()))
                    as Arc<dyn crate::kube::nodes::NodeActions>
            });
        let (cluster, reflectors) = match kube_client {
            Some(client) => {
                let (view, tasks) =
                    crate::kube::reflect::start(client, metrics.clone(), shutdown.clone()).await;
                (Some(view), tasks)
            }
            None => (None, Vec::new()),
        };
        // `demand: pods`: batches pending pods into scale-up decisions for the reconciler.
        let scale_up_task = match (pod_demand, &cluster) {
            (Some(demand), Some(view)) => Some(tokio::spawn(
                crate::pod_demand::ScaleUpLoop::new(
                    settings.clone(),
                    demand,
                    reconciler.clone(),
                    view.clone(),
                    metrics.clone(),
                    events.clone(),
                )
                .run(shutdown.clone()),
            )),
            _ => None,
        };
        // `scaleDown.enabled`: removes unneeded nodes, one instance at a time through Azure.
        let scale_down_task = match (node_actions, &cluster) {
            (Some(actions), Some(view)) => Some(tokio::spawn(
                crate::scale_down::ScaleDownLoop::new(
                    settings.clone(),
                    reconciler.clone(),
                    view.clone(),
                    actions,
                    metrics.clone(),
                    events,
                )
                .dry_run(dry_run)
                .run(shutdown.clone()),
            )),
            _ => None,
        };
        let mut http_task = None;
        if let Some(addr) = settings.metrics_listen {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(crate::http::serve(
                addr,
                metrics.clone(),
                reconciler.clone(),
                crate::http::Readiness {
                    election: election.as_ref().map(|e| e.leadership()),
                    cluster: cluster.clone(),
                },
                shutdown.clone(),
                tx,
            ));
            match rx.await {
                Ok(bound) => tracing::info!(%bound, "serving /metrics, /healthz, /readyz"),
                Err(_) => {
                    let err = task
                        .await
                        .map_err(anyhow::Error::from)
                        .and_then(|r| r.map_err(anyhow::Error::from));
                    bail!("cannot listen on {addr}: {err:?}");
                }
            }
            http_task = Some(task);
        }
        let signals = shutdown.clone();
        let signal_task = tokio::spawn(async move {
            tokio::select! {
                _ = signal => {
                    tracing::info!("signal received: shutting down");
                    signals.cancel();
                }
                _ = signals.cancelled() => {}
            }
        });
        // The elector releases the Lease as soon as shutdown starts: the fence then holds any
        // write the last pass has not sent yet, and a standby takes over within a retry period.
        let election_task = election.map(|e| {
            let leadership = e.leadership();
            let stop = shutdown.clone();
            let gauges = tokio::spawn(publish_leadership(
                leadership,
                metrics.clone(),
                stop.clone(),
            ));
            (tokio::spawn(async move { e.run(stop).await }), gauges)
        });
        reconciler.run(shutdown.clone()).await;
        shutdown.cancel();
        let _ = signal_task.await;
        if let Some((elector, gauges)) = election_task {
            let _ = elector.await;
            let _ = gauges.await;
        }
        if let Some(task) = scale_up_task {
            let _ = task.await;
        }
        if let Some(task) = scale_down_task {
            let _ = task.await;
        }
        for task in reflectors {
            let _ = task.await;
        }
        stop_kube_tasks(kube_stop, kube_tasks).await;
        if let Some(task) = http_task {
            let _ = task.await;
        }
        Ok(())
    }
}

/// What `run` needs of Kubernetes when `kubernetes.enabled`: the client, this replica's
/// identity, and the Events recorder with its poster.
struct KubeSide {
    client: kube::Client,
    identity: String,
    recorder: Arc<crate::kube::events::EventRecorder>,
    poster: crate::kube::events::EventPoster,
}

async fn kube_side(
    settings: &Settings,
    metrics: Arc<Metrics>,
    identity: Option<String>,
) -> anyhow::Result<Option<KubeSide>> {
    use crate::kube::events::{EventRecorder, KubeEvents, RecorderConfig, QUEUE_CAPACITY};
    let k = &settings.kubernetes;
    if !k.enabled {
        return Ok(None);
    }
    let client = kube_client(k).await?;
    let identity = identity.unwrap_or_else(crate::kube::identity);
    let (recorder, poster) = EventRecorder::new(
        RecorderConfig {
            namespace: k.namespace.clone(),
            identity: identity.clone(),
            status_config_map: k.status_config_map.clone(),
            lease: k
                .leader_election
                .enabled
                .then(|| k.leader_election.lease_name.clone()),
        },
        Arc::new(KubeEvents::new(client.clone())),
        metrics,
        QUEUE_CAPACITY,
    );
    Ok(Some(KubeSide {
        client,
        identity,
        recorder: Arc::new(recorder),
        poster,
    }))
}

/// The Event poster and the status writer, running.
struct KubeTasks {
    poster: tokio::task::JoinHandle<()>,
    status: tokio::task::JoinHandle<()>,
    writer: Arc<crate::kube::status::StatusWriter>,
    fence: Arc<dyn crate::fence::WriteFence>,
}

impl KubeTasks {
    /// One status write now, if this replica may write.
    async fn write_status_now(&self, reconciler: &Reconciler) {
        if self.fence.check().is_ok() {
            if let Err(e) = self.writer.write(reconciler.status()).await {
                tracing::warn!(error = %e, "could not write the status ConfigMap");
            }
        }
    }
}

impl KubeSide {
    /// Spawns the Event poster and the status writer (every `scanInterval`, while `fence` lets
    /// this replica write).
    fn spawn(
        self,
        settings: &Settings,
        reconciler: Arc<Reconciler>,
        fence: Arc<dyn crate::fence::WriteFence>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> KubeTasks {
        let k = &settings.kubernetes;
        let writer = Arc::new(
            crate::kube::status::StatusWriter::new(
                Arc::new(crate::kube::status::KubeConfigMaps::new(
                    self.client,
                    &k.namespace,
                    &k.status_config_map,
                )),
                &k.status_config_map,
                &self.identity,
            )
            .metrics(metrics),
        );
        let recorder = self.recorder.clone();
        let status = tokio::spawn(writer.clone().run(
            move || reconciler.status(),
            fence.clone(),
            settings.scan_interval,
            move |cm| recorder.set_status_uid(cm.metadata.uid.clone()),
            stop.clone(),
        ));
        KubeTasks {
            poster: tokio::spawn(self.poster.run(stop)),
            status,
            writer,
            fence,
        }
    }
}

/// Stops the Kubernetes tasks; the poster gets a few seconds to post what is queued (the
/// leadership hand-over), so an unreachable API server cannot hold the shutdown.
async fn stop_kube_tasks(stop: CancellationToken, tasks: Option<KubeTasks>) {
    stop.cancel();
    let Some(tasks) = tasks else {
        return;
    };
    for mut task in [tasks.status, tasks.poster] {
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// The Lease candidate when `kubernetes.enabled` and `kubernetes.leaderElection.enabled`,
/// reporting to the Events recorder.
fn leader_election(
    settings: &Settings,
    kube_side: Option<&KubeSide>,
) -> Option<Arc<crate::kube::lease::LeaderElection>> {
    let k = &settings.kubernetes;
    let side = kube_side.filter(|_| k.enabled && k.leader_election.enabled)?;
    let le = &k.leader_election;
    let identity = side.identity.clone();
    tracing::info!(lease = %le.lease_name, namespace = %k.namespace, %identity, "leader election on");
    let store = crate::kube::KubeLeases::new(side.client.clone(), &k.namespace, &le.lease_name);
    Some(Arc::new(crate::kube::lease::LeaderElection::new(
        crate::kube::lease::LeaseConfig {
            name: le.lease_name.clone(),
            identity,
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
        },
        Arc::new(store),
        side.recorder.clone(),
    )))
}

/// The Kubernetes client the standard way: `kubernetes.kubeconfig`, else the in-cluster service
/// account, else `KUBECONFIG` / `~/.kube/config`.
async fn kube_client(k: &config::KubernetesSettings) -> anyhow::Result<kube::Client> {
    let config = match &k.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("kubernetes.kubeconfig: reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubernetes.kubeconfig: {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("kubernetes: no in-cluster service account and no usable KUBECONFIG")?,
    };
    // No retries inside the client: each caller has its own policy (the elector its retry
    // period, the watches their backoff, the status writer the next pass), and kube-rs's default
    // retry of 503s could hold one call for minutes after the API server returns.
    let mut config = config;
    config.default_retry = false;
    kube::Client::try_from(config).context("kubernetes: building the client")
}

/// Keeps `leader` (1 only while the fence lets writes go) and `leader_transitions_total` current.
async fn publish_leadership(
    leadership: Arc<crate::kube::lease::Leadership>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    use crate::fence::WriteFence;
    let mut counted = 0;
    loop {
        metrics
            .leader
            .set(if leadership.check().is_ok() { 1.0 } else { 0.0 });
        let t = leadership.transitions();
        if t > counted {
            metrics
                .leader_transitions_total
                .inc_by((t - counted) as f64);
            counted = t;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.cancelled() => break,
        }
    }
    metrics.leader.set(0.0);
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The resource `args` names: `--cluster C --pool P`, a configured node group, else a scale set.
fn resolve(
    settings: &Settings,
    arm: Arc<ArmClient>,
    args: &ResourceArgs,
) -> (Arc<dyn CapacityResource>, String, String) {
    if let (Some(cluster), Some(pool)) = (&args.cluster, &args.pool) {
        let rg = settings.azure.resource_group.clone();
        let pools = crate::azure::aks::AgentPools::new(arm, &rg, cluster);
        return (
            Arc::new(pools),
            pool.clone(),
            format!("agent pool {pool} of managed cluster {cluster} in resource group {rg}"),
        );
    }
    let name = args.name.clone().unwrap_or_default();
    if let Some(g) = settings.node_groups.iter().find(|g| g.name == name) {
        let resource = Resources::new(settings, arm).for_group(g);
        let what = match &g.kind {
            crate::config::NodeGroupKind::AksAgentPool { cluster } => {
                format!("agent pool {name} of managed cluster {cluster}")
            }
            crate::config::NodeGroupKind::Vmss => format!("scale set {name}"),
        };
        return (resource, name, what);
    }
    let what = format!(
        "scale set {name} in resource group {}",
        settings.azure.resource_group
    );
    (arm, name, what)
}

/// `get`.
pub async fn get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let settings = match load_settings(&args.config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let arm = arm_client(&settings, Arc::new(Metrics::new()))?;
    let (resource, name, what) = resolve(&settings, arm, &args.resource);
    match resource.get(&name).await? {
        None => {
            eprintln!("{what} not found");
            Ok(ExitCode(1))
        }
        Some(s) => {
            println!("name:               {}", s.name);
            println!("kind:               {}", resource.kind());
            println!(
                "capacity:           {}",
                s.capacity
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into())
            );
            println!("etag:               {}", s.etag.as_deref().unwrap_or("-"));
            println!(
                "provisioningState:  {}",
                s.provisioning_state.as_deref().unwrap_or("-")
            );
            println!(
                "sku:                {} {}",
                s.sku_name.as_deref().unwrap_or("-"),
                s.sku_tier.as_deref().unwrap_or("")
            );
            if let Some(p) = &s.agent_pool {
                println!("cluster:            {}", p.cluster);
                println!("mode:               {}", p.mode.as_deref().unwrap_or("-"));
                println!("enableAutoScaling:  {}", p.enable_auto_scaling);
            } else {
                println!("location:           {}", s.location);
            }
            for (k, v) in &s.tags {
                println!("tag:                {k}={v}");
            }
            Ok(ExitCode(0))
        }
    }
}

/// `scale`.
pub async fn scale(args: ScaleArgs) -> anyhow::Result<ExitCode> {
    let settings = match load_settings(&args.config) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    if args.to < 0 {
        bail!("--to must be a non-negative capacity, got {}", args.to);
    }
    let precondition = match (&args.if_match, &args.if_none_match) {
        (Some(e), None) => Precondition::IfMatch(e.clone()),
        (None, Some(star)) if star == "*" => Precondition::IfNoneMatch,
        (None, Some(other)) => bail!("--if-none-match takes only '*', got {other:?}"),
        (None, None) => Precondition::None,
        (Some(_), Some(_)) => bail!("--if-match and --if-none-match cannot be combined"),
    };
    let arm = arm_client(&settings, Arc::new(Metrics::new()))?;
    let (resource, name, what) = resolve(&settings, arm, &args.resource);
    let current = match resource.get(&name).await? {
        Some(s) => s,
        None => bail!("{what} not found; `scale` changes capacity, it does not create resources"),
    };
    if let Some(reason) = resource.write_refusal(&current) {
        eprintln!("{what} is scaled by AKS's own autoscaler (enableAutoScaling: true): not writing ({reason}); `az aks nodepool update --disable-cluster-autoscaler` first");
        return Ok(ExitCode(1));
    }
    match resource
        .write_capacity(&current, args.to, &precondition)
        .await
    {
        Ok(acc) => {
            println!(
                "{}: capacity {} -> {} (HTTP {}), new etag {}",
                name,
                current
                    .capacity
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                args.to,
                acc.status,
                acc.etag.as_deref().unwrap_or("-")
            );
            Ok(ExitCode(0))
        }
        Err(crate::azure::ArmError::PreconditionFailed { message, .. }) => {
            eprintln!("412 Precondition Failed: {message}\n{what} changed since that ETag was read; run `get` again");
            Ok(ExitCode(3))
        }
        Err(e) => Err(e.into()),
    }
}

/// `emulator`.
#[cfg(feature = "emulator")]
pub async fn emulator(args: EmulatorArgs) -> anyhow::Result<ExitCode> {
    let mut builder = crate::emulator::EmulatorBuilder::new()
        .listen(args.listen)
        .tls(args.tls)
        .lro_delay(args.lro_delay)
        .kubernetes(args.kubernetes || args.kubeconfig_out.is_some());
    if args.throttling {
        builder = builder.throttling(crate::emulator::ThrottleLimits::azure_compute());
    }
    crate::emulator::serve_until_with_kubeconfig(
        builder,
        args.cert_out,
        args.kubeconfig_out,
        wait_for_signal(),
    )
    .await?;
    Ok(ExitCode(0))
}
