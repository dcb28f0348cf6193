//! Which node group to grow when several could take the pending pods: cluster-autoscaler's
//! expanders, `least-waste` (its default), `most-pods`, `priority` and `random`. Pure code: the
//! random choice takes its seed from the caller.

use super::estimate::Estimate;

/// An expander, as `--expander` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expander {
    /// The option whose new nodes would leave the least cpu and memory unused (the default).
    LeastWaste,
    /// The option that schedules the most pods.
    MostPods,
    /// The option of the highest-priority group: `(priority, name regexes)` tiers, higher first;
    /// ties are broken by least waste.
    Priority(Vec<(i32, Vec<String>)>),
    /// Any option, chosen by the seed.
    Random,
}

/// Picks one of the options (each an estimate that places at least one pod and adds nodes).
/// `None` when there is no option.
pub fn choose<'a>(expander: &Expander, options: &'a [Estimate], seed: u64) -> Option<&'a Estimate> {
    let refs: Vec<&Estimate> = options.iter().collect();
    choose_ref(expander, &refs, seed)
}

/// [`choose`] over borrowed options.
pub fn choose_ref<'a>(
    expander: &Expander,
    options: &[&'a Estimate],
    seed: u64,
) -> Option<&'a Estimate> {
    let viable: Vec<&'a Estimate> = options
        .iter()
        .copied()
        .filter(|o| o.new_nodes > 0 && !o.placed.is_empty())
        .collect();
    if viable.is_empty() {
        return None;
    }
    match expander {
        Expander::LeastWaste => least_waste(&viable),
        Expander::MostPods => viable.iter().copied().max_by(|a, b| {
            a.placed
                .len()
                .cmp(&b.placed.len())
                // Fewer nodes for the same pods, then name order, for determinism.
                .then(b.new_nodes.cmp(&a.new_nodes))
                .then(b.group.cmp(&a.group))
        }),
        Expander::Priority(tiers) => {
            let priority = |o: &Estimate| {
                tiers
                    .iter()
                    .filter(|(_, patterns)| patterns.iter().any(|p| matches(p, &o.group)))
                    .map(|(prio, _)| *prio)
                    .max()
            };
            let best = viable.iter().filter_map(|o| priority(o)).max();
            let top: Vec<&Estimate> = match best {
                Some(b) => viable
                    .iter()
                    .copied()
                    .filter(|o| priority(o) == Some(b))
                    .collect(),
                None => viable.clone(),
            };
            least_waste(&top)
        }
        Expander::Random => {
            // splitmix64: a fixed, documented mapping from seed to index.
            let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            viable.get((z % viable.len() as u64) as usize).copied()
        }
    }
}

/// cluster-autoscaler's least-waste score: unused cpu share plus unused memory share of the new
/// nodes; lower is better. Ties: more pods placed, then name.
fn least_waste<'a>(options: &[&'a Estimate]) -> Option<&'a Estimate> {
    options.iter().copied().min_by(|a, b| {
        waste(a)
            .total_cmp(&waste(b))
            .then(b.placed.len().cmp(&a.placed.len()))
            .then(a.group.cmp(&b.group))
    })
}

/// Unused share of cpu plus unused share of memory over an option's new nodes.
pub fn waste(o: &Estimate) -> f64 {
    ["cpu", "memory"]
        .iter()
        .map(|r| {
            let (mut alloc, mut used) = (0i128, 0i128);
            for n in &o.nodes {
                alloc += n.allocatable.get(r).copied().unwrap_or(0);
                used += n.requested().get(r).copied().unwrap_or(0);
            }
            if alloc <= 0 {
                0.0
            } else {
                (alloc - used) as f64 / alloc as f64
            }
        })
        .sum()
}

