//! Scale-down: the I/O around [`crate::pods::unneeded`]. Every `scanInterval` the leader looks
//! at the cluster, keeps since when each node has been unneeded, and starts removing the nodes
//! whose turn it is, each in its own task, in cluster-autoscaler's order:
//!
//! 1. **taint** the node (our own `NoSchedule` taint, and cordon) by a patch carrying the
//!    `resourceVersion` the decision read: a node changed since is a 409 and the next pass
//!    decides again;
//! 2. **wait** `nodeDeleteDelayAfterTaint` and **re-check**: a pod that landed between listing and
//!    tainting (cluster-autoscaler #3886), or a node that is no longer removable, aborts;
//! 3. **drain** through the Eviction API: a budget's 429 is retried until `maxPodEvictionTime`,
//!    then the evicted pods must be gone from the node; a drain that fails untaints the node;
//! 4. **delete exactly that instance** through [`Reconciler::delete_instance`] (fresh read, floor,
//!    instance still listed, `If-Match`, the fence; the size is re-read once Azure confirms).
//!    Once the delete's turn came, and immediately before it is sent, the node is read fresh from
//!    the API server with the pods bound to it (never the reflectors' view): a node that lost our
//!    taint or holds a pod the drain did not move stops the delete.
//!
//! An aborted or failed removal untaints the node (retried each pass until it succeeds). Empty
//! nodes go in one request, looked at node by node: one failing its last look is dropped and
//! untainted, the rest go; an operation that fails after deleting part of the batch is settled
//! by a fresh list. A delete whose outcome is unknown (the answer lost, the operation not
//! followed to its end) keeps the taint and cordon: each pass reads each such group's instance
//! list fresh, once, until it shows the VM gone (the node was removed), still there and
//! `Succeeded` (only then is the node untainted), or `Failed` (or stuck past
//! `maxNodeProvisionTime`: deleted again). At the start of each leadership, taints a previous run
//! left behind are removed (#5048), by the same rule: at once from nodes whose VM a fresh list
//! shows `Succeeded`, the others settled as above. Shutdown stops removals at their next wait
//! and untaints their nodes.
//!
//! Nothing is decided while a watch of the cluster is failing ([`ClusterView::failing`]): the
//! view may miss new pods or new nodes, so scale-down and the deletion of unregistered instances
//! halt (`scale_down_halted{reason="watch_failing"}`) until every watch has listed afresh.
//!
//! The actuation is split into units a person can hold (`docs/architecture.md`): this file
//! keeps the types and the loop (a pass reads as its list of steps); `eligibility.rs` decides which
//! candidates may go now and re-checks a tainted node against [`crate::pods::recheck`];
//! `drain.rs` taints, waits, evicts and untaints; `batch.rs` groups removals into delete requests
//! and settles each request's outcome; `replace.rs` is consolidation (a replace launches its new
//! node before any node is tainted); `hints.rs` writes its deletion-cost hints beside the
//! passes; `instances.rs` deletes instances with nothing to drain
//! (never registered, evicted spot VMs); `unknown.rs` settles deletes of unknown outcome and the
//! taints a previous run left behind.

mod batch;
mod beside;
mod drain;
mod eligibility;
mod hints;
mod instances;
mod replace;
mod soft_taints;
mod unknown;

use crate::capacity::PriceBook;
use crate::config::{NodeGroupSpec, Settings};
use crate::kube::nodes::NodeActions;
use crate::kube::reflect::ClusterView;
use crate::metrics::Metrics;
use crate::node_groups::NodeGroups;
use crate::notify::{EventSink, ObjectRef};
use crate::pods::consolidate::Command;
use crate::pods::deletion_cost::HintWrite;
use crate::pods::index::PodIndex;
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::topology::NamespaceLabels;
use crate::pods::unneeded::{Candidates, DownGroup};
use crate::pods::volumes::Volumes;
use crate::reconciler::Reconciler;
use crate::resource::Victim;
use batch::Batches;
use parking_lot::Mutex;
use replace::{Protected, Replacing};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use drain::EVICTION_RETRY;

