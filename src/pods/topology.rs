//! The filters that look beyond one node, as kube-scheduler decides them: pod topology spread
//! (`PodTopologySpread`, constraints with `whenUnsatisfiable: DoNotSchedule`) and required
//! inter-pod affinity and anti-affinity on any topology key (`InterPodAffinity`). Required
//! anti-affinity on `kubernetes.io/hostname` is a question about one node and stays in
//! [`NodeState::fits`]; everything else a pending pod asks of other nodes' pods is here.
//!
//! A [`Topology`] is built once per decision for the pending pods' classes (pods of one
//! ReplicaSet ask the same), from every node and the pods bound to it, and follows the
//! simulation: each pod the decision places on a node, live or new, is counted where it went, so
//! the sixth pod of a zone-spread Deployment sees the five placed before it. Counting follows the
//! scheduler:
//!
//! - **spread**: pods in the pod's namespace matching the constraint's selector (with
//!   `matchLabelKeys` folded in), per value of `topologyKey`, over the nodes that have every
//!   constraint's key and pass `nodeAffinityPolicy` (default `Honor`: the pod's node selector and
//!   required node affinity) and `nodeTaintsPolicy` (default `Ignore`); the skew of a node is its
//!   domain's count, plus one if the pod matches its own selector, minus the smallest count over
//!   the domains (0 when there are fewer domains than `minDomains`). The zone of a group that may
//!   grow and has no node yet is a domain with no pods (Karpenter counts the zones a NodePool
//!   offers the same way; cluster-autoscaler adds only the estimated group's template nodes).
//!   Pods being deleted do not count, as the scheduler skips them.
//!   `ScheduleAnyway` constraints are preferences and never block.
//! - **affinity**: every required term must find a matching pod in the node's domain; a pod
//!   whose terms match no pod anywhere may still go anywhere if it matches its own terms (the
//!   first pod of a group).
//! - **anti-affinity**: no pod matching the pod's terms in the node's domain, and no pod whose
//!   own terms match this pod there (both directions).
//!
//! A group spanning several zones cannot say which zone its next node lands in (Azure chooses):
//! a constraint whose key differs between those zones holds there only if it holds in every
//! one (affinity, anti-affinity), and spread is refused outright, since the count could land in
//! any zone. Pure code.

use super::estimate::Prepared;
use super::fit::{label_selector_matches, tolerates, NodeState, Unfit, HOSTNAME};
use super::record::PodRecord;
use super::volumes::{Needs, Verdict, Volumes};
use k8s_openapi::api::core::v1::{PodAffinityTerm, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Where a node is for a topology key.
enum Domain<'a> {
    /// One value.
    One(&'a str),
    /// The node does not have the key.
    Missing,
    /// A new node of a group spanning several zones: one of these, Azure chooses.
    Several(Vec<&'a str>),
}

/// The node's value for `key`: its name for `kubernetes.io/hostname` (a new node's label is its
/// template's), the label otherwise.
fn domain<'a>(node: &'a NodeState, key: &str) -> Domain<'a> {
    if key == HOSTNAME {
        return Domain::One(&node.name);
    }
    if let Some(variants) = node.zone_variants() {
        let mut values: Vec<&str> = variants
            .iter()
            .filter_map(|l| l.get(key).map(String::as_str))
            .collect();
        values.sort_unstable();
        values.dedup();
        let everywhere = variants.iter().all(|l| l.contains_key(key));
        return match (values.as_slice(), everywhere) {
            ([], _) => Domain::Missing,
            ([one], true) => Domain::One(one),
            _ => Domain::Several(values),
        };
    }
    match node.labels.get(key) {
        Some(v) => Domain::One(v),
        None => Domain::Missing,
    }
}

/// Which namespaces' pods a term counts.
#[derive(Debug, Clone)]
enum Namespaces {
    /// Every namespace (an empty `namespaceSelector`).
    All,
    /// These (the pod's own when the term names none).
    List(Vec<String>),
}

impl Namespaces {
    /// As the scheduler reads a term: the namespaces it lists and those its
    /// `namespaceSelector` matches (an empty selector: every namespace); neither: the pod's own.
    fn of_term(term: &PodAffinityTerm, own: &str, labels: &NamespaceLabels) -> Self {
        let listed = term.namespaces.clone().unwrap_or_default();
        match &term.namespace_selector {
            Some(s) if super::fit::is_empty_selector(s) => Namespaces::All,
            Some(s) => {
                let mut list = listed;
                list.extend(labels.matching(s));
                Namespaces::List(list)
            }
            None if listed.is_empty() => Namespaces::List(vec![own.to_string()]),
            None => Namespaces::List(listed),
        }
    }

    fn contains(&self, ns: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::List(l) => l.iter().any(|n| n == ns),
        }
    }
}

/// The namespaces of the cluster with their labels, for terms that pick namespaces by them
/// (`namespaceSelector`), from the Namespace reflector.
#[derive(Debug, Clone, Default)]
pub struct NamespaceLabels(HashMap<String, BTreeMap<String, String>>);

impl NamespaceLabels {
    /// The labels of `namespaces` (name, labels).
    pub fn new(namespaces: impl IntoIterator<Item = (String, BTreeMap<String, String>)>) -> Self {
        Self(namespaces.into_iter().collect())
    }

    /// No namespace known: a selector matches none.
    pub fn none() -> &'static NamespaceLabels {
        static NONE: std::sync::LazyLock<NamespaceLabels> =
            std::sync::LazyLock::new(NamespaceLabels::default);
        &NONE
    }

    /// The namespaces `selector` matches, by name, sorted.
    fn matching(&self, selector: &LabelSelector) -> Vec<String> {
        let mut out: Vec<String> = self
            .0
            .iter()
            .filter(|(_, labels)| label_selector_matches(selector, labels))
            .map(|(name, _)| name.clone())
            .collect();
        out.sort_unstable();
        out
    }
}

/// What a counted rule asks.
#[derive(Debug, Clone)]
enum Kind {
    /// A `DoNotSchedule` topology spread constraint.
    Spread {
        max_skew: i32,
        min_domains: i32,
        self_match: bool,
        honor_affinity: bool,
        honor_taints: bool,
    },
    /// A required pod affinity term.
    Affinity { self_match: bool },
    /// A required pod anti-affinity term on a key other than the hostname.
    AntiAffinity,
}

/// One rule of a pending pod that counts matching pods per domain.
#[derive(Debug, Clone)]
struct Counted {
    kind: Kind,
    key: String,
    namespaces: Namespaces,
    selector: Option<LabelSelector>,
    /// Affinity: the pod's other required affinity terms. The scheduler counts, for each term,
    /// only the pods that match every term.
    also: Vec<(Namespaces, Option<LabelSelector>)>,
    /// Matching pods per domain; for spread, every eligible domain is here (0 when empty).
    counts: FxHashMap<Arc<str>, i32>,
    /// Spread: how many domains have each count (the smallest key is the global minimum).
    histogram: BTreeMap<i32, u32>,
    /// Matching pods on nodes that have the key.
    total: i32,
    /// Spread: pods of the owner's class this decision means to place per domain (see
    /// [`Topology::share_out`]) and has not placed yet. They count toward the other domains'
    /// sizes, so one group's estimate may fill its zone's share at once instead of one pod
    /// per round.
    reserved: FxHashMap<Arc<str>, i32>,
}

impl Counted {
    fn selects(&self, pod: &PodRecord) -> bool {
        let one = |namespaces: &Namespaces, selector: &Option<LabelSelector>| {
            namespaces.contains(&pod.namespace)
                && selector
                    .as_ref()
                    .is_some_and(|s| label_selector_matches(s, &pod.labels))
        };
        one(&self.namespaces, &self.selector) && self.also.iter().all(|(n, s)| one(n, s))
    }

    fn is_spread(&self) -> bool {
        matches!(self.kind, Kind::Spread { .. })
    }

