//! The status ConfigMap and the Events recorder against the emulator's Kubernetes API, in
//! process, through kube-rs: create when absent, updates that keep others' keys, a rival write
//! between our GET and our update (409, re-read, retry, both kept), the AlreadyExists path,
//! repeated events aggregated into one Event with a series, a 404 on the series patch that
//! re-creates, and the spam filter and queue bound (paused clock, in-memory API).

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};
use vmss_capacity_controller::kube::events::{
    EventApi, EventApiError, EventRecorder, KubeEvents, RecorderConfig, SPAM_REFILL,
};
use vmss_capacity_controller::kube::status::{
    ConfigMapStore, KubeConfigMaps, StatusError, StatusWriter, LAST_UPDATED_ANNOTATION, STATUS_KEY,
};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::notify::{ControllerEvent, EventSink, GroupStatus};

const NS: &str = "default";
const CM: &str = "vmss-capacity-controller-status";

async fn emulator() -> (EmulatorHandle, KubeState, kube::Client) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kube_state = handle.kube().expect("kubernetes side on");
    let file = kube::config::Kubeconfig::from_yaml(&handle.kubeconfig().expect("kubeconfig"))
        .expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("kubeconfig is usable");
    let client = kube::Client::try_from(config).expect("client");
    (handle, kube_state, client)
}

