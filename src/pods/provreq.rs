//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`), as cluster-autoscaler serves them: a
//! request's pod sets (PodTemplates of its namespace, times `count`) become virtual pods, and one
//! decision per request says whether they get room. Pure code: the caller hands in the requests,
//! the templates, the scale-up input and the wall clock; it gets back the status updates to
//! write, the targets to publish and the booked pods.
//!
//! - `check-capacity.autoscaling.x-k8s.io`: do the pods fit the nodes there (and the nodes on
//!   their way)? Nothing is written to Azure; `Provisioned=True` (`CapacityIsFound`) or
//!   `Provisioned=False` (`CapacityIsNotFound`, checked again next loop).
//! - `best-effort-atomic-scale-up.autoscaling.x-k8s.io`: all the pods get room in one decision
//!   (room there, or new nodes of the groups the expander picks), or no target is raised at all.
//!   `Provisioned=True` (`CapacityIsProvisioned`, or `CapacityIsFound` when no node was needed);
//!   `Provisioned=False` (`CapacityIsNotFound`) while a group could take the pods later (at its
//!   max, out of quota, backed off), `Failed=True` (`CapacityIsNotFound`) when no group's node
//!   could ever hold one of them (too small, a taint or selector none matches).
//! - Every other class is not ours: left alone.
//!
//! A provisioned request's capacity is booked for [`BOOKING_TIME`]: its pods (less those of its
//! consumers already bound) take room before any other pod, and ask for it again if it went.
//! Then `BookingExpired=True` (`CapacityReservationTimeExpired`), or earlier once every pod of
//! the request is bound (`CapacityBookingConsumed`). Not provisioned within [`EXPIRY`]:
//! `Failed=True` (`Expired`). A request naming a missing PodTemplate, a count below 1 or no pod
//! set: `Failed=True` (`FailedToCreatePods`), naming what is wrong.

use super::demand::VirtualPods;
use super::record::{PodRecord, CONSUME_PROVISIONING_REQUEST, PROVISIONING_CLASS_NAME};
use super::scale_up::{plan, ScaleUpInput, WhyNot};
use k8s_openapi::api::core::v1::{Pod, PodStatus, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// API group.
pub const GROUP: &str = "autoscaling.x-k8s.io";
/// API version.
pub const VERSION: &str = "v1";
/// Plural resource name.
pub const PLURAL: &str = "provisioningrequests";
/// `kind`.
pub const KIND: &str = "ProvisioningRequest";

/// The class that checks for room without writing.
pub const CHECK_CAPACITY: &str = "check-capacity.autoscaling.x-k8s.io";
/// The class that grows node groups for all the pods at once, or not at all.
pub const BEST_EFFORT_ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";

/// How long provisioned capacity stays booked (cluster-autoscaler's `defaultReservationTime`).
pub const BOOKING_TIME: Duration = Duration::from_secs(10 * 60);
/// A request not provisioned by then has failed (cluster-autoscaler's 7 days).
pub const EXPIRY: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// At most this many requests get a status update per loop (cluster-autoscaler's 20).
pub const MAX_UPDATES_PER_LOOP: usize = 20;
/// A condition message is cut to this many bytes.
const MAX_MESSAGE: usize = 2048;

/// Condition types.
pub mod condition {
    /// The request was seen by a controller that serves its class.
    pub const ACCEPTED: &str = "Accepted";
    /// The capacity is there (booked).
    pub const PROVISIONED: &str = "Provisioned";
    /// It never will be.
    pub const FAILED: &str = "Failed";
    /// The booking ended.
    pub const BOOKING_EXPIRED: &str = "BookingExpired";
    /// The capacity was taken back (defined by the API; cluster-autoscaler never sets it).
    pub const CAPACITY_REVOKED: &str = "CapacityRevoked";
}

/// Condition reasons, cluster-autoscaler's (`pkg/provisioningrequest/conditions`).
pub mod reason {
    /// `Accepted=True`.
    pub const ACCEPTED: &str = "Accepted";
    /// Room found among the nodes there.
    pub const CAPACITY_IS_FOUND: &str = "CapacityIsFound";
    /// No room.
    pub const CAPACITY_IS_NOT_FOUND: &str = "CapacityIsNotFound";
    /// New nodes were asked for.
    pub const CAPACITY_IS_PROVISIONED: &str = "CapacityIsProvisioned";
    /// The pod sets could not be made into pods.
    pub const FAILED_TO_CREATE_PODS: &str = "FailedToCreatePods";
    /// The booking's time ran out.
    pub const RESERVATION_TIME_EXPIRED: &str = "CapacityReservationTimeExpired";
    /// Every pod of the request is scheduled.
    pub const BOOKING_CONSUMED: &str = "CapacityBookingConsumed";
    /// Not provisioned within [`super::EXPIRY`].
    pub const EXPIRED: &str = "Expired";
}

/// The two classes served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// [`CHECK_CAPACITY`].
    CheckCapacity,
    /// [`BEST_EFFORT_ATOMIC`].
    BestEffortAtomic,
}

