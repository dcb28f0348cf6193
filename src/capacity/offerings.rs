//! Allocation failures, classified, and the offerings they make unavailable for a while.
//!
//! Azure refuses capacity in a few distinct ways, and each says something different about when
//! asking again can help. A refusal marks the *offering* it concerns (VM size, zones, priority in
//! a region; for quota, the whole VM family, since quota is counted per family) unavailable for a
//! time that fits its cause. Scale-up passes over a group whose offering is marked, in the same
//! decision, and the write path holds any capacity write to it until the mark runs out: the
//! next pending pod goes to a place that can answer yes instead of asking the same place again.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// How long a `SkuNotAvailable` keeps its offering out: the size is not offered to this
/// subscription in that region or zone, a restriction that changes rarely (Karpenter's Azure
/// provider keeps such an offering out for 23 h; so do we).
pub const SKU_NOT_AVAILABLE_TTL: Duration = Duration::from_secs(23 * 3600);

/// How long a capacity shortage (`AllocationFailed`, `ZonalAllocationFailed`, the
/// `Overconstrained…` pair) first keeps its offering out; each further shortage of the same
/// offering doubles it, up to [`NO_CAPACITY_BACKOFF_MAX`] (cluster-autoscaler's node group
/// backoff: 5 min doubling to 30 min). Karpenter's Azure provider keeps such an offering out
/// 1 h, which costs nothing to a pod another group can serve (it is planned there anyway) but
/// leaves a pod only this group can serve (a zonal disk, a pinned size) pending an hour after a
/// shortage that may be over in minutes.
pub const NO_CAPACITY_BACKOFF_BASE: Duration = crate::backoff::INITIAL;

/// The longest a run of capacity shortages keeps an offering out.
pub const NO_CAPACITY_BACKOFF_MAX: Duration = crate::backoff::MAX;

/// How long after its last shortage an offering's backoff starts from the base again
/// (cluster-autoscaler's `node-group-backoff-reset-timeout`).
pub const NO_CAPACITY_BACKOFF_RESET: Duration = crate::backoff::RESET;

/// How long a spot eviction keeps its offering out: Azure wants that capacity back now, so new
/// spot VMs of the size there would likely be evicted too; Karpenter keeps a spot offering out
/// 3 min after an interruption, long enough for the pods that lost their node to land elsewhere.
pub const SPOT_EVICTED_TTL: Duration = Duration::from_secs(3 * 60);

pub use crate::azure::allocation::AllocationFailure;

impl AllocationFailure {
    /// How long the offering stays out after a first refusal (a capacity shortage backs off
    /// from there: [`UnavailableOfferings::mark`]). Quota takes `quota_ttl` (`quotaCooldown`): unlike a
    /// provider that learns quota only by failing, this controller reads the usages and caps
    /// its plans by them, and a quota refusal also re-reads them, so the mark only has to cover
    /// the moments until the fresh usages say what is left.
    pub fn ttl(self, quota_ttl: Duration) -> Duration {
        match self {
            AllocationFailure::Quota => quota_ttl,
            AllocationFailure::SkuNotAvailable => SKU_NOT_AVAILABLE_TTL,
            AllocationFailure::NoCapacity => NO_CAPACITY_BACKOFF_BASE,
            AllocationFailure::SpotEvicted => SPOT_EVICTED_TTL,
        }
    }
}

/// What a node group asks Azure for: a VM size with a priority in a region's zones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Offering {
    /// Region, lowercase (empty when the read did not say: an agent pool).
    pub location: String,
    /// VM size, lowercase.
    pub vm_size: String,
    /// Zones, sorted (empty: regional).
    pub zones: Vec<String>,
    /// Spot priority.
    pub spot: bool,
}

impl Offering {
    /// The offering of a group in `location` with `vm_size`, `zones` and priority.
    pub fn new(location: &str, vm_size: &str, zones: &[String], spot: bool) -> Self {
        let mut zones: Vec<String> = zones.iter().map(|z| z.trim().to_string()).collect();
        zones.sort();
        zones.dedup();
        Self {
            location: location.trim().to_ascii_lowercase(),
            vm_size: vm_size.trim().to_ascii_lowercase(),
            zones,
            spot,
        }
    }

