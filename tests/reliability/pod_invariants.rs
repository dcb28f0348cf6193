//! Issue 41's invariants on the pod-driven schedules (`pods.rs`), judged on what a sampler saw of
//! the simulated cluster every [`EVERY`] of the schedule's (paused) clock, and on the ARM
//! request log:
//!
//! 1. **No group above its pods' need plus in-flight**: the controller never grows a group that
//!    has had a Ready node of its own, not being removed, running no pod but DaemonSets', all
//!    through the [`IDLE_BEFORE_GROWTH`] before the write and still at the first sample after
//!    it: any pod of the group would have gone there, so the growth was for pods the group's
//!    nodes cannot take (a runaway). Nor does it grow a group again, within [`RUNAWAY_WINDOW`]
//!    (the first "did not help" backoff), for pods that waited two samples in a row beside a
//!    Ready idle node of it and still wait (a runaway that churns: grown, emptied, grown).
//! 2. **No node we cordoned stays cordoned past a bound without progress**: a node carrying the
//!    controller's to-be-deleted taint is gone, or has lost a pod, or is left alone (untainted
//!    for [`QUIET`]) within [`CORDON_BOUND`] of being tainted or of its last progress;
//!    taint-untaint cycles that never get anywhere count as one stay.
//! 3. **No pod pending past a bound while a group that fits it is healthy**: a pod of a workload
//!    with one obvious home (web, batch: general; cache: memory; train: gpu; preempt: spot or
//!    general) is not pending for [`PENDING_BOUND`] of samples in which a group that fits it was
//!    healthy: below its max, no fault or rival step of the schedule reaching it and no error
//!    answered to the controller's requests about it within [`HEALTHY_AFTER`], the Kubernetes
//!    API and the token endpoint undisturbed as long.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::sim::nodes::scale_set_of;
use vmss_capacity_controller::emulator::RequestRecord;

/// How often the sampler looks.
pub const EVERY: Duration = Duration::from_secs(10);
/// Invariant 1's window.
pub const IDLE_BEFORE_GROWTH: Duration = Duration::from_secs(6 * 60);
/// Invariant 1's memory of pods a group's nodes did not take: the first "did not help" backoff.
pub const RUNAWAY_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Invariant 2's bound (longer than a drain's `maxPodEvictionTime`, a long-terminating pod's
/// grace plus 30 s, and a stuck VM's settling).
pub const CORDON_BOUND: Duration = Duration::from_secs(20 * 60);
/// Untainted this long, a node's stay is over.
pub const QUIET: Duration = Duration::from_secs(15 * 60);
/// Invariant 3's bound.
pub const PENDING_BOUND: Duration = Duration::from_secs(10 * 60);
/// How long after a disturbance a group is not yet healthy again (longer than any backoff of
/// a write, 5 min plus jitter, and a boot).
pub const HEALTHY_AFTER: Duration = Duration::from_secs(10 * 60);

/// The controller's taint on a node it removes.
const OURS: &str = "vmss-capacity-controller/to-be-deleted";

#[derive(Debug, Clone)]
pub struct NodeSample {
    pub name: String,
    pub group: Option<usize>,
    pub ready: bool,
    pub tainted: bool,
    /// Pods bound to it that are no DaemonSet's and not being deleted.
    pub pods: usize,
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub capacity: Vec<i64>,
    pub nodes: Vec<NodeSample>,
    /// Pending pods of namespace `default`: `(name, app label)`.
    pub pending: Vec<(String, String)>,
}

/// Something the schedule did that makes groups unhealthy for a while: `None` reaches every
/// group.
#[derive(Debug, Clone)]
pub struct Disturbance {
    pub group: Option<usize>,
    pub from: Instant,
    pub until: Instant,
}

fn is_daemon(p: &Value) -> bool {
    p.pointer("/metadata/ownerReferences/0/kind")
        .and_then(Value::as_str)
        == Some("DaemonSet")
}

