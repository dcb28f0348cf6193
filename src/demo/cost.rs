//! `demo --cost` and `cargo bench --bench cost`: what consolidation saves, in dollars, on one
//! seeded day.
//!
//! The trace ([`Trace::generate`], seeded): a 24 h diurnal day (demand lowest at 03:00 UTC,
//! highest at 15:00) on the simulated cluster, in paused time:
//! - `web` (250m, 512Mi) and `api` (1 cpu, 2Gi) Deployments (ReplicaSets) under
//!   PodDisruptionBudgets (`maxUnavailable: 1`), following the day;
//! - `cache` (500m, 6Gi), memory-heavy, under a PodDisruptionBudget, following the day;
//! - `spread` (500m, 1Gi), spread over the three zones (`maxSkew: 1`, `minDomains: 3`);
//! - batch Jobs (2 cpu, 4Gi per pod, 2 to 6 pods run at once, 20 to 90 min, more of them at
//!   night): `batch/v1` Jobs whose pods the simulation runs for the job's time and then ends
//!   (`Succeeded`); an evicted pod is replaced after the Job controller's backoff and runs its
//!   whole time again, so a job whose pods are evicted ends late and costs the work redone;
//! - a DaemonSet (100m, 128Mi) on every node;
//! - the services' pods are Ready 20 s after they run ([`READY_AFTER`]): a drain under a
//!   budget waits for each replacement to warm up.
//!
//! The node groups: `d4-z1`, `d4-z2`, `d4-z3` (`Standard_D4s_v5`, one zone each, balanced),
//! `d8` (`Standard_D8s_v5`) and `e8` (`Standard_E8s_v5`), all 0..30, at their list prices in
//! the embedded snapshot (`westeurope`, the emulator's region): three sizes in two families.
//!
//! The same trace runs twice: cluster-autoscaler's policy (consolidation off, the
//! `least-waste` expander, cluster-autoscaler's scale-down defaults: 10 min unneeded, 50 %
//! threshold, 10 min after any scale-up) and the controller's cost features (consolidation on
//! with Karpenter's `Balanced` policy, the default 10 % budget and deletion-cost hints on its
//! three best candidates, the `least-cost` expander
//! chained with `least-waste`), side by side. Beside both, the lower bound ([`lower_bound_rate`]): per
//! minute, the cheapest fractional mix of the groups' sizes whose allocatable cpu and memory
//! (less the DaemonSet's pod on each node) cover every pod that exists that minute.

use super::*;
use crate::capacity::prices::PriceTable;
use crate::emulator::kube::KubeState;
use crate::emulator::sim::{sizes, PodTemplate, SimSettings};
use crate::pods::quantity;
use rand::rngs::StdRng;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The emulator's region (its scale sets' default location): the prices' region.
const REGION: &str = "westeurope";
const NS: &str = "default";
/// The trace's full length.
pub const DAY: Duration = Duration::from_secs(24 * 3600);
/// The trace's length in quick mode (CI): the first 8 h, the night's low and the morning's rise.
pub const QUICK: Duration = Duration::from_secs(8 * 3600);
/// A new VM's Node turns Ready this long after the VM appears.
const BOOT_DELAY: Duration = Duration::from_secs(90);
/// Azure's long-running operations take this long in the emulator.
const LRO_DELAY: Duration = Duration::from_secs(20);
/// How often the simulation steps.
const SIM_TICK: Duration = Duration::from_secs(5);
/// How often the run is looked at (pods' pending time, nodes, cost).
const SAMPLE: Duration = Duration::from_secs(15);
/// A pod that replaced an evicted one and waited longer than this counts against the goal.
pub const PENDING_GOAL: Duration = Duration::from_secs(120);
/// A pending pod that waited longer than this waited for a node to boot (a VM of the trace takes
/// 110 s to create and become Ready; a pod with room is bound within a few scheduler ticks).
pub const NEW_NODE_WAIT: Duration = Duration::from_secs(60);
/// The DaemonSet's pod on every node.
const DS_CPU_MILLI: f64 = 100.0;
const DS_MEMORY_MIB: f64 = 128.0;

/// One node group of the trace: name, VM size, zone.
const GROUPS: &[(&str, &str, Option<&str>)] = &[
    ("d4-z1", "Standard_D4s_v5", Some("1")),
    ("d4-z2", "Standard_D4s_v5", Some("2")),
    ("d4-z3", "Standard_D4s_v5", Some("3")),
    ("d8", "Standard_D8s_v5", None),
    ("e8", "Standard_E8s_v5", None),
];

/// A long-running workload: name, cpu (millicores), memory (MiB), lowest and highest
/// replicas over the day, under a PodDisruptionBudget, spread over zones.
struct Service {
    name: &'static str,
    cpu_milli: u32,
    memory_mib: u32,
    low: u32,
    high: u32,
    pdb: bool,
    spread: bool,
}

const SERVICES: &[Service] = &[
    Service {
        name: "web",
        cpu_milli: 250,
        memory_mib: 512,
        low: 8,
        high: 48,
        pdb: true,
        spread: false,
    },
    Service {
        name: "api",
        cpu_milli: 1000,
        memory_mib: 2048,
        low: 3,
        high: 18,
        pdb: true,
        spread: false,
    },
    Service {
        name: "cache",
        cpu_milli: 500,
        memory_mib: 6144,
        low: 2,
        high: 10,
        pdb: true,
        spread: false,
    },
    Service {
        name: "spread",
        cpu_milli: 500,
        memory_mib: 1024,
        low: 3,
        high: 15,
        pdb: false,
        spread: true,
    },
];
const JOB_CPU_MILLI: u32 = 2000;
const JOB_MEMORY_MIB: u32 = 4096;
/// The spread workload's `minDomains`.
const SPREAD_MIN_DOMAINS: u32 = 3;

/// What the trace does at one moment.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Service `SERVICES[service]` to `replicas`.
    Scale {
        /// Index in the services.
        service: usize,
        /// Its replicas from now on.
        replicas: u32,
    },
    /// Batch job `job` starts with `pods` pods, each running `runs` seconds.
    JobStart {
        /// Its number.
        job: usize,
        /// Its pods.
        pods: u32,
        /// Seconds each pod's work runs.
        runs: u64,
    },
    /// Batch job `job` ends, if none of its pods was evicted (its pods go).
    JobEnd {
        /// Its number.
        job: usize,
    },
}

/// The seeded day: steps at seconds from its start, in order.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The seed it came from.
    pub seed: u64,
    /// Its length.
    pub length: Duration,
    /// `(seconds from the start, step)`, in order.
    pub steps: Vec<(u64, Step)>,
}

/// How busy the day is at `hour` (0..24, UTC): 0 at 03:00, 1 at 15:00.
fn diurnal(hour: f64) -> f64 {
    0.5 - 0.5 * ((hour - 3.0) / 24.0 * std::f64::consts::TAU).cos()
}

impl Trace {
    /// The day of `seed`, cut to `length`. Services change every 5 minutes (the diurnal curve
    /// plus ±1 replica of noise); batch jobs arrive about every 40 minutes, twice as often at
    /// night (00:00 to 06:00).
    /// The day is always drawn whole, then cut: a shorter trace is the longer one's beginning.
    pub fn generate(seed: u64, length: Duration) -> Trace {
        let mut rng = StdRng::seed_from_u64(seed);
        let end = DAY.as_secs();
        let mut steps = Vec::new();
        let mut last: Vec<Option<u32>> = vec![None; SERVICES.len()];
        let mut t = 0;
        while t < end {
            let hour = t as f64 / 3600.0 % 24.0;
            for (i, s) in SERVICES.iter().enumerate() {
                let base = f64::from(s.low) + f64::from(s.high - s.low) * diurnal(hour);
                let noisy = (base + f64::from(rng.gen_range(-1i32..=1))).round();
                let replicas = (noisy as u32).clamp(s.low, s.high);
                if last[i] != Some(replicas) {
                    steps.push((
                        t,
                        Step::Scale {
                            service: i,
                            replicas,
                        },
                    ));
                    last[i] = Some(replicas);
                }
            }
            t += 300;
        }
        let mut job = 0;
        let mut t = rng.gen_range(0..1200u64);
        while t < end {
            let hour = t as f64 / 3600.0 % 24.0;
            let pods = rng.gen_range(2..=6u32);
            let runs = rng.gen_range(20..=90u64) * 60;
            steps.push((t, Step::JobStart { job, pods, runs }));
            if t + runs < end {
                steps.push((t + runs, Step::JobEnd { job }));
            }
            job += 1;
            let gap = if hour < 6.0 { 1200 } else { 2400 };
            t += rng.gen_range(gap / 2..=gap * 3 / 2);
        }
        steps.sort_by_key(|(at, _)| *at);
        steps.retain(|(at, _)| *at < length.as_secs());
        Trace {
            seed,
            length,
            steps,
        }
    }

    /// Per minute: the cpu (millicores) and memory (MiB) every pod that exists asks for.
    pub fn demand_per_minute(&self) -> Vec<(f64, f64)> {
        self.needs_per_minute()
            .iter()
            .map(|n| (n.cpu_milli, n.memory_mib))
            .collect()
    }

