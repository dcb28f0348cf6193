//! Why each pod left over fits nowhere: per group, the last round's answer (made for these pods
//! and the last round's batches), said once per batch and given to each of its members.

use super::rounds::Rounds;
use super::{ScaleUpPlan, WhyNot};
use crate::pods::estimate::Refusal;
use std::collections::HashMap;

/// Per batch: which answers gave a reason, and the reasons.
type Reasons = (Vec<bool>, Vec<(String, WhyNot)>);

impl Rounds<'_, '_> {
    /// Fills `out.unfit` for the pods left over.
    pub(super) fn why_not(&self, out: &mut ScaleUpPlan) {
        if self.pending.is_empty() {
            return;
        }
        let mut batch_of = vec![usize::MAX; self.pending.len()];
        for (b, batch) in self.round_batches.iter().enumerate() {
            for &m in &batch.members {
                batch_of[m] = b;
            }
        }
        // Members alike get the same reasons; a member another group's estimate placed has one
        // reason fewer, and its own list.
        let mut reasons: Vec<Option<Reasons>> = vec![None; self.round_batches.len()];
        let refusals: Vec<HashMap<usize, &Refusal>> = self
            .answers
            .iter()
            .map(|(_, a)| match a {
                Ok(e) => e.refused_pods(&self.round_batches).collect(),
                Err(_) => HashMap::new(),
            })
            .collect();
        for (k, p) in self.pending.iter().enumerate() {
            let b = batch_of[k];
            let says: Vec<bool> = self
                .answers
                .iter()
                .zip(&refusals)
                .map(|((_, a), refused)| a.is_err() || refused.contains_key(&k))
                .collect();
            let why = match reasons.get(b).and_then(Option::as_ref) {
                Some((same, w)) if *same == says => w.clone(),
                _ => {
                    let w = self.reasons_for(k, &refusals);
                    if let Some(slot) = reasons.get_mut(b) {
                        *slot = Some((says, w.clone()));
                    }
                    w
                }
            };
            out.unfit.insert(p.key.clone(), why);
        }
    }

    /// Per group that gave one, the reason it does not take pending pod `k`.
    fn reasons_for(
        &self,
        k: usize,
        refusals: &[HashMap<usize, &Refusal>],
    ) -> Vec<(String, WhyNot)> {
        self.answers
            .iter()
            .zip(refusals)
            .filter_map(|((i, a), refused)| {
                let w = match a {
                    Err(w) => w.clone(),
                    Ok(_) => match refused.get(&k)? {
                        Refusal::DoesNotFit(u) => WhyNot::new(u.label(), u.to_string()),
                        Refusal::AtMax => match self.quota_max[*i] {
                            Some((_, pool)) => WhyNot::new(
                                "quota",
                                format!(
                                    "no vCPU quota left for more nodes: {} has {} vCPUs",
                                    self.quota[pool],
                                    self.quota[pool].remaining.max(0)
                                ),
                            ),
                            None => WhyNot::new("max_size", Refusal::AtMax.to_string()),
                        },
                        Refusal::PassedOver(why) => WhyNot::new("did_not_help", why.clone()),
                    },
                };
                Some((self.input.groups[*i].name.clone(), w))
            })
            .collect()
    }
}
