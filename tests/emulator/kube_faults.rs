//! The emulator's Kubernetes side, what `kcheck` added: the fault switch (every Kubernetes request
//! answers 503 while it is on, the control endpoints keep working), PodDisruptionBudget status as
//! the real server's disruption controller fills it, an eviction naming another pod refused as
//! the real server refuses it, and the watch log tests read resumes and 410s from.

use std::time::Duration;

use serde_json::{json, Value};
use vmss_capacity_controller::emulator::kube::{KubeSettings, PodSeed, WatchStart};
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};

const TOKEN: &str = "test-token";

async fn start() -> EmulatorHandle {
    EmulatorBuilder::new()
        .kube_settings(KubeSettings {
            token: TOKEN.to_string(),
            bookmark_interval: Duration::from_secs(60),
            ..KubeSettings::default()
        })
        .start()
        .await
        .expect("emulator starts")
}

async fn send(
    h: &EmulatorHandle,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", h.base_url()))
        .bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request is answered");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_fault_switch_answers_every_kubernetes_request_with_503_until_it_is_turned_off() {
    let h = start().await;
    let (s, _) = send(
        &h,
        reqwest::Method::GET,
        "/api/v1/namespaces/default/configmaps",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let (s, v) = send(
        &h,
        reqwest::Method::POST,
        "/_emulator/kube/unavailable",
        Some(json!({"on": true})),
    )
    .await;
    assert_eq!((s, &v["unavailable"]), (200, &json!(true)));
    for path in [
        "/api/v1/namespaces/default/configmaps",
        "/version",
        "/readyz",
        "/apis",
        "/api/v1/nodes?watch=1",
    ] {
        let (s, v) = send(&h, reqwest::Method::GET, path, None).await;
        assert_eq!(s, 503, "{path}");
        assert_eq!(v["kind"], "Status", "{path}");
        assert_eq!(v["reason"], "ServiceUnavailable", "{path}");
        assert_eq!(v["code"], 503, "{path}");
    }
    let (s, v) = send(&h, reqwest::Method::GET, "/_emulator/kube/state", None).await;
    assert_eq!(
        (s, &v["unavailable"]),
        (200, &json!(true)),
        "the control side still answers"
    );
    let (s, _) = send(
        &h,
        reqwest::Method::POST,
        "/_emulator/kube/unavailable",
        Some(json!({"on": false})),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = send(
        &h,
        reqwest::Method::GET,
        "/api/v1/namespaces/default/configmaps",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = send(
        &h,
        reqwest::Method::POST,
        "/_emulator/kube/unavailable",
        Some(json!({"of": 1})),
    )
    .await;
    assert_eq!(s, 400, "a body without `on` is refused");
}

#[tokio::test]
async fn a_pod_disruption_budget_reads_back_with_the_status_the_disruption_controller_would_write()
{
    let h = start().await;
    let k = h.kube().expect("kubernetes side");
    for (name, ready) in [("a", true), ("b", true), ("c", false)] {
        k.add_pod(&PodSeed {
            namespace: "default".into(),
            name: name.into(),
            node: Some("n1".into()),
            labels: [("app".to_string(), "web".to_string())].into(),
            phase: "Running".into(),
            ready,
        })
        .expect("pod seeded");
    }
    let pdb = json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
    let (s, _) = send(
        &h,
        reqwest::Method::POST,
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
        Some(pdb),
    )
    .await;
    assert_eq!(s, 201);
    let (s, v) = send(
        &h,
        reqwest::Method::GET,
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets/web",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let st = &v["status"];
    assert_eq!(
        (
            &st["expectedPods"],
            &st["currentHealthy"],
            &st["desiredHealthy"],
            &st["disruptionsAllowed"]
        ),
        (&json!(3), &json!(2), &json!(1), &json!(1))
    );
    assert_eq!(st["observedGeneration"], v["metadata"]["generation"]);
    assert_eq!(st["conditions"][0]["type"], "DisruptionAllowed");
    assert_eq!(st["conditions"][0]["status"], "True");
    // One healthy pod evicted: the list shows the budget exhausted.
    let (s, _) = send(&h, reqwest::Method::POST, "/api/v1/namespaces/default/pods/a/eviction",
        Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": "default"}}))).await;
    assert_eq!(s, 201);
    let (_, list) = send(
        &h,
        reqwest::Method::GET,
        "/apis/policy/v1/poddisruptionbudgets",
        None,
    )
    .await;
    let st = &list["items"][0]["status"];
    assert_eq!(
        (&st["currentHealthy"], &st["disruptionsAllowed"]),
        (&json!(1), &json!(0))
    );
    assert_eq!(st["conditions"][0]["reason"], "InsufficientPods");
}

#[tokio::test]
async fn an_eviction_naming_another_pod_is_a_bad_request() {
    let h = start().await;
    let k = h.kube().expect("kubernetes side");
    k.add_pod(&PodSeed {
        namespace: "default".into(),
        name: "a".into(),
        node: None,
        labels: Default::default(),
        phase: "Running".into(),
        ready: true,
    })
    .expect("pod seeded");
    let (s, v) = send(
        &h,
        reqwest::Method::POST,
        "/api/v1/namespaces/default/pods/a/eviction",
        Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "b"}})),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        v["message"],
        "name in URL does not match name in Eviction object"
    );
    assert!(
        k.get("v1", "pods", "default", "a").is_ok(),
        "the pod is still there"
    );
}

#[tokio::test]
async fn the_watch_log_tells_fresh_watches_resumes_and_refusals_apart() {
    let h = start().await;
    let k = h.kube().expect("kubernetes side");
    let rv = k.resource_version();
    let (s, _) = send(
        &h,
        reqwest::Method::GET,
        "/api/v1/configmaps?watch=1&timeoutSeconds=1",
        None,
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = send(
        &h,
        reqwest::Method::GET,
        &format!("/api/v1/configmaps?watch=1&timeoutSeconds=1&resourceVersion={rv}"),
        None,
    )
    .await;
    assert_eq!(s, 200);
    k.create(
        "v1",
        "configmaps",
        "default",
        json!({"metadata": {"name": "x"}}),
    )
    .expect("created");
    k.compact();
    let (s, _) = send(
        &h,
        reqwest::Method::GET,
        &format!("/api/v1/configmaps?watch=1&resourceVersion={rv}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "a watch answers 200 and then an ERROR event");
    let log = k.watch_starts();
    let plural = "configmaps".to_string();
    assert_eq!(
        log,
        [
            WatchStart {
                plural: plural.clone(),
                from: None,
                gone: false
            },
            WatchStart {
                plural: plural.clone(),
                from: Some(rv),
                gone: false
            },
            WatchStart {
                plural,
                from: Some(rv),
                gone: true
            },
        ]
    );
}

#[tokio::test]
async fn an_admitted_eviction_marks_the_pod_a_disruption_target_before_it_deletes_it() {
    let h = start().await;
    let k = h.kube().expect("kubernetes side");
    k.add_pod(&PodSeed {
        namespace: "default".into(),
        name: "a".into(),
        node: Some("n1".into()),
        labels: [("app".to_string(), "web".to_string())].into(),
        phase: "Running".into(),
        ready: true,
    })
    .expect("pod seeded");
    let mut changes = k.subscribe_changes();
    let (s, _) = send(&h, reqwest::Method::POST, "/api/v1/namespaces/default/pods/a/eviction",
        Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": "default"}}))).await;
    assert_eq!(s, 201);
    let mut seen = Vec::new();
    while let Ok(c) = changes.try_recv() {
        if c.object.pointer("/metadata/name") == Some(&json!("a")) {
            seen.push((c.event.as_str().to_string(), c.object.clone()));
        }
    }
    let events: Vec<&str> = seen.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(events, ["MODIFIED", "DELETED"], "{seen:?}");
    let marked = seen[0].1["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .expect("a DisruptionTarget condition");
    assert_eq!(marked["status"], "True");
    assert_eq!(marked["reason"], "EvictionByEvictionAPI");
    assert_eq!(marked["message"], "Eviction API: evicting");
}
