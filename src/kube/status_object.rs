//! Custom resources whose status this controller writes (ProvisioningRequests, CapacityBuffers):
//! one read of one object and one guarded status write for every kind, so the rule exists once:
//! a status is only ever written with the `resourceVersion` it was decided from (`PUT
//! .../status`), and the answers a caller must tell apart (409: changed since it was read; 404:
//! gone) come back as their own errors.

use super::provreq::{ProvReqError, Result};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

/// A kind whose status is written here.
pub trait StatusObject: Sized + Send + Sync + 'static {
    /// `kind`, for messages.
    const KIND: &'static str;
    /// Where it is served.
    fn api_resource() -> ApiResource;
    /// Reads an object of the kind (`None`: not one the decision can read).
    fn of(object: Value) -> Option<Self>;
    /// `namespace/name`.
    fn key(&self) -> String;
}

/// Where one object of a kind is read afresh and its status written.
#[async_trait::async_trait]
pub trait StatusStore<T: StatusObject>: Send + Sync + std::fmt::Debug {
    /// The object afresh (`None`: gone).
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<T>>;
    /// Writes `object`'s status (`PUT .../status`) under its `metadata.resourceVersion`.
    async fn replace_status(&self, object: &Value) -> Result<T>;
}

/// [`StatusStore::get`] through kube-rs.
pub async fn get<T: StatusObject>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<T>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &T::api_resource());
    let got = api.get_opt(name).await.map_err(|e| ProvReqError::Other {
        key: format!("{namespace}/{name}"),
        message: e.to_string(),
    })?;
    Ok(got.and_then(|o| serde_json::to_value(o).ok().and_then(T::of)))
}

/// [`StatusStore::replace_status`] through kube-rs: refused without a `resourceVersion`
/// (the server would take it unconditionally), 409 and 404 told apart.
pub async fn replace_status<T: StatusObject>(client: &kube::Client, object: &Value) -> Result<T> {
    let meta = &object["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or("default");
    let name = meta["name"].as_str().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    if meta["resourceVersion"].as_str().is_none_or(str::is_empty) {
        return Err(ProvReqError::Other {
            key,
            message: "refusing to write a status without a resourceVersion".into(),
        });
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &T::api_resource());
    let body: DynamicObject =
        serde_json::from_value(object.clone()).map_err(|e| ProvReqError::Other {
            key: key.clone(),
            message: e.to_string(),
        })?;
    match api
        .replace_status(name, &PostParams::default(), &body)
        .await
    {
        Ok(o) => serde_json::to_value(o)
            .ok()
            .and_then(T::of)
            .ok_or_else(|| ProvReqError::Other {
                key,
                message: format!("the answer is not a {}", T::KIND),
            }),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(ProvReqError::Conflict(key)),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(ProvReqError::NotFound(key)),
        Err(e) => Err(ProvReqError::Other {
            key,
            message: e.to_string(),
        }),
    }
}
