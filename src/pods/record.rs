//! Pods and nodes as the controller keeps them: the fields the scale-up decision, the
//! scale-down and the drain read, and nothing else. A real API server's pod is several KiB of JSON (managed fields,
//! env, probes, a projected token volume, container statuses), and k8s-openapi's `Pod` is 2 KiB
//! before any of it is filled (a `Container` is another 2 KiB, a `Volume` 3 KiB), so a 50,000-pod
//! cluster held as `Pod`s costs hundreds of MiB.
//!
//! A [`PodRecord`] keeps the pod's own fields (name, namespace, uid, resourceVersion, node,
//! phase, whether the scheduler found no room, its controller, the annotations
//! cluster-autoscaler defines) and shares the rest: pods of one ReplicaSet have the same spec
//! and the same labels, so an [`Interner`] hands them one [`PodShape`] (the spec, slimmed to what
//! scheduling reads, with its fit facts parsed once) and one label map. Same shape, same `Arc`:
//! equal pods are recognised by a pointer comparison, and a cluster's worth of pods parses a few
//! hundred specs, not 50,000.
//!
//! A [`NodeRecord`] keeps what the decisions read of a node (name, providerID, labels, taints,
//! readiness, whether it is cordoned, its allocatable parsed once, cluster-autoscaler's
//! annotations) and drops the rest (fifty image names, node info, managed fields: about 14 KiB of
//! JSON per node). Its labels and taints are shared with every simulation that copies the node,
//! so a planning pass over 5,000 nodes copies pointers, not label maps. Pure code.

use super::fit::{PodFacts, Resources};
use super::quantity;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, Taint, Volume};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// A pod's `terminationGracePeriodSeconds` when its spec does not say.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;

/// How long past its deletion time and grace period a pod counts as long terminating
/// (cluster-autoscaler's `PodLongTerminatingExtraThreshold`).
pub const LONG_TERMINATING_EXTRA: std::time::Duration = std::time::Duration::from_secs(30);

/// The annotation the kubelet puts on a static pod's mirror.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The annotation naming the ProvisioningRequest (same namespace) whose booked capacity the pod
/// consumes.
pub const CONSUME_PROVISIONING_REQUEST: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

/// The annotation naming that request's provisioning class; a consumer carries both.
pub const PROVISIONING_CLASS_NAME: &str = "autoscaling.x-k8s.io/provisioning-class-name";
/// Pod or node annotation: `"true"` (or, on a pod, a duration from its start such as `"4h"`)
/// keeps its node out of consolidation (Karpenter's).
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Pod annotation: what deleting the pod costs, relative to its ReplicaSet's other pods
/// (Kubernetes'; consolidation's disruption cost reads it as Karpenter does).
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// A pod's controller: its owner reference with `controller: true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// `ReplicaSet`, `DaemonSet`, `Job`, `StatefulSet`, ...
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// What scheduling reads of a pod's spec, with its fit facts: shared by every pod that has it.
#[derive(Debug)]
pub struct PodShape {
    /// The spec without `nodeName`, slimmed to the fields scheduling reads (see [`slim_spec`]).
    pub spec: PodSpec,
    /// Requests, host ports, anti-affinity: parsed once.
    pub facts: PodFacts,
}

impl PodShape {
    /// The shape of `spec` (`nodeName` is dropped; slim it first with [`slim_spec`]).
    pub fn new(mut spec: PodSpec) -> Self {
        spec.node_name = None;
        let facts = PodFacts::of(&spec);
        Self { spec, facts }
    }
}

