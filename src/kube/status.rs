//! The status ConfigMap: the leader's view of every node group, where `kubectl` users can read it
//! (cluster-autoscaler's `cluster-autoscaler-status` idea, with this project's content).
//!
//! The document is YAML under one data key, [`STATUS_KEY`], plus the annotation
//! [`LAST_UPDATED_ANNOTATION`] (RFC 3339). It is written with Kubernetes' own optimistic
//! concurrency, the twin of the ETag protocol on the Azure side: GET, change only the
//! controller's key and annotation, then an update carrying the `resourceVersion` that was read.
//! A 409 Conflict means somebody else wrote the ConfigMap in between: re-read, re-apply, try once
//! more. Keys, labels and annotations written by others are kept. An absent ConfigMap is
//! created; 409 AlreadyExists (another replica created it first) reads and updates. An update
//! without a `resourceVersion` is never sent: the server would accept it unconditionally and
//! could wipe a rival's keys.
//!
//! The leader writes every pass, like cluster-autoscaler, even when only the time changed: the
//! annotation then doubles as a heartbeat (a stale `last-updated` means no leader is working).

use crate::fence::WriteFence;
use crate::metrics::Metrics;
use crate::notify::GroupStatus;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The data key holding the YAML document (as `cluster-autoscaler-status` uses `status`).
pub const STATUS_KEY: &str = "status";
/// The annotation holding the time of the last write (RFC 3339).
pub const LAST_UPDATED_ANNOTATION: &str = "vmss-capacity-controller.io/last-updated";

/// Why a ConfigMap call failed, as far as the writer cares.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusError {
    /// 409 Conflict: the `resourceVersion` sent is stale; somebody else wrote the ConfigMap.
    #[error("409 Conflict: the status ConfigMap changed since it was read")]
    Conflict,
    /// 409 AlreadyExists on create: somebody else created it first.
    #[error("409 AlreadyExists: the status ConfigMap was created by somebody else")]
    AlreadyExists,
    /// The document could not be serialised.
    #[error("serialising the status document: {0}")]
    Serialize(String),
    /// The ConfigMap exists without the owner annotation the writer was told to require
    /// ([`StatusWriter::owner`]): another program writes it (AKS's managed cluster-autoscaler
    /// writes `cluster-autoscaler-status`); nothing was written.
    #[error("ConfigMap {name} exists without the annotation {annotation}={value}: another program owns it, not written")]
    Foreign {
        /// The ConfigMap's name.
        name: String,
        /// The owner annotation's key.
        annotation: String,
        /// The value it must have.
        value: String,
    },
    /// Anything else (the API server down, 403, a timeout, a refused blind update).
    #[error("{0}")]
    Other(String),
}

/// The three ConfigMap calls the writer makes (as [`super::lease::LeaseStore`] for the Lease).
/// Implemented on the API server by [`KubeConfigMaps`]; tests inject a rival write between a GET
/// and the update through it.
#[async_trait::async_trait]
pub trait ConfigMapStore: Send + Sync {
    /// GET; `Ok(None)` on 404.
    async fn get(&self) -> Result<Option<ConfigMap>, StatusError>;
    /// CREATE.
    async fn create(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError>;
    /// UPDATE (PUT) carrying `cm.metadata.resourceVersion`.
    async fn replace(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError>;
}

/// The status ConfigMap through the API server (kube-rs).
pub struct KubeConfigMaps {
    api: Api<ConfigMap>,
    name: String,
}

impl KubeConfigMaps {
    /// ConfigMap `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn classify(e: kube::Error) -> StatusError {
    match &e {
        kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
            StatusError::AlreadyExists
        }
        kube::Error::Api(status) if status.code == 409 => StatusError::Conflict,
        _ => StatusError::Other(e.to_string()),
    }
}

#[async_trait::async_trait]
impl ConfigMapStore for KubeConfigMaps {
    async fn get(&self) -> Result<Option<ConfigMap>, StatusError> {
        self.api.get_opt(&self.name).await.map_err(classify)
    }

