//! `explain`: why the controller would do what it does, for one pod, node or group.
//!
//! One-shot and read-only: it takes what `run` reads (the cluster's nodes, pods, budgets and
//! DaemonSets; the node groups' scale sets and agent pools as Azure shows them), runs the same
//! pure decisions the loops run ([`scale_up::plan`], [`unneeded::unneeded`], [`unneeded::select`])
//! and says what they decide and why, in cluster-autoscaler's words where it has them. It never
//! writes anything and takes no Lease. [`World`] is what it looks at; [`snapshot`] builds one from
//! files (`kubectl get ... -o json`, `az vmss list -o json`), so an operator can ask "what would
//! this controller do on my cluster" with no credentials at all.
//!
//! What only the running controller knows (how long a node has been unneeded, its holds and
//! backoffs, offerings Azure refused lately, its last write and conflict) comes from its status
//! ConfigMap ([`controller`]), read live or from the snapshot, and goes into the same decisions
//! as the loops' own memory does. Without it, `explain` says what it cannot know.

pub mod controller;
pub mod live;
pub mod snapshot;

use crate::cache::ScaleSet;
use crate::config::{NodeGroupSpec, PodDemandSettings, ScaleDownSettings};
use crate::node_groups::{Backing, Unhealthy};
use crate::notify::{ConflictRecord, WriteRecord};
use crate::planner::{ConfiguredDemand, Demand, DemandSource};
use crate::pods::index::PodIndex;
use crate::pods::pending::wants_capacity;
use crate::pods::record::{NodeRecord, PodRecord};
use crate::pods::scale_down::Blocker;
use crate::pods::scale_up::{self, GroupInput, ScaleUpInput, ScaleUpPlan, WhyNot};
use crate::pods::topology::NamespaceLabels;
use crate::pods::unneeded::{self, DownGroup, DownInput, Limits};
use crate::pods::volumes::Volumes;
use controller::ControllerStatus;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// One node group as `explain` sees it: its configuration and the resource as Azure shows it.
#[derive(Debug, Clone)]
pub struct Group {
    /// The node group (bounds, schedules, kind).
    pub spec: NodeGroupSpec,
    /// How its nodes are recognised.
    pub backing: Backing,
    /// The scale set or agent pool as read; `None`: not found.
    pub resource: Option<ScaleSet>,
    /// Its VM instances as listed (`Failed` and deallocated ones bring no node, as the loop
    /// counts them); empty when not read.
    pub instances: Vec<crate::cache::Instance>,
}

/// Everything one explanation looks at.
#[derive(Debug, Clone)]
pub struct World {
    /// The node groups.
    pub groups: Vec<Group>,
    /// Nodes.
    pub nodes: Vec<Arc<NodeRecord>>,
    /// Pods.
    pub pods: Vec<Arc<PodRecord>>,
    /// PodDisruptionBudgets with their status.
    pub pdbs: Vec<Arc<PodDisruptionBudget>>,
    /// DaemonSets (their pods take room on every new node).
    pub daemonsets: Vec<Arc<DaemonSet>>,
    /// Claims, volumes, storage classes and CSI nodes (the volume filters).
    pub volumes: Arc<Volumes>,
    /// Namespaces' labels (affinity terms with a `namespaceSelector`).
    pub namespaces: Arc<NamespaceLabels>,
    /// The regions' compute usages as read (the vCPU quota a scale-up is capped by).
    pub quota: Arc<crate::capacity::QuotaCache>,
    /// `podDemand` settings (expander, priority cutoff, `maxNodeProvisionTime`).
    pub pod_demand: PodDemandSettings,
    /// `scaleDown` settings.
    pub scale_down: ScaleDownSettings,
    /// `consolidation` settings.
    pub consolidation: crate::config::ConsolidationSettings,
    /// `prices` settings: the configured rates over the embedded list prices (explaining fetches
    /// nothing, so a live controller that fetched may price a size a little differently).
    pub prices: crate::config::PriceSettings,
    /// The running controller's status ConfigMap, when one was read.
    pub controller: Option<ControllerStatus>,
    /// Where that status was looked for (`namespace/name`), for saying it was not there.
    pub status_config_map: String,
    /// The time of the decisions.
    pub now: Timestamp,
}

/// What is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// `explain pod NAMESPACE/NAME`.
    Pod(String),
    /// `explain node NAME`.
    Node(String),
    /// `explain group NAME`.
    Group(String),
}

/// An explanation, ready to print as text or JSON. In JSON, `subject` says which one (`pod`,
/// `node`, `group`); `kind` is left to a group's own kind (`vmss`, `aksAgentPool`), as in the
/// configuration. The shape is `docs/explain.schema.json`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "subject", rename_all = "camelCase")]
pub enum Explanation {
    /// For a pod.
    Pod(PodExplanation),
    /// For a node.
    Node(NodeExplanation),
    /// For a node group.
    Group(Box<GroupExplanation>),
}

/// One group's answer for one pod.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GroupVerdict {
    /// Node group.
    pub group: String,
    /// Whether a new node of the group (or room already on its way) would take the pod.
    pub fits: bool,
    /// The reason's short name when it does not (the `pods_unfit` label).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// In words: kube-scheduler's where it has them.
    pub message: String,
}

/// Why a pod does or does not get a node.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodExplanation {
    /// `namespace/name`.
    pub pod: String,
    /// What the decision does for it: `scheduled`, `notPending`, `scaleUp`, `roomOnItsWay`,
    /// `noGroupFits`, `notSimulated`.
    pub outcome: String,
    /// The outcome in words.
    pub summary: String,
    /// The group a scale-up grows for it, and to what size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScaleUpFor>,
    /// Each group's answer for this pod on its own.
    pub groups: Vec<GroupVerdict>,
}

/// A scale-up the decision makes.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleUpFor {
    /// Node group.
    pub group: String,
    /// Its size as read.
    pub from: Option<i64>,
    /// The size the decision asks for.
    pub to: i64,
}

