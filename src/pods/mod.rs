//! The pod side of demand (issue 10's foundation): pure code, no I/O.
//!
//! | module | owns |
//! |---|---|
//! | [`demand`] | where asking pods come from: one trait, pending pods and virtual pods from templates |
//! | [`provreq`] | ProvisioningRequests: their pod sets as virtual pods, conditions, the per-class decision |
//! | [`buffer`] | CapacityBuffers: headroom as virtual pods (replicas, percentage, limits), their status and conditions |
//! | [`resource_quota`] | ResourceQuotas as buffers meet them: how many of a buffer's pods a namespace's quotas still admit (`LimitedByQuotas`) |
//! | [`quantity`] | Kubernetes resource quantities as exact milli-units |
//! | [`fit`] | whether a pod fits a node, as kube-scheduler's filters decide it |
//! | [`estimate`] | first-fit-decreasing bin packing: new nodes per group for pending pods |
//! | [`expander`] | which group to grow: least-waste, most-pods, priority, random |
//! | [`template`] | what a new node of a group would offer: live node, or VM size + tags |
//! | [`learn`] | what registered against what was predicted: template mismatches, scale-ups that did not help |
//! | [`topology`] | the filters that look beyond one node: topology spread, inter-pod (anti-)affinity on any key |
//! | [`volumes`] | what a pod's claims ask of a node: bound volumes' zones, `WaitForFirstConsumer` classes, attach limits |
//! | [`pending`] | which pods ask for capacity, and batching a burst of them |
//! | [`record`] | a pod as the controller keeps it: its own fields, and a spec shared by equal pods |
//! | [`scale_up`] | one decision: which groups grow by how much for the pods pending now |
//! | [`scale_down`] | whether one node can go, and what blocks removing it |
//! | [`consolidate`] | multi-node consolidation: candidates by savings over disruption, the prefix search, budgets, re-validation |
//! | [`stabilization`] | whether the pods' requests rose within `consolidation.stabilizationWindow` (moves wait while demand grows) |
//! | [`deletion_cost`] | deletion-cost hints: the best consolidation candidates' pods deleted first when a Deployment scales in |
//! | [`recheck`] | the re-check of a tainted node before its drain, by the rules [`unneeded`] decides by (which pods count, which nodes take pods, which utilisation keeps a node) |
//! | [`unneeded`] | one scale-down pass: unneeded nodes, since when, which go now; instances no Node stands for |

pub mod buffer;
pub mod consolidate;
pub mod deletion_cost;
pub mod demand;
pub mod estimate;
pub mod expander;
pub mod fit;
pub mod index;
pub mod learn;
pub mod pending;
pub mod provreq;
pub mod quantity;
pub mod recheck;
pub mod record;
pub mod resource_quota;
pub mod scale_down;
pub mod scale_up;
pub mod soft_taint;
pub mod stabilization;
pub mod template;
pub mod topology;
pub mod unneeded;
pub mod volumes;
pub mod wire;
