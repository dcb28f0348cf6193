//! CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`, cluster-autoscaler 1.35's API): headroom
//! asked for as pods that do not exist. A buffer names a pod shape (a PodTemplate of its
//! namespace, or a scalable workload's pod template) and how many such pods to keep room for;
//! with the `buffer.x-k8s.io/active-capacity` strategy they become in-memory virtual pods
//! ([`VirtualPods`]): the scale-up provides for them after the real pending pods, and
//! scale-down places them on the nodes they fit, so a node holding buffer capacity is never
//! empty. No balloon pod is created, nothing is preempted. Pure code: the caller hands in the
//! buffers, the objects they refer to (as read) and the wall clock, and gets back the status
//! writes and the virtual pods.
//!
//! How many: `max(spec.replicas, ceil(spec.percentage × the scalable object's replicas / 100))`,
//! then capped by `spec.limits` (the pods' requests times the count stay within every limit).
//! That is the rule the API documents; cluster-autoscaler's code took the `min` of the two
//! (kubernetes/autoscaler #9948): this follows the documentation. With only `limits` set, the
//! buffer is as many pods as the limits allow.
//!
//! Status, as cluster-autoscaler writes it: `replicas`, `podTemplateRef` (a PodTemplate buffer's
//! template; unset for a scalable object's, see [`Resolved::template_name`]),
//! `podTemplateGeneration`, `provisioningStrategy`, and the conditions `ReadyForProvisioning`
//! (False naming what is wrong: a missing PodTemplate or scalable object, an unsupported kind, a
//! bad field), `Provisioning` (True while its pods are injected) and `LimitedByQuotas` (reason
//! `ResourceQuotasAllocated`: True when the namespace's ResourceQuotas cut the count, naming
//! them, as cluster-autoscaler's quota allocator does, see [`super::resource_quota`]; False when
//! they admit it all).

use super::demand::VirtualPods;
use super::fit::pod_requests;
use super::provreq::{set_condition, Update};
use super::quantity::{parse, Milli};
use super::record::PodRecord;
use super::resource_quota::{self, Reserved};
use k8s_openapi::api::core::v1::{Pod, PodStatus, PodTemplate, PodTemplateSpec, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// API group.
pub const GROUP: &str = "autoscaling.x-k8s.io";
/// API version.
pub const VERSION: &str = "v1beta1";
/// Plural resource name.
pub const PLURAL: &str = "capacitybuffers";
/// `kind`.
pub const KIND: &str = "CapacityBuffer";
/// The strategy served (the API's default): keep room ready as virtual pods.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";
/// Annotation on a buffer's virtual pods: the buffer's name.
pub const BUFFER_ANNOTATION: &str = "autoscaling.x-k8s.io/capacity-buffer";
/// The demand source's name ([`VirtualPods::source`]).
pub const SOURCE: &str = "capacity_buffer";

/// Condition types (cluster-autoscaler's `pkg/capacitybuffer/constants.go`).
pub mod condition {
    /// The buffer's spec resolved to a pod template and a count.
    pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
    /// Its pods are injected into the autoscaler's decisions.
    pub const PROVISIONING: &str = "Provisioning";
    /// Cut by the namespace's ResourceQuotas (True), or admitted whole (False).
    pub const LIMITED_BY_QUOTAS: &str = "LimitedByQuotas";
}

/// Condition reasons written here (cluster-autoscaler's own strings for these are not part of
/// the API; these name the case).
pub mod reason {
    /// `ReadyForProvisioning=True`.
    pub const RESOLVED: &str = "BufferResolved";
    /// The PodTemplate named is not there (or has no spec).
    pub const POD_TEMPLATE_NOT_FOUND: &str = "PodTemplateNotFound";
    /// The scalable object named is not there (or has no pod template).
    pub const SCALABLE_NOT_FOUND: &str = "ScalableObjectNotFound";
    /// A `scalableRef` kind this controller cannot read.
    pub const UNSUPPORTED_KIND: &str = "ScalableKindNotSupported";
    /// The spec is wrong (both or neither reference, a negative count, a bad limit).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Reading what it refers to failed.
    pub const READ_FAILED: &str = "ReadFailed";
    /// `Provisioning=True`: its virtual pods are in the decisions.
    pub const PODS_INJECTED: &str = "VirtualPodsInjected";
    /// `Provisioning=False`: pod injection is switched off.
    pub const INJECTION_DISABLED: &str = "PodInjectionDisabled";
    /// `Provisioning=False`: the buffer is not ready.
    pub const NOT_READY: &str = "NotReadyForProvisioning";
    /// `LimitedByQuotas`, True or False (cluster-autoscaler's `LimitedByQuotasReason`).
    pub const QUOTAS_ALLOCATED: &str = "ResourceQuotasAllocated";
}

/// `spec.podTemplateRef`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LocalRef {
    /// Name, in the buffer's namespace.
    #[serde(default)]
    pub name: String,
}

