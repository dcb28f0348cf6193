//! Which candidates may go now: the nodes not Ready, each group as the pass sees it, the
//! unneeded nodes [`crate::pods::unneeded`] finds and [`unneeded::select`] chooses, the removals
//! whose delete would not be held; and, after the taint, the re-check of a node against the
//! cluster as it is then ([`crate::pods::recheck`], the rules [`unneeded::unneeded`] applies).

use super::{PassView, Removal, ScaleDownLoop, Shared};
use crate::config::NodeGroupSpec;
use crate::node_groups::backing;
use crate::pods::recheck::{recheck, room_left, Recheck};
use crate::pods::record::NodeRecord;
use crate::pods::unneeded::{self, Candidates, DownGroup, DownInput, Limits};
use crate::resource::Victim;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info};

impl ScaleDownLoop {
    /// Nodes not Ready past their startup window (candidates after `unreadyTime`, never room),
    /// the spot VMs Azure `evicted` left out; and why scale-down halts, if too many are.
    pub(super) fn unready(
        &self,
        nodes: &[Arc<NodeRecord>],
        wall: k8s_openapi::jiff::Timestamp,
        evicted: &[unneeded::Unregistered],
    ) -> (HashSet<String>, Option<String>) {
        let s = &self.shared;
        let stopped: HashSet<String> = evicted
            .iter()
            .map(|e| e.machine.to_ascii_lowercase())
            .collect();
        let mut unready = crate::node_groups::unready_nodes(
            nodes,
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
        (unready, too_many)
    }

    /// Each group as the pass sees it: its floor, size, deletes in flight, whether it grew
    /// within `delayAfterAdd` (kept here: a size larger than the last one seen), its refusal.
    pub(super) fn down_groups(
        &mut self,
        groups: &[NodeGroupSpec],
        deleting: &HashMap<String, u32>,
        now: Instant,
    ) -> Vec<DownGroup> {
        let s = self.shared.clone();
        let delay_after_add = s.settings.scale_down.delay_after_add;
        let mut down = Vec::with_capacity(groups.len());
        for g in groups.iter() {
            let size = s.groups.target_size(&g.name);
            if let (Some(now_size), Some(prev)) = (size, self.sizes_seen.get(&g.name)) {
                // A replace's own launch (its cheaper group grown to the size it asked for) is
                // not a scale-up: held by it, the replace would abandon itself on re-validation.
                let launch = self
                    .replacing
                    .as_ref()
                    .is_some_and(|r| r.group.name == g.name && now_size <= r.target);
                if now_size > *prev && !launch {
                    self.grew_at.insert(g.name.clone(), now);
                    s.groups.set_grown(&g.name);
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
                recently_grown: false,
                grown_ago: self.grew_at.get(&g.name).map(|t| now.duration_since(*t)),
                refused: s.groups.write_refusal(g),
            });
        }
        unneeded::hold_after_add(
            &mut down,
            delay_after_add,
            s.settings.scale_down.delay_type_local,
        );
        down
    }

    /// The unneeded nodes of the pass (a replace's new node left out), since when each has
    /// been (reported to the status and the gauges), and which of them go now, in
    /// cluster-autoscaler's order and limits (at most `v.left`).
    pub(super) fn choose(
        &mut self,
        v: &PassView,
        draining: bool,
        now: Instant,
    ) -> (Candidates, Vec<usize>) {
        let s = self.shared.clone();
        let settings = &s.settings.scale_down;
        let mut candidates = unneeded::unneeded(&DownInput {
            now: v.wall,
            groups: v.down,
            nodes: v.nodes,
            pods: v.pods,
            pdbs: v.pdbs,
            threshold: settings.utilization_threshold,
            busy: v.busy,
            unready: v.unready,
            previously: &self.since.keys().cloned().collect(),
            non_empty_candidates: settings.non_empty_candidates_count,
            volumes: v.volumes,
            namespaces: v.namespaces,
            keep_jobs: s.settings.consolidation.keeps_jobs(),
        });
        // A replace's new node is not removed while the replace needs it.
        self.protection(v.busy);
        if let Some(p) = &self.protected {
            candidates.unneeded.retain(|u| !p.new.contains(&u.node));
        }
        unneeded::track(&mut self.since, &candidates, now);
        unneeded::resume(&mut self.since, &mut self.started, v.busy);
        self.report(v.down, &candidates, now);
        let (chosen, waiting) = unneeded::select(
            &candidates,
            v.down,
            &self.since,
            now,
            Limits {
                unneeded_time: settings.unneeded_time,
                unready_time: settings.unready_time,
                max_empty_bulk_delete: settings.max_empty_bulk_delete,
                max_per_pass: u32::try_from(v.left).unwrap_or(u32::MAX),
                draining,
                balance: s.settings.pod_demand.balance_similar_node_groups,
            },
        );
        if !waiting.is_empty() {
            debug!(?waiting, "unneeded nodes waiting");
        }
        (candidates, chosen)
    }

    /// Dry run: forgets what was logged as "would remove" once it is no longer so.
    pub(super) fn forget_would(&mut self) {
        if !self.dry_run {
            return;
        }
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

    /// The removals of the `chosen` candidates that start now ([`removals_now`]); a dry run
    /// says once what it would remove and starts none.
    pub(super) fn removals(
        &mut self,
        candidates: &Candidates,
        chosen: &[usize],
        groups: &[NodeGroupSpec],
    ) -> Vec<Removal> {
        if self.dry_run {
            for &i in chosen {
                let u = &candidates.unneeded[i];
                // It stays unneeded (and chosen) pass after pass: said once.
                if self.would.insert(u.node.clone()) {
                    info!(node = %u.node, scale_set = %groups[u.group].name, instance = %u.instance_id, pods = u.pods.len(), "dry run: would remove an unneeded node (taint, drain, delete)");
                }
            }
            return Vec::new();
        }
        let s = &self.shared;
        removals_now(candidates, chosen, groups, |g| s.reconciler.delete_hold(g))
    }
}

/// The removals of the `chosen` candidates, in their order, but those of a group whose delete
/// would be `held` now (a backoff, the write budget): no node is tainted and drained for a
/// delete that would not be sent; the node stays unneeded and is chosen again later.
pub(super) fn removals_now<H: std::fmt::Display>(
    candidates: &Candidates,
    chosen: &[usize],
    groups: &[NodeGroupSpec],
    held: impl Fn(&NodeGroupSpec) -> Option<H>,
) -> Vec<Removal> {
    let mut out = Vec::with_capacity(chosen.len());
    for &i in chosen {
        let u = &candidates.unneeded[i];
        let group = groups[u.group].clone();
        if let Some(hold) = held(&group) {
            debug!(node = %u.node, scale_set = %group.name, %hold, "unneeded node not removed yet: its delete would be held");
            continue;
        }
        out.push(Removal {
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
        });
    }
    out
}

impl Shared {
    /// After the taint: no pod landed that the decision did not see, and the node is still
    /// removable against the cluster as it is now ([`crate::pods::recheck`]).
    pub(super) fn recheck(&self, r: &Removal) -> Result<(), String> {
        self.judge(r, recheck)
    }

    /// Between two rounds of a drain: the pods still on the node have room elsewhere, as the
    /// cluster is now ([`crate::pods::recheck::room_left`]). A node gone has nothing left.
    pub(super) fn room_left(&self, r: &Removal) -> Result<(), String> {
        match self.node(&r.node) {
            Some(_) => self.judge(r, room_left),
            None => Ok(()),
        }
    }

    /// `rule` applied to `r`'s node and the cluster as the reflectors show it now.
    fn judge(
        &self,
        r: &Removal,
        rule: impl FnOnce(&Recheck) -> Result<(), String>,
    ) -> Result<(), String> {
        let Some(node) = self.node(&r.node) else {
            return Err("the node is gone".into());
        };
        let busy = self.flight.lock().busy.clone();
        let pods: Vec<_> = self.cluster.pods.snapshot().values().cloned().collect();
        let nodes = self.nodes_by_name();
        let pdbs: Vec<_> = self.cluster.pdbs.snapshot().values().cloned().collect();
        let now = self.wall();
        let volumes = self.cluster.storage.volumes_for(
            pods.iter()
                .filter(|p| p.node_name.as_deref() == Some(r.node.as_str()))
                .filter(|p| !p.long_terminating(now)),
        );
        rule(&Recheck {
            node: &node,
            planned: &r.pods,
            nodes: &nodes,
            pods: &pods,
            pdbs: &pdbs,
            busy: &busy,
            volumes: &volumes,
            namespaces: &self.cluster.namespace_labels(),
            threshold: self.settings.scale_down.utilization_threshold,
            unready: r.unready,
            consolidation: r.consolidation,
            now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::unneeded::Unneeded;

    fn candidates() -> (Candidates, Vec<NodeGroupSpec>) {
        let spec = |name: &str| Removal::of("x", "0", name, &[]).group;
        let unneeded = |node: &str, group: usize, pods: &[&str], unready: bool| Unneeded {
            node: node.into(),
            group,
            instance_id: format!("{node}-id"),
            resource_version: format!("{node}-rv"),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            utilization: 0.1,
            unready,
        };
        let c = Candidates {
            unneeded: vec![
                unneeded("a1", 0, &[], false),
                unneeded("b1", 1, &["uid-p"], false),
                unneeded("a2", 0, &["uid-q"], true),
            ],
            blocked: Default::default(),
        };
        (c, vec![spec("a"), spec("b")])
    }

    #[test]
    fn only_the_chosen_candidates_go_each_as_the_decision_read_it() {
        let (c, groups) = candidates();
        let none = |_: &NodeGroupSpec| None::<String>;
        let rs = removals_now(&c, &[2, 0], &groups, none);
        let nodes: Vec<&str> = rs.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["a2", "a1"], "in the order chosen, b1 not chosen");
        let a2 = &rs[0];
        assert_eq!(a2.group.name, "a");
        assert_eq!(a2.victim.instance_id, "a2-id");
        assert_eq!(
            a2.resource_version, "a2-rv",
            "the taint is written under it"
        );
        assert_eq!(a2.pods, ["uid-q"]);
        assert_eq!((a2.reason(), rs[1].reason()), ("unready", "empty"));
    }

    #[test]
    fn a_node_whose_groups_delete_would_be_held_is_not_tainted_and_the_others_go() {
        let (c, groups) = candidates();
        let held = |g: &NodeGroupSpec| (g.name == "a").then_some("backoff");
        let rs = removals_now(&c, &[0, 1, 2], &groups, held);
        let nodes: Vec<&str> = rs.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["b1"]);
        assert_eq!(rs[0].reason(), "underutilized");
    }
}
