//! The seeds' conditional-request table, cell for cell, for scale sets, AKS managed clusters and
//! agent pools; both BadRequest scenarios; the AKS ETag scoping rule; 401 and 400 basics.

use crate::emulator_support;

use emulator_support::*;
use serde_json::{json, Value};
use vmss_capacity_controller::emulator::ScaleSetSeed;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Vmss,
    Cluster,
    Pool,
}

#[derive(Clone, Copy, Debug)]
enum Cond {
    None,
    IfMatchStar,
    IfMatchCurrent,
    IfMatchStale,
    IfNoneMatchStar,
}

impl Kind {
    fn path(self, name: &str) -> String {
        match self {
            Kind::Vmss => vmss_path(name),
            Kind::Cluster => cluster_path(name),
            Kind::Pool => pool_path("parent", name),
        }
    }

    fn body(self, n: i64) -> Value {
        match self {
            Kind::Vmss => {
                json!({"location": "westeurope", "sku": {"name": "Standard_D2s_v5", "capacity": n}})
            }
            Kind::Cluster => {
                json!({"location": "westeurope", "properties": {"agentPoolProfiles": [{"name": "np1", "count": n}]}})
            }
            Kind::Pool => {
                json!({"properties": {"count": n, "vmSize": "Standard_D2s_v5", "mode": "User"}})
            }
        }
    }

    /// Where the body carries the ETag: a scale set's `etag`, a managed cluster's `eTag` and an
    /// agent pool's `properties.eTag` (the AKS REST specification, 2024-09-01 and later).
    fn body_etag(self, body: &Value) -> Option<&str> {
        match self {
            Kind::Vmss => body["etag"].as_str(),
            Kind::Cluster => body["eTag"].as_str(),
            Kind::Pool => body["properties"]["eTag"].as_str(),
        }
    }

    fn stale(self) -> &'static str {
        match self {
            Kind::Vmss => "\"999999\"",
            _ => "5e5ffdce-356b-431b-b050-81b45eef2a12",
        }
    }

    /// Creates the resource (and the pool's parent cluster) and returns its ETag.
    async fn create(self, env: &Env, name: &str) -> String {
        match self {
            Kind::Vmss => env
                .handle
                .state()
                .seed_scale_set(ScaleSetSeed::new(SUB, RG, name, 2)),
            _ => {
                let a = env
                    .send("PUT", &self.path(name), None, None, Some(self.body(2)))
                    .await;
                assert_eq!(a.status, 201, "{kind:?} create: {}", a.text, kind = self);
                a.etag().expect("created resource has an ETag")
            }
        }
    }
}

async fn etag_of(env: &Env, path: &str) -> Option<String> {
    let a = env.get(path).await;
    (a.status == 200).then(|| a.etag().expect("GET answers an ETag header"))
}

/// Runs one cell and checks the status, the ETag change on success, and nothing changing otherwise.
async fn cell(
    env: &Env,
    kind: Kind,
    method: &str,
    present: bool,
    cond: Cond,
    expected: u16,
    n: usize,
) {
    let name = format!(
        "{}-{}-{n}",
        method.to_lowercase(),
        if present { "p" } else { "a" }
    );
    let path = kind.path(&name);
    let before = if present {
        Some(kind.create(env, &name).await)
    } else {
        None
    };
    let (im, inm) = match cond {
        Cond::None => (None, None),
        Cond::IfMatchStar => (Some("*".to_string()), None),
        Cond::IfMatchCurrent => (before.clone(), None),
        Cond::IfMatchStale => (Some(kind.stale().to_string()), None),
        Cond::IfNoneMatchStar => (None, Some("*".to_string())),
    };
    let body = (method != "DELETE").then(|| kind.body(5));
    let a = env
        .send(method, &path, im.as_deref(), inm.as_deref(), body)
        .await;
    assert_eq!(
        a.status, expected,
        "{kind:?} {method} present={present} {cond:?}: body {}",
        a.text
    );
    let after = etag_of(env, &path).await;
    match expected {
        200 | 201 if method != "DELETE" => {
            let new = a.etag().expect("successful write answers an ETag");
            assert_eq!(
                kind.body_etag(&a.body),
                Some(new.as_str()),
                "body etag equals header"
            );
            assert_ne!(
                Some(new.clone()),
                before,
                "every successful write changes the ETag"
            );
            assert_eq!(after, Some(new));
        }
        200 => assert_eq!(after, None, "deleted"),
        412 => {
            assert_eq!(a.error_code(), Some("PreconditionFailed"));
            assert_eq!(after, before, "a refused write changes nothing");
        }
        404 | 204 => assert_eq!(after, None),
        _ => {}
    }
}

