//! `explain` on a simulated cluster, from files: the emulator's Kubernetes API and ARM are
//! dumped as `kubectl get ... -o json` and `az rest` would save them, and the release binary is
//! asked about pods, nodes and groups with `--snapshot` (no credentials, no network).

use crate::support;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::{RG, SUB};
use vmss_capacity_controller::emulator::sim::SimSettings;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle, ScaleSetSeed};

const BIN: &str = env!("CARGO_BIN_EXE_vmss-capacity-controller");
const GPU_TAINT_TAG: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";

fn seed(name: &str, size: &str, capacity: i64, tags: &[(&str, &str)]) -> ScaleSetSeed {
    let mut s = ScaleSetSeed::new(SUB, RG, name, capacity);
    s.sku_name = size.into();
    s.tags = tags
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s
}

fn pod(name: &str, cpu: &str, node: Option<&str>, annotations: Value) -> Value {
    let status = match node {
        Some(_) => json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        None => json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": "0/4 nodes are available"}]}),
    };
    let mut spec = json!({"containers": [{"name": "app", "image": "app",
        "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    json!({
        "metadata": {"name": name, "namespace": "default", "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "web", "uid": "rs-uid", "controller": true}]},
        "spec": spec,
        "status": status,
    })
}

/// The cluster: pool-a (D4s_v5, 2 nodes, 1..5) with a small unevictable pod on one node and a
/// 3-cpu pod on the other; pool-full (D2s_v5, 2 empty nodes, 2..2); pool-gpu (NC6s_v3, 0
/// nodes, tainted); pending: `web` (3.5 cpu, fits a new D4s_v5 only) and `huge` (64 cpu).
async fn cluster() -> (EmulatorHandle, Vec<String>, Vec<String>) {
    let emulator = EmulatorBuilder::new()
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: Duration::from_millis(50),
            tick: Duration::from_millis(20),
        })
        .start()
        .await
        .expect("emulator starts");
    let state = emulator.state();
    let ca = |min: &'static str, max: &'static str| {
        [
            ("cluster-autoscaler-enabled", "true"),
            ("cluster-autoscaler-name", "aks"),
            ("min", min),
            ("max", max),
        ]
    };
    state.seed_scale_set(seed("pool-a", "Standard_D4s_v5", 2, &ca("1", "5")));
    state.seed_scale_set(seed("pool-full", "Standard_D2s_v5", 2, &ca("2", "2")));
    let mut gpu = ca("0", "3").to_vec();
    gpu.push((GPU_TAINT_TAG, "gpu:NoSchedule"));
    state.seed_scale_set(seed("pool-gpu", "Standard_NC6s_v3", 0, &gpu));
    let kube = emulator.kube().expect("kubernetes side");
    let ready =
        |ss: &str| -> Vec<String> { kube.nodes_by_scale_set().remove(ss).unwrap_or_default() };
    for _ in 0..500 {
        let all_ready = kube
            .list_all("v1", "nodes", None)
            .iter()
            .filter(|n| {
                n.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            })
            .count();
        if all_ready == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a, full) = (ready("pool-a"), ready("pool-full"));
    assert_eq!((a.len(), full.len()), (2, 2), "nodes registered");
    for p in [
        pod(
            "db-0",
            "500m",
            Some(&a[0]),
            json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
        ),
        pod("batch", "3", Some(&a[1]), json!({})),
        pod("web", "3500m", None, json!({})),
        pod("huge", "64", None, json!({})),
        pod(
            "trainer",
            "1",
            None,
            json!({"autoscaling.x-k8s.io/consume-provisioning-request": "train",
                "autoscaling.x-k8s.io/provisioning-class-name": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"}),
        ),
    ] {
        kube.create("v1", "pods", "default", p)
            .expect("pod created");
    }
    (emulator, a, full)
}

/// Saves the cluster and the scale sets as `kubectl get nodes,pods -A -o json` and `az rest`
/// (ARM's list) would.
async fn save(emulator: &EmulatorHandle, dir: &Path) {
    let kube = emulator.kube().expect("kubernetes side");
    let mut items = Vec::new();
    for (plural, kind) in [("nodes", "Node"), ("pods", "Pod")] {
        for mut item in kube.list_all("v1", plural, None) {
            item["kind"] = json!(kind);
            item["apiVersion"] = json!("v1");
            items.push(item);
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    std::fs::write(
        dir.join("cluster.json"),
        serde_json::to_vec_pretty(&list).unwrap(),
    )
    .unwrap();
    let token = emulator.state().issue_token("reader");
    let url = format!(
        "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets?api-version=2024-07-01",
        emulator.base_url()
    );
    let body = reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("list answered")
        .text()
        .await
        .unwrap();
    std::fs::write(dir.join("vmss.json"), body).unwrap();
}

fn explain(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("explain")
        .arg("--snapshot")
        .arg(dir)
        .args(args)
        .env_remove("VMSS_CONTROLLER_CONFIG")
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Group `group`'s verdict in a pod's explanation.
fn verdict(e: &Value, group: &str) -> Value {
    e["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["group"] == group)
        .cloned()
        .unwrap_or_else(|| panic!("no verdict for {group}: {e:#}"))
}

fn json_of(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend_from_slice(args);
    let (code, out, err) = explain(dir, &all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).expect("json output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_for_pods_nodes_and_groups_from_a_snapshot_of_the_cluster() {
    let (emulator, a, full) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    if std::env::var_os("EXPLAIN_SHOW").is_some() {
        for args in [
            vec!["pod", "default/web"],
            vec!["pod", "default/huge"],
            vec!["node", a[0].as_str()],
            vec!["node", a[1].as_str()],
            vec!["node", full[0].as_str()],
            vec!["group", "pool-a"],
        ] {
            let (_, out, err) = explain(dir.path(), &args);
            eprintln!("$ explain {}\n{err}{out}", args.join(" "));
        }
    }

    // A pending pod a new node of pool-a takes: the decision grows pool-a; each group's verdict
    // in kube-scheduler's words.
    let web = json_of(dir.path(), &["pod", "default/web"]);
    assert_eq!(web["outcome"], "scaleUp", "{web:#}");
    assert_eq!(web["scaleUp"]["group"], "pool-a");
    assert_eq!(web["scaleUp"]["from"], 2);
    assert_eq!(web["scaleUp"]["to"], 3);
    assert_eq!(verdict(&web, "pool-a")["fits"], true);
    let gpu = verdict(&web, "pool-gpu");
    assert_eq!(gpu["fits"], false);
    assert_eq!(gpu["reason"], "taint", "{gpu:#}");
    assert_eq!(
        gpu["message"], "node(s) had untolerated taint {sku: gpu}",
        "kube-scheduler's words: {gpu:#}"
    );
    assert_eq!(verdict(&web, "pool-full")["fits"], false);

    // A pod no group can take.
    let huge = json_of(dir.path(), &["pod", "default/huge"]);
    assert_eq!(huge["outcome"], "noGroupFits", "{huge:#}");
    assert!(
        huge["summary"]
            .as_str()
            .unwrap()
            .contains("Insufficient cpu"),
        "{huge:#}"
    );

    // A pod that consumes a ProvisioningRequest: its capacity is the request's.
    let trainer = json_of(dir.path(), &["pod", "default/trainer"]);
    assert_eq!(trainer["outcome"], "notPending", "{trainer:#}");
    assert!(
        trainer["summary"]
            .as_str()
            .unwrap()
            .contains("consumes ProvisioningRequest default/train"),
        "{trainer:#}"
    );

    // A bound pod needs nothing.
    let db = json_of(dir.path(), &["pod", "db-0"]);
    assert_eq!(db["outcome"], "scheduled");

    // Nodes, with cluster-autoscaler's unremovable reasons.
    let n = json_of(dir.path(), &["node", &a[0]]);
    assert_eq!(n["reason"], "BlockedByPod", "{n:#}");
    assert_eq!(n["blockingPod"]["pod"], "default/db-0");
    assert_eq!(n["blockingPod"]["reason"], "NotSafeToEvictAnnotation");
    let n = json_of(dir.path(), &["node", &a[1]]);
    assert_eq!(n["reason"], "NotUnderutilized", "{n:#}");
    let n = json_of(dir.path(), &["node", &full[0]]);
    assert_eq!(n["unneeded"], true, "{n:#}");
    assert_eq!(n["reason"], "NodeGroupMinSizeReached", "{n:#}");

    // A group.
    let g = json_of(dir.path(), &["group", "pool-a"]);
    assert_eq!(g["size"], 2);
    assert_eq!(
        (g["min"].as_u64(), g["max"].as_u64()),
        (Some(1), Some(5)),
        "bounds from the tags"
    );
    assert_eq!(g["vmSize"], "Standard_D4s_v5");
    assert_eq!(g["nodesReady"], 2);
    assert_eq!(g["scaleUpTo"], 3);
    assert_eq!(g["podsForIt"], json!(["default/web"]));
    assert!(g["etag"].as_str().is_some_and(|e| !e.is_empty()));

    // Text for a person.
    let (code, out, _) = explain(dir.path(), &["pod", "default/web"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("a scale-up of pool-a from 2 to 3 gives it a node"),
        "{out}"
    );
    assert!(out.contains("pool-gpu"), "{out}");

    // What is not there, and bad input.
    let (code, _, err) = explain(dir.path(), &["pod", "default/nobody"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("pod default/nobody is not in the cluster"),
        "{err}"
    );
    let (code, _, err) = explain(dir.path(), &["group", "pool-z"]);
    assert_eq!(code, 1);
    assert!(err.contains("pool-a"), "names the groups there are: {err}");

    // The same answers read from the APIs, as `run` reads them, with GETs only.
    let live = tempfile::tempdir().unwrap();
    let kubeconfig = live.path().join("kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().expect("kubeconfig")).unwrap();
    let config = live.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "azure:\n  resourceManagerEndpoint: {url}\n  authorityHost: {url}\n  tenantId: tenant\n  subscriptionId: {SUB}\n  resourceGroup: {RG}\n  auth: {{method: clientSecret, clientId: explainer}}\nautoDiscovery: {{clusterName: aks}}\nkubernetes: {{kubeconfig: {kc}}}\n",
            url = emulator.base_url(),
            kc = kubeconfig.display()
        ),
    )
    .unwrap();
    emulator
        .state()
        .register_client("explainer", "explainer-secret");
    let before = emulator.state().request_log().len();
    let cfg = config.display().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "explain",
                "--config",
                &cfg,
                "--output",
                "json",
                "pod",
                "default/web",
            ])
            .env("ARM_CLIENT_SECRET", "explainer-secret")
            .env_remove("VMSS_CONTROLLER_CONFIG")
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let live_web: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        live_web, web,
        "the APIs and the snapshot give the same answer"
    );
    let log = emulator.state().request_log();
    let sent: Vec<_> = log[before..]
        .iter()
        .filter(|r| r.path.starts_with("/subscriptions"))
        .collect();
    assert!(!sent.is_empty(), "Azure was read");
    assert!(
        sent.iter().all(|r| r.method == "GET"),
        "read-only: {:?}",
        sent.iter()
            .map(|r| (&r.method, &r.path))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        emulator
            .state()
            .scale_set(SUB, RG, "pool-a")
            .unwrap()
            .capacity,
        2
    );

    std::fs::write(dir.path().join("broken.json"), "{ not json").unwrap();
    let (code, _, err) = explain(dir.path(), &["group", "pool-a"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("broken.json") && err.contains("not JSON"),
        "{err}"
    );
    drop(emulator);
}

#[test]
fn explain_without_a_snapshot_or_with_an_empty_one_says_what_to_save() {
    let (code, _, err) = {
        let out = Command::new(BIN)
            .args(["explain", "pod", "default/web"])
            .env_remove("VMSS_CONTROLLER_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::new(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, 2);
    assert!(
        err.contains("give --config")
            && err.contains(
                "kubectl get nodes,pods,pdb,daemonsets,pvc,pv,storageclasses,csinodes,namespaces -A -o json"
            ),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = explain(dir.path(), &["pod", "default/web"]);
    assert_eq!(code, 2);
    assert!(err.contains("no *.json file"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_applies_the_regions_vcpu_quota_from_a_saved_usage_list() {
    let (emulator, _, _) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    let web = json_of(dir.path(), &["pod", "default/web"]);
    assert_eq!(verdict(&web, "pool-a")["fits"], true, "{web:#}");

    // `az vm list-usage -l westeurope -o json` (numbers as strings): the D-series v5 family is
    // used up; the region has room.
    std::fs::write(
        dir.path().join("usages-westeurope.json"),
        json!([
            {"currentValue": "20", "limit": "20", "localName": "Standard DSv5 Family vCPUs",
             "name": {"localizedValue": "Standard DSv5 Family vCPUs", "value": "standardDSv5Family"}},
            {"currentValue": "20", "limit": "100", "localName": "Total Regional vCPUs",
             "name": {"localizedValue": "Total Regional vCPUs", "value": "cores"}}
        ])
        .to_string(),
    )
    .unwrap();
    let group = json_of(dir.path(), &["group", "pool-a"]);
    assert_eq!(
        group["quota"],
        json!([
            "cores in westeurope: 80 vCPUs left",
            "standardDSv5Family in westeurope: 0 vCPUs left"
        ]),
        "{group:#}"
    );
    let web = json_of(dir.path(), &["pod", "default/web"]);
    let a = verdict(&web, "pool-a");
    assert_eq!(a["fits"], false, "no vCPU left for a D4s_v5: {web:#}");
    assert_eq!(a["reason"], "quota", "{a}");
    assert_eq!(
        a["message"],
        "no vCPU quota left: standardDSv5Family in westeurope has 0 vCPUs, a node needs 4"
    );
    let (_, text, _) = explain(dir.path(), &["group", "pool-a"]);
    assert!(
        text.contains("  quota: cores in westeurope: 80 vCPUs left, standardDSv5Family in westeurope: 0 vCPUs left"),
        "{text}"
    );

    // A usage list whose file does not say its region is an error that says how to name it.
    std::fs::rename(
        dir.path().join("usages-westeurope.json"),
        dir.path().join("usages.json"),
    )
    .unwrap();
    let (code, _, err) = explain(dir.path(), &["group", "pool-a"]);
    assert_ne!(code, 0);
    assert!(err.contains("usages.json[0]"), "{err}");
    assert!(err.contains("usages-westeurope.json"), "{err}");
}

/// The running controller, wired as `run` wires it, for the groups of [`cluster`]: pods drive
/// scale-up, scale-down is on with a long `unneededTime` (nothing is removed while the test
/// looks), one scan a second.
async fn running_controller(
    emulator: &EmulatorHandle,
    dir: &Path,
) -> (
    tokio::task::JoinHandle<anyhow::Result<()>>,
    tokio_util::sync::CancellationToken,
) {
    use vmss_capacity_controller::config::{
        AuthSettings, DemandKind, KubernetesSettings, LeaderElectionSettings, SecretSource,
    };
    let kubeconfig = dir.join("controller-kubeconfig");
    std::fs::write(&kubeconfig, emulator.kubeconfig().expect("kubeconfig")).unwrap();
    let secret = dir.join("controller-secret");
    std::fs::write(&secret, "controller-secret").unwrap();
    emulator
        .state()
        .register_client("controller", "controller-secret");
    let mut s = support::settings(
        &emulator.base_url(),
        vec![
            support::group("pool-a", 1, 5, None),
            support::group("pool-full", 2, 2, None),
            support::group("pool-gpu", 0, 3, None),
        ],
    );
    s.azure.auth = AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::File(secret),
    };
    s.kubernetes = KubernetesSettings {
        enabled: true,
        kubeconfig: Some(kubeconfig),
        leader_election: LeaderElectionSettings {
            enabled: false,
            ..Default::default()
        },
        ..KubernetesSettings::default()
    };
    s.scan_interval = Duration::from_secs(1);
    s.pod_demand.kind = DemandKind::Pods;
    s.pod_demand.batch_idle = Duration::from_millis(300);
    s.pod_demand.batch_max = Duration::from_secs(2);
    s.scale_down.enabled = true;
    s.scale_down.unneeded_time = Duration::from_secs(3600);
    let metrics = std::sync::Arc::new(vmss_capacity_controller::metrics::Metrics::new());
    let (stop, task) = crate::support::serve_replica(s, metrics, false, "controller-0").await;
    (task, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_applies_what_only_the_running_controller_knows_from_its_status_config_map() {
    use vmss_capacity_controller::emulator::FaultSpec;
    let (emulator, _a, full) = cluster().await;
    // Azure has no capacity for pool-a's size: every scale-up of it is refused.
    emulator.state().inject_fault(FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some("virtualMachineScaleSets/pool-a".into()),
        kind: support::status_kind(409, "AllocationFailed", None),
        count: None,
        probability: None,
        seed: None,
    });
    let dir = tempfile::tempdir().unwrap();
    let (task, stop) = running_controller(&emulator, dir.path()).await;
    let kube = emulator.kube().expect("kubernetes side");
    let status = || -> Value {
        kube.get(
            "v1",
            "configmaps",
            "kube-system",
            "vmss-capacity-controller-status",
        )
        .ok()
        .and_then(|cm| serde_yaml::from_str(cm["data"]["status"].as_str()?).ok())
        .unwrap_or(Value::Null)
    };
    let group_status = |doc: &Value, name: &str| -> Value {
        doc["nodeGroups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["name"] == name).cloned())
            .unwrap_or(Value::Null)
    };
    // The controller tries pool-a for `web`, Azure refuses, the offering is marked; the two
    // empty nodes of pool-full are unneeded (and at the group's floor).
    let mut doc = Value::Null;
    for _ in 0..300 {
        doc = status();
        if group_status(&doc, "pool-a")["unavailable"].is_object()
            && group_status(&doc, "pool-full")["unneeded"]
                .as_array()
                .is_some_and(|u| u.len() == 2)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let a = group_status(&doc, "pool-a");
    assert_eq!(a["unavailable"]["reason"], "allocation_failed", "{doc:#}");
    assert_eq!(a["lastWrite"]["to"], 3, "{doc:#}");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Asked live, with GETs only, the same settings `run` has.
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "azure:\n  resourceManagerEndpoint: {url}\n  authorityHost: {url}\n  tenantId: tenant\n  subscriptionId: {SUB}\n  resourceGroup: {RG}\n  auth: {{method: clientSecret, clientId: explainer}}\nnodeGroups:\n  - {{name: pool-a, minSize: 1, maxSize: 5}}\n  - {{name: pool-full, minSize: 2, maxSize: 2}}\n  - {{name: pool-gpu, minSize: 0, maxSize: 3}}\nkubernetes: {{enabled: true, kubeconfig: {kc}}}\ndemand: pods\nscaleDown: {{enabled: true, unneededTime: 1h}}\n",
            url = emulator.base_url(),
            kc = dir.path().join("controller-kubeconfig").display()
        ),
    )
    .unwrap();
    emulator
        .state()
        .register_client("explainer", "explainer-secret");
    let ask = |args: &[&str]| {
        let cfg = config.display().to_string();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            let shown = args.join(" ");
            let out = tokio::task::spawn_blocking(move || {
                Command::new(BIN)
                    .args(["explain", "--config", &cfg])
                    .args(&args)
                    .env("ARM_CLIENT_SECRET", "explainer-secret")
                    .env_remove("VMSS_CONTROLLER_CONFIG")
                    .env_remove("KUBECONFIG")
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(out.status.code(), Some(0), "{shown}: {err}");
            (String::from_utf8_lossy(&out.stdout).into_owned(), err)
        }
    };

    if std::env::var_os("EXPLAIN_SHOW").is_some() {
        for args in [
            vec!["pod", "default/web"],
            vec!["group", "pool-a"],
            vec!["node", full[0].as_str()],
        ] {
            let (out, err) = ask(&args).await;
            eprintln!("$ explain {}\n{err}{out}", args.join(" "));
        }
    }

    // The pod: pool-a would fit it, but the running controller passes it over.
    let (out, err) = ask(&["--output", "json", "pod", "default/web"]).await;
    assert!(
        err.contains("the running controller's status (kube-system/vmss-capacity-controller-status, leader controller-0) was written"),
        "{err}"
    );
    let web: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(web["outcome"], "noGroupFits", "{web:#}");
    let pool_a = web["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "pool-a")
        .cloned()
        .unwrap();
    assert_eq!(pool_a["fits"], false, "{web:#}");
    assert_eq!(pool_a["reason"], "allocation_failed", "{web:#}");
    assert!(
        pool_a["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("offering unavailable")),
        "{web:#}"
    );

    // The group: the controller's last write, and what holds it, until when.
    let (out, _) = ask(&["--output", "json", "group", "pool-a"]).await;
    let g: Value = serde_json::from_str(&out).unwrap();
    let c = &g["controller"];
    assert_eq!(c["leader"], "controller-0", "{g:#}");
    assert_eq!(c["lastWrite"]["to"], 3, "{g:#}");
    assert_eq!(c["lastWrite"]["from"], 2, "{g:#}");
    // Its scale-up was refused: no growth for `delayAfterAdd` to count from.
    let grown = group_status(&status(), "pool-a");
    assert!(grown["lastScaleUp"].is_null(), "{grown:#}");
    assert!(c["ageSeconds"].as_u64().is_some_and(|s| s < 60), "{g:#}");
    assert!(
        c["holds"].as_array().is_some_and(|h| h.iter().any(|h| h
            .as_str()
            .is_some_and(|h| h.starts_with("offering unavailable (allocation_failed) until ")))),
        "{g:#}"
    );
    assert!(g["notKnownHere"].is_null(), "{g:#}");
    assert!(
        g["outOfScaleUp"]
            .as_str()
            .is_some_and(|o| o.starts_with("offering unavailable")),
        "{g:#}"
    );
    let (text, _) = ask(&["group", "pool-a"]).await;
    assert!(
        text.contains("the running controller (leader controller-0, status written")
            && text.contains("holds: offering unavailable (allocation_failed) until "),
        "{text}"
    );

    // A node: unneeded since when the controller first found it so, and not long enough.
    let (out, _) = ask(&["--output", "json", "node", full[0].as_str()]).await;
    let n: Value = serde_json::from_str(&out).unwrap();
    let listed = group_status(&status(), "pool-full")["unneeded"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["node"] == full[0].as_str()).cloned())
        .expect("listed in the status");
    assert_eq!(n["unneeded"], true, "{n:#}");
    assert_eq!(n["reason"], "NotUnneededLongEnough", "{n:#}");
    let since: k8s_openapi::jiff::Timestamp = listed["since"].as_str().unwrap().parse().unwrap();
    let said: k8s_openapi::jiff::Timestamp = n["unneededSince"].as_str().unwrap().parse().unwrap();
    assert_eq!(said, since, "{n:#}");
    assert!(
        n["unneededForSeconds"].as_u64().is_some_and(|s| s < 120),
        "{n:#}"
    );
    let summary = n["summary"].as_str().unwrap();
    assert!(
        summary.contains("as the running controller counts")
            && summary.contains("after that, pool-full is at its floor (2): it stays"),
        "{summary}"
    );

    // The same from files: the status ConfigMap saved with the cluster
    // (`kubectl -n kube-system get configmap vmss-capacity-controller-status -o json`).
    let snap = tempfile::tempdir().unwrap();
    save(&emulator, snap.path()).await;
    let mut cm = kube
        .get(
            "v1",
            "configmaps",
            "kube-system",
            "vmss-capacity-controller-status",
        )
        .expect("status written");
    cm["kind"] = json!("ConfigMap");
    cm["apiVersion"] = json!("v1");
    std::fs::write(
        snap.path().join("status.json"),
        serde_json::to_vec(&cm).unwrap(),
    )
    .unwrap();
    let n = json_of(snap.path(), &["node", full[0].as_str()]);
    assert_eq!(n["reason"], "NotUnneededLongEnough", "{n:#}");
    let said: k8s_openapi::jiff::Timestamp = n["unneededSince"].as_str().unwrap().parse().unwrap();
    assert_eq!(said, since, "{n:#}");
    let g = json_of(snap.path(), &["group", "pool-a"]);
    assert_eq!(g["controller"]["lastWrite"]["to"], 3, "{g:#}");
    // A scale-up of another group two minutes before the status was written, the node unneeded
    // for an hour: scale-down is held for `delayAfterAdd` (10 min) in every group, until when.
    let mut doc: vmss_capacity_controller::kube::status::StatusDocument =
        serde_yaml::from_str(cm["data"]["status"].as_str().unwrap()).unwrap();
    let written: k8s_openapi::jiff::Timestamp = doc.time.parse().unwrap();
    let minutes = |m: i64| written - k8s_openapi::jiff::SignedDuration::from_mins(m);
    for g in &mut doc.node_groups {
        if g.name == "pool-a" {
            g.last_scale_up = Some(minutes(2).to_string());
        }
        for u in &mut g.unneeded {
            if u.node == full[0] {
                u.since = minutes(60).to_string();
            }
        }
    }
    let mut held = cm.clone();
    held["data"]["status"] = json!(serde_yaml::to_string(&doc).unwrap());
    let status_path = snap.path().join("status.json");
    std::fs::write(&status_path, serde_json::to_vec(&held).unwrap()).unwrap();
    let n = json_of(snap.path(), &["node", full[0].as_str()]);
    assert_eq!(n["reason"], "ScaleDownInCooldown", "{n:#}");
    let summary = n["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("scale-down is held until {}", minutes(-8)))
            && summary.contains("after the last scale-up of any group"),
        "{summary}"
    );
    // The group says it among what holds it.
    let g = json_of(snap.path(), &["group", "pool-full"]);
    assert!(
        g["controller"]["holds"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h.as_str().is_some_and(
                |h| h.starts_with(&format!("scale-down is held until {}", minutes(-8)))
            ))),
        "{g:#}"
    );
    // Past the hold, the floor is what keeps it.
    for g in &mut doc.node_groups {
        if g.name == "pool-a" {
            g.last_scale_up = Some(minutes(11).to_string());
        }
    }
    held["data"]["status"] = json!(serde_yaml::to_string(&doc).unwrap());
    std::fs::write(&status_path, serde_json::to_vec(&held).unwrap()).unwrap();
    let n = json_of(snap.path(), &["node", full[0].as_str()]);
    assert_eq!(n["reason"], "NodeGroupMinSizeReached", "{n:#}");
    let g = json_of(snap.path(), &["group", "pool-full"]);
    assert!(
        !g["controller"]["holds"]
            .to_string()
            .contains("delayAfterAdd"),
        "{g:#}"
    );
    // Without it, the snapshot says what it cannot know.
    std::fs::remove_file(snap.path().join("status.json")).unwrap();
    let g = json_of(snap.path(), &["group", "pool-a"]);
    assert!(g["controller"].is_null(), "{g:#}");
    assert!(
        g["notKnownHere"]
            .as_str()
            .is_some_and(|s| s.starts_with("no status of a running controller was read (ConfigMap kube-system/vmss-capacity-controller-status)")),
        "{g:#}"
    );
    assert!(
        g["outOfScaleUp"].is_null(),
        "only the running controller knew: {g:#}"
    );

    stop.cancel();
    task.await.unwrap().unwrap();
    drop(emulator);
}

/// A status ConfigMap as `kubectl get configmap -o json` saves it, holding `groups`.
fn status_file(
    dir: &Path,
    groups: Vec<vmss_capacity_controller::notify::GroupStatus>,
    written: k8s_openapi::jiff::Timestamp,
) {
    let doc = vmss_capacity_controller::kube::status::StatusDocument {
        leader: "controller-1".into(),
        time: written.to_string(),
        node_groups: groups,
    };
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "vmss-capacity-controller-status", "namespace": "kube-system"},
        "data": {"status": serde_yaml::to_string(&doc).unwrap()},
    });
    std::fs::write(dir.join("status.json"), serde_json::to_vec(&cm).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_groups_verdict_for_a_pod_is_said_in_its_own_words_max_size_filter_backoff_and_provisioning_timeout(
) {
    use vmss_capacity_controller::notify::GroupStatus;
    let (emulator, _, _) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    drop(emulator);
    // pool-a may not grow past the 2 nodes it has.
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "azure:\n  resourceManagerEndpoint: https://127.0.0.1:1\n  authorityHost: https://127.0.0.1:1\n  tenantId: tenant\n  subscriptionId: {SUB}\n  resourceGroup: {RG}\n  auth: {{method: managedIdentity}}\nnodeGroups:\n  - {{name: pool-a, minSize: 1, maxSize: 2}}\n  - {{name: pool-full, minSize: 2, maxSize: 2}}\n  - {{name: pool-gpu, minSize: 0, maxSize: 3}}\nkubernetes: {{enabled: true}}\ndemand: pods\nmaxNodeProvisionTime: 15m\n",
        ),
    )
    .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    let at = |secs: i64| (now + k8s_openapi::jiff::SignedDuration::from_secs(secs)).to_string();
    let group = |name: &str| GroupStatus {
        name: name.into(),
        kind: "vmss".into(),
        ..Default::default()
    };
    let verdicts = || {
        let (code, out, err) = explain(
            dir.path(),
            &[
                "--config",
                config.to_str().unwrap(),
                "--output",
                "json",
                "pod",
                "default/web",
            ],
        );
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["outcome"], "noGroupFits", "{v:#}");
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["group"].as_str().unwrap().to_string(),
                    g["reason"].as_str().unwrap_or("-").to_string(),
                    g["message"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };

    // The running controller backs pool-gpu off after write errors for 40 s more.
    let mut gpu = group("pool-gpu");
    gpu.backoff_until = Some(at(40));
    status_file(
        dir.path(),
        vec![group("pool-a"), group("pool-full"), gpu],
        now,
    );
    let v = verdicts();
    assert_eq!(
        v,
        vec![
            (
                "pool-a".into(),
                "max_size".into(),
                "node group at its max size".into()
            ),
            (
                "pool-full".into(),
                "insufficient_cpu".into(),
                "Insufficient cpu".into()
            ),
            (
                "pool-gpu".into(),
                "backoff".into(),
                "backed off after errors".into()
            ),
        ],
    );

    // Nodes it asked for did not register in time: passed over for a minute more.
    let mut gpu = group("pool-gpu");
    gpu.provision_backoff_until = Some(at(60));
    status_file(
        dir.path(),
        vec![group("pool-a"), group("pool-full"), gpu],
        now,
    );
    let (_, reason, message) = verdicts().remove(2);
    assert_eq!(reason, "provision_timeout");
    assert!(
        message.starts_with(
            "requested nodes did not register within maxNodeProvisionTime (900s): backed off for"
        ),
        "{message}"
    );

    // A mark that ran out is over: pool-gpu answers with its filter again.
    let mut gpu = group("pool-gpu");
    gpu.backoff_until = Some(at(-1));
    status_file(
        dir.path(),
        vec![group("pool-a"), group("pool-full"), gpu],
        now,
    );
    let (_, reason, message) = verdicts().remove(2);
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("taint", "node(s) had untolerated taint {sku: gpu}")
    );
}

/// A JSON value whose every object names each key once (serde_json's `Value` keeps the last of
/// two, so a duplicate can only be seen while parsing).
struct KeysOnce;

impl<'de> serde::Deserialize<'de> for KeysOnce {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = KeysOnce;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<KeysOnce, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "key {key:?} twice in one object"
                        )));
                    }
                    map.next_value::<KeysOnce>()?;
                }
                Ok(KeysOnce)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<KeysOnce, A::Error> {
                while seq.next_element::<KeysOnce>()?.is_some() {}
                Ok(KeysOnce)
            }
            fn visit_str<E>(self, _: &str) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
            fn visit_bool<E>(self, _: bool) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
            fn visit_i64<E>(self, _: i64) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
            fn visit_u64<E>(self, _: u64) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
            fn visit_f64<E>(self, _: f64) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
            fn visit_unit<E>(self) -> Result<KeysOnce, E> {
                Ok(KeysOnce)
            }
        }
        d.deserialize_any(V)
    }
}

/// The JSON Schema keywords [`schema_errors`] checks; a schema using any other is refused, so a
/// keyword cannot be silently ignored.
const SCHEMA_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$defs",
    "$ref",
    "title",
    "description",
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "const",
    "enum",
    "oneOf",
    "minimum",
];

/// Where `value` breaks `schema` (the subset of JSON Schema 2020-12 in [`SCHEMA_KEYWORDS`];
/// `$ref` only to `#/$defs/NAME` of `root`), one line per problem; empty: it conforms.
fn schema_errors(root: &Value, schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(schema) = schema.as_object() else {
        return vec![format!("{at}: the schema is not an object")];
    };
    for key in schema.keys() {
        assert!(
            SCHEMA_KEYWORDS.contains(&key.as_str()),
            "the schema uses {key:?}, which this check does not know"
        );
    }
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("$ref to #/$defs/NAME");
        let def = &root["$defs"][name];
        assert!(def.is_object(), "$ref {r} names no definition");
        out.extend(schema_errors(root, def, value, at));
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => panic!("type must be a string or a list"),
        };
        let is = |ty: &str| match ty {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            other => panic!("unknown type {other}"),
        };
        if !types.iter().any(|t| is(t)) {
            out.push(format!("{at}: {value} is not {}", types.join(" or ")));
            return out;
        }
    }
    if let Some(c) = schema.get("const") {
        if c != value {
            out.push(format!("{at}: {value} is not {c}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(value) {
            out.push(format!(
                "{at}: {value} is not one of {}",
                Value::from(e.clone())
            ));
        }
    }
    if let (Some(min), Some(n)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) {
        if n < min {
            out.push(format!("{at}: {n} is below {min}"));
        }
    }
    if let Some(obj) = value.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !obj.contains_key(r) {
                out.push(format!("{at}: {r:?} is required"));
            }
        }
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => out.extend(schema_errors(root, s, v, &format!("{at}.{k}"))),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    out.push(format!("{at}: {k:?} is not in the schema"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            out.extend(schema_errors(root, items, v, &format!("{at}[{i}]")));
        }
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        let each: Vec<Vec<String>> = options
            .iter()
            .map(|o| schema_errors(root, o, value, at))
            .collect();
        match each.iter().filter(|e| e.is_empty()).count() {
            1 => {}
            0 => {
                out.push(format!("{at}: matches none of oneOf:"));
                out.extend(each.into_iter().flatten().map(|e| format!("  {e}")));
            }
            n => out.push(format!("{at}: matches {n} of oneOf, not one")),
        }
    }
    out
}

fn explain_schema() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/explain.schema.json"
        ))
        .expect("docs/explain.schema.json"),
    )
    .expect("the schema is JSON")
}

