//! When a throttled scale-up asks again, in a fleet that shares a subscription's write bucket
//! and has no channel between its controllers.
//!
//! Azure answers an empty bucket with `429` and a `Retry-After` in whole seconds, the wait until
//! its next token rounded up. Every waiting scale-up that asks as soon as that passes lands in
//! the second after that token, and the token goes to the first of them to ask. Asking exactly
//! at `Retry-After` keeps each one's place in that second from one refusal to the next (the
//! whole seconds do not move it), so the same scale-ups win every token while the rest wait.
//!
//! The default, [`AgeOrdered`], asks at `Retry-After`, plus a delay that shrinks as the scale-up
//! ages (the scan interval for a new one, none once it has waited [`AGE_HORIZON`]), plus a
//! uniform random part of up to a second (full jitter within `Retry-After`'s granularity). The
//! random part takes each scale-up to a new place in the second at every refusal, so no place
//! wins for long; the age part lets the scale-ups that waited longer ask first, since a younger
//! one comes back later than the older ones waiting on the same token. It needs no clock shared
//! with the other controllers: every delay is measured on this process's own clock, from
//! Azure's answer. The fleet benchmark (`benches/fleet.rs`, `docs/figures.md`) measured it
//! beside the SDKs' full jitter and the retry slots on the wall clock it replaced.
//!
//! Only scale-ups wait for a turn: the `Retry-After` gate itself ([`crate::azure::throttle`])
//! stays as Azure set it, so deletions and lowered capacities go when it opens.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use tokio::time::Instant;

/// The age from which a throttled scale-up adds no delay of its age past `Retry-After`: one
/// minute. A fleet whose scale-ups exceed its bucket for long serves them after one to two
/// minutes, so a scale-up is at the head of the queue past that age.
pub const AGE_HORIZON: Duration = Duration::from_secs(60);

/// The random part of a turn: uniform below this, the granularity of `Retry-After`.
pub const JITTER: Duration = Duration::from_secs(1);

/// What a scale-up refused for the subscription's bucket knows when it picks its turn.
#[derive(Debug, Clone, Copy)]
pub struct Throttled {
    /// When the refusal came (this process's clock).
    pub now: Instant,
    /// Azure's `Retry-After`, or the gate's if it stands later.
    pub retry_after: Duration,
    /// Since when this node group has wanted more capacity than it has.
    pub since: Instant,
    /// Since when the process's oldest unmet scale-up has.
    pub oldest: Instant,
    /// How many of the process's unmet scale-ups are older than this one.
    pub rank: usize,
    /// The controller's `scanInterval`.
    pub scan_interval: Duration,
}

/// How a throttled scale-up picks the instant it asks again (never before `Retry-After`).
/// [`AgeOrdered`] is the controller's; the fleet benchmark sets others beside it
/// ([`super::ReconcilerBuilder::retry_turn`]).
pub trait RetryTurn: Send + Sync {
    /// The instant a scale-up refused as `t` says asks again, at or after
    /// `t.now + t.retry_after`.
    fn turn(&self, t: &Throttled) -> Instant;
}

/// `Retry-After`, then [`age_delay`], then a uniform random part below [`JITTER`]: see the
/// module documentation.
#[derive(Debug)]
pub struct AgeOrdered {
    rng: Mutex<StdRng>,
}

impl AgeOrdered {
    /// Draws its random parts from the operating system's entropy.
    pub fn new() -> Self {
        Self {
            rng: Mutex::new(StdRng::from_entropy()),
        }
    }

    /// Draws its random parts from `seed` (tests, benchmarks).
    pub fn seeded(seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl Default for AgeOrdered {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryTurn for AgeOrdered {
    fn turn(&self, t: &Throttled) -> Instant {
        let age = t.now.saturating_duration_since(t.since);
        let jitter = JITTER.mul_f64(self.rng.lock().gen::<f64>());
        t.now + t.retry_after + age_delay(age, t.scan_interval) + jitter
    }
}

/// The delay past `Retry-After` of a scale-up that has waited `age`: the scan interval for a
/// new one, shrinking linearly to none at [`AGE_HORIZON`].
pub fn age_delay(age: Duration, scan_interval: Duration) -> Duration {
    let left = 1.0 - (age.as_secs_f64() / AGE_HORIZON.as_secs_f64()).min(1.0);
    scan_interval.mul_f64(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttled(age: Duration, retry_after: Duration) -> Throttled {
        let now = Instant::now();
        Throttled {
            now,
            retry_after,
            since: now - age,
            oldest: now - age,
            rank: 0,
            scan_interval: Duration::from_secs(10),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_never_before_retry_after_and_at_most_a_scan_and_a_second_after_it() {
        let order = AgeOrdered::seeded(1);
        for secs in [0, 5, 30, 59, 60, 600] {
            for ra in [1, 3, 30] {
                let t = throttled(Duration::from_secs(secs), Duration::from_secs(ra));
                let turn = order.turn(&t);
                let after = turn - (t.now + t.retry_after);
                assert!(
                    after < Duration::from_secs(11),
                    "{secs} s, {ra} s: {after:?}"
                );
                assert!(
                    after >= age_delay(Duration::from_secs(secs), t.scan_interval),
                    "{secs} s: {after:?}"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_longer_a_scale_up_has_waited_the_sooner_after_retry_after_it_asks() {
        let scan = Duration::from_secs(10);
        assert_eq!(age_delay(Duration::ZERO, scan), scan);
        assert_eq!(age_delay(AGE_HORIZON / 2, scan), scan / 2);
        assert_eq!(age_delay(AGE_HORIZON, scan), Duration::ZERO);
        assert_eq!(age_delay(AGE_HORIZON * 10, scan), Duration::ZERO);
        // Ten seconds of waiting more than makes up for the random part: asked together, the
        // older one asks first every time.
        let order = AgeOrdered::seeded(7);
        let ra = Duration::from_secs(2);
        for _ in 0..100 {
            let old = order.turn(&throttled(Duration::from_secs(30), ra));
            let young = order.turn(&throttled(Duration::from_secs(15), ra));
            assert!(old < young, "{old:?} {young:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn scale_ups_of_one_age_ask_at_places_spread_over_the_second_not_at_one_place() {
        // Past the horizon only the random part is left: a hundred turns fill the second.
        let order = AgeOrdered::seeded(3);
        let t = throttled(AGE_HORIZON * 2, Duration::from_secs(4));
        let mut tenths = [0u32; 10];
        for _ in 0..100 {
            let extra = order.turn(&t) - (t.now + t.retry_after);
            assert!(extra < JITTER, "{extra:?}");
            tenths[(extra.as_secs_f64() * 10.0) as usize] += 1;
        }
        assert!(tenths.iter().all(|n| *n >= 3), "{tenths:?}");
        // The same seed draws the same turns; another, others.
        let draw = |seed| {
            let o = AgeOrdered::seeded(seed);
            (0..5).map(|_| o.turn(&t)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }
}
