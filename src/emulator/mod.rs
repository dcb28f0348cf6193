//! A faithful Azure Resource Manager emulator: VM scale sets, AKS clusters and agent pools,
//! identity (AAD token endpoint, IMDS), throttling, faults, TLS, and a control API under
//! `/_emulator/`. It honours the seeds' conditional-request table cell for cell and reports lost
//! updates (writes that replaced a version their writer had never read).
//!
//! | module | owns |
//! |---|---|
//! | `mod.rs` | the builder, the handle, the accept loop and request dispatch |
//! | [`state`] | resources, versions, lost-update tracking, the request log |
//! | `arm` | the ARM scale-set routes, preconditions, long-running operations |
//! | `aks` | managed clusters, agent pools and the scale sets behind them |
//! | `identity` | the token endpoint, OpenID discovery, IMDS |
//! | [`throttle`] | token buckets and rate-limit headers |
//! | [`faults`] | scriptable faults |
//! | `tls` | the generated CA and leaf certificate |
//! | `control` | the `/_emulator/` API |
//! | [`kube`] | the Kubernetes API (with [`EmulatorBuilder::kubernetes`]), its own room |

mod aks;
mod arm;
mod control;
pub mod faults;
mod identity;
pub mod kube;
pub mod state;
pub mod throttle;
mod tls;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{HeaderName, HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

pub use aks::{AgentPoolSeed, AgentPoolView, ClusterSeed, ClusterView};
pub use faults::{FaultKind, FaultSpec};
pub use state::{EmulatorState, LostUpdate, RequestRecord, ScaleSetSeed, ScaleSetView};
pub use throttle::ThrottleLimits;

/// Default number of items per LIST page.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Default lifetime of issued tokens.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

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
    /// An out-of-band write asked for a capacity outside 0..=1000.
    #[error("capacity {capacity} is outside 0..=1000")]
    InvalidCapacity {
        /// The refused capacity.
        capacity: i64,
    },
}

/// Configures and starts an emulator.
#[derive(Clone, Debug)]
pub struct EmulatorBuilder {
    listen: SocketAddr,
    tls: bool,
    lro_delay: Duration,
    throttling: Option<ThrottleLimits>,
    page_size: usize,
    token_lifetime: Duration,
    kubernetes: Option<kube::KubeSettings>,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        EmulatorBuilder {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tls: false,
            lro_delay: Duration::ZERO,
            throttling: None,
            page_size: DEFAULT_PAGE_SIZE,
            token_lifetime: DEFAULT_TOKEN_LIFETIME,
            kubernetes: None,
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

    /// Turns throttling on with these limits.
    pub fn throttling(mut self, limits: ThrottleLimits) -> Self {
        self.throttling = Some(limits);
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
            },
            base_url.clone(),
        );
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
        Ok(EmulatorHandle {
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
    }
}

/// Starts an emulator, writes the CA PEM to `cert_out` if given, prints
/// `emulator listening on <base_url>` and serves until `shutdown` completes.
pub async fn serve_until(
    builder: EmulatorBuilder,
    cert_out: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EmulatorError> {
    serve_until_with_kubeconfig(builder, cert_out, None, shutdown).await
}

/// [`serve_until`], also writing a kubeconfig for the Kubernetes side to `kubeconfig_out`.
pub async fn serve_until_with_kubeconfig(
    builder: EmulatorBuilder,
    cert_out: Option<PathBuf>,
    kubeconfig_out: Option<PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EmulatorError> {
    let handle = builder.start().await?;
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

/// Per-connection signal: firing it closes the connection without sending anything.
#[derive(Clone)]
pub(crate) struct ConnKill(Arc<Notify>);

impl ConnKill {
    /// Closes the connection without an answer and never returns.
    pub(crate) async fn drop_connection(&self) -> ! {
        self.0.notify_one();
        std::future::pending::<()>().await;
        unreachable!("a pending future never completes")
    }
}

async fn accept_loop(listener: TcpListener, acceptor: Option<TlsAcceptor>, router: Router) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let router = router.clone();
                    let acceptor = acceptor.clone();
                    conns.spawn(async move {
                        match acceptor {
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(tls) => serve_connection(tls, router).await,
                                Err(e) => tracing::debug!(error = %e, "emulator TLS handshake failed"),
                            },
                            None => serve_connection(stream, router).await,
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "emulator accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection<I>(io: I, router: Router)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let conn_kill = ConnKill(Arc::clone(&kill));
    let svc = tower::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(conn_kill.clone());
        router.clone().oneshot(req.map(Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc));
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                tracing::debug!(error = %e, "emulator connection ended with an error");
            }
        }
        _ = kill.notified() => {}
    }
}

/// An answer being built: kept structured so faults can strip the ETag or cut the body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: ReplyBody,
}

#[derive(Debug)]
pub(crate) enum ReplyBody {
    Empty,
    Json(Value),
    Text(String),
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: ReplyBody::Json(body),
        }
    }

    pub fn empty(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: ReplyBody::Empty,
        }
    }

    /// ARM's error shape: `{"error":{"code","message"}}`.
    pub fn arm_error(status: u16, code: &str, message: impl Into<String>) -> Self {
        Reply::json(
            status,
            json!({"error": {"code": code, "message": message.into()}}),
        )
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    pub fn push_header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.push((name.to_string(), value.into()));
    }

    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    }

    pub fn render(self) -> Response {
        let (bytes, content_type) = match self.body {
            ReplyBody::Empty => (Vec::new(), None),
            ReplyBody::Json(v) => (
                serde_json::to_vec(&v).unwrap_or_default(),
                Some("application/json; charset=utf-8"),
            ),
            ReplyBody::Text(t) => (t.into_bytes(), Some("application/json; charset=utf-8")),
        };
        let mut resp = Response::new(Body::from(bytes));
        *resp.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = resp.headers_mut();
        if let Some(ct) = content_type {
            headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        for (name, value) in self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(n, v);
            }
        }
        resp
    }
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
    if let Some(kube) = &sides.kube {
        if let Some(rest) = path.strip_prefix("/_emulator/kube") {
            let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
            return kube::control::handle(kube, parts.method.as_str(), &segs, &bytes)
                .into_response();
        }
        if kube::owns_path(path) {
            return kube::handle(kube, &parts, &bytes);
        }
    }
    if path == "/_emulator" || path.starts_with("/_emulator/") {
        return control::handle(&state, &parts, &bytes).into_response();
    }
    if let Some(reply) = identity::handle(&state, &parts, &bytes) {
        let mut d = state.lock();
        d.seq += 1;
        let seq = d.seq;
        d.log(RequestRecord {
            seq,
            method: parts.method.as_str().to_string(),
            path: path.to_string(),
            if_match: None,
            if_none_match: None,
            status: reply.status,
            writer: None,
            body_capacity: None,
        });
        return reply.into_response();
    }
    arm::handle(&state, &parts, bytes).await.into_response()
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        self.render()
    }
}
