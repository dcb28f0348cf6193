//! Scale-set semantics: LIST paging, sparse PUT merge, validation errors, lost-update detection,
//! and the control API over HTTP.

use crate::emulator_support;

use std::collections::BTreeMap;

use emulator_support::*;
use serde_json::{json, Value};
use vmss_capacity_controller::emulator::{EmulatorBuilder, ScaleSetSeed};

#[tokio::test]
async fn list_pages_follow_absolute_next_links_back_to_the_emulator() {
    let env = Env::with(EmulatorBuilder::new().page_size(2)).await;
    for i in 0..5 {
        env.handle
            .state()
            .seed_scale_set(ScaleSetSeed::new(SUB, RG, &format!("vmss-{i}"), 1));
    }
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, "other-rg", "elsewhere", 1));
    let list_path = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets");
    let mut url = env.url(&list_path);
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let page: Value = env
            .http
            .get(&url)
            .bearer_auth(&env.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pages += 1;
        for v in page["value"].as_array().unwrap() {
            names.push(v["name"].as_str().unwrap().to_string());
        }
        match page.get("nextLink").and_then(Value::as_str) {
            Some(next) => {
                assert!(next.starts_with(&env.handle.base_url()), "{next}");
                assert!(next.contains("$skiptoken="), "{next}");
                url = next.to_string();
            }
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        names,
        vec!["vmss-0", "vmss-1", "vmss-2", "vmss-3", "vmss-4"]
    );

    let vms = env
        .get(&format!("{}/virtualMachines", vmss_path("vmss-0")))
        .await;
    assert_eq!(vms.body["value"].as_array().unwrap().len(), 1);
    assert!(
        vms.body.get("nextLink").is_none(),
        "no nextLink on the last page"
    );
}

