//! Instances with nothing to drain, deleted by name through the same guarded delete as a
//! drained node: the spot VMs Azure evicted with `Deallocate` (at once) and the instances that
//! never registered as a Node (after `maxNodeProvisionTime`, or at once when a refused
//! allocation left them `Failed`), each after its own last look.

use super::{ScaleDownLoop, Shared, Slot, Unknown};
use crate::cache::Instance;
use crate::config::{NodeGroupKind, NodeGroupSpec};
use crate::pods::record::NodeRecord;
use crate::pods::unneeded::{self, DownGroup};
use crate::reconciler::{DeleteEnd, DeleteKind, LastLook};
use crate::resource::Victim;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

impl ScaleDownLoop {
    /// The spot instances Azure evicted with `Deallocate`, as the reconciler's last instance
    /// lists show them ([`unneeded::evicted`]). Each newly seen one is counted in
    /// `spot_evictions_total` and marks its group's offering unavailable (a spot eviction), so
    /// the pods it ran are planned elsewhere.
    pub(super) fn evicted(&mut self, groups: &[NodeGroupSpec]) -> Vec<unneeded::Unregistered> {
        let s = &self.shared;
        let instances: Vec<_> = groups
            .iter()
            .map(|g| s.groups.instances().get(&g.name))
            .collect();
        let spot: Vec<bool> = groups
            .iter()
            .map(|g| s.groups.offering(&g.name).is_some_and(|o| o.spot))
            .collect();
        let evicted = unneeded::evicted(&instances, &spot);
        let current: HashSet<(String, String)> = evicted
            .iter()
            .map(|e| (groups[e.group].name.clone(), e.instance_id.clone()))
            .collect();
        // Seen stays seen while the VM is listed stopped (being deleted, a delete that failed):
        // a VM is counted and marks its offering once per eviction; one started again and
        // evicted later counts anew. A group whose list is not cached now says nothing.
        self.evicted_seen.retain(|(g, i)| {
            groups
                .iter()
                .zip(&instances)
                .find(|(spec, _)| spec.name == *g)
                .is_some_and(|(_, l)| {
                    l.as_ref().is_none_or(|l| {
                        l.iter()
                            .any(|inst| inst.instance_id == *i && inst.deallocated())
                    })
                })
        });
        let mut new: BTreeMap<&str, u64> = BTreeMap::new();
        for key in current {
            if !self.evicted_seen.contains(&key) {
                if let Some(g) = groups.iter().find(|g| g.name == key.0) {
                    *new.entry(g.name.as_str()).or_default() += 1;
                }
                self.evicted_seen.insert(key);
            }
        }
        for (name, n) in new {
            s.metrics
                .spot_evictions_total
                .with_label_values(&[name])
                .inc_by(n);
            s.groups.mark_unavailable(
                name,
                crate::capacity::AllocationFailure::SpotEvicted,
                &format!("{n} spot VM(s) evicted by Azure with policy Deallocate: listed stopped, running no pod"),
            );
        }
        evicted
    }

