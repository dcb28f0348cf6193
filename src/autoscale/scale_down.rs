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

use crate::autoscale::scale_up::pod_ref;
use crate::cache::Instance;
use crate::capacity::PriceBook;
use crate::config::{NodeGroupKind, NodeGroupSpec, Settings};
use crate::fence::FenceHold;
use crate::kube::nodes::{has_our_taint_record, EvictOutcome, NodeActions, NodeWriteError};
use crate::kube::reflect::ClusterView;
use crate::metrics::Metrics;
use crate::node_groups::{backing, is_ready, schedulable, GroupIndex, NodeGroups, Unhealthy};
use crate::notify::{ControllerEvent, EventSink, ObjectRef};
use crate::pods::consolidate::{
    self, Action, Command, ConsolidationInput, ReplaceOption, Unconsolidatable,
};
use crate::pods::fit::NodeState;
use crate::pods::index::PodIndex;
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::scale_down::removable;
use crate::pods::topology::Cluster;
use crate::pods::topology::NamespaceLabels;
use crate::pods::unneeded::{self, Candidates, DownGroup, DownInput, Limits, Settle};
use crate::pods::volumes::Volumes;
use crate::reconciler::{BulkEnd, DeleteEnd, DeleteKind, LastLook, NoLastLook, Reconciler};
use crate::resource::Victim;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Between two rounds of evictions a budget refused (cluster-autoscaler retries every 5 s).
pub const EVICTION_RETRY: Duration = Duration::from_secs(5);
/// How often a drain looks whether the evicted pods are gone.
const GONE_POLL: Duration = Duration::from_millis(500);
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
    /// A consolidation decided and waiting for its re-validation, and when that is due.
    command: Option<(Command, Instant)>,
    /// What each node was last told by an `Unconsolidatable` Event (told once while it stays).
    told: HashMap<String, String>,
    /// Where a replace asks for its new node (the scale-up loop's demand, which the reconciler
    /// writes from); without it consolidation only deletes.
    demand: Option<Arc<super::scale_up::PodDemand>>,
    /// A replace launched and waiting for its new node.
    replacing: Option<Replacing>,
    /// A replace's new nodes, kept from scale-down until the nodes they replace are removed.
    protected: Option<Protected>,
}

/// A replace under way: its new node asked for, not Ready yet. Only this replica's memory: a
/// replica that stops leading drops it (see [`ScaleDownLoop::run`]'s module notes in
/// `docs/pod-driven.md`): nothing is tainted before the new node is Ready, so nothing is left
/// tainted, and a new leader does not grow the group again for it.
#[derive(Debug)]
struct Replacing {
    command: Command,
    /// The cheaper group that grows.
    group: NodeGroupSpec,
    /// The capacity asked for.
    target: i64,
    /// The group's nodes when it was launched: a Ready node not among them is the new one.
    before: HashSet<String>,
    since: Instant,
}

