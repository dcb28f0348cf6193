//! Kubernetes Events (`events.k8s.io/v1`) for the reconciler's and the election's
//! [`ControllerEvent`]s, recorded the way client-go's recorders do it, and never blocking the
//! caller.
//!
//! - **Never blocks.** [`EventRecorder::record`] puts the event on a bounded queue (client-go's
//!   `maxQueuedEvents`, 1000) and returns; when the queue is full the event is dropped and
//!   counted (`kube_events_dropped_total{why="queue_full"}`), as client-go's broadcaster does
//!   with `watch.DropIfChannelFull`. A background [`EventPoster`] makes the API calls.
//! - **Aggregation**, as `k8s.io/client-go/tools/events/event_broadcaster.go` (`recordToSink`,
//!   `getKey`, `finishSeries`): events with the same key (type, reason, action, reporting
//!   controller and instance, regarding object, plus a note key naming the node group, since
//!   all node groups are reported on one object) are one Event. The first creates it; a repeat
//!   within [`SERIES_WINDOW`] (client-go's `finishTime`, 6 minutes) of the last one bumps its
//!   `series` (`count`, `lastObservedTime`) with a strategic merge PATCH
//!   (`createPatchBytesForSeries`); a 404 on that patch (the Event expired or was deleted)
//!   creates it again.
//! - **Rate limit** per (source, object), as the spam filter of
//!   `k8s.io/client-go/tools/record/events_cache.go` (`EventSourceObjectSpamFilter`,
//!   `getSpamKey`: component, host and the involved object; `defaultSpamBurst = 25`,
//!   `defaultSpamQPS = 1/300`): a token bucket of 25 refilled at one every 5 minutes. As there,
//!   the filter is asked after aggregation, so a repeat that is filtered still counts in the
//!   series, and the next patch that goes carries the full count; counts held back are also
//!   sent every [`FLUSH_EVERY`] as tokens allow (client-go refreshes series every 30 minutes).
//!
//! A standby holding writes because it does not lead (`WriteHeld{reason: not_leader}`) is doing
//! its job, not news: no Event (the leader's Events tell the story).

use crate::fence::FenceHold;
use crate::hold::HoldReason;
use crate::metrics::Metrics;
use crate::notify::{ControllerEvent, EventSink, ObjectRef};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "vmss-capacity-controller";
/// Events waiting to be posted at most (client-go's `maxQueuedEvents`).
pub const QUEUE_CAPACITY: usize = 1000;
/// A repeat later than this after the last one starts a new Event (client-go's `finishTime`).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Events a source may post about one object at once (client-go's `defaultSpamBurst`).
pub const SPAM_BURST: f64 = 25.0;
/// One more token every this long (client-go's `defaultSpamQPS`, 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// How often held-back series counts are sent (one token is refilled per [`SPAM_REFILL`]).
pub const FLUSH_EVERY: Duration = Duration::from_secs(60);
/// Aggregation entries kept at most (client-go's `maxLruCacheEntries`).
const CACHE_ENTRIES: usize = 4096;

/// Why an Event call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventApiError {
    /// 404 on a series patch: the Event is gone (expired or deleted).
    #[error("404 Not Found: the Event is gone")]
    NotFound,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The two Event calls the poster makes. Implemented on the API server by [`KubeEvents`].
#[async_trait::async_trait]
pub trait EventApi: Send + Sync {
    /// CREATE in `event.metadata.namespace`.
    async fn create(&self, event: &Event) -> Result<Event, EventApiError>;
    /// Strategic merge PATCH of `series` on Event `name` in `namespace`.
    async fn patch_series(
        &self,
        namespace: &str,
        name: &str,
        series: &EventSeries,
    ) -> Result<Event, EventApiError>;
}

/// `events.k8s.io/v1` Events through the API server (kube-rs).
#[derive(Clone)]
pub struct KubeEvents {
    client: kube::Client,
}

