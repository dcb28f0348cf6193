//! `demo`: the zero-setup showcase, like `vault server -dev`.
//!
//! It starts the built-in ARM emulator, seeds a handful of scale sets (one with a schedule
//! window that opens and closes during the run), lets a seeded rival writer (think Terraform or
//! the portal) change capacities and tags, and runs the real controller against it through the
//! real credential path (client secret exchanged at the emulator's token endpoint). It prints
//! live progress, then a summary: writes, 412s by outcome, foreign writes, ARM calls, and the
//! emulator's lost-update report. `--no-etag` runs the same scenario with blind writes.
//!
//! `--aks` runs it on the agent pools of one managed cluster instead: the rival writes pools
//! (their count and tags) and the cluster itself (a tag: under AKS's scoping rule that changes
//! every pool's ETag), and the summary says how many 412s followed a cluster-level write.

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
/// The managed cluster of `demo --aks`.
const CLUSTER: &str = "aks-demo";
/// AKS API version of the demo's own rival and seeding calls.
const AKS_API: &str = "2024-09-01";

/// Length of one window of the demo's load pattern.
const PATTERN_WINDOW: Duration = Duration::from_secs(5);

/// The demo's node groups. Demand moves like a load pattern: consecutive schedule windows of
/// [`PATTERN_WINDOW`] with different desired capacities, staggered per group, so writes happen
/// while the cache is older than the rival's last change (as in production, where demand moves
/// at any moment and the cache may be a minute old). One group holds only its bounds, one
/// limits its scale-down step.
fn node_groups(count: usize, run: Duration, aks: bool) -> Vec<NodeGroupSpec> {
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
            let letter = (b'a' + (i % 26) as u8) as char;
            // AKS pool names are lowercase letters and digits only.
            let name = if aks {
                format!("pool{letter}")
            } else {
                format!("pool-{letter}")
            };
            let offset = Duration::from_millis(1300 * i as u64);
            let kind = if aks {
                NodeGroupKind::AksAgentPool {
                    cluster: CLUSTER.into(),
                }
            } else {
                NodeGroupKind::Vmss
            };
            let mut g = NodeGroupSpec {
                name,
                kind,
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

    let groups = node_groups(args.scale_sets, args.duration, args.aks);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let arm_http = http_client(Duration::from_secs(10), None)?;
    let pools = PoolRival {
        http: arm_http,
        token: state.issue_token(RIVAL),
        base: base.clone(),
    };
    if args.aks {
        let profiles: Vec<serde_json::Value> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                serde_json::json!({"name": g.name, "count": rng.gen_range(1..=8),
                    "vmSize": "Standard_D4s_v5", "mode": if i == 0 { "System" } else { "User" },
                    "tags": {"team": "platform"}})
            })
            .collect();
        let seeder = PoolRival {
            token: state.issue_token("seeder"),
            ..pools.clone()
        };
        seeder
            .create_cluster(profiles)
            .await
            .context("creating the demo's managed cluster")?;
    } else {
        for g in &groups {
            let mut seed =
                ScaleSetSeed::new(SUBSCRIPTION, RESOURCE_GROUP, &g.name, rng.gen_range(1..=8));
            seed.tags = BTreeMap::from([("team".to_string(), "platform".to_string())]);
            state.seed_scale_set(seed);
        }
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
        kubernetes: Default::default(),
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
        "demo: ARM emulator at {base}, {} {}, rival writer every {:?}, ETag concurrency {} (runs {:?})",
        groups.len(),
        if args.aks { "agent pools of managed cluster aks-demo" } else { "scale sets" },
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
        Rival {
            state: state.clone(),
            pools: args.aks.then_some(pools),
        },
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

/// The demo's rival writer: in-process on scale sets, through the ARM API on agent pools.
struct Rival {
    state: EmulatorState,
    pools: Option<PoolRival>,
}

/// A careful rival on agent pools (read, then write with `If-Match`), as Terraform or the
/// portal would be, through the emulator's ARM API.
#[derive(Clone)]
struct PoolRival {
    http: reqwest::Client,
    token: String,
    base: String,
}

impl PoolRival {
    fn url(&self, tail: &str) -> String {
        format!(
            "{}/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.ContainerService/managedClusters/{CLUSTER}{tail}?api-version={AKS_API}",
            self.base
        )
    }

    async fn call(
        &self,
        method: reqwest::Method,
        tail: &str,
        body: Option<&serde_json::Value>,
        if_match: Option<&str>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let mut req = self
            .http
            .request(method, self.url(tail))
            .bearer_auth(&self.token);
        if let Some(e) = if_match {
            req = req.header("If-Match", e);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let rsp = req.send().await?;
        let status = rsp.status().as_u16();
        let bytes = rsp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        ))
    }

    async fn create_cluster(&self, profiles: Vec<serde_json::Value>) -> anyhow::Result<()> {
        let body = serde_json::json!({"location": "westeurope", "properties": {
            "kubernetesVersion": "1.30.6", "dnsPrefix": CLUSTER, "agentPoolProfiles": profiles}});
        let (status, answer) = self
            .call(reqwest::Method::PUT, "", Some(&body), None)
            .await?;
        anyhow::ensure!(status < 300, "cluster PUT answered {status}: {answer}");
        Ok(())
    }

    /// Read the pool, change its count or a tag, write it back under `If-Match`.
    async fn pool_write(&self, pool: &str, count: Option<i64>, tag: &str) -> anyhow::Result<bool> {
        let tail = format!("/agentPools/{pool}");
        let (status, mut v) = self.call(reqwest::Method::GET, &tail, None, None).await?;
        anyhow::ensure!(status == 200, "pool GET answered {status}");
        let etag = crate::azure::aks::pool_from_json(CLUSTER, v.clone(), None)
            .map_err(anyhow::Error::msg)?
            .etag;
        if let Some(props) = v.get_mut("properties").and_then(|p| p.as_object_mut()) {
            match count {
                Some(c) => {
                    props.insert("count".into(), c.into());
                }
                None => {
                    let tags = props.entry("tags").or_insert_with(|| serde_json::json!({}));
                    tags["rival-change"] = tag.into();
                }
            }
        }
        let (status, _) = self
            .call(reqwest::Method::PUT, &tail, Some(&v), etag.as_deref())
            .await?;
        Ok(status < 300)
    }

    /// A cluster-level write: a tag on the managed cluster (PATCH under `If-Match`).
    async fn cluster_write(&self, tag: &str) -> anyhow::Result<bool> {
        let (status, v) = self.call(reqwest::Method::GET, "", None, None).await?;
        anyhow::ensure!(status == 200, "cluster GET answered {status}");
        let etag = v
            .get("eTag")
            .or_else(|| v.get("etag"))
            .and_then(|e| e.as_str())
            .map(str::to_string);
        let body = serde_json::json!({"tags": {"rival-change": tag}});
        let (status, _) = self
            .call(reqwest::Method::PATCH, "", Some(&body), etag.as_deref())
            .await?;
        Ok(status < 300)
    }
}

