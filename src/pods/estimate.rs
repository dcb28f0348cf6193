//! How many nodes a node group needs for a set of pending pods: first-fit-decreasing bin packing
//! (cluster-autoscaler's binpacking estimator), first onto the nodes already requested but not
//! registered yet (capacity written minus nodes that exist: a pod is never counted twice), then
//! onto new nodes from the group's template, never beyond the group's max. Pure code.

use super::fit::{NodeState, Unfit};
use super::record::PodRecord;
use super::topology::Topology;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What the estimator needs to know of one node group.
#[derive(Debug, Clone)]
pub struct GroupCapacity {
    /// Node-group name.
    pub name: String,
    /// A new node of this group, empty (allocatable minus what DaemonSets would place on it).
    pub template: NodeState,
    /// Capacity Azure has now (written or observed).
    pub capacity: u32,
    /// Nodes of the group registered in the cluster.
    pub registered: u32,
    /// The group's maximum size.
    pub max: u32,
    /// Workloads ([`PodRecord::workload`]) the group is passed over for, with why: an earlier
    /// scale-up of the group for their pods did not help (its nodes came and could not take
    /// them).
    pub passed_over: Arc<BTreeMap<String, String>>,
}

impl GroupCapacity {
    /// Nodes requested but not registered yet: they will come empty and can take pods.
    pub fn upcoming(&self) -> u32 {
        self.capacity.saturating_sub(self.registered)
    }

    /// Room to grow before `max`.
    pub fn headroom(&self) -> u32 {
        self.max.saturating_sub(self.capacity)
    }
}

/// The estimate for one group.
#[derive(Debug, Clone)]
pub struct Estimate {
    /// Node-group name.
    pub group: String,
    /// New nodes to add (beyond the upcoming ones).
    pub new_nodes: u32,
    /// Pods that this plan places (on upcoming or new nodes), by index in the pods given.
    pub placed: Vec<usize>,
    /// Pods that cannot go to this group, with the reason (an empty template node refuses
    /// them, or the group is at its max): per batch, its members from one on (see
    /// [`Estimate::refused_pods`]).
    pub refused: Vec<Refused>,
    /// The simulated new nodes with their pods (for waste, and for the expander).
    pub nodes: Vec<NodeState>,
    /// The decision's cross-node counts with this estimate's pods placed (what the decision
    /// goes on with if the expander chooses it).
    pub topology: Topology,
}

/// The members of one batch a group refuses, and why: once one pod of a batch is refused, the
/// rest are too, for the same reason (they are alike, and a refusal changes nothing).
#[derive(Debug, Clone)]
pub struct Refused {
    /// Index in the batches given.
    pub batch: usize,
    /// The first member refused (by position in the batch).
    pub from: usize,
    /// Why.
    pub why: Refusal,
}

impl Estimate {
    /// Every pod refused, by index in the pods given, with why (`batches`: those given to the
    /// estimate).
    pub fn refused_pods<'a>(
        &'a self,
        batches: &'a [Batch],
    ) -> impl Iterator<Item = (usize, &'a Refusal)> + 'a {
        self.refused.iter().flat_map(move |r| {
            batches[r.batch].members[r.from..]
                .iter()
                .map(move |&m| (m, &r.why))
        })
    }
}

/// Why a pod does not go to a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Even an empty node of the group cannot take it.
    DoesNotFit(Unfit),
    /// It would fit, but the group is at its max.
    AtMax,
    /// An earlier scale-up of the group for this workload did not help: passed over, and why.
    PassedOver(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::DoesNotFit(u) => u.fmt(f),
            Refusal::AtMax => f.write_str("node group at its max size"),
            Refusal::PassedOver(why) => f.write_str(why),
        }
    }
}

/// A pending pod prepared once for many simulations: its key and its equivalence class (its
/// fit facts come with its shape).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The pod.
    pub pod: Arc<PodRecord>,
    /// `namespace/name`.
    pub key: String,
    /// Pods of one class are interchangeable for fit: pods of the same ReplicaSet,
    /// ReplicationController or Job (one template). Every other pod is a class of its own.
    pub class: usize,
}

