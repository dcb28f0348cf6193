//! Scale-down end to end, in process, against the emulator's cluster simulation: instances are
//! Nodes, ReplicaSets re-create evicted pods, evictions respect PodDisruptionBudgets, a deleted
//! instance takes its Node (and any pod still on it, which the simulation reports as lost).
//! Real time with short waits (`unneededTime` 1 s); every wait is bounded.

use crate::consolidating::annotate;
use crate::support;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;
use vmss_capacity_controller::config::Settings;
use vmss_capacity_controller::emulator::sim::PodTemplate;
use vmss_capacity_controller::kube::nodes::{has_our_taint, DELETION_CANDIDATE_TAINT};

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

fn nodes(c: &Cluster) -> Vec<String> {
    c.kube
        .nodes_by_scale_set()
        .get("pool")
        .cloned()
        .unwrap_or_default()
}

async fn ready(c: &Cluster, n: usize) -> Vec<String> {
    assert!(
        eventually(Duration::from_secs(10), || c.kube.ready_nodes().len() == n).await,
        "never {n} Ready nodes"
    );
    let mut names = c.kube.ready_nodes();
    names.sort();
    names
}

/// Node of the pods of workload `app`.
fn node_of(c: &Cluster, app: &str) -> Vec<String> {
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

fn count(_: &Cluster, m: &prometheus::IntCounterVec, labels: &[(&str, &str)]) -> u64 {
    vmss_capacity_controller::metrics::Metrics::counter_sum(m, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_nodes_go_by_deleting_exactly_their_instances_and_never_below_min() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 3, &[])], 5, |s| fast(s, 1)).await;
    let ready_before = ready(&c, 3).await;
    c.kube
        .create_replica_set("default", "web", 1, &PodTemplate::new("500m", "256Mi"))
        .expect("replica set");
    assert!(eventually(Duration::from_secs(10), || node_of(&c, "web").len() == 1).await);
    let busy = node_of(&c, "web");
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 1).await,
        "the two empty nodes were not removed: capacity {}",
        c.capacity("pool")
    );
    assert!(eventually(Duration::from_secs(5), || nodes(&c) == busy).await);
    // Both empty nodes were chosen in one pass: one request names both instances.
    let sent = deletes(&c);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent.iter().all(|r| r.if_match.is_some() && r.status == 202),
        "every delete carries If-Match: {sent:?}"
    );
    let deleted = c.state.instance_deletions();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    let mut machines = deleted[0].machines.clone();
    machines.sort();
    let mut empty: Vec<String> = ready_before
        .iter()
        .filter(|n| !busy.contains(n))
        .cloned()
        .collect();
    empty.sort();
    assert_eq!(machines, empty, "exactly the two empty nodes' instances");
    assert_eq!(deleted[0].capacity_after, 1);
    // No capacity number was lowered: the only writes are the deletes.
    assert_eq!(
        capacity_puts_by(&c.state.request_log(), "controller").len(),
        0
    );
    // Counted once Azure confirmed each operation.
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "empty")]
        ) == 2)
        .await
    );
    assert_eq!(count(&c, &c.metrics.evicted_pods_total, &[]), 0);
    // The last node is the group's min: it stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.capacity("pool"), 1);
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    assert!(
        c.state.lost_updates().is_empty(),
        "{:?}",
        c.state.lost_updates()
    );
    c.stop().await;
}

