//! The `price` and `least-cost` expanders end to end on the emulator: the group a scale-up grows
//! follows the groups' prices (list prices from the embedded table, a negotiated rate from
//! `prices.pricePerHour` over them), and `node_group_price_per_hour` shows what was used.

use crate::support;

use support::pod_cluster::Cluster;

use serde_json::json;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::pods::expander::Expander;

/// A D4s_v5 group and an E4s_v5 group in westeurope (list prices 0.23 and 0.304 $/h), with
/// `expander` and, when given, a negotiated rate for the E4s_v5 group. Prices are not fetched.
async fn two_sizes(expander: Expander, esv5_rate: Option<f64>) -> Cluster {
    Cluster::start_with(
        &[
            ("dsv5", "Standard_D4s_v5", 0, &[]),
            ("esv5", "Standard_E4s_v5", 0, &[]),
        ],
        20,
        |s| {
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
            s.pod_demand.expander = expander;
            s.prices.fetch = false;
            if let Some(rate) = esv5_rate {
                s.prices.overrides.insert("esv5".into(), rate);
            }
        },
    )
    .await
}

fn price_of(c: &Cluster, group: &str) -> f64 {
    c.metrics
        .node_group_price_per_hour
        .with_label_values(&[group])
        .get()
}

async fn grown_group(c: &Cluster) -> (i64, i64) {
    for i in 0..4 {
        c.pending(&format!("web-{i}"), "1", "2Gi", json!({}));
    }
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("dsv5")
            + c.capacity("esv5")
            > 0)
        .await,
        "no group grew"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    (c.capacity("dsv5"), c.capacity("esv5"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_list_prices_the_cheaper_size_grows_and_its_price_is_exported() {
    for expander in [Expander::Price, Expander::LeastCost] {
        let c = two_sizes(expander.clone(), None).await;
        let (d, e) = grown_group(&c).await;
        assert!(d > 0 && e == 0, "{expander:?}: dsv5 {d} esv5 {e}");
        assert_eq!(price_of(&c, "dsv5"), 0.23);
        assert_eq!(price_of(&c, "esv5"), 0.304);
        c.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negotiated_rate_makes_the_dearer_list_size_the_one_that_grows() {
    for expander in [Expander::Price, Expander::LeastCost] {
        let c = two_sizes(expander.clone(), Some(0.1)).await;
        let (d, e) = grown_group(&c).await;
        assert!(d == 0 && e > 0, "{expander:?}: dsv5 {d} esv5 {e}");
        assert_eq!(price_of(&c, "esv5"), 0.1);
        c.stop().await;
    }
}