    async fn create(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        self.api
            .create(&PostParams::default(), cm)
            .await
            .map_err(classify)
    }

    async fn replace(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
        if cm.metadata.resource_version.is_none() {
            // Never a blind update: without a version the server would accept it unconditionally.
            return Err(StatusError::Other(format!(
                "refusing to update ConfigMap {} without a resourceVersion",
                self.name
            )));
        }
        self.api
            .replace(&self.name, &PostParams::default(), cm)
            .await
            .map_err(classify)
    }
}

/// The YAML document under [`STATUS_KEY`]; `explain` reads it back
/// ([`StatusDocument::from_config_map`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// The identity of the leader that wrote it.
    pub leader: String,
    /// When (RFC 3339, UTC).
    pub time: String,
    /// Every node group.
    pub node_groups: Vec<GroupStatus>,
}

impl StatusDocument {
    /// The document a status ConfigMap holds, or what is wrong with it (in words naming the
    /// ConfigMap and the key).
    pub fn from_config_map(cm: &ConfigMap) -> Result<Self, String> {
        let name = format!(
            "ConfigMap {}/{}",
            cm.metadata.namespace.as_deref().unwrap_or("?"),
            cm.metadata.name.as_deref().unwrap_or("?")
        );
        let yaml = cm
            .data
            .as_ref()
            .and_then(|d| d.get(STATUS_KEY))
            .ok_or_else(|| format!("{name} has no key {STATUS_KEY}"))?;
        serde_yaml::from_str(yaml)
            .map_err(|e| format!("{name}: key {STATUS_KEY} is not this controller's status: {e}"))
    }
}

/// How a successful write went.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteReport {
    /// The ConfigMap did not exist and was created.
    pub created: bool,
    /// 409s met on the way (Conflict or AlreadyExists), each followed by a re-read.
    pub conflicts: u32,
    /// The ConfigMap as written (its `resourceVersion` and `uid`).
    pub written: ConfigMap,
}

/// Writes the status ConfigMap: GET, change our key and annotation, update with the
/// `resourceVersion` read.
pub struct StatusWriter {
    store: Arc<dyn ConfigMapStore>,
    name: String,
    identity: String,
    /// The annotation stamped with each write's time.
    annotation: String,
    /// The owner annotation (key, value): set when the writer creates the ConfigMap, required
    /// on one it finds ([`StatusWriter::owner`]).
    owner: Option<(String, String)>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Sets our key and `annotation` on `cm`, leaving everything else as it is.
fn apply(cm: &mut ConfigMap, annotation: &str, yaml: &str, time: &str) {
    cm.data
        .get_or_insert_with(Default::default)
        .insert(STATUS_KEY.to_string(), yaml.to_string());
    cm.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotation.to_string(), time.to_string());
}

impl StatusWriter {
    /// A writer of ConfigMap `name` through `store`, signing documents with `identity`.
    pub fn new(store: Arc<dyn ConfigMapStore>, name: &str, identity: &str) -> Self {
        Self {
            store,
            name: name.to_string(),
            identity: identity.to_string(),
            annotation: LAST_UPDATED_ANNOTATION.to_string(),
            owner: None,
            metrics: None,
        }
    }

    /// Writes only a ConfigMap this writer owns: one it creates carries annotation
    /// `key: value`, and one it finds without it is another program's and is left alone
    /// ([`StatusError::Foreign`], nothing written). The check is made on every GET, so a
    /// ConfigMap deleted and re-created by another program is noticed at the next write.
    pub fn owner(mut self, key: &str, value: &str) -> Self {
        self.owner = Some((key.to_string(), value.to_string()));
        self
    }

    /// The ConfigMap's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stamps each write's time in `annotation` instead of [`LAST_UPDATED_ANNOTATION`]
    /// (cluster-autoscaler's `cluster-autoscaler.kubernetes.io/last-updated` for its layout).
    pub fn annotation(mut self, annotation: &str) -> Self {
        self.annotation = annotation.to_string();
        self
    }

