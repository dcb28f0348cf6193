//! YAML decoding: the text of the config file into the `Raw*` structs (camelCase keys, unknown
//! keys rejected), collecting every schema problem with its path. Nothing here checks ranges or
//! combinations; that is `validate`'s job.

use super::Problems;
use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Reads and decodes the YAML file, with its relative paths resolved against the file's folder;
/// a missing file name means an empty configuration. The text comes back too, for [`locate`].
pub(super) fn read_yaml(
    path: Option<&Path>,
    problems: &mut Problems,
) -> (RawConfig, Option<String>) {
    let Some(path) = path else {
        return (RawConfig::default(), None);
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut raw = decode_yaml(&text, path, problems);
            resolve_relative_paths(&mut raw, path.parent().unwrap_or(Path::new("")));
            (raw, Some(text))
        }
        Err(e) => {
            problems.push_in_file(path, None, format!("cannot read config file: {e}"));
            (RawConfig::default(), None)
        }
    }
}

/// The file paths a configuration names (`azure.caBundleFile`, `azure.auth.clientSecretFile`,
/// `azure.auth.tokenFile`, `kubernetes.kubeconfig`), when relative, are taken from `folder`, the
/// configuration file's own, not from the working directory: `./ca.pem` beside the file.
fn resolve_relative_paths(raw: &mut RawConfig, folder: &Path) {
    let resolve = |p: &mut Option<PathBuf>| {
        if let Some(path) = p
            .as_mut()
            .filter(|p| p.is_relative() && !p.as_os_str().is_empty())
        {
            // `./x` joined as `folder/x`, not `folder/./x`, so messages name the path plainly.
            let rest: PathBuf = path
                .components()
                .filter(|c| !matches!(c, std::path::Component::CurDir))
                .collect();
            *path = folder.join(rest);
        }
    };
    if let Some(azure) = raw.azure.as_mut() {
        resolve(&mut azure.ca_bundle_file);
        if let Some(auth) = azure.auth.as_mut() {
            resolve(&mut auth.client_secret_file);
            resolve(&mut auth.token_file);
        }
    }
    if let Some(k) = raw.kubernetes.as_mut() {
        resolve(&mut k.kubeconfig);
    }
}

/// Gives the problems whose path is a key of the YAML file that file, with the line and column
/// of that key (or of the nearest enclosing key the file has).
pub(super) fn locate(problems: &mut Problems, file: &Path, text: &str) {
    let whole = file.display().to_string();
    for p in problems.0.iter_mut().filter(|p| p.file.is_none()) {
        if p.path == whole {
            p.file = Some(super::FileLocation {
                path: file.to_path_buf(),
                line_column: None,
            });
            continue;
        }
        let Some(segments) = yaml_path(&p.path) else {
            continue;
        };
        let line_column = (1..=segments.len())
            .rev()
            .find_map(|n| position(text, &segments[..n]));
        if line_column.is_some() {
            p.file = Some(super::FileLocation {
                path: file.to_path_buf(),
                line_column,
            });
        }
    }
}

/// One step of a path into a YAML document.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `nodeGroups[1].maxSize` as steps; `None` for what is not a path into the YAML file
/// (`env X`, `--nodes[0]`, `azure.json:x`, a file name).
fn yaml_path(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let plain = |k: &str| {
            !k.is_empty()
                && !k.starts_with('-')
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !plain(key) {
            return None;
        }
        steps.push(Step::Key(key.to_string()));
        while !indices.is_empty() {
            let close = indices.find(']')?;
            steps.push(Step::Index(indices.get(1..close)?.parse().ok()?));
            indices = &indices[close + 1..];
        }
    }
    Some(steps)
}

/// What [`position`]'s search raises when it reaches the value, so serde_yaml stamps the error
/// with that value's place.
const FOUND: &str = "\u{0}found";

/// Line and column (from 1) of the value at `steps` in the YAML `text`: of its key in a mapping,
/// of the item in a list. `None` when the text has no such value.
fn position(text: &str, steps: &[Step]) -> Option<(usize, usize)> {
    use serde::de::DeserializeSeed;
    match (Find { steps }).deserialize(serde_yaml::Deserializer::from_str(text)) {
        Ok(()) => None,
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| (l.line(), l.column())),
        Err(_) => None,
    }
}

/// Walks a YAML document down `steps`; fails with [`FOUND`] at the last one.
struct Find<'a> {
    steps: &'a [Step],
}

impl<'de> de::DeserializeSeed<'de> for Find<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Find<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a mapping or a list")
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Step::Key(want), rest)) = self.steps.split_first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        while let Some(hit) = map.next_key_seed(KeyIs {
            want,
            last: rest.is_empty(),
        })? {
            if hit {
                map.next_value_seed(Find { steps: rest })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Step::Index(want), rest)) = self.steps.split_first() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut i = 0;
        loop {
            let more = if i == *want && rest.is_empty() {
                seq.next_element_seed(Here)?.is_some()
            } else if i == *want {
                seq.next_element_seed(Find { steps: rest })?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }
}

