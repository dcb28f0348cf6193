//! Conflict recovery: the design's "re-plan now" against cluster-autoscaler's two behaviours,
//! side by side in one run, on tokio's paused clock (virtual time; every ARM call costs a
//! simulated latency, `BENCH_ARM_LATENCY_MS`, default 100 ms).
//!
//! Scenario A, single conflict: the controller holds capacity 3; a rival writes 5 and at the same
//! moment demand rises to 6, `lead` before a pass. The pass writes 6 with its cached, now stale
//! ETag → 412. Measured: virtual time from the rival write (and from the 412) until the server
//! holds 6, and the ARM calls spent meanwhile.
//!
//! Scenario B, sustained contention: a rival writes the scale set (a tag, so its ETag moves)
//! about once a second (seeded jitter) for N minutes while demand alternates 6/7 every 30 s, so
//! the controller has a write to make every 30 s and every cached ETag is stale; when the rival
//! stops, demand moves to 8. Measured per strategy: time at plan, time to reach 8 after the
//! rival stops, back-off, ARM calls and PUTs.
//!
//! `BENCH_QUICK=1 cargo bench --bench conflict_recovery` for the CI-sized run.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use common::{arm_latency_ms, latency_fault, quick, verdict, Calls, Knob};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{group, Harness, RG, SUB};
use tokio::time::Instant;
use vmss_capacity_controller::config::{
    ConflictStrategy, DEFAULT_CONFLICT_BACKOFF, DEFAULT_MAX_CONCURRENT_WRITES,
    DEFAULT_SCAN_INTERVAL, DEFAULT_VMSS_CACHE_TTL, DEFAULT_WRITE_BUDGET,
};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::reconciler::Reconciler;

const NAME: &str = "pool-a";
const SCAN: Duration = DEFAULT_SCAN_INTERVAL;