    /// Deletes the spot instances Azure evicted with `Deallocate` by name, at once, through the
    /// guarded delete ([`DeleteKind::Replace`]: at the floor the size is written back up), at
    /// most `budget` this pass; counts each in its group's `deleting` and returns the budget
    /// left. Their pods are down already (the VM is
    /// stopped): there is nothing to drain, and the last look checks a fresh list still shows
    /// the VM deallocated (someone may have started it).
    pub(super) fn remove_evicted(
        &mut self,
        groups: &[NodeGroupSpec],
        down: &mut [DownGroup],
        evicted: &[unneeded::Unregistered],
        busy: &HashSet<String>,
        budget: usize,
    ) -> usize {
        let s = self.shared.clone();
        let mut left = budget;
        for e in evicted {
            let group = groups[e.group].clone();
            let slot_name = format!("{}/{}", group.name, e.instance_id);
            if left == 0
                || down[e.group].size.is_none()
                || down[e.group].refused.is_some()
                || busy.contains(&slot_name)
            {
                continue;
            }
            if self.dry_run {
                // Counted as a real pass would count it, so what else the dry run says it would
                // remove is what a real pass would.
                left -= 1;
                down[e.group].deleting += 1;
                if self.would.insert(slot_name) {
                    info!(scale_set = %group.name, instance = %e.instance_id, machine = %e.machine, "dry run: would delete a spot instance Azure evicted (deallocated)");
                }
                continue;
            }
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(scale_set = %group.name, instance = %e.instance_id, %hold, "evicted instance not deleted yet: its delete would be held");
                continue;
            }
            left -= 1;
            down[e.group].deleting += 1;
            let victim = Victim {
                instance_id: e.instance_id.clone(),
                node_name: e.machine.clone(),
            };
            let look = EvictedLook {
                shared: s.clone(),
                group: group.clone(),
                instance_id: e.instance_id.clone(),
            };
            warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, "Azure evicted a spot instance with policy Deallocate: deleting it, its pods go elsewhere");
            self.start_instance_delete(
                slot_name,
                group,
                victim,
                DeleteKind::Replace,
                look,
                "spot_evicted",
            );
        }
        left
    }

    /// Instances that have had no Node for `maxNodeProvisionTime` (a broken image, a bootstrap
    /// that failed: they cost money and will never run a pod), and at once those a refused
    /// allocation left `Failed` (listed so after Azure's refusal), are deleted by name, through the
    /// same guarded delete as a drained node (fresh read, floor, still listed, `If-Match`), at
    /// most `budget` this pass. The instances are the reconciler's last list (no extra call);
    /// since when each has had no Node is counted here, on the monotonic clock, so a node the
    /// watch has not shown yet is never taken for missing: it must stay missing that long.
    pub(super) fn remove_unregistered(
        &mut self,
        groups: &[NodeGroupSpec],
        down: &[DownGroup],
        nodes: &[Arc<NodeRecord>],
        busy: &HashSet<String>,
        budget: usize,
        now: Instant,
    ) {
        let s = self.shared.clone();
        let instances: Vec<_> = groups
            .iter()
            .map(|g| s.groups.instances().get(&g.name))
            .collect();
        let missing = unneeded::unregistered(down, &instances, nodes);
        let key =
            |u: &unneeded::Unregistered| (groups[u.group].name.clone(), u.instance_id.clone());
        let current: HashSet<(String, String)> = missing.iter().map(key).collect();
        // A group whose instance list is not cached now (its TTL ran out, our own write
        // invalidated it) says nothing about its instances: their timers stay.
        let unknown: HashSet<&str> = groups
            .iter()
            .zip(&instances)
            .filter(|(_, l)| l.is_none())
            .map(|(g, _)| g.name.as_str())
            .collect();
        self.unregistered_since
            .retain(|k, _| current.contains(k) || unknown.contains(k.0.as_str()));
        for k in current {
            self.unregistered_since.entry(k).or_insert(now);
        }
        let limit = s.settings.pod_demand.max_node_provision_time;
        let mut started = 0;
        for u in &missing {
            let since = self.unregistered_since.get(&key(u)).copied().unwrap_or(now);
            let slot_name = format!("{}/{}", groups[u.group].name, u.instance_id);
            // An agent pool deletes machines by name: without one, leave the instance alone.
            let unnamed = u.machine.is_empty()
                && matches!(groups[u.group].kind, NodeGroupKind::AksAgentPool { .. });
            // A `Failed` instance holds no capacity: at the floor it is replaced. One merely
            // without a Node (still booting, slow bootstrap) is held to the floor, as
            // cluster-autoscaler holds unregistered nodes to min.
            let failed = instances[u.group].as_ref().is_some_and(|list| {
                list.iter()
                    .any(|i| i.instance_id == u.instance_id && i.failed())
            });
            // What a refused allocation left `Failed` (a list read after Azure's refusal says
            // so) will never boot: deleted now, as cluster-autoscaler deletes the nodes of a
            // scale-up that reported out-of-resources errors, not after maxNodeProvisionTime.
            let left_by_refusal = failed && s.groups.listed_since_refusal(&groups[u.group].name);
            if started >= budget
                || (now.duration_since(since) < limit && !left_by_refusal)
                || down[u.group].size.is_none()
                || busy.contains(&slot_name)
                || unnamed
            {
                continue;
            }
            started += 1;
            let group = groups[u.group].clone();
            if self.dry_run {
                if self.would.insert(slot_name.clone()) {
                    info!(scale_set = %group.name, instance = %u.instance_id, machine = %u.machine, left_by_refusal, "dry run: would delete an instance that never registered as a node");
                }
                continue;
            }
            if let Some(hold) = s.reconciler.delete_hold(&group) {
                debug!(scale_set = %group.name, instance = %u.instance_id, %hold, "unregistered instance not deleted yet: its delete would be held");
                continue;
            }
            let victim = Victim {
                instance_id: u.instance_id.clone(),
                node_name: u.machine.clone(),
            };
            let kind = if failed {
                DeleteKind::Replace
            } else {
                DeleteKind::Unneeded
            };
            let look = UnregisteredLook {
                shared: s.clone(),
                group: down[u.group].clone(),
                instance: Instance {
                    instance_id: u.instance_id.clone(),
                    provisioning_state: None,
                    computer_name: Some(u.machine.clone()).filter(|m| !m.is_empty()),
                    power_state: None,
                    zone: None,
                },
            };
            if left_by_refusal {
                warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, "an instance Azure's refused allocation left Failed: deleting it now");
            } else {
                warn!(scale_set = %group.name, instance = %victim.instance_id, machine = %victim.node_name, minutes = limit.as_secs() / 60, "an instance never registered as a node within maxNodeProvisionTime: deleting it");
            }
            self.start_instance_delete(slot_name, group, victim, kind, look, "unregistered");
        }
    }

    /// Takes `slot_name` (busy, one more delete in flight in `group`) and deletes `victim`, an
    /// instance with nothing to drain, in the background ([`Shared::remove_instance`]); the slot
    /// is given back when the task ends.
    pub(super) fn start_instance_delete(
        &mut self,
        slot_name: String,
        group: NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        look: impl LastLook + 'static,
        reason: &'static str,
    ) {
        let s = self.shared.clone();
        let slot = {
            let mut f = s.flight.lock();
            f.busy.insert(slot_name.clone());
            *f.deleting.entry(group.name.clone()).or_default() += 1;
            Slot {
                shared: s.clone(),
                node: slot_name,
                group: group.name.clone(),
                drains: false,
            }
        };
        self.tasks.spawn(async move {
            let _slot = slot;
            s.remove_instance(group, victim, kind, &look, reason).await;
        });
    }
}

