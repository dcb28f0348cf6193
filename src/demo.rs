//! `demo`: the zero-setup showcase, like `vault server -dev`.
//!
//! It starts the built-in ARM emulator, seeds a handful of scale sets (one with a schedule
//! window that opens and closes during the run), lets a seeded rival writer (think Terraform or
//! the portal) change capacities and tags, and runs the real controller against it through the
//! real credential path (client secret exchanged at the emulator's token endpoint). It prints
//! live progress, then a summary: writes, 412s by outcome, foreign writes, ARM calls, and the
//! emulator's lost-update report. `--no-etag` runs the same scenario with blind writes.

use crate::azure::arm::{http_client, ArmTarget};
use crate::azure::{credentials, ArmClient};
use crate::cli::{DemoArgs, ExitCode};
use crate::config::{
    AuthSettings, AzureSettings, ConflictStrategy, NodeGroupKind, NodeGroupSpec, Schedule,
    SecretSource, Settings, WriteBudget,
};
use crate::emulator::{EmulatorBuilder, EmulatorState, ScaleSetSeed};
use crate::metrics::Metrics;
use crate::reconciler::Reconciler;
use anyhow::Context;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const SUBSCRIPTION: &str = "00000000-0000-0000-0000-000000000000";
const RESOURCE_GROUP: &str = "rg-demo";
const TENANT: &str = "demo-tenant";
const CLIENT_ID: &str = "vmss-capacity-controller";
const RIVAL: &str = "terraform-rival";

/// Length of one window of the demo's load pattern.
const PATTERN_WINDOW: Duration = Duration::from_secs(5);

/// The demo's node groups. Demand moves like a load pattern: consecutive schedule windows of
/// [`PATTERN_WINDOW`] with different desired capacities, staggered per group, so writes happen
/// while the cache is older than the rival's last change (as in production, where demand moves
/// at any moment and the cache may be a minute old). One group holds only its bounds, one
/// limits its scale-down step.
fn node_groups(count: usize, run: Duration) -> Vec<NodeGroupSpec> {
    let now = time::OffsetDateTime::now_utc();
    let secs_of_day = |t: time::OffsetDateTime| {
        u32::from(t.hour()) * 3600 + u32::from(t.minute()) * 60 + u32::from(t.second())
    };
    let windows = (run.as_secs() / PATTERN_WINDOW.as_secs()).max(1) + 1;
    let pattern = |offset: Duration, values: &[u32]| -> Vec<Schedule> {
        (0..windows)
            .map(|k| {
                let start = now + offset + PATTERN_WINDOW * k as u32;
                Schedule {
                    start_secs: secs_of_day(start),
                    end_secs: secs_of_day(start + PATTERN_WINDOW),
                    days: vec![],
                    desired_capacity: values[k as usize % values.len()],
                }
            })
            .collect()
    };
    (0..count.max(1))
        .map(|i| {
            let name = format!("pool-{}", (b'a' + (i % 26) as u8) as char);
            let offset = Duration::from_millis(1300 * i as u64);
            let mut g = NodeGroupSpec {
                name,
                kind: NodeGroupKind::Vmss,
                resource_group: None,
                min_size: 1,
                max_size: 10,
                desired_capacity: Some(3),
                schedules: vec![],
                max_scale_down_step: None,
            };
            match i % 4 {
                0 => g.schedules = pattern(offset, &[3, 5, 4, 6]),
                1 => {
                    g.desired_capacity = Some(2);
                    g.schedules = pattern(offset, &[2, 6]);
                }
                2 => {
                    g.desired_capacity = None;
                    g.min_size = 2;
                    g.max_size = 6;
                }
                _ => {
                    g.desired_capacity = Some(4);
                    g.max_scale_down_step = Some(2);
                    g.schedules = pattern(offset, &[4, 8, 5]);
                }
            }
            g
        })
        .collect()
}

