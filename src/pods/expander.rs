//! Which node group to grow when several could take the pending pods: cluster-autoscaler's
//! expanders, `least-waste` (its default), `most-pods`, `priority`, `random` and `price`, plus
//! `least-cost` (Karpenter's cheapest-first), alone or chained as cluster-autoscaler's
//! `--expander=priority,least-waste` is: each expander in turn keeps the options it rates best
//! (ties included), and the last one picks. Pure code: the random choice takes its seed, and the
//! price-aware ones their prices ([`Costs`]), from the caller.

use super::estimate::Estimate;
use std::collections::BTreeMap;

pub use crate::config::Expander;

/// What the price-aware expanders know besides the options.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// Per node group: USD per hour of one new node, and its vCPUs when the VM size is known.
    pub groups: BTreeMap<String, GroupCost>,
    /// Nodes in the cluster: the node size `price` prefers grows with it.
    pub cluster_nodes: usize,
}

/// One group's price and size, as [`Costs`] holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupCost {
    /// USD per hour of one node (the capacity module's sentinel, 999, when nothing prices it).
    pub per_hour: f64,
    /// vCPUs of one node (the VM size's); `None`: taken from the template's allocatable cpu.
    pub vcpus: Option<u32>,
}

/// What a pod's requests are worth per hour, so that options placing different pods can be
/// compared (cluster-autoscaler's `PodPrice`). Azure sells no cpu or memory apart, so the rates
/// split a general-purpose size's list price: `Standard_D2s_v5` (2 vCPU, 8 GiB) at 0.096 $/h in
/// eastus ≈ 2 × 0.0316 + 8 × 0.0042. Only ratios matter: every option is valued at the same rates.
const POD_CPU_PER_CORE_HOUR: f64 = 0.0316;
/// See [`POD_CPU_PER_CORE_HOUR`].
const POD_MEMORY_PER_GIB_HOUR: f64 = 0.0042;
/// cluster-autoscaler's `priceStabilizationPod`: 0.5 cpu and 500 MiB added to both sides of the
/// price ratio, so that one small pod does not make every option look dear.
const STABILIZATION_CPU_CORES: f64 = 0.5;
/// See [`STABILIZATION_CPU_CORES`].
const STABILIZATION_MEMORY_GIB: f64 = 500.0 / 1024.0;
/// cluster-autoscaler's `gpuUnfitnessOverride`: a GPU node's unfitness, so GPU groups are
/// chosen by `price` only when nothing else takes the pods.
const GPU_UNFITNESS: f64 = 1000.0;
/// The GPU resource of a template.
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Picks one of the options (each an estimate that places at least one pod and adds nodes).
/// `None` when there is no option.
pub fn choose<'a>(
    expander: &Expander,
    options: &'a [Estimate],
    seed: u64,
    costs: &Costs,
) -> Option<&'a Estimate> {
    let refs: Vec<&Estimate> = options.iter().collect();
    choose_ref(expander, &refs, seed, costs)
}

/// [`choose`] over borrowed options.
pub fn choose_ref<'a>(
    expander: &Expander,
    options: &[&'a Estimate],
    seed: u64,
    costs: &Costs,
) -> Option<&'a Estimate> {
    let mut viable: Vec<&'a Estimate> = options
        .iter()
        .copied()
        .filter(|o| o.new_nodes > 0 && !o.placed.is_empty())
        .collect();
    if viable.is_empty() {
        return None;
    }
    let (filters, last) = match expander {
        Expander::Chain(list) => match list.split_last() {
            Some((last, filters)) => (filters, last),
            None => (&[][..], &Expander::LeastWaste),
        },
        single => (&[][..], single),
    };
    for filter in filters {
        if viable.len() == 1 {
            break;
        }
        viable = best(filter, &viable, seed, costs);
    }
    pick(last, &viable, seed, costs)
}

