//! AKS agent pools over HTTP: the pool's ETag at `properties.eTag` (AKS REST specification,
//! 2024-09-01 and later), the PUT that replaces the pool under If-Match, the scoping rule of the
//! seeds (a cluster-level write changes every pool's ETag, a pool write only its own), and the
//! scale set in the node resource group whose instances follow the pool's count.

use crate::emulator_support;

use emulator_support::*;
use serde_json::{json, Value};
use vmss_capacity_controller::emulator::{AgentPoolSeed, ClusterSeed, FaultKind, FaultSpec};

const LOCATION: &str = "westeurope";

fn node_rg(cluster: &str) -> String {
    format!("MC_{RG}_{cluster}_{LOCATION}")
}

fn node_vmss_list_path(cluster: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets",
        node_rg(cluster)
    )
}

/// Creates cluster `c` over HTTP with pools `a` (System, 2 nodes) and `b` (User, 3 nodes).
async fn two_pool_cluster(env: &Env, name: &str) -> Answer {
    let body = json!({"location": LOCATION, "properties": {"agentPoolProfiles": [
        {"name": "a", "count": 2, "mode": "System", "vmSize": "Standard_D4s_v5"},
        {"name": "b", "count": 3, "mode": "User", "nodeLabels": {"team": "blue"},
         "nodeTaints": ["gpu=true:NoSchedule"], "tags": {"cost": "b"}}]}});
    let a = env
        .send("PUT", &cluster_path(name), None, None, Some(body))
        .await;
    assert_eq!(a.status, 201, "{}", a.text);
    a
}

fn pool_etag(body: &Value) -> String {
    body["properties"]["eTag"]
        .as_str()
        .unwrap_or_else(|| panic!("no properties.eTag in {body}"))
        .to_string()
}

async fn read_pool(env: &Env, cluster: &str, pool: &str) -> Answer {
    let a = env.get(&pool_path(cluster, pool)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    a
}

/// The pool as read, with `count` changed: what a read-modify-write client sends.
fn with_count(read: &Value, count: i64) -> Value {
    let mut body = json!({"properties": read["properties"].clone()});
    body["properties"]["count"] = json!(count);
    body
}

#[tokio::test]
async fn a_pool_carries_its_etag_at_properties_etag_and_no_top_level_etag() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let a = read_pool(&env, "c", "a").await;
    let etag = pool_etag(&a.body);
    assert!(uuid::Uuid::parse_str(&etag).is_ok(), "a GUID: {etag}");
    assert_eq!(a.etag().as_deref(), Some(etag.as_str()), "header agrees");
    assert!(
        a.body.get("etag").is_none(),
        "no top-level etag: {}",
        a.text
    );
    assert!(
        a.body.get("eTag").is_none(),
        "no top-level eTag: {}",
        a.text
    );

    // The LIST and the cluster's agentPoolProfiles show the same ETag.
    let list = env.get(&format!("{}/agentPools", cluster_path("c"))).await;
    assert_eq!(list.status, 200);
    let listed = list.body["value"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "a")
        .unwrap()
        .clone();
    assert_eq!(pool_etag(&listed), etag);
    let cluster = env.get(&cluster_path("c")).await;
    let profile = cluster.body["properties"]["agentPoolProfiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "a")
        .unwrap()
        .clone();
    assert_eq!(profile["eTag"].as_str(), Some(etag.as_str()));
    assert_eq!(
        cluster.body["eTag"].as_str(),
        cluster.etag().as_deref(),
        "the cluster's ETag is its top-level eTag"
    );
}

#[tokio::test]
async fn a_pool_persists_the_fields_the_spec_names() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let b = read_pool(&env, "c", "b").await;
    let p = &b.body["properties"];
    assert_eq!(p["count"], 3);
    assert_eq!(p["vmSize"], "Standard_D2s_v5");
    assert_eq!(p["mode"], "User");
    assert_eq!(p["enableAutoScaling"], false);
    assert_eq!(p["maxPods"], 110);
    assert_eq!(p["nodeLabels"], json!({"team": "blue"}));
    assert_eq!(p["nodeTaints"], json!(["gpu=true:NoSchedule"]));
    assert_eq!(p["tags"], json!({"cost": "b"}));
    assert_eq!(p["provisioningState"], "Succeeded");
    assert!(p["orchestratorVersion"]
        .as_str()
        .is_some_and(|v| !v.is_empty()));

    // Autoscaler settings round-trip.
    let mut body = with_count(&b.body, 3);
    body["properties"]["enableAutoScaling"] = json!(true);
    body["properties"]["minCount"] = json!(1);
    body["properties"]["maxCount"] = json!(5);
    let w = env
        .send("PUT", &pool_path("c", "b"), None, None, Some(body))
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let p = &read_pool(&env, "c", "b").await.body["properties"];
    assert_eq!(
        (&p["enableAutoScaling"], &p["minCount"], &p["maxCount"]),
        (&json!(true), &json!(1), &json!(5))
    );
}

