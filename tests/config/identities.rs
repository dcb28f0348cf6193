//! Every supported identity, end to end through the emulator's own token endpoint and IMDS: the
//! controller's credential obtains a token, ARM (the emulator) attributes the writes to that
//! identity, and each failure gives a clear error and a metric instead of a crash.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::azure::arm::{http_client, ArmTarget};
use vmss_capacity_controller::azure::{credentials, ArmClient};
use vmss_capacity_controller::config::{AuthSettings, SecretSource, Settings};
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle, ScaleSetSeed};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::reconciler::Reconciler;

const SECRET: &str = "identity-test-secret-7f3a";

struct Setup {
    emulator: EmulatorHandle,
    metrics: Arc<Metrics>,
    reconciler: Reconciler,
}

async fn setup(builder: EmulatorBuilder, auth: AuthSettings, env: &[(&str, &str)]) -> Setup {
    let emulator = builder.start().await.unwrap();
    let state = emulator.state();
    state.register_client("sp-client", SECRET);
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "pool-a", 1));
    let mut s: Settings = settings(&emulator.base_url(), vec![group("pool-a", 0, 10, Some(2))]);
    s.azure.auth = auth;
    let settings = Arc::new(s);
    let metrics = Arc::new(Metrics::new());
    let m = metrics.clone();
    let hook: credentials::MetricsHook = Arc::new(move |kind: &'static str, ok: bool| {
        if !ok {
            m.credential_errors_total.with_label_values(&[kind]).inc();
        }
    });
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let http = http_client(Duration::from_secs(5), None).unwrap();
    let credential =
        credentials::build_credential_with_env(&settings.azure, http.clone(), Some(hook), &lookup)
            .unwrap();
    let target = ArmTarget {
        endpoint: settings.azure.resource_manager_endpoint.clone(),
        subscription: SUB.into(),
        resource_group: RG.into(),
    };
    let arm = Arc::new(ArmClient::new(target, credential, http, metrics.clone()));
    let reconciler = Reconciler::builder(settings, arm, metrics.clone()).build();
    Setup {
        emulator,
        metrics,
        reconciler,
    }
}

fn writers(e: &EmulatorHandle) -> Vec<String> {
    let mut w: Vec<String> = e
        .state()
        .request_log()
        .into_iter()
        .filter(|r| r.method == "PUT")
        .filter_map(|r| r.writer)
        .collect();
    w.dedup();
    w
}

#[tokio::test]
async fn a_client_secret_from_the_environment_gets_a_token_and_the_writes_carry_its_identity() {
    let auth = AuthSettings::ClientSecret {
        client_id: "sp-client".into(),
        secret: SecretSource::Env("ARM_CLIENT_SECRET".into()),
    };
    let s = setup(
        EmulatorBuilder::new(),
        auth,
        &[("ARM_CLIENT_SECRET", SECRET)],
    )
    .await;
    s.reconciler.run_once().await.unwrap();
    assert_eq!(
        s.emulator
            .state()
            .scale_set(SUB, RG, "pool-a")
            .unwrap()
            .capacity,
        2
    );
    assert_eq!(writers(&s.emulator), ["sp-client"]);
}

#[tokio::test]
async fn a_client_secret_from_a_file_gets_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client-secret");
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    let auth = AuthSettings::ClientSecret {
        client_id: "sp-client".into(),
        secret: SecretSource::File(file),
    };
    let s = setup(EmulatorBuilder::new(), auth, &[]).await;
    s.reconciler.run_once().await.unwrap();
    assert_eq!(writers(&s.emulator), ["sp-client"]);
}

#[tokio::test]
async fn a_rejected_client_secret_fails_the_pass_with_a_clear_error_and_a_metric() {
    let auth = AuthSettings::ClientSecret {
        client_id: "sp-client".into(),
        secret: SecretSource::Env("ARM_CLIENT_SECRET".into()),
    };
    let s = setup(
        EmulatorBuilder::new(),
        auth,
        &[("ARM_CLIENT_SECRET", "wrong-secret-value")],
    )
    .await;
    let err = s.reconciler.run_once().await.unwrap_err();
    let chain = error_chain(&err);
    assert!(chain.contains("could not get a token"), "{chain}");
    assert!(
        chain.contains("AADSTS7000215") || chain.contains("invalid_client"),
        "the AAD reason is named: {chain}"
    );
    assert!(
        !chain.contains("wrong-secret-value"),
        "the secret never appears: {chain}"
    );
    assert!(Metrics::counter_sum(&s.metrics.credential_errors_total, &[]) >= 1);
    assert!(s
        .emulator
        .state()
        .request_log()
        .iter()
        .all(|r| r.method != "PUT"));
}

