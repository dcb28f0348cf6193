//! The API budget Azure reports, and how close to its reserve this process runs.
//!
//! Every ARM answer carries what is left of the buckets it was charged to:
//! `x-ms-ratelimit-remaining-subscription-reads` / `-writes` / `-deletes` (ARM's per-subscription
//! buckets) and Compute's `x-ms-ratelimit-remaining-resource`
//! (`Microsoft.Compute/<policy>;<count>` entries, one per policy). The buckets are the
//! subscription's, not this process's: every cluster and tool in the subscription spends from
//! them, so the remaining counts are the state a fleet of controllers shares, with no channel
//! between them. Each controller keeps a reserve of every bucket and, as the remaining falls
//! toward it, stretches its refreshes and sends only its most urgent writes; many controllers
//! reading the same counts back off together and converge on a share of what is left.
//!
//! A bucket's size is not reported: it is estimated as the largest remaining count seen (a bucket
//! is full when nobody has spent from it for a while, as at start).
//!
//! ARM's buckets are the subscription's. Compute's are the subscription's **in one region** (all
//! of Compute's policies are per region): the view keeps them per region, learning where each
//! scale set is from the scale sets this process reads ([`ArmBudget::locate`]), and a write asks
//! the budget of its scale set's region ([`ArmBudget::fraction_in`]). A Compute policy's class is
//! read from its name (`...Delete...`: deletes; `...Get...` or `...List...`: reads; anything else,
//! `UpdateVMScaleSet3Min`, `VMScaleSetBatchedVMRequests5Min`, `VmssQueuedVMOperations`: writes).
//! Azure documents these counts as the subscription's (its samples show no per-resource policy);
//! a policy of a single resource, if Azure reported one, would make the region look emptier than
//! it is: this process would pace earlier, never later.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// How long a low count holds this process's non-urgent writes before one goes to look again.
/// A bucket refills with time, and its count is only seen in answers to requests it pays for (the
/// update bucket in answers to writes): a low count kept for ever would hold the non-urgent writes
/// for ever, since they are the requests that would show it refilled. When the count that holds a
/// write is older than this, one write goes as a probe (one per this long), and its answer shows
/// the bucket as it is. Compute's buckets refill from empty to full in 3 minutes at Azure's
/// published rates (500/min, burst 1,500); ARM's write bucket in 20 s.
pub const BUDGET_MEMORY: Duration = Duration::from_secs(300);

/// What the answers said of one bucket.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The last remaining count.
    left: i64,
    /// The largest remaining count seen: the bucket's size, as estimated.
    size: i64,
    /// When the last count was seen.
    at: Instant,
    /// When a write last went to look at this bucket again ([`ArmBudget::probe`]).
    probed: Option<Instant>,
}

impl Seen {
    /// The share left: 0 for a bucket seen empty, whatever its size.
    fn fraction(&self) -> f64 {
        if self.size <= 0 {
            0.0
        } else {
            self.left.max(0) as f64 / self.size as f64
        }
    }
}

/// What a bucket pays for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetClass {
    /// GET, LIST, operation polls.
    Reads,
    /// PUT, PATCH, POST other than deletes.
    Writes,
    /// Deletes (of instances by name too).
    Deletes,
}

impl BudgetClass {
    /// The `class` label of `arm_budget_fraction`.
    pub fn label(self) -> &'static str {
        match self {
            BudgetClass::Reads => "reads",
            BudgetClass::Writes => "writes",
            BudgetClass::Deletes => "deletes",
        }
    }

    /// Every class.
    pub const ALL: [BudgetClass; 3] = [
        BudgetClass::Reads,
        BudgetClass::Writes,
        BudgetClass::Deletes,
    ];

    /// The class a subscription bucket (the scope of an `x-ms-ratelimit-remaining-<scope>`
    /// header, `subscription-reads`) pays for; `None` for anything else (tenant buckets).
    pub fn of(scope: &str) -> Option<BudgetClass> {
        match scope.to_ascii_lowercase().as_str() {
            "subscription-reads" => Some(BudgetClass::Reads),
            "subscription-writes" => Some(BudgetClass::Writes),
            "subscription-deletes" => Some(BudgetClass::Deletes),
            _ => None,
        }
    }

    /// The class a Compute policy (`Microsoft.Compute/<policy>`, an entry of
    /// `x-ms-ratelimit-remaining-resource`) pays for, read from its name; `None` for another
    /// provider's.
    pub fn of_policy(policy: &str) -> Option<BudgetClass> {
        let (provider, name) = policy.rsplit_once('/')?;
        if !provider.eq_ignore_ascii_case("Microsoft.Compute") {
            return None;
        }
        let name = name.to_ascii_lowercase();
        Some(if name.contains("delete") {
            BudgetClass::Deletes
        } else if name.contains("get") || name.contains("list") {
            BudgetClass::Reads
        } else {
            BudgetClass::Writes
        })
    }
}