/// The new nodes of a replace and the nodes they replace.
#[derive(Debug)]
struct Protected {
    new: HashSet<String>,
    old: Vec<String>,
    /// Whether the old nodes' removals have started (then protection ends with them).
    acted: bool,
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

/// A fingerprint of the pods bound to `node` (their uids, in any order).
fn pods_fingerprint(pods: &PodIndex, node: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut uids: Vec<&str> = pods
        .bound(node)
        .map(|p| {
            p.pods()
                .iter()
                .map(|p| p.uid.as_deref().unwrap_or(p.name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    uids.sort_unstable();
    let mut h = rustc_hash::FxHasher::default();
    uids.hash(&mut h);
    h.finish()
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

fn uid_or_key(p: &PodRecord) -> String {
    p.uid.clone().unwrap_or_else(|| p.key())
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
            command: None,
            told: HashMap::new(),
            demand: None,
            replacing: None,
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
    }

    /// One pass: clean up, decide, start removals.
    async fn pass(&mut self, shutdown: &CancellationToken) {
        while self.tasks.try_join_next().is_some() {}
        let s = self.shared.clone();
        if !s.reconciler.may_write() || !s.cluster.synced() {
            // A consolidation decided before is decided again once this replica may act.
            self.command = None;
            // A replace under way is abandoned: nothing of it is tainted yet, and its new node
            // is not asked for again (by this replica or the next leader).
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
            let hiccup =
                s.cluster.synced() && s.reconciler.fence_hold() == Some(FenceHold::RenewalStale);
            if !hiccup {
                self.since.clear();
                self.started.clear();
                s.groups.set_unneeded(BTreeMap::new());
                self.cleaned = false;
            }
            return;
        }
        // Nodes not Ready past their startup window: candidates after `unreadyTime`, never room;
        // too many of them halt scale-down.
        let nodes: Vec<Arc<NodeRecord>> = s.cluster.nodes.snapshot().values().cloned().collect();
        let wall =
            k8s_openapi::jiff::Timestamp::from_nanosecond(s.groups.now().unix_timestamp_nanos())
                .unwrap_or_default();
        let groups = s.groups.groups();
        // Spot VMs Azure evicted with `Deallocate` (the reconciler's last instance lists): their
        // Nodes are NotReady for a known reason, so they neither count as unready nor wait
        // `unreadyTime`; the instances are deleted below.
        let evicted = self.evicted(&groups);
        let stopped: HashSet<String> = evicted
            .iter()
            .map(|e| e.machine.to_ascii_lowercase())
            .collect();
        let mut unready = crate::node_groups::unready_nodes(
            &nodes,
            wall,
            s.settings.pod_demand.max_node_provision_time,
        );
        unready.retain(|n| !stopped.contains(&n.to_ascii_lowercase()));
        let settings = &s.settings.scale_down;
        let too_many = crate::node_groups::too_many_unready(
            unready.len(),
            nodes.len(),
            settings.ok_total_unready_count,
            settings.max_total_unready_percentage,
        );
        if !self.healthy(too_many) {
            return;
        }
        if self.dry_run {
            // Leftover taints are another run's business: a dry run removes none.
            self.cleaned = true;
        } else {
            let retry: Vec<String> = s.flight.lock().untaint.iter().cloned().collect();
            for node in retry {
                if s.untaint(&node).await {
                    s.flight.lock().untaint.remove(&node);
                }
            }
            for (slot, u) in s.settle_unknown().await {
                let task = s.clone();
                self.tasks
                    .spawn(async move { task.delete_again(slot, u).await });
            }
        }

        let now = Instant::now();
        let mut pods = s.cluster.pods.derived();
        if let Some(held) = self.bookings.as_ref().map(|b| b.get()) {
            let holding = held.all();
            if !holding.is_empty() {
                pods = Arc::new(crate::pods::provreq::held_on_nodes(&holding, &nodes, &pods));
            }
        }
        let pdbs: Vec<_> = s.cluster.pdbs.snapshot().values().cloned().collect();
        let volumes = s.cluster.storage.volumes_if(pods.any_claims());
        let namespaces = s.cluster.namespace_labels();
        let (busy, deleting, draining) = {
            let f = s.flight.lock();
            (f.busy.clone(), f.deleting.clone(), f.draining)
        };
        let mut down = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            let size = s.groups.target_size(&g.name);
            if let (Some(now_size), Some(prev)) = (size, self.sizes_seen.get(&g.name)) {
                if now_size > *prev {
                    self.grew_at.insert(g.name.clone(), now);
                }
            }
            if let Some(v) = size {
                self.sizes_seen.insert(g.name.clone(), v);
            }
            down.push(DownGroup {
                name: g.name.clone(),
                backing: backing(&s.settings, g),
                floor: s.groups.floor(g),
                size,
                deleting: deleting.get(&g.name).copied().unwrap_or(0),
                recently_grown: self
                    .grew_at
                    .get(&g.name)
                    .is_some_and(|t| now.duration_since(*t) < settings.delay_after_add),
                refused: s.groups.write_refusal(g),
            });
        }
        if !self.cleaned {
            match self.remove_leftover_taints(&down).await {
                Ok(0) => {}
                Ok(n) => {
                    info!(
                        nodes = n,
                        "removed scale-down taints a previous run left behind"
                    )
                }
                Err(e) => {
                    warn!(error = %e, "could not remove leftover scale-down taints; retrying next pass");
                    return;
                }
            }
            self.cleaned = true;
        }
        // VMs Azure stopped go first: they count toward the floor and the pass's limit before
        // any unneeded node is chosen (so none is drained only to be refused at the floor).
        let per_pass = settings.max_scale_down_per_pass as usize;
        let started_before = self.tasks.len();
        let left = self.remove_evicted(&groups, &mut down, &evicted, &busy, per_pass);
        let mut candidates = unneeded::unneeded(&DownInput {
            now: wall,
            groups: &down,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            threshold: settings.utilization_threshold,
            busy: &busy,
            unready: &unready,
            previously: &self.since.keys().cloned().collect(),
            non_empty_candidates: settings.non_empty_candidates_count,
            volumes: &volumes,
            namespaces: &namespaces,
        });
        // A replace's new node is not removed while the replace needs it.
        self.protection(&busy);
        if let Some(p) = &self.protected {
            candidates.unneeded.retain(|u| !p.new.contains(&u.node));
        }
        unneeded::track(&mut self.since, &candidates, now);
        unneeded::resume(&mut self.since, &mut self.started, &busy);
        self.report(&down, &candidates, now);
        let (chosen, waiting) = unneeded::select(
            &candidates,
            &down,
            &self.since,
            now,
            Limits {
                unneeded_time: settings.unneeded_time,
                unready_time: settings.unready_time,
                max_empty_bulk_delete: settings.max_empty_bulk_delete,
                max_per_pass: u32::try_from(left).unwrap_or(u32::MAX),
                draining: draining > 0,
                balance: s.settings.pod_demand.balance_similar_node_groups,
            },
        );
        if !waiting.is_empty() {
            debug!(?waiting, "unneeded nodes waiting");
        }
        let budget = left.saturating_sub(chosen.len());
        if self.dry_run {
            let (since, unregistered) = (&self.since, &self.unregistered_since);
            let evicted = &self.evicted_seen;
            let slot = |n: &str, (g, i): &(String, String)| {
                n.strip_prefix(g.as_str()) == Some(&format!("/{i}"))
            };
            self.would.retain(|n| {
                since.contains_key(n)
                    || unregistered.keys().any(|k| slot(n, k))
                    || evicted.iter().any(|k| slot(n, k))
            });
        }
        self.remove_unregistered(&groups, &down, &nodes, &busy, budget, now);
        // Empty nodes of one group chosen in this pass go in one request; a node with pods
        // (drained first) goes alone.
        let mut batches: Vec<(Vec<Removal>, Vec<Slot>)> = Vec::new();
        let mut bulk: HashMap<String, usize> = HashMap::new();
        for i in chosen {
            let u = &candidates.unneeded[i];
            let group = groups[u.group].clone();
            if self.dry_run {
                // It stays unneeded (and chosen) pass after pass: said once.
                if self.would.insert(u.node.clone()) {
                    info!(node = %u.node, scale_set = %group.name, instance = %u.instance_id, pods = u.pods.len(), "dry run: would remove an unneeded node (taint, drain, delete)");
                }
                continue;
            }
            // A delete that would be held (a backoff, the write budget) is not started: no node
            // is tainted and drained for it. The node stays unneeded and is chosen again later.
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(node = %u.node, scale_set = %group.name, %hold, "unneeded node not removed yet: its delete would be held");
                continue;
            }
            let removal = Removal {
                node: u.node.clone(),
                victim: Victim {
                    instance_id: u.instance_id.clone(),
                    node_name: u.node.clone(),
                },
                resource_version: u.resource_version.clone(),
                pods: u.pods.clone(),
                unready: u.unready,
                consolidation: false,
                group,
            };
            let slot = {
                let mut f = s.flight.lock();
                f.busy.insert(removal.node.clone());
                *f.deleting.entry(removal.group.name.clone()).or_default() += 1;
                let drains = !removal.pods.is_empty();
                if drains {
                    f.draining += 1;
                }
                Slot {
                    shared: s.clone(),
                    node: removal.node.clone(),
                    group: removal.group.name.clone(),
                    drains,
                }
            };
            if let Some(at) = self.since.remove(&removal.node) {
                self.started.insert(removal.node.clone(), at);
            }
            info!(node = %removal.node, scale_set = %removal.group.name, reason = removal.reason(), pods = removal.pods.len(), "removing an unneeded node");
            let at = match removal.pods.is_empty() {
                true => *bulk.entry(removal.group.name.clone()).or_insert_with(|| {
                    batches.push(Default::default());
                    batches.len() - 1
                }),
                false => {
                    batches.push(Default::default());
                    batches.len() - 1
                }
            };
            batches[at].0.push(removal);
            batches[at].1.push(slot);
        }
        // Consolidation, once nothing else is being removed and this pass chose nothing (one
        // kind of disruption at a time, as Karpenter acts with one method per loop).
        let idle = busy.is_empty() && batches.is_empty() && started_before == self.tasks.len();
        let ctx = PassView {
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
            left: budget.saturating_sub(self.tasks.len() - started_before),
        };
        for removal in self.consolidation(&ctx, idle, now) {
            let slot = {
                let mut f = s.flight.lock();
                f.busy.insert(removal.node.clone());
                *f.deleting.entry(removal.group.name.clone()).or_default() += 1;
                let drains = !removal.pods.is_empty();
                if drains {
                    f.draining += 1;
                }
                Slot {
                    shared: s.clone(),
                    node: removal.node.clone(),
                    group: removal.group.name.clone(),
                    drains,
                }
            };
            self.since.remove(&removal.node);
            // One batch per group: its nodes are drained in turn and deleted in one request.
            let at = *bulk
                .entry(format!("consolidation/{}", removal.group.name))
                .or_insert_with(|| {
                    batches.push(Default::default());
                    batches.len() - 1
                });
            batches[at].0.push(removal);
            batches[at].1.push(slot);
        }
        for (removals, slots) in batches {
            let task = s.clone();
            let stop = shutdown.clone();
            self.tasks.spawn(async move {
                let _slots = slots;
                task.remove(removals, &stop).await;
            });
        }
    }

    /// Consolidation's part of a pass (`consolidation.enabled`): keeps since when each node's
    /// pods have been as they are (`consolidateAfter`); when the cluster is `idle` (nothing being
    /// removed, nothing chosen this pass) decides a command, and once its re-validation is due
    /// (`consolidation.validationDelay` later) checks it against this pass's view and returns its
    /// removals. A command that no longer holds is dropped with an `Unconsolidatable` Event on
    /// its nodes.
    fn consolidation(&mut self, v: &PassView, idle: bool, now: Instant) -> Vec<Removal> {
        let s = self.shared.clone();
        let cfg = &s.settings.consolidation;
        if !cfg.enabled {
            return Vec::new();
        }
        // consolidateAfter: since when each node's pods have been unchanged.
        let present: HashSet<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
        self.pod_events.retain(|n, _| present.contains(n.as_str()));
        let mut unsettled = HashSet::new();
        for n in v.nodes {
            let fp = pods_fingerprint(v.pods, &n.name);
            let e = self.pod_events.entry(n.name.clone()).or_insert((fp, now));
            if e.0 != fp {
                *e = (fp, now);
            }
            if now.duration_since(e.1) < cfg.consolidate_after {
                unsettled.insert(n.name.clone());
            }
        }
        if !idle && self.replacing.is_none() {
            if let Some((c, _)) = self.command.take() {
                debug!(
                    nodes = c.nodes.len(),
                    "consolidation dropped: another removal started meanwhile"
                );
            }
            return Vec::new();
        }
        // Each group's price, decided in one place (override, list price, sentinel).
        let prices: Vec<f64> = v
            .groups
            .iter()
            .map(|g| {
                let cached = s.groups.scale_sets().get(&g.name);
                let (location, size, spot) =
                    cached
                        .as_ref()
                        .map_or((String::new(), String::new(), false), |c| {
                            let shape = super::scale_up::shape_of(g, &c.scale_set);
                            (
                                shape.location.to_string(),
                                shape.vm_size.to_string(),
                                shape.profile.spot,
                            )
                        });
                let price = self
                    .prices
                    .group_price(&g.name, &location, &size, spot)
                    .per_hour;
                s.metrics
                    .node_group_price_per_hour
                    .with_label_values(&[&g.name])
                    .set(price);
                price
            })
            .collect();
        let none = HashSet::new();
        let previously = HashSet::new();
        // The budgets active now, by the injected clock (schedules are UTC windows).
        let active = cfg.active_at(s.groups.now());
        let input = ConsolidationInput {
            down: DownInput {
                now: v.wall,
                groups: v.down,
                nodes: v.nodes,
                pods: v.pods,
                pdbs: v.pdbs,
                threshold: s.settings.scale_down.utilization_threshold,
                busy: v.busy,
                unready: v.unready,
                previously: &previously,
                non_empty_candidates: s.settings.scale_down.non_empty_candidates_count,
                volumes: v.volumes,
                namespaces: v.namespaces,
            },
            prices: &prices,
            chosen: &none,
            unsettled: &unsettled,
            settings: &active,
            max_nodes: u32::try_from(v.left).unwrap_or(u32::MAX),
        };
        if let Some(r) = self.replacing.take() {
            return self.follow_replace(v, &input, r, now);
        }
        if !idle {
            return Vec::new();
        }
        if let Some((command, due)) = self.command.take() {
            if now < due {
                self.command = Some((command, due));
                return Vec::new();
            }
            let checked = match command.action {
                Action::Delete => consolidate::revalidate(&command, &input),
                Action::Replace { group, .. } => {
                    let options = self.replace_options(v, &prices);
                    match options.iter().find(|o| o.group == group) {
                        Some(opt) => consolidate::revalidate_launch(&command, &input, opt),
                        None => Err((
                            command.nodes.first().map(|n| n.node.clone()).unwrap_or_default(),
                            Unconsolidatable::Group(format!(
                                "node group {} may no longer grow for the replacement (at its max, refused, backed off, or no template)",
                                v.groups.get(group).map_or("?", |g| g.name.as_str())
                            )),
                        )),
                    }
                }
            };
            return match checked {
                Ok(()) => match command.action {
                    Action::Delete => self.act(v, command),
                    Action::Replace { .. } => {
                        self.launch(v, command, now);
                        Vec::new()
                    }
                },
                Err((node, why)) => {
                    info!(%node, reason = why.label(), why = %why, "consolidation did not hold on re-validation: nothing removed");
                    self.abandoned(
                        v,
                        &command,
                        &node,
                        "consolidation_invalid",
                        &format!("abandoned on re-validation: {why}"),
                    );
                    Vec::new()
                }
            };
        }
        // The search's time limit is work time, not the cluster's: a real clock.
        let deadline = std::time::Instant::now() + cfg.timeout;
        let started = std::time::Instant::now();
        let options = if self.demand.is_some() {
            self.replace_options(v, &prices)
        } else {
            Vec::new()
        };
        let found = consolidate::decide(&input, &options, &mut || {
            std::time::Instant::now() >= deadline
        });
        if found.timed_out {
            warn!(searched = found.searched, "the consolidation search ran out of consolidation.timeout: the last valid answer stands");
        }
        debug!(
            searched = found.searched,
            trials = found.trials,
            ms = started.elapsed().as_millis() as u64,
            "consolidation decided"
        );
        self.tell(&found.unconsolidatable);
        let Some(command) = found.command else {
            return Vec::new();
        };
        let names: Vec<&str> = command.nodes.iter().map(|n| n.node.as_str()).collect();
        if self.dry_run {
            let key = format!("consolidation:{}", names.join(","));
            if self.would.insert(key) {
                match command.action {
                    Action::Delete => {
                        info!(nodes = ?names, savings_per_hour = command.savings_per_hour, "dry run: would consolidate (taint, drain, delete)")
                    }
                    Action::Replace { group, .. } => {
                        info!(nodes = ?names, replacement = %v.groups.get(group).map_or("?", |g| g.name.as_str()), savings_per_hour = command.savings_per_hour, "dry run: would replace (grow the cheaper group, then taint, drain, delete)")
                    }
                }
            }
            return Vec::new();
        }
        info!(nodes = ?names, savings_per_hour = command.savings_per_hour, delay_s = cfg.validation_delay.as_secs(), "consolidation decided: re-validating before acting");
        self.command = Some((command, now + cfg.validation_delay));
        Vec::new()
    }

    /// `Unconsolidatable` Events for nodes whose reason is new (each told once while it stays).
    fn tell(&mut self, why: &BTreeMap<String, Unconsolidatable>) {
        let s = self.shared.clone();
        self.told.retain(|n, _| why.contains_key(n));
        for (node, w) in why {
            let text = w.to_string();
            if self.told.get(node) == Some(&text) {
                continue;
            }
            s.events.record(ControllerEvent::Unconsolidatable {
                object: node_ref(node, s.node(node).as_deref()),
                why: text.clone(),
            });
            self.told.insert(node.clone(), text);
        }
    }

    /// A command dropped: an `Unconsolidatable` Event on each of its nodes (`node` is the one
    /// that failed) and the metric under `label`.
    fn abandoned(&mut self, v: &PassView, command: &Command, node: &str, label: &str, why: &str) {
        let s = self.shared.clone();
        let group = command
            .nodes
            .iter()
            .find(|n| n.node == node)
            .or(command.nodes.first())
            .and_then(|n| v.groups.get(n.group))
            .map_or("", |g| g.name.as_str());
        s.metrics
            .failed_scale_downs_total
            .with_label_values(&[group, label])
            .inc();
        let what = match command.action {
            Action::Delete => "consolidation",
            Action::Replace { .. } => "replace",
        };
        for n in &command.nodes {
            let text = if n.node == node || node.is_empty() {
                format!("{what} {why}")
            } else {
                format!("{what} {why} (node {node})")
            };
            s.events.record(ControllerEvent::Unconsolidatable {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                why: text.clone(),
            });
            self.told.insert(n.node.clone(), text);
        }
    }

    /// The groups a replacement may come from now, each with a new node as scale-up's planner
    /// imagines it ([`crate::pods::scale_up::group_templates`]: a Ready node of the group, else
    /// its learned node, else its shape; DaemonSets taken off): below their max, with a known
    /// size and template, not refused (a co-writer's pool, an offering Azure refused lately)
    /// and not backed off.
    fn replace_options(&self, v: &PassView, prices: &[f64]) -> Vec<ReplaceOption> {
        use crate::pods::scale_up::{group_templates, GroupInput};
        let s = &self.shared;
        let cached: Vec<_> = v
            .groups
            .iter()
            .map(|g| s.groups.scale_sets().get(&g.name))
            .collect();
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let mut live: Vec<Option<&NodeRecord>> = vec![None; v.groups.len()];
        for n in v.nodes {
            if let Some(i) = index.group_of(n) {
                if live[i].is_none() && is_ready(n) && schedulable(n) && !has_our_taint_record(n) {
                    live[i] = Some(n);
                }
            }
        }
        let inputs: Vec<GroupInput> = v
            .groups
            .iter()
            .zip(v.down)
            .zip(&cached)
            .map(|((g, d), c)| GroupInput {
                name: g.name.clone(),
                backing: d.backing.clone(),
                min: g.min_size,
                max: g.max_size,
                capacity: d.size,
                shape: c
                    .as_ref()
                    .map(|c| super::scale_up::shape_of(g, &c.scale_set)),
                unhealthy: None,
                failed: Vec::new(),
                stopped: Vec::new(),
                quota: Vec::new(),
                vcpus: None,
                passed_over: Default::default(),
                learned: s.groups.learned_template(&g.name),
            })
            .collect();
        let daemonsets: Vec<_> = s.cluster.daemonsets.snapshot().values().cloned().collect();
        let templates = group_templates(&inputs, &live, &daemonsets, v.volumes);
        let mut out = Vec::new();
        for (i, (g, t)) in v.groups.iter().zip(templates).enumerate() {
            let Ok(template) = t else { continue };
            let grows = v.down[i].size.is_some_and(|n| n < i64::from(g.max_size));
            let held =
                v.down[i].refused.is_some() || s.groups.health(&g.name).out_of_scale_up().is_some();
            if grows && !held {
                out.push(ReplaceOption {
                    group: i,
                    template,
                    price: prices.get(i).copied().unwrap_or(f64::INFINITY),
                });
            }
        }
        out
    }

    /// Launches a replace that held on re-validation: its group is asked for one more node
    /// (the reconciler writes it with `If-Match`, as a scale-up), and each node it replaces is
    /// told by a `Consolidating` Event. Nothing is tainted yet.
    fn launch(&mut self, v: &PassView, command: Command, now: Instant) {
        let s = self.shared.clone();
        let Action::Replace { group, price } = command.action else {
            return;
        };
        let (Some(g), Some(demand)) = (v.groups.get(group).cloned(), self.demand.clone()) else {
            return;
        };
        let Some(size) = s.groups.target_size(&g.name) else {
            return;
        };
        let target = size + 1;
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let before: HashSet<String> = v
            .nodes
            .iter()
            .filter(|n| index.group_of(n) == Some(group))
            .map(|n| n.name.clone())
            .collect();
        let count = command.nodes.len();
        info!(nodes = count, scale_set = %g.name, from = size, to = target, savings_per_hour = command.savings_per_hour, "replacing: the decision held on re-validation; the cheaper group grows first");
        for n in &command.nodes {
            let group_name = v.groups.get(n.group).map_or("?", |g| g.name.as_str());
            s.events.record(ControllerEvent::Consolidating {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                note: format!(
                    "replacing {count} node(s) by one new node of {} (${price:.3}/h), saving ${:.3}/h: the new node comes first; once it is Ready and the decision still holds, this node ({group_name}, ${:.3}/h, {} pod(s)) is tainted, drained and deleted",
                    g.name,
                    command.savings_per_hour,
                    n.price,
                    n.pods.len(),
                ),
            });
            self.told.remove(&n.node);
        }
        demand.set_replacement(&g.name, Some(target));
        s.reconciler.wake();
        self.protected = Some(Protected {
            new: HashSet::new(),
            old: command.nodes.iter().map(|n| n.node.clone()).collect(),
            acted: false,
        });
        self.replacing = Some(Replacing {
            command,
            group: g,
            target,
            before,
            since: now,
        });
    }

    /// A replace waiting for its new node, looked at each pass: the group refused (a write
    /// refusal, an allocation Azure refused, a backoff) or no new node Ready within
    /// `maxNodeProvisionTime` abandons it; a new node Ready re-validates it on that node as it
    /// really is, then its nodes go through scale-down's taint, drain and guarded delete.
    fn follow_replace(
        &mut self,
        v: &PassView,
        input: &ConsolidationInput,
        r: Replacing,
        now: Instant,
    ) -> Vec<Removal> {
        let s = self.shared.clone();
        let g = &r.group;
        let index = GroupIndex::of_backings(v.down.iter().map(|g| &g.backing));
        let at = v.groups.iter().position(|x| x.name == g.name);
        let new: Vec<&Arc<NodeRecord>> = v
            .nodes
            .iter()
            .filter(|n| at.is_some() && index.group_of(n) == at && !r.before.contains(&n.name))
            .collect();
        if let Some(p) = self.protected.as_mut() {
            p.new = new.iter().map(|n| n.name.clone()).collect();
        }
        let ready: Vec<&str> = new
            .iter()
            .filter(|n| is_ready(n) && schedulable(n))
            .map(|n| n.name.as_str())
            .collect();
        // Why the group's new node does not come, as its health says (a provisioning timeout
        // is this wait's own, below).
        let refused = match s.groups.health(&g.name).out_of_scale_up() {
            Some(Unhealthy::Refused(w)) => Some(w.to_string()),
            Some(Unhealthy::Unavailable { .. }) => s
                .groups
                .unavailable(&g.name)
                .map(|u| format!("Azure refused its allocation: {u}")),
            Some(Unhealthy::WriteBackoff) => {
                Some("its writes are backed off after an error".to_string())
            }
            _ => None,
        };
        let limit = s.settings.pod_demand.max_node_provision_time;
        let why = if !ready.is_empty() {
            None
        } else if let Some(w) = refused {
            Some(format!("its new node of {} does not come: {w}", g.name))
        } else if now.duration_since(r.since) >= limit {
            Some(format!(
                "its new node of {} was not Ready within maxNodeProvisionTime ({})",
                g.name,
                humantime::format_duration(limit)
            ))
        } else {
            debug!(scale_set = %g.name, target = r.target, "replace waiting for its new node");
            self.replacing = Some(r);
            return Vec::new();
        };
        if let Some(d) = &self.demand {
            d.set_replacement(&g.name, None);
        }
        if let Some(why) = why {
            warn!(scale_set = %g.name, why = %why, "replace abandoned before any node was tainted");
            self.abort(v, r, &why);
            return Vec::new();
        }
        match consolidate::revalidate(&r.command, input) {
            Ok(()) => {
                info!(scale_set = %g.name, new = ?ready, "replacement Ready and the decision holds on it: removing the nodes it replaces");
                if let Some(p) = self.protected.as_mut() {
                    p.acted = true;
                }
                self.act(v, r.command)
            }
            Err((node, why)) => {
                let why = format!(
                    "abandoned on re-validation with its new node {} Ready: {why}",
                    ready.join(",")
                );
                info!(%node, scale_set = %g.name, why = %why, "replace abandoned: nothing tainted; the new node stays for scale-down to judge");
                self.abandoned(v, &r.command, &node, "replace_aborted", &why);
                self.protected = None;
                Vec::new()
            }
        }
    }

    /// Ends a replace whose new node does not come: any of its nodes carrying our taint (none
    /// should: they are tainted only once the new node is Ready) is untainted, each is told.
    fn abort(&mut self, v: &PassView, r: Replacing, why: &str) {
        let s = self.shared.clone();
        {
            let mut f = s.flight.lock();
            for n in &r.command.nodes {
                let tainted = s.node(&n.node).is_some_and(|x| has_our_taint_record(&x));
                if tainted && !f.busy.contains(&n.node) {
                    f.untaint.insert(n.node.clone());
                }
            }
        }
        self.abandoned(
            v,
            &r.command,
            "",
            "replace_aborted",
            &format!("abandoned: {why}"),
        );
        self.protected = None;
    }

    /// Ends a replace's protection of its new node once the nodes it replaced are no longer
    /// being removed (removed, or their removal stopped).
    fn protection(&mut self, busy: &HashSet<String>) {
        if self.replacing.is_some() {
            return;
        }
        let done = self
            .protected
            .as_ref()
            .is_some_and(|p| p.acted && p.old.iter().all(|n| !busy.contains(n)));
        let armed = self.protected.as_ref().is_some_and(|p| p.acted);
        if done {
            self.protected = None;
        } else if !armed && self.protected.is_some() {
            // Launched and then ended without acting: nothing to keep.
            self.protected = None;
        }
    }

    /// The removals of a command that held on re-validation, each announced by a
    /// `Consolidating` Event (taint, drain and guarded delete are scale-down's).
    fn act(&mut self, v: &PassView, command: Command) -> Vec<Removal> {
        let s = self.shared.clone();
        let count = command.nodes.len();
        info!(
            nodes = count,
            savings_per_hour = command.savings_per_hour,
            "consolidating: the decision held on re-validation"
        );
        let mut out = Vec::with_capacity(count);
        for n in command.nodes {
            let Some(group) = v.groups.get(n.group).cloned() else {
                continue;
            };
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(node = %n.node, scale_set = %group.name, %hold, "consolidation of a node not started: its delete would be held");
                continue;
            }
            s.events.record(ControllerEvent::Consolidating {
                object: node_ref(&n.node, s.node(&n.node).as_deref()),
                note: format!(
                    "consolidating {count} node(s), saving ${:.3}/h: this node ({}, ${:.3}/h, {} pod(s), disruption cost {:.2}) is tainted, drained and deleted; its pods move to the nodes that stay",
                    command.savings_per_hour,
                    group.name,
                    n.price,
                    n.pods.len(),
                    n.cost
                ),
            });
            self.told.remove(&n.node);
            out.push(Removal {
                node: n.node.clone(),
                victim: Victim {
                    instance_id: n.instance_id,
                    node_name: n.node,
                },
                resource_version: n.resource_version,
                pods: n.pods,
                unready: false,
                consolidation: true,
                group,
            });
        }
        out
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

    /// The spot instances Azure evicted with `Deallocate`, as the reconciler's last instance
    /// lists show them ([`unneeded::evicted`]). Each newly seen one is counted in
    /// `spot_evictions_total` and marks its group's offering unavailable (a spot eviction), so
    /// the pods it ran are planned elsewhere.
    fn evicted(&mut self, groups: &[NodeGroupSpec]) -> Vec<unneeded::Unregistered> {
        let s = &self.shared;
        let instances: Vec<_> = groups
            .iter()
            .map(|g| s.groups.instances().get(&g.name))
            .collect();
        let spot: Vec<bool> = groups
            .iter()
            .map(|g| s.groups.offering(&g.name).is_some_and(|o| o.spot))
            .collect();
        let evicted = unneeded::evicted(&instances, &spot);
        let current: HashSet<(String, String)> = evicted
            .iter()
            .map(|e| (groups[e.group].name.clone(), e.instance_id.clone()))
            .collect();
        // Seen stays seen while the VM is listed stopped (being deleted, a delete that failed):
        // a VM is counted and marks its offering once per eviction; one started again and
        // evicted later counts anew. A group whose list is not cached now says nothing.
        self.evicted_seen.retain(|(g, i)| {
            groups
                .iter()
                .zip(&instances)
                .find(|(spec, _)| spec.name == *g)
                .is_some_and(|(_, l)| {
                    l.as_ref().is_none_or(|l| {
                        l.iter()
                            .any(|inst| inst.instance_id == *i && inst.deallocated())
                    })
                })
        });
        let mut new: BTreeMap<&str, u64> = BTreeMap::new();
        for key in current {
            if !self.evicted_seen.contains(&key) {
                if let Some(g) = groups.iter().find(|g| g.name == key.0) {
                    *new.entry(g.name.as_str()).or_default() += 1;
                }
                self.evicted_seen.insert(key);
            }
        }
        for (name, n) in new {
            s.metrics
                .spot_evictions_total
                .with_label_values(&[name])
                .inc_by(n);
            s.groups.mark_unavailable(
                name,
                crate::capacity::AllocationFailure::SpotEvicted,
                &format!("{n} spot VM(s) evicted by Azure with policy Deallocate: listed stopped, running no pod"),
            );
        }
        evicted
    }

    /// Deletes the spot instances Azure evicted with `Deallocate` by name, at once, through the
    /// guarded delete ([`DeleteKind::Replace`]: at the floor the size is written back up), at
    /// most `budget` this pass; counts each in its group's `deleting` and returns the budget
    /// left. Their pods are down already (the VM is
    /// stopped): there is nothing to drain, and the last look checks a fresh list still shows
    /// the VM deallocated (someone may have started it).
    fn remove_evicted(
        &mut self,
        groups: &[NodeGroupSpec],
        down: &mut [DownGroup],
        evicted: &[unneeded::Unregistered],
        busy: &HashSet<String>,
        budget: usize,
    ) -> usize {
        let s = self.shared.clone();
        let mut left = budget;
        for e in evicted {
            let group = groups[e.group].clone();
            let slot_name = format!("{}/{}", group.name, e.instance_id);
            if left == 0
                || down[e.group].size.is_none()
                || down[e.group].refused.is_some()
                || busy.contains(&slot_name)
            {
                continue;
            }
            if self.dry_run {
                // Counted as a real pass would count it, so what else the dry run says it would
                // remove is what a real pass would.
                left -= 1;
                down[e.group].deleting += 1;
                if self.would.insert(slot_name) {
                    info!(scale_set = %group.name, instance = %e.instance_id, machine = %e.machine, "dry run: would delete a spot instance Azure evicted (deallocated)");
                }
                continue;
            }
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(scale_set = %group.name, instance = %e.instance_id, %hold, "evicted instance not deleted yet: its delete would be held");
                continue;
            }
            left -= 1;
            down[e.group].deleting += 1;
            let victim = Victim {
                instance_id: e.instance_id.clone(),
                node_name: e.machine.clone(),
            };
            let look = EvictedLook {
                shared: s.clone(),
                group: group.clone(),
                instance_id: e.instance_id.clone(),
            };
            warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, "Azure evicted a spot instance with policy Deallocate: deleting it, its pods go elsewhere");
            self.start_instance_delete(
                slot_name,
                group,
                victim,
                DeleteKind::Replace,
                look,
                "spot_evicted",
            );
        }
        left
    }

    /// Instances that have had no Node for `maxNodeProvisionTime` (a broken image, a bootstrap
    /// that failed: they cost money and will never run a pod), and at once those a refused
    /// allocation left `Failed` (listed so after Azure's refusal), are deleted by name, through the
    /// same guarded delete as a drained node (fresh read, floor, still listed, `If-Match`), at
    /// most `budget` this pass. The instances are the reconciler's last list (no extra call);
    /// since when each has had no Node is counted here, on the monotonic clock, so a node the
    /// watch has not shown yet is never taken for missing: it must stay missing that long.
    fn remove_unregistered(
        &mut self,
        groups: &[NodeGroupSpec],
        down: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        busy: &HashSet<String>,
        budget: usize,
        now: Instant,
    ) {
        let s = self.shared.clone();
        let instances: Vec<_> = groups
            .iter()
            .map(|g| s.groups.instances().get(&g.name))
            .collect();
        let missing = unneeded::unregistered(down, &instances, nodes);
        let key =
            |u: &unneeded::Unregistered| (groups[u.group].name.clone(), u.instance_id.clone());
        let current: HashSet<(String, String)> = missing.iter().map(key).collect();
        // A group whose instance list is not cached now (its TTL ran out, our own write
        // invalidated it) says nothing about its instances: their timers stay.
        let unknown: HashSet<&str> = groups
            .iter()
            .zip(&instances)
            .filter(|(_, l)| l.is_none())
            .map(|(g, _)| g.name.as_str())
            .collect();
        self.unregistered_since
            .retain(|k, _| current.contains(k) || unknown.contains(k.0.as_str()));
        for k in current {
            self.unregistered_since.entry(k).or_insert(now);
        }
        let limit = s.settings.pod_demand.max_node_provision_time;
        let mut started = 0;
        for u in &missing {
            let since = self.unregistered_since.get(&key(u)).copied().unwrap_or(now);
            let slot_name = format!("{}/{}", groups[u.group].name, u.instance_id);
            // An agent pool deletes machines by name: without one, leave the instance alone.
            let unnamed = u.machine.is_empty()
                && matches!(groups[u.group].kind, NodeGroupKind::AksAgentPool { .. });
            // A `Failed` instance holds no capacity: at the floor it is replaced. One merely
            // without a Node (still booting, slow bootstrap) is held to the floor, as
            // cluster-autoscaler holds unregistered nodes to min.
            let failed = instances[u.group].as_ref().is_some_and(|list| {
                list.iter()
                    .any(|i| i.instance_id == u.instance_id && i.failed())
            });
            // What a refused allocation left `Failed` (a list read after Azure's refusal says
            // so) will never boot: deleted now, as cluster-autoscaler deletes the nodes of a
            // scale-up that reported out-of-resources errors, not after maxNodeProvisionTime.
            let left_by_refusal = failed && s.groups.listed_since_refusal(&groups[u.group].name);
            if started >= budget
                || (now.duration_since(since) < limit && !left_by_refusal)
                || down[u.group].size.is_none()
                || busy.contains(&slot_name)
                || unnamed
            {
                continue;
            }
            started += 1;
            let group = groups[u.group].clone();
            if self.dry_run {
                if self.would.insert(slot_name.clone()) {
                    info!(scale_set = %group.name, instance = %u.instance_id, machine = %u.machine, left_by_refusal, "dry run: would delete an instance that never registered as a node");
                }
                continue;
            }
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(scale_set = %group.name, instance = %u.instance_id, %hold, "unregistered instance not deleted yet: its delete would be held");
                continue;
            }
            let victim = Victim {
                instance_id: u.instance_id.clone(),
                node_name: u.machine.clone(),
            };
            let kind = if failed {
                DeleteKind::Replace
            } else {
                DeleteKind::Unneeded
            };
            let look = UnregisteredLook {
                shared: s.clone(),
                group: down[u.group].clone(),
                instance: Instance {
                    instance_id: u.instance_id.clone(),
                    provisioning_state: None,
                    computer_name: Some(u.machine.clone()).filter(|m| !m.is_empty()),
                    power_state: None,
                    zone: None,
                },
            };
            if left_by_refusal {
                warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, "an instance Azure's refused allocation left Failed: deleting it now");
            } else {
                warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, minutes = limit.as_secs() / 60, "an instance never registered as a node within maxNodeProvisionTime: deleting it");
            }
            self.start_instance_delete(slot_name, group, victim, kind, look, "unregistered");
        }
    }

    /// Takes `slot_name` (busy, one more delete in flight in `group`) and deletes `victim`, an
    /// instance with nothing to drain, in the background ([`Shared::remove_instance`]); the slot
    /// is given back when the task ends.
    fn start_instance_delete(
        &mut self,
        slot_name: String,
        group: NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        look: impl LastLook + 'static,
        reason: &'static str,
    ) {
        let s = self.shared.clone();
        let slot = {
            let mut f = s.flight.lock();
            f.busy.insert(slot_name.clone());
            *f.deleting.entry(group.name.clone()).or_default() += 1;
            Slot {
                shared: s.clone(),
                node: slot_name,
                group: group.name.clone(),
                drains: false,
            }
        };
        self.tasks.spawn(async move {
            let _slot = slot;
            s.remove_instance(group, victim, kind, &look, reason).await;
        });
    }

    /// Our taints on nodes no removal of this process is working on (cluster-autoscaler #5048):
    /// at the start of a leadership, a removal still finishing from the previous one keeps its
    /// node. A node whose VM a previous leader may have been deleting is untainted only when a
    /// fresh instance list shows its VM still there and `Succeeded`; any other (gone, `Failed`,
    /// `Deleting`, `Updating`) is parked as a delete of unknown outcome, settled pass by pass
    /// ([`Shared::settle_unknown`]: a `Failed` VM deleted again, one stuck past the bound too),
    /// so it is never left cordoned for the leadership. One fresh LIST per group, however many
    /// of its nodes are tainted; a list that fails means try again next pass.
    async fn remove_leftover_taints(&self, groups: &[DownGroup]) -> Result<usize, NodeWriteError> {
        let s = &self.shared;
        let busy = s.flight.lock().busy.clone();
        let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
        let all = s.groups.groups();
        let view = s.cluster.nodes.snapshot();
        let mut removed = 0;
        let mut first_error = None;
        let mut ours: BTreeMap<String, (NodeGroupSpec, Vec<(String, String)>)> = BTreeMap::new();
        let mut untaint = Vec::new();
        for node in s.actions.tainted_nodes().await? {
            if busy.contains(&node) {
                continue;
            }
            let mine = view.get(&node).and_then(|n| {
                let g = index.group_of(n)?;
                let id = n.instance_id()?;
                let spec = all.iter().find(|spec| spec.name == groups[g].name)?;
                Some((spec.clone(), id.to_string()))
            });
            match mine {
                Some((group, instance)) => ours
                    .entry(group.name.clone())
                    .or_insert_with(|| (group, Vec::new()))
                    .1
                    .push((node, instance)),
                None => untaint.push(node),
            }
        }
        for (group, nodes) in ours.into_values() {
            let list = match s.groups.fresh_instances(&group).await {
                Ok(list) => list,
                Err(e) => {
                    first_error.get_or_insert(NodeWriteError::Other(format!(
                        "node group {}: its instances could not be listed fresh: {e}",
                        group.name
                    )));
                    continue;
                }
            };
            for (node, instance) in nodes {
                let state = list
                    .iter()
                    .find(|i| i.instance_id == instance)
                    .map(|i| i.provisioning_state.clone().unwrap_or_default());
                if state
                    .as_deref()
                    .is_some_and(|st| st.eq_ignore_ascii_case("Succeeded"))
                {
                    untaint.push(node);
                    continue;
                }
                info!(%node, scale_set = %group.name, state = ?state, "a leftover tainted node's VM is not Succeeded: it keeps the taint until the VM is gone, deleted again or healthy");
                s.park(
                    node.clone(),
                    Unknown {
                        group: group.clone(),
                        victim: Victim {
                            instance_id: instance,
                            node_name: node,
                        },
                        tainted: true,
                        reason: "leftover",
                        since: Instant::now(),
                    },
                );
            }
        }
        for node in untaint {
            match s.actions.untaint(&node).await {
                Ok(()) => removed += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
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
    /// Deletes an instance with no pod to drain (`reason`: `unregistered`, it never became a
    /// Node; `spot_evicted`, Azure stopped it); with [`DeleteKind::Replace`] (a `Failed` or
    /// evicted instance) even at the group's floor, the size then written back up.
    async fn remove_instance(
        self: &Arc<Self>,
        group: NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        look: &dyn LastLook,
        reason: &'static str,
    ) {
        if !self.reconciler.may_write() {
            return;
        }
        let name = group.name.as_str();
        match self
            .reconciler
            .delete_instance(&group, victim.clone(), kind, look)
            .await
        {
            DeleteEnd::Deleted => {
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[name, reason])
                    .inc();
                info!(scale_set = name, instance = %victim.instance_id, reason, "an instance with nothing to drain was deleted");
            }
            DeleteEnd::Refused(why) => {
                info!(scale_set = name, instance = %victim.instance_id, reason, %why, "an instance with nothing to drain was not deleted");
                self.reconciler.give_back_probe(&group);
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "refused"])
                    .inc();
            }
            DeleteEnd::Stopped(why) => {
                info!(scale_set = name, instance = %victim.instance_id, reason, %why, "an instance with nothing to drain was not deleted");
                self.reconciler.give_back_probe(&group);
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "aborted"])
                    .inc();
            }
            DeleteEnd::Failed(why) => {
                warn!(scale_set = name, instance = %victim.instance_id, reason, %why, "deleting an instance with nothing to drain failed");
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "delete_failed"])
                    .inc();
            }
            DeleteEnd::Unknown(why) => {
                warn!(scale_set = name, instance = %victim.instance_id, reason, %why, "deleting an instance with nothing to drain: outcome unknown; a fresh list decides");
                let slot = format!("{name}/{}", victim.instance_id);
                self.park(
                    slot,
                    Unknown {
                        group: group.clone(),
                        victim,
                        tainted: false,
                        reason,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    /// Keeps a delete of unknown outcome: its node (or slot) stays busy, and tainted.
    fn park(&self, slot: String, u: Unknown) {
        let mut f = self.flight.lock();
        f.busy.insert(slot.clone());
        f.unknown.insert(slot, u);
    }

    /// Each pass: one fresh instance list per group with deletes of unknown outcome (not one
    /// per parked node), and each settled by [`unneeded::settle`]: the VM gone, the node was
    /// removed; still there and `Succeeded`, the delete did not happen and the node is
    /// untainted; `Deleting` or `Updating`, ask again next pass, until `maxNodeProvisionTime`
    /// since it was parked; `Failed` (or stuck past that), returned to be deleted again
    /// ([`Shared::delete_again`]), unless the group's delete would be held now. A list that
    /// fails: ask again next pass.
    async fn settle_unknown(&self) -> Vec<(String, Unknown)> {
        let open: Vec<(String, Unknown)> = self
            .flight
            .lock()
            .unknown
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut by_group: BTreeMap<String, Vec<(String, Unknown)>> = BTreeMap::new();
        for (slot, u) in open {
            by_group
                .entry(u.group.name.clone())
                .or_default()
                .push((slot, u));
        }
        let stuck_after = self.settings.pod_demand.max_node_provision_time;
        let mut again = Vec::new();
        for (name, parked) in by_group {
            let group = parked[0].1.group.clone();
            let list = match self.groups.fresh_instances(&group).await {
                Ok(list) => list,
                Err(e) => {
                    debug!(scale_set = %name, error = %e, "deletes of unknown outcome: the instances could not be listed");
                    continue;
                }
            };
            for (slot, u) in parked {
                let state = list
                    .iter()
                    .find(|i| i.instance_id == u.victim.instance_id)
                    .map(|i| i.provisioning_state.clone().unwrap_or_default());
                let settled = match unneeded::settle(
                    state.as_deref(),
                    u.since.elapsed(),
                    stuck_after,
                ) {
                    Settle::Gone => {
                        info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the delete of unknown outcome happened: the instance is gone");
                        self.metrics
                            .scaled_down_nodes_total
                            .with_label_values(&[&name, u.reason])
                            .inc();
                        self.reconciler.invalidate_size(&name);
                        true
                    }
                    Settle::Healthy => {
                        info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the delete of unknown outcome did not happen: the VM is still there");
                        !u.tainted || self.untaint(&slot).await
                    }
                    Settle::Wait => {
                        debug!(scale_set = %name, instance = %u.victim.instance_id, state = ?state, "delete of unknown outcome: waiting");
                        false
                    }
                    Settle::DeleteAgain => {
                        if let Some(hold) = self.reconciler.delete_hold(&group) {
                            debug!(scale_set = %name, instance = %u.victim.instance_id, %hold, "a VM to delete again waits: its delete would be held");
                        } else {
                            warn!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, state = ?state, waited_secs = u.since.elapsed().as_secs(), "a VM whose delete's outcome was unknown is Failed or stuck: deleting it again");
                            self.flight.lock().unknown.remove(&slot);
                            again.push((slot.clone(), u));
                        }
                        false
                    }
                };
                if settled {
                    let mut f = self.flight.lock();
                    f.unknown.remove(&slot);
                    f.busy.remove(&slot);
                }
            }
        }
        again
    }

    /// Deletes again, through the guarded delete, a VM [`Shared::settle_unknown`] found `Failed`
    /// or stuck ([`DeleteKind::Replace`]: it holds no capacity worth keeping, so even at the
    /// floor, the size then written back up). The last look, for a node, is a drained node's: our
    /// taint still on it and no pod. Its slot stays busy meanwhile: deleted (or found gone), it
    /// is released; stopped by the last look, the node is untainted and released; anything
    /// else parks it again, for a fresh list to decide.
    async fn delete_again(self: Arc<Self>, slot: String, mut u: Unknown) {
        let look: Box<dyn LastLook> = if u.tainted {
            Box::new(NodeLook {
                shared: self.clone(),
                nodes: vec![slot.clone()],
            })
        } else {
            Box::new(NoLastLook)
        };
        let name = u.group.name.clone();
        let end = self
            .reconciler
            .delete_instance(
                &u.group,
                u.victim.clone(),
                DeleteKind::Replace,
                look.as_ref(),
            )
            .await;
        let release = match &end {
            DeleteEnd::Deleted => {
                info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the VM was deleted again");
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[&name, u.reason])
                    .inc();
                true
            }
            DeleteEnd::Stopped(why) => {
                info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, %why, "deleting the VM again was stopped by the last look: the node stays");
                self.reconciler.give_back_probe(&u.group);
                !u.tainted || self.untaint(&slot).await || {
                    self.flight.lock().untaint.insert(slot.clone());
                    true
                }
            }
            other => {
                if matches!(other, DeleteEnd::Refused(_)) {
                    self.reconciler.give_back_probe(&u.group);
                }
                debug!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, end = ?other, "deleting the VM again did not end it: a fresh list decides next pass");
                false
            }
        };
        let mut f = self.flight.lock();
        if release {
            f.busy.remove(&slot);
        } else {
            u.since = Instant::now();
            f.busy.insert(slot.clone());
            f.unknown.insert(slot, u);
        }
    }

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

    /// [`Shared::remove`]; whether a delete request was sent (or its outcome is not known).
    async fn remove_nodes(
        self: &Arc<Self>,
        removals: Vec<Removal>,
        shutdown: &CancellationToken,
    ) -> bool {
        if !self.reconciler.may_write() {
            return false;
        }
        let mut tainted = Vec::with_capacity(removals.len());
        for r in removals {
            let nref = node_ref(&r.node, self.node(&r.node).as_deref());
            if let Err(e) = self.actions.taint(&r.node, &r.resource_version).await {
                // A 409: the node changed since the pass read it; the next pass decides again.
                debug!(node = %r.node, error = %e, "taint not written");
                self.count_failed(&r, "taint");
                continue;
            }
            self.events.record(ControllerEvent::ScaleDown {
                object: nref.clone(),
                note: format!(
                    "marked the node as toBeDeleted/unschedulable ({}, node group {})",
                    r.reason(),
                    r.group.name
                ),
            });
            tainted.push((r, nref));
        }
        if tainted.is_empty() {
            return false;
        }
        let delay = self.settings.scale_down.node_delete_delay_after_taint;
        if !wait(delay, shutdown).await {
            for (r, nref) in &tainted {
                self.abort(r, nref, "aborted", "the controller is shutting down")
                    .await;
            }
            return false;
        }
        let mut ready = Vec::with_capacity(tainted.len());
        for (r, nref) in tainted {
            let checked = match self.recheck(&r) {
                Ok(()) if !r.pods.is_empty() => self
                    .drain(&r, shutdown)
                    .await
                    .map_err(|why| ("drain_failed", why)),
                Ok(()) => Ok(()),
                Err(why) => Err(("aborted", why)),
            };
            match checked {
                Ok(()) => ready.push((r, nref)),
                Err((label, why)) => self.abort(&r, &nref, label, &why).await,
            }
        }
        let Some(group) = ready.first().map(|(r, _)| r.group.clone()) else {
            return false;
        };
        let look = NodeLook {
            shared: self.clone(),
            nodes: ready.iter().map(|(r, _)| r.node.clone()).collect(),
        };
        let victims: Vec<Victim> = ready.iter().map(|(r, _)| r.victim.clone()).collect();
        let BulkEnd {
            end,
            dropped,
            operation_failed,
        } = self
            .reconciler
            .delete_each(&group, victims, DeleteKind::Unneeded, &look)
            .await;
        let mut went = Vec::with_capacity(ready.len());
        for (r, nref) in ready {
            match dropped.iter().find(|(id, _)| *id == r.victim.instance_id) {
                Some((_, why)) => {
                    let text = format!("stopped right before the delete: {why}");
                    self.abort(&r, &nref, "aborted", &text).await
                }
                None => went.push((r, nref)),
            }
        }
        let sent = matches!(
            end,
            DeleteEnd::Deleted | DeleteEnd::Failed(_) | DeleteEnd::Unknown(_)
        );
        if operation_failed {
            // Azure accepted the request and its operation failed: some instances may be gone.
            // A fresh list decides node by node.
            self.after_failed_operation(&group, went, &end).await;
        } else {
            for (r, nref) in went {
                self.finish(r, nref, &end).await;
            }
        }
        sent
    }

    /// After a delete whose operation failed: one fresh list of the group decides each node
    /// ([`unneeded::settle`]): its VM gone, the node was removed (counted); still there and
    /// `Succeeded`, the node is untainted and stays; anything else (`Failed`, `Deleting`), the
    /// node stays tainted and is settled pass by pass as a delete of unknown outcome. A list
    /// that fails parks them all so.
    async fn after_failed_operation(
        self: &Arc<Self>,
        group: &NodeGroupSpec,
        went: Vec<(Removal, ObjectRef)>,
        end: &DeleteEnd,
    ) {
        let list = match self.groups.fresh_instances(group).await {
            Ok(list) => Some(list),
            Err(e) => {
                warn!(scale_set = %group.name, error = %e, "the instances could not be listed after a failed delete: its nodes stay tainted until a fresh list decides");
                None
            }
        };
        let why = match end {
            DeleteEnd::Failed(why) => why.clone(),
            other => format!("{other:?}"),
        };
        for (r, nref) in went {
            let Some(list) = &list else {
                self.finish(r, nref, &DeleteEnd::Unknown(why.clone())).await;
                continue;
            };
            let state = list
                .iter()
                .find(|i| i.instance_id == r.victim.instance_id)
                .map(|i| i.provisioning_state.clone().unwrap_or_default());
            let outcome = match unneeded::settle(state.as_deref(), Duration::ZERO, Duration::MAX) {
                Settle::Gone => DeleteEnd::Deleted,
                Settle::Healthy => DeleteEnd::Failed(why.clone()),
                Settle::DeleteAgain | Settle::Wait => DeleteEnd::Unknown(format!(
                    "the delete failed ({why}) and the VM is listed {}",
                    state.as_deref().unwrap_or_default()
                )),
            };
            self.finish(r, nref, &outcome).await;
        }
    }

    /// What one node's removal comes to, once its delete request has its outcome.
    async fn finish(self: &Arc<Self>, r: Removal, nref: ObjectRef, end: &DeleteEnd) {
        match end {
            DeleteEnd::Deleted => {
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[&r.group.name, r.reason()])
                    .inc();
                info!(node = %r.node, scale_set = %r.group.name, instance = %r.victim.instance_id, "node removed: its instance was deleted");
                self.events.record(ControllerEvent::ScaleDown {
                    object: nref,
                    note: format!(
                        "node removed by scale-down: instance {} of {} deleted",
                        r.victim.instance_id, r.group.name
                    ),
                });
            }
            DeleteEnd::Refused(why) => {
                let text = format!("the instance was not deleted: {why}");
                self.abort(&r, &nref, "refused", &text).await
            }
            DeleteEnd::Stopped(why) => {
                let text = format!("stopped right before the delete: {why}");
                self.abort(&r, &nref, "aborted", &text).await
            }
            DeleteEnd::Failed(why) => {
                let text = format!("deleting the instance failed: {why}");
                self.abort(&r, &nref, "delete_failed", &text).await
            }
            DeleteEnd::Unknown(why) => {
                // The VM may be going away: the node must not take pods. It stays tainted,
                // cordoned and busy until a fresh list says whether the delete happened.
                warn!(node = %r.node, scale_set = %r.group.name, %why, "the delete's outcome is unknown: the node stays tainted until a fresh instance list decides");
                self.count_failed(&r, "unknown");
                self.park(
                    r.node.clone(),
                    Unknown {
                        group: r.group.clone(),
                        victim: r.victim.clone(),
                        tainted: true,
                        reason: r.reason(),
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    fn node(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.cluster.nodes.snapshot().get(name).cloned()
    }

    /// The wall clock, as the decisions read it.
    fn wall(&self) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::from_nanosecond(self.groups.now().unix_timestamp_nanos())
            .unwrap_or_default()
    }

    /// The pods on `node` that a removal has to move (not DaemonSet or mirror pods, nor pods
    /// deleted long ago that no kubelet confirms: [`PodRecord::long_terminating`]).
    fn pods_on(&self, node: &str) -> Vec<Arc<PodRecord>> {
        let now = self.wall();
        self.cluster
            .pods
            .snapshot()
            .values()
            .filter(|p| p.node_name.as_deref() == Some(node))
            .filter(|p| !p.is_daemonset_pod() && !p.is_mirror() && !p.long_terminating(now))
            .cloned()
            .collect()
    }

    /// After the taint: no pod landed that the decision did not see, and the node is still
    /// removable against the cluster as it is now.
    fn recheck(&self, r: &Removal) -> Result<(), String> {
        let Some(node) = self.node(&r.node) else {
            return Err("the node is gone".into());
        };
        let planned: HashSet<&str> = r.pods.iter().map(String::as_str).collect();
        let now_on = self.pods_on(&r.node);
        if let Some(p) = now_on
            .iter()
            .find(|p| !planned.contains(uid_or_key(p).as_str()))
        {
            return Err(format!(
                "pod {} landed on the node after it was chosen",
                pod_name(p)
            ));
        }
        if now_on.is_empty() {
            return Ok(());
        }
        let busy = self.flight.lock().busy.clone();
        let pods = self.cluster.pods.snapshot();
        let now = self.wall();
        let mut by_node: HashMap<&str, Vec<&Arc<PodRecord>>> = HashMap::new();
        for p in pods.values().filter(|p| !p.long_terminating(now)) {
            if let Some(n) = p.node_name.as_deref() {
                by_node.entry(n).or_default().push(p);
            }
        }
        let state = NodeState::from_node(
            &node,
            by_node.get(r.node.as_str()).into_iter().flatten().copied(),
        );
        // Destinations: Ready, schedulable nodes not being removed. The rest (but this node,
        // whose pods are the ones moving) still count for spread and affinity.
        let volumes = self.cluster.storage.volumes_for(state.pods().iter());
        let namespaces = self.cluster.namespace_labels();
        let (others, rest): (Vec<_>, Vec<_>) = self
            .cluster
            .nodes
            .snapshot()
            .values()
            .filter(|n| n.name != r.node)
            .map(|n| {
                let room = !busy.contains(&n.name) && is_ready(n) && schedulable(n);
                let mut state = NodeState::from_node(
                    n,
                    by_node.get(n.name.as_str()).into_iter().flatten().copied(),
                );
                state.set_volume_limits(volumes.limits(&n.name));
                (room, state)
            })
            .partition(|(room, _)| *room);
        let others: Vec<NodeState> = others.into_iter().map(|(_, n)| n).collect();
        let rest: Vec<NodeState> = rest.into_iter().map(|(_, n)| n).collect();
        let pdbs: Vec<_> = self.cluster.pdbs.snapshot().values().cloned().collect();
        let cross_node = state.pods().iter().any(|p| {
            p.facts().has_cross_node_rules()
                || (!volumes.is_empty() && crate::pods::volumes::has_claims(p.spec()))
        }) || others
            .iter()
            .chain(&rest)
            .flat_map(|n| n.pods())
            .any(|p| p.facts().has_remote_anti_affinity());
        let topology = cross_node.then(|| {
            Cluster::new(others.iter().chain(&rest))
                .with_volumes(&volumes)
                .with_namespaces(&namespaces)
        });
        removable(
            &state,
            &node.annotations,
            &others,
            |_| false,
            &pdbs,
            // An unready node's utilisation does not keep it (see `unneeded`), nor does a
            // consolidated node's (its decision had no threshold).
            if r.unready || r.consolidation {
                f64::INFINITY
            } else {
                self.settings.scale_down.utilization_threshold
            },
            topology.as_ref(),
        )
        .map(|_| ())
        .map_err(|b| format!("no longer removable: {b}"))
    }

    /// Evicts the node's pods (a refused eviction is retried until `maxPodEvictionTime`), then
    /// waits, as long again at most, for them to be gone.
    async fn drain(&self, r: &Removal, shutdown: &CancellationToken) -> Result<(), String> {
        let limit = self.settings.scale_down.max_pod_eviction_time;
        let deadline = Instant::now() + limit;
        let mut left: Vec<Arc<PodRecord>> = self.pods_on(&r.node);
        loop {
            if !self.reconciler.may_write() {
                return Err("this replica stopped leading".into());
            }
            let mut refused = Vec::new();
            let mut last = String::new();
            for p in left {
                let (ns, name) = (p.namespace.as_str(), p.name.as_str());
                let outcome = self.actions.evict(ns, name, p.uid.as_deref()).await;
                let label = match &outcome {
                    EvictOutcome::Evicted => "evicted",
                    EvictOutcome::Blocked(_) => "blocked",
                    EvictOutcome::Gone => "gone",
                    EvictOutcome::Failed(_) => "failed",
                };
                self.metrics
                    .evicted_pods_total
                    .with_label_values(&[label])
                    .inc();
                match outcome {
                    EvictOutcome::Evicted => self.events.record(ControllerEvent::ScaleDown {
                        object: pod_ref(&p),
                        note: format!("deleting pod for node scale down (node {})", r.node),
                    }),
                    EvictOutcome::Gone => {}
                    EvictOutcome::Blocked(why) | EvictOutcome::Failed(why) => {
                        last = format!("{}: {why}", pod_name(&p));
                        refused.push(p);
                    }
                }
            }
            if refused.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} pod(s) could not be evicted within maxPodEvictionTime ({}s); last: {last}",
                    refused.len(),
                    limit.as_secs()
                ));
            }
            if !wait(EVICTION_RETRY, shutdown).await {
                return Err("the controller is shutting down".into());
            }
            left = refused;
        }
        let gone_by = Instant::now() + limit;
        loop {
            let still = self.pods_on(&r.node);
            if still.is_empty() {
                return Ok(());
            }
            if Instant::now() >= gone_by {
                return Err(format!(
                    "evicted pods still on the node after {}s (first: {})",
                    limit.as_secs(),
                    pod_name(&still[0])
                ));
            }
            if !wait(GONE_POLL, shutdown).await {
                return Err("the controller is shutting down".into());
            }
        }
    }

    /// A removal that stops: the node is untainted (retried each pass if that fails) and stays.
    async fn abort(&self, r: &Removal, nref: &ObjectRef, label: &'static str, why: &str) {
        warn!(node = %r.node, scale_set = %r.group.name, reason = label, %why, "scale-down stopped; the node stays");
        self.count_failed(r, label);
        self.events.record(ControllerEvent::ScaleDownFailed {
            object: nref.clone(),
            why: format!("scale-down stopped, node untainted: {why}"),
        });
        if !self.untaint(&r.node).await {
            self.flight.lock().untaint.insert(r.node.clone());
        }
    }

    async fn untaint(&self, node: &str) -> bool {
        match self.actions.untaint(node).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                warn!(%node, error = %e, "untaint failed; retrying next pass");
                false
            }
        }
    }

    fn count_failed(&self, r: &Removal, label: &str) {
        self.metrics
            .failed_scale_downs_total
            .with_label_values(&[&r.group.name, label])
            .inc();
    }
}

