//! The one status model ([`NodeGroups::status`]) and what feeds it besides the observed state
//! and the health: the per-group gauges of each pass ([`NodeGroups::publish_plan`]), the unneeded
//! nodes and scale-down's halt as the scale-down loop reports them.

use super::NodeGroups;
use crate::config::NodeGroupSpec;
use crate::notify::GroupStatus;
use crate::planner::{CapacityChange, Hold};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use time::OffsetDateTime;
use tokio::time::Instant;

/// An unneeded node: since when on the monotonic clock, and as wall-clock time.
type UnneededSince = (String, Instant, OffsetDateTime);

/// What the scale-down loop reports for the status.
#[derive(Debug, Default)]
pub(super) struct Reported {
    /// Why scale-down is halted, as the scale-down loop last said.
    scale_down_halted: Mutex<Option<String>>,
    /// Unneeded nodes per group at the last scale-down pass, with since when (for both status
    /// ConfigMaps). The wall-clock time is fixed when a node is first reported, so the status
    /// shows the same instant on every write.
    unneeded: Mutex<BTreeMap<String, Vec<UnneededSince>>>,
    /// When the scale-down loop last saw each group grow (`scaleDown.delayAfterAdd` counts from
    /// it), as wall-clock time.
    grown: Mutex<BTreeMap<String, OffsetDateTime>>,
}

/// RFC 3339 in UTC, as the status ConfigMap shows times.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

impl NodeGroups {
    /// Records why scale-down is halted (`None`: it is not), shown in [`NodeGroups::status`].
    pub fn set_scale_down_halted(&self, why: Option<String>) {
        *self.status.scale_down_halted.lock() = why;
    }

    /// Records that the scale-down loop saw `group` grow now (a scale-up; a replace's own
    /// launch is none), shown as `lastScaleUp` in [`NodeGroups::status`].
    pub fn set_grown(&self, group: &str) {
        let wall = self.now();
        self.status.grown.lock().insert(group.to_string(), wall);
    }

    /// Records the unneeded nodes per group the last scale-down pass found, each with since
    /// when it has been unneeded.
    pub fn set_unneeded(&self, per_group: BTreeMap<String, Vec<(String, Instant)>>) {
        let (now, wall) = (Instant::now(), self.now());
        let mut current = self.status.unneeded.lock();
        let known: HashMap<(String, Instant), OffsetDateTime> = current
            .values()
            .flatten()
            .map(|(n, since, at)| ((n.clone(), *since), *at))
            .collect();
        *current = per_group
            .into_iter()
            .map(|(g, nodes)| {
                let nodes = nodes
                    .into_iter()
                    .map(|(n, since)| {
                        let at = known
                            .get(&(n.clone(), since))
                            .copied()
                            .unwrap_or_else(|| wall - now.saturating_duration_since(since));
                        (n, since, at)
                    })
                    .collect();
                (g, nodes)
            })
            .collect();
    }

    /// Unneeded nodes per group at the last scale-down pass (empty without scale-down).
    pub fn unneeded(&self) -> BTreeMap<String, u32> {
        self.status
            .unneeded
            .lock()
            .iter()
            .map(|(g, nodes)| (g.clone(), u32::try_from(nodes.len()).unwrap_or(u32::MAX)))
            .collect()
    }

