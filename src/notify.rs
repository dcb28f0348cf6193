//! What the reconciler tells the outside world besides metrics and logs: notable moments as
//! [`ControllerEvent`]s (turned into Kubernetes Events when Kubernetes is enabled) and a
//! per-node-group [`GroupStatus`] snapshot (written to the status ConfigMap by the leader).
//!
//! The reconciler depends only on the [`EventSink`] trait, so it knows nothing of Kubernetes and
//! runs unchanged without it ([`NoEvents`]).

use crate::hold::HoldReason;
use serde::{Deserialize, Serialize};

/// A moment worth an Event. `group` is the node-group name (the `scale_set` metric label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerEvent {
    /// Azure accepted a capacity write.
    CapacityWritten {
        /// Node group.
        group: String,
        /// `vmss` or `aksAgentPool`.
        kind: &'static str,
        /// Capacity before, when known.
        from: Option<i64>,
        /// Capacity written.
        to: i64,
        /// The ETag adopted from the answer.
        etag: Option<String>,
    },
    /// A write met `412 Precondition Failed`, and how the re-plan ended.
    Conflict {
        /// Node group.
        group: String,
        /// `skipped`, `retried_ok`, `gave_up` or `gone` (the `etag_conflicts_total` outcome).
        outcome: &'static str,
        /// The capacity the fresh read showed, when there was one.
        fresh_capacity: Option<i64>,
    },
    /// Another writer changed the resource (its ETag moved without us).
    ForeignWrite {
        /// Node group.
        group: String,
        /// The new ETag.
        etag: String,
        /// The capacity it showed.
        capacity: Option<i64>,
    },
    /// A planned write was not sent.
    WriteHeld {
        /// Node group.
        group: String,
        /// Why (its label is the `writes_held_total` reason).
        reason: HoldReason,
    },
    /// A pending pod made a node group grow (cluster-autoscaler's `TriggeredScaleUp`).
    PodTriggeredScaleUp {
        /// The pod.
        pod: ObjectRef,
        /// Which groups grow, as `group from->to (max: n)`.
        groups: String,
    },
    /// A pending pod fits no node group (cluster-autoscaler's `NotTriggerScaleUp`).
    PodNotTriggeredScaleUp {
        /// The pod.
        pod: ObjectRef,
        /// Why, per group.
        why: String,
    },
    /// A step of a node's removal (cluster-autoscaler's `ScaleDown` Events): the node tainted,
    /// a pod evicted from it, the node deleted.
    ScaleDown {
        /// The node, or a pod evicted from it.
        object: ObjectRef,
        /// What happened, in words.
        note: String,
    },
    /// A node's removal stopped (cluster-autoscaler's `ScaleDownFailed`): the node was
    /// untainted and stays.
    ScaleDownFailed {
        /// The node.
        object: ObjectRef,
        /// Why, in words.
        why: String,
    },
    /// Consolidation is removing a node (Karpenter's `Consolidating`/`DisruptionLaunching`
    /// words): the command was decided, re-validated, and the node is being tainted and drained.
    Consolidating {
        /// The node.
        object: ObjectRef,
        /// What the command does, in words.
        note: String,
    },
    /// A node is not consolidated (Karpenter's `Unconsolidatable`): a decision that did not hold
    /// on re-validation, or why a candidate stays.
    Unconsolidatable {
        /// The node.
        object: ObjectRef,
        /// Why, in words.
        why: String,
        /// The kind of reason (`churn`, `scheduling`, `budget`, `stabilizing`, ...): a node's
        /// Events of one kind are one series, so a reason of another kind is a new Event.
        kind: &'static str,
    },
    /// A new node of a group registered otherwise than the template its scale-up was planned
    /// with (a Warning: the group's template is that node from now on).
    TemplateMismatch {
        /// Node group.
        group: String,
        /// The node.
        node: String,
        /// What differs, in words (`key: predicted X, registered Y; ...`).
        mismatches: String,
    },
    /// A scale-up of a group did not help: its new nodes are Ready and cannot take the pods it
    /// was for; the group is passed over for their workloads for a while.
    ScaleUpDidNotHelp {
        /// Node group.
        group: String,
        /// The workloads passed over.
        workloads: Vec<String>,
        /// Why, for the first pod.
        why: String,
        /// For how long.
        backoff_secs: u64,
    },
    /// This replica acquired the Lease.
    LeadershipGained {
        /// This replica's identity.
        identity: String,
    },
    /// This replica lost (or released) the Lease.
    LeadershipLost {
        /// This replica's identity.
        identity: String,
    },
}

/// A Kubernetes object an Event is about (a pod, a node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// `v1`.
    pub api_version: &'static str,
    /// `Pod`, `Node`.
    pub kind: &'static str,
    /// Namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`, so the Event shows in `kubectl describe`.
    pub uid: Option<String>,
}

