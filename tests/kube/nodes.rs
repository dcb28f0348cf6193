//! The node writes of scale-down against the emulator's Kubernetes API, through kube-rs: our
//! `NoSchedule` taint and the cordon by a merge patch guarded by `resourceVersion` (a stale one
//! is a 409 and changes nothing), an untaint that removes only our taint and survives a rival
//! write between its read and its patch, evictions (refused by a PodDisruptionBudget, done, of a
//! pod already gone, of a pod recreated under the same name), and the startup cleanup of leftover
//! taints.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::Method;
use parking_lot::Mutex;
use serde_json::{json, Value};
use vmss_capacity_controller::emulator::kube::{KubeState, PodSeed};
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::kube::nodes::{
    remove_leftover_taints, EvictOutcome, FreshNode, KubeNodeActions, NodeActions, NodeWriteError,
    DELETION_CANDIDATE_TAINT, TO_BE_DELETED_TAINT, UNTAINT_ATTEMPTS, WAS_CORDONED_ANNOTATION,
};
use vmss_capacity_controller::pods::record::NodeRecord;

const NS: &str = "default";

async fn emulator() -> (EmulatorHandle, KubeState, kube::Config) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kube_state = handle.kube().expect("kubernetes side on");
    let file = kube::config::Kubeconfig::from_yaml(&handle.kubeconfig().expect("kubeconfig"))
        .expect("kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("kubeconfig is usable");
    // As the controller's client (cli.rs): kube-rs' default retry would repeat a budget's 429
    // with exponential backoff for minutes before `evict` saw it.
    config.default_retry = false;
    (handle, kube_state, config)
}

async fn actions() -> (EmulatorHandle, KubeState, KubeNodeActions) {
    let (handle, kube, config) = emulator().await;
    let client = kube::Client::try_from(config).expect("client");
    (handle, kube, KubeNodeActions::new(client))
}

type Rival = Arc<dyn Fn(&KubeState) + Send + Sync>;

/// A client that lets `rival` write, through the emulator's own API, just before each of the
/// first `times` node PATCHes it sends: the write lands between our GET and our PATCH.
fn client_with_rival(
    config: kube::Config,
    kube: &KubeState,
    rival: Rival,
    times: usize,
    patches: Arc<AtomicUsize>,
) -> kube::Client {
    let kube = kube.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if req.method() == Method::PATCH && req.uri().path().starts_with("/api/v1/nodes/") {
            let n = patches.fetch_add(1, Ordering::SeqCst);
            if n < times {
                rival(&kube);
            }
        }
        req
    });
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&layer)
        .build()
}

fn add_node(kube: &KubeState, name: &str, taints: Value, unschedulable: bool) -> Value {
    kube.create(
        "v1",
        "nodes",
        "",
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }),
    )
    .expect("node created")
}

fn node(kube: &KubeState, name: &str) -> Value {
    kube.get("v1", "nodes", "", name).expect("the node exists")
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion")
        .to_string()
}

fn taint_keys(node: &Value) -> Vec<String> {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn cordoned(node: &Value) -> bool {
    node.pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn other_taint() -> Value {
    json!({"key": "sku", "value": "gpu", "effect": "NoSchedule"})
}

fn ours() -> Value {
    json!({"key": TO_BE_DELETED_TAINT, "value": "1700000000", "effect": "NoSchedule"})
}

#[tokio::test]
async fn tainting_sets_our_no_schedule_taint_and_cordons_keeping_other_taints() {
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([other_taint()]), false);
    actions.taint("n1", &rv(&read)).await.expect("tainted");

    let after = node(&kube, "n1");
    assert!(cordoned(&after));
    assert_eq!(taint_keys(&after), ["sku", TO_BE_DELETED_TAINT]);
    let taint = &after["spec"]["taints"][1];
    assert_eq!(taint["effect"], "NoSchedule");
    let since: u64 = taint["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("the value is unix seconds, as cluster-autoscaler writes it");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert!(since <= now && now - since < 60, "value {since}, now {now}");
}

#[tokio::test]
async fn tainting_a_node_already_tainted_and_cordoned_writes_nothing() {
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([ours()]), true);
    actions.taint("n1", &rv(&read)).await.expect("idempotent");
    assert_eq!(rv(&node(&kube, "n1")), rv(&read), "no write");
}

#[tokio::test]
async fn tainting_with_a_stale_resource_version_is_a_conflict_and_changes_nothing() {
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([]), false);
    // Somebody changes the node after we read it.
    let mut changed = node(&kube, "n1");
    changed["metadata"]["labels"]["rival"] = json!("yes");
    let changed = kube
        .update("v1", "nodes", "", changed)
        .expect("rival writes");

    let err = actions.taint("n1", &rv(&read)).await.expect_err("stale");
    assert_eq!(err, NodeWriteError::Conflict("n1".into()));
    assert!(err.to_string().contains("n1"), "{err}");
    let after = node(&kube, "n1");
    assert_eq!(rv(&after), rv(&changed), "nothing written");
    assert!(taint_keys(&after).is_empty());
    assert!(!cordoned(&after));
}

