//! The emulator's state: resources and their versions, the ETag rules, lost-update tracking, the
//! request log, faults, tokens. One `parking_lot` mutex guards it all; every method is synchronous
//! so tests and the `/_emulator/` routes share it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::aks::{AgentPoolView, Cluster, ClusterSeed, ClusterView};
use super::faults::{ActiveFault, FaultSpec};
use super::throttle::{AksLimits, Throttle, ThrottleLimits};
use super::EmulatorError;

/// How many request records the log keeps (oldest dropped first).
pub(crate) const MAX_LOG: usize = 200_000;
/// How many finished long-running operations are remembered.
const MAX_OPERATIONS: usize = 100_000;
/// Largest capacity a scale set accepts.
pub const MAX_CAPACITY: i64 = 1000;
/// Writer recorded for seeds and out-of-band deletes made without a writer.
pub(crate) const SEED_WRITER: &str = "seed";

/// Runtime settings chosen by the builder.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub lro_delay: Duration,
    pub page_size: usize,
    pub token_lifetime: Duration,
    pub throttling: Option<ThrottleLimits>,
    /// AKS's resource provider limits the emulator started with (`None`: not enforced); the
    /// control API can change them at run time ([`EmulatorState::set_aks_throttling`]).
    pub aks_throttling: Option<AksLimits>,
}

/// Handle on the emulator's state: cheap to clone, usable from tests and from the control API.
#[derive(Clone)]
pub struct EmulatorState {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub settings: Settings,
    pub base_url: String,
    pub data: Mutex<Data>,
}

/// A scale set to create (or replace) through [`EmulatorState::seed_scale_set`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScaleSetSeed {
    /// Subscription id.
    pub subscription: String,
    /// Resource group name.
    pub resource_group: String,
    /// Scale set name.
    pub name: String,
    /// Azure region, e.g. `westeurope`.
    #[serde(default = "default_location")]
    pub location: String,
    /// VM size, e.g. `Standard_D2s_v5`.
    #[serde(default = "default_sku")]
    pub sku_name: String,
    /// SKU tier, e.g. `Standard`.
    #[serde(default = "default_tier")]
    pub tier: String,
    /// Number of instances.
    pub capacity: i64,
    /// Resource tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Availability zones (`["1", "2", "3"]`); empty: regional. A new instance lands in the
    /// zone with the fewest, as Azure's best-effort balancing places it.
    #[serde(default)]
    pub zones: Vec<String>,
    /// `virtualMachineProfile.priority` (`Regular`, `Spot`, `Low`); absent: `Regular`.
    #[serde(default)]
    pub priority: Option<String>,
    /// `virtualMachineProfile.evictionPolicy` of a spot scale set (`Delete`, `Deallocate`).
    #[serde(default)]
    pub eviction_policy: Option<String>,
}

/// Where a scale set is when its seed names no location.
pub(crate) fn default_location() -> String {
    "westeurope".to_string()
}
fn default_sku() -> String {
    "Standard_D2s_v5".to_string()
}
fn default_tier() -> String {
    "Standard".to_string()
}

impl ScaleSetSeed {
    /// A seed in `westeurope`, `Standard_D2s_v5`, tier `Standard`, without tags.
    pub fn new(sub: &str, rg: &str, name: &str, capacity: i64) -> Self {
        ScaleSetSeed {
            subscription: sub.to_string(),
            resource_group: rg.to_string(),
            name: name.to_string(),
            location: default_location(),
            sku_name: default_sku(),
            tier: default_tier(),
            capacity,
            tags: BTreeMap::new(),
            zones: Vec::new(),
            priority: None,
            eviction_policy: None,
        }
    }
}

/// What a test sees of one scale set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleSetView {
    /// `sku.capacity`.
    pub capacity: i64,
    /// Current ETag, quoted (`"\"3\""`).
    pub etag: String,
    /// Resource tags.
    pub tags: BTreeMap<String, String>,
    /// `Updating` while a long-running operation runs, then `Succeeded` (or `Failed`).
    pub provisioning_state: String,
    /// Number of VM instances.
    pub instance_count: usize,
}

/// One request as the emulator answered it. `status` 0 means the connection was dropped without
/// an answer.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    /// Order of arrival, from 1.
    pub seq: u64,
    /// HTTP method.
    pub method: String,
    /// URL path, without the query.
    pub path: String,
    /// `If-Match` header as received.
    pub if_match: Option<String>,
    /// `If-None-Match` header as received.
    pub if_none_match: Option<String>,
    /// Status answered (0: connection dropped).
    pub status: u16,
    /// Subject (client id) of the bearer token, when valid.
    pub writer: Option<String>,
    /// `sku.capacity` (scale set) or `properties.count` (agent pool) of the request body.
    pub body_capacity: Option<i64>,
    /// `User-Agent` as received (the controller names its replica there).
    pub user_agent: Option<String>,
    /// When it arrived (tokio's clock: a test on a paused clock compares these).
    #[serde(skip)]
    pub at: Instant,
    /// The ARM error it was refused with, `(code, message)`; for a write accepted whose
    /// long-running operation will end `Failed`, the error that operation reports.
    pub error: Option<(String, String)>,
}

