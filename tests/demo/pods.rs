//! The default `demo` end to end, in process and in real time: the simulated cluster, one
//! controller with `demand: pods`, the rival writer, run twice on one seed (ETags on, then blind
//! writes). The reports prove what the demo prints.

use std::time::Duration;
use vmss_capacity_controller::cli::DemoArgs;
use vmss_capacity_controller::demo;

fn args() -> DemoArgs {
    DemoArgs {
        duration: Duration::from_secs(24),
        no_etag: false,
        scale_sets: 3,
        rival_interval: Duration::from_millis(700),
        seed: 7,
        quiet: true,
        plan: false,
        aks: false,
        kubernetes: false,
        pods: false,
        cost: false,
        stabilization_window: None,
        max_bulk_soft_taint_count: None,
        empty_first: None,
        consolidation_delay_after_add: None,
        disrupt_jobs: false,
        ready_after: None,
        deletion_cost_hints: None,
        report: None,
        report_defaulted: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_burst_is_scheduled_on_nodes_the_controller_asked_for_and_only_blind_writes_lose_updates(
) {
    let ab = demo::pods::compare(&args()).await.expect("the demo runs");
    let r = ab.with_etags;
    assert!(r.pods >= 49, "the workload ran: {r:?}");
    assert_eq!(r.scheduled, r.pods, "a pod was never scheduled: {r:?}");
    assert!(
        r.wait_p99 < 15.0,
        "pods waited too long (boot delay 3 s, batch 1 s): {r:?}"
    );
    assert_eq!(
        r.misplaced_on_gpu, 0,
        "a pod without the toleration on a GPU node"
    );
    assert!(
        r.nodes_at_end.get("gpu").copied().unwrap_or(0) >= 3,
        "the GPU group grew from zero for the training pods: {r:?}"
    );
    // One write per group per burst, plus re-plans after the rival's 412s: never one per pod.
    for (group, n) in &r.writes {
        assert!(
            *n <= 2 + r.conflicts,
            "{group}: {n} writes for two bursts ({} 412s): {r:?}",
            r.conflicts
        );
    }
    assert_eq!(r.pods_lost_with_nodes, 0);
    // The shrink's nodes went, through the scale-down protocol, without a budget violated.
    assert!(r.nodes_removed > 0, "scale-down removed nothing: {r:?}");
    assert_eq!(r.pdb_violations, 0);
    assert_eq!(r.lost_updates, 0, "an update was lost with ETags on");
    // The zonal part: every bind kept the spread and the disks' zones, as the audit of the
    // change stream saw them, and at its peak the spread workload ran in all three zones, level
    // within its maxSkew (before the shrink nothing took a pod away, so binds alone shaped it).
    assert!(!r.audit_incomplete, "the audit lost the stream: {r:?}");
    assert_eq!(r.placement_violations, 0, "{r:?}");
    assert!(r.max_skew_at_bind <= 1, "{r:?}");
    let peak: Vec<usize> = r.spread_per_zone.values().copied().collect();
    assert_eq!(peak.len(), 3, "{r:?}");
    assert!(
        peak.iter().max().unwrap_or(&0) - peak.iter().min().unwrap_or(&0) <= 1
            && peak.iter().sum::<usize>() >= 9,
        "{r:?}"
    );
    assert!(r.pending_at_end.is_empty(), "{:?}", r.pending_at_end);

    // The same seed without If-Match: the pods are served as well, and the rival's changes are
    // overwritten (the emulator saw writes replace versions their writer never read).
    let b = ab.blind;
    assert_eq!(
        b.scheduled, b.pods,
        "blind arm left a pod unscheduled: {b:?}"
    );
    assert!(b.rival_writes > 0, "no rival in the blind arm: {b:?}");
    assert!(
        b.lost_updates > 0,
        "blind writes lost nothing: the A/B shows nothing: {b:?}"
    );
    assert_eq!(b.conflicts, 0, "a 412 without If-Match: {b:?}");
}

#[test]
fn the_default_demo_is_the_pod_driven_etag_a_b_and_each_flag_picks_its_showcase() {
    use clap::Parser;
    use vmss_capacity_controller::cli::{Cli, Command};
    use vmss_capacity_controller::demo::Showcase;
    let showcase = |flags: &[&str]| {
        let argv = ["vmss-capacity-controller", "demo"].iter().chain(flags);
        match Cli::try_parse_from(argv).expect("the flags parse").command {
            Command::Demo(a) => a.showcase(),
            other => panic!("not the demo: {other:?}"),
        }
    };
    assert_eq!(showcase(&[]), Showcase::PodsAb);
    assert_eq!(
        showcase(&["--quiet", "--duration", "20s"]),
        Showcase::PodsAb
    );
    assert_eq!(showcase(&["--no-etag"]), Showcase::Pods);
    assert_eq!(showcase(&["--pods"]), Showcase::Pods);
    assert_eq!(showcase(&["--plan"]), Showcase::Plan);
    assert_eq!(showcase(&["--plan", "--no-etag"]), Showcase::Plan);
    assert_eq!(showcase(&["--aks"]), Showcase::Plan);
    assert_eq!(showcase(&["--kubernetes"]), Showcase::Kubernetes);
    assert_eq!(showcase(&["--kubernetes", "--aks"]), Showcase::Kubernetes);
    let refused = |flags: &[&str]| {
        let argv = ["vmss-capacity-controller", "demo"].iter().chain(flags);
        Cli::try_parse_from(argv).is_err()
    };
    assert!(
        refused(&["--pods", "--aks"]),
        "pods on AKS pools is not a showcase"
    );
    assert!(refused(&["--pods", "--plan"]));
}