impl KubeEvents {
    /// Events through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

fn classify(e: kube::Error) -> EventApiError {
    match &e {
        kube::Error::Api(status) if status.code == 404 => EventApiError::NotFound,
        _ => EventApiError::Other(e.to_string()),
    }
}

#[async_trait::async_trait]
impl EventApi for KubeEvents {
    async fn create(&self, event: &Event) -> Result<Event, EventApiError> {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        Api::<Event>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), event)
            .await
            .map_err(classify)
    }

    async fn patch_series(
        &self,
        namespace: &str,
        name: &str,
        series: &EventSeries,
    ) -> Result<Event, EventApiError> {
        let patch = serde_json::json!({ "series": series });
        Api::<Event>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(classify)
    }
}

/// Where Events go and whom they name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecorderConfig {
    /// Namespace of the Events (and of the objects they regard).
    pub namespace: String,
    /// `reportingInstance`: this replica's identity.
    pub identity: String,
    /// The status ConfigMap: what node-group Events regard.
    pub status_config_map: String,
    /// The Lease: what leadership Events regard (the ConfigMap when there is none).
    pub lease: Option<String>,
}

/// The [`EventSink`] handed to the reconciler and the election: queues and returns.
pub struct EventRecorder {
    queue: mpsc::Sender<ControllerEvent>,
    metrics: Arc<Metrics>,
    status_uid: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder queueing at most `capacity` events, and the poster that drains the queue
    /// (run it with [`EventPoster::run`]).
    pub fn new(
        config: RecorderConfig,
        api: Arc<dyn EventApi>,
        metrics: Arc<Metrics>,
        capacity: usize,
    ) -> (Self, EventPoster) {
        let (queue, rx) = mpsc::channel(capacity.max(1));
        let status_uid = Arc::new(Mutex::new(None));
        let poster = EventPoster {
            rx,
            api,
            config,
            metrics: metrics.clone(),
            status_uid: status_uid.clone(),
            series: HashMap::new(),
            spam: SpamFilter::default(),
            last_nanos: 0,
        };
        (
            Self {
                queue,
                metrics,
                status_uid,
            },
            poster,
        )
    }

    /// The status ConfigMap's `uid`, once known, so its Events show in `kubectl describe`.
    pub fn set_status_uid(&self, uid: Option<String>) {
        *self.status_uid.lock() = uid;
    }
}

impl EventSink for EventRecorder {
    fn record(&self, event: ControllerEvent) {
        if let Err(e) = self.queue.try_send(event) {
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "queue_full",
                mpsc::error::TrySendError::Closed(_) => "closed",
            };
            self.metrics
                .kube_events_dropped_total
                .with_label_values(&[why])
                .inc();
        }
    }
}

/// What one [`ControllerEvent`] becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    type_: &'static str,
    reason: &'static str,
    action: &'static str,
    note: String,
    /// Part of the aggregation key: the node group (and what differs within a reason).
    note_key: String,
    /// What the Event is about.
    regards: Regards,
}

/// What an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Regards {
    /// The status ConfigMap (node-group events).
    Status,
    /// The Lease (leadership).
    Lease,
    /// A pod or a node (scale-up and scale-down events, in the object's namespace).
    Object(ObjectRef),
}

const NORMAL: &str = "Normal";
const WARNING: &str = "Warning";

fn opt(v: Option<i64>) -> String {
    v.map_or_else(|| "unknown".to_string(), |v| v.to_string())
}

