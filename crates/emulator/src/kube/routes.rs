//! Paths and verbs: parses `/api/v1/...` and `/apis/<group>/<version>/...`, then answers GET,
//! LIST, WATCH, POST (create, binding, eviction), PUT, PATCH and DELETE.

use std::collections::HashMap;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::request::Parts;
use http::Method;
use serde_json::{json, Value};

use super::resources::{self, ResourceType};
use super::select::Selector;
use super::status::{self, KubeError};
use super::store::name_of;
use super::{discovery, eviction, patch, table, watch, KubeState};
use crate::server::Reply;

/// What a path names.
#[derive(Debug, PartialEq)]
enum Target<'a> {
    /// `/api/v1` or `/apis/g/v`: the resource list.
    Discovery { group: &'a str, version: &'a str },
    /// A collection, in a namespace or across all.
    Collection {
        rt: &'static ResourceType,
        namespace: Option<&'a str>,
    },
    /// One object, maybe a subresource of it.
    Item {
        rt: &'static ResourceType,
        namespace: &'a str,
        name: &'a str,
        sub: Option<&'a str>,
    },
}

fn parse_target<'a>(segs: &[&'a str]) -> Option<Target<'a>> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let find = |plural: &str| resources::find(group, version, plural);
    match rest {
        [] => Some(Target::Discovery { group, version }),
        ["namespaces", ns, plural, tail @ ..] if find(plural).is_some_and(|r| r.namespaced) => {
            let rt = find(plural)?;
            match tail {
                [] => Some(Target::Collection {
                    rt,
                    namespace: Some(ns),
                }),
                [name] => Some(Target::Item {
                    rt,
                    namespace: ns,
                    name,
                    sub: None,
                }),
                [name, sub] => Some(Target::Item {
                    rt,
                    namespace: ns,
                    name,
                    sub: Some(sub),
                }),
                _ => None,
            }
        }
        [plural, tail @ ..] => {
            let rt = find(plural)?;
            match tail {
                [] => Some(Target::Collection {
                    rt,
                    namespace: None,
                }),
                [name] if !rt.namespaced => Some(Target::Item {
                    rt,
                    namespace: "",
                    name,
                    sub: None,
                }),
                [name, sub] if !rt.namespaced => Some(Target::Item {
                    rt,
                    namespace: "",
                    name,
                    sub: Some(sub),
                }),
                _ => None,
            }
        }
    }
}

/// The resource (its plural) a Kubernetes path addresses, if it names one.
pub(crate) fn resource_of(path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match parse_target(&segs)? {
        Target::Discovery { .. } => None,
        Target::Collection { rt, .. } | Target::Item { rt, .. } => Some(rt.plural),
    }
}

fn query(parts: &Parts) -> HashMap<String, String> {
    parts
        .uri
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

fn truthy(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("1" | "true" | "True"))
}

fn ok(status: u16, body: Value) -> Result<Response, KubeError> {
    Ok(Reply::json(status, body).into_response())
}

