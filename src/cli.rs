//! Subcommands and their implementations. `main.rs` parses flags and dispatches here.

pub use crate::app::{arm_client, ExitCode};
use crate::app::{Replica, ReplicaOptions};
use crate::azure::ArmClient;
use crate::azure::Precondition;
use crate::config::{self, ConfigSources, Settings};
#[cfg(feature = "emulator")]
pub use crate::demo::DemoArgs;
use crate::metrics::Metrics;
use crate::resource::{CapacityResource, Resources};
use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A cluster autoscaler for Azure VM Scale Sets and AKS agent pools whose every write carries
/// If-Match with the ETag last read, so no other writer's change is lost.
///
/// Pending pods grow the node group that fits them; unneeded nodes are drained and deleted by
/// name. A 412 makes the controller re-read and re-plan instead of overwriting.
#[derive(Debug, Parser)]
#[command(
    name = "vmss-capacity-controller",
    version,
    about,
    after_help = "Examples:
  vmss-capacity-controller demo                          zero-setup showcase: pending pods drive
                                                         scale sets, ETags on then blind (~70 s)
  vmss-capacity-controller demo --plan                   scale sets kept at a static plan
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

/// Whether text logs carry colour codes: only when they go to a terminal, and never when
/// `NO_COLOR` is set to a non-empty value (<https://no-color.org>), so pipes and files get plain
/// text.
pub fn log_colour(to_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    to_terminal && no_color.is_none_or(|v| v.is_empty())
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
    /// Zero-setup showcase: built-in emulator (ARM and a simulated cluster), pending pods, a rival
    /// writer, the controller; run with ETags and then blind, side by side.
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
    /// Why the controller would (or would not) give a pod a node, remove a node, or grow a
    /// node group: the same decisions `run` makes, read-only, one shot.
    Explain(ExplainArgs),
}

/// What `explain` is asked about.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ExplainWhat {
    /// A pod: NAMESPACE/NAME (NAME alone: namespace `default`).
    Pod,
    /// A node: NAME.
    Node,
    /// A node group: NAME.
    Group,
}

