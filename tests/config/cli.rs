//! Black-box tests of the real binary: the contract that tests and users outside the project
//! rely on (`run --config FILE --once`, the config keys, `check-config`, `scale --if-match`,
//! `emulator --listen`).

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{RG, SUB};
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle, ScaleSetSeed};

const BIN: &str = env!("CARGO_BIN_EXE_vmss-capacity-controller");
const SECRET: &str = "s3cret-value-for-cli-tests";

fn write_config(dir: &std::path::Path, base_url: &str, etag: bool) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            r#"azure:
  resourceManagerEndpoint: {base_url}
  authorityHost: {base_url}
  tenantId: tenant
  subscriptionId: {SUB}
  resourceGroup: {RG}
  auth:
    method: clientSecret
    clientId: cli-controller
enableVMSSEtag: {etag}
scanInterval: 1s
vmssCacheTTL: 2s
metricsListen: 127.0.0.1:0
nodeGroups:
  - name: pool-a
    minSize: 1
    maxSize: 10
    desiredCapacity: 4
  - name: pool-b
    minSize: 0
    maxSize: 3
"#
        ),
    )
    .unwrap();
    path
}

async fn emulator() -> EmulatorHandle {
    let emu = EmulatorBuilder::new().start().await.unwrap();
    let state = emu.state();
    state.register_client("cli-controller", SECRET);
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "pool-a", 2));
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "pool-b", 7));
    emu
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("ARM_CLIENT_SECRET", SECRET)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

async fn run_async(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&refs)
    })
    .await
    .unwrap()
}

