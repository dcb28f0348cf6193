//! The object store: JSON objects keyed by (type, namespace, name), one cluster-wide
//! `resourceVersion` stamped on every write, and a bounded history of watch events.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::resources::{self, ResourceType};
use super::select::Selector;
use super::status::{self, KubeError};

/// Namespaces a fresh real cluster has.
pub const INITIAL_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Deleted (the object as it was, stamped with the deletion's version).
    Deleted,
}

impl EventType {
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The cluster version of the write.
    pub rv: u64,
    /// Store id of the object's type (`group/version/plural`).
    pub type_id: String,
    /// Namespace (`""` for cluster-scoped).
    pub namespace: String,
    /// What happened.
    pub event: EventType,
    /// The object after the change (before it, for a delete).
    pub object: Value,
    /// The object before a modification, so a filtered watch can tell an object that enters its
    /// selector (ADDED) or leaves it (DELETED) from one that stays (MODIFIED), as the API
    /// server's watch cache does.
    pub prev: Option<Value>,
}

/// Key of a stored object.
type Key = (String, String, String);

/// The objects, the cluster version and the watch history.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    window: usize,
    /// Watches from a version below this one cannot be served (410 Gone).
    oldest_servable: u64,
    /// The version of the last change of each type (by store id), so a poller can tell
    /// cheaply whether anything of a type changed.
    last_change: std::collections::HashMap<String, u64>,
    tx: broadcast::Sender<Arc<Change>>,
}

/// A LIST page.
#[derive(Debug)]
pub struct Page<T = Value> {
    /// Matching objects, in key order.
    pub items: Vec<T>,
    /// The cluster version the list reflects.
    pub rv: u64,
    /// Set when more items follow: the key to resume after.
    pub next: Option<String>,
    /// How many items follow this page (`remainingItemCount`): set when more follow and the
    /// list selects nothing, as the API server sets it.
    pub remaining: Option<usize>,
}

fn now_rfc3339() -> String {
    rfc3339_in(time::Duration::ZERO)
}

/// `after` from now, to the second, as RFC 3339.
fn rfc3339_in(after: time::Duration) -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            (t + after)
                .format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

fn rv_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
}

/// The `metadata.name` of `obj`, if any.
pub fn name_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/name").and_then(Value::as_str)
}

impl Store {
    /// An empty store with the initial namespaces, keeping `window` watch events.
    pub fn new(window: usize) -> Self {
        let (tx, _) = broadcast::channel(4096);
        let mut store = Store {
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            window: window.max(1),
            oldest_servable: 0,
            last_change: std::collections::HashMap::new(),
            tx,
        };
        let ns = resources::find("", "v1", "namespaces").expect("namespaces are served");
        for name in INITIAL_NAMESPACES {
            let _ = store.create(ns, "", json!({"metadata": {"name": name}}));
        }
        store
    }

    /// The current cluster version.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The version of the last change to an object of type `rt` (0: none yet).
    pub fn last_change(&self, rt: &ResourceType) -> u64 {
        self.last_change.get(&rt.id()).copied().unwrap_or(0)
    }

    /// The lowest version a watch can start from.
    pub fn oldest_servable(&self) -> u64 {
        self.oldest_servable
    }

