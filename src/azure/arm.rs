//! The ARM client for scale sets, on `azure_mgmt_compute` 0.21 with its traps avoided:
//!
//! - PUTs use `.send()` only. Awaiting the builder runs the crate's "LRO" loop, which re-sends
//!   the PUT with the same `If-Match` and turns our own success into a 412. We poll
//!   `Azure-AsyncOperation` ourselves ([`ArmClient::poll_operation`]).
//! - The built-in retry policy is off (`RetryOptions::none()`): retrying a write is a decision the
//!   reconciler makes, never a reflex. Our own `reqwest` client sets request timeouts.
//! - A response policy ([`ResponsePolicy`]) keeps what error answers carry (`Retry-After`, the
//!   ARM error code and message) and records `x-ms-ratelimit-remaining-*` on every answer.
//! - The capacity PUT body is sparse, `{name, location, sku{name, tier, capacity}}` plus
//!   `extendedLocation`, never the model read back from a GET.
//! - Every call first checks the `Retry-After` gate of its class.

use crate::azure::budget::{ArmBudget, BudgetClass};
use crate::azure::throttle::{parse_retry_after, CallClass, ThrottleGates};
use crate::cache::{Instance, ScaleSet};
use crate::metrics::Metrics;
use azure_core::auth::TokenCredential;
use azure_core::error::ErrorKind;
use azure_core::headers::{HeaderName, Headers, AZURE_ASYNCOPERATION, ETAG};
use azure_core::{
    ClientOptions, Context, Policy, PolicyResult, Request, RetryOptions, TransportOptions, Url,
};
use azure_mgmt_compute::package_2024_07_01 as compute;
use compute::models;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The compute API version of every scale-set call (the one `package_2024_07_01` sends).
pub const COMPUTE_API_VERSION: &str = "2024-07-01";

/// The token scope for ARM, whatever the endpoint (the SDK would derive it from the endpoint).
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// The ARM operations this client makes, for metrics and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmOp {
    /// LIST scale sets in the resource group.
    ListScaleSets,
    /// GET one scale set.
    GetScaleSet,
    /// PUT capacity.
    PutCapacity,
    /// LIST a scale set's VM instances.
    ListInstances,
    /// GET an `Azure-AsyncOperation` status.
    PollOperation,
    /// LIST a managed cluster's agent pools.
    ListAgentPools,
    /// GET one agent pool.
    GetAgentPool,
    /// PUT an agent pool (its `count`).
    PutAgentPool,
    /// GET a managed cluster (for its node resource group).
    GetManagedCluster,
    /// POST a scale set's `delete` action (named instances).
    DeleteInstances,
    /// POST an agent pool's `deleteMachines` action (named machines).
    DeleteMachines,
    /// LIST a region's compute usages (vCPU quota).
    ListUsages,
}

impl ArmOp {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ArmOp::ListScaleSets => "list_scale_sets",
            ArmOp::GetScaleSet => "get_scale_set",
            ArmOp::PutCapacity => "put_capacity",
            ArmOp::ListInstances => "list_instances",
            ArmOp::PollOperation => "poll_operation",
            ArmOp::ListAgentPools => "list_agent_pools",
            ArmOp::GetAgentPool => "get_agent_pool",
            ArmOp::PutAgentPool => "put_agent_pool",
            ArmOp::GetManagedCluster => "get_managed_cluster",
            ArmOp::DeleteInstances => "delete_instances",
            ArmOp::DeleteMachines => "delete_machines",
            ArmOp::ListUsages => "list_usages",
        }
    }

    /// Which throttle class the call spends.
    pub fn class(self) -> CallClass {
        match self {
            ArmOp::PutCapacity
            | ArmOp::PutAgentPool
            | ArmOp::DeleteInstances
            | ArmOp::DeleteMachines => CallClass::Write,
            _ => CallClass::Read,
        }
    }
}

impl std::fmt::Display for ArmOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The concurrency precondition of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// No header: a blind write (`enableVMSSEtag: false`).
    None,
    /// `If-Match: <etag>`, exactly as ARM returned it.
    IfMatch(String),
    /// `If-None-Match: *`: create only.
    IfNoneMatch,
}

impl Precondition {
    /// The `If-Match` value sent, for logs.
    pub fn if_match(&self) -> Option<&str> {
        match self {
            Precondition::IfMatch(e) => Some(e),
            _ => None,
        }
    }
}

/// A PUT that ARM accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct PutAccepted {
    /// 200 or 201.
    pub status: u16,
    /// The new ETag (header, else body); `None` when ARM sent none.
    pub etag: Option<String>,
    /// `Azure-AsyncOperation` URL to poll, if any.
    pub async_operation: Option<String>,
    /// Server's poll interval hint.
    pub retry_after: Option<Duration>,
    /// The scale set as the answer described it (capacity = what we wrote when the body is unreadable).
    pub scale_set: ScaleSet,
}

/// A delete of named instances (a scale set's `delete`, an agent pool's `deleteMachines`) that
/// ARM accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteAccepted {
    /// 200 (done, nothing to follow) or 202 (accepted, follow `async_operation`).
    pub status: u16,
    /// The URL to poll with [`ArmClient::poll_operation`]: `Azure-AsyncOperation`, else
    /// `Location`; `None` on a 200, which is final.
    pub async_operation: Option<String>,
    /// Server's poll interval hint.
    pub retry_after: Option<Duration>,
}

impl DeleteAccepted {
    /// What a 2xx answer to a delete action means: a 200 is final (no operation to follow), a
    /// 202 is followed through `Azure-AsyncOperation`, else `Location`.
    pub fn from_answer(answer: &JsonAnswer) -> Self {
        let async_operation = if answer.status == 200 {
            None
        } else {
            answer
                .async_operation
                .clone()
                .or_else(|| answer.location.clone())
        };
        DeleteAccepted {
            status: answer.status,
            async_operation,
            retry_after: answer.retry_after,
        }
    }
}

/// A 2xx answer to [`ArmClient::send_json`].
#[derive(Debug, Clone, PartialEq)]
pub struct JsonAnswer {
    /// HTTP status.
    pub status: u16,
    /// The `ETag` header, if any.
    pub etag: Option<String>,
    /// The `Azure-AsyncOperation` header, if any.
    pub async_operation: Option<String>,
    /// The `Location` header, if any (an operation-result URL on a 202).
    pub location: Option<String>,
    /// The server's `Retry-After` hint, if any.
    pub retry_after: Option<Duration>,
    /// The body.
    pub body: Vec<u8>,
}

/// Final or current state of a long-running operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationStatus {
    /// Still running.
    InProgress,
    /// Done.
    Succeeded,
    /// Failed, with ARM's error.
    Failed(OperationError),
    /// Canceled.
    Canceled,
}