/// Whether a node could go, in cluster-autoscaler's terms.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeExplanation {
    /// Node name.
    pub node: String,
    /// Its node group, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Ready` condition.
    pub ready: bool,
    /// The larger of cpu and memory request utilisation, when simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// Unneeded as of this decision.
    pub unneeded: bool,
    /// Since when the running controller has found it unneeded (its status), if it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unneeded_since: Option<String>,
    /// For how long, in seconds, as of this decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unneeded_for_seconds: Option<u64>,
    /// cluster-autoscaler's unremovable reason (`NotUnneededLongEnough`, `BlockedByPod`, ...), or
    /// `NoReason` when the node would go now had it been unneeded long enough.
    pub reason: String,
    /// For `BlockedByPod`: the pod and cluster-autoscaler's reason for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocking_pod: Option<BlockingPod>,
    /// In words.
    pub summary: String,
    /// With `consolidation.enabled`: whether consolidation would take the node now, and why
    /// not, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<String>,
    /// Since when the controller has kept its soft taint on the node (`PreferNoSchedule`, as a
    /// deletion candidate: new pods prefer other nodes), if it carries one: the taint's value
    /// (unix seconds) as a time, or `unknown` when the value is not one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_tainted_since: Option<String>,
}

/// The pod that keeps a node.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BlockingPod {
    /// `namespace/name`.
    pub pod: String,
    /// cluster-autoscaler's `BlockingPodReason` (`NotSafeToEvictAnnotation`, `NotReplicated`,
    /// `LocalStorageRequested`, `UnmovableKubeSystemPod`, `NotEnoughPdb`).
    pub reason: String,
}

/// A node group as read and as the decisions see it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupExplanation {
    /// Node-group name.
    pub group: String,
    /// `vmss` or `aksAgentPool`.
    pub kind: String,
    /// `minSize`.
    pub min: u32,
    /// `maxSize`.
    pub max: u32,
    /// The lowest size scale-down takes it to (min, schedules and `desiredCapacity`, a System
    /// pool's one node).
    pub floor: u32,
    /// Capacity as read (`None`: not found or not said).
    pub size: Option<i64>,
    /// The ETag as read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// VM size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_size: Option<String>,
    /// Zones (empty: regional).
    pub zones: Vec<String>,
    /// `provisioningState`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Registered nodes, Ready and not.
    pub nodes_ready: u32,
    /// Registered nodes not Ready.
    pub nodes_not_ready: u32,
    /// The size the scale-up decision asks for now, if it grows the group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_up_to: Option<i64>,
    /// Pending pods that decision gives this group's new nodes.
    pub pods_for_it: Vec<String>,
    /// Its nodes unneeded as of this decision.
    pub unneeded_nodes: Vec<String>,
    /// Why it is out of scale-up, if it is (an agent pool AKS's own autoscaler scales).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_scale_up: Option<String>,
    /// The vCPU quota its new nodes draw on, as read: `standardDSv5Family in westeurope: 12
    /// vCPUs left` (empty: the region's usages were not read).
    pub quota: Vec<String>,
    /// The running controller's view of it (its status ConfigMap), when that was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<ControllerView>,
    /// What this explanation could not know about it (no status of a running controller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_known_here: Option<String>,
}

/// A group as the running controller's status shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerView {
    /// The leader that wrote the status.
    pub leader: String,
    /// When it was written (RFC 3339).
    pub written: String,
    /// How long before this explanation, in seconds.
    pub age_seconds: u64,
    /// The size the controller wants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<i64>,
    /// The capacity it last read or wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<i64>,
    /// The ETag it last saw or adopted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Its last write and the result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write: Option<WriteRecord>,
    /// Its last 412 and how that ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_conflict: Option<ConflictRecord>,
    /// Writes by others it has seen.
    pub foreign_writes: u64,
    /// The last new node that registered otherwise than its template predicted (the group's
    /// template since).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_mismatch: Option<crate::notify::TemplateMismatchStatus>,
    /// What holds the group now (offering unavailable, backoffs, held writes, scale-down
    /// halted), each with until when; empty: nothing.
    pub holds: Vec<String>,
}

/// Why asking failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExplainError {
    /// No such pod, node or group.
    #[error("{0}")]
    NotFound(String),
}

/// What `explain` cannot know without the running controller's status.
pub(crate) fn not_known(status_config_map: &str) -> String {
    format!(
        "no status of a running controller was read (ConfigMap {status_config_map}): holds, backoffs, the last write and conflict, offerings Azure refused lately and how long nodes have been unneeded are not applied here"
    )
}

/// A reason the scale-up decision takes, from a group's health.
fn why_not(u: &Unhealthy) -> WhyNot {
    WhyNot {
        label: u.label(),
        text: u.to_string(),
    }
}

