//! Node-group kinds: `nodeGroups[].kind` (`vmss`, the default, or `aksAgentPool`) with `cluster`
//! and `resourceGroup`, `autoDiscovery.aksCluster`, and tag discovery of agent pools.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use vmss_capacity_controller::config::*;

const AZURE: &str = r#"
azure:
  resourceManagerEndpoint: http://127.0.0.1:8443
  authorityHost: http://127.0.0.1:8443
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg-nodes
  auth: {method: clientSecret, clientId: controller}
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn yaml_file(text: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    Fixture { _dir: dir, path }
}

/// Loads `AZURE` followed by `rest`, with a client secret in the environment.
fn load_yaml(rest: &str) -> Result<Settings, ConfigErrors> {
    let f = yaml_file(&format!("{AZURE}{rest}"));
    load(&ConfigSources {
        config_file: Some(f.path.clone()),
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]),
        ..Default::default()
    })
}

fn load_ok(rest: &str) -> Settings {
    match load_yaml(rest) {
        Ok(s) => s,
        Err(e) => panic!("expected valid config, got:\n{e}"),
    }
}

fn problems(rest: &str) -> Vec<ConfigProblem> {
    match load_yaml(rest) {
        Ok(_) => panic!("expected problems for:\n{rest}"),
        Err(e) => e.0,
    }
}

/// Asserts one problem has this path and its message contains `needle`.
fn assert_problem(ps: &[ConfigProblem], path: &str, needle: &str) {
    assert!(
        ps.iter()
            .any(|p| p.path == path && p.message.contains(needle)),
        "no problem at {path:?} containing {needle:?}; got:\n{}",
        ConfigErrors(ps.to_vec())
    );
}

fn pool(cluster: &str) -> NodeGroupKind {
    NodeGroupKind::AksAgentPool {
        cluster: cluster.to_string(),
    }
}

#[test]
fn a_node_group_without_kind_is_a_scale_set_in_azure_resource_group() {
    let s = load_ok("nodeGroups:\n  - {name: pool-a, minSize: 1, maxSize: 10}\n");
    assert_eq!(s.node_groups[0].kind, NodeGroupKind::Vmss);
    assert_eq!(s.node_groups[0].resource_group, None);
    let s = load_ok("nodeGroups:\n  - {name: pool-a, kind: vmss, minSize: 1, maxSize: 10}\n");
    assert_eq!(s.node_groups[0].kind, NodeGroupKind::Vmss);
}

#[test]
fn an_aks_agent_pool_group_reads_its_cluster_and_optional_resource_group() {
    let s = load_ok(
        r#"
nodeGroups:
  - {name: userpool1, kind: aksAgentPool, cluster: aks-prod, minSize: 1, maxSize: 20, desiredCapacity: 3}
  - {name: gpu, kind: aksAgentPool, cluster: aks-prod, resourceGroup: rg-clusters, minSize: 0, maxSize: 4}
  - {name: vmss-a, minSize: 1, maxSize: 5}
"#,
    );
    let g = &s.node_groups;
    assert_eq!(g.len(), 3);
    assert_eq!(
        (&g[0].name, &g[0].kind, &g[0].resource_group),
        (&"userpool1".to_string(), &pool("aks-prod"), &None)
    );
    assert_eq!((g[0].min_size, g[0].max_size), (1, 20));
    assert_eq!(g[0].desired_capacity, Some(3));
    assert_eq!(g[1].kind, pool("aks-prod"));
    assert_eq!(g[1].resource_group.as_deref(), Some("rg-clusters"));
    assert_eq!(g[2].kind, NodeGroupKind::Vmss);
    assert_eq!(g[0].kind.as_str(), "aksAgentPool");
    assert_eq!(g[2].kind.as_str(), "vmss");
}

