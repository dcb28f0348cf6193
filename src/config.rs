//! Configuration: YAML (camelCase, unknown keys rejected), cluster-autoscaler environment
//! overrides, an optional `azure.json` cloud-config, `--nodes=MIN:MAX:NAME` specs, validated into
//! [`Settings`].
//!
//! CONTRACT (shared with the rest of the crate): the validated types below are what every other
//! module consumes. Parsing/validation lives in [`load`].

use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use url::{Host, Url};

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
/// Default per-scale-set write budget.
pub const DEFAULT_WRITE_BUDGET: WriteBudget = WriteBudget {
    per_minute: 4.0,
    burst: 12,
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
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
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
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            path: path.into(),
            message: message.into(),
        });
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

// --- YAML schema (text -> these structs -> validated Settings) -------------------------------

/// A duration written the humantime way (`10s`, `1m30s`), parsed while deserializing.
#[derive(Debug, Clone, Copy)]
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a duration such as \"10s\" or \"1m30s\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(s.trim())
                    .map(HumanDuration)
                    .map_err(|e| {
                        E::custom(format!(
                            "invalid duration {s:?} ({e}); use e.g. \"10s\", \"5m\" or \"1m30s\""
                        ))
                    })
            }
        }
        d.deserialize_str(V)
    }
}

/// A UTC time of day, `HH:MM` or `HH:MM:SS`, as seconds after midnight.
#[derive(Debug, Clone, Copy)]
struct TimeOfDay(u32);

/// Parses `HH:MM` or `HH:MM:SS` (24 h) into seconds after midnight.
fn parse_time_of_day(s: &str) -> Result<u32, String> {
    let bad = || format!("invalid time {s:?}; use \"HH:MM\" or \"HH:MM:SS\" (UTC, 24-hour)");
    let parts: Vec<&str> = s.trim().split(':').collect();
    if parts.len() < 2 || parts.len() > 3 {
        return Err(bad());
    }
    let mut nums = [0u32; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        nums[i] = p.parse().map_err(|_| bad())?;
    }
    if nums[0] > 23 || nums[1] > 59 || nums[2] > 59 {
        return Err(bad());
    }
    Ok(nums[0] * 3600 + nums[1] * 60 + nums[2])
}

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = TimeOfDay;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a UTC time \"HH:MM\" or \"HH:MM:SS\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TimeOfDay, E> {
                parse_time_of_day(s).map(TimeOfDay).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Days of the week in schedules.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    fn index(self) -> u8 {
        self as u8
    }
}

/// Present-but-null is `Some(None)` (e.g. `metricsListen: null` disables the server).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    azure: Option<RawAzure>,
    #[serde(rename = "enableVMSSEtag")]
    enable_vmss_etag: Option<bool>,
    conflict_strategy: Option<RawConflictStrategy>,
    conflict_backoff: Option<HumanDuration>,
    scan_interval: Option<HumanDuration>,
    #[serde(rename = "vmssCacheTTL")]
    vmss_cache_ttl: Option<HumanDuration>,
    #[serde(rename = "instanceCacheTTL")]
    instance_cache_ttl: Option<HumanDuration>,
    instance_cache_jitter: Option<HumanDuration>,
    #[serde(default, deserialize_with = "present")]
    metrics_listen: Option<Option<String>>,
    max_concurrent_writes: Option<u32>,
    write_budget: Option<RawWriteBudget>,
    shutdown_grace: Option<HumanDuration>,
    request_timeout: Option<HumanDuration>,
    quota_cooldown: Option<HumanDuration>,
    node_groups: Option<Vec<RawNodeGroup>>,
    auto_discovery: Option<RawAutoDiscovery>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