/// The error an operation ended with (its status body's `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationError {
    /// ARM's error code (`AllocationFailed`, ...; `Failed` when the body named none).
    pub code: String,
    /// ARM's message (empty when the body had none).
    pub message: String,
}

impl OperationError {
    /// The allocation failure this is, if it is one.
    pub fn allocation_failure(&self) -> Option<super::AllocationFailure> {
        super::AllocationFailure::classify(&self.code, &self.message)
    }
}

impl std::fmt::Display for OperationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            f.write_str(&self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

/// Why an ARM call failed. Variants say what the caller does next.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// 412: the `If-Match` ETag is stale (or the resource is absent and `If-Match` was sent).
    #[error("{op} {scale_set}: precondition failed: {message}")]
    PreconditionFailed {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
        /// ARM's message.
        message: String,
    },
    /// 404.
    #[error("{op} {scale_set}: not found")]
    NotFound {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
    },
    /// 429 from ARM, or held back locally by an earlier 429's `Retry-After`.
    #[error("{op}: throttled, retry after {}s{}", retry_after.as_secs_f64(), if *local { " (held back locally)" } else { "" })]
    Throttled {
        /// Operation.
        op: ArmOp,
        /// How long to wait.
        retry_after: Duration,
        /// The call never left the process.
        local: bool,
    },
    /// Azure would not allocate (a 400 or 409 whose code says so): quota, a size not offered
    /// here, no capacity ([`AllocationFailure`](super::AllocationFailure)).
    #[error("{op} {scale_set}: {failure} ({code}): {message}")]
    Allocation {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
        /// The class.
        failure: super::AllocationFailure,
        /// ARM error code.
        code: String,
        /// ARM's message.
        message: String,
    },
    /// 401/403: the identity is not accepted or not allowed.
    #[error("{op}: ARM refused the identity ({status} {code}): {message}")]
    Unauthorized {
        /// Operation.
        op: ArmOp,
        /// HTTP status.
        status: u16,
        /// ARM error code.
        code: String,
        /// ARM's message.
        message: String,
    },
    /// Any other HTTP error status.
    #[error("{op} {scale_set}: ARM answered {status} {code}: {message}")]
    Http {
        /// Operation.
        op: ArmOp,
        /// Scale set (empty for resource-group calls).
        scale_set: String,
        /// HTTP status.
        status: u16,
        /// ARM error code.
        code: String,
        /// ARM's message.
        message: String,
    },
    /// A write whose request may have reached ARM but whose answer was lost (timeout, reset):
    /// it may or may not have committed. Never resend blindly; GET first.
    #[error("{op} {scale_set}: outcome unknown, the answer was lost after the request was sent")]
    Ambiguous {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
        /// The transport error.
        #[source]
        source: azure_core::Error,
    },
    /// Connection or timeout on a read.
    #[error("{op} {scale_set}: transport error")]
    Transport {
        /// Operation.
        op: ArmOp,
        /// Scale set (empty for resource-group calls).
        scale_set: String,
        /// The transport error.
        #[source]
        source: azure_core::Error,
    },
    /// The answer did not parse or lacked a required field.
    #[error("{op} {scale_set}: malformed ARM response: {detail}")]
    Decode {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
        /// What was wrong.
        detail: String,
    },
    /// No token could be obtained.
    #[error("{op}: could not get a token")]
    Credential {
        /// Operation.
        op: ArmOp,
        /// Why.
        #[source]
        source: azure_core::Error,
    },
    /// Not sent: the write's fence closed between its admission and the moment its bytes were
    /// to leave ([`crate::fence::last_check`]).
    #[error("{op} {scale_set}: not sent: {hold}")]
    Fenced {
        /// Operation.
        op: ArmOp,
        /// Scale set.
        scale_set: String,
        /// Why the fence held it.
        hold: crate::fence::FenceHold,
    },
}

impl ArmError {
    /// Label for `capacity_writes_total{result}` and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ArmError::PreconditionFailed { .. } => "precondition_failed",
            ArmError::Throttled { .. } => "throttled",
            ArmError::Allocation { failure, .. } => failure.label(),
            ArmError::NotFound { .. }
            | ArmError::Unauthorized { .. }
            | ArmError::Http { .. }
            | ArmError::Ambiguous { .. }
            | ArmError::Transport { .. }
            | ArmError::Decode { .. }
            | ArmError::Credential { .. } => "error",
            ArmError::Fenced { .. } => "fenced",
        }
    }

    /// Whether backing off and trying again later can help (5xx, transport, throttling).
    pub fn is_retryable(&self) -> bool {
        match self {
            ArmError::Throttled { .. }
            | ArmError::Transport { .. }
            | ArmError::Ambiguous { .. } => true,
            // 409: another operation on the resource is in progress (an allocation 409 is
            // `Allocation`).
            ArmError::Http { status, .. } => *status >= 500 || *status == 408 || *status == 409,
            ArmError::Credential { .. } | ArmError::Decode { .. } => true,
            ArmError::PreconditionFailed { .. }
            | ArmError::NotFound { .. }
            | ArmError::Allocation { .. }
            | ArmError::Unauthorized { .. }
            | ArmError::Fenced { .. } => false,
        }
    }

    /// How long ARM asked us to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ArmError::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// The error body and headers of a non-2xx answer, kept by [`ResponsePolicy`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("ARM answered {status} {code}: {message}")]
pub struct ArmHttpError {
    /// HTTP status.
    pub status: u16,
    /// ARM error code (header `x-ms-error-code`, else body `error.code`).
    pub code: String,
    /// ARM error message.
    pub message: String,
    /// Parsed `Retry-After` family.
    pub retry_after: Option<Duration>,
}

/// Per-retry pipeline policy (between the retry policy and the transport): records rate-limit
/// headers of every answer and turns a non-2xx answer into an error that keeps its headers.
#[derive(Debug)]
pub struct ResponsePolicy {
    metrics: Arc<Metrics>,
    budget: Arc<ArmBudget>,
    user_agent: UserAgent,
}

/// This process's `User-Agent` prefix: `vmss-capacity-controller/<version>`, and once
/// [`ArmClient::set_instance`] named it, `(instance <identity>)`, so Azure's activity log and the
/// emulator's request log tell replicas apart.
#[derive(Clone, Debug, Default)]
struct UserAgent(Arc<parking_lot::RwLock<Option<String>>>);

impl UserAgent {
    const PRODUCT: &'static str = concat!("vmss-capacity-controller/", env!("CARGO_PKG_VERSION"));

