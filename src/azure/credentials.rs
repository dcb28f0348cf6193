//! Credentials: how the controller gets an AAD token for ARM.
//!
//! Every credential here
//! - always asks for [`ARM_SCOPE`] (the scopes a caller passes are ignored: the controller
//!   talks to ARM only);
//! - caches its token until [`REFRESH_MARGIN`] before expiry, behind a `tokio` mutex so that
//!   concurrent `get_token` calls wait for one fetch instead of stampeding the token endpoint;
//! - never logs or prints the secret, the federated assertion or the token;
//! - fails with a [`CredentialError`] naming the identity and the reason (HTTP status and AAD
//!   error code from the body), wrapped in an `azure_core::Error` of kind `Credential`.
//!
//! The 0.21 SDK gaps wrapped here: its workload-identity credential reads the projected token
//! file once (AKS rotates it), and its managed-identity credential is system-assigned only with
//! a hard-coded IMDS address. Both are replaced ([`RotatingWorkloadIdentityCredential`],
//! [`ImdsCredential`]); the client-secret flow uses the SDK's credential over our own reqwest
//! client, rebuilt when the secret file changes.

use crate::config::{AuthSettings, AzureSettings, SecretSource, ARM_SCOPE};
use azure_core::auth::{AccessToken, Secret, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::{HttpClient, Request, Response};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;
use url::Url;

/// A cached token is refreshed when less than this remains before it expires.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// The resource IMDS is asked for (the v1 form of [`ARM_SCOPE`]).
pub const ARM_RESOURCE: &str = "https://management.azure.com/";
/// IMDS api-version used for managed identity tokens.
pub const IMDS_API_VERSION: &str = "2018-02-01";

/// Called after every real token fetch (not cache hits): credential kind and success.
pub type MetricsHook = Arc<dyn Fn(&'static str, bool) + Send + Sync>;

/// Result alias of this module.
pub type Result<T, E = CredentialError> = std::result::Result<T, E>;

/// Why a credential could not be built or could not get a token.
///
/// `identity` describes who we tried to be (kind, client id, tenant), never the secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    /// The client secret could not be read from its environment variable or file.
    #[error("{identity}: cannot read the client secret from {from}: {reason}")]
    SecretUnavailable {
        /// Credential kind (see [`CredentialError::kind`]).
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// Where the secret was expected.
        from: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The workload-identity token file could not be read.
    #[error("{identity}: cannot read the federated token file {path}: {reason}")]
    TokenFileUnreadable {
        /// Credential kind.
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// The projected token file.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The token endpoint could not be reached (connection refused, timeout, DNS, TLS).
    #[error("{identity}: token endpoint {endpoint} unreachable: {reason}")]
    Unreachable {
        /// Credential kind.
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// The endpoint we called.
        endpoint: String,
        /// The transport error.
        reason: String,
    },
    /// The token endpoint answered with an error status.
    #[error("{identity}: token request rejected with HTTP {status}{}{}", .aad_code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default(), .description.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Rejected {
        /// Credential kind.
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// HTTP status of the token response.
        status: u16,
        /// AAD / IMDS error code from the body (`invalid_client`, ...).
        aad_code: Option<String>,
        /// Error description from the body, first line only.
        description: Option<String>,
    },
    /// The token endpoint answered 2xx with something that is not a usable token.
    #[error("{identity}: unusable token response: {reason}")]
    BadResponse {
        /// Credential kind.
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The Azure CLI failed or is not installed.
    #[error("{identity}: {reason}")]
    Cli {
        /// Credential kind.
        kind: &'static str,
        /// Who we tried to be.
        identity: String,
        /// What `az` said.
        reason: String,
    },
}

impl CredentialError {
    /// The credential kind that failed: `client_secret`, `workload_identity`,
    /// `managed_identity` or `azure_cli`.
    pub fn kind(&self) -> &'static str {
        match self {
            CredentialError::SecretUnavailable { kind, .. }
            | CredentialError::TokenFileUnreadable { kind, .. }
            | CredentialError::Unreachable { kind, .. }
            | CredentialError::Rejected { kind, .. }
            | CredentialError::BadResponse { kind, .. }
            | CredentialError::Cli { kind, .. } => kind,
        }
    }

    /// Low-cardinality label of the failure class for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CredentialError::SecretUnavailable { .. } => "secret_unavailable",
            CredentialError::TokenFileUnreadable { .. } => "token_file_unreadable",
            CredentialError::Unreachable { .. } => "unreachable",
            CredentialError::Rejected { .. } => "rejected",
            CredentialError::BadResponse { .. } => "bad_response",
            CredentialError::Cli { .. } => "azure_cli",
        }
    }

    /// Whether trying again later may help (transport errors, 429 and 5xx).
    pub fn is_retryable(&self) -> bool {
        match self {
            CredentialError::Unreachable { .. } => true,
            CredentialError::Rejected { status, .. } => *status == 429 || *status >= 500,
            CredentialError::SecretUnavailable { .. }
            | CredentialError::TokenFileUnreadable { .. }
            | CredentialError::BadResponse { .. }
            | CredentialError::Cli { .. } => false,
        }
    }

    fn into_azure(self) -> azure_core::Error {
        azure_core::Error::new(ErrorKind::Credential, self)
    }
}