/// `explain` flags.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Read the cluster and Azure from the `*.json` files of DIR (`kubectl get
    /// nodes,pods,pdb,daemonsets -A -o json`, `az vmss list -o json`, `az aks nodepool list -o
    /// json`) instead of their APIs: no credentials needed. Without `--config`, every scale set
    /// and pool there is a node group.
    #[arg(long, value_name = "DIR")]
    pub snapshot: Option<PathBuf>,
    /// `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// What to explain.
    pub what: ExplainWhat,
    /// NAMESPACE/NAME for a pod, NAME for a node or a node group.
    pub name: String,
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
    #[arg(long, default_value = "2s", value_parser = config::parse_duration_arg)]
    pub lro_delay: Duration,
    /// Enforce Azure's throttling limits (ARM's per subscription, Compute's per subscription and
    /// region and per scale set, AKS's resource provider's per agent pool, per managed cluster
    /// and per subscription: token buckets, 429 with Retry-After).
    #[arg(long)]
    pub throttling: bool,
    /// Enforce AKS's resource-provider limits alone (without `--throttling`, which includes
    /// them): writes per agent pool and per managed cluster 20 refilled 1/min, LISTs and GETs per
    /// subscription 500 refilled 1/s; an empty bucket answers 429 `Throttled` with Retry-After.
    #[arg(long)]
    pub aks_throttling: bool,
    /// With `--throttling` or `--aks-throttling`: AKS's buckets (rates and sizes) at this
    /// fraction of AKS's, e.g. 0.25 for 5 writes per pool refilled one per 4 minutes.
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub aks_limits_scale: f64,
    /// With `--throttling`: Compute's buckets of the subscription in a region (updates, deletes,
    /// GETs, LISTs: shared by every client of the subscription there) at this fraction of Azure's
    /// sizes, e.g. 0.05 to put a small fleet near the limit. ARM's buckets and the scale sets'
    /// own stay Azure's.
    #[arg(long, default_value_t = 1.0, value_parser = parse_scale)]
    pub subscription_limits_scale: f64,
    /// Also serve the Kubernetes API (`/api`, `/apis`, `/version`) on the same listener.
    #[arg(long)]
    pub kubernetes: bool,
    /// Write a kubeconfig for the Kubernetes API here (server, bearer token, CA with `--tls`);
    /// implies `--kubernetes`.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Run the cluster simulation (implies `--kubernetes`): every VM instance becomes a Node,
    /// pods are scheduled as kube-scheduler filters them, Deployments, ReplicaSets and
    /// DaemonSets keep their pods, so `kubectl apply` drives pod-driven scaling.
    #[arg(long)]
    pub simulate_cluster: bool,
    /// With `--simulate-cluster`: how long a new instance takes to become a Ready Node.
    #[arg(long, requires = "simulate_cluster", value_parser = config::parse_duration_arg)]
    pub boot_delay: Option<Duration>,
    /// A scale set to start with, `NAME:VM_SIZE:CAPACITY[:ZONES]` (zones comma-separated, e.g.
    /// `zone1:Standard_D4s_v5:0:1`); repeatable. It is created in `--subscription` and
    /// `--resource-group`.
    #[arg(long = "scale-set", value_name = "NAME:VM_SIZE:CAPACITY[:ZONES]", value_parser = parse_scale_set)]
    pub scale_sets: Vec<ScaleSetArg>,
    /// A vCPU quota limit to start with, `[LOCATION/]USAGE=LIMIT` in `--subscription` (usage: a
    /// VM family such as `standardDSv5Family`, `cores` or `lowPriorityCores`; location
    /// `westeurope`, the `--scale-set`s', when left out); repeatable. A scale-set write growing
    /// past it is refused with Azure's 409. At run time: `POST /_emulator/quota/{sub}/{location}`.
    #[arg(long = "quota", value_name = "[LOCATION/]USAGE=LIMIT", value_parser = parse_quota)]
    pub quotas: Vec<(String, String, i64)>,
    /// With `--simulate-cluster`: scale set NAME's Nodes register with this label beyond what
    /// its `k8s.io_cluster-autoscaler_node-template_label_*` tags say (as a kubelet started with
    /// `--node-labels`); `NAME:KEY-` leaves the label off; repeatable. In `--subscription` and
    /// `--resource-group`. At run time: `POST
    /// /_emulator/scale-sets/{sub}/{rg}/{name}/node-registration`.
    #[arg(long = "node-label", value_name = "NAME:KEY=VALUE", requires = "simulate_cluster", value_parser = parse_node_label)]
    pub node_labels: Vec<(String, String, Option<String>)>,
    /// With `--simulate-cluster`: scale set NAME's Nodes register with this taint beyond its
    /// tags' (as a kubelet started with `--register-with-taints`), `KEY[=VALUE]:EFFECT`;
    /// repeatable.
    #[arg(long = "node-taint", value_name = "NAME:KEY[=VALUE]:EFFECT", requires = "simulate_cluster", value_parser = parse_node_taint)]
    pub node_taints: Vec<(String, String)>,
    /// Subscription of `--scale-set` (config/emulator.yaml's).
    #[arg(long, default_value = "00000000-0000-0000-0000-000000000000")]
    pub subscription: String,
    /// Resource group of `--scale-set` (config/emulator.yaml's).
    #[arg(long, default_value = "rg-demo")]
    pub resource_group: String,
}

/// A `--scale-set` of `emulator`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg(feature = "emulator")]
pub struct ScaleSetArg {
    /// Scale set name.
    pub name: String,
    /// VM size.
    pub vm_size: String,
    /// Instances to start with.
    pub capacity: i64,
    /// Availability zones (empty: regional).
    pub zones: Vec<String>,
}

