//! The controller's three caches.
//!
//! - [`ScaleSetCache`]: copy-on-write map of scale sets, like kube's reflector store. Readers take
//!   an `Arc` snapshot under a `parking_lot` read lock held for one pointer copy; they never block
//!   on I/O and never see a half-built map. Writers build the new map off to the side (serialized
//!   by a writer mutex so two single-entry updates cannot lose each other) and swap it in. A full
//!   resync (one LIST per resource group) replaces the whole map at once. Entries may be stale by
//!   up to `vmssCacheTTL` plus one scan interval; a 412 or an ambiguous write refreshes a single
//!   entry with a GET.
//! - [`SizeCache`]: per node group `cur_size` and `last_refresh`, refreshed from the scale-set
//!   cache every `vmssCacheTTL`; invalidated means "refresh on the next read"; unknown means no
//!   write (the planner never plans from an unknown size).
//! - [`InstanceCache`]: `moka` cache of instance lists with TTL plus per-entry jitter so refreshes
//!   do not align; invalidated after every own write and every 412. (moka keeps its own clock, so
//!   its TTL does not follow tokio's paused clock; tests exercise invalidation, not expiry.)

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// What the controller knows of one scale set: the fields a capacity write needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSet {
    /// Scale-set name.
    pub name: String,
    /// Azure region (required by ARM on every PUT).
    pub location: String,
    /// SKU name, e.g. `Standard_D2s_v5`.
    pub sku_name: Option<String>,
    /// SKU tier, e.g. `Standard`.
    pub sku_tier: Option<String>,
    /// `sku.capacity`; `None` when ARM did not say.
    pub capacity: Option<i64>,
    /// The ETag exactly as ARM returned it (quotes included).
    pub etag: Option<String>,
    /// Resource tags.
    pub tags: BTreeMap<String, String>,
    /// `properties.provisioningState`.
    pub provisioning_state: Option<String>,
    /// Edge-zone `extendedLocation` as ARM returned it, sent back on writes when present.
    pub extended_location: Option<serde_json::Value>,
    /// For an AKS agent pool: what the pool read showed (`None` for a scale set).
    pub agent_pool: Option<Arc<AgentPoolFacts>>,
    /// What the VM profile says about the nodes it makes (scale-from-zero templates).
    pub vm_profile: VmProfile,
    /// Availability zones (a scale set's `zones`, a pool's `availabilityZones`); empty: regional.
    pub zones: Vec<String>,
}

impl ScaleSet {
    /// What the resource asks Azure for (size, zones, priority in its region), when the read
    /// named a size: the key of unavailable offerings and of quota pools.
    pub fn offering(&self) -> Option<crate::capacity::offerings::Offering> {
        let size = self.sku_name.as_deref()?;
        Some(crate::capacity::offerings::Offering::new(
            &self.location,
            size,
            &self.zones,
            self.vm_profile.spot,
        ))
    }
}

/// What a node group's VM profile says about its future nodes: a scale set's
/// `virtualMachineProfile`, an agent pool's `osType`, `osDiskSizeGB` and `kubeletDiskType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmProfile {
    /// Windows nodes (`osProfile.windowsConfiguration`, `osDisk.osType` or the pool's `osType`).
    pub windows: bool,
    /// The OS disk's size in GiB, when the resource sets it (`0` and absent: Azure's default).
    pub os_disk_gib: Option<u32>,
    /// The kubelet's disk is the VM's temporary disk (a pool's `kubeletDiskType: Temporary`),
    /// not the OS disk.
    pub kubelet_on_temp_disk: bool,
    /// Spot priority (a scale set's `priority: Spot` or `Low`, a pool's
    /// `scaleSetPriority: Spot`).
    pub spot: bool,
}

/// What an agent-pool read showed beyond the fields all node groups share. The pool PUT
/// replaces the whole object, so the body as read is kept to be sent back with `count` changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentPoolFacts {
    /// The managed cluster the pool belongs to.
    pub cluster: String,
    /// The pool's JSON exactly as the read returned it.
    pub body: serde_json::Value,
    /// `properties.enableAutoScaling`: AKS's own autoscaler owns the count.
    pub enable_auto_scaling: bool,
    /// `properties.mode`: `System` or `User`.
    pub mode: Option<String>,
    /// `properties.maxPods`.
    pub max_pods: Option<i64>,
    /// `properties.nodeLabels`.
    pub node_labels: BTreeMap<String, String>,
    /// `properties.nodeTaints`, as `key=value:Effect` strings.
    pub node_taints: Vec<String>,
}

