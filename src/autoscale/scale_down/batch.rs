//! Batch delete: the removals of a pass grouped into delete requests ([`Batches`]: the empty
//! nodes of one scale set in one request, at most `maxEmptyBulkDelete`; a node with pods alone;
//! a consolidation's nodes of one scale set together), each request sent through the guarded
//! delete ([`Reconciler::delete_each`](crate::reconciler::Reconciler::delete_each): fresh read,
//! floor, still listed, `If-Match`, the fence) after a last look at each node ([`NodeLook`]),
//! and what each node comes to once the request has its outcome ([`ending`],
//! [`outcome_after_failed`]).

use super::{pod_name, Removal, Shared, Unknown};
use crate::config::NodeGroupSpec;
use crate::kube::nodes::has_our_taint_record;
use crate::notify::{ControllerEvent, ObjectRef};
use crate::pods::unneeded::{self, Settle};
use crate::reconciler::{BulkEnd, DeleteEnd, DeleteKind, LastLook};
use crate::resource::Victim;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A pass's removals grouped into delete requests, each with what it carries along (`S`: the
/// removals' slots in the loop's flight), in the order they were added.
#[derive(Debug)]
pub(super) struct Batches<S> {
    batches: Vec<(Vec<Removal>, Vec<S>)>,
    /// The open batch of each key ([`Batches::key`]).
    open: HashMap<String, usize>,
    /// `maxEmptyBulkDelete`: empty nodes per request at most.
    max_empty: usize,
}

impl<S> Batches<S> {
    /// No batch yet; empty nodes at most `max_empty_bulk_delete` per request (at least one).
    pub(super) fn new(max_empty_bulk_delete: u32) -> Self {
        Self {
            batches: Vec::new(),
            open: HashMap::new(),
            max_empty: usize::try_from(max_empty_bulk_delete.max(1)).unwrap_or(usize::MAX),
        }
    }

    /// Which removals share a request: a consolidation's nodes of one scale set (drained in
    /// turn, deleted together), the empty nodes of one scale set; a node with pods (drained
    /// first) shares with none.
    fn key(r: &Removal) -> Option<String> {
        if r.consolidation {
            Some(format!("consolidation/{}", r.group.name))
        } else if r.pods.is_empty() {
            Some(r.group.name.clone())
        } else {
            None
        }
    }

    /// Adds `removal` to its request: the open one of its key, or a new one (a node with pods,
    /// or its key's request holding `maxEmptyBulkDelete` empty nodes already).
    pub(super) fn add(&mut self, removal: Removal, carried: S) {
        let key = Self::key(&removal);
        let full =
            |b: &(Vec<Removal>, Vec<S>)| !removal.consolidation && b.0.len() >= self.max_empty;
        let at = match key.as_ref().and_then(|k| self.open.get(k)) {
            Some(&at) if !full(&self.batches[at]) => at,
            _ => {
                self.batches.push((Vec::new(), Vec::new()));
                let at = self.batches.len() - 1;
                if let Some(k) = key {
                    self.open.insert(k, at);
                }
                at
            }
        };
        self.batches[at].0.push(removal);
        self.batches[at].1.push(carried);
    }

    /// Whether nothing was added.
    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The requests, in the order they were opened.
    pub(super) fn into_batches(self) -> Vec<(Vec<Removal>, Vec<S>)> {
        self.batches
    }
}

/// What one node's removal comes to, once its delete request has its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// The instance was deleted: counted, the node is gone.
    Removed,
    /// No delete happened: the node is untainted and stays; `label` for
    /// `failed_scale_downs_total`, `why` for its `ScaleDownFailed` Event.
    Stopped { label: &'static str, why: String },
    /// The VM may be going away: the node stays tainted, cordoned and busy until a fresh list
    /// says whether the delete happened.
    Unknown(String),
}