/// One look at the cluster. `group_of` maps a scale set's name (lowercased) to its group.
pub fn sample(kube: &KubeState, group_of: &HashMap<String, usize>, capacity: Vec<i64>) -> Sample {
    let pods = kube.list_all("v1", "pods", None);
    let mut on: HashMap<&str, usize> = HashMap::new();
    let mut pending = Vec::new();
    for p in &pods {
        if is_daemon(p) {
            continue;
        }
        let deleting = p.pointer("/metadata/deletionTimestamp").is_some();
        match p.pointer("/spec/nodeName").and_then(Value::as_str) {
            Some(n) if !deleting => *on.entry(n).or_default() += 1,
            Some(_) => {}
            None if !deleting
                && p.pointer("/metadata/namespace").and_then(Value::as_str) == Some("default") =>
            {
                pending.push((
                    p.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    p.pointer("/metadata/labels/app")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                ));
            }
            None => {}
        }
    }
    let nodes = kube
        .list_all("v1", "nodes", None)
        .iter()
        .map(|n| {
            let name = n
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let group = n
                .pointer("/spec/providerID")
                .and_then(Value::as_str)
                .and_then(scale_set_of)
                .and_then(|ss| group_of.get(&ss.to_ascii_lowercase()).copied());
            let ready = n
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            let tainted = n
                .pointer("/spec/taints")
                .and_then(Value::as_array)
                .is_some_and(|ts| ts.iter().any(|t| t["key"] == OURS));
            let pods = on.get(name.as_str()).copied().unwrap_or(0);
            NodeSample {
                name,
                group,
                ready,
                tainted,
                pods,
            }
        })
        .collect();
    Sample {
        at: Instant::now(),
        capacity,
        nodes,
        pending,
    }
}

/// Starts sampling every [`EVERY`] into `into` until aborted.
pub fn start_sampler(
    kube: KubeState,
    group_of: HashMap<String, usize>,
    capacity: Arc<dyn Fn() -> Vec<i64> + Send + Sync>,
    into: Arc<parking_lot::Mutex<Vec<Sample>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let s = sample(&kube, &group_of, capacity());
            into.lock().push(s);
            tokio::time::sleep(EVERY).await;
        }
    })
}

/// What the checks need of the schedule.
pub struct Judged<'a> {
    pub samples: &'a [Sample],
    pub log: &'a [RequestRecord],
    pub writer: &'a str,
    /// Group names, in order.
    pub groups: &'a [&'a str],
    pub mins: &'a [u32],
    pub maxes: &'a [u32],
    /// Groups invariant 1 judges (not the zonal ones: a spread's pods may wait on another zone).
    pub judged_for_growth: &'a [bool],
    /// Workloads no group's real nodes take (invariant 3 does not wait for them).
    pub homeless: &'a [&'a str],
    /// Nodes the schedule made sick on purpose (a dead kubelet, a VM stuck): never "idle".
    pub sick: &'a HashSet<String>,
    pub disturbances: &'a [Disturbance],
    /// Whether request `r` addresses group `g`'s resource or its instances.
    pub addresses: &'a dyn Fn(&RequestRecord, usize) -> bool,
    /// How long Azure's refusal of request `r` holds its offering (zero for no allocation
    /// failure): the group is not healthy meanwhile.
    pub hold_of: &'a dyn Fn(&RequestRecord) -> Duration,
    /// Whether it is a capacity write (PUT) to group `g`.
    pub is_capacity_write: &'a dyn Fn(&RequestRecord, usize) -> bool,
}