/// Reason, action, type and note per event; `None` for events that are not news.
fn shape(event: &ControllerEvent) -> Option<Shape> {
    let group_shape = |type_, reason, action, group: &str, note: String| Shape {
        type_,
        reason,
        action,
        note,
        note_key: group.to_string(),
        regards: Regards::Status,
    };
    Some(match event {
        ControllerEvent::CapacityWritten {
            group,
            kind,
            from,
            to,
            etag,
        } => group_shape(
            NORMAL,
            "CapacityWritten",
            "Scale",
            group,
            format!(
                "node group {group} ({kind}): capacity {} -> {to} written with If-Match; new ETag {}",
                opt(*from),
                etag.as_deref().unwrap_or("none")
            ),
        ),
        ControllerEvent::Conflict {
            group,
            outcome,
            fresh_capacity,
        } => {
            let (type_, action) = match *outcome {
                "skipped" => (NORMAL, "Skip"),
                "retried_ok" => (NORMAL, "Retry"),
                "gone" => (WARNING, "Drop"),
                _ => (WARNING, "GiveUp"),
            };
            group_shape(
                type_,
                "PreconditionFailed",
                action,
                group,
                format!(
                    "node group {group}: 412 Precondition Failed, another writer changed it; re-read capacity {}, outcome {outcome}",
                    opt(*fresh_capacity)
                ),
            )
        }
        ControllerEvent::ForeignWrite {
            group,
            etag,
            capacity,
        } => group_shape(
            NORMAL,
            "ForeignWrite",
            "Observe",
            group,
            format!(
                "node group {group}: changed by another writer (ETag {etag}, capacity {})",
                opt(*capacity)
            ),
        ),
        ControllerEvent::WriteHeld {
            reason: HoldReason::Fenced(FenceHold::NotLeader),
            ..
        } => return None,
        ControllerEvent::WriteHeld { group, reason } => {
            // Waiting a turn after a 429 is the subscription's bucket at work, not a fault.
            let kind = if *reason == HoldReason::RetryTurn {
                NORMAL
            } else {
                WARNING
            };
            let mut s = group_shape(
                kind,
                "WriteHeld",
                "Hold",
                group,
                format!("node group {group}: planned write not sent ({reason})"),
            );
            s.note_key = format!("{group}/{reason}");
            s
        }
        ControllerEvent::TemplateMismatch {
            group,
            node,
            mismatches,
        } => {
            let mut s = group_shape(
                WARNING,
                "TemplateMismatch",
                "Learn",
                group,
                format!(
                    "node group {group}: node {node} registered otherwise than its template predicted ({mismatches}); the group's template is that node from now on"
                ),
            );
            s.note_key = format!("{group}/{node}");
            s
        }
        ControllerEvent::ScaleUpDidNotHelp {
            group,
            workloads,
            why,
            backoff_secs,
        } => group_shape(
            WARNING,
            "ScaleUpDidNotHelp",
            "Backoff",
            group,
            format!(
                "node group {group}: its new nodes cannot take the pods of {} it grew for ({why}); passed over for them for {backoff_secs}s",
                workloads.join(", ")
            ),
        ),
        ControllerEvent::LeadershipGained { identity } => Shape {
            type_: NORMAL,
            reason: "LeaderElection",
            action: "Acquire",
            note: format!("{identity} became leader"),
            note_key: String::new(),
            regards: Regards::Lease,
        },
        ControllerEvent::LeadershipLost { identity } => Shape {
            type_: WARNING,
            reason: "LeaderElection",
            action: "Lose",
            note: format!("{identity} stopped leading"),
            note_key: String::new(),
            regards: Regards::Lease,
        },
        ControllerEvent::PodTriggeredScaleUp { pod, groups } => Shape {
            type_: NORMAL,
            reason: "TriggeredScaleUp",
            action: "ScaleUp",
            note: format!("pod triggered scale-up: [{groups}]"),
            note_key: String::new(),
            regards: Regards::Object(pod.clone()),
        },
        ControllerEvent::ScaleDown { object, note } => Shape {
            type_: NORMAL,
            reason: "ScaleDown",
            action: "ScaleDown",
            note: note.clone(),
            note_key: String::new(),
            regards: Regards::Object(object.clone()),
        },
        ControllerEvent::ScaleDownFailed { object, why } => Shape {
            type_: WARNING,
            reason: "ScaleDownFailed",
            action: "ScaleDown",
            note: why.clone(),
            note_key: String::new(),
            regards: Regards::Object(object.clone()),
        },
        ControllerEvent::Consolidating { object, note } => Shape {
            type_: NORMAL,
            reason: "Consolidating",
            action: "Consolidate",
            note: note.clone(),
            note_key: String::new(),
            regards: Regards::Object(object.clone()),
        },
        ControllerEvent::Unconsolidatable { object, why, kind } => Shape {
            type_: NORMAL,
            reason: "Unconsolidatable",
            action: "Consolidate",
            note: why.clone(),
            // By kind: a node kept first by an annotation and later by the budget shows both.
            note_key: (*kind).to_string(),
            regards: Regards::Object(object.clone()),
        },
        ControllerEvent::PodNotTriggeredScaleUp { pod, why } => Shape {
            type_: NORMAL,
            reason: "NotTriggerScaleUp",
            action: "ScaleUp",
            note: format!("pod didn't trigger scale-up: {why}"),
            note_key: String::new(),
            regards: Regards::Object(pod.clone()),
        },
    })
}