/// The last look before an unneeded node's instance is deleted: the cluster view is healthy, and
/// the API server itself (not the reflectors) shows the node still carrying our taint and no pod
/// on it but DaemonSet and mirror pods.
struct NodeLook {
    shared: Arc<Shared>,
    /// Every node the delete request removes ([`LastLook::check`] stops the request when one
    /// fails its look; [`LastLook::check_each`] drops only that one).
    nodes: Vec<String>,
}

impl NodeLook {
    async fn check_one(&self, name: &str) -> Result<(), String> {
        let fresh = self
            .shared
            .actions
            .fresh(name)
            .await
            .map_err(|e| format!("the node could not be read fresh: {e}"))?;
        let Some(node) = fresh.node else {
            return Err("the node is gone".into());
        };
        if !has_our_taint_record(&node) {
            return Err("our taint is no longer on the node (somebody removed it)".into());
        }
        // A pod deleted long ago that no kubelet confirms does not hold the node (see
        // `PodRecord::long_terminating`).
        let now = self.shared.wall();
        if let Some(p) = fresh
            .pods
            .iter()
            .find(|p| !p.is_daemonset_pod() && !p.is_mirror() && !p.long_terminating(now))
        {
            return Err(format!("pod {} is on the node", pod_name(p)));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl LastLook for NodeLook {
    /// Node by node: the victims are this look's nodes, in order.
    async fn check_each(&self, victims: &[Victim]) -> Vec<Result<(), String>> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return victims.iter().map(|_| Err(f.to_string())).collect();
        }
        let mut looks = Vec::with_capacity(victims.len());
        for v in victims {
            looks.push(self.check_one(&v.node_name).await);
        }
        looks
    }

    async fn check(&self) -> Result<(), String> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return Err(f.to_string());
        }
        for name in &self.nodes {
            self.check_one(name)
                .await
                .map_err(|why| match self.nodes.len() {
                    1 => why,
                    _ => format!("{name}: {why}"),
                })?;
        }
        Ok(())
    }
}

