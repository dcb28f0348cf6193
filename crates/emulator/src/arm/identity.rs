//! Identity: an AAD-style token endpoint (client secret and federated assertion), its OpenID
//! discovery documents, and an IMDS-style managed-identity endpoint.

use std::collections::HashMap;

use base64::Engine;
use http::request::Parts;
use serde_json::json;

use super::{EmulatorState, Reply};

const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// Subject of IMDS tokens requested without a client id.
pub const SYSTEM_ASSIGNED: &str = "system-assigned";

fn aad_error(status: u16, error: &str, description: &str) -> Reply {
    Reply::json(
        status,
        json!({
            "error": error,
            "error_description": description,
            "error_codes": [],
            "timestamp": super::state::now_rfc3339(),
            "trace_id": super::state::new_uuid(),
            "correlation_id": super::state::new_uuid(),
        }),
    )
}

fn base_of(state: &EmulatorState, parts: &Parts) -> String {
    let scheme = if state.base_url().starts_with("https://") {
        "https"
    } else {
        "http"
    };
    match parts.headers.get("host").and_then(|h| h.to_str().ok()) {
        Some(host) if !host.is_empty() => format!("{scheme}://{host}"),
        _ => state.base_url().to_string(),
    }
}

/// Answers identity routes; `None` when the path is not one of them.
pub(crate) fn handle(state: &EmulatorState, parts: &Parts, body: &[u8]) -> Option<Reply> {
    let path = parts.uri.path();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let lower: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
    let l: Vec<&str> = lower.iter().map(String::as_str).collect();
    let method = parts.method.as_str();
    match l.as_slice() {
        ["metadata", "identity", "oauth2", "token"] => Some(imds(state, parts)),
        ["subscriptions", ..] | ["_emulator", ..] => None,
        [_, "oauth2", "v2.0", "token"] | [_, "oauth2", "token"] if method == "POST" => {
            Some(token(state, parts, body))
        }
        [_, "v2.0", ".well-known", "openid-configuration"]
        | [_, ".well-known", "openid-configuration"] => Some(discovery(state, parts, segs[0])),
        [_, "discovery", "instance"] | [_, "discovery", "v2.0", "instance"] => {
            Some(instance_discovery(state, parts))
        }
        [_, "discovery", "v2.0", "keys"] | [_, "discovery", "keys"] => {
            Some(Reply::json(200, json!({"keys": []})))
        }
        _ => None,
    }
}

fn discovery(state: &EmulatorState, parts: &Parts, tenant: &str) -> Reply {
    let base = base_of(state, parts);
    Reply::json(
        200,
        json!({
            "token_endpoint": format!("{base}/{tenant}/oauth2/v2.0/token"),
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
            "jwks_uri": format!("{base}/{tenant}/discovery/v2.0/keys"),
            "response_modes_supported": ["query", "fragment", "form_post"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
            "issuer": format!("{base}/{tenant}/v2.0"),
            "request_uri_parameter_supported": false,
            "userinfo_endpoint": format!("{base}/oidc/userinfo"),
            "authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/authorize"),
            "device_authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/devicecode"),
            "http_logout_supported": true,
            "frontchannel_logout_supported": true,
            "end_session_endpoint": format!("{base}/{tenant}/oauth2/v2.0/logout"),
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "tid"],
            "kerberos_endpoint": format!("{base}/{tenant}/kerberos"),
            "tenant_region_scope": "EU",
            "cloud_instance_name": "emulator.local",
            "cloud_graph_host_name": "graph.emulator.local",
            "msgraph_host": "graph.emulator.local",
            "rbac_url": "https://pas.emulator.local"
        }),
    )
}

fn instance_discovery(state: &EmulatorState, parts: &Parts) -> Reply {
    let base = base_of(state, parts);
    let host = base.split("://").nth(1).unwrap_or_default().to_string();
    Reply::json(
        200,
        json!({
            "tenant_discovery_endpoint": format!("{base}/common/v2.0/.well-known/openid-configuration"),
            "api-version": "1.1",
            "metadata": [{"preferred_network": host, "preferred_cache": host, "aliases": [host]}]
        }),
    )
}