/// The aggregation key (client-go's `getKey` plus the note key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    type_: &'static str,
    reason: &'static str,
    action: &'static str,
    regarding: (String, String, String, String),
    note_key: String,
}

/// One Event already created, and its series so far.
#[derive(Debug)]
struct Posted {
    event: Event,
    /// Occurrences seen.
    count: i32,
    /// Occurrences the API server has been told of.
    sent: i32,
    /// When the last occurrence was seen (monotonic, for the window).
    last: Instant,
    /// When the last occurrence was seen (wall clock, for `lastObservedTime`).
    observed: MicroTime,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// client-go's spam filter: a token bucket per (source, object) key, [`SPAM_BURST`] deep,
/// refilled one token per [`SPAM_REFILL`]. At most [`CACHE_ENTRIES`] buckets are kept, as
/// client-go's LRU keeps them: a bucket that has refilled completely is the same as none and is
/// dropped first, then the least recently used. (Every pod that ever got a `NotTriggerScaleUp`
/// would otherwise keep a bucket for the process's lifetime.)
#[derive(Debug, Default)]
struct SpamFilter {
    buckets: HashMap<String, Bucket>,
}

impl SpamFilter {
    fn allow(&mut self, key: String, now: Instant) -> bool {
        if !self.buckets.contains_key(&key) && self.buckets.len() >= CACHE_ENTRIES {
            self.prune(now);
        }
        let bucket = self.buckets.entry(key).or_insert(Bucket {
            tokens: SPAM_BURST,
            last: now,
        });
        bucket.tokens = Self::refilled(bucket, now);
        bucket.last = now;
        if bucket.tokens < 1.0 {
            return false;
        }
        bucket.tokens -= 1.0;
        true
    }

    fn refilled(bucket: &Bucket, now: Instant) -> f64 {
        let refill =
            now.saturating_duration_since(bucket.last).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        (bucket.tokens + refill).min(SPAM_BURST)
    }