/// Instances deleted by name (VMSS `delete`, AKS `deleteMachines`), as accepted.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceDeletion {
    /// Sequence number of the request.
    pub seq: u64,
    /// Who deleted them.
    pub writer: String,
    /// The scale set they were in (for an agent pool, its backing scale set).
    pub scale_set: String,
    /// The agent pool, for a `deleteMachines`.
    pub pool: Option<String>,
    /// The deleted instances' machine names: the names their Nodes have in the cluster
    /// simulation.
    pub machines: Vec<String>,
    /// The capacity (an agent pool's `count`) right after the deletion.
    pub capacity_after: i64,
}

/// A new version of a resource, whoever made it (a client's write, a rival's, AKS reconciling a
/// pool's scale set, a spot eviction): the journal the demo's report draws its marks from.
#[derive(Clone, Debug, Serialize)]
pub struct ChangeRecord {
    /// Lowercased ARM id of the resource.
    pub resource: String,
    /// Who made it (a client id, or the emulator's own writers: `aks`, `azure-spot-eviction`).
    pub writer: String,
    /// What changed, e.g. `capacity 3 -> 7`.
    pub change: String,
}

/// A write that replaced a version its writer had never been shown.
#[derive(Clone, Debug, Serialize)]
pub struct LostUpdate {
    /// ARM id of the resource.
    pub resource: String,
    /// Who wrote blind.
    pub writer: String,
    /// The ETag of the version that was destroyed.
    pub replaced_etag: String,
    /// Who wrote the destroyed version.
    pub replaced_writer: String,
    /// What the destroyed version had changed, e.g. `capacity 3 -> 7`.
    pub replaced_change: String,
    /// Sequence number of the request that destroyed it.
    pub at_seq: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct VersionInfo {
    pub writer: String,
    pub change: String,
}

#[derive(Clone, Debug)]
pub(crate) struct TokenInfo {
    pub subject: String,
    pub expires_at: Instant,
}

#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub ready_at: Instant,
    pub vm_id: String,
    pub time_created: String,
    /// The availability zone it was placed in (`None`: a regional scale set).
    pub zone: Option<String>,
    /// Stopped and deallocated (a spot VM evicted with policy `Deallocate`): still listed and
    /// counted in the capacity, running nothing.
    pub deallocated: bool,
    /// Created by an operation that failed (an allocation Azure refused part-way): listed
    /// `Failed` once its creation is over, until deleted; a later write does not mend it.
    pub failed: bool,
    /// A provisioning state forced through the control API (`Failed` or `Updating`): listed
    /// instead of the one its operations left, until lifted or the instance is deleted.
    pub stuck: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub(crate) struct ScaleSet {
    pub sub: String,
    pub rg: String,
    pub name: String,
    pub location: String,
    pub sku_name: String,
    pub tier: String,
    pub capacity: i64,
    pub tags: BTreeMap<String, String>,
    pub version: u64,
    pub unique_id: String,
    pub time_created: String,
    pub busy_until: Instant,
    pub failed: bool,
    pub instances: BTreeMap<u64, Instance>,
    pub next_instance: u64,
    pub zones: Vec<String>,
    pub priority: Option<String>,
    pub eviction_policy: Option<String>,
}

impl ScaleSet {
    /// Spot (or the older `Low`) priority: its vCPUs count against the low-priority quota.
    pub fn spot(&self) -> bool {
        self.priority
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("spot") || p.eq_ignore_ascii_case("low"))
    }

    /// The zone instance `id` is in, if the scale set is zonal.
    pub fn zone_of(&self, id: u64) -> Option<&str> {
        self.instances.get(&id).and_then(|i| i.zone.as_deref())
    }

    /// Instances per zone, in the order of `zones`.
    fn per_zone(&self) -> Vec<(String, usize)> {
        self.zones
            .iter()
            .map(|z| {
                let n = self
                    .instances
                    .values()
                    .filter(|i| i.zone.as_deref() == Some(z.as_str()))
                    .count();
                (z.clone(), n)
            })
            .collect()
    }

    /// Where a new instance goes: the zone with the fewest (the first of them in `zones`), as
    /// Azure's best-effort zone balancing places it.
    fn next_zone(&self) -> Option<String> {
        self.per_zone()
            .into_iter()
            .min_by_key(|(_, n)| *n)
            .map(|(z, _)| z)
    }

    /// Which instance a scale-in removes: of the zones with the most instances, the newest
    /// instance (the highest id), as Azure's `Default` scale-in policy does; a regional set's
    /// newest.
    fn scale_in_victim(&self) -> Option<u64> {
        let per_zone = self.per_zone();
        let most = per_zone.iter().map(|(_, n)| *n).max();
        match most {
            Some(most) => {
                let busiest: Vec<&str> = per_zone
                    .iter()
                    .filter(|(_, n)| *n == most)
                    .map(|(z, _)| z.as_str())
                    .collect();
                self.instances
                    .iter()
                    .rev()
                    .find(|(_, i)| i.zone.as_deref().is_some_and(|z| busiest.contains(&z)))
                    .map(|(id, _)| *id)
                    .or_else(|| self.instances.keys().next_back().copied())
            }
            None => self.instances.keys().next_back().copied(),
        }
    }

