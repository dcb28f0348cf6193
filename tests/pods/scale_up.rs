//! `demand: pods` end to end, in process: the emulator's ARM side (scale sets) and Kubernetes
//! side (pending pods, nodes), the reflectors, the scale-up loop and the reconciler wired as
//! `run` wires them. Real time with short batch windows (one test on tokio's paused clock with
//! production timings); every wait is bounded.

use crate::support;

use support::pod_cluster::{Cluster, GPU_TAINT_TAG};

use serde_json::json;
use std::time::Duration;
use support::*;

/// Polls an async condition every 100 ms for at most 10 s.
async fn eventually_async<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pending_pods_makes_exactly_one_write_per_group_sized_for_all_of_them() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 20).await;
    // 30 pods of 1 cpu, arriving over ~0.3 s: one batch.
    for i in 0..30 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") > 0).await,
        "no scale-up"
    );
    // Let any second write show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.capacity_puts("general"),
        1,
        "one write for the whole burst"
    );
    // A D4s_v5 keeps 3 whole cpus allocatable after AKS's reservations: 10 nodes for 30 pods.
    assert_eq!(c.capacity("general"), 10);
    assert_eq!(
        c.metrics
            .scaled_up_nodes_total
            .with_label_values(&["general"])
            .get(),
        10
    );
    assert!(
        eventually_async(|| async { c.events("TriggeredScaleUp").await.len() == 30 }).await,
        "one TriggeredScaleUp Event per pod: {}",
        c.events("TriggeredScaleUp").await.len()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_pending_pod_gets_a_node_from_a_group_at_zero() {
    // Default batch windows (1 s idle, 10 s at most).
    let c = Cluster::start_with(&[("general", "Standard_D4s_v5", 0, &[])], 10, |_| {}).await;
    c.pending("lonely", "1", "1Gi", json!({}));
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 1
            && c.capacity_puts("general") == 1)
        .await,
        "capacity {}, writes {}",
        c.capacity("general"),
        c.capacity_puts("general")
    );
    // Nothing more: the pod's node is on its way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.capacity_puts("general"), 1);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tainted_gpu_group_scales_from_zero_only_for_pods_that_tolerate_its_taint() {
    let c = Cluster::start(
        &[
            ("general", "Standard_D4s_v5", 0, &[]),
            (
                "gpu",
                "Standard_NC6s_v3",
                0,
                &[(GPU_TAINT_TAG, "gpu:NoSchedule")],
            ),
        ],
        10,
    )
    .await;
    for i in 0..4 {
        c.pending(&format!("web-{i}"), "500m", "512Mi", json!({}));
    }
    let cuda = json!({
        "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "containers": [{"name": "train", "image": "train", "resources": {
            "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"}}}],
    });
    c.pending("train-0", "0", "0", cuda.clone());
    c.pending("train-1", "0", "0", cuda);
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("gpu") > 0
            && c.capacity("general") > 0)
        .await,
        "general {} gpu {}",
        c.capacity("general"),
        c.capacity("gpu")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // NC6s_v3 has one GPU: one node per training pod; the web pods fit one D4s_v5.
    assert_eq!(c.capacity("gpu"), 2);
    assert_eq!(c.capacity("general"), 1);
    assert_eq!((c.capacity_puts("gpu"), c.capacity_puts("general")), (1, 1));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_no_group_is_reported_on_the_pod_and_in_metrics_and_nothing_is_written() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 10).await;
    c.pending("huge", "64", "1Gi", json!({}));
    assert!(
        eventually_async(|| async { !c.events("NotTriggerScaleUp").await.is_empty() }).await,
        "no NotTriggerScaleUp Event"
    );
    let e = c.events("NotTriggerScaleUp").await.remove(0);
    let regarding = e.regarding.clone().unwrap_or_default();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.name.as_deref(), Some("huge"));
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .contains("general: Insufficient cpu"),
        "{e:?}"
    );
    assert_eq!(
        c.metrics
            .pods_unfit
            .with_label_values(&["general", "insufficient_cpu"])
            .get(),
        1
    );
    assert_eq!(c.capacity_puts("general"), 0);
    assert_eq!(c.capacity("general"), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_412_on_the_scale_up_write_replans_from_the_fresh_capacity_within_the_same_pass() {
    // A 1 s batch window, so the 12 pods below make one batch even on a loaded machine.
    let c = Cluster::start_with(&[("general", "Standard_D4s_v5", 2, &[])], 20, |s| {
        s.pod_demand.batch_idle = Duration::from_secs(1);
        s.pod_demand.batch_max = Duration::from_secs(5);
    })
    .await;
    // Another writer changes the scale set after our read: our cached ETag is stale.
    c.state
        .rival_set_capacity(SUB, RG, "general", 3, "rival")
        .expect("rival write");
    for i in 0..12 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    // 12 pods of 1 cpu need 4 nodes. We read capacity 2 with no node registered yet, so two
    // are on their way and two more are asked for: "at least 4". The write meets a 412, the
    // fresh read shows the rival's 3, and the same pass writes 4 with the fresh ETag.
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 4).await,
        "capacity {}",
        c.capacity("general")
    );
    let outcome = |o: &str| {
        c.metrics
            .etag_conflicts_total
            .with_label_values(&["general", o])
            .get()
    };
    // The emulator commits the write before the controller has read its answer: wait for the
    // controller to have counted the outcome too.
    assert!(
        eventually(Duration::from_secs(5), || outcome("retried_ok") == 1).await,
        "one 412, retried with the fresh ETag in the same pass (retried_ok {}, skipped {}, gave_up {})",
        outcome("retried_ok"),
        outcome("skipped"),
        outcome("gave_up")
    );
    assert_eq!(outcome("gave_up"), 0);
    assert_eq!(
        c.capacity_puts("general"),
        2,
        "the 412'd write and its retry"
    );
    assert!(
        c.state.lost_updates().is_empty(),
        "the rival's write was not lost"
    );
    c.stop().await;
}

