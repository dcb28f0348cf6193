//! The fault matrix: one test per emulator fault not already covered by
//! `reconciler_errors.rs` (429 `Retry-After`, 409 quota, 5xx write backoff) and
//! `reconciler_etag.rs` (drop after commit, answers without ETag, a failed long-running
//! operation). Each asserts the user-visible promise, on tokio's paused clock where time matters.

use crate::support;

use std::time::Duration;
use support::*;
use vmss_capacity_controller::emulator::FaultKind;
use vmss_capacity_controller::metrics::Metrics;

const LOOP: Duration = Duration::from_secs(10);

fn reconcile_errors(m: &Metrics) -> u64 {
    Metrics::counter_sum(&m.reconcile_total, &[("result", "error")])
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_server_errors_on_the_list_fails_passes_visibly_then_recovers() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        Some("GET"),
        Some("virtualMachineScaleSets"),
        status_kind(503, "ServiceUnavailable", None),
        Some(3),
    ));
    for _ in 0..3 {
        assert!(h.reconciler.run_once().await.is_err());
        tokio::time::advance(LOOP).await;
    }
    assert_eq!(
        reconcile_errors(&h.metrics),
        3,
        "each failed pass is counted"
    );
    assert!(h.puts().is_empty(), "nothing is written from no data");
    h.reconciler.run_once().await.expect("ARM answers again");
    assert_eq!(h.capacity("pool-a"), 4);
    assert_eq!(h.puts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn arm_down_for_a_minute_recovers_within_two_loops_of_its_return() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        None,
        None,
        status_kind(503, "ServiceUnavailable", None),
        None,
    ));
    for _ in 0..6 {
        assert!(h.reconciler.run_once().await.is_err(), "ARM is down");
        tokio::time::advance(LOOP).await;
    }
    assert_eq!(h.capacity("pool-a"), 1);
    h.state.clear_faults();
    let mut loops = 0;
    while h.capacity("pool-a") != 4 && loops < 2 {
        let _ = h.reconciler.run_once().await;
        loops += 1;
        tokio::time::advance(LOOP).await;
    }
    assert_eq!(h.capacity("pool-a"), 4, "converged within two loops");
    assert_eq!(h.puts().iter().filter(|p| p.status == 200).count(), 1);
}

/// Unlike a read outage, a write outage backs the group off exponentially (2 s doubling, with
/// jitter), so after a minute of dropped writes the group waits out its last backoff (about
/// 32 s) before the first write: recovery takes up to four loops, not two. Reported as a gap
/// between the backoff policy and the "two loops" promise; this test pins the bound.
#[tokio::test(start_paused = true)]
async fn arm_dropping_every_write_for_a_minute_recovers_once_the_backoff_expires() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state
        .inject_fault(fault(Some("PUT"), None, FaultKind::DropBeforeCommit, None));
    // The LIST works (and stays cached for the TTL); every write attempt loses its connection.
    for _ in 0..6 {
        let _ = h.reconciler.run_once().await;
        tokio::time::advance(LOOP).await;
    }
    assert_eq!(
        h.capacity("pool-a"),
        1,
        "nothing committed while ARM dropped writes"
    );
    let attempts = h.puts().len();
    assert!(
        (2..=5).contains(&attempts),
        "backed off, not one blind attempt per loop: {attempts}"
    );
    h.state.clear_faults();
    let mut loops = 0;
    while h.capacity("pool-a") != 4 && loops < 6 {
        let _ = h.reconciler.run_once().await;
        loops += 1;
        tokio::time::advance(LOOP).await;
    }
    println!("converged {loops} loops after ARM's return ({attempts} attempts during the outage)");
    assert_eq!(h.capacity("pool-a"), 4);
    assert!(
        loops <= 5,
        "within the last backoff (at most 38.4 s) plus one loop: {loops}"
    );
    let ok = h.puts().iter().filter(|p| p.status == 200).count();
    assert_eq!(ok, 1, "exactly one committed write: {:?}", h.puts());
    assert!(h.state.lost_updates().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_write_dropped_before_commit_is_read_back_then_applied_exactly_once() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        Some("PUT"),
        Some("pool-a"),
        FaultKind::DropBeforeCommit,
        Some(1),
    ));
    assert!(h.reconciler.run_once().await.is_err());
    assert_eq!(h.capacity("pool-a"), 1, "the dropped write never landed");
    let gets_before = h.requests("GET", "/virtualMachineScaleSets/pool-a").len();
    for _ in 0..12 {
        tokio::time::advance(LOOP).await;
        let _ = h.reconciler.run_once().await;
        if h.capacity("pool-a") == 4 {
            break;
        }
    }
    assert_eq!(h.capacity("pool-a"), 4);
    let puts = h.puts();
    assert_eq!(puts.len(), 2, "the lost write and one more: {puts:?}");
    assert!(
        h.requests("GET", "/virtualMachineScaleSets/pool-a").len() > gets_before,
        "the outcome was read before writing again"
    );
    assert_eq!(
        puts[1].if_match, puts[0].if_match,
        "the read showed the version unchanged, so the same ETag guards the second write"
    );
}