#[test]
fn an_unknown_kind_is_reported_at_its_path_with_the_allowed_values() {
    let ps = problems(
        "nodeGroups:\n  - {name: pool-a, minSize: 1, maxSize: 10}\n  - {name: pool-b, kind: aks, cluster: c, minSize: 1, maxSize: 10}\n",
    );
    assert_problem(&ps, "nodeGroups[1].kind", "unknown kind \"aks\"");
    assert_problem(&ps, "nodeGroups[1].kind", "vmss");
    assert_problem(&ps, "nodeGroups[1].kind", "aksAgentPool");
    // The kind is unknown, so its cluster is not judged against either kind.
    assert_eq!(ps.len(), 1, "{}", ConfigErrors(ps.clone()));
    // A kind that is not text is an unknown kind too, not a scale set by omission.
    let ps =
        problems("nodeGroups:\n  - {name: pool1, kind: 3, cluster: c, minSize: 1, maxSize: 2}\n");
    assert_problem(
        &ps,
        "nodeGroups[0].kind",
        "unknown kind \"3\"; use vmss (the default) or aksAgentPool",
    );
    assert_eq!(ps.len(), 1, "{}", ConfigErrors(ps.clone()));
}

#[test]
fn kind_spelling_is_exact_like_every_other_config_value() {
    let ps = problems(
        "nodeGroups:\n  - {name: pool1, kind: AksAgentPool, cluster: c, minSize: 1, maxSize: 2}\n",
    );
    assert_problem(&ps, "nodeGroups[0].kind", "unknown kind \"AksAgentPool\"");
}

#[test]
fn an_aks_agent_pool_without_a_cluster_is_reported() {
    for cluster in ["", ", cluster: \"\"", ", cluster: \"  \""] {
        let ps = problems(&format!(
            "nodeGroups:\n  - {{name: pool1, kind: aksAgentPool{cluster}, minSize: 1, maxSize: 2}}\n"
        ));
        assert_problem(
            &ps,
            "nodeGroups[0].cluster",
            "required when kind is aksAgentPool",
        );
    }
}

#[test]
fn a_cluster_on_a_scale_set_group_is_reported() {
    for kind in ["", "kind: vmss, "] {
        let ps = problems(&format!(
            "nodeGroups:\n  - {{name: pool-a, {kind}cluster: aks-prod, minSize: 1, maxSize: 2}}\n"
        ));
        assert_problem(&ps, "nodeGroups[0].cluster", "only for kind aksAgentPool");
    }
}

#[test]
fn a_resource_group_on_a_scale_set_group_is_reported_because_scale_sets_come_from_azure_resource_group(
) {
    let ps = problems(
        "nodeGroups:\n  - {name: pool-a, resourceGroup: rg-other, minSize: 1, maxSize: 2}\n",
    );
    assert_problem(
        &ps,
        "nodeGroups[0].resourceGroup",
        "scale sets are read from azure.resourceGroup",
    );
}

#[test]
fn agent_pool_names_follow_the_aks_rule_not_the_scale_set_rule() {
    for name in ["pool-a", "Pool1", "1pool", "abcdefghijklm", "pool_a"] {
        let ps = problems(&format!(
            "nodeGroups:\n  - {{name: {name}, kind: aksAgentPool, cluster: c, minSize: 1, maxSize: 2}}\n"
        ));
        assert_problem(&ps, "nodeGroups[0].name", "not a valid agent-pool name");
    }
    for name in ["p", "pool1", "abcdefghijkl"] {
        load_ok(&format!(
            "nodeGroups:\n  - {{name: {name}, kind: aksAgentPool, cluster: c, minSize: 1, maxSize: 2}}\n"
        ));
    }
}

