//! Removing exactly one node's instance (scale-down), under the same rules as a capacity write.
//!
//! A node goes by deleting its instance, never by lowering a capacity number (Azure would pick
//! which instance goes). Immediately before the delete the resource is read fresh, never from the
//! cache (cluster-autoscaler #3240 deleted 197 of 200 nodes from a stale size): its capacity must
//! be known and stay at or above the group's floor after the delete, the instance must still be
//! listed, and the delete carries `If-Match` with the ETag just read. ARM documents `If-Match` only
//! for PUT and PATCH; we send it on the delete too (the emulator enforces it), and where Azure
//! ignores it the fresh read and the instance check are the guard. A delete names one instance
//! and lowers the capacity by one relative to whatever it is then, so it cannot overwrite another
//! writer's capacity; a 412 still invalidates the size and instance caches and the checks run
//! again on a fresh read, once. The delete leaves through the guarded send ([`super::send`]), as
//! a capacity write does: the fence asked immediately before the request leaves and its permit
//! held until Azure answers, the group's write budget spent, a backoff waited out (an
//! unavailable offering is not: removing an instance frees quota). The size is never lowered here: it is re-read after Azure
//! confirmed the operation (#7432: sizes dropped after deletes that failed).
//!
//! Deletes go one at a time; a delete that waited behind another runs its caller's
//! [`LastLook`] only once its turn came, right before it is sent, so pods that landed on the node
//! while it waited stop it. A delete whose outcome is not known (the answer was lost, the
//! operation could not be followed to its end) is [`DeleteEnd::Unknown`], never "failed": the
//! caller must not give the node back to the scheduler until a fresh instance list shows the VM
//! still there and `Succeeded`.

use super::operation::OperationEnd;
use super::send::{Sent, WriteKind};
use super::write::FreshRead;
use super::{Inner, Reconciler};
use crate::azure::budget::Urgency;
use crate::azure::ArmError;
use crate::config::NodeGroupSpec;
use crate::hold::HoldReason;
use crate::resource::Victim;
use std::fmt;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How a deletion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteEnd {
    /// Azure confirmed the operation; the cached size was replaced by a fresh read.
    Deleted,
    /// Not sent (a guard), and why: the node stays.
    Refused(DeleteRefusal),
    /// Not sent: the caller's [`LastLook`] stopped it, with its reason.
    Stopped(String),
    /// Sent, and Azure refused it or its operation failed; caches invalidated.
    Failed(String),
    /// Sent, and whether Azure deleted the instance is not known (the answer was lost, the
    /// operation could not be followed to its end); caches invalidated. The instance may be
    /// going away: its node must stay tainted until a fresh list says otherwise.
    Unknown(String),
}

/// Why a delete was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteRefusal {
    /// A hold every write is subject to (the fence, backoff, budget, dry run, ...).
    Held(HoldReason),
    /// The resource no longer exists.
    Gone,
    /// Its capacity could not be read fresh.
    UnknownSize,
    /// The delete would take the group below its floor.
    BelowFloor,
    /// The instance is no longer listed.
    InstanceGone,
    /// The instances could not be listed fresh.
    UnknownInstances,
}

impl DeleteRefusal {
    /// A short label (logs, the scale-down Event's text).
    pub fn label(self) -> &'static str {
        match self {
            DeleteRefusal::Held(reason) => reason.metric_label(),
            DeleteRefusal::Gone => "gone",
            DeleteRefusal::UnknownSize => "unknown_size",
            DeleteRefusal::BelowFloor => "min_size",
            DeleteRefusal::InstanceGone => "instance_gone",
            DeleteRefusal::UnknownInstances => "unknown_instances",
        }
    }
}

impl fmt::Display for DeleteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Why an instance is deleted, which decides the floor it is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteKind {
    /// An unneeded node: the group stays at or above its floor after the delete.
    Unneeded,
    /// An instance that never became a node (or failed): it is no capacity worth keeping, so
    /// at the floor it is deleted all the same and the size written back up by the next pass
    /// (delete and re-add, as cluster-autoscaler replaces such instances).
    Replace,
}

