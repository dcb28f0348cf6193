//! `demo --kubernetes` end to end, in process and in real time (the emulator's ARM and
//! Kubernetes sides, two controller replicas wired as `run` wires one, a rival writer): the
//! leader stops halfway, the standby takes over, and the report proves what the demo prints.

use std::time::Duration;
use vmss_capacity_controller::cli::DemoArgs;
use vmss_capacity_controller::demo;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hand_the_lease_over_halfway_and_only_the_leader_writes_to_azure() {
    let args = DemoArgs {
        duration: Duration::from_secs(10),
        no_etag: false,
        scale_sets: 2,
        rival_interval: Duration::from_millis(700),
        seed: 7,
        quiet: true,
        plan: false,
        aks: false,
        kubernetes: true,
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
    };
    let r = demo::kubernetes(&args).await.expect("the demo runs");

    assert!(r.samples > 100, "the referee barely looked: {r:?}");
    assert_eq!(
        r.samples_with_two_leaders, 0,
        "two replicas could write at once"
    );
    let deposed = r.deposed.clone().expect("a leader was stopped halfway");
    let successor = r.successor.clone().expect("another replica took the Lease");
    assert_ne!(deposed, successor);
    let handover = r.handover.expect("the hand-over was seen on the Lease");
    assert!(
        handover < Duration::from_secs(4),
        "took {handover:?}: the release was not used (the Lease expired instead)"
    );
    assert_eq!(
        r.lease_holders.iter().flatten().collect::<Vec<_>>(),
        vec![&deposed, &successor],
        "the Lease had exactly these holders, in this order"
    );
    assert_eq!(
        r.deposed_writes_after_release, 0,
        "the deposed leader wrote to Azure after it let go of the Lease"
    );
    for name in [&deposed, &successor] {
        assert!(
            r.writes.get(name).copied().unwrap_or(0) > 0,
            "{name} never wrote while it led: {:?}",
            r.writes
        );
    }

    let status = r.status.as_deref().expect("the status ConfigMap exists");
    assert!(
        status.contains(&format!("leader: {successor}")),
        "written by the last leader: {status}"
    );
    for group in ["name: pool-a", "name: pool-b"] {
        assert!(status.contains(group), "{group} missing from: {status}");
    }

    let reasons: Vec<&str> = r.events.iter().map(|e| e.reason.as_str()).collect();
    assert!(reasons.contains(&"CapacityWritten"), "{reasons:?}");
    for name in [&deposed, &successor] {
        assert!(
            r.events.iter().any(|e| e.reason == "LeaderElection"
                && e.object == "lease/vmss-capacity-controller"
                && e.message == format!("{name} became leader")),
            "no LeaderElection Event for {name}: {:#?}",
            r.events
        );
    }

    assert_eq!(r.lost_updates, 0, "an update was lost with ETags on");
}
