//! Validation: raw values into the typed settings, each problem with the path of the key at
//! fault (`nodeGroups[1].maxSize`, `--nodes[0]`, `env AZURE_ENABLE_VMSS_ETAG`). Checks here never
//! stop at the first problem; they record it and go on with a placeholder.

use super::raw::{Day, HumanDuration, RawConfig, RawConflictStrategy, RawNodeGroup, RawSchedule};
use super::sources::Scope;
use super::{
    non_empty, AuthSettings, ConflictStrategy, NodeGroupKind, NodeGroupSpec, Problems, Schedule,
    Sourced, WriteBudget, DEFAULT_AGENT_POOL_WRITE_BUDGET, DEFAULT_CONFLICT_BACKOFF,
    DEFAULT_MAX_CONCURRENT_WRITES, DEFAULT_METRICS_LISTEN, DEFAULT_QUOTA_COOLDOWN,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_SCAN_INTERVAL, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WRITE_BUDGET,
    MAX_SCALE_SET_CAPACITY,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use url::{Host, Url};

/// Tenant, subscription and resource group, as strings (empty where a problem was recorded).
pub(super) struct ValidScope {
    pub(super) tenant_id: String,
    pub(super) subscription_id: String,
    pub(super) resource_group: String,
}

/// Subscription and resource group are always required; the tenant too, except for managed
/// identity and the Azure CLI, which know their own.
pub(super) fn scope(
    scope: Scope,
    auth: Option<&AuthSettings>,
    problems: &mut Problems,
) -> ValidScope {
    let tenant_needed = !matches!(
        auth,
        Some(AuthSettings::ManagedIdentity { .. }) | Some(AuthSettings::AzureCli)
    );
    let tenant_id = match scope.tenant {
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
        scope.subscription,
        "azure.subscriptionId",
        "or set ARM_SUBSCRIPTION_ID",
        problems,
    );
    let resource_group = required(
        scope.resource_group,
        "azure.resourceGroup",
        "or set ARM_RESOURCE_GROUP",
        problems,
    );
    ValidScope {
        tenant_id,
        subscription_id,
        resource_group,
    }
}

/// How the loop reacts and how often it runs.
pub(super) struct LoopSettings {
    pub(super) conflict_strategy: ConflictStrategy,
    pub(super) scan_interval: Duration,
}

/// `conflictStrategy` (with `conflictBackoff`) and `scanInterval`.
pub(super) fn loop_settings(raw: &RawConfig, problems: &mut Problems) -> LoopSettings {
    let conflict_backoff = positive(
        raw.conflict_backoff,
        DEFAULT_CONFLICT_BACKOFF,
        "conflictBackoff",
        problems,
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
        problems,
    );
    LoopSettings {
        conflict_strategy,
        scan_interval,
    }
}

/// How the process runs: listen address, write concurrency and budget, timeouts.
pub(super) struct RuntimeSettings {
    pub(super) metrics_listen: Option<SocketAddr>,
    pub(super) max_concurrent_writes: usize,
    pub(super) write_budget: WriteBudget,
    pub(super) agent_pool_write_budget: WriteBudget,
    pub(super) shutdown_grace: Duration,
    pub(super) request_timeout: Duration,
    pub(super) quota_cooldown: Duration,
    pub(super) arm_budget_reserve: f64,
}

/// `metricsListen`, `maxConcurrentWrites`, `writeBudget`, `shutdownGrace`, `requestTimeout`,
/// `quotaCooldown`.
pub(super) fn runtime_settings(raw: &RawConfig, problems: &mut Problems) -> RuntimeSettings {
    let metrics_listen = match &raw.metrics_listen {
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
    // A configured `writeBudget` (each of its keys) wins for every kind of node group; what it
    // leaves out is the kind's default.
    let wb = raw.write_budget.as_ref();
    let budget = |default: WriteBudget| WriteBudget {
        per_minute: wb.and_then(|w| w.per_minute).unwrap_or(default.per_minute),
        burst: wb.and_then(|w| w.burst).unwrap_or(default.burst),
    };
    let write_budget = budget(DEFAULT_WRITE_BUDGET);
    let agent_pool_write_budget = budget(DEFAULT_AGENT_POOL_WRITE_BUDGET);
    if let Some(per_minute) = wb.and_then(|w| w.per_minute) {
        if !(per_minute.is_finite() && per_minute > 0.0) {
            problems.push(
                "writeBudget.perMinute",
                format!("must be a number > 0, got {per_minute}"),
            );
        }
    }
    if wb.and_then(|w| w.burst) == Some(0) {
        problems.push("writeBudget.burst", "must be at least 1");
    }
    RuntimeSettings {
        metrics_listen,
        max_concurrent_writes,
        write_budget,
        agent_pool_write_budget,
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        request_timeout: positive(
            raw.request_timeout,
            DEFAULT_REQUEST_TIMEOUT,
            "requestTimeout",
            problems,
        ),
        quota_cooldown: positive(
            raw.quota_cooldown,
            DEFAULT_QUOTA_COOLDOWN,
            "quotaCooldown",
            problems,
        ),
        arm_budget_reserve: match raw.arm_budget_reserve_percentage {
            Some(p) if !(p.is_finite() && (0.0..=90.0).contains(&p)) => {
                problems.push(
                    "armBudgetReservePercentage",
                    format!("must be a number from 0 (pacing off) to 90, got {p}"),
                );
                DEFAULT_ARM_BUDGET_RESERVE
            }
            Some(p) => p / 100.0,
            None => DEFAULT_ARM_BUDGET_RESERVE,
        },
    }
}

/// The share of every ARM bucket kept in reserve by default (`armBudgetReservePercentage: 20`).
pub const DEFAULT_ARM_BUDGET_RESERVE: f64 = 0.2;

/// The YAML node groups, then the `--nodes` specs; names are unique ignoring case across both.
pub(super) fn node_groups(
    yaml: Vec<RawNodeGroup>,
    nodes: &[String],
    problems: &mut Problems,
) -> Vec<NodeGroupSpec> {
    let mut node_groups: Vec<NodeGroupSpec> = Vec::new();
    // Lower-cased name -> path of its first occurrence.
    let mut seen: HashMap<String, String> = HashMap::new();
    for (i, g) in yaml.into_iter().enumerate() {
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
        if let Some(spec) = node_group(&path, g, problems) {
            node_groups.push(spec);
        }
    }
    for (i, spec) in nodes.iter().enumerate() {
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
    node_groups
}

/// Something must be managed: listed groups or auto-discovery. Not reported when the node
/// groups had problems of their own (they were listed, just wrong).
pub(super) fn something_to_manage(
    node_groups: &[NodeGroupSpec],
    auto_discovery: bool,
    problems: &mut Problems,
) {
    if node_groups.is_empty()
        && !auto_discovery
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
}

/// One YAML node group; `None` if it had any problem.
fn node_group(path: &str, raw: RawNodeGroup, problems: &mut Problems) -> Option<NodeGroupSpec> {
    let before = problems.0.len();
    let backing = backing(path, raw.kind, raw.cluster, raw.resource_group, problems);
    let name = non_empty(raw.name).unwrap_or_default();
    let name_check = match &backing {
        Some((NodeGroupKind::AksAgentPool { .. }, _)) => check_pool_name(&name),
        _ => check_scale_set_name(&name),
    };
    if let Err(m) = name_check {
        problems.push(format!("{path}.name"), m);
    }
    if raw.min_size.is_none() {
        problems.push(format!("{path}.minSize"), "required");
    }
    if raw.max_size.is_none() {
        problems.push(format!("{path}.maxSize"), "required");
    }
    let (min, max) = (raw.min_size.unwrap_or(0), raw.max_size.unwrap_or(0));
    let bounds_ok = match (raw.min_size, raw.max_size) {
        (Some(_), Some(_)) => check_bounds(path, min, max, problems),
        (None, Some(_)) => {
            check_bounds(path, 0, max, problems);
            false
        }
        _ => false,
    };
    // Capacities are checked against the bounds only when the bounds themselves are sound.
    let bounds = bounds_ok.then_some((min, max));
    if let Some(d) = raw.desired_capacity {
        check_in_bounds(d, bounds, format!("{path}.desiredCapacity"), problems);
    }
    if raw.max_scale_down_step == Some(0) {
        problems.push(
            format!("{path}.maxScaleDownStep"),
            "must be > 0 (omit it for no limit)",
        );
    }
    let schedules = schedules(path, raw.schedules.unwrap_or_default(), bounds, problems);
    let (kind, resource_group) = backing?;
    (problems.0.len() == before).then_some(NodeGroupSpec {
        name,
        kind,
        resource_group,
        min_size: min,
        max_size: max,
        desired_capacity: raw.desired_capacity,
        schedules,
        max_scale_down_step: raw.max_scale_down_step,
    })
}

/// What backs a YAML group: `kind` (`vmss`, the default, or `aksAgentPool`), with `cluster`
/// (required for a pool) and `resourceGroup` (optional, pools only). `None` for an unknown kind.
fn backing(
    path: &str,
    kind: Option<serde_yaml::Value>,
    cluster: Option<String>,
    resource_group: Option<String>,
    problems: &mut Problems,
) -> Option<(NodeGroupKind, Option<String>)> {
    let kind = match kind {
        None | Some(serde_yaml::Value::Null) => None,
        Some(serde_yaml::Value::String(s)) => Some(s.trim().to_string()),
        // Not text: shown as YAML so the message says what was written.
        Some(other) => Some(
            serde_yaml::to_string(&other)
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        ),
    };
    match kind.as_deref() {
        None | Some("vmss") => {
            if cluster.is_some() {
                problems.push(
                    format!("{path}.cluster"),
                    "only for kind aksAgentPool; a vmss group is a scale set in azure.resourceGroup (set kind: aksAgentPool for an AKS agent pool)",
                );
            }
            if resource_group.is_some() {
                problems.push(
                    format!("{path}.resourceGroup"),
                    "scale sets are read from azure.resourceGroup; resourceGroup is only for kind aksAgentPool",
                );
            }
            Some((NodeGroupKind::Vmss, None))
        }
        Some("aksAgentPool") => {
            let cluster = match non_empty(cluster) {
                Some(c) => {
                    if let Err(m) = check_cluster_name(&c) {
                        problems.push(format!("{path}.cluster"), m);
                    }
                    c
                }
                None => {
                    problems.push(
                        format!("{path}.cluster"),
                        "required when kind is aksAgentPool (the managed cluster's name)",
                    );
                    String::new()
                }
            };
            let resource_group = non_empty(resource_group);
            if let Some(rg) = &resource_group {
                if let Err(m) = check_resource_group_name(rg) {
                    problems.push(format!("{path}.resourceGroup"), m);
                }
            }
            Some((NodeGroupKind::AksAgentPool { cluster }, resource_group))
        }
        Some(other) => {
            problems.push(
                format!("{path}.kind"),
                format!("unknown kind {other:?}; use vmss (the default) or aksAgentPool"),
            );
            None
        }
    }
}

/// A node group's schedule windows (placeholders where a problem was recorded).
fn schedules(
    path: &str,
    raw: Vec<RawSchedule>,
    bounds: Option<(u32, u32)>,
    problems: &mut Problems,
) -> Vec<Schedule> {
    let mut schedules = Vec::new();
    for (j, s) in raw.into_iter().enumerate() {
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
            Some(d) => check_in_bounds(d, bounds, format!("{sp}.desiredCapacity"), problems),
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
    schedules
}

/// A desired capacity at `path` must lie within the group's bounds (when they are known).
fn check_in_bounds(v: u32, bounds: Option<(u32, u32)>, path: String, problems: &mut Problems) {
    if let Some((min, max)) = bounds {
        if v < min || v > max {
            problems.push(
                path,
                format!("desiredCapacity {v} is outside [minSize {min}, maxSize {max}]"),
            );
        }
    }
}

/// Azure VMSS names: 1-64 characters of `[A-Za-z0-9._-]`.
pub(super) fn check_scale_set_name(name: &str) -> Result<(), String> {
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

/// AKS agent-pool names: 1-12 lowercase letters and digits, starting with a letter (AKS's rule
/// for Linux pools; Windows pools allow only 6, which AKS itself reports).
pub(super) fn check_pool_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name must not be empty".into());
    }
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
    let allowed = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.len() > 12 || !starts_with_letter || !allowed {
        return Err(format!(
            "{name:?} is not a valid agent-pool name: AKS pool names are 1-12 lowercase letters and digits, starting with a letter"
        ));
    }
    Ok(())
}

/// AKS managed-cluster names: 1-63 characters of `[A-Za-z0-9_-]`, starting and ending with a
/// letter or digit.
pub(super) fn check_cluster_name(name: &str) -> Result<(), String> {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let allowed = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if name.len() > 63 || !allowed || !edge_ok(name.chars().next()) || !edge_ok(name.chars().last())
    {
        return Err(format!(
            "{name:?} is not a valid managed-cluster name: 1-63 letters, digits, '_' and '-', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Azure resource-group names: 1-90 letters, digits, `_`, `-`, `.`, `(`, `)`, not ending in `.`.
pub(super) fn check_resource_group_name(name: &str) -> Result<(), String> {
    let allowed = name
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')'));
    if name.chars().count() > 90 || !allowed || name.ends_with('.') {
        return Err(format!(
            "{name:?} is not a valid resource-group name: 1-90 letters, digits, '_', '-', '.', '(' and ')', not ending in '.'"
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
pub(super) fn check_endpoint(v: &Sourced<String>, problems: &mut Problems) -> Option<Url> {
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
pub(super) fn check_imds(v: &Sourced<String>, problems: &mut Problems) -> Option<Url> {
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

pub(super) fn check_ca_bundle(path: &Path, origin: &str, problems: &mut Problems) {
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

pub(super) fn required(
    v: Option<Sourced<String>>,
    path: &str,
    hint: &str,
    problems: &mut Problems,
) -> String {
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

pub(super) fn positive(
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

pub(super) fn positive_sourced(
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
