//! `demand: pods` end to end, in process: the emulator's ARM side (scale sets) and Kubernetes
//! side (pending pods, nodes), the reflectors, the scale-up loop and the reconciler wired as
//! `run` wires them. Real time with short batch windows; every wait is bounded.

mod support;

use k8s_openapi::api::events::v1::Event;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio_util::sync::CancellationToken;
use vmss_capacity_controller::config::{DemandKind, Settings};
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::{
    EmulatorBuilder, EmulatorHandle, EmulatorState, ScaleSetSeed,
};
use vmss_capacity_controller::kube::events::{EventRecorder, KubeEvents, RecorderConfig};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::pod_demand::{PodDemand, ScaleUpLoop};
use vmss_capacity_controller::reconciler::Reconciler;

const GPU_TAINT_TAG: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";

/// A scale set to seed: name, VM size, capacity, tags.
type Seed<'a> = (&'a str, &'a str, i64, &'a [(&'a str, &'a str)]);

struct Cluster {
    _emulator: EmulatorHandle,
    state: EmulatorState,
    kube: KubeState,
    client: kube::Client,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Scale sets `seeds` (name, VM size, capacity, tags); node groups 0..=max for each.
    async fn start(seeds: &[Seed<'_>], max: u32) -> Self {
        let emulator = EmulatorBuilder::new()
            .kubernetes(true)
            .start()
            .await
            .expect("emulator starts");
        let state = emulator.state();
        let kube = emulator.kube().expect("kubernetes side on");
        let mut groups = Vec::new();
        for (name, size, capacity, tags) in seeds {
            let mut seed = ScaleSetSeed::new(SUB, RG, name, *capacity);
            seed.sku_name = size.to_string();
            seed.tags = tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>();
            state.seed_scale_set(seed);
            groups.push(group(name, 0, max, None));
        }
        let mut s: Settings = settings(&emulator.base_url(), groups);
        s.pod_demand.kind = DemandKind::Pods;
        s.pod_demand.batch_idle = Duration::from_millis(300);
        s.pod_demand.batch_max = Duration::from_secs(3);
        // Writes come from the loop's wake, not from the scan interval.
        s.scan_interval = Duration::from_secs(30);
        let settings = Arc::new(s);
        let metrics = Arc::new(Metrics::new());
        let arm = arm_client(&emulator, &state, "controller", metrics.clone());
        let demand = Arc::new(PodDemand::default());
        let file = kube::config::Kubeconfig::from_yaml(&emulator.kubeconfig().expect("kubeconfig"))
            .expect("kubeconfig parses");
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .expect("kubeconfig is usable");
        let client = kube::Client::try_from(config).expect("client");
        let (recorder, poster) = EventRecorder::new(
            RecorderConfig {
                namespace: "kube-system".into(),
                identity: "controller-test".into(),
                status_config_map: "vmss-capacity-controller-status".into(),
                lease: None,
            },
            Arc::new(KubeEvents::new(client.clone())),
            metrics.clone(),
            10_000,
        );
        let recorder = Arc::new(recorder);
        let reconciler = Arc::new(
            Reconciler::builder(settings.clone(), arm, metrics.clone())
                .demand(demand.clone())
                .events(recorder.clone())
                .build(),
        );
        let stop = CancellationToken::new();
        let (view, mut tasks) = vmss_capacity_controller::kube::reflect::start(
            client.clone(),
            metrics.clone(),
            stop.clone(),
        )
        .await;
        tasks.push(tokio::spawn(poster.run(stop.clone())));
        tasks.push(tokio::spawn(
            ScaleUpLoop::new(
                settings.clone(),
                demand,
                reconciler.clone(),
                view.clone(),
                metrics.clone(),
                recorder,
            )
            .run(stop.clone()),
        ));
        {
            let (r, stop) = (reconciler.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { r.run(stop).await }));
        }
        assert!(
            eventually(Duration::from_secs(10), || view.synced()).await,
            "the reflectors never listed"
        );
        // The first pass has read every scale set.
        let names: Vec<String> = seeds.iter().map(|s| s.0.to_string()).collect();
        let r = reconciler.clone();
        assert!(
            eventually(Duration::from_secs(10), || names
                .iter()
                .all(|n| r.scale_sets().get(n).is_some()))
            .await,
            "the first pass never read the scale sets"
        );
        Cluster {
            _emulator: emulator,
            state,
            kube,
            client,
            metrics,
            reconciler,
            stop,
            tasks,
        }
    }

    /// A pending pod the scheduler found no room for.
    fn pending(&self, name: &str, cpu: &str, memory: &str, extra: Value) {
        let mut spec = json!({
            "containers": [{"name": "app", "image": "app",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        self.kube
            .create(
                "v1",
                "pods",
                "default",
                json!({
                    "metadata": {"name": name, "namespace": "default",
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "web", "uid": "rs-uid", "controller": true}]},
                    "spec": spec,
                    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                        "status": "False", "reason": "Unschedulable",
                        "message": "0/0 nodes are available"}]},
                }),
            )
            .expect("pod created");
    }

    fn capacity_puts(&self, name: &str) -> usize {
        capacity_puts_by(&self.state.request_log(), "controller")
            .iter()
            .filter(|r| scale_set_of(&r.path) == Some(name))
            .count()
    }

    fn capacity(&self, name: &str) -> i64 {
        self.state
            .scale_set(SUB, RG, name)
            .map_or(-1, |v| v.capacity)
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), "default");
        api.list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

