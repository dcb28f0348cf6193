//! The status ConfigMap's 409 handling and the Events recorder's aggregation against a real
//! Kubernetes API server (kube-apiserver 1.20 from `../shared/kube-apiserver/`, started by
//! `.ci/run`): the server, not a fake, refuses an update from a stale read with 409 Conflict, and
//! validates and stores the `events.k8s.io/v1` Events and their series patches.
//!
//! Ignored by plain `cargo test` (it needs the server); `.ci/run` starts the server and runs
//! `cargo test --test kube status_real_apiserver:: -- --ignored` with `KUBECONFIG` set.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, PostParams};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use vmss_capacity_controller::kube::events::{EventRecorder, KubeEvents, RecorderConfig};
use vmss_capacity_controller::kube::status::{
    ConfigMapStore, KubeConfigMaps, StatusError, StatusWriter, LAST_UPDATED_ANNOTATION, STATUS_KEY,
};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::notify::ControllerEvent;

const NS: &str = "default";

async fn client() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let file = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn unique(test: &str) -> String {
    format!("{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// The real store, plus a rival who read-modify-writes one key (with the version it read) after
/// each of our GETs, as queued; and a way to make our next GET see nothing.
struct RivalAfterGet {
    inner: KubeConfigMaps,
    api: Api<ConfigMap>,
    name: String,
    rivals: Mutex<VecDeque<(&'static str, &'static str)>>,
    hide_next_get: Mutex<bool>,
    blind_updates: AtomicUsize,
}

impl RivalAfterGet {
    fn new(client: &kube::Client, name: &str) -> Arc<Self> {
        Arc::new(Self {
            inner: KubeConfigMaps::new(client.clone(), NS, name),
            api: Api::namespaced(client.clone(), NS),
            name: name.to_string(),
            rivals: Mutex::new(VecDeque::new()),
            hide_next_get: Mutex::new(false),
            blind_updates: AtomicUsize::new(0),
        })
    }

    async fn rival_writes(&self, key: &str, value: &str) {
        match self.api.get_opt(&self.name).await.expect("rival reads") {
            Some(mut cm) => {
                cm.data
                    .get_or_insert_with(Default::default)
                    .insert(key.into(), value.into());
                self.api
                    .replace(&self.name, &PostParams::default(), &cm)
                    .await
                    .expect("rival updates");
            }
            None => {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(self.name.clone());
                cm.data = Some([(key.to_string(), value.to_string())].into());
                self.api
                    .create(&PostParams::default(), &cm)
                    .await
                    .expect("rival creates");
            }
        }
    }
}

#[async_trait::async_trait]
impl ConfigMapStore for RivalAfterGet {
    async fn get(&self) -> Result<Option<ConfigMap>, StatusError> {
        let read = if std::mem::take(&mut *self.hide_next_get.lock()) {
            None
        } else {
            self.inner.get().await?
        };
        let rival = self.rivals.lock().pop_front();
        if let Some((k, v)) = rival {
            self.rival_writes(k, v).await;
        }
        Ok(read)
    }
    async fn create(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        self.inner.create(cm).await
    }
    async fn replace(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        if cm.metadata.resource_version.is_none() {
            self.blind_updates.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.replace(cm).await
    }
}

async fn cleanup(client: &kube::Client, name: &str) {
    let _ = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await;
}

#[tokio::test]
#[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
async fn on_a_real_api_server_a_rival_update_between_get_and_update_is_a_409_and_both_keys_are_kept(
) {
    let c = client().await;
    let name = unique("status-409");
    let store = RivalAfterGet::new(&c, &name);
    let metrics = Arc::new(Metrics::new());
    let w = StatusWriter::new(store.clone(), &name, "replica-a").metrics(metrics.clone());
    assert!(w.write(vec![]).await.expect("created").created);
    store.rivals.lock().push_back(("rival", "1"));
    let report = w.write(vec![]).await.expect("written after one retry");
    assert_eq!(report.conflicts, 1, "the server refused the stale update");
    let cm = store.api.get(&name).await.unwrap();
    let data = cm.data.clone().unwrap();
    assert_eq!(data.get("rival").map(String::as_str), Some("1"));
    assert!(data[STATUS_KEY].contains("leader: replica-a"));
    assert!(cm
        .metadata
        .annotations
        .unwrap()
        .contains_key(LAST_UPDATED_ANNOTATION));
    // Two rival writes in a row: the second update is refused too, and we give up for this pass.
    store.rivals.lock().extend([("rival", "2"), ("rival", "3")]);
    assert_eq!(w.write(vec![]).await.unwrap_err(), StatusError::Conflict);
    assert_eq!(
        store.api.get(&name).await.unwrap().data.unwrap()["rival"],
        "3"
    );
    assert_eq!(store.blind_updates.load(Ordering::SeqCst), 0);
    assert_eq!(
        Metrics::counter_sum(&metrics.kube_status_writes_total, &[("result", "conflict")]),
        3
    );
    cleanup(&c, &name).await;
}

#[tokio::test]
#[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
async fn on_a_real_api_server_a_create_beaten_by_a_rival_reads_and_updates() {
    let c = client().await;
    let name = unique("status-exists");
    let store = RivalAfterGet::new(&c, &name);
    *store.hide_next_get.lock() = true;
    store.rivals.lock().push_back(("rival", "first"));
    let w = StatusWriter::new(store.clone(), &name, "replica-a");
    let report = w.write(vec![]).await.expect("written");
    assert!(!report.created);
    assert_eq!(report.conflicts, 1, "409 AlreadyExists");
    let data = store.api.get(&name).await.unwrap().data.unwrap();
    assert_eq!(data["rival"], "first");
    assert!(data.contains_key(STATUS_KEY));
    cleanup(&c, &name).await;
}

#[tokio::test]
#[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
async fn on_a_real_api_server_a_blind_update_is_never_sent() {
    let c = client().await;
    let name = unique("status-blind");
    let store = KubeConfigMaps::new(c.clone(), NS, &name);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.clone());
    let created = store.create(&cm).await.unwrap();
    let mut blind = created;
    blind.metadata.resource_version = None;
    assert!(matches!(
        store.replace(&blind).await,
        Err(StatusError::Other(_))
    ));
    cleanup(&c, &name).await;
}

async fn events_about(client: &kube::Client, regarding: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n == regarding)
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the real API server: run by .ci/run with KUBECONFIG set"]
async fn on_a_real_api_server_a_repeated_event_is_one_event_whose_series_counts_and_a_deleted_one_comes_back(
) {
    let c = client().await;
    let cm = unique("events");
    let metrics = Arc::new(Metrics::new());
    let (_recorder, mut poster) = EventRecorder::new(
        RecorderConfig {
            namespace: NS.into(),
            identity: "replica-a_1234".into(),
            status_config_map: cm.clone(),
            lease: None,
        },
        Arc::new(KubeEvents::new(c.clone())),
        metrics.clone(),
        16,
    );
    let held = || ControllerEvent::WriteHeld {
        group: "pool-a".into(),
        reason: vmss_capacity_controller::hold::HoldReason::Fenced(
            vmss_capacity_controller::fence::FenceHold::RenewalStale,
        ),
    };
    for _ in 0..3 {
        poster.post(held()).await;
    }
    poster
        .post(ControllerEvent::CapacityWritten {
            group: "pool-a".into(),
            kind: "vmss",
            from: Some(3),
            to: 5,
            etag: Some("\"8\"".into()),
        })
        .await;
    assert_eq!(
        Metrics::counter_sum(&metrics.kube_events_dropped_total, &[]),
        0,
        "the server accepted every create and patch"
    );
    let all = events_about(&c, &cm).await;
    assert_eq!(all.len(), 2, "{all:#?}");
    let held_event = all
        .iter()
        .find(|e| e.reason.as_deref() == Some("WriteHeld"))
        .expect("the held Event");
    assert_eq!(held_event.series.as_ref().map(|s| s.count), Some(3));
    assert_eq!(held_event.type_.as_deref(), Some("Warning"));
    // The same object through the core API (what `kubectl get events` lists): the emulator
    // mirrors this.
    let core = Api::<k8s_openapi::api::core::v1::Event>::namespaced(c.clone(), NS)
        .get(held_event.metadata.name.as_deref().unwrap())
        .await
        .expect("the core view of the Event");
    assert_eq!(core.metadata.uid, held_event.metadata.uid);
    assert_eq!(core.involved_object.name.as_deref(), Some(cm.as_str()));
    assert_eq!(core.message, held_event.note);
    assert_eq!(
        core.reporting_component.as_deref(),
        Some("vmss-capacity-controller")
    );
    assert_eq!(core.series.as_ref().and_then(|s| s.count), Some(3));
    // Deleted meanwhile: the next repeat's patch gets 404 and creates it again.
    let name = held_event.metadata.name.clone().unwrap();
    Api::<Event>::namespaced(c.clone(), NS)
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleted");
    poster.post(held()).await;
    let again = events_about(&c, &cm).await;
    let held_again = again
        .iter()
        .find(|e| e.reason.as_deref() == Some("WriteHeld"))
        .expect("re-created");
    assert_eq!(held_again.series.as_ref().map(|s| s.count), Some(4));
    assert_eq!(
        Metrics::counter_sum(&metrics.kube_events_dropped_total, &[]),
        0
    );
}
