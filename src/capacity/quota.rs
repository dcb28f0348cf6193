//! The subscription's vCPU quota as Azure reports it: a region's compute usages
//! (`Microsoft.Compute/locations/{location}/usages`), read once per location per TTL and
//! cached, and turned into the *pools* a scale-up draws from.
//!
//! A regular VM counts against its family's vCPUs (`standardDSv5Family`) and the regional total
//! (`cores`); a spot VM against the regional spot total (`lowPriorityCores`) only. A plan takes
//! from every pool its nodes draw on, so two groups of one family share what is left.

use super::offerings::Offering;
use crate::azure::ArmError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The usage name of the regional vCPU total.
pub const REGIONAL_CORES: &str = "cores";
/// The usage name of the regional spot (low-priority) vCPU total.
pub const SPOT_CORES: &str = "lowPriorityCores";

pub use crate::azure::arm::Usage;

/// Where a region's usages come from (ARM, in production).
#[async_trait::async_trait]
pub trait UsageSource: Send + Sync + std::fmt::Debug {
    /// The compute usages of `location` (every page).
    async fn usages(&self, location: &str) -> Result<Vec<Usage>, ArmError>;
}

#[async_trait::async_trait]
impl UsageSource for crate::azure::ArmClient {
    async fn usages(&self, location: &str) -> Result<Vec<Usage>, ArmError> {
        self.list_usages(location).await
    }
}

/// One region's usages as last read.
#[derive(Debug, Clone)]
pub struct Usages {
    /// Lowercase usage name → (current, limit).
    rows: HashMap<String, (i64, i64)>,
    fetched_at: Instant,
}

impl Usages {
    /// The rows read at `fetched_at`.
    pub fn new(rows: &[Usage], fetched_at: Instant) -> Self {
        Self {
            rows: rows
                .iter()
                .map(|u| (u.name.to_ascii_lowercase(), (u.current, u.limit)))
                .collect(),
            fetched_at,
        }
    }

    /// vCPUs left under `name` (never negative), `None` when the region does not list it.
    pub fn remaining(&self, name: &str) -> Option<i64> {
        self.rows
            .get(&name.to_ascii_lowercase())
            .map(|(current, limit)| (limit - current).max(0))
    }
}

/// The usage names a node of `offering` draws its vCPUs from.
pub fn pools_of(offering: &Offering) -> Vec<String> {
    if offering.spot {
        return vec![SPOT_CORES.to_string()];
    }
    let mut pools = vec![REGIONAL_CORES.to_string()];
    if let Some(family) = offering.family() {
        pools.push(family.to_string());
    }
    pools
}

/// A quota pool as one decision sees it: what is left of one usage in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaPool {
    /// Region.
    pub location: String,
    /// The usage's name (`standardDSv5Family`, `cores`, `lowPriorityCores`).
    pub name: String,
    /// vCPUs left.
    pub remaining: i64,
}

impl std::fmt::Display for QuotaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in {}", self.name, self.location)
    }
}

/// Usages per region, each refreshed once per TTL or after a quota refusal.
#[derive(Debug)]
pub struct QuotaCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, Arc<Usages>>>,
    /// When each region was last asked, answered or not: a read that failed (a role without
    /// `Microsoft.Compute/locations/usages/read`) is not tried again before the TTL either.
    attempted: Mutex<HashMap<String, Instant>>,
    /// Regions made due at once, with when: only a read sent since then answers it (a read
    /// already on its way carries what Azure said before the refusal).
    stale: Mutex<HashMap<String, Instant>>,
}