async fn rival_writer(
    rival: Rival,
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
        let capacity = rng.gen_bool(0.6).then(|| rng.gen_range(0..=9));
        let ok = match &rival.pools {
            Some(pools) => {
                let cluster_level = rng.gen_bool(0.3);
                let written = if cluster_level {
                    pools.cluster_write(&n.to_string()).await
                } else {
                    pools.pool_write(&g.name, capacity, &n.to_string()).await
                };
                written.unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "rival write failed");
                    false
                })
            }
            None => match capacity {
                Some(c) => rival
                    .state
                    .rival_set_capacity(SUBSCRIPTION, RESOURCE_GROUP, &g.name, c, RIVAL)
                    .is_ok(),
                None => {
                    let tags = BTreeMap::from([("rival-change".to_string(), n.to_string())]);
                    rival
                        .state
                        .rival_set_tags(SUBSCRIPTION, RESOURCE_GROUP, &g.name, tags, RIVAL)
                        .is_ok()
                }
            },
        };
        if ok {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The capacity the emulator holds for node group `g` now.
fn capacity_of(state: &EmulatorState, g: &NodeGroupSpec) -> Option<i64> {
    match &g.kind {
        NodeGroupKind::Vmss => state
            .scale_set(SUBSCRIPTION, RESOURCE_GROUP, &g.name)
            .map(|v| v.capacity),
        NodeGroupKind::AksAgentPool { cluster } => {
            state.agent_pool_count(SUBSCRIPTION, RESOURCE_GROUP, cluster, &g.name)
        }
    }
}

/// The controller's 412s on pools, split by the rival write that last touched the pool before
/// each: `(after a cluster-level write, after a pool-level write)`.
fn conflicts_by_cause(state: &EmulatorState) -> (u64, u64) {
    // Per pool: whether the last rival write that moved its ETag was pool-level.
    let mut last_cause: std::collections::HashMap<String, bool> = Default::default();
    let mut cluster_wide = false;
    let (mut by_cluster, mut by_pool) = (0, 0);
    for r in state.request_log() {
        let path = r.path.to_ascii_lowercase();
        let pool = path.rsplit_once("/agentpools/").map(|(_, p)| p.to_string());
        let ok = (200..300).contains(&r.status);
        match r.writer.as_deref() {
            Some(RIVAL) if ok && r.method == "PATCH" && pool.is_none() => {
                // Every pool's ETag moved: forget the per-pool causes.
                last_cause.clear();
                cluster_wide = true;
            }
            Some(RIVAL) if ok && r.method == "PUT" => {
                if let Some(p) = pool {
                    last_cause.insert(p, true);
                }
            }
            Some(CLIENT_ID) if r.method == "PUT" && r.status == 412 => {
                let cluster = pool
                    .and_then(|p| last_cause.get(&p).copied())
                    .map(|pool_level| !pool_level)
                    .unwrap_or(cluster_wide);
                if cluster {
                    by_cluster += 1;
                } else {
                    by_pool += 1;
                }
            }
            _ => {}
        }
    }
    (by_cluster, by_pool)
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
        let cap = capacity_of(state, g)
            .map(|c| c.to_string())
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
        "summary ({}{}):",
        if args.no_etag {
            "blind writes, enableVMSSEtag=false"
        } else {
            "ETag concurrency, enableVMSSEtag=true"
        },
        if args.aks { ", AKS agent pools" } else { "" }
    );
    println!(
        "  {:<10} {:>8} {:>8} {:>7} {:>6} {:>8} {:>6}",
        if args.aks { "pool" } else { "scale set" },
        "capacity",
        "desired",
        "writes",
        "412s",
        "foreign",
        "lost"
    );
    let now = time::OffsetDateTime::now_utc();
    for g in groups {
        let n = g.name.as_str();
        let cap = capacity_of(state, g)
            .map(|c| c.to_string())
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
    if args.aks {
        let (by_cluster, by_pool) = conflicts_by_cause(state);
        println!(
            "  412s after a cluster write   {by_cluster}  (after a pool-level write {by_pool})"
        );
    }
    println!("  rival writes made            {rival}");
    let ops: &[&str] = if args.aks {
        &[
            "list_agent_pools",
            "get_agent_pool",
            "put_agent_pool",
            "get_managed_cluster",
            "list_instances",
            "poll_operation",
        ]
    } else {
        &[
            "list_scale_sets",
            "get_scale_set",
            "put_capacity",
            "list_instances",
            "poll_operation",
        ]
    };
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