/// `demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let emulator = EmulatorBuilder::new()
        .lro_delay(Duration::from_millis(800))
        .start()
        .await
        .context("starting the built-in ARM emulator")?;
    let state = emulator.state();
    let base = emulator.base_url();
    let secret_dir = tempfile_dir()?;
    let secret_file = secret_dir.join("client-secret");
    let secret = format!("demo-{}", uuid::Uuid::new_v4());
    std::fs::write(&secret_file, &secret).context("writing the demo client secret")?;
    state.register_client(CLIENT_ID, &secret);

    let groups = node_groups(args.scale_sets, args.duration);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    for g in &groups {
        let mut seed =
            ScaleSetSeed::new(SUBSCRIPTION, RESOURCE_GROUP, &g.name, rng.gen_range(1..=8));
        seed.tags = BTreeMap::from([("team".to_string(), "platform".to_string())]);
        state.seed_scale_set(seed);
    }

    let endpoint = url::Url::parse(&base).context("emulator URL")?;
    let settings = Arc::new(Settings {
        azure: AzureSettings {
            resource_manager_endpoint: endpoint.clone(),
            authority_host: endpoint.clone(),
            imds_endpoint: endpoint.clone(),
            tenant_id: TENANT.into(),
            subscription_id: SUBSCRIPTION.into(),
            resource_group: RESOURCE_GROUP.into(),
            auth: AuthSettings::ClientSecret {
                client_id: CLIENT_ID.into(),
                secret: SecretSource::File(secret_file.clone()),
            },
            ca_bundle_file: None,
        },
        enable_vmss_etag: !args.no_etag,
        conflict_strategy: ConflictStrategy::Replan,
        scan_interval: Duration::from_secs(1),
        vmss_cache_ttl: Duration::from_secs(10),
        instance_cache_ttl: Duration::from_secs(30),
        instance_cache_jitter: Duration::from_secs(5),
        metrics_listen: None,
        max_concurrent_writes: 4,
        // Generous for a fast demo; production keeps Azure's 4/min, burst 12.
        write_budget: WriteBudget {
            per_minute: 120.0,
            burst: 20,
        },
        shutdown_grace: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        quota_cooldown: Duration::from_secs(30),
        node_groups: groups.clone(),
        auto_discovery: None,
    });
    let metrics = Arc::new(Metrics::new());
    let http = http_client(settings.request_timeout, None)?;
    let credential = credentials::build_credential(&settings.azure, http.clone(), None)
        .context("demo credential")?;
    let target = ArmTarget {
        endpoint,
        subscription: SUBSCRIPTION.into(),
        resource_group: RESOURCE_GROUP.into(),
    };
    let arm = Arc::new(ArmClient::new(target, credential, http, metrics.clone()));
    let reconciler = Arc::new(Reconciler::builder(settings.clone(), arm, metrics.clone()).build());

    println!(
        "demo: ARM emulator at {base}, {} scale sets, rival writer every {:?}, ETag concurrency {} (runs {:?})",
        groups.len(),
        args.rival_interval,
        if args.no_etag { "OFF: blind writes" } else { "ON: If-Match on every write" },
        args.duration
    );

    let stop = CancellationToken::new();
    let controller = {
        let (r, s) = (reconciler.clone(), stop.clone());
        tokio::spawn(async move { r.run(s).await })
    };
    let rival_writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let rival = tokio::spawn(rival_writer(
        state.clone(),
        groups.clone(),
        args.rival_interval,
        args.seed,
        rival_writes.clone(),
        stop.clone(),
    ));

    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    while started.elapsed() < args.duration {
        tick.tick().await;
        if !args.quiet {
            progress_line(
                started.elapsed(),
                &metrics,
                &state,
                &groups,
                rival_writes.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
    }
    // The rival stops first, so the last passes show convergence.
    stop.cancel();
    let _ = rival.await;
    let _ = controller.await;
    // Settle: re-read everything once the rival is quiet and let the plan converge.
    reconciler.scale_sets().invalidate_all();
    for _ in 0..3 {
        let _ = reconciler.run_once().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    summary(
        &args,
        &metrics,
        &state,
        &groups,
        rival_writes.load(std::sync::atomic::Ordering::Relaxed),
    );
    let _ = std::fs::remove_dir_all(&secret_dir);
    Ok(ExitCode(0))
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("vmss-demo-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

async fn rival_writer(
    state: EmulatorState,
    groups: Vec<NodeGroupSpec>,
    every: Duration,
    seed: u64,
    count: Arc<std::sync::atomic::AtomicU64>,
    stop: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(1));
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let g = &groups[rng.gen_range(0..groups.len())];
        n += 1;
        let ok = if rng.gen_bool(0.6) {
            state
                .rival_set_capacity(
                    SUBSCRIPTION,
                    RESOURCE_GROUP,
                    &g.name,
                    rng.gen_range(0..=9),
                    RIVAL,
                )
                .is_ok()
        } else {
            let tags = BTreeMap::from([("rival-change".to_string(), n.to_string())]);
            state
                .rival_set_tags(SUBSCRIPTION, RESOURCE_GROUP, &g.name, tags, RIVAL)
                .is_ok()
        };
        if ok {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn progress_line(
    elapsed: Duration,
    m: &Metrics,
    state: &EmulatorState,
    groups: &[NodeGroupSpec],
    rival: u64,
) {
    let sum = |c: &prometheus::IntCounterVec, l: &[(&str, &str)]| Metrics::counter_sum(c, l);
    let mut line = format!(
        "[{:>3}s] writes {:>3}  412s {:>3}  foreign {:>3}  rival {:>3}  lost {:>2} |",
        elapsed.as_secs(),
        sum(&m.capacity_writes_total, &[("result", "ok")]),
        sum(
            &m.capacity_writes_total,
            &[("result", "precondition_failed")]
        ),
        sum(&m.foreign_writes_total, &[]),
        rival,
        state.lost_updates().len(),
    );
    let now = time::OffsetDateTime::now_utc();
    for g in groups {
        let cap = state
            .scale_set(SUBSCRIPTION, RESOURCE_GROUP, &g.name)
            .map(|v| v.capacity.to_string())
            .unwrap_or_else(|| "-".into());
        let want = crate::planner::desired_capacity(g, &crate::planner::ConfiguredDemand, now)
            .map(|d| d.to_string())
            .unwrap_or_else(|| format!("{}..{}", g.min_size, g.max_size));
        line.push_str(&format!(" {} {}/{}", g.name, cap, want));
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn summary(
    args: &DemoArgs,
    m: &Metrics,
    state: &EmulatorState,
    groups: &[NodeGroupSpec],
    rival: u64,
) {
    let sum = |c: &prometheus::IntCounterVec, l: &[(&str, &str)]| Metrics::counter_sum(c, l);
    let lost = state.lost_updates();
    println!();
    println!(
        "summary ({}):",
        if args.no_etag {
            "blind writes, enableVMSSEtag=false"
        } else {
            "ETag concurrency, enableVMSSEtag=true"
        }
    );
    println!(
        "  {:<10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6}",
        "scale set", "capacity", "desired", "writes", "412s", "foreign", "lost"
    );
    let now = time::OffsetDateTime::now_utc();
    for g in groups {
        let n = g.name.as_str();
        let cap = state
            .scale_set(SUBSCRIPTION, RESOURCE_GROUP, n)
            .map(|v| v.capacity.to_string())
            .unwrap_or_else(|| "-".into());
        let want = crate::planner::desired_capacity(g, &crate::planner::ConfiguredDemand, now)
            .map(|d| d.to_string())
            .unwrap_or_else(|| format!("{}..{}", g.min_size, g.max_size));
        println!(
            "  {:<10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6}",
            n,
            cap,
            want,
            sum(
                &m.capacity_writes_total,
                &[("scale_set", n), ("result", "ok")]
            ),
            sum(
                &m.capacity_writes_total,
                &[("scale_set", n), ("result", "precondition_failed")]
            ),
            sum(&m.foreign_writes_total, &[("scale_set", n)]),
            lost.iter()
                .filter(|l| l.resource.ends_with(&format!("/{n}")))
                .count(),
        );
    }
    println!();
    println!(
        "  capacity writes accepted     {}",
        sum(&m.capacity_writes_total, &[("result", "ok")])
    );
    println!(
        "  412 Precondition Failed      {}  (skipped {}, retried_ok {}, gave_up {}, gone {})",
        sum(
            &m.capacity_writes_total,
            &[("result", "precondition_failed")]
        ),
        sum(&m.etag_conflicts_total, &[("outcome", "skipped")]),
        sum(&m.etag_conflicts_total, &[("outcome", "retried_ok")]),
        sum(&m.etag_conflicts_total, &[("outcome", "gave_up")]),
        sum(&m.etag_conflicts_total, &[("outcome", "gone")]),
    );
    println!(
        "  foreign writes detected      {}",
        sum(&m.foreign_writes_total, &[])
    );
    println!("  rival writes made            {rival}");
    let ops = [
        "list_scale_sets",
        "get_scale_set",
        "put_capacity",
        "list_instances",
        "poll_operation",
    ];
    let calls: Vec<String> = ops
        .iter()
        .map(|op| format!("{op} {}", sum(&m.arm_requests_total, &[("operation", op)])))
        .collect();
    println!("  ARM calls                    {}", calls.join(", "));
    println!("  lost updates (emulator)      {}", lost.len());
    for l in lost.iter().take(5) {
        println!(
            "    - {} overwrote {} ({}) by {} on {}",
            l.writer, l.replaced_etag, l.replaced_change, l.replaced_writer, l.resource
        );
    }
    if lost.len() > 5 {
        println!("    ... and {} more", lost.len() - 5);
    }
    if args.no_etag {
        println!("\nWith blind writes the controller overwrote changes it had never seen. Run without --no-etag: the same scenario loses nothing.");
    } else if lost.is_empty() {
        println!("\nNo update was lost: every write carried If-Match, and each 412 made the controller re-read and re-plan. Try --no-etag.");
    }
}