/// How long shutdown waits for removals to untaint their nodes.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// What removals are under way, shared by the loop and its tasks.
#[derive(Debug, Default)]
struct Flight {
    /// Nodes being removed: neither candidates nor destinations.
    busy: HashSet<String>,
    /// Per group, removals started and not ended.
    deleting: HashMap<String, u32>,
    /// Removals that drain (nodes with pods).
    draining: usize,
    /// Nodes whose untaint failed: retried each pass.
    untaint: HashSet<String>,
    /// Deletes whose outcome is unknown, by node (or `group/instance` slot): the node stays
    /// tainted and busy until a fresh instance list decides.
    unknown: HashMap<String, Unknown>,
}

/// A delete sent whose outcome is not known.
#[derive(Debug, Clone)]
struct Unknown {
    group: NodeGroupSpec,
    victim: Victim,
    /// Whether there is a node to untaint if the VM turns out to be still there.
    tainted: bool,
    /// The removal's reason label, for the metric once the VM is seen gone.
    reason: &'static str,
    /// When it was parked (or last deleted again): a VM still not `Succeeded`
    /// `maxNodeProvisionTime` later is deleted again ([`unneeded::settle`]).
    since: Instant,
}

/// What each removal task needs.
struct Shared {
    settings: Arc<Settings>,
    /// The read side: groups, sizes, floors, instances.
    groups: Arc<NodeGroups>,
    reconciler: Arc<Reconciler>,
    cluster: Arc<ClusterView>,
    actions: Arc<dyn NodeActions>,
    metrics: Arc<Metrics>,
    events: Arc<dyn EventSink>,
    flight: Mutex<Flight>,
}

/// The loop (see the module documentation).
pub struct ScaleDownLoop {
    shared: Arc<Shared>,
    /// ProvisioningRequests' bookings and CapacityBuffers: their pods sit on the nodes they fit,
    /// so booked and buffer room is not removed.
    bookings: Option<Arc<super::provreq::Bookings>>,
    since: HashMap<String, Instant>,
    /// Per node whose removal started, since when it had been unneeded: a removal that stops
    /// without making the node needed gives it back ([`unneeded::resume`]).
    started: HashMap<String, Instant>,
    /// Since when each instance (node group, instance id) has had no Node.
    unregistered_since: HashMap<(String, String), Instant>,
    /// Spot instances (node group, instance id) seen evicted with `Deallocate`: each counted and
    /// marked once.
    evicted_seen: HashSet<(String, String)>,
    sizes_seen: HashMap<String, i64>,
    grew_at: HashMap<String, Instant>,
    /// Whether this leadership's leftover-taint cleanup is done.
    cleaned: bool,
    /// Why scale-down is halted now, if it is (logged once per halt).
    halted: Option<String>,
    /// `run --dry-run`: decide and log what would be removed, write nothing.
    dry_run: bool,
    /// Dry run: what was already logged as "would remove" (logged once while it stays so).
    would: HashSet<String>,
    tasks: JoinSet<()>,
    /// What a node of each group costs (consolidation's savings).
    prices: Arc<PriceBook>,
    /// Per node, a fingerprint of the pods bound to it and since when it has been so
    /// (`consolidation.consolidateAfter` counts from the last change).
    pod_events: HashMap<String, (u64, Instant)>,
    /// The pods' requests over `consolidation.stabilizationWindow`.
    requests_seen: crate::pods::stabilization::DemandWindow,
    /// A consolidation decided and waiting for its re-validation, and when that is due.
    command: Option<(Command, Instant)>,
    /// What each node was last told by an `Unconsolidatable` Event (told once while it stays).
    told: HashMap<String, String>,
    /// Where a replace asks for its new node (the scale-up loop's demand, which the reconciler
    /// writes from); without it consolidation only deletes.
    demand: Option<Arc<super::scale_up::PodDemand>>,
    /// A replace launched and waiting for its new node.
    replacing: Option<Replacing>,
    /// Groups whose replacement node did not come within `maxNodeProvisionTime`: no replace
    /// asks them again until their backoff ends (cluster-autoscaler's node group backoff).
    replace_backoff: crate::backoff::GroupBackoff,
    /// A replace's new nodes, kept from scale-down until the nodes they replace are removed.
    protected: Option<Protected>,
    /// Deletion-cost hints the last consolidation decision asked for, written at the end of
    /// the pass ([`crate::pods::deletion_cost`]).
    hints: Vec<HintWrite>,
    /// The hints being written beside the passes ([`hints::HintWriter`]).
    hint_writer: hints::HintWriter,
    /// The nodes consolidation's last search would empty first (those its deletion-cost hints
    /// go to), and since when each has been so: soft-tainted with the unneeded nodes, and
    /// given `consolidation.emptyFirst` to empty on their own.
    drain_first: HashMap<String, Instant>,
    /// The soft taints being written beside the passes ([`soft_taints::SoftTaintWriter`]).
    soft_taint_writer: soft_taints::SoftTaintWriter,
}

