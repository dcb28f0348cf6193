//! ARM routes: authentication, api-version, throttling, faults, the conditional-request table,
//! scale sets, their VM instances and long-running operations.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::request::Parts;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::aks;
use super::faults::{self, FaultKind};
use super::state::{
    default_location, describe_change, rfc3339, vmss_key, Data, RequestRecord, ScaleSetSeed,
    Settings, MAX_CAPACITY,
};
use super::throttle::{AksBucket, AksCharge, ComputeTarget, Spend};
use super::{ConnKill, EmulatorState, Reply, ReplyBody};

/// Tenant named in `WWW-Authenticate` challenges.
const CHALLENGE_TENANT: &str = "common";

/// What one request knows about itself while it is handled.
pub(crate) struct Ctx {
    pub writer: String,
    pub seq: u64,
    pub now: Instant,
    /// `scheme://host[:port]` as the client addressed us, for absolute links.
    pub base: String,
    pub api_version: String,
    pub lro_failed: bool,
    /// The error the failed operation reports (`LroFailed`'s code), if the fault named one.
    pub lro_error: Option<(String, String)>,
    /// `LroFailed`'s zone: only the VMs created there are left `Failed`.
    pub lro_failed_zone: Option<String>,
    /// `PartialDelete`: how many of a delete's instances are kept, and whether they are left
    /// `Failed`.
    pub partial_delete: Option<(u32, bool)>,
    pub query: Vec<(String, String)>,
    /// The request's If-Match: a write that names the current ETag proves its writer read it.
    pub if_match: Option<String>,
}

impl Ctx {
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Which kind of conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    Put,
    Patch,
    Delete,
}

/// The outcome of the conditional-request table.
pub(crate) enum Decision {
    Create,
    Update,
    Answer(Reply),
}

fn non_empty(v: Option<&str>) -> Option<&str> {
    v.map(str::trim).filter(|s| !s.is_empty())
}