impl AgentPoolFacts {
    /// Whether the pool is a `System` pool (AKS requires at least one node in it).
    pub fn is_system(&self) -> bool {
        self.mode
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("system"))
    }
}

/// A cached scale set and when it was fetched.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedScaleSet {
    /// The scale set.
    pub scale_set: ScaleSet,
    /// When ARM returned it.
    pub fetched_at: Instant,
}

/// The cache's map. Keys are short scale-set names, so the Fx hash (no DoS concern: names come
/// from our own subscription's LIST) is several times cheaper than SipHash on the read path.
pub type ScaleSetMap = HashMap<String, Arc<CachedScaleSet>, rustc_hash::FxBuildHasher>;

/// An immutable view of the cache; cheap to clone and hold.
pub type Snapshot = Arc<ScaleSetMap>;

/// Copy-on-write scale-set cache.
#[derive(Debug, Default)]
pub struct ScaleSetCache {
    current: RwLock<Snapshot>,
    writer: Mutex<()>,
    last_full_refresh: Mutex<Option<Instant>>,
}

impl ScaleSetCache {
    /// An empty cache that has never been refreshed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current snapshot. Holds the read lock for one `Arc` clone.
    pub fn snapshot(&self) -> Snapshot {
        self.current.read().clone()
    }

    /// One entry.
    pub fn get(&self, name: &str) -> Option<Arc<CachedScaleSet>> {
        self.current.read().get(name).cloned()
    }

    /// Replaces the whole map (a full resync) and records the refresh time.
    pub fn replace_all(&self, scale_sets: Vec<ScaleSet>, now: Instant) {
        let map: ScaleSetMap = scale_sets
            .into_iter()
            .map(|s| {
                (
                    s.name.clone(),
                    Arc::new(CachedScaleSet {
                        scale_set: s,
                        fetched_at: now,
                    }),
                )
            })
            .collect();
        let _w = self.writer.lock();
        *self.current.write() = Arc::new(map);
        *self.last_full_refresh.lock() = Some(now);
    }

    /// Inserts or replaces one entry, copy-on-write.
    pub fn upsert(&self, scale_set: ScaleSet, now: Instant) {
        self.update(|map| {
            map.insert(
                scale_set.name.clone(),
                Arc::new(CachedScaleSet {
                    scale_set,
                    fetched_at: now,
                }),
            );
        });
    }

    /// Removes one entry (the scale set is gone), copy-on-write.
    pub fn remove(&self, name: &str) {
        self.update(|map| {
            map.remove(name);
        });
    }

    fn update(&self, f: impl FnOnce(&mut ScaleSetMap)) {
        let _w = self.writer.lock();
        // Clone off to the side: readers keep using the old snapshot meanwhile.
        let mut next = ScaleSetMap::clone(&self.current.read());
        f(&mut next);
        *self.current.write() = Arc::new(next);
    }

    /// When the last full resync happened.
    pub fn last_full_refresh(&self) -> Option<Instant> {
        *self.last_full_refresh.lock()
    }

    /// Makes the next [`ScaleSetCache::refresh_due`] true (the seed PR's `invalidateCache`).
    pub fn invalidate_all(&self) {
        *self.last_full_refresh.lock() = None;
    }