/// One node's removal, as decided.
#[derive(Debug, Clone)]
struct Removal {
    group: NodeGroupSpec,
    node: String,
    victim: Victim,
    resource_version: String,
    /// Uids of the pods that were to move when it was decided.
    pods: Vec<String>,
    /// Not Ready past its startup window when it was decided (it waited `unreadyTime`).
    unready: bool,
    /// Removed by consolidation: its re-check asks only that its pods fit elsewhere (no
    /// utilisation threshold), as the decision did.
    consolidation: bool,
}

impl Removal {
    fn reason(&self) -> &'static str {
        if self.consolidation {
            "consolidation"
        } else if self.unready {
            "unready"
        } else if self.pods.is_empty() {
            "empty"
        } else {
            "underutilized"
        }
    }
}

/// What one pass read, for consolidation's decision and re-validation.
struct PassView<'a> {
    groups: &'a [NodeGroupSpec],
    down: &'a [DownGroup],
    nodes: &'a [Arc<NodeRecord>],
    pods: &'a PodIndex,
    pdbs: &'a [Arc<k8s_openapi::api::policy::v1::PodDisruptionBudget>],
    volumes: &'a Volumes,
    namespaces: &'a NamespaceLabels,
    busy: &'a HashSet<String>,
    unready: &'a HashSet<String>,
    wall: k8s_openapi::jiff::Timestamp,
    /// Nodes the pass may still remove.
    left: usize,
}

/// Releases a removal's place in [`Flight`] however the task ends.
struct Slot {
    shared: Arc<Shared>,
    node: String,
    group: String,
    drains: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut f = self.shared.flight.lock();
        f.busy.remove(&self.node);
        if let Some(n) = f.deleting.get_mut(&self.group) {
            *n = n.saturating_sub(1);
        }
        if self.drains {
            f.draining = f.draining.saturating_sub(1);
        }
    }
}

fn node_ref(name: &str, node: Option<&NodeRecord>) -> ObjectRef {
    ObjectRef {
        api_version: "v1",
        kind: "Node",
        namespace: String::new(),
        name: name.to_string(),
        uid: node.and_then(|n| n.uid.clone()),
    }
}

fn pod_name(p: &PodRecord) -> String {
    p.key()
}

/// Sleeps `d`; `false` if shutdown came first.
async fn wait(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = shutdown.cancelled() => false,
    }
}

impl ScaleDownLoop {
    /// Keeps the room ProvisioningRequests booked (see [`super::provreq::Bookings`]).
    pub fn bookings(mut self, bookings: Option<Arc<super::provreq::Bookings>>) -> Self {
        self.bookings = bookings;
        self
    }

    /// Prices consolidation's savings with `prices` (the scale-up loop's book, so both read one
    /// table); without it, an offline book over the configured rates and the list prices.
    pub fn prices(mut self, prices: Arc<PriceBook>) -> Self {
        self.prices = prices;
        self
    }

