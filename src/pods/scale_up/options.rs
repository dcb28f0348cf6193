//! The options of a decision: which groups may grow and by how many nodes (their max, the quota
//! left), and what the price-aware expanders weigh.

use super::{GroupInput, ScaleUpInput, WhyNot};
use crate::capacity::QuotaPool;
use crate::pods::expander::{Costs, GroupCost};
use crate::pods::fit::NodeState;
use std::collections::HashMap;

/// How many new nodes of `g` the quota allows, and the pool that allows fewest
/// (`None`: not capped).
pub(super) fn quota_room(g: &GroupInput, pools: &[QuotaPool]) -> Option<(u32, usize)> {
    let vcpus = i64::from(g.vcpus?.max(1));
    g.quota
        .iter()
        .filter_map(|&p| Some((pools.get(p)?.remaining.max(0) / vcpus, p)))
        .min_by_key(|(n, _)| *n)
        .map(|(n, p)| (u32::try_from(n).unwrap_or(u32::MAX), p))
}

/// The groups that may grow (healthy, with a template, below their max and with quota left),
/// each with its template and how many nodes it may offer a share-out.
pub(super) struct Options<'t> {
    /// The templates of the groups that may grow: a zone only they serve is a domain with no
    /// pods yet, and none is when they cannot grow (a zone whose group is out of quota is not
    /// one the pods can spread to, and the scheduler will not count it either).
    pub possible: Vec<&'t NodeState>,
    /// Per group that may grow, its template and the nodes a share-out may count on: a quota
    /// pool several of these groups draw on is split evenly between them, so the plan never
    /// reserves more than the pool holds (a group that could take more simply gets less of the
    /// plan; the rest go a round at a time).
    pub offers: Vec<(&'t NodeState, u32)>,
}

impl<'t> Options<'t> {
    /// The options of `input`'s groups, whose templates are `templates`.
    pub(super) fn of(input: &ScaleUpInput, templates: &'t [Result<NodeState, WhyNot>]) -> Self {
        let growable: Vec<(&GroupInput, &NodeState, u32)> = input
            .groups
            .iter()
            .zip(templates)
            .filter(|(g, _)| g.unhealthy.is_none())
            .filter_map(|(g, t)| {
                let t = t.as_ref().ok()?;
                let headroom = u32::try_from(i64::from(g.max) - g.capacity?).ok()?;
                let headroom =
                    quota_room(g, &input.quota).map_or(headroom, |(q, _)| q.min(headroom));
                Some((g, t, headroom))
            })
            .filter(|(_, _, n)| *n > 0)
            .collect();
        let mut sharing: HashMap<usize, i64> = HashMap::new();
        for (g, _, _) in &growable {
            for &p in &g.quota {
                *sharing.entry(p).or_default() += 1;
            }
        }
        let offers = growable
            .iter()
            .map(|(g, t, headroom)| {
                let vcpus = i64::from(g.vcpus.unwrap_or(0).max(1));
                let pooled = g
                    .quota
                    .iter()
                    .filter_map(|p| {
                        let pool = input.quota.get(*p)?;
                        Some(pool.remaining.max(0) / vcpus / sharing[p].max(1))
                    })
                    .min();
                let n = pooled.map_or(*headroom, |q| {
                    u32::try_from(q).unwrap_or(u32::MAX).min(*headroom)
                });
                (*t, n)
            })
            .collect();
        Options {
            possible: growable.iter().map(|(_, t, _)| *t).collect(),
            offers,
        }
    }
}

/// What the price-aware expanders weigh: each group's price and size, the cluster's size.
pub(super) fn costs(input: &ScaleUpInput) -> Costs {
    Costs {
        groups: input
            .groups
            .iter()
            .filter_map(|g| {
                let per_hour = *input.prices.get(&g.name)?;
                Some((
                    g.name.clone(),
                    GroupCost {
                        per_hour,
                        vcpus: g.vcpus,
                    },
                ))
            })
            .collect(),
        cluster_nodes: input.nodes.len(),
    }
}