/// Receives [`ControllerEvent`]s. Must not block: implementations queue and return.
pub trait EventSink: Send + Sync {
    /// Records one event.
    fn record(&self, event: ControllerEvent);
}

/// Drops every event (no Kubernetes).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn record(&self, _event: ControllerEvent) {}
}

/// Logs every event instead of posting it (`run --dry-run`: no write of any kind).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogEvents;

impl EventSink for LogEvents {
    fn record(&self, event: ControllerEvent) {
        tracing::info!(?event, "dry run: would post an Event");
    }
}

/// The last capacity write of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRecord {
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Capacity before, when known.
    pub from: Option<i64>,
    /// Capacity asked for.
    pub to: i64,
    /// `ok`, `precondition_failed`, `throttled`, `quota`, `error` (the `capacity_writes_total`
    /// result label).
    pub result: String,
}

/// The last 412 of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConflictRecord {
    /// When (RFC 3339, UTC).
    pub at: String,
    /// `skipped`, `retried_ok`, `gave_up` or `gone`.
    pub outcome: String,
}

/// Why a group's offering is out (status ConfigMap).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnavailableStatus {
    /// The failure class (`quota`, `sku_not_available`, `allocation_failed`).
    pub reason: String,
    /// Until when (RFC 3339) scale-up passes over the group.
    pub until: String,
    /// Azure's message.
    pub message: String,
}

/// A node the last scale-down pass found unneeded, and since when (status ConfigMap).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnneededNode {
    /// Node name.
    pub node: String,
    /// Unneeded since (RFC 3339, UTC): the first pass of this leader that found it so.
    pub since: String,
}

/// The last time a group's new node registered otherwise than its template predicted (status
/// ConfigMap, `explain group`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMismatchStatus {
    /// When it was seen (RFC 3339, UTC).
    pub at: String,
    /// The node.
    pub node: String,
    /// What differs, one entry per key (`key: predicted X, registered Y`).
    pub mismatches: Vec<String>,
}

/// A group passed over because a scale-up of it did not help (status ConfigMap, `explain group`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotHelpedStatus {
    /// Until when (RFC 3339, UTC) scale-up passes over the group for these workloads.
    pub until: String,
    /// The workloads (`namespace/Kind/name`).
    pub workloads: Vec<String>,
    /// Why, for the first pod.
    pub why: String,
}

/// One node group as the reconciler sees it now. Written under the status ConfigMap's key and
/// read back by `explain`: every field a later version adds is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// Node-group name.
    pub name: String,
    /// `vmss` or `aksAgentPool`.
    pub kind: String,
    /// Bounds.
    pub min_size: u32,
    /// Bounds.
    pub max_size: u32,
    /// What the planner wants now, when known.
    pub target: Option<i64>,
    /// The capacity last read or written, when known.
    pub capacity: Option<i64>,
    /// The ETag last seen or adopted.
    pub etag: Option<String>,
    /// The last write and its result.
    pub last_write: Option<WriteRecord>,
    /// The last 412 and how it ended.
    pub last_conflict: Option<ConflictRecord>,
    /// Writes by others seen so far.
    #[serde(default)]
    pub foreign_writes: u64,
    /// Until when (RFC 3339) the group is backed off after errors, if it is.
    pub backoff_until: Option<String>,
    /// Azure refused the group's offering lately and it is passed over, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<UnavailableStatus>,
    /// Why writes are held, if they are (`aks_autoscaler`, `not_leader`, ...).
    pub held: Option<String>,
    /// Why scale-down is halted, if it is (a watch of the cluster failing): cluster-wide, shown
    /// on every group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_down_halted: Option<String>,
    /// Until when (RFC 3339) scale-up passes over the group because nodes it asked for did not
    /// register within `maxNodeProvisionTime`, if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision_backoff_until: Option<String>,
    /// When the scale-down loop last saw it grow, if it has since the leader started: scale-down
    /// is held `scaleDown.delayAfterAdd` from it (from the latest of every group's, unless
    /// `scaleDown.delayTypeLocal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_up: Option<String>,
    /// Its nodes the last scale-down pass found unneeded, longest first (at most
    /// [`UNNEEDED_LISTED`]; `unneeded_nodes_count` has them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unneeded: Vec<UnneededNode>,
    /// The last new node that registered otherwise than its template predicted, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_mismatch: Option<TemplateMismatchStatus>,
    /// Workloads scale-up passes over the group for, because a scale-up for them did not help.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_helped: Option<NotHelpedStatus>,
}

/// How many unneeded nodes a group's status lists, so a large cluster's status stays far below
/// a ConfigMap's 1 MiB.
pub const UNNEEDED_LISTED: usize = 100;