/// `spec.scalableRef`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    /// `apiGroup` (`apps`, `batch`).
    #[serde(default)]
    pub api_group: String,
    /// `kind`.
    #[serde(default)]
    pub kind: String,
    /// `name`, in the buffer's namespace.
    #[serde(default)]
    pub name: String,
}

/// `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `provisioningStrategy` (default [`ACTIVE_CAPACITY`]).
    #[serde(default)]
    pub provisioning_strategy: Option<String>,
    /// `podTemplateRef`.
    #[serde(default)]
    pub pod_template_ref: Option<LocalRef>,
    /// `scalableRef`.
    #[serde(default)]
    pub scalable_ref: Option<ScalableRef>,
    /// `replicas`.
    #[serde(default)]
    pub replicas: Option<i64>,
    /// `percentage` of the scalable object's replicas.
    #[serde(default)]
    pub percentage: Option<i64>,
    /// `limits`: caps on what the buffer's pods request in total.
    #[serde(default)]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// `status` (what is read of it).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Status {
    /// `conditions`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One buffer as read: the object whole (a status write sends it back under the
/// `resourceVersion` read) and what the decision reads of it.
#[derive(Debug, Clone)]
pub struct Buffer {
    /// The object as the API server answered it.
    pub object: Value,
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Spec,
    /// `status`.
    pub status: Status,
}

/// Why an object is not a CapacityBuffer the decision can read.
#[derive(Debug, thiserror::Error)]
#[error("not a readable CapacityBuffer: {0}")]
pub struct Unreadable(String);

/// The scalable kinds read: `(apiGroup, kind)` → `(group, version, plural)`.
pub fn scalable_resource(
    api_group: &str,
    kind: &str,
) -> Option<(&'static str, &'static str, &'static str)> {
    match (api_group, kind) {
        ("apps", "Deployment") => Some(("apps", "v1", "deployments")),
        ("apps", "ReplicaSet") => Some(("apps", "v1", "replicasets")),
        ("apps", "StatefulSet") => Some(("apps", "v1", "statefulsets")),
        ("batch", "Job") => Some(("batch", "v1", "jobs")),
        _ => None,
    }
}

/// What a buffer refers to, by namespace and reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RefKey {
    /// A PodTemplate: `(namespace, name)`.
    Template(String, String),
    /// A scalable object: namespace and reference.
    Scalable(String, ScalableRef),
    /// The ResourceQuotas of a namespace (every buffer of it is counted against them).
    Quotas(String),
}

/// What a reference found, as read.
#[derive(Debug, Clone)]
pub enum Referent {
    /// A PodTemplate.
    Template(Arc<PodTemplate>),
    /// A scalable object: its replicas (`spec.replicas`, a Job's `spec.parallelism`; 1 when
    /// unset, as the API defaults it), its pod template and its generation.
    Scalable {
        /// Replicas.
        replicas: i64,
        /// `spec.template`.
        template: Option<Arc<PodTemplateSpec>>,
        /// `metadata.generation`.
        generation: Option<i64>,
    },
    /// The ResourceQuotas of a namespace (for [`RefKey::Quotas`]).
    Quotas(Arc<Vec<ResourceQuota>>),
    /// Not there.
    Missing,
    /// The read failed.
    Unreadable(String),
}

/// What each reference found.
pub type Referents = HashMap<RefKey, Referent>;

impl Referent {
    /// Reads a scalable object (`Deployment`, `ReplicaSet`, `StatefulSet`, `Job`) as JSON.
    pub fn scalable(object: &Value) -> Self {
        let spec = &object["spec"];
        let replicas = spec["replicas"]
            .as_i64()
            .or_else(|| spec["parallelism"].as_i64())
            .unwrap_or(1);
        let template = serde_json::from_value::<PodTemplateSpec>(spec["template"].clone())
            .ok()
            .map(Arc::new);
        Self::Scalable {
            replicas,
            template,
            generation: object["metadata"]["generation"].as_i64(),
        }
    }
}