    /// Per minute: what every pod that exists asks for, and the zone domains the spread
    /// workload needs to run whole.
    pub fn needs_per_minute(&self) -> Vec<Need> {
        let minutes = self.length.as_secs() / 60;
        let mut replicas = vec![0u32; SERVICES.len()];
        let mut jobs: BTreeMap<usize, u32> = BTreeMap::new();
        let mut next = 0;
        let mut out = Vec::with_capacity(minutes as usize);
        for m in 0..minutes {
            let now = m * 60;
            while next < self.steps.len() && self.steps[next].0 <= now {
                match &self.steps[next].1 {
                    Step::Scale {
                        service,
                        replicas: n,
                    } => replicas[*service] = *n,
                    Step::JobStart { job, pods, .. } => {
                        jobs.insert(*job, *pods);
                    }
                    Step::JobEnd { job } => {
                        jobs.remove(job);
                    }
                }
                next += 1;
            }
            let mut cpu = 0.0;
            let mut mem = 0.0;
            for (s, n) in SERVICES.iter().zip(&replicas) {
                cpu += f64::from(s.cpu_milli * n);
                mem += f64::from(s.memory_mib * n);
            }
            let job_pods: u32 = jobs.values().sum();
            cpu += f64::from(JOB_CPU_MILLI * job_pods);
            mem += f64::from(JOB_MEMORY_MIB * job_pods);
            // `maxSkew: 1, minDomains: 3`: with fewer than three domains the global minimum
            // counts as 0, so each domain holds one replica; n replicas need min(n, 3).
            let domains = SERVICES
                .iter()
                .zip(&replicas)
                .filter(|(s, _)| s.spread)
                .map(|(_, n)| (*n).min(SPREAD_MIN_DOMAINS))
                .max()
                .unwrap_or(0);
            let mut shapes: Vec<Shape> = SERVICES
                .iter()
                .zip(&replicas)
                .map(|(s, n)| Shape {
                    cpu_milli: f64::from(s.cpu_milli),
                    memory_mib: f64::from(s.memory_mib),
                    count: *n,
                })
                .collect();
            shapes.push(Shape {
                cpu_milli: f64::from(JOB_CPU_MILLI),
                memory_mib: f64::from(JOB_MEMORY_MIB),
                count: job_pods,
            });
            shapes.retain(|s| s.count > 0);
            out.push(Need {
                cpu_milli: cpu,
                memory_mib: mem,
                domains,
                shapes,
            });
        }
        out
    }

    /// How many batch jobs it starts.
    pub fn jobs(&self) -> usize {
        self.steps
            .iter()
            .filter(|(_, s)| matches!(s, Step::JobStart { .. }))
            .count()
    }
}

/// What the pods of one minute need: the requests of every pod that exists, how many pods of
/// each shape there are, and the zone domains (`topology.kubernetes.io/zone` values) the spread
/// workload needs to run whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    /// Millicores.
    pub cpu_milli: f64,
    /// MiB.
    pub memory_mib: f64,
    /// Distinct zone domains the nodes must span.
    pub domains: u32,
    /// The pods by shape (each workload's requests).
    pub shapes: Vec<Shape>,
}

/// Pods of one size: a node holds a whole number of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Millicores per pod.
    pub cpu_milli: f64,
    /// MiB per pod.
    pub memory_mib: f64,
    /// How many.
    pub count: u32,
}

impl Shape {
    /// How many of these pods one node of `size` holds with nothing else on it.
    pub fn fit(&self, size: &SizeOption) -> u32 {
        let by = |have: f64, each: f64| {
            if each <= 0.0 {
                u32::MAX
            } else {
                (have / each + 1e-9).floor().max(0.0) as u32
            }
        };
        by(size.cpu_milli, self.cpu_milli).min(by(size.memory_mib, self.memory_mib))
    }
}

/// A VM size as the whole-node floor sees it: the size, and how many zones its groups span
/// (0: regional; every regional node is in the one domain `0`, as AKS labels it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloorSize {
    /// What one node gives and costs.
    pub size: SizeOption,
    /// Zones its groups span.
    pub zones: u32,
}

/// The cheapest whole-node mix of `sizes` whose allocatable (less the DaemonSet's pod) covers
/// `need`'s requests, holds each shape's pods whole (a node of a size holds at most so many of
/// one shape: a 2-cpu pod leaves 1.8 of a `D4s`'s 3.8 cpu to smaller pods only), and whose
/// nodes can span `need.domains` zone domains, in USD per hour: a lower bound tighter than
/// [`lower_bound_rate`] that every policy serving every pod still pays at least (whole nodes,
/// whole pods per shape, the spread's domains; still no packing of shapes together, no boot
/// time). A zonal
/// size adds one domain per node up to the zones its groups span (summed over the sizes: at
/// least the domains a mix can reach, so the floor stays a lower bound); any regional node adds
/// the one domain `0`. Solved by enumeration: every count of each size but the last up to what
/// it would need alone, the last size's count computed.
pub fn floor_rate(sizes: &[FloorSize], need: &Need) -> f64 {
    if need.cpu_milli <= 0.0 && need.memory_mib <= 0.0 && need.domains == 0 {
        return 0.0;
    }
    let usable: Vec<&FloorSize> = sizes
        .iter()
        .filter(|s| s.size.cpu_milli > 0.0 && s.size.memory_mib > 0.0 && s.size.price >= 0.0)
        .collect();
    let Some((last, rest)) = usable.split_last() else {
        return f64::INFINITY;
    };
    // Each size alone meets every need it can meet with this many nodes; a mix never needs
    // more of any one.
    let alone = |s: &FloorSize| -> u32 {
        let n = (need.cpu_milli / s.size.cpu_milli)
            .max(need.memory_mib / s.size.memory_mib)
            .max(0.0)
            .ceil() as u32;
        let by_shape = need
            .shapes
            .iter()
            .filter_map(|shape| match shape.fit(&s.size) {
                0 => None,
                fit => Some(shape.count.div_ceil(fit)),
            })
            .max()
            .unwrap_or(0);
        n.max(need.domains).max(by_shape)
    };
    let mut counts = vec![0u32; rest.len()];
    let mut best = f64::INFINITY;
    loop {
        let (mut cpu, mut mem, mut price) = (0.0, 0.0, 0.0);
        for (s, n) in rest.iter().zip(&counts) {
            let n = f64::from(*n);
            cpu += n * s.size.cpu_milli;
            mem += n * s.size.memory_mib;
            price += n * s.size.price;
        }
        let needed = ((need.cpu_milli - cpu) / last.size.cpu_milli)
            .max((need.memory_mib - mem) / last.size.memory_mib)
            .max(0.0);
        // Float noise must not add a node: 2.0000000001 is 2.
        let mut n_last = (needed - 1e-9).ceil().max(0.0) as u32;
        // Every shape's pods must find whole places: a node holds a whole number of them.
        let mut placeable = true;
        for shape in &need.shapes {
            let held: u32 = rest
                .iter()
                .zip(&counts)
                .map(|(s, n)| n * shape.fit(&s.size))
                .sum();
            let left = shape.count.saturating_sub(held);
            match shape.fit(&last.size) {
                _ if left == 0 => {}
                0 => placeable = false,
                fit => n_last = n_last.max(left.div_ceil(fit)),
            }
        }
        let all = |n_last: u32| {
            rest.iter()
                .zip(&counts)
                .map(|(s, n)| (*s, *n))
                .chain(std::iter::once((*last, n_last)))
        };
        let domains = |n_last: u32| -> u32 {
            let (mut zonal, mut regional) = (0u32, false);
            for (s, n) in all(n_last) {
                if s.zones == 0 {
                    regional |= n > 0;
                } else {
                    zonal += n.min(s.zones);
                }
            }
            zonal + u32::from(regional)
        };
        // More of the last size until the domains are there, if that can help at all.
        let cap = alone(last).max(n_last) + need.domains;
        while domains(n_last) < need.domains && n_last < cap {
            n_last += 1;
        }
        if placeable && domains(n_last) >= need.domains {
            best = best.min(price + f64::from(n_last) * last.size.price);
        }
        // The next combination of the other sizes' counts.
        let mut i = 0;
        loop {
            if i == counts.len() {
                return best;
            }
            if counts[i] < alone(rest[i]) {
                counts[i] += 1;
                break;
            }
            counts[i] = 0;
            i += 1;
        }
    }
}

/// The trace's sizes as the whole-node floor sees them, with the zones their groups span.
pub fn floor_sizes() -> Vec<FloorSize> {
    let mut seen = HashSet::new();
    let distinct: Vec<&str> = GROUPS
        .iter()
        .filter(|(_, size, _)| seen.insert(*size))
        .map(|(_, size, _)| *size)
        .collect();
    distinct
        .iter()
        .zip(size_options())
        .map(|(name, size)| {
            let zones: HashSet<&str> = GROUPS
                .iter()
                .filter(|(_, s, _)| s == name)
                .filter_map(|(_, _, z)| *z)
                .collect();
            FloorSize {
                size,
                zones: zones.len() as u32,
            }
        })
        .collect()
}

/// A VM size as the lower bound sees it: what one node gives pods (less the DaemonSet's pod)
/// and what it costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeOption {
    /// Allocatable millicores, less the DaemonSet's.
    pub cpu_milli: f64,
    /// Allocatable MiB, less the DaemonSet's.
    pub memory_mib: f64,
    /// USD per hour.
    pub price: f64,
}

