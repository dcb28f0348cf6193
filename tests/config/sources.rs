//! Where settings come from: environment (cluster-autoscaler names), azure.json, `--nodes`,
//! tag auto-discovery, and their precedence (defaults < azure.json < YAML < env).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;
use vmss_capacity_controller::config::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

struct Yaml {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn yaml(text: &str) -> Yaml {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, text).unwrap();
    Yaml { _dir: dir, path }
}

fn assert_problem(e: &ConfigErrors, path: &str, needle: &str) {
    assert!(
        e.0.iter()
            .any(|p| p.path == path && p.message.contains(needle)),
        "no problem at {path:?} containing {needle:?}; got:\n{e}"
    );
}

/// cluster-autoscaler's `cluster-autoscaler-vmss.yaml` Deployment: env from the secret, --nodes.
fn ca_deployment_env() -> HashMap<String, String> {
    env(&[
        (
            "ARM_SUBSCRIPTION_ID",
            "11111111-2222-3333-4444-555555555555",
        ),
        ("ARM_RESOURCE_GROUP", "MC_rg_aks_westeurope"),
        ("ARM_TENANT_ID", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
        ("ARM_CLIENT_ID", "0b2a7f4e-0000-4000-8000-000000000001"),
        ("ARM_CLIENT_SECRET", "from-the-secret"),
        ("ARM_VM_TYPE", "vmss"),
        ("PATH", "/usr/bin"),
    ])
}

#[test]
fn a_cluster_autoscaler_deployment_env_with_nodes_flags_works_unchanged() {
    let s = load(&ConfigSources {
        nodes: vec!["1:10:vmss1".into(), "1:10:vmss2".into()],
        env: ca_deployment_env(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.azure.subscription_id,
        "11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(s.azure.resource_group, "MC_rg_aks_westeurope");
    assert_eq!(s.azure.tenant_id, "72f988bf-86f1-41af-91ab-2d7cd011db47");
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "https://management.azure.com/"
    );
    assert_eq!(
        s.azure.authority_host.as_str(),
        "https://login.microsoftonline.com/"
    );
    match &s.azure.auth {
        AuthSettings::ClientSecret { client_id, secret } => {
            assert_eq!(client_id, "0b2a7f4e-0000-4000-8000-000000000001");
            assert!(matches!(secret, SecretSource::Env(v) if v == "ARM_CLIENT_SECRET"));
        }
        other => panic!("{other:?}"),
    }
    let names: Vec<_> = s
        .node_groups
        .iter()
        .map(|g| (g.name.as_str(), g.min_size, g.max_size))
        .collect();
    assert_eq!(names, vec![("vmss1", 1, 10), ("vmss2", 1, 10)]);
    assert!(
        s.enable_vmss_etag,
        "ETags are on by default, unlike cluster-autoscaler"
    );
}

#[test]
fn the_msi_deployment_variant_selects_system_or_user_assigned_managed_identity() {
    let base = [
        ("ARM_SUBSCRIPTION_ID", "sub"),
        ("ARM_RESOURCE_GROUP", "rg"),
        ("ARM_USE_MANAGED_IDENTITY_EXTENSION", "true"),
    ];
    let s = load(&ConfigSources {
        nodes: vec!["0:5:pool".into()],
        env: env(&base),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        s.azure.auth,
        AuthSettings::ManagedIdentity { client_id: None }
    ));
    let mut vars = base.to_vec();
    vars.push(("ARM_USER_ASSIGNED_IDENTITY_ID", "uami-client-id"));
    let s = load(&ConfigSources {
        nodes: vec!["0:5:pool".into()],
        env: env(&vars),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(s.azure.auth, AuthSettings::ManagedIdentity { client_id: Some(ref c) } if c == "uami-client-id")
    );
}

#[test]
fn the_workload_identity_deployment_variant_uses_the_webhook_injected_variables() {
    for flag in [
        "ARM_USE_WORKLOAD_IDENTITY_EXTENSION",
        "ARM_USE_FEDERATED_WORKLOAD_IDENTITY_EXTENSION",
    ] {
        let s = load(&ConfigSources {
            nodes: vec!["0:5:pool".into()],
            env: env(&[
                ("ARM_SUBSCRIPTION_ID", "sub"),
                ("ARM_RESOURCE_GROUP", "rg"),
                (flag, "true"),
                ("AZURE_CLIENT_ID", "wi-client"),
                ("AZURE_TENANT_ID", "wi-tenant"),
                (
                    "AZURE_FEDERATED_TOKEN_FILE",
                    "/var/run/secrets/azure/tokens/azure-identity-token",
                ),
                ("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.com/"),
            ]),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.azure.tenant_id, "wi-tenant");
        match s.azure.auth {
            AuthSettings::WorkloadIdentity {
                client_id,
                token_file,
            } => {
                assert_eq!(client_id, "wi-client");
                assert_eq!(
                    token_file,
                    PathBuf::from("/var/run/secrets/azure/tokens/azure-identity-token")
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn managed_identity_and_workload_identity_together_are_rejected() {
    let e = load(&ConfigSources {
        nodes: vec!["0:5:pool".into()],
        env: env(&[
            ("ARM_SUBSCRIPTION_ID", "sub"),
            ("ARM_RESOURCE_GROUP", "rg"),
            ("ARM_USE_MANAGED_IDENTITY_EXTENSION", "true"),
            ("ARM_USE_WORKLOAD_IDENTITY_EXTENSION", "true"),
            ("AZURE_CLIENT_ID", "c"),
            ("AZURE_TENANT_ID", "t"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/t"),
        ]),
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(
        &e,
        "env ARM_USE_MANAGED_IDENTITY_EXTENSION",
        "you can not combine both managed identity and workload identity",
    );
}

#[test]
fn environment_overrides_yaml_which_overrides_azure_json() {
    let y = yaml(
        r#"
azure:
  tenantId: yaml-tenant
  subscriptionId: yaml-sub
  resourceGroup: yaml-rg
  resourceManagerEndpoint: https://arm.yaml.example
  auth: {method: clientSecret, clientId: yaml-client}
enableVMSSEtag: true
vmssCacheTTL: 30s
instanceCacheTTL: 2m
nodeGroups: [{name: pool, minSize: 0, maxSize: 3}]
"#,
    );
    let sources = |vars: &[(&str, &str)]| ConfigSources {
        config_file: Some(y.path.clone()),
        cloud_config_file: Some(fixture("azure.json")),
        env: env(vars),
        ..Default::default()
    };
    // YAML over azure.json.
    let s = load(&sources(&[])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.tenant_id, "yaml-tenant");
    assert_eq!(s.azure.subscription_id, "yaml-sub");
    assert_eq!(s.azure.resource_group, "yaml-rg");
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "https://arm.yaml.example/"
    );
    assert!(s.enable_vmss_etag, "YAML true beats azure.json false");
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(30));
    assert_eq!(s.instance_cache_ttl, Duration::from_secs(120));
    assert_eq!(
        s.instance_cache_jitter,
        Duration::from_secs(30),
        "from azure.json"
    );
    // The YAML method wins over azure.json's managed-identity flag; the azure.json secret is used.
    match &s.azure.auth {
        AuthSettings::ClientSecret { client_id, secret } => {
            assert_eq!(client_id, "yaml-client");
            assert!(matches!(secret, SecretSource::File(p) if p == &fixture("azure.json")));
        }
        other => panic!("{other:?}"),
    }
    // Env over YAML.
    let s = load(&sources(&[
        ("ARM_TENANT_ID", "env-tenant"),
        ("ARM_SUBSCRIPTION_ID", "env-sub"),
        ("ARM_RESOURCE_GROUP", "env-rg"),
        ("ARM_CLIENT_ID", "env-client"),
        ("ARM_RESOURCE_MANAGER_ENDPOINT", "http://127.0.0.1:8443"),
        ("AZURE_AUTHORITY_HOST", "http://localhost:8443"),
        ("AZURE_ENABLE_VMSS_ETAG", "false"),
        ("AZURE_VMSS_CACHE_TTL_IN_SECONDS", "15"),
        ("AZURE_VMSS_VMS_CACHE_TTL_IN_SECONDS", "90"),
        ("AZURE_VMSS_VMS_CACHE_JITTER", "5"),
    ]))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.tenant_id, "env-tenant");
    assert_eq!(s.azure.subscription_id, "env-sub");
    assert_eq!(s.azure.resource_group, "env-rg");
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "http://127.0.0.1:8443/"
    );
    assert_eq!(s.azure.authority_host.as_str(), "http://localhost:8443/");
    assert!(!s.enable_vmss_etag);
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(15));
    assert_eq!(s.instance_cache_ttl, Duration::from_secs(90));
    assert_eq!(s.instance_cache_jitter, Duration::from_secs(5));
    assert!(
        matches!(&s.azure.auth, AuthSettings::ClientSecret { client_id, .. } if client_id == "env-client")
    );
}

#[test]
fn of_two_variable_names_the_later_one_wins_like_cluster_autoscaler() {
    let base = [
        ("ARM_SUBSCRIPTION_ID", "sub"),
        ("ARM_RESOURCE_GROUP", "rg"),
        ("ARM_CLIENT_SECRET", "s"),
        ("ARM_TENANT_ID", "arm-tenant"),
        ("AZURE_TENANT_ID", "azure-tenant"),
        ("ARM_CLIENT_ID", "arm-client"),
        ("AZURE_CLIENT_ID", "azure-client"),
        ("AZURE_VMSS_CACHE_TTL_IN_SECONDS", "10"),
        ("AZURE_VMSS_CACHE_TTL", "20"),
    ];
    let s = load(&ConfigSources {
        nodes: vec!["0:1:p".into()],
        env: env(&base),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.tenant_id, "azure-tenant");
    assert!(
        matches!(&s.azure.auth, AuthSettings::ClientSecret { client_id, .. } if client_id == "azure-client")
    );
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(20));
}

#[test]
fn empty_and_whitespace_variables_are_ignored() {
    let s = load(&ConfigSources {
        nodes: vec!["0:1:p".into()],
        env: env(&[
            ("ARM_SUBSCRIPTION_ID", "sub"),
            ("ARM_RESOURCE_GROUP", "rg"),
            ("ARM_TENANT_ID", "t"),
            ("ARM_CLIENT_ID", "c"),
            ("ARM_CLIENT_SECRET", "s"),
            ("AZURE_TENANT_ID", "   "),
            ("AZURE_ENABLE_VMSS_ETAG", ""),
            ("AZURE_VMSS_CACHE_TTL_IN_SECONDS", " "),
            ("ARM_USE_MANAGED_IDENTITY_EXTENSION", ""),
        ]),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.tenant_id, "t");
    assert!(s.enable_vmss_etag);
    assert_eq!(s.vmss_cache_ttl, DEFAULT_VMSS_CACHE_TTL);
    assert!(matches!(s.azure.auth, AuthSettings::ClientSecret { .. }));
}

#[test]
fn bad_booleans_and_integers_are_problems_naming_the_variable() {
    let mut vars = ca_deployment_env();
    for (k, v) in [
        ("AZURE_ENABLE_VMSS_ETAG", "yes"),
        ("ARM_USE_MANAGED_IDENTITY_EXTENSION", "maybe"),
        ("AZURE_VMSS_CACHE_TTL_IN_SECONDS", "1m"),
        ("AZURE_VMSS_VMS_CACHE_TTL_IN_SECONDS", "-5"),
        ("AZURE_VMSS_VMS_CACHE_JITTER", "99999999999"),
    ] {
        vars.insert(k.into(), v.into());
    }
    let e = load(&ConfigSources {
        nodes: vec!["0:1:p".into()],
        env: vars,
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(&e, "env AZURE_ENABLE_VMSS_ETAG", "not a boolean");
    assert_problem(
        &e,
        "env ARM_USE_MANAGED_IDENTITY_EXTENSION",
        "not a boolean",
    );
    assert_problem(&e, "env AZURE_VMSS_CACHE_TTL_IN_SECONDS", "not an integer");
    assert_problem(&e, "env AZURE_VMSS_VMS_CACHE_TTL_IN_SECONDS", "> 0");
    assert_problem(&e, "env AZURE_VMSS_VMS_CACHE_JITTER", "not an integer");
    assert_eq!(e.0.len(), 5, "{e}");
}

#[test]
fn go_style_booleans_are_accepted() {
    for (v, want) in [
        ("1", true),
        ("T", true),
        ("True", true),
        ("0", false),
        ("f", false),
        ("FALSE", false),
    ] {
        let mut vars = ca_deployment_env();
        vars.insert("AZURE_ENABLE_VMSS_ETAG".into(), v.into());
        let s = load(&ConfigSources {
            nodes: vec!["0:1:p".into()],
            env: vars,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.enable_vmss_etag, want, "{v}");
    }
}

#[test]
fn a_realistic_azure_json_produces_the_expected_settings() {
    let s = load(&ConfigSources {
        cloud_config_file: Some(fixture("azure.json")),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.tenant_id, "72f988bf-86f1-41af-91ab-2d7cd011db47");
    assert_eq!(
        s.azure.subscription_id,
        "11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(s.azure.resource_group, "MC_rg-prod_aks-prod_westeurope");
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "https://management.azure.com/"
    );
    assert_eq!(
        s.azure.authority_host.as_str(),
        "https://login.microsoftonline.com/"
    );
    assert!(matches!(
        s.azure.auth,
        AuthSettings::ManagedIdentity { client_id: Some(ref c) } if c == "8d3e1f0a-0000-4000-8000-00000000beef"
    ));
    assert!(!s.enable_vmss_etag);
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(120));
    assert_eq!(s.instance_cache_ttl, Duration::from_secs(600));
    assert_eq!(s.instance_cache_jitter, Duration::from_secs(30));
    assert_eq!(s.node_groups, vec![]);
    assert_eq!(
        s.auto_discovery,
        Some(AutoDiscovery {
            cluster_name: "aks-prod".into(),
            default_min: None,
            default_max: None,
            aks_cluster: None,
            aks_resource_group: None,
        }),
        "clusterName without explicit groups means tag discovery"
    );
}

fn json_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let p = dir.path().join("azure.json");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn azure_json_legacy_ttl_fields_win_and_sovereign_clouds_map_to_their_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let p = json_file(
        &dir,
        r#"{"cloud":"AzureUSGovernmentCloud","tenantId":"t","subscriptionId":"s","resourceGroup":"rg",
            "aadClientId":"c","aadClientSecret":"x",
            "vmssCacheTTLInSeconds":100,"vmssCacheTTL":200,
            "vmssVirtualMachinesCacheTTLInSeconds":300,"vmssVmsCacheTTL":400}"#,
    );
    let s = load(&ConfigSources {
        cloud_config_file: Some(p.clone()),
        nodes: vec!["0:1:p".into()],
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(200));
    assert_eq!(s.instance_cache_ttl, Duration::from_secs(400));
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "https://management.usgovcloudapi.net/"
    );
    assert_eq!(
        s.azure.authority_host.as_str(),
        "https://login.microsoftonline.us/"
    );
    assert!(
        matches!(&s.azure.auth, AuthSettings::ClientSecret { client_id, secret: SecretSource::File(f) } if client_id == "c" && f == &p)
    );

    let p = json_file(
        &dir,
        r#"{"cloud":"AzureChinaCloud","tenantId":"t","subscriptionId":"s","resourceGroup":"rg","useManagedIdentityExtension":true}"#,
    );
    let s = load(&ConfigSources {
        cloud_config_file: Some(p),
        nodes: vec!["0:1:p".into()],
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "https://management.chinacloudapi.cn/"
    );
    assert_eq!(
        s.azure.authority_host.as_str(),
        "https://login.chinacloudapi.cn/"
    );
}

#[test]
fn azure_json_workload_identity_reads_the_federated_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = json_file(
        &dir,
        r#"{"tenantId":"t","subscriptionId":"s","resourceGroup":"rg","aadClientId":"wi",
            "useFederatedWorkloadIdentityExtension":true,"aadFederatedTokenFile":"/var/run/token"}"#,
    );
    let s = load(&ConfigSources {
        cloud_config_file: Some(p),
        nodes: vec!["0:1:p".into()],
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(&s.azure.auth, AuthSettings::WorkloadIdentity { client_id, token_file } if client_id == "wi" && token_file == &PathBuf::from("/var/run/token"))
    );
}

#[test]
fn azure_json_problems_carry_the_field_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = json_file(&dir, r#"{"tenantId":"t","enableVMSSEtag":"sometimes"}"#);
    let e = load(&ConfigSources {
        cloud_config_file: Some(p.clone()),
        nodes: vec!["0:1:p".into()],
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(&e, "azure.json:enableVMSSEtag", "invalid type");
    let p = json_file(
        &dir,
        r#"{"cloud":"AzureMoonCloud","vmssCacheTTLInSeconds":0}"#,
    );
    let e = load(&ConfigSources {
        cloud_config_file: Some(p),
        nodes: vec!["0:1:p".into()],
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(&e, "azure.json:cloud", "unknown cloud");
    assert_problem(&e, "azure.json:vmssCacheTTLInSeconds", "> 0");
}

#[test]
fn secret_from_cloud_config_reads_only_a_non_empty_aad_client_secret() {
    assert_eq!(
        secret_from_cloud_config(r#"{"aadClientSecret":"x"}"#),
        Some("x".into())
    );
    assert_eq!(secret_from_cloud_config(r#"{"aadClientSecret":""}"#), None);
    assert_eq!(secret_from_cloud_config("not json"), None);
}

#[test]
fn nodes_specs_parse_like_cluster_autoscaler() {
    assert_eq!(
        parse_node_spec("0:10:aks-pool1-123-vmss").unwrap(),
        NodeGroupSpec {
            name: "aks-pool1-123-vmss".into(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 0,
            max_size: 10,
            desired_capacity: None,
            schedules: vec![],
            max_scale_down_step: None
        }
    );
    for (bad, needle) in [
        ("1:10", "MIN:MAX:NAME"),
        ("a:10:x", "MIN \"a\" is not a non-negative integer"),
        ("-1:10:x", "MIN \"-1\""),
        ("1:ten:x", "MAX \"ten\""),
        ("5:1:x", "greater than MAX"),
        ("1:10:", "NAME is empty"),
        ("1:2000:x", "limit of 1000"),
        ("1:2:bad/name", "not allowed"),
    ] {
        let e = parse_node_spec(bad).unwrap_err();
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn nodes_flags_are_validated_with_their_index_and_must_not_collide_with_yaml_groups() {
    let y = yaml(
        r#"
azure: {tenantId: t, subscriptionId: s, resourceGroup: rg, auth: {method: azureCli}}
nodeGroups: [{name: pool-a, minSize: 0, maxSize: 3}]
"#,
    );
    let e = load(&ConfigSources {
        config_file: Some(y.path.clone()),
        nodes: vec![
            "1:5:pool-b".into(),
            "1:5:pool-a".into(),
            "9:5:pool-c".into(),
        ],
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(
        &e,
        "--nodes[1]",
        "duplicate node group \"pool-a\" (also nodeGroups[0])",
    );
    assert_problem(&e, "--nodes[2]", "greater than MAX");
    assert_eq!(e.0.len(), 2, "{e}");
    let s = load(&ConfigSources {
        config_file: Some(y.path.clone()),
        nodes: vec!["1:5:pool-b".into()],
        ..Default::default()
    })
    .unwrap();
    let names: Vec<_> = s.node_groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, vec!["pool-a", "pool-b"]);
}

#[test]
fn cluster_name_variable_overrides_the_auto_discovery_cluster() {
    let y = yaml(
        r#"
azure: {tenantId: t, subscriptionId: s, resourceGroup: rg, auth: {method: azureCli}}
autoDiscovery: {clusterName: from-yaml, defaultMin: 0, defaultMax: 5}
"#,
    );
    let s = load(&ConfigSources {
        config_file: Some(y.path.clone()),
        env: env(&[("CLUSTER_NAME", "from-env")]),
        ..Default::default()
    })
    .unwrap();
    let ad = s.auto_discovery.unwrap();
    assert_eq!(ad.cluster_name, "from-env");
    assert_eq!((ad.default_min, ad.default_max), (Some(0), Some(5)));
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn auto(min: Option<u32>, max: Option<u32>) -> AutoDiscovery {
    AutoDiscovery {
        cluster_name: "aks-prod".into(),
        default_min: min,
        default_max: max,
        aks_cluster: None,
        aks_resource_group: None,
    }
}

#[test]
fn discovery_matches_only_enabled_scale_sets_of_this_cluster() {
    let sets = vec![
        (
            "ours".to_string(),
            tags(&[
                ("cluster-autoscaler-enabled", "true"),
                ("cluster-autoscaler-name", "aks-prod"),
            ]),
        ),
        (
            "other-cluster".to_string(),
            tags(&[
                ("cluster-autoscaler-enabled", "true"),
                ("cluster-autoscaler-name", "aks-dev"),
            ]),
        ),
        (
            "disabled".to_string(),
            tags(&[
                ("cluster-autoscaler-enabled", "false"),
                ("cluster-autoscaler-name", "aks-prod"),
            ]),
        ),
        ("untagged".to_string(), tags(&[])),
    ];
    let (found, skipped) = discover_node_groups(&auto(Some(1), Some(10)), &sets);
    assert_eq!(
        found,
        vec![NodeGroupSpec {
            name: "ours".into(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 1,
            max_size: 10,
            desired_capacity: None,
            schedules: vec![],
            max_scale_down_step: None
        }]
    );
    assert_eq!(skipped, vec![]);
}

#[test]
fn discovery_min_and_max_tags_win_over_the_defaults() {
    let sets = vec![(
        "ours".to_string(),
        tags(&[
            ("cluster-autoscaler-enabled", "true"),
            ("cluster-autoscaler-name", "aks-prod"),
            ("min", "2"),
            ("max", "7"),
        ]),
    )];
    let (found, _) = discover_node_groups(&auto(Some(1), Some(10)), &sets);
    assert_eq!((found[0].min_size, found[0].max_size), (2, 7));
    let (found, _) = discover_node_groups(&auto(None, None), &sets);
    assert_eq!((found[0].min_size, found[0].max_size), (2, 7));
}

#[test]
fn discovery_skips_scale_sets_without_bounds_or_with_inverted_bounds_and_says_why() {
    let base = [
        ("cluster-autoscaler-enabled", "true"),
        ("cluster-autoscaler-name", "aks-prod"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut t = base.to_vec();
        t.extend_from_slice(extra);
        tags(&t)
    };
    let sets = vec![
        ("no-bounds".to_string(), with(&[])),
        ("inverted".to_string(), with(&[("min", "5"), ("max", "2")])),
        (
            "garbage".to_string(),
            with(&[("min", "lots"), ("max", "3")]),
        ),
        ("only-min".to_string(), with(&[("min", "1")])),
    ];
    let (found, skipped) = discover_node_groups(&auto(None, None), &sets);
    assert_eq!(found, vec![]);
    let reason = |n: &str| {
        skipped
            .iter()
            .find(|(s, _)| s == n)
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    assert_eq!(reason("no-bounds"), "no min tag and no defaultMin");
    assert_eq!(reason("inverted"), "max 2 is less than min 5");
    assert!(reason("garbage").contains("not a non-negative integer"));
    assert_eq!(reason("only-min"), "no max tag and no defaultMax");
    // A default max rescues the only-min set.
    let (found, _) = discover_node_groups(&auto(None, Some(4)), &sets[3..]);
    assert_eq!((found[0].min_size, found[0].max_size), (1, 4));
}
