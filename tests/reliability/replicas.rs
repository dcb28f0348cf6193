//! Three controller replicas with the same config and distinct identities, driven concurrently
//! against one emulator while a rival keeps writing: they converge to the plan, nothing is lost,
//! nothing is written beyond max.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::reconciler::Reconciler;

const NAMES: [&str; 3] = ["pool-a", "pool-b", "pool-c"];

#[tokio::test(start_paused = true)]
async fn three_replicas_and_a_rival_converge_to_the_plan_without_losing_an_update() {
    let h = Harness::new(
        &[("pool-a", 1), ("pool-b", 9), ("pool-c", 4)],
        vec![
            group("pool-a", 1, 6, Some(5)),
            group("pool-b", 0, 4, Some(2)),
            group("pool-c", 2, 8, Some(7)),
        ],
        // Every pass re-lists, so each replica sees the others' writes as foreign and races them.
        |s| s.vmss_cache_ttl = Duration::from_secs(1),
    )
    .await;
    let (r2, m2) = h.replica("writer-2");
    let (r3, m3) = h.replica("writer-3");
    let replicas: [(&str, &Reconciler, &Arc<Metrics>); 3] = [
        ("controller", &h.reconciler, &h.metrics),
        ("writer-2", &r2, &m2),
        ("writer-3", &r3, &m3),
    ];
    for round in 0..12u32 {
        // The rival changes one scale set's capacity (out of bounds on purpose) and tags.
        let name = NAMES[round as usize % 3];
        let _ = h
            .state
            .rival_set_capacity(SUB, RG, name, i64::from(round % 11), "rival");
        let _ = h.state.rival_set_tags(
            SUB,
            RG,
            name,
            BTreeMap::from([("round".to_string(), round.to_string())]),
            "rival",
        );
        let _ = tokio::join!(h.reconciler.run_once(), r2.run_once(), r3.run_once());
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    // Rival stops: two quiet rounds.
    for _ in 0..2 {
        let _ = tokio::join!(h.reconciler.run_once(), r2.run_once(), r3.run_once());
        tokio::time::advance(Duration::from_secs(2)).await;
    }

    assert_eq!(h.capacity("pool-a"), 5);
    assert_eq!(h.capacity("pool-b"), 2);
    assert_eq!(h.capacity("pool-c"), 7);
    let lost = h.state.lost_updates();
    assert!(lost.is_empty(), "lost updates: {lost:#?}");
    let bounds = [("pool-a", 1, 6), ("pool-b", 0, 4), ("pool-c", 2, 8)];
    let log = h.state.request_log();
    let mut conflicts_total = 0;
    for (writer, _, metrics) in replicas {
        let puts = capacity_puts_by(&log, writer);
        for p in &puts {
            let name = scale_set_of(&p.path).unwrap();
            let (_, min, max) = bounds.iter().find(|b| b.0 == name).unwrap();
            let c = p.body_capacity.unwrap();
            assert!((*min..=*max).contains(&c), "{writer} wrote {c} to {name}");
            assert!(p.if_match.is_some(), "{writer} wrote blind: {p:?}");
        }
        let ok = Metrics::counter_sum(&metrics.capacity_writes_total, &[("result", "ok")]);
        let conflicts = Metrics::counter_sum(
            &metrics.capacity_writes_total,
            &[("result", "precondition_failed")],
        );
        conflicts_total += conflicts;
        println!(
            "{writer}: {} PUTs sent, {ok} written, {conflicts} answered 412",
            puts.len()
        );
    }
    assert!(
        conflicts_total > 0,
        "the replicas never raced each other: the test proves nothing"
    );
}