/// Production timings on tokio's paused clock: AKS nodes register about a minute before they
/// turn Ready, and the loop re-checks pending pods every scan interval meanwhile. The nodes on
/// their way must count, or every re-check asks for the same nodes again.
#[tokio::test(start_paused = true)]
async fn nodes_that_take_a_minute_to_boot_are_not_asked_for_twice_and_leave_when_idle() {
    use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
    let sim = SimSettings {
        boot_delay: Duration::from_secs(60),
        tick: Duration::from_secs(1),
    };
    let c = Cluster::start_simulated_with(&[("pool", "Standard_D2s_v3", 1, &[])], 10, sim, |s| {
        s.scan_interval = Duration::from_secs(10);
        s.scale_down.enabled = true;
        for g in &mut s.node_groups {
            g.min_size = 1;
        }
    })
    .await;
    // Six pods of 1 cpu: one per D2s_v3 node (2 vCPU, less allocatable), so six nodes in all.
    c.kube
        .create_replica_set("default", "web", 6, &PodTemplate::new("1", "1Gi"))
        .expect("replica set");
    assert!(
        eventually(Duration::from_secs(300), || c
            .kube
            .pod_counts(Some("default"))
            .running
            == 6)
        .await,
        "the pods never ran: {:?}",
        c.kube.pod_counts(Some("default"))
    );
    assert_eq!(
        c.capacity("pool"),
        6,
        "asked for nodes already on their way"
    );
    assert_eq!(c.capacity_puts("pool"), 1, "one write for the burst");
    // Five pods go: after unneededTime (10 min) their nodes go too, down to min.
    c.kube
        .scale_replica_set("default", "web", 1)
        .expect("scaled");
    assert!(
        eventually(Duration::from_secs(20 * 60), || c.capacity("pool") == 1).await,
        "idle nodes stayed: capacity {}",
        c.capacity("pool")
    );
    assert!(c._emulator.pods_lost_with_nodes().is_empty());
    assert!(c.state.lost_updates().is_empty());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_neither_decides_scale_ups_nor_tells_pods_and_the_leader_it_becomes_does() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 10).await;
    c.set_leader(false);
    let decisions = || {
        ["batch", "recheck"]
            .iter()
            .map(|t| {
                c.metrics
                    .scale_up_decisions_total
                    .with_label_values(&[t])
                    .get()
            })
            .sum::<u64>()
    };
    let before = decisions();
    c.pending("waits", "1", "1Gi", json!({}));
    c.pending("too-big", "64", "1Gi", json!({}));
    // Well past the batch window (0.8 s idle).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(decisions(), before, "a standby decided");
    assert!(c.events("TriggeredScaleUp").await.is_empty());
    assert!(c.events("NotTriggerScaleUp").await.is_empty());
    assert_eq!(
        c.metrics
            .scaled_up_nodes_total
            .with_label_values(&["general"])
            .get(),
        0
    );
    // It takes the Lease over: the pods are news to it, decided and told.
    c.set_leader(true);
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 1).await,
        "the new leader never scaled up"
    );
    assert!(
        eventually_async(|| async {
            c.events("TriggeredScaleUp").await.len() == 1
                && c.events("NotTriggerScaleUp").await.len() == 1
        })
        .await,
        "the new leader told each pod once"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_balancing_a_burst_grows_three_similar_zonal_groups_evenly_in_one_write_each() {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    let seeds = ["1", "2", "3"]
        .iter()
        .map(|z| {
            let mut s = ScaleSetSeed::new(SUB, RG, &format!("zone{z}"), 0);
            s.sku_name = "Standard_D4s_v5".into();
            s.zones = vec![z.to_string()];
            s
        })
        .collect();
    let c = Cluster::start_groups(Groups::Seeds(seeds), 20, |s| {
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
        s.pod_demand.balance_similar_node_groups = true;
    })
    .await;
    // Nine pods of 3 cpu: one per new D4s_v5 node.
    for i in 0..9 {
        c.pending(&format!("web-{i}"), "3", "1Gi", json!({}));
    }
    assert!(
        eventually(Duration::from_secs(10), || zone_sizes(&c) == [3, 3, 3]).await,
        "sizes {:?}",
        zone_sizes(&c)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    for g in ["zone1", "zone2", "zone3"] {
        assert_eq!(c.capacity_puts(g), 1, "{g}: one write");
    }
    assert_eq!(zone_sizes(&c), [3, 3, 3]);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_spread_deployment_from_zero_grows_the_three_zonal_groups_evenly() {
    use support::pod_cluster::Groups;
    // No balancing: the spread constraint alone spreads the new nodes.
    let c = Cluster::start_groups(Groups::Seeds(three_zonal_seeds()), 20, |s| {
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
    })
    .await;
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}}]});
    // Six pods of 3 cpu: one per new D4s_v5 node, two per zone.
    for i in 0..6 {
        c.pending_labelled(
            &format!("web-{i}"),
            json!({"app": "web"}),
            "3",
            "1Gi",
            spread.clone(),
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || zone_sizes(&c) == [2, 2, 2]).await,
        "sizes {:?}",
        zone_sizes(&c)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(zone_sizes(&c), [2, 2, 2], "and no more");
    for g in ["zone1", "zone2", "zone3"] {
        assert_eq!(c.capacity_puts(g), 1, "{g}: one write");
    }
    c.stop().await;
}