/// Prepares `pods` (see [`Prepared`]). Two pods share a class when the same ReplicaSet,
/// ReplicationController or Job controls them and their namespace, labels and specs are equal
/// (checked against the class's first pod, so a template change mid-rollout splits the class).
pub fn prepare(pods: &[Arc<PodRecord>]) -> Vec<Prepared> {
    let mut classes: rustc_hash::FxHashMap<&str, Vec<(&PodRecord, usize)>> = Default::default();
    let mut next = 0usize;
    let mut fresh = || {
        next += 1;
        next - 1
    };
    pods.iter()
        .map(|pod| {
            // A generic ephemeral volume's claim is the pod's own (`<pod>-<volume>`), bound or
            // being provisioned on its own: such pods are a class each.
            let own_claims = pod
                .spec()
                .volumes
                .iter()
                .flatten()
                .any(|v| v.ephemeral.is_some());
            let owner = pod
                .controller
                .as_ref()
                .filter(|_| !own_claims)
                .filter(|o| {
                    matches!(
                        o.kind.as_str(),
                        "ReplicaSet" | "ReplicationController" | "Job"
                    )
                })
                .map(|o| o.uid.as_str());
            let class = match owner {
                Some(uid) => {
                    let reps = classes.entry(uid).or_default();
                    // Shared shapes and labels compare by pointer; records built apart by value.
                    let same = |rep: &PodRecord| {
                        (Arc::ptr_eq(&rep.shape, &pod.shape) || rep.spec() == pod.spec())
                            && (Arc::ptr_eq(&rep.labels, &pod.labels) || rep.labels == pod.labels)
                            && rep.namespace == pod.namespace
                    };
                    match reps.iter().find(|(rep, _)| same(rep)) {
                        Some((_, c)) => *c,
                        None => {
                            let c = fresh();
                            reps.push((pod, c));
                            c
                        }
                    }
                }
                None => fresh(),
            };
            Prepared {
                pod: pod.clone(),
                key: pod.key(),
                class,
            }
        })
        .collect()
}

/// Pending pods of one class, in key order: alike for every estimate, so an estimate takes
/// them as a run and, once one is refused, refuses the rest at once (a burst of 20,000 replicas
/// costs what its placed pods cost, not 20,000 refusals per group and round).
#[derive(Debug, Clone)]
pub struct Batch {
    /// Indices of the members in the prepared pods, in key order.
    pub members: Vec<usize>,
}

/// The batches of `pods` (see [`Batch`]), in the order of their first member's key.
pub fn batches(pods: &[Prepared]) -> Vec<Batch> {
    let mut of_class: rustc_hash::FxHashMap<usize, usize> = Default::default();
    let mut out: Vec<Batch> = Vec::new();
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|&a, &b| pods[a].key.cmp(&pods[b].key));
    for i in order {
        let b = *of_class.entry(pods[i].class).or_insert_with(|| {
            out.push(Batch {
                members: Vec::new(),
            });
            out.len() - 1
        });
        out[b].members.push(i);
    }
    out
}

/// The batches in decreasing order of their pods' largest share of the template's cpu or
/// memory (cluster-autoscaler sorts by a score of the same kind), ties by their first key for
/// determinism.
fn decreasing(pods: &[Prepared], batches: &[Batch], template: &NodeState) -> Vec<usize> {
    let share = |p: &Prepared| -> f64 {
        ["cpu", "memory"]
            .iter()
            .map(|k| {
                let alloc = template.allocatable.get(k).copied().unwrap_or(0);
                if alloc <= 0 {
                    0.0
                } else {
                    p.pod.facts().requests.get(k).copied().unwrap_or(0) as f64 / alloc as f64
                }
            })
            .fold(0.0, f64::max)
    };
    let mut v: Vec<(f64, usize)> = batches
        .iter()
        .enumerate()
        .filter_map(|(b, batch)| Some((share(&pods[*batch.members.first()?]), b)))
        .collect();
    let first = |b: usize| &pods[batches[b].members[0]].key;
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| first(a.1).cmp(first(b.1))));
    v.into_iter().map(|(_, b)| b).collect()
}

