//! An agent pool as the AKS REST specification (2024-09-01 and later) has it: the writable
//! properties it persists, its JSON (the pool's ETag at `properties.eTag`, no top-level `etag`),
//! and the two ways a body changes it: the agent-pool PUT replaces the object, a PATCH or a
//! cluster's `agentPoolProfiles` entry merges what it names.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::super::scale_sets::{parse_count, parse_tags};
use super::super::Reply;

/// `vmSize` of a pool created without one.
pub(crate) const DEFAULT_VM_SIZE: &str = "Standard_D2s_v5";
/// `maxPods` of a pool created without one (AKS's default for kubenet and Azure CNI overlay).
pub(crate) const DEFAULT_MAX_PODS: i64 = 110;
/// `count` of a pool created, or replaced, without one (the specification's default).
pub(crate) const DEFAULT_COUNT: i64 = 1;
/// Largest `maxPods` AKS accepts.
const MAX_MAX_PODS: i64 = 250;

/// `properties.mode`: a cluster keeps at least one `System` pool, which never goes below 1 node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    System,
    User,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::System => "System",
            Mode::User => "User",
        }
    }

    fn parse(v: &Value) -> Result<Mode, Reply> {
        match v.as_str() {
            Some(s) if s.eq_ignore_ascii_case("system") => Ok(Mode::System),
            Some(s) if s.eq_ignore_ascii_case("user") => Ok(Mode::User),
            _ => Err(invalid(format!(
                "The value {v} of 'mode' is invalid: it must be 'System' or 'User'."
            ))),
        }
    }
}

/// One agent pool of a managed cluster.
#[derive(Clone, Debug)]
pub(crate) struct Pool {
    pub name: String,
    pub count: i64,
    pub vm_size: String,
    pub mode: Mode,
    pub enable_auto_scaling: bool,
    pub min_count: Option<i64>,
    pub max_count: Option<i64>,
    pub max_pods: i64,
    pub node_labels: BTreeMap<String, String>,
    pub node_taints: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub orchestrator_version: String,
    /// `availabilityZones` (empty: regional); fixed at creation.
    pub availability_zones: Vec<String>,
    /// `scaleSetPriority` (`Spot`; `None`: Regular); fixed at creation.
    pub priority: Option<String>,
    /// `scaleSetEvictionPolicy` of a spot pool; fixed at creation.
    pub eviction_policy: Option<String>,
    pub etag: String,
    pub busy_until: Instant,
    pub failed: bool,
}

/// The writable properties a body names; `None` means the body left the field out.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolBody {
    pub count: Option<i64>,
    pub vm_size: Option<String>,
    pub mode: Option<Mode>,
    pub enable_auto_scaling: Option<bool>,
    pub min_count: Option<Option<i64>>,
    pub max_count: Option<Option<i64>>,
    pub max_pods: Option<i64>,
    pub node_labels: Option<BTreeMap<String, String>>,
    pub node_taints: Option<Vec<String>>,
    pub tags: Option<BTreeMap<String, String>>,
    pub orchestrator_version: Option<String>,
    pub availability_zones: Option<Vec<String>>,
    pub priority: Option<String>,
    pub eviction_policy: Option<String>,
}

fn invalid(msg: impl Into<String>) -> Reply {
    Reply::arm_error(400, "InvalidParameter", msg)
}

fn present<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

fn parse_string(v: &Value, what: &str) -> Result<String, Reply> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| invalid(format!("The value {v} of '{what}' must be a string.")))
}

fn parse_bool(v: &Value, what: &str) -> Result<bool, Reply> {
    v.as_bool()
        .ok_or_else(|| invalid(format!("The value {v} of '{what}' must be true or false.")))
}

fn parse_taints(v: &Value) -> Result<Vec<String>, Reply> {
    let Some(list) = v.as_array() else {
        return Err(invalid(format!(
            "'nodeTaints' must be a list of strings, got {v}."
        )));
    };
    list.iter()
        .map(|t| {
            t.as_str().map(str::to_string).ok_or_else(|| {
                invalid(format!(
                    "The taint {t} must be a string like 'key=value:NoSchedule'."
                ))
            })
        })
        .collect()
}

