//! Which pods ask for capacity, and when a burst of them is complete enough to plan for.
//!
//! A pod is pending for scale-up when the scheduler said so (`PodScheduled=False`, reason
//! `Unschedulable`), it is not bound to a node, it has no `nominatedNodeName` (the scheduler is
//! preempting pods there for it), it is not a DaemonSet's (a new node brings its own), and its
//! priority is at or above `expendablePodsPriorityCutoff` (cluster-autoscaler's -10), and it
//! does not consume a ProvisioningRequest (the request asks for its capacity).
//! A burst is batched as Karpenter batches it: the batch closes after 1 s without a new pending
//! pod, or 10 s after it opened, so 1,000 new pods make one plan, not 1,000. Pure code: the
//! caller passes the time.

use super::record::PodRecord;
use std::time::Duration;
use tokio::time::Instant;

pub use crate::config::{BATCH_IDLE, BATCH_MAX, EXPENDABLE_PRIORITY_CUTOFF};

/// Whether the pod asks for capacity (see the module documentation).
pub fn wants_capacity(pod: &PodRecord, priority_cutoff: i32) -> bool {
    pod.unschedulable
        && !pod.is_bound()
        // Waiting for a preemption on its nominated node: room is being made for it
        // (cluster-autoscaler's "waiting for lower priority pods preemption").
        && pod.nominated_node.is_none()
        && !pod.is_daemonset_pod()
        && pod.priority() >= priority_cutoff
        // Its capacity is a ProvisioningRequest's: booked for it, or asked for by the request
        // (cluster-autoscaler leaves such pods out of normal scale-up).
        && pod.consumes_provisioning_request().is_none()
}

/// Batches a burst of pending pods.
#[derive(Debug, Clone)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    opened: Option<Instant>,
    last_new: Option<Instant>,
}

impl Default for Batcher {
    fn default() -> Self {
        Self::new(BATCH_IDLE, BATCH_MAX)
    }
}

impl Batcher {
    /// A batcher closing after `idle` without news or `max` after opening.
    pub fn new(idle: Duration, max: Duration) -> Self {
        Self {
            idle,
            max,
            opened: None,
            last_new: None,
        }
    }

    /// A pending pod not seen before arrived at `now`.
    pub fn saw_new(&mut self, now: Instant) {
        self.opened.get_or_insert(now);
        self.last_new = Some(now);
    }

    /// Whether the open batch is complete at `now` (none is open: false).
    pub fn ready(&self, now: Instant) -> bool {
        match (self.opened, self.last_new) {
            (Some(opened), Some(last)) => {
                now.duration_since(last) >= self.idle || now.duration_since(opened) >= self.max
            }
            _ => false,
        }
    }

    /// When the open batch will be complete if nothing new arrives (for the caller's sleep).
    pub fn deadline(&self) -> Option<Instant> {
        Some((self.last_new? + self.idle).min(self.opened? + self.max))
    }

    /// Closes the batch: the caller plans for everything pending now.
    pub fn close(&mut self) {
        self.opened = None;
        self.last_new = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodRecord {
        PodRecord::of(serde_json::from_value(v).unwrap())
    }

    fn unschedulable(extra_spec: serde_json::Value, meta: serde_json::Value) -> PodRecord {
        let mut spec = json!({"containers": []});
        for (k, v) in extra_spec.as_object().unwrap() {
            spec[k] = v.clone();
        }
        pod(json!({
            "metadata": meta,
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        }))
    }

    #[test]
    fn only_unschedulable_unbound_non_daemonset_pods_above_the_cutoff_want_capacity() {
        let plain = json!({"name": "p"});
        assert!(wants_capacity(
            &unschedulable(json!({}), plain.clone()),
            -10
        ));
        assert!(!wants_capacity(
            &unschedulable(json!({"nodeName": "n1"}), plain.clone()),
            -10
        ));
        assert!(wants_capacity(
            &unschedulable(json!({"priority": -10}), plain.clone()),
            -10
        ));
        assert!(!wants_capacity(
            &unschedulable(json!({"priority": -11}), plain.clone()),
            -10
        ));
        let ds = json!({"name": "d", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]});
        assert!(!wants_capacity(&unschedulable(json!({}), ds), -10));
        let waiting = pod(
            json!({"metadata": {"name": "w"}, "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}]}}),
        );
        assert!(
            !wants_capacity(&waiting, -10),
            "only the Unschedulable reason counts"
        );
        let fresh = pod(json!({"metadata": {"name": "f"}, "spec": {"containers": []}}));
        assert!(
            !wants_capacity(&fresh, -10),
            "not yet looked at by the scheduler"
        );
    }

    #[test]
    fn a_pod_waiting_for_a_preemption_on_its_nominated_node_asks_for_no_capacity() {
        let nominated = pod(json!({
            "metadata": {"name": "important"}, "spec": {"containers": [], "priority": 1000},
            "status": {"phase": "Pending", "nominatedNodeName": "node-3", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}));
        assert_eq!(nominated.nominated_node.as_deref(), Some("node-3"));
        assert!(!wants_capacity(&nominated, -10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_closes_after_a_quiet_second_or_ten_seconds_at_most() {
        let mut b = Batcher::default();
        let t0 = Instant::now();
        assert!(!b.ready(t0));
        b.saw_new(t0);
        assert!(!b.ready(t0 + Duration::from_millis(999)));
        assert!(b.ready(t0 + Duration::from_secs(1)));
        // A steady trickle keeps it open, but not past 10 s.
        b.close();
        for ms in (0..=9_900).step_by(500) {
            b.saw_new(t0 + Duration::from_millis(ms));
            if ms < 9_500 {
                assert!(!b.ready(t0 + Duration::from_millis(ms)));
            }
        }
        assert!(b.ready(t0 + Duration::from_secs(10)));
        assert_eq!(b.deadline(), Some(t0 + Duration::from_secs(10)));
        b.close();
        assert_eq!(b.deadline(), None);
    }
}
