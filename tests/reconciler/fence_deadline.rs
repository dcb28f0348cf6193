//! How long an admitted Azure write may be out (issue 21, item 2): the leader's fence bounds each
//! write's request by the Lease's remaining validity, counted from when the last renewal was
//! sent, less a margin, so no answer is awaited past the moment a standby may take over. Against
//! the emulator's Kubernetes side, on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;
use vmss_capacity_controller::emulator::EmulatorBuilder;
use vmss_capacity_controller::fence::{WriteFence, VALIDITY_MARGIN};
use vmss_capacity_controller::kube::lease::{LeaderElection, LeaseConfig};
use vmss_capacity_controller::kube::KubeLeases;
use vmss_capacity_controller::notify::NoEvents;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_leaders_write_may_be_out_only_while_its_lease_is_valid_less_the_margin() {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let file = kube::config::Kubeconfig::from_yaml(&handle.kubeconfig().expect("kubeconfig"))
        .expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let store = Arc::new(KubeLeases::new(client, "default", "deadline"));
    let lease_duration = Duration::from_secs(15);
    let election = LeaderElection::new(
        LeaseConfig {
            name: "deadline".into(),
            identity: "replica-a".into(),
            lease_duration,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        },
        store,
        Arc::new(NoEvents),
    );
    let fence = election.leadership();
    assert_eq!(
        fence.valid_for(),
        Some(Duration::ZERO),
        "not leading: no time at all"
    );
    let sent = tokio::time::Instant::now();
    assert_eq!(election.try_acquire_or_renew().await, Ok(true));
    let at = |elapsed: Duration| (lease_duration - VALIDITY_MARGIN).saturating_sub(elapsed);
    assert_eq!(fence.valid_for(), Some(at(sent.elapsed())));
    // Admitted just before the fence closes (renewal + 9.9 s): 3.1 s left, not a request timeout.
    tokio::time::advance(Duration::from_millis(9_900) - sent.elapsed()).await;
    assert_eq!(fence.check(), Ok(()));
    assert_eq!(fence.valid_for(), Some(Duration::from_millis(3_100)));
}
