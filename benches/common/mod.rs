//! Helpers shared by the benchmarks: quick mode, a demand knob, request-log classification.
#![allow(dead_code)] // each bench uses a different subset

pub mod designs;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use vmss_capacity_controller::config::NodeGroupSpec;
use vmss_capacity_controller::emulator::{FaultKind, FaultSpec, RequestRecord};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::planner::{Demand, DemandSource, Reason};

/// `BENCH_QUICK=1` (or `--quick` on the command line): the CI-sized run.
pub fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
        || std::env::args().any(|a| a == "--quick")
}

/// Simulated ARM latency per call, in ms (`BENCH_ARM_LATENCY_MS`, default 100).
pub fn arm_latency_ms() -> u64 {
    std::env::var("BENCH_ARM_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// A latency fault on every ARM route (the emulator sleeps on the tokio clock, so under a
/// paused clock it costs virtual time only).
pub fn latency_fault(ms: u64) -> FaultSpec {
    FaultSpec {
        method: None,
        path_contains: Some("/subscriptions/".into()),
        kind: FaultKind::Latency { ms, max_ms: None },
        count: None,
        probability: None,
        seed: None,
    }
}

/// Demand every group shares, turned like a knob.
#[derive(Debug)]
pub struct Knob(pub AtomicI64);

impl Knob {
    pub fn new(v: i64) -> Arc<Self> {
        Arc::new(Knob(AtomicI64::new(v)))
    }
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::SeqCst)
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl DemandSource for Knob {
    fn demand(&self, _group: &NodeGroupSpec, _now: time::OffsetDateTime) -> (Demand, Reason) {
        (Demand::Exact(self.get()), Reason::Desired)
    }
}

/// What kind of ARM call a request-log record is.
pub fn kind(r: &RequestRecord) -> &'static str {
    let path = r.path.split('?').next().unwrap_or("");
    if path.starts_with("/_emulator") {
        return "control";
    }
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (r.method.as_str(), segs.as_slice()) {
        ("PUT", _) => "PUT",
        ("GET", [.., "virtualMachineScaleSets"]) => "LIST",
        ("GET", [.., "virtualMachineScaleSets", _]) => "GET",
        ("GET", [.., "virtualMachines"]) => "VM-LIST",
        ("GET", _) if path.contains("/operations") || path.contains("operation") => "LRO-POLL",
        _ => "other",
    }
}

/// Counts of ARM calls by kind (control-API requests excluded).
#[derive(Debug, Default, Clone)]
pub struct Calls(pub BTreeMap<&'static str, u64>);

impl Calls {
    pub fn of(records: &[RequestRecord]) -> Self {
        let mut m = BTreeMap::new();
        for r in records {
            let k = kind(r);
            if k != "control" {
                *m.entry(k).or_insert(0) += 1;
            }
        }
        Calls(m)
    }
    pub fn get(&self, k: &str) -> u64 {
        self.0.get(k).copied().unwrap_or(0)
    }
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
    pub fn status(records: &[RequestRecord], kind_: &str, status: u16) -> u64 {
        records
            .iter()
            .filter(|r| kind(r) == kind_ && r.status == status)
            .count() as u64
    }
}

impl std::fmt::Display for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (", self.total())?;
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k} {v}")).collect();
        write!(f, "{})", parts.join(", "))
    }
}

/// `arm_requests_total` summed per operation label.
pub fn arm_requests_by_op(metrics: &Metrics) -> BTreeMap<String, u64> {
    use prometheus::core::Collector;
    let mut out = BTreeMap::new();
    for fam in metrics.arm_requests_total.collect() {
        for m in fam.get_metric() {
            let op = m
                .get_label()
                .iter()
                .find(|l| l.name() == "operation")
                .map(|l| l.value().to_string())
                .unwrap_or_default();
            *out.entry(op).or_insert(0) += m.get_counter().get_value() as u64;
        }
    }
    out
}

/// The large-cluster benches' node group `g`: its name.
pub fn group_name(g: usize) -> String {
    format!("pool{g:03}")
}

/// The large-cluster benches' node group `g`: VM size, cpu and memory (every fourth a GPU size).
pub fn size_of(g: usize) -> (&'static str, &'static str, &'static str) {
    match g % 4 {
        0 => ("Standard_NC6s_v3", "6", "110Gi"),
        1 => ("Standard_D4s_v5", "4", "16Gi"),
        2 => ("Standard_D8s_v5", "8", "32Gi"),
        _ => ("Standard_E8s_v5", "8", "64Gi"),
    }
}

/// "met" / "MISSED" for a goal line.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}
