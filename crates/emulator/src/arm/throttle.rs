//! Token buckets like Azure's, in the layers a request passes (learn.microsoft.com: "Request
//! limits and throttling", "Compute throttling limits", AKS's "Quotas, virtual machine size
//! restrictions, and region availability"):
//!
//! 1. **Azure Resource Manager**, per subscription: reads, writes and deletes, whatever the
//!    provider (scale sets, AKS, operations). Reported in
//!    `x-ms-ratelimit-remaining-subscription-reads` / `-writes` / `-deletes`.
//! 2. **Compute, per subscription and region**: the bucket every client of the subscription
//!    shares in one region (scale-set update, instance delete, low-cost GET, high-cost GET and
//!    LIST). Reported as `x-ms-ratelimit-remaining-resource: Microsoft.Compute/<policy>;<count>`.
//!    This is the bucket a fleet of clusters in one subscription and region runs out of (Azure/AKS
//!    #1413, #1187: `HighCostGetVMScaleSet30Min`).
//! 3. **Compute, per scale set**: 4/min burst 12 updates and deletes, 12/min burst 36 reads. Not
//!    reported (Azure's documented samples show only the subscription's policies); a 429 from it
//!    carries `Retry-After` like any other.
//! 4. **AKS's resource provider** ([`AksLimits`]), beside Compute for requests to
//!    `Microsoft.ContainerService`. AKS's quotas page ("Throttling limits on AKS resource provider
//!    APIs", MicrosoftDocs/azure-aks-docs `articles/aks/quotas-skus-regions.md`) documents token
//!    buckets "in effect at the regional level for the specified resource": PUT per agent pool 20
//!    refilled 1 per minute, PUT per managed cluster the same, LIST per subscription 500 refilled
//!    1 per second; "the ManagedClusters and AgentPools bucket are counted separately for the same
//!    Managed Cluster", so a pool's write never spends its cluster's bucket (nor a cluster's
//!    write its pools'). A throttled request answers 429 with the error code `Throttled` and a
//!    `Retry-After` in seconds; the message follows the one AKS's troubleshooting article quotes
//!    ("The PutManagedClusterHandler.PUT request limit has been exceeded for SubID='...', please
//!    retry again in X seconds. For more information, please visit aka.ms/aks/throttling"); the
//!    other handler names are modelled on it. AKS documents no header with its remaining counts,
//!    so none is sent: its answers carry ARM's, which admitted the request first.
//!
//!    Where the sources leave it open, the emulator chooses and says so: the page names PUT only;
//!    here every write that changes one pool (PUT, PATCH, DELETE, `deleteMachines`) spends that
//!    pool's bucket, and every write of the cluster resource its cluster's, the stricter reading.
//!    The page names LIST only; here GETs of a cluster or a pool spend the subscription's LIST
//!    bucket too (a secondary, generated summary, api-evangelist's "azure kubernetes service rate
//!    limits", lists separate GET buckets of 60 refilled 1 per second per cluster; it is not
//!    followed: it cites the same page, which has no such row). Operation polls are not charged to
//!    AKS.
//!
//! ARM admits a request before Compute or AKS sees it: a 429 from ARM spends nothing; a 429 from
//! Compute or AKS has spent ARM's token. AKS's operation polls pass ARM only (Compute's operation
//! bucket, 5,000/min, never binds here).
//!
//! Buckets refill lazily on the tokio clock, so tests can `pause()` and `advance()` through them.
//! A wait is reported in whole seconds, rounded up (at least 1), as `Retry-After` is.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tokio::time::Instant;