/// First-fit of `pod` onto `nodes`, skipping the nodes that already refused a pod of its class
/// (`start`): a node only fills up during a simulation, so a node that refused one pod of a
/// class for its own reasons refuses the next. A refusal by other nodes' pods (spread, affinity)
/// may not last, so for those classes only the node's own refusals are skipped. The pod counts
/// in `topology` where it went. Returns the index the pod went to.
pub fn first_fit(
    nodes: &mut [NodeState],
    pod: &Prepared,
    start: &mut HashMap<usize, usize>,
    topology: &mut Topology,
) -> Option<usize> {
    let from = start.get(&pod.class).copied().unwrap_or(0);
    let sticks = topology.refusal_sticks(pod.class);
    let mut first_local = None;
    let found = nodes
        .iter()
        .enumerate()
        .skip(from)
        .find(|(i, n)| {
            if n.fits(&pod.pod).is_err() {
                return false;
            }
            first_local.get_or_insert(*i);
            topology.fits(pod.class, n).is_ok()
        })
        .map(|(i, _)| i);
    let next = if sticks { found } else { first_local };
    start.insert(pod.class, next.unwrap_or(nodes.len()));
    let i = found?;
    nodes[i].place(pod.pod.clone());
    topology.placed(pod.class, &nodes[i]);
    Some(i)
}

/// The nodes of a fixed list grouped by their value for a topology key (see
/// [`Topology::domain_key`]), built once per key: a pod whose rules look at that key alone is
/// tried once per domain against the rules and then first-fit within the domains that allow it.
#[derive(Debug, Default)]
pub struct DomainIndex {
    by_key: HashMap<String, KeyIndex>,
    /// Per (class, domain): the first node in the domain's list that may still take the class.
    start: HashMap<(usize, usize), usize>,
}

/// The nodes grouped by their value of one key, and those left out of the groups.
#[derive(Debug)]
struct KeyIndex {
    domains: Vec<(String, Vec<usize>)>,
    /// Nodes without the key, or with a zone Azure will choose: every rule refuses them for
    /// spread, and the others go the slow way.
    unindexed: Vec<usize>,
}

impl KeyIndex {
    fn new(nodes: &[NodeState], key: &str) -> Self {
        let mut by: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        let mut unindexed = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            match n.labels.get(key) {
                Some(v) if n.zone_variants().is_none() => by.entry(v.clone()).or_default().push(i),
                _ => unindexed.push(i),
            }
        }
        KeyIndex {
            domains: by.into_iter().collect(),
            unindexed,
        }
    }
}

impl DomainIndex {
    /// [`first_fit`] over `nodes` (always the same list for one index), by domain when the
    /// pod's rules allow it.
    pub fn first_fit(
        &mut self,
        nodes: &mut [NodeState],
        pod: &Prepared,
        start: &mut HashMap<usize, usize>,
        topology: &mut Topology,
    ) -> Option<usize> {
        let Some(key) = topology.domain_key(pod.class).map(str::to_string) else {
            return first_fit(nodes, pod, start, topology);
        };
        if !self.by_key.contains_key(&key) {
            let index = KeyIndex::new(nodes, &key);
            self.by_key.insert(key.clone(), index);
        }
        let index = &self.by_key[&key];
        for (d, (_, members)) in index.domains.iter().enumerate() {
            let Some(&first) = members.first() else {
                continue;
            };
            if topology.fits(pod.class, &nodes[first]).is_err() {
                continue;
            }
            let from = self.start.get(&(pod.class, d)).copied().unwrap_or(0);
            let found = members
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, &i)| nodes[i].fits(&pod.pod).is_ok());
            self.start
                .insert((pod.class, d), found.map_or(members.len(), |(k, _)| k));
            if let Some((_, &i)) = found {
                nodes[i].place(pod.pod.clone());
                topology.placed(pod.class, &nodes[i]);
                return Some(i);
            }
        }
        // Nodes the index leaves out (no such label: refused by spread, maybe not by
        // anti-affinity).
        let i = index.unindexed.iter().copied().find(|&i| {
            nodes[i].fits(&pod.pod).is_ok() && topology.fits(pod.class, &nodes[i]).is_ok()
        })?;
        nodes[i].place(pod.pod.clone());
        topology.placed(pod.class, &nodes[i]);
        Some(i)
    }
}

/// First-fit decreasing for one group.
pub fn estimate(group: &GroupCapacity, pods: &[Arc<PodRecord>]) -> Estimate {
    let pods = prepare(pods);
    let topology = Topology::new(
        &pods,
        [],
        &[],
        super::volumes::Volumes::none(),
        super::topology::NamespaceLabels::none(),
    );
    let batches = batches(&pods);
    estimate_prepared(group, &pods, &batches, &topology)
}

