//! The drain of the nodes a removal takes: each tainted (our `NoSchedule` taint and cordon,
//! under the `resourceVersion` the decision read), `nodeDeleteDelayAfterTaint` waited, each
//! re-checked ([`Shared::recheck`]) and drained through the Eviction API (a budget's 429 retried
//! every [`EVICTION_RETRY`] until `maxPodEvictionTime` while the pods left still have room
//! elsewhere, [`Shared::room_left`]; then the evicted pods must be gone); a node whose re-check
//! or drain fails is untainted ([`Shared::abort`]) and stays, with the pods it still runs.

use super::{node_ref, pod_name, wait, Removal, Shared};
use crate::autoscale::scale_up::pod_ref;
use crate::kube::nodes::{EvictOutcome, NodeActions};
use crate::metrics::Metrics;
use crate::notify::{ControllerEvent, EventSink, ObjectRef};
use crate::pods::record::PodRecord;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Between two rounds of evictions a budget refused (cluster-autoscaler retries every 5 s).
pub const EVICTION_RETRY: Duration = Duration::from_secs(5);
/// How often a drain looks whether the evicted pods are gone.
const GONE_POLL: Duration = Duration::from_millis(500);

impl Shared {
    /// Taints each node of `removals` (a 409: the node changed since the pass read it, and the
    /// next pass decides again), waits `nodeDeleteDelayAfterTaint`, then re-checks and drains
    /// each. Returns the nodes ready for their delete; `None` when shutdown came during the wait
    /// (every tainted node untainted).
    pub(super) async fn taint_and_drain(
        &self,
        removals: Vec<Removal>,
        shutdown: &CancellationToken,
    ) -> Option<Vec<(Removal, ObjectRef)>> {
        let mut tainted = Vec::with_capacity(removals.len());
        for r in removals {
            let nref = node_ref(&r.node, self.node(&r.node).as_deref());
            if let Err(e) = self.actions.taint(&r.node, &r.resource_version).await {
                debug!(node = %r.node, error = %e, "taint not written");
                self.count_failed(&r, "taint");
                continue;
            }
            self.events.record(ControllerEvent::ScaleDown {
                object: nref.clone(),
                note: format!(
                    "marked the node as toBeDeleted/unschedulable ({}, node group {})",
                    r.reason(),
                    r.group.name
                ),
            });
            tainted.push((r, nref));
        }
        if tainted.is_empty() {
            return Some(Vec::new());
        }
        let delay = self.settings.scale_down.node_delete_delay_after_taint;
        if !wait(delay, shutdown).await {
            for (r, nref) in &tainted {
                self.abort(r, nref, "aborted", "the controller is shutting down")
                    .await;
            }
            return None;
        }
        let mut ready = Vec::with_capacity(tainted.len());
        for (r, nref) in tainted {
            let checked = match self.recheck(&r) {
                Ok(()) if !r.pods.is_empty() => self.drain(&r, shutdown).await,
                Ok(()) => Ok(()),
                Err(why) => Err(("aborted", why)),
            };
            match checked {
                Ok(()) => ready.push((r, nref)),
                Err((label, why)) => self.abort(&r, &nref, label, &why).await,
            }
        }
        Some(ready)
    }

    /// The pods on `node` that a removal has to move (not DaemonSet or mirror pods, nor pods
    /// deleted long ago that no kubelet confirms: [`PodRecord::long_terminating`]).
    pub(super) fn pods_on(&self, node: &str) -> Vec<Arc<PodRecord>> {
        let now = self.wall();
        self.cluster
            .pods
            .snapshot()
            .values()
            .filter(|p| p.node_name.as_deref() == Some(node))
            .filter(|p| !p.is_daemonset_pod() && !p.is_mirror() && !p.long_terminating(now))
            .cloned()
            .collect()
    }

    /// Drains `r`'s node ([`Drain::run`]) with this loop's calls, metrics and Events; when it
    /// stops, the label `failed_scale_downs_total` counts it under (`aborted`: the pods left
    /// lost their room, [`Shared::room_left`]; `drain_failed`: any other end) and why.
    async fn drain(
        &self,
        r: &Removal,
        shutdown: &CancellationToken,
    ) -> Result<(), (&'static str, String)> {
        Drain {
            actions: self.actions.as_ref(),
            metrics: &self.metrics,
            events: self.events.as_ref(),
            limit: self.settings.scale_down.max_pod_eviction_time,
            leading: &|| self.reconciler.may_write(),
            pods_on: &|| self.pods_on(&r.node),
            room_left: &|| self.room_left(r),
        }
        .run(&r.node, shutdown)
        .await
        .map_err(|end| match end {
            DrainEnd::NoRoom(why) => ("aborted", why),
            DrainEnd::Failed(why) => ("drain_failed", why),
        })
    }

