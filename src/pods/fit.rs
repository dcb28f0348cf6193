//! Whether a pod fits a node, the way kube-scheduler's filter plugins decide it, for the
//! predicates the controller simulates: resource requests (cpu, memory, ephemeral-storage, pod
//! count and extended resources such as `nvidia.com/gpu`, init and sidecar containers counted as
//! the scheduler counts them, plus pod overhead), `nodeSelector`, required node affinity
//! (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`, and `matchFields` on `metadata.name`),
//! taints and tolerations (`NoSchedule` and `NoExecute`), host ports, and required pod
//! anti-affinity on `kubernetes.io/hostname` (both directions; a term that picks namespaces by
//! their labels is [`super::topology`]'s, which reads them). The filters that look at other
//! nodes' pods (topology spread, affinity on other keys) are [`super::topology`]'s, and those
//! that read storage objects [`super::volumes`]'. Pure code: no I/O, no clock.

use super::quantity::{self, Milli};
use super::record::{NodeRecord, PodRecord};
use super::topology::SpreadWhy;
use k8s_openapi::api::core::v1::{
    Container, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodAffinityTerm, PodSpec,
    Taint, Toleration, TopologySelectorTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Amounts by resource name, in milli-units (`pods` counts pods, in thousandths). The four
/// resources every pod and node has are fields, extended ones (`nvidia.com/gpu`, ...) a short
/// sorted list: adding a pod's requests onto a node, the inner loop of every simulation, then
/// neither allocates nor compares strings. A resource not set reads as 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    cpu: Milli,
    memory: Milli,
    ephemeral_storage: Milli,
    pods: Milli,
    extended: Vec<(String, Milli)>,
}

impl Resources {
    /// Nothing.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&mut self, k: &str) -> Option<&mut Milli> {
        match k {
            "cpu" => Some(&mut self.cpu),
            "memory" => Some(&mut self.memory),
            "ephemeral-storage" => Some(&mut self.ephemeral_storage),
            "pods" => Some(&mut self.pods),
            _ => None,
        }
    }

    /// The amount of `k` (`Some(&0)` for the four fixed resources when unset, `None` for an
    /// extended resource not there).
    pub fn get(&self, k: &str) -> Option<&Milli> {
        match k {
            "cpu" => Some(&self.cpu),
            "memory" => Some(&self.memory),
            "ephemeral-storage" => Some(&self.ephemeral_storage),
            "pods" => Some(&self.pods),
            _ => self
                .extended
                .binary_search_by(|(name, _)| name.as_str().cmp(k))
                .ok()
                .map(|i| &self.extended[i].1),
        }
    }

    /// Sets `k` to `v`.
    pub fn insert(&mut self, k: String, v: Milli) {
        *self.entry(&k, || k.clone()) = v;
    }

    /// Adds `v` to `k`.
    pub fn add(&mut self, k: &str, v: Milli) {
        *self.entry(k, || k.to_string()) += v;
    }

    fn entry(&mut self, k: &str, owned: impl FnOnce() -> String) -> &mut Milli {
        if self.slot(k).is_some() {
            return self.slot(k).expect("a fixed resource has a slot");
        }
        let i = match self
            .extended
            .binary_search_by(|(name, _)| name.as_str().cmp(k))
        {
            Ok(i) => i,
            Err(i) => {
                self.extended.insert(i, (owned(), 0));
                i
            }
        };
        &mut self.extended[i].1
    }

    /// Every resource with a non-zero amount: the fixed four, then extended ones by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Milli)> {
        [
            ("cpu", self.cpu),
            ("memory", self.memory),
            ("ephemeral-storage", self.ephemeral_storage),
            ("pods", self.pods),
        ]
        .into_iter()
        .chain(self.extended.iter().map(|(k, v)| (k.as_str(), *v)))
        .filter(|(_, v)| *v != 0)
    }

    /// Adds every amount of `other`.
    pub fn add_all(&mut self, other: &Resources) {
        self.cpu += other.cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
        for (k, v) in &other.extended {
            self.add(k, *v);
        }
    }

    /// Takes, per resource, the larger of this and `other`.
    pub fn max_all(&mut self, other: &Resources) {
        self.cpu = self.cpu.max(other.cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.extended {
            let e = self.entry(k, || k.clone());
            *e = (*e).max(*v);
        }
    }
}

impl std::ops::Index<&str> for Resources {
    type Output = Milli;
    fn index(&self, k: &str) -> &Milli {
        self.get(k)
            .unwrap_or_else(|| panic!("no resource {k} in {self:?}"))
    }
}

impl FromIterator<(String, Milli)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Milli)>>(iter: I) -> Self {
        let mut r = Resources::new();
        for (k, v) in iter {
            r.insert(k, v);
        }
        r
    }
}

impl<const N: usize> From<[(String, Milli); N]> for Resources {
    fn from(a: [(String, Milli); N]) -> Self {
        a.into_iter().collect()
    }
}

