//! The guarded send's decisions on a fake resource (no HTTP): which holds apply to which write,
//! that nothing leaves while held, that the fence's permit is held until the answer, and the
//! drifts between the three former copies decided in [`super::send`].

use super::send::{Sent, WriteKind};
use super::*;
use crate::azure::arm::{ArmOp, ArmTarget, OperationStatus};
use crate::azure::DeleteAccepted;
use crate::azure::{Precondition, PutAccepted};
use crate::cache::{Instance, VmProfile};
use crate::capacity::AllocationFailure;
use crate::config::ConfigSources;
use crate::fence::{FenceHold, InFlight, WritePermit};
use crate::hold::{HoldReason, WriteRefusal};
use crate::resource::CapacityResource;
use crate::resource::Victim;
use std::sync::atomic::AtomicI64;
use tokio::sync::Notify;

const GROUP: &str = "pool";

/// One scale set in memory. Writes ask the fence's last check first, as the HTTP layer does.
#[derive(Debug, Default)]
struct Fake {
    state: Mutex<FakeState>,
    /// When set, a capacity write waits for it after it was counted.
    gate: Option<Arc<Notify>>,
    /// Told when a write has started.
    started: Notify,
    /// When set, the next instance list is answered as the state was when it was asked, but
    /// only once this is notified (a slow way back); later lists are not held.
    slow_list: Mutex<Option<Arc<Notify>>>,
    /// Told when a held list has taken its answer.
    listed: Notify,
}

#[derive(Debug, Default)]
struct FakeState {
    capacity: i64,
    etag: u64,
    refused: bool,
    /// Capacity writes that reached the resource (past the HTTP layer's last check).
    writes: Vec<i64>,
    /// Deletes that reached the resource.
    deletes: usize,
    /// The next deletes answer 503.
    failing_deletes: usize,
    /// The next deletes are refused with a 429 (`Retry-After: 7`).
    throttled_deletes: usize,
    /// When not empty, a delete is accepted with an operation to poll, and each poll answers
    /// the next of these (`None`: a 503).
    polls: std::collections::VecDeque<Option<OperationStatus>>,
    /// Before the next write is answered, another writer sets this capacity (so it gets a 412).
    rival: Option<i64>,
}

impl Fake {
    fn new(capacity: i64) -> Arc<Self> {
        let fake = Fake::default();
        fake.state.lock().capacity = capacity;
        fake.state.lock().etag = 1;
        Arc::new(fake)
    }

    fn gated(capacity: i64, gate: Arc<Notify>) -> Arc<Self> {
        let fake = Fake {
            gate: Some(gate),
            ..Fake::default()
        };
        fake.state.lock().capacity = capacity;
        fake.state.lock().etag = 1;
        Arc::new(fake)
    }

    fn read(&self) -> ScaleSet {
        let s = self.state.lock();
        ScaleSet {
            name: GROUP.into(),
            location: "westeurope".into(),
            sku_name: Some("Standard_D2s_v5".into()),
            sku_tier: Some("Standard".into()),
            capacity: Some(s.capacity),
            etag: Some(format!("\"{}\"", s.etag)),
            tags: Default::default(),
            provisioning_state: Some("Succeeded".into()),
            extended_location: None,
            agent_pool: None,
            vm_profile: VmProfile::default(),
            zones: Vec::new(),
        }
    }

    fn writes(&self) -> Vec<i64> {
        self.state.lock().writes.clone()
    }

    fn deletes(&self) -> usize {
        self.state.lock().deletes
    }

    fn last_check(op: ArmOp) -> Result<(), ArmError> {
        crate::fence::last_check()
            .map(|_| ())
            .map_err(|hold| ArmError::Fenced {
                op,
                scale_set: GROUP.into(),
                hold,
            })
    }

