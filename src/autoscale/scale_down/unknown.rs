//! Deletes of unknown outcome (the answer lost, the operation not followed to its end) and the
//! taints a previous run left behind: each parked node keeps its taint and cordon until a fresh
//! instance list shows its VM gone, still there and `Succeeded` (then untainted), or `Failed` or
//! stuck past `maxNodeProvisionTime` (deleted again).

use super::batch::NodeLook;
use super::{ScaleDownLoop, Shared, Unknown};
use crate::config::NodeGroupSpec;
use crate::kube::nodes::NodeWriteError;
use crate::node_groups::GroupIndex;
use crate::pods::unneeded::{self, DownGroup, Settle};
use crate::reconciler::{DeleteEnd, DeleteKind, LastLook, NoLastLook};
use crate::resource::Victim;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

impl ScaleDownLoop {
    /// Each pass's housekeeping before deciding: untaints that failed are retried, deletes of
    /// unknown outcome settled ([`Shared::settle_unknown`]; those to delete again started). A
    /// dry run does neither, and leaves leftover taints to another run.
    pub(super) async fn tidy(&mut self) {
        let s = self.shared.clone();
        if self.dry_run {
            self.cleaned = true;
            return;
        }
        let retry: Vec<String> = s.flight.lock().untaint.iter().cloned().collect();
        for node in retry {
            if s.untaint(&node).await {
                s.flight.lock().untaint.remove(&node);
            }
        }
        for (slot, u) in s.settle_unknown().await {
            let task = s.clone();
            self.tasks
                .spawn(async move { task.delete_again(slot, u).await });
        }
    }

    /// Once per leadership, the taints a previous run left behind
    /// ([`ScaleDownLoop::remove_leftover_taints`]); `false` when that failed (the pass stops, and
    /// the next one tries again).
    pub(super) async fn clean_leftovers(&mut self, down: &[DownGroup]) -> bool {
        match self.remove_leftover_taints(down).await {
            Ok(0) => {}
            Ok(n) => {
                info!(
                    nodes = n,
                    "removed scale-down taints a previous run left behind"
                )
            }
            Err(e) => {
                warn!(error = %e, "could not remove leftover scale-down taints; retrying next pass");
                return false;
            }
        }
        self.cleaned = true;
        true
    }