/// The label the anti-affinity this module simulates is about.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// Why a pod does not fit a node (the scheduler's reasons, in its words where it has them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// Not enough of a resource left.
    Insufficient {
        /// Resource name.
        resource: String,
        /// What the pod asks for (milli-units).
        requested: Milli,
        /// What the node has left (milli-units).
        free: Milli,
    },
    /// `nodeSelector` or required node affinity does not match the node's labels.
    Selector,
    /// A `NoSchedule` or `NoExecute` taint the pod does not tolerate.
    Taint {
        /// Taint key.
        key: String,
        /// Taint value (kube-scheduler's message names key and value).
        value: String,
    },
    /// A host port already taken on the node.
    HostPort {
        /// Port number.
        port: i32,
        /// Protocol.
        protocol: String,
    },
    /// Required anti-affinity on `kubernetes.io/hostname` against a pod on the node (either way).
    AntiAffinity {
        /// The pod on the node that conflicts.
        with: String,
    },
    /// A `DoNotSchedule` topology spread constraint (`PodTopologySpread`).
    TopologySpread {
        /// The constraint's `topologyKey`.
        key: String,
        /// Skew, missing label, or a zone Azure chooses.
        why: SpreadWhy,
    },
    /// A required pod affinity term finds no matching pod in the node's domain.
    PodAffinity,
    /// A required pod anti-affinity term (on a key other than the hostname) finds a matching pod
    /// in the node's domain.
    PodAntiAffinity,
    /// A pod in the node's domain has required anti-affinity against this pod.
    ExistingAntiAffinity,
    /// A bound volume's node affinity (a zonal disk's zone) does not match the node.
    VolumeNodeAffinity,
    /// A claim to be provisioned where the pod goes cannot be provisioned for the node (its
    /// class's allowed topologies, or a node already chosen for it).
    VolumeBinding,
    /// The node would attach more volumes of a driver than it may.
    VolumeCount,
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::Insufficient { resource, .. } if resource == "pods" => {
                f.write_str("Too many pods")
            }
            Unfit::Insufficient { resource, .. } => write!(f, "Insufficient {resource}"),
            Unfit::Selector => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            Unfit::Taint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Unfit::HostPort { port, protocol } => {
                write!(f, "node(s) didn't have free ports ({protocol}/{port})")
            }
            Unfit::AntiAffinity { with } => {
                write!(
                    f,
                    "node(s) didn't match pod anti-affinity rules (with {with})"
                )
            }
            Unfit::TopologySpread { key, why } => {
                f.write_str("node(s) didn't match pod topology spread constraints")?;
                match why {
                    SpreadWhy::Skew => Ok(()),
                    SpreadWhy::MissingLabel => f.write_str(" (missing required label)"),
                    SpreadWhy::SeveralZones => write!(
                        f,
                        " (the group spans several zones and Azure chooses the next node's {key})"
                    ),
                }
            }
            Unfit::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Unfit::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Unfit::ExistingAntiAffinity => {
                f.write_str("node(s) didn't satisfy existing pods anti-affinity rules")
            }
            Unfit::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
            Unfit::VolumeBinding => {
                f.write_str("node(s) didn't find available persistent volumes to bind")
            }
            Unfit::VolumeCount => f.write_str("node(s) exceed max volume count"),
        }
    }
}

impl Unfit {
    /// A short, bounded name of the predicate that failed (a metric label).
    pub fn label(&self) -> &'static str {
        match self {
            Unfit::Insufficient { resource, .. } => match resource.as_str() {
                "cpu" => "insufficient_cpu",
                "memory" => "insufficient_memory",
                "pods" => "too_many_pods",
                "ephemeral-storage" => "insufficient_ephemeral_storage",
                _ => "insufficient_extended_resource",
            },
            Unfit::Selector => "node_selector",
            Unfit::Taint { .. } => "taint",
            Unfit::HostPort { .. } => "host_port",
            Unfit::AntiAffinity { .. } | Unfit::PodAntiAffinity => "pod_anti_affinity",
            Unfit::TopologySpread { .. } => "pod_topology_spread",
            Unfit::PodAffinity => "pod_affinity",
            Unfit::ExistingAntiAffinity => "existing_pod_anti_affinity",
            Unfit::VolumeNodeAffinity => "volume_node_affinity",
            Unfit::VolumeBinding => "volume_binding",
            Unfit::VolumeCount => "max_volume_count",
        }
    }
}

/// What the scheduler counts for a pod: the larger of (containers + sidecars) and the largest
/// init step (each init container runs alongside the sidecars started before it), plus the
/// pod's overhead, plus one pod. A container with a limit but no request asks for its limit,
/// as the API server's defaulting would have made it. Unparseable quantities count as 0 and are
/// reported by [`bad_quantities`].
pub fn pod_requests(spec: &PodSpec) -> Resources {
    let mut sum = Resources::new();
    for c in &spec.containers {
        add_container(&mut sum, c);
    }
    let mut init_max = Resources::new();
    if let Some(inits) = &spec.init_containers {
        let mut sidecars = Resources::new();
        for c in inits {
            let step = if c.restart_policy.as_deref() == Some("Always") {
                add_container(&mut sidecars, c);
                sidecars.clone()
            } else {
                let mut r = container_requests(c);
                add(&mut r, &sidecars);
                r
            };
            max_into(&mut init_max, &step);
        }
        add(&mut sum, &sidecars);
    }
    max_into(&mut sum, &init_max);
    if let Some(overhead) = &spec.overhead {
        for (k, q) in overhead {
            if let Ok(v) = quantity::parse(&q.0) {
                add_one(&mut sum, k, v);
            }
        }
    }
    add_one(&mut sum, "pods", 1000);
    sum
}

