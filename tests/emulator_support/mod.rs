//! Shared fixtures for the emulator tests: a started emulator, a token, and a small request helper.
#![allow(dead_code)]

use reqwest::header::HeaderMap;
use serde_json::Value;
use vmss_capacity_controller::emulator::{EmulatorBuilder, EmulatorHandle};

pub const SUB: &str = "00000000-0000-0000-0000-000000000001";
pub const RG: &str = "rg-test";
pub const API: &str = "2024-07-01";

pub fn vmss_path(name: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}")
}

pub fn cluster_path(name: &str) -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/{name}")
}

pub fn pool_path(cluster: &str, pool: &str) -> String {
    format!("{}/agentPools/{pool}", cluster_path(cluster))
}

/// An answer: status, headers, JSON body (Null when empty or not JSON).
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Answer {
    pub fn etag(&self) -> Option<String> {
        self.headers
            .get("etag")
            .map(|v| v.to_str().unwrap().to_string())
    }
    pub fn error_code(&self) -> Option<&str> {
        self.body.pointer("/error/code").and_then(Value::as_str)
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }
}

pub struct Env {
    pub handle: EmulatorHandle,
    pub http: reqwest::Client,
    pub token: String,
}

impl Env {
    pub async fn start() -> Env {
        Env::with(EmulatorBuilder::new()).await
    }

    pub async fn with(builder: EmulatorBuilder) -> Env {
        let handle = builder.start().await.expect("emulator starts");
        let token = handle.state().issue_token("tester");
        let mut b = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10));
        if let Some(pem) = handle.ca_pem() {
            b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
        }
        Env {
            handle,
            http: b.build().unwrap(),
            token,
        }
    }

    pub fn url(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}api-version={API}", self.handle.base_url())
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        if_match: Option<&str>,
        if_none_match: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        self.send_as(&self.token, method, path, if_match, if_none_match, body)
            .await
    }

    pub async fn send_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        if_match: Option<&str>,
        if_none_match: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, self.url(path)).bearer_auth(token);
        if let Some(v) = if_match {
            req = req.header("If-Match", v);
        }
        if let Some(v) = if_none_match {
            req = req.header("If-None-Match", v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request answered");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
            text,
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None, None, None).await
    }
}

/// Sends a request from a separate runtime on a blocking thread, so a test runtime with a paused
/// clock neither auto-advances while waiting for the answer (tokio inhibits auto-advance during
/// `spawn_blocking`) nor fires client timers.
pub async fn send_off_clock(
    method: &str,
    url: String,
    token: Option<String>,
    if_match: Option<String>,
    body: Option<Value>,
) -> Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = reqwest::Client::new();
            let mut req = client.request(method, url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            if let Some(m) = if_match {
                req = req.header("If-Match", m);
            }
            if let Some(b) = body {
                req = req.json(&b);
            }
            let resp = req.send().await.expect("request answered");
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let text = resp.text().await.unwrap();
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            Answer {
                status,
                headers,
                body,
                text,
            }
        })
    })
    .await
    .unwrap()
}

impl Env {
    /// [`send_off_clock`] with this environment's token.
    pub async fn off_clock(
        &self,
        method: &str,
        path: &str,
        if_match: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        send_off_clock(
            method,
            self.url(path),
            Some(self.token.clone()),
            if_match.map(str::to_string),
            body,
        )
        .await
    }
}