    /// Our taints on nodes no removal of this process is working on (cluster-autoscaler #5048):
    /// at the start of a leadership, a removal still finishing from the previous one keeps its
    /// node. A node whose VM a previous leader may have been deleting is untainted only when a
    /// fresh instance list shows its VM still there and `Succeeded`; any other (gone, `Failed`,
    /// `Deleting`, `Updating`) is parked as a delete of unknown outcome, settled pass by pass
    /// ([`Shared::settle_unknown`]: a `Failed` VM deleted again, one stuck past the bound too),
    /// so it is never left cordoned for the leadership. One fresh LIST per group, however many
    /// of its nodes are tainted; a list that fails means try again next pass.
    pub(super) async fn remove_leftover_taints(
        &self,
        groups: &[DownGroup],
    ) -> Result<usize, NodeWriteError> {
        let s = &self.shared;
        let busy = s.flight.lock().busy.clone();
        let index = GroupIndex::of_backings(groups.iter().map(|g| &g.backing));
        let all = s.groups.groups();
        let view = s.cluster.nodes.snapshot();
        let mut removed = 0;
        let mut first_error = None;
        let mut ours: BTreeMap<String, (NodeGroupSpec, Vec<(String, String)>)> = BTreeMap::new();
        let mut untaint = Vec::new();
        for node in s.actions.tainted_nodes().await? {
            if busy.contains(&node) {
                continue;
            }
            let mine = view.get(&node).and_then(|n| {
                let g = index.group_of(n)?;
                let id = n.instance_id()?;
                let spec = all.iter().find(|spec| spec.name == groups[g].name)?;
                Some((spec.clone(), id.to_string()))
            });
            match mine {
                Some((group, instance)) => ours
                    .entry(group.name.clone())
                    .or_insert_with(|| (group, Vec::new()))
                    .1
                    .push((node, instance)),
                None => untaint.push(node),
            }
        }
        for (group, nodes) in ours.into_values() {
            let list = match s.groups.fresh_instances(&group).await {
                Ok(list) => list,
                Err(e) => {
                    first_error.get_or_insert(NodeWriteError::Other(format!(
                        "node group {}: its instances could not be listed fresh: {e}",
                        group.name
                    )));
                    continue;
                }
            };
            for (node, instance) in nodes {
                let state = list
                    .iter()
                    .find(|i| i.instance_id == instance)
                    .map(|i| i.provisioning_state.clone().unwrap_or_default());
                if state
                    .as_deref()
                    .is_some_and(|st| st.eq_ignore_ascii_case("Succeeded"))
                {
                    untaint.push(node);
                    continue;
                }
                info!(%node, scale_set = %group.name, state = ?state, "a leftover tainted node's VM is not Succeeded: it keeps the taint until the VM is gone, deleted again or healthy");
                s.park(
                    node.clone(),
                    Unknown {
                        group: group.clone(),
                        victim: Victim {
                            instance_id: instance,
                            node_name: node,
                        },
                        tainted: true,
                        reason: "leftover",
                        since: Instant::now(),
                    },
                );
            }
        }
        for node in untaint {
            match s.actions.untaint(&node).await {
                Ok(()) => removed += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }
}

impl Shared {
    /// Keeps a delete of unknown outcome: its node (or slot) stays busy, and tainted.
    pub(super) fn park(&self, slot: String, u: Unknown) {
        let mut f = self.flight.lock();
        f.busy.insert(slot.clone());
        f.unknown.insert(slot, u);
    }

    /// Each pass: one fresh instance list per group with deletes of unknown outcome (not one
    /// per parked node), and each settled by [`unneeded::settle`]: the VM gone, the node was
    /// removed; still there and `Succeeded`, the delete did not happen and the node is
    /// untainted; `Deleting` or `Updating`, ask again next pass, until `maxNodeProvisionTime`
    /// since it was parked; `Failed` (or stuck past that), returned to be deleted again
    /// ([`Shared::delete_again`]), unless the group's delete would be held now. A list that
    /// fails: ask again next pass.
    pub(super) async fn settle_unknown(&self) -> Vec<(String, Unknown)> {
        let open: Vec<(String, Unknown)> = self
            .flight
            .lock()
            .unknown
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut by_group: BTreeMap<String, Vec<(String, Unknown)>> = BTreeMap::new();
        for (slot, u) in open {
            by_group
                .entry(u.group.name.clone())
                .or_default()
                .push((slot, u));
        }
        let stuck_after = self.settings.pod_demand.max_node_provision_time;
        let mut again = Vec::new();
        for (name, parked) in by_group {
            let group = parked[0].1.group.clone();
            let list = match self.groups.fresh_instances(&group).await {
                Ok(list) => list,
                Err(e) => {
                    debug!(scale_set = %name, error = %e, "deletes of unknown outcome: the instances could not be listed");
                    continue;
                }
            };
            for (slot, u) in parked {
                let state = list
                    .iter()
                    .find(|i| i.instance_id == u.victim.instance_id)
                    .map(|i| i.provisioning_state.clone().unwrap_or_default());
                let settled = match unneeded::settle(
                    state.as_deref(),
                    u.since.elapsed(),
                    stuck_after,
                ) {
                    Settle::Gone => {
                        info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the delete of unknown outcome happened: the instance is gone");
                        self.metrics
                            .scaled_down_nodes_total
                            .with_label_values(&[&name, u.reason])
                            .inc();
                        self.reconciler.invalidate_size(&name);
                        true
                    }
                    Settle::Healthy => {
                        info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the delete of unknown outcome did not happen: the VM is still there");
                        !u.tainted || self.untaint(&slot).await
                    }
                    Settle::Wait => {
                        debug!(scale_set = %name, instance = %u.victim.instance_id, state = ?state, "delete of unknown outcome: waiting");
                        false
                    }
                    Settle::DeleteAgain => {
                        if let Some(hold) = self.reconciler.delete_hold(&group) {
                            debug!(scale_set = %name, instance = %u.victim.instance_id, %hold, "a VM to delete again waits: its delete would be held");
                        } else {
                            warn!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, state = ?state, waited_secs = u.since.elapsed().as_secs(), "a VM whose delete's outcome was unknown is Failed or stuck: deleting it again");
                            self.flight.lock().unknown.remove(&slot);
                            again.push((slot.clone(), u));
                        }
                        false
                    }
                };
                if settled {
                    let mut f = self.flight.lock();
                    f.unknown.remove(&slot);
                    f.busy.remove(&slot);
                }
            }
        }
        again
    }

    /// Deletes again, through the guarded delete, a VM [`Shared::settle_unknown`] found `Failed`
    /// or stuck ([`DeleteKind::Replace`]: it holds no capacity worth keeping, so even at the
    /// floor, the size then written back up). The last look, for a node, is a drained node's: our
    /// taint still on it and no pod. Its slot stays busy meanwhile: deleted (or found gone), it
    /// is released; stopped by the last look, the node is untainted and released; anything
    /// else parks it again, for a fresh list to decide.
    pub(super) async fn delete_again(self: Arc<Self>, slot: String, mut u: Unknown) {
        let look: Box<dyn LastLook> = if u.tainted {
            Box::new(NodeLook {
                shared: self.clone(),
                nodes: vec![slot.clone()],
            })
        } else {
            Box::new(NoLastLook)
        };
        let name = u.group.name.clone();
        let end = self
            .reconciler
            .delete_instance(
                &u.group,
                u.victim.clone(),
                DeleteKind::Replace,
                look.as_ref(),
            )
            .await;
        let release = match &end {
            DeleteEnd::Deleted => {
                info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, "the VM was deleted again");
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[&name, u.reason])
                    .inc();
                true
            }
            DeleteEnd::Stopped(why) => {
                info!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, %why, "deleting the VM again was stopped by the last look: the node stays");
                self.reconciler.give_back_probe(&u.group);
                !u.tainted || self.untaint(&slot).await || {
                    self.flight.lock().untaint.insert(slot.clone());
                    true
                }
            }
            other => {
                if matches!(other, DeleteEnd::Refused(_)) {
                    self.reconciler.give_back_probe(&u.group);
                }
                debug!(scale_set = %name, instance = %u.victim.instance_id, node = %slot, end = ?other, "deleting the VM again did not end it: a fresh list decides next pass");
                false
            }
        };
        let mut f = self.flight.lock();
        if release {
            f.busy.remove(&slot);
        } else {
            u.since = Instant::now();
            f.busy.insert(slot.clone());
            f.unknown.insert(slot, u);
        }
    }
}