fn add_one(sum: &mut Resources, k: &str, v: Milli) {
    sum.add(k, v);
}

/// Adds a container's requests (a limit stands for a missing request) into `sum`.
fn add_container(sum: &mut Resources, c: &Container) {
    let Some(r) = &c.resources else {
        return;
    };
    for (k, q) in r.requests.iter().flatten() {
        if let Ok(v) = quantity::parse(&q.0) {
            add_one(sum, k, v);
        }
    }
    for (k, q) in r.limits.iter().flatten() {
        if r.requests.as_ref().is_some_and(|req| req.contains_key(k)) {
            continue;
        }
        if let Ok(v) = quantity::parse(&q.0) {
            add_one(sum, k, v);
        }
    }
}

/// Quantities in the pod's requests and limits that do not parse: `(container, text)`.
pub fn bad_quantities(spec: &PodSpec) -> Vec<(String, String)> {
    let mut bad = Vec::new();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let r = c.resources.as_ref();
        for q in r
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .chain(r.and_then(|r| r.limits.as_ref()))
            .flat_map(|m| m.values())
        {
            if quantity::parse(&q.0).is_err() {
                bad.push((c.name.clone(), q.0.clone()));
            }
        }
    }
    bad
}

fn container_requests(c: &Container) -> Resources {
    let Some(r) = &c.resources else {
        return Resources::new();
    };
    let mut out = Resources::new();
    for (k, q) in r.limits.iter().flatten() {
        if let Ok(v) = quantity::parse(&q.0) {
            out.insert(k.clone(), v);
        }
    }
    for (k, q) in r.requests.iter().flatten() {
        if let Ok(v) = quantity::parse(&q.0) {
            out.insert(k.clone(), v);
        }
    }
    out
}

fn add(into: &mut Resources, other: &Resources) {
    into.add_all(other);
}

fn max_into(into: &mut Resources, other: &Resources) {
    into.max_all(other);
}

/// A host port a container binds: `(protocol, hostIP, port)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPort {
    protocol: String,
    ip: String,
    port: i32,
}

impl HostPort {
    fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == other.port
            && self.protocol == other.protocol
            && (any(&self.ip) || any(&other.ip) || self.ip == other.ip)
    }
}

fn host_ports(spec: &PodSpec) -> Vec<HostPort> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port.filter(|hp| *hp > 0).map(|port| HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
            })
        })
        .collect()
}

/// The pods on one node and what they take: their summed requests, their host ports, and how
/// many have required anti-affinity or any rule about other nodes' pods. Kept per node across
/// decisions by [`super::index::PodIndex`]; a decision's [`NodeState`] points at it.
#[derive(Debug, Clone, Default)]
pub struct Placed {
    pods: Vec<Arc<PodRecord>>,
    requested: Resources,
    ports: Vec<HostPort>,
    /// Pods with required anti-affinity terms (only then do others' terms need a look).
    anti_affinity_pods: usize,
    /// Pods with a rule about other nodes' pods ([`PodFacts::has_cross_node_rules`]).
    cross_node_pods: usize,
    /// Pods with volume claims (their volumes say where they may move).
    claim_pods: usize,
    /// Pods with required anti-affinity on a key other than the hostname (they keep pods out
    /// of whole domains).
    remote_anti_pods: usize,
}

impl Placed {
    /// These pods, summed.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Arc<PodRecord>>) -> Self {
        let mut placed = Self::default();
        for p in pods {
            placed.add(p.clone());
        }
        placed
    }

    /// Adds a pod: its requests, host ports and rules count from now on.
    pub fn add(&mut self, pod: Arc<PodRecord>) {
        let facts = pod.facts();
        add(&mut self.requested, &facts.requests);
        self.ports.extend(facts.ports.iter().cloned());
        self.anti_affinity_pods += usize::from(facts.anti_affinity);
        self.cross_node_pods += usize::from(facts.cross_node);
        self.claim_pods += usize::from(facts.claims);
        self.remote_anti_pods += usize::from(facts.remote_anti_affinity);
        self.pods.push(pod);
    }

    /// Removes the pod of this namespace and name, if here; the sums are made again from the
    /// pods left (a node holds tens of pods: exact, and no subtraction to drift).
    pub fn remove(&mut self, pod: &PodRecord) -> bool {
        let before = self.pods.len();
        self.pods
            .retain(|p| !(p.name == pod.name && p.namespace == pod.namespace));
        if self.pods.len() == before {
            return false;
        }
        *self = Self::of(&std::mem::take(&mut self.pods));
        true
    }

    /// The pods.
    pub fn pods(&self) -> &[Arc<PodRecord>] {
        &self.pods
    }

    /// Their summed requests.
    pub fn requested(&self) -> &Resources {
        &self.requested
    }

    /// Whether any has a rule about other nodes' pods.
    pub fn any_cross_node_rules(&self) -> bool {
        self.cross_node_pods > 0
    }

    /// Whether any has volume claims.
    pub fn any_claims(&self) -> bool {
        self.claim_pods > 0
    }

    /// Whether any has required anti-affinity on a key other than the hostname.
    pub fn any_remote_anti_affinity(&self) -> bool {
        self.remote_anti_pods > 0
    }
}

