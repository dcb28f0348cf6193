//! Integration tests of pods driving scale-up and scale-down, and explain.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod capacity_buffers;
mod consolidating;
mod consolidation;
mod crd;
mod explain;
mod price_expander;
mod provisioning_requests;
mod replace;
mod runaway;
mod scale_down;
mod scale_down_safety;
mod scale_up;
