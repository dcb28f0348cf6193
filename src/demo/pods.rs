//! The default `demo` (twice: ETags on, then blind writes; `--pods` once): pod-driven demand on
//! a simulated cluster. The emulator turns every VM
//! instance into a Node (Ready after a boot delay) and runs a small scheduler of its own (not
//! the controller's fit code); ReplicaSets create the pods. Three node groups start (nearly)
//! empty: `general`, `memory` (nodes labelled `workload=memory`) and a tainted `gpu` group that
//! scales from zero. A burst of pods, a second burst, then a shrink, while a rival writer keeps
//! changing the scale sets. One controller, wired as `run` wires it, with `demand: pods`.
//!
//! After the shrink, scale-down removes the nodes nobody needs: taint, re-check, drain through
//! evictions (the `web` pods are under a PodDisruptionBudget, `maxUnavailable: 1`), delete exactly
//! that instance. Everything runs in real time, with cluster-autoscaler's scale-down waits
//! shortened so a one-minute demo shows them ([`DEMO_UNNEEDED_TIME`] instead of 10 min,
//! [`DEMO_DELAY_AFTER_ADD`] instead of 10 min, [`DEMO_DELAY_AFTER_TAINT`] instead of 5 s); the
//! summary says so.

use super::*;
use crate::emulator::kube::KubeState;
use crate::emulator::sim::{PodTemplate, SimSettings};
use crate::pods::quantity;
use serde_json::Value;
use std::collections::HashMap;

/// A new instance's Node turns Ready this long after it appeared.
const BOOT_DELAY: Duration = Duration::from_secs(3);
/// `scaleDown.unneededTime` in the demo (cluster-autoscaler: 10 min).
pub const DEMO_UNNEEDED_TIME: Duration = Duration::from_secs(3);
/// `scaleDown.delayAfterAdd` in the demo (cluster-autoscaler: 10 min).
pub const DEMO_DELAY_AFTER_ADD: Duration = Duration::from_secs(4);
/// `scaleDown.nodeDeleteDelayAfterTaint` in the demo (cluster-autoscaler: 5 s).
pub const DEMO_DELAY_AFTER_TAINT: Duration = Duration::from_secs(1);
/// How often the demo looks at the cluster.
const SAMPLE: Duration = Duration::from_millis(200);
const NS: &str = "default";
const GPU_TAINT_TAG: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";
const LABEL_TAG: &str = "k8s.io_cluster-autoscaler_node-template_label_workload";

/// What the demo measured.
#[derive(Debug, Clone, Default)]
pub struct PodsReport {
    /// Pods seen pending at some point.
    pub pods: usize,
    /// Of those, scheduled by the end.
    pub scheduled: usize,
    /// Seconds from first seen pending to first seen bound: p50, p99, max.
    pub wait_p50: f64,
    /// p99.
    pub wait_p99: f64,
    /// Max.
    pub wait_max: f64,
    /// Node-minutes the groups' Ready nodes ran.
    pub node_minutes: f64,
    /// Node-minutes a perfect packer would have needed for the pods running (a lower bound).
    pub node_minutes_needed: f64,
    /// Capacity writes the controller sent, by group.
    pub writes: BTreeMap<String, u64>,
    /// 412 answers the controller met.
    pub conflicts: u64,
    /// Rival writes that succeeded.
    pub rival_writes: u64,
    /// Lost updates the emulator detected.
    pub lost_updates: usize,
    /// Pods that went down with a node (not evicted through the API).
    pub pods_lost_with_nodes: usize,
    /// GPU nodes' pods that do not tolerate the GPU taint (must be 0).
    pub misplaced_on_gpu: usize,
    /// Nodes scale-down removed (instance deleted, confirmed by Azure).
    pub nodes_removed: u64,
    /// Evictions the API admitted.
    pub evictions: u64,
    /// Evictions a PodDisruptionBudget refused (429; retried).
    pub evictions_refused: u64,
    /// Pods under the demo's PodDisruptionBudget (`web`) that left a node without an admitted
    /// eviction (must be 0).
    pub pdb_violations: usize,
    /// Ready nodes at the end, by group.
    pub nodes_at_end: BTreeMap<String, usize>,
    /// Nodes the pods at the end need at least, by group.
    pub nodes_needed_at_end: BTreeMap<String, usize>,
    /// The zone-spread workload's running pods by zone, when most of them ran (after the
    /// second burst; the shrink that follows leaves whatever the ReplicaSet's deletions and
    /// scale-down leave, as on a real cluster).
    pub spread_per_zone: BTreeMap<String, usize>,
    /// The largest zone skew a bind of the spread workload made (the audit; maxSkew is 1).
    pub max_skew_at_bind: i64,
    /// Binds the audit found breaking a spread constraint or a volume's zone (must be 0).
    pub placement_violations: usize,
    /// The audit missed part of the change stream (must be false).
    pub audit_incomplete: bool,
    /// Pods left pending at the end, by the scheduler's message.
    pub pending_at_end: BTreeMap<String, usize>,
}