/// The cheapest fractional mix of `sizes` whose cpu and memory cover `cpu_milli` and
/// `memory_mib`, in USD per hour: the linear program min Σ pᵢxᵢ subject to Σ cᵢxᵢ ≥ C,
/// Σ mᵢxᵢ ≥ M, x ≥ 0. With two constraints an optimal vertex has at most two sizes in it, so
/// it is solved exactly by trying every size alone (as many as the scarcer resource needs) and
/// every pair with both constraints tight (when that solution is non-negative).
pub fn lower_bound_rate(sizes: &[SizeOption], cpu_milli: f64, memory_mib: f64) -> f64 {
    if cpu_milli <= 0.0 && memory_mib <= 0.0 {
        return 0.0;
    }
    let usable: Vec<&SizeOption> = sizes
        .iter()
        .filter(|s| s.cpu_milli > 0.0 && s.memory_mib > 0.0 && s.price >= 0.0)
        .collect();
    let mut best = f64::INFINITY;
    for s in &usable {
        let x = (cpu_milli / s.cpu_milli)
            .max(memory_mib / s.memory_mib)
            .max(0.0);
        best = best.min(x * s.price);
    }
    for (i, a) in usable.iter().enumerate() {
        for b in &usable[i + 1..] {
            // a.c x + b.c y = C, a.m x + b.m y = M.
            let det = a.cpu_milli * b.memory_mib - b.cpu_milli * a.memory_mib;
            if det.abs() < 1e-12 {
                continue;
            }
            let x = (cpu_milli * b.memory_mib - b.cpu_milli * memory_mib) / det;
            let y = (a.cpu_milli * memory_mib - cpu_milli * a.memory_mib) / det;
            if x >= -1e-9 && y >= -1e-9 {
                best = best.min(x.max(0.0) * a.price + y.max(0.0) * b.price);
            }
        }
    }
    best
}

/// The trace's sizes as the lower bound sees them (one per distinct VM size), with their
/// list prices.
pub fn size_options() -> Vec<SizeOption> {
    let prices = PriceTable::snapshot();
    let mut seen = HashSet::new();
    GROUPS
        .iter()
        .filter(|(_, size, _)| seen.insert(*size))
        .map(|(_, size, _)| {
            let a = sizes::allocatable(size, sizes::DEFAULT_MAX_PODS);
            SizeOption {
                cpu_milli: a.cpu_milli as f64 - DS_CPU_MILLI,
                memory_mib: (a.memory_bytes / (1024 * 1024)) as f64 - DS_MEMORY_MIB,
                price: price_of(&prices, size),
            }
        })
        .collect()
}

fn price_of(prices: &PriceTable, size: &str) -> f64 {
    prices
        .get(REGION, size)
        .and_then(|p| p.on_demand)
        .unwrap_or(0.0)
}

/// One policy's run of the trace.
#[derive(Debug, Clone, Default)]
pub struct ArmReport {
    /// What it is (`cluster-autoscaler's policy`, `consolidation`).
    pub policy: String,
    /// USD the VMs cost (each instance from its creation to its deletion, at its size's list
    /// price).
    pub dollars: f64,
    /// Node-hours (instances).
    pub node_hours: f64,
    /// Per hour of the trace: USD.
    pub dollars_per_hour: Vec<f64>,
    /// USD on nodes that ran no pod of the trace's (only the DaemonSet's): emptied and not yet
    /// removed, or new and not yet used.
    pub empty_dollars: f64,
    /// USD on VMs that were not (yet, or no longer) registered nodes: booting or being deleted.
    pub unregistered_dollars: f64,
    /// Per hour of the trace: USD on empty nodes and unregistered VMs together.
    pub idle_per_hour: Vec<f64>,
    /// Looks (one every 15 s) at which the Ready nodes not being removed gave less cpu or
    /// memory than the running pods ask for (the bound pods and the evicted pods' pending
    /// replacements): a removal, or a replace, that went before the capacity it relied on.
    pub capacity_short_looks: usize,
    /// Evictions the API admitted.
    pub evictions: u64,
    /// Nodes removed (scale-down and consolidation).
    pub nodes_removed: u64,
    /// Of those, by consolidation.
    pub nodes_consolidated: u64,
    /// Pods seen pending, and of those scheduled.
    pub pods: usize,
    /// Pods seen pending then bound.
    pub scheduled: usize,
    /// Seconds from first seen pending to first seen bound: mean, p99, max.
    pub wait_mean: f64,
    /// p99.
    pub wait_p99: f64,
    /// Max.
    pub wait_max: f64,
    /// Pod-hours spent pending.
    pub pending_pod_hours: f64,
    /// Pods that replaced an evicted one and waited more than [`PENDING_GOAL`].
    pub replaced_pending_over_goal: usize,
    /// Pods that replaced an evicted one and were seen pending (a replacement bound before the
    /// next look, every 15 s, is not seen).
    pub replaced: usize,
    /// Of those, the ones that waited more than [`NEW_NODE_WAIT`]: longer than the scheduler
    /// takes where there is room, so they waited for a node to boot (a move undone by a
    /// scale-up: delete, then re-provision).
    pub replaced_waited_for_node: usize,
    /// Pod-hours of batch work thrown away: what each job pod evicted or lost had run (its
    /// replacement runs it again).
    pub job_work_lost_hours: f64,
    /// Minutes after the trace's end of each job (its start plus its run) that it completed:
    /// the mean over the jobs that completed, and the most. Pending time and the 15 s between
    /// looks make every job a little late; an evicted pod's rerun makes its job later.
    pub jobs_late_mean_minutes: f64,
    /// The most.
    pub jobs_late_max_minutes: f64,
    /// Jobs the trace ended within the day that had not completed by its end.
    pub jobs_unfinished: usize,
    /// Jobs that failed (evicted more often than their backoff limit allows).
    pub jobs_failed: usize,
    /// Pods under a PodDisruptionBudget that went down with their node (no admitted eviction).
    pub pdb_violations: usize,
    /// Any pod that went down with its node.
    pub pods_lost_with_nodes: usize,
    /// Lost updates the emulator saw (must be 0).
    pub lost_updates: usize,
    /// Seconds of real time the run took.
    pub wall_seconds: f64,
}

/// Both runs and the lower bound.
#[derive(Debug, Clone)]
pub struct CostReport {
    /// The trace's seed.
    pub seed: u64,
    /// The trace's length.
    pub length: Duration,
    /// Quick mode (a shortened trace).
    pub quick: bool,
    /// Batch jobs the trace started.
    pub jobs: usize,
    /// What the reader turned ([`Dials`]).
    pub dials: Dials,
    /// cluster-autoscaler's policy.
    pub ca: ArmReport,
    /// Consolidation on.
    pub consolidation: ArmReport,
    /// The lower bound, USD.
    pub lower_bound: f64,
    /// The lower bound per hour of the trace, USD.
    pub lower_bound_per_hour: Vec<f64>,
    /// The whole-node floor ([`floor_rate`]), USD: no policy serving every pod pays less.
    pub floor: f64,
    /// The floor per hour of the trace, USD.
    pub floor_per_hour: Vec<f64>,
}

impl CostReport {
    /// Hours the trace ran.
    pub fn hours(&self) -> f64 {
        self.length.as_secs_f64() / 3600.0
    }

    /// The figures side by side, as printed and as the report's table.
    pub fn rows(&self) -> Vec<Vec<String>> {
        let h = self.hours();
        let arm = |a: &ArmReport| -> Vec<String> {
            vec![
                format!("${:.2}", a.dollars),
                format!("{:.2}x", a.dollars / self.lower_bound.max(1e-9)),
                format!("{:.1}", a.node_hours),
                format!("${:.2} / ${:.2}", a.empty_dollars, a.unregistered_dollars),
                format!("{} ({:.2}/h)", a.evictions, a.evictions as f64 / h),
                format!("{:.2}", a.job_work_lost_hours),
                format!(
                    "{:.1} min / {:.1} min; {} / {}",
                    a.jobs_late_mean_minutes,
                    a.jobs_late_max_minutes,
                    a.jobs_unfinished,
                    a.jobs_failed
                ),
                format!(
                    "{} ({} by consolidation)",
                    a.nodes_removed, a.nodes_consolidated
                ),
                format!("{}", a.pdb_violations),
                format!(
                    "{:.0} s / {:.0} s / {:.0} s",
                    a.wait_mean, a.wait_p99, a.wait_max
                ),
                format!("{:.2}", a.pending_pod_hours),
                format!("{}", a.replaced_pending_over_goal),
                format!("{} / {}", a.replaced, a.replaced_waited_for_node),
                format!("{}", a.capacity_short_looks),
                format!("{}", a.lost_updates),
            ]
        };
        let labels = [
            "cost (list prices)",
            "cost / lower bound",
            "node-hours",
            "of the cost: nodes with no pod of the trace's / VMs not registered as nodes",
            "evictions (per hour)",
            "batch work redone (pod-hours run by pods evicted or lost)",
            "jobs: completed late by (mean / max); unfinished at the end / failed",
            "nodes removed",
            "PDB violations",
            "pending time: mean / p99 / max",
            "pod-hours pending",
            "evicted pods' replacements pending > 2 min",
            "evicted pods' replacements seen pending / of them > 1 min (for a new node)",
            "looks with the staying Ready nodes short of the running pods' requests",
            "lost updates",
        ];
        let (ca, co) = (arm(&self.ca), arm(&self.consolidation));
        let mut rows: Vec<Vec<String>> = labels
            .iter()
            .zip(ca.into_iter().zip(co))
            .map(|(l, (a, b))| vec![l.to_string(), a, b, String::new()])
            .collect();
        rows[0][3] = format!("${:.2}", self.lower_bound);
        rows[1][3] = "1.00x".into();
        rows
    }

    /// Where the dollars above the lower bound go: per quarter of the day (00-06, 06-12, ...
    /// UTC), each policy's dollars and the floor against that quarter's lower bound.
    pub fn quarters(&self) -> Vec<Vec<String>> {
        let mut rows = vec![vec![
            "hours (UTC)".to_string(),
            "lower bound".into(),
            "whole-node floor".into(),
            "cluster-autoscaler's policy (idle)".into(),
            "consolidation (idle)".into(),
        ]];
        let hours = self.lower_bound_per_hour.len();
        let sum = |v: &[f64], from: usize, to: usize| -> f64 {
            v.get(from..to.min(v.len())).map_or(0.0, |s| s.iter().sum())
        };
        for from in (0..hours).step_by(6) {
            let to = (from + 6).min(hours);
            let lb = sum(&self.lower_bound_per_hour, from, to);
            let cell = |d: f64| format!("${d:.2} ({:.2}x)", d / lb.max(1e-9));
            let arm = |a: &ArmReport| {
                format!(
                    "{} (${:.2})",
                    cell(sum(&a.dollars_per_hour, from, to)),
                    sum(&a.idle_per_hour, from, to)
                )
            };
            rows.push(vec![
                format!("{from:02}-{to:02}"),
                format!("${lb:.2}"),
                cell(sum(&self.floor_per_hour, from, to)),
                arm(&self.ca),
                arm(&self.consolidation),
            ]);
        }
        rows
    }

