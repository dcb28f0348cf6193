//! One `planner::plan` pass over 10,000 node groups (goal under 5 ms): a timed loop, median and
//! percentiles of many passes. Half the groups need a write, a quarter have a schedule window,
//! a few have an unknown size or a write in flight.
//! `cargo bench --bench planner`; `BENCH_QUICK=1 cargo bench --bench planner` for CI.

#[path = "common/mod.rs"]
mod common;

use common::{quick, verdict};
use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::time::Instant;
use time::macros::datetime;
use vmss_capacity_controller::config::{NodeGroupKind, NodeGroupSpec, Schedule};
use vmss_capacity_controller::planner::{plan, ConfiguredDemand};

fn groups(
    n: usize,
) -> (
    Vec<NodeGroupSpec>,
    HashMap<String, Option<i64>>,
    HashSet<String>,
) {
    let mut gs = Vec::with_capacity(n);
    let mut observed = HashMap::with_capacity(n);
    let mut in_flight = HashSet::new();
    for i in 0..n {
        let name = format!("aks-nodepool{i:05}-12345678-vmss");
        let schedules = if i % 4 == 0 {
            vec![Schedule {
                start_secs: 8 * 3600,
                end_secs: 18 * 3600,
                days: vec![0, 1, 2, 3, 4],
                desired_capacity: 20,
            }]
        } else {
            vec![]
        };
        gs.push(NodeGroupSpec {
            name: name.clone(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 1,
            max_size: 100,
            desired_capacity: Some(10),
            schedules,
            max_scale_down_step: (i % 3 == 0).then_some(5),
        });
        let current = match i % 100 {
            0 => None,
            _ if i % 2 == 0 => Some(10),
            _ => Some(3 + (i % 40) as i64),
        };
        observed.insert(name.clone(), current);
        if i % 97 == 0 {
            in_flight.insert(name);
        }
    }
    (gs, observed, in_flight)
}

fn main() {
    let quick = quick();
    let n = 10_000;
    let iters = if quick { 30 } else { 500 };
    let (gs, observed, in_flight) = groups(n);
    let now = datetime!(2026-11-23 12:00 UTC);
    // Warm up.
    let p = plan(&gs, &observed, &in_flight, &ConfiguredDemand, now);
    println!(
        "== planner ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    println!(
        "{n} node groups: {} changes, {} held per pass",
        p.changes.len(),
        p.held.len()
    );
    let mut samples: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            black_box(plan(
                black_box(&gs),
                black_box(&observed),
                &in_flight,
                &ConfiguredDemand,
                now,
            ));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let pct = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let median = pct(0.5);
    println!(
        "one plan() pass over {n} groups, {iters} passes: median {median:.3} ms, p10 {:.3} ms, p90 {:.3} ms, min {:.3} ms, max {:.3} ms",
        pct(0.1),
        pct(0.9),
        samples[0],
        samples[samples.len() - 1]
    );
    println!(
        "goal: under 5 ms: median {median:.3} ms {} ({:.1}x headroom)",
        verdict(median < 5.0),
        5.0 / median
    );
}