impl Class {
    /// The class named `name`, if it is one of ours.
    pub fn of(name: &str) -> Option<Self> {
        match name {
            CHECK_CAPACITY => Some(Self::CheckCapacity),
            BEST_EFFORT_ATOMIC => Some(Self::BestEffortAtomic),
            _ => None,
        }
    }
}

/// `spec.podSets[]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// `podTemplateRef`.
    #[serde(default)]
    pub pod_template_ref: TemplateRef,
    /// `count`.
    #[serde(default)]
    pub count: i64,
}

/// `podTemplateRef`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TemplateRef {
    /// The PodTemplate's name, in the request's namespace.
    #[serde(default)]
    pub name: Option<String>,
}

/// `spec`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `podSets`.
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    /// `provisioningClassName`.
    #[serde(default)]
    pub provisioning_class_name: String,
}

/// `status` (what is read of it).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Status {
    /// `conditions`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One request as read: the object whole (a status write sends it back with only the
/// conditions changed, under the `resourceVersion` read), and what the decisions read of it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The object as the API server answered it.
    pub object: serde_json::Value,
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Spec,
    /// `status`.
    pub status: Status,
}

/// Why an object is not a ProvisioningRequest the decision can read.
#[derive(Debug, thiserror::Error)]
#[error("not a readable ProvisioningRequest: {0}")]
pub struct Unreadable(String);

impl Request {
    /// Reads `object`.
    pub fn of(object: serde_json::Value) -> Result<Self, Unreadable> {
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

    /// Its class, if ours.
    pub fn class(&self) -> Option<Class> {
        Class::of(&self.spec.provisioning_class_name)
    }

    /// The condition of type `kind`.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.status.conditions.iter().find(|c| c.type_ == kind)
    }

    /// Whether the condition of type `kind` is `True`.
    pub fn is_true(&self, kind: &str) -> bool {
        self.condition(kind).is_some_and(|c| c.status == "True")
    }

    /// Whether nothing more happens to it (`Failed` or `BookingExpired`).
    pub fn finished(&self) -> bool {
        self.is_true(condition::FAILED) || self.is_true(condition::BOOKING_EXPIRED)
    }

    /// The pods its pod sets ask for, each set's template's spec `count` times, named
    /// `<request>-<set>-<n>` and carrying the consumer annotations.
    pub fn virtual_pods(&self, templates: &Templates) -> Result<Vec<Arc<PodRecord>>, String> {
        if self.spec.pod_sets.is_empty() {
            return Err("spec.podSets is empty: nothing to provision".into());
        }
        let mut interner = super::record::Interner::default();
        let mut out = Vec::new();
        for (i, set) in self.spec.pod_sets.iter().enumerate() {
            let Some(name) = set
                .pod_template_ref
                .name
                .as_deref()
                .filter(|n| !n.is_empty())
            else {
                return Err(format!("spec.podSets[{i}].podTemplateRef.name is missing"));
            };
            if set.count < 1 {
                return Err(format!(
                    "spec.podSets[{i}].count is {}: it must be at least 1",
                    set.count
                ));
            }
            let Some(t) = templates.get(&(self.namespace().to_string(), name.to_string())) else {
                return Err(format!(
                    "spec.podSets[{i}]: PodTemplate {}/{name} not found",
                    self.namespace()
                ));
            };
            let Some(spec) = t.template.as_ref().and_then(|t| t.spec.clone()) else {
                return Err(format!(
                    "spec.podSets[{i}]: PodTemplate {}/{name} has no template.spec",
                    self.namespace()
                ));
            };
            let labels = t
                .template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone());
            let mut annotations = BTreeMap::new();
            annotations.insert(
                CONSUME_PROVISIONING_REQUEST.to_string(),
                self.name().to_string(),
            );
            annotations.insert(
                PROVISIONING_CLASS_NAME.to_string(),
                self.spec.provisioning_class_name.clone(),
            );
            for n in 0..set.count {
                let pod = Pod {
                    metadata: ObjectMeta {
                        name: Some(format!("{}-{i}-{n}", self.name())),
                        namespace: Some(self.namespace().to_string()),
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
                out.push(Arc::new(interner.record(pod)));
            }
        }
        Ok(out)
    }

    /// Pods in all its pod sets (0 when a count is not positive).
    fn total(&self) -> usize {
        self.spec
            .pod_sets
            .iter()
            .map(|s| usize::try_from(s.count).unwrap_or(0))
            .sum()
    }
}

/// PodTemplates by `(namespace, name)`.
pub type Templates = HashMap<(String, String), Arc<PodTemplate>>;

/// The status write one decision asks for.
#[derive(Debug, Clone)]
pub struct Update {
    /// `namespace/name`.
    pub key: String,
    /// The object with its new conditions, under the `resourceVersion` it was read with.
    pub object: serde_json::Value,
    /// `(type, status, reason)` of the conditions set, for logs and Events.
    pub set: Vec<(&'static str, bool, &'static str)>,
}

/// A request's capacity held for its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    /// `namespace/name` of the request.
    pub request: String,
    /// Pods still booked (its pods less its consumers already bound).
    pub pods: usize,
    /// Until when (wall clock).
    pub until: Timestamp,
}