    /// The verdicts against the goals, one line each.
    pub fn goals(&self) -> Vec<String> {
        let ratio = self.consolidation.dollars / self.lower_bound.max(1e-9);
        let savings = 1.0 - self.consolidation.dollars / self.ca.dollars.max(1e-9);
        let h = self.hours();
        let ev_ca = self.ca.evictions as f64 / h;
        let ev_co = self.consolidation.evictions as f64 / h;
        let ev_ratio = if ev_ca > 0.0 {
            ev_co / ev_ca
        } else if ev_co > 0.0 {
            f64::INFINITY
        } else {
            1.0
        };
        let mark = |ok: bool| if ok { "met" } else { "MISSED" };
        vec![
            format!(
                "goal cost within 1.10x of the lower bound: consolidation {ratio:.2}x ({}; cluster-autoscaler's policy {:.2}x; the whole-node floor, under which no policy goes, {:.2}x)",
                mark(ratio <= 1.10),
                self.ca.dollars / self.lower_bound.max(1e-9),
                self.floor / self.lower_bound.max(1e-9)
            ),
            format!(
                "goal at least 20 % cheaper than cluster-autoscaler's policy: {:.1} % cheaper ({})",
                savings * 100.0,
                mark(savings >= 0.20)
            ),
            format!(
                "goal evictions per hour at most 1.25x cluster-autoscaler's: {ev_co:.2}/h against {ev_ca:.2}/h = {ev_ratio:.2}x ({})",
                mark(ev_ratio <= 1.25)
            ),
            format!(
                "goal 0 PDB violations: {} and {} ({})",
                self.ca.pdb_violations,
                self.consolidation.pdb_violations,
                mark(self.ca.pdb_violations + self.consolidation.pdb_violations == 0)
            ),
            format!(
                "goal 0 pods pending over 2 min because of a consolidation: {} evicted pods' replacements waited over 2 min with consolidation on ({} with cluster-autoscaler's policy) ({})",
                self.consolidation.replaced_pending_over_goal,
                self.ca.replaced_pending_over_goal,
                mark(self.consolidation.replaced_pending_over_goal == 0)
            ),
            format!(
                "goal capacity never below what the running pods need: {} of {} looks (every 15 s) found the Ready nodes not being removed short of the running pods' requests with consolidation on ({} with cluster-autoscaler's policy) ({})",
                self.consolidation.capacity_short_looks,
                self.length.as_secs() / SAMPLE.as_secs(),
                self.ca.capacity_short_looks,
                mark(self.consolidation.capacity_short_looks == 0)
            ),
        ]
    }
}

/// The settings `demo --cost` lets a reader turn (everything else is the trace's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dials {
    /// The consolidation run's `consolidation.stabilizationWindow` (zero: off, the default).
    pub stabilization_window: Duration,
    /// Both runs' `scaleDown.maxBulkSoftTaintCount` (cluster-autoscaler's 10 by default; 0:
    /// no soft taints).
    pub max_bulk_soft_taint_count: u32,
    /// The consolidation run's `consolidation.emptyFirst` (zero: off, the default).
    pub empty_first: Duration,
    /// The consolidation run's `consolidation.delayAfterAdd` (zero: no hold, the default).
    pub consolidation_delay_after_add: Duration,
    /// The consolidation run's `consolidation.deletionCostHints` (3 by default).
    pub deletion_cost_hints: u32,
    /// The consolidation run's `consolidation.disruptJobs` (false, the default: it waits for
    /// a Job's running pods to end).
    pub disrupt_jobs: bool,
    /// The trace's, both runs: how long a service's pod runs before it is Ready ([`READY_AFTER`];
    /// zero: Ready as soon as it runs). Until then its PodDisruptionBudget counts it unhealthy,
    /// so a drain waits for each replacement to warm up, as on a real cluster.
    pub ready_after: Duration,
}

/// How long the trace's services' pods take to be Ready once they run (an application's
/// warm-up: image pull, start, its readiness probe's first success).
pub const READY_AFTER: Duration = Duration::from_secs(20);

/// The consolidation run's deletion-cost hints unless `--deletion-cost-hints` says otherwise:
/// its three best candidates' pods go first when a Deployment scales in.
const DELETION_COST_HINTS: u32 = 3;

impl Default for Dials {
    fn default() -> Self {
        Self {
            stabilization_window: Duration::ZERO,
            max_bulk_soft_taint_count: crate::config::ScaleDownSettings::default()
                .max_bulk_soft_taint_count,
            empty_first: Duration::ZERO,
            consolidation_delay_after_add: crate::config::ConsolidationSettings::default()
                .delay_after_add,
            deletion_cost_hints: DELETION_COST_HINTS,
            disrupt_jobs: crate::config::ConsolidationSettings::default().disrupt_jobs,
            ready_after: READY_AFTER,
        }
    }
}

/// `demo --cost` and the bench: the trace of `seed` (`quick`: its first [`QUICK`]) under both
/// policies. Must run on a paused tokio clock ([`run_paused`]).
pub async fn compare(
    seed: u64,
    quick: bool,
    quiet: bool,
    dials: Dials,
) -> anyhow::Result<CostReport> {
    let length = if quick { quick_length()? } else { DAY };
    let trace = Trace::generate(seed, length);
    let sizes = size_options();
    let whole = floor_sizes();
    let needs = trace.needs_per_minute();
    let per_minute: Vec<f64> = needs
        .iter()
        .map(|n| lower_bound_rate(&sizes, n.cpu_milli, n.memory_mib))
        .collect();
    let floor_per_minute: Vec<f64> = needs.iter().map(|n| floor_rate(&whole, n)).collect();
    let hourly =
        |v: &[f64]| -> Vec<f64> { v.chunks(60).map(|c| c.iter().sum::<f64>() / 60.0).collect() };
    let lower_bound = per_minute.iter().sum::<f64>() / 60.0;
    let lower_bound_per_hour = hourly(&per_minute);
    let floor = floor_per_minute.iter().sum::<f64>() / 60.0;
    let floor_per_hour = hourly(&floor_per_minute);
    let ca = run_arm(&trace, false, quiet, dials).await?;
    let consolidation = run_arm(&trace, true, quiet, dials).await?;
    Ok(CostReport {
        seed,
        length,
        quick,
        jobs: trace.jobs(),
        dials,
        ca,
        consolidation,
        lower_bound,
        lower_bound_per_hour,
        floor,
        floor_per_hour,
    })
}

/// Quick mode's length: [`QUICK`], or `BENCH_COST_HOURS` whole hours (1 to 24) of the trace
/// (CI runs one hour: it checks that the comparison runs and prints, not what it saves).
pub fn quick_length() -> anyhow::Result<Duration> {
    match std::env::var("BENCH_COST_HOURS") {
        Err(_) => Ok(QUICK),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(h @ 1..=24) => Ok(Duration::from_secs(h * 3600)),
            _ => anyhow::bail!(
                "BENCH_COST_HOURS must be a whole number of hours from 1 to 24, not {v:?}"
            ),
        },
    }
}

/// Runs `compare` on a runtime of its own whose clock is paused (time jumps to the next timer
/// whenever every task waits), on a thread of its own.
pub fn run_paused(seed: u64, quick: bool, quiet: bool, dials: Dials) -> anyhow::Result<CostReport> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .context("building the paused runtime")?
            .block_on(compare(seed, quick, quiet, dials))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the cost trace's thread panicked"))?
}

fn policy_name(consolidation: bool) -> &'static str {
    if consolidation {
        "consolidation"
    } else {
        "cluster-autoscaler's policy"
    }
}

