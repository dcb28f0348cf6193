//! YAML loading and validation: every rule, every problem with its path, all at once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use vmss_capacity_controller::config::*;

const VALID: &str = r#"
azure:
  resourceManagerEndpoint: http://127.0.0.1:8443
  authorityHost: http://127.0.0.1:8443
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg-demo
  auth: {method: clientSecret, clientId: controller}
nodeGroups:
  - {name: pool-a, minSize: 1, maxSize: 10, desiredCapacity: 3}
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

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load_with(text: &str, vars: &[(&str, &str)]) -> Result<Settings, ConfigErrors> {
    let f = yaml_file(text);
    load(&ConfigSources {
        config_file: Some(f.path.clone()),
        env: env(vars),
        ..Default::default()
    })
}

fn load_ok(text: &str) -> Settings {
    match load_with(text, &[("ARM_CLIENT_SECRET", "s")]) {
        Ok(s) => s,
        Err(e) => panic!("expected valid config, got:\n{e}"),
    }
}

fn problems(text: &str) -> Vec<ConfigProblem> {
    problems_env(text, &[("ARM_CLIENT_SECRET", "s")])
}

fn problems_env(text: &str, vars: &[(&str, &str)]) -> Vec<ConfigProblem> {
    match load_with(text, vars) {
        Ok(_) => panic!("expected problems for:\n{text}"),
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

fn with(extra: &str) -> String {
    format!("{VALID}{extra}")
}

fn replacing(from: &str, to: &str) -> String {
    assert!(VALID.contains(from), "{from}");
    VALID.replace(from, to)
}

#[test]
fn the_contract_keys_load_with_defaults_for_everything_else() {
    let s = load_ok(VALID);
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "http://127.0.0.1:8443/"
    );
    assert_eq!(s.azure.authority_host.as_str(), "http://127.0.0.1:8443/");
    assert_eq!(s.azure.imds_endpoint.as_str(), "http://169.254.169.254/");
    assert_eq!(s.azure.tenant_id, "tenant");
    assert_eq!(
        s.azure.subscription_id,
        "00000000-0000-0000-0000-000000000000"
    );
    assert_eq!(s.azure.resource_group, "rg-demo");
    match &s.azure.auth {
        AuthSettings::ClientSecret { client_id, secret } => {
            assert_eq!(client_id, "controller");
            assert!(matches!(secret, SecretSource::Env(v) if v == "ARM_CLIENT_SECRET"));
        }
        other => panic!("{other:?}"),
    }
    assert!(s.enable_vmss_etag);
    assert_eq!(s.conflict_strategy, ConflictStrategy::Replan);
    assert_eq!(s.scan_interval, DEFAULT_SCAN_INTERVAL);
    assert_eq!(s.vmss_cache_ttl, DEFAULT_VMSS_CACHE_TTL);
    assert_eq!(s.instance_cache_ttl, DEFAULT_INSTANCE_CACHE_TTL);
    assert_eq!(s.instance_cache_jitter, Duration::ZERO);
    assert_eq!(
        s.metrics_listen,
        Some(DEFAULT_METRICS_LISTEN.parse().unwrap())
    );
    assert_eq!(s.max_concurrent_writes, DEFAULT_MAX_CONCURRENT_WRITES);
    assert_eq!(s.write_budget, DEFAULT_WRITE_BUDGET);
    assert_eq!(s.agent_pool_write_budget, DEFAULT_AGENT_POOL_WRITE_BUDGET);
    assert_eq!(s.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert_eq!(s.request_timeout, DEFAULT_REQUEST_TIMEOUT);
    assert_eq!(s.quota_cooldown, DEFAULT_QUOTA_COOLDOWN);
    assert_eq!(
        s.node_groups,
        vec![NodeGroupSpec {
            name: "pool-a".into(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 1,
            max_size: 10,
            desired_capacity: Some(3),
            schedules: vec![],
            max_scale_down_step: None,
        }]
    );
    assert_eq!(s.auto_discovery, None);
}

#[test]
fn every_optional_key_is_parsed_into_its_typed_value() {
    let s = load_ok(&with(
        r#"
enableVMSSEtag: false
conflictStrategy: retryOnceThenBackoff
conflictBackoff: 2m
scanInterval: 1m30s
vmssCacheTTL: 45s
instanceCacheTTL: 10m
instanceCacheJitter: 15s
metricsListen: 127.0.0.1:9000
maxConcurrentWrites: 3
writeBudget: {perMinute: 2.5, burst: 4}
shutdownGrace: 0s
requestTimeout: 5s
quotaCooldown: 1m
armBudgetReservePercentage: 35
autoDiscovery: {clusterName: my-cluster, defaultMin: 1, defaultMax: 10}
"#,
    ));
    assert_eq!(s.arm_budget_reserve, 0.35);
    assert!(!s.enable_vmss_etag);
    assert_eq!(
        s.conflict_strategy,
        ConflictStrategy::RetryOnceThenBackoff {
            backoff: Duration::from_secs(120)
        }
    );
    assert_eq!(s.scan_interval, Duration::from_secs(90));
    assert_eq!(s.vmss_cache_ttl, Duration::from_secs(45));
    assert_eq!(s.instance_cache_ttl, Duration::from_secs(600));
    assert_eq!(s.instance_cache_jitter, Duration::from_secs(15));
    assert_eq!(s.metrics_listen, Some("127.0.0.1:9000".parse().unwrap()));
    assert_eq!(s.max_concurrent_writes, 3);
    assert_eq!(
        s.write_budget,
        WriteBudget {
            per_minute: 2.5,
            burst: 4
        }
    );
    assert_eq!(
        s.agent_pool_write_budget, s.write_budget,
        "a configured writeBudget is every node group's"
    );
    assert_eq!(s.shutdown_grace, Duration::ZERO);
    assert_eq!(s.request_timeout, Duration::from_secs(5));
    assert_eq!(s.quota_cooldown, Duration::from_secs(60));
    assert_eq!(
        s.auto_discovery,
        Some(AutoDiscovery {
            cluster_name: "my-cluster".into(),
            default_min: Some(1),
            default_max: Some(10),
            aks_cluster: None,
            aks_resource_group: None,
        })
    );
}

#[test]
fn the_api_budget_reserve_is_a_percentage_from_0_to_90_and_20_by_default() {
    assert_eq!(load_ok(&with("")).arm_budget_reserve, 0.2);
    assert_eq!(
        load_ok(&with("armBudgetReservePercentage: 0\n")).arm_budget_reserve,
        0.0,
        "0 turns pacing off"
    );
    for bad in ["95", "-1", ".nan"] {
        assert_problem(
            &problems(&with(&format!("armBudgetReservePercentage: {bad}\n"))),
            "armBudgetReservePercentage",
            "from 0 (pacing off) to 90",
        );
    }
    let p = problems(&with("armBudgetReservePercentage: lots\n"));
    assert!(
        p.iter()
            .any(|p| p.path.contains("armBudgetReservePercentage")
                || p.message.contains("armBudgetReservePercentage")),
        "{}",
        ConfigErrors(p.to_vec())
    );
}

#[test]
fn next_loop_strategy_and_null_metrics_listen_are_accepted() {
    let s = load_ok(&with("conflictStrategy: nextLoop\nmetricsListen: null\n"));
    assert_eq!(s.conflict_strategy, ConflictStrategy::NextLoop);
    assert_eq!(s.metrics_listen, None);
}

#[test]
fn schedules_parse_times_and_days_into_seconds_and_indices() {
    let s = load_ok(&replacing(
        "desiredCapacity: 3}",
        r#"desiredCapacity: 3, maxScaleDownStep: 2, schedules: [
            {start: "08:00", end: "18:00:30", days: [mon, fri, sun], desiredCapacity: 6},
            {start: "22:00", end: "06:00", desiredCapacity: 1}]}"#,
    ));
    let g = &s.node_groups[0];
    assert_eq!(g.max_scale_down_step, Some(2));
    assert_eq!(
        g.schedules,
        vec![
            Schedule {
                start_secs: 8 * 3600,
                end_secs: 18 * 3600 + 30,
                days: vec![0, 4, 6],
                desired_capacity: 6
            },
            Schedule {
                start_secs: 22 * 3600,
                end_secs: 6 * 3600,
                days: vec![],
                desired_capacity: 1
            },
        ]
    );
}

#[test]
fn unknown_keys_are_reported_with_their_full_path() {
    let ps = problems(&with(
        r#"
scanIntervall: 10s
writeBudget: {perMinute: 4, burstt: 1}
"#,
    ));
    assert_problem(&ps, "scanIntervall", "unknown key");
    assert_problem(&ps, "writeBudget.burstt", "unknown key");
    let ps = problems(&replacing(
        "desiredCapacity: 3}",
        "desiredCapacity: 3, maxsize: 4}",
    ));
    assert_problem(&ps, "nodeGroups[0].maxsize", "expected one of");
    let ps = problems(&replacing(
        "resourceGroup: rg-demo",
        "resourceGroup: rg-demo\n  region: x",
    ));
    assert_problem(&ps, "azure.region", "unknown key");
}

#[test]
fn a_yaml_with_four_mistakes_reports_four_problems() {
    let text = r#"
azure:
  tenantId: tenant
  subscriptionId: sub
  resourceGroup: rg
  auth: {method: clientSecret, clientId: controller}
scanInterval: soon
nodeGroups:
  - {name: pool-a, minSize: 5, maxSize: 2}
  - {name: pool-b, minSize: 1, maxSize: 3, desiredCapacity: 7}
  - {name: pool-c, minSize: 1, maxSize: 3, colour: blue}
"#;
    let ps = problems(text);
    assert_eq!(ps.len(), 4, "{}", ConfigErrors(ps.clone()));
    assert_problem(&ps, "scanInterval", "invalid duration");
    assert_problem(&ps, "nodeGroups[0].minSize", "greater than maxSize");
    assert_problem(&ps, "nodeGroups[1].desiredCapacity", "outside");
    assert_problem(&ps, "nodeGroups[2].colour", "unknown key");
}

#[test]
fn problems_render_one_per_line_as_path_colon_message() {
    let errs = ConfigErrors(vec![
        ConfigProblem {
            path: "nodeGroups[1].maxSize".into(),
            message: "required".into(),
            file: None,
        },
        ConfigProblem {
            path: "env AZURE_ENABLE_VMSS_ETAG".into(),
            message: "\"yes\" is not a boolean".into(),
            file: None,
        },
    ]);
    assert_eq!(
        render_problems(&errs),
        "nodeGroups[1].maxSize: required\nenv AZURE_ENABLE_VMSS_ETAG: \"yes\" is not a boolean"
    );
    let as_error: &dyn std::error::Error = &errs;
    assert_eq!(as_error.to_string(), render_problems(&errs));
}

#[test]
fn invalid_yaml_syntax_is_one_problem_naming_the_file() {
    let f = yaml_file("azure: [unclosed\n");
    let e = load(&ConfigSources {
        config_file: Some(f.path.clone()),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(e.0[0].path, f.path.display().to_string());
    assert!(e.0[0].message.contains("not valid YAML"));
}

#[test]
fn a_missing_config_file_is_a_problem() {
    let e = load(&ConfigSources {
        config_file: Some("/nonexistent/config.yaml".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert_problem(&e.0, "/nonexistent/config.yaml", "cannot read");
}

#[test]
fn node_group_names_must_be_valid_scale_set_names() {
    for (name, needle) in [
        ("\"\"", "must not be empty"),
        ("\"pool a\"", "not allowed"),
        ("\"pool/a\"", "not allowed"),
        (&"x".repeat(65), "longer than 64"),
    ] {
        let ps = problems(&replacing("name: pool-a", &format!("name: {name}")));
        assert_problem(&ps, "nodeGroups[0].name", needle);
    }
    load_ok(&replacing("name: pool-a", "name: Pool_A.1-x"));
    load_ok(&replacing(
        "name: pool-a",
        &format!("name: {}", "x".repeat(64)),
    ));
}

#[test]
fn node_group_names_must_be_unique_ignoring_case() {
    let ps = problems(&with("  - {name: POOL-A, minSize: 0, maxSize: 1}\n"));
    assert_problem(&ps, "nodeGroups[1].name", "duplicate node group");
}

#[test]
fn min_size_must_not_exceed_max_size_and_max_size_is_capped_at_1000() {
    assert_problem(
        &problems(&replacing(
            "minSize: 1, maxSize: 10, desiredCapacity: 3",
            "minSize: 4, maxSize: 3",
        )),
        "nodeGroups[0].minSize",
        "greater than maxSize",
    );
    assert_problem(
        &problems(&replacing("maxSize: 10", "maxSize: 1001")),
        "nodeGroups[0].maxSize",
        "limit of 1000",
    );
    load_ok(&replacing(
        "minSize: 1, maxSize: 10, desiredCapacity: 3",
        "minSize: 0, maxSize: 1000",
    ));
}

#[test]
fn sizes_are_required_and_non_negative() {
    let ps = problems(&replacing(
        "minSize: 1, maxSize: 10, desiredCapacity: 3",
        "maxSize: 3",
    ));
    assert_problem(&ps, "nodeGroups[0].minSize", "required");
    let ps = problems(&replacing("minSize: 1", "minSize: -1"));
    assert_problem(&ps, "nodeGroups[0].minSize", "invalid value");
}

#[test]
fn desired_and_schedule_capacities_must_be_within_min_and_max() {
    assert_problem(
        &problems(&replacing("desiredCapacity: 3", "desiredCapacity: 11")),
        "nodeGroups[0].desiredCapacity",
        "outside [minSize 1, maxSize 10]",
    );
    assert_problem(
        &problems(&replacing(
            "desiredCapacity: 3}",
            r#"desiredCapacity: 3, schedules: [{start: "08:00", end: "09:00", desiredCapacity: 0}]}"#,
        )),
        "nodeGroups[0].schedules[0].desiredCapacity",
        "outside",
    );
}

#[test]
fn schedule_times_and_days_are_checked() {
    let sched = |s: &str| {
        replacing(
            "desiredCapacity: 3}",
            &format!("desiredCapacity: 3, schedules: [{s}]}}"),
        )
    };
    assert_problem(
        &problems(&sched(
            r#"{start: "24:00", end: "09:00", desiredCapacity: 2}"#,
        )),
        "nodeGroups[0].schedules[0].start",
        "HH:MM",
    );
    assert_problem(
        &problems(&sched(
            r#"{start: "8am", end: "09:00", desiredCapacity: 2}"#,
        )),
        "nodeGroups[0].schedules[0].start",
        "HH:MM",
    );
    assert_problem(
        &problems(&sched(
            r#"{start: "08:00", end: "09:00", days: [mon, funday], desiredCapacity: 2}"#,
        )),
        "nodeGroups[0].schedules[0].days[1]",
        "unknown variant",
    );
    assert_problem(
        &problems(&sched(
            r#"{start: "08:00", end: "08:00", desiredCapacity: 2}"#,
        )),
        "nodeGroups[0].schedules[0].end",
        "empty",
    );
    assert_problem(
        &problems(&sched(r#"{start: "08:00", desiredCapacity: 2}"#)),
        "nodeGroups[0].schedules[0].end",
        "required",
    );
}

#[test]
fn max_scale_down_step_of_zero_is_rejected() {
    assert_problem(
        &problems(&replacing(
            "desiredCapacity: 3}",
            "desiredCapacity: 3, maxScaleDownStep: 0}",
        )),
        "nodeGroups[0].maxScaleDownStep",
        "> 0",
    );
}

#[test]
fn tenant_subscription_and_resource_group_are_required() {
    let text = VALID
        .replace("  tenantId: tenant\n", "")
        .replace(
            "  subscriptionId: \"00000000-0000-0000-0000-000000000000\"\n",
            "",
        )
        .replace("  resourceGroup: rg-demo\n", "");
    let ps = problems(&text);
    assert_problem(&ps, "azure.tenantId", "required");
    assert_problem(&ps, "azure.subscriptionId", "required");
    assert_problem(&ps, "azure.resourceGroup", "required");
}

#[test]
fn tenant_is_not_required_for_managed_identity() {
    let text = VALID.replace("  tenantId: tenant\n", "").replace(
        "{method: clientSecret, clientId: controller}",
        "{method: managedIdentity}",
    );
    let s = load_ok(&text);
    assert!(matches!(
        s.azure.auth,
        AuthSettings::ManagedIdentity { client_id: None }
    ));
}

#[test]
fn client_secret_needs_a_client_id_and_a_secret() {
    let text = replacing(
        "{method: clientSecret, clientId: controller}",
        "{method: clientSecret}",
    );
    let ps = problems_env(&text, &[]);
    assert_problem(&ps, "azure.auth.clientId", "required");
    assert_problem(&ps, "azure.auth.clientSecretFile", "needs a secret");
}

#[test]
fn a_client_secret_in_yaml_is_rejected_because_secrets_never_go_in_yaml() {
    let text = replacing(
        "clientId: controller}",
        "clientId: controller, clientSecret: hunter2}",
    );
    let ps = problems(&text);
    assert_problem(&ps, "azure.auth.clientSecret", "secrets never go in YAML");
    assert!(!ConfigErrors(ps).to_string().contains("hunter2"));
}

#[test]
fn client_secret_file_is_used_when_no_secret_variable_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s").unwrap();
    let text = replacing(
        "clientId: controller}",
        &format!(
            "clientId: controller, clientSecretFile: {}}}",
            secret.display()
        ),
    );
    let s = load_with(&text, &[]).unwrap();
    match s.azure.auth {
        AuthSettings::ClientSecret {
            secret: SecretSource::File(p),
            ..
        } => assert_eq!(p, secret),
        other => panic!("{other:?}"),
    }
    // The environment still wins over the file.
    let s = load_with(&text, &[("ARM_CLIENT_SECRET", "x")]).unwrap();
    assert!(matches!(
        s.azure.auth,
        AuthSettings::ClientSecret { secret: SecretSource::Env(ref v), .. } if v == "ARM_CLIENT_SECRET"
    ));
    // AZURE_CLIENT_SECRET is the fallback name.
    let s = load_with(VALID, &[("AZURE_CLIENT_SECRET", "x")]).unwrap();
    assert!(matches!(
        s.azure.auth,
        AuthSettings::ClientSecret { secret: SecretSource::Env(ref v), .. } if v == "AZURE_CLIENT_SECRET"
    ));
}

#[test]
fn an_unreadable_client_secret_file_is_a_problem() {
    let text = replacing(
        "clientId: controller}",
        "clientId: controller, clientSecretFile: /nonexistent/secret}",
    );
    assert_problem(
        &problems_env(&text, &[]),
        "azure.auth.clientSecretFile",
        "cannot read",
    );
}

#[test]
fn workload_identity_needs_a_client_id_and_a_token_file() {
    let text = replacing(
        "{method: clientSecret, clientId: controller}",
        "{method: workloadIdentity}",
    );
    let ps = problems_env(&text, &[]);
    assert_problem(&ps, "azure.auth.clientId", "required");
    assert_problem(&ps, "azure.auth.tokenFile", "AZURE_FEDERATED_TOKEN_FILE");
    let s = load_with(
        &text,
        &[
            ("AZURE_CLIENT_ID", "wi"),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                "/var/run/secrets/azure/tokens/azure-identity-token",
            ),
        ],
    )
    .unwrap();
    match s.azure.auth {
        AuthSettings::WorkloadIdentity {
            client_id,
            token_file,
        } => {
            assert_eq!(client_id, "wi");
            assert_eq!(
                token_file,
                PathBuf::from("/var/run/secrets/azure/tokens/azure-identity-token")
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_of_another_auth_method_are_reported_as_unused() {
    let text = replacing(
        "{method: clientSecret, clientId: controller}",
        "{method: managedIdentity, tokenFile: /t}",
    );
    assert_problem(
        &problems(&text),
        "azure.auth.tokenFile",
        "not used by method managedIdentity",
    );
}

#[test]
fn managed_identity_client_id_selects_a_user_assigned_identity_and_azure_cli_needs_nothing() {
    let s = load_ok(&replacing(
        "{method: clientSecret, clientId: controller}",
        "{method: managedIdentity, clientId: uami}",
    ));
    assert!(
        matches!(s.azure.auth, AuthSettings::ManagedIdentity { client_id: Some(ref c) } if c == "uami")
    );
    let s = load_ok(&replacing(
        "{method: clientSecret, clientId: controller}",
        "{method: azureCli}",
    ));
    assert!(matches!(s.azure.auth, AuthSettings::AzureCli));
}

#[test]
fn unknown_auth_method_is_reported_with_the_valid_choices() {
    let ps = problems(&replacing("method: clientSecret", "method: certificate"));
    assert_problem(&ps, "azure.auth.method", "clientSecret");
}

#[test]
fn http_endpoints_are_allowed_only_for_loopback_hosts() {
    for host in ["127.0.0.1:8443", "127.1.2.3", "localhost:1", "[::1]:8443"] {
        let s = load_ok(&VALID.replace("127.0.0.1:8443", host));
        assert_eq!(s.azure.resource_manager_endpoint.scheme(), "http");
    }
    let ps = problems(&VALID.replace("http://127.0.0.1:8443", "http://management.example.com"));
    assert_problem(
        &ps,
        "azure.resourceManagerEndpoint",
        "http:// is allowed only for loopback hosts; use https for management.example.com",
    );
    assert_problem(
        &ps,
        "azure.authorityHost",
        "use https for management.example.com",
    );
    let ps = problems(&replacing(
        "resourceManagerEndpoint: http://127.0.0.1:8443",
        "resourceManagerEndpoint: ftp://127.0.0.1",
    ));
    assert_problem(&ps, "azure.resourceManagerEndpoint", "unsupported scheme");
    let ps = problems(&replacing(
        "resourceManagerEndpoint: http://127.0.0.1:8443",
        "resourceManagerEndpoint: not a url",
    ));
    assert_problem(&ps, "azure.resourceManagerEndpoint", "not a URL");
}

#[test]
fn imds_endpoint_can_be_overridden_for_tests() {
    let s = load_ok(&replacing(
        "resourceGroup: rg-demo",
        "resourceGroup: rg-demo\n  imdsEndpoint: http://127.0.0.1:9999",
    ));
    assert_eq!(s.azure.imds_endpoint.as_str(), "http://127.0.0.1:9999/");
}

#[test]
fn ca_bundle_must_be_readable_and_look_like_pem() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("ca.pem");
    std::fs::write(
        &good,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let bad = dir.path().join("ca.der");
    std::fs::write(&bad, [0x30u8, 0x82, 0x01]).unwrap();
    let with_ca = |p: &str| {
        replacing(
            "resourceGroup: rg-demo",
            &format!("resourceGroup: rg-demo\n  caBundleFile: {p}"),
        )
    };
    let s = load_ok(&with_ca(&good.display().to_string()));
    assert_eq!(s.azure.ca_bundle_file, Some(good));
    assert_problem(
        &problems(&with_ca(&bad.display().to_string())),
        "azure.caBundleFile",
        "PEM",
    );
    assert_problem(
        &problems(&with_ca("/nonexistent/ca.pem")),
        "azure.caBundleFile",
        "cannot read",
    );
}

#[test]
fn durations_that_matter_must_be_positive_and_well_formed() {
    for key in [
        "scanInterval",
        "vmssCacheTTL",
        "instanceCacheTTL",
        "requestTimeout",
        "quotaCooldown",
        "conflictBackoff",
    ] {
        assert_problem(
            &problems(&with(&format!("{key}: 0s\n"))),
            key,
            "greater than 0",
        );
        assert_problem(
            &problems(&with(&format!("{key}: 10 parsecs\n"))),
            key,
            "invalid duration",
        );
    }
    assert_problem(
        &problems(&with("scanInterval: 10\n")),
        "scanInterval",
        "expected a duration",
    );
    load_ok(&with("instanceCacheJitter: 0s\nshutdownGrace: 0s\n"));
}

#[test]
fn counts_and_budgets_must_be_positive() {
    let ps = problems(&with(
        "maxConcurrentWrites: 0\nwriteBudget: {perMinute: 0, burst: 0}\n",
    ));
    assert_problem(&ps, "maxConcurrentWrites", "at least 1");
    assert_problem(&ps, "writeBudget.perMinute", "> 0");
    assert_problem(&ps, "writeBudget.burst", "at least 1");
    assert_problem(
        &problems(&with("metricsListen: everywhere\n")),
        "metricsListen",
        "not an address",
    );
}

#[test]
fn at_least_one_node_group_or_auto_discovery_is_required() {
    let text = VALID.split("nodeGroups:").next().unwrap().to_string();
    assert_problem(&problems(&text), "nodeGroups", "nothing to manage");
    let s = load_ok(&format!("{text}autoDiscovery: {{clusterName: c}}\n"));
    assert_eq!(s.node_groups, vec![]);
    assert_eq!(s.auto_discovery.unwrap().cluster_name, "c");
}

#[test]
fn auto_discovery_needs_a_cluster_name_and_ordered_defaults() {
    let ps = problems(&with("autoDiscovery: {defaultMin: 5, defaultMax: 2}\n"));
    assert_problem(&ps, "autoDiscovery.clusterName", "required");
    assert_problem(&ps, "autoDiscovery.defaultMin", "greater than defaultMax");
}

#[test]
fn an_empty_file_reports_what_is_missing_rather_than_a_parse_error() {
    let ps = problems_env("", &[]);
    assert_problem(&ps, "azure.subscriptionId", "required");
    assert_problem(&ps, "azure.auth", "no credential configured");
    assert_problem(&ps, "nodeGroups", "nothing to manage");
}

#[test]
fn the_shipped_example_and_emulator_configs_are_valid() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let s = load(&ConfigSources {
        config_file: Some(root.join("config/emulator.yaml")),
        env: env(&[("ARM_CLIENT_SECRET", "anything")]),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.azure.resource_manager_endpoint.as_str(),
        "http://127.0.0.1:8443/"
    );
    assert_eq!(s.azure.resource_group, "rg-demo");
    assert_eq!(s.node_groups.len(), 2);
    let s = load(&ConfigSources {
        config_file: Some(root.join("config/example.yaml")),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        s.azure.auth,
        AuthSettings::WorkloadIdentity { .. }
    ));
    assert_eq!(s.auto_discovery.unwrap().cluster_name, "aks-prod");
    assert_eq!(
        s.agent_pool_write_budget, DEFAULT_AGENT_POOL_WRITE_BUDGET,
        "the example's agent pool keeps a budget inside AKS's bucket"
    );
    // The spot-first example: two pools, spot tried first by the priority expander.
    let s = load(&ConfigSources {
        config_file: Some(root.join("config/spot-fallback.yaml")),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = s.node_groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["spot", "ondemand"]);
    assert_eq!(
        s.pod_demand.expander,
        vmss_capacity_controller::pods::expander::Expander::Priority(vec![
            (50, vec!["spot".to_string()]),
            (10, vec!["ondemand".to_string()]),
        ])
    );
}

/// Line and column (from 1) of the first `needle` on the line that contains `line_has`.
fn line_column(text: &str, line_has: &str, needle: &str) -> (usize, usize) {
    let (i, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(line_has))
        .unwrap_or_else(|| panic!("no line with {line_has:?}"));
    (i + 1, line.find(needle).expect("needle on the line") + 1)
}

#[test]
fn a_problem_in_the_config_file_names_the_file_and_the_line_and_column_of_its_key() {
    let text = r#"azure:
  resourceManagerEndpoint: http://127.0.0.1:8443
  authorityHost: http://127.0.0.1:8443
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg-demo
  auth: {method: clientSecret, clientId: controller}
scanInterval: soon
nodeGroups:
  - {name: pool-a, minSize: 5, maxSize: 2}
  - name: pool-b
    minSize: 1
    maxSize: 3
    colour: blue
"#;
    let f = yaml_file(text);
    let errs = load(&ConfigSources {
        config_file: Some(f.path.clone()),
        env: env(&[("ARM_CLIENT_SECRET", "s")]),
        ..Default::default()
    })
    .expect_err("three problems");
    let file = f.path.display().to_string();
    let said = render_problems(&errs);
    for (path, (line, column), words) in [
        (
            "scanInterval",
            line_column(text, "scanInterval", "scanInterval"),
            "invalid duration",
        ),
        (
            "nodeGroups[0].minSize",
            line_column(text, "pool-a", "minSize"),
            "greater than maxSize",
        ),
        (
            "nodeGroups[1].colour",
            line_column(text, "colour", "colour"),
            "unknown key",
        ),
    ] {
        let start = format!("{file}:{line}:{column}: {path}: ");
        assert!(
            said.lines()
                .any(|l| l.starts_with(&start) && l.contains(words)),
            "no line starting {start:?} and saying {words:?} in:\n{said}"
        );
        let p = errs.0.iter().find(|p| p.path == path).expect("the problem");
        assert_eq!(
            p.file,
            Some(FileLocation {
                path: f.path.clone(),
                line_column: Some((line, column))
            })
        );
    }

    // A key the file lacks: the nearest enclosing key it has.
    let without = text.replace("    maxSize: 3\n", "");
    let f2 = yaml_file(&without);
    let errs = load(&ConfigSources {
        config_file: Some(f2.path.clone()),
        env: env(&[("ARM_CLIENT_SECRET", "s")]),
        ..Default::default()
    })
    .expect_err("problems");
    let p = errs
        .0
        .iter()
        .find(|p| p.path == "nodeGroups[1].maxSize")
        .expect("maxSize is required");
    assert_eq!(
        p.file.as_ref().and_then(|l| l.line_column),
        Some(line_column(&without, "pool-b", "name")),
        "the list item's place: {p:?}"
    );

    // Text that is not YAML: the parser's line and column, before the message.
    let f3 = yaml_file("azure: {tenantId: [unclosed\n");
    let errs = load(&ConfigSources {
        config_file: Some(f3.path.clone()),
        ..Default::default()
    })
    .expect_err("not YAML");
    let p = &errs.0[0];
    let at = p
        .file
        .as_ref()
        .and_then(|l| l.line_column)
        .expect("a place");
    assert!(
        render_problems(&errs).starts_with(&format!(
            "{}:{}:{}: not valid YAML: ",
            f3.path.display(),
            at.0,
            at.1
        )),
        "{errs}"
    );

    // What is not in the file names no file.
    let errs = load(&ConfigSources {
        config_file: Some(f.path.clone()),
        env: env(&[
            ("ARM_CLIENT_SECRET", "s"),
            ("AZURE_ENABLE_VMSS_ETAG", "yes"),
        ]),
        ..Default::default()
    })
    .expect_err("problems");
    let p = errs
        .0
        .iter()
        .find(|p| p.path == "env AZURE_ENABLE_VMSS_ETAG")
        .expect("the environment's problem");
    assert_eq!(p.file, None);
}

#[test]
fn relative_paths_in_a_config_file_resolve_against_its_folder_not_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("config");
    std::fs::create_dir(&folder).unwrap();
    for f in ["kubeconfig", "secret"] {
        std::fs::write(folder.join(f), "x").unwrap();
    }
    std::fs::write(
        folder.join("ca.pem"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let path = folder.join("c.yaml");
    std::fs::write(
        &path,
        VALID.replace(
            "  auth: {method: clientSecret, clientId: controller}",
            "  caBundleFile: ./ca.pem\n  auth: {method: clientSecret, clientId: controller, clientSecretFile: secret}",
        ) + "kubernetes: {enabled: true, kubeconfig: ./kubeconfig}\n",
    )
    .unwrap();
    // The test's working directory is the crate's, which has no such files.
    assert!(
        !std::path::Path::new("ca.pem").exists() && !std::path::Path::new("kubeconfig").exists()
    );
    let s = load(&ConfigSources {
        config_file: Some(path.clone()),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.ca_bundle_file, Some(folder.join("ca.pem")));
    assert_eq!(s.kubernetes.kubeconfig, Some(folder.join("kubeconfig")));
    match &s.azure.auth {
        AuthSettings::ClientSecret {
            secret: SecretSource::File(f),
            ..
        } => assert_eq!(f, &folder.join("secret")),
        other => panic!("{other:?}"),
    }
    // An absolute path stays as written.
    let absolute = folder.join("ca.pem");
    std::fs::write(
        &path,
        VALID.replace(
            "  auth:",
            &format!("  caBundleFile: {}\n  auth:", absolute.display()),
        ),
    )
    .unwrap();
    let s = load(&ConfigSources {
        config_file: Some(path),
        env: env(&[("ARM_CLIENT_SECRET", "s")]),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.azure.ca_bundle_file, Some(absolute));
}

#[test]
fn agent_pools_default_to_a_budget_inside_aks_bucket_per_pool_and_a_configured_key_wins_for_both_kinds(
) {
    let s = load_ok(VALID);
    let pool = NodeGroupKind::AksAgentPool {
        cluster: "aks-1".into(),
    };
    assert_eq!(
        s.write_budget_of(&NodeGroupKind::Vmss),
        DEFAULT_WRITE_BUDGET
    );
    assert_eq!(s.write_budget_of(&pool), DEFAULT_AGENT_POOL_WRITE_BUDGET);
    // AKS refills a pool's PUT bucket at 1 a minute, burst 20: the default takes at most half.
    let aks = vmss_capacity_controller::emulator::AksLimits::aks();
    let pools = s.write_budget_of(&pool);
    assert!(
        2.0 * pools.per_minute <= aks.pool_write_per_min,
        "{pools:?}"
    );
    assert!(2 * pools.burst <= aks.pool_write_burst, "{pools:?}");
    let s = load_ok(&with("writeBudget: {perMinute: 2}\n"));
    assert_eq!(
        s.write_budget_of(&NodeGroupKind::Vmss),
        WriteBudget {
            per_minute: 2.0,
            burst: DEFAULT_WRITE_BUDGET.burst
        }
    );
    assert_eq!(
        s.write_budget_of(&pool),
        WriteBudget {
            per_minute: 2.0,
            burst: DEFAULT_AGENT_POOL_WRITE_BUDGET.burst
        },
        "the key given wins, the other stays the kind's default"
    );
}