impl World {
    fn floor(&self, g: &Group) -> u32 {
        let wall = time::OffsetDateTime::from_unix_timestamp_nanos(self.now.as_nanosecond())
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let demanded = match ConfiguredDemand.demand(&g.spec, wall).0 {
            Demand::Exact(n) | Demand::AtLeast(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            Demand::Hold => 0,
        };
        let system = g
            .resource
            .as_ref()
            .and_then(|r| r.agent_pool.as_ref())
            .is_some_and(|p| p.is_system());
        g.spec.min_size.max(demanded).max(u32::from(system))
    }

    fn refusal(g: &Group) -> Option<WhyNot> {
        let refused = crate::resource::pool_refusal(g.resource.as_ref()?)?;
        Some(why_not(&Unhealthy::Refused(refused)))
    }

    /// Why the group is out of scale-up, as the scale-up loop says: the write refusal read
    /// here, then what the running controller's status says (a refused offering, a write
    /// backoff, a provisioning timeout).
    fn unhealthy(&self, g: &Group) -> Option<WhyNot> {
        Self::refusal(g).or_else(|| {
            self.controller
                .as_ref()?
                .unhealthy(
                    &g.spec.name,
                    self.now,
                    self.pod_demand.max_node_provision_time,
                )
                .as_ref()
                .map(why_not)
        })
    }

    /// The scale-up decision's input, as the scale-up loop builds it from what was read.
    fn scale_up_input<'w>(
        &'w self,
        groups: &[&'w Group],
        pods: Vec<Arc<PodRecord>>,
    ) -> ScaleUpInput<'w> {
        let offerings: Vec<_> = groups
            .iter()
            .map(|g| g.resource.as_ref().and_then(|r| r.offering()))
            .collect();
        let (quota, mut pools) = self.quota.pools(&offerings);
        let inputs: Vec<GroupInput> = groups
            .iter()
            .zip(pools.iter_mut())
            .map(|(g, pools)| {
                let shape = g
                    .resource
                    .as_ref()
                    .map(|r| crate::autoscale::scale_up::shape_of(&g.spec, r));
                GroupInput {
                    name: g.spec.name.clone(),
                    backing: g.backing.clone(),
                    min: g.spec.min_size,
                    max: g.spec.max_size,
                    capacity: g.resource.as_ref().and_then(|r| r.capacity),
                    vcpus: shape
                        .as_ref()
                        .and_then(|s| crate::capacity::vm_size(s.vm_size))
                        .map(|s| s.vcpu),
                    shape,
                    unhealthy: self.unhealthy(g),
                    failed: crate::cache::not_coming(&g.instances).0,
                    stopped: crate::cache::not_coming(&g.instances).1,
                    passed_over: Default::default(),
                    learned: None,
                    quota: std::mem::take(pools),
                }
            })
            .collect();
        // The expanders' prices, decided as the controller decides them.
        let book = crate::capacity::PriceBook::offline(self.prices.clone());
        let prices: std::collections::BTreeMap<String, f64> = inputs
            .iter()
            .map(|g| {
                let (location, size, spot) = g
                    .shape
                    .as_ref()
                    .map_or(("", "", false), |s| (s.location, s.vm_size, s.profile.spot));
                (
                    g.name.clone(),
                    book.group_price(&g.name, location, size, spot).per_hour,
                )
            })
            .collect();
        ScaleUpInput {
            groups: inputs,
            nodes: self.nodes.clone(),
            pods: Arc::new(PodIndex::of(&pods)),
            daemonsets: self.daemonsets.clone(),
            expander: self.pod_demand.expander.clone(),
            sources: crate::pods::demand::pending_only(self.pod_demand.priority_cutoff),
            seed: 1,
            prices: Arc::new(prices),
            now: self.now,
            node_startup: self.pod_demand.max_node_provision_time,
            quota,
            balance_similar: self.pod_demand.balance_similar_node_groups,
            volumes: self.volumes.clone(),
            namespaces: self.namespaces.clone(),
        }
    }

    fn plan(&self) -> ScaleUpPlan {
        let groups: Vec<&Group> = self.groups.iter().collect();
        scale_up::plan(&self.scale_up_input(&groups, self.pods.clone()))
    }

    fn down_groups(&self) -> Vec<DownGroup> {
        // How long ago each group grew, as a fresh status of the running controller says.
        let status = self.fresh_status();
        let mut down: Vec<DownGroup> = self
            .groups
            .iter()
            .map(|g| DownGroup {
                name: g.spec.name.clone(),
                backing: g.backing.clone(),
                floor: self.floor(g),
                size: g.resource.as_ref().and_then(|r| r.capacity),
                deleting: 0,
                recently_grown: false,
                grown_ago: status
                    .and_then(|s| s.last_scale_up(&g.spec.name))
                    .map(|t| Duration::try_from(self.now.duration_since(t)).unwrap_or_default()),
                refused: g
                    .resource
                    .as_ref()
                    .and_then(|r| r.agent_pool.as_ref())
                    .filter(|p| p.enable_auto_scaling)
                    .map(|_| crate::hold::WriteRefusal::AksAutoscaler),
            })
            .collect();
        unneeded::hold_after_add(
            &mut down,
            self.scale_down.delay_after_add,
            self.scale_down.delay_type_local,
        );
        down
    }

    /// `scaleDown.delayAfterAdd`: whether it holds scale-down in `group` now and until when,
    /// from the growth the running controller's status says (`None`: it does not hold).
    fn held_after_add(&self, groups: &[DownGroup], group: &str) -> Option<String> {
        let held = groups
            .iter()
            .find(|g| g.name == group)
            .filter(|g| g.recently_grown)?;
        let d = self.scale_down.delay_after_add;
        let until = held
            .grown_ago
            .and_then(|ago| d.checked_sub(ago))
            .and_then(|left| k8s_openapi::jiff::SignedDuration::try_from(left).ok())
            .and_then(|left| self.now.checked_add(left).ok())?;
        let whose = if self.scale_down.delay_type_local {
            "its group's last scale-up"
        } else {
            "the last scale-up of any group (scaleDown.delayTypeLocal is false)"
        };
        Some(format!(
            "scale-down is held until {until}: scaleDown.delayAfterAdd ({}) after {whose}, as the running controller's status says",
            humantime::format_duration(d)
        ))
    }

    /// The running controller's status, unless too old to say anything of the present.
    fn fresh_status(&self) -> Option<&ControllerStatus> {
        self.controller
            .as_ref()
            .filter(|c| c.age(self.now) <= controller::STALE_AFTER)
    }

    /// The scale-down decision's groups, unready nodes and candidates, as one pass sees them
    /// with nothing in flight and every node simulated (not only the pass's first few).
    fn scale_down(&self) -> (Vec<DownGroup>, HashSet<String>, unneeded::Candidates) {
        let groups = self.down_groups();
        let unready = crate::node_groups::unready_nodes(
            &self.nodes,
            self.now,
            self.pod_demand.max_node_provision_time,
        );
        let none = HashSet::new();
        let candidates = unneeded::unneeded(&DownInput {
            now: self.now,
            groups: &groups,
            nodes: &self.nodes,
            pods: &PodIndex::of(&self.pods),
            pdbs: &self.pdbs,
            threshold: self.scale_down.utilization_threshold,
            busy: &none,
            unready: &unready,
            previously: &none,
            non_empty_candidates: u32::MAX,
            volumes: &self.volumes,
            namespaces: &self.namespaces,
            keep_jobs: self.consolidation.keeps_jobs(),
        });
        (groups, unready, candidates)
    }