/// Refill rates (per minute) and burst sizes of the emulator's token buckets.
#[derive(Clone, Copy, Debug)]
pub struct ThrottleLimits {
    /// Updates (and, in their own bucket, deletes) per minute refilled into each scale set's
    /// bucket.
    pub vmss_write_per_min: f64,
    /// Capacity of each scale set's update (and delete) bucket.
    pub vmss_write_burst: u32,
    /// Reads per minute refilled into each scale set's read bucket.
    pub vmss_read_per_min: f64,
    /// Capacity of each scale set's read bucket.
    pub vmss_read_burst: u32,
    /// Compute, per subscription and region: scale-set updates per minute.
    pub sub_write_per_min: f64,
    /// Compute, per subscription and region: capacity of the update bucket.
    pub sub_write_burst: u32,
    /// Compute, per subscription and region: low-cost GETs (one scale set, usages) per minute.
    pub sub_read_per_min: f64,
    /// Compute, per subscription and region: capacity of the low-cost GET bucket.
    pub sub_read_burst: u32,
    /// Compute, per subscription and region: high-cost GETs (LISTs of scale sets or of a scale
    /// set's instances) per minute.
    pub sub_list_per_min: f64,
    /// Compute, per subscription and region: capacity of the high-cost GET bucket.
    pub sub_list_burst: u32,
    /// Compute, per subscription and region: instance deletes per minute.
    pub sub_delete_per_min: f64,
    /// Compute, per subscription and region: capacity of the delete bucket.
    pub sub_delete_burst: u32,
    /// ARM, per subscription: reads per minute.
    pub arm_read_per_min: f64,
    /// ARM, per subscription: capacity of the read bucket.
    pub arm_read_burst: u32,
    /// ARM, per subscription: writes per minute.
    pub arm_write_per_min: f64,
    /// ARM, per subscription: capacity of the write bucket.
    pub arm_write_burst: u32,
    /// ARM, per subscription: deletes per minute.
    pub arm_delete_per_min: f64,
    /// ARM, per subscription: capacity of the delete bucket.
    pub arm_delete_burst: u32,
    /// AKS's resource provider (`None`: not enforced). [`ThrottleLimits::azure_compute`] has
    /// [`AksLimits::aks`].
    pub aks: Option<AksLimits>,
}

/// The buckets of AKS's resource provider (learn.microsoft.com, AKS quotas page: "Throttling
/// limits on AKS resource provider APIs"), each in effect per region for its resource.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AksLimits {
    /// Writes per minute refilled into each agent pool's bucket (PUT, PATCH, DELETE and
    /// `deleteMachines` of that pool).
    pub pool_write_per_min: f64,
    /// Capacity of each agent pool's write bucket.
    pub pool_write_burst: u32,
    /// Writes per minute refilled into each managed cluster's bucket (PUT, PATCH, DELETE of the
    /// cluster resource; a pool's write does not spend it).
    pub cluster_write_per_min: f64,
    /// Capacity of each managed cluster's write bucket.
    pub cluster_write_burst: u32,
    /// LISTs and GETs of managed clusters and agent pools per minute, per subscription in a
    /// region.
    pub list_per_min: f64,
    /// Capacity of the subscription's LIST bucket in a region.
    pub list_burst: u32,
}

impl AksLimits {
    /// AKS's documented shape: PUT per agent pool 20 refilled 1/min, PUT per managed cluster 20
    /// refilled 1/min, LIST per subscription 500 refilled 1/s.
    pub fn aks() -> Self {
        AksLimits {
            pool_write_per_min: 1.0,
            pool_write_burst: 20,
            cluster_write_per_min: 1.0,
            cluster_write_burst: 20,
            list_per_min: 60.0,
            list_burst: 500,
        }
    }

    /// The same limits with every rate and bucket at `f` of its size, each bucket at least 1:
    /// `scaled(0.25)` leaves a pool 5 writes refilled one per 4 minutes, so a test reaches the
    /// limit in fewer requests. `f` must be positive.
    pub fn scaled(self, f: f64) -> Self {
        let burst = |b: u32| ((f64::from(b) * f).round() as u32).max(1);
        AksLimits {
            pool_write_per_min: self.pool_write_per_min * f,
            pool_write_burst: burst(self.pool_write_burst),
            cluster_write_per_min: self.cluster_write_per_min * f,
            cluster_write_burst: burst(self.cluster_write_burst),
            list_per_min: self.list_per_min * f,
            list_burst: burst(self.list_burst),
        }
    }
}

/// Which of AKS's buckets a request to `Microsoft.ContainerService` spends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AksBucket {
    /// A write of one agent pool.
    Pool,
    /// A write of the managed cluster resource.
    Cluster,
    /// A LIST or GET of managed clusters or agent pools.
    List,
}

/// What an AKS request is charged to: its bucket, the subscription, region and resource it
/// belongs to, and the handler AKS names in its message.
#[derive(Clone, Debug)]
pub(crate) struct AksCharge {
    pub bucket: AksBucket,
    pub sub: String,
    pub location: String,
    /// Lowercased id of the pool or cluster (unused for [`AksBucket::List`]).
    pub resource: String,
    /// `PutAgentPoolHandler.PUT` and the like.
    pub handler: String,
}

