//! Azure Resource Manager access: the ARM client (sparse conditional PUT, GET, LIST, LRO polling),
//! credentials, and the `Retry-After` gates that stop a class of calls while ARM throttles us.
//!
//! Built on `azure_mgmt_compute` 0.21 with its traps avoided (see the docs of [`arm`]):
//! `.send()` only, the built-in retry policy off, request timeouts on our own HTTP client, and a
//! response policy that keeps the headers of error answers.

pub mod aks;
pub mod allocation;
pub mod arm;
pub mod budget;
pub mod credentials;
pub mod throttle;

pub use allocation::AllocationFailure;
pub use arm::{ArmClient, ArmError, ArmOp, DeleteAccepted, Precondition, PutAccepted};
