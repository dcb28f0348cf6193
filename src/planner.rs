//! Pure capacity planning: no I/O, no clock (the time is an argument).
//!
//! Input: node-group specs, the observed capacity of each scale set (`None` when unknown), and
//! the scale sets with a write in flight. Output: at most one [`CapacityChange`] per scale set
//! (coalesced: the write carries the latest desired value) and the reasons groups were left
//! alone. It never plans from an unknown size, clamps to `[min, max]` and limits a scale-down to
//! `maxScaleDownStep` per write (stale or zero sizes have caused mass deletions in the wild).
//!
//! What a group *wants* comes from a [`DemandSource`], so another source (pending pods from the
//! Kubernetes API, say) plugs in without touching the loop.

use crate::config::{NodeGroupSpec, Schedule};
use std::collections::{HashMap, HashSet};
use time::OffsetDateTime;

/// What a group wants, before bounds and step limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// Exactly this many instances.
    Exact(i64),
    /// Anything within the group's bounds is fine (hold the current size).
    Hold,
    /// At least this many; more is fine (pending pods ask for nodes; they never ask a
    /// capacity number to go down: a node goes by deleting exactly that instance). A capacity
    /// above `max` (another writer's) is held, not lowered: lowering the number would let Azure
    /// pick which instances go, pods and all; the scale-down removes unneeded nodes by name.
    AtLeast(i64),
}

/// Where demand comes from. Implementations must be pure functions of their inputs.
pub trait DemandSource: Send + Sync {
    /// What `group` wants at `now`, and why (for logs).
    fn demand(&self, group: &NodeGroupSpec, now: OffsetDateTime) -> (Demand, Reason);
}

/// The configured schedules, then `desiredCapacity`, then "hold".
#[derive(Debug, Default, Clone, Copy)]
pub struct ConfiguredDemand;

impl DemandSource for ConfiguredDemand {
    fn demand(&self, group: &NodeGroupSpec, now: OffsetDateTime) -> (Demand, Reason) {
        if let Some(i) = group.schedules.iter().position(|s| schedule_active(s, now)) {
            return (
                Demand::Exact(i64::from(group.schedules[i].desired_capacity)),
                Reason::Schedule(i),
            );
        }
        match group.desired_capacity {
            Some(d) => (Demand::Exact(i64::from(d)), Reason::Desired),
            None => (Demand::Hold, Reason::Bounds),
        }
    }
}

/// Whether `s` covers `now` (UTC). A window whose end is before its start wraps midnight and
/// belongs to the day it started on.
pub fn schedule_active(s: &Schedule, now: OffsetDateTime) -> bool {
    let now = now.to_offset(time::UtcOffset::UTC);
    let secs =
        u32::from(now.hour()) * 3600 + u32::from(now.minute()) * 60 + u32::from(now.second());
    let today = now.weekday().number_days_from_monday();
    let day_ok = |d: u8| s.days.is_empty() || s.days.contains(&d);
    if s.start_secs == s.end_secs {
        return day_ok(today);
    }
    if s.start_secs < s.end_secs {
        day_ok(today) && secs >= s.start_secs && secs < s.end_secs
    } else {
        let yesterday = (today + 6) % 7;
        (day_ok(today) && secs >= s.start_secs) || (day_ok(yesterday) && secs < s.end_secs)
    }
}

/// Why a target was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `desiredCapacity`.
    Desired,
    /// The schedule window with this index.
    Schedule(usize),
    /// No desired value: only the bounds apply.
    Bounds,
    /// Pending pods need this many nodes (`demand: pods`).
    PendingPods,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Desired => f.write_str("desiredCapacity"),
            Reason::Schedule(i) => write!(f, "schedules[{i}]"),
            Reason::Bounds => f.write_str("bounds"),
            Reason::PendingPods => f.write_str("pending pods"),
        }
    }
}

/// One planned write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityChange {
    /// Scale-set name.
    pub scale_set: String,
    /// Capacity observed when planning.
    pub from: i64,
    /// Capacity to write.
    pub to: i64,
    /// Why.
    pub reason: Reason,
    /// The decrease was cut to `maxScaleDownStep`.
    pub step_limited: bool,
}

/// Why a group got no write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The size is unknown: never plan from it.
    UnknownSize,
    /// A write to this scale set is in flight.
    InFlight,
    /// The observed capacity already satisfies the plan.
    Satisfied,
}

/// A full plan.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// Writes to make, one per scale set at most.
    pub changes: Vec<CapacityChange>,
    /// Groups left alone and why, with the desired capacity when known.
    pub held: Vec<(String, Hold, Option<i64>)>,
}