    /// Whether a full resync is due.
    pub fn refresh_due(&self, ttl: Duration, now: Instant) -> bool {
        match self.last_full_refresh() {
            None => true,
            Some(at) => now.saturating_duration_since(at) >= ttl,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct SizeEntry {
    cur_size: Option<i64>,
    last_refresh: Option<Instant>,
}

/// Per node group size cache (`cur_size`, `last_refresh`).
#[derive(Debug)]
pub struct SizeCache {
    period: Duration,
    entries: Mutex<HashMap<String, SizeEntry>>,
}

impl SizeCache {
    /// A cache whose entries are re-read from the scale-set cache every `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The node group's size (cluster-autoscaler's `TargetSize`): the cached value while fresh,
    /// otherwise re-read from `scale_sets`. `None` when unknown.
    pub fn target_size(&self, name: &str, scale_sets: &ScaleSetCache, now: Instant) -> Option<i64> {
        let mut entries = self.entries.lock();
        let entry = entries.entry(name.to_string()).or_default();
        let fresh = entry
            .last_refresh
            .is_some_and(|at| now.saturating_duration_since(at) < self.period);
        if fresh {
            return entry.cur_size;
        }
        let size = scale_sets.get(name).and_then(|c| c.scale_set.capacity);
        *entry = SizeEntry {
            cur_size: size,
            last_refresh: size.map(|_| now),
        };
        size
    }

    /// Records a size this controller just wrote (or learned from a fresh GET).
    pub fn publish(&self, name: &str, size: i64, now: Instant) {
        self.entries.lock().insert(
            name.to_string(),
            SizeEntry {
                cur_size: Some(size),
                last_refresh: Some(now),
            },
        );
    }

    /// Forces the next read to go to the scale-set cache.
    pub fn invalidate(&self, name: &str) {
        if let Some(e) = self.entries.lock().get_mut(name) {
            e.last_refresh = None;
        }
    }

    /// Forgets a group entirely (its scale set is gone).
    pub fn remove(&self, name: &str) {
        self.entries.lock().remove(name);
    }
}

/// One VM instance of a scale set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    /// The scale set's instance id (`"0"`, `"1"`, ...).
    pub instance_id: String,
    /// `properties.provisioningState` (`Creating`, `Succeeded`, `Deleting`, ...).
    pub provisioning_state: Option<String>,
    /// `properties.osProfile.computerName`: the name its Node registers under (on AKS, the
    /// machine name `deleteMachines` takes).
    pub computer_name: Option<String>,
    /// The instance view's `PowerState/<state>` code, lowercased (`running`, `deallocated`,
    /// ...); `None` when the list carried no instance view.
    pub power_state: Option<String>,
    /// The availability zone it is in (`"2"`), when the scale set is zonal.
    pub zone: Option<String>,
}

impl Instance {
    /// Azure lists it in the `Failed` provisioning state (an allocation that failed part-way,
    /// an extension that did not install).
    pub fn failed(&self) -> bool {
        self.provisioning_state
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("Failed"))
    }

    /// Azure is deleting it (`Deleting`): a delete, ours or another's, is under way.
    pub fn deleting(&self) -> bool {
        self.provisioning_state
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("Deleting"))
    }

    /// Stopped and its hardware given back (`deallocated`, or on its way there): it runs no
    /// pod, yet still counts in the scale set's capacity and against the vCPU quota. A spot VM
    /// Azure evicted with eviction policy `Deallocate` is left so.
    pub fn deallocated(&self) -> bool {
        self.power_state.as_deref().is_some_and(|p| {
            p.eq_ignore_ascii_case("deallocated") || p.eq_ignore_ascii_case("deallocating")
        })
    }
}

/// The instances of a group no node is coming from, as scale-up counts them: those Azure lists
/// `Failed` (and not deallocated), and those stopped and deallocated (a spot VM evicted with
/// `Deallocate`), by instance id. One rule for the loop and `explain`.
pub fn not_coming(instances: &[Instance]) -> (Vec<String>, Vec<String>) {
    let ids = |keep: &dyn Fn(&Instance) -> bool| -> Vec<String> {
        instances
            .iter()
            .filter(|i| keep(i))
            .map(|i| i.instance_id.clone())
            .collect()
    };
    (
        ids(&|i| i.failed() && !i.deallocated()),
        ids(&Instance::deallocated),
    )
}

/// moka's expiry for the instance cache: each entry lives the time it was given ([`Listed`]).
struct ListedLifetime;

/// One cached instance list and how long it was given.
#[derive(Clone)]
struct Listed {
    instances: Arc<Vec<Instance>>,
    /// Its TTL (stretched, jittered), and when that runs out on tokio's clock.
    lives: Duration,
    until: Instant,
}

impl moka::Expiry<String, Listed> for ListedLifetime {
    /// Reclaims the entry's memory once its life is over (on the wall clock; [`InstanceCache::get`]
    /// judges expiry on tokio's, so a paused clock sees it too).
    fn expire_after_create(
        &self,
        _key: &String,
        value: &Listed,
        _now: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.lives)
    }
}

/// Instance lists per scale set, with TTL and jitter.
///
/// A list is stored only if no invalidation of its group came between the moment it was asked
/// for ([`InstanceCache::ticket`]) and its answer: a list sent before our own delete and
/// answered after it would otherwise bring the deleted instance back into the cache (and a spot
/// VM already deleted would be seen evicted, counted and marked again).
#[derive(Clone)]
pub struct InstanceCache {
    cache: moka::sync::Cache<String, Listed>,
    /// Per group, how many times its entry was invalidated (held while a list is stored, so a
    /// store and an invalidation never interleave).
    generations: Arc<Mutex<HashMap<String, u64>>>,
    ttl: Duration,
    jitter: Duration,
}

