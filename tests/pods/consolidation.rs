//! Consolidation end to end (issue 45 item 3), in process, against the emulator's cluster
//! simulation: three underused nodes of an expensive group, which cluster-autoscaler's threshold
//! alone would keep, consolidate onto one; the pods are evicted under their budget, re-created,
//! and run on the node that stays; every delete carries `If-Match` and no update is lost. A pod
//! nominated to a candidate while the decision waits for its re-validation abandons it. With a
//! stabilization window, moves wait while the pods' requests rise, then go.

use crate::consolidating::{annotate, consolidating, running_web};
use crate::support;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;
use vmss_capacity_controller::emulator::sim::PodTemplate;
use vmss_capacity_controller::kube::nodes::has_our_taint;

const DEAR: &str = "Standard_D8s_v3";
// (The simulation gives every node about 2 cpu whatever its size; the price is the size's.)

/// Three Ready nodes with one `web` pod each (the simulation's scheduler spreads them), under a
/// budget that lets one go at a time.
async fn three_underused_nodes(c: &Cluster) -> Vec<String> {
    three_underused_nodes_then(c, || async {}).await
}

/// [`three_underused_nodes`], with `before_release` awaited once the pods run and before the
/// nodes may go.
async fn three_underused_nodes_then<F: std::future::Future<Output = ()>>(
    c: &Cluster,
    before_release: impl FnOnce() -> F,
) -> Vec<String> {
    assert!(
        eventually(Duration::from_secs(10), || c.kube.ready_nodes().len() == 3).await,
        "never 3 Ready nodes"
    );
    let mut nodes = c.kube.ready_nodes();
    nodes.sort();
    // Empty, they would go (scale-down's empty nodes, or consolidation): kept until the pods
    // are spread.
    for n in &nodes {
        annotate(c, n, Some("true")).await;
    }
    c.kube
        .create(
            "policy/v1",
            "poddisruptionbudgets",
            "default",
            json!({"metadata": {"name": "web"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("pdb");
    c.kube
        .create_replica_set("default", "web", 3, &PodTemplate::new("300m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(10), || {
            let mut on = running_web(c);
            on.sort();
            on.dedup();
            on.len() == 3
        })
        .await,
        "web never ran one pod per node"
    );
    before_release().await;
    for n in &nodes {
        annotate(c, n, None).await;
    }
    nodes
}

/// Whether the Events of `reason` come to satisfy `cond` within `patience`.
async fn events_until(
    c: &Cluster,
    reason: &str,
    patience: Duration,
    cond: impl Fn(&[k8s_openapi::api::events::v1::Event]) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        if cond(&c.events(reason).await) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn deletes(c: &Cluster) -> Vec<vmss_capacity_controller::emulator::RequestRecord> {
    c.state
        .request_log()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/delete"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_underused_nodes_of_an_expensive_group_consolidate_onto_one_with_every_delete_guarded(
) {
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        consolidating(s, Duration::from_secs(1))
    })
    .await;
    let before = three_underused_nodes(&c).await;
    // The budget must hold throughout: at least two web pods running at every look.
    let sampler = {
        let kube = c.kube.clone();
        tokio::spawn(async move {
            let mut least = usize::MAX;
            for _ in 0..400 {
                let n = kube
                    .list_all("v1", "pods", Some("default"))
                    .into_iter()
                    .filter(|p| {
                        p.pointer("/metadata/labels/app").and_then(|v| v.as_str()) == Some("web")
                    })
                    .filter(|p| {
                        p.pointer("/status/phase").and_then(|v| v.as_str()) == Some("Running")
                    })
                    .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
                    .count();
                least = least.min(n);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            least
        })
    };
    assert!(
        eventually(Duration::from_secs(40), || c.capacity("dear") == 1).await,
        "the underused nodes were not consolidated: capacity {}",
        c.capacity("dear")
    );
    // The deleted instances' Nodes go a moment after the capacity drops.
    assert!(
        eventually(Duration::from_secs(10), || c.nodes_of("dear").len() == 1).await,
        "{:?}",
        c.nodes_of("dear")
    );
    let left = c.nodes_of("dear");
    assert!(before.contains(&left[0]));
    // Every web pod was evicted through the API, re-created, and runs on the node that stays.
    assert!(
        eventually(Duration::from_secs(10), || running_web(&c)
            == vec![left[0].clone(); 3])
        .await,
        "web pods not all running on {}: {:?}",
        left[0],
        running_web(&c)
    );
    assert!(
        sampler.await.unwrap() >= 2,
        "the PodDisruptionBudget was violated"
    );
    assert!(
        c._emulator.pods_lost_with_nodes().is_empty(),
        "{:?}",
        c._emulator.pods_lost_with_nodes()
    );
    // One guarded delete of the two instances.
    let sent = deletes(&c);
    assert!(!sent.is_empty());
    assert!(
        sent.iter().all(|r| r.if_match.is_some()),
        "every delete carries If-Match: {sent:?}"
    );
    let deleted: usize = c
        .state
        .instance_deletions()
        .iter()
        .map(|d| d.machines.len())
        .sum();
    assert_eq!(deleted, 2);
    assert!(
        c.state.lost_updates().is_empty(),
        "{:?}",
        c.state.lost_updates()
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            vmss_capacity_controller::metrics::Metrics::counter_sum(
                &c.metrics.scaled_down_nodes_total,
                &[("reason", "consolidation")],
            ) == 2
        })
        .await
    );
    let events = c.events("Consolidating").await;
    let mut on: Vec<String> = events
        .iter()
        .filter_map(|e| e.regarding.as_ref().and_then(|r| r.name.clone()))
        .collect();
    on.sort();
    on.dedup();
    let mut gone: Vec<String> = before.iter().filter(|n| **n != left[0]).cloned().collect();
    gone.sort();
    assert_eq!(
        on, gone,
        "a Consolidating Event on each removed node: {events:?}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_wait_out_the_stabilization_window_after_the_pods_requests_rose_and_then_go() {
    const WINDOW: Duration = Duration::from_secs(12);
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        consolidating(s, Duration::from_secs(1));
        s.consolidation.stabilization_window = WINDOW;
    })
    .await;
    // Once web runs and the controller has looked at it (the annotated nodes are told they are
    // kept), one more pod: a rise.
    let started = std::sync::Mutex::new(None);
    three_underused_nodes_then(&c, || async {
        assert!(
            events_until(&c, "Unconsolidatable", Duration::from_secs(20), |e| {
                e.iter()
                    .any(|e| e.note.as_deref().is_some_and(|n| n.contains("annotated")))
            })
            .await,
            "the controller never looked at the annotated nodes"
        );
        c.kube
            .create_replica_set("default", "extra", 1, &PodTemplate::new("100m", "64Mi"))
            .expect("replica set");
        *started.lock().unwrap() = Some(tokio::time::Instant::now());
    })
    .await;
    let started = started.into_inner().unwrap().expect("the rise");
    // Held: for most of the window, nothing evicted and every node kept. (Without the window
    // the first eviction comes about 2 s after the release.)
    while started.elapsed() < WINDOW * 2 / 3 {
        assert_eq!(
            vmss_capacity_controller::metrics::Metrics::counter_sum(
                &c.metrics.evicted_pods_total,
                &[]
            ),
            0,
            "evicted {:?} after the rise, within the window",
            started.elapsed()
        );
        assert_eq!(c.capacity("dear"), 3);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Told why, beside the annotation's Event (another kind of reason: another Event).
    let notes: Vec<String> = c
        .events("Unconsolidatable")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("stabilizationWindow")),
        "no node was told it waits for the window: {notes:?}"
    );
    assert!(notes.iter().any(|n| n.contains("annotated")), "{notes:?}");
    // Once the requests have stayed flat for the window, the underused nodes go.
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("dear") == 1).await,
        "never consolidated after the window: capacity {}",
        c.capacity("dear")
    );
    assert!(
        started.elapsed() >= WINDOW,
        "consolidated {:?} after the rise, within the window",
        started.elapsed()
    );
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_nominated_to_a_candidate_during_re_validation_abandons_the_consolidation() {
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        consolidating(s, Duration::from_secs(4))
    })
    .await;
    let nodes = three_underused_nodes(&c).await;
    // The decision is taken: the node that stays is told why it is not consolidated.
    assert!(
        events_until(&c, "Unconsolidatable", Duration::from_secs(30), |e| {
            e.iter()
                .any(|e| e.note.as_deref().is_some_and(|n| n.contains("do not")))
        })
        .await,
        "no decision"
    );
    // Before its re-validation, a preemptor is nominated to every node (another scheduler's
    // pod: the simulation leaves it pending).
    for n in &nodes {
        c.kube
            .create(
                "v1",
                "pods",
                "default",
                json!({
                    "metadata": {"name": format!("preemptor-{n}"), "namespace": "default",
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "batch", "uid": "batch-uid", "controller": true}]},
                    "spec": {"schedulerName": "other-scheduler", "containers": [{"name": "app", "image": "app",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
                    "status": {"phase": "Pending", "nominatedNodeName": n},
                }),
            )
            .expect("pod created");
    }
    let abandoned = |events: &[k8s_openapi::api::events::v1::Event]| {
        events.iter().any(|e| {
            e.note.as_deref().is_some_and(|n| {
                n.contains("abandoned on re-validation") && n.contains("nominated")
            })
        })
    };
    assert!(
        events_until(&c, "Unconsolidatable", Duration::from_secs(30), abandoned).await,
        "the consolidation was not abandoned on re-validation: {:?}",
        c.events("Unconsolidatable").await
    );
    // Nothing tainted, evicted or deleted; later passes do not decide it again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.capacity("dear"), 3);
    assert!(deletes(&c).is_empty());
    assert_eq!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(&c.metrics.evicted_pods_total, &[]),
        0
    );
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    for n in &nodes {
        assert!(
            !has_our_taint(&api.get(n).await.expect("node")),
            "{n} tainted"
        );
    }
    assert!(c.events("Consolidating").await.is_empty());
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

