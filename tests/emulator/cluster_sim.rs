//! The emulator's cluster simulation: VMSS instances become Nodes (named and labelled as AKS
//! does), a simple scheduler binds pending pods or marks them Unschedulable, deleted instances
//! take their Nodes and pods, ReplicaSets and DaemonSets keep their pods, evictions respect
//! PodDisruptionBudgets. Real time, but short: a 200 ms boot delay and bounded polling.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use vmss_capacity_controller::emulator::kube::KubeState;
use vmss_capacity_controller::emulator::sim::{PodTemplate, SimSettings, FAILURE_BACKOFF};
use vmss_capacity_controller::emulator::{
    AgentPoolSeed, ClusterSeed, EmulatorBuilder, EmulatorHandle, ScaleSetSeed,
};

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "rg";
const BOOT: Duration = Duration::from_millis(200);
const PATIENCE: Duration = Duration::from_secs(10);

async fn start() -> (EmulatorHandle, KubeState) {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .cluster_simulation(SimSettings {
            boot_delay: BOOT,
            tick: Duration::from_millis(20),
        })
        .start()
        .await
        .expect("emulator starts");
    let kube = handle.kube().expect("kubernetes side on");
    (handle, kube)
}

/// Polls `check` until it gives a value, for at most [`PATIENCE`].
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn seed(handle: &EmulatorHandle, name: &str, sku: &str, capacity: i64) {
    let mut s = ScaleSetSeed::new(SUB, RG, name, capacity);
    s.sku_name = sku.to_string();
    handle.state().seed_scale_set(s);
}

fn pods_of(kube: &KubeState, owner: &str) -> Vec<Value> {
    kube.list_all("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| {
            p.pointer("/metadata/ownerReferences/0/name")
                .and_then(Value::as_str)
                == Some(owner)
        })
        .collect()
}

fn node_of(pod: &Value) -> Option<String> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn scheduled_condition(pod: &Value) -> Option<Value> {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .cloned()
}

fn name(obj: &Value) -> String {
    obj["metadata"]["name"].as_str().unwrap_or("").to_string()
}

fn ready(node: &Value) -> Option<bool> {
    let c = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some(c["status"] == "True")
}

/// The pods of `owner`, once `want` of them are bound, with the nodes they are on.
async fn bound_pods(kube: &KubeState, owner: &str, want: usize) -> Vec<(String, String)> {
    eventually(&format!("{want} bound pods of {owner}"), || {
        let bound: Vec<(String, String)> = pods_of(kube, owner)
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| node_of(p).map(|n| (name(p), n)))
            .collect();
        (bound.len() == want).then_some(bound)
    })
    .await
}

#[tokio::test]
async fn an_instance_becomes_a_ready_node_with_an_aks_like_name_and_provider_id_after_the_boot_delay(
) {
    let (handle, kube) = start().await;
    let state = handle.state();
    state
        .seed_cluster(ClusterSeed::new(
            SUB,
            RG,
            "c",
            vec![AgentPoolSeed::new("gpu", 1)
                .vm_size("Standard_NC6s_v3")
                .node_taint("sku=gpu:NoSchedule")
                .node_label("team", "ml")],
        ))
        .expect("cluster seeded");
    let pool = state.agent_pool(SUB, RG, "c", "gpu").expect("pool exists");
    let expected = format!("{}000000", pool.scale_set_name);
    assert!(expected.starts_with("aks-gpu-") && expected.ends_with("-vmss000000"));

    let booting = eventually("the node to register", || {
        kube.get("v1", "nodes", "", &expected).ok()
    })
    .await;
    assert_eq!(ready(&booting), Some(false), "a new node is not Ready yet");
    let node = eventually("the node to turn Ready", || {
        kube.get("v1", "nodes", "", &expected)
            .ok()
            .filter(|n| ready(n) == Some(true))
    })
    .await;

    assert_eq!(
        node["spec"]["providerID"],
        format!(
            "azure:///subscriptions/{SUB}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{}/virtualMachines/0",
            pool.scale_set_resource_group, pool.scale_set_name
        )
    );
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], expected.as_str());
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(
        labels["node.kubernetes.io/instance-type"],
        "Standard_NC6s_v3"
    );
    assert_eq!(labels["kubernetes.azure.com/agentpool"], "gpu");
    assert_eq!(labels["team"], "ml");
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]),
        "the pool's taint stays and the not-ready taint is gone"
    );
    assert_eq!(node["status"]["allocatable"]["cpu"], "5900m");
    assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "1");
    assert_eq!(node["status"]["allocatable"]["pods"], "110");

    // A plain scale set: its lowercased name, its template tags, no agent pool.
    let mut plain = ScaleSetSeed::new(SUB, RG, "Workers", 1);
    plain.tags = BTreeMap::from([
        (
            "k8s.io_cluster-autoscaler_node-template_label_example.com_disk~2type".to_string(),
            "ssd".to_string(),
        ),
        (
            "k8s.io_cluster-autoscaler_node-template_taint_dedicated".to_string(),
            "batch:NoExecute".to_string(),
        ),
        (
            "k8s.io_cluster-autoscaler_node-template_resources_nvidia.com_gpu".to_string(),
            "2".to_string(),
        ),
    ]);
    state.seed_scale_set(plain);
    let worker = eventually("the plain scale set's node", || {
        kube.get("v1", "nodes", "", "workers000000").ok()
    })
    .await;
    assert_eq!(worker["metadata"]["labels"]["example.com/disk_type"], "ssd");
    assert!(worker["metadata"]["labels"]
        .get("kubernetes.azure.com/agentpool")
        .is_none());
    assert_eq!(worker["status"]["allocatable"]["nvidia.com/gpu"], "2");
    assert_eq!(worker["status"]["allocatable"]["memory"], "7340032Ki");
    assert!(worker["spec"]["taints"].as_array().is_some_and(
        |ts| ts.contains(&json!({"key": "dedicated", "value": "batch", "effect": "NoExecute"}))
    ));
    assert_eq!(
        kube.nodes_by_scale_set().get("Workers"),
        Some(&vec!["workers000000".to_string()])
    );
}