    fn value(&self) -> String {
        match self.0.read().as_deref() {
            Some(id) => format!("{} (instance {id})", Self::PRODUCT),
            None => Self::PRODUCT.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl Policy for ResponsePolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        // Ours first, then the SDK's own (`azsdk-rust-...`), as an application id would be.
        let ua = HeaderName::from_static("user-agent");
        let value = match request.headers().get_optional_str(&ua) {
            Some(sdk) => format!("{} {sdk}", self.user_agent.value()),
            None => self.user_agent.value(),
        };
        request.insert_header(ua, value);
        // The last step before the bytes leave: a write's fence is asked once more, and the
        // answer is awaited no longer than the lease stays valid.
        let bound = if *request.method() == azure_core::Method::Get {
            None
        } else {
            crate::fence::last_check().map_err(|hold| {
                azure_core::Error::new(ErrorKind::Other, crate::fence::FencedAtSend(hold))
            })?
        };
        let sent = next[0].send(ctx, request, &next[1..]);
        let rsp = match bound {
            None => sent.await?,
            Some(d) => tokio::time::timeout(d, sent).await.map_err(|_| {
                azure_core::Error::message(
                    ErrorKind::Io,
                    "no answer before the lease's validity ran out (the write may have landed)",
                )
            })??,
        };
        record_ratelimits(
            &self.metrics,
            &self.budget,
            rsp.headers(),
            request.url().path(),
        );
        let status = rsp.status();
        if (status as u16) < 300 {
            return Ok(rsp);
        }
        let (status, headers, body) = rsp.deconstruct();
        let body = body.collect().await.unwrap_or_default();
        let kind = ErrorKind::http_response_from_parts(status, &headers, &body);
        Err(azure_core::Error::new(
            kind,
            http_error(status as u16, &headers, &body),
        ))
    }
}

fn header<'h>(headers: &'h Headers, name: &'static str) -> Option<&'h str> {
    headers.get_optional_str(&HeaderName::from_static(name))
}

/// Records what is left of each bucket an answer to a request for `path` was charged to.
fn record_ratelimits(metrics: &Metrics, budget: &ArmBudget, headers: &Headers, path: &str) {
    let mut region = None;
    for (k, v) in headers.iter() {
        let Some(scope) = k.as_str().strip_prefix("x-ms-ratelimit-remaining-") else {
            continue;
        };
        let v = v.as_str();
        if scope == "resource" {
            // "Microsoft.Compute/UpdateVMScaleSet3Min;7,Microsoft.Compute/...;12": one per policy.
            for part in v.split(',') {
                if let Some((policy, n)) = part.trim().rsplit_once(';') {
                    if let Ok(n) = n.trim().parse::<i64>() {
                        let policy = policy.trim();
                        metrics
                            .arm_ratelimit_remaining
                            .with_label_values(&[policy])
                            .set(n);
                        let (provider, name) = policy.rsplit_once('/').unwrap_or(("", policy));
                        metrics
                            .arm_budget_remaining
                            .with_label_values(&[provider, name])
                            .set(n);
                        let region = region.get_or_insert_with(|| budget.region_of(path));
                        budget.observe_in(region.as_deref(), policy, n);
                    }
                }
            }
        } else if let Ok(n) = v.trim().parse::<i64>() {
            metrics
                .arm_ratelimit_remaining
                .with_label_values(&[scope])
                .set(n);
            // "subscription-writes" → (subscription, writes).
            let (bucket, class) = scope.split_once('-').unwrap_or((scope, ""));
            metrics
                .arm_budget_remaining
                .with_label_values(&[bucket, class])
                .set(n);
            budget.observe(scope, n);
        }
    }
    for class in BudgetClass::ALL {
        if let Some(f) = budget.fraction(class) {
            metrics
                .arm_budget_fraction
                .with_label_values(&[class.label()])
                .set(f);
        }
    }
}

fn http_error(status: u16, headers: &Headers, body: &[u8]) -> ArmHttpError {
    #[derive(serde::Deserialize)]
    struct Body {
        error: Option<Inner>,
        code: Option<String>,
        message: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        code: Option<String>,
        message: Option<String>,
    }
    let parsed: Option<Body> = serde_json::from_slice(body).ok();
    let (code, message) = match parsed {
        Some(Body { error: Some(e), .. }) => (e.code, e.message),
        Some(b) => (b.code, b.message),
        None => (None, None),
    };
    let code = header(headers, "x-ms-error-code")
        .map(str::to_string)
        .or(code)
        .unwrap_or_default();
    let message = message
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    let retry_after = parse_retry_after(
        |n| header(headers, static_name(n)),
        std::time::SystemTime::now(),
    );
    ArmHttpError {
        status,
        code,
        message,
        retry_after,
    }
}

fn static_name(n: &str) -> &'static str {
    match n {
        "retry-after-ms" => "retry-after-ms",
        "x-ms-retry-after-ms" => "x-ms-retry-after-ms",
        _ => "retry-after",
    }
}

/// Where the client points and as whom.
#[derive(Clone)]
pub struct ArmTarget {
    /// ARM endpoint (the SDK drops any path prefix).
    pub endpoint: Url,
    /// Subscription id.
    pub subscription: String,
    /// Resource group of the scale sets.
    pub resource_group: String,
}

/// Scale-set operations against ARM.
pub struct ArmClient {
    compute: compute::Client,
    http: reqwest::Client,
    credential: Arc<dyn TokenCredential>,
    target: ArmTarget,
    gates: ThrottleGates,
    metrics: Arc<Metrics>,
    user_agent: UserAgent,
    budget: Arc<ArmBudget>,
}

impl std::fmt::Debug for ArmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArmClient")
            .field("endpoint", &self.target.endpoint.as_str())
            .field("subscription", &self.target.subscription)
            .field("resource_group", &self.target.resource_group)
            .finish()
    }
}

/// Builds the HTTP client used for ARM and token calls: timeouts, connection reuse, rustls, and
/// an optional extra trusted root (e.g. the emulator's CA).
pub fn http_client(
    timeout: Duration,
    extra_root_pem: Option<&[u8]>,
) -> Result<reqwest::Client, reqwest::Error> {
    let mut b = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!(
            "vmss-capacity-controller/",
            env!("CARGO_PKG_VERSION")
        ));
    if let Some(pem) = extra_root_pem {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem)?);
    }
    b.build()
}