/// Builds the credential [`AzureSettings::auth`] asks for, reading the environment of the
/// process for [`SecretSource::Env`].
pub fn build_credential(
    azure: &AzureSettings,
    http: reqwest::Client,
    metrics_hook: Option<MetricsHook>,
) -> Result<Arc<dyn TokenCredential>> {
    build_credential_with_env(azure, http, metrics_hook, &|name| std::env::var(name).ok())
}

/// [`build_credential`] with an explicit environment lookup (tests pass their own map).
pub fn build_credential_with_env(
    azure: &AzureSettings,
    http: reqwest::Client,
    metrics_hook: Option<MetricsHook>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn TokenCredential>> {
    let cache = TokenCache::new(metrics_hook);
    Ok(match &azure.auth {
        AuthSettings::ClientSecret { client_id, secret } => {
            let identity = format!(
                "clientSecret identity (clientId {client_id}, tenant {})",
                azure.tenant_id
            );
            let secret = match secret {
                SecretSource::Env(name) => match env(name).filter(|s| !s.trim().is_empty()) {
                    Some(value) => ResolvedSecret::Fixed(value.trim().to_string()),
                    None => {
                        return Err(CredentialError::SecretUnavailable {
                            kind: KIND_CLIENT_SECRET,
                            identity,
                            from: format!("environment variable {name}"),
                            reason: "not set or empty".into(),
                        })
                    }
                },
                SecretSource::File(path) => {
                    let value = read_secret_file(path).map_err(|reason| {
                        CredentialError::SecretUnavailable {
                            kind: KIND_CLIENT_SECRET,
                            identity: identity.clone(),
                            from: format!("file {}", path.display()),
                            reason,
                        }
                    })?;
                    ResolvedSecret::File(path.clone(), value)
                }
            };
            Arc::new(ClientSecretTokenCredential::new(
                identity,
                Arc::new(http),
                azure.authority_host.clone(),
                azure.tenant_id.clone(),
                client_id.clone(),
                secret,
                cache,
            ))
        }
        AuthSettings::WorkloadIdentity {
            client_id,
            token_file,
        } => Arc::new(RotatingWorkloadIdentityCredential::new(
            Arc::new(http),
            azure.authority_host.clone(),
            azure.tenant_id.clone(),
            client_id.clone(),
            token_file.clone(),
            cache,
        )),
        AuthSettings::ManagedIdentity { client_id } => Arc::new(ImdsCredential::new(
            http,
            azure.imds_endpoint.clone(),
            client_id.clone(),
            cache,
        )),
        AuthSettings::AzureCli => Arc::new(CliCredential {
            inner: azure_identity::AzureCliCredential::new(),
            cache,
        }),
    })
}

const KIND_CLIENT_SECRET: &str = "client_secret";
const KIND_WORKLOAD_IDENTITY: &str = "workload_identity";
const KIND_MANAGED_IDENTITY: &str = "managed_identity";
const KIND_AZURE_CLI: &str = "azure_cli";

/// Reads a secret file. A file ending in `.json` is taken to be an `azure.json` cloud-config
/// and its `aadClientSecret` field is the secret (how `config::load` points at a secret kept in
/// azure.json); any other file holds the secret itself (trailing newline ignored).
fn read_secret_file(path: &Path) -> std::result::Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let secret = if is_json {
        crate::config::secret_from_cloud_config(&text)
            .ok_or_else(|| "no non-empty aadClientSecret field in the JSON file".to_string())?
    } else {
        text.trim().to_string()
    };
    if secret.is_empty() {
        return Err("the file is empty".into());
    }
    Ok(secret)
}

