//! AKS's resource-provider throttling over HTTP: each agent pool's and each managed cluster's
//! write bucket, the subscription's LIST bucket, the 429 `Throttled` answer with `Retry-After` in
//! whole seconds and ARM's headers, switched on by the builder, the control API and the
//! `emulator` command's flags.

use crate::emulator_support;

use emulator_support::*;
use serde_json::{json, Value};
use std::time::Duration;
use vmss_capacity_controller::emulator::{
    AksLimits, EmulatorBuilder, ScaleSetSeed, ThrottleLimits,
};

/// Creates cluster `c` with a User pool `a` of 1 node, off the paused clock.
async fn cluster(env: &Env) {
    let body = json!({"location": "westeurope", "properties": {"agentPoolProfiles": [
        {"name": "a", "count": 1, "mode": "User", "vmSize": "Standard_D4s_v5"}]}});
    let a = env
        .off_clock("PUT", &cluster_path("c"), None, Some(body))
        .await;
    assert_eq!(a.status, 201, "{}", a.text);
}

fn pool_body(count: i64) -> Value {
    json!({"properties": {"count": count, "vmSize": "Standard_D4s_v5", "mode": "User"}})
}

#[tokio::test(start_paused = true)]
async fn a_pools_empty_bucket_answers_429_throttled_with_retry_after_in_whole_seconds_and_arms_headers(
) {
    let limits = AksLimits {
        pool_write_burst: 2,
        ..AksLimits::aks()
    };
    // ARM's and Compute's limits too, AKS's among them.
    let env = Env::with(EmulatorBuilder::new().throttling(ThrottleLimits {
        aks: Some(limits),
        ..ThrottleLimits::azure_compute()
    }))
    .await;
    cluster(&env).await;
    for count in [2, 3] {
        let a = env
            .off_clock("PUT", &pool_path("c", "a"), None, Some(pool_body(count)))
            .await;
        assert_eq!(a.status, 200, "{}", a.text);
    }
    let refused = env
        .off_clock("PUT", &pool_path("c", "a"), None, Some(pool_body(4)))
        .await;
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_eq!(refused.error_code(), Some("Throttled"));
    assert_eq!(
        refused.body.pointer("/error/message").and_then(Value::as_str),
        Some(&*format!("The PutAgentPoolHandler.PUT request limit has been exceeded for SubID='{SUB}', please retry again in 60 seconds. For more information, please visit aka.ms/aks/throttling"))
    );
    assert_eq!(refused.header("retry-after").as_deref(), Some("60"));
    assert_eq!(
        refused
            .header("x-ms-ratelimit-remaining-subscription-writes")
            .as_deref(),
        Some("196"),
        "ARM admitted it first and charged it (the cluster's PUT and three pools')"
    );
    assert!(refused.header("x-ms-request-id").is_some());
    assert!(
        refused
            .header("x-ms-ratelimit-remaining-resource")
            .is_none(),
        "not a Compute request, and AKS reports no count of its own"
    );
    let pool = env.handle.state().agent_pool(SUB, RG, "c", "a").unwrap();
    assert_eq!(pool.count, 3, "a refused write changes nothing");

    // The cluster's bucket is its own: a pool's writes did not spend it.
    let tags = json!({"location": "westeurope", "tags": {"team": "blue"}});
    assert_eq!(
        env.off_clock("PATCH", &cluster_path("c"), None, Some(tags))
            .await
            .status,
        200
    );

    // 45 s later a quarter of a token is missing: 15 s.
    tokio::time::advance(Duration::from_secs(45)).await;
    let early = env
        .off_clock("PUT", &pool_path("c", "a"), None, Some(pool_body(4)))
        .await;
    assert_eq!(early.status, 429);
    assert_eq!(early.header("retry-after").as_deref(), Some("15"));
    tokio::time::advance(Duration::from_secs(15)).await;
    let a = env
        .off_clock("PUT", &pool_path("c", "a"), None, Some(pool_body(4)))
        .await;
    assert_eq!(a.status, 200, "{}", a.text);

    let logged: Vec<(u16, Option<String>)> = env
        .handle
        .state()
        .request_log()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.path.contains("/agentPools/a"))
        .map(|r| (r.status, r.error.map(|(code, _)| code)))
        .collect();
    assert_eq!(
        logged,
        vec![
            (200, None),
            (200, None),
            (429, Some("Throttled".into())),
            (429, Some("Throttled".into())),
            (200, None)
        ]
    );
}

