//! Resident memory of the real daemon binary managing 1,000 scale sets of 100 instances each
//! (goal under 64 MiB). The emulator runs in this process; the daemon
//! (`vmss-capacity-controller run --config <tmp.yaml>`) is a child process whose `VmRSS` and
//! `VmHWM` are read from `/proc/<pid>/status` once the instance cache holds every scale set
//! (1,000 VM LISTs seen by the emulator) and a few more passes have run.
//!
//! The binary is the one cargo built for this bench profile (`CARGO_BIN_EXE_...`, i.e.
//! target/release/vmss-capacity-controller under `cargo bench`), or `BENCH_DAEMON_BIN`.
//! `cargo bench --bench memory`; `BENCH_QUICK=1 cargo bench --bench memory` uses 200 scale sets.
//!
//! The second scenario (`memory/cluster.rs`) is the daemon with `demand: pods` watching a large
//! cluster: 5,000 nodes in 100 node groups and 50,000 pods shaped as a real API server returns
//! them (goal under 256 MiB). `BENCH_MEMORY_SCENARIO=scale-sets|cluster` runs one of them.

#[path = "common/mod.rs"]
mod common;

#[path = "memory/cluster.rs"]
mod cluster;

use common::{kind, quick, verdict};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed};

const SUB: &str = "00000000-0000-0000-0000-000000000000";
const RG: &str = "rg-memory";
const GOAL_MIB: f64 = 64.0;

fn daemon_bin() -> PathBuf {
    if let Ok(p) = std::env::var("BENCH_DAEMON_BIN") {
        return p.into();
    }
    if let Some(p) = option_env!("CARGO_BIN_EXE_vmss-capacity-controller") {
        return p.into();
    }
    // target/<profile>/deps/memory-<hash> → target/<profile>/vmss-capacity-controller
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("vmss-capacity-controller")
}

/// (VmRSS, VmHWM) in KiB.
fn rss(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Kill(Child);
impl Drop for Kill {
    /// SIGTERM first (the daemon shuts down cleanly, and a profiler wrapping it writes its
    /// report), SIGKILL after 20 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        for _ in 0..200 {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon under measurement (`run --config`), its resident memory sampled as it runs.
struct Daemon {
    child: Kill,
    started: Instant,
    /// The highest VmRSS sampled, in KiB.
    peak: u64,
}

impl Daemon {
    fn spawn(bin: &Path, cfg: &Path) -> Self {
        let child = Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(cfg)
            .env("ARM_CLIENT_SECRET", "bench-secret")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn daemon");
        Daemon {
            child: Kill(child),
            started: Instant::now(),
            peak: 0,
        }
    }

    /// Samples VmRSS every 250 ms until `done(rss in KiB)` says so; panics naming `what` after
    /// `patience`, or if the daemon exits.
    fn sample_until(&mut self, patience: Duration, what: &str, mut done: impl FnMut(u64) -> bool) {
        let deadline = self.started + patience;
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let Some((r, _)) = rss(self.child.0.id()) else {
                panic!(
                    "the daemon exited early (status {:?})",
                    self.child.0.try_wait()
                );
            };
            self.peak = self.peak.max(r);
            if done(r) {
                return;
            }
            assert!(Instant::now() < deadline, "{what} did not happen in time");
        }
    }

    /// The goal line: VmRSS now and VmHWM against `goal_mib`.
    fn report(&self, prefix: &str, goal_mib: f64) {
        let (now, hwm) = rss(self.child.0.id()).expect("daemon alive");
        println!(
            "{prefix}daemon VmRSS {:.1} MiB, VmHWM (peak) {:.1} MiB, sampled peak {:.1} MiB; goal under {goal_mib} MiB: RSS {}, peak {}",
            mib(now),
            mib(hwm),
            mib(self.peak),
            verdict(mib(now) < goal_mib),
            verdict(mib(hwm) < goal_mib)
        );
    }
}

fn main() {
    let quick = quick();
    let only = std::env::var("BENCH_MEMORY_SCENARIO").unwrap_or_default();
    if only.is_empty() || only == "scale-sets" {
        scale_sets(quick);
    }
    if only.is_empty() || only == "cluster" {
        cluster::run(quick, &daemon_bin());
    }
}

/// The daemon managing many scale sets (no Kubernetes).
fn scale_sets(quick: bool) {
    let n: usize = if quick { 200 } else { 1_000 };
    let per: i64 = 100;
    let bin = daemon_bin();
    println!(
        "== memory ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    println!("daemon binary: {}", bin.display());
    assert!(
        bin.exists(),
        "daemon binary not found; build it first (cargo build --release) or set BENCH_DAEMON_BIN"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let emulator = rt
        .block_on(EmulatorBuilder::new().start())
        .expect("emulator starts");
    let state = emulator.state();
    for i in 0..n {
        state.seed_scale_set(ScaleSetSeed::new(SUB, RG, &format!("ss-{i:04}"), per));
    }
    let base = emulator.base_url();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut yaml = format!(
        "azure:\n  resourceManagerEndpoint: {base}\n  authorityHost: {base}\n  tenantId: tenant\n  \
         subscriptionId: \"{SUB}\"\n  resourceGroup: {RG}\n  auth:\n    method: clientSecret\n    clientId: controller\n\
         enableVMSSEtag: true\nscanInterval: 2s\nvmssCacheTTL: 60s\ninstanceCacheTTL: 5m\n\
         metricsListen: 127.0.0.1:{metrics_port}\nnodeGroups:\n"
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{name: ss-{i:04}, minSize: 0, maxSize: 1000, desiredCapacity: {per}}}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, yaml).expect("write config");

    let mut daemon = Daemon::spawn(&bin, &cfg);
    let count = |k: &str| state.request_log().iter().filter(|r| kind(r) == k).count();
    let mut filled_at = None;
    daemon.sample_until(
        Duration::from_secs(if quick { 60 } else { 180 }),
        "filling the instance cache",
        |r| {
            let vm_lists = count("VM-LIST");
            if filled_at.is_none() && vm_lists >= n {
                filled_at = Some(Instant::now());
                println!(
                    "instance cache filled ({vm_lists} VM LISTs); RSS then {:.1} MiB",
                    mib(r)
                );
            }
            filled_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(8))
        },
    );
    println!(
        "{n} scale sets x {per} instances ({} VMs), after {:.1} s and >= 4 more passes (scanInterval 2 s): \
         LIST page requests {} (scale-set LIST, 100 per page), VM LISTs {}, PUTs {}",
        n as i64 * per,
        daemon.started.elapsed().as_secs_f64(),
        count("LIST"),
        count("VM-LIST"),
        count("PUT")
    );
    daemon.report("", GOAL_MIB);
    if quick {
        println!("(QUICK mode: {n} scale sets, not the 1,000 the goal names)");
    }
    drop(daemon);
    drop(emulator);
}
