//! Azure's capacity as it really is, end to end on the emulator: the vCPU quota read from the
//! compute usages caps a scale-up and the pods it leaves over go to the next group in the same
//! decision; an allocation Azure refuses (on the write's answer or at the operation's end) marks
//! the offering unavailable and the pods move to another group at once, never after
//! `maxNodeProvisionTime`, with no retry storm on the refused group.

use crate::support;

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
    let capped = |events: &[k8s_openapi::api::events::v1::Event]| {
        events.iter().any(|e| {
            e.note.as_deref().unwrap_or_default().contains(
                "dsv5 0->2 (max: 20, capped at +2 by quota: standardDSv5Family in westeurope had 8 vCPUs left)",
            )
        })
    };
    let triggered = c.events_once("TriggeredScaleUp", capped).await;
    assert!(
        capped(&triggered),
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
            zone: None,
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

/// Issue 41 item 7: `ZonalAllocationFailed` of a group spanning zones 1-3 marks only the zone
/// that ran short (the one its allocation left a `Failed` VM in), not the group: the pod it was
/// for is planned on the group again at once, and Azure places the new VM in a zone that has
/// room. Before, the whole zone set was marked and the group passed over for 5 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zonal_refusal_of_a_group_spanning_zones_marks_only_the_zone_that_ran_short() {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    let mut seed = ScaleSetSeed::new(SUB, RG, "multi", 0);
    seed.sku_name = "Standard_D4s_v5".into();
    seed.zones = vec!["1".into(), "2".into(), "3".into()];
    // The operation takes 2 s, its VMs `Creating` meanwhile, as Azure lists them.
    let c = Cluster::start_groups_with_lro_delay(
        Groups::Seeds(vec![seed]),
        5,
        Duration::from_secs(2),
        |s| {
            s.scan_interval = Duration::from_millis(300);
            s.pod_demand.batch_idle = Duration::from_millis(500);
            s.pod_demand.batch_max = Duration::from_secs(3);
        },
    )
    .await;
    // Zone 1 (where the emulator puts the first VM) has no D4s_v5 left.
    c.state.inject_fault(put_fault(
        "multi",
        FaultKind::LroFailed {
            code: Some("ZonalAllocationFailed".into()),
            zone: Some("1".into()),
        },
        1,
    ));
    // 3 cpu: a node of its own.
    c.pending("web-0", "3", "1Gi", json!({}));
    let groups = c.reconciler.node_groups();
    assert!(
        eventually(Duration::from_secs(15), || c.capacity_puts("multi") == 2).await,
        "the group was not asked again: puts {}, unavailable {:?}, marks {:?}",
        c.capacity_puts("multi"),
        groups.unavailable("multi"),
        groups.unavailable_offerings()
    );
    assert!(
        groups.unavailable("multi").is_none(),
        "the group is not out"
    );
    let marks = groups.unavailable_offerings();
    assert_eq!(marks.len(), 1, "{marks:?}");
    assert_eq!(
        marks[0].0, "standard_d4s_v5 westeurope zones 1",
        "zone 1 alone is marked: {marks:?}"
    );
    assert_eq!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &c.metrics.failed_scale_ups_total,
            &[("reason", "allocation_failed")]
        ),
        1
    );
    // The second VM went to zone 2 and is not Failed: one write, no more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.capacity_puts("multi"), 2);
    assert_eq!(c.capacity("multi"), 2);
    c.stop().await;
}

