//! Faults (every kind, count, probability, method/path matching) and throttling.

use crate::emulator_support;

use std::time::Duration;

use emulator_support::*;
use serde_json::json;
use vmss_capacity_controller::emulator::{
    EmulatorBuilder, FaultKind, FaultSpec, ScaleSetSeed, ThrottleLimits,
};

fn fault(method: Option<&str>, kind: FaultKind, count: Option<u32>) -> FaultSpec {
    FaultSpec {
        method: method.map(str::to_string),
        path_contains: Some("virtualMachineScaleSets/v".into()),
        kind,
        count,
        probability: None,
        seed: None,
    }
}

fn put_body(n: i64) -> serde_json::Value {
    json!({"location": "westeurope", "sku": {"capacity": n}})
}

async fn seeded() -> (Env, String) {
    let env = Env::start().await;
    let etag = env
        .handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    (env, etag)
}

#[tokio::test]
async fn status_faults_answer_arm_errors_for_the_next_n_matching_requests() {
    let (env, _) = seeded().await;
    let state = env.handle.state();
    let cases = [
        (500, None, "InternalServerError"),
        (503, None, "ServiceUnavailable"),
        (409, None, "OperationNotAllowed"),
        (429, None, "TooManyRequests"),
        (409, Some("Conflict"), "Conflict"),
    ];
    for (code, name, expected) in cases {
        state.inject_fault(fault(
            Some("GET"),
            FaultKind::Status {
                code,
                code_name: name.map(str::to_string),
                retry_after_secs: None,
            },
            Some(1),
        ));
        let a = env.get(&vmss_path("v")).await;
        assert_eq!(a.status, code);
        assert_eq!(a.error_code(), Some(expected));
        if code == 429 {
            assert_eq!(a.header("retry-after").as_deref(), Some("1"));
        }
        if code == 409 && name.is_none() {
            assert!(a.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("quota"));
        }
        assert_eq!(
            env.get(&vmss_path("v")).await.status,
            200,
            "count 1 is used up"
        );
    }
    // Method matching: a PUT fault leaves GETs alone.
    state.inject_fault(fault(
        Some("PUT"),
        FaultKind::Status {
            code: 500,
            code_name: None,
            retry_after_secs: Some(7),
        },
        Some(2),
    ));
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);
    let a = env
        .send("PUT", &vmss_path("v"), None, None, Some(put_body(3)))
        .await;
    assert_eq!(a.status, 500);
    assert_eq!(a.header("retry-after").as_deref(), Some("7"));
    assert_eq!(
        env.handle.state().scale_set(SUB, RG, "v").unwrap().capacity,
        2,
        "not committed"
    );
}

#[tokio::test]
async fn latency_faults_delay_the_answer() {
    let (env, _) = seeded().await;
    env.handle.state().inject_fault(fault(
        None,
        FaultKind::Latency {
            ms: 150,
            max_ms: None,
        },
        Some(1),
    ));
    let t = std::time::Instant::now();
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn a_slow_answer_shows_the_state_as_it_was_when_the_request_was_handled() {
    let (env, _) = seeded().await;
    env.handle.state().inject_fault(fault(
        Some("GET"),
        FaultKind::SlowAnswer {
            ms: 400,
            max_ms: None,
        },
        Some(1),
    ));
    let t = std::time::Instant::now();
    // The GET is handled at once (capacity 2); a write lands while its answer travels.
    let path = vmss_path("v");
    let (read, write) = tokio::join!(env.get(&path), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let w = env
            .send("PUT", &vmss_path("v"), None, None, Some(put_body(5)))
            .await;
        (w, t.elapsed())
    });
    assert_eq!(write.0.status, 200);
    assert!(
        write.1 < Duration::from_millis(400),
        "the write was not held"
    );
    assert_eq!(read.status, 200);
    assert_eq!(read.body["sku"]["capacity"], 2, "the state as handled");
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(
        env.get(&vmss_path("v")).await.body["sku"]["capacity"],
        5,
        "count 1 is used up; the write is there"
    );
}

#[tokio::test]
async fn drop_before_commit_closes_the_connection_and_changes_nothing() {
    let (env, etag) = seeded().await;
    env.handle
        .state()
        .inject_fault(fault(Some("PUT"), FaultKind::DropBeforeCommit, Some(1)));
    let r = env
        .http
        .put(env.url(&vmss_path("v")))
        .bearer_auth(&env.token)
        .header("If-Match", &etag)
        .json(&put_body(5))
        .send()
        .await;
    assert!(r.is_err(), "the client sees a connection error");
    let view = env.handle.state().scale_set(SUB, RG, "v").unwrap();
    assert_eq!((view.capacity, view.etag), (2, etag));
    let log = env.handle.state().request_log();
    assert_eq!(log.last().unwrap().status, 0, "logged as dropped");
}

