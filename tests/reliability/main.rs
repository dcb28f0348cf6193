//! Integration tests of reliability: faults, interleavings, replicas and bad input, with invariants.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod faults;
mod interleavings;
mod pod_invariants;
mod pods;
mod replicas;
