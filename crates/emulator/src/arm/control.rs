//! The control and observation API under `/_emulator/` (no authentication, JSON in and out).

use std::collections::BTreeMap;

use http::request::Parts;
use serde::Deserialize;
use serde_json::{json, Value};

use super::faults::FaultSpec;
use super::registration::NodeRegistration;
use super::state::ScaleSetSeed;
use super::throttle::AksLimits;
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

/// `POST /_emulator/quota/{sub}/{location}`: limits by usage name (a VM family such as
/// `standardDSv5Family`, `cores`, `lowPriorityCores`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaBody {
    limits: BTreeMap<String, i64>,
}

/// `POST /_emulator/scale-sets/{sub}/{rg}/{name}/evict`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvictBody {
    count: usize,
}

/// `POST /_emulator/scale-sets/{sub}/{rg}/{name}/instances/{id}/provisioning-state`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceStateBody {
    provisioning_state: String,
}

fn registration_reply(r: &NodeRegistration) -> Reply {
    Reply::json(200, json!({"labels": r.labels, "taints": r.taints}))
}

fn quota_reply(state: &EmulatorState, sub: &str, location: &str) -> Reply {
    Reply::json(200, json!({"value": state.usages(sub, location)}))
}

fn set_quota(
    state: &EmulatorState,
    sub: &str,
    location: &str,
    body: &[u8],
) -> Result<Reply, Reply> {
    let b: QuotaBody = parse(body)?;
    if b.limits.is_empty() {
        return Err(bad_request(
            "limits must name at least one usage, e.g. {\"limits\": {\"standardDSv5Family\": 8}}",
        ));
    }
    if let Some((name, limit)) = b
        .limits
        .iter()
        .find(|(n, l)| n.trim().is_empty() || **l < 0)
    {
        return Err(bad_request(format!(
            "limit {limit} of usage {name:?}: a usage needs a name and a limit of at least 0"
        )));
    }
    for (name, limit) in &b.limits {
        state.set_quota(sub, location, name, *limit);
    }
    Ok(quota_reply(state, sub, location))
}

fn evict(
    state: &EmulatorState,
    sub: &str,
    rg: &str,
    name: &str,
    body: &[u8],
) -> Result<Reply, Reply> {
    let b: EvictBody = parse(body)?;
    if b.count == 0 {
        return Err(bad_request("count must be at least 1"));
    }
    let policy = state.eviction_policy(sub, rg, name).ok_or_else(|| {
        from_error(EmulatorError::NotFound {
            resource: format!("{sub}/{rg}/{name}"),
        })
    })?;
    let ids = state
        .evict_spot(sub, rg, name, b.count)
        .map_err(from_error)?;
    let view = state.scale_set(sub, rg, name);
    Ok(Reply::json(
        200,
        json!({
            "evicted": ids.iter().map(u64::to_string).collect::<Vec<_>>(),
            "eviction_policy": policy,
            "capacity": view.as_ref().map(|v| v.capacity),
            "etag": view.map(|v| v.etag),
        }),
    ))
}

fn instance_state(
    state: &EmulatorState,
    (sub, rg, name): (&str, &str, &str),
    id: &str,
    body: &[u8],
) -> Result<Reply, Reply> {
    let b: InstanceStateBody = parse(body)?;
    let forced = match b.provisioning_state.to_ascii_lowercase().as_str() {
        "failed" => Some("Failed"),
        "updating" => Some("Updating"),
        "succeeded" => None,
        other => {
            return Err(bad_request(format!(
                "provisioning_state {other:?}: expected Failed, Updating or Succeeded (lifts a forced state)"
            )))
        }
    };
    let Ok(n) = id.parse::<u64>() else {
        return Err(from_error(EmulatorError::InstanceNotFound {
            resource: format!("{sub}/{rg}/{name}/virtualMachines/{id}"),
        }));
    };
    let listed = state
        .set_instance_state(sub, rg, name, n, forced)
        .map_err(from_error)?;
    Ok(Reply::json(
        200,
        json!({"instance_id": id, "provisioning_state": listed}),
    ))
}