/// Issue 41: the VMs a refused allocation leaves `Failed` (the operation ends
/// `ZonalAllocationFailed`, the instance list then shows them `Failed`) are deleted as soon as a
/// list read after the refusal shows them, through the guarded delete; before, they waited out
/// `maxNodeProvisionTime` (an hour here) holding the group's capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_instances_a_refused_allocation_left_are_deleted_at_once_not_after_max_node_provision_time(
) {
    use vmss_capacity_controller::emulator::sim::nodes::NEVER_REGISTER_TAG;
    // The emulator's failed VMs never boot a Node: the tag keeps them unregistered.
    let c = Cluster::start_simulated(
        &[(
            "zonal",
            "Standard_D4s_v5",
            0,
            &[(NEVER_REGISTER_TAG, "true")],
        )],
        5,
        |s| {
            s.scan_interval = Duration::from_millis(300);
            s.pod_demand.batch_idle = Duration::from_millis(800);
            s.pod_demand.batch_max = Duration::from_secs(5);
            s.pod_demand.max_node_provision_time = Duration::from_secs(3600);
            s.scale_down.enabled = true;
            s.scale_down.delay_after_add = Duration::ZERO;
            for g in &mut s.node_groups {
                g.min_size = 0;
            }
        },
    )
    .await;
    c.state.inject_fault(put_fault(
        "zonal",
        FaultKind::LroFailed {
            code: Some("ZonalAllocationFailed".into()),
            zone: None,
        },
        1,
    ));
    c.pending("db-0", "1", "1Gi", json!({}));
    let groups = c.reconciler.node_groups();
    assert!(
        eventually(Duration::from_secs(15), || groups
            .unavailable("zonal")
            .is_some())
        .await,
        "the refusal was not seen"
    );
    // The failed write created instance 0. Its Failed VM goes at once, by name, through the
    // guarded delete; a VM merely without a Node (a later write's, booting here forever) waits
    // out maxNodeProvisionTime.
    let failed_vm = "zonal000000".to_string();
    assert!(
        eventually(Duration::from_secs(15), || c
            .state
            .instance_deletions()
            .iter()
            .any(|d| d.machines.contains(&failed_vm)))
        .await,
        "the Failed instance was not deleted: {:?}",
        groups.instances().get("zonal")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deleted: Vec<Vec<String>> = c
        .state
        .instance_deletions()
        .into_iter()
        .map(|d| d.machines)
        .collect();
    assert_eq!(deleted, [vec![failed_vm]], "only the Failed VM");
    let deletes: Vec<_> = c
        .state
        .request_log()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/delete"))
        .collect();
    assert!(
        deletes.iter().all(|d| d.if_match.is_some()),
        "the guarded delete: {deletes:?}"
    );
    assert_eq!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "unregistered")]
        ),
        1
    );
    c.stop().await;
}

/// The example's shape: `spot` (Spot priority, eviction policy Delete, zones 1-3) first, the
/// regular `ondemand` group of the same size as the fallback, with the `priority` expander.
async fn spot_first() -> Cluster {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    let mut spot = ScaleSetSeed::new(SUB, RG, "spot", 0);
    spot.sku_name = "Standard_D4s_v5".into();
    spot.zones = vec!["1".into(), "2".into(), "3".into()];
    spot.priority = Some("Spot".into());
    spot.eviction_policy = Some("Delete".into());
    let mut ondemand = ScaleSetSeed::new(SUB, RG, "ondemand", 0);
    ondemand.sku_name = "Standard_D4s_v5".into();
    ondemand.zones = spot.zones.clone();
    Cluster::start_groups(Groups::Seeds(vec![spot, ondemand]), 20, |s| {
        use vmss_capacity_controller::pods::expander::Expander;
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
        s.pod_demand.expander = Expander::Priority(vec![
            (50, vec!["spot".into()]),
            (10, vec!["ondemand".into()]),
        ]);
    })
    .await
}

