//! The emulator's Kubernetes side: a Kubernetes API served on the same listener as the ARM side
//! (paths `/api`, `/apis`, `/version`, `/openapi`), enabled with
//! [`EmulatorBuilder::kubernetes`](super::EmulatorBuilder::kubernetes). It shares only the server
//! plumbing with the ARM side.
//!
//! | module | owns |
//! |---|---|
//! | [`store`] | objects, the cluster-wide `resourceVersion`, the watch history |
//! | [`resources`] | the served types |
//! | `routes` | paths and verbs |
//! | `watch` | streaming watches, bookmarks, 410 Gone |
//! | [`patch`] | merge and strategic merge patch |
//! | `eviction` | `pods/eviction` and PodDisruptionBudgets |
//! | `discovery` | `/version`, `/api`, `/apis` documents |
//! | `openapi` | the minimal `/openapi/v3` kubectl reads |
//! | [`select`] | label and field selectors |
//! | [`shape`] | the fields the Go API server always sends |
//! | [`status`] | `Status` bodies |
//! | [`table`] | `Table` answers, the columns `kubectl get` prints |
//! | `control` | `/_emulator/kube/` |

pub(crate) mod control;
mod discovery;
pub(crate) mod eviction;
mod openapi;
pub mod patch;
pub mod resources;
mod routes;
pub mod select;
pub mod shape;
pub mod status;
pub mod store;
pub mod table;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::request::Parts;
use serde_json::{json, Value};

pub use status::KubeError;
use store::Store;

use crate::server::Reply;

/// Watch events kept for watches that resume from a `resourceVersion` (older ones get 410).
pub const DEFAULT_HISTORY: usize = 1000;
/// Interval between watch bookmarks (the real server sends one about every minute).
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// Settings of the Kubernetes side.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// The bearer token the API accepts.
    pub token: String,
    /// Watch events retained.
    pub history: usize,
    /// Interval between bookmarks on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for KubeSettings {
    fn default() -> Self {
        KubeSettings {
            token: format!("emulator-{}", uuid::Uuid::new_v4().simple()),
            history: DEFAULT_HISTORY,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
        }
    }
}

/// The Kubernetes side's state, for in-process tests: cheap to clone, all clones share it.
#[derive(Clone, Debug)]
pub struct KubeState {
    store: Arc<parking_lot::Mutex<Store>>,
    token: String,
    bookmark_interval: Duration,
    server_address: String,
    unavailable: Arc<std::sync::atomic::AtomicBool>,
    watch_log: Arc<parking_lot::Mutex<Vec<WatchStart>>>,
    /// Resources (plurals) whose WATCH answers 403, as after an RBAC change; open watches of
    /// them end when they join the set.
    forbidden: Arc<tokio::sync::watch::Sender<std::collections::HashSet<String>>>,
    /// Resources (plurals) whose LIST (and GET of the collection) answers 403.
    list_forbidden: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// Delays per resource (plural): before handling, and of the answer after handling.
    kind_delays: Arc<parking_lot::Mutex<BTreeMap<String, KindDelay>>>,
    /// Every request to the Kubernetes API, as answered (the last [`MAX_REQUEST_LOG`]).
    request_log: Arc<parking_lot::Mutex<RequestLog>>,
    /// Resources (plurals) whose watches deliver nothing, not even bookmarks, while in the set.
    stalled: Arc<tokio::sync::watch::Sender<std::collections::HashSet<String>>>,
    /// Added to every Kubernetes answer, in milliseconds (an API server queueing requests).
    latency_ms: Arc<std::sync::atomic::AtomicU64>,
    /// Every write request that reached the API (method and path), oldest first.
    write_log: Arc<parking_lot::Mutex<Vec<(String, String)>>>,
}

/// Requests kept in the Kubernetes side's request log (oldest dropped first).
pub const MAX_REQUEST_LOG: usize = 200_000;

/// Delays of one resource's answers ([`KubeState::set_kind_delay`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindDelay {
    /// Waited before the request is handled.
    pub latency: Duration,
    /// Waited after it is handled, before the answer goes.
    pub slow_answer: Duration,
}

