//! The Kubernetes writes of scale-down, as cluster-autoscaler makes them: taint a node with this
//! controller's own `NoSchedule` taint and cordon it, drain it through the Eviction API (which
//! honours PodDisruptionBudgets: 429 when a budget has no disruption left), and untaint it when
//! the removal is abandoned or, at startup, left over from a previous run
//! (cluster-autoscaler #5048).
//!
//! Every node write is a JSON merge patch carrying `metadata.resourceVersion`, the Kubernetes twin
//! of If-Match: a node changed since it was read is a 409 Conflict, never overwritten. A merge
//! patch replaces `spec.taints` as a whole, so the list sent is always the one read plus or minus
//! our taint, and the version makes sure nobody else's taint was added in between. Untainting
//! re-reads and retries on a 409 (a bounded number of times): a lost untaint would leave a node
//! unschedulable for good.
//!
//! The loop codes against [`NodeActions`]; [`KubeNodeActions`] implements it on the API server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::kube::reflect::UNFINISHED_PODS;
use crate::pods::record::{NodeRecord, PodRecord};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{json, Value};
use tracing::{debug, info, warn};

/// The taint this controller puts on a node it is removing (cluster-autoscaler uses
/// `ToBeDeletedByClusterAutoscaler`; ours is our own so the two never clear each other's).
pub const TO_BE_DELETED_TAINT: &str = "vmss-capacity-controller/to-be-deleted";

/// The soft taint (`PreferNoSchedule`) this controller puts on nodes scale-down would remove,
/// so kube-scheduler places new pods elsewhere first (cluster-autoscaler's
/// `DeletionCandidateOfClusterAutoscaler`; ours is our own, as [`TO_BE_DELETED_TAINT`] is).
pub const DELETION_CANDIDATE_TAINT: &str = "vmss-capacity-controller/deletion-candidate";

/// Set by [`NodeActions::taint`] on a node somebody else had already cordoned: the untaint then
/// leaves `spec.unschedulable` as that operator set it (and removes only this annotation).
pub const WAS_CORDONED_ANNOTATION: &str = "vmss-capacity-controller/was-unschedulable";

/// How many times [`NodeActions::untaint`] re-reads and retries after a 409 Conflict.
pub const UNTAINT_ATTEMPTS: u32 = 5;

/// The pause between two untaint attempts (client-go's `retry.DefaultRetry` step).
const UNTAINT_RETRY_DELAY: Duration = Duration::from_millis(10);

/// Page size of the node LIST in [`NodeActions::tainted_nodes`].
const LIST_PAGE: u32 = 500;

/// Why a node write failed. Each variant carries the node's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeWriteError {
    /// 409 Conflict: the node changed since its `resourceVersion` was read (for an untaint:
    /// still so after [`UNTAINT_ATTEMPTS`] re-reads).
    #[error("409 Conflict: node {0} changed since it was read")]
    Conflict(String),
    /// 404: the node does not exist (any more).
    #[error("404 NotFound: node {0} does not exist")]
    NotFound(String),
    /// Anything else (the API server down, 403, a timeout, a refused blind write); the message
    /// names the node.
    #[error("{0}")]
    Other(String),
}

impl NodeWriteError {
    /// A 409 Conflict: re-read the node and decide again.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }

    /// A 404: the node is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// A label for metrics (`conflict`, `not_found`, `other`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Conflict(_) => "conflict",
            Self::NotFound(_) => "not_found",
            Self::Other(_) => "other",
        }
    }
}

/// How an eviction went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// 201: the pod is being deleted (with its grace period).
    Evicted,
    /// 429: a PodDisruptionBudget has no disruption left; the message names the budget.
    Blocked(String),
    /// 404, or 409 on the uid precondition: the pod is already gone (or is another pod now,
    /// recreated under the same name).
    Gone,
    /// Anything else (500 for a pod under two budgets, 403, the API server down); the message
    /// names the pod.
    Failed(String),
}

