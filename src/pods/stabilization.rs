//! `consolidation.stabilizationWindow`: whether the cluster's demand rose lately.
//!
//! Consolidation frees capacity the pods do not need *now*. While demand grows, that capacity is
//! needed again minutes later: the move evicts pods, and a scale-up launches a node much like the
//! one removed (the delete-then-re-provision churn Karpenter's users report; see
//! `round4-anchors.md` 1.9). Kubernetes' HorizontalPodAutoscaler meets the same problem with a
//! scale-down stabilization window; this is the same idea for nodes: a node whose pods would have
//! to move is consolidated only once the pods' requests have not risen within the window. Empty
//! nodes are not held: removing them evicts nothing.
//!
//! [`Demand::of`] sums the requests (cpu and memory) of every pod that wants a node: bound or
//! pending, not terminating, not a DaemonSet's (those come and go with the nodes themselves).
//! [`DemandWindow::observe`] keeps the sums of the passes within the window and says whether
//! the latest is above any of them.

use super::record::PodRecord;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The requests of the pods that want a node, at one moment (millicores, milli-bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    /// Σ cpu requests.
    pub cpu: i128,
    /// Σ memory requests.
    pub memory: i128,
}

impl Demand {
    /// The demand of `pods`: every pod not terminating and not a DaemonSet's, bound or pending.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Arc<PodRecord>>) -> Self {
        let mut d = Demand::default();
        for p in pods {
            if p.terminating || p.controller.as_ref().is_some_and(|c| c.kind == "DaemonSet") {
                continue;
            }
            let r = &p.shape.facts.requests;
            d.cpu += r.get("cpu").copied().unwrap_or(0);
            d.memory += r.get("memory").copied().unwrap_or(0);
        }
        d
    }

    /// Whether `self` asks for more of either resource than `other`.
    fn above(&self, other: &Demand) -> bool {
        self.cpu > other.cpu || self.memory > other.memory
    }
}

/// The demand seen by the passes within the window, oldest first.
#[derive(Debug, Default)]
pub struct DemandWindow {
    seen: VecDeque<(Instant, Demand)>,
}

impl DemandWindow {
    /// Records `now`'s demand and says whether it rose within `window`: whether it is above the
    /// demand of any pass seen in the last `window`. A zero window is off: never rising, nothing
    /// kept. The first pass has nothing to compare with and is not rising (a controller that
    /// just started holds nothing back for a rise it did not see).
    pub fn observe(&mut self, now: Instant, demand: Demand, window: Duration) -> bool {
        if window.is_zero() {
            self.seen.clear();
            return false;
        }
        while let Some((t, _)) = self.seen.front() {
            if now.saturating_duration_since(*t) > window {
                self.seen.pop_front();
            } else {
                break;
            }
        }
        let rising = self.seen.iter().any(|(_, d)| demand.above(d));
        self.seen.push_back((now, demand));
        rising
    }

    /// How many passes' demand is kept.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(cpu: i128, memory: i128) -> Demand {
        Demand { cpu, memory }
    }

    const W: Duration = Duration::from_secs(600);

    #[test]
    fn demand_that_grew_within_the_window_is_rising_and_flat_or_falling_demand_is_not() {
        let t0 = Instant::now();
        let mut w = DemandWindow::default();
        assert!(!w.observe(t0, d(4000, 8), W), "the first pass sees no rise");
        assert!(!w.observe(t0 + Duration::from_secs(10), d(4000, 8), W));
        assert!(!w.observe(t0 + Duration::from_secs(20), d(3000, 8), W));
        assert!(w.observe(t0 + Duration::from_secs(30), d(3500, 8), W));
        // Memory alone rising is a rise.
        assert!(w.observe(t0 + Duration::from_secs(40), d(3000, 9), W));
    }

    #[test]
    fn a_rise_older_than_the_window_no_longer_holds() {
        let t0 = Instant::now();
        let mut w = DemandWindow::default();
        w.observe(t0, d(1000, 1), W);
        assert!(w.observe(t0 + Duration::from_secs(60), d(2000, 1), W));
        // Flat since: rising until the low sample leaves the window.
        assert!(w.observe(t0 + Duration::from_secs(600), d(2000, 1), W));
        assert!(!w.observe(t0 + Duration::from_secs(601), d(2000, 1), W));
        assert_eq!(w.len(), 3, "the samples of the last 10 min are kept");
    }

    #[test]
    fn a_zero_window_is_off_and_keeps_nothing() {
        let t0 = Instant::now();
        let mut w = DemandWindow::default();
        w.observe(t0, d(1, 1), W);
        assert!(!w.observe(t0 + Duration::from_secs(1), d(9, 9), Duration::ZERO));
        assert!(w.is_empty());
    }

    fn pod(name: &str, kind: &str, cpu: &str, memory: &str, terminating: bool) -> Arc<PodRecord> {
        let mut meta = serde_json::json!({"name": name, "namespace": "default", "uid": name,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": "owner", "uid": "u", "controller": true}]});
        if terminating {
            meta["deletionTimestamp"] = serde_json::json!("2026-11-28T00:00:00Z");
        }
        Arc::new(PodRecord::of(
            serde_json::from_value(
                serde_json::json!({"metadata": meta, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}),
            )
            .unwrap(),
        ))
    }

    #[test]
    fn terminating_and_daemon_set_pods_are_not_demand_and_pending_pods_are() {
        let pods = [
            pod("web-1", "ReplicaSet", "500m", "1Gi", false),
            pod("web-2", "ReplicaSet", "250m", "1Gi", true),
            pod("agent-1", "DaemonSet", "100m", "128Mi", false),
            pod("batch-1", "ReplicaSet", "2", "4Gi", false),
        ];
        let one = Demand::of(&pods[..1]);
        let all = Demand::of(&pods);
        assert_eq!(all.cpu, 5 * one.cpu, "500m and 2 cpu only");
        assert_eq!(all.memory, 5 * one.memory, "1Gi and 4Gi only");
    }
}
