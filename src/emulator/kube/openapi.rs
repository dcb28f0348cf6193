//! Minimal OpenAPI v3 documents: `/openapi/v3` (the index) and one document per group-version
//! whose PATCH operations name their kind and accept `fieldValidation`. That is what kubectl
//! reads to decide that the server validates fields itself, so it needs no schema (`/openapi/v2`
//! answers 404, as a server without it would).

use serde_json::{json, Map, Value};

use super::resources::{ResourceType, RESOURCES};

fn gv_path(r: &ResourceType) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// `/openapi/v3`: each served group-version and where its document is.
pub fn index() -> Value {
    let mut paths = Map::new();
    for r in RESOURCES {
        let p = gv_path(r);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=emulator")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn document(gv: &str) -> Option<Value> {
    let mut paths = Map::new();
    for r in RESOURCES.iter().filter(|r| gv_path(r) == gv) {
        let item = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{gv}/{}/{{name}}", r.plural)
        };
        let op = json!({
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(item, json!({"patch": op.clone(), "put": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.30.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