#[tokio::test]
async fn the_pool_put_replaces_the_object_and_ignores_read_only_fields() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let b = read_pool(&env, "c", "b").await;
    // Sending back what was read (with its eTag, provisioningState, ...) is accepted.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&pool_etag(&b.body)),
            None,
            Some(with_count(&b.body, 4)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(w.body["properties"]["count"], 4);
    assert_eq!(w.body["properties"]["nodeLabels"], json!({"team": "blue"}));
    assert!(w.header("azure-asyncoperation").is_some(), "an LRO");
    assert_ne!(pool_etag(&w.body), pool_etag(&b.body));

    // A PUT that leaves labels and tags out removes them: it replaces the pool.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            None,
            None,
            Some(json!({"properties": {"count": 4}})),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(w.body["properties"]["nodeLabels"], json!({}));
    assert_eq!(w.body["properties"]["tags"], json!({}));
    assert_eq!(w.body["properties"]["mode"], "User", "mode left out stays");

    // vmSize cannot change.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            None,
            None,
            Some(json!({"properties": {"count": 4, "vmSize": "Standard_E8s_v5"}})),
        )
        .await;
    assert_eq!(w.status, 400, "{}", w.text);
    assert_eq!(w.error_code(), Some("PropertyChangeNotAllowed"));
}

#[tokio::test]
async fn a_system_pool_cannot_go_to_zero_nodes() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let a = read_pool(&env, "c", "a").await;
    let w = env
        .send(
            "PUT",
            &pool_path("c", "a"),
            None,
            None,
            Some(with_count(&a.body, 0)),
        )
        .await;
    assert_eq!(w.status, 400, "{}", w.text);
    assert_eq!(
        read_pool(&env, "c", "a").await.body["properties"]["count"],
        2
    );
}

#[tokio::test]
async fn a_pool_put_with_a_stale_if_match_gets_412_and_changes_nothing() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let b = read_pool(&env, "c", "b").await;
    let old = pool_etag(&b.body);
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&old),
            None,
            Some(with_count(&b.body, 5)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let current = pool_etag(&w.body);

    let stale = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&old),
            None,
            Some(with_count(&b.body, 9)),
        )
        .await;
    assert_eq!(stale.status, 412, "{}", stale.text);
    assert_eq!(stale.error_code(), Some("PreconditionFailed"));
    let now = read_pool(&env, "c", "b").await;
    assert_eq!(now.body["properties"]["count"], 5);
    assert_eq!(pool_etag(&now.body), current);

    // If-None-Match: * on an existing pool is 412 too.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            None,
            Some("*"),
            Some(with_count(&b.body, 9)),
        )
        .await;
    assert_eq!(w.status, 412, "{}", w.text);
}