    /// Makes `d` a domain (spread), with no pods if it is new.
    fn ensure(&mut self, d: &str) {
        if !self.counts.contains_key(d) {
            self.counts.insert(Arc::from(d), 0);
            *self.histogram.entry(0).or_default() += 1;
        }
    }

    fn add(&mut self, d: &str) {
        self.add_n(d, 1);
    }

    /// `n` more matching pods in `d`.
    fn add_n(&mut self, d: &str, n: i32) {
        let before = match self.counts.get_mut(d) {
            Some(c) => {
                *c += n;
                *c - n
            }
            None => {
                self.counts.insert(Arc::from(d), n);
                *self.histogram.entry(n).or_default() += 1;
                self.total += n;
                return;
            }
        };
        if let Some(k) = self.histogram.get_mut(&before) {
            *k -= 1;
            if *k == 0 {
                self.histogram.remove(&before);
            }
        }
        *self.histogram.entry(before + n).or_default() += 1;
        self.total += n;
    }

    fn count(&self, d: &str) -> i32 {
        self.counts.get(d).copied().unwrap_or(0)
    }
}

/// The rules of one class of pending pods that look at other nodes.
#[derive(Debug, Clone)]
struct Rules {
    /// A pod of the class (they all ask the same).
    pod: Arc<PodRecord>,
    counted: Vec<Counted>,
    /// Every spread constraint's key: a node counts for spread only if it has them all.
    spread_keys: Vec<String>,
    /// Per key, the domains other pods' anti-affinity keeps this class out of.
    repelled: Vec<(String, HashSet<Arc<str>>)>,
}

impl Rules {
    fn new(pod: Arc<PodRecord>) -> Self {
        Self {
            pod,
            counted: Vec::new(),
            spread_keys: Vec::new(),
            repelled: Vec::new(),
        }
    }

    fn repelled_slot(&mut self, key: &str) -> usize {
        match self.repelled.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.repelled.push((key.to_string(), HashSet::new()));
                self.repelled.len() - 1
            }
        }
    }

    /// Whether `node` is one spread counts on for rule `c`.
    fn eligible(&self, c: &Counted, node: &NodeState) -> bool {
        if !c.is_spread() {
            return true;
        }
        !self
            .spread_keys
            .iter()
            .any(|k| matches!(domain(node, k), Domain::Missing))
            && self.eligible_but_keys(c, node)
    }

    /// [`Rules::eligible`] but for the spread's keys, which the caller has checked.
    fn eligible_but_keys(&self, c: &Counted, node: &NodeState) -> bool {
        let Kind::Spread {
            honor_affinity,
            honor_taints,
            ..
        } = c.kind
        else {
            return true;
        };
        if honor_affinity && !node.matches_selector(self.pod.spec()) {
            return false;
        }
        if honor_taints {
            let tolerations = self.pod.spec().tolerations.as_deref().unwrap_or_default();
            if node.taints.iter().any(|t| {
                matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                    && !tolerations.iter().any(|tol| tolerates(tol, t))
            }) {
                return false;
            }
        }
        true
    }
}

fn required_terms<'a>(
    spec: &'a PodSpec,
    anti: bool,
) -> impl Iterator<Item = &'a PodAffinityTerm> + 'a {
    let a = spec.affinity.as_ref();
    let terms = if anti {
        a.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    } else {
        a.and_then(|a| a.pod_affinity.as_ref()).and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    };
    terms.into_iter().flatten()
}

/// A selector with `matchLabelKeys` (the pod's values: `In`) and `mismatchLabelKeys` (`NotIn`)
/// folded in, as the API server and the scheduler merge them.
pub(crate) fn merged(
    selector: Option<&LabelSelector>,
    match_keys: &[String],
    mismatch_keys: &[String],
    labels: &BTreeMap<String, String>,
) -> Option<LabelSelector> {
    let mut s = selector?.clone();
    for (keys, op) in [(match_keys, "In"), (mismatch_keys, "NotIn")] {
        for k in keys {
            if let Some(v) = labels.get(k) {
                s.match_expressions
                    .get_or_insert_with(Vec::new)
                    .push(LabelSelectorRequirement {
                        key: k.clone(),
                        operator: op.into(),
                        values: Some(vec![v.clone()]),
                    });
            }
        }
    }
    Some(s)
}

/// Whether `spec` has a rule this module decides (spread that blocks, required affinity, or
/// required anti-affinity on a key other than the hostname); see
/// [`PodFacts::has_cross_node_rules`](super::fit::PodFacts::has_cross_node_rules).
pub fn has_rules(spec: &PodSpec) -> bool {
    spec.topology_spread_constraints
        .iter()
        .flatten()
        .any(|c| c.when_unsatisfiable == "DoNotSchedule")
        || required_terms(spec, false).next().is_some()
        || has_remote_anti_affinity(spec)
}

/// Whether `spec` has required anti-affinity on a key other than the hostname.
pub fn has_remote_anti_affinity(spec: &PodSpec) -> bool {
    required_terms(spec, true).any(decided_here)
}

/// Whether this module decides an anti-affinity term: on a key other than the hostname, or
/// picking namespaces by their labels (which only this module reads).
fn decided_here(term: &PodAffinityTerm) -> bool {
    term.topology_key != HOSTNAME || super::fit::has_namespace_selector(term)
}

fn compile(pod: &Arc<PodRecord>, labels: &NamespaceLabels) -> Rules {
    let spec = pod.spec();
    let mut rules = Rules::new(pod.clone());
    let own = pod.namespace.as_str();
    let counted = |kind, key: &str, namespaces, selector| Counted {
        kind,
        key: key.to_string(),
        namespaces,
        selector,
        also: Vec::new(),
        counts: FxHashMap::default(),
        histogram: BTreeMap::new(),
        total: 0,
        reserved: FxHashMap::default(),
    };
    for c in spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
    {
        let selector = merged(
            c.label_selector.as_ref(),
            c.match_label_keys.as_deref().unwrap_or_default(),
            &[],
            &pod.labels,
        );
        // An empty selector counts no pod and matches the pod itself (the scheduler's
        // `selector.Empty()`): such a constraint never blocks.
        let (selector, self_match) = match selector {
            Some(s) if super::fit::is_empty_selector(&s) => (None, true),
            s => {
                let m = s
                    .as_ref()
                    .is_some_and(|s| label_selector_matches(s, &pod.labels));
                (s, m)
            }
        };
        rules.counted.push(counted(
            Kind::Spread {
                max_skew: c.max_skew.max(1),
                min_domains: c.min_domains.unwrap_or(1).max(1),
                self_match,
                honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            },
            &c.topology_key,
            Namespaces::List(vec![own.to_string()]),
            selector,
        ));
        if !rules.spread_keys.contains(&c.topology_key) {
            rules.spread_keys.push(c.topology_key.clone());
        }
    }
    let term_of = |term: &PodAffinityTerm| {
        let namespaces = Namespaces::of_term(term, own, labels);
        let selector = merged(
            term.label_selector.as_ref(),
            term.match_label_keys.as_deref().unwrap_or_default(),
            term.mismatch_label_keys.as_deref().unwrap_or_default(),
            &pod.labels,
        );
        (namespaces, selector)
    };
    // Affinity terms go together: a pod counts for them if it matches them all, and the first
    // pod of a group is one that matches them all itself (`podMatchesAllAffinityTerms`).
    let affinity: Vec<(&PodAffinityTerm, (Namespaces, Option<LabelSelector>))> =
        required_terms(spec, false)
            .map(|t| (t, term_of(t)))
            .collect();
    let self_match = affinity.iter().all(|(_, (namespaces, selector))| {
        namespaces.contains(own)
            && selector
                .as_ref()
                .is_some_and(|s| label_selector_matches(s, &pod.labels))
    });
    for (k, (term, (namespaces, selector))) in affinity.iter().enumerate() {
        let mut c = counted(
            Kind::Affinity { self_match },
            &term.topology_key,
            namespaces.clone(),
            selector.clone(),
        );
        c.also = affinity
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != k)
            .map(|(_, (_, t))| t.clone())
            .collect();
        rules.counted.push(c);
    }
    for term in required_terms(spec, true).filter(|t| decided_here(t)) {
        let (namespaces, selector) = term_of(term);
        rules.counted.push(counted(
            Kind::AntiAffinity,
            &term.topology_key,
            namespaces,
            selector,
        ));
    }
    rules
}