#[test]
fn cluster_and_resource_group_names_are_checked_against_azure_rules() {
    for cluster in ["-aks", "aks-", "aks.prod", "\"aks prod\""] {
        let ps = problems(&format!(
            "nodeGroups:\n  - {{name: pool1, kind: aksAgentPool, cluster: {cluster}, minSize: 1, maxSize: 2}}\n"
        ));
        assert_problem(
            &ps,
            "nodeGroups[0].cluster",
            "not a valid managed-cluster name",
        );
    }
    for rg in ["rg.", "\"rg/x\"", &"r".repeat(91)] {
        let ps = problems(&format!(
            "nodeGroups:\n  - {{name: pool1, kind: aksAgentPool, cluster: c, resourceGroup: {rg}, minSize: 1, maxSize: 2}}\n"
        ));
        assert_problem(
            &ps,
            "nodeGroups[0].resourceGroup",
            "not a valid resource-group name",
        );
    }
    load_ok("nodeGroups:\n  - {name: pool1, kind: aksAgentPool, cluster: My_Cluster-1, resourceGroup: \"rg.(prod)_1\", minSize: 1, maxSize: 2}\n");
}

#[test]
fn node_group_names_are_unique_across_kinds() {
    let ps = problems(
        "nodeGroups:\n  - {name: pool1, minSize: 1, maxSize: 2}\n  - {name: POOL1, kind: aksAgentPool, cluster: c, minSize: 1, maxSize: 2}\n",
    );
    assert_problem(&ps, "nodeGroups[1].name", "duplicate node group");
    // Two pools of the same name in different clusters are still one name.
    let ps = problems(
        "nodeGroups:\n  - {name: pool1, kind: aksAgentPool, cluster: a, minSize: 1, maxSize: 2}\n  - {name: pool1, kind: aksAgentPool, cluster: b, minSize: 1, maxSize: 2}\n",
    );
    assert_problem(&ps, "nodeGroups[1].name", "duplicate node group");
    // And a --nodes scale set cannot take a pool's name.
    let f = yaml_file(&format!(
        "{AZURE}nodeGroups:\n  - {{name: pool1, kind: aksAgentPool, cluster: c, minSize: 1, maxSize: 2}}\n"
    ));
    let e = load(&ConfigSources {
        config_file: Some(f.path.clone()),
        nodes: vec!["1:3:pool1".into()],
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), "s".to_string())]),
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(&e.0, "--nodes[0]", "duplicate node group");
}

#[test]
fn every_node_group_kind_problem_is_reported_at_once() {
    let ps = problems(
        r#"
nodeGroups:
  - {name: a1, kind: aksAgentPool, minSize: 1, maxSize: 2}
  - {name: vmss-b, cluster: c, resourceGroup: rg, minSize: 1, maxSize: 2}
  - {name: c1, kind: nodepool, minSize: 1, maxSize: 2}
"#,
    );
    assert_problem(&ps, "nodeGroups[0].cluster", "required");
    assert_problem(&ps, "nodeGroups[1].cluster", "only for kind aksAgentPool");
    assert_problem(&ps, "nodeGroups[1].resourceGroup", "azure.resourceGroup");
    assert_problem(&ps, "nodeGroups[2].kind", "unknown kind");
    assert_eq!(ps.len(), 4, "{}", ConfigErrors(ps.clone()));
}

#[test]
fn auto_discovery_reads_the_aks_cluster_and_its_resource_group() {
    let s = load_ok(
        "autoDiscovery: {clusterName: prod, aksCluster: aks-prod, aksResourceGroup: rg-clusters}\n",
    );
    let ad = s.auto_discovery.unwrap();
    assert_eq!(ad.aks_cluster.as_deref(), Some("aks-prod"));
    assert_eq!(ad.aks_resource_group.as_deref(), Some("rg-clusters"));
    let s = load_ok("autoDiscovery: {clusterName: prod}\n");
    let ad = s.auto_discovery.unwrap();
    assert_eq!((ad.aks_cluster, ad.aks_resource_group), (None, None));
}

