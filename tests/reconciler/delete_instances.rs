//! Scale-down deletes exactly the chosen instance, never a capacity number: the Azure side of it
//! (`CapacityResource::delete_instances`) against the emulator, for both kinds of node group (a
//! VM scale set's `POST …/delete`, an AKS agent pool's `POST …/deleteMachines`). Every test
//! runs once per kind (`<test>::vmss`, `<test>::aks_agent_pool`).

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use vmss_capacity_controller::azure::arm::OperationStatus;
use vmss_capacity_controller::azure::{ArmError, ArmOp, Precondition};
use vmss_capacity_controller::cache::ScaleSet;
use vmss_capacity_controller::emulator::sim::nodes::node_name;
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::resource::{CapacityResource, Resources, Victim};

/// A harness whose only group `pool-a` has 3 instances (ids 0, 1, 2), and its resource.
async fn pool_a(kind: Kind, builder: EmulatorBuilder) -> (Harness, Arc<dyn CapacityResource>) {
    let h = Harness::with_kind(
        kind,
        builder,
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, None)],
        |_| {},
    )
    .await;
    let resource = Resources::new(&h.settings, h.arm.clone()).for_group(&h.settings.node_groups[0]);
    (h, resource)
}

/// The scale set whose instances are `pool-a`'s nodes.
fn backing_scale_set(h: &Harness) -> String {
    match h.kind {
        Kind::Vmss => "pool-a".to_string(),
        Kind::AgentPool => {
            h.state
                .agent_pool(SUB, RG, CLUSTER, "pool-a")
                .expect("pool exists")
                .scale_set_name
        }
    }
}

/// Instance `id` of `pool-a`, named both ways.
fn victim(h: &Harness, id: u64) -> Victim {
    Victim {
        instance_id: id.to_string(),
        node_name: node_name(&backing_scale_set(h), id),
    }
}

async fn read(resource: &Arc<dyn CapacityResource>) -> ScaleSet {
    resource
        .get("pool-a")
        .await
        .expect("read answers")
        .expect("pool-a exists")
}

async fn instance_ids(resource: &Arc<dyn CapacityResource>) -> Vec<String> {
    let mut ids: Vec<String> = resource
        .list_instances("pool-a")
        .await
        .expect("instances listed")
        .into_iter()
        .map(|i| i.instance_id)
        .collect();
    ids.sort();
    ids
}

fn if_match(current: &ScaleSet) -> Precondition {
    Precondition::IfMatch(current.etag.clone().expect("the read carries an ETag"))
}

fn delete_op(kind: Kind) -> ArmOp {
    match kind {
        Kind::Vmss => ArmOp::DeleteInstances,
        Kind::AgentPool => ArmOp::DeleteMachines,
    }
}

for_each_kind! {
#[tokio::test]
async fn deleting_one_instance_removes_exactly_that_instance_and_lowers_capacity_by_one(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let current = read(&resource).await;
    assert_eq!(instance_ids(&resource).await, ["0", "1", "2"]);

    let accepted = resource
        .delete_instances(&current, &[victim(&h, 1)], &if_match(&current))
        .await
        .expect("the delete is accepted");

    assert_eq!(accepted.status, 202);
    assert!(accepted.async_operation.is_some(), "a 202 names its operation");
    assert_eq!(instance_ids(&resource).await, ["0", "2"], "exactly instance 1 went");
    assert_eq!(h.capacity_now("pool-a").await, 2);
    let after = read(&resource).await;
    assert_ne!(after.etag, current.etag, "a delete moves the ETag");
    assert_eq!(after.capacity, Some(2));
    assert!(
        h.state.lost_updates().is_empty(),
        "a delete under a matching If-Match loses nothing: {:?}",
        h.state.lost_updates()
    );
    let sent = h.our_requests("POST", match kind {
        Kind::Vmss => "/virtualMachineScaleSets/pool-a/delete",
        Kind::AgentPool => "/agentPools/pool-a/deleteMachines",
    });
    assert_eq!(sent.len(), 1, "one request");
    assert_eq!(sent[0].if_match, current.etag, "the ETag read is sent as If-Match");
}
}