#[tokio::test]
async fn tainting_a_missing_node_is_not_found() {
    let (_h, _kube, actions) = actions().await;
    assert_eq!(
        actions.taint("nope", "1").await,
        Err(NodeWriteError::NotFound("nope".into()))
    );
}

#[tokio::test]
async fn tainting_without_a_resource_version_is_refused_before_any_write() {
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([]), false);
    let err = actions.taint("n1", "").await.expect_err("blind write");
    assert!(
        matches!(&err, NodeWriteError::Other(m) if m.contains("n1")),
        "{err}"
    );
    assert_eq!(rv(&node(&kube, "n1")), rv(&read));
}

#[tokio::test]
async fn untaint_removes_only_our_taint_and_uncordons() {
    let (_h, kube, actions) = actions().await;
    add_node(&kube, "n1", json!([other_taint(), ours()]), true);
    actions.untaint("n1").await.expect("untainted");
    let after = node(&kube, "n1");
    assert_eq!(taint_keys(&after), ["sku"]);
    assert_eq!(after["spec"]["taints"][0], other_taint());
    assert!(!cordoned(&after));
}

#[tokio::test]
async fn a_node_an_operator_cordoned_before_scale_down_tainted_it_stays_cordoned_after_the_untaint()
{
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([other_taint()]), true);
    actions.taint("n1", &rv(&read)).await.expect("tainted");
    let tainted = node(&kube, "n1");
    assert_eq!(taint_keys(&tainted), ["sku", TO_BE_DELETED_TAINT]);
    assert_eq!(
        tainted["metadata"]["annotations"][WAS_CORDONED_ANNOTATION],
        "true"
    );
    actions.untaint("n1").await.expect("untainted");
    let after = node(&kube, "n1");
    assert_eq!(taint_keys(&after), ["sku"]);
    assert!(cordoned(&after), "the operator's cordon was cleared");
    assert!(
        after["metadata"]["annotations"]
            .get(WAS_CORDONED_ANNOTATION)
            .is_none(),
        "{after}"
    );

    // A node we cordoned ourselves is uncordoned again.
    let read = add_node(&kube, "n2", json!([]), false);
    actions.taint("n2", &rv(&read)).await.expect("tainted");
    assert!(cordoned(&node(&kube, "n2")));
    actions.untaint("n2").await.expect("untainted");
    assert!(!cordoned(&node(&kube, "n2")));
}