    /// The VM family quota counts this size in (`standardDSv5Family`), if the size table knows it.
    pub fn family(&self) -> Option<&'static str> {
        vm_sizes::vm_size(&self.vm_size).map(|s| s.family)
    }
}

impl std::fmt::Display for Offering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}{}",
            self.vm_size,
            if self.spot { "spot " } else { "" },
            if self.location.is_empty() {
                "(region unknown)".to_string()
            } else {
                self.location.clone()
            }
        )?;
        if !self.zones.is_empty() {
            write!(f, " zones {}", self.zones.join(","))?;
        }
        Ok(())
    }
}

/// What a mark covers: one offering, or (for quota) a family with a priority in a region.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Offering(Offering),
    Family {
        location: String,
        family: String,
        spot: bool,
    },
}

impl Key {
    /// Whether a mark under `self` covers `other`: the same key, or the same but for a region
    /// one of them did not know. An agent pool's region is learned from its managed cluster,
    /// after its first reads: a refusal marked before that must still hold the pool after.
    fn covers(&self, other: &Key) -> bool {
        let region = |a: &str, b: &str| a == b || a.is_empty() || b.is_empty();
        match (self, other) {
            (Key::Offering(a), Key::Offering(b)) => {
                region(&a.location, &b.location)
                    && a.vm_size == b.vm_size
                    && a.zones == b.zones
                    && a.spot == b.spot
            }
            (
                Key::Family {
                    location: la,
                    family: fa,
                    spot: sa,
                },
                Key::Family {
                    location: lb,
                    family: fb,
                    spot: sb,
                },
            ) => region(la, lb) && fa == fb && sa == sb,
            _ => false,
        }
    }

    fn of(offering: &Offering, failure: AllocationFailure) -> Key {
        match (failure, offering.family()) {
            // Quota counts by family (spot: the regional spot quota, keyed alike per family so
            // another family's spot groups are not blocked by a guess).
            (AllocationFailure::Quota, Some(family)) => Key::Family {
                location: offering.location.clone(),
                family: family.to_ascii_lowercase(),
                spot: offering.spot,
            },
            _ => Key::Offering(offering.clone()),
        }
    }
}

/// Why an offering is out now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The failure that marked it.
    pub failure: AllocationFailure,
    /// How long it stays out.
    pub left: Duration,
    /// Azure's message.
    pub message: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "offering unavailable ({}) for {}s more",
            self.failure,
            self.left.as_secs()
        )
    }
}

#[derive(Debug, Clone)]
struct Mark {
    failure: AllocationFailure,
    until: Instant,
    message: String,
}

/// The offerings Azure refused lately, each until its mark runs out (tokio's clock).
///
/// Marks are kept per offering as refused, zones included. A zonal group whose zones were each
/// refused on their own (single-zone groups of one size, say zones 1 and 2) is out as well: a
/// group spanning zones 1 and 2 has nowhere left to place a VM of that size. One zone refused
/// leaves it eligible: Azure places its new VMs in the zones it still has.
#[derive(Debug)]
pub struct UnavailableOfferings {
    quota_ttl: Duration,
    marks: Mutex<HashMap<Key, Mark>>,
    /// Capacity shortages in a row per offering: how many, and when the last was; the next
    /// one's mark doubles from there ([`NO_CAPACITY_BACKOFF_BASE`]).
    shortages: Mutex<HashMap<Key, (u32, Instant)>>,
}

/// How long the `n`-th capacity shortage in a row (from 1) keeps its offering out.
pub fn no_capacity_backoff(n: u32) -> Duration {
    crate::backoff::after(n)
}

impl UnavailableOfferings {
    /// An empty set; quota refusals mark for `quota_ttl` (`quotaCooldown`).
    pub fn new(quota_ttl: Duration) -> Self {
        Self {
            quota_ttl,
            marks: Mutex::new(HashMap::new()),
            shortages: Mutex::new(HashMap::new()),
        }
    }