fn strategies() -> [(&'static str, ConflictStrategy); 3] {
    [
        ("Replan (design)", ConflictStrategy::Replan),
        ("NextLoop (seed PR)", ConflictStrategy::NextLoop),
        (
            "RetryOnceThenBackoff (CA)",
            ConflictStrategy::RetryOnceThenBackoff {
                backoff: DEFAULT_CONFLICT_BACKOFF,
            },
        ),
    ]
}

/// Emulator with `pool-a` at `capacity`, ARM latency, production scan/TTL/budget defaults, and a
/// reconciler whose demand is the returned knob (set to `capacity`).
async fn setup(strategy: ConflictStrategy, capacity: i64, latency_ms: u64) -> (Harness, Arc<Knob>) {
    let mut h = Harness::new(&[(NAME, capacity)], vec![group(NAME, 0, 20, None)], |s| {
        s.conflict_strategy = strategy;
        s.scan_interval = SCAN;
        s.vmss_cache_ttl = DEFAULT_VMSS_CACHE_TTL;
        s.write_budget = DEFAULT_WRITE_BUDGET;
        s.max_concurrent_writes = DEFAULT_MAX_CONCURRENT_WRITES;
    })
    .await;
    if latency_ms > 0 {
        h.state.inject_fault(latency_fault(latency_ms));
    }
    let knob = Knob::new(capacity);
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    (h, knob)
}

fn capacity(h: &Harness) -> i64 {
    h.state.scale_set(SUB, RG, NAME).expect("exists").capacity
}

fn precondition_failed(m: &Metrics) -> u64 {
    Metrics::counter_sum(
        &m.capacity_writes_total,
        &[("scale_set", NAME), ("result", "precondition_failed")],
    )
}

struct AResult {
    from_rival: Duration,
    from_412: Option<Duration>,
    calls: Calls,
    passes_after_rival: u32,
}

/// Scenario A for one strategy and one rival lead.
async fn scenario_a(strategy: ConflictStrategy, lead: Duration, latency_ms: u64) -> AResult {
    let (h, knob) = setup(strategy, 3, latency_ms).await;
    let h = Arc::new(h);
    let t0 = Instant::now();
    h.reconciler.run_once().await.expect("first pass");
    // The LIST at t0 is the cached state until t0 + 60 s; the conflict pass is at t0 + 40 s.
    let conflict_pass = t0 + SCAN * 4;
    let rival_at = conflict_pass - lead;
    let mut next = t0 + SCAN;
    while next <= rival_at {
        tokio::time::sleep_until(next).await;
        let _ = h.reconciler.run_once().await;
        next += SCAN;
    }
    tokio::time::sleep_until(rival_at).await;
    let seq0 = h.state.request_log().len();
    h.state
        .rival_set_capacity(SUB, RG, NAME, 5, "rival")
        .expect("rival write");
    knob.set(6);
    let rival_time = Instant::now();

    // Monitor: 1 ms virtual resolution.
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let h = h.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut first_412 = None;
            loop {
                if first_412.is_none() && precondition_failed(&h.metrics) > 0 {
                    first_412 = Some(Instant::now());
                }
                if capacity(&h) == 6 {
                    let log = h.state.request_log();
                    done.store(true, Ordering::SeqCst);
                    return (Instant::now(), first_412, log);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let mut passes = 0;
    while !done.load(Ordering::SeqCst) && passes < 40 {
        tokio::time::sleep_until(next).await;
        if done.load(Ordering::SeqCst) {
            break;
        }
        let _ = h.reconciler.run_once().await;
        passes += 1;
        next += SCAN;
    }
    let (at, first_412, log) = monitor.await.expect("monitor");
    AResult {
        from_rival: at - rival_time,
        from_412: first_412.map(|f| at.saturating_duration_since(f)),
        calls: Calls::of(&log[seq0..]),
        passes_after_rival: passes,
    }
}

struct BResult {
    at_plan_during: f64,
    converge_after_stop: Option<Duration>,
    backoffs: Vec<(Duration, Duration)>,
    backed_off_at_stop: Option<Duration>,
    held_backoff: u64,
    held_budget: u64,
    refused_retries: u64,
    calls: Calls,
    put_412: u64,
    lost_updates: usize,
}

/// Scenario B for one strategy.
async fn scenario_b(
    strategy: ConflictStrategy,
    contention: Duration,
    after: Duration,
    latency_ms: u64,
    seed: u64,
) -> BResult {
    const PLAN: i64 = 6;
    const FINAL: i64 = 8;
    let (h, knob) = setup(strategy, PLAN, latency_ms).await;
    knob.set(PLAN);
    let h = Arc::new(h);
    let t0 = Instant::now();
    let start = t0 + Duration::from_secs(5);
    let stop = start + contention;
    let end = stop + after;

    // Rival: writes the scale set (a tag) roughly once a second (0.5..1.5 s apart, seeded), so
    // every cached ETag goes stale within a second and a fresh one survives ~1 s.
    let rival = {
        let h = h.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut at = start;
            let mut k = 0u64;
            while at < stop {
                tokio::time::sleep_until(at).await;
                k += 1;
                let tags =
                    std::collections::BTreeMap::from([("rival-seq".to_string(), k.to_string())]);
                h.state
                    .rival_set_tags(SUB, RG, NAME, tags, "rival")
                    .expect("rival write");
                at += Duration::from_secs_f64(rng.gen_range(0.5..1.5));
            }
        })
    };
    // Demand: alternates 6/7 every 30 s during contention, then 8 from the moment the rival stops.
    let demand = {
        let knob = knob.clone();
        tokio::spawn(async move {
            let mut at = start;
            let mut v = PLAN;
            while at < stop {
                tokio::time::sleep_until(at).await;
                v = if v == PLAN { PLAN + 1 } else { PLAN };
                knob.set(v);
                at += Duration::from_secs(30);
            }
            tokio::time::sleep_until(stop).await;
            knob.set(FINAL);
        })
    };
    // Monitor: 10 ms samples of "server at plan".
    let at_plan_ticks = Arc::new(AtomicU64::new(0));
    let ticks = Arc::new(AtomicU64::new(0));
    let monitor = {
        let h = h.clone();
        let knob = knob.clone();
        let (at_plan_ticks, ticks) = (at_plan_ticks.clone(), ticks.clone());
        tokio::spawn(async move {
            let mut last_off_plan = stop;
            let mut now = Instant::now();
            while now < end {
                let ok = capacity(&h) == knob.get();
                if now >= start && now < stop {
                    ticks.fetch_add(1, Ordering::Relaxed);
                    if ok {
                        at_plan_ticks.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if now >= stop && !ok {
                    last_off_plan = now;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                now = Instant::now();
            }
            last_off_plan
        })
    };
    // Controller: passes every scan interval ±10 % (seeded, like `run`'s jitter).
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut backoffs = Vec::new();
    let mut refused = 0;
    let mut next = t0;
    while next < end {
        tokio::time::sleep_until(next).await;
        let before = precondition_failed(&h.metrics);
        let _ = h.reconciler.run_once().await;
        let delta = precondition_failed(&h.metrics) - before;
        if delta >= 2 {
            refused += 1;
            if let ConflictStrategy::RetryOnceThenBackoff { backoff } = strategy {
                let from = Instant::now() - t0;
                backoffs.push((from, from + backoff));
            }
        }
        next = Instant::now() + SCAN.mul_f64(1.0 + 0.1 * (rng.gen::<f64>() * 2.0 - 1.0));
    }
    rival.await.expect("rival");
    demand.await.expect("demand");
    let last_off = monitor.await.expect("monitor");
    let log = h.state.request_log();
    let stop_rel = stop - t0;
    let backed_off_at_stop = backoffs
        .iter()
        .filter(|(a, b)| *a <= stop_rel && *b > stop_rel)
        .map(|(_, b)| *b - stop_rel)
        .max();
    let converged = capacity(&h) == FINAL;
    let held = |reason: &str| {
        Metrics::counter_sum(
            &h.metrics.writes_held_total,
            &[("scale_set", NAME), ("reason", reason)],
        )
    };
    BResult {
        at_plan_during: at_plan_ticks.load(Ordering::Relaxed) as f64
            / ticks.load(Ordering::Relaxed).max(1) as f64,
        converge_after_stop: converged.then(|| last_off - stop + Duration::from_millis(10)),
        backoffs,
        backed_off_at_stop,
        held_backoff: held("backoff"),
        held_budget: held("budget"),
        refused_retries: refused,
        put_412: Calls::status(&log, "PUT", 412),
        calls: Calls::of(&log),
        lost_updates: h.state.lost_updates().len(),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let quick = quick();
    let lat = arm_latency_ms();
    println!(
        "== conflict_recovery ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    println!(
        "virtual time (tokio paused clock); scan interval {} s, vmssCacheTTL {} s, write budget {}/min burst {}, \
         simulated ARM latency {lat} ms per call (BENCH_ARM_LATENCY_MS)",
        SCAN.as_secs(),
        DEFAULT_VMSS_CACHE_TTL.as_secs(),
        DEFAULT_WRITE_BUDGET.per_minute,
        DEFAULT_WRITE_BUDGET.burst
    );

    // ---- Scenario A ----
    println!(
        "\n-- Scenario A: single conflict (rival write + demand change `lead` before a pass) --"
    );
    let leads = [0.1, 1.0, 5.0];
    let mut ratio_at_min_lead = 0.0;
    let mut ratio_from_412 = 0.0;
    for lead in leads {
        let lead = Duration::from_secs_f64(lead);
        println!("lead {}:", secs(lead));
        let mut results = Vec::new();
        for (label, strategy) in strategies() {
            let r = scenario_a(strategy, lead, lat).await;
            println!(
                "  {label:<27} rival→committed {:>9}  412→committed {:>9}  passes {}  ARM calls {}",
                secs(r.from_rival),
                r.from_412.map(secs).unwrap_or_else(|| "-".into()),
                r.passes_after_rival,
                r.calls
            );
            results.push(r);
        }
        let ratio = results[1].from_rival.as_secs_f64() / results[0].from_rival.as_secs_f64();
        let ratio412 = match (results[1].from_412, results[0].from_412) {
            (Some(n), Some(r)) => n.as_secs_f64() / r.as_secs_f64().max(1e-9),
            _ => f64::NAN,
        };
        println!(
            "  ratio NextLoop/Replan: rival→committed {ratio:.1}x, 412→committed {ratio412:.1}x  (goal >= 20x): {} / {}",
            verdict(ratio >= 20.0),
            verdict(ratio412 >= 20.0)
        );
        println!(
            "  ratio RetryOnceThenBackoff/Replan rival→committed {:.2}x",
            results[2].from_rival.as_secs_f64() / results[0].from_rival.as_secs_f64()
        );
        if lead == Duration::from_secs_f64(leads[0]) {
            ratio_at_min_lead = ratio;
            ratio_from_412 = ratio412;
        }
    }
    // A rival landing at a uniformly random moment of the scan interval.
    let n = if quick { 4 } else { 20 };
    let mut sum = [0.0f64; 3];
    for i in 0..n {
        let lead = SCAN.mul_f64((i as f64 + 0.5) / n as f64);
        for (j, (_, s)) in strategies().into_iter().enumerate() {
            sum[j] += scenario_a(s, lead, lat).await.from_rival.as_secs_f64();
        }
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
    println!(
        "rival at a uniformly random moment of the scan interval ({n} leads): mean rival→committed \
         Replan {:.3} s, NextLoop {:.3} s, RetryOnceThenBackoff {:.3} s; NextLoop/Replan {:.2}x",
        mean[0],
        mean[1],
        mean[2],
        mean[1] / mean[0]
    );

    // ---- Scenario B ----
    let contention = Duration::from_secs(if quick { 60 } else { 600 });
    let after = Duration::from_secs(360);
    let seed = std::env::var("BENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42);
    println!(
        "\n-- Scenario B: sustained contention (rival writes every ~1 s for {} min while demand alternates 6/7 every 30 s; at the rival's stop demand goes to 8; then {} min observed; seed {seed}) --",
        contention.as_secs() / 60,
        after.as_secs() / 60
    );
    let mut bres = Vec::new();
    for (label, strategy) in strategies() {
        let r = scenario_b(strategy, contention, after, lat, seed).await;
        println!("  {label}:");
        println!(
            "    time at plan during contention {:.1} %; converged after rival stopped: {}",
            r.at_plan_during * 100.0,
            r.converge_after_stop
                .map(secs)
                .unwrap_or_else(|| "NOT within the window".into())
        );
        let total_backoff: Duration = r.backoffs.iter().map(|(a, b)| *b - *a).sum();
        println!(
            "    retries refused {}; back-offs {} (nominal total {}); backed off when the rival stopped: {}; passes held by back-off {}, by write budget {}",
            r.refused_retries,
            r.backoffs.len(),
            secs(total_backoff),
            r.backed_off_at_stop
                .map(|d| format!("yes, {} left", secs(d)))
                .unwrap_or_else(|| "no".into()),
            r.held_backoff,
            r.held_budget
        );
        println!(
            "    ARM calls {}; PUTs {} of which 412 {}; lost updates {}",
            r.calls,
            r.calls.get("PUT"),
            r.put_412,
            r.lost_updates
        );
        bres.push(r);
    }

    // The same scenario across seeds: how often the back-off baseline is caught backed off.
    let seeds: Vec<u64> = if quick {
        vec![1, 2]
    } else {
        (1..=20).collect()
    };
    let mut caught = 0;
    let mut goal_met = 0;
    let mut conv: [Vec<f64>; 3] = [vec![], vec![], vec![]];
    let mut refused_ca = 0;
    for &sd in &seeds {
        let mut rs = Vec::new();
        for (_, strategy) in strategies() {
            rs.push(scenario_b(strategy, contention, after, lat, sd).await);
        }
        for (j, r) in rs.iter().enumerate() {
            conv[j].push(
                r.converge_after_stop
                    .map_or(f64::INFINITY, |d| d.as_secs_f64()),
            );
        }
        refused_ca += rs[2].refused_retries;
        if let Some(left) = rs[2].backed_off_at_stop {
            caught += 1;
            if rs[0].converge_after_stop.is_some_and(|c| c < left) {
                goal_met += 1;
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let maxv = |v: &Vec<f64>| v.iter().copied().fold(0.0, f64::max);
    let (m0, m1, m2) = (
        median(&mut conv[0]),
        median(&mut conv[1]),
        median(&mut conv[2]),
    );
    println!(
        "\n-- Scenario B over {} seeds ({}) --\n  time to reach the new demand after the rival stops: median Replan {m0:.2} s (max {:.2}), NextLoop {m1:.2} s (max {:.2}), RetryOnceThenBackoff {m2:.2} s (max {:.2})\n  RetryOnceThenBackoff: {refused_ca} refused retries in all; backed off when the rival stopped in {caught}/{} runs; in {goal_met}/{caught} of those Replan had already converged",
        seeds.len(),
        seeds.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(","),
        maxv(&conv[0]),
        maxv(&conv[1]),
        maxv(&conv[2]),
        seeds.len()
    );

    println!("\n== summary (goal beside each) ==");
    println!(
        "A single conflict, NextLoop/Replan rival→committed at lead 0.1 s: {ratio_at_min_lead:.1}x (goal >= 20x) {}",
        verdict(ratio_at_min_lead >= 20.0)
    );
    println!(
        "A single conflict, NextLoop/Replan 412→committed: {ratio_from_412:.1}x (goal >= 20x) {}",
        verdict(ratio_from_412 >= 20.0)
    );
    println!(
        "A single conflict, NextLoop/Replan for a rival at a random moment: {:.2}x (goal >= 20x) {} \
         (bounded by the rival's wait for the next pass, which no conflict strategy can shorten)",
        mean[1] / mean[0],
        verdict(mean[1] / mean[0] >= 20.0)
    );
    let replan_conv = bres[0].converge_after_stop;
    let ca_backed = bres[2].backed_off_at_stop;
    let goal_b = match (replan_conv, ca_backed) {
        (Some(c), Some(left)) => c < left,
        _ => false,
    };
    println!(
        "B sustained contention: Replan converged {} after the rival stopped; RetryOnceThenBackoff {} \
         (goal: Replan converges while the backoff baseline is still backed off) {}",
        replan_conv.map(secs).unwrap_or_else(|| "never".into()),
        match ca_backed {
            Some(left) => format!("was still backed off for {}", secs(left)),
            None => "was not backed off at that moment".into(),
        },
        verdict(goal_b)
    );
    if quick {
        println!("(QUICK mode: 1 min of contention and 2 seeds are too short for the back-off baseline to be caught; the B goal lines are only meaningful in the full run)");
    }
    println!(
        "B across {} seeds: the back-off baseline was backed off at the rival's stop in {caught} runs, Replan had converged first in {goal_met} of them (goal: all) {}",
        seeds.len(),
        verdict(caught > 0 && goal_met == caught)
    );
}