impl ArmClient {
    /// A client for `target`, sending through `http` with `credential`.
    pub fn new(
        target: ArmTarget,
        credential: Arc<dyn TokenCredential>,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let user_agent = UserAgent::default();
        let budget = Arc::new(ArmBudget::default());
        let mut options = ClientOptions::default()
            .retry(RetryOptions::none())
            .transport(TransportOptions::new(Arc::new(http.clone())));
        options
            .per_retry_policies_mut()
            .push(Arc::new(ResponsePolicy {
                metrics: metrics.clone(),
                budget: budget.clone(),
                user_agent: user_agent.clone(),
            }));
        let compute = compute::Client::new(
            target.endpoint.clone(),
            credential.clone(),
            vec![ARM_SCOPE.to_string()],
            options,
        );
        Self {
            compute,
            http,
            credential,
            target,
            gates: ThrottleGates::new(),
            metrics,
            user_agent,
            budget,
        }
    }

    /// The subscription's API budget as Azure's answers to this client reported it.
    pub fn budget(&self) -> &ArmBudget {
        &self.budget
    }

    /// Names this replica in the `User-Agent` of every later request
    /// (`vmss-capacity-controller/<version> (instance <identity>)`): with leader election, the
    /// Lease identity, so each replica's Azure calls can be told apart.
    pub fn set_instance(&self, identity: &str) {
        *self.user_agent.0.write() = Some(identity.to_string());
    }

    /// Fetches the token the next write needs (or finds it cached), so that a slow token
    /// endpoint delays the write's admission by the fence rather than its send after it.
    pub async fn ready_token(&self) -> Result<(), ArmError> {
        self.credential
            .get_token(&[ARM_SCOPE])
            .await
            .map(|_| ())
            .map_err(|source| ArmError::Credential {
                op: ArmOp::PutCapacity,
                source,
            })
    }

    /// The subscription and resource group this client serves.
    pub fn target(&self) -> &ArmTarget {
        &self.target
    }

    /// The `Retry-After` gates (shared by every call of this client).
    pub fn gates(&self) -> &ThrottleGates {
        &self.gates
    }

    fn gate(&self, op: ArmOp) -> Result<(), ArmError> {
        match self.gates.closed_for(op.class(), Instant::now()) {
            Some(retry_after) => {
                self.metrics
                    .arm_requests_total
                    .with_label_values(&[op.as_str(), "gated"])
                    .inc();
                Err(ArmError::Throttled {
                    op,
                    retry_after,
                    local: true,
                })
            }
            None => Ok(()),
        }
    }

    /// Classifies an SDK error, records its code, and closes the gate on a 429.
    fn classify(&self, op: ArmOp, scale_set: &str, err: azure_core::Error) -> (ArmError, String) {
        let scale_set = scale_set.to_string();
        if let Some(crate::fence::FencedAtSend(hold)) =
            find_error::<crate::fence::FencedAtSend>(&err)
        {
            return (
                ArmError::Fenced {
                    op,
                    scale_set,
                    hold: *hold,
                },
                "fenced".into(),
            );
        }
        let http = find_http_error(&err).cloned();
        if let Some(h) = http {
            let code = h.status.to_string();
            return (self.classify_http(op, &scale_set, h), code);
        }
        match err.kind() {
            ErrorKind::Credential => (
                ArmError::Credential { op, source: err },
                "credential".into(),
            ),
            ErrorKind::DataConversion => (
                ArmError::Decode {
                    op,
                    scale_set,
                    detail: err.to_string(),
                },
                "decode".into(),
            ),
            ErrorKind::HttpResponse { status, error_code } => {
                // A status the policy did not see (should not happen): keep what we know.
                let status = *status as u16;
                let code = error_code.clone().unwrap_or_default();
                (
                    ArmError::Http {
                        op,
                        scale_set,
                        status,
                        code,
                        message: err.to_string(),
                    },
                    status.to_string(),
                )
            }
            _ if op.class() == CallClass::Write => (
                ArmError::Ambiguous {
                    op,
                    scale_set,
                    source: err,
                },
                "transport".into(),
            ),
            _ => (
                ArmError::Transport {
                    op,
                    scale_set,
                    source: err,
                },
                "transport".into(),
            ),
        }
    }

    /// Turns a non-2xx answer into the error the reconciler acts on; closes the gate on a 429.
    fn classify_http(&self, op: ArmOp, scale_set: &str, h: ArmHttpError) -> ArmError {
        let scale_set = scale_set.to_string();
        if matches!(h.status, 400 | 409) {
            if let Some(failure) = super::AllocationFailure::classify(&h.code, &h.message) {
                return ArmError::Allocation {
                    op,
                    scale_set,
                    failure,
                    code: h.code,
                    message: h.message,
                };
            }
        }
        match h.status {
            412 => ArmError::PreconditionFailed {
                op,
                scale_set,
                message: h.message,
            },
            404 => ArmError::NotFound { op, scale_set },
            429 => {
                let retry_after = h.retry_after.unwrap_or(Duration::from_secs(10));
                let moved = self.gates.close(op.class(), retry_after, Instant::now());
                self.metrics
                    .throttle_wait_seconds_total
                    .inc_by(moved.as_secs_f64());
                ArmError::Throttled {
                    op,
                    retry_after,
                    local: false,
                }
            }
            401 | 403 => ArmError::Unauthorized {
                op,
                status: h.status,
                code: h.code,
                message: h.message,
            },
            status => ArmError::Http {
                op,
                scale_set,
                status,
                code: h.code,
                message: h.message,
            },
        }
    }

    /// A 401 means ARM no longer accepts the cached token (expired early, revoked, clock skew):
    /// drop it so the next call fetches a new one instead of failing until the cache expires.
    async fn after_error(&self, err: &ArmError) {
        if let ArmError::Unauthorized {
            status: 401, code, ..
        } = err
        {
            tracing::warn!(%code, "ARM refused the token (401): clearing the credential's token cache");
            if let Err(e) = self.credential.clear_cache().await {
                tracing::warn!(error = %e, "could not clear the credential's token cache");
            }
        }
    }

    /// LIST every scale set in the resource group (follows `nextLink`).
    pub async fn list_scale_sets(&self) -> Result<Vec<ScaleSet>, ArmError> {
        self.list_scale_sets_in(&self.target.resource_group).await
    }

    /// LIST every scale set in `resource_group` (an AKS node resource group, for instance).
    pub async fn list_scale_sets_in(
        &self,
        resource_group: &str,
    ) -> Result<Vec<ScaleSet>, ArmError> {
        let op = ArmOp::ListScaleSets;
        self.gate(op)?;
        let timer = self.metrics.arm_timer(op.as_str());
        let mut stream = self
            .compute
            .virtual_machine_scale_sets_client()
            .list(resource_group, &self.target.subscription)
            .into_stream();
        let mut out = Vec::new();
        while let Some(page) = stream.next().await {
            match page {
                Ok(page) => {
                    for vmss in page.value {
                        let ss = scale_set_from_model(vmss, None).map_err(|detail| {
                            ArmError::Decode {
                                op,
                                scale_set: String::new(),
                                detail,
                            }
                        })?;
                        self.budget.locate(&ss.name, &ss.location);
                        out.push(ss);
                    }
                }
                Err(e) => {
                    let (err, code) = self.classify(op, "", e);
                    timer.finish(&code);
                    self.after_error(&err).await;
                    return Err(err);
                }
            }
        }
        timer.finish("200");
        Ok(out)
    }