#[cfg(feature = "emulator")]
fn parse_scale_set(s: &str) -> Result<ScaleSetArg, String> {
    use crate::emulator::arm::state::MAX_CAPACITY;
    let parts: Vec<&str> = s.split(':').collect();
    let (name, size, capacity, zones) = match parts.as_slice() {
        [n, v, c] => (*n, *v, *c, ""),
        [n, v, c, z] => (*n, *v, *c, *z),
        _ => {
            return Err(format!(
                "{s:?} is not NAME:VM_SIZE:CAPACITY[:ZONES] (for example zone1:Standard_D4s_v5:0:1)"
            ))
        }
    };
    if name.is_empty() || size.is_empty() {
        return Err(format!("{s:?}: the name and the VM size must not be empty"));
    }
    let capacity = capacity
        .parse::<i64>()
        .ok()
        .filter(|c| (0..=MAX_CAPACITY).contains(c))
        .ok_or_else(|| {
            format!("{s:?}: capacity {capacity:?} must be an integer from 0 to {MAX_CAPACITY}")
        })?;
    let zones: Vec<String> = zones
        .split(',')
        .map(str::trim)
        .filter(|z| !z.is_empty())
        .map(str::to_string)
        .collect();
    Ok(ScaleSetArg {
        name: name.into(),
        vm_size: size.into(),
        capacity,
        zones,
    })
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

/// `explain`: read-only, one shot, from the APIs (`--config`: the same settings and
/// credentials as `run`; only GETs and LISTs are sent) or from files (`--snapshot`). Exit 0 with
/// the explanation, 1 when the subject is not there or a read failed, 2 on bad configuration or
/// snapshot.
pub async fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    use crate::explain::{snapshot, Subject};
    let settings = match (
        &args.config.config,
        args.config.nodes.is_empty(),
        &args.snapshot,
    ) {
        (None, true, None) => {
            eprintln!(
                "error: explain reads the cluster and Azure as `run` does (give --config), or from files with no credentials (give --snapshot DIR holding `kubectl get nodes,pods,pdb,daemonsets,pvc,pv,storageclasses,csinodes,namespaces -A -o json` and `az vmss list -g <node resource group> -o json`)"
            );
            return Ok(ExitCode(2));
        }
        (None, true, Some(_)) => None,
        (None, false, Some(_)) => {
            eprintln!("error: --nodes with --snapshot needs --config (the node groups' resource group and the rest of the settings); without both, every scale set and pool of the snapshot is a node group");
            return Ok(ExitCode(2));
        }
        _ => match load_settings(&args.config) {
            Ok(s) => Some(s),
            Err(code) => return Ok(code),
        },
    };
    let snap = match (&args.snapshot, &settings) {
        (Some(dir), _) => match snapshot::load(dir) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode(2));
            }
        },
        (None, Some(settings)) => crate::explain::live::read(settings).await?,
        (None, None) => {
            eprintln!("error: no --config and no --snapshot: nothing to read");
            return Ok(ExitCode(2));
        }
    };
    let (world, notes) = snap.world(settings.as_ref());
    for n in &notes {
        eprintln!("note: {n}");
    }
    let subject = match args.what {
        ExplainWhat::Pod => Subject::Pod(args.name.clone()),
        ExplainWhat::Node => Subject::Node(args.name.clone()),
        ExplainWhat::Group => Subject::Group(args.name.clone()),
    };
    match world.explain(&subject) {
        Ok(e) if args.output == "json" => {
            println!("{}", serde_json::to_string_pretty(&e)?);
            Ok(ExitCode(0))
        }
        Ok(e) => {
            print!("{}", e.to_text());
            Ok(ExitCode(0))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode(1))
        }
    }
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