/// The seeds' prevalidation: If-None-Match is empty or `*`, and never `*` with an If-Match.
pub(crate) fn prevalidate(
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Result<(), Reply> {
    let im = non_empty(if_match);
    let inm = non_empty(if_none_match);
    if let Some(v) = inm {
        if v != "*" {
            return Err(Reply::arm_error(
                400,
                "BadRequest",
                format!("The If-None-Match header can only be empty or '*', got '{v}'."),
            ));
        }
    }
    if im.is_some() && inm.is_some() {
        return Err(Reply::arm_error(
            400,
            "BadRequest",
            "A non-empty If-Match header cannot be combined with If-None-Match: '*'.",
        ));
    }
    Ok(())
}

/// Whether an If-Match value names `current`. The opaque tag is compared without one pair of
/// surrounding double quotes on either side: AKS's ETags are bare GUIDs, and clients that follow
/// RFC 9110 (azure-core's `quote_etag`, so every Azure SDK for Python) send them quoted.
pub(crate) fn etags_match(if_match: &str, current: &str) -> bool {
    fn bare(s: &str) -> &str {
        let s = s.trim();
        s.strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or(s)
    }
    bare(if_match) == bare(current)
}

/// The seeds' table, cell for cell. `current` is the resource's ETag when it exists.
pub(crate) fn decide(
    kind: WriteKind,
    if_match: Option<&str>,
    if_none_match: Option<&str>,
    current: Option<&str>,
    not_found: impl FnOnce() -> Reply,
) -> Decision {
    if let Err(r) = prevalidate(if_match, if_none_match) {
        return Decision::Answer(r);
    }
    let im = non_empty(if_match);
    let inm = non_empty(if_none_match);
    match current {
        None => match kind {
            WriteKind::Put if im.is_some() => Decision::Answer(Reply::arm_error(
                412,
                "PreconditionFailed",
                format!(
                    "The condition If-Match: {} was not met: the resource does not exist.",
                    im.unwrap_or_default()
                ),
            )),
            WriteKind::Put => Decision::Create,
            WriteKind::Patch => Decision::Answer(not_found()),
            WriteKind::Delete => Decision::Answer(Reply::empty(204)),
        },
        Some(etag) => {
            if inm.is_some() {
                return Decision::Answer(Reply::arm_error(
                    412,
                    "PreconditionFailed",
                    "The condition If-None-Match: * was not met: the resource already exists.",
                ));
            }
            match im {
                None | Some("*") => Decision::Update,
                Some(v) if etags_match(v, etag) => Decision::Update,
                Some(v) => Decision::Answer(Reply::arm_error(
                    412,
                    "PreconditionFailed",
                    format!("The condition If-Match: {v} was not met: the current ETag is {etag}."),
                )),
            }
        }
    }
}

/// Parsed ARM route (segments compared case-insensitively, names kept as sent).
enum Route {
    VmssList {
        sub: String,
        rg: String,
    },
    Vmss {
        sub: String,
        rg: String,
        name: String,
    },
    VmssVms {
        sub: String,
        rg: String,
        name: String,
    },
    VmssDeleteInstances {
        sub: String,
        rg: String,
        name: String,
    },
    Cluster {
        sub: String,
        rg: String,
        name: String,
    },
    Pools {
        sub: String,
        rg: String,
        cluster: String,
    },
    Pool {
        sub: String,
        rg: String,
        cluster: String,
        pool: String,
    },
    PoolDeleteMachines {
        sub: String,
        rg: String,
        cluster: String,
        pool: String,
    },
    Operation {
        sub: String,
        id: String,
    },
    Usages {
        sub: String,
        location: String,
    },
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let low: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
        let l: Vec<&str> = low.iter().map(String::as_str).collect();
        let s = |i: usize| segs[i].to_string();
        match l.as_slice() {
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.compute", "virtualmachinescalesets"] => {
                Some(Route::VmssList {
                    sub: s(1),
                    rg: s(3),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.compute", "virtualmachinescalesets", _] => {
                Some(Route::Vmss {
                    sub: s(1),
                    rg: s(3),
                    name: s(7),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.compute", "virtualmachinescalesets", _, "virtualmachines"] => {
                Some(Route::VmssVms {
                    sub: s(1),
                    rg: s(3),
                    name: s(7),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.compute", "virtualmachinescalesets", _, "delete"] => {
                Some(Route::VmssDeleteInstances {
                    sub: s(1),
                    rg: s(3),
                    name: s(7),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.containerservice", "managedclusters", _] => {
                Some(Route::Cluster {
                    sub: s(1),
                    rg: s(3),
                    name: s(7),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.containerservice", "managedclusters", _, "agentpools"] => {
                Some(Route::Pools {
                    sub: s(1),
                    rg: s(3),
                    cluster: s(7),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.containerservice", "managedclusters", _, "agentpools", _] => {
                Some(Route::Pool {
                    sub: s(1),
                    rg: s(3),
                    cluster: s(7),
                    pool: s(9),
                })
            }
            ["subscriptions", _, "resourcegroups", _, "providers", "microsoft.containerservice", "managedclusters", _, "agentpools", _, "deletemachines"] => {
                Some(Route::PoolDeleteMachines {
                    sub: s(1),
                    rg: s(3),
                    cluster: s(7),
                    pool: s(9),
                })
            }
            ["subscriptions", _, "providers", "microsoft.compute", "locations", _, "usages"] => {
                Some(Route::Usages {
                    sub: s(1),
                    location: s(5),
                })
            }
            ["subscriptions", _, "providers", _, "locations", _, "operations" | "operationresults" | "operationstatuses", _] => {
                Some(Route::Operation {
                    sub: s(1),
                    id: s(7),
                })
            }
            _ => None,
        }
    }

    fn sub(&self) -> &str {
        match self {
            Route::VmssList { sub, .. }
            | Route::Vmss { sub, .. }
            | Route::VmssVms { sub, .. }
            | Route::VmssDeleteInstances { sub, .. }
            | Route::Cluster { sub, .. }
            | Route::Pools { sub, .. }
            | Route::Pool { sub, .. }
            | Route::PoolDeleteMachines { sub, .. }
            | Route::Operation { sub, .. }
            | Route::Usages { sub, .. } => sub,
        }
    }

    /// The scale set whose own throttle buckets this request draws on.
    fn vmss_key(&self) -> Option<String> {
        match self {
            Route::Vmss { sub, rg, name }
            | Route::VmssVms { sub, rg, name }
            | Route::VmssDeleteInstances { sub, rg, name } => Some(vmss_key(sub, rg, name)),
            _ => None,
        }
    }

    /// The region whose Compute buckets this request draws on; `None` for requests Compute
    /// does not throttle here (AKS's API, operation polls). A scale set's request: its location;
    /// a resource group's LIST: its scale sets' location when they share one; otherwise (or for
    /// a scale set not created yet) the emulator's default region.
    fn compute_location(&self, d: &Data) -> Option<String> {
        match self {
            Route::Usages { location, .. } => Some(location.clone()),
            Route::Vmss { sub, rg, name }
            | Route::VmssVms { sub, rg, name }
            | Route::VmssDeleteInstances { sub, rg, name } => Some(
                d.scale_sets
                    .get(&vmss_key(sub, rg, name))
                    .map_or_else(default_location, |s| s.location.clone()),
            ),
            Route::VmssList { sub, rg } => {
                let mut locations = d
                    .scale_sets
                    .values()
                    .filter(|s| s.sub.eq_ignore_ascii_case(sub) && s.rg.eq_ignore_ascii_case(rg))
                    .map(|s| s.location.to_ascii_lowercase());
                let first = locations.next();
                Some(match first {
                    Some(l) if locations.all(|o| o == l) => l,
                    _ => default_location(),
                })
            }
            _ => None,
        }
    }

    /// What a request to AKS's resource provider spends of AKS's buckets (the throttle
    /// module's documentation says which and why); `None` for other providers' requests.
    fn aks_charge(&self, method: &str, d: &Data) -> Option<AksCharge> {
        let (bucket, sub, rg, cluster, pool) = match self {
            Route::Cluster { sub, rg, name } => {
                let bucket = if method == "GET" {
                    AksBucket::List
                } else {
                    AksBucket::Cluster
                };
                (bucket, sub, rg, name, None)
            }
            Route::Pools { sub, rg, cluster } => (AksBucket::List, sub, rg, cluster, None),
            Route::Pool {
                sub,
                rg,
                cluster,
                pool,
            } => {
                let bucket = if method == "GET" {
                    AksBucket::List
                } else {
                    AksBucket::Pool
                };
                (bucket, sub, rg, cluster, Some(pool))
            }
            Route::PoolDeleteMachines {
                sub,
                rg,
                cluster,
                pool,
            } => (AksBucket::Pool, sub, rg, cluster, Some(pool)),
            _ => return None,
        };
        let handler = match (self, method) {
            (Route::Cluster { .. }, "GET") => "GetManagedClusterHandler.GET",
            (Route::Cluster { .. }, "PUT") => "PutManagedClusterHandler.PUT",
            (Route::Cluster { .. }, "PATCH") => "PatchManagedClusterHandler.PATCH",
            (Route::Cluster { .. }, _) => "DeleteManagedClusterHandler.DELETE",
            (Route::Pools { .. }, _) => "ListAgentPoolsHandler.GET",
            (Route::Pool { .. }, "GET") => "GetAgentPoolHandler.GET",
            (Route::Pool { .. }, "PUT") => "PutAgentPoolHandler.PUT",
            (Route::Pool { .. }, "PATCH") => "PatchAgentPoolHandler.PATCH",
            (Route::Pool { .. }, _) => "DeleteAgentPoolHandler.DELETE",
            _ => "DeleteMachinesHandler.POST",
        };
        let mut resource = format!("{sub}/{rg}/{cluster}");
        if let Some(p) = pool {
            resource = format!("{resource}/{p}");
        }
        Some(AksCharge {
            bucket,
            sub: sub.clone(),
            location: aks::cluster_location(d, sub, rg, cluster).unwrap_or_else(default_location),
            resource: resource.to_ascii_lowercase(),
            handler: handler.to_string(),
        })
    }

    fn allows(&self, method: &str) -> bool {
        match self {
            Route::VmssList { .. }
            | Route::VmssVms { .. }
            | Route::Pools { .. }
            | Route::Operation { .. }
            | Route::Usages { .. } => method == "GET",
            Route::VmssDeleteInstances { .. } | Route::PoolDeleteMachines { .. } => {
                method == "POST"
            }
            Route::Vmss { .. } | Route::Cluster { .. } | Route::Pool { .. } => {
                matches!(method, "GET" | "PUT" | "PATCH" | "DELETE")
            }
        }
    }
}

fn header(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `scheme://host` as the client addressed the emulator, so links work through any alias.
fn request_base(state: &EmulatorState, parts: &Parts) -> String {
    let base = state.base_url();
    let scheme = if base.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    match header(parts, "host") {
        Some(host) if !host.is_empty() => format!("{scheme}://{host}"),
        _ => base.to_string(),
    }
}

enum Outcome {
    Reply(Reply),
    Drop,
}

/// Handles one ARM request end to end and logs it.
pub(crate) async fn handle(state: &EmulatorState, parts: &Parts, body: Bytes) -> Reply {
    let method = parts.method.as_str().to_ascii_uppercase();
    let path = parts.uri.path().to_string();
    let if_match = header(parts, "if-match");
    let if_none_match = header(parts, "if-none-match");
    let body_capacity = if body.is_empty() {
        None
    } else {
        serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
            // A scale set's `sku.capacity`, an agent pool's `properties.count`.
            v.pointer("/sku/capacity")
                .or_else(|| v.pointer("/properties/count"))
                .and_then(Value::as_i64)
        })
    };
    let query: Vec<(String, String)> = parts
        .uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let now = Instant::now();
    let seq = {
        let mut d = state.lock();
        d.seq += 1;
        d.seq
    };
    let mut ctx = Ctx {
        writer: String::new(),
        seq,
        now,
        base: request_base(state, parts),
        api_version: String::new(),
        lro_failed: false,
        lro_error: None,
        lro_failed_zone: None,
        partial_delete: None,
        query,
        if_match: if_match.clone(),
    };
    let outcome = process(
        state,
        parts,
        &mut ctx,
        &method,
        &path,
        &body,
        if_match.as_deref(),
        if_none_match.as_deref(),
    )
    .await;
    let writer = (!ctx.writer.is_empty()).then(|| ctx.writer.clone());
    let mut record = RequestRecord {
        seq,
        method,
        path,
        if_match,
        if_none_match,
        status: 0,
        writer,
        body_capacity,
        user_agent: header(parts, "user-agent"),
        at: now,
        error: None,
    };
    match outcome {
        Outcome::Reply(mut reply) => {
            reply.push_header("x-ms-request-id", super::state::new_uuid());
            record.status = reply.status;
            record.error = match &reply.body {
                ReplyBody::Json(v) if reply.status >= 400 => v.get("error").map(|e| {
                    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    (text("code"), text("message"))
                }),
                // Accepted, and its operation will fail (as `operation` reports it).
                _ if ctx.lro_failed && reply.status < 300 => {
                    Some(ctx.lro_error.clone().unwrap_or_else(lro_default_error))
                }
                _ => None,
            };
            state.lock().log(record);
            reply
        }
        Outcome::Drop => {
            state.lock().log(record);
            match parts.extensions.get::<ConnKill>() {
                Some(kill) => kill.drop_connection().await,
                None => Reply::arm_error(500, "InternalServerError", "connection drop unavailable"),
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn process(
    state: &EmulatorState,
    parts: &Parts,
    ctx: &mut Ctx,
    method: &str,
    path: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Outcome {
    let settings = state.settings().clone();
    // Authentication first, as ARM does.
    let token = header(parts, "authorization").and_then(|h| {
        let (scheme, tok) = h.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| tok.trim().to_string())
    });
    let challenge = |error: &str| {
        format!(
            "Bearer authorization_uri=\"{}/{CHALLENGE_TENANT}\", error=\"invalid_token\", error_description=\"{error}\"",
            ctx.base
        )
    };
    let Some(token) = token else {
        return Outcome::Reply(
            Reply::arm_error(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
            .header("WWW-Authenticate", challenge("The access token is missing")),
        );
    };
    let info = state.lock().tokens.get(&token).cloned();
    match info {
        None => {
            return Outcome::Reply(
                Reply::arm_error(
                    401,
                    "AuthenticationFailed",
                    "Authentication failed. The access token is not one this emulator issued.",
                )
                .header("WWW-Authenticate", challenge("The access token is invalid")),
            )
        }
        Some(info) if ctx.now >= info.expires_at => {
            ctx.writer = info.subject;
            return Outcome::Reply(
                Reply::arm_error(
                    401,
                    "ExpiredAuthenticationToken",
                    "The access token expiry UTC time is earlier than current UTC time.",
                )
                .header(
                    "WWW-Authenticate",
                    challenge("The access token has expired"),
                ),
            );
        }
        Some(info) => ctx.writer = info.subject,
    }
    match ctx.query("api-version") {
        Some(v) if !v.trim().is_empty() => ctx.api_version = v.trim().to_string(),
        _ => {
            return Outcome::Reply(Reply::arm_error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            ))
        }
    }
    let Some(route) = Route::parse(path) else {
        return Outcome::Reply(Reply::arm_error(
            404,
            "InvalidResourceType",
            format!("The emulator does not serve the path '{path}'."),
        ));
    };
    if !route.allows(method) {
        return Outcome::Reply(Reply::arm_error(
            405,
            "MethodNotAllowed",
            format!("The method '{method}' is not allowed on '{path}'."),
        ));
    }
    let spend = if method == "GET" {
        if matches!(route, Route::VmssList { .. } | Route::VmssVms { .. }) {
            Spend::List
        } else {
            Spend::Read
        }
    } else if method == "DELETE" || path.ends_with("/delete") || path.ends_with("/deleteMachines") {
        Spend::Delete
    } else {
        Spend::Write
    };
    let admission = {
        let mut d = state.lock();
        let location = route.compute_location(&d);
        let vmss = route.vmss_key();
        let compute = location.as_deref().map(|location| ComputeTarget {
            location,
            vmss: vmss.as_deref(),
        });
        d.throttle.admit(
            settings.throttling.as_ref(),
            route.sub(),
            compute,
            spend,
            ctx.now,
        )
    };
    let with_limits = |mut reply: Reply| {
        for (n, v) in &admission.headers {
            reply.push_header(n, v.clone());
        }
        reply
    };
    if let Some(secs) = admission.retry_after {
        return Outcome::Reply(with_limits(
            Reply::arm_error(
                429,
                "TooManyRequests",
                format!("The request is being throttled; retry after {secs} seconds."),
            )
            .header("Retry-After", secs.to_string()),
        ));
    }
    // AKS's resource provider, once ARM has admitted (and charged) the request.
    let aks_refusal = {
        let mut d = state.lock();
        let limits = d.throttle.aks_limits(settings.aks_throttling);
        route.aks_charge(method, &d).and_then(|charge| {
            d.throttle
                .admit_aks(limits.as_ref(), &charge, ctx.now)
                .map(|secs| (charge, secs))
        })
    };
    if let Some((charge, secs)) = aks_refusal {
        return Outcome::Reply(with_limits(
            Reply::arm_error(429, "Throttled", charge.message(secs))
                .header("Retry-After", secs.to_string()),
        ));
    }

    let plan = faults::take(&mut state.lock().faults, method, path);
    if plan.latency_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(plan.latency_ms)).await;
        ctx.now = Instant::now();
    }
    match &plan.action {
        Some(FaultKind::Status {
            code,
            code_name,
            retry_after_secs,
        }) => {
            let (name, message) = faults::status_error(*code, code_name.as_deref());
            let mut reply = Reply::arm_error(*code, &name, message);
            let retry = retry_after_secs.or((*code == 429).then_some(1));
            if let Some(secs) = retry {
                reply.push_header("Retry-After", secs.to_string());
            }
            return Outcome::Reply(with_limits(reply));
        }
        Some(FaultKind::DropBeforeCommit) => return Outcome::Drop,
        Some(FaultKind::DeleteBeforeHandling) => {
            let mut d = state.lock();
            match &route {
                Route::Vmss { sub, rg, name }
                | Route::VmssVms { sub, rg, name }
                | Route::VmssDeleteInstances { sub, rg, name } => {
                    d.delete_scale_set(sub, rg, name);
                }
                Route::Cluster { sub, rg, name } => {
                    aks::delete_cluster_out_of_band(&mut d, sub, rg, name);
                }
                Route::Pool {
                    sub,
                    rg,
                    cluster,
                    pool,
                }
                | Route::PoolDeleteMachines {
                    sub,
                    rg,
                    cluster,
                    pool,
                } => {
                    aks::delete_pool_out_of_band(&mut d, sub, rg, cluster, pool);
                }
                _ => {}
            }
        }
        Some(FaultKind::PartialDelete {
            keep, leave_failed, ..
        }) => {
            ctx.lro_failed = true;
            ctx.partial_delete = Some((*keep, *leave_failed));
        }
        Some(FaultKind::LroFailed { code, zone }) => {
            ctx.lro_failed = true;
            ctx.lro_failed_zone.clone_from(zone);
            ctx.lro_error = code.clone().map(|c| {
                let message = faults::code_message(&c)
                    .unwrap_or("The long-running operation failed (injected fault).")
                    .to_string();
                (c, message)
            });
        }
        _ => {}
    }

    let mut reply = {
        let mut d = state.lock();
        execute(
            &mut d,
            &settings,
            ctx,
            &route,
            method,
            body,
            if_match,
            if_none_match,
        )
    };
    let success = (200..300).contains(&reply.status);
    match plan.action {
        Some(FaultKind::DropAfterCommit)
        | Some(FaultKind::PartialDelete {
            drop_answer: true, ..
        }) => return Outcome::Drop,
        Some(FaultKind::NoEtag) if success => {
            reply.remove_header("etag");
            if let ReplyBody::Json(Value::Object(map)) = &mut reply.body {
                strip_etags(map);
                // A LIST carries the ETags in its items.
                if let Some(Value::Array(items)) = map.get_mut("value") {
                    for item in items.iter_mut().filter_map(Value::as_object_mut) {
                        strip_etags(item);
                    }
                }
            }
        }
        Some(FaultKind::Truncate) if success => {
            let text = match &reply.body {
                ReplyBody::Json(v) => serde_json::to_string(v).unwrap_or_default(),
                ReplyBody::Text(t) => t.clone(),
                ReplyBody::RawJson(b) => String::from_utf8_lossy(b).into_owned(),
                ReplyBody::Empty => String::new(),
            };
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            reply.body = ReplyBody::Text(text[..cut].to_string());
        }
        _ => {}
    }
    if plan.answer_delay_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(plan.answer_delay_ms)).await;
    }
    Outcome::Reply(with_limits(reply))
}

/// Removes every place a resource carries its ETag in a body: a scale set's `etag`, a managed
/// cluster's `eTag` and its pool profiles' `eTag`, an agent pool's `properties.eTag`.
fn strip_etags(item: &mut serde_json::Map<String, Value>) {
    item.remove("etag");
    item.remove("eTag");
    if let Some(props) = item.get_mut("properties").and_then(Value::as_object_mut) {
        props.remove("eTag");
        if let Some(Value::Array(profiles)) = props.get_mut("agentPoolProfiles") {
            for p in profiles.iter_mut().filter_map(Value::as_object_mut) {
                p.remove("eTag");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn execute(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    route: &Route,
    method: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    match route {
        Route::VmssList { sub, rg } => vmss_list(d, s, ctx, sub, rg),
        Route::Vmss { sub, rg, name } => match method {
            "GET" => vmss_get(d, ctx, sub, rg, name),
            "PUT" => vmss_write(
                d,
                s,
                ctx,
                sub,
                rg,
                name,
                WriteKind::Put,
                body,
                if_match,
                if_none_match,
            ),
            "PATCH" => vmss_write(
                d,
                s,
                ctx,
                sub,
                rg,
                name,
                WriteKind::Patch,
                body,
                if_match,
                if_none_match,
            ),
            _ => vmss_write(
                d,
                s,
                ctx,
                sub,
                rg,
                name,
                WriteKind::Delete,
                body,
                if_match,
                if_none_match,
            ),
        },
        Route::VmssVms { sub, rg, name } => vmss_vms(d, s, ctx, sub, rg, name),
        Route::VmssDeleteInstances { sub, rg, name } => {
            vmss_delete_instances(d, s, ctx, sub, rg, name, body, if_match, if_none_match)
        }
        Route::Cluster { sub, rg, name } => aks::cluster(
            d,
            s,
            ctx,
            sub,
            rg,
            name,
            method,
            body,
            if_match,
            if_none_match,
        ),
        Route::Pools { sub, rg, cluster } => aks::pools(d, ctx, sub, rg, cluster),
        Route::Pool {
            sub,
            rg,
            cluster,
            pool,
        } => aks::pool(
            d,
            s,
            ctx,
            sub,
            rg,
            cluster,
            pool,
            method,
            body,
            if_match,
            if_none_match,
        ),
        Route::PoolDeleteMachines {
            sub,
            rg,
            cluster,
            pool,
        } => aks::delete_machines(
            d,
            s,
            ctx,
            sub,
            rg,
            cluster,
            pool,
            body,
            if_match,
            if_none_match,
        ),
        Route::Operation { id, .. } => operation(d, ctx, id),
        Route::Usages { sub, location } => {
            let rows = d.quota.usages(d.scale_sets.values(), sub, location);
            Reply::json(200, json!({ "value": rows }))
        }
    }
}

pub(crate) fn not_found(kind: &str, name: &str, rg: &str) -> Reply {
    Reply::arm_error(
        404,
        "ResourceNotFound",
        format!("The Resource '{kind}/{name}' under resource group '{rg}' was not found."),
    )
}

/// Adds `Azure-AsyncOperation`, `Location` and `Retry-After` for a new long-running operation.
pub(crate) fn add_lro_headers(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    reply: &mut Reply,
    sub: &str,
    provider: &str,
    location: &str,
) {
    let id = d.start_operation(s.lro_delay, ctx.lro_failed, ctx.now);
    if let Some(op) = d.operations.get_mut(&id) {
        op.error.clone_from(&ctx.lro_error);
    }
    let loc: String = location
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    let url = format!(
        "{}/subscriptions/{sub}/providers/{provider}/locations/{loc}/operations/{id}?api-version={}",
        ctx.base, ctx.api_version
    );
    reply.push_header("Location", format!("{url}&monitor=true"));
    reply.push_header("Azure-AsyncOperation", url);
    let retry = if s.lro_delay.is_zero() { "0" } else { "1" };
    reply.push_header("Retry-After", retry);
}

/// One page of `items` with an absolute `nextLink` back to this emulator when more remain.
pub(crate) fn page(ctx: &Ctx, path: &str, items: Vec<Value>, page_size: usize) -> Value {
    let skip: usize = ctx
        .query("$skiptoken")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let total = items.len();
    let value: Vec<Value> = items.into_iter().skip(skip).take(page_size).collect();
    let next = skip + value.len();
    let mut out = json!({ "value": value });
    if next < total {
        out["nextLink"] = Value::String(format!(
            "{}{path}?api-version={}&$skiptoken={next}",
            ctx.base, ctx.api_version
        ));
    }
    out
}

fn vmss_get(d: &mut Data, ctx: &Ctx, sub: &str, rg: &str, name: &str) -> Reply {
    let key = vmss_key(sub, rg, name);
    let Some(ss) = d.scale_sets.get(&key) else {
        return not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg);
    };
    let etag = ss.etag();
    let body = ss.to_json(ctx.now);
    d.mark_seen(&ctx.writer, &key, &etag);
    Reply::json(200, body).header("ETag", etag)
}

fn vmss_list(d: &mut Data, s: &Settings, ctx: &Ctx, sub: &str, rg: &str) -> Reply {
    let prefix = vmss_key(sub, rg, "");
    let mut keys: Vec<&String> = d
        .scale_sets
        .keys()
        .filter(|k| k.starts_with(&prefix))
        .collect();
    keys.sort();
    let items: Vec<(String, String, Value)> = keys
        .into_iter()
        .filter_map(|k| {
            d.scale_sets
                .get(k)
                .map(|ss| (k.clone(), ss.etag(), ss.to_json(ctx.now)))
        })
        .collect();
    let skip: usize = ctx
        .query("$skiptoken")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    for (key, etag, _) in items.iter().skip(skip).take(s.page_size) {
        d.mark_seen(&ctx.writer, key, etag);
    }
    let path = format!(
        "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets"
    );
    let values = items.into_iter().map(|(_, _, v)| v).collect();
    Reply::json(200, page(ctx, &path, values, s.page_size))
}

fn vmss_vms(d: &mut Data, s: &Settings, ctx: &Ctx, sub: &str, rg: &str, name: &str) -> Reply {
    let Some(ss) = d.scale_sets.get(&vmss_key(sub, rg, name)) else {
        return not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg);
    };
    let view = ctx
        .query("$expand")
        .is_some_and(|e| e.eq_ignore_ascii_case("instanceView"));
    let items: Vec<Value> = ss
        .instances
        .iter()
        .map(|(id, inst)| ss.instance_json(*id, inst, ctx.now, view))
        .collect();
    let path = format!("{}/virtualMachines", ss.id());
    Reply::json(200, page(ctx, &path, items, s.page_size))
}

/// Fields of a scale-set PUT/PATCH body; absent fields keep their value.
#[derive(Default)]
struct VmssBody {
    location: Option<String>,
    sku_name: Option<String>,
    tier: Option<String>,
    capacity: Option<i64>,
    tags: Option<BTreeMap<String, String>>,
    /// `zones`, read on create only (Azure does not move a scale set between zones).
    zones: Vec<String>,
    /// `properties.virtualMachineProfile.priority` and `.evictionPolicy`, read on create only.
    priority: Option<String>,
    eviction_policy: Option<String>,
}

fn invalid_content(msg: impl Into<String>) -> Reply {
    Reply::arm_error(400, "InvalidRequestContent", msg)
}

fn invalid_param(msg: impl Into<String>) -> Reply {
    Reply::arm_error(400, "InvalidParameter", msg)
}

/// Parses `sku.capacity`-style integers: a JSON integer in 0..=1000.
pub(crate) fn parse_count(v: &Value, what: &str) -> Result<i64, Reply> {
    match v.as_i64() {
        Some(n) if (0..=MAX_CAPACITY).contains(&n) => Ok(n),
        _ => Err(invalid_param(format!(
            "The value {v} of '{what}' is invalid: it must be an integer between 0 and {MAX_CAPACITY}."
        ))),
    }
}

pub(crate) fn parse_json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Reply> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid_content(
            "The request content must be a JSON object.",
        )),
        Err(e) => Err(invalid_content(format!(
            "The request content was invalid and could not be deserialized: {e}."
        ))),
    }
}

pub(crate) fn parse_tags(v: &Value) -> Result<Option<BTreeMap<String, String>>, Reply> {
    match v {
        Value::Null => Ok(None),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(invalid_param(format!(
                    "The value {other} of tag '{k}' must be a string."
                ))),
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
            .map(Some),
        other => Err(invalid_param(format!(
            "'tags' must be an object, got {other}."
        ))),
    }
}

fn parse_vmss_body(body: &[u8]) -> Result<VmssBody, Reply> {
    let m = parse_json_object(body)?;
    let mut out = VmssBody::default();
    if let Some(loc) = m.get("location") {
        match loc {
            Value::String(s) => out.location = Some(s.clone()),
            Value::Null => {}
            other => {
                return Err(invalid_param(format!(
                    "'location' must be a string, got {other}."
                )))
            }
        }
    }
    if let Some(tags) = m.get("tags") {
        out.tags = parse_tags(tags)?;
    }
    match m.get("sku") {
        None | Some(Value::Null) => {}
        Some(Value::Object(sku)) => {
            out.sku_name = sku.get("name").and_then(Value::as_str).map(str::to_string);
            out.tier = sku.get("tier").and_then(Value::as_str).map(str::to_string);
            match sku.get("capacity") {
                None | Some(Value::Null) => {}
                Some(c) => out.capacity = Some(parse_count(c, "sku.capacity")?),
            }
        }
        Some(other) => {
            return Err(invalid_param(format!(
                "'sku' must be an object, got {other}."
            )))
        }
    }
    match m.get("zones") {
        None | Some(Value::Null) => {}
        Some(Value::Array(zs)) => {
            for z in zs {
                match z.as_str() {
                    Some(z) => out.zones.push(z.to_string()),
                    None => {
                        return Err(invalid_param(format!(
                            "'zones' must be an array of strings, got {z} in it."
                        )))
                    }
                }
            }
        }
        Some(other) => {
            return Err(invalid_param(format!(
                "'zones' must be an array of strings, got {other}."
            )))
        }
    }
    let profile = m
        .get("properties")
        .and_then(|p| p.get("virtualMachineProfile"));
    let text = |key: &str| -> Result<Option<String>, Reply> {
        match profile.and_then(|p| p.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(invalid_param(format!(
                "'properties.virtualMachineProfile.{key}' must be a string, got {other}."
            ))),
        }
    };
    out.priority = text("priority")?;
    if let Some(p) = &out.priority {
        if !["Regular", "Spot", "Low"]
            .iter()
            .any(|k| k.eq_ignore_ascii_case(p))
        {
            return Err(invalid_param(format!(
                "The value '{p}' of 'properties.virtualMachineProfile.priority' is invalid: expected Regular, Spot or Low."
            )));
        }
    }
    out.eviction_policy = text("evictionPolicy")?;
    Ok(out)
}

pub(crate) fn same_location(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase()
    };
    norm(a) == norm(b)
}

#[allow(clippy::too_many_arguments)]
fn vmss_write(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    sub: &str,
    rg: &str,
    name: &str,
    kind: WriteKind,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    if let Err(r) = prevalidate(if_match, if_none_match) {
        return r;
    }
    let parsed = match kind {
        WriteKind::Delete => VmssBody::default(),
        _ => match parse_vmss_body(body) {
            Ok(p) => p,
            Err(r) => return r,
        },
    };
    let key = vmss_key(sub, rg, name);
    let current = d.scale_sets.get(&key).map(|ss| ss.etag());
    let decision = decide(kind, if_match, if_none_match, current.as_deref(), || {
        not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg)
    });
    let busy_until = ctx.now + s.lro_delay;
    match decision {
        Decision::Answer(r) => r,
        Decision::Create => {
            let Some(location) = parsed.location else {
                return Reply::arm_error(
                    400,
                    "LocationRequired",
                    "The location property is required for this definition.",
                );
            };
            let mut seed = ScaleSetSeed::new(sub, rg, name, parsed.capacity.unwrap_or(0));
            seed.location = location;
            if let Some(n) = parsed.sku_name {
                seed.sku_name = n;
            }
            if let Some(t) = parsed.tier {
                seed.tier = t;
            }
            seed.tags = parsed.tags.unwrap_or_default();
            seed.zones = parsed.zones;
            seed.priority = parsed.priority;
            seed.eviction_policy = parsed.eviction_policy;
            let etag = d.create_scale_set(seed, &ctx.writer, busy_until, ctx.lro_failed);
            d.mark_seen(&ctx.writer, &key, &etag);
            let Some(ss) = d.scale_sets.get(&key) else {
                return Reply::arm_error(500, "InternalServerError", "created scale set vanished");
            };
            let location = ss.location.clone();
            let mut reply = Reply::json(201, ss.to_json(ctx.now)).header("ETag", etag);
            add_lro_headers(d, s, ctx, &mut reply, sub, "Microsoft.Compute", &location);
            reply
        }
        Decision::Update if kind == WriteKind::Delete => {
            let Some(ss) = d.scale_sets.remove(&key) else {
                return Reply::empty(204);
            };
            let old_etag = ss.etag();
            d.check_lost(
                &ctx.writer,
                &key,
                &ss.id(),
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            d.next_version(&key);
            let mut reply = Reply::empty(200);
            add_lro_headers(
                d,
                s,
                ctx,
                &mut reply,
                sub,
                "Microsoft.Compute",
                &ss.location,
            );
            reply
        }
        Decision::Update => {
            let Some(ss) = d.scale_sets.get_mut(&key) else {
                return Reply::arm_error(500, "InternalServerError", "scale set vanished");
            };
            if let Some(loc) = &parsed.location {
                if !same_location(loc, &ss.location) {
                    return invalid_param(format!(
                        "The location '{loc}' does not match the scale set's location '{}'; a resource cannot move.",
                        ss.location
                    ));
                }
            }
            // Quota first: a refused write changes nothing.
            let growth = parsed.capacity.unwrap_or(ss.capacity) - ss.capacity;
            let location = ss.location.clone();
            let spot = ss.spot();
            let sku = parsed
                .sku_name
                .clone()
                .unwrap_or_else(|| ss.sku_name.clone());
            if let Err(refused) =
                d.quota
                    .check_growth(d.scale_sets.values(), sub, &location, &sku, spot, growth)
            {
                return refused;
            }
            let Some(ss) = d.scale_sets.get_mut(&key) else {
                return Reply::arm_error(500, "InternalServerError", "scale set vanished");
            };
            let old_etag = ss.etag();
            let old_cap = ss.capacity;
            let old_tags = ss.tags.clone();
            if let Some(n) = parsed.sku_name {
                ss.sku_name = n;
            }
            if let Some(t) = parsed.tier {
                ss.tier = t;
            }
            if let Some(t) = parsed.tags {
                ss.tags = t;
            }
            let new_cap = parsed.capacity.unwrap_or(ss.capacity);
            ss.busy_until = busy_until;
            ss.failed = ctx.lro_failed;
            let first_new = ss.next_instance;
            ss.resize(new_cap, busy_until);
            if let Some(zone) = &ctx.lro_failed_zone {
                // A partial allocation: only the zone that ran short leaves its VMs Failed.
                for (_, inst) in ss.instances.range_mut(first_new..) {
                    if inst.zone.as_deref() != Some(zone.as_str()) {
                        inst.failed = false;
                    }
                }
            }
            let change = describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags);
            let id = ss.id();
            d.check_lost(
                &ctx.writer,
                &key,
                &id,
                &old_etag,
                ctx.seq,
                ctx.if_match.as_deref(),
            );
            commit_vmss_version(d, s, ctx, &key, sub, change, 200)
        }
    }
}

/// Bumps the version after a successful write and answers with the new state.
fn commit_vmss_version(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    key: &str,
    sub: &str,
    change: String,
    status: u16,
) -> Reply {
    let version = d.next_version(key);
    let Some(ss) = d.scale_sets.get_mut(key) else {
        return Reply::arm_error(500, "InternalServerError", "scale set vanished");
    };
    ss.version = version;
    let etag = ss.etag();
    let location = ss.location.clone();
    let body = ss.to_json(ctx.now);
    d.record_version(key, &etag, &ctx.writer, change);
    d.mark_seen(&ctx.writer, key, &etag);
    let mut reply = if status == 202 {
        Reply::empty(202)
    } else {
        Reply::json(status, body)
    }
    .header("ETag", etag);
    add_lro_headers(d, s, ctx, &mut reply, sub, "Microsoft.Compute", &location);
    reply
}

/// `POST {vmss}/delete`: deletes exactly the named instances and lowers the capacity by as many.
/// Preconditions are evaluated as on a PUT of an existing scale set (ARM documents `If-Match`
/// only for PUT/PATCH; the emulator enforces it here too, so a stale delete is a 412 and
/// changes nothing). An id the scale set does not have is ARM's 400 `InvalidParameter`
/// ("The provided instanceId 7 is not an active Virtual Machine Scale Set VM instanceId.",
/// target `instanceIds`), and nothing is deleted.
#[allow(clippy::too_many_arguments)]
fn vmss_delete_instances(
    d: &mut Data,
    s: &Settings,
    ctx: &Ctx,
    sub: &str,
    rg: &str,
    name: &str,
    body: &[u8],
    if_match: Option<&str>,
    if_none_match: Option<&str>,
) -> Reply {
    let m = match parse_json_object(body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let ids: Vec<(String, Option<u64>)> = match m.get("instanceIds") {
        Some(Value::Array(a)) if !a.is_empty() => {
            let parsed: Option<Vec<(String, Option<u64>)>> = a
                .iter()
                .map(|v| v.as_str().map(|s| (s.to_string(), s.trim().parse().ok())))
                .collect();
            match parsed {
                Some(p) => p,
                None => {
                    return invalid_param("'instanceIds' must be a list of instance id strings.")
                }
            }
        }
        _ => return invalid_param("'instanceIds' must be a non-empty list of instance ids."),
    };
    let key = vmss_key(sub, rg, name);
    let current = d.scale_sets.get(&key).map(|ss| ss.etag());
    match decide(
        WriteKind::Patch,
        if_match,
        if_none_match,
        current.as_deref(),
        || not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg),
    ) {
        Decision::Answer(r) => return r,
        Decision::Create | Decision::Update => {}
    }
    let Some(ss) = d.scale_sets.get_mut(&key) else {
        return not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg);
    };
    let mut victims = std::collections::BTreeSet::new();
    for (raw, id) in &ids {
        match id.filter(|id| ss.instances.contains_key(id)) {
            Some(id) => {
                victims.insert(id);
            }
            None => {
                return Reply::json(
                    400,
                    json!({"error": {
                        "code": "InvalidParameter",
                        "message": format!("The provided instanceId {raw} is not an active Virtual Machine Scale Set VM instanceId."),
                        "target": "instanceIds",
                    }}),
                )
            }
        }
    }
    let old_etag = ss.etag();
    let old_cap = ss.capacity;
    let old_tags = ss.tags.clone();
    // `PartialDelete`: the last `keep` named instances stay (left `Failed` if asked).
    if let Some((keep, leave_failed)) = ctx.partial_delete {
        for _ in 0..keep {
            let Some(id) = victims.pop_last() else { break };
            if let Some(inst) = ss.instances.get_mut(&id) {
                inst.failed |= leave_failed;
            }
        }
    }
    let removed = remove_instances(ss, &victims);
    ss.busy_until = ctx.now + s.lro_delay;
    // A partial delete fails its operation, not the scale set.
    ss.failed = ctx.lro_failed && ctx.partial_delete.is_none();
    let deletion = super::state::InstanceDeletion {
        seq: ctx.seq,
        writer: ctx.writer.clone(),
        scale_set: ss.name.clone(),
        pool: None,
        machines: victims
            .iter()
            .map(|id| crate::sim::nodes::node_name(&ss.name, *id))
            .collect(),
        capacity_after: ss.capacity,
    };
    let change = format!(
        "{} ({removed} instances deleted)",
        describe_change(Some((old_cap, &old_tags)), ss.capacity, &ss.tags)
    );
    let id = ss.id();
    d.check_lost(
        &ctx.writer,
        &key,
        &id,
        &old_etag,
        ctx.seq,
        ctx.if_match.as_deref(),
    );
    d.deletions.push(deletion);
    commit_vmss_version(d, s, ctx, &key, sub, change, 202)
}

/// Removes exactly the instances `ids` (those it has) and lowers the capacity by as many;
/// returns how many went.
pub(crate) fn remove_instances(
    ss: &mut super::state::ScaleSet,
    ids: &std::collections::BTreeSet<u64>,
) -> i64 {
    let mut removed = 0;
    for id in ids {
        if ss.instances.remove(id).is_some() {
            removed += 1;
        }
    }
    ss.capacity = (ss.capacity - removed).max(0);
    removed
}

/// What a failed operation reports when its fault named no error.
fn lro_default_error() -> (String, String) {
    (
        "InternalExecutionError".into(),
        "The long-running operation failed (injected fault).".into(),
    )
}

fn operation(d: &mut Data, ctx: &Ctx, id: &str) -> Reply {
    let Some(op) = d.operations.get(id) else {
        return Reply::arm_error(
            404,
            "NotFound",
            format!("The operation '{id}' was not found."),
        );
    };
    let done = ctx.now >= op.done_at;
    let monitor = ctx
        .query("monitor")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if monitor {
        return if done {
            Reply::empty(200)
        } else {
            Reply::empty(202).header("Retry-After", "1")
        };
    }
    let status = match (done, op.failed) {
        (false, _) => "InProgress",
        (true, false) => "Succeeded",
        (true, true) => "Failed",
    };
    let mut body = json!({"startTime": rfc3339(op.start), "status": status, "name": id});
    if done {
        body["endTime"] = Value::String(rfc3339(op.start + op.delay));
    }
    if done && op.failed {
        let (code, message) = op.error.clone().unwrap_or_else(lro_default_error);
        body["error"] = json!({ "code": code, "message": message });
    }
    let mut reply = Reply::json(200, body);
    if !done {
        reply.push_header("Retry-After", "1");
    }
    reply
}

/// An out-of-band ARM request by a rival writer (a test's or the demo's): routed and answered
/// exactly like a request on the wire (the conditional-request table, versions, lost-update
/// tracking under `writer`), but never faulted, throttled or logged, so a schedule's injected
/// faults hit only the client under test. Returns the status and the JSON body (`Null` if none).
pub(crate) fn rival_request(
    state: &EmulatorState,
    writer: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    if_match: Option<&str>,
) -> (u16, Value) {
    let Some(route) = Route::parse(path) else {
        return (404, Value::Null);
    };
    let settings = state.settings().clone();
    let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let mut d = state.lock();
    d.seq += 1;
    let ctx = Ctx {
        writer: writer.to_string(),
        seq: d.seq,
        now: Instant::now(),
        base: "http://127.0.0.1".into(),
        api_version: "2024-09-01".into(),
        lro_failed: false,
        lro_error: None,
        lro_failed_zone: None,
        partial_delete: None,
        query: Vec::new(),
        if_match: if_match.map(str::to_string),
    };
    let reply = execute(
        &mut d, &settings, &ctx, &route, method, &body, if_match, None,
    );
    let json = match reply.body {
        super::ReplyBody::Json(v) => v,
        _ => Value::Null,
    };
    (reply.status, json)
}