/// The capacities of the three zonal groups of [`three_zonal_seeds`].
fn zone_sizes(c: &Cluster) -> Vec<i64> {
    ["zone1", "zone2", "zone3"]
        .iter()
        .map(|g| c.capacity(g))
        .collect()
}

/// The Azure Disk `pv-db-0`, made in zone 2 of westeurope.
fn zone_two_disk(k: &vmss_capacity_controller::emulator::kube::KubeState) {
    k.create("v1", "persistentvolumes", "", json!({
        "metadata": {"name": "pv-db-0"},
        "spec": {"capacity": {"storage": "8Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "disk.csi.azure.com", "volumeHandle": "/disks/db-0"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": ["westeurope-2"]}]}]}}}}))
    .expect("volume");
}

/// Three empty scale sets of D4s_v5, one per zone of westeurope.
fn three_zonal_seeds() -> Vec<vmss_capacity_controller::emulator::ScaleSetSeed> {
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    ["1", "2", "3"]
        .iter()
        .map(|z| {
            let mut s = ScaleSetSeed::new(SUB, RG, &format!("zone{z}"), 0);
            s.sku_name = "Standard_D4s_v5".into();
            s.zones = vec![z.to_string()];
            s
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_disk_lives_in_zone_two_grows_the_zone_two_group_and_an_immediate_claim_waits()
{
    use support::pod_cluster::Groups;
    let c = Cluster::start_groups(Groups::Seeds(three_zonal_seeds()), 20, |s| {
        s.pod_demand.batch_idle = Duration::from_millis(300);
    })
    .await;
    let k = &c.kube;
    k.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        json!({
        "metadata": {"name": "managed-csi"}, "provisioner": "disk.csi.azure.com",
        "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .expect("class");
    k.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        json!({
        "metadata": {"name": "managed-premium"}, "provisioner": "disk.csi.azure.com",
        "volumeBindingMode": "Immediate"}),
    )
    .expect("class");
    zone_two_disk(k);
    for (name, class, volume) in [
        ("data-db-0", "managed-csi", Some("pv-db-0")),
        ("data-q-0", "managed-premium", None),
    ] {
        let mut claim = json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "8Gi"}}}});
        if let Some(v) = volume {
            claim["spec"]["volumeName"] = json!(v);
            claim["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
        }
        k.create("v1", "persistentvolumeclaims", "default", claim)
            .expect("claim");
    }
    let with_claim = |claim: &str| json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]});
    c.pending_labelled(
        "db-0",
        json!({"app": "db"}),
        "1",
        "1Gi",
        with_claim("data-db-0"),
    );
    // 3 cpu: if it were planned for, it would need a node of its own.
    c.pending_labelled(
        "q-0",
        json!({"app": "q"}),
        "3",
        "1Gi",
        with_claim("data-q-0"),
    );
    assert!(
        eventually(Duration::from_secs(10), || zone_sizes(&c) == [0, 1, 0]).await,
        "sizes {:?}",
        zone_sizes(&c)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(zone_sizes(&c), [0, 1, 0], "the waiting pod grows nothing");
    let unbound = |events: &[k8s_openapi::api::events::v1::Event]| {
        events.iter().any(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("pod has unbound immediate PersistentVolumeClaims"))
        })
    };
    let waiting = c.events_once("NotTriggerScaleUp", unbound).await;
    assert!(unbound(&waiting), "{waiting:?}");
    c.stop().await;
}

