//! Leader election on a Lease against two servers: the emulator's Kubernetes side (in process,
//! always run) and a real Kubernetes API server (kube-apiserver 1.20 from
//! `../shared/kube-apiserver/`, started by `.ci/run`). The server, not a fake, refuses the
//! second update made from one read with 409 Conflict, so two candidates cannot both lead.
//! The cases are written once and run against both: where they disagree, the emulator is wrong.
//!
//! The real-server tests are ignored by plain `cargo test` (they need the server); `.ci/run`
//! starts it and runs `cargo test --test kube lease:: -- --ignored` with `KUBECONFIG` set.

use std::sync::Arc;
use std::time::Duration;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::fence::{FenceHold, WriteFence};
use vmss_capacity_controller::kube::lease::{LeaderElection, LeaseConfig, LeaseError, LeaseStore};
use vmss_capacity_controller::kube::KubeLeases;
use vmss_capacity_controller::notify::NoEvents;

async fn client_from(kubeconfig: &str) -> kube::Client {
    let file = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// The real server named by `KUBECONFIG`.
async fn real_server() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let text = std::fs::read_to_string(&path).expect("KUBECONFIG is readable");
    client_from(&text).await
}

/// The emulator with its Kubernetes side; the handle keeps it running.
async fn emulator() -> (kube::Client, EmulatorHandle) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kubeconfig = handle.kubeconfig().expect("the Kubernetes side is on");
    (client_from(&kubeconfig).await, handle)
}

fn lease_name(test: &str) -> String {
    format!("{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

fn candidate(client: &kube::Client, lease: &str, id: &str) -> (LeaderElection, Arc<KubeLeases>) {
    let store = Arc::new(KubeLeases::new(client.clone(), "default", lease));
    let e = LeaderElection::new(
        LeaseConfig {
            name: lease.into(),
            identity: id.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        },
        store.clone(),
        Arc::new(NoEvents),
    );
    (e, store)
}

async fn exactly_one_of_two_candidates_leads(c: kube::Client) {
    let name = lease_name("two");
    let (a, store) = candidate(&c, &name, "replica-a");
    let (b, _) = candidate(&c, &name, "replica-b");
    assert_eq!(a.try_acquire_or_renew().await, Ok(true));
    assert_eq!(b.try_acquire_or_renew().await, Ok(false));
    assert_eq!(a.try_acquire_or_renew().await, Ok(true), "renewal");
    assert_eq!(a.leadership().check(), Ok(()));
    assert_eq!(b.leadership().check(), Err(FenceHold::NotLeader));
    let lease = store.get().await.unwrap().unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-a")
    );
}

async fn an_update_from_a_stale_read_is_refused_with_409(c: kube::Client) {
    let name = lease_name("stale");
    let (a, store) = candidate(&c, &name, "replica-a");
    a.try_acquire_or_renew().await.unwrap();
    let read = store.get().await.unwrap().unwrap();
    let mut first = read.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("replica-b".into());
    let mut second = read.clone();
    second.spec.as_mut().unwrap().holder_identity = Some("replica-c".into());
    assert!(store.replace(&first).await.is_ok());
    assert_eq!(store.replace(&second).await, Err(LeaseError::Conflict));
    let mut blind = read;
    blind.metadata.resource_version = None;
    assert!(
        matches!(store.replace(&blind).await, Err(LeaseError::Other(_))),
        "an update without a resourceVersion is never sent"
    );
}

async fn a_released_lease_is_taken_over_at_once(c: kube::Client) {
    let name = lease_name("release");
    let (a, store) = candidate(&c, &name, "replica-a");
    let (b, _) = candidate(&c, &name, "replica-b");
    a.try_acquire_or_renew().await.unwrap();
    assert_eq!(b.try_acquire_or_renew().await, Ok(false));
    a.release().await;
    let lease = store.get().await.unwrap().unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity, None, "holder cleared");
    assert_eq!(b.try_acquire_or_renew().await, Ok(true));
    assert_eq!(a.leadership().check(), Err(FenceHold::NotLeader));
}

/// One test per case and server.
macro_rules! against_both_servers {
    ($($case:ident),* $(,)?) => {
        mod on_the_emulator {
            $(
                #[tokio::test]
                async fn $case() {
                    let (client, _emulator) = super::emulator().await;
                    super::$case(client).await;
                }
            )*
        }
        mod on_a_real_api_server {
            $(
                #[tokio::test]
                #[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
                async fn $case() {
                    super::$case(super::real_server().await).await;
                }
            )*
        }
    };
}

against_both_servers!(
    exactly_one_of_two_candidates_leads,
    an_update_from_a_stale_read_is_refused_with_409,
    a_released_lease_is_taken_over_at_once,
);
