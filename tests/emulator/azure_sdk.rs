//! The emulator against Azure's own Rust SDK (azure_mgmt_compute / azure_identity 0.21), its
//! models, TLS with the emulator's CA, and the identity endpoints.

use crate::emulator_support;

use std::sync::Arc;

use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::ErrorKind;
use azure_core::{RetryOptions, StatusCode, TransportOptions, Url};
use azure_mgmt_compute::package_2024_07_01 as compute;
use compute::models::{
    Resource, Sku, VirtualMachineScaleSet, VirtualMachineScaleSetListResult,
    VirtualMachineScaleSetVmListResult,
};
use emulator_support::*;
use futures::StreamExt;
use serde_json::Value;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorState, ScaleSetSeed};

const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// A credential that hands out emulator tokens for one subject.
#[derive(Debug)]
struct EmulatorToken(EmulatorState);

#[async_trait::async_trait]
impl TokenCredential for EmulatorToken {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let expires = time::OffsetDateTime::now_utc() + std::time::Duration::from_secs(3600);
        Ok(AccessToken::new(self.0.issue_token("tester"), expires))
    }
    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

fn compute_client(env: &Env, cred: Arc<dyn TokenCredential>) -> compute::Client {
    compute::ClientBuilder::new(cred)
        .endpoint(Url::parse(&env.handle.base_url()).unwrap())
        .scopes(&[ARM_SCOPE])
        .retry(RetryOptions::none())
        .transport(TransportOptions::new(Arc::new(env.http.clone())))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_azure_models_deserialize_the_emulators_json() {
    let env = Env::with(EmulatorBuilder::new().page_size(2)).await;
    let mut seed = ScaleSetSeed::new(SUB, RG, "v", 3);
    seed.tags.insert("k".into(), "v".into());
    env.handle.state().seed_scale_set(seed);
    let get = env.get(&vmss_path("v")).await;
    let vmss: VirtualMachineScaleSet = serde_json::from_str(&get.text).expect("VMSS model");
    assert_eq!(vmss.sku.as_ref().unwrap().capacity, Some(3));
    assert_eq!(vmss.etag, get.etag());
    assert_eq!(vmss.resource.location, "westeurope");
    let props = vmss.properties.unwrap();
    assert_eq!(props.provisioning_state.as_deref(), Some("Succeeded"));
    assert!(props.time_created.is_some());
    assert!(props.unique_id.is_some());

    let vms = env
        .get(&format!("{}/virtualMachines", vmss_path("v")))
        .await;
    let list: VirtualMachineScaleSetVmListResult =
        serde_json::from_str(&vms.text).expect("VM list model");
    assert_eq!(list.value.len(), 2);
    assert!(list.next_link.is_some());
    assert_eq!(list.value[0].instance_id.as_deref(), Some("0"));

    let all = env
        .get(&format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets"))
        .await;
    let list: VirtualMachineScaleSetListResult = serde_json::from_str(&all.text).unwrap();
    assert_eq!(list.value.len(), 1);
}

#[tokio::test]
async fn the_azure_rust_sdk_reads_and_writes_conditionally_through_the_emulator() {
    let env = Env::with(EmulatorBuilder::new().page_size(1)).await;
    let state = env.handle.state();
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "w", 1));
    let client = compute_client(&env, Arc::new(EmulatorToken(state.clone())));
    let vmss = client.virtual_machine_scale_sets_client();

    let rsp = vmss.get(RG, "v", SUB).send().await.unwrap();
    let etag = rsp
        .as_raw_response()
        .headers()
        .get_optional_string(&azure_core::headers::ETAG)
        .unwrap();
    let current = rsp.into_body().await.unwrap();
    assert_eq!(current.etag.as_deref(), Some(etag.as_str()));

    let mut body = VirtualMachineScaleSet::new(Resource::new(current.resource.location.clone()));
    body.sku = Some(Sku {
        name: Some("Standard_D2s_v5".into()),
        tier: None,
        capacity: Some(5),
    });
    let put = vmss
        .create_or_update(RG, "v", body.clone(), SUB)
        .if_match(etag.clone())
        .send()
        .await
        .unwrap();
    let raw = put.as_raw_response();
    assert_eq!(raw.status(), StatusCode::Ok);
    let new_etag = raw
        .headers()
        .get_optional_string(&azure_core::headers::ETAG)
        .unwrap();
    assert_ne!(new_etag, etag);
    assert!(raw
        .headers()
        .get_optional_string(&azure_core::headers::AZURE_ASYNCOPERATION)
        .is_some());
    let written = put.into_body().await.unwrap();
    assert_eq!(written.sku.unwrap().capacity, Some(5));

    // A stale ETag is the SDK's 412.
    let err = vmss
        .create_or_update(RG, "v", body, SUB)
        .if_match(etag)
        .send()
        .await
        .unwrap_err();
    match err.kind() {
        ErrorKind::HttpResponse { status, error_code } => {
            assert_eq!(*status, StatusCode::PreconditionFailed);
            assert_eq!(error_code.as_deref(), Some("PreconditionFailed"));
        }
        other => panic!("expected a 412, got {other:?}"),
    }

    // Paged LIST through the SDK's nextLink handling.
    let mut names = Vec::new();
    let mut pages = vmss.list(RG, SUB).into_stream();
    while let Some(page) = pages.next().await {
        for v in page.unwrap().value {
            names.push(v.resource.name.unwrap());
        }
    }
    assert_eq!(names, vec!["v", "w"]);

    let mut vm_count = 0;
    let mut vms = client
        .virtual_machine_scale_set_v_ms_client()
        .list(RG, "v", SUB)
        .into_stream();
    while let Some(page) = vms.next().await {
        vm_count += page.unwrap().value.len();
    }
    assert_eq!(vm_count, 5);

    let del = vmss
        .delete_instances(
            RG,
            "v",
            compute::models::VirtualMachineScaleSetVmInstanceRequiredIDs::new(vec!["4".into()]),
            SUB,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(del.as_raw_response().status(), StatusCode::Accepted);
    assert_eq!(state.scale_set(SUB, RG, "v").unwrap().capacity, 4);
    assert!(state.lost_updates().is_empty());
    assert!(state
        .request_log()
        .iter()
        .all(|r| r.writer.as_deref() == Some("tester")));
}

#[tokio::test]
async fn azure_identity_client_secret_and_workload_identity_credentials_get_tokens() {
    let env = Env::start().await;
    let state = env.handle.state();
    state.register_client("app-1", "s3cret");
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let authority = Url::parse(&env.handle.base_url()).unwrap();
    let http: Arc<dyn azure_core::HttpClient> = Arc::new(env.http.clone());

    let good = azure_identity::ClientSecretCredential::new(
        http.clone(),
        authority.clone(),
        "tenant-1".into(),
        "app-1".into(),
        "s3cret".into(),
    );
    let client = compute_client(&env, Arc::new(good));
    let got = client
        .virtual_machine_scale_sets_client()
        .get(RG, "v", SUB)
        .await
        .unwrap();
    assert_eq!(got.sku.unwrap().capacity, Some(1));
    let log = state.request_log();
    let arm = log
        .iter()
        .find(|r| r.path.starts_with("/subscriptions/"))
        .unwrap();
    assert_eq!(
        arm.writer.as_deref(),
        Some("app-1"),
        "the token's subject is the writer"
    );
    assert!(log
        .iter()
        .any(|r| r.path == "/tenant-1/oauth2/v2.0/token" && r.status == 200));

    let bad = azure_identity::ClientSecretCredential::new(
        http.clone(),
        authority.clone(),
        "tenant-1".into(),
        "app-1".into(),
        "wrong".into(),
    );
    assert!(bad.get_token(&[ARM_SCOPE]).await.is_err());

    let wi = azure_identity::WorkloadIdentityCredential::new(
        http,
        authority,
        "tenant-1".into(),
        "app-2".into(),
        "header.payload.signature".to_string(),
    );
    let tok = wi.get_token(&[ARM_SCOPE]).await.unwrap();
    assert!(!tok.token.secret().is_empty());
    assert_eq!(
        state.federated_assertions_seen(),
        vec!["header.payload.signature"]
    );
}

#[tokio::test]
async fn the_token_endpoint_validates_its_form_and_answers_json() {
    let env = Env::start().await;
    let url = format!("{}/t/oauth2/v2.0/token", env.handle.base_url());
    let ok = env
        .http
        .post(&url)
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "c"),
            ("client_secret", "s"),
            ("scope", ARM_SCOPE),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(
        ok.headers()["content-type"],
        "application/json; charset=utf-8"
    );
    let body: Value = ok.json().await.unwrap();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    assert_eq!(body["ext_expires_in"], 3600);
    assert!(body["access_token"].is_string());

    let missing = env
        .http
        .post(&url)
        .form(&[("client_id", "c")])
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 400);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"], "invalid_request");
    let no_secret = env
        .http
        .post(&url)
        .form(&[("grant_type", "client_credentials"), ("client_id", "c")])
        .send()
        .await
        .unwrap();
    assert_eq!(no_secret.status().as_u16(), 400);

    env.handle.state().register_client("c", "right");
    let wrong = env
        .http
        .post(&url)
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "c"),
            ("client_secret", "s"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"], "invalid_client");
    assert!(body["error_description"]
        .as_str()
        .unwrap()
        .starts_with("AADSTS7000215"));
}