// --- shared token cache -------------------------------------------------------------------------

/// One token, refreshed [`REFRESH_MARGIN`] before expiry; the mutex is held across the fetch so
/// concurrent callers share it (single flight).
struct TokenCache {
    token: tokio::sync::Mutex<Option<AccessToken>>,
    hook: Option<MetricsHook>,
}

impl TokenCache {
    fn new(hook: Option<MetricsHook>) -> Self {
        TokenCache {
            token: tokio::sync::Mutex::new(None),
            hook,
        }
    }

    async fn get<F, Fut>(&self, kind: &'static str, fetch: F) -> azure_core::Result<AccessToken>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<AccessToken>>,
    {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref() {
            if t.expires_on > OffsetDateTime::now_utc() + REFRESH_MARGIN {
                return Ok(t.clone());
            }
        }
        let result = fetch().await;
        if let Some(hook) = &self.hook {
            hook(kind, result.is_ok());
        }
        match result {
            Ok(t) => {
                tracing::debug!(credential = kind, expires_on = %t.expires_on, "token fetched");
                *slot = Some(t.clone());
                Ok(t)
            }
            Err(e) => {
                tracing::warn!(credential = kind, error = %e, "token fetch failed");
                Err(e.into_azure())
            }
        }
    }

    async fn clear(&self) {
        *self.token.lock().await = None;
    }
}

// --- failure recording for the SDK flows ------------------------------------------------------

/// What the last failed token call looked like, recorded by [`RecordingHttpClient`] because
/// the SDK's own errors drop the status (client secret) or the body (workload identity).
#[derive(Debug, Clone)]
enum Failure {
    Transport(String),
    Status {
        status: u16,
        code: Option<String>,
        description: Option<String>,
    },
}

/// Our reqwest client, remembering the last failure. Used by one credential whose fetches are
/// serialized by its [`TokenCache`], so "last" is "this fetch's".
#[derive(Debug)]
struct RecordingHttpClient {
    inner: Arc<dyn HttpClient>,
    last: parking_lot::Mutex<Option<Failure>>,
}

impl RecordingHttpClient {
    fn new(inner: Arc<dyn HttpClient>) -> Self {
        RecordingHttpClient {
            inner,
            last: parking_lot::Mutex::new(None),
        }
    }

    fn take(&self) -> Option<Failure> {
        self.last.lock().take()
    }
}

#[async_trait::async_trait]
impl HttpClient for RecordingHttpClient {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        match self.inner.execute_request(request).await {
            Err(e) => {
                *self.last.lock() = Some(Failure::Transport(error_chain(&e)));
                Err(e)
            }
            Ok(rsp) if rsp.status().is_success() => Ok(rsp),
            Ok(rsp) => {
                let (status, headers, body) = rsp.deconstruct();
                let bytes = body.collect().await?;
                let (code, description) = parse_error_body(&bytes);
                *self.last.lock() = Some(Failure::Status {
                    status: u16::from(status),
                    code,
                    description,
                });
                Ok(Response::new(
                    status,
                    headers,
                    Box::pin(azure_core::BytesStream::new(bytes)),
                ))
            }
        }
    }
}

/// AAD answers `{"error": "invalid_client", "error_description": "AADSTS...\r\nTrace ID..."}`,
/// IMDS `{"error": "invalid_request", "error_description": "..."}`, ARM-style services
/// `{"error": {"code": ..., "message": ...}}`.
fn parse_error_body(body: &[u8]) -> (Option<String>, Option<String>) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        let text = String::from_utf8_lossy(body);
        let first = text.lines().next().unwrap_or("").trim();
        let desc = (!first.is_empty()).then(|| truncate(first, 200));
        return (None, desc);
    };
    let (code, desc) = match v.get("error") {
        Some(serde_json::Value::String(code)) => (
            Some(code.clone()),
            v.get("error_description")
                .and_then(|d| d.as_str())
                .map(str::to_string),
        ),
        Some(obj @ serde_json::Value::Object(_)) => (
            obj.get("code").and_then(|c| c.as_str()).map(str::to_string),
            obj.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string),
        ),
        _ => (None, None),
    };
    let desc = desc
        .and_then(|d| d.lines().next().map(|l| truncate(l.trim(), 300)))
        .filter(|d| !d.is_empty());
    (code, desc)
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The messages of an error and its sources, joined by ": ".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = s.source();
    }
    out
}