/// `run --config FILE --once [extra...]` on the real binary.
async fn run_once(config: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run".to_string(),
        "--config".into(),
        config.display().to_string(),
        "--once".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    run_async(args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_reconciles_every_group_with_if_match_and_exits_zero() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true);
    let out = run_once(&config, &[]).await;
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = emu.state();
    assert_eq!(
        state.scale_set(SUB, RG, "pool-a").unwrap().capacity,
        4,
        "desiredCapacity"
    );
    assert_eq!(
        state.scale_set(SUB, RG, "pool-b").unwrap().capacity,
        3,
        "clamped to maxSize"
    );
    let puts: Vec<_> = state
        .request_log()
        .into_iter()
        .filter(|r| r.method == "PUT")
        .collect();
    assert_eq!(puts.len(), 2);
    assert!(puts
        .iter()
        .all(|p| p.if_match.is_some() && p.writer.as_deref() == Some("cli-controller")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains(SECRET),
        "the secret never reaches the logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_with_the_flag_off_writes_blind() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), false);
    let out = run_once(&config, &[]).await;
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let puts: Vec<_> = emu
        .state()
        .request_log()
        .into_iter()
        .filter(|r| r.method == "PUT")
        .collect();
    assert!(!puts.is_empty() && puts.iter().all(|p| p.if_match.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_once_exits_non_zero_when_the_pass_fails() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on this port: the LIST fails.
    let config = write_config(dir.path(), "http://127.0.0.1:9", true);
    let out = run_once(&config, &[]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_plans_but_never_writes() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true);
    let out = run_once(&config, &["--dry-run"]).await;
    assert!(out.status.success());
    assert!(emu.state().request_log().iter().all(|r| r.method != "PUT"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dry run"));
}

#[test]
fn check_config_prints_every_problem_with_its_path_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "azure:\n  resourceManagerEndpoint: http://example.com\n  tenantId: t\n  subscriptionId: s\n  resourceGroup: r\n  auth: {method: clientSecret, clientId: c}\nscanInterval: soon\nnodeGroups:\n  - {name: a, minSize: 5, maxSize: 2}\n  - {name: b, minSize: 0, maxSize: 3, bogus: 1}\n",
    )
    .unwrap();
    let out = run(&["check-config", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for path in [
        "azure.resourceManagerEndpoint",
        "scanInterval",
        "nodeGroups[0]",
        "nodeGroups[1].bogus",
    ] {
        assert!(err.contains(path), "{path} not named in:\n{err}");
    }
}

#[test]
fn check_config_accepts_the_shipped_example() {
    let out = run(&[
        "check-config",
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.yaml"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_cli_arguments_get_a_clear_error_not_a_panic() {
    for args in [
        &["scale", "pool-a", "--to", "x"][..],
        &["run", "--bogus"],
        &["emulator", "--listen", "nope"],
        &[
            "emulator",
            "--throttling",
            "--subscription-limits-scale",
            "2",
        ],
        &[
            "emulator",
            "--throttling",
            "--subscription-limits-scale",
            "half",
        ],
        &["demo", "--duration", "forever"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("error:") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn demo_cost_refuses_empty_first_without_hinted_nodes_before_it_runs() {
    let out = run(&[
        "demo",
        "--cost",
        "--empty-first",
        "10m",
        "--deletion-cost-hints",
        "0",
    ]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--empty-first needs --deletion-cost-hints of at least 1")
            && !err.contains("panicked"),
        "{err}"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!said.contains("cost trace"), "the day was not run: {said}");
}

#[test]
fn help_explains_every_subcommand() {
    let out = run(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "demo", "emulator", "get", "scale", "check-config"] {
        assert!(text.contains(cmd), "{cmd} missing from --help:\n{text}");
    }
    assert!(text.contains("If-Match"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_with_a_stale_if_match_is_refused_with_412_and_exit_3() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true)
        .display()
        .to_string();
    let got = run_async(vec![
        "get".into(),
        "--config".into(),
        config.clone(),
        "pool-a".into(),
    ])
    .await;
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    let text = String::from_utf8_lossy(&got.stdout).to_string();
    let etag = text
        .lines()
        .find_map(|l| l.strip_prefix("etag:"))
        .unwrap()
        .trim()
        .to_string();
    let ok = run_async(vec![
        "scale".into(),
        "--config".into(),
        config.clone(),
        "pool-a".into(),
        "--to".into(),
        "5".into(),
        "--if-match".into(),
        etag.clone(),
    ])
    .await;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(
        emu.state().scale_set(SUB, RG, "pool-a").unwrap().capacity,
        5
    );
    let stale = run_async(vec![
        "scale".into(),
        "--config".into(),
        config,
        "pool-a".into(),
        "--to".into(),
        "9".into(),
        "--if-match".into(),
        etag,
    ])
    .await;
    assert_eq!(stale.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&stale.stderr).contains("412"));
    assert_eq!(
        emu.state().scale_set(SUB, RG, "pool-a").unwrap().capacity,
        5,
        "the stale write changed nothing"
    );
}

#[test]
fn the_emulator_subcommand_announces_its_address_and_writes_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let mut child = Command::new(BIN)
        .args([
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--tls",
            "--cert-out",
            ca.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("emulator listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let pem = std::fs::read(&ca).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        client
            .get(format!("{url}/_emulator/healthz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        status.unwrap(),
        200,
        "the CA written by --cert-out verifies the server"
    );
}

/// Creates managed cluster `aks-1` with pool `np1` (count 2) through the ARM API.
async fn seed_cluster(emu: &EmulatorHandle) {
    seed_cluster_with(
        emu,
        serde_json::json!({"name": "np1", "count": 2, "vmSize": "Standard_D2s_v5", "mode": "User"}),
    )
    .await;
}

/// Creates managed cluster `aks-1` with one agent pool, `pool`, through the ARM API.
async fn seed_cluster_with(emu: &EmulatorHandle, pool: serde_json::Value) {
    let token = emu.state().issue_token("seeder");
    let url = format!(
        "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/aks-1?api-version=2024-09-01",
        emu.base_url()
    );
    let body = serde_json::json!({"location": "westeurope",
        "properties": {"dnsPrefix": "aks-1", "agentPoolProfiles": [pool]}});
    let rsp = reqwest::Client::new()
        .put(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(rsp.status().is_success(), "cluster created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_scale_address_an_agent_pool_by_cluster_and_pool_and_a_stale_if_match_exits_3() {
    let emu = emulator().await;
    seed_cluster(&emu).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true)
        .display()
        .to_string();
    let pool = |cmd: &str| {
        vec![
            cmd.to_string(),
            "--config".into(),
            config.clone(),
            "--cluster".into(),
            "aks-1".into(),
            "--pool".into(),
            "np1".into(),
        ]
    };
    let got = run_async(pool("get")).await;
    let text = String::from_utf8_lossy(&got.stdout).to_string();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(text.contains("kind:               aksAgentPool"), "{text}");
    assert!(text.contains("capacity:           2"), "{text}");
    let etag = text
        .lines()
        .find_map(|l| l.strip_prefix("etag:"))
        .unwrap()
        .trim()
        .to_string();
    let mut ok = pool("scale");
    ok.extend(["--to".into(), "4".into(), "--if-match".into(), etag.clone()]);
    let ok = run_async(ok).await;
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let after = run_async(pool("get")).await;
    assert!(String::from_utf8_lossy(&after.stdout).contains("capacity:           4"));
    let mut stale = pool("scale");
    stale.extend(["--to".into(), "9".into(), "--if-match".into(), etag]);
    let stale = run_async(stale).await;
    assert_eq!(
        stale.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&stale.stderr)
    );
    assert!(String::from_utf8_lossy(&stale.stderr).contains("412"));
    let last = run_async(pool("get")).await;
    assert!(
        String::from_utf8_lossy(&last.stdout).contains("capacity:           4"),
        "the stale write changed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_refuses_a_pool_under_aks_autoscaling_in_one_line_with_the_az_command_that_frees_it()
{
    let emu = emulator().await;
    seed_cluster_with(
        &emu,
        serde_json::json!({"name": "auto", "count": 2, "vmSize": "Standard_D2s_v5", "mode": "User",
            "enableAutoScaling": true, "minCount": 1, "maxCount": 5}),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true)
        .display()
        .to_string();
    let out = run_async(
        [
            "scale",
            "--config",
            &config,
            "--cluster",
            "aks-1",
            "--pool",
            "auto",
            "--to",
            "3",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!("error: agent pool auto of managed cluster aks-1: AKS's own cluster autoscaler scales it (enableAutoScaling: true), so this controller does not write it; fix: `az aks nodepool update -g {RG} --cluster-name aks-1 -n auto --disable-cluster-autoscaler`, or remove it from nodeGroups")
    );
    assert_eq!(
        emu.state().agent_pool_count(SUB, RG, "aks-1", "auto"),
        Some(2),
        "not written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_group_azure_does_not_have_is_named_with_its_resource_group_and_the_az_command() {
    let emu = EmulatorBuilder::new().start().await.unwrap();
    emu.state().register_client("cli-controller", SECRET);
    // pool-a exists, pool-b (a typo, say) does not.
    emu.state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "pool-a", 2));
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true);
    let out = run_once(&config, &[]).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("node group pool-b:"))
        .unwrap_or_else(|| panic!("no line names pool-b:\n{text}"));
    assert!(
        line.contains(&format!(
            "node group pool-b: no scale set named pool-b in resource group {RG} (subscription {SUB}), so nothing is written for it; fix: check the name with `az vmss list -g {RG} --subscription {SUB} -o table`"
        )),
        "{line}"
    );
    assert!(
        !text.lines().any(|l| l.contains("node group pool-a:")),
        "the group that exists is not reported:\n{text}"
    );
}

#[test]
fn help_and_the_crate_description_say_it_is_a_cluster_autoscaler_not_a_plan_keeper() {
    let out = run(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("A cluster autoscaler for Azure VM Scale Sets and AKS agent pools"),
        "--help's first line: {first:?}"
    );
    let short = run(&["-h"]);
    let first_short = String::from_utf8_lossy(&short.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(first_short, first, "-h and --help open alike");
    for said in [text.as_ref(), env!("CARGO_PKG_DESCRIPTION")] {
        assert!(!said.contains("where a plan says"), "{said}");
        assert!(said.contains("cluster autoscaler"), "{said}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_into_a_pipe_carry_no_colour_codes() {
    let emu = emulator().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &emu.base_url(), true);
    let out = run_once(&config, &["--log-format", "text"]).await;
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("INFO"), "some text log lines: {err}");
    assert!(
        !err.contains('\u{1b}'),
        "an escape code in logs written to a pipe: {err:?}"
    );
}

#[test]
fn log_colour_needs_a_terminal_and_no_non_empty_no_color() {
    use std::ffi::OsStr;
    use vmss_capacity_controller::cli::log_colour;
    assert!(log_colour(true, None));
    assert!(log_colour(true, Some(OsStr::new(""))), "empty: as if unset");
    assert!(!log_colour(true, Some(OsStr::new("1"))));
    assert!(!log_colour(true, Some(OsStr::new("false"))), "any value");
    assert!(!log_colour(false, None), "a pipe or a file");
}

#[test]
fn check_config_names_the_file_and_the_line_and_column_of_each_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "azure:\n  tenantId: t\n  subscriptionId: s\n  resourceGroup: r\n  auth: {method: clientSecret, clientId: c}\nscanInterval: soon\nnodeGroups:\n  - {name: b, minSize: 0, maxSize: 3, bogus: 1}\n",
    )
    .unwrap();
    let out = run(&["check-config", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let file = path.display();
    for line in [
        format!("{file}:6:1: scanInterval: "),
        format!("{file}:8:39: nodeGroups[0].bogus: unknown key"),
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(&line)),
            "no line starting {line:?} in:\n{err}"
        );
    }
}