/// Target for one group given its observed capacity: `None` when the capacity already satisfies
/// the plan. Bounds are hard limits; `maxScaleDownStep` slows a scale-down within them (a size
/// above `max` is brought down to `max` at once, except under [`Demand::AtLeast`], which never
/// lowers a number). Used by [`plan`] and by the reconciler to re-plan after a 412 with fresh state.
pub fn target_for(
    group: &NodeGroupSpec,
    current: i64,
    demand: &dyn DemandSource,
    now: OffsetDateTime,
) -> Option<CapacityChange> {
    let (want, reason) = demand.demand(group, now);
    let min = i64::from(group.min_size);
    let max = i64::from(group.max_size);
    let mut to = match want {
        Demand::Exact(n) => n.clamp(min, max),
        Demand::Hold => current.clamp(min, max),
        // Raise to the floor (within the bounds), never lower: not even from above `max`.
        Demand::AtLeast(n) => current.max(n.clamp(min, max)).max(min),
    };
    let mut step_limited = false;
    if let Some(step) = group.max_scale_down_step {
        let floor = current.saturating_sub(i64::from(step.max(1)));
        // Bounds are hard limits: the step only slows a scale-down that stays within them.
        let limited = floor.min(max);
        if to < limited {
            to = limited;
            step_limited = true;
        }
    }
    (to != current).then(|| CapacityChange {
        scale_set: group.name.clone(),
        from: current,
        to,
        reason,
        step_limited,
    })
}

/// The desired capacity of a group at `now`, clamped to its bounds; `None` for "hold".
pub fn desired_capacity(
    group: &NodeGroupSpec,
    demand: &dyn DemandSource,
    now: OffsetDateTime,
) -> Option<i64> {
    match demand.demand(group, now).0 {
        Demand::Exact(n) | Demand::AtLeast(n) => {
            Some(n.clamp(i64::from(group.min_size), i64::from(group.max_size)))
        }
        Demand::Hold => None,
    }
}

