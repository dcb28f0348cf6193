//! cluster-autoscaler's status ConfigMap, `kube-system/cluster-autoscaler-status` by default, in
//! cluster-autoscaler's current YAML layout (its `clusterstate/api` types): `time`,
//! `autoscalerStatus`, `clusterWide` (`health` with node counts by readiness, `scaleUp`,
//! `scaleDown`) and `nodeGroups[]` (`health` with `cloudProviderTarget`, `minSize`, `maxSize`;
//! `scaleUp` with `backoffInfo`; `scaleDown` with its candidates), under the data key `status`
//! with the annotation `cluster-autoscaler.kubernetes.io/last-updated`, so runbooks and
//! `kubectl describe configmap cluster-autoscaler-status` written for cluster-autoscaler work.
//! Written by the same writer as the controller's own status
//! ([`crate::kube::status::StatusWriter`], see [`crate::kube::ca_status`] for the names and
//! annotations).
//!
//! This module is the pure part, on the read side: from the one status model
//! ([`super::NodeGroups::status`]), the Nodes and the scale-down candidates
//! ([`super::NodeGroups::unneeded`]), the document. Conditions keep the time they last changed
//! ([`Transitions`]), as cluster-autoscaler's `lastTransitionTime`.
//!
//! How the fields are filled here:
//! - node counts from the Nodes matched to each group (`NodeGroupForNode`): `ready`,
//!   `notStarted` (not Ready, within `maxNodeProvisionTime` of its creation), `unready` (not
//!   Ready past that), `beingDeleted` (carrying the scale-down taint); `unregistered` is the
//!   group's capacity less its registered nodes; `longUnregistered` is not tracked here and
//!   stays 0 (unregistered instances past `maxNodeProvisionTime` are deleted by scale-down and
//!   back the group off, which `scaleUp.status: Backoff` shows);
//! - `health`: `Unhealthy` with more unready nodes than `okTotalUnreadyCount` and
//!   `maxTotalUnreadyPercentage` allow (cluster-wide and per group, as cluster-autoscaler);
//! - `scaleUp`: `Backoff` while writes to the group are backed off or its offering is
//!   unavailable (`backoffInfo.errorCode`: `QuotaExceeded`, `OutOfResource` or
//!   `cloudProviderError`, as cluster-autoscaler's error classes), `InProgress` while nodes it
//!   asked for are not up yet (capacity above its Ready and unready nodes: some unregistered or
//!   still starting), else `NoActivity`;
//! - `scaleDown`: `CandidatesPresent` with the count of unneeded nodes at the last scale-down
//!   pass, else `NoCandidates`.

use super::{is_starting, too_many_unready, Backing, GroupIndex};
use crate::config::NodeGroupSpec;
use crate::notify::GroupStatus;
use crate::pods::record::NodeRecord;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The document, with cluster-autoscaler's field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaStatus {
    /// When (`2006-01-02 15:04:05.999999999 -0700 MST`, Go's layout, as cluster-autoscaler).
    pub time: String,
    /// `Running` once the first pass has read every group, else `Initializing`.
    pub autoscaler_status: &'static str,
    /// Why scale-down is halted, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions of the whole cluster.
    pub cluster_wide: ClusterWide,
    /// One entry per node group.
    pub node_groups: Vec<NodeGroup>,
}

/// `clusterWide`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterWide {
    /// `health`.
    pub health: Health,
    /// `scaleUp`.
    pub scale_up: Condition,
    /// `scaleDown`.
    pub scale_down: ScaleDown,
}

/// `nodeGroups[]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroup {
    /// The node group's name.
    pub name: String,
    /// `health`.
    pub health: GroupHealth,
    /// `scaleUp`.
    pub scale_up: GroupScaleUp,
    /// `scaleDown`.
    pub scale_down: ScaleDown,
}

