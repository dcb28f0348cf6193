//! Azure's capacity as it really is, end to end on the emulator: the vCPU quota read from the
//! compute usages caps a scale-up and the pods it leaves over go to the next group in the same
//! decision; an allocation Azure refuses (on the write's answer or at the operation's end) marks
//! the offering unavailable and the pods move to another group at once, never after
//! `maxNodeProvisionTime`, with no retry storm on the refused group.

mod support;

use support::pod_cluster::Cluster;

use serde_json::json;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::emulator::arm::faults::{FaultKind, FaultSpec};

const LOCATION: &str = "westeurope";

/// Two groups of 4-vCPU sizes in two families: pods of 1 cpu and 1 GiB waste least on the
/// DSv5 group, so the expander (least-waste) grows it first.
async fn two_families() -> Cluster {
    Cluster::start(
        &[
            ("dsv5", "Standard_D4s_v5", 0, &[]),
            ("esv5", "Standard_E4s_v5", 0, &[]),
        ],
        20,
    )
    .await
}

/// Makes the controller read the region's usages again now (as after a quota refusal) and
/// waits until it has.
async fn reread_quota(c: &Cluster, family: &str, want: i64) {
    let groups = c.reconciler.node_groups();
    groups.quota().invalidate(LOCATION);
    c.reconciler.wake();
    assert!(
        eventually(Duration::from_secs(10), || groups
            .quota()
            .get(LOCATION)
            .and_then(|u| u.remaining(family))
            == Some(want))
        .await,
        "the usages were not read again"
    );
}

fn writes_refused(c: &Cluster, group: &str, reason: &str) -> u64 {
    c.metrics
        .capacity_writes_total
        .with_label_values(&[group, reason])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_caps_a_scale_up_and_the_pods_it_leaves_over_go_to_the_next_group_in_the_same_decision(
) {
    let c = two_families().await;
    // Two D4s_v5 nodes' worth of DSv5 vCPUs.
    c.state.set_quota(SUB, LOCATION, "standardDSv5Family", 8);
    reread_quota(&c, "standardDSv5Family", 8).await;
    // 30 pods of 1 cpu: 10 nodes of 3 allocatable cpus. Without the cap the controller would
    // ask DSv5 for 10 and get a 409 for all of them (cluster-autoscaler #2607).
    for i in 0..30 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("dsv5") == 2
            && c.capacity("esv5") == 8)
        .await,
        "dsv5 {} esv5 {}",
        c.capacity("dsv5"),
        c.capacity("esv5")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        (c.capacity_puts("dsv5"), c.capacity_puts("esv5")),
        (1, 1),
        "one write per group: the plan fitted the quota, nothing was refused"
    );
    assert_eq!(writes_refused(&c, "dsv5", "quota"), 0);
    assert_eq!(
        c.metrics
            .quota_remaining_vcpus
            .with_label_values(&[LOCATION, "standardDSv5Family"])
            .get(),
        8,
        "as read before the scale-up"
    );
    let triggered = c.events("TriggeredScaleUp").await;
    assert!(
        triggered
            .iter()
            .any(|e| e.note.as_deref().unwrap_or_default().contains(
                "dsv5 0->2 (max: 20, capped at +2 by quota: standardDSv5Family in westeurope had 8 vCPUs left)"
            )),
        "the Event says what quota capped: {:?}",
        triggered.iter().map(|e| e.note.clone()).collect::<Vec<_>>()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_without_quota_left_is_passed_over_and_says_so() {
    let c = two_families().await;
    c.state.set_quota(SUB, LOCATION, "standardDSv5Family", 0);
    reread_quota(&c, "standardDSv5Family", 0).await;
    c.state.set_quota(SUB, LOCATION, "standardESv5Family", 0);
    reread_quota(&c, "standardESv5Family", 0).await;
    c.pending("web", "1", "1Gi", json!({}));
    assert!(
        eventually(Duration::from_secs(10), || c
            .metrics
            .pods_unfit
            .with_label_values(&["dsv5", "quota"])
            .get()
            == 1
            && c.metrics
                .pods_unfit
                .with_label_values(&["esv5", "quota"])
                .get()
                == 1)
        .await,
        "both groups report quota"
    );
    assert_eq!((c.capacity_puts("dsv5"), c.capacity_puts("esv5")), (0, 0));
    c.stop().await;
}

/// A fault on the next `count` capacity PUTs to `scale_set`.
fn put_fault(scale_set: &str, kind: FaultKind, count: u32) -> FaultSpec {
    FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some(format!("virtualMachineScaleSets/{scale_set}")),
        kind,
        count: Some(count),
        probability: None,
        seed: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_azure_says_is_not_available_is_passed_over_at_once_and_its_pods_get_nodes_elsewhere(
) {
    let c = two_families().await;
    c.state.inject_fault(put_fault(
        "dsv5",
        FaultKind::Status {
            code: 409,
            code_name: Some("SkuNotAvailable".into()),
            retry_after_secs: None,
        },
        10,
    ));
    for i in 0..3 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    // The scan interval is 30 s and maxNodeProvisionTime 15 min: only the refusal moves them.
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("esv5") == 1).await,
        "dsv5 {} esv5 {}",
        c.capacity("dsv5"),
        c.capacity("esv5")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.capacity("dsv5"), 0);
    assert_eq!(
        c.capacity_puts("dsv5"),
        1,
        "one refused write, no retry storm on the refused size"
    );
    assert_eq!(writes_refused(&c, "dsv5", "sku_not_available"), 1);
    let out = c
        .reconciler
        .node_groups()
        .unavailable("dsv5")
        .expect("marked");
    assert!(
        out.left > Duration::from_secs(22 * 3600),
        "SkuNotAvailable stays out for 23 h: {:?}",
        out.left
    );
    assert_eq!(
        c.metrics
            .failed_scale_ups_total
            .with_label_values(&["dsv5", "sku_not_available"])
            .get(),
        1
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_failure_at_the_operations_end_marks_the_offering_and_the_pods_move_on() {
    let c = Cluster::start_with(
        &[
            ("dsv5", "Standard_D4s_v5", 0, &[]),
            ("esv5", "Standard_E4s_v5", 0, &[]),
        ],
        20,
        |s| {
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
        },
    )
    .await;
    c.state.inject_fault(put_fault(
        "dsv5",
        FaultKind::LroFailed {
            code: Some("ZonalAllocationFailed".into()),
        },
        1,
    ));
    for i in 0..3 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    assert!(
        eventually(Duration::from_secs(15), || c.capacity("esv5") == 1).await,
        "dsv5 {} esv5 {}",
        c.capacity("dsv5"),
        c.capacity("esv5")
    );
    let out = c
        .reconciler
        .node_groups()
        .unavailable("dsv5")
        .expect("marked");
    assert_eq!(out.failure.label(), "allocation_failed");
    assert!(
        out.message.contains("sufficient capacity"),
        "{}",
        out.message
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.capacity_puts("dsv5"), 1, "never written again while out");
    c.stop().await;
}