    /// Marks what `failure` concerns unavailable from now; returns for how long. A capacity
    /// shortage backs off: 5 min, doubling with each further shortage of the offering to
    /// 30 min, from the base again 3 h after the last. A later mark never shortens an earlier
    /// one.
    pub fn mark(&self, offering: &Offering, failure: AllocationFailure, message: &str) -> Duration {
        let key = Key::of(offering, failure);
        let now = Instant::now();
        let ttl = match failure {
            AllocationFailure::NoCapacity => {
                let mut shortages = self.shortages.lock();
                shortages.retain(|_, (_, last)| {
                    now.saturating_duration_since(*last) < NO_CAPACITY_BACKOFF_RESET
                });
                // The run of an offering marked before its region was known goes on after.
                let run = shortages
                    .keys()
                    .find(|k| k.covers(&key))
                    .cloned()
                    .unwrap_or_else(|| key.clone());
                let (n, last) = shortages.entry(run).or_insert((0, now));
                *n = n.saturating_add(1);
                *last = now;
                no_capacity_backoff(*n)
            }
            _ => failure.ttl(self.quota_ttl),
        };
        let until = now + ttl;
        let mut marks = self.marks.lock();
        let entry = marks.entry(key).or_insert(Mark {
            failure,
            until,
            message: message.to_string(),
        });
        if entry.until <= until {
            *entry = Mark {
                failure,
                until,
                message: message.to_string(),
            };
        }
        ttl
    }

