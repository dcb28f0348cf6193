//! Configuration: YAML (camelCase, unknown keys rejected), cluster-autoscaler environment
//! overrides, an optional `azure.json` cloud-config, `--nodes=MIN:MAX:NAME` specs, validated into
//! [`Settings`].
//!
//! CONTRACT (shared with the rest of the crate): the validated types below are what every other
//! module consumes. Parsing/validation lives in [`load`], a short sequence of steps over the
//! submodules, one concern each:
//!
//! | module | owns |
//! |---|---|
//! | `raw` | YAML text into serde structs (camelCase, unknown keys rejected), every schema problem with its path; relative paths taken from the file's folder; each problem's line and column in the file |
//! | `sources` | the environment, `azure.json`, and the credential sources; merging the layers |
//! | `validate` | raw values into typed settings, each problem with its path |
//! | `discovery` | tag auto-discovery of scale sets and AKS agent pools |
//! | `prices` | `prices:`: the retail prices fetch, its endpoint, per-group negotiated rates |
//! | `consolidation` | `consolidation:`: Karpenter-style consolidation, its policy and disruption budgets |
//! | `cron` | a disruption budget's cron `schedule` and `duration`: when it is active (UTC) |

mod consolidation;
mod cron;
mod discovery;
mod kubernetes;
mod pod_demand;
mod prices;
mod raw;
mod scale_down;
mod sources;
mod validate;

pub use consolidation::{
    default_budgets, parse_budget_nodes, Budget, BudgetNodes, BudgetSchedule, ConsolidationPolicy,
    ConsolidationSettings, DisruptionReason, BALANCED_K, DEFAULT_CONSOLIDATION_TIMEOUT,
    DEFAULT_VALIDATION_DELAY, MAX_CONSOLIDATION_CANDIDATES,
};
pub use cron::{parse_budget_duration, CronSchedule};
pub use discovery::{
    discover_node_groups, discover_pools, TAG_CLUSTER_NAME, TAG_ENABLED, TAG_MAX, TAG_MIN,
};
pub use kubernetes::{
    KubernetesSettings, LeaderElectionSettings, DEFAULT_CA_STATUS_CONFIG_MAP,
    DEFAULT_LEASE_DURATION, DEFAULT_LEASE_NAME, DEFAULT_NAMESPACE, DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD, DEFAULT_STATUS_CONFIG_MAP, FALLBACK_CA_STATUS_CONFIG_MAP,
};
pub use pod_demand::{
    DemandKind, Expander, PodDemandSettings, BATCH_IDLE, BATCH_MAX,
    DEFAULT_MAX_NODE_PROVISION_TIME, EXPENDABLE_PRIORITY_CUTOFF,
};
pub use prices::{PriceSettings, DEFAULT_PRICES_ENDPOINT, DEFAULT_PRICE_REFRESH};
pub use scale_down::{ScaleDownSettings, DEFAULT_NON_EMPTY_CANDIDATES, UTILIZATION_THRESHOLD};
pub use sources::secret_from_cloud_config;
pub use validate::{parse_node_spec, DEFAULT_ARM_BUDGET_RESERVE};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use url::Url;

