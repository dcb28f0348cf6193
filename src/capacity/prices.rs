//! What a node of a group costs per hour, in US dollars: its VM size in its region, on-demand or
//! spot as its priority says.
//!
//! Three sources, in order: the configuration's `prices.pricePerHour` for the group (negotiated
//! rates win over everything); the last good answer of Azure's retail prices API
//! (`prices.azure.com`, unauthenticated, USD, refreshed every 12 h by [`PriceBook::run`]); the
//! embedded list-price snapshot ([`SNAPSHOT`]). A size none of them prices costs
//! [`MISSING_PRICE`], as Karpenter's Azure provider does, so it is never the "cheaper" choice.
//!
//! A refresh that fails (no answer, an answer that is not the API's shape, a negative price)
//! keeps the prices it had, is logged and counted (`price_refresh_failures_total`).

use crate::config::PriceSettings;
use parking_lot::RwLock;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The price of a size nothing prices: so high it is never chosen as cheaper (Karpenter's
/// Azure provider's `MissingPrice`).
pub const MISSING_PRICE: f64 = 999.0;

/// The retail prices API version: its filter values are case-sensitive from this one on.
pub const API_VERSION: &str = "2023-01-01-preview";

/// Pages followed at most in one query, against a `NextPageLink` that never ends.
const MAX_PAGES: usize = 200;

/// How long one page may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// On-demand (pay-as-you-go, Linux) list prices in USD per hour, per region, of every size of
/// the VM size table (`pods::template`), in the regions the project's configurations, examples
/// and emulator use (`eastus`, `westeurope`).
///
/// Source: the embedded snapshot of Karpenter's Azure provider
/// (`Azure/karpenter-provider-azure`, `pkg/providers/pricing/zz_generated.pricing.go`,
/// generated from the retail prices API; header dated 2023-12-18), which holds on-demand prices
/// only. Two corrections, said here so they can be checked: `Standard_D8as_v5` in `eastus` is
/// 0.344 (the snapshot's 0.712 is twice the series' per-vCPU rate, a mismatched meter), and
/// `westeurope`'s `E2s`/`E4s`/`E16s`/`E32s` (v3 and v5) are scaled linearly from the `E8s` and
/// `E64s` rows the snapshot has (Azure prices a series linearly by vCPU: `E64s_v5` is exactly
/// 8 × `E8s_v5` there). The reference notes quote a later snapshot (2026-06-18) at 0.24 for
/// `eastus` `Standard_D4s_v5`; this table keeps the 2023 figure (0.192) it can cite. Prices move:
/// the online fetch replaces these, and `prices.pricePerHour` overrides both.
pub const SNAPSHOT: &[(&str, &[(&str, f64)])] = &[
    (
        "eastus",
        &[
            ("Standard_B2s", 0.0416),
            ("Standard_B2ms", 0.0832),
            ("Standard_B4ms", 0.166),
            ("Standard_DS2_v2", 0.146),
            ("Standard_DS3_v2", 0.293),
            ("Standard_DS4_v2", 0.585),
            ("Standard_D2s_v3", 0.096),
            ("Standard_D4s_v3", 0.192),
            ("Standard_D8s_v3", 0.384),
            ("Standard_D16s_v3", 0.768),
            ("Standard_D32s_v3", 1.536),
            ("Standard_D2s_v5", 0.096),
            ("Standard_D4s_v5", 0.192),
            ("Standard_D8s_v5", 0.384),
            ("Standard_D16s_v5", 0.768),
            ("Standard_D32s_v5", 1.536),
            ("Standard_D2ds_v5", 0.113),
            ("Standard_D4ds_v5", 0.226),
            ("Standard_D8ds_v5", 0.452),
            ("Standard_D4as_v5", 0.172),
            ("Standard_D8as_v5", 0.344),
            ("Standard_E2s_v3", 0.126),
            ("Standard_E4s_v3", 0.252),
            ("Standard_E8s_v3", 0.504),
            ("Standard_E16s_v3", 1.008),
            ("Standard_E2s_v5", 0.126),
            ("Standard_E4s_v5", 0.252),
            ("Standard_E8s_v5", 0.504),
            ("Standard_E16s_v5", 1.008),
            ("Standard_E32s_v5", 2.016),
            ("Standard_F2s_v2", 0.0846),
            ("Standard_F4s_v2", 0.169),
            ("Standard_F8s_v2", 0.338),
            ("Standard_F16s_v2", 0.677),
            ("Standard_NC6s_v3", 3.06),
            ("Standard_NC12s_v3", 6.12),
            ("Standard_NC24s_v3", 12.24),
            ("Standard_NC4as_T4_v3", 0.526),
            ("Standard_NC8as_T4_v3", 0.752),
            ("Standard_NC16as_T4_v3", 1.204),
            ("Standard_NC64as_T4_v3", 4.352),
            ("Standard_NC24ads_A100_v4", 3.673),
            ("Standard_ND96asr_v4", 27.197),
        ],
    ),
    (
        "westeurope",
        &[
            ("Standard_B2s", 0.048),
            ("Standard_B2ms", 0.096),
            ("Standard_B4ms", 0.192),
            ("Standard_DS2_v2", 0.136),
            ("Standard_DS3_v2", 0.272),
            ("Standard_DS4_v2", 0.544),
            ("Standard_D2s_v3", 0.12),
            ("Standard_D4s_v3", 0.24),
            ("Standard_D8s_v3", 0.48),
            ("Standard_D16s_v3", 0.96),
            ("Standard_D32s_v3", 1.92),
            ("Standard_D2s_v5", 0.115),
            ("Standard_D4s_v5", 0.23),
            ("Standard_D8s_v5", 0.46),
            ("Standard_D16s_v5", 0.92),
            ("Standard_D32s_v5", 1.84),
            ("Standard_D2ds_v5", 0.136),
            ("Standard_D4ds_v5", 0.272),
            ("Standard_D8ds_v5", 0.544),
            ("Standard_D4as_v5", 0.392),
            ("Standard_D8as_v5", 0.784),
            ("Standard_E2s_v3", 0.16),
            ("Standard_E4s_v3", 0.32),
            ("Standard_E8s_v3", 0.64),
            ("Standard_E16s_v3", 1.28),
            ("Standard_E2s_v5", 0.152),
            ("Standard_E4s_v5", 0.304),
            ("Standard_E8s_v5", 0.608),
            ("Standard_E16s_v5", 1.216),
            ("Standard_E32s_v5", 2.432),
            ("Standard_F2s_v2", 0.097),
            ("Standard_F4s_v2", 0.194),
            ("Standard_F8s_v2", 0.388),
            ("Standard_F16s_v2", 0.776),
            ("Standard_NC6s_v3", 3.823),
            ("Standard_NC12s_v3", 7.646),
            ("Standard_NC24s_v3", 15.292),
            ("Standard_NC4as_T4_v3", 0.658),
            ("Standard_NC8as_T4_v3", 0.94),
            ("Standard_NC16as_T4_v3", 1.505),
            ("Standard_NC64as_T4_v3", 5.44),
            ("Standard_NC24ads_A100_v4", 4.775),
            ("Standard_ND96asr_v4", 35.357),
        ],
    ),
];

/// Errors of the price refresh.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// The request could not be sent or its answer not read.
    #[error("retail prices request to {url} failed: {source}")]
    Request {
        /// The page asked for.
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with an error status.
    #[error("retail prices API answered {status} for {url}: {body}")]
    Status {
        /// The page asked for.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer's body.
        body: String,
    },
    /// The answer is not the retail prices API's shape.
    #[error("retail prices answer from {url} is malformed: {detail}")]
    Malformed {
        /// The page asked for.
        url: String,
        /// What is wrong, with its place in the JSON.
        detail: String,
    },
    /// An item's price is negative or not a number.
    #[error("retail prices answer from {url} prices {sku} in {region} at {price}: a price must be a finite number, not negative")]
    InvalidPrice {
        /// The page it came on.
        url: String,
        /// `armSkuName`.
        sku: String,
        /// `armRegionName`.
        region: String,
        /// `retailPrice`.
        price: f64,
    },
    /// An item is not in US dollars.
    #[error("retail prices answer from {url} is in {currency}, not USD")]
    Currency {
        /// The page it came on.
        url: String,
        /// `currencyCode`.
        currency: String,
    },
    /// `NextPageLink` kept going.
    #[error("retail prices query {url} did not end within {MAX_PAGES} pages")]
    TooManyPages {
        /// The first page.
        url: String,
    },
    /// The endpoint and filter do not make a URL.
    #[error("retail prices URL {url:?} is invalid: {detail}")]
    Url {
        /// What was built.
        url: String,
        /// Why it is not a URL.
        detail: String,
    },
}

impl PriceError {
    /// A bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PriceError::Request { .. } => "request",
            PriceError::Status { .. } => "status",
            PriceError::Malformed { .. } => "malformed",
            PriceError::InvalidPrice { .. } => "invalid_price",
            PriceError::Currency { .. } => "currency",
            PriceError::TooManyPages { .. } => "too_many_pages",
            PriceError::Url { .. } => "url",
        }
    }
}