impl PoolBody {
    /// Reads the writable fields of an agent pool's `properties` (or a cluster's pool profile).
    /// Read-only fields (`eTag`, `provisioningState`, `currentOrchestratorVersion`, ...) are
    /// ignored, as ARM does, so a client can send back the object it read.
    pub fn parse(m: &Map<String, Value>) -> Result<PoolBody, Reply> {
        let mut out = PoolBody::default();
        if let Some(v) = present(m, "count") {
            out.count = Some(parse_count(v, "count")?);
        }
        if let Some(v) = present(m, "vmSize") {
            out.vm_size = Some(parse_string(v, "vmSize")?);
        }
        if let Some(v) = present(m, "mode") {
            out.mode = Some(Mode::parse(v)?);
        }
        if let Some(v) = present(m, "enableAutoScaling") {
            out.enable_auto_scaling = Some(parse_bool(v, "enableAutoScaling")?);
        }
        // minCount and maxCount may be sent as null to clear them.
        if let Some(v) = m.get("minCount") {
            out.min_count = Some(match v {
                Value::Null => None,
                v => Some(parse_count(v, "minCount")?),
            });
        }
        if let Some(v) = m.get("maxCount") {
            out.max_count = Some(match v {
                Value::Null => None,
                v => Some(parse_count(v, "maxCount")?),
            });
        }
        if let Some(v) = present(m, "maxPods") {
            match v.as_i64() {
                Some(n) if (10..=MAX_MAX_PODS).contains(&n) => out.max_pods = Some(n),
                _ => {
                    return Err(invalid(format!(
                        "The value {v} of 'maxPods' is invalid: it must be an integer between 10 and {MAX_MAX_PODS}."
                    )))
                }
            }
        }
        if let Some(v) = m.get("nodeLabels") {
            out.node_labels = parse_tags(v)?;
        }
        if let Some(v) = present(m, "nodeTaints") {
            out.node_taints = Some(parse_taints(v)?);
        }
        if let Some(v) = m.get("tags") {
            out.tags = parse_tags(v)?;
        }
        if let Some(v) = present(m, "availabilityZones") {
            let zones = v.as_array().and_then(|a| {
                a.iter()
                    .map(|z| z.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            });
            out.availability_zones = Some(zones.ok_or_else(|| {
                invalid(format!(
                    "'availabilityZones' must be a list of zone names like [\"1\", \"2\"], got {v}."
                ))
            })?);
        }
        if let Some(v) = present(m, "scaleSetPriority") {
            let p = parse_string(v, "scaleSetPriority")?;
            if !(p.eq_ignore_ascii_case("spot") || p.eq_ignore_ascii_case("regular")) {
                return Err(invalid(format!(
                    "The value '{p}' of 'scaleSetPriority' is invalid: it must be 'Spot' or 'Regular'."
                )));
            }
            out.priority = Some(p);
        }
        if let Some(v) = present(m, "scaleSetEvictionPolicy") {
            let p = parse_string(v, "scaleSetEvictionPolicy")?;
            if !(p.eq_ignore_ascii_case("delete") || p.eq_ignore_ascii_case("deallocate")) {
                return Err(invalid(format!(
                    "The value '{p}' of 'scaleSetEvictionPolicy' is invalid: it must be 'Delete' or 'Deallocate'."
                )));
            }
            out.eviction_policy = Some(p);
        }
        if let Some(v) = present(m, "orchestratorVersion") {
            // An empty version means "the default", i.e. no change.
            out.orchestrator_version =
                Some(parse_string(v, "orchestratorVersion")?).filter(|s| !s.is_empty());
        }
        Ok(out)
    }
}

impl Pool {
    /// A new pool from a body; fields the body leaves out take AKS's defaults.
    pub fn new(
        name: &str,
        body: PoolBody,
        default_mode: Mode,
        kubernetes_version: &str,
        etag: String,
        busy_until: Instant,
        failed: bool,
    ) -> Result<Pool, Reply> {
        let pool = Pool {
            name: name.to_string(),
            count: body.count.unwrap_or(DEFAULT_COUNT),
            vm_size: body.vm_size.unwrap_or_else(|| DEFAULT_VM_SIZE.to_string()),
            mode: body.mode.unwrap_or(default_mode),
            enable_auto_scaling: body.enable_auto_scaling.unwrap_or(false),
            min_count: body.min_count.flatten(),
            max_count: body.max_count.flatten(),
            max_pods: body.max_pods.unwrap_or(DEFAULT_MAX_PODS),
            node_labels: body.node_labels.unwrap_or_default(),
            node_taints: body.node_taints.unwrap_or_default(),
            tags: body.tags.unwrap_or_default(),
            orchestrator_version: body
                .orchestrator_version
                .unwrap_or_else(|| kubernetes_version.to_string()),
            availability_zones: body.availability_zones.unwrap_or_default(),
            eviction_policy: body
                .priority
                .as_deref()
                .filter(|p| p.eq_ignore_ascii_case("spot"))
                .map(|_| body.eviction_policy.unwrap_or_else(|| "Delete".into())),
            priority: body.priority.filter(|p| p.eq_ignore_ascii_case("spot")),
            etag,
            busy_until,
            failed,
        };
        pool.validate()?;
        Ok(pool)
    }

