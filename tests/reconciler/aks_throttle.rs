//! AKS's own throttling (issue 42, item 3): AKS's resource provider refills each agent pool's
//! write bucket at one a minute (burst 20), a quarter of the scale sets' 4 a minute. The default
//! write budget of an agent pool stays inside it, and one write carries the latest count.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::config::{WriteBudget, DEFAULT_AGENT_POOL_WRITE_BUDGET};
use vmss_capacity_controller::emulator::{AksLimits, EmulatorBuilder, FaultKind};
use vmss_capacity_controller::reconciler::Reconciler;

/// The demand's last value in [`burst_of_scale_ups`].
const FINAL: i64 = 4 + 35;

/// Agent pool `pool-a` (3 nodes) of [`CLUSTER`] on an emulator enforcing AKS's documented limits,
/// written with `budget`; its demand is a knob.
async fn pool_under_aks_limits(budget: WriteBudget) -> (Harness, Arc<KnobDemand>) {
    let mut h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new().aks_throttling(AksLimits::aks()),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 100, None)],
        |s| s.agent_pool_write_budget = budget,
    )
    .await;
    let knob = Arc::new(KnobDemand::default());
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    (h, knob)
}

/// A pass every 10 s for 10 minutes; for the first 6 the demand grows by one node at every pass
/// (4, 5, ... [`FINAL`]), then stays.
async fn burst_of_scale_ups(h: &Harness, knob: &KnobDemand) {
    for i in 0..60 {
        if i < 36 {
            knob.set("pool-a", 4 + i);
        }
        // A pass whose write AKS throttled reports it; the next pass goes on.
        let _ = h.reconciler.run_once().await;
        tokio::time::advance(Duration::from_secs(10)).await;
    }
}

/// The requests AKS's resource provider refused with its own 429 (`Throttled`).
fn aks_throttled(h: &Harness) -> Vec<String> {
    h.state
        .request_log()
        .into_iter()
        .filter(|r| r.status == 429)
        .filter(|r| {
            r.error
                .as_ref()
                .is_some_and(|(code, _)| code == "Throttled")
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_scale_ups_on_one_pool_converges_to_the_final_count_without_a_429_from_aks() {
    assert_eq!(
        DEFAULT_AGENT_POOL_WRITE_BUDGET,
        WriteBudget {
            per_minute: 0.5,
            burst: 10
        }
    );
    let (h, knob) = pool_under_aks_limits(DEFAULT_AGENT_POOL_WRITE_BUDGET).await;
    burst_of_scale_ups(&h, &knob).await;
    assert_eq!(aks_throttled(&h), Vec::<String>::new());
    assert_eq!(h.capacity_now("pool-a").await, FINAL);
    let puts = h.our_puts();
    assert!(
        puts.len() <= 15,
        "at most the budget's 10 plus one every 2 minutes: {}",
        puts.len()
    );
    assert_eq!(
        puts.last().and_then(|p| p.body_capacity),
        Some(FINAL),
        "the last write carried the latest count"
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_burst_with_the_scale_sets_budget_of_4_a_minute_meets_aks_429s() {
    let (h, knob) = pool_under_aks_limits(WriteBudget {
        per_minute: 4.0,
        burst: 12,
    })
    .await;
    burst_of_scale_ups(&h, &knob).await;
    let throttled = aks_throttled(&h);
    assert!(!throttled.is_empty(), "4 a minute outruns AKS's 1 a minute");
    assert!(
        throttled
            .iter()
            .all(|r| r.starts_with("PUT ") && r.contains("/agentPools/pool-a")),
        "{throttled:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_that_waited_for_a_write_slot_carries_the_demand_as_it_is_when_sent_not_as_planned()
{
    let mut h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        &[("pool-a", 3), ("pool-b", 3)],
        vec![group("pool-a", 0, 10, None), group("pool-b", 0, 10, None)],
        |s| s.max_concurrent_writes = 1,
    )
    .await;
    let knob = Arc::new(KnobDemand::default());
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    h.reconciler.run_once().await.expect("first pass reads");
    // The first pool write takes 5 s; the other waits for the one write slot meanwhile.
    h.state.inject_fault(fault(
        Some("PUT"),
        Some("/agentPools/"),
        FaultKind::Latency {
            ms: 5_000,
            max_ms: None,
        },
        Some(1),
    ));
    knob.set("pool-a", 4);
    knob.set("pool-b", 4);
    let ((), pass) = tokio::join!(
        async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            // The demand moves while the first write is on its way.
            knob.set("pool-a", 7);
            knob.set("pool-b", 7);
        },
        h.reconciler.run_once()
    );
    pass.expect("pass");
    let puts: Vec<Option<i64>> = h.our_puts().iter().map(|p| p.body_capacity).collect();
    assert_eq!(
        puts,
        vec![Some(4), Some(7)],
        "the write that waited sent the latest count"
    );
}
