//! ARM calls the controller spends, counted from the emulator's request log and cross-checked
//! with the controller's own `arm_requests_total`.
//!
//! (a) PUTs per converged change without rivals (goal exactly 1.00);
//! (b) calls per change while a rival writes every scale set about once a second (tag writes:
//!     the ETag moves, the capacity does not, so "a change" stays well defined);
//! (c) steady-state reads for 100 scale sets with no changes: LISTs per resource group per
//!     vmssCacheTTL (goal 1.0), per-scale-set GETs (goal 0), and the instance LISTs of the instance
//!     cache (its expiry follows tokio's clock; measured again on the real clock).
//!
//! (a)-(c) run on tokio's paused clock with production defaults (10 s scan, 60 s vmssCacheTTL,
//! 4 writes/min burst 12) and a simulated ARM latency per call (`BENCH_ARM_LATENCY_MS`, 100).
//! `BENCH_QUICK=1 cargo bench --bench arm_calls` for the CI-sized run.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use common::{arm_latency_ms, arm_requests_by_op, latency_fault, quick, verdict, Calls, Knob};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::{group, Harness, RG, SUB};
use tokio::time::Instant;
use vmss_capacity_controller::config::{
    Settings, DEFAULT_INSTANCE_CACHE_TTL, DEFAULT_MAX_CONCURRENT_WRITES, DEFAULT_SCAN_INTERVAL,
    DEFAULT_VMSS_CACHE_TTL, DEFAULT_WRITE_BUDGET,
};
use vmss_capacity_controller::reconciler::Reconciler;

fn names(m: usize) -> Vec<String> {
    (0..m).map(|i| format!("ss-{i:03}")).collect()
}

fn production(s: &mut Settings) {
    s.scan_interval = DEFAULT_SCAN_INTERVAL;
    s.vmss_cache_ttl = DEFAULT_VMSS_CACHE_TTL;
    s.instance_cache_ttl = DEFAULT_INSTANCE_CACHE_TTL;
    s.write_budget = DEFAULT_WRITE_BUDGET;
    s.max_concurrent_writes = DEFAULT_MAX_CONCURRENT_WRITES;
}

async fn harness(
    names: &[String],
    capacity: i64,
    latency_ms: u64,
    tweak: impl FnOnce(&mut Settings),
) -> (Harness, Arc<Knob>) {
    let seeds: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), capacity)).collect();
    let groups = names.iter().map(|n| group(n, 0, 50, None)).collect();
    let mut h = Harness::new(&seeds, groups, |s| {
        production(s);
        tweak(s);
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

fn all_at(h: &Harness, names: &[String], capacity: i64) -> bool {
    names.iter().all(|n| h.capacity(n) == capacity)
}

/// N knob changes over M scale sets; after each, passes every scan interval until every scale set
/// holds the new value. Returns (changes, calls, PUTs answered 412, virtual time).
async fn changes(
    m: usize,
    n: usize,
    latency_ms: u64,
    rival: bool,
) -> (u64, Calls, u64, Duration, usize) {
    let names = names(m);
    let (h, knob) = harness(&names, 3, latency_ms, |_| {}).await;
    let h = Arc::new(h);
    let t0 = Instant::now();
    h.reconciler.run_once().await.expect("first pass");
    let seq0 = h.state.request_log().len();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut rivals = Vec::new();
    if rival {
        for (i, name) in names.iter().enumerate() {
            let (h, name, stop) = (h.clone(), name.clone(), stop.clone());
            rivals.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(i as u64);
                let mut k = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs_f64(rng.gen_range(0.5..1.5))).await;
                    k += 1;
                    let tags = BTreeMap::from([("rival-seq".to_string(), k.to_string())]);
                    let _ = h.state.rival_set_tags(SUB, RG, &name, tags, "rival");
                }
            }));
        }
    }
    let mut next = t0 + DEFAULT_SCAN_INTERVAL;
    let mut value = 3;
    for i in 0..n {
        value = if i % 2 == 0 {
            value + 2 + i as i64 % 3
        } else {
            value - 1
        };
        knob.set(value);
        let mut guard = 0;
        while !all_at(&h, &names, value) && guard < 200 {
            tokio::time::sleep_until(next).await;
            let _ = h.reconciler.run_once().await;
            next += DEFAULT_SCAN_INTERVAL;
            guard += 1;
        }
        assert!(all_at(&h, &names, value), "change {i} did not converge");
    }
    // Let the last writes' operation trackers finish (their poll and final GET count too).
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in rivals {
        let _ = r.await;
    }
    let log = h.state.request_log();
    let calls = Calls::of(&log[seq0..]);
    let p412 = Calls::status(&log[seq0..], "PUT", 412);
    (
        (m * n) as u64,
        calls,
        p412,
        Instant::now() - t0,
        h.state.lost_updates().len(),
    )
}