#[tokio::test]
async fn a_spot_eviction_with_deallocate_leaves_the_vm_listed_stopped_with_the_capacity_and_etag_unchanged(
) {
    let env = Env::start().await;
    let mut seed = ScaleSetSeed::new(SUB, RG, "spot", 3);
    seed.priority = Some("Spot".into());
    seed.eviction_policy = Some("Deallocate".into());
    let etag = env.handle.state().seed_scale_set(seed);
    let evicted = env
        .handle
        .state()
        .evict_spot(SUB, RG, "spot", 2)
        .expect("evicted");
    assert_eq!(evicted, vec![0, 1], "the oldest first");
    // Evicting again takes the next running one, not a stopped one twice.
    assert_eq!(
        env.handle.state().evict_spot(SUB, RG, "spot", 1).unwrap(),
        vec![2]
    );
    let ss = env.get(&vmss_path("spot")).await;
    assert_eq!(
        ss.body["sku"]["capacity"], 3,
        "deallocated VMs stay in the capacity"
    );
    assert_eq!(ss.etag(), Some(etag), "the model did not change");
    let power = |vm: &Value| {
        vm.pointer("/properties/instanceView/statuses")
            .and_then(Value::as_array)
            .and_then(|s| {
                s.iter()
                    .filter_map(|s| s["code"].as_str())
                    .find(|c| c.starts_with("PowerState/"))
                    .map(str::to_string)
            })
    };
    let vms = env
        .get(&format!(
            "{}/virtualMachines?$expand=instanceView",
            vmss_path("spot")
        ))
        .await;
    let states: Vec<Option<String>> = vms.body["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(power)
        .collect();
    assert_eq!(states, vec![Some("PowerState/deallocated".to_string()); 3]);
    // Without the expansion, no instance view (as Azure).
    let plain = env
        .get(&format!("{}/virtualMachines", vmss_path("spot")))
        .await;
    assert!(plain.body["value"]
        .as_array()
        .unwrap()
        .iter()
        .all(|vm| vm.pointer("/properties/instanceView").is_none()));
}

#[tokio::test]
async fn a_sparse_put_changes_capacity_and_keeps_the_tags() {
    let env = Env::start().await;
    let mut seed = ScaleSetSeed::new(SUB, RG, "v", 2);
    seed.tags.insert("team".into(), "blue".into());
    let etag = env.handle.state().seed_scale_set(seed);
    let a = env
        .send(
            "PUT",
            &vmss_path("v"),
            Some(&etag),
            None,
            Some(json!({"name": "v", "location": "West Europe", "sku": {"name": "Standard_D2s_v5", "capacity": 5}})),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.body["sku"]["capacity"], 5);
    assert_eq!(a.body["tags"]["team"], "blue");
    assert_eq!(a.body["sku"]["tier"], "Standard");
    assert_eq!(a.body["location"], "westeurope");
    let view = env.handle.state().scale_set(SUB, RG, "v").unwrap();
    assert_eq!(view.capacity, 5);
    assert_eq!(view.tags.get("team").map(String::as_str), Some("blue"));
    assert_eq!(view.etag, a.etag().unwrap());
}

#[tokio::test]
async fn invalid_bodies_get_arm_400s_and_change_nothing() {
    let env = Env::start().await;
    let etag = env
        .handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    let cases = [
        (
            json!({"location": "eastus", "sku": {"capacity": 3}}),
            "InvalidParameter",
        ),
        (
            json!({"location": "westeurope", "sku": {"capacity": -1}}),
            "InvalidParameter",
        ),
        (
            json!({"location": "westeurope", "sku": {"capacity": 1001}}),
            "InvalidParameter",
        ),
        (
            json!({"location": "westeurope", "sku": {"capacity": 2.5}}),
            "InvalidParameter",
        ),
        (
            json!({"location": "westeurope", "sku": {"capacity": "3"}}),
            "InvalidParameter",
        ),
    ];
    for (body, code) in cases {
        let a = env
            .send(
                "PUT",
                &vmss_path("v"),
                Some(&etag),
                None,
                Some(body.clone()),
            )
            .await;
        assert_eq!(a.status, 400, "{body}: {}", a.text);
        assert_eq!(a.error_code(), Some(code), "{body}");
    }
    let resp = env
        .http
        .put(env.url(&vmss_path("v")))
        .bearer_auth(&env.token)
        .header("content-type", "application/json")
        .body("{\"sku\": {")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "InvalidRequestContent");
    assert_eq!(
        env.handle.state().scale_set(SUB, RG, "v").unwrap().etag,
        etag
    );
}

#[tokio::test]
async fn the_lost_update_report_stays_empty_when_if_match_is_honoured() {
    let env = Env::start().await;
    let state = env.handle.state();
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    let read = env.get(&vmss_path("v")).await;
    let stale = read.etag().unwrap();
    state.rival_set_capacity(SUB, RG, "v", 7, "rival").unwrap();
    let refused = env
        .send(
            "PUT",
            &vmss_path("v"),
            Some(&stale),
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 3}})),
        )
        .await;
    assert_eq!(refused.status, 412);
    let fresh = env.get(&vmss_path("v")).await;
    assert_eq!(fresh.body["sku"]["capacity"], 7);
    let ok = env
        .send(
            "PUT",
            &vmss_path("v"),
            fresh.etag().as_deref(),
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 3}})),
        )
        .await;
    assert_eq!(ok.status, 200);
    // Consecutive own writes are not lost updates either.
    let ok2 = env
        .send(
            "PUT",
            &vmss_path("v"),
            ok.etag().as_deref(),
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 4}})),
        )
        .await;
    assert_eq!(ok2.status, 200);
    assert!(
        state.lost_updates().is_empty(),
        "{:?}",
        state.lost_updates()
    );
}