#[tokio::test]
async fn workload_identity_uses_the_rotated_token_file_for_the_next_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, "projected-sa-token-one").unwrap();
    let auth = AuthSettings::WorkloadIdentity {
        client_id: "wi-client".into(),
        token_file: token_file.clone(),
    };
    let s = setup(EmulatorBuilder::new(), auth, &[]).await;
    s.reconciler.run_once().await.unwrap();
    // AKS rotates the projected token while the daemon runs.
    std::fs::write(&token_file, "projected-sa-token-two-longer").unwrap();
    s.reconciler.node_groups().scale_sets().invalidate_all();
    s.reconciler.run_once().await.unwrap();
    let seen = s.emulator.state().federated_assertions_seen();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("projected-sa-token-one")
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("projected-sa-token-two-longer"),
        "the new assertion is used: {seen:?}"
    );
    assert_eq!(writers(&s.emulator), ["wi-client"]);
}

#[tokio::test]
async fn managed_identity_system_assigned_asks_imds() {
    let s = setup(
        EmulatorBuilder::new(),
        AuthSettings::ManagedIdentity { client_id: None },
        &[],
    )
    .await;
    s.reconciler.run_once().await.unwrap();
    assert_eq!(writers(&s.emulator), ["system-assigned"]);
}

#[tokio::test]
async fn managed_identity_user_assigned_asks_imds_for_its_client_id() {
    let s = setup(
        EmulatorBuilder::new(),
        AuthSettings::ManagedIdentity {
            client_id: Some("uami-client".into()),
        },
        &[],
    )
    .await;
    s.reconciler.run_once().await.unwrap();
    assert_eq!(writers(&s.emulator), ["uami-client"]);
}

#[tokio::test]
async fn a_token_endpoint_that_is_down_fails_passes_clearly_and_recovery_needs_no_restart() {
    let auth = AuthSettings::ClientSecret {
        client_id: "sp-client".into(),
        secret: SecretSource::Env("ARM_CLIENT_SECRET".into()),
    };
    let s = setup(
        EmulatorBuilder::new(),
        auth,
        &[("ARM_CLIENT_SECRET", SECRET)],
    )
    .await;
    s.emulator.state().set_token_endpoint_down(true);
    for _ in 0..3 {
        let err = s.reconciler.run_once().await.unwrap_err();
        assert!(error_chain(&err).contains("could not get a token"));
    }
    assert!(Metrics::counter_sum(&s.metrics.credential_errors_total, &[]) >= 3);
    s.emulator.state().set_token_endpoint_down(false);
    s.reconciler.run_once().await.unwrap();
    assert_eq!(
        s.emulator
            .state()
            .scale_set(SUB, RG, "pool-a")
            .unwrap()
            .capacity,
        2
    );
}

#[tokio::test]
async fn imds_that_is_down_fails_passes_clearly_and_recovers() {
    let s = setup(
        EmulatorBuilder::new(),
        AuthSettings::ManagedIdentity { client_id: None },
        &[],
    )
    .await;
    s.emulator.state().set_token_endpoint_down(true);
    let err = s.reconciler.run_once().await.unwrap_err();
    assert!(error_chain(&err).contains("could not get a token"));
    assert!(
        Metrics::counter_sum(
            &s.metrics.credential_errors_total,
            &[("kind", "managed_identity")]
        ) >= 1
    );
    s.emulator.state().set_token_endpoint_down(false);
    s.reconciler.run_once().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_token_arm_calls_expired_is_dropped_and_replaced_on_the_next_pass() {
    // The emulator judges expiry on tokio's clock, the credential on the wall clock: advancing
    // tokio's clock makes ARM refuse a token the credential still thinks valid (clock skew).
    let auth = AuthSettings::ClientSecret {
        client_id: "sp-client".into(),
        secret: SecretSource::Env("ARM_CLIENT_SECRET".into()),
    };
    let s = setup(
        EmulatorBuilder::new().token_lifetime(Duration::from_secs(3600)),
        auth,
        &[("ARM_CLIENT_SECRET", SECRET)],
    )
    .await;
    s.reconciler.run_once().await.unwrap();
    tokio::time::advance(Duration::from_secs(2 * 3600)).await;
    s.reconciler.node_groups().scale_sets().invalidate_all();
    let err = s.reconciler.run_once().await.unwrap_err();
    let chain = error_chain(&err);
    assert!(chain.contains("401"), "{chain}");
    assert!(Metrics::counter_sum(&s.metrics.arm_requests_total, &[("code", "401")]) >= 1);
    // The 401 cleared the cached token: the next pass fetches a new one and succeeds.
    s.reconciler.run_once().await.unwrap();
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