#[tokio::test]
async fn the_fresh_look_reads_the_node_and_only_the_unfinished_pods_bound_to_it_from_the_server() {
    let (_h, kube, actions) = actions().await;
    add_node(&kube, "n1", json!([ours()]), true);
    add_node(&kube, "n2", json!([]), false);
    for (name, node, phase) in [
        ("a", "n1", "Running"),
        ("b", "n1", "Succeeded"),
        ("c", "n2", "Running"),
    ] {
        kube.add_pod(&PodSeed {
            namespace: NS.into(),
            name: name.into(),
            node: Some(node.into()),
            labels: Default::default(),
            phase: phase.into(),
            ready: true,
        })
        .expect("pod");
    }
    let FreshNode { node: found, pods } = actions.fresh("n1").await.expect("read");
    let found = found.expect("the node exists");
    assert_eq!(found.name, "n1");
    assert!(found.taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a"], "only n1's unfinished pods");
    let gone = actions.fresh("nope").await.expect("a 404 is an answer");
    assert!(gone.node.is_none() && gone.pods.is_empty());
    let mut all: Vec<String> = actions
        .list_nodes()
        .await
        .expect("listed")
        .into_iter()
        .map(|n: NodeRecord| n.name)
        .collect();
    all.sort();
    assert_eq!(all, ["n1", "n2"]);
}

#[tokio::test]
async fn untaint_leaves_a_node_without_our_taint_alone_even_if_cordoned_by_someone_else() {
    let (_h, kube, actions) = actions().await;
    let read = add_node(&kube, "n1", json!([other_taint()]), true);
    actions.untaint("n1").await.expect("nothing to do");
    let after = node(&kube, "n1");
    assert_eq!(rv(&after), rv(&read), "no write");
    assert!(cordoned(&after), "not our cordon");
}

#[tokio::test]
async fn untaint_survives_a_concurrent_change_by_rereading_after_the_409() {
    let (_h, kube, config) = emulator().await;
    add_node(&kube, "n1", json!([ours()]), true);
    // Between our GET and our first PATCH, a rival adds its own taint and a label.
    let rival: Rival = Arc::new(|k: &KubeState| {
        let mut n = k.get("v1", "nodes", "", "n1").expect("rival reads");
        n["metadata"]["labels"]["rival"] = json!("yes");
        n["spec"]["taints"]
            .as_array_mut()
            .expect("taints")
            .push(json!({"key": "rival", "effect": "PreferNoSchedule"}));
        k.update("v1", "nodes", "", n).expect("rival writes");
    });
    let patches = Arc::new(AtomicUsize::new(0));
    let client = client_with_rival(config, &kube, rival, 1, patches.clone());
    KubeNodeActions::new(client)
        .untaint("n1")
        .await
        .expect("untainted on the second try");

    assert_eq!(patches.load(Ordering::SeqCst), 2, "a 409, then a patch");
    let after = node(&kube, "n1");
    assert_eq!(taint_keys(&after), ["rival"], "the rival's taint is kept");
    assert_eq!(after["metadata"]["labels"]["rival"], "yes");
    assert!(!cordoned(&after));
}

#[tokio::test]
async fn the_soft_taint_goes_on_and_off_keeping_a_rivals_taint_written_between_the_read_and_the_patch(
) {
    let (_h, kube, config) = emulator().await;
    add_node(&kube, "n1", json!([other_taint()]), false);
    let rival: Rival = Arc::new(|k: &KubeState| {
        let mut n = k.get("v1", "nodes", "", "n1").expect("rival reads");
        n["spec"]["taints"]
            .as_array_mut()
            .expect("taints")
            .push(json!({"key": "rival", "effect": "NoSchedule"}));
        k.update("v1", "nodes", "", n).expect("rival writes");
    });
    let patches = Arc::new(AtomicUsize::new(0));
    let actions = KubeNodeActions::new(client_with_rival(config, &kube, rival, 1, patches.clone()));
    assert_eq!(actions.soft_taint("n1", true).await, Ok(true));
    assert_eq!(patches.load(Ordering::SeqCst), 2, "a 409, then a patch");
    let after = node(&kube, "n1");
    assert_eq!(
        taint_keys(&after),
        ["sku", "rival", DELETION_CANDIDATE_TAINT],
        "nothing of the rival's lost"
    );
    let soft = &after["spec"]["taints"][2];
    assert_eq!(soft["effect"], "PreferNoSchedule");
    assert!(!cordoned(&after), "a soft taint does not cordon");
    let written = rv(&after);
    assert_eq!(actions.soft_taint("n1", true).await, Ok(false));
    assert_eq!(rv(&node(&kube, "n1")), written, "already on: not written");
    assert_eq!(actions.soft_taint("n1", false).await, Ok(true));
    assert_eq!(taint_keys(&node(&kube, "n1")), ["sku", "rival"]);
    assert_eq!(actions.soft_taint("n1", false).await, Ok(false));
    assert_eq!(
        actions.soft_taint("gone", true).await,
        Err(NodeWriteError::NotFound("gone".into()))
    );
}

#[tokio::test]
async fn a_node_being_removed_gets_no_soft_taint() {
    let (_h, kube, actions) = actions().await;
    add_node(&kube, "n1", json!([ours()]), true);
    let before = rv(&node(&kube, "n1"));
    assert_eq!(actions.soft_taint("n1", true).await, Ok(false));
    assert_eq!(rv(&node(&kube, "n1")), before);
}

#[tokio::test]
async fn untaint_gives_up_with_a_conflict_after_a_bounded_number_of_attempts() {
    let (_h, kube, config) = emulator().await;
    add_node(&kube, "n1", json!([ours()]), true);
    let bumps = Arc::new(Mutex::new(0u32));
    let counter = bumps.clone();
    let rival: Rival = Arc::new(move |k: &KubeState| {
        let mut c = counter.lock();
        *c += 1;
        let mut n = k.get("v1", "nodes", "", "n1").expect("rival reads");
        n["metadata"]["labels"]["rival"] = json!(c.to_string());
        k.update("v1", "nodes", "", n).expect("rival writes");
    });
    let patches = Arc::new(AtomicUsize::new(0));
    let client = client_with_rival(config, &kube, rival, usize::MAX, patches.clone());
    let err = KubeNodeActions::new(client)
        .untaint("n1")
        .await
        .expect_err("always beaten");
    assert_eq!(err, NodeWriteError::Conflict("n1".into()));
    assert_eq!(patches.load(Ordering::SeqCst), UNTAINT_ATTEMPTS as usize);
    assert_eq!(
        taint_keys(&node(&kube, "n1")),
        [TO_BE_DELETED_TAINT],
        "nothing of ours was lost or half-written"
    );
}

fn add_pod(kube: &KubeState, name: &str, app: &str) -> Value {
    kube.add_pod(&PodSeed {
        namespace: NS.into(),
        name: name.into(),
        node: Some("n1".into()),
        labels: [("app".to_string(), app.to_string())].into(),
        phase: "Running".into(),
        ready: true,
    })
    .expect("pod created")
}

fn pod_exists(kube: &KubeState, name: &str) -> bool {
    kube.get("v1", "pods", NS, name).is_ok()
}

#[tokio::test]
async fn an_eviction_blocked_by_a_budget_with_no_disruption_left_is_blocked() {
    let (_h, kube, actions) = actions().await;
    kube.create(
        "policy/v1",
        "poddisruptionbudgets",
        NS,
        json!({
            "metadata": {"name": "keep-all"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "db"}}},
        }),
    )
    .expect("PDB created");
    let pod = add_pod(&kube, "db-0", "db");
    let uid = pod["metadata"]["uid"].as_str().map(str::to_string);

    match actions.evict(NS, "db-0", uid.as_deref()).await {
        EvictOutcome::Blocked(why) => {
            assert!(why.contains("disruption budget"), "{why}");
            assert!(why.contains("keep-all"), "the budget is named: {why}");
        }
        other => panic!("want Blocked, got {other:?}"),
    }
    assert!(pod_exists(&kube, "db-0"));
}