/// Default reconcile period (`scanInterval`).
pub const DEFAULT_SCAN_INTERVAL: Duration = Duration::from_secs(10);
/// Default scale-set cache TTL (`vmssCacheTTL`): one LIST per resource group per TTL.
pub const DEFAULT_VMSS_CACHE_TTL: Duration = Duration::from_secs(60);
/// Default instance cache TTL (`instanceCacheTTL`).
pub const DEFAULT_INSTANCE_CACHE_TTL: Duration = Duration::from_secs(300);
/// Azure's public-cloud ARM endpoint.
pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";
/// Azure's public-cloud AAD authority.
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";
/// Azure's instance metadata service (managed identity tokens).
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";
/// Default listen address of `/metrics`, `/healthz`, `/readyz` (cluster-autoscaler's port).
pub const DEFAULT_METRICS_LISTEN: &str = "0.0.0.0:8085";
/// Default number of capacity writes in flight at once.
pub const DEFAULT_MAX_CONCURRENT_WRITES: usize = 8;
/// Default write budget of a scale set: Compute's own limit per scale set (4 updates a minute,
/// burst 12).
pub const DEFAULT_WRITE_BUDGET: WriteBudget = WriteBudget {
    per_minute: 4.0,
    burst: 12,
};
/// Default write budget of an AKS agent pool: half of AKS's bucket per pool (PUTs 20, refilled 1
/// a minute; AKS's quotas page), so AKS itself, the portal, the CLI or Terraform writing the same
/// pool keep the other half. Each write carries the latest count, so a held scale-up is late by
/// at most the 2 minutes a token takes, never lost.
pub const DEFAULT_AGENT_POOL_WRITE_BUDGET: WriteBudget = WriteBudget {
    per_minute: 0.5,
    burst: 10,
};
/// Default time SIGTERM waits for in-flight writes.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default timeout of one ARM or token request.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default cool-down after a quota 409.
pub const DEFAULT_QUOTA_COOLDOWN: Duration = Duration::from_secs(300);
/// Default back-off of [`ConflictStrategy::RetryOnceThenBackoff`] (cluster-autoscaler's 5 minutes).
pub const DEFAULT_CONFLICT_BACKOFF: Duration = Duration::from_secs(300);
/// Largest capacity a scale set can have (Azure's limit for VMSS with platform images).
pub const MAX_SCALE_SET_CAPACITY: u32 = 1000;
/// The only token scope the controller ever asks for.
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// Everything the daemon needs, parsed and validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where and as whom to talk to Azure.
    pub azure: AzureSettings,
    /// Send the cached ETag as `If-Match` on every capacity write (default on).
    pub enable_vmss_etag: bool,
    /// What to do after a 412 (default [`ConflictStrategy::Replan`]).
    pub conflict_strategy: ConflictStrategy,
    /// Reconcile period.
    pub scan_interval: Duration,
    /// Scale-set cache TTL: how stale a size may be before a LIST refreshes it.
    pub vmss_cache_ttl: Duration,
    /// Instance cache TTL.
    pub instance_cache_ttl: Duration,
    /// Random extra age added to each instance-cache entry so refreshes do not align.
    pub instance_cache_jitter: Duration,
    /// Where `/metrics`, `/healthz`, `/readyz` listen; `None` disables the HTTP server.
    pub metrics_listen: Option<SocketAddr>,
    /// Writes in flight at once across all scale sets.
    pub max_concurrent_writes: usize,
    /// Write budget (token bucket) of each scale set, mirroring Compute's limit per scale set;
    /// of every node group when `writeBudget` is configured.
    pub write_budget: WriteBudget,
    /// Write budget of each AKS agent pool, within AKS's bucket per pool: `writeBudget` when
    /// configured, else [`DEFAULT_AGENT_POOL_WRITE_BUDGET`].
    pub agent_pool_write_budget: WriteBudget,
    /// How long SIGTERM waits for in-flight writes.
    pub shutdown_grace: Duration,
    /// Timeout of one ARM or token request.
    pub request_timeout: Duration,
    /// How long a node group cools down after a quota 409 (`OperationNotAllowed`).
    pub quota_cooldown: Duration,
    /// The share of every ARM bucket Azure reports that this process keeps in reserve
    /// (`armBudgetReservePercentage`, default 20 %; 0 turns pacing off): below it, refreshes
    /// stretch and only urgent writes go.
    pub arm_budget_reserve: f64,
    /// Explicitly configured node groups (YAML list and `--nodes`).
    pub node_groups: Vec<NodeGroupSpec>,
    /// Tag auto-discovery, if enabled.
    pub auto_discovery: Option<AutoDiscovery>,
    /// `kubernetes:` (off by default).
    pub kubernetes: KubernetesSettings,
    /// `demand` and, for `demand: pods`, how pending pods become capacity.
    pub pod_demand: PodDemandSettings,
    /// `scaleDown:`: removing nodes nobody needs (with `demand: pods`).
    pub scale_down: ScaleDownSettings,
    /// `prices:`: where node prices come from (the `price` and `least-cost` expanders).
    pub prices: PriceSettings,
    /// `consolidation:`: Karpenter-style consolidation (off by default).
    pub consolidation: ConsolidationSettings,
}

