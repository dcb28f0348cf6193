//! One planning pass on a large cluster: 5,000 nodes in 100 node groups, 50,000 pods of which
//! 3,000 are pending, 10 DaemonSets (goal under 100 ms): the scale-up decision
//! (`pods::scale_up::plan`) and the scale-down decision (`pods::unneeded::unneeded`), both pure,
//! over the same snapshot, as the daemon's loops run them. Also timed: turning the API's pods
//! into the records the reflector keeps (once per pod event, not per pass).
//! Groups mix four VM sizes, every fourth is a tainted GPU group; pods come from 60 Deployments
//! (some pinned to a group by nodeSelector, some tolerating the GPU taint). Median and
//! percentiles of many decisions over the same snapshot.
//! `cargo bench --bench scale_up`; `BENCH_QUICK=1 cargo bench --bench scale_up` for CI.

#[path = "common/mod.rs"]
mod common;

use common::{group_name, quick, size_of, verdict};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use vmss_capacity_controller::pods::expander::Expander;
use vmss_capacity_controller::pods::record::{Interner, NodeRecord, PodRecord};
use vmss_capacity_controller::pods::scale_up::{plan, Backing, GroupInput, ScaleUpInput};
use vmss_capacity_controller::pods::template::GroupShape;
use vmss_capacity_controller::pods::unneeded::{unneeded, DownGroup, DownInput};

const SUB: &str = "00000000-0000-0000-0000-000000000000";
const GROUPS: usize = 100;
const NODES_PER_GROUP: usize = 50;
const PODS: usize = 50_000;
const PENDING: usize = 3_000;
const DEPLOYMENTS: usize = 60;
const GPU_TAINT: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";

fn node(g: usize, i: usize) -> Node {
    let (size, cpu, mem) = size_of(g);
    let name = format!("{}-vmss{i:06}", group_name(g));
    let taints = if g.is_multiple_of(4) {
        json!([{"key": "sku", "value": "gpu", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    let mut alloc = json!({"cpu": cpu, "memory": mem, "pods": "110"});
    if g.is_multiple_of(4) {
        alloc["nvidia.com/gpu"] = json!("1");
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "node.kubernetes.io/instance-type": size,
            "pool": group_name(g),
        }},
        "spec": {
            "providerID": format!("azure:///subscriptions/{SUB}/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/{}/virtualMachines/{i}", group_name(g)),
            "taints": taints,
        },
        "status": {
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("node")
}

/// Deployment `d`'s pod: requests, and for some a pool selector or the GPU toleration.
fn pod(d: usize, i: usize, node: Option<&str>) -> Pod {
    let cpu = ["100m", "250m", "500m", "1", "2"][d % 5];
    let mem = ["128Mi", "512Mi", "1Gi", "2Gi", "4Gi"][(d / 5) % 5];
    let mut spec = json!({
        "containers": [{"name": "app", "image": "app",
            "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
    });
    if d.is_multiple_of(6) {
        // Pinned to one non-GPU pool.
        spec["nodeSelector"] = json!({"pool": group_name(((d * 7) % GROUPS) | 1)});
    }
    if d % 10 == 4 {
        spec["tolerations"] =
            json!([{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]);
        spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("1");
    }
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    let status = if node.is_some() {
        json!({"phase": "Running"})
    } else {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("deploy{d:02}-{i:06}"), "namespace": format!("team{}", d % 8),
            "uid": format!("pod-uid-{d}-{i}"), "resourceVersion": format!("{}", 1000 + i),
            "labels": {"app": format!("deploy{d:02}")},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("deploy{d:02}-rs"), "uid": format!("uid-{d}"), "controller": true}]},
        "spec": spec,
        "status": status,
    }))
    .expect("pod")
}

fn daemonset(k: usize) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": format!("ds{k}"), "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"ds": format!("ds{k}")}},
            "template": {
                "metadata": {"labels": {"ds": format!("ds{k}")}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "agent",
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}}],
                },
            },
        },
    }))
    .expect("daemonset")
}