impl Buffer {
    /// Reads `object`.
    pub fn of(object: Value) -> Result<Self, Unreadable> {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Spec,
            #[serde(default)]
            status: Option<Status>,
        }
        let s: Shape =
            serde_json::from_value(object.clone()).map_err(|e| Unreadable(e.to_string()))?;
        Ok(Self {
            object,
            metadata: s.metadata,
            spec: s.spec,
            status: s.status.unwrap_or_default(),
        })
    }

    /// Namespace (`default` when unset).
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// Name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    /// `spec.provisioningStrategy`, defaulted.
    pub fn strategy(&self) -> &str {
        self.spec
            .provisioning_strategy
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(ACTIVE_CAPACITY)
    }

    /// Whether this controller serves it (the active-capacity strategy).
    pub fn ours(&self) -> bool {
        self.strategy() == ACTIVE_CAPACITY
    }

    /// What it refers to: exactly one of `podTemplateRef` and `scalableRef`.
    pub fn reference(&self) -> Result<RefKey, String> {
        let ns = self.namespace().to_string();
        match (&self.spec.pod_template_ref, &self.spec.scalable_ref) {
            (Some(_), Some(_)) => {
                Err("spec.podTemplateRef and spec.scalableRef are both set: set exactly one".into())
            }
            (None, None) => Err(
                "neither spec.podTemplateRef nor spec.scalableRef is set: set exactly one".into(),
            ),
            (Some(t), None) if t.name.is_empty() => Err("spec.podTemplateRef.name is empty".into()),
            (Some(t), None) => Ok(RefKey::Template(ns, t.name.clone())),
            (None, Some(s)) if s.name.is_empty() || s.kind.is_empty() => {
                Err("spec.scalableRef needs a kind and a name".into())
            }
            (None, Some(s)) => Ok(RefKey::Scalable(ns, s.clone())),
        }
    }
}

/// How many pods the spec asks for, before limits: `max(replicas, ceil(percentage ×
/// scalable_replicas / 100))` (the documented rule, not cluster-autoscaler's `min`, #9948).
/// `None` when neither `replicas` nor `percentage` is set (the limits alone decide).
pub fn desired(spec: &Spec, scalable_replicas: Option<i64>) -> Result<Option<i64>, String> {
    if let Some(r) = spec.replicas.filter(|r| *r < 0) {
        return Err(format!("spec.replicas is {r}: it must be at least 0"));
    }
    let from_percentage = match spec.percentage {
        None => None,
        Some(p) if p < 0 => return Err(format!("spec.percentage is {p}: it must be at least 0")),
        Some(p) => {
            let Some(of) = scalable_replicas else {
                return Err(
                    "spec.percentage needs spec.scalableRef (a percentage of its replicas)".into(),
                );
            };
            // Rounded up: 10% of 15 replicas is 2.
            Some(p.saturating_mul(of.max(0)).saturating_add(99) / 100)
        }
    };
    Ok(match (spec.replicas, from_percentage) {
        (None, None) => None,
        (r, p) => Some(r.unwrap_or(0).max(p.unwrap_or(0))),
    })
}

/// `wanted` (or, when `None`, as many as the limits allow) capped by `limits` for pods of
/// `template`: the count and the limit that cut it, if one did.
pub fn cap(
    wanted: Option<i64>,
    template: &PodTemplateSpec,
    limits: Option<&BTreeMap<String, Quantity>>,
) -> Result<(i64, Option<String>), String> {
    let limits = limits.filter(|l| !l.is_empty());
    let Some(limits) = limits else {
        return wanted
            .map(|n| (n, None))
            .ok_or_else(|| "none of spec.replicas, spec.percentage and spec.limits is set".into());
    };
    let requests = pod_requests(
        template
            .spec
            .as_ref()
            .ok_or("the pod template has no spec")?,
    );
    let mut n: Option<i64> = wanted;
    let mut by = None;
    for (resource, q) in limits {
        let limit: Milli = parse(&q.0).map_err(|e| format!("spec.limits.{resource}: {e}"))?;
        let per = requests.get(resource).copied().unwrap_or(0);
        if per <= 0 {
            continue;
        }
        let allowed = i64::try_from((limit.max(0)) / per).unwrap_or(i64::MAX);
        if n.is_none_or(|n| allowed < n) {
            n = Some(allowed);
            by = Some(resource.clone());
        }
    }
    match n {
        Some(n) => Ok((n, by.filter(|_| wanted.is_none_or(|w| w > n)))),
        None => Err(
            "only spec.limits is set and the pod requests none of the limited resources: the count is unbounded"
                .into(),
        ),
    }
}

