//! The status ConfigMap with a rival writer: while the controller's [`StatusWriter`] writes N
//! times, a rival updates the same ConfigMap in a loop, adding its own new key each iteration by
//! GET + update carrying the `resourceVersion` it read and retrying its own 409s. At the end no
//! key is lost (every rival key and the controller's latest document are there), every update the
//! controller sent carried a `resourceVersion` (its store is wrapped to record them), and every
//! 409 the controller met was counted in `kube_status_writes_total{result="conflict"}`.
//!
//! The case is written once and runs against two servers: the emulator's Kubernetes side (in
//! process, always) and a real kube-apiserver (1.20 from `../shared/kube-apiserver/`; ignored by
//! plain `cargo test`, run by CI's `cargo test -- --ignored` with `KUBECONFIG` set).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::kube::status::{
    ConfigMapStore, KubeConfigMaps, StatusError, StatusWriter, LAST_UPDATED_ANNOTATION, STATUS_KEY,
};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::notify::GroupStatus;

const NS: &str = "default";
/// Writes the controller makes while the rival runs.
const WRITES: usize = 25;
/// The rival adds at least this many keys, and keeps going until the controller is done.
const MIN_RIVAL_KEYS: usize = 25;
/// Time the recording store waits between handing back a GET and the caller's update, and the
/// rival's pause between its keys: the rival then gets in between a GET and an update about every
/// other time (the 409s this test is about), and only now and then twice running (when the
/// writer, which retries once, gives up that pass). With no pause at all the rival wins every
/// race on a fast server and no controller write goes through while it runs.
const WINDOW: Duration = Duration::from_millis(5);
const RIVAL_PAUSE: Duration = Duration::from_millis(10);

async fn client_from(kubeconfig: &str) -> kube::Client {
    let file = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

async fn real_server() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let text = std::fs::read_to_string(&path).expect("KUBECONFIG is readable");
    client_from(&text).await
}

async fn emulator() -> (kube::Client, EmulatorHandle) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kubeconfig = handle.kubeconfig().expect("the Kubernetes side is on");
    (client_from(&kubeconfig).await, handle)
}

fn group(name: &str, target: i64) -> GroupStatus {
    GroupStatus {
        name: name.into(),
        kind: "vmss".into(),
        min_size: 1,
        max_size: 100,
        target: Some(target),
        capacity: Some(target),
        etag: Some(format!("\"{target}\"")),
        last_write: None,
        last_conflict: None,
        foreign_writes: 0,
        backoff_until: None,
        unavailable: None,
        held: None,
        scale_down_halted: None,
        ..Default::default()
    }
}

/// The controller's real store, recording every update it is asked to send (with or without a
/// `resourceVersion`) and every 409 the server answers.
struct Recording {
    inner: KubeConfigMaps,
    updates: AtomicU64,
    blind_updates: AtomicU64,
    conflicts_seen: AtomicU64,
}

