//! The two loops that drive capacity from the cluster (`demand: pods`): [`scale_up`] turns
//! pending pods (and ProvisioningRequests, [`provreq`]; CapacityBuffers, [`buffer`]) into per-group targets the reconciler
//! writes, [`scale_down`] removes the nodes nobody needs, one named instance at a time.
//!
//! Both read node groups through [`crate::node_groups`] and the cluster through
//! [`crate::kube::reflect::ClusterView`], and reach the reconciler only through a narrow
//! interface: publish demand and wake it ([`crate::reconciler::Reconciler::wake`]), ask whether
//! this replica may write and whether a delete would be held, request a delete, invalidate a
//! size whose delete outcome a fresh list settled, and report a halt for the status.

pub mod buffer;
pub mod follow_up;
pub mod provreq;
pub mod scale_down;
pub mod scale_up;
mod status_writes;
