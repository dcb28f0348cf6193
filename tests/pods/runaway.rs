//! Issue 41's runaway, end to end, as a new user met it: three regional scale sets whose
//! scale-from-zero tags say (as cluster-autoscaler's
//! `k8s.io_cluster-autoscaler_node-template_label_topology.kubernetes.io_zone` tag does) that their
//! nodes are in zones 1, 2 and 3, one live node each carrying that zone, and a workload of 12 pods
//! spread by zone (`maxSkew: 1`) that needs two nodes per zone. Before the templates followed
//! cluster-autoscaler's order of truth, a regional group's template was given zone `0`, every
//! pending pod "needed" that empty domain, and the groups grew to their maximum (10 / 10 / 3 on
//! a real kube-apiserver 1.20); now they grow to 2 / 2 / 2.
//!
//! Twice: on the emulator's simulated cluster (its scheduler enforces the spread), and on a real
//! kube-apiserver (`#[ignore]`d: it needs `KUBECONFIG`; `.ci/real-apiserver.sh` runs it), where
//! the test plays kubelet and kube-scheduler itself (the kit runs neither).

use crate::support;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use support::pod_cluster::Cluster;
use support::*;

const ZONE_TAG: &str = "k8s.io_cluster-autoscaler_node-template_label_topology.kubernetes.io_zone";
const ZONE: &str = "topology.kubernetes.io/zone";
const SIZE: &str = "Standard_D4s_v5";
/// Each group's `maxSize`, as in the issue.
const MAX: u32 = 10;
/// Pods of the workload, and what each asks for: two per D4s_v5 node (3.9 cpu allocatable).
const REPLICAS: usize = 12;
const POD_CPU: &str = "1500m";
const POD_CPU_MILLI: i64 = 1500;

fn sizes(c: &Cluster) -> Vec<i64> {
    ["r1", "r2", "r3"].iter().map(|g| c.capacity(g)).collect()
}

/// On the emulator's simulated cluster: the three regional groups start with one Ready node each
/// (in the zone its tag names), the ReplicaSet's 12 pods end running 4 per zone on 2 nodes per
/// zone, and no group grew past 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regional_groups_with_zone_tags_and_a_live_node_each_grow_two_two_two_for_a_zone_spread_workload(
) {
    use support::pod_cluster::Groups;
    use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings};
    use vmss_capacity_controller::emulator::ScaleSetSeed;
    let seeds = (1..=3)
        .map(|z| {
            let mut s = ScaleSetSeed::new(SUB, RG, &format!("r{z}"), 1);
            s.sku_name = SIZE.into();
            s.tags = BTreeMap::from([(ZONE_TAG.to_string(), format!("westeurope-{z}"))]);
            s
        })
        .collect();
    let sim = SimSettings {
        boot_delay: Duration::from_millis(300),
        tick: Duration::from_millis(20),
    };
    let c = Cluster::start_simulated_groups(Groups::Seeds(seeds), MAX, sim, |s| {
        s.pod_demand.batch_idle = Duration::from_millis(500);
        s.pod_demand.batch_max = Duration::from_secs(3);
        s.scan_interval = Duration::from_secs(1);
    })
    .await;
    let k = &c.kube;
    assert!(
        eventually(Duration::from_secs(10), || k.ready_nodes().len() == 3).await,
        "the three live nodes never became Ready"
    );
    k.create_replica_set(
        "default",
        "web",
        REPLICAS as i64,
        &PodTemplate::new(POD_CPU, "1Gi").spread_by(ZONE, 1, "web"),
    )
    .expect("replica set");
    let running_per_zone = || {
        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        for p in k.list_all("v1", "pods", Some("default")) {
            if p["status"]["phase"] != "Running" {
                continue;
            }
            let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
            let zone = k
                .get("v1", "nodes", "", node)
                .ok()
                .and_then(|n| n["metadata"]["labels"][ZONE].as_str().map(str::to_string))
                .unwrap_or_default();
            *per_zone.entry(zone).or_default() += 1;
        }
        per_zone
    };
    assert!(
        eventually(Duration::from_secs(30), || running_per_zone()
            .values()
            .sum::<usize>()
            == REPLICAS)
        .await,
        "running {:?}, sizes {:?}",
        running_per_zone(),
        sizes(&c)
    );
    // A few more decisions: nothing pending, nothing grows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sizes(&c), [2, 2, 2], "growth exactly as the spread needs");
    assert_eq!(
        running_per_zone(),
        BTreeMap::from([
            ("westeurope-1".to_string(), 4),
            ("westeurope-2".to_string(), 4),
            ("westeurope-3".to_string(), 4),
        ])
    );
    for g in ["r1", "r2", "r3"] {
        assert_eq!(c.capacity_puts(g), 1, "{g}: one write");
    }
    c.stop().await;
}