#[tokio::test]
async fn a_blind_put_after_a_rival_write_is_reported_as_a_lost_update() {
    let env = Env::start().await;
    let state = env.handle.state();
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 3));
    let read = env.get(&vmss_path("v")).await;
    assert_eq!(read.status, 200);
    let rival_etag = state.rival_set_capacity(SUB, RG, "v", 7, "rival").unwrap();
    let mut tags = BTreeMap::new();
    tags.insert("owner".to_string(), "ops".to_string());
    state.rival_set_tags(SUB, RG, "v", tags, "rival").unwrap();
    let tags_etag = state.scale_set(SUB, RG, "v").unwrap().etag;
    assert_ne!(tags_etag, rival_etag);
    let blind = env
        .send(
            "PUT",
            &vmss_path("v"),
            None,
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 4}})),
        )
        .await;
    assert_eq!(blind.status, 200);
    let lost = state.lost_updates();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].writer, "tester");
    assert_eq!(lost[0].replaced_writer, "rival");
    assert_eq!(lost[0].replaced_etag, tags_etag);
    assert_eq!(lost[0].replaced_change, "tags changed");
    assert!(lost[0].resource.ends_with("/virtualMachineScaleSets/v"));
    let log = state.request_log();
    let put = log.iter().find(|r| r.method == "PUT").unwrap();
    assert_eq!(lost[0].at_seq, put.seq);
    assert_eq!(put.writer.as_deref(), Some("tester"));
    assert_eq!(put.body_capacity, Some(4));

    // A blind delete over a capacity change names the capacity change.
    state.rival_set_capacity(SUB, RG, "v", 9, "rival").unwrap();
    let del = env.send("DELETE", &vmss_path("v"), None, None, None).await;
    assert_eq!(del.status, 200);
    let lost = state.lost_updates();
    assert_eq!(lost.len(), 2);
    assert_eq!(lost[1].replaced_change, "capacity 4 -> 9");
}