#[test]
fn the_explain_schema_check_refuses_what_the_schema_does_not_allow() {
    let schema = explain_schema();
    let errors = |v: Value| schema_errors(&schema, &schema, &v, "$");
    let group = json!({"subject": "group", "group": "g", "kind": "vmss", "min": 0, "max": 3,
        "floor": 0, "size": null, "zones": [], "nodesReady": 0, "nodesNotReady": 0,
        "podsForIt": [], "unneededNodes": [], "quota": []});
    assert_eq!(errors(group.clone()), Vec::<String>::new());
    let mut unknown = group.clone();
    unknown["colour"] = json!("blue");
    assert!(
        !errors(unknown).is_empty(),
        "a key the schema does not name"
    );
    let mut missing = group.clone();
    missing.as_object_mut().unwrap().remove("quota");
    assert!(!errors(missing).is_empty(), "a required key left out");
    let mut wrong = group.clone();
    wrong["kind"] = json!("group");
    assert!(!errors(wrong).is_empty(), "a kind that is not a group's");
    let mut typed = group;
    typed["min"] = json!("0");
    assert!(!errors(typed).is_empty(), "a number as a string");
    assert!(
        serde_json::from_str::<KeysOnce>(r#"{"kind": "group", "a": {"kind": 1, "kind": 2}}"#)
            .is_err(),
        "a key twice in a nested object"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_json_names_each_key_once_and_matches_docs_explain_schema_for_every_subject() {
    use vmss_capacity_controller::notify::{ConflictRecord, GroupStatus, WriteRecord};
    let (emulator, a, full) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    drop(emulator);
    let schema = explain_schema();
    let mut asked = vec![
        vec!["pod", "default/web"],
        vec!["pod", "default/huge"],
        vec!["pod", "default/db-0"],
        vec!["node", a[0].as_str()],
        vec!["node", full[0].as_str()],
        vec!["group", "pool-a"],
        vec!["group", "pool-gpu"],
    ];
    let check = |label: &str, args: &[Vec<&str>]| {
        for q in args {
            let mut all = vec!["--output", "json"];
            all.extend_from_slice(q);
            let (code, out, err) = explain(dir.path(), &all);
            assert_eq!(code, 0, "{q:?}: {err}");
            if let Err(e) = serde_json::from_str::<KeysOnce>(&out) {
                panic!("{label} {q:?}: {e}:\n{out}");
            }
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["subject"], q[0], "{v:#}");
            let errors = schema_errors(&schema, &schema, &v, "$");
            assert!(
                errors.is_empty(),
                "{label} {q:?} breaks docs/explain.schema.json:\n{}\n{v:#}",
                errors.join("\n")
            );
        }
    };
    check("without a status", &asked);
    // With the running controller's status: the group's `controller` view, a last write whose
    // `from` is not known, a last 412.
    let written = k8s_openapi::jiff::Timestamp::now();
    let pool_a = GroupStatus {
        name: "pool-a".into(),
        kind: "vmss".into(),
        target: Some(3),
        capacity: Some(2),
        etag: Some("\"4\"".into()),
        last_write: Some(WriteRecord {
            at: written.to_string(),
            from: None,
            to: 3,
            result: "ok".into(),
        }),
        last_conflict: Some(ConflictRecord {
            at: written.to_string(),
            outcome: "retried_ok".into(),
        }),
        backoff_until: Some(
            (written + k8s_openapi::jiff::SignedDuration::from_secs(60)).to_string(),
        ),
        ..Default::default()
    };
    status_file(dir.path(), vec![pool_a], written);
    asked.push(vec!["node", a[1].as_str()]);
    check("with a status", &asked);
    let g = json_of(dir.path(), &["group", "pool-a"]);
    let c = &g["controller"];
    assert!(
        c["lastWrite"]["from"].is_null() && c["lastConflict"].is_object(),
        "the status's view was checked: {g:#}"
    );
}

/// A simulated cluster with scale set `dear` (two Ready nodes of `size`, returned by name) and,
/// with `cheap`, an empty `cheap` of `Standard_D4s_v5`.
async fn two_dear_nodes(size: &str, cheap: bool) -> (EmulatorHandle, Vec<String>) {
    let emulator = EmulatorBuilder::new()
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: Duration::from_millis(50),
            tick: Duration::from_millis(20),
        })
        .start()
        .await
        .expect("emulator starts");
    let state = emulator.state();
    state.seed_scale_set(seed("dear", size, 2, &[]));
    if cheap {
        state.seed_scale_set(seed("cheap", "Standard_D4s_v5", 0, &[]));
    }
    let kube = emulator.kube().expect("kubernetes side");
    let mut dear = Vec::new();
    for _ in 0..500 {
        dear = kube.nodes_by_scale_set().remove("dear").unwrap_or_default();
        if dear.len() == 2 && kube.ready_nodes().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dear.len(), 2);
    (emulator, dear)
}

