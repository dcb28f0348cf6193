//! Node groups as the read side: which groups there are (configured and discovered), what
//! Azure last said of each (the scale-set cache, sizes, instances), their floors, the refusal a
//! read carries, Azure's capacity (the vCPU quota as read, the offerings it refused lately:
//! [`crate::capacity`]), what was observed of each group ([`Observed`]: the ETag known, foreign
//! writes, the last write and 412, the target, the held reason, the write backoff), its one
//! [`Health`] every decision asks ([`NodeGroups::health`]), and which nodes are whose
//! ([`GroupIndex`]).
//!
//! Both loops and the reconciler read node groups here; nothing here writes to Azure. The
//! writer reports the outcomes of its writes here ([`NodeGroups::saw_etag`],
//! [`NodeGroups::wrote`], [`NodeGroups::conflicted`], [`NodeGroups::write_held`],
//! [`NodeGroups::set_write_backoff`], ...); what only writing needs (in flight, the write
//! budget's token bucket, the backoff's attempts, a 429's turn) stays with the reconciler.

pub mod ca_status;
mod health;
mod matching;
mod status;

pub use health::{Health, Observed, Unhealthy};
pub use status::rfc3339;

pub use matching::{
    backing, is_ready, is_starting, parse_provider_id, registered_per_group, scale_set_key,
    schedulable, too_many_unready, unready_nodes, Backing, GroupIndex, AGENTPOOL_LABEL,
};

use crate::azure::ArmError;
use crate::cache::{Instance, InstanceCache, ScaleSet, ScaleSetCache, SizeCache};
use crate::capacity::{
    AllocationFailure, Offering, QuotaCache, Unavailable, UnavailableOfferings, Usages,
};
use crate::config::{NodeGroupKind, NodeGroupSpec, Settings};
use crate::hold::{HoldReason, WriteRefusal};
use crate::metrics::Metrics;
use crate::notify::{ConflictRecord, WriteRecord};
use crate::planner::{Demand, DemandSource};
use crate::resource::{CapacityResource, Resources};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use time::OffsetDateTime;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Instance lists per refresh at most (the rest wait for later passes).
const INSTANCE_LISTS_PER_PASS: usize = 32;

/// Wall clock for the planner (schedules). Replaceable in tests.
pub type WallClock = Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// What one full LIST of every source returned.
#[derive(Debug)]
pub struct Listing {
    /// Every resource listed, each from the source that backs its group.
    pub listed: Vec<ScaleSet>,
    /// When the first LIST was sent: the data is at least this fresh.
    sent_at: Instant,
    /// The scale-set LIST (auto-discovery of scale sets reads its tags).
    scale_sets: Option<Vec<ScaleSet>>,
    /// The LIST of `autoDiscovery.aksCluster`'s pools.
    pools: Option<Vec<ScaleSet>>,
}

/// The node groups under management and what Azure last said of them.
pub struct NodeGroups {
    settings: Arc<Settings>,
    resources: Resources,
    metrics: Arc<Metrics>,
    demand: Arc<dyn DemandSource>,
    clock: WallClock,
    groups: Mutex<Arc<Vec<NodeGroupSpec>>>,
    scale_sets: ScaleSetCache,
    sizes: SizeCache,
    instances: InstanceCache,
    quota: QuotaCache,
    offerings: UnavailableOfferings,
    /// Bumped on every refused allocation: scale-up decides again at once, elsewhere.
    refusals: tokio::sync::watch::Sender<u64>,
    /// When Azure last refused an allocation to each group (tokio's clock): `Failed` instances
    /// a list shows after it are that allocation's leftovers, deleted at once.
    refused_at: Mutex<HashMap<String, Instant>>,
    /// Zonal refusals (`ZonalAllocationFailed`) of groups spanning several zones, waiting for
    /// the instance list that says which zone ran short: when, the offering marked, Azure's
    /// message ([`NodeGroups::refused_allocation`]).
    zonal_refusals: Mutex<HashMap<String, (Instant, Offering, String)>>,
    /// Counts fresh instance lists of spot groups showing VMs stopped ([`NodeGroups::stopped`]).
    stopped: tokio::sync::watch::Sender<u64>,
    /// What the scale-up loop learned of each group from the nodes that registered.
    learned: Mutex<BTreeMap<String, Learned>>,
    /// What the writer and the loops reported of each group ([`Observed`]).
    observed: Mutex<HashMap<String, Observed>>,
    /// What the scale-down loop reported for the status (unneeded nodes, its halt).
    status: status::Reported,
}

