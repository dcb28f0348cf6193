//! The end of a round: the expander chooses among the groups' estimates, and the choice is
//! applied: the new nodes (balanced over similar groups when asked), the targets, the quota they
//! draw, the pods they take, and the nodes later rounds count.

use super::balance::{balance, similar};
use super::rounds::Rounds;
use super::{QuotaCapped, ScaleUpPlan};
use crate::pods::estimate::Estimate;
use crate::pods::expander::choose_ref;
use crate::pods::fit::NodeState;
use crate::pods::record::PodRecord;
use std::collections::HashSet;
use std::sync::Arc;

impl Rounds<'_, '_> {
    /// The expander's choice among this round's estimates: its index in `answers`.
    pub(super) fn choose(&self) -> Option<usize> {
        let options: Vec<&Estimate> = self
            .answers
            .iter()
            .filter_map(|(_, a)| a.as_ref().ok())
            .collect();
        let best = choose_ref(&self.input.expander, &options, self.input.seed, &self.costs)?;
        self.answers
            .iter()
            .position(|(_, a)| a.as_ref().is_ok_and(|e| std::ptr::eq(e, best)))
    }

    /// Applies group `i`'s estimate `best`.
    pub(super) fn grow(&mut self, i: usize, best: Estimate, out: &mut ScaleUpPlan) {
        let groups = &self.input.groups;
        // What quota cut short, against the pool as it was before this group drew on it.
        if let Some((room, pool)) = self.quota_max[i] {
            if best.new_nodes >= room {
                out.capped.insert(
                    groups[i].name.clone(),
                    QuotaCapped {
                        nodes: best.new_nodes,
                        pool: self.quota[pool].to_string(),
                        remaining: self.quota[pool].remaining,
                    },
                );
            }
        }
        let split = self.split(i, &best, out);
        self.record(&split, out);
        for &p in &best.placed {
            out.triggered
                .insert(self.pending[p].key.clone(), groups[i].name.clone());
        }
        self.deal(i, &best, &split, out);
        if !self.topology.is_empty() {
            self.topology = best.topology;
        }
        let mut placed = vec![false; self.pending.len()];
        for &p in &best.placed {
            placed[p] = true;
        }
        let mut k = 0;
        self.pending.retain(|_| {
            k += 1;
            !placed[k - 1]
        });
    }

    /// How group `i`'s new nodes are shared out. With `balanceSimilarNodeGroups`, over the groups
    /// similar to the chosen one that take every placed pod too (not when quota bounds the
    /// choice); not when a placed pod spreads or follows others: its count is in the chosen
    /// group's zone.
    fn split(&self, i: usize, best: &Estimate, out: &ScaleUpPlan) -> Vec<(usize, u32)> {
        let groups = &self.input.groups;
        let spreads = best
            .placed
            .iter()
            .any(|&p| self.topology.involves(self.pending[p].class));
        if !self.input.balance_similar || self.quota_max[i].is_some() || spreads {
            return vec![(i, best.new_nodes)];
        }
        // One pod per batch is enough: its members are alike.
        let mut seen = HashSet::new();
        let pods: Vec<&Arc<PodRecord>> = best
            .placed
            .iter()
            .map(|&p| &self.pending[p])
            .filter(|p| seen.insert(p.class))
            .map(|p| &p.pod)
            .collect();
        let takes_all = |j: usize| match (&self.templates[i], &self.templates[j]) {
            (Ok(a), Ok(b)) => similar(a, b) && pods.iter().all(|p| b.fits(p).is_ok()),
            _ => false,
        };
        let members: Vec<usize> = std::iter::once(i)
            .chain((0..groups.len()).filter(|&j| {
                j != i
                    && !out.capped.contains_key(&groups[j].name)
                    && groups[j].unhealthy.is_none()
                    && groups[j].capacity.is_some()
                    && self.quota_max[j].is_none()
                    && takes_all(j)
            }))
            .collect();
        balance(best.new_nodes, &members, groups, &self.added)
    }

    /// Each share's new nodes: the group's target and template, and the quota it draws.
    fn record(&mut self, split: &[(usize, u32)], out: &mut ScaleUpPlan) {
        for &(m, new_nodes) in split {
            let g = &self.input.groups[m];
            self.added[m] = self.added[m].saturating_add(new_nodes);
            let capacity = g.capacity.unwrap_or(0).max(0);
            let target = (capacity + i64::from(self.added[m])).max(i64::from(g.min));
            out.targets.insert(g.name.clone(), target);
            if let Ok(t) = &self.templates[m] {
                out.templates
                    .entry(g.name.clone())
                    .or_insert_with(|| t.clone());
            }
            let drawn = i64::from(new_nodes) * i64::from(g.vcpus.unwrap_or(0));
            for &p in &g.quota {
                if let Some(pool) = self.quota.get_mut(p) {
                    pool.remaining -= drawn;
                }
            }
        }
    }

    /// The estimate's new nodes, dealt out to the groups that take them (in the order of the
    /// split): a node another group adds is that group's template with the same pods, so its
    /// labels (zone) are the ones later rounds count, and its pods say which group they
    /// triggered. Kept for later rounds only when pods follow one another across nodes.
    fn deal(&mut self, i: usize, best: &Estimate, split: &[(usize, u32)], out: &mut ScaleUpPlan) {
        let groups = &self.input.groups;
        let mut nodes = best.nodes.iter();
        // An estimate's node is group i's template (with its DaemonSet pods) and then the pods
        // placed on it: only those move to another group's template.
        let base = self.templates[i].as_ref().map_or(0, |t| t.pods().len());
        for &(m, k) in split {
            let first = self.added[m] - k;
            let capacity = u64::try_from(groups[m].capacity.unwrap_or(0).max(0)).unwrap_or(0);
            for (j, n) in nodes.by_ref().take(k as usize).enumerate() {
                let n: NodeState = match (m == i, &self.templates[m]) {
                    (false, Ok(t)) => {
                        let mut moved = t.clone();
                        moved.name = format!(
                            "{}-new-{}",
                            groups[m].name,
                            capacity + u64::from(first) + j as u64
                        );
                        for p in n.pods().get(base..).unwrap_or_default() {
                            out.triggered.insert(p.key(), groups[m].name.clone());
                            moved.place(p.clone());
                        }
                        moved
                    }
                    _ => n.clone(),
                };
                if !self.topology.is_empty() {
                    self.grown.push(n);
                    self.grown_group.push(m);
                }
            }
        }
    }
}
