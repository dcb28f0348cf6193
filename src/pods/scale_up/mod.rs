//! One scale-up decision for a batch of pending pods: which node groups get how many new nodes.
//! Pure code: the caller hands in snapshots (nodes, pods, DaemonSets, what Azure says each group
//! has) and gets a plan back; no I/O, no clock.
//!
//! The order is cluster-autoscaler's: pods that the room already there can take (free room on
//! Ready nodes, then nodes requested but not registered yet) are taken off first, so a pod is
//! never provisioned twice; then each round asks every healthy group for an estimate, lets the
//! expander pick one, and removes the pods it places, until no group can place more. A pod that
//! no group can take keeps, per group, the reason why.

mod balance;
mod grow;
mod options;
mod room;
mod rounds;
#[cfg(test)]
mod tests;
mod why_not;

pub use balance::{similar, BALANCE_IGNORED_LABELS};
pub use room::group_templates;

use super::demand::DemandPods;
use super::estimate::prepare;
use super::expander::Expander;
use super::fit::NodeState;
use super::index::PodIndex;
use super::record::NodeRecord;
use super::template::GroupShape;
use super::topology::{NamespaceLabels, Topology};
use super::volumes::Volumes;
pub use crate::capacity::QuotaPool;
pub use crate::node_groups::Backing;
use crate::node_groups::GroupIndex;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::Timestamp;
use options::Options;
use room::Census;
use rounds::Rounds;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One node group as the scale-up sees it.
#[derive(Debug, Clone)]
pub struct GroupInput<'a> {
    /// Node-group name.
    pub name: String,
    /// How its nodes are recognised.
    pub backing: Backing,
    /// Bounds.
    pub min: u32,
    /// Bounds.
    pub max: u32,
    /// Capacity Azure reported; `None` (unknown): the group is never planned.
    pub capacity: Option<i64>,
    /// VM size, tags or pool properties, for a template when no node of the group is Ready.
    pub shape: Option<GroupShape<'a>>,
    /// Why the group is not to be grown now (failing to provision, quota cool-down), if so.
    pub unhealthy: Option<WhyNot>,
    /// Instance ids Azure lists in the `Failed` provisioning state: counted in the capacity,
    /// but no node is coming from them (unless one already registered).
    pub failed: Vec<String>,
    /// Instance ids stopped and deallocated (a spot VM evicted with policy `Deallocate`):
    /// counted in the capacity, never on their way, and a Node of theirs is not booting,
    /// whatever its age.
    pub stopped: Vec<String>,
    /// The quota pools (indices into [`ScaleUpInput::quota`]) a new node of the group draws
    /// its vCPUs from; empty: not capped by quota (usages unknown).
    pub quota: Vec<usize>,
    /// vCPUs of one node (the VM size's), when the size is known.
    pub vcpus: Option<u32>,
    /// Workloads ([`PodRecord::workload`](crate::pods::record::PodRecord::workload)) the group is passed over for, with why: an earlier
    /// scale-up of the group for their pods did not help.
    pub passed_over: Arc<BTreeMap<String, String>>,
    /// A node of the group that registered unlike its generated template predicted: the
    /// template when no node of the group is Ready (see [`template_for`](crate::pods::template::template_for)).
    pub learned: Option<Arc<NodeRecord>>,
}

/// Everything one decision looks at.
#[derive(Debug, Clone)]
pub struct ScaleUpInput<'a> {
    /// The node groups.
    pub groups: Vec<GroupInput<'a>>,
    /// Nodes in the cluster.
    pub nodes: Vec<Arc<NodeRecord>>,
    /// Pods not finished, by where they are (the pods reflector keeps the index).
    pub pods: Arc<PodIndex>,
    /// DaemonSets (their pods take room on every new node).
    pub daemonsets: Vec<Arc<DaemonSet>>,
    /// The expander.
    pub expander: Expander,
    /// Where the pods asking for capacity come from: the pending pods
    /// ([`super::demand::PendingPods`], with `expendablePodsPriorityCutoff`), and pods made up
    /// from templates (ProvisioningRequests, their bookings).
    pub sources: Vec<Arc<dyn DemandPods>>,
    /// Seed for the random expander.
    pub seed: u64,
    /// Per group, USD per hour of one new node (the `price` and `least-cost` expanders read
    /// it; a group missing here is one they cannot judge).
    pub prices: Arc<BTreeMap<String, f64>>,
    /// The time of the decision: a node that is not Ready yet counts as on its way (upcoming)
    /// while it is younger than `node_startup`.
    pub now: Timestamp,
    /// How long a registered node may take to turn Ready before it stops counting as upcoming
    /// (`maxNodeProvisionTime`; cluster-autoscaler's `MaxNodeStartupTime` is the same 15 min).
    pub node_startup: std::time::Duration,
    /// What the subscription's vCPU quota leaves, per pool, as last read. Groups draw on it in
    /// the order the expander grows them.
    pub quota: Vec<QuotaPool>,
    /// `balanceSimilarNodeGroups`: split each scale-up across the groups similar to the chosen one.
    pub balance_similar: bool,
    /// The claims, volumes, storage classes and CSI nodes the volume filters read.
    pub volumes: Arc<Volumes>,
    /// Namespaces' labels, for affinity terms that select namespaces by them.
    pub namespaces: Arc<NamespaceLabels>,
}

