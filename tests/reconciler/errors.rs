//! The per-class error policy: throttling (`Retry-After`, on tokio's paused clock), quota
//! offering marked unavailable, 5xx backoff, and the metrics contract scraped over HTTP.

use crate::support;

use std::time::Duration;
use support::*;
use vmss_capacity_controller::emulator::{FaultKind, FaultSpec};

fn fault(method: &str, path: &str, kind: FaultKind, count: Option<u32>) -> FaultSpec {
    FaultSpec {
        method: Some(method.into()),
        path_contains: Some(path.into()),
        kind,
        count,
        probability: None,
        seed: None,
    }
}

fn status(code: u16, name: &str, retry_after_secs: Option<u64>) -> FaultKind {
    FaultKind::Status {
        code,
        code_name: Some(name.into()),
        retry_after_secs,
    }
}

/// `pool-a` at 3, planned to 5.
async fn pool_a_wanting_5() -> Harness {
    Harness::new(
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(5))],
        |_| {},
    )
    .await
}

/// The next capacity write to `pool-a` not yet refused is answered 429 with this `Retry-After`.
fn throttle_next_put(h: &Harness, retry_after_secs: u64) {
    h.state.inject_fault(fault(
        "PUT",
        "pool-a",
        status(429, "TooManyRequests", Some(retry_after_secs)),
        Some(1),
    ));
}

/// pool-a (3 nodes, wanting 5) and pool-b (`b` nodes, wanting `b_wants`), the next PUT of each
/// refused with a 429 (`Retry-After` 5 s).
async fn both_pools_throttled_once(b: i64, b_wants: u32) -> Harness {
    let h = Harness::new(
        &[("pool-a", 3), ("pool-b", b)],
        vec![
            group("pool-a", 0, 10, Some(5)),
            group("pool-b", 0, 10, Some(b_wants)),
        ],
        |_| {},
    )
    .await;
    for pool in ["pool-a", "pool-b"] {
        h.state.inject_fault(fault(
            "PUT",
            pool,
            status(429, "TooManyRequests", Some(5)),
            Some(1),
        ));
    }
    h
}

#[tokio::test(start_paused = true)]
async fn no_write_goes_out_before_retry_after_expires() {
    let h = pool_a_wanting_5().await;
    throttle_next_put(&h, 30);
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 1, "the throttled write");
    assert_eq!(h.puts()[0].status, 429);

    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(5)).await;
        let _ = h.reconciler.run_once().await;
    }
    tokio::time::advance(Duration::from_secs(4)).await; // 29 s after the 429
    let _ = h.reconciler.run_once().await;
    assert_eq!(
        h.puts().len(),
        1,
        "no write of that class before Retry-After expires"
    );
    assert!(
        h.counter(
            &h.metrics.writes_held_total,
            &[("scale_set", "pool-a"), ("reason", "retry_turn")]
        ) >= 6,
        "every pass held the scale-up for its turn"
    );

    // A new scale-up waits its turn behind the fleet's older ones: one scan interval more (and
    // a random part of up to a second).
    tokio::time::advance(Duration::from_secs(2)).await;
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 1, "31 s: still behind older scale-ups");
    tokio::time::advance(Duration::from_secs(9)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.puts().len(), 2, "the write goes out once the gate opens");
    assert_eq!(h.capacity("pool-a"), 5);
    assert!(h.metrics.throttle_wait_seconds_total.get() >= 30.0);
}

#[tokio::test(start_paused = true)]
async fn a_new_scale_up_refused_for_an_empty_bucket_asks_again_a_scan_and_at_most_a_second_after_retry_after(
) {
    let h = pool_a_wanting_5().await;
    throttle_next_put(&h, 5);
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 1);
    // Retry-After 5 s plus the scan interval (10 s) for a scale-up that has not waited yet, then
    // a random part of up to a second; a pass less than a second before it lets the write wait
    // for it.
    tokio::time::advance(Duration::from_millis(13_900)).await;
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 1, "scale-ups that waited longer go first");
    tokio::time::advance(Duration::from_millis(1_200)).await;
    h.reconciler.run_once().await.unwrap();
    let puts = h.puts();
    assert_eq!(puts.len(), 2);
    let after = puts[1].at - puts[0].at;
    assert!(
        after >= Duration::from_secs(15) && after < Duration::from_millis(16_100),
        "{after:?}"
    );
    assert_eq!(h.capacity("pool-a"), 5);
}