/// Azure endpoints, scope and identity.
#[derive(Debug, Clone)]
pub struct AzureSettings {
    /// ARM endpoint; `http://` only for loopback hosts.
    pub resource_manager_endpoint: Url,
    /// AAD authority host; `http://` only for loopback hosts.
    pub authority_host: Url,
    /// IMDS base URL for managed identity; `http://169.254.169.254` unless overridden (tests).
    pub imds_endpoint: Url,
    /// AAD tenant.
    pub tenant_id: String,
    /// Subscription holding the scale sets.
    pub subscription_id: String,
    /// Resource group holding the scale sets (the AKS node resource group).
    pub resource_group: String,
    /// How to get a token.
    pub auth: AuthSettings,
    /// Extra trusted root certificate (PEM), e.g. the emulator's CA.
    pub ca_bundle_file: Option<PathBuf>,
}

/// Where a secret comes from. Secrets never live in YAML.
#[derive(Clone)]
pub enum SecretSource {
    /// Read from this environment variable when needed.
    Env(String),
    /// Read from this file when needed (re-read on each token fetch).
    File(PathBuf),
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::Env(v) => write!(f, "Env({v})"),
            SecretSource::File(p) => write!(f, "File({})", p.display()),
        }
    }
}

/// The credential kinds the controller supports.
#[derive(Debug, Clone)]
pub enum AuthSettings {
    /// Service principal with a client secret.
    ClientSecret {
        /// Application (client) id.
        client_id: String,
        /// Where the secret is read from.
        secret: SecretSource,
    },
    /// AKS workload identity: a projected service-account token exchanged for an AAD token.
    WorkloadIdentity {
        /// Application (client) id.
        client_id: String,
        /// Projected token file; re-read whenever it changes (AKS rotates it).
        token_file: PathBuf,
    },
    /// Managed identity through IMDS; `client_id` selects a user-assigned identity.
    ManagedIdentity {
        /// User-assigned identity client id; `None` is the system-assigned identity.
        client_id: Option<String>,
    },
    /// `az account get-access-token`.
    AzureCli,
}

/// What to do after a 412 Precondition Failed. [`ConflictStrategy::Replan`] is the design;
/// the other two reproduce cluster-autoscaler's behaviours as baselines for benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictStrategy {
    /// Invalidate, GET fresh, re-plan at once; write once more if still needed (this design).
    Replan,
    /// Invalidate and wait for the next loop (the seed pull request's first version).
    NextLoop,
    /// One fresh GET and one retry; if that fails, back the group off (cluster-autoscaler's
    /// merged behaviour: a surfaced error backs the node group off for 5 minutes).
    RetryOnceThenBackoff {
        /// How long the group is backed off after the retry fails.
        backoff: Duration,
    },
}

/// Token bucket for the writes (capacity and deletes) to one node group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteBudget {
    /// Writes refilled per minute.
    pub per_minute: f64,
    /// Bucket size.
    pub burst: u32,
}

impl Settings {
    /// The write budget of a node group of `kind`: [`Settings::agent_pool_write_budget`] for an
    /// AKS agent pool, [`Settings::write_budget`] for a scale set.
    pub fn write_budget_of(&self, kind: &NodeGroupKind) -> WriteBudget {
        match kind {
            NodeGroupKind::Vmss => self.write_budget,
            NodeGroupKind::AksAgentPool { .. } => self.agent_pool_write_budget,
        }
    }
}

/// What backs a node group in Azure.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum NodeGroupKind {
    /// A VM Scale Set in `azure.resourceGroup` (`kind: vmss`, the default).
    #[default]
    Vmss,
    /// An AKS agent pool of the managed cluster `cluster` (`kind: aksAgentPool`); its `count`
    /// is the capacity written.
    AksAgentPool {
        /// The managed cluster's name.
        cluster: String,
    },
}

impl NodeGroupKind {
    /// The config spelling and the `kind` metric label: `vmss` or `aksAgentPool`.
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeGroupKind::Vmss => "vmss",
            NodeGroupKind::AksAgentPool { .. } => "aksAgentPool",
        }
    }
}