    fn prune(&mut self, now: Instant) {
        self.buckets
            .retain(|_, b| Self::refilled(b, now) < SPAM_BURST);
        if self.buckets.len() >= CACHE_ENTRIES {
            // Still full of live buckets: forget the least recently used quarter.
            let mut lasts: Vec<Instant> = self.buckets.values().map(|b| b.last).collect();
            lasts.sort_unstable();
            let cut = lasts[lasts.len() / 4];
            self.buckets.retain(|_, b| b.last > cut);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

/// Drains the recorder's queue and makes the API calls: create, series patch, rate limit.
pub struct EventPoster {
    rx: mpsc::Receiver<ControllerEvent>,
    api: Arc<dyn EventApi>,
    config: RecorderConfig,
    metrics: Arc<Metrics>,
    status_uid: Arc<Mutex<Option<String>>>,
    series: HashMap<SeriesKey, Posted>,
    /// Spam filter per (source, object) key.
    spam: SpamFilter,
    last_nanos: i128,
}

impl std::fmt::Debug for EventPoster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPoster")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl EventPoster {
    /// Posts queued events until `shutdown`, then what is already queued, then returns. Every
    /// [`FLUSH_EVERY`] it sends the series counts the rate limit held back.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut flush = tokio::time::interval_at(Instant::now() + FLUSH_EVERY, FLUSH_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = self.rx.recv() => match next {
                    Some(event) => self.post(event).await,
                    None => return,
                },
                _ = flush.tick() => self.flush().await,
                _ = shutdown.cancelled() => break,
            }
        }
        // The last moments (leadership lost on shutdown) are worth posting.
        self.rx.close();
        while let Ok(event) = self.rx.try_recv() {
            self.post(event).await;
        }
    }

    fn regarding(&self, regards: &Regards) -> ObjectReference {
        match (&self.config.lease, regards) {
            (_, Regards::Object(o)) => ObjectReference {
                api_version: Some(o.api_version.into()),
                kind: Some(o.kind.into()),
                namespace: (!o.namespace.is_empty()).then(|| o.namespace.clone()),
                name: Some(o.name.clone()),
                uid: o.uid.clone(),
                ..ObjectReference::default()
            },
            (Some(name), Regards::Lease) => ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                namespace: Some(self.config.namespace.clone()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            },
            _ => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ConfigMap".into()),
                namespace: Some(self.config.namespace.clone()),
                name: Some(self.config.status_config_map.clone()),
                uid: self.status_uid.lock().clone(),
                ..ObjectReference::default()
            },
        }
    }

    /// client-go's spam filter: one token per Event call about this object from this source.
    fn allowed(&mut self, regarding: &ObjectReference, now: Instant) -> bool {
        let key = [
            REPORTING_CONTROLLER,
            self.config.identity.as_str(),
            regarding.kind.as_deref().unwrap_or(""),
            regarding.namespace.as_deref().unwrap_or(""),
            regarding.name.as_deref().unwrap_or(""),
            regarding.api_version.as_deref().unwrap_or(""),
        ]
        .join("/");
        self.spam.allow(key, now)
    }

    fn dropped(&self, why: &str) {
        self.metrics
            .kube_events_dropped_total
            .with_label_values(&[why])
            .inc();
    }

    fn posted(&self, reason: &str) {
        self.metrics
            .kube_events_total
            .with_label_values(&[reason])
            .inc();
    }

    /// A name unique per recorder: `<regarding>.<unix nanos, hex>` as client-go names Events.
    fn event_name(&mut self, regarding: &str) -> String {
        let nanos = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
        self.last_nanos = nanos.max(self.last_nanos + 1);
        format!("{regarding}.{:x}", self.last_nanos)
    }

    fn forget_finished(&mut self, now: Instant) {
        self.series
            .retain(|_, p| now.saturating_duration_since(p.last) <= SERIES_WINDOW);
        if self.series.len() >= CACHE_ENTRIES {
            if let Some(oldest) = self
                .series
                .iter()
                .min_by_key(|(_, p)| p.last)
                .map(|(k, _)| k.clone())
            {
                self.series.remove(&oldest);
            }
        }
    }

    /// Tells the API server the series of `key` so far: a strategic merge PATCH of `series`, or
    /// a create when the Event is gone (404).
    async fn send_series(&mut self, key: &SeriesKey) {
        let Some(p) = self.series.get(key) else {
            return;
        };
        let reason = key.reason;
        let series = EventSeries {
            count: p.count,
            last_observed_time: p.observed.clone(),
        };
        let (ns, name) = (
            p.event.metadata.namespace.clone().unwrap_or_default(),
            p.event.metadata.name.clone().unwrap_or_default(),
        );
        let sent = match self.api.patch_series(&ns, &name, &series).await {
            Ok(_) => None,
            Err(EventApiError::NotFound) => {
                // Expired or deleted: create it again, with the series so far.
                let mut again = p.event.clone();
                again.metadata.resource_version = None;
                again.metadata.uid = None;
                again.metadata.creation_timestamp = None;
                again.metadata.managed_fields = None;
                again.series = Some(series.clone());
                match self.api.create(&again).await {
                    Ok(created) => Some(created),
                    Err(e) => {
                        debug!(error = %e, "could not re-create an expired Event");
                        self.dropped("api_error");
                        return;
                    }
                }
            }
            Err(e) => {
                debug!(error = %e, event = %name, "could not bump an Event's series");
                self.dropped("api_error");
                return;
            }
        };
        self.posted(reason);
        if let Some(p) = self.series.get_mut(key) {
            p.sent = series.count;
            if let Some(created) = sent {
                p.event = created;
            }
        }
    }

    /// Sends the counts that the rate limit held back, as far as tokens allow (client-go's
    /// `refreshExistingEventSeries`, more often: every [`FLUSH_EVERY`]).
    pub async fn flush(&mut self) {
        let now = Instant::now();
        let pending: Vec<(SeriesKey, ObjectReference)> = self
            .series
            .iter()
            .filter(|(_, p)| p.count > p.sent)
            .filter_map(|(k, p)| Some((k.clone(), p.event.regarding.clone()?)))
            .collect();
        for (key, regarding) in pending {
            if self.allowed(&regarding, now) {
                self.send_series(&key).await;
            }
        }
    }

    /// Records one event: a new Event, or a bump of the series of an isomorphic one.
    pub async fn post(&mut self, event: ControllerEvent) {
        let Some(shape) = shape(&event) else {
            return;
        };
        let now = Instant::now();
        self.forget_finished(now);
        let regarding = self.regarding(&shape.regards);
        let key = SeriesKey {
            type_: shape.type_,
            reason: shape.reason,
            action: shape.action,
            regarding: (
                regarding.api_version.clone().unwrap_or_default(),
                regarding.kind.clone().unwrap_or_default(),
                regarding.namespace.clone().unwrap_or_default(),
                regarding.name.clone().unwrap_or_default(),
            ),
            note_key: shape.note_key.clone(),
        };
        if let Some(p) = self.series.get_mut(&key) {
            // A repeat: count it even if the call is filtered, so the next patch is right.
            p.count = p.count.saturating_add(1);
            p.last = now;
            p.observed = now_micro();
            if !self.allowed(&regarding, now) {
                self.dropped("rate_limited");
                return;
            }
            self.send_series(&key).await;
            return;
        }
        if !self.allowed(&regarding, now) {
            self.dropped("rate_limited");
            return;
        }
        let name = self.event_name(
            regarding
                .name
                .as_deref()
                .unwrap_or("vmss-capacity-controller"),
        );
        // An Event lives in its object's namespace (the API server insists); cluster-scoped
        // objects' Events go to `default`, as kubelet's and the scheduler's do.
        let namespace = match &shape.regards {
            Regards::Object(o) if o.namespace.is_empty() => "default".to_string(),
            Regards::Object(o) => o.namespace.clone(),
            _ => self.config.namespace.clone(),
        };
        let new = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            event_time: Some(now_micro()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.config.identity.clone()),
            action: Some(shape.action.into()),
            reason: Some(shape.reason.into()),
            type_: Some(shape.type_.into()),
            note: Some(truncate(&shape.note, 1024)),
            regarding: Some(regarding),
            ..Event::default()
        };
        match self.api.create(&new).await {
            Ok(created) => {
                self.posted(shape.reason);
                self.series.insert(
                    key,
                    Posted {
                        event: created,
                        count: 1,
                        sent: 1,
                        last: now,
                        observed: now_micro(),
                    },
                );
            }
            Err(e) => {
                warn!(error = %e, reason = shape.reason, "could not create a Kubernetes Event");
                self.dropped("api_error");
            }
        }
    }
}