#[tokio::test(start_paused = true)]
async fn the_scale_ups_of_one_controller_each_ask_again_at_their_own_turn_woken_for_each() {
    let h = both_pools_throttled_once(3, 6).await;
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::join!(h.reconciler.run(cancel.clone()), async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        cancel.cancel();
    });
    let puts = h.puts();
    let statuses: Vec<u16> = puts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200, 200], "{puts:?}");
    // Both asked again after Retry-After and a scan, each at its own place in the next second:
    // the pass woken for the first let the second through, or woke again for it, well before
    // the next scan.
    for put in &puts[2..] {
        let again = put.at - puts[0].at;
        assert!(
            again >= Duration::from_secs(15) && again < Duration::from_millis(16_100),
            "{again:?}"
        );
    }
    assert_eq!((h.capacity("pool-a"), h.capacity("pool-b")), (5, 6));
}

/// Issue 42 item 4: turns of one controller's scale-ups less than the pass's lead apart. The
/// pass woken for the first holds the second (its turn is more than the lead away when that pass
/// plans); the second is then woken at its own turn, not left to the next scan.
#[tokio::test(start_paused = true)]
async fn a_scale_up_held_by_the_pass_woken_for_an_earlier_turn_is_woken_at_its_own() {
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;
    use vmss_capacity_controller::reconciler::{Reconciler, RetryTurn, Throttled};
    /// Turns `Retry-After` plus these extras, in the order the scale-ups are refused.
    struct Extras(Mutex<Vec<Duration>>);
    impl RetryTurn for Extras {
        fn turn(&self, t: &Throttled) -> Instant {
            t.now + t.retry_after + self.0.lock().unwrap().remove(0)
        }
    }
    let h = both_pools_throttled_once(3, 6).await;
    let extras = Extras(Mutex::new(vec![
        Duration::from_millis(100),
        Duration::from_millis(600),
    ]));
    let reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .retry_turn(Arc::new(extras))
        .build();
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::join!(reconciler.run(cancel.clone()), async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        cancel.cancel();
    });
    let puts = h.puts();
    let statuses: Vec<u16> = puts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200, 200], "{puts:?}");
    let again: Vec<Duration> = puts[2..].iter().map(|p| p.at - puts[0].at).collect();
    assert!(
        again[0] >= Duration::from_millis(5_100) && again[0] < Duration::from_millis(5_300),
        "the first at its turn: {again:?}"
    );
    assert!(
        again[1] >= Duration::from_millis(5_600) && again[1] < Duration::from_millis(5_900),
        "the second at its own turn, not at the next scan (10 s later): {again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn only_a_scale_up_waits_its_turn_a_lowered_capacity_goes_when_the_gate_opens() {
    let h = both_pools_throttled_once(5, 3).await;
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 2, "both refused");
    tokio::time::advance(Duration::from_millis(4_900)).await;
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.puts().len(), 2, "nothing before Retry-After");
    assert!(
        h.counter(
            &h.metrics.arm_requests_total,
            &[("operation", "put_capacity"), ("code", "gated")]
        ) >= 1,
        "the lowered capacity was held by the gate"
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    let _ = h.reconciler.run_once().await;
    assert_eq!(
        h.capacity("pool-b"),
        3,
        "the gate is open for the lowered capacity"
    );
    assert_eq!(h.capacity("pool-a"), 3, "the new scale-up waits its turn");
    assert_eq!(h.puts().len(), 3);
    tokio::time::advance(Duration::from_secs(10)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity("pool-a"), 5);
    assert_eq!(h.puts().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_that_has_waited_asks_again_as_soon_as_its_gate_opens_not_at_the_next_scan() {
    use vmss_capacity_controller::reconciler::AGE_HORIZON;
    let h = pool_a_wanting_5().await;
    let horizon = AGE_HORIZON.as_secs();
    throttle_next_put(&h, horizon);
    throttle_next_put(&h, 3);
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::join!(h.reconciler.run(cancel.clone()), async {
        tokio::time::sleep(AGE_HORIZON + Duration::from_secs(60)).await;
        cancel.cancel();
    });
    let puts = h.puts();
    let statuses: Vec<u16> = puts.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200], "{puts:?}");
    let second = puts[1].at - puts[0].at;
    assert!(
        second >= Duration::from_secs(horizon + 10),
        "a new scale-up waits Retry-After (the horizon) and a scan (10 s): {second:?}"
    );
    let third = puts[2].at - puts[1].at;
    assert!(
        third >= Duration::from_secs(3) && third < Duration::from_secs(4),
        "older than the horizon, it asks when the 3 s gate opens, woken for it, not at the next scan: {third:?}"
    );
    assert_eq!(h.capacity("pool-a"), 5);
}