/// Whose bucket a count is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Scope {
    /// ARM's, of the subscription (`subscription-writes`).
    Subscription(String),
    /// Compute's, of the subscription in a region (lowercased; `None`: not known yet).
    Region(Option<String>, String),
}

impl Scope {
    fn class(&self) -> Option<BudgetClass> {
        match self {
            Scope::Subscription(s) => BudgetClass::of(s),
            Scope::Region(_, policy) => BudgetClass::of_policy(policy),
        }
    }

    /// Whether this bucket is one of `class` that a request in `region` spends from.
    fn counts_for(&self, class: BudgetClass, region: Option<&str>) -> bool {
        self.class() == Some(class) && self.covers(region)
    }

    /// Whether a write in `region` spends from this bucket (`None`: any region).
    fn covers(&self, region: Option<&str>) -> bool {
        match (self, region) {
            (Scope::Subscription(_), _) | (_, None) => true,
            (Scope::Region(Some(r), _), Some(want)) => r.eq_ignore_ascii_case(want),
            (Scope::Region(None, _), Some(_)) => false,
        }
    }
}

/// Remaining counts by bucket, with each bucket's size as estimated.
#[derive(Debug, Default)]
pub struct ArmBudget {
    buckets: Mutex<HashMap<Scope, Seen>>,
    /// Scale set (lowercased name) → its region (lowercased).
    regions: Mutex<HashMap<String, String>>,
}

impl ArmBudget {
    /// Records what an answer said is left in ARM's subscription bucket `scope`
    /// (`subscription-writes`).
    pub fn observe(&self, scope: &str, remaining: i64) {
        self.record(Scope::Subscription(scope.to_string()), remaining);
    }

    /// Records what an answer said is left of Compute's `policy` (`Microsoft.Compute/<name>`)
    /// in `region` (`None`: the answer's region is not known).
    pub fn observe_in(&self, region: Option<&str>, policy: &str, remaining: i64) {
        self.record(
            Scope::Region(region.map(str::to_ascii_lowercase), policy.to_string()),
            remaining,
        );
    }

    fn record(&self, scope: Scope, remaining: i64) {
        let mut buckets = self.buckets.lock();
        if let Scope::Region(Some(_), policy) = &scope {
            // Counted before the region was known: superseded.
            buckets.remove(&Scope::Region(None, policy.clone()));
        }
        let now = Instant::now();
        let e = buckets.entry(scope).or_insert(Seen {
            left: remaining,
            size: 0,
            at: now,
            probed: None,
        });
        e.left = remaining;
        e.size = e.size.max(remaining);
        e.at = now;
    }

    /// Learns that scale set `name` is in `region`, so that Compute's counts in answers about it
    /// count toward that region.
    pub fn locate(&self, name: &str, region: &str) {
        if name.is_empty() || region.is_empty() {
            return;
        }
        self.regions
            .lock()
            .insert(name.to_ascii_lowercase(), region.to_ascii_lowercase());
    }

