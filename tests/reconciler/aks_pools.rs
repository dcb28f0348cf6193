//! What only agent pools have: AKS's ETag scoping rule (a cluster-level write changes every
//! pool's ETag, a pool write only that pool's), pools under AKS's own autoscaler, System pools.

use crate::support;

use std::sync::Arc;
use support::*;
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::reconciler::Reconciler;

/// Pools of [`CLUSTER`] as node groups whose demand the test turns (each starts holding).
async fn pools(seeds: &[(&str, i64)]) -> (Harness, Arc<KnobDemand>) {
    let groups = seeds.iter().map(|(n, _)| group(n, 0, 10, None)).collect();
    let mut h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        seeds,
        groups,
        |_| {},
    )
    .await;
    let knob = Arc::new(KnobDemand::default());
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    h.reconciler
        .run_once()
        .await
        .expect("first pass reads the pools");
    assert!(h.our_puts().is_empty(), "holding: nothing to write");
    (h, knob)
}

#[tokio::test]
async fn a_cluster_level_write_between_our_read_and_our_pool_write_is_a_412_and_a_replan_from_the_fresh_pool(
) {
    let (h, knob) = pools(&[("pool-a", 3)]).await;
    let read_etag = h.etag_now("pool-a").await;
    // Someone upgrades or re-tags the managed cluster: every pool's ETag moves, no count does.
    h.rival_cluster_write("terraform").await;
    let after_cluster_write = h.etag_now("pool-a").await;
    assert_ne!(
        read_etag, after_cluster_write,
        "AKS scoping: a cluster write changes the pool's ETag"
    );
    // The plan changes; the controller's cached read is older than the cluster write.
    knob.set("pool-a", 5);
    h.reconciler.run_once().await.expect("pass");
    let puts = h.our_puts();
    assert_eq!(
        puts.len(),
        2,
        "the stale write and the re-planned one: {puts:?}"
    );
    assert_eq!(
        (puts[0].status, puts[0].if_match.as_deref()),
        (412, Some(read_etag.as_str()))
    );
    assert_eq!(
        (puts[1].status, puts[1].if_match.as_deref()),
        (200, Some(after_cluster_write.as_str()))
    );
    assert_eq!(h.capacity_now("pool-a").await, 5);
    assert_eq!(
        h.counter(
            &h.metrics.etag_conflicts_total,
            &[("outcome", "retried_ok")]
        ),
        1
    );
    assert!(
        h.state.lost_updates().is_empty(),
        "{:?}",
        h.state.lost_updates()
    );
}

#[tokio::test]
async fn a_pool_level_write_on_pool_a_does_not_disturb_a_write_to_pool_b() {
    let (h, knob) = pools(&[("pool-a", 3), ("pool-b", 3)]).await;
    let b_etag = h.etag_now("pool-b").await;
    h.rival_write("pool-a", Some(7), None, "portal").await;
    assert_eq!(
        h.etag_now("pool-b").await,
        b_etag,
        "a pool write changes only that pool's ETag"
    );
    knob.set("pool-b", 6);
    h.reconciler.run_once().await.expect("pass");
    let puts = h.our_puts();
    assert_eq!(puts.len(), 1, "one write, to pool-b, first time: {puts:?}");
    assert!(puts[0].path.ends_with("/pool-b") && puts[0].status == 200);
    assert_eq!(puts[0].if_match.as_deref(), Some(b_etag.as_str()));
    assert_eq!(h.capacity_now("pool-b").await, 6);
    assert_eq!(
        h.capacity_now("pool-a").await,
        7,
        "the rival's write on pool-a stands"
    );
    assert!(h.state.lost_updates().is_empty());
}

#[tokio::test]
async fn a_pool_with_aks_autoscaling_on_is_never_written() {
    let h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
    // AKS's own autoscaler owns this pool.
    let path = format!("{}/agentPools/pool-a", h.cluster_path());
    let (_, mut v) = h
        .arm_json("portal", reqwest::Method::GET, &path, None, None)
        .await;
    v["properties"]["enableAutoScaling"] = true.into();
    v["properties"]["minCount"] = 1.into();
    v["properties"]["maxCount"] = 5.into();
    let (status, _) = h
        .arm_json("portal", reqwest::Method::PUT, &path, Some(v), None)
        .await;
    assert!(status < 300);
    for _ in 0..3 {
        h.reconciler
            .run_once()
            .await
            .expect("a held write is not a failed pass");
    }
    assert!(h.our_puts().is_empty(), "never written");
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(
        h.counter(
            &h.metrics.writes_held_total,
            &[("scale_set", "pool-a"), ("reason", "aks_autoscaler")]
        ),
        3
    );
}

#[tokio::test]
async fn a_system_pool_is_never_scaled_below_one_node() {
    let h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        &[("sys", 2)],
        vec![group("sys", 0, 10, Some(0))],
        |_| {},
    )
    .await;
    let path = format!("{}/agentPools/sys", h.cluster_path());
    let (_, mut v) = h
        .arm_json("portal", reqwest::Method::GET, &path, None, None)
        .await;
    v["properties"]["mode"] = "System".into();
    let (status, _) = h
        .arm_json("portal", reqwest::Method::PUT, &path, Some(v), None)
        .await;
    assert!(status < 300);
    h.reconciler.run_once().await.expect("pass");
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(
        h.capacity_now("sys").await,
        1,
        "desired 0, but a System pool keeps one node"
    );
}

#[tokio::test]
async fn agent_pools_tagged_for_discovery_become_node_groups_with_bounds_from_their_tags() {
    let h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        &[("np1", 1), ("np2", 2), ("other", 3)],
        vec![],
        |s| {
            s.auto_discovery = Some(vmss_capacity_controller::config::AutoDiscovery {
                cluster_name: "aks-1".into(),
                default_min: None,
                default_max: None,
                aks_cluster: Some(CLUSTER.into()),
                aks_resource_group: None,
            });
        },
    )
    .await;
    let tags = |min: &str, max: &str| {
        std::collections::BTreeMap::from([
            ("cluster-autoscaler-enabled".to_string(), "true".to_string()),
            ("cluster-autoscaler-name".to_string(), "aks-1".to_string()),
            ("min".to_string(), min.to_string()),
            ("max".to_string(), max.to_string()),
        ])
    };
    h.rival_write("np1", None, Some(tags("3", "5")), "terraform")
        .await;
    h.rival_write("np2", None, Some(tags("0", "1")), "terraform")
        .await;
    h.reconciler.run_once().await.expect("discovery pass");
    let groups = h.reconciler.node_groups().groups();
    let mut names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["np1", "np2"], "only the tagged pools");
    assert!(groups
        .iter()
        .all(|g| matches!(&g.kind, vmss_capacity_controller::config::NodeGroupKind::AksAgentPool { cluster } if cluster == CLUSTER)));
    // Their bounds hold: np1 rises to its min 3, np2 falls to its max 1.
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(h.capacity_now("np1").await, 3);
    assert_eq!(h.capacity_now("np2").await, 1);
    assert_eq!(
        h.capacity_now("other").await,
        3,
        "an untagged pool is left alone"
    );
    assert!(h.state.lost_updates().is_empty());
}
