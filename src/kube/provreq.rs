//! ProvisioningRequests and PodTemplates through the API server: a list of both per loop, and
//! the status write guarded by the `resourceVersion` read (a 409 means the request changed since:
//! it is read afresh and decided again, never written blind).

use super::status_object::{self, StatusObject, StatusStore};
use crate::pods::provreq::{Request, Templates, GROUP, KIND, PLURAL, VERSION};
use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use std::sync::Arc;

/// A failed read or write.
#[derive(Debug, thiserror::Error)]
pub enum ProvReqError {
    /// The write carried a stale `resourceVersion` (409 Conflict).
    #[error("{0} changed since it was read (409 Conflict)")]
    Conflict(String),
    /// The request is gone.
    #[error("{0} not found")]
    NotFound(String),
    /// Listing requests or templates failed.
    #[error("listing {what} failed: {message}")]
    List {
        /// `provisioningrequests` or `podtemplates`.
        what: &'static str,
        /// The error.
        message: String,
    },
    /// Writing or reading one request failed otherwise.
    #[error("{key}: {message}")]
    Other {
        /// `namespace/name`.
        key: String,
        /// The error.
        message: String,
    },
}

impl ProvReqError {
    /// A bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Conflict(_) => "conflict",
            Self::NotFound(_) => "not_found",
            Self::List { .. } => "list",
            Self::Other { .. } => "other",
        }
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, ProvReqError>;

/// Where requests and templates are read and statuses written (one request's read and status
/// write: [`StatusStore`]).
#[async_trait::async_trait]
pub trait ProvReqStore: StatusStore<Request> {
    /// Every request and PodTemplate in the cluster.
    async fn list(&self) -> Result<(Vec<Request>, Templates)>;
}

/// The API resource of `autoscaling.x-k8s.io/v1` ProvisioningRequests.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// [`ProvReqStore`] through kube-rs.
#[derive(Clone)]
pub struct KubeProvReqs {
    client: kube::Client,
}

impl std::fmt::Debug for KubeProvReqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProvReqs").finish_non_exhaustive()
    }
}

impl KubeProvReqs {
    /// Through `client`.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self { client })
    }
}

fn to_request(o: DynamicObject) -> Option<Request> {
    let v = serde_json::to_value(o).ok()?;
    Request::of(v).ok()
}

#[async_trait::async_trait]
impl ProvReqStore for KubeProvReqs {
    async fn list(&self) -> Result<(Vec<Request>, Templates)> {
        let ar = api_resource();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| ProvReqError::List {
                what: "provisioningrequests",
                message: e.to_string(),
            })?;
        let requests = list.items.into_iter().filter_map(to_request).collect();
        let templates: Api<PodTemplate> = Api::all(self.client.clone());
        let list =
            templates
                .list(&ListParams::default())
                .await
                .map_err(|e| ProvReqError::List {
                    what: "podtemplates",
                    message: e.to_string(),
                })?;
        let templates = list
            .items
            .into_iter()
            .filter_map(|t| {
                let ns = t
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let name = t.metadata.name.clone()?;
                Some(((ns, name), Arc::new(t)))
            })
            .collect();
        Ok((requests, templates))
    }
}

#[async_trait::async_trait]
impl StatusStore<Request> for KubeProvReqs {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Request>> {
        status_object::get(&self.client, namespace, name).await
    }

    async fn replace_status(&self, object: &serde_json::Value) -> Result<Request> {
        status_object::replace_status(&self.client, object).await
    }
}

impl StatusObject for Request {
    const KIND: &'static str = KIND;

    fn api_resource() -> ApiResource {
        api_resource()
    }

    fn of(object: serde_json::Value) -> Option<Self> {
        Request::of(object).ok()
    }

    fn key(&self) -> String {
        Request::key(self)
    }
}