/// The caller's last check of a delete, run once its turn came (no other delete in flight),
/// after the fresh Azure reads and immediately before the fence is asked: `Err(reason)` stops
/// the delete ([`DeleteEnd::Stopped`]).
#[async_trait::async_trait]
pub trait LastLook: Send + Sync {
    /// `Ok(())` if the delete may go now.
    async fn check(&self) -> Result<(), String>;

    /// For a request naming several instances: one answer per victim, in order. A victim whose
    /// answer is `Err` is dropped from the request and the rest go; all dropped stops it. By
    /// default [`LastLook::check`]'s one answer for every victim.
    async fn check_each(&self, victims: &[Victim]) -> Vec<Result<(), String>> {
        let one = self.check().await;
        victims.iter().map(|_| one.clone()).collect()
    }
}

/// How a request naming several instances ended ([`Reconciler::delete_each`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BulkEnd {
    /// The request's outcome, for the victims it kept.
    pub end: DeleteEnd,
    /// Victims the last look (or a fresh list no longer showing them) dropped before the send,
    /// by instance id, with why: they were not deleted.
    pub dropped: Vec<(String, String)>,
    /// Azure accepted the request and its operation then ended `Failed`: some of the kept
    /// instances may be gone (a fresh list decides).
    pub operation_failed: bool,
}

/// No last look (nothing on the Kubernetes side to check).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLastLook;

#[async_trait::async_trait]
impl LastLook for NoLastLook {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Reconciler {
    /// Deletes `victim`'s instance from `group` (see the module documentation), `last_look`
    /// permitting. Waits for Azure's operation to end. A [`DeleteKind::Replace`] that went below
    /// the group's floor wakes the loop, which writes the size back up.
    pub async fn delete_instance(
        &self,
        group: &NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        last_look: &dyn LastLook,
    ) -> DeleteEnd {
        self.delete_instances(group, vec![victim], kind, last_look)
            .await
    }

    /// Deletes several instances of `group` in one request; one outcome for the victims it
    /// kept ([`Reconciler::delete_each`], which also says which were dropped).
    pub async fn delete_instances(
        &self,
        group: &NodeGroupSpec,
        victims: Vec<Victim>,
        kind: DeleteKind,
        last_look: &dyn LastLook,
    ) -> DeleteEnd {
        self.delete_each(group, victims, kind, last_look).await.end
    }

    /// Deletes several instances of `group` in one request (empty nodes in bulk: one VMSS
    /// `delete` with their instance ids, one `deleteMachines` with their names), under the same
    /// guards as one: a fresh read, the floor counting all of them, `If-Match`. Each victim is
    /// looked at on its own: one no longer listed on the fresh list, or whose last look
    /// ([`LastLook::check_each`]) fails, is dropped and the rest go in the one request; with
    /// none left nothing is sent. One outcome for the victims kept.
    pub async fn delete_each(
        &self,
        group: &NodeGroupSpec,
        victims: Vec<Victim>,
        kind: DeleteKind,
        last_look: &dyn LastLook,
    ) -> BulkEnd {
        if victims.is_empty() {
            return BulkEnd {
                end: DeleteEnd::Refused(DeleteRefusal::InstanceGone),
                dropped: Vec::new(),
                operation_failed: false,
            };
        }
        let end = self
            .inner
            .clone()
            .delete_instance(group, victims, kind, last_look)
            .await;
        if kind == DeleteKind::Replace && end.end == DeleteEnd::Deleted {
            self.wake();
        }
        end
    }

    /// Gives back the budget probe scale-down's look before a drain was granted for `group`'s
    /// next delete ([`Reconciler::delete_hold`]) when that removal stopped before its delete was
    /// sent: the group's next write (another drain, a lowered capacity) may take it at once.
    pub fn give_back_probe(&self, group: &NodeGroupSpec) {
        let granted = self
            .inner
            .with_state(&group.name, |s| s.probe_granted.take());
        if let Some(at) = granted {
            self.inner.unprobe(&group.name, at);
        }
    }

