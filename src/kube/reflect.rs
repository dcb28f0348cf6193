//! Reflectors: the controller's read-only view of the cluster (Nodes, Pods that are not finished,
//! PodDisruptionBudgets, DaemonSets, the storage kinds: claims, volumes, classes, CSI nodes, and
//! Namespaces),
//! kept by kube-runtime watchers and shared with the planner
//! the same copy-on-write way as the scale-set cache.
//!
//! Each kind has one task that owns the live map. It applies watch events to it and publishes an
//! [`Arc`] snapshot after each batch of events that arrived together; readers take the snapshot
//! under a lock held for one pointer copy and never wait for the watch. A relist (at start, after
//! a watch that cannot resume, after `410 Gone`) is built aside and swapped in whole when its
//! last page arrives, so readers see the old complete state until the new complete state: no gap,
//! and no half-listed cluster that would look like missing nodes.
//!
//! Readiness ([`ClusterView::synced`]) waits for the first full list of every kind.
//!
//! Health ([`ClusterView::failing`]) is stricter: a kind is healthy while its last list completed
//! and no watch error came since. A watch error (a 403 after an RBAC change, the API server away,
//! a stream cut) makes the kind failing at once; its stream is then dropped and, after a backoff,
//! started anew with a full list, because in a quiet cluster a resumed watch delivers nothing that
//! would prove it works again: only a completed list does. A stream that stays connected but stops
//! delivering is cut by kube-runtime's own idle timeout (the server-side watch timeout plus a
//! margin, about 5 minutes) and reconnects; a reconnect that fails is an error like any other.
//! What decides from the view and then deletes (scale-down) halts while any kind is failing, and
//! reads the node and its pods fresh from the API server immediately before a delete in any case.

use crate::metrics::Metrics;
use crate::pods::index::PodIndex;
use crate::pods::record::{Interner, NodeRecord, PodRecord};
use crate::pods::topology::NamespaceLabels;
use crate::pods::volumes::Volumes;
use crate::pods::wire::WirePod;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Objects of one kind by `namespace/name` (`name` for cluster-scoped kinds).
pub type Objects<K> = HashMap<String, Arc<K>>;

/// What a reflector keeps beside its objects, changed event by event and published with them
/// (the pods' [`PodIndex`]); `()` for the kinds that keep nothing more.
pub trait Derived<K>: Clone + Default + Send + Sync + 'static {
    /// An object changed: `old` as it was (none when new), `new` as it is (none when deleted).
    fn replace(&mut self, old: Option<&Arc<K>>, new: Option<&Arc<K>>);
}

impl<K> Derived<K> for () {
    fn replace(&mut self, _: Option<&Arc<K>>, _: Option<&Arc<K>>) {}
}

impl Derived<PodRecord> for PodIndex {
    fn replace(&mut self, old: Option<&Arc<PodRecord>>, new: Option<&Arc<PodRecord>>) {
        PodIndex::replace(self, old, new);
    }
}

/// The published state of one kind: a snapshot (with what is derived from it), whether a full
/// list has arrived, and whether the watch is failing.
pub struct Reflected<K, D = ()> {
    /// The objects and what is derived from them, published together: a reader never sees one
    /// without the other.
    snapshot: RwLock<(Arc<Objects<K>>, Arc<D>)>,
    synced: AtomicBool,
    failing: parking_lot::Mutex<Option<Failing>>,
    /// Counts publications: loops wait on it instead of polling ([`Reflected::changes`]).
    changes: tokio::sync::watch::Sender<u64>,
}

/// A watch that failed and has not completed a list since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failing {
    /// The kind (`nodes`, `pods`, ...).
    pub kind: &'static str,
    /// Since when (monotonic): the first error after the last completed list.
    pub since: Instant,
    /// The last error, as text.
    pub error: String,
}

impl std::fmt::Display for Failing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the watch of {} has been failing for {}s: {}",
            self.kind,
            self.since.elapsed().as_secs(),
            self.error
        )
    }
}

