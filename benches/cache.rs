//! Scale-set cache: snapshot read cost and copy-on-write update cost at 100, 1,000 and 10,000
//! scale sets, against a plain `RwLock<HashMap<String, ScaleSet>>` (same Fx hasher) that clones the whole map per
//! read (what the seed PR's reviewer feared), in the same run. Goal: a read under 100 ns at
//! 10,000.
//!
//! Criterion's own report first, then a side-by-side summary measured interleaved (medians of
//! timed batches) with the ratio per size.
//! `cargo bench --bench cache` (full), `cargo bench --bench cache -- --quick` or
//! `BENCH_QUICK=1 cargo bench --bench cache` (CI-sized).

#[path = "common/mod.rs"]
mod common;

use common::{quick, verdict};
use criterion::{black_box, BenchmarkId, Criterion};
use parking_lot::RwLock;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use vmss_capacity_controller::cache::{ScaleSet, ScaleSetCache};

const SIZES: [usize; 3] = [100, 1_000, 10_000];

fn scale_set(i: usize) -> ScaleSet {
    ScaleSet {
        name: format!("aks-nodepool{i:05}-12345678-vmss"),
        location: "westeurope".into(),
        sku_name: Some("Standard_D4s_v5".into()),
        sku_tier: Some("Standard".into()),
        capacity: Some((i % 50) as i64),
        etag: Some(format!("\"{}\"", i + 1)),
        tags: BTreeMap::from([
            ("cluster-autoscaler-enabled".into(), "true".into()),
            ("cluster-autoscaler-name".into(), "prod-weu".into()),
            ("min".into(), "1".into()),
            ("max".into(), "100".into()),
        ]),
        provisioning_state: Some("Succeeded".into()),
        extended_location: None,
        agent_pool: None,
        vm_profile: Default::default(),
        zones: Vec::new(),
    }
}

struct Fixture {
    cow: ScaleSetCache,
    baseline: RwLock<HashMap<String, ScaleSet, rustc_hash::FxBuildHasher>>,
    plain: HashMap<String, ScaleSet, rustc_hash::FxBuildHasher>,
    names: Vec<String>,
}

fn fixture(n: usize) -> Fixture {
    let sets: Vec<ScaleSet> = (0..n).map(scale_set).collect();
    let names = sets.iter().map(|s| s.name.clone()).collect();
    let cow = ScaleSetCache::new();
    let now = tokio::time::Instant::now();
    cow.replace_all(sets.clone(), now);
    let plain: HashMap<String, ScaleSet, rustc_hash::FxBuildHasher> =
        sets.into_iter().map(|s| (s.name.clone(), s)).collect();
    let baseline = RwLock::new(plain.clone());
    Fixture {
        cow,
        baseline,
        plain,
        names,
    }
}

fn cow_snapshot_lookup(f: &Fixture, i: usize) -> Option<i64> {
    let snap = f.cow.snapshot();
    snap.get(&f.names[i % f.names.len()])
        .and_then(|e| e.scale_set.capacity)
}

fn cow_get(f: &Fixture, i: usize) -> Option<i64> {
    f.cow
        .get(&f.names[i % f.names.len()])
        .and_then(|e| e.scale_set.capacity)
}

/// The floor: a lock-free lookup in a plain `HashMap` (same Fx hasher as the cache) with the same key pattern (hashing the
/// name plus the cache misses of a random entry), no snapshot, no `Arc`.
fn plain_lookup(f: &Fixture, i: usize) -> Option<i64> {
    f.plain
        .get(&f.names[i % f.names.len()])
        .and_then(|s| s.capacity)
}

fn baseline_clone_read(f: &Fixture, i: usize) -> Option<i64> {
    let map = f.baseline.read().clone();
    map.get(&f.names[i % f.names.len()])
        .and_then(|s| s.capacity)
}

fn cow_upsert(f: &Fixture, i: usize) {
    let mut s = scale_set(i % f.names.len());
    s.capacity = Some(i as i64);
    f.cow.upsert(s, tokio::time::Instant::now());
}

fn baseline_insert(f: &Fixture, i: usize) {
    let mut s = scale_set(i % f.names.len());
    s.capacity = Some(i as i64);
    f.baseline.write().insert(s.name.clone(), s);
}

fn criterion_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("cache_read");
    for n in SIZES {
        let f = fixture(n);
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("cow_snapshot_lookup", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                black_box(cow_snapshot_lookup(&f, i))
            })
        });
        g.bench_with_input(BenchmarkId::new("cow_get", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                black_box(cow_get(&f, i))
            })
        });
        g.bench_with_input(BenchmarkId::new("rwlock_clone_on_read", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                black_box(baseline_clone_read(&f, i))
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("cache_update");
    for n in SIZES {
        let f = fixture(n);
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("cow_upsert", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                cow_upsert(&f, i)
            })
        });
        g.bench_with_input(BenchmarkId::new("rwlock_insert", n), &n, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                baseline_insert(&f, i)
            })
        });
    }
    g.finish();
}