/// `health` of the cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// `Healthy` or `Unhealthy`.
    pub status: &'static str,
    /// Nodes by state.
    pub node_counts: NodeCounts,
    /// This write.
    pub last_probe_time: String,
    /// When `status` last changed.
    pub last_transition_time: String,
}

/// `health` of a node group.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupHealth {
    /// `Healthy` or `Unhealthy`.
    pub status: &'static str,
    /// Nodes by state.
    pub node_counts: NodeCounts,
    /// The capacity as last read from Azure (0 when unknown).
    pub cloud_provider_target: i64,
    /// `minSize`.
    pub min_size: u32,
    /// `maxSize`.
    pub max_size: u32,
    /// This write.
    pub last_probe_time: String,
    /// When `status` last changed.
    pub last_transition_time: String,
}

/// `nodeCounts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes registered in the cluster.
    pub registered: Registered,
    /// Not tracked here: always 0 (see the module documentation).
    pub long_unregistered: u32,
    /// Capacity without a registered node.
    pub unregistered: u32,
}

/// `nodeCounts.registered`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    /// Every registered node.
    pub total: u32,
    /// Ready.
    pub ready: u32,
    /// Not Ready, still within its startup window.
    pub not_started: u32,
    /// Tainted for deletion by scale-down.
    #[serde(skip_serializing_if = "is_zero")]
    pub being_deleted: u32,
    /// Not Ready past its startup window.
    pub unready: Unready,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `nodeCounts.registered.unready`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unready {
    /// Unready nodes.
    pub total: u32,
    /// Unready for a missing resource (a GPU not yet advertised): not told apart here, 0.
    pub resource_unready: u32,
}

/// A condition with only a status (`clusterWide.scaleUp`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `InProgress` or `NoActivity`.
    pub status: &'static str,
    /// This write.
    pub last_probe_time: String,
    /// When `status` last changed.
    pub last_transition_time: String,
}

/// `nodeGroups[].scaleUp`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupScaleUp {
    /// `Backoff`, `InProgress` or `NoActivity`.
    pub status: &'static str,
    /// Why the group is backed off; left out when it is not, as cluster-autoscaler leaves it
    /// out (its `omitempty` pointer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_info: Option<BackoffInfo>,
    /// This write.
    pub last_probe_time: String,
    /// When `status` last changed.
    pub last_transition_time: String,
}

/// `backoffInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffInfo {
    /// cluster-autoscaler's error class: `QuotaExceeded`, `OutOfResource`, `cloudProviderError`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// Azure's message or the controller's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

/// `scaleDown`, of the cluster or a group.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDown {
    /// `CandidatesPresent` or `NoCandidates`.
    pub status: &'static str,
    /// Unneeded nodes at the last scale-down pass.
    #[serde(skip_serializing_if = "is_zero")]
    pub candidates: u32,
    /// This write.
    pub last_probe_time: String,
    /// When `status` last changed.
    pub last_transition_time: String,
}

/// When each condition last changed status, by condition key.
#[derive(Debug, Default)]
pub struct Transitions {
    since: HashMap<String, (&'static str, String)>,
}

impl Transitions {
    /// The transition time of `key` now in `status`: kept while the status stays, `now` when
    /// it changes (or is first seen).
    fn at(&mut self, key: String, status: &'static str, now: &str) -> String {
        let e = self
            .since
            .entry(key)
            .or_insert_with(|| (status, now.to_string()));
        if e.0 != status {
            *e = (status, now.to_string());
        }
        e.1.clone()
    }
}

/// What the document is built from.
pub struct CaInput<'a> {
    /// The node groups as configured or discovered, with how their nodes are recognised.
    pub groups: &'a [(NodeGroupSpec, Backing)],
    /// The reconciler's view of each group, by name.
    pub status: &'a [GroupStatus],
    /// Every Node.
    pub nodes: &'a [Arc<NodeRecord>],
    /// Unneeded nodes per group at the last scale-down pass.
    pub unneeded: &'a BTreeMap<String, u32>,
    /// The first pass has read every group.
    pub running: bool,
    /// `maxNodeProvisionTime`: a Node not Ready this long after its creation is unready.
    pub startup: Duration,
    /// `okTotalUnreadyCount`.
    pub ok_unready: u32,
    /// `maxTotalUnreadyPercentage`.
    pub max_unready_percent: f64,
    /// Now, wall clock.
    pub now: Timestamp,
}

