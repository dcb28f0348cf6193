//! The price refresh against the emulator's retail prices API, end to end over loopback: the
//! `$filter` sent, `NextPageLink` followed, Windows and Low Priority meters dropped, spot read
//! from the spot SKU, malformed answers and bad prices reported, the last good prices kept.

use serde_json::{json, Value};
use std::sync::Arc;
use vmss_capacity_controller::capacity::prices::{
    PriceBook, PriceError, PriceOrigin, PriceSource, RetailPricesClient, SizePrice,
};
use vmss_capacity_controller::config::PriceSettings;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};

fn meter(region: &str, sku: &str, sku_name: &str, product: &str, price: f64) -> Value {
    json!({
        "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region, "effectiveStartDate": "2024-01-01T00:00:00Z",
        "meterId": format!("{sku}-{sku_name}"), "meterName": sku_name, "productId": "DZH318Z0BQ4L",
        "skuId": "DZH318Z0BQ4L/00TG", "productName": product, "skuName": sku_name,
        "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": true,
        "armSkuName": sku,
    })
}

/// A catalogue of `filler` meters of other sizes, with the D4s_v5 meters of eastus (Linux,
/// Windows, Spot, Low Priority) spread among them.
fn catalogue(filler: usize) -> Vec<Value> {
    let mut items: Vec<Value> = (0..filler)
        .map(|i| {
            meter(
                "eastus",
                &format!("Standard_X{i}"),
                &format!("X{i}"),
                "Virtual Machines X Series",
                1.0,
            )
        })
        .collect();
    let d4 = [
        meter(
            "eastus",
            "Standard_D4s_v5",
            "D4s v5",
            "Virtual Machines Dsv5 Series",
            0.192,
        ),
        meter(
            "eastus",
            "Standard_D4s_v5",
            "D4s v5",
            "Virtual Machines Dsv5 Series Windows",
            0.376,
        ),
        meter(
            "eastus",
            "Standard_D4s_v5",
            "D4s v5 Low Priority",
            "Virtual Machines Dsv5 Series",
            0.0384,
        ),
        meter(
            "westeurope",
            "Standard_D4s_v5",
            "D4s v5",
            "Virtual Machines Dsv5 Series",
            0.23,
        ),
        // Last, so only a client that follows every page finds it.
        meter(
            "eastus",
            "Standard_D4s_v5",
            "D4s v5 Spot",
            "Virtual Machines Dsv5 Series",
            0.0211,
        ),
    ];
    let step = (filler / d4.len()).max(1);
    for (k, m) in d4.into_iter().enumerate() {
        items.insert(((k + 1) * step).min(items.len()), m);
    }
    items
}

async fn emulator(
    items: Vec<Value>,
    page_size: Option<usize>,
) -> (EmulatorHandle, RetailPricesClient) {
    let emu = EmulatorBuilder::new().start().await.unwrap();
    emu.state().set_retail_prices(items);
    if let Some(n) = page_size {
        emu.state().set_retail_price_page_size(n);
    }
    let endpoint = url::Url::parse(&format!("{}/api/retail/prices", emu.base_url())).unwrap();
    (emu, RetailPricesClient::new(endpoint))
}

#[tokio::test]
async fn the_client_follows_every_page_and_reads_linux_on_demand_and_spot() {
    // 100 items a page (the real API's) over 300 meters, then pages of 2.
    for page_size in [None, Some(2)] {
        let (_emu, client) = emulator(catalogue(300), page_size).await;
        let got = client
            .size_price("eastus", "Standard_D4s_v5")
            .await
            .unwrap();
        assert_eq!(
            got,
            SizePrice {
                on_demand: Some(0.192),
                spot: Some(0.0211)
            },
            "page size {page_size:?}"
        );
    }
}

