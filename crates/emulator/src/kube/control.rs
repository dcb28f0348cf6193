//! `/_emulator/kube/`: seed nodes and pods, compact the history, read the cluster version.
//!
//! | method and path | does |
//! |---|---|
//! | `POST /_emulator/kube/nodes` `{"name", "labels"?, "ready"?}` | adds a Node |
//! | `POST /_emulator/kube/pods` `{"namespace"?, "name", "nodeName"?, "labels"?, "phase"?, "ready"?}` | adds a Pod with that status |
//! | `POST /_emulator/kube/compact` | forgets the watch history (later watches from older versions get 410) |
//! | `POST /_emulator/kube/unavailable` `{"on": bool}` | the fault switch: while on, every Kubernetes request answers 503 |
//! | `GET /_emulator/kube/state` | `{"resourceVersion", "token"}` |

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{KubeState, PodSeed};
use crate::server::Reply;

#[derive(Deserialize)]
struct NodeSeed {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default = "yes")]
    ready: bool,
}

#[derive(Deserialize)]
struct Switch {
    on: bool,
}

fn yes() -> bool {
    true
}

fn created(r: Result<Value, super::KubeError>) -> Reply {
    match r {
        Ok(v) => Reply::json(201, v),
        Err(e) => Reply::json(e.code, e.status),
    }
}

fn bad(e: serde_json::Error) -> Reply {
    Reply::json(
        400,
        json!({"error": {"code": "BadRequest", "message": format!("invalid JSON body: {e}")}}),
    )
}

/// Answers `/_emulator/kube/...` (`rest` is the path after `/_emulator/kube`).
pub(crate) fn handle(kube: &KubeState, method: &str, rest: &[&str], body: &[u8]) -> Reply {
    match (method, rest) {
        ("POST", ["nodes"]) => match serde_json::from_slice::<NodeSeed>(body) {
            Ok(n) => created(kube.add_node(&n.name, &n.labels, n.ready)),
            Err(e) => bad(e),
        },
        ("POST", ["pods"]) => match serde_json::from_slice::<PodSeed>(body) {
            Ok(p) => created(kube.add_pod(&p)),
            Err(e) => bad(e),
        },
        ("POST", ["compact"]) => {
            kube.compact();
            Reply::json(
                200,
                json!({"resourceVersion": kube.resource_version().to_string()}),
            )
        }
        ("POST", ["unavailable"]) => match serde_json::from_slice::<Switch>(body) {
            Ok(sw) => {
                kube.set_unavailable(sw.on);
                Reply::json(200, json!({"unavailable": kube.unavailable()}))
            }
            Err(e) => bad(e),
        },
        ("GET", ["state"]) => Reply::json(
            200,
            json!({"resourceVersion": kube.resource_version().to_string(), "token": kube.token(), "unavailable": kube.unavailable()}),
        ),
        _ => Reply::json(
            404,
            json!({"error": {"code": "NotFound", "message": "no such /_emulator/kube endpoint"}}),
        ),
    }
}