fn count(nodes: &[&Arc<NodeRecord>], now: Timestamp, startup: Duration) -> Registered {
    let mut r = Registered::default();
    for n in nodes {
        r.total += 1;
        if crate::kube::nodes::has_our_taint_record(n) {
            r.being_deleted += 1;
        }
        if n.ready {
            r.ready += 1;
        } else if is_starting(n, now, startup) {
            r.not_started += 1;
        } else {
            r.unready.total += 1;
        }
    }
    r
}

/// cluster-autoscaler's error class for a group's backoff, and the words.
fn backoff(s: &GroupStatus) -> Option<BackoffInfo> {
    if let Some(u) = &s.unavailable {
        let code = match u.reason.as_str() {
            "quota" => "QuotaExceeded",
            _ => "OutOfResource",
        };
        return Some(BackoffInfo {
            error_code: Some(code.into()),
            error_message: Some(format!("{} (until {}): {}", u.reason, u.until, u.message)),
        });
    }
    if let Some(until) = &s.provision_backoff_until {
        // cluster-autoscaler's class and code for a scale-up whose nodes never registered.
        return Some(BackoffInfo {
            error_code: Some("timeout".into()),
            error_message: Some(format!(
                "Scale-up timed out for node group {}: requested nodes did not register within maxNodeProvisionTime; backed off until {until}",
                s.name
            )),
        });
    }
    s.backoff_until.as_ref().map(|until| BackoffInfo {
        error_code: Some("cloudProviderError".into()),
        error_message: Some(format!("writes backed off after errors until {until}")),
    })
}

/// Go's `2006-01-02 15:04:05.999999999 -0700 MST` for a UTC time, as cluster-autoscaler
/// writes `time` and its annotation.
pub fn go_time(t: Timestamp) -> String {
    let secs = t.strftime("%Y-%m-%d %H:%M:%S").to_string();
    let nanos = t.subsec_nanosecond();
    let frac = match nanos {
        0 => String::new(),
        n => format!(".{n:09}").trim_end_matches('0').to_string(),
    };
    format!("{secs}{frac} +0000 UTC")
}