/// Plans every group. `observed` maps scale-set name to its known capacity (`None` or absent:
/// unknown); `in_flight` holds scale sets with a write under way.
pub fn plan(
    groups: &[NodeGroupSpec],
    observed: &HashMap<String, Option<i64>>,
    in_flight: &HashSet<String>,
    demand: &dyn DemandSource,
    now: OffsetDateTime,
) -> Plan {
    let mut out = Plan::default();
    for group in groups {
        let desired = desired_capacity(group, demand, now);
        let Some(current) = observed.get(&group.name).copied().flatten() else {
            out.held
                .push((group.name.clone(), Hold::UnknownSize, desired));
            continue;
        };
        if in_flight.contains(&group.name) {
            out.held.push((group.name.clone(), Hold::InFlight, desired));
            continue;
        }
        match target_for(group, current, demand, now) {
            Some(change) => out.changes.push(change),
            None => out
                .held
                .push((group.name.clone(), Hold::Satisfied, desired)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeGroupKind;
    use time::macros::datetime;

    fn group(name: &str, min: u32, max: u32, desired: Option<u32>) -> NodeGroupSpec {
        NodeGroupSpec {
            name: name.into(),
            kind: NodeGroupKind::Vmss,
            resource_group: None,
            min_size: min,
            max_size: max,
            desired_capacity: desired,
            schedules: vec![],
            max_scale_down_step: None,
        }
    }

    fn observed(pairs: &[(&str, Option<i64>)]) -> HashMap<String, Option<i64>> {
        pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    const NOON_MONDAY: OffsetDateTime = datetime!(2026-11-23 12:00 UTC);

    #[test]
    fn unknown_size_is_never_planned_from() {
        let p = plan(
            &[group("a", 1, 10, Some(3))],
            &observed(&[("a", None)]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert!(p.changes.is_empty());
        assert_eq!(p.held, vec![("a".into(), Hold::UnknownSize, Some(3))]);
    }

    #[test]
    fn a_missing_scale_set_counts_as_unknown_size() {
        let p = plan(
            &[group("a", 1, 10, Some(3))],
            &HashMap::new(),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(p.held[0].1, Hold::UnknownSize);
    }

    #[test]
    fn desired_capacity_is_clamped_to_bounds() {
        let mut g = group("a", 2, 5, Some(9));
        let p = plan(
            &[g.clone()],
            &observed(&[("a", Some(3))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(p.changes[0].to, 5);
        g.desired_capacity = Some(0);
        let p = plan(
            &[g],
            &observed(&[("a", Some(3))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(p.changes[0].to, 2);
    }

    #[test]
    fn without_desired_capacity_only_the_bounds_apply() {
        let g = group("a", 2, 5, None);
        let inside = plan(
            std::slice::from_ref(&g),
            &observed(&[("a", Some(4))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert!(inside.changes.is_empty());
        let above = plan(
            std::slice::from_ref(&g),
            &observed(&[("a", Some(8))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(above.changes[0].to, 5);
        let below = plan(
            &[g],
            &observed(&[("a", Some(0))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(below.changes[0].to, 2);
    }

    #[test]
    fn scale_down_is_limited_to_the_configured_step() {
        let mut g = group("a", 0, 100, Some(1));
        g.max_scale_down_step = Some(5);
        let p = plan(
            &[g],
            &observed(&[("a", Some(90))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(p.changes[0].to, 85);
        assert!(p.changes[0].step_limited);
    }

    #[test]
    fn scale_up_is_not_step_limited() {
        let mut g = group("a", 0, 100, Some(60));
        g.max_scale_down_step = Some(5);
        let p = plan(
            &[g],
            &observed(&[("a", Some(2))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert_eq!(p.changes[0].to, 60);
        assert!(!p.changes[0].step_limited);
    }

    #[test]
    fn a_scale_set_with_a_write_in_flight_is_held() {
        let in_flight: HashSet<String> = ["a".to_string()].into();
        let p = plan(
            &[group("a", 1, 10, Some(3))],
            &observed(&[("a", Some(1))]),
            &in_flight,
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert!(p.changes.is_empty());
        assert_eq!(p.held[0].1, Hold::InFlight);
    }

    #[test]
    fn a_satisfied_group_gets_no_write() {
        let p = plan(
            &[group("a", 1, 10, Some(3))],
            &observed(&[("a", Some(3))]),
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        assert!(p.changes.is_empty());
        assert_eq!(p.held[0].1, Hold::Satisfied);
    }

    #[test]
    fn a_schedule_window_overrides_desired_capacity_only_inside_it() {
        let mut g = group("a", 0, 10, Some(2));
        g.schedules.push(Schedule {
            start_secs: 8 * 3600,
            end_secs: 18 * 3600,
            days: vec![0, 1, 2, 3, 4],
            desired_capacity: 7,
        });
        let at = |t: OffsetDateTime| {
            plan(
                &[g.clone()],
                &observed(&[("a", Some(2))]),
                &HashSet::new(),
                &ConfiguredDemand,
                t,
            )
        };
        assert_eq!(at(NOON_MONDAY).changes[0].to, 7);
        assert_eq!(at(NOON_MONDAY).changes[0].reason, Reason::Schedule(0));
        assert!(
            at(datetime!(2026-11-23 18:00 UTC)).changes.is_empty(),
            "end is exclusive"
        );
        assert!(
            at(datetime!(2026-11-22 12:00 UTC)).changes.is_empty(),
            "Sunday is not in the window"
        );
    }

    #[test]
    fn a_window_that_wraps_midnight_belongs_to_the_day_it_started() {
        // Friday 22:00 to 02:00: covers Saturday 01:00, not Saturday 23:00.
        let s = Schedule {
            start_secs: 22 * 3600,
            end_secs: 2 * 3600,
            days: vec![4],
            desired_capacity: 1,
        };
        assert!(schedule_active(&s, datetime!(2026-11-27 23:00 UTC)));
        assert!(schedule_active(&s, datetime!(2026-11-28 01:00 UTC)));
        assert!(!schedule_active(&s, datetime!(2026-11-28 23:00 UTC)));
        assert!(!schedule_active(&s, datetime!(2026-11-27 21:59 UTC)));
    }

    #[test]
    fn schedule_times_are_read_in_utc_whatever_the_offset() {
        let s = Schedule {
            start_secs: 8 * 3600,
            end_secs: 9 * 3600,
            days: vec![],
            desired_capacity: 1,
        };
        assert!(schedule_active(&s, datetime!(2026-11-23 10:30 +02:00)));
    }

    #[test]
    fn plans_at_most_one_write_per_scale_set() {
        let groups: Vec<_> = (0..50)
            .map(|i| group(&format!("g{i}"), 0, 10, Some(5)))
            .collect();
        let obs: HashMap<_, _> = (0..50).map(|i| (format!("g{i}"), Some(1))).collect();
        let p = plan(
            &groups,
            &obs,
            &HashSet::new(),
            &ConfiguredDemand,
            NOON_MONDAY,
        );
        let names: HashSet<_> = p.changes.iter().map(|c| c.scale_set.clone()).collect();
        assert_eq!(names.len(), p.changes.len());
        assert_eq!(p.changes.len(), 50);
    }

    proptest::proptest! {
        #[test]
        fn every_planned_capacity_lies_within_bounds(min in 0u32..50, span in 0u32..50, desired in proptest::option::of(0u32..200), current in 0i64..200, step in proptest::option::of(1u32..20)) {
            let mut g = group("a", min, min + span, desired);
            g.max_scale_down_step = step;
            if let Some(c) = target_for(&g, current, &ConfiguredDemand, NOON_MONDAY) {
                let within = c.to >= i64::from(g.min_size) && c.to <= i64::from(g.max_size);
                proptest::prop_assert!(within, "{c:?} outside [{}, {}]", g.min_size, g.max_size);
                if let (Some(s), true) = (step, current <= i64::from(g.max_size)) {
                    proptest::prop_assert!(current - c.to <= i64::from(s));
                }
            }
        }
    }
}
