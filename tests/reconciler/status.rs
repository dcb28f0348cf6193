//! The per-node-group status snapshot (`Reconciler::status`), what the leader writes to the
//! status ConfigMap: after a write it shows the write and its result, after a 412 how the 412
//! ended, and the foreign write that caused it.

use crate::support;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use support::*;
use vmss_capacity_controller::config::NodeGroupSpec;
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::notify::{ControllerEvent, EventSink, GroupStatus};
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

/// Keeps every event.
#[derive(Default)]
struct Captured(Mutex<Vec<ControllerEvent>>);

impl EventSink for Captured {
    fn record(&self, event: ControllerEvent) {
        self.0.lock().push(event);
    }
}

async fn harness(kind: Kind) -> (Harness, Arc<Captured>, Arc<Knob>) {
    let mut h = Harness::with_kind(
        kind,
        EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 1, 10, Some(6))],
        |_| {},
    )
    .await;
    let events = Arc::new(Captured::default());
    let knob = Arc::new(Knob(AtomicI64::new(6)));
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .events(events.clone())
        .demand(knob.clone())
        .build();
    (h, events, knob)
}

fn pool_a(h: &Harness) -> GroupStatus {
    let status = h.reconciler.status();
    assert_eq!(status.len(), 1);
    status[0].clone()
}

for_each_kind! {
#[tokio::test]
async fn before_any_pass_the_snapshot_shows_the_bounds_and_nothing_else(kind: Kind) {
    let (h, _, _) = harness(kind).await;
    let s = pool_a(&h);
    assert_eq!((s.name.as_str(), s.min_size, s.max_size), ("pool-a", 1, 10));
    assert_eq!(s.kind, h.settings.node_groups[0].kind.as_str());
    assert_eq!((s.target, s.capacity, s.last_write.clone(), s.last_conflict.clone()), (None, None, None, None));
}
}

for_each_kind! {
#[tokio::test]
async fn after_a_write_the_snapshot_shows_the_write_its_result_and_the_adopted_etag(kind: Kind) {
    let (h, _, _) = harness(kind).await;
    h.reconciler.run_once().await.expect("pass");
    let s = pool_a(&h);
    let w = s.last_write.clone().expect("a write recorded");
    assert_eq!((w.from, w.to, w.result.as_str()), (Some(3), 6, "ok"));
    assert!(w.at.ends_with('Z'), "RFC 3339 in UTC: {}", w.at);
    assert_eq!((s.target, s.capacity), (Some(6), Some(6)));
    assert_eq!(s.etag.as_deref(), Some(h.etag_now("pool-a").await.as_str()));
    assert_eq!((s.foreign_writes, s.held.clone(), s.last_conflict.clone()), (0, None, None));
    assert_eq!((s.backoff_until.clone(), s.unavailable.clone()), (None, None));
}
}

for_each_kind! {
#[tokio::test]
async fn after_a_412_the_snapshot_shows_how_it_ended_and_the_foreign_write(kind: Kind) {
    let (h, events, knob) = harness(kind).await;
    h.reconciler.run_once().await.expect("first pass writes 6");
    // Another writer moves the capacity: our cached ETag is stale, the next write gets 412.
    h.rival_write("pool-a", Some(4), None, "rival").await;
    knob.0.store(7, Ordering::SeqCst);
    h.reconciler.run_once().await.expect("second pass");
    let s = pool_a(&h);
    let c = s.last_conflict.clone().expect("a 412 recorded");
    assert_eq!(c.outcome, "retried_ok");
    assert_eq!(s.foreign_writes, 1);
    let w = s.last_write.clone().expect("the retry recorded");
    assert_eq!((w.from, w.to, w.result.as_str()), (Some(4), 7, "ok"));
    assert_eq!((s.target, s.capacity), (Some(7), Some(7)));
    let seen = events.0.lock().clone();
    assert!(seen.iter().any(|e| matches!(e, ControllerEvent::Conflict { outcome: "retried_ok", .. })));
    assert!(seen.iter().any(|e| matches!(e, ControllerEvent::ForeignWrite { .. })));
}
}

#[tokio::test]
async fn a_held_write_says_why_in_the_snapshot_and_a_pass_without_a_write_clears_it() {
    let mut h = Harness::new(
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .dry_run(true)
        .build();
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(pool_a(&h).held.as_deref(), Some("dry_run"));
    assert_eq!(pool_a(&h).last_write, None, "nothing was sent");
    // The plan is satisfied by somebody else: nothing to write, nothing held.
    h.rival_write("pool-a", Some(6), None, "rival").await;
    h.reconciler.node_groups().scale_sets().invalidate_all();
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(pool_a(&h).held, None);
}