    pub fn id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{}",
            self.sub, self.rg, self.name
        )
    }

    pub fn etag(&self) -> String {
        format!("\"{}\"", self.version)
    }

    pub fn provisioning_state(&self, now: Instant) -> &'static str {
        if now < self.busy_until {
            "Updating"
        } else if self.failed {
            "Failed"
        } else {
            "Succeeded"
        }
    }

    /// Adds instances (ready at `ready_at`, each in the zone with the fewest) or removes
    /// instances as Azure's default scale-in policy chooses them, to match `capacity`.
    pub fn resize(&mut self, capacity: i64, ready_at: Instant) {
        let target = usize::try_from(capacity.max(0)).unwrap_or(0);
        while self.instances.len() > target {
            match self.scale_in_victim() {
                Some(id) => {
                    self.instances.remove(&id);
                }
                None => break,
            }
        }
        let created = if self.instances.len() < target {
            now_rfc3339()
        } else {
            String::new()
        };
        while self.instances.len() < target {
            let id = self.next_instance;
            self.next_instance += 1;
            let zone = self.next_zone();
            self.instances.insert(
                id,
                Instance {
                    ready_at,
                    vm_id: new_uuid(),
                    time_created: created.clone(),
                    zone,
                    deallocated: false,
                    failed: self.failed,
                    stuck: None,
                },
            );
        }
        self.capacity = capacity;
    }

    pub fn to_json(&self, now: Instant) -> Value {
        let mut v = json!({
            "name": self.name,
            "id": self.id(),
            "type": "Microsoft.Compute/virtualMachineScaleSets",
            "location": self.location,
            "tags": self.tags,
            "sku": {"name": self.sku_name, "tier": self.tier, "capacity": self.capacity},
            "etag": self.etag(),
            "properties": {
                "provisioningState": self.provisioning_state(now),
                "uniqueId": self.unique_id,
                "timeCreated": self.time_created,
                "orchestrationMode": "Uniform",
                "upgradePolicy": {"mode": "Manual"},
                "singlePlacementGroup": false,
            },
        });
        if !self.zones.is_empty() {
            v["zones"] = json!(self.zones);
        }
        if let Some(p) = &self.priority {
            let mut profile = json!({"priority": p});
            if let Some(e) = &self.eviction_policy {
                profile["evictionPolicy"] = json!(e);
            }
            v["properties"]["virtualMachineProfile"] = profile;
        }
        v
    }

    /// One VM of the scale set as a list shows it; with `instance_view` (`$expand=instanceView`)
    /// its provisioning and power state codes too.
    pub fn instance_json(
        &self,
        id: u64,
        inst: &Instance,
        now: Instant,
        instance_view: bool,
    ) -> Value {
        let creating = now < inst.ready_at;
        let state = if let Some(stuck) = inst.stuck {
            stuck
        } else if creating {
            "Creating"
        } else if inst.failed {
            "Failed"
        } else {
            "Succeeded"
        };
        let mut v = json!({
            "name": format!("{}_{}", self.name, id),
            "id": format!("{}/virtualMachines/{}", self.id(), id),
            "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
            "location": self.location,
            "instanceId": id.to_string(),
            "sku": {"name": self.sku_name, "tier": self.tier},
            "etag": "\"1\"",
            "properties": {
                "latestModelApplied": true,
                "provisioningState": state,
                "vmId": inst.vm_id,
                "timeCreated": inst.time_created,
                // What a VMSS names its VMs (prefix + base-36 id), and the Node registers as.
                "osProfile": {"computerName": crate::sim::nodes::node_name(&self.name, id)},
            },
        });
        if let Some(z) = self.zone_of(id) {
            v["zones"] = json!([z]);
        }
        if instance_view {
            let power = if inst.deallocated {
                "deallocated"
            } else if creating {
                "starting"
            } else {
                "running"
            };
            v["properties"]["instanceView"] = json!({"statuses": [
                {"code": format!("ProvisioningState/{}", state.to_ascii_lowercase()), "level": "Info"},
                {"code": format!("PowerState/{power}"), "level": "Info"},
            ]});
        }
        v
    }

    pub fn view(&self, now: Instant) -> ScaleSetView {
        ScaleSetView {
            capacity: self.capacity,
            etag: self.etag(),
            tags: self.tags.clone(),
            provisioning_state: self.provisioning_state(now).to_string(),
            instance_count: self.instances.len(),
        }
    }
}

/// A long-running operation, as its status URL reports it.
#[derive(Clone, Debug)]
pub(crate) struct Operation {
    pub done_at: Instant,
    pub failed: bool,
    /// The error a failed operation reports: `(code, message)`; `None`: a generic one.
    pub error: Option<(String, String)>,
    pub start: time::OffsetDateTime,
    pub delay: Duration,
}