/// What one pass over the requests says.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Status writes, at most [`MAX_UPDATES_PER_LOOP`].
    pub updates: Vec<Update>,
    /// Per group: the capacity the atomic requests provisioned in this pass need at least.
    pub targets: BTreeMap<String, i64>,
    /// The booked pods: the pending pods' decision places them first.
    pub booked: VirtualPods,
    /// The bookings held.
    pub bookings: Vec<Booking>,
    /// Requests left for a later loop (the update budget was spent).
    pub deferred: usize,
}

/// Fit labels that no growth, time or other group's change can lift: the node itself refuses.
fn permanent(why: &WhyNot) -> bool {
    why.label.starts_with("insufficient_")
        || matches!(
            why.label,
            "node_selector" | "taint" | "too_many_pods" | "host_port"
        )
}

/// Sets condition `kind` on `conds` (the time moves only when its status changes, as
/// `meta.SetStatusCondition` does); whether anything changed.
pub(crate) fn set_condition(
    conds: &mut Vec<Condition>,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" };
    let mut message = message.to_string();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    match conds.iter_mut().find(|c| c.type_ == kind) {
        Some(c) if c.status == status && c.reason == reason && c.message == message => false,
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
            true
        }
        None => {
            conds.push(Condition {
                type_: kind.into(),
                status: status.into(),
                reason: reason.into(),
                message,
                last_transition_time: Time(now),
                observed_generation: generation,
            });
            true
        }
    }
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// What became of one request in this pass.
enum Verdict {
    /// Nothing to write.
    Unchanged,
    /// Conditions set.
    Set(Vec<(&'static str, bool, &'static str, String)>),
}

/// One pass over `requests` (see the module documentation). `input` is the pending pods'
/// decision input: its sources are replaced for each request's decision, and the groups an
/// atomic request grows start the next decisions from their new capacity. The caller then
/// plans the pending pods with [`Outcome::booked`] as a source and publishes
/// [`Outcome::targets`] with the pending pods' targets.
pub fn decide(
    requests: &[Request],
    templates: &Templates,
    input: &mut ScaleUpInput,
    now: Timestamp,
) -> Outcome {
    let mut out = Outcome {
        booked: VirtualPods {
            source: "provisioning_request_booking",
            pods: Vec::new(),
            booked: true,
        },
        ..Default::default()
    };
    let mut order: Vec<&Request> = requests.iter().filter(|r| r.class().is_some()).collect();
    order.sort_by(|a, b| {
        let t = |r: &Request| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b)).then_with(|| a.key().cmp(&b.key()))
    });
    // Consumers bound to a node, per request (`namespace/name`).
    let mut bound: HashMap<String, usize> = HashMap::new();
    for pod in input.pods.all() {
        if let (true, Some(name)) = (pod.is_bound(), pod.consumes_provisioning_request()) {
            *bound
                .entry(format!("{}/{name}", pod.namespace))
                .or_default() += 1;
        }
    }
    let sources = std::mem::take(&mut input.sources);
    for req in order {
        if req.finished() {
            continue;
        }
        let provisioned = req
            .condition(condition::PROVISIONED)
            .filter(|c| c.status == "True");
        let verdict = match provisioned {
            Some(c) => {
                let until = after(c.last_transition_time.0, BOOKING_TIME);
                let consumed = bound.get(&req.key()).copied().unwrap_or(0);
                let total = req.total();
                if now >= until {
                    Verdict::Set(vec![(
                        condition::BOOKING_EXPIRED,
                        true,
                        reason::RESERVATION_TIME_EXPIRED,
                        format!(
                            "the capacity booked at {} for {} was released after {} min",
                            c.last_transition_time.0,
                            req.key(),
                            BOOKING_TIME.as_secs() / 60
                        ),
                    )])
                } else if total > 0 && consumed >= total {
                    Verdict::Set(vec![(
                        condition::BOOKING_EXPIRED,
                        true,
                        reason::BOOKING_CONSUMED,
                        format!("all {total} pods of the request are scheduled"),
                    )])
                } else {
                    if let Ok(pods) = req.virtual_pods(templates) {
                        let left: Vec<_> = pods.into_iter().skip(consumed).collect();
                        out.bookings.push(Booking {
                            request: req.key(),
                            pods: left.len(),
                            until,
                        });
                        out.booked.pods.extend(left);
                    }
                    Verdict::Unchanged
                }
            }
            None if out.updates.len() >= MAX_UPDATES_PER_LOOP => {
                out.deferred += 1;
                continue;
            }
            None => {
                let created = req
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(now, |t| t.0);
                let mut set = Vec::new();
                if !req.is_true(condition::ACCEPTED) {
                    set.push((
                        condition::ACCEPTED,
                        true,
                        reason::ACCEPTED,
                        "Provisioning Request was accepted".to_string(),
                    ));
                }
                if now >= after(created, EXPIRY) {
                    set.push((
                        condition::FAILED,
                        true,
                        reason::EXPIRED,
                        format!(
                            "not provisioned within {} days of its creation",
                            EXPIRY.as_secs() / 86_400
                        ),
                    ));
                } else {
                    match req.virtual_pods(templates) {
                        Err(why) => {
                            set.push((condition::FAILED, true, reason::FAILED_TO_CREATE_PODS, why))
                        }
                        Ok(pods) => set.extend(judge(req, pods, input, &mut out)),
                    }
                }
                Verdict::Set(set)
            }
        };
        let Verdict::Set(set) = verdict else { continue };
        if out.updates.len() >= MAX_UPDATES_PER_LOOP {
            // A booking that ended waits for the next loop's budget (it holds nothing meanwhile).
            out.deferred += 1;
            continue;
        }
        let mut conds = req.status.conditions.clone();
        let generation = req.metadata.generation;
        let mut changed = false;
        for (kind, status, why, message) in &set {
            changed |= set_condition(&mut conds, kind, *status, why, message, now, generation);
        }
        if !changed {
            continue;
        }
        let mut object = req.object.clone();
        let conditions = serde_json::to_value(&conds).unwrap_or_default();
        match object.get_mut("status").and_then(|s| s.as_object_mut()) {
            Some(status) => {
                status.insert("conditions".into(), conditions);
            }
            None => {
                if let Some(o) = object.as_object_mut() {
                    o.insert(
                        "status".into(),
                        serde_json::json!({"conditions": conditions}),
                    );
                }
            }
        }
        out.updates.push(Update {
            key: req.key(),
            object,
            set: set.iter().map(|(k, s, r, _)| (*k, *s, *r)).collect(),
        });
    }
    input.sources = sources;
    out
}