/// Two D2s_v5 nodes of `dear`, each with a 1.2-cpu pod the other has no room for, and an empty
/// `cheap` D4s_v5 group; `explain node` with consolidation on says whether a node goes, and how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_node_says_whether_a_node_is_consolidated_by_a_replace_and_why_not() {
    let (emulator, dear) = two_dear_nodes("Standard_D2s_v5", true).await;
    let kube = emulator.kube().expect("kubernetes side");
    for (i, n) in dear.iter().enumerate() {
        kube.create(
            "v1",
            "pods",
            "default",
            pod(&format!("web-{i}"), "1200m", Some(n), json!({})),
        )
        .expect("pod created");
    }
    // The second node carries the controller's soft taint, written at 2026-11-28T12:00:00Z.
    let mut node = kube.get("v1", "nodes", "", &dear[1]).expect("the node");
    node["spec"]["taints"] = json!([{"key": "vmss-capacity-controller/deletion-candidate",
        "value": "1795867200", "effect": "PreferNoSchedule"}]);
    kube.update("v1", "nodes", "", node).expect("soft-tainted");
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    drop(emulator);
    let config = |cheap_price: f64, budget: &str| {
        let path = dir
            .path()
            .join(format!("config-{cheap_price}-{}.yaml", budget.len()));
        std::fs::write(
            &path,
            format!(
                "azure:\n  resourceManagerEndpoint: https://127.0.0.1:1\n  authorityHost: https://127.0.0.1:1\n  tenantId: tenant\n  subscriptionId: {SUB}\n  resourceGroup: {RG}\n  auth: {{method: managedIdentity}}\nnodeGroups:\n  - {{name: dear, minSize: 0, maxSize: 3}}\n  - {{name: cheap, minSize: 0, maxSize: 3}}\nkubernetes: {{enabled: true}}\ndemand: pods\nprices: {{fetch: false, pricePerHour: {{dear: 1.0, cheap: {cheap_price}}}}}\nconsolidation: {{enabled: true, budgets: [{budget}]}}\n",
            ),
        )
        .unwrap();
        path
    };
    let said = |path: &Path| {
        let v = json_of(
            dir.path(),
            &["--config", path.to_str().unwrap(), "node", &dear[0]],
        );
        v["consolidation"].as_str().unwrap_or_default().to_string()
    };
    // Cheaper: replaced, with what and what it saves.
    let why = said(&config(0.3, "{nodes: \"100%\"}"));
    assert!(
        why.contains("consolidated by a replace")
            && why.contains("new node of cheap")
            && why.contains("saving $1.700/h"),
        "{why}"
    );
    // Dearer than the two: not consolidated, and why (no delete, no cheaper replacement).
    let why = said(&config(2.5, "{nodes: \"100%\"}"));
    assert!(
        why.starts_with("not consolidated")
            && why.contains("do not all fit on the nodes that stay")
            && why.contains("no cheaper node group's new node replaces")
            && why.contains("not less than"),
        "{why}"
    );
    // A budget that allows no replace.
    let why = said(&config(
        0.3,
        "{nodes: \"100%\"}, {nodes: \"0\", reasons: [Replace]}",
    ));
    assert!(
        why.starts_with("not consolidated") && why.contains("reasons: [Replace]"),
        "{why}"
    );
    // The soft taint is said, with when it went on; a node without it says nothing of it.
    let path = config(0.3, "{nodes: \"100%\"}");
    let node_json = |name: &str| {
        json_of(
            dir.path(),
            &["--config", path.to_str().unwrap(), "node", name],
        )
    };
    let tainted = node_json(&dear[1]);
    assert_eq!(tainted["softTaintedSince"], "2026-11-28T12:00:00Z");
    assert!(node_json(&dear[0]).get("softTaintedSince").is_none());
    // docs/explain.schema.json knows both keys consolidation adds.
    let schema = explain_schema();
    assert!(tainted.get("consolidation").is_some(), "{tainted}");
    let errors = schema_errors(&schema, &schema, &tainted, "$");
    assert!(errors.is_empty(), "{errors:?}: {tainted}");
    let (code, text, _) = explain(
        dir.path(),
        &["--config", path.to_str().unwrap(), "node", &dear[1]],
    );
    assert_eq!(code, 0);
    assert!(
        text.contains("soft-tainted as a deletion candidate since 2026-11-28T12:00:00Z"),
        "{text}"
    );
    // With `emptyFirst` the soft taint dates the hint: the node soft-tainted long ago is ripe
    // and replaced alone; the other waits for its pods to leave on their own.
    let empty_first = dir.path().join("config-empty-first.yaml");
    std::fs::write(
        &empty_first,
        std::fs::read_to_string(&path).unwrap().replace(
            "consolidation: {enabled: true,",
            "consolidation: {enabled: true, emptyFirst: 10m, deletionCostHints: 3,",
        ),
    )
    .unwrap();
    let said_of = |name: &str| {
        let v = json_of(
            dir.path(),
            &["--config", empty_first.to_str().unwrap(), "node", name],
        );
        v["consolidation"].as_str().unwrap_or_default().to_string()
    };
    let why = said_of(&dear[0]);
    assert!(
        why.starts_with("not consolidated")
            && why.contains("consolidation.emptyFirst")
            && why.contains("not soft-tainted yet"),
        "{why}"
    );
    let why = said_of(&dear[1]);
    assert!(
        why.contains("consolidated by a replace") && why.contains("goes with 1 node(s)"),
        "{why}"
    );
}

