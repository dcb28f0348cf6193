//! The emulator's Kubernetes side over HTTP: one cluster-wide resourceVersion, 409 Conflict and
//! AlreadyExists with the real server's `Status` bodies, namespaces required, list paging and
//! selectors, watch events with bookmarks and 410 Gone, merge and strategic merge patch,
//! eviction refused by a PodDisruptionBudget, `Table` answers with kube-apiserver's columns, the
//! field selectors it supports per type, and the fields the Go API server always sends.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use vmss_capacity_controller::emulator::kube::{KubeSettings, PodSeed};
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};

const TOKEN: &str = "test-token";

struct Kube {
    handle: EmulatorHandle,
    http: reqwest::Client,
}

impl Kube {
    async fn start() -> Self {
        Self::with(KubeSettings {
            token: TOKEN.to_string(),
            bookmark_interval: Duration::from_millis(100),
            ..KubeSettings::default()
        })
        .await
    }

    async fn with(settings: KubeSettings) -> Self {
        let handle = EmulatorBuilder::new()
            .kube_settings(settings)
            .start()
            .await
            .expect("emulator starts");
        Kube {
            handle,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.handle.base_url())
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Value)>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path)).bearer_auth(TOKEN);
        if let Some((ct, b)) = body {
            req = req.header("content-type", ct).body(b.to_string());
        }
        let resp = req.send().await.expect("request is answered");
        let status = resp.status().as_u16();
        let v = resp.json().await.unwrap_or(Value::Null);
        (status, v)
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(
            reqwest::Method::POST,
            path,
            Some(("application/json", body)),
        )
        .await
    }
    async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::PUT, path, Some(("application/json", body)))
            .await
    }
    async fn patch(&self, path: &str, ct: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::PATCH, path, Some((ct, body)))
            .await
    }
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a resourceVersion")
}

const CM: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn every_write_of_any_type_gets_a_higher_cluster_wide_resource_version() {
    let k = Kube::start().await;
    let (s1, cm) = k
        .post(CM, json!({"metadata": {"name": "a"}, "data": {"x": "1"}}))
        .await;
    let (s2, lease) = k
        .post(
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}),
        )
        .await;
    let (s3, cm2) = k
        .put(
            &format!("{CM}/a"),
            json!({"metadata": {"name": "a"}, "data": {"x": "2"}}),
        )
        .await;
    assert_eq!((s1, s2, s3), (201, 201, 200));
    assert!(rv(&cm) < rv(&lease) && rv(&lease) < rv(&cm2));
    assert_eq!(cm2["metadata"]["uid"], cm["metadata"]["uid"]);
    assert!(cm["metadata"]["creationTimestamp"].is_string());
    assert_eq!(lease["apiVersion"], "coordination.k8s.io/v1");
}

#[tokio::test]
async fn an_update_with_a_stale_resource_version_is_refused_with_the_real_conflict_status() {
    let k = Kube::start().await;
    let (_, cm) = k
        .post(CM, json!({"metadata": {"name": "a"}, "data": {"x": "1"}}))
        .await;
    let read = cm["metadata"]["resourceVersion"].clone();
    let (ok, _) = k
        .put(
            &format!("{CM}/a"),
            json!({"metadata": {"name": "a", "resourceVersion": read}, "data": {"x": "2"}}),
        )
        .await;
    assert_eq!(ok, 200);
    let (code, status) = k
        .put(
            &format!("{CM}/a"),
            json!({"metadata": {"name": "a", "resourceVersion": read}, "data": {"x": "3"}}),
        )
        .await;
    assert_eq!(code, 409);
    assert_eq!(
        status,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again",
            "reason": "Conflict", "details": {"name": "a", "kind": "configmaps"}, "code": 409
        })
    );
}

#[tokio::test]
async fn creating_an_existing_name_is_already_exists_and_a_missing_namespace_is_not_found() {
    let k = Kube::start().await;
    k.post(CM, json!({"metadata": {"name": "a"}})).await;
    let (code, status) = k.post(CM, json!({"metadata": {"name": "a"}})).await;
    assert_eq!(code, 409);
    assert_eq!(status["reason"], "AlreadyExists");
    assert_eq!(status["message"], "configmaps \"a\" already exists");
    let (code, status) = k
        .post(
            "/apis/coordination.k8s.io/v1/namespaces/nope/leases",
            json!({"metadata": {"name": "l"}}),
        )
        .await;
    assert_eq!(code, 404);
    assert_eq!(
        status,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "namespaces \"nope\" not found", "reason": "NotFound",
            "details": {"name": "nope", "kind": "namespaces"}, "code": 404
        })
    );
    let (code, status) = k
        .get("/apis/coordination.k8s.io/v1/namespaces/default/leases/x")
        .await;
    assert_eq!(code, 404);
    assert_eq!(
        status["message"],
        "leases.coordination.k8s.io \"x\" not found"
    );
    assert_eq!(status["details"]["group"], "coordination.k8s.io");
}