    /// LIST the compute usages of `location` (every page): what the subscription's vCPU quota
    /// leaves per VM family, in the region, for spot.
    pub async fn list_usages(&self, location: &str) -> Result<Vec<Usage>, ArmError> {
        let op = ArmOp::ListUsages;
        self.gate(op)?;
        let timer = self.metrics.arm_timer(op.as_str());
        let mut stream = self
            .compute
            .usage_client()
            .list(location, &self.target.subscription)
            .into_stream();
        let mut out = Vec::new();
        while let Some(page) = stream.next().await {
            match page {
                Ok(page) => out.extend(page.value.into_iter().filter_map(|u| {
                    Some(Usage {
                        name: u.name.value?,
                        current: i64::from(u.current_value),
                        limit: u.limit,
                    })
                })),
                Err(e) => {
                    let (err, code) = self.classify(op, "", e);
                    timer.finish(&code);
                    self.after_error(&err).await;
                    return Err(err);
                }
            }
        }
        timer.finish("200");
        Ok(out)
    }

    /// GET one scale set; `Ok(None)` when it does not exist.
    pub async fn get_scale_set(&self, name: &str) -> Result<Option<ScaleSet>, ArmError> {
        let op = ArmOp::GetScaleSet;
        self.gate(op)?;
        let timer = self.metrics.arm_timer(op.as_str());
        let sent = self
            .compute
            .virtual_machine_scale_sets_client()
            .get(&self.target.resource_group, name, &self.target.subscription)
            .send()
            .await;
        let rsp = match sent {
            Ok(rsp) => rsp,
            Err(e) => {
                let (err, code) = self.classify(op, name, e);
                timer.finish(&code);
                self.after_error(&err).await;
                return match err {
                    ArmError::NotFound { .. } => Ok(None),
                    err => Err(err),
                };
            }
        };
        let etag = rsp.as_raw_response().headers().get_optional_string(&ETAG);
        let status = (rsp.as_raw_response().status() as u16).to_string();
        let body = rsp.into_body().await;
        timer.finish(&status);
        let model = body.map_err(|e| ArmError::Decode {
            op,
            scale_set: name.into(),
            detail: e.to_string(),
        })?;
        let ss = scale_set_from_model(model, etag).map_err(|detail| ArmError::Decode {
            op,
            scale_set: name.into(),
            detail,
        })?;
        self.budget.locate(&ss.name, &ss.location);
        Ok(Some(ss))
    }