#[tokio::test]
async fn a_pod_that_fits_is_bound_one_that_does_not_is_unschedulable_and_is_bound_once_a_node_is_added(
) {
    let (handle, kube) = start().await;
    seed(&handle, "small", "Standard_D2s_v5", 1);
    kube.create_replica_set("default", "fits", 1, &PodTemplate::new("500m", "1Gi"))
        .expect("rs created");
    kube.create_replica_set("default", "big", 1, &PodTemplate::new("3", "1Gi"))
        .expect("rs created");

    let fits = bound_pods(&kube, "fits", 1).await;
    assert_eq!(fits[0].1, "small000000");
    let pending = eventually("the big pod to be marked unschedulable", || {
        pods_of(&kube, "big")
            .into_iter()
            .find(|p| scheduled_condition(p).is_some_and(|c| c["status"] == "False"))
    })
    .await;
    let cond = scheduled_condition(&pending).expect("condition present");
    assert_eq!(cond["reason"], "Unschedulable");
    assert_eq!(
        cond["message"],
        "0/1 nodes are available: 1 Insufficient cpu."
    );
    assert_eq!(kube.pod_counts(Some("default")).pending, 1);

    // The condition is written once, not on every tick.
    let rv = pending["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = kube
        .get("v1", "pods", "default", &name(&pending))
        .expect("pod still there");
    assert_eq!(again["metadata"]["resourceVersion"], rv);

    seed(&handle, "large", "Standard_D4s_v5", 1);
    let big = bound_pods(&kube, "big", 1).await;
    assert_eq!(big[0], (name(&pending), "large000000".to_string()));
    let bound = kube
        .get("v1", "pods", "default", &big[0].0)
        .expect("pod exists");
    assert_eq!(
        scheduled_condition(&bound).map(|c| c["status"].clone()),
        Some(json!("True"))
    );
    assert_eq!(kube.pod_counts(Some("default")).running, 2);
}

#[tokio::test]
async fn a_tainted_gpu_scale_sets_node_only_gets_pods_that_tolerate_the_taint() {
    let (handle, kube) = start().await;
    handle
        .state()
        .seed_cluster(ClusterSeed::new(
            SUB,
            RG,
            "c",
            vec![
                AgentPoolSeed::new("system", 1),
                AgentPoolSeed::new("gpu", 1)
                    .vm_size("Standard_NC6s_v3")
                    .node_taint("sku=gpu:NoSchedule"),
            ],
        ))
        .expect("cluster seeded");
    let gpu_set = handle
        .state()
        .agent_pool(SUB, RG, "c", "gpu")
        .expect("pool")
        .scale_set_name;
    eventually("two ready nodes", || {
        (kube.ready_nodes().len() == 2).then_some(())
    })
    .await;

    kube.create_replica_set("default", "web", 2, &PodTemplate::new("1500m", "1Gi"))
        .expect("rs created");
    kube.create_replica_set(
        "default",
        "train",
        1,
        &PodTemplate::new("1", "4Gi")
            .gpus(1)
            .tolerate("sku", "gpu", "NoSchedule"),
    )
    .expect("rs created");

    let web = bound_pods(&kube, "web", 1).await;
    assert!(web[0].1.starts_with("aks-system-"), "{web:?}");
    let train = bound_pods(&kube, "train", 1).await;
    assert_eq!(train[0].1, format!("{gpu_set}000000"));
    let refused = eventually("the second web pod to be unschedulable", || {
        pods_of(&kube, "web")
            .into_iter()
            .find_map(|p| scheduled_condition(&p).filter(|c| c["status"] == "False"))
    })
    .await;
    assert_eq!(
        refused["message"],
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {sku: gpu}."
    );
}

#[tokio::test]
async fn deleting_an_instance_removes_its_node_and_pods_and_the_replica_set_recreates_them_pending()
{
    let (handle, kube) = start().await;
    // One node first, so both pods land on it (the scheduler spreads pods over empty nodes).
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    kube.create_replica_set("default", "app", 2, &PodTemplate::new("1", "1Gi"))
        .expect("rs created");
    let before = bound_pods(&kube, "app", 2).await;
    assert!(before.iter().all(|(_, n)| n == "pool000000"), "{before:?}");
    handle
        .state()
        .rival_set_capacity(SUB, RG, "pool", 2, "rival")
        .expect("capacity set");
    eventually("a second node", || {
        kube.get("v1", "nodes", "", "pool000001").ok().map(|_| ())
    })
    .await;

    // Lowering the capacity removes the newest instance, which runs nothing.
    handle
        .state()
        .rival_set_capacity(SUB, RG, "pool", 1, "rival")
        .expect("capacity set");
    eventually("the newest node to go", || {
        kube.get("v1", "nodes", "", "pool000001")
            .is_err()
            .then_some(())
    })
    .await;
    assert_eq!(bound_pods(&kube, "app", 2).await.len(), 2);

    handle
        .state()
        .rival_set_capacity(SUB, RG, "pool", 0, "rival")
        .expect("capacity set");
    eventually("the last node to go", || {
        kube.get("v1", "nodes", "", "pool000000")
            .is_err()
            .then_some(())
    })
    .await;
    let replaced = eventually("two new pending pods", || {
        let pods = pods_of(&kube, "app");
        let fresh = pods
            .iter()
            .all(|p| before.iter().all(|(n, _)| *n != name(p)));
        let unbound = pods.iter().all(|p| node_of(p).is_none());
        (pods.len() == 2 && fresh && unbound).then_some(pods)
    })
    .await;
    for (old, _) in &before {
        assert!(
            kube.get("v1", "pods", "default", old).is_err(),
            "{old} is gone"
        );
    }
    let mut lost: Vec<(String, String, Option<String>)> = handle
        .pods_lost_with_nodes()
        .into_iter()
        .map(|l| (l.name, l.node, l.owner_kind))
        .collect();
    lost.sort();
    let mut expected: Vec<(String, String, Option<String>)> = before
        .iter()
        .map(|(p, n)| (p.clone(), n.clone(), Some("ReplicaSet".to_string())))
        .collect();
    expected.sort();
    assert_eq!(lost, expected, "the lost pods are reported with their node");
    assert_eq!(kube.pod_counts(Some("default")).pending, 2);
    let message = eventually("the pending pods' reason", || {
        replaced
            .iter()
            .filter_map(|p| kube.get("v1", "pods", "default", &name(p)).ok())
            .find_map(|p| scheduled_condition(&p))
    })
    .await;
    assert_eq!(message["message"], "no nodes available to schedule pods");
}

async fn evict(handle: &EmulatorHandle, kube: &KubeState, pod: &str) -> u16 {
    reqwest::Client::new()
        .post(format!(
            "{}/api/v1/namespaces/default/pods/{pod}/eviction",
            handle.base_url()
        ))
        .bearer_auth(kube.token())
        .json(&json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "default"}}))
        .send()
        .await
        .expect("eviction answered")
        .status()
        .as_u16()
}