/// How a pod's annotation write went ([`NodeActions::annotate_pod`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnnotateOutcome {
    /// Written.
    Written,
    /// 409: the pod changed since it was read; nothing written (looked at again from a fresh
    /// read).
    Conflict,
    /// 404: the pod is gone.
    Gone,
    /// Anything else; the message names the pod.
    Failed(String),
}

impl AnnotateOutcome {
    /// A label for metrics (`ok`, `conflict`, `gone`, `error`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Written => "ok",
            Self::Conflict => "conflict",
            Self::Gone => "gone",
            Self::Failed(_) => "error",
        }
    }
}

/// What the API server says of a node right now (never a cache): the last look before its
/// instance is deleted.
#[derive(Debug, Clone, Default)]
pub struct FreshNode {
    /// The node; `None` when it does not exist (404).
    pub node: Option<NodeRecord>,
    /// The pods bound to it (`spec.nodeName`) that have not finished.
    pub pods: Vec<PodRecord>,
}

/// The Kubernetes calls of scale-down. Implemented on the API server by [`KubeNodeActions`];
/// the scale-down loop's tests implement it in memory.
#[async_trait::async_trait]
pub trait NodeActions: Send + Sync {
    /// Adds our taint (`NoSchedule`, value = unix seconds now, as cluster-autoscaler does) and
    /// sets `spec.unschedulable`, by a merge patch carrying `metadata.resourceVersion` =
    /// `resource_version`, so a node changed since it was read is a
    /// [`NodeWriteError::Conflict`], never overwritten. Idempotent: a node already carrying our
    /// taint and cordoned is not written again.
    async fn taint(&self, node: &str, resource_version: &str) -> Result<(), NodeWriteError>;
    /// Removes our taint, and uncordons the node when our taint was there and the node was not
    /// cordoned before we tainted it ([`WAS_CORDONED_ANNOTATION`]); a node without our taint is
    /// not written. Reads the node for its `resourceVersion`; on a 409 re-reads and retries,
    /// [`UNTAINT_ATTEMPTS`] times in all: an untaint must not be lost.
    async fn untaint(&self, node: &str) -> Result<(), NodeWriteError>;
    /// Adds (`on`) or removes our soft taint [`DELETION_CANDIDATE_TAINT`] (`PreferNoSchedule`,
    /// value = unix seconds now): reads the node and patches its taints with the read's
    /// `resourceVersion`, reading again after a 409, [`UNTAINT_ATTEMPTS`] times in all. Returns
    /// whether it wrote: a node already so, or (adding) one being removed, is not written.
    async fn soft_taint(&self, node: &str, on: bool) -> Result<bool, NodeWriteError>;
    /// A `policy/v1` Eviction of one pod, with the pod's `uid` (when given) as a precondition
    /// in its `deleteOptions`, so a pod recreated under the same name is not evicted instead.
    async fn evict(&self, namespace: &str, pod: &str, uid: Option<&str>) -> EvictOutcome;
    /// The names of the nodes carrying our taint, sorted (for the startup cleanup).
    async fn tainted_nodes(&self) -> Result<Vec<String>, NodeWriteError>;
    /// A GET of `node` and a LIST of the unfinished pods with `spec.nodeName` = `node`, from the
    /// API server: what a delete checks last, whatever the reflectors show.
    async fn fresh(&self, node: &str) -> Result<FreshNode, NodeWriteError>;
    /// A LIST of every node from the API server (paged): whether an instance that seems never to
    /// have registered really has no Node.
    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, NodeWriteError>;
    /// Sets (`Some`) or removes (`None`) annotations of a pod by a merge patch carrying
    /// `metadata.resourceVersion` = `resource_version`: a pod changed since it was read is an
    /// [`AnnotateOutcome::Conflict`], never overwritten (the deletion-cost hints).
    async fn annotate_pod(
        &self,
        namespace: &str,
        pod: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> AnnotateOutcome;
}

/// `node`'s taint keyed `key`, if it carries one (with any effect).
fn taint_keyed<'a>(node: &'a Node, key: &str) -> Option<&'a Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| ts.iter().find(|t| t.key == key))
}

