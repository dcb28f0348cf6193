//! The ARM room: scale sets, AKS managed clusters and agent pools, identity (the token endpoint,
//! OpenID discovery, IMDS), throttling, faults and the `/_emulator/` control API. It shares only
//! the server plumbing (`emulator::server`) and the error type with the Kubernetes room,
//! and knows nothing of it.
//!
//! | module | owns |
//! |---|---|
//! | [`state`] | resources, versions, lost-update tracking, the request log |
//! | `scale_sets` | the ARM scale-set routes, preconditions, long-running operations |
//! | `aks` | managed clusters, agent pools and the scale sets behind them |
//! | `identity` | the token endpoint, OpenID discovery, IMDS |
//! | [`inventory`] | a read-only view of instances, for the cluster simulation |
//! | [`registration`] | the labels and taints a scale set's new Nodes register with beyond its tags |
//! | [`throttle`] | token buckets and rate-limit headers |
//! | [`faults`] | scriptable faults |
//! | `control` | the `/_emulator/` API |
//! | `retail_prices` | Azure's retail prices API (`/api/retail/prices`), its pages and `$filter` |

mod aks;
mod control;
pub mod faults;
mod identity;
pub mod inventory;
pub mod quota;
pub mod registration;
pub(crate) mod retail_prices;
mod scale_sets;
pub mod state;
pub mod throttle;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::request::Parts;

pub(crate) use crate::server::{ConnKill, Reply, ReplyBody};
pub(crate) use crate::EmulatorError;
pub use aks::{AgentPoolSeed, AgentPoolView, ClusterSeed, ClusterView};
pub(crate) use state::EmulatorState;
use state::RequestRecord;

/// Answers one ARM-side request (everything the Kubernetes room did not claim).
pub(crate) async fn handle(state: &EmulatorState, parts: &Parts, bytes: Bytes) -> Response {
    let state = state.clone();
    let path = parts.uri.path();
    if path == "/_emulator" || path.starts_with("/_emulator/") {
        return control::handle(&state, parts, &bytes).into_response();
    }
    if path == retail_prices::PATH {
        return retail_prices::handle(&state, parts).into_response();
    }
    if let Some(reply) = identity::handle(&state, parts, &bytes) {
        let mut d = state.lock();
        d.seq += 1;
        let seq = d.seq;
        d.log(RequestRecord {
            seq,
            method: parts.method.as_str().to_string(),
            path: path.to_string(),
            if_match: None,
            if_none_match: None,
            status: reply.status,
            writer: None,
            body_capacity: None,
            user_agent: parts
                .headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            at: tokio::time::Instant::now(),
            error: None,
        });
        return reply.into_response();
    }
    scale_sets::handle(&state, parts, bytes)
        .await
        .into_response()
}
