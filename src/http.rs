//! `/metrics` (Prometheus text), `/healthz` (the loop made progress recently) and `/readyz`
//! (the first full refresh is done; with Kubernetes, the reflectors' first full lists too; with
//! leader election, the first Lease attempt: a ready standby can take over at once). The listen address comes from configuration, never a
//! constant. Answers carry no secrets: only metric values and a one-word status.

use crate::fence::WriteFence;
use crate::kube::lease::Leadership;
use crate::kube::reflect::ClusterView;
use crate::metrics::Metrics;
use crate::reconciler::Reconciler;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What `/readyz` waits for besides the first scale-set refresh (nothing by default).
#[derive(Clone, Default)]
pub struct Readiness {
    /// With leader election: the first Lease attempt.
    pub election: Option<Arc<Leadership>>,
    /// With Kubernetes: the reflectors' first full list of every kind.
    pub cluster: Option<Arc<ClusterView>>,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    readiness: Readiness,
}

/// The router, for tests that serve it themselves. `/readyz` also waits for what `readiness`
/// names, so a ready standby is one that can take over at once.
pub fn router(metrics: Arc<Metrics>, reconciler: Arc<Reconciler>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics,
            reconciler,
            readiness,
        })
}

/// Binds `addr` and serves until `shutdown`. Returns the bound address through `bound` first,
/// so a caller that asked for port 0 learns the port.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    readiness: Readiness,
    shutdown: CancellationToken,
    bound: tokio::sync::oneshot::Sender<SocketAddr>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let _ = bound.send(listener.local_addr()?);
    axum::serve(listener, router(metrics, reconciler, readiness))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    if s.reconciler.health().live(s.reconciler.started()) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "reconcile loop made no progress recently\n",
        )
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if !s.reconciler.health().ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "first scale-set refresh not done yet\n",
        );
    }
    if let Some(cluster) = &s.readiness.cluster {
        if !cluster.synced() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "first full list of nodes, pods, PDBs and DaemonSets not done yet\n",
            );
        }
    }
    match &s.readiness.election {
        None => (StatusCode::OK, "ready\n"),
        Some(e) if !e.settled() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "first Lease attempt not done yet\n",
        ),
        Some(e) if e.check().is_ok() => (StatusCode::OK, "ready: leading\n"),
        Some(_) => (StatusCode::OK, "ready: standby, can take over\n"),
    }
}
