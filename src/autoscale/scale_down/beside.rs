//! Writes beside the passes, not inside them: a batch of Kubernetes writes (deletion-cost hints,
//! soft taints) runs in a task of its own, so a slow API server does not hold a pass. One batch
//! of a kind at a time: the loop drops what it planned while the last batch is still in flight
//! and plans again at a later pass from a fresh read.

use std::future::Future;
use tokio::task::JoinHandle;

/// The batch in flight, if any.
#[derive(Debug, Default)]
pub(super) struct Beside {
    task: Option<JoinHandle<()>>,
}

impl Beside {
    /// Starts `batch` in a task of its own unless the last batch is still running; whether it
    /// started.
    pub(super) fn start(&mut self, batch: impl Future<Output = ()> + Send + 'static) -> bool {
        if self.busy() {
            return false;
        }
        self.task = Some(tokio::spawn(batch));
        true
    }

    /// Whether a batch is still running.
    pub(super) fn busy(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Aborts the batch in flight (its writes not yet sent are not sent).
    pub(super) fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
