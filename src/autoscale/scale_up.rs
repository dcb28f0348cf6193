//! `demand: pods`: the I/O around [`crate::pods::scale_up`]. A loop watches the reflected pods,
//! batches a burst of new pending pods (closed after `podBatchIdle` without a new one, at the
//! latest `podBatchMax` after it opened), makes one scale-up decision from snapshots of the
//! cluster and of the scale-set cache, publishes the targets to [`PodDemand`] (the reconciler's
//! [`DemandSource`]) and wakes the reconciler, so a burst makes one write per node group.
//!
//! The decision only raises a floor (`AtLeast`): the write still goes through the reconciler and
//! its ETag protocol, a 412 re-plans from the fresh capacity within the same pass, and no
//! capacity number is ever lowered for pods (a node goes by deleting exactly that instance).
//! A group whose requested nodes do not register within `maxNodeProvisionTime`, or that cools
//! down after a quota refusal, is left out of the next decisions so planning moves to another
//! group that fits.

use super::follow_up::{Finding, FollowUp};
use crate::capacity::prices::{PriceBook, PriceSource, RetailPricesClient};
use crate::config::{DemandKind, NodeGroupSpec, Settings};
use crate::kube::reflect::ClusterView;
use crate::metrics::Metrics;
use crate::node_groups::Unhealthy;
use crate::notify::{ControllerEvent, EventSink, ObjectRef};
use crate::planner::{ConfiguredDemand, Demand, DemandSource, Reason};
use crate::pods::pending::{wants_capacity, Batcher};
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::scale_up::{self, Backing, GroupInput, ScaleUpInput, ScaleUpPlan, WhyNot};
use crate::pods::template::GroupShape;
use crate::reconciler::Reconciler;
use parking_lot::RwLock;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How often the loop looks at the reflected pods (a new snapshot is only read when it changed).
pub const STANDBY_LOOK: Duration = Duration::from_millis(500);

/// Per node group, the capacity pending pods need at least, from the last decision; plus the
/// configured schedules and `desiredCapacity` as a floor.
#[derive(Debug, Default)]
pub struct PodDemand {
    targets: RwLock<Arc<BTreeMap<String, i64>>>,
    /// Consolidation's replace: the capacity a cheaper group is grown to for its replacement
    /// node, while the replace waits for it (set and cleared by the scale-down loop).
    replacements: RwLock<BTreeMap<String, i64>>,
}

impl PodDemand {
    /// Asks for at least `at_least` nodes of `group` for a replacement (`None`: no longer).
    /// The write is the reconciler's, as a scale-up's: `If-Match`, a 412 re-read and re-planned.
    pub fn set_replacement(&self, group: &str, at_least: Option<i64>) {
        let mut r = self.replacements.write();
        match at_least {
            Some(n) => {
                r.insert(group.to_string(), n);
            }
            None => {
                r.remove(group);
            }
        }
    }

    /// The replacements asked for now.
    pub fn replacements(&self) -> BTreeMap<String, i64> {
        self.replacements.read().clone()
    }

    /// The targets of the last decision.
    pub fn targets(&self) -> Arc<BTreeMap<String, i64>> {
        self.targets.read().clone()
    }

    fn publish(&self, targets: BTreeMap<String, i64>) -> bool {
        let mut current = self.targets.write();
        if **current == targets {
            return false;
        }
        *current = Arc::new(targets);
        true
    }
}

impl DemandSource for PodDemand {
    fn demand(&self, group: &NodeGroupSpec, now: OffsetDateTime) -> (Demand, Reason) {
        let pods = self.targets.read().get(&group.name).copied();
        let replacing = self.replacements.read().get(&group.name).copied();
        let pods = match (pods, replacing) {
            (Some(p), Some(r)) => Some(p.max(r)),
            (p, r) => p.or(r),
        };
        let (floor, reason) = ConfiguredDemand.demand(group, now);
        // With pods driving, the configured value is a floor: it never takes nodes away.
        let floor = match floor {
            Demand::Exact(n) | Demand::AtLeast(n) => Some(n),
            Demand::Hold => None,
        };
        match (floor, pods) {
            (Some(f), Some(p)) if p > f => (Demand::AtLeast(p), Reason::PendingPods),
            (Some(f), _) => (Demand::AtLeast(f), reason),
            (None, Some(p)) => (Demand::AtLeast(p), Reason::PendingPods),
            // Nothing asks for nodes: keep at least `min`, and never lower a number (`Hold`
            // would bring a size above `max` down by a PUT, letting Azure pick the instances).
            (None, None) => (Demand::AtLeast(i64::from(group.min_size)), reason),
        }
    }
}

/// The demand source for `settings`: [`PodDemand`] for `demand: pods`, else `None` (the
/// reconciler's default, schedules and `desiredCapacity`).
pub fn demand_source(settings: &Settings) -> Option<Arc<PodDemand>> {
    (settings.pod_demand.kind == DemandKind::Pods).then(|| Arc::new(PodDemand::default()))
}

/// Since when a group has had requested nodes that did not register, with no progress.
#[derive(Debug, Clone, Copy)]
struct Provisioning {
    since: Instant,
    registered: u32,
    /// Out of scale-up until then, after its nodes did not come within `maxNodeProvisionTime`.
    excluded_until: Option<Instant>,
}

