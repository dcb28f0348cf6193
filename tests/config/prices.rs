//! `prices:` and the price-aware expanders in the configuration: defaults, every key read, bad
//! values reported at their key in their file.

use std::collections::HashMap;
use std::time::Duration;
use vmss_capacity_controller::config::*;
use vmss_capacity_controller::pods::expander::Expander;

const BASE: &str = r#"
azure:
  resourceManagerEndpoint: http://127.0.0.1:8443
  authorityHost: http://127.0.0.1:8443
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg-nodes
  auth: {method: clientSecret, clientId: controller}
nodeGroups:
  - {name: pool-a, minSize: 0, maxSize: 5}
"#;

fn load_yaml(rest: &str) -> (Result<Settings, ConfigErrors>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("{BASE}{rest}")).unwrap();
    let loaded = load(&ConfigSources {
        config_file: Some(path),
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]),
        ..Default::default()
    });
    (loaded, dir)
}

#[test]
fn without_the_keys_prices_are_fetched_from_azures_retail_api_every_12_hours() {
    let (s, _dir) = load_yaml("");
    let p = s.unwrap().prices;
    assert!(p.fetch);
    assert_eq!(p.endpoint.as_str(), DEFAULT_PRICES_ENDPOINT);
    assert_eq!(p.refresh_interval, Duration::from_secs(12 * 3600));
    assert!(p.overrides.is_empty());
}

#[test]
fn every_prices_key_is_read() {
    let (s, _dir) = load_yaml(
        "prices:\n  fetch: false\n  endpoint: http://127.0.0.1:9/api/retail/prices\n  refreshInterval: 1h\n  pricePerHour: {pool-a: 0.11, gpu: 2.5}\n",
    );
    let p = s.unwrap().prices;
    assert!(!p.fetch);
    assert_eq!(p.endpoint.as_str(), "http://127.0.0.1:9/api/retail/prices");
    assert_eq!(p.refresh_interval, Duration::from_secs(3600));
    assert_eq!(p.overrides.get("pool-a"), Some(&0.11));
    assert_eq!(p.overrides.get("gpu"), Some(&2.5));
}

#[test]
fn a_price_that_is_not_positive_and_finite_is_an_error_naming_the_file_and_key() {
    let (s, dir) = load_yaml(
        "prices:\n  pricePerHour:\n    pool-a: -0.2\n    pool-b: 0\n    pool-c: .nan\n  endpoint: ftp://x\n  refreshInterval: 0s\n",
    );
    let ps = s.expect_err("expected problems").0;
    for key in ["pool-a", "pool-b", "pool-c"] {
        let path = format!("prices.pricePerHour.{key}");
        let p = ps
            .iter()
            .find(|p| p.path == path)
            .unwrap_or_else(|| panic!("no problem at {path}: {ps:?}"));
        assert!(p.message.contains("above 0"), "{p:?}");
        let file = p.file.as_ref().expect("the problem names its file");
        assert_eq!(file.path, dir.path().join("config.yaml"));
        assert!(file.line_column.is_some(), "{p:?}");
    }
    assert!(ps
        .iter()
        .any(|p| p.path == "prices.endpoint" && p.message.contains("http")));
    assert!(ps.iter().any(|p| p.path == "prices.refreshInterval"));
    let rendered = render_problems(&ConfigErrors(ps));
    assert!(rendered.contains("config.yaml"), "{rendered}");
    assert!(rendered.contains("pool-a"), "{rendered}");
}

#[test]
fn price_and_least_cost_are_expanders_and_expanders_chain_with_commas() {
    let (s, _dir) = load_yaml("expander: price\n");
    assert_eq!(s.unwrap().pod_demand.expander, Expander::Price);
    let (s, _dir) = load_yaml("expander: least-cost\n");
    assert_eq!(s.unwrap().pod_demand.expander, Expander::LeastCost);
    let (s, _dir) =
        load_yaml("expander: priority, least-cost\nexpanderPriorities: {10: [\"pool-.*\"]}\n");
    assert_eq!(
        s.unwrap().pod_demand.expander,
        Expander::Chain(vec![
            Expander::Priority(vec![(10, vec!["pool-.*".to_string()])]),
            Expander::LeastCost
        ])
    );
}

#[test]
fn a_chain_with_an_unknown_or_repeated_name_is_refused() {
    let (s, _dir) = load_yaml("expander: price,cheapest\n");
    let ps = s.expect_err("expected problems").0;
    assert!(
        ps.iter()
            .any(|p| p.path == "expander" && p.message.contains("\"cheapest\"")),
        "{ps:?}"
    );
    let (s, _dir) = load_yaml("expander: price,price\n");
    let ps = s.expect_err("expected problems").0;
    assert!(
        ps.iter()
            .any(|p| p.path == "expander" && p.message.contains("twice")),
        "{ps:?}"
    );
}