#[test]
fn auto_discovery_aks_keys_are_checked_at_their_paths() {
    let ps = problems("autoDiscovery: {clusterName: prod, aksResourceGroup: rg}\n");
    assert_problem(
        &ps,
        "autoDiscovery.aksResourceGroup",
        "only with autoDiscovery.aksCluster",
    );
    let ps = problems("autoDiscovery: {clusterName: prod, aksCluster: \"-bad\"}\n");
    assert_problem(
        &ps,
        "autoDiscovery.aksCluster",
        "not a valid managed-cluster name",
    );
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn auto(min: Option<u32>, max: Option<u32>) -> AutoDiscovery {
    AutoDiscovery {
        cluster_name: "prod".into(),
        default_min: min,
        default_max: max,
        aks_cluster: Some("aks-prod".into()),
        aks_resource_group: None,
    }
}

fn ours(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut t = vec![
        ("cluster-autoscaler-enabled", "true"),
        ("cluster-autoscaler-name", "prod"),
    ];
    t.extend_from_slice(extra);
    tags(&t)
}

#[test]
fn discover_pools_returns_the_tagged_pools_as_agent_pool_groups_with_bounds_from_tags() {
    let pools = vec![
        ("user1".to_string(), ours(&[("min", "2"), ("max", "7")])),
        ("user2".to_string(), ours(&[])),
        (
            "other".to_string(),
            tags(&[
                ("cluster-autoscaler-enabled", "true"),
                ("cluster-autoscaler-name", "dev"),
            ]),
        ),
        ("system".to_string(), tags(&[])),
    ];
    let (found, skipped) =
        discover_pools(&auto(Some(1), Some(10)), "aks-prod", Some("rg-c"), &pools);
    assert_eq!(
        found,
        vec![
            NodeGroupSpec {
                name: "user1".into(),
                kind: pool("aks-prod"),
                resource_group: Some("rg-c".into()),
                min_size: 2,
                max_size: 7,
                desired_capacity: None,
                schedules: vec![],
                max_scale_down_step: None,
            },
            NodeGroupSpec {
                name: "user2".into(),
                kind: pool("aks-prod"),
                resource_group: Some("rg-c".into()),
                min_size: 1,
                max_size: 10,
                desired_capacity: None,
                schedules: vec![],
                max_scale_down_step: None,
            },
        ]
    );
    assert_eq!(
        skipped,
        vec![],
        "pools without the discovery tags are not ours"
    );
    let (found, _) = discover_pools(&auto(Some(1), Some(10)), "aks-prod", None, &pools);
    assert_eq!(found[0].resource_group, None);
}

#[test]
fn discover_pools_skips_pools_with_unusable_tags_or_names_and_says_why() {
    let pools = vec![
        ("nobounds".to_string(), ours(&[])),
        ("inverted".to_string(), ours(&[("min", "5"), ("max", "2")])),
        ("toobig".to_string(), ours(&[("min", "0"), ("max", "1001")])),
        ("bad-name".to_string(), ours(&[("min", "0"), ("max", "3")])),
    ];
    let (found, skipped) = discover_pools(&auto(None, None), "aks-prod", None, &pools);
    assert_eq!(found, vec![]);
    let reason = |n: &str| {
        skipped
            .iter()
            .find(|(s, _)| s == n)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    assert_eq!(reason("nobounds"), "no min tag and no defaultMin");
    assert_eq!(reason("inverted"), "max 2 is less than min 5");
    assert!(reason("toobig").contains("above the scale-set limit"));
    assert!(reason("bad-name").contains("not a valid agent-pool name"));
}

#[test]
fn scale_set_discovery_is_unchanged_by_pool_discovery() {
    // The same tagged list read as scale sets: scale-set names and kind vmss.
    let sets = vec![("bad-name".to_string(), ours(&[("min", "0"), ("max", "3")]))];
    let (found, skipped) = discover_node_groups(&auto(None, None), &sets);
    assert_eq!(skipped, vec![]);
    assert_eq!(found[0].kind, NodeGroupKind::Vmss);
    assert_eq!(found[0].resource_group, None);
}