/// A node as the fit sees it: what it offers and what its pods already take. Built from a live
/// Node and its pods, or from a template for a node that does not exist yet; [`NodeState::place`]
/// adds a pod in a simulation.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// Node name (for matchFields and anti-affinity's hostname).
    pub name: String,
    /// Labels.
    pub labels: Arc<BTreeMap<String, String>>,
    /// Taints.
    pub taints: Arc<Vec<Taint>>,
    /// Allocatable, including `pods`.
    pub allocatable: Resources,
    /// Its pods and what they take: shared with the pod index a decision starts from, copied
    /// only when a simulation places a pod here.
    placed: Arc<Placed>,
    /// A template of a group spanning several zones: its labels in each zone a new node may land
    /// in (Azure chooses). A node selector or required node affinity must match in every one;
    /// `labels` then carries no zone.
    zone_variants: Option<Arc<Vec<BTreeMap<String, String>>>>,
    /// Per CSI driver, how many volumes the node may attach (a live node's `CSINode`, a
    /// template's VM size); none: no limit.
    volume_limits: Option<Arc<BTreeMap<String, u32>>>,
}

/// What the fit checks need of a pod's spec, computed once per shape (see
/// [`PodShape`](super::record::PodShape)): parsing quantities is the costly part of a check, and
/// a simulation asks the same pod against many nodes.
#[derive(Debug, Clone, Default)]
pub struct PodFacts {
    /// [`pod_requests`].
    pub requests: Resources,
    ports: Vec<HostPort>,
    anti_affinity: bool,
    cross_node: bool,
    remote_anti_affinity: bool,
    claims: bool,
}

impl PodFacts {
    /// Whether the pod has a rule about other nodes' pods ([`super::topology::has_rules`]).
    pub fn has_cross_node_rules(&self) -> bool {
        self.cross_node
    }

    /// Whether the pod has required anti-affinity on a key other than the hostname.
    pub fn has_remote_anti_affinity(&self) -> bool {
        self.remote_anti_affinity
    }

    /// Whether the pod has required anti-affinity terms.
    pub fn has_anti_affinity(&self) -> bool {
        self.anti_affinity
    }

    /// Whether the pod has volume claims ([`super::volumes::has_claims`]).
    pub fn has_claims(&self) -> bool {
        self.claims
    }

    /// The facts of `spec`.
    pub fn of(spec: &PodSpec) -> Self {
        Self {
            requests: pod_requests(spec),
            ports: host_ports(spec),
            anti_affinity: required_anti_affinity(spec).next().is_some(),
            cross_node: super::topology::has_rules(spec),
            remote_anti_affinity: super::topology::has_remote_anti_affinity(spec),
            claims: super::volumes::has_claims(spec),
        }
    }
}

impl NodeState {
    /// An empty node with these labels, taints and allocatable resources.
    pub fn new(
        name: &str,
        labels: BTreeMap<String, String>,
        taints: Vec<Taint>,
        allocatable: Resources,
    ) -> Self {
        Self {
            name: name.to_string(),
            labels: Arc::new(labels),
            taints: Arc::new(taints),
            allocatable,
            placed: Arc::default(),
            zone_variants: None,
            volume_limits: None,
        }
    }