impl<K, D: Default> Default for Reflected<K, D> {
    fn default() -> Self {
        Self {
            snapshot: RwLock::new((Arc::new(HashMap::new()), Arc::new(D::default()))),
            synced: AtomicBool::new(false),
            failing: parking_lot::Mutex::new(None),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl<K, D> Reflected<K, D> {
    /// The current snapshot (one pointer copy under the lock).
    pub fn snapshot(&self) -> Arc<Objects<K>> {
        self.snapshot.read().0.clone()
    }

    /// What is derived from the current snapshot (the pods' index).
    pub fn derived(&self) -> Arc<D> {
        self.snapshot.read().1.clone()
    }

    /// The current snapshot and what is derived from it, as one publication.
    pub fn snapshot_and_derived(&self) -> (Arc<Objects<K>>, Arc<D>) {
        self.snapshot.read().clone()
    }

    /// Whether the first full list has been published.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether the watch is failing (an error since its last completed list), and since when.
    pub fn failing(&self) -> Option<Failing> {
        self.failing.lock().clone()
    }

    /// Told every time a new snapshot is published (a change seen by the watch, a full list).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn publish(&self, objects: Objects<K>, derived: D, synced: bool) {
        *self.snapshot.write() = (Arc::new(objects), Arc::new(derived));
        if synced {
            self.synced.store(true, Ordering::Release);
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Records a watch error; the first one after a completed list starts the failing time.
    fn fail(&self, kind: &'static str, error: String) {
        let mut f = self.failing.lock();
        match f.as_mut() {
            Some(f) => f.error = error,
            None => {
                *f = Some(Failing {
                    kind,
                    since: Instant::now(),
                    error,
                })
            }
        }
    }

    /// A list completed: the watch is healthy again.
    fn recovered(&self) {
        *self.failing.lock() = None;
    }
}

/// The cluster as the watchers see it.
pub struct ClusterView {
    /// Nodes, as [`NodeRecord`]s: what the controller reads of them.
    pub nodes: Arc<Reflected<NodeRecord>>,
    /// Pods not yet `Succeeded` or `Failed` (a field selector on the watch), as
    /// [`PodRecord`]s: what the controller reads, specs and labels shared by equal pods; with
    /// them the [`PodIndex`] (pods by node, summed), kept event by event.
    pub pods: Arc<Reflected<PodRecord, PodIndex>>,
    /// PodDisruptionBudgets (`policy/v1`).
    pub pdbs: Arc<Reflected<PodDisruptionBudget>>,
    /// DaemonSets (`apps/v1`).
    pub daemonsets: Arc<Reflected<DaemonSet>>,
    /// PersistentVolumeClaims, PersistentVolumes, StorageClasses and CSINodes: what the volume
    /// filters read ([`crate::pods::volumes`]).
    pub storage: Storage,
    /// Namespaces: their labels, for affinity terms with a `namespaceSelector`.
    pub namespaces: Arc<Reflected<Namespace>>,
}

/// The storage kinds of a [`ClusterView`].
pub struct Storage {
    /// PersistentVolumeClaims.
    pub claims: Arc<Reflected<PersistentVolumeClaim>>,
    /// PersistentVolumes.
    pub volumes: Arc<Reflected<PersistentVolume>>,
    /// StorageClasses (`storage.k8s.io/v1`).
    pub classes: Arc<Reflected<StorageClass>>,
    /// CSINodes (`storage.k8s.io/v1`): each node's attach limits.
    pub csi_nodes: Arc<Reflected<CSINode>>,
}

impl Storage {
    /// The storage objects as of now, as the volume filters read them, when a pod of `pods`
    /// has a claim (else there is nothing for them to decide: no objects are copied).
    pub fn volumes_for<'a>(&self, mut pods: impl Iterator<Item = &'a Arc<PodRecord>>) -> Volumes {
        self.volumes_if(pods.any(|p| p.facts().has_claims()))
    }

    /// The storage objects as of now when `needed` (some pod has a claim), else none.
    pub fn volumes_if(&self, needed: bool) -> Volumes {
        if needed {
            self.volumes()
        } else {
            Volumes::default()
        }
    }

    /// The storage objects as of now, as the volume filters read them.
    pub fn volumes(&self) -> Volumes {
        let (claims, volumes, classes, csi_nodes) = (
            self.claims.snapshot(),
            self.volumes.snapshot(),
            self.classes.snapshot(),
            self.csi_nodes.snapshot(),
        );
        Volumes::new(
            claims.values().map(|c| &**c),
            volumes.values().map(|v| &**v),
            classes.values().map(|c| &**c),
            csi_nodes.values().map(|n| &**n),
        )
    }
}

impl ClusterView {
    /// The namespaces' labels as of now.
    pub fn namespace_labels(&self) -> NamespaceLabels {
        NamespaceLabels::new(self.namespaces.snapshot().values().filter_map(|n| {
            Some((
                n.metadata.name.clone()?,
                n.metadata.labels.clone().unwrap_or_default(),
            ))
        }))
    }

    /// Whether every kind has had its first full list (readiness waits for this).
    pub fn synced(&self) -> bool {
        self.unsynced().is_empty()
    }

    /// The kinds whose watch is failing (see the module documentation), oldest failure first.
    /// Empty when every watch is healthy.
    pub fn failing(&self) -> Vec<Failing> {
        let mut v: Vec<Failing> = [
            self.nodes.failing(),
            self.pods.failing(),
            self.pdbs.failing(),
            self.daemonsets.failing(),
            self.storage.claims.failing(),
            self.storage.volumes.failing(),
            self.storage.classes.failing(),
            self.storage.csi_nodes.failing(),
            self.namespaces.failing(),
        ]
        .into_iter()
        .flatten()
        .collect();
        v.sort_by_key(|f| f.since);
        v
    }

    /// Told whenever any kind publishes a new snapshot.
    pub fn changes(&self) -> ClusterChanges {
        ClusterChanges([
            self.nodes.changes(),
            self.pods.changes(),
            self.pdbs.changes(),
            self.daemonsets.changes(),
            self.storage.claims.changes(),
            self.storage.volumes.changes(),
            self.storage.classes.changes(),
            self.storage.csi_nodes.changes(),
            self.namespaces.changes(),
        ])
    }

    /// The kinds not listed yet.
    pub fn unsynced(&self) -> Vec<&'static str> {
        [
            (NODES, self.nodes.synced()),
            (PODS, self.pods.synced()),
            (PDBS, self.pdbs.synced()),
            (DAEMONSETS, self.daemonsets.synced()),
            (CLAIMS, self.storage.claims.synced()),
            (VOLUMES, self.storage.volumes.synced()),
            (CLASSES, self.storage.classes.synced()),
            (CSI_NODES, self.storage.csi_nodes.synced()),
            (NAMESPACES, self.namespaces.synced()),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(kind, _)| kind)
        .collect()
    }
}

/// Publications of every kind of a [`ClusterView`], to wait on.
#[derive(Debug)]
pub struct ClusterChanges([tokio::sync::watch::Receiver<u64>; 9]);

impl ClusterChanges {
    /// Returns once any kind published a snapshot not seen through this value yet (at once if
    /// one was published since the last call); never, once every reflector is gone.
    pub async fn changed(&mut self) {
        let [a, b, c, d, e, f, g, h, i] = &mut self.0;
        tokio::select! {
            Ok(()) = a.changed() => {}
            Ok(()) = b.changed() => {}
            Ok(()) = c.changed() => {}
            Ok(()) = d.changed() => {}
            Ok(()) = e.changed() => {}
            Ok(()) = f.changed() => {}
            Ok(()) = g.changed() => {}
            Ok(()) = h.changed() => {}
            Ok(()) = i.changed() => {}
            else => std::future::pending::<()>().await,
        }
    }
}

const NODES: &str = "nodes";
const PODS: &str = "pods";
const PDBS: &str = "poddisruptionbudgets";
const DAEMONSETS: &str = "daemonsets";
const CLAIMS: &str = "persistentvolumeclaims";
const VOLUMES: &str = "persistentvolumes";
const CLASSES: &str = "storageclasses";
const CSI_NODES: &str = "csinodes";
const NAMESPACES: &str = "namespaces";

/// Pods that still hold or want a node: the ones the planner cares about.
pub const UNFINISHED_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Starts one watcher per kind (cluster-wide) and returns the view they keep current, with the
/// tasks (they end when `stop` is cancelled).
pub async fn start(
    client: kube::Client,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (Arc<ClusterView>, Vec<JoinHandle<()>>) {
    let all = watcher::Config::default();
    // Nodes and pods are most of a cluster's bytes: only the fields the controller reads stay.
    let (nodes, a) = {
        let (api, config) = (Api::<Node>::all(client.clone()), all.clone());
        spawn_reflector(
            move || {
                watcher::watcher(api.clone(), config.clone())
                    .map_ok(|e| map_event(e, NodeRecord::of))
            },
            NODES,
            |n: &NodeRecord| n.name.clone(),
            metrics.clone(),
            stop.clone(),
        )
    };
    let (pods, b) = {
        // Parsed as a `WirePod`: the fields a record keeps, the rest skipped unbuilt.
        let api = Api::<WirePod>::all(client.clone());
        let config = all.clone().fields(UNFINISHED_PODS);
        spawn_reflector(
            move || {
                // A fresh interner per stream: after a relist every record comes from it.
                let mut interner = Interner::default();
                watcher::watcher(api.clone(), config.clone())
                    .map_ok(move |e| map_event(e, |p| interner.record(p.into())))
            },
            PODS,
            PodRecord::key,
            metrics.clone(),
            stop.clone(),
        )
    };
    let (pdbs, c) = match pdb_version(&client).await {
        PdbVersion::V1 => watch(
            Api::<PodDisruptionBudget>::all(client.clone()),
            all.clone(),
            PDBS,
            metrics.clone(),
            stop.clone(),
        ),
        PdbVersion::V1beta1 => {
            tracing::warn!(
                "the API server has no policy/v1 PodDisruptionBudgets (Kubernetes before 1.21): \
                 reading policy/v1beta1 instead"
            );
            let gvk = GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget");
            let ar = ApiResource::from_gvk_with_plural(&gvk, "poddisruptionbudgets");
            let api = Api::<DynamicObject>::all_with(client.clone(), &ar);
            let config = all.clone();
            spawn_reflector(
                move || {
                    watcher::watcher(api.clone(), config.clone())
                        .filter_map(|r| std::future::ready(as_typed(r)))
                },
                PDBS,
                resource_key,
                metrics.clone(),
                stop.clone(),
            )
        }
    };
    let (daemonsets, d) = watch(
        Api::<DaemonSet>::all(client.clone()),
        all.clone(),
        DAEMONSETS,
        metrics.clone(),
        stop.clone(),
    );
    let (claims, e) = watch(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        all.clone(),
        CLAIMS,
        metrics.clone(),
        stop.clone(),
    );
    let (volumes, f) = watch(
        Api::<PersistentVolume>::all(client.clone()),
        all.clone(),
        VOLUMES,
        metrics.clone(),
        stop.clone(),
    );
    let (classes, g) = watch(
        Api::<StorageClass>::all(client.clone()),
        all.clone(),
        CLASSES,
        metrics.clone(),
        stop.clone(),
    );
    let (csi_nodes, h) = watch(
        Api::<CSINode>::all(client.clone()),
        all.clone(),
        CSI_NODES,
        metrics.clone(),
        stop.clone(),
    );
    let (namespaces, i) = watch(
        Api::<Namespace>::all(client),
        all,
        NAMESPACES,
        metrics,
        stop,
    );
    let view = ClusterView {
        nodes,
        pods,
        pdbs,
        daemonsets,
        storage: Storage {
            claims,
            volumes,
            classes,
            csi_nodes,
        },
        namespaces,
    };
    (Arc::new(view), vec![a, b, c, d, e, f, g, h, i])
}

/// One reflector: a watcher of `api` with `config`, kept in the returned [`Reflected`] by a task
/// that ends when `stop` is cancelled. `kind` is the metrics label.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (Arc<Reflected<K>>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    spawn_reflector(
        move || watcher::watcher(api.clone(), config.clone()),
        kind,
        resource_key,
        metrics,
        stop,
    )
}

/// `namespace/name`, or `name` for cluster-scoped kinds: the key of the reflected maps.
pub fn resource_key<K: Resource>(obj: &K) -> String {
    match obj.namespace() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    }
}