/// The cross-node side of a decision (see the module documentation). Cloning it is how an
/// estimate tries a group without touching the decision's state.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// The rule sets of the pending classes that have any, one per distinct set: classes whose
    /// rules, eligibility and repellers are equal share one (the pods of a StatefulSet, a class
    /// each, count and plan as one). Shared with the copies estimates work on until one changes
    /// them.
    rules: Vec<Arc<Rules>>,
    /// By class: its rule set in `rules`.
    of_class: Arc<HashMap<usize, usize>>,
    /// By class: the rules (rule set, index) a pod of the class counts toward once placed.
    counts_toward: Arc<HashMap<usize, Vec<(usize, usize)>>>,
    /// By class: the rule sets its anti-affinity keeps out of where it goes (rule set, slot).
    repels: Arc<HashMap<usize, Vec<(usize, usize)>>>,
    /// By class: what its claims ask of a node (classes with claims only; see
    /// [`super::volumes`]).
    needs: Arc<HashMap<usize, Arc<Needs>>>,
    /// By node name: the volumes attached there per driver, as the simulation places pods
    /// (only nodes with some, and only when a pending pod attaches any).
    attached: Arc<HashMap<String, BTreeMap<String, u32>>>,
}

/// What makes two classes' rule sets one: the rules as compiled (kind, key, namespaces,
/// selector, whether the pod matches its own), what decides which nodes spread counts on, and
/// who repels the class (bound pods' domains, pending classes' terms).
fn signature(r: &Rules, repellers: Option<&Vec<(usize, usize)>>) -> String {
    let spec = r.pod.spec();
    let counted: Vec<_> = r
        .counted
        .iter()
        .map(|c| (&c.kind, &c.key, &c.namespaces, &c.selector, &c.also))
        .collect();
    let repelled: Vec<(&String, Vec<&Arc<str>>)> = r
        .repelled
        .iter()
        .map(|(k, ds)| {
            let mut v: Vec<&Arc<str>> = ds.iter().collect();
            v.sort_unstable();
            (k, v)
        })
        .collect();
    let mut by = repellers.cloned().unwrap_or_default();
    by.sort_unstable();
    // The pod's fit facts (requests, host ports, hostname anti-affinity) decide which templates
    // take it and how many: the zones a plan counts as domains, and their room.
    format!(
        "{counted:?}|{:?}|{:?}|{:?}|{:?}|{repelled:?}|{by:?}|{:?}",
        r.spread_keys,
        spec.node_selector,
        spec.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref()),
        spec.tolerations,
        r.pod.facts(),
    )
}

/// Each node's value of one topology key, in the cluster's node order (`None`: it has none, or
/// several).
type NodeValues = Arc<Vec<Option<Arc<str>>>>;

/// One topology key over the cluster's nodes: each node's value, and whether it has the key.
type KeyValues = (NodeValues, Arc<Vec<bool>>);

/// The cluster as the cross-node filters read it: every node's labels and taints, and the pods
/// bound to each, grouped by shared label map (pods of one ReplicaSet share one) so a selector
/// is tried once per group, not once per pod. Built once per decision or scale-down pass, and
/// told where the simulation moves pods. It borrows the nodes (their pods are read once, here).
#[derive(Debug, Default, Clone)]
pub struct Cluster<'a> {
    nodes: Vec<&'a NodeState>,
    /// Bound pods sharing a label map, namespace, shape (their claims) and whether they are
    /// terminating: one of them, and each one's node.
    bound: Vec<(Arc<PodRecord>, Vec<usize>)>,
    bound_at: FxHashMap<usize, Vec<usize>>,
    /// Bound pods with required anti-affinity on a key other than the hostname, by shape.
    anti: Vec<(Arc<PodRecord>, Vec<usize>)>,
    anti_at: FxHashMap<usize, Vec<usize>>,
    /// The storage objects, when the volume filters are to run.
    volumes: Option<&'a Volumes>,
    /// Namespaces' labels, for terms that select namespaces by them.
    namespaces: Option<&'a NamespaceLabels>,
    /// Per topology key, each node's value and whether it has the key: read once per
    /// decision, shared by every set of rules compiled over this cluster (scale-down compiles
    /// one per simulated node).
    values: RefCell<FxHashMap<String, KeyValues>>,
    /// Per eligibility (a spread's keys, node affinity and tolerations as it honours them),
    /// which nodes the spread counts on; shared the same way.
    eligible: RefCell<FxHashMap<String, Arc<Vec<bool>>>>,
}

impl<'a> Cluster<'a> {
    /// Each node's value of `key` (`None` where it has none, or several), computed once.
    fn values_of(&self, key: &str) -> NodeValues {
        self.key_of(key).0
    }

    /// Whether each node has `key` (one value, or a zone Azure will choose among several),
    /// computed once.
    fn has_key(&self, key: &str) -> Arc<Vec<bool>> {
        self.key_of(key).1
    }

    fn key_of(&self, key: &str) -> KeyValues {
        if let Some(v) = self.values.borrow().get(key) {
            return v.clone();
        }
        // One `Arc` per distinct value, so a loop over the nodes can tell a domain it has
        // seen by its pointer.
        let mut interned: FxHashMap<&str, Arc<str>> = FxHashMap::default();
        let mut present = Vec::with_capacity(self.nodes.len());
        let values = self
            .nodes
            .iter()
            .map(|n| {
                let d = domain(n, key);
                present.push(!matches!(d, Domain::Missing));
                match d {
                    Domain::One(d) => {
                        Some(interned.entry(d).or_insert_with(|| Arc::from(d)).clone())
                    }
                    _ => None,
                }
            })
            .collect();
        let v = (Arc::new(values), Arc::new(present));
        self.values.borrow_mut().insert(key.to_string(), v.clone());
        v
    }

    /// Which nodes a spread of this eligibility `signature` counts on, computed once.
    fn eligible_for(&self, signature: String, make: impl FnOnce() -> Vec<bool>) -> Arc<Vec<bool>> {
        if let Some(v) = self.eligible.borrow().get(&signature) {
            return v.clone();
        }
        let v = Arc::new(make());
        self.eligible.borrow_mut().insert(signature, v.clone());
        v
    }

    /// `nodes` with the pods bound to each (indices follow the order given).
    pub fn new(nodes: impl IntoIterator<Item = &'a NodeState>) -> Self {
        let nodes: Vec<&'a NodeState> = nodes.into_iter().collect();
        let mut c = Cluster {
            nodes,
            ..Cluster::default()
        };
        for i in 0..c.nodes.len() {
            let n = c.nodes[i];
            for p in n.pods() {
                c.place(p, i);
            }
        }
        c
    }

    /// `nodes` (whose own pods are not read) with `pods`: (node index, pod).
    pub fn of_parts<'p>(
        nodes: impl IntoIterator<Item = &'a NodeState>,
        pods: impl IntoIterator<Item = (usize, &'p Arc<PodRecord>)>,
    ) -> Self {
        let mut c = Cluster {
            nodes: nodes.into_iter().collect(),
            ..Cluster::default()
        };
        for (i, p) in pods {
            c.place(p, i);
        }
        c
    }

    /// The same, with the storage objects the volume filters read.
    pub fn with_volumes(mut self, volumes: &'a Volumes) -> Self {
        self.volumes = Some(volumes);
        self
    }

