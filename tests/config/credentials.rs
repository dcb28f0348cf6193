//! Credentials against a tiny local token server (AAD + IMDS shapes) on 127.0.0.1:0.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::Router;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use url::Url;
use vmss_capacity_controller::azure::credentials::{
    build_credential_with_env, CredentialError, MetricsHook,
};
use vmss_capacity_controller::config::{AuthSettings, AzureSettings, SecretSource, ARM_SCOPE};

const SECRET: &str = "sup3r-s3cret-value";

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    query: HashMap<String, String>,
    form: HashMap<String, String>,
    headers: HeaderMap,
}

#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    delay: Duration,
}

#[derive(Clone)]
struct TokenServer {
    url: Url,
    seen: Arc<Mutex<Vec<Seen>>>,
    reply: Arc<Mutex<Reply>>,
}

fn pairs(s: &str) -> HashMap<String, String> {
    url::form_urlencoded::parse(s.as_bytes())
        .into_owned()
        .collect()
}

impl TokenServer {
    async fn start(reply: Reply) -> TokenServer {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let reply = Arc::new(Mutex::new(reply));
        let (s, r) = (seen.clone(), reply.clone());
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (seen, reply) = (s.clone(), r.clone());
                async move {
                    seen.lock().push(Seen {
                        method,
                        path: uri.path().to_string(),
                        query: pairs(uri.query().unwrap_or("")),
                        form: pairs(&String::from_utf8_lossy(&body)),
                        headers,
                    });
                    let reply = reply.lock().clone();
                    tokio::time::sleep(reply.delay).await;
                    (
                        StatusCode::from_u16(reply.status).unwrap(),
                        [("content-type", "application/json")],
                        reply.body,
                    )
                        .into_response()
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        TokenServer {
            url: Url::parse(&format!("http://{addr}")).unwrap(),
            seen,
            reply,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    fn set_reply(&self, reply: Reply) {
        *self.reply.lock() = reply;
    }
}

fn aad_ok(expires_in: u64) -> Reply {
    Reply {
        status: 200,
        body: format!(
            r#"{{"token_type":"Bearer","expires_in":{expires_in},"ext_expires_in":{expires_in},"access_token":"aad-token"}}"#
        ),
        delay: Duration::ZERO,
    }
}

fn settings(base: &Url, auth: AuthSettings) -> AzureSettings {
    AzureSettings {
        resource_manager_endpoint: base.clone(),
        authority_host: base.clone(),
        imds_endpoint: base.clone(),
        tenant_id: "tenant".into(),
        subscription_id: "00000000-0000-0000-0000-000000000000".into(),
        resource_group: "rg".into(),
        auth,
        ca_bundle_file: None,
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn client_secret_env() -> AuthSettings {
    AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::Env("ARM_CLIENT_SECRET".into()),
    }
}

fn credential_error(e: &azure_core::Error) -> &CredentialError {
    e.downcast_ref::<CredentialError>()
        .expect("credential errors carry a CredentialError")
}

#[tokio::test]
async fn client_secret_from_env_map_posts_the_aad_form_and_caches_the_token() {
    let server = TokenServer::start(aad_ok(3600)).await;
    let env = env_of(&[("ARM_CLIENT_SECRET", SECRET)]);
    let cred = build_credential_with_env(
        &settings(&server.url, client_secret_env()),
        http(),
        None,
        &env,
    )
    .unwrap();
    let t1 = cred.get_token(&["ignored"]).await.unwrap();
    let t2 = cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(t1.token.secret(), "aad-token");
    assert_eq!(t2.token.secret(), "aad-token");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "second call must be served from the cache");
    let req = &seen[0];
    assert_eq!(req.method, Method::POST);
    assert_eq!(req.path, "/tenant/oauth2/v2.0/token");
    assert_eq!(req.form["grant_type"], "client_credentials");
    assert_eq!(req.form["client_id"], "controller");
    assert_eq!(req.form["client_secret"], SECRET);
    assert_eq!(req.form["scope"], ARM_SCOPE);
}

#[tokio::test]
async fn client_secret_file_is_reread_and_the_new_secret_used_after_rotation() {
    let server = TokenServer::start(aad_ok(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client-secret");
    std::fs::write(&file, "first-secret\n").unwrap();
    let auth = AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::File(file.clone()),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    std::fs::write(&file, "second-secret").unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "a token about to expire is fetched again");
    assert_eq!(seen[0].form["client_secret"], "first-secret");
    assert_eq!(seen[1].form["client_secret"], "second-secret");
}

#[tokio::test]
async fn client_secret_in_an_azure_json_file_is_read_from_the_aad_client_secret_field() {
    let server = TokenServer::start(aad_ok(3600)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("azure.json");
    std::fs::write(
        &file,
        format!(r#"{{"cloud":"AzurePublicCloud","aadClientId":"controller","aadClientSecret":"{SECRET}"}}"#),
    )
    .unwrap();
    let auth = AuthSettings::ClientSecret {
        client_id: "controller".into(),
        secret: SecretSource::File(file),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(server.seen()[0].form["client_secret"], SECRET);
}

#[tokio::test]
async fn missing_client_secret_env_var_fails_at_construction_naming_the_variable() {
    let err = build_credential_with_env(
        &settings(
            &Url::parse("http://127.0.0.1:1").unwrap(),
            client_secret_env(),
        ),
        http(),
        None,
        &|_| None,
    )
    .unwrap_err();
    assert_eq!(err.metric_label(), "secret_unavailable");
    assert_eq!(err.kind(), "client_secret");
    assert!(err.to_string().contains("ARM_CLIENT_SECRET"), "{err}");
}

#[tokio::test]
async fn workload_identity_sends_the_rotated_token_file_on_the_next_exchange() {
    let server = TokenServer::start(aad_ok(1)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("azure-identity-token");
    std::fs::write(&file, "assertion-one\n").unwrap();
    let auth = AuthSettings::WorkloadIdentity {
        client_id: "wi-client".into(),
        token_file: file.clone(),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    assert_eq!(
        cred.get_token(&[ARM_SCOPE]).await.unwrap().token.secret(),
        "aad-token"
    );
    std::fs::write(&file, "assertion-two").unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/tenant/oauth2/v2.0/token");
    assert_eq!(seen[0].form["client_assertion"], "assertion-one");
    assert_eq!(seen[1].form["client_assertion"], "assertion-two");
    assert_eq!(seen[1].form["client_id"], "wi-client");
    assert_eq!(
        seen[1].form["client_assertion_type"],
        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    );
    assert_eq!(seen[1].form["scope"], ARM_SCOPE);
}

#[tokio::test]
async fn workload_identity_exchanges_again_when_the_token_file_changes_even_if_cached() {
    let server = TokenServer::start(aad_ok(3600)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("azure-identity-token");
    std::fs::write(&file, "first").unwrap();
    let auth = AuthSettings::WorkloadIdentity {
        client_id: "wi-client".into(),
        token_file: file.clone(),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(
        server.seen().len(),
        1,
        "unchanged file: served from the cache"
    );
    std::fs::write(&file, "the-rotated-assertion").unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].form["client_assertion"], "the-rotated-assertion");
}

#[tokio::test]
async fn workload_identity_with_a_missing_token_file_names_the_file() {
    let auth = AuthSettings::WorkloadIdentity {
        client_id: "wi-client".into(),
        token_file: PathBuf::from("/nonexistent/token"),
    };
    let cred = build_credential_with_env(
        &settings(&Url::parse("http://127.0.0.1:1").unwrap(), auth),
        http(),
        None,
        &|_| None,
    )
    .unwrap();
    let err = cred.get_token(&[ARM_SCOPE]).await.unwrap_err();
    assert_eq!(
        credential_error(&err).metric_label(),
        "token_file_unreadable"
    );
    assert!(err.to_string().contains("/nonexistent/token"), "{err}");
    assert!(err.to_string().contains("wi-client"), "{err}");
}

fn imds_ok(expires_on: &str) -> Reply {
    Reply {
        status: 200,
        body: format!(
            r#"{{"access_token":"imds-token","expires_on":{expires_on},"resource":"https://management.azure.com/","token_type":"Bearer"}}"#
        ),
        delay: Duration::ZERO,
    }
}

fn in_an_hour() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp() + 3600
}

#[tokio::test]
async fn managed_identity_system_assigned_asks_imds_with_the_metadata_header() {
    let server = TokenServer::start(imds_ok(&format!("\"{}\"", in_an_hour()))).await;
    let auth = AuthSettings::ManagedIdentity { client_id: None };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    let t = cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(t.token.secret(), "imds-token");
    assert_eq!(t.expires_on.unix_timestamp(), in_an_hour());
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "cached until near expiry");
    let req = &seen[0];
    assert_eq!(req.method, Method::GET);
    assert_eq!(req.path, "/metadata/identity/oauth2/token");
    assert_eq!(req.query["api-version"], "2018-02-01");
    assert_eq!(req.query["resource"], "https://management.azure.com/");
    assert!(!req.query.contains_key("client_id"));
    assert_eq!(req.headers["metadata"], "true");
}

#[tokio::test]
async fn managed_identity_user_assigned_sends_client_id_and_accepts_numeric_expiry() {
    let server = TokenServer::start(imds_ok(&in_an_hour().to_string())).await;
    let auth = AuthSettings::ManagedIdentity {
        client_id: Some("uami-client".into()),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    let t = cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(t.expires_on.unix_timestamp(), in_an_hour());
    let req = &server.seen()[0];
    assert_eq!(req.query["client_id"], "uami-client");
    assert_eq!(req.headers["metadata"], "true");
}

#[tokio::test]
async fn managed_identity_error_reports_status_and_imds_error_code() {
    let server = TokenServer::start(Reply {
        status: 400,
        body: r#"{"error":"invalid_request","error_description":"Identity not found"}"#.into(),
        delay: Duration::ZERO,
    })
    .await;
    let auth = AuthSettings::ManagedIdentity {
        client_id: Some("uami-client".into()),
    };
    let cred =
        build_credential_with_env(&settings(&server.url, auth), http(), None, &|_| None).unwrap();
    let err = cred.get_token(&[ARM_SCOPE]).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("400") && msg.contains("invalid_request"),
        "{msg}"
    );
    assert!(
        msg.contains("user-assigned") && msg.contains("uami-client"),
        "{msg}"
    );
    assert!(msg.contains("Identity not found"), "{msg}");
}

#[tokio::test]
async fn connection_refused_is_an_unreachable_error_naming_the_identity() {
    // Bind then drop: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let env = env_of(&[("ARM_CLIENT_SECRET", SECRET)]);
    for auth in [
        client_secret_env(),
        AuthSettings::ManagedIdentity { client_id: None },
    ] {
        let cred = build_credential_with_env(&settings(&base, auth), http(), None, &env).unwrap();
        let err = cred.get_token(&[ARM_SCOPE]).await.unwrap_err();
        let ce = credential_error(&err);
        assert_eq!(ce.metric_label(), "unreachable", "{err}");
        assert!(ce.is_retryable());
        let msg = err.to_string();
        assert!(
            msg.contains("unreachable") && msg.contains("identity"),
            "{msg}"
        );
        assert!(!msg.contains(SECRET), "{msg}");
    }
}

#[tokio::test]
async fn token_endpoint_503_is_a_retryable_rejection_without_the_secret() {
    let server = TokenServer::start(Reply {
        status: 503,
        body: r#"{"error":"temporarily_unavailable","error_description":"AADSTS90033: A transient error has occurred.\r\nTrace ID: x"}"#.into(),
        delay: Duration::ZERO,
    })
    .await;
    let env = env_of(&[("ARM_CLIENT_SECRET", SECRET)]);
    let cred = build_credential_with_env(
        &settings(&server.url, client_secret_env()),
        http(),
        None,
        &env,
    )
    .unwrap();
    let err = cred.get_token(&[ARM_SCOPE]).await.unwrap_err();
    let ce = credential_error(&err);
    assert_eq!(ce.metric_label(), "rejected");
    assert_eq!(ce.kind(), "client_secret");
    assert!(ce.is_retryable());
    let msg = err.to_string();
    assert!(msg.contains("503"), "{msg}");
    assert!(msg.contains("temporarily_unavailable"), "{msg}");
    assert!(msg.contains("clientId controller"), "{msg}");
    assert!(!msg.contains(SECRET), "{msg}");
    assert!(!format!("{err:?}").contains(SECRET));
    assert!(!format!("{cred:?}").contains(SECRET));
}

#[tokio::test]
async fn aad_rejection_reports_the_aad_error_code_and_recovers_when_the_endpoint_does() {
    let server = TokenServer::start(Reply {
        status: 401,
        body: r#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided."}"#.into(),
        delay: Duration::ZERO,
    })
    .await;
    let env = env_of(&[("ARM_CLIENT_SECRET", SECRET)]);
    let oks = Arc::new(AtomicUsize::new(0));
    let fails = Arc::new(AtomicUsize::new(0));
    let (o, f) = (oks.clone(), fails.clone());
    let hook: MetricsHook = Arc::new(move |kind, ok| {
        assert_eq!(kind, "client_secret");
        if ok { &o } else { &f }.fetch_add(1, Ordering::SeqCst);
    });
    let cred = build_credential_with_env(
        &settings(&server.url, client_secret_env()),
        http(),
        Some(hook),
        &env,
    )
    .unwrap();
    let err = cred.get_token(&[ARM_SCOPE]).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("401") && msg.contains("invalid_client"),
        "{msg}"
    );
    assert!(msg.contains("AADSTS7000215"), "{msg}");
    assert!(!msg.contains(SECRET));
    assert!(!credential_error(&err).is_retryable());
    server.set_reply(aad_ok(3600));
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(fails.load(Ordering::SeqCst), 1);
    assert_eq!(oks.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_get_token_calls_share_one_fetch() {
    let mut reply = aad_ok(3600);
    reply.delay = Duration::from_millis(150);
    let server = TokenServer::start(reply).await;
    let env = env_of(&[("ARM_CLIENT_SECRET", SECRET)]);
    let cred = build_credential_with_env(
        &settings(&server.url, client_secret_env()),
        http(),
        None,
        &env,
    )
    .unwrap();
    let calls = (0..16).map(|_| {
        let cred = cred.clone();
        tokio::spawn(async move { cred.get_token(&[ARM_SCOPE]).await })
    });
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.unwrap().unwrap().token.secret(), "aad-token");
    }
    assert_eq!(server.seen().len(), 1, "no stampede on the token endpoint");
}

#[tokio::test]
async fn clear_cache_forces_a_new_fetch() {
    let server = TokenServer::start(imds_ok(&in_an_hour().to_string())).await;
    let cred = build_credential_with_env(
        &settings(
            &server.url,
            AuthSettings::ManagedIdentity { client_id: None },
        ),
        http(),
        None,
        &|_| None,
    )
    .unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    cred.clear_cache().await.unwrap();
    cred.get_token(&[ARM_SCOPE]).await.unwrap();
    assert_eq!(server.seen().len(), 2);
}
