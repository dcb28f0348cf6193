//! `metav1.Status` bodies, shaped exactly as the real API server writes them.

use serde_json::{json, Value};

use super::resources::ResourceType;

/// A refused request: the HTTP code and the `Status` body the real server would send.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// The `Status` object.
    pub status: Value,
}

impl std::fmt::Display for KubeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let message = self
            .status
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("");
        write!(f, "{} {}", self.code, message)
    }
}

impl std::error::Error for KubeError {}

/// A `Status` with `status: Failure`.
pub fn failure(
    code: u16,
    reason: &str,
    message: impl Into<String>,
    details: Option<Value>,
) -> KubeError {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        status["details"] = d;
    }
    KubeError { code, status }
}

/// A `Status` with `status: Success` (binding, eviction).
pub fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}

/// `details` naming an object: `{"name", "group"?, "kind": <plural>}`.
fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = json!({"name": name});
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d["kind"] = json!(rt.plural);
    d
}

/// `pods "x" not found`.
pub fn not_found(rt: &ResourceType, name: &str) -> KubeError {
    failure(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", rt.qualified()),
        Some(details(rt, name)),
    )
}

/// `pods "x" already exists`.
pub fn already_exists(rt: &ResourceType, name: &str) -> KubeError {
    failure(
        409,
        "AlreadyExists",
        format!("{} \"{name}\" already exists", rt.qualified()),
        Some(details(rt, name)),
    )
}

/// The optimistic-concurrency refusal of a stale `resourceVersion`.
pub fn conflict(rt: &ResourceType, name: &str) -> KubeError {
    failure(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            rt.qualified()
        ),
        Some(details(rt, name)),
    )
}

/// An update whose body names a `metadata.uid` other than the stored object's (`stored`: `""`
/// when there is none, the object being gone): the Go API server's UID precondition, a 409.
pub fn uid_conflict(
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    want: &str,
    stored: &str,
) -> KubeError {
    let key = if namespace.is_empty() {
        format!("/registry/{}/{name}", registry_prefix(rt))
    } else {
        format!("/registry/{}/{namespace}/{name}", registry_prefix(rt))
    };
    failure(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {want}, UID in object meta: {stored}",
            rt.qualified()
        ),
        Some(details(rt, name)),
    )
}

/// The etcd key prefix of a type: the plural for built-in types, `group/plural` for custom
/// resources (the served ones are the SIGs' `*.x-k8s.io` CRDs).
fn registry_prefix(rt: &ResourceType) -> String {
    if rt.group.ends_with(".x-k8s.io") {
        format!("{}/{}", rt.group, rt.plural)
    } else {
        rt.plural.to_string()
    }
}

/// A watch or continue token older than the retained history.
pub fn expired(message: impl Into<String>) -> KubeError {
    failure(410, "Expired", message, None)
}

/// 400 BadRequest.
pub fn bad_request(message: impl Into<String>) -> KubeError {
    failure(400, "BadRequest", message, None)
}

/// 422 Invalid for one field of `rt`'s kind (see [`invalid_of`]).
pub fn invalid(rt: &ResourceType, name: &str, field: &str, message: &str) -> KubeError {
    invalid_of(rt.group, rt.kind, name, field, message)
}

/// 422 Invalid for one field of a `kind` of `group`, as the Go server's `NewInvalid` answers:
/// the message names the kind qualified by its group (`Job.batch`, `Scale.autoscaling`; `Pod`
/// for the core group), the details carry the group and the kind (not the resource), and the
/// cause's reason is the error type the message starts with (`Required value`,
/// `Invalid value`, `Unsupported value`).
pub fn invalid_of(group: &str, kind: &str, name: &str, field: &str, message: &str) -> KubeError {
    let reason = if message.starts_with("Required value") {
        "FieldValueRequired"
    } else if message.starts_with("Unsupported value") {
        "FieldValueNotSupported"
    } else {
        "FieldValueInvalid"
    };
    let mut d = json!({"name": name});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d["kind"] = json!(kind);
    d["causes"] = json!([{"reason": reason, "message": message, "field": field}]);
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    failure(
        422,
        "Invalid",
        format!("{qualified} \"{name}\" is invalid: {field}: {message}"),
        Some(d),
    )
}

/// 405 for a verb the resource does not support.
pub fn method_not_allowed() -> KubeError {
    failure(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        None,
    )
}

/// 404 for a path that names no resource (the real server's body for unknown paths).
pub fn no_route() -> KubeError {
    failure(
        404,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    )
}

/// 401 for a missing or wrong bearer token.
pub fn unauthorized() -> KubeError {
    failure(401, "Unauthorized", "Unauthorized", None)
}

/// 415 for a PATCH content type that is not supported.
pub fn unsupported_media_type(content_type: &str) -> KubeError {
    unknown_format(
        content_type,
        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
    )
}

/// 415 for a create or replace body that is not JSON: the emulator reads no protobuf or YAML
/// (kubectl 1.32 and later send protobuf for some typed creates, such as `create namespace`).
pub fn unsupported_body(content_type: &str) -> KubeError {
    unknown_format(content_type, "application/json")
}

/// The API server's words for a body in a format it does not read.
fn unknown_format(content_type: &str, accepted: &str) -> KubeError {
    failure(
        415,
        "UnsupportedMediaType",
        format!("the body of the request was in an unknown format - accepted media types include: {accepted} (got {content_type})"),
        None,
    )
}

/// 403 Forbidden, as RBAC refuses `verb` on `rt` for the emulator's one user.
pub fn forbidden(rt: &ResourceType, verb: &str) -> KubeError {
    failure(
        403,
        "Forbidden",
        format!(
            "{plural} is forbidden: User \"system:serviceaccount:kube-system:vmss-capacity-controller\" cannot {verb} resource \"{plural}\" in API group \"{group}\" at the cluster scope",
            plural = rt.plural,
            group = rt.group,
        ),
        Some(json!({"kind": rt.plural})),
    )
}

/// 503 ServiceUnavailable: the emulator's fault switch is on
/// ([`KubeState::set_unavailable`](super::KubeState::set_unavailable)).
pub fn unavailable() -> KubeError {
    failure(
        503,
        "ServiceUnavailable",
        "the Kubernetes API is unavailable (the emulator's fault switch is on)",
        None,
    )
}