/// Two nodes, both protected; `fill` takes most of the first, `web` lands on the second; `fill`
/// goes and the second node loses its protection: `web` can move to the first.
async fn web_alone_on_the_second_node(c: &Cluster) -> (String, String) {
    let names = ready(c, 2).await;
    for n in &names {
        annotate(c, n, Some("true")).await;
    }
    c.kube
        .create_replica_set("default", "fill", 1, &PodTemplate::new("1500m", "256Mi"))
        .expect("fill");
    assert!(
        eventually(Duration::from_secs(10), || node_of(c, "fill")
            == [names[0].clone()])
        .await
    );
    c.kube
        .create_replica_set("default", "web", 1, &PodTemplate::new("500m", "256Mi"))
        .expect("web");
    assert!(
        eventually(Duration::from_secs(10), || node_of(c, "web")
            == [names[1].clone()])
        .await
    );
    c.kube
        .scale_replica_set("default", "fill", 0)
        .expect("scale");
    assert!(eventually(Duration::from_secs(10), || node_of(c, "fill").is_empty()).await);
    (names[0].clone(), names[1].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underused_node_is_drained_through_evictions_and_only_its_instance_is_deleted() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| fast(s, 0)).await;
    let (keep, drain) = web_alone_on_the_second_node(&c).await;
    annotate(&c, &drain, None).await;
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 1).await,
        "the underused node was not removed"
    );
    assert!(eventually(Duration::from_secs(5), || nodes(&c) == [keep.clone()]).await);
    // Its pod was evicted through the API, re-created by its ReplicaSet, and runs on the node
    // that stays; nothing went down with the node.
    assert!(
        eventually(Duration::from_secs(10), || node_of(&c, "web")
            == [keep.clone()])
        .await
    );
    assert!(count(&c, &c.metrics.evicted_pods_total, &[("result", "evicted")]) >= 1);
    assert!(
        c._emulator.pods_lost_with_nodes().is_empty(),
        "{:?}",
        c._emulator.pods_lost_with_nodes()
    );
    assert_eq!(deletes(&c).len(), 1);
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "underutilized")]
        ) == 1)
        .await
    );
    let on_node = |events: &[k8s_openapi::api::events::v1::Event]| {
        events
            .iter()
            .any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(drain.as_str()))
    };
    let events = c.events_once("ScaleDown", on_node).await;
    assert!(
        on_node(&events),
        "no ScaleDown Event on the node: {events:?}"
    );
    c.stop().await;
}

fn soft_tainted(c: &Cluster, node: &str) -> bool {
    c.kube
        .get("v1", "nodes", "", node)
        .ok()
        .and_then(|n| n.pointer("/spec/taints").cloned())
        .and_then(|t| t.as_array().cloned())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t["key"] == DELETION_CANDIDATE_TAINT && t["effect"] == "PreferNoSchedule")
        })
}

