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
