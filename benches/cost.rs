//! What consolidation saves, in dollars (issue 45's goals): one seeded diurnal day on the
//! simulated cluster in paused time (web, api and cache Deployments under PodDisruptionBudgets,
//! a zone-spread workload, batch Jobs, a DaemonSet; five scale sets of three VM sizes in two
//! families, three zones, at their list prices), run twice side by side: cluster-autoscaler's
//! policy (consolidation off) and consolidation on. Prints each one's cost, the lower bound
//! (the cheapest fractional mix of the sizes covering every pod's requests, minute by minute),
//! cost / lower bound, the savings, evictions per hour, PDB violations and evicted pods'
//! replacements pending over 2 min, each with its goal. The trace is `demo --cost`'s
//! (`vmss_capacity_controller::demo::cost`), so the two never disagree.
//!
//! `cargo bench --bench cost`; `BENCH_QUICK=1` (or `-- --quick`) runs the first 8 h of the day
//! (`BENCH_COST_HOURS=<h>`: the first `h`); `BENCH_SEED` (default 7), or `BENCH_SEEDS=7,8,9` for
//! several days in turn and their mean (one day's figures move by several percent from run to
//! run: the simulated cluster's timing is not deterministic).

#[path = "common/mod.rs"]
mod common;

use common::{quick, verdict};
use vmss_capacity_controller::demo::cost;

fn main() {
    let quick = quick();
    // `BENCH_SEEDS=7,8,9`: several days side by side (the simulated cluster's timing varies
    // from run to run, so one day's figures move by several percent); `BENCH_SEED`: one.
    let seeds: Vec<u64> = match std::env::var("BENCH_SEEDS") {
        Ok(list) => match list
            .split(',')
            .map(|v| v.trim().parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(v) if !v.is_empty() => v,
            _ => {
                eprintln!("cost: BENCH_SEEDS must be seeds separated by commas, not {list:?}");
                std::process::exit(2);
            }
        },
        Err(_) => vec![std::env::var("BENCH_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(7)],
    };
    println!(
        "cost: seed(s) {seeds:?}, {}, paused clock",
        if quick {
            "QUICK: the first hours of the 24 h trace (8, or BENCH_COST_HOURS)"
        } else {
            "full: the 24 h trace"
        }
    );
    let mut summary = Vec::new();
    for seed in seeds {
        let started = std::time::Instant::now();
        let r = match cost::run_paused(seed, quick, true, cost::Dials::default()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cost: the trace of seed {seed} did not run: {e:#}");
                std::process::exit(1);
            }
        };
        cost::print(&r);
        let ratio = r.consolidation.dollars / r.lower_bound.max(1e-9);
        let savings = 1.0 - r.consolidation.dollars / r.ca.dollars.max(1e-9);
        let h = r.hours();
        // As the goal's line: none by either is 1; some against none is infinite.
        let evictions = match (r.ca.evictions, r.consolidation.evictions) {
            (0, 0) => 1.0,
            (0, _) => f64::INFINITY,
            (ca, co) => co as f64 / ca as f64,
        };
        println!(
            "cost / lower bound: cluster-autoscaler's policy {:.2}x, consolidation {:.2}x, the whole-node floor {:.2}x; savings vs cluster-autoscaler's policy {:.1} % ({})",
            r.ca.dollars / r.lower_bound.max(1e-9),
            ratio,
            r.floor / r.lower_bound.max(1e-9),
            savings * 100.0,
            verdict(ratio <= 1.10 && savings >= 0.20)
        );
        println!(
            "real time: {:.1} s for both runs of {:.0} h",
            started.elapsed().as_secs_f64(),
            h
        );
        summary.push((
            seed,
            r.ca.dollars / r.lower_bound.max(1e-9),
            ratio,
            savings,
            evictions,
        ));
    }
    if summary.len() > 1 {
        println!();
        println!("seed  cluster-autoscaler / bound  consolidation / bound  savings  evictions (consolidation / cluster-autoscaler)");
        for (seed, ca, co, sv, ev) in &summary {
            println!(
                "{seed:>4}  {ca:>26.2}x  {co:>20.2}x  {:>6.1} %  {ev:>6.2}x",
                sv * 100.0
            );
        }
        // The mean of each column over the runs where it is finite.
        let mean = |f: fn(&(u64, f64, f64, f64, f64)) -> f64| {
            let v: Vec<f64> = summary.iter().map(f).filter(|x| x.is_finite()).collect();
            v.iter().sum::<f64>() / (v.len().max(1) as f64)
        };
        println!(
            "mean  {:>26.2}x  {:>20.2}x  {:>6.1} %  {:>6.2}x (evictions: over the seeds where cluster-autoscaler's policy evicted)",
            mean(|s| s.1),
            mean(|s| s.2),
            mean(|s| s.3) * 100.0,
            mean(|s| s.4)
        );
    }
}