/// The class's decision for `req`'s `pods`: the conditions it sets. A provisioned request's
/// pods join the booked ones, and an atomic one's targets are kept in `out` and in `input`.
fn judge(
    req: &Request,
    pods: Vec<Arc<PodRecord>>,
    input: &mut ScaleUpInput,
    out: &mut Outcome,
) -> Vec<(&'static str, bool, &'static str, String)> {
    let class = req.class();
    let keys: BTreeSet<String> = pods.iter().map(|p| p.key()).collect();
    let mut trial = input.clone();
    if class == Some(Class::CheckCapacity) {
        // Room there only: no group may grow.
        for g in &mut trial.groups {
            if let Some(c) = g.capacity {
                g.max = g.max.min(u32::try_from(c.max(0)).unwrap_or(u32::MAX));
            }
        }
    }
    trial.sources = vec![
        Arc::new(out.booked.clone()),
        Arc::new(VirtualPods {
            source: "provisioning_request",
            pods: pods.clone(),
            booked: false,
        }),
    ];
    let decision = plan(&trial);
    let provided: BTreeSet<&String> = decision.already_provided.iter().collect();
    let there = keys.iter().all(|k| provided.contains(k));
    let placed = keys
        .iter()
        .all(|k| provided.contains(k) || decision.triggered.contains_key(k));
    let n = pods.len();
    if class == Some(Class::CheckCapacity) {
        if there {
            out.booked.pods.extend(pods);
            return vec![(
                condition::PROVISIONED,
                true,
                reason::CAPACITY_IS_FOUND,
                format!("room for all {n} pods found on the nodes there"),
            )];
        }
        return vec![(
            condition::PROVISIONED,
            false,
            reason::CAPACITY_IS_NOT_FOUND,
            format!(
                "no room for all {n} pods on the nodes there: {}",
                why_not(&decision, &keys)
            ),
        )];
    }
    if placed {
        let grows: Vec<String> = decision
            .targets
            .iter()
            .map(|(g, t)| {
                let from = input
                    .groups
                    .iter()
                    .find(|x| &x.name == g)
                    .and_then(|x| x.capacity)
                    .unwrap_or(0);
                format!("{g} {from}->{t}")
            })
            .collect();
        for (g, t) in &decision.targets {
            let e = out.targets.entry(g.clone()).or_insert(*t);
            *e = (*e).max(*t);
            if let Some(x) = input.groups.iter_mut().find(|x| &x.name == g) {
                x.capacity = Some(x.capacity.unwrap_or(0).max(*t));
            }
        }
        out.booked.pods.extend(pods);
        return if grows.is_empty() {
            vec![(
                condition::PROVISIONED,
                true,
                reason::CAPACITY_IS_FOUND,
                format!("room for all {n} pods found on the nodes there and on their way"),
            )]
        } else {
            vec![(
                condition::PROVISIONED,
                true,
                reason::CAPACITY_IS_PROVISIONED,
                format!(
                    "capacity for all {n} pods is provisioned: {}",
                    grows.join(", ")
                ),
            )]
        };
    }
    let never = keys.iter().any(|k| {
        decision
            .unfit
            .get(k)
            .is_some_and(|why| why.iter().all(|(_, w)| permanent(w)))
    });
    let message = format!(
        "no single scale-up gives all {n} pods room, nothing was written: {}",
        why_not(&decision, &keys)
    );
    if never {
        vec![
            (
                condition::PROVISIONED,
                false,
                reason::CAPACITY_IS_NOT_FOUND,
                message.clone(),
            ),
            (
                condition::FAILED,
                true,
                reason::CAPACITY_IS_NOT_FOUND,
                message,
            ),
        ]
    } else {
        vec![(
            condition::PROVISIONED,
            false,
            reason::CAPACITY_IS_NOT_FOUND,
            message,
        )]
    }
}

