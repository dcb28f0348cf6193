//! Designs of a throttled scale-up's retry the fleet benchmark measures beside the controller's
//! (`src/reconciler/retry.rs`): asking the moment `Retry-After` passes ([`AtRetryAfter`], the
//! baseline without pacing), Azure's SDKs with full jitter ([`FullJitter`]), and the retry slots
//! the controller used until issue 42 item 4 ([`Slots`]).
//!
//! The slots are ported as they were (`src/reconciler/turn.rs`), with two changes: the wall
//! clock is the one the benchmark gives each controller (its own offset), not a process-global
//! anchor, and a process's scale-ups ask in their oldest's slot at once rather than a
//! millisecond apart (the controller's pass lets through the turns within its lead only).
//!
//! What follows is the slots' module documentation as it was.
//!
//! When a throttled scale-up asks again: its turn in a fleet that shares a subscription's
//! write bucket and has no channel between its controllers.
//!
//! Azure answers an empty bucket with `429` and a `Retry-After` in whole seconds. Every waiting
//! scale-up that asks as soon as that passes lands in the second after the bucket's next token,
//! and the token goes to the first of them to ask in that second. Asking at once therefore
//! orders the fleet by where in the second each one first happened to ask, not by how long it
//! has waited; when the bucket refills a token every whole number of seconds that order never
//! changes, and the scale-ups that ask late in the second lose every time (the fleet
//! benchmark's slowest cluster waited three times as long as its fastest).
//!
//! The controllers share one thing besides the bucket: the wall clock (NTP keeps it within
//! milliseconds across machines). So a scale-up asks at a *slot*: the first instant after
//! `Retry-After` whose place within the second, on that clock, is a function of how long the
//! process's oldest unmet scale-up has wanted its capacity ([`slot_phase`]). The longer it has
//! waited, the earlier in the second its slot, [`SLOT_AGE_RATE`] per second of waiting; the
//! slots of the fleet's waiting scale-ups lie in a short arc, oldest first. A token that comes
//! before the arc goes to the oldest; one that comes inside the arc goes to the oldest of those
//! after it, and since every slot drifts forward together ([`SLOT_DRIFT`], ten times faster than
//! waiting moves it back) the arc passes such a token within a minute or two, so no scale-up stays
//! behind younger ones. The other scale-ups of the process ask in the same slot, oldest first,
//! a millisecond apart, all before the first answer can close the gate.
//!
//! A new scale-up also asks a few whole seconds later than the older ones ([`retry_offset`]):
//! whole seconds keep its place in the second, and it spares the subscription requests that
//! older scale-ups would win anyway. Only scale-ups wait for a turn: the gate itself stays at
//! `Retry-After`, so deletions and lowered capacities go when it opens.

use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;
use vmss_capacity_controller::reconciler::{RetryTurn, Throttled};

/// How much earlier in the second a process's slot comes per second its oldest scale-up has
/// waited.
pub const SLOT_AGE_RATE: f64 = 0.000_5;

/// How much later in the second every slot comes per second of the shared clock.
pub const SLOT_DRIFT: f64 = 0.005;

/// The age beyond which a throttled scale-up asks at every slot after `Retry-After`.
pub const RETRY_ORDER_HORIZON: Duration = Duration::from_secs(60);

/// Whole seconds a scale-up whose process's oldest waited `age` skips past `Retry-After`.
pub fn retry_offset(age: Duration, scan_interval: Duration) -> Duration {
    let left = 1.0 - (age.as_secs_f64() / RETRY_ORDER_HORIZON.as_secs_f64()).min(1.0);
    Duration::from_secs((scan_interval.as_secs_f64() * left).round() as u64)
}

/// The place within the second (0 to 1) of the slot, at shared time `u`, of a process whose
/// oldest unmet scale-up has waited `age` seconds.
pub fn slot_phase(u: f64, age: f64) -> f64 {
    (SLOT_DRIFT * u - SLOT_AGE_RATE * age).rem_euclid(1.0)
}