fn group(name: &str) -> GroupStatus {
    GroupStatus {
        name: name.into(),
        kind: "vmss".into(),
        min_size: 1,
        max_size: 10,
        target: Some(4),
        capacity: Some(3),
        etag: Some("\"7\"".into()),
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

fn stored(k: &KubeState) -> Value {
    k.get("v1", "configmaps", NS, CM)
        .expect("the ConfigMap exists")
}

type Rival = Box<dyn FnOnce(&KubeState) + Send>;

/// The real store, plus rivals who act, one after each of our GETs, as queued.
struct RivalAfterGet {
    inner: KubeConfigMaps,
    kube: KubeState,
    rivals: Mutex<VecDeque<Rival>>,
    blind_updates: AtomicUsize,
    hide_next_get: Mutex<bool>,
}

impl RivalAfterGet {
    fn new(client: &kube::Client, kube: &KubeState) -> Arc<Self> {
        Arc::new(Self {
            inner: KubeConfigMaps::new(client.clone(), NS, CM),
            kube: kube.clone(),
            rivals: Mutex::new(VecDeque::new()),
            blind_updates: AtomicUsize::new(0),
            hide_next_get: Mutex::new(false),
        })
    }

    fn arm(&self, rival: impl FnOnce(&KubeState) + Send + 'static) {
        self.rivals.lock().push_back(Box::new(rival));
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
        if let Some(rival) = rival {
            rival(&self.kube);
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

/// A rival's read-modify-write of one data key (it carries the version it read, too).
fn rival_sets(key: &'static str, value: &'static str) -> impl FnOnce(&KubeState) + Send {
    move |k: &KubeState| {
        let mut cm = k.get("v1", "configmaps", NS, CM).expect("rival reads");
        cm["data"][key] = json!(value);
        k.update("v1", "configmaps", NS, cm).expect("rival writes");
    }
}

fn counter(c: &prometheus::IntCounterVec, labels: &[(&str, &str)]) -> u64 {
    Metrics::counter_sum(c, labels)
}

#[tokio::test]
async fn an_absent_status_config_map_is_created_with_the_document_and_the_annotation() {
    let (_h, k, client) = emulator().await;
    let metrics = Arc::new(Metrics::new());
    let w = StatusWriter::new(
        Arc::new(KubeConfigMaps::new(client, NS, CM)),
        CM,
        "replica-a",
    )
    .metrics(metrics.clone());
    let report = w.write(vec![group("pool-a")]).await.expect("written");
    assert!(report.created);
    let cm = stored(&k);
    let doc: Value = serde_yaml::from_str(cm["data"][STATUS_KEY].as_str().unwrap()).unwrap();
    assert_eq!(doc["leader"], "replica-a");
    assert_eq!(doc["nodeGroups"][0]["name"], "pool-a");
    assert_eq!(doc["nodeGroups"][0]["etag"], "\"7\"");
    let at = cm["metadata"]["annotations"][LAST_UPDATED_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).is_ok()
    );
    assert_eq!(
        counter(&metrics.kube_status_writes_total, &[("result", "created")]),
        1
    );
}

#[tokio::test]
async fn an_update_keeps_the_keys_labels_and_annotations_written_by_others() {
    let (_h, k, client) = emulator().await;
    k.create(
        "v1",
        "configmaps",
        NS,
        json!({"metadata": {"name": CM, "labels": {"team": "infra"},
               "annotations": {"note": "hands off"}}, "data": {"other": "kept"}}),
    )
    .unwrap();
    let w = StatusWriter::new(
        Arc::new(KubeConfigMaps::new(client, NS, CM)),
        CM,
        "replica-a",
    );
    let report = w.write(vec![group("pool-a")]).await.expect("written");
    assert!(!report.created);
    assert_eq!(report.conflicts, 0);
    let cm = stored(&k);
    assert_eq!(cm["data"]["other"], "kept");
    assert_eq!(cm["metadata"]["labels"]["team"], "infra");
    assert_eq!(cm["metadata"]["annotations"]["note"], "hands off");
    assert!(cm["data"][STATUS_KEY]
        .as_str()
        .unwrap()
        .contains("replica-a"));
    assert!(cm["metadata"]["annotations"][LAST_UPDATED_ANNOTATION].is_string());
}

#[tokio::test]
async fn a_rival_update_between_our_get_and_our_update_is_a_409_then_both_writes_are_kept() {
    let (_h, k, client) = emulator().await;
    let metrics = Arc::new(Metrics::new());
    let store = RivalAfterGet::new(&client, &k);
    let w = StatusWriter::new(store.clone(), CM, "replica-a").metrics(metrics.clone());
    w.write(vec![group("pool-a")])
        .await
        .expect("first write creates");
    store.arm(rival_sets("rival", "1"));
    let before = k.resource_version();
    let report = w
        .write(vec![group("pool-b")])
        .await
        .expect("written after one retry");
    assert_eq!(report.conflicts, 1);
    let cm = stored(&k);
    assert_eq!(cm["data"]["rival"], "1", "the rival's key survived");
    assert!(
        cm["data"][STATUS_KEY].as_str().unwrap().contains("pool-b"),
        "ours too"
    );
    assert!(k.resource_version() > before);
    assert_eq!(
        store.blind_updates.load(Ordering::SeqCst),
        0,
        "every update carried a resourceVersion"
    );
    assert_eq!(
        counter(&metrics.kube_status_writes_total, &[("result", "conflict")]),
        1
    );
    assert_eq!(
        counter(&metrics.kube_status_writes_total, &[("result", "updated")]),
        1
    );
}

#[tokio::test]
async fn a_second_409_in_a_row_gives_up_until_the_next_pass_without_a_blind_update() {
    let (_h, k, client) = emulator().await;
    let metrics = Arc::new(Metrics::new());
    let store = RivalAfterGet::new(&client, &k);
    let w = StatusWriter::new(store.clone(), CM, "replica-a").metrics(metrics.clone());
    w.write(vec![]).await.unwrap();
    store.arm(rival_sets("rival", "1"));
    store.arm(rival_sets("rival", "2"));
    assert_eq!(w.write(vec![]).await.unwrap_err(), StatusError::Conflict);
    assert_eq!(
        stored(&k)["data"]["rival"],
        "2",
        "the rival's last write stands"
    );
    assert_eq!(store.blind_updates.load(Ordering::SeqCst), 0);
    assert_eq!(
        counter(&metrics.kube_status_writes_total, &[("result", "conflict")]),
        2
    );
    // The next pass writes.
    w.write(vec![]).await.expect("next pass");
    assert_eq!(stored(&k)["data"]["rival"], "2");
}

#[tokio::test]
async fn a_create_beaten_by_another_replica_reads_and_updates_keeping_its_keys() {
    let (_h, k, client) = emulator().await;
    let store = RivalAfterGet::new(&client, &k);
    // Our GET sees nothing; the other replica creates the ConfigMap before our create.
    *store.hide_next_get.lock() = true;
    store.arm(|k: &KubeState| {
        k.create(
            "v1",
            "configmaps",
            NS,
            json!({"metadata": {"name": CM}, "data": {"rival": "first"}}),
        )
        .expect("rival creates");
    });
    let w = StatusWriter::new(store.clone(), CM, "replica-a");
    let report = w.write(vec![group("pool-a")]).await.expect("written");
    assert!(!report.created, "AlreadyExists: read and updated");
    assert_eq!(report.conflicts, 1);
    let cm = stored(&k);
    assert_eq!(cm["data"]["rival"], "first");
    assert!(cm["data"][STATUS_KEY].is_string());
}

fn recorder_config() -> RecorderConfig {
    RecorderConfig {
        namespace: NS.into(),
        identity: "replica-a_1234".into(),
        status_config_map: CM.into(),
        lease: Some("vmss-capacity-controller".into()),
    }
}

fn held(group: &str) -> ControllerEvent {
    ControllerEvent::WriteHeld {
        group: group.into(),
        reason: vmss_capacity_controller::hold::HoldReason::Fenced(
            vmss_capacity_controller::fence::FenceHold::RenewalStale,
        ),
    }
}

async fn events(client: &kube::Client) -> Vec<Event> {
    kube::Api::<Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("list events")
        .items
}

#[tokio::test]
async fn a_repeated_event_is_one_event_object_whose_series_counts_the_repeats() {
    let (_h, _k, client) = emulator().await;
    let metrics = Arc::new(Metrics::new());
    let (_recorder, mut poster) = EventRecorder::new(
        recorder_config(),
        Arc::new(KubeEvents::new(client.clone())),
        metrics.clone(),
        16,
    );
    for _ in 0..3 {
        poster.post(held("pool-a")).await;
    }
    poster.post(held("pool-b")).await;
    let all = events(&client).await;
    assert_eq!(all.len(), 2, "one Event per node group: {all:#?}");
    let a = all
        .iter()
        .find(|e| e.note.as_deref().is_some_and(|n| n.contains("pool-a")))
        .expect("pool-a's Event");
    assert_eq!(a.series.as_ref().map(|s| s.count), Some(3));
    assert_eq!(a.reason.as_deref(), Some("WriteHeld"));
    assert_eq!(a.type_.as_deref(), Some("Warning"));
    assert_eq!(
        a.reporting_controller.as_deref(),
        Some("vmss-capacity-controller")
    );
    assert_eq!(a.reporting_instance.as_deref(), Some("replica-a_1234"));
    let regarding = a.regarding.clone().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ConfigMap"), Some(CM))
    );
    let b = all
        .iter()
        .find(|e| e.note.as_deref().is_some_and(|n| n.contains("pool-b")))
        .unwrap();
    assert_eq!(b.series, None, "a single occurrence has no series");
    assert_eq!(
        counter(&metrics.kube_events_total, &[("reason", "WriteHeld")]),
        4
    );
}

#[tokio::test]
async fn leadership_events_regard_the_lease() {
    let (_h, _k, client) = emulator().await;
    let (_recorder, mut poster) = EventRecorder::new(
        recorder_config(),
        Arc::new(KubeEvents::new(client.clone())),
        Arc::new(Metrics::new()),
        16,
    );
    poster
        .post(ControllerEvent::LeadershipGained {
            identity: "replica-a_1234".into(),
        })
        .await;
    let all = events(&client).await;
    assert_eq!(all.len(), 1);
    let r = all[0].regarding.clone().unwrap();
    assert_eq!(
        (r.kind.as_deref(), r.name.as_deref()),
        (Some("Lease"), Some("vmss-capacity-controller"))
    );
    assert_eq!(all[0].type_.as_deref(), Some("Normal"));
}

#[tokio::test]
async fn a_series_patch_that_finds_the_event_gone_creates_it_again() {
    let (_h, k, client) = emulator().await;
    let (_recorder, mut poster) = EventRecorder::new(
        recorder_config(),
        Arc::new(KubeEvents::new(client.clone())),
        Arc::new(Metrics::new()),
        16,
    );
    poster.post(held("pool-a")).await;
    let first = events(&client).await;
    let name = first[0].metadata.name.clone().unwrap();
    k.delete("events.k8s.io/v1", "events", NS, &name)
        .expect("deleted");
    poster.post(held("pool-a")).await;
    let again = events(&client).await;
    assert_eq!(again.len(), 1, "re-created");
    assert_eq!(again[0].series.as_ref().map(|s| s.count), Some(2));
}

/// Counts calls; every call succeeds.
#[derive(Default)]
struct Counting {
    creates: AtomicUsize,
    patches: AtomicUsize,
    last_count: Mutex<i32>,
}

#[async_trait::async_trait]
impl EventApi for Counting {
    async fn create(&self, event: &Event) -> Result<Event, EventApiError> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        Ok(event.clone())
    }
    async fn patch_series(
        &self,
        _ns: &str,
        _name: &str,
        series: &EventSeries,
    ) -> Result<Event, EventApiError> {
        self.patches.fetch_add(1, Ordering::SeqCst);
        *self.last_count.lock() = series.count;
        Ok(Event {
            series: Some(series.clone()),
            ..Event::default()
        })
    }
}

#[tokio::test(start_paused = true)]
async fn beyond_a_burst_of_25_events_about_one_object_the_rest_are_dropped_until_tokens_refill() {
    let api = Arc::new(Counting::default());
    let metrics = Arc::new(Metrics::new());
    let (_recorder, mut poster) =
        EventRecorder::new(recorder_config(), api.clone(), metrics.clone(), 64);
    for i in 0..30 {
        poster.post(held(&format!("pool-{i}"))).await;
    }
    assert_eq!(api.creates.load(Ordering::SeqCst), 25);
    assert_eq!(
        counter(
            &metrics.kube_events_dropped_total,
            &[("why", "rate_limited")]
        ),
        5
    );
    // One token every five minutes.
    tokio::time::advance(SPAM_REFILL).await;
    poster.post(held("pool-30")).await;
    poster.post(held("pool-31")).await;
    assert_eq!(api.creates.load(Ordering::SeqCst), 26);
    // Leadership Events regard the Lease: another object, another bucket.
    poster
        .post(ControllerEvent::LeadershipLost {
            identity: "replica-a_1234".into(),
        })
        .await;
    assert_eq!(api.creates.load(Ordering::SeqCst), 27);
}

#[tokio::test(start_paused = true)]
async fn a_repeat_after_the_series_window_starts_a_new_event() {
    let api = Arc::new(Counting::default());
    let (_recorder, mut poster) =
        EventRecorder::new(recorder_config(), api.clone(), Arc::new(Metrics::new()), 8);
    poster.post(held("pool-a")).await;
    poster.post(held("pool-a")).await;
    assert_eq!(
        (
            api.creates.load(Ordering::SeqCst),
            api.patches.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    tokio::time::advance(Duration::from_secs(7 * 60)).await;
    poster.post(held("pool-a")).await;
    assert_eq!(
        (
            api.creates.load(Ordering::SeqCst),
            api.patches.load(Ordering::SeqCst)
        ),
        (2, 1)
    );
}

#[tokio::test]
async fn recording_never_blocks_a_full_queue_drops_and_counts() {
    let metrics = Arc::new(Metrics::new());
    let (recorder, _poster) = EventRecorder::new(
        recorder_config(),
        Arc::new(Counting::default()),
        metrics.clone(),
        2,
    );
    for i in 0..5 {
        recorder.record(held(&format!("pool-{i}")));
    }
    assert_eq!(
        counter(&metrics.kube_events_dropped_total, &[("why", "queue_full")]),
        3
    );
}

#[tokio::test]
async fn the_poster_task_posts_what_the_recorder_queued_and_drains_on_shutdown() {
    let api = Arc::new(Counting::default());
    let (recorder, poster) =
        EventRecorder::new(recorder_config(), api.clone(), Arc::new(Metrics::new()), 8);
    let stop = tokio_util::sync::CancellationToken::new();
    recorder.record(held("pool-a"));
    recorder.record(held("pool-b"));
    stop.cancel();
    poster.run(stop).await;
    assert_eq!(api.creates.load(Ordering::SeqCst), 2);
}

/// As on the real server (checked in `kube_status_real_apiserver.rs`): an `events.k8s.io/v1`
/// Event is also a core `v1` Event, which is what `kubectl get events` lists.
#[tokio::test]
async fn an_event_posted_as_events_k8s_io_is_listed_as_a_core_event_too() {
    let (_h, k, client) = emulator().await;
    let (_recorder, mut poster) = EventRecorder::new(
        recorder_config(),
        Arc::new(KubeEvents::new(client.clone())),
        Arc::new(Metrics::new()),
        16,
    );
    poster.post(held("pool-a")).await;
    poster.post(held("pool-a")).await;
    let core = kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("core events list")
        .items;
    assert_eq!(core.len(), 1);
    let e = &core[0];
    assert_eq!(e.involved_object.name.as_deref(), Some(CM));
    assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
    assert!(e.message.as_deref().is_some_and(|m| m.contains("pool-a")));
    assert_eq!(
        e.reporting_component.as_deref(),
        Some("vmss-capacity-controller")
    );
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
    // One object: same uid and version through both APIs; deleting one deletes the other.
    let twin = events(&client).await;
    assert_eq!(twin[0].metadata.uid, e.metadata.uid);
    assert_eq!(
        twin[0].metadata.resource_version,
        e.metadata.resource_version
    );
    k.delete("v1", "events", NS, e.metadata.name.as_deref().unwrap())
        .unwrap();
    assert!(events(&client).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn repeats_held_back_by_the_rate_limit_still_count_and_their_total_is_sent_when_a_token_returns(
) {
    let api = Arc::new(Counting::default());
    let metrics = Arc::new(Metrics::new());
    let (_recorder, mut poster) =
        EventRecorder::new(recorder_config(), api.clone(), metrics.clone(), 8);
    for _ in 0..31 {
        poster.post(held("pool-a")).await;
    }
    // One create and 24 patches spend the burst of 25; six repeats are held back.
    assert_eq!(api.creates.load(Ordering::SeqCst), 1);
    assert_eq!(api.patches.load(Ordering::SeqCst), 24);
    assert_eq!(*api.last_count.lock(), 25);
    assert_eq!(
        counter(
            &metrics.kube_events_dropped_total,
            &[("why", "rate_limited")]
        ),
        6
    );
    poster.flush().await;
    assert_eq!(api.patches.load(Ordering::SeqCst), 24, "no token yet");
    tokio::time::advance(SPAM_REFILL).await;
    poster.flush().await;
    assert_eq!(api.patches.load(Ordering::SeqCst), 25);
    assert_eq!(*api.last_count.lock(), 31, "the full count, nothing lost");
    poster.flush().await;
    assert_eq!(
        api.patches.load(Ordering::SeqCst),
        25,
        "nothing pending any more"
    );
}
