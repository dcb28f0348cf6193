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
//! [`SIBLING_SPACING`] apart, all before the first answer can close the gate.
//!
//! A new scale-up also asks a few whole seconds later than the older ones ([`retry_offset`]):
//! whole seconds keep its place in the second, and it spares the subscription requests that
//! older scale-ups would win anyway. Only scale-ups wait for a turn: the gate itself stays at
//! `Retry-After`, so deletions and lowered capacities go when it opens.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// How much earlier in the second a process's slot comes per second its oldest scale-up has
/// waited: 0.5 ms, so the slots of scale-ups that waited 0 to 5 minutes lie within 150 ms, and a
/// wait would have to pass 33 minutes to come round to a new scale-up's place. Across machines,
/// the clocks and the network blur slots a few tens of milliseconds apart, so scale-ups that
/// waited within about a minute of each other ask in no set order. With 0.2 to 2 ms the fleet
/// benchmark gave the same fairness (1.19 to 1.37 slowest over fastest, medians of 6 runs at the
/// benchmark's rate and at a token every 4 s).
pub const SLOT_AGE_RATE: f64 = 0.000_5;

/// How much later in the second every slot comes per second of the shared clock: 5 ms, so the
/// arc of waiting slots goes round the second every 200 s. A token that keeps coming at the same
/// place in the second (a bucket refilling every whole number of seconds) and falls inside the
/// arc favours the scale-ups after it; the drift moves the arc past it, ten times as fast as
/// waiting moves a slot back, so a scale-up behind it waits about a ninth of its age more.
pub const SLOT_DRIFT: f64 = 0.005;

/// How long before its slot the pass of a waiting scale-up starts: its reads go first, and the
/// write itself waits for the slot.
pub const SLOT_LEAD: Duration = Duration::from_secs(1);

/// Between the scale-ups of one process asking in the same slot, oldest first.
pub const SIBLING_SPACING: Duration = Duration::from_millis(1);

/// The most scale-ups of one process spaced in a slot; more ask with the last.
const MAX_SIBLINGS: u32 = 100;

/// Whether a scale-up whose turn is `turn` is still held at `now`: until [`SLOT_LEAD`] before
/// it, the pass woken then ([`wake_at`]) letting through its siblings' turns too.
pub fn holds(turn: Instant, now: Instant) -> bool {
    turn > now + SLOT_LEAD + SIBLING_SPACING * MAX_SIBLINGS
}

/// When the pass of a scale-up whose turn is `turn` starts.
pub fn wake_at(turn: Instant) -> Instant {
    turn.checked_sub(SLOT_LEAD).unwrap_or(turn)
}

/// How long a write let through before its `turn` waits for it (no longer than a pass lets
/// through: a turn set meanwhile can only be later, and holds the next write).
pub fn until_turn(turn: Instant, now: Instant) -> Duration {
    turn.saturating_duration_since(now)
        .min(SLOT_LEAD + SIBLING_SPACING * MAX_SIBLINGS)
}

/// The age beyond which a throttled scale-up asks at every slot after `Retry-After`; younger,
/// it skips whole seconds ([`retry_offset`]). One minute: a fleet whose scale-ups exceed its
/// bucket for long serves them after one to two minutes (the fleet benchmark's growing fleet: a
/// minute at the median), so a scale-up is at the head of the queue past that age, where
/// skipping would hand its tokens to younger ones. With 30 s, 1 min and 2.5 min (medians of 6
/// runs): 14,790, 12,120 and 7,752 429s in the growing fleet, fleet p99 122, 121 and 148 s; with
/// no skipping, 17,206 and 119 s.
pub const RETRY_ORDER_HORIZON: Duration = Duration::from_secs(60);

/// Whole seconds a scale-up whose process's oldest waited `age` skips past `Retry-After`: the
/// scan interval's for a new one, shrinking linearly to none at [`RETRY_ORDER_HORIZON`].
pub fn retry_offset(age: Duration, scan_interval: Duration) -> Duration {
    let left = 1.0 - (age.as_secs_f64() / RETRY_ORDER_HORIZON.as_secs_f64()).min(1.0);
    Duration::from_secs((scan_interval.as_secs_f64() * left).round() as u64)
}

/// Seconds since the Unix epoch on the wall clock the fleet shares, for an instant of this
/// process's monotonic clock (tokio's, so a paused test clock moves it too). The two are tied
/// once, at the first call: a wall clock stepped later (not slewed, as NTP does) shifts this
/// process's slots until it restarts, which costs it order, never a write before `Retry-After`.
pub fn shared_secs(t: Instant) -> f64 {
    static ANCHOR: OnceLock<(Instant, f64)> = OnceLock::new();
    let (at, wall) = *ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        (Instant::now(), wall)
    });
    if t >= at {
        wall + (t - at).as_secs_f64()
    } else {
        wall - (at - t).as_secs_f64()
    }
}

/// The place within the second (0 to 1) of the slot, at shared time `u`, of a process whose
/// oldest unmet scale-up has waited `age` seconds.
pub fn slot_phase(u: f64, age: f64) -> f64 {
    (SLOT_DRIFT * u - SLOT_AGE_RATE * age).rem_euclid(1.0)
}

/// From shared time `u`, how long until the slot of a process whose oldest has waited `age`
/// seconds (less than a second).
pub fn until_slot(u: f64, age: f64) -> Duration {
    let wait = (slot_phase(u, age) - u.rem_euclid(1.0)).rem_euclid(1.0);
    Duration::from_secs_f64(wait.min(0.999_999))
}