    /// The same, with the namespaces' labels terms may select by.
    pub fn with_namespaces(mut self, namespaces: &'a NamespaceLabels) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    /// `pod` is (now) on node `at`.
    pub fn place(&mut self, pod: &Arc<PodRecord>, at: usize) {
        fn slot(
            groups: &mut Vec<(Arc<PodRecord>, Vec<usize>)>,
            index: &mut FxHashMap<usize, Vec<usize>>,
            key: usize,
            pod: &Arc<PodRecord>,
            same: impl Fn(&PodRecord) -> bool,
        ) -> usize {
            let ids = index.entry(key).or_default();
            match ids.iter().find(|&&g| same(&groups[g].0)) {
                Some(&g) => g,
                None => {
                    groups.push((pod.clone(), Vec::new()));
                    ids.push(groups.len() - 1);
                    groups.len() - 1
                }
            }
        }
        let ns = pod.namespace.as_str();
        let g = slot(
            &mut self.bound,
            &mut self.bound_at,
            Arc::as_ptr(&pod.labels) as usize,
            pod,
            |o| {
                o.namespace == ns
                    && o.terminating == pod.terminating
                    && Arc::ptr_eq(&o.shape, &pod.shape)
            },
        );
        self.bound[g].1.push(at);
        if pod.facts().has_remote_anti_affinity() {
            let g = slot(
                &mut self.anti,
                &mut self.anti_at,
                Arc::as_ptr(&pod.shape) as usize,
                pod,
                |o| o.namespace == ns && Arc::ptr_eq(&o.labels, &pod.labels),
            );
            self.anti[g].1.push(at);
        }
    }
}

impl Topology {
    /// The rules of the `pending` pods, counted over `nodes` (every node of the cluster, with
    /// the pods bound to it, and the nodes on their way). `possible` are the templates of the
    /// groups that may grow: for a pod that fits one, its domain is a domain of its spread with
    /// no pods yet, so a zone-spread Deployment grows every zone's group from zero (as Karpenter
    /// counts the zones a NodePool offers), not one zone that the scheduler would then fill.
    pub fn new<'a>(
        pending: &[Prepared],
        nodes: impl IntoIterator<Item = &'a NodeState>,
        possible: &[&NodeState],
        volumes: &Volumes,
        namespaces: &NamespaceLabels,
    ) -> Self {
        let nodes: Vec<&NodeState> = nodes.into_iter().collect();
        let cross_node = pending.iter().any(|p| p.pod.facts().has_cross_node_rules())
            || nodes.iter().any(|n| n.any_remote_anti_affinity());
        let claims = pending
            .iter()
            .any(|p| super::volumes::has_claims(p.pod.spec()));
        if !cross_node && !claims {
            return Self::default();
        }
        Self::over(
            pending,
            &Cluster::new(nodes)
                .with_volumes(volumes)
                .with_namespaces(namespaces),
            |_| false,
            possible,
        )
    }

    /// [`Topology::new`] over a [`Cluster`] built before, leaving out the nodes `skip` names
    /// (a node being removed, and its pods with it).
    pub fn over(
        pending: &[Prepared],
        cluster: &Cluster,
        skip: impl Fn(usize) -> bool,
        possible: &[&NodeState],
    ) -> Self {
        Self::rules_over(pending, cluster, &skip, possible).with_needs(pending, cluster, &skip)
    }

    /// The volume side of [`Topology::over`]: each pending class's needs, and the volumes
    /// attached to each node. A pod whose claims wait for something no node brings is refused
    /// everywhere (a scale-up leaves such pods out before; a scale-down must not move them).
    fn with_needs(
        mut self,
        pending: &[Prepared],
        cluster: &Cluster,
        skip: &impl Fn(usize) -> bool,
    ) -> Self {
        let Some(volumes) = cluster.volumes else {
            return self;
        };
        let mut needs: HashMap<usize, Arc<Needs>> = HashMap::new();
        for p in pending {
            if needs.contains_key(&p.class) || !super::volumes::has_claims(p.pod.spec()) {
                continue;
            }
            match volumes.of_pod(&p.pod) {
                Verdict::None => {}
                Verdict::Needs(n) => {
                    needs.insert(p.class, n);
                }
                Verdict::Waiting(_) | Verdict::NotSimulated(_) => {
                    needs.insert(p.class, Arc::new(Needs::nowhere()));
                }
            }
        }
        if needs.is_empty() {
            return self;
        }
        let mut attached: HashMap<String, BTreeMap<String, u32>> = HashMap::new();
        if needs.values().any(|n| !n.attach().is_empty()) {
            for (pod, on) in &cluster.bound {
                if !super::volumes::has_claims(pod.spec()) {
                    continue;
                }
                let a = volumes.attached(pod);
                if a.is_empty() {
                    continue;
                }
                for &n in on.iter().filter(|&&n| !skip(n)) {
                    let at = attached.entry(cluster.nodes[n].name.clone()).or_default();
                    for (d, k) in &a {
                        *at.entry(d.clone()).or_default() += k;
                    }
                }
            }
        }
        self.needs = Arc::new(needs);
        self.attached = Arc::new(attached);
        self
    }

