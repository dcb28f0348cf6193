//! `demo --pods` end to end, in process and in real time: the simulated cluster, one controller
//! with `demand: pods`, the rival writer. The report proves what the demo prints.

use std::time::Duration;
use vmss_capacity_controller::cli::DemoArgs;
use vmss_capacity_controller::demo;

fn args(no_etag: bool) -> DemoArgs {
    DemoArgs {
        duration: Duration::from_secs(24),
        no_etag,
        scale_sets: 3,
        rival_interval: Duration::from_millis(700),
        seed: 7,
        quiet: true,
        aks: false,
        kubernetes: false,
        pods: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_burst_is_scheduled_on_nodes_the_controller_asked_for_and_no_update_is_lost() {
    let r = demo::pods::run(&args(false)).await.expect("the demo runs");
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
}