/// At most `max` bytes, cut at a character boundary (the API refuses notes over 1 kB).
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_holding_writes_is_not_news_but_a_stale_lease_is() {
        let held = |reason| ControllerEvent::WriteHeld {
            group: "g".into(),
            reason,
        };
        assert_eq!(shape(&held(HoldReason::Fenced(FenceHold::NotLeader))), None);
        let s = shape(&held(HoldReason::Fenced(FenceHold::RenewalStale))).expect("an Event");
        assert_eq!((s.type_, s.reason), (WARNING, "WriteHeld"));
        let s = shape(&held(HoldReason::RetryTurn)).expect("an Event");
        assert_eq!(
            (s.type_, s.reason),
            (NORMAL, "WriteHeld"),
            "waiting a turn after a 429 is the bucket at work, not a fault"
        );
    }

    #[test]
    fn a_nodes_unconsolidatable_reasons_of_another_kind_are_another_event() {
        let u = |why: &str, kind| ControllerEvent::Unconsolidatable {
            object: ObjectRef {
                api_version: "v1",
                kind: "Node",
                namespace: String::new(),
                name: "n0".into(),
                uid: None,
            },
            why: why.into(),
            kind,
        };
        let key = |e| shape(&e).map(|s| (s.reason, s.action, s.note_key));
        let annotated = key(u("node annotated ...=true", "churn"));
        assert_eq!(
            annotated,
            key(u(
                "its pods changed within consolidation.consolidateAfter",
                "churn"
            )),
            "one kind, one series"
        );
        assert_ne!(
            annotated,
            key(u("the pods' requests rose within ...", "stabilizing"))
        );
    }

    #[test]
    fn conflicts_that_end_well_are_normal_and_those_that_do_not_are_warnings() {
        let c = |outcome| ControllerEvent::Conflict {
            group: "g".into(),
            outcome,
            fresh_capacity: Some(3),
        };
        assert_eq!(shape(&c("skipped")).map(|s| s.type_), Some(NORMAL));
        assert_eq!(shape(&c("retried_ok")).map(|s| s.type_), Some(NORMAL));
        assert_eq!(shape(&c("gave_up")).map(|s| s.type_), Some(WARNING));
        assert_eq!(shape(&c("gone")).map(|s| s.type_), Some(WARNING));
    }

    #[test]
    fn the_spam_filter_keeps_a_bounded_number_of_buckets_and_still_limits_the_busy_object() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        // One object exhausts its burst...
        for _ in 0..SPAM_BURST as usize {
            assert!(f.allow("busy".into(), t0));
        }
        assert!(!f.allow("busy".into(), t0));
        // ...then 20,000 pods get one Event each, over a day.
        for i in 0..20_000u64 {
            let at = t0 + Duration::from_secs(i * 4);
            assert!(f.allow(format!("pod-{i}"), at));
            assert!(f.len() <= CACHE_ENTRIES, "{} buckets", f.len());
        }
        // A bucket forgotten had refilled: forgetting it changed nothing.
        let later = t0 + Duration::from_secs(20_000 * 4);
        assert!(f.allow("busy".into(), later));
    }

    #[test]
    fn a_bucket_still_refilling_is_kept_while_full_ones_are_dropped() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        for _ in 0..SPAM_BURST as usize {
            f.allow("busy".into(), t0);
        }
        for i in 0..CACHE_ENTRIES - 1 {
            f.allow(format!("pod-{i}"), t0 + SPAM_REFILL * 2);
        }
        assert_eq!(f.len(), CACHE_ENTRIES);
        // Pruning now: every one-Event pod bucket has refilled; "busy" (3 of 25) has not.
        let now = t0 + SPAM_REFILL * 3;
        assert!(f.allow("one-more".into(), now));
        assert_eq!(f.len(), 2, "busy and one-more");
        for _ in 0..3 {
            assert!(f.allow("busy".into(), now));
        }
        assert!(
            !f.allow("busy".into(), now),
            "still limited after the pruning"
        );
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