    /// Counts writes in `kube_status_writes_total{result}`: one `conflict` per 409 met, then
    /// `created`, `updated` or `error`.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, result: &str) {
        if let Some(m) = &self.metrics {
            m.kube_status_writes_total
                .with_label_values(&[result])
                .inc();
        }
    }

    /// The document for `groups` at `time`, as YAML.
    pub fn render(&self, groups: Vec<GroupStatus>, time: &str) -> Result<String, StatusError> {
        serde_yaml::to_string(&StatusDocument {
            leader: self.identity.clone(),
            time: time.to_string(),
            node_groups: groups,
        })
        .map_err(|e| StatusError::Serialize(e.to_string()))
    }

    /// Writes `groups` now. At most one retry after a 409 Conflict on update; an AlreadyExists on
    /// create reads and updates instead.
    pub async fn write(&self, groups: Vec<GroupStatus>) -> Result<WriteReport, StatusError> {
        let time = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|e| StatusError::Serialize(e.to_string()))?;
        let yaml = self.render(groups, &time)?;
        self.write_yaml(&yaml, &time).await
    }

    /// Writes `yaml` under [`STATUS_KEY`] and `time` in the annotation, by the same rules as
    /// [`StatusWriter::write`] (a document in another layout).
    pub async fn write_yaml(&self, yaml: &str, time: &str) -> Result<WriteReport, StatusError> {
        let result = self.attempt(yaml, time).await;
        match &result {
            Ok(r) => self.count(if r.created { "created" } else { "updated" }),
            Err(StatusError::Conflict | StatusError::AlreadyExists) => {}
            Err(StatusError::Foreign { .. }) => self.count("foreign"),
            Err(_) => self.count("error"),
        }
        result
    }

    async fn attempt(&self, yaml: &str, time: &str) -> Result<WriteReport, StatusError> {
        let mut conflicts = 0u32;
        let mut updates_refused = 0u32;
        loop {
            let Some(mut current) = self.store.get().await? else {
                let mut cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                apply(&mut cm, &self.annotation, yaml, time);
                if let Some((key, value)) = &self.owner {
                    cm.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(key.clone(), value.clone());
                }
                match self.store.create(&cm).await {
                    Ok(written) => {
                        info!(config_map = %self.name, "status ConfigMap created");
                        return Ok(WriteReport {
                            created: true,
                            conflicts,
                            written,
                        });
                    }
                    // Somebody created it between our GET and our create: read it and update.
                    Err(StatusError::AlreadyExists) if conflicts < 2 => {
                        self.count("conflict");
                        conflicts += 1;
                        debug!(config_map = %self.name, "created by somebody else meanwhile: re-reading");
                        continue;
                    }
                    Err(e) => {
                        if e == StatusError::AlreadyExists {
                            self.count("conflict");
                        }
                        return Err(e);
                    }
                }
            };
            if let Some((key, value)) = &self.owner {
                let marked = current
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .is_some_and(|v| v == value);
                if !marked {
                    return Err(StatusError::Foreign {
                        name: self.name.clone(),
                        annotation: key.clone(),
                        value: value.clone(),
                    });
                }
            }
            if current.metadata.resource_version.is_none() {
                return Err(StatusError::Other(format!(
                    "ConfigMap {} came back without a resourceVersion: not updating blind",
                    self.name
                )));
            }
            apply(&mut current, &self.annotation, yaml, time);
            match self.store.replace(&current).await {
                Ok(written) => {
                    return Ok(WriteReport {
                        created: false,
                        conflicts,
                        written,
                    })
                }
                // Somebody else wrote it between our GET and our update: re-read, re-apply
                // our key and annotation on top of theirs, try once more.
                Err(StatusError::Conflict) if updates_refused == 0 => {
                    self.count("conflict");
                    updates_refused += 1;
                    conflicts += 1;
                    debug!(config_map = %self.name, "409 Conflict: re-reading and re-applying our key");
                }
                Err(e) => {
                    if e == StatusError::Conflict {
                        self.count("conflict");
                    }
                    return Err(e);
                }
            }
        }
    }
}