    /// The agent-pool PUT: the body replaces the object. Writable fields it leaves out return to
    /// their defaults; `vmSize` and `maxPods` cannot change after creation (left out, they stay);
    /// `mode` and `orchestratorVersion` left out stay as they are.
    pub fn replaced(&self, body: PoolBody) -> Result<Pool, Reply> {
        self.check_immutable(&body)?;
        let next = Pool {
            count: body.count.unwrap_or(DEFAULT_COUNT),
            mode: body.mode.unwrap_or(self.mode),
            enable_auto_scaling: body.enable_auto_scaling.unwrap_or(false),
            min_count: body.min_count.flatten(),
            max_count: body.max_count.flatten(),
            node_labels: body.node_labels.unwrap_or_default(),
            node_taints: body.node_taints.unwrap_or_default(),
            tags: body.tags.unwrap_or_default(),
            orchestrator_version: body
                .orchestrator_version
                .unwrap_or_else(|| self.orchestrator_version.clone()),
            ..self.clone()
        };
        next.validate()?;
        Ok(next)
    }

    /// A PATCH, or a pool profile in a cluster write: only the fields the body names change.
    pub fn merged(&self, body: PoolBody) -> Result<Pool, Reply> {
        self.check_immutable(&body)?;
        let mut next = self.clone();
        if let Some(v) = body.count {
            next.count = v;
        }
        if let Some(v) = body.mode {
            next.mode = v;
        }
        if let Some(v) = body.enable_auto_scaling {
            next.enable_auto_scaling = v;
        }
        if let Some(v) = body.min_count {
            next.min_count = v;
        }
        if let Some(v) = body.max_count {
            next.max_count = v;
        }
        if let Some(v) = body.node_labels {
            next.node_labels = v;
        }
        if let Some(v) = body.node_taints {
            next.node_taints = v;
        }
        if let Some(v) = body.tags {
            next.tags = v;
        }
        if let Some(v) = body.orchestrator_version {
            next.orchestrator_version = v;
        }
        next.validate()?;
        Ok(next)
    }

    fn check_immutable(&self, body: &PoolBody) -> Result<(), Reply> {
        let fixed = |what: &str, from: String, to: String| {
            Err(Reply::arm_error(
                400,
                "PropertyChangeNotAllowed",
                format!(
                    "Changing property '{what}' of agent pool '{}' from {from} to {to} is not allowed.",
                    self.name
                ),
            ))
        };
        if let Some(z) = &body.availability_zones {
            if *z != self.availability_zones {
                return fixed(
                    "availabilityZones",
                    format!("{:?}", self.availability_zones),
                    format!("{z:?}"),
                );
            }
        }
        let spot = |p: Option<&str>| p.is_some_and(|p| p.eq_ignore_ascii_case("spot"));
        if let Some(p) = &body.priority {
            if spot(Some(p)) != spot(self.priority.as_deref()) {
                return fixed(
                    "scaleSetPriority",
                    format!("'{}'", self.priority.as_deref().unwrap_or("Regular")),
                    format!("'{p}'"),
                );
            }
        }
        if let (Some(p), Some(current)) = (&body.eviction_policy, &self.eviction_policy) {
            if !p.eq_ignore_ascii_case(current) {
                return fixed(
                    "scaleSetEvictionPolicy",
                    format!("'{current}'"),
                    format!("'{p}'"),
                );
            }
        }
        if let Some(v) = &body.vm_size {
            if !v.eq_ignore_ascii_case(&self.vm_size) {
                return Err(Reply::arm_error(
                    400,
                    "PropertyChangeNotAllowed",
                    format!(
                        "Changing property 'vmSize' of agent pool '{}' from '{}' to '{v}' is not allowed.",
                        self.name, self.vm_size
                    ),
                ));
            }
        }
        if let Some(v) = body.max_pods {
            if v != self.max_pods {
                return Err(Reply::arm_error(
                    400,
                    "PropertyChangeNotAllowed",
                    format!(
                        "Changing property 'maxPods' of agent pool '{}' from {} to {v} is not allowed.",
                        self.name, self.max_pods
                    ),
                ));
            }
        }
        Ok(())
    }