/// [`Ending`] of a delete request's outcome.
pub(super) fn ending(end: &DeleteEnd) -> Ending {
    match end {
        DeleteEnd::Deleted => Ending::Removed,
        DeleteEnd::Refused(why) => Ending::Stopped {
            label: "refused",
            why: format!("the instance was not deleted: {why}"),
        },
        DeleteEnd::Stopped(why) => Ending::Stopped {
            label: "aborted",
            why: format!("stopped right before the delete: {why}"),
        },
        DeleteEnd::Failed(why) => Ending::Stopped {
            label: "delete_failed",
            why: format!("deleting the instance failed: {why}"),
        },
        DeleteEnd::Unknown(why) => Ending::Unknown(why.clone()),
    }
}

/// Whether a request was sent (or its outcome is not known): else a budget probe granted for
/// it is given back.
pub(super) fn sent(end: &DeleteEnd) -> bool {
    matches!(
        end,
        DeleteEnd::Deleted | DeleteEnd::Failed(_) | DeleteEnd::Unknown(_)
    )
}

/// After a delete whose operation failed (`why`), what one node comes to by its VM's
/// provisioning state in a fresh list ([`unneeded::settle`]): gone, deleted; still there and
/// `Succeeded`, the delete failed for it (untainted, it stays); anything else, unknown.
pub(super) fn outcome_after_failed(state: Option<&str>, why: &str) -> DeleteEnd {
    match unneeded::settle(state, Duration::ZERO, Duration::MAX) {
        Settle::Gone => DeleteEnd::Deleted,
        Settle::Healthy => DeleteEnd::Failed(why.to_string()),
        Settle::DeleteAgain | Settle::Wait => DeleteEnd::Unknown(format!(
            "the delete failed ({why}) and the VM is listed {}",
            state.unwrap_or_default()
        )),
    }
}

impl Shared {
    /// [`Shared::remove`]: taint, wait, re-check and drain ([`Shared::taint_and_drain`]), then
    /// one guarded delete for the nodes left; whether a delete request was sent (or its outcome
    /// is not known).
    pub(super) async fn remove_nodes(
        self: &Arc<Self>,
        removals: Vec<Removal>,
        shutdown: &CancellationToken,
    ) -> bool {
        if !self.reconciler.may_write() {
            return false;
        }
        match self.taint_and_drain(removals, shutdown).await {
            Some(ready) => self.delete_batch(ready).await,
            None => false,
        }
    }

    /// One guarded delete whose last look looks at each node of `ready`: one that fails it is
    /// dropped (untainted) and the rest go; then each node's ending.
    async fn delete_batch(self: &Arc<Self>, ready: Vec<(Removal, ObjectRef)>) -> bool {
        let Some(group) = ready.first().map(|(r, _)| r.group.clone()) else {
            return false;
        };
        let look = NodeLook {
            shared: self.clone(),
            nodes: ready.iter().map(|(r, _)| r.node.clone()).collect(),
        };
        let victims: Vec<Victim> = ready.iter().map(|(r, _)| r.victim.clone()).collect();
        let BulkEnd {
            end,
            dropped,
            operation_failed,
        } = self
            .reconciler
            .delete_each(&group, victims, DeleteKind::Unneeded, &look)
            .await;
        let mut went = Vec::with_capacity(ready.len());
        for (r, nref) in ready {
            match dropped.iter().find(|(id, _)| *id == r.victim.instance_id) {
                Some((_, why)) => {
                    let text = format!("stopped right before the delete: {why}");
                    self.abort(&r, &nref, "aborted", &text).await
                }
                None => went.push((r, nref)),
            }
        }
        if operation_failed {
            // Azure accepted the request and its operation failed: some instances may be gone.
            // A fresh list decides node by node.
            self.after_failed_operation(&group, went, &end).await;
        } else {
            for (r, nref) in went {
                self.finish(r, nref, &end).await;
            }
        }
        sent(&end)
    }