/// This module's result.
pub type Result<T, E = PriceError> = std::result::Result<T, E>;

/// One page of the retail prices API.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RetailPage {
    /// The page's items.
    pub items: Vec<RetailItem>,
    /// The next page's absolute URL; null (or empty) on the last page.
    #[serde(default)]
    pub next_page_link: Option<String>,
    /// Items on this page.
    #[serde(default)]
    pub count: Option<u64>,
}

/// One meter of the retail prices API (the fields this controller reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetailItem {
    /// `USD`.
    pub currency_code: String,
    /// Price per `unitOfMeasure`.
    pub retail_price: f64,
    /// `eastus`.
    pub arm_region_name: String,
    /// `Standard_D4s_v5`.
    pub arm_sku_name: String,
    /// `D4s v5`, `D4s v5 Spot`, `D4s v5 Low Priority`.
    pub sku_name: String,
    /// `D4s v5 Spot`...
    #[serde(default)]
    pub meter_name: String,
    /// `Virtual Machines Dsv5 Series` (Linux) or `... Series Windows`.
    #[serde(default)]
    pub product_name: String,
    /// `1 Hour`.
    #[serde(default)]
    pub unit_of_measure: String,
    /// `Consumption`, `Reservation`, `DevTestConsumption`.
    #[serde(rename = "type", default)]
    pub price_type: String,
}