/// From shared time `u`, how long until the slot of a process whose oldest has waited `age`.
pub fn until_slot(u: f64, age: f64) -> Duration {
    let wait = (slot_phase(u, age) - u.rem_euclid(1.0)).rem_euclid(1.0);
    Duration::from_secs_f64(wait.min(0.999_999))
}

/// The wall clock a controller reads (its own offset from true time).
pub type Wall = std::sync::Arc<dyn Fn() -> OffsetDateTime + Send + Sync>;

/// The slots on `wall`: `Retry-After`, the whole seconds of [`retry_offset`], then the slot of
/// the process's oldest unmet scale-up.
pub struct Slots {
    pub wall: Wall,
}

impl RetryTurn for Slots {
    fn turn(&self, t: &Throttled) -> Instant {
        let earliest = t.now
            + t.retry_after
            + retry_offset(t.now.saturating_duration_since(t.oldest), t.scan_interval);
        let age = earliest.saturating_duration_since(t.oldest).as_secs_f64();
        // Seconds since the epoch on this controller's wall clock at `earliest`.
        let wall = (self.wall)().unix_timestamp_nanos() as f64 / 1e9;
        let u = wall + (earliest - t.now).as_secs_f64();
        earliest + until_slot(u, age)
    }
}

/// What a controller that only obeys `Retry-After` does: it asks again the moment it passes.
pub struct AtRetryAfter;

impl RetryTurn for AtRetryAfter {
    fn turn(&self, t: &Throttled) -> Instant {
        t.now + t.retry_after
    }
}

/// What Azure's SDKs do, with full jitter: `Retry-After`, then a uniform random extra below
/// `cap`, whatever the scale-up's age.
pub struct FullJitter {
    pub cap: Duration,
    rng: parking_lot::Mutex<rand::rngs::StdRng>,
}

impl FullJitter {
    pub fn new(cap: Duration, seed: u64) -> Self {
        use rand::SeedableRng;
        FullJitter {
            cap,
            rng: parking_lot::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        }
    }
}

impl RetryTurn for FullJitter {
    fn turn(&self, t: &Throttled) -> Instant {
        use rand::Rng;
        t.now + t.retry_after + self.cap.mul_f64(self.rng.lock().gen::<f64>())
    }
}

/// Refusal-weighted full jitter: `Retry-After`, then a uniform random extra below the scan
/// interval divided by one more than the times this scale-up was already refused. A scale-up
/// refused often asks early in the window, a new one anywhere in it: the turn weighs what each
/// has already lost (a deficit), with no cap and no clock.
pub struct RefusalWeighted {
    rng: parking_lot::Mutex<rand::rngs::StdRng>,
    /// Refusals per scale-up, by when it began to want capacity (its identity here).
    refused: parking_lot::Mutex<std::collections::HashMap<Instant, u32>>,
}

impl RefusalWeighted {
    pub fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        RefusalWeighted {
            rng: parking_lot::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            refused: Default::default(),
        }
    }
}

impl RetryTurn for RefusalWeighted {
    fn turn(&self, t: &Throttled) -> Instant {
        use rand::Rng;
        let n = {
            let mut refused = self.refused.lock();
            // Forget the scale-ups that stopped wanting long ago (served or gone).
            if let Some(long_ago) = t.now.checked_sub(Duration::from_secs(3600)) {
                refused.retain(|since, _| *since >= long_ago);
            }
            let n = refused.entry(t.since).or_insert(0);
            *n += 1;
            *n - 1
        };
        let window = t.scan_interval.div_f64(f64::from(n) + 1.0);
        t.now + t.retry_after + window.mul_f64(self.rng.lock().gen::<f64>())
    }
}

/// Another design's turn plus a uniform random extra below `cap` (the controller's age order
/// with the random second it had until issue 42 item 4).
pub struct WithJitter<T> {
    pub inner: T,
    pub jitter: FullJitter,
}

impl<T: RetryTurn> RetryTurn for WithJitter<T> {
    fn turn(&self, t: &Throttled) -> Instant {
        let extra = self.jitter.turn(t) - (t.now + t.retry_after);
        self.inner.turn(t) + extra
    }
}