/// Maps an SDK token error to ours using what the recording client saw.
fn sdk_failure(
    kind: &'static str,
    identity: &str,
    endpoint: &str,
    recorded: Option<Failure>,
    err: &azure_core::Error,
) -> CredentialError {
    match recorded {
        Some(Failure::Transport(reason)) => CredentialError::Unreachable {
            kind,
            identity: identity.to_string(),
            endpoint: endpoint.to_string(),
            reason,
        },
        Some(Failure::Status {
            status,
            code,
            description,
        }) => CredentialError::Rejected {
            kind,
            identity: identity.to_string(),
            status,
            aad_code: code,
            description,
        },
        None => CredentialError::BadResponse {
            kind,
            identity: identity.to_string(),
            reason: error_chain(err),
        },
    }
}

// --- client secret ------------------------------------------------------------------------------

/// Where the client secret is, resolved at construction.
enum ResolvedSecret {
    /// From the environment, read once.
    Fixed(String),
    /// From a file, re-read before each token fetch; the value last used.
    File(PathBuf, String),
}

/// `azure_identity::ClientSecretCredential` over our reqwest client, with our cache and errors;
/// rebuilt when the secret file's content changes (secret rotation without restart).
pub struct ClientSecretTokenCredential {
    identity: String,
    http: Arc<RecordingHttpClient>,
    authority_host: Url,
    tenant_id: String,
    client_id: String,
    secret: parking_lot::Mutex<ResolvedSecret>,
    inner: parking_lot::Mutex<Arc<azure_identity::ClientSecretCredential>>,
    cache: TokenCache,
}

impl std::fmt::Debug for ClientSecretTokenCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecretTokenCredential")
            .field("identity", &self.identity)
            .field("authority_host", &self.authority_host.as_str())
            .finish_non_exhaustive()
    }
}

impl ClientSecretTokenCredential {
    fn new(
        identity: String,
        http: Arc<dyn HttpClient>,
        authority_host: Url,
        tenant_id: String,
        client_id: String,
        secret: ResolvedSecret,
        cache: TokenCache,
    ) -> Self {
        let http = Arc::new(RecordingHttpClient::new(http));
        let value = match &secret {
            ResolvedSecret::Fixed(v) | ResolvedSecret::File(_, v) => v.clone(),
        };
        let inner = Arc::new(azure_identity::ClientSecretCredential::new(
            http.clone(),
            authority_host.clone(),
            tenant_id.clone(),
            client_id.clone(),
            value,
        ));
        ClientSecretTokenCredential {
            identity,
            http,
            authority_host,
            tenant_id,
            client_id,
            secret: parking_lot::Mutex::new(secret),
            inner: parking_lot::Mutex::new(inner),
            cache,
        }
    }

    /// Re-reads a file secret and rebuilds the SDK credential if it changed.
    fn current(&self) -> Result<Arc<azure_identity::ClientSecretCredential>> {
        let mut secret = self.secret.lock();
        if let ResolvedSecret::File(path, used) = &mut *secret {
            let fresh =
                read_secret_file(path).map_err(|reason| CredentialError::SecretUnavailable {
                    kind: KIND_CLIENT_SECRET,
                    identity: self.identity.clone(),
                    from: format!("file {}", path.display()),
                    reason,
                })?;
            if fresh != *used {
                tracing::info!(credential = KIND_CLIENT_SECRET, file = %path.display(), "client secret file changed; using the new secret");
                *self.inner.lock() = Arc::new(azure_identity::ClientSecretCredential::new(
                    self.http.clone(),
                    self.authority_host.clone(),
                    self.tenant_id.clone(),
                    self.client_id.clone(),
                    fresh.clone(),
                ));
                *used = fresh;
            }
        }
        Ok(self.inner.lock().clone())
    }

