//! The subscription's vCPU quota, as Azure Compute keeps it per region: a usages table
//! (`GET /subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}/usages`) whose
//! current values are what the scale sets hold, and the refusal a write gets when its growth
//! would pass a limit (409 `OperationNotAllowed`, in Azure's words).
//!
//! Limits are set per subscription, region and usage name (a VM family such as
//! `standardDSv5Family`, `cores` for the regional total, `lowPriorityCores` for spot, which
//! draws on nothing else); a name never set is unlimited for the emulator and listed with
//! [`DEFAULT_LIMIT`].

use super::state::ScaleSet;
use super::Reply;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use vm_sizes::vm_size;

/// The limit listed for a usage no test set (large enough never to bind).
pub const DEFAULT_LIMIT: i64 = 100_000;

/// Limits per `(subscription, region)`, by lowercase usage name: `(name as set, limit)`.
#[derive(Debug, Default)]
pub(crate) struct QuotaTable {
    limits: HashMap<(String, String), BTreeMap<String, (String, i64)>>,
}

fn key(sub: &str, location: &str) -> (String, String) {
    (sub.to_ascii_lowercase(), location.to_ascii_lowercase())
}

impl QuotaTable {
    /// Sets the limit of usage `name` in `sub`'s `location`.
    pub fn set(&mut self, sub: &str, location: &str, name: &str, limit: i64) {
        self.limits
            .entry(key(sub, location))
            .or_default()
            .insert(name.to_ascii_lowercase(), (name.to_string(), limit));
    }

    fn limit(&self, sub: &str, location: &str, name: &str) -> Option<i64> {
        self.limits
            .get(&key(sub, location))?
            .get(&name.to_ascii_lowercase())
            .map(|(_, l)| *l)
    }

    /// vCPUs in use per usage name (lowercase → (name, vCPUs)) in `sub`'s `location`.
    fn in_use<'a>(
        scale_sets: impl Iterator<Item = &'a ScaleSet>,
        sub: &str,
        location: &str,
    ) -> BTreeMap<String, (String, i64)> {
        let mut used: BTreeMap<String, (String, i64)> = BTreeMap::new();
        let mut add = |name: &str, n: i64| {
            used.entry(name.to_ascii_lowercase())
                .or_insert_with(|| (name.to_string(), 0))
                .1 += n;
        };
        add("cores", 0);
        add("lowPriorityCores", 0);
        for ss in scale_sets.filter(|s| {
            s.sub.eq_ignore_ascii_case(sub) && s.location.eq_ignore_ascii_case(location)
        }) {
            let Some(size) = vm_size(&ss.sku_name) else {
                continue;
            };
            let n = ss.capacity.max(0) * i64::from(size.vcpu);
            if ss.spot() {
                // Spot draws on its own regional total only, as Azure counts it.
                add("lowPriorityCores", n);
            } else {
                add("cores", n);
                add(size.family, n);
            }
        }
        used
    }

    /// The usages list's `value`: every usage in use or given a limit.
    pub fn usages<'a>(
        &self,
        scale_sets: impl Iterator<Item = &'a ScaleSet>,
        sub: &str,
        location: &str,
    ) -> Vec<Value> {
        let mut rows = Self::in_use(scale_sets, sub, location);
        if let Some(set) = self.limits.get(&key(sub, location)) {
            for (low, (name, _)) in set {
                rows.entry(low.clone()).or_insert_with(|| (name.clone(), 0));
            }
        }
        rows.into_values()
            .map(|(name, current)| {
                let limit = self.limit(sub, location, &name).unwrap_or(DEFAULT_LIMIT);
                let localized = match name.as_str() {
                    "cores" => "Total Regional vCPUs".to_string(),
                    "lowPriorityCores" => "Total Regional Low-priority vCPUs".to_string(),
                    family => format!("{family} vCPUs"),
                };
                json!({
                    "unit": "Count",
                    "currentValue": current,
                    "limit": limit,
                    "name": {"value": name, "localizedValue": localized},
                })
            })
            .collect()
    }

    /// Whether growing a scale set of `sku` in `sub`'s `location` by `nodes` passes a limit:
    /// Azure's 409 if it does. `scale_sets` are every scale set as they are now.
    pub fn check_growth<'a>(
        &self,
        scale_sets: impl Iterator<Item = &'a ScaleSet>,
        sub: &str,
        location: &str,
        sku: &str,
        spot: bool,
        nodes: i64,
    ) -> Result<(), Reply> {
        let Some(size) = vm_size(sku) else {
            return Ok(());
        };
        let required = nodes * i64::from(size.vcpu);
        if required <= 0 {
            return Ok(());
        }
        let used = Self::in_use(scale_sets, sub, location);
        let limits: &[(&str, &str)] = if spot {
            &[("lowPriorityCores", "Low Priority")]
        } else {
            &[(size.family, size.family), ("cores", "Total Regional")]
        };
        for &(name, what) in limits {
            let Some(limit) = self.limit(sub, location, name) else {
                continue;
            };
            let current = used.get(&name.to_ascii_lowercase()).map_or(0, |(_, n)| *n);
            if current + required > limit {
                return Err(Reply::arm_error(
                    409,
                    "OperationNotAllowed",
                    format!(
                        "Operation could not be completed as it results in exceeding approved {what} Cores quota. Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: {limit}, Current Usage: {current}, Additional Required: {required}, (Minimum) New Limit Required: {}. Submit a request for Quota increase at https://aka.ms/ProdportalCRP by specifying parameters listed in the 'Details' section for deployment to succeed.",
                        current + required
                    ),
                ));
            }
        }
        Ok(())
    }
}
