//! Per-pod clocks on the simulation's clock (tokio's): when each pod was first seen in some
//! state (running with work that ends, running and not Ready yet), and when the next one is
//! due. Shared by the kubelets' run ends ([`super::jobs`]) and readiness ([`super::readiness`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

/// One kind of clock, over the passes of the simulation.
#[derive(Debug, Default)]
pub(crate) struct PodClocks {
    since: HashMap<String, Instant>,
    seen: HashSet<String>,
    next: Option<Instant>,
}

impl PodClocks {
    /// Whether `after` has passed since pod `uid` was first seen (its clock starts at `now` the
    /// first time). A clock not due yet counts toward [`PodClocks::end_pass`]'s answer.
    pub(crate) fn elapsed(&mut self, uid: &str, after: Duration, now: Instant) -> bool {
        let since = *self.since.entry(uid.to_string()).or_insert(now);
        self.seen.insert(uid.to_string());
        let due = since + after;
        if now < due {
            self.next = Some(self.next.map_or(due, |n| n.min(due)));
            return false;
        }
        true
    }

    /// Ends a pass: forgets the pods it did not look at. Returns when the next clock is due.
    pub(crate) fn end_pass(&mut self) -> Option<Instant> {
        let seen = std::mem::take(&mut self.seen);
        self.since.retain(|uid, _| seen.contains(uid));
        self.next.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_clock_starts_when_first_seen_is_due_after_its_time_and_is_forgotten_when_unseen() {
        let mut c = PodClocks::default();
        let start = Instant::now();
        let ten = Duration::from_secs(10);
        assert!(!c.elapsed("a", ten, start));
        assert_eq!(c.end_pass(), Some(start + ten));
        tokio::time::advance(ten).await;
        assert!(c.elapsed("a", ten, Instant::now()));
        assert_eq!(c.end_pass(), None);
        // Not looked at in a pass: forgotten, so it starts again.
        assert_eq!(c.end_pass(), None);
        assert!(!c.elapsed("a", ten, Instant::now()));
    }
}