enum RawConflictStrategy {
    Replan,
    NextLoop,
    RetryOnceThenBackoff,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAzure {
    resource_manager_endpoint: Option<String>,
    authority_host: Option<String>,
    imds_endpoint: Option<String>,
    tenant_id: Option<String>,
    subscription_id: Option<String>,
    resource_group: Option<String>,
    auth: Option<RawAuth>,
    ca_bundle_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
enum AuthMethod {
    ClientSecret,
    WorkloadIdentity,
    ManagedIdentity,
    AzureCli,
}

impl AuthMethod {
    fn name(self) -> &'static str {
        match self {
            AuthMethod::ClientSecret => "clientSecret",
            AuthMethod::WorkloadIdentity => "workloadIdentity",
            AuthMethod::ManagedIdentity => "managedIdentity",
            AuthMethod::AzureCli => "azureCli",
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAuth {
    method: Option<AuthMethod>,
    client_id: Option<String>,
    client_secret_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
    /// Accepted by the parser only to be rejected with a clear message.
    client_secret: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWriteBudget {
    per_minute: Option<f64>,
    burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawNodeGroup {
    name: Option<String>,
    min_size: Option<u32>,
    max_size: Option<u32>,
    desired_capacity: Option<u32>,
    max_scale_down_step: Option<u32>,
    schedules: Option<Vec<RawSchedule>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSchedule {
    start: Option<TimeOfDay>,
    end: Option<TimeOfDay>,
    days: Option<Vec<Day>>,
    desired_capacity: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAutoDiscovery {
    cluster_name: Option<String>,
    default_min: Option<u32>,
    default_max: Option<u32>,
}

/// Parses YAML text into [`RawConfig`], collecting every schema problem with its path.
///
/// serde stops at the first error, so the offending value is removed from the parsed tree and
/// deserialization is retried; each round reports one more problem. Removed values behave as
/// if absent (a removed list element shifts the indices of the ones after it).
fn decode_yaml(text: &str, origin: &str, problems: &mut Problems) -> RawConfig {
    let mut value: serde_yaml::Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            problems.push(origin, format!("not valid YAML: {e}"));
            return RawConfig::default();
        }
    };
    if value.is_null() {
        value = serde_yaml::Value::Mapping(Default::default());
    }
    for _ in 0..512 {
        match serde_path_to_error::deserialize::<_, RawConfig>(value.clone()) {
            Ok(raw) => return raw,
            Err(err) => {
                let mut segments: Vec<String> = Vec::new();
                let mut kinds: Vec<bool> = Vec::new(); // true = sequence index
                for seg in err.path().iter() {
                    match seg {
                        serde_path_to_error::Segment::Seq { index } => {
                            segments.push(index.to_string());
                            kinds.push(true);
                        }
                        serde_path_to_error::Segment::Map { key } => {
                            segments.push(key.clone());
                            kinds.push(false);
                        }
                        serde_path_to_error::Segment::Enum { .. }
                        | serde_path_to_error::Segment::Unknown => {}
                    }
                }
                let message = err.inner().to_string();
                // An unknown key may be reported at its parent: name it in the path.
                if let Some(key) = unknown_field_name(&message) {
                    if segments.last() != Some(&key) || kinds.last() == Some(&true) {
                        segments.push(key);
                        kinds.push(false);
                    }
                }
                let path = render_path(&segments, &kinds, origin);
                problems.push(path, friendly_serde_message(&message));
                if segments.is_empty() || !remove_at(&mut value, &segments, &kinds) {
                    return RawConfig::default();
                }
            }
        }
    }
    RawConfig::default()
}

/// Extracts `x` from serde's "unknown field `x`, expected ...".
fn unknown_field_name(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let end = rest.find('`')?;
    Some(rest[..end].to_string())
}

/// Drops serde_yaml's location suffix (meaningless for a re-serialized tree) and renames
/// "field" to "key" for YAML users.
fn friendly_serde_message(message: &str) -> String {
    let m = match message.find(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    if let Some(rest) = m.strip_prefix("unknown field ") {
        format!("unknown key {rest}")
    } else {
        m.to_string()
    }
}

fn render_path(segments: &[String], kinds: &[bool], origin: &str) -> String {
    if segments.is_empty() {
        return origin.to_string();
    }
    let mut out = String::new();
    for (seg, is_index) in segments.iter().zip(kinds) {
        if *is_index {
            out.push('[');
            out.push_str(seg);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

/// Removes the value at `segments` from the tree; false if nothing could be removed.
fn remove_at(value: &mut serde_yaml::Value, segments: &[String], kinds: &[bool]) -> bool {
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut cur = value;
    for (seg, is_index) in parents.iter().zip(kinds) {
        let next = if *is_index {
            seg.parse::<usize>()
                .ok()
                .and_then(|i| cur.as_sequence_mut().and_then(|s| s.get_mut(i)))
        } else {
            cur.as_mapping_mut().and_then(|m| m.get_mut(seg.as_str()))
        };
        match next {
            Some(n) => cur = n,
            None => return false,
        }
    }
    if kinds[segments.len() - 1] {
        match (last.parse::<usize>(), cur.as_sequence_mut()) {
            (Ok(i), Some(seq)) if i < seq.len() => {
                seq.remove(i);
                true
            }
            _ => false,
        }
    } else {
        cur.as_mapping_mut()
            .and_then(|m| m.remove(last.as_str()))
            .is_some()
    }
}

// --- azure.json (cloud-config) ----------------------------------------------------------------

/// The `azure.json` fields the controller reads. Unknown fields are ignored on purpose: the
/// file is cloud-provider-azure's, with dozens of fields that do not concern us.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CloudConfig {
    cloud: Option<String>,
    tenant_id: Option<String>,
    subscription_id: Option<String>,
    resource_group: Option<String>,
    aad_client_id: Option<String>,
    aad_client_secret: Option<String>,
    use_managed_identity_extension: Option<bool>,
    #[serde(rename = "userAssignedIdentityID")]
    user_assigned_identity_id: Option<String>,
    use_federated_workload_identity_extension: Option<bool>,
    use_workload_identity_extension: Option<bool>,
    aad_federated_token_file: Option<PathBuf>,
    #[serde(rename = "vmssCacheTTLInSeconds")]
    vmss_cache_ttl_in_seconds: Option<i64>,
    #[serde(rename = "vmssCacheTTL")]
    vmss_cache_ttl: Option<i64>,
    #[serde(rename = "vmssVirtualMachinesCacheTTLInSeconds")]
    vmss_virtual_machines_cache_ttl_in_seconds: Option<i64>,
    #[serde(rename = "vmssVmsCacheTTL")]
    vmss_vms_cache_ttl: Option<i64>,
    vmss_vms_cache_jitter: Option<i64>,
    #[serde(rename = "enableVMSSEtag")]
    enable_vmss_etag: Option<bool>,
    resource_manager_endpoint: Option<String>,
    cluster_name: Option<String>,
}

/// Reads the `aadClientSecret` field of an `azure.json` file (how [`SecretSource::File`] pointing
/// at a `.json` file is resolved). `None` if the file is not JSON or has no such field.
pub fn secret_from_cloud_config(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let s = v.get("aadClientSecret")?.as_str()?.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// ARM and AAD endpoints of a named Azure cloud (cloud-provider-azure's `cloud` field).
fn cloud_endpoints(name: &str) -> Option<(&'static str, &'static str)> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "azurepubliccloud" => Some((DEFAULT_ARM_ENDPOINT, DEFAULT_AUTHORITY_HOST)),
        "azureusgovernmentcloud" | "azureusgovernment" => Some((
            "https://management.usgovcloudapi.net",
            "https://login.microsoftonline.us",
        )),
        "azurechinacloud" => Some((
            "https://management.chinacloudapi.cn",
            "https://login.chinacloudapi.cn",
        )),
        _ => None,
    }
}

// --- environment ------------------------------------------------------------------------------

struct EnvReader<'a>(&'a HashMap<String, String>);

impl EnvReader<'_> {
    /// A non-blank variable, trimmed.
    fn get(&self, name: &str) -> Option<Sourced<String>> {
        let v = self.0.get(name)?.trim();
        (!v.is_empty()).then(|| sourced(v.to_string(), format!("env {name}")))
    }

    /// The last of `names` that is set wins (cluster-autoscaler's order of `os.Getenv` calls).
    fn last_of(&self, names: &[&str]) -> Option<Sourced<String>> {
        names.iter().rev().find_map(|n| self.get(n))
    }

    /// Go `strconv.ParseBool` semantics; a bad value is a problem naming the variable.
    fn bool(&self, name: &str, problems: &mut Problems) -> Option<Sourced<bool>> {
        let v = self.get(name)?;
        match parse_go_bool(&v.value) {
            Some(b) => Some(sourced(b, v.origin)),
            None => {
                problems.push(
                    v.origin,
                    format!("{:?} is not a boolean (use true or false)", v.value),
                );
                None
            }
        }
    }

    /// A base-10 int32, like cluster-autoscaler.
    fn int(&self, names: &[&str], problems: &mut Problems) -> Option<Sourced<i64>> {
        let v = self.last_of(names)?;
        match v.value.parse::<i32>() {
            Ok(n) => Some(sourced(i64::from(n), v.origin)),
            Err(_) => {
                problems.push(v.origin, format!("{:?} is not an integer", v.value));
                None
            }
        }
    }
}

fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Seconds from azure.json or env into a duration; `allow_zero` for jitter.
fn seconds(
    v: Sourced<i64>,
    allow_zero: bool,
    problems: &mut Problems,
) -> Option<Sourced<Duration>> {
    if v.value < 0 || (!allow_zero && v.value == 0) {
        let need = if allow_zero { ">= 0" } else { "> 0" };
        problems.push(
            v.origin,
            format!("must be a number of seconds {need}, got {}", v.value),
        );
        return None;
    }
    Some(sourced(Duration::from_secs(v.value as u64), v.origin))
}

// --- validation helpers -----------------------------------------------------------------------

/// Azure VMSS names: 1-64 characters of `[A-Za-z0-9._-]`.
fn check_scale_set_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name must not be empty".into());
    }
    if name.len() > 64 {
        return Err(format!(
            "{name:?} is not a valid scale-set name: longer than 64 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{name:?} is not a valid scale-set name: {c:?} is not allowed (use A-Z, a-z, 0-9, '.', '_', '-')"
        ));
    }
    Ok(())
}

fn is_loopback_host(host: &Host<&str>) -> bool {
    match host {
        Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        Host::Ipv4(ip) => IpAddr::V4(*ip).is_loopback(),
        Host::Ipv6(ip) => IpAddr::V6(*ip).is_loopback(),
    }
}

/// An ARM or AAD endpoint: https, or http for loopback hosts only.
fn check_endpoint(v: &Sourced<String>, problems: &mut Problems) -> Option<Url> {
    let url = match Url::parse(&v.value) {
        Ok(u) => u,
        Err(e) => {
            problems.push(&v.origin, format!("{:?} is not a URL: {e}", v.value));
            return None;
        }
    };
    let Some(host) = url.host() else {
        problems.push(&v.origin, format!("{:?} has no host", v.value));
        return None;
    };
    match url.scheme() {
        "https" => Some(url),
        "http" if is_loopback_host(&host) => Some(url),
        "http" => {
            problems.push(
                &v.origin,
                format!("http:// is allowed only for loopback hosts; use https for {host}"),
            );
            None
        }
        other => {
            problems.push(
                &v.origin,
                format!("unsupported scheme {other:?}; use https"),
            );
            None
        }
    }
}

/// IMDS is plain http by design (link-local); any http(s) URL is accepted.
fn check_imds(v: &Sourced<String>, problems: &mut Problems) -> Option<Url> {
    match Url::parse(&v.value) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Some(u),
        Ok(_) => {
            problems.push(&v.origin, format!("{:?} must be an http(s) URL", v.value));
            None
        }
        Err(e) => {
            problems.push(&v.origin, format!("{:?} is not a URL: {e}", v.value));
            None
        }
    }
}

fn check_ca_bundle(path: &Path, origin: &str, problems: &mut Problems) {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            if !text.contains("-----BEGIN CERTIFICATE-----") {
                problems.push(
                    origin,
                    format!(
                        "{} does not look like a PEM certificate bundle (no \"-----BEGIN CERTIFICATE-----\")",
                        path.display()
                    ),
                );
            }
        }
        Err(e) => problems.push(origin, format!("cannot read {}: {e}", path.display())),
    }
}

fn required(v: Option<Sourced<String>>, path: &str, hint: &str, problems: &mut Problems) -> String {
    match v {
        Some(v) => v.value,
        None => {
            problems.push(path, format!("required ({hint})"));
            String::new()
        }
    }
}

/// Node-group bounds shared by YAML groups and `--nodes`.
fn check_bounds(path: &str, min: u32, max: u32, problems: &mut Problems) -> bool {
    let mut ok = true;
    if min > max {
        problems.push(
            format!("{path}.minSize"),
            format!("minSize {min} is greater than maxSize {max}"),
        );
        ok = false;
    }
    if max > MAX_SCALE_SET_CAPACITY {
        problems.push(
            format!("{path}.maxSize"),
            format!("maxSize {max} is above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"),
        );
        ok = false;
    }
    ok
}

fn validate_node_group(
    path: &str,
    raw: RawNodeGroup,
    problems: &mut Problems,
) -> Option<NodeGroupSpec> {
    let before = problems.0.len();
    let name = non_empty(raw.name).unwrap_or_default();
    if let Err(m) = check_scale_set_name(&name) {
        problems.push(format!("{path}.name"), m);
    }
    let min = raw.min_size;
    let max = raw.max_size;
    if min.is_none() {
        problems.push(format!("{path}.minSize"), "required");
    }
    if max.is_none() {
        problems.push(format!("{path}.maxSize"), "required");
    }
    let (min, max) = (min.unwrap_or(0), max.unwrap_or(0));
    let bounds_ok = match (raw.min_size, raw.max_size) {
        (Some(_), Some(_)) => check_bounds(path, min, max, problems),
        (None, Some(_)) => {
            check_bounds(path, 0, max, problems);
            false
        }
        _ => false,
    };
    let in_bounds = |v: u32, p: String, what: &str, problems: &mut Problems| {
        if bounds_ok && (v < min || v > max) {
            problems.push(
                p,
                format!("{what} {v} is outside [minSize {min}, maxSize {max}]"),
            );
        }
    };
    if let Some(d) = raw.desired_capacity {
        in_bounds(
            d,
            format!("{path}.desiredCapacity"),
            "desiredCapacity",
            problems,
        );
    }
    if raw.max_scale_down_step == Some(0) {
        problems.push(
            format!("{path}.maxScaleDownStep"),
            "must be > 0 (omit it for no limit)",
        );
    }
    let mut schedules = Vec::new();
    for (j, s) in raw.schedules.unwrap_or_default().into_iter().enumerate() {
        let sp = format!("{path}.schedules[{j}]");
        if s.start.is_none() {
            problems.push(format!("{sp}.start"), "required (\"HH:MM\" UTC)");
        }
        if s.end.is_none() {
            problems.push(format!("{sp}.end"), "required (\"HH:MM\" UTC)");
        }
        if let (Some(a), Some(b)) = (s.start, s.end) {
            if a.0 == b.0 {
                problems.push(format!("{sp}.end"), "end equals start: the window is empty");
            }
        }
        match s.desired_capacity {
            Some(d) => in_bounds(
                d,
                format!("{sp}.desiredCapacity"),
                "desiredCapacity",
                problems,
            ),
            None => problems.push(format!("{sp}.desiredCapacity"), "required"),
        }
        let mut days: Vec<u8> = s
            .days
            .unwrap_or_default()
            .into_iter()
            .map(Day::index)
            .collect();
        days.sort_unstable();
        days.dedup();
        schedules.push(Schedule {
            start_secs: s.start.map_or(0, |t| t.0),
            end_secs: s.end.map_or(0, |t| t.0),
            days,
            desired_capacity: s.desired_capacity.unwrap_or(0),
        });
    }
    (problems.0.len() == before).then_some(NodeGroupSpec {
        name,
        kind: NodeGroupKind::Vmss,
        resource_group: None,
        min_size: min,
        max_size: max,
        desired_capacity: raw.desired_capacity,
        schedules,
        max_scale_down_step: raw.max_scale_down_step,
    })
}

/// Parses one cluster-autoscaler `--nodes` spec, `MIN:MAX:NAME`.
pub fn parse_node_spec(spec: &str) -> Result<NodeGroupSpec, String> {
    let parts: Vec<&str> = spec.trim().splitn(3, ':').collect();
    if parts.len() != 3 {
        return Err(format!("{spec:?} is not MIN:MAX:NAME (e.g. 1:10:vmss1)"));
    }
    let num = |s: &str, what: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{what} {s:?} is not a non-negative integer (spec {spec:?})"))
    };
    let min = num(parts[0], "MIN")?;
    let max = num(parts[1], "MAX")?;
    let name = parts[2].trim();
    if name.is_empty() {
        return Err(format!("NAME is empty (spec {spec:?})"));
    }
    check_scale_set_name(name)?;
    if min > max {
        return Err(format!(
            "MIN {min} is greater than MAX {max} (spec {spec:?})"
        ));
    }
    if max > MAX_SCALE_SET_CAPACITY {
        return Err(format!(
            "MAX {max} is above the scale-set limit of {MAX_SCALE_SET_CAPACITY} (spec {spec:?})"
        ));
    }
    Ok(NodeGroupSpec {
        name: name.to_string(),
        kind: NodeGroupKind::Vmss,
        resource_group: None,
        min_size: min,
        max_size: max,
        desired_capacity: None,
        schedules: Vec::new(),
        max_scale_down_step: None,
    })
}