for_each_kind! {
#[tokio::test]
async fn several_instances_go_in_one_request_naming_exactly_them(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let current = read(&resource).await;
    resource
        .delete_instances(&current, &[victim(&h, 0), victim(&h, 2)], &if_match(&current))
        .await
        .expect("the delete is accepted");
    assert_eq!(instance_ids(&resource).await, ["1"], "exactly instances 0 and 2 went");
    assert_eq!(h.capacity_now("pool-a").await, 1);
    let sent = h.our_requests("POST", match kind {
        Kind::Vmss => "/virtualMachineScaleSets/pool-a/delete",
        Kind::AgentPool => "/agentPools/pool-a/deleteMachines",
    });
    assert_eq!(sent.len(), 1, "one request for both");
    assert_eq!(sent[0].if_match, current.etag);
    let deleted = h.state.instance_deletions();
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0].machines.len(), 2, "{deleted:?}");
}
}

for_each_kind! {
#[tokio::test]
async fn a_stale_if_match_on_a_delete_is_a_412_and_nothing_is_removed(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let stale = read(&resource).await;
    let tags = [("team".to_string(), "rival".to_string())].into();
    h.rival_write("pool-a", None, Some(tags), "rival").await;
    let etag_before = h.etag_now("pool-a").await;

    let err = resource
        .delete_instances(&stale, &[victim(&h, 1)], &if_match(&stale))
        .await
        .expect_err("a stale ETag is refused");

    match &err {
        ArmError::PreconditionFailed { op, scale_set, .. } => {
            assert_eq!(*op, delete_op(kind));
            assert_eq!(scale_set, "pool-a");
        }
        other => panic!("expected the 412 a stale PUT gets, got {other:?}"),
    }
    assert_eq!(err.metric_label(), "precondition_failed");
    assert_eq!(instance_ids(&resource).await, ["0", "1", "2"], "nothing removed");
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(h.etag_now("pool-a").await, etag_before, "nothing changed");
}
}

for_each_kind! {
#[tokio::test(start_paused = true)]
async fn the_operation_of_an_accepted_delete_can_be_polled_to_succeeded(kind: Kind) {
    let (h, resource) =
        pool_a(kind, EmulatorBuilder::new().lro_delay(Duration::from_secs(120))).await;
    let current = read(&resource).await;
    let accepted = resource
        .delete_instances(&current, &[victim(&h, 0)], &if_match(&current))
        .await
        .expect("the delete is accepted");
    let url = accepted.async_operation.expect("a 202 names its operation");
    assert_eq!(
        resource.poll_operation(&url).await.expect("polled"),
        OperationStatus::InProgress
    );

    tokio::time::advance(Duration::from_secs(121)).await;
    assert_eq!(
        resource.poll_operation(&url).await.expect("polled"),
        OperationStatus::Succeeded
    );
    assert_eq!(instance_ids(&resource).await, ["1", "2"]);
}
}

for_each_kind! {
#[tokio::test]
async fn a_bad_instance_id_or_machine_name_is_a_clear_error_naming_it(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let current = read(&resource).await;
    let bad = victim(&h, 42);
    let named = match kind {
        Kind::Vmss => bad.instance_id.clone(),
        Kind::AgentPool => bad.node_name.clone(),
    };

    // One good victim and one bad: the request is refused whole.
    let err = resource
        .delete_instances(&current, &[victim(&h, 1), bad], &if_match(&current))
        .await
        .expect_err("an unknown instance is refused");

    match &err {
        ArmError::Http { status, message, op, .. } => {
            assert_eq!(*status, 400);
            assert_eq!(*op, delete_op(kind));
            assert!(message.contains(&named), "{message} names {named}");
        }
        other => panic!("expected a 400 naming {named}, got {other:?}"),
    }
    assert!(err.to_string().contains(&named), "{err}");
    assert!(!err.is_retryable(), "a bad name stays bad");
    assert_eq!(instance_ids(&resource).await, ["0", "1", "2"], "nothing removed");
    assert_eq!(h.capacity_now("pool-a").await, 3);
}
}

for_each_kind! {
#[tokio::test]
async fn deleting_no_victims_sends_nothing_and_is_done(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let current = read(&resource).await;
    let before = h.state.request_log().len();

    let accepted = resource
        .delete_instances(&current, &[], &if_match(&current))
        .await
        .expect("nothing to delete is done");

    assert_eq!(accepted.status, 200);
    assert_eq!(accepted.async_operation, None);
    assert_eq!(h.state.request_log().len(), before, "no request");
    assert_eq!(h.capacity_now("pool-a").await, 3);
}
}