/// When a scale-up refused at `now` with `retry_after` (the gate's, if it stands later) asks
/// again: `Retry-After`, the whole seconds of [`retry_offset`], then the slot of its process's
/// oldest unmet scale-up (unmet since `oldest`), plus [`SIBLING_SPACING`] for each older one of
/// the process (`rank`).
pub fn turn_at(
    now: Instant,
    retry_after: Duration,
    oldest: Instant,
    rank: usize,
    scan_interval: Duration,
) -> Instant {
    let earliest =
        now + retry_after + retry_offset(now.saturating_duration_since(oldest), scan_interval);
    let age = earliest.saturating_duration_since(oldest).as_secs_f64();
    let spacing = SIBLING_SPACING * u32::try_from(rank).unwrap_or(u32::MAX).min(MAX_SIBLINGS);
    earliest + until_slot(shared_secs(earliest), age) + spacing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_scale_up_skips_whole_seconds_and_one_past_the_horizon_none() {
        let scan = Duration::from_secs(10);
        assert_eq!(retry_offset(Duration::ZERO, scan), scan);
        assert_eq!(retry_offset(RETRY_ORDER_HORIZON / 2, scan), scan / 2);
        assert_eq!(retry_offset(RETRY_ORDER_HORIZON, scan), Duration::ZERO);
        assert_eq!(
            retry_offset(Duration::from_secs(3600), scan),
            Duration::ZERO
        );
        for secs in 0..90 {
            let o = retry_offset(Duration::from_secs(secs), scan);
            assert_eq!(o.subsec_nanos(), 0, "whole seconds keep the slot: {o:?}");
            assert!(o <= retry_offset(Duration::from_secs(secs.saturating_sub(1)), scan));
        }
    }

    #[test]
    fn the_longer_a_scale_up_has_waited_the_earlier_in_the_second_it_asks() {
        let u = 1_790_000_000.25;
        // Ages 0 s to 5 min lie in 150 ms, oldest first, with nothing in between.
        let phases: Vec<f64> = (0..=300)
            .step_by(30)
            .map(|a| slot_phase(u, f64::from(a)))
            .collect();
        for w in phases.windows(2) {
            let gap = (w[0] - w[1]).rem_euclid(1.0);
            assert!(gap > 0.0 && gap < 0.02, "{phases:?}");
        }
        let arc = (phases[0] - phases[phases.len() - 1]).rem_euclid(1.0);
        assert!((arc - 0.15).abs() < 1e-9, "{arc}");
    }

    #[test]
    fn every_slot_drifts_forward_together_ten_times_faster_than_waiting_moves_it_back() {
        let (u, age) = (1_790_000_000.0, 40.0);
        let a = slot_phase(u, age);
        let b = slot_phase(u + 10.0, age + 10.0);
        assert!(((b - a).rem_euclid(1.0) - 0.045).abs() < 1e-6);
        // Two scale-ups keep their distance as both wait.
        let gap = |u: f64| (slot_phase(u, 100.0) - slot_phase(u, 10.0)).rem_euclid(1.0);
        assert!((gap(u) - gap(u + 77.0)).abs() < 1e-9);
    }

    #[test]
    fn the_slot_is_the_first_instant_at_its_place_in_the_second() {
        for (u, age) in [(100.0, 0.0), (100.999, 30.0), (12_345.5, 299.0), (7.0, 0.0)] {
            let wait = until_slot(u, age).as_secs_f64();
            assert!((0.0..1.0).contains(&wait), "{wait}");
            // The place is taken when the turn is set (it drifts 5 ms in a second).
            let at = u + wait;
            let off = (at.rem_euclid(1.0) - slot_phase(u, age)).abs();
            assert!(off < 1e-6 || (1.0 - off) < 1e-6, "{u} {age}: {off}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_woken_for_a_turn_lets_its_siblings_through_and_their_writes_wait_for_it() {
        let now = Instant::now();
        let turn = now + Duration::from_secs(30);
        assert!(holds(turn, now));
        let woken = wake_at(turn);
        assert_eq!(turn - woken, SLOT_LEAD);
        for rank in [0, 1, 99] {
            let sibling = turn + SIBLING_SPACING * rank;
            assert!(!holds(sibling, woken), "rank {rank}");
            assert_eq!(until_turn(sibling, woken), sibling - woken);
        }
        assert_eq!(until_turn(turn, turn + SLOT_LEAD), Duration::ZERO);
        assert!(until_turn(now + Duration::from_secs(60), now) <= SLOT_LEAD * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_is_never_before_retry_after_and_siblings_follow_the_oldest_by_a_millisecond() {
        let scan = Duration::from_secs(10);
        let now = Instant::now();
        let oldest = now - Duration::from_secs(200);
        let retry = Duration::from_secs(3);
        let first = turn_at(now, retry, oldest, 0, scan);
        assert!(first >= now + retry && first < now + retry + Duration::from_secs(1));
        let second = turn_at(now, retry, oldest, 1, scan);
        assert_eq!(second - first, SIBLING_SPACING);
        // A process whose oldest is new skips the scan interval, in whole seconds.
        let new = turn_at(now, retry, now, 0, scan);
        assert!(new >= now + retry + scan && new < now + retry + scan + Duration::from_secs(1));
    }
}
