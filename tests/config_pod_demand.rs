//! `demand` and the pod-demand keys: cluster-autoscaler's flag names and defaults, every problem
//! reported at its path.

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

fn load_yaml(rest: &str) -> Result<Settings, ConfigErrors> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("{BASE}{rest}")).unwrap();
    load(&ConfigSources {
        config_file: Some(path),
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]),
        ..Default::default()
    })
}

fn problems(rest: &str) -> Vec<ConfigProblem> {
    load_yaml(rest).expect_err("expected problems").0
}

fn has(ps: &[ConfigProblem], path: &str, needle: &str) -> bool {
    ps.iter()
        .any(|p| p.path == path && p.message.contains(needle))
}

#[test]
fn without_the_keys_demand_is_configured_with_cluster_autoscalers_defaults_ready() {
    let s = load_yaml("").unwrap();
    let p = &s.pod_demand;
    assert_eq!(p.kind, DemandKind::Configured);
    assert_eq!(p.expander, Expander::LeastWaste);
    assert_eq!(p.priority_cutoff, -10);
    assert_eq!(p.max_node_provision_time, Duration::from_secs(15 * 60));
    assert_eq!(
        (p.batch_idle, p.batch_max),
        (Duration::from_secs(1), Duration::from_secs(10))
    );
}

#[test]
fn every_key_is_read() {
    let s = load_yaml(
        r#"
kubernetes: {enabled: true}
demand: pods
expander: priority
expanderPriorities:
  10: ["pool-.*"]
  50: ["gpu", "gpu-spot"]
expendablePodsPriorityCutoff: 0
maxNodeProvisionTime: 5m
podBatchIdle: 500ms
podBatchMax: 3s
"#,
    )
    .unwrap();
    let p = &s.pod_demand;
    assert_eq!(p.kind, DemandKind::Pods);
    assert_eq!(
        p.expander,
        Expander::Priority(vec![
            (50, vec!["gpu".into(), "gpu-spot".into()]),
            (10, vec!["pool-.*".into()]),
        ])
    );
    assert_eq!(p.priority_cutoff, 0);
    assert_eq!(p.max_node_provision_time, Duration::from_secs(300));
    assert_eq!(
        (p.batch_idle, p.batch_max),
        (Duration::from_millis(500), Duration::from_secs(3))
    );
}

#[test]
fn pod_demand_without_kubernetes_is_refused_at_demand() {
    let ps = problems("demand: pods\n");
    assert!(has(&ps, "demand", "kubernetes.enabled"), "{ps:?}");
}

#[test]
fn unknown_demand_and_expander_names_are_refused_with_the_accepted_ones() {
    let ps = problems("demand: queue\nexpander: cheapest\n");
    assert!(has(&ps, "demand", "\"configured\" or \"pods\""), "{ps:?}");
    assert!(
        has(
            &ps,
            "expander",
            "least-waste, most-pods, priority or random"
        ),
        "{ps:?}"
    );
}

#[test]
fn the_priority_expander_needs_its_priorities_and_each_regex_must_compile() {
    let ps = problems("expander: priority\n");
    assert!(has(&ps, "expanderPriorities", "required"), "{ps:?}");
    let ps = problems("expander: priority\nexpanderPriorities: {10: [\"gpu(\"]}\n");
    assert!(
        has(
            &ps,
            "expanderPriorities.10[0]",
            "not a valid regular expression"
        ),
        "{ps:?}"
    );
    let ps = problems("expanderPriorities: {10: [\".*\"]}\n");
    assert!(
        has(
            &ps,
            "expanderPriorities",
            "only used with expander: priority"
        ),
        "{ps:?}"
    );
}

#[test]
fn a_batch_window_must_be_positive_and_idle_no_longer_than_max() {
    let ps = problems("podBatchIdle: 0s\n");
    assert!(has(&ps, "podBatchIdle", "greater than 0"), "{ps:?}");
    let ps = problems("podBatchIdle: 20s\npodBatchMax: 10s\n");
    assert!(has(&ps, "podBatchIdle", "podBatchMax"), "{ps:?}");
    let ps = problems("maxNodeProvisionTime: 0s\n");
    assert!(has(&ps, "maxNodeProvisionTime", "greater than 0"), "{ps:?}");
}