/// A buffer resolved: the pods to keep room for.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// How many.
    pub replicas: i64,
    /// Their template.
    pub template: PodTemplateSpec,
    /// The PodTemplate's name for `status.podTemplateRef` (`None` for a scalable object's
    /// template: cluster-autoscaler writes a PodTemplate of its own there; this controller does
    /// not create objects and leaves the field unset).
    pub template_name: Option<String>,
    /// `status.podTemplateGeneration`: the PodTemplate's (or scalable object's) generation.
    pub generation: Option<i64>,
    /// The limit that cut the count, if one did.
    pub limited_by: Option<String>,
}

/// Resolves `buffer` against what its reference found: the pods, or the reason and message of
/// `ReadyForProvisioning=False`.
pub fn resolve(buffer: &Buffer, referents: &Referents) -> Result<Resolved, (&'static str, String)> {
    let key = buffer.reference().map_err(|m| (reason::INVALID_SPEC, m))?;
    let ns = buffer.namespace();
    let found = referents.get(&key).cloned().unwrap_or(Referent::Missing);
    let (template, template_name, generation, scalable_replicas) = match (&key, found) {
        (_, Referent::Unreadable(why)) => return Err((reason::READ_FAILED, why)),
        (RefKey::Template(_, name), Referent::Missing) => {
            return Err((
                reason::POD_TEMPLATE_NOT_FOUND,
                format!("spec.podTemplateRef: PodTemplate {ns}/{name} not found"),
            ))
        }
        (RefKey::Scalable(_, s), _) if scalable_resource(&s.api_group, &s.kind).is_none() => {
            return Err((
                reason::UNSUPPORTED_KIND,
                format!(
                    "spec.scalableRef: kind {:?} of apiGroup {:?} is not read (Deployment, ReplicaSet, StatefulSet of apps; Job of batch)",
                    s.kind, s.api_group
                ),
            ))
        }
        (RefKey::Scalable(_, s), Referent::Missing) => {
            return Err((
                reason::SCALABLE_NOT_FOUND,
                format!("spec.scalableRef: {} {ns}/{} not found", s.kind, s.name),
            ))
        }
        (RefKey::Template(_, name), Referent::Template(t)) => {
            let Some(tpl) = t.template.clone().filter(|t| t.spec.is_some()) else {
                return Err((
                    reason::POD_TEMPLATE_NOT_FOUND,
                    format!("spec.podTemplateRef: PodTemplate {ns}/{name} has no template.spec"),
                ));
            };
            (tpl, Some(name.clone()), t.metadata.generation, None)
        }
        (RefKey::Scalable(_, s), Referent::Scalable { replicas, template, generation }) => {
            let Some(tpl) = template.filter(|t| t.spec.is_some()) else {
                return Err((
                    reason::SCALABLE_NOT_FOUND,
                    format!("spec.scalableRef: {} {ns}/{} has no spec.template.spec", s.kind, s.name),
                ));
            };
            (Arc::unwrap_or_clone(tpl), None, generation, Some(replicas))
        }
        (k, _) => {
            return Err((
                reason::READ_FAILED,
                format!("{k:?}: read as another kind of object"),
            ))
        }
    };
    let wanted = desired(&buffer.spec, scalable_replicas).map_err(|m| (reason::INVALID_SPEC, m))?;
    let (replicas, limited_by) = cap(wanted, &template, buffer.spec.limits.as_ref())
        .map_err(|m| (reason::INVALID_SPEC, m))?;
    Ok(Resolved {
        replicas,
        template,
        template_name,
        generation,
        limited_by,
    })
}

/// The virtual pods of `buffer` resolved as `r`: named `<buffer>-buffer-<n>`, Pending, no
/// controller (scale-down cannot move them, so the node that holds them stays).
pub fn virtual_pods(buffer: &Buffer, r: &Resolved) -> Vec<Arc<PodRecord>> {
    let Some(spec) = r.template.spec.clone() else {
        return Vec::new();
    };
    let labels = r.template.metadata.as_ref().and_then(|m| m.labels.clone());
    let annotations = BTreeMap::from([(BUFFER_ANNOTATION.to_string(), buffer.name().to_string())]);
    let mut interner = super::record::Interner::default();
    (0..r.replicas.max(0))
        .map(|n| {
            let pod = Pod {
                metadata: ObjectMeta {
                    name: Some(format!("{}-buffer-{n}", buffer.name())),
                    namespace: Some(buffer.namespace().to_string()),
                    labels: labels.clone(),
                    annotations: Some(annotations.clone()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
                status: Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                }),
            };
            Arc::new(interner.record(pod))
        })
        .collect()
}