fn per(calls: &Calls, k: &str, changes: u64) -> f64 {
    calls.get(k) as f64 / changes as f64
}

fn print_changes(label: &str, r: &(u64, Calls, u64, Duration, usize)) -> f64 {
    let (ch, calls, p412, t, lost) = r;
    let ch = *ch;
    println!(
        "  {label}: {ch} converged changes in {:.0} virtual s; ARM calls {calls}",
        t.as_secs_f64()
    );
    let puts = per(calls, "PUT", ch);
    println!(
        "    per change: PUT {:.2} (412 {:.2}), GET {:.2}, LRO-POLL {:.2}, VM-LIST {:.2}, LIST {:.2}, all calls {:.2}; lost updates {lost}",
        puts,
        *p412 as f64 / ch as f64,
        per(calls, "GET", ch),
        per(calls, "LRO-POLL", ch),
        per(calls, "VM-LIST", ch),
        per(calls, "LIST", ch),
        calls.total() as f64 / ch as f64
    );
    puts
}

async fn steady(m: usize, minutes: u64, latency_ms: u64) {
    let names = names(m);
    let (h, _knob) = harness(&names, 3, latency_ms, |_| {}).await;
    let t0 = Instant::now();
    h.reconciler.run_once().await.expect("first pass");
    let first_pass = Instant::now() - t0;
    let seq0 = h.state.request_log().len();
    let first = Calls::of(&h.state.request_log());
    let ops0 = arm_requests_by_op(&h.metrics);
    let end = t0 + Duration::from_secs(60 * minutes);
    let mut next = t0 + DEFAULT_SCAN_INTERVAL;
    let mut passes = 0;
    while next <= end {
        tokio::time::sleep_until(next).await;
        h.reconciler.run_once().await.expect("pass");
        passes += 1;
        next += DEFAULT_SCAN_INTERVAL;
    }
    let log = h.state.request_log();
    let calls = Calls::of(&log[seq0..]);
    let ops1 = arm_requests_by_op(&h.metrics);
    let d = |k: &str| ops1.get(k).copied().unwrap_or(0) - ops0.get(k).copied().unwrap_or(0);
    let ttls = (60 * minutes) as f64 / DEFAULT_VMSS_CACHE_TTL.as_secs_f64();
    let lists_per_ttl = calls.get("LIST") as f64 / ttls;
    println!(
        "  first pass: {first}  (1 LIST page per 100 scale sets + one VM-LIST per scale set to fill the instance cache)"
    );
    println!(
        "  first pass took {:.1} virtual s at {latency_ms} ms/call: instance LISTs run after the pass.s writes, 4 at a time, at most 32 per pass",
        first_pass.as_secs_f64()
    );
    println!(
        "  then {passes} passes over {minutes} virtual min: emulator log {calls}; controller arm_requests_total: {}",
        ops1.iter()
            .map(|(k, v)| format!("{k} +{}", v - ops0.get(k).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  LIST requests per resource group per vmssCacheTTL: {lists_per_ttl:.2} (goal 1.0: at most one) {}; \
         list_scale_sets ops per TTL (metric) {:.2}",
        verdict((0.5..=1.0 + 1e-9).contains(&lists_per_ttl)),
        d("list_scale_sets") as f64 / ttls
    );
    if lists_per_ttl < 0.99 {
        println!(
            "  note: below 1.0 because the refresh is stamped when the LIST returns (after its latency) and only checked at \
             pass boundaries, so with a 10 s scan the effective refresh period is 70 s, not 60 s (entries up to ~80 s old)"
        );
    }
    let instance_ttls = (60 * minutes) as f64 / DEFAULT_INSTANCE_CACHE_TTL.as_secs_f64();
    println!(
        "  per-scale-set GETs: {} (goal 0) {}; PUTs {}; instance LISTs after the first pass {}: with the first pass's, {:.2} per scale set per instanceCacheTTL (expected 1.0)",
        calls.get("GET"),
        verdict(calls.get("GET") == 0 && d("get_scale_set") == 0),
        calls.get("PUT"),
        calls.get("VM-LIST"),
        (first.get("VM-LIST") + calls.get("VM-LIST")) as f64 / m as f64 / instance_ttls
    );
}

/// The instance cache's refresh rate on the real clock with a short TTL: VM LISTs per scale set
/// per instanceCacheTTL (expected 1.0).
fn instance_refresh_real_clock(m: usize, ttl: Duration, run_for: Duration) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let names = names(m);
        let (h, _knob) = harness(&names, 3, 0, |s| {
            s.instance_cache_ttl = ttl;
            s.instance_cache_jitter = Duration::ZERO;
        })
        .await;
        h.reconciler.run_once().await.expect("first pass");
        let seq0 = h.state.request_log().len();
        let start = std::time::Instant::now();
        while start.elapsed() < run_for {
            tokio::time::sleep(Duration::from_millis(100)).await;
            h.reconciler.run_once().await.expect("pass");
        }
        let calls = Calls::of(&h.state.request_log()[seq0..]);
        calls.get("VM-LIST") as f64 / m as f64 / (start.elapsed().as_secs_f64() / ttl.as_secs_f64())
    })
}

