//! Pods left pending after a lost race: this design (a 412 re-plans at once; a second refusal
//! waits for the next pass, 10 s) against cluster-autoscaler's retry-once-then-backoff (a 412
//! gets one fresh GET and one retry; a second refusal surfaces and backs the node group off for
//! 5 minutes), side by side in one run, on identical seeded trials.
//!
//! Each trial is a fresh simulated cluster (one node group of D4s_v5, nodes Ready 60 s after
//! their instance appears, every ARM call costing 100 ms of simulated latency), the whole
//! `demand: pods` controller with production defaults (scan 10 s, batch 1 s / 10 s, cache TTL
//! 60 s), and a rival that re-applies tags to the scale set every 0.5-1.5 s (seeded; think a
//! Terraform loop or AKS's own reconciler), so the controller's cached ETag is always stale and
//! its write can lose the race between its fresh GET and its retry. A burst of 8 pods of 1.5 cpu
//! (4 new nodes) arrives; measured per pod: the wait from creation to Running, and whether it
//! was still pending 2 minutes later. Tokio's paused clock: virtual time, reproducible, seconds
//! of real time. `cargo bench --bench lost_race`; `--quick` for CI (fewer trials).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "common/mod.rs"]
mod common;

use common::{latency_fault, quick, verdict};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;
use support::pod_cluster::{Cluster, Groups};
use support::{RG, SUB};
use tokio::time::Instant;
use vmss_capacity_controller::config::{
    ConflictStrategy, DEFAULT_CONFLICT_BACKOFF, DEFAULT_MAX_CONCURRENT_WRITES,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_WRITE_BUDGET,
};
use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
use vmss_capacity_controller::metrics::Metrics;

const GROUP: &str = "general";
const PODS: i64 = 8;
const BOOT: Duration = Duration::from_secs(60);
const LATENCY_MS: u64 = 100;
/// A pod still pending this long after it arrived was left pending by the race.
const LEFT_PENDING_AFTER: Duration = Duration::from_secs(120);
const PATIENCE: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Default)]
struct Trial {
    /// Per pod, seconds from creation to Running (`PATIENCE` if never).
    waits: Vec<f64>,
    /// 412s the controller's writes got.
    conflicts: u64,
    /// Retries refused too (`gave_up`): cluster-autoscaler backs the group off for each.
    gave_up: u64,
}

async fn trial(strategy: ConflictStrategy, seed: u64) -> Trial {
    let sim = SimSettings {
        boot_delay: BOOT,
        tick: Duration::from_secs(1),
    };
    let seeds = [(GROUP, "Standard_D4s_v5", 1, &[][..])];
    let c = Cluster::start_simulated_groups(Groups::ScaleSets(&seeds), 50, sim, |s| {
        s.conflict_strategy = strategy;
        s.write_budget = DEFAULT_WRITE_BUDGET;
        s.max_concurrent_writes = DEFAULT_MAX_CONCURRENT_WRITES;
        s.request_timeout = DEFAULT_REQUEST_TIMEOUT;
        s.scan_interval = Duration::from_secs(10);
        s.pod_demand.batch_idle = Duration::from_secs(1);
        s.pod_demand.batch_max = Duration::from_secs(10);
        for g in &mut s.node_groups {
            g.min_size = 1;
        }
    })
    .await;
    c.state.inject_fault(latency_fault(LATENCY_MS));
    let rival = {
        let state = c.state.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            loop {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(500..=1500))).await;
                let tags =
                    BTreeMap::from([("terraform".to_string(), rng.gen::<u32>().to_string())]);
                let _ = state.rival_set_tags(SUB, RG, GROUP, tags, "rival");
            }
        })
    };
    // Let the cache go stale against the rival, and the burst land at a seeded moment.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    tokio::time::sleep(Duration::from_millis(rng.gen_range(20_000..=80_000))).await;
    c.kube
        .create_replica_set("default", "burst", PODS, &PodTemplate::new("1500m", "2Gi"))
        .expect("replica set");
    let arrived = Instant::now();
    let mut running_at: BTreeMap<String, f64> = BTreeMap::new();
    while arrived.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for p in c.kube.list_all("v1", "pods", Some("default")) {
            let running = p.pointer("/status/phase").and_then(|v| v.as_str()) == Some("Running");
            let name = p
                .pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            if running {
                running_at
                    .entry(name)
                    .or_insert(arrived.elapsed().as_secs_f64());
            }
        }
        if running_at.len() as i64 >= PODS {
            break;
        }
    }
    rival.abort();
    let mut waits: Vec<f64> = running_at.values().copied().collect();
    waits.resize(PODS as usize, PATIENCE.as_secs_f64());
    let t = Trial {
        waits,
        conflicts: c
            .state
            .request_log()
            .iter()
            .filter(|r| r.writer.as_deref() == Some("controller") && r.status == 412)
            .count() as u64,
        gave_up: Metrics::counter_sum(&c.metrics.etag_conflicts_total, &[("outcome", "gave_up")]),
    };
    c.stop().await;
    t
}

fn main() {
    let quick = quick();
    let trials: u64 = if quick { 20 } else { 200 };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    println!(
        "== lost_race ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    println!(
        "{trials} trials: a burst of {PODS} pods of 1.5 cpu (4 new D4s_v5 nodes), nodes Ready {}s after their instance, ARM latency {LATENCY_MS} ms, a rival writing the scale set every 0.5-1.5 s; paused clock (virtual time)",
        BOOT.as_secs()
    );
    let strategies = [
        ("Replan (design)", ConflictStrategy::Replan),
        (
            "RetryOnceThenBackoff (cluster-autoscaler)",
            ConflictStrategy::RetryOnceThenBackoff {
                backoff: DEFAULT_CONFLICT_BACKOFF,
            },
        ),
    ];
    let mut left = Vec::new();
    for (label, strategy) in strategies {
        let real = std::time::Instant::now();
        let mut waits = Vec::new();
        let mut conflicts = 0;
        let mut gave_up = 0;
        for seed in 0..trials {
            let t = rt.block_on(trial(strategy, seed));
            waits.extend(t.waits);
            conflicts += t.conflicts;
            gave_up += t.gave_up;
        }
        waits.sort_by(f64::total_cmp);
        let pct = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
        let pending = waits
            .iter()
            .filter(|w| **w > LEFT_PENDING_AFTER.as_secs_f64())
            .count();
        println!(
            "{label:<42} pod wait p50 {:>6.1} s, p90 {:>6.1} s, p99 {:>6.1} s, max {:>6.1} s; still pending {}s after arriving: {pending} of {} pods; 412s {conflicts}, retries refused too {gave_up}; {:.1} s real",
            pct(0.5),
            pct(0.9),
            pct(0.99),
            waits[waits.len() - 1],
            LEFT_PENDING_AFTER.as_secs(),
            waits.len(),
            real.elapsed().as_secs_f64()
        );
        left.push((pending, pct(0.99)));
    }
    let (ours, theirs) = (left[0], left[1]);
    println!(
        "goal: fewer pods left pending after a lost race than retry-once-then-backoff: {} vs {} pods, p99 wait {:.1} s vs {:.1} s: {}",
        ours.0,
        theirs.0,
        ours.1,
        theirs.1,
        verdict(ours.0 <= theirs.0 && ours.1 <= theirs.1)
    );
}
