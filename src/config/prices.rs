//! `prices:`: where node prices come from. The online fetch from Azure's retail prices API (on by
//! default; off for air-gapped clusters, which then use the embedded list prices), its endpoint
//! (so tests and the emulator can point it at loopback), its refresh period, and per-group
//! prices per hour for negotiated rates, which win over list prices.

use super::raw::RawPrices;
use super::validate::positive;
use super::Problems;
use std::collections::BTreeMap;
use std::time::Duration;
use url::Url;

/// Azure's retail prices API (public cloud only; unauthenticated).
pub const DEFAULT_PRICES_ENDPOINT: &str = "https://prices.azure.com/api/retail/prices";
/// How often prices are fetched again (Karpenter's Azure provider's `pricingUpdatePeriod`).
pub const DEFAULT_PRICE_REFRESH: Duration = Duration::from_secs(12 * 3600);

/// `prices:`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceSettings {
    /// `prices.fetch` (default true): fetch from the retail prices API; false: the embedded
    /// list prices and the overrides only.
    pub fetch: bool,
    /// `prices.endpoint`: the retail prices API.
    pub endpoint: Url,
    /// `prices.refreshInterval` (12 h).
    pub refresh_interval: Duration,
    /// `prices.pricePerHour`: node-group name → USD per node-hour, over any list price.
    pub overrides: BTreeMap<String, f64>,
}

impl Default for PriceSettings {
    fn default() -> Self {
        Self {
            fetch: true,
            endpoint: default_endpoint(),
            refresh_interval: DEFAULT_PRICE_REFRESH,
            overrides: BTreeMap::new(),
        }
    }
}

fn default_endpoint() -> Url {
    Url::parse(DEFAULT_PRICES_ENDPOINT)
        .expect("DEFAULT_PRICES_ENDPOINT is a URL (a test parses it)")
}

/// The keys, validated; every problem pushed with its path.
pub(super) fn price_settings(raw: Option<RawPrices>, problems: &mut Problems) -> PriceSettings {
    let defaults = PriceSettings::default();
    let Some(raw) = raw else {
        return defaults;
    };
    let endpoint = match raw.endpoint {
        None => defaults.endpoint,
        Some(text) => match Url::parse(&text) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => u,
            Ok(u) => {
                problems.push(
                    "prices.endpoint",
                    format!("{text:?} is not an http(s) URL (scheme {:?})", u.scheme()),
                );
                defaults.endpoint
            }
            Err(e) => {
                problems.push("prices.endpoint", format!("{text:?} is not a URL: {e}"));
                defaults.endpoint
            }
        },
    };
    let mut overrides = BTreeMap::new();
    for (group, price) in raw.price_per_hour.unwrap_or_default() {
        if !price.is_finite() || price <= 0.0 {
            problems.push(
                format!("prices.pricePerHour.{group}"),
                format!(
                    "{price} is not a price: USD per node-hour must be a finite number above 0"
                ),
            );
            continue;
        }
        overrides.insert(group, price);
    }
    PriceSettings {
        fetch: raw.fetch.unwrap_or(defaults.fetch),
        endpoint,
        refresh_interval: positive(
            raw.refresh_interval,
            defaults.refresh_interval,
            "prices.refreshInterval",
            problems,
        ),
        overrides,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_endpoint_is_azures_public_retail_prices_api() {
        assert_eq!(
            PriceSettings::default().endpoint.as_str(),
            DEFAULT_PRICES_ENDPOINT
        );
        assert!(PriceSettings::default().fetch);
    }
}
