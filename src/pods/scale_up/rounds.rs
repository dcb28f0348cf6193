//! Step 2 of a decision: rounds of estimate and expander, one group chosen per round. Each round
//! keeps every group's answer; the last round's answers say why the pods left over fit nowhere
//! ([`super::why_not`]). A group may be chosen again in a later round (its new nodes so far count
//! toward its max): pods that spread or follow one another may fit it only after other groups
//! grew.

use super::options::quota_room;
use super::{ScaleUpInput, ScaleUpPlan, WhyNot};
use crate::capacity::QuotaPool;
use crate::pods::estimate::{
    batches, estimate_prepared, first_fit, Batch, Estimate, GroupCapacity, Prepared,
};
use crate::pods::expander::Costs;
use crate::pods::fit::NodeState;
use crate::pods::topology::Topology;
use std::collections::HashMap;

/// The state the rounds share.
pub(super) struct Rounds<'p, 'a> {
    pub(super) input: &'p ScaleUpInput<'a>,
    pub(super) templates: &'p [Result<NodeState, WhyNot>],
    pub(super) costs: Costs,
    pub(super) topology: Topology,
    /// The pods no room or new node has taken yet.
    pub(super) pending: Vec<Prepared>,
    /// New nodes per group so far.
    pub(super) added: Vec<u32>,
    /// New nodes of earlier rounds, and their groups: with cross-node rules, a pod refused by a
    /// group then may fit one of them now.
    pub(super) grown: Vec<NodeState>,
    pub(super) grown_group: Vec<usize>,
    /// Every group's answer in the last round.
    pub(super) answers: Vec<(usize, Result<Estimate, WhyNot>)>,
    /// The batches the last round's answers were made for.
    pub(super) round_batches: Vec<Batch>,
    /// The quota pools as the groups chosen so far left them.
    pub(super) quota: Vec<QuotaPool>,
    /// Per group, this round: the max the quota allows when it is below the group's own.
    pub(super) quota_max: Vec<Option<(u32, usize)>>,
}

impl<'p, 'a> Rounds<'p, 'a> {
    pub(super) fn new(
        input: &'p ScaleUpInput<'a>,
        templates: &'p [Result<NodeState, WhyNot>],
        costs: Costs,
        topology: Topology,
        pending: Vec<Prepared>,
    ) -> Self {
        let n = input.groups.len();
        Rounds {
            input,
            templates,
            costs,
            topology,
            pending,
            added: vec![0; n],
            grown: Vec::new(),
            grown_group: Vec::new(),
            answers: Vec::new(),
            round_batches: Vec::new(),
            quota: input.quota.clone(),
            quota_max: vec![None; n],
        }
    }

    /// Rounds until every pod is placed or no group places more. Pods left over while a
    /// share-out plan is in force (the plan may have counted on room the decision could not use:
    /// a quota pool several groups share, attach limits) go on the plain skew, a round at a time,
    /// as the scheduler would place them.
    pub(super) fn run(&mut self, out: &mut ScaleUpPlan) {
        loop {
            while !self.pending.is_empty() {
                out.rounds += 1;
                self.place_on_grown(out);
                if self.pending.is_empty() {
                    break;
                }
                self.estimate(out);
                let Some(k) = self.choose() else {
                    break;
                };
                // The chosen answer leaves the list: it is applied, and a round follows (with
                // its own answers) unless no pod is left, when no reason is asked for.
                let (i, best) = std::mem::replace(
                    &mut self.answers[k],
                    (usize::MAX, Err(WhyNot::new("chosen", "chosen"))),
                );
                let Ok(best) = best else {
                    break;
                };
                self.grow(i, best, out);
            }
            if self.pending.is_empty() || !self.topology.clear_shares() {
                break;
            }
        }
    }

    /// Pods that the new nodes of earlier rounds take now.
    fn place_on_grown(&mut self, out: &mut ScaleUpPlan) {
        if self.grown.is_empty() {
            return;
        }
        let groups = &self.input.groups;
        let mut start = HashMap::new();
        let (grown, grown_group, topology) =
            (&mut self.grown, &self.grown_group, &mut self.topology);
        self.pending
            .retain(|pod| match first_fit(grown, pod, &mut start, topology) {
                Some(n) => {
                    out.triggered
                        .insert(pod.key.clone(), groups[grown_group[n]].name.clone());
                    false
                }
                None => true,
            });
    }

    /// Why group `i` cannot be asked this round, if so.
    fn unavailable(&self, i: usize, out: &ScaleUpPlan) -> Option<WhyNot> {
        let g = &self.input.groups[i];
        if let Some(c) = out.capped.get(&g.name) {
            Some(WhyNot::new(
                "quota",
                format!("already grown in this decision, {c}"),
            ))
        } else if let Some(u) = &g.unhealthy {
            Some(u.clone())
        } else if g.capacity.is_none() {
            Some(WhyNot::new(
                "unknown_size",
                "size unknown: never planned from",
            ))
        } else {
            self.templates[i].as_ref().err().cloned()
        }
    }

    /// Every group's answer for the pods pending now.
    fn estimate(&mut self, out: &ScaleUpPlan) {
        self.answers.clear();
        self.round_batches = batches(&self.pending);
        for i in 0..self.input.groups.len() {
            let answer = match self.unavailable(i, out) {
                Some(why) => Err(why),
                None => self.estimate_group(i),
            };
            self.answers.push((i, answer));
        }
    }

    /// Group `i`'s answer: its estimate from new nodes only (upcoming nodes were filled in
    /// step 1), up to its max or what the quota allows below it.
    fn estimate_group(&mut self, i: usize) -> Result<Estimate, WhyNot> {
        let g = &self.input.groups[i];
        let Ok(template) = &self.templates[i] else {
            return Err(WhyNot::new("no_template", "no template"));
        };
        self.quota_max[i] = None;
        let capacity = u32::try_from(g.capacity.unwrap_or(0).max(0))
            .unwrap_or(u32::MAX)
            .saturating_add(self.added[i]);
        let mut max = g.max;
        if let Some((room, pool)) = quota_room(g, &self.quota) {
            let allowed = capacity.saturating_add(room);
            if allowed < g.max && capacity < g.max {
                if room == 0 {
                    let pool = &self.quota[pool];
                    return Err(WhyNot::new(
                        "quota",
                        format!(
                            "no vCPU quota left: {} has {} vCPUs, a node needs {}",
                            pool,
                            pool.remaining.max(0),
                            g.vcpus.unwrap_or(0)
                        ),
                    ));
                }
                max = allowed;
                self.quota_max[i] = Some((room, pool));
            }
        }
        Ok(estimate_prepared(
            &GroupCapacity {
                name: g.name.clone(),
                template: template.clone(),
                capacity,
                registered: capacity,
                max,
                passed_over: g.passed_over.clone(),
            },
            &self.pending,
            &self.round_batches,
            &self.topology,
        ))
    }
}
