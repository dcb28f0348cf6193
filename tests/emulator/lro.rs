//! Long-running operations, VM instances following the capacity, and token expiry, on a paused
//! tokio clock (no real sleeps).

use crate::emulator_support;

use std::time::Duration;

use emulator_support::*;
use serde_json::{json, Value};
use vmss_capacity_controller::emulator::{EmulatorBuilder, FaultKind, FaultSpec, ScaleSetSeed};

fn instance_states(list: &Value) -> Vec<(String, String)> {
    list["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| {
            (
                vm["instanceId"].as_str().unwrap().to_string(),
                vm["properties"]["provisioningState"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_write_stays_in_progress_until_the_lro_delay_elapses_then_succeeds() {
    let env = Env::with(EmulatorBuilder::new().lro_delay(Duration::from_secs(30))).await;
    let etag = env
        .handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    let put = env
        .off_clock(
            "PUT",
            &vmss_path("v"),
            Some(&etag),
            Some(json!({"location": "westeurope", "sku": {"capacity": 4}})),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.text);
    assert_eq!(put.body["properties"]["provisioningState"], "Updating");
    assert_eq!(put.header("retry-after").as_deref(), Some("1"));
    let op_url = put
        .header("azure-asyncoperation")
        .expect("Azure-AsyncOperation");
    assert!(op_url.starts_with(&format!(
        "{}/subscriptions/{SUB}/providers/Microsoft.Compute/locations/westeurope/operations/",
        env.handle.base_url()
    )));
    let location = put.header("location").expect("Location");
    assert!(location.contains("monitor=true"));

    let status = send_off_clock("GET", op_url.clone(), Some(env.token.clone()), None, None).await;
    assert_eq!(status.body["status"], "InProgress");
    assert!(status.body["startTime"]
        .as_str()
        .unwrap()
        .ends_with("+00:00"));
    let monitor =
        send_off_clock("GET", location.clone(), Some(env.token.clone()), None, None).await;
    assert_eq!(monitor.status, 202);

    let vms = env
        .off_clock(
            "GET",
            &format!("{}/virtualMachines", vmss_path("v")),
            None,
            None,
        )
        .await;
    assert_eq!(
        instance_states(&vms.body),
        vec![
            ("0".into(), "Succeeded".into()),
            ("1".into(), "Succeeded".into()),
            ("2".into(), "Creating".into()),
            ("3".into(), "Creating".into()),
        ]
    );

    tokio::time::advance(Duration::from_secs(29)).await;
    let status = send_off_clock("GET", op_url.clone(), Some(env.token.clone()), None, None).await;
    assert_eq!(status.body["status"], "InProgress", "not before the delay");

    tokio::time::advance(Duration::from_secs(2)).await;
    let status = send_off_clock("GET", op_url, Some(env.token.clone()), None, None).await;
    assert_eq!(status.body["status"], "Succeeded");
    assert!(status.body["endTime"].is_string());
    let monitor = send_off_clock("GET", location, Some(env.token.clone()), None, None).await;
    assert_eq!(monitor.status, 200);
    let get = env.off_clock("GET", &vmss_path("v"), None, None).await;
    assert_eq!(get.body["properties"]["provisioningState"], "Succeeded");
    let vms = env
        .off_clock(
            "GET",
            &format!("{}/virtualMachines", vmss_path("v")),
            None,
            None,
        )
        .await;
    assert!(instance_states(&vms.body)
        .iter()
        .all(|(_, s)| s == "Succeeded"));
    let view = env.handle.state().scale_set(SUB, RG, "v").unwrap();
    assert_eq!(view.instance_count, 4);
    assert_eq!(view.provisioning_state, "Succeeded");
}

#[tokio::test(start_paused = true)]
async fn instances_follow_the_capacity_down_and_instance_delete_lowers_it() {
    let env = Env::with(EmulatorBuilder::new().lro_delay(Duration::from_secs(5))).await;
    let etag = env
        .handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 4));
    let put = env
        .off_clock(
            "PATCH",
            &vmss_path("v"),
            Some(&etag),
            Some(json!({"sku": {"capacity": 2}})),
        )
        .await;
    assert_eq!(put.status, 200);
    let vms = env
        .off_clock(
            "GET",
            &format!("{}/virtualMachines", vmss_path("v")),
            None,
            None,
        )
        .await;
    let ids: Vec<String> = instance_states(&vms.body)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, vec!["0", "1"]);

    let before = put.etag().unwrap();
    let del = env
        .off_clock(
            "POST",
            &format!("{}/delete", vmss_path("v")),
            None,
            Some(json!({"instanceIds": ["0"]})),
        )
        .await;
    assert_eq!(del.status, 202, "{}", del.text);
    assert!(del.header("azure-asyncoperation").is_some());
    let view = env.handle.state().scale_set(SUB, RG, "v").unwrap();
    assert_eq!(view.capacity, 1);
    assert_eq!(view.instance_count, 1);
    assert_ne!(view.etag, before, "instance delete bumps the ETag");
    let vms = env
        .off_clock(
            "GET",
            &format!("{}/virtualMachines", vmss_path("v")),
            None,
            None,
        )
        .await;
    let ids: Vec<String> = instance_states(&vms.body)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, vec!["1"]);
}

#[tokio::test(start_paused = true)]
async fn an_lro_failed_fault_ends_the_operation_failed_with_an_error() {
    let env = Env::with(EmulatorBuilder::new().lro_delay(Duration::from_secs(10))).await;
    let etag = env
        .handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    env.handle.state().inject_fault(FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some("/virtualMachineScaleSets/v".into()),
        kind: FaultKind::LroFailed {
            code: None,
            zone: None,
        },
        count: Some(1),
        probability: None,
        seed: None,
    });
    let put = env
        .off_clock(
            "PUT",
            &vmss_path("v"),
            Some(&etag),
            Some(json!({"location": "westeurope", "sku": {"capacity": 3}})),
        )
        .await;
    assert_eq!(put.status, 200);
    let op = put.header("azure-asyncoperation").unwrap();
    let st = send_off_clock("GET", op.clone(), Some(env.token.clone()), None, None).await;
    assert_eq!(st.body["status"], "InProgress");
    tokio::time::advance(Duration::from_secs(11)).await;
    let st = send_off_clock("GET", op, Some(env.token.clone()), None, None).await;
    assert_eq!(st.body["status"], "Failed");
    assert!(st.body["error"]["code"].is_string());
    assert_eq!(
        env.handle
            .state()
            .scale_set(SUB, RG, "v")
            .unwrap()
            .provisioning_state,
        "Failed"
    );
}

#[tokio::test(start_paused = true)]
async fn tokens_expire_after_their_lifetime_on_the_tokio_clock() {
    let env = Env::with(EmulatorBuilder::new().token_lifetime(Duration::from_secs(60))).await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let a = env.off_clock("GET", &vmss_path("v"), None, None).await;
    assert_eq!(a.status, 200);
    tokio::time::advance(Duration::from_secs(61)).await;
    let a = env.off_clock("GET", &vmss_path("v"), None, None).await;
    assert_eq!(a.status, 401);
    assert_eq!(a.error_code(), Some("ExpiredAuthenticationToken"));
    assert!(a
        .header("www-authenticate")
        .unwrap()
        .contains("invalid_token"));
}
