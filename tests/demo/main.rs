//! Integration tests of the demos, their report and the deployment manifests.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

mod deploy_manifests;
mod kubernetes;
mod pods;
mod report;