impl QuotaCache {
    /// An empty cache whose entries live `ttl` (`vmssCacheTTL`).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
            attempted: Mutex::new(HashMap::new()),
            stale: Mutex::new(Default::default()),
        }
    }

    /// The usages of `location` as last read (however old), if read.
    pub fn get(&self, location: &str) -> Option<Arc<Usages>> {
        self.entries
            .lock()
            .get(&location.to_ascii_lowercase())
            .cloned()
    }

    /// Whether `location` should be read again now.
    pub fn due(&self, location: &str, stretch: f64) -> bool {
        let key = location.to_ascii_lowercase();
        if self.stale.lock().contains_key(&key) {
            return true;
        }
        self.attempted
            .lock()
            .get(&key)
            .is_none_or(|at| *at + self.ttl.mul_f64(stretch.max(1.0)) <= Instant::now())
    }

    /// Records that `location` was asked at `at` (whatever the answer). An invalidation after
    /// `at` stands: that read was sent before it.
    pub fn attempted(&self, location: &str, at: Instant) {
        let key = location.to_ascii_lowercase();
        {
            let mut stale = self.stale.lock();
            if stale.get(&key).is_some_and(|since| at >= *since) {
                stale.remove(&key);
            }
        }
        self.attempted.lock().insert(key, at);
    }

    /// Stores a fresh read.
    pub fn insert(&self, location: &str, usages: Usages) {
        self.attempted(location, usages.fetched_at);
        self.entries
            .lock()
            .insert(location.to_ascii_lowercase(), Arc::new(usages));
    }

    /// Makes `location` due at once (after a quota refusal: what Azure said is newer).
    pub fn invalidate(&self, location: &str) {
        // The latest refusal counts: a read sent between two refusals predates the second.
        self.stale
            .lock()
            .insert(location.to_ascii_lowercase(), Instant::now());
    }

    /// The pools the `offerings` (one per group, `None`: unknown) draw from, each pool once,
    /// and per group the indices of its pools. A group whose region's usages were never read,
    /// or whose pools the region does not list, is not capped by them.
    pub fn pools(&self, offerings: &[Option<Offering>]) -> (Vec<QuotaPool>, Vec<Vec<usize>>) {
        let mut pools: Vec<QuotaPool> = Vec::new();
        let mut index: HashMap<(String, String), usize> = HashMap::new();
        let per_group = offerings
            .iter()
            .map(|o| {
                let Some(o) = o else { return Vec::new() };
                let Some(usages) = self.get(&o.location) else {
                    return Vec::new();
                };
                pools_of(o)
                    .into_iter()
                    .filter_map(|name| {
                        let remaining = usages.remaining(&name)?;
                        let key = (o.location.clone(), name.to_ascii_lowercase());
                        Some(*index.entry(key).or_insert_with(|| {
                            pools.push(QuotaPool {
                                location: o.location.clone(),
                                name,
                                remaining,
                            });
                            pools.len() - 1
                        }))
                    })
                    .collect()
            })
            .collect();
        (pools, per_group)
    }

    /// Every region read, with its usages, for the metrics.
    pub fn all(&self) -> Vec<(String, Arc<Usages>)> {
        self.entries
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl Usages {
    /// Every row: `(name, remaining)`.
    pub fn rows(&self) -> impl Iterator<Item = (&str, i64)> {
        self.rows
            .iter()
            .map(|(n, (current, limit))| (n.as_str(), (limit - current).max(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usages() -> Vec<Usage> {
        vec![
            Usage {
                name: "cores".into(),
                current: 40,
                limit: 100,
            },
            Usage {
                name: "standardDSv5Family".into(),
                current: 8,
                limit: 10,
            },
            Usage {
                name: "lowPriorityCores".into(),
                current: 0,
                limit: 20,
            },
            Usage {
                name: "standardESv5Family".into(),
                current: 12,
                limit: 10,
            },
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn regular_groups_draw_from_their_family_and_the_region_and_spot_from_the_spot_total() {
        let cache = QuotaCache::new(Duration::from_secs(60));
        cache.insert("westeurope", Usages::new(&usages(), Instant::now()));
        let d2 = Offering::new("WestEurope", "Standard_D2s_v5", &[], false);
        let d4 = Offering::new("westeurope", "Standard_D4s_v5", &[], false);
        let spot = Offering::new("westeurope", "Standard_D4s_v5", &[], true);
        let e4 = Offering::new("westeurope", "Standard_E4s_v5", &[], false);
        let unread = Offering::new("northeurope", "Standard_D4s_v5", &[], false);
        let (pools, per_group) =
            cache.pools(&[Some(d2), Some(d4), Some(spot), Some(e4), Some(unread), None]);
        let names: Vec<(&str, i64)> = pools
            .iter()
            .map(|p| (p.name.as_str(), p.remaining))
            .collect();
        assert_eq!(
            names,
            [
                ("cores", 60),
                ("standardDSv5Family", 2),
                ("lowPriorityCores", 20),
                ("standardESv5Family", 0)
            ]
        );
        // The two DSv5 groups share one family pool; an over-used family has 0 left.
        assert_eq!(
            per_group,
            vec![vec![0, 1], vec![0, 1], vec![2], vec![0, 3], vec![], vec![]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_region_is_read_again_after_its_ttl_or_at_once_after_a_quota_refusal() {
        let cache = QuotaCache::new(Duration::from_secs(60));
        assert!(cache.due("westeurope", 1.0));
        cache.insert("westeurope", Usages::new(&usages(), Instant::now()));
        assert!(!cache.due("WestEurope", 1.0));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!cache.due("westeurope", 1.0));
        cache.invalidate("westeurope");
        assert!(cache.due("westeurope", 1.0));
        cache.insert("westeurope", Usages::new(&usages(), Instant::now()));
        assert!(!cache.due("westeurope", 1.0));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(cache.due("westeurope", 1.0));
        // The last read is kept (and used) until a new one lands; a failed read waits a TTL.
        cache.attempted("westeurope", Instant::now());
        assert!(!cache.due("westeurope", 1.0));
        assert!(cache.get("westeurope").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_sent_before_a_quota_refusal_does_not_answer_it() {
        let cache = QuotaCache::new(Duration::from_secs(60));
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        // The refusal comes while that read is on its way; then the read lands.
        cache.invalidate("westeurope");
        tokio::time::advance(Duration::from_millis(100)).await;
        cache.insert("westeurope", Usages::new(&usages(), sent));
        assert!(
            cache.due("westeurope", 1.0),
            "the read predates the refusal: read again"
        );
        cache.insert("westeurope", Usages::new(&usages(), Instant::now()));
        assert!(!cache.due("westeurope", 1.0));
    }
}