/// Whether `node` carries [`TO_BE_DELETED_TAINT`] (with any effect).
pub fn has_our_taint(node: &Node) -> bool {
    taint_keyed(node, TO_BE_DELETED_TAINT).is_some()
}

/// Whether `node` carries [`DELETION_CANDIDATE_TAINT`].
fn has_soft_taint(node: &Node) -> bool {
    taint_keyed(node, DELETION_CANDIDATE_TAINT).is_some()
}

/// The node record's [`DELETION_CANDIDATE_TAINT`], if it carries one (its value: the unix
/// second it went on).
pub fn soft_taint_record(node: &NodeRecord) -> Option<&Taint> {
    node.taints
        .iter()
        .find(|t| t.key == DELETION_CANDIDATE_TAINT)
}

/// Whether the node record carries [`DELETION_CANDIDATE_TAINT`].
pub fn has_soft_taint_record(node: &NodeRecord) -> bool {
    soft_taint_record(node).is_some()
}

/// Whether the node record carries [`TO_BE_DELETED_TAINT`] (with any effect).
pub fn has_our_taint_record(node: &NodeRecord) -> bool {
    node.taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// Untaints every node carrying our taint (cluster-autoscaler #5048: a restart must not leave
/// nodes cordoned by a removal nobody is finishing). Returns how many were untainted. A node
/// that disappeared meanwhile is skipped; every node is tried before the first other failure is
/// returned.
pub async fn remove_leftover_taints(actions: &dyn NodeActions) -> Result<usize, NodeWriteError> {
    let names = actions.tainted_nodes().await?;
    let mut cleared = 0;
    let mut first_error = None;
    for name in &names {
        match actions.untaint(name).await {
            Ok(()) => {
                cleared += 1;
                info!(node = %name, "removed a leftover to-be-deleted taint");
            }
            Err(NodeWriteError::NotFound(_)) => {
                debug!(node = %name, "a leftover tainted node is gone");
            }
            Err(e) => {
                warn!(node = %name, error = %e, "could not remove a leftover to-be-deleted taint");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(cleared),
    }
}

/// [`NodeActions`] through the API server (kube-rs).
pub struct KubeNodeActions {
    client: kube::Client,
    nodes: Api<Node>,
    /// Set once a server refused a `policy/v1` Eviction (Kubernetes before 1.22): later
    /// evictions go straight to `policy/v1beta1`.
    eviction_v1beta1: AtomicBool,
}

impl std::fmt::Debug for KubeNodeActions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNodeActions")
            .field(
                "eviction_v1beta1",
                &self.eviction_v1beta1.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

fn classify(node: &str, e: kube::Error) -> NodeWriteError {
    match &e {
        kube::Error::Api(s) if s.code == 409 => NodeWriteError::Conflict(node.to_string()),
        kube::Error::Api(s) if s.code == 404 => NodeWriteError::NotFound(node.to_string()),
        _ => NodeWriteError::Other(format!("node {node}: {e}")),
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// The taints as a merge patch sets them: `null` for none (an empty list is not stored anyway).
fn taints_value(taints: &[Taint]) -> Result<Value, serde_json::Error> {
    if taints.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::to_value(taints)
    }
}

impl KubeNodeActions {
    /// Node writes and evictions through `client`, which should be built with
    /// `default_retry = false` as the controller's is: kube-rs' default retry repeats a 429 up to
    /// 15 times with exponential backoff, which would hold an eviction refused by a
    /// PodDisruptionBudget for minutes (measured: 250 s) instead of answering
    /// [`EvictOutcome::Blocked`].
    pub fn new(client: kube::Client) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            client,
            eviction_v1beta1: AtomicBool::new(false),
        }
    }

    async fn read(&self, node: &str) -> Result<Node, NodeWriteError> {
        self.nodes
            .get_opt(node)
            .await
            .map_err(|e| classify(node, e))?
            .ok_or_else(|| NodeWriteError::NotFound(node.to_string()))
    }

    async fn merge_patch(&self, node: &str, patch: &Value) -> Result<(), NodeWriteError> {
        self.nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| classify(node, e))
    }

    /// Reads `node` and, when `change` asks for a write (a merge patch's body), sends it with
    /// the read's `resourceVersion`: a node changed meanwhile is a 409, after which it reads
    /// again and asks `change` again, [`UNTAINT_ATTEMPTS`] times in all (client-go's
    /// `RetryOnConflict`, as cluster-autoscaler updates taints). Never a blind write. Returns
    /// whether it wrote.
    async fn read_modify_write(
        &self,
        node: &str,
        change: impl Fn(&Node) -> Result<Option<Value>, serde_json::Error>,
    ) -> Result<bool, NodeWriteError> {
        for attempt in 1..=UNTAINT_ATTEMPTS {
            let current = self.read(node).await?;
            let Some(mut patch) = change(&current).map_err(|e| {
                NodeWriteError::Other(format!("serialising node {node}'s taints: {e}"))
            })?
            else {
                return Ok(false);
            };
            let Some(rv) = current
                .metadata
                .resource_version
                .clone()
                .filter(|v| !v.is_empty())
            else {
                return Err(NodeWriteError::Other(format!(
                    "node {node} was read without a resourceVersion; refusing a blind write"
                )));
            };
            patch["metadata"]["resourceVersion"] = json!(rv);
            match self.merge_patch(node, &patch).await {
                Ok(()) => return Ok(true),
                Err(NodeWriteError::Conflict(_)) if attempt < UNTAINT_ATTEMPTS => {
                    debug!(node, attempt, "409 writing the node: reading it again");
                    tokio::time::sleep(UNTAINT_RETRY_DELAY).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(NodeWriteError::Conflict(node.to_string()))
    }

    async fn post_eviction(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        api_version: &str,
    ) -> Result<(), kube::Error> {
        let mut body = json!({
            "apiVersion": api_version,
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        });
        if let Some(uid) = uid {
            // camelCase, as the API reads it: kube-rs' own `evict` sends `delete_options`, which
            // the server ignores, and with it the precondition.
            body["deleteOptions"] = json!({"preconditions": {"uid": uid}});
        }
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .map_err(kube::Error::HttpError)?;
        self.client.request_text(request).await.map(|_| ())
    }
}

/// A 400 saying the server has no `policy/v1` Eviction (Kubernetes 1.20 and 1.21 answer `no kind
/// "Eviction" is registered for version "policy/v1"`).
fn lacks_policy_v1(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 400 && s.message.contains("\"policy/v1\""))
}

/// The refusal's message and its causes (the budget's name is in a cause).
fn status_text(s: &kube::core::Status) -> String {
    let mut text = s.message.clone();
    if let Some(details) = &s.details {
        for cause in &details.causes {
            if !cause.message.is_empty() {
                text.push_str(": ");
                text.push_str(&cause.message);
            }
        }
    }
    text
}

#[async_trait::async_trait]
impl NodeActions for KubeNodeActions {
    async fn taint(&self, node: &str, resource_version: &str) -> Result<(), NodeWriteError> {
        if resource_version.is_empty() {
            // Never a blind write: without a version the server would apply it unconditionally.
            return Err(NodeWriteError::Other(format!(
                "refusing to taint node {node} without a resourceVersion"
            )));
        }
        let current = self.read(node).await?;
        let cordoned = current
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if has_our_taint(&current) && cordoned {
            debug!(node, "already tainted and cordoned");
            return Ok(());
        }
        let mut taints = taints_of(&current);
        if !taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT) {
            taints.push(Taint {
                key: TO_BE_DELETED_TAINT.to_string(),
                value: Some(now_unix().to_string()),
                effect: "NoSchedule".to_string(),
                time_added: None,
            });
        }
        let taints = taints_value(&taints)
            .map_err(|e| NodeWriteError::Other(format!("serialising node {node}'s taints: {e}")))?;
        // The list comes from this read but the version from the caller's: if the two differ
        // the server answers 409 and nothing is written.
        let mut patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "spec": {"taints": taints, "unschedulable": true},
        });
        if cordoned && !has_our_taint(&current) {
            // Somebody cordoned it before us: the untaint must leave it cordoned.
            patch["metadata"]["annotations"] = json!({WAS_CORDONED_ANNOTATION: "true"});
        }
        self.merge_patch(node, &patch).await?;
        info!(
            node,
            taint = TO_BE_DELETED_TAINT,
            "node tainted and cordoned"
        );
        Ok(())
    }

    async fn untaint(&self, node: &str) -> Result<(), NodeWriteError> {
        let wrote = self
            .read_modify_write(node, |current| {
                if !has_our_taint(current) {
                    return Ok(None);
                }
                let kept: Vec<Taint> = taints_of(current)
                    .into_iter()
                    .filter(|t| t.key != TO_BE_DELETED_TAINT)
                    .collect();
                let taints = taints_value(&kept)?;
                let cordoned_before = current
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(WAS_CORDONED_ANNOTATION));
                Ok(Some(if cordoned_before {
                    json!({
                        "metadata": {"annotations": {WAS_CORDONED_ANNOTATION: null}},
                        "spec": {"taints": taints},
                    })
                } else {
                    json!({"spec": {"taints": taints, "unschedulable": null}})
                }))
            })
            .await?;
        if wrote {
            info!(node, "node untainted and uncordoned");
        }
        Ok(())
    }

    async fn soft_taint(&self, node: &str, on: bool) -> Result<bool, NodeWriteError> {
        self.read_modify_write(node, |current| {
            let has = has_soft_taint(current);
            if has == on || (on && has_our_taint(current)) {
                return Ok(None);
            }
            let mut taints: Vec<Taint> = taints_of(current)
                .into_iter()
                .filter(|t| t.key != DELETION_CANDIDATE_TAINT)
                .collect();
            if on {
                taints.push(Taint {
                    key: DELETION_CANDIDATE_TAINT.to_string(),
                    value: Some(now_unix().to_string()),
                    effect: "PreferNoSchedule".to_string(),
                    time_added: None,
                });
            }
            Ok(Some(json!({"spec": {"taints": taints_value(&taints)?}})))
        })
        .await
    }

    async fn evict(&self, namespace: &str, pod: &str, uid: Option<&str>) -> EvictOutcome {
        let mut api_version = if self.eviction_v1beta1.load(Ordering::Relaxed) {
            "policy/v1beta1"
        } else {
            "policy/v1"
        };
        let mut result = self.post_eviction(namespace, pod, uid, api_version).await;
        if api_version == "policy/v1" && result.as_ref().is_err_and(lacks_policy_v1) {
            info!("the API server has no policy/v1 Eviction: using policy/v1beta1");
            self.eviction_v1beta1.store(true, Ordering::Relaxed);
            api_version = "policy/v1beta1";
            result = self.post_eviction(namespace, pod, uid, api_version).await;
        }
        match result {
            Ok(()) => {
                debug!(namespace, pod, api_version, "pod evicted");
                EvictOutcome::Evicted
            }
            Err(kube::Error::Api(s)) if s.code == 429 => EvictOutcome::Blocked(status_text(&s)),
            Err(kube::Error::Api(s)) if s.code == 404 => EvictOutcome::Gone,
            // Only the uid precondition makes an eviction 409: the pod of that name is another.
            Err(kube::Error::Api(s)) if s.code == 409 && uid.is_some() => EvictOutcome::Gone,
            Err(kube::Error::Api(s)) => EvictOutcome::Failed(format!(
                "evicting pod {namespace}/{pod}: {} {}: {}",
                s.code,
                s.reason,
                status_text(&s)
            )),
            Err(e) => EvictOutcome::Failed(format!("evicting pod {namespace}/{pod}: {e}")),
        }
    }

    async fn tainted_nodes(&self) -> Result<Vec<String>, NodeWriteError> {
        let mut names = Vec::new();
        let mut params = ListParams::default().limit(LIST_PAGE);
        loop {
            let page = self
                .nodes
                .list(&params)
                .await
                .map_err(|e| NodeWriteError::Other(format!("listing nodes: {e}")))?;
            names.extend(
                page.items
                    .iter()
                    .filter(|n| has_our_taint(n))
                    .filter_map(|n| n.metadata.name.clone()),
            );
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        names.sort();
        Ok(names)
    }

    async fn fresh(&self, node: &str) -> Result<FreshNode, NodeWriteError> {
        let found = match self.read(node).await {
            Ok(n) => Some(NodeRecord::of(n)),
            Err(NodeWriteError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default()
            .fields(&format!("spec.nodeName={node},{UNFINISHED_PODS}"))
            .limit(LIST_PAGE);
        let mut out = Vec::new();
        loop {
            let page = pods.list(&params).await.map_err(|e| {
                NodeWriteError::Other(format!("listing the pods on node {node}: {e}"))
            })?;
            out.extend(page.items.into_iter().map(PodRecord::of));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(FreshNode {
            node: found,
            pods: out,
        })
    }

    async fn annotate_pod(
        &self,
        namespace: &str,
        pod: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> AnnotateOutcome {
        if resource_version.is_empty() {
            return AnnotateOutcome::Failed(format!(
                "refusing to annotate pod {namespace}/{pod} without a resourceVersion"
            ));
        }
        let patch = json!({
            "metadata": {"resourceVersion": resource_version, "annotations": annotations},
        });
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match pods
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => AnnotateOutcome::Written,
            Err(kube::Error::Api(s)) if s.code == 409 => AnnotateOutcome::Conflict,
            Err(kube::Error::Api(s)) if s.code == 404 => AnnotateOutcome::Gone,
            Err(e) => AnnotateOutcome::Failed(format!("annotating pod {namespace}/{pod}: {e}")),
        }
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRecord>, NodeWriteError> {
        let mut out = Vec::new();
        let mut params = ListParams::default().limit(LIST_PAGE);
        loop {
            let page = self
                .nodes
                .list(&params)
                .await
                .map_err(|e| NodeWriteError::Other(format!("listing nodes: {e}")))?;
            out.extend(page.items.into_iter().map(NodeRecord::of));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node_with(taints: &[&str]) -> Node {
        Node {
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn only_our_taint_key_counts_as_ours() {
        assert!(has_our_taint(&node_with(&["a", TO_BE_DELETED_TAINT])));
        assert!(!has_our_taint(&node_with(&[
            "ToBeDeletedByClusterAutoscaler"
        ])));
        assert!(!has_our_taint(&Node::default()));
    }

    #[test]
    fn errors_name_the_node() {
        assert!(NodeWriteError::Conflict("aks-1".into())
            .to_string()
            .contains("aks-1"));
        assert!(NodeWriteError::NotFound("aks-2".into())
            .to_string()
            .contains("aks-2"));
        assert_eq!(
            NodeWriteError::Conflict("n".into()).metric_label(),
            "conflict"
        );
    }

    #[test]
    fn only_a_400_naming_policy_v1_means_the_server_lacks_policy_v1_eviction() {
        // kube-apiserver 1.20.2's answer to a policy/v1 Eviction, verbatim.
        let old_server = kube::core::Status::failure(
            "Eviction in version \"v1\" cannot be handled as a Eviction: no kind \"Eviction\" is registered for version \"policy/v1\" in scheme \"k8s.io/kubernetes/pkg/api/legacyscheme/scheme.go:30\"",
            "BadRequest",
        )
        .with_code(400);
        assert!(lacks_policy_v1(&kube::Error::Api(old_server.boxed())));
        let other =
            kube::core::Status::failure("name in URL does not match", "BadRequest").with_code(400);
        assert!(!lacks_policy_v1(&kube::Error::Api(other.boxed())));
        let missing =
            kube::core::Status::failure("pods \"p\" not found", "NotFound").with_code(404);
        assert!(!lacks_policy_v1(&kube::Error::Api(missing.boxed())));
    }

    #[test]
    fn no_taints_left_is_sent_as_null() {
        assert_eq!(taints_value(&[]).ok(), Some(Value::Null));
    }
}