/// The faults on one resource, as `/_emulator/kube/faults` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindFaults {
    /// LIST answers 403.
    pub forbid_list: bool,
    /// WATCH answers 403; open watches end.
    pub forbid_watch: bool,
    /// Watches stay open and send nothing.
    pub silent_watch: bool,
    /// Milliseconds waited before handling.
    pub latency_ms: u64,
    /// Milliseconds the answer is held back after handling.
    pub slow_answer_ms: u64,
}

/// One request the Kubernetes API answered (see [`KubeState::request_log`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KubeRequestRecord {
    /// Order of logging, from 1.
    pub seq: u64,
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// The query string, if any (`watch=1&resourceVersion=...`).
    pub query: Option<String>,
    /// The resource addressed (its plural), when the path names one.
    pub resource: Option<String>,
    /// Status answered (for a watch, the status it started with).
    pub status: u16,
    /// `User-Agent` as received.
    pub user_agent: Option<String>,
}

#[derive(Debug, Default)]
struct RequestLog {
    seq: u64,
    records: std::collections::VecDeque<KubeRequestRecord>,
}

/// One WATCH request the Kubernetes side answered (see [`KubeState::watch_starts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchStart {
    /// The type watched (its plural, e.g. `configmaps`).
    pub plural: String,
    /// The `resourceVersion` it resumed from (`None` or `Some(0)`: from the current state).
    pub from: Option<u64>,
    /// Whether it was refused with 410 Gone (the version was older than the history kept).
    pub gone: bool,
}

/// Whether a path belongs to the Kubernetes side.
pub(crate) fn owns_path(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    matches!(
        first,
        "api" | "apis" | "version" | "openapi" | "healthz" | "livez" | "readyz"
    )
}

/// The resource (its plural) a Kubernetes path addresses, if it names one.
pub(crate) fn resource_of(path: &str) -> Option<&'static str> {
    routes::resource_of(path)
}

fn api_version_split(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

fn find(api_version: &str, plural: &str) -> Result<&'static resources::ResourceType, KubeError> {
    let (g, v) = api_version_split(api_version);
    resources::find(g, v, plural).ok_or_else(|| {
        status::failure(
            404,
            "NotFound",
            format!("the emulator serves no {plural} in {api_version}"),
            None,
        )
    })
}

impl KubeState {
    /// A fresh cluster (namespaces `default`, `kube-system`, `kube-public`, `kube-node-lease`),
    /// served at `server_address` (`host:port`, for `/api` discovery).
    pub fn new(settings: KubeSettings, server_address: String) -> Self {
        KubeState {
            store: Arc::new(parking_lot::Mutex::new(Store::new(settings.history))),
            token: settings.token,
            bookmark_interval: settings.bookmark_interval,
            server_address,
            unavailable: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            watch_log: Arc::new(parking_lot::Mutex::new(Vec::new())),
            forbidden: Arc::new(tokio::sync::watch::Sender::new(Default::default())),
            list_forbidden: Arc::default(),
            kind_delays: Arc::default(),
            request_log: Arc::default(),
            latency_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            stalled: Arc::new(tokio::sync::watch::Sender::new(Default::default())),
            write_log: Arc::new(parking_lot::Mutex::new(Vec::new())),
        }
    }

    /// Every write request a client sent through the API (POST, PUT, PATCH, DELETE), as
    /// `(method, path)`, oldest first, whatever its answer. Writes made in process (the cluster
    /// simulation, tests' own `create`) are not requests and are not listed.
    pub fn write_requests(&self) -> Vec<(String, String)> {
        self.write_log.lock().clone()
    }

    /// The bearer token the API accepts.
    pub fn token(&self) -> String {
        self.token.clone()
    }

