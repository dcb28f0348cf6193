//! The README's try-out, from outside the process: the `emulator` binary with
//! `--simulate-cluster` and seeded zonal scale sets, the controller binary `run` against it, and
//! a Deployment created through the Kubernetes API as `kubectl apply` creates it. Nothing is
//! shared in memory: two processes, HTTP between them.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_vmss-capacity-controller");

/// Kills the process when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `emulator` with `args`; its address, from the line it announces.
fn emulator(args: &[&str]) -> (Running, String) {
    let mut child = Command::new(BIN)
        .arg("emulator")
        .args(["--listen", "127.0.0.1:0", "--lro-delay", "200ms"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("emulator starts");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("an announcement");
    let url = line
        .trim()
        .strip_prefix("emulator listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (Running(child), url)
}

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("client config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_try_out_grows_the_three_zones_for_a_zone_spread_deployment_applied_from_outside() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let ca = dir.path().join("ca.pem");
    let (_emulator, url) = emulator(&[
        "--simulate-cluster",
        "--tls",
        "--cert-out",
        ca.to_str().unwrap(),
        "--boot-delay",
        "300ms",
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--scale-set",
        "zone1:Standard_D4s_v5:0:1",
        "--scale-set",
        "zone2:Standard_D4s_v5:0:2",
        "--scale-set",
        "zone3:Standard_D4s_v5:0:3",
        "--scale-set",
        "general:Standard_D4s_v5:1",
    ]);
    // The shipped try-out configuration, pointed at this emulator and made quick.
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/emulator-pods.yaml"
    ))
    .unwrap();
    let config = shipped
        .replace("https://127.0.0.1:8443", &url)
        .replace("./kubeconfig", kubeconfig.to_str().unwrap())
        .replace("./ca.pem", ca.to_str().unwrap())
        .replace("scanInterval: 2s", "scanInterval: 1s")
        .replace("podBatchIdle: 1s", "podBatchIdle: 300ms")
        .replace(
            "metricsListen: 127.0.0.1:8085",
            "metricsListen: 127.0.0.1:0",
        );
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config).unwrap();
    let controller = Command::new(BIN)
        .args(["run", "-c", config_path.to_str().unwrap()])
        .env("ARM_CLIENT_SECRET", "anything")
        .env_remove("VMSS_CONTROLLER_CONFIG")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("controller starts");
    let _controller = Running(controller);

    // `kubectl apply -f examples/try-out/web.yaml`, as the API sees it.
    let client = client(&kubeconfig).await;
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/try-out/web.yaml"
    ))
    .unwrap();
    let web: Deployment = serde_yaml::from_str(&manifest).expect("the example parses");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &web)
        .await
        .expect("created");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let per_zone = || async {
        let zone_of: BTreeMap<String, String> = nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                let zone = n
                    .metadata
                    .labels
                    .as_ref()?
                    .get("topology.kubernetes.io/zone")?
                    .clone();
                Some((n.metadata.name?, zone))
            })
            .collect();
        let mut out: BTreeMap<String, usize> = BTreeMap::new();
        for p in pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            if let (true, Some(zone)) = (running, node.and_then(|n| zone_of.get(&n).cloned())) {
                *out.entry(zone).or_default() += 1;
            }
        }
        out
    };
    let want = BTreeMap::from([
        ("westeurope-1".to_string(), 2),
        ("westeurope-2".to_string(), 2),
        ("westeurope-3".to_string(), 2),
    ]);
    let mut seen = BTreeMap::new();
    for _ in 0..300 {
        seen = per_zone().await;
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, want, "six web pods running, two per zone");

    // `kubectl scale deployment web --replicas 3`: the Deployment's ReplicaSet follows.
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scaled");
    let mut total = 0;
    for _ in 0..100 {
        total = per_zone().await.values().sum::<usize>();
        if total == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(total, 3);
    // Its status catches up, as `kubectl rollout status` reads it.
    let mut status = None;
    for _ in 0..100 {
        status = deployments.get("web").await.ok().and_then(|d| d.status);
        if status
            .as_ref()
            .is_some_and(|s| s.replicas == Some(3) && s.ready_replicas == Some(3))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = status.expect("status written");
    assert_eq!((status.replicas, status.ready_replicas), (Some(3), Some(3)));
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True"),
        "available"
    );

    // Deleting it takes its ReplicaSet and pods.
    deployments
        .delete("web", &Default::default())
        .await
        .expect("deleted");
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "the garbage is collected");
}

