//! Label and field selectors: equality (`=`, `==`, `!=`) and existence (`key`, `!key`) for
//! labels; for fields, `metadata.name`, `metadata.namespace` and the field labels kube-apiserver
//! supports per type (pods by node, phase, IP...; core Events by `involvedObject.*`, `reason`,
//! `source`, `type`; `events.k8s.io` Events by `regarding.*`; Nodes by `spec.unschedulable`).

use serde_json::Value;

use super::resources::ResourceType;
use super::status::{bad_request, KubeError};

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed pair of label and field selectors; the default matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

fn parse_reqs(s: &str, allow_exists: bool, what: &str) -> Result<Vec<Req>, KubeError> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some((k, v)) = term.split_once("!=") {
            Req::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            Req::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            Req::Eq(k.trim().to_string(), v.trim().to_string())
        } else if allow_exists && !term.contains(' ') {
            match term.strip_prefix('!') {
                Some(k) => Req::NotExists(k.to_string()),
                None => Req::Exists(term.to_string()),
            }
        } else {
            return Err(bad_request(format!(
                "unable to parse requirement: invalid {what} selector term {term:?} (the emulator supports =, ==, != and existence)"
            )));
        };
        out.push(req);
    }
    Ok(out)
}

/// The field labels kube-apiserver (1.20) accepts for a type beyond `metadata.name` and
/// `metadata.namespace`, each with where its value is read (the `ToSelectableFields` of each
/// registry: `pkg/registry/core/pod/strategy.go`, `.../core/event/strategy.go`, ...).
fn extra_fields(rt: &ResourceType) -> &'static [(&'static str, &'static str)] {
    match (rt.group, rt.plural) {
        ("", "pods") => &[
            ("spec.nodeName", "/spec/nodeName"),
            ("spec.restartPolicy", "/spec/restartPolicy"),
            ("spec.schedulerName", "/spec/schedulerName"),
            ("spec.serviceAccountName", "/spec/serviceAccountName"),
            ("status.phase", "/status/phase"),
            ("status.podIP", "/status/podIP"),
            ("status.nominatedNodeName", "/status/nominatedNodeName"),
        ],
        ("", "events") => &[
            ("involvedObject.kind", "/involvedObject/kind"),
            ("involvedObject.namespace", "/involvedObject/namespace"),
            ("involvedObject.name", "/involvedObject/name"),
            ("involvedObject.uid", "/involvedObject/uid"),
            ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
            (
                "involvedObject.resourceVersion",
                "/involvedObject/resourceVersion",
            ),
            ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
            ("reason", "/reason"),
            ("reportingComponent", "/reportingComponent"),
            ("source", "/source/component"),
            ("type", "/type"),
        ],
        ("events.k8s.io", "events") => &[
            ("regarding.kind", "/regarding/kind"),
            ("regarding.namespace", "/regarding/namespace"),
            ("regarding.name", "/regarding/name"),
            ("regarding.uid", "/regarding/uid"),
            ("regarding.apiVersion", "/regarding/apiVersion"),
            ("regarding.resourceVersion", "/regarding/resourceVersion"),
            ("regarding.fieldPath", "/regarding/fieldPath"),
            ("reason", "/reason"),
            ("reportingController", "/reportingController"),
            ("type", "/type"),
        ],
        ("", "nodes") => &[("spec.unschedulable", "/spec/unschedulable")],
        ("", "namespaces") => &[("status.phase", "/status/phase")],
        _ => &[],
    }
}

/// The value a field selector compares: an absent field is `""`, a boolean its Go spelling.
fn field_value(rt: &ResourceType, obj: &Value, field: &str) -> Result<String, KubeError> {
    let pointer = match field {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        _ => match extra_fields(rt).iter().find(|(f, _)| *f == field) {
            Some((_, p)) => p,
            None if extra_fields(rt).is_empty() => {
                return Err(bad_request(format!(
                    "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )))
            }
            None => return Err(bad_request(format!("field label not supported: {field}"))),
        },
    };
    Ok(match obj.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        // `spec.unschedulable` of a Node that never set it.
        None if field == "spec.unschedulable" => "false".to_string(),
        _ => String::new(),
    })
}

impl Selector {
    /// Parses `labelSelector` and `fieldSelector` query values (either may be absent).
    pub fn parse(
        rt: &ResourceType,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Self, KubeError> {
        let sel = Selector {
            labels: parse_reqs(labels.unwrap_or(""), true, "label")?,
            fields: parse_reqs(fields.unwrap_or(""), false, "field")?,
        };
        // Check the field names now, so an unsupported field fails the request, not each match.
        let empty = serde_json::json!({});
        for r in &sel.fields {
            if let Req::Eq(k, _) | Req::Ne(k, _) = r {
                field_value(rt, &empty, k)?;
            }
        }
        Ok(sel)
    }

    /// Whether it selects nothing (every object matches).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether `obj` (of type `rt`) matches.
    pub fn matches(&self, rt: &ResourceType, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v.as_str()),
            Req::Ne(k, v) => label(k) != Some(v.as_str()),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|r| match r {
                // An absent field compares as the empty string, as on the real server.
                Req::Eq(k, v) => field_value(rt, obj, k).unwrap_or_default() == *v,
                Req::Ne(k, v) => field_value(rt, obj, k).unwrap_or_default() != *v,
                _ => true,
            })
    }
}

/// Whether a `LabelSelector` object (`matchLabels`, `matchExpressions` with In, NotIn, Exists,
/// DoesNotExist) selects these labels. An empty selector selects everything, as for policy/v1
/// PodDisruptionBudgets.
pub fn label_selector_matches(
    selector: &Value,
    labels: Option<&serde_json::Map<String, Value>>,
) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let match_labels_ok = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .map(|m| m.iter().all(|(k, v)| get(k) == v.as_str()))
        .unwrap_or(true);
    let exprs_ok = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(|exprs| {
            exprs.iter().all(|e| {
                let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                let values: Vec<&str> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|v| v.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                match e.get("operator").and_then(Value::as_str) {
                    Some("In") => get(key).is_some_and(|v| values.contains(&v)),
                    Some("NotIn") => !get(key).is_some_and(|v| values.contains(&v)),
                    Some("Exists") => get(key).is_some(),
                    Some("DoesNotExist") => get(key).is_none(),
                    _ => false,
                }
            })
        })
        .unwrap_or(true);
    match_labels_ok && exprs_ok
}
