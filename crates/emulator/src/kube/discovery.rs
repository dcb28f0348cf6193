//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`.

use serde_json::{json, Value};

use super::resources::{groups, ResourceType, RESOURCES};

/// The version the emulator reports (the API shapes served are those of this release).
pub const VERSION: (&str, &str) = ("1", "30");

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": VERSION.0,
        "minor": VERSION.1,
        "gitVersion": format!("v{}.{}.0-emulator", VERSION.0, VERSION.1),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.22.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

/// `/apis`.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|(g, versions)| group_versions(g, &versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn api_group(group: &str) -> Option<Value> {
    let (g, versions) = groups().into_iter().find(|(g, _)| *g == group)?;
    let one = group_versions(g, &versions);
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": one["versions"], "preferredVersion": one["preferredVersion"]}),
    )
}

/// One group's `name`, `versions` (preferred first) and `preferredVersion`.
fn group_versions(g: &str, versions: &[&str]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = gvs.first().cloned().unwrap_or(Value::Null);
    json!({"name": g, "versions": gvs, "preferredVersion": preferred})
}

fn verbs(r: &ResourceType) -> Vec<&'static str> {
    let mut v = vec![
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];
    if r.namespaced {
        v.insert(1, "deletecollection");
    }
    v
}

/// `/api/v1` or `/apis/<group>/<version>`; `None` when nothing is served there.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs(r),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        resources.push(entry);
        if r.status_subresource {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.plural == "pods" && r.group.is_empty() {
            resources.push(json!({"name": "pods/binding", "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
        if matches!(r.plural, "replicasets" | "deployments") {
            resources.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": true, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