/// Everything behind the mutex.
#[derive(Default)]
pub(crate) struct Data {
    pub scale_sets: HashMap<String, ScaleSet>,
    pub clusters: HashMap<String, Cluster>,
    pub last_version: HashMap<String, u64>,
    pub operations: HashMap<String, Operation>,
    op_order: VecDeque<String>,
    pub versions: HashMap<(String, String), VersionInfo>,
    pub seen: HashMap<String, HashSet<(String, String)>>,
    pub lost: Vec<LostUpdate>,
    pub deletions: Vec<InstanceDeletion>,
    pub log: VecDeque<RequestRecord>,
    /// Records that fell off the front of `log`.
    pub log_dropped: u64,
    /// Every write, once (at the resource it addressed), oldest first; `journal_dropped` older ones fell off the front.
    pub journal: VecDeque<ChangeRecord>,
    pub journal_dropped: u64,
    pub seq: u64,
    pub faults: Vec<ActiveFault>,
    pub next_fault_id: u64,
    pub clients: HashMap<String, String>,
    pub tokens: HashMap<String, TokenInfo>,
    pub token_down: bool,
    pub assertions: Vec<String>,
    pub throttle: Throttle,
    pub quota: super::quota::QuotaTable,
    /// The retail prices API's meters and page size.
    pub retail_prices: super::retail_prices::Catalogue,
    /// How each scale set's new Nodes register beyond its tags, by [`vmss_key`].
    pub node_registrations: HashMap<String, super::registration::NodeRegistration>,
}

/// Lowercased ARM id of a scale set: the key of the maps and of version tracking.
pub(crate) fn vmss_key(sub: &str, rg: &str, name: &str) -> String {
    format!(
        "/subscriptions/{sub}/resourcegroups/{rg}/providers/microsoft.compute/virtualmachinescalesets/{name}"
    )
    .to_ascii_lowercase()
}

/// A random (version 4) UUID from the thread-local generator: no system call per id.
pub(crate) fn new_uuid() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

/// Wall-clock time in RFC 3339 with an explicit `+00:00` offset, as ARM writes it.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

pub(crate) fn rfc3339(t: time::OffsetDateTime) -> String {
    let s = t
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string());
    match s.strip_suffix('Z') {
        Some(stem) => format!("{stem}+00:00"),
        None => s,
    }
}

/// Describes what a write changed, for the lost-update report.
pub(crate) fn describe_change(
    old: Option<(i64, &BTreeMap<String, String>)>,
    new_capacity: i64,
    new_tags: &BTreeMap<String, String>,
) -> String {
    match old {
        None => format!("created with capacity {new_capacity}"),
        Some((cap, tags)) => {
            let mut parts = Vec::new();
            if cap != new_capacity {
                parts.push(format!("capacity {cap} -> {new_capacity}"));
            }
            if tags != new_tags {
                parts.push("tags changed".to_string());
            }
            if parts.is_empty() {
                "no change".to_string()
            } else {
                parts.join(", ")
            }
        }
    }
}

impl Data {
    /// Next version number of a resource; never reused for the same id, even across deletes.
    pub fn next_version(&mut self, key: &str) -> u64 {
        let v = self.last_version.entry(key.to_string()).or_insert(0);
        *v += 1;
        *v
    }

    pub fn record_version(&mut self, key: &str, etag: &str, writer: &str, change: String) {
        self.journal_change(key, writer, &change);
        self.remember_version(key, etag, writer, change);
    }

    /// Records the version a write made of `key` without a journal entry of its own: the other
    /// resources one write changes (a managed cluster's PUT gives every pool a new version too,
    /// and the journal holds the write once, at the cluster).
    pub fn remember_version(&mut self, key: &str, etag: &str, writer: &str, change: String) {
        self.versions.insert(
            (key.to_string(), etag.to_string()),
            VersionInfo {
                writer: writer.to_string(),
                change,
            },
        );
    }

    fn journal_change(&mut self, key: &str, writer: &str, change: &str) {
        if self.journal.len() >= MAX_LOG {
            self.journal.pop_front();
            self.journal_dropped += 1;
        }
        self.journal.push_back(ChangeRecord {
            resource: key.to_string(),
            writer: writer.to_string(),
            change: change.to_string(),
        });
    }

    pub fn mark_seen(&mut self, writer: &str, key: &str, etag: &str) {
        self.seen
            .entry(writer.to_string())
            .or_default()
            .insert((key.to_string(), etag.to_string()));
    }

    /// Records a lost update when `writer` replaces version `etag` without having been shown it.
    /// A write whose If-Match names that very ETag proves the writer knew it.
    pub fn check_lost(
        &mut self,
        writer: &str,
        key: &str,
        display_id: &str,
        etag: &str,
        seq: u64,
        if_match: Option<&str>,
    ) {
        if if_match.is_some_and(|v| super::scale_sets::etags_match(v, etag)) {
            return;
        }
        let pair = (key.to_string(), etag.to_string());
        let seen = self.seen.get(writer).is_some_and(|s| s.contains(&pair));
        if seen {
            return;
        }
        let info = self.versions.get(&pair).cloned().unwrap_or(VersionInfo {
            writer: "unknown".to_string(),
            change: "unknown".to_string(),
        });
        self.lost.push(LostUpdate {
            resource: display_id.to_string(),
            writer: writer.to_string(),
            replaced_etag: etag.to_string(),
            replaced_writer: info.writer,
            replaced_change: info.change,
            at_seq: seq,
        });
    }

    pub fn log(&mut self, rec: RequestRecord) {
        if self.log.len() >= MAX_LOG {
            self.log.pop_front();
            self.log_dropped += 1;
        }
        self.log.push_back(rec);
    }

    /// Registers a long-running operation and returns its id.
    pub fn start_operation(&mut self, delay: Duration, failed: bool, now: Instant) -> String {
        let id = new_uuid();
        let op = Operation {
            done_at: now + delay,
            failed,
            error: None,
            start: time::OffsetDateTime::now_utc(),
            delay,
        };
        if self.op_order.len() >= MAX_OPERATIONS {
            if let Some(old) = self.op_order.pop_front() {
                self.operations.remove(&old);
            }
        }
        self.op_order.push_back(id.clone());
        self.operations.insert(id.clone(), op);
        id
    }