#[tokio::test]
async fn an_evicted_pod_is_gone() {
    let (_h, kube, actions) = actions().await;
    let pod = add_pod(&kube, "web-0", "web");
    let uid = pod["metadata"]["uid"].as_str().map(str::to_string);
    assert_eq!(
        actions.evict(NS, "web-0", uid.as_deref()).await,
        EvictOutcome::Evicted
    );
    assert!(!pod_exists(&kube, "web-0"));
    // Evicting it again: already gone.
    assert_eq!(
        actions.evict(NS, "web-0", uid.as_deref()).await,
        EvictOutcome::Gone
    );
}

#[tokio::test]
async fn evicting_a_missing_pod_is_gone() {
    let (_h, _kube, actions) = actions().await;
    assert_eq!(actions.evict(NS, "nope", None).await, EvictOutcome::Gone);
}

#[tokio::test]
async fn a_pod_recreated_under_the_same_name_is_not_evicted_and_the_one_meant_is_gone() {
    let (_h, kube, actions) = actions().await;
    let old = add_pod(&kube, "web-0", "web");
    let old_uid = old["metadata"]["uid"].as_str().map(str::to_string);
    kube.delete("v1", "pods", NS, "web-0").expect("deleted");
    let new = add_pod(&kube, "web-0", "web");
    assert_ne!(new["metadata"]["uid"], old["metadata"]["uid"]);

    assert_eq!(
        actions.evict(NS, "web-0", old_uid.as_deref()).await,
        EvictOutcome::Gone
    );
    assert!(pod_exists(&kube, "web-0"), "the new pod is left alone");
}

