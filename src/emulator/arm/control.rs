//! The control and observation API under `/_emulator/` (no authentication, JSON in and out).

use std::collections::BTreeMap;

use http::request::Parts;
use serde::Deserialize;
use serde_json::{json, Value};

use super::faults::FaultSpec;
use super::state::ScaleSetSeed;
use super::ClusterSeed;
use super::{EmulatorError, EmulatorState, Reply};

/// Writer recorded for out-of-band writes that name none.
const DEFAULT_RIVAL: &str = "rival";

#[derive(Deserialize)]
struct CapacityBody {
    #[serde(alias = "count")]
    capacity: i64,
    #[serde(default)]
    writer: Option<String>,
}

#[derive(Deserialize)]
struct TagsBody {
    tags: BTreeMap<String, String>,
    #[serde(default)]
    writer: Option<String>,
}

#[derive(Deserialize)]
struct ClientBody {
    client_id: String,
    secret: String,
}

#[derive(Deserialize)]
struct DownBody {
    down: bool,
}

fn bad_request(msg: impl std::fmt::Display) -> Reply {
    Reply::json(
        400,
        json!({"error": {"code": "BadRequest", "message": msg.to_string()}}),
    )
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON body: {e}")))
}

fn from_error(e: EmulatorError) -> Reply {
    match e {
        EmulatorError::NotFound { .. } | EmulatorError::AksNotFound { .. } => Reply::json(
            404,
            json!({"error": {"code": "ResourceNotFound", "message": e.to_string()}}),
        ),
        other => bad_request(other),
    }
}

fn etag_reply(r: Result<String, EmulatorError>) -> Reply {
    match r {
        Ok(etag) => Reply::json(200, json!({ "etag": etag })),
        Err(e) => from_error(e),
    }
}

/// Answers one `/_emulator/...` request.
pub(crate) fn handle(state: &EmulatorState, parts: &Parts, body: &[u8]) -> Reply {
    match route(state, parts, body) {
        Ok(r) | Err(r) => r,
    }
}

fn route(state: &EmulatorState, parts: &Parts, body: &[u8]) -> Result<Reply, Reply> {
    let path = parts.uri.path().trim_start_matches("/_emulator");
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let method = parts.method.as_str();
    let reply = match (method, segs.as_slice()) {
        ("GET", ["healthz"]) => Reply::json(200, json!({"status": "ok"})),
        ("POST", ["reset"]) => {
            state.reset();
            Reply::json(200, json!({"reset": true}))
        }
        ("POST", ["scale-sets"]) => {
            let seed: ScaleSetSeed = parse(body)?;
            Reply::json(200, json!({"etag": state.seed_scale_set(seed)}))
        }
        ("GET", ["scale-sets", sub, rg, name]) => match state.scale_set(sub, rg, name) {
            Some(view) => Reply::json(200, serde_json::to_value(view).unwrap_or(Value::Null)),
            None => from_error(EmulatorError::NotFound {
                resource: format!("{sub}/{rg}/{name}"),
            }),
        },
        ("DELETE", ["scale-sets", sub, rg, name]) => Reply::json(
            200,
            json!({"deleted": state.delete_out_of_band(sub, rg, name)}),
        ),
        ("POST", ["scale-sets", sub, rg, name, "capacity"]) => {
            let b: CapacityBody = parse(body)?;
            let writer = b.writer.unwrap_or_else(|| DEFAULT_RIVAL.to_string());
            etag_reply(state.rival_set_capacity(sub, rg, name, b.capacity, &writer))
        }
        ("POST", ["scale-sets", sub, rg, name, "tags"]) => {
            let b: TagsBody = parse(body)?;
            let writer = b.writer.unwrap_or_else(|| DEFAULT_RIVAL.to_string());
            etag_reply(state.rival_set_tags(sub, rg, name, b.tags, &writer))
        }
        ("POST", ["clusters"]) => {
            let seed: ClusterSeed = parse(body)?;
            etag_reply(state.seed_cluster(seed))
        }
        ("GET", ["clusters", sub, rg, name]) => match state.cluster(sub, rg, name) {
            Some(view) => Reply::json(200, serde_json::to_value(view).unwrap_or(Value::Null)),
            None => from_error(EmulatorError::AksNotFound {
                resource: format!("{sub}/{rg}/{name}"),
            }),
        },
        ("POST", ["clusters", sub, rg, name, "tags"]) => {
            let b: TagsBody = parse(body)?;
            let writer = b.writer.unwrap_or_else(|| DEFAULT_RIVAL.to_string());
            etag_reply(state.rival_cluster_write(sub, rg, name, b.tags, &writer))
        }
        ("GET", ["clusters", sub, rg, name, "agent-pools", pool]) => {
            match state.agent_pool(sub, rg, name, pool) {
                Some(view) => Reply::json(200, serde_json::to_value(view).unwrap_or(Value::Null)),
                None => from_error(EmulatorError::AksNotFound {
                    resource: format!("{sub}/{rg}/{name}/agentPools/{pool}"),
                }),
            }
        }
        ("DELETE", ["clusters", sub, rg, name, "agent-pools", pool]) => Reply::json(
            200,
            json!({"deleted": state.delete_agent_pool_out_of_band(sub, rg, name, pool)}),
        ),
        ("POST", ["clusters", sub, rg, name, "agent-pools", pool, "count"]) => {
            let b: CapacityBody = parse(body)?;
            let writer = b.writer.unwrap_or_else(|| DEFAULT_RIVAL.to_string());
            etag_reply(state.rival_set_pool_count(sub, rg, name, pool, b.capacity, &writer))
        }
        ("POST", ["faults"]) => {
            let spec: FaultSpec = parse(body)?;
            Reply::json(200, json!({"id": state.inject_fault(spec)}))
        }
        ("DELETE", ["faults"]) => {
            state.clear_faults();
            Reply::json(200, json!({"cleared": true}))
        }
        ("GET", ["requests"]) => Reply::json(200, json!(state.request_log())),
        ("GET", ["lost-updates"]) => Reply::json(200, json!(state.lost_updates())),
        ("POST", ["clients"]) => {
            let b: ClientBody = parse(body)?;
            state.register_client(&b.client_id, &b.secret);
            Reply::json(200, json!({"registered": b.client_id}))
        }
        ("POST", ["token-endpoint"]) => {
            let b: DownBody = parse(body)?;
            state.set_token_endpoint_down(b.down);
            Reply::json(200, json!({"down": b.down}))
        }
        ("GET" | "POST", ["token"]) => {
            let client_id = parts
                .uri
                .query()
                .and_then(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .find(|(k, _)| k == "client_id")
                        .map(|(_, v)| v.into_owned())
                })
                .ok_or_else(|| bad_request("client_id query parameter is required"))?;
            let lifetime = state.settings().token_lifetime.as_secs();
            Reply::json(
                200,
                json!({
                    "access_token": state.issue_token(&client_id),
                    "token_type": "Bearer",
                    "expires_in": lifetime,
                }),
            )
        }
        ("GET", ["federated-assertions"]) => {
            Reply::json(200, json!(state.federated_assertions_seen()))
        }
        _ => Reply::json(
            404,
            json!({"error": {"code": "NotFound", "message": format!("no control route {method} /_emulator{path}")}}),
        ),
    };
    Ok(reply)
}