/// Polls an async condition every 100 ms for at most 10 s.
async fn eventually_async<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pending_pods_makes_exactly_one_write_per_group_sized_for_all_of_them() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 20).await;
    // 30 pods of 1 cpu, arriving over ~0.3 s: one batch.
    for i in 0..30 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") > 0).await,
        "no scale-up"
    );
    // Let any second write show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.capacity_puts("general"),
        1,
        "one write for the whole burst"
    );
    // A D4s_v5 keeps 3 whole cpus allocatable after AKS's reservations: 10 nodes for 30 pods.
    assert_eq!(c.capacity("general"), 10);
    assert_eq!(
        c.metrics
            .scaled_up_nodes_total
            .with_label_values(&["general"])
            .get(),
        10
    );
    assert!(
        eventually_async(|| async { c.events("TriggeredScaleUp").await.len() == 30 }).await,
        "one TriggeredScaleUp Event per pod: {}",
        c.events("TriggeredScaleUp").await.len()
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tainted_gpu_group_scales_from_zero_only_for_pods_that_tolerate_its_taint() {
    let c = Cluster::start(
        &[
            ("general", "Standard_D4s_v5", 0, &[]),
            (
                "gpu",
                "Standard_NC6s_v3",
                0,
                &[(GPU_TAINT_TAG, "gpu:NoSchedule")],
            ),
        ],
        10,
    )
    .await;
    for i in 0..4 {
        c.pending(&format!("web-{i}"), "500m", "512Mi", json!({}));
    }
    let cuda = json!({
        "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "containers": [{"name": "train", "image": "train", "resources": {
            "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"}}}],
    });
    c.pending("train-0", "0", "0", cuda.clone());
    c.pending("train-1", "0", "0", cuda);
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("gpu") > 0
            && c.capacity("general") > 0)
        .await,
        "general {} gpu {}",
        c.capacity("general"),
        c.capacity("gpu")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // NC6s_v3 has one GPU: one node per training pod; the web pods fit one D4s_v5.
    assert_eq!(c.capacity("gpu"), 2);
    assert_eq!(c.capacity("general"), 1);
    assert_eq!((c.capacity_puts("gpu"), c.capacity_puts("general")), (1, 1));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_no_group_is_reported_on_the_pod_and_in_metrics_and_nothing_is_written() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 0, &[])], 10).await;
    c.pending("huge", "64", "1Gi", json!({}));
    assert!(
        eventually_async(|| async { !c.events("NotTriggerScaleUp").await.is_empty() }).await,
        "no NotTriggerScaleUp Event"
    );
    let e = c.events("NotTriggerScaleUp").await.remove(0);
    let regarding = e.regarding.clone().unwrap_or_default();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.name.as_deref(), Some("huge"));
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .contains("general: Insufficient cpu"),
        "{e:?}"
    );
    assert_eq!(
        c.metrics
            .pods_unfit
            .with_label_values(&["general", "insufficient_cpu"])
            .get(),
        1
    );
    assert_eq!(c.capacity_puts("general"), 0);
    assert_eq!(c.capacity("general"), 0);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_412_on_the_scale_up_write_replans_from_the_fresh_capacity_within_the_same_pass() {
    let c = Cluster::start(&[("general", "Standard_D4s_v5", 2, &[])], 20).await;
    // Another writer changes the scale set after our read: our cached ETag is stale.
    c.state
        .rival_set_capacity(SUB, RG, "general", 3, "rival")
        .expect("rival write");
    for i in 0..12 {
        c.pending(&format!("web-{i}"), "1", "1Gi", json!({}));
    }
    // 12 pods of 1 cpu need 4 nodes. We read capacity 2 with no node registered yet, so two
    // are on their way and two more are asked for: "at least 4". The write meets a 412, the
    // fresh read shows the rival's 3, and the same pass writes 4 with the fresh ETag.
    assert!(
        eventually(Duration::from_secs(10), || c.capacity("general") == 4).await,
        "capacity {}",
        c.capacity("general")
    );
    let conflicts = c
        .metrics
        .etag_conflicts_total
        .with_label_values(&["general", "retried_ok"])
        .get();
    assert_eq!(conflicts, 1, "one 412, retried with the fresh ETag");
    assert_eq!(
        c.capacity_puts("general"),
        2,
        "the 412'd write and its retry"
    );
    assert!(
        c.state.lost_updates().is_empty(),
        "the rival's write was not lost"
    );
    let _ = &c.reconciler;
    c.stop().await;
}