#[tokio::test]
async fn remove_leftover_taints_clears_our_taint_from_every_node_and_leaves_others_alone() {
    let (_h, kube, actions) = actions().await;
    add_node(&kube, "a", json!([ours()]), true);
    add_node(&kube, "b", json!([other_taint(), ours()]), true);
    let c = add_node(&kube, "c", json!([other_taint()]), true);
    let d = add_node(&kube, "d", json!([]), false);

    assert_eq!(
        actions.tainted_nodes().await.expect("listed"),
        ["a".to_string(), "b".to_string()]
    );
    assert_eq!(remove_leftover_taints(&actions).await, Ok(2));

    let a = node(&kube, "a");
    assert!(taint_keys(&a).is_empty() && !cordoned(&a));
    let b = node(&kube, "b");
    assert_eq!(taint_keys(&b), ["sku"]);
    assert!(!cordoned(&b));
    assert_eq!(rv(&node(&kube, "c")), rv(&c), "c is not ours: untouched");
    assert_eq!(rv(&node(&kube, "d")), rv(&d));
    assert!(actions.tainted_nodes().await.expect("listed").is_empty());
    assert_eq!(remove_leftover_taints(&actions).await, Ok(0));
}

/// Nodes in memory: `untaint` answers from a script, and records what it was asked.
struct Scripted {
    nodes: Vec<String>,
    answers: Mutex<Vec<(String, Result<(), NodeWriteError>)>>,
    asked: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl NodeActions for Scripted {
    async fn taint(&self, _: &str, _: &str) -> Result<(), NodeWriteError> {
        unreachable!("the cleanup never taints")
    }
    async fn untaint(&self, node: &str) -> Result<(), NodeWriteError> {
        self.asked.lock().push(node.to_string());
        self.answers
            .lock()
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, r)| r.clone())
            .unwrap_or(Ok(()))
    }
    async fn soft_taint(&self, _: &str, _: bool) -> Result<bool, NodeWriteError> {
        unreachable!("the cleanup never soft-taints")
    }
    async fn evict(&self, _: &str, _: &str, _: Option<&str>) -> EvictOutcome {
        unreachable!("the cleanup never evicts")
    }
    async fn tainted_nodes(&self) -> Result<Vec<String>, NodeWriteError> {
        Ok(self.nodes.clone())
    }
    async fn fresh(&self, _: &str) -> Result<FreshNode, NodeWriteError> {
        unreachable!("the cleanup never reads a node fresh")
    }
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, NodeWriteError> {
        unreachable!("the cleanup never lists nodes")
    }
    async fn annotate_pod(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &std::collections::BTreeMap<String, Option<String>>,
    ) -> vmss_capacity_controller::kube::nodes::AnnotateOutcome {
        unreachable!("the cleanup never annotates a pod")
    }
}

#[tokio::test]
async fn the_cleanup_skips_nodes_gone_meanwhile_and_tries_every_node_before_failing() {
    let actions = Scripted {
        nodes: ["a", "b", "c", "d"].map(String::from).to_vec(),
        answers: Mutex::new(vec![
            ("b".into(), Err(NodeWriteError::NotFound("b".into()))),
            ("c".into(), Err(NodeWriteError::Other("node c: 503".into()))),
        ]),
        asked: Mutex::new(Vec::new()),
    };
    assert_eq!(
        remove_leftover_taints(&actions).await,
        Err(NodeWriteError::Other("node c: 503".into()))
    );
    assert_eq!(*actions.asked.lock(), ["a", "b", "c", "d"]);

    let fine = Scripted {
        nodes: ["a", "b"].map(String::from).to_vec(),
        answers: Mutex::new(vec![(
            "b".into(),
            Err(NodeWriteError::NotFound("b".into())),
        )]),
        asked: Mutex::new(Vec::new()),
    };
    assert_eq!(remove_leftover_taints(&fine).await, Ok(1));
}

