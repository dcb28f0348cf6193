//! Secrets stay secret: a known client secret (read from a file, used against the emulator's
//! token endpoint) never shows up in logs, `/metrics`, `/healthz`, `/readyz` or error messages,
//! not even when the token endpoint rejects it. Plain `http://` is refused for non-loopback
//! endpoints, and certificate verification has no off switch: only an extra trusted CA.

mod support;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use support::*;
use vmss_capacity_controller::config::{load, ConfigSources};
use vmss_capacity_controller::emulator::EmulatorBuilder;

const SECRET: &str = "Kn0wn-S3cret-7f3a9c";

/// Everything the tracing subscriber writes, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

/// Installs the process-wide subscriber (only this test does). Global rather than a thread's
/// scoped default: with a scoped one, a callsite first reached by another test's thread at the
/// same moment could have its interest cached without this subscriber, and an event would be
/// missed (seen once under load). Every test's events land here, which only widens the check.
fn capture_logs() -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .expect("no other test in this file installs a subscriber");
    captured
}

async fn get(url: String) -> (u16, String) {
    let rsp = reqwest::get(url).await.expect("HTTP answer");
    let status = rsp.status().as_u16();
    (status, rsp.text().await.unwrap_or_default())
}

#[tokio::test]
async fn a_known_secret_never_appears_in_logs_metrics_health_or_errors() {
    let logs = capture_logs();
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(3))],
        |_| {},
    )
    .await;
    let good = h.secret_controller("controller-app", SECRET);
    good.reconciler.run_once().await.expect("the secret works");
    assert_eq!(h.capacity("pool-a"), 3);

    // The same secret, now rejected by the token endpoint.
    let rejected = h.secret_controller("rejected-app", SECRET);
    h.state
        .register_client("rejected-app", "a-different-secret");
    let err = rejected
        .reconciler
        .run_once()
        .await
        .expect_err("a rejected secret fails the pass");
    let chain = format!("{} {err:?}", error_chain(&err));
    assert!(
        !chain.contains(SECRET),
        "the error shows the secret: {chain}"
    );
    assert!(
        chain.to_lowercase().contains("credential") || chain.to_lowercase().contains("token"),
        "the error still says what failed: {chain}"
    );
    assert!(!format!("{:?}", good.settings).contains(SECRET));

    let reconciler = Arc::new(rejected.reconciler);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(vmss_capacity_controller::http::serve(
        "127.0.0.1:0".parse().unwrap(),
        rejected.metrics.clone(),
        reconciler.clone(),
        Default::default(),
        stop.clone(),
        tx,
    ));
    let addr = rx.await.unwrap();
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (_, body) = get(format!("http://{addr}{path}")).await;
        assert!(!body.contains(SECRET), "{path} shows the secret");
    }
    let (_, metrics) = get(format!("http://{addr}/metrics")).await;
    assert!(
        metrics.contains("vmss_capacity_credential_errors_total"),
        "the failure is visible, the secret is not"
    );
    stop.cancel();
    server.await.unwrap().unwrap();

    let logged = logs.text();
    assert!(
        logged.contains("controller-app") || logged.contains("capacity written"),
        "the capture works (it saw the controller's logs): {logged}"
    );
    assert!(!logged.contains(SECRET), "the logs show the secret");
}

#[test]
fn a_plain_http_endpoint_that_is_not_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        r#"azure:
  resourceManagerEndpoint: http://management.example.com
  authorityHost: http://login.example.com
  tenantId: t
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg
  auth: {method: clientSecret, clientId: c}
nodeGroups:
  - {name: pool-a, minSize: 0, maxSize: 3}
"#,
    )
    .unwrap();
    let errs = load(&ConfigSources {
        config_file: Some(path),
        env: HashMap::from([("ARM_CLIENT_SECRET".to_string(), SECRET.to_string())]),
        ..Default::default()
    })
    .expect_err("plain http to a remote host");
    for key in ["azure.resourceManagerEndpoint", "azure.authorityHost"] {
        assert!(
            errs.0
                .iter()
                .any(|p| p.path == key && p.message.contains("loopback")),
            "{key} refused: {errs}"
        );
    }
    assert!(!errs.to_string().contains(SECRET));
}

#[tokio::test]
async fn an_untrusted_emulator_certificate_fails_unless_its_ca_is_named_in_ca_bundle_file() {
    let h = Harness::with_emulator(
        EmulatorBuilder::new().tls(true),
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(3))],
        |_| {},
    )
    .await;
    assert!(h.emulator.base_url().starts_with("https://"));
    // No option turns verification off: without the CA, the TLS handshake fails.
    let untrusted = h.secret_controller_with("tls-app", SECRET, |s| s.azure.ca_bundle_file = None);
    let err = untrusted
        .reconciler
        .run_once()
        .await
        .expect_err("an unknown CA is refused");
    let chain = format!("{} {err:?}", error_chain(&err)).to_lowercase();
    assert!(
        chain.contains("certificate") || chain.contains("tls") || chain.contains("unknownissuer"),
        "a TLS error: {chain}"
    );
    assert!(h.puts().is_empty());

    let ca = h.emulator.ca_pem().expect("the emulator's CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("emulator-ca.pem");
    std::fs::write(&ca_path, ca).unwrap();
    let trusted = h.secret_controller_with("tls-app", SECRET, |s| {
        s.azure.ca_bundle_file = Some(ca_path.clone())
    });
    trusted
        .reconciler
        .run_once()
        .await
        .expect("trusted through azure.caBundleFile");
    assert_eq!(h.capacity("pool-a"), 3);
}
