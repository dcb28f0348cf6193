//! Integration tests of the writer: the ETag protocol, its errors, fencing, deletes and Azure capacity.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod aks_pools;
mod aks_throttle;
mod azure_capacity;
mod delete_instances;
mod errors;
mod etag;
mod fence;
mod fence_deadline;
mod health;
mod status;