/// What registered nodes taught about a group (see [`crate::autoscale::follow_up`]).
#[derive(Debug, Clone, Default)]
struct Learned {
    /// A node that registered otherwise than its template predicted: the group's template when
    /// none of its nodes is Ready.
    node: Option<Arc<crate::pods::record::NodeRecord>>,
    /// The last mismatch, for the status.
    mismatch: Option<crate::notify::TemplateMismatchStatus>,
    /// Passed over for workloads a scale-up did not help, until then.
    not_helped: Option<(Instant, crate::notify::NotHelpedStatus)>,
}

impl std::fmt::Debug for NodeGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeGroups")
            .field("resources", &self.resources)
            .field("groups", &self.groups.lock().len())
            .finish_non_exhaustive()
    }
}

impl NodeGroups {
    /// The configured groups of `settings`, read through `resources`; `demand` and `clock` give
    /// the configured demand that floors a group.
    pub fn new(
        settings: Arc<Settings>,
        resources: Resources,
        metrics: Arc<Metrics>,
        demand: Arc<dyn DemandSource>,
        clock: WallClock,
    ) -> Self {
        Self {
            groups: Mutex::new(Arc::new(settings.node_groups.clone())),
            scale_sets: ScaleSetCache::new(),
            sizes: SizeCache::new(settings.vmss_cache_ttl),
            instances: InstanceCache::new(
                settings.instance_cache_ttl,
                settings.instance_cache_jitter,
            ),
            quota: QuotaCache::new(settings.vmss_cache_ttl),
            offerings: UnavailableOfferings::new(settings.quota_cooldown),
            refusals: tokio::sync::watch::Sender::new(0),
            refused_at: Mutex::new(HashMap::new()),
            zonal_refusals: Mutex::new(HashMap::new()),
            stopped: tokio::sync::watch::Sender::new(0),
            learned: Mutex::new(BTreeMap::new()),
            observed: Mutex::new(HashMap::new()),
            status: status::Reported::default(),
            settings,
            resources,
            metrics,
            demand,
            clock,
        }
    }

    /// The wall clock the decisions read (schedules, node ages): one clock, replaceable in tests.
    pub fn now(&self) -> OffsetDateTime {
        (self.clock)()
    }