/// What one pass over the buffers says.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Status writes (only where the status changes).
    pub updates: Vec<Update>,
    /// The virtual pods of the ready buffers (empty with pod injection off): a demand source
    /// after the pending pods.
    pub pods: VirtualPods,
    /// Per buffer served (`namespace/name`): the pods it keeps room for (0 when not ready).
    pub buffers: BTreeMap<String, i64>,
}

/// One pass over `buffers` (see the module documentation). `inject`:
/// `capacityBufferPodInjectionEnabled`.
pub fn decide(buffers: &[Buffer], referents: &Referents, inject: bool, now: Timestamp) -> Outcome {
    let mut out = Outcome {
        pods: VirtualPods {
            source: SOURCE,
            pods: Vec::new(),
            booked: false,
        },
        ..Default::default()
    };
    let mut order: Vec<&Buffer> = buffers.iter().filter(|b| b.ours()).collect();
    order.sort_by_key(|b| b.key());
    // What the buffers served so far took of each quota: a namespace's buffers share its
    // quotas, in this order.
    let mut reserved = Reserved::new();
    for b in order {
        let generation = b.metadata.generation;
        let mut conds = b.status.conditions.clone();
        let mut status = b.object.get("status").cloned().unwrap_or_else(|| json!({}));
        if !status.is_object() {
            status = json!({});
        }
        let mut set: Vec<(&'static str, bool, &'static str)> = Vec::new();
        match resolve(b, referents) {
            Ok(mut r) => {
                // The namespace's ResourceQuotas, once the spec's own limits have spoken (an
                // unreadable list cuts nothing: the read's error is logged where it failed).
                let quotas = match referents.get(&RefKey::Quotas(b.namespace().to_string())) {
                    Some(Referent::Quotas(qs)) => r.template.spec.as_ref().and_then(|spec| {
                        resource_quota::admit(qs, spec, r.replicas, &mut reserved)
                    }),
                    _ => None,
                };
                if let Some(admitted) = &quotas {
                    let limited = admitted.replicas < r.replicas;
                    let message = if limited {
                        format!(
                            "Buffer replicas limited from {} to {} due to quotas: {}",
                            r.replicas,
                            admitted.replicas,
                            admitted.blocking.join(", ")
                        )
                    } else {
                        String::new()
                    };
                    set_condition(
                        &mut conds,
                        condition::LIMITED_BY_QUOTAS,
                        limited,
                        reason::QUOTAS_ALLOCATED,
                        &message,
                        now,
                        generation,
                    );
                    set.push((
                        condition::LIMITED_BY_QUOTAS,
                        limited,
                        reason::QUOTAS_ALLOCATED,
                    ));
                    r.replicas = admitted.replicas;
                }
                let mut message = format!("{} pods of room kept", r.replicas);
                if let Some(limit) = &r.limited_by {
                    message.push_str(&format!(" (capped by spec.limits.{limit})"));
                }
                if quotas.as_ref().is_some_and(|a| !a.blocking.is_empty()) {
                    message.push_str(" (cut by the namespace's ResourceQuotas)");
                }
                set_condition(
                    &mut conds,
                    condition::READY_FOR_PROVISIONING,
                    true,
                    reason::RESOLVED,
                    &message,
                    now,
                    generation,
                );
                set.push((condition::READY_FOR_PROVISIONING, true, reason::RESOLVED));
                if inject {
                    set_condition(
                        &mut conds,
                        condition::PROVISIONING,
                        true,
                        reason::PODS_INJECTED,
                        &format!(
                            "{} virtual pods are in the scale-up and scale-down decisions",
                            r.replicas
                        ),
                        now,
                        generation,
                    );
                    set.push((condition::PROVISIONING, true, reason::PODS_INJECTED));
                    out.pods.pods.extend(virtual_pods(b, &r));
                } else {
                    set_condition(
                        &mut conds,
                        condition::PROVISIONING,
                        false,
                        reason::INJECTION_DISABLED,
                        "capacityBufferPodInjectionEnabled is false: no virtual pods",
                        now,
                        generation,
                    );
                    set.push((condition::PROVISIONING, false, reason::INJECTION_DISABLED));
                }
                status["replicas"] = json!(r.replicas);
                match &r.template_name {
                    Some(name) => status["podTemplateRef"] = json!({"name": name}),
                    None => {
                        if let Some(s) = status.as_object_mut() {
                            s.remove("podTemplateRef");
                        }
                    }
                }
                match r.generation {
                    Some(g) => status["podTemplateGeneration"] = json!(g),
                    None => {
                        if let Some(s) = status.as_object_mut() {
                            s.remove("podTemplateGeneration");
                        }
                    }
                }
                out.buffers.insert(b.key(), r.replicas);
            }
            Err((why, message)) => {
                set_condition(
                    &mut conds,
                    condition::READY_FOR_PROVISIONING,
                    false,
                    why,
                    &message,
                    now,
                    generation,
                );
                set.push((condition::READY_FOR_PROVISIONING, false, why));
                set_condition(
                    &mut conds,
                    condition::PROVISIONING,
                    false,
                    reason::NOT_READY,
                    "the buffer is not ready for provisioning: see ReadyForProvisioning",
                    now,
                    generation,
                );
                set.push((condition::PROVISIONING, false, reason::NOT_READY));
                if let Some(s) = status.as_object_mut() {
                    s.remove("replicas");
                    s.remove("podTemplateRef");
                    s.remove("podTemplateGeneration");
                }
                out.buffers.insert(b.key(), 0);
            }
        }
        status["provisioningStrategy"] = json!(b.strategy());
        status["conditions"] = serde_json::to_value(&conds).unwrap_or_default();
        if b.object.get("status") == Some(&status) {
            continue;
        }
        let mut object = b.object.clone();
        if let Some(o) = object.as_object_mut() {
            o.insert("status".into(), status);
        }
        out.updates.push(Update {
            key: b.key(),
            object,
            set,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Timestamp {
        "2026-11-28T00:00:00Z".parse().unwrap()
    }

    fn buffer(spec: Value) -> Buffer {
        Buffer::of(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
            "metadata": {"name": "headroom", "namespace": "web", "resourceVersion": "7", "generation": 1},
            "spec": spec,
        }))
        .unwrap()
    }

    fn template_spec(cpu: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
        }))
        .unwrap()
    }

    fn pod_template(name: &str, cpu: &str) -> (RefKey, Referent) {
        let t = PodTemplate {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("web".into()),
                generation: Some(3),
                ..Default::default()
            },
            template: Some(template_spec(cpu)),
        };
        (
            RefKey::Template("web".into(), name.into()),
            Referent::Template(Arc::new(t)),
        )
    }

    fn deployment(replicas: i64) -> (RefKey, Referent) {
        let r = ScalableRef {
            api_group: "apps".into(),
            kind: "Deployment".into(),
            name: "web".into(),
        };
        let object = json!({"metadata": {"generation": 5}, "spec": {"replicas": replicas,
            "template": serde_json::to_value(template_spec("500m")).unwrap()}});
        (
            RefKey::Scalable("web".into(), r),
            Referent::scalable(&object),
        )
    }

    fn scalable_spec(extra: Value) -> Value {
        let mut s =
            json!({"scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "web"}});
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        s
    }

    #[test]
    fn replicas_alone_give_that_many_pods() {
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "replicas": 3}));
        let refs = Referents::from([pod_template("t", "1")]);
        let r = resolve(&b, &refs).unwrap();
        assert_eq!(r.replicas, 3);
        assert_eq!(r.template_name.as_deref(), Some("t"));
        assert_eq!(r.generation, Some(3));
    }

    #[test]
    fn a_percentage_of_the_scalable_replicas_is_rounded_up() {
        let b = buffer(scalable_spec(json!({"percentage": 10})));
        let refs = Referents::from([deployment(15)]);
        assert_eq!(
            resolve(&b, &refs).unwrap().replicas,
            2,
            "10% of 15 is 1.5, rounded up"
        );
    }

    #[test]
    fn replicas_and_percentage_take_the_larger_as_documented_not_the_smaller() {
        let refs = Referents::from([deployment(40)]);
        let b = buffer(scalable_spec(json!({"percentage": 25, "replicas": 3})));
        assert_eq!(
            resolve(&b, &refs).unwrap().replicas,
            10,
            "25% of 40 beats 3"
        );
        let b = buffer(scalable_spec(json!({"percentage": 5, "replicas": 3})));
        assert_eq!(
            resolve(&b, &refs).unwrap().replicas,
            3,
            "3 beats 5% of 40 (2)"
        );
    }

    #[test]
    fn limits_cap_the_count_and_name_the_limit_that_cut_it() {
        let refs = Referents::from([pod_template("t", "500m")]);
        let b = buffer(
            json!({"podTemplateRef": {"name": "t"}, "replicas": 10, "limits": {"cpu": "2", "memory": "100Gi"}}),
        );
        let r = resolve(&b, &refs).unwrap();
        assert_eq!(r.replicas, 4, "2 CPUs of 500m pods");
        assert_eq!(r.limited_by.as_deref(), Some("cpu"));
        let b =
            buffer(json!({"podTemplateRef": {"name": "t"}, "replicas": 2, "limits": {"cpu": "2"}}));
        let r = resolve(&b, &refs).unwrap();
        assert_eq!(
            (r.replicas, r.limited_by),
            (2, None),
            "a limit not reached cuts nothing"
        );
    }

    #[test]
    fn limits_alone_give_as_many_pods_as_they_allow() {
        let refs = Referents::from([pod_template("t", "500m")]);
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "limits": {"memory": "3Gi"}}));
        assert_eq!(resolve(&b, &refs).unwrap().replicas, 3);
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "limits": {"nvidia.com/gpu": "3"}}));
        let (why, message) = resolve(&b, &refs).unwrap_err();
        assert_eq!(why, reason::INVALID_SPEC);
        assert!(message.contains("unbounded"), "{message}");
    }

    #[test]
    fn a_missing_pod_template_gives_a_condition_naming_it() {
        let b = buffer(json!({"podTemplateRef": {"name": "gone"}, "replicas": 1}));
        let (why, message) = resolve(&b, &Referents::new()).unwrap_err();
        assert_eq!(why, reason::POD_TEMPLATE_NOT_FOUND);
        assert_eq!(
            message,
            "spec.podTemplateRef: PodTemplate web/gone not found"
        );
    }

    #[test]
    fn a_missing_scalable_object_gives_a_condition_naming_it() {
        let b = buffer(scalable_spec(json!({"percentage": 10})));
        let (why, message) = resolve(&b, &Referents::new()).unwrap_err();
        assert_eq!(why, reason::SCALABLE_NOT_FOUND);
        assert_eq!(message, "spec.scalableRef: Deployment web/web not found");
    }

    #[test]
    fn bad_specs_are_named_not_guessed() {
        let refs = Referents::from([pod_template("t", "1"), deployment(4)]);
        let cases = [
            (
                json!({"podTemplateRef": {"name": "t"}, "scalableRef": {"apiGroup": "apps", "kind": "Deployment", "name": "web"}, "replicas": 1}),
                "both set",
            ),
            (
                json!({"replicas": 1}),
                "neither spec.podTemplateRef nor spec.scalableRef",
            ),
            (
                json!({"podTemplateRef": {"name": "t"}, "replicas": -1}),
                "spec.replicas is -1",
            ),
            (
                json!({"podTemplateRef": {"name": "t"}, "percentage": 10}),
                "spec.percentage needs spec.scalableRef",
            ),
            (
                json!({"podTemplateRef": {"name": "t"}}),
                "none of spec.replicas",
            ),
            (
                json!({"podTemplateRef": {"name": "t"}, "replicas": 1, "limits": {"cpu": "lots"}}),
                "spec.limits.cpu",
            ),
        ];
        for (spec, says) in cases {
            let (why, message) = resolve(&buffer(spec.clone()), &refs).unwrap_err();
            assert_eq!(why, reason::INVALID_SPEC, "{spec}");
            assert!(message.contains(says), "{spec}: {message}");
        }
        let b = buffer(
            json!({"scalableRef": {"apiGroup": "argoproj.io", "kind": "Rollout", "name": "web"}, "replicas": 1}),
        );
        let (why, message) = resolve(&b, &refs).unwrap_err();
        assert_eq!(why, reason::UNSUPPORTED_KIND);
        assert!(message.contains("Rollout"), "{message}");
    }

    #[test]
    fn a_ready_buffer_injects_its_pods_and_writes_its_status_under_the_version_read() {
        let refs = Referents::from([pod_template("t", "1")]);
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "replicas": 2}));
        let out = decide(std::slice::from_ref(&b), &refs, true, t0());
        assert_eq!(out.pods.pods.len(), 2);
        assert_eq!(out.pods.pods[0].key(), "web/headroom-buffer-0");
        assert!(
            out.pods.pods[0].controller.is_none(),
            "nothing may move them"
        );
        assert_eq!(out.updates.len(), 1);
        let s = &out.updates[0].object["status"];
        assert_eq!(out.updates[0].object["metadata"]["resourceVersion"], "7");
        assert_eq!(s["replicas"], 2);
        assert_eq!(s["podTemplateRef"]["name"], "t");
        assert_eq!(s["podTemplateGeneration"], 3);
        assert_eq!(s["provisioningStrategy"], ACTIVE_CAPACITY);
        let conds: Vec<(&str, &str)> = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].as_str().unwrap(), c["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            conds,
            [("ReadyForProvisioning", "True"), ("Provisioning", "True")]
        );
        // Read back as written, the next pass writes nothing.
        let again = Buffer::of(out.updates[0].object.clone()).unwrap();
        let out = decide(&[again], &refs, true, t0());
        assert!(out.updates.is_empty(), "{:?}", out.updates);
        assert_eq!(out.pods.pods.len(), 2);
    }

    #[test]
    fn the_namespaces_resource_quotas_cut_a_buffer_and_say_which_and_by_how_much() {
        let quota: ResourceQuota = serde_json::from_value(json!({
            "metadata": {"name": "team-compute", "namespace": "web", "uid": "q1"},
            "spec": {"hard": {"requests.cpu": "5"}},
            "status": {"hard": {"requests.cpu": "5"}, "used": {"requests.cpu": "2"}},
        }))
        .unwrap();
        let quotas = (
            RefKey::Quotas("web".into()),
            Referent::Quotas(Arc::new(vec![quota])),
        );
        let refs = Referents::from([pod_template("t", "1"), quotas.clone()]);
        // 4 pods of 1 cpu asked for, 3 cpus left under the quota.
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "replicas": 4}));
        let out = decide(std::slice::from_ref(&b), &refs, true, t0());
        assert_eq!(out.pods.pods.len(), 3);
        let s = &out.updates[0].object["status"];
        assert_eq!(s["replicas"], 3);
        let limited = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "LimitedByQuotas")
            .expect("LimitedByQuotas");
        assert_eq!(limited["status"], "True");
        assert_eq!(limited["reason"], "ResourceQuotasAllocated");
        assert_eq!(
            limited["message"],
            "Buffer replicas limited from 4 to 3 due to quotas: team-compute"
        );
        // Asking for what the quota admits: LimitedByQuotas turns False.
        let again = Buffer::of(out.updates[0].object.clone()).unwrap();
        let mut again_spec = again.object.clone();
        again_spec["spec"]["replicas"] = json!(2);
        let fewer = Buffer::of(again_spec).unwrap();
        let out = decide(&[fewer], &refs, true, t0());
        let s = &out.updates[0].object["status"];
        assert_eq!(s["replicas"], 2);
        assert!(s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "LimitedByQuotas" && c["status"] == "False"));
        // Without the quotas' list (it failed), nothing is cut.
        let refs = Referents::from([
            pod_template("t", "1"),
            (
                RefKey::Quotas("web".into()),
                Referent::Unreadable("forbidden".into()),
            ),
        ]);
        assert_eq!(decide(&[b], &refs, true, t0()).pods.pods.len(), 4);
    }

    #[test]
    fn without_pod_injection_the_status_is_written_and_no_pod_is_made() {
        let refs = Referents::from([pod_template("t", "1")]);
        let b = buffer(json!({"podTemplateRef": {"name": "t"}, "replicas": 2}));
        let out = decide(&[b], &refs, false, t0());
        assert!(out.pods.pods.is_empty());
        let c = &out.updates[0].object["status"]["conditions"][1];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (
                Some("Provisioning"),
                Some("False"),
                Some(reason::INJECTION_DISABLED)
            )
        );
    }

    #[test]
    fn a_buffer_not_ready_makes_no_pod_and_says_why() {
        let b = buffer(json!({"podTemplateRef": {"name": "gone"}, "replicas": 2}));
        let out = decide(&[b], &Referents::new(), true, t0());
        assert!(out.pods.pods.is_empty());
        let c = &out.updates[0].object["status"]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], reason::POD_TEMPLATE_NOT_FOUND);
        assert_eq!(
            c["message"],
            "spec.podTemplateRef: PodTemplate web/gone not found"
        );
        assert!(out.updates[0].object["status"].get("replicas").is_none());
    }

    #[test]
    fn other_strategies_are_left_alone() {
        let refs = Referents::from([pod_template("t", "1")]);
        let b = buffer(
            json!({"provisioningStrategy": "example.com/cold-standby", "podTemplateRef": {"name": "t"}, "replicas": 2}),
        );
        let out = decide(&[b], &refs, true, t0());
        assert!(out.pods.pods.is_empty() && out.updates.is_empty() && out.buffers.is_empty());
    }
}