#[tokio::test]
async fn a_request_without_the_bearer_token_is_unauthorized() {
    let k = Kube::start().await;
    let resp = k
        .http
        .get(k.url("/api/v1/pods"))
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn a_protobuf_body_is_refused_with_415_naming_json_and_nothing_is_created() {
    // kubectl 1.32 and later send protobuf for typed creates (`kubectl create namespace`).
    let k = Kube::start().await;
    let resp = k
        .http
        .post(k.url(CM))
        .bearer_auth(TOKEN)
        .header("content-type", "application/vnd.kubernetes.protobuf")
        .body(b"k8s\0\x0a\x0f\x0a\x02v1\x12\x09ConfigMap".to_vec())
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status().as_u16(), 415);
    let v: Value = resp.json().await.expect("a Status");
    assert_eq!(v["reason"], "UnsupportedMediaType");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("application/json"), "{message}");
    assert!(
        message.contains("application/vnd.kubernetes.protobuf"),
        "{message}"
    );
    let (status, list) = k.get(CM).await;
    assert_eq!(
        (status, list["items"].as_array().map(Vec::len)),
        (200, Some(0))
    );
}

#[tokio::test]
async fn openapi_v2_is_served_as_protobuf_to_kubectl_and_as_json_otherwise() {
    // kubectl 1.27 validates `replace` against /openapi/v2, and any kubectl falls back to it.
    let k = Kube::start().await;
    let openapi = |accept: &'static str| {
        k.http
            .get(k.url("/openapi/v2"))
            .bearer_auth(TOKEN)
            .header("accept", accept)
            .send()
    };
    let resp = openapi("application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
        .await
        .expect("answered");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/octet-stream");
    let bytes = resp.bytes().await.unwrap();
    assert_eq!(&bytes[..5], b"\x0a\x032.0", "field 1, swagger: \"2.0\"");
    let (status, doc) = k.get("/openapi/v2").await;
    assert_eq!((status, &doc["swagger"]), (200, &json!("2.0")));
    // A client that takes protobuf but prefers JSON gets JSON.
    let resp =
        openapi("application/json, application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
            .await
            .expect("answered");
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(doc["definitions"], json!({}));
}

#[tokio::test]
async fn lists_page_with_limit_and_continue_and_filter_pods_by_field_and_label() {
    let k = Kube::start().await;
    let kube = k.handle.kube().expect("kubernetes side on");
    for i in 0..5 {
        kube.add_pod(&PodSeed {
            namespace: "default".into(),
            name: format!("p{i}"),
            node: Some(if i % 2 == 0 { "n0" } else { "n1" }.into()),
            labels: BTreeMap::from([(
                "app".to_string(),
                if i < 3 { "a" } else { "b" }.to_string(),
            )]),
            phase: if i == 4 { "Succeeded" } else { "Running" }.into(),
            ready: true,
        })
        .expect("pod added");
    }
    let mut names = Vec::new();
    let mut path = "/api/v1/namespaces/default/pods?limit=2".to_string();
    let mut pages = 0;
    loop {
        let (code, page) = k.get(&path).await;
        assert_eq!(code, 200);
        assert_eq!(page["kind"], "PodList");
        pages += 1;
        for item in page["items"].as_array().expect("items") {
            names.push(item["metadata"]["name"].as_str().expect("name").to_string());
        }
        match page["metadata"]["continue"].as_str() {
            Some(c) => {
                path = format!(
                    "/api/v1/namespaces/default/pods?limit=2&continue={}",
                    urlencode(c)
                )
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    let (_, on_n0) = k
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn0,status.phase!%3DSucceeded")
        .await;
    let n: Vec<&str> = on_n0["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(n, ["p0", "p2"]);
    let (_, app_b) = k.get("/api/v1/pods?labelSelector=app%3Db").await;
    assert_eq!(app_b["items"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn a_paged_list_across_namespaces_returns_every_object_once_when_one_namespace_prefixes_another(
) {
    // "team" sorts before "team-a" as a namespace, while "team/..." sorts after "team-a/..." as
    // text ('-' < '/'): pages must continue in the store's order, not the token's text order.
    let k = Kube::start().await;
    let kube = k.handle.kube().expect("kubernetes side on");
    for ns in ["team", "team-a", "teamb"] {
        kube.create("v1", "namespaces", "", json!({"metadata": {"name": ns}}))
            .expect("namespace");
        for i in 0..3 {
            kube.add_pod(&PodSeed {
                namespace: ns.into(),
                name: format!("p{i}"),
                node: None,
                labels: BTreeMap::new(),
                phase: "Pending".into(),
                ready: false,
            })
            .expect("pod added");
        }
    }
    let mut seen = Vec::new();
    let mut path = "/api/v1/pods?limit=2".to_string();
    for _ in 0..20 {
        let (code, page) = k.get(&path).await;
        assert_eq!(code, 200, "{page}");
        for item in page["items"].as_array().expect("items") {
            seen.push(format!(
                "{}/{}",
                item["metadata"]["namespace"].as_str().unwrap_or(""),
                item["metadata"]["name"].as_str().unwrap_or("")
            ));
        }
        match page["metadata"]["continue"].as_str() {
            Some(c) => path = format!("/api/v1/pods?limit=2&continue={}", urlencode(c)),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "team/p0",
            "team/p1",
            "team/p2",
            "team-a/p0",
            "team-a/p1",
            "team-a/p2",
            "teamb/p0",
            "teamb/p1",
            "teamb/p2"
        ]
    );
    // One namespace alone, paged too.
    let (_, first) = k.get("/api/v1/namespaces/team/pods?limit=2").await;
    let c = first["metadata"]["continue"]
        .as_str()
        .expect("a second page");
    let (_, rest) = k
        .get(&format!(
            "/api/v1/namespaces/team/pods?limit=2&continue={}",
            urlencode(c)
        ))
        .await;
    assert_eq!(rest["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(rest["items"][0]["metadata"]["name"], "p2");
}

#[tokio::test]
async fn a_cluster_scoped_object_written_with_a_namespace_keeps_none_and_paging_still_returns_every_node(
) {
    let k = Kube::start().await;
    let kube = k.handle.kube().expect("kubernetes side on");
    for i in 0..4 {
        kube.create(
            "v1",
            "nodes",
            "",
            json!({"metadata": {"name": format!("n{i}")}}),
        )
        .expect("node");
    }
    let (code, n1) = k.get("/api/v1/nodes/n1").await;
    assert_eq!(code, 200);
    let mut with_ns = n1.clone();
    with_ns["metadata"]["namespace"] = json!("x");
    let (code, put) = k
        .send(
            reqwest::Method::PUT,
            "/api/v1/nodes/n1",
            Some(("application/json", with_ns)),
        )
        .await;
    assert_eq!(code, 200, "{put}");
    assert!(put["metadata"].get("namespace").is_none(), "{put}");
    let mut names = Vec::new();
    let mut path = "/api/v1/nodes?limit=1".to_string();
    for _ in 0..10 {
        let (_, page) = k.get(&path).await;
        for item in page["items"].as_array().expect("items") {
            names.push(item["metadata"]["name"].as_str().unwrap_or("").to_string());
        }
        match page["metadata"]["continue"].as_str() {
            Some(c) => path = format!("/api/v1/nodes?limit=1&continue={}", urlencode(c)),
            None => break,
        }
    }
    assert_eq!(names, ["n0", "n1", "n2", "n3"]);
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

async fn read_events(resp: reqwest::Response, until: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut resp = resp;
    let mut buf = Vec::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !until(&events) {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("events in time")
            .expect("stream ok");
        let Some(chunk) = chunk else { break };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            events.push(serde_json::from_slice(&line).expect("a JSON event per line"));
        }
    }
    events
}

#[tokio::test]
async fn a_watch_from_a_resource_version_streams_changes_and_bookmarks() {
    let k = Kube::start().await;
    let (_, a) = k.post(CM, json!({"metadata": {"name": "a"}})).await;
    let from = rv(&a);
    k.post(CM, json!({"metadata": {"name": "b"}})).await;
    let resp = k
        .http
        .get(k.url(&format!(
            "{CM}?watch=1&resourceVersion={from}&allowWatchBookmarks=true"
        )))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("watch starts");
    assert_eq!(resp.status().as_u16(), 200);
    let writer = {
        let http = k.http.clone();
        let url = k.url(&format!("{CM}/a"));
        tokio::spawn(async move {
            let _ = http
                .patch(url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/merge-patch+json")
                .body(json!({"data": {"k": "v"}}).to_string())
                .send()
                .await;
        })
    };
    let events = read_events(resp, |evs| {
        evs.iter().any(|e| e["type"] == "MODIFIED") && evs.iter().any(|e| e["type"] == "BOOKMARK")
    })
    .await;
    writer.await.expect("writer ran");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "b");
    let modified = events
        .iter()
        .find(|e| e["type"] == "MODIFIED")
        .expect("a MODIFIED event");
    assert_eq!(modified["object"]["data"]["k"], "v");
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(bookmark["object"]["kind"], "ConfigMap");
    assert!(rv(&bookmark["object"]) >= rv(&modified["object"]));
}

#[tokio::test]
async fn a_watch_from_a_version_older_than_the_history_gets_an_error_event_with_410_expired() {
    let k = Kube::with(KubeSettings {
        token: TOKEN.to_string(),
        history: 3,
        ..KubeSettings::default()
    })
    .await;
    let (_, first) = k.post(CM, json!({"metadata": {"name": "a"}})).await;
    for i in 0..5 {
        k.post(CM, json!({"metadata": {"name": format!("x{i}")}}))
            .await;
    }
    let resp = k
        .http
        .get(k.url(&format!("{CM}?watch=true&resourceVersion={}", rv(&first))))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("watch answered");
    let events = read_events(resp, |evs| !evs.is_empty()).await;
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert!(status["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("too old resource version: ")));
}

#[tokio::test]
async fn a_watch_without_a_version_starts_with_the_current_objects_and_ends_at_its_timeout() {
    let k = Kube::start().await;
    k.post(CM, json!({"metadata": {"name": "a"}})).await;
    let resp = k
        .http
        .get(k.url(&format!("{CM}?watch=1&timeoutSeconds=1")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("watch answered");
    let events = read_events(resp, |_| false).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ADDED");
}

#[tokio::test]
async fn merge_and_strategic_merge_patches_change_labels_taints_and_unschedulable() {
    let k = Kube::start().await;
    let kube = k.handle.kube().expect("kubernetes side on");
    kube.add_node(
        "n0",
        &BTreeMap::from([("pool".to_string(), "a".to_string())]),
        true,
    )
    .expect("node added");
    let (code, node) = k
        .patch(
            "/api/v1/nodes/n0",
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"pool": null, "x": "1"}}}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(node["metadata"]["labels"], json!({"x": "1"}));
    let (code, node) = k
        .patch(
            "/api/v1/nodes/n0",
            "application/strategic-merge-patch+json",
            json!({"spec": {"unschedulable": true, "taints": [{"key": "t", "effect": "NoSchedule"}]}}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(node["spec"]["unschedulable"], true);
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "t", "effect": "NoSchedule"}])
    );
    // The main resource's writes keep the status; the status subresource changes it.
    assert_eq!(node["status"]["conditions"][0]["type"], "Ready");
    let (code, stale) = k
        .patch(
            "/api/v1/nodes/n0",
            "application/merge-patch+json",
            json!({"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": false}}),
        )
        .await;
    assert_eq!((code, stale["reason"].as_str()), (409, Some("Conflict")));
}

#[tokio::test]
async fn an_eviction_is_refused_with_429_while_the_budget_has_no_disruption_left() {
    let k = Kube::start().await;
    let kube = k.handle.kube().expect("kubernetes side on");
    for i in 0..2 {
        kube.add_pod(&PodSeed {
            namespace: "default".into(),
            name: format!("web-{i}"),
            node: Some("n0".into()),
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            phase: "Running".into(),
            ready: true,
        })
        .expect("pod added");
    }
    let (code, _) = k
        .post(
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
            json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .await;
    assert_eq!(code, 201);
    let eviction = |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}});
    let (code, ok) = k
        .post(
            "/api/v1/namespaces/default/pods/web-0/eviction",
            eviction("web-0"),
        )
        .await;
    assert_eq!((code, ok["status"].as_str()), (201, Some("Success")));
    let (code, refused) = k
        .post(
            "/api/v1/namespaces/default/pods/web-1/eviction",
            eviction("web-1"),
        )
        .await;
    assert_eq!(code, 429);
    assert_eq!(refused["reason"], "TooManyRequests");
    assert_eq!(
        refused["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        refused["details"]["causes"][0]["message"],
        "The disruption budget web needs 1 healthy pods and has 1 currently"
    );
    let (code, _) = k.get("/api/v1/namespaces/default/pods/web-1").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn a_pod_is_bound_to_a_node_once_through_the_binding_subresource() {
    let k = Kube::start().await;
    let (code, pod) = k
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(code, 201);
    assert_eq!(pod["status"]["phase"], "Pending");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n0"}});
    let (code, _) = k
        .post("/api/v1/namespaces/default/pods/p/binding", binding.clone())
        .await;
    assert_eq!(code, 201);
    let (_, pod) = k.get("/api/v1/namespaces/default/pods/p").await;
    assert_eq!(pod["spec"]["nodeName"], "n0");
    let (code, _) = k
        .post("/api/v1/namespaces/default/pods/p/binding", binding)
        .await;
    assert_eq!(code, 409);
}

#[tokio::test]
async fn discovery_lists_the_served_groups_and_resources() {
    let k = Kube::start().await;
    let (_, groups) = k.get("/apis").await;
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for g in ["coordination.k8s.io", "events.k8s.io", "policy", "apps"] {
        assert!(names.contains(&g), "{g} in {names:?}");
    }
    let (_, core) = k.get("/api/v1").await;
    let res: Vec<&str> = core["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for r in [
        "pods",
        "pods/status",
        "pods/binding",
        "pods/eviction",
        "nodes",
        "namespaces",
        "configmaps",
        "events",
    ] {
        assert!(res.contains(&r), "{r} in {res:?}");
    }
    let resp = k
        .http
        .get(k.url("/version"))
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn the_kubeconfig_names_the_server_and_the_token() {
    let handle = EmulatorBuilder::new()
        .tls(true)
        .kubernetes(true)
        .start()
        .await
        .expect("starts");
    let cfg = handle.kubeconfig().expect("a kubeconfig");
    assert!(cfg.contains(&format!("server: {}", handle.base_url())));
    assert!(cfg.contains("certificate-authority-data: "));
    let token = handle.kube().expect("kubernetes side on").token();
    assert!(cfg.contains(&format!("token: {token}")));
    let without = EmulatorBuilder::new().start().await.expect("starts");
    assert!(without.kubeconfig().is_none());
}

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

impl Kube {
    /// GET with kubectl's `Accept`, asking for a `Table`.
    async fn table(&self, path: &str) -> Value {
        let resp = self
            .http
            .get(self.url(path))
            .bearer_auth(TOKEN)
            .header("accept", TABLE)
            .send()
            .await
            .expect("request is answered");
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        resp.json().await.expect("a JSON table")
    }
}

/// `(name, priority)` of every column, as kubectl reads them (priority 1: only with `-o wide`).
fn columns(table: &Value) -> Vec<(String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .expect("columnDefinitions")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["priority"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

fn named(cols: &[(&str, i64)]) -> Vec<(String, i64)> {
    cols.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

/// The cells of the row whose first cell (or last, for events) is `name`.
fn row<'a>(table: &'a Value, name: &str) -> &'a [Value] {
    table["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["cells"].as_array().expect("cells").as_slice())
        .find(|cells| cells.first() == Some(&json!(name)) || cells.last() == Some(&json!(name)))
        .unwrap_or_else(|| panic!("no row for {name} in {table}"))
}

#[tokio::test]
async fn a_table_of_pods_has_kube_apiservers_columns_wide_ones_included_and_each_pods_status() {
    let k = Kube::start().await;
    let (code, _) = k
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "web"}, "spec": {"nodeName": "n0",
                "containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "pause"}]}}),
        )
        .await;
    assert_eq!(code, 201);
    let (code, _) = k
        .patch(
            "/api/v1/namespaces/default/pods/web/status",
            "application/merge-patch+json",
            json!({"status": {"phase": "Running", "podIP": "10.244.0.7", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "image": "nginx", "imageID": "", "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 1, "image": "pause", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
        )
        .await;
    assert_eq!(code, 200);
    k.post(
        "/api/v1/namespaces/default/pods",
        json!({"metadata": {"name": "pending"}, "spec": {"containers": [{"name": "a", "image": "nginx"}]}}),
    )
    .await;

    let t = k.table("/api/v1/namespaces/default/pods").await;
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        columns(&t),
        named(&[
            ("Name", 0),
            ("Ready", 0),
            ("Status", 0),
            ("Restarts", 0),
            ("Age", 0),
            ("IP", 1),
            ("Node", 1),
            ("Nominated Node", 1),
            ("Readiness Gates", 1)
        ])
    );
    let web = row(&t, "web");
    assert_eq!(
        &web[..4],
        &[
            json!("web"),
            json!("1/2"),
            json!("CrashLoopBackOff"),
            json!(3)
        ]
    );
    assert_eq!(
        &web[5..],
        &[
            json!("10.244.0.7"),
            json!("n0"),
            json!("<none>"),
            json!("<none>")
        ]
    );
    assert!(
        web[4].as_str().is_some_and(|a| a.ends_with('s')),
        "age {}",
        web[4]
    );
    let pending = row(&t, "pending");
    assert_eq!(
        &pending[..4],
        &[json!("pending"), json!("0/1"), json!("Pending"), json!(0)]
    );
    assert_eq!(pending[5], "<none>");
    assert_eq!(pending[6], "<none>");
    let first = &t["rows"][0]["object"];
    assert_eq!(first["kind"], "PartialObjectMetadata");
    assert!(first["metadata"]["uid"].is_string());
}

#[tokio::test]
async fn a_table_of_nodes_shows_status_roles_version_addresses_os_kernel_and_runtime() {
    let k = Kube::start().await;
    k.post(
        "/api/v1/nodes",
        json!({"metadata": {"name": "n0", "labels": {"node-role.kubernetes.io/agent": "", "kubernetes.io/role": "spot"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n0"}, {"type": "InternalIP", "address": "10.224.0.4"}],
                "nodeInfo": {"kubeletVersion": "v1.30.6", "osImage": "Ubuntu 22.04.5 LTS", "kernelVersion": "5.15.0-1074-azure",
                    "containerRuntimeVersion": "containerd://1.7.22-1"}}}),
    )
    .await;
    k.post("/api/v1/nodes", json!({"metadata": {"name": "bare"}}))
        .await;
    let t = k.table("/api/v1/nodes").await;
    assert_eq!(
        columns(&t),
        named(&[
            ("Name", 0),
            ("Status", 0),
            ("Roles", 0),
            ("Age", 0),
            ("Version", 0),
            ("Internal-IP", 1),
            ("External-IP", 1),
            ("OS-Image", 1),
            ("Kernel-Version", 1),
            ("Container-Runtime", 1)
        ])
    );
    let n0 = row(&t, "n0");
    assert_eq!(
        &n0[..3],
        &[
            json!("n0"),
            json!("Ready,SchedulingDisabled"),
            json!("agent,spot")
        ]
    );
    assert_eq!(
        &n0[4..],
        &[
            json!("v1.30.6"),
            json!("10.224.0.4"),
            json!("<none>"),
            json!("Ubuntu 22.04.5 LTS"),
            json!("5.15.0-1074-azure"),
            json!("containerd://1.7.22-1")
        ]
    );
    let bare = row(&t, "bare");
    assert_eq!(
        &bare[..3],
        &[json!("bare"), json!("Unknown"), json!("<none>")]
    );
    assert_eq!(
        &bare[4..],
        &[
            json!(""),
            json!("<none>"),
            json!("<none>"),
            json!("<unknown>"),
            json!("<unknown>"),
            json!("<unknown>")
        ]
    );
}

#[tokio::test]
async fn a_table_of_deployments_counts_ready_replicas_and_names_containers_images_and_selector() {
    let k = Kube::start().await;
    let (code, _) = k
        .post(
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 3,
                "selector": {"matchLabels": {"app": "web", "tier": "front"}},
                "template": {"metadata": {"labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25"}, {"name": "side", "image": "busybox"}]}}}}),
        )
        .await;
    assert_eq!(code, 201);
    k.patch(
        "/apis/apps/v1/namespaces/default/deployments/web/status",
        "application/merge-patch+json",
        json!({"status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}),
    )
    .await;
    let t = k
        .table("/apis/apps/v1/namespaces/default/deployments")
        .await;
    assert_eq!(
        columns(&t),
        named(&[
            ("Name", 0),
            ("Ready", 0),
            ("Up-to-date", 0),
            ("Available", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1)
        ])
    );
    let web = row(&t, "web");
    assert_eq!(&web[..4], &[json!("web"), json!("2/3"), json!(3), json!(2)]);
    assert_eq!(
        &web[5..],
        &[
            json!("nginx,side"),
            json!("nginx:1.25,busybox"),
            json!("app=web,tier=front")
        ]
    );
}

#[tokio::test]
async fn a_table_of_events_shows_last_seen_type_reason_object_and_message_whichever_api_posted_it()
{
    let k = Kube::start().await;
    let (code, _) = k
        .post(
            "/apis/events.k8s.io/v1/namespaces/default/events",
            json!({"metadata": {"name": "up"}, "eventTime": "2026-01-01T00:00:00.000000Z",
                "regarding": {"kind": "Pod", "name": "web", "namespace": "default", "apiVersion": "v1"},
                "reason": "TriggeredScaleUp", "note": "pod triggered scale-up: [{pool 1->2 (max: 5)}]", "type": "Normal",
                "action": "ScaleUp", "reportingController": "vmss-capacity-controller", "reportingInstance": "replica-a"}),
        )
        .await;
    assert_eq!(code, 201);
    let (code, _) = k
        .post(
            "/api/v1/namespaces/default/events",
            json!({"metadata": {"name": "core"}, "involvedObject": {"kind": "Node", "name": "n0"},
                "reason": "NodeNotReady", "message": " gone ", "type": "Warning", "count": 4,
                "source": {"component": "node-controller"}}),
        )
        .await;
    assert_eq!(code, 201);
    let wanted = named(&[
        ("Last Seen", 0),
        ("Type", 0),
        ("Reason", 0),
        ("Object", 0),
        ("Subobject", 1),
        ("Source", 1),
        ("Message", 0),
        ("First Seen", 1),
        ("Count", 1),
        ("Name", 1),
    ]);
    for path in [
        "/api/v1/namespaces/default/events",
        "/apis/events.k8s.io/v1/namespaces/default/events",
    ] {
        let t = k.table(path).await;
        assert_eq!(columns(&t), wanted, "{path}");
        let up = row(&t, "up");
        assert_eq!(
            &up[1..7],
            &[
                json!("Normal"),
                json!("TriggeredScaleUp"),
                json!("pod/web"),
                json!(""),
                json!("vmss-capacity-controller, replica-a"),
                json!("pod triggered scale-up: [{pool 1->2 (max: 5)}]")
            ],
            "{path}"
        );
        assert_eq!(up[8], 1, "{path}: a single event counts 1");
        assert_eq!(up[0], up[7], "{path}: last seen is first seen");
        let core = row(&t, "core");
        assert_eq!(
            &core[..9],
            &[
                json!("<unknown>"),
                json!("Warning"),
                json!("NodeNotReady"),
                json!("node/n0"),
                json!(""),
                json!("node-controller"),
                json!("gone"),
                json!("<unknown>"),
                json!(4)
            ],
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_table_of_one_object_has_one_row_and_include_object_decides_what_each_row_carries() {
    let k = Kube::start().await;
    k.post(
        CM,
        json!({"metadata": {"name": "a"}, "data": {"x": "1", "y": "2"}}),
    )
    .await;
    let one = k.table(&format!("{CM}/a")).await;
    assert_eq!(
        columns(&one),
        named(&[("Name", 0), ("Data", 0), ("Age", 0)])
    );
    assert_eq!(one["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(one["rows"][0]["cells"][1], 2);
    assert!(one["metadata"]["resourceVersion"].is_string());
    let whole = k.table(&format!("{CM}?includeObject=Object")).await;
    assert_eq!(whole["rows"][0]["object"]["kind"], "ConfigMap");
    assert_eq!(whole["rows"][0]["object"]["data"]["x"], "1");
    let bare = k.table(&format!("{CM}?includeObject=None")).await;
    assert!(bare["rows"][0].get("object").is_none());
    // Without the Table media type, the same path answers the object itself.
    let (_, plain) = k.get(&format!("{CM}/a")).await;
    assert_eq!(plain["kind"], "ConfigMap");
}

#[tokio::test]
async fn events_are_selected_by_their_involved_object_as_kubectl_describe_asks_and_by_reason_type_and_source(
) {
    let k = Kube::start().await;
    let (_, pod) = k
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "a", "image": "nginx"}]}}),
        )
        .await;
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    k.post(
        "/apis/events.k8s.io/v1/namespaces/default/events",
        json!({"metadata": {"name": "up"}, "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "Pod", "name": "web", "namespace": "default", "uid": uid, "apiVersion": "v1"},
            "reason": "TriggeredScaleUp", "note": "scale-up", "type": "Normal", "action": "ScaleUp",
            "reportingController": "vmss-capacity-controller", "reportingInstance": "a"}),
    )
    .await;
    k.post(
        "/api/v1/namespaces/default/events",
        json!({"metadata": {"name": "other"}, "involvedObject": {"kind": "Pod", "name": "db", "namespace": "default"},
            "reason": "NotTriggerScaleUp", "type": "Warning", "source": {"component": "vmss-capacity-controller"}}),
    )
    .await;
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|e| e["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    };
    // kubectl describe pod's own query.
    let describe = format!(
        "/api/v1/namespaces/default/events?fieldSelector={}",
        urlencode(&format!("involvedObject.name=web,involvedObject.namespace=default,involvedObject.uid={uid},involvedObject.kind=Pod"))
    );
    let (code, found) = k.get(&describe).await;
    assert_eq!(code, 200, "{found}");
    assert_eq!(names(&found), ["up"]);
    for (selector, want) in [
        ("reason=NotTriggerScaleUp", vec!["other"]),
        ("type!=Normal", vec!["other"]),
        ("source=vmss-capacity-controller", vec!["other"]),
        ("reportingComponent=vmss-capacity-controller", vec!["up"]),
        ("involvedObject.apiVersion=v1", vec!["up"]),
        ("involvedObject.fieldPath=", vec!["other", "up"]),
    ] {
        let (code, v) = k
            .get(&format!(
                "/api/v1/namespaces/default/events?fieldSelector={}",
                urlencode(selector)
            ))
            .await;
        assert_eq!(code, 200, "{selector}: {v}");
        assert_eq!(names(&v), want, "{selector}");
    }
    // The events.k8s.io view selects by its own names, and refuses the core ones.
    let (code, v) = k
        .get(&format!(
            "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector={}",
            urlencode("regarding.name=web,reportingController=vmss-capacity-controller")
        ))
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(names(&v), ["up"]);
    let (code, v) = k
        .get("/apis/events.k8s.io/v1/events?fieldSelector=involvedObject.name%3Dweb")
        .await;
    assert_eq!(code, 400);
    assert_eq!(
        v["message"],
        "field label not supported: involvedObject.name"
    );
}

#[tokio::test]
async fn pods_are_selected_by_every_field_label_kube_apiserver_supports_and_other_fields_are_refused(
) {
    let k = Kube::start().await;
    k.post(
        "/api/v1/namespaces/default/pods",
        json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n0", "serviceAccountName": "robot",
            "restartPolicy": "Never", "schedulerName": "custom", "containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    k.patch(
        "/api/v1/namespaces/default/pods/a/status",
        "application/merge-patch+json",
        json!({"status": {"phase": "Running", "podIP": "10.244.1.2", "nominatedNodeName": "n1"}}),
    )
    .await;
    k.post(
        "/api/v1/namespaces/default/pods",
        json!({"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    for (selector, want) in [
        ("spec.nodeName=n0", vec!["a"]),
        ("spec.nodeName=", vec!["b"]),
        ("spec.restartPolicy=Always", vec!["b"]),
        ("spec.schedulerName=custom", vec!["a"]),
        ("spec.serviceAccountName=robot", vec!["a"]),
        ("status.phase=Pending", vec!["b"]),
        ("status.podIP=10.244.1.2", vec!["a"]),
        ("status.nominatedNodeName=n1", vec!["a"]),
        ("metadata.name=b,metadata.namespace=default", vec!["b"]),
    ] {
        let (code, v) = k
            .get(&format!(
                "/api/v1/pods?fieldSelector={}",
                urlencode(selector)
            ))
            .await;
        assert_eq!(code, 200, "{selector}: {v}");
        let names: Vec<&str> = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(names, want, "{selector}");
    }
    let (code, v) = k
        .get("/api/v1/pods?fieldSelector=spec.hostNetwork%3Dtrue")
        .await;
    assert_eq!(code, 400);
    assert_eq!(v["message"], "field label not supported: spec.hostNetwork");
    let (code, v) = k
        .get("/api/v1/namespaces/default/configmaps?fieldSelector=data%3Dx")
        .await;
    assert_eq!(code, 400);
    assert_eq!(
        v["message"],
        "\"data\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
    k.post("/api/v1/nodes", json!({"metadata": {"name": "n0"}}))
        .await;
    let (_, v) = k
        .get("/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse")
        .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn every_served_kind_reads_back_with_the_fields_the_go_api_server_always_sends() {
    let k = Kube::start().await;
    let (_, node) = k
        .post("/api/v1/nodes", json!({"metadata": {"name": "n0"}}))
        .await;
    let info = &node["status"]["nodeInfo"];
    for field in [
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeletVersion",
        "kubeProxyVersion",
        "operatingSystem",
        "architecture",
    ] {
        assert_eq!(info[field], "", "status.nodeInfo.{field} is sent empty");
    }
    assert_eq!(
        node["status"]["daemonEndpoints"],
        json!({"kubeletEndpoint": {"Port": 0}})
    );
    assert_eq!(node["spec"], json!({}));

    let (_, core) = k
        .post(
            "/api/v1/namespaces/default/events",
            json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R"}),
        )
        .await;
    for (field, value) in [
        ("source", json!({})),
        ("firstTimestamp", Value::Null),
        ("lastTimestamp", Value::Null),
        ("eventTime", Value::Null),
        ("reportingComponent", json!("")),
        ("reportingInstance", json!("")),
    ] {
        assert_eq!(core.get(field), Some(&value), "core Event {field}");
    }
    let (_, twin) = k
        .get("/apis/events.k8s.io/v1/namespaces/default/events/e")
        .await;
    assert_eq!(twin["eventTime"], Value::Null);
    assert_eq!(twin["deprecatedSource"], json!({}));
    assert_eq!(twin["regarding"]["name"], "p");
    assert!(
        twin.get("reportingController").is_none() && twin.get("reportingInstance").is_none(),
        "events.k8s.io omits its empty strings: {twin}"
    );

    let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}]}]}});
    let (_, rs) = k
        .post(
            "/apis/apps/v1/namespaces/default/replicasets",
            json!({"metadata": {"name": "rs"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template}}),
        )
        .await;
    assert_eq!(rs["status"]["replicas"], 0);
    assert_eq!(
        rs["spec"]["template"]["metadata"]["creationTimestamp"],
        Value::Null
    );
    let container = &rs["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["resources"], json!({}));
    assert_eq!(container["ports"][0]["protocol"], "TCP");
    let (_, ds) = k
        .post(
            "/apis/apps/v1/namespaces/default/daemonsets",
            json!({"metadata": {"name": "ds"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template}}),
        )
        .await;
    for field in [
        "currentNumberScheduled",
        "numberMisscheduled",
        "desiredNumberScheduled",
        "numberReady",
    ] {
        assert_eq!(ds["status"][field], 0, "DaemonSet status.{field}");
    }
    let (_, lease) = k
        .post(
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            json!({"metadata": {"name": "l"}}),
        )
        .await;
    assert_eq!(lease["spec"], json!({}));
    let (_, sc) = k
        .post(
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({"metadata": {"name": "sc"}, "provisioner": "disk.csi.azure.com"}),
        )
        .await;
    assert_eq!(
        sc["metadata"]["creationTimestamp"]
            .as_str()
            .map(|s| s.ends_with('Z')),
        Some(true)
    );
    k.post(
        "/api/v1/namespaces/default/pods",
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    let (_, pod) = k
        .patch(
            "/api/v1/namespaces/default/pods/p/status",
            "application/merge-patch+json",
            json!({"status": {"podIP": "10.244.0.9", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true}]}}),
        )
        .await;
    assert_eq!(pod["metadata"]["name"], "p");
    assert_eq!(pod["status"]["podIPs"], json!([{"ip": "10.244.0.9"}]));
    let condition = &pod["status"]["conditions"][0];
    assert!(condition.get("lastProbeTime").is_some_and(Value::is_null));
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(
        (
            &status["restartCount"],
            &status["image"],
            &status["imageID"],
            &status["state"],
            &status["lastState"]
        ),
        (&json!(0), &json!(""), &json!(""), &json!({}), &json!({}))
    );
}

#[tokio::test]
async fn a_watch_asking_for_tables_sends_one_row_tables_with_the_columns_in_the_first_only() {
    let k = Kube::start().await;
    k.post(CM, json!({"metadata": {"name": "a"}, "data": {"x": "1"}}))
        .await;
    k.post(CM, json!({"metadata": {"name": "b"}})).await;
    let resp = k
        .http
        .get(k.url(&format!("{CM}?watch=1")))
        .bearer_auth(TOKEN)
        .header("accept", TABLE)
        .send()
        .await
        .expect("watch starts");
    assert_eq!(resp.status().as_u16(), 200);
    let writer = {
        let http = k.http.clone();
        let url = k.url(&format!("{CM}/a"));
        tokio::spawn(async move {
            let _ = http
                .patch(url)
                .bearer_auth(TOKEN)
                .header("content-type", "application/merge-patch+json")
                .body(json!({"data": {"y": "2"}}).to_string())
                .send()
                .await;
        })
    };
    let events = read_events(resp, |evs| evs.iter().any(|e| e["type"] == "MODIFIED")).await;
    writer.await.expect("writer ran");
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "MODIFIED"]);
    for (i, e) in events.iter().enumerate() {
        let t = &e["object"];
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["rows"].as_array().map(Vec::len), Some(1));
        assert_eq!(t["columnDefinitions"].is_array(), i == 0, "event {i}: {t}");
    }
    assert_eq!(
        columns(&events[0]["object"]),
        named(&[("Name", 0), ("Data", 0), ("Age", 0)])
    );
    let modified = &events[2]["object"]["rows"][0];
    assert_eq!(
        &modified["cells"].as_array().expect("cells")[..2],
        &[json!("a"), json!(2)]
    );
    assert_eq!(modified["object"]["kind"], "PartialObjectMetadata");
}

#[tokio::test]
async fn workloads_and_volumes_read_back_with_the_defaults_kube_apiserver_gives_them() {
    let k = Kube::start().await;
    let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}});
    let (_, d) = k
        .post(
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template}}),
        )
        .await;
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
    assert_eq!(
        d["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
    );
    let pod_spec = &d["spec"]["template"]["spec"];
    assert_eq!(
        (
            &pod_spec["restartPolicy"],
            &pod_spec["dnsPolicy"],
            &pod_spec["schedulerName"],
            &pod_spec["terminationGracePeriodSeconds"]
        ),
        (
            &json!("Always"),
            &json!("ClusterFirst"),
            &json!("default-scheduler"),
            &json!(30)
        )
    );
    assert_eq!(pod_spec["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert!(
        pod_spec.get("tolerations").is_none() && pod_spec.get("priority").is_none(),
        "no admission plugin runs on a template: {pod_spec}"
    );
    // An update that leaves the defaulted fields out changes no spec: the generation stays.
    let mut again = json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template}});
    again["metadata"]["labels"] = json!({"x": "y"});
    let (code, updated) = k
        .put("/apis/apps/v1/namespaces/default/deployments/d", again)
        .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["metadata"]["generation"], 1);
    let (_, ds) = k
        .post(
            "/apis/apps/v1/namespaces/default/daemonsets",
            json!({"metadata": {"name": "ds"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template}}),
        )
        .await;
    assert_eq!(
        ds["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
    );
    let (_, pvc) = k
        .post(
            "/api/v1/namespaces/default/persistentvolumeclaims",
            json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    assert_eq!(pvc["spec"]["volumeMode"], "Filesystem");
    assert_eq!(pvc["status"]["phase"], "Pending");
    let (_, pv) = k
        .post(
            "/api/v1/persistentvolumes",
            json!({"metadata": {"name": "v"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}}),
        )
        .await;
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
    let (_, sc) = k
        .post(
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({"metadata": {"name": "s"}, "provisioner": "disk.csi.azure.com"}),
        )
        .await;
    assert_eq!(sc["reclaimPolicy"], "Delete");
    assert_eq!(sc["volumeBindingMode"], "Immediate");
}