#[tokio::test(start_paused = true)]
async fn a_throttled_read_holds_reads_back_but_not_writes() {
    let h = Harness::new(
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(5))],
        |s| s.vmss_cache_ttl = Duration::from_secs(1),
    )
    .await;
    h.state.inject_fault(fault(
        "GET",
        "virtualMachineScaleSets",
        status(429, "TooManyRequests", Some(20)),
        Some(1),
    ));
    assert!(
        h.reconciler.run_once().await.is_err(),
        "the LIST was throttled"
    );
    let lists = |h: &Harness| h.requests("GET", "/virtualMachineScaleSets").len();
    assert_eq!(lists(&h), 1);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(h.reconciler.run_once().await.is_err());
    assert_eq!(lists(&h), 1, "no LIST while the read gate is closed");
    tokio::time::advance(Duration::from_secs(11)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(lists(&h), 2);
    assert_eq!(h.capacity("pool-a"), 5);
}

#[tokio::test(start_paused = true)]
async fn a_throttled_refresh_after_the_first_plans_on_the_cached_view_and_still_writes() {
    let mut h = Harness::new(&[("pool-a", 3)], vec![group("pool-a", 0, 10, None)], |s| {
        s.vmss_cache_ttl = Duration::from_secs(1)
    })
    .await;
    let knob = std::sync::Arc::new(KnobDemand::default());
    knob.set("pool-a", 3);
    h.reconciler = vmss_capacity_controller::reconciler::Reconciler::builder(
        h.settings.clone(),
        h.arm.clone(),
        h.metrics.clone(),
    )
    .demand(knob.clone())
    .build();
    h.reconciler.run_once().await.unwrap();
    h.state.inject_fault(fault(
        "GET",
        "virtualMachineScaleSets",
        status(429, "TooManyRequests", Some(120)),
        None,
    ));
    let lists = |h: &Harness| h.requests("GET", "/virtualMachineScaleSets").len();
    tokio::time::advance(Duration::from_secs(10)).await;
    // Demand rises while the LIST is throttled: the pass writes from the cached view (its
    // ETag guards the write) instead of failing.
    knob.set("pool-a", 6);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(lists(&h), 2, "the throttled LIST");
    assert_eq!(h.capacity("pool-a"), 6);
    assert_eq!(h.puts().last().map(|p| p.status), Some(200));
    // The LIST is not asked again until its gate opens.
    tokio::time::advance(Duration::from_secs(10)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(lists(&h), 2);
}

#[tokio::test]
async fn a_quota_409_marks_the_offering_unavailable_and_holds_its_writes_while_the_others_go_on() {
    let h = Harness::new(
        &[("pool-a", 1), ("pool-b", 1)],
        vec![
            group("pool-a", 0, 10, Some(5)),
            group("pool-b", 0, 10, Some(4)),
        ],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        "PUT",
        "pool-a",
        status(409, "OperationNotAllowed", None),
        None,
    ));
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.capacity("pool-b"), 4, "the other group is written");
    assert_eq!(
        h.counter(
            &h.metrics.capacity_writes_total,
            &[("scale_set", "pool-a"), ("result", "quota")]
        ),
        1
    );
    let puts_a = |h: &Harness| {
        h.puts()
            .iter()
            .filter(|p| p.path.contains("pool-a"))
            .count()
    };
    for _ in 0..3 {
        let _ = h.reconciler.run_once().await;
    }
    assert_eq!(puts_a(&h), 1, "no further writes while the offering is out");
    assert_eq!(
        h.counter(
            &h.metrics.writes_held_total,
            &[("scale_set", "pool-a"), ("reason", "offering_unavailable")]
        ),
        3
    );
    assert_eq!(
        h.counter(
            &h.metrics.failed_scale_ups_total,
            &[("scale_set", "pool-a"), ("reason", "quota")]
        ),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn server_errors_back_the_group_off_exponentially_then_recover() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(5))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        "PUT",
        "pool-a",
        status(503, "ServiceUnavailable", None),
        Some(3),
    ));
    let mut sent = Vec::new();
    for _ in 0..40 {
        let _ = h.reconciler.run_once().await;
        sent.push(h.puts().len());
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    assert_eq!(h.capacity("pool-a"), 5, "recovered once ARM answered again");
    // 3 failures then success: 4 PUTs in 20 s of passes every 0.5 s (40 passes), not 40.
    assert_eq!(h.puts().len(), 4);
    let first_retry = sent.iter().position(|&n| n >= 2).unwrap();
    let second_retry = sent.iter().position(|&n| n >= 3).unwrap();
    assert!(
        second_retry - first_retry > first_retry,
        "the second wait is longer than the first: {sent:?}"
    );
}