    /// Sparse capacity PUT with the given precondition. One request, never retried here.
    pub async fn put_capacity(
        &self,
        current: &ScaleSet,
        capacity: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError> {
        let op = ArmOp::PutCapacity;
        self.gate(op)?;
        let timer = self.metrics.arm_timer(op.as_str());
        let mut builder = self
            .compute
            .virtual_machine_scale_sets_client()
            .create_or_update(
                &self.target.resource_group,
                &current.name,
                sparse_capacity_body(current, capacity),
                &self.target.subscription,
            );
        builder = match precondition {
            Precondition::None => builder,
            Precondition::IfMatch(etag) => builder.if_match(etag.clone()),
            Precondition::IfNoneMatch => builder.if_none_match("*"),
        };
        // `.send()`: exactly one PUT. Awaiting the builder would loop re-PUTting.
        let rsp = match builder.send().await {
            Ok(rsp) => rsp,
            Err(e) => {
                let (err, code) = self.classify(op, &current.name, e);
                timer.finish(&code);
                self.after_error(&err).await;
                return Err(err);
            }
        };
        let raw = rsp.as_raw_response();
        let status = raw.status() as u16;
        let headers = raw.headers();
        let header_etag = headers.get_optional_string(&ETAG);
        let async_operation = headers.get_optional_string(&AZURE_ASYNCOPERATION);
        let retry_after = parse_retry_after(
            |n| header(headers, static_name(n)),
            std::time::SystemTime::now(),
        );
        timer.finish(&status.to_string());
        // The write committed (2xx). An unreadable body must not turn that into an error: the
        // capacity is what we sent and the ETag comes from the header.
        let scale_set = match rsp
            .into_body()
            .await
            .map_err(|e| e.to_string())
            .and_then(|m| scale_set_from_model(m, header_etag.clone()))
        {
            Ok(s) => s,
            Err(detail) => {
                tracing::warn!(scale_set = %current.name, %detail, "capacity PUT accepted but its body is unreadable; using the header ETag");
                ScaleSet {
                    capacity: Some(capacity),
                    etag: header_etag.clone(),
                    ..current.clone()
                }
            }
        };
        let etag = header_etag.or_else(|| scale_set.etag.clone());
        Ok(PutAccepted {
            status,
            etag,
            async_operation,
            retry_after,
            scale_set,
        })
    }

    /// Deletes exactly the instances `instance_ids` of scale set `current` (in the configured
    /// resource group): `POST {vmss}/delete?api-version=2024-07-01` with body
    /// `{"instanceIds": [..]}`, one request, never retried here, through [`ArmClient::send_json`]
    /// (the write gate, error classes and `arm_requests` metrics of the capacity PUT).
    ///
    /// ARM lowers `sku.capacity` by the number of instances it removes; the scale set's other
    /// instances are untouched (unlike a capacity PUT, which picks the victims itself).
    ///
    /// **If-Match.** ARM documents `If-Match` only for PUT and PATCH of a scale set; for this
    /// action it is not in the REST specification. It is sent anyway when `precondition` asks
    /// for it: the emulator enforces it exactly as on a PUT (a stale ETag is a 412 and nothing is
    /// deleted), and Azure is not known to enforce it, so on Azure the delete may land on a newer
    /// version of the scale set than the one read. A 412 is [`ArmError::PreconditionFailed`], as
    /// on a PUT; an instance id the scale set does not have is ARM's 400 `InvalidParameter`
    /// ([`ArmError::Http`], its message naming the id).
    ///
    /// A 200 is final (no operation to follow); a 202 carries the operation to poll
    /// (`Azure-AsyncOperation`, else `Location`). An empty `instance_ids` sends nothing and
    /// answers a final 200: deleting nothing is done.
    pub async fn delete_vm_instances(
        &self,
        current: &ScaleSet,
        instance_ids: &[String],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError> {
        let op = ArmOp::DeleteInstances;
        if instance_ids.is_empty() {
            return Ok(DeleteAccepted {
                status: 200,
                async_operation: None,
                retry_after: None,
            });
        }
        let t = &self.target;
        let path = format!(
            "subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{}/delete",
            t.subscription, t.resource_group, current.name
        );
        let mut url = t.endpoint.join(&path).map_err(|e| ArmError::Decode {
            op,
            scale_set: current.name.clone(),
            detail: format!("cannot build the delete-instances URL: {e}"),
        })?;
        url.query_pairs_mut()
            .append_pair("api-version", COMPUTE_API_VERSION);
        let body = serde_json::json!({ "instanceIds": instance_ids });
        let answer = self
            .send_json(
                op,
                &current.name,
                reqwest::Method::POST,
                url,
                Some(&body),
                precondition,
            )
            .await?;
        Ok(DeleteAccepted::from_answer(&answer))
    }

    /// LIST the VM instances of a scale set (follows `nextLink`), each with its power state.
    pub async fn list_instances(&self, name: &str) -> Result<Vec<Instance>, ArmError> {
        self.list_instances_in(&self.target.resource_group, name)
            .await
    }

    /// LIST the VM instances of scale set `name` in `resource_group`.
    pub async fn list_instances_in(
        &self,
        resource_group: &str,
        name: &str,
    ) -> Result<Vec<Instance>, ArmError> {
        let op = ArmOp::ListInstances;
        self.gate(op)?;
        let timer = self.metrics.arm_timer(op.as_str());
        let mut stream = self
            .compute
            .virtual_machine_scale_set_v_ms_client()
            .list(resource_group, name, &self.target.subscription)
            // The power state (a spot VM evicted with `Deallocate` is still listed, stopped), as
            // cluster-autoscaler lists instances.
            .expand("instanceView")
            .into_stream();
        let mut out = Vec::new();
        while let Some(page) = stream.next().await {
            match page {
                Ok(page) => out.extend(page.value.into_iter().map(|vm| {
                    let properties = vm.properties.unwrap_or_default();
                    let power_state = properties.instance_view.and_then(|v| {
                        v.statuses
                            .iter()
                            .find_map(|s| power_state(s.code.as_deref()?))
                    });
                    Instance {
                        instance_id: vm.instance_id.unwrap_or_default(),
                        provisioning_state: properties.provisioning_state,
                        computer_name: properties.os_profile.and_then(|o| o.computer_name),
                        power_state,
                        zone: vm.zones.into_iter().next(),
                    }
                })),
                Err(e) => {
                    let (err, code) = self.classify(op, name, e);
                    timer.finish(&code);
                    self.after_error(&err).await;
                    return Err(err);
                }
            }
        }
        timer.finish("200");
        Ok(out)
    }

    /// One JSON call to ARM outside the compute SDK (AKS agent pools): the same `Retry-After`
    /// gate, token, error classes and metrics as the SDK calls, one request, never retried here.
    /// `url` is built by the caller from [`ArmClient::target`]'s endpoint.
    pub async fn send_json(
        &self,
        op: ArmOp,
        name: &str,
        method: reqwest::Method,
        url: Url,
        body: Option<&serde_json::Value>,
        precondition: &Precondition,
    ) -> Result<JsonAnswer, ArmError> {
        self.gate(op)?;
        let token = self
            .credential
            .get_token(&[ARM_SCOPE])
            .await
            .map_err(|source| ArmError::Credential { op, source })?;
        let timer = self.metrics.arm_timer(op.as_str());
        let mut request = self
            .http
            .request(method, url)
            .header("User-Agent", self.user_agent.value())
            .bearer_auth(token.token.secret());
        request = match precondition {
            Precondition::None => request,
            Precondition::IfMatch(etag) => request.header("If-Match", etag.as_str()),
            Precondition::IfNoneMatch => request.header("If-None-Match", "*"),
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        // The last step before the bytes leave (as in the SDK path's response policy).
        let bound = if op.class() == CallClass::Write {
            crate::fence::last_check().map_err(|hold| ArmError::Fenced {
                op,
                scale_set: name.to_string(),
                hold,
            })?
        } else {
            None
        };
        if let Some(d) = bound {
            request = request.timeout(d);
        }
        let lost = |e: reqwest::Error| {
            let source = azure_core::Error::new(ErrorKind::Io, e);
            let scale_set = name.to_string();
            // A write whose answer was lost may have landed: the caller must GET before any
            // further write.
            if op.class() == CallClass::Write {
                ArmError::Ambiguous {
                    op,
                    scale_set,
                    source,
                }
            } else {
                ArmError::Transport {
                    op,
                    scale_set,
                    source,
                }
            }
        };
        let rsp = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                timer.finish("transport");
                return Err(lost(e));
            }
        };
        let status = rsp.status().as_u16();
        let mut headers = Headers::new();
        for (k, v) in rsp.headers() {
            if let Ok(v) = v.to_str() {
                headers.insert(HeaderName::from(k.as_str().to_owned()), v.to_owned());
            }
        }
        record_ratelimits(&self.metrics, &self.budget, &headers, rsp.url().path());
        let body = match rsp.bytes().await {
            Ok(b) => b.to_vec(),
            Err(e) => {
                timer.finish("transport");
                return Err(lost(e));
            }
        };
        timer.finish(&status.to_string());
        if status >= 300 {
            let err = self.classify_http(op, name, http_error(status, &headers, &body));
            self.after_error(&err).await;
            return Err(err);
        }
        Ok(JsonAnswer {
            status,
            etag: headers.get_optional_string(&ETAG),
            async_operation: headers.get_optional_string(&AZURE_ASYNCOPERATION),
            location: header(&headers, "location").map(str::to_string),
            retry_after: parse_retry_after(
                |n| header(&headers, static_name(n)),
                std::time::SystemTime::now(),
            ),
            body,
        })
    }

    /// GET an `Azure-AsyncOperation` URL once. Only URLs on the configured ARM host are polled
    /// (the bearer token is never sent anywhere else).
    pub async fn poll_operation(&self, url: &str) -> Result<OperationStatus, ArmError> {
        let op = ArmOp::PollOperation;
        self.gate(op)?;
        let parsed = Url::parse(url).map_err(|e| ArmError::Decode {
            op,
            scale_set: String::new(),
            detail: format!("bad Azure-AsyncOperation URL: {e}"),
        })?;
        if parsed.host_str() != self.target.endpoint.host_str()
            || parsed.port_or_known_default() != self.target.endpoint.port_or_known_default()
        {
            return Err(ArmError::Decode {
                op,
                scale_set: String::new(),
                detail: format!(
                    "Azure-AsyncOperation URL is not on the ARM endpoint: {}",
                    parsed.host_str().unwrap_or("")
                ),
            });
        }
        let token = self
            .credential
            .get_token(&[ARM_SCOPE])
            .await
            .map_err(|source| ArmError::Credential { op, source })?;
        let timer = self.metrics.arm_timer(op.as_str());
        let sent = self
            .http
            .get(parsed)
            .bearer_auth(token.token.secret())
            .send()
            .await;
        let rsp = match sent {
            Ok(r) => r,
            Err(e) => {
                timer.finish("transport");
                return Err(ArmError::Transport {
                    op,
                    scale_set: String::new(),
                    source: azure_core::Error::new(ErrorKind::Io, e),
                });
            }
        };
        let status = rsp.status().as_u16();
        timer.finish(&status.to_string());
        if status == 429 {
            let retry_after = parse_retry_after(
                |n| rsp.headers().get(n).and_then(|v| v.to_str().ok()),
                std::time::SystemTime::now(),
            )
            .unwrap_or(Duration::from_secs(10));
            let moved = self
                .gates
                .close(CallClass::Read, retry_after, Instant::now());
            self.metrics
                .throttle_wait_seconds_total
                .inc_by(moved.as_secs_f64());
            return Err(ArmError::Throttled {
                op,
                retry_after,
                local: false,
            });
        }
        let body = rsp.bytes().await.map_err(|e| ArmError::Transport {
            op,
            scale_set: String::new(),
            source: azure_core::Error::new(ErrorKind::Io, e),
        })?;
        if status >= 300 {
            let h = http_error(status, &Headers::new(), &body);
            return Err(ArmError::Http {
                op,
                scale_set: String::new(),
                status,
                code: h.code,
                message: h.message,
            });
        }
        #[derive(serde::Deserialize)]
        struct Status {
            status: String,
            error: Option<serde_json::Value>,
        }
        let s: Status = serde_json::from_slice(&body).map_err(|e| ArmError::Decode {
            op,
            scale_set: String::new(),
            detail: e.to_string(),
        })?;
        Ok(match s.status.as_str() {
            "Succeeded" => OperationStatus::Succeeded,
            "Failed" => {
                let text = |k: &str| {
                    s.error
                        .as_ref()
                        .and_then(|e| e.get(k))
                        .and_then(|c| c.as_str())
                        .map(str::to_string)
                };
                OperationStatus::Failed(OperationError {
                    code: text("code").unwrap_or_else(|| "Failed".into()),
                    message: text("message").unwrap_or_default(),
                })
            }
            "Canceled" | "Cancelled" => OperationStatus::Canceled,
            _ => OperationStatus::InProgress,
        })
    }
}

/// One row of a region's compute usages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// `name.value`: a family (`standardDSv5Family`), `cores`, `lowPriorityCores`, ...
    pub name: String,
    /// `currentValue`.
    pub current: i64,
    /// `limit`.
    pub limit: i64,
}