#[tokio::test]
async fn drop_after_commit_closes_the_connection_but_the_capacity_changed() {
    let (env, etag) = seeded().await;
    env.handle
        .state()
        .inject_fault(fault(Some("PUT"), FaultKind::DropAfterCommit, Some(1)));
    let r = env
        .http
        .put(env.url(&vmss_path("v")))
        .bearer_auth(&env.token)
        .header("If-Match", &etag)
        .json(&put_body(5))
        .send()
        .await;
    assert!(r.is_err(), "the client sees a connection error");
    let view = env.handle.state().scale_set(SUB, RG, "v").unwrap();
    assert_eq!(view.capacity, 5, "the write landed");
    assert_ne!(view.etag, etag);
    // The emulator keeps serving other connections.
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);
}

#[tokio::test]
async fn no_etag_faults_strip_the_header_and_the_body_etag() {
    let (env, etag) = seeded().await;
    env.handle
        .state()
        .inject_fault(fault(Some("PUT"), FaultKind::NoEtag, Some(1)));
    let a = env
        .send("PUT", &vmss_path("v"), Some(&etag), None, Some(put_body(4)))
        .await;
    assert_eq!(a.status, 200);
    assert!(a.etag().is_none());
    assert!(a.body.get("etag").is_none());
    assert_eq!(a.body["sku"]["capacity"], 4);
}

#[tokio::test]
async fn delete_before_handling_makes_gets_404_conditional_puts_412_and_blind_puts_create() {
    let (env, etag) = seeded().await;
    let state = env.handle.state();
    state.inject_fault(fault(Some("GET"), FaultKind::DeleteBeforeHandling, Some(1)));
    assert_eq!(env.get(&vmss_path("v")).await.status, 404);

    let etag2 = state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    assert_ne!(etag2, etag, "a re-created scale set never reuses an ETag");
    state.inject_fault(fault(Some("PUT"), FaultKind::DeleteBeforeHandling, Some(1)));
    let a = env
        .send(
            "PUT",
            &vmss_path("v"),
            Some(&etag2),
            None,
            Some(put_body(3)),
        )
        .await;
    assert_eq!(a.status, 412);

    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    state.inject_fault(fault(Some("PUT"), FaultKind::DeleteBeforeHandling, Some(1)));
    let a = env
        .send("PUT", &vmss_path("v"), None, None, Some(put_body(3)))
        .await;
    assert_eq!(a.status, 201);
}

#[tokio::test]
async fn truncate_faults_cut_the_body_into_malformed_json() {
    let (env, _) = seeded().await;
    env.handle
        .state()
        .inject_fault(fault(Some("GET"), FaultKind::Truncate, Some(1)));
    let a = env.get(&vmss_path("v")).await;
    assert_eq!(a.status, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&a.text).is_err());
    assert!(a.text.starts_with('{'));
}

#[tokio::test]
async fn probability_faults_are_reproducible_from_their_seed() {
    async fn failures(seed: u64) -> Vec<bool> {
        let (env, _) = seeded().await;
        env.handle.state().inject_fault(FaultSpec {
            probability: Some(0.5),
            seed: Some(seed),
            ..fault(
                None,
                FaultKind::Status {
                    code: 503,
                    code_name: None,
                    retry_after_secs: None,
                },
                None,
            )
        });
        let mut out = Vec::new();
        for _ in 0..40 {
            out.push(env.get(&vmss_path("v")).await.status == 503);
        }
        out
    }
    let a = failures(42).await;
    let hits = a.iter().filter(|f| **f).count();
    assert!((5..=35).contains(&hits), "{hits} of 40");
    assert_eq!(a, failures(42).await, "same seed, same sequence");
}