#[tokio::test]
async fn the_metrics_endpoint_exports_every_documented_name() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(2))],
        |_| {},
    )
    .await;
    h.reconciler.run_once().await.unwrap();
    // A foreign write seen by the next LIST, then a 412 on the correcting write: every
    // labelled family has at least one child.
    h.state
        .rival_set_capacity(SUB, RG, "pool-a", 4, "rival")
        .unwrap();
    h.reconciler.node_groups().scale_sets().invalidate_all();
    h.state.inject_fault(fault(
        "PUT",
        "pool-a",
        status(412, "PreconditionFailed", None),
        Some(1),
    ));
    h.reconciler.run_once().await.unwrap();
    let reconciler = std::sync::Arc::new(h.reconciler);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(vmss_capacity_controller::http::serve(
        "127.0.0.1:0".parse().unwrap(),
        h.metrics.clone(),
        reconciler.clone(),
        Default::default(),
        stop.clone(),
        tx,
    ));
    let addr = rx.await.unwrap();
    let client = reqwest::Client::new();
    let body = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "vmss_capacity_reconcile_total",
        "vmss_capacity_reconcile_duration_seconds_bucket",
        "vmss_capacity_arm_requests_total",
        "vmss_capacity_arm_request_duration_seconds_bucket",
        "vmss_capacity_capacity_writes_total",
        "vmss_capacity_scale_set_capacity",
        "vmss_capacity_scale_set_desired_capacity",
        "vmss_capacity_scale_set_min_size",
        "vmss_capacity_scale_set_max_size",
        "vmss_capacity_cache_age_seconds",
        "vmss_capacity_arm_ratelimit_remaining",
        "vmss_capacity_arm_budget_remaining",
        "vmss_capacity_throttle_wait_seconds_total",
        "vmss_capacity_last_successful_reconcile_timestamp_seconds",
        "vmss_capacity_cache_invalidations_total",
        "vmss_capacity_etag_conflicts_total",
        "vmss_capacity_foreign_writes_total",
        "vmss_capacity_build_info",
    ] {
        assert!(
            body.lines().any(|l| l.starts_with(name)),
            "{name} missing from /metrics:\n{body}"
        );
    }
    assert!(
        body.contains(
            "vmss_capacity_etag_conflicts_total{outcome=\"retried_ok\",scale_set=\"pool-a\"} 1"
        ),
        "{body}"
    );
    assert!(body.contains("vmss_capacity_scale_set_capacity{scale_set=\"pool-a\"} 2"));
    let health = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    stop.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_steady_state_makes_one_list_per_cache_ttl_and_no_per_scale_set_gets() {
    let names: Vec<String> = (0..20).map(|i| format!("ss-{i:02}")).collect();
    let seeds: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 3)).collect();
    let groups = names.iter().map(|n| group(n, 0, 10, Some(3))).collect();
    let h = Harness::new(&seeds, groups, |_| {}).await; // scanInterval 10 s, vmssCacheTTL 60 s
                                                        // A LIST takes 100 ms, as on real ARM; passes start exactly every 10 s.
    h.state.inject_fault(fault(
        "GET",
        "virtualMachineScaleSets",
        FaultKind::Latency {
            ms: 100,
            max_ms: None,
        },
        None,
    ));
    for _ in 0..60 {
        let started = tokio::time::Instant::now();
        let _ = h.reconciler.run_once().await;
        tokio::time::advance(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    }
    let lists = h.requests("GET", "/virtualMachineScaleSets").len();
    assert_eq!(lists, 10, "one LIST per 60 s TTL over ten minutes");
    let gets = h
        .state
        .request_log()
        .iter()
        .filter(|r| {
            r.method == "GET"
                && r.path
                    .split('?')
                    .next()
                    .unwrap_or("")
                    .contains("/virtualMachineScaleSets/ss-")
                && !r.path.contains("/virtualMachines")
        })
        .count();
    assert_eq!(gets, 0, "no per-scale-set GET in the steady state");
    assert!(h.puts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_budget_azure_reports_is_exported_by_scope_and_policy() {
    use vmss_capacity_controller::emulator::{EmulatorBuilder, ThrottleLimits};
    // Compute's update bucket of the subscription in the region: 2 tokens.
    let limits = ThrottleLimits {
        sub_write_per_min: 6.0,
        sub_write_burst: 2,
        ..ThrottleLimits::azure_compute()
    };
    let h = Harness::with_emulator(
        EmulatorBuilder::new().throttling(limits),
        &[("pool-a", 3), ("pool-b", 3)],
        vec![
            group("pool-a", 0, 10, Some(4)),
            group("pool-b", 0, 10, Some(4)),
        ],
        |_| {},
    )
    .await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity("pool-a"), 4);
    assert_eq!(h.capacity("pool-b"), 4);
    let remaining = |scope: &str, policy: &str| {
        h.metrics
            .arm_budget_remaining
            .with_label_values(&[scope, policy])
            .get()
    };
    assert_eq!(
        remaining("Microsoft.Compute", "UpdateVMScaleSet3Min"),
        0,
        "two writes spent the region's bucket"
    );
    assert_eq!(
        remaining("subscription", "writes"),
        i64::from(limits.arm_write_burst) - 2,
        "ARM's bucket, two writes spent"
    );
    assert!(remaining("subscription", "reads") > 0);
    assert_eq!(
        h.metrics
            .arm_budget_fraction
            .with_label_values(&["writes"])
            .get(),
        0.0,
        "the emptiest write bucket is Compute's"
    );
}

#[tokio::test(start_paused = true)]
async fn a_region_whose_compute_budget_runs_low_holds_deletions_there_and_not_in_another_region() {
    use vmss_capacity_controller::azure::arm::Precondition;
    use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed, ThrottleLimits};
    use vmss_capacity_controller::hold::HoldReason;
    // Compute's updates of the subscription in each region: 10, refilled slowly.
    let limits = ThrottleLimits {
        sub_write_per_min: 0.1,
        sub_write_burst: 10,
        ..ThrottleLimits::azure_compute()
    };
    let groups = vec![
        group("pool-a", 0, 10, Some(4)),
        group("pool-b", 0, 10, Some(6)),
    ];
    let h = Harness::with_emulator(
        EmulatorBuilder::new().throttling(limits),
        &[("pool-a", 3), ("busy", 1)],
        groups.clone(),
        |_| {},
    )
    .await;
    let mut north = ScaleSetSeed::new(SUB, RG, "pool-b", 6);
    north.location = "northeurope".into();
    h.state.seed_scale_set(north);
    // Another cluster of the subscription spends 9 of westeurope's 10 updates.
    let other = arm_client(
        &h.emulator,
        &h.state,
        "other-cluster",
        std::sync::Arc::new(vmss_capacity_controller::metrics::Metrics::new()),
    );
    for capacity in 2..=10 {
        let busy = other.get_scale_set("busy").await.unwrap().unwrap();
        let etag = busy.etag.clone().unwrap();
        other
            .put_capacity(&busy, capacity, &Precondition::IfMatch(etag))
            .await
            .unwrap();
    }
    // A scale-up is urgent: it goes, and its answer shows westeurope's bucket spent.
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity("pool-a"), 4);
    assert_eq!(
        h.metrics
            .arm_budget_remaining
            .with_label_values(&["Microsoft.Compute", "UpdateVMScaleSet3Min"])
            .get(),
        0
    );
    // Deleting an unneeded node in westeurope waits for its region's bucket; in northeurope,
    // whose bucket nobody spent, it goes.
    assert_eq!(
        h.reconciler.delete_hold(&groups[0]),
        Some(HoldReason::ArmBudgetReserve)
    );
    assert_eq!(h.reconciler.delete_hold(&groups[1]), None);
    // Once the count is old, one deletion goes to look at the bucket again (its answer shows it
    // as it is): the count does not hold deletions for ever. One: no second node is drained
    // for a delete that would be held.
    tokio::time::advance(vmss_capacity_controller::azure::budget::BUDGET_MEMORY).await;
    assert_eq!(h.reconciler.delete_hold(&groups[0]), None);
    assert_eq!(
        h.reconciler.delete_hold(&groups[0]),
        Some(HoldReason::ArmBudgetReserve)
    );
}

