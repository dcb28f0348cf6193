//! Fencing at the write path: the reconciler asks the fence immediately before every Azure
//! write, so a replica that is not the leader, or whose lease renewal is stale, sends nothing.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;
use vmss_capacity_controller::emulator::{EmulatorBuilder, FaultKind};
use vmss_capacity_controller::fence::{FenceHold, WriteFence};
use vmss_capacity_controller::reconciler::Reconciler;

/// Lets the first `open` checks pass, then holds with `hold`.
#[derive(Debug)]
struct Closing {
    open: usize,
    asked: AtomicUsize,
    hold: FenceHold,
}

impl WriteFence for Closing {
    fn check(&self) -> Result<(), FenceHold> {
        if self.asked.fetch_add(1, Ordering::SeqCst) < self.open {
            Ok(())
        } else {
            Err(self.hold)
        }
    }
}

async fn fenced(kind: Kind, fence: Closing) -> Harness {
    let mut h = Harness::with_kind(
        kind,
        EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
    h.reconciler = Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
        .fence(Arc::new(fence))
        .build();
    h
}

for_each_kind! {
#[tokio::test]
async fn a_replica_that_is_not_the_leader_sends_no_write(kind: Kind) {
    let h = fenced(kind, Closing { open: 0, asked: AtomicUsize::new(0), hold: FenceHold::NotLeader }).await;
    h.reconciler.run_once().await.expect("a held write is not a failed pass");
    assert!(h.our_puts().is_empty());
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(
        h.counter(&h.metrics.writes_held_total, &[("scale_set", "pool-a"), ("reason", "not_leader")]),
        1
    );
}
}

for_each_kind! {
#[tokio::test]
async fn a_lease_gone_stale_during_the_read_before_a_write_stops_that_write(kind: Kind) {
    // The first check passes; the write needs a GET first (no ETag in the LIST); the lease
    // renewal goes stale meanwhile; the check just before the PUT holds it.
    let h = fenced(kind, Closing { open: 1, asked: AtomicUsize::new(0), hold: FenceHold::RenewalStale }).await;
    h.state.inject_fault(fault(
        Some("GET"),
        Some(kind.path("").trim_matches('/')),
        FaultKind::NoEtag,
        Some(1),
    ));
    h.reconciler.run_once().await.expect("pass");
    assert_eq!(h.our_requests("GET", &kind.path("pool-a")).len(), 1, "the read happened");
    assert!(h.our_puts().is_empty(), "the write did not");
    assert_eq!(
        h.counter(&h.metrics.writes_held_total, &[("scale_set", "pool-a"), ("reason", "lease_stale")]),
        1
    );
}
}

/// A fence open until a token is fetched while one of its writes is admitted and not yet sent:
/// that fetch stands for a token endpoint slow enough (up to the request timeout) for the lease
/// to run out between the admission and the send.
#[derive(Debug, Default)]
struct ClosedBySlowToken {
    closed: std::sync::atomic::AtomicBool,
    in_flight: Arc<vmss_capacity_controller::fence::InFlight>,
}

impl WriteFence for ClosedBySlowToken {
    fn check(&self) -> Result<(), FenceHold> {
        if self.closed.load(Ordering::SeqCst) {
            Err(FenceHold::RenewalStale)
        } else {
            Ok(())
        }
    }
    fn admit(&self) -> Result<vmss_capacity_controller::fence::WritePermit, FenceHold> {
        let guard = self.in_flight.enter();
        self.check()?;
        Ok(vmss_capacity_controller::fence::InFlight::permit(guard))
    }
}

/// The emulator's token; a fetch made while a write is admitted closes `fence`.
#[derive(Debug)]
struct SlowToken {
    token: String,
    fence: Arc<ClosedBySlowToken>,
}

#[async_trait::async_trait]
impl azure_core::auth::TokenCredential for SlowToken {
    async fn get_token(&self, _: &[&str]) -> azure_core::Result<azure_core::auth::AccessToken> {
        if self.fence.in_flight.count() > 0 {
            self.fence.closed.store(true, Ordering::SeqCst);
        }
        let expires = time::OffsetDateTime::now_utc() + std::time::Duration::from_secs(3600);
        Ok(azure_core::auth::AccessToken::new(
            self.token.clone(),
            expires,
        ))
    }
    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

for_each_kind! {
#[tokio::test]
async fn a_lease_that_runs_out_while_the_write_waits_for_its_token_stops_that_write(kind: Kind) {
    let mut h = Harness::with_kind(
        kind,
        EmulatorBuilder::new(),
        &[("pool-a", 3)],
        vec![group("pool-a", 0, 10, Some(6))],
        |_| {},
    )
    .await;
    let fence = Arc::new(ClosedBySlowToken::default());
    let credential = Arc::new(SlowToken {
        token: h.state.issue_token("controller"),
        fence: fence.clone(),
    });
    let arm = Arc::new(vmss_capacity_controller::azure::ArmClient::new(
        vmss_capacity_controller::azure::arm::ArmTarget {
            endpoint: url::Url::parse(&h.emulator.base_url()).unwrap(),
            subscription: SUB.into(),
            resource_group: RG.into(),
        },
        credential,
        vmss_capacity_controller::azure::arm::http_client(std::time::Duration::from_secs(10), None)
            .unwrap(),
        h.metrics.clone(),
    ));
    h.reconciler = Reconciler::builder(h.settings.clone(), arm, h.metrics.clone())
        .fence(fence.clone())
        .build();
    h.reconciler.run_once().await.expect("a held write is not a failed pass");
    assert!(fence.closed.load(Ordering::SeqCst), "a token was fetched with a write admitted");
    assert!(h.our_puts().is_empty(), "the write left after the lease ran out: {:?}", h.our_puts());
    assert_eq!(h.capacity_now("pool-a").await, 3);
    assert_eq!(
        h.counter(&h.metrics.writes_held_total, &[("scale_set", "pool-a"), ("reason", "lease_stale")]),
        1
    );
}
}