    /// A loop removing unneeded nodes of `reconciler`'s groups, seen through `cluster`.
    pub fn new(
        settings: Arc<Settings>,
        reconciler: Arc<Reconciler>,
        cluster: Arc<ClusterView>,
        actions: Arc<dyn NodeActions>,
        metrics: Arc<Metrics>,
        events: Arc<dyn EventSink>,
    ) -> Self {
        let settings_prices = settings.prices.clone();
        Self {
            shared: Arc::new(Shared {
                settings,
                groups: reconciler.node_groups().clone(),
                reconciler,
                cluster,
                actions,
                metrics,
                events,
                flight: Mutex::new(Flight::default()),
            }),
            since: HashMap::new(),
            started: HashMap::new(),
            unregistered_since: HashMap::new(),
            evicted_seen: HashSet::new(),
            sizes_seen: HashMap::new(),
            grew_at: HashMap::new(),
            cleaned: false,
            halted: None,
            dry_run: false,
            would: HashSet::new(),
            tasks: JoinSet::new(),
            bookings: None,
            prices: Arc::new(PriceBook::offline(settings_prices)),
            pod_events: HashMap::new(),
            requests_seen: Default::default(),
            command: None,
            told: HashMap::new(),
            demand: None,
            replacing: None,
            replace_backoff: Default::default(),
            hints: Vec::new(),
            hint_writer: hints::HintWriter::default(),
            drain_first: HashMap::new(),
            soft_taint_writer: soft_taints::SoftTaintWriter::default(),
            protected: None,
        }
    }

    /// Lets consolidation replace nodes: a replacement is asked for through `demand` (the
    /// reconciler's demand source, as the scale-up loop's decisions are).
    pub fn demand(mut self, demand: Option<Arc<super::scale_up::PodDemand>>) -> Self {
        self.demand = demand;
        self
    }

