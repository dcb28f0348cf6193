//! Integration tests of the configuration, the command line and start-up.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod cli;
mod credentials;
mod dry_run;
mod fuzz;
mod identities;
mod kinds;
mod kubernetes;
mod load;
mod pod_demand;
mod prices;
mod sources;
mod startup_problems;