#[tokio::test(start_paused = true)]
async fn throttling_answers_429_with_retry_after_and_refills_on_the_tokio_clock() {
    let limits = ThrottleLimits {
        vmss_write_per_min: 1.0,
        vmss_write_burst: 2,
        ..ThrottleLimits::azure_compute()
    };
    let env = Env::with(EmulatorBuilder::new().throttling(limits)).await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let a = env
        .off_clock("PUT", &vmss_path("v"), None, Some(put_body(2)))
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some("Microsoft.Compute/UpdateVMScaleSet3Min;1499"),
        "the region's bucket (the scale set's own, 1 left, is not reported)"
    );
    assert_eq!(
        a.header("x-ms-ratelimit-remaining-subscription-writes")
            .as_deref(),
        Some("199")
    );
    assert_eq!(
        env.off_clock("PUT", &vmss_path("v"), None, Some(put_body(3)))
            .await
            .status,
        200
    );
    let a = env
        .off_clock("PUT", &vmss_path("v"), None, Some(put_body(4)))
        .await;
    assert_eq!(a.status, 429);
    assert_eq!(a.error_code(), Some("TooManyRequests"));
    assert_eq!(a.header("retry-after").as_deref(), Some("60"));
    assert_eq!(
        env.handle.state().scale_set(SUB, RG, "v").unwrap().capacity,
        3
    );
    // Reads have their own bucket.
    let g = env.off_clock("GET", &vmss_path("v"), None, None).await;
    assert_eq!(g.status, 200);
    assert_eq!(
        g.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some("Microsoft.Compute/GetVMScaleSet3Min;2399")
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        env.off_clock("PUT", &vmss_path("v"), None, Some(put_body(4)))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn rate_limit_headers_are_present_even_with_throttling_off() {
    let (env, _) = seeded().await;
    let a = env.get(&vmss_path("v")).await;
    assert!(a
        .header("x-ms-ratelimit-remaining-subscription-reads")
        .is_some());
    assert!(a.header("x-ms-ratelimit-remaining-resource").is_some());
}

#[tokio::test(start_paused = true)]
async fn computes_buckets_are_shared_by_the_scale_sets_of_a_region_and_arms_by_every_region() {
    // Compute's updates, per subscription and region: 2 (each scale set's own bucket holds 12).
    // ARM's writes, per subscription: 4.
    let limits = ThrottleLimits {
        sub_write_per_min: 1.0,
        sub_write_burst: 2,
        sub_delete_per_min: 1.0,
        sub_delete_burst: 3,
        arm_write_per_min: 1.0,
        arm_write_burst: 4,
        ..ThrottleLimits::azure_compute()
    };
    let env = Env::with(EmulatorBuilder::new().throttling(limits)).await;
    for (name, location) in [
        ("v", "westeurope"),
        ("w", "westeurope"),
        ("x", "northeurope"),
    ] {
        let mut seed = ScaleSetSeed::new(SUB, RG, name, 1);
        seed.location = location.into();
        env.handle.state().seed_scale_set(seed);
    }
    let put = |name: &'static str, capacity: i64| {
        let env = &env;
        let location = if name == "x" {
            "northeurope"
        } else {
            "westeurope"
        };
        let body = json!({"location": location, "sku": {"capacity": capacity}});
        async move {
            env.off_clock("PUT", &vmss_path(name), None, Some(body))
                .await
        }
    };
    assert_eq!(put("v", 2).await.status, 200);
    let b = put("w", 2).await;
    assert_eq!(b.status, 200);
    assert_eq!(
        b.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some("Microsoft.Compute/UpdateVMScaleSet3Min;0"),
        "another scale set of the region spent from the same bucket"
    );
    assert_eq!(
        b.header("x-ms-ratelimit-remaining-subscription-writes")
            .as_deref(),
        Some("2")
    );
    let c = put("w", 3).await;
    assert_eq!(
        c.status, 429,
        "w's own bucket has tokens; the region's does not"
    );
    assert!(c.header("retry-after").is_some());
    assert_eq!(
        c.header("x-ms-ratelimit-remaining-subscription-writes")
            .as_deref(),
        Some("1"),
        "ARM admitted it before Compute refused it"
    );
    // Another region has its own Compute bucket, and the same ARM one.
    let x = put("x", 2).await;
    assert_eq!(x.status, 200);
    assert_eq!(
        x.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some("Microsoft.Compute/UpdateVMScaleSet3Min;1")
    );
    assert_eq!(
        x.header("x-ms-ratelimit-remaining-subscription-writes")
            .as_deref(),
        Some("0")
    );
    let refused = put("x", 3).await;
    assert_eq!(refused.status, 429, "ARM's bucket is empty");
    assert_eq!(
        refused.header("x-ms-ratelimit-remaining-resource"),
        None,
        "ARM refused it: Compute never saw it"
    );
    assert_eq!(
        env.handle.state().scale_set(SUB, RG, "x").unwrap().capacity,
        2
    );
    // A delete of instances pays from the deletes buckets, not the writes ones.
    let d = env
        .off_clock(
            "POST",
            &format!("{}/delete", vmss_path("v")),
            None,
            Some(json!({"instanceIds": ["0"]})),
        )
        .await;
    assert_ne!(d.status, 429);
    assert_eq!(
        d.header("x-ms-ratelimit-remaining-subscription-deletes")
            .as_deref(),
        Some((limits.arm_delete_burst - 1).to_string().as_str())
    );
    assert_eq!(
        d.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some("Microsoft.Compute/DeleteVMScaleSetVMs3Min;2")
    );
    // A LIST is a high-cost GET, from its own bucket.
    let l = env
        .off_clock("GET", vmss_path("").trim_end_matches('/'), None, None)
        .await;
    assert_eq!(l.status, 200);
    assert_eq!(
        l.header("x-ms-ratelimit-remaining-resource").as_deref(),
        Some(
            format!(
                "Microsoft.Compute/HighCostGetVMScaleSet3Min;{}",
                limits.sub_list_burst - 1
            )
            .as_str()
        )
    );
}