    /// The fault switch: while on, every Kubernetes request (discovery, `/version` and the
    /// health paths included) answers 503 ServiceUnavailable with a `Status` body, as an API
    /// server that lost etcd or sits behind a load balancer with no backend would. Watches already
    /// streaming are not cut. The control endpoints under `/_emulator/kube/` keep working.
    pub fn set_unavailable(&self, on: bool) {
        self.unavailable
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// The RBAC fault: while on for `plural` (e.g. `pods`), every LIST and WATCH of it answers
    /// 403 Forbidden as an API server does after the reader's ClusterRole lost the verb, and
    /// the watches of it already streaming end (their reconnect is then refused). Other verbs
    /// and resources are unaffected. [`KubeState::forbid_watch`] and
    /// [`KubeState::forbid_list`] take one verb each.
    pub fn forbid_reads(&self, plural: &str, on: bool) {
        self.forbid_watch(plural, on);
        self.forbid_list(plural, on);
    }

    /// The RBAC fault for the `watch` verb alone: while on, every WATCH of `plural` answers 403
    /// and its watches already streaming end; LIST answers as usual.
    pub fn forbid_watch(&self, plural: &str, on: bool) {
        self.forbidden.send_modify(|set| {
            if on {
                set.insert(plural.to_string());
            } else {
                set.remove(plural);
            }
        });
    }

    /// The RBAC fault for the `list` verb alone: while on, every LIST of `plural` answers 403.
    pub fn forbid_list(&self, plural: &str, on: bool) {
        let mut set = self.list_forbidden.lock();
        if on {
            set.insert(plural.to_string());
        } else {
            set.remove(plural);
        }
    }

    pub(crate) fn watch_forbidden(&self, plural: &str) -> bool {
        self.forbidden.borrow().contains(plural)
    }

    pub(crate) fn list_forbidden(&self, plural: &str) -> bool {
        self.list_forbidden.lock().contains(plural)
    }

    /// Whether the watches of `plural` are silent ([`KubeState::stall_watches`]).
    pub fn watches_stalled(&self, plural: &str) -> bool {
        self.stalled.borrow().contains(plural)
    }

    /// Slow answers for one resource (its plural, e.g. `pods`): every request to it waits
    /// `delay.latency` before it is handled and holds its answer back `delay.slow_answer` after
    /// (the client then receives the state as it was when handled). Zero for both turns it off.
    pub fn set_kind_delay(&self, plural: &str, delay: KindDelay) {
        let mut map = self.kind_delays.lock();
        if delay == KindDelay::default() {
            map.remove(plural);
        } else {
            map.insert(plural.to_string(), delay);
        }
    }

    /// The delays of [`KubeState::set_kind_delay`] for `plural` (zero when none).
    pub fn kind_delay(&self, plural: &str) -> KindDelay {
        self.kind_delays
            .lock()
            .get(plural)
            .copied()
            .unwrap_or_default()
    }

    /// Every fault per resource now on, by plural (for `GET /_emulator/kube/faults`).
    pub(crate) fn kind_faults(&self) -> BTreeMap<String, KindFaults> {
        let mut plurals: std::collections::BTreeSet<String> =
            self.forbidden.borrow().iter().cloned().collect();
        plurals.extend(self.list_forbidden.lock().iter().cloned());
        plurals.extend(self.stalled.borrow().iter().cloned());
        plurals.extend(self.kind_delays.lock().keys().cloned());
        plurals
            .into_iter()
            .map(|p| {
                let f = self.kind_fault(&p);
                (p, f)
            })
            .collect()
    }

    /// The faults on one resource.
    pub(crate) fn kind_fault(&self, plural: &str) -> KindFaults {
        let delay = self.kind_delay(plural);
        KindFaults {
            forbid_list: self.list_forbidden(plural),
            forbid_watch: self.watch_forbidden(plural),
            silent_watch: self.watches_stalled(plural),
            latency_ms: u64::try_from(delay.latency.as_millis()).unwrap_or(u64::MAX),
            slow_answer_ms: u64::try_from(delay.slow_answer.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Turns every fault per resource off (forbidden reads, silent watches, delays).
    pub fn clear_kind_faults(&self) {
        self.forbidden.send_modify(|s| s.clear());
        self.stalled.send_modify(|s| s.clear());
        self.list_forbidden.lock().clear();
        self.kind_delays.lock().clear();
    }

    /// Every request the Kubernetes API answered (the last 200,000), oldest first: method, path,
    /// query, status (a watch's is the status it started with), `User-Agent`.
    pub fn request_log(&self) -> Vec<KubeRequestRecord> {
        self.request_log.lock().records.iter().cloned().collect()
    }

    pub(crate) fn log_request(&self, mut rec: KubeRequestRecord) {
        let mut log = self.request_log.lock();
        log.seq += 1;
        rec.seq = log.seq;
        if log.records.len() >= MAX_REQUEST_LOG {
            log.records.pop_front();
        }
        log.records.push_back(rec);
    }

    /// The silent-stream fault: while on for `plural`, its watches (open and new) stay connected
    /// but deliver nothing, not even bookmarks, as a stuck proxy or an overloaded server would;
    /// what changed meanwhile arrives when it is turned off (or the client reconnects). LIST
    /// answers as usual.
    pub fn stall_watches(&self, plural: &str, on: bool) {
        self.stalled.send_modify(|set| {
            if on {
                set.insert(plural.to_string());
            } else {
                set.remove(plural);
            }
        });
    }

    /// Delays every Kubernetes answer by `d` (tokio clock), as an API server whose priority and
    /// fairness queues hold requests; `Duration::ZERO` turns it off.
    pub fn set_latency(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.latency_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// The delay of [`KubeState::set_latency`].
    pub fn latency(&self) -> Duration {
        Duration::from_millis(self.latency_ms.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Whether the fault switch of [`KubeState::set_unavailable`] is on.
    pub fn unavailable(&self) -> bool {
        self.unavailable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every WATCH answered so far, oldest first: tests read from it that a watch resumed from
    /// a `resourceVersion` rather than relisting, or that a resume was refused with 410.
    pub fn watch_starts(&self) -> Vec<WatchStart> {
        self.watch_log.lock().clone()
    }

    pub(crate) fn log_watch(&self, start: WatchStart) {
        self.watch_log.lock().push(start);
    }

    /// A receiver of every change from now on, in `resourceVersion` order (the stream watches
    /// are served from).
    pub fn subscribe_changes(&self) -> tokio::sync::broadcast::Receiver<Arc<store::Change>> {
        self.store.lock().subscribe()
    }

    /// Runs `f` on the store under its lock (the cluster simulation's writes, all in one step).
    pub(crate) fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self.store.lock())
    }

    /// The current cluster-wide `resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        self.store.lock().resource_version()
    }

    /// Forgets the watch history, as an etcd compaction would: a watch or a continue token
    /// from an earlier version then gets 410 Gone.
    pub fn compact(&self) {
        self.store.lock().compact();
    }

    /// Creates an object, e.g. `create("v1", "pods", "default", pod)` (`""` namespace for
    /// cluster-scoped types). Unlike the API, a pod keeps the status it is given.
    pub fn create(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, KubeError> {
        let rt = find(api_version, plural)?;
        self.store.lock().create(rt, namespace, obj)
    }

    /// Reads an object.
    pub fn get(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, KubeError> {
        let rt = find(api_version, plural)?;
        self.store.lock().get(rt, namespace, name)
    }

    /// Every object of a type in `namespace` (every namespace when `None`); empty when the type
    /// is not served.
    pub fn list_all(&self, api_version: &str, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        let Ok(rt) = find(api_version, plural) else {
            return Vec::new();
        };
        self.store
            .lock()
            .list(rt, namespace, &select::Selector::default(), None, None)
            .items
    }

    /// Replaces an object (stale `metadata.resourceVersion` → 409; none → unconditional),
    /// status included.
    pub fn update(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, KubeError> {
        let rt = find(api_version, plural)?;
        let name = store::name_of(&obj).unwrap_or("").to_string();
        let mut s = self.store.lock();
        let updated = s.update(rt, namespace, &name, obj.clone(), None)?;
        if rt.status_subresource
            && obj.get("status").is_some()
            && updated.get("status") != obj.get("status")
        {
            let mut status_only = obj;
            status_only["metadata"]["resourceVersion"] =
                updated["metadata"]["resourceVersion"].clone();
            return s.update(rt, namespace, &name, status_only, Some("status"));
        }
        Ok(updated)
    }

    /// Deletes an object.
    pub fn delete(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, KubeError> {
        let rt = find(api_version, plural)?;
        self.store.lock().delete(rt, namespace, name, None)
    }

    /// Adds a Node with these labels, `Ready` or not.
    pub fn add_node(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        ready: bool,
    ) -> Result<Value, KubeError> {
        let ready = if ready { "True" } else { "False" };
        self.create(
            "v1",
            "nodes",
            "",
            json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {},
                "status": {
                    "conditions": [{"type": "Ready", "status": ready, "reason": "EmulatorSeeded"}],
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                },
            }),
        )
    }

    /// Adds a Pod bound to `node` (if any) in `phase`, with a `Ready` condition when `ready`.
    pub fn add_pod(&self, seed: &PodSeed) -> Result<Value, KubeError> {
        let ready = if seed.ready { "True" } else { "False" };
        let mut spec =
            json!({"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]});
        if let Some(node) = &seed.node {
            spec["nodeName"] = json!(node);
        }
        self.create(
            "v1",
            "pods",
            &seed.namespace,
            json!({
                "metadata": {"name": seed.name, "labels": seed.labels},
                "spec": spec,
                "status": {"phase": seed.phase, "conditions": [{"type": "Ready", "status": ready}]},
            }),
        )
    }
}

/// A pod for [`KubeState::add_pod`] and `POST /_emulator/kube/pods`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSeed {
    /// Namespace (must exist).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`.
    #[serde(default, alias = "nodeName")]
    pub node: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `status.phase` (default `Running`).
    #[serde(default = "default_phase")]
    pub phase: String,
    /// A `Ready` condition `True` (default) or `False`.
    #[serde(default = "default_true")]
    pub ready: bool,
}

fn default_namespace() -> String {
    "default".to_string()
}
fn default_phase() -> String {
    "Running".to_string()
}
fn default_true() -> bool {
    true
}

fn authorized(kube: &KubeState, parts: &Parts) -> bool {
    parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t.trim() == kube.token)
}

fn error_response(e: KubeError) -> Response {
    Reply::json(e.code, e.status).into_response()
}

/// Answers one request on a Kubernetes path.
pub(crate) fn handle(kube: &KubeState, parts: &Parts, body: &[u8]) -> Response {
    let path = parts.uri.path().trim_end_matches('/');
    if !matches!(parts.method.as_str(), "GET" | "HEAD" | "OPTIONS") {
        kube.write_log
            .lock()
            .push((parts.method.to_string(), path.to_string()));
    }
    if kube.unavailable() {
        return error_response(status::unavailable());
    }
    match path {
        "/healthz" | "/livez" | "/readyz" => {
            return Reply {
                status: 200,
                headers: Vec::new(),
                body: crate::server::ReplyBody::Text("ok".to_string()),
            }
            .into_response()
        }
        "/version" => return Reply::json(200, discovery::version()).into_response(),
        _ => {}
    }
    if !authorized(kube, parts) {
        return error_response(status::unauthorized());
    }
    if path == "/openapi/v3" {
        return Reply::json(200, openapi::index()).into_response();
    }
    if let Some(gv) = path.strip_prefix("/openapi/v3/") {
        return match openapi::document(gv) {
            Some(doc) => Reply::json(200, doc).into_response(),
            None => error_response(status::no_route()),
        };
    }
    if path == "/openapi/v2" {
        return openapi::v2(parts);
    }
    if path.starts_with("/openapi") {
        return error_response(status::no_route());
    }
    if matches!(parts.method.as_str(), "POST" | "PUT") {
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let media = content_type.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return error_response(status::unsupported_body(content_type));
        }
    }
    match routes::handle(kube, parts, body) {
        Ok(r) => r,
        Err(e) => error_response(e),
    }
}

/// A kubeconfig for this emulator: its server URL, its token, its CA when it serves TLS.
pub fn kubeconfig(server: &str, token: &str, ca_pem: Option<&str>) -> String {
    use base64::Engine;
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {server}{ca}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: emulator\n    namespace: default\ncurrent-context: emulator\nusers:\n- name: emulator\n  user:\n    token: {token}\npreferences: {{}}\n"
    )
}