    /// AKS's own checks: a System pool keeps a node; the autoscaler needs a sane range.
    pub(crate) fn validate(&self) -> Result<(), Reply> {
        if self.mode == Mode::System && self.count < 1 {
            return Err(invalid(format!(
                "Agent pool '{}' is a System pool: its count must be between 1 and 1000, got {}.",
                self.name, self.count
            )));
        }
        if self.enable_auto_scaling {
            match (self.min_count, self.max_count) {
                (Some(min), Some(max)) if min <= max => {}
                (Some(min), Some(max)) => {
                    return Err(invalid(format!(
                        "Agent pool '{}': minCount {min} is greater than maxCount {max}.",
                        self.name
                    )))
                }
                _ => {
                    return Err(invalid(format!(
                        "Agent pool '{}': enableAutoScaling needs both minCount and maxCount.",
                        self.name
                    )))
                }
            }
        }
        Ok(())
    }

    /// `Updating` while a long-running operation on the pool runs, then `Succeeded` or `Failed`.
    pub fn state(&self, now: Instant) -> &'static str {
        if now < self.busy_until {
            "Updating"
        } else if self.failed {
            "Failed"
        } else {
            "Succeeded"
        }
    }

    /// The pool's `properties` object (also the body of a cluster's `agentPoolProfiles` entry,
    /// with `name` added).
    pub fn properties_json(&self, now: Instant) -> Value {
        let mut p = json!({
            "count": self.count,
            "vmSize": self.vm_size,
            "maxPods": self.max_pods,
            "osType": "Linux",
            "type": "VirtualMachineScaleSets",
            "mode": self.mode.as_str(),
            "enableAutoScaling": self.enable_auto_scaling,
            "nodeLabels": self.node_labels,
            "nodeTaints": self.node_taints,
            "tags": self.tags,
            "orchestratorVersion": self.orchestrator_version,
            "currentOrchestratorVersion": self.orchestrator_version,
            "provisioningState": self.state(now),
            "powerState": {"code": "Running"},
            "eTag": self.etag,
        });
        if let Some(v) = self.min_count {
            p["minCount"] = json!(v);
        }
        if let Some(v) = self.max_count {
            p["maxCount"] = json!(v);
        }
        if !self.availability_zones.is_empty() {
            p["availabilityZones"] = json!(self.availability_zones);
        }
        if let Some(v) = &self.priority {
            p["scaleSetPriority"] = json!(v);
            p["scaleSetEvictionPolicy"] =
                json!(self.eviction_policy.as_deref().unwrap_or("Delete"));
        }
        p
    }

    /// An entry of the cluster's `properties.agentPoolProfiles`.
    pub fn profile_json(&self, now: Instant) -> Value {
        let mut p = self.properties_json(now);
        p["name"] = json!(self.name);
        p
    }

    /// What changed between two versions, for the lost-update report.
    pub fn describe_change(old: &Pool, new: &Pool) -> String {
        let mut parts = Vec::new();
        if old.count != new.count {
            parts.push(format!(
                "pool {} count {} -> {}",
                new.name, old.count, new.count
            ));
        }
        if old.enable_auto_scaling != new.enable_auto_scaling {
            parts.push(format!(
                "pool {} enableAutoScaling {} -> {}",
                new.name, old.enable_auto_scaling, new.enable_auto_scaling
            ));
        }
        if old.tags != new.tags || old.node_labels != new.node_labels {
            parts.push(format!("pool {} tags or labels changed", new.name));
        }
        if parts.is_empty() {
            format!("pool {} updated", new.name)
        } else {
            parts.join(", ")
        }
    }
}