    /// A removal that stops: the node is untainted (retried each pass if that fails) and stays.
    pub(super) async fn abort(
        &self,
        r: &Removal,
        nref: &ObjectRef,
        label: &'static str,
        why: &str,
    ) {
        warn!(node = %r.node, scale_set = %r.group.name, reason = label, %why, "scale-down stopped; the node stays");
        self.count_failed(r, label);
        self.events.record(ControllerEvent::ScaleDownFailed {
            object: nref.clone(),
            why: format!("scale-down stopped, node untainted: {why}"),
        });
        if !self.untaint(&r.node).await {
            self.flight.lock().untaint.insert(r.node.clone());
        }
    }

    /// Removes our taint from `node`; whether it is off (a node gone is).
    pub(super) async fn untaint(&self, node: &str) -> bool {
        match self.actions.untaint(node).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                warn!(%node, error = %e, "untaint failed; retrying next pass");
                false
            }
        }
    }

    /// Counts a removal that stopped under `label` in `failed_scale_downs_total`.
    pub(super) fn count_failed(&self, r: &Removal, label: &str) {
        self.metrics
            .failed_scale_downs_total
            .with_label_values(&[&r.group.name, label])
            .inc();
    }
}

/// What one drain needs: the calls, where it reports, and what it looks at as it goes.
pub(super) struct Drain<'a> {
    pub(super) actions: &'a dyn NodeActions,
    pub(super) metrics: &'a Metrics,
    pub(super) events: &'a dyn EventSink,
    /// `maxPodEvictionTime`: how long refused evictions are retried, and again how long the
    /// evicted pods may take to be gone.
    pub(super) limit: Duration,
    /// Whether this replica may still write (a drain stops when it no longer leads).
    pub(super) leading: &'a (dyn Fn() -> bool + Sync),
    /// The pods on the node that have to move, as the cluster shows them now.
    pub(super) pods_on: &'a (dyn Fn() -> Vec<Arc<PodRecord>> + Sync),
    /// Whether the pods still on the node have room elsewhere, as the cluster is now
    /// ([`crate::pods::recheck::room_left`]); asked before each round after the first.
    pub(super) room_left: &'a (dyn Fn() -> Result<(), String> + Sync),
}

/// Why a drain stopped.
#[derive(Debug, PartialEq)]
pub(super) enum DrainEnd {
    /// Room the pods left on the node counted on was taken while the drain went on: the node
    /// stays, and they with it.
    NoRoom(String),
    /// Anything else: refusals past `maxPodEvictionTime`, pods that never left, leadership
    /// lost, shutdown.
    Failed(String),
}

