//! Issue 42 item 1: every fault the controller must survive, played from outside. Each test
//! starts the `emulator --simulate-cluster` process, as a user would, and drives it only through
//! the documented HTTP routes (`/_emulator/`, `/_emulator/kube/`, ARM and the Kubernetes API)
//! with reqwest, checking what an outside client sees.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vmss-capacity-controller");
/// `--subscription` and `--resource-group` defaults of `emulator`.
const SUB: &str = "00000000-0000-0000-0000-000000000000";
const RG: &str = "rg-demo";
const API: &str = "api-version=2024-07-01";

/// Kills the process when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The emulator process and an outside client of it.
struct Outside {
    _process: Running,
    _dir: tempfile::TempDir,
    url: String,
    kube_token: String,
    http: reqwest::Client,
}

/// An answer: status and JSON body (`Null` when not JSON).
struct Answer {
    status: u16,
    body: Value,
}

impl Outside {
    /// `emulator --simulate-cluster` with quick LROs and boots, plus `args`.
    async fn start(args: &[&str]) -> Outside {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(BIN)
            .arg("emulator")
            .args(["--listen", "127.0.0.1:0", "--lro-delay", "200ms"])
            .args(["--simulate-cluster", "--boot-delay", "200ms"])
            .args(["--kubeconfig-out", kubeconfig.to_str().unwrap()])
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
        // The token a user finds in the kubeconfig the emulator wrote.
        let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written");
        let kube_token = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("token: "))
            .expect("a token in the kubeconfig")
            .to_string();
        Outside {
            _process: Running(child),
            _dir: dir,
            url,
            kube_token,
            http: reqwest::Client::builder()
                .user_agent("outsider/1.0")
                .build()
                .unwrap(),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> Answer {
        let mut req = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.url),
        );
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("answered");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    /// A control request (`/_emulator/...`, no authentication).
    async fn control(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        self.send(method, &format!("/_emulator{path}"), body, None)
            .await
    }

    /// A Kubernetes API request with the kubeconfig's token.
    async fn kube(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let token = self.kube_token.clone();
        self.send(method, path, body, Some(&token)).await
    }

    /// An ARM request with a token the emulator issues to `outsider`.
    async fn arm(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let token = self
            .control("GET", "/token?client_id=outsider", None)
            .await
            .body["access_token"]
            .as_str()
            .expect("a token")
            .to_string();
        let sep = if path.contains('?') { '&' } else { '?' };
        self.send(method, &format!("{path}{sep}{API}"), body, Some(&token))
            .await
    }

    /// Seeds a scale set through `POST /_emulator/scale-sets`.
    async fn seed(&self, seed: Value) {
        let a = self.control("POST", "/scale-sets", Some(seed)).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }

    /// The simulated Nodes of scale set `name` (node names start with it).
    async fn nodes_of(&self, name: &str) -> Vec<Value> {
        let a = self.kube("GET", "/api/v1/nodes", None).await;
        a.body["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| {
                n["metadata"]["name"]
                    .as_str()
                    .is_some_and(|s| s.starts_with(name))
            })
            .collect()
    }

    /// Waits (bounded) until `name` has `want` Nodes of which `ready` are Ready.
    async fn await_nodes(&self, name: &str, want: usize, ready: usize) -> Vec<Value> {
        let mut nodes = Vec::new();
        for _ in 0..100 {
            nodes = self.nodes_of(name).await;
            if nodes.len() == want
                && nodes.iter().filter(|n| ready_status(n) == "True").count() == ready
            {
                return nodes;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{name}: wanted {want} nodes, {ready} Ready; got {:?}",
            nodes
                .iter()
                .map(|n| (n["metadata"]["name"].clone(), ready_status(n)))
                .collect::<Vec<_>>()
        );
    }

    /// The instances of scale set `name` with their instance views.
    async fn instances(&self, name: &str) -> Vec<Value> {
        let a = self
            .arm(
                "GET",
                &format!("{}/virtualMachines?$expand=instanceView", vmss(name)),
                None,
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        a.body["value"].as_array().cloned().unwrap_or_default()
    }
}

fn vmss(name: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}")
}