async fn run_table(kind: Kind) {
    let env = Env::start().await;
    if kind == Kind::Pool {
        Kind::Cluster.create(&env, "parent").await;
    }
    use Cond::*;
    let table: &[(&str, bool, Cond, u16)] = &[
        ("PUT", false, None, 201),
        ("PUT", false, IfMatchStar, 412),
        ("PUT", false, IfMatchStale, 412),
        ("PUT", false, IfNoneMatchStar, 201),
        ("PUT", true, None, 200),
        ("PUT", true, IfMatchStar, 200),
        ("PUT", true, IfMatchCurrent, 200),
        ("PUT", true, IfMatchStale, 412),
        ("PUT", true, IfNoneMatchStar, 412),
        ("PATCH", false, None, 404),
        ("PATCH", false, IfMatchStar, 404),
        ("PATCH", false, IfMatchStale, 404),
        ("PATCH", true, None, 200),
        ("PATCH", true, IfMatchStar, 200),
        ("PATCH", true, IfMatchCurrent, 200),
        ("PATCH", true, IfMatchStale, 412),
        ("DELETE", false, None, 204),
        ("DELETE", false, IfMatchStar, 204),
        ("DELETE", false, IfMatchStale, 204),
        ("DELETE", true, None, 200),
        ("DELETE", true, IfMatchStar, 200),
        ("DELETE", true, IfMatchCurrent, 200),
        ("DELETE", true, IfMatchStale, 412),
    ];
    for (n, (method, present, cond, expected)) in table.iter().enumerate() {
        cell(&env, kind, method, *present, *cond, *expected, n).await;
    }
}

#[tokio::test]
async fn every_cell_of_the_seeds_table_holds_for_scale_sets() {
    run_table(Kind::Vmss).await;
}

#[tokio::test]
async fn every_cell_of_the_seeds_table_holds_for_aks_managed_clusters() {
    run_table(Kind::Cluster).await;
}

#[tokio::test]
async fn every_cell_of_the_seeds_table_holds_for_aks_agent_pools() {
    run_table(Kind::Pool).await;
}

#[tokio::test]
async fn if_none_match_other_than_empty_or_star_is_a_bad_request_everywhere() {
    let env = Env::start().await;
    Kind::Cluster.create(&env, "parent").await;
    for kind in [Kind::Vmss, Kind::Cluster, Kind::Pool] {
        kind.create(&env, "exists").await;
        for (method, name) in [
            ("PUT", "exists"),
            ("PUT", "absent"),
            ("PATCH", "exists"),
            ("DELETE", "exists"),
        ] {
            let body = (method != "DELETE").then(|| kind.body(3));
            let a = env
                .send(method, &kind.path(name), None, Some("\"3\""), body)
                .await;
            assert_eq!(a.status, 400, "{kind:?} {method} {name}: {}", a.text);
            assert_eq!(a.error_code(), Some("BadRequest"));
        }
        // Empty If-None-Match is allowed.
        let a = env
            .send(
                "PUT",
                &kind.path("exists"),
                None,
                Some(""),
                Some(kind.body(3)),
            )
            .await;
        assert_eq!(a.status, 200, "{kind:?}: {}", a.text);
    }
}

#[tokio::test]
async fn if_match_together_with_if_none_match_star_is_a_bad_request_everywhere() {
    let env = Env::start().await;
    Kind::Cluster.create(&env, "parent").await;
    for kind in [Kind::Vmss, Kind::Cluster, Kind::Pool] {
        let etag = kind.create(&env, "exists").await;
        for (method, name) in [
            ("PUT", "exists"),
            ("PUT", "absent"),
            ("PATCH", "exists"),
            ("DELETE", "exists"),
        ] {
            let body = (method != "DELETE").then(|| kind.body(3));
            let a = env
                .send(method, &kind.path(name), Some(&etag), Some("*"), body)
                .await;
            assert_eq!(a.status, 400, "{kind:?} {method} {name}: {}", a.text);
            assert_eq!(a.error_code(), Some("BadRequest"));
        }
        assert_eq!(etag_of(&env, &kind.path("exists")).await, Some(etag));
    }
}

