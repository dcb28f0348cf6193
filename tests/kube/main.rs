//! Integration tests of the Kubernetes side: Lease, nodes, reflectors, status ConfigMap and Events.
//!
//! One test binary per area (docs/testing.md): the suite links a few binaries, not one per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod api_down;
mod ca_status;
mod lease;
mod nodes;
mod nodes_real_apiserver;
mod reflectors;
mod replicas;
mod status_events;
mod status_real_apiserver;
mod status_rival;
mod watch_resume;
