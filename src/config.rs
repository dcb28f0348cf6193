//! Configuration: YAML (camelCase, unknown keys rejected), cluster-autoscaler environment
//! overrides, an optional `azure.json` cloud-config, `--nodes=MIN:MAX:NAME` specs, validated into
//! [`Settings`].
//!
//! CONTRACT (shared with the rest of the crate): the validated types below are what every other
//! module consumes. Parsing/validation lives in [`load`].

use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// Per-scale-set write budget (token bucket), mirroring Azure's compute limits.
    pub write_budget: WriteBudget,
    /// How long SIGTERM waits for in-flight writes.
    pub shutdown_grace: Duration,
    /// Timeout of one ARM or token request.
    pub request_timeout: Duration,
    /// How long a node group cools down after a quota 409 (`OperationNotAllowed`).
    pub quota_cooldown: Duration,
    /// Explicitly configured node groups (YAML list and `--nodes`).
    pub node_groups: Vec<NodeGroupSpec>,
    /// Tag auto-discovery, if enabled.
    pub auto_discovery: Option<AutoDiscovery>,
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

/// Token bucket for capacity writes to one scale set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteBudget {
    /// Writes refilled per minute.
    pub per_minute: f64,
    /// Bucket size.
    pub burst: u32,
}

/// One node group (= one scale set) under management.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGroupSpec {
    /// Scale-set name.
    pub name: String,
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

/// cluster-autoscaler style tag auto-discovery.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoDiscovery {
    /// Required value of the `cluster-autoscaler-name` tag.
    pub cluster_name: String,
    /// Default min when a scale set has no `min` tag; `None` skips such scale sets.
    pub default_min: Option<u32>,
    /// Default max when a scale set has no `max` tag; `None` skips such scale sets.
    pub default_max: Option<u32>,
}

/// cluster-autoscaler style tag auto-discovery over listed scale sets: returns the discovered
/// groups and the skipped scale sets with the reason (logged by the reconciler).
pub fn discover_node_groups(
    auto: &AutoDiscovery,
    scale_sets: &[(String, std::collections::BTreeMap<String, String>)],
) -> (Vec<NodeGroupSpec>, Vec<(String, String)>) {
    let mut groups = Vec::new();
    let mut skipped = Vec::new();
    for (name, tags) in scale_sets {
        if tags.get("cluster-autoscaler-enabled").map(String::as_str) != Some("true") {
            continue;
        }
        if tags.get("cluster-autoscaler-name") != Some(&auto.cluster_name) {
            skipped.push((name.clone(), format!("cluster-autoscaler-name is not {}", auto.cluster_name)));
            continue;
        }
        let read = |k: &str, default: Option<u32>| match tags.get(k) {
            Some(v) => v.trim().parse::<u32>().map_err(|_| format!("tag {k}={v} is not a non-negative integer")),
            None => default.ok_or_else(|| format!("no {k} tag and no default")),
        };
        match (read("min", auto.default_min), read("max", auto.default_max)) {
            (Ok(min), Ok(max)) if min <= max => groups.push(NodeGroupSpec {
                name: name.clone(),
                min_size: min,
                max_size: max,
                desired_capacity: None,
                schedules: Vec::new(),
                max_scale_down_step: None,
            }),
            (Ok(min), Ok(max)) => skipped.push((name.clone(), format!("max {max} is below min {min}"))),
            (Err(e), _) | (_, Err(e)) => skipped.push((name.clone(), e)),
        }
    }
    (groups, skipped)
}