    /// Each node group as it stands now, the one status model: what the leader writes to the
    /// status ConfigMap, what cluster-autoscaler's status is built from
    /// ([`super::ca_status::build`], with [`NodeGroups::unneeded`]), and what `explain`
    /// reads back. Bounds, the planned target, capacity and ETag, the last write and the last
    /// 412 with their outcomes, foreign writes, backoffs, an unavailable offering, why writes
    /// are held ([`super::Health::held`]), scale-down's halt and unneeded nodes, the learned template's
    /// mismatch, "did not help".
    pub fn status(&self) -> Vec<GroupStatus> {
        let now = Instant::now();
        let wall = self.now();
        // A monotonic deadline as wall-clock time, for people reading the ConfigMap.
        let until = |t: Option<Instant>| {
            t.filter(|t| *t > now)
                .map(|t| rfc3339(wall + t.saturating_duration_since(now)))
        };
        let snapshot = self.scale_sets().snapshot();
        let halted = self.status.scale_down_halted.lock().clone();
        let unneeded = self.status.unneeded.lock().clone();
        let grown = self.status.grown.lock().clone();
        self.groups()
            .iter()
            .map(|g| {
                let entry = snapshot.get(&g.name).map(|e| &e.scale_set);
                let o = self.observed(&g.name);
                let health = self.health(&g.name);
                GroupStatus {
                    name: g.name.clone(),
                    kind: g.kind.as_str().to_string(),
                    min_size: g.min_size,
                    max_size: g.max_size,
                    target: o.target,
                    capacity: entry.and_then(|e| e.capacity),
                    etag: o
                        .known_etag
                        .clone()
                        .or_else(|| entry.and_then(|e| e.etag.clone())),
                    last_write: o.last_write.clone(),
                    last_conflict: o.last_conflict.clone(),
                    foreign_writes: o.foreign_writes,
                    backoff_until: until(o.backoff_until),
                    unavailable: self.unavailable(&g.name).map(|u| {
                        crate::notify::UnavailableStatus {
                            reason: u.failure.label().to_string(),
                            until: rfc3339(wall + u.left),
                            message: u.message,
                        }
                    }),
                    held: health.held().map(|r| r.metric_label().to_string()),
                    scale_down_halted: halted.clone(),
                    provision_backoff_until: until(o.provision_backoff_until),
                    last_scale_up: grown.get(&g.name).copied().map(rfc3339),
                    unneeded: unneeded
                        .get(&g.name)
                        .map(|nodes| {
                            let mut nodes = nodes.clone();
                            nodes.sort_by_key(|(n, since, _)| (*since, n.clone()));
                            nodes
                                .into_iter()
                                .take(crate::notify::UNNEEDED_LISTED)
                                .map(|(node, _, at)| crate::notify::UnneededNode {
                                    node,
                                    since: rfc3339(at),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    template_mismatch: self.template_mismatch(&g.name),
                    not_helped: self.not_helped(&g.name),
                }
            })
            .collect()
    }

    /// Publishes a pass's plan: the per-group gauges (bounds, desired and current capacity, the
    /// cache's age) and each group's target; a group with no write planned (`changes`) has
    /// nothing held any more.
    pub fn publish_plan(
        &self,
        groups: &[NodeGroupSpec],
        held: &[(String, Hold, Option<i64>)],
        changes: &[CapacityChange],
        now: Instant,
    ) {
        let desired: HashMap<&str, Option<i64>> = held
            .iter()
            .map(|(n, _, d)| (n.as_str(), *d))
            .chain(changes.iter().map(|c| (c.scale_set.as_str(), Some(c.to))))
            .collect();
        let snapshot = self.scale_sets().snapshot();
        for g in groups {
            let name = g.name.as_str();
            self.metrics
                .node_group_info
                .with_label_values(&[name, g.kind.as_str()])
                .set(1);
            self.metrics
                .scale_set_min_size
                .with_label_values(&[name])
                .set(i64::from(g.min_size));
            self.metrics
                .scale_set_max_size
                .with_label_values(&[name])
                .set(i64::from(g.max_size));
            let target = desired.get(name).copied().flatten();
            let planned = changes.iter().any(|c| c.scale_set == name);
            // Nothing to write this pass: nothing is held.
            self.planned(name, target, planned);
            if let Some(Some(d)) = desired.get(name) {
                self.metrics
                    .scale_set_desired_capacity
                    .with_label_values(&[name])
                    .set(*d);
            }
            if let Some(entry) = snapshot.get(name) {
                if let Some(c) = entry.scale_set.capacity {
                    self.metrics
                        .scale_set_capacity
                        .with_label_values(&[name])
                        .set(c);
                }
                let age = now
                    .saturating_duration_since(entry.fetched_at)
                    .as_secs_f64();
                self.metrics
                    .cache_age_seconds
                    .with_label_values(&[name])
                    .set(age);
            }
        }
    }
}