/// Groups whose requested nodes do not register within `maxNodeProvisionTime` are out of
/// scale-up for a backoff that expires ([`crate::backoff::GroupBackoff`]). When the backoff
/// ends the group is tried again with a new `maxNodeProvisionTime` to show progress.
#[derive(Debug, Default)]
pub struct ProvisionWatch {
    open: HashMap<String, Provisioning>,
    failures: crate::backoff::GroupBackoff,
}

impl ProvisionWatch {
    /// Records that `group` has `capacity` instances requested and `registered` Nodes at `now`.
    /// `Some(until)` while the group is backed off (`true` the first time, to report it).
    pub fn observe(
        &mut self,
        group: &str,
        capacity: Option<i64>,
        registered: u32,
        limit: Duration,
        now: Instant,
    ) -> Option<(Instant, bool)> {
        let waiting = capacity.is_some_and(|c| c > i64::from(registered));
        if !waiting {
            self.open.remove(group);
            return None;
        }
        let p = self.open.entry(group.to_string()).or_insert(Provisioning {
            since: now,
            registered,
            excluded_until: None,
        });
        if registered > p.registered {
            // Progress: a node came.
            *p = Provisioning {
                since: now,
                registered,
                excluded_until: None,
            };
        }
        match p.excluded_until {
            Some(until) if now < until => Some((until, false)),
            Some(_) => {
                // The backoff is over: a new window to show progress.
                p.since = now;
                p.excluded_until = None;
                None
            }
            None if now.duration_since(p.since) >= limit => {
                let until = self.failures.fail(group, now);
                p.excluded_until = Some(until);
                Some((until, true))
            }
            None => None,
        }
    }
}

/// The taint the cloud node lifecycle controller puts on a NotReady node whose VM the cloud
/// reports shut down (on Azure: stopped or deallocated).
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// What the scale-up loop remembers of a node between looks.
#[derive(Debug, Clone, Copy)]
struct NodeLook {
    ready: bool,
    /// Tainted as shut down ([`SHUTDOWN_TAINT`]).
    shutdown: bool,
}

/// The loop (see the module documentation).
pub struct ScaleUpLoop {
    settings: Arc<Settings>,
    demand: Arc<PodDemand>,
    /// The read side: groups, sizes, instances, refusals.
    groups: Arc<crate::node_groups::NodeGroups>,
    reconciler: Arc<Reconciler>,
    cluster: Arc<ClusterView>,
    metrics: Arc<Metrics>,
    events: Arc<dyn EventSink>,
    batcher: Batcher,
    /// Pending pods seen so far (uid or key), to tell a new one from one already batched.
    seen: HashSet<String>,
    /// Each node of a group seen at the last look, with its group and whether it was Ready (to
    /// notice a node gone, or a spot node stopped).
    node_groups_seen: HashMap<String, (String, NodeLook)>,
    provisioning: ProvisionWatch,
    /// The scale-ups made, followed until their nodes are Ready.
    follow_up: FollowUp,
    /// What each pending pod was last told (Event text), so a re-check does not repeat it.
    told: HashMap<String, String>,
    last_decision: Option<Instant>,
    decisions: u64,
    /// What a node of each group costs (the `price` and `least-cost` expanders, the
    /// `node_group_price_per_hour` gauge).
    prices: Arc<PriceBook>,
    /// Where fresh prices come from: the retail prices API when `prices.fetch` is on and an
    /// expander reads prices; `None`: the embedded list prices and the overrides only.
    price_source: Option<Arc<dyn PriceSource>>,
    /// `enableProvisioningRequests`: the requests, decided with the pending pods.
    provreqs: Option<super::provreq::ProvReqs>,
    /// `capacityBufferControllerEnabled`: the buffers, decided with the pending pods.
    buffers: Option<super::buffer::Buffers>,
    /// The room held for pods that do not exist (bookings, buffers): scale-down reads it.
    held: Arc<super::provreq::Bookings>,
}

impl ScaleUpLoop {
    /// A loop feeding `demand` from `cluster`, waking `reconciler`.
    pub fn new(
        settings: Arc<Settings>,
        demand: Arc<PodDemand>,
        reconciler: Arc<Reconciler>,
        cluster: Arc<ClusterView>,
        metrics: Arc<Metrics>,
        events: Arc<dyn EventSink>,
    ) -> Self {
        let batcher = Batcher::new(
            settings.pod_demand.batch_idle,
            settings.pod_demand.batch_max,
        );
        Self {
            demand,
            groups: reconciler.node_groups().clone(),
            reconciler,
            cluster,
            events,
            batcher,
            seen: HashSet::new(),
            node_groups_seen: HashMap::new(),
            provisioning: ProvisionWatch::default(),
            follow_up: FollowUp::default(),
            told: HashMap::new(),
            last_decision: None,
            decisions: 0,
            provreqs: None,
            buffers: None,
            held: Arc::default(),
            prices: Arc::new(PriceBook::new(
                settings.prices.clone(),
                metrics.price_refresh_failures_total.clone(),
            )),
            price_source: (settings.prices.fetch
                && (settings.pod_demand.expander.uses_prices() || settings.consolidation.enabled))
                .then(|| {
                    Arc::new(RetailPricesClient::new(settings.prices.endpoint.clone()))
                        as Arc<dyn PriceSource>
                }),
            settings,
            metrics,
        }
    }

    /// Takes fresh prices from `source` rather than the configured endpoint (when the prices
    /// are fetched at all: `prices.fetch` on and an expander that reads them).
    pub fn with_price_source(mut self, source: Arc<dyn PriceSource>) -> Self {
        if self.price_source.is_some() {
            self.price_source = Some(source);
        }
        self
    }

