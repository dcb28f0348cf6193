//! Starting and stopping: the handle stops the server on drop, `serve_until` writes the CA and
//! runs until its shutdown future completes.

use crate::emulator_support;

use std::time::Duration;

use emulator_support::*;
use vmss_capacity_controller::emulator::{
    serve_until, EmulatorBuilder, EmulatorError, ScaleSetSeed,
};

#[tokio::test]
async fn dropping_the_handle_stops_the_server_and_its_connections() {
    let env = Env::start().await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    assert_eq!(
        env.get(&vmss_path("v")).await.status,
        200,
        "keep-alive connection open"
    );
    let addr = env.handle.addr();
    let Env {
        handle,
        http,
        token,
    } = env;
    drop(handle);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let url = format!("http://{addr}{}?api-version={API}", vmss_path("v"));
    let r = http.get(&url).bearer_auth(&token).send().await;
    assert!(r.is_err(), "no answer after drop: {r:?}");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn serve_until_writes_the_ca_pem_and_stops_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("ca.pem");
    let watched = cert.clone();
    let shutdown = async move {
        // Stop as soon as the certificate is on disk (it is written before serving starts).
        for _ in 0..200 {
            if watched.exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    serve_until(
        EmulatorBuilder::new().tls(true),
        Some(cert.clone()),
        shutdown,
    )
    .await
    .unwrap();
    let pem = std::fs::read_to_string(&cert).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
}

#[tokio::test]
async fn a_certificate_file_without_tls_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = serve_until(
        EmulatorBuilder::new(),
        Some(dir.path().join("ca.pem")),
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, EmulatorError::CertificateWithoutTls), "{err}");
}

#[tokio::test]
async fn binding_a_busy_address_is_a_bind_error() {
    let first = EmulatorBuilder::new().start().await.unwrap();
    let err = EmulatorBuilder::new()
        .listen(first.addr())
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, EmulatorError::Bind { .. }), "{err}");
}
