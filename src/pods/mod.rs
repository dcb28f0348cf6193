//! The pod side of demand (issue 10's foundation): pure code, no I/O.
//!
//! | module | owns |
//! |---|---|
//! | [`quantity`] | Kubernetes resource quantities as exact milli-units |
//! | [`fit`] | whether a pod fits a node, as kube-scheduler's filters decide it |

pub mod fit;
pub mod quantity;