/// On-demand and spot prices of one size in one region; `None`: not known.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SizePrice {
    /// Pay-as-you-go, Linux.
    pub on_demand: Option<f64>,
    /// Spot, Linux.
    pub spot: Option<f64>,
}

/// Prices by region and size (both compared without case).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    rows: BTreeMap<(String, String), SizePrice>,
}

/// `(region, size)` as the table keys it.
fn key(region: &str, size: &str) -> (String, String) {
    (
        region.trim().to_ascii_lowercase(),
        size.trim().to_ascii_lowercase(),
    )
}

impl PriceTable {
    /// The embedded [`SNAPSHOT`] (on-demand only).
    pub fn snapshot() -> Self {
        let mut t = Self::default();
        for (region, sizes) in SNAPSHOT {
            for (size, price) in *sizes {
                t.rows.entry(key(region, size)).or_default().on_demand = Some(*price);
            }
        }
        t
    }

    /// The prices of `size` in `region`.
    pub fn get(&self, region: &str, size: &str) -> Option<SizePrice> {
        self.rows.get(&key(region, size)).copied()
    }

    /// Puts what a fetch found for `size` in `region` over what the table had; a price the
    /// fetch did not find stays as it was.
    pub fn merge(&mut self, region: &str, size: &str, found: SizePrice) {
        let row = self.rows.entry(key(region, size)).or_default();
        if found.on_demand.is_some() {
            row.on_demand = found.on_demand;
        }
        if found.spot.is_some() {
            row.spot = found.spot;
        }
    }
}

/// The price per hour of one node of a size: spot when `spot`, on-demand otherwise. A spot size
/// with no spot price known takes its on-demand price (Azure caps a spot price at the size's
/// pay-as-you-go price, so that is a bound, not a guess); nothing known: [`MISSING_PRICE`].
pub fn node_price(prices: Option<SizePrice>, spot: bool) -> f64 {
    let p = prices.unwrap_or_default();
    let chosen = if spot {
        p.spot.or(p.on_demand)
    } else {
        p.on_demand
    };
    chosen.unwrap_or(MISSING_PRICE)
}