#[tokio::test]
async fn a_cluster_level_write_changes_every_pool_etag_and_makes_pool_writes_412() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let a1 = read_pool(&env, "c", "a").await;
    let b1 = read_pool(&env, "c", "b").await;
    let cluster = env.get(&cluster_path("c")).await;

    // A tag change on the managed cluster (PATCH, as `az aks update --tags` does).
    let w = env
        .send(
            "PATCH",
            &cluster_path("c"),
            cluster.etag().as_deref(),
            None,
            Some(json!({"tags": {"owner": "platform"}})),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(w.body["tags"], json!({"owner": "platform"}));
    let a2 = read_pool(&env, "c", "a").await;
    let b2 = read_pool(&env, "c", "b").await;
    assert_ne!(pool_etag(&a2.body), pool_etag(&a1.body));
    assert_ne!(pool_etag(&b2.body), pool_etag(&b1.body));
    assert_eq!(
        a2.body["properties"]["count"], 2,
        "the pool itself is unchanged"
    );

    // A pool write holding the ETag read before the cluster write is refused.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&pool_etag(&b1.body)),
            None,
            Some(with_count(&b1.body, 6)),
        )
        .await;
    assert_eq!(w.status, 412, "{}", w.text);

    // An out-of-band cluster-level write (the demo's rival) does the same.
    let state = env.handle.state();
    let before = state.agent_pool(SUB, RG, "c", "b").unwrap().etag;
    let cluster_before = state.cluster(SUB, RG, "c").unwrap().etag;
    let (_, journaled) = state.changes_since(u64::MAX);
    let new_cluster = state
        .rival_cluster_write(
            SUB,
            RG,
            "c",
            [("upgrade".to_string(), "1".to_string())].into(),
            "rival",
        )
        .unwrap();
    assert_ne!(new_cluster, cluster_before);
    assert_ne!(state.agent_pool(SUB, RG, "c", "b").unwrap().etag, before);
    // Every pool has a new version, and the write is journaled once, at the cluster.
    let (changes, _) = state.changes_since(journaled);
    let rival: Vec<_> = changes.iter().filter(|c| c.writer == "rival").collect();
    assert_eq!(rival.len(), 1, "{changes:?}");
    assert!(
        rival[0].resource.ends_with("/managedclusters/c"),
        "{rival:?}"
    );
    assert_eq!(
        state.cluster(SUB, RG, "c").unwrap().tags.get("upgrade"),
        Some(&"1".to_string())
    );
}

