//! Scale-down's safety when its view of the cluster is wrong, or its delete's outcome unknown
//! (issue 21, items 1 and 3), end to end on the emulator's cluster simulation: a watch refused by
//! RBAC, a delete whose answer is lost; and a group it may not write (item 6). Real time with short waits; every wait is bounded.

use crate::support;

use std::time::Duration;
use support::pod_cluster::{Cluster, Groups};
use support::*;
use vmss_capacity_controller::config::Settings;
use vmss_capacity_controller::emulator::arm::AgentPoolSeed;
use vmss_capacity_controller::emulator::sim::PodTemplate;
use vmss_capacity_controller::emulator::sim::SimSettings;
use vmss_capacity_controller::emulator::FaultKind;
use vmss_capacity_controller::kube::nodes::TO_BE_DELETED_TAINT;
use vmss_capacity_controller::metrics::Metrics;

const SIZE: &str = "Standard_D2s_v3";

fn fast(s: &mut Settings, min: u32) {
    s.scan_interval = Duration::from_millis(300);
    s.pod_demand.batch_idle = Duration::from_millis(800);
    s.pod_demand.batch_max = Duration::from_secs(5);
    s.scale_down.enabled = true;
    s.scale_down.unneeded_time = Duration::from_secs(1);
    s.scale_down.delay_after_add = Duration::ZERO;
    s.scale_down.node_delete_delay_after_taint = Duration::from_millis(300);
    s.scale_down.max_pod_eviction_time = Duration::from_secs(5);
    for g in &mut s.node_groups {
        g.min_size = min;
    }
}

async fn ready(c: &Cluster, n: usize) {
    assert!(
        eventually(Duration::from_secs(10), || c.kube.ready_nodes().len() == n).await,
        "never {n} Ready nodes"
    );
}