#[tokio::test]
async fn imds_needs_the_metadata_header_and_answers_string_expiries() {
    let env = Env::start().await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let url = format!(
        "{}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/",
        env.handle.base_url()
    );
    let refused = env.http.get(&url).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 400);
    let body: Value = env
        .http
        .get(&url)
        .header("Metadata", "true")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["resource"], "https://management.azure.com/");
    assert_eq!(body["client_id"], "system-assigned");
    assert!(body["expires_on"].as_str().unwrap().parse::<i64>().is_ok());
    assert_eq!(body["expires_in"], "3600");
    let token = body["access_token"].as_str().unwrap();
    env.send_as(token, "GET", &vmss_path("v"), None, None, None)
        .await;
    assert_eq!(
        env.handle
            .state()
            .request_log()
            .last()
            .unwrap()
            .writer
            .as_deref(),
        Some("system-assigned")
    );

    let user: Value = env
        .http
        .get(format!("{url}&client_id=uami-1"))
        .header("Metadata", "true")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(user["client_id"], "uami-1");

    env.handle.state().set_token_endpoint_down(true);
    let down = env
        .http
        .get(&url)
        .header("Metadata", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(down.status().as_u16(), 503);
}

#[tokio::test]
async fn tls_clients_trust_the_emulator_through_its_ca_pem() {
    let env = Env::with(EmulatorBuilder::new().tls(true)).await;
    assert!(env.handle.base_url().starts_with("https://127.0.0.1:"));
    let pem = env.handle.ca_pem().expect("a TLS emulator has a CA");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);
    let localhost = format!(
        "https://localhost:{}{}?api-version={API}",
        env.handle.addr().port(),
        vmss_path("v")
    );
    let via_name = env
        .http
        .get(&localhost)
        .bearer_auth(&env.token)
        .send()
        .await
        .unwrap();
    assert_eq!(via_name.status().as_u16(), 200);

    let untrusting = reqwest::Client::new();
    assert!(untrusting
        .get(env.url(&vmss_path("v")))
        .send()
        .await
        .is_err());

    // And the Azure SDK over HTTPS.
    let client = compute_client(&env, Arc::new(EmulatorToken(env.handle.state())));
    let got = client
        .virtual_machine_scale_sets_client()
        .get(RG, "v", SUB)
        .await
        .unwrap();
    assert_eq!(got.sku.unwrap().capacity, Some(1));
    assert!(EmulatorBuilder::new()
        .start()
        .await
        .unwrap()
        .ca_pem()
        .is_none());
}