fn main() {
    let quick = quick();
    let lat = arm_latency_ms();
    println!(
        "== arm_calls ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    println!(
        "paused clock; production defaults: scan {} s, vmssCacheTTL {} s, instanceCacheTTL {} s, write budget {}/min burst {}; ARM latency {lat} ms/call",
        DEFAULT_SCAN_INTERVAL.as_secs(),
        DEFAULT_VMSS_CACHE_TTL.as_secs(),
        DEFAULT_INSTANCE_CACHE_TTL.as_secs(),
        DEFAULT_WRITE_BUDGET.per_minute,
        DEFAULT_WRITE_BUDGET.burst
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (m, n) = if quick { (5, 4) } else { (20, 20) };

    println!("\n(a) no rivals: {n} demand changes over {m} scale sets");
    let a = rt.block_on(changes(m, n, lat, false));
    let puts_a = print_changes("no rival", &a);

    println!("\n(b) a rival writes every scale set about once a second (tags), {n} changes over {m} scale sets");
    let b = rt.block_on(changes(m, n, lat, true));
    let puts_b = print_changes("rival 1/s/scale set", &b);

    let minutes = if quick { 3 } else { 10 };
    println!("\n(c) steady state, 100 scale sets, no changes, {minutes} virtual minutes");
    rt.block_on(steady(100, minutes, lat));
    drop(rt);

    let (ttl, run_for) = if quick {
        (Duration::from_millis(500), Duration::from_secs(2))
    } else {
        (Duration::from_secs(1), Duration::from_secs(6))
    };
    let vm = instance_refresh_real_clock(20, ttl, run_for);
    println!(
        "  instance cache (real clock, 20 scale sets, instanceCacheTTL {} ms, no jitter, {} s): {vm:.2} VM LISTs per scale set per instanceCacheTTL (expected 1.0)",
        ttl.as_millis(),
        run_for.as_secs()
    );
    let per_hour = 100.0 * 3600.0 / DEFAULT_INSTANCE_CACHE_TTL.as_secs_f64();
    let lists_hour = 3600.0 / DEFAULT_VMSS_CACHE_TTL.as_secs_f64();
    println!(
        "  cost at defaults for 100 scale sets: instance LISTs {per_hour:.0}/h (one per scale set per {} s, more pages above 100 VMs) vs scale-set LISTs {lists_hour:.0}/h: the instance cache is {:.0}x the scale-set read load",
        DEFAULT_INSTANCE_CACHE_TTL.as_secs(),
        per_hour / lists_hour
    );

    println!("\n== summary (goal beside each) ==");
    println!(
        "(a) PUTs per converged change without rivals: {puts_a:.2} (goal exactly 1.00) {}",
        verdict((puts_a - 1.0).abs() < 1e-9)
    );
    println!(
        "(b) with a rival writing 1/s per scale set: PUTs per change {puts_b:.2}, ARM calls per change {:.2} (no goal; the 412 + GET + retry cost)",
        b.1.total() as f64 / b.0 as f64
    );
}