    /// The spread and affinity side of [`Topology::over`].
    fn rules_over(
        pending: &[Prepared],
        cluster: &Cluster,
        skip: &impl Fn(usize) -> bool,
        possible: &[&NodeState],
    ) -> Self {
        let mut reps: Vec<(usize, &Arc<PodRecord>)> = Vec::new();
        let mut seen = HashSet::new();
        for p in pending {
            if seen.insert(p.class) {
                reps.push((p.class, &p.pod));
            }
        }
        let nodes: &[&NodeState] = &cluster.nodes;
        let labels = cluster.namespaces.unwrap_or(NamespaceLabels::none());
        let mut rules: HashMap<usize, Rules> = HashMap::new();
        for (class, pod) in &reps {
            if pod.facts().has_cross_node_rules() {
                rules.insert(*class, compile(pod, labels));
            }
        }
        // Bound pods' anti-affinity keeps matching pending pods out of the domains they are in.
        for (owner, on) in &cluster.anti {
            for term in required_terms(owner.spec(), true).filter(|t| decided_here(t)) {
                let namespaces = Namespaces::of_term(term, &owner.namespace, labels);
                let selector = merged(
                    term.label_selector.as_ref(),
                    term.match_label_keys.as_deref().unwrap_or_default(),
                    term.mismatch_label_keys.as_deref().unwrap_or_default(),
                    &owner.labels,
                );
                for (class, pod) in &reps {
                    if !(namespaces.contains(&pod.namespace)
                        && selector
                            .as_ref()
                            .is_some_and(|s| label_selector_matches(s, &pod.labels)))
                    {
                        continue;
                    }
                    let r = rules
                        .entry(*class)
                        .or_insert_with(|| Rules::new((*pod).clone()));
                    let slot = r.repelled_slot(&term.topology_key);
                    for &n in on.iter().filter(|&&n| !skip(n)) {
                        for d in values(domain(nodes[n], &term.topology_key)) {
                            r.repelled[slot].1.insert(Arc::from(d));
                        }
                    }
                }
            }
        }
        // Pending classes' anti-affinity keeps the classes it matches out of where they go.
        let anti_classes: Vec<(usize, Vec<Counted>)> = rules
            .iter()
            .map(|(class, r)| {
                (
                    *class,
                    r.counted
                        .iter()
                        .filter(|c| matches!(c.kind, Kind::AntiAffinity))
                        .cloned()
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, terms)| !terms.is_empty())
            .collect();
        let mut repels_class: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (class, terms) in &anti_classes {
            for term in terms {
                for (other, pod) in &reps {
                    if !term.selects(pod) {
                        continue;
                    }
                    let r = rules
                        .entry(*other)
                        .or_insert_with(|| Rules::new((*pod).clone()));
                    let slot = r.repelled_slot(&term.key);
                    repels_class.entry(*class).or_default().push((*other, slot));
                }
            }
        }
        if rules.is_empty() {
            return Self::default();
        }
        // Which rules each pending class counts toward once placed (by owner class).
        let mut toward_class: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (class, pod) in &reps {
            for (owner, r) in &rules {
                for (i, c) in r.counted.iter().enumerate() {
                    if c.selects(pod) {
                        toward_class.entry(*class).or_default().push((*owner, i));
                    }
                }
            }
        }
        // One rule set per distinct signature, in class order (deterministic).
        let mut repellers: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (class, list) in &repels_class {
            for &(other, slot) in list {
                repellers.entry(other).or_default().push((*class, slot));
            }
        }
        let mut classes: Vec<usize> = rules.keys().copied().collect();
        classes.sort_unstable();
        let mut by_signature: HashMap<String, usize> = HashMap::new();
        let mut of_class: HashMap<usize, usize> = HashMap::new();
        let mut unique: Vec<Rules> = Vec::new();
        for class in classes {
            let r = rules.remove(&class).expect("rules of a listed class");
            let next = unique.len();
            let at = *by_signature
                .entry(signature(&r, repellers.get(&class)))
                .or_insert(next);
            if at == next {
                unique.push(r);
            }
            of_class.insert(class, at);
        }
        // Per key, each node's value (read once, shared by the rules on that key); per
        // eligibility (keys, node affinity, tolerations: most rules share one), which nodes
        // spread counts on.
        for r in &mut unique {
            for i in 0..r.counted.len() {
                let mut c = r.counted[i].clone();
                let at = cluster.values_of(&c.key);
                let eligible = match c.kind {
                    Kind::Spread {
                        honor_affinity,
                        honor_taints,
                        ..
                    } => {
                        let spec = r.pod.spec();
                        let signature = format!(
                            "{:?}|{:?}|{:?}|{:?}",
                            r.spread_keys,
                            honor_affinity.then_some((
                                &spec.node_selector,
                                spec.affinity
                                    .as_ref()
                                    .and_then(|a| a.node_affinity.as_ref())
                            )),
                            honor_taints.then_some(&spec.tolerations),
                            c.key,
                        );
                        let rr = &*r;
                        let cc = &c;
                        Some(cluster.eligible_for(signature, || {
                            let keys: Vec<Arc<Vec<bool>>> =
                                rr.spread_keys.iter().map(|k| cluster.has_key(k)).collect();
                            nodes
                                .iter()
                                .enumerate()
                                .map(|(i, n)| {
                                    keys.iter().all(|k| k[i]) && rr.eligible_but_keys(cc, n)
                                })
                                .collect()
                        }))
                    }
                    _ => None,
                };
                if let Some(eligible) = &eligible {
                    // Values are interned (`values_of`): a domain is made once, not once per
                    // node (5,000 nodes in 3 zones).
                    let mut seen: FxHashSet<*const u8> = FxHashSet::default();
                    for (n, d) in at.iter().enumerate() {
                        if let (false, true, Some(d)) = (skip(n), eligible[n], d) {
                            if seen.insert(d.as_ptr()) {
                                c.ensure(d);
                            }
                        }
                    }
                    for t in possible {
                        if r.eligible(&c, t) && t.fits(&r.pod).is_ok() {
                            if let Domain::One(d) = domain(t, &c.key) {
                                c.ensure(d);
                            }
                        }
                    }
                }
                // Tallied per domain first (values are interned), then counted once each.
                let mut tally: FxHashMap<*const u8, (&Arc<str>, i32)> = FxHashMap::default();
                for (pod, on) in &cluster.bound {
                    // The scheduler's spread skips pods on their way out; affinity counts them.
                    if !c.selects(pod) || (pod.terminating && c.is_spread()) {
                        continue;
                    }
                    for &n in on.iter().filter(|&&n| !skip(n)) {
                        if eligible.as_ref().is_none_or(|e| e[n]) {
                            if let Some(d) = &at[n] {
                                tally.entry(d.as_ptr()).or_insert((d, 0)).1 += 1;
                            }
                        }
                    }
                }
                for (d, n) in tally.into_values() {
                    c.add_n(d, n);
                }
                r.counted[i] = c;
            }
        }
        let remap = |by_class: HashMap<usize, Vec<(usize, usize)>>| {
            by_class
                .into_iter()
                .map(|(class, list)| {
                    let mut list: Vec<(usize, usize)> =
                        list.into_iter().map(|(c, i)| (of_class[&c], i)).collect();
                    list.sort_unstable();
                    list.dedup();
                    (class, list)
                })
                .collect::<HashMap<_, _>>()
        };
        Self {
            counts_toward: Arc::new(remap(toward_class)),
            repels: Arc::new(remap(repels_class)),
            rules: unique.into_iter().map(Arc::new).collect(),
            of_class: Arc::new(of_class),
            ..Self::default()
        }
    }

    /// Whether anything here can refuse a pod (else every check is a no-op).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.needs.is_empty()
    }

    /// Whether pods of `class` have or meet a rule here.
    pub fn involves(&self, class: usize) -> bool {
        self.of_class.contains_key(&class)
            || self.counts_toward.contains_key(&class)
            || self.needs.get(&class).is_some_and(|n| n.pins())
    }

    fn rules_of(&self, class: usize) -> Option<&Rules> {
        self.of_class.get(&class).map(|&r| &*self.rules[r])
    }

    /// Whether a node that refused a pod of `class` keeps refusing it as the simulation fills
    /// nodes (so a first-fit may skip it next time). Required affinity is not: the pod it
    /// needs may be placed later.
    pub fn refusal_sticks(&self, class: usize) -> bool {
        self.rules_of(class).is_none_or(|r| {
            !r.counted
                .iter()
                .any(|c| matches!(c.kind, Kind::Affinity { .. } | Kind::Spread { .. }))
        })
    }

    /// The one topology key every rule of `class` looks at, when there is exactly one and it
    /// is not the hostname: then whether a node takes a pod of the class, as far as this module
    /// is concerned, depends only on the node's value for that key (one verdict per zone, not
    /// per node).
    pub fn domain_key(&self, class: usize) -> Option<&str> {
        // Volume limits are per node.
        if self.needs.contains_key(&class) {
            return None;
        }
        let r = self.rules_of(class)?;
        let mut keys = r
            .counted
            .iter()
            .map(|c| c.key.as_str())
            .chain(r.repelled.iter().map(|(k, _)| k.as_str()));
        let first = keys.next()?;
        (first != HOSTNAME && keys.all(|k| k == first)).then_some(first)
    }

    /// Shares the `pending` pods out over the domains of their rule set's one spread
    /// constraint on a key other than the hostname, as the scheduler's skew allows them to end
    /// up: water-filling, one pod at a time to the emptiest domain that `offers` can grow (each
    /// offer: a template of a group that may grow, and how many nodes it may still add) while
    /// the skew stays within `maxSkew`. The estimates then place a domain's whole share in one
    /// round, with the other domains counted at their planned sizes: a Deployment of 600
    /// zone-spread replicas takes three rounds, not 600, and so does a StatefulSet (a class
    /// per pod, one rule set). The shares are a plan, never a licence: a pod still goes only
    /// where the skew allows given the counts and the shares not yet placed.
    ///
    /// No plan (one pod per round, as the scheduler places them) where the pods could not keep
    /// to it: a pending pod of another rule set counts toward the constraint (it may land
    /// anywhere), the rule set also needs affinity, or its anti-affinity repels its own pods
    /// by a key other than the hostname. Spread by hostname alongside is kept per node (a new
    /// node takes no more of the pods than its skew allows).
    pub fn share_out(&mut self, pending: &[Prepared], offers: &[(&NodeState, u32)]) {
        let mut pods_of: BTreeMap<usize, u32> = BTreeMap::new();
        let mut classes: HashSet<usize> = HashSet::new();
        for p in pending {
            classes.insert(p.class);
            if let Some(&at) = self.of_class.get(&p.class) {
                *pods_of.entry(at).or_default() += 1;
            }
        }
        let mut foreign: HashSet<(usize, usize)> = HashSet::new();
        for class in &classes {
            let own = self.of_class.get(class);
            for &(at, i) in self.counts_toward.get(class).into_iter().flatten() {
                if own != Some(&at) {
                    foreign.insert((at, i));
                }
            }
        }
        // Pods their volumes hold to some nodes may not keep to a plan made without them.
        let pinned: HashSet<usize> = self
            .needs
            .iter()
            .filter(|(_, n)| n.pins())
            .filter_map(|(class, _)| self.of_class.get(class).copied())
            .collect();
        for (at, pods) in pods_of {
            if pinned.contains(&at) {
                continue;
            }
            if let Some((i, shares)) = self.shares(at, pods, offers, &foreign) {
                let c = &mut Arc::make_mut(&mut self.rules[at]).counted[i];
                for d in shares.keys() {
                    c.ensure(d);
                }
                c.reserved = shares;
            }
        }
    }

