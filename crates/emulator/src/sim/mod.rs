//! The cluster simulation: ties the emulator's ARM side to its Kubernetes side, so a controller
//! that watches pods and writes capacities can be tested end to end. Turned on with
//! [`EmulatorBuilder::cluster_simulation`](super::EmulatorBuilder::cluster_simulation) (with the
//! Kubernetes side); off by default. A background task, stopped with the emulator, does every
//! tick, in this order:
//!
//! 1. every VMSS instance (plain and AKS backing scale sets alike) gets a Node, `Ready` after the
//!    boot delay; a Node whose instance is gone goes, with every pod bound to it ([`nodes`]);
//! 2. ReplicaSets and DaemonSets get their pods back (`workloads`), Jobs keep their pods running
//!    until enough succeeded (`jobs`);
//! 3. pending pods are bound where they fit, or marked `Unschedulable` (`scheduler`);
//! 4. runs that are due end: their pods turn `Succeeded` (`jobs`); pods that take a while to be
//!    Ready turn Ready when their time has come (`readiness`);
//! 5. PodDisruptionBudgets get their `status` written, as the disruption controller writes it
//!    (`workloads`).
//!
//! | module | owns |
//! |---|---|
//! | [`nodes`] | instances → Nodes: names, providerIDs, labels, taints, readiness |
//! | [`sizes`] | what a VM size gives a node (the emulator's own table) |
//! | `quantity` | resource quantities |
//! | `scheduler` | binding pending pods, the `Unschedulable` message |
//! | `workloads` | ReplicaSets and DaemonSets |
//! | `jobs` | Jobs, and pods that end on their own ([`RUNS_FOR_ANNOTATION`]) |
//! | `readiness` | pods that are Ready only a while after they run ([`READY_AFTER_ANNOTATION`]) |
//! | `api` | the Rust API for tests and the demo, on [`KubeState`] |
//!
//! None of it shares code with the planner's fit code (the controller's `pods` module): if they
//! shared it, a bug would agree with itself. The crate boundary enforces it: this crate does not
//! depend on the controller.

mod api;
mod clocks;
mod jobs;
pub mod nodes;
mod placement;
mod quantity;
mod readiness;
mod scheduler;
pub mod sizes;
mod workloads;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

pub use api::{PodCounts, PodTemplate};
pub use jobs::{FAILURE_BACKOFF, MAX_FAILURE_BACKOFF, RUNS_FOR_ANNOTATION};
pub use nodes::PodLoss;
pub use readiness::READY_AFTER_ANNOTATION;

use super::arm::inventory::ScaleSetInventory;
use super::kube::resources;
use super::kube::store::Store;
use super::kube::KubeState;
use super::state::EmulatorState;

/// How long an instance's Node stays `Ready=False` by default.
pub const DEFAULT_BOOT_DELAY: Duration = Duration::from_secs(1);
/// How often the simulation steps by default.
pub const DEFAULT_TICK: Duration = Duration::from_millis(100);

/// Settings of the cluster simulation.
#[derive(Debug, Clone, Copy)]
pub struct SimSettings {
    /// From an instance's appearance (or the end of its provisioning, if later) to its Node
    /// turning `Ready`.
    pub boot_delay: Duration,
    /// Interval between steps.
    pub tick: Duration,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            boot_delay: DEFAULT_BOOT_DELAY,
            tick: DEFAULT_TICK,
        }
    }
}

/// Pods the simulation deleted with their Node, oldest first: shared by the simulation's task
/// and [`EmulatorHandle::pods_lost_with_nodes`](super::EmulatorHandle::pods_lost_with_nodes).
pub(crate) type LossLog = Arc<parking_lot::Mutex<Vec<PodLoss>>>;

/// What the simulation keeps between steps.
#[derive(Debug, Default)]
struct Simulation {
    nodes: nodes::NodeMemory,
    losses: LossLog,
    /// What the last step that wrote nothing saw: the versions of the types it reads and the
    /// instances. While both stay the same and no Node is due to boot, a step has nothing to do.
    settled: Option<(Vec<u64>, Vec<ScaleSetInventory>)>,
    /// When the next booting Node turns `Ready`.
    next_boot: Option<Instant>,
    /// When the next run ends, the next Job's failure backoff does, or the next pod turns Ready.
    next_job: Option<Instant>,
    jobs: jobs::JobMemory,
    readiness: readiness::ReadinessMemory,
    /// Owners seen alive, by plural: their dependents are collected once they are gone.
    owners: std::collections::BTreeMap<&'static str, std::collections::HashSet<String>>,
}

/// The last change of each type the simulation reads.
fn versions(store: &Store) -> Vec<u64> {
    [
        ("", "nodes"),
        ("", "pods"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "daemonsets"),
        ("batch", "jobs"),
        ("policy", "poddisruptionbudgets"),
        ("", "persistentvolumeclaims"),
        ("", "persistentvolumes"),
        ("storage.k8s.io", "storageclasses"),
        ("", "namespaces"),
    ]
    .iter()
    .filter_map(|(g, plural)| resources::find(g, "v1", plural))
    .map(|rt| store.last_change(rt))
    .collect()
}

impl Simulation {
    /// One step: nodes, then workloads, then the scheduler, under one lock of the store. Skipped
    /// when nothing it reads changed since a step that wrote nothing (the cluster is settled).
    fn step(&mut self, arm: &EmulatorState, kube: &KubeState, boot_delay: Duration) {
        let inventory = arm.inventory();
        let now = Instant::now();
        kube.with_store(|store| {
            let before = versions(store);
            let due = [self.next_boot, self.next_job]
                .into_iter()
                .flatten()
                .any(|t| now >= t);
            if !due
                && self
                    .settled
                    .as_ref()
                    .is_some_and(|(v, inv)| *v == before && *inv == inventory)
            {
                return;
            }
            let mut lost = Vec::new();
            self.next_boot = nodes::sync(
                store,
                &mut self.nodes,
                &inventory,
                boot_delay,
                now,
                &mut lost,
            );
            if !lost.is_empty() {
                self.losses.lock().extend(lost);
            }
            workloads::reconcile_deployments(store);
            workloads::collect_garbage(store, &mut self.owners);
            workloads::reconcile_replica_sets(store);
            let backoff = jobs::reconcile_jobs(store, &mut self.jobs, now);
            workloads::reconcile_daemon_sets(store);
            scheduler::schedule(store);
            // After the binding: a pod bound now starts its run, and its wait to be Ready, now.
            let runs = jobs::finish_runs(store, &mut self.jobs, now);
            let ready = readiness::make_ready(store, &mut self.readiness, now);
            self.next_job = [runs, backoff, ready].into_iter().flatten().min();
            workloads::reconcile_disruption_budgets(store);
            let after = versions(store);
            // A step that wrote something may have left work for the next (a status to catch up).
            self.settled = (after == before).then_some((after, inventory));
        });
    }
}

/// Starts the simulation's task; the caller owns it and aborts it to stop.
pub(crate) fn spawn(
    arm: EmulatorState,
    kube: KubeState,
    settings: SimSettings,
    losses: LossLog,
) -> JoinHandle<()> {
    let tick = settings.tick.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut sim = Simulation {
            losses,
            ..Simulation::default()
        };
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            sim.step(&arm, &kube, settings.boot_delay);
        }
    })
}
