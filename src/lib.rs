//! vmss-capacity-controller: keeps Azure VM Scale Set capacity where a plan says it should be,
//! and never silently overwrites another writer's change.
//!
//! Every capacity write is a sparse PUT carrying `If-Match: <cached ETag>`; a `412 Precondition
//! Failed` means somebody else changed the scale set since we read it, so the controller
//! invalidates its caches, re-reads and re-plans instead of clobbering.
//!
//! Module map (one concern each):
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | YAML, environment and `azure.json` loading; validation into [`config::Settings`] |
//! | [`azure`] | the ARM client (sparse conditional PUT, GET, LIST), AKS agent pools (whole-pool conditional PUT), credentials, LRO polling, throttle gates |
//! | [`resource`] | what a node group's backing resource can do: one trait, implemented by scale sets and agent pools |
//! | [`cache`] | the copy-on-write scale-set cache, the size cache, the instance cache |
//! | [`capacity`] | Azure's capacity as it is: vCPU quota (compute usages, cached, pools a plan draws from), offerings marked unavailable after classified allocation failures, and what a node costs (list prices embedded and refreshed from the retail prices API, negotiated rates over them) |
//! | [`planner`] | pure capacity planning: bounds, schedules, scale-down steps, coalescing |
//! | [`node_groups`] | the read side: groups (configured, discovered), the caches, sizes, floors, refusals, which nodes are whose |
//! | [`reconciler`] | the write side: the loop, the ETag protocol, the one guarded send, the per-class error policy |
//! | [`fence`] | the last check before every Azure write (leader election's fencing) |
//! | [`hold`] | why a write was not sent: one closed set of reasons (metric label, Event, status, delete refusal) |
//! | [`notify`] | events and per-group status the reconciler reports (Kubernetes Events, status ConfigMap) |
//! | [`metrics`] | the Prometheus registry and every metric the daemon exports |
//! | [`http`] | `/metrics`, `/healthz`, `/readyz` |
//! | [`pods`] | pod-driven demand's pure parts: pods and nodes as records, quantities, fit, templates, bin packing, expanders, the demand sources (one trait: pending pods, virtual pods from templates), ProvisioningRequests' decision, CapacityBuffers' decision, the scale-up decision, one scale-down pass (which nodes go, which instances never registered) |
//! | [`autoscale`] | `demand: pods`'s loops: [`autoscale::scale_up`] (batching pending pods, one decision per batch, the reconciler's demand source; ProvisioningRequests through [`autoscale::provreq`], CapacityBuffers through [`autoscale::buffer`]) and [`autoscale::scale_down`] (taint, re-check, drain through evictions, delete exactly that instance) |
//! | [`kube`] | the Kubernetes side: client, Lease leader election, reflectors of nodes and pods (as records), PDBs, DaemonSets, ProvisioningRequests and CapacityBuffers and their status writes |
//! | [`emulator`] | feature `emulator` (default): the crate `vmss-emulator` (`crates/emulator`), re-exported: ARM (scale sets, AKS, identity, throttling, faults) and Kubernetes API emulators, separate rooms |
//! | [`demo`] | feature `emulator`: the zero-setup showcase: pod-driven scaling with a rival writer, ETags on and off side by side; the plan, AKS and Lease showcases by flag |
//! | [`app`] | one controller replica wired from its settings (`run` builds one, the demo two) |
//! | [`cli`] | subcommands and their implementations; `main.rs` only dispatches |

pub mod app;
pub mod autoscale;
pub mod azure;
pub mod backoff;
pub mod cache;
pub mod capacity;
pub mod cli;
pub mod config;
#[cfg(feature = "emulator")]
pub mod demo;
#[cfg(feature = "emulator")]
pub use vmss_emulator as emulator;
pub mod explain;
pub mod fence;
pub mod hold;
pub mod http;
pub mod kube;
pub mod metrics;
pub mod node_groups;
pub mod notify;
pub mod planner;
pub mod pods;
pub mod problem;
pub mod reconciler;
pub mod resource;