/// Two nodes, one holding a pod that uses most of it: the other is unneeded (and stays so for
/// `unneededTime`, ten minutes here, so nothing is removed meanwhile).
async fn one_busy_node_and_one_unneeded(soft_taints: u32) -> (Cluster, String, String) {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| {
        fast(s, 0);
        s.scale_down.unneeded_time = Duration::from_secs(600);
        s.scale_down.max_bulk_soft_taint_count = soft_taints;
    })
    .await;
    let names = ready(&c, 2).await;
    c.kube
        .create_replica_set("default", "fill", 1, &PodTemplate::new("1500m", "256Mi"))
        .expect("fill");
    assert!(eventually(Duration::from_secs(10), || node_of(&c, "fill").len() == 1).await);
    let busy = node_of(&c, "fill")[0].clone();
    let idle = names.into_iter().find(|n| *n != busy).expect("two nodes");
    (c, busy, idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unneeded_node_is_soft_tainted_so_new_pods_go_elsewhere_and_the_taint_comes_off_once_it_is_needed(
) {
    let (c, busy, idle) = one_busy_node_and_one_unneeded(10).await;
    assert!(
        eventually(Duration::from_secs(10), || soft_tainted(&c, &idle)).await,
        "the unneeded node never got the soft taint"
    );
    assert!(!soft_tainted(&c, &busy));
    // kube-scheduler's least-allocated score alone would pick the empty node.
    c.kube
        .create_replica_set("default", "web", 1, &PodTemplate::new("200m", "128Mi"))
        .expect("web");
    assert!(eventually(Duration::from_secs(10), || node_of(&c, "web").len() == 1).await);
    assert_eq!(node_of(&c, "web"), [busy], "web refilled the unneeded node");
    // A pod only the soft-tainted node holds still lands there (nothing is filtered), and the
    // node, needed now, loses the taint.
    c.kube
        .create_replica_set("default", "big", 1, &PodTemplate::new("1500m", "256Mi"))
        .expect("big");
    assert!(
        eventually(Duration::from_secs(10), || node_of(&c, "big")
            == [idle.clone()])
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || !soft_tainted(&c, &idle)).await,
        "the taint stayed on a needed node"
    );
    let n = |action: &str| {
        count(
            &c,
            &c.metrics.soft_taint_writes_total,
            &[("action", action), ("result", "ok")],
        )
    };
    // The counter moves once the patch's answer is back, a moment after the node changed.
    assert!(
        eventually(Duration::from_secs(5), || (n("add"), n("remove")) == (1, 1)).await,
        "writes counted: add {}, remove {}",
        n("add"),
        n("remove")
    );
    assert_eq!(c.capacity("pool"), 2, "nothing removed");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_bulk_soft_taint_count_zero_no_node_is_soft_tainted() {
    let (c, _busy, idle) = one_busy_node_and_one_unneeded(0).await;
    // Long enough for several passes (every 300 ms) to have seen the node unneeded.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!soft_tainted(&c, &idle));
    assert_eq!(count(&c, &c.metrics.soft_taint_writes_total, &[]), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_with_max_unavailable_zero_keeps_the_node_untouched() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| fast(s, 0)).await;
    let (_, drain) = web_alone_on_the_second_node(&c).await;
    c.kube
        .create(
            "policy/v1",
            "poddisruptionbudgets",
            "default",
            json!({"metadata": {"name": "web"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("pdb");
    tokio::time::sleep(Duration::from_millis(500)).await;
    annotate(&c, &drain, None).await;
    // Unneeded time (1 s) and several passes later: nothing tainted, evicted or deleted.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(c.capacity("pool"), 2);
    assert!(deletes(&c).is_empty());
    assert_eq!(count(&c, &c.metrics.evicted_pods_total, &[]), 0);
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    let node = api.get(&drain).await.expect("node");
    assert!(!has_our_taint(&node));
    assert_eq!(node_of(&c, "web"), [drain]);
    c.stop().await;
}

/// A node's allocatable cpu in millicores.
fn allocatable_cpu(c: &Cluster, node: &str) -> i128 {
    let n = c.kube.get("v1", "nodes", "", node).expect("node");
    let cpu = n
        .pointer("/status/allocatable/cpu")
        .and_then(|v| v.as_str())
        .expect("allocatable cpu");
    vmss_capacity_controller::pods::quantity::parse(cpu).expect("quantity")
}

/// The name of each pod labelled `app` bound to `node`, not being deleted.
fn running_on(c: &Cluster, app: &str, node: &str) -> Vec<String> {
    c.kube
        .list_all("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| p.pointer("/metadata/labels/app").and_then(|v| v.as_str()) == Some(app))
        .filter(|p| p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(node))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|p| {
            p.pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect()
}

/// A drain's first round evicts one of the node's two pods; the other's budget refuses (its
/// guard on the other node was replaced meanwhile and is not Ready yet), and before the retry a
/// new pod takes the room the decision counted on. The drain stops, the node is untainted and
/// keeps the pod left, which would otherwise have been evicted into a wait for a new node's
/// boot. Each pod request waits 3 s in the API server while it happens, so the test acts
/// between the two evictions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_remaining_pods_lose_their_room_stops_and_the_node_keeps_them() {
    use vmss_capacity_controller::emulator::kube::KindDelay;
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| {
        fast(s, 0);
        s.scale_down.node_delete_delay_after_taint = Duration::from_secs(2);
        s.scale_down.max_pod_eviction_time = Duration::from_secs(40);
    })
    .await;
    let names = ready(&c, 2).await;
    for n in &names {
        annotate(&c, n, Some("true")).await;
    }
    let (keep, drain) = (names[0].clone(), names[1].clone());
    let on_keep = |t: PodTemplate| t.node_selector("kubernetes.io/hostname", &keep);
    // On `keep`: a guard of each budget (Ready 8 s after it runs), and `fill`, which leaves
    // 700m free.
    for b in ["p1", "p2"] {
        let t = PodTemplate::new("100m", "64Mi")
            .label("app", b)
            .label("side", "guard")
            .ready_after(Duration::from_secs(8));
        c.kube
            .create_replica_set("default", &format!("{b}-guard"), 1, &on_keep(t))
            .expect("guard");
    }
    let fill = allocatable_cpu(&c, &keep) - 200 - 700;
    c.kube
        .create_replica_set(
            "default",
            "fill",
            1,
            &on_keep(PodTemplate::new(&format!("{fill}m"), "64Mi")),
        )
        .expect("fill");
    assert!(
        eventually(Duration::from_secs(10), || node_of(&c, "fill")
            == [keep.clone()])
        .await
    );
    // On `drain` (`keep` cordoned meanwhile): one pod of each budget, 300m each.
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    let cordon = |on: bool| {
        let api = api.clone();
        let keep = keep.clone();
        async move {
            api.patch(
                &keep,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"unschedulable": on}})),
            )
            .await
            .expect("cordon")
        }
    };
    cordon(true).await;
    for b in ["p1", "p2"] {
        let t = PodTemplate::new("300m", "64Mi")
            .label("app", b)
            .label("side", "moving");
        c.kube
            .create_replica_set("default", b, 1, &t)
            .expect("moving pod");
    }
    let placed = || {
        ["p1", "p2"]
            .iter()
            .all(|b| running_on(&c, b, &drain).len() == 1 && running_on(&c, b, &keep).len() == 1)
            && node_of(&c, "fill") == [keep.clone()]
    };
    assert!(
        eventually(Duration::from_secs(10), placed).await,
        "{:?}",
        c.kube
            .list_all("v1", "pods", Some("default"))
            .iter()
            .map(|p| (p["metadata"]["name"].clone(), p["spec"]["nodeName"].clone()))
            .collect::<Vec<_>>()
    );
    cordon(false).await;
    // The budgets, once the guards are Ready: one disruption each.
    tokio::time::sleep(Duration::from_secs(9)).await;
    for b in ["p1", "p2"] {
        c.kube
            .create(
                "policy/v1",
                "poddisruptionbudgets",
                "default",
                json!({"metadata": {"name": b},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": b}}}}),
            )
            .expect("pdb");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    annotate(&c, &drain, None).await;
    let tainted = || {
        c.kube
            .get("v1", "nodes", "", &drain)
            .ok()
            .and_then(|n| serde_json::from_value::<Node>(n).ok())
            .is_some_and(|n| has_our_taint(&n))
    };
    assert!(
        eventually(Duration::from_secs(20), tainted).await,
        "never tainted"
    );
    c.kube.set_kind_delay(
        "pods",
        KindDelay {
            latency: Duration::from_secs(3),
            slow_answer: Duration::ZERO,
        },
    );
    assert!(
        eventually(Duration::from_secs(20), || count(
            &c,
            &c.metrics.evicted_pods_total,
            &[("result", "evicted")]
        ) == 1)
        .await,
        "the drain never evicted"
    );
    // While the second eviction waits in the server: both guards replaced (their budgets
    // now refuse), and a new pod on `keep` where the pod left was to go.
    for b in ["p1", "p2"] {
        for pod in running_on(&c, b, &keep) {
            c.kube
                .delete("v1", "pods", "default", &pod)
                .expect("guard deleted");
        }
    }
    c.kube
        .create_replica_set(
            "default",
            "late",
            1,
            &on_keep(PodTemplate::new("300m", "64Mi")),
        )
        .expect("late");
    assert!(
        eventually(Duration::from_secs(30), || count(
            &c,
            &c.metrics.failed_scale_downs_total,
            &[("reason", "aborted")]
        ) == 1)
        .await,
        "the drain went on without room for the pod left: failed {:?}, evicted {:?}, pods {:?}",
        ["aborted", "drain_failed", "taint", "refused"].map(|r| count(
            &c,
            &c.metrics.failed_scale_downs_total,
            &[("reason", r)]
        )),
        ["evicted", "blocked", "failed", "gone"].map(|r| count(
            &c,
            &c.metrics.evicted_pods_total,
            &[("result", r)]
        )),
        c.kube
            .list_all("v1", "pods", Some("default"))
            .iter()
            .map(|p| (
                p["metadata"]["name"].clone(),
                p["spec"]["nodeName"].clone(),
                p["status"]["phase"].clone()
            ))
            .collect::<Vec<_>>()
    );
    c.kube.set_kind_delay("pods", KindDelay::default());
    assert!(eventually_untainted(&api).await, "the node kept the taint");
    // The pod left was never evicted and still runs where it ran; nothing was deleted.
    assert_eq!(
        count(&c, &c.metrics.evicted_pods_total, &[("result", "evicted")]),
        1
    );
    let left: Vec<String> = ["p1", "p2"]
        .iter()
        .flat_map(|b| running_on(&c, b, &drain))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(deletes(&c).is_empty());
    assert_eq!(c.capacity("pool"), 2);
    assert_eq!(node_of(&c, "late"), [keep]);
    let names_room = |events: &[k8s_openapi::api::events::v1::Event]| {
        events
            .iter()
            .any(|e| e.note.as_deref().unwrap_or("").contains("no room left"))
    };
    let failed = c.events_once("ScaleDownFailed", names_room).await;
    assert!(names_room(&failed), "{failed:?}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_lands_after_the_taint_aborts_the_deletion_and_the_node_is_untainted() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| {
        fast(s, 1);
        s.scale_down.node_delete_delay_after_taint = Duration::from_secs(3);
    })
    .await;
    ready(&c, 2).await;
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    let mut tainted = None;
    for _ in 0..100 {
        let list = api.list(&Default::default()).await.expect("nodes");
        if let Some(n) = list.items.iter().find(|n| has_our_taint(n)) {
            tainted = n.metadata.name.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tainted = tainted.expect("a node was tainted for removal");
    // A pod bound to it directly (as a static or manually scheduled pod would be).
    c.kube
        .create(
            "v1",
            "pods",
            "default",
            json!({"metadata": {"name": "late", "namespace": "default",
                    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
                "spec": {"nodeName": tainted, "containers": [{"name": "c", "image": "c",
                    "resources": {"requests": {"cpu": "100m"}}}]},
                "status": {"phase": "Running"}}),
        )
        .expect("pod");
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.failed_scale_downs_total,
            &[("reason", "aborted")]
        ) == 1)
        .await,
        "the removal was not aborted"
    );
    let mut untainted = false;
    for _ in 0..50 {
        if !has_our_taint(&api.get(&tainted).await.expect("node")) {
            untainted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(untainted, "the node kept the taint");
    assert!(deletes(&c).is_empty());
    assert_eq!(c.capacity("pool"), 2);
    let names_late = |events: &[k8s_openapi::api::events::v1::Event]| {
        events
            .iter()
            .any(|e| e.note.as_deref().unwrap_or("").contains("default/late"))
    };
    let failed = c.events_once("ScaleDownFailed", names_late).await;
    assert!(names_late(&failed), "{failed:?}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_whose_fresh_read_fails_deletes_nothing_and_untaints_until_azure_answers_again() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| fast(s, 1)).await;
    // Every read of the scale set itself fails (the LIST still works, so the cache has a size:
    // the delete must not trust it).
    c.state.inject_fault(fault(
        Some("GET"),
        Some("virtualMachineScaleSets/pool"),
        status_kind(500, "InternalServerError", None),
        None,
    ));
    ready(&c, 2).await;
    assert!(
        eventually(Duration::from_secs(15), || count(
            &c,
            &c.metrics.failed_scale_downs_total,
            &[("reason", "refused")]
        ) >= 1)
        .await,
        "the removal was not refused"
    );
    assert!(deletes(&c).is_empty(), "deleted from a cached size");
    assert_eq!(c.capacity("pool"), 2);
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    assert!(
        eventually_untainted(&api).await,
        "a refused removal left its node tainted"
    );
    // Azure answers again: the node goes.
    c.state.clear_faults();
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 1).await,
        "the node was not removed once reads worked"
    );
    c.stop().await;
}

async fn eventually_untainted(api: &kube::Api<Node>) -> bool {
    for _ in 0..50 {
        let list = api.list(&Default::default()).await.expect("nodes");
        if !list.items.iter().any(has_our_taint) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_registers_is_deleted_after_max_node_provision_time_down_to_min() {
    use vmss_capacity_controller::emulator::sim::nodes::NEVER_REGISTER_TAG;
    // Two instances whose nodes never come (a broken image), min 1: one goes, by name.
    let c = Cluster::start_simulated(
        &[
            ("general", SIZE, 1, &[]),
            ("broken", SIZE, 2, &[(NEVER_REGISTER_TAG, "true")]),
        ],
        5,
        |s| {
            fast(s, 1);
            s.pod_demand.max_node_provision_time = Duration::from_secs(2);
        },
    )
    .await;
    ready(&c, 1).await;
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("broken") == 1).await,
        "the unregistered instance was not deleted: capacity {}",
        c.capacity("broken")
    );
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "unregistered")]
        ) == 1)
        .await
    );
    // Not below min, and the healthy group is untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.capacity("broken"), 1);
    assert_eq!(c.capacity("general"), 1);
    let sent = deletes(&c);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].path.contains("/broken/") && sent[0].if_match.is_some());
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