    /// Narrows the capacity-shortage mark of a group spanning several zones to the zones that
    /// ran short. `ZonalAllocationFailed` does not name its zone, so the refusal marked the
    /// group's whole zone set ([`UnavailableOfferings::mark`]); the VMs the allocation left
    /// `Failed` are in the zones Azure could not fill (`zones`). That mark is replaced by a mark
    /// of each of those zones (each backing off on its own run, and holding the single-zone
    /// groups of the size there too), and the group stays eligible: Azure places its next VMs in
    /// the zones it still has. Nothing changes when `zones` names none of the offering's zones or
    /// all of them, or when the whole mark is not a shortage's. Returns each zone marked, with
    /// its time.
    pub fn narrow(
        &self,
        offering: &Offering,
        zones: &[String],
        message: &str,
    ) -> Vec<(String, Duration)> {
        let mut short: Vec<String> = zones
            .iter()
            .map(|z| z.trim().to_string())
            .filter(|z| offering.zones.contains(z))
            .collect();
        short.sort();
        short.dedup();
        if offering.zones.len() < 2 || short.is_empty() || short.len() == offering.zones.len() {
            return Vec::new();
        }
        let whole = Key::Offering(offering.clone());
        {
            let mut marks = self.marks.lock();
            let shortage = marks
                .get(&whole)
                .is_some_and(|m| m.failure == AllocationFailure::NoCapacity);
            if !shortage {
                return Vec::new();
            }
            marks.remove(&whole);
        }
        // The whole set's run did not run short as a whole: its step is the zones' now.
        {
            let mut shortages = self.shortages.lock();
            let run = shortages.keys().find(|k| k.covers(&whole)).cloned();
            if let Some(run) = run {
                if let Some((n, _)) = shortages.get_mut(&run) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        shortages.remove(&run);
                    }
                }
            }
        }
        short
            .into_iter()
            .map(|z| {
                let one = Offering {
                    zones: vec![z.clone()],
                    ..offering.clone()
                };
                let ttl = self.mark(&one, AllocationFailure::NoCapacity, message);
                (z, ttl)
            })
            .collect()
    }

    /// Why `offering` is out now, if it is (the mark that lasts longest): a mark of the
    /// offering itself or of its family, or, for a group spanning several zones, a mark of
    /// each of its zones (then until the first of them runs out).
    pub fn check(&self, offering: &Offering) -> Option<Unavailable> {
        let now = Instant::now();
        let mut marks = self.marks.lock();
        marks.retain(|_, m| m.until > now);
        let longest = |wanted: &[Key]| {
            marks
                .iter()
                .filter(|(k, _)| wanted.iter().any(|w| k.covers(w)))
                .map(|(_, m)| m)
                .max_by_key(|m| m.until)
        };
        let family = offering.family().map(|f| Key::Family {
            location: offering.location.clone(),
            family: f.to_ascii_lowercase(),
            spot: offering.spot,
        });
        let wanted: Vec<Key> = [Some(Key::Offering(offering.clone())), family]
            .into_iter()
            .flatten()
            .collect();
        let whole = longest(&wanted);
        let every_zone = if offering.zones.len() > 1 {
            let per_zone: Option<Vec<&Mark>> = offering
                .zones
                .iter()
                .map(|z| {
                    let one = Offering {
                        zones: vec![z.clone()],
                        ..offering.clone()
                    };
                    longest(&[Key::Offering(one)])
                })
                .collect();
            per_zone.and_then(|p| p.into_iter().min_by_key(|m| m.until))
        } else {
            None
        };
        [whole, every_zone]
            .into_iter()
            .flatten()
            .max_by_key(|m| m.until)
            .map(|m| Unavailable {
                failure: m.failure,
                left: m.until.saturating_duration_since(now),
                message: m.message.clone(),
            })
    }

    /// Marks in force now: `(what, failure, left)`, for the status.
    pub fn list(&self) -> Vec<(String, AllocationFailure, Duration)> {
        let now = Instant::now();
        let mut marks = self.marks.lock();
        marks.retain(|_, m| m.until > now);
        let mut out: Vec<_> = marks
            .iter()
            .map(|(k, m)| {
                let what = match k {
                    Key::Offering(o) => o.to_string(),
                    Key::Family {
                        location,
                        family,
                        spot,
                    } => format!("{family}{} {location}", if *spot { " spot" } else { "" }),
                };
                (what, m.failure, m.until.saturating_duration_since(now))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_error_codes_fall_into_their_classes() {
        use AllocationFailure::*;
        let cases = [
            ("SkuNotAvailable", "The requested size for resource ... is currently not available in location 'westeurope' zones '1'", Some(SkuNotAvailable)),
            ("AllocationFailed", "Allocation failed. We do not have sufficient capacity for the requested VM size in this region.", Some(NoCapacity)),
            ("ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone.", Some(NoCapacity)),
            ("OverconstrainedAllocationRequest", "Allocation failed. VM(s) with the following constraints cannot be allocated", Some(NoCapacity)),
            ("OverconstrainedZonalAllocationRequest", "Allocation failed.", Some(NoCapacity)),
            ("QuotaExceeded", "Operation could not be completed as it results in exceeding approved Total Regional Cores quota.", Some(Quota)),
            ("OperationNotAllowed", "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: westeurope, Current Limit: 10, Current Usage: 8, Additional Required: 4", Some(Quota)),
            ("OperationNotAllowed", "Operation 'PUT' is not allowed on VM scale set 'pool-a' since the scale set is being deleted.", None),
            ("InternalServerError", "An internal server error occurred.", None),
            ("Conflict", "Another operation is in progress.", None),
        ];
        for (code, message, want) in cases {
            assert_eq!(
                AllocationFailure::classify(code, message),
                want,
                "{code}: {message}"
            );
        }
    }

    #[test]
    fn each_class_keeps_its_offering_out_for_a_time_that_fits_its_cause() {
        let quota = Duration::from_secs(300);
        assert_eq!(AllocationFailure::Quota.ttl(quota), quota);
        assert_eq!(
            AllocationFailure::SkuNotAvailable.ttl(quota),
            Duration::from_secs(23 * 3600)
        );
        assert_eq!(
            AllocationFailure::NoCapacity.ttl(quota),
            Duration::from_secs(300)
        );
    }

    fn d2s(zones: &[&str], spot: bool) -> Offering {
        let zones: Vec<String> = zones.iter().map(|z| z.to_string()).collect();
        Offering::new("WestEurope", "Standard_D2s_v5", &zones, spot)
    }

    #[tokio::test(start_paused = true)]
    async fn a_capacity_shortage_marks_only_its_size_zones_and_priority_until_its_time_is_up() {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        marks.mark(
            &d2s(&["1"], false),
            AllocationFailure::NoCapacity,
            "no room",
        );
        let out = marks.check(&d2s(&["1"], false)).unwrap();
        assert_eq!(out.failure, AllocationFailure::NoCapacity);
        assert_eq!(out.left, NO_CAPACITY_BACKOFF_BASE);
        assert!(marks.check(&d2s(&["2"], false)).is_none(), "another zone");
        assert!(marks.check(&d2s(&["1"], true)).is_none(), "spot");
        let d4 = Offering::new("westeurope", "Standard_D4s_v5", &["1".into()], false);
        assert!(marks.check(&d4).is_none(), "another size of the family");
        tokio::time::advance(NO_CAPACITY_BACKOFF_BASE - Duration::from_secs(1)).await;
        assert!(marks.check(&d2s(&["1"], false)).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(marks.check(&d2s(&["1"], false)).is_none());
        assert!(marks.list().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_quota_refusal_marks_the_whole_family_of_that_priority_in_that_region() {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        marks.mark(&d2s(&[], false), AllocationFailure::Quota, "quota");
        let d8 = Offering::new("westeurope", "Standard_D8s_v5", &["3".into()], false);
        assert_eq!(
            marks.check(&d8).map(|u| u.failure),
            Some(AllocationFailure::Quota)
        );
        let e4 = Offering::new("westeurope", "Standard_E4s_v5", &[], false);
        assert!(marks.check(&e4).is_none(), "another family");
        let elsewhere = Offering::new("northeurope", "Standard_D8s_v5", &[], false);
        assert!(marks.check(&elsewhere).is_none(), "another region");
        assert!(marks.check(&d2s(&[], true)).is_none(), "spot counts apart");
    }

    #[tokio::test(start_paused = true)]
    async fn a_mark_made_before_the_region_was_known_holds_the_offering_once_it_is() {
        // An agent pool reads without a region until its managed cluster has been read: the
        // shortage Azure reported then must still keep the pool out once the region is known
        // (a reliability schedule found the pool asked again 36 s later).
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        let unknown = Offering::new("", "Standard_NC6s_v3", &[], false);
        marks.mark(&unknown, AllocationFailure::NoCapacity, "no room");
        let known = Offering::new("westeurope", "Standard_NC6s_v3", &[], false);
        assert_eq!(
            marks.check(&known).map(|u| u.failure),
            Some(AllocationFailure::NoCapacity)
        );
        // And the other way round; a mark in one known region still leaves another alone.
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        marks.mark(&known, AllocationFailure::Quota, "quota");
        assert!(marks.check(&unknown).is_some());
        let elsewhere = Offering::new("northeurope", "Standard_NC6s_v3", &[], false);
        assert!(marks.check(&elsewhere).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_mark_never_cuts_a_longer_one_short() {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        let o = d2s(&[], false);
        marks.mark(&o, AllocationFailure::SkuNotAvailable, "not here");
        marks.mark(&o, AllocationFailure::NoCapacity, "no room");
        let out = marks.check(&o).unwrap();
        assert_eq!(out.failure, AllocationFailure::SkuNotAvailable);
        assert_eq!(out.left, SKU_NOT_AVAILABLE_TTL);
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_spanning_zones_is_out_only_once_each_of_its_zones_was_refused() {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        let both = d2s(&["1", "2"], false);
        marks.mark(
            &d2s(&["1"], false),
            AllocationFailure::NoCapacity,
            "zone 1 full",
        );
        assert!(
            marks.check(&both).is_none(),
            "zone 2 still has room: the group stays eligible"
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        marks.mark(
            &d2s(&["2"], false),
            AllocationFailure::NoCapacity,
            "zone 2 full",
        );
        let out = marks.check(&both).expect("both zones refused");
        assert_eq!(out.failure, AllocationFailure::NoCapacity);
        assert_eq!(
            out.left,
            NO_CAPACITY_BACKOFF_BASE - Duration::from_secs(60),
            "back in as soon as one zone's mark runs out"
        );
        assert!(marks.check(&d2s(&["1", "2", "3"], false)).is_none());
        assert!(marks.check(&d2s(&["1", "2"], true)).is_none(), "spot");
        tokio::time::advance(NO_CAPACITY_BACKOFF_BASE - Duration::from_secs(60)).await;
        assert!(marks.check(&both).is_none());
        assert!(marks.check(&d2s(&["2"], false)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_zonal_refusal_of_a_group_spanning_zones_narrowed_to_the_zone_that_ran_short_keeps_the_group_eligible(
    ) {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        let all = d2s(&["1", "2", "3"], false);
        // The refusal marks the whole zone set first (the code names no zone).
        marks.mark(&all, AllocationFailure::NoCapacity, "zone short");
        assert!(marks.check(&all).is_some());
        // Its Failed VMs are in zone 2: only zone 2 is out.
        let narrowed = marks.narrow(&all, &["2".into(), "2".into()], "zone short");
        assert_eq!(narrowed, [("2".to_string(), NO_CAPACITY_BACKOFF_BASE)]);
        assert!(marks.check(&all).is_none(), "zones 1 and 3 still have room");
        assert!(
            marks.check(&d2s(&["2"], false)).is_some(),
            "zone 2's own group"
        );
        assert!(marks.check(&d2s(&["1"], false)).is_none());
        // The whole set's run was given back: its next refusal starts at the base again, and
        // zone 2's own run goes on.
        assert_eq!(
            marks.mark(&all, AllocationFailure::NoCapacity, "again"),
            NO_CAPACITY_BACKOFF_BASE
        );
        assert_eq!(
            marks.narrow(&all, &["2".into()], "again"),
            [("2".to_string(), NO_CAPACITY_BACKOFF_BASE * 2)]
        );
        // Every zone, no zone, or a zone the group does not span: the whole mark stands.
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        marks.mark(&all, AllocationFailure::NoCapacity, "short");
        for zones in [vec!["1", "2", "3"], vec![], vec!["4"]] {
            let zones: Vec<String> = zones.into_iter().map(String::from).collect();
            assert!(marks.narrow(&all, &zones, "short").is_empty());
            assert!(marks.check(&all).is_some());
        }
        // Another cause's mark is never narrowed.
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        marks.mark(&all, AllocationFailure::SkuNotAvailable, "not here");
        assert!(marks.narrow(&all, &["2".into()], "short").is_empty());
        assert!(marks.check(&all).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_shortages_in_a_row_back_off_from_five_minutes_doubling_to_thirty() {
        let marks = UnavailableOfferings::new(Duration::from_secs(300));
        let zone1 = d2s(&["1"], false);
        let mut got = Vec::new();
        for _ in 0..5 {
            let ttl = marks.mark(&zone1, AllocationFailure::NoCapacity, "no room");
            assert_eq!(marks.check(&zone1).map(|u| u.left), Some(ttl));
            got.push(ttl.as_secs() / 60);
            tokio::time::advance(ttl).await;
            assert!(marks.check(&zone1).is_none(), "out only for its backoff");
        }
        assert_eq!(got, [5, 10, 20, 30, 30]);
        // Another offering backs off on its own.
        let other = marks.mark(
            &d2s(&["2"], false),
            AllocationFailure::NoCapacity,
            "no room",
        );
        assert_eq!(other, NO_CAPACITY_BACKOFF_BASE);
        // Three hours without a shortage: from the base again.
        tokio::time::advance(NO_CAPACITY_BACKOFF_RESET).await;
        let again = marks.mark(&zone1, AllocationFailure::NoCapacity, "no room");
        assert_eq!(again, NO_CAPACITY_BACKOFF_BASE);
    }
}