    /// [`NodeGroups::now`] as the Kubernetes types carry time (nodes' creation times are
    /// compared with it).
    pub fn timestamp(&self) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::from_nanosecond(self.now().unix_timestamp_nanos())
            .unwrap_or_default()
    }

    /// The node groups under management (configured plus discovered).
    pub fn groups(&self) -> Arc<Vec<NodeGroupSpec>> {
        self.groups.lock().clone()
    }

    /// The resource backing `group`.
    pub fn resource(&self, group: &NodeGroupSpec) -> Arc<dyn CapacityResource> {
        self.resources.for_group(group)
    }

    /// The scale-set cache (copy-on-write; readers never wait).
    pub fn scale_sets(&self) -> &ScaleSetCache {
        &self.scale_sets
    }

    /// The size cache.
    pub fn sizes(&self) -> &SizeCache {
        &self.sizes
    }

    /// The instance cache.
    pub fn instances(&self) -> &InstanceCache {
        &self.instances
    }

    /// The vCPU quota as last read, per region.
    pub fn quota(&self) -> &QuotaCache {
        &self.quota
    }

    /// What `name` asks Azure for (size, zones, priority in its region), as last read.
    pub fn offering(&self, name: &str) -> Option<Offering> {
        self.scale_sets.get(name)?.scale_set.offering()
    }

    /// Why `name`'s offering is out now (Azure refused it lately), if it is.
    pub fn unavailable(&self, name: &str) -> Option<Unavailable> {
        self.offerings.check(&self.offering(name)?)
    }

    /// The offerings out now, for the status: `(what, failure, left)`.
    pub fn unavailable_offerings(&self) -> Vec<(String, AllocationFailure, std::time::Duration)> {
        self.offerings.list()
    }

    /// Azure refused a capacity write to `name` (its answer or its operation's end, with ARM's
    /// error `code`): marks its offering unavailable for the time its cause calls for, and after
    /// a quota refusal reads the region's usages again on the next pass (Azure's answer is newer
    /// than our read). A zonal shortage (`ZonalAllocationFailed`) of a group spanning several
    /// zones marks its zone set until the next instance list shows where the allocation left
    /// `Failed` VMs; then only those zones stay marked ([`UnavailableOfferings::narrow`]).
    pub fn refused_allocation(
        &self,
        name: &str,
        failure: AllocationFailure,
        code: &str,
        message: &str,
    ) {
        self.metrics
            .failed_scale_ups_total
            .with_label_values(&[name, failure.label()])
            .inc();
        let now = Instant::now();
        self.refused_at.lock().insert(name.to_string(), now);
        self.mark_unavailable(name, failure, message);
        let zonal = self.offering(name).filter(|o| {
            failure == AllocationFailure::NoCapacity
                && AllocationFailure::zonal_code(code)
                && o.zones.len() > 1
        });
        if let Some(offering) = zonal {
            self.zonal_refusals
                .lock()
                .insert(name.to_string(), (now, offering, message.to_string()));
        }
    }

    /// A fresh instance list of `name` (stored at `listed`, its `Failed` instances in
    /// `failed_zones`) answers a zonal refusal waiting for it: the mark is narrowed to those
    /// zones. A list older than the refusal leaves it waiting.
    fn narrow_zonal_refusal(&self, name: &str, listed: Instant, failed_zones: &[String]) {
        let waiting = {
            let mut pending = self.zonal_refusals.lock();
            match pending.get(name) {
                Some((at, ..)) if listed >= *at => pending.remove(name),
                _ => None,
            }
        };
        let Some((_, offering, message)) = waiting else {
            return;
        };
        let marked = self.offerings.narrow(&offering, failed_zones, &message);
        if marked.is_empty() {
            info!(scale_set = name, %offering, failed_zones = ?failed_zones, "zonal refusal: the Failed VMs do not single out the zones that ran short; the group's zone set stays marked");
        } else {
            self.refusals.send_modify(|n| *n += 1);
            warn!(scale_set = name, %offering, zones = ?marked.iter().map(|(z, _)| z.as_str()).collect::<Vec<_>>(), unavailable_secs = ?marked.iter().map(|(_, t)| t.as_secs()).collect::<Vec<_>>(), "zonal refusal: only the zones the allocation left Failed VMs in are marked; the group stays eligible for its other zones");
        }
    }

    /// Whether the cached instance list of `name` was stored after Azure last refused an
    /// allocation to it: its `Failed` instances are what that allocation left (Azure reports a
    /// partial allocation's VMs `Failed`), not VMs still booting.
    pub fn listed_since_refusal(&self, name: &str) -> bool {
        let Some(refused) = self.refused_at.lock().get(name).copied() else {
            return false;
        };
        self.instances
            .listed_at(name)
            .is_some_and(|listed| listed >= refused)
    }

    /// Marks `name`'s offering unavailable for `failure`'s time and wakes the scale-up loop
    /// (a refusal, or Azure evicting its spot VMs).
    pub fn mark_unavailable(&self, name: &str, failure: AllocationFailure, message: &str) {
        let Some(offering) = self.offering(name) else {
            warn!(scale_set = name, reason = failure.label(), %message, "offering unavailable, but the group has not been read: nothing to mark");
            return;
        };
        let ttl = self.offerings.mark(&offering, failure, message);
        if failure == AllocationFailure::Quota && !offering.location.is_empty() {
            self.quota.invalidate(&offering.location);
        }
        self.refusals.send_modify(|n| *n += 1);
        warn!(scale_set = name, %offering, reason = failure.label(), unavailable_secs = ttl.as_secs(), %message, "offering marked unavailable: scale-up moves to other groups");
    }

    /// Changes when a fresh instance list shows VMs to delete at once: a spot group's VMs Azure
    /// stopped (evicted with `Deallocate`), or `Failed` VMs an allocation Azure refused left.
    /// Scale-down deletes them on its next pass, which this starts now.
    pub fn stopped(&self) -> tokio::sync::watch::Receiver<u64> {
        self.stopped.subscribe()
    }

    /// Changes when Azure refuses an allocation ([`NodeGroups::refused_allocation`]): the pods
    /// that waited for it are to be planned elsewhere now, not after a scan interval.
    pub fn refusals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.refusals.subscribe()
    }

    /// Reads the compute usages of every region a group lives in whose read is due (one LIST
    /// per region per `vmssCacheTTL`, or at once after a quota refusal); a failed read keeps
    /// the last one; `stretch` (at least 1) lengthens the TTL while the subscription's reads
    /// budget runs low. Sets `quota_remaining_vcpus` for the pools the groups draw from.
    pub async fn refresh_quota(&self, stretch: f64) {
        let Some(source) = self.resources.usages().cloned() else {
            return;
        };
        let offerings: Vec<Offering> = self
            .groups()
            .iter()
            .filter_map(|g| self.offering(&g.name))
            .filter(|o| !o.location.is_empty())
            .collect();
        let mut locations: Vec<&str> = offerings.iter().map(|o| o.location.as_str()).collect();
        locations.sort_unstable();
        locations.dedup();
        for location in locations {
            if !self.quota.due(location, stretch) {
                continue;
            }
            let sent_at = Instant::now();
            match source.usages(location).await {
                Ok(rows) => self.quota.insert(location, Usages::new(&rows, sent_at)),
                Err(e) => {
                    self.quota.attempted(location, sent_at);
                    warn!(%location, error = %e, "compute usages could not be read (the role needs Microsoft.Compute/locations/usages/read at subscription scope): planning with the last read, if any, until the next try in one vmssCacheTTL");
                }
            }
        }
        let wrapped: Vec<Option<Offering>> = offerings.into_iter().map(Some).collect();
        for pool in self.quota.pools(&wrapped).0 {
            self.metrics
                .quota_remaining_vcpus
                .with_label_values(&[&pool.location, &pool.name])
                .set(pool.remaining);
        }
    }

    /// Records that `node` of `group` registered otherwise than its template predicted
    /// (`status` says how): it is the group's template from now on, also when the group has no
    /// Ready node.
    pub fn learn_template(
        &self,
        group: &str,
        node: Arc<crate::pods::record::NodeRecord>,
        status: crate::notify::TemplateMismatchStatus,
    ) {
        let mut learned = self.learned.lock();
        let l = learned.entry(group.to_string()).or_default();
        l.node = Some(node);
        l.mismatch = Some(status);
    }

    /// The node learned as `group`'s template ([`NodeGroups::learn_template`]), if any.
    pub fn learned_template(&self, group: &str) -> Option<Arc<crate::pods::record::NodeRecord>> {
        self.learned.lock().get(group)?.node.clone()
    }

    /// The last template mismatch of `group`, if one was seen.
    pub fn template_mismatch(&self, group: &str) -> Option<crate::notify::TemplateMismatchStatus> {
        self.learned.lock().get(group)?.mismatch.clone()
    }

    /// Records that scale-up passes over `group` for some workloads until `until` (a scale-up
    /// for them did not help), or, with `None`, that it no longer does (a scale-up helped).
    pub fn set_not_helped(
        &self,
        group: &str,
        not_helped: Option<(Instant, crate::notify::NotHelpedStatus)>,
    ) {
        let mut learned = self.learned.lock();
        match not_helped {
            Some(n) => learned.entry(group.to_string()).or_default().not_helped = Some(n),
            None => {
                if let Some(l) = learned.get_mut(group) {
                    l.not_helped = None;
                }
            }
        }
    }

    /// The workloads scale-up passes over `group` for now, if any.
    pub fn not_helped(&self, group: &str) -> Option<crate::notify::NotHelpedStatus> {
        let learned = self.learned.lock();
        let (until, status) = learned.get(group)?.not_helped.as_ref()?;
        (*until > Instant::now()).then(|| status.clone())
    }

    /// The health of group `name` now: every cause that holds it, in the one precedence
    /// ([`Unhealthy`]). The scale-up decision, scale-down's replacement options and its wait for
    /// a new node, and the writer's own holds all ask this; the status's `held` is
    /// [`Health::held`].
    pub fn health(&self, name: &str) -> Health {
        let now = Instant::now();
        let mut causes = Vec::new();
        let spec = self.groups().iter().find(|g| g.name == name).cloned();
        if let Some(why) = spec.as_ref().and_then(|g| self.write_refusal(g)) {
            causes.push(Unhealthy::Refused(why));
        }
        if let Some(u) = self.unavailable(name) {
            causes.push(Unhealthy::Unavailable {
                failure: u.failure,
                left: u.left,
            });
        }
        let not_helped = self
            .learned
            .lock()
            .get(name)
            .and_then(|l| l.not_helped.as_ref().map(|(until, _)| *until))
            .filter(|until| *until > now);
        if let Some(o) = self.observed.lock().get(name) {
            if o.backoff_until.is_some_and(|t| t > now) {
                causes.push(Unhealthy::WriteBackoff);
            }
            if let Some(until) = o.provision_backoff_until.filter(|t| *t > now) {
                causes.push(Unhealthy::ProvisionTimeout {
                    limit: self.settings.pod_demand.max_node_provision_time,
                    left: until.saturating_duration_since(now),
                });
            }
            if let Some(reason) = o.held {
                causes.push(Unhealthy::Held(reason));
            }
        }
        if let Some(until) = not_helped {
            causes.push(Unhealthy::NotHelped {
                left: until.saturating_duration_since(now),
            });
        }
        Health::of(causes)
    }

    /// What was observed of group `name` (the status is drawn from it).
    pub fn observed(&self, name: &str) -> Observed {
        self.observed.lock().get(name).cloned().unwrap_or_default()
    }

    fn with_observed<R>(&self, name: &str, f: impl FnOnce(&mut Observed) -> R) -> R {
        f(self.observed.lock().entry(name.to_string()).or_default())
    }

    /// The writer read `name` carrying `etag`: it becomes the known ETag. Returns whether it
    /// differs from the one known before (another writer changed the resource); for a managed
    /// group (`managed`) that counts as a foreign write.
    pub fn saw_etag(&self, name: &str, etag: &str, managed: bool) -> bool {
        self.with_observed(name, |o| {
            let foreign = o.known_etag.as_ref().is_some_and(|k| k != etag);
            o.known_etag = Some(etag.to_string());
            if foreign && managed {
                o.foreign_writes += 1;
            }
            foreign
        })
    }

    /// The writer produced (or adopted) `etag` for `name`; `None`: the resource is gone.
    pub fn adopt_etag(&self, name: &str, etag: Option<String>) {
        self.with_observed(name, |o| o.known_etag = etag);
    }

    /// The ETag last seen or produced for `name`, if any.
    pub fn known_etag(&self, name: &str) -> Option<String> {
        self.observed.lock().get(name)?.known_etag.clone()
    }

    /// The writer no longer knows what `name` holds (an ambiguous write, a failed operation, a
    /// delete whose outcome is unknown), or, with `false`, read it afresh.
    pub fn set_stale(&self, name: &str, stale: bool) {
        self.with_observed(name, |o| o.stale = stale);
    }

    /// Whether `name` must be read before its next write.
    pub fn stale(&self, name: &str) -> bool {
        self.observed.lock().get(name).is_some_and(|o| o.stale)
    }

    /// The writer sent a capacity write to `name` (`record`): nothing is held any more.
    pub fn wrote(&self, name: &str, record: WriteRecord) {
        self.with_observed(name, |o| {
            o.last_write = Some(record);
            o.held = None;
        });
    }

    /// A write to `name` met a 412, which ended as `record` says.
    pub fn conflicted(&self, name: &str, record: ConflictRecord) {
        self.with_observed(name, |o| o.last_conflict = Some(record));
    }

    /// The writer held a planned capacity write to `name` for `reason` (counted in
    /// `writes_held_total` under the same label).
    pub fn write_held(&self, name: &str, reason: HoldReason) {
        self.with_observed(name, |o| o.held = Some(reason));
    }

    /// A pass planned `name`: `target` is what it wants (kept when unknown), `write` whether a
    /// write is planned (none: nothing is held).
    pub fn planned(&self, name: &str, target: Option<i64>, write: bool) {
        self.with_observed(name, |o| {
            o.target = target.or(o.target);
            if !write {
                o.held = None;
            }
        });
    }

    /// The writer backs `name` off until `until` (`None`: the backoff ends).
    pub fn set_write_backoff(&self, name: &str, until: Option<Instant>) {
        self.with_observed(name, |o| o.backoff_until = until);
    }

    /// The groups the scale-up loop passes over after a `maxNodeProvisionTime` timeout, and
    /// until when; every other group is not.
    pub fn set_provision_backoff(&self, per_group: &BTreeMap<String, Instant>) {
        let mut observed = self.observed.lock();
        for (name, o) in observed.iter_mut() {
            o.provision_backoff_until = per_group.get(name).copied();
        }
        for (name, until) in per_group {
            observed
                .entry(name.clone())
                .or_default()
                .provision_backoff_until = Some(*until);
        }
    }

    /// cluster-autoscaler's `TargetSize`: the size the planner would use now, `None` if unknown.
    pub fn target_size(&self, name: &str) -> Option<i64> {
        self.sizes
            .target_size(name, &self.scale_sets, Instant::now())
    }

    /// Why this controller will not write `group` as last read (an agent pool that AKS's own
    /// autoscaler scales), if it will not. Such a group is out of both decisions: scale-up does
    /// not pick it, scale-down drains none of its nodes.
    pub fn write_refusal(&self, group: &NodeGroupSpec) -> Option<WriteRefusal> {
        let cached = self.scale_sets.get(&group.name)?;
        self.resource(group).write_refusal(&cached.scale_set)
    }

    /// The lowest size `group` may be taken down to: its `minSize`, the configured demand
    /// (schedules, `desiredCapacity`) as a floor, and the resource's own floor as last read (a
    /// System pool keeps one node).
    pub fn floor(&self, group: &NodeGroupSpec) -> u32 {
        let demanded = match self.demand.demand(group, self.now()).0 {
            Demand::Exact(n) | Demand::AtLeast(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            Demand::Hold => 0,
        };
        let resource = match self.scale_sets.get(&group.name) {
            Some(c) => self.resource(group).capacity_floor(&c.scale_set),
            None => 0,
        };
        group.min_size.max(demanded).max(resource)
    }

    /// `groups` with each resource's own floor applied to `min` (a System pool keeps one node);
    /// shared when no floor binds.
    pub fn with_floors(&self, groups: Arc<Vec<NodeGroupSpec>>) -> Arc<Vec<NodeGroupSpec>> {
        let snapshot = self.scale_sets.snapshot();
        let floor = |g: &NodeGroupSpec| {
            snapshot
                .get(&g.name)
                .map(|e| self.resource(g).capacity_floor(&e.scale_set))
                .unwrap_or(0)
        };
        if groups.iter().all(|g| floor(g) <= g.min_size) {
            return groups;
        }
        Arc::new(
            groups
                .iter()
                .map(|g| {
                    let f = floor(g);
                    let mut g = g.clone();
                    if f > g.min_size {
                        g.min_size = f;
                        g.max_size = g.max_size.max(f);
                    }
                    g
                })
                .collect(),
        )
    }

    /// A fresh list of `group`'s instances (never the cache): `instance_id` as listed now
    /// (provisioning and power state), `Ok(None)` when it is not listed (deleted).
    pub async fn instance_state(
        &self,
        group: &NodeGroupSpec,
        instance_id: &str,
    ) -> Result<Option<Instance>, ArmError> {
        let list = self.fresh_instances(group).await?;
        Ok(list.into_iter().find(|i| i.instance_id == instance_id))
    }

    /// A fresh LIST of `group`'s instances, never the cache (one call for every instance of the
    /// group a caller has to decide about).
    pub async fn fresh_instances(&self, group: &NodeGroupSpec) -> Result<Vec<Instance>, ArmError> {
        self.instances.invalidate(&group.name);
        self.resource(group).list_instances(&group.name).await
    }

    /// One LIST per source (the scale sets of the resource group, the pools of each managed
    /// cluster). A managed group's entry comes only from the source that backs it, so a scale
    /// set and a pool of the same name never overwrite each other. Changes nothing yet: see
    /// [`NodeGroups::adopt`].
    pub async fn list(&self) -> Result<Listing, ArmError> {
        // The data is at least as fresh as the moment the LIST was sent: age counts from then.
        let sent_at = Instant::now();
        let mut listing = Listing {
            listed: Vec::new(),
            sent_at,
            scale_sets: None,
            pools: None,
        };
        let discovery_pools = self.resources.discovery_pools();
        let groups = self.groups();
        for source in self.resources.sources() {
            let listed = source.list().await?;
            let foreign_kind = |n: &str| {
                groups
                    .iter()
                    .any(|g| g.name == n && !self.resources.serves(&source, g))
            };
            let listed: Vec<ScaleSet> = listed
                .into_iter()
                .filter(|s| !foreign_kind(&s.name))
                .collect();
            if source.kind() == NodeGroupKind::Vmss.as_str() {
                listing.scale_sets = Some(listed.clone());
            }
            if discovery_pools
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(d, &source))
            {
                listing.pools = Some(listed.clone());
            }
            listing.listed.extend(listed);
        }
        Ok(listing)
    }

    /// Makes `listing` the view: the groups auto-discovery finds in it, the whole scale-set
    /// cache replaced, sizes following the fresh LIST. Returns the names listed.
    pub fn adopt(&self, listing: Listing) -> HashSet<String> {
        let present: HashSet<String> = listing.listed.iter().map(|s| s.name.clone()).collect();
        self.update_groups(listing.scale_sets.as_deref(), listing.pools.as_deref());
        self.scale_sets.replace_all(listing.listed, listing.sent_at);
        // Sizes follow the fresh LIST at once; our own published sizes are older than it.
        for g in self.groups().iter() {
            self.sizes.invalidate(&g.name);
            if !present.contains(&g.name) {
                let problem = crate::problem::Problem::node_group_missing(
                    &self.settings.azure.subscription_id,
                    &self.settings.azure.resource_group,
                    g,
                );
                warn!(scale_set = %g.name, kind = g.kind.as_str(), "{problem}");
            }
        }
        present
    }

    /// Configured groups plus those discovered from tags.
    /// `scale_sets` is the scale-set LIST, `pools` the LIST of `autoDiscovery.aksCluster`'s pools.
    fn update_groups(&self, scale_sets: Option<&[ScaleSet]>, pools: Option<&[ScaleSet]>) {
        let Some(auto) = &self.settings.auto_discovery else {
            return;
        };
        let tagged = |listed: &[ScaleSet]| -> Vec<(String, BTreeMap<String, String>)> {
            listed
                .iter()
                .map(|s| (s.name.clone(), s.tags.clone()))
                .collect()
        };
        let mut discovered = Vec::new();
        let mut skipped = Vec::new();
        if let Some(listed) = scale_sets {
            let (found, skip) = crate::config::discover_node_groups(auto, &tagged(listed));
            discovered.extend(found);
            skipped.extend(skip);
        }
        if let (Some(listed), Some(cluster)) = (pools, auto.aks_cluster.as_deref()) {
            let (found, skip) = crate::config::discover_pools(
                auto,
                cluster,
                auto.aks_resource_group.as_deref(),
                &tagged(listed),
            );
            discovered.extend(found);
            skipped.extend(skip);
        }
        for (name, reason) in &skipped {
            debug!(scale_set = %name, %reason, "auto-discovery skipped");
        }
        let mut groups = self.settings.node_groups.clone();
        let mut taken: HashSet<String> = groups.iter().map(|g| g.name.clone()).collect();
        for g in discovered {
            // Configured groups win; of two discovered resources with one name, the first.
            if taken.insert(g.name.clone()) {
                groups.push(g);
            } else {
                debug!(scale_set = %g.name, kind = g.kind.as_str(), "auto-discovery skipped: the name is already a node group");
            }
        }
        let mut current = self.groups.lock();
        if **current != groups {
            info!(groups = ?groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), "node groups changed");
            *current = Arc::new(groups);
        }
    }

    /// Lists instances of groups whose instance-cache entry expired or was invalidated: at most
    /// 32 per call, a few at a time, so a large fleet spreads the cost. Each new list lives
    /// `stretch` times `instanceCacheTTL` (the pass's stretch: below the reserve of the reads
    /// budget, every refresh comes less often). A list our own write invalidated is listed again
    /// at once whatever the budget: an unknown list holds the instance timers, a stale one would
    /// show a deleted instance as unregistered.
    pub async fn refresh_instances(&self, groups: &[NodeGroupSpec], stretch: f64) {
        if self.settings.instance_cache_ttl.is_zero() {
            return;
        }
        let due: Vec<NodeGroupSpec> = groups
            .iter()
            .filter(|g| {
                self.instances.get(&g.name).is_none() && self.scale_sets.get(&g.name).is_some()
            })
            .take(INSTANCE_LISTS_PER_PASS)
            .cloned()
            .collect();
        for chunk in due.chunks(4) {
            let mut lists = JoinSet::new();
            for group in chunk {
                let (resource, name) = (self.resource(group), group.name.clone());
                // Taken before the list is sent: our own delete landing meanwhile makes the
                // answer stale, and it is then not stored.
                let ticket = self.instances.ticket(&name);
                lists.spawn(async move {
                    let result = resource.list_instances(&name).await;
                    (name, ticket, result)
                });
            }
            while let Some(Ok((name, ticket, result))) = lists.join_next().await {
                match result {
                    Ok(list) => {
                        let count = list.len() as i64;
                        let stopped = list.iter().any(Instance::deallocated)
                            && self.offering(&name).is_some_and(|o| o.spot);
                        let failed = list.iter().any(Instance::failed);
                        let failed_zones: Vec<String> = list
                            .iter()
                            .filter(|i| i.failed())
                            .filter_map(|i| i.zone.clone())
                            .collect();
                        if !self.instances.insert_stretched(ticket, list, stretch) {
                            debug!(scale_set = %name, "instance list answered after an invalidation: not stored, listed again next pass");
                            continue;
                        }
                        if let Some(listed) = self.instances.listed_at(&name) {
                            self.narrow_zonal_refusal(&name, listed, &failed_zones);
                        }
                        self.metrics
                            .scale_set_instances
                            .with_label_values(&[&name])
                            .set(count);
                        if stopped || (failed && self.listed_since_refusal(&name)) {
                            self.stopped.send_modify(|n| *n += 1);
                        }
                    }
                    Err(e) => {
                        debug!(scale_set = %name, error = %e, "instance list failed; keeping the last one")
                    }
                }
            }
        }
    }
}