/// Makes `node`'s kubelet stop posting (the emulator's `emulator-not-ready` annotation), or
/// lets it post again.
async fn sicken(c: &Cluster, node: &str, sick: bool) {
    use vmss_capacity_controller::emulator::sim::nodes::NOT_READY_ANNOTATION;
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    let value = sick.then_some("true");
    let patch = json!({"metadata": {"annotations": {NOT_READY_ANNOTATION: value}}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("node annotated");
}

fn halted(c: &Cluster, reason: &str) -> i64 {
    c.metrics
        .scale_down_halted
        .with_label_values(&[reason])
        .get()
}

/// Ready nodes `unneededTime` (an hour) keeps; unready ones go after `unreadyTime` (1 s), past a
/// startup window of 1 s.
fn unready_fast(s: &mut Settings, min: u32) {
    fast(s, min);
    s.scale_down.unneeded_time = Duration::from_secs(3600);
    s.scale_down.unready_time = Duration::from_secs(1);
    s.pod_demand.max_node_provision_time = Duration::from_secs(1);
}

/// Issue 41: a node whose kubelet died (Ready turns `Unknown`, nothing confirms its pods'
/// deletion) is removed after `unreadyTime`. The emulator plays it as a real cluster does: the
/// evicted pod gets its `deletionTimestamp` and stays on the node. Once it is long terminating
/// (deleted more than its grace period plus 30 s ago, cluster-autoscaler's rule) it neither
/// holds the drain nor the last look, so the node goes; before, the drain never finished, the
/// removal aborted, the node was untainted and the cycle repeated for the node's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_kubelet_died_is_removed_after_the_unready_time_though_its_pods_never_confirm_their_deletion(
) {
    let c = Cluster::start_simulated(&[("pool", SIZE, 2, &[])], 5, |s| unready_fast(s, 1)).await;
    ready(&c, 2).await;
    // web uses 1.2 of the node's 2 cpus: a Ready node so loaded is never unneeded. A grace
    // period of 0 s keeps the wait for the long-terminating rule at its 30 s.
    let mut web = PodTemplate::new("1200m", "256Mi");
    web.termination_grace_seconds = Some(0);
    c.kube
        .create_replica_set("default", "web", 1, &web)
        .expect("replica set");
    assert!(eventually(Duration::from_secs(10), || node_of(&c, "web").len() == 1).await);
    let sick = node_of(&c, "web").remove(0);
    // The other node is kept out of scale-down, so it is a destination for web (an unneeded
    // node never is: its room may be gone with it).
    let other = nodes(&c)
        .into_iter()
        .find(|n| *n != sick)
        .expect("two nodes");
    annotate(&c, &other, Some("true")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        deletes(&c).is_empty(),
        "a Ready node went: {:?}",
        deletes(&c)
    );
    sicken(&c, &sick, true).await;
    // The eviction leaves the pod terminating on the dead node; its replacement runs elsewhere.
    assert!(
        eventually(Duration::from_secs(15), || {
            c.kube
                .list_all("v1", "pods", Some("default"))
                .iter()
                .any(|p| {
                    p.pointer("/spec/nodeName").and_then(|v| v.as_str()) == Some(sick.as_str())
                        && p.pointer("/metadata/deletionTimestamp").is_some()
                })
        })
        .await,
        "the evicted pod should stay, terminating, on the dead node"
    );
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("pool") == 1).await,
        "the node whose kubelet died was not removed: capacity {}",
        c.capacity("pool")
    );
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "unready")]
        ) == 1)
        .await
    );
    // Exactly the sick node's instance, and web runs on the other node.
    assert!(eventually(Duration::from_secs(5), || !nodes(&c).contains(&sick)).await);
    let sent = deletes(&c);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].if_match.is_some());
    assert!(count(&c, &c.metrics.evicted_pods_total, &[("result", "evicted")]) >= 1);
    assert!(eventually(Duration::from_secs(10), || node_of(&c, "web") == nodes(&c)).await);
    // The pod deleted through the API went with its node: finished, not lost.
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_unready_nodes_halt_scale_down_while_scale_up_goes_on() {
    let c = Cluster::start_simulated(&[("pool", SIZE, 5, &[])], 8, |s| unready_fast(s, 0)).await;
    let names = ready(&c, 5).await;
    // 4 of 5 unready: more than okTotalUnreadyCount (3) and than 45 %.
    for n in &names[1..] {
        sicken(&c, n, true).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || halted(&c, "too_many_unready")
            == 1)
        .await,
        "scale-down never said it halted"
    );
    let why = c.reconciler.status()[0].scale_down_halted.clone();
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("4 of 5 nodes are unready")),
        "the status says why: {why:?}"
    );
    // Scale-up goes on: two 1.5-cpu pods, one Ready node with room for one.
    c.kube
        .create_replica_set("default", "web", 2, &PodTemplate::new("1500m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(20), || node_of(&c, "web").len() == 2).await,
        "web never ran: capacity {}",
        c.capacity("pool")
    );
    assert_eq!(c.capacity("pool"), 6);
    // Still 4 of 6 unready, each past unreadyTime several times over: none goes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(deletes(&c).is_empty(), "deleted: {:?}", deletes(&c));
    assert_eq!(halted(&c, "too_many_unready"), 1);

    // Two recover: 2 unready is within okTotalUnreadyCount, scale-down resumes, and the two
    // still unready (empty) go; the Ready empty ones stay (unneededTime is an hour).
    for n in &names[1..3] {
        sicken(&c, n, false).await;
    }
    assert!(
        eventually(Duration::from_secs(20), || c.capacity("pool") == 4).await,
        "the unready nodes were not removed: capacity {}",
        c.capacity("pool")
    );
    assert_eq!(halted(&c, "too_many_unready"), 0);
    assert_eq!(c.reconciler.status()[0].scale_down_halted, None);
    assert!(
        eventually(Duration::from_secs(10), || count(
            &c,
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "unready")]
        ) == 2)
        .await
    );
    let gone: Vec<String> = names[3..].to_vec();
    assert!(
        eventually(Duration::from_secs(5), || nodes(&c)
            .iter()
            .all(|n| !gone.contains(n)))
        .await
    );
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    c.stop().await;
}

