//! `/_emulator/kube/`: seed nodes and pods, compact the history, read the cluster version.
//!
//! | method and path | does |
//! |---|---|
//! | `POST /_emulator/kube/nodes` `{"name", "labels"?, "ready"?}` | adds a Node |
//! | `POST /_emulator/kube/pods` `{"namespace"?, "name", "nodeName"?, "labels"?, "phase"?, "ready"?}` | adds a Pod with that status |
//! | `POST /_emulator/kube/compact` | forgets the watch history (later watches from older versions get 410) |
//! | `POST /_emulator/kube/unavailable` `{"on": bool}` | the fault switch: while on, every Kubernetes request answers 503 |
//! | `GET /_emulator/kube/state` | `{"resourceVersion", "token"}` |
//! | `POST /_emulator/kube/nodes/{name}/kubelet` `{"dead": bool}` | kills or revives the Node's kubelet |
//! | `GET /_emulator/kube/faults` | the faults per resource now on |
//! | `POST /_emulator/kube/faults/{plural}` `{"forbidList"?, "forbidWatch"?, "silentWatch"?, "latencyMs"?, "slowAnswerMs"?}` | sets one resource's faults (fields left out stay) |
//! | `DELETE /_emulator/kube/faults` | turns every fault per resource off |
//! | `GET /_emulator/kube/requests` | the Kubernetes request log |

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

/// `POST /_emulator/kube/nodes/{name}/kubelet`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KubeletBody {
    dead: bool,
}

/// `POST /_emulator/kube/faults/{plural}`: the fields given replace the resource's; the others
/// stay.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KindFaultBody {
    #[serde(default)]
    forbid_list: Option<bool>,
    #[serde(default)]
    forbid_watch: Option<bool>,
    #[serde(default)]
    silent_watch: Option<bool>,
    #[serde(default)]
    latency_ms: Option<u64>,
    #[serde(default)]
    slow_answer_ms: Option<u64>,
}

/// Longest delay a fault may set: an hour.
const MAX_DELAY_MS: u64 = 3_600_000;

fn error(code: u16, name: &str, message: impl Into<String>) -> Reply {
    Reply::json(
        code,
        json!({"error": {"code": name, "message": message.into()}}),
    )
}

fn kubelet(kube: &KubeState, name: &str, body: &[u8]) -> Reply {
    let b: KubeletBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return bad(e),
    };
    let Some(nodes_rt) = super::resources::find("", "v1", "nodes") else {
        return error(500, "InternalError", "nodes are not served");
    };
    let r = kube.with_store(|store| {
        let node = store.get(nodes_rt, "", name)?;
        crate::sim::nodes::set_kubelet(store, &node, b.dead)
    });
    match r {
        Ok(node) => Reply::json(200, node),
        Err(e) if e.code == 404 => error(404, "NotFound", format!("no Node named {name:?}")),
        Err(e) => Reply::json(e.code, e.status),
    }
}

fn kind_fault(kube: &KubeState, plural: &str, body: &[u8]) -> Reply {
    if !super::resources::RESOURCES
        .iter()
        .any(|r| r.plural == plural)
    {
        return error(
            404,
            "NotFound",
            format!(
                "the emulator serves no resource {plural:?} (name it by its plural, e.g. pods)"
            ),
        );
    }
    let b: KindFaultBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return bad(e),
    };
    for (field, ms) in [
        ("latencyMs", b.latency_ms),
        ("slowAnswerMs", b.slow_answer_ms),
    ] {
        if ms.is_some_and(|ms| ms > MAX_DELAY_MS) {
            return error(
                400,
                "BadRequest",
                format!(
                    "{field} must be at most {MAX_DELAY_MS} (an hour), got {}",
                    ms.unwrap_or_default()
                ),
            );
        }
    }
    if let Some(on) = b.forbid_list {
        kube.forbid_list(plural, on);
    }
    if let Some(on) = b.forbid_watch {
        kube.forbid_watch(plural, on);
    }
    if let Some(on) = b.silent_watch {
        kube.stall_watches(plural, on);
    }
    if b.latency_ms.is_some() || b.slow_answer_ms.is_some() {
        let mut d = kube.kind_delay(plural);
        if let Some(ms) = b.latency_ms {
            d.latency = std::time::Duration::from_millis(ms);
        }
        if let Some(ms) = b.slow_answer_ms {
            d.slow_answer = std::time::Duration::from_millis(ms);
        }
        kube.set_kind_delay(plural, d);
    }
    Reply::json(200, json!({plural: kube.kind_fault(plural)}))
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
        ("POST", ["nodes", name, "kubelet"]) => kubelet(kube, name, body),
        ("GET", ["faults"]) => Reply::json(200, json!(kube.kind_faults())),
        ("POST", ["faults", plural]) => kind_fault(kube, plural, body),
        ("DELETE", ["faults"]) => {
            kube.clear_kind_faults();
            Reply::json(200, json!({"cleared": true}))
        }
        ("GET", ["requests"]) => Reply::json(200, json!(kube.request_log())),
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
