//! One health per group (`NodeGroups::health`): driven into each state that holds its writes or
//! keeps it out of scale-up, the group's health, the status's `held` (and its backoff fields)
//! and the `writes_held_total` label the pass counted say the same thing.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::config::WriteBudget;
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::fence::{FenceHold, WriteFence};
use vmss_capacity_controller::hold::HoldReason;
use vmss_capacity_controller::node_groups::Unhealthy;
use vmss_capacity_controller::notify::NotHelpedStatus;
use vmss_capacity_controller::reconciler::Reconciler;

/// The `writes_held_total` count of `group` per reason label.
fn held_counts(h: &Harness, group: &str) -> BTreeMap<&'static str, u64> {
    HoldReason::ALL
        .iter()
        .map(|r| {
            let label = r.metric_label();
            (
                label,
                h.counter(
                    &h.metrics.writes_held_total,
                    &[("scale_set", group), ("reason", label)],
                ),
            )
        })
        .collect()
}

/// One pass; then for each of `groups` its health, its status and the hold labels the pass
/// counted agree on why its write was held. Returns those labels (`None`: nothing held).
async fn pass_and_agree(h: &Harness, groups: &[&str]) -> Vec<Option<String>> {
    let before: Vec<_> = groups.iter().map(|g| held_counts(h, g)).collect();
    let _ = h.reconciler.run_once().await;
    groups
        .iter()
        .zip(before)
        .map(|(g, before)| agree(h, g, &before))
        .collect()
}

/// `group`'s health, status and the hold labels counted since `before` agree.
fn agree(h: &Harness, group: &str, before: &BTreeMap<&'static str, u64>) -> Option<String> {
    let after = held_counts(h, group);
    let counted: Vec<&str> = after
        .iter()
        .filter(|(label, n)| **n > before[*label])
        .map(|(label, _)| *label)
        .collect();
    let health = h.reconciler.node_groups().health(group);
    let status = h
        .reconciler
        .status()
        .into_iter()
        .find(|s| s.name == group)
        .expect("the group has a status");
    let from_health = health.held().map(|r| r.metric_label().to_string());
    assert_eq!(
        from_health, status.held,
        "{group}: health {health:?} and the status's held disagree"
    );
    assert!(
        counted.len() <= 1,
        "{group}: one write, one hold at most: {counted:?}"
    );
    if let Some(label) = counted.first() {
        assert_eq!(
            status.held.as_deref(),
            Some(*label),
            "{group}: the status's held is the label writes_held_total counted"
        );
        assert!(
            health
                .causes()
                .iter()
                .any(|c| matches!(c, Unhealthy::Held(r) if r.metric_label() == *label)),
            "{group}: the hold is a cause of its health: {health:?}"
        );
    }
    // The backoffs the status shows are the health's causes.
    let has = |f: fn(&Unhealthy) -> bool| health.causes().iter().any(f);
    assert_eq!(
        status.backoff_until.is_some(),
        has(|c| matches!(c, Unhealthy::WriteBackoff)),
        "{group}: backoff_until and the health's WriteBackoff"
    );
    assert_eq!(
        status.unavailable.is_some(),
        has(|c| matches!(c, Unhealthy::Unavailable { .. })),
        "{group}: unavailable and the health's Unavailable"
    );
    assert_eq!(
        status.provision_backoff_until.is_some(),
        has(|c| matches!(c, Unhealthy::ProvisionTimeout { .. })),
        "{group}: provision_backoff_until and the health's ProvisionTimeout"
    );
    assert_eq!(
        status.not_helped.is_some(),
        has(|c| matches!(c, Unhealthy::NotHelped { .. })),
        "{group}: not_helped and the health's NotHelped"
    );
    status.held
}

/// Groups of `seeds` under a demand the test turns, with one write each before the budget is
/// spent.
async fn knobbed(seeds: &[(&str, i64)]) -> (Harness, Arc<KnobDemand>) {
    let knob = Arc::new(KnobDemand::default());
    let mut h = Harness::new(
        seeds,
        seeds.iter().map(|(g, _)| group(g, 0, 10, None)).collect(),
        |s| {
            s.write_budget = WriteBudget {
                per_minute: 0.0,
                burst: 1,
            }
        },
    )
    .await;
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .demand(knob.clone())
        .build();
    (h, knob)
}