    async fn fetch(&self) -> Result<AccessToken> {
        let inner = self.current()?;
        // Our cache decides when to refresh; make the SDK's own cache fetch for real.
        let _ = inner.clear_cache().await;
        self.http.take();
        match inner.get_token(&[ARM_SCOPE]).await {
            Ok(t) => Ok(t),
            Err(e) => Err(sdk_failure(
                KIND_CLIENT_SECRET,
                &self.identity,
                self.authority_host.as_str(),
                self.http.take(),
                &e,
            )),
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for ClientSecretTokenCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        self.cache.get(KIND_CLIENT_SECRET, || self.fetch()).await
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.clear().await;
        Ok(())
    }
}

// --- workload identity --------------------------------------------------------------------------

/// AKS workload identity that re-reads the projected service-account token file on every AAD
/// exchange, and exchanges again when the cached AAD token is near expiry, the cache was
/// cleared, or the file changed (mtime or size). The SDK's credential reads the file once.
pub struct RotatingWorkloadIdentityCredential {
    identity: String,
    http: Arc<RecordingHttpClient>,
    authority_host: Url,
    tenant_id: String,
    client_id: String,
    token_file: PathBuf,
    last_file_state: parking_lot::Mutex<Option<(Option<SystemTime>, u64)>>,
    cache: TokenCache,
}

impl std::fmt::Debug for RotatingWorkloadIdentityCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingWorkloadIdentityCredential")
            .field("identity", &self.identity)
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

impl RotatingWorkloadIdentityCredential {
    /// The file is read lazily, at each AAD exchange (the webhook may project it late).
    fn new(
        http: Arc<dyn HttpClient>,
        authority_host: Url,
        tenant_id: String,
        client_id: String,
        token_file: PathBuf,
        cache: TokenCache,
    ) -> Self {
        RotatingWorkloadIdentityCredential {
            identity: format!(
                "workloadIdentity identity (clientId {client_id}, tenant {tenant_id})"
            ),
            http: Arc::new(RecordingHttpClient::new(http)),
            authority_host,
            tenant_id,
            client_id,
            token_file,
            last_file_state: parking_lot::Mutex::new(None),
            cache,
        }
    }

    fn read_assertion(&self) -> Result<String> {
        let unreadable = |reason: String| CredentialError::TokenFileUnreadable {
            kind: KIND_WORKLOAD_IDENTITY,
            identity: self.identity.clone(),
            path: self.token_file.display().to_string(),
            reason,
        };
        let meta = std::fs::metadata(&self.token_file).map_err(|e| unreadable(e.to_string()))?;
        let assertion = std::fs::read_to_string(&self.token_file)
            .map_err(|e| unreadable(e.to_string()))?
            .trim()
            .to_string();
        if assertion.is_empty() {
            return Err(unreadable("the file is empty".into()));
        }
        let state = (meta.modified().ok(), meta.len());
        let mut last = self.last_file_state.lock();
        if last.is_some() && *last != Some(state) {
            tracing::info!(credential = KIND_WORKLOAD_IDENTITY, file = %self.token_file.display(), "federated token file rotated");
        }
        *last = Some(state);
        Ok(assertion)
    }

    /// Whether the token file differs (mtime or size) from the one last exchanged.
    fn file_changed(&self) -> bool {
        let last = *self.last_file_state.lock();
        match (last, std::fs::metadata(&self.token_file)) {
            (Some(last), Ok(meta)) => last != (meta.modified().ok(), meta.len()),
            _ => false,
        }
    }

