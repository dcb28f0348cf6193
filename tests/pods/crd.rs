//! What the tests of the capacity APIs (ProvisioningRequests, CapacityBuffers) share: unique
//! names, the real API server's client, its CRDs from `deploy/base`, a namespace of a test's
//! own, and kubectl's table of a path.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use std::time::Duration;

/// `test` and six random hex digits: the real server keeps objects between runs.
pub fn unique(test: &str) -> String {
    format!("{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

/// A client of the real API server `KUBECONFIG` names, retries off.
pub async fn real_client() -> kube::Client {
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the test server's kubeconfig");
    let file = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

/// Installs the CRD `deploy/base/<file>` (once per server) and waits until `name` is served.
pub async fn install_crd(client: &kube::Client, file: &str, name: &str) {
    let path = format!("{}/deploy/base/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("the CRD file");
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).expect("the CRD parses");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("the real server refused the CRD {path}: {e}"),
    }
    for _ in 0..100 {
        let established = api
            .get(name)
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            // Discovery catches up a moment after Established.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the CRD {name} never became Established");
}

/// A namespace of its own (the real server keeps objects between runs).
pub async fn namespace(client: &kube::Client, test: &str) -> String {
    let ns = unique(test);
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let o = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    api.create(&PostParams::default(), &o)
        .await
        .expect("namespace");
    ns
}

/// kubectl's table of `path`: its column names and the first row's cells.
pub async fn table(client: &kube::Client, path: &str) -> (Vec<String>, Vec<Value>) {
    let req = http::Request::get(path)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let text = client.request_text(req).await.expect("table");
    let t: Value = serde_json::from_str(&text).expect("json");
    let columns = t["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let cells = t["rows"][0]["cells"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    (columns, cells)
}
