//! cluster-autoscaler's node group backoff, the one rule every backoff after a failure of a
//! group's new nodes follows (a provisioning timeout, a replace's node that did not come, a
//! scale-up that did not help, an offering Azure had no capacity for): 5 min
//! (`--initial-node-group-backoff-duration`), doubling per failure in a row up to 30 min
//! (`--max-node-group-backoff-duration`), from 5 min again after 3 h without one
//! (`--node-group-backoff-reset-timeout`).

use std::collections::HashMap;
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

/// Per group, failures of its new nodes and the backoff they earn (the rule above).
#[derive(Debug, Default)]
pub struct GroupBackoff {
    /// Failures in a row per group, when the last was, and until when it backs the group off.
    failures: HashMap<String, (u32, Instant, Instant)>,
}

impl GroupBackoff {
    /// Records a failure of `group` at `now`: until when it is backed off.
    pub fn fail(&mut self, group: &str, now: Instant) -> Instant {
        let previous = self
            .failures
            .get(group)
            .map(|&(count, last, _)| (count, last));
        let count = failures_in_row(previous, now);
        let until = now + after(count);
        self.failures.insert(group.to_string(), (count, now, until));
        until
    }

    /// Until when `group` is backed off at `now`, if it is.
    pub fn until(&self, group: &str, now: Instant) -> Option<Instant> {
        self.failures
            .get(group)
            .map(|&(_, _, until)| until)
            .filter(|until| now < *until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_backoff_doubles_per_failure_in_a_row_up_to_30_min_and_starts_over_after_3_h() {
        let t0 = Instant::now();
        let at = |mins: u64| t0 + Duration::from_secs(mins * 60);
        let mut b = GroupBackoff::default();
        assert_eq!(b.until("g", at(0)), None);
        assert_eq!(b.fail("g", at(0)), at(5));
        assert_eq!(b.until("g", at(4)), Some(at(5)));
        assert_eq!(b.until("g", at(5)), None, "over at its end");
        assert_eq!(b.until("other", at(4)), None, "one group's failure only");
        assert_eq!(b.fail("g", at(10)), at(20));
        assert_eq!(b.fail("g", at(20)), at(40));
        assert_eq!(b.fail("g", at(40)), at(70), "30 min at most");
        assert_eq!(b.fail("g", at(70)), at(100));
        assert_eq!(
            b.fail("g", at(70 + 180)),
            at(70 + 180 + 5),
            "3 h without one"
        );
    }

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