/// How long `run` waits at start-up for the Kubernetes API server to answer (it may be starting
/// with the controller) before it gives up and says so.
const KUBE_REACH: Duration = Duration::from_secs(30);

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
    if settings.kubernetes.enabled {
        // Before any watch or write: the API server answers and RBAC grants what this
        // configuration needs, or every missing piece is said with its fix.
        let client = crate::app::kube_client(&settings.kubernetes).await?;
        let problems =
            crate::kube::access::check(&client, &settings, args.dry_run, KUBE_REACH).await;
        if !problems.is_empty() {
            for p in &problems {
                eprintln!("error: {p}");
            }
            return Ok(ExitCode(1));
        }
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
        eprintln!("error: {}", resource.refusal_problem(&name, reason));
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

/// `--quota [LOCATION/]USAGE=LIMIT`: `(location, usage, limit)`.
#[cfg(feature = "emulator")]
fn parse_quota(s: &str) -> Result<(String, String, i64), String> {
    let (usage, limit) = s.split_once('=').ok_or_else(|| {
        format!("{s:?} is not [LOCATION/]USAGE=LIMIT (for example standardDSv5Family=8)")
    })?;
    let (location, usage) = usage.split_once('/').unwrap_or(("westeurope", usage));
    if location.trim().is_empty() || usage.trim().is_empty() {
        return Err(format!(
            "{s:?}: the location and the usage must not be empty"
        ));
    }
    let limit = limit
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|l| *l >= 0)
        .ok_or_else(|| {
            format!("{s:?}: limit {limit:?} must be a whole number of vCPUs, 0 or more")
        })?;
    Ok((location.trim().to_string(), usage.trim().to_string(), limit))
}

/// `--node-label NAME:KEY=VALUE` or `NAME:KEY-`: `(scale set, key, value)`.
#[cfg(feature = "emulator")]
fn parse_node_label(s: &str) -> Result<(String, String, Option<String>), String> {
    let (name, label) = s
        .split_once(':')
        .filter(|(n, l)| !n.is_empty() && !l.is_empty())
        .ok_or_else(|| {
            format!("{s:?} is not NAME:KEY=VALUE or NAME:KEY- (for example pool:tier=silver)")
        })?;
    let (key, value) = match label.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => match label.strip_suffix('-') {
            Some(k) => (k, None),
            None => {
                return Err(format!(
                    "{s:?}: the label {label:?} needs =VALUE, or a trailing - to leave it off"
                ))
            }
        },
    };
    let check = crate::emulator::NodeRegistration {
        labels: std::collections::BTreeMap::from([(key.to_string(), value.clone())]),
        taints: Vec::new(),
    };
    check.validate().map_err(|e| format!("{s:?}: {e}"))?;
    Ok((name.to_string(), key.to_string(), value))
}

/// `--node-taint NAME:KEY[=VALUE]:EFFECT`: `(scale set, taint)`.
#[cfg(feature = "emulator")]
fn parse_node_taint(s: &str) -> Result<(String, String), String> {
    let (name, taint) = s
        .split_once(':')
        .filter(|(n, t)| !n.is_empty() && !t.is_empty())
        .ok_or_else(|| {
            format!("{s:?} is not NAME:KEY[=VALUE]:EFFECT (for example pool:dedicated=batch:NoSchedule)")
        })?;
    crate::emulator::arm::registration::parse_taint(taint).map_err(|e| format!("{s:?}: {e}"))?;
    Ok((name.to_string(), taint.to_string()))
}