#[tokio::test]
async fn the_control_api_turns_aks_throttling_on_with_its_limits_and_off_and_reset_restores_the_start(
) {
    let env = Env::start().await;
    let control = |method: reqwest::Method, body: Option<Value>| {
        let env = &env;
        async move {
            let mut req = env.http.request(
                method,
                format!("{}/_emulator/throttling/aks", env.handle.base_url()),
            );
            if let Some(b) = body {
                req = req.json(&b);
            }
            let rsp = req.send().await.unwrap();
            (rsp.status().as_u16(), rsp.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(
        control(reqwest::Method::GET, None).await,
        (200, json!({"enabled": false, "limits": null}))
    );
    cluster(&env).await;
    let (status, on) = control(
        reqwest::Method::POST,
        Some(json!({"enabled": true, "scale": 0.5, "list_burst": 2})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        on,
        json!({"enabled": true, "limits": {
            "pool_write_per_min": 0.5, "pool_write_burst": 10,
            "cluster_write_per_min": 0.5, "cluster_write_burst": 10,
            "list_per_min": 30.0, "list_burst": 2}})
    );
    // LISTs and GETs of the subscription's clusters and pools share one bucket.
    assert_eq!(env.get(&pool_path("c", "a")).await.status, 200);
    assert_eq!(
        env.get(&format!("{}/agentPools", cluster_path("c")))
            .await
            .status,
        200
    );
    let listed = env.get(&cluster_path("c")).await;
    assert_eq!(listed.status, 429);
    assert_eq!(listed.error_code(), Some("Throttled"));
    assert_eq!(
        listed.header("retry-after").as_deref(),
        Some("2"),
        "30 a minute: a token every 2 s"
    );
    // Scale sets are Compute's, not AKS's.
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);
    // Off from outside: nothing refused.
    assert_eq!(
        control(reqwest::Method::POST, Some(json!({"enabled": false})))
            .await
            .1,
        json!({"enabled": false, "limits": null})
    );
    assert_eq!(env.get(&cluster_path("c")).await.status, 200);
    for bad in [
        json!({"enabled": true, "scale": 0}),
        json!({"enabled": true, "pool_write_burst": 0}),
        json!({"enabled": true, "pool_write_per_min": -1}),
        json!({"enabled": true, "bucket": 3}),
    ] {
        assert_eq!(
            control(reqwest::Method::POST, Some(bad.clone())).await.0,
            400,
            "{bad}"
        );
    }
    control(reqwest::Method::POST, Some(json!({"enabled": true}))).await;
    env.handle.state().reset();
    assert_eq!(
        control(reqwest::Method::GET, None).await.1,
        json!({"enabled": false, "limits": null}),
        "a reset returns to the limits the emulator started with"
    );
}

#[tokio::test]
async fn the_emulator_command_enforces_aks_limits_with_aks_throttling_scaled_by_aks_limits_scale() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmss-capacity-controller"))
        .args(["emulator", "--listen", "127.0.0.1:0", "--lro-delay", "0s"])
        .args(["--aks-throttling", "--aks-limits-scale", "0.05"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("emulator starts");
    let out = child.stdout.take().expect("stdout");
    let _running = Running(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("emulator listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let http = reqwest::Client::new();
    let limits: Value = http
        .get(format!("{url}/_emulator/throttling/aks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        limits["limits"]["pool_write_burst"],
        json!(1),
        "20 at 0.05: {limits}"
    );
    let token: Value = http
        .get(format!("{url}/_emulator/token?client_id=outside"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["access_token"].as_str().unwrap().to_string();
    let send = |method: reqwest::Method, path: String, body: Value| {
        let (http, url, token) = (&http, &url, &token);
        async move {
            http.request(method, format!("{url}{path}?api-version={API}"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let body = json!({"location": "westeurope", "properties": {"agentPoolProfiles": [
        {"name": "a", "count": 1, "mode": "User", "vmSize": "Standard_D4s_v5"}]}});
    let created = send(reqwest::Method::PUT, cluster_path("c"), body).await;
    assert_eq!(created.status().as_u16(), 201);
    let first = send(reqwest::Method::PUT, pool_path("c", "a"), pool_body(2)).await;
    assert_eq!(first.status().as_u16(), 200);
    let second = send(reqwest::Method::PUT, pool_path("c", "a"), pool_body(3)).await;
    assert_eq!(second.status().as_u16(), 429);
    let retry = second
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("Retry-After in whole seconds");
    assert!(
        (1..=1200).contains(&retry),
        "a token every 20 minutes at 0.05 a minute: {retry}"
    );
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "Throttled");
}