fn groups() -> Vec<NodeGroupSpec> {
    let g = |name: &str, min: u32, max: u32| NodeGroupSpec {
        name: name.into(),
        kind: crate::config::NodeGroupKind::Vmss,
        resource_group: None,
        min_size: min,
        max_size: max,
        desired_capacity: None,
        schedules: Vec::new(),
        max_scale_down_step: None,
    };
    vec![
        g("general", 1, 20),
        g("memory", 0, 8),
        g("gpu", 0, 4),
        g("zone1", 0, 6),
        g("zone2", 0, 6),
        g("zone3", 0, 6),
    ]
}

/// The spread workload's constraint: one zone at most one pod ahead of another.
const SPREAD_MAX_SKEW: u32 = 1;

/// The default demo: the pod-driven scenario twice on one seed, ETags on, then blind writes.
#[derive(Debug, Clone)]
pub struct AbReport {
    /// The arm with `If-Match` on every write.
    pub with_etags: PodsReport,
    /// The arm with blind writes.
    pub blind: PodsReport,
}

/// `demo` (no showcase flag): the A/B, with the two arms side by side at the end.
pub async fn compare(args: &DemoArgs) -> anyhow::Result<AbReport> {
    println!(
        "demo: pod-driven autoscaling on a simulated cluster, run twice on seed {} ({:?} each): ETags on, then blind writes",
        args.seed, args.duration
    );
    let mut arm = args.clone();
    arm.no_etag = false;
    println!("\n== arm 1 of 2: {} ==", etag_mode(&arm));
    let (with_etags, on) = scenario(&arm, "ETags on: If-Match on every write").await?;
    arm.no_etag = true;
    println!("\n== arm 2 of 2: {} ==", etag_mode(&arm));
    let (blind, off) = scenario(&arm, "Blind writes: no If-Match").await?;
    let ab = AbReport { with_etags, blind };
    print_comparison(&ab);
    if let Some(path) = &args.report {
        let table = report::Table {
            header: ["", "ETags on", "blind writes"].map(String::from).to_vec(),
            rows: figures(&ab.with_etags)
                .into_iter()
                .zip(figures(&ab.blind))
                .map(|((label, on), (_, off))| vec![label.to_string(), on, off])
                .collect(),
        };
        let written = report::write(
            path,
            &report::Report {
                lines: Vec::new(),
                title: "vmss-capacity-controller demo: pod-driven scaling, ETags on and off".into(),
                intro: intro(
                    args,
                    "The same seeded scenario ran twice, with ETags and with blind writes.",
                ),
                timelines: vec![on, off],
                table,
                preformatted: None,
                notes: vec![conclusion(&ab)],
            },
        );
        match written {
            // The default report is a courtesy: a directory that cannot take it does not undo
            // the demo that ran.
            Err(e) if args.report_defaulted => {
                eprintln!("warning: the report was not written: {e:#} (give --report FILE to choose where)")
            }
            other => other?,
        }
    }
    Ok(ab)
}

/// What the report says before its charts.
fn intro(args: &DemoArgs, runs: &str) -> Vec<String> {
    vec![
        format!(
            "The built-in emulator ran a simulated cluster (a Node per VM instance, Ready {BOOT_DELAY:?} after it appears) and six scale sets: general (Standard_D4s_v5, 1..20), memory (Standard_E8s_v5, 0..8), gpu (Standard_NC6s_v3, tainted, 0..4) and zone1..zone3 (Standard_D4s_v5, one availability zone each, 0..6, balanced). Pods came in two bursts, a zone-spread workload and pods with zonal disks among them, then the web, cache and spread ReplicaSets shrank, while a rival changed the scale sets every {:?} (seed {}). {runs}",
            args.rival_interval, args.seed
        ),
        format!("Each chart shows what Azure and the cluster held, sampled every {:?}, and below it every write as the emulator saw it: the rival's, the controller's, the controller's writes refused with 412 Precondition Failed, and the writes that replaced a version their writer had never read (lost updates).", report::SAMPLE),
    ]
}