/// [`estimate`] for pods already [`prepare`]d and put in their [`batches`] (the scale-up asks
/// many groups about the same pods), against the decision's `topology` as it stands (the
/// estimate works on a copy, returned in [`Estimate::topology`]).
pub fn estimate_prepared(
    group: &GroupCapacity,
    pods: &[Prepared],
    batches: &[Batch],
    topology: &Topology,
) -> Estimate {
    let mut topology = topology.clone();
    let mut nodes: Vec<NodeState> = (0..group.upcoming())
        .map(|i| {
            let mut n = group.template.clone();
            n.name = format!("{}-upcoming-{i}", group.name);
            n
        })
        .collect();
    for n in &nodes {
        topology.node_added(n);
    }
    let upcoming = nodes.len();
    let mut out = Estimate {
        group: group.name.clone(),
        new_nodes: 0,
        placed: Vec::new(),
        refused: Vec::new(),
        nodes: Vec::new(),
        topology: Topology::default(),
    };
    let mut start: HashMap<usize, usize> = HashMap::new();
    for b in decreasing(pods, batches, &group.template) {
        // What an empty node of the group says to this batch's pods (asked once per batch).
        let mut template_says: Option<Result<(), Unfit>> = None;
        for (k, &m) in batches[b].members.iter().enumerate() {
            let pod = &pods[m];
            if let Some(why) = (!group.passed_over.is_empty())
                .then(|| group.passed_over.get(&pod.pod.workload()))
                .flatten()
            {
                out.refused.push(Refused {
                    batch: b,
                    from: k,
                    why: Refusal::PassedOver(why.clone()),
                });
                break;
            }
            if first_fit(&mut nodes, pod, &mut start, &mut topology).is_some() {
                out.placed.push(m);
                continue;
            }
            let refused = |why| Refused {
                batch: b,
                from: k,
                why,
            };
            let verdict = template_says.get_or_insert_with(|| group.template.fits(&pod.pod));
            if let Err(why) = verdict {
                out.refused.push(refused(Refusal::DoesNotFit(why.clone())));
                break;
            }
            if out.new_nodes >= group.headroom() {
                out.refused.push(refused(Refusal::AtMax));
                break;
            }
            let mut n = group.template.clone();
            // Named after the group's size with it: unique across the rounds of a decision.
            n.name = format!(
                "{}-new-{}",
                group.name,
                u64::from(group.capacity) + u64::from(out.new_nodes)
            );
            if let Err(why) = topology.fits(pod.class, &n) {
                out.refused.push(refused(Refusal::DoesNotFit(why)));
                break;
            }
            topology.node_added(&n);
            n.place(pod.pod.clone());
            topology.placed(pod.class, &n);
            nodes.push(n);
            // A node that refused the class for its own reasons keeps refusing it; one that
            // refused it for spread or affinity may take it later, so its start stays.
            if topology.refusal_sticks(pod.class) {
                start.insert(pod.class, nodes.len() - 1);
            }
            out.new_nodes += 1;
            out.placed.push(m);
        }
    }
    out.nodes = nodes.split_off(upcoming);
    out.topology = topology;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::fit::Resources;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn template(cpu_milli: i128, mem_gi: i128) -> NodeState {
        NodeState::new(
            "t",
            BTreeMap::new(),
            Vec::new(),
            Resources::from([
                ("cpu".into(), cpu_milli),
                ("memory".into(), mem_gi * (1 << 30) * 1000),
                ("pods".into(), 110_000),
            ]),
        )
    }

    fn record(v: serde_json::Value) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(serde_json::from_value(v).unwrap()))
    }

    fn pods(n: usize, cpu: &str, prefix: &str) -> Vec<Arc<PodRecord>> {
        (0..n)
            .map(|i| {
                record(json!({
                    "metadata": {"name": format!("{prefix}-{i}"), "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
                }))
            })
            .collect()
    }

    fn group(capacity: u32, registered: u32, max: u32) -> GroupCapacity {
        GroupCapacity {
            name: "g".into(),
            template: template(4000, 16),
            capacity,
            registered,
            max,
            passed_over: Default::default(),
        }
    }

    #[test]
    fn pods_are_packed_first_fit_decreasing_onto_as_few_new_nodes_as_fit() {
        // 3 x 3 cpu and 3 x 1 cpu on 4-cpu nodes: FFD pairs each big pod with a small one.
        let mut p = pods(3, "3", "big");
        p.extend(pods(3, "1", "small"));
        let e = estimate(&group(2, 2, 10), &p);
        assert_eq!(e.new_nodes, 3);
        assert_eq!(e.placed.len(), 6);
        assert!(e.refused.is_empty());
    }

    #[test]
    fn nodes_already_requested_but_not_registered_take_pods_before_new_ones() {
        // Capacity 5 written, 3 nodes registered: 2 upcoming nodes already hold 2 pods each.
        let e = estimate(&group(5, 3, 10), &pods(6, "2", "p"));
        assert_eq!(
            e.new_nodes, 1,
            "4 pods on the 2 upcoming nodes, 2 on one new node"
        );
        assert_eq!(e.placed.len(), 6);
    }

    #[test]
    fn a_group_never_grows_beyond_its_max_and_says_so_per_pod() {
        let e = estimate(&group(9, 9, 10), &pods(3, "3", "p"));
        assert_eq!(e.new_nodes, 1);
        assert_eq!(e.refused.len(), 2);
        assert!(e.refused.iter().all(|r| r.why == Refusal::AtMax));
    }

    #[test]
    fn a_pod_no_node_of_the_group_could_hold_is_refused_with_the_predicate() {
        let e = estimate(&group(1, 1, 10), &pods(1, "5", "huge"));
        assert_eq!(e.new_nodes, 0);
        assert_eq!(e.refused[0].why.to_string(), "Insufficient cpu");
    }

    #[test]
    fn pods_of_one_replica_set_with_different_specs_are_not_taken_for_one_another() {
        // Same controller, a rollout in progress: the 3-cpu pods must not borrow the 1-cpu
        // pods' verdicts (a class is owner plus equal spec).
        let owned = |name: &str, cpu: &str| -> Arc<PodRecord> {
            record(json!({
                "metadata": {"name": name, "namespace": "default",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "rs", "uid": "same", "controller": true}]},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            }))
        };
        let p = vec![
            owned("small-0", "1"),
            owned("big-0", "3"),
            owned("small-1", "1"),
        ];
        let prepared = prepare(&p);
        assert_eq!(prepared[0].class, prepared[2].class);
        assert_ne!(prepared[0].class, prepared[1].class);
        // One 4-cpu node: big + one small; the other small on a second node.
        let e = estimate(&group(0, 0, 10), &p);
        assert_eq!((e.new_nodes, e.placed.len()), (2, 3));
    }

    #[test]
    fn replicas_of_one_set_past_the_max_are_refused_in_one_entry_that_names_each() {
        let replicas: Vec<Arc<PodRecord>> = (0..50)
            .map(|i| {
                record(json!({
                    "metadata": {"name": format!("web-{i:02}"), "namespace": "default",
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "web", "uid": "rs-web", "controller": true}]},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]},
                }))
            })
            .collect();
        let prepared = prepare(&replicas);
        let batches = batches(&prepared);
        assert_eq!(batches.len(), 1, "one ReplicaSet, one spec: one batch");
        let topology = Topology::default();
        // Room for 4 new nodes, one 3-cpu replica each: 46 refused, said once.
        let e = estimate_prepared(&group(6, 6, 10), &prepared, &batches, &topology);
        assert_eq!((e.new_nodes, e.placed.len()), (4, 4));
        assert_eq!(e.refused.len(), 1);
        let refused: Vec<(usize, &Refusal)> = e.refused_pods(&batches).collect();
        assert_eq!(refused.len(), 46);
        assert!(refused.iter().all(|(_, r)| **r == Refusal::AtMax));
        // The first four by name were placed, the rest refused; each pod once.
        let mut seen: Vec<&str> = e
            .placed
            .iter()
            .chain(refused.iter().map(|(i, _)| i))
            .map(|&i| prepared[i].key.as_str())
            .collect();
        assert_eq!(
            seen[..4],
            [
                "default/web-00",
                "default/web-01",
                "default/web-02",
                "default/web-03"
            ]
        );
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 50);
    }

    #[test]
    fn a_thousand_pods_make_one_estimate_in_whole_nodes() {
        let e = estimate(&group(0, 0, 1000), &pods(1000, "500m", "burst"));
        assert_eq!(e.new_nodes, 125, "8 half-cpu pods per 4-cpu node");
        assert_eq!(e.placed.len(), 1000);
    }
}