    /// A live node (its allocatable, labels and taints) with the pods bound to it.
    pub fn from_node<'a>(
        node: &NodeRecord,
        pods: impl IntoIterator<Item = &'a Arc<PodRecord>>,
    ) -> Self {
        Self::with_placed(node, Arc::new(Placed::of(pods)))
    }

    /// A live node with its pods as the pod index keeps them (shared, not copied).
    pub fn with_placed(node: &NodeRecord, placed: Arc<Placed>) -> Self {
        // The labels and taints are the node's own, shared: copying a node copies pointers.
        Self {
            name: node.name.clone(),
            labels: node.labels.clone(),
            taints: node.taints.clone(),
            allocatable: node.allocatable.clone(),
            placed,
            zone_variants: None,
            volume_limits: None,
        }
    }

    /// The node without its pods (what it offers, its labels and taints).
    pub fn bare(&self) -> NodeState {
        NodeState {
            name: self.name.clone(),
            labels: self.labels.clone(),
            taints: self.taints.clone(),
            allocatable: self.allocatable.clone(),
            placed: Arc::default(),
            zone_variants: self.zone_variants.clone(),
            volume_limits: self.volume_limits.clone(),
        }
    }

    /// Adds a pod: its requests, host ports and labels count from now on.
    pub fn place(&mut self, pod: Arc<PodRecord>) {
        Arc::make_mut(&mut self.placed).add(pod);
    }

    /// Its pods (bound, nominated, and those a simulation placed).
    pub fn pods(&self) -> &[Arc<PodRecord>] {
        &self.placed.pods
    }

    /// The summed requests of its pods.
    pub fn requested(&self) -> &Resources {
        &self.placed.requested
    }

    /// Whether any of its pods has a rule about other nodes' pods.
    pub fn any_cross_node_rules(&self) -> bool {
        self.placed.any_cross_node_rules()
    }

    /// Whether any of its pods has volume claims.
    pub fn any_claims(&self) -> bool {
        self.placed.any_claims()
    }

    /// Whether any of its pods has required anti-affinity on a key other than the hostname.
    pub fn any_remote_anti_affinity(&self) -> bool {
        self.placed.any_remote_anti_affinity()
    }

    /// How many pods like `pod` this node, empty as it is now, takes by resources (1 for a pod
    /// with host ports or anti-affinity on the hostname; 0 if it does not fit at all).
    pub fn how_many(&self, pod: &PodRecord) -> u32 {
        if self.fits(pod).is_err() {
            return 0;
        }
        let facts = pod.facts();
        if !facts.ports.is_empty() || facts.anti_affinity {
            return 1;
        }
        facts
            .requests
            .iter()
            .filter(|(_, want)| *want > 0)
            .map(|(r, want)| u32::try_from(self.free(r) / want).unwrap_or(u32::MAX))
            .min()
            .unwrap_or(u32::MAX)
            .max(1)
    }

    /// What is left of `resource`.
    pub fn free(&self, resource: &str) -> Milli {
        self.allocatable.get(resource).copied().unwrap_or(0)
            - self.placed.requested.get(resource).copied().unwrap_or(0)
    }

    /// Whether `pod` fits, or the first reason it does not (checked in the scheduler's filter
    /// order: selector and affinity, taints, ports, anti-affinity, resources).
    pub fn fits(&self, pod: &PodRecord) -> Result<(), Unfit> {
        let spec = pod.spec();
        let facts = pod.facts();
        if !self.matches_selector(spec) {
            return Err(Unfit::Selector);
        }
        if let Some(t) = self.taints.iter().find(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !spec
                    .tolerations
                    .iter()
                    .flatten()
                    .any(|tol| tolerates(tol, t))
        }) {
            return Err(Unfit::Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
            });
        }
        for want in &facts.ports {
            if self.placed.ports.iter().any(|have| have.conflicts(want)) {
                return Err(Unfit::HostPort {
                    port: want.port,
                    protocol: want.protocol.clone(),
                });
            }
        }
        if facts.anti_affinity || self.placed.anti_affinity_pods > 0 {
            if let Some(with) = self.anti_affinity_conflict(pod) {
                return Err(Unfit::AntiAffinity { with });
            }
        }
        for (resource, requested) in facts.requests.iter() {
            if requested <= 0 {
                continue;
            }
            let free = self.free(resource);
            if requested > free {
                return Err(Unfit::Insufficient {
                    resource: resource.to_string(),
                    requested,
                    free,
                });
            }
        }
        Ok(())
    }

    /// Makes this template one of a group spanning several zones: `variants` are its labels in
    /// each zone (see the field).
    pub fn set_zone_variants(&mut self, variants: Vec<BTreeMap<String, String>>) {
        self.zone_variants = Some(Arc::new(variants));
    }

    /// The zone variants, if this is the template of a group spanning several zones.
    pub fn zone_variants(&self) -> Option<&[BTreeMap<String, String>]> {
        self.zone_variants.as_deref().map(Vec::as_slice)
    }

    /// Per CSI driver, how many volumes the node may attach, if it says.
    pub fn volume_limits(&self) -> Option<&BTreeMap<String, u32>> {
        self.volume_limits.as_deref()
    }

    /// Sets the attach limits (see [`NodeState::volume_limits`]).
    pub fn set_volume_limits(&mut self, limits: Option<Arc<BTreeMap<String, u32>>>) {
        self.volume_limits = limits;
    }

    /// Whether a volume's required node affinity holds here (terms ORed; in every zone a
    /// template spanning several may land in).
    pub(crate) fn matches_node_selector(&self, selector: &NodeSelector) -> bool {
        let on = |labels: &BTreeMap<String, String>| {
            selector
                .node_selector_terms
                .iter()
                .any(|t| self.matches_term(labels, t))
        };
        match &self.zone_variants {
            Some(variants) => variants.iter().all(on),
            None => on(&self.labels),
        }
    }

    /// Whether a class's allowed topologies hold here: no term at all allows every node; terms
    /// are ORed, a term's expressions (`key In values`) ANDed, and a term without any matches
    /// no node.
    pub(crate) fn matches_topology(&self, terms: &[TopologySelectorTerm]) -> bool {
        if terms.is_empty() {
            return true;
        }
        let on = |labels: &BTreeMap<String, String>| {
            terms.iter().any(|t| {
                let exprs = t.match_label_expressions.as_deref().unwrap_or_default();
                !exprs.is_empty()
                    && exprs.iter().all(|e| {
                        labels
                            .get(&e.key)
                            .is_some_and(|v| e.values.iter().any(|x| x == v))
                    })
            })
        };
        match &self.zone_variants {
            Some(variants) => variants.iter().all(on),
            None => on(&self.labels),
        }
    }

    /// Whether the pod's node selector and required node affinity hold here (in every zone a
    /// template spanning several may land in).
    pub(crate) fn matches_selector(&self, spec: &PodSpec) -> bool {
        match &self.zone_variants {
            Some(variants) => variants
                .iter()
                .all(|labels| self.matches_selector_on(labels, spec)),
            None => self.matches_selector_on(&self.labels, spec),
        }
    }

    fn matches_selector_on(&self, labels: &BTreeMap<String, String>, spec: &PodSpec) -> bool {
        let selector_ok = spec
            .node_selector
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v));
        let affinity_ok = match spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }) {
            None => true,
            // The terms are ORed; an empty list matches no node.
            Some(sel) => sel
                .node_selector_terms
                .iter()
                .any(|t| self.matches_term(labels, t)),
        };
        selector_ok && affinity_ok
    }

    /// A term's requirements are ANDed; a term with none matches no node.
    fn matches_term(&self, labels: &BTreeMap<String, String>, term: &NodeSelectorTerm) -> bool {
        let exprs = term.match_expressions.iter().flatten();
        let fields = term.match_fields.iter().flatten();
        let mut any = false;
        for r in exprs {
            any = true;
            if !requirement(r, labels.get(&r.key).map(String::as_str)) {
                return false;
            }
        }
        for r in fields {
            any = true;
            let value = (r.key == "metadata.name").then_some(self.name.as_str());
            if !requirement(r, value) {
                return false;
            }
        }
        any
    }

    fn anti_affinity_conflict(&self, pod: &PodRecord) -> Option<String> {
        let spec = pod.spec();
        for existing in &self.placed.pods {
            // The incoming pod's terms against the pods already there...
            if required_anti_affinity(spec)
                .any(|t| on_this_node(t) && term_selects(t, pod, existing))
            {
                return Some(existing.key());
            }
            // ...and theirs against the incoming pod.
            if required_anti_affinity(existing.spec())
                .any(|t| on_this_node(t) && term_selects(t, existing, pod))
            {
                return Some(existing.key());
            }
        }
        None
    }
}

