//! Where the pods that ask for capacity come from: one trait, [`DemandPods`], implemented by
//! the pods the scheduler found no room for ([`PendingPods`]) and by pods made up from a
//! template ([`VirtualPods`]: a ProvisioningRequest's pod sets, a booking's pods). The scale-up
//! decision reads every source the same way, so a rule about asking pods exists once.

use super::index::PodIndex;
use super::pending::wants_capacity;
use super::record::PodRecord;
use std::sync::Arc;

/// A source of pods that ask for capacity.
pub trait DemandPods: std::fmt::Debug + Send + Sync {
    /// The source's name, for logs.
    fn source(&self) -> &'static str;
    /// The pods asking for capacity now; `cluster` is the cluster's pods by where they are.
    fn asking(&self, cluster: &PodIndex) -> Vec<Arc<PodRecord>>;
    /// Whether the pods hold room already promised to them (a booking): they take room before
    /// every other source's pods, so it is not given to others, and ask for new room only when
    /// none is left for them.
    fn booked(&self) -> bool {
        false
    }
}

/// The pods the scheduler found no room for ([`wants_capacity`]).
#[derive(Debug, Clone, Copy)]
pub struct PendingPods {
    /// `expendablePodsPriorityCutoff`.
    pub priority_cutoff: i32,
}

impl DemandPods for PendingPods {
    fn source(&self) -> &'static str {
        "pending_pods"
    }

    fn asking(&self, cluster: &PodIndex) -> Vec<Arc<PodRecord>> {
        cluster
            .unplaced()
            .filter(|p| wants_capacity(p, self.priority_cutoff))
            .cloned()
            .collect()
    }
}

/// Pods made up from templates: they exist only in the decision.
#[derive(Debug, Clone, Default)]
pub struct VirtualPods {
    /// The source's name, for logs.
    pub source: &'static str,
    /// The pods.
    pub pods: Vec<Arc<PodRecord>>,
    /// They hold booked room ([`DemandPods::booked`]).
    pub booked: bool,
}

impl DemandPods for VirtualPods {
    fn source(&self) -> &'static str {
        self.source
    }

    fn asking(&self, _: &PodIndex) -> Vec<Arc<PodRecord>> {
        self.pods.clone()
    }

    fn booked(&self) -> bool {
        self.booked
    }
}

/// The sources of plain `demand: pods`: the pending pods alone.
pub fn pending_only(priority_cutoff: i32) -> Vec<Arc<dyn DemandPods>> {
    vec![Arc::new(PendingPods { priority_cutoff })]
}