/// A priority pattern is a regular expression matched against the whole group name, as the
/// priority expander's are. An invalid one matches nothing (configuration validation reports it).
fn matches(pattern: &str, name: &str) -> bool {
    regex::Regex::new(&format!("^(?:{pattern})$")).is_ok_and(|re| re.is_match(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::estimate::{estimate, GroupCapacity};
    use crate::pods::fit::{NodeState, Resources};
    use crate::pods::record::PodRecord;
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn group(name: &str, cpu: i128, mem_gi: i128) -> GroupCapacity {
        GroupCapacity {
            name: name.into(),
            template: NodeState::new(
                name,
                BTreeMap::new(),
                Vec::new(),
                Resources::from([
                    ("cpu".into(), cpu),
                    ("memory".into(), mem_gi * (1 << 30) * 1000),
                    ("pods".into(), 110_000),
                ]),
            ),
            capacity: 0,
            registered: 0,
            max: 10,
            passed_over: Default::default(),
        }
    }

    fn pods(n: usize, cpu: &str, mem: &str) -> Vec<Arc<PodRecord>> {
        (0..n)
            .map(|i| {
                Arc::new(PodRecord::of(
                    serde_json::from_value(json!({
                        "metadata": {"name": format!("p-{i}"), "namespace": "default"},
                        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]},
                    }))
                    .unwrap(),
                ))
            })
            .collect()
    }

    fn options(p: &[Arc<PodRecord>]) -> Vec<Estimate> {
        [group("general", 4000, 16), group("memory-heavy", 4000, 64)]
            .iter()
            .map(|g| estimate(g, p))
            .collect()
    }

    #[test]
    fn least_waste_picks_the_group_whose_new_nodes_are_used_best() {
        // Memory-hungry pods: 4 x (1 cpu, 14 Gi) fill a 64 Gi node well and need 4 general nodes.
        let o = options(&pods(4, "1", "14Gi"));
        assert_eq!(
            choose(&Expander::LeastWaste, &o, 0).unwrap().group,
            "memory-heavy"
        );
        // Cpu-bound small pods waste the big memory of the memory-heavy group.
        let o = options(&pods(4, "1", "1Gi"));
        assert_eq!(
            choose(&Expander::LeastWaste, &o, 0).unwrap().group,
            "general"
        );
    }

    #[test]
    fn most_pods_picks_the_option_that_schedules_the_most() {
        let mut o = options(&pods(4, "1", "14Gi"));
        o[1].placed.truncate(1);
        assert_eq!(choose(&Expander::MostPods, &o, 0).unwrap().group, "general");
    }

    #[test]
    fn priority_picks_the_highest_tier_and_breaks_ties_by_waste() {
        let o = options(&pods(4, "1", "1Gi"));
        let tiers = vec![
            (10, vec!["memory.*".to_string()]),
            (1, vec![".*".to_string()]),
        ];
        assert_eq!(
            choose(&Expander::Priority(tiers), &o, 0).unwrap().group,
            "memory-heavy"
        );
        let flat = vec![(1, vec![".*".to_string()])];
        assert_eq!(
            choose(&Expander::Priority(flat), &o, 0).unwrap().group,
            "general"
        );
    }

    #[test]
    fn random_is_a_function_of_the_seed_and_covers_every_option() {
        let o = options(&pods(2, "1", "1Gi"));
        let picks: std::collections::BTreeSet<String> = (0..32)
            .map(|s| choose(&Expander::Random, &o, s).unwrap().group.clone())
            .collect();
        assert_eq!(picks.len(), 2);
        assert_eq!(
            choose(&Expander::Random, &o, 7).unwrap().group,
            choose(&Expander::Random, &o, 7).unwrap().group
        );
    }

    #[test]
    fn no_option_that_adds_nodes_means_no_choice() {
        let mut o = options(&pods(1, "1", "1Gi"));
        for e in &mut o {
            e.new_nodes = 0;
        }
        assert!(choose(&Expander::LeastWaste, &o, 0).is_none());
    }

    #[test]
    fn priority_patterns_are_anchored() {
        assert!(matches("gpu.*", "gpu-a100"));
        assert!(!matches("gpu.*", "big-gpu"));
        assert!(matches(".*gpu", "big-gpu"));
        assert!(matches(".*gpu.*", "a-gpu-b"));
        assert!(matches("general", "general"));
        assert!(!matches("general", "general-2"));
        assert!(matches("pool-[ab]", "pool-b"));
        assert!(
            !matches("(", "anything"),
            "an invalid pattern matches nothing"
        );
    }
}
