//! Consolidation's replace end to end (issue 45 item 3), in process, against the emulator's
//! cluster simulation: two nodes of a dear group, each holding a pod the other has no room for
//! (no delete can take either), are replaced by one new node of a cheaper group. The new node
//! comes first, through the reconciler's `If-Match` write; a rival's write to the cheaper scale
//! set meanwhile makes that write a 412, re-read and re-planned, and the rival's change stays.
//! A replacement Azure refuses abandons the replace: nothing tainted, evicted or deleted; so
//! does one whose VM never registers a Node, once `maxNodeProvisionTime` has passed.

use crate::consolidating::{annotate, consolidating, running_web};
use crate::support;

use k8s_openapi::api::core::v1::Node;
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;
use vmss_capacity_controller::config::Settings;
use vmss_capacity_controller::emulator::sim::PodTemplate;
use vmss_capacity_controller::emulator::{FaultKind, FaultSpec};
use vmss_capacity_controller::kube::nodes::has_our_taint;
use vmss_capacity_controller::metrics::Metrics;

// The simulation gives a node of an unknown size 2 vCPU (1.9 allocatable) and a D4s_v5 4.
const DEAR: &str = "Standard_D2s_v5";
const CHEAP: &str = "Standard_D4s_v5";

fn replacing(s: &mut Settings) {
    consolidating(s, Duration::from_secs(1));
    s.pod_demand.max_node_provision_time = Duration::from_secs(60);
    s.prices.overrides.insert("dear".into(), 1.0);
    s.prices.overrides.insert("cheap".into(), 0.3);
}

/// Two Ready dear nodes with one 1.2-cpu `web` pod each (neither fits beside the other).
async fn two_dear_nodes(c: &Cluster) -> Vec<String> {
    assert!(
        eventually(Duration::from_secs(10), || c.nodes_of("dear").len() == 2
            && c.kube.ready_nodes().len() == 2)
        .await,
        "never 2 Ready nodes"
    );
    let mut nodes = c.nodes_of("dear");
    nodes.sort();
    // Empty, they would go: kept until the pods run.
    for n in &nodes {
        annotate(c, n, Some("true")).await;
    }
    c.kube
        .create_replica_set("default", "web", 2, &PodTemplate::new("1200m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(10), || {
            let mut on = running_web(c);
            on.sort();
            on == nodes
        })
        .await,
        "web never ran one pod per node: {:?}",
        running_web(c)
    );
    for n in &nodes {
        annotate(c, n, None).await;
    }
    nodes
}

fn puts_to(c: &Cluster, scale_set: &str) -> Vec<vmss_capacity_controller::emulator::RequestRecord> {
    c.state
        .request_log()
        .into_iter()
        .filter(|r| {
            r.method == "PUT"
                && r.path.to_ascii_lowercase().ends_with(&format!(
                    "/virtualmachinescalesets/{}",
                    scale_set.to_ascii_lowercase()
                ))
        })
        .collect()
}