fn positive(
    d: Option<HumanDuration>,
    default: Duration,
    path: &str,
    problems: &mut Problems,
) -> Duration {
    match d {
        Some(HumanDuration(d)) if d.is_zero() => {
            problems.push(path, "must be greater than 0");
            default
        }
        Some(HumanDuration(d)) => d,
        None => default,
    }
}

fn positive_sourced(
    v: Option<Sourced<Duration>>,
    default: Duration,
    problems: &mut Problems,
) -> Duration {
    match v {
        Some(v) if v.value.is_zero() => {
            problems.push(v.origin, "must be greater than 0");
            default
        }
        Some(v) => v.value,
        None => default,
    }
}

// --- load -------------------------------------------------------------------------------------

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
    let env = EnvReader(&sources.env);

    // azure.json
    let mut cc = CloudConfig::default();
    let cc_name = sources
        .cloud_config_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if let Some(path) = &sources.cloud_config_file {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mut de = serde_json::Deserializer::from_str(&text);
                match serde_path_to_error::deserialize::<_, CloudConfig>(&mut de) {
                    Ok(c) => cc = c,
                    Err(e) => {
                        problems.push(format!("azure.json:{}", e.path()), e.inner().to_string())
                    }
                }
            }
            Err(e) => problems.push(cc_name.clone(), format!("cannot read azure.json: {e}")),
        }
    }
    let js = |field: &str| format!("azure.json:{field}");

    // YAML
    let raw = match &sources.config_file {
        Some(path) => {
            let origin = path.display().to_string();
            match std::fs::read_to_string(path) {
                Ok(text) => decode_yaml(&text, &origin, &mut problems),
                Err(e) => {
                    problems.push(origin, format!("cannot read config file: {e}"));
                    RawConfig::default()
                }
            }
        }
        None => RawConfig::default(),
    };
    let ya = raw.azure.unwrap_or_default();
    let yauth = ya.auth.unwrap_or_default();

    // ---- azure endpoints
    let (cloud_arm, cloud_aad) = match non_empty(cc.cloud.clone()) {
        Some(name) => match cloud_endpoints(&name) {
            Some(e) => (Some(e.0), Some(e.1)),
            None => {
                problems.push(
                    js("cloud"),
                    format!("unknown cloud {name:?}; use AzurePublicCloud, AzureUSGovernmentCloud or AzureChinaCloud"),
                );
                (None, None)
            }
        },
        None => (None, None),
    };
    let arm = env
        .get("ARM_RESOURCE_MANAGER_ENDPOINT")
        .or_else(|| {
            non_empty(ya.resource_manager_endpoint)
                .map(|v| sourced(v, "azure.resourceManagerEndpoint"))
        })
        .or_else(|| {
            non_empty(cc.resource_manager_endpoint.clone())
                .map(|v| sourced(v, js("resourceManagerEndpoint")))
        })
        .or_else(|| cloud_arm.map(|v| sourced(v.to_string(), js("cloud"))))
        .unwrap_or_else(|| {
            sourced(
                DEFAULT_ARM_ENDPOINT.to_string(),
                "azure.resourceManagerEndpoint",
            )
        });
    let aad = env
        .get("AZURE_AUTHORITY_HOST")
        .or_else(|| non_empty(ya.authority_host).map(|v| sourced(v, "azure.authorityHost")))
        .or_else(|| cloud_aad.map(|v| sourced(v.to_string(), js("cloud"))))
        .unwrap_or_else(|| sourced(DEFAULT_AUTHORITY_HOST.to_string(), "azure.authorityHost"));
    let imds = non_empty(ya.imds_endpoint)
        .map(|v| sourced(v, "azure.imdsEndpoint"))
        .unwrap_or_else(|| sourced(DEFAULT_IMDS_ENDPOINT.to_string(), "azure.imdsEndpoint"));
    let arm_url = check_endpoint(&arm, &mut problems);
    let aad_url = check_endpoint(&aad, &mut problems);
    let imds_url = check_imds(&imds, &mut problems);

    // ---- scope
    let tenant = env
        .last_of(&["ARM_TENANT_ID", "AZURE_TENANT_ID"])
        .or_else(|| non_empty(ya.tenant_id).map(|v| sourced(v, "azure.tenantId")))
        .or_else(|| non_empty(cc.tenant_id.clone()).map(|v| sourced(v, js("tenantId"))));
    let subscription = env
        .get("ARM_SUBSCRIPTION_ID")
        .or_else(|| non_empty(ya.subscription_id).map(|v| sourced(v, "azure.subscriptionId")))
        .or_else(|| {
            non_empty(cc.subscription_id.clone()).map(|v| sourced(v, js("subscriptionId")))
        });
    let resource_group = env
        .get("ARM_RESOURCE_GROUP")
        .or_else(|| non_empty(ya.resource_group).map(|v| sourced(v, "azure.resourceGroup")))
        .or_else(|| non_empty(cc.resource_group.clone()).map(|v| sourced(v, js("resourceGroup"))));

    // ---- auth
    if yauth.client_secret.is_some() {
        problems.push(
            "azure.auth.clientSecret",
            "secrets never go in YAML; use clientSecretFile or the ARM_CLIENT_SECRET environment variable",
        );
    }
    let env_msi = env.bool("ARM_USE_MANAGED_IDENTITY_EXTENSION", &mut problems);
    let env_wi = {
        let a = env.bool(
            "ARM_USE_FEDERATED_WORKLOAD_IDENTITY_EXTENSION",
            &mut problems,
        );
        let b = env.bool("ARM_USE_WORKLOAD_IDENTITY_EXTENSION", &mut problems);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.value { a } else { b }),
            (a, b) => a.or(b),
        }
    };
    let json_msi = cc
        .use_managed_identity_extension
        .map(|v| sourced(v, js("useManagedIdentityExtension")));
    let json_wi = cc
        .use_workload_identity_extension
        .map(|v| sourced(v, js("useWorkloadIdentityExtension")))
        .or_else(|| {
            cc.use_federated_workload_identity_extension
                .map(|v| sourced(v, js("useFederatedWorkloadIdentityExtension")))
        });
    let msi = env_msi.clone().or(json_msi.clone()).filter(|v| v.value);
    let wi = env_wi.clone().or(json_wi.clone()).filter(|v| v.value);
    if let (Some(m), Some(w)) = (&msi, &wi) {
        problems.push(
            m.origin.clone(),
            format!(
                "you can not combine both managed identity and workload identity (also set: {})",
                w.origin
            ),
        );
    }
    let env_method = match (
        env_msi.as_ref().filter(|v| v.value),
        env_wi.as_ref().filter(|v| v.value),
    ) {
        (_, Some(_)) => Some(AuthMethod::WorkloadIdentity),
        (Some(_), None) => Some(AuthMethod::ManagedIdentity),
        _ => None,
    };
    let json_method = match (&json_msi, &json_wi) {
        (_, Some(w)) if w.value => Some(AuthMethod::WorkloadIdentity),
        (Some(m), _) if m.value => Some(AuthMethod::ManagedIdentity),
        _ => None,
    };
    let client_id = env
        .last_of(&["ARM_CLIENT_ID", "AZURE_CLIENT_ID"])
        .or_else(|| non_empty(yauth.client_id.clone()).map(|v| sourced(v, "azure.auth.clientId")))
        .or_else(|| non_empty(cc.aad_client_id.clone()).map(|v| sourced(v, js("aadClientId"))));
    // ARM_CLIENT_SECRET (cluster-autoscaler's name) first, then the azure-identity name.
    let secret: Option<SecretSource> = if let Some(name) =
        ["ARM_CLIENT_SECRET", "AZURE_CLIENT_SECRET"]
            .into_iter()
            .find(|n| env.get(n).is_some())
    {
        Some(SecretSource::Env(name.to_string()))
    } else if let Some(f) = &yauth.client_secret_file {
        Some(SecretSource::File(f.clone()))
    } else if non_empty(cc.aad_client_secret.clone()).is_some() {
        sources.cloud_config_file.clone().map(SecretSource::File)
    } else {
        None
    };
    if let Some(f) = &yauth.client_secret_file {
        if let Err(e) = std::fs::metadata(f) {
            problems.push(
                "azure.auth.clientSecretFile",
                format!("cannot read {}: {e}", f.display()),
            );
        }
    }
    let method = env_method
        .or(yauth.method)
        .or(json_method)
        .or_else(|| (client_id.is_some() && secret.is_some()).then_some(AuthMethod::ClientSecret));
    let auth = match method {
        None => {
            problems.push(
                "azure.auth",
                "no credential configured: set azure.auth.method (clientSecret, workloadIdentity, managedIdentity, azureCli) or ARM_CLIENT_ID + ARM_CLIENT_SECRET, ARM_USE_WORKLOAD_IDENTITY_EXTENSION, ARM_USE_MANAGED_IDENTITY_EXTENSION",
            );
            None
        }
        Some(AuthMethod::ClientSecret) => {
            let id = required(
                client_id,
                "azure.auth.clientId",
                "clientSecret needs the application (client) id; or set ARM_CLIENT_ID",
                &mut problems,
            );
            match secret {
                Some(secret) => Some(AuthSettings::ClientSecret {
                    client_id: id,
                    secret,
                }),
                None => {
                    problems.push(
                        "azure.auth.clientSecretFile",
                        "clientSecret needs a secret: set clientSecretFile or the ARM_CLIENT_SECRET environment variable",
                    );
                    None
                }
            }
        }
        Some(AuthMethod::WorkloadIdentity) => {
            let id = required(
                client_id,
                "azure.auth.clientId",
                "workloadIdentity needs the application (client) id; or set AZURE_CLIENT_ID",
                &mut problems,
            );
            let file = env
                .get("AZURE_FEDERATED_TOKEN_FILE")
                .map(|v| PathBuf::from(v.value))
                .or(yauth.token_file.clone())
                .or(cc
                    .aad_federated_token_file
                    .clone()
                    .filter(|p| !p.as_os_str().is_empty()));
            match file {
                Some(token_file) => Some(AuthSettings::WorkloadIdentity {
                    client_id: id,
                    token_file,
                }),
                None => {
                    problems.push(
                        "azure.auth.tokenFile",
                        "workloadIdentity needs the projected token file: set tokenFile or AZURE_FEDERATED_TOKEN_FILE",
                    );
                    None
                }
            }
        }
        Some(AuthMethod::ManagedIdentity) => {
            let id = env
                .get("ARM_USER_ASSIGNED_IDENTITY_ID")
                .map(|v| v.value)
                .or(non_empty(yauth.client_id.clone())
                    .filter(|_| yauth.method == Some(AuthMethod::ManagedIdentity)))
                .or(non_empty(cc.user_assigned_identity_id.clone()));
            Some(AuthSettings::ManagedIdentity { client_id: id })
        }
        Some(AuthMethod::AzureCli) => Some(AuthSettings::AzureCli),
    };
    if let Some(m) = yauth.method {
        if m != AuthMethod::WorkloadIdentity && yauth.token_file.is_some() {
            problems.push(
                "azure.auth.tokenFile",
                format!("not used by method {}", m.name()),
            );
        }
        if m != AuthMethod::ClientSecret && yauth.client_secret_file.is_some() {
            problems.push(
                "azure.auth.clientSecretFile",
                format!("not used by method {}", m.name()),
            );
        }
    }

    let tenant_needed = !matches!(
        auth,
        Some(AuthSettings::ManagedIdentity { .. }) | Some(AuthSettings::AzureCli)
    );
    let tenant_id = match tenant {
        Some(t) => t.value,
        None if tenant_needed => {
            problems.push(
                "azure.tenantId",
                "required (or set ARM_TENANT_ID / AZURE_TENANT_ID)",
            );
            String::new()
        }
        None => String::new(),
    };
    let subscription_id = required(
        subscription,
        "azure.subscriptionId",
        "or set ARM_SUBSCRIPTION_ID",
        &mut problems,
    );
    let resource_group = required(
        resource_group,
        "azure.resourceGroup",
        "or set ARM_RESOURCE_GROUP",
        &mut problems,
    );

    if let Some(ca) = &ya.ca_bundle_file {
        check_ca_bundle(ca, "azure.caBundleFile", &mut problems);
    }

    // ---- behaviour
    let etag = env
        .bool("AZURE_ENABLE_VMSS_ETAG", &mut problems)
        .map(|v| v.value)
        .or(raw.enable_vmss_etag)
        .or(cc.enable_vmss_etag)
        .unwrap_or(true);
    let conflict_backoff = positive(
        raw.conflict_backoff,
        DEFAULT_CONFLICT_BACKOFF,
        "conflictBackoff",
        &mut problems,
    );
    let conflict_strategy = match raw.conflict_strategy.unwrap_or(RawConflictStrategy::Replan) {
        RawConflictStrategy::Replan => ConflictStrategy::Replan,
        RawConflictStrategy::NextLoop => ConflictStrategy::NextLoop,
        RawConflictStrategy::RetryOnceThenBackoff => ConflictStrategy::RetryOnceThenBackoff {
            backoff: conflict_backoff,
        },
    };
    let scan_interval = positive(
        raw.scan_interval,
        DEFAULT_SCAN_INTERVAL,
        "scanInterval",
        &mut problems,
    );

    let json_vmss_ttl = cc
        .vmss_cache_ttl
        .map(|v| sourced(v, js("vmssCacheTTL")))
        .or(cc
            .vmss_cache_ttl_in_seconds
            .map(|v| sourced(v, js("vmssCacheTTLInSeconds"))))
        .and_then(|v| seconds(v, false, &mut problems));
    let env_vmss_ttl = env
        .int(
            &["AZURE_VMSS_CACHE_TTL_IN_SECONDS", "AZURE_VMSS_CACHE_TTL"],
            &mut problems,
        )
        .and_then(|v| seconds(v, false, &mut problems));
    let vmss_cache_ttl = match env_vmss_ttl {
        Some(v) => v.value,
        None => match raw.vmss_cache_ttl {
            Some(d) => positive(
                Some(d),
                DEFAULT_VMSS_CACHE_TTL,
                "vmssCacheTTL",
                &mut problems,
            ),
            None => positive_sourced(json_vmss_ttl, DEFAULT_VMSS_CACHE_TTL, &mut problems),
        },
    };
    let json_inst_ttl = cc
        .vmss_vms_cache_ttl
        .map(|v| sourced(v, js("vmssVmsCacheTTL")))
        .or(cc
            .vmss_virtual_machines_cache_ttl_in_seconds
            .map(|v| sourced(v, js("vmssVirtualMachinesCacheTTLInSeconds"))))
        .and_then(|v| seconds(v, false, &mut problems));
    let env_inst_ttl = env
        .int(
            &[
                "AZURE_VMSS_VMS_CACHE_TTL_IN_SECONDS",
                "AZURE_VMSS_VMS_CACHE_TTL",
            ],
            &mut problems,
        )
        .and_then(|v| seconds(v, false, &mut problems));
    let instance_cache_ttl = match env_inst_ttl {
        Some(v) => v.value,
        None => match raw.instance_cache_ttl {
            Some(d) => positive(
                Some(d),
                DEFAULT_INSTANCE_CACHE_TTL,
                "instanceCacheTTL",
                &mut problems,
            ),
            None => positive_sourced(json_inst_ttl, DEFAULT_INSTANCE_CACHE_TTL, &mut problems),
        },
    };
    let json_jitter = cc
        .vmss_vms_cache_jitter
        .map(|v| sourced(v, js("vmssVmsCacheJitter")))
        .and_then(|v| seconds(v, true, &mut problems));
    let env_jitter = env
        .int(&["AZURE_VMSS_VMS_CACHE_JITTER"], &mut problems)
        .and_then(|v| seconds(v, true, &mut problems));
    let instance_cache_jitter = env_jitter
        .map(|v| v.value)
        .or(raw.instance_cache_jitter.map(|d| d.0))
        .or(json_jitter.map(|v| v.value))
        .unwrap_or(Duration::ZERO);

    let metrics_listen = match raw.metrics_listen {
        Some(None) => None,
        Some(Some(s)) => match s.trim().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(e) => {
                problems.push(
                    "metricsListen",
                    format!("{s:?} is not an address like 0.0.0.0:8085 ({e}); use null to disable"),
                );
                None
            }
        },
        None => DEFAULT_METRICS_LISTEN.parse().ok(),
    };
    let max_concurrent_writes = match raw.max_concurrent_writes {
        Some(0) => {
            problems.push("maxConcurrentWrites", "must be at least 1");
            DEFAULT_MAX_CONCURRENT_WRITES
        }
        Some(n) => n as usize,
        None => DEFAULT_MAX_CONCURRENT_WRITES,
    };
    let write_budget = {
        let wb = raw.write_budget.unwrap_or_default();
        let per_minute = wb.per_minute.unwrap_or(DEFAULT_WRITE_BUDGET.per_minute);
        let burst = wb.burst.unwrap_or(DEFAULT_WRITE_BUDGET.burst);
        if !(per_minute.is_finite() && per_minute > 0.0) {
            problems.push(
                "writeBudget.perMinute",
                format!("must be a number > 0, got {per_minute}"),
            );
        }
        if burst == 0 {
            problems.push("writeBudget.burst", "must be at least 1");
        }
        WriteBudget { per_minute, burst }
    };
    let shutdown_grace = raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0);
    let request_timeout = positive(
        raw.request_timeout,
        DEFAULT_REQUEST_TIMEOUT,
        "requestTimeout",
        &mut problems,
    );
    let quota_cooldown = positive(
        raw.quota_cooldown,
        DEFAULT_QUOTA_COOLDOWN,
        "quotaCooldown",
        &mut problems,
    );

    // ---- node groups
    let mut node_groups: Vec<NodeGroupSpec> = Vec::new();
    let mut seen: HashMap<String, String> = HashMap::new();
    for (i, g) in raw.node_groups.unwrap_or_default().into_iter().enumerate() {
        let path = format!("nodeGroups[{i}]");
        let name = non_empty(g.name.clone()).unwrap_or_default();
        if !name.is_empty() {
            if let Some(first) = seen.get(&name.to_ascii_lowercase()) {
                problems.push(
                    format!("{path}.name"),
                    format!("duplicate node group {name:?} (also {first})"),
                );
            } else {
                seen.insert(name.to_ascii_lowercase(), path.clone());
            }
        }
        if let Some(spec) = validate_node_group(&path, g, &mut problems) {
            node_groups.push(spec);
        }
    }
    for (i, spec) in sources.nodes.iter().enumerate() {
        let path = format!("--nodes[{i}]");
        match parse_node_spec(spec) {
            Ok(g) => {
                if let Some(first) = seen.get(&g.name.to_ascii_lowercase()) {
                    problems.push(
                        path,
                        format!("duplicate node group {:?} (also {first})", g.name),
                    );
                } else {
                    seen.insert(g.name.to_ascii_lowercase(), path);
                    node_groups.push(g);
                }
            }
            Err(m) => problems.push(path, m),
        }
    }

    // ---- auto-discovery
    let cluster_override = env
        .get("CLUSTER_NAME")
        .or_else(|| non_empty(cc.cluster_name.clone()).map(|v| sourced(v, js("clusterName"))));
    let auto_discovery = match raw.auto_discovery {
        Some(ad) => {
            let cluster = env
                .get("CLUSTER_NAME")
                .map(|v| v.value)
                .or(non_empty(ad.cluster_name))
                .or(non_empty(cc.cluster_name.clone()));
            let cluster_name = match cluster {
                Some(c) => c,
                None => {
                    problems.push(
                        "autoDiscovery.clusterName",
                        "required (or set CLUSTER_NAME)",
                    );
                    String::new()
                }
            };
            if let (Some(a), Some(b)) = (ad.default_min, ad.default_max) {
                if a > b {
                    problems.push(
                        "autoDiscovery.defaultMin",
                        format!("defaultMin {a} is greater than defaultMax {b}"),
                    );
                }
            }
            if ad.default_max.is_some_and(|m| m > MAX_SCALE_SET_CAPACITY) {
                problems.push(
                    "autoDiscovery.defaultMax",
                    format!("above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"),
                );
            }
            Some(AutoDiscovery {
                cluster_name,
                default_min: ad.default_min,
                default_max: ad.default_max,
            })
        }
        // cluster-autoscaler deployments without --nodes discover by cluster name.
        None if node_groups.is_empty() => cluster_override.map(|c| AutoDiscovery {
            cluster_name: c.value,
            default_min: None,
            default_max: None,
        }),
        None => None,
    };
    if node_groups.is_empty()
        && auto_discovery.is_none()
        && !problems
            .0
            .iter()
            .any(|p| p.path.starts_with("nodeGroups") || p.path.starts_with("--nodes"))
    {
        problems.push(
            "nodeGroups",
            "nothing to manage: list nodeGroups, pass --nodes=MIN:MAX:NAME, or configure autoDiscovery",
        );
    }

    if !problems.0.is_empty() {
        // A value removed for a schema error would also be reported as missing: say it once.
        let mut out: Vec<ConfigProblem> = Vec::with_capacity(problems.0.len());
        for p in problems.0 {
            let consequence = p.message.starts_with("required")
                && out.iter().any(|q| q.path.eq_ignore_ascii_case(&p.path));
            if !consequence {
                out.push(p);
            }
        }
        return Err(ConfigErrors(out));
    }
    let (Some(resource_manager_endpoint), Some(authority_host), Some(imds_endpoint), Some(auth)) =
        (arm_url, aad_url, imds_url, auth)
    else {
        // Every None above pushed a problem, so this is unreachable; fail loudly rather than panic.
        return Err(ConfigErrors(vec![ConfigProblem {
            path: "azure".into(),
            message: "incomplete Azure settings".into(),
        }]));
    };
    Ok(Settings {
        azure: AzureSettings {
            resource_manager_endpoint,
            authority_host,
            imds_endpoint,
            tenant_id,
            subscription_id,
            resource_group,
            auth,
            ca_bundle_file: ya.ca_bundle_file,
        },
        enable_vmss_etag: etag,
        conflict_strategy,
        scan_interval,
        vmss_cache_ttl,
        instance_cache_ttl,
        instance_cache_jitter,
        metrics_listen,
        max_concurrent_writes,
        write_budget,
        shutdown_grace,
        request_timeout,
        quota_cooldown,
        node_groups,
        auto_discovery,
    })
}