    /// After a delete whose operation failed: one fresh list of the group decides each node
    /// ([`outcome_after_failed`]); anything but gone or `Succeeded` (`Failed`, `Deleting`), the
    /// node stays tainted and is settled pass by pass as a delete of unknown outcome. A list
    /// that fails parks them all so.
    async fn after_failed_operation(
        self: &Arc<Self>,
        group: &NodeGroupSpec,
        went: Vec<(Removal, ObjectRef)>,
        end: &DeleteEnd,
    ) {
        let list = match self.groups.fresh_instances(group).await {
            Ok(list) => Some(list),
            Err(e) => {
                warn!(scale_set = %group.name, error = %e, "the instances could not be listed after a failed delete: its nodes stay tainted until a fresh list decides");
                None
            }
        };
        let why = match end {
            DeleteEnd::Failed(why) => why.clone(),
            other => format!("{other:?}"),
        };
        for (r, nref) in went {
            let Some(list) = &list else {
                self.finish(r, nref, &DeleteEnd::Unknown(why.clone())).await;
                continue;
            };
            let state = list
                .iter()
                .find(|i| i.instance_id == r.victim.instance_id)
                .map(|i| i.provisioning_state.clone().unwrap_or_default());
            let outcome = outcome_after_failed(state.as_deref(), &why);
            self.finish(r, nref, &outcome).await;
        }
    }

    /// What one node's removal comes to, once its delete request has its outcome ([`ending`]).
    async fn finish(self: &Arc<Self>, r: Removal, nref: ObjectRef, end: &DeleteEnd) {
        match ending(end) {
            Ending::Removed => {
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[&r.group.name, r.reason()])
                    .inc();
                info!(node = %r.node, scale_set = %r.group.name, instance = %r.victim.instance_id, "node removed: its instance was deleted");
                self.events.record(ControllerEvent::ScaleDown {
                    object: nref,
                    note: format!(
                        "node removed by scale-down: instance {} of {} deleted",
                        r.victim.instance_id, r.group.name
                    ),
                });
            }
            Ending::Stopped { label, why } => self.abort(&r, &nref, label, &why).await,
            Ending::Unknown(why) => {
                warn!(node = %r.node, scale_set = %r.group.name, %why, "the delete's outcome is unknown: the node stays tainted until a fresh instance list decides");
                self.count_failed(&r, "unknown");
                self.park(
                    r.node.clone(),
                    Unknown {
                        group: r.group.clone(),
                        victim: r.victim.clone(),
                        tainted: true,
                        reason: r.reason(),
                        since: Instant::now(),
                    },
                );
            }
        }
    }
}

/// The last look before an unneeded node's instance is deleted: the cluster view is healthy, and
/// the API server itself (not the reflectors) shows the node still carrying our taint and no pod
/// on it but DaemonSet and mirror pods.
pub(super) struct NodeLook {
    pub(super) shared: Arc<Shared>,
    /// Every node the delete request removes ([`LastLook::check`] stops the request when one
    /// fails its look; [`LastLook::check_each`] drops only that one).
    pub(super) nodes: Vec<String>,
}