/// One run of `trace`: the emulator, the simulated cluster, one controller wired as `run`
/// wires it, the trace's steps, and what it cost.
async fn run_arm(
    trace: &Trace,
    consolidation: bool,
    quiet: bool,
    dials: Dials,
) -> anyhow::Result<ArmReport> {
    let wall = std::time::Instant::now();
    let emulator = EmulatorBuilder::new()
        .lro_delay(LRO_DELAY)
        .kubernetes(true)
        .token_lifetime(trace.length + Duration::from_secs(24 * 3600))
        .cluster_simulation(SimSettings {
            boot_delay: BOOT_DELAY,
            tick: SIM_TICK,
        })
        .start()
        .await
        .context("starting the built-in emulator")?;
    let state = emulator.state();
    let kube = emulator
        .kube()
        .context("the emulator's Kubernetes side is off")?;
    let mut groups = Vec::new();
    for (name, size, zone) in GROUPS {
        let mut seed = ScaleSetSeed::new(SUBSCRIPTION, RESOURCE_GROUP, name, 0);
        seed.sku_name = size.to_string();
        seed.zones = zone.map(|z| vec![z.to_string()]).unwrap_or_default();
        state.seed_scale_set(seed);
        groups.push(NodeGroupSpec {
            name: name.to_string(),
            kind: crate::config::NodeGroupKind::Vmss,
            resource_group: None,
            min_size: 0,
            max_size: 30,
            desired_capacity: None,
            schedules: Vec::new(),
            max_scale_down_step: None,
        });
    }
    let stage = Stage::around(emulator, groups.clone())?;
    let secret = stage.register(CLIENT_ID)?;
    let args = DemoArgs {
        duration: trace.length,
        no_etag: false,
        scale_sets: GROUPS.len(),
        rival_interval: Duration::from_secs(3600),
        seed: trace.seed,
        quiet,
        plan: false,
        aks: false,
        kubernetes: false,
        pods: false,
        cost: true,
        stabilization_window: None,
        max_bulk_soft_taint_count: None,
        empty_first: None,
        consolidation_delay_after_add: None,
        disrupt_jobs: false,
        ready_after: None,
        deletion_cost_hints: None,
        report: None,
        report_defaulted: false,
    };
    let mut settings = stage.settings(&args, CLIENT_ID, secret, stage.one_replica_kubernetes()?)?;
    // cluster-autoscaler's defaults: a 10 s scan, its scale-down waits and threshold.
    settings.scan_interval = Duration::from_secs(10);
    settings.write_budget = WriteBudget {
        per_minute: 4.0,
        burst: 12,
    };
    settings.pod_demand.kind = crate::config::DemandKind::Pods;
    settings.pod_demand.balance_similar_node_groups = true;
    settings.scale_down = crate::config::ScaleDownSettings {
        enabled: true,
        max_bulk_soft_taint_count: dials.max_bulk_soft_taint_count,
        ..Default::default()
    };
    if consolidation {
        // The controller's cost features: prices in the scale-up's choice (the fewest dollars
        // per hour for the pods, then the least waste among equally cheap options) and
        // consolidation under Karpenter's `Balanced` policy, with deletion-cost hints.
        settings.pod_demand.expander = crate::config::Expander::Chain(vec![
            crate::config::Expander::LeastCost,
            crate::config::Expander::LeastWaste,
        ]);
        settings.consolidation.enabled = true;
        settings.consolidation.policy = crate::config::ConsolidationPolicy::Balanced;
        // Its best candidates' pods go first when a Deployment scales in (three unless
        // `--deletion-cost-hints`).
        settings.consolidation.deletion_cost_hints = dials.deletion_cost_hints;
        // `--stabilization-window`: moves that evict wait while demand grows (off by default).
        settings.consolidation.stabilization_window = dials.stabilization_window;
        // `--empty-first`: the hinted nodes get this long to empty before any eviction.
        settings.consolidation.empty_first = dials.empty_first;
        settings.consolidation.disrupt_jobs = dials.disrupt_jobs;
        // `--consolidation-delay-after-add`: consolidation held after a scale-up (0 s, no hold:
        // Karpenter's behaviour and the default).
        settings.consolidation.delay_after_add = dials.consolidation_delay_after_add;
    }
    let metrics = Arc::new(Metrics::new());
    let replica = Replica::build(
        Arc::new(settings),
        metrics.clone(),
        ReplicaOptions {
            dry_run: false,
            identity: Some("controller".into()),
        },
    )
    .await
    .context("wiring the controller")?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(replica.serve(stop.clone(), std::future::pending()));

    kube.create_daemon_set(
        "kube-system",
        "agent",
        &PodTemplate::new(&format!("{DS_CPU_MILLI}m"), &format!("{DS_MEMORY_MIB}Mi")),
    )?;
    let template = |s: &Service| {
        let mut t = PodTemplate::new(&format!("{}m", s.cpu_milli), &format!("{}Mi", s.memory_mib));
        if !dials.ready_after.is_zero() {
            t = t.ready_after(dials.ready_after);
        }
        if s.spread {
            t.spread_by("topology.kubernetes.io/zone", 1, s.name)
                .min_domains(SPREAD_MIN_DOMAINS)
        } else {
            t
        }
    };
    for s in SERVICES {
        if s.pdb {
            kube.create(
                "policy/v1",
                "poddisruptionbudgets",
                NS,
                serde_json::json!({"metadata": {"name": s.name},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": s.name}}}}),
            )?;
        }
        kube.create_replica_set(NS, s.name, 0, &template(s))?;
    }
    let job_template =
        PodTemplate::new(&format!("{JOB_CPU_MILLI}m"), &format!("{JOB_MEMORY_MIB}Mi"));

    let prices = PriceTable::snapshot();
    let group_price: Vec<f64> = GROUPS
        .iter()
        .map(|(_, size, _)| price_of(&prices, size))
        .collect();
    let mut look = Look::default();
    let started = tokio::time::Instant::now();
    let mut next = 0;
    let mut desired: HashMap<String, u32> = HashMap::new();
    let mut tick = tokio::time::interval(SAMPLE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dollars = 0.0;
    let mut node_seconds = 0.0;
    let mut per_hour = vec![0.0; trace.length.as_secs().div_ceil(3600) as usize];
    let mut idle_per_hour = vec![0.0; per_hour.len()];
    let mut empty_dollars = 0.0;
    let mut unregistered_dollars = 0.0;
    let mut capacity_short_looks = 0usize;
    let mut last_line = 0u64;
    loop {
        tick.tick().await;
        let at = started.elapsed().as_secs();
        if at >= trace.length.as_secs() {
            break;
        }
        // The trace's steps due by now.
        let mut shrunk: HashMap<String, u32> = HashMap::new();
        while next < trace.steps.len() && trace.steps[next].0 <= at {
            match &trace.steps[next].1 {
                Step::Scale { service, replicas } => {
                    let name = SERVICES[*service].name;
                    let before = desired.insert(name.to_string(), *replicas).unwrap_or(0);
                    *shrunk.entry(name.to_string()).or_default() +=
                        before.saturating_sub(*replicas);
                    kube.scale_replica_set(NS, name, i64::from(*replicas))?;
                }
                Step::JobStart { job, pods, runs } => {
                    let name = format!("batch-{job}");
                    let template = job_template.clone().runs_for(Duration::from_secs(*runs));
                    kube.create_job(NS, &name, i64::from(*pods), &template)?;
                    look.job_ends.insert(name, trace.steps[next].0 + runs);
                }
                // The Job's pods end on their own (`Succeeded`), each when its run is done.
                Step::JobEnd { .. } => {}
            }
            next += 1;
        }
        // What the VMs cost since the last look.
        let dt = SAMPLE.as_secs_f64();
        let hour = (at / 3600) as usize;
        let mut sample_dollars = 0.0;
        for (g, price) in groups.iter().zip(&group_price) {
            let n = capacity_of(&state, g).unwrap_or(0).max(0) as f64;
            sample_dollars += n * price * dt / 3600.0;
            node_seconds += n * dt;
        }
        dollars += sample_dollars;
        if let Some(h) = per_hour.get_mut(hour) {
            *h += sample_dollars;
        }
        let seen = look.sample(&kube, tokio::time::Instant::now(), &shrunk);
        look.jobs(&kube, at);
        // Where this look's dollars went: nodes with a pod of the trace's, nodes without one,
        // and VMs that are no registered node (booting, or going).
        let mut registered = 0.0;
        let mut empty = 0.0;
        // What the Ready nodes that are not being removed give the trace's pods (allocatable
        // less the DaemonSet's pod): the capacity the running pods must never lack.
        let mut staying = Resources::default();
        for node in kube.list_all("v1", "nodes", None) {
            if crate::emulator::sim::nodes::is_ready(&node) && !node_going(&node) {
                let a = Resources::at(&[&node], "/status/allocatable");
                staying.cpu += a.cpu - DS_CPU_MILLI as quantity::Milli;
                staying.memory +=
                    a.memory - (DS_MEMORY_MIB as quantity::Milli) * 1024 * 1024 * 1000;
            }
            let price = node
                .pointer("/metadata/labels/node.kubernetes.io~1instance-type")
                .and_then(Value::as_str)
                .map_or(0.0, |size| price_of(&prices, size))
                * dt
                / 3600.0;
            registered += price;
            let name = node.pointer("/metadata/name").and_then(Value::as_str);
            if !name.is_some_and(|n| seen.occupied.contains(n)) {
                empty += price;
            }
        }
        if staying.short_of(&seen.need) {
            capacity_short_looks += 1;
            tracing::warn!(
                policy = policy_name(consolidation),
                at = %format!("{:02}:{:02}:{:02}", at / 3600, at / 60 % 60, at % 60),
                cpu_milli_short = seen.need.cpu - staying.cpu,
                memory_mib_short = (seen.need.memory - staying.memory) / 1000 / 1024 / 1024,
                "the Ready nodes not being removed are short of the running pods' requests"
            );
        }
        let unregistered = (sample_dollars - registered).max(0.0);
        empty_dollars += empty;
        unregistered_dollars += unregistered;
        if let Some(h) = idle_per_hour.get_mut(hour) {
            *h += empty + unregistered;
        }
        if !quiet && at >= last_line + 3600 {
            last_line = at;
            let counts = kube.pod_counts(Some(NS));
            let caps: Vec<String> = groups
                .iter()
                .map(|g| format!("{} {}", g.name, capacity_of(&state, g).unwrap_or(0)))
                .collect();
            println!(
                "  [{}] {:02}:00  pods pending {:>3} running {:>3} | {} | ${:.2} so far",
                policy_name(consolidation),
                at / 3600,
                counts.pending,
                counts.running,
                caps.join(" "),
                dollars
            );
        }
    }
    stop.cancel();
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the controller ended with an error"),
        Err(e) => tracing::warn!(error = %e, "the controller task failed"),
    }
    let lost = stage._emulator.pods_lost_with_nodes();
    let protected: Vec<&str> = SERVICES.iter().filter(|s| s.pdb).map(|s| s.name).collect();
    let pdb_violations = lost
        .iter()
        .filter(|l| {
            l.namespace == NS
                && protected
                    .iter()
                    .any(|p| l.name.strip_prefix(p).is_some_and(|r| r.starts_with('-')))
        })
        .count();
    let counter = |labels: &[(&str, &str)]| {
        crate::metrics::Metrics::counter_sum(&metrics.scaled_down_nodes_total, labels)
    };
    let mut r = look.report(trace.length.as_secs());
    r.policy = policy_name(consolidation).into();
    r.dollars = dollars;
    r.node_hours = node_seconds / 3600.0;
    r.dollars_per_hour = per_hour;
    r.empty_dollars = empty_dollars;
    r.unregistered_dollars = unregistered_dollars;
    r.idle_per_hour = idle_per_hour;
    r.capacity_short_looks = capacity_short_looks;
    r.evictions =
        crate::metrics::Metrics::counter_sum(&metrics.evicted_pods_total, &[("result", "evicted")]);
    r.nodes_removed = counter(&[]);
    r.nodes_consolidated = counter(&[("reason", "consolidation")]);
    r.pdb_violations = pdb_violations;
    r.pods_lost_with_nodes = lost.len();
    r.lost_updates = state.lost_updates().len();
    r.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(r)
}

/// What one look saw of the trace's pods.
struct Seen {
    /// The nodes that hold a pod of the trace's (terminating ones included).
    occupied: HashSet<String>,
    /// What the running pods ask for: the bound pods not terminating, plus the evicted pods'
    /// replacements not yet bound (each stands for a pod that was running). Cpu and memory in
    /// milli-units ([`quantity::parse`]).
    need: Resources,
}

/// Cpu and memory in milli-units, as [`quantity::parse`] gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Resources {
    cpu: quantity::Milli,
    memory: quantity::Milli,
}

impl Resources {
    /// The sum of `values`' `cpu` and `memory` quantities under `pointer` (a container's
    /// requests, a node's allocatable); one that is absent or does not parse counts 0.
    fn at(values: &[&Value], pointer: &str) -> Resources {
        let mut r = Resources::default();
        for v in values {
            let q = |name: &str| {
                v.pointer(&format!("{pointer}/{name}"))
                    .and_then(Value::as_str)
                    .and_then(|t| quantity::parse(t).ok())
                    .unwrap_or(0)
            };
            r.cpu += q("cpu");
            r.memory += q("memory");
        }
        r
    }

    /// What `pod`'s containers request.
    fn requested(pod: &Value) -> Resources {
        let containers: Vec<&Value> = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(|cs| cs.iter().collect())
            .unwrap_or_default();
        Resources::at(&containers, "/resources/requests")
    }

    /// Whether either resource of `self` is short of `need`.
    fn short_of(&self, need: &Resources) -> bool {
        self.cpu < need.cpu || self.memory < need.memory
    }
}

/// What the runs see of the pods, every [`SAMPLE`].
#[derive(Default)]
struct Look {
    /// Pod uid → first seen pending, first seen bound, replaced an evicted pod, last seen (a
    /// pod deleted while pending, as a scale-in deletes unbound pods first, waited only until
    /// then).
    pods: HashMap<
        String,
        (
            tokio::time::Instant,
            Option<tokio::time::Instant>,
            bool,
            tokio::time::Instant,
        ),
    >,
    /// Bound pods at the last look: uid → workload.
    bound: HashMap<String, String>,
    pending_seconds: f64,
    /// Pod-seconds of batch work thrown away: the time each job pod that went without
    /// finishing (evicted, lost with its node) had run.
    job_work_lost_seconds: f64,
    /// Batch jobs by name: when the trace ends each (its start plus its run), seconds.
    job_ends: HashMap<String, u64>,
    /// When each batch job was first seen `Complete`, seconds of the trace.
    job_done: HashMap<String, u64>,
    /// Batch jobs seen `Failed` (their backoff limit exceeded).
    jobs_failed: HashSet<String>,
}

/// Whether `node` is on its way out: tainted to be deleted (by the controller's scale-down or
/// consolidation), or deleted.
fn node_going(node: &Value) -> bool {
    node.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
        || node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    t.get("key").and_then(Value::as_str)
                        == Some(crate::kube::nodes::TO_BE_DELETED_TAINT)
                })
            })
}