/// Tolerates AKS's spot taint.
fn tolerates_spot() -> serde_json::Value {
    json!({"tolerations": [{"key": "kubernetes.azure.com/scalesetpriority",
        "operator": "Equal", "value": "spot", "effect": "NoSchedule"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_goes_first_for_pods_that_tolerate_it_and_never_for_those_that_do_not() {
    let c = spot_first().await;
    let offering = c
        .reconciler
        .node_groups()
        .offering("spot")
        .expect("read from the scale set");
    assert!(offering.spot, "{offering:?}");
    assert_eq!(offering.zones, ["1", "2", "3"]);
    // 6 pods of 1 cpu that tolerate spot: 2 spot nodes; 3 that do not: 1 on-demand node, whatever
    // the priorities say (the spot template carries the taint).
    for i in 0..6 {
        c.pending(&format!("batch-{i}"), "1", "1Gi", tolerates_spot());
    }
    for i in 0..3 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    assert!(
        eventually(Duration::from_secs(15), || c.capacity("spot") == 2
            && c.capacity("ondemand") == 1)
        .await,
        "spot {} ondemand {}",
        c.capacity("spot"),
        c.capacity("ondemand")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_spot_cannot_be_had_the_same_pods_fall_back_to_on_demand_at_once() {
    // Spot capacity gone in the region: the write is accepted, the operation fails.
    let c = spot_first().await;
    c.state.inject_fault(put_fault(
        "spot",
        FaultKind::LroFailed {
            code: Some("OverconstrainedAllocationRequest".into()),
            zone: None,
        },
        1,
    ));
    for i in 0..6 {
        c.pending(&format!("batch-{i}"), "1", "1Gi", tolerates_spot());
    }
    assert!(
        eventually(Duration::from_secs(15), || c.capacity("ondemand") == 2).await,
        "spot {} ondemand {}",
        c.capacity("spot"),
        c.capacity("ondemand")
    );
    let out = c
        .reconciler
        .node_groups()
        .unavailable("spot")
        .expect("marked");
    assert_eq!(out.failure.label(), "allocation_failed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.capacity_puts("spot"), 1, "not asked again while marked");
    c.stop().await;

    // No spot quota left (spot draws on the low-priority total only): the first decision
    // already goes on-demand, with no write to spot at all.
    let c = spot_first().await;
    c.state.set_quota(SUB, LOCATION, "lowPriorityCores", 0);
    reread_quota(&c, "lowPriorityCores", 0).await;
    for i in 0..6 {
        c.pending(&format!("batch-{i}"), "1", "1Gi", tolerates_spot());
    }
    assert!(
        eventually(Duration::from_secs(15), || c.capacity("ondemand") == 2).await,
        "spot {} ondemand {}",
        c.capacity("spot"),
        c.capacity("ondemand")
    );
    assert_eq!(c.capacity_puts("spot"), 0);
    c.stop().await;
}

/// A spot group (eviction policy `policy`) first and an on-demand group of the same size as
/// the fallback (the priority expander), running a ReplicaSet of 4 pods of 1.5 cpus that
/// tolerate spot: two per D4s_v5 node, so two spot nodes.
async fn spot_and_on_demand_running_a_batch(policy: &str, scale_down: bool) -> Cluster {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    let mut spot = ScaleSetSeed::new(SUB, RG, "spot", 0);
    spot.sku_name = "Standard_D4s_v5".into();
    spot.priority = Some("Spot".into());
    spot.eviction_policy = Some(policy.into());
    let mut ondemand = ScaleSetSeed::new(SUB, RG, "ondemand", 0);
    ondemand.sku_name = "Standard_D4s_v5".into();
    let sim = SimSettings {
        boot_delay: Duration::from_millis(200),
        tick: Duration::from_millis(20),
    };
    let c = Cluster::start_simulated_groups(Groups::Seeds(vec![spot, ondemand]), 20, sim, |s| {
        use vmss_capacity_controller::pods::expander::Expander;
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
        s.pod_demand.expander = Expander::Priority(vec![
            (50, vec!["spot".into()]),
            (10, vec!["ondemand".into()]),
        ]);
        s.scale_down.enabled = scale_down;
    })
    .await;
    let template = PodTemplate::new("1500m", "1Gi").tolerate(
        "kubernetes.azure.com/scalesetpriority",
        "spot",
        "NoSchedule",
    );
    c.kube
        .create_replica_set("default", "batch", 4, &template)
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(15), || c
            .kube
            .pod_counts(Some("default"))
            .running
            == 4
            && c.reconciler.operations_in_flight() == 0)
        .await,
        "batch never ran: spot {}",
        c.capacity("spot")
    );
    assert_eq!((c.capacity("spot"), c.capacity("ondemand")), (2, 0));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_lose_their_node_to_a_spot_eviction_are_placed_on_demand_at_once_and_spot_is_passed_over_for_a_while(
) {
    let c = spot_and_on_demand_running_a_batch("Delete", false).await;
    let running = |c: &Cluster| c.kube.pod_counts(Some("default")).running;
    // The nodes carry AKS's spot label, as the template said they would.
    assert!(c.kube.list_all("v1", "nodes", None).iter().all(|n| n
        .pointer("/metadata/labels/kubernetes.azure.com~1scalesetpriority")
        == Some(&json!("spot"))));

    // Azure takes one VM back: its node and its two pods are gone; the ReplicaSet makes two new
    // pods, which are pending.
    let t0 = tokio::time::Instant::now();
    let evicted = c.state.evict_spot(SUB, RG, "spot", 1).expect("evicted");
    assert_eq!(evicted.len(), 1);
    assert!(
        eventually(Duration::from_secs(5), || c
            ._emulator
            .pods_lost_with_nodes()
            .len()
            == 2)
        .await
    );
    // Within a few seconds (not after the scan interval, 30 s here, nor after
    // maxNodeProvisionTime waiting for the evicted VM as if it were on its way), on demand.
    assert!(
        eventually(Duration::from_secs(10), || running(&c) == 4
            && c.capacity("ondemand") == 1)
        .await,
        "the pods that lost their node were not placed: spot {}, ondemand {}, running {}",
        c.capacity("spot"),
        c.capacity("ondemand"),
        running(&c)
    );
    let placed = t0.elapsed();
    println!("pods that lost their node to the eviction run again after {placed:?}");
    assert_eq!(
        c.capacity("spot"),
        1,
        "spot is not asked again while marked"
    );
    assert_eq!(
        c.metrics
            .spot_evictions_total
            .with_label_values(&["spot"])
            .get(),
        1
    );
    let out = c
        .reconciler
        .node_groups()
        .unavailable("spot")
        .expect("marked");
    assert_eq!(out.failure.label(), "spot_evicted");
    assert!(out.left <= Duration::from_secs(180), "{:?}", out.left);
    assert_eq!(
        c.metrics
            .cache_invalidations_total
            .with_label_values(&["instance", "node_gone"])
            .get(),
        1,
        "the group was read afresh once"
    );
    // Azure's eviction is its own version: the write over it was made knowing it.
    assert!(
        c.state.lost_updates().is_empty(),
        "{:?}",
        c.state.lost_updates()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spot_vms_evicted_with_deallocate_are_deleted_by_name_and_their_pods_run_on_demand() {
    // Scale-down's passes (which delete the evicted VMs) every 30 s: the deletion below comes
    // from the fresh instance list, not from a pass falling due.
    let c = spot_and_on_demand_running_a_batch("Deallocate", true).await;
    let running = |c: &Cluster| c.kube.pod_counts(Some("default")).running;
    let spot_writes = c.capacity_puts("spot");

    // Azure takes one VM back and stops it: it stays in the scale set (capacity 2, quota
    // used), its Node turns NotReady, its two pods stay bound to it and run nowhere.
    let t0 = tokio::time::Instant::now();
    let evicted = c.state.evict_spot(SUB, RG, "spot", 1).expect("evicted");
    assert_eq!(evicted.len(), 1);
    assert_eq!(
        c.capacity("spot"),
        2,
        "a deallocated VM stays in the capacity"
    );
    // The controller sees it stopped, deletes it by name, and the pods the ReplicaSet makes
    // anew go on demand: spot is passed over while marked.
    assert!(
        eventually(Duration::from_secs(15), || running(&c) == 4
            && c.capacity("spot") == 1
            && c.capacity("ondemand") == 1)
        .await,
        "the evicted VM's pods were not placed: spot {}, ondemand {}, running {}",
        c.capacity("spot"),
        c.capacity("ondemand"),
        running(&c)
    );
    println!(
        "pods of a VM evicted with Deallocate run again after {:?}",
        t0.elapsed()
    );
    let left: Vec<String> = c
        .state
        .inventory()
        .into_iter()
        .filter(|ss| ss.name == "spot")
        .flat_map(|ss| ss.instances.into_iter().map(|(id, _, _)| id.to_string()))
        .collect();
    assert!(
        !left.contains(&evicted[0].to_string()),
        "the evicted instance {} is deleted: {left:?}",
        evicted[0]
    );
    // The delete task counts its node once the delete's answer is in, which may be a moment
    // after Azure's capacity already shows it gone.
    let counted = |c: &Cluster| {
        (
            c.metrics
                .scaled_down_nodes_total
                .with_label_values(&["spot", "spot_evicted"])
                .get(),
            c.metrics
                .spot_evictions_total
                .with_label_values(&["spot"])
                .get(),
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || counted(&c) == (1, 1)).await,
        "(scaled down as spot_evicted, spot evictions) counted {:?}, not (1, 1)",
        counted(&c)
    );
    let out = c
        .reconciler
        .node_groups()
        .unavailable("spot")
        .expect("marked");
    assert_eq!(out.failure.label(), "spot_evicted");
    // No write to spot while it is marked, one to on-demand, and nothing lost.
    assert_eq!(c.capacity_puts("spot"), spot_writes);
    assert_eq!(c.capacity_puts("ondemand"), 1);
    assert!(
        c.state.lost_updates().is_empty(),
        "{:?}",
        c.state.lost_updates()
    );
    c.stop().await;
}
