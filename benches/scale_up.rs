//! One scale-up decision (`pods::scale_up::plan`, pure) on a large cluster: 5,000 nodes in 100
//! node groups, 50,000 pods of which 3,000 are pending, 10 DaemonSets (goal under 100 ms).
//! Groups mix four VM sizes, every fourth is a tainted GPU group; pods come from 60 Deployments
//! (some pinned to a group by nodeSelector, some tolerating the GPU taint). Median and
//! percentiles of many decisions over the same snapshot.
//! `cargo bench --bench scale_up`; `BENCH_QUICK=1 cargo bench --bench scale_up` for CI.

#[path = "common/mod.rs"]
mod common;

use common::{quick, verdict};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use vmss_capacity_controller::pods::expander::Expander;
use vmss_capacity_controller::pods::fit::FactsCache;
use vmss_capacity_controller::pods::scale_up::{
    plan, plan_with, Backing, GroupInput, ScaleUpInput,
};
use vmss_capacity_controller::pods::template::GroupShape;

const SUB: &str = "00000000-0000-0000-0000-000000000000";
const GROUPS: usize = 100;
const NODES_PER_GROUP: usize = 50;
const PODS: usize = 50_000;
const PENDING: usize = 3_000;
const DEPLOYMENTS: usize = 60;
const GPU_TAINT: &str = "k8s.io_cluster-autoscaler_node-template_taint_sku";

fn size_of(g: usize) -> (&'static str, &'static str, &'static str) {
    match g % 4 {
        0 => ("Standard_NC6s_v3", "6", "110Gi"),
        1 => ("Standard_D4s_v5", "4", "16Gi"),
        2 => ("Standard_D8s_v5", "8", "32Gi"),
        _ => ("Standard_E8s_v5", "8", "64Gi"),
    }
}

fn group_name(g: usize) -> String {
    format!("pool{g:03}")
}

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

/// Deployment `d`'s pod template: requests, and for some a pool selector or the GPU toleration.
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

fn main() {
    let quick = quick();
    let iters = if quick { 5 } else { 30 };
    let nodes: Vec<Arc<Node>> = (0..GROUPS)
        .flat_map(|g| (0..NODES_PER_GROUP).map(move |i| Arc::new(node(g, i))))
        .collect();
    // Bound pods: spread over the non-GPU nodes, about 10 per node.
    let plain: Vec<&Arc<Node>> = nodes
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(Vec::is_empty)
        })
        .collect();
    let mut pods: Vec<Arc<Pod>> = Vec::with_capacity(PODS);
    for i in 0..PODS - PENDING {
        let n = plain[i % plain.len()].metadata.name.as_deref();
        // Small pods only on running nodes (deployments 0..5: 100m-2 cpu, 128Mi).
        pods.push(Arc::new(pod(1 + (i % 3) * 5, i, n)));
    }
    for i in 0..PENDING {
        pods.push(Arc::new(pod(i % DEPLOYMENTS, PODS + i, None)));
    }
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
    };
    println!(
        "== scale_up ({} mode) ==",
        if quick { "QUICK" } else { "full" }
    );
    let t = Instant::now();
    let first = plan(&input);
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{} nodes in {GROUPS} groups, {} pods ({} pending), {} DaemonSets: {} groups grow by {} nodes, {} pods placed on room already there, {} fit no group, {} not simulated (first decision {first_ms:.1} ms)",
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
    // What part of a decision is reading the cluster: every node's state with its bound pods.
    let t = Instant::now();
    let mut by_node: std::collections::HashMap<&str, Vec<&Arc<Pod>>> = Default::default();
    for p in &input.pods {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            by_node.entry(n).or_default().push(p);
        }
    }
    let states: Vec<_> = input
        .nodes
        .iter()
        .map(|n| {
            vmss_capacity_controller::pods::fit::NodeState::from_node(
                n,
                by_node
                    .get(n.metadata.name.as_deref().unwrap_or_default())
                    .into_iter()
                    .flatten()
                    .copied(),
            )
        })
        .collect();
    black_box(states);
    println!(
        "of which node states with their bound pods: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let timed = |warm: bool| -> Vec<f64> {
        let mut cache = FactsCache::default();
        if warm {
            plan_with(&input, &mut cache);
        }
        let mut v: Vec<f64> = (0..iters)
            .map(|_| {
                let t = Instant::now();
                if warm {
                    black_box(plan_with(black_box(&input), &mut cache));
                } else {
                    black_box(plan(black_box(&input)));
                }
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let pct = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let cold = timed(false);
    let warm = timed(true);
    println!(
        "cold decision (every pod parsed, as the first after start), {iters} runs: median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(&cold, 0.5),
        pct(&cold, 0.9),
        cold[cold.len() - 1]
    );
    println!(
        "steady decision (the loop's cache: pods parsed once per resourceVersion), {iters} runs: median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        pct(&warm, 0.5),
        pct(&warm, 0.9),
        warm[warm.len() - 1]
    );
    let median = pct(&warm, 0.5);
    let cold_median = pct(&cold, 0.5);
    println!(
        "goal: under 100 ms: steady median {median:.1} ms {} ({:.1}x headroom); cold median {cold_median:.1} ms {}",
        verdict(median < 100.0),
        100.0 / median,
        verdict(cold_median < 100.0),
    );
}