fn ready_status(node: &Value) -> String {
    node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

fn taints(node: &Value) -> Vec<(String, String)> {
    node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap_or("").to_string(),
                t["effect"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn usage(usages: &Value, name: &str) -> (i64, i64) {
    let row = usages["value"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"]["value"] == name))
        .unwrap_or_else(|| panic!("no usage {name} in {usages}"));
    (
        row["currentValue"].as_i64().unwrap(),
        row["limit"].as_i64().unwrap(),
    )
}

fn error_message(a: &Answer) -> String {
    a.body["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_set_by_flag_and_by_route_refuses_growth_past_it_and_the_usages_show_it() {
    let o = Outside::start(&[
        "--scale-set",
        "dsv5:Standard_D4s_v5:1",
        "--quota",
        "standardDSv5Family=8",
    ])
    .await;
    let quota = format!("/quota/{SUB}/westeurope");
    let a = o.control("GET", &quota, None).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        usage(&a.body, "standardDSv5Family"),
        (4, 8),
        "the flag's limit"
    );
    assert_eq!(usage(&a.body, "cores").0, 4);

    // Growing to 3 nodes (12 vCPUs) passes the 8: Azure's 409, nothing changed.
    let grow = json!({"sku": {"capacity": 3}});
    let a = o.arm("PATCH", &vmss("dsv5"), Some(grow.clone())).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "OperationNotAllowed");
    assert!(
        error_message(&a).contains("standardDSv5Family Cores quota"),
        "{}",
        a.body
    );

    // Raised through the route: the ARM usages list shows it, the write goes through.
    let a = o
        .control(
            "POST",
            &quota,
            Some(json!({"limits": {"standardDSv5Family": 12, "cores": 100}})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(usage(&a.body, "standardDSv5Family"), (4, 12));
    let listed = o
        .arm(
            "GET",
            &format!(
                "/subscriptions/{SUB}/providers/Microsoft.Compute/locations/westeurope/usages"
            ),
            None,
        )
        .await;
    assert_eq!(usage(&listed.body, "standardDSv5Family"), (4, 12));
    assert_eq!(usage(&listed.body, "cores"), (4, 100));
    let a = o.arm("PATCH", &vmss("dsv5"), Some(grow)).await;
    assert!(a.status < 300, "{} {}", a.status, a.body);
    let a = o.control("GET", &quota, None).await;
    assert_eq!(usage(&a.body, "standardDSv5Family"), (12, 12));

    // Bad input is named.
    let a = o
        .control("POST", &quota, Some(json!({"limits": {"cores": -1}})))
        .await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("\"cores\""), "{}", a.body);
    let a = o.control("POST", &quota, Some(json!({"limit": 3}))).await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("limit"), "{}", a.body);
    let out = Command::new(BIN)
        .args(["emulator", "--quota", "standardDSv5Family=lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("limit \"lots\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_eviction_by_route_deletes_or_deallocates_as_the_scale_sets_policy_says() {
    let o = Outside::start(&["--scale-set", "regular:Standard_D2s_v5:1"]).await;
    for (name, policy) in [("spotdel", "Delete"), ("spotdea", "Deallocate")] {
        o.seed(
            json!({"subscription": SUB, "resource_group": RG, "name": name, "capacity": 3,
            "priority": "Spot", "eviction_policy": policy}),
        )
        .await;
        o.await_nodes(name, 3, 3).await;
    }

    // Delete: the VMs go, the capacity drops, their Nodes go.
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/spotdel/evict"),
            Some(json!({"count": 2})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["evicted"], json!(["0", "1"]));
    assert_eq!(a.body["eviction_policy"], "Delete");
    assert_eq!(a.body["capacity"], 1);
    assert_eq!(o.instances("spotdel").await.len(), 1);
    o.await_nodes("spotdel", 1, 1).await;

    // Deallocate: the VMs stay, stopped; the capacity and the quota they use stay; their
    // Nodes are no longer Ready.
    let etag = o
        .control("GET", &format!("/scale-sets/{SUB}/{RG}/spotdea"), None)
        .await
        .body["etag"]
        .clone();
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/spotdea/evict"),
            Some(json!({"count": 2})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["eviction_policy"], "Deallocate");
    assert_eq!(
        (a.body["capacity"].clone(), a.body["etag"].clone()),
        (json!(3), etag)
    );
    let powers: Vec<String> = o
        .instances("spotdea")
        .await
        .iter()
        .map(|i| {
            i["properties"]["instanceView"]["statuses"][1]["code"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        powers,
        [
            "PowerState/deallocated",
            "PowerState/deallocated",
            "PowerState/running"
        ]
    );
    let nodes = o.await_nodes("spotdea", 3, 1).await;
    assert!(nodes
        .iter()
        .filter(|n| ready_status(n) != "True")
        .all(|n| taints(n)
            .iter()
            .any(|(k, _)| k == "node.cloudprovider.kubernetes.io/shutdown")));
    let usages = o
        .control("GET", &format!("/quota/{SUB}/westeurope"), None)
        .await;
    assert_eq!(
        usage(&usages.body, "lowPriorityCores").0,
        (1 + 3) * 2,
        "deallocated VMs still count"
    );

    // Bad input: not spot, unknown, no count.
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/regular/evict"),
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(
        error_message(&a).contains("not a spot scale set"),
        "{}",
        a.body
    );
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/nosuch/evict"),
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(a.status, 404);
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/spotdel/evict"),
            Some(json!({"count": 0})),
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("count"), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_kubelet_by_route_leaves_its_node_unknown_and_its_deleted_pods_terminating() {
    let o = Outside::start(&["--scale-set", "w:Standard_D4s_v5:2"]).await;
    let nodes = o.await_nodes("w", 2, 2).await;
    let dead = nodes[0]["metadata"]["name"].as_str().unwrap().to_string();
    let healthy = nodes[1]["metadata"]["name"].as_str().unwrap().to_string();
    for (pod, node) in [("a", &dead), ("b", &dead), ("c", &healthy)] {
        let a = o
            .control(
                "POST",
                "/kube/pods",
                Some(json!({"name": pod, "nodeName": node})),
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }

    let a = o
        .control(
            "POST",
            &format!("/kube/nodes/{dead}/kubelet"),
            Some(json!({"dead": true})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // The simulation keeps it so: read it back after a few of its ticks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let node = o
        .kube("GET", &format!("/api/v1/nodes/{dead}"), None)
        .await
        .body;
    assert_eq!(ready_status(&node), "Unknown");
    let ready = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "NodeStatusUnknown");
    let t = taints(&node);
    for effect in ["NoSchedule", "NoExecute"] {
        assert!(
            t.contains(&("node.kubernetes.io/unreachable".into(), effect.into())),
            "{t:?}"
        );
    }
    assert!(
        !t.iter().any(|(k, _)| k == "node.kubernetes.io/not-ready"),
        "{t:?}"
    );

    // Its pods, evicted or deleted, get a deletionTimestamp and stay: no kubelet confirms.
    let a = o
        .kube(
            "POST",
            "/api/v1/namespaces/default/pods/a/eviction",
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": "default"}})),
        )
        .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let a = o
        .kube("DELETE", "/api/v1/namespaces/default/pods/b", None)
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // A pod on a live node goes at once.
    let a = o
        .kube("DELETE", "/api/v1/namespaces/default/pods/c", None)
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for pod in ["a", "b"] {
        let p = o
            .kube(
                "GET",
                &format!("/api/v1/namespaces/default/pods/{pod}"),
                None,
            )
            .await;
        assert_eq!(p.status, 200, "{pod} stays");
        assert!(
            p.body["metadata"]["deletionTimestamp"].is_string(),
            "{}",
            p.body
        );
    }
    let c = o
        .kube("GET", "/api/v1/namespaces/default/pods/c", None)
        .await;
    assert_eq!(c.status, 404);

    // Revived: Ready again, untainted.
    let a = o
        .control(
            "POST",
            &format!("/kube/nodes/{dead}/kubelet"),
            Some(json!({"dead": false})),
        )
        .await;
    assert_eq!(a.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let node = o
        .kube("GET", &format!("/api/v1/nodes/{dead}"), None)
        .await
        .body;
    assert_eq!(ready_status(&node), "True");
    assert!(!taints(&node)
        .iter()
        .any(|(k, _)| k == "node.kubernetes.io/unreachable"));

    let a = o
        .control(
            "POST",
            "/kube/nodes/nosuch/kubelet",
            Some(json!({"dead": true})),
        )
        .await;
    assert_eq!(a.status, 404);
    let a = o
        .control(
            "POST",
            &format!("/kube/nodes/{dead}/kubelet"),
            Some(json!({"dead": "yes"})),
        )
        .await;
    assert_eq!(a.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_stuck_failed_or_updating_by_route_lists_so_until_lifted() {
    let o = Outside::start(&["--scale-set", "w:Standard_D2s_v5:3"]).await;
    o.await_nodes("w", 3, 3).await;
    let etag = o.arm("GET", &vmss("w"), None).await.body["etag"].clone();
    let state = |id: &str| format!("/scale-sets/{SUB}/{RG}/w/instances/{id}/provisioning-state");
    for (id, s) in [("0", "Failed"), ("1", "Updating")] {
        let a = o
            .control("POST", &state(id), Some(json!({"provisioning_state": s})))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["provisioning_state"], s);
    }
    let listed = |vms: &[Value]| -> Vec<(String, String)> {
        vms.iter()
            .map(|v| {
                (
                    v["properties"]["provisioningState"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    v["properties"]["instanceView"]["statuses"][0]["code"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )
            })
            .collect()
    };
    let vms = o.instances("w").await;
    assert_eq!(
        listed(&vms),
        [
            ("Failed".into(), "ProvisioningState/failed".into()),
            ("Updating".into(), "ProvisioningState/updating".into()),
            ("Succeeded".into(), "ProvisioningState/succeeded".into()),
        ]
    );
    assert_eq!(
        o.arm("GET", &vmss("w"), None).await.body["etag"],
        etag,
        "the model is unchanged"
    );

    let a = o
        .control(
            "POST",
            &state("0"),
            Some(json!({"provisioning_state": "Succeeded"})),
        )
        .await;
    assert_eq!(a.body["provisioning_state"], "Succeeded");
    assert_eq!(listed(&o.instances("w").await)[0].0, "Succeeded");

    let a = o
        .control(
            "POST",
            &state("9"),
            Some(json!({"provisioning_state": "Failed"})),
        )
        .await;
    assert_eq!(a.status, 404);
    let a = o
        .control(
            "POST",
            &state("1"),
            Some(json!({"provisioning_state": "Broken"})),
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("\"broken\""), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lro_failed_by_route_fails_only_the_new_instances_and_they_never_become_nodes() {
    let o = Outside::start(&["--scale-set", "w:Standard_D2s_v5:2"]).await;
    o.await_nodes("w", 2, 2).await;
    let a = o
        .control(
            "POST",
            "/faults",
            Some(
                json!({"method": "PATCH", "path_contains": "virtualMachineScaleSets/w", "count": 1,
                "kind": {"type": "lroFailed", "code": "AllocationFailed"}}),
            ),
        )
        .await;
    assert_eq!(a.status, 200);
    let a = o
        .arm("PATCH", &vmss("w"), Some(json!({"sku": {"capacity": 4}})))
        .await;
    assert!(a.status < 300, "{}", a.body);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let states: Vec<String> = o
        .instances("w")
        .await
        .iter()
        .map(|v| {
            v["properties"]["provisioningState"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(states, ["Succeeded", "Succeeded", "Failed", "Failed"]);
    // Well past the boot delay: the two healthy Nodes, Ready; none for the failed VMs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let nodes = o.await_nodes("w", 2, 2).await;
    let names: Vec<&str> = nodes
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["w000000", "w000001"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_and_silent_watches_by_route_answer_403_or_send_nothing_per_kind() {
    let o = Outside::start(&[]).await;
    let set = |plural: &str, body: Value| {
        let path = format!("/kube/faults/{plural}");
        let o = &o;
        async move { o.control("POST", &path, Some(body)).await }
    };
    let a = set("pods", json!({"forbidWatch": true})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["pods"]["forbidWatch"], true);
    let watch = o
        .kube("GET", "/api/v1/pods?watch=1&timeoutSeconds=1", None)
        .await;
    assert_eq!(watch.status, 403);
    assert_eq!(watch.body["reason"], "Forbidden");
    assert_eq!(
        o.kube("GET", "/api/v1/pods", None).await.status,
        200,
        "LIST still answers"
    );
    set("pods", json!({"forbidList": true})).await;
    assert_eq!(o.kube("GET", "/api/v1/pods", None).await.status, 403);
    assert_eq!(
        o.kube("GET", "/api/v1/nodes", None).await.status,
        200,
        "other kinds unaffected"
    );
    let all = o.control("GET", "/kube/faults", None).await;
    assert_eq!(all.body["pods"]["forbidList"], true);

    // Silent: a watch of configmaps is accepted and sends nothing until the fault is lifted.
    set("configmaps", json!({"silentWatch": true})).await;
    let mut resp = o
        .http
        .get(format!(
            "{}/api/v1/namespaces/default/configmaps?watch=1",
            o.url
        ))
        .bearer_auth(&o.kube_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let created = o
        .kube(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some(json!({"metadata": {"name": "x"}, "data": {"k": "v"}})),
        )
        .await;
    assert_eq!(created.status, 201);
    let quiet = tokio::time::timeout(Duration::from_millis(700), resp.chunk()).await;
    assert!(quiet.is_err(), "a silent watch sent {quiet:?}");
    set("configmaps", json!({"silentWatch": false})).await;
    let chunk = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
        .await
        .expect("the event comes once the fault is lifted")
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_slice(&chunk).unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "x");

    let a = o.control("DELETE", "/kube/faults", None).await;
    assert_eq!(a.status, 200);
    assert_eq!(o.kube("GET", "/api/v1/pods", None).await.status, 200);
    assert_eq!(o.control("GET", "/kube/faults", None).await.body, json!({}));
    let a = set("widgets", json!({"forbidWatch": true})).await;
    assert_eq!(a.status, 404);
    assert!(error_message(&a).contains("widgets"), "{}", a.body);
    let a = set("pods", json!({"forbidWatches": true})).await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("forbidWatches"), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_by_route_delay_only_their_kind_and_a_slow_answer_shows_the_older_state() {
    let o = Outside::start(&[]).await;
    let a = o
        .control("POST", "/kube/faults/pods", Some(json!({"latencyMs": 800})))
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let t = Instant::now();
    assert_eq!(o.kube("GET", "/api/v1/pods", None).await.status, 200);
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert_eq!(o.kube("GET", "/api/v1/nodes", None).await.status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "nodes are not slowed: {:?}",
        t.elapsed()
    );

    // A slow answer is handled at once: a LIST answered late does not show what was created
    // after it was handled.
    o.control(
        "POST",
        "/kube/faults/configmaps",
        Some(json!({"slowAnswerMs": 1000})),
    )
    .await;
    let t = Instant::now();
    let (list, created) = tokio::join!(
        o.kube("GET", "/api/v1/namespaces/default/configmaps", None),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            o.kube(
                "POST",
                "/api/v1/namespaces/default/configmaps",
                Some(json!({"metadata": {"name": "later"}})),
            )
            .await
        }
    );
    assert!(t.elapsed() >= Duration::from_millis(1000));
    assert_eq!((list.status, created.status), (200, 201));
    assert_eq!(
        list.body["items"],
        json!([]),
        "answered with the state it was handled in"
    );
    let a = o
        .control(
            "POST",
            "/kube/faults/pods",
            Some(json!({"latencyMs": 99_999_999})),
        )
        .await;
    assert_eq!(a.status, 400);
    assert!(error_message(&a).contains("latencyMs"), "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_side_is_recorded_with_method_path_status_and_user_agent() {
    let o = Outside::start(&[]).await;
    assert_eq!(
        o.kube("GET", "/api/v1/nodes?limit=5", None).await.status,
        200
    );
    assert_eq!(
        o.kube("GET", "/api/v1/namespaces/default/pods/nosuch", None)
            .await
            .status,
        404
    );
    o.arm("GET", &vmss("nosuch"), None).await;
    let log = o.control("GET", "/kube/requests", None).await.body;
    let rows: Vec<(String, String, Value, Value, Value, Value)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap().to_string(),
                r["path"].as_str().unwrap().to_string(),
                r["query"].clone(),
                r["resource"].clone(),
                r["status"].clone(),
                r["user_agent"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (
                "GET".into(),
                "/api/v1/nodes".into(),
                json!("limit=5"),
                json!("nodes"),
                json!(200),
                json!("outsider/1.0")
            ),
            (
                "GET".into(),
                "/api/v1/namespaces/default/pods/nosuch".into(),
                Value::Null,
                json!("pods"),
                json!(404),
                json!("outsider/1.0")
            ),
        ],
        "ARM requests and control requests are not in it"
    );
    // ARM's own log has the user agent too.
    let arm = o.control("GET", "/requests", None).await.body;
    let last = arm.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["status"].clone(), last["user_agent"].clone()),
        (json!(404), json!("outsider/1.0"))
    );
}

/// Node labels that differ from the tags (issue 42 item 1): by flag at start-up and by route at
/// run time, new Nodes register with the labels and taints given, over the template tags';
/// Nodes already there keep theirs; bad input is a 400 naming it, an unknown scale set a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_labels_by_flag_and_by_route_differ_from_the_tags_on_new_nodes_only() {
    let o = Outside::start(&[
        "--scale-set",
        "w:Standard_D2s_v5:0",
        "--node-label",
        "w:tier=silver",
        "--node-label",
        "w:workload-",
        "--node-taint",
        "w:dedicated=batch:NoSchedule",
    ])
    .await;
    let path = format!("/scale-sets/{SUB}/{RG}/w/node-registration");
    let a = o.control("GET", &path, None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body,
        json!({"labels": {"tier": "silver", "workload": null}, "taints": ["dedicated=batch:NoSchedule"]})
    );
    let tags = json!({"tags": {
        "k8s.io_cluster-autoscaler_node-template_label_tier": "gold",
        "k8s.io_cluster-autoscaler_node-template_label_workload": "web",
        "k8s.io_cluster-autoscaler_node-template_taint_dedicated": "web:NoSchedule",
    }});
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/w/tags"),
            Some(tags),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = o
        .arm("PATCH", &vmss("w"), Some(json!({"sku": {"capacity": 1}})))
        .await;
    assert!(a.status < 300, "{}", a.body);
    let first = o.await_nodes("w", 1, 1).await.remove(0);
    assert_eq!(first["metadata"]["labels"]["tier"], "silver");
    assert_eq!(first["metadata"]["labels"]["workload"], Value::Null);
    let mut t = taints(&first);
    t.sort();
    assert_eq!(t, [("dedicated".to_string(), "NoSchedule".to_string())]);
    assert_eq!(first["spec"]["taints"][0]["value"], "batch");

    // At run time: another label; the first Node keeps what it registered with.
    let a = o
        .control(
            "POST",
            &path,
            Some(json!({"labels": {"tier": "bronze", "topology.kubernetes.io/zone": "westeurope-3"}})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body,
        json!({"labels": {"tier": "bronze", "topology.kubernetes.io/zone": "westeurope-3"}, "taints": []})
    );
    let a = o
        .arm("PATCH", &vmss("w"), Some(json!({"sku": {"capacity": 2}})))
        .await;
    assert!(a.status < 300, "{}", a.body);
    let nodes = o.await_nodes("w", 2, 2).await;
    let label = |n: &Value, k: &str| n["metadata"]["labels"][k].as_str().map(str::to_string);
    let mut seen: Vec<(Option<String>, Option<String>, Option<String>)> = nodes
        .iter()
        .map(|n| {
            (
                label(n, "tier"),
                label(n, "workload"),
                label(n, "topology.kubernetes.io/zone"),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                Some("bronze".into()),
                Some("web".into()),
                Some("westeurope-3".into())
            ),
            (Some("silver".into()), None, Some("0".into())),
        ]
    );

    // Lifted: the tags' labels again.
    let a = o.control("POST", &path, Some(json!({}))).await;
    assert_eq!(a.body, json!({"labels": {}, "taints": []}));
    for (body, names) in [
        (json!({"labels": {"Bad Key": "x"}}), "Bad Key"),
        (json!({"labels": {"tier": "not ok!"}}), "not ok!"),
        (
            json!({"taints": ["dedicated=batch:Sometimes"]}),
            "Sometimes",
        ),
        (json!({"nodeLabels": {}}), "nodeLabels"),
    ] {
        let a = o.control("POST", &path, Some(body)).await;
        assert_eq!(a.status, 400, "{}", a.body);
        assert!(error_message(&a).contains(names), "{}", a.body);
    }
    let a = o
        .control(
            "POST",
            &format!("/scale-sets/{SUB}/{RG}/nope/node-registration"),
            Some(json!({"labels": {"tier": "x"}})),
        )
        .await;
    assert_eq!(a.status, 404, "{}", a.body);

    // A bad flag is named.
    let out = Command::new(BIN)
        .args([
            "emulator",
            "--simulate-cluster",
            "--node-taint",
            "w:dedicated=batch:Sometimes",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Sometimes"), "{err}");
}
