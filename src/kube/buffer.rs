//! CapacityBuffers through the API server: a list of the buffers per look, a get of each one's
//! PodTemplate or scalable object, a list of the ResourceQuotas of each namespace with buffers,
//! and the status write guarded by the `resourceVersion` read (a
//! 409 means the buffer changed since: it is read afresh and decided again, never written
//! blind).

use super::provreq::{ProvReqError, Result};
use super::status_object::{self, StatusObject, StatusStore};
use crate::pods::buffer::{
    scalable_resource, Buffer, RefKey, Referent, Referents, GROUP, KIND, PLURAL, VERSION,
};
use k8s_openapi::api::core::v1::{PodTemplate, ResourceQuota};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use std::sync::Arc;
use tracing::warn;

/// Where buffers and what they refer to are read, and statuses written (one buffer's read and
/// status write: [`StatusStore`]). Errors are [`ProvReqError`]'s variants (the same questions:
/// conflict, gone, list, other).
#[async_trait::async_trait]
pub trait BufferStore: StatusStore<Buffer> {
    /// Every buffer in the cluster, and what each one refers to.
    async fn list(&self) -> Result<(Vec<Buffer>, Referents)>;
}

/// The API resource of `autoscaling.x-k8s.io/v1beta1` CapacityBuffers.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// [`BufferStore`] through kube-rs.
#[derive(Clone)]
pub struct KubeBuffers {
    client: kube::Client,
}

impl std::fmt::Debug for KubeBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBuffers").finish_non_exhaustive()
    }
}

impl KubeBuffers {
    /// Through `client`.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self { client })
    }

    /// What `key` finds (a read error is kept as [`Referent::Unreadable`], for the condition).
    async fn referent(&self, key: &RefKey) -> Referent {
        let unreadable = |what: String, e: kube::Error| {
            Referent::Unreadable(format!("reading {what} failed: {e}"))
        };
        match key {
            RefKey::Template(ns, name) => {
                let api: Api<PodTemplate> = Api::namespaced(self.client.clone(), ns);
                match api.get_opt(name).await {
                    Ok(Some(t)) => Referent::Template(Arc::new(t)),
                    Ok(None) => Referent::Missing,
                    Err(e) => unreadable(format!("PodTemplate {ns}/{name}"), e),
                }
            }
            RefKey::Quotas(ns) => {
                let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), ns);
                match api.list(&ListParams::default()).await {
                    Ok(list) => Referent::Quotas(Arc::new(list.items)),
                    Err(e) => {
                        // Cluster-autoscaler's allocator cuts nothing when it cannot list them.
                        warn!(namespace = %ns, error = %e, "the ResourceQuotas could not be listed: its CapacityBuffers are not cut by them this pass");
                        unreadable(format!("the ResourceQuotas of {ns}"), e)
                    }
                }
            }
            RefKey::Scalable(ns, r) => {
                let Some((group, version, plural)) = scalable_resource(&r.api_group, &r.kind)
                else {
                    // Not read: the decision names the kind.
                    return Referent::Missing;
                };
                let ar = ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(group, version, &r.kind),
                    plural,
                );
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &ar);
                match api.get_opt(&r.name).await {
                    Ok(Some(o)) => match serde_json::to_value(o) {
                        Ok(v) => Referent::scalable(&v),
                        Err(e) => Referent::Unreadable(e.to_string()),
                    },
                    Ok(None) => Referent::Missing,
                    Err(e) => unreadable(format!("{} {ns}/{}", r.kind, r.name), e),
                }
            }
        }
    }
}

fn to_buffer(o: DynamicObject) -> Option<Buffer> {
    let v = serde_json::to_value(o).ok()?;
    Buffer::of(v).ok()
}

#[async_trait::async_trait]
impl BufferStore for KubeBuffers {
    async fn list(&self) -> Result<(Vec<Buffer>, Referents)> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &api_resource());
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| ProvReqError::List {
                what: "capacitybuffers",
                message: e.to_string(),
            })?;
        let buffers: Vec<Buffer> = list.items.into_iter().filter_map(to_buffer).collect();
        let mut referents = Referents::new();
        for b in buffers.iter().filter(|b| b.ours()) {
            // Every buffer is counted against its namespace's ResourceQuotas.
            let quotas = RefKey::Quotas(b.namespace().to_string());
            let keys = b.reference().ok().into_iter().chain([quotas]);
            for key in keys {
                if referents.contains_key(&key) {
                    continue;
                }
                let found = self.referent(&key).await;
                referents.insert(key, found);
            }
        }
        Ok((buffers, referents))
    }
}

#[async_trait::async_trait]
impl StatusStore<Buffer> for KubeBuffers {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Buffer>> {
        status_object::get(&self.client, namespace, name).await
    }

    async fn replace_status(&self, object: &serde_json::Value) -> Result<Buffer> {
        status_object::replace_status(&self.client, object).await
    }
}

impl StatusObject for Buffer {
    const KIND: &'static str = KIND;

    fn api_resource() -> ApiResource {
        api_resource()
    }

    fn of(object: serde_json::Value) -> Option<Self> {
        Buffer::of(object).ok()
    }

    fn key(&self) -> String {
        Buffer::key(self)
    }
}