#[async_trait::async_trait]
impl ConfigMapStore for Recording {
    async fn get(&self) -> Result<Option<ConfigMap>, StatusError> {
        let read = self.inner.get().await;
        tokio::time::sleep(WINDOW).await;
        read
    }
    async fn create(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        let r = self.inner.create(cm).await;
        if r == Err(StatusError::AlreadyExists) {
            self.conflicts_seen.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    async fn replace(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        self.updates.fetch_add(1, Ordering::SeqCst);
        if cm.metadata.resource_version.is_none() {
            self.blind_updates.fetch_add(1, Ordering::SeqCst);
        }
        let r = self.inner.replace(cm).await;
        if r == Err(StatusError::Conflict) {
            self.conflicts_seen.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
}

/// The rival: until `stop` (and at least [`MIN_RIVAL_KEYS`] times), adds key `rival-<i>` by GET +
/// update with the version read, retrying its own 409s. Returns (keys added, its 409s).
async fn rival(api: Api<ConfigMap>, name: String, stop: Arc<AtomicBool>) -> (usize, u64) {
    let mut keys = 0usize;
    let mut conflicts = 0u64;
    while keys < MIN_RIVAL_KEYS || !stop.load(Ordering::SeqCst) {
        let key = format!("rival-{keys}");
        loop {
            let mut cm = match api.get_opt(&name).await.expect("the rival reads") {
                Some(cm) => cm,
                None => {
                    // Not created yet: the rival creates it (AlreadyExists: read again).
                    let cm = ConfigMap {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        data: Some(BTreeMap::from([(key.clone(), "1".to_string())])),
                        ..Default::default()
                    };
                    match api.create(&PostParams::default(), &cm).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            conflicts += 1;
                            continue;
                        }
                        Err(e) => panic!("the rival's create failed: {e}"),
                    }
                }
            };
            assert!(cm.metadata.resource_version.is_some());
            cm.data
                .get_or_insert_with(Default::default)
                .insert(key.clone(), "1".to_string());
            match api.replace(&name, &PostParams::default(), &cm).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 => conflicts += 1,
                Err(e) => panic!("the rival's update failed: {e}"),
            }
        }
        keys += 1;
        tokio::time::sleep(RIVAL_PAUSE).await;
    }
    (keys, conflicts)
}

async fn a_rival_writing_in_a_loop_loses_no_key_and_every_409_is_counted(client: kube::Client) {
    let name = format!(
        "status-rival-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let store = Arc::new(Recording {
        inner: KubeConfigMaps::new(client.clone(), NS, &name),
        updates: AtomicU64::new(0),
        blind_updates: AtomicU64::new(0),
        conflicts_seen: AtomicU64::new(0),
    });
    let metrics = Arc::new(Metrics::new());
    let writer = StatusWriter::new(store.clone(), &name, "controller-a").metrics(metrics.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let rival_task = tokio::spawn(rival(api.clone(), name.clone(), stop.clone()));

    // The controller's writes; the last successful one is what must be stored at the end.
    let last_ok: Mutex<Option<(String, String)>> = Mutex::new(None);
    let mut refused = 0u32;
    for i in 0..WRITES {
        match writer.write(vec![group("pool-a", i as i64)]).await {
            Ok(report) => {
                let data = report.written.data.clone().unwrap_or_default();
                let annotations = report
                    .written
                    .metadata
                    .annotations
                    .clone()
                    .unwrap_or_default();
                *last_ok.lock() = Some((
                    data.get(STATUS_KEY).cloned().expect("our key written"),
                    annotations
                        .get(LAST_UPDATED_ANNOTATION)
                        .cloned()
                        .expect("our annotation written"),
                ));
            }
            // Two 409s in a row: the writer gives up this pass (the next pass writes again).
            Err(StatusError::Conflict | StatusError::AlreadyExists) => refused += 1,
            Err(e) => panic!("write {i} failed: {e}"),
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (rival_keys, rival_conflicts) = rival_task.await.expect("the rival ends");

    let cm = api.get(&name).await.expect("the ConfigMap exists");
    let data = cm.data.clone().unwrap_or_default();
    let lost: Vec<String> = (0..rival_keys)
        .map(|i| format!("rival-{i}"))
        .filter(|k| !data.contains_key(k))
        .collect();
    assert!(lost.is_empty(), "rival keys lost: {lost:?}");
    let (ours, when) = last_ok
        .lock()
        .clone()
        .expect("at least one of the controller's writes went through");
    assert_eq!(
        data.get(STATUS_KEY),
        Some(&ours),
        "the controller's latest document is stored"
    );
    assert_eq!(
        cm.metadata
            .annotations
            .unwrap_or_default()
            .get(LAST_UPDATED_ANNOTATION),
        Some(&when),
        "the controller's latest annotation is stored"
    );
    assert_eq!(
        data.len(),
        rival_keys + 1,
        "nothing but the rival's and ours"
    );

    // With the rival gone, the next pass writes at the first try and keeps every key.
    let report = writer
        .write(vec![group("pool-a", WRITES as i64)])
        .await
        .expect("the write after the rival stopped");
    assert_eq!(report.conflicts, 0);
    let after = api.get(&name).await.expect("the ConfigMap exists");
    let after_data = after.data.unwrap_or_default();
    assert_eq!(after_data.len(), rival_keys + 1);
    assert_eq!(
        after_data.get(STATUS_KEY),
        report.written.data.unwrap_or_default().get(STATUS_KEY)
    );

    let updates = store.updates.load(Ordering::SeqCst);
    assert!(updates > 0, "the controller sent updates");
    assert_eq!(
        store.blind_updates.load(Ordering::SeqCst),
        0,
        "every update the controller sent carried a resourceVersion"
    );
    let seen = store.conflicts_seen.load(Ordering::SeqCst);
    let counted =
        Metrics::counter_sum(&metrics.kube_status_writes_total, &[("result", "conflict")]);
    assert_eq!(counted, seen, "every 409 the controller met is counted");
    assert!(
        seen > 0,
        "the rival got between a GET and an update at least once ({updates} updates, {rival_keys} rival keys, {rival_conflicts} rival 409s)"
    );
    let written = Metrics::counter_sum(&metrics.kube_status_writes_total, &[("result", "updated")])
        + Metrics::counter_sum(&metrics.kube_status_writes_total, &[("result", "created")]);
    assert_eq!(written + u64::from(refused), WRITES as u64 + 1);
    eprintln!(
        "{WRITES} controller writes ({refused} given up after two 409s), {updates} updates sent, \
         {seen} 409s met and counted; the rival added {rival_keys} keys and met {rival_conflicts} 409s"
    );
    let _ = api.delete(&name, &DeleteParams::default()).await;
}

/// One test per case and server.
macro_rules! against_both_servers {
    ($($case:ident),* $(,)?) => {
        mod on_the_emulator {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (client, _emulator) = super::emulator().await;
                    super::$case(client).await;
                }
            )*
        }
        mod on_a_real_api_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
                async fn $case() {
                    super::$case(super::real_server().await).await;
                }
            )*
        }
    };
}

against_both_servers!(a_rival_writing_in_a_loop_loses_no_key_and_every_409_is_counted);