/// Invariant 1; the violations, described.
pub fn no_growth_past_need(j: &Judged<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for r in j.log {
        if r.writer.as_deref() != Some(j.writer) || r.status >= 300 {
            continue;
        }
        let Some(g) = (0..j.groups.len()).find(|g| (j.is_capacity_write)(r, *g)) else {
            continue;
        };
        if !j.judged_for_growth[g] {
            continue;
        }
        let Some(c1) = r.body_capacity else {
            continue;
        };
        if c1 <= i64::from(j.mins[g]) {
            continue;
        }
        // From the window's start to the first sample after the write: a node idle before and
        // still idle after stood there all along (pods the write was for would have gone to
        // it within the scheduler's next tick).
        let after = j.samples.iter().find(|s| s.at > r.at);
        let window: Vec<&Sample> = j
            .samples
            .iter()
            .filter(|s| s.at <= r.at && r.at.duration_since(s.at) <= IDLE_BEFORE_GROWTH)
            .chain(after)
            .collect();
        // The window must be covered from its start.
        let Some(first) = window.first() else {
            continue;
        };
        if r.at.duration_since(first.at) + EVERY * 2 < IDLE_BEFORE_GROWTH {
            continue;
        }
        let Some(before) = window.iter().rev().find(|s| s.at <= r.at) else {
            continue;
        };
        if c1 <= before.capacity[g] || after.is_none() {
            continue;
        }
        let idle = |s: &Sample| -> HashSet<String> {
            s.nodes
                .iter()
                .filter(|n| n.group == Some(g) && n.ready && !n.tainted && n.pods == 0)
                .filter(|n| !j.sick.contains(&n.name))
                .map(|n| n.name.clone())
                .collect()
        };
        let mut always = idle(window[0]);
        for s in &window[1..] {
            let now = idle(s);
            always.retain(|n| now.contains(n));
        }
        // Or: within the last backoff, pods whose home is the group waited (two samples in a
        // row) beside a node of it standing Ready and idle, and still wait: its nodes do not
        // take them, and the group grows again for them (the runaway of issue 41).
        let since = r.at.checked_sub(RUNAWAY_WINDOW).unwrap_or(r.at);
        let recent: Vec<&Sample> = j
            .samples
            .iter()
            .filter(|s| s.at >= since && s.at <= r.at)
            .collect();
        let shunned = |s: &Sample| -> HashSet<String> {
            if idle(s).is_empty() {
                return HashSet::new();
            }
            s.pending
                .iter()
                .filter(|(_, app)| homes(app, j.groups).contains(&g))
                .map(|(n, _)| n.clone())
                .collect()
        };
        let still: HashSet<String> = before.pending.iter().map(|(n, _)| n.clone()).collect();
        let mut shunning: Vec<String> = recent
            .windows(2)
            .flat_map(|w| {
                let b = shunned(w[1]);
                shunned(w[0])
                    .into_iter()
                    .filter(move |n| b.contains(n))
                    .collect::<Vec<_>>()
            })
            .filter(|n| still.contains(n))
            .collect();
        shunning.sort();
        shunning.dedup();
        if !shunning.is_empty() {
            out.push(format!(
                "invariant 1 (no group above its pods' need plus in-flight): the controller grew {} to {c1} (seq {}) for pods {:?} that waited beside its idle Ready nodes within the last {} s",
                j.groups[g],
                r.seq,
                shunning,
                RUNAWAY_WINDOW.as_secs()
            ));
            continue;
        }
        if !always.is_empty() {
            out.push(format!(
                "invariant 1 (no group above its pods' need plus in-flight): the controller grew {} to {c1} (seq {}) while its nodes {:?} had stood Ready and idle for {} s",
                j.groups[g],
                r.seq,
                always,
                IDLE_BEFORE_GROWTH.as_secs()
            ));
        }
    }
    out
}