    /// Why a delete in `group` would be held now (the fence, a backoff, the write budget, a dry
    /// run), spending nothing: scale-down asks before it taints and drains a node, so no node is
    /// drained for a delete that would not be sent.
    pub fn delete_hold(&self, group: &NodeGroupSpec) -> Option<HoldReason> {
        self.inner
            .early_hold(&group.name, WriteKind::Delete)
            .or_else(|| {
                // An earlier 429's `Retry-After` holds every write back: the delete would not
                // leave the process, so no node is drained for it meanwhile.
                self.inner
                    .arm
                    .gates()
                    .closed_for(crate::azure::throttle::CallClass::Write, Instant::now())
                    .map(|_| HoldReason::RetryTurn)
            })
            .or_else(|| {
                self.inner
                    .reserve_hold(&group.name, Urgency::ScaleDown, false)
            })
    }

    /// Why this replica may not write now, if it may not (see [`crate::fence`]):
    /// [`crate::fence::FenceHold::RenewalStale`] is a leader whose renewal is late (a hiccup
    /// that may pass), [`crate::fence::FenceHold::NotLeader`] a replica that does not lead.
    pub fn fence_hold(&self) -> Option<crate::fence::FenceHold> {
        self.inner.fence.check().err()
    }

    /// Whether this replica may write now (the leader, with a fresh renewal).
    pub fn may_write(&self) -> bool {
        self.inner.fence.check().is_ok()
    }
}

impl Inner {
    async fn delete_instance(
        self: Arc<Self>,
        group: &NodeGroupSpec,
        victims: Vec<Victim>,
        kind: DeleteKind,
        last_look: &dyn LastLook,
    ) -> BulkEnd {
        let mut bulk = BulkEnd {
            end: DeleteEnd::Refused(DeleteRefusal::InstanceGone),
            dropped: Vec::new(),
            operation_failed: false,
        };
        bulk.end = self
            .delete_checked(group, victims, kind, last_look, &mut bulk)
            .await;
        if matches!(bulk.end, DeleteEnd::Refused(_) | DeleteEnd::Stopped(_)) {
            // Nothing was sent: a budget probe this delete took goes back.
            let taken = self.with_state(&group.name, |s| s.probe_taken.take());
            if let Some(at) = taken {
                self.unprobe(&group.name, at);
            }
        } else {
            self.with_state(&group.name, |s| s.probe_taken = None);
        }
        bulk
    }