/// One node group (one scale set or one AKS agent pool) under management.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGroupSpec {
    /// Scale-set or agent-pool name (unique across node groups).
    pub name: String,
    /// What backs the group.
    pub kind: NodeGroupKind,
    /// Resource group of the scale set or managed cluster; `None` means `azure.resourceGroup`.
    pub resource_group: Option<String>,
    /// Lower bound on capacity.
    pub min_size: u32,
    /// Upper bound on capacity.
    pub max_size: u32,
    /// Capacity to hold outside any schedule window; `None` holds the observed size (clamped).
    pub desired_capacity: Option<u32>,
    /// Time windows (UTC) with their own desired capacity; the first matching wins.
    pub schedules: Vec<Schedule>,
    /// Largest decrease allowed in one write (protects against mass deletion from a bad size).
    pub max_scale_down_step: Option<u32>,
}

/// A time window, in UTC, during which a different desired capacity applies.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Window start, seconds after UTC midnight.
    pub start_secs: u32,
    /// Window end (exclusive), seconds after UTC midnight; may be before start (wraps midnight).
    pub end_secs: u32,
    /// Days the window starts on (0 = Monday .. 6 = Sunday); empty means every day.
    pub days: Vec<u8>,
    /// Desired capacity inside the window.
    pub desired_capacity: u32,
}

/// cluster-autoscaler style tag auto-discovery, of scale sets and (with `aksCluster`) of the
/// agent pools of one managed cluster. The same tags select and bound both.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoDiscovery {
    /// Required value of the `cluster-autoscaler-name` tag.
    pub cluster_name: String,
    /// Default min when a scale set or pool has no `min` tag; `None` skips such ones.
    pub default_min: Option<u32>,
    /// Default max when a scale set or pool has no `max` tag; `None` skips such ones.
    pub default_max: Option<u32>,
    /// Managed cluster whose agent pools are discovered too (`autoDiscovery.aksCluster`);
    /// `None` discovers scale sets only.
    pub aks_cluster: Option<String>,
    /// Resource group of `aks_cluster` (`autoDiscovery.aksResourceGroup`); `None` means
    /// `azure.resourceGroup`.
    pub aks_resource_group: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// Everything [`load`] reads. `main` fills it from flags and the process environment; tests fill
/// it by hand (the loader never reads the process environment itself).
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// The YAML configuration file (`--config`).
    pub config_file: Option<PathBuf>,
    /// A cluster-autoscaler / cloud-provider-azure `azure.json` cloud-config file.
    pub cloud_config_file: Option<PathBuf>,
    /// cluster-autoscaler style `--nodes=MIN:MAX:NAME` specs.
    pub nodes: Vec<String>,
    /// The environment (`std::env::vars().collect()` in `main`).
    pub env: HashMap<String, String>,
}

/// One configuration problem: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Where: `nodeGroups[1].maxSize`, `env AZURE_ENABLE_VMSS_ETAG`,
    /// `azure.json:vmssCacheTTLInSeconds`, `--nodes[0]`, or a file name.
    pub path: String,
    /// What is wrong, and when possible how to fix it.
    pub message: String,
    /// The file the problem is in, and where in it when the parser knows; `None` for the
    /// environment, `--nodes`, and a key no file holds.
    pub file: Option<FileLocation>,
}

/// A place in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLocation {
    /// The file as it was named (`--config`, `--cloud-config`).
    pub path: PathBuf,
    /// Line and column, from 1: of the key for a value in a mapping, of the item for one in a
    /// list, of the nearest enclosing one the file has for a key it lacks. `None` when not known.
    pub line_column: Option<(usize, usize)>,
}

impl std::fmt::Display for FileLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some((line, column)) = self.line_column {
            write!(f, ":{line}:{column}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for ConfigProblem {
    /// `FILE:LINE:COLUMN: path: message` (as compilers write it), `FILE: message` for the file
    /// as a whole, `path: message` where no file is involved.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.file {
            Some(file) if self.path == file.path.display().to_string() => {
                write!(f, "{file}: {}", self.message)
            }
            Some(file) => write!(f, "{file}: {}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Every problem found while loading; [`load`] fails once with all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigProblem>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The problems, one per line (`path: message`), as `check-config` prints them.
pub fn render_problems(errs: &ConfigErrors) -> String {
    errs.to_string()
}

/// Collects problems while loading.
#[derive(Default)]
struct Problems(Vec<ConfigProblem>);

impl Problems {
    /// Records a problem at `path`.
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            path: path.into(),
            message: message.into(),
            file: None,
        });
    }