/// What the items of one query say about `size`: Linux pay-as-you-go and spot per hour.
/// Windows meters (product names ending " Windows"), Low Priority meters, other sizes, regions
/// and price types are dropped; several meters for one price keep the lowest. An item in another
/// currency or with a negative or non-finite price is an error naming it.
pub fn fold_items(url: &str, items: &[RetailItem], region: &str, size: &str) -> Result<SizePrice> {
    let mut out = SizePrice::default();
    for item in items {
        if !item.currency_code.eq_ignore_ascii_case("USD") {
            return Err(PriceError::Currency {
                url: url.to_string(),
                currency: item.currency_code.clone(),
            });
        }
        if !item.retail_price.is_finite() || item.retail_price < 0.0 {
            return Err(PriceError::InvalidPrice {
                url: url.to_string(),
                sku: item.arm_sku_name.clone(),
                region: item.arm_region_name.clone(),
                price: item.retail_price,
            });
        }
        let windows = item.product_name.ends_with(" Windows");
        let low_priority =
            item.sku_name.ends_with(" Low Priority") || item.meter_name.ends_with(" Low Priority");
        let wanted = item.arm_sku_name.eq_ignore_ascii_case(size)
            && item.arm_region_name.eq_ignore_ascii_case(region)
            && item.price_type == "Consumption"
            && (item.unit_of_measure.is_empty() || item.unit_of_measure == "1 Hour");
        // A zero is no usable price (it would be "cheapest" by accident): left out.
        if windows || low_priority || !wanted || item.retail_price == 0.0 {
            continue;
        }
        let slot = if item.sku_name.ends_with(" Spot") {
            &mut out.spot
        } else {
            &mut out.on_demand
        };
        *slot = Some(slot.map_or(item.retail_price, |p| p.min(item.retail_price)));
    }
    Ok(out)
}

/// The `$filter` of one size in one region (exact values: the API compares them with case).
pub fn filter_for(region: &str, size: &str) -> String {
    format!(
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq '{region}' and armSkuName eq '{size}'"
    )
}

/// Parses one page; a body that is not the API's shape is [`PriceError::Malformed`] with the
/// place in the JSON.
pub fn parse_page(url: &str, body: &[u8]) -> Result<RetailPage> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| PriceError::Malformed {
        url: url.to_string(),
        detail: format!("at {}: {}", e.path(), e.inner()),
    })
}

/// The retail prices API client.
#[derive(Debug, Clone)]
pub struct RetailPricesClient {
    http: reqwest::Client,
    endpoint: url::Url,
}

impl RetailPricesClient {
    /// A client of the API at `endpoint` (`https://prices.azure.com/api/retail/prices`).
    pub fn new(endpoint: url::Url) -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self { http, endpoint }
    }

    /// Every page of the query for `size` in `region`, folded into its prices.
    pub async fn size_price(&self, region: &str, size: &str) -> Result<SizePrice> {
        let mut first = self.endpoint.clone();
        first
            .query_pairs_mut()
            .append_pair("api-version", API_VERSION)
            .append_pair("$filter", &filter_for(region, size));
        let first = first.to_string();
        let mut items = Vec::new();
        let mut next = Some(first.clone());
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(PriceError::TooManyPages { url: first });
            }
            let page = self.page(&url).await?;
            // Every page is checked, so the error names the page that carried the bad item.
            fold_items(&url, &page.items, region, size)?;
            items.extend(page.items);
            next = page.next_page_link.filter(|l| !l.trim().is_empty());
        }
        fold_items(&first, &items, region, size)
    }

    async fn page(&self, url: &str) -> Result<RetailPage> {
        let parsed = url::Url::parse(url).map_err(|e| PriceError::Url {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        let request = |source| PriceError::Request {
            url: url.to_string(),
            source,
        };
        let resp = self.http.get(parsed).send().await.map_err(request)?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(request)?;
        if !(200..300).contains(&status) {
            return Err(PriceError::Status {
                url: url.to_string(),
                status,
                body: String::from_utf8_lossy(&body).chars().take(200).collect(),
            });
        }
        parse_page(url, &body)
    }
}

/// Where fresh prices come from (the retail prices API in production).
#[async_trait::async_trait]
pub trait PriceSource: Send + Sync + std::fmt::Debug {
    /// The prices of `size` in `region`.
    async fn size_price(&self, region: &str, size: &str) -> Result<SizePrice>;
}

#[async_trait::async_trait]
impl PriceSource for RetailPricesClient {
    async fn size_price(&self, region: &str, size: &str) -> Result<SizePrice> {
        RetailPricesClient::size_price(self, region, size).await
    }
}

/// Where a group's price came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceOrigin {
    /// `prices.pricePerHour` in the configuration.
    Override,
    /// The retail prices API or the embedded snapshot.
    List,
    /// Nothing priced the size: [`MISSING_PRICE`].
    Missing,
}

