//! The emulator: a faithful Azure Resource Manager (VM scale sets, AKS clusters and agent pools,
//! identity, throttling, faults) and, with [`EmulatorBuilder::kubernetes`], a Kubernetes API, on
//! one listener. It honours the seeds' conditional-request table cell for cell and reports lost
//! updates (writes that replaced a version their writer had never read).
//!
//! Two rooms share only the plumbing: neither imports the other.
//!
//! | module | owns |
//! |---|---|
//! | `mod.rs` | the builder, the handle, and dispatch of each request to a room |
//! | [`arm`] | the ARM room: scale sets, AKS, identity, throttling, faults, `/_emulator/` |
//! | [`kube`] | the Kubernetes room: the API, watches, `/_emulator/kube/` |
//! | [`sim`] | the cluster simulation: instances become Nodes, pods get scheduled (the one module that reads both rooms) |
//! | `server` | plumbing: the accept loop, connections, the structured reply |
//! | `tls` | plumbing: the generated CA and leaf certificate |
//! | `error` | plumbing: [`EmulatorError`] |

pub mod arm;
pub mod audit;
mod error;
pub mod kube;
pub(crate) mod server;
pub mod sim;
mod tls;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use arm::registration::NodeRegistration;
pub use arm::{faults, state, throttle};
pub use arm::{AgentPoolSeed, AgentPoolView, ClusterSeed, ClusterView};
pub use error::EmulatorError;
pub use faults::{FaultKind, FaultSpec};
use server::{accept_loop, Reply};
pub use state::{
    EmulatorState, InstanceDeletion, LostUpdate, RequestRecord, ScaleSetSeed, ScaleSetView,
};
pub use throttle::{AksLimits, ThrottleLimits};

/// Default number of items per LIST page.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Default lifetime of issued tokens.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Configures and starts an emulator.
#[derive(Clone, Debug)]
pub struct EmulatorBuilder {
    listen: SocketAddr,
    tls: bool,
    lro_delay: Duration,
    throttling: Option<ThrottleLimits>,
    aks_throttling: Option<AksLimits>,
    page_size: usize,
    token_lifetime: Duration,
    kubernetes: Option<kube::KubeSettings>,
    simulation: Option<sim::SimSettings>,
    quotas: Vec<QuotaLimit>,
    /// `(subscription, resource group, scale set, registration)`.
    registrations: Vec<(String, String, String, NodeRegistration)>,
}

/// A vCPU quota limit an emulator starts with ([`EmulatorBuilder::quota`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaLimit {
    /// Subscription id.
    pub subscription: String,
    /// Azure region, e.g. `westeurope`.
    pub location: String,
    /// Usage name: a VM family (`standardDSv5Family`), `cores` or `lowPriorityCores`.
    pub name: String,
    /// The limit, in vCPUs.
    pub limit: i64,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        EmulatorBuilder {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tls: false,
            lro_delay: Duration::ZERO,
            throttling: None,
            aks_throttling: None,
            page_size: DEFAULT_PAGE_SIZE,
            token_lifetime: DEFAULT_TOKEN_LIFETIME,
            kubernetes: None,
            simulation: None,
            quotas: Vec::new(),
            registrations: Vec::new(),
        }
    }
}

impl EmulatorBuilder {
    /// Plain HTTP on `127.0.0.1:0`, no LRO delay, no throttling, pages of 100, tokens for 1 h.
    pub fn new() -> Self {
        Self::default()
    }

    /// Address to listen on.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serve HTTPS with a generated CA and leaf certificate.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Long-running operations stay `InProgress` (and resources `Updating`) this long.
    pub fn lro_delay(mut self, d: Duration) -> Self {
        self.lro_delay = d;
        self
    }

    /// Turns throttling on with these limits (AKS's resource provider's too, when `limits.aks`
    /// has them and [`EmulatorBuilder::aks_throttling`] names no others).
    pub fn throttling(mut self, limits: ThrottleLimits) -> Self {
        self.throttling = Some(limits);
        self
    }

    /// Turns AKS's resource-provider throttling on with these limits, with or without ARM's and
    /// Compute's ([`EmulatorBuilder::throttling`]).
    pub fn aks_throttling(mut self, limits: AksLimits) -> Self {
        self.aks_throttling = Some(limits);
        self
    }

