//! Sending the soft-taint writes a pass planned ([`crate::pods::soft_taint::plan`]) beside the
//! passes: each is a read and a patch guarded by the read's `resourceVersion`
//! ([`crate::kube::nodes::NodeActions::soft_taint`]). As cluster-autoscaler bounds them by
//! `--max-bulk-soft-taint-time`, writes not started within `maxBulkSoftTaintTime` of the batch's
//! start are skipped; the next pass plans them again from what it reads then.

use super::beside::Beside;
use crate::kube::nodes::NodeWriteError;
use crate::metrics::Metrics;
use crate::pods::soft_taint::SoftTaintWrite;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

/// The batch of soft-taint writes in flight, if any.
#[derive(Debug, Default)]
pub(super) struct SoftTaintWriter {
    task: Beside,
}

impl SoftTaintWriter {
    /// Starts sending `writes` with `write`, one after another, in a task of its own; those not
    /// started `within` of the start are skipped. Each outcome is counted in
    /// `soft_taint_writes_total{action, result}`. False when the last batch is still in flight
    /// (this one is dropped).
    pub(super) fn submit<W, F>(
        &mut self,
        writes: Vec<SoftTaintWrite>,
        within: Duration,
        metrics: Arc<Metrics>,
        write: W,
    ) -> bool
    where
        W: Fn(SoftTaintWrite) -> F + Send + 'static,
        F: Future<Output = Result<bool, NodeWriteError>> + Send,
    {
        if writes.is_empty() {
            return true;
        }
        if self.busy() {
            debug!(
                writes = writes.len(),
                "soft taints not written: the last pass's are still being written"
            );
            return false;
        }
        self.task.start(async move {
            let start = Instant::now();
            for w in writes {
                let action = if w.on { "add" } else { "remove" };
                let count = |result: &str| {
                    metrics
                        .soft_taint_writes_total
                        .with_label_values(&[action, result])
                        .inc();
                };
                if start.elapsed() >= within {
                    count("skipped");
                    continue;
                }
                let node = w.node.clone();
                match write(w).await {
                    Ok(true) => {
                        count("ok");
                        debug!(%node, action, "soft taint written");
                    }
                    Ok(false) => count("unchanged"),
                    Err(e) => {
                        count(e.metric_label());
                        match e {
                            NodeWriteError::NotFound(_) => {}
                            e => warn!(%node, action, error = %e, "soft taint not written"),
                        }
                    }
                }
            }
        })
    }

    /// Whether a batch is still being written.
    pub(super) fn busy(&self) -> bool {
        self.task.busy()
    }

    /// Aborts the batch in flight.
    pub(super) fn stop(&mut self) {
        self.task.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    fn w(node: &str, on: bool) -> SoftTaintWrite {
        SoftTaintWrite {
            node: node.into(),
            on,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_not_started_within_the_time_budget_are_skipped_and_counted() {
        let metrics = Arc::new(Metrics::new());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let mut writer = SoftTaintWriter::default();
        let log = sent.clone();
        let started = Instant::now();
        assert!(writer.submit(
            vec![w("a", false), w("b", true), w("c", true), w("gone", true)],
            Duration::from_secs(3),
            metrics.clone(),
            move |x: SoftTaintWrite| {
                let log = log.clone();
                async move {
                    // A slow API server: two seconds a write.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    log.lock().push(x.node.clone());
                    if x.node == "gone" {
                        Err(NodeWriteError::NotFound(x.node))
                    } else {
                        Ok(x.node != "b")
                    }
                }
            },
        ));
        assert_eq!(started.elapsed(), Duration::ZERO, "beside the pass");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!writer.busy());
        assert_eq!(*sent.lock(), ["a", "b"], "the third began past 3 s");
        let n = |action: &str, result: &str| {
            Metrics::counter_sum(
                &metrics.soft_taint_writes_total,
                &[("action", action), ("result", result)],
            )
        };
        assert_eq!(n("remove", "ok"), 1);
        assert_eq!(n("add", "unchanged"), 1);
        assert_eq!(n("add", "skipped"), 2);
    }
}