fn required_anti_affinity(spec: &PodSpec) -> impl Iterator<Item = &PodAffinityTerm> {
    spec.affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
}

/// Whether an anti-affinity term is decided here: on the hostname, in namespaces known without
/// reading any namespace's labels.
fn on_this_node(term: &PodAffinityTerm) -> bool {
    term.topology_key == HOSTNAME && !has_namespace_selector(term)
}

/// Whether a term picks namespaces by their labels (a non-empty `namespaceSelector`; an empty
/// one is every namespace).
pub(crate) fn has_namespace_selector(term: &PodAffinityTerm) -> bool {
    term.namespace_selector
        .as_ref()
        .is_some_and(|s| !is_empty_selector(s))
}

/// Whether an affinity term of `owner` selects `other` (with the term's `matchLabelKeys` and
/// `mismatchLabelKeys` taking their values from `owner`, as the API server merges them).
fn term_selects(term: &PodAffinityTerm, owner: &PodRecord, other: &PodRecord) -> bool {
    let owner_ns = owner.namespace.as_str();
    let other_ns = other.namespace.as_str();
    let in_ns = match (&term.namespaces, &term.namespace_selector) {
        // An empty namespace selector selects every namespace.
        (_, Some(sel)) if is_empty_selector(sel) => true,
        (Some(list), _) if !list.is_empty() => list.iter().any(|n| n == other_ns),
        _ => owner_ns == other_ns,
    };
    if !in_ns {
        return false;
    }
    let keys = (
        term.match_label_keys.as_deref().unwrap_or_default(),
        term.mismatch_label_keys.as_deref().unwrap_or_default(),
    );
    if keys.0.is_empty() && keys.1.is_empty() {
        return term
            .label_selector
            .as_ref()
            .is_some_and(|s| label_selector_matches(s, &other.labels));
    }
    super::topology::merged(term.label_selector.as_ref(), keys.0, keys.1, &owner.labels)
        .is_some_and(|s| label_selector_matches(&s, &other.labels))
}

pub(crate) fn is_empty_selector(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && s.match_expressions.as_ref().is_none_or(|m| m.is_empty())
}

/// `metav1.LabelSelector` semantics: matchLabels and matchExpressions ANDed; empty selects all.
pub fn label_selector_matches(s: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    s.match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && s.match_expressions.iter().flatten().all(|e| {
            let have = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            }
        })
}