#[tokio::test(start_paused = true)]
async fn instance_lists_are_refreshed_less_often_while_the_reads_budget_is_below_the_reserve() {
    let h = Harness::new(
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(3))],
        |_| {},
    )
    .await;
    let instance_lists = || h.requests("GET", "/pool-a/virtualMachines").len();
    // Another cluster of the subscription has spent Compute's LISTs in westeurope down to 5 %
    // of what this process has seen the bucket hold: refreshes stretch 3.25 times.
    let policy = "Microsoft.Compute/HighCostGetVMScaleSet3Min";
    h.arm.budget().observe_in(Some("westeurope"), policy, 100);
    h.arm.budget().observe_in(Some("westeurope"), policy, 5);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(instance_lists(), 1);
    // The emulator's answers have since shown the bucket full again, but the list taken while
    // it was low lives 3.25 times instanceCacheTTL (300 s): 975 s, not 300.
    tokio::time::advance(Duration::from_secs(301)).await;
    h.reconciler.run_once().await.unwrap();
    tokio::time::advance(Duration::from_secs(600)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(instance_lists(), 1, "not listed again before 975 s");
    tokio::time::advance(Duration::from_secs(75)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(instance_lists(), 2);
    // Listed with the budget full, the list lives instanceCacheTTL.
    tokio::time::advance(Duration::from_secs(301)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(instance_lists(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_probe_kept_for_a_scale_down_delete_is_not_taken_by_a_lowering_of_the_same_group() {
    use vmss_capacity_controller::azure::budget::BUDGET_MEMORY;
    use vmss_capacity_controller::emulator::sim::nodes::node_name;
    use vmss_capacity_controller::hold::HoldReason;
    use vmss_capacity_controller::reconciler::{DeleteEnd, DeleteKind, NoLastLook};
    use vmss_capacity_controller::resource::Victim;
    // A schedule lowers pool-a from 4 to 3 while scale-down finds one of its nodes unneeded.
    let h = Harness::new(
        &[("pool-a", 4)],
        vec![group("pool-a", 0, 10, Some(3))],
        |_| {},
    )
    .await;
    let g = h.settings.node_groups[0].clone();
    // Other clusters of the subscription have spent Compute's updates in westeurope to 5 %.
    let policy = "Microsoft.Compute/UpdateVMScaleSet3Min";
    h.arm.budget().observe_in(Some("westeurope"), policy, 100);
    h.arm.budget().observe_in(Some("westeurope"), policy, 5);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(
        h.capacity("pool-a"),
        4,
        "the lowering waits below the reserve"
    );
    // Five minutes on, the count is old: scale-down's look before it drains the node is granted
    // the probe that looks at the bucket again, kept for this group's delete.
    tokio::time::advance(BUDGET_MEMORY).await;
    assert_eq!(h.reconciler.delete_hold(&g), None);
    // The schedule's lowering asks next: it does not take the delete's probe.
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity("pool-a"), 4, "the lowering still waits");
    assert_eq!(
        h.reconciler.status()[0].held.as_deref(),
        Some(HoldReason::ArmBudgetReserve.metric_label())
    );
    // The drained node's delete goes with the probe kept for it.
    let victim = Victim {
        instance_id: "0".into(),
        node_name: node_name("pool-a", 0),
    };
    assert_eq!(
        h.reconciler
            .delete_instance(&g, victim, DeleteKind::Unneeded, &NoLastLook)
            .await,
        DeleteEnd::Deleted
    );
    assert_eq!(h.capacity("pool-a"), 3);
}

#[tokio::test(start_paused = true)]
async fn a_probe_granted_for_a_removal_that_aborts_is_given_back() {
    use vmss_capacity_controller::azure::budget::BUDGET_MEMORY;
    use vmss_capacity_controller::emulator::sim::nodes::node_name;
    use vmss_capacity_controller::hold::HoldReason;
    use vmss_capacity_controller::reconciler::{DeleteEnd, DeleteKind, LastLook};
    use vmss_capacity_controller::resource::Victim;
    struct PodLanded;
    #[async_trait::async_trait]
    impl LastLook for PodLanded {
        async fn check(&self) -> Result<(), String> {
            Err("pod default/web landed on the node".into())
        }
    }
    let h = Harness::new(&[("pool-a", 4)], vec![group("pool-a", 0, 10, None)], |_| {}).await;
    let g = h.settings.node_groups[0].clone();
    let policy = "Microsoft.Compute/UpdateVMScaleSet3Min";
    h.arm.budget().observe_in(Some("westeurope"), policy, 100);
    h.arm.budget().observe_in(Some("westeurope"), policy, 5);
    h.reconciler.run_once().await.unwrap();
    tokio::time::advance(BUDGET_MEMORY).await;
    // Scale-down's look before a drain is granted the probe; the removal then aborts (the
    // re-check after the taint found a pod): given back, the next removal may go at once.
    assert_eq!(h.reconciler.delete_hold(&g), None);
    assert_eq!(
        h.reconciler.delete_hold(&g),
        Some(HoldReason::ArmBudgetReserve),
        "one probe at a time"
    );
    h.reconciler.give_back_probe(&g);
    assert_eq!(h.reconciler.delete_hold(&g), None, "the probe came back");
    // A delete that took the probe and was stopped by its last look gives it back too.
    let victim = Victim {
        instance_id: "0".into(),
        node_name: node_name("pool-a", 0),
    };
    assert!(matches!(
        h.reconciler
            .delete_instance(&g, victim, DeleteKind::Unneeded, &PodLanded)
            .await,
        DeleteEnd::Stopped(_)
    ));
    assert_eq!(
        h.reconciler.delete_hold(&g),
        None,
        "the stopped delete's probe came back"
    );
    assert_eq!(h.capacity("pool-a"), 4);
}

#[tokio::test(start_paused = true)]
async fn a_victim_that_fails_its_last_look_is_dropped_and_the_others_go_in_one_request() {
    use vmss_capacity_controller::emulator::sim::nodes::node_name;
    use vmss_capacity_controller::reconciler::{DeleteEnd, DeleteKind, LastLook};
    use vmss_capacity_controller::resource::Victim;
    /// A look whose node `busy` has a pod on it.
    struct OneBusy(String);
    #[async_trait::async_trait]
    impl LastLook for OneBusy {
        async fn check(&self) -> Result<(), String> {
            Err(format!("{}: pod default/web is on the node", self.0))
        }
        async fn check_each(&self, victims: &[Victim]) -> Vec<Result<(), String>> {
            victims
                .iter()
                .map(|v| match v.node_name == self.0 {
                    true => Err("pod default/web is on the node".into()),
                    false => Ok(()),
                })
                .collect()
        }
    }
    let h = Harness::new(&[("pool-a", 4)], vec![group("pool-a", 0, 10, None)], |_| {}).await;
    let g = h.settings.node_groups[0].clone();
    let victim = |id: u64| Victim {
        instance_id: id.to_string(),
        node_name: node_name("pool-a", id),
    };
    let end = h
        .reconciler
        .delete_each(
            &g,
            vec![victim(0), victim(1), victim(2)],
            DeleteKind::Unneeded,
            &OneBusy(node_name("pool-a", 1)),
        )
        .await;
    assert_eq!(end.end, DeleteEnd::Deleted);
    assert_eq!(end.dropped.len(), 1);
    assert_eq!(end.dropped[0].0, "1");
    let deletions = h.state.instance_deletions();
    assert_eq!(deletions.len(), 1, "one request");
    assert_eq!(
        deletions[0].machines,
        vec![node_name("pool-a", 0), node_name("pool-a", 2)]
    );
    assert_eq!(h.capacity("pool-a"), 2);
}