/// The options `expander` rates best, ties included (a chain's filter step). Never empty when
/// `options` is not.
fn best<'a>(
    expander: &Expander,
    options: &[&'a Estimate],
    seed: u64,
    costs: &Costs,
) -> Vec<&'a Estimate> {
    let keep_min = |score: &dyn Fn(&Estimate) -> f64| {
        let scores: Vec<f64> = options.iter().map(|o| score(o)).collect();
        let min = scores.iter().copied().fold(f64::INFINITY, f64::min);
        options
            .iter()
            .zip(&scores)
            .filter(|(_, s)| same(**s, min))
            .map(|(o, _)| *o)
            .collect::<Vec<_>>()
    };
    let kept = match expander {
        Expander::LeastWaste => keep_min(&waste),
        Expander::MostPods => keep_min(&|o| -(o.placed.len() as f64)),
        Expander::Priority(tiers) => top_tier(tiers, options),
        Expander::Price => {
            let preferred = preferred_cpu(costs.cluster_nodes);
            keep_min(&|o| price_score(o, costs, preferred).unwrap_or(f64::INFINITY))
        }
        Expander::LeastCost => keep_min(&|o| cost_per_value(o, costs).unwrap_or(f64::INFINITY)),
        Expander::Random | Expander::Chain(_) => {
            pick(expander, options, seed, costs).into_iter().collect()
        }
    };
    if kept.is_empty() {
        options.to_vec()
    } else {
        kept
    }
}

/// Two scores equal up to rounding.
fn same(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// The options of the highest tier any option is in (all of them when none is in a tier).
fn top_tier<'a>(tiers: &[(i32, Vec<String>)], options: &[&'a Estimate]) -> Vec<&'a Estimate> {
    let priority = |o: &Estimate| {
        tiers
            .iter()
            .filter(|(_, patterns)| patterns.iter().any(|p| matches(p, &o.group)))
            .map(|(prio, _)| *prio)
            .max()
    };
    let best = options.iter().filter_map(|o| priority(o)).max();
    match best {
        Some(b) => options
            .iter()
            .copied()
            .filter(|o| priority(o) == Some(b))
            .collect(),
        None => options.to_vec(),
    }
}