fn running_on_nodes(c: &Cluster, app: &str) -> Vec<String> {
    c.kube
        .list_all("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| p.pointer("/metadata/labels/app").and_then(|v| v.as_str()) == Some(app))
        .filter(|p| p.pointer("/status/phase").and_then(|v| v.as_str()) == Some("Running"))
        .filter_map(|p| {
            p.pointer("/spec/nodeName")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect()
}

fn deletes(c: &Cluster) -> Vec<vmss_capacity_controller::emulator::RequestRecord> {
    c.state
        .request_log()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/delete"))
        .collect()
}

fn halted(c: &Cluster) -> i64 {
    c.metrics
        .scale_down_halted
        .with_label_values(&["watch_failing"])
        .get()
}

fn tainted(c: &Cluster, node: &str) -> bool {
    c.kube
        .list_all("v1", "nodes", None)
        .into_iter()
        .find(|n| n.pointer("/metadata/name").and_then(|v| v.as_str()) == Some(node))
        .and_then(|n| n.pointer("/spec/taints").cloned())
        .and_then(|t| t.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|t| t["key"] == TO_BE_DELETED_TAINT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_pods_a_failing_watch_cannot_see_are_not_deleted_and_scale_down_resumes_after()
{
    let c = Cluster::start_simulated(&[("pool", SIZE, 3, &[])], 5, |s| fast(s, 1)).await;
    ready(&c, 3).await;
    // An RBAC change: the controller may no longer list or watch pods; its open watch ends.
    c.kube.forbid_reads("pods", true);
    c.kube
        .create_replica_set("default", "web", 2, &PodTemplate::new("500m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(10), || running_on_nodes(&c, "web")
            .len()
            == 2)
        .await,
        "web never ran"
    );
    // To the controller all three nodes still look empty. Long enough for several passes past
    // unneededTime and the taint delay: a controller trusting that view would remove two.
    assert!(
        eventually(Duration::from_secs(10), || halted(&c) == 1).await,
        "scale-down never said it halted"
    );
    let why = c.reconciler.status()[0].scale_down_halted.clone();
    assert!(
        why.as_deref().is_some_and(|w| w.contains("pods")),
        "the status says why: {why:?}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(deletes(&c).is_empty(), "deleted: {:?}", deletes(&c));
    assert_eq!(c.capacity("pool"), 3);
    assert!(c._emulator.pods_lost_with_nodes().is_empty());

    // The RBAC is fixed: the watch lists afresh, sees web, and only the empty node goes.
    c.kube.forbid_reads("pods", false);
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 2).await,
        "the empty node was not removed once the view was whole again"
    );
    assert_eq!(halted(&c), 0);
    assert_eq!(c.reconciler.status()[0].scale_down_halted, None);
    // (Afterwards web may be consolidated onto one node: through evictions, never by loss.)
    assert!(
        c._emulator.pods_lost_with_nodes().is_empty(),
        "{:?}",
        c._emulator.pods_lost_with_nodes()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_registered_are_not_deleted_as_unregistered_while_the_node_watch_fails() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 1, &[])], 5, |s| {
        fast(s, 1);
        s.pod_demand.max_node_provision_time = Duration::from_secs(2);
    })
    .await;
    ready(&c, 1).await;
    c.kube.forbid_reads("nodes", true);
    // Somebody adds two instances; they boot and register, but the controller cannot see it.
    let name = c.scale_set_name("pool");
    c.state
        .rival_set_capacity(SUB, RG, &name, 3, "operator")
        .expect("rival write");
    ready(&c, 3).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(deletes(&c).is_empty(), "deleted: {:?}", deletes(&c));
    assert_eq!(c.capacity("pool"), 3);
    assert_eq!(halted(&c), 1);
    c.kube.forbid_reads("nodes", false);
    assert!(eventually(Duration::from_secs(10), || halted(&c) == 0).await);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_answer_is_lost_keeps_the_node_tainted_until_a_fresh_list_decides() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| fast(s, 1)).await;
    ready(&c, 2).await;
    // The delete reaches Azure and commits, but its answer never comes back.
    c.state.inject_fault(fault(
        Some("POST"),
        Some("/delete"),
        FaultKind::DropAfterCommit,
        Some(1),
    ));
    assert!(
        eventually(Duration::from_secs(20), || deletes(&c).len() == 1).await,
        "no delete was sent"
    );
    // The instance is going; its node must never be untainted meanwhile.
    let victim: Vec<String> = c
        .kube
        .list_all("v1", "nodes", None)
        .into_iter()
        .filter_map(|n| {
            n.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .filter(|n| tainted(&c, n))
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 1).await,
        "the delete did not land"
    );
    for _ in 0..20 {
        for n in &victim {
            let still_there = c
                .kube
                .list_all("v1", "nodes", None)
                .iter()
                .any(|x| x.pointer("/metadata/name").and_then(|v| v.as_str()) == Some(n));
            assert!(
                !still_there || tainted(&c, n),
                "node {n} was untainted while its VM was being deleted"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The next passes learn from a fresh list that the instance is gone: counted as removed.
    assert!(
        eventually(Duration::from_secs(10), || Metrics::counter_sum(
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "empty")]
        ) == 1)
        .await,
        "the unknown delete was never settled"
    );
    assert_eq!(
        Metrics::counter_sum(
            &c.metrics.failed_scale_downs_total,
            &[("reason", "delete_failed")]
        ),
        0,
        "an unknown outcome is not a failure that untaints"
    );
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    c.stop().await;
}

fn autoscaled_pool(name: &str, count: i64, size: &str) -> AgentPoolSeed {
    let mut p = AgentPoolSeed::new(name, count).vm_size(size);
    p.enable_auto_scaling = true;
    p.min_count = Some(0);
    p.max_count = Some(5);
    p
}

async fn pools(seeds: Vec<AgentPoolSeed>) -> Cluster {
    let sim = SimSettings {
        boot_delay: Duration::from_millis(200),
        tick: Duration::from_millis(20),
    };
    Cluster::start_simulated_groups(Groups::Pools(seeds), 5, sim, |s| fast(s, 0)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_empty_nodes_of_a_pool_aks_autoscales_are_never_tainted_or_drained() {
    // `auto` is scaled by AKS's own autoscaler: every delete of ours would be refused, after
    // the taint and the drain. Its two nodes are empty; `free`'s one node too.
    let c = pools(vec![
        autoscaled_pool("auto", 2, SIZE),
        AgentPoolSeed::new("free", 1).vm_size(SIZE),
    ])
    .await;
    ready(&c, 4).await;
    let auto_nodes = c.nodes_of("auto");
    assert_eq!(auto_nodes.len(), 2);
    // Several passes past unneededTime and the taint delay: `free` shrinks, `auto` is untouched.
    assert!(
        eventually(Duration::from_secs(15), || c.capacity("free") == 0).await,
        "the empty node of the pool this controller does scale was not removed"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let touched: Vec<_> = c
        .kube
        .write_requests()
        .into_iter()
        .filter(|(_, path)| {
            auto_nodes
                .iter()
                .any(|n| path.ends_with(&format!("/nodes/{n}")))
        })
        .collect();
    assert_eq!(
        touched,
        vec![],
        "nodes of the AKS-autoscaled pool were written"
    );
    assert_eq!(c.capacity("auto"), 2);
    assert_eq!(
        c.metrics
            .failed_scale_downs_total
            .with_label_values(&["auto", "refused"])
            .get(),
        0,
        "a removal of an AKS-autoscaled node was started"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_passes_over_a_pool_aks_autoscales_for_one_it_may_write() {
    // From zero, `auto`'s smaller VM would waste less (least-waste picks it), but AKS's own
    // autoscaler scales it: the pending pods must go to `free`.
    let c = pools(vec![
        autoscaled_pool("auto", 0, SIZE),
        AgentPoolSeed::new("free", 1).vm_size("Standard_D4s_v3"),
    ])
    .await;
    ready(&c, 2).await;
    c.kube
        .create_replica_set("default", "web", 4, &PodTemplate::new("1500m", "1Gi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("free") >= 2).await,
        "the pending pods never got a node of the pool this controller scales (free = {}, auto = {})",
        c.capacity("free"),
        c.capacity("auto")
    );
    assert_eq!(c.capacity("auto"), 0);
    assert_eq!(
        c.metrics
            .writes_held_total
            .with_label_values(&["auto", "aks_autoscaler"])
            .get(),
        0,
        "a scale-up of the AKS-autoscaled pool was planned"
    );
    c.stop().await;
}

fn scaled_down(c: &Cluster, reason: &str) -> u64 {
    Metrics::counter_sum(&c.metrics.scaled_down_nodes_total, &[("reason", reason)])
}

fn failed(c: &Cluster, reason: &str) -> u64 {
    Metrics::counter_sum(&c.metrics.failed_scale_downs_total, &[("reason", reason)])
}

fn deleted_machines(c: &Cluster) -> Vec<Vec<String>> {
    c.state
        .instance_deletions()
        .into_iter()
        .map(|d| d.machines)
        .collect()
}

async fn set_taints(c: &Cluster, node: &str, taints: serde_json::Value, cordon: bool) {
    use kube::api::{Patch, PatchParams};
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c.client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"taints": taints, "unschedulable": cordon}})),
    )
    .await
    .expect("node patched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_left_failed_by_a_delete_whose_answer_was_lost_is_deleted_again() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| fast(s, 1)).await;
    ready(&c, 2).await;
    // The delete reaches Azure, which deletes nothing and leaves the VM Failed; the answer is
    // lost.
    c.state.inject_fault(fault(
        Some("POST"),
        Some("/delete"),
        FaultKind::PartialDelete {
            keep: 1,
            leave_failed: true,
            drop_answer: true,
        },
        Some(1),
    ));
    assert!(
        eventually(Duration::from_secs(20), || deletes(&c).len() == 1).await,
        "no delete was sent"
    );
    assert_eq!(c.capacity("pool"), 2, "the first delete deleted nothing");
    let victim: Vec<String> = c
        .kube
        .list_all("v1", "nodes", None)
        .into_iter()
        .filter_map(|n| {
            n.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .filter(|n| tainted(&c, n))
        .collect();
    assert_eq!(victim.len(), 1, "the node of the lost delete stays tainted");
    // A fresh list shows the VM Failed: that VM is deleted again, not left cordoned (and the
    // other node, at the floor, stays).
    assert!(
        eventually(Duration::from_secs(20), || deleted_machines(&c)
            .iter()
            .any(|m| m.contains(&victim[0])))
        .await,
        "the Failed VM was never deleted again: {:?}",
        deleted_machines(&c)
    );
    assert!(eventually(Duration::from_secs(10), || c.capacity("pool") == 1).await);
    assert!(
        eventually(Duration::from_secs(10), || scaled_down(&c, "empty") == 1).await,
        "the removal was not counted"
    );
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_deletes_a_leftover_tainted_node_whose_vm_is_failed_and_untaints_a_healthy_one(
) {
    use vmss_capacity_controller::emulator::sim::nodes::node_name;
    // At the floor: nothing is unneeded enough to go, only the leftovers are settled.
    let c = Cluster::start_simulated(&[("pool", SIZE, 3, &[])], 5, |s| fast(s, 3)).await;
    ready(&c, 3).await;
    c.set_leader(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A previous leader tainted two nodes; one VM was left Failed by its delete.
    let name = c.scale_set_name("pool");
    let (failed_node, healthy_node) = (node_name(&name, 0), node_name(&name, 1));
    let ours = serde_json::json!([{"key": TO_BE_DELETED_TAINT, "value": "1700000000", "effect": "NoSchedule"}]);
    set_taints(&c, &failed_node, ours.clone(), true).await;
    set_taints(&c, &healthy_node, ours, true).await;
    assert!(c.state.set_instance_failed(SUB, RG, &name, 0, true));
    c.set_leader(true);
    assert!(
        eventually(Duration::from_secs(20), || deleted_machines(&c)
            .iter()
            .any(|m| m.contains(&failed_node)))
        .await,
        "the leftover node whose VM is Failed was never deleted"
    );
    assert!(
        eventually(Duration::from_secs(10), || !tainted(&c, &healthy_node)).await,
        "the healthy leftover was not untainted"
    );
    assert!(
        !deleted_machines(&c)
            .iter()
            .flatten()
            .any(|m| *m == healthy_node),
        "the healthy leftover was deleted"
    );
    // At the floor, the Failed VM was replaced: the size is written back up.
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 3).await,
        "the size was not written back up"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_the_last_look_is_dropped_from_the_bulk_delete_and_the_rest_go() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 3, &[])], 5, |s| {
        fast(s, 1);
        s.scale_down.node_delete_delay_after_taint = Duration::from_secs(2);
    })
    .await;
    ready(&c, 3).await;
    let names = || -> Vec<String> {
        c.kube
            .list_all("v1", "nodes", None)
            .into_iter()
            .filter_map(|n| {
                n.pointer("/metadata/name")
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            })
            .collect()
    };
    // Two empty nodes are tainted for one bulk delete.
    assert!(
        eventually(Duration::from_secs(20), || names()
            .iter()
            .filter(|n| tainted(&c, n))
            .count()
            == 2)
        .await,
        "two nodes were never tainted"
    );
    let chosen: Vec<String> = names().into_iter().filter(|n| tainted(&c, n)).collect();
    // An operator takes our taint off one of them before the delete: it must stay, the other
    // still goes in that request.
    set_taints(&c, &chosen[0], serde_json::json!([]), false).await;
    assert!(
        eventually(Duration::from_secs(20), || !deleted_machines(&c).is_empty()).await,
        "nothing was deleted"
    );
    assert_eq!(
        deleted_machines(&c)[0],
        vec![chosen[1].clone()],
        "the first request deletes exactly the node that passed its last look"
    );
    assert!(
        eventually(Duration::from_secs(10), || failed(&c, "aborted") >= 1).await,
        "the dropped node's removal was not counted as aborted"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_delete_that_fails_after_deleting_some_counts_them_and_untaints_only_the_rest() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 3, &[])], 5, |s| fast(s, 1)).await;
    ready(&c, 3).await;
    // Azure deletes one of the two instances and the operation ends Failed.
    c.state.inject_fault(fault(
        Some("POST"),
        Some("/delete"),
        FaultKind::PartialDelete {
            keep: 1,
            leave_failed: false,
            drop_answer: false,
        },
        Some(1),
    ));
    assert!(
        eventually(Duration::from_secs(20), || deleted_machines(&c).len() == 1).await,
        "no delete was sent"
    );
    assert_eq!(deletes(&c).len(), 1, "one request for both");
    assert_eq!(
        deleted_machines(&c)[0].len(),
        1,
        "Azure deleted one of them"
    );
    // The deleted one counts as scaled down; only the one still there failed (untainted).
    assert!(
        eventually(Duration::from_secs(10), || scaled_down(&c, "empty") == 1).await,
        "the instance the failed operation deleted was not counted"
    );
    // Counted in the same settling, a moment later on a loaded machine.
    assert!(
        eventually(Duration::from_secs(10), || failed(&c, "delete_failed") == 1).await,
        "the one still there was not counted as failed: {}",
        failed(&c, "delete_failed")
    );
    // The one left goes later, by itself.
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 1).await,
        "the node left was never removed"
    );
    assert!(
        eventually(Duration::from_secs(10), || scaled_down(&c, "empty") == 2).await,
        "removals counted: {}",
        scaled_down(&c, "empty")
    );
    assert_eq!(failed(&c, "delete_failed"), 1);
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_hiccup_does_not_restart_a_nodes_unneeded_time() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| {
        fast(s, 1);
        s.scale_down.unneeded_time = Duration::from_secs(60);
    })
    .await;
    ready(&c, 2).await;
    let since = || -> Option<(String, k8s_openapi::jiff::Timestamp)> {
        let u = c.reconciler.status()[0].unneeded.first().cloned()?;
        Some((u.node, u.since.parse().ok()?))
    };
    assert!(
        eventually(Duration::from_secs(10), || since().is_some()).await,
        "no node became unneeded"
    );
    let (node, before) = since().unwrap();
    // The renewal is late for a few passes, then succeeds: the same leadership goes on.
    c.set_renewal_stale(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.set_renewal_stale(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (after_node, after) = since().expect("still unneeded");
    assert_eq!(after_node, node);
    let moved = after.duration_since(before).as_secs_f64();
    assert!(
        moved < 0.5,
        "the unneeded time restarted {moved:.1}s later: {before} then {after}"
    );
    c.stop().await;
}