fn parse_json(body: &[u8]) -> Result<Value, KubeError> {
    serde_json::from_slice(body)
        .map_err(|e| status::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn parse_rv(s: &str) -> Result<u64, KubeError> {
    s.parse().map_err(|_| {
        status::bad_request(format!(
            "invalid resourceVersion {s:?}: not a non-negative integer"
        ))
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

/// Answers one Kubernetes API request (authentication already checked).
pub(crate) fn handle(kube: &KubeState, parts: &Parts, body: &[u8]) -> Result<Response, KubeError> {
    let path = parts.uri.path();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api"] => return ok(200, discovery::api_versions(&kube.server_address)),
        ["apis"] => return ok(200, discovery::api_group_list()),
        ["apis", g] => {
            return discovery::api_group(g).map_or_else(|| Err(status::no_route()), |v| ok(200, v))
        }
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] => {
            return self_subject_access_review(kube, parts, body)
        }
        _ => {}
    }
    let target = parse_target(&segs).ok_or_else(status::no_route)?;
    let q = query(parts);
    let method = &parts.method;
    match target {
        Target::Discovery { group, version } => {
            if *method != Method::GET {
                return Err(status::method_not_allowed());
            }
            discovery::resource_list(group, version)
                .map_or_else(|| Err(status::no_route()), |v| ok(200, v))
        }
        Target::Collection { rt, namespace } => collection(kube, parts, rt, namespace, &q, body),
        Target::Item {
            rt,
            namespace,
            name,
            sub,
        } => item(kube, parts, rt, namespace, name, sub, body),
    }
}

/// `kubectl auth can-i`'s API: the emulator's one user may do everything, except read what
/// [`KubeState::forbid_reads`] took away (as after an RBAC change).
fn self_subject_access_review(
    kube: &KubeState,
    parts: &Parts,
    body: &[u8],
) -> Result<Response, KubeError> {
    if parts.method != Method::POST {
        return Err(status::method_not_allowed());
    }
    let mut review = parse_json(body)?;
    if !review.is_object() {
        return Err(status::bad_request(
            "a SelfSubjectAccessReview is a JSON object".to_string(),
        ));
    }
    let attrs = &review["spec"]["resourceAttributes"];
    let verb = attrs["verb"].as_str().unwrap_or_default();
    let resource = attrs["resource"].as_str().unwrap_or_default();
    let denied = match verb {
        "get" | "list" => kube.list_forbidden(resource),
        "watch" => kube.watch_forbidden(resource),
        _ => false,
    };
    review["status"] = if denied {
        json!({"allowed": false, "reason": format!("the emulator forbids reading {resource}")})
    } else {
        json!({"allowed": true, "reason": "the emulator's one user may do anything"})
    };
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    ok(201, review)
}

fn collection(
    kube: &KubeState,
    parts: &Parts,
    rt: &'static ResourceType,
    namespace: Option<&str>,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Result<Response, KubeError> {
    match parts.method {
        Method::GET => {
            let selector = Selector::parse(
                rt,
                q.get("labelSelector").map(String::as_str),
                q.get("fieldSelector").map(String::as_str),
            )?;
            let rv = q
                .get("resourceVersion")
                .filter(|s| !s.is_empty())
                .map(|s| parse_rv(s))
                .transpose()?;
            if truthy(q, "watch") && kube.watch_forbidden(rt.plural) {
                return Err(status::forbidden(rt, "watch"));
            }
            if !truthy(q, "watch") && kube.list_forbidden(rt.plural) {
                return Err(status::forbidden(rt, "list"));
            }
            if truthy(q, "watch") {
                let timeout = q
                    .get("timeoutSeconds")
                    .and_then(|s| s.parse::<u64>().ok())
                    .map(Duration::from_secs);
                let oldest = kube.store.lock().oldest_servable();
                kube.log_watch(super::WatchStart {
                    plural: rt.plural.to_string(),
                    from: rv,
                    gone: rv.is_some_and(|from| from != 0 && from < oldest),
                });
                return Ok(watch::start(
                    &kube.store,
                    watch::WatchRequest {
                        rt,
                        namespace: namespace.map(str::to_string),
                        selector,
                        from: rv,
                        bookmarks: truthy(q, "allowWatchBookmarks"),
                        timeout,
                        bookmark_interval: kube.bookmark_interval,
                        cut: Some(kube.forbidden.subscribe()),
                        stall: Some(kube.stalled.subscribe()),
                        table: table::wanted(parts).map(|v| {
                            (
                                v,
                                table::Include::parse(q.get("includeObject").map(String::as_str)),
                            )
                        }),
                    },
                ));
            }
            list(kube, rt, namespace, &selector, rv, q, table::wanted(parts))
        }
        Method::POST => {
            let ns = namespace.unwrap_or("");
            if rt.namespaced && namespace.is_none() {
                return Err(status::method_not_allowed());
            }
            let mut obj = parse_json(body)?;
            if rt.plural == "pods" && rt.group.is_empty() {
                // The real server drops a new pod's status: it starts Pending.
                if let Some(m) = obj.as_object_mut() {
                    m.remove("status");
                }
            }
            let created = kube.store.lock().create(rt, ns, obj)?;
            ok(201, created)
        }
        Method::DELETE => {
            let selector = Selector::parse(
                rt,
                q.get("labelSelector").map(String::as_str),
                q.get("fieldSelector").map(String::as_str),
            )?;
            let mut store = kube.store.lock();
            let page = store.list(rt, namespace, &selector, None, None);
            let mut items = Vec::new();
            for obj in page.items {
                let ns = obj
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                if let Some(name) = name_of(&obj).map(str::to_string) {
                    items.push(store.delete(rt, &ns, &name, None)?);
                }
            }
            let rv = store.resource_version();
            ok(200, list_body(rt, rv, items, None, None))
        }
        _ => Err(status::method_not_allowed()),
    }
}

fn list_body(
    rt: &ResourceType,
    rv: u64,
    items: Vec<Value>,
    cont: Option<String>,
    remaining: Option<usize>,
) -> Value {
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut o| {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        if let Some(n) = remaining {
            meta["remainingItemCount"] = json!(n);
        }
    }
    json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.group_version(), "metadata": meta, "items": items})
}

fn list(
    kube: &KubeState,
    rt: &'static ResourceType,
    namespace: Option<&str>,
    selector: &Selector,
    rv: Option<u64>,
    q: &HashMap<String, String>,
    as_table: Option<&'static str>,
) -> Result<Response, KubeError> {
    let limit = q
        .get("limit")
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let store = kube.store.lock();
    if let Some(want) = rv {
        if want > store.resource_version() {
            return Err(status::failure(
                504,
                "Timeout",
                format!(
                    "Timeout: Too large resource version: {want}, current: {}",
                    store.resource_version()
                ),
                Some(
                    json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                ),
            ));
        }
    }
    let after = match q.get("continue").filter(|s| !s.is_empty()) {
        None => None,
        Some(token) => {
            let bad = || {
                status::bad_request("continue key is not valid: the emulator could not decode it")
            };
            let raw = base64::engine::general_purpose::STANDARD
                .decode(token)
                .map_err(|_| bad())?;
            let t: ContinueToken = serde_json::from_slice(&raw).map_err(|_| bad())?;
            if t.rv < store.oldest_servable() {
                return Err(status::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            Some(t.start)
        }
    };
    let page = store.list_borrowed(rt, namespace, selector, after.as_deref(), limit);
    let cont = page.next.clone().map(|start| {
        let t = ContinueToken {
            v: "meta.k8s.io/v1".to_string(),
            rv: page.rv,
            start,
        };
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&t).unwrap_or_default())
    });
    if let Some(api_version) = as_table {
        let envelope = list_body(rt, page.rv, Vec::new(), cont, page.remaining);
        let decorated: Vec<Value> = page
            .items
            .iter()
            .map(|item| decorate(&store, rt, (*item).clone()))
            .collect();
        let refs: Vec<&Value> = decorated.iter().collect();
        let include = table::Include::parse(q.get("includeObject").map(String::as_str));
        return ok(
            200,
            table::table(
                rt,
                api_version,
                &refs,
                envelope["metadata"].clone(),
                include,
            ),
        );
    }
    // Written straight from the store, in `list_body`'s shape: a page of a large collection is
    // neither copied nor built as a value first.
    // A guess at the page's size (a pod is a few KiB), bounded: an unpaged LIST reserves no more.
    let mut out: Vec<u8> = Vec::with_capacity(page.items.len().min(1000) * 4096 + 512);
    let envelope = list_body(rt, page.rv, Vec::new(), cont, page.remaining);
    out.extend_from_slice(br#"{"apiVersion":"#);
    write_json(&mut out, &envelope["apiVersion"]);
    out.extend_from_slice(br#","items":["#);
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if rt.plural == "poddisruptionbudgets" {
            write_item(&mut out, &decorate(&store, rt, (*item).clone()));
        } else {
            write_item(&mut out, item);
        }
    }
    out.extend_from_slice(br#"],"kind":"#);
    write_json(&mut out, &envelope["kind"]);
    out.extend_from_slice(br#","metadata":"#);
    write_json(&mut out, &envelope["metadata"]);
    out.push(b'}');
    Ok(Reply::raw_json(200, out).into_response())
}

/// Serializes `v` onto `out` (into memory: it cannot fail).
fn write_json(out: &mut Vec<u8>, v: &impl serde::Serialize) {
    if let Err(e) = serde_json::to_writer(&mut *out, v) {
        tracing::error!(error = %e, "a JSON value did not serialize");
    }
}

/// A list item: the object without `kind` and `apiVersion` (the list carries them).
fn write_item(out: &mut Vec<u8>, obj: &Value) {
    let Some(map) = obj.as_object() else {
        write_json(out, obj);
        return;
    };
    out.push(b'{');
    let mut first = true;
    for (k, v) in map {
        if k == "kind" || k == "apiVersion" {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        write_json(out, k);
        out.push(b':');
        write_json(out, v);
    }
    out.push(b'}');
}

/// What a real cluster's controllers would have added to `obj` by the time it is read: the
/// status of a PodDisruptionBudget.
fn decorate(store: &super::store::Store, rt: &ResourceType, obj: Value) -> Value {
    if rt.plural == "poddisruptionbudgets" {
        eviction::with_status(store, obj)
    } else {
        obj
    }
}

fn content_type(parts: &Parts) -> &str {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn item(
    kube: &KubeState,
    parts: &Parts,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    sub: Option<&str>,
    body: &[u8],
) -> Result<Response, KubeError> {
    let is_pod = rt.plural == "pods" && rt.group.is_empty();
    match (sub, &parts.method) {
        (None | Some("status"), &Method::GET) => {
            let store = kube.store.lock();
            let obj = decorate(&store, rt, store.get(rt, namespace, name)?);
            if let Some(api_version) = table::wanted(parts) {
                let meta = json!({"resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))});
                let include =
                    table::Include::parse(query(parts).get("includeObject").map(String::as_str));
                return ok(200, table::table(rt, api_version, &[&obj], meta, include));
            }
            ok(200, obj)
        }
        (None | Some("status"), &Method::PUT) => {
            let obj = parse_json(body)?;
            ok(
                200,
                kube.store.lock().update(rt, namespace, name, obj, sub)?,
            )
        }
        (None | Some("status"), &Method::PATCH) => {
            let ct = content_type(parts)
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let p = parse_json(body)?;
            let mut store = kube.store.lock();
            let mut obj = store.get(rt, namespace, name)?;
            match ct.as_str() {
                "application/merge-patch+json" => patch::merge_patch(&mut obj, &p),
                "application/strategic-merge-patch+json" => {
                    patch::strategic_merge_patch(&mut obj, &p)
                }
                other => return Err(status::unsupported_media_type(other)),
            }
            if sub == Some("status") {
                // Only the status of a status patch counts.
                let cur = store.get(rt, namespace, name)?;
                let mut only_status = cur;
                only_status["status"] = obj.get("status").cloned().unwrap_or(json!({}));
                if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
                    only_status["metadata"]["resourceVersion"] = rv.clone();
                }
                obj = only_status;
            }
            ok(200, store.update(rt, namespace, name, obj, sub)?)
        }
        (None, &Method::DELETE) => {
            let precondition = if body.is_empty() {
                None
            } else {
                parse_json(body)?
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let mut store = kube.store.lock();
            let gone = if is_pod {
                eviction::delete_pod(&mut store, namespace, name, precondition.as_deref())?
            } else {
                store.delete(rt, namespace, name, precondition.as_deref())?
            };
            ok(200, gone)
        }
        (Some("binding"), &Method::POST) if is_pod => {
            let b = parse_json(body)?;
            let node = b
                .pointer("/target/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| status::invalid(rt, name, "target.name", "Required value"))?;
            let mut store = kube.store.lock();
            let mut pod = store.get(rt, namespace, name)?;
            if let Some(current) = pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                let mut e = status::conflict(rt, name);
                e.status["message"] = json!(format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{current}\""
                ));
                return Err(e);
            }
            pod["spec"]["nodeName"] = json!(node);
            store.update(rt, namespace, name, pod, None)?;
            ok(201, status::success(201))
        }
        (Some("eviction"), &Method::POST) if is_pod => {
            let mut preconditions = eviction::Preconditions::default();
            if !body.is_empty() {
                let eviction = parse_json(body)?;
                let named = eviction
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if named.is_some_and(|n| n != name) {
                    return Err(status::bad_request(
                        "name in URL does not match name in Eviction object",
                    ));
                }
                let field = |f: &str| {
                    eviction
                        .pointer(&format!("/deleteOptions/preconditions/{f}"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                preconditions = eviction::Preconditions {
                    uid: field("uid"),
                    resource_version: field("resourceVersion"),
                };
            }
            let mut store = kube.store.lock();
            ok(
                201,
                eviction::evict(&mut store, namespace, name, &preconditions)?,
            )
        }
        (Some("scale"), method) if matches!(rt.plural, "replicasets" | "deployments") => {
            scale(kube, parts, rt, namespace, name, method, body)
        }
        (Some(_), _) => Err(status::no_route()),
        _ => Err(status::method_not_allowed()),
    }
}

/// The `autoscaling/v1` Scale of a ReplicaSet or Deployment (what `kubectl scale` reads and
/// writes).
fn scale_of(rs: &Value) -> Value {
    let selector = rs
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": rs.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
            "namespace": rs.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null),
            "uid": rs.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
            "resourceVersion": rs.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
            "creationTimestamp": rs.pointer("/metadata/creationTimestamp").cloned().unwrap_or(Value::Null),
        },
        "spec": {"replicas": rs.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": rs.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// GET, PUT or PATCH (merge) of a ReplicaSet's or Deployment's `scale` subresource: only `spec.replicas` is
/// written; a `metadata.resourceVersion` in the body is a precondition.
fn scale(
    kube: &KubeState,
    parts: &Parts,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    method: &Method,
    body: &[u8],
) -> Result<Response, KubeError> {
    let mut store = kube.store.lock();
    let rs = store.get(rt, namespace, name)?;
    let mut wanted = scale_of(&rs);
    match *method {
        Method::GET => return ok(200, wanted),
        Method::PUT => wanted = parse_json(body)?,
        Method::PATCH => {
            let ct = content_type(parts)
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let p = parse_json(body)?;
            match ct.as_str() {
                "application/merge-patch+json" => patch::merge_patch(&mut wanted, &p),
                "application/strategic-merge-patch+json" => {
                    patch::strategic_merge_patch(&mut wanted, &p)
                }
                other => return Err(status::unsupported_media_type(other)),
            }
        }
        _ => return Err(status::no_route()),
    }
    // `spec.replicas` is an int32, not a pointer: absent, it is 0. Negative, the Go server's
    // validation refuses it, naming the Scale (not the ReplicaSet).
    let replicas = match wanted.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64() {
            Some(r) if r >= 0 => r,
            Some(r) => {
                return Err(status::invalid_of(
                    "autoscaling",
                    "Scale",
                    name,
                    "spec.replicas",
                    &format!("Invalid value: {r}: must be greater than or equal to 0"),
                ))
            }
            None => {
                return Err(status::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: {v} is not an integer"
                )))
            }
        },
    };
    let mut updated = rs;
    updated["spec"]["replicas"] = json!(replicas);
    match wanted
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        Some(rv) if !rv.is_empty() => updated["metadata"]["resourceVersion"] = json!(rv),
        _ => {
            if let Some(m) = updated["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
        }
    }
    let stored = store.update(rt, namespace, name, updated, None)?;
    ok(200, scale_of(&stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_namespaced_items_and_namespaces_themselves() {
        let t = parse_target(&[
            "api",
            "v1",
            "namespaces",
            "default",
            "pods",
            "p",
            "eviction",
        ]);
        assert!(matches!(
            t,
            Some(Target::Item {
                namespace: "default",
                name: "p",
                sub: Some("eviction"),
                ..
            })
        ));
        let t = parse_target(&["api", "v1", "namespaces", "default"]);
        assert!(matches!(
            t,
            Some(Target::Item {
                namespace: "",
                name: "default",
                sub: None,
                ..
            })
        ));
        let t = parse_target(&[
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            "x",
            "leases",
        ]);
        assert!(matches!(
            t,
            Some(Target::Collection {
                namespace: Some("x"),
                ..
            })
        ));
        assert_eq!(parse_target(&["api", "v1", "widgets"]), None);
    }
}