#[tokio::test]
async fn the_control_api_drives_the_emulator_over_http() {
    let env = Env::start().await;
    let base = format!("{}/_emulator", env.handle.base_url());
    let c = &env.http;
    let health: Value = c
        .get(format!("{base}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let seeded: Value = c
        .post(format!("{base}/scale-sets"))
        .json(&json!({"subscription": SUB, "resource_group": RG, "name": "v", "capacity": 2, "tags": {"a": "b"}}))
        .send().await.unwrap().json().await.unwrap();
    assert_eq!(seeded["etag"], "\"1\"");
    let read = env.get(&vmss_path("v")).await;
    assert_eq!(read.status, 200);
    let r: Value = c
        .post(format!("{base}/scale-sets/{SUB}/{RG}/v/capacity"))
        .json(&json!({"capacity": 6, "writer": "ops"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["etag"], "\"2\"");
    let r: Value = c
        .post(format!("{base}/scale-sets/{SUB}/{RG}/v/tags"))
        .json(&json!({"tags": {"c": "d"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["etag"], "\"3\"");
    let view: Value = c
        .get(format!("{base}/scale-sets/{SUB}/{RG}/v"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["capacity"], 6);
    assert_eq!(view["tags"], json!({"a": "b", "c": "d"}));
    let missing = c
        .post(format!("{base}/scale-sets/{SUB}/{RG}/nope/capacity"))
        .json(&json!({"capacity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 404);

    let fault: Value = c
        .post(format!("{base}/faults"))
        .json(&json!({"method": "GET", "kind": {"type": "status", "code": 503}, "count": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(fault["id"].as_u64().is_some());
    assert_eq!(env.get(&vmss_path("v")).await.status, 503);
    c.post(format!("{base}/faults"))
        .json(&json!({"kind": {"type": "status", "code": 500}}))
        .send()
        .await
        .unwrap();
    c.delete(format!("{base}/faults")).send().await.unwrap();
    assert_eq!(env.get(&vmss_path("v")).await.status, 200);

    c.post(format!("{base}/scale-sets/{SUB}/{RG}/v/capacity"))
        .json(&json!({"capacity": 8, "writer": "ops"}))
        .send()
        .await
        .unwrap();
    let blind = env
        .send(
            "PUT",
            &vmss_path("v"),
            None,
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 1}})),
        )
        .await;
    assert_eq!(blind.status, 200);
    let lost: Value = c
        .get(format!("{base}/lost-updates"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(lost.as_array().unwrap().len(), 1);
    let log: Value = c
        .get(format!("{base}/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(log.as_array().unwrap().iter().any(|r| r["status"] == 503));

    let tok: Value = c
        .get(format!("{base}/token?client_id=script"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let a = env
        .send_as(
            tok["access_token"].as_str().unwrap(),
            "GET",
            &vmss_path("v"),
            None,
            None,
            None,
        )
        .await;
    assert_eq!(a.status, 200);

    c.post(format!("{base}/token-endpoint"))
        .json(&json!({"down": true}))
        .send()
        .await
        .unwrap();
    let down = c
        .post(format!("{}/t/oauth2/v2.0/token", env.handle.base_url()))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "x"),
            ("client_secret", "y"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(down.status().as_u16(), 503);
    c.post(format!("{base}/token-endpoint"))
        .json(&json!({"down": false}))
        .send()
        .await
        .unwrap();
    c.post(format!("{base}/clients"))
        .json(&json!({"client_id": "x", "secret": "right"}))
        .send()
        .await
        .unwrap();
    let bad = c
        .post(format!("{}/t/oauth2/v2.0/token", env.handle.base_url()))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", "x"),
            ("client_secret", "wrong"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);

    let deleted: Value = c
        .delete(format!("{base}/scale-sets/{SUB}/{RG}/v"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(deleted["deleted"], true);
    assert_eq!(env.get(&vmss_path("v")).await.status, 404);
    c.post(format!("{base}/reset")).send().await.unwrap();
    assert!(env.handle.state().request_log().is_empty());
    assert!(env.handle.state().lost_updates().is_empty());
}

#[tokio::test]
async fn a_write_whose_if_match_names_the_current_etag_is_never_a_lost_update() {
    let env = Env::start().await;
    let state = env.handle.state();
    // The writer got the ETag out of band (never GET it), but presenting it proves it knew it.
    let seeded = state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 2));
    let a = env
        .send(
            "PUT",
            &vmss_path("v"),
            Some(&seeded),
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 3}})),
        )
        .await;
    assert_eq!(a.status, 200);
    // If-Match: * proves nothing: over a rival's unseen change it is a lost update.
    state.rival_set_capacity(SUB, RG, "v", 8, "rival").unwrap();
    let star = env
        .send(
            "PUT",
            &vmss_path("v"),
            Some("*"),
            None,
            Some(json!({"location": "westeurope", "sku": {"capacity": 4}})),
        )
        .await;
    assert_eq!(star.status, 200);
    let lost = state.lost_updates();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].replaced_change, "capacity 3 -> 8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_conditional_writers_never_lose_an_update() {
    let env = std::sync::Arc::new(Env::start().await);
    let state = env.handle.state();
    state.seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 0));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            let mut wins = 0;
            for i in 0..20 {
                let read = env.get(&vmss_path("v")).await;
                let a = env
                    .send(
                        "PUT",
                        &vmss_path("v"),
                        read.etag().as_deref(),
                        None,
                        Some(json!({"location": "westeurope", "sku": {"capacity": (w * 20 + i) % 100}})),
                    )
                    .await;
                match a.status {
                    200 => wins += 1,
                    412 => {}
                    other => panic!("unexpected {other}: {}", a.text),
                }
            }
            wins
        }));
    }
    let mut wins = 0;
    for t in tasks {
        wins += t.await.unwrap();
    }
    let version: u64 = state
        .scale_set(SUB, RG, "v")
        .unwrap()
        .etag
        .trim_matches('"')
        .parse()
        .unwrap();
    assert!(wins >= 20, "some writes won: {wins}");
    assert_eq!(
        version,
        1 + wins,
        "each accepted write is exactly one new version"
    );
    assert!(
        state.lost_updates().is_empty(),
        "{:?}",
        state.lost_updates()
    );
}
