//! cluster-autoscaler's node group backoff, the one rule every backoff after a failure of a
//! group's new nodes follows (a provisioning timeout, a replace's node that did not come, a
//! scale-up that did not help, an offering Azure had no capacity for): 5 min
//! (`--initial-node-group-backoff-duration`), doubling per failure in a row up to 30 min
//! (`--max-node-group-backoff-duration`), from 5 min again after 3 h without one
//! (`--node-group-backoff-reset-timeout`).

use std::time::Duration;
use tokio::time::Instant;

/// The first backoff.
pub const INITIAL: Duration = Duration::from_secs(5 * 60);
/// The longest.
pub const MAX: Duration = Duration::from_secs(30 * 60);
/// After this long without a failure, the next backoff is the first again.
pub const RESET: Duration = Duration::from_secs(3 * 60 * 60);

/// How many failures in a row a failure at `now` makes after `previous` (their count and when
/// the last was): from 1 again after [`RESET`] without one.
pub fn failures_in_row(previous: Option<(u32, Instant)>, now: Instant) -> u32 {
    match previous {
        Some((count, last)) if now.saturating_duration_since(last) < RESET => {
            count.saturating_add(1)
        }
        _ => 1,
    }
}

/// The backoff `failures` in a row earn (the first is 1): [`INITIAL`], doubling per failure up
/// to [`MAX`].
pub fn after(failures: u32) -> Duration {
    INITIAL
        .saturating_mul(1 << failures.saturating_sub(1).min(8))
        .min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_per_failure_in_a_row_to_thirty_minutes() {
        let mins: Vec<u64> = (1..=6).map(|n| after(n).as_secs() / 60).collect();
        assert_eq!(mins, [5, 10, 20, 30, 30, 30]);
        assert_eq!(after(u32::MAX), MAX);
    }

    #[test]
    fn a_failure_after_three_quiet_hours_starts_the_count_over() {
        let t0 = Instant::now();
        assert_eq!(failures_in_row(None, t0), 1);
        assert_eq!(failures_in_row(Some((3, t0)), t0 + RESET / 2), 4);
        assert_eq!(failures_in_row(Some((3, t0)), t0 + RESET), 1);
    }
}