/// `demo --pods`: the scenario once, with its summary.
pub async fn run(args: &DemoArgs) -> anyhow::Result<PodsReport> {
    let (r, timeline) = scenario(args, etag_mode(args)).await?;
    print_report(args, &r);
    if let Some(path) = &args.report {
        report::write(
            path,
            &report::Report {
                lines: Vec::new(),
                title: "vmss-capacity-controller demo: pod-driven scaling".into(),
                intro: intro(args, &format!("ETag concurrency {}.", etag_mode(args))),
                timelines: vec![timeline],
                table: report::Table {
                    header: vec![String::new(), etag_mode(args).to_string()],
                    rows: figures(&r)
                        .into_iter()
                        .map(|(label, v)| vec![label.to_string(), v])
                        .collect(),
                },
                preformatted: None,
                notes: Vec::new(),
            },
        )?;
    }
    Ok(r)
}

/// The scenario: emulator, simulated cluster, controller, rival, workload; what it measured, and
/// its timeline.
async fn scenario(args: &DemoArgs, title: &str) -> anyhow::Result<(PodsReport, report::Timeline)> {
    let emulator = EmulatorBuilder::new()
        .lro_delay(Duration::from_millis(800))
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: BOOT_DELAY,
            tick: Duration::from_millis(100),
        })
        .start()
        .await
        .context("starting the built-in emulator")?;
    let state = emulator.state();
    let kube = emulator
        .kube()
        .context("the emulator's Kubernetes side is off")?;
    let groups = groups();
    for (name, size, capacity, tags, zone) in [
        ("general", "Standard_D4s_v5", 1, vec![], None),
        (
            "memory",
            "Standard_E8s_v5",
            0,
            vec![(LABEL_TAG, "memory")],
            None,
        ),
        (
            "gpu",
            "Standard_NC6s_v3",
            0,
            vec![(GPU_TAINT_TAG, "gpu:NoSchedule")],
            None,
        ),
        (
            "zone1",
            "Standard_D4s_v5",
            0,
            vec![(LABEL_TAG, "zonal")],
            Some("1"),
        ),
        (
            "zone2",
            "Standard_D4s_v5",
            0,
            vec![(LABEL_TAG, "zonal")],
            Some("2"),
        ),
        (
            "zone3",
            "Standard_D4s_v5",
            0,
            vec![(LABEL_TAG, "zonal")],
            Some("3"),
        ),
    ] {
        let mut seed = ScaleSetSeed::new(SUBSCRIPTION, RESOURCE_GROUP, name, capacity);
        seed.sku_name = size.into();
        seed.zones = zone.map(|z| vec![z.to_string()]).unwrap_or_default();
        seed.tags = tags
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("team".to_string(), "platform".to_string())])
            .collect();
        state.seed_scale_set(seed);
    }
    let stage = Stage::around(emulator, groups.clone())?;
    let secret = stage.register(CLIENT_ID)?;
    let mut settings = stage.settings(args, CLIENT_ID, secret, stage.one_replica_kubernetes()?)?;
    settings.pod_demand.kind = crate::config::DemandKind::Pods;
    // The three zonal groups are alike: grown evenly, as cluster-autoscaler's flag does.
    settings.pod_demand.balance_similar_node_groups = true;
    // Writes come when a batch of pending pods closes; the scan re-checks and runs scale-down.
    settings.scan_interval = Duration::from_secs(1);
    settings.scale_down = crate::config::ScaleDownSettings {
        enabled: true,
        unneeded_time: DEMO_UNNEEDED_TIME,
        delay_after_add: DEMO_DELAY_AFTER_ADD,
        node_delete_delay_after_taint: DEMO_DELAY_AFTER_TAINT,
        max_pod_eviction_time: Duration::from_secs(20),
        ..Default::default()
    };
    let metrics = Arc::new(Metrics::new());
    let replica = Replica::build(
        Arc::new(settings),
        metrics.clone(),
        ReplicaOptions {
            dry_run: false,
            identity: Some("controller".into()),
        },
    )
    .await
    .context("wiring the controller")?;
    println!(
        "demo: ARM emulator and a simulated cluster at {} (instances become Nodes, Ready {BOOT_DELAY:?} after they appear; the emulator's own scheduler binds pods)",
        stage.base
    );
    println!(
        "      node groups general (Standard_D4s_v5, 1..20), memory (Standard_E8s_v5, label workload=memory, 0..8), gpu (Standard_NC6s_v3, taint sku=gpu:NoSchedule, 0..4, from zero), zone1..zone3 (Standard_D4s_v5, one per availability zone, label workload=zonal, 0..6, balanced)"
    );
    println!(
        "      demand: pods, ETag concurrency {}, rival writer every {:?} (tags, and a node added by hand), runs {:?}",
        etag_mode(args),
        args.rival_interval,
        args.duration
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(replica.serve(stop.clone(), std::future::pending()));

    let rival_stop = CancellationToken::new();
    let rival_writes = Arc::new(AtomicU64::new(0));
    let rival = tokio::spawn(pod_rival(
        state.clone(),
        args.rival_interval,
        args.seed,
        rival_writes.clone(),
        rival_stop.clone(),
    ));

    let recorder = report::Recorder::start(
        title,
        state.clone(),
        Some(kube.clone()),
        &groups,
        report::Writers {
            controllers: vec![CLIENT_ID.into()],
            rivals: vec![RIVAL.into()],
        },
    );
    let web = PodTemplate::new("500m", "1Gi");
    let cache = PodTemplate::new("1", "12Gi").node_selector("workload", "memory");
    let train = PodTemplate::new("2", "8Gi")
        .gpus(1)
        .tolerate("sku", "gpu", "NoSchedule");
    let spread = PodTemplate::new("1", "2Gi")
        .node_selector("workload", "zonal")
        .spread_by("topology.kubernetes.io/zone", SPREAD_MAX_SKEW, "spread")
        .min_domains(3);
    let audit = crate::emulator::audit::PlacementAudit::start(&kube);
    let started = tokio::time::Instant::now();
    let at = |f: f64| started + args.duration.mul_f64(f);
    let mut phase = 0;
    let mut seen = Seen::default();
    let mut tick = tokio::time::interval(SAMPLE);
    let mut last_line = started;
    while started.elapsed() < args.duration {
        tick.tick().await;
        let now = tokio::time::Instant::now();
        if phase == 0 && now >= at(0.05) {
            kube.create(
                "policy/v1",
                "poddisruptionbudgets",
                NS,
                serde_json::json!({"metadata": {"name": "web"},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
            )?;
            kube.create_replica_set(NS, "web", 24, &web)?;
            kube.create_replica_set(NS, "cache", 6, &cache)?;
            kube.create_replica_set(NS, "train", 2, &train)?;
            kube.create_replica_set(NS, "spread", 9, &spread)?;
            create_db(&kube)?;
            say(args, started, "burst: web 24 x (500m, 1Gi), cache 6 x (1, 12Gi, workload=memory), train 2 x (2, 8Gi, 1 GPU, tolerates the taint), spread 9 x (1, 2Gi, zonal, zone maxSkew 1, minDomains 3), db 3 x (500m, 1Gi, a disk each made in the zone it first lands in, one per node)");
            phase = 1;
        } else if phase == 1 && now >= at(0.25) {
            kube.scale_replica_set(NS, "web", 40)?;
            kube.scale_replica_set(NS, "train", 3)?;
            kube.scale_replica_set(NS, "spread", 15)?;
            say(
                args,
                started,
                "second burst: web 24 -> 40, train 2 -> 3, spread 9 -> 15",
            );
            phase = 2;
        } else if phase == 2 && now >= at(0.5) {
            kube.scale_replica_set(NS, "web", 10)?;
            kube.scale_replica_set(NS, "cache", 2)?;
            kube.scale_replica_set(NS, "spread", 6)?;
            say(
                args,
                started,
                "shrink: web 40 -> 10, cache 6 -> 2, spread 15 -> 6",
            );
            phase = 3;
        }
        seen.sample(&kube, now);
        if !args.quiet && now.duration_since(last_line) >= Duration::from_secs(2) {
            last_line = now;
            println!("{}", seen.line(&kube, &state, &groups, started));
        }
    }
    rival_stop.cancel();
    let _ = rival.await;
    let timeline = recorder.finish().await?;
    let audited = audit.finish().await;
    let mut report = seen.report(
        &kube,
        &state,
        &metrics,
        rival_writes.load(Ordering::Relaxed),
        &stage,
    );
    report.max_skew_at_bind = audited.max_skew.get("spread").copied().unwrap_or(0);
    report.placement_violations = audited.violations.len();
    report.audit_incomplete = audited.lagged;
    for v in &audited.violations {
        println!("placement violation: {v}");
    }
    if !args.no_etag {
        for l in state.lost_updates() {
            println!("lost update: {l:?}");
            if std::env::var_os("DEMO_DEBUG_LOST").is_some() {
                for r in state
                    .request_log()
                    .iter()
                    .filter(|r| r.seq + 6 >= l.at_seq && r.seq <= l.at_seq)
                {
                    println!("    {r:?}");
                }
            }
        }
    }
    stop.cancel();
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the controller ended with an error"),
        Err(e) => tracing::warn!(error = %e, "the controller task failed"),
    }
    Ok((report, timeline))
}

/// A StatefulSet-like `db`: three pods, each with its own claim on a `WaitForFirstConsumer`
/// Azure Disk class (the disk is made in the zone the pod first lands in, and holds it there),
/// one per node (hostname anti-affinity), on the zonal groups, not to be evicted.
fn create_db(kube: &KubeState) -> anyhow::Result<()> {
    kube.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        serde_json::json!({"metadata": {"name": "managed-csi"}, "provisioner": "disk.csi.azure.com",
            "volumeBindingMode": "WaitForFirstConsumer"}),
    )?;
    for i in 0..3 {
        kube.create(
            "v1",
            "persistentvolumeclaims",
            NS,
            serde_json::json!({"metadata": {"name": format!("data-db-{i}")},
                "spec": {"storageClassName": "managed-csi", "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "32Gi"}}}}),
        )?;
        kube.create(
            "v1",
            "pods",
            NS,
            serde_json::json!({
                "metadata": {"name": format!("db-{i}"), "labels": {"app": "db"},
                    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                        "name": "db", "uid": "db-statefulset", "controller": true}]},
                "spec": {
                    "nodeSelector": {"workload": "zonal"},
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "db"}},
                            "topologyKey": "kubernetes.io/hostname"}]}},
                    "containers": [{"name": "db", "image": "db",
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
                    "volumes": [{"name": "data",
                        "persistentVolumeClaim": {"claimName": format!("data-db-{i}")}}],
                },
            }),
        )?;
    }
    Ok(())
}