/// Whether the `Unconsolidatable` Events come to satisfy `told` within `within` (looked at every
/// 100 ms).
async fn told_within(
    c: &Cluster,
    within: Duration,
    told: impl Fn(&[k8s_openapi::api::events::v1::Event]) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = false;
    while tokio::time::Instant::now() < deadline && !seen {
        seen = told(&c.events("Unconsolidatable").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// An abandoned replace took nothing: both dear nodes still there, none deleted, tainted or
/// drained, the web pods where they ran, the abort counted, no update lost.
async fn nothing_taken(c: &Cluster, nodes: &[String]) {
    assert_eq!(c.capacity("dear"), 2);
    let dear_deleted: Vec<_> = c
        .state
        .instance_deletions()
        .into_iter()
        .filter(|d| d.scale_set == "dear")
        .collect();
    assert!(dear_deleted.is_empty(), "{dear_deleted:?}");
    assert_eq!(Metrics::counter_sum(&c.metrics.evicted_pods_total, &[]), 0);
    let api: kube::Api<Node> = kube::Api::all(c.client.clone());
    for n in nodes {
        assert!(
            !has_our_taint(&api.get(n).await.expect("node")),
            "{n} tainted"
        );
    }
    let mut on = running_web(c);
    on.sort();
    assert_eq!(on, nodes, "the web pods still run where they ran");
    assert!(
        Metrics::counter_sum(
            &c.metrics.failed_scale_downs_total,
            &[("reason", "replace_aborted")]
        ) >= 1
    );
    assert!(c.state.lost_updates().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dear_nodes_are_replaced_by_one_cheaper_node_whose_write_meets_a_rivals_412_without_losing_it(
) {
    let c = Cluster::start_simulated(
        &[("dear", DEAR, 2, &[]), ("cheap", CHEAP, 0, &[])],
        5,
        replacing,
    )
    .await;
    let cheap = c.scale_set_name("cheap");
    // The replacement's write is held a moment on its way, so a rival writes first.
    c.state.inject_fault(FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some(format!("virtualMachineScaleSets/{cheap}")),
        kind: FaultKind::Latency {
            ms: 1500,
            max_ms: None,
        },
        count: Some(1),
        probability: None,
        seed: None,
    });
    let before = two_dear_nodes(&c).await;
    // The replace is launched: each dear node is told, before its write lands.
    let launched = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut seen = false;
        while tokio::time::Instant::now() < deadline && !seen {
            seen = c.events("Consolidating").await.iter().any(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("replacing 2 node(s)"))
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    };
    assert!(
        launched,
        "no replace launched: {:?}",
        c.events("Unconsolidatable").await
    );
    // A rival tags the cheap scale set (a new ETag) while the write is on its way.
    let mut tags = std::collections::BTreeMap::new();
    tags.insert("owner".to_string(), "rival".to_string());
    c.state
        .rival_set_tags(SUB, RG, &cheap, tags, "rival")
        .expect("rival write");
    // The new node comes, then both dear nodes go and their pods run on it.
    assert!(
        eventually(Duration::from_secs(40), || c.capacity("dear") == 0
            && c.capacity("cheap") == 1)
        .await,
        "not replaced: dear {} cheap {}",
        c.capacity("dear"),
        c.capacity("cheap")
    );
    let new = c.nodes_of("cheap");
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        eventually(Duration::from_secs(15), || running_web(&c)
            == vec![new[0].clone(); 2])
        .await,
        "web pods not running on {}: {:?}",
        new[0],
        running_web(&c)
    );
    // The write met the rival's 412, was re-read and re-planned, and sent again with the fresh
    // ETag; the rival's tag is still there; no update was lost.
    let puts = puts_to(&c, &cheap);
    assert!(puts.iter().all(|r| r.if_match.is_some()), "{puts:?}");
    assert_eq!(puts.first().map(|r| r.status), Some(412), "{puts:?}");
    assert!(
        puts.iter()
            .any(|r| (200..300).contains(&r.status) && r.body_capacity == Some(1)),
        "{puts:?}"
    );
    assert_eq!(
        puts.iter()
            .filter(|r| (200..300).contains(&r.status))
            .count(),
        1,
        "one growth: {puts:?}"
    );
    let view = c.state.scale_set(SUB, RG, &cheap).expect("cheap scale set");
    assert_eq!(
        view.tags.get("owner").map(String::as_str),
        Some("rival"),
        "{:?}",
        view.tags
    );
    assert!(
        c.state.lost_updates().is_empty(),
        "{:?}",
        c.state.lost_updates()
    );
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    // Both dear instances deleted by instance, under If-Match.
    let deleted: usize = c
        .state
        .instance_deletions()
        .iter()
        .map(|d| d.machines.len())
        .sum();
    assert_eq!(deleted, 2);
    assert!(
        eventually(Duration::from_secs(10), || before
            .iter()
            .all(|n| !c.nodes_of("dear").contains(n)))
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || Metrics::counter_sum(
            &c.metrics.scaled_down_nodes_total,
            &[("reason", "consolidation")]
        ) == 2)
        .await
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_azure_refuses_abandons_the_replace_with_nothing_tainted_or_lost() {
    let c = Cluster::start_simulated(
        &[("dear", DEAR, 2, &[]), ("cheap", CHEAP, 0, &[])],
        5,
        replacing,
    )
    .await;
    let cheap = c.scale_set_name("cheap");
    // Azure accepts the growth, then its operation fails: no VM comes.
    c.state.inject_fault(FaultSpec {
        method: Some("PUT".into()),
        path_contains: Some(format!("virtualMachineScaleSets/{cheap}")),
        kind: FaultKind::LroFailed {
            code: Some("AllocationFailed".into()),
            zone: None,
        },
        count: Some(1),
        probability: None,
        seed: None,
    });
    let nodes = two_dear_nodes(&c).await;
    let abandoned = |events: &[k8s_openapi::api::events::v1::Event]| {
        let on: std::collections::BTreeSet<String> = events
            .iter()
            .filter(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("replace abandoned") && n.contains("does not come"))
            })
            .filter_map(|e| e.regarding.as_ref().and_then(|r| r.name.clone()))
            .collect();
        // (The recorder folds a node's later Events of one reason into the first's series, so
        // a node told something else before shows that note.)
        !on.is_empty()
    };
    let seen = told_within(&c, Duration::from_secs(40), abandoned).await;
    assert!(
        seen,
        "the replace was not abandoned: {:?}",
        c.events("Unconsolidatable").await
    );
    // It was launched (one write to the cheap group), never acted on.
    assert!(!puts_to(&c, &cheap).is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    // (The cheap group's failed VM is Azure's and the controller's usual business.)
    nothing_taken(&c, &nodes).await;
    // Azure's refusal marks the cheap offering out, as for a scale-up: no replace is launched
    // again meanwhile (a single write to the cheap group).
    assert_eq!(puts_to(&c, &cheap).len(), 1, "{:?}", puts_to(&c, &cheap));
    c.stop().await;
}

/// A replacement Azure creates but whose VM never registers a Node (a broken image, a bootstrap
/// that fails): no refusal to read, so the replace waits `maxNodeProvisionTime` for its new node
/// and is abandoned then, with nothing tainted, evicted or deleted.
#[tokio::test(start_paused = true)]
async fn a_replacement_that_never_registers_abandons_the_replace_after_max_node_provision_time() {
    use vmss_capacity_controller::emulator::sim::nodes::NEVER_REGISTER_TAG;
    use vmss_capacity_controller::emulator::sim::SimSettings;
    let c = Cluster::start_simulated_on_tokio_clock(
        &[
            ("dear", DEAR, 2, &[]),
            ("cheap", CHEAP, 0, &[(NEVER_REGISTER_TAG, "true")]),
        ],
        5,
        SimSettings {
            boot_delay: Duration::from_millis(200),
            tick: Duration::from_millis(20),
        },
        |s| {
            replacing(s);
            s.pod_demand.max_node_provision_time = Duration::from_secs(4);
        },
    )
    .await;
    let cheap = c.scale_set_name("cheap");
    let nodes = two_dear_nodes(&c).await;
    let timed_out = |events: &[k8s_openapi::api::events::v1::Event]| {
        events.iter().any(|e| {
            e.note.as_deref().is_some_and(|n| {
                n.contains("replace abandoned")
                    && n.contains("not Ready within maxNodeProvisionTime")
                    && n.contains("no replace asks it again for 5m")
            })
        })
    };
    let seen = told_within(&c, Duration::from_secs(40), timed_out).await;
    assert!(
        seen,
        "the replace was not abandoned for its timeout: {:?}",
        c.events("Unconsolidatable").await
    );
    // It was launched: the cheap group grew, and its VM is there without a Node.
    assert!(!puts_to(&c, &cheap).is_empty());
    assert!(c.nodes_of("cheap").is_empty(), "{:?}", c.nodes_of("cheap"));
    nothing_taken(&c, &nodes).await;
    // Its group is backed off for replaces (5 min first): three more `maxNodeProvisionTime`s
    // later nothing asked it again (before, a replace grew it, timed out and had its VM
    // cleaned up every few seconds).
    let grown = puts_to(&c, &cheap).len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        puts_to(&c, &cheap).len(),
        grown,
        "the replace asked the group whose node never came again"
    );
    c.stop().await;
}

/// With consolidation held 10 min after a scale-up of any group (`consolidation.delayAfterAdd`,
/// as cluster-autoscaler's `delayAfterAdd` holds its scale-down): the replace's own growth of the
/// cheaper group is no scale-up, so it does not hold the replace it launched (before, every
/// replace was abandoned on re-validation, its new node left for scale-down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replace_is_not_held_by_delay_after_add_for_the_growth_it_launched_itself() {
    let c = Cluster::start_simulated(
        &[("dear", DEAR, 2, &[]), ("cheap", CHEAP, 0, &[])],
        5,
        |s| {
            replacing(s);
            s.scale_down.delay_after_add = Duration::from_secs(600);
            s.consolidation.delay_after_add = Duration::from_secs(600);
        },
    )
    .await;
    two_dear_nodes(&c).await;
    assert!(
        eventually(Duration::from_secs(40), || c.capacity("dear") == 0
            && c.capacity("cheap") == 1)
        .await,
        "not replaced: dear {} cheap {}; {:?}",
        c.capacity("dear"),
        c.capacity("cheap"),
        c.events("Unconsolidatable").await
    );
    assert_eq!(
        Metrics::counter_sum(
            &c.metrics.failed_scale_downs_total,
            &[("reason", "consolidation_invalid")]
        ),
        0
    );
    c.stop().await;
}

/// The pods of the Job `name` by phase: (running, succeeded), and the Job's `status.failed`.
fn job_state(c: &Cluster, name: &str) -> (usize, usize, i64) {
    let pods = c.kube.list_all("v1", "pods", Some("default"));
    let mine = |p: &&serde_json::Value| {
        p.pointer("/metadata/labels/job-name")
            .and_then(|v| v.as_str())
            == Some(name)
    };
    let phase = |want: &str| {
        pods.iter()
            .filter(mine)
            .filter(|p| p.pointer("/status/phase").and_then(|v| v.as_str()) == Some(want))
            .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
            .count()
    };
    let failed = c
        .kube
        .get("batch/v1", "jobs", "default", name)
        .ok()
        .and_then(|j| j.pointer("/status/failed").and_then(|v| v.as_i64()))
        .unwrap_or(0);
    (phase("Running"), phase("Succeeded"), failed)
}

/// Waits for `n` Ready dear nodes and annotates each `scale-down-disabled`, so nothing is removed
/// while the test places its pods; returns their names.
async fn held_dear_nodes(c: &Cluster, n: usize) -> Vec<String> {
    assert!(
        eventually(Duration::from_secs(10), || c.nodes_of("dear").len() == n
            && c.kube.ready_nodes().len() == n)
        .await,
        "never {n} Ready nodes"
    );
    let nodes = c.nodes_of("dear");
    for node in &nodes {
        annotate(c, node, Some("true")).await;
    }
    nodes
}

async fn a_jobs_running_pod_and_a_web_pod_on_two_dear_nodes(c: &Cluster, runs: Duration) {
    let nodes = held_dear_nodes(c, 2).await;
    // 1.2 cpu each on 1.9-cpu nodes: one per node, and either would move to one cheap node.
    c.kube
        .create_replica_set("default", "web", 1, &PodTemplate::new("1200m", "256Mi"))
        .expect("replica set");
    c.kube
        .create_job(
            "default",
            "batch",
            1,
            &PodTemplate::new("1200m", "256Mi").runs_for(runs),
        )
        .expect("job");
    assert!(
        eventually(Duration::from_secs(10), || running_web(c).len() == 1
            && job_state(c, "batch").0 == 1)
        .await,
        "web and the job never both ran"
    );
    for n in &nodes {
        annotate(c, n, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consolidation_waits_for_a_jobs_running_pod_to_end_instead_of_evicting_it_and_its_node_goes_after(
) {
    const RUNS: Duration = Duration::from_secs(20);
    let c = Cluster::start_simulated(
        &[("dear", DEAR, 2, &[]), ("cheap", CHEAP, 0, &[])],
        5,
        replacing,
    )
    .await;
    a_jobs_running_pod_and_a_web_pod_on_two_dear_nodes(&c, RUNS).await;
    let released = tokio::time::Instant::now();
    // The node of the Job's pod is told why it stays.
    assert!(
        told_within(&c, Duration::from_secs(15), |events| events.iter().any(
            |e| e
                .note
                .as_deref()
                .is_some_and(|n| n.contains("default/batch-")
                    && n.contains("runs to completion")
                    && n.contains("consolidation.disruptJobs"))
        ))
        .await,
        "no Unconsolidatable Event named the Job's pod"
    );
    // Its run is never cut: until it ends, the Job's pod runs and nothing failed.
    while released.elapsed() < RUNS - Duration::from_secs(2) {
        let (running, succeeded, failed) = job_state(&c, "batch");
        assert_eq!(
            (running + succeeded, failed),
            (1, 0),
            "the Job's pod was disrupted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Then it succeeds, once, and the dear nodes go: the web pod onto a cheap node.
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("dear") == 0
            && c.capacity("cheap") == 1
            && running_web(&c).len() == 1)
        .await,
        "never consolidated after the Job's pod ended: dear {}, cheap {}",
        c.capacity("dear"),
        c.capacity("cheap")
    );
    assert_eq!(job_state(&c, "batch").2, 0, "the Job counted a failure");
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

/// Three dear nodes: two keep a 1.2-cpu `web` pod each and stay (annotated
/// `scale-down-disabled`), the third runs a Job's 0.6-cpu pod, 32 % of it: under
/// cluster-autoscaler's 50 % threshold, and the pod would fit beside either `web` pod.
async fn a_jobs_pod_alone_on_an_underused_node(c: &Cluster, runs: Duration) -> String {
    let nodes = held_dear_nodes(c, 3).await;
    c.kube
        .create_replica_set("default", "web", 2, &PodTemplate::new("1200m", "256Mi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(10), || running_web(c).len() == 2).await,
        "web never ran"
    );
    c.kube
        .create_job(
            "default",
            "batch",
            1,
            &PodTemplate::new("600m", "256Mi").runs_for(runs),
        )
        .expect("job");
    assert!(
        eventually(Duration::from_secs(10), || job_state(c, "batch").0 == 1).await,
        "the job never ran"
    );
    let web = running_web(c);
    let job_node = nodes
        .iter()
        .find(|n| !web.contains(n))
        .expect("the Job's pod has a node of its own")
        .clone();
    annotate(c, &job_node, None).await;
    job_node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_consolidation_on_the_scale_down_of_underused_nodes_waits_for_a_jobs_running_pod_too()
{
    const RUNS: Duration = Duration::from_secs(20);
    let c = Cluster::start_simulated(&[("dear", DEAR, 3, &[])], 5, |s| {
        replacing(s);
        // cluster-autoscaler's threshold: the Job's node (32 %) is underused, the others not.
        s.scale_down.utilization_threshold = 0.5;
    })
    .await;
    let job_node = a_jobs_pod_alone_on_an_underused_node(&c, RUNS).await;
    let released = tokio::time::Instant::now();
    // Neither consolidation nor the scale-down of underused nodes (1 s unneeded here) evicts
    // it: until the run ends the Job's pod runs, and nothing failed.
    while released.elapsed() < RUNS - Duration::from_secs(2) {
        let (running, succeeded, failed) = job_state(&c, "batch");
        assert_eq!(
            (running + succeeded, failed),
            (1, 0),
            "the Job's pod was disrupted"
        );
        assert!(
            c.nodes_of("dear").contains(&job_node),
            "its node was removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Then it succeeds and its node, empty, goes.
    assert!(
        eventually(Duration::from_secs(60), || !c
            .nodes_of("dear")
            .contains(&job_node)
            && c.capacity("dear") == 2)
        .await,
        "the Job's node never went after its pod ended: dear {}",
        c.capacity("dear")
    );
    let job = c
        .kube
        .get("batch/v1", "jobs", "default", "batch")
        .expect("the Job");
    assert_eq!(
        (
            job.pointer("/status/succeeded").and_then(|v| v.as_i64()),
            job.pointer("/status/failed").and_then(|v| v.as_i64())
        ),
        (Some(1), Some(0)),
        "{job}"
    );
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_disrupt_jobs_consolidation_evicts_a_jobs_running_pod_as_karpenter_does() {
    let c = Cluster::start_simulated(
        &[("dear", DEAR, 2, &[]), ("cheap", CHEAP, 0, &[])],
        5,
        |s| {
            replacing(s);
            s.consolidation.disrupt_jobs = true;
        },
    )
    .await;
    a_jobs_running_pod_and_a_web_pod_on_two_dear_nodes(&c, Duration::from_secs(600)).await;
    // Both dear nodes go long before the run would end: the Job's pod was evicted and runs
    // again on the cheap node, its first run counted as a failure.
    assert!(
        eventually(Duration::from_secs(60), || c.capacity("dear") == 0
            && job_state(&c, "batch").2 == 1
            && job_state(&c, "batch").0 == 1)
        .await,
        "the Job's pod was never evicted: dear {}, job {:?}",
        c.capacity("dear"),
        job_state(&c, "batch")
    );
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}