/// What one decision says.
#[derive(Debug, Clone, Default)]
pub struct ScaleUpPlan {
    /// Per group that grows: the capacity it needs at least (observed capacity + new nodes).
    pub targets: BTreeMap<String, i64>,
    /// Pending pods that asked for capacity.
    pub pending: usize,
    /// Pods a group's new nodes will take: `namespace/name` → group.
    pub triggered: BTreeMap<String, String>,
    /// Pods the room already there takes (free room on nodes, upcoming nodes).
    pub already_provided: Vec<String>,
    /// Pods no group can take, with the reason per group.
    pub unfit: BTreeMap<String, Vec<(String, WhyNot)>>,
    /// Pods whose constraints this planner does not simulate: reported, never planned for.
    pub not_simulated: BTreeMap<String, String>,
    /// Pods waiting for something no new node brings (an unbound claim of an `Immediate`
    /// class, a claim not created yet), with kube-scheduler's words: reported, never planned
    /// for.
    pub waiting: BTreeMap<String, String>,
    /// Groups whose growth quota cut short: group → what it got and which pool ran out. The
    /// pods the cut left over went on to the next group the expander chose.
    pub capped: BTreeMap<String, QuotaCapped>,
    /// Rounds the decision took (one group chosen per round).
    pub rounds: u32,
    /// The template each group in `targets` was planned with (what its new nodes are
    /// predicted to be, DaemonSet pods placed): compared with the nodes that register.
    pub templates: BTreeMap<String, NodeState>,
}

/// A group's growth cut short by quota in one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaCapped {
    /// New nodes the group got.
    pub nodes: u32,
    /// The pool that ran out.
    pub pool: String,
    /// vCPUs that pool had left before this group drew on it.
    pub remaining: i64,
}

impl std::fmt::Display for QuotaCapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "capped at +{} by quota: {} had {} vCPUs left",
            self.nodes, self.pool, self.remaining
        )
    }
}

/// Why a group does not take a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhyNot {
    /// A short, bounded name (the `reason` metric label).
    pub label: &'static str,
    /// In words, for logs and Events.
    pub text: String,
}

impl WhyNot {
    fn new(label: &'static str, text: impl Into<String>) -> Self {
        Self {
            label,
            text: text.into(),
        }
    }
}

impl std::fmt::Display for WhyNot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Which group (index into `groups`) a node belongs to, if any.
pub fn group_of(node: &NodeRecord, groups: &[GroupInput]) -> Option<usize> {
    GroupIndex::of_backings(groups.iter().map(|g| &g.backing)).group_of(node)
}

/// The decision for the pods pending now: step 1, the room already there takes what it can;
/// step 2, rounds of estimate and expander grow groups for the rest; what is left over says, per
/// group, why not.
pub fn plan(input: &ScaleUpInput) -> ScaleUpPlan {
    let mut out = ScaleUpPlan::default();
    let census = Census::of(input);
    let (mut room, elsewhere) = room::node_states(input);
    let asking = room::asking(input, &mut out);
    out.pending = asking.len() + out.not_simulated.len() + out.waiting.len();
    if asking.is_empty() {
        return out;
    }
    let mut pending = prepare(&asking);

    // 1. Room already there: free room on Ready nodes, then upcoming nodes of healthy groups.
    let templates = room::templates(input, &census);
    room::add_upcoming(&mut room, &input.groups, &census, &templates);
    // What other nodes' pods say (spread, affinity), counted over the cluster and the nodes on
    // their way, then followed through the decision.
    let options = Options::of(input, &templates);
    let mut topology = Topology::new(
        &pending,
        room.iter().chain(&elsewhere),
        &options.possible,
        &input.volumes,
        &input.namespaces,
    );
    room::take_room_there(&mut pending, &mut room, &mut topology, &mut out);
    // The spread classes' pods, shared out over the zones the groups that may grow can take
    // them to (a plan the estimates follow, see `Topology::share_out`).
    if !topology.is_empty() {
        topology.share_out(&pending, &options.offers);
    }

    // 2. Rounds of estimate and expander, one group chosen per round.
    let mut rounds = Rounds::new(input, &templates, options::costs(input), topology, pending);
    rounds.run(&mut out);
    rounds.why_not(&mut out);
    out
}