#[derive(Deserialize)]
struct DownBody {
    down: bool,
}

/// `POST /_emulator/throttling/aks`: on or off; on, AKS's documented limits scaled by `scale`
/// (default 1) with any of the named fields replacing theirs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AksThrottlingBody {
    enabled: bool,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    pool_write_per_min: Option<f64>,
    #[serde(default)]
    pool_write_burst: Option<u32>,
    #[serde(default)]
    cluster_write_per_min: Option<f64>,
    #[serde(default)]
    cluster_write_burst: Option<u32>,
    #[serde(default)]
    list_per_min: Option<f64>,
    #[serde(default)]
    list_burst: Option<u32>,
}

impl AksThrottlingBody {
    fn limits(&self) -> Result<Option<AksLimits>, Reply> {
        if !self.enabled {
            return Ok(None);
        }
        let scale = self.scale.unwrap_or(1.0);
        if !(scale.is_finite() && scale > 0.0) {
            return Err(bad_request(format!(
                "scale must be a number > 0, got {scale}"
            )));
        }
        let base = AksLimits::aks().scaled(scale);
        let l = AksLimits {
            pool_write_per_min: self.pool_write_per_min.unwrap_or(base.pool_write_per_min),
            pool_write_burst: self.pool_write_burst.unwrap_or(base.pool_write_burst),
            cluster_write_per_min: self
                .cluster_write_per_min
                .unwrap_or(base.cluster_write_per_min),
            cluster_write_burst: self.cluster_write_burst.unwrap_or(base.cluster_write_burst),
            list_per_min: self.list_per_min.unwrap_or(base.list_per_min),
            list_burst: self.list_burst.unwrap_or(base.list_burst),
        };
        let rates = [
            l.pool_write_per_min,
            l.cluster_write_per_min,
            l.list_per_min,
        ];
        if rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
            return Err(bad_request("every per_min must be a number > 0"));
        }
        if [l.pool_write_burst, l.cluster_write_burst, l.list_burst].contains(&0) {
            return Err(bad_request("every burst must be at least 1"));
        }
        Ok(Some(l))
    }
}

fn aks_throttling_reply(limits: Option<AksLimits>) -> Reply {
    Reply::json(200, json!({"enabled": limits.is_some(), "limits": limits}))
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
        EmulatorError::NotFound { .. }
        | EmulatorError::AksNotFound { .. }
        | EmulatorError::InstanceNotFound { .. } => Reply::json(
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
        ("POST", ["scale-sets", sub, rg, name, "evict"]) => evict(state, sub, rg, name, body)?,
        ("POST", ["scale-sets", sub, rg, name, "instances", id, "provisioning-state"]) => {
            instance_state(state, (sub, rg, name), id, body)?
        }
        ("GET", ["scale-sets", sub, rg, name, "node-registration"]) => {
            if state.scale_set(sub, rg, name).is_none() {
                return Err(from_error(EmulatorError::NotFound {
                    resource: format!("{sub}/{rg}/{name}"),
                }));
            }
            registration_reply(&state.node_registration(sub, rg, name))
        }
        ("POST", ["scale-sets", sub, rg, name, "node-registration"]) => {
            let b: NodeRegistration = parse(body)?;
            state
                .set_node_registration(sub, rg, name, b)
                .map_err(from_error)?;
            registration_reply(&state.node_registration(sub, rg, name))
        }
        ("GET", ["quota", sub, location]) => quota_reply(state, sub, location),
        ("POST", ["quota", sub, location]) => set_quota(state, sub, location, body)?,
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
        ("GET", ["throttling", "aks"]) => aks_throttling_reply(state.aks_throttling()),
        ("POST", ["throttling", "aks"]) => {
            let b: AksThrottlingBody = parse(body)?;
            state.set_aks_throttling(b.limits()?);
            aks_throttling_reply(state.aks_throttling())
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