fn workload_of(p: &Value) -> Option<String> {
    p.pointer("/metadata/labels/app")
        .and_then(Value::as_str)
        .map(str::to_string)
}

impl Look {
    /// Notes the batch jobs that completed or failed since the last look.
    fn jobs(&mut self, kube: &KubeState, at: u64) {
        for job in kube.list_all("batch/v1", "jobs", Some(NS)) {
            let Some(name) = job.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            let condition = |kind: &str| {
                job.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == kind && c["status"] == "True")
                    })
            };
            if condition("Complete") && !self.job_done.contains_key(name) {
                self.job_done.insert(name.to_string(), at);
            }
            if condition("Failed") {
                self.jobs_failed.insert(name.to_string());
            }
        }
    }

    /// `shrunk`: by workload, how many replicas the trace took away since the last look (the
    /// bound pods gone beyond that were evicted or lost, and their replacements are counted).
    fn sample(
        &mut self,
        kube: &KubeState,
        now: tokio::time::Instant,
        shrunk: &HashMap<String, u32>,
    ) -> Seen {
        let pods = kube.list_all("v1", "pods", Some(NS));
        let mut occupied: HashSet<String> = HashSet::new();
        let mut requests: HashMap<String, Resources> = HashMap::new();
        let mut bound_now: HashMap<String, String> = HashMap::new();
        let mut alive: HashSet<String> = HashSet::new();
        let mut pending_new: Vec<(String, String)> = Vec::new();
        let mut finished: HashSet<String> = HashSet::new();
        let mut pending = 0usize;
        for p in &pods {
            if let Some(node) = p
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                occupied.insert(node.to_string());
            }
            let Some(uid) = p.pointer("/metadata/uid").and_then(Value::as_str) else {
                continue;
            };
            if p.pointer("/metadata/deletionTimestamp")
                .is_some_and(|v| !v.is_null())
            {
                continue;
            }
            if matches!(
                p.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            ) {
                finished.insert(uid.to_string());
                continue;
            }
            let Some(w) = workload_of(p) else { continue };
            alive.insert(uid.to_string());
            requests.insert(uid.to_string(), Resources::requested(p));
            let is_bound = p
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            match self.pods.get_mut(uid) {
                None => {
                    self.pods
                        .insert(uid.to_string(), (now, is_bound.then_some(now), false, now));
                    if !is_bound {
                        pending_new.push((uid.to_string(), w.clone()));
                    }
                }
                Some(e) => {
                    if is_bound && e.1.is_none() {
                        e.1 = Some(now);
                    }
                    e.3 = now;
                }
            }
            if is_bound {
                bound_now.insert(uid.to_string(), w);
            } else {
                pending += 1;
            }
        }
        // Bound pods gone (or going) beyond what the trace took away: their replacements. A
        // job's pod that finished is the trace's doing; one gone unfinished threw its run away.
        let mut credit: HashMap<String, i64> = HashMap::new();
        for (uid, w) in &self.bound {
            if !alive.contains(uid) && !finished.contains(uid) {
                *credit.entry(w.clone()).or_default() += 1;
                if self.job_ends.contains_key(w) {
                    if let Some(at) = self.pods.get(uid).and_then(|e| e.1) {
                        self.job_work_lost_seconds += now.duration_since(at).as_secs_f64();
                    }
                }
            }
        }
        for (w, n) in shrunk {
            *credit.entry(w.clone()).or_default() -= i64::from(*n);
        }
        for (uid, w) in pending_new {
            if let Some(c) = credit.get_mut(&w).filter(|c| **c > 0) {
                *c -= 1;
                if let Some(e) = self.pods.get_mut(&uid) {
                    e.2 = true;
                }
            }
        }
        // The running pods' need: the bound (not terminating) pods and the evicted pods'
        // replacements still pending.
        let mut need = Resources::default();
        for (uid, r) in &requests {
            let running = bound_now.contains_key(uid)
                || self
                    .pods
                    .get(uid)
                    .is_some_and(|(_, bound, replaced, _)| *replaced && bound.is_none());
            if running {
                need.cpu += r.cpu;
                need.memory += r.memory;
            }
        }
        self.bound = bound_now;
        self.pending_seconds += pending as f64 * SAMPLE.as_secs_f64();
        Seen { occupied, need }
    }

    /// `length`: the trace's, in seconds (a job the trace ends later is not late yet).
    fn report(&self, length: u64) -> ArmReport {
        let mut waits: Vec<f64> = self
            .pods
            .values()
            .filter_map(|(a, b, _, _)| b.map(|b| b.duration_since(*a).as_secs_f64()))
            .collect();
        waits.sort_by(f64::total_cmp);
        let pct = |q: f64| {
            if waits.is_empty() {
                0.0
            } else {
                waits[((waits.len() - 1) as f64 * q).round() as usize]
            }
        };
        let replaced_pending_over_goal = self
            .pods
            .values()
            .filter(|(a, b, replaced, last)| {
                // Never bound: pending from first to last seen (still pending at the end, or
                // deleted unbound by a scale-in).
                *replaced && b.unwrap_or(*last).duration_since(*a) > PENDING_GOAL
            })
            .count();
        let replaced: Vec<f64> = self
            .pods
            .values()
            .filter(|(_, _, replaced, _)| *replaced)
            .map(|(a, b, _, last)| b.unwrap_or(*last).duration_since(*a).as_secs_f64())
            .collect();
        // Each job the trace ended within the day: how long after its trace end it completed
        // (the look's 15 s included), or, not complete by the end, that it is unfinished.
        let mut late: Vec<f64> = Vec::new();
        let mut jobs_unfinished = 0;
        for (name, end) in &self.job_ends {
            match self.job_done.get(name) {
                Some(done) => late.push(done.saturating_sub(*end) as f64 / 60.0),
                None if *end < length => jobs_unfinished += 1,
                None => {}
            }
        }
        late.sort_by(f64::total_cmp);
        ArmReport {
            job_work_lost_hours: self.job_work_lost_seconds / 3600.0,
            jobs_late_mean_minutes: if late.is_empty() {
                0.0
            } else {
                late.iter().sum::<f64>() / late.len() as f64
            },
            jobs_late_max_minutes: late.last().copied().unwrap_or(0.0),
            jobs_unfinished,
            jobs_failed: self.jobs_failed.len(),
            replaced: replaced.len(),
            replaced_waited_for_node: replaced
                .iter()
                .filter(|w| **w > NEW_NODE_WAIT.as_secs_f64())
                .count(),
            pods: self.pods.len(),
            scheduled: waits.len(),
            wait_mean: if waits.is_empty() {
                0.0
            } else {
                waits.iter().sum::<f64>() / waits.len() as f64
            },
            wait_p99: pct(0.99),
            wait_max: waits.last().copied().unwrap_or(0.0),
            pending_pod_hours: self.pending_seconds / 3600.0,
            replaced_pending_over_goal,
            ..ArmReport::default()
        }
    }
}