/// The web pods (Running, not being deleted) carrying a deletion-cost hint: (pod, node, cost).
fn hinted_web(c: &Cluster) -> Vec<(String, String, String)> {
    c.kube
        .list_all("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| p.pointer("/metadata/labels/app").and_then(|v| v.as_str()) == Some("web"))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|p| {
            let a = &p["metadata"]["annotations"];
            let cost = a["controller.kubernetes.io/pod-deletion-cost"].as_str()?;
            (a["vmss-capacity-controller/pod-deletion-cost"].as_str() == Some(cost)).then(|| {
                (
                    p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
                    cost.to_string(),
                )
            })
        })
        .collect()
}

/// On three Ready nodes (scale-down held by annotations meanwhile), six `web` pods, two per
/// node; once the nodes are released, waits until one node's two pods carry the hint and
/// returns them (pod, node, cost).
async fn web_two_per_node_until_one_node_is_hinted(c: &Cluster) -> Vec<(String, String, String)> {
    assert!(
        eventually(Duration::from_secs(10), || c.kube.ready_nodes().len() == 3).await,
        "never 3 Ready nodes"
    );
    let nodes = c.kube.ready_nodes();
    for n in &nodes {
        annotate(c, n, Some("true")).await;
    }
    c.kube
        .create_replica_set("default", "web", 6, &PodTemplate::new("300m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(10), || {
            let on = running_web(c);
            on.len() == 6
                && nodes
                    .iter()
                    .all(|n| on.iter().filter(|o| *o == n).count() == 2)
        })
        .await,
        "web never ran two pods per node: {:?}",
        running_web(c)
    );
    for n in &nodes {
        annotate(c, n, None).await;
    }
    let mut hinted = Vec::new();
    assert!(
        eventually(Duration::from_secs(15), || {
            hinted = hinted_web(c);
            hinted.len() == 2 && hinted[0].1 == hinted[1].1
        })
        .await,
        "no node's pods were hinted: {hinted:?}"
    );
    hinted
}