// --- on a real kube-apiserver -------------------------------------------------------------------

/// The label (and taint) key that keeps this test's nodes and pods to themselves on a shared
/// server: its pods select its nodes, its nodes are tainted against everybody else's pods.
const MARK: &str = "runaway-test";

/// Plays kubelet for the three scale sets: a Ready Node for every instance (ids `0..capacity`:
/// nothing scales in here), in the zone its group's tag names, with the D4s_v5's allocatable,
/// this run's label and taint, and without the `not-ready` taint admission puts on a new Node.
async fn kubelet(c: &Cluster, client: &kube::Client, run: &str) {
    use vmss_capacity_controller::emulator::sim::nodes::{node_name, provider_id};
    use vmss_capacity_controller::emulator::sim::sizes::allocatable;
    let api: Api<Node> = Api::all(client.clone());
    let a = allocatable(SIZE, 110);
    for z in 1..=3 {
        let group = format!("r{z}");
        for id in 0..c.capacity(&group).max(0) as u64 {
            let name = node_name(&group, id);
            if api.get_opt(&name).await.ok().flatten().is_some() {
                continue;
            }
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "node.kubernetes.io/instance-type": SIZE,
                    "topology.kubernetes.io/region": "westeurope",
                    ZONE: format!("westeurope-{z}"), MARK: run}},
                "spec": {"providerID": provider_id(SUB, RG, &group, id),
                    "taints": [{"key": MARK, "value": run, "effect": "NoSchedule"}]},
            }))
            .unwrap();
            if api.create(&PostParams::default(), &node).await.is_err() {
                continue;
            }
            let now = time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap();
            let resources = json!({"cpu": format!("{}m", a.cpu_milli),
                "memory": format!("{}", a.memory_bytes), "pods": "110"});
            let status = json!({"status": {"allocatable": resources, "capacity": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("node status");
            let taints =
                json!({"spec": {"taints": [{"key": MARK, "value": run, "effect": "NoSchedule"}]}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&taints))
                .await
                .expect("node taints");
        }
    }
}

/// Plays kube-scheduler for this run's pods: each pod not bound goes to the first of this run's
/// nodes with room for it whose zone keeps the spread within `maxSkew: 1` (the domains are the
/// zones of this run's nodes); one with no such node is marked `PodScheduled=False`
/// (`Unschedulable`), as kube-scheduler marks it. Returns how many are bound.
async fn schedule(client: &kube::Client, ns: &str, run: &str) -> usize {
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{MARK}={run}")))
        .await
        .expect("nodes")
        .items;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pods = pods_api
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items;
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let zone_of: BTreeMap<String, String> = nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            let zone = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ZONE))
                .cloned()
                .unwrap_or_default();
            (name, zone)
        })
        .collect();
    // This run's pods have one container each, of POD_CPU.
    let cpu_milli = |_: &Pod| -> i64 { POD_CPU_MILLI };
    let room =
        vmss_capacity_controller::emulator::sim::sizes::allocatable(SIZE, 110).cpu_milli as i64;
    let mut used: BTreeMap<String, i64> = zone_of.keys().map(|n| (n.clone(), 0)).collect();
    let mut per_zone: BTreeMap<String, i64> = zone_of.values().map(|z| (z.clone(), 0)).collect();
    let mut bound = 0;
    for p in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *used.entry(node.clone()).or_default() += cpu_milli(p);
            *per_zone
                .entry(zone_of.get(&node).cloned().unwrap_or_default())
                .or_default() += 1;
            bound += 1;
        }
    }
    for p in pods.iter().filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
    }) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let min = per_zone.values().copied().min().unwrap_or(0);
        let fits = zone_of.iter().find(|(node, zone)| {
            used[*node] + cpu_milli(p) <= room && per_zone[*zone] + 1 - min <= 1
        });
        match fits.map(|(n, z)| (n.clone(), z.clone())) {
            Some((node, zone)) => {
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                let req =
                    http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{name}/binding"))
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(binding.to_string().into_bytes())
                        .unwrap();
                if client.request_text(req).await.is_err() {
                    continue;
                }
                let running = json!({"status": {"phase": "Running", "conditions": [
                    {"type": "PodScheduled", "status": "True"}]}});
                let _ = pods_api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&running))
                    .await;
                *used.get_mut(&node).unwrap() += cpu_milli(p);
                *per_zone.get_mut(&zone).unwrap() += 1;
                bound += 1;
            }
            None => {
                let marked = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    });
                if !marked {
                    let why = json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                        "reason": "Unschedulable",
                        "message": format!("0/{} nodes are available: Insufficient cpu or topology spread constraints", nodes.len())}]}});
                    let _ = pods_api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&why))
                        .await;
                }
            }
        }
    }
    bound
}

