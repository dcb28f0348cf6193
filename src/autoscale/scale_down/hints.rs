//! Writing the deletion-cost hints a consolidation decision planned
//! ([`crate::pods::deletion_cost`]) beside the passes, not inside them: up to 100 guarded pod
//! patches, one after another, would otherwise hold a pass as long as a slow API server takes.
//! One batch is in flight at a time. A decision that plans hints while the last batch is still
//! being written drops its own: the next decision plans them again from what it reads then (each
//! write carries the `resourceVersion` it was planned from, so a batch planned from a stale read
//! could only meet 409s). A replica that stands down, or a loop that stops, aborts the batch in
//! flight: a hint only orders a scale-in, and the next leader plans its own.

use super::beside::Beside;
use crate::kube::nodes::AnnotateOutcome;
use crate::metrics::Metrics;
use crate::pods::deletion_cost::HintWrite;
use std::future::Future;
use std::sync::Arc;
use tracing::{debug, warn};

/// The batch of hints being written, if any.
#[derive(Debug, Default)]
pub(super) struct HintWriter {
    task: Beside,
}

impl HintWriter {
    /// Starts writing `hints` with `write`, one after another, in a task of its own; each
    /// outcome is counted in `deletion_cost_hints_total{action, result}`. Returns at once: true
    /// when the batch started (or there was nothing to write), false when it was dropped because
    /// the last batch is still being written.
    pub(super) fn submit<W, F>(
        &mut self,
        hints: Vec<HintWrite>,
        metrics: Arc<Metrics>,
        write: W,
    ) -> bool
    where
        W: Fn(HintWrite) -> F + Send + 'static,
        F: Future<Output = AnnotateOutcome> + Send,
    {
        if hints.is_empty() {
            return true;
        }
        if self.busy() {
            debug!(
                hints = hints.len(),
                "deletion-cost hints not written: the last decision's are still being written; the next decision plans them again"
            );
            return false;
        }
        self.task.start(async move {
            let (mut set, mut cleared) = (0usize, 0usize);
            for h in hints {
                let action = if h.sets() { "set" } else { "clear" };
                let (namespace, pod) = (h.namespace.clone(), h.pod.clone());
                let outcome = write(h).await;
                metrics
                    .deletion_cost_hints_total
                    .with_label_values(&[action, outcome.metric_label()])
                    .inc();
                match outcome {
                    AnnotateOutcome::Written if action == "set" => set += 1,
                    AnnotateOutcome::Written => cleared += 1,
                    AnnotateOutcome::Conflict | AnnotateOutcome::Gone => {
                        debug!(%namespace, %pod, result = outcome.metric_label(), "deletion-cost hint not written: looked at again at the next decision");
                    }
                    AnnotateOutcome::Failed(why) => {
                        warn!(%namespace, %pod, error = %why, "deletion-cost hint not written");
                    }
                }
            }
            if set + cleared > 0 {
                debug!(set, cleared, "deletion-cost hints written");
            }
        })
    }

    /// Whether a batch is still being written.
    pub(super) fn busy(&self) -> bool {
        self.task.busy()
    }

    /// Aborts the batch in flight (its writes not yet sent are not sent).
    pub(super) fn stop(&mut self) {
        self.task.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn hint(pod: &str) -> HintWrite {
        HintWrite {
            namespace: "default".into(),
            pod: pod.into(),
            resource_version: "7".into(),
            annotations: BTreeMap::from([(
                crate::pods::record::POD_DELETION_COST.to_string(),
                Some("-1".to_string()),
            )]),
        }
    }

    /// A writer that takes a second per pod and records what it wrote.
    fn slow(
        written: &Arc<Mutex<Vec<String>>>,
    ) -> impl Fn(HintWrite) -> std::pin::Pin<Box<dyn Future<Output = AnnotateOutcome> + Send>>
           + Send
           + 'static {
        let written = written.clone();
        move |h: HintWrite| {
            let written = written.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                written.lock().push(h.pod);
                AnnotateOutcome::Written
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_written_beside_the_pass_and_one_planned_meanwhile_waits_for_the_next_decision(
    ) {
        let metrics = Arc::new(Metrics::new());
        let written = Arc::new(Mutex::new(Vec::new()));
        let mut w = HintWriter::default();
        let started = tokio::time::Instant::now();
        assert!(w.submit(
            vec![hint("a"), hint("b"), hint("c")],
            metrics.clone(),
            slow(&written)
        ));
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "submit does not wait for the writes"
        );
        assert!(w.busy());
        // A decision meanwhile: its batch is dropped, the first goes on.
        assert!(!w.submit(vec![hint("x")], metrics.clone(), slow(&written)));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert!(!w.busy());
        assert_eq!(*written.lock(), ["a", "b", "c"]);
        assert_eq!(
            Metrics::counter_sum(
                &metrics.deletion_cost_hints_total,
                &[("action", "set"), ("result", "ok")]
            ),
            3
        );
        // The next decision's batch goes.
        assert!(w.submit(vec![hint("d")], metrics.clone(), slow(&written)));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(*written.lock(), ["a", "b", "c", "d"]);
    }

    #[tokio::test(start_paused = true)]
    async fn standing_down_stops_the_batch_in_flight() {
        let metrics = Arc::new(Metrics::new());
        let written = Arc::new(Mutex::new(Vec::new()));
        let mut w = HintWriter::default();
        assert!(w.submit(
            vec![hint("a"), hint("b"), hint("c")],
            metrics.clone(),
            slow(&written)
        ));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        w.stop();
        assert!(!w.busy());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(*written.lock(), ["a"], "nothing written after the stop");
        assert!(
            w.submit(Vec::new(), metrics, slow(&written)),
            "nothing to write"
        );
    }
}