/// A mapping key: whether it is `want`; [`FOUND`] if it is and it is the last step.
struct KeyIs<'a> {
    want: &'a str,
    last: bool,
}

impl<'de> de::DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for KeyIs<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<bool, E> {
        match (s == self.want, self.last) {
            (true, true) => Err(E::custom(FOUND)),
            (hit, _) => Ok(hit),
        }
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<bool, E> {
        self.visit_str(&n.to_string())
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<bool, E> {
        self.visit_str(&n.to_string())
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<bool, E> {
        self.visit_str(&b.to_string())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// A list item that is the last step: [`FOUND`], stamped with the item's place.
struct Here;

impl<'de> de::DeserializeSeed<'de> for Here {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Here {
    type Value = ();
    /// Every value is refused with a message holding [`FOUND`].
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(FOUND)
    }
}

/// A duration written the humantime way (`10s`, `1m30s`), parsed while deserializing.
#[derive(Debug, Clone, Copy)]
pub(super) struct HumanDuration(pub(super) Duration);

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
pub(super) struct TimeOfDay(pub(super) u32);

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
pub(super) enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    pub(super) fn index(self) -> u8 {
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
pub(super) struct RawConfig {
    pub(super) azure: Option<RawAzure>,
    #[serde(rename = "enableVMSSEtag")]
    pub(super) enable_vmss_etag: Option<bool>,
    pub(super) conflict_strategy: Option<RawConflictStrategy>,
    pub(super) conflict_backoff: Option<HumanDuration>,
    pub(super) scan_interval: Option<HumanDuration>,
    #[serde(rename = "vmssCacheTTL")]
    pub(super) vmss_cache_ttl: Option<HumanDuration>,
    #[serde(rename = "instanceCacheTTL")]
    pub(super) instance_cache_ttl: Option<HumanDuration>,
    pub(super) instance_cache_jitter: Option<HumanDuration>,
    #[serde(default, deserialize_with = "present")]
    pub(super) metrics_listen: Option<Option<String>>,
    pub(super) max_concurrent_writes: Option<u32>,
    pub(super) write_budget: Option<RawWriteBudget>,
    pub(super) shutdown_grace: Option<HumanDuration>,
    pub(super) request_timeout: Option<HumanDuration>,
    pub(super) quota_cooldown: Option<HumanDuration>,
    pub(super) arm_budget_reserve_percentage: Option<f64>,
    pub(super) node_groups: Option<Vec<RawNodeGroup>>,
    pub(super) auto_discovery: Option<RawAutoDiscovery>,
    pub(super) kubernetes: Option<RawKubernetes>,
    pub(super) demand: Option<String>,
    pub(super) expander: Option<String>,
    pub(super) expander_priorities: Option<std::collections::BTreeMap<i32, Vec<String>>>,
    pub(super) expendable_pods_priority_cutoff: Option<i32>,
    pub(super) max_node_provision_time: Option<HumanDuration>,
    pub(super) pod_batch_idle: Option<HumanDuration>,
    pub(super) pod_batch_max: Option<HumanDuration>,
    pub(super) balance_similar_node_groups: Option<bool>,
    pub(super) enable_provisioning_requests: Option<bool>,
    pub(super) capacity_buffer_controller_enabled: Option<bool>,
    pub(super) capacity_buffer_pod_injection_enabled: Option<bool>,
    pub(super) scale_down: Option<RawScaleDown>,
    pub(super) prices: Option<RawPrices>,
    pub(super) consolidation: Option<RawConsolidation>,
}

/// `consolidation:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawConsolidation {
    pub(super) enabled: Option<bool>,
    pub(super) policy: Option<String>,
    pub(super) consolidate_after: Option<HumanDuration>,
    pub(super) validation_delay: Option<HumanDuration>,
    pub(super) timeout: Option<HumanDuration>,
    pub(super) budgets: Option<Vec<RawBudget>>,
    pub(super) group_budgets: Option<std::collections::BTreeMap<String, Vec<RawBudget>>>,
    pub(super) cluster_budgets: Option<Vec<RawBudget>>,
    pub(super) deletion_cost_hints: Option<u32>,
    pub(super) stabilization_window: Option<HumanDuration>,
    pub(super) empty_first: Option<HumanDuration>,
    pub(super) delay_after_add: Option<HumanDuration>,
    pub(super) disrupt_jobs: Option<bool>,
}

/// One budget of `consolidation:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawBudget {
    pub(super) nodes: Option<String>,
    pub(super) reasons: Option<Vec<String>>,
    pub(super) schedule: Option<String>,
    pub(super) duration: Option<String>,
}

/// `prices:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawPrices {
    pub(super) fetch: Option<bool>,
    pub(super) endpoint: Option<String>,
    pub(super) refresh_interval: Option<HumanDuration>,
    pub(super) price_per_hour: Option<std::collections::BTreeMap<String, f64>>,
}

/// `scaleDown:` (cluster-autoscaler's `--scale-down-*` flags, camelCased).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawScaleDown {
    pub(super) enabled: Option<bool>,
    pub(super) utilization_threshold: Option<f64>,
    pub(super) unneeded_time: Option<HumanDuration>,
    pub(super) delay_after_add: Option<HumanDuration>,
    pub(super) delay_type_local: Option<bool>,
    pub(super) max_empty_bulk_delete: Option<u32>,
    pub(super) node_delete_delay_after_taint: Option<HumanDuration>,
    pub(super) max_pod_eviction_time: Option<HumanDuration>,
    pub(super) max_scale_down_per_pass: Option<u32>,
    pub(super) non_empty_candidates_count: Option<u32>,
    pub(super) unready_time: Option<HumanDuration>,
    pub(super) ok_total_unready_count: Option<u32>,
    pub(super) max_total_unready_percentage: Option<f64>,
    pub(super) max_bulk_soft_taint_count: Option<u32>,
    pub(super) max_bulk_soft_taint_time: Option<HumanDuration>,
}