    /// Records a problem with the file whole, at a place in it when that is known.
    fn push_in_file(
        &mut self,
        file: &Path,
        line_column: Option<(usize, usize)>,
        message: impl Into<String>,
    ) {
        self.push_located(file.display().to_string(), file, line_column, message);
    }

    /// Records a problem at `path` inside `file`, at a place in it when that is known.
    fn push_located(
        &mut self,
        path: impl Into<String>,
        file: &Path,
        line_column: Option<(usize, usize)>,
        message: impl Into<String>,
    ) {
        self.0.push(ConfigProblem {
            path: path.into(),
            message: message.into(),
            file: Some(FileLocation {
                path: file.to_path_buf(),
                line_column,
            }),
        });
    }

    /// Fails with every problem, if there are any. A value removed for a schema error would also
    /// be reported as missing ("required" at the same path): that consequence is said once.
    fn finish(self) -> Result<(), ConfigErrors> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut out: Vec<ConfigProblem> = Vec::with_capacity(self.0.len());
        for p in self.0 {
            let consequence = p.message.starts_with("required")
                && out.iter().any(|q| q.path.eq_ignore_ascii_case(&p.path));
            if !consequence {
                out.push(p);
            }
        }
        Err(ConfigErrors(out))
    }
}

/// A value and where it came from (for problem paths).
#[derive(Debug, Clone)]
struct Sourced<T> {
    value: T,
    origin: String,
}

fn sourced<T>(value: T, origin: impl Into<String>) -> Sourced<T> {
    Sourced {
        value,
        origin: origin.into(),
    }
}