    /// `run --dry-run`: the loop decides as usual and logs which nodes and unregistered
    /// instances it would remove, but taints, cordons, evicts, untaints and deletes nothing.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Runs until `shutdown`; then stops removals at their next wait (they untaint their
    /// nodes) and waits a little for them.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.shared.settings.scan_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // Spot VMs Azure stopped: deleted now, not a scan interval later.
        let mut stopped = self.shared.groups.stopped();
        loop {
            // A consolidation waiting for its re-validation is looked at when that is due.
            let due = self.command.as_ref().map(|(_, at)| *at);
            tokio::select! {
                _ = tick.tick() => {}
                Ok(()) = stopped.changed() => {}
                _ = async { match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                } } => {}
                _ = shutdown.cancelled() => break,
            }
            self.pass(&shutdown).await;
        }
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        self.hint_writer.stop();
        self.soft_taint_writer.stop();
    }

    /// One pass: clean up, decide, start removals.
    async fn pass(&mut self, shutdown: &CancellationToken) {
        while self.tasks.try_join_next().is_some() {}
        let s = self.shared.clone();
        if !s.reconciler.may_write() || !s.cluster.synced() {
            self.stand_down();
            return;
        }
        let nodes = s.nodes_by_name();
        let wall = s.wall();
        let groups = s.groups.groups();
        // Spot VMs Azure evicted with `Deallocate` (the reconciler's last instance lists): their
        // Nodes are NotReady for a known reason, so they neither count as unready nor wait
        // `unreadyTime`; the instances are deleted below.
        let evicted = self.evicted(&groups);
        let (unready, too_many) = self.unready(&nodes, wall, &evicted);
        if !self.healthy(too_many) {
            return;
        }
        self.tidy().await;
        let now = Instant::now();
        let pods = self.pods_now(&nodes);
        let pdbs: Vec<_> = s.cluster.pdbs.snapshot().values().cloned().collect();
        let volumes = s.cluster.storage.volumes_if(pods.any_claims());
        let namespaces = s.cluster.namespace_labels();
        let (busy, deleting, draining) = {
            let f = s.flight.lock();
            (f.busy.clone(), f.deleting.clone(), f.draining)
        };
        let mut down = self.down_groups(&groups, &deleting, now);
        if !self.cleaned && !self.clean_leftovers(&down).await {
            return;
        }
        // VMs Azure stopped go first: they count toward the floor and the pass's limit before
        // any unneeded node is chosen (so none is drained only to be refused at the floor).
        let settings = &s.settings.scale_down;
        let per_pass = settings.max_scale_down_per_pass as usize;
        let started_before = self.tasks.len();
        let left = self.remove_evicted(&groups, &mut down, &evicted, &busy, per_pass);
        let mut ctx = PassView {
            groups: &groups,
            down: &down,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            volumes: &volumes,
            namespaces: &namespaces,
            busy: &busy,
            unready: &unready,
            wall,
            left,
        };
        let (candidates, chosen) = self.choose(&ctx, draining > 0, now);
        let budget = left.saturating_sub(chosen.len());
        self.forget_would();
        self.remove_unregistered(&groups, &down, &nodes, &busy, budget, now);
        // Empty nodes of one group chosen in this pass go in one request; a node with pods
        // (drained first) goes alone.
        let mut batches = Batches::new(settings.max_empty_bulk_delete);
        for removal in self.removals(&candidates, &chosen, &groups) {
            let slot = s.take_slot(&removal);
            if let Some(at) = self.since.remove(&removal.node) {
                self.started.insert(removal.node.clone(), at);
            }
            info!(node = %removal.node, scale_set = %removal.group.name, reason = removal.reason(), pods = removal.pods.len(), "removing an unneeded node");
            batches.add(removal, slot);
        }
        // Consolidation, once nothing else is being removed and this pass chose nothing (one
        // kind of disruption at a time, as Karpenter acts with one method per loop).
        let idle = busy.is_empty() && batches.is_empty() && started_before == self.tasks.len();
        ctx.left = budget.saturating_sub(self.tasks.len() - started_before);
        for removal in self.consolidation(&ctx, idle, now) {
            let slot = s.take_slot(&removal);
            self.since.remove(&removal.node);
            // One batch per group: its nodes are drained in turn and deleted in one request.
            batches.add(removal, slot);
        }
        // cluster-autoscaler keeps its soft taints in the passes that start no removal.
        if batches.is_empty() {
            self.write_soft_taints(&down, &nodes, &candidates);
        }
        for (removals, slots) in batches.into_batches() {
            let task = s.clone();
            let stop = shutdown.clone();
            self.tasks.spawn(async move {
                let _slots = slots;
                task.remove(removals, &stop).await;
            });
        }
        self.write_hints();
    }

    /// Starts writing the deletion-cost hints the last decision asked for, each guarded by the
    /// pod's `resourceVersion`, beside the passes ([`hints::HintWriter`]).
    fn write_hints(&mut self) {
        let hints = std::mem::take(&mut self.hints);
        let s = self.shared.clone();
        let actions = s.actions.clone();
        self.hint_writer
            .submit(hints, s.metrics.clone(), move |h: HintWrite| {
                let actions = actions.clone();
                async move {
                    actions
                        .annotate_pod(&h.namespace, &h.pod, &h.resource_version, &h.annotations)
                        .await
                }
            });
    }

    /// Starts writing this pass's soft taints ([`crate::pods::soft_taint::plan`]): on the
    /// unneeded nodes and the nodes consolidation would empty first, off every other node of
    /// the groups, at most `maxBulkSoftTaintCount` writes within `maxBulkSoftTaintTime`, beside
    /// the passes. A dry run writes none.
    fn write_soft_taints(
        &mut self,
        down: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        candidates: &Candidates,
    ) {
        let s = self.shared.clone();
        let settings = &s.settings.scale_down;
        if self.dry_run || settings.max_bulk_soft_taint_count == 0 {
            return;
        }
        let taintable: HashSet<&str> = candidates
            .unneeded
            .iter()
            .map(|u| u.node.as_str())
            .chain(self.drain_first.keys().map(String::as_str))
            .collect();
        let writes = crate::pods::soft_taint::plan(
            down,
            nodes,
            &taintable,
            settings.max_bulk_soft_taint_count as usize,
        );
        let actions = s.actions.clone();
        self.soft_taint_writer.submit(
            writes,
            settings.max_bulk_soft_taint_time,
            s.metrics.clone(),
            move |w| {
                let actions = actions.clone();
                async move { actions.soft_taint(&w.node, w.on).await }
            },
        );
    }

    /// What a replica that may not act now (not leading, or not seeing the cluster yet) keeps:
    /// a consolidation decided before is decided again once it may act, and a replace under way
    /// is abandoned (nothing of it is tainted yet, and its new node is not asked for again).
    fn stand_down(&mut self) {
        let s = self.shared.clone();
        self.command = None;
        // Hints are planned again from a fresh decision once it may act.
        self.hints.clear();
        self.hint_writer.stop();
        self.drain_first.clear();
        self.soft_taint_writer.stop();
        if let Some(r) = self.replacing.take() {
            if let Some(d) = &self.demand {
                d.set_replacement(&r.group.name, None);
            }
            info!(scale_set = %r.group.name, nodes = r.command.nodes.len(), "replace abandoned: this replica may not write now (no node was tainted for it)");
        }
        self.protected = None;
        // A leader whose renewal is late (a Lease hiccup) still holds the Lease: it decides
        // nothing meanwhile but keeps since when its nodes have been unneeded. Not leading
        // (or not seeing the cluster yet): nothing is unneeded "since" anything.
        let hiccup = s.cluster.synced()
            && s.reconciler.fence_hold() == Some(crate::fence::FenceHold::RenewalStale);
        if !hiccup {
            self.since.clear();
            self.started.clear();
            s.groups.set_unneeded(BTreeMap::new());
            self.cleaned = false;
        }
    }

    /// The pods as the pass sees them: ProvisioningRequests' bookings and CapacityBuffers sit
    /// on the nodes they fit, so booked and buffer room is not removed.
    fn pods_now(&self, nodes: &[Arc<NodeRecord>]) -> Arc<PodIndex> {
        let pods = self.shared.cluster.pods.derived();
        if let Some(held) = self.bookings.as_ref().map(|b| b.get()) {
            let holding = held.all();
            if !holding.is_empty() {
                return Arc::new(crate::pods::provreq::held_on_nodes(&holding, nodes, &pods));
            }
        }
        pods
    }
    /// Whether the cluster can be scaled down now: every watch healthy (the view can be trusted
    /// to decide from), and not too many nodes unready (`too_many_unready`, cluster-autoscaler's
    /// cluster health). While it cannot, nothing is unneeded "since" anything: the unneeded
    /// time starts over afterwards.
    fn healthy(&mut self, too_many_unready: Option<String>) -> bool {
        let s = &self.shared;
        let halted = &s.metrics.scale_down_halted;
        let why = match s.cluster.failing().first() {
            Some(f) => {
                if self.halted.is_none() {
                    warn!(kind = f.kind, error = %f.error, "scale-down halted: a watch of the cluster is failing, so the view may miss pods and nodes");
                }
                Some(("watch_failing", f.to_string()))
            }
            None => too_many_unready.map(|w| {
                if self.halted.is_none() {
                    warn!(why = %w, "scale-down halted: too many nodes are unready (scale-up goes on)");
                }
                ("too_many_unready", w)
            }),
        };
        for label in ["watch_failing", "too_many_unready"] {
            let on = why.as_ref().is_some_and(|(l, _)| *l == label);
            halted.with_label_values(&[label]).set(i64::from(on));
        }
        match why {
            Some((_, why)) => {
                s.groups.set_scale_down_halted(Some(why.clone()));
                self.halted = Some(why);
                self.since.clear();
                self.started.clear();
                s.groups.set_unneeded(BTreeMap::new());
                false
            }
            None => {
                if self.halted.take().is_some() {
                    info!(
                        "scale-down resumed: every watch of the cluster healthy, few nodes unready"
                    );
                    s.groups.set_scale_down_halted(None);
                }
                true
            }
        }
    }

    /// Why scale-down is halted, if it is (for the status).
    pub fn halted(&self) -> Option<&str> {
        self.halted.as_deref()
    }

    fn report(&self, groups: &[DownGroup], candidates: &Candidates, now: Instant) {
        let mut per_group: BTreeMap<&str, Vec<(String, Instant)>> = groups
            .iter()
            .map(|g| (g.name.as_str(), Vec::new()))
            .collect();
        for u in &candidates.unneeded {
            let since = self.since.get(&u.node).copied().unwrap_or(now);
            per_group
                .entry(groups[u.group].name.as_str())
                .or_default()
                .push((u.node.clone(), since));
        }
        for (g, nodes) in &per_group {
            self.shared
                .metrics
                .unneeded_nodes_count
                .with_label_values(&[g])
                .set(i64::try_from(nodes.len()).unwrap_or(i64::MAX));
        }
        self.shared.groups.set_unneeded(
            per_group
                .into_iter()
                .map(|(g, nodes)| (g.to_string(), nodes))
                .collect(),
        );
    }
}

