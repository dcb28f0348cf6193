//! Minimal OpenAPI documents: `/openapi/v3` (the index) and one document per group-version
//! whose PATCH operations name their kind and accept `fieldValidation`. That is what kubectl
//! reads to decide that the server validates fields itself, so it needs no schema.
//!
//! `/openapi/v2` is served too, with no definitions: kubectl 1.27 validates `replace` with it,
//! and any kubectl falls back to it when a v3 document fails it. It asks for protobuf (gnostic's
//! `openapi_v2.Document`) and treats a 404 as an error, but a document with no definition for a
//! kind as "nothing to validate against", which is what a server without schemas means.

use axum::body::Body;
use axum::response::Response;
use http::request::Parts;
use http::{HeaderValue, StatusCode};
use serde_json::{json, Map, Value};

/// The version the documents name (the one `/version` reports).
const TITLE: &str = "Kubernetes";
const VERSION: &str = "v1.30.0";

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
        "info": {"title": TITLE, "version": VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// `/openapi/v2`: `swagger: "2.0"` and its info, no paths or definitions; protobuf when the
/// client's first choice is protobuf (kubectl's only one), JSON otherwise.
pub fn v2(parts: &Parts) -> Response {
    let wants_protobuf = parts
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|first| first.contains("protobuf"));
    let (bytes, content_type) = if wants_protobuf {
        // kubectl asks for `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, which
        // Go's media type parser refuses in an answer (`@`); the API server answers the bytes
        // as `application/octet-stream`.
        (v2_protobuf(), "application/octet-stream")
    } else {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": TITLE, "version": VERSION},
            "paths": {},
            "definitions": {},
        });
        (doc.to_string().into_bytes(), "application/json")
    };
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    resp
}

/// gnostic's `openapi_v2.Document` with field 1 (`swagger`) and field 2 (`info`: `title` 1,
/// `version` 2), in protobuf's wire format: each a length-delimited field (wire type 2).
fn v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push(number << 3 | 2);
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, TITLE.as_bytes());
    field(&mut info, 2, VERSION.as_bytes());
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_document_in_protobuf_is_swagger_2_0_with_its_info() {
        let bytes = v2_protobuf();
        // Field 1, length 3, "2.0"; field 2, then its own fields 1 and 2.
        assert_eq!(&bytes[..5], b"\x0a\x032.0");
        assert_eq!(bytes[5], 0x12);
        assert_eq!(bytes[6] as usize, bytes.len() - 7);
        let info = &bytes[7..];
        assert_eq!(info[0], 0x0a);
        assert_eq!(&info[2..2 + info[1] as usize], TITLE.as_bytes());
        let rest = &info[2 + info[1] as usize..];
        assert_eq!((rest[0], &rest[2..]), (0x12, VERSION.as_bytes()));
    }
}
