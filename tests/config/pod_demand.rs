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
    assert!(
        !p.balance_similar_node_groups,
        "cluster-autoscaler's default"
    );
    assert!(!p.provisioning_requests, "cluster-autoscaler's default");
    assert!(
        !p.capacity_buffer_controller,
        "cluster-autoscaler's default"
    );
    assert!(
        !p.capacity_buffer_pod_injection,
        "cluster-autoscaler's default"
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
balanceSimilarNodeGroups: true
enableProvisioningRequests: true
capacityBufferControllerEnabled: true
capacityBufferPodInjectionEnabled: true
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
    assert!(p.balance_similar_node_groups);
    assert!(p.provisioning_requests);
    assert!(p.capacity_buffer_controller);
    assert!(p.capacity_buffer_pod_injection);
}

#[test]
fn pod_demand_without_kubernetes_is_refused_at_demand() {
    let ps = problems("demand: pods\n");
    assert!(has(&ps, "demand", "kubernetes.enabled"), "{ps:?}");
}

#[test]
fn provisioning_requests_without_pod_demand_are_refused_at_their_key() {
    let ps = problems("kubernetes: {enabled: true}\nenableProvisioningRequests: true\n");
    assert!(
        has(&ps, "enableProvisioningRequests", "needs demand: pods"),
        "{ps:?}"
    );
    let ps = problems("enableProvisioningRequests: yes please\n");
    assert!(
        ps.iter()
            .any(|p| p.message.contains("enableProvisioningRequests")
                || p.path.contains("enableProvisioningRequests")),
        "{ps:?}"
    );
}

#[test]
fn capacity_buffers_without_pod_demand_or_injection_without_the_controller_are_refused_at_their_keys(
) {
    let ps = problems("kubernetes: {enabled: true}\ncapacityBufferControllerEnabled: true\n");
    assert!(
        has(&ps, "capacityBufferControllerEnabled", "needs demand: pods"),
        "{ps:?}"
    );
    let ps = problems(
        "kubernetes: {enabled: true}\ndemand: pods\ncapacityBufferPodInjectionEnabled: true\n",
    );
    assert!(
        has(
            &ps,
            "capacityBufferPodInjectionEnabled",
            "needs capacityBufferControllerEnabled: true"
        ),
        "{ps:?}"
    );
}

#[test]
fn unknown_demand_and_expander_names_are_refused_with_the_accepted_ones() {
    let ps = problems("demand: queue\nexpander: cheapest\n");
    assert!(has(&ps, "demand", "\"configured\" or \"pods\""), "{ps:?}");
    assert!(
        has(
            &ps,
            "expander",
            "least-waste, most-pods, priority, random, price or least-cost"
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

#[test]
fn scale_down_is_on_with_demand_pods_and_takes_cluster_autoscalers_defaults() {
    let s = load_yaml("kubernetes: {enabled: true}\ndemand: pods\n").unwrap();
    let d = &s.scale_down;
    assert!(d.enabled);
    assert_eq!(d.utilization_threshold, 0.5);
    assert_eq!(d.unneeded_time, Duration::from_secs(600));
    assert_eq!(d.delay_after_add, Duration::from_secs(600));
    // `--scale-down-delay-type-local=false`: a scale-up anywhere holds every group.
    assert!(!d.delay_type_local);
    assert_eq!(d.max_empty_bulk_delete, 10);
    assert_eq!(d.node_delete_delay_after_taint, Duration::from_secs(5));
    assert_eq!(d.max_pod_eviction_time, Duration::from_secs(120));
    assert_eq!(d.max_scale_down_per_pass, 10);
    assert!(!load_yaml("").unwrap().scale_down.enabled);
}

#[test]
fn every_scale_down_key_is_read_and_zero_waits_are_allowed() {
    let s = load_yaml(
        r#"
kubernetes: {enabled: true}
demand: pods
scaleDown:
  enabled: false
  utilizationThreshold: 0.3
  unneededTime: 0s
  delayAfterAdd: 1m
  delayTypeLocal: true
  maxEmptyBulkDelete: 3
  nodeDeleteDelayAfterTaint: 0s
  maxPodEvictionTime: 30s
  maxScaleDownPerPass: 2
  nonEmptyCandidatesCount: 5
  maxBulkSoftTaintCount: 0
  maxBulkSoftTaintTime: 1s
"#,
    )
    .unwrap();
    let d = &s.scale_down;
    assert!(!d.enabled);
    assert_eq!(d.utilization_threshold, 0.3);
    assert_eq!(d.unneeded_time, Duration::ZERO);
    assert_eq!(d.delay_after_add, Duration::from_secs(60));
    assert!(d.delay_type_local);
    assert_eq!(d.max_empty_bulk_delete, 3);
    assert_eq!(d.node_delete_delay_after_taint, Duration::ZERO);
    assert_eq!(d.max_pod_eviction_time, Duration::from_secs(30));
    assert_eq!(d.max_scale_down_per_pass, 2);
    assert_eq!(d.non_empty_candidates_count, 5);
    assert_eq!(d.max_bulk_soft_taint_count, 0, "0 switches soft taints off");
    assert_eq!(d.max_bulk_soft_taint_time, Duration::from_secs(1));
}

#[test]
fn bad_scale_down_keys_are_reported_at_their_paths() {
    let ps = problems(
        r#"
scaleDown:
  enabled: true
  utilizationThreshold: 1.5
  maxEmptyBulkDelete: 0
  maxPodEvictionTime: 0s
  maxScaleDownPerPass: 0
  nonEmptyCandidatesCount: 0
  maxBulkSoftTaintTime: 0s
"#,
    );
    assert!(
        has(&ps, "scaleDown.enabled", "needs demand: pods"),
        "{ps:?}"
    );
    assert!(has(&ps, "scaleDown.utilizationThreshold", "1.5"), "{ps:?}");
    assert!(has(&ps, "scaleDown.maxEmptyBulkDelete", "at least 1"));
    assert!(has(&ps, "scaleDown.maxPodEvictionTime", "greater than 0"));
    assert!(has(&ps, "scaleDown.maxScaleDownPerPass", "at least 1"));
    assert!(has(&ps, "scaleDown.nonEmptyCandidatesCount", "at least 1"));
    assert!(has(&ps, "scaleDown.maxBulkSoftTaintTime", "greater than 0"));
    let ps = problems("scaleDown: {unneededTme: 1m}\n");
    assert!(
        ps.iter().any(|p| p.message.contains("unneededTme")),
        "{ps:?}"
    );
}