impl NodeLook {
    async fn check_one(&self, name: &str) -> Result<(), String> {
        let fresh = self
            .shared
            .actions
            .fresh(name)
            .await
            .map_err(|e| format!("the node could not be read fresh: {e}"))?;
        let Some(node) = fresh.node else {
            return Err("the node is gone".into());
        };
        if !has_our_taint_record(&node) {
            return Err("our taint is no longer on the node (somebody removed it)".into());
        }
        // A pod deleted long ago that no kubelet confirms does not hold the node (see
        // `PodRecord::long_terminating`).
        let now = self.shared.wall();
        if let Some(p) = fresh
            .pods
            .iter()
            .find(|p| !p.is_daemonset_pod() && !p.is_mirror() && !p.long_terminating(now))
        {
            return Err(format!("pod {} is on the node", pod_name(p)));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl LastLook for NodeLook {
    /// Node by node: the victims are this look's nodes, in order.
    async fn check_each(&self, victims: &[Victim]) -> Vec<Result<(), String>> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return victims.iter().map(|_| Err(f.to_string())).collect();
        }
        let mut looks = Vec::with_capacity(victims.len());
        for v in victims {
            looks.push(self.check_one(&v.node_name).await);
        }
        looks
    }

    async fn check(&self) -> Result<(), String> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return Err(f.to_string());
        }
        for name in &self.nodes {
            self.check_one(name)
                .await
                .map_err(|why| match self.nodes.len() {
                    1 => why,
                    _ => format!("{name}: {why}"),
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::DeleteRefusal;

    fn shape(b: Batches<()>) -> Vec<Vec<String>> {
        b.into_batches()
            .into_iter()
            .map(|(rs, _)| rs.into_iter().map(|r| r.node).collect())
            .collect()
    }

    #[test]
    fn a_batch_delete_groups_empty_nodes_by_scale_set_and_honours_max_empty_bulk_delete() {
        let mut b = Batches::new(2);
        for (node, group) in [
            ("a1", "a"),
            ("b1", "b"),
            ("a2", "a"),
            ("a3", "a"),
            ("b2", "b"),
        ] {
            b.add(Removal::of(node, node, group, &[]), ());
        }
        assert_eq!(
            shape(b),
            vec![vec!["a1", "a2"], vec!["b1", "b2"], vec!["a3"]],
            "one request per scale set, never more than maxEmptyBulkDelete nodes in one"
        );
    }

    #[test]
    fn a_node_with_pods_goes_alone_and_a_consolidations_nodes_of_one_scale_set_go_together() {
        let mut b = Batches::new(1);
        b.add(Removal::of("p1", "1", "a", &["uid-x"]), ());
        b.add(Removal::of("p2", "2", "a", &["uid-y"]), ());
        b.add(Removal::of("e1", "3", "a", &[]), ());
        for node in ["c1", "c2", "c3"] {
            let mut r = Removal::of(node, node, "a", &["uid-z"]);
            r.consolidation = true;
            b.add(r, ());
        }
        assert_eq!(
            shape(b),
            vec![vec!["p1"], vec!["p2"], vec!["e1"], vec!["c1", "c2", "c3"]]
        );
    }

    #[test]
    fn a_delete_that_did_not_happen_untaints_the_node_and_one_of_unknown_outcome_keeps_it() {
        assert_eq!(ending(&DeleteEnd::Deleted), Ending::Removed);
        let stopped = |end: DeleteEnd| match ending(&end) {
            Ending::Stopped { label, .. } => label,
            other => panic!("{end:?} ended {other:?}"),
        };
        assert_eq!(
            stopped(DeleteEnd::Refused(DeleteRefusal::BelowFloor)),
            "refused"
        );
        assert_eq!(stopped(DeleteEnd::Stopped("pod on it".into())), "aborted");
        assert_eq!(stopped(DeleteEnd::Failed("500".into())), "delete_failed");
        assert_eq!(
            ending(&DeleteEnd::Unknown("lost".into())),
            Ending::Unknown("lost".into())
        );
        // Only a request that reached Azure (or may have) keeps its budget probe.
        assert!(sent(&DeleteEnd::Deleted) && sent(&DeleteEnd::Failed(String::new())));
        assert!(sent(&DeleteEnd::Unknown(String::new())));
        assert!(!sent(&DeleteEnd::Refused(DeleteRefusal::InstanceGone)));
        assert!(!sent(&DeleteEnd::Stopped(String::new())));
    }

    #[test]
    fn after_a_failed_operation_each_node_is_judged_by_its_vm_in_a_fresh_list() {
        assert_eq!(outcome_after_failed(None, "x"), DeleteEnd::Deleted);
        assert_eq!(
            outcome_after_failed(Some("Succeeded"), "x"),
            DeleteEnd::Failed("x".into())
        );
        for state in ["Failed", "Deleting"] {
            assert_eq!(
                outcome_after_failed(Some(state), "x"),
                DeleteEnd::Unknown(format!(
                    "the delete failed (x) and the VM is listed {state}"
                ))
            );
        }
    }
}