    /// Items per LIST page (at least 1).
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = n.max(1);
        self
    }

    /// `expires_in` of issued tokens; tokens older than this are refused.
    pub fn token_lifetime(mut self, d: Duration) -> Self {
        self.token_lifetime = d;
        self
    }

    /// Also serve the Kubernetes API (`/api`, `/apis`, `/version`) on the same listener.
    pub fn kubernetes(mut self, on: bool) -> Self {
        self.kubernetes = on.then(|| self.kubernetes.take().unwrap_or_default());
        self
    }

    /// Settings of the Kubernetes side (token, watch history, bookmark interval); turns it on.
    pub fn kube_settings(mut self, settings: kube::KubeSettings) -> Self {
        self.kubernetes = Some(settings);
        self
    }

    /// Runs the cluster simulation ([`sim`]) with these settings: every instance becomes a Node,
    /// pending pods get scheduled, ReplicaSets and DaemonSets keep their pods. Only meaningful with
    /// the Kubernetes side on (ignored without it); off by default.
    pub fn cluster_simulation(mut self, settings: sim::SimSettings) -> Self {
        self.simulation = Some(settings);
        self
    }

    /// Starts with this vCPU quota limit set, as [`EmulatorState::set_quota`] sets it (until
    /// a reset); repeatable.
    pub fn quota(mut self, limit: QuotaLimit) -> Self {
        self.quotas.push(limit);
        self
    }

    /// Starts with scale set `name`'s new Nodes registering with `registration`'s labels and
    /// taints beyond its tags, as [`EmulatorState::set_node_registration`] sets it (the scale set
    /// need not exist yet; until a reset); a later call for the same scale set replaces it.
    pub fn node_registration(
        mut self,
        subscription: &str,
        resource_group: &str,
        name: &str,
        registration: NodeRegistration,
    ) -> Self {
        self.registrations.push((
            subscription.to_string(),
            resource_group.to_string(),
            name.to_string(),
            registration,
        ));
        self
    }

    /// Binds, generates the certificate if TLS is on, and starts serving in the background.
    pub async fn start(self) -> Result<EmulatorHandle, EmulatorError> {
        let listener =
            TcpListener::bind(self.listen)
                .await
                .map_err(|source| EmulatorError::Bind {
                    addr: self.listen,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind {
                addr: self.listen,
                source,
            })?;
        let material = if self.tls {
            Some(tls::generate()?)
        } else {
            None
        };
        let host = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let scheme = if self.tls { "https" } else { "http" };
        let base_url = format!("{scheme}://{}", SocketAddr::new(host, addr.port()));
        let state = EmulatorState::new(
            state::Settings {
                lro_delay: self.lro_delay,
                page_size: self.page_size,
                token_lifetime: self.token_lifetime,
                throttling: self.throttling,
                aks_throttling: self.aks_throttling.or(self.throttling.and_then(|t| t.aks)),
            },
            base_url.clone(),
        );
        for q in &self.quotas {
            state.set_quota(&q.subscription, &q.location, &q.name, q.limit);
        }
        for (sub, rg, name, r) in &self.registrations {
            state.preset_node_registration(sub, rg, name, r.clone());
        }
        let kube = self.kubernetes.map(|settings| {
            kube::KubeState::new(settings, SocketAddr::new(host, addr.port()).to_string())
        });
        let sides = Sides {
            arm: state.clone(),
            kube: kube.clone(),
        };
        let router = Router::new().fallback(dispatch).with_state(sides);
        let acceptor = material
            .as_ref()
            .map(|m| TlsAcceptor::from(Arc::clone(&m.config)));
        let accept_task = tokio::spawn(accept_loop(listener, acceptor, router));
        let sim_losses = sim::LossLog::default();
        let sim_task = match (self.simulation, &kube) {
            (Some(settings), Some(k)) => Some(sim::spawn(
                state.clone(),
                k.clone(),
                settings,
                Arc::clone(&sim_losses),
            )),
            _ => None,
        };
        Ok(EmulatorHandle {
            sim_task,
            sim_losses,
            addr,
            base_url,
            ca_pem: material.map(|m| m.ca_pem),
            state,
            kube,
            accept_task,
        })
    }
}

/// A running emulator; stops serving (and drops every connection) when dropped.
#[derive(Debug)]
pub struct EmulatorHandle {
    addr: SocketAddr,
    base_url: String,
    ca_pem: Option<String>,
    state: EmulatorState,
    kube: Option<kube::KubeState>,
    accept_task: tokio::task::JoinHandle<()>,
    sim_task: Option<tokio::task::JoinHandle<()>>,
    sim_losses: sim::LossLog,
}

/// What the router hands each request: the ARM side, and the Kubernetes side when on.
#[derive(Clone)]
struct Sides {
    arm: EmulatorState,
    kube: Option<kube::KubeState>,
}