for_each_kind! {
#[tokio::test]
async fn if_match_star_deletes_whatever_the_current_version(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let stale = read(&resource).await;
    let tags = [("team".to_string(), "rival".to_string())].into();
    h.rival_write("pool-a", None, Some(tags), "rival").await;

    resource
        .delete_instances(&stale, &[victim(&h, 2)], &Precondition::IfMatch("*".into()))
        .await
        .expect("`*` matches an existing resource");

    assert_eq!(instance_ids(&resource).await, ["0", "1"]);
    assert_eq!(h.capacity_now("pool-a").await, 2);
}
}

for_each_kind! {
#[tokio::test]
async fn a_blind_delete_over_a_version_it_never_read_is_a_lost_update(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let stale = read(&resource).await;
    let tags = [("team".to_string(), "rival".to_string())].into();
    h.rival_write("pool-a", None, Some(tags), "rival").await;

    resource
        .delete_instances(&stale, &[victim(&h, 1)], &Precondition::None)
        .await
        .expect("a blind delete lands");

    let lost = h.state.lost_updates();
    assert_eq!(lost.len(), 1, "the referee counts it: {lost:?}");
    assert_eq!(lost[0].writer, "controller");
    assert_eq!(lost[0].replaced_writer, "rival");
}
}

for_each_kind! {
#[tokio::test]
async fn a_throttled_delete_closes_the_write_gate_and_the_next_one_is_held_back_locally(kind: Kind) {
    let (h, resource) = pool_a(kind, EmulatorBuilder::new()).await;
    let current = read(&resource).await;
    h.state.inject_fault(fault(
        Some("POST"),
        Some("pool-a"),
        status_kind(429, "TooManyRequests", Some(30)),
        Some(1),
    ));

    let first = resource
        .delete_instances(&current, &[victim(&h, 1)], &if_match(&current))
        .await
        .expect_err("throttled");
    assert!(
        matches!(first, ArmError::Throttled { local: false, retry_after, .. } if retry_after == Duration::from_secs(30)),
        "{first:?}"
    );
    let second = resource
        .delete_instances(&current, &[victim(&h, 1)], &if_match(&current))
        .await
        .expect_err("held back");
    assert!(matches!(second, ArmError::Throttled { local: true, .. }), "{second:?}");
    assert_eq!(h.our_requests("POST", "").len(), 1, "the second never left");
    let op = delete_op(kind).as_str();
    assert_eq!(
        h.counter(&h.metrics.arm_requests_total, &[("operation", op), ("code", "gated")]),
        1
    );
    assert_eq!(instance_ids(&resource).await, ["0", "1", "2"]);
}
}

#[tokio::test]
async fn deleting_the_last_machine_of_a_system_pool_is_refused_and_removes_nothing() {
    let (h, _) = pool_a(Kind::AgentPool, EmulatorBuilder::new()).await;
    let sys = format!("{}/agentPools/sys", h.cluster_path());
    let (status, body) = h
        .arm_json(
            "seeder",
            reqwest::Method::PUT,
            &sys,
            Some(serde_json::json!({"properties": {"count": 1, "mode": "System", "vmSize": "Standard_D2s_v5"}})),
            None,
        )
        .await;
    assert!(status < 300, "system pool created: {status} {body}");
    let scale_set = h
        .state
        .agent_pool(SUB, RG, CLUSTER, "sys")
        .expect("pool exists")
        .scale_set_name;

    let (status, body) = h
        .arm_json(
            "controller",
            reqwest::Method::POST,
            &format!("{sys}/deleteMachines"),
            Some(serde_json::json!({"machineNames": [node_name(&scale_set, 0)]})),
            None,
        )
        .await;

    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("System pool"), "{body}");
    assert_eq!(
        h.state
            .agent_pool(SUB, RG, CLUSTER, "sys")
            .expect("pool")
            .count,
        1
    );
}