impl Shared {
    /// Taint, wait, re-check, drain, delete (see the module documentation).
    /// Removes the nodes of `removals`, all of one group: several only when they are all
    /// empty (one delete request for them all), else one, drained first. Each is tainted; after
    /// the delay each is checked again (one that fails is untainted and dropped); then one
    /// guarded delete whose last look looks at each node left: one that fails it is dropped
    /// (untainted) and the rest go. A budget probe granted for the removal is given back when
    /// no delete is sent.
    async fn remove(self: &Arc<Self>, removals: Vec<Removal>, shutdown: &CancellationToken) {
        let Some(group) = removals.first().map(|r| r.group.clone()) else {
            return;
        };
        let sent = self.remove_nodes(removals, shutdown).await;
        if !sent {
            self.reconciler.give_back_probe(&group);
        }
    }

    /// Every node, by name: the pass and the re-check after the taint list them in one order,
    /// so first-fit tries the destinations in the same order and they agree.
    fn nodes_by_name(&self) -> Vec<Arc<NodeRecord>> {
        let mut nodes: Vec<Arc<NodeRecord>> =
            self.cluster.nodes.snapshot().values().cloned().collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes
    }

    fn node(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.cluster.nodes.snapshot().get(name).cloned()
    }

    /// The wall clock, as the decisions read it.
    fn wall(&self) -> k8s_openapi::jiff::Timestamp {
        self.groups.timestamp()
    }