    /// The prices this loop decides with.
    pub fn prices(&self) -> Arc<PriceBook> {
        self.prices.clone()
    }

    /// Serves ProvisioningRequests read and written through `store` (`enableProvisioningRequests`).
    pub fn provisioning_requests(
        mut self,
        store: Arc<dyn crate::kube::provreq::ProvReqStore>,
    ) -> Self {
        let mut p = super::provreq::ProvReqs::new(store);
        p.bookings = self.held.clone();
        self.provreqs = Some(p);
        self
    }

    /// Serves CapacityBuffers read and written through `store`
    /// (`capacityBufferControllerEnabled`); `inject` (`capacityBufferPodInjectionEnabled`):
    /// their virtual pods join the decisions.
    pub fn capacity_buffers(
        mut self,
        store: Arc<dyn crate::kube::buffer::BufferStore>,
        inject: bool,
    ) -> Self {
        self.buffers = Some(super::buffer::Buffers::new(store, inject));
        self
    }

    /// The room the requests' bookings and the buffers hold (`None` with neither served).
    pub fn bookings(&self) -> Option<Arc<super::provreq::Bookings>> {
        (self.provreqs.is_some() || self.buffers.is_some()).then(|| self.held.clone())
    }

    /// Runs until `shutdown`. Woken by the cluster changing (any reflector publishing), by the
    /// batch's deadline, and by the re-check due a scan interval after the last decision; a
    /// standby looks again every [`STANDBY_LOOK`] for the leadership it may gain.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // The price refresh lives as long as the loop that reads it, and stops with it.
        let refresh_stop = shutdown.child_token();
        let refresh = self
            .price_source
            .clone()
            .map(|source| tokio::spawn(self.prices.clone().run(source, refresh_stop.clone())));
        self.decide_until(shutdown).await;
        refresh_stop.cancel();
        if let Some(task) = refresh {
            let _ = task.await;
        }
    }

    async fn decide_until(&mut self, shutdown: CancellationToken) {
        let mut changes = self.cluster.changes();
        let mut refusals = self.groups.refusals();
        // Azure refused an allocation since the last decision: decide again now.
        let mut refused = false;
        let mut last_pods: Option<Arc<crate::kube::reflect::Objects<PodRecord>>> = None;
        let mut last_nodes: Option<Arc<crate::kube::reflect::Objects<NodeRecord>>> = None;
        let mut pending_now = 0usize;
        let mut wake_at: Option<Instant> = None;
        loop {
            let sleep = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                Ok(()) = refusals.changed() => refused = true,
                _ = sleep => {}
                _ = shutdown.cancelled() => return,
            }
            wake_at = None;
            if !self.cluster.synced() {
                continue;
            }
            if !self.reconciler.may_write() {
                // A standby decides nothing and tells no pod anything: the leader does. What it
                // has seen is forgotten, so on taking over it starts from the pods as they are.
                last_nodes = None;
                self.node_groups_seen.clear();
                self.follow_up = FollowUp::default();
                if last_pods.take().is_some() {
                    self.seen.clear();
                    self.told.clear();
                    self.batcher.close();
                    self.demand.publish(Default::default());
                }
                wake_at = Some(Instant::now() + STANDBY_LOOK);
                continue;
            }
            let nodes = self.cluster.nodes.snapshot();
            if last_nodes.as_ref().is_none_or(|n| !Arc::ptr_eq(n, &nodes)) {
                // A node gone without a delete of ours in view (a spot eviction, an operator):
                // its group's size as cached still counts the VM, and pods would wait for it as
                // "on its way" until maxNodeProvisionTime. Read the group afresh first.
                let (lost, stopped) = self.lost_nodes(&nodes);
                for group in lost {
                    info!(scale_set = %group, "a node of the group is gone: reading it afresh");
                    self.reconciler.reread(&group, "node_gone").await;
                }
                // A spot node turned NotReady, or the cloud node lifecycle controller tainted it
                // as shut down (it does so for a VM stopped while still booting too): Azure may
                // have evicted its VM with `Deallocate` (the VM stays, stopped). A fresh
                // instance list says so at the reconciler's next pass, and scale-down deletes
                // what it shows deallocated.
                for group in stopped {
                    info!(scale_set = %group, "a spot node of the group turned NotReady: reading it afresh");
                    self.reconciler.reread(&group, "node_not_ready").await;
                    self.reconciler.wake();
                }
                last_nodes = Some(nodes);
            }
            let now = Instant::now();
            let pods = self.cluster.pods.snapshot();
            if last_pods.as_ref().is_none_or(|p| !Arc::ptr_eq(p, &pods)) {
                pending_now = self.note_pending(&pods, now);
                last_pods = Some(pods);
            }
            // ProvisioningRequests are listed every scan interval (sooner after a conflict).
            let mut provreq_due = false;
            if let Some(p) = self.provreqs.as_mut() {
                if p.next_poll.is_none_or(|t| now >= t) {
                    p.refresh().await;
                    p.next_poll = Some(now + self.settings.scan_interval);
                    provreq_due = p.due();
                }
            }
            // So are CapacityBuffers: each look decides them (their status, their room).
            let mut buffer_due = false;
            if let Some(b) = self.buffers.as_mut() {
                if b.next_poll.is_none_or(|t| now >= t) {
                    b.refresh().await;
                    b.next_poll = Some(now + self.settings.scan_interval);
                    buffer_due = b.due();
                }
            }
            let recheck_at = self
                .last_decision
                .map_or(now, |t| t + self.settings.scan_interval);
            let trigger = if self.batcher.ready(now) {
                Some("batch")
            } else if provreq_due && self.batcher.deadline().is_none() {
                Some("provisioning_request")
            } else if buffer_due && self.batcher.deadline().is_none() {
                Some("capacity_buffer")
            } else if refused && pending_now > 0 && self.batcher.deadline().is_none() {
                // The groups planned for are out: their pods go elsewhere in this decision.
                Some("refusal")
            } else if self.batcher.deadline().is_none()
                && (pending_now > 0 || !self.demand.targets().is_empty())
                && now >= recheck_at
            {
                // Pods still pending (nodes on their way, or a group failing), or targets to
                // clear once nothing is pending: look again every scan interval.
                Some("recheck")
            } else {
                None
            };
            if let Some(trigger) = trigger {
                self.batcher.close();
                self.decide(trigger, now);
                refused = false;
                if let Some(p) = self.provreqs.as_mut() {
                    if p.write().await {
                        // Read afresh after a conflict: decide it again soon.
                        p.next_poll = Some(Instant::now() + STANDBY_LOOK);
                    }
                }
                if let Some(b) = self.buffers.as_mut() {
                    if b.write().await {
                        b.next_poll = Some(Instant::now() + STANDBY_LOOK);
                    }
                }
            }
            // The next moment that needs a look without any change in the cluster.
            wake_at = match self.batcher.deadline() {
                Some(deadline) => Some(deadline),
                None if pending_now > 0 || !self.demand.targets().is_empty() => Some(
                    self.last_decision
                        .map_or(now, |t| t + self.settings.scan_interval),
                ),
                None => None,
            };
            let polls = [
                self.provreqs.as_ref().and_then(|p| p.next_poll),
                self.buffers.as_ref().and_then(|b| b.next_poll),
            ];
            for poll in polls.into_iter().flatten() {
                wake_at = Some(wake_at.map_or(poll, |w| w.min(poll)));
            }
        }
    }

    /// The groups that lost a node since the last look, and the spot groups one of whose
    /// nodes turned NotReady or was tainted as shut down (each once, in name order); remembers
    /// the nodes seen now. The first look loses nothing.
    fn lost_nodes(
        &mut self,
        nodes: &crate::kube::reflect::Objects<NodeRecord>,
    ) -> (Vec<String>, Vec<String>) {
        let groups = self.groups.groups();
        let backings: Vec<Backing> = groups.iter().map(|g| self.backing(g)).collect();
        let index = crate::node_groups::GroupIndex::of_backings(&backings);
        let now: HashMap<String, (String, NodeLook)> = nodes
            .values()
            .filter_map(|n| {
                let group = groups[index.group_of(n)?].name.clone();
                let look = NodeLook {
                    ready: n.ready,
                    shutdown: n.taints.iter().any(|t| t.key == SHUTDOWN_TAINT),
                };
                Some((n.name.clone(), (group, look)))
            })
            .collect();
        let lost: BTreeSet<String> = self
            .node_groups_seen
            .iter()
            .filter(|(node, _)| !now.contains_key(*node))
            .map(|(_, (group, _))| group.clone())
            .collect();
        let stopped: BTreeSet<String> = self
            .node_groups_seen
            .iter()
            .filter_map(|(node, (group, was))| {
                let (_, look) = now.get(node)?;
                let turned = (was.ready && !look.ready) || (!was.shutdown && look.shutdown);
                turned.then_some(group)
            })
            .filter(|g| self.groups.offering(g).is_some_and(|o| o.spot))
            .cloned()
            .collect();
        self.node_groups_seen = now;
        (lost.into_iter().collect(), stopped.into_iter().collect())
    }

    /// Records pending pods not seen before (they open or extend the batch); returns how many
    /// pods are pending now.
    fn note_pending(
        &mut self,
        pods: &crate::kube::reflect::Objects<PodRecord>,
        now: Instant,
    ) -> usize {
        let cutoff = self.settings.pod_demand.priority_cutoff;
        let mut current = HashSet::new();
        for pod in pods.values() {
            if !wants_capacity(pod, cutoff) {
                continue;
            }
            let id = pod.uid.clone().unwrap_or_else(|| pod.key());
            if !self.seen.contains(&id) {
                self.batcher.saw_new(now);
            }
            current.insert(id);
        }
        let n = current.len();
        self.seen = current;
        n
    }

    /// One decision: plan, publish, wake the reconciler, tell metrics, logs and pods.
    fn decide(&mut self, trigger: &'static str, now: Instant) {
        let groups = self.groups.groups();
        // The decision's one wall clock (node ages, schedules), read once.
        let wall = self.groups.now();
        let nodes: Vec<_> = self.cluster.nodes.snapshot().values().cloned().collect();
        // The pods by key (to tell each what the decision says) and by where they are.
        let (pod_objects, pods) = self.cluster.pods.snapshot_and_derived();
        let daemonsets: Vec<_> = self
            .cluster
            .daemonsets
            .snapshot()
            .values()
            .cloned()
            .collect();
        let cached: Vec<_> = groups
            .iter()
            .map(|g| self.groups.scale_sets().get(&g.name))
            .collect();
        // The quota pools every group draws from, as last read.
        let offerings: Vec<_> = cached
            .iter()
            .map(|c| c.as_ref().and_then(|c| c.scale_set.offering()))
            .collect();
        let (quota, mut group_pools) = self.groups.quota().pools(&offerings);
        let mut inputs = Vec::with_capacity(groups.len());
        for ((g, cached), pools) in groups.iter().zip(&cached).zip(group_pools.iter_mut()) {
            let capacity = self.groups.target_size(&g.name);
            // Asked once the provisioning watch below has reported its timeouts.
            let unhealthy = None;
            let (failed, stopped) = self
                .groups
                .instances()
                .get(&g.name)
                .map(|l| crate::cache::not_coming(&l))
                .unwrap_or_default();
            inputs.push(GroupInput {
                name: g.name.clone(),
                backing: self.backing(g),
                min: g.min_size,
                max: g.max_size,
                capacity,
                shape: cached.as_ref().map(|c| shape_of(g, &c.scale_set)),
                vcpus: cached
                    .as_ref()
                    .and_then(|c| crate::capacity::vm_size(shape_of(g, &c.scale_set).vm_size))
                    .map(|s| s.vcpu),
                quota: std::mem::take(pools),
                unhealthy,
                failed,
                stopped,
                passed_over: Default::default(),
                learned: None,
            });
        }
        // Requested nodes that never register: the group is failing until one does.
        let registered = crate::node_groups::registered_per_group(
            &nodes,
            inputs.iter().map(|g| (g.name.as_str(), &g.backing)),
        );
        let limit = self.settings.pod_demand.max_node_provision_time;
        let mut backed_off = BTreeMap::new();
        for g in &mut inputs {
            let got = registered.get(&g.name).copied().unwrap_or(0);
            let Some((until, first)) = self
                .provisioning
                .observe(&g.name, g.capacity, got, limit, now)
            else {
                continue;
            };
            backed_off.insert(g.name.clone(), until);
            let backoff = until.saturating_duration_since(now);
            if first {
                warn!(scale_set = %g.name, capacity = ?g.capacity, registered = got, limit_secs = limit.as_secs(), backoff_secs = backoff.as_secs(), "requested nodes did not register within maxNodeProvisionTime: the group is backed off, planning moves to other groups");
                self.metrics
                    .failed_scale_ups_total
                    .with_label_values(&[&g.name, "provision_timeout"])
                    .inc();
            }
        }
        self.groups.set_provision_backoff(&backed_off);
        // Each group's health, in its one precedence: a refusal, an unavailable offering, a
        // write backoff, a provisioning timeout keep it out of this decision.
        for g in &mut inputs {
            g.unhealthy = self.groups.health(&g.name).out_of_scale_up().map(why_not);
        }
        self.decisions += 1;
        let volumes = self.cluster.storage.volumes_if(pods.any_claims());
        // Each group's nodes now: what registered since a scale-up is compared with its plan.
        let mut nodes_of: HashMap<String, Vec<Arc<NodeRecord>>> = HashMap::new();
        {
            let index =
                crate::node_groups::GroupIndex::of_backings(inputs.iter().map(|g| &g.backing));
            for n in &nodes {
                if let Some(i) = index.group_of(n) {
                    nodes_of
                        .entry(inputs[i].name.clone())
                        .or_default()
                        .push(n.clone());
                }
            }
        }
        // Each group's price, decided in one place (override, list price, sentinel).
        let mut prices = BTreeMap::new();
        for g in &inputs {
            let (location, size, spot) = g
                .shape
                .as_ref()
                .map_or(("", "", false), |s| (s.location, s.vm_size, s.profile.spot));
            let price = self.prices.group_price(&g.name, location, size, spot);
            self.metrics
                .node_group_price_per_hour
                .with_label_values(&[&g.name])
                .set(price.per_hour);
            prices.insert(g.name.clone(), price.per_hour);
        }
        let mut input = ScaleUpInput {
            groups: inputs,
            nodes,
            pods,
            daemonsets,
            expander: self.settings.pod_demand.expander.clone(),
            sources: crate::pods::demand::pending_only(self.settings.pod_demand.priority_cutoff),
            seed: self.decisions,
            prices: Arc::new(prices),
            // Nodes' creation times are wall-clock times: so is this.
            now: k8s_openapi::jiff::Timestamp::from_nanosecond(wall.unix_timestamp_nanos())
                .unwrap_or_default(),
            node_startup: limit,
            quota,
            balance_similar: self.settings.pod_demand.balance_similar_node_groups,
            volumes: Arc::new(volumes),
            namespaces: Arc::new(self.cluster.namespace_labels()),
        };
        let findings = self.follow_up.look(&input, &nodes_of, limit, now);
        self.learned(findings, wall);
        for g in &mut input.groups {
            g.passed_over = Arc::new(self.follow_up.passed_over(&g.name, now));
            g.learned = self.groups.learned_template(&g.name);
        }
        let started = std::time::Instant::now();
        // ProvisioningRequests first: an atomic one's groups start the pending pods' decision
        // from their new capacity, and booked pods take room before pending ones.
        let observed: Vec<Option<i64>> = input.groups.iter().map(|g| g.capacity).collect();
        let mut provreq_targets = BTreeMap::new();
        if let Some(p) = self.provreqs.as_mut() {
            let now = input.now;
            let outcome = crate::pods::provreq::decide(&p.requests, &p.templates, &mut input, now);
            if !outcome.targets.is_empty() || !outcome.updates.is_empty() || outcome.deferred > 0 {
                info!(updates = outcome.updates.len(), deferred = outcome.deferred, bookings = outcome.bookings.len(), targets = ?outcome.targets, "ProvisioningRequests decided");
            }
            p.set_bookings(outcome.bookings, outcome.booked.pods.clone());
            input.sources.insert(0, Arc::new(outcome.booked));
            provreq_targets = outcome.targets;
            p.updates = outcome.updates;
        }
        // CapacityBuffers last: their virtual pods are headroom, so the room there goes to the
        // booked and the real pending pods first, and the buffers' pods ask for what is left.
        if let Some(b) = self.buffers.as_mut() {
            let outcome =
                crate::pods::buffer::decide(&b.buffers, &b.referents, b.inject, input.now);
            if !outcome.updates.is_empty() {
                info!(updates = outcome.updates.len(), buffers = ?outcome.buffers, "CapacityBuffers decided");
            }
            self.held.set_buffers(outcome.pods.pods.clone());
            if !outcome.pods.pods.is_empty() {
                input.sources.push(Arc::new(outcome.pods));
            }
            b.updates = outcome.updates;
        }
        let mut plan = scale_up::plan(&input);
        for (g, t) in provreq_targets {
            let e = plan.targets.entry(g).or_insert(t);
            *e = (*e).max(t);
        }
        for (g, c) in input.groups.iter_mut().zip(observed) {
            g.capacity = c;
        }
        self.follow_up.planned(&plan, &nodes_of, now);
        let took = started.elapsed();
        self.metrics
            .scale_up_decision_duration_seconds
            .with_label_values::<&str>(&[])
            .observe(took.as_secs_f64());
        self.metrics
            .scale_up_decisions_total
            .with_label_values(&[trigger])
            .inc();
        self.last_decision = Some(now);
        self.report(&input, &pod_objects, &plan, took);
        // Wake the writer for a new target, and for an unchanged one the group fell below
        // since (a spot eviction, another writer): not a scan interval later.
        let behind = plan
            .targets
            .iter()
            .any(|(g, t)| self.groups.target_size(g).is_some_and(|now| now < *t));
        if (self.demand.publish(plan.targets.clone()) || behind) && !plan.targets.is_empty() {
            self.reconciler.wake();
        }
    }

    /// Acts on what the follow-up of earlier scale-ups found: a template mismatch is counted,
    /// logged, posted as a Warning and kept as the group's template; a scale-up that did not
    /// help is counted and logged, and the group's status says which workloads it is passed
    /// over for (the pods' own `NotTriggerScaleUp` Events say it per pod).
    fn learned(&mut self, findings: Vec<Finding>, wall: OffsetDateTime) {
        let rfc3339 = |t: OffsetDateTime| {
            t.format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        };
        for f in findings {
            match f {
                Finding::Mismatch {
                    group,
                    node,
                    mismatches,
                } => {
                    for m in &mismatches {
                        self.metrics
                            .template_mismatches_total
                            .with_label_values(&[&group, &m.key])
                            .inc();
                    }
                    let said: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
                    warn!(scale_set = %group, node = %node.name, mismatches = %said.join("; "), "a new node registered otherwise than its template predicted: it is the group's template from now on");
                    self.events.record(ControllerEvent::TemplateMismatch {
                        group: group.clone(),
                        node: node.name.clone(),
                        mismatches: said.join("; "),
                    });
                    let status = crate::notify::TemplateMismatchStatus {
                        at: rfc3339(wall),
                        node: node.name.clone(),
                        mismatches: said,
                    };
                    self.groups.learn_template(&group, node, status);
                }
                Finding::NotHelped {
                    group,
                    pods,
                    until,
                    backoff,
                } => {
                    self.metrics
                        .failed_scale_ups_total
                        .with_label_values(&[&group, "did_not_help"])
                        .inc();
                    let mut workloads: Vec<String> =
                        pods.iter().map(|p| p.workload.clone()).collect();
                    workloads.sort();
                    workloads.dedup();
                    let why = pods
                        .first()
                        .map_or_else(String::new, |p| format!("{}: {}", p.pod, p.why));
                    warn!(scale_set = %group, workloads = %workloads.join(", "), why = %why, backoff_secs = backoff.as_secs(), "a scale-up did not help: its new nodes are Ready and cannot take the pods it was for; the group is passed over for them");
                    self.events.record(ControllerEvent::ScaleUpDidNotHelp {
                        group: group.clone(),
                        workloads: workloads.clone(),
                        why: why.clone(),
                        backoff_secs: backoff.as_secs(),
                    });
                    let status = crate::notify::NotHelpedStatus {
                        until: rfc3339(wall + backoff),
                        workloads,
                        why,
                    };
                    self.groups.set_not_helped(&group, Some((until, status)));
                }
                Finding::Helped { group } => self.groups.set_not_helped(&group, None),
            }
        }
    }

    fn backing(&self, g: &NodeGroupSpec) -> Backing {
        crate::node_groups::backing(&self.settings, g)
    }

    /// Metrics, logs and pod Events for one decision.
    fn report(
        &mut self,
        input: &ScaleUpInput,
        by_key: &crate::kube::reflect::Objects<PodRecord>,
        plan: &ScaleUpPlan,
        took: Duration,
    ) {
        let m = &self.metrics;
        let unfit = plan.unfit.len() as i64;
        m.unschedulable_pods_count
            .with_label_values(&["pending"])
            .set(plan.pending as i64);
        m.unschedulable_pods_count
            .with_label_values(&["fits_no_group"])
            .set(unfit);
        m.unschedulable_pods_count
            .with_label_values(&["not_simulated"])
            .set(plan.not_simulated.len() as i64);
        m.unschedulable_pods_count
            .with_label_values(&["waiting_for_volume"])
            .set(plan.waiting.len() as i64);
        m.pods_unfit.reset();
        for reasons in plan.unfit.values() {
            for (group, why) in reasons {
                m.pods_unfit.with_label_values(&[group, why.label]).inc();
            }
        }
        let mut grows = Vec::new();
        for (group, target) in &plan.targets {
            let from = input
                .groups
                .iter()
                .find(|g| &g.name == group)
                .and_then(|g| g.capacity)
                .unwrap_or(0);
            let max = input
                .groups
                .iter()
                .find(|g| &g.name == group)
                .map_or(0, |g| g.max);
            if *target > from {
                m.scaled_up_nodes_total
                    .with_label_values(&[group])
                    .inc_by((*target - from) as u64);
            }
            let capped = plan
                .capped
                .get(group)
                .map(|c| format!(", {c}"))
                .unwrap_or_default();
            grows.push((
                group.clone(),
                format!("{group} {from}->{target} (max: {max}{capped})"),
            ));
        }
        if !plan.targets.is_empty()
            || unfit > 0
            || !plan.not_simulated.is_empty()
            || !plan.waiting.is_empty()
        {
            info!(
                pending = plan.pending,
                already_provided = plan.already_provided.len(),
                fits_no_group = unfit,
                not_simulated = plan.not_simulated.len(),
                waiting_for_volume = plan.waiting.len(),
                scale_ups = ?grows.iter().map(|g| g.1.as_str()).collect::<Vec<_>>(),
                took_ms = took.as_secs_f64() * 1000.0,
                "scale-up decision"
            );
        } else {
            debug!(pending = plan.pending, "scale-up decision: nothing to do");
        }
        let mut told_now = HashMap::new();
        let mut tell = |key: &str, event: ControllerEvent, text: String| {
            if self.told.get(key) != Some(&text) {
                self.events.record(event);
            }
            told_now.insert(key.to_string(), text);
        };
        for (key, group) in &plan.triggered {
            let Some(pod) = by_key.get(key) else { continue };
            let Some(text) = grows.iter().find(|g| &g.0 == group).map(|g| g.1.clone()) else {
                continue;
            };
            tell(
                key,
                ControllerEvent::PodTriggeredScaleUp {
                    pod: pod_ref(pod),
                    groups: text.clone(),
                },
                text,
            );
        }
        for (key, reasons) in &plan.unfit {
            let Some(pod) = by_key.get(key) else { continue };
            let why = if reasons.is_empty() {
                "no node group".to_string()
            } else {
                reasons
                    .iter()
                    .map(|(g, w)| format!("{g}: {w}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            debug!(pod = %key, %why, "pending pod fits no node group");
            tell(
                key,
                ControllerEvent::PodNotTriggeredScaleUp {
                    pod: pod_ref(pod),
                    why: why.clone(),
                },
                why,
            );
        }
        let waiting = plan.waiting.iter().map(|(key, why)| {
            (
                key,
                format!("{why}: waiting for its volume, not for a node; not planned for"),
            )
        });
        let not_simulated = plan.not_simulated.iter().map(|(key, why)| {
            (
                key,
                format!("its {why} is not simulated by this controller; not planned for"),
            )
        });
        for (key, why) in waiting.chain(not_simulated) {
            let Some(pod) = by_key.get(key) else { continue };
            tell(
                key,
                ControllerEvent::PodNotTriggeredScaleUp {
                    pod: pod_ref(pod),
                    why: why.clone(),
                },
                why,
            );
        }
        self.told = told_now;
    }
}

/// What the scale-up decision says of a group out of it.
fn why_not(u: Unhealthy) -> WhyNot {
    WhyNot {
        label: u.label(),
        text: u.to_string(),
    }
}

/// The Event reference of `pod`.
pub(crate) fn pod_ref(pod: &PodRecord) -> ObjectRef {
    ObjectRef {
        api_version: "v1",
        kind: "Pod",
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
    }
}

/// What a group says of its future nodes: the scale set's SKU and tags, or the pool's VM size,
/// labels, taints and max pods.
pub(crate) fn shape_of<'a>(g: &'a NodeGroupSpec, ss: &'a crate::cache::ScaleSet) -> GroupShape<'a> {
    let pool = ss.agent_pool.as_deref();
    let vm_size = pool
        .and_then(|p| p.body.pointer("/properties/vmSize"))
        .and_then(|v| v.as_str())
        .or(ss.sku_name.as_deref())
        .unwrap_or_default();
    GroupShape {
        name: &g.name,
        vm_size,
        tags: ss.tags.clone(),
        node_labels: pool.map(|p| p.node_labels.clone()).unwrap_or_default(),
        node_taints: pool.map(|p| p.node_taints.clone()).unwrap_or_default(),
        max_pods: pool
            .and_then(|p| p.max_pods)
            .and_then(|m| u32::try_from(m).ok()),
        aks_pool: pool.is_some(),
        profile: ss.vm_profile,
        location: &ss.location,
        zones: &ss.zones,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_group_whose_nodes_never_come_is_backed_off_and_tried_again_when_the_backoff_ends() {
        let limit = Duration::from_secs(15 * 60);
        let t0 = Instant::now();
        let mut w = super::ProvisionWatch::default();
        let at = |mins: u64| t0 + Duration::from_secs(mins * 60);
        assert_eq!(w.observe("g", Some(3), 1, limit, at(0)), None);
        assert_eq!(w.observe("g", Some(3), 1, limit, at(14)), None);
        // maxNodeProvisionTime passed with no progress: out for 5 minutes, reported once.
        assert_eq!(
            w.observe("g", Some(3), 1, limit, at(15)),
            Some((at(20), true))
        );
        assert_eq!(
            w.observe("g", Some(3), 1, limit, at(19)),
            Some((at(20), false))
        );
        // Over: the group takes pods again, with a new window.
        assert_eq!(w.observe("g", Some(3), 1, limit, at(20)), None);
        assert_eq!(w.observe("g", Some(3), 1, limit, at(34)), None);
        // Failing again: the backoff doubles.
        assert_eq!(
            w.observe("g", Some(3), 1, limit, at(35)),
            Some((at(45), true))
        );
        // A node came: progress clears the exclusion at once.
        assert_eq!(w.observe("g", Some(3), 2, limit, at(36)), None);
    }

    #[test]
    fn the_provision_backoff_stops_at_thirty_minutes_and_starts_over_after_three_quiet_hours() {
        let limit = Duration::from_secs(60);
        let mut now = Instant::now();
        let mut w = super::ProvisionWatch::default();
        let mut backoffs = Vec::new();
        for _ in 0..5 {
            w.observe("g", Some(2), 0, limit, now);
            now += limit;
            let (until, first) = w.observe("g", Some(2), 0, limit, now).expect("backed off");
            assert!(first);
            backoffs.push((until - now).as_secs() / 60);
            now = until;
            w.observe("g", Some(2), 0, limit, now);
        }
        assert_eq!(backoffs, [5, 10, 20, 30, 30]);
        // Three hours without a failure: the next one is backed off 5 minutes again.
        w.observe("g", Some(0), 0, limit, now);
        now += crate::backoff::RESET;
        w.observe("g", Some(2), 0, limit, now);
        now += limit;
        let (until, _) = w.observe("g", Some(2), 0, limit, now).expect("backed off");
        assert_eq!((until - now).as_secs() / 60, 5);
    }

    use super::*;
    use crate::config::Schedule;

    fn group(desired: Option<u32>) -> NodeGroupSpec {
        NodeGroupSpec {
            name: "general".into(),
            kind: crate::config::NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 0,
            max_size: 10,
            desired_capacity: desired,
            schedules: Vec::<Schedule>::new(),
            max_scale_down_step: None,
        }
    }

    #[test]
    fn without_pending_pods_the_group_holds_and_desired_capacity_is_only_a_floor() {
        let d = PodDemand::default();
        let now = OffsetDateTime::now_utc();
        assert_eq!(d.demand(&group(None), now).0, Demand::AtLeast(0));
        assert_eq!(d.demand(&group(Some(3)), now).0, Demand::AtLeast(3));
    }

    #[test]
    fn a_size_another_writer_set_above_max_is_held_not_lowered_by_a_number() {
        // Lowering the number would let Azure pick which instances go, pods and all; with pods
        // driving, nodes go only by name, through the scale-down's drain.
        let d = PodDemand::default();
        let now = OffsetDateTime::now_utc();
        assert_eq!(crate::planner::target_for(&group(None), 14, &d, now), None);
        d.publish(BTreeMap::from([("general".to_string(), 12)]));
        assert_eq!(
            crate::planner::target_for(&group(Some(3)), 14, &d, now),
            None
        );
        // Below max, pods still raise it, to max at most.
        assert_eq!(
            crate::planner::target_for(&group(None), 8, &d, now).map(|c| c.to),
            Some(10)
        );
    }

    #[test]
    fn a_size_below_min_is_raised_to_min_even_with_nothing_pending() {
        let d = PodDemand::default();
        let now = OffsetDateTime::now_utc();
        let mut g = group(None);
        g.min_size = 2;
        assert_eq!(
            crate::planner::target_for(&g, 0, &d, now).map(|c| c.to),
            Some(2)
        );
    }

    #[test]
    fn pending_pods_raise_the_floor_and_never_lower_it() {
        let d = PodDemand::default();
        let now = OffsetDateTime::now_utc();
        d.publish(BTreeMap::from([("general".to_string(), 5)]));
        assert_eq!(
            d.demand(&group(Some(3)), now),
            (Demand::AtLeast(5), Reason::PendingPods)
        );
        d.publish(BTreeMap::from([("general".to_string(), 2)]));
        assert_eq!(d.demand(&group(Some(3)), now).0, Demand::AtLeast(3));
    }

    #[test]
    fn a_target_is_a_floor_on_a_fresh_capacity_after_a_412_never_a_decrease() {
        let d = PodDemand::default();
        let now = OffsetDateTime::now_utc();
        d.publish(BTreeMap::from([("general".to_string(), 4)]));
        // We planned 2 -> 4; a rival wrote 6 meanwhile: the re-plan keeps 6.
        assert_eq!(crate::planner::target_for(&group(None), 6, &d, now), None);
        // A rival wrote 1: the re-plan still asks for 4.
        assert_eq!(
            crate::planner::target_for(&group(None), 1, &d, now).map(|c| c.to),
            Some(4)
        );
    }
}