fn find_http_error(err: &azure_core::Error) -> Option<&ArmHttpError> {
    find_error::<ArmHttpError>(err)
}

/// The first error of type `E` in `err` or its chain of sources.
fn find_error<E: std::error::Error + 'static>(err: &azure_core::Error) -> Option<&E> {
    if let Some(h) = err.downcast_ref::<E>() {
        return Some(h);
    }
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<E>() {
            return Some(h);
        }
        source = s.source();
    }
    None
}

/// The sparse capacity body cluster-autoscaler sends: name, location, sku (+ extendedLocation).
pub fn sparse_capacity_body(current: &ScaleSet, capacity: i64) -> models::VirtualMachineScaleSet {
    let mut resource = models::Resource::new(current.location.clone());
    resource.name = Some(current.name.clone());
    let mut body = models::VirtualMachineScaleSet::new(resource);
    body.sku = Some(models::Sku {
        name: current.sku_name.clone(),
        tier: current.sku_tier.clone(),
        capacity: Some(capacity),
    });
    body.extended_location = current
        .extended_location
        .clone()
        .and_then(|v| serde_json::from_value(v).ok());
    body
}

/// Converts the SDK model into the cache's shape. `header_etag` wins over the body's.
pub fn scale_set_from_model(
    vmss: models::VirtualMachineScaleSet,
    header_etag: Option<String>,
) -> Result<ScaleSet, String> {
    let name = vmss
        .resource
        .name
        .clone()
        .ok_or("scale set without a name")?;
    let tags: BTreeMap<String, String> = match vmss.resource.tags {
        Some(serde_json::Value::Object(m)) => m
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    let sku = vmss.sku.unwrap_or_default();
    let vm_profile = vmss
        .properties
        .as_ref()
        .and_then(|p| p.virtual_machine_profile.as_ref())
        .map(|p| {
            let os_disk = p.storage_profile.as_ref().and_then(|s| s.os_disk.as_ref());
            crate::cache::VmProfile {
                windows: p
                    .os_profile
                    .as_ref()
                    .is_some_and(|o| o.windows_configuration.is_some())
                    || os_disk
                        .and_then(|d| d.os_type.as_ref())
                        .is_some_and(|t| format!("{t:?}").eq_ignore_ascii_case("windows")),
                os_disk_gib: os_disk
                    .and_then(|d| d.disk_size_gb)
                    .and_then(|g| u32::try_from(g).ok())
                    .filter(|g| *g > 0),
                kubelet_on_temp_disk: false,
                spot: matches!(
                    p.priority,
                    Some(models::Priority::Spot | models::Priority::Low)
                ),
            }
        })
        .unwrap_or_default();
    if let Some(c) = sku.capacity {
        if c < 0 {
            return Err(format!("scale set {name} has negative capacity {c}"));
        }
    }
    Ok(ScaleSet {
        name,
        location: vmss.resource.location,
        sku_name: sku.name,
        sku_tier: sku.tier,
        capacity: sku.capacity,
        etag: header_etag.or(vmss.etag),
        tags,
        provisioning_state: vmss.properties.and_then(|p| p.provisioning_state),
        extended_location: vmss
            .extended_location
            .and_then(|e| serde_json::to_value(e).ok()),
        agent_pool: None,
        vm_profile,
        zones: vmss.zones,
    })
}

/// The state in an instance view's power-state code (`PowerState/deallocated` ->
/// `deallocated`, lowercased); `None` for the other status codes.
fn power_state(code: &str) -> Option<String> {
    const PREFIX: &str = "PowerState/";
    let (head, state) = code.split_at_checked(PREFIX.len())?;
    head.eq_ignore_ascii_case(PREFIX)
        .then(|| state.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacity_body_is_sparse() {
        let current = ScaleSet {
            name: "pool-a".into(),
            location: "westeurope".into(),
            sku_name: Some("Standard_D2s_v5".into()),
            sku_tier: Some("Standard".into()),
            capacity: Some(3),
            etag: Some("\"7\"".into()),
            tags: [("team".to_string(), "x".to_string())].into(),
            provisioning_state: Some("Succeeded".into()),
            extended_location: None,
            agent_pool: None,
            vm_profile: Default::default(),
            zones: Vec::new(),
        };
        let json = serde_json::to_value(sparse_capacity_body(&current, 5)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "pool-a", "location": "westeurope", "sku": {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": 5}})
        );
    }

    #[test]
    fn the_power_state_is_read_from_its_status_code_in_any_case_and_other_codes_are_not_it() {
        assert_eq!(
            power_state("PowerState/deallocated").as_deref(),
            Some("deallocated")
        );
        assert_eq!(
            power_state("powerstate/Running").as_deref(),
            Some("running")
        );
        assert_eq!(power_state("ProvisioningState/succeeded"), None);
        assert_eq!(power_state("PowerState"), None);
        assert_eq!(power_state(""), None);
        let vm: models::VirtualMachineScaleSetVm = serde_json::from_value(serde_json::json!({
            "location": "westeurope", "instanceId": "3",
            "properties": {"instanceView": {"statuses": [
                {"code": "ProvisioningState/succeeded", "level": "Info"},
                {"code": "PowerState/deallocated", "level": "Info"}
            ]}}
        }))
        .unwrap();
        let view = vm.properties.unwrap().instance_view.unwrap();
        let state = view
            .statuses
            .iter()
            .find_map(|s| power_state(s.code.as_deref()?));
        assert_eq!(state.as_deref(), Some("deallocated"));
    }

    #[test]
    fn a_header_etag_wins_over_the_body_etag() {
        let model: models::VirtualMachineScaleSet = serde_json::from_value(serde_json::json!({
            "name": "a", "location": "x", "etag": "\"1\"", "sku": {"capacity": 2}
        }))
        .unwrap();
        let s = scale_set_from_model(model, Some("\"2\"".into())).unwrap();
        assert_eq!(s.etag.as_deref(), Some("\"2\""));
        assert_eq!(s.capacity, Some(2));
    }

    #[test]
    fn a_spot_scale_set_in_zones_reads_as_a_spot_offering_in_those_zones() {
        let model: models::VirtualMachineScaleSet = serde_json::from_value(serde_json::json!({
            "name": "spot", "location": "westeurope", "zones": ["2", "1"],
            "sku": {"name": "Standard_D4s_v5", "capacity": 0},
            "properties": {"virtualMachineProfile": {"priority": "Spot", "evictionPolicy": "Deallocate"}}
        }))
        .unwrap();
        let s = scale_set_from_model(model, None).unwrap();
        let o = s.offering().expect("a size");
        assert!(o.spot);
        assert_eq!(o.zones, ["1", "2"]);
        assert_eq!(o.family(), Some("standardDSv5Family"));
    }

    #[test]
    fn the_vm_profile_says_windows_and_the_os_disk_size_for_scale_from_zero() {
        let model: models::VirtualMachineScaleSet = serde_json::from_value(serde_json::json!({
            "name": "win", "location": "x", "sku": {"capacity": 0},
            "properties": {"virtualMachineProfile": {
                "osProfile": {"computerNamePrefix": "akswin", "windowsConfiguration": {}},
                "storageProfile": {"osDisk": {"createOption": "FromImage", "diskSizeGB": 64}}}}
        }))
        .unwrap();
        let s = scale_set_from_model(model, None).unwrap();
        assert!(s.vm_profile.windows);
        assert_eq!(s.vm_profile.os_disk_gib, Some(64));
        let linux: models::VirtualMachineScaleSet = serde_json::from_value(
            serde_json::json!({"name": "a", "location": "x", "sku": {"capacity": 1}}),
        )
        .unwrap();
        assert_eq!(
            scale_set_from_model(linux, None).unwrap().vm_profile,
            crate::cache::VmProfile::default()
        );
    }

    #[test]
    fn a_negative_capacity_is_a_decode_error() {
        let model: models::VirtualMachineScaleSet = serde_json::from_value(
            serde_json::json!({"name": "a", "location": "x", "sku": {"capacity": -1}}),
        )
        .unwrap();
        assert!(scale_set_from_model(model, None)
            .unwrap_err()
            .contains("negative"));
    }

    fn answer(status: u16, aao: Option<&str>, location: Option<&str>) -> JsonAnswer {
        JsonAnswer {
            status,
            etag: None,
            async_operation: aao.map(str::to_string),
            location: location.map(str::to_string),
            retry_after: Some(Duration::from_secs(1)),
            body: Vec::new(),
        }
    }

    #[test]
    fn an_accepted_delete_follows_azure_asyncoperation_before_location() {
        let d =
            DeleteAccepted::from_answer(&answer(202, Some("https://a/op"), Some("https://a/loc")));
        assert_eq!(d.status, 202);
        assert_eq!(d.async_operation.as_deref(), Some("https://a/op"));
        assert_eq!(d.retry_after, Some(Duration::from_secs(1)));
        let d = DeleteAccepted::from_answer(&answer(202, None, Some("https://a/loc")));
        assert_eq!(d.async_operation.as_deref(), Some("https://a/loc"));
    }

    #[test]
    fn a_delete_answered_200_is_final_with_no_operation_to_follow() {
        let d = DeleteAccepted::from_answer(&answer(200, Some("https://a/op"), None));
        assert_eq!(d.status, 200);
        assert_eq!(d.async_operation, None);
    }

    #[test]
    fn deletes_spend_the_write_budget_and_have_their_own_metric_labels() {
        assert_eq!(ArmOp::DeleteInstances.class(), CallClass::Write);
        assert_eq!(ArmOp::DeleteMachines.class(), CallClass::Write);
        assert_eq!(ArmOp::DeleteInstances.as_str(), "delete_instances");
        assert_eq!(ArmOp::DeleteMachines.as_str(), "delete_machines");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_error_parser(body in proptest::collection::vec(proptest::num::u8::ANY, 0..300), status in 400u16..600) {
            let e = http_error(status, &Headers::new(), &body);
            proptest::prop_assert_eq!(e.status, status);
        }

        #[test]
        fn arbitrary_json_never_panics_the_model_conversion(cap in proptest::num::i64::ANY, name in "[a-z]{0,8}", tags in proptest::collection::btree_map("[a-z]{1,5}", proptest::num::i32::ANY, 0..4)) {
            let v = serde_json::json!({"name": name, "location": "x", "sku": {"capacity": cap}, "tags": tags});
            if let Ok(model) = serde_json::from_value::<models::VirtualMachineScaleSet>(v) {
                let _ = scale_set_from_model(model, None);
            }
        }
    }
}