#[tokio::test]
async fn an_eviction_refused_by_a_pdb_leaves_the_pod_and_an_allowed_one_is_recreated_by_its_replica_set(
) {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    kube.create_replica_set("default", "web", 2, &PodTemplate::new("100m", "128Mi"))
        .expect("rs created");
    let pods = bound_pods(&kube, "web", 2).await;
    let pdb = kube
        .create(
            "policy/v1",
            "poddisruptionbudgets",
            "default",
            json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}),
        )
        .expect("pdb created");

    let victim = &pods[0].0;
    assert_eq!(evict(&handle, &kube, victim).await, 429);
    assert!(kube.get("v1", "pods", "default", victim).is_ok());

    // The simulation's disruption controller writes the budget's status meanwhile: relax it as
    // a client would, read-modify-write again on a 409 (bounded).
    let _ = pdb;
    let mut relaxed_ok = false;
    for _ in 0..20 {
        let mut relaxed = kube
            .get("policy/v1", "poddisruptionbudgets", "default", "web")
            .expect("pdb read");
        relaxed["spec"]["minAvailable"] = json!(1);
        if kube
            .update("policy/v1", "poddisruptionbudgets", "default", relaxed)
            .is_ok()
        {
            relaxed_ok = true;
            break;
        }
    }
    assert!(relaxed_ok, "pdb relaxed");
    assert_eq!(evict(&handle, &kube, victim).await, 201);
    let after = eventually("the replica set to replace the evicted pod", || {
        let bound: Vec<String> = pods_of(&kube, "web")
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .map(name)
            .collect();
        (bound.len() == 2 && !bound.contains(victim)).then_some(bound)
    })
    .await;
    assert!(after.contains(&pods[1].0), "the other pod stayed");
    eventually("the replica set's status to count two ready pods", || {
        kube.get("apps/v1", "replicasets", "default", "web")
            .ok()
            .filter(|rs| rs["status"]["readyReplicas"] == 2)
    })
    .await;
}

#[tokio::test]
async fn a_daemon_set_puts_one_bound_pod_on_each_ready_node_whose_taints_it_tolerates() {
    let (handle, kube) = start().await;
    seed(&handle, "plain", "Standard_D2s_v5", 2);
    let mut tainted = ScaleSetSeed::new(SUB, RG, "tainted", 1);
    tainted.tags.insert(
        "k8s.io_cluster-autoscaler_node-template_taint_sku".to_string(),
        "gpu:NoSchedule".to_string(),
    );
    handle.state().seed_scale_set(tainted);
    kube.create_daemon_set("default", "agent", &PodTemplate::new("50m", "64Mi"))
        .expect("ds created");
    let mut on = bound_pods(&kube, "agent", 2).await;
    on.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        on.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>(),
        vec!["plain000000", "plain000001"]
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pods_of(&kube, "agent").len(), 2, "none on the tainted node");
    let ds = eventually("the daemon set's status", || {
        kube.get("apps/v1", "daemonsets", "default", "agent")
            .ok()
            .filter(|ds| ds["status"]["numberReady"] == 2)
    })
    .await;
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2);
}