    /// Creates or replaces a scale set from a seed.
    pub fn seed(&mut self, seed: ScaleSetSeed, now: Instant) -> String {
        self.create_scale_set(seed, SEED_WRITER, now, false)
    }

    /// Creates (or replaces) a scale set written by `writer`, busy until `busy_until`.
    pub fn create_scale_set(
        &mut self,
        seed: ScaleSetSeed,
        writer: &str,
        busy_until: Instant,
        failed: bool,
    ) -> String {
        let key = vmss_key(&seed.subscription, &seed.resource_group, &seed.name);
        let version = self.next_version(&key);
        let mut ss = ScaleSet {
            sub: seed.subscription,
            rg: seed.resource_group,
            name: seed.name,
            location: seed.location,
            sku_name: seed.sku_name,
            tier: seed.tier,
            capacity: 0,
            tags: seed.tags,
            version,
            unique_id: new_uuid(),
            time_created: now_rfc3339(),
            busy_until,
            failed,
            instances: BTreeMap::new(),
            next_instance: 0,
            zones: seed.zones,
            priority: seed.priority,
            eviction_policy: seed.eviction_policy,
        };
        ss.resize(seed.capacity, busy_until);
        let etag = ss.etag();
        let change = describe_change(None, ss.capacity, &ss.tags);
        self.record_version(&key, &etag, writer, change);
        self.scale_sets.insert(key, ss);
        etag
    }

    /// Out-of-band read-modify-write by a rival writer: never a lost update itself.
    #[allow(clippy::too_many_arguments)]
    pub fn rival_write(
        &mut self,
        sub: &str,
        rg: &str,
        name: &str,
        writer: &str,
        capacity: Option<i64>,
        tags: Option<BTreeMap<String, String>>,
        settings: &Settings,
        now: Instant,
    ) -> Result<String, EmulatorError> {
        if let Some(c) = capacity {
            if !(0..=MAX_CAPACITY).contains(&c) {
                return Err(EmulatorError::InvalidCapacity { capacity: c });
            }
        }
        let key = vmss_key(sub, rg, name);
        let Some(ss) = self.scale_sets.get_mut(&key) else {
            return Err(EmulatorError::NotFound {
                resource: format!("{sub}/{rg}/{name}"),
            });
        };
        let old_etag = ss.etag();
        let old_cap = ss.capacity;
        let old_tags = ss.tags.clone();
        let new_cap = capacity.unwrap_or(old_cap);
        if let Some(t) = tags {
            ss.tags.extend(t);
        }
        let busy_until = now + settings.lro_delay;
        ss.busy_until = busy_until;
        ss.failed = false;
        ss.resize(new_cap, busy_until);
        let change = describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags);
        let version = self.next_version(&key);
        let ss = self
            .scale_sets
            .get_mut(&key)
            .expect("scale set looked up above under the same lock");
        ss.version = version;
        let etag = ss.etag();
        self.mark_seen(writer, &key, &old_etag);
        self.record_version(&key, &etag, writer, change);
        self.mark_seen(writer, &key, &etag);
        Ok(etag)
    }

    /// Removes a scale set without any request; true when it existed.
    pub fn delete_scale_set(&mut self, sub: &str, rg: &str, name: &str) -> bool {
        self.scale_sets.remove(&vmss_key(sub, rg, name)).is_some()
    }

    /// Clears everything but issued tokens (which stay valid).
    pub fn reset(&mut self) {
        let tokens = std::mem::take(&mut self.tokens);
        *self = Data {
            tokens,
            ..Data::default()
        };
    }
}

impl std::fmt::Debug for EmulatorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorState")
            .field("base_url", &self.shared.base_url)
            .finish_non_exhaustive()
    }
}