    async fn fetch(&self) -> Result<AccessToken> {
        let assertion = self.read_assertion()?;
        let inner = azure_identity::WorkloadIdentityCredential::new(
            self.http.clone(),
            self.authority_host.clone(),
            self.tenant_id.clone(),
            self.client_id.clone(),
            Secret::new(assertion),
        );
        self.http.take();
        match inner.get_token(&[ARM_SCOPE]).await {
            Ok(t) => Ok(t),
            Err(e) => Err(sdk_failure(
                KIND_WORKLOAD_IDENTITY,
                &self.identity,
                self.authority_host.as_str(),
                self.http.take(),
                &e,
            )),
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for RotatingWorkloadIdentityCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        // A rotated file also triggers a fresh exchange (one stat per call), so the controller
        // never keeps presenting an identity AKS has already moved on from.
        if self.file_changed() {
            self.cache.clear().await;
        }
        self.cache
            .get(KIND_WORKLOAD_IDENTITY, || self.fetch())
            .await
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.clear().await;
        Ok(())
    }
}

// --- managed identity (IMDS) --------------------------------------------------------------------

/// Managed identity through IMDS at a configurable address, system-assigned or user-assigned
/// (`client_id`). `GET {imds}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=
/// https://management.azure.com/[&client_id=..]` with `Metadata: true`.
pub struct ImdsCredential {
    identity: String,
    http: reqwest::Client,
    url: Url,
    cache: TokenCache,
}

impl std::fmt::Debug for ImdsCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsCredential")
            .field("identity", &self.identity)
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct ImdsToken {
    access_token: String,
    #[serde(default)]
    expires_on: Option<serde_json::Value>,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
}

/// A number or a string holding a number (IMDS sends strings, others numbers).
fn json_u64(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

impl ImdsCredential {
    fn new(http: reqwest::Client, imds: Url, client_id: Option<String>, cache: TokenCache) -> Self {
        let mut url = imds;
        url.set_path("/metadata/identity/oauth2/token");
        url.set_query(None);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", IMDS_API_VERSION);
            q.append_pair("resource", ARM_RESOURCE);
            if let Some(id) = &client_id {
                q.append_pair("client_id", id);
            }
        }
        let identity = match &client_id {
            Some(id) => format!("managedIdentity identity (user-assigned, clientId {id})"),
            None => "managedIdentity identity (system-assigned)".to_string(),
        };
        ImdsCredential {
            identity,
            http,
            url,
            cache,
        }
    }

    async fn fetch(&self) -> Result<AccessToken> {
        let endpoint = format!(
            "{}://{}{}",
            self.url.scheme(),
            self.url.host_str().unwrap_or(""),
            self.url.port().map(|p| format!(":{p}")).unwrap_or_default()
        );
        let rsp = self
            .http
            .get(self.url.clone())
            .header("Metadata", "true")
            .send()
            .await
            .map_err(|e| CredentialError::Unreachable {
                kind: KIND_MANAGED_IDENTITY,
                identity: self.identity.clone(),
                endpoint: endpoint.clone(),
                reason: error_chain(&e),
            })?;
        let status = rsp.status();
        let body = rsp
            .bytes()
            .await
            .map_err(|e| CredentialError::Unreachable {
                kind: KIND_MANAGED_IDENTITY,
                identity: self.identity.clone(),
                endpoint: endpoint.clone(),
                reason: error_chain(&e),
            })?;
        if !status.is_success() {
            let (code, description) = parse_error_body(&body);
            return Err(CredentialError::Rejected {
                kind: KIND_MANAGED_IDENTITY,
                identity: self.identity.clone(),
                status: status.as_u16(),
                aad_code: code,
                description,
            });
        }
        let bad = |reason: String| CredentialError::BadResponse {
            kind: KIND_MANAGED_IDENTITY,
            identity: self.identity.clone(),
            reason,
        };
        let tok: ImdsToken =
            serde_json::from_slice(&body).map_err(|e| bad(format!("not a token response: {e}")))?;
        let expires_on = if let Some(secs) = tok.expires_on.as_ref().and_then(json_u64) {
            OffsetDateTime::from_unix_timestamp(secs as i64)
                .map_err(|e| bad(format!("expires_on out of range: {e}")))?
        } else if let Some(secs) = tok.expires_in.as_ref().and_then(json_u64) {
            OffsetDateTime::now_utc() + Duration::from_secs(secs)
        } else {
            return Err(bad("no expires_on or expires_in".into()));
        };
        if tok.access_token.is_empty() {
            return Err(bad("empty access_token".into()));
        }
        Ok(AccessToken::new(Secret::new(tok.access_token), expires_on))
    }
}

#[async_trait::async_trait]
impl TokenCredential for ImdsCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        self.cache.get(KIND_MANAGED_IDENTITY, || self.fetch()).await
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.clear().await;
        Ok(())
    }
}

// --- Azure CLI ----------------------------------------------------------------------------------

/// `az account get-access-token` through the SDK, with our cache and errors.
struct CliCredential {
    inner: azure_identity::AzureCliCredential,
    cache: TokenCache,
}

impl std::fmt::Debug for CliCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CliCredential")
    }
}

#[async_trait::async_trait]
impl TokenCredential for CliCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        self.cache
            .get(KIND_AZURE_CLI, || async {
                let _ = self.inner.clear_cache().await;
                self.inner
                    .get_token(&[ARM_SCOPE])
                    .await
                    .map_err(|e| CredentialError::Cli {
                        kind: KIND_AZURE_CLI,
                        identity: "azureCli identity".into(),
                        reason: error_chain(&e),
                    })
            })
            .await
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.clear().await;
        Ok(())
    }
}
