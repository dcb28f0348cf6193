//! The ETag protocol against the emulator: cluster-autoscaler's own ETag test list (the anchor,
//! `reference/cluster-autoscaler-azure-provider.md` section 5.2), each as a behaviour here, and
//! the cases beyond it (deleted scale sets, ambiguous writes). Every test runs for both kinds of
//! node group, a VM scale set and an AKS agent pool (`<test>::vmss`, `<test>::aks_agent_pool`):
//! the protocol exists once, in the reconciler, and both kinds get all of it.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::config::{NodeGroupSpec, Settings};
use vmss_capacity_controller::emulator::{EmulatorBuilder, FaultKind, FaultSpec};
use vmss_capacity_controller::planner::{Demand, DemandSource, Reason};
use vmss_capacity_controller::reconciler::Reconciler;

/// A demand the test turns like a knob.
#[derive(Debug)]
struct Knob(AtomicI64);

impl DemandSource for Knob {
    fn demand(&self, _group: &NodeGroupSpec, _now: time::OffsetDateTime) -> (Demand, Reason) {
        (
            Demand::Exact(self.0.load(Ordering::SeqCst)),
            Reason::Desired,
        )
    }
}

/// A harness whose only group `pool-a` (capacity 3) wants what the knob says.
async fn knob_harness(kind: Kind, tweak: impl FnOnce(&mut Settings)) -> (Harness, Arc<Knob>) {
    knob_harness_with(kind, EmulatorBuilder::new(), tweak).await
}

async fn knob_harness_with(
    kind: Kind,
    builder: EmulatorBuilder,
    tweak: impl FnOnce(&mut Settings),
) -> (Harness, Arc<Knob>) {
    let mut h = Harness::with_kind(
        kind,
        builder,
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, None)],
        tweak,
    )
    .await;
    let knob = Arc::new(Knob(AtomicI64::new(3)));
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    h.reconciler
        .run_once()
        .await
        .expect("first pass reads the scale sets");
    assert!(
        h.our_puts().is_empty(),
        "capacity 3 already satisfies the plan"
    );
    (h, knob)
}

fn put_fault(kind: FaultKind, count: Option<u32>) -> FaultSpec {
    FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some("pool-a".into()),
        kind,
        count,
        probability: None,
        seed: None,
    }
}

fn status_fault(code: u16, name: &str, retry_after_secs: Option<u64>) -> FaultKind {
    FaultKind::Status {
        code,
        code_name: Some(name.into()),
        retry_after_secs,
    }
}

for_each_kind! {
#[tokio::test]
async fn with_the_flag_off_a_write_carries_no_if_match(kind: Kind) {
    let (h, knob) = knob_harness(kind, |s| s.enable_vmss_etag = false).await;
    knob.0.store(5, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let puts = h.our_puts();
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].if_match, None);
    assert_eq!(h.capacity_now("pool-a").await, 5);
}
}

for_each_kind! {
#[tokio::test]
async fn with_the_flag_on_a_write_carries_the_cached_etag_exactly(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    let listed_etag = h.etag_now("pool-a").await;
    knob.0.store(5, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let puts = h.our_puts();
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].if_match.as_deref(), Some(listed_etag.as_str()));
    assert_eq!(h.capacity_now("pool-a").await, 5);
    assert_ne!(
        h.etag_now("pool-a").await,
        listed_etag,
        "a successful write changes the ETag"
    );
    let cached = h.reconciler.node_groups().scale_sets().get("pool-a").unwrap();
    assert_eq!(
        cached.scale_set.etag.as_deref(),
        Some(h.etag_now("pool-a").await.as_str()),
        "the returned ETag is adopted"
    );
}
}

for_each_kind! {
#[tokio::test]
async fn without_a_cached_etag_the_controller_reads_first_and_writes_with_the_fresh_one(kind: Kind) {
    let builder = EmulatorBuilder::new();
    let mut h = Harness::with_kind(
        kind,
        builder,
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(5))],
        |_| {},
    )
    .await;
    // The LIST (the first GET) answers without ETags; the GET that follows has one.
    h.state.inject_fault(FaultSpec {
        method: Some("GET".into()),
        path_contains: Some(kind.path("").trim_matches('/').into()),
        kind: FaultKind::NoEtag,
        count: Some(1),
        probability: None,
        seed: None,
    });
    h.reconciler =
        Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone()).build();
    h.reconciler.run_once().await.unwrap();
    let gets = h.our_requests("GET", &kind.path("pool-a"));
    assert_eq!(gets.len(), 1, "one GET for the missing ETag");
    let puts = h.our_puts();
    assert_eq!(puts.len(), 1);
    assert!(
        puts[0].if_match.is_some(),
        "never a blind write with the flag on"
    );
    assert_eq!(h.capacity_now("pool-a").await, 5);
}
}