/// `--subscription-limits-scale`: a fraction in (0, 1].
#[cfg(feature = "emulator")]
fn parse_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        Ok(f) => Err(format!("{f} is not in (0, 1]")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// `emulator`.
#[cfg(feature = "emulator")]
pub async fn emulator(args: EmulatorArgs) -> anyhow::Result<ExitCode> {
    let mut builder = crate::emulator::EmulatorBuilder::new()
        .listen(args.listen)
        .tls(args.tls)
        .lro_delay(args.lro_delay)
        .kubernetes(args.kubernetes || args.kubeconfig_out.is_some() || args.simulate_cluster);
    if args.simulate_cluster {
        let mut sim = crate::emulator::sim::SimSettings::default();
        if let Some(d) = args.boot_delay {
            sim.boot_delay = d;
        }
        builder = builder.cluster_simulation(sim);
    }
    for (location, name, limit) in &args.quotas {
        builder = builder.quota(crate::emulator::QuotaLimit {
            subscription: args.subscription.clone(),
            location: location.clone(),
            name: name.clone(),
            limit: *limit,
        });
    }
    let mut registrations: std::collections::BTreeMap<String, crate::emulator::NodeRegistration> =
        std::collections::BTreeMap::new();
    for (name, key, value) in &args.node_labels {
        registrations
            .entry(name.clone())
            .or_default()
            .labels
            .insert(key.clone(), value.clone());
    }
    for (name, taint) in &args.node_taints {
        registrations
            .entry(name.clone())
            .or_default()
            .taints
            .push(taint.clone());
    }
    for (name, r) in registrations {
        builder = builder.node_registration(&args.subscription, &args.resource_group, &name, r);
    }
    let mut names = std::collections::BTreeSet::new();
    if let Some(twice) = args
        .scale_sets
        .iter()
        .find(|s| !names.insert(s.name.to_ascii_lowercase()))
    {
        eprintln!(
            "error: --scale-set {} is given twice: name each scale set once",
            twice.name
        );
        return Ok(ExitCode(2));
    }
    let seeds: Vec<crate::emulator::ScaleSetSeed> = args
        .scale_sets
        .iter()
        .map(|s| {
            let mut seed = crate::emulator::ScaleSetSeed::new(
                &args.subscription,
                &args.resource_group,
                &s.name,
                s.capacity,
            );
            seed.sku_name = s.vm_size.clone();
            seed.zones = s.zones.clone();
            seed
        })
        .collect();
    if args.throttling {
        builder = builder.throttling(
            crate::emulator::ThrottleLimits::azure_compute()
                .subscription_scaled(args.subscription_limits_scale),
        );
    }
    if args.throttling || args.aks_throttling {
        builder =
            builder.aks_throttling(crate::emulator::AksLimits::aks().scaled(args.aks_limits_scale));
    }
    crate::emulator::serve_until_with_kubeconfig(
        builder,
        args.cert_out,
        args.kubeconfig_out,
        seeds,
        wait_for_signal(),
    )
    .await?;
    Ok(ExitCode(0))
}

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("invalid log filter {filter:?} ({e}); using \"info\"");
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder
            .with_target(false)
            .with_ansi(log_colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .init(),
    }
}

/// The whole program behind `main.rs`: parse flags, start telemetry, dispatch to a command.
///
/// In the library, not in `main.rs`, so the binary instantiates none of the runtime's or the
/// commands' generic code again: in a release build that copy took 238 s of a 1,129 s build, and
/// the binary now compiles in about a second (`cargo build --release --timings`).
pub fn main() -> std::process::ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn async_main() -> std::process::ExitCode {
    let args = <Cli as clap::Parser>::parse();
    // The demo draws its own screen; its controller logs only warnings unless asked.
    let filter = match (&args.command, std::env::var_os("RUST_LOG")) {
        #[cfg(feature = "emulator")]
        (Command::Demo(_), None) if args.log_level == "info" => "warn",
        _ => args.log_level.as_str(),
    };
    init_tracing(args.log_format, filter);
    let result = match args.command {
        Command::Run(a) => run(a).await,
        #[cfg(feature = "emulator")]
        Command::Demo(a) => crate::demo::run(a).await,
        #[cfg(feature = "emulator")]
        Command::Emulator(a) => emulator(a).await,
        Command::Get(a) => get(a).await,
        Command::Scale(a) => scale(a).await,
        Command::CheckConfig(a) => Ok(check_config(&a)),
        Command::Explain(a) => explain(a).await,
    };
    match result {
        Ok(ExitCode(code)) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