/// A watch event with its object turned into another type.
fn map_event<A, B>(e: Event<A>, mut f: impl FnMut(A) -> B) -> Event<B> {
    match e {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
    }
}

/// `make` builds the watch stream: once at start, and anew (a full list) after each error.
fn spawn_reflector<K, D, S, F>(
    make: F,
    kind: &'static str,
    key: fn(&K) -> String,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> (Arc<Reflected<K, D>>, JoinHandle<()>)
where
    K: Clone + Send + Sync + 'static,
    D: Derived<K>,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    F: FnMut() -> S + Send + 'static,
{
    let into = Arc::new(Reflected::default());
    let task = {
        let into = into.clone();
        tokio::spawn(async move {
            reflect(make, kind, key, &into, &metrics, stop).await;
        })
    };
    (into, task)
}

enum PdbVersion {
    V1,
    V1beta1,
}

/// `policy/v1` when the server has it (Kubernetes 1.21 and later), else `policy/v1beta1` when
/// it has that (older servers, such as the 1.20 the project tests against), else `policy/v1`
/// (whose watch then reports the error and retries).
async fn pdb_version(client: &kube::Client) -> PdbVersion {
    let serves = |gv: &'static str| async move {
        client
            .list_api_group_resources(gv)
            .await
            .is_ok_and(|l| l.resources.iter().any(|r| r.name == "poddisruptionbudgets"))
    };
    if !serves("policy/v1").await && serves("policy/v1beta1").await {
        PdbVersion::V1beta1
    } else {
        PdbVersion::V1
    }
}