impl AksCharge {
    /// The 429 message AKS answers with when this charge finds its bucket empty.
    pub fn message(&self, retry_after: u64) -> String {
        format!(
            "The {} request limit has been exceeded for SubID='{}', please retry again in {retry_after} seconds. For more information, please visit aka.ms/aks/throttling",
            self.handler, self.sub
        )
    }
}

/// What a request pays for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    /// A GET of one resource (Compute's low-cost GET).
    Read,
    /// A LIST (Compute's high-cost GET).
    List,
    /// PUT, PATCH, POST other than deletes.
    Write,
    /// DELETE, and POSTs that delete instances.
    Delete,
}

/// Where a Compute request is charged besides ARM: its region, and the scale set it targets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ComputeTarget<'a> {
    pub location: &'a str,
    pub vmss: Option<&'a str>,
}

impl ThrottleLimits {
    /// Azure's documented shape. Compute per scale set: 4/min burst 12 updates and deletes,
    /// 12/min burst 36 reads. Compute per subscription and region: updates 500/min burst 1,500,
    /// deletes 175/min burst 525, low-cost GETs 800/min burst 2,400, high-cost GETs 360/min burst
    /// 1,080. ARM per subscription: reads 25/s burst 250, writes and deletes 10/s burst 200.
    /// AKS's resource provider: [`AksLimits::aks`].
    pub fn azure_compute() -> Self {
        ThrottleLimits {
            vmss_write_per_min: 4.0,
            vmss_write_burst: 12,
            vmss_read_per_min: 12.0,
            vmss_read_burst: 36,
            sub_write_per_min: 500.0,
            sub_write_burst: 1500,
            sub_read_per_min: 800.0,
            sub_read_burst: 2400,
            sub_list_per_min: 360.0,
            sub_list_burst: 1080,
            sub_delete_per_min: 175.0,
            sub_delete_burst: 525,
            arm_read_per_min: 1500.0,
            arm_read_burst: 250,
            arm_write_per_min: 600.0,
            arm_write_burst: 200,
            arm_delete_per_min: 600.0,
            arm_delete_burst: 200,
            aks: Some(AksLimits::aks()),
        }
    }

    /// The same limits with Compute's subscription-and-region buckets (rates and bursts) at `f`
    /// of their size, each at least 1: a fleet of a few clients near the limit it shares. ARM's
    /// buckets and the scale sets' own stay Azure's.
    pub fn subscription_scaled(self, f: f64) -> Self {
        let burst = |b: u32| ((f64::from(b) * f).round() as u32).max(1);
        ThrottleLimits {
            sub_write_per_min: self.sub_write_per_min * f,
            sub_write_burst: burst(self.sub_write_burst),
            sub_read_per_min: self.sub_read_per_min * f,
            sub_read_burst: burst(self.sub_read_burst),
            sub_list_per_min: self.sub_list_per_min * f,
            sub_list_burst: burst(self.sub_list_burst),
            sub_delete_per_min: self.sub_delete_per_min * f,
            sub_delete_burst: burst(self.sub_delete_burst),
            ..self
        }
    }

    /// ARM's bucket for `spend`: (header, key letter, per minute, burst).
    fn arm(&self, spend: Spend) -> (&'static str, char, f64, u32) {
        match spend {
            Spend::Read | Spend::List => (
                "x-ms-ratelimit-remaining-subscription-reads",
                'r',
                self.arm_read_per_min,
                self.arm_read_burst,
            ),
            Spend::Write => (
                "x-ms-ratelimit-remaining-subscription-writes",
                'w',
                self.arm_write_per_min,
                self.arm_write_burst,
            ),
            Spend::Delete => (
                "x-ms-ratelimit-remaining-subscription-deletes",
                'd',
                self.arm_delete_per_min,
                self.arm_delete_burst,
            ),
        }
    }

    /// Compute's subscription-and-region bucket for `spend`: (policy, key letter, per minute,
    /// burst).
    fn region(&self, spend: Spend) -> (&'static str, char, f64, u32) {
        match spend {
            Spend::Read => (
                "GetVMScaleSet3Min",
                'r',
                self.sub_read_per_min,
                self.sub_read_burst,
            ),
            Spend::List => (
                "HighCostGetVMScaleSet3Min",
                'l',
                self.sub_list_per_min,
                self.sub_list_burst,
            ),
            Spend::Write => (
                "UpdateVMScaleSet3Min",
                'w',
                self.sub_write_per_min,
                self.sub_write_burst,
            ),
            Spend::Delete => (
                "DeleteVMScaleSetVMs3Min",
                'd',
                self.sub_delete_per_min,
                self.sub_delete_burst,
            ),
        }
    }