    /// Another writer's change, if one is due, then whether `precondition` still matches.
    fn precondition_holds(&self, precondition: &Precondition, op: ArmOp) -> Result<(), ArmError> {
        let mut s = self.state.lock();
        if let Some(c) = s.rival.take() {
            s.capacity = c;
            s.etag += 1;
        }
        match precondition.if_match() {
            Some(e) if e != format!("\"{}\"", s.etag) => Err(ArmError::PreconditionFailed {
                op,
                scale_set: GROUP.into(),
                message: "stale ETag".into(),
            }),
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl CapacityResource for Fake {
    fn kind(&self) -> &'static str {
        "vmss"
    }

    async fn list(&self) -> Result<Vec<ScaleSet>, ArmError> {
        Ok(vec![self.read()])
    }

    async fn get(&self, _name: &str) -> Result<Option<ScaleSet>, ArmError> {
        Ok(Some(self.read()))
    }

    async fn write_capacity(
        &self,
        _current: &ScaleSet,
        capacity: i64,
        precondition: &Precondition,
    ) -> Result<PutAccepted, ArmError> {
        Fake::last_check(ArmOp::PutCapacity)?;
        self.state.lock().writes.push(capacity);
        self.started.notify_one();
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        self.precondition_holds(precondition, ArmOp::PutCapacity)?;
        {
            let mut s = self.state.lock();
            s.capacity = capacity;
            s.etag += 1;
        }
        let now = self.read();
        Ok(PutAccepted {
            status: 200,
            etag: now.etag.clone(),
            async_operation: None,
            retry_after: None,
            scale_set: now,
        })
    }

    async fn delete_instances(
        &self,
        _current: &ScaleSet,
        victims: &[Victim],
        precondition: &Precondition,
    ) -> Result<DeleteAccepted, ArmError> {
        Fake::last_check(ArmOp::DeleteInstances)?;
        self.state.lock().deletes += 1;
        self.precondition_holds(precondition, ArmOp::DeleteInstances)?;
        let mut s = self.state.lock();
        if s.throttled_deletes > 0 {
            s.throttled_deletes -= 1;
            return Err(ArmError::Throttled {
                op: ArmOp::DeleteInstances,
                retry_after: std::time::Duration::from_secs(7),
                local: false,
            });
        }
        if s.failing_deletes > 0 {
            s.failing_deletes -= 1;
            return Err(ArmError::Http {
                op: ArmOp::DeleteInstances,
                scale_set: GROUP.into(),
                status: 503,
                code: "ServiceUnavailable".into(),
                message: "try later".into(),
            });
        }
        s.capacity -= victims.len() as i64;
        s.etag += 1;
        let operation = (!s.polls.is_empty()).then(|| "http://127.0.0.1:9/operation".to_string());
        Ok(DeleteAccepted {
            status: if operation.is_some() { 202 } else { 200 },
            async_operation: operation,
            retry_after: None,
        })
    }

    async fn poll_operation(&self, _url: &str) -> Result<OperationStatus, ArmError> {
        match self.state.lock().polls.pop_front() {
            None => Ok(OperationStatus::Succeeded),
            Some(Some(status)) => Ok(status),
            Some(None) => Err(ArmError::Http {
                op: ArmOp::PollOperation,
                scale_set: GROUP.into(),
                status: 503,
                code: "ServiceUnavailable".into(),
                message: "try later".into(),
            }),
        }
    }

    async fn list_instances(&self, _name: &str) -> Result<Vec<Instance>, ArmError> {
        let capacity = self.state.lock().capacity;
        let slow = self.slow_list.lock().take();
        if let Some(way_back) = slow {
            self.listed.notify_one();
            way_back.notified().await;
        }
        Ok((0..capacity)
            .map(|i| Instance {
                instance_id: i.to_string(),
                provisioning_state: Some("Succeeded".into()),
                computer_name: Some(format!("{GROUP}{i:06}")),
                power_state: Some("running".into()),
                zone: None,
            })
            .collect())
    }

    fn write_refusal(&self, _current: &ScaleSet) -> Option<WriteRefusal> {
        self.state
            .lock()
            .refused
            .then_some(WriteRefusal::AksAutoscaler)
    }
}

/// A fence that admits while `open`, and counts admitted writes until their permit is dropped.
/// `closes_after` checks (when not negative), it closes by itself.
#[derive(Debug)]
struct TestFence {
    open: AtomicBool,
    closes_after: AtomicI64,
    in_flight: Arc<InFlight>,
}

impl TestFence {
    fn new() -> Arc<Self> {
        Arc::new(TestFence {
            open: AtomicBool::new(true),
            closes_after: AtomicI64::new(-1),
            in_flight: Arc::default(),
        })
    }
}

impl WriteFence for TestFence {
    fn check(&self) -> Result<(), FenceHold> {
        if self.closes_after.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.open.store(false, Ordering::SeqCst);
        }
        if self.open.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(FenceHold::NotLeader)
        }
    }