    /// The plan of [`Topology::share_out`] for rule set `at`: its zonal rule's index and the
    /// shares by domain, or nothing when there is no plan to make.
    fn shares(
        &self,
        at: usize,
        pods: u32,
        offers: &[(&NodeState, u32)],
        foreign: &HashSet<(usize, usize)>,
    ) -> Option<(usize, FxHashMap<Arc<str>, i32>)> {
        let r = &*self.rules[at];
        let zonal: Vec<usize> = (0..r.counted.len())
            .filter(|&i| r.counted[i].is_spread() && r.counted[i].key != HOSTNAME)
            .collect();
        let [i] = zonal.as_slice() else {
            return None;
        };
        let i = *i;
        let c = &r.counted[i];
        let Kind::Spread {
            max_skew,
            min_domains,
            self_match: true,
            ..
        } = c.kind
        else {
            return None;
        };
        let plannable = r.counted.iter().all(|o| match o.kind {
            Kind::Spread { .. } => true,
            Kind::AntiAffinity => o.key == HOSTNAME || !o.selects(&r.pod),
            Kind::Affinity { .. } => false,
        });
        if !plannable || c.selector.is_none() || foreign.contains(&(at, i)) {
            return None;
        }
        // A new node takes no more than its hostname spread allows over an empty node.
        let per_node = r
            .counted
            .iter()
            .filter_map(|o| match o.kind {
                Kind::Spread { max_skew, .. } if o.key == HOSTNAME => {
                    Some(u32::try_from(max_skew).unwrap_or(1))
                }
                _ => None,
            })
            .min();
        let mut room: BTreeMap<&str, u32> = BTreeMap::new();
        for (t, nodes) in offers {
            if let (true, Domain::One(d)) = (r.eligible(c, t), domain(t, &c.key)) {
                let each = per_node.map_or(t.how_many(&r.pod), |p| p.min(t.how_many(&r.pod)));
                // A zone only templates the pod does not fit is no domain of the plan (nor of
                // the counts: see `rules_over`).
                if each > 0 && *nodes > 0 {
                    *room.entry(d).or_default() += nodes.saturating_mul(each);
                }
            }
        }
        let mut planned: BTreeMap<&str, i32> =
            c.counts.iter().map(|(k, n)| (k.as_ref(), *n)).collect();
        for d in room.keys() {
            planned.entry(d).or_insert(0);
        }
        let mut shares: FxHashMap<Arc<str>, i32> = FxHashMap::default();
        for _ in 0..pods {
            let min = if i32::try_from(planned.len()).unwrap_or(i32::MAX) < min_domains {
                0
            } else {
                planned.values().copied().min().unwrap_or(0)
            };
            let Some(d) = room
                .iter()
                .filter(|(d, left)| **left > 0 && planned[**d] + 1 - min <= max_skew)
                .min_by_key(|(d, _)| (planned[**d], **d))
                .map(|(d, _)| *d)
            else {
                break;
            };
            *planned.get_mut(d).expect("planned") += 1;
            *room.get_mut(d).expect("room") -= 1;
            *shares.entry(Arc::from(d)).or_default() += 1;
        }
        (!shares.is_empty()).then_some((i, shares))
    }

    /// Drops every share-out plan, so each pod goes where the plain skew allows. A plan made
    /// from offers the decision could not keep (a quota pool several groups share, attach
    /// limits, a group that refused) would otherwise refuse pods the scheduler would place.
    /// Returns whether there was one.
    pub fn clear_shares(&mut self) -> bool {
        let mut any = false;
        for r in &mut self.rules {
            if r.counted.iter().any(|c| !c.reserved.is_empty()) {
                any = true;
                for c in &mut Arc::make_mut(r).counted {
                    c.reserved.clear();
                }
            }
        }
        any
    }

    /// A node joins the simulation (a new node of a group): a domain for the spread rules it
    /// counts for.
    pub fn node_added(&mut self, node: &NodeState) {
        for r in &mut self.rules {
            for i in 0..r.counted.len() {
                let c = &r.counted[i];
                if !c.is_spread() || !r.eligible(c, node) {
                    continue;
                }
                if let Domain::One(d) = domain(node, &c.key) {
                    if !c.counts.contains_key(d) {
                        Arc::make_mut(r).counted[i].ensure(d);
                    }
                }
            }
        }
    }

    /// A pod of `class` placed on `node` in the simulation: it counts there from now on.
    pub fn placed(&mut self, class: usize, node: &NodeState) {
        if let Some(n) = self.needs.get(&class).filter(|n| !n.attach().is_empty()) {
            let at = Arc::make_mut(&mut self.attached)
                .entry(node.name.clone())
                .or_default();
            for (d, k) in n.attach() {
                *at.entry(d.clone()).or_default() += k;
            }
        }
        if let Some(toward) = self.counts_toward.get(&class) {
            for &(at, i) in toward {
                let r = &mut self.rules[at];
                if !r.eligible(&r.counted[i], node) {
                    continue;
                }
                let c = &mut Arc::make_mut(r).counted[i];
                match domain(node, &c.key) {
                    Domain::One(d) => {
                        c.add(d);
                        // Only the rule set's own classes count toward a rule with shares
                        // (see `share_out`): this is one of them, placing its share.
                        if let Some(left) = c.reserved.get_mut(d).filter(|n| **n > 0) {
                            *left -= 1;
                        }
                    }
                    // Unknown zone: anti-affinity counts it in each (it may be in any).
                    Domain::Several(ds) if matches!(c.kind, Kind::AntiAffinity) => {
                        for d in ds {
                            c.add(d);
                        }
                    }
                    // Affinity: a matching pod exists now, though no one zone can be said to
                    // hold it, so the next pod is no longer the first of its group. Spread
                    // refused such a node for its own pods and does not guess.
                    Domain::Several(_) if matches!(c.kind, Kind::Affinity { .. }) => {
                        c.total += 1;
                    }
                    _ => {}
                }
            }
        }
        if let Some(repels) = self.repels.get(&class) {
            for &(at, slot) in repels.iter() {
                let r = &mut self.rules[at];
                let ds: Vec<&str> = values(domain(node, &r.repelled[slot].0)).collect();
                if ds.iter().any(|d| !r.repelled[slot].1.contains(*d)) {
                    let ds: Vec<Arc<str>> = ds.into_iter().map(Arc::from).collect();
                    Arc::make_mut(r).repelled[slot].1.extend(ds);
                }
            }
        }
    }