/// A `policy/v1beta1` PodDisruptionBudget event read as `policy/v1`: the fields the controller
/// uses (selector, minAvailable, maxUnavailable, status) have the same shape. An object that does
/// not convert is dropped with a warning rather than stopping the watch.
fn as_typed(
    r: Result<Event<DynamicObject>, watcher::Error>,
) -> Option<Result<Event<PodDisruptionBudget>, watcher::Error>> {
    fn convert(o: DynamicObject) -> Option<PodDisruptionBudget> {
        let name = o.name_any();
        let mut v = serde_json::to_value(o).ok()?;
        v["apiVersion"] = "policy/v1".into();
        serde_json::from_value(v)
            .map_err(|e| tracing::warn!(pdb = %name, error = %e, "unreadable PodDisruptionBudget"))
            .ok()
    }
    let event = match r {
        Err(e) => return Some(Err(e)),
        Ok(e) => e,
    };
    Some(Ok(match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(convert(o)?),
        Event::Apply(o) => Event::Apply(convert(o)?),
        Event::Delete(o) => Event::Delete(convert(o)?),
    }))
}

/// What a relist or a live event did to the state.
struct Mirror<K, D = ()> {
    live: Objects<K>,
    /// What is derived from `live`, changed with it.
    derived: D,
    /// A relist being built aside (with its own derived state); swapped in at `InitDone`.
    relist: Option<(Objects<K>, D)>,
    lists: u64,
    synced: bool,
    key: fn(&K) -> String,
}