/// One option picked by `expander` alone, with its tie-breaks.
fn pick<'a>(
    expander: &Expander,
    viable: &[&'a Estimate],
    seed: u64,
    costs: &Costs,
) -> Option<&'a Estimate> {
    if viable.is_empty() {
        return None;
    }
    match expander {
        Expander::LeastWaste => least_waste(viable),
        Expander::MostPods => viable.iter().copied().max_by(|a, b| {
            a.placed
                .len()
                .cmp(&b.placed.len())
                // Fewer nodes for the same pods, then name order, for determinism.
                .then(b.new_nodes.cmp(&a.new_nodes))
                .then(b.group.cmp(&a.group))
        }),
        Expander::Priority(tiers) => least_waste(&top_tier(tiers, viable)),
        Expander::Price => {
            let preferred = preferred_cpu(costs.cluster_nodes);
            cheapest(viable, |o| price_score(o, costs, preferred))
        }
        Expander::LeastCost => cheapest(viable, |o| cost_per_value(o, costs)),
        Expander::Chain(_) => choose_ref(expander, viable, seed, costs),
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

/// The option of the lowest score; options the score cannot judge (no price for their group)
/// only when none can be judged. Ties: more pods placed, fewer new nodes, then name.
fn cheapest<'a>(
    options: &[&'a Estimate],
    score: impl Fn(&Estimate) -> Option<f64>,
) -> Option<&'a Estimate> {
    let scored: Vec<(&'a Estimate, f64)> = options
        .iter()
        .filter_map(|o| score(o).map(|s| (*o, s)))
        .collect();
    if scored.is_empty() {
        return least_waste(options);
    }
    scored
        .into_iter()
        .min_by(|(a, sa), (b, sb)| {
            let by_score = if same(*sa, *sb) {
                std::cmp::Ordering::Equal
            } else {
                sa.total_cmp(sb)
            };
            by_score
                .then(b.placed.len().cmp(&a.placed.len()))
                .then(a.new_nodes.cmp(&b.new_nodes))
                .then(a.group.cmp(&b.group))
        })
        .map(|(o, _)| o)
}

/// cluster-autoscaler's `SimplePreferredNodeProvider`: the node size (in cores) a cluster of
/// `nodes` nodes prefers, doubling each time the cluster grows about threefold.
pub fn preferred_cpu(nodes: usize) -> f64 {
    match nodes {
        0..=2 => 1.0,
        3..=6 => 2.0,
        7..=20 => 4.0,
        21..=60 => 8.0,
        61..=200 => 16.0,
        _ => 32.0,
    }
}

/// cluster-autoscaler's `SimpleNodeUnfitness`: how many times larger or smaller than the
/// preferred size a node's cpu is (1: exactly it).
pub fn node_unfitness(preferred_cores: f64, node_cores: f64) -> f64 {
    if preferred_cores <= 0.0 || node_cores <= 0.0 {
        return 1.0;
    }
    (preferred_cores / node_cores).max(node_cores / preferred_cores)
}

/// What the pods on an option's new nodes are worth per hour ([`POD_CPU_PER_CORE_HOUR`]).
fn pods_value(o: &Estimate) -> f64 {
    let (mut cpu, mut mem) = (0i128, 0i128);
    for n in &o.nodes {
        cpu += n.requested().get("cpu").copied().unwrap_or(0);
        mem += n.requested().get("memory").copied().unwrap_or(0);
    }
    // Resources are in thousandths: millicores, milli-bytes.
    let cores = cpu as f64 / 1000.0;
    let gib = mem as f64 / 1000.0 / (1u64 << 30) as f64;
    cores * POD_CPU_PER_CORE_HOUR + gib * POD_MEMORY_PER_GIB_HOUR
}

/// USD per hour of an option's new nodes; `None` when its group has no price.
fn nodes_cost(o: &Estimate, costs: &Costs) -> Option<f64> {
    let g = costs.groups.get(&o.group)?;
    Some(g.per_hour * f64::from(o.new_nodes))
}

/// `least-cost`'s score: dollars per hour of the new nodes per dollar of requests they serve.
fn cost_per_value(o: &Estimate, costs: &Costs) -> Option<f64> {
    let value = pods_value(o);
    let cost = nodes_cost(o, costs)?;
    Some(if value > 0.0 {
        cost / value
    } else {
        f64::INFINITY
    })
}

/// cluster-autoscaler's `price` score (lower is better): `(node cost + s) / (pod value + s)`,
/// `s` the stabilisation pod's value, times the node size's unfitness, suppressed as the node
/// count grows (`(u - 1) * (1 - tanh((n - 1) / 15)) + 1`: many nodes of a size away from the
/// preferred one cost little stability). A GPU size's unfitness is [`GPU_UNFITNESS`].
/// cluster-autoscaler's extra factor for node groups that do not exist yet does not apply: every
/// group here exists.
fn price_score(o: &Estimate, costs: &Costs, preferred_cores: f64) -> Option<f64> {
    let node_cost = nodes_cost(o, costs)?;
    let stabilization = STABILIZATION_CPU_CORES * POD_CPU_PER_CORE_HOUR
        + STABILIZATION_MEMORY_GIB * POD_MEMORY_PER_GIB_HOUR;
    let price_ratio = (node_cost + stabilization) / (pods_value(o) + stabilization);
    let template = o.nodes.first();
    let gpu = template
        .and_then(|n| n.allocatable.get(GPU_RESOURCE).copied())
        .unwrap_or(0)
        > 0;
    let unfitness = if gpu {
        GPU_UNFITNESS
    } else {
        let cores = match costs.groups.get(&o.group).and_then(|g| g.vcpus) {
            Some(v) => f64::from(v),
            // Allocatable is a little under the VM's cores: round up to whole cores.
            None => template
                .and_then(|n| n.allocatable.get("cpu").copied())
                .map_or(0.0, |m| (m as f64 / 1000.0).ceil()),
        };
        node_unfitness(preferred_cores, cores)
    };
    let nodes = f64::from(o.new_nodes.max(1));
    let suppressed = (unfitness - 1.0) * (1.0 - ((nodes - 1.0) / 15.0).tanh()) + 1.0;
    Some(suppressed * price_ratio)
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
            choose(&Expander::LeastWaste, &o, 0, &Costs::default())
                .unwrap()
                .group,
            "memory-heavy"
        );
        // Cpu-bound small pods waste the big memory of the memory-heavy group.
        let o = options(&pods(4, "1", "1Gi"));
        assert_eq!(
            choose(&Expander::LeastWaste, &o, 0, &Costs::default())
                .unwrap()
                .group,
            "general"
        );
    }

    #[test]
    fn most_pods_picks_the_option_that_schedules_the_most() {
        let mut o = options(&pods(4, "1", "14Gi"));
        o[1].placed.truncate(1);
        assert_eq!(
            choose(&Expander::MostPods, &o, 0, &Costs::default())
                .unwrap()
                .group,
            "general"
        );
    }

    #[test]
    fn priority_picks_the_highest_tier_and_breaks_ties_by_waste() {
        let o = options(&pods(4, "1", "1Gi"));
        let tiers = vec![
            (10, vec!["memory.*".to_string()]),
            (1, vec![".*".to_string()]),
        ];
        assert_eq!(
            choose(&Expander::Priority(tiers), &o, 0, &Costs::default())
                .unwrap()
                .group,
            "memory-heavy"
        );
        let flat = vec![(1, vec![".*".to_string()])];
        assert_eq!(
            choose(&Expander::Priority(flat), &o, 0, &Costs::default())
                .unwrap()
                .group,
            "general"
        );
    }

    #[test]
    fn random_is_a_function_of_the_seed_and_covers_every_option() {
        let o = options(&pods(2, "1", "1Gi"));
        let picks: std::collections::BTreeSet<String> = (0..32)
            .map(|s| {
                choose(&Expander::Random, &o, s, &Costs::default())
                    .unwrap()
                    .group
                    .clone()
            })
            .collect();
        assert_eq!(picks.len(), 2);
        assert_eq!(
            choose(&Expander::Random, &o, 7, &Costs::default())
                .unwrap()
                .group,
            choose(&Expander::Random, &o, 7, &Costs::default())
                .unwrap()
                .group
        );
    }

    #[test]
    fn no_option_that_adds_nodes_means_no_choice() {
        let mut o = options(&pods(1, "1", "1Gi"));
        for e in &mut o {
            e.new_nodes = 0;
        }
        assert!(choose(&Expander::LeastWaste, &o, 0, &Costs::default()).is_none());
    }

    /// Costs of the given groups: (name, USD per node-hour, vCPUs).
    fn costs(groups: &[(&str, f64, u32)], cluster_nodes: usize) -> Costs {
        Costs {
            groups: groups
                .iter()
                .map(|(n, p, v)| {
                    (
                        n.to_string(),
                        GroupCost {
                            per_hour: *p,
                            vcpus: Some(*v),
                        },
                    )
                })
                .collect(),
            cluster_nodes,
        }
    }

    #[test]
    fn price_picks_the_cheaper_new_nodes_for_the_pods_they_serve() {
        // 4 x (1 cpu, 14 Gi): four general nodes (4 x 0.192) or one memory-heavy (0.504).
        let o = options(&pods(4, "1", "14Gi"));
        assert_eq!((o[0].new_nodes, o[1].new_nodes), (4, 1));
        let c = costs(&[("general", 0.192, 4), ("memory-heavy", 0.504, 4)], 10);
        assert_eq!(
            choose(&Expander::Price, &o, 0, &c).unwrap().group,
            "memory-heavy"
        );
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &c).unwrap().group,
            "memory-heavy"
        );
        // Dearer memory (a rate above four general nodes) turns the choice.
        let c = costs(&[("general", 0.192, 4), ("memory-heavy", 0.9, 4)], 10);
        assert_eq!(
            choose(&Expander::Price, &o, 0, &c).unwrap().group,
            "general"
        );
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &c).unwrap().group,
            "general"
        );
    }

    #[test]
    fn price_prefers_a_node_size_near_the_one_the_clusters_size_suggests() {
        // Same price per vCPU: 4 x 3.5 cpu pods take four 4-vCPU nodes or one 16-vCPU node, for
        // the same dollars. A small cluster prefers small nodes, a large one large nodes.
        let p = pods(4, "3500m", "1Gi");
        let o: Vec<Estimate> = [group("small", 4000, 16), group("large", 16000, 64)]
            .iter()
            .map(|g| estimate(g, &p))
            .collect();
        assert_eq!((o[0].new_nodes, o[1].new_nodes), (4, 1));
        let priced = |n| costs(&[("small", 0.192, 4), ("large", 0.768, 16)], n);
        assert_eq!(
            choose(&Expander::Price, &o, 0, &priced(2)).unwrap().group,
            "small"
        );
        assert_eq!(
            choose(&Expander::Price, &o, 0, &priced(300)).unwrap().group,
            "large"
        );
        // least-cost has no size preference: the tie goes to more pods, fewer nodes: large.
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &priced(2))
                .unwrap()
                .group,
            "large"
        );
        assert_eq!(preferred_cpu(2), 1.0);
        assert_eq!(preferred_cpu(300), 32.0);
        assert_eq!(node_unfitness(4.0, 16.0), 4.0);
        assert_eq!(node_unfitness(16.0, 4.0), 4.0);
    }

    #[test]
    fn a_spot_group_priced_below_its_on_demand_twin_is_chosen() {
        use crate::capacity::prices::{node_price, SizePrice};
        let p = pods(2, "1", "1Gi");
        let o: Vec<Estimate> = [group("on-demand", 4000, 16), group("spot", 4000, 16)]
            .iter()
            .map(|g| estimate(g, &p))
            .collect();
        let d4 = SizePrice {
            on_demand: Some(0.192),
            spot: Some(0.0192),
        };
        let c = costs(
            &[
                ("on-demand", node_price(Some(d4), false), 4),
                ("spot", node_price(Some(d4), true), 4),
            ],
            5,
        );
        assert_eq!(choose(&Expander::Price, &o, 0, &c).unwrap().group, "spot");
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &c).unwrap().group,
            "spot"
        );
        // Without a spot price known, spot costs its on-demand cap: a tie, broken by name.
        let od = SizePrice {
            on_demand: Some(0.192),
            spot: None,
        };
        let c = costs(
            &[
                ("on-demand", node_price(Some(od), false), 4),
                ("spot", node_price(Some(od), true), 4),
            ],
            5,
        );
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &c).unwrap().group,
            "on-demand"
        );
    }

    #[test]
    fn a_configured_rate_wins_over_the_list_price() {
        use crate::capacity::prices::PriceBook;
        use crate::config::PriceSettings;
        let o = options(&pods(4, "1", "14Gi"));
        let mut settings = PriceSettings {
            fetch: false,
            ..PriceSettings::default()
        };
        let failures =
            prometheus::IntCounterVec::new(prometheus::Opts::new("f", "f"), &["reason"]).unwrap();
        let priced = |book: &PriceBook| {
            costs(
                &[
                    (
                        "general",
                        book.group_price("general", "eastus", "Standard_D4s_v5", false)
                            .per_hour,
                        4,
                    ),
                    (
                        "memory-heavy",
                        book.group_price("memory-heavy", "eastus", "Standard_E16s_v5", false)
                            .per_hour,
                        4,
                    ),
                ],
                10,
            )
        };
        // List prices: one E16s_v5 (1.008) dearer than four D4s_v5 (0.768).
        let list = PriceBook::new(settings.clone(), failures.clone());
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &priced(&list))
                .unwrap()
                .group,
            "general"
        );
        // A negotiated rate for memory-heavy makes it the cheaper one.
        settings.overrides.insert("memory-heavy".into(), 0.4);
        let negotiated = PriceBook::new(settings, failures);
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &priced(&negotiated))
                .unwrap()
                .group,
            "memory-heavy"
        );
    }

    #[test]
    fn a_group_nothing_prices_is_never_the_cheaper_choice() {
        use crate::capacity::prices::MISSING_PRICE;
        let o = options(&pods(4, "1", "1Gi"));
        let c = costs(
            &[("general", MISSING_PRICE, 4), ("memory-heavy", 0.504, 4)],
            3,
        );
        assert_eq!(
            choose(&Expander::Price, &o, 0, &c).unwrap().group,
            "memory-heavy"
        );
        assert_eq!(
            choose(&Expander::LeastCost, &o, 0, &c).unwrap().group,
            "memory-heavy"
        );
    }

    #[test]
    fn a_chain_narrows_in_order_and_the_last_expander_picks() {
        // Cpu-bound pods: least-waste alone picks general.
        let o = options(&pods(4, "1", "1Gi"));
        let c = costs(&[("general", 0.192, 4), ("memory-heavy", 0.1, 4)], 3);
        assert_eq!(
            choose(&Expander::LeastWaste, &o, 0, &c).unwrap().group,
            "general"
        );
        // price first: memory-heavy is cheaper, so it is the only one left for least-waste.
        let chain = Expander::Chain(vec![Expander::Price, Expander::LeastWaste]);
        assert_eq!(choose(&chain, &o, 0, &c).unwrap().group, "memory-heavy");
        // priority first: both in one tier, so price decides among them.
        let tiers = vec![(1, vec![".*".to_string()])];
        let chain = Expander::Chain(vec![Expander::Priority(tiers), Expander::Price]);
        assert_eq!(choose(&chain, &o, 0, &c).unwrap().group, "memory-heavy");
        // priority first with general alone on top: price never sees memory-heavy.
        let tiers = vec![
            (10, vec!["general".to_string()]),
            (1, vec![".*".to_string()]),
        ];
        let chain = Expander::Chain(vec![Expander::Priority(tiers), Expander::Price]);
        assert_eq!(choose(&chain, &o, 0, &c).unwrap().group, "general");
        assert_eq!(chain.name(), "priority,price");
        assert!(chain.uses_prices());
        assert!(!Expander::Chain(vec![Expander::MostPods, Expander::Random]).uses_prices());
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