/// A last look that fails once `landed` is set, and records when it was asked.
struct PodLanded {
    landed: Arc<std::sync::atomic::AtomicBool>,
    asked_after_first_answered: Arc<std::sync::atomic::AtomicBool>,
    first_done: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl vmss_capacity_controller::reconciler::LastLook for PodLanded {
    async fn check(&self) -> Result<(), String> {
        use std::sync::atomic::Ordering::SeqCst;
        self.asked_after_first_answered
            .store(self.first_done.load(SeqCst), SeqCst);
        if self.landed.load(SeqCst) {
            Err("pod default/late is on the node".into())
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn a_delete_that_waited_behind_another_looks_at_its_node_once_its_turn_came() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use vmss_capacity_controller::reconciler::{DeleteEnd, DeleteKind, NoLastLook};
    let h = Harness::new(
        &[("alpha", 3), ("beta", 3)],
        vec![group("alpha", 0, 10, None), group("beta", 0, 10, None)],
        |_| {},
    )
    .await;
    // Alpha's delete is slow to answer: beta's waits behind it (one delete at a time).
    h.state.inject_fault(fault(
        Some("POST"),
        Some("/alpha/delete"),
        vmss_capacity_controller::emulator::FaultKind::Latency {
            ms: 1500,
            max_ms: None,
        },
        Some(1),
    ));
    let reconciler = Arc::new(h.reconciler);
    let groups = h.settings.node_groups.clone();
    let first_done = Arc::new(AtomicBool::new(false));
    let first = {
        let (r, g, done) = (reconciler.clone(), groups[0].clone(), first_done.clone());
        tokio::spawn(async move {
            let end = r
                .delete_instance(
                    &g,
                    Victim {
                        instance_id: "0".into(),
                        node_name: node_name("alpha", 0),
                    },
                    DeleteKind::Unneeded,
                    &NoLastLook,
                )
                .await;
            done.store(true, SeqCst);
            end
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let landed = Arc::new(AtomicBool::new(false));
    let asked_late = Arc::new(AtomicBool::new(false));
    let second = {
        let look = PodLanded {
            landed: landed.clone(),
            asked_after_first_answered: asked_late.clone(),
            first_done: first_done.clone(),
        };
        let (r, g) = (reconciler.clone(), groups[1].clone());
        tokio::spawn(async move {
            r.delete_instance(
                &g,
                Victim {
                    instance_id: "0".into(),
                    node_name: node_name("beta", 0),
                },
                DeleteKind::Unneeded,
                &look,
            )
            .await
        })
    };
    // While beta's delete waits, a pod lands on its node.
    tokio::time::sleep(Duration::from_millis(300)).await;
    landed.store(true, SeqCst);
    assert_eq!(first.await.unwrap(), DeleteEnd::Deleted);
    assert_eq!(
        second.await.unwrap(),
        DeleteEnd::Stopped("pod default/late is on the node".into())
    );
    assert!(asked_late.load(SeqCst), "the look ran before its turn came");
    let deletes: Vec<_> = h
        .state
        .request_log()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/delete"))
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert!(deletes[0].path.contains("/alpha/"));
    assert_eq!(h.state.scale_set(SUB, RG, "beta").unwrap().capacity, 3);
}

#[tokio::test]
async fn a_failed_instance_at_the_floor_is_replaced_and_a_merely_unneeded_one_is_not() {
    use vmss_capacity_controller::reconciler::{DeleteEnd, DeleteKind, DeleteRefusal, NoLastLook};
    let h = Harness::new(&[("pool-a", 3)], vec![group("pool-a", 3, 10, None)], |_| {}).await;
    let g = h.settings.node_groups[0].clone();
    let victim = |id: u64| Victim {
        instance_id: id.to_string(),
        node_name: node_name("pool-a", id),
    };
    assert_eq!(
        h.reconciler
            .delete_instance(&g, victim(0), DeleteKind::Unneeded, &NoLastLook)
            .await,
        DeleteEnd::Refused(DeleteRefusal::BelowFloor)
    );
    assert_eq!(
        h.reconciler
            .delete_instance(&g, victim(0), DeleteKind::Replace, &NoLastLook)
            .await,
        DeleteEnd::Deleted
    );
    assert_eq!(h.capacity_now("pool-a").await, 2);
    // Never two below: a second replacement waits for the size to come back.
    assert_eq!(
        h.reconciler
            .delete_instance(&g, victim(1), DeleteKind::Replace, &NoLastLook)
            .await,
        DeleteEnd::Refused(DeleteRefusal::BelowFloor)
    );
    // The next pass writes the size back up to the floor, under If-Match.
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(h.capacity_now("pool-a").await, 3);
    let puts = h.our_puts();
    assert_eq!(puts.len(), 1, "{puts:?}");
    assert!(puts[0].if_match.is_some());
}
