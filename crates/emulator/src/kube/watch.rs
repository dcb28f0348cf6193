//! WATCH: newline-delimited JSON events from a `resourceVersion`, with bookmarks, a timeout,
//! and 410 Gone (an `ERROR` event carrying a `Status`) for a version older than the history.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::resources::ResourceType;
use super::select::Selector;
use super::status::{self, KubeError};
use super::store::{Change, Store};

/// What a watch asks for.
#[derive(Debug)]
pub struct WatchRequest {
    /// The type watched.
    pub rt: &'static ResourceType,
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
    /// `resourceVersion`: `None` or `0` start with the current state as ADDED events.
    pub from: Option<u64>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Interval between bookmarks.
    pub bookmark_interval: Duration,
    /// The resources whose reads are forbidden: the watch ends when its own joins them.
    pub cut: Option<tokio::sync::watch::Receiver<std::collections::HashSet<String>>>,
    /// The resources whose watches are stalled: nothing is sent while its own is among them.
    pub stall: Option<tokio::sync::watch::Receiver<std::collections::HashSet<String>>>,
    /// Objects sent as one-row `Table`s of this `meta.k8s.io` version (`kubectl get -w`).
    pub table: Option<(&'static str, super::table::Include)>,
}

/// Writes watch events: objects as they are, or as one-row Tables whose first alone carries
/// the column definitions (later ones `null`), as kube-apiserver writes them.
struct Encoder {
    rt: &'static ResourceType,
    table: Option<(&'static str, super::table::Include)>,
    columns_sent: bool,
}

impl Encoder {
    fn event(&mut self, event: &str, object: &Value) -> Bytes {
        let Some((api_version, include)) = self.table else {
            return line(event, object);
        };
        let meta = json!({"resourceVersion": object.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))});
        let mut t = super::table::table(self.rt, api_version, &[object], meta, include);
        if self.columns_sent {
            t["columnDefinitions"] = Value::Null;
        }
        self.columns_sent = true;
        line(event, &t)
    }
}

fn line(event: &str, object: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": event, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn too_old(from: u64, oldest: u64) -> KubeError {
    status::expired(format!("too old resource version: {from} ({oldest})"))
}

impl WatchRequest {
    /// The event this watch sees for `change`, if any. As the API server's watch cache does
    /// (`cacher.go`, `convertToWatchEvent`): an object that enters the selector is ADDED, one
    /// that leaves it is DELETED (its previous content at the change's version), one that stays
    /// is MODIFIED.
    fn sees(&self, change: &Change) -> Option<(&'static str, Value)> {
        let scoped = change.type_id == self.rt.id()
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == change.namespace);
        if !scoped {
            return None;
        }
        let now = self.selector.matches(self.rt, &change.object);
        let before = change
            .prev
            .as_ref()
            .is_some_and(|p| self.selector.matches(self.rt, p));
        match (change.prev.is_some(), before, now) {
            (false, _, true) => Some((change.event.as_str(), change.object.clone())),
            (true, true, true) => Some(("MODIFIED", change.object.clone())),
            (true, false, true) => Some(("ADDED", change.object.clone())),
            (true, true, false) => {
                let mut gone = change.prev.clone().unwrap_or(Value::Null);
                gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
                Some(("DELETED", gone))
            }
            _ => None,
        }
    }
}

/// Starts a watch: the initial events are taken and the subscription made under one lock, so no
/// change falls between them. The answer streams until the timeout or the client leaves.
pub fn start(store: &parking_lot::Mutex<Store>, req: WatchRequest) -> Response {
    let mut encoder = Encoder {
        rt: req.rt,
        table: req.table,
        columns_sent: false,
    };
    let (initial, mut rx, start_rv) = {
        let s = store.lock();
        let rx = s.subscribe();
        match req.from {
            None | Some(0) => {
                let page = s.list(req.rt, req.namespace.as_deref(), &req.selector, None, None);
                let lines: Vec<Bytes> = page
                    .items
                    .iter()
                    .map(|o| encoder.event("ADDED", o))
                    .collect();
                (Ok(lines), rx, s.resource_version())
            }
            Some(from) if from < s.oldest_servable() => (
                Err(too_old(from, s.oldest_servable())),
                rx,
                s.resource_version(),
            ),
            Some(from) => {
                let lines = s
                    .changes_since(from)
                    .iter()
                    .filter_map(|c| req.sees(c))
                    .map(|(event, object)| encoder.event(event, &object))
                    .collect();
                (Ok(lines), rx, s.resource_version().max(from))
            }
        }
    };
    let (tx, body_rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let initial = match initial {
            Ok(lines) => lines,
            Err(e) => {
                let _ = tx.send(line("ERROR", &e.status)).await;
                return;
            }
        };
        for l in initial {
            if tx.send(l).await.is_err() {
                return;
            }
        }
        let mut last_rv = start_rv;
        let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(req.bookmark_interval);
        ticker.tick().await;
        let mut cut = req.cut.clone();
        let mut stall = req.stall.clone();
        loop {
            if let Some(s) = stall.as_mut() {
                // Stalled: send nothing until the fault ends or the client leaves.
                while s.borrow_and_update().contains(req.rt.plural) {
                    tokio::select! {
                        _ = tx.closed() => return,
                        changed = s.changed() => if changed.is_err() { break },
                    }
                }
            }
            let forbidden = async {
                match cut.as_mut() {
                    Some(c) => {
                        if c.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                        c.borrow().contains(req.rt.plural)
                    }
                    None => std::future::pending().await,
                }
            };
            let timeout = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = timeout => return,
                _ = tx.closed() => return,
                true = forbidden => return,
                _ = ticker.tick(), if req.bookmarks => {
                    let obj = json!({
                        "kind": req.rt.kind,
                        "apiVersion": req.rt.group_version(),
                        "metadata": {"resourceVersion": last_rv.to_string()},
                    });
                    if tx.send(line("BOOKMARK", &obj)).await.is_err() {
                        return;
                    }
                }
                got = rx.recv() => match got {
                    Ok(change) => {
                        if change.rv <= last_rv {
                            continue;
                        }
                        last_rv = change.rv;
                        if let Some((event, object)) = req.sees(&change) {
                            let l = encoder.event(event, &object);
                            if tx.send(l).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        let e = too_old(last_rv, last_rv + 1);
                        let _ = tx.send(line("ERROR", &e.status)).await;
                        return;
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        }
    });
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}