#[tokio::test]
async fn explain_node_says_a_node_running_a_jobs_pod_waits_for_it_unless_disrupt_jobs() {
    let (emulator, dear) = two_dear_nodes("Standard_D4s_v5", false).await;
    let kube = emulator.kube().expect("kubernetes side");
    // A Job's running pod on the first node, which would fit on the second.
    let mut job_pod = pod("nightly-x7k2p", "500m", Some(&dear[0]), json!({}));
    job_pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job",
        "name": "nightly", "uid": "job-uid", "controller": true}]);
    kube.create("v1", "pods", "default", job_pod)
        .expect("pod created");
    kube.create(
        "v1",
        "pods",
        "default",
        pod("web-0", "500m", Some(&dear[1]), json!({})),
    )
    .expect("pod created");
    let dir = tempfile::tempdir().unwrap();
    save(&emulator, dir.path()).await;
    drop(emulator);
    let said = |extra: &str| {
        let path = dir.path().join(format!("config-{}.yaml", extra.len()));
        std::fs::write(
            &path,
            format!(
                "azure:\n  resourceManagerEndpoint: https://127.0.0.1:1\n  authorityHost: https://127.0.0.1:1\n  tenantId: tenant\n  subscriptionId: {SUB}\n  resourceGroup: {RG}\n  auth: {{method: managedIdentity}}\nnodeGroups:\n  - {{name: dear, minSize: 0, maxSize: 3}}\nkubernetes: {{enabled: true}}\ndemand: pods\nprices: {{fetch: false}}\nconsolidation: {{enabled: true, budgets: [{{nodes: \"100%\"}}]{extra}}}\n",
            ),
        )
        .unwrap();
        let v = json_of(
            dir.path(),
            &["--config", path.to_str().unwrap(), "node", &dear[0]],
        );
        v
    };
    // Consolidation's verdict, and the scale-down of underused nodes': whether unneeded, its
    // reason and the blocking pod's reason.
    let verdicts = |extra: &str| {
        let v = said(extra);
        (
            v["consolidation"].as_str().unwrap_or_default().to_string(),
            (
                v["unneeded"].as_bool(),
                v["reason"].as_str().unwrap_or_default().to_string(),
                v["blockingPod"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
        )
    };
    let (why, down) = verdicts("");
    // The node is under cluster-autoscaler's threshold and its pod fits beside `web-0`, yet the
    // scale-down of underused nodes keeps it too while consolidation keeps Jobs.
    assert_eq!(
        down,
        (
            Some(false),
            "BlockedByPod".to_string(),
            "RunsToCompletion".to_string()
        ),
        "{why}"
    );
    assert!(
        why.starts_with("not consolidated")
            && why.contains("default/nightly-x7k2p runs to completion")
            && why.contains("consolidation.disruptJobs: false"),
        "{why}"
    );
    // With disruptJobs, the node's pod would move: it is consolidated.
    let (why, down) = verdicts(", disruptJobs: true");
    assert_eq!(down.0, Some(true), "{down:?}");
    assert!(
        why.starts_with("consolidated") && !why.contains("runs to completion"),
        "{why}"
    );
}