impl StatusWriter {
    /// Every `every` until `shutdown`: writes `snapshot()` if `fence` lets this replica write
    /// (it leads, freshly renewed), and hands each written ConfigMap to `written`.
    pub async fn run(
        self: Arc<Self>,
        snapshot: impl Fn() -> Vec<GroupStatus> + Send,
        fence: Arc<dyn WriteFence>,
        every: Duration,
        written: impl Fn(&ConfigMap) + Send,
        shutdown: CancellationToken,
    ) {
        loop {
            if fence.check().is_ok() {
                match self.write(snapshot()).await {
                    Ok(report) => written(&report.written),
                    Err(e) => {
                        warn!(config_map = %self.name, error = %e, "could not write the status ConfigMap; next pass tries again")
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;

    /// One ConfigMap with the API server's rules, and a rival who writes once between our GET
    /// and our next call when armed.
    #[derive(Default)]
    struct Memory {
        cm: Mutex<Option<ConfigMap>>,
        version: Mutex<u64>,
        rival_next: Mutex<Option<(String, String)>>,
        blind: Mutex<u32>,
    }

    impl Memory {
        fn stamp(&self, mut cm: ConfigMap) -> ConfigMap {
            let mut v = self.version.lock();
            *v += 1;
            cm.metadata.resource_version = Some(v.to_string());
            cm
        }

        fn rival(&self) {
            let Some((k, v)) = self.rival_next.lock().take() else {
                return;
            };
            let mut slot = self.cm.lock();
            let mut cm = slot.clone().unwrap_or_else(|| ConfigMap {
                metadata: ObjectMeta {
                    name: Some("s".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            });
            cm.data.get_or_insert_with(BTreeMap::new).insert(k, v);
            *slot = Some(self.stamp(cm));
        }

        fn data(&self) -> BTreeMap<String, String> {
            self.cm
                .lock()
                .as_ref()
                .and_then(|c| c.data.clone())
                .unwrap_or_default()
        }
    }

    #[async_trait::async_trait]
    impl ConfigMapStore for Memory {
        async fn get(&self) -> Result<Option<ConfigMap>, StatusError> {
            let read = self.cm.lock().clone();
            self.rival();
            Ok(read)
        }
        async fn create(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
            let mut slot = self.cm.lock();
            if slot.is_some() {
                return Err(StatusError::AlreadyExists);
            }
            let stored = self.stamp(cm.clone());
            *slot = Some(stored.clone());
            Ok(stored)
        }
        async fn replace(&self, cm: &ConfigMap) -> Result<ConfigMap, StatusError> {
            if cm.metadata.resource_version.is_none() {
                *self.blind.lock() += 1;
            }
            let mut slot = self.cm.lock();
            let current = slot
                .as_ref()
                .and_then(|c| c.metadata.resource_version.clone());
            if cm.metadata.resource_version != current {
                return Err(StatusError::Conflict);
            }
            let stored = self.stamp(cm.clone());
            *slot = Some(stored.clone());
            Ok(stored)
        }
    }

    /// A fence the test opens and closes.
    #[derive(Debug, Default)]
    struct Switch(std::sync::atomic::AtomicBool);

    impl WriteFence for Switch {
        fn check(&self) -> Result<(), crate::fence::FenceHold> {
            if self.0.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err(crate::fence::FenceHold::NotLeader)
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_replica_the_fence_lets_write_writes_the_status_and_then_every_interval() {
        let store = Arc::new(Memory::default());
        let fence = Arc::new(Switch::default());
        let stop = CancellationToken::new();
        let uid_seen = Arc::new(Mutex::new(0u32));
        let seen = uid_seen.clone();
        let task = tokio::spawn(Arc::new(writer(&store)).run(
            Vec::new,
            fence.clone(),
            Duration::from_secs(10),
            move |_| *seen.lock() += 1,
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert!(store.cm.lock().is_none(), "a standby writes nothing");
        fence.0.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let first = *store.version.lock();
        assert!(first >= 1, "the leader wrote");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(
            *store.version.lock() > first,
            "and writes again each interval"
        );
        assert!(*uid_seen.lock() >= 2);
        stop.cancel();
        task.await.unwrap();
    }

    fn writer(store: &Arc<Memory>) -> StatusWriter {
        StatusWriter::new(store.clone(), "s", "replica-a")
    }

    #[tokio::test]
    async fn an_absent_config_map_is_created_with_the_document_and_the_annotation() {
        let store = Arc::new(Memory::default());
        let report = writer(&store).write(vec![]).await.unwrap();
        assert!(report.created);
        let data = store.data();
        assert!(data[STATUS_KEY].contains("leader: replica-a"));
        let cm = store.cm.lock().clone().unwrap();
        assert!(cm.metadata.annotations.unwrap()[LAST_UPDATED_ANNOTATION].ends_with('Z'));
    }

    #[tokio::test]
    async fn a_rival_write_between_get_and_update_is_kept_after_one_retry() {
        let store = Arc::new(Memory::default());
        let w = writer(&store);
        w.write(vec![]).await.unwrap();
        *store.rival_next.lock() = Some(("rival".into(), "1".into()));
        let report = w.write(vec![]).await.unwrap();
        assert_eq!(report.conflicts, 1);
        let data = store.data();
        assert_eq!(data.get("rival").map(String::as_str), Some("1"));
        assert!(data.contains_key(STATUS_KEY));
        assert_eq!(
            *store.blind.lock(),
            0,
            "every update carried a resourceVersion"
        );
    }

    fn owned(store: &Arc<Memory>) -> StatusWriter {
        writer(store).owner("example.io/owner", "us")
    }

    #[tokio::test]
    async fn an_owned_writer_marks_what_it_creates_and_keeps_writing_it() {
        let store = Arc::new(Memory::default());
        let w = owned(&store);
        assert!(w.write(vec![]).await.unwrap().created);
        let cm = store.cm.lock().clone().unwrap();
        assert_eq!(cm.metadata.annotations.unwrap()["example.io/owner"], "us");
        let again = w.write(vec![]).await.unwrap();
        assert!(!again.created);
        assert_eq!(*store.version.lock(), 2);
    }

    #[tokio::test]
    async fn an_owned_writer_leaves_a_config_map_without_its_mark_untouched() {
        let store = Arc::new(Memory::default());
        // Another autoscaler's ConfigMap (AKS's managed cluster-autoscaler writes the name).
        *store.cm.lock() = Some(store.stamp(ConfigMap {
            metadata: ObjectMeta {
                name: Some("s".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                STATUS_KEY.to_string(),
                "theirs".to_string(),
            )])),
            ..ConfigMap::default()
        }));
        let err = owned(&store).write(vec![]).await.unwrap_err();
        assert!(matches!(err, StatusError::Foreign { .. }), "{err:?}");
        assert!(err.to_string().contains("example.io/owner=us"), "{err}");
        assert_eq!(store.data()[STATUS_KEY], "theirs");
        assert_eq!(*store.version.lock(), 1, "nothing written");
        // One created by somebody else between our GET and our create: read, found foreign.
        let store = Arc::new(Memory::default());
        *store.rival_next.lock() = Some(("rival".into(), "1".into()));
        let err = owned(&store).write(vec![]).await.unwrap_err();
        assert!(matches!(err, StatusError::Foreign { .. }), "{err:?}");
        assert!(!store.data().contains_key(STATUS_KEY));
        // An unowned writer writes either (our own status ConfigMap keeps others' keys).
        assert!(writer(&store).write(vec![]).await.is_ok());
    }

    #[tokio::test]
    async fn a_create_beaten_by_a_rival_reads_and_updates_keeping_the_rivals_key() {
        let store = Arc::new(Memory::default());
        *store.rival_next.lock() = Some(("rival".into(), "1".into()));
        let report = writer(&store).write(vec![]).await.unwrap();
        assert!(!report.created);
        assert_eq!(report.conflicts, 1);
        let data = store.data();
        assert_eq!(data.get("rival").map(String::as_str), Some("1"));
        assert!(data.contains_key(STATUS_KEY));
    }
}