impl Drain<'_> {
    /// Evicts the node's pods (a refused eviction, a budget's 429, is retried every
    /// [`EVICTION_RETRY`] until `limit`, each round after the first only while the pods left
    /// still have room elsewhere), then waits, as long again at most, for them to be gone.
    pub(super) async fn run(
        &self,
        node: &str,
        shutdown: &CancellationToken,
    ) -> Result<(), DrainEnd> {
        let deadline = Instant::now() + self.limit;
        let mut left: Vec<Arc<PodRecord>> = (self.pods_on)();
        loop {
            if !(self.leading)() {
                return Err(DrainEnd::Failed("this replica stopped leading".into()));
            }
            let (refused, last) = self.evict_each(node, left).await;
            if refused.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(DrainEnd::Failed(format!(
                    "{} pod(s) could not be evicted within maxPodEvictionTime ({}s); last: {last}",
                    refused.len(),
                    self.limit.as_secs()
                )));
            }
            if !wait(EVICTION_RETRY, shutdown).await {
                return Err(DrainEnd::Failed("the controller is shutting down".into()));
            }
            (self.room_left)().map_err(DrainEnd::NoRoom)?;
            left = refused;
        }
        self.gone(shutdown).await.map_err(DrainEnd::Failed)
    }

    /// One round of evictions: the pods refused (blocked by a budget, or failed) and the last
    /// refusal's text.
    async fn evict_each(
        &self,
        node: &str,
        pods: Vec<Arc<PodRecord>>,
    ) -> (Vec<Arc<PodRecord>>, String) {
        let mut refused = Vec::new();
        let mut last = String::new();
        for p in pods {
            let (ns, name) = (p.namespace.as_str(), p.name.as_str());
            let outcome = self.actions.evict(ns, name, p.uid.as_deref()).await;
            let label = match &outcome {
                EvictOutcome::Evicted => "evicted",
                EvictOutcome::Blocked(_) => "blocked",
                EvictOutcome::Gone => "gone",
                EvictOutcome::Failed(_) => "failed",
            };
            self.metrics
                .evicted_pods_total
                .with_label_values(&[label])
                .inc();
            match outcome {
                EvictOutcome::Evicted => {
                    debug!(%node, pod = %pod_name(&p), "pod evicted");
                    self.events.record(ControllerEvent::ScaleDown {
                        object: pod_ref(&p),
                        note: format!("deleting pod for node scale down (node {node})"),
                    });
                }
                EvictOutcome::Gone => {}
                EvictOutcome::Blocked(why) | EvictOutcome::Failed(why) => {
                    last = format!("{}: {why}", pod_name(&p));
                    refused.push(p);
                }
            }
        }
        (refused, last)
    }

    /// Waits, `limit` at most, for the evicted pods to be gone from the node.
    async fn gone(&self, shutdown: &CancellationToken) -> Result<(), String> {
        let gone_by = Instant::now() + self.limit;
        loop {
            let still = (self.pods_on)();
            if still.is_empty() {
                return Ok(());
            }
            if Instant::now() >= gone_by {
                return Err(format!(
                    "evicted pods still on the node after {}s (first: {})",
                    self.limit.as_secs(),
                    pod_name(&still[0])
                ));
            }
            if !wait(GONE_POLL, shutdown).await {
                return Err("the controller is shutting down".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::nodes::{FreshNode, NodeWriteError};
    use crate::notify::NoEvents;
    use crate::pods::record::NodeRecord;
    use parking_lot::Mutex;
    use serde_json::json;
    use std::collections::{HashMap, HashSet};

    fn pod(name: &str) -> Arc<PodRecord> {
        Arc::new(PodRecord::of(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            }))
            .unwrap(),
        ))
    }

    /// The Eviction API in memory: pods a budget protects are refused (429) until released;
    /// an evicted pod leaves the node at once unless `lingering`.
    #[derive(Default)]
    struct Cluster {
        on_node: Mutex<Vec<Arc<PodRecord>>>,
        protected: Mutex<HashSet<String>>,
        lingering: bool,
        evictions: Mutex<HashMap<String, u32>>,
        /// What the room check answers: room taken once set.
        room_taken: Mutex<Option<String>>,
    }

    #[async_trait::async_trait]
    impl NodeActions for Cluster {
        async fn taint(&self, _: &str, _: &str) -> Result<(), NodeWriteError> {
            Ok(())
        }
        async fn untaint(&self, _: &str) -> Result<(), NodeWriteError> {
            Ok(())
        }
        async fn soft_taint(&self, _: &str, _: bool) -> Result<bool, NodeWriteError> {
            unreachable!("a drain soft-taints no node")
        }
        async fn evict(&self, _: &str, pod: &str, _: Option<&str>) -> EvictOutcome {
            *self.evictions.lock().entry(pod.to_string()).or_default() += 1;
            if self.protected.lock().contains(pod) {
                return EvictOutcome::Blocked(
                    "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                );
            }
            if !self.lingering {
                self.on_node.lock().retain(|p| p.name != pod);
            }
            EvictOutcome::Evicted
        }
        async fn tainted_nodes(&self) -> Result<Vec<String>, NodeWriteError> {
            Ok(Vec::new())
        }
        async fn fresh(&self, _: &str) -> Result<FreshNode, NodeWriteError> {
            Ok(FreshNode {
                node: None,
                pods: Vec::new(),
            })
        }
        async fn list_nodes(&self) -> Result<Vec<NodeRecord>, NodeWriteError> {
            Ok(Vec::new())
        }
        async fn annotate_pod(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: &std::collections::BTreeMap<String, Option<String>>,
        ) -> crate::kube::nodes::AnnotateOutcome {
            unreachable!("a drain annotates no pod")
        }
    }

    impl Cluster {
        fn with(pods: &[&str], protected: &[&str]) -> Self {
            Self {
                on_node: Mutex::new(pods.iter().map(|p| pod(p)).collect()),
                protected: Mutex::new(protected.iter().map(|p| p.to_string()).collect()),
                ..Self::default()
            }
        }

        async fn drain(&self, metrics: &Metrics, leading: bool) -> Result<(), String> {
            self.drain_to_end(metrics, leading)
                .await
                .map_err(|end| match end {
                    DrainEnd::Failed(why) => why,
                    DrainEnd::NoRoom(why) => panic!("no room: {why}"),
                })
        }

        async fn drain_to_end(&self, metrics: &Metrics, leading: bool) -> Result<(), DrainEnd> {
            Drain {
                actions: self,
                metrics,
                events: &NoEvents,
                limit: Duration::from_secs(60),
                leading: &|| leading,
                pods_on: &|| self.on_node.lock().clone(),
                room_left: &|| match self.room_taken.lock().clone() {
                    Some(why) => Err(why),
                    None => Ok(()),
                },
            }
            .run("n1", &CancellationToken::new())
            .await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_evicts_every_pod_and_ends_once_they_are_gone() {
        let c = Cluster::with(&["a", "b"], &[]);
        let metrics = Metrics::new();
        assert_eq!(c.drain(&metrics, true).await, Ok(()));
        assert!(c.on_node.lock().is_empty());
        let evicted = metrics.evicted_pods_total.with_label_values(&["evicted"]);
        assert_eq!(evicted.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_whose_budget_forbids_eviction_is_not_drained_past_max_pod_eviction_time() {
        let c = Cluster::with(&["a", "guarded"], &["guarded"]);
        let metrics = Metrics::new();
        let started = Instant::now();
        let why = c.drain(&metrics, true).await.unwrap_err();
        assert!(
            why.contains("1 pod(s) could not be evicted within maxPodEvictionTime (60s)")
                && why.contains("default/guarded"),
            "{why}"
        );
        // Retried every EVICTION_RETRY until the limit, never past it.
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(60) && waited < Duration::from_secs(66));
        assert_eq!(c.evictions.lock()["guarded"], 13);
        assert_eq!(
            c.evictions.lock()["a"],
            1,
            "an evicted pod is not evicted again"
        );
        let blocked = metrics.evicted_pods_total.with_label_values(&["blocked"]);
        assert_eq!(blocked.get(), 13);
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_that_allows_the_eviction_again_lets_the_drain_finish() {
        let c = Arc::new(Cluster::with(&["guarded"], &["guarded"]));
        let release = {
            let c = c.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(12)).await;
                c.protected.lock().clear();
            })
        };
        assert_eq!(c.drain(&Metrics::new(), true).await, Ok(()));
        release.await.unwrap();
        assert_eq!(
            c.evictions.lock()["guarded"],
            4,
            "0 s, 5 s, 10 s refused; 15 s evicted"
        );
    }

    /// Room the decision counted on is taken while a budget paces the drain: the pods left stay
    /// where they run instead of being evicted into a wait for a new node.
    #[tokio::test(start_paused = true)]
    async fn a_drain_whose_pods_left_lost_their_room_evicts_no_more_and_stops() {
        let c = Arc::new(Cluster::with(&["a", "guarded"], &["guarded"]));
        let take = {
            let c = c.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(7)).await;
                *c.room_taken.lock() = Some("default/guarded fits on no other node".into());
            })
        };
        let started = Instant::now();
        let end = c.drain_to_end(&Metrics::new(), true).await;
        take.await.unwrap();
        assert_eq!(
            end,
            Err(DrainEnd::NoRoom(
                "default/guarded fits on no other node".into()
            ))
        );
        assert_eq!(
            c.evictions.lock()["guarded"],
            2,
            "0 s and 5 s refused; at 10 s the room was gone and nothing more was asked"
        );
        assert_eq!(c.evictions.lock()["a"], 1);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_that_evicts_everything_in_its_first_round_never_asks_for_room() {
        let c = Cluster::with(&["a", "b"], &[]);
        *c.room_taken.lock() = Some("asked".into());
        assert_eq!(c.drain_to_end(&Metrics::new(), true).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn evicted_pods_that_never_leave_the_node_fail_the_drain() {
        let c = Cluster {
            lingering: true,
            ..Cluster::with(&["a"], &[])
        };
        let why = c.drain(&Metrics::new(), true).await.unwrap_err();
        assert!(
            why.contains("evicted pods still on the node after 60s (first: default/a)"),
            "{why}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_no_longer_leads_evicts_nothing() {
        let c = Cluster::with(&["a"], &[]);
        let why = c.drain(&Metrics::new(), false).await.unwrap_err();
        assert_eq!(why, "this replica stopped leading");
        assert!(c.evictions.lock().is_empty());
    }
}