#[tokio::test(start_paused = true)]
async fn a_groups_health_its_status_held_and_the_hold_labels_counted_agree_in_every_state() {
    let (h, knob) = knobbed(&[("flaky", 1), ("budget", 1), ("calm", 2)]).await;
    for g in ["flaky", "budget"] {
        knob.set(g, 3);
    }
    h.state.inject_fault(fault(
        Some("PUT"),
        Some("flaky"),
        status_kind(503, "ServiceUnavailable", None),
        None,
    ));
    let all = ["flaky", "budget", "calm"];
    // The first pass: budget writes (its one token), flaky fails.
    assert_eq!(pass_and_agree(&h, &all).await, [None, None, None]);
    let ng = h.reconciler.node_groups();
    assert_eq!(
        ng.health("flaky").out_of_scale_up(),
        Some(Unhealthy::WriteBackoff)
    );
    assert!(ng.health("budget").is_healthy());
    assert!(ng.health("calm").is_healthy());
    // Each asks again: each is held for its own cause.
    knob.set("budget", 4);
    assert_eq!(
        pass_and_agree(&h, &all).await,
        [
            Some("backoff".to_string()),
            Some("budget".to_string()),
            None
        ]
    );
    // The scale-up loop's causes: a provisioning timeout, a scale-up that did not help. They
    // keep no write back; the status shows them as the health does.
    let until = tokio::time::Instant::now() + Duration::from_secs(300);
    ng.set_provision_backoff(&BTreeMap::from([("calm".to_string(), until)]));
    ng.set_not_helped(
        "calm",
        Some((
            until,
            NotHelpedStatus {
                until: "2030-01-01T00:00:00Z".into(),
                workloads: vec!["default/Deployment/web".into()],
                why: "its new nodes cannot take the pods".into(),
            },
        )),
    );
    let calm = ng.health("calm");
    assert!(matches!(
        calm.out_of_scale_up(),
        Some(Unhealthy::ProvisionTimeout { .. })
    ));
    assert_eq!(
        calm.causes()
            .iter()
            .map(Unhealthy::label)
            .collect::<Vec<_>>(),
        ["provision_timeout", "did_not_help"]
    );
    assert_eq!(agree(&h, "calm", &held_counts(&h, "calm")), None);
    // The marks run out: healthy again, and a pass that plans no write clears every hold.
    tokio::time::advance(Duration::from_secs(30 * 60)).await;
    knob.set("budget", 3);
    knob.set("flaky", 1);
    ng.set_provision_backoff(&BTreeMap::new());
    assert_eq!(pass_and_agree(&h, &all).await, [None, None, None]);
    for g in all {
        assert!(ng.health(g).is_healthy(), "{g}: {:?}", ng.health(g));
    }
}

#[tokio::test(start_paused = true)]
async fn an_offering_azure_refused_is_the_same_cause_in_health_status_and_hold_label() {
    let (h, knob) = knobbed(&[("quota", 1)]).await;
    knob.set("quota", 3);
    h.state.inject_fault(fault(
        Some("PUT"),
        Some("quota"),
        status_kind(409, "OperationNotAllowed", None),
        None,
    ));
    assert_eq!(pass_and_agree(&h, &["quota"]).await, [None]);
    assert!(matches!(
        h.reconciler.node_groups().health("quota").out_of_scale_up(),
        Some(Unhealthy::Unavailable { .. })
    ));
    assert_eq!(
        pass_and_agree(&h, &["quota"]).await,
        [Some("offering_unavailable".to_string())]
    );
    // The mark runs out; the group's demand is met: nothing holds.
    tokio::time::advance(Duration::from_secs(10 * 60)).await;
    knob.set("quota", 1);
    assert_eq!(pass_and_agree(&h, &["quota"]).await, [None]);
    assert!(h.reconciler.node_groups().health("quota").is_healthy());
}

/// Lets nothing through.
#[derive(Debug)]
struct Closed;

impl WriteFence for Closed {
    fn check(&self) -> Result<(), FenceHold> {
        Err(FenceHold::NotLeader)
    }
}

#[tokio::test]
async fn a_dry_run_and_a_replica_that_is_not_the_leader_agree_on_why_nothing_was_written() {
    let mut h = Harness::new(
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .dry_run(true)
        .build();
    assert_eq!(
        pass_and_agree(&h, &["pool-a"]).await,
        [Some("dry_run".to_string())]
    );
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .fence(Arc::new(Closed))
        .build();
    assert_eq!(
        pass_and_agree(&h, &["pool-a"]).await,
        [Some("not_leader".to_string())]
    );
    assert!(h.puts().is_empty());
}

#[tokio::test]
async fn a_pool_aks_scales_itself_is_refused_in_its_health_its_status_and_its_hold_label() {
    let h = Harness::with_kind(
        Kind::AgentPool,
        EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
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
    for _ in 0..2 {
        assert_eq!(
            pass_and_agree(&h, &["pool-a"]).await,
            [Some("aks_autoscaler".to_string())]
        );
    }
    let health = h.reconciler.node_groups().health("pool-a");
    assert_eq!(
        health.causes().first().map(Unhealthy::label),
        Some("refused"),
        "the refusal comes first: {health:?}"
    );
    assert!(h.our_puts().is_empty());
}