/// A pod as the controller keeps it (see the module documentation).
#[derive(Debug, Clone)]
pub struct PodRecord {
    /// Namespace (`default` when the object had none).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// Labels (shared with the pods that have the same).
    pub labels: Arc<BTreeMap<String, String>>,
    /// The annotations the controller reads (`cluster-autoscaler.kubernetes.io/*`, the
    /// mirror-pod mark, a ProvisioningRequest consumer's two); every other one is dropped.
    pub annotations: BTreeMap<String, String>,
    /// Its controller, if it has one.
    pub controller: Option<Controller>,
    /// `spec.nodeName`: the node it is bound to.
    pub node_name: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// The scheduler found no node for it (`PodScheduled=False`, reason `Unschedulable`).
    pub unschedulable: bool,
    /// `status.nominatedNodeName`: the scheduler is preempting lower-priority pods on that node
    /// to make room for it.
    pub nominated_node: Option<String>,
    /// `metadata.deletionTimestamp` is set: it is going away (spread no longer counts it, as
    /// the scheduler does not; affinity still does).
    pub terminating: bool,
    /// When it was deleted and with what grace period (`metadata.deletionTimestamp`, and
    /// `metadata.deletionGracePeriodSeconds` or else `spec.terminationGracePeriodSeconds`,
    /// 30 s by default), when it was: see [`PodRecord::long_terminating`].
    pub deleted: Option<(k8s_openapi::jiff::Timestamp, i64)>,
    /// Its spec and fit facts (shared with the pods that have the same).
    pub shape: Arc<PodShape>,
    /// `status.startTime`: when the kubelet started it (a `karpenter.sh/do-not-disrupt`
    /// duration counts from it).
    pub started: Option<k8s_openapi::jiff::Timestamp>,
}