    /// A scale set's own bucket for `spend`: (key letter, per minute, burst).
    fn resource(&self, spend: Spend) -> (char, f64, u32) {
        match spend {
            Spend::Read | Spend::List => ('r', self.vmss_read_per_min, self.vmss_read_burst),
            Spend::Write => ('w', self.vmss_write_per_min, self.vmss_write_burst),
            Spend::Delete => ('d', self.vmss_write_per_min, self.vmss_write_burst),
        }
    }
}
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    per_sec: f64,
    burst: f64,
}

impl Bucket {
    fn new(per_min: f64, burst: u32, now: Instant) -> Self {
        Bucket {
            tokens: f64::from(burst),
            last: now,
            per_sec: per_min / 60.0,
            burst: f64::from(burst),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        self.last = now;
    }

    fn wait_secs(&self) -> u64 {
        if self.tokens >= 1.0 {
            return 0;
        }
        if self.per_sec <= 0.0 {
            return 60;
        }
        ((1.0 - self.tokens) / self.per_sec).ceil().max(1.0) as u64
    }

    fn remaining(&self) -> u64 {
        self.tokens.max(0.0).floor() as u64
    }
}

/// What the throttle decided for one request: headers to add, and `Some(secs)` when refused.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    pub headers: Vec<(&'static str, String)>,
    pub retry_after: Option<u64>,
}

/// All token buckets, keyed by layer and scope.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    buckets: HashMap<String, Bucket>,
    /// AKS's limits as the control API set them (`Some(None)`: off); `None`: as started.
    aks_override: Option<Option<AksLimits>>,
}

impl Throttle {
    /// AKS's limits in force: the control API's, else those the emulator started with.
    pub fn aks_limits(&self, started: Option<AksLimits>) -> Option<AksLimits> {
        self.aks_override.unwrap_or(started)
    }

    /// Sets AKS's limits (`None`: off) until a reset; AKS's buckets start full again.
    pub fn set_aks_limits(&mut self, limits: Option<AksLimits>) {
        self.aks_override = Some(limits);
        self.buckets.retain(|k, _| !k.starts_with("aks|"));
    }

    /// Admits a request to AKS's resource provider, or refuses it with the seconds until its
    /// bucket holds a token again (whole seconds, rounded up). Nothing is charged with `limits`
    /// off.
    pub fn admit_aks(
        &mut self,
        limits: Option<&AksLimits>,
        charge: &AksCharge,
        now: Instant,
    ) -> Option<u64> {
        let limits = limits?;
        let sub = charge.sub.to_ascii_lowercase();
        let key = match charge.bucket {
            AksBucket::Pool => (
                format!("aks|pool|{}", charge.resource),
                limits.pool_write_per_min,
                limits.pool_write_burst,
            ),
            AksBucket::Cluster => (
                format!("aks|cluster|{}", charge.resource),
                limits.cluster_write_per_min,
                limits.cluster_write_burst,
            ),
            AksBucket::List => (
                format!("aks|list|{sub}|{}", charge.location.to_ascii_lowercase()),
                limits.list_per_min,
                limits.list_burst,
            ),
        };
        let (wait, _) = self.take(&[key], now);
        (wait > 0).then_some(wait)
    }

