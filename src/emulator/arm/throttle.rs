//! Token buckets like Azure Compute's: per scale set (reads, writes) and per subscription.
//!
//! Buckets refill lazily on the tokio clock, so tests can `pause()` and `advance()` through them.

use std::collections::HashMap;
use tokio::time::Instant;

/// Refill rates (per minute) and burst sizes of the emulator's token buckets.
#[derive(Clone, Copy, Debug)]
pub struct ThrottleLimits {
    /// Writes per minute refilled into each scale set's write bucket.
    pub vmss_write_per_min: f64,
    /// Capacity of each scale set's write bucket.
    pub vmss_write_burst: u32,
    /// Reads per minute refilled into each scale set's read bucket.
    pub vmss_read_per_min: f64,
    /// Capacity of each scale set's read bucket.
    pub vmss_read_burst: u32,
    /// Writes per minute refilled into each subscription's write bucket.
    pub sub_write_per_min: f64,
    /// Capacity of each subscription's write bucket.
    pub sub_write_burst: u32,
    /// Reads per minute refilled into each subscription's read bucket.
    pub sub_read_per_min: f64,
    /// Capacity of each subscription's read bucket.
    pub sub_read_burst: u32,
    /// Deletes per minute refilled into each subscription's delete bucket (instance deletes by
    /// name, `DELETE`).
    pub sub_delete_per_min: f64,
    /// Capacity of each subscription's delete bucket.
    pub sub_delete_burst: u32,
}

/// What a request pays from: the subscription's read, write or delete bucket (and a scale
/// set's read or write bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    Read,
    Write,
    Delete,
}

impl ThrottleLimits {
    /// Azure Compute's documented shape: 4/min burst 12 writes and 12/min burst 36 reads per scale
    /// set; 500/min burst 1500 writes, 800/min burst 2400 reads and 175/min burst 525 deletes per
    /// subscription.
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
            sub_delete_per_min: 175.0,
            sub_delete_burst: 525,
        }
    }

    /// The same limits with the subscription's buckets (rates and bursts) at `f` of their size,
    /// each at least 1: a fleet of a few clients near the subscription's limit.
    pub fn subscription_scaled(self, f: f64) -> Self {
        let burst = |b: u32| ((f64::from(b) * f).round() as u32).max(1);
        ThrottleLimits {
            sub_write_per_min: self.sub_write_per_min * f,
            sub_write_burst: burst(self.sub_write_burst),
            sub_read_per_min: self.sub_read_per_min * f,
            sub_read_burst: burst(self.sub_read_burst),
            sub_delete_per_min: self.sub_delete_per_min * f,
            sub_delete_burst: burst(self.sub_delete_burst),
            ..self
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

/// All token buckets, keyed by scope.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    buckets: HashMap<String, Bucket>,
}

impl Throttle {
    /// Takes one token from the subscription bucket (and the scale set's, when `vmss` is given),
    /// or none at all when any of them is empty.
    pub fn admit(
        &mut self,
        limits: Option<&ThrottleLimits>,
        sub: &str,
        vmss: Option<&str>,
        spend: Spend,
        now: Instant,
    ) -> Admission {
        let write = spend != Spend::Read;
        let resource_header = |remaining: u64| {
            let op = match spend {
                Spend::Read => "GetVMScaleSet3Min",
                Spend::Write => "UpdateVMScaleSet3Min",
                Spend::Delete => "DeleteVMScaleSetVMs3Min",
            };
            format!("Microsoft.Compute/{op};{remaining}")
        };
        let sub_header = match spend {
            Spend::Read => "x-ms-ratelimit-remaining-subscription-reads",
            Spend::Write => "x-ms-ratelimit-remaining-subscription-writes",
            Spend::Delete => "x-ms-ratelimit-remaining-subscription-deletes",
        };
        let Some(limits) = limits else {
            // Throttling off: advertise the nominal budgets without consuming them.
            let nominal = ThrottleLimits::azure_compute();
            let mut headers = vec![(
                sub_header,
                match spend {
                    Spend::Read => nominal.sub_read_burst,
                    Spend::Write => nominal.sub_write_burst,
                    Spend::Delete => nominal.sub_delete_burst,
                }
                .to_string(),
            )];
            if vmss.is_some() {
                let burst = if write {
                    nominal.vmss_write_burst
                } else {
                    nominal.vmss_read_burst
                };
                headers.push((
                    "x-ms-ratelimit-remaining-resource",
                    resource_header(u64::from(burst)),
                ));
            }
            return Admission {
                headers,
                retry_after: None,
            };
        };
        let (kind, sub_rate, sub_burst) = match spend {
            Spend::Read => ("r", limits.sub_read_per_min, limits.sub_read_burst),
            Spend::Write => ("w", limits.sub_write_per_min, limits.sub_write_burst),
            Spend::Delete => ("d", limits.sub_delete_per_min, limits.sub_delete_burst),
        };
        let sub_key = format!("sub|{}|{kind}", sub.to_ascii_lowercase());
        let (vm_kind, vm_rate, vm_burst) = if write {
            ("w", limits.vmss_write_per_min, limits.vmss_write_burst)
        } else {
            ("r", limits.vmss_read_per_min, limits.vmss_read_burst)
        };
        let mut keys = vec![(sub_key, sub_rate, sub_burst)];
        if let Some(v) = vmss {
            keys.push((format!("vmss|{v}|{vm_kind}"), vm_rate, vm_burst));
        }
        let mut wait = 0;
        for (key, rate, burst) in &keys {
            let b = self
                .buckets
                .entry(key.clone())
                .or_insert_with(|| Bucket::new(*rate, *burst, now));
            b.refill(now);
            wait = wait.max(b.wait_secs());
        }
        let admitted = wait == 0;
        let mut headers = Vec::new();
        for (i, (key, _, _)) in keys.iter().enumerate() {
            let Some(b) = self.buckets.get_mut(key) else {
                continue;
            };
            if admitted {
                b.tokens -= 1.0;
            }
            if i == 0 {
                headers.push((sub_header, b.remaining().to_string()));
            } else {
                headers.push((
                    "x-ms-ratelimit-remaining-resource",
                    resource_header(b.remaining()),
                ));
            }
        }
        Admission {
            headers,
            retry_after: (!admitted).then_some(wait),
        }
    }
}