/// Taken before an instance list is sent ([`InstanceCache::ticket`]): the list it brings back
/// is stored only while no invalidation of its group came in between.
#[derive(Debug, Clone)]
#[must_use]
pub struct ListTicket {
    name: String,
    generation: u64,
}

impl std::fmt::Debug for InstanceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceCache")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl InstanceCache {
    /// A cache whose entries live `ttl` plus up to `jitter`.
    pub fn new(ttl: Duration, jitter: Duration) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .expire_after(ListedLifetime)
            .build();
        Self {
            cache,
            generations: Arc::default(),
            ttl,
            jitter,
        }
    }

    /// Taken right before `name`'s instances are listed: see [`InstanceCache::insert_stretched`].
    pub fn ticket(&self, name: &str) -> ListTicket {
        let generation = self.generations.lock().get(name).copied().unwrap_or(0);
        ListTicket {
            name: name.to_string(),
            generation,
        }
    }

    /// The cached instances of `name`, if present and not expired.
    pub fn get(&self, name: &str) -> Option<Arc<Vec<Instance>>> {
        self.cache
            .get(name)
            .filter(|l| l.until > Instant::now())
            .map(|l| l.instances)
    }

    /// When the cached list of `name` was stored (tokio's clock), if present and not expired.
    pub fn listed_at(&self, name: &str) -> Option<Instant> {
        self.cache
            .get(name)
            .filter(|l| l.until > Instant::now())
            .map(|l| l.until - l.lives)
    }

    /// Stores a fresh instance list, to live the TTL plus its jitter (see
    /// [`InstanceCache::insert_stretched`]).
    pub fn insert(&self, ticket: ListTicket, instances: Vec<Instance>) -> bool {
        self.insert_stretched(ticket, instances, 1.0)
    }

    /// Stores the instance list `ticket` was taken for, to live `stretch` (at least 1) times
    /// the TTL, plus its jitter: below the reserve of the reads budget, instance lists are
    /// refreshed less often, like the scale sets and the usages. Returns `false`, storing
    /// nothing, when the group was invalidated after the ticket was taken: the list may predate
    /// our own write.
    pub fn insert_stretched(
        &self,
        ticket: ListTicket,
        instances: Vec<Instance>,
        stretch: f64,
    ) -> bool {
        let generations = self.generations.lock();
        if generations.get(&ticket.name).copied().unwrap_or(0) != ticket.generation {
            return false;
        }
        let lives = self.lifetime(stretch);
        self.cache.insert(
            ticket.name,
            Listed {
                instances: Arc::new(instances),
                lives,
                until: Instant::now() + lives,
            },
        );
        true
    }

    /// The TTL times `stretch` (at least 1), plus a random part of the jitter.
    fn lifetime(&self, stretch: f64) -> Duration {
        let jitter_ms = self.jitter.as_millis() as u64;
        let extra = if jitter_ms == 0 {
            0
        } else {
            rand::random::<u64>() % jitter_ms
        };
        self.ttl.mul_f64(stretch.max(1.0)) + Duration::from_millis(extra)
    }

    /// Drops the entry so the next read lists the instances again; a list already on its way
    /// will not be stored.
    pub fn invalidate(&self, name: &str) {
        let mut generations = self.generations.lock();
        *generations.entry(name.to_string()).or_default() += 1;
        self.cache.invalidate(name);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn scale_set(name: &str, capacity: i64, etag: &str) -> ScaleSet {
        ScaleSet {
            name: name.into(),
            location: "westeurope".into(),
            sku_name: Some("Standard_D2s_v5".into()),
            sku_tier: Some("Standard".into()),
            capacity: Some(capacity),
            etag: Some(etag.into()),
            tags: BTreeMap::new(),
            provisioning_state: Some("Succeeded".into()),
            extended_location: None,
            agent_pool: None,
            vm_profile: VmProfile::default(),
            zones: Vec::new(),
        }
    }

    #[test]
    fn a_reader_keeps_its_snapshot_while_a_writer_swaps_in_a_new_map() {
        let cache = ScaleSetCache::new();
        let now = Instant::now();
        cache.replace_all(vec![scale_set("a", 3, "\"1\"")], now);
        let before = cache.snapshot();
        cache.upsert(scale_set("a", 5, "\"2\""), now);
        assert_eq!(
            before["a"].scale_set.capacity,
            Some(3),
            "old snapshot untouched"
        );
        assert_eq!(cache.get("a").unwrap().scale_set.capacity, Some(5));
    }

    #[test]
    fn concurrent_single_entry_updates_are_never_lost() {
        let cache = Arc::new(ScaleSetCache::new());
        let now = Instant::now();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        cache.upsert(scale_set(&format!("s{t}-{i}"), i, "\"1\""), now);
                        let _ = cache.snapshot().len();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(cache.snapshot().len(), 8 * 200);
    }

    #[test]
    fn size_cache_serves_the_cached_size_until_invalidated() {
        let scale_sets = ScaleSetCache::new();
        let now = Instant::now();
        scale_sets.replace_all(vec![scale_set("a", 3, "\"1\"")], now);
        let sizes = SizeCache::new(Duration::from_secs(60));
        assert_eq!(sizes.target_size("a", &scale_sets, now), Some(3));
        scale_sets.upsert(scale_set("a", 5, "\"2\""), now);
        assert_eq!(
            sizes.target_size("a", &scale_sets, now),
            Some(3),
            "fresh entry is served"
        );
        sizes.invalidate("a");
        assert_eq!(
            sizes.target_size("a", &scale_sets, now),
            Some(5),
            "invalidated entry is re-read"
        );
    }

    #[test]
    fn size_cache_refreshes_after_its_period() {
        let scale_sets = ScaleSetCache::new();
        let now = Instant::now();
        scale_sets.replace_all(vec![scale_set("a", 3, "\"1\"")], now);
        let sizes = SizeCache::new(Duration::from_secs(60));
        assert_eq!(sizes.target_size("a", &scale_sets, now), Some(3));
        scale_sets.upsert(scale_set("a", 4, "\"2\""), now);
        assert_eq!(
            sizes.target_size("a", &scale_sets, now + Duration::from_secs(61)),
            Some(4)
        );
    }

    #[test]
    fn an_unknown_scale_set_has_no_size() {
        let sizes = SizeCache::new(Duration::from_secs(60));
        assert_eq!(
            sizes.target_size("missing", &ScaleSetCache::new(), Instant::now()),
            None
        );
    }

    #[test]
    fn instance_cache_invalidation_drops_the_entry() {
        let c = InstanceCache::new(Duration::from_secs(300), Duration::from_secs(30));
        c.insert(
            c.ticket("a"),
            vec![Instance {
                instance_id: "0".into(),
                provisioning_state: None,
                computer_name: None,
                power_state: None,
                zone: None,
            }],
        );
        assert!(c.get("a").is_some());
        c.invalidate("a");
        assert!(c.get("a").is_none());
    }

    #[test]
    fn a_list_asked_for_before_an_invalidation_is_not_stored_after_it() {
        let c = InstanceCache::new(Duration::from_secs(300), Duration::ZERO);
        let one = |id: &str| Instance {
            instance_id: id.into(),
            provisioning_state: None,
            computer_name: None,
            power_state: Some("PowerState/deallocated".into()),
            zone: None,
        };
        // A refresh sends its list; our delete of instance 3 invalidates meanwhile; the
        // refresh's answer, still showing 3, comes back after.
        let before_delete = c.ticket("spot");
        c.invalidate("spot");
        assert!(
            !c.insert(before_delete, vec![one("3")]),
            "a stale list is refused"
        );
        assert!(c.get("spot").is_none(), "the next read lists again");
        // A list asked for after the invalidation is stored, and others' groups are untouched.
        let other = c.ticket("ondemand");
        assert!(c.insert(c.ticket("spot"), vec![one("4")]));
        assert_eq!(c.get("spot").expect("stored")[0].instance_id, "4");
        assert!(c.insert(other, Vec::new()));
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_list_taken_while_the_reads_budget_is_low_lives_its_stretched_ttl() {
        let c = InstanceCache::new(Duration::from_secs(300), Duration::ZERO);
        assert!(c.insert(c.ticket("usual"), Vec::new()));
        assert!(c.insert_stretched(c.ticket("stretched"), Vec::new(), 2.5));
        assert!(c.insert_stretched(c.ticket("never-shortened"), Vec::new(), 0.5));
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(c.get("usual").is_some());
        assert!(c.get("never-shortened").is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(c.get("usual").is_none(), "expired after its TTL");
        assert!(c.get("never-shortened").is_none());
        assert!(c.get("stretched").is_some());
        tokio::time::advance(Duration::from_secs(448)).await;
        assert!(c.get("stretched").is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(
            c.get("stretched").is_none(),
            "expired after 2.5 times its TTL"
        );
    }
}