/// Median ns per call of `op` over `batches` batches sized to take about `target` each.
fn median_ns(mut op: impl FnMut(usize), batches: usize, target: Duration) -> f64 {
    let mut per_batch = 1usize;
    loop {
        let t = Instant::now();
        for i in 0..per_batch {
            op(i);
        }
        if t.elapsed() >= target / 4 || per_batch >= 1 << 24 {
            break;
        }
        per_batch *= 2;
    }
    let mut samples: Vec<f64> = (0..batches)
        .map(|b| {
            let t = Instant::now();
            for i in 0..per_batch {
                op(b * per_batch + i);
            }
            t.elapsed().as_nanos() as f64 / per_batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn summary(quick: bool) {
    let (batches, target) = if quick {
        (5, Duration::from_millis(10))
    } else {
        (31, Duration::from_millis(40))
    };
    println!("\n== cache summary (medians of {batches} interleaved timed batches; ratios measured side by side) ==");
    println!(
        "{:>7} | {:>16} {:>10} {:>18} {:>12} | {:>12} {:>14} {:>9}",
        "size",
        "cow snap+lookup",
        "cow get",
        "rwlock clone-read",
        "clone/cow",
        "cow upsert",
        "rwlock insert",
        "up/ins"
    );
    let mut read_10k = f64::NAN;
    let mut floors = Vec::new();
    for n in SIZES {
        let f = fixture(n);
        let mut snap = Vec::new();
        let mut get = Vec::new();
        let mut clone = Vec::new();
        let mut up = Vec::new();
        let mut ins = Vec::new();
        let mut floor = Vec::new();
        let mut hot = Vec::new();
        // Interleave the variants so machine noise hits them alike.
        for _ in 0..3 {
            snap.push(median_ns(
                |i| {
                    black_box(cow_snapshot_lookup(&f, i.wrapping_mul(7919)));
                },
                batches,
                target,
            ));
            get.push(median_ns(
                |i| {
                    black_box(cow_get(&f, i.wrapping_mul(7919)));
                },
                batches,
                target,
            ));
            floor.push(median_ns(
                |i| {
                    black_box(plain_lookup(&f, i.wrapping_mul(7919)));
                },
                batches,
                target,
            ));
            hot.push(median_ns(
                |_| {
                    black_box(cow_snapshot_lookup(&f, black_box(0)));
                },
                batches,
                target,
            ));
            clone.push(median_ns(
                |i| {
                    black_box(baseline_clone_read(&f, i.wrapping_mul(7919)));
                },
                batches.min(11),
                target,
            ));
            up.push(median_ns(
                |i| cow_upsert(&f, i.wrapping_mul(7919)),
                batches.min(11),
                target,
            ));
            ins.push(median_ns(
                |i| baseline_insert(&f, i.wrapping_mul(7919)),
                batches,
                target,
            ));
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (s, g, c, u, w) = (
            med(&mut snap),
            med(&mut get),
            med(&mut clone),
            med(&mut up),
            med(&mut ins),
        );
        let (fl, ht) = (med(&mut floor), med(&mut hot));
        floors.push((n, fl, ht, s));
        if n == 10_000 {
            read_10k = s.max(g);
        }
        println!(
            "{n:>7} | {:>13.1} ns {:>7.1} ns {:>15.0} ns {:>11.0}x | {:>9.0} ns {:>11.0} ns {:>8.1}x",
            s,
            g,
            c,
            c / s,
            u,
            w,
            u / w
        );
    }
    println!("decomposition of a read (same random-key pattern unless noted):");
    for (n, fl, ht, s) in &floors {
        println!(
            "{n:>7} | plain FxHashMap get, no lock/Arc (floor) {fl:>6.1} ns | cow snap+lookup {s:>6.1} ns (floor + {:>5.1} ns) | cow snap+lookup of one hot key {ht:>5.1} ns",
            s - fl
        );
    }
    println!(
        "goal: a read under 100 ns at 10,000 scale sets: {read_10k:.1} ns (slower of snapshot+lookup and get) {}",
        verdict(read_10k < 100.0)
    );
    println!(
        "note: upsert is copy-on-write (clones the map of Arc entries, O(n)); it runs once per own write or 412 GET, \
         never on the read path; a full resync (replace_all) builds a new map once per vmssCacheTTL."
    );
}

fn main() {
    let quick = quick();
    let mut c = Criterion::default().configure_from_args();
    if quick {
        c = c
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(200))
            .sample_size(10);
    }
    criterion_benches(&mut c);
    c.final_summary();
    summary(quick);
}