/// Prints the comparison.
pub fn print(r: &CostReport) {
    println!();
    println!(
        "cost trace: seed {}, {} h{} of a diurnal day (web, api and cache under PDBs, a zone-spread workload, {} batch jobs, a DaemonSet), node groups d4-z1..z3 (Standard_D4s_v5, zones 1-3), d8 (Standard_D8s_v5), e8 (Standard_E8s_v5) at list prices ({REGION}), paused clock",
        r.seed,
        r.hours(),
        if r.quick {
            " (quick mode: the first hours of the 24 h trace)"
        } else {
            ""
        },
        r.jobs
    );
    let mut rows = vec![vec![
        String::new(),
        "cluster-autoscaler's policy".into(),
        "consolidation".into(),
        "lower bound".into(),
    ]];
    rows.extend(r.rows());
    if !r.dials.stabilization_window.is_zero() {
        println!(
            "consolidation with consolidation.stabilizationWindow: {} (moves that evict wait while the pods' requests rise)",
            humantime::format_duration(r.dials.stabilization_window)
        );
    }
    if !r.dials.empty_first.is_zero() {
        println!(
            "consolidation with consolidation.emptyFirst: {} (the hinted nodes get this long to empty before any eviction)",
            humantime::format_duration(r.dials.empty_first)
        );
    }
    if r.dials.deletion_cost_hints != DELETION_COST_HINTS {
        println!(
            "consolidation with consolidation.deletionCostHints: {} (its best candidates whose pods go first in a scale-in)",
            r.dials.deletion_cost_hints
        );
    }
    if r.dials.ready_after != Dials::default().ready_after {
        println!(
            "both runs with the services' pods Ready {} after they run",
            humantime::format_duration(r.dials.ready_after)
        );
    }
    if r.dials.disrupt_jobs != Dials::default().disrupt_jobs {
        println!(
            "consolidation with consolidation.disruptJobs: {} ({})",
            r.dials.disrupt_jobs,
            if r.dials.disrupt_jobs {
                "it evicts the Jobs' running pods, as Karpenter does"
            } else {
                "it waits for the Jobs' running pods to end"
            }
        );
    }
    if r.dials.consolidation_delay_after_add != Dials::default().consolidation_delay_after_add {
        println!(
            "consolidation with consolidation.delayAfterAdd: {} (consolidation held that long after a scale-up of any group)",
            humantime::format_duration(r.dials.consolidation_delay_after_add)
        );
    }
    if r.dials.max_bulk_soft_taint_count != Dials::default().max_bulk_soft_taint_count {
        println!(
            "both runs with scaleDown.maxBulkSoftTaintCount: {}{}",
            r.dials.max_bulk_soft_taint_count,
            if r.dials.max_bulk_soft_taint_count == 0 {
                " (no soft taints)"
            } else {
                ""
            }
        );
    }
    println!("{}", table(&rows));
    println!(
        "by quarter of the day (the whole-node floor: whole nodes covering every pod's requests, each workload's pods whole on them, the spread's three zone domains; no packing of workloads together, no boot time):"
    );
    println!("{}", table(&r.quarters()));
    println!(
        "savings: consolidation costs {:.1} % less than cluster-autoscaler's policy; real time {:.1} s + {:.1} s",
        (1.0 - r.consolidation.dollars / r.ca.dollars.max(1e-9)) * 100.0,
        r.ca.wall_seconds,
        r.consolidation.wall_seconds
    );
    for g in r.goals() {
        println!("{g}");
    }
}

/// The report's chart: dollars per hour of both runs against the lower bound.
pub fn chart(r: &CostReport) -> report::LineChart {
    let series = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(h, d)| (h as f64 + 0.5, *d))
            .collect()
    };
    report::LineChart {
        title: "Dollars per hour".into(),
        x_desc: "hour of the trace (UTC)".into(),
        y_desc: "USD per hour".into(),
        series: vec![
            ("cluster-autoscaler's policy".into(), series(&r.ca.dollars_per_hour)),
            ("consolidation".into(), series(&r.consolidation.dollars_per_hour)),
            ("lower bound".into(), series(&r.lower_bound_per_hour)),
            ("whole-node floor".into(), series(&r.floor_per_hour)),
        ],
        caption: "Each hour's VM cost at list prices under each policy, and the lower bound: the cheapest fractional mix of the groups' sizes covering the requests of every pod that exists, plus a DaemonSet pod per node; and the whole-node floor: the cheapest whole nodes that cover the same and span the spread workload's three zone domains.".into(),
    }
}