impl EmulatorState {
    pub(crate) fn new(settings: Settings, base_url: String) -> Self {
        EmulatorState {
            shared: Arc::new(Shared {
                settings,
                base_url,
                data: Mutex::new(Data::default()),
            }),
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.shared.base_url
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Data> {
        self.shared.data.lock()
    }

    /// Forgets every resource, fault, log entry, registered client and lost update; issued tokens
    /// stay valid.
    pub fn reset(&self) {
        self.lock().reset();
    }

    /// Turns AKS's resource-provider throttling on with `limits`, or off with `None`, until a
    /// [`EmulatorState::reset`] (which returns to the limits the emulator started with). AKS's
    /// buckets start full.
    pub fn set_aks_throttling(&self, limits: Option<AksLimits>) {
        self.lock().throttle.set_aks_limits(limits);
    }

    /// AKS's resource-provider limits in force (`None`: not enforced).
    pub fn aks_throttling(&self) -> Option<AksLimits> {
        let started = self.settings().aks_throttling;
        self.lock().throttle.aks_limits(started)
    }

    /// The meters the retail prices API (`GET /api/retail/prices`) serves, in the API's item
    /// shape (`armSkuName`, `armRegionName`, `skuName`, `retailPrice`, ...), in order.
    pub fn set_retail_prices(&self, items: Vec<serde_json::Value>) {
        self.lock().retail_prices.items = items;
    }

    /// Items per page of the retail prices API (the real API's 100 by default); at least 1.
    pub fn set_retail_price_page_size(&self, n: usize) {
        self.lock().retail_prices.page_size = n.max(1);
    }

    /// Sets the vCPU quota limit of usage `name` (a VM family such as `standardDSv5Family`, or
    /// `cores` for the regional total) in `sub`'s `location`: writes that would grow past it are
    /// refused with Azure's 409 `OperationNotAllowed`, and the usages list shows it. Survives
    /// nothing: [`EmulatorState::reset`] forgets it.
    pub fn set_quota(&self, sub: &str, location: &str, name: &str, limit: i64) {
        self.lock().quota.set(sub, location, name, limit);
    }

    /// Azure evicts `count` instances of spot scale set `name` (the oldest running first), as it
    /// does when it needs the capacity back. With eviction policy `Delete` (the default here) the
    /// VMs are deleted and the capacity drops: a new version by writer `azure-spot-eviction`,
    /// never a lost update. With `Deallocate` they are stopped and stay: the capacity, the
    /// scale set's version and the quota they use are unchanged, their power state says
    /// `deallocated` and their Nodes turn NotReady. Returns the instance ids evicted.
    pub fn evict_spot(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        count: usize,
    ) -> Result<Vec<u64>, EmulatorError> {
        let mut d = self.lock();
        let key = vmss_key(sub, rg, name);
        let Some(ss) = d.scale_sets.get_mut(&key) else {
            return Err(EmulatorError::NotFound {
                resource: format!("{sub}/{rg}/{name}"),
            });
        };
        if !ss.spot() {
            return Err(EmulatorError::Eviction(format!(
                "{name} is not a spot scale set: Azure evicts only spot VMs"
            )));
        }
        let ids: std::collections::BTreeSet<u64> = ss
            .instances
            .iter()
            .filter(|(_, i)| !i.deallocated)
            .map(|(id, _)| *id)
            .take(count)
            .collect();
        if ss
            .eviction_policy
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("deallocate"))
        {
            for id in &ids {
                if let Some(i) = ss.instances.get_mut(id) {
                    i.deallocated = true;
                }
            }
            return Ok(ids.into_iter().collect());
        }
        let (old_cap, old_tags) = (ss.capacity, ss.tags.clone());
        super::scale_sets::remove_instances(ss, &ids);
        let change = describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags);
        let version = d.next_version(&key);
        if let Some(ss) = d.scale_sets.get_mut(&key) {
            ss.version = version;
            let etag = ss.etag();
            d.record_version(&key, &etag, "azure-spot-eviction", change);
        }
        Ok(ids.into_iter().collect())
    }

    /// The eviction policy of spot scale set `name` (`Delete` when it names none, as Azure's
    /// default), if it exists.
    pub fn eviction_policy(&self, sub: &str, rg: &str, name: &str) -> Option<String> {
        let d = self.lock();
        let ss = d.scale_sets.get(&vmss_key(sub, rg, name))?;
        Some(
            ss.eviction_policy
                .clone()
                .unwrap_or_else(|| "Delete".to_string()),
        )
    }

    /// The compute usages of `sub` in `location`, as `GET .../locations/{location}/usages`
    /// lists them (`[{"name": {"value", "localizedValue"}, "currentValue", "limit", "unit"}]`).
    pub fn usages(&self, sub: &str, location: &str) -> Vec<Value> {
        let d = self.lock();
        d.quota.usages(d.scale_sets.values(), sub, location)
    }