/// Deletes the Nodes an earlier run of this test left (Nodes are cluster-wide and outlive a
/// namespace).
async fn delete_test_nodes(client: &kube::Client) {
    let api: Api<Node> = Api::all(client.clone());
    if let Ok(list) = api.list(&ListParams::default().labels(MARK)).await {
        for n in list.items {
            let _ = api
                .delete(
                    &n.metadata.name.unwrap_or_default(),
                    &DeleteParams::default(),
                )
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real kube-apiserver (KUBECONFIG); run by .ci/real-apiserver.sh"]
async fn on_a_real_api_server_regional_groups_with_zone_tags_grow_only_as_the_zone_spread_needs() {
    let client = crate::crd::real_client().await;
    delete_test_nodes(&client).await;
    let ns = crate::crd::namespace(&client, "runaway").await;
    let run = crate::crd::unique("r");
    let (label_tag, taint_tag) = (
        format!("k8s.io_cluster-autoscaler_node-template_label_{MARK}"),
        format!("k8s.io_cluster-autoscaler_node-template_taint_{MARK}"),
    );
    let tags: Vec<Vec<(String, String)>> = (1..=3)
        .map(|z| {
            vec![
                (ZONE_TAG.to_string(), format!("westeurope-{z}")),
                (label_tag.clone(), run.clone()),
                (taint_tag.clone(), format!("{run}:NoSchedule")),
            ]
        })
        .collect();
    let tag_refs: Vec<Vec<(&str, &str)>> = tags
        .iter()
        .map(|t| t.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .collect();
    let seeds: Vec<support::pod_cluster::Seed> = (0..3)
        .map(|i| (["r1", "r2", "r3"][i], SIZE, 1, tag_refs[i].as_slice()))
        .collect();
    let c = Cluster::start_on(&seeds, MAX, client.clone(), |s| {
        s.pod_demand.batch_idle = Duration::from_millis(800);
        s.pod_demand.batch_max = Duration::from_secs(5);
        s.scan_interval = Duration::from_secs(1);
    })
    .await;
    // The three live nodes, Ready, one per zone.
    kubelet(&c, &client, &run).await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"nodeSelector": {MARK: run},
                    "tolerations": [{"key": MARK, "operator": "Equal", "value": run, "effect": "NoSchedule"}],
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE,
                        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                    "containers": [{"name": "app", "image": "app",
                        "resources": {"requests": {"cpu": POD_CPU, "memory": "1Gi"}}}]}}},
    });
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(deployment).unwrap(),
    )
    .await
    .expect("deployment");
    // The test's kubelet and scheduler, until every pod is bound (at most 60 s).
    let mut bound = 0;
    let mut peak: Vec<i64> = sizes(&c);
    for _ in 0..300 {
        kubelet(&c, &client, &run).await;
        bound = schedule(&client, &ns, &run).await;
        peak = peak
            .iter()
            .zip(sizes(&c))
            .map(|(a, b)| (*a).max(b))
            .collect();
        if bound == REPLICAS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(bound, REPLICAS, "pods bound; sizes {:?}", sizes(&c));
    // A few more decisions with every pod running: nothing grows.
    for _ in 0..15 {
        kubelet(&c, &client, &run).await;
        schedule(&client, &ns, &run).await;
        peak = peak
            .iter()
            .zip(sizes(&c))
            .map(|(a, b)| (*a).max(b))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "runaway case on a real kube-apiserver: sizes {:?}, peak {peak:?}",
        sizes(&c)
    );
    assert_eq!(
        sizes(&c),
        [2, 2, 2],
        "growth exactly as the spread needs (peak {peak:?})"
    );
    c.stop().await;
    delete_test_nodes(&client).await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