    fn group_named(&self, name: &str) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.spec.name.eq_ignore_ascii_case(name))
    }

    fn group_of(&self, node: &NodeRecord) -> Option<&Group> {
        let index =
            crate::node_groups::GroupIndex::of_backings(self.groups.iter().map(|g| &g.backing));
        index.group_of(node).map(|i| &self.groups[i])
    }

    /// Explains `subject`.
    pub fn explain(&self, subject: &Subject) -> Result<Explanation, ExplainError> {
        Ok(match subject {
            Subject::Pod(key) => Explanation::Pod(self.pod(key)?),
            Subject::Node(name) => Explanation::Node(self.node(name)?),
            Subject::Group(name) => Explanation::Group(Box::new(self.group(name)?)),
        })
    }

    /// Why `namespace/name` does or does not get a node.
    pub fn pod(&self, key: &str) -> Result<PodExplanation, ExplainError> {
        let key = if key.contains('/') {
            key.to_string()
        } else {
            format!("default/{key}")
        };
        let pod =
            self.pods.iter().find(|p| p.key() == key).ok_or_else(|| {
                ExplainError::NotFound(format!("pod {key} is not in the cluster"))
            })?;
        let mut out = PodExplanation {
            pod: key.clone(),
            outcome: String::new(),
            summary: String::new(),
            scale_up: None,
            groups: Vec::new(),
        };
        if let Some(node) = pod.node_name.as_deref().filter(|n| !n.is_empty()) {
            out.outcome = "scheduled".into();
            out.summary = format!("bound to node {node}: it needs no new capacity");
            return Ok(out);
        }
        if !wants_capacity(pod, self.pod_demand.priority_cutoff) {
            out.outcome = "notPending".into();
            out.summary = if !pod.unschedulable {
                "kube-scheduler has not marked it unschedulable (PodScheduled=False, reason Unschedulable): it asks for no capacity yet".into()
            } else if let Some(request) = pod.consumes_provisioning_request() {
                format!(
                    "it consumes ProvisioningRequest {}/{request} (autoscaling.x-k8s.io/consume-provisioning-request): its capacity is the request's, booked for it for 10 min once the request is Provisioned, and it never triggers a normal scale-up",
                    pod.namespace
                )
            } else if let Some(n) = &pod.nominated_node {
                format!("kube-scheduler is preempting lower-priority pods on {n} for it: room is being made")
            } else if pod.is_daemonset_pod() {
                "a DaemonSet pod: new nodes are not made for it".into()
            } else {
                format!(
                    "its priority {} is below expendablePodsPriorityCutoff ({}): cluster-autoscaler's expendable pods never trigger a scale-up",
                    pod.priority(),
                    self.pod_demand.priority_cutoff
                )
            };
            return Ok(out);
        }
        // Each group on its own, for this pod alone (every pod that is not pending stays).
        let others: Vec<Arc<PodRecord>> = self
            .pods
            .iter()
            .filter(|p| p.key() == key || !wants_capacity(p, self.pod_demand.priority_cutoff))
            .cloned()
            .collect();
        for g in &self.groups {
            let plan = scale_up::plan(&self.scale_up_input(&[g], others.clone()));
            out.groups.push(verdict_of(&g.spec.name, &key, &plan));
        }
        // The whole decision, with every pending pod, as the loop makes it.
        let plan = self.plan();
        if let Some(group) = plan.triggered.get(&key) {
            let from = self
                .group_named(group)
                .and_then(|g| g.resource.as_ref())
                .and_then(|r| r.capacity);
            let to = plan.targets.get(group).copied().unwrap_or_default();
            out.outcome = "scaleUp".into();
            out.summary = format!(
                "a scale-up of {group} from {} to {to} gives it a node ({} expander)",
                from.map_or("?".into(), |f| f.to_string()),
                expander_name(&self.pod_demand.expander)
            );
            out.scale_up = Some(ScaleUpFor {
                group: group.clone(),
                from,
                to,
            });
        } else if plan.already_provided.contains(&key) {
            out.outcome = "roomOnItsWay".into();
            out.summary = "room for it is already there or on its way (free room on a node kube-scheduler has not used yet, or a node that registered and is not Ready yet): no scale-up".into();
        } else if let Some(why) = plan.waiting.get(&key) {
            out.outcome = "waitingForVolume".into();
            out.summary = format!("{why}: waiting for its volume, not for a node; not planned for");
        } else if let Some(why) = plan.not_simulated.get(&key) {
            out.outcome = "notSimulated".into();
            out.summary = format!("not planned for: {why}");
        } else {
            out.outcome = "noGroupFits".into();
            out.summary = match plan.unfit.get(&key) {
                Some(reasons) if !reasons.is_empty() => format!(
                    "pod didn't trigger scale-up: {}",
                    reasons
                        .iter()
                        .map(|(g, w)| format!("{g}: {w}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                _ => "pod didn't trigger scale-up: no node group".into(),
            };
        }
        Ok(out)
    }

    /// Whether node `name` could go, and why not: by scale-down, and by consolidation when it is
    /// on.
    pub fn node(&self, name: &str) -> Result<NodeExplanation, ExplainError> {
        let mut out = self.node_scale_down(name)?;
        if out.group.is_some() && self.consolidation.enabled {
            out.consolidation = Some(self.consolidation_of(name));
        }
        Ok(out)
    }

    /// What consolidation decides of node `name` in this view, as if nothing else were being
    /// removed and every node's pods had been as they are for `consolidateAfter` (what only the
    /// running controller knows); `emptyFirst` counts from each node's soft taint.
    fn consolidation_of(&self, name: &str) -> String {
        use crate::pods::consolidate::{
            decide, Action, ConsolidationInput, ReplaceOption, Unconsolidatable,
        };
        let groups = self.down_groups();
        let all: Vec<&Group> = self.groups.iter().collect();
        let up = self.scale_up_input(&all, self.pods.clone());
        let priced = up.prices.clone();
        let prices: Vec<f64> = groups
            .iter()
            .map(|g| priced.get(&g.name).copied().unwrap_or(0.0))
            .collect();
        let unready = crate::node_groups::unready_nodes(
            &self.nodes,
            self.now,
            self.pod_demand.max_node_provision_time,
        );
        let none = HashSet::new();
        let pods = PodIndex::of(&self.pods);
        // The budgets active at the view's time (schedules are UTC windows).
        let at = time::OffsetDateTime::from_unix_timestamp(self.now.as_second())
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let active = self.consolidation.active_at(at);
        // `emptyFirst`: the running controller times it from when it hinted a node, and it
        // soft-taints the nodes it hints; the soft taint's date stands in for that time here.
        let empty_first = self.consolidation.empty_first;
        let ripe: Option<HashSet<String>> = (!empty_first.is_zero()).then(|| {
            self.nodes
                .iter()
                .filter(|n| {
                    soft_taint_time(n).is_some_and(|t| {
                        self.now
                            .duration_since(t)
                            .try_into()
                            .is_ok_and(|age: std::time::Duration| age >= empty_first)
                    })
                })
                .map(|n| n.name.clone())
                .collect()
        });
        let input = ConsolidationInput {
            down: DownInput {
                now: self.now,
                groups: &groups,
                nodes: &self.nodes,
                pods: &pods,
                pdbs: &self.pdbs,
                threshold: self.scale_down.utilization_threshold,
                busy: &none,
                unready: &unready,
                previously: &none,
                non_empty_candidates: u32::MAX,
                volumes: &self.volumes,
                namespaces: &self.namespaces,
                keep_jobs: self.consolidation.keeps_jobs(),
            },
            prices: &prices,
            chosen: &none,
            unsettled: &none,
            settings: &active,
            max_nodes: self.scale_down.max_scale_down_per_pass,
            // One snapshot has no history: neither `consolidateAfter` nor
            // `stabilizationWindow` can be judged from it.
            demand_rising: false,
            ripe: ripe.as_ref(),
        };
        // A replacement may come from a group that may grow now: a new node as the scale-up's
        // planner imagines it.
        let index = crate::node_groups::GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
        let mut live: Vec<Option<&crate::pods::record::NodeRecord>> = vec![None; groups.len()];
        for n in &self.nodes {
            if let Some(i) = index.group_of(n) {
                if live[i].is_none()
                    && crate::node_groups::is_ready(n)
                    && crate::node_groups::schedulable(n)
                {
                    live[i] = Some(n);
                }
            }
        }
        let templates =
            crate::pods::scale_up::group_templates(&up.groups, &live, &up.daemonsets, &up.volumes);
        let options: Vec<ReplaceOption> = up
            .groups
            .iter()
            .zip(templates)
            .enumerate()
            .filter_map(|(i, (g, t))| {
                let grows = g.capacity.is_some_and(|n| n < i64::from(g.max));
                let healthy =
                    g.unhealthy.is_none() && groups.get(i).is_some_and(|d| d.refused.is_none());
                (grows && healthy).then_some(())?;
                Some(ReplaceOption {
                    group: i,
                    template: t.ok()?,
                    price: prices.get(i).copied().unwrap_or(f64::INFINITY),
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + self.consolidation.timeout;
        let found = decide(&input, &options, &mut || {
            std::time::Instant::now() >= deadline
        });
        if let Some(c) = found
            .command
            .as_ref()
            .filter(|c| c.nodes.iter().any(|n| n.node == name))
        {
            if let Action::Replace { group, price } = c.action {
                return format!(
                    "consolidated by a replace: goes with {} node(s) in all once one new node of {} (${price:.3}/h) that takes their pods is Ready, saving ${:.3}/h, if the decision holds on re-validation (consolidation.validationDelay, {}) and again on the new node",
                    c.nodes.len(),
                    groups.get(group).map_or("?", |g| g.name.as_str()),
                    c.savings_per_hour,
                    humantime::format_duration(self.consolidation.validation_delay)
                );
            }
            return format!(
                "consolidated: goes with {} node(s) in all, saving ${:.3}/h, once the decision holds on re-validation (consolidation.validationDelay, {})",
                c.nodes.len(),
                c.savings_per_hour,
                humantime::format_duration(self.consolidation.validation_delay)
            );
        }
        match found.unconsolidatable.get(name) {
            Some(why @ Unconsolidatable::Emptying) => {
                let ripe_at = self
                    .nodes
                    .iter()
                    .find(|n| n.name == name)
                    .and_then(|n| soft_taint_time(n))
                    .and_then(|t| {
                        t.checked_add(k8s_openapi::jiff::SignedDuration::try_from(empty_first).ok()?)
                            .ok()
                    });
                match ripe_at {
                    Some(at) => format!(
                        "not consolidated: {why}; soft-tainted long enough at {at} (consolidation.emptyFirst, {})",
                        humantime::format_duration(empty_first)
                    ),
                    None => format!(
                        "not consolidated: {why}; it is not soft-tainted yet, and consolidation.emptyFirst ({}) counts from when the running controller hints and soft-taints it",
                        humantime::format_duration(empty_first)
                    ),
                }
            }
            Some(why) => format!("not consolidated: {why}"),
            None => "not a consolidation candidate (not Ready, cordoned, or not Ready past its startup window)".into(),
        }
    }

    fn node_scale_down(&self, name: &str) -> Result<NodeExplanation, ExplainError> {
        let node =
            self.nodes.iter().find(|n| n.name == name).ok_or_else(|| {
                ExplainError::NotFound(format!("node {name} is not in the cluster"))
            })?;
        let mut out = NodeExplanation {
            node: name.into(),
            group: None,
            ready: node.ready,
            utilization: None,
            unneeded: false,
            unneeded_since: None,
            unneeded_for_seconds: None,
            reason: String::new(),
            blocking_pod: None,
            summary: String::new(),
            consolidation: None,
            soft_tainted_since: soft_tainted_since(node),
        };
        let Some(group) = self.group_of(node) else {
            out.reason = "NotAutoscaled".into();
            out.summary = "it belongs to no node group this controller manages".into();
            return Ok(out);
        };
        out.group = Some(group.spec.name.clone());
        let (groups, unready, candidates) = self.scale_down();
        if let Some(b) = candidates.blocked.get(name) {
            let (reason, pod) = ca_reason(b);
            out.reason = reason.into();
            out.blocking_pod = pod;
            if let Blocker::Utilized(pct) = b {
                out.utilization = Some(f64::from(*pct) / 100.0);
            }
            out.summary = format!("stays: {b}");
            return Ok(out);
        }
        let Some(u) = candidates.unneeded.iter().find(|u| u.node == name) else {
            out.reason = "NotUnneededOtherReason".into();
            out.summary = if group_refused(group) {
                "its group is an agent pool AKS's own autoscaler scales: this controller removes none of its nodes".into()
            } else if !node.ready && !unready.contains(name) {
                "not Ready yet and still within its startup window (maxNodeProvisionTime): not a candidate".into()
            } else {
                "not a candidate in this pass (being deleted, or marked by another scale-down)"
                    .into()
            };
            return Ok(out);
        };
        out.unneeded = true;
        out.utilization = Some(u.utilization);
        let limits = Limits {
            unneeded_time: self.scale_down.unneeded_time,
            unready_time: self.scale_down.unready_time,
            max_empty_bulk_delete: self.scale_down.max_empty_bulk_delete,
            max_per_pass: self.scale_down.max_scale_down_per_pass,
            draining: false,
            balance: self.pod_demand.balance_similar_node_groups,
        };
        let wait = self
            .scale_down
            .unneeded_time
            .max(self.scale_down.unready_time)
            + Duration::from_secs(1);
        // How long each candidate has been unneeded: as the running controller's status says
        // (a node it does not list: not yet), or, without it (or with one too old to say),
        // long enough.
        let status = self.fresh_status();
        let unneeded_for: HashMap<String, Duration> = candidates
            .unneeded
            .iter()
            .map(|c| {
                let d = match status {
                    Some(status) => status
                        .unneeded_since(&c.node)
                        .map(|t| Duration::try_from(self.now.duration_since(t)).unwrap_or_default())
                        .unwrap_or_default(),
                    None => wait,
                };
                (c.node.clone(), d)
            })
            .collect();
        // The decision on a monotonic clock far enough ahead that every "since" is after its
        // origin.
        let horizon = unneeded_for
            .values()
            .copied()
            .max()
            .unwrap_or_default()
            .max(wait);
        let now = tokio::time::Instant::now() + horizon;
        let since_of = |d: &HashMap<String, Duration>| -> HashMap<String, tokio::time::Instant> {
            d.iter().map(|(n, d)| (n.clone(), now - *d)).collect()
        };
        let (_, waiting) =
            unneeded::select(&candidates, &groups, &since_of(&unneeded_for), now, limits);
        // And had every candidate been unneeded long enough: what would hold it then?
        let long: HashMap<String, Duration> =
            unneeded_for.keys().map(|n| (n.clone(), wait)).collect();
        let (_, waiting_then) =
            unneeded::select(&candidates, &groups, &since_of(&long), now, limits);
        let what = if u.unready {
            format!(
                "not Ready past its startup window: removed once it has been so for scaleDown.unreadyTime ({})",
                humantime::format_duration(self.scale_down.unready_time)
            )
        } else if u.is_empty() {
            format!(
                "empty (utilization {:.0}%): removed once unneeded for scaleDown.unneededTime ({})",
                u.utilization * 100.0,
                humantime::format_duration(self.scale_down.unneeded_time)
            )
        } else {
            format!(
                "unneeded: utilization {:.0}% is below scaleDown.utilizationThreshold ({:.0}%) and its {} pod(s) fit elsewhere; drained and removed once unneeded for scaleDown.unneededTime ({})",
                u.utilization * 100.0,
                self.scale_down.utilization_threshold * 100.0,
                u.pods.len(),
                humantime::format_duration(self.scale_down.unneeded_time)
            )
        };
        let long_enough = if u.unready {
            "NotUnreadyLongEnough"
        } else {
            "NotUnneededLongEnough"
        };
        let held_after_add = self
            .held_after_add(&groups, &group.spec.name)
            .unwrap_or_else(|| "scale-down is held for scaleDown.delayAfterAdd".into());
        let hold = |w: &str| -> (&'static str, String) {
            match w {
                "min_size" => (
                    "NodeGroupMinSizeReached",
                    format!(
                        "{} is at its floor ({}): it stays",
                        group.spec.name,
                        self.floor(group)
                    ),
                ),
                "unknown_size" => (
                    "NoNodeInfo",
                    format!(
                        "the size of {} is unknown: nothing of it goes",
                        group.spec.name
                    ),
                ),
                "delay_after_add" => ("ScaleDownInCooldown", held_after_add.clone()),
                other => (long_enough, format!("it waits its turn ({other})")),
            }
        };
        let Some(status) = status else {
            let (reason, summary) = match waiting_then.get(name) {
                Some(w) => {
                    let (reason, then) = hold(w);
                    (reason, format!("{what}; but {then}"))
                }
                None => (
                    long_enough,
                    format!(
                        "{what}. How long it has been is known to the running controller only, and no recent status of it was read (ConfigMap {})",
                        self.status_config_map
                    ),
                ),
            };
            out.reason = reason.into();
            out.summary = summary;
            return Ok(out);
        };
        let since = status.unneeded_since(name);
        let d = unneeded_for.get(name).copied().unwrap_or_default();
        out.unneeded_since = since.map(|t| t.to_string());
        out.unneeded_for_seconds = since.map(|_| d.as_secs());
        let counted = match since {
            Some(t) => format!(
                "unneeded for {} (since {t}, as the running controller counts)",
                humantime::format_duration(Duration::from_secs(d.as_secs()))
            ),
            None if status.unneeded_list_full(&group.spec.name) => format!(
                "the running controller's status lists only the first {} unneeded nodes of {}: how long is not known",
                crate::notify::UNNEEDED_LISTED,
                group.spec.name
            ),
            None => "the running controller has not found it unneeded yet".to_string(),
        };
        let (reason, summary) = match waiting.get(name) {
            Some(&("unneeded_time" | "unready_time")) => {
                let then = waiting_then
                    .get(name)
                    .map(|w| format!("; after that, {}", hold(w).1))
                    .unwrap_or_else(|| "; then the next scale-down pass removes it".into());
                (long_enough, format!("{what}; {counted}{then}"))
            }
            Some(w) => {
                let (reason, then) = hold(w);
                (reason, format!("{what}; {counted}; but {then}"))
            }
            None => (
                "NoReason",
                format!("{what}; {counted}: the next scale-down pass removes it"),
            ),
        };
        out.reason = reason.into();
        out.summary = summary;
        Ok(out)
    }

    /// A node group as read and as the decisions see it.
    pub fn group(&self, name: &str) -> Result<GroupExplanation, ExplainError> {
        let g = self.group_named(name).ok_or_else(|| {
            ExplainError::NotFound(format!(
                "node group {name} is not configured or discovered (groups: {})",
                self.groups
                    .iter()
                    .map(|g| g.spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let plan = self.plan();
        let index = crate::node_groups::GroupIndex::of_backings(std::iter::once(&g.backing));
        let mine: Vec<&Arc<NodeRecord>> = self
            .nodes
            .iter()
            .filter(|n| index.group_of(n).is_some())
            .collect();
        let ready = mine.iter().filter(|n| n.ready).count() as u32;
        let (groups, _, candidates) = self.scale_down();
        let r = g.resource.as_ref();
        Ok(GroupExplanation {
            group: g.spec.name.clone(),
            kind: g.spec.kind.as_str().into(),
            min: g.spec.min_size,
            max: g.spec.max_size,
            floor: self.floor(g),
            size: r.and_then(|r| r.capacity),
            etag: r.and_then(|r| r.etag.clone()),
            vm_size: r.map(|r| {
                crate::autoscale::scale_up::shape_of(&g.spec, r)
                    .vm_size
                    .to_string()
            }),
            zones: r.map(|r| r.zones.clone()).unwrap_or_default(),
            provisioning_state: r.and_then(|r| r.provisioning_state.clone()),
            nodes_ready: ready,
            nodes_not_ready: mine.len() as u32 - ready,
            scale_up_to: plan.targets.get(&g.spec.name).copied(),
            pods_for_it: plan
                .triggered
                .iter()
                .filter(|(_, grp)| **grp == g.spec.name)
                .map(|(p, _)| p.clone())
                .collect(),
            unneeded_nodes: candidates
                .unneeded
                .iter()
                .filter(|u| groups[u.group].name == g.spec.name)
                .map(|u| u.node.clone())
                .collect(),
            out_of_scale_up: if r.is_none() {
                Some("not found in Azure: never planned".into())
            } else {
                self.unhealthy(g).map(|w| w.text)
            },
            quota: {
                let offering = r.and_then(|r| r.offering());
                let (pools, _) = self.quota.pools(std::slice::from_ref(&offering));
                pools
                    .iter()
                    .map(|p| format!("{p}: {} vCPUs left", p.remaining))
                    .collect()
            },
            controller: self.controller.as_ref().and_then(|c| {
                let s = c.group(&g.spec.name)?;
                Some(ControllerView {
                    leader: c.leader.clone(),
                    written: c.written.to_string(),
                    age_seconds: c.age(self.now).as_secs(),
                    target: s.target,
                    capacity: s.capacity,
                    etag: s.etag.clone(),
                    last_write: s.last_write.clone(),
                    last_conflict: s.last_conflict.clone(),
                    foreign_writes: s.foreign_writes,
                    template_mismatch: s.template_mismatch.clone(),
                    holds: c
                        .holds(&g.spec.name, self.now)
                        .into_iter()
                        .chain(self.held_after_add(&groups, &g.spec.name))
                        .collect(),
                })
            }),
            not_known_here: match &self.controller {
                None => Some(not_known(&self.status_config_map)),
                Some(c) if c.group(&g.spec.name).is_none() => Some(format!(
                    "the running controller's status ({}) has no group {}: it does not manage it",
                    c.source, g.spec.name
                )),
                Some(_) => None,
            },
        })
    }
}

fn group_refused(g: &Group) -> bool {
    World::refusal(g).is_some()
}

/// `items` joined by commas, or `empty` when there are none.
fn joined_or(items: &[String], empty: &str) -> String {
    if items.is_empty() {
        empty.to_string()
    } else {
        items.join(", ")
    }
}

/// The expander as `podDemand.expander` names it.
fn expander_name(e: &crate::pods::expander::Expander) -> String {
    e.name()
}

/// A group's verdict for `key` from a decision made with that group alone.
fn verdict_of(group: &str, key: &str, plan: &ScaleUpPlan) -> GroupVerdict {
    let (fits, reason, message) = if plan.triggered.contains_key(key) {
        (true, None, "fits a new node".to_string())
    } else if plan.already_provided.iter().any(|p| p == key) {
        (
            true,
            None,
            "fits room already there or on its way".to_string(),
        )
    } else if let Some(why) = plan.waiting.get(key) {
        (false, Some("waiting_for_volume".to_string()), why.clone())
    } else if let Some(why) = plan.not_simulated.get(key) {
        (false, Some("not_simulated".to_string()), why.clone())
    } else if let Some(w) = plan
        .unfit
        .get(key)
        .and_then(|r| r.iter().find(|(g, _)| g == group))
    {
        (false, Some(w.1.label.to_string()), w.1.text.clone())
    } else {
        (false, Some("unknown".into()), "no verdict".into())
    };
    GroupVerdict {
        group: group.into(),
        fits,
        reason,
        message,
    }
}

/// cluster-autoscaler's unremovable reason (and blocking pod) for a blocker.
fn ca_reason(b: &Blocker) -> (&'static str, Option<BlockingPod>) {
    let pod = |p: &String, reason: &str| {
        Some(BlockingPod {
            pod: p.clone(),
            reason: reason.into(),
        })
    };
    match b {
        Blocker::ScaleDownDisabled => ("ScaleDownDisabledAnnotation", None),
        Blocker::NotSafeToEvict(p) => ("BlockedByPod", pod(p, "NotSafeToEvictAnnotation")),
        Blocker::NotReplicated(p) => ("BlockedByPod", pod(p, "NotReplicated")),
        Blocker::KubeSystemWithoutPdb(p) => ("BlockedByPod", pod(p, "UnmovableKubeSystemPod")),
        Blocker::LocalStorage(p) => ("BlockedByPod", pod(p, "LocalStorageRequested")),
        Blocker::PdbViolated { pdb } => (
            "BlockedByPod",
            Some(BlockingPod {
                pod: format!("(covered by PodDisruptionBudget {pdb})"),
                reason: "NotEnoughPdb".into(),
            }),
        ),
        Blocker::Utilized(_) => ("NotUnderutilized", None),
        Blocker::NoPlaceFor(_) => ("NoPlaceToMovePods", None),
        // Not one of cluster-autoscaler's: this controller's own (`consolidation.disruptJobs`).
        Blocker::RunsToCompletion(p) => ("BlockedByPod", pod(p, "RunsToCompletion")),
    }
}

impl Explanation {
    /// The explanation as a person reads it.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        match self {
            Explanation::Pod(p) => {
                let _ = writeln!(s, "pod {}: {}", p.pod, p.summary);
                if !p.groups.is_empty() {
                    let _ = writeln!(s, "each node group, for this pod alone:");
                    let width = p.groups.iter().map(|g| g.group.len()).max().unwrap_or(0);
                    for g in &p.groups {
                        let _ = writeln!(
                            s,
                            "  {:<width$}  {}  {}",
                            g.group,
                            if g.fits { "fits" } else { "no  " },
                            g.message
                        );
                    }
                }
            }
            Explanation::Node(n) => {
                let _ = writeln!(
                    s,
                    "node {} (group {}, {}{}): {}",
                    n.node,
                    n.group.as_deref().unwrap_or("none"),
                    if n.ready { "Ready" } else { "NotReady" },
                    n.utilization
                        .map(|u| format!(", utilization {:.0}%", u * 100.0))
                        .unwrap_or_default(),
                    n.reason
                );
                let _ = writeln!(s, "  {}", n.summary);
                if let Some(b) = &n.blocking_pod {
                    let _ = writeln!(s, "  blocking pod: {} ({})", b.pod, b.reason);
                }
                if let Some(c) = &n.consolidation {
                    let _ = writeln!(s, "  consolidation: {c}");
                }
                if let Some(t) = &n.soft_tainted_since {
                    let _ = writeln!(
                        s,
                        "  soft-tainted as a deletion candidate since {t} ({}:PreferNoSchedule): new pods prefer other nodes",
                        crate::kube::nodes::DELETION_CANDIDATE_TAINT
                    );
                }
            }
            Explanation::Group(g) => {
                let _ = writeln!(
                    s,
                    "group {} ({}): size {}, min {}, max {}, floor {}",
                    g.group,
                    g.kind,
                    g.size.map_or("unknown".into(), |v| v.to_string()),
                    g.min,
                    g.max,
                    g.floor
                );
                let _ = writeln!(
                    s,
                    "  {} Ready, {} not Ready; VM size {}; zones {}; state {}; ETag {}",
                    g.nodes_ready,
                    g.nodes_not_ready,
                    g.vm_size.as_deref().unwrap_or("-"),
                    if g.zones.is_empty() {
                        "regional".into()
                    } else {
                        g.zones.join(",")
                    },
                    g.provisioning_state.as_deref().unwrap_or("-"),
                    g.etag.as_deref().unwrap_or("-")
                );
                match g.scale_up_to {
                    Some(t) => {
                        let _ = writeln!(
                            s,
                            "  scale-up: to {t} for {} pending pod(s): {}",
                            g.pods_for_it.len(),
                            g.pods_for_it.join(", ")
                        );
                    }
                    None => {
                        let _ = writeln!(s, "  scale-up: none");
                    }
                }
                if let Some(o) = &g.out_of_scale_up {
                    let _ = writeln!(s, "  out of scale-up: {o}");
                }
                let _ = writeln!(
                    s,
                    "  quota: {}",
                    joined_or(
                        &g.quota,
                        "not read (no usages for its region: not capped here)"
                    )
                );
                let _ = writeln!(
                    s,
                    "  unneeded nodes: {}",
                    joined_or(&g.unneeded_nodes, "none")
                );
                if let Some(c) = &g.controller {
                    let _ = writeln!(
                        s,
                        "  the running controller (leader {}, status written {} ago): target {}, capacity {}, ETag {}, {} write(s) by others seen",
                        c.leader,
                        humantime::format_duration(Duration::from_secs(c.age_seconds)),
                        c.target.map_or("-".into(), |v| v.to_string()),
                        c.capacity.map_or("-".into(), |v| v.to_string()),
                        c.etag.as_deref().unwrap_or("-"),
                        c.foreign_writes
                    );
                    let _ = writeln!(
                        s,
                        "  last write: {}",
                        c.last_write.as_ref().map_or("none".into(), |w| format!(
                            "{} {} -> {} at {}",
                            w.result,
                            w.from.map_or("?".into(), |v| v.to_string()),
                            w.to,
                            w.at
                        ))
                    );
                    let _ = writeln!(
                        s,
                        "  last 412: {}",
                        c.last_conflict
                            .as_ref()
                            .map_or("none".into(), |k| format!("{} at {}", k.outcome, k.at))
                    );
                    let holds = if c.holds.is_empty() {
                        "none".to_string()
                    } else {
                        c.holds.join("; ")
                    };
                    let _ = writeln!(s, "  holds: {holds}");
                    if let Some(m) = &c.template_mismatch {
                        let _ = writeln!(
                            s,
                            "  template learned from node {} at {} (it registered otherwise than predicted: {})",
                            m.node,
                            m.at,
                            m.mismatches.join("; ")
                        );
                    }
                }
                if let Some(n) = &g.not_known_here {
                    let _ = writeln!(s, "  not known here: {n}");
                }
            }
        }
        s
    }
}

/// The time [`crate::kube::nodes::DELETION_CANDIDATE_TAINT`]'s value names (unix seconds, as the
/// controller writes it), if the node carries the taint.
fn soft_tainted_since(node: &NodeRecord) -> Option<String> {
    crate::kube::nodes::soft_taint_record(node)?;
    Some(soft_taint_time(node).map_or_else(|| "unknown".to_string(), |ts| ts.to_string()))
}

/// When the node's [`crate::kube::nodes::DELETION_CANDIDATE_TAINT`] went on, if it carries one
/// whose value is a time.
fn soft_taint_time(node: &NodeRecord) -> Option<Timestamp> {
    crate::kube::nodes::soft_taint_record(node)?
        .value
        .as_deref()
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|secs| Timestamp::from_second(secs).ok())
}