/// `demo --cost`: the comparison, printed, and the HTML report when `--report` asks.
pub async fn demo(args: &DemoArgs) -> anyhow::Result<CostReport> {
    let (seed, quiet) = (args.seed, args.quiet);
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    println!(
        "demo --cost: one seeded day on a simulated cluster in paused time, twice: cluster-autoscaler's policy, then consolidation (seed {seed})"
    );
    let d = Dials::default();
    let dials = Dials {
        stabilization_window: args.stabilization_window.unwrap_or(d.stabilization_window),
        max_bulk_soft_taint_count: args
            .max_bulk_soft_taint_count
            .unwrap_or(d.max_bulk_soft_taint_count),
        empty_first: args.empty_first.unwrap_or(d.empty_first),
        consolidation_delay_after_add: args
            .consolidation_delay_after_add
            .unwrap_or(d.consolidation_delay_after_add),
        deletion_cost_hints: args.deletion_cost_hints.unwrap_or(d.deletion_cost_hints),
        disrupt_jobs: args.disrupt_jobs || d.disrupt_jobs,
        ready_after: args.ready_after.unwrap_or(d.ready_after),
    };
    if !dials.empty_first.is_zero() && dials.deletion_cost_hints == 0 {
        anyhow::bail!(
            "--empty-first needs --deletion-cost-hints of at least 1: the nodes given time to empty are the hinted ones (as consolidation.emptyFirst needs consolidation.deletionCostHints)"
        );
    }
    let r = tokio::task::spawn_blocking(move || run_paused(seed, quick, quiet, dials))
        .await
        .context("the cost trace's task")??;
    print(&r);
    if let Some(path) = &args.report {
        let mut header = vec![String::new()];
        header.extend(
            [
                "cluster-autoscaler's policy",
                "consolidation",
                "lower bound",
            ]
            .map(String::from),
        );
        report::write(
            path,
            &report::Report {
                title: "vmss-capacity-controller demo: what consolidation saves".into(),
                intro: vec![format!(
                    "One seeded diurnal day (seed {}, {} h): web, api and cache Deployments under PodDisruptionBudgets, a zone-spread workload, {} batch jobs and a DaemonSet, on five scale sets (Standard_D4s_v5 in zones 1, 2, 3; Standard_D8s_v5; Standard_E8s_v5) at list prices, run twice on the simulated cluster in paused time: cluster-autoscaler's policy (consolidation off, least-waste expander), then consolidation on (price expander).",
                    r.seed,
                    r.hours(),
                    r.jobs
                )],
                lines: vec![chart(&r)],
                timelines: Vec::new(),
                table: report::Table {
                    header,
                    rows: r.rows(),
                },
                preformatted: None,
                notes: r.goals(),
            },
        )?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(cpu: f64, mem: f64, price: f64) -> SizeOption {
        SizeOption {
            cpu_milli: cpu,
            memory_mib: mem,
            price,
        }
    }

    #[test]
    fn the_lower_bound_takes_the_cheapest_single_size_when_one_resource_binds() {
        // cpu-bound demand: the D size (cheaper per cpu) alone.
        let d = s(4000.0, 16000.0, 0.2);
        let e = s(4000.0, 32000.0, 0.25);
        let lb = lower_bound_rate(&[d, e], 8000.0, 8000.0);
        assert!((lb - 0.4).abs() < 1e-9, "{lb}");
        // memory-bound demand: the E size (cheaper per GiB) alone.
        let lb = lower_bound_rate(&[d, e], 1000.0, 64000.0);
        assert!((lb - 0.5).abs() < 1e-9, "{lb}");
        assert_eq!(lower_bound_rate(&[d, e], 0.0, 0.0), 0.0);
    }

    #[test]
    fn the_lower_bound_mixes_two_sizes_when_that_is_cheaper_than_either_alone() {
        // Demand 8 cpu, 48 GiB: D alone needs 3 nodes for memory ($0.6), E alone 2 for cpu
        // ($0.5); 1 D + 1 E cover both exactly ($0.45).
        let d = s(4000.0, 16000.0, 0.2);
        let e = s(4000.0, 32000.0, 0.25);
        let lb = lower_bound_rate(&[d, e], 8000.0, 48000.0);
        assert!((lb - 0.45).abs() < 1e-9, "{lb}");
        // Brute force over a fine grid of fractional mixes never beats it.
        let mut best = f64::INFINITY;
        for i in 0..=400 {
            for j in 0..=400 {
                let (x, y) = (f64::from(i) / 100.0, f64::from(j) / 100.0);
                if x * 4000.0 + y * 4000.0 >= 8000.0 - 1e-9
                    && x * 16000.0 + y * 32000.0 >= 48000.0 - 1e-9
                {
                    best = best.min(x * 0.2 + y * 0.25);
                }
            }
        }
        assert!(lb <= best + 1e-9 && best - lb < 0.01, "{lb} {best}");
        // A third size dearer in both resources changes nothing; a pair whose tight solution is
        // negative is not taken.
        let dear = s(2000.0, 8000.0, 0.3);
        assert!((lower_bound_rate(&[d, e, dear], 8000.0, 48000.0) - 0.45).abs() < 1e-9);
    }

    #[test]
    fn the_lower_bound_of_the_trace_sizes_is_below_any_whole_packing_and_above_zero() {
        let sizes = size_options();
        assert_eq!(sizes.len(), 3);
        assert!(sizes.iter().all(|s| s.price > 0.0 && s.cpu_milli > 0.0));
        let lb = lower_bound_rate(&sizes, 20_000.0, 60_000.0);
        // Whole nodes of any one size cost at least as much.
        for s in &sizes {
            let n = (20_000.0 / s.cpu_milli).max(60_000.0 / s.memory_mib).ceil();
            assert!(lb <= n * s.price + 1e-9);
        }
        assert!(lb > 0.0);
    }

    fn needing(cpu_milli: f64, memory_mib: f64, domains: u32, shapes: Vec<Shape>) -> Need {
        Need {
            cpu_milli,
            memory_mib,
            domains,
            shapes,
        }
    }

    fn f(cpu: f64, mem: f64, price: f64, zones: u32) -> FloorSize {
        FloorSize {
            size: s(cpu, mem, price),
            zones,
        }
    }

    #[test]
    fn the_floor_takes_whole_nodes_and_is_never_under_the_lower_bound() {
        let d = f(4000.0, 16000.0, 0.2, 3);
        let e = f(4000.0, 32000.0, 0.25, 0);
        let need = |cpu: f64, mem: f64| needing(cpu, mem, 0, Vec::new());
        // 8 cpu, 48 GiB: the fractional bound's 1 D + 1 E is already whole.
        assert!((floor_rate(&[d, e], &need(8000.0, 48000.0)) - 0.45).abs() < 1e-9);
        // 9 cpu: a third node; three Ds cover 48 GiB too, for less than 2 D + 1 E.
        let fl = floor_rate(&[d, e], &need(9000.0, 48000.0));
        assert!((fl - 0.6).abs() < 1e-9, "{fl}");
        // Brute force over whole counts agrees, and the fractional bound is never above it.
        for (cpu, mem) in [
            (1.0, 1.0),
            (9000.0, 20000.0),
            (23000.0, 140000.0),
            (500.0, 70000.0),
        ] {
            let mut best = f64::INFINITY;
            for a in 0..=40u32 {
                for b in 0..=40u32 {
                    let (a, b) = (f64::from(a), f64::from(b));
                    if a * 4000.0 + b * 4000.0 >= cpu && a * 16000.0 + b * 32000.0 >= mem {
                        best = best.min(a * 0.2 + b * 0.25);
                    }
                }
            }
            let fl = floor_rate(&[d, e], &need(cpu, mem));
            assert!((fl - best).abs() < 1e-9, "{cpu} {mem}: {fl} {best}");
            assert!(lower_bound_rate(&[d.size, e.size], cpu, mem) <= fl + 1e-9);
        }
        assert_eq!(floor_rate(&[d, e], &need(0.0, 0.0)), 0.0);
    }

    #[test]
    fn the_floor_spans_the_zone_domains_the_spread_needs() {
        // One small pod, three domains: three zonal nodes, or two and one regional node.
        let d = f(4000.0, 16000.0, 0.2, 3);
        let e = f(4000.0, 32000.0, 0.25, 0);
        let need = needing(100.0, 100.0, 3, Vec::new());
        assert!((floor_rate(&[d, e], &need) - 0.6).abs() < 1e-9);
        let cheap_e = f(4000.0, 32000.0, 0.1, 0);
        assert!((floor_rate(&[d, cheap_e], &need) - 0.5).abs() < 1e-9);
        // Regional nodes alone give one domain however many there are: unreachable.
        assert_eq!(floor_rate(&[e], &need), f64::INFINITY);
        // The trace's sizes: D4s in three zones, D8s and E8s regional.
        let whole = floor_sizes();
        assert_eq!(
            whole.iter().map(|s| s.zones).collect::<Vec<_>>(),
            vec![3, 0, 0]
        );
    }

    #[test]
    fn the_floor_holds_each_shapes_pods_whole() {
        let d = f(4000.0, 16000.0, 0.2, 3);
        let e = f(8000.0, 64000.0, 0.5, 0);
        // Two 3-cpu pods: 6 cpu would fit on 1.5 Ds, but a D holds one such pod: 2 Ds.
        let job = Shape {
            cpu_milli: 3000.0,
            memory_mib: 1000.0,
            count: 2,
        };
        assert_eq!(job.fit(&d.size), 1);
        assert_eq!(job.fit(&e.size), 2);
        let need = needing(6000.0, 2000.0, 0, vec![job]);
        let fl = floor_rate(&[d, e], &need);
        assert!((fl - 0.4).abs() < 1e-9, "{fl}");
        assert!(lower_bound_rate(&[d.size, e.size], 6000.0, 2000.0) < fl);
        // A shape no size holds cannot be served.
        let huge = Shape {
            cpu_milli: 9000.0,
            memory_mib: 1.0,
            count: 1,
        };
        let need = needing(9000.0, 1.0, 0, vec![huge]);
        assert_eq!(floor_rate(&[d, e], &need), f64::INFINITY);
        // The trace's every minute: the floor is between the lower bound and what cluster-
        // autoscaler's policy paid in any run (well under 2x the bound).
        let trace = Trace::generate(7, DAY);
        let (sizes, whole) = (size_options(), floor_sizes());
        for n in trace.needs_per_minute().iter().step_by(37) {
            let lb = lower_bound_rate(&sizes, n.cpu_milli, n.memory_mib);
            let fl = floor_rate(&whole, n);
            assert!(lb <= fl + 1e-9 && fl < 2.0 * lb, "{n:?}: {lb} {fl}");
        }
    }

    #[test]
    fn the_trace_is_seeded_diurnal_and_has_jobs() {
        let a = Trace::generate(7, DAY);
        let b = Trace::generate(7, DAY);
        assert_eq!(a.steps, b.steps);
        assert_ne!(a.steps, Trace::generate(8, DAY).steps);
        assert!(a.jobs() >= 20, "{}", a.jobs());
        let d = a.demand_per_minute();
        assert_eq!(d.len(), 24 * 60);
        // Busier at 15:00 than at 03:00.
        assert!(
            d[15 * 60].0 > d[3 * 60].0 * 1.2,
            "{:?} {:?}",
            d[15 * 60],
            d[3 * 60]
        );
        // The spread workload needs its three domains every minute (3 replicas at least).
        assert!(a.needs_per_minute().iter().all(|n| n.domains == 3));
        // Quick mode is the day's beginning.
        let q = Trace::generate(7, QUICK);
        assert_eq!(q.demand_per_minute()[..60], d[..60]);
    }

    #[test]
    fn the_capacity_check_sums_requests_and_allocatable_and_leaves_out_nodes_on_their_way_out() {
        let pod = serde_json::json!({"spec": {"containers": [
            {"resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}},
            {"resources": {"requests": {"cpu": "1"}}},
            {"resources": {}},
        ]}});
        let r = Resources::requested(&pod);
        assert_eq!(r.cpu, 1250);
        assert_eq!(r.memory, 512 * 1024 * 1024 * 1000);
        let node = |ready: &str, taints: Value, deleted: bool| {
            let mut n = serde_json::json!({
                "metadata": {"name": "n"},
                "spec": {"taints": taints},
                "status": {"allocatable": {"cpu": "3860m", "memory": "14Gi"},
                    "conditions": [{"type": "Ready", "status": ready}]},
            });
            if deleted {
                n["metadata"]["deletionTimestamp"] = serde_json::json!("2026-11-29T00:00:00Z");
            }
            n
        };
        let staying = node("True", serde_json::json!([]), false);
        assert!(crate::emulator::sim::nodes::is_ready(&staying) && !node_going(&staying));
        assert_eq!(Resources::at(&[&staying], "/status/allocatable").cpu, 3860);
        assert!(!crate::emulator::sim::nodes::is_ready(&node(
            "False",
            serde_json::json!([]),
            false
        )));
        let tainted = serde_json::json!([{"key": crate::kube::nodes::TO_BE_DELETED_TAINT,
            "effect": "NoSchedule"}]);
        assert!(node_going(&node("True", tainted, false)));
        assert!(node_going(&node("True", serde_json::json!([]), true)));
        // The soft taint is no removal: its node stays.
        let soft = serde_json::json!([{"key": crate::kube::nodes::DELETION_CANDIDATE_TAINT,
            "effect": "PreferNoSchedule"}]);
        assert!(!node_going(&node("True", soft, false)));
        // Short when either resource is.
        let have = Resources {
            cpu: 4000,
            memory: 10,
        };
        assert!(!have.short_of(&Resources {
            cpu: 4000,
            memory: 10
        }));
        assert!(have.short_of(&Resources {
            cpu: 4001,
            memory: 0
        }));
        assert!(have.short_of(&Resources { cpu: 0, memory: 11 }));
    }
}
