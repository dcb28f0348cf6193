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
//! again on a fresh read, once. The fence is asked immediately before the request leaves and its
//! permit is held until Azure answers. The size is never lowered here: it is re-read after Azure
//! confirmed the operation (#7432: sizes dropped after deletes that failed).
//!
//! Deletes go one at a time; a delete that waited behind another runs its caller's
//! [`LastLook`] only once its turn came, right before it is sent, so pods that landed on the node
//! while it waited stop it. A delete whose outcome is not known (the answer was lost, the
//! operation could not be followed to its end) is [`DeleteEnd::Unknown`], never "failed": the
//! caller must not give the node back to the scheduler until a fresh instance list shows the VM
//! still there and `Succeeded`.

use super::{Inner, Reconciler, LRO_DEADLINE, LRO_MIN_POLL};
use crate::azure::arm::OperationStatus;
use crate::azure::{ArmError, Precondition};
use crate::config::NodeGroupSpec;
use crate::planner::Demand;
use crate::resource::Victim;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How a deletion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteEnd {
    /// Azure confirmed the operation; the cached size was replaced by a fresh read.
    Deleted,
    /// Not sent (a guard), with a short reason: the node stays.
    Refused(&'static str),
    /// Not sent: the caller's [`LastLook`] stopped it, with its reason.
    Stopped(String),
    /// Sent, and Azure refused it or its operation failed; caches invalidated.
    Failed(String),
    /// Sent, and whether Azure deleted the instance is not known (the answer was lost, the
    /// operation could not be followed to its end); caches invalidated. The instance may be
    /// going away: its node must stay tainted until a fresh list says otherwise.
    Unknown(String),
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

/// How following a delete's operation ended, when not in success.
enum Followed {
    /// The operation ended `Failed` or `Canceled`.
    Failed(String),
    /// Its end could not be learnt (polls kept failing, or it ran past the deadline).
    Unknown(String),
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
        let end = self
            .inner
            .clone()
            .delete_instance(group, victim, kind, last_look)
            .await;
        if kind == DeleteKind::Replace && end == DeleteEnd::Deleted {
            self.wake();
        }
        end
    }

    /// A fresh list of `group`'s instances (never the cache): the provisioning state of
    /// `instance_id`, `Ok(None)` when it is not listed (deleted).
    pub async fn instance_state(
        &self,
        group: &NodeGroupSpec,
        instance_id: &str,
    ) -> Result<Option<String>, ArmError> {
        let resource = self.inner.resources.for_group(group);
        self.inner.instances.invalidate(&group.name);
        let list = resource.list_instances(&group.name).await?;
        Ok(list
            .into_iter()
            .find(|i| i.instance_id == instance_id)
            .map(|i| i.provisioning_state.unwrap_or_default()))
    }

    /// The lowest size `group` may be taken down to: its `minSize`, and the configured demand
    /// (schedules, `desiredCapacity`) as a floor.
    pub fn floor(&self, group: &NodeGroupSpec) -> u32 {
        self.inner.floor(group)
    }

    /// Whether this replica may write now (the leader, with a fresh renewal).
    pub fn may_write(&self) -> bool {
        self.inner.fence.check().is_ok()
    }
}

impl Inner {
    fn floor(&self, group: &NodeGroupSpec) -> u32 {
        let demanded = match self.demand.demand(group, (self.clock)()).0 {
            Demand::Exact(n) | Demand::AtLeast(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            Demand::Hold => 0,
        };
        let resource = match self.scale_sets.get(&group.name) {
            Some(c) => self.resources.for_group(group).capacity_floor(&c.scale_set),
            None => 0,
        };
        group.min_size.max(demanded).max(resource)
    }

    async fn delete_instance(
        self: Arc<Self>,
        group: &NodeGroupSpec,
        victim: Victim,
        kind: DeleteKind,
        last_look: &dyn LastLook,
    ) -> DeleteEnd {
        let name = group.name.as_str();
        if self.dry_run {
            info!(scale_set = name, node = %victim.node_name, "dry run: would delete the instance");
            return DeleteEnd::Refused("dry_run");
        }
        let _one_at_a_time = self.deletes.lock().await;
        let resource = self.resources.for_group(group);
        for attempt in 0..2 {
            // Never from an unknown or cached size.
            let fresh = match self.fresh_read(group, "scale_down").await {
                Ok(Some(f)) => f,
                Ok(None) => return DeleteEnd::Refused("gone"),
                Err(e) => {
                    warn!(scale_set = name, error = %e, "scale-down: the size could not be read; nothing deleted");
                    return DeleteEnd::Refused("unknown_size");
                }
            };
            let Some(capacity) = fresh.capacity else {
                return DeleteEnd::Refused("unknown_size");
            };
            if let Some(reason) = resource.write_refusal(&fresh) {
                return DeleteEnd::Refused(reason);
            }
            let floor = self.floor(group).max(resource.capacity_floor(&fresh));
            // A replacement may take the group one below its floor for as long as the write
            // back up takes: the instance it removes holds no node.
            let lowest = match kind {
                DeleteKind::Unneeded => i64::from(floor),
                DeleteKind::Replace => i64::from(floor) - 1,
            };
            if capacity - 1 < lowest.max(0) {
                info!(scale_set = name, capacity, floor, node = %victim.node_name, "scale-down refused: the group would go below its floor");
                return DeleteEnd::Refused("min_size");
            }
            // The instance must still be there, on a fresh list.
            self.instances.invalidate(name);
            match resource.list_instances(name).await {
                Ok(list) if list.iter().any(|i| i.instance_id == victim.instance_id) => {}
                Ok(_) => {
                    info!(scale_set = name, instance = %victim.instance_id, "scale-down: the instance is no longer listed; nothing deleted");
                    return DeleteEnd::Refused("instance_gone");
                }
                Err(e) => {
                    warn!(scale_set = name, error = %e, "scale-down: the instances could not be listed; nothing deleted");
                    return DeleteEnd::Refused("unknown_instances");
                }
            }
            let precondition = if self.settings.enable_vmss_etag {
                match &fresh.etag {
                    Some(e) => Precondition::IfMatch(e.clone()),
                    None => return DeleteEnd::Refused("no_etag"),
                }
            } else {
                Precondition::None
            };
            if let Err(why) = last_look.check().await {
                info!(scale_set = name, node = %victim.node_name, %why, "scale-down stopped by the last look before the delete");
                return DeleteEnd::Stopped(why);
            }
            let permit = match self.admitted_with_token(name).await {
                Ok(p) => p,
                Err(label) => return DeleteEnd::Refused(label),
            };
            info!(scale_set = name, node = %victim.node_name, instance = %victim.instance_id, capacity, if_match = ?precondition.if_match(), "deleting the instance");
            let sent = self
                .send_fenced(resource.delete_instances(
                    &fresh,
                    std::slice::from_ref(&victim),
                    &precondition,
                ))
                .await;
            drop(permit);
            match sent {
                Ok(accepted) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "accepted"])
                        .inc();
                    let end = match accepted.async_operation {
                        Some(url) => {
                            self.follow(resource.as_ref(), &url, accepted.retry_after)
                                .await
                        }
                        None => Ok(()),
                    };
                    return match end {
                        Ok(()) => {
                            self.adopt_after_delete(resource.as_ref(), name, capacity - 1)
                                .await;
                            DeleteEnd::Deleted
                        }
                        Err(Followed::Failed(why)) => {
                            warn!(scale_set = name, node = %victim.node_name, %why, "instance deletion failed: caches invalidated, the size is re-read");
                            self.operation_failed(name);
                            DeleteEnd::Failed(why)
                        }
                        Err(Followed::Unknown(why)) => {
                            warn!(scale_set = name, node = %victim.node_name, %why, "instance deletion: outcome unknown; caches invalidated");
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
                        info!(scale_set = name, node = %victim.node_name, "412 on the instance delete: re-reading and checking again");
                        continue;
                    }
                    return DeleteEnd::Failed(
                        "412 twice: another writer keeps changing the resource".into(),
                    );
                }
                Err(ArmError::Fenced { hold, .. }) => {
                    // The fence closed between admission and the bytes leaving: nothing was sent.
                    self.metrics
                        .writes_held_total
                        .with_label_values(&[name, hold.metric_label()])
                        .inc();
                    return DeleteEnd::Refused(hold.metric_label());
                }
                Err(e @ ArmError::Ambiguous { .. }) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "ambiguous"])
                        .inc();
                    warn!(scale_set = name, node = %victim.node_name, error = %e, "instance delete sent, answer lost: outcome unknown");
                    self.operation_failed(name);
                    return DeleteEnd::Unknown(e.to_string());
                }
                Err(e) => {
                    self.metrics
                        .instance_deletes_total
                        .with_label_values(&[name, "error"])
                        .inc();
                    warn!(scale_set = name, node = %victim.node_name, error = %e, "instance delete refused");
                    self.operation_failed(name);
                    return DeleteEnd::Failed(e.to_string());
                }
            }
        }
        DeleteEnd::Failed("412 twice".into())
    }

    /// Polls the delete's operation until it ends (the caller waits: a scale-down is not done
    /// until Azure says so).
    async fn follow(
        &self,
        resource: &dyn crate::resource::CapacityResource,
        url: &str,
        hint: Option<std::time::Duration>,
    ) -> Result<(), Followed> {
        let interval = hint.unwrap_or(LRO_MIN_POLL).max(LRO_MIN_POLL);
        let deadline = Instant::now() + LRO_DEADLINE;
        let mut errors = 0u32;
        loop {
            tokio::time::sleep(interval).await;
            if Instant::now() > deadline {
                self.metrics.lro_total.with_label_values(&["timeout"]).inc();
                return Err(Followed::Unknown(
                    "the operation did not end in time".into(),
                ));
            }
            match resource.poll_operation(url).await {
                Ok(OperationStatus::InProgress) => {}
                Ok(OperationStatus::Succeeded) => {
                    self.metrics
                        .lro_total
                        .with_label_values(&["succeeded"])
                        .inc();
                    return Ok(());
                }
                Ok(OperationStatus::Failed(code)) => {
                    self.metrics.lro_total.with_label_values(&["failed"]).inc();
                    return Err(Followed::Failed(code));
                }
                Ok(OperationStatus::Canceled) => {
                    self.metrics.lro_total.with_label_values(&["failed"]).inc();
                    return Err(Followed::Failed("Canceled".into()));
                }
                Err(ArmError::Throttled { retry_after, .. }) => {
                    tokio::time::sleep(retry_after).await
                }
                Err(e) => {
                    errors += 1;
                    if errors >= 5 {
                        self.metrics.lro_total.with_label_values(&["error"]).inc();
                        return Err(Followed::Unknown(format!(
                            "the operation could not be polled: {e}"
                        )));
                    }
                }
            }
        }
    }

    /// After a confirmed delete: the size and ETag come from a fresh read; our own new ETag is
    /// adopted without counting it as another writer's.
    async fn adopt_after_delete(
        &self,
        resource: &dyn crate::resource::CapacityResource,
        name: &str,
        expected: i64,
    ) {
        self.sizes.invalidate(name);
        self.instances.invalidate(name);
        match resource.get(name).await {
            Ok(Some(fresh)) => {
                if fresh.capacity == Some(expected) {
                    self.with_state(name, |s| s.known_etag = fresh.etag.clone());
                } else {
                    self.observe(&fresh);
                }
                let now = Instant::now();
                if let Some(c) = fresh.capacity {
                    self.sizes.publish(name, c, now);
                }
                self.scale_sets.upsert(fresh, now);
                debug!(scale_set = name, "instance deleted; size re-read");
            }
            _ => self.with_state(name, |s| s.stale = true),
        }
    }
}