    /// Whether a pod of `class` may go on `node` as far as other nodes' pods are concerned, or
    /// the scheduler's reason.
    pub fn fits(&self, class: usize, node: &NodeState) -> Result<(), Unfit> {
        // The volume filters come before spread and affinity in kube-scheduler's order.
        if let Some(n) = self.needs.get(&class) {
            n.fits(node, self.attached.get(&node.name))?;
        }
        let Some(r) = self.rules_of(class) else {
            return Ok(());
        };
        for c in r.counted.iter().filter(|c| c.is_spread()) {
            let Kind::Spread {
                max_skew,
                min_domains,
                self_match,
                ..
            } = c.kind
            else {
                continue;
            };
            let d = match domain(node, &c.key) {
                Domain::One(d) => d,
                Domain::Missing => {
                    return Err(Unfit::TopologySpread {
                        key: c.key.clone(),
                        why: SpreadWhy::MissingLabel,
                    })
                }
                Domain::Several(_) => {
                    return Err(Unfit::TopologySpread {
                        key: c.key.clone(),
                        why: SpreadWhy::SeveralZones,
                    })
                }
            };
            // A share-out in force: the class's pods go where their shares are, nowhere else.
            if !c.reserved.is_empty() && c.reserved.get(d).is_none_or(|n| *n <= 0) {
                return Err(Unfit::TopologySpread {
                    key: c.key.clone(),
                    why: SpreadWhy::Skew,
                });
            }
            let present = c.counts.contains_key(d);
            let domains = c.counts.len() + usize::from(!present);
            let mut min = if !present {
                0
            } else if c.reserved.is_empty() {
                c.histogram.keys().next().copied().unwrap_or(0)
            } else {
                // With a share-out, each domain counts as it will be once its share is placed.
                c.counts
                    .iter()
                    .map(|(k, n)| n + c.reserved.get(k).copied().unwrap_or(0))
                    .min()
                    .unwrap_or(0)
            };
            if i32::try_from(domains).unwrap_or(i32::MAX) < min_domains {
                min = 0;
            }
            if c.count(d) + i32::from(self_match) - min > max_skew {
                return Err(Unfit::TopologySpread {
                    key: c.key.clone(),
                    why: SpreadWhy::Skew,
                });
            }
        }
        let affinity: Vec<&Counted> = r
            .counted
            .iter()
            .filter(|c| matches!(c.kind, Kind::Affinity { .. }))
            .collect();
        // Every term's key must be on the node, first pod or not.
        if affinity
            .iter()
            .any(|c| matches!(domain(node, &c.key), Domain::Missing))
        {
            return Err(Unfit::PodAffinity);
        }
        let satisfied = affinity.iter().all(|c| match domain(node, &c.key) {
            Domain::One(d) => c.count(d) > 0,
            Domain::Several(ds) => ds.iter().all(|d| c.count(d) > 0),
            Domain::Missing => false,
        });
        let first_of_its_kind = affinity
            .iter()
            .all(|c| c.total == 0 && matches!(c.kind, Kind::Affinity { self_match: true }));
        if !satisfied && !first_of_its_kind {
            return Err(Unfit::PodAffinity);
        }
        for c in r
            .counted
            .iter()
            .filter(|c| matches!(c.kind, Kind::AntiAffinity))
        {
            if values(domain(node, &c.key)).any(|d| c.count(d) > 0) {
                return Err(Unfit::PodAntiAffinity);
            }
        }
        for (key, repelled) in &r.repelled {
            if values(domain(node, key)).any(|d| repelled.contains(d)) {
                return Err(Unfit::ExistingAntiAffinity);
            }
        }
        Ok(())
    }
}

/// The values a domain may be.
fn values(d: Domain<'_>) -> impl Iterator<Item = &str> {
    match d {
        Domain::One(v) => vec![v],
        Domain::Missing => Vec::new(),
        Domain::Several(vs) => vs,
    }
    .into_iter()
}

/// Why a node breaks a topology spread constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpreadWhy {
    /// Its domain would exceed `maxSkew`.
    Skew,
    /// It lacks the constraint's key.
    MissingLabel,
    /// A new node of a group spanning several zones: its domain is Azure's choice.
    SeveralZones,
}

#[cfg(test)]
mod tests {
    //! Cases from the Kubernetes documentation's worked examples ("Pod Topology Spread
    //! Constraints", "Assigning Pods to Nodes"), with the placements it says are possible.
    use super::*;
    use crate::pods::estimate::prepare;
    use crate::pods::fit::Resources;
    use serde_json::json;

    fn node(name: &str, zone: &str, pods: &[Arc<PodRecord>]) -> NodeState {
        let mut n = NodeState::new(
            name,
            BTreeMap::from([
                (HOSTNAME.to_string(), name.to_string()),
                ("zone".to_string(), zone.to_string()),
            ]),
            Vec::new(),
            Resources::from([("cpu".into(), 64_000), ("pods".into(), 110_000)]),
        );
        for p in pods {
            n.place(p.clone());
        }
        n
    }