    fn admit(&self) -> Result<WritePermit, FenceHold> {
        let counted = self.in_flight.enter();
        self.check()?;
        Ok(InFlight::permit(counted))
    }
}

#[derive(Default)]
struct Recorded(Mutex<Vec<ControllerEvent>>);

impl EventSink for Recorded {
    fn record(&self, event: ControllerEvent) {
        self.0.lock().push(event);
    }
}

impl Recorded {
    fn held(&self) -> Vec<HoldReason> {
        self.0
            .lock()
            .iter()
            .filter_map(|e| match e {
                ControllerEvent::WriteHeld { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }
}

#[derive(Debug)]
struct FixedToken;

#[async_trait::async_trait]
impl azure_core::auth::TokenCredential for FixedToken {
    async fn get_token(
        &self,
        _scopes: &[&str],
    ) -> azure_core::Result<azure_core::auth::AccessToken> {
        let expires = OffsetDateTime::now_utc() + Duration::from_secs(3600);
        Ok(azure_core::auth::AccessToken::new("token", expires))
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

/// Settings for one group `pool` (min 0, max 10, `desiredCapacity` if given) and `extra` YAML.
fn settings(desired: Option<i64>, extra: &str) -> Arc<Settings> {
    let desired = desired.map_or(String::new(), |d| format!(", desiredCapacity: {d}"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let yaml = format!(
        r#"
azure:
  resourceManagerEndpoint: http://127.0.0.1:9
  authorityHost: http://127.0.0.1:9
  tenantId: tenant
  subscriptionId: "00000000-0000-0000-0000-000000000000"
  resourceGroup: rg
  auth: {{method: clientSecret, clientId: controller}}
nodeGroups:
  - {{name: {GROUP}, minSize: 0, maxSize: 10{desired}}}
{extra}
"#
    );
    std::fs::write(&path, yaml).unwrap();
    let sources = ConfigSources {
        config_file: Some(path),
        env: [("ARM_CLIENT_SECRET".to_string(), "s".to_string())].into(),
        ..Default::default()
    };
    Arc::new(crate::config::load(&sources).expect("the test's settings load"))
}

struct Harness {
    reconciler: Reconciler,
    arm: Arc<ArmClient>,
    fake: Arc<Fake>,
    fence: Arc<TestFence>,
    events: Arc<Recorded>,
    metrics: Arc<Metrics>,
}

/// A client that is never sent anything (the fake is the resource): only its token is asked.
fn arm_client(metrics: &Arc<Metrics>) -> Arc<ArmClient> {
    let target = ArmTarget {
        endpoint: url::Url::parse("http://127.0.0.1:9").unwrap(),
        subscription: "sub".into(),
        resource_group: "rg".into(),
    };
    Arc::new(ArmClient::new(
        target,
        Arc::new(FixedToken),
        reqwest::Client::new(),
        metrics.clone(),
    ))
}

fn harness(fake: Arc<Fake>, settings: Arc<Settings>) -> Harness {
    let metrics = Arc::new(Metrics::new());
    let arm = arm_client(&metrics);
    let fence = TestFence::new();
    let events = Arc::new(Recorded::default());
    let reconciler = Reconciler::builder(settings, arm.clone(), metrics.clone())
        .resources(Resources::only(fake.clone()))
        .fence(fence.clone())
        .events(events.clone())
        .build();
    Harness {
        reconciler,
        arm,
        fake,
        fence,
        events,
        metrics,
    }
}

impl Harness {
    fn group(&self) -> NodeGroupSpec {
        self.reconciler.node_groups().groups()[0].clone()
    }

    /// A capacity write of `to` through the guarded send, from a fresh read of the fake.
    async fn write(&self, to: i64) -> Result<(), HoldReason> {
        let current = self.fake.read();
        let fake = self.fake.clone();
        let sent = self
            .reconciler
            .inner
            .guarded_send(
                &self.group(),
                self.fake.as_ref(),
                &current,
                WriteKind::Capacity,
                |p| {
                    let current = current.clone();
                    async move { fake.write_capacity(&current, to, &p).await }
                },
            )
            .await;
        match sent {
            Sent::Answered(_, result) => {
                result.expect("the fake accepts the write");
                Ok(())
            }
            Sent::Held(reason) => Err(reason),
        }
    }

    async fn delete(&self) -> DeleteEnd {
        let victim = Victim {
            instance_id: "0".into(),
            node_name: format!("{GROUP}000000"),
        };
        self.reconciler
            .delete_instance(&self.group(), victim, DeleteKind::Unneeded, &NoLastLook)
            .await
    }

    fn held_total(&self, reason: HoldReason) -> u64 {
        self.metrics
            .writes_held_total
            .with_label_values(&[GROUP, reason.metric_label()])
            .get()
    }
}

fn held(reason: HoldReason) -> DeleteEnd {
    DeleteEnd::Refused(DeleteRefusal::Held(reason))
}

#[tokio::test(start_paused = true)]
async fn a_closed_fence_holds_capacity_writes_and_deletes_and_nothing_reaches_the_resource() {
    let h = harness(Fake::new(3), settings(None, ""));
    h.fence.open.store(false, Ordering::SeqCst);
    let fenced = HoldReason::Fenced(FenceHold::NotLeader);
    assert_eq!(h.write(5).await, Err(fenced));
    assert_eq!(h.delete().await, held(fenced));
    assert!(h.fake.writes().is_empty());
    assert_eq!(h.fake.deletes(), 0);
    assert_eq!(h.held_total(fenced), 2);
}

#[tokio::test(start_paused = true)]
async fn a_spent_budget_holds_capacity_writes_and_deletes_alike_until_it_refills() {
    let h = harness(
        Fake::new(3),
        settings(None, "writeBudget: {perMinute: 1, burst: 2}"),
    );
    assert_eq!(h.write(4).await, Ok(()));
    assert_eq!(h.delete().await, DeleteEnd::Deleted, "the second token");
    assert_eq!(h.write(5).await, Err(HoldReason::Budget));
    assert_eq!(h.delete().await, held(HoldReason::Budget));
    assert_eq!((h.fake.writes(), h.fake.deletes()), (vec![4], 1));
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(h.delete().await, DeleteEnd::Deleted, "refilled: one token");
    assert_eq!(
        h.write(5).await,
        Err(HoldReason::Budget),
        "the delete spent it"
    );
    assert_eq!(h.held_total(HoldReason::Budget), 3);
}

#[tokio::test(start_paused = true)]
async fn an_offering_azure_refused_holds_capacity_writes_until_its_mark_runs_out_but_not_the_delete_that_frees_quota(
) {
    let settings = settings(None, "");
    let h = harness(Fake::new(3), settings.clone());
    let groups = h.reconciler.node_groups();
    groups.scale_sets().upsert(h.fake.read(), Instant::now());
    groups.refused_allocation(
        GROUP,
        AllocationFailure::Quota,
        "QuotaExceeded",
        "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota.",
    );
    let quota = HoldReason::Unavailable(AllocationFailure::Quota);
    assert_eq!(h.write(5).await, Err(quota));
    assert_eq!(h.delete().await, DeleteEnd::Deleted);
    assert!(h.fake.writes().is_empty());
    assert_eq!(h.held_total(quota), 1);
    tokio::time::advance(settings.quota_cooldown - Duration::from_secs(1)).await;
    assert_eq!(h.write(5).await, Err(quota));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(h.write(5).await, Ok(()));
    assert_eq!(h.fake.writes(), [5]);
}

#[tokio::test(start_paused = true)]
async fn a_delete_that_azure_fails_with_a_5xx_backs_off_every_write_to_the_group() {
    let h = harness(Fake::new(3), settings(None, ""));
    h.fake.state.lock().failing_deletes = 1;
    assert!(matches!(h.delete().await, DeleteEnd::Failed(_)));
    assert_eq!(h.delete().await, held(HoldReason::Backoff));
    assert_eq!(h.write(5).await, Err(HoldReason::Backoff));
    assert_eq!(h.fake.deletes(), 1, "the backed-off delete was not sent");
    assert_eq!(
        h.reconciler.delete_hold(&h.group()),
        Some(HoldReason::Backoff),
        "scale-down is told before it drains a node"
    );
    tokio::time::advance(BACKOFF_BASE * 2).await;
    assert_eq!(h.delete().await, DeleteEnd::Deleted);
    assert_eq!(
        h.reconciler.delete_hold(&h.group()),
        None,
        "success resets it"
    );
}

/// Issue 41: an operation's poll errors count in a row, as documented: errors between answered
/// polls do not add up to giving the operation up (before, five errors over a long operation
/// left a delete that succeeded "unknown", its node tainted until a fresh list decided).
#[tokio::test(start_paused = true)]
async fn poll_errors_between_answered_polls_do_not_add_up_to_giving_the_operation_up() {
    let h = harness(Fake::new(3), settings(None, ""));
    {
        let mut s = h.fake.state.lock();
        for _ in 0..6 {
            s.polls.push_back(None);
            s.polls.push_back(Some(OperationStatus::InProgress));
        }
        s.polls.push_back(Some(OperationStatus::Succeeded));
    }
    assert_eq!(h.delete().await, DeleteEnd::Deleted);
    // Five in a row still give it up.
    {
        let mut s = h.fake.state.lock();
        for _ in 0..5 {
            s.polls.push_back(None);
        }
        s.polls.push_back(Some(OperationStatus::Succeeded));
    }
    assert!(matches!(h.delete().await, DeleteEnd::Unknown(_)));
}

/// Issue 41: a 429 on a delete is the subscription's budget, not a failure of the group: its
/// scale-ups go on (before, the delete's 429 doubled a group-wide backoff, and pending pods went
/// elsewhere or nowhere).
#[tokio::test(start_paused = true)]
async fn a_throttled_delete_does_not_back_off_the_groups_scale_ups() {
    let h = harness(Fake::new(3), settings(None, ""));
    h.fake.state.lock().throttled_deletes = 1;
    assert!(matches!(h.delete().await, DeleteEnd::Failed(why) if why.contains("throttled")));
    assert_eq!(h.write(5).await, Ok(()), "the scale-up is not backed off");
    assert_eq!(h.fake.writes(), [5]);
    assert_ne!(
        h.reconciler.delete_hold(&h.group()),
        Some(HoldReason::Backoff),
        "nor are the group's deletes"
    );
    // While the gate a 429 closed is shut, scale-down is told before it drains a node.
    h.arm.gates().close(
        crate::azure::throttle::CallClass::Write,
        std::time::Duration::from_secs(7),
        tokio::time::Instant::now(),
    );
    assert_eq!(
        h.reconciler.delete_hold(&h.group()),
        Some(HoldReason::RetryTurn)
    );
    tokio::time::advance(std::time::Duration::from_secs(8)).await;
    assert_eq!(h.reconciler.delete_hold(&h.group()), None);
}

#[tokio::test(start_paused = true)]
async fn a_resource_that_refuses_this_controller_gets_neither_writes_nor_deletes() {
    let h = harness(Fake::new(3), settings(None, ""));
    h.fake.state.lock().refused = true;
    let refused = HoldReason::Refused(WriteRefusal::AksAutoscaler);
    assert_eq!(h.write(5).await, Err(refused));
    assert_eq!(h.delete().await, held(refused));
    assert!(h.fake.writes().is_empty());
    assert_eq!(h.fake.deletes(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_instance_list_asked_before_a_delete_and_answered_after_it_is_not_cached() {
    let h = Arc::new(harness(Fake::new(3), settings(None, "")));
    h.reconciler.run_once().await.expect("a first pass");
    let groups = h.reconciler.node_groups().groups();
    let instances = h.reconciler.node_groups().instances().clone();
    // The pass cached a list; it runs out (as its TTL would) and a refresh asks again, its
    // answer (3 instances) slow to come back.
    instances.invalidate(GROUP);
    let way_back = Arc::new(Notify::new());
    *h.fake.slow_list.lock() = Some(way_back.clone());
    let refresh = {
        let h = h.clone();
        tokio::spawn(async move {
            h.reconciler
                .node_groups()
                .refresh_instances(&groups, 1.0)
                .await
        })
    };
    h.fake.listed.notified().await;
    // Meanwhile an instance is deleted: the group has 2.
    assert_eq!(h.delete().await, DeleteEnd::Deleted);
    way_back.notify_one();
    refresh.await.unwrap();
    assert!(
        instances.get(GROUP).is_none(),
        "the list from before the delete is not cached: {:?}",
        instances.get(GROUP)
    );
    // The next refresh lists anew and caches what is there now.
    let groups = h.reconciler.node_groups().groups();
    h.reconciler
        .node_groups()
        .refresh_instances(&groups, 1.0)
        .await;
    assert_eq!(instances.get(GROUP).expect("listed again").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_fences_permit_is_held_until_the_answer_is_in() {
    let gate = Arc::new(Notify::new());
    let h = Arc::new(harness(Fake::gated(3, gate.clone()), settings(None, "")));
    let writer = {
        let h = h.clone();
        tokio::spawn(async move { h.write(5).await })
    };
    h.fake.started.notified().await;
    assert_eq!(h.fence.in_flight.count(), 1, "out: the permit is held");
    gate.notify_one();
    assert_eq!(writer.await.unwrap(), Ok(()));
    assert_eq!(h.fence.in_flight.count(), 0, "answered: the permit is back");
}

#[tokio::test(start_paused = true)]
async fn a_fence_that_closes_after_admission_stops_the_request_at_the_last_check() {
    let h = harness(Fake::new(3), settings(None, ""));
    // The early check and the admission pass; the HTTP layer's last check does not.
    h.fence.closes_after.store(2, Ordering::SeqCst);
    let fenced = HoldReason::Fenced(FenceHold::NotLeader);
    assert_eq!(h.write(5).await, Err(fenced));
    assert!(h.fake.writes().is_empty(), "nothing reached the resource");
    assert_eq!(h.held_total(fenced), 1);
    assert_eq!(h.events.held(), [fenced]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_a_412_that_is_held_is_told_like_any_held_write() {
    let h = harness(
        Fake::new(1),
        settings(Some(3), "writeBudget: {perMinute: 1, burst: 1}"),
    );
    h.fake.state.lock().rival = Some(2);
    let report = h.reconciler.run_once().await.expect("a pass");
    assert_eq!(report.conflicts, 1);
    assert_eq!(h.fake.writes(), [3], "the first attempt only");
    assert_eq!(h.events.held(), [HoldReason::Budget], "the WriteHeld Event");
    let status = h.reconciler.status();
    assert_eq!(status[0].held.as_deref(), Some("budget"));
    assert_eq!(
        status[0].last_conflict.as_ref().map(|c| c.outcome.as_str()),
        Some("gave_up")
    );
    assert_eq!(h.held_total(HoldReason::Budget), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_sends_no_write_and_no_delete_and_counts_them_held() {
    let fake = Fake::new(1);
    let metrics = Arc::new(Metrics::new());
    let arm = arm_client(&metrics);
    let reconciler = Reconciler::builder(settings(Some(3), ""), arm, metrics.clone())
        .resources(Resources::only(fake.clone()))
        .dry_run(true)
        .build();
    let report = reconciler.run_once().await.expect("a pass");
    assert_eq!((report.planned, report.held), (1, 1));
    let group = reconciler.node_groups().groups()[0].clone();
    let victim = Victim {
        instance_id: "0".into(),
        node_name: format!("{GROUP}000000"),
    };
    assert_eq!(
        reconciler
            .delete_instance(&group, victim, DeleteKind::Unneeded, &NoLastLook)
            .await,
        held(HoldReason::DryRun)
    );
    assert!(fake.writes().is_empty());
    assert_eq!(fake.deletes(), 0);
}

#[tokio::test(start_paused = true)]
async fn empty_nodes_of_a_group_go_in_one_delete_whose_floor_counts_them_all() {
    let h = harness(Fake::new(3), settings(None, ""));
    let victims = |ids: &[u32]| -> Vec<Victim> {
        ids.iter()
            .map(|i| Victim {
                instance_id: i.to_string(),
                node_name: format!("{GROUP}{i:06}"),
            })
            .collect()
    };
    // Four of three would go below the floor (0): refused whole, nothing sent.
    let end = h
        .reconciler
        .delete_instances(
            &h.group(),
            victims(&[0, 1, 2, 3]),
            DeleteKind::Unneeded,
            &NoLastLook,
        )
        .await;
    assert_eq!(end, DeleteEnd::Refused(DeleteRefusal::BelowFloor));
    assert_eq!(h.fake.deletes(), 0);
    // Two: one request, capacity down by two.
    let end = h
        .reconciler
        .delete_instances(
            &h.group(),
            victims(&[0, 2]),
            DeleteKind::Unneeded,
            &NoLastLook,
        )
        .await;
    assert_eq!(end, DeleteEnd::Deleted);
    assert_eq!(h.fake.deletes(), 1, "one request for both");
    assert_eq!(h.fake.read().capacity, Some(1));
}

/// One planned write of `group` to `to` through the reconciler's whole write path.
async fn planned_write(h: &Harness, from: i64, to: i64) -> WriteEnd {
    let change = crate::planner::CapacityChange {
        scale_set: GROUP.into(),
        from,
        to,
        reason: crate::planner::Reason::Desired,
        step_limited: false,
    };
    h.reconciler.inner.clone().write(&h.group(), change).await.0
}

#[tokio::test(start_paused = true)]
async fn below_the_reserve_of_the_api_budget_azure_reports_scale_ups_go_and_the_rest_waits() {
    // The subscription's writes bucket, as Azure's answers showed it: full at 1000, now 100
    // (10 %, under the 20 % reserve).
    let low = |h: &Harness| {
        h.arm.budget().observe("subscription-writes", 1000);
        h.arm.budget().observe("subscription-writes", 100);
    };
    let h = harness(Fake::new(3), settings(Some(5), ""));
    low(&h);
    assert_eq!(
        planned_write(&h, 3, 5).await,
        WriteEnd::Written,
        "a scale-up goes"
    );
    assert_eq!(h.fake.read().capacity, Some(5));
    // Deletions of unneeded nodes wait only below half the reserve.
    let h = harness(Fake::new(3), settings(None, ""));
    low(&h);
    assert_eq!(h.delete().await, DeleteEnd::Deleted);
    h.arm.budget().observe("subscription-writes", 50);
    assert_eq!(h.delete().await, held(HoldReason::ArmBudgetReserve));
    // Refilled: it goes again.
    h.arm.budget().observe("subscription-writes", 900);
    assert_eq!(h.delete().await, DeleteEnd::Deleted);

    // Lowering a capacity number (a schedule ending) waits below the reserve.
    let h = harness(Fake::new(8), settings(Some(5), ""));
    low(&h);
    assert_eq!(planned_write(&h, 8, 5).await, WriteEnd::Held);
    assert_eq!(h.fake.read().capacity, Some(8));
    assert_eq!(h.held_total(HoldReason::ArmBudgetReserve), 1);
    h.arm.budget().observe("subscription-writes", 900);
    assert_eq!(planned_write(&h, 8, 5).await, WriteEnd::Written);
}