impl<K, D: Derived<K>> Mirror<K, D> {
    fn new(key: fn(&K) -> String) -> Self {
        Self {
            live: HashMap::new(),
            derived: D::default(),
            relist: None,
            lists: 0,
            synced: false,
            key,
        }
    }
    /// Applies one event; returns whether the live state changed (worth publishing).
    fn apply(&mut self, event: Event<K>) -> bool {
        match event {
            Event::Init => {
                self.relist = Some((HashMap::new(), D::default()));
                self.lists += 1;
                false
            }
            Event::InitApply(obj) => {
                let (map, derived) = self
                    .relist
                    .get_or_insert_with(|| (HashMap::new(), D::default()));
                let obj = Arc::new(obj);
                let old = map.insert((self.key)(&obj), obj.clone());
                derived.replace(old.as_ref(), Some(&obj));
                false
            }
            Event::InitDone => {
                (self.live, self.derived) = self.relist.take().unwrap_or_default();
                self.synced = true;
                true
            }
            Event::Apply(obj) => {
                let obj = Arc::new(obj);
                let old = self.live.insert((self.key)(&obj), obj.clone());
                self.derived.replace(old.as_ref(), Some(&obj));
                self.synced
            }
            Event::Delete(obj) => {
                let old = self.live.remove(&(self.key)(&obj));
                self.derived.replace(old.as_ref(), None);
                self.synced
            }
        }
    }
}

