//! Property tests: no input makes the loader panic, and every problem says where it is.

use proptest::prelude::*;
use std::collections::HashMap;
use vmss_capacity_controller::config::*;

fn load_text(
    text: &str,
    env: HashMap<String, String>,
    nodes: Vec<String>,
) -> Result<Settings, ConfigErrors> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, text).unwrap();
    load(&ConfigSources {
        config_file: Some(path),
        env,
        nodes,
        ..Default::default()
    })
}

fn assert_paths(r: &Result<Settings, ConfigErrors>) {
    if let Err(e) = r {
        assert!(!e.0.is_empty(), "an error carries at least one problem");
        for p in &e.0 {
            assert!(!p.path.trim().is_empty(), "problem without a path: {p:?}");
            assert!(
                !p.message.trim().is_empty(),
                "problem without a message: {p:?}"
            );
        }
    }
}

/// YAML-ish fragments built from the real schema's keys and plausible/implausible values.
fn yamlish() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "azure",
        "tenantId",
        "subscriptionId",
        "resourceGroup",
        "auth",
        "method",
        "clientId",
        "nodeGroups",
        "name",
        "minSize",
        "maxSize",
        "desiredCapacity",
        "schedules",
        "start",
        "end",
        "days",
        "scanInterval",
        "vmssCacheTTL",
        "metricsListen",
        "writeBudget",
        "perMinute",
        "autoDiscovery",
        "clusterName",
        "enableVMSSEtag",
        "bogus",
        "resourceManagerEndpoint",
    ]);
    let value = prop::sample::select(vec![
        "1",
        "-1",
        "0",
        "1000000",
        "true",
        "null",
        "\"10s\"",
        "0s",
        "\"08:00\"",
        "[mon, xyz]",
        "{}",
        "[]",
        "\"http://example.com\"",
        "\"http://127.0.0.1:1\"",
        "clientSecret",
        "~",
        "\"\"",
        "[{name: a, minSize: 1, maxSize: 0}]",
        "{method: workloadIdentity}",
        "3.5",
        "'x y'",
    ]);
    prop::collection::vec((0usize..3, key, value), 0..12).prop_map(|items| {
        items
            .into_iter()
            .map(|(indent, k, v)| format!("{}{k}: {v}\n", "  ".repeat(indent)))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_text_never_panics_and_errors_carry_paths(text in any::<String>()) {
        assert_paths(&load_text(&text, HashMap::new(), vec![]));
    }

    #[test]
    fn schema_shaped_yaml_never_panics_and_errors_carry_paths(text in yamlish()) {
        assert_paths(&load_text(&text, HashMap::new(), vec![]));
    }

    #[test]
    fn random_env_values_and_nodes_specs_never_panic(
        values in prop::collection::vec(any::<String>(), 8),
        nodes in prop::collection::vec("[-0-9a-z:/ ]{0,12}", 0..4),
    ) {
        let names = [
            "ARM_SUBSCRIPTION_ID", "ARM_RESOURCE_GROUP", "AZURE_ENABLE_VMSS_ETAG",
            "AZURE_VMSS_CACHE_TTL_IN_SECONDS", "ARM_USE_MANAGED_IDENTITY_EXTENSION",
            "ARM_RESOURCE_MANAGER_ENDPOINT", "AZURE_VMSS_VMS_CACHE_JITTER", "CLUSTER_NAME",
        ];
        let env = names.iter().map(|n| n.to_string()).zip(values).collect();
        assert_paths(&load_text("", env, nodes.clone()));
        for n in &nodes {
            let _ = parse_node_spec(n);
        }
    }
}
