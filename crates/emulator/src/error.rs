//! The emulator's own errors (starting it, in-process control): shared by both rooms.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of the emulator's own API (starting it, in-process control).
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// The listener could not be bound.
    #[error("binding the emulator listener on {addr}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate or server configuration could not be built.
    #[error("building the emulator's TLS certificate: {0}")]
    Certificate(String),
    /// The CA PEM could not be written where asked.
    #[error("writing the emulator's CA certificate to {path}")]
    WriteCertificate {
        /// Where it was to be written.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be written where asked.
    #[error("writing the emulator's kubeconfig to {path}")]
    WriteKubeconfig {
        /// Where it was to be written.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig was asked of an emulator without its Kubernetes side.
    #[error("a kubeconfig needs the Kubernetes API: start the emulator with --kubernetes")]
    KubeconfigWithoutKubernetes,
    /// A certificate file was asked of a plain-HTTP emulator.
    #[error("a CA certificate file needs TLS: start the emulator with TLS on")]
    CertificateWithoutTls,
    /// An out-of-band write named a scale set that does not exist (ARM would answer 404).
    #[error("scale set {resource} not found")]
    NotFound {
        /// `sub/rg/name` of the missing scale set.
        resource: String,
    },
    /// A control request named an instance the scale set does not have.
    #[error("instance {resource} not found")]
    InstanceNotFound {
        /// `sub/rg/name/virtualMachines/id` of the missing instance.
        resource: String,
    },
    /// An out-of-band write or view named a managed cluster or agent pool that does not exist.
    #[error("managed cluster or agent pool {resource} not found")]
    AksNotFound {
        /// `sub/rg/cluster[/agentPools/pool]` of the missing resource.
        resource: String,
    },
    /// A seed or out-of-band write that AKS would refuse (e.g. a System pool at count 0).
    #[error("invalid AKS seed or write: {message}")]
    InvalidSeed {
        /// AKS's error message.
        message: String,
    },
    /// A spot eviction named a scale set Azure would not evict (not spot, or a policy the
    /// emulator does not model).
    #[error("cannot evict: {0}")]
    Eviction(String),
    /// A node registration (labels, taints) a kubelet or the API server would refuse.
    #[error("invalid node registration: {0}")]
    InvalidRegistration(String),
    /// An out-of-band write asked for a capacity outside 0..=1000.
    #[error("capacity {capacity} is outside 0..=1000")]
    InvalidCapacity {
        /// The refused capacity.
        capacity: i64,
    },
}
