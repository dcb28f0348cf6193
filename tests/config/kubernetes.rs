//! The `kubernetes:` section: off by default, cluster-autoscaler's leader-election defaults,
//! every problem reported at its path. These keys are a contract.

use std::collections::HashMap;
use std::time::Duration;
use vmss_capacity_controller::config::*;

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

fn load_with(rest: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigErrors> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("{BASE}{rest}")).unwrap();
    let mut vars = HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]);
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    load(&ConfigSources {
        config_file: Some(path),
        env: vars,
        ..Default::default()
    })
}

fn problems(rest: &str) -> Vec<ConfigProblem> {
    load_with(rest, &[]).expect_err("expected problems").0
}

fn has(ps: &[ConfigProblem], path: &str, needle: &str) -> bool {
    ps.iter()
        .any(|p| p.path == path && p.message.contains(needle))
}

#[test]
fn without_the_section_kubernetes_is_off_with_cluster_autoscalers_defaults_ready() {
    let s = load_with("", &[]).unwrap();
    assert_eq!(s.kubernetes, KubernetesSettings::default());
    assert!(!s.kubernetes.enabled);
    let le = &s.kubernetes.leader_election;
    assert!(le.enabled);
    assert_eq!(le.lease_name, "vmss-capacity-controller");
    assert_eq!(
        (le.lease_duration, le.renew_deadline, le.retry_period),
        (
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2)
        )
    );
    assert_eq!(s.kubernetes.namespace, "kube-system");
    assert_eq!(
        s.kubernetes.status_config_map,
        "vmss-capacity-controller-status"
    );
}

#[test]
fn the_namespace_comes_from_the_yaml_else_pod_namespace() {
    let s = load_with("", &[("POD_NAMESPACE", "autoscaling")]).unwrap();
    assert_eq!(s.kubernetes.namespace, "autoscaling");
    let s = load_with(
        "kubernetes: {namespace: ops}\n",
        &[("POD_NAMESPACE", "autoscaling")],
    )
    .unwrap();
    assert_eq!(s.kubernetes.namespace, "ops");
}

#[test]
fn every_key_of_the_section_is_read() {
    let s = load_with(
        r#"
kubernetes:
  enabled: true
  kubeconfig: /etc/kube/config
  namespace: capacity
  statusConfigMap: capacity-status
  leaderElection:
    enabled: false
    leaseName: capacity-leader
    leaseDuration: 30s
    renewDeadline: 20s
    retryPeriod: 4s
"#,
        &[],
    )
    .unwrap();
    let k = &s.kubernetes;
    assert!(k.enabled);
    assert_eq!(
        k.kubeconfig.as_deref(),
        Some(std::path::Path::new("/etc/kube/config"))
    );
    assert_eq!(k.namespace, "capacity");
    assert_eq!(k.status_config_map, "capacity-status");
    assert_eq!(
        k.leader_election,
        LeaderElectionSettings {
            enabled: false,
            lease_name: "capacity-leader".into(),
            lease_duration: Duration::from_secs(30),
            renew_deadline: Duration::from_secs(20),
            retry_period: Duration::from_secs(4),
        }
    );
}

#[test]
fn a_renew_deadline_not_shorter_than_the_lease_is_refused_at_its_path() {
    let ps = problems("kubernetes: {leaderElection: {leaseDuration: 10s, renewDeadline: 10s}}\n");
    assert!(
        has(
            &ps,
            "kubernetes.leaderElection.renewDeadline",
            "shorter than leaseDuration"
        ),
        "{ps:?}"
    );
}

#[test]
fn a_retry_period_too_close_to_the_renew_deadline_is_refused_at_its_path() {
    let ps = problems("kubernetes: {leaderElection: {retryPeriod: 9s}}\n");
    assert!(
        has(
            &ps,
            "kubernetes.leaderElection.retryPeriod",
            "shorter than renewDeadline"
        ),
        "{ps:?}"
    );
}

#[test]
fn bad_names_and_zero_durations_are_all_reported_with_their_paths() {
    let ps = problems(
        "kubernetes: {namespace: Ops_1, statusConfigMap: \"-x\", leaderElection: {leaseName: UPPER, retryPeriod: 0s}}\n",
    );
    for (path, needle) in [
        ("kubernetes.namespace", "not a valid name"),
        ("kubernetes.statusConfigMap", "not a valid name"),
        ("kubernetes.leaderElection.leaseName", "not a valid name"),
        ("kubernetes.leaderElection.retryPeriod", "greater than 0"),
    ] {
        assert!(has(&ps, path, needle), "{path}: {ps:?}");
    }
}

#[test]
fn an_unknown_key_in_the_section_is_an_error() {
    let ps = problems("kubernetes: {enabled: true, leaderElect: true}\n");
    assert!(
        ps.iter().any(|p| p.message.contains("leaderElect")),
        "{ps:?}"
    );
}

#[test]
fn a_lease_duration_that_is_not_whole_seconds_is_refused_at_its_path() {
    // The Lease stores leaseDurationSeconds: 15.5 s would be read back as 15 by a standby.
    let ps = problems("kubernetes: {leaderElection: {leaseDuration: 15500ms}}\n");
    assert!(
        has(
            &ps,
            "kubernetes.leaderElection.leaseDuration",
            "whole seconds"
        ),
        "{ps:?}"
    );
    let ok = load_with("kubernetes: {leaderElection: {leaseDuration: 16s}}\n", &[]).unwrap();
    assert_eq!(
        ok.kubernetes.leader_election.lease_duration,
        Duration::from_secs(16)
    );
}