/// The emulator's refusals, body and all, as kube-apiserver 1.20.2 answered the same requests
/// (measured with curl: a merge patch of a node carrying a stale `resourceVersion`, an eviction
/// whose uid precondition names another pod).
#[tokio::test]
async fn the_emulator_refuses_a_stale_node_patch_and_a_wrong_uid_eviction_as_the_real_server() {
    let (h, kube, _config) = emulator().await;
    let read = add_node(&kube, "n1", json!([]), false);
    let mut changed = node(&kube, "n1");
    changed["metadata"]["labels"]["rival"] = json!("yes");
    kube.update("v1", "nodes", "", changed)
        .expect("rival writes");
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str, ct: &str, body: Value| {
        http.request(method, format!("{}{path}", h.base_url()))
            .bearer_auth(kube.token())
            .header("content-type", ct)
            .body(body.to_string())
            .send()
    };

    let resp = send(
        reqwest::Method::PATCH,
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        json!({"metadata": {"resourceVersion": rv(&read)}, "spec": {"unschedulable": true}}),
    )
    .await
    .expect("answered");
    assert_eq!(resp.status().as_u16(), 409);
    let body: Value = resp.json().await.expect("a Status");
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(
        body["message"],
        "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(body["details"]["name"], "n1");
    assert_eq!(body["details"]["kind"], "nodes");

    let pod = add_pod(&kube, "p2", "web");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let wrong = "00000000-0000-0000-0000-000000000000";
    let resp = send(
        reqwest::Method::POST,
        "/api/v1/namespaces/default/pods/p2/eviction",
        "application/json",
        json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p2"},
               "deleteOptions": {"preconditions": {"uid": wrong}}}),
    )
    .await
    .expect("answered");
    assert_eq!(resp.status().as_u16(), 409);
    let body: Value = resp.json().await.expect("a Status");
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(
        body["message"],
        format!("Operation cannot be fulfilled on Pod \"p2\": the UID in the precondition ({wrong}) does not match the UID in record ({uid}). The object might have been deleted and then recreated")
    );
    assert_eq!(body["details"], json!({"name": "p2", "kind": "Pod"}));
    assert!(pod_exists(&kube, "p2"));
}

/// The deletion-cost hints' write: a merge patch of the pod's annotations carrying the version
/// read, so a pod changed since is a 409 and keeps the change; `None` removes an annotation.
#[tokio::test]
async fn a_pod_annotation_write_from_a_stale_read_is_a_conflict_and_changes_nothing() {
    use std::collections::BTreeMap;
    use vmss_capacity_controller::kube::nodes::AnnotateOutcome;
    let (_h, kube, actions) = actions().await;
    let read = kube
        .create(
            "v1",
            "pods",
            NS,
            json!({"metadata": {"name": "web-1", "annotations": {"team": "a"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
        )
        .expect("pod created");
    let cost = |v: Option<&str>| {
        BTreeMap::from([(
            "controller.kubernetes.io/pod-deletion-cost".to_string(),
            v.map(str::to_string),
        )])
    };
    assert_eq!(
        actions
            .annotate_pod(NS, "web-1", &rv(&read), &cost(Some("-2")))
            .await,
        AnnotateOutcome::Written
    );
    let now = kube.get("v1", "pods", NS, "web-1").expect("the pod");
    assert_eq!(
        now["metadata"]["annotations"],
        json!({"team": "a", "controller.kubernetes.io/pod-deletion-cost": "-2"}),
        "merged with what was there"
    );
    // The version read before that write is stale now.
    assert_eq!(
        actions
            .annotate_pod(NS, "web-1", &rv(&read), &cost(None))
            .await,
        AnnotateOutcome::Conflict
    );
    assert_eq!(
        kube.get("v1", "pods", NS, "web-1").expect("the pod"),
        now,
        "a conflict writes nothing"
    );
    assert_eq!(
        actions
            .annotate_pod(NS, "web-1", &rv(&now), &cost(None))
            .await,
        AnnotateOutcome::Written
    );
    assert_eq!(
        kube.get("v1", "pods", NS, "web-1").expect("the pod")["metadata"]["annotations"],
        json!({"team": "a"})
    );
    assert_eq!(
        actions.annotate_pod(NS, "gone", "1", &cost(None)).await,
        AnnotateOutcome::Gone
    );
}