    /// Takes a removal's place in [`Flight`]: its node busy, one more delete in flight in its
    /// group (and one more drain when it has pods); given back when the [`Slot`] drops.
    fn take_slot(self: &Arc<Self>, removal: &Removal) -> Slot {
        let mut f = self.flight.lock();
        f.busy.insert(removal.node.clone());
        *f.deleting.entry(removal.group.name.clone()).or_default() += 1;
        let drains = !removal.pods.is_empty();
        if drains {
            f.draining += 1;
        }
        Slot {
            shared: self.clone(),
            node: removal.node.clone(),
            group: removal.group.name.clone(),
            drains,
        }
    }
}

#[cfg(test)]
impl Removal {
    /// A removal of `node` (instance `id`) in scale set `group`, its `pods` to move (uids).
    fn of(node: &str, id: &str, group: &str, pods: &[&str]) -> Self {
        Self {
            group: NodeGroupSpec {
                name: group.into(),
                kind: crate::config::NodeGroupKind::Vmss,
                resource_group: None,
                min_size: 0,
                max_size: 10,
                desired_capacity: None,
                schedules: Vec::new(),
                max_scale_down_step: None,
            },
            node: node.into(),
            victim: Victim {
                instance_id: id.into(),
                node_name: node.into(),
            },
            resource_version: "7".into(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            unready: false,
            consolidation: false,
        }
    }
}