    /// A receiver of every later change.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.tx.subscribe()
    }

    /// Retained changes after `rv`, oldest first.
    pub fn changes_since(&self, rv: u64) -> Vec<Arc<Change>> {
        self.history.iter().filter(|c| c.rv > rv).cloned().collect()
    }

    /// Forgets the whole history, as an etcd compaction does: watches from any earlier
    /// version then get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.oldest_servable = self.rv;
    }

    fn record(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        event: EventType,
        object: Value,
        prev: Option<Value>,
    ) {
        self.last_change.insert(rt.id(), self.rv);
        let change = Arc::new(Change {
            rv: self.rv,
            type_id: rt.id(),
            namespace: namespace.to_string(),
            event,
            object,
            prev,
        });
        self.history.push_back(Arc::clone(&change));
        while self.history.len() > self.window {
            if let Some(old) = self.history.pop_front() {
                self.oldest_servable = old.rv;
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.tx.send(change);
    }

    fn key(rt: &ResourceType, namespace: &str, name: &str) -> Key {
        let ns = if rt.namespaced { namespace } else { "" };
        (rt.id(), ns.to_string(), name.to_string())
    }

    fn check_namespace(&self, rt: &ResourceType, namespace: &str) -> Result<(), KubeError> {
        if !rt.namespaced {
            return Ok(());
        }
        let ns = resources::find("", "v1", "namespaces").expect("namespaces are served");
        if self.objects.contains_key(&Self::key(ns, "", namespace)) {
            Ok(())
        } else {
            Err(status::not_found(ns, namespace))
        }
    }

    /// One object.
    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, KubeError> {
        self.objects
            .get(&Self::key(rt, namespace, name))
            .cloned()
            .ok_or_else(|| status::not_found(rt, name))
    }

    /// Objects of a type (in `namespace`, or all when it is `None`), matching `selector`, after
    /// the key `after`, at most `limit` of them.
    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        selector: &Selector,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Page {
        let page = self.list_borrowed(rt, namespace, selector, after, limit);
        Page {
            items: page.items.into_iter().cloned().collect(),
            rv: page.rv,
            next: page.next,
            remaining: page.remaining,
        }
    }

    /// [`Store::list`] without copying the objects (a page is written out as it is read).
    pub fn list_borrowed<'a>(
        &'a self,
        rt: &ResourceType,
        namespace: Option<&'a str>,
        selector: &Selector,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Page<&'a Value> {
        let mut items: Vec<&Value> = Vec::new();
        let mut next = None;
        let mut remaining = None;
        // The store's key of the last item (not its body's metadata, which a write may not
        // have normalised): where the next page starts.
        let mut last: Option<&Key> = None;
        let mut objects = self.range(rt, namespace, after);
        for (key, obj) in objects.by_ref() {
            if !selector.matches(rt, obj) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                // One more matches: the page continues after its last item.
                next = last.map(|(_, ns, name)| format!("{ns}/{name}"));
                remaining = Some(1);
                break;
            }
            items.push(obj);
            last = Some(key);
        }
        // As the API server: how many follow is counted (keys only) when nothing is selected,
        // and left unset when a selector would have to be applied to every one of them.
        remaining = match remaining {
            Some(first) if selector.is_empty() => Some(first + objects.count()),
            _ => None,
        };
        Page {
            items,
            rv: self.rv,
            next,
            remaining,
        }
    }

    /// The objects of a type in key order (in `namespace`, or all when it is `None`), after the
    /// key `after` (`namespace/name`, as a continue token carries it): a page starts where the
    /// last one ended, and a namespace's objects are read alone, instead of every object of the
    /// type being scanned.
    fn range<'a>(
        &'a self,
        rt: &ResourceType,
        namespace: Option<&'a str>,
        after: Option<&str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        use std::ops::Bound;
        let id = rt.id();
        let start = match after {
            Some(a) => {
                let (ns, name) = a.split_once('/').unwrap_or(("", a));
                Bound::Excluded((id.clone(), ns.to_string(), name.to_string()))
            }
            None => Bound::Included((
                id.clone(),
                namespace.unwrap_or("").to_string(),
                String::new(),
            )),
        };
        self.objects
            .range((start, Bound::Unbounded))
            .take_while(move |((tid, ns, _), _)| {
                *tid == id && namespace.is_none_or(|want| ns.as_str() <= want)
            })
            .filter(move |((_, ns, _), _)| namespace.is_none_or(|want| ns == want))
    }

    /// Every object of a type in `namespace`, borrowed.
    pub fn iter_in<'a>(
        &'a self,
        rt: &ResourceType,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.range(rt, Some(namespace), None).map(|(_, v)| v)
    }

    /// Creates an object (`metadata.name` or `generateName` required). Stamps `uid`,
    /// `creationTimestamp`, `resourceVersion` and, where kept, `generation`.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        mut obj: Value,
    ) -> Result<Value, KubeError> {
        if !obj.is_object() {
            return Err(status::bad_request(format!(
                "the body of a {} must be a JSON object",
                rt.kind
            )));
        }
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        let name = match name_of(&obj) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
            {
                Some(prefix) if !prefix.is_empty() => {
                    let suffix: String = uuid::Uuid::new_v4().simple().to_string()[..5].to_string();
                    format!("{prefix}{suffix}")
                }
                _ => {
                    return Err(status::invalid(
                        rt,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ))
                }
            },
        };
        if let Some(body_ns) = obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            if rt.namespaced && !body_ns.is_empty() && body_ns != namespace {
                return Err(status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        self.check_namespace(rt, namespace)?;
        validate(rt, &name, &obj)?;
        let key = Self::key(rt, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(status::already_exists(rt, &name));
        }
        self.rv += 1;
        let rv = self.rv;
        obj["kind"] = json!(rt.kind);
        obj["apiVersion"] = json!(rt.group_version());
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        if rt.namespaced {
            meta["namespace"] = json!(namespace);
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("namespace");
        }
        meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
        meta["creationTimestamp"] = json!(now_rfc3339());
        meta["resourceVersion"] = json!(rv.to_string());
        if rt.generation {
            meta["generation"] = json!(1);
        } else if let Some(m) = meta.as_object_mut() {
            m.remove("generation");
        }
        defaults(rt, &mut obj);
        self.objects.insert(key, obj.clone());
        self.record(rt, namespace, EventType::Added, obj.clone(), None);
        self.mirror_event(rt, namespace, EventType::Added, &obj);
        Ok(obj)
    }

    /// Replaces an object. A `metadata.resourceVersion` in `obj` is a precondition (409 Conflict
    /// when stale); without one the update is unconditional. `subresource` `status` changes only
    /// the status; otherwise a type with a status subresource keeps its stored status. An update
    /// that changes nothing keeps the version, as on the real server.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        mut obj: Value,
        subresource: Option<&str>,
    ) -> Result<Value, KubeError> {
        if !obj.is_object() {
            return Err(status::bad_request(format!(
                "the body of a {} must be a JSON object",
                rt.kind
            )));
        }
        if let Some(body_name) = name_of(&obj) {
            if body_name != name {
                return Err(status::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
        }
        self.check_namespace(rt, namespace)?;
        let key = Self::key(rt, namespace, name);
        // A uid in the body is a precondition (the Go API server's): the object gone, or
        // another object under the same name, is a 409, not a 404.
        let want_uid = obj
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .map(str::to_string);
        let Some(old) = self.objects.get(&key) else {
            return Err(match want_uid {
                Some(want) => status::uid_conflict(rt, namespace, name, &want, ""),
                None => status::not_found(rt, name),
            });
        };
        if let Some(want) = want_uid {
            let stored = old
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("");
            if want != stored {
                return Err(status::uid_conflict(rt, namespace, name, &want, stored));
            }
        }
        let old_rv = rv_of(old).unwrap_or("").to_string();
        if let Some(want) = rv_of(&obj) {
            if !want.is_empty() && want != old_rv {
                return Err(status::conflict(rt, name));
            }
        }
        let mut new = match subresource {
            Some("status") => {
                let mut n = old.clone();
                n["status"] = obj.get("status").cloned().unwrap_or(json!({}));
                n
            }
            _ => {
                if !obj.get("metadata").is_some_and(Value::is_object) {
                    obj["metadata"] = json!({});
                }
                if rt.status_subresource {
                    match old.get("status") {
                        Some(s) => obj["status"] = s.clone(),
                        None => {
                            if let Some(m) = obj.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                obj
            }
        };
        new["kind"] = json!(rt.kind);
        new["apiVersion"] = json!(rt.group_version());
        let meta = &mut new["metadata"];
        meta["name"] = json!(name);
        if rt.namespaced {
            meta["namespace"] = json!(namespace);
        } else if let Some(m) = meta.as_object_mut() {
            // A cluster-scoped object has no namespace, whatever the body says (as on create).
            m.remove("namespace");
        }
        for immutable in ["uid", "creationTimestamp", "deletionTimestamp"] {
            match old.pointer(&format!("/metadata/{immutable}")) {
                Some(v) => meta[immutable] = v.clone(),
                None => {
                    if let Some(m) = meta.as_object_mut() {
                        m.remove(immutable);
                    }
                }
            }
        }
        meta["resourceVersion"] = json!(old_rv);
        // Defaulted first, so an update that leaves out a defaulted field changes no spec.
        defaults(rt, &mut new);
        if rt.generation {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let bump = old.get("spec") != new.get("spec");
            new["metadata"]["generation"] = json!(if bump { g + 1 } else { g });
        } else if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("generation");
        }
        if &new == old {
            return Ok(new);
        }
        self.rv += 1;
        new["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let prev = self.objects.insert(key, new.clone());
        self.record(rt, namespace, EventType::Modified, new.clone(), prev);
        self.mirror_event(rt, namespace, EventType::Modified, &new);
        Ok(new)
    }

    /// The object under `key`, if `precondition_rv` (from `DeleteOptions.preconditions`), when
    /// given, is its resourceVersion.
    fn current(
        &self,
        rt: &ResourceType,
        key: &Key,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<&Value, KubeError> {
        let old = self
            .objects
            .get(key)
            .ok_or_else(|| status::not_found(rt, name))?;
        match precondition_rv {
            Some(want) if rv_of(old) != Some(want) => Err(status::conflict(rt, name)),
            _ => Ok(old),
        }
    }

    /// Graceful deletion's first half: sets `deletionTimestamp` (now plus `grace` seconds) and
    /// `deletionGracePeriodSeconds` and keeps the object, as the API server does for a pod bound
    /// to a node until its kubelet confirms. An object already marked is left as it is.
    /// `precondition_rv` as for [`Store::delete`].
    pub fn mark_deleting(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        grace: i64,
        precondition_rv: Option<&str>,
    ) -> Result<Value, KubeError> {
        let key = Self::key(rt, namespace, name);
        let old = self.current(rt, &key, name, precondition_rv)?;
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(old.clone());
        }
        let at = rfc3339_in(time::Duration::seconds(grace.max(0)));
        let mut new = old.clone();
        new["metadata"]["deletionTimestamp"] = json!(at);
        new["metadata"]["deletionGracePeriodSeconds"] = json!(grace.max(0));
        self.rv += 1;
        new["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let prev = self.objects.insert(key, new.clone());
        self.record(rt, namespace, EventType::Modified, new.clone(), prev);
        Ok(new)
    }

    /// Deletes an object (a namespace takes its objects with it). `precondition_rv`, from
    /// `DeleteOptions.preconditions.resourceVersion`, must match when given.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<Value, KubeError> {
        let key = Self::key(rt, namespace, name);
        self.current(rt, &key, name, precondition_rv)?;
        if rt.plural == "namespaces" && rt.group.is_empty() {
            let inside: Vec<Key> = self
                .objects
                .keys()
                .filter(|(tid, ns, _)| ns == name && by_id_namespaced(tid))
                .cloned()
                .collect();
            for (tid, ns, n) in inside {
                if let Some(inner) = resources::by_id(&tid) {
                    let _ = self.delete(inner, &ns, &n, None);
                }
            }
        }
        let Some(old) = self.objects.remove(&key) else {
            return Err(status::not_found(rt, name));
        };
        self.rv += 1;
        let mut gone = old.clone();
        gone["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(rt, namespace, EventType::Deleted, gone.clone(), None);
        self.mirror_event(rt, namespace, EventType::Deleted, &gone);
        Ok(old)
    }

    /// A core `v1` Event and an `events.k8s.io/v1` Event are one object on the real server,
    /// seen through two APIs with some fields renamed: an Event posted through either shows in
    /// both (so `kubectl get events` lists what a controller posted as `events.k8s.io/v1`).
    /// Each write of one is mirrored to its twin, with the same version, uid and change.
    fn mirror_event(&mut self, rt: &ResourceType, namespace: &str, event: EventType, obj: &Value) {
        let Some((twin, converted)) = event_twin(rt, obj) else {
            return;
        };
        let Some(name) = name_of(&converted).map(str::to_string) else {
            return;
        };
        let key = Self::key(twin, namespace, &name);
        let prev = match event {
            EventType::Deleted => {
                self.objects.remove(&key);
                None
            }
            EventType::Added => {
                self.objects.insert(key, converted.clone());
                None
            }
            EventType::Modified => self.objects.insert(key, converted.clone()),
        };
        self.record(twin, namespace, event, converted, prev);
    }
}

/// Field names of a core `v1` Event and their `events.k8s.io/v1` names (the rest are shared),
/// as `k8s.io/kubernetes/pkg/apis/events/v1/conversion.go` maps them.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// The other API's type and view of an Event; `None` for every other type.
fn event_twin(rt: &ResourceType, obj: &Value) -> Option<(&'static ResourceType, Value)> {
    if rt.plural != "events" {
        return None;
    }
    let to_events_api = rt.group.is_empty();
    let twin = if to_events_api {
        resources::find("events.k8s.io", "v1", "events")?
    } else {
        resources::find("", "v1", "events")?
    };
    let mut out = obj.clone();
    let m = out.as_object_mut()?;
    for (core, events) in EVENT_FIELDS {
        let (from, to) = if to_events_api {
            (core, events)
        } else {
            (events, core)
        };
        if let Some(v) = m.remove(*from) {
            m.insert((*to).to_string(), v);
        }
    }
    m.insert("kind".into(), json!(twin.kind));
    m.insert("apiVersion".into(), json!(twin.group_version()));
    super::shape::always_sent(twin, &mut out);
    Some((twin, out))
}

fn by_id_namespaced(id: &str) -> bool {
    resources::by_id(id).is_some_and(|r| r.namespaced)
}

/// What the Go API server's validation refuses on create, for the types whose rules the
/// simulation depends on: a Job's pods must not restart in place (`restartPolicy` `Never` or
/// `OnFailure`; absent, it defaults to `Always`, refused the same way: `validateJobSpec`).
fn validate(rt: &ResourceType, name: &str, obj: &Value) -> Result<(), KubeError> {
    if (rt.group, rt.plural) == ("batch", "jobs") {
        let policy = obj
            .pointer("/spec/template/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("");
        let message = match policy {
            "Never" | "OnFailure" => None,
            "Always" | "" => {
                Some("Required value: valid values: \"OnFailure\", \"Never\"".to_string())
            }
            other => Some(format!(
                "Unsupported value: \"{other}\": supported values: \"OnFailure\", \"Never\""
            )),
        };
        if let Some(m) = message {
            return Err(status::invalid(
                rt,
                name,
                "spec.template.spec.restartPolicy",
                &m,
            ));
        }
    }
    Ok(())
}

/// Server-side defaults the clients rely on.
fn defaults(rt: &ResourceType, obj: &mut Value) {
    match (rt.group, rt.plural) {
        ("", "namespaces") => {
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Active"});
            }
        }
        ("", "pods") => pod_defaults(obj),
        ("", "podtemplates") => template_spec_defaults(obj, "/template/spec"),
        ("apps", "deployments") => {
            set_absent(obj, "/spec", "replicas", json!(1));
            set_absent(obj, "/spec", "revisionHistoryLimit", json!(10));
            set_absent(obj, "/spec", "progressDeadlineSeconds", json!(600));
            if obj.pointer("/spec/strategy/type").is_none() {
                obj["spec"]["strategy"] = json!({"type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}});
            }
            template_defaults(obj);
        }
        ("apps", "replicasets") => {
            set_absent(obj, "/spec", "replicas", json!(1));
            template_defaults(obj);
        }
        ("batch", "jobs") => {
            // As the Go API server defaults a Job (`batch/v1` `SetDefaults_Job`): completions
            // and parallelism 1 when both are absent, parallelism from completions otherwise.
            let completions = obj.pointer("/spec/completions").cloned();
            let parallelism = obj.pointer("/spec/parallelism").cloned();
            match (completions, parallelism) {
                (None, None) => {
                    set_absent(obj, "/spec", "completions", json!(1));
                    set_absent(obj, "/spec", "parallelism", json!(1));
                }
                (Some(c), None) => set_absent(obj, "/spec", "parallelism", c),
                _ => {}
            }
            set_absent(obj, "/spec", "backoffLimit", json!(6));
            set_absent(obj, "/spec", "completionMode", json!("NonIndexed"));
            set_absent(obj, "/spec", "suspend", json!(false));
            set_absent(
                obj,
                "/spec",
                "podReplacementPolicy",
                json!("TerminatingOrFailed"),
            );
            // The Job strategy's `PrepareForCreate` without `manualSelector`: a selector on the
            // Job's uid, its labels on the template (both keys, as 1.27 and later write them),
            // and the template's labels on a Job without labels of its own.
            let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(json!(""));
            let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
            if obj.pointer("/spec/manualSelector") != Some(&json!(true))
                && obj.pointer("/spec/template").is_some_and(Value::is_object)
            {
                if !obj
                    .pointer("/spec/template/metadata")
                    .is_some_and(Value::is_object)
                {
                    obj["spec"]["template"]["metadata"] = json!({});
                }
                if !obj
                    .pointer("/spec/template/metadata/labels")
                    .is_some_and(Value::is_object)
                {
                    obj["spec"]["template"]["metadata"]["labels"] = json!({});
                }
                let labels = &mut obj["spec"]["template"]["metadata"]["labels"];
                for key in ["batch.kubernetes.io/controller-uid", "controller-uid"] {
                    labels[key] = uid.clone();
                }
                for key in ["batch.kubernetes.io/job-name", "job-name"] {
                    labels[key] = name.clone();
                }
                obj["spec"]["selector"] =
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
                if obj
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .is_none_or(|l| l.is_empty())
                {
                    obj["metadata"]["labels"] =
                        obj["spec"]["template"]["metadata"]["labels"].clone();
                }
            }
            template_defaults(obj);
        }
        ("apps", "daemonsets") => {
            set_absent(obj, "/spec", "revisionHistoryLimit", json!(10));
            if obj.pointer("/spec/updateStrategy/type").is_none() {
                obj["spec"]["updateStrategy"] =
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}});
            }
            template_defaults(obj);
        }
        ("", "persistentvolumeclaims") => {
            set_absent(obj, "/spec", "volumeMode", json!("Filesystem"));
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Pending"});
            }
        }
        ("", "persistentvolumes") => {
            set_absent(
                obj,
                "/spec",
                "persistentVolumeReclaimPolicy",
                json!("Retain"),
            );
            set_absent(obj, "/spec", "volumeMode", json!("Filesystem"));
            if obj.pointer("/status/phase").is_none() {
                obj["status"] = json!({"phase": "Pending"});
            }
        }
        ("storage.k8s.io", "storageclasses") => {
            set_absent(obj, "", "reclaimPolicy", json!("Delete"));
            set_absent(obj, "", "volumeBindingMode", json!("Immediate"));
        }
        _ => {}
    }
    super::shape::always_sent(rt, obj);
}

/// Sets `key` in the object at `parent` (`""`: the top) when absent; no parent, no change.
fn set_absent(obj: &mut Value, parent: &str, key: &str, value: Value) {
    let target = if parent.is_empty() {
        Some(obj)
    } else {
        obj.pointer_mut(parent)
    };
    if let Some(m) = target.and_then(Value::as_object_mut) {
        m.entry(key.to_string()).or_insert(value);
    }
}

/// The defaults a 1.20 API server gives a workload's pod template (`SetDefaults_PodSpec` and
/// `SetDefaults_Container`; no admission plugin runs on templates, so no tolerations, priority
/// or service links, as on the real server).
fn template_defaults(obj: &mut Value) {
    template_spec_defaults(obj, "/spec/template/spec");
}

/// A pod template's spec at `pointer` defaulted as the Go API server defaults it.
fn template_spec_defaults(obj: &mut Value, pointer: &str) {
    let Some(spec) = obj.pointer_mut(pointer).and_then(Value::as_object_mut) else {
        return;
    };
    for (key, value) in [
        ("dnsPolicy", json!("ClusterFirst")),
        ("restartPolicy", json!("Always")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("terminationGracePeriodSeconds", json!(30)),
    ] {
        spec.entry(key.to_string()).or_insert(value);
    }
    for list in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter(|c| c.is_object()) {
                container_defaults(c);
            }
        }
    }
}

/// `SetDefaults_Container`: the pull policy from the image's tag, the termination message path
/// and policy, empty resources.
fn container_defaults(c: &mut Value) {
    if c.get("imagePullPolicy").is_none() {
        let image = c.get("image").and_then(Value::as_str).unwrap_or("");
        let tag = image
            .rsplit('/')
            .next()
            .unwrap_or("")
            .split_once(':')
            .map(|(_, t)| t);
        let always = !image.contains('@') && matches!(tag, None | Some("latest"));
        c["imagePullPolicy"] = json!(if always { "Always" } else { "IfNotPresent" });
    }
    if c.get("resources").is_none() {
        c["resources"] = json!({});
    }
    if c.get("terminationMessagePath").is_none() {
        c["terminationMessagePath"] = json!("/dev/termination-log");
    }
    if c.get("terminationMessagePolicy").is_none() {
        c["terminationMessagePolicy"] = json!("File");
    }
}

/// What a 1.20 API server adds to a pod it stores (compared with `kubectl get pod -o json` on
/// both servers): the spec defaults, the DefaultTolerationSeconds admission plugin's two
/// tolerations, per-container defaults, `status.phase` Pending and `status.qosClass`.
fn pod_defaults(obj: &mut Value) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (key, value) in [
        ("dnsPolicy", json!("ClusterFirst")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
        ("restartPolicy", json!("Always")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("terminationGracePeriodSeconds", json!(30)),
    ] {
        if spec.get(key).is_none() {
            spec[key] = value;
        }
    }
    if !spec.get("tolerations").is_some_and(Value::is_array) {
        spec["tolerations"] = json!([]);
    }
    for taint in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
        let tolerated = tolerations.iter().any(|t| {
            let key = t.get("key").and_then(Value::as_str).unwrap_or("");
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (key == taint || key.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        });
        if !tolerated {
            if let Some(list) = spec["tolerations"].as_array_mut() {
                list.push(json!({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    for list in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter(|c| c.is_object()) {
                container_defaults(c);
            }
        }
    }
    let qos = qos_class(&obj["spec"]);
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    if obj.pointer("/status/phase").is_none() {
        obj["status"]["phase"] = json!("Pending");
    }
    if obj.pointer("/status/qosClass").is_none() {
        obj["status"]["qosClass"] = json!(qos);
    }
    // The status strategy derives `podIPs` from a `podIP` written alone.
    if let Some(ip) = obj.pointer("/status/podIP").and_then(Value::as_str) {
        if obj.pointer("/status/podIPs").is_none() && !ip.is_empty() {
            obj["status"]["podIPs"] = json!([{"ip": ip}]);
        }
    }
}

/// The pod's QoS class, as `GetPodQOS` computes it from CPU and memory requests and limits.
fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_array))
        .flatten()
        .collect();
    let amount = |c: &Value, kind: &str, res: &str| -> Option<String> {
        c.pointer(&format!("/resources/{kind}/{res}"))
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        for res in ["cpu", "memory"] {
            let request = amount(c, "requests", res);
            let limit = amount(c, "limits", res);
            any |= request.is_some() || limit.is_some();
            // A request left out defaults to the limit.
            if limit.is_none() || request.is_some_and(|r| Some(r) != limit) {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}