    fn pod(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> Arc<PodRecord> {
        let mut s = json!({"containers": [{"name": "c"}]});
        for (k, v) in spec.as_object().unwrap() {
            s[k] = v.clone();
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": s}),
            )
            .unwrap(),
        ))
    }

    fn foo(name: &str) -> Arc<PodRecord> {
        pod(name, json!({"foo": "bar"}), json!({}))
    }

    fn spread(key: &str) -> serde_json::Value {
        json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"foo": "bar"}}})
    }

    /// The topology of `pending` over `nodes`, with no storage objects or namespace labels.
    fn over_nodes(pending: &[Prepared], nodes: &[NodeState]) -> Topology {
        Topology::new(
            pending,
            nodes,
            &[],
            Volumes::none(),
            NamespaceLabels::none(),
        )
    }

    /// Which of `nodes` the scheduler would take `incoming` on, by name.
    fn allowed(incoming: &Arc<PodRecord>, nodes: &[NodeState]) -> Vec<String> {
        let pending = prepare(std::slice::from_ref(incoming));
        let t = over_nodes(&pending, nodes);
        nodes
            .iter()
            .filter(|n| n.fits(incoming).is_ok() && t.fits(pending[0].class, n).is_ok())
            .map(|n| n.name.clone())
            .collect()
    }

    /// Two zones, three pods: zoneA 2, zoneB 1.
    fn four_nodes() -> Vec<NodeState> {
        vec![
            node("node1", "zoneA", &[foo("p1")]),
            node("node2", "zoneA", &[foo("p2")]),
            node("node3", "zoneB", &[foo("p3")]),
            node("node4", "zoneB", &[]),
        ]
    }

    #[test]
    fn one_constraint_by_zone_sends_the_fourth_pod_to_the_zone_with_fewer() {
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone")]}),
        );
        assert_eq!(allowed(&incoming, &four_nodes()), ["node3", "node4"]);
    }

    #[test]
    fn pods_on_their_way_out_no_longer_count_for_spread_but_still_repel() {
        let leaving = |name: &str| {
            let mut p = (*foo(name)).clone();
            p.terminating = true;
            Arc::new(p)
        };
        // zoneA's two pods are terminating: A counts 0, B 1, so only A is within the skew.
        let nodes = vec![
            node("node1", "zoneA", &[leaving("p1"), leaving("p2")]),
            node("node3", "zoneB", &[foo("p3")]),
        ];
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone")]}),
        );
        assert_eq!(allowed(&incoming, &nodes), ["node1"]);
        // Anti-affinity still sees them, as the scheduler does until they are gone.
        let shy = pod(
            "shy",
            json!({"app": "shy"}),
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "zone", "labelSelector": {"matchLabels": {"foo": "bar"}}}]}}}),
        );
        assert!(allowed(&shy, &nodes).is_empty());
    }

    #[test]
    fn constraints_by_zone_and_by_node_together_leave_only_the_empty_node_of_that_zone() {
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone"), spread(HOSTNAME)]}),
        );
        assert_eq!(allowed(&incoming, &four_nodes()), ["node4"]);
    }

    #[test]
    fn a_spread_with_an_empty_selector_counts_no_pod_and_never_blocks() {
        let mut c = spread("zone");
        c["labelSelector"] = json!({});
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [c]}),
        );
        assert_eq!(
            allowed(&incoming, &four_nodes()),
            ["node1", "node2", "node3", "node4"]
        );
    }

    #[test]
    fn conflicting_constraints_leave_the_pod_pending() {
        let nodes = vec![
            node("node1", "zoneA", &[foo("p1"), foo("p2")]),
            node("node2", "zoneA", &[foo("p3")]),
            node("node3", "zoneB", &[foo("p4"), foo("p5")]),
        ];
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone"), spread(HOSTNAME)]}),
        );
        assert!(allowed(&incoming, &nodes).is_empty());
        let pending = prepare(std::slice::from_ref(&incoming));
        let t = over_nodes(&pending, &nodes);
        assert_eq!(
            t.fits(pending[0].class, &nodes[2]).unwrap_err().to_string(),
            "node(s) didn't match pod topology spread constraints"
        );
    }

    #[test]
    fn node_affinity_policy_honor_leaves_out_the_zone_the_pod_may_not_go_to() {
        let mut nodes = four_nodes();
        nodes[3] = node("node4", "zoneB", &[foo("p4")]);
        nodes.push(node("node5", "zoneC", &[]));
        let not_c = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["zoneC"]}]}]}}});
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone")], "affinity": not_c.clone()}),
        );
        // zoneC is not a domain: A and B are even, so any node of them.
        assert_eq!(
            allowed(&incoming, &nodes),
            ["node1", "node2", "node3", "node4"]
        );
        // With the policy Ignore, zoneC counts with 0: the skew forbids A and B, and the pod
        // may not go to C.
        let mut c = spread("zone");
        c["nodeAffinityPolicy"] = json!("Ignore");
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [c], "affinity": not_c}),
        );
        assert!(allowed(&incoming, &nodes).is_empty());
    }

    #[test]
    fn node_taints_policy_ignore_counts_a_tainted_zone_and_honor_does_not() {
        let mut nodes = vec![
            node("node1", "zoneA", &[foo("p1")]),
            node("node2", "zoneB", &[]),
        ];
        nodes[1].taints = Arc::new(vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("batch".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        let incoming = |policy: &str| {
            let mut c = spread("zone");
            c["nodeTaintsPolicy"] = json!(policy);
            pod(
                "mypod",
                json!({"foo": "bar"}),
                json!({"topologySpreadConstraints": [c]}),
            )
        };
        // Ignore (the default): zoneB counts with 0 though the pod cannot go there.
        assert!(allowed(&incoming("Ignore"), &nodes).is_empty());
        assert_eq!(allowed(&incoming("Honor"), &nodes), ["node1"]);
    }

    #[test]
    fn a_node_without_the_topology_key_is_refused_as_missing_the_label() {
        let mut nodes = four_nodes();
        Arc::make_mut(&mut nodes[3].labels).remove("zone");
        let incoming = pod(
            "mypod",
            json!({"foo": "bar"}),
            json!({"topologySpreadConstraints": [spread("zone")]}),
        );
        let pending = prepare(std::slice::from_ref(&incoming));
        let t = over_nodes(&pending, &nodes);
        assert_eq!(
            t.fits(pending[0].class, &nodes[3]).unwrap_err().to_string(),
            "node(s) didn't match pod topology spread constraints (missing required label)"
        );
        assert_eq!(allowed(&incoming, &nodes), ["node3"]);
    }

    #[test]
    fn match_label_keys_count_only_the_pods_of_the_same_revision() {
        let rev = |name: &str, hash: &str| {
            pod(
                name,
                json!({"foo": "bar", "pod-template-hash": hash}),
                json!({}),
            )
        };
        // The old revision is all in zoneA; the new one has one pod there.
        let nodes = vec![
            node(
                "node1",
                "zoneA",
                &[rev("old-1", "a"), rev("old-2", "a"), rev("new-1", "b")],
            ),
            node("node2", "zoneB", &[]),
        ];
        let mut c = spread("zone");
        c["matchLabelKeys"] = json!(["pod-template-hash"]);
        let incoming = pod(
            "new-2",
            json!({"foo": "bar", "pod-template-hash": "b"}),
            json!({"topologySpreadConstraints": [c]}),
        );
        // Revision b alone counts: zoneA 1, zoneB 0, so zoneB.
        assert_eq!(allowed(&incoming, &nodes), ["node2"]);
        // With a b pod in zoneB too, both zones are within the skew for revision b (1 and 1),
        // though zoneA holds three foo=bar pods in all.
        let mut nodes = nodes;
        nodes[1].place(rev("new-2", "b"));
        assert_eq!(allowed(&incoming, &nodes), ["node1", "node2"]);
    }

    #[test]
    fn web_servers_go_next_to_a_cache_and_never_two_on_one_node() {
        // The documentation's web-store / redis-cache example, by hostname.
        let cache = |n: &str| pod(n, json!({"app": "store"}), json!({}));
        let nodes = vec![
            node("node1", "z", &[cache("c1")]),
            node("node2", "z", &[cache("c2")]),
            node("node3", "z", &[]),
        ];
        let web = pod(
            "web-1",
            json!({"app": "web-store"}),
            json!({"affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "web-store"}}}]},
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "store"}}}]}}}),
        );
        assert_eq!(allowed(&web, &nodes), ["node1", "node2"]);
        let mut nodes = nodes;
        nodes[0].place(web.clone());
        let web2 = pod(
            "web-2",
            json!({"app": "web-store"}),
            json!({"affinity": web.spec().affinity}),
        );
        assert_eq!(allowed(&web2, &nodes), ["node2"]);
    }

    #[test]
    fn affinity_terms_count_only_pods_that_match_them_all_and_the_first_pod_needs_a_key() {
        let terms = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}},
            {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"tier": "cache"}}}]}});
        // A db pod and a cache pod, different pods: no pod matches both terms, so the
        // scheduler finds no node, and the incoming pod matches neither itself.
        let nodes = vec![
            node(
                "node1",
                "zoneA",
                &[pod("db", json!({"app": "db"}), json!({}))],
            ),
            node(
                "node2",
                "zoneA",
                &[pod("cache", json!({"tier": "cache"}), json!({}))],
            ),
        ];
        let web = pod("web", json!({"app": "web"}), json!({"affinity": terms}));
        assert!(allowed(&web, &nodes).is_empty());
        // A pod matching its own two terms, with a pod around matching only one of them: it
        // is the first of its group and may go anywhere that has both keys.
        let both = pod(
            "both",
            json!({"app": "db", "tier": "cache"}),
            json!({"affinity": terms}),
        );
        assert_eq!(allowed(&both, &nodes), ["node1", "node2"]);
        let mut nodes = nodes;
        Arc::make_mut(&mut nodes[1].labels).remove("zone");
        assert_eq!(allowed(&both, &nodes), ["node1"]);
    }

    #[test]
    fn affinity_and_anti_affinity_look_in_the_namespaces_their_terms_name() {
        let db = Arc::new(PodRecord::of(
            serde_json::from_value(
                json!({"metadata": {"name": "db", "namespace": "data", "labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c"}]}}),
            )
            .unwrap(),
        ));
        let nodes = vec![node("node1", "zoneA", &[db]), node("node2", "zoneB", &[])];
        let with_terms = |extra: serde_json::Value| {
            let mut t =
                json!({"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}});
            for (k, v) in extra.as_object().unwrap() {
                t[k] = v.clone();
            }
            pod(
                "web",
                json!({"app": "web"}),
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}}}),
            )
        };
        // Own namespace only (default): the db in `data` does not count.
        assert_eq!(allowed(&with_terms(json!({})), &nodes), ["node1", "node2"]);
        assert_eq!(
            allowed(&with_terms(json!({"namespaces": ["data"]})), &nodes),
            ["node2"]
        );
        // An empty namespace selector is every namespace.
        assert_eq!(
            allowed(&with_terms(json!({"namespaceSelector": {}})), &nodes),
            ["node2"]
        );
    }
}