    /// Admits a request of `spend` in subscription `sub` (to Compute when `compute` is given), or
    /// refuses it with the longest wait among the empty buckets of the first layer that refuses.
    /// A refused layer spends nothing; ARM's token is spent when Compute refuses.
    pub fn admit(
        &mut self,
        limits: Option<&ThrottleLimits>,
        sub: &str,
        compute: Option<ComputeTarget<'_>>,
        spend: Spend,
        now: Instant,
    ) -> Admission {
        let Some(limits) = limits else {
            // Throttling off: advertise the nominal budgets without consuming them.
            let nominal = ThrottleLimits::azure_compute();
            let (header, _, _, burst) = nominal.arm(spend);
            let mut headers = vec![(header, burst.to_string())];
            if compute.is_some() {
                let (policy, _, _, burst) = nominal.region(spend);
                headers.push((
                    "x-ms-ratelimit-remaining-resource",
                    format!("Microsoft.Compute/{policy};{burst}"),
                ));
            }
            return Admission {
                headers,
                retry_after: None,
            };
        };
        let sub = sub.to_ascii_lowercase();
        let mut headers = Vec::new();
        // ARM first: a request it refuses never reaches Compute.
        let (header, kind, rate, burst) = limits.arm(spend);
        let arm = [(format!("arm|{sub}|{kind}"), rate, burst)];
        let (wait, left) = self.take(&arm, now);
        headers.push((header, left[0].to_string()));
        if wait > 0 {
            return Admission {
                headers,
                retry_after: Some(wait),
            };
        }
        let Some(target) = compute else {
            return Admission {
                headers,
                retry_after: None,
            };
        };
        let (policy, kind, rate, burst) = limits.region(spend);
        let location = target.location.to_ascii_lowercase();
        let mut keys = vec![(format!("region|{sub}|{location}|{kind}"), rate, burst)];
        if let Some(v) = target.vmss {
            let (kind, rate, burst) = limits.resource(spend);
            keys.push((format!("vmss|{v}|{kind}"), rate, burst));
        }
        let (wait, left) = self.take(&keys, now);
        headers.push((
            "x-ms-ratelimit-remaining-resource",
            format!("Microsoft.Compute/{policy};{}", left[0]),
        ));
        Admission {
            headers,
            retry_after: (wait > 0).then_some(wait),
        }
    }