#[tokio::test]
async fn scale_set_etags_are_quoted_integers_and_aks_etags_are_guids() {
    let env = Env::start().await;
    let vmss = Kind::Vmss.create(&env, "v").await;
    assert!(vmss.starts_with('"') && vmss.ends_with('"'), "{vmss}");
    assert!(vmss.trim_matches('"').parse::<u64>().is_ok(), "{vmss}");
    let cluster = Kind::Cluster.create(&env, "c").await;
    assert!(uuid::Uuid::parse_str(&cluster).is_ok(), "{cluster}");
}

#[tokio::test]
async fn a_cluster_write_changes_every_pool_etag_and_a_pool_write_only_its_own() {
    let env = Env::start().await;
    let body = json!({"location": "westeurope", "properties": {"agentPoolProfiles": [
        {"name": "a", "count": 1}, {"name": "b", "count": 2}]}});
    let a = env
        .send("PUT", &cluster_path("c"), None, None, Some(body))
        .await;
    assert_eq!(a.status, 201);
    let c1 = a.etag().unwrap();
    let profile_etag = |v: &Value, pool: &str| -> String {
        v["properties"]["agentPoolProfiles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == pool)
            .unwrap()["eTag"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let a1 = etag_of(&env, &pool_path("c", "a")).await.unwrap();
    let b1 = etag_of(&env, &pool_path("c", "b")).await.unwrap();
    assert_eq!(
        profile_etag(&a.body, "a"),
        a1,
        "profile eTag equals the pool's ETag"
    );

    // Agent-pool write: only that pool's ETag changes.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "a"),
            Some(&a1),
            None,
            Some(json!({"properties": {"count": 4}})),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let a2 = w.etag().unwrap();
    assert_ne!(a2, a1);
    assert_eq!(etag_of(&env, &cluster_path("c")).await.unwrap(), c1);
    assert_eq!(etag_of(&env, &pool_path("c", "b")).await.unwrap(), b1);

    // Cluster write: the cluster's and every pool's ETag change.
    let w = env
        .send(
            "PATCH",
            &cluster_path("c"),
            Some(&c1),
            None,
            Some(json!({"properties": {"kubernetesVersion": "1.31.1"}})),
        )
        .await;
    assert_eq!(w.status, 200, "{}", w.text);
    let c2 = w.etag().unwrap();
    assert_ne!(c2, c1);
    let a3 = etag_of(&env, &pool_path("c", "a")).await.unwrap();
    let b2 = etag_of(&env, &pool_path("c", "b")).await.unwrap();
    assert_ne!(a3, a2);
    assert_ne!(b2, b1);
    assert_eq!(profile_etag(&w.body, "b"), b2);

    // The pool ETag read before the cluster write is now stale.
    let w = env
        .send(
            "PUT",
            &pool_path("c", "a"),
            Some(&a2),
            None,
            Some(json!({"properties": {"count": 5}})),
        )
        .await;
    assert_eq!(w.status, 412);
}

#[tokio::test]
async fn arm_calls_without_a_valid_token_get_401_with_a_bearer_challenge() {
    let env = Env::start().await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let resp = env.http.get(env.url(&vmss_path("v"))).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let challenge = resp.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        challenge.starts_with("Bearer authorization_uri=\""),
        "{challenge}"
    );
    assert!(challenge.contains("error=\"invalid_token\""), "{challenge}");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "AuthenticationFailed");

    let a = env
        .send_as("not-a-token", "GET", &vmss_path("v"), None, None, None)
        .await;
    assert_eq!(a.status, 401);
    assert_eq!(a.error_code(), Some("AuthenticationFailed"));
}

#[tokio::test]
async fn arm_calls_without_api_version_get_400_missing_api_version_parameter() {
    let env = Env::start().await;
    env.handle
        .state()
        .seed_scale_set(ScaleSetSeed::new(SUB, RG, "v", 1));
    let resp = env
        .http
        .get(format!("{}{}", env.handle.base_url(), vmss_path("v")))
        .bearer_auth(&env.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "MissingApiVersionParameter");
    assert_eq!(
        body["error"]["message"],
        "The api-version query parameter (?api-version=) is required for all requests."
    );
}