impl EmulatorHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// PEM of the CA that signed the TLS leaf (`None` for plain HTTP).
    pub fn ca_pem(&self) -> Option<String> {
        self.ca_pem.clone()
    }

    /// In-process control of the emulator.
    pub fn state(&self) -> EmulatorState {
        self.state.clone()
    }

    /// In-process control of the Kubernetes side (`None` unless it was turned on).
    pub fn kube(&self) -> Option<kube::KubeState> {
        self.kube.clone()
    }

    /// Pods the cluster simulation deleted with their Node when the Node's instance went (not
    /// evicted through the API), oldest first; empty without the simulation.
    pub fn pods_lost_with_nodes(&self) -> Vec<sim::PodLoss> {
        self.sim_losses.lock().clone()
    }

    /// A kubeconfig for the Kubernetes side (`None` unless it was turned on).
    pub fn kubeconfig(&self) -> Option<String> {
        let k = self.kube.as_ref()?;
        Some(kube::kubeconfig(
            &self.base_url,
            &k.token(),
            self.ca_pem.as_deref(),
        ))
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        // The accept task owns the JoinSet of connections: aborting it aborts them all.
        self.accept_task.abort();
        if let Some(sim) = &self.sim_task {
            sim.abort();
        }
    }
}

/// Starts an emulator, writes the CA PEM to `cert_out` if given, prints
/// `emulator listening on <base_url>` and serves until `shutdown` completes.
pub async fn serve_until(
    builder: EmulatorBuilder,
    cert_out: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EmulatorError> {
    serve_until_with_kubeconfig(builder, cert_out, None, Vec::new(), shutdown).await
}

/// [`serve_until`], also writing a kubeconfig for the Kubernetes side to `kubeconfig_out` and
/// creating the scale sets of `seeds` before it announces its address.
pub async fn serve_until_with_kubeconfig(
    builder: EmulatorBuilder,
    cert_out: Option<PathBuf>,
    kubeconfig_out: Option<PathBuf>,
    seeds: Vec<ScaleSetSeed>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EmulatorError> {
    let handle = builder.start().await?;
    for seed in seeds {
        handle.state().seed_scale_set(seed);
    }
    if let Some(path) = kubeconfig_out {
        let text = handle
            .kubeconfig()
            .ok_or(EmulatorError::KubeconfigWithoutKubernetes)?;
        tokio::fs::write(&path, text)
            .await
            .map_err(|source| EmulatorError::WriteKubeconfig { path, source })?;
    }
    if let Some(path) = cert_out {
        let pem = handle
            .ca_pem()
            .ok_or(EmulatorError::CertificateWithoutTls)?;
        tokio::fs::write(&path, pem)
            .await
            .map_err(|source| EmulatorError::WriteCertificate { path, source })?;
    }
    println!("emulator listening on {}", handle.base_url());
    shutdown.await;
    drop(handle);
    Ok(())
}

async fn dispatch(State(sides): State<Sides>, req: Request) -> Response {
    let state = sides.arm;
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return Reply::arm_error(
                400,
                "InvalidRequestContent",
                "The request body is too large or unreadable.",
            )
            .into_response()
        }
    };
    let path = parts.uri.path();
    // The retail prices API's path starts like a Kubernetes one: the ARM room answers it.
    if path == arm::retail_prices::PATH {
        return arm::handle(&state, &parts, bytes).await;
    }
    if let Some(kube) = &sides.kube {
        if let Some(rest) = path.strip_prefix("/_emulator/kube") {
            let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
            return kube::control::handle(kube, parts.method.as_str(), &segs, &bytes)
                .into_response();
        }
        if kube::owns_path(path) {
            let resource = kube::resource_of(path);
            let per_kind = resource.map(|r| kube.kind_delay(r)).unwrap_or_default();
            let delay = kube.latency() + per_kind.latency;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let response = kube::handle(kube, &parts, &bytes);
            if !per_kind.slow_answer.is_zero() {
                tokio::time::sleep(per_kind.slow_answer).await;
            }
            kube.log_request(kube::KubeRequestRecord {
                seq: 0,
                method: parts.method.to_string(),
                path: path.to_string(),
                query: parts.uri.query().map(str::to_string),
                resource: resource.map(str::to_string),
                status: response.status().as_u16(),
                user_agent: parts
                    .headers
                    .get(http::header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
            });
            return response;
        }
    }
    arm::handle(&state, &parts, bytes).await
}