    /// Takes one token from each of `keys`' buckets, or none when any is empty. Returns the
    /// longest wait (0: taken) and what each bucket has left.
    fn take(&mut self, keys: &[(String, f64, u32)], now: Instant) -> (u64, Vec<u64>) {
        let mut wait = 0;
        for (key, rate, burst) in keys {
            let b = self
                .buckets
                .entry(key.clone())
                .or_insert_with(|| Bucket::new(*rate, *burst, now));
            b.refill(now);
            wait = wait.max(b.wait_secs());
        }
        let left = keys
            .iter()
            .map(|(key, _, _)| {
                self.buckets.get_mut(key).map_or(0, |b| {
                    if wait == 0 {
                        b.tokens -= 1.0;
                    }
                    b.remaining()
                })
            })
            .collect();
        (wait, left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn charge(bucket: AksBucket, resource: &str) -> AksCharge {
        AksCharge {
            bucket,
            sub: "Sub-1".into(),
            location: "westeurope".into(),
            resource: resource.into(),
            handler: "PutAgentPoolHandler.PUT".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pools_bucket_holds_twenty_writes_refills_one_a_minute_and_a_refusal_spends_nothing()
    {
        let limits = AksLimits::aks();
        let mut t = Throttle::default();
        let pool = charge(AksBucket::Pool, "c/a");
        let now = Instant::now();
        for i in 0..20 {
            assert_eq!(t.admit_aks(Some(&limits), &pool, now), None, "write {i}");
        }
        assert_eq!(t.admit_aks(Some(&limits), &pool, now), Some(60));
        assert_eq!(
            t.admit_aks(Some(&limits), &pool, now),
            Some(60),
            "a refused request takes no token"
        );
        tokio::time::advance(Duration::from_secs(45)).await;
        assert_eq!(
            t.admit_aks(Some(&limits), &pool, Instant::now()),
            Some(15),
            "three quarters of a token refilled"
        );
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(t.admit_aks(Some(&limits), &pool, Instant::now()), None);
        assert_eq!(t.admit_aks(Some(&limits), &pool, Instant::now()), Some(60));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_wait_for_a_whole_token_rounded_up_to_whole_seconds_and_at_least_one(
    ) {
        // 7 a minute: a token every 8.57 s.
        let limits = AksLimits {
            pool_write_per_min: 7.0,
            pool_write_burst: 1,
            ..AksLimits::aks()
        };
        let mut t = Throttle::default();
        let pool = charge(AksBucket::Pool, "c/a");
        assert_eq!(t.admit_aks(Some(&limits), &pool, Instant::now()), None);
        assert_eq!(
            t.admit_aks(Some(&limits), &pool, Instant::now()),
            Some(9),
            "8.57 s rounds up to 9"
        );
        tokio::time::advance(Duration::from_millis(8_500)).await;
        assert_eq!(
            t.admit_aks(Some(&limits), &pool, Instant::now()),
            Some(1),
            "70 ms left: still a whole second"
        );
        tokio::time::advance(Duration::from_millis(80)).await;
        assert_eq!(t.admit_aks(Some(&limits), &pool, Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pool_and_its_cluster_are_counted_separately_and_lists_per_subscription_and_region() {
        let limits = AksLimits {
            pool_write_burst: 1,
            cluster_write_burst: 1,
            list_burst: 2,
            ..AksLimits::aks()
        };
        let mut t = Throttle::default();
        let now = Instant::now();
        assert_eq!(
            t.admit_aks(Some(&limits), &charge(AksBucket::Pool, "c/a"), now),
            None
        );
        assert_eq!(
            t.admit_aks(Some(&limits), &charge(AksBucket::Cluster, "c"), now),
            None,
            "the pool's write did not spend its cluster's bucket"
        );
        assert_eq!(
            t.admit_aks(Some(&limits), &charge(AksBucket::Pool, "c/b"), now),
            None,
            "each pool has its own"
        );
        assert_eq!(
            t.admit_aks(Some(&limits), &charge(AksBucket::Pool, "c/a"), now),
            Some(60)
        );
        assert_eq!(
            t.admit_aks(Some(&limits), &charge(AksBucket::Cluster, "c"), now),
            Some(60)
        );
        let mut list = charge(AksBucket::List, "");
        assert_eq!(t.admit_aks(Some(&limits), &list, now), None);
        list.sub = "SUB-1".into();
        assert_eq!(
            t.admit_aks(Some(&limits), &list, now),
            None,
            "subscriptions compare without case"
        );
        assert_eq!(
            t.admit_aks(Some(&limits), &list, now),
            Some(1),
            "LISTs refill one a second"
        );
        list.location = "northeurope".into();
        assert_eq!(
            t.admit_aks(Some(&limits), &list, now),
            None,
            "another region's bucket"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn aks_limits_set_from_outside_win_over_the_start_and_begin_full() {
        let mut t = Throttle::default();
        let pool = charge(AksBucket::Pool, "c/a");
        let started = AksLimits::aks().scaled(0.05);
        assert_eq!(started.pool_write_burst, 1);
        assert_eq!(started.list_burst, 25);
        assert_eq!(t.aks_limits(None), None, "off unless started or set");
        let limits = t.aks_limits(Some(started));
        assert_eq!(limits, Some(started));
        let now = Instant::now();
        assert_eq!(t.admit_aks(limits.as_ref(), &pool, now), None);
        assert!(t.admit_aks(limits.as_ref(), &pool, now).is_some());
        t.set_aks_limits(Some(started));
        assert_eq!(
            t.admit_aks(t.aks_limits(None).as_ref(), &pool, now),
            None,
            "set again: the buckets start full"
        );
        t.set_aks_limits(None);
        assert_eq!(t.aks_limits(Some(started)), None, "turned off from outside");
        assert_eq!(t.admit_aks(None, &pool, now), None, "off: nothing refused");
    }

    #[test]
    fn the_429_message_is_aks_own_with_the_handler_the_subscription_and_the_seconds() {
        assert_eq!(
            charge(AksBucket::Pool, "c/a").message(42),
            "The PutAgentPoolHandler.PUT request limit has been exceeded for SubID='Sub-1', please retry again in 42 seconds. For more information, please visit aka.ms/aks/throttling"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_admitted_write_reports_what_is_left_of_arms_bucket_and_a_refused_one_spent_it() {
        let limits = ThrottleLimits {
            arm_write_burst: 2,
            ..ThrottleLimits::azure_compute()
        };
        let mut t = Throttle::default();
        let now = Instant::now();
        let a = t.admit(Some(&limits), "s", None, Spend::Write, now);
        assert_eq!(
            a.headers,
            vec![(
                "x-ms-ratelimit-remaining-subscription-writes",
                "1".to_string()
            )]
        );
        assert_eq!(a.retry_after, None);
        let b = t.admit(Some(&limits), "s", None, Spend::Write, now);
        assert_eq!(b.headers[0].1, "0");
        let c = t.admit(Some(&limits), "s", None, Spend::Write, now);
        assert_eq!(
            c.retry_after,
            Some(1),
            "10 a second: a tenth of a second, rounded up"
        );
        assert_eq!(c.headers[0].1, "0");
    }
}