/// `kubernetes:`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawKubernetes {
    pub(super) enabled: Option<bool>,
    pub(super) kubeconfig: Option<PathBuf>,
    pub(super) namespace: Option<String>,
    pub(super) leader_election: Option<RawLeaderElection>,
    pub(super) status_config_map: Option<String>,
    pub(super) cluster_autoscaler_status_config_map: Option<String>,
}

/// `kubernetes.leaderElection`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawLeaderElection {
    pub(super) enabled: Option<bool>,
    pub(super) lease_name: Option<String>,
    pub(super) lease_duration: Option<HumanDuration>,
    pub(super) renew_deadline: Option<HumanDuration>,
    pub(super) retry_period: Option<HumanDuration>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum RawConflictStrategy {
    Replan,
    NextLoop,
    RetryOnceThenBackoff,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawAzure {
    pub(super) resource_manager_endpoint: Option<String>,
    pub(super) authority_host: Option<String>,
    pub(super) imds_endpoint: Option<String>,
    pub(super) tenant_id: Option<String>,
    pub(super) subscription_id: Option<String>,
    pub(super) resource_group: Option<String>,
    pub(super) auth: Option<RawAuth>,
    pub(super) ca_bundle_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum AuthMethod {
    ClientSecret,
    WorkloadIdentity,
    ManagedIdentity,
    AzureCli,
}

impl AuthMethod {
    pub(super) fn name(self) -> &'static str {
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
pub(super) struct RawAuth {
    pub(super) method: Option<AuthMethod>,
    pub(super) client_id: Option<String>,
    pub(super) client_secret_file: Option<PathBuf>,
    pub(super) token_file: Option<PathBuf>,
    /// Accepted by the parser only to be rejected with a clear message.
    pub(super) client_secret: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawWriteBudget {
    pub(super) per_minute: Option<f64>,
    pub(super) burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawNodeGroup {
    pub(super) name: Option<String>,
    /// Kept as any YAML value so that an unknown or mistyped kind gets a message listing the
    /// allowed ones, rather than being removed (which would make the group a scale set).
    pub(super) kind: Option<serde_yaml::Value>,
    pub(super) cluster: Option<String>,
    pub(super) resource_group: Option<String>,
    pub(super) min_size: Option<u32>,
    pub(super) max_size: Option<u32>,
    pub(super) desired_capacity: Option<u32>,
    pub(super) max_scale_down_step: Option<u32>,
    pub(super) schedules: Option<Vec<RawSchedule>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawSchedule {
    pub(super) start: Option<TimeOfDay>,
    pub(super) end: Option<TimeOfDay>,
    pub(super) days: Option<Vec<Day>>,
    pub(super) desired_capacity: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawAutoDiscovery {
    pub(super) cluster_name: Option<String>,
    pub(super) default_min: Option<u32>,
    pub(super) default_max: Option<u32>,
    pub(super) aks_cluster: Option<String>,
    pub(super) aks_resource_group: Option<String>,
}

/// Parses YAML text into [`RawConfig`], collecting every schema problem with its path.
///
/// serde stops at the first error, so the offending value is removed from the parsed tree and
/// deserialization is retried; each round reports one more problem. Removed values behave as
/// if absent (a removed list element shifts the indices of the ones after it).
fn decode_yaml(text: &str, file: &Path, problems: &mut Problems) -> RawConfig {
    let origin = file.display().to_string();
    let origin = origin.as_str();
    let mut value: serde_yaml::Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let at = e.location().map(|l| (l.line(), l.column()));
            let message = e.to_string();
            let message = match (at, message.find(" at line ")) {
                (Some(_), Some(i)) => &message[..i],
                _ => message.as_str(),
            };
            problems.push_in_file(file, at, format!("not valid YAML: {message}"));
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
