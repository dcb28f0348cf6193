//! The node writes of scale-down against a real Kubernetes API server (kube-apiserver 1.20 from
//! `../shared/kube-apiserver/`, started by `.ci/real-apiserver.sh`): the server, not a fake,
//! refuses a taint from a stale read with 409, keeps another writer's taint through our untaint,
//! refuses an eviction with 429 under a budget with no disruption left (1.20 has no `policy/v1`
//! Eviction: `evict` falls back to `policy/v1beta1`), answers 404 for a missing pod and 409 for
//! a uid precondition naming another pod.
//!
//! Ignored by plain `cargo test` (it needs the server); `.ci/real-apiserver.sh` runs it with
//! `--ignored` and `KUBECONFIG` set.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use vmss_capacity_controller::kube::nodes::{
    remove_leftover_taints, EvictOutcome, KubeNodeActions, NodeActions, NodeWriteError,
    DELETION_CANDIDATE_TAINT, TO_BE_DELETED_TAINT,
};

const NS: &str = "default";

async fn client() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let file = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

fn unique(test: &str) -> String {
    format!("{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

async fn raw_post(client: &kube::Client, path: &str, body: Value) -> String {
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .expect("request");
    client.request_text(req).await.expect("POST accepted")
}

async fn create_node(client: &kube::Client, name: &str, taints: Value) -> Node {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"taints": taints},
    }))
    .expect("node");
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node created")
}

async fn delete_node(client: &kube::Client, name: &str) {
    let _ = Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// The taint keys, less the server's own (admission adds `node.kubernetes.io/not-ready` to a
/// new node, and no kubelet runs to clear it).
fn keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .map(|t| t.key.clone())
                .filter(|k| !k.starts_with("node.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default()
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// A running, ready pod bound to `node` (no scheduler or kubelet runs: bind it, set its status).
async fn running_pod(client: &kube::Client, name: &str, node: &str, app: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    raw_post(
        client,
        &format!("/api/v1/namespaces/{NS}/pods/{name}/binding"),
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"kind": "Node", "name": node}}),
    )
    .await;
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .expect("status set")
}

#[tokio::test]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn the_real_server_refuses_a_stale_taint_and_keeps_others_taints_through_an_untaint() {
    let client = client().await;
    let actions = KubeNodeActions::new(client.clone());
    let name = unique("taint");
    let read = create_node(
        &client,
        &name,
        json!([{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]),
    )
    .await;
    let stale = read.metadata.resource_version.clone().expect("rv");
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"rival": "yes"}}})),
        )
        .await
        .expect("rival writes");

    assert_eq!(
        actions.taint(&name, &stale).await,
        Err(NodeWriteError::Conflict(name.clone()))
    );
    let fresh = nodes.get(&name).await.expect("node");
    assert_eq!(keys(&fresh), ["sku"], "nothing written");

    let rv = fresh.metadata.resource_version.clone().expect("rv");
    actions.taint(&name, &rv).await.expect("tainted");
    let tainted = nodes.get(&name).await.expect("node");
    assert_eq!(keys(&tainted), ["sku", TO_BE_DELETED_TAINT]);
    assert!(cordoned(&tainted));
    assert!(actions
        .tainted_nodes()
        .await
        .expect("listed")
        .contains(&name));

    assert!(remove_leftover_taints(&actions).await.expect("cleared") >= 1);
    let after = nodes.get(&name).await.expect("node");
    assert_eq!(keys(&after), ["sku"]);
    assert!(!cordoned(&after));
    delete_node(&client, &name).await;
}

#[tokio::test]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn the_real_server_takes_the_soft_taint_on_and_off_keeping_others_taints() {
    let client = client().await;
    let actions = KubeNodeActions::new(client.clone());
    let name = unique("soft");
    create_node(
        &client,
        &name,
        json!([{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]),
    )
    .await;
    let nodes = Api::<Node>::all(client.clone());
    assert_eq!(actions.soft_taint(&name, true).await, Ok(true));
    let soft = nodes.get(&name).await.expect("node");
    assert_eq!(keys(&soft), ["sku", DELETION_CANDIDATE_TAINT]);
    let taint = soft
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| ts.iter().find(|t| t.key == DELETION_CANDIDATE_TAINT))
        .expect("the soft taint")
        .clone();
    assert_eq!(taint.effect, "PreferNoSchedule");
    assert!(!cordoned(&soft), "a soft taint does not cordon");
    assert_eq!(
        actions.soft_taint(&name, true).await,
        Ok(false),
        "already on"
    );
    assert_eq!(actions.soft_taint(&name, false).await, Ok(true));
    assert_eq!(keys(&nodes.get(&name).await.expect("node")), ["sku"]);
    delete_node(&client, &name).await;
    assert_eq!(
        actions.soft_taint(&name, true).await,
        Err(NodeWriteError::NotFound(name.clone()))
    );
}

#[tokio::test]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn the_real_server_blocks_an_eviction_under_a_budget_and_answers_missing_and_recreated_pods()
{
    let client = client().await;
    let actions = KubeNodeActions::new(client.clone());
    let node = unique("evict");
    create_node(&client, &node, json!([])).await;
    let app = unique("app");
    let pdb = unique("keep-all");
    // 1.20 serves PodDisruptionBudgets as policy/v1beta1 only.
    raw_post(
        &client,
        &format!("/apis/policy/v1beta1/namespaces/{NS}/poddisruptionbudgets"),
        json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
               "metadata": {"name": pdb},
               "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}}),
    )
    .await;
    let guarded = unique("guarded");
    let pod = running_pod(&client, &guarded, &node, &app).await;
    let uid = pod.metadata.uid.clone();

    match actions.evict(NS, &guarded, uid.as_deref()).await {
        EvictOutcome::Blocked(why) => assert!(why.contains("disruption budget"), "{why}"),
        other => panic!("want Blocked, got {other:?}"),
    }
    assert_eq!(
        actions.evict(NS, &unique("missing"), None).await,
        EvictOutcome::Gone
    );
    let free = unique("free");
    let free_pod = running_pod(&client, &free, &node, "free").await;
    assert_eq!(
        actions
            .evict(NS, &free, Some("00000000-0000-0000-0000-000000000000"))
            .await,
        EvictOutcome::Gone,
        "a uid naming another pod: the one meant is gone"
    );
    assert_eq!(
        actions
            .evict(NS, &free, free_pod.metadata.uid.as_deref())
            .await,
        EvictOutcome::Evicted
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let _ = pods.delete(&guarded, &DeleteParams::default()).await;
    let _ = pods.delete(&free, &DeleteParams::default()).await;
    let req = http::Request::delete(format!(
        "/apis/policy/v1beta1/namespaces/{NS}/poddisruptionbudgets/{pdb}"
    ))
    .body(Vec::new())
    .expect("request");
    let _ = client.request_text(req).await;
    delete_node(&client, &node).await;
}