#[test]
fn the_simulation_flags_are_checked_and_a_bad_scale_set_is_named() {
    let out = Command::new(BIN)
        .args(["emulator", "--boot-delay", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--simulate-cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["emulator", "--scale-set", "zone1:Standard_D4s_v5:many"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("zone1:Standard_D4s_v5:many") && err.contains("capacity \"many\""),
        "{err}"
    );
    let out = Command::new(BIN)
        .args([
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--scale-set",
            "zone1:Standard_D4s_v5:0:1",
            "--scale-set",
            "ZONE1:Standard_D4s_v5:2:2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--scale-set ZONE1 is given twice"), "{err}");
}

/// The README's try-out block: one command per entry, continuation lines joined and comments
/// dropped, words split as a shell splits them (a backslash keeps the next character, single
/// quotes keep everything up to the next one).
fn readme_try_out() -> Vec<(Vec<String>, bool)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("## Try it from outside, with kubectl")
        .nth(1)
        .expect("the try-out section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its sh block");
    let joined = block.replace("\\\n", " ");
    let mut commands = Vec::new();
    for line in joined.lines() {
        let line = match line.find(" #") {
            Some(i) => &line[..i],
            None => line,
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        let (line, background) = match line.strip_suffix('&') {
            Some(l) => (l.trim_end(), true),
            None => (line, false),
        };
        let mut words = Vec::new();
        let mut word = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                '\'' => {
                    let quoted: String = chars.by_ref().take_while(|&c| c != '\'').collect();
                    word.push_str(&quoted);
                }
                '"' | '$' | '|' | ';' | '<' | '>' | '`' => {
                    panic!("the try-out uses shell syntax this test does not run: {line}")
                }
                c if c.is_whitespace() => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        commands.push((words, background));
    }
    commands
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_try_out_works_as_written_every_command_from_a_copy_of_the_repository() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["config/emulator-pods.yaml", "examples/try-out/web.yaml"] {
        std::fs::create_dir_all(root.join(file).parent().unwrap()).unwrap();
        std::fs::copy(src.join(file), root.join(file)).unwrap();
    }
    let kubectl_here = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    let commands = readme_try_out();
    assert!(
        commands
            .last()
            .is_some_and(|(w, _)| w.contains(&"get".to_string())),
        "the try-out ends with `get`: {commands:?}"
    );
    let mut env: Vec<(String, String)> = Vec::new();
    let mut running = Vec::new();
    let mut nodes_seen = String::new();
    let mut last = None;
    for (mut words, background) in commands {
        let shown = words.join(" ");
        if words[0] == "export" {
            let (k, v) = words[1].split_once('=').expect("export K=V");
            env.push((k.into(), v.into()));
            continue;
        }
        // `K=V command ...`: for this command only.
        let mut only_here: Vec<(String, String)> = Vec::new();
        while let Some((k, v)) = words[0].split_once('=') {
            only_here.push((k.into(), v.into()));
            words.remove(0);
        }
        let program = match words[0].as_str() {
            "vmss-capacity-controller" => BIN,
            "kubectl" => "kubectl",
            other => panic!("the try-out runs {other}: {shown}"),
        };
        let mut args: Vec<String> = words[1..].to_vec();
        let mut cmd = Command::new(program);
        cmd.current_dir(root)
            .env_remove("ARM_CLIENT_SECRET")
            .env_remove("VMSS_CONTROLLER_CONFIG")
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .envs(env.iter().cloned())
            .envs(only_here);
        if args.first().map(String::as_str) == Some("emulator") {
            // The one change: a free port instead of 8443, written into the copied config.
            assert!(background, "{shown}");
            args.splice(1..1, ["--listen".to_string(), "127.0.0.1:0".to_string()]);
            let mut child = cmd
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("emulator starts");
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            running.push(Running(child));
            let url = line
                .trim()
                .strip_prefix("emulator listening on ")
                .unwrap_or_else(|| panic!("{line:?}"))
                .to_string();
            let config = root.join("config/emulator-pods.yaml");
            let text = std::fs::read_to_string(&config)
                .unwrap()
                .replace("https://127.0.0.1:8443", &url)
                .replace("127.0.0.1:8085", "127.0.0.1:0");
            std::fs::write(&config, text).unwrap();
            continue;
        }
        if program == "kubectl" && !kubectl_here {
            eprintln!("kubectl is not installed: `{shown}` is not run");
            continue;
        }
        if background {
            let child = cmd
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starts");
            running.push(Running(child));
        } else if args.contains(&"-w".to_string()) {
            // The watch runs until stopped: read it until the six zonal nodes are there.
            let mut child = cmd
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("kubectl starts");
            let out = BufReader::new(child.stdout.take().unwrap());
            let watch = Running(child);
            let lines = tokio::task::spawn_blocking(move || {
                let mut seen = Vec::new();
                for line in out.lines().map_while(Result::ok) {
                    seen.push(line);
                    let zonal = seen
                        .iter()
                        .filter(|l| l.contains("westeurope-"))
                        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
                        .collect::<std::collections::BTreeSet<_>>();
                    if zonal.len() >= 6 {
                        break;
                    }
                }
                seen
            });
            let lines = tokio::time::timeout(Duration::from_secs(30), lines)
                .await
                .unwrap_or_else(|_| panic!("`{shown}` did not show six zonal nodes in 30 s"))
                .unwrap();
            drop(watch);
            nodes_seen = lines.join("\n");
        } else {
            let out = tokio::task::spawn_blocking(move || cmd.args(&args).output())
                .await
                .unwrap()
                .expect("runs");
            assert!(
                out.status.success(),
                "`{shown}` failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            last = Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    if kubectl_here {
        assert!(nodes_seen.starts_with("NAME"), "{nodes_seen}");
        assert!(
            last.as_deref()
                .is_some_and(|l| l.contains("capacity:           2")),
            "zone1 grown to two nodes: {last:?}"
        );
    }
    let last = last.expect("the last command ran");
    assert!(
        last.contains("name:               zone1"),
        "`get zone1` prints the scale set: {last}"
    );
    // Written where the README says, beside the configuration.
    assert!(root.join("config/ca.pem").is_file() && root.join("config/kubeconfig").is_file());
    drop(running);
}

/// Issue 42 item 1: the quota, set from outside through `POST /_emulator/quota/...`, caps what
/// the controller (its own process) asks of one family, and the pods left over go to the next
/// family in the same decision: a partial scale-up with no write refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_capped_through_the_route_gives_the_controller_a_partial_scale_up_and_the_rest_goes_elsewhere(
) {
    const SUB: &str = "00000000-0000-0000-0000-000000000000";
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let ca = dir.path().join("ca.pem");
    let (_emulator, url) = emulator(&[
        "--simulate-cluster",
        "--tls",
        "--cert-out",
        ca.to_str().unwrap(),
        "--boot-delay",
        "300ms",
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--scale-set",
        "dsv5:Standard_D4s_v5:0",
        "--scale-set",
        "esv5:Standard_E4s_v5:0",
    ]);
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).expect("the CA"),
        )
        .build()
        .unwrap();
    // Two D4s_v5 nodes' worth of DSv5 vCPUs.
    let set = http
        .post(format!("{url}/_emulator/quota/{SUB}/westeurope"))
        .json(&serde_json::json!({"limits": {"standardDSv5Family": 8}}))
        .send()
        .await
        .expect("answered");
    assert_eq!(set.status().as_u16(), 200);

    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/emulator-pods.yaml"
    ))
    .unwrap();
    let (head, _) = shipped
        .split_once("nodeGroups:")
        .expect("a nodeGroups list");
    let config = format!(
        "{head}nodeGroups:\n  - {{name: dsv5, minSize: 0, maxSize: 10}}\n  - {{name: esv5, minSize: 0, maxSize: 10}}\n"
    )
    .replace("https://127.0.0.1:8443", &url)
    .replace("./kubeconfig", kubeconfig.to_str().unwrap())
    .replace("./ca.pem", ca.to_str().unwrap())
    .replace("scanInterval: 2s", "scanInterval: 1s")
    .replace("podBatchIdle: 1s", "podBatchIdle: 300ms")
    .replace("balanceSimilarNodeGroups: true", "balanceSimilarNodeGroups: false")
    // No metrics listener: the default (0.0.0.0:8085) is the other try-out controllers'.
    .replace("metricsListen: 127.0.0.1:8085", "metricsListen: null");
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config).unwrap();
    let controller = Command::new(BIN)
        .args(["run", "-c", config_path.to_str().unwrap()])
        .env("ARM_CLIENT_SECRET", "anything")
        .env_remove("VMSS_CONTROLLER_CONFIG")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("controller starts");
    let _controller = Running(controller);

    // Twelve pods of 1 cpu: four nodes of 3 allocatable cpus. Least waste prefers DSv5; the
    // quota leaves it two.
    let client = client(&kubeconfig).await;
    let web: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 12, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &web)
        .await
        .expect("created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let capacity = |name: &'static str| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let v: serde_json::Value = http
                .get(format!("{url}/_emulator/scale-sets/{SUB}/rg-demo/{name}"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["capacity"].as_i64()
        }
    };
    let mut seen = (None, None, 0);
    for _ in 0..300 {
        let running = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        seen = (capacity("dsv5").await, capacity("esv5").await, running);
        if seen == (Some(2), Some(2), 12) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        (Some(2), Some(2), 12),
        "(dsv5, esv5, web pods running)"
    );
    let log: Vec<serde_json::Value> = http
        .get(format!("{url}/_emulator/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let refused: Vec<&serde_json::Value> = log.iter().filter(|r| r["status"] == 409).collect();
    assert!(refused.is_empty(), "no write was refused: {refused:?}");
    assert!(
        log.iter().any(|r| r["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/locations/westeurope/usages"))),
        "the controller read the usages"
    );
}

/// Issue 42 item 1's node labels that differ from the tags, played from outside: the scale
/// set's tags say its nodes carry `tier=gold`, `POST .../node-registration` makes them register
/// with `tier=silver` (as a kubelet started with `--node-labels` would). The controller (its
/// own process) grows the group once for a `tier=gold` pod, sees the node register otherwise
/// (`template_mismatches_total{key="tier"}`, a `TemplateMismatch` Warning), does not grow it
/// again for that pod, and from then on plans with the real node: emptied by a rival, the group
/// is grown from zero for a `tier=silver` pod, which the tags alone would never fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_registering_with_other_labels_than_the_tags_are_noticed_and_learned_as_the_template()
{
    const SUB: &str = "00000000-0000-0000-0000-000000000000";
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let ca = dir.path().join("ca.pem");
    let (_emulator, url) = emulator(&[
        "--simulate-cluster",
        "--tls",
        "--cert-out",
        ca.to_str().unwrap(),
        "--boot-delay",
        "300ms",
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--scale-set",
        "pool:Standard_D4s_v5:0",
    ]);
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).expect("the CA"),
        )
        .build()
        .unwrap();
    let control = format!("{url}/_emulator/scale-sets/{SUB}/rg-demo/pool");
    let post = |path: String, body: serde_json::Value| {
        let http = http.clone();
        async move {
            let r = http.post(path).json(&body).send().await.expect("answered");
            let status = r.status().as_u16();
            (
                status,
                r.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    let (status, _) = post(
        format!("{control}/tags"),
        serde_json::json!({"tags": {"k8s.io_cluster-autoscaler_node-template_label_tier": "gold"}}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, answer) = post(
        format!("{control}/node-registration"),
        serde_json::json!({"labels": {"tier": "silver"}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"labels": {"tier": "silver"}, "taints": []})
    );

    // A free port for the controller's metrics.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/emulator-pods.yaml"
    ))
    .unwrap();
    let (head, _) = shipped
        .split_once("nodeGroups:")
        .expect("a nodeGroups list");
    let config = format!("{head}nodeGroups:\n  - {{name: pool, minSize: 0, maxSize: 5}}\n")
        .replace("https://127.0.0.1:8443", &url)
        .replace("./kubeconfig", kubeconfig.to_str().unwrap())
        .replace("./ca.pem", ca.to_str().unwrap())
        .replace("scanInterval: 2s", "scanInterval: 1s")
        .replace("podBatchIdle: 1s", "podBatchIdle: 300ms")
        .replace(
            "balanceSimilarNodeGroups: true",
            "balanceSimilarNodeGroups: false",
        )
        .replace(
            "metricsListen: 127.0.0.1:8085",
            &format!("metricsListen: 127.0.0.1:{metrics_port}"),
        );
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config).unwrap();
    let controller = Command::new(BIN)
        .args(["run", "-c", config_path.to_str().unwrap()])
        .env("ARM_CLIENT_SECRET", "anything")
        .env_remove("VMSS_CONTROLLER_CONFIG")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("controller starts");
    let _controller = Running(controller);

    let client = client(&kubeconfig).await;
    let deployment = |name: &str| -> Deployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": {"tier": name},
                        "containers": [{"name": "main", "image": "nginx",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}
        }))
        .unwrap()
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment("gold"))
        .await
        .expect("created");
    let capacity = || {
        let http = http.clone();
        let control = control.clone();
        async move {
            let v: serde_json::Value = http.get(&control).send().await.ok()?.json().await.ok()?;
            v["capacity"].as_i64()
        }
    };
    let mismatches = || {
        let http = http.clone();
        async move {
            let text = http
                .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.lines()
                .find(|l| {
                    l.contains("template_mismatches_total{")
                        && l.contains("scale_set=\"pool\"")
                        && l.contains("key=\"tier\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        }
    };
    let mut counted = None;
    for _ in 0..300 {
        counted = mismatches().await;
        if counted.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        counted,
        Some(1.0),
        "template_mismatches_total{{scale_set=\"pool\",key=\"tier\"}}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let registered = nodes.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(registered.len(), 1, "one node for the gold pod");
    let labels = registered[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("tier").map(String::as_str), Some("silver"));
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let warning = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("TemplateMismatch"))
        .expect("a TemplateMismatch Event");
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let message = warning.message.unwrap_or_default();
    assert!(
        message.contains("tier: predicted gold, registered silver"),
        "{message}"
    );
    // No second node for the gold pod: it stays pending, the group stays at one.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(capacity().await, Some(1), "no runaway for the gold pod");

    // A rival empties the group; the gold pod alone does not grow it back (the real node, the
    // template now, has no tier=gold) ...
    let (status, _) = post(
        format!("{control}/capacity"),
        serde_json::json!({"capacity": 0}),
    )
    .await;
    assert_eq!(status, 200);
    for _ in 0..100 {
        if nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        capacity().await,
        Some(0),
        "not grown again for the gold pod"
    );
    // ... and a silver pod, which the tags alone would never fit, grows it from zero.
    deployments
        .create(&PostParams::default(), &deployment("silver"))
        .await
        .expect("created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut running = false;
    for _ in 0..300 {
        running = pods
            .list(&ListParams::default().labels("app=silver"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        if running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(running, "the silver pod runs on a node grown from zero");
    assert_eq!(capacity().await, Some(1));
}
