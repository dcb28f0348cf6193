//! Token buckets like Azure's, in the three layers a request to Compute passes
//! (learn.microsoft.com: "Request limits and throttling", "Compute throttling limits"):
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
//!
//! ARM admits a request before Compute sees it: a 429 from ARM spends nothing; a 429 from Compute
//! has spent ARM's token. AKS's API and operation polls pass ARM only (Compute's operation
//! bucket, 5,000/min, never binds here).
//!
//! Buckets refill lazily on the tokio clock, so tests can `pause()` and `advance()` through them.

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
}

impl Throttle {
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