    async fn delete_checked(
        &self,
        group: &NodeGroupSpec,
        mut victims: Vec<Victim>,
        kind: DeleteKind,
        last_look: &dyn LastLook,
        bulk: &mut BulkEnd,
    ) -> DeleteEnd {
        let name = group.name.as_str();
        let nodes = victims
            .iter()
            .map(|v| v.node_name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        // Held before any read is spent on it (asked again right before the send).
        if let Some(reason) = self
            .early_hold(name, WriteKind::Delete)
            .or_else(|| self.reserve_hold(name, Urgency::ScaleDown, true))
        {
            if reason == HoldReason::DryRun {
                info!(scale_set = name, node = %nodes, "dry run: would delete the instance");
            }
            self.record_hold(name, WriteKind::Delete, reason);
            return DeleteEnd::Refused(DeleteRefusal::Held(reason));
        }
        let _one_at_a_time = self.deletes.lock().await;
        let resource = self.node_groups.resource(group);
        for attempt in 0..2 {
            let count = victims.len() as i64;
            // Never from an unknown or cached size.
            let fresh = match self
                .fresh_read(group, resource.as_ref(), "scale_down")
                .await
            {
                FreshRead::Read(f) => f,
                FreshRead::Gone => return DeleteEnd::Refused(DeleteRefusal::Gone),
                FreshRead::Failed(e) => {
                    warn!(scale_set = name, error = %e, "scale-down: the size could not be read; nothing deleted");
                    return DeleteEnd::Refused(DeleteRefusal::UnknownSize);
                }
            };
            let Some(capacity) = fresh.capacity else {
                return DeleteEnd::Refused(DeleteRefusal::UnknownSize);
            };
            let floor = self
                .node_groups
                .floor(group)
                .max(resource.capacity_floor(&fresh));
            // A replacement may take the group one below its floor for as long as the write
            // back up takes: the instance it removes holds no node.
            let lowest = match kind {
                DeleteKind::Unneeded => i64::from(floor),
                DeleteKind::Replace => i64::from(floor) - 1,
            };
            if capacity - count < lowest.max(0) {
                info!(scale_set = name, capacity, floor, node = %nodes, "scale-down refused: the group would go below its floor");
                return DeleteEnd::Refused(DeleteRefusal::BelowFloor);
            }
            // Each instance must still be there, on a fresh list: one that is not is dropped.
            self.node_groups.instances().invalidate(name);
            match resource.list_instances(name).await {
                Ok(list) => {
                    let (listed, gone): (Vec<Victim>, Vec<Victim>) = std::mem::take(&mut victims)
                        .into_iter()
                        .partition(|v| list.iter().any(|i| i.instance_id == v.instance_id));
                    victims = listed;
                    for v in gone {
                        info!(scale_set = name, instance = %v.instance_id, node = %v.node_name, "scale-down: the instance is no longer listed; it is not deleted");
                        bulk.dropped.push((
                            v.instance_id,
                            "the instance is no longer listed".to_string(),
                        ));
                    }
                    if victims.is_empty() {
                        return DeleteEnd::Refused(DeleteRefusal::InstanceGone);
                    }
                }
                Err(e) => {
                    warn!(scale_set = name, error = %e, "scale-down: the instances could not be listed; nothing deleted");
                    return DeleteEnd::Refused(DeleteRefusal::UnknownInstances);
                }
            }
            // The last look, victim by victim: one that fails it is dropped, the rest go.
            let looks = last_look.check_each(&victims).await;
            let mut first_why = None;
            let mut kept = Vec::with_capacity(victims.len());
            for (v, look) in std::mem::take(&mut victims).into_iter().zip(looks) {
                match look {
                    Ok(()) => kept.push(v),
                    Err(why) => {
                        info!(scale_set = name, node = %v.node_name, %why, "scale-down: dropped from the delete by the last look");
                        first_why.get_or_insert_with(|| why.clone());
                        bulk.dropped.push((v.instance_id, why));
                    }
                }
            }
            victims = kept;
            if victims.is_empty() {
                let why = first_why.unwrap_or_default();
                info!(scale_set = name, node = %nodes, %why, "scale-down stopped by the last look before the delete");
                return DeleteEnd::Stopped(why);
            }
            let count = victims.len() as i64;
            let ids = victims
                .iter()
                .map(|v| v.instance_id.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let nodes = victims
                .iter()
                .map(|v| v.node_name.as_str())
                .collect::<Vec<_>>()
                .join(",");
            info!(scale_set = name, node = %nodes, instance = %ids, capacity, etag = ?fresh.etag, "deleting the instance(s)");
            let sent = self
                .guarded_send(
                    group,
                    resource.as_ref(),
                    &fresh,
                    WriteKind::Delete,
                    |precondition| {
                        let (resource, fresh, victims) = (&resource, &fresh, &victims[..]);
                        async move {
                            resource
                                .delete_instances(fresh, victims, &precondition)
                                .await
                        }
                    },
                )
                .await;
            let result = match sent {
                Sent::Held(reason) => return DeleteEnd::Refused(DeleteRefusal::Held(reason)),
                Sent::Answered(_, result) => result,
            };
            match result {
                Ok(accepted) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "accepted"])
                        .inc();
                    self.clear_backoff(name);
                    let end = match accepted.async_operation {
                        Some(url) => {
                            self.follow_operation(resource.as_ref(), &url, accepted.retry_after)
                                .await
                        }
                        None => OperationEnd::Succeeded,
                    };
                    return match end {
                        OperationEnd::Succeeded => {
                            self.adopt_after_delete(resource.as_ref(), name, capacity - count)
                                .await;
                            DeleteEnd::Deleted
                        }
                        OperationEnd::Failed(why) => {
                            warn!(scale_set = name, node = %nodes, %why, "instance deletion failed: caches invalidated, the size is re-read");
                            bulk.operation_failed = true;
                            self.operation_failed(name);
                            DeleteEnd::Failed(why.to_string())
                        }
                        OperationEnd::Unknown(why) => {
                            warn!(scale_set = name, node = %nodes, %why, "instance deletion: outcome unknown; caches invalidated");
                            self.operation_failed(name);
                            DeleteEnd::Unknown(why)
                        }
                    };
                }
                Err(ArmError::PreconditionFailed { .. }) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "precondition_failed"])
                        .inc();
                    self.invalidate_after_conflict(name);
                    if attempt == 0 {
                        info!(scale_set = name, node = %nodes, "412 on the instance delete: re-reading and checking again");
                        continue;
                    }
                    return DeleteEnd::Failed(
                        "412 twice: another writer keeps changing the resource".into(),
                    );
                }
                Err(e @ ArmError::Ambiguous { .. }) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "ambiguous"])
                        .inc();
                    warn!(scale_set = name, node = %nodes, error = %e, "instance delete sent, answer lost: outcome unknown");
                    self.operation_failed(name);
                    self.backoff(name);
                    return DeleteEnd::Unknown(e.to_string());
                }
                Err(ArmError::Throttled {
                    retry_after, local, ..
                }) => {
                    // Refused before Azure's bucket (or held back by the gate an earlier 429
                    // closed): nothing happened, and the subscription's budget is no fault of the
                    // group's. Its scale-ups are not backed off; the removal stops and a later
                    // pass tries again once the gate opens (scale-down asks it before a drain).
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "throttled"])
                        .inc();
                    info!(scale_set = name, node = %nodes, retry_after_secs = retry_after.as_secs_f64(), local, "instance delete throttled: not sent, the group is not backed off");
                    return DeleteEnd::Failed(format!(
                        "throttled by Azure: retry after {}s",
                        retry_after.as_secs()
                    ));
                }
                Err(e) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "error"])
                        .inc();
                    warn!(scale_set = name, node = %nodes, error = %e, "instance delete refused");
                    self.operation_failed(name);
                    // A failing resource (5xx, transport) is backed off for every write to it.
                    if e.is_retryable() {
                        self.backoff(name);
                    }
                    return DeleteEnd::Failed(e.to_string());
                }
            }
        }
        DeleteEnd::Failed("412 twice".into())
    }

    /// After a confirmed delete: the size and ETag come from a fresh read; our own new ETag is
    /// adopted without counting it as another writer's.
    async fn adopt_after_delete(
        &self,
        resource: &dyn crate::resource::CapacityResource,
        name: &str,
        expected: i64,
    ) {
        self.node_groups.sizes().invalidate(name);
        self.node_groups.instances().invalidate(name);
        match resource.get(name).await {
            Ok(Some(fresh)) => {
                if fresh.capacity == Some(expected) {
                    self.node_groups.adopt_etag(name, fresh.etag.clone());
                } else {
                    self.observe(&fresh);
                }
                let now = Instant::now();
                if let Some(c) = fresh.capacity {
                    self.node_groups.sizes().publish(name, c, now);
                }
                self.node_groups.scale_sets().upsert(fresh, now);
                debug!(scale_set = name, "instance deleted; size re-read");
            }
            _ => self.node_groups.set_stale(name, true),
        }
    }
}