#[tokio::test]
async fn lowering_a_pools_count_deleting_instances_or_the_scale_set_removes_their_nodes() {
    let (handle, kube) = start().await;
    let state = handle.state();
    state
        .seed_cluster(ClusterSeed::new(
            SUB,
            RG,
            "c",
            vec![
                AgentPoolSeed::new("system", 1),
                AgentPoolSeed::new("work", 3),
            ],
        ))
        .expect("cluster seeded");
    let work = state.agent_pool(SUB, RG, "c", "work").expect("pool");
    let count = |set: &str| kube.nodes_by_scale_set().get(set).map_or(0, Vec::len);
    eventually("three work nodes", || {
        (count(&work.scale_set_name) == 3).then_some(())
    })
    .await;

    state
        .rival_set_pool_count(SUB, RG, "c", "work", 1, "rival")
        .expect("count set");
    eventually("one work node", || {
        (count(&work.scale_set_name) == 1).then_some(())
    })
    .await;

    // The compute API's delete of named instances.
    seed(&handle, "plain", "Standard_D2s_v5", 3);
    eventually("three plain nodes", || (count("plain") == 3).then_some(())).await;
    let token = state.issue_token("tester");
    let status = reqwest::Client::new()
        .post(format!(
            "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/plain/delete?api-version=2024-07-01",
            handle.base_url()
        ))
        .bearer_auth(token)
        .json(&json!({"instanceIds": ["1"]}))
        .send()
        .await
        .expect("delete answered")
        .status()
        .as_u16();
    assert!(status == 200 || status == 202, "delete answered {status}");
    let left = eventually("the deleted instance's node to go", || {
        kube.nodes_by_scale_set()
            .get("plain")
            .filter(|names| names.len() == 2)
            .cloned()
    })
    .await;
    assert_eq!(left, vec!["plain000000", "plain000002"]);

    assert!(state.delete_out_of_band(SUB, RG, "plain"));
    eventually("the deleted scale set's nodes to go", || {
        (count("plain") == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn scaling_a_replica_set_through_its_scale_subresource_deletes_the_pending_pods_first() {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D2s_v5", 1);
    kube.create_replica_set("default", "web", 3, &PodTemplate::new("800m", "1Gi"))
        .expect("rs created");
    let running = bound_pods(&kube, "web", 2).await;
    eventually("one pending pod", || {
        (kube.pod_counts(Some("default")).pending == 1).then_some(())
    })
    .await;

    let url = format!(
        "{}/apis/apps/v1/namespaces/default/replicasets/web/scale",
        handle.base_url()
    );
    let scale: Value = reqwest::Client::new()
        .patch(&url)
        .bearer_auth(kube.token())
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": 2}}).to_string())
        .send()
        .await
        .expect("scale answered")
        .json()
        .await
        .expect("a Scale body");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");

    eventually("the pending pod to go", || {
        let pods = pods_of(&kube, "web");
        (pods.len() == 2).then_some(())
    })
    .await;
    let mut left: Vec<(String, String)> = bound_pods(&kube, "web", 2).await;
    let mut before = running;
    left.sort();
    before.sort();
    assert_eq!(left, before, "the two running pods stayed");

    kube.scale_replica_set("default", "web", 3)
        .expect("scaled through the Rust API");
    eventually("a third pod, pending again", || {
        (pods_of(&kube, "web").len() == 3 && kube.pod_counts(Some("default")).pending == 1)
            .then_some(())
    })
    .await;
}

/// The ReplicaSet controller's order (1.22 on): a lower `controller.kubernetes.io/pod-deletion-cost`
/// goes before a pod doubled up on a node with more of the set's pods.
#[tokio::test]
async fn a_replica_set_scaling_in_deletes_the_pod_of_the_lowest_deletion_cost_before_a_doubled_up_one(
) {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D2s_v5", 2);
    ready_nodes(&kube, 2).await;
    kube.create_replica_set("default", "web", 3, &PodTemplate::new("800m", "1Gi"))
        .expect("rs created");
    let bound = bound_pods(&kube, "web", 3).await;
    let mut per_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (pod, node) in &bound {
        per_node.entry(node).or_default().push(pod);
    }
    let alone = per_node
        .values()
        .find(|pods| pods.len() == 1)
        .expect("two pods on one node, one on the other")[0]
        .to_string();
    let mut pod = kube.get("v1", "pods", "default", &alone).expect("the pod");
    pod["metadata"]["annotations"] = json!({"controller.kubernetes.io/pod-deletion-cost": "-1"});
    kube.update("v1", "pods", "default", pod)
        .expect("annotated");
    kube.scale_replica_set("default", "web", 2)
        .expect("scaled in");
    let left = eventually("two pods left", || {
        let pods = pods_of(&kube, "web");
        (pods.len() == 2).then(|| pods.iter().map(name).collect::<Vec<_>>())
    })
    .await;
    assert!(
        !left.contains(&alone),
        "the pod of cost -1 went, not one of the doubled-up pair: {left:?}"
    );
}

#[tokio::test]
async fn pods_avoid_a_node_soft_tainted_prefer_no_schedule_unless_they_tolerate_it_or_nothing_else_fits(
) {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 2);
    ready_nodes(&kube, 2).await;
    // One pod first: least-allocated scoring then prefers the other, empty, node.
    kube.create_replica_set("default", "first", 1, &PodTemplate::new("500m", "1Gi"))
        .expect("rs created");
    let first = bound_pods(&kube, "first", 1).await[0].1.clone();
    let nodes: Vec<String> = kube.ready_nodes();
    let empty = nodes
        .iter()
        .find(|n| **n != first)
        .expect("two nodes")
        .clone();
    let mut node = kube.get("v1", "nodes", "", &empty).expect("the node");
    node["spec"]["taints"] =
        json!([{"key": "candidate", "value": "1", "effect": "PreferNoSchedule"}]);
    kube.update("v1", "nodes", "", node).expect("soft-tainted");
    // kube-scheduler's TaintToleration (weight 3) outweighs LeastAllocated (weight 1).
    kube.create_replica_set("default", "next", 2, &PodTemplate::new("500m", "1Gi"))
        .expect("rs created");
    for (pod, on) in bound_pods(&kube, "next", 2).await {
        assert_eq!(on, first, "{pod} went to the soft-tainted node");
    }
    kube.create_replica_set(
        "default",
        "tolerant",
        1,
        &PodTemplate::new("500m", "1Gi").tolerate("candidate", "1", "PreferNoSchedule"),
    )
    .expect("rs created");
    let tolerant = bound_pods(&kube, "tolerant", 1).await;
    assert_eq!(
        tolerant[0].1, empty,
        "a pod tolerating the taint goes by room"
    );
    // Only the soft-tainted node has room: the taint filters nothing.
    kube.create_replica_set("default", "big", 1, &PodTemplate::new("3", "1Gi"))
        .expect("rs created");
    let big = bound_pods(&kube, "big", 1).await;
    assert_eq!(big[0].1, empty);
}

#[tokio::test]
async fn without_the_simulation_instances_make_no_nodes() {
    let handle = EmulatorBuilder::new()
        .kubernetes(true)
        .start()
        .await
        .expect("emulator starts");
    let kube = handle.kube().expect("kubernetes side on");
    seed(&handle, "pool", "Standard_D2s_v5", 2);
    kube.create_replica_set("default", "web", 1, &PodTemplate::new("100m", "64Mi"))
        .expect("rs created");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(kube.list_all("v1", "nodes", None).is_empty());
    assert!(kube.list_all("v1", "pods", None).is_empty());
}

#[tokio::test]
async fn deleting_an_agent_pool_machine_by_its_node_name_removes_exactly_that_node() {
    let (handle, kube) = start().await;
    let state = handle.state();
    state
        .seed_cluster(ClusterSeed::new(
            SUB,
            RG,
            "c",
            vec![
                AgentPoolSeed::new("system", 1),
                AgentPoolSeed::new("work", 3),
            ],
        ))
        .expect("cluster seeded");
    let work = state.agent_pool(SUB, RG, "c", "work").expect("pool");
    let nodes = eventually("three work nodes", || {
        kube.nodes_by_scale_set()
            .get(&work.scale_set_name)
            .filter(|names| names.len() == 3)
            .cloned()
    })
    .await;
    let victim = nodes[1].clone();

    let token = state.issue_token("tester");
    let rsp = reqwest::Client::new()
        .post(format!(
            "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/c/agentPools/work/deleteMachines?api-version=2024-09-01",
            handle.base_url()
        ))
        .bearer_auth(token)
        .header("If-Match", work.etag.as_str())
        .json(&json!({"machineNames": [victim.as_str()]}))
        .send()
        .await
        .expect("deleteMachines answered");
    assert_eq!(rsp.status().as_u16(), 202);

    let left = eventually("the deleted machine's node to go", || {
        kube.nodes_by_scale_set()
            .get(&work.scale_set_name)
            .filter(|names| names.len() == 2)
            .cloned()
    })
    .await;
    assert_eq!(left, vec![nodes[0].clone(), nodes[2].clone()]);
    let after = state.agent_pool(SUB, RG, "c", "work").expect("pool");
    assert_eq!(after.count, 2);
    assert_ne!(after.etag, work.etag, "the pool has a new ETag");
    assert!(state.lost_updates().is_empty());
}

const ZONE: &str = "topology.kubernetes.io/zone";

/// Scale set `name` of `capacity` Standard_D2s_v5 instances in availability zone `zone`.
fn seed_zonal(handle: &EmulatorHandle, name: &str, zone: &str, capacity: i64) {
    let mut s = ScaleSetSeed::new(SUB, RG, name, capacity);
    s.sku_name = "Standard_D2s_v5".into();
    s.zones = vec![zone.to_string()];
    handle.state().seed_scale_set(s);
}

/// Waits until `n` nodes are Ready.
async fn ready_nodes(kube: &KubeState, n: usize) {
    eventually(&format!("{n} Ready nodes"), || {
        let ready = kube
            .list_all("v1", "nodes", None)
            .iter()
            .filter(|node| ready(node) == Some(true))
            .count();
        (ready == n).then_some(())
    })
    .await;
}

/// The zone label of node `node`.
fn zone_of(kube: &KubeState, node: &str) -> String {
    kube.get("v1", "nodes", "", node).expect("node")["metadata"]["labels"][ZONE]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The message of the pod of `owner` marked Unschedulable, once there is one.
async fn unschedulable_message(kube: &KubeState, owner: &str) -> String {
    eventually("a pod marked unschedulable", || {
        pods_of(kube, owner).into_iter().find_map(|p| {
            scheduled_condition(&p)
                .filter(|c| c["status"] == "False")
                .and_then(|c| c["message"].as_str().map(str::to_string))
        })
    })
    .await
}

#[tokio::test]
async fn zone_spread_pods_keep_within_max_skew_and_wait_for_room_in_the_emptiest_zone() {
    let (handle, kube) = start().await;
    for (name, zone) in [("z1", "1"), ("z2", "2"), ("z3", "3")] {
        seed_zonal(&handle, name, zone, 1);
    }
    ready_nodes(&kube, 3).await;
    // Zone 3's node is full.
    let z3 = zone_of(&kube, "z3000000");
    kube.create_replica_set(
        "default",
        "big",
        1,
        &PodTemplate::new("1500m", "1Gi").node_selector(ZONE, &z3),
    )
    .expect("rs created");
    bound_pods(&kube, "big", 1).await;
    // Three pods spread over zones with maxSkew 1: one in z1, one in z2, and the third may go
    // to neither while z3 has none.
    kube.create_replica_set(
        "default",
        "spread",
        3,
        &PodTemplate::new("500m", "256Mi").spread_by(ZONE, 1, "spread"),
    )
    .expect("rs created");
    let placed = bound_pods(&kube, "spread", 2).await;
    let mut zones: Vec<String> = placed.iter().map(|(_, n)| zone_of(&kube, n)).collect();
    zones.sort();
    assert_ne!(zones[0], zones[1], "one per zone: {placed:?}");
    assert_eq!(
        unschedulable_message(&kube, "spread").await,
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match pod topology spread constraints."
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(kube.pod_counts(Some("default")).pending, 1, "still waiting");

    // A second node in zone 3 takes it.
    handle
        .state()
        .rival_set_capacity(SUB, RG, "z3", 2, "operator")
        .expect("z3 grows");
    let all = bound_pods(&kube, "spread", 3).await;
    let in_z3: Vec<_> = all
        .iter()
        .filter(|(_, n)| zone_of(&kube, n) == z3)
        .collect();
    assert_eq!(in_z3.len(), 1, "{all:?}");
}

#[tokio::test]
async fn hostname_anti_affinity_puts_one_pod_per_node_and_the_rest_wait_with_the_schedulers_words()
{
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 2);
    kube.create_replica_set(
        "default",
        "solo",
        3,
        &PodTemplate::new("100m", "128Mi").anti_affinity_by("kubernetes.io/hostname", "solo"),
    )
    .expect("rs created");
    let placed = bound_pods(&kube, "solo", 2).await;
    assert_ne!(placed[0].1, placed[1].1, "{placed:?}");
    assert_eq!(
        unschedulable_message(&kube, "solo").await,
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    );
}

/// A pod `name` in `default` using claim `claim`, bound to nothing.
fn claim_pod(name: &str, claim: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "containers": [{"name": "main", "image": "pause",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    })
}

fn claim(name: &str, class: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "8Gi"}}},
    })
}