/// The document for `input` now; `transitions` keeps each condition's last change.
pub fn build(input: &CaInput, transitions: &mut Transitions) -> CaStatus {
    let now = input.now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let index = GroupIndex::of_backings(input.groups.iter().map(|(_, b)| b));
    let mut per_group: Vec<Vec<&Arc<NodeRecord>>> = vec![Vec::new(); input.groups.len()];
    for n in input.nodes {
        if let Some(i) = index.group_of(n) {
            per_group[i].push(n);
        }
    }
    let all: Vec<&Arc<NodeRecord>> = input.nodes.iter().collect();
    let status_of: HashMap<&str, &GroupStatus> =
        input.status.iter().map(|s| (s.name.as_str(), s)).collect();
    let healthy = |r: &Registered| match too_many_unready(
        r.unready.total as usize,
        r.total as usize,
        input.ok_unready,
        input.max_unready_percent,
    ) {
        Some(_) => "Unhealthy",
        None => "Healthy",
    };
    let mut groups = Vec::with_capacity(input.groups.len());
    let mut any_in_progress = false;
    let mut total_unregistered = 0u32;
    let mut total_candidates = 0u32;
    for ((spec, _), nodes) in input.groups.iter().zip(&per_group) {
        let name = spec.name.as_str();
        let registered = count(nodes, input.now, input.startup);
        let s = status_of.get(name).copied();
        let target = s.and_then(|s| s.capacity).unwrap_or(0);
        let unregistered =
            u32::try_from((target - i64::from(registered.total)).max(0)).unwrap_or(u32::MAX);
        total_unregistered += unregistered;
        let health = healthy(&registered);
        let info = s.and_then(backoff);
        // Requested nodes not up yet: not registered, or registered and still starting.
        let coming = target > i64::from(registered.ready + registered.unready.total);
        let up = match (&info, coming) {
            (Some(_), _) => "Backoff",
            (None, true) => "InProgress",
            (None, false) => "NoActivity",
        };
        any_in_progress |= up == "InProgress";
        let candidates = input.unneeded.get(name).copied().unwrap_or(0);
        total_candidates += candidates;
        let down = if candidates > 0 {
            "CandidatesPresent"
        } else {
            "NoCandidates"
        };
        groups.push(NodeGroup {
            name: name.to_string(),
            health: GroupHealth {
                status: health,
                node_counts: NodeCounts {
                    registered,
                    long_unregistered: 0,
                    unregistered,
                },
                cloud_provider_target: target,
                min_size: s.map_or(spec.min_size, |s| s.min_size),
                max_size: s.map_or(spec.max_size, |s| s.max_size),
                last_probe_time: now.clone(),
                last_transition_time: transitions.at(format!("{name}/health"), health, &now),
            },
            scale_up: GroupScaleUp {
                status: up,
                backoff_info: info,
                last_probe_time: now.clone(),
                last_transition_time: transitions.at(format!("{name}/scaleUp"), up, &now),
            },
            scale_down: ScaleDown {
                status: down,
                candidates,
                last_probe_time: now.clone(),
                last_transition_time: transitions.at(format!("{name}/scaleDown"), down, &now),
            },
        });
    }
    let registered = count(&all, input.now, input.startup);
    let health = healthy(&registered);
    let up = if any_in_progress {
        "InProgress"
    } else {
        "NoActivity"
    };
    let down = if total_candidates > 0 {
        "CandidatesPresent"
    } else {
        "NoCandidates"
    };
    CaStatus {
        time: go_time(input.now),
        autoscaler_status: if input.running {
            "Running"
        } else {
            "Initializing"
        },
        message: input
            .status
            .iter()
            .find_map(|s| s.scale_down_halted.clone())
            .map(|why| format!("scale-down halted: {why}")),
        cluster_wide: ClusterWide {
            health: Health {
                status: health,
                node_counts: NodeCounts {
                    registered,
                    long_unregistered: 0,
                    unregistered: total_unregistered,
                },
                last_probe_time: now.clone(),
                last_transition_time: transitions.at("cluster/health".into(), health, &now),
            },
            scale_up: Condition {
                status: up,
                last_probe_time: now.clone(),
                last_transition_time: transitions.at("cluster/scaleUp".into(), up, &now),
            },
            scale_down: ScaleDown {
                status: down,
                candidates: total_candidates,
                last_probe_time: now.clone(),
                last_transition_time: transitions.at("cluster/scaleDown".into(), down, &now),
            },
        },
        node_groups: groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeGroupKind;
    use crate::notify::UnavailableStatus;
    use serde_json::json;

    fn spec(name: &str, min: u32, max: u32) -> (NodeGroupSpec, Backing) {
        let g = NodeGroupSpec {
            name: name.into(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: min,
            max_size: max,
            desired_capacity: None,
            schedules: Vec::new(),
            max_scale_down_step: None,
        };
        let b = Backing::ScaleSet {
            resource_group: "rg".into(),
            name: name.into(),
        };
        (g, b)
    }

    fn status(name: &str, capacity: i64) -> GroupStatus {
        GroupStatus {
            name: name.into(),
            kind: "vmss".into(),
            min_size: 0,
            max_size: 10,
            target: Some(capacity),
            capacity: Some(capacity),
            etag: None,
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

    fn node(group: &str, id: u32, ready: bool, age_secs: i64, now: Timestamp) -> Arc<NodeRecord> {
        let created = now - k8s_openapi::jiff::SignedDuration::from_secs(age_secs);
        let conditions = json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": format!("{group}{id:06}"),
                "creationTimestamp": created.to_string()},
            "spec": {"providerID": format!("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/{group}/virtualMachines/{id}")},
            "status": {"conditions": conditions},
        }))
        .expect("node");
        Arc::new(NodeRecord::of(n))
    }

    #[test]
    fn nodes_that_never_registered_back_a_group_off_with_cluster_autoscalers_timeout_code() {
        let mut late = status("late", 2);
        late.provision_backoff_until = Some("2026-11-25T10:05:00Z".into());
        let info = backoff(&late).expect("backed off");
        assert_eq!(info.error_code.as_deref(), Some("timeout"));
        assert!(
            info.error_message
                .as_deref()
                .is_some_and(|m| m.starts_with("Scale-up timed out for node group late")),
            "{info:?}"
        );
        // A refused offering is the more precise cause and is said first.
        late.unavailable = Some(UnavailableStatus {
            reason: "allocation_failed".into(),
            until: "2026-11-25T10:03:00Z".into(),
            message: "no capacity".into(),
        });
        assert_eq!(
            backoff(&late).and_then(|i| i.error_code).as_deref(),
            Some("OutOfResource")
        );
    }

    #[test]
    fn the_document_counts_nodes_by_readiness_and_says_backoff_progress_and_candidates_in_cluster_autoscalers_words(
    ) {
        let now: Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        let groups = [spec("general", 1, 10), spec("gpu", 0, 4)];
        // general: 3 wanted, 2 registered (one Ready, one booting): a scale-up in progress.
        // gpu: its offering refused for quota.
        let mut gpu = status("gpu", 0);
        gpu.unavailable = Some(UnavailableStatus {
            reason: "quota".into(),
            until: "2026-11-25T10:05:00Z".into(),
            message: "exceeding approved standardNCFamily Cores quota".into(),
        });
        let st = [status("general", 3), gpu];
        let nodes = [
            node("general", 0, true, 3600, now),
            node("general", 1, false, 60, now),
            node("other", 0, false, 7200, now),
        ];
        let unneeded = BTreeMap::from([("general".to_string(), 1)]);
        let input = CaInput {
            groups: &groups,
            status: &st,
            nodes: &nodes,
            unneeded: &unneeded,
            running: true,
            startup: Duration::from_secs(900),
            ok_unready: 3,
            max_unready_percent: 45.0,
            now,
        };
        let mut t = Transitions::default();
        let doc = build(&input, &mut t);
        assert_eq!(doc.time, "2026-11-25 10:00:00 +0000 UTC");
        assert_eq!(doc.autoscaler_status, "Running");
        let general = &doc.node_groups[0];
        assert_eq!(general.health.status, "Healthy");
        assert_eq!(general.health.cloud_provider_target, 3);
        let r = &general.health.node_counts.registered;
        assert_eq!(
            (r.total, r.ready, r.not_started, r.unready.total),
            (2, 1, 1, 0)
        );
        assert_eq!(general.health.node_counts.unregistered, 1);
        assert_eq!(general.scale_up.status, "InProgress");
        assert_eq!(general.scale_down.status, "CandidatesPresent");
        assert_eq!(general.scale_down.candidates, 1);
        let gpu = &doc.node_groups[1];
        assert_eq!(gpu.scale_up.status, "Backoff");
        assert_eq!(
            gpu.scale_up
                .backoff_info
                .as_ref()
                .and_then(|i| i.error_code.as_deref()),
            Some("QuotaExceeded")
        );
        // The node of no group counts cluster-wide only: unready past its startup window.
        let cw = &doc.cluster_wide;
        assert_eq!(cw.health.node_counts.registered.total, 3);
        assert_eq!(cw.health.node_counts.registered.unready.total, 1);
        assert_eq!(cw.scale_up.status, "InProgress");
        assert_eq!(cw.scale_down.candidates, 1);

        // The YAML has cluster-autoscaler's keys.
        let yaml = serde_yaml::to_string(&doc).unwrap();
        for key in [
            "autoscalerStatus: Running",
            "clusterWide:",
            "nodeCounts:",
            "notStarted: 1",
            "resourceUnready: 0",
            "longUnregistered: 0",
            "cloudProviderTarget: 3",
            "minSize: 0",
            "maxSize: 10",
            "backoffInfo:",
            "errorCode: QuotaExceeded",
            "status: CandidatesPresent",
            "candidates: 1",
            "lastTransitionTime:",
        ] {
            assert!(yaml.contains(key), "{key} missing in:\n{yaml}");
        }

        // A condition keeps its transition time while it holds, and moves when it changes.
        let later: Timestamp = "2026-11-25T10:01:00Z".parse().unwrap();
        let doc = build(
            &CaInput {
                now: later,
                ..input
            },
            &mut t,
        );
        assert_eq!(
            doc.node_groups[0].scale_up.last_transition_time,
            "2026-11-25T10:00:00Z"
        );
        assert_eq!(
            doc.node_groups[0].scale_up.last_probe_time,
            "2026-11-25T10:01:00Z"
        );
        // The booting node no longer counted as coming: 1 wanted, 1 Ready.
        let st = [status("general", 1), status("gpu", 0)];
        let doc = build(
            &CaInput {
                now: later,
                status: &st,
                ..input
            },
            &mut t,
        );
        assert_eq!(doc.node_groups[0].scale_up.status, "NoActivity");
        assert_eq!(
            doc.node_groups[0].scale_up.last_transition_time,
            "2026-11-25T10:01:00Z"
        );
        assert_eq!(doc.node_groups[1].scale_up.status, "NoActivity");
        assert_eq!(doc.node_groups[1].scale_up.backoff_info, None);
    }

    #[test]
    fn more_unready_nodes_than_cluster_autoscaler_tolerates_make_the_cluster_unhealthy() {
        let now: Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        let groups = [spec("general", 0, 10)];
        let st = [status("general", 5)];
        let nodes: Vec<_> = (0..5)
            .map(|i| node("general", i, i == 0, 7200, now))
            .collect();
        let none = BTreeMap::new();
        let input = CaInput {
            groups: &groups,
            status: &st,
            nodes: &nodes,
            unneeded: &none,
            running: true,
            startup: Duration::from_secs(900),
            ok_unready: 3,
            max_unready_percent: 45.0,
            now,
        };
        let doc = build(&input, &mut Transitions::default());
        assert_eq!(doc.cluster_wide.health.status, "Unhealthy");
        assert_eq!(doc.node_groups[0].health.status, "Unhealthy");
        assert_eq!(doc.cluster_wide.scale_down.status, "NoCandidates");
    }

    #[test]
    fn a_group_that_is_not_backed_off_has_no_backoff_info_key_as_cluster_autoscaler_writes_it() {
        let now: Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        let groups = [spec("general", 0, 10), spec("gpu", 0, 4)];
        let mut gpu = status("gpu", 0);
        gpu.backoff_until = Some("2026-11-25T10:05:00Z".into());
        let st = [status("general", 0), gpu];
        let none = BTreeMap::new();
        let input = CaInput {
            groups: &groups,
            status: &st,
            nodes: &[],
            unneeded: &none,
            running: true,
            startup: Duration::from_secs(900),
            ok_unready: 3,
            max_unready_percent: 45.0,
            now,
        };
        let yaml = serde_yaml::to_string(&build(&input, &mut Transitions::default())).unwrap();
        assert!(!yaml.contains("{}"), "an empty object is written:\n{yaml}");
        assert_eq!(
            yaml.matches("backoffInfo:").count(),
            1,
            "only the backed-off group says backoffInfo:\n{yaml}"
        );
        assert!(yaml.contains("errorCode: cloudProviderError"), "{yaml}");
    }
}
