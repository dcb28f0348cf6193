//! `Table` answers (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), what `kubectl get`
//! prints: the columns kube-apiserver's printers (`pkg/printers/internalversion/printers.go`)
//! define for each type, the `-o wide` ones (priority 1) included, with their cells computed as
//! those printers compute them. The column definitions (names, types, formats, descriptions,
//! priorities) are kube-apiserver 1.20's, as it answers them, in `table_columns.json`.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use http::request::Parts;
use serde_json::{json, Map, Value};

use super::resources::ResourceType;

/// The `meta.k8s.io` version of the Table a request asks for, if it asks for one.
pub(crate) fn wanted(parts: &Parts) -> Option<&'static str> {
    let accept = parts
        .headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    for media in accept.split(',') {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        let has = |p: &str| params.iter().any(|x| x.eq_ignore_ascii_case(p));
        if !has("as=Table") || !has("g=meta.k8s.io") {
            continue;
        }
        if has("v=v1") {
            return Some("meta.k8s.io/v1");
        }
        if has("v=v1beta1") {
            return Some("meta.k8s.io/v1beta1");
        }
    }
    None
}

/// What each row carries of its object (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Include {
    /// Nothing.
    None,
    /// Its `metadata`, as a `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl Include {
    /// From the `includeObject` query value.
    pub(crate) fn parse(q: Option<&str>) -> Include {
        match q {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

fn columns() -> &'static Map<String, Value> {
    static COLUMNS: OnceLock<Map<String, Value>> = OnceLock::new();
    COLUMNS.get_or_init(|| {
        serde_json::from_str(include_str!("table_columns.json")).unwrap_or_else(|e| {
            tracing::error!(error = %e, "table_columns.json does not parse");
            Map::new()
        })
    })
}

/// The column definitions of a type (`events.k8s.io` Events print as core Events do).
pub fn column_definitions(rt: &ResourceType) -> Vec<Value> {
    columns()
        .get(rt.plural)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_else(|| {
            // The API server's default table for a type without a printer.
            vec![
                json!({"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}),
                json!({"name": "Created At", "type": "date", "format": "", "description": "", "priority": 0}),
            ]
        })
}

/// A Table of `objects` with the list's `metadata` (`resourceVersion`, `continue`, ...).
pub(crate) fn table(
    rt: &ResourceType,
    api_version: &str,
    objects: &[&Value],
    metadata: Value,
    include: Include,
) -> Value {
    let now = time::OffsetDateTime::now_utc();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = json!({"cells": cells(rt, obj, now)});
            match include {
                Include::None => {}
                Include::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
                    });
                }
                Include::Object => {
                    let mut full = (*obj).clone();
                    full["kind"] = json!(rt.kind);
                    full["apiVersion"] = json!(rt.group_version());
                    row["object"] = full;
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": metadata,
        "columnDefinitions": column_definitions(rt),
        "rows": rows,
    })
}

fn s<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn int(obj: &Value, pointer: &str) -> i64 {
    obj.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".to_string()
    } else {
        v.to_string()
    }
}

fn or_unknown(v: &str) -> String {
    if v.is_empty() {
        "<unknown>".to_string()
    } else {
        v.to_string()
    }
}