#[tokio::test]
async fn a_write_to_pool_a_leaves_pool_b_and_the_cluster_alone() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let a = read_pool(&env, "c", "a").await;
    let b = read_pool(&env, "c", "b").await;
    let cluster = env.get(&cluster_path("c")).await.etag().unwrap();
    let w = env
        .send(
            "PUT",
            &pool_path("c", "a"),
            Some(&pool_etag(&a.body)),
            None,
            Some(with_count(&a.body, 4)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(
        pool_etag(&read_pool(&env, "c", "b").await.body),
        pool_etag(&b.body)
    );
    assert_eq!(env.get(&cluster_path("c")).await.etag().unwrap(), cluster);

    // So a write to pool B with the ETag read before A's write still succeeds.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&pool_etag(&b.body)),
            None,
            Some(with_count(&b.body, 1)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert!(env.handle.state().lost_updates().is_empty());
}

#[tokio::test]
async fn each_pool_is_backed_by_a_tagged_scale_set_in_the_node_resource_group() {
    let env = Env::start().await;
    let created = two_pool_cluster(&env, "c").await;
    assert_eq!(
        created.body["properties"]["nodeResourceGroup"],
        node_rg("c").as_str()
    );
    let list = env.get(&node_vmss_list_path("c")).await;
    assert_eq!(list.status, 200, "{}", list.text);
    let sets = list.body["value"].as_array().unwrap().clone();
    assert_eq!(sets.len(), 2, "{}", list.text);
    let name_of = |pool: &str| -> String {
        sets.iter()
            .find(|s| s["tags"]["aks-managed-poolName"] == pool)
            .unwrap_or_else(|| panic!("no scale set tagged for pool {pool}: {sets:?}"))["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a, b) = (name_of("a"), name_of("b"));
    for (name, pool) in [(&a, "a"), (&b, "b")] {
        let digits = name
            .strip_prefix(&format!("aks-{pool}-"))
            .and_then(|r| r.strip_suffix("-vmss"))
            .unwrap_or_else(|| panic!("{name} is not aks-{pool}-<digits>-vmss"));
        assert!(
            digits.len() == 8 && digits.chars().all(|c| c.is_ascii_digit()),
            "{name}"
        );
    }
    assert_eq!(
        a.trim_start_matches("aks-a-"),
        b.trim_start_matches("aks-b-"),
        "one suffix per cluster, as AKS names them"
    );
    let view = env.handle.state().agent_pool(SUB, RG, "c", "b").unwrap();
    assert_eq!(view.scale_set_name, b);
    assert_eq!(view.scale_set_resource_group, node_rg("c"));
    let got = env.get(&vmss_path_in(&node_rg("c"), &b)).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["sku"]["capacity"], 3);
    assert_eq!(
        got.body["tags"]["cost"], "b",
        "pool tags reach the scale set"
    );
}

fn vmss_path_in(rg: &str, name: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}")
}

async fn instance_count(env: &Env, rg: &str, name: &str) -> usize {
    let a = env
        .get(&format!("{}/virtualMachines", vmss_path_in(rg, name)))
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
    a.body["value"].as_array().unwrap().len()
}

#[tokio::test]
async fn the_backing_scale_sets_instances_follow_the_pool_count_and_go_with_the_pool() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let state = env.handle.state();
    let view = state.agent_pool(SUB, RG, "c", "b").unwrap();
    let (rg, name) = (view.scale_set_resource_group, view.scale_set_name);
    assert_eq!(instance_count(&env, &rg, &name).await, 3);

    let b = read_pool(&env, "c", "b").await;
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&pool_etag(&b.body)),
            None,
            Some(with_count(&b.body, 5)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(instance_count(&env, &rg, &name).await, 5);
    let b = read_pool(&env, "c", "b").await;
    env.send(
        "PUT",
        &pool_path("c", "b"),
        None,
        None,
        Some(with_count(&b.body, 1)),
    )
    .await;
    assert_eq!(instance_count(&env, &rg, &name).await, 1);

    // A cluster write that resizes a pool through agentPoolProfiles resizes the scale set too.
    let w = env
        .send(
            "PATCH",
            &cluster_path("c"),
            None,
            None,
            Some(json!({"properties": {"agentPoolProfiles": [{"name": "b", "count": 2}]}})),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    assert_eq!(instance_count(&env, &rg, &name).await, 2);

    // The rival's pool-level write moves the scale set as well.
    state
        .rival_set_pool_count(SUB, RG, "c", "b", 4, "rival")
        .unwrap();
    assert_eq!(instance_count(&env, &rg, &name).await, 4);

    // A new pool gets its scale set; deleting a pool deletes it.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "gpu"),
            None,
            Some("*"),
            Some(json!({"properties": {"count": 2, "vmSize": "Standard_NC6s_v3"}})),
        )
        .await;
    assert_eq!(w.status, 201, "{}", w.text);
    assert_eq!(w.body["properties"]["mode"], "User");
    let gpu = state
        .agent_pool(SUB, RG, "c", "gpu")
        .unwrap()
        .scale_set_name;
    assert_eq!(instance_count(&env, &rg, &gpu).await, 2);
    let d = env
        .send("DELETE", &pool_path("c", "gpu"), None, None, None)
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(env.get(&vmss_path_in(&rg, &gpu)).await.status, 404);

    // Deleting the cluster deletes every pool's scale set.
    let d = env
        .send("DELETE", &cluster_path("c"), None, None, None)
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    let list = env.get(&node_vmss_list_path("c")).await;
    assert_eq!(list.body["value"], json!([]), "{}", list.text);
}

#[tokio::test]
async fn a_seeded_cluster_matches_one_created_over_http() {
    let env = Env::start().await;
    let state = env.handle.state();
    let mut auto = AgentPoolSeed::new("auto", 2);
    auto.enable_auto_scaling = true;
    auto.min_count = Some(1);
    auto.max_count = Some(4);
    let etag = state
        .seed_cluster(ClusterSeed::new(
            SUB,
            RG,
            "seeded",
            vec![AgentPoolSeed::new("sys", 1), auto],
        ))
        .unwrap();
    let got = env.get(&cluster_path("seeded")).await;
    assert_eq!(got.etag(), Some(etag));
    let auto = read_pool(&env, "seeded", "auto").await;
    assert_eq!(auto.body["properties"]["enableAutoScaling"], true);
    assert_eq!(auto.body["properties"]["mode"], "User");
    assert_eq!(
        read_pool(&env, "seeded", "sys").await.body["properties"]["mode"],
        "System"
    );
    let view = state.agent_pool(SUB, RG, "seeded", "auto").unwrap();
    assert_eq!(
        instance_count(&env, &view.scale_set_resource_group, &view.scale_set_name).await,
        2
    );

    // AKS would refuse a System pool at 0 nodes; so does the seed.
    let mut zero = AgentPoolSeed::new("sys", 0);
    zero.mode = Some("System".to_string());
    assert!(state
        .seed_cluster(ClusterSeed::new(SUB, RG, "bad", vec![zero]))
        .is_err());
}

#[tokio::test]
async fn the_control_api_seeds_clusters_and_makes_cluster_and_pool_level_rival_writes() {
    let env = Env::start().await;
    let base = env.handle.base_url();
    let http = reqwest::Client::new();
    let seed = json!({"subscription": SUB, "resource_group": RG, "name": "ctl",
        "pools": [{"name": "sys", "count": 1}, {"name": "work", "count": 2}]});
    let r = http
        .post(format!("{base}/_emulator/clusters"))
        .json(&seed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let pool_url = format!("{base}/_emulator/clusters/{SUB}/{RG}/ctl/agent-pools/work");
    let before: Value = http
        .get(&pool_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(before["count"], 2);

    let r = http
        .post(format!("{pool_url}/count"))
        .json(&json!({"count": 3, "writer": "rival"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let after: Value = http
        .get(&pool_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after["count"], 3);
    assert_ne!(after["etag"], before["etag"]);

    let r = http
        .post(format!("{base}/_emulator/clusters/{SUB}/{RG}/ctl/tags"))
        .json(&json!({"tags": {"owner": "someone"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let touched: Value = http
        .get(&pool_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(touched["etag"], after["etag"]);
    assert_eq!(touched["count"], 3);

    let missing = http
        .get(format!(
            "{base}/_emulator/clusters/{SUB}/{RG}/nope/agent-pools/work"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);
}

#[tokio::test]
async fn a_quoted_if_match_names_the_bare_guid_etag_as_azure_sdks_send_it() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let b = read_pool(&env, "c", "b").await;
    let etag = pool_etag(&b.body);
    // azure-core's quote_etag turns the bare GUID into "GUID" (RFC 9110's entity-tag).
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&format!("\"{etag}\"")),
            None,
            Some(with_count(&b.body, 4)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&format!("\"{etag}\"")),
            None,
            Some(with_count(&b.body, 5)),
        )
        .await;
    assert_eq!(
        w.status, 412,
        "the quoted old ETag is still stale: {}",
        w.text
    );
    assert!(env.handle.state().lost_updates().is_empty());
}

fn pool_fault(method: &str, kind: FaultKind) -> FaultSpec {
    FaultSpec {
        method: Some(method.to_string()),
        path_contains: Some("/agentPools".into()),
        kind,
        count: Some(1),
        probability: None,
        seed: None,
    }
}

#[tokio::test]
async fn no_etag_faults_strip_the_pools_properties_etag_in_a_get_and_a_list() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let state = env.handle.state();
    state.inject_fault(pool_fault("GET", FaultKind::NoEtag));
    let a = env.get(&pool_path("c", "b")).await;
    assert_eq!(a.status, 200);
    assert!(a.etag().is_none());
    assert!(a.body["properties"].get("eTag").is_none(), "{}", a.text);
    assert_eq!(a.body["properties"]["count"], 3);

    state.inject_fault(pool_fault("GET", FaultKind::NoEtag));
    let list = env.get(&format!("{}/agentPools", cluster_path("c"))).await;
    for item in list.body["value"].as_array().unwrap() {
        assert!(item["properties"].get("eTag").is_none(), "{item}");
    }
    // The next read has it again.
    assert!(pool_etag(&read_pool(&env, "c", "b").await.body).len() == 36);
}

#[tokio::test]
async fn delete_before_handling_takes_the_pool_and_its_scale_set() {
    let env = Env::start().await;
    two_pool_cluster(&env, "c").await;
    let state = env.handle.state();
    let view = state.agent_pool(SUB, RG, "c", "b").unwrap();
    state.inject_fault(pool_fault("PUT", FaultKind::DeleteBeforeHandling));
    let w = env
        .send(
            "PUT",
            &pool_path("c", "b"),
            Some(&view.etag),
            None,
            Some(json!({"properties": {"count": 4}})),
        )
        .await;
    assert_eq!(w.status, 412, "the pool is gone: {}", w.text);
    assert!(state.agent_pool(SUB, RG, "c", "b").is_none());
    let got = env
        .get(&vmss_path_in(
            &view.scale_set_resource_group,
            &view.scale_set_name,
        ))
        .await;
    assert_eq!(got.status, 404);
}

#[tokio::test]
async fn a_pools_zones_and_spot_priority_are_kept_fixed_and_given_to_its_scale_set() {
    let env = Env::start().await;
    let body = json!({"location": LOCATION, "properties": {"agentPoolProfiles": [
        {"name": "sys", "count": 1, "mode": "System"},
        {"name": "zonal", "count": 3, "mode": "User", "availabilityZones": ["1", "2", "3"]},
        {"name": "spot", "count": 1, "mode": "User", "scaleSetPriority": "Spot",
         "scaleSetEvictionPolicy": "Deallocate"}]}});
    let w = env
        .send("PUT", &cluster_path("c"), None, None, Some(body))
        .await;
    assert_eq!(w.status, 201, "{}", w.text);
    let zonal = read_pool(&env, "c", "zonal").await;
    assert_eq!(
        zonal.body["properties"]["availabilityZones"],
        json!(["1", "2", "3"])
    );
    assert!(zonal.body["properties"]["scaleSetPriority"].is_null());
    let spot = read_pool(&env, "c", "spot").await;
    assert_eq!(spot.body["properties"]["scaleSetPriority"], "Spot");
    assert_eq!(
        spot.body["properties"]["scaleSetEvictionPolicy"],
        "Deallocate"
    );

    // The scale sets behind them: the zonal one's instances one per zone, the spot one Spot.
    let sets = env.get(&node_vmss_list_path("c")).await;
    let set = |pool: &str| -> Value {
        sets.body["value"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["tags"]["aks-managed-poolName"] == pool)
            .cloned()
            .unwrap_or_else(|| panic!("no scale set for {pool}: {}", sets.text))
    };
    assert_eq!(set("zonal")["zones"], json!(["1", "2", "3"]));
    assert_eq!(
        set("spot")["properties"]["virtualMachineProfile"]["priority"],
        "Spot"
    );
    let zonal_set = set("zonal")["name"].as_str().unwrap().to_string();
    let vms = env
        .get(&format!(
            "/subscriptions/{SUB}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{zonal_set}/virtualMachines",
            node_rg("c")
        ))
        .await;
    let mut zones: Vec<String> = vms.body["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["zones"][0].as_str().unwrap_or("").to_string())
        .collect();
    zones.sort();
    assert_eq!(zones, ["1", "2", "3"], "{}", vms.text);

    // Zones and priority are fixed at creation, as AKS has them.
    let mut body = with_count(&zonal.body, 3);
    body["properties"]["availabilityZones"] = json!(["1"]);
    let w = env
        .send("PUT", &pool_path("c", "zonal"), None, None, Some(body))
        .await;
    assert_eq!(w.status, 400, "{}", w.text);
    assert!(
        w.text.contains("PropertyChangeNotAllowed") && w.text.contains("availabilityZones"),
        "{}",
        w.text
    );
    let mut body = with_count(&spot.body, 1);
    body["properties"]["scaleSetPriority"] = json!("Regular");
    let w = env
        .send("PUT", &pool_path("c", "spot"), None, None, Some(body))
        .await;
    assert_eq!(w.status, 400, "{}", w.text);
    assert!(w.text.contains("scaleSetPriority"), "{}", w.text);
    // Sending back what was read is no change.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "spot"),
            None,
            None,
            Some(with_count(&spot.body, 2)),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let bad = env
        .send(
            "PUT",
            &pool_path("c", "other"),
            None,
            None,
            Some(json!({"properties": {"count": 1, "scaleSetPriority": "Cheap"}})),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    assert!(bad.text.contains("'Spot' or 'Regular'"), "{}", bad.text);
}