fn pod_node(kube: &KubeState, name: &str) -> Option<String> {
    kube.get("v1", "pods", "default", name)
        .ok()
        .as_ref()
        .and_then(node_of)
}

#[tokio::test]
async fn a_disk_made_for_the_first_consumer_lives_in_its_zone_and_pins_the_pods_that_follow() {
    let (handle, kube) = start().await;
    for (name, zone) in [("z1", "1"), ("z2", "2")] {
        seed_zonal(&handle, name, zone, 1);
    }
    ready_nodes(&kube, 2).await;
    kube.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        json!({"metadata": {"name": "managed-csi"}, "provisioner": "disk.csi.azure.com",
            "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .expect("class");
    kube.create(
        "v1",
        "persistentvolumeclaims",
        "default",
        claim("data", "managed-csi"),
    )
    .expect("claim");
    kube.create("v1", "pods", "default", claim_pod("db", "data"))
        .expect("pod");
    let first = eventually("db bound", || pod_node(&kube, "db")).await;
    let zone = zone_of(&kube, &first);
    let bound = kube
        .get("v1", "persistentvolumeclaims", "default", "data")
        .expect("claim");
    let pv_name = bound["spec"]["volumeName"]
        .as_str()
        .expect("bound")
        .to_string();
    assert_eq!(bound["status"]["phase"], "Bound");
    let pv = kube
        .get("v1", "persistentvolumes", "", &pv_name)
        .expect("pv");
    assert_eq!(
        pv.pointer("/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0"),
        Some(
            &json!({"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": [zone]})
        ),
        "{pv:#}"
    );

    // The pod goes; its successor may only run where the disk is, even when that node is the
    // fuller one.
    kube.create_replica_set(
        "default",
        "filler",
        1,
        &PodTemplate::new("1", "1Gi").node_selector("kubernetes.io/hostname", &first),
    )
    .expect("filler");
    bound_pods(&kube, "filler", 1).await;
    kube.delete("v1", "pods", "default", "db").expect("deleted");
    eventually("db gone", || pod_node(&kube, "db").is_none().then_some(())).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    kube.create("v1", "pods", "default", claim_pod("db", "data"))
        .expect("pod again");
    let again = eventually("db bound again", || pod_node(&kube, "db")).await;
    assert_eq!(again, first, "where its disk is");

    // A claim that names no claim there, and one of an Immediate class pinned to zone 2.
    kube.create("v1", "pods", "default", claim_pod("orphan", "nope"))
        .expect("pod");
    let message = eventually("orphan marked", || {
        let p = kube.get("v1", "pods", "default", "orphan").ok()?;
        scheduled_condition(&p)?["message"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert_eq!(
        message,
        "0/2 nodes are available: persistentvolumeclaim \"nope\" not found."
    );
    let z2 = zone_of(&kube, "z2000000");
    kube.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        json!({"metadata": {"name": "zone2-now"}, "provisioner": "disk.csi.azure.com",
            "volumeBindingMode": "Immediate",
            "allowedTopologies": [{"matchLabelExpressions": [
                {"key": "topology.disk.csi.azure.com/zone", "values": [z2]}]}]}),
    )
    .expect("class");
    kube.create(
        "v1",
        "persistentvolumeclaims",
        "default",
        claim("logs", "zone2-now"),
    )
    .expect("claim");
    kube.create("v1", "pods", "default", claim_pod("logger", "logs"))
        .expect("pod");
    let node = eventually("logger bound", || pod_node(&kube, "logger")).await;
    assert_eq!(zone_of(&kube, &node), z2);
}

#[tokio::test]
async fn a_node_has_a_csinode_with_its_sizes_disk_limit_and_takes_no_pod_past_it() {
    let (handle, kube) = start().await;
    seed(&handle, "small", "Standard_D2s_v5", 1);
    let csi = eventually("the node's CSINode", || {
        kube.get("storage.k8s.io/v1", "csinodes", "", "small000000")
            .ok()
    })
    .await;
    let disk = csi["spec"]["drivers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "disk.csi.azure.com")
        .cloned()
        .expect("the Azure Disk driver");
    assert_eq!(
        disk["allocatable"]["count"], 4,
        "a D2s_v5 attaches 4 data disks"
    );
    assert_eq!(csi["metadata"]["ownerReferences"][0]["kind"], "Node");

    kube.create(
        "storage.k8s.io/v1",
        "storageclasses",
        "",
        json!({"metadata": {"name": "managed-csi"}, "provisioner": "disk.csi.azure.com",
            "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .expect("class");
    for i in 0..5 {
        kube.create(
            "v1",
            "persistentvolumeclaims",
            "default",
            claim(&format!("data-{i}"), "managed-csi"),
        )
        .expect("claim");
        kube.create(
            "v1",
            "pods",
            "default",
            claim_pod(&format!("db-{i}"), &format!("data-{i}")),
        )
        .expect("pod");
    }
    let bound = eventually("four bound", || {
        let n = (0..5)
            .filter(|i| pod_node(&kube, &format!("db-{i}")).is_some())
            .count();
        (n == 4).then_some(n)
    })
    .await;
    assert_eq!(bound, 4);
    let waiting = (0..5)
        .map(|i| format!("db-{i}"))
        .find(|p| pod_node(&kube, p).is_none())
        .expect("one waits");
    let message = eventually("the fifth marked", || {
        let p = kube.get("v1", "pods", "default", &waiting).ok()?;
        scheduled_condition(&p)?["message"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    assert_eq!(
        message,
        "0/1 nodes are available: 1 node(s) exceed max volume count."
    );

    // The CSINode goes with its node.
    handle
        .state()
        .rival_set_capacity(SUB, RG, "small", 0, "operator")
        .expect("scaled in");
    eventually("the CSINode gone", || {
        kube.get("storage.k8s.io/v1", "csinodes", "", "small000000")
            .is_err()
            .then_some(())
    })
    .await;
}

/// The two tables are written apart (the simulation must not share the planner's code); the
/// attach limits they give must still be Azure's, so they agree.
#[test]
fn the_simulations_disk_limits_agree_with_the_planners_table() {
    use vmss_capacity_controller::emulator::sim::sizes::max_data_disks;
    for size in [
        "Standard_D2s_v5",
        "Standard_D4s_v5",
        "Standard_D8s_v5",
        "Standard_E4s_v5",
        "Standard_E8s_v5",
        "Standard_NC6s_v3",
        "Standard_NC24ads_A100_v4",
    ] {
        let planner = vmss_capacity_controller::pods::template::vm_size(size)
            .unwrap_or_else(|| panic!("{size} in the planner's table"))
            .max_data_disks;
        assert_eq!(max_data_disks(size), i64::from(planner), "{size}");
    }
}

#[tokio::test]
async fn a_deployment_owns_one_replica_set_per_template_and_a_new_template_replaces_its_pods() {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    let deployment = |image: &str| {
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": image,
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}},
        })
    };
    kube.create("apps/v1", "deployments", "default", deployment("web:1"))
        .expect("created");
    let sets = || {
        kube.list_all("apps/v1", "replicasets", Some("default"))
            .into_iter()
            .map(|rs| name(&rs))
            .collect::<Vec<_>>()
    };
    let first = eventually("one ReplicaSet", || {
        let s = sets();
        (s.len() == 1).then(|| s[0].clone())
    })
    .await;
    assert!(first.starts_with("web-"), "{first}");
    let old_pods = bound_pods(&kube, &first, 2).await;

    // A new image: a new ReplicaSet, the old one and its pods go.
    let mut d = kube
        .get("apps/v1", "deployments", "default", "web")
        .expect("read");
    d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("web:2");
    kube.update("apps/v1", "deployments", "default", d)
        .expect("updated");
    let second = eventually("the new ReplicaSet alone", || {
        let s = sets();
        (s.len() == 1 && s[0] != first).then(|| s[0].clone())
    })
    .await;
    let new_pods = bound_pods(&kube, &second, 2).await;
    eventually("the old pods gone", || {
        old_pods
            .iter()
            .all(|(p, _)| kube.get("v1", "pods", "default", p).is_err())
            .then_some(())
    })
    .await;
    let rs = kube
        .get("apps/v1", "replicasets", "default", &second)
        .expect("rs");
    assert_eq!(rs["metadata"]["ownerReferences"][0]["kind"], "Deployment");
    let hash = rs["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap();
    assert_eq!(second, format!("web-{hash}"));
    assert_eq!(new_pods.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_simulated_node_reports_every_node_info_field_and_a_bound_pod_runs_with_its_ips_and_ready_containers(
) {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    kube.create_replica_set("default", "web", 1, &PodTemplate::new("100m", "128Mi"))
        .expect("rs created");
    let bound = bound_pods(&kube, "web", 1).await;
    let node = kube
        .get("v1", "nodes", "", &bound[0].1)
        .expect("the pod's node exists");
    let info = &node["status"]["nodeInfo"];
    for field in [
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeletVersion",
        "kubeProxyVersion",
        "operatingSystem",
        "architecture",
    ] {
        assert!(
            info[field].as_str().is_some_and(|v| !v.is_empty()),
            "nodeInfo.{field} is reported: {info}"
        );
    }
    assert_eq!(
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        0
    );
    let node_ip = node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP"))
        .map(|x| x["address"].clone())
        .expect("an InternalIP");

    let pod = eventually("the bound pod to run", || {
        kube.get("v1", "pods", "default", &bound[0].0)
            .ok()
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let status = &pod["status"];
    assert_eq!(status["hostIP"], node_ip);
    let ip = status["podIP"].as_str().expect("a pod IP");
    assert!(ip.starts_with("10.244."), "{ip}");
    assert_eq!(status["podIPs"], json!([{"ip": ip}]));
    let containers = status["containerStatuses"]
        .as_array()
        .expect("container statuses");
    assert_eq!(
        containers.len(),
        pod["spec"]["containers"].as_array().map_or(0, Vec::len)
    );
    for c in containers {
        assert_eq!(c["ready"], true);
        assert_eq!(c["started"], true);
        assert_eq!(c["restartCount"], 0);
        assert!(c["state"]["running"]["startedAt"].is_string(), "{c}");
        assert_eq!(c["lastState"], json!({}));
        assert!(c["imageID"].is_string() && c["image"].is_string());
    }
}

fn phase_of(kube: &KubeState, pod: &str) -> Option<String> {
    kube.get("v1", "pods", "default", pod)
        .ok()
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_string))
}

#[tokio::test(start_paused = true)]
async fn a_jobs_pods_succeed_after_their_run_and_an_evicted_one_is_replaced_after_the_backoff_and_runs_again_from_the_start(
) {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    let run = Duration::from_secs(600);
    kube.create_job(
        "default",
        "batch",
        2,
        &PodTemplate::new("500m", "512Mi").runs_for(run),
    )
    .expect("job created");
    let pods = bound_pods(&kube, "batch", 2).await;
    let started = tokio::time::Instant::now();
    let pod = kube.get("v1", "pods", "default", &pods[0].0).expect("pod");
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["apiVersion"],
        "batch/v1"
    );
    assert_eq!(
        pod["metadata"]["labels"]["batch.kubernetes.io/job-name"],
        "batch"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never");

    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(phase_of(&kube, &pods[0].0).as_deref(), Some("Running"));
    assert_eq!(evict(&handle, &kube, &pods[0].0).await, 201);
    // The Job controller's failure backoff: no replacement for 10 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let others = |kube: &KubeState| -> Vec<String> {
        pods_of(kube, "batch")
            .iter()
            .map(name)
            .filter(|n| n != &pods[0].0 && n != &pods[1].0)
            .collect()
    };
    assert!(others(&kube).is_empty(), "replaced within the backoff");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let replacement = others(&kube);
    assert_eq!(replacement.len(), 1, "one replacement after the backoff");
    let replacement = replacement[0].clone();

    // The pod not evicted ends at its run's end; the replacement runs its whole run again.
    tokio::time::sleep((started + run + Duration::from_secs(2)) - tokio::time::Instant::now())
        .await;
    assert_eq!(phase_of(&kube, &pods[1].0).as_deref(), Some("Succeeded"));
    assert_eq!(phase_of(&kube, &replacement).as_deref(), Some("Running"));
    let job = kube
        .get("batch/v1", "jobs", "default", "batch")
        .expect("job");
    assert_eq!(job["status"]["active"], 1, "{job}");
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    assert_eq!(job["status"]["failed"], 1, "{job}");
    assert!(job["status"]["conditions"].is_null(), "{job}");
    let done = kube.get("v1", "pods", "default", &pods[1].0).expect("pod");
    let ready = done["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .expect("a Ready condition");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "PodCompleted");
    assert_eq!(
        done["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );

    tokio::time::sleep(Duration::from_secs(310)).await;
    assert_eq!(phase_of(&kube, &replacement).as_deref(), Some("Succeeded"));
    let job = kube
        .get("batch/v1", "jobs", "default", "batch")
        .expect("job");
    assert_eq!(job["status"]["active"], 0, "{job}");
    assert_eq!(job["status"]["succeeded"], 2, "{job}");
    assert_eq!(job["status"]["conditions"][0]["type"], "Complete", "{job}");
    assert!(job["status"]["completionTime"].is_string(), "{job}");
    // Finished, nothing more is created; the evicted pod is gone, the two that ran stay.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let left = pods_of(&kube, "batch");
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|p| p["status"]["phase"] == "Succeeded"));
}

#[tokio::test(start_paused = true)]
async fn a_job_evicted_past_its_backoff_limit_fails_and_its_active_pods_are_deleted() {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    let mut job_template = PodTemplate::new("500m", "512Mi")
        .runs_for(Duration::from_secs(3600))
        .to_json("batch");
    job_template["spec"]["restartPolicy"] = json!("Never");
    kube.create(
        "batch/v1",
        "jobs",
        "default",
        json!({"metadata": {"name": "batch"},
            "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 1, "template": job_template}}),
    )
    .expect("job created");
    let first = bound_pods(&kube, "batch", 2).await;
    assert_eq!(evict(&handle, &kube, &first[0].0).await, 201);
    tokio::time::sleep(FAILURE_BACKOFF).await;
    let second = eventually("a replacement", || {
        pods_of(&kube, "batch")
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .map(name)
            .find(|n| n != &first[0].0 && n != &first[1].0)
    })
    .await;
    assert_eq!(evict(&handle, &kube, &second).await, 201);
    let job = eventually("the job to fail", || {
        kube.get("batch/v1", "jobs", "default", "batch")
            .ok()
            .filter(|j| j["status"]["conditions"][0]["type"] == "Failed")
    })
    .await;
    assert_eq!(
        job["status"]["conditions"][0]["reason"],
        "BackoffLimitExceeded"
    );
    assert_eq!(job["status"]["failed"], 2, "{job}");
    eventually("the job's last pod to be deleted", || {
        pods_of(&kube, "batch")
            .iter()
            .all(|p| p["metadata"]["deletionTimestamp"].is_string())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_job_whose_pods_would_restart_in_place_is_refused_as_the_api_server_refuses_it() {
    let (_handle, kube) = start().await;
    let template = PodTemplate::new("500m", "512Mi").to_json("batch");
    let err = kube
        .create(
            "batch/v1",
            "jobs",
            "default",
            json!({"metadata": {"name": "batch"}, "spec": {"template": template}}),
        )
        .expect_err("restartPolicy Always is refused");
    assert_eq!(err.code, 422);
    assert!(
        err.to_string().contains(
            "spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_job_is_defaulted_as_the_api_server_does_and_kubectl_gets_its_completions() {
    let (handle, kube) = start().await;
    let job = kube
        .create_job("default", "nightly", 2, &PodTemplate::new("100m", "64Mi"))
        .expect("job created");
    let uid = job["metadata"]["uid"].as_str().expect("a uid").to_string();
    assert_eq!(job["spec"]["backoffLimit"], 6);
    assert_eq!(job["spec"]["completionMode"], "NonIndexed");
    assert_eq!(
        job["spec"]["selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["controller-uid"], uid.as_str());
    assert_eq!(labels["batch.kubernetes.io/job-name"], "nightly");
    assert_eq!(labels["job-name"], "nightly");
    // With no labels of its own, a Job takes its template's.
    let mut template = PodTemplate::new("100m", "64Mi").to_json("bare");
    template["spec"]["restartPolicy"] = json!("OnFailure");
    template["metadata"] = json!({});
    let bare = kube
        .create(
            "batch/v1",
            "jobs",
            "default",
            json!({"metadata": {"name": "bare"}, "spec": {"template": template}}),
        )
        .expect("job created");
    assert_eq!(bare["spec"]["completions"], 1);
    assert_eq!(bare["spec"]["parallelism"], 1);
    assert_eq!(bare["metadata"]["labels"]["job-name"], "bare");
    // `kubectl get jobs`: its printer's columns and cells.
    let table: Value = reqwest::Client::new()
        .get(format!(
            "{}/apis/batch/v1/namespaces/default/jobs",
            handle.base_url()
        ))
        .bearer_auth(kube.token())
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("a table");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "Name",
            "Completions",
            "Duration",
            "Age",
            "Containers",
            "Images",
            "Selector"
        ]
    );
    let row = table["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["cells"][0] == "nightly"))
        .expect("the job's row");
    assert_eq!(row["cells"][1], "0/2");
    assert_eq!(
        row["cells"][6],
        format!("batch.kubernetes.io/controller-uid={uid}")
    );
}

fn ready_of(kube: &KubeState, pod: &str) -> Option<String> {
    kube.get("v1", "pods", "default", pod).ok().and_then(|p| {
        p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| {
                format!(
                    "{}/{}",
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or("")
                )
            })
    })
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_takes_a_while_to_be_ready_is_no_healthy_pod_for_its_budget_until_it_is() {
    let (handle, kube) = start().await;
    seed(&handle, "pool", "Standard_D4s_v5", 1);
    let warm_up = Duration::from_secs(20);
    kube.create_replica_set(
        "default",
        "web",
        2,
        &PodTemplate::new("100m", "128Mi").ready_after(warm_up),
    )
    .expect("rs created");
    kube.create(
        "policy/v1",
        "poddisruptionbudgets",
        "default",
        json!({"metadata": {"name": "web"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
    )
    .expect("pdb created");
    let pods = bound_pods(&kube, "web", 2).await;
    // Running, not Ready: the kubelet's words, and the budget allows nothing.
    assert_eq!(
        ready_of(&kube, &pods[0].0).as_deref(),
        Some("False/ContainersNotReady")
    );
    let pod = kube.get("v1", "pods", "default", &pods[0].0).expect("pod");
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], false);
    assert_eq!(pod["status"]["containerStatuses"][0]["started"], true);
    assert_eq!(evict(&handle, &kube, &pods[0].0).await, 429);
    // Once warmed up, both Ready: one may go.
    tokio::time::sleep(warm_up + Duration::from_secs(1)).await;
    assert_eq!(ready_of(&kube, &pods[0].0).as_deref(), Some("True/"));
    eventually("the replica set to count two ready pods", || {
        kube.get("apps/v1", "replicasets", "default", "web")
            .ok()
            .filter(|rs| rs["status"]["readyReplicas"] == 2)
    })
    .await;
    assert_eq!(evict(&handle, &kube, &pods[0].0).await, 201);
    // Its replacement runs but warms up: the other pod may not go until it is Ready.
    let replacement = eventually("a replacement running", || {
        pods_of(&kube, "web")
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .map(name)
            .find(|n| n != &pods[0].0 && n != &pods[1].0)
    })
    .await;
    assert_eq!(
        ready_of(&kube, &replacement).as_deref(),
        Some("False/ContainersNotReady")
    );
    assert_eq!(evict(&handle, &kube, &pods[1].0).await, 429);
    tokio::time::sleep(warm_up + Duration::from_secs(1)).await;
    assert_eq!(ready_of(&kube, &replacement).as_deref(), Some("True/"));
    assert_eq!(evict(&handle, &kube, &pods[1].0).await, 201);
}

#[tokio::test]
async fn a_negative_scale_is_refused_naming_the_scale_as_the_api_server_does_and_an_absent_one_is_zero(
) {
    let (handle, kube) = start().await;
    kube.create_replica_set("default", "web", 2, &PodTemplate::new("100m", "64Mi"))
        .expect("rs created");
    let url = format!(
        "{}/apis/apps/v1/namespaces/default/replicasets/web/scale",
        handle.base_url()
    );
    let answer = reqwest::Client::new()
        .patch(&url)
        .bearer_auth(kube.token())
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": -1}}).to_string())
        .send()
        .await
        .expect("scale answered");
    assert_eq!(answer.status().as_u16(), 422);
    let status: Value = answer.json().await.expect("a Status");
    // As kube-apiserver answers it (checked against 1.20).
    assert_eq!(
        status["message"],
        "Scale.autoscaling \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    );
    assert_eq!(
        status["details"],
        json!({"name": "web", "group": "autoscaling", "kind": "Scale", "causes": [{
            "reason": "FieldValueInvalid", "field": "spec.replicas",
            "message": "Invalid value: -1: must be greater than or equal to 0"}]})
    );
    // A Scale without `spec.replicas` (an int32, not a pointer) asks for 0.
    let scale: Value = reqwest::Client::new()
        .put(&url)
        .bearer_auth(kube.token())
        .json(&json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "web", "namespace": "default"}, "spec": {}}))
        .send()
        .await
        .expect("scale answered")
        .json()
        .await
        .expect("a Scale");
    assert_eq!(scale["spec"]["replicas"], 0, "{scale}");
}