for_each_kind! {
#[tokio::test]
async fn without_any_etag_even_after_a_fresh_read_the_controller_does_not_write(kind: Kind) {
    let h = Harness::with_kind(kind, EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(5))],
        |_| {},
    )
    .await;
    h.state.inject_fault(FaultSpec {
        method: Some("GET".into()),
        path_contains: None,
        kind: FaultKind::NoEtag,
        count: None,
        probability: None,
        seed: None,
    });
    let _ = h.reconciler.run_once().await;
    assert!(h.our_puts().is_empty(), "no ETag, no write");
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(
        h.counter(
            &h.metrics.writes_held_total,
            &[("scale_set", "pool-a"), ("reason", "no_etag")]
        ),
        1
    );
}
}

for_each_kind! {
#[tokio::test]
async fn the_retry_after_a_412_succeeds_with_the_fresh_etag(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    let stale = h.etag_now("pool-a").await;
    let fresh = h.rival_write("pool-a", Some(5), None, "rival").await;
    knob.0.store(4, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let puts = h.our_puts();
    assert_eq!(puts.len(), 2, "the stale write and one retry");
    assert_eq!(
        (puts[0].status, puts[0].if_match.as_deref()),
        (412, Some(stale.as_str()))
    );
    assert_eq!(
        (puts[1].status, puts[1].if_match.as_deref()),
        (200, Some(fresh.as_str()))
    );
    assert_eq!(h.capacity_now("pool-a").await, 4);
    assert_eq!(
        h.counter(
            &h.metrics.etag_conflicts_total,
            &[("outcome", "retried_ok")]
        ),
        1
    );
    assert!(h.state.lost_updates().is_empty());
}
}

for_each_kind! {
#[tokio::test]
async fn a_concurrent_writer_is_reconciled_and_keeps_its_tags(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.rival_write("pool-a", Some(7), None, "terraform").await;
    h.rival_write("pool-a", None, Some(BTreeMap::from([("owner".into(), "terraform".into())])), "terraform").await;
    knob.0.store(4, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let view = h.observe("pool-a").await.unwrap();
    assert_eq!(view.capacity, 4, "the server ends at the planned capacity");
    assert_eq!(
        view.tags.get("owner").map(String::as_str),
        Some("terraform"),
        "the rival's tags are intact"
    );
    assert!(
        h.state.lost_updates().is_empty(),
        "{:?}",
        h.state.lost_updates()
    );
    assert_eq!(
        h.counter(&h.metrics.foreign_writes_total, &[("scale_set", "pool-a")]),
        1
    );
}
}

for_each_kind! {
#[tokio::test]
async fn the_final_etag_lands_on_the_refreshed_cache_entry(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.rival_write("pool-a", Some(6), None, "rival").await;
    knob.0.store(4, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let cached = h.reconciler.node_groups().scale_sets().get("pool-a").unwrap();
    assert_eq!(
        cached.scale_set.etag.as_deref(),
        Some(h.etag_now("pool-a").await.as_str())
    );
    assert_eq!(cached.scale_set.capacity, Some(4));
    assert_eq!(h.reconciler.node_groups().target_size("pool-a"), Some(4));
}
}

for_each_kind! {
#[tokio::test]
async fn the_retry_is_skipped_when_the_fresh_capacity_already_satisfies_the_plan(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.rival_write("pool-a", Some(4), None, "another-replica").await;
    knob.0.store(4, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.our_puts().len(), 1, "only the write that met the 412");
    assert_eq!(
        h.counter(&h.metrics.etag_conflicts_total, &[("outcome", "skipped")]),
        1
    );
    assert_eq!(
        h.reconciler.node_groups().target_size("pool-a"),
        Some(4),
        "a skip publishes the fresh capacity"
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_skip_publishes_the_fresh_capacity_not_the_stale_one(kind: Kind) {
    // Bounds-only group: any capacity in [0, 10] satisfies it.
    let mut h = Harness::with_kind(kind, EmulatorBuilder::new(), &[("pool-a", 3)], vec![group("pool-a", 0, 10, None)], |_| {}).await;
    let knob = Arc::new(Knob(AtomicI64::new(3)));
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    h.reconciler.run_once().await.unwrap();
    h.rival_write("pool-a", Some(9), None, "rival").await;
    knob.0.store(9, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.reconciler.node_groups().target_size("pool-a"), Some(9));
    assert_eq!(
        h.counter(&h.metrics.etag_conflicts_total, &[("outcome", "skipped")]),
        1
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_persistent_412_makes_target_size_pick_up_an_out_of_band_capacity(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.rival_write("pool-a", Some(5), None, "rival").await;
    h.state.inject_fault(put_fault(
        status_fault(412, "PreconditionFailed", None),
        None,
    ));
    knob.0.store(4, Ordering::SeqCst);
    let pass = h.reconciler.run_once().await;
    assert!(pass.is_err(), "a write that gave up fails the pass");
    assert_eq!(h.our_puts().len(), 2, "one write and exactly one retry");
    assert_eq!(
        h.counter(&h.metrics.etag_conflicts_total, &[("outcome", "gave_up")]),
        1
    );
    assert_eq!(
        h.reconciler.node_groups().target_size("pool-a"),
        Some(5),
        "TargetSize shows the out-of-band capacity"
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_412_leaves_no_optimistic_size_behind(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.state.inject_fault(put_fault(
        status_fault(412, "PreconditionFailed", None),
        None,
    ));
    knob.0.store(8, Ordering::SeqCst);
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(
        h.reconciler.node_groups().target_size("pool-a"),
        Some(3),
        "the attempted 8 was never published"
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_412_invalidates_the_instance_and_size_caches(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    assert!(
        h.reconciler.node_groups().instances().get("pool-a").is_some(),
        "the first pass listed instances"
    );
    h.rival_write("pool-a", Some(5), None, "rival").await;
    h.state.inject_fault(put_fault(
        status_fault(412, "PreconditionFailed", None),
        None,
    ));
    knob.0.store(4, Ordering::SeqCst);
    let lists_before = h.instance_lists("pool-a");
    let _ = h.reconciler.run_once().await;
    assert_eq!(
        h.instance_lists("pool-a"),
        lists_before + 1,
        "instances listed again after the invalidation"
    );
    assert_eq!(
        h.counter(
            &h.metrics.cache_invalidations_total,
            &[("cache", "instance"), ("reason", "precondition_failed")]
        ),
        2
    );
    assert_eq!(
        h.counter(
            &h.metrics.cache_invalidations_total,
            &[("cache", "size"), ("reason", "precondition_failed")]
        ),
        2
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_412_never_backs_the_node_group_off(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.rival_write("pool-a", Some(5), None, "rival").await;
    h.state.inject_fault(put_fault(
        status_fault(412, "PreconditionFailed", None),
        Some(2),
    ));
    knob.0.store(4, Ordering::SeqCst);
    let _ = h.reconciler.run_once().await;
    // The very next pass writes again: no backoff for a lost race.
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.capacity_now("pool-a").await, 4);
    assert_eq!(h.our_puts().len(), 3);
}
}

for_each_kind! {
#[tokio::test(start_paused = true)]
async fn completing_the_long_running_operation_adopts_the_final_etag(kind: Kind) {
    let (h, knob) = knob_harness_with(
        kind,
        EmulatorBuilder::new().lro_delay(Duration::from_millis(300)),
        |_| {},
    )
    .await;
    knob.0.store(6, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || h
            .reconciler
            .operations_in_flight()
            == 0)
        .await,
        "operation tracked to its end"
    );
    assert_eq!(
        h.observe("pool-a").await.unwrap()
            .provisioning_state,
        "Succeeded"
    );
    assert_eq!(
        h.counter(&h.metrics.lro_total, &[("status", "succeeded")]),
        1
    );
    let cached = h.reconciler.node_groups().scale_sets().get("pool-a").unwrap();
    assert_eq!(
        cached.scale_set.etag.as_deref(),
        Some(h.etag_now("pool-a").await.as_str())
    );
    assert_eq!(
        cached.scale_set.provisioning_state.as_deref(),
        Some("Succeeded")
    );
}
}

for_each_kind! {
#[tokio::test(start_paused = true)]
async fn a_failed_long_running_operation_invalidates_the_caches_and_forces_a_read(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.state
        .inject_fault(put_fault(FaultKind::LroFailed {
            code: None,
            zone: None,
        }, Some(1)));
    knob.0.store(6, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || h
            .reconciler
            .operations_in_flight()
            == 0)
        .await
    );
    assert_eq!(h.counter(&h.metrics.lro_total, &[("status", "failed")]), 1);
    assert_eq!(
        h.counter(
            &h.metrics.cache_invalidations_total,
            &[("cache", "size"), ("reason", "operation_failed")]
        ),
        1
    );
    let gets_before = h.our_requests("GET", &kind.path("pool-a")).len();
    knob.0.store(7, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    assert_eq!(
        h.our_requests("GET", &kind.path("pool-a")).len(),
        gets_before + 1,
        "stale entry re-read before writing"
    );
    assert_eq!(h.capacity_now("pool-a").await, 7);
}
}

for_each_kind! {
#[tokio::test]
async fn a_scale_set_deleted_between_read_and_write_is_never_recreated(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.state
        .inject_fault(put_fault(FaultKind::DeleteBeforeHandling, Some(1)));
    knob.0.store(5, Ordering::SeqCst);
    let _ = h.reconciler.run_once().await;
    assert!(
        h.observe("pool-a").await.is_none(),
        "still deleted"
    );
    assert!(h.our_puts().iter().all(|p| p.status != 201), "no re-create");
    assert_eq!(
        h.counter(&h.metrics.etag_conflicts_total, &[("outcome", "gone")]),
        1
    );
    assert!(
        h.reconciler.node_groups().scale_sets().get("pool-a").is_none(),
        "dropped from the cache"
    );
    let _ = h.reconciler.run_once().await;
    assert!(
        h.our_puts().iter().all(|p| p.status != 201),
        "and not on the next pass either"
    );
}
}

for_each_kind! {
#[tokio::test]
async fn with_the_flag_off_a_deleted_scale_set_is_recreated_by_the_blind_write(kind: Kind) {
    let (h, knob) = knob_harness(kind, |s| s.enable_vmss_etag = false).await;
    h.state
        .inject_fault(put_fault(FaultKind::DeleteBeforeHandling, Some(1)));
    knob.0.store(5, Ordering::SeqCst);
    let _ = h.reconciler.run_once().await;
    assert_eq!(
        h.our_puts()[0].status,
        201,
        "the blind PUT re-created the deleted scale set"
    );
}
}

for_each_kind! {
#[tokio::test(start_paused = true)]
async fn a_write_whose_connection_drops_after_commit_is_not_resent_blindly(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    h.state
        .inject_fault(put_fault(FaultKind::DropAfterCommit, Some(1)));
    knob.0.store(6, Ordering::SeqCst);
    assert!(
        h.reconciler.run_once().await.is_err(),
        "the outcome is unknown"
    );
    assert_eq!(
        h.capacity_now("pool-a").await,
        6,
        "the write did commit on the server"
    );
    // Let the backoff pass; the next pass reads before it writes and sees the write landed.
    let _ = h.reconciler.run_once().await;
    assert_eq!(h.our_puts().len(), 1, "backed off: no call at all right away");
    tokio::time::advance(Duration::from_millis(2500)).await;
    h.reconciler.run_once().await.unwrap();
    assert_eq!(h.our_puts().len(), 1, "never resent");
    assert_eq!(
        h.our_requests("GET", &kind.path("pool-a")).len(),
        1,
        "one read resolved the ambiguity"
    );
    assert_eq!(h.reconciler.node_groups().target_size("pool-a"), Some(6));
}
}

for_each_kind! {
#[tokio::test]
async fn a_write_answered_without_etag_keeps_the_previous_one_and_never_goes_blind(kind: Kind) {
    let (h, knob) = knob_harness(kind, |_| {}).await;
    let first = h.etag_now("pool-a").await;
    h.state.inject_fault(put_fault(FaultKind::NoEtag, Some(1)));
    knob.0.store(5, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    knob.0.store(6, Ordering::SeqCst);
    h.reconciler.run_once().await.unwrap();
    let puts = h.our_puts();
    assert_eq!(
        puts[1].if_match.as_deref(),
        Some(first.as_str()),
        "the kept (stale) ETag, never none"
    );
    assert_eq!(puts[1].status, 412);
    assert_eq!(
        h.capacity_now("pool-a").await,
        6,
        "the 412 was handled by a fresh read and one retry"
    );
    assert!(puts.iter().all(|p| p.if_match.is_some()));
}
}

for_each_kind! {
#[tokio::test]
async fn concurrent_readers_never_block_or_see_a_torn_cache_while_writers_run(kind: Kind) {
    let names: Vec<String> = (0..40).map(|i| format!("ss-{i:02}")).collect();
    let seeds: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    let groups = names.iter().map(|n| group(n, 0, 10, Some(4))).collect();
    let h = Harness::with_kind(kind, EmulatorBuilder::new(), &seeds, groups, |_| {}).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let cache = h.reconciler.node_groups().scale_sets().snapshot();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for e in cache.values() {
                        assert!(e.scale_set.capacity.is_some());
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for _ in 0..3 {
        h.reconciler.run_once().await.unwrap();
        let snap = h.reconciler.node_groups().scale_sets().snapshot();
        assert_eq!(snap.len(), 40, "every snapshot is whole");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    for n in &names {
        assert_eq!(h.capacity_now(n).await, 4);
    }
}
}
