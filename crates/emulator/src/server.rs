//! The server plumbing both rooms share: the accept loop (plain or TLS), one connection at a
//! time with a kill switch for faults, and [`Reply`], an answer kept structured until it is sent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
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

pub(crate) async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    router: Router,
) {
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
    /// JSON already serialized (a large LIST page written straight from the store).
    RawJson(Vec<u8>),
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: ReplyBody::Json(body),
        }
    }

    /// A body of serialized JSON.
    pub fn raw_json(status: u16, body: Vec<u8>) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: ReplyBody::RawJson(body),
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
            ReplyBody::RawJson(b) => (b, Some("application/json; charset=utf-8")),
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

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        self.render()
    }
}