/// `duration.HumanDuration` of the time since an RFC 3339 timestamp; `<unknown>` when absent.
fn since(ts: &str, now: time::OffsetDateTime) -> String {
    match time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339) {
        Ok(t) => human_duration(now - t),
        Err(_) => "<unknown>".to_string(),
    }
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`.
pub fn human_duration(d: time::Duration) -> String {
    let seconds = d.whole_seconds();
    if seconds < -1 {
        return "<invalid>".to_string();
    } else if seconds < 0 {
        return "0s".to_string();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    } else if hours < 48 {
        return format!("{hours}h");
    } else if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    } else if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    } else if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(obj: &Value, now: time::OffsetDateTime) -> Value {
    json!(since(s(obj, "/metadata/creationTimestamp"), now))
}

/// The cells of one row, as the printer of `rt` fills them (wide columns included).
fn cells(rt: &ResourceType, obj: &Value, now: time::OffsetDateTime) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    match (rt.group, rt.plural) {
        ("", "pods") => pod_cells(obj, now),
        ("", "nodes") => node_cells(obj, now),
        ("", "events") | ("events.k8s.io", "events") => event_cells(obj, now),
        ("", "namespaces") => vec![name, json!(s(obj, "/status/phase")), age(obj, now)],
        ("", "configmaps") => {
            let n = |k: &str| obj.get(k).and_then(Value::as_object).map_or(0, Map::len);
            vec![name, json!(n("data") + n("binaryData")), age(obj, now)]
        }
        ("coordination.k8s.io", "leases") => {
            vec![name, json!(s(obj, "/spec/holderIdentity")), age(obj, now)]
        }
        ("apps", "deployments") => {
            let (containers, images) = containers_and_images(obj);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    int(obj, "/status/readyReplicas"),
                    obj.pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                )),
                json!(int(obj, "/status/updatedReplicas")),
                json!(int(obj, "/status/availableReplicas")),
                age(obj, now),
                json!(containers),
                json!(images),
                json!(selector_string(obj.pointer("/spec/selector"))),
            ]
        }
        ("apps", "replicasets") => {
            let (containers, images) = containers_and_images(obj);
            vec![
                name,
                json!(obj
                    .pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(1)),
                json!(int(obj, "/status/replicas")),
                json!(int(obj, "/status/readyReplicas")),
                age(obj, now),
                json!(containers),
                json!(images),
                json!(selector_string(obj.pointer("/spec/selector"))),
            ]
        }
        ("batch", "jobs") => {
            // `printJob`: succeeded/completions, and the run's length (to its completion, or
            // until now while it runs; empty before it started).
            let (containers, images) = containers_and_images(obj);
            let parse = |p: &str| {
                time::OffsetDateTime::parse(
                    s(obj, p),
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
            };
            let duration = match (parse("/status/startTime"), parse("/status/completionTime")) {
                (Some(start), Some(end)) => human_duration(end - start),
                (Some(start), None) => human_duration(now - start),
                _ => String::new(),
            };
            let completions = match obj.pointer("/spec/completions").and_then(Value::as_i64) {
                Some(c) => format!("{}/{c}", int(obj, "/status/succeeded")),
                None => {
                    let parallelism = int(obj, "/spec/parallelism");
                    if parallelism > 1 {
                        format!("{}/1 of {parallelism}", int(obj, "/status/succeeded"))
                    } else {
                        format!("{}/1", int(obj, "/status/succeeded"))
                    }
                }
            };
            vec![
                name,
                json!(completions),
                json!(duration),
                age(obj, now),
                json!(containers),
                json!(images),
                json!(selector_string(obj.pointer("/spec/selector"))),
            ]
        }
        ("apps", "daemonsets") => {
            let (containers, images) = containers_and_images(obj);
            vec![
                name,
                json!(int(obj, "/status/desiredNumberScheduled")),
                json!(int(obj, "/status/currentNumberScheduled")),
                json!(int(obj, "/status/numberReady")),
                json!(int(obj, "/status/updatedNumberScheduled")),
                json!(int(obj, "/status/numberAvailable")),
                json!(format_labels(
                    obj.pointer("/spec/template/spec/nodeSelector")
                )),
                age(obj, now),
                json!(containers),
                json!(images),
                json!(selector_string(obj.pointer("/spec/selector"))),
            ]
        }
        ("policy", "poddisruptionbudgets") => {
            let intstr = |p: &str| match obj.pointer(p) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "N/A".to_string(),
            };
            vec![
                name,
                json!(intstr("/spec/minAvailable")),
                json!(intstr("/spec/maxUnavailable")),
                json!(int(obj, "/status/disruptionsAllowed")),
                age(obj, now),
            ]
        }
        ("", "persistentvolumeclaims") => {
            let volume = s(obj, "/spec/volumeName");
            let bound = !volume.is_empty();
            vec![
                name,
                json!(terminating_or(obj, s(obj, "/status/phase"))),
                json!(volume),
                json!(if bound {
                    s(obj, "/status/capacity/storage")
                } else {
                    ""
                }),
                json!(if bound {
                    access_modes(obj.pointer("/status/accessModes"))
                } else {
                    String::new()
                }),
                json!(storage_class_of_claim(obj)),
                age(obj, now),
                json!(volume_mode(obj)),
            ]
        }
        ("", "persistentvolumes") => {
            let claim = match obj.pointer("/spec/claimRef") {
                Some(r) => format!("{}/{}", s(r, "/namespace"), s(r, "/name")),
                None => String::new(),
            };
            vec![
                name,
                json!(s(obj, "/spec/capacity/storage")),
                json!(access_modes(obj.pointer("/spec/accessModes"))),
                json!(s(obj, "/spec/persistentVolumeReclaimPolicy")),
                json!(terminating_or(obj, s(obj, "/status/phase"))),
                json!(claim),
                json!(s(obj, "/spec/storageClassName")),
                json!(s(obj, "/status/reason")),
                age(obj, now),
                json!(volume_mode(obj)),
            ]
        }
        ("storage.k8s.io", "storageclasses") => {
            let annotations = obj.pointer("/metadata/annotations");
            let default = [
                "storageclass.kubernetes.io/is-default-class",
                "storageclass.beta.kubernetes.io/is-default-class",
            ]
            .iter()
            .any(|k| {
                annotations
                    .and_then(|a| a.get(*k))
                    .and_then(Value::as_str)
                    .is_some_and(|v| v == "true")
            });
            let mut n = s(obj, "/metadata/name").to_string();
            if default {
                n.push_str(" (default)");
            }
            let or = |p: &str, d: &str| {
                let v = s(obj, p);
                if v.is_empty() {
                    d.to_string()
                } else {
                    v.to_string()
                }
            };
            vec![
                json!(n),
                json!(s(obj, "/provisioner")),
                json!(or("/reclaimPolicy", "Delete")),
                json!(or("/volumeBindingMode", "Immediate")),
                json!(obj
                    .get("allowVolumeExpansion")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)),
                age(obj, now),
            ]
        }
        // printResourceQuota: each `status.hard` resource in name order as `name: used/hard`,
        // the `limits.*` ones in LIMIT, the rest in REQUEST.
        ("", "resourcequotas") => {
            let hard = obj.pointer("/status/hard").and_then(Value::as_object);
            let mut names: Vec<&String> = hard.map(|h| h.keys().collect()).unwrap_or_default();
            names.sort();
            let (mut request, mut limit) = (Vec::new(), Vec::new());
            for r in names {
                let used = obj
                    .pointer("/status/used")
                    .and_then(|u| u.get(r))
                    .and_then(Value::as_str)
                    .unwrap_or("0");
                let of = hard.and_then(|h| h.get(r)).and_then(Value::as_str);
                let cell = format!("{r}: {used}/{}", of.unwrap_or_default());
                if r.split('.').next() == Some("limits") && r.contains('.') {
                    limit.push(cell);
                } else {
                    request.push(cell);
                }
            }
            vec![
                name,
                age(obj, now),
                json!(request.join(", ")),
                json!(limit.join(", ")),
            ]
        }
        ("", "podtemplates") => {
            let containers = obj
                .pointer("/template/spec/containers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let names: Vec<&str> = containers.iter().map(|c| s(c, "/name")).collect();
            let images: Vec<&str> = containers.iter().map(|c| s(c, "/image")).collect();
            vec![
                name,
                json!(names.join(",")),
                json!(images.join(",")),
                json!(format_labels(obj.pointer("/template/metadata/labels"))),
            ]
        }
        // The CRD's printer columns: the age, then each condition's status (null when absent).
        ("autoscaling.x-k8s.io", "provisioningrequests") => {
            let condition = |kind: &str| {
                obj.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
                    .map_or(Value::Null, |c| c["status"].clone())
            };
            vec![
                name,
                age(obj, now),
                condition("Accepted"),
                condition("Provisioned"),
                condition("Failed"),
            ]
        }
        // A CRD without additionalPrinterColumns: apiextensions' default Age column only.
        ("autoscaling.x-k8s.io", "capacitybuffers") => vec![name, age(obj, now)],
        ("storage.k8s.io", "csinodes") => vec![
            name,
            json!(obj
                .pointer("/spec/drivers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)),
            age(obj, now),
        ],
        _ => vec![name, json!(s(obj, "/metadata/creationTimestamp"))],
    }
}

fn terminating_or(obj: &Value, phase: &str) -> String {
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating".to_string()
    } else {
        phase.to_string()
    }
}

fn volume_mode(obj: &Value) -> String {
    match obj.pointer("/spec/volumeMode").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => "<unset>".to_string(),
    }
}

fn storage_class_of_claim(obj: &Value) -> String {
    obj.pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
        .and_then(Value::as_str)
        .or_else(|| {
            obj.pointer("/spec/storageClassName")
                .and_then(Value::as_str)
        })
        .unwrap_or("")
        .to_string()
}

/// `GetAccessModesAsString`: `RWO,ROX,RWX,RWOP`, in that order.
fn access_modes(modes: Option<&Value>) -> String {
    let have: Vec<&str> = modes
        .and_then(Value::as_array)
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(m, _)| have.contains(m))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

/// The pod template's container names and images, comma-joined.
fn containers_and_images(obj: &Value) -> (String, String) {
    let containers = obj
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| s(c, "/image")).collect();
    (names.join(","), images.join(","))
}

/// `labels.FormatLabels`: `k=v` sorted by key, comma-joined; `<none>` when empty.
fn format_labels(labels: Option<&Value>) -> String {
    let pairs: Vec<String> = labels
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if pairs.is_empty() {
        "<none>".to_string()
    } else {
        pairs.join(",")
    }
}

/// `metav1.LabelSelectorAsSelector(..).String()`: requirements sorted by key.
pub fn selector_string(selector: Option<&Value>) -> String {
    let Some(sel) = selector else {
        return String::new();
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = s(e, "/key").to_string();
            let values: BTreeSet<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let list = values.into_iter().collect::<Vec<_>>().join(",");
            let text = match s(e, "/operator") {
                "In" => format!("{key} in ({list})"),
                "NotIn" => format!("{key} notin ({list})"),
                "Exists" => key.clone(),
                "DoesNotExist" => format!("!{key}"),
                _ => continue,
            };
            reqs.push((key, text));
        }
    }
    reqs.sort();
    reqs.into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// `printPod`: name, ready, status (its reason), restarts, age, IP, node, nominated node,
/// readiness gates.
fn pod_cells(pod: &Value, now: time::OffsetDateTime) -> Vec<Value> {
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut restarts = 0;
    let mut ready = 0;
    let mut reason = s(pod, "/status/phase").to_string();
    if !s(pod, "/status/reason").is_empty() {
        reason = s(pod, "/status/reason").to_string();
    }
    let mut initializing = false;
    let init = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let init_total = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for (i, c) in init.iter().enumerate() {
        restarts += int(c, "/restartCount");
        let terminated = c.pointer("/state/terminated");
        if terminated.is_some_and(|t| int(t, "/exitCode") == 0) {
            continue;
        }
        if let Some(t) = terminated {
            reason = if !s(t, "/reason").is_empty() {
                format!("Init:{}", s(t, "/reason"))
            } else if int(t, "/signal") != 0 {
                format!("Init:Signal:{}", int(t, "/signal"))
            } else {
                format!("Init:ExitCode:{}", int(t, "/exitCode"))
            };
        } else if let Some(w) = c
            .pointer("/state/waiting")
            .filter(|w| !s(w, "/reason").is_empty() && s(w, "/reason") != "PodInitializing")
        {
            reason = format!("Init:{}", s(w, "/reason"));
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }
    if !initializing {
        restarts = 0;
        let mut has_running = false;
        for c in statuses.iter().rev() {
            restarts += int(c, "/restartCount");
            let waiting = s(c, "/state/waiting/reason");
            let terminated = c.pointer("/state/terminated");
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if let Some(t) = terminated.filter(|t| !s(t, "/reason").is_empty()) {
                reason = s(t, "/reason").to_string();
            } else if let Some(t) = terminated {
                reason = if int(t, "/signal") != 0 {
                    format!("Signal:{}", int(t, "/signal"))
                } else {
                    format!("ExitCode:{}", int(t, "/exitCode"))
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                && c.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".to_string();
        }
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".to_string()
        } else {
            "Terminating".to_string()
        };
    }
    let ip = pod
        .pointer("/status/podIPs/0/ip")
        .and_then(Value::as_str)
        .unwrap_or("");
    let gates = pod
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let met = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .any(|c| s(c, "/type") == s(g, "/conditionType") && s(c, "/status") == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    vec![
        json!(s(pod, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        age(pod, now),
        json!(or_none(ip)),
        json!(or_none(s(pod, "/spec/nodeName"))),
        json!(or_none(s(pod, "/status/nominatedNodeName"))),
        json!(readiness_gates),
    ]
}

/// `printNode`: name, status, roles, age, version, internal and external IP, OS image, kernel,
/// container runtime.
fn node_cells(node: &Value, now: time::OffsetDateTime) -> Vec<Value> {
    let conditions = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut status: Vec<String> = Vec::new();
    if let Some(c) = conditions.iter().rev().find(|c| s(c, "/type") == "Ready") {
        status.push(if s(c, "/status") == "True" {
            "Ready".to_string()
        } else {
            "NotReady".to_string()
        });
    }
    if status.is_empty() {
        status.push("Unknown".to_string());
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".to_string());
    }
    let mut roles: BTreeSet<String> = BTreeSet::new();
    if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" {
                if let Some(v) = v.as_str().filter(|v| !v.is_empty()) {
                    roles.insert(v.to_string());
                }
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };
    let address = |kind: &str| {
        node.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| s(x, "/type") == kind))
            .map(|x| s(x, "/address").to_string())
            .unwrap_or_default()
    };
    vec![
        json!(s(node, "/metadata/name")),
        json!(status.join(",")),
        json!(roles),
        age(node, now),
        json!(s(node, "/status/nodeInfo/kubeletVersion")),
        json!(or_none(&address("InternalIP"))),
        json!(or_none(&address("ExternalIP"))),
        json!(or_unknown(s(node, "/status/nodeInfo/osImage"))),
        json!(or_unknown(s(node, "/status/nodeInfo/kernelVersion"))),
        json!(or_unknown(s(
            node,
            "/status/nodeInfo/containerRuntimeVersion"
        ))),
    ]
}

/// `printEvent` (wide: every column), for a core Event or its `events.k8s.io` view.
fn event_cells(ev: &Value, now: time::OffsetDateTime) -> Vec<Value> {
    // The two views name some fields differently; the printer reads the core names.
    let field = |core: &str, events: &str| -> Option<&Value> {
        ev.get(core)
            .filter(|v| !v.is_null())
            .or_else(|| ev.get(events).filter(|v| !v.is_null()))
    };
    let text = |core: &str, events: &str| -> String {
        field(core, events)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let first = match field("firstTimestamp", "deprecatedFirstTimestamp").and_then(Value::as_str) {
        Some(t) => since(t, now),
        None => since(s(ev, "/eventTime"), now),
    };
    let mut last = match field("lastTimestamp", "deprecatedLastTimestamp").and_then(Value::as_str) {
        Some(t) => since(t, now),
        None => first.clone(),
    };
    let mut count = field("count", "deprecatedCount")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if let Some(series) = ev.get("series").filter(|v| v.is_object()) {
        last = since(s(series, "/lastObservedTime"), now);
        count = int(series, "/count");
    } else if count == 0 {
        count = 1;
    }
    let object = field("involvedObject", "regarding")
        .cloned()
        .unwrap_or(json!({}));
    let kind = s(&object, "/kind").to_ascii_lowercase();
    let target = if s(&object, "/name").is_empty() {
        kind
    } else {
        format!("{kind}/{}", s(&object, "/name"))
    };
    let source = field("source", "deprecatedSource")
        .cloned()
        .unwrap_or(json!({}));
    let first_non_empty = |a: &str, b: String| if a.is_empty() { b } else { a.to_string() };
    let component = first_non_empty(
        s(&source, "/component"),
        text("reportingComponent", "reportingController"),
    );
    let instance = first_non_empty(
        s(&source, "/host"),
        text("reportingInstance", "reportingInstance"),
    );
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(s(ev, "/type")),
        json!(s(ev, "/reason")),
        json!(target),
        json!(s(&object, "/fieldPath")),
        json!(source),
        json!(text("message", "note").trim()),
        json!(first),
        json!(count),
        json!(s(ev, "/metadata/name")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_read_as_kubectl_prints_them() {
        let d = time::Duration::seconds;
        assert_eq!(human_duration(d(5)), "5s");
        assert_eq!(human_duration(d(119)), "119s");
        assert_eq!(human_duration(d(150)), "2m30s");
        assert_eq!(human_duration(d(600)), "10m");
        assert_eq!(human_duration(d(3 * 3600 + 60)), "3h1m");
        assert_eq!(human_duration(d(9 * 3600)), "9h");
        assert_eq!(human_duration(d(3 * 86400 + 3600)), "3d1h");
        assert_eq!(human_duration(d(-5)), "<invalid>");
    }

    #[test]
    fn selectors_print_sorted_by_key() {
        let sel = json!({"matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}, {"key": "0", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(Some(&sel)), "!0,a=1,b=2,c in (x,y)");
    }
}