/// A group's price per node-hour and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupPrice {
    /// USD per hour of one node.
    pub per_hour: f64,
    /// Its source.
    pub origin: PriceOrigin,
}

/// The prices every decision reads: the table (snapshot, then refreshed), the overrides, and the
/// sizes asked for (the next refresh fetches those).
#[derive(Debug)]
pub struct PriceBook {
    settings: PriceSettings,
    table: RwLock<Arc<PriceTable>>,
    wanted: RwLock<BTreeSet<(String, String)>>,
    asked: Notify,
    /// `price_refresh_failures_total`; `None` for a book that never refreshes.
    failures: Option<prometheus::IntCounterVec>,
}

impl PriceBook {
    /// A book starting from the snapshot; `failures` counts failed refreshes by reason.
    pub fn new(settings: PriceSettings, failures: prometheus::IntCounterVec) -> Self {
        Self {
            settings,
            table: RwLock::new(Arc::new(PriceTable::snapshot())),
            wanted: RwLock::new(BTreeSet::new()),
            asked: Notify::new(),
            failures: Some(failures),
        }
    }

    /// A book that never fetches (`explain`, which reads and writes nothing online): the
    /// configured rates over the embedded list prices.
    pub fn offline(settings: PriceSettings) -> Self {
        Self {
            settings,
            table: RwLock::new(Arc::new(PriceTable::snapshot())),
            wanted: RwLock::new(BTreeSet::new()),
            asked: Notify::new(),
            failures: None,
        }
    }

    /// The price of one node of group `group` (VM `size` in `region`, spot or not). The one
    /// place a group's price is decided: the override, else the table, else [`MISSING_PRICE`].
    pub fn group_price(&self, group: &str, region: &str, size: &str, spot: bool) -> GroupPrice {
        if let Some(p) = self.settings.overrides.get(group) {
            return GroupPrice {
                per_hour: *p,
                origin: PriceOrigin::Override,
            };
        }
        if !region.is_empty() && !size.is_empty() {
            let k = (region.to_string(), size.to_string());
            if !self.wanted.read().contains(&k) {
                self.wanted.write().insert(k);
                self.asked.notify_one();
            }
        }
        let prices = self.table.read().get(region, size);
        let per_hour = node_price(prices, spot);
        GroupPrice {
            per_hour,
            origin: if per_hour == MISSING_PRICE {
                PriceOrigin::Missing
            } else {
                PriceOrigin::List
            },
        }
    }

    /// Fetches every size asked for so far; what fails keeps its last good prices. Returns the
    /// failures' count.
    pub async fn refresh(&self, source: &dyn PriceSource) -> usize {
        let wanted: Vec<(String, String)> = self.wanted.read().iter().cloned().collect();
        let mut table = PriceTable::clone(&self.table.read());
        let mut failed = 0;
        for (region, size) in &wanted {
            match source.size_price(region, size).await {
                Ok(found) => table.merge(region, size, found),
                Err(e) => {
                    failed += 1;
                    if let Some(f) = &self.failures {
                        f.with_label_values(&[e.metric_label()]).inc();
                    }
                    warn!(region = %region, vm_size = %size, error = %e, "price refresh failed: the last good prices stay");
                }
            }
        }
        *self.table.write() = Arc::new(table);
        info!(
            sizes = wanted.len(),
            failed, "prices refreshed from the retail prices API"
        );
        failed
    }