/// One node selector requirement against the label (or field) value, `None` when absent.
fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// `v1.Toleration.ToleratesTaint`.
pub fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = tol.effect.as_deref().filter(|e| !e.is_empty()) {
        if effect != taint.effect {
            return false;
        }
    }
    if let Some(key) = tol.key.as_deref().filter(|k| !k.is_empty()) {
        if key != taint.key {
            return false;
        }
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodRecord {
        let mut v = v;
        if v.get("metadata").is_none() {
            v["metadata"] = json!({"name": "p", "namespace": "default"});
        }
        PodRecord::of(serde_json::from_value(v).expect("a pod"))
    }

    fn node(
        labels: serde_json::Value,
        taints: serde_json::Value,
        alloc: serde_json::Value,
    ) -> NodeState {
        let n: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
            "metadata": {"name": "node-1", "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": alloc},
        }))
        .expect("a node");
        NodeState::from_node(&NodeRecord::of(n), [])
    }

    fn roomy() -> NodeState {
        node(
            json!({"kubernetes.io/hostname": "node-1", "zone": "1", "gen": "5"}),
            json!([]),
            json!({"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}),
        )
    }

    fn containers(reqs: &[serde_json::Value]) -> serde_json::Value {
        json!(reqs
            .iter()
            .enumerate()
            .map(|(i, r)| json!({"name": format!("c{i}"), "resources": {"requests": r}}))
            .collect::<Vec<_>>())
    }

    #[test]
    fn requests_sum_the_containers_and_take_the_larger_init_step() {
        // The scheduler's documented example: init containers run one at a time, so the
        // effective request is max(sum of app containers, largest init container).
        let spec = pod(json!({"spec": {
            "containers": containers(&[json!({"cpu": "100m"}), json!({"cpu": "200m"})]),
            "initContainers": containers(&[json!({"cpu": "500m"}), json!({"memory": "1Gi"})]),
        }}))
        .spec()
        .clone();
        let r = pod_requests(&spec);
        assert_eq!(r["cpu"], 500);
        assert_eq!(r["memory"], (1i128 << 30) * 1000);
        assert_eq!(r["pods"], 1000);
    }

    #[test]
    fn sidecars_run_beside_the_app_and_beside_later_init_containers() {
        // A restartable init container (restartPolicy: Always) is a sidecar: it adds to the
        // app containers, and to every init container that starts after it.
        let spec = pod(json!({"spec": {
            "containers": containers(&[json!({"cpu": "100m"})]),
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "1"}}},
            ],
            "overhead": {"cpu": "10m"},
        }}))
        .spec()
        .clone();
        // max(100 + 200, 1000 + 200) + 10 overhead
        assert_eq!(pod_requests(&spec)["cpu"], 1210);
    }

    #[test]
    fn a_limit_without_a_request_asks_for_the_limit() {
        let spec = pod(json!({"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}, "requests": {"cpu": "1"}}}
        ]}}))
        .spec()
        .clone();
        let r = pod_requests(&spec);
        assert_eq!(r["nvidia.com/gpu"], 1000);
        assert_eq!(r["cpu"], 1000);
    }

    #[test]
    fn resources_pod_count_and_extended_resources_must_fit() {
        let n = roomy();
        let fits =
            |r: serde_json::Value| n.fits(&pod(json!({"spec": {"containers": containers(&[r])}})));
        assert_eq!(fits(json!({"cpu": "4", "memory": "16Gi"})), Ok(()));
        assert!(matches!(
            fits(json!({"cpu": "4001m"})),
            Err(Unfit::Insufficient { ref resource, requested: 4001, free: 4000 }) if resource == "cpu"
        ));
        assert!(matches!(
            fits(json!({"nvidia.com/gpu": "1"})),
            Err(Unfit::Insufficient { ref resource, .. }) if resource == "nvidia.com/gpu"
        ));
        let mut full = node(json!({}), json!([]), json!({"cpu": "4", "pods": "1"}));
        full.place(Arc::new(pod(json!({"spec": {"containers": []}}))));
        let e = full
            .fits(&pod(json!({"spec": {"containers": []}})))
            .unwrap_err();
        assert_eq!(e.to_string(), "Too many pods");
    }

    #[test]
    fn placed_pods_use_up_the_room() {
        let mut n = roomy();
        let half = || pod(json!({"spec": {"containers": containers(&[json!({"cpu": "2"})])}}));
        n.place(Arc::new(half()));
        assert_eq!(n.fits(&half()), Ok(()));
        n.place(Arc::new(half()));
        assert!(n.fits(&half()).is_err());
        assert_eq!(n.free("cpu"), 0);
    }

    /// Node affinity as the scheduler documents it (`In`, `NotIn`, `Exists`, `DoesNotExist`,
    /// `Gt`, `Lt`; terms ORed, expressions ANDed; an empty term list matches nothing).
    #[test]
    fn node_selector_and_required_node_affinity_follow_the_scheduler_table() {
        let n = roomy(); // labels zone=1, gen=5
        let with_terms = |terms: serde_json::Value| {
            pod(
                json!({"spec": {"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}}),
            )
        };
        let expr = |key: &str, op: &str, values: &[&str]| json!({"key": key, "operator": op, "values": values});
        let cases = [
            (
                json!([{"matchExpressions": [expr("zone", "In", &["1", "2"])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("zone", "In", &["3"])]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [expr("zone", "NotIn", &["3"])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("absent", "NotIn", &["3"])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("zone", "Exists", &[])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("zone", "DoesNotExist", &[])]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [expr("gen", "Gt", &["4"])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("gen", "Gt", &["5"])]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [expr("gen", "Lt", &["6"])]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [expr("zone", "Gt", &["x"])]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [expr("absent", "Lt", &["9"])]}]),
                false,
            ),
            // ANDed within a term
            (
                json!([{"matchExpressions": [expr("zone", "In", &["1"]), expr("gen", "In", &["4"])]}]),
                false,
            ),
            // ORed across terms
            (
                json!([{"matchExpressions": [expr("zone", "In", &["9"])]}, {"matchExpressions": [expr("gen", "In", &["5"])]}]),
                true,
            ),
            (
                json!([{"matchFields": [expr("metadata.name", "In", &["node-1"])]}]),
                true,
            ),
            (
                json!([{"matchFields": [expr("metadata.name", "NotIn", &["node-1"])]}]),
                false,
            ),
            (json!([]), false),
            (json!([{}]), false),
        ];
        for (terms, want) in cases {
            let got = n.fits(&with_terms(terms.clone())).is_ok();
            assert_eq!(got, want, "{terms}");
        }
        let selected =
            |sel: serde_json::Value| pod(json!({"spec": {"containers": [], "nodeSelector": sel}}));
        assert_eq!(n.fits(&selected(json!({"zone": "1"}))), Ok(()));
        assert_eq!(
            n.fits(&selected(json!({"zone": "2"}))),
            Err(Unfit::Selector)
        );
    }

    /// `ToleratesTaint`: effect must match unless empty; key must match unless empty with
    /// `Exists`; `Equal` compares values. `PreferNoSchedule` never blocks.
    #[test]
    fn taints_block_unless_tolerated_as_the_scheduler_tolerates_them() {
        let gpu = node(
            json!({}),
            json!([{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
                   {"key": "soft", "effect": "PreferNoSchedule"}]),
            json!({"cpu": "4", "pods": "10"}),
        );
        let with =
            |tols: serde_json::Value| pod(json!({"spec": {"containers": [], "tolerations": tols}}));
        let cases = [
            (json!([]), false),
            (
                json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
                true,
            ),
            (
                json!([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true"}]),
                true,
            ),
            (json!([{"key": "nvidia.com/gpu", "value": "true"}]), true),
            (json!([{"key": "nvidia.com/gpu", "value": "false"}]), false),
            (
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
                false,
            ),
            (
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
                true,
            ),
            (json!([{"operator": "Exists"}]), true),
            (json!([{"key": "other", "operator": "Exists"}]), false),
        ];
        for (tols, want) in cases {
            assert_eq!(gpu.fits(&with(tols.clone())).is_ok(), want, "{tols}");
        }
        assert_eq!(
            gpu.fits(&with(json!([]))).unwrap_err().to_string(),
            "node(s) had untolerated taint {nvidia.com/gpu: true}",
            "kube-scheduler's words: key and value"
        );
    }

    #[test]
    fn a_host_port_can_be_bound_once_per_protocol_and_address() {
        let mut n = roomy();
        let bind = |port: i32, proto: &str, ip: &str| {
            pod(json!({"spec": {"containers": [{"name": "c", "ports": [
                {"containerPort": 80, "hostPort": port, "protocol": proto, "hostIP": ip}]}]}}))
        };
        n.place(Arc::new(bind(8080, "TCP", "")));
        assert!(matches!(
            n.fits(&bind(8080, "TCP", "")),
            Err(Unfit::HostPort { port: 8080, .. })
        ));
        assert!(
            n.fits(&bind(8080, "TCP", "10.0.0.1")).is_err(),
            "0.0.0.0 covers every address"
        );
        assert_eq!(n.fits(&bind(8080, "UDP", "")), Ok(()));
        assert_eq!(n.fits(&bind(8081, "TCP", "")), Ok(()));
    }

    #[test]
    fn hostname_anti_affinity_with_match_label_keys_keeps_apart_only_the_same_revision() {
        let rev = |name: &str, hash: &str| {
            Arc::new(pod(
                json!({"metadata": {"name": name, "namespace": "default",
                    "labels": {"app": "web", "pod-template-hash": hash}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "web"}},
                         "matchLabelKeys": ["pod-template-hash"]}]}}}}),
            ))
        };
        let mut n = roomy();
        n.place(rev("old", "a"));
        // The new revision's pod may share a node with the old one, not with its own kind.
        assert_eq!(n.fits(&rev("new-1", "b")), Ok(()));
        n.place(rev("new-1", "b"));
        assert!(matches!(
            n.fits(&rev("new-2", "b")),
            Err(Unfit::AntiAffinity { .. })
        ));
    }

    #[test]
    fn required_anti_affinity_on_hostname_is_checked_both_ways() {
        let anti = |name: &str, app: &str| {
            pod(
                json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": app}}}]}}}}),
            )
        };
        let plain = |name: &str, app: &str, ns: &str| {
            pod(
                json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                "spec": {"containers": []}}),
            )
        };
        let mut n = roomy();
        n.place(Arc::new(anti("web-1", "web")));
        assert!(matches!(
            n.fits(&anti("web-2", "web")),
            Err(Unfit::AntiAffinity { .. })
        ));
        // The pod already there repels a matching newcomer even without its own terms.
        assert!(n.fits(&plain("web-3", "web", "default")).is_err());
        // Another namespace is not selected by a term without namespaces.
        assert_eq!(n.fits(&plain("web-4", "web", "other")), Ok(()));
        assert_eq!(n.fits(&anti("db-1", "db")), Ok(()));
    }

    #[test]
    fn unparseable_quantities_are_reported_not_guessed() {
        let spec = pod(json!({"spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}))
        .spec()
        .clone();
        assert_eq!(
            bad_quantities(&spec),
            [("c".to_string(), "lots".to_string())]
        );
        assert_eq!(
            pod_requests(&spec).get("cpu"),
            Some(&0),
            "counted as nothing"
        );
    }
}
