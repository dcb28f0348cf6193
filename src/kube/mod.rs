//! The controller's side of Kubernetes: a kube-rs client and leader election on a Lease with
//! `resourceVersion`-guarded updates and fencing at the Azure write path ([`lease`]), the status
//! ConfigMap the leader writes the same way ([`status`]) and cluster-autoscaler's, in its layout
//! ([`ca_status`]), and Events aggregated and rate-limited
//! like client-go's recorder ([`events`]), and the node writes of scale-down: our taint, the
//! cordon, evictions and the startup cleanup of leftover taints ([`nodes`]), and
//! ProvisioningRequests read and their status written under `resourceVersion` ([`provreq`]),
//! CapacityBuffers and what they refer to likewise ([`buffer`]).
//!
//! The reconciler knows nothing of Kubernetes: it asks a [`crate::fence::WriteFence`] before
//! every Azure write and reports through [`crate::notify::EventSink`].

pub mod access;
pub mod buffer;
pub mod ca_status;
pub mod events;
pub mod lease;
pub mod nodes;
pub mod provreq;
pub mod reflect;
pub mod status;
pub mod status_object;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use lease::{LeaseError, LeaseStore};

/// The Lease through the API server (kube-rs). Every update is a PUT carrying the
/// `resourceVersion` read; the server answers 409 Conflict when it is stale.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    /// Lease `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn classify(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
            LeaseError::AlreadyExists
        }
        kube::Error::Api(status) if status.code == 409 => LeaseError::Conflict,
        _ => LeaseError::Other(e.to_string()),
    }
}

#[async_trait::async_trait]
impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(classify)
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .create(&PostParams::default(), lease)
            .await
            .map_err(classify)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        if lease.metadata.resource_version.is_none() {
            // Never a blind update: without a version the server would accept it unconditionally.
            return Err(LeaseError::Other(
                "refusing to update the Lease without a resourceVersion".into(),
            ));
        }
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(classify)
    }
}

/// This replica's identity: the pod name (`POD_NAME`, from the downward API), else the host
/// name, plus a random suffix so a restarted pod never mistakes its predecessor's Lease for its own.
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .filter(|s| !s.trim().is_empty())
        })
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "vmss-capacity-controller".into());
    let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    format!("{}_{suffix}", base.trim())
}
