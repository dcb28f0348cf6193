//! Following a write's long-running operation (`Azure-AsyncOperation`) to its end: one poller
//! for capacity writes (followed in the background) and instance deletes (followed by the
//! caller, who is not done until Azure is).

use super::{Inner, LRO_DEADLINE, LRO_MIN_POLL};
use crate::azure::arm::{OperationError, OperationStatus};
use crate::azure::budget::{BudgetClass, Pacing};
use crate::azure::ArmError;
use crate::resource::CapacityResource;
use std::time::Duration;
use tokio::time::Instant;

/// Polls that may fail in a row before the operation's end is given up as unknown.
const POLL_ERRORS_TOLERATED: u32 = 5;

/// How an operation ended, as far as this side could learn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OperationEnd {
    /// Azure says it succeeded.
    Succeeded,
    /// Azure says it failed or was canceled (its error).
    Failed(OperationError),
    /// Its end could not be learnt: polls kept failing, or it ran past [`LRO_DEADLINE`].
    Unknown(String),
}

impl Inner {
    /// Polls `url` every `hint` (at least [`LRO_MIN_POLL`]) until the operation ends, Azure
    /// throttles us (then after its `Retry-After`), at most [`LRO_DEADLINE`]; counts `lro_total`
    /// by how it ended (`succeeded`, `failed`, `timeout`, `error`).
    pub(super) async fn follow_operation(
        &self,
        resource: &dyn CapacityResource,
        url: &str,
        hint: Option<Duration>,
    ) -> OperationEnd {
        let interval = hint.unwrap_or(LRO_MIN_POLL).max(LRO_MIN_POLL);
        let deadline = Instant::now() + LRO_DEADLINE;
        let mut errors = 0u32;
        let (end, label) = loop {
            // Below the reserve of the reads budget, polls come less often too.
            let stretch = Pacing {
                reserve: self.settings.arm_budget_reserve,
            }
            .stretch(self.arm.budget().fraction(BudgetClass::Reads));
            tokio::time::sleep(interval.mul_f64(stretch)).await;
            if Instant::now() > deadline {
                break (
                    OperationEnd::Unknown("the operation did not end in time".into()),
                    "timeout",
                );
            }
            match resource.poll_operation(url).await {
                // A poll answered: the errors before it were not in a row with the next.
                Ok(OperationStatus::InProgress) => errors = 0,
                Ok(OperationStatus::Succeeded) => break (OperationEnd::Succeeded, "succeeded"),
                Ok(OperationStatus::Failed(e)) => break (OperationEnd::Failed(e), "failed"),
                Ok(OperationStatus::Canceled) => {
                    let canceled = OperationError {
                        code: "Canceled".into(),
                        message: String::new(),
                    };
                    break (OperationEnd::Failed(canceled), "failed");
                }
                Err(ArmError::Throttled { retry_after, .. }) => {
                    tokio::time::sleep(retry_after).await
                }
                Err(e) => {
                    errors += 1;
                    if errors >= POLL_ERRORS_TOLERATED {
                        break (
                            OperationEnd::Unknown(format!(
                                "the operation could not be polled: {e}"
                            )),
                            "error",
                        );
                    }
                }
            }
        };
        self.metrics.lro_total.with_label_values(&[label]).inc();
        end
    }
}