/// Invariant 2; the violations, described.
pub fn no_endless_cordon(samples: &[Sample]) -> Vec<String> {
    #[derive(Default)]
    struct Stay {
        since: Option<Instant>,
        untainted_since: Option<Instant>,
        pods: usize,
        reported: bool,
    }
    let mut stays: BTreeMap<String, Stay> = BTreeMap::new();
    let mut out = Vec::new();
    for s in samples {
        let present: HashSet<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
        stays.retain(|name, _| present.contains(name.as_str()));
        for n in &s.nodes {
            let st = stays.entry(n.name.clone()).or_default();
            if n.pods < st.pods && st.since.is_some() {
                // A pod left it: progress.
                st.since = Some(s.at);
            }
            st.pods = n.pods;
            if n.tainted {
                st.untainted_since = None;
                let since = *st.since.get_or_insert(s.at);
                if s.at.duration_since(since) > CORDON_BOUND && !st.reported {
                    st.reported = true;
                    out.push(format!(
                        "invariant 2 (no node we cordoned stays cordoned past a bound without progress): node {} tainted {} s without losing a pod or going",
                        n.name,
                        s.at.duration_since(since).as_secs()
                    ));
                }
            } else if st.since.is_some() {
                let quiet = *st.untainted_since.get_or_insert(s.at);
                if s.at.duration_since(quiet) >= QUIET {
                    st.since = None;
                    st.untainted_since = None;
                }
            }
        }
    }
    out
}

/// The groups a pod of workload `app` fits (by index in `groups`), if it is one invariant 3
/// judges.
fn homes(app: &str, groups: &[&str]) -> Vec<usize> {
    let names: &[&str] = match app {
        "web" | "batch" => &["general"],
        "cache" => &["memory"],
        "train" => &["gpu"],
        "preempt" => &["spot", "general"],
        _ => &[],
    };
    names
        .iter()
        .filter_map(|n| groups.iter().position(|g| g == n))
        .collect()
}

/// Invariant 3; the violations, described.
pub fn no_pod_waits_for_a_healthy_group(j: &Judged<'_>) -> Vec<String> {
    // When the controller's requests about each group were refused (a 412 is re-planned at
    // once, not a refusal), in order.
    let refusals: Vec<Vec<(Instant, Duration)>> = (0..j.groups.len())
        .map(|g| {
            j.log
                .iter()
                .filter(|r| {
                    r.writer.as_deref() == Some(j.writer)
                        && ((r.status >= 400 && r.status != 412)
                            || r.status == 0
                            || r.error.is_some())
                        && (j.addresses)(r, g)
                })
                .map(|r| (r.at, (j.hold_of)(r)))
                .collect()
        })
        .collect();
    let healthy = |g: usize, s: &Sample| -> bool {
        if s.capacity[g] >= i64::from(j.maxes[g]) || s.capacity[g] < 0 {
            return false;
        }
        let recent = |(t, hold): (Instant, Duration)| {
            t <= s.at && s.at.duration_since(t) < HEALTHY_AFTER + hold
        };
        let disturbed = j.disturbances.iter().any(|d| {
            d.group.is_none_or(|x| x == g)
                && d.from <= s.at
                && (d.until >= s.at || s.at.duration_since(d.until) < HEALTHY_AFTER)
        });
        let refused = refusals[g].iter().any(|t| recent(*t));
        !disturbed && !refused
    };
    let mut waited: HashMap<String, Duration> = HashMap::new();
    let mut reported: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    let mut prev: Option<Instant> = None;
    for s in j.samples {
        let step = prev.map_or(Duration::ZERO, |p| s.at.duration_since(p));
        prev = Some(s.at);
        let pending: HashSet<&str> = s.pending.iter().map(|(n, _)| n.as_str()).collect();
        waited.retain(|n, _| pending.contains(n.as_str()));
        for (name, app) in &s.pending {
            if j.homeless.contains(&app.as_str()) {
                continue;
            }
            let fits: Vec<usize> = homes(app, j.groups)
                .into_iter()
                .filter(|g| healthy(*g, s))
                .collect();
            if fits.is_empty() {
                waited.remove(name);
                continue;
            }
            let w = waited.entry(name.clone()).or_default();
            *w += step;
            if *w > PENDING_BOUND && reported.insert(name.clone()) {
                out.push(format!(
                    "invariant 3 (no pod pending past a bound while a group that fits it is healthy): pod {name} ({app}) pending {} s while {:?} could take it and were healthy",
                    w.as_secs(),
                    fits.iter().map(|g| j.groups[*g]).collect::<Vec<_>>()
                ));
            }
        }
    }
    out
}
