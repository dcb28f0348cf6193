//! Conditional PUTs per second against the emulator on loopback, with several concurrent clients.
//!
//! `cargo bench --bench emulator` (about 15 s) or `cargo bench --bench emulator -- --quick`
//! (a few seconds). Prints `emulator conditional PUTs/s: N` before criterion's own report.

use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use serde_json::json;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle, ScaleSetSeed};

const SUB: &str = "00000000-0000-0000-0000-0000000000be";
const RG: &str = "rg-bench";
const CLIENTS: usize = 8;

struct Rig {
    handle: EmulatorHandle,
    clients: Vec<(reqwest::Client, String, String)>,
    token: String,
}

async fn rig() -> Rig {
    let handle = EmulatorBuilder::new()
        .start()
        .await
        .expect("emulator starts");
    let state = handle.state();
    let token = state.issue_token("bench");
    let clients = (0..CLIENTS)
        .map(|i| {
            let name = format!("vmss-{i}");
            let etag = state.seed_scale_set(ScaleSetSeed::new(SUB, RG, &name, 1));
            let url = format!(
                "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}?api-version=2024-07-01",
                handle.base_url()
            );
            (reqwest::Client::new(), url, etag)
        })
        .collect();
    Rig {
        handle,
        clients,
        token,
    }
}

/// Runs `total` conditional PUTs spread over the clients; each follows its own ETag chain.
async fn run(rig: &mut Rig, total: u64) -> Duration {
    let per_client = total.div_ceil(CLIENTS as u64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (client, url, etag) in rig.clients.iter() {
        let (client, url, mut etag, token) =
            (client.clone(), url.clone(), etag.clone(), rig.token.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..per_client {
                let resp = client
                    .put(&url)
                    .bearer_auth(&token)
                    .header("If-Match", &etag)
                    .json(&json!({"location": "westeurope", "sku": {"name": "Standard_D2s_v5", "capacity": (i % 10) as i64}}))
                    .send()
                    .await
                    .expect("PUT answered");
                assert_eq!(resp.status().as_u16(), 200, "conditional PUT accepted");
                etag = resp.headers()["etag"].to_str().unwrap().to_string();
                let _ = resp.bytes().await;
            }
            etag
        }));
    }
    for (slot, task) in rig.clients.iter_mut().zip(tasks) {
        slot.2 = task.await.expect("client task");
    }
    start.elapsed()
}

/// The same load shape against `/_emulator/healthz`: the transport's (hyper + reqwest on
/// loopback) ceiling on this machine, to tell the emulator's own cost from the HTTP stack's.
async fn run_baseline(rig: &Rig, total: u64) -> Duration {
    let url = format!("{}/_emulator/healthz", rig.handle.base_url());
    run_gets(rig, total, move |_| url.clone()).await
}

/// Authenticated GETs of each client's scale set: the ARM read path.
async fn run_reads(rig: &Rig, total: u64) -> Duration {
    run_gets(rig, total, |vmss_url: &str| vmss_url.to_string()).await
}

async fn run_gets(rig: &Rig, total: u64, url_for: impl Fn(&str) -> String) -> Duration {
    let per_client = total.div_ceil(CLIENTS as u64);
    let start = Instant::now();
    let tasks: Vec<_> = rig
        .clients
        .iter()
        .map(|(client, vmss_url, _)| {
            let (client, url, token) = (client.clone(), url_for(vmss_url), rig.token.clone());
            tokio::spawn(async move {
                for _ in 0..per_client {
                    let resp = client
                        .get(&url)
                        .bearer_auth(&token)
                        .send()
                        .await
                        .expect("GET answered");
                    assert_eq!(resp.status().as_u16(), 200);
                    let _ = resp.bytes().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client task");
    }
    start.elapsed()
}

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

fn conditional_puts(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rig = rt.block_on(rig());

    // The headline figure: a fixed batch, timed once after a warm-up.
    let batch = if quick() { 4_000 } else { 40_000 };
    rt.block_on(run(&mut rig, 1_000));
    let elapsed = rt.block_on(run(&mut rig, batch));
    let per_sec = batch as f64 / elapsed.as_secs_f64();
    println!(
        "emulator conditional PUTs/s: {per_sec:.0} ({batch} PUTs, {CLIENTS} concurrent clients, {:.2} s)",
        elapsed.as_secs_f64()
    );
    assert!(rig.handle.state().lost_updates().is_empty());
    let reads = rt.block_on(run_reads(&rig, batch));
    println!(
        "emulator scale-set GETs/s: {:.0}",
        batch as f64 / reads.as_secs_f64()
    );
    let base = rt.block_on(run_baseline(&rig, batch));
    println!(
        "loopback baseline (GET /_emulator/healthz) requests/s: {:.0}",
        batch as f64 / base.as_secs_f64()
    );

    let mut group = c.benchmark_group("emulator");
    group.throughput(criterion::Throughput::Elements(1));
    group.bench_function("conditional_put", |b| {
        b.iter_custom(|iters| rt.block_on(run(&mut rig, iters)))
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = conditional_puts
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