/// Group `idle` (two `Standard_D2s_v5`, floor 1: one empty node it may lose) and group `big`
/// (`Standard_D8s_v5`, none yet); a pod of 4 cpu only `big` can take grows `big`. Returns when
/// `idle`'s empty node went, from the moment `big` grew (`None`: not within 15 minutes).
async fn idle_node_goes_after_big_grows(delay_type_local: bool) -> Option<Duration> {
    use vmss_capacity_controller::emulator::sim::SimSettings;
    let sim = SimSettings {
        boot_delay: Duration::from_secs(60),
        tick: Duration::from_secs(1),
    };
    let c = Cluster::start_simulated_on_tokio_clock(
        &[
            ("idle", "Standard_D2s_v5", 2, &[]),
            ("big", "Standard_D8s_v5", 0, &[]),
        ],
        5,
        sim,
        |s| {
            s.scan_interval = Duration::from_secs(10);
            s.scale_down.enabled = true;
            s.scale_down.unneeded_time = Duration::from_secs(60);
            s.scale_down.delay_type_local = delay_type_local;
            for g in &mut s.node_groups {
                g.min_size = u32::from(g.name == "idle");
            }
        },
    )
    .await;
    assert!(
        eventually(Duration::from_secs(120), || c.kube.ready_nodes().len() == 2).await,
        "idle's two nodes never turned Ready"
    );
    c.kube
        .create_replica_set("default", "wide", 1, &PodTemplate::new("4", "1Gi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(120), || c.capacity("big") == 1).await,
        "big never grew for the 4-cpu pod"
    );
    let grew = tokio::time::Instant::now();
    // The status says when `big` grew (`lastScaleUp`, what `explain` counts the hold from).
    assert!(
        eventually(Duration::from_secs(30), || c
            .reconciler
            .status()
            .iter()
            .any(|g| g.name == "big" && g.last_scale_up.is_some()))
        .await,
        "the status never said when big grew"
    );
    assert!(
        c.reconciler
            .status()
            .iter()
            .all(|g| g.name == "big" || g.last_scale_up.is_none()),
        "idle never grew"
    );
    let went = eventually(Duration::from_secs(15 * 60), || c.capacity("idle") == 1).await;
    let after = went.then(|| grew.elapsed());
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    c.stop().await;
    after
}

#[tokio::test(start_paused = true)]
async fn a_scale_up_of_one_group_holds_scale_down_in_every_group_for_delay_after_add() {
    let after = idle_node_goes_after_big_grows(false)
        .await
        .expect("idle's empty node never went");
    // cluster-autoscaler's default (`--scale-down-delay-type-local=false`): `big` grew, so no
    // group scales down for `delayAfterAdd` (10 min), though `idle`'s node was unneeded long
    // before.
    assert!(
        after >= Duration::from_secs(9 * 60 + 30),
        "idle's empty node went {after:?} after big grew, within delayAfterAdd"
    );
}

#[tokio::test(start_paused = true)]
async fn with_delay_type_local_a_scale_up_holds_scale_down_only_in_the_group_that_grew() {
    let after = idle_node_goes_after_big_grows(true)
        .await
        .expect("idle's empty node never went");
    assert!(
        after < Duration::from_secs(4 * 60),
        "idle's empty node went only {after:?} after big grew: held by another group's growth"
    );
}