impl PodRecord {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `Succeeded` or `Failed`: finished, it takes no room and asks for none (the pods reflector
    /// watches only unfinished pods: [`crate::kube::reflect::UNFINISHED_PODS`]).
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// cluster-autoscaler's long-terminating rule (`drain.IsPodLongTerminating`): deleted, and
    /// `now` is past its deletion time plus its grace period plus
    /// [`LONG_TERMINATING_EXTRA`]. Such a pod is going away without anyone confirming it (a
    /// kubelet that died): it is no pod to move or drain, holds no node and counts in no
    /// utilisation.
    pub fn long_terminating(&self, now: k8s_openapi::jiff::Timestamp) -> bool {
        let Some((at, grace)) = self.deleted else {
            return false;
        };
        let past = k8s_openapi::jiff::SignedDuration::from_secs(
            grace
                .max(0)
                .saturating_add(LONG_TERMINATING_EXTRA.as_secs() as i64),
        );
        at.checked_add(past).is_ok_and(|end| end < now)
    }

    /// The workload the pod belongs to: `namespace/Kind/name` of its controller (a ReplicaSet,
    /// a Job, a StatefulSet), else the pod's own key. Its replacements share it, so a decision
    /// about the workload outlives any one of its pods.
    pub fn workload(&self) -> String {
        match &self.controller {
            Some(c) => format!("{}/{}/{}", self.namespace, c.kind, c.name),
            None => self.key(),
        }
    }

    /// The spec (without `nodeName`: see [`PodRecord::node_name`]).
    pub fn spec(&self) -> &PodSpec {
        &self.shape.spec
    }

    /// What the fit checks need, parsed once per shape.
    pub fn facts(&self) -> &PodFacts {
        &self.shape.facts
    }

    /// `spec.priority` (0 when unset).
    pub fn priority(&self) -> i32 {
        self.shape.spec.priority.unwrap_or(0)
    }

    /// One of the kept annotations.
    pub fn annotation(&self, name: &str) -> Option<&str> {
        self.annotations.get(name).map(String::as_str)
    }

    /// The ProvisioningRequest whose booked capacity it consumes: it carries both
    /// [`CONSUME_PROVISIONING_REQUEST`] and [`PROVISIONING_CLASS_NAME`], as the proposal asks.
    pub fn consumes_provisioning_request(&self) -> Option<&str> {
        self.annotation(PROVISIONING_CLASS_NAME)?;
        self.annotation(CONSUME_PROVISIONING_REQUEST)
            .filter(|n| !n.is_empty())
    }

    /// Whether it is bound to a node.
    pub fn is_bound(&self) -> bool {
        self.node_name.as_deref().is_some_and(|n| !n.is_empty())
    }

    /// Whether a DaemonSet controls it.
    pub fn is_daemonset_pod(&self) -> bool {
        self.controller
            .as_ref()
            .is_some_and(|c| c.kind == "DaemonSet")
    }

    /// Whether it is a static pod's mirror (the kubelet's, not evictable).
    pub fn is_mirror(&self) -> bool {
        self.annotations.contains_key(MIRROR_ANNOTATION)
    }

    /// A record of `pod` sharing nothing (tests, one-off pods); the reflector uses an
    /// [`Interner`].
    pub fn of(pod: Pod) -> Self {
        Interner::default().record(pod)
    }
}

impl From<Pod> for PodRecord {
    fn from(pod: Pod) -> Self {
        Self::of(pod)
    }
}

/// A node as the controller keeps it (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct NodeRecord {
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.resourceVersion` (our taint is written under it).
    pub resource_version: Option<String>,
    /// `metadata.creationTimestamp` (a node not Ready yet is on its way while it is young).
    pub created: Option<Timestamp>,
    /// Labels.
    pub labels: Arc<BTreeMap<String, String>>,
    /// The annotations cluster-autoscaler defines (`cluster-autoscaler.kubernetes.io/*`).
    pub annotations: BTreeMap<String, String>,
    /// `spec.providerID` (set it with [`NodeRecord::set_provider_id`], which keeps its parsed
    /// form in step).
    pub provider_id: Option<String>,
    /// The provider ID parsed once, at ingest (a pass asks every node for its group): the scale
    /// set as `resource group/name` in lower case, and the instance id.
    scale_set: Option<(String, String)>,
    /// `spec.taints`.
    pub taints: Arc<Vec<Taint>>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `status.allocatable`, parsed (quantities that do not parse are left out).
    pub allocatable: Resources,
}

impl NodeRecord {
    /// The record of `node`.
    pub fn of(node: Node) -> Self {
        let Node {
            metadata: m,
            spec,
            status,
        } = node;
        let spec = spec.unwrap_or_default();
        let mut annotations = m.annotations.unwrap_or_default();
        annotations.retain(|k, _| kept_annotation(k));
        let (ready, allocatable) = match status {
            Some(s) => (
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True"),
                s.allocatable
                    .iter()
                    .flatten()
                    .filter_map(|(k, q)| quantity::parse(&q.0).ok().map(|v| (k.clone(), v)))
                    .collect(),
            ),
            None => (false, Resources::new()),
        };
        NodeRecord {
            name: m.name.unwrap_or_default(),
            uid: m.uid,
            resource_version: m.resource_version,
            created: m.creation_timestamp.map(|t| t.0),
            labels: Arc::new(m.labels.unwrap_or_default()),
            annotations,
            scale_set: parsed_scale_set(spec.provider_id.as_deref()),
            provider_id: spec.provider_id,
            taints: Arc::new(spec.taints.unwrap_or_default()),
            unschedulable: spec.unschedulable.unwrap_or(false),
            ready,
            allocatable,
        }
    }
}

impl NodeRecord {
    /// The scale set of a scale-set instance's node, as `resource group/name` in lower case.
    pub fn scale_set_key(&self) -> Option<&str> {
        self.scale_set.as_ref().map(|(k, _)| k.as_str())
    }

    /// The instance id of a scale-set instance's node.
    pub fn instance_id(&self) -> Option<&str> {
        self.scale_set.as_ref().map(|(_, id)| id.as_str())
    }

    /// Sets `spec.providerID` and its parsed form.
    pub fn set_provider_id(&mut self, id: Option<String>) {
        self.scale_set = parsed_scale_set(id.as_deref());
        self.provider_id = id;
    }
}

/// A provider ID's scale set (`resource group/name`, lower case) and instance id.
fn parsed_scale_set(id: Option<&str>) -> Option<(String, String)> {
    let (rg, vmss, vm) = parse_provider_id(id?)?;
    Some((scale_set_key(rg, vmss), vm.to_string()))
}

/// The scale-set name in an Azure provider ID
/// (`azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<vmss>/virtualMachines/<id>`),
/// with its resource group and instance id.
pub fn parse_provider_id(id: &str) -> Option<(&str, &str, &str)> {
    let rest = id.strip_prefix("azure://")?.trim_start_matches('/');
    let mut rg = None;
    let mut vmss = None;
    let mut vm = None;
    let mut parts = rest.split('/');
    while let Some(key) = parts.next() {
        let slot = if key.eq_ignore_ascii_case("resourceGroups") {
            &mut rg
        } else if key.eq_ignore_ascii_case("virtualMachineScaleSets") {
            &mut vmss
        } else if key.eq_ignore_ascii_case("virtualMachines") {
            &mut vm
        } else {
            continue;
        };
        *slot = parts.next().filter(|v| !v.is_empty());
    }
    Some((rg?, vmss?, vm?))
}

/// `rg/name`, lower case: the scale-set key of the node groups' index and of
/// [`NodeRecord::scale_set_key`].
pub fn scale_set_key(rg: &str, name: &str) -> String {
    let mut key = String::with_capacity(rg.len() + name.len() + 1);
    key.push_str(rg);
    key.push('/');
    key.push_str(name);
    key.make_ascii_lowercase();
    key
}

impl From<Node> for NodeRecord {
    fn from(node: Node) -> Self {
        Self::of(node)
    }
}

/// Annotations the controller reads; every other one is dropped.
fn kept_annotation(key: &str) -> bool {
    key.starts_with("cluster-autoscaler.kubernetes.io/")
        || key == MIRROR_ANNOTATION
        || key == DO_NOT_DISRUPT
        || key == POD_DELETION_COST
        || key == super::deletion_cost::HINT_ANNOTATION
        || key == CONSUME_PROVISIONING_REQUEST
        || key == PROVISIONING_CLASS_NAME
}

fn slim_container(c: &mut Container) {
    *c = Container {
        name: std::mem::take(&mut c.name),
        resources: c.resources.take(),
        restart_policy: c.restart_policy.take(),
        ports: c.ports.take().and_then(|ports| {
            let host: Vec<_> = ports
                .into_iter()
                .filter(|p| p.host_port.is_some())
                .collect();
            (!host.is_empty()).then_some(host)
        }),
        ..Container::default()
    };
}

/// Local storage blocks a scale-down (`hostPath`, an `emptyDir` not in memory); claims are
/// kept for what they are. Every other volume (projected tokens, config maps, secrets) says
/// nothing the controller uses, and its per-pod name would keep equal pods apart.
fn kept_volume(v: &mut Volume) -> bool {
    if v.host_path.is_none()
        && v.empty_dir.is_none()
        && v.persistent_volume_claim.is_none()
        && v.ephemeral.is_none()
    {
        return false;
    }
    *v = Volume {
        name: std::mem::take(&mut v.name),
        host_path: v.host_path.take(),
        empty_dir: v.empty_dir.take(),
        persistent_volume_claim: v.persistent_volume_claim.take(),
        ephemeral: v.ephemeral.take(),
        ..Volume::default()
    };
    true
}

/// Drops from `spec` what scheduling and scale-down never read: per container all but its name,
/// resources, restart policy and host ports; volumes other than local storage and claims; DNS,
/// security context, service account, image pull secrets, ephemeral containers. Kept: node
/// selector, affinity, tolerations, topology spread, priority, overhead, scheduler name.
pub fn slim_spec(spec: &mut PodSpec) {
    spec.containers.iter_mut().for_each(slim_container);
    spec.containers.shrink_to_fit();
    if let Some(init) = spec.init_containers.as_mut() {
        init.iter_mut().for_each(slim_container);
        init.shrink_to_fit();
    }
    spec.ephemeral_containers = None;
    spec.volumes = spec.volumes.take().and_then(|mut v| {
        v.retain_mut(kept_volume);
        v.shrink_to_fit();
        (!v.is_empty()).then_some(v)
    });
    if let Some(t) = spec.tolerations.as_mut() {
        t.shrink_to_fit();
    }
    spec.dns_config = None;
    spec.dns_policy = None;
    spec.host_aliases = None;
    spec.image_pull_secrets = None;
    spec.readiness_gates = None;
    spec.security_context = None;
    spec.resource_claims = None;
    spec.scheduling_gates = None;
    spec.service_account = None;
    spec.service_account_name = None;
    spec.automount_service_account_token = None;
    spec.enable_service_links = None;
    spec.restart_policy = None;
    spec.termination_grace_period_seconds = None;
    spec.subdomain = None;
    spec.hostname = None;
}

/// A label map.
pub type Labels = BTreeMap<String, String>;

/// Hands out shared [`PodShape`]s and label maps: equal content, one `Arc`. Entries are found
/// by a hash of the content and compared in full, and held weakly, so a shape no pod uses any
/// more is freed and a pod whose spec or labels are its own (a StatefulSet's claim names, its
/// `pod-name` label) costs no second copy here. Dead entries are swept once the tables have
/// doubled since the last sweep.
#[derive(Debug, Default)]
pub struct Interner {
    shapes: Table<PodShape>,
    labels: Table<Labels>,
    sweep_at: usize,
}

/// Weak entries by content hash.
#[derive(Debug)]
struct Table<T>(rustc_hash::FxHashMap<u64, Vec<Weak<T>>>);

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self(Default::default())
    }
}

impl<T> Table<T> {
    /// The live entry under `hash` that `same` finds equal to `value`, else `make(value)`,
    /// remembered.
    fn get_or_insert<V>(
        &mut self,
        hash: u64,
        value: V,
        same: impl Fn(&T, &V) -> bool,
        make: impl FnOnce(V) -> T,
    ) -> Arc<T> {
        let bucket = self.0.entry(hash).or_default();
        if let Some(found) = bucket
            .iter()
            .filter_map(Weak::upgrade)
            .find(|t| same(t, &value))
        {
            return found;
        }
        let made = Arc::new(make(value));
        bucket.push(Arc::downgrade(&made));
        made
    }

    fn sweep(&mut self) {
        self.0.retain(|_, bucket| {
            bucket.retain(|w| w.strong_count() > 0);
            !bucket.is_empty()
        });
    }

    fn live(&self) -> usize {
        self.0
            .values()
            .flatten()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn entries(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }
}

fn hash_of(v: &impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(v)
}

impl Interner {
    /// The record of `pod`, its shape and labels shared with earlier pods that have the same.
    pub fn record(&mut self, pod: Pod) -> PodRecord {
        let Pod {
            metadata: m,
            spec,
            status,
        } = pod;
        let mut spec = spec.unwrap_or_default();
        let node_name = spec.node_name.take().filter(|n| !n.is_empty());
        let termination_grace = spec.termination_grace_period_seconds;
        slim_spec(&mut spec);
        let shape = self.shape(spec);
        let labels = self.labels(m.labels.unwrap_or_default());
        let controller = m
            .owner_references
            .into_iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| Controller {
                kind: o.kind,
                name: o.name,
                uid: o.uid,
            });
        let mut annotations = m.annotations.unwrap_or_default();
        annotations.retain(|k, _| kept_annotation(k));
        let terminating = m.deletion_timestamp.is_some();
        let deleted = m.deletion_timestamp.map(|t| {
            let grace = m
                .deletion_grace_period_seconds
                .or(termination_grace)
                .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS);
            (t.0, grace)
        });
        let started = status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        let (phase, unschedulable, nominated_node) = match status {
            Some(s) => {
                let unschedulable = s.conditions.iter().flatten().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                });
                let nominated = s.nominated_node_name.filter(|n| !n.is_empty());
                (s.phase, unschedulable, nominated)
            }
            None => (None, false, None),
        };
        self.maybe_sweep();
        PodRecord {
            namespace: m.namespace.unwrap_or_else(|| "default".to_string()),
            name: m.name.unwrap_or_default(),
            uid: m.uid,
            resource_version: m.resource_version,
            labels,
            annotations,
            controller,
            node_name,
            phase,
            unschedulable,
            nominated_node,
            terminating,
            deleted,
            shape,
            started,
        }
    }

    fn shape(&mut self, spec: PodSpec) -> Arc<PodShape> {
        // k8s-openapi's types have no `Hash`: the JSON text (fields in a fixed order, maps
        // sorted) is hashed, then specs are compared in full.
        let hash = hash_of(&serde_json::to_string(&spec).unwrap_or_default());
        self.shapes
            .get_or_insert(hash, spec, |shape, spec| shape.spec == *spec, PodShape::new)
    }

    fn labels(&mut self, labels: Labels) -> Arc<Labels> {
        let hash = hash_of(&labels);
        self.labels
            .get_or_insert(hash, labels, |l, labels| l == labels, |l| l)
    }

    fn maybe_sweep(&mut self) {
        let size = self.shapes.entries() + self.labels.entries();
        if size < self.sweep_at.max(1024) {
            return;
        }
        self.shapes.sweep();
        self.labels.sweep();
        self.sweep_at = 2 * (self.shapes.entries() + self.labels.entries());
    }

    /// Distinct shapes and label maps alive.
    pub fn len(&self) -> usize {
        self.shapes.live() + self.labels.live()
    }

    /// Whether nothing is shared.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, token: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "resourceVersion": "7",
                "labels": {"app": "web", "pod-template-hash": "abc"},
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "prometheus.io/scrape": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {
                "nodeName": node, "priority": 5, "nodeSelector": {"pool": "a"},
                "tolerations": [{"key": "sku", "operator": "Exists"}],
                "containers": [{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "b"}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    "ports": [{"containerPort": 80}, {"containerPort": 8080, "hostPort": 8080}]}],
                "initContainers": [{"name": "sidecar", "restartPolicy": "Always", "image": "s", "resources": {"requests": {"cpu": "100m"}}}],
                "volumes": [{"name": "cache", "emptyDir": {}}, {"name": token, "projected": {"sources": []}}],
            },
            "status": {"phase": "Pending", "podIP": "10.0.0.1",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "app:1", "imageID": "x"}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_record_keeps_what_fit_drain_and_blockers_read_and_nothing_else() {
        let r = PodRecord::of(pod("web-1", Some("n1"), "kube-api-access-x1"));
        assert_eq!(r.key(), "shop/web-1");
        assert_eq!(r.uid.as_deref(), Some("uid-web-1"));
        assert_eq!(r.resource_version.as_deref(), Some("7"));
        assert_eq!(r.node_name.as_deref(), Some("n1"));
        assert!(
            r.spec().node_name.is_none(),
            "the node is the pod's, not the shape's"
        );
        assert!(r.unschedulable);
        assert_eq!(r.phase.as_deref(), Some("Pending"));
        assert_eq!(r.priority(), 5);
        assert_eq!(r.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(r.annotations.len(), 1, "{:?}", r.annotations);
        assert_eq!(
            r.controller.as_ref().map(|c| c.kind.as_str()),
            Some("ReplicaSet")
        );
        let c = &r.spec().containers[0];
        assert!(c.env.is_none() && c.image.is_none() && c.resources.is_some());
        assert_eq!(
            c.ports.as_ref().map(Vec::len),
            Some(1),
            "only the host port"
        );
        let init = &r.spec().init_containers.as_ref().unwrap()[0];
        assert_eq!(init.restart_policy.as_deref(), Some("Always"));
        let volumes = r.spec().volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1, "the local one");
        assert!(volumes[0].empty_dir.is_some());
        assert!(r.spec().tolerations.is_some() && r.spec().node_selector.is_some());
        // cpu 1 + the sidecar's 100m, as the scheduler counts it.
        assert_eq!(r.facts().requests.get("cpu"), Some(&1100));
    }

    #[test]
    fn pods_of_one_replica_set_share_one_shape_and_one_label_map() {
        let mut i = Interner::default();
        let a = i.record(pod("web-1", Some("n1"), "kube-api-access-aaaaa"));
        let b = i.record(pod("web-2", None, "kube-api-access-bbbbb"));
        assert!(
            Arc::ptr_eq(&a.shape, &b.shape),
            "the token volume's name does not split them"
        );
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert_ne!(a.node_name, b.node_name);
        let mut other = pod("web-3", None, "t");
        if let Some(s) = other.spec.as_mut() {
            s.priority = Some(9);
        }
        let c = i.record(other);
        assert!(
            !Arc::ptr_eq(&a.shape, &c.shape),
            "a different spec is a different shape"
        );
    }

    #[test]
    fn a_shape_no_pod_uses_is_freed() {
        let mut i = Interner::default();
        let a = i.record(pod("web-1", None, "t"));
        assert_eq!(i.len(), 2);
        drop(a);
        assert_eq!(i.len(), 0);
    }
}