/// `consolidation.deletionCostHints`: with a budget that lets consolidation remove nothing, the
/// best candidate's pods get the lowest deletion cost, and a Deployment's scale-in then takes
/// exactly those pods (the emulator's ReplicaSet controller ranks by the cost as
/// kube-controller-manager does): the node is emptied without one eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_in_empties_the_node_the_deletion_cost_hints_name_without_an_eviction() {
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        consolidating(s, Duration::from_secs(1));
        s.consolidation.budgets = vec![vmss_capacity_controller::config::Budget {
            nodes: vmss_capacity_controller::config::BudgetNodes::Count(0),
            reasons: None,
            schedule: None,
        }];
        s.consolidation.deletion_cost_hints = 1;
    })
    .await;
    // The best candidate's two pods, and only they, carry the hint (-1: one node hinted).
    let hinted = web_two_per_node_until_one_node_is_hinted(&c).await;
    assert!(hinted.iter().all(|h| h.2 == "-1"), "{hinted:?}");
    let node = hinted[0].1.clone();
    c.kube
        .scale_replica_set("default", "web", 4)
        .expect("scaled in");
    assert!(
        eventually(Duration::from_secs(10), || running_web(&c).len() == 4).await,
        "{:?}",
        running_web(&c)
    );
    let on = running_web(&c);
    assert!(
        !on.contains(&node),
        "the scale-in took the hinted node's pods: {node} still runs web: {on:?}"
    );
    assert_eq!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &c.metrics.evicted_pods_total,
            &[("result", "evicted")],
        ),
        0,
        "nothing was evicted"
    );
    assert!(
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &c.metrics.deletion_cost_hints_total,
            &[("action", "set"), ("result", "ok")],
        ) >= 2
    );
    c.stop().await;
}

