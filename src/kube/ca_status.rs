//! cluster-autoscaler's status ConfigMap, `kube-system/cluster-autoscaler-status` by default:
//! its names and annotations. The document is built on the read side
//! ([`crate::node_groups::ca_status`], from the one status model) and written by the same writer
//! as the controller's own status ([`super::status::StatusWriter`]): GET, change only the
//! `status` key and the annotation, update with the `resourceVersion` read; other writers' keys
//! are kept. Only a ConfigMap carrying [`CA_STATUS_OWNER_ANNOTATION`] (set when this controller
//! creates it) is written: one without it belongs to another autoscaler (AKS's managed
//! cluster-autoscaler writes the default name), and ours then goes to
//! [`FALLBACK_CA_STATUS_CONFIG_MAP`], in the same layout, with a warning at start.

pub use crate::config::{DEFAULT_CA_STATUS_CONFIG_MAP, FALLBACK_CA_STATUS_CONFIG_MAP};
/// The annotation that marks a cluster-autoscaler-format status ConfigMap as this controller's
/// (set when it creates one). One found without it is another autoscaler's (AKS's managed
/// cluster-autoscaler writes `cluster-autoscaler-status` in `kube-system`): it is left alone and
/// ours is written as [`FALLBACK_CA_STATUS_CONFIG_MAP`] instead.
pub const CA_STATUS_OWNER_ANNOTATION: &str = "vmss-capacity-controller.io/owner";
/// The owner annotation's value.
pub const CA_STATUS_OWNER: &str = "vmss-capacity-controller";
/// The annotation cluster-autoscaler stamps with the time of each write.
pub const CA_LAST_UPDATED_ANNOTATION: &str = "cluster-autoscaler.kubernetes.io/last-updated";