#[tokio::test]
async fn the_emulator_pages_at_100_with_a_next_page_link_and_count() {
    let (emu, _client) = emulator(catalogue(250), None).await;
    let url = format!(
        "{}/api/retail/prices?api-version=2023-01-01-preview&$filter=armRegionName%20eq%20%27eastus%27",
        emu.base_url()
    );
    let page: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(page["Count"], 100);
    assert_eq!(page["Items"].as_array().unwrap().len(), 100);
    let next = page["NextPageLink"].as_str().unwrap().to_string();
    assert!(next.contains("$skip=100"), "{next}");
    let mut seen = 100;
    let mut link = Some(next);
    while let Some(l) = link {
        let p: Value = reqwest::get(&l).await.unwrap().json().await.unwrap();
        seen += p["Count"].as_u64().unwrap();
        link = p["NextPageLink"].as_str().map(str::to_string);
    }
    // Every eastus meter: the 250 fillers and four of the five D4s_v5 ones.
    assert_eq!(seen, 254);
}

#[tokio::test]
async fn filter_values_are_case_sensitive_as_the_2023_api_version_says() {
    let (_emu, client) = emulator(catalogue(10), None).await;
    let got = client
        .size_price("EastUS", "Standard_D4s_v5")
        .await
        .unwrap();
    assert_eq!(got, SizePrice::default());
}

#[tokio::test]
async fn a_negative_price_on_a_later_page_is_an_error_naming_the_size() {
    let mut items = catalogue(5);
    items.push(meter(
        "eastus",
        "Standard_D4s_v5",
        "D4s v5",
        "Virtual Machines Dsv5 Series",
        -0.5,
    ));
    let (_emu, client) = emulator(items, Some(2)).await;
    let err = client
        .size_price("eastus", "Standard_D4s_v5")
        .await
        .unwrap_err();
    assert!(matches!(err, PriceError::InvalidPrice { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("Standard_D4s_v5") && text.contains("-0.5") && text.contains("$skip"),
        "{text}"
    );
}

#[tokio::test]
async fn an_item_missing_its_price_is_a_malformed_answer_that_says_where() {
    let mut bad = meter(
        "eastus",
        "Standard_D4s_v5",
        "D4s v5",
        "Virtual Machines Dsv5 Series",
        0.1,
    );
    bad.as_object_mut().unwrap().remove("retailPrice");
    let (_emu, client) = emulator(vec![bad], None).await;
    let err = client
        .size_price("eastus", "Standard_D4s_v5")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PriceError::Malformed { .. }), "{text}");
    assert!(
        text.contains("Items[0]") && text.contains("retailPrice"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refresh_that_fails_keeps_the_last_good_prices_and_counts_the_failure() {
    let (emu, client) = emulator(catalogue(20), Some(3)).await;
    let failures =
        prometheus::IntCounterVec::new(prometheus::Opts::new("f", "f"), &["reason"]).unwrap();
    let book = Arc::new(PriceBook::new(PriceSettings::default(), failures.clone()));
    let source: Arc<dyn PriceSource> = Arc::new(client);
    // The embedded list price answers first; asking registers the size for the refresh.
    let first = book.group_price("g", "eastus", "Standard_D4s_v5", true);
    assert_eq!((first.per_hour, first.origin), (0.192, PriceOrigin::List));
    assert_eq!(book.refresh(source.as_ref()).await, 0);
    assert_eq!(
        book.group_price("g", "eastus", "Standard_D4s_v5", true)
            .per_hour,
        0.0211
    );
    // The API now answers a page that is not its shape.
    let mut broken = meter(
        "eastus",
        "Standard_D4s_v5",
        "D4s v5",
        "Virtual Machines Dsv5 Series",
        0.3,
    );
    broken["retailPrice"] = json!("cheap");
    emu.state().set_retail_prices(vec![broken]);
    assert_eq!(book.refresh(source.as_ref()).await, 1);
    assert_eq!(failures.with_label_values(&["malformed"]).get(), 1);
    assert_eq!(
        book.group_price("g", "eastus", "Standard_D4s_v5", true)
            .per_hour,
        0.0211
    );
    assert_eq!(
        book.group_price("g", "eastus", "Standard_D4s_v5", false)
            .per_hour,
        0.192
    );
}