fn pct(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn timed(iters: usize, mut f: impl FnMut()) -> Vec<f64> {
    let mut v: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

fn main() {
    let quick = quick();
    let iters = if quick { 5 } else { 30 };
    let nodes: Vec<Arc<Node>> = (0..GROUPS)
        .flat_map(|g| (0..NODES_PER_GROUP).map(move |i| Arc::new(node(g, i))))
        .collect();
    // Bound pods: spread over the non-GPU nodes, about 12 per node.
    let plain: Vec<&Arc<Node>> = nodes
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(Vec::is_empty)
        })
        .collect();
    let mut raw: Vec<Pod> = Vec::with_capacity(PODS);
    for i in 0..PODS - PENDING {
        let n = plain[i % plain.len()].metadata.name.as_deref();
        // Small pods only on running nodes (deployments 0..5: 100m-2 cpu, 128Mi).
        raw.push(pod(1 + (i % 3) * 5, i, n));
    }
    for i in 0..PENDING {
        raw.push(pod(i % DEPLOYMENTS, PODS + i, None));
    }
    println!(
        "== scale_up ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    // What the reflector does once per pod event: the record, its spec shared by equal pods.
    let t = Instant::now();
    let nodes: Vec<Arc<NodeRecord>> = nodes
        .iter()
        .map(|n| Arc::new(NodeRecord::of((**n).clone())))
        .collect();
    let nodes_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let mut interner = Interner::default();
    let pods: Vec<Arc<PodRecord>> = raw
        .into_iter()
        .map(|p| Arc::new(interner.record(p)))
        .collect();
    let ingest_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "ingest (the reflector, once per event): {} nodes into records in {nodes_ms:.1} ms, {} pods in {ingest_ms:.1} ms ({:.1} us each), {} distinct specs and label maps shared",
        nodes.len(),
        pods.len(),
        ingest_ms * 1e3 / pods.len() as f64,
        interner.len()
    );
    let daemonsets: Vec<Arc<DaemonSet>> = (0..10).map(|k| Arc::new(daemonset(k))).collect();
    let names: Vec<String> = (0..GROUPS).map(group_name).collect();
    let tags: Vec<_> = (0..GROUPS)
        .map(|g| {
            if g.is_multiple_of(4) {
                [(GPU_TAINT.to_string(), "gpu:NoSchedule".to_string())].into()
            } else {
                Default::default()
            }
        })
        .collect::<Vec<std::collections::BTreeMap<String, String>>>();
    let groups: Vec<GroupInput> = (0..GROUPS)
        .map(|g| GroupInput {
            name: names[g].clone(),
            backing: Backing::ScaleSet {
                resource_group: "MC_RG".into(),
                name: names[g].clone(),
            },
            min: 0,
            max: 200,
            capacity: Some(NODES_PER_GROUP as i64),
            shape: Some(GroupShape {
                name: &names[g],
                vm_size: size_of(g).0,
                tags: tags[g].clone(),
                ..GroupShape::default()
            }),
            unhealthy: None,
            failed: Vec::new(),
            quota: Vec::new(),
            vcpus: None,
        })
        .collect();
    let input = ScaleUpInput {
        groups,
        nodes,
        pods,
        daemonsets,
        expander: Expander::LeastWaste,
        priority_cutoff: -10,
        seed: 1,
        now: k8s_openapi::jiff::Timestamp::now(),
        node_startup: std::time::Duration::from_secs(900),
        quota: Vec::new(),
        balance_similar: false,
    };
    let first = plan(&input);
    println!(
        "{} nodes in {GROUPS} groups, {} pods ({} pending), {} DaemonSets: {} groups grow by {} nodes, {} pods placed on room already there, {} fit no group, {} not simulated",
        input.nodes.len(),
        input.pods.len(),
        first.pending,
        input.daemonsets.len(),
        first.targets.len(),
        first.targets.values().sum::<i64>() - (first.targets.len() * NODES_PER_GROUP) as i64,
        first.already_provided.len(),
        first.unfit.len(),
        first.not_simulated.len(),
    );
    let up = timed(iters, || {
        black_box(plan(black_box(&input)));
    });
    println!(
        "scale-up decision, {iters} runs: median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(&up, 0.5),
        pct(&up, 0.9),
        up[up.len() - 1]
    );
    let down_groups: Vec<DownGroup> = (0..GROUPS)
        .map(|g| DownGroup {
            name: names[g].clone(),
            backing: Backing::ScaleSet {
                resource_group: "MC_RG".into(),
                name: names[g].clone(),
            },
            floor: 0,
            size: Some(NODES_PER_GROUP as i64),
            deleting: 0,
            recently_grown: false,
            refused: None,
        })
        .collect();
    let busy = std::collections::HashSet::new();
    let down_input = DownInput {
        groups: &down_groups,
        nodes: &input.nodes,
        pods: &input.pods,
        pdbs: &[],
        threshold: 0.5,
        busy: &busy,
        unready: &busy,
        previously: &busy,
        non_empty_candidates: vmss_capacity_controller::config::DEFAULT_NON_EMPTY_CANDIDATES,
    };
    let candidates = unneeded(&down_input);
    println!(
        "scale-down decision: {} nodes unneeded, {} blocked (utilised or their pods fit nowhere else)",
        candidates.unneeded.len(),
        candidates.blocked.len()
    );
    let down = timed(iters, || {
        black_box(unneeded(black_box(&down_input)));
    });
    println!(
        "scale-down decision, {iters} runs: median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(&down, 0.5),
        pct(&down, 0.9),
        down[down.len() - 1]
    );
    let pass = pct(&up, 0.5) + pct(&down, 0.5);
    println!(
        "goal: one planning pass (scale-up + scale-down decisions) under 100 ms: median {pass:.1} ms {} ({:.1}x headroom); p90 {:.1} ms {}",
        verdict(pass < 100.0),
        100.0 / pass,
        pct(&up, 0.9) + pct(&down, 0.9),
        verdict(pct(&up, 0.9) + pct(&down, 0.9) < 100.0),
    );
}