    /// The region Compute charged an answer to a request for `path` in: the `locations` segment
    /// of the path, else the region of the scale set it names, else the one region every known
    /// scale set is in (a resource group's LIST); `None` when none of these says.
    pub fn region_of(&self, path: &str) -> Option<String> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let after = |key: &str| {
            segs.iter()
                .position(|s| s.eq_ignore_ascii_case(key))
                .and_then(|i| segs.get(i + 1))
                .map(|s| s.to_ascii_lowercase())
        };
        if let Some(location) = after("locations") {
            return Some(location);
        }
        let regions = self.regions.lock();
        if let Some(name) = after("virtualMachineScaleSets") {
            if let Some(r) = regions.get(&name) {
                return Some(r.clone());
            }
        }
        let mut all = regions.values();
        let first = all.next()?;
        all.all(|r| r == first).then(|| first.clone())
    }

    /// The share left of the emptiest bucket of `class` (0.0 to 1.0) anywhere, if one was
    /// reported.
    pub fn fraction(&self, class: BudgetClass) -> Option<f64> {
        self.fraction_in(class, None)
    }

    /// The share left of the emptiest bucket of `class` a request in `region` spends from:
    /// ARM's subscription bucket and Compute's buckets in that region (`None`: every region).
    pub fn fraction_in(&self, class: BudgetClass, region: Option<&str>) -> Option<f64> {
        self.buckets
            .lock()
            .iter()
            .filter(|(scope, _)| scope.counts_for(class, region))
            .map(|(_, seen)| seen.fraction())
            .reduce(f64::min)
    }

    /// Gives back a probe [`ArmBudget::probe`] granted at `at` whose write was never sent (a
    /// removal that stopped before its delete): the bucket may be probed again at once. True
    /// if it was that probe (a later probe, or a fresh count since, is left alone).
    pub fn unprobe(&self, class: BudgetClass, region: Option<&str>, at: Instant) -> bool {
        let mut buckets = self.buckets.lock();
        let mut given = false;
        for (_, seen) in buckets
            .iter_mut()
            .filter(|(scope, _)| scope.counts_for(class, region))
        {
            if seen.probed == Some(at) {
                seen.probed = None;
                given = true;
            }
        }
        given
    }

    /// Whether a write that the emptiest bucket of `class` in `region` holds may go anyway, to
    /// look at the bucket again: its count is older than [`BUDGET_MEMORY`], and no write went to
    /// look in the last [`BUDGET_MEMORY`]. A `true` answer is that write: the next probe is a
    /// [`BUDGET_MEMORY`] later (or never, once an answer brings a fresh count).
    pub fn probe(&self, class: BudgetClass, region: Option<&str>) -> bool {
        self.probe_at(class, region, Instant::now())
    }

    /// [`ArmBudget::probe`] as of `now` (the time [`ArmBudget::unprobe`] is then given).
    pub fn probe_at(&self, class: BudgetClass, region: Option<&str>, now: Instant) -> bool {
        let mut buckets = self.buckets.lock();
        let emptiest = buckets
            .iter_mut()
            .filter(|(scope, _)| scope.counts_for(class, region))
            .map(|(_, seen)| seen)
            .min_by(|a, b| a.fraction().total_cmp(&b.fraction()));
        let Some(seen) = emptiest else {
            return false;
        };
        let old = |t: Instant| now.saturating_duration_since(t) >= BUDGET_MEMORY;
        let due = old(seen.at) && seen.probed.is_none_or(old);
        if due {
            seen.probed = Some(now);
        }
        due
    }
}

/// How this process paces itself against the reserve (`armBudgetReservePercentage`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// The share of each bucket kept in reserve (0.0: pacing off).
    pub reserve: f64,
}

/// The longest a refresh interval is stretched, as a multiple.
pub const MAX_STRETCH: f64 = 4.0;

impl Pacing {
    /// How much longer than usual to wait between refreshes with `left` of the reads budget:
    /// 1 at or above the reserve, growing linearly to [`MAX_STRETCH`] as it runs out.
    pub fn stretch(self, left: Option<f64>) -> f64 {
        match left {
            Some(f) if self.reserve > 0.0 && f < self.reserve => {
                1.0 + (MAX_STRETCH - 1.0) * (1.0 - f / self.reserve).clamp(0.0, 1.0)
            }
            _ => 1.0,
        }
    }