#[tokio::test(start_paused = true)]
async fn the_token_endpoint_down_for_a_minute_fails_passes_clearly_then_recovers() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    let c = h.secret_controller("controller-app", "file-secret-value");
    h.state.set_token_endpoint_down(true);
    for _ in 0..6 {
        let err = c
            .reconciler
            .run_once()
            .await
            .expect_err("no token, no pass");
        let chain = error_chain(&err);
        assert!(
            chain.to_lowercase().contains("token") || chain.to_lowercase().contains("credential"),
            "the error says what failed: {chain}"
        );
        tokio::time::advance(LOOP).await;
    }
    let credential_errors = Metrics::counter_sum(&c.metrics.credential_errors_total, &[]);
    assert!(
        credential_errors >= 6,
        "credential errors counted: {credential_errors}"
    );
    assert!(h.puts().is_empty());
    h.state.set_token_endpoint_down(false);
    let mut loops = 0;
    while h.capacity("pool-a") != 4 && loops < 2 {
        let _ = c.reconciler.run_once().await;
        loops += 1;
        tokio::time::advance(LOOP).await;
    }
    assert_eq!(
        h.capacity("pool-a"),
        4,
        "recovered once the endpoint is back"
    );
    assert_eq!(
        h.puts()[0].writer.as_deref(),
        Some("controller-app"),
        "the write used the token from the endpoint"
    );
}

#[tokio::test]
async fn a_truncated_list_answer_is_an_error_counted_not_a_panic() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        Some("GET"),
        Some("virtualMachineScaleSets"),
        FaultKind::Truncate,
        Some(1),
    ));
    let err = h.reconciler.run_once().await.expect_err("unreadable LIST");
    assert!(error_chain(&err).contains("list"), "{}", error_chain(&err));
    assert_eq!(reconcile_errors(&h.metrics), 1);
    assert!(h.puts().is_empty(), "nothing written from unreadable data");
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity("pool-a"), 4);
}

#[tokio::test]
async fn a_truncated_get_answer_is_an_error_counted_and_no_write_follows() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |s| s.instance_cache_ttl = Duration::ZERO,
    )
    .await;
    // The LIST has no ETags, so the controller must GET before writing; that GET is cut short.
    // (No instance cache: its LIST of VMs would match the fault's path first.)
    h.state.inject_fault(fault(
        Some("GET"),
        Some("virtualMachineScaleSets"),
        FaultKind::NoEtag,
        Some(1),
    ));
    h.state.inject_fault(fault(
        Some("GET"),
        Some("virtualMachineScaleSets/pool-a"),
        FaultKind::Truncate,
        Some(1),
    ));
    assert!(h.reconciler.run_once().await.is_err());
    assert_eq!(
        Metrics::counter_sum(
            &h.metrics.capacity_writes_total,
            &[("scale_set", "pool-a"), ("result", "error")]
        ),
        1,
        "the failed read is counted against the write it blocked"
    );
    assert!(h.puts().is_empty(), "no write without a readable ETag");
}

#[tokio::test]
async fn a_truncated_put_answer_is_the_committed_write_it_is_and_is_not_resent() {
    let h = Harness::new(
        &[("pool-a", 1)],
        vec![group("pool-a", 0, 10, Some(4))],
        |_| {},
    )
    .await;
    h.state.inject_fault(fault(
        Some("PUT"),
        Some("pool-a"),
        FaultKind::Truncate,
        Some(1),
    ));
    h.reconciler.run_once().await.unwrap();
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.puts().len(), 1, "no resend");
    assert_eq!(h.capacity("pool-a"), 4);
    let cached = h
        .reconciler
        .node_groups()
        .scale_sets()
        .get("pool-a")
        .unwrap();
    assert_eq!(
        cached.scale_set.etag.as_deref(),
        Some(h.etag("pool-a").as_str()),
        "the ETag came from the header"
    );
}