fn token(state: &EmulatorState, parts: &Parts, body: &[u8]) -> Reply {
    if state.lock().token_down {
        return aad_error(
            503,
            "temporarily_unavailable",
            "AADSTS90055: The service is temporarily unavailable (emulator token endpoint is down).",
        );
    }
    let mut form: HashMap<String, String> = url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    // client_secret_basic: credentials in an Authorization: Basic header.
    if let Some(basic) = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    {
        if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim()) {
            if let Some((id, secret)) = String::from_utf8_lossy(&decoded).split_once(':') {
                form.entry("client_id".into())
                    .or_insert_with(|| id.to_string());
                form.entry("client_secret".into())
                    .or_insert_with(|| secret.to_string());
            }
        }
    }
    let Some(grant) = form.get("grant_type") else {
        return aad_error(
            400,
            "invalid_request",
            "AADSTS900144: The request body must contain the following parameter: 'grant_type'.",
        );
    };
    if grant != "client_credentials" {
        return aad_error(
            400,
            "unsupported_grant_type",
            "AADSTS70003: The app requested an unsupported grant type.",
        );
    }
    let Some(client_id) = form.get("client_id").filter(|c| !c.is_empty()).cloned() else {
        return aad_error(
            400,
            "invalid_request",
            "AADSTS900144: The request body must contain the following parameter: 'client_id'.",
        );
    };
    if let Some(assertion) = form.get("client_assertion") {
        if form.get("client_assertion_type").map(String::as_str) != Some(JWT_BEARER) {
            return aad_error(
                400,
                "invalid_request",
                "AADSTS50027: client_assertion_type must be urn:ietf:params:oauth:client-assertion-type:jwt-bearer.",
            );
        }
        state.lock().assertions.push(assertion.clone());
    } else if let Some(secret) = form.get("client_secret") {
        let d = state.lock();
        if !d.clients.is_empty() && d.clients.get(&client_id) != Some(secret) {
            return aad_error(
                401,
                "invalid_client",
                "AADSTS7000215: Invalid client secret provided.",
            );
        }
    } else {
        return aad_error(
            400,
            "invalid_request",
            "AADSTS7000216: 'client_assertion', 'client_secret' or 'request' is required for the 'client_credentials' grant type.",
        );
    }
    let lifetime = state.settings().token_lifetime.as_secs();
    let access_token = state.issue_token(&client_id);
    Reply::json(
        200,
        json!({
            "token_type": "Bearer",
            "expires_in": lifetime,
            "ext_expires_in": lifetime,
            "access_token": access_token,
        }),
    )
}

fn imds(state: &EmulatorState, parts: &Parts) -> Reply {
    if state.lock().token_down {
        return aad_error(
            503,
            "temporarily_unavailable",
            "The managed identity endpoint is temporarily unavailable.",
        );
    }
    let metadata = parts
        .headers
        .get("metadata")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let identity_header = parts.headers.contains_key("x-identity-header");
    if !metadata && !identity_header {
        return aad_error(
            400,
            "invalid_request",
            "Required metadata header not specified",
        );
    }
    let query: HashMap<String, String> = parts
        .uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let Some(resource) = query.get("resource").filter(|r| !r.is_empty()) else {
        return aad_error(
            400,
            "invalid_request",
            "Required query variable 'resource' is missing",
        );
    };
    let client_id = query
        .get("client_id")
        .filter(|c| !c.is_empty())
        .cloned()
        .unwrap_or_else(|| SYSTEM_ASSIGNED.to_string());
    let lifetime = state.settings().token_lifetime.as_secs();
    let now_unix = time::OffsetDateTime::now_utc().unix_timestamp();
    let access_token = state.issue_token(&client_id);
    Reply::json(
        200,
        json!({
            "access_token": access_token,
            "client_id": client_id,
            "expires_in": lifetime.to_string(),
            "expires_on": (now_unix + lifetime as i64).to_string(),
            "ext_expires_in": lifetime.to_string(),
            "not_before": now_unix.to_string(),
            "resource": resource,
            "token_type": "Bearer",
        }),
    )
}
