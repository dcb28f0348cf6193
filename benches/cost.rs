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
//! (`BENCH_COST_HOURS=<h>`: the first `h`); `BENCH_SEED` (default 7).

#[path = "common/mod.rs"]
mod common;

use common::{quick, verdict};
use vmss_capacity_controller::demo::cost;

fn main() {
    let quick = quick();
    let seed = std::env::var("BENCH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    println!(
        "cost: seed {seed}, {}, paused clock",
        if quick {
            "QUICK: the first hours of the 24 h trace (8, or BENCH_COST_HOURS)"
        } else {
            "full: the 24 h trace"
        }
    );
    let started = std::time::Instant::now();
    let r = match cost::run_paused(seed, quick, true) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cost: the trace did not run: {e:#}");
            std::process::exit(1);
        }
    };
    cost::print(&r);
    let ratio = r.consolidation.dollars / r.lower_bound.max(1e-9);
    let savings = 1.0 - r.consolidation.dollars / r.ca.dollars.max(1e-9);
    println!(
        "cost / lower bound: cluster-autoscaler's policy {:.2}x, consolidation {:.2}x; savings vs cluster-autoscaler's policy {:.1} % ({})",
        r.ca.dollars / r.lower_bound.max(1e-9),
        ratio,
        savings * 100.0,
        verdict(ratio <= 1.10 && savings >= 0.20)
    );
    println!(
        "real time: {:.1} s for both runs of {:.0} h",
        started.elapsed().as_secs_f64(),
        r.hours()
    );
}
