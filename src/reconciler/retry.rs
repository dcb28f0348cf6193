//! When a throttled scale-up asks again, in a fleet that shares a subscription's write bucket
//! and has no channel between its controllers.
//!
//! Azure answers an empty bucket with `429` and a `Retry-After` in whole seconds, the wait until
//! its next token rounded up. Every waiting scale-up that asks as soon as that passes lands in
//! the second after that token, and the token goes to the first of them to ask.
//!
//! The default, [`AgeOrdered`], asks at `Retry-After` plus a delay that shrinks as the scale-up
//! ages: the scan interval for a new one, a sixth of a second less for every three seconds it
//! has waited, none once it has waited [`AGE_HORIZON`] (three minutes). Refused together, an
//! older scale-up therefore asks before a younger one, whichever controller either runs in, and
//! a new one comes back after the older ones waiting on the same token. Nothing in it is
//! random: a random part (it had a uniform second until issue 42 item 4) shuffles the old among
//! the young, and the fleet benchmark's slowest cluster then waited 2.7 times as long as its
//! fastest. Whole seconds of `Retry-After` do not lock a scale-up to one place in the second
//! either, since its delay shrinks between two refusals. It needs no clock shared with the other
//! controllers: every delay is measured on this process's own clock, from Azure's answer. The
//! fleet benchmark (`benches/fleet.rs`, `docs/figures.md`) measures it beside full jitter, the
//! earlier random second, a refusal-weighted jitter and the retry slots.
//!
//! Only scale-ups wait for a turn: the `Retry-After` gate itself ([`crate::azure::throttle`])
//! stays as Azure set it, so deletions and lowered capacities go when it opens.

use std::time::Duration;
use tokio::time::Instant;

/// The age from which a throttled scale-up adds no delay of its age past `Retry-After`: three
/// minutes. A fleet whose scale-ups exceed its bucket for long serves them after two to four
/// minutes (the fleet benchmark's growing fleet), so the order holds over most of the queue.
pub const AGE_HORIZON: Duration = Duration::from_secs(180);

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

/// `Retry-After`, then [`age_delay`]: see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct AgeOrdered {
    horizon: Duration,
}

impl AgeOrdered {
    /// Over [`AGE_HORIZON`].
    pub fn new() -> Self {
        Self {
            horizon: AGE_HORIZON,
        }
    }

    /// Over another horizon (the fleet benchmark compares them).
    pub fn with_horizon(horizon: Duration) -> Self {
        Self { horizon }
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
        t.now + t.retry_after + delay_over(age, t.scan_interval, self.horizon)
    }
}

/// The delay past `Retry-After` of a scale-up that has waited `age`: the scan interval for a
/// new one, shrinking linearly to none at [`AGE_HORIZON`].
pub fn age_delay(age: Duration, scan_interval: Duration) -> Duration {
    delay_over(age, scan_interval, AGE_HORIZON)
}

fn delay_over(age: Duration, scan_interval: Duration, horizon: Duration) -> Duration {
    if horizon.is_zero() {
        return Duration::ZERO;
    }
    let left = 1.0 - (age.as_secs_f64() / horizon.as_secs_f64()).min(1.0);
    scan_interval.mul_f64(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCAN: Duration = Duration::from_secs(10);

    fn throttled(now: Instant, age: Duration, retry_after: Duration) -> Throttled {
        Throttled {
            now,
            retry_after,
            since: now - age,
            oldest: now - age,
            rank: 0,
            scan_interval: SCAN,
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_scale_up_asks_before_a_younger_one_at_every_age_up_to_three_minutes() {
        // Refused together, told the same Retry-After: the one that has wanted capacity longer
        // asks first, a minute in as much as two and a half minutes in.
        let order = AgeOrdered::new();
        let now = Instant::now() + Duration::from_secs(3600);
        for young in (0..AGE_HORIZON.as_secs() - 3).step_by(3) {
            for ra in [1, 2, 3] {
                let ra = Duration::from_secs(ra);
                let old = order.turn(&throttled(now, secs(young as f64 + 3.0), ra));
                let new = order.turn(&throttled(now, secs(young as f64), ra));
                assert!(
                    new - old >= secs(0.15),
                    "{young} s against {} s old: {:?} apart",
                    young + 3,
                    new - old
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_never_before_retry_after_and_at_most_a_scan_interval_after_it() {
        let order = AgeOrdered::new();
        let now = Instant::now() + Duration::from_secs(3600);
        for age in [0, 5, 30, 60, 90, 179, 180, 600] {
            for ra in [1, 3, 30] {
                let t = throttled(now, Duration::from_secs(age), Duration::from_secs(ra));
                let after = order.turn(&t) - (t.now + t.retry_after);
                assert!(after <= SCAN, "{age} s, {ra} s: {after:?}");
                assert_eq!(after, age_delay(Duration::from_secs(age), SCAN));
            }
        }
    }

    #[test]
    fn the_delay_shrinks_linearly_from_a_scan_interval_to_none_over_three_minutes() {
        assert_eq!(AGE_HORIZON, Duration::from_secs(180));
        assert_eq!(age_delay(Duration::ZERO, SCAN), SCAN);
        let two_thirds = age_delay(secs(60.0), SCAN).as_secs_f64();
        assert!((two_thirds - 20.0 / 3.0).abs() < 1e-6, "{two_thirds}");
        assert_eq!(age_delay(secs(90.0), SCAN), SCAN / 2);
        assert_eq!(age_delay(AGE_HORIZON, SCAN), Duration::ZERO);
        assert_eq!(age_delay(AGE_HORIZON * 10, SCAN), Duration::ZERO);
        // A zero horizon is no delay at all, not a division by zero.
        let t = throttled(Instant::now(), secs(5.0), secs(2.0));
        assert_eq!(
            AgeOrdered::with_horizon(Duration::ZERO).turn(&t),
            t.now + t.retry_after
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_refusal_always_gets_the_same_turn_with_no_random_part() {
        // A random part would shuffle the old among the young (the fleet benchmark's slowest
        // cluster waited 2.7 times its fastest with one): the order is the age's alone.
        let now = Instant::now() + Duration::from_secs(3600);
        for age in [0.0, 0.4, 42.0, 120.5] {
            let t = throttled(now, secs(age), secs(2.0));
            let turns: Vec<Instant> = (0..20).map(|_| AgeOrdered::new().turn(&t)).collect();
            assert!(turns.iter().all(|x| *x == turns[0]), "{age} s: {turns:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_refusal_moves_a_waiting_scale_up_to_another_place_in_the_second() {
        // Retry-After is whole seconds: a turn at a fixed place past it would keep the same
        // place in the second at every refusal, and lose to the same rivals. The age part
        // moves it by a sixth of a second for every three seconds waited, below the horizon.
        let order = AgeOrdered::new();
        let start = Instant::now() + Duration::from_secs(3600);
        let since = start;
        let mut now = start;
        let mut places = Vec::new();
        while now - since < AGE_HORIZON - Duration::from_secs(3) {
            let t = Throttled {
                since,
                oldest: since,
                ..throttled(now, Duration::ZERO, secs(2.0))
            };
            let turn = order.turn(&t);
            places.push((turn - t.now).as_secs_f64().fract());
            // Refused again as it asks, a little later.
            now = turn + Duration::from_millis(40);
        }
        assert!(places.len() > 10, "{places:?}");
        for w in places.windows(2) {
            let moved = (w[1] - w[0]).rem_euclid(1.0);
            assert!(moved > 0.05 && moved < 0.95, "{places:?}");
        }
    }
}