/// `consolidation.emptyFirst`: the hinted node's pods are not evicted before it has been hinted
/// that long, so a scale-in meanwhile empties it and it goes with no eviction; past it, the next
/// hinted node's pods are moved as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_empty_first_a_hinted_node_waits_for_a_scale_in_and_goes_without_an_eviction() {
    const EMPTY_FIRST: Duration = Duration::from_secs(8);
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        consolidating(s, Duration::from_secs(1));
        s.consolidation.deletion_cost_hints = 1;
        s.consolidation.empty_first = EMPTY_FIRST;
    })
    .await;
    let hinted = web_two_per_node_until_one_node_is_hinted(&c).await;
    let node = hinted[0].1.clone();
    let evicted = || {
        vmss_capacity_controller::metrics::Metrics::counter_sum(
            &c.metrics.evicted_pods_total,
            &[("result", "evicted")],
        )
    };
    // Every node's pods fit on the others, yet within emptyFirst none is evicted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(evicted(), 0, "evicted within emptyFirst");
    assert_eq!(c.capacity("dear"), 3);
    c.kube
        .scale_replica_set("default", "web", 4)
        .expect("scaled in");
    assert!(
        eventually(Duration::from_secs(15), || !c
            .kube
            .ready_nodes()
            .contains(&node))
        .await,
        "the emptied node stayed"
    );
    assert_eq!(evicted(), 0, "the hinted node went empty, with no eviction");
    // Past emptyFirst the next hinted node's pods move as consolidation moves them.
    assert!(
        eventually(Duration::from_secs(30), || c.capacity("dear") == 1).await,
        "the two nodes left were not consolidated"
    );
    assert!(evicted() >= 1);
    assert!(
        c._emulator.pods_lost_with_nodes().is_empty(),
        "{:?}",
        c._emulator.pods_lost_with_nodes()
    );
    c.stop().await;
}