    /// Forces instance `id` of scale set `name` to list provisioning state `state` (`Failed` or
    /// `Updating`, as a VM stuck there), or with `None` lifts it (the instance lists what its
    /// operations left again). The Node, the capacity and the ETag are untouched. Returns the
    /// state the instance now lists.
    pub fn set_instance_state(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        id: u64,
        state: Option<&'static str>,
    ) -> Result<String, EmulatorError> {
        let now = Instant::now();
        let mut d = self.lock();
        let Some(ss) = d.scale_sets.get_mut(&vmss_key(sub, rg, name)) else {
            return Err(EmulatorError::NotFound {
                resource: format!("{sub}/{rg}/{name}"),
            });
        };
        let Some(inst) = ss.instances.get_mut(&id) else {
            return Err(EmulatorError::InstanceNotFound {
                resource: format!("{sub}/{rg}/{name}/virtualMachines/{id}"),
            });
        };
        inst.stuck = state;
        let inst = inst.clone();
        let listed = ss.instance_json(id, &inst, now, false);
        Ok(listed["properties"]["provisioningState"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Mints a valid bearer token whose subject (the writer in the log) is `client_id`.
    pub fn issue_token(&self, client_id: &str) -> String {
        let token = format!("emu.{}", new_uuid().replace('-', ""));
        let expires_at = Instant::now() + self.settings().token_lifetime;
        self.lock().tokens.insert(
            token.clone(),
            TokenInfo {
                subject: client_id.to_string(),
                expires_at,
            },
        );
        token
    }

    /// Creates or replaces a scale set; returns its ETag.
    pub fn seed_scale_set(&self, seed: ScaleSetSeed) -> String {
        self.lock().seed(seed, Instant::now())
    }

    /// The current state of one scale set, if it exists.
    pub fn scale_set(&self, sub: &str, rg: &str, name: &str) -> Option<ScaleSetView> {
        let now = Instant::now();
        self.lock()
            .scale_sets
            .get(&vmss_key(sub, rg, name))
            .map(|ss| ss.view(now))
    }

    /// An out-of-band ARM request by rival `writer` (say `PUT` of an agent pool or `PATCH` of a
    /// managed cluster, `path` as on the wire): answered like a real request but never faulted,
    /// throttled or logged. Returns the status and the JSON body.
    pub fn rival_request(
        &self,
        writer: &str,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
    ) -> (u16, serde_json::Value) {
        super::scale_sets::rival_request(self, writer, method, path, body, if_match)
    }

    /// The count of agent pool `pool` of managed cluster `cluster`, if both exist.
    pub fn agent_pool_count(&self, sub: &str, rg: &str, cluster: &str, pool: &str) -> Option<i64> {
        let d = self.lock();
        let c = d.clusters.values().find(|c| {
            c.sub.eq_ignore_ascii_case(sub)
                && c.rg.eq_ignore_ascii_case(rg)
                && c.name.eq_ignore_ascii_case(cluster)
        })?;
        c.pools
            .values()
            .find(|p| p.name.eq_ignore_ascii_case(pool))
            .map(|p| p.count)
    }

    /// A rival writer sets the capacity out of band; returns the new ETag.
    pub fn rival_set_capacity(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        capacity: i64,
        writer: &str,
    ) -> Result<String, EmulatorError> {
        let settings = self.settings().clone();
        self.lock().rival_write(
            sub,
            rg,
            name,
            writer,
            Some(capacity),
            None,
            &settings,
            Instant::now(),
        )
    }

    /// A rival writer merges these tags in out of band; returns the new ETag.
    pub fn rival_set_tags(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        tags: BTreeMap<String, String>,
        writer: &str,
    ) -> Result<String, EmulatorError> {
        let settings = self.settings().clone();
        self.lock().rival_write(
            sub,
            rg,
            name,
            writer,
            None,
            Some(tags),
            &settings,
            Instant::now(),
        )
    }

    /// Marks instance `id` of scale set `name` `Failed` (or healthy again) out of band, as a VM
    /// Azure could not update or delete is listed; false when there is no such instance.
    pub fn set_instance_failed(
        &self,
        sub: &str,
        rg: &str,
        name: &str,
        id: u64,
        failed: bool,
    ) -> bool {
        let mut d = self.lock();
        let key = vmss_key(sub, rg, name);
        match d
            .scale_sets
            .get_mut(&key)
            .and_then(|ss| ss.instances.get_mut(&id))
        {
            Some(i) => {
                i.failed = failed;
                true
            }
            None => false,
        }
    }

    /// Deletes a scale set out of band; true when it existed.
    pub fn delete_out_of_band(&self, sub: &str, rg: &str, name: &str) -> bool {
        self.lock().delete_scale_set(sub, rg, name)
    }

    /// Creates or replaces a managed cluster with its agent pools, each backed by a scale set in
    /// the node resource group; returns the cluster's ETag.
    pub fn seed_cluster(&self, seed: ClusterSeed) -> Result<String, EmulatorError> {
        self.lock().seed_cluster(seed, Instant::now())
    }

    /// The current state of one managed cluster, if it exists.
    pub fn cluster(&self, sub: &str, rg: &str, name: &str) -> Option<ClusterView> {
        self.lock().cluster_view(sub, rg, name)
    }

    /// The current state of one agent pool, if it exists.
    pub fn agent_pool(
        &self,
        sub: &str,
        rg: &str,
        cluster: &str,
        pool: &str,
    ) -> Option<AgentPoolView> {
        self.lock()
            .agent_pool_view(sub, rg, cluster, pool, Instant::now())
    }

    /// A rival makes a cluster-level write (merges `tags` into the managed cluster's tags, as a
    /// portal edit or an upgrade would touch the cluster): the cluster's ETag and every agent
    /// pool's ETag change, so any pool write holding an older pool ETag gets 412. Returns the
    /// cluster's new ETag.
    pub fn rival_cluster_write(
        &self,
        sub: &str,
        rg: &str,
        cluster: &str,
        tags: BTreeMap<String, String>,
        writer: &str,
    ) -> Result<String, EmulatorError> {
        let busy_until = Instant::now() + self.settings().lro_delay;
        self.lock()
            .rival_cluster_write(sub, rg, cluster, tags, writer, busy_until)
    }

    /// A rival sets an agent pool's `count` out of band (a pool-level write: only that pool's
    /// ETag changes, and its scale set follows). Returns the pool's new ETag.
    pub fn rival_set_pool_count(
        &self,
        sub: &str,
        rg: &str,
        cluster: &str,
        pool: &str,
        count: i64,
        writer: &str,
    ) -> Result<String, EmulatorError> {
        let busy_until = Instant::now() + self.settings().lro_delay;
        self.lock()
            .rival_set_pool_count(sub, rg, cluster, pool, count, writer, busy_until)
    }

    /// Deletes an agent pool and its scale set out of band; true when it existed.
    pub fn delete_agent_pool_out_of_band(
        &self,
        sub: &str,
        rg: &str,
        cluster: &str,
        pool: &str,
    ) -> bool {
        super::aks::delete_pool_out_of_band(&mut self.lock(), sub, rg, cluster, pool)
    }

    /// Adds a fault; returns its id.
    pub fn inject_fault(&self, fault: FaultSpec) -> u64 {
        let mut d = self.lock();
        d.next_fault_id += 1;
        let id = d.next_fault_id;
        d.faults.push(ActiveFault::new(fault));
        id
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The request log, oldest first (the last 200,000 requests).
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.lock().log.iter().cloned().collect()
    }

    /// Every accepted deletion of named instances, oldest first.
    pub fn instance_deletions(&self) -> Vec<InstanceDeletion> {
        self.lock().deletions.clone()
    }

    /// The writes journaled since `cursor` (0: since the start), and the cursor to pass next.
    pub fn changes_since(&self, cursor: u64) -> (Vec<ChangeRecord>, u64) {
        let d = self.lock();
        let end = d.journal_dropped + d.journal.len() as u64;
        // A cursor past the end means the journal was reset since: read it from its start.
        let cursor = if cursor > end { 0 } else { cursor };
        let skip = cursor.saturating_sub(d.journal_dropped) as usize;
        (d.journal.iter().skip(skip).cloned().collect(), end)
    }

    /// The requests logged since `cursor` (0: every one still in the log), in the order their
    /// answers were logged, and the cursor to pass next. (Sequence numbers are given when a
    /// request arrives and records are logged when it is answered, so they are not in order.)
    pub fn requests_since(&self, cursor: u64) -> (Vec<RequestRecord>, u64) {
        let d = self.lock();
        let end = d.log_dropped + d.log.len() as u64;
        // A cursor past the end means the log was reset since: read it from its start.
        let cursor = if cursor > end { 0 } else { cursor };
        let skip = cursor.saturating_sub(d.log_dropped) as usize;
        (d.log.iter().skip(skip).cloned().collect(), end)
    }

    /// Every lost update detected so far.
    pub fn lost_updates(&self) -> Vec<LostUpdate> {
        self.lock().lost.clone()
    }

    /// Registers a client id and secret; from then on client-secret grants must match one.
    pub fn register_client(&self, client_id: &str, secret: &str) {
        self.lock()
            .clients
            .insert(client_id.to_string(), secret.to_string());
    }

    /// While down, the token and IMDS endpoints answer 503.
    pub fn set_token_endpoint_down(&self, down: bool) {
        self.lock().token_down = down;
    }

    /// `client_assertion` values received by the token endpoint, in order.
    pub fn federated_assertions_seen(&self) -> Vec<String> {
        self.lock().assertions.clone()
    }
}

#[cfg(test)]
mod zone_tests {
    use super::*;

    fn zonal(capacity: i64) -> ScaleSet {
        let mut d = Data::default();
        let mut seed = ScaleSetSeed::new("sub", "rg", "z", 0);
        seed.zones = vec!["1".into(), "2".into(), "3".into()];
        d.create_scale_set(seed, "test", Instant::now(), false);
        let mut ss = d.scale_sets.values().next().expect("created").clone();
        ss.resize(capacity, Instant::now());
        ss
    }

    fn counts(ss: &ScaleSet) -> Vec<usize> {
        ss.per_zone().into_iter().map(|(_, n)| n).collect()
    }

    #[test]
    fn new_instances_go_to_the_zone_with_the_fewest_even_after_a_delete_by_id() {
        let mut ss = zonal(3);
        assert_eq!(counts(&ss), [1, 1, 1]);
        assert_eq!(ss.zone_of(0), Some("1"));
        // The zone-2 instance is deleted by id: the next one fills zone 2, not zone 1.
        let in_two = *ss
            .instances
            .iter()
            .find(|(_, i)| i.zone.as_deref() == Some("2"))
            .expect("one in zone 2")
            .0;
        ss.instances.remove(&in_two);
        ss.resize(3, Instant::now());
        assert_eq!(counts(&ss), [1, 1, 1]);
        assert_eq!(ss.zone_of(3), Some("2"));
        ss.resize(8, Instant::now());
        assert_eq!(counts(&ss), [3, 3, 2]);
    }

    #[test]
    fn scale_in_takes_the_newest_instance_of_the_busiest_zone() {
        let mut ss = zonal(6);
        // Zone 1 loses both of its instances by id: [0, 2, 2]; scaling in to 2 takes one from
        // zone 2 and one from zone 3.
        let zone_one: Vec<u64> = ss
            .instances
            .iter()
            .filter(|(_, i)| i.zone.as_deref() == Some("1"))
            .map(|(id, _)| *id)
            .collect();
        for id in zone_one {
            ss.instances.remove(&id);
        }
        ss.resize(2, Instant::now());
        assert_eq!(counts(&ss), [0, 1, 1]);
        // Of equals, the newest goes.
        let mut ss = zonal(3);
        ss.resize(2, Instant::now());
        assert_eq!(ss.instances.keys().copied().collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_regional_scale_sets_instances_have_no_zone() {
        let mut d = Data::default();
        d.create_scale_set(
            ScaleSetSeed::new("sub", "rg", "r", 2),
            "test",
            Instant::now(),
            false,
        );
        let ss = d.scale_sets.values().next().expect("created");
        assert!(ss.instances.values().all(|i| i.zone.is_none()));
        assert_eq!(ss.zone_of(0), None);
    }
}