impl Shared {
    /// Deletes an instance with no pod to drain (`reason`: `unregistered`, it never became a
    /// Node; `spot_evicted`, Azure stopped it); with [`DeleteKind::Replace`] (a `Failed` or
    /// evicted instance) even at the group's floor, the size then written back up.
    pub(super) async fn remove_instance(
        self: &Arc<Self>,
        group: NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        look: &dyn LastLook,
        reason: &'static str,
    ) {
        if !self.reconciler.may_write() {
            return;
        }
        let name = group.name.as_str();
        match self
            .reconciler
            .delete_instance(&group, victim.clone(), kind, look)
            .await
        {
            DeleteEnd::Deleted => {
                self.metrics
                    .scaled_down_nodes_total
                    .with_label_values(&[name, reason])
                    .inc();
                info!(scale_set = name, instance = %victim.instance_id, reason, "an instance with nothing to drain was deleted");
            }
            DeleteEnd::Refused(why) => {
                info!(scale_set = name, instance = %victim.instance_id, reason, %why, "an instance with nothing to drain was not deleted");
                self.reconciler.give_back_probe(&group);
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "refused"])
                    .inc();
            }
            DeleteEnd::Stopped(why) => {
                info!(scale_set = name, instance = %victim.instance_id, reason, %why, "an instance with nothing to drain was not deleted");
                self.reconciler.give_back_probe(&group);
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "aborted"])
                    .inc();
            }
            DeleteEnd::Failed(why) => {
                warn!(scale_set = name, instance = %victim.instance_id, reason, %why, "deleting an instance with nothing to drain failed");
                self.metrics
                    .failed_scale_downs_total
                    .with_label_values(&[name, "delete_failed"])
                    .inc();
            }
            DeleteEnd::Unknown(why) => {
                warn!(scale_set = name, instance = %victim.instance_id, reason, %why, "deleting an instance with nothing to drain: outcome unknown; a fresh list decides");
                let slot = format!("{name}/{}", victim.instance_id);
                self.park(
                    slot,
                    Unknown {
                        group: group.clone(),
                        victim,
                        tainted: false,
                        reason,
                        since: Instant::now(),
                    },
                );
            }
        }
    }
}

/// The last look before a spot instance Azure evicted is deleted: a fresh list of the group's
/// instances still shows it stopped (deallocated). Started again by someone, it stays.
struct EvictedLook {
    shared: Arc<Shared>,
    group: NodeGroupSpec,
    instance_id: String,
}

#[async_trait::async_trait]
impl LastLook for EvictedLook {
    async fn check(&self) -> Result<(), String> {
        match self
            .shared
            .groups
            .instance_state(&self.group, &self.instance_id)
            .await
        {
            Ok(Some(i)) if i.deallocated() => Ok(()),
            Ok(Some(i)) => Err(format!(
                "a fresh list shows the instance no longer deallocated (power state {})",
                i.power_state.as_deref().unwrap_or("not given")
            )),
            Ok(None) => Err("a fresh list no longer shows the instance".into()),
            Err(e) => Err(format!("the instances could not be listed fresh: {e}")),
        }
    }
}

/// The last look before an instance that seems never to have registered is deleted: the cluster
/// view is healthy, and a fresh list of every Node from the API server has none for it.
struct UnregisteredLook {
    shared: Arc<Shared>,
    group: DownGroup,
    instance: Instance,
}

#[async_trait::async_trait]
impl LastLook for UnregisteredLook {
    async fn check(&self) -> Result<(), String> {
        if let Some(f) = self.shared.cluster.failing().first() {
            return Err(f.to_string());
        }
        let nodes: Vec<Arc<NodeRecord>> = self
            .shared
            .actions
            .list_nodes()
            .await
            .map_err(|e| format!("the nodes could not be listed fresh: {e}"))?
            .into_iter()
            .map(Arc::new)
            .collect();
        let still = unneeded::unregistered(
            std::slice::from_ref(&self.group),
            &[Some(Arc::new(vec![self.instance.clone()]))],
            &nodes,
        );
        if still.is_empty() {
            return Err("a fresh list of nodes shows a Node for the instance".into());
        }
        Ok(())
    }
}