/// On the simulated cluster, whose scheduler enforces topology spread and volume zones as
/// kube-scheduler does, what the controller grows is where the pods can actually run: a
/// zone-spread ReplicaSet ends two per zone, and a pod whose disk lives in zone 2 runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_whose_scheduler_enforces_spread_and_volume_zones_every_pod_runs_where_it_must(
) {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
    let sim = SimSettings {
        boot_delay: Duration::from_millis(200),
        tick: Duration::from_millis(20),
    };
    let c = Cluster::start_simulated_groups(Groups::Seeds(three_zonal_seeds()), 20, sim, |s| {
        s.pod_demand.batch_idle = Duration::from_millis(500);
        s.pod_demand.batch_max = Duration::from_secs(3);
    })
    .await;
    let k = &c.kube;
    zone_two_disk(k);
    k.create(
        "v1",
        "persistentvolumeclaims",
        "default",
        json!({"metadata": {"name": "data-db-0", "namespace": "default",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-db-0",
            "resources": {"requests": {"storage": "8Gi"}}}}),
    )
    .expect("claim");
    k.create(
        "v1",
        "pods",
        "default",
        json!({"metadata": {"name": "db-0", "namespace": "default", "labels": {"app": "db"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "db", "uid": "sts-uid", "controller": true}]},
        "spec": {"containers": [{"name": "db", "image": "db",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]}}),
    )
    .expect("db pod");
    // Six pods of 3 cpu: one per D4s_v5 node.
    k.create_replica_set(
        "default",
        "web",
        6,
        &PodTemplate::new("3", "1Gi").spread_by("topology.kubernetes.io/zone", 1, "web"),
    )
    .expect("replica set");
    let running = || {
        k.list_all("v1", "pods", Some("default"))
            .into_iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .map(|p| {
                let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
                let app = p["metadata"]["labels"]["app"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                (app, node)
            })
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(20), || running().len() == 7).await,
        "running {:?}, sizes {:?}",
        running(),
        zone_sizes(&c)
    );
    let zone_of = |node: &str| {
        k.get("v1", "nodes", "", node).expect("node")["metadata"]["labels"]
            ["topology.kubernetes.io/zone"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let mut per_zone = std::collections::BTreeMap::new();
    for (app, node) in running() {
        *per_zone.entry((app, zone_of(&node))).or_insert(0) += 1;
    }
    assert_eq!(
        per_zone,
        std::collections::BTreeMap::from([
            (("db".to_string(), "westeurope-2".to_string()), 1),
            (("web".to_string(), "westeurope-1".to_string()), 2),
            (("web".to_string(), "westeurope-2".to_string()), 2),
            (("web".to_string(), "westeurope-3".to_string()), 2),
        ])
    );
    c.stop().await;
}