    /// Whether a write of `urgency` waits with `left` of its class's budget. Urgent writes
    /// (capacity for pending pods) always go, until Azure itself says 429; deletions of
    /// unneeded nodes wait below half the reserve; everything else below the reserve.
    pub fn holds(self, urgency: Urgency, left: Option<f64>) -> bool {
        let Some(f) = left else {
            return false;
        };
        match urgency {
            Urgency::ScaleUp => false,
            Urgency::ScaleDown => f < self.reserve / 2.0,
            Urgency::Other => f < self.reserve,
        }
    }
}

/// Which writes go first when the budget runs low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// More capacity: pods wait for it.
    ScaleUp,
    /// Deleting an unneeded node: money, not availability.
    ScaleDown,
    /// Lowering a capacity number (a schedule ending) and anything else.
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm_buckets_and_compute_policies_count_toward_their_class_and_tenant_buckets_do_not() {
        assert_eq!(
            BudgetClass::of("subscription-reads"),
            Some(BudgetClass::Reads)
        );
        assert_eq!(
            BudgetClass::of("subscription-deletes"),
            Some(BudgetClass::Deletes)
        );
        assert_eq!(
            BudgetClass::of("subscription-writes"),
            Some(BudgetClass::Writes)
        );
        assert_eq!(BudgetClass::of("tenant-reads"), None);
        for (policy, class) in [
            (
                "Microsoft.Compute/UpdateVMScaleSet3Min",
                BudgetClass::Writes,
            ),
            (
                "Microsoft.Compute/VmssQueuedVMOperations",
                BudgetClass::Writes,
            ),
            (
                "Microsoft.Compute/DeleteVMScaleSet30Min",
                BudgetClass::Deletes,
            ),
            (
                "Microsoft.Compute/HighCostGetVMScaleSet30Min",
                BudgetClass::Reads,
            ),
            ("microsoft.compute/GetVMScaleSet3Min", BudgetClass::Reads),
        ] {
            assert_eq!(BudgetClass::of_policy(policy), Some(class), "{policy}");
        }
        assert_eq!(BudgetClass::of_policy("Microsoft.Network/Update;3"), None);
        assert_eq!(BudgetClass::of_policy("UpdateVMScaleSet3Min"), None);
    }

    #[test]
    fn the_share_left_is_the_emptiest_bucket_against_the_most_it_ever_showed() {
        let b = ArmBudget::default();
        assert_eq!(b.fraction(BudgetClass::Writes), None);
        b.observe("subscription-writes", 1000);
        b.observe("subscription-writes", 250);
        b.observe_in(
            Some("westeurope"),
            "Microsoft.Compute/UpdateVMScaleSet3Min",
            12,
        );
        assert_eq!(b.fraction(BudgetClass::Writes), Some(0.25));
        b.observe_in(
            Some("westeurope"),
            "Microsoft.Compute/UpdateVMScaleSet3Min",
            1,
        );
        assert_eq!(b.fraction(BudgetClass::Writes), Some(1.0 / 12.0));
        b.observe("subscription-deletes", 0);
        assert_eq!(
            b.fraction(BudgetClass::Deletes),
            Some(0.0),
            "seen empty: empty, whatever its size"
        );
        b.observe("subscription-deletes", 500);
        b.observe("subscription-deletes", 50);
        assert_eq!(b.fraction(BudgetClass::Deletes), Some(0.1));
        assert_eq!(b.fraction(BudgetClass::Reads), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_held_by_an_old_count_goes_once_per_memory_to_see_the_bucket_again() {
        let b = ArmBudget::default();
        let update = "Microsoft.Compute/UpdateVMScaleSet3Min";
        let west = Some("westeurope");
        b.observe_in(west, update, 0);
        assert_eq!(
            b.fraction(BudgetClass::Writes),
            Some(0.0),
            "seen empty: empty"
        );
        assert!(!b.probe(BudgetClass::Writes, west), "a fresh count holds");
        tokio::time::advance(BUDGET_MEMORY).await;
        assert!(b.probe(BudgetClass::Writes, west), "one write goes to look");
        assert!(!b.probe(BudgetClass::Writes, west), "one only");
        assert!(
            !b.probe(BudgetClass::Writes, Some("northeurope")),
            "nothing seen there: nothing holds"
        );
        tokio::time::advance(BUDGET_MEMORY - Duration::from_secs(1)).await;
        assert!(!b.probe(BudgetClass::Writes, west));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            b.probe(BudgetClass::Writes, west),
            "its answer never came: again"
        );
        b.observe_in(west, update, 0);
        tokio::time::advance(BUDGET_MEMORY - Duration::from_secs(1)).await;
        assert!(!b.probe(BudgetClass::Writes, west), "a fresh count again");
    }

    #[test]
    fn a_region_running_low_paces_writes_there_and_not_in_another_region() {
        let b = ArmBudget::default();
        b.observe("subscription-writes", 200);
        for region in ["westeurope", "northeurope"] {
            b.observe_in(Some(region), "Microsoft.Compute/UpdateVMScaleSet3Min", 100);
        }
        b.observe_in(
            Some("WestEurope"),
            "Microsoft.Compute/UpdateVMScaleSet3Min",
            10,
        );
        assert_eq!(
            b.fraction_in(BudgetClass::Writes, Some("westeurope")),
            Some(0.1)
        );
        assert_eq!(
            b.fraction_in(BudgetClass::Writes, Some("northeurope")),
            Some(1.0)
        );
        assert_eq!(
            b.fraction(BudgetClass::Writes),
            Some(0.1),
            "anywhere: the emptiest"
        );
        b.observe("subscription-writes", 20);
        assert_eq!(
            b.fraction_in(BudgetClass::Writes, Some("northeurope")),
            Some(0.1),
            "ARM's bucket is the subscription's, in every region"
        );
    }

    #[test]
    fn an_answer_is_charged_to_the_region_its_path_or_its_scale_set_is_in() {
        let b = ArmBudget::default();
        let list = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets";
        assert_eq!(b.region_of(list), None, "nothing known yet");
        assert_eq!(
            b.region_of("/subscriptions/s/providers/Microsoft.Compute/locations/EastUS/usages"),
            Some("eastus".to_string())
        );
        b.locate("pool-a", "westeurope");
        assert_eq!(
            b.region_of(list),
            Some("westeurope".to_string()),
            "one region known"
        );
        b.locate("Pool-B", "NorthEurope");
        assert_eq!(b.region_of(list), None, "a LIST across two regions");
        assert_eq!(
            b.region_of(&format!("{list}/pool-b/virtualMachines")),
            Some("northeurope".to_string())
        );
        assert_eq!(
            b.region_of(&format!("{list}/pool-a")),
            Some("westeurope".to_string())
        );
    }

    #[test]
    fn a_count_from_before_the_region_was_known_is_superseded_once_it_is() {
        let b = ArmBudget::default();
        let policy = "Microsoft.Compute/GetVMScaleSet3Min";
        b.observe_in(None, policy, 100);
        b.observe_in(None, policy, 5);
        assert_eq!(b.fraction(BudgetClass::Reads), Some(0.05));
        assert_eq!(
            b.fraction_in(BudgetClass::Reads, Some("westeurope")),
            None,
            "not known to be this region's"
        );
        b.observe_in(Some("westeurope"), policy, 90);
        assert_eq!(b.fraction(BudgetClass::Reads), Some(1.0));
    }

    #[test]
    fn below_the_reserve_refreshes_stretch_and_only_urgent_writes_go() {
        let p = Pacing { reserve: 0.2 };
        assert_eq!(p.stretch(None), 1.0);
        assert_eq!(p.stretch(Some(0.5)), 1.0);
        assert_eq!(p.stretch(Some(0.1)), 2.5);
        assert_eq!(p.stretch(Some(0.0)), MAX_STRETCH);
        assert!(!p.holds(Urgency::ScaleUp, Some(0.0)));
        assert!(!p.holds(Urgency::ScaleDown, Some(0.15)));
        assert!(p.holds(Urgency::ScaleDown, Some(0.05)));
        assert!(p.holds(Urgency::Other, Some(0.15)));
        assert!(!p.holds(Urgency::Other, Some(0.25)));
        assert!(
            !p.holds(Urgency::Other, None),
            "nothing reported: no pacing"
        );
        let off = Pacing { reserve: 0.0 };
        assert_eq!(off.stretch(Some(0.0)), 1.0);
        assert!(!off.holds(Urgency::Other, Some(0.0)));
    }
}