    /// Refreshes at once when a size is first asked for, and every `prices.refreshInterval`
    /// (12 h) after, until `shutdown`. Does nothing with `prices.fetch: false`.
    pub async fn run(self: Arc<Self>, source: Arc<dyn PriceSource>, shutdown: CancellationToken) {
        if !self.settings.fetch {
            return;
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.asked.notified() => {}
                _ = tokio::time::sleep(self.settings.refresh_interval) => {}
            }
            self.refresh(source.as_ref()).await;
        }
    }

    /// The settings it was built with.
    pub fn settings(&self) -> &PriceSettings {
        &self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use serde_json::json;

    fn item(sku: &str, sku_name: &str, product: &str, price: f64) -> serde_json::Value {
        json!({
            "currencyCode": "USD", "retailPrice": price, "unitPrice": price,
            "armRegionName": "eastus", "location": "US East", "armSkuName": sku,
            "skuName": sku_name, "meterName": sku_name, "productName": product,
            "serviceName": "Virtual Machines", "unitOfMeasure": "1 Hour", "type": "Consumption",
            "isPrimaryMeterRegion": true,
        })
    }

    fn page(items: Vec<serde_json::Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
            "Count": items.len(), "Items": items, "NextPageLink": null,
        }))
        .unwrap()
    }

    #[test]
    fn windows_and_low_priority_meters_are_dropped_and_spot_comes_from_the_spot_sku() {
        let body = page(vec![
            item(
                "Standard_D4s_v5",
                "D4s v5",
                "Virtual Machines Dsv5 Series",
                0.192,
            ),
            item(
                "Standard_D4s_v5",
                "D4s v5",
                "Virtual Machines Dsv5 Series Windows",
                0.376,
            ),
            item(
                "Standard_D4s_v5",
                "D4s v5 Spot",
                "Virtual Machines Dsv5 Series",
                0.0192,
            ),
            item(
                "Standard_D4s_v5",
                "D4s v5 Low Priority",
                "Virtual Machines Dsv5 Series",
                0.0384,
            ),
            item(
                "Standard_D8s_v5",
                "D8s v5",
                "Virtual Machines Dsv5 Series",
                0.384,
            ),
        ]);
        let p = parse_page("u", &body).unwrap();
        let got = fold_items("u", &p.items, "eastus", "Standard_D4s_v5").unwrap();
        assert_eq!(
            got,
            SizePrice {
                on_demand: Some(0.192),
                spot: Some(0.0192)
            }
        );
    }

    #[test]
    fn a_negative_price_is_an_error_naming_the_size_and_region() {
        let body = page(vec![item(
            "Standard_D4s_v5",
            "D4s v5",
            "Virtual Machines Dsv5 Series",
            -1.0,
        )]);
        let p = parse_page("http://x/p", &body).unwrap();
        let err = fold_items("http://x/p", &p.items, "eastus", "Standard_D4s_v5").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("Standard_D4s_v5") && text.contains("eastus") && text.contains("-1"),
            "{text}"
        );
        assert_eq!(err.metric_label(), "invalid_price");
    }

    #[test]
    fn an_answer_without_items_is_malformed_and_says_where() {
        let err = parse_page("http://x/p", br#"{"Items": [{"currencyCode": "USD"}]}"#).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("malformed") && text.contains("Items[0]"),
            "{text}"
        );
        let err = parse_page("http://x/p", b"<html>").unwrap_err();
        assert_eq!(err.metric_label(), "malformed");
    }

    #[test]
    fn every_size_of_the_vm_table_has_a_list_price_in_each_snapshot_region() {
        let t = PriceTable::snapshot();
        for (region, _) in SNAPSHOT {
            for (size, _) in vm_sizes::sizes() {
                let p = t.get(region, size).and_then(|p| p.on_demand);
                assert!(
                    p.is_some_and(|p| p > 0.0 && p < MISSING_PRICE),
                    "{region} {size}"
                );
            }
        }
        // Larger sizes of one series cost more.
        let d = |s: &str| t.get("westeurope", s).unwrap().on_demand.unwrap();
        assert!(d("Standard_D2s_v5") < d("Standard_D4s_v5"));
        assert!(d("Standard_D4s_v5") < d("Standard_D8s_v5"));
    }

    #[test]
    fn a_size_nothing_prices_is_never_cheaper_and_spot_falls_back_to_its_on_demand_cap() {
        assert_eq!(node_price(None, false), MISSING_PRICE);
        assert_eq!(node_price(None, true), MISSING_PRICE);
        let od = SizePrice {
            on_demand: Some(0.2),
            spot: None,
        };
        assert_eq!(node_price(Some(od), true), 0.2);
        let both = SizePrice {
            on_demand: Some(0.2),
            spot: Some(0.03),
        };
        assert_eq!(node_price(Some(both), true), 0.03);
        assert_eq!(node_price(Some(both), false), 0.2);
    }

    #[derive(Debug, Default)]
    struct Scripted {
        answers: Mutex<Vec<Result<SizePrice>>>,
        calls: Mutex<Vec<(String, String)>>,
    }

    #[async_trait::async_trait]
    impl PriceSource for Scripted {
        async fn size_price(&self, region: &str, size: &str) -> Result<SizePrice> {
            self.calls.lock().push((region.into(), size.into()));
            let mut a = self.answers.lock();
            if a.is_empty() {
                return Err(PriceError::Malformed {
                    url: "scripted".into(),
                    detail: "no answer scripted".into(),
                });
            }
            a.remove(0)
        }
    }

    fn settings(fetch: bool) -> PriceSettings {
        PriceSettings {
            fetch,
            ..PriceSettings::default()
        }
    }

    fn counter() -> prometheus::IntCounterVec {
        prometheus::IntCounterVec::new(prometheus::Opts::new("f", "f"), &["reason"]).unwrap()
    }

    #[test]
    fn the_override_wins_over_the_list_price() {
        let mut s = settings(false);
        s.overrides.insert("general".into(), 0.05);
        let book = PriceBook::new(s, counter());
        let got = book.group_price("general", "eastus", "Standard_D4s_v5", false);
        assert_eq!((got.per_hour, got.origin), (0.05, PriceOrigin::Override));
        let other = book.group_price("other", "eastus", "Standard_D4s_v5", false);
        assert_eq!((other.per_hour, other.origin), (0.192, PriceOrigin::List));
        let unknown = book.group_price("other", "mars", "Standard_D4s_v5", false);
        assert_eq!(unknown.origin, PriceOrigin::Missing);
    }

    #[tokio::test(start_paused = true)]
    async fn prices_are_fetched_when_first_asked_for_and_again_every_12_hours_keeping_the_last_good_on_failure(
    ) {
        let failures = counter();
        let book = Arc::new(PriceBook::new(settings(true), failures.clone()));
        let source = Arc::new(Scripted::default());
        source.answers.lock().extend([
            Ok(SizePrice {
                on_demand: Some(0.5),
                spot: Some(0.05),
            }),
            Err(PriceError::Malformed {
                url: "u".into(),
                detail: "broken".into(),
            }),
            Ok(SizePrice {
                on_demand: Some(0.6),
                spot: None,
            }),
        ]);
        let stop = CancellationToken::new();
        let task = tokio::spawn(book.clone().run(source.clone(), stop.clone()));
        // The snapshot answers before any fetch.
        assert_eq!(
            book.group_price("g", "eastus", "Standard_D4s_v5", false)
                .per_hour,
            0.192
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(source.calls.lock().len(), 1);
        assert_eq!(
            book.group_price("g", "eastus", "Standard_D4s_v5", true)
                .per_hour,
            0.05
        );
        // 12 h later: the refresh fails, the last good prices stay, the failure is counted.
        tokio::time::sleep(Duration::from_secs(12 * 3600)).await;
        assert_eq!(source.calls.lock().len(), 2);
        assert_eq!(
            book.group_price("g", "eastus", "Standard_D4s_v5", false)
                .per_hour,
            0.5
        );
        assert_eq!(failures.with_label_values(&["malformed"]).get(), 1);
        // Not before another 12 h.
        tokio::time::sleep(Duration::from_secs(11 * 3600)).await;
        assert_eq!(source.calls.lock().len(), 2);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(source.calls.lock().len(), 3);
        let p = book.group_price("g", "eastus", "Standard_D4s_v5", true);
        // A fetch without a spot price keeps the spot price it had.
        assert_eq!(p.per_hour, 0.05);
        assert_eq!(
            book.group_price("g", "eastus", "Standard_D4s_v5", false)
                .per_hour,
            0.6
        );
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn with_fetch_off_nothing_is_fetched() {
        let book = Arc::new(PriceBook::new(settings(false), counter()));
        let source = Arc::new(Scripted::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(book.clone().run(source.clone(), stop.clone()));
        book.group_price("g", "eastus", "Standard_D4s_v5", false);
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        assert!(source.calls.lock().is_empty());
        stop.cancel();
        task.await.unwrap();
    }
}