/// A present, non-blank value, trimmed.
fn non_empty(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Loads and validates the configuration: defaults < `azure.json` < YAML < environment, plus
/// `--nodes`. Every problem is collected with its path; the error holds all of them.
///
/// Secrets: `azure.auth.clientSecretFile`, `ARM_CLIENT_SECRET` (then `AZURE_CLIENT_SECRET`), or
/// `aadClientSecret` in `azure.json`. The last one becomes `SecretSource::File(<azure.json>)`;
/// the credential reads the `aadClientSecret` field when the file name ends in `.json`
/// (see [`secret_from_cloud_config`]). A `clientSecret` key in YAML is rejected.
///
/// Identity: an identity flag in the environment (`ARM_USE_WORKLOAD_IDENTITY_EXTENSION`,
/// `ARM_USE_FEDERATED_WORKLOAD_IDENTITY_EXTENSION`, `ARM_USE_MANAGED_IDENTITY_EXTENSION`) beats
/// `azure.auth.method`, which beats the azure.json flags; with none of them, a client id plus a
/// secret means `clientSecret`. Of two variable names for one setting the later one wins, as in
/// cluster-autoscaler (`AZURE_TENANT_ID` over `ARM_TENANT_ID`, `AZURE_CLIENT_ID` over
/// `ARM_CLIENT_ID`, `AZURE_VMSS_CACHE_TTL` over `AZURE_VMSS_CACHE_TTL_IN_SECONDS`), except the
/// secret, where `ARM_CLIENT_SECRET` is preferred.
///
/// Auto-discovery: `CLUSTER_NAME` (or azure.json `clusterName`) overrides
/// `autoDiscovery.clusterName`; without an `autoDiscovery` block it enables discovery (no default
/// bounds: only scale sets with `min`/`max` tags) when no node group is listed, as a
/// cluster-autoscaler deployment without `--nodes` would.
pub fn load(sources: &ConfigSources) -> Result<Settings, ConfigErrors> {
    let mut problems = Problems::default();
    let env = sources::EnvReader(&sources.env);
    let cc = sources::read_cloud_config(sources.cloud_config_file.as_deref(), &mut problems);
    let (mut raw, yaml_text) = raw::read_yaml(sources.config_file.as_deref(), &mut problems);

    let azure = azure_settings(
        &env,
        raw.azure.take().unwrap_or_default(),
        &cc,
        sources.cloud_config_file.as_deref(),
        &mut problems,
    );
    let enable_vmss_etag = sources::enable_vmss_etag(&env, &raw, &cc, &mut problems);
    let looping = validate::loop_settings(&raw, &mut problems);
    let caches = sources::cache_timings(&env, &raw, &cc, &mut problems);
    let runtime = validate::runtime_settings(&raw, &mut problems);
    let node_groups = validate::node_groups(
        raw.node_groups.take().unwrap_or_default(),
        &sources.nodes,
        &mut problems,
    );
    let auto_discovery = discovery::auto_discovery(
        raw.auto_discovery.take(),
        &env,
        &cc,
        node_groups.is_empty(),
        &mut problems,
    );
    validate::something_to_manage(&node_groups, auto_discovery.is_some(), &mut problems);
    let kubernetes =
        kubernetes::kubernetes_settings(raw.kubernetes.take(), &sources.env, &mut problems);
    let pod_demand = pod_demand::pod_demand_settings(&mut raw, kubernetes.enabled, &mut problems);
    let scale_down =
        scale_down::scale_down_settings(raw.scale_down.take(), pod_demand.kind, &mut problems);
    let prices = prices::price_settings(raw.prices.take(), &mut problems);
    let consolidation = consolidation::consolidation_settings(
        raw.consolidation.take(),
        pod_demand.kind,
        scale_down.enabled,
        &mut problems,
    );

    if let (Some(file), Some(text)) = (&sources.config_file, &yaml_text) {
        raw::locate(&mut problems, file, text);
    }
    if let Some(file) = &sources.cloud_config_file {
        sources::locate(&mut problems, file);
    }
    problems.finish()?;
    let Some(azure) = azure else {
        // Every missing Azure piece pushed a problem, so this is unreachable; fail rather than panic.
        return Err(ConfigErrors(vec![ConfigProblem {
            path: "azure".into(),
            message: "incomplete Azure settings".into(),
            file: None,
        }]));
    };
    Ok(Settings {
        azure,
        enable_vmss_etag,
        conflict_strategy: looping.conflict_strategy,
        scan_interval: looping.scan_interval,
        vmss_cache_ttl: caches.vmss_cache_ttl,
        instance_cache_ttl: caches.instance_cache_ttl,
        instance_cache_jitter: caches.instance_cache_jitter,
        metrics_listen: runtime.metrics_listen,
        max_concurrent_writes: runtime.max_concurrent_writes,
        write_budget: runtime.write_budget,
        agent_pool_write_budget: runtime.agent_pool_write_budget,
        shutdown_grace: runtime.shutdown_grace,
        request_timeout: runtime.request_timeout,
        quota_cooldown: runtime.quota_cooldown,
        arm_budget_reserve: runtime.arm_budget_reserve,
        node_groups,
        auto_discovery,
        kubernetes,
        pod_demand,
        scale_down,
        prices,
        consolidation,
    })
}

/// The `azure` block with its environment and `azure.json` layers: endpoints, scope, credential,
/// extra CA. `None` if any piece had a problem (each recorded).
fn azure_settings(
    env: &sources::EnvReader,
    mut ya: raw::RawAzure,
    cc: &sources::CloudConfig,
    cloud_config_file: Option<&Path>,
    problems: &mut Problems,
) -> Option<AzureSettings> {
    let yauth = ya.auth.take().unwrap_or_default();
    let endpoints = sources::endpoints(env, &ya, cc, problems);
    let scope = sources::scope(env, &ya, cc);
    let auth = sources::auth(env, &yauth, cc, cloud_config_file, problems);
    let scope = validate::scope(scope, auth.as_ref(), problems);
    if let Some(ca) = &ya.ca_bundle_file {
        validate::check_ca_bundle(ca, "azure.caBundleFile", problems);
    }
    Some(AzureSettings {
        resource_manager_endpoint: endpoints.arm?,
        authority_host: endpoints.aad?,
        imds_endpoint: endpoints.imds?,
        tenant_id: scope.tenant_id,
        subscription_id: scope.subscription_id,
        resource_group: scope.resource_group,
        auth: auth?,
        ca_bundle_file: ya.ca_bundle_file,
    })
}

/// A human duration given as a command-line argument (`30s`, `1m30s`, `500ms`), with examples
/// in the error.
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 1m30s, 500ms)"))
}