/// Why the request's pods did not all get room, said once per distinct reason.
fn why_not(decision: &super::scale_up::ScaleUpPlan, keys: &BTreeSet<String>) -> String {
    let mut said: BTreeMap<String, usize> = BTreeMap::new();
    for k in keys {
        let text = if let Some(why) = decision.unfit.get(k) {
            if why.is_empty() {
                "no node group".to_string()
            } else {
                why.iter()
                    .map(|(g, w)| format!("{g}: {w}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            }
        } else if let Some(w) = decision.not_simulated.get(k).or(decision.waiting.get(k)) {
            w.clone()
        } else if decision.triggered.contains_key(k) {
            "would need new nodes".to_string()
        } else if decision.already_provided.contains(k) {
            continue;
        } else {
            "no room".to_string()
        };
        *said.entry(text).or_default() += 1;
    }
    said.into_iter()
        .map(|(t, n)| format!("{n} pods: {t}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// `pods` with the booked pods bound to the Ready, schedulable nodes they fit (first fit, in
/// node order): what scale-down simulates, so a node holding booked room is not empty and its
/// booked pods (no controller) keep it, as cluster-autoscaler's injected booking pods do. A
/// booked pod that fits no node holds nothing here (the scale-up asks room for it).
pub fn held_on_nodes(
    booked: &[Arc<PodRecord>],
    nodes: &[Arc<super::record::NodeRecord>],
    pods: &super::index::PodIndex,
) -> super::index::PodIndex {
    let mut out = pods.clone();
    if booked.is_empty() {
        return out;
    }
    let mut states: Vec<super::fit::NodeState> = nodes
        .iter()
        .filter(|n| crate::node_groups::is_ready(n) && crate::node_groups::schedulable(n))
        .map(|n| {
            super::fit::NodeState::with_placed(n, pods.bound(&n.name).cloned().unwrap_or_default())
        })
        .collect();
    for pod in booked {
        let Some(state) = states.iter_mut().find(|s| s.fits(pod).is_ok()) else {
            continue;
        };
        let mut held = (**pod).clone();
        held.node_name = Some(state.name.clone());
        let held = Arc::new(held);
        state.place(held.clone());
        out.replace(None, Some(&held));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::demand::{DemandPods, PendingPods};
    use crate::pods::expander::Expander;
    use crate::pods::index::PodIndex;
    use crate::pods::record::NodeRecord;
    use crate::pods::scale_up::{Backing, GroupInput};
    use crate::pods::template::GroupShape;
    use serde_json::json;

    const MINUTE: Duration = Duration::from_secs(60);

    fn t0() -> Timestamp {
        "2026-11-28T00:00:00Z".parse().unwrap()
    }

    fn group(name: &str, capacity: i64, max: u32) -> GroupInput<'static> {
        GroupInput {
            name: name.into(),
            backing: Backing::ScaleSet {
                resource_group: "mc_rg".into(),
                name: name.into(),
            },
            min: 0,
            max,
            capacity: Some(capacity),
            shape: Some(GroupShape {
                name: Box::leak(name.to_string().into_boxed_str()),
                vm_size: "Standard_D4s_v5",
                ..GroupShape::default()
            }),
            unhealthy: None,
            failed: Vec::new(),
            stopped: Vec::new(),
            passed_over: Default::default(),
            learned: None,
            quota: Vec::new(),
            vcpus: Some(4),
        }
    }

    /// A Ready node of scale set `group` with `cpu` allocatable.
    fn node(group: &str, id: u32, cpu: &str) -> Arc<NodeRecord> {
        let name = format!("{group}-{id}");
        Arc::new(NodeRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                    "creationTimestamp": "2026-11-27T00:00:00Z"},
                "spec": {"providerID": format!("azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/{group}/virtualMachines/{id}")},
                "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]},
            }))
            .unwrap(),
        ))
    }

    fn input(
        groups: Vec<GroupInput<'static>>,
        nodes: Vec<Arc<NodeRecord>>,
        pods: Vec<Arc<PodRecord>>,
        now: Timestamp,
    ) -> ScaleUpInput<'static> {
        ScaleUpInput {
            groups,
            nodes,
            pods: Arc::new(PodIndex::of(&pods)),
            daemonsets: Vec::new(),
            expander: Expander::LeastWaste,
            sources: crate::pods::demand::pending_only(-10),
            seed: 1,
            now,
            node_startup: Duration::from_secs(900),
            quota: Vec::new(),
            balance_similar: false,
            volumes: Arc::default(),
            namespaces: Arc::default(),
            prices: Arc::default(),
        }
    }

    fn template(name: &str, cpu: &str) -> Templates {
        let t: PodTemplate = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "template": {"metadata": {"labels": {"job": name}}, "spec": {"containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}},
        }))
        .unwrap();
        [(("default".to_string(), name.to_string()), Arc::new(t))]
            .into_iter()
            .collect()
    }

    fn request(
        name: &str,
        class: &str,
        sets: serde_json::Value,
        conditions: serde_json::Value,
    ) -> Request {
        Request::of(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "41",
                "generation": 1, "creationTimestamp": "2026-11-27T23:59:00Z"},
            "spec": {"provisioningClassName": class, "podSets": sets},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn kueue(name: &str, class: &str, count: i64) -> Request {
        request(
            name,
            class,
            json!([{"podTemplateRef": {"name": "train"}, "count": count}]),
            json!([]),
        )
    }

    /// The conditions an update sets, as `(type, status, reason)`.
    fn said(out: &Outcome) -> Vec<(&'static str, bool, &'static str)> {
        out.updates.iter().flat_map(|u| u.set.clone()).collect()
    }

    fn provisioned_at(name: &str, class: &str, count: i64, at: Timestamp) -> Request {
        request(
            name,
            class,
            json!([{"podTemplateRef": {"name": "train"}, "count": count}]),
            json!([{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                    "lastTransitionTime": at.to_string()},
                   {"type": "Provisioned", "status": "True", "reason": "CapacityIsFound", "message": "",
                    "lastTransitionTime": at.to_string()}]),
        )
    }

    #[test]
    fn a_check_capacity_request_that_fits_the_nodes_there_is_provisioned_and_books_them() {
        let mut i = input(
            vec![group("general", 1, 10)],
            vec![node("general", 0, "4")],
            vec![],
            t0(),
        );
        let out = decide(
            &[kueue("fits", CHECK_CAPACITY, 3)],
            &template("train", "1"),
            &mut i,
            t0(),
        );
        assert_eq!(
            said(&out),
            vec![
                ("Accepted", true, "Accepted"),
                ("Provisioned", true, "CapacityIsFound")
            ]
        );
        assert!(out.targets.is_empty(), "check-capacity never grows a group");
        assert_eq!(out.booked.pods.len(), 3);
    }

    #[test]
    fn a_check_capacity_request_without_room_there_is_not_provisioned_and_grows_nothing() {
        let mut i = input(
            vec![group("general", 1, 10)],
            vec![node("general", 0, "4")],
            vec![],
            t0(),
        );
        let out = decide(
            &[kueue("big", CHECK_CAPACITY, 5)],
            &template("train", "1"),
            &mut i,
            t0(),
        );
        assert_eq!(
            said(&out),
            vec![
                ("Accepted", true, "Accepted"),
                ("Provisioned", false, "CapacityIsNotFound")
            ]
        );
        assert!(out.targets.is_empty());
        assert!(out.booked.pods.is_empty());
        assert_eq!(i.groups[0].capacity, Some(1), "the input is left as it was");
    }

    #[test]
    fn an_atomic_request_grows_a_group_for_all_of_its_pods_in_one_decision() {
        let mut i = input(vec![group("general", 0, 10)], vec![], vec![], t0());
        let out = decide(
            &[kueue("train", BEST_EFFORT_ATOMIC, 6)],
            &template("train", "1"),
            &mut i,
            t0(),
        );
        assert_eq!(
            said(&out),
            vec![
                ("Accepted", true, "Accepted"),
                ("Provisioned", true, "CapacityIsProvisioned")
            ]
        );
        // A D4s_v5 keeps 3 whole cpus allocatable after AKS's reservations: 2 nodes for 6 pods.
        assert_eq!(out.targets, BTreeMap::from([("general".to_string(), 2)]));
        assert_eq!(
            i.groups[0].capacity,
            Some(2),
            "later decisions start from the new capacity"
        );
        assert_eq!(out.booked.pods.len(), 6);
    }

    #[test]
    fn an_atomic_request_that_a_group_can_take_only_in_part_raises_no_target_and_waits() {
        let mut i = input(vec![group("general", 0, 2)], vec![], vec![], t0());
        let out = decide(
            &[kueue("train", BEST_EFFORT_ATOMIC, 10)],
            &template("train", "1"),
            &mut i,
            t0(),
        );
        assert_eq!(
            said(&out),
            vec![
                ("Accepted", true, "Accepted"),
                ("Provisioned", false, "CapacityIsNotFound")
            ]
        );
        assert!(out.targets.is_empty(), "all or nothing: {:?}", out.targets);
        let msg = out.updates[0].object["status"]["conditions"][1]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(msg.contains("max size"), "{msg}");
    }

    #[test]
    fn an_atomic_request_whose_pods_fit_no_node_of_any_group_fails_with_the_reason() {
        let mut i = input(vec![group("general", 0, 10)], vec![], vec![], t0());
        let out = decide(
            &[kueue("huge", BEST_EFFORT_ATOMIC, 2)],
            &template("train", "64"),
            &mut i,
            t0(),
        );
        assert!(
            said(&out).contains(&("Failed", true, "CapacityIsNotFound")),
            "{:?}",
            said(&out)
        );
        assert!(out.targets.is_empty());
        let conds = out.updates[0].object["status"]["conditions"]
            .as_array()
            .unwrap()
            .clone();
        let failed = conds.iter().find(|c| c["type"] == "Failed").unwrap();
        assert!(
            failed["message"].as_str().unwrap().contains("general: "),
            "{failed}"
        );
    }

    #[test]
    fn bad_requests_fail_naming_what_is_wrong() {
        let mut i = input(vec![group("general", 0, 10)], vec![], vec![], t0());
        let cases = [
            (
                json!([{"podTemplateRef": {"name": "gone"}, "count": 1}]),
                "PodTemplate default/gone not found",
            ),
            (
                json!([{"podTemplateRef": {"name": "train"}, "count": 0}]),
                "spec.podSets[0].count is 0",
            ),
            (
                json!([{"podTemplateRef": {}, "count": 1}]),
                "podTemplateRef.name is missing",
            ),
            (json!([]), "spec.podSets is empty"),
        ];
        for (sets, says) in cases {
            let r = request("bad", BEST_EFFORT_ATOMIC, sets, json!([]));
            let out = decide(&[r], &template("train", "1"), &mut i, t0());
            assert!(
                said(&out).contains(&("Failed", true, "FailedToCreatePods")),
                "{says}"
            );
            let text = out.updates[0].object["status"]["conditions"].to_string();
            assert!(text.contains(says), "{text} should say {says}");
            assert!(out.targets.is_empty());
        }
    }

    #[test]
    fn requests_of_other_classes_and_finished_ones_are_left_alone() {
        let mut i = input(vec![group("general", 0, 10)], vec![], vec![], t0());
        let failed = request(
            "done",
            BEST_EFFORT_ATOMIC,
            json!([{"podTemplateRef": {"name": "train"}, "count": 1}]),
            json!([{"type": "Failed", "status": "True", "reason": "Expired", "message": "",
                    "lastTransitionTime": "2026-11-20T00:00:00Z"}]),
        );
        let out = decide(
            &[kueue("gke", "queued-provisioning.gke.io", 4), failed],
            &template("train", "1"),
            &mut i,
            t0(),
        );
        assert!(out.updates.is_empty() && out.targets.is_empty() && out.booked.pods.is_empty());
    }

    #[test]
    fn booked_room_is_not_given_to_other_pods_and_the_booking_expires_after_ten_minutes() {
        let nodes = vec![node("general", 0, "4")];
        let stranger = Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": "stranger", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
            }))
            .unwrap(),
        ));
        let booked = provisioned_at("train", CHECK_CAPACITY, 3, t0());
        let at = after(t0(), 5 * MINUTE);
        let mut i = input(
            vec![group("general", 1, 10)],
            nodes.clone(),
            vec![stranger.clone()],
            at,
        );
        let out = decide(
            std::slice::from_ref(&booked),
            &template("train", "1"),
            &mut i,
            at,
        );
        assert!(out.updates.is_empty());
        assert_eq!(
            out.bookings,
            vec![Booking {
                request: "default/train".into(),
                pods: 3,
                until: after(t0(), BOOKING_TIME)
            }]
        );
        // The stranger would fit the node's 3 cpus, but 3 are booked: it needs a new node.
        i.sources = vec![
            Arc::new(out.booked.clone()),
            Arc::new(PendingPods {
                priority_cutoff: -10,
            }),
        ];
        let p = plan(&i);
        assert_eq!(
            p.triggered.get("default/stranger").map(String::as_str),
            Some("general")
        );
        assert_eq!(p.targets, BTreeMap::from([("general".to_string(), 2)]));
        // Without the booking it takes the free room.
        i.sources = vec![Arc::new(PendingPods {
            priority_cutoff: -10,
        })];
        assert!(plan(&i).targets.is_empty());
        // Ten minutes on, the booking ends.
        let later = after(t0(), BOOKING_TIME);
        let out = decide(&[booked], &template("train", "1"), &mut i, later);
        assert_eq!(
            said(&out),
            vec![("BookingExpired", true, "CapacityReservationTimeExpired")]
        );
        assert!(out.booked.pods.is_empty());
    }

    #[test]
    fn a_booking_shrinks_as_its_consumers_bind_and_ends_when_all_are_scheduled() {
        let consumer = |n: usize, node: Option<&str>| {
            Arc::new(PodRecord::of(
                serde_json::from_value(json!({
                    "metadata": {"name": format!("job-{n}"), "namespace": "default", "annotations": {
                        CONSUME_PROVISIONING_REQUEST: "train", PROVISIONING_CLASS_NAME: CHECK_CAPACITY}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                    "status": {"phase": "Running"},
                }))
                .unwrap(),
            ))
        };
        let booked = provisioned_at("train", CHECK_CAPACITY, 2, t0());
        let at = after(t0(), MINUTE);
        let mut i = input(
            vec![group("general", 1, 10)],
            vec![node("general", 0, "4")],
            vec![consumer(0, Some("general-0"))],
            at,
        );
        let out = decide(
            std::slice::from_ref(&booked),
            &template("train", "1"),
            &mut i,
            at,
        );
        assert_eq!(
            out.booked.pods.len(),
            1,
            "one consumer is bound, one pod stays booked"
        );
        let mut i = input(
            vec![group("general", 1, 10)],
            vec![node("general", 0, "4")],
            vec![
                consumer(0, Some("general-0")),
                consumer(1, Some("general-0")),
            ],
            at,
        );
        let out = decide(&[booked], &template("train", "1"), &mut i, at);
        assert_eq!(
            said(&out),
            vec![("BookingExpired", true, "CapacityBookingConsumed")]
        );
    }

    #[test]
    fn a_request_not_provisioned_within_seven_days_fails_as_expired() {
        let mut i = input(vec![group("general", 0, 0)], vec![], vec![], t0());
        let r = kueue("old", BEST_EFFORT_ATOMIC, 1);
        // Created a minute before t0.
        let out = decide(
            std::slice::from_ref(&r),
            &template("train", "1"),
            &mut i,
            after(t0(), EXPIRY - 2 * MINUTE),
        );
        assert!(!said(&out).iter().any(|s| s.0 == "Failed"));
        let out = decide(
            &[r],
            &template("train", "1"),
            &mut i,
            after(t0(), EXPIRY - MINUTE),
        );
        assert!(
            said(&out).contains(&("Failed", true, "Expired")),
            "{:?}",
            said(&out)
        );
    }

    #[test]
    fn at_most_twenty_requests_are_updated_per_loop_oldest_first() {
        let mut i = input(vec![group("general", 0, 100)], vec![], vec![], t0());
        let reqs: Vec<Request> = (0..25)
            .map(|n| {
                let mut r = kueue(&format!("r{n:02}"), CHECK_CAPACITY, 1);
                r.metadata.creation_timestamp =
                    Some(Time(after(t0(), Duration::from_secs(25 - n))));
                r
            })
            .collect();
        let out = decide(&reqs, &template("train", "1"), &mut i, after(t0(), MINUTE));
        assert_eq!(out.updates.len(), MAX_UPDATES_PER_LOOP);
        assert_eq!(out.deferred, 5);
        assert_eq!(out.updates[0].key, "default/r24", "the oldest first");
    }

    #[test]
    fn ended_bookings_count_against_the_twenty_updates_too() {
        let mut i = input(vec![group("general", 0, 100)], vec![], vec![], t0());
        let reqs: Vec<Request> = (0..25)
            .map(|n| provisioned_at(&format!("b{n:02}"), CHECK_CAPACITY, 1, t0()))
            .collect();
        let out = decide(
            &reqs,
            &template("train", "1"),
            &mut i,
            after(t0(), BOOKING_TIME),
        );
        assert_eq!(out.updates.len(), MAX_UPDATES_PER_LOOP);
        assert_eq!(out.deferred, 5);
        assert!(out.booked.pods.is_empty(), "an ended booking holds nothing");
    }

    #[test]
    fn a_status_update_sends_the_resource_version_read_and_keeps_the_rest_of_the_object() {
        let mut i = input(vec![group("general", 0, 10)], vec![], vec![], t0());
        let mut r = kueue("train", BEST_EFFORT_ATOMIC, 1);
        r.object["status"]["provisioningClassDetails"] = json!({"a": "b"});
        let out = decide(&[r], &template("train", "1"), &mut i, t0());
        let o = &out.updates[0].object;
        assert_eq!(o["metadata"]["resourceVersion"], "41");
        assert_eq!(o["status"]["provisioningClassDetails"]["a"], "b");
        assert_eq!(o["status"]["conditions"][0]["observedGeneration"], 1);
        // Said again with nothing new: no second write.
        let again = Request::of(o.clone()).unwrap();
        let mut i = input(vec![group("general", 1, 10)], vec![], vec![], t0());
        let out = decide(&[again], &template("train", "1"), &mut i, t0());
        assert!(out.updates.is_empty(), "{:?}", said(&out));
    }

    #[test]
    fn the_pending_pods_source_leaves_out_the_pods_that_consume_a_request() {
        let pod = |annotations: serde_json::Value| {
            Arc::new(PodRecord::of(
                serde_json::from_value(json!({
                    "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
                    "spec": {"containers": []},
                    "status": {"phase": "Pending", "conditions": [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
                }))
                .unwrap(),
            ))
        };
        let both = pod(
            json!({CONSUME_PROVISIONING_REQUEST: "r", PROVISIONING_CLASS_NAME: CHECK_CAPACITY}),
        );
        let one = pod(json!({CONSUME_PROVISIONING_REQUEST: "r"}));
        let source = PendingPods {
            priority_cutoff: -10,
        };
        assert!(source.asking(&PodIndex::of(&[both])).is_empty());
        assert_eq!(
            source.asking(&PodIndex::of(&[one])).len(),
            1,
            "both annotations are needed"
        );
    }

    #[test]
    fn booked_pods_hold_the_nodes_they_fit_for_scale_down() {
        let nodes = vec![node("general", 0, "4"), node("general", 1, "4")];
        let booked = provisioned_at("train", CHECK_CAPACITY, 2, t0())
            .virtual_pods(&template("train", "3"))
            .unwrap();
        let held = held_on_nodes(&booked, &nodes, &PodIndex::default());
        assert_eq!(held.bound("general-0").map(|p| p.pods().len()), Some(1));
        assert_eq!(
            held.bound("general-1").map(|p| p.pods().len()),
            Some(1),
            "3 cpus each: one per node"
        );
        assert!(held_on_nodes(&[], &nodes, &PodIndex::default())
            .bound("general-0")
            .is_none());
    }
}