// --- auto-discovery ---------------------------------------------------------------------------

/// Tag that opts a scale set into auto-discovery (value `true`).
pub const TAG_ENABLED: &str = "cluster-autoscaler-enabled";
/// Tag naming the cluster a scale set belongs to.
pub const TAG_CLUSTER_NAME: &str = "cluster-autoscaler-name";
/// Tag with the scale set's minimum size.
pub const TAG_MIN: &str = "min";
/// Tag with the scale set's maximum size.
pub const TAG_MAX: &str = "max";

fn tag<'a>(tags: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    // Azure tag names are case-insensitive.
    tags.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
}

/// Picks the scale sets that auto-discovery manages: tagged `cluster-autoscaler-enabled=true` and
/// `cluster-autoscaler-name=<cluster>`, with bounds from the `min`/`max` tags (tags win over the
/// defaults). Returns the node groups and the skipped scale sets with the reason, for the log.
/// Scale sets without the two discovery tags are not ours and are not reported.
pub fn discover_node_groups(
    auto: &AutoDiscovery,
    scale_sets: &[(String, BTreeMap<String, String>)],
) -> (Vec<NodeGroupSpec>, Vec<(String, String)>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for (name, tags) in scale_sets {
        let enabled = tag(tags, TAG_ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let cluster = tag(tags, TAG_CLUSTER_NAME);
        if !enabled || cluster != Some(auto.cluster_name.as_str()) {
            continue;
        }
        let bound = |key: &str, default: Option<u32>, what: &str| -> Result<u32, String> {
            match tag(tags, key) {
                Some(v) => v
                    .parse::<u32>()
                    .map_err(|_| format!("{key} tag {v:?} is not a non-negative integer")),
                None => default.ok_or_else(|| format!("no {key} tag and no {what}")),
            }
        };
        let result = bound(TAG_MIN, auto.default_min, "defaultMin").and_then(|min| {
            let max = bound(TAG_MAX, auto.default_max, "defaultMax")?;
            if max < min {
                return Err(format!("max {max} is less than min {min}"));
            }
            if max > MAX_SCALE_SET_CAPACITY {
                return Err(format!(
                    "max {max} is above the scale-set limit of {MAX_SCALE_SET_CAPACITY}"
                ));
            }
            check_scale_set_name(name)?;
            Ok((min, max))
        });
        match result {
            Ok((min, max)) => found.push(NodeGroupSpec {
                name: name.clone(),
                kind: NodeGroupKind::Vmss,
                resource_group: None,
                min_size: min,
                max_size: max,
                desired_capacity: None,
                schedules: Vec::new(),
                max_scale_down_step: None,
            }),
            Err(reason) => skipped.push((name.clone(), reason)),
        }
    }
    (found, skipped)
}
