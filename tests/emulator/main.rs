//! Integration tests of the emulator: ARM and Kubernetes as they answer, its faults and its simulated cluster.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../emulator_support/mod.rs"]
mod emulator_support;

mod aks_pools;
mod aks_throttle;
mod azure_sdk;
mod cluster_sim;
mod etag_table;
mod faults;
mod kube;
mod kube_faults;
mod lifecycle;
mod lro;
mod outside_faults;
mod resources;
mod retail_prices;
mod simulate_cli;