/// The last look before a spot instance Azure evicted is deleted: a fresh list of the group's
/// instances still shows it stopped (deallocated). Started again by someone, it stays.
struct EvictedLook {
    shared: Arc<Shared>,
    group: NodeGroupSpec,
    instance_id: String,
}

#[async_trait::async_trait]
impl LastLook for EvictedLook {
    async fn check(&self) -> Result<(), String> {
        match self
            .shared
            .groups
            .instance_state(&self.group, &self.instance_id)
            .await
        {
            Ok(Some(i)) if i.deallocated() => Ok(()),
            Ok(Some(i)) => Err(format!(
                "a fresh list shows the instance no longer deallocated (power state {})",
                i.power_state.as_deref().unwrap_or("not given")
            )),
            Ok(None) => Err("a fresh list no longer shows the instance".into()),
            Err(e) => Err(format!("the instances could not be listed fresh: {e}")),
        }
    }
}

/// The last look before an instance that seems never to have registered is deleted: the cluster
/// view is healthy, and a fresh list of every Node from the API server has none for it.
struct UnregisteredLook {
    shared: Arc<Shared>,
    group: DownGroup,
    instance: Instance,
}

#[async_trait::async_trait]
impl LastLook for UnregisteredLook {
    async fn check(&self) -> Result<(), String> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return Err(f.to_string());
        }
        let nodes: Vec<Arc<NodeRecord>> = self
            .shared
            .actions
            .list_nodes()
            .await
            .map_err(|e| format!("the nodes could not be listed fresh: {e}"))?
            .into_iter()
            .map(Arc::new)
            .collect();
        let still = unneeded::unregistered(
            std::slice::from_ref(&self.group),
            &[Some(Arc::new(vec![self.instance.clone()]))],
            &nodes,
        );
        if still.is_empty() {
            return Err("a fresh list of nodes shows a Node for the instance".into());
        }
        Ok(())
    }
}