/// First wait before a failed watch is started anew; doubled per failure up to
/// [`RESTART_BACKOFF_MAX`], back to this after a completed list (kube-runtime's default backoff
/// has the same shape).
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two attempts at a failed watch.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Drives the watch streams `make` builds into `into` until `stop` (or until a stream ends,
/// which only a test's does). Generic over the stream so tests can feed it events directly.
async fn reflect<K, D, S, F>(
    mut make: F,
    kind: &'static str,
    key: fn(&K) -> String,
    into: &Reflected<K, D>,
    metrics: &Metrics,
    stop: CancellationToken,
) where
    K: Clone + Send + Sync + 'static,
    D: Derived<K>,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    F: FnMut() -> S,
{
    let mut mirror = Mirror::<K, D>::new(key);
    let mut newest = Instant::now();
    let mut backoff = RESTART_BACKOFF;
    let mut age_tick = tokio::time::interval(Duration::from_secs(1));
    age_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    metrics.kube_watch_healthy.with_label_values(&[kind]).set(0);
    'streams: loop {
        let mut stream = std::pin::pin!(make());
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => break 'streams,
                _ = age_tick.tick() => {
                    metrics
                        .kube_newest_event_age_seconds
                        .with_label_values(&[kind])
                        .set(newest.elapsed().as_secs_f64());
                    continue;
                }
                next = stream.next() => next,
            };
            let Some(first) = first else { break 'streams };
            // One batch: this event and every one already waiting, then one publish.
            let mut changed = false;
            let mut failed = false;
            let mut item = Some(first);
            while let Some(next) = item.take() {
                match next {
                    Ok(event) => {
                        newest = Instant::now();
                        let lists_before = mirror.lists;
                        let completes = matches!(event, Event::InitDone);
                        changed |= mirror.apply(event);
                        if completes {
                            into.recovered();
                            backoff = RESTART_BACKOFF;
                            metrics.kube_watch_healthy.with_label_values(&[kind]).set(1);
                        }
                        if mirror.lists > lists_before && lists_before > 0 {
                            metrics
                                .kube_watch_restarts_total
                                .with_label_values(&[kind, "relist"])
                                .inc();
                            tracing::info!(kind, "relisting");
                        }
                    }
                    Err(err) => {
                        metrics
                            .kube_watch_restarts_total
                            .with_label_values(&[kind, "error"])
                            .inc();
                        metrics.kube_watch_healthy.with_label_values(&[kind]).set(0);
                        tracing::warn!(kind, error = %err, retry_in = ?backoff, "watch failed; scale-down halts until a fresh list completes");
                        into.fail(kind, err.to_string());
                        failed = true;
                        break;
                    }
                }
                item = stream.next().now_or_never().flatten();
            }
            if changed {
                metrics
                    .kube_objects_cached
                    .with_label_values(&[kind])
                    .set(mirror.live.len() as i64);
                into.publish(mirror.live.clone(), mirror.derived.clone(), mirror.synced);
            }
            metrics
                .kube_newest_event_age_seconds
                .with_label_values(&[kind])
                .set(0.0);
            if failed {
                break;
            }
        }
        // The stream failed: start anew (a full list, built aside) after a backoff.
        tokio::select! {
            _ = stop.cancelled() => break 'streams,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(r: &Reflected<Node>) -> Vec<String> {
        let mut v: Vec<_> = r.snapshot().keys().cloned().collect();
        v.sort();
        v
    }

    type Events = Vec<Result<Event<Node>, watcher::Error>>;

    /// Runs the reflector over `streams`, one per start of the watch; ends with the last.
    async fn feed_streams(streams: Vec<Events>) -> (Reflected<Node>, Metrics) {
        let into = Reflected::default();
        let metrics = Metrics::new();
        let mut streams = streams.into_iter();
        reflect(
            move || futures::stream::iter(streams.next().unwrap_or_default()),
            "nodes",
            resource_key,
            &into,
            &metrics,
            CancellationToken::new(),
        )
        .await;
        (into, metrics)
    }

    async fn feed(events: Events) -> (Reflected<Node>, Metrics) {
        feed_streams(vec![events]).await
    }

    fn forbidden() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_published_or_ready_before_the_first_list_completes() {
        let (into, _) = feed(vec![Ok(Event::Init), Ok(Event::InitApply(node("a")))]).await;
        assert!(!into.synced());
        assert!(into.snapshot().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn live_events_change_the_snapshot_after_the_first_list() {
        let (into, metrics) = feed(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(node("a"))),
            Ok(Event::InitApply(node("b"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(node("c"))),
            Ok(Event::Delete(node("a"))),
        ])
        .await;
        assert!(into.synced());
        assert_eq!(names(&into), ["b", "c"]);
        assert_eq!(
            metrics
                .kube_objects_cached
                .with_label_values(&["nodes"])
                .get(),
            2
        );
    }

    #[test]
    fn a_relist_replaces_the_state_whole_only_when_its_last_page_arrives() {
        let mut m = Mirror::<Node>::new(resource_key);
        for e in [
            Event::Init,
            Event::InitApply(node("a")),
            Event::InitApply(node("b")),
            Event::InitDone,
        ] {
            m.apply(e);
        }
        // A relist starts (e.g. after 410 Gone): until it is done the old full state stays.
        assert!(!m.apply(Event::Init));
        assert!(!m.apply(Event::InitApply(node("b"))));
        assert_eq!(m.live.len(), 2, "the old state is still served mid-relist");
        assert!(m.apply(Event::InitDone));
        // `a` was deleted while the watch was down: the relist drops it.
        assert_eq!(m.live.keys().collect::<Vec<_>>(), ["b"]);
    }

    fn pod(name: &str, node: Option<&str>, cpu: &str) -> PodRecord {
        let mut spec = serde_json::json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]});
        if let Some(n) = node {
            spec["nodeName"] = n.into();
        }
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": spec,
        }))
        .unwrap();
        Interner::default().record(p)
    }

    fn usage(index: &PodIndex, node: &str) -> (usize, i128) {
        index.bound(node).map_or((0, 0), |p| {
            (
                p.pods().len(),
                p.requested().get("cpu").copied().unwrap_or(0),
            )
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_pod_index_is_published_with_the_pods_through_events_and_a_relist() {
        let into: Reflected<PodRecord, PodIndex> = Reflected::default();
        let metrics = Metrics::new();
        let events: Vec<Result<Event<PodRecord>, watcher::Error>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", Some("n1"), "100m"))),
            Ok(Event::InitApply(pod("b", None, "200m"))),
            Ok(Event::InitDone),
            // `b` is bound, `a` grows (a resize), `c` arrives on n2.
            Ok(Event::Apply(pod("b", Some("n1"), "200m"))),
            Ok(Event::Apply(pod("a", Some("n1"), "300m"))),
            Ok(Event::Apply(pod("c", Some("n2"), "1"))),
        ];
        let mut once = Some(events);
        reflect(
            move || futures::stream::iter(once.take().unwrap_or_default()),
            "pods",
            PodRecord::key,
            &into,
            &metrics,
            CancellationToken::new(),
        )
        .await;
        let (objects, index) = into.snapshot_and_derived();
        assert_eq!(objects.len(), 3);
        assert_eq!(index.len(), 3);
        assert_eq!(usage(&index, "n1"), (2, 500));
        assert_eq!(usage(&index, "n2"), (1, 1000));
        assert_eq!(index.unplaced().count(), 0);
        // The relist, mid-way, serves the old index; done, the new one.
        // Started anew: `a` was deleted and `c` moved while the watch was down.
        let mut m = Mirror::<PodRecord, PodIndex>::new(PodRecord::key);
        m.live = (*objects).clone();
        m.derived = (*index).clone();
        m.synced = true;
        for e in [
            Event::Init,
            Event::InitApply(pod("b", Some("n1"), "200m")),
            Event::InitApply(pod("c", Some("n1"), "1")),
        ] {
            m.apply(e);
        }
        assert_eq!(
            usage(&m.derived, "n2"),
            (1, 1000),
            "the old index until the relist completes"
        );
        m.apply(Event::InitDone);
        assert_eq!(usage(&m.derived, "n1"), (2, 1200));
        assert_eq!(usage(&m.derived, "n2"), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_error_makes_the_kind_failing_and_keeps_the_last_complete_state() {
        let started = Instant::now();
        let (into, metrics) = feed_streams(vec![
            vec![
                Ok(Event::Init),
                Ok(Event::InitApply(node("a"))),
                Ok(Event::InitDone),
                Err(forbidden()),
            ],
            // Started anew: its list never completes (the API server refuses, or is slow).
            vec![Ok(Event::Init), Ok(Event::InitApply(node("b")))],
        ])
        .await;
        let failing = into.failing().expect("failing after the error");
        assert_eq!(failing.kind, "nodes");
        assert_eq!(failing.since, started, "failing from the error on");
        assert_eq!(
            names(&into),
            ["a"],
            "the last complete list is still served"
        );
        assert_eq!(
            metrics
                .kube_watch_healthy
                .with_label_values(&["nodes"])
                .get(),
            0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_is_started_anew_after_a_backoff_and_healthy_once_its_list_completes() {
        let started = Instant::now();
        let (into, metrics) = feed_streams(vec![
            vec![Ok(Event::Init), Ok(Event::InitDone), Err(forbidden())],
            vec![Err(forbidden())],
            vec![
                Ok(Event::Init),
                Ok(Event::InitApply(node("z"))),
                Ok(Event::InitDone),
            ],
        ])
        .await;
        assert_eq!(into.failing(), None);
        assert_eq!(names(&into), ["z"]);
        assert_eq!(
            metrics
                .kube_watch_healthy
                .with_label_values(&["nodes"])
                .get(),
            1
        );
        // 1 s after the first error, 2 s after the second: no tight loop against a refusing API.
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_list_and_a_watch_error_count_as_restarts() {
        let (into, metrics) = feed_streams(vec![
            vec![Ok(Event::Init), Ok(Event::InitDone), Err(forbidden())],
            vec![
                Ok(Event::Init),
                Ok(Event::InitApply(node("z"))),
                Ok(Event::InitDone),
            ],
        ])
        .await;
        assert_eq!(names(&into), ["z"]);
        let restarts = |reason| {
            metrics
                .kube_watch_restarts_total
                .with_label_values(&["nodes", reason])
                .get()
        };
        assert_eq!(restarts("relist"), 1);
        assert_eq!(restarts("error"), 1);
    }
}