fn say(args: &DemoArgs, started: tokio::time::Instant, what: &str) {
    if !args.quiet {
        println!("[{:>3}s] {what}", started.elapsed().as_secs());
    }
}

/// A rival that does what people do to node pools by hand: change tags (70 %) and add a node
/// (30 %), through ARM, without the controller knowing.
async fn pod_rival(
    state: EmulatorState,
    every: Duration,
    seed: u64,
    count: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(7));
    let names = ["general", "memory", "gpu"];
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        n += 1;
        let name = names[rng.gen_range(0..names.len())];
        let ok = if rng.gen_bool(0.3) && name == "general" {
            state
                .scale_set(SUBSCRIPTION, RESOURCE_GROUP, name)
                .filter(|v| v.capacity < 20)
                .map(|v| {
                    state
                        .rival_set_capacity(
                            SUBSCRIPTION,
                            RESOURCE_GROUP,
                            name,
                            v.capacity + 1,
                            RIVAL,
                        )
                        .is_ok()
                })
                .unwrap_or(false)
        } else {
            let tags = BTreeMap::from([("rival-change".to_string(), n.to_string())]);
            state
                .rival_set_tags(SUBSCRIPTION, RESOURCE_GROUP, name, tags, RIVAL)
                .is_ok()
        };
        if ok {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the demo saw of the cluster, sample by sample.
#[derive(Default)]
struct Seen {
    /// Pod uid → (first seen pending, first seen bound).
    pods: HashMap<String, (tokio::time::Instant, Option<tokio::time::Instant>)>,
    node_seconds: f64,
    needed_seconds: f64,
    last: Option<tokio::time::Instant>,
    /// The spread workload's running pods by zone, when most ran.
    spread_peak: BTreeMap<String, usize>,
}

fn milli(v: Option<&Value>) -> i128 {
    v.and_then(Value::as_str)
        .and_then(|s| quantity::parse(s).ok())
        .or_else(|| v.and_then(Value::as_i64).map(|n| i128::from(n) * 1000))
        .unwrap_or(0)
}

/// The scale set of a Node, from its provider ID.
pub(super) fn group_of_node(node: &Value) -> Option<String> {
    node.pointer("/spec/providerID")
        .and_then(Value::as_str)
        .and_then(crate::node_groups::parse_provider_id)
        .map(|(_, vmss, _)| vmss.to_string())
}

pub(super) fn ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Per group: Ready nodes, and the nodes the pods running there need at least (the larger of
/// total cpu, memory and GPUs over one node's allocatable, rounded up).
fn per_group(kube: &KubeState) -> BTreeMap<String, (usize, usize)> {
    let nodes = kube.list_all("v1", "nodes", None);
    let pods = kube.list_all("v1", "pods", None);
    let mut node_group: HashMap<String, String> = HashMap::new();
    let mut alloc: BTreeMap<String, [i128; 3]> = BTreeMap::new();
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for n in &nodes {
        let Some(g) = group_of_node(n) else { continue };
        if !ready(n) {
            continue;
        }
        let name = n["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let a = &n["status"]["allocatable"];
        alloc.insert(
            g.clone(),
            [
                milli(a.get("cpu")),
                milli(a.get("memory")),
                milli(a.get("nvidia.com/gpu")),
            ],
        );
        node_group.insert(name, g.clone());
        out.entry(g).or_default().0 += 1;
    }
    let mut used: BTreeMap<String, [i128; 3]> = BTreeMap::new();
    for p in &pods {
        let Some(g) = p["spec"]["nodeName"]
            .as_str()
            .and_then(|n| node_group.get(n))
        else {
            continue;
        };
        let u = used.entry(g.clone()).or_default();
        for c in p["spec"]["containers"].as_array().into_iter().flatten() {
            let r = &c["resources"]["requests"];
            u[0] += milli(r.get("cpu"));
            u[1] += milli(r.get("memory"));
            u[2] += milli(r.get("nvidia.com/gpu"));
        }
    }
    for (g, u) in used {
        let Some(a) = alloc.get(&g) else { continue };
        let need = (0..3)
            .filter(|i| a[*i] > 0 && u[*i] > 0)
            .map(|i| ((u[i] + a[i] - 1) / a[i]) as usize)
            .max()
            .unwrap_or(0);
        out.entry(g).or_default().1 = need;
    }
    out
}

impl Seen {
    fn sample(&mut self, kube: &KubeState, now: tokio::time::Instant) {
        for p in kube.list_all("v1", "pods", Some(NS)) {
            let Some(uid) = p["metadata"]["uid"].as_str() else {
                continue;
            };
            let bound = p["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
            let e = self.pods.entry(uid.to_string()).or_insert((now, None));
            if bound && e.1.is_none() {
                e.1 = Some(now);
            }
        }
        let dt = self
            .last
            .map_or(0.0, |l| now.duration_since(l).as_secs_f64());
        self.last = Some(now);
        let spread = spread_per_zone(kube);
        if spread.values().sum::<usize>() > self.spread_peak.values().sum::<usize>() {
            self.spread_peak = spread;
        }
        let groups = per_group(kube);
        self.node_seconds += dt * groups.values().map(|g| g.0).sum::<usize>() as f64;
        self.needed_seconds += dt * groups.values().map(|g| g.1).sum::<usize>() as f64;
    }

    fn line(
        &self,
        kube: &KubeState,
        state: &EmulatorState,
        groups: &[NodeGroupSpec],
        started: tokio::time::Instant,
    ) -> String {
        let counts = kube.pod_counts(Some(NS));
        let per = per_group(kube);
        let mut parts = vec![format!(
            "[{:>3}s] pods pending {:>3} running {:>3}",
            started.elapsed().as_secs(),
            counts.pending,
            counts.running
        )];
        for g in groups {
            let cap = capacity_of(state, g).map_or("?".into(), |c| c.to_string());
            let ready = per.get(&g.name).map_or(0, |x| x.0);
            parts.push(format!("{} {ready} ready / capacity {cap}", g.name));
        }
        parts.join(" | ")
    }

    fn report(
        &self,
        kube: &KubeState,
        state: &EmulatorState,
        metrics: &Metrics,
        rival_writes: u64,
        stage: &Stage,
    ) -> PodsReport {
        let mut waits: Vec<f64> = self
            .pods
            .values()
            .filter_map(|(a, b)| b.map(|b| b.duration_since(*a).as_secs_f64()))
            .collect();
        waits.sort_by(f64::total_cmp);
        let pct = |q: f64| {
            if waits.is_empty() {
                0.0
            } else {
                waits[((waits.len() - 1) as f64 * q).round() as usize]
            }
        };
        let mut writes = BTreeMap::new();
        for g in &stage.groups {
            let n: u64 = ["ok", "accepted", "precondition_failed"]
                .iter()
                .map(|r| {
                    metrics
                        .capacity_writes_total
                        .with_label_values(&[g.name.as_str(), r])
                        .get()
                })
                .sum();
            writes.insert(g.name.clone(), n);
        }
        let conflicts = ["skipped", "retried_ok", "gave_up", "gone"]
            .iter()
            .map(|o| {
                stage
                    .groups
                    .iter()
                    .map(|g| {
                        metrics
                            .etag_conflicts_total
                            .with_label_values(&[g.name.as_str(), o])
                            .get()
                    })
                    .sum::<u64>()
            })
            .sum();
        // GPU nodes' pods that do not tolerate the taint.
        let gpu_nodes: Vec<String> = kube
            .list_all("v1", "nodes", None)
            .iter()
            .filter(|n| group_of_node(n).as_deref() == Some("gpu"))
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let misplaced_on_gpu = kube
            .list_all("v1", "pods", None)
            .iter()
            .filter(|p| {
                p["spec"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| gpu_nodes.iter().any(|g| g == n))
            })
            .filter(|p| {
                !p["spec"]["tolerations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| {
                        t["key"] == "sku" || (t["operator"] == "Exists" && t.get("key").is_none())
                    })
            })
            .count();
        let per = per_group(kube);
        let lost = stage._emulator.pods_lost_with_nodes();
        let evictions = |r: &str| {
            crate::metrics::Metrics::counter_sum(&metrics.evicted_pods_total, &[("result", r)])
        };
        PodsReport {
            nodes_removed: crate::metrics::Metrics::counter_sum(
                &metrics.scaled_down_nodes_total,
                &[],
            ),
            evictions: evictions("evicted"),
            evictions_refused: evictions("blocked"),
            pdb_violations: lost.iter().filter(|l| l.name.starts_with("web-")).count(),
            pods: self.pods.len(),
            scheduled: waits.len(),
            wait_p50: pct(0.5),
            wait_p99: pct(0.99),
            wait_max: waits.last().copied().unwrap_or(0.0),
            node_minutes: self.node_seconds / 60.0,
            node_minutes_needed: self.needed_seconds / 60.0,
            writes,
            conflicts,
            rival_writes,
            lost_updates: state.lost_updates().len(),
            pods_lost_with_nodes: lost.len(),
            misplaced_on_gpu,
            nodes_at_end: per.iter().map(|(g, x)| (g.clone(), x.0)).collect(),
            nodes_needed_at_end: per.iter().map(|(g, x)| (g.clone(), x.1)).collect(),
            spread_per_zone: self.spread_peak.clone(),
            pending_at_end: pending_at_end(kube),
            ..PodsReport::default()
        }
    }
}

/// The running pods of the `spread` workload, by the zone of their node.
fn spread_per_zone(kube: &KubeState) -> BTreeMap<String, usize> {
    let zones: HashMap<String, String> = kube
        .list_all("v1", "nodes", None)
        .iter()
        .filter_map(|n| {
            Some((
                n["metadata"]["name"].as_str()?.to_string(),
                n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                    .as_str()?
                    .to_string(),
            ))
        })
        .collect();
    let mut out = BTreeMap::new();
    for p in kube.list_all("v1", "pods", Some(NS)) {
        if p["metadata"]["labels"]["app"] != "spread" || p["status"]["phase"] != "Running" {
            continue;
        }
        if let Some(z) = p["spec"]["nodeName"].as_str().and_then(|n| zones.get(n)) {
            *out.entry(z.clone()).or_default() += 1;
        }
    }
    out
}

/// Pods still pending, by the scheduler's message.
fn pending_at_end(kube: &KubeState) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in kube.list_all("v1", "pods", Some(NS)) {
        let bound = p["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        if bound || p["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let message = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled")
            .and_then(|c| c["message"].as_str())
            .unwrap_or("not looked at yet")
            .to_string();
        *out.entry(message).or_default() += 1;
    }
    out
}

fn print_report(args: &DemoArgs, r: &PodsReport) {
    println!();
    println!("summary ({}):", etag_mode(args));
    println!(
        "  pods scheduled                 {} of {} seen pending",
        r.scheduled, r.pods
    );
    println!(
        "  wait from pending to bound     p50 {:.1}s  p99 {:.1}s  max {:.1}s  (boot delay {:?}, batch window 1s idle / 10s max)",
        r.wait_p50, r.wait_p99, r.wait_max, BOOT_DELAY
    );
    println!(
        "  node-minutes                   {:.1} used, {:.1} needed by the pods running (perfect packing, a lower bound)",
        r.node_minutes, r.node_minutes_needed
    );
    println!(
        "  capacity writes                {}  (412s met: {})",
        r.writes
            .iter()
            .map(|(g, n)| format!("{g} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.conflicts
    );
    println!("  rival writes                   {}", r.rival_writes);
    println!(
        "  pods on GPU nodes without the toleration  {}",
        r.misplaced_on_gpu
    );
    println!(
        "  pods lost with a node          {}  (not evicted through the API before their node went)",
        r.pods_lost_with_nodes
    );
    println!(
        "  scale-down                     {} nodes removed, {} evictions ({} refused by the budget and retried); waits shortened for the demo: unneededTime {:?}, delayAfterAdd {:?}, nodeDeleteDelayAfterTaint {:?}",
        r.nodes_removed,
        r.evictions,
        r.evictions_refused,
        DEMO_UNNEEDED_TIME,
        DEMO_DELAY_AFTER_ADD,
        DEMO_DELAY_AFTER_TAINT
    );
    println!("  PDB violations                 {}", r.pdb_violations);
    println!(
        "  zone spread                    spread pods per zone at peak {:?}; max skew at bind {} (maxSkew {SPREAD_MAX_SKEW}); placement violations at bind {}{}",
        r.spread_per_zone,
        r.max_skew_at_bind,
        r.placement_violations,
        if r.audit_incomplete { " (audit incomplete)" } else { "" }
    );
    println!(
        "  pods pending at end            {} {:?}",
        r.pending_at_end.values().sum::<usize>(),
        r.pending_at_end
    );
    println!(
        "  Ready nodes at the end         {:?}, needed by the pods running {:?}",
        r.nodes_at_end, r.nodes_needed_at_end
    );
    println!(
        "  lost updates                   {}{}",
        r.lost_updates,
        if args.no_etag {
            "  (blind writes: the rival's changes were overwritten)"
        } else {
            ""
        }
    );
}

/// One figure of a report as a single word (the comparison's columns split on whitespace).
fn figures(r: &PodsReport) -> Vec<(&'static str, String)> {
    let writes: u64 = r.writes.values().sum();
    vec![
        ("pods scheduled", format!("{}/{}", r.scheduled, r.pods)),
        (
            "wait p50/p99/max (s)",
            format!("{:.1}/{:.1}/{:.1}", r.wait_p50, r.wait_p99, r.wait_max),
        ),
        (
            "node-minutes used/needed",
            format!("{:.1}/{:.1}", r.node_minutes, r.node_minutes_needed),
        ),
        ("capacity writes", writes.to_string()),
        ("412s met", r.conflicts.to_string()),
        ("rival writes", r.rival_writes.to_string()),
        ("nodes removed", r.nodes_removed.to_string()),
        (
            "evictions (refused)",
            format!("{}({})", r.evictions, r.evictions_refused),
        ),
        ("PDB violations", r.pdb_violations.to_string()),
        ("pods lost with a node", r.pods_lost_with_nodes.to_string()),
        (
            "pods on GPU without toleration",
            r.misplaced_on_gpu.to_string(),
        ),
        (
            "spread pods per zone at peak",
            if r.spread_per_zone.is_empty() {
                "-".to_string()
            } else {
                r.spread_per_zone
                    .values()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            },
        ),
        (
            "max skew at bind (maxSkew 1)",
            r.max_skew_at_bind.to_string(),
        ),
        (
            "placement violations at bind",
            if r.audit_incomplete {
                "incomplete".to_string()
            } else {
                r.placement_violations.to_string()
            },
        ),
        (
            "pods pending at end",
            r.pending_at_end.values().sum::<usize>().to_string(),
        ),
        ("lost updates", r.lost_updates.to_string()),
    ]
}

fn print_comparison(ab: &AbReport) {
    println!();
    println!("summary (same seed, same scenario; scale-down waits shortened for the demo):");
    println!("  {:<32} {:>16} {:>16}", "", "ETags on", "blind writes");
    for ((label, on), (_, off)) in figures(&ab.with_etags).into_iter().zip(figures(&ab.blind)) {
        println!("  {label:<32} {on:>16} {off:>16}");
    }
    for (arm, r) in [("ETags on", &ab.with_etags), ("blind", &ab.blind)] {
        for (why, n) in &r.pending_at_end {
            println!("  pending at the end ({arm}): {n} x {why}");
        }
    }
    println!();
    println!("  {}", conclusion(ab));
}

/// What the A/B shows, in two sentences.
fn conclusion(ab: &AbReport) -> String {
    let kept = match ab.with_etags.lost_updates {
        0 => format!(
            "none of the rival's {} changes was lost",
            ab.with_etags.rival_writes
        ),
        n => format!("yet {n} of the rival's changes were lost: a defect"),
    };
    format!(
        "With ETags every write carried If-Match: {} met a 412 (the rival had changed the scale set since it was read), was re-read and re-planned, and {kept}. Blind, the same scenario overwrote {} of the rival's changes (the emulator counts a write that replaced a version its writer never read).",
        ab.with_etags.conflicts, ab.blind.lost_updates
    )
}
