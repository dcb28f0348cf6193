//! Shared fixtures for the controller's tests: an emulator, settings pointing at it, and a
//! reconciler whose credential is a token minted by the emulator.
#![allow(dead_code)] // each test binary uses a different subset

pub mod pod_cluster;

use std::sync::Arc;
use std::time::Duration;
use vmss_capacity_controller::azure::arm::{http_client, ArmTarget};
use vmss_capacity_controller::azure::ArmClient;
use vmss_capacity_controller::config::{
    AuthSettings, AzureSettings, ConflictStrategy, NodeGroupKind, NodeGroupSpec, SecretSource,
    Settings, WriteBudget,
};
use vmss_capacity_controller::emulator::{
    EmulatorBuilder, EmulatorHandle, EmulatorState, RequestRecord, ScaleSetSeed,
};
use vmss_capacity_controller::metrics::Metrics;
use vmss_capacity_controller::reconciler::Reconciler;

pub const SUB: &str = "00000000-0000-0000-0000-000000000000";
pub const RG: &str = "rg-test";

/// A bearer token minted by the emulator, so the writer identity is `client_id`.
#[derive(Debug)]
pub struct EmulatorToken(pub String);

#[async_trait::async_trait]
impl azure_core::auth::TokenCredential for EmulatorToken {
    async fn get_token(
        &self,
        _scopes: &[&str],
    ) -> azure_core::Result<azure_core::auth::AccessToken> {
        let expires = time::OffsetDateTime::now_utc() + Duration::from_secs(3600);
        Ok(azure_core::auth::AccessToken::new(self.0.clone(), expires))
    }
    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

pub fn group(name: &str, min: u32, max: u32, desired: Option<u32>) -> NodeGroupSpec {
    NodeGroupSpec {
        name: name.into(),
        kind: NodeGroupKind::Vmss,
        resource_group: None,
        min_size: min,
        max_size: max,
        desired_capacity: desired,
        schedules: vec![],
        max_scale_down_step: None,
    }
}

pub fn settings(base_url: &str, groups: Vec<NodeGroupSpec>) -> Settings {
    let url = url::Url::parse(base_url).unwrap();
    Settings {
        azure: AzureSettings {
            resource_manager_endpoint: url.clone(),
            authority_host: url.clone(),
            imds_endpoint: url,
            tenant_id: "tenant".into(),
            subscription_id: SUB.into(),
            resource_group: RG.into(),
            auth: AuthSettings::ClientSecret {
                client_id: "controller".into(),
                secret: SecretSource::Env("UNUSED".into()),
            },
            ca_bundle_file: None,
        },
        enable_vmss_etag: true,
        conflict_strategy: ConflictStrategy::Replan,
        scan_interval: Duration::from_secs(10),
        vmss_cache_ttl: Duration::from_secs(60),
        instance_cache_ttl: Duration::from_secs(300),
        instance_cache_jitter: Duration::ZERO,
        metrics_listen: None,
        max_concurrent_writes: 4,
        write_budget: WriteBudget {
            per_minute: 600.0,
            burst: 100,
        },
        agent_pool_write_budget: WriteBudget {
            per_minute: 600.0,
            burst: 100,
        },
        shutdown_grace: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        quota_cooldown: Duration::from_secs(300),
        arm_budget_reserve: vmss_capacity_controller::config::DEFAULT_ARM_BUDGET_RESERVE,
        node_groups: groups,
        auto_discovery: None,
        kubernetes: Default::default(),
        pod_demand: Default::default(),
        scale_down: Default::default(),
        consolidation: Default::default(),
        // No test reaches the network: prices come from the embedded table unless a test
        // points `prices.endpoint` at the emulator.
        prices: vmss_capacity_controller::config::PriceSettings {
            fetch: false,
            ..Default::default()
        },
    }
}

pub struct Harness {
    /// What backs the node groups under test.
    pub kind: Kind,
    pub emulator: EmulatorHandle,
    pub state: EmulatorState,
    pub metrics: Arc<Metrics>,
    pub arm: Arc<ArmClient>,
    pub reconciler: Reconciler,
    pub settings: Arc<Settings>,
}

impl Harness {
    /// Emulator with `seeds` as (name, capacity), and a reconciler for `groups`.
    pub async fn new(
        seeds: &[(&str, i64)],
        groups: Vec<NodeGroupSpec>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        Self::with_emulator(EmulatorBuilder::new(), seeds, groups, tweak).await
    }

    pub async fn with_emulator(
        builder: EmulatorBuilder,
        seeds: &[(&str, i64)],
        groups: Vec<NodeGroupSpec>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        let emulator = builder.start().await.expect("emulator starts");
        let state = emulator.state();
        for (name, capacity) in seeds {
            state.seed_scale_set(ScaleSetSeed::new(SUB, RG, name, *capacity));
        }
        let mut s = settings(&emulator.base_url(), groups);
        tweak(&mut s);
        let settings = Arc::new(s);
        let metrics = Arc::new(Metrics::new());
        let arm = arm_client(&emulator, &state, "controller", metrics.clone());
        let reconciler =
            Reconciler::builder(settings.clone(), arm.clone(), metrics.clone()).build();
        Harness {
            kind: Kind::Vmss,
            emulator,
            state,
            metrics,
            arm,
            reconciler,
            settings,
        }
    }

    /// Another reconciler (a second replica) with its own identity and metrics.
    pub fn replica(&self, writer: &str) -> (Reconciler, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let arm = arm_client(&self.emulator, &self.state, writer, metrics.clone());
        (
            Reconciler::builder(self.settings.clone(), arm, metrics.clone()).build(),
            metrics,
        )
    }

    pub fn puts(&self) -> Vec<RequestRecord> {
        self.state
            .request_log()
            .into_iter()
            .filter(|r| r.method == "PUT")
            .collect()
    }

    pub fn requests(&self, method: &str, path_suffix: &str) -> Vec<RequestRecord> {
        self.state
            .request_log()
            .into_iter()
            .filter(|r| {
                r.method == method
                    && r.path
                        .split('?')
                        .next()
                        .unwrap_or("")
                        .ends_with(path_suffix)
            })
            .collect()
    }

    pub fn capacity(&self, name: &str) -> i64 {
        self.state
            .scale_set(SUB, RG, name)
            .expect("scale set exists")
            .capacity
    }

    pub fn etag(&self, name: &str) -> String {
        self.state
            .scale_set(SUB, RG, name)
            .expect("scale set exists")
            .etag
    }

    pub fn counter(&self, c: &prometheus::IntCounterVec, labels: &[(&str, &str)]) -> u64 {
        Metrics::counter_sum(c, labels)
    }
}

pub fn arm_client(
    emulator: &EmulatorHandle,
    state: &EmulatorState,
    writer: &str,
    metrics: Arc<Metrics>,
) -> Arc<ArmClient> {
    let http = http_client(
        Duration::from_secs(10),
        emulator.ca_pem().as_deref().map(str::as_bytes),
    )
    .unwrap();
    arm_client_with_http(emulator, state, writer, metrics, http)
}

/// [`arm_client`] on an existing HTTP client (building one per client is slow in a debug build).
pub fn arm_client_with_http(
    emulator: &EmulatorHandle,
    state: &EmulatorState,
    writer: &str,
    metrics: Arc<Metrics>,
    http: reqwest::Client,
) -> Arc<ArmClient> {
    let token = state.issue_token(writer);
    let target = ArmTarget {
        endpoint: url::Url::parse(&emulator.base_url()).unwrap(),
        subscription: SUB.into(),
        resource_group: RG.into(),
    };
    Arc::new(ArmClient::new(
        target,
        Arc::new(EmulatorToken(token)),
        http,
        metrics,
    ))
}

/// Polls `cond` every 20 ms for at most `patience`.
pub async fn eventually(patience: Duration, mut cond: impl FnMut() -> bool) -> bool {
    // tokio's clock: under a paused clock the patience is virtual and the wait takes no real time.
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// A demand the test turns like a knob, one value per scale set (groups without a value hold).
#[derive(Debug, Default)]
pub struct KnobDemand(parking_lot::Mutex<std::collections::HashMap<String, i64>>);

impl KnobDemand {
    /// Sets what `name` wants.
    pub fn set(&self, name: &str, want: i64) {
        self.0.lock().insert(name.to_string(), want);
    }
}

impl vmss_capacity_controller::planner::DemandSource for KnobDemand {
    fn demand(
        &self,
        group: &NodeGroupSpec,
        _now: time::OffsetDateTime,
    ) -> (
        vmss_capacity_controller::planner::Demand,
        vmss_capacity_controller::planner::Reason,
    ) {
        use vmss_capacity_controller::planner::{Demand, Reason};
        match self.0.lock().get(&group.name) {
            Some(n) => (Demand::Exact(*n), Reason::Desired),
            None => (Demand::Hold, Reason::Desired),
        }
    }
}

/// A fault on `method` requests whose path contains `path`, for `count` of them (`None`: until
/// cleared).
pub fn fault(
    method: Option<&str>,
    path: Option<&str>,
    kind: vmss_capacity_controller::emulator::FaultKind,
    count: Option<u32>,
) -> vmss_capacity_controller::emulator::FaultSpec {
    vmss_capacity_controller::emulator::FaultSpec {
        method: method.map(str::to_string),
        path_contains: path.map(str::to_string),
        kind,
        count,
        probability: None,
        seed: None,
    }
}

/// An injected HTTP status with an ARM error code and an optional `Retry-After`.
pub fn status_kind(
    code: u16,
    name: &str,
    retry_after_secs: Option<u64>,
) -> vmss_capacity_controller::emulator::FaultKind {
    vmss_capacity_controller::emulator::FaultKind::Status {
        code,
        code_name: Some(name.into()),
        retry_after_secs,
    }
}

/// The scale-set name a logged ARM path addresses (`None` for LISTs and operations).
pub fn scale_set_of(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or("");
    let lower_idx = path
        .to_ascii_lowercase()
        .find("/virtualmachinescalesets/")?;
    let rest = &path[lower_idx + "/virtualMachineScaleSets/".len()..];
    rest.split('/').next().filter(|s| !s.is_empty())
}

/// Capacity PUTs (of a scale set itself, not its sub-resources) sent by `writer`, oldest first.
pub fn capacity_puts_by(log: &[RequestRecord], writer: &str) -> Vec<RequestRecord> {
    log.iter()
        .filter(|r| r.method == "PUT" && r.writer.as_deref() == Some(writer))
        .filter(|r| {
            let p = r.path.split('?').next().unwrap_or("");
            scale_set_of(p).is_some_and(|n| p.ends_with(n))
        })
        .cloned()
        .collect()
}

/// A controller whose credential goes through the emulator's token endpoint: client
/// `client_id` with `secret` read from a file, built by the real `app::arm_client` path (which
/// counts `credential_errors_total`).
pub struct SecretController {
    pub reconciler: Reconciler,
    pub metrics: Arc<Metrics>,
    pub settings: Arc<Settings>,
    /// Holds the secret file.
    pub dir: tempfile::TempDir,
}

impl Harness {
    /// A controller for the same groups that authenticates with a client secret from a file.
    pub fn secret_controller(&self, client_id: &str, secret: &str) -> SecretController {
        self.secret_controller_with(client_id, secret, |_| {})
    }

    /// [`Harness::secret_controller`] with its settings adjusted by `tweak`.
    pub fn secret_controller_with(
        &self,
        client_id: &str,
        secret: &str,
        tweak: impl FnOnce(&mut Settings),
    ) -> SecretController {
        self.state.register_client(client_id, secret);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("client-secret");
        std::fs::write(&path, secret).expect("secret file written");
        let mut s = (*self.settings).clone();
        s.azure.auth = AuthSettings::ClientSecret {
            client_id: client_id.into(),
            secret: SecretSource::File(path),
        };
        tweak(&mut s);
        let settings = Arc::new(s);
        let metrics = Arc::new(Metrics::new());
        let arm = vmss_capacity_controller::app::arm_client(&settings, metrics.clone())
            .expect("ARM client with a file secret");
        let reconciler = Reconciler::builder(settings.clone(), arm, metrics.clone()).build();
        SecretController {
            reconciler,
            metrics,
            settings,
            dir,
        }
    }
}

/// The error and its sources, joined with ": ".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The managed cluster whose agent pools are the node groups of [`Kind::AgentPool`] tests.
pub const CLUSTER: &str = "aks-1";
/// The AKS API version the tests' own HTTP calls use.
pub const AKS_API: &str = "2024-09-01";

/// What backs a node group under test: the same behaviour is proven for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A VM scale set in [`RG`].
    Vmss,
    /// An agent pool of managed cluster [`CLUSTER`] in [`RG`].
    AgentPool,
}

impl Kind {
    /// `group` of this kind.
    pub fn group(self, name: &str, min: u32, max: u32, desired: Option<u32>) -> NodeGroupSpec {
        let mut g = group(name, min, max, desired);
        if self == Kind::AgentPool {
            g.kind = NodeGroupKind::AksAgentPool {
                cluster: CLUSTER.into(),
            };
        }
        g
    }

    /// The path suffix of requests for the resource itself.
    pub fn path(self, name: &str) -> String {
        match self {
            Kind::Vmss => format!("/virtualMachineScaleSets/{name}"),
            Kind::AgentPool => format!("/agentPools/{name}"),
        }
    }
}

/// What a read of one node group's resource showed (through the emulator's API).
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub capacity: i64,
    pub etag: String,
    pub tags: std::collections::BTreeMap<String, String>,
    pub provisioning_state: String,
}

fn pool_etag(v: &serde_json::Value) -> Option<String> {
    v.pointer("/properties/eTag")
        .or_else(|| v.get("etag"))
        .and_then(|e| e.as_str())
        .map(str::to_string)
}

impl Harness {
    /// Like [`Harness::with_emulator`], for node groups of `kind`: agent pools are created as
    /// pools of [`CLUSTER`] (through the ARM API, as writer `seeder`), scale sets are seeded.
    pub async fn with_kind(
        kind: Kind,
        builder: EmulatorBuilder,
        seeds: &[(&str, i64)],
        groups: Vec<NodeGroupSpec>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        let groups = groups
            .into_iter()
            .map(|g| {
                let mut k = kind.group(&g.name, g.min_size, g.max_size, g.desired_capacity);
                k.schedules = g.schedules;
                k.max_scale_down_step = g.max_scale_down_step;
                k
            })
            .collect();
        match kind {
            Kind::Vmss => {
                let mut h = Self::with_emulator(builder, seeds, groups, tweak).await;
                h.kind = kind;
                h
            }
            Kind::AgentPool => {
                let mut h = Self::with_emulator(builder, &[], groups, tweak).await;
                h.kind = kind;
                let profiles: Vec<serde_json::Value> = seeds
                    .iter()
                    .map(|(n, c)| serde_json::json!({"name": n, "count": c, "vmSize": "Standard_D2s_v5", "mode": "User"}))
                    .collect();
                let (status, body) = h
                    .arm_json(
                        "seeder",
                        reqwest::Method::PUT,
                        &h.cluster_path(),
                        Some(serde_json::json!({"location": "westeurope", "properties": {
                            "kubernetesVersion": "1.30.6", "dnsPrefix": CLUSTER,
                            "agentPoolProfiles": profiles}})),
                        None,
                    )
                    .await;
                assert!(status < 300, "cluster created: {status} {body}");
                // Built after the pools exist, as in production where they precede the controller.
                h.reconciler =
                    Reconciler::builder(h.settings.clone(), h.arm.clone(), h.metrics.clone())
                        .build();
                h
            }
        }
    }

    /// The ARM path of [`CLUSTER`].
    pub fn cluster_path(&self) -> String {
        format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ContainerService/managedClusters/{CLUSTER}")
    }

    /// One ARM call as `writer`; the JSON answer (`Null` when empty).
    pub async fn arm_json(
        &self,
        writer: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        if_match: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let token = self.state.issue_token(writer);
        let http = http_client(
            Duration::from_secs(10),
            self.emulator.ca_pem().as_deref().map(str::as_bytes),
        )
        .unwrap();
        let url = format!("{}{path}?api-version={AKS_API}", self.emulator.base_url());
        let mut req = http.request(method, url).bearer_auth(token);
        if let Some(e) = if_match {
            req = req.header("If-Match", e);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let rsp = req.send().await.expect("emulator answers");
        let status = rsp.status().as_u16();
        let bytes = rsp.bytes().await.unwrap_or_default();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    /// The resource behind node group `name` as the emulator has it now; `None` when absent.
    pub async fn observe(&self, name: &str) -> Option<Observed> {
        match self.kind {
            Kind::Vmss => self.state.scale_set(SUB, RG, name).map(|v| Observed {
                capacity: v.capacity,
                etag: v.etag,
                tags: v.tags.into_iter().collect(),
                provisioning_state: v.provisioning_state.to_string(),
            }),
            Kind::AgentPool => {
                let path = format!("{}/agentPools/{name}", self.cluster_path());
                let (status, v) = self
                    .arm_json("observer", reqwest::Method::GET, &path, None, None)
                    .await;
                (status == 200).then(|| Observed {
                    capacity: v
                        .pointer("/properties/count")
                        .and_then(|c| c.as_i64())
                        .expect("count"),
                    // Empty when a fault strips it (the tests that inject one read no ETag).
                    etag: pool_etag(&v).unwrap_or_default(),
                    tags: v
                        .pointer("/properties/tags")
                        .and_then(|t| serde_json::from_value(t.clone()).ok())
                        .unwrap_or_default(),
                    provisioning_state: v
                        .pointer("/properties/provisioningState")
                        .and_then(|p| p.as_str())
                        .unwrap_or_default()
                        .to_string(),
                })
            }
        }
    }

    /// The capacity the emulator has for `name` now.
    pub async fn capacity_now(&self, name: &str) -> i64 {
        self.observe(name).await.expect("resource exists").capacity
    }

    /// The ETag the emulator has for `name` now.
    pub async fn etag_now(&self, name: &str) -> String {
        self.observe(name).await.expect("resource exists").etag
    }

    /// A rival writer changes `name`'s capacity and/or merges tags, as a careful client does
    /// (read, then write with `If-Match`); returns the new ETag.
    pub async fn rival_write(
        &self,
        name: &str,
        capacity: Option<i64>,
        tags: Option<std::collections::BTreeMap<String, String>>,
        writer: &str,
    ) -> String {
        match self.kind {
            Kind::Vmss => match (capacity, tags) {
                (Some(c), None) => self.state.rival_set_capacity(SUB, RG, name, c, writer),
                (None, Some(t)) => self.state.rival_set_tags(SUB, RG, name, t, writer),
                (Some(c), Some(t)) => {
                    self.state.rival_set_tags(SUB, RG, name, t, writer).unwrap();
                    self.state.rival_set_capacity(SUB, RG, name, c, writer)
                }
                (None, None) => panic!("a rival write changes something"),
            }
            .expect("rival write lands"),
            Kind::AgentPool => {
                let path = format!("{}/agentPools/{name}", self.cluster_path());
                let (status, mut v) = self
                    .arm_json(writer, reqwest::Method::GET, &path, None, None)
                    .await;
                assert_eq!(status, 200, "rival reads the pool");
                let etag = pool_etag(&v).expect("pool ETag");
                let props = v
                    .get_mut("properties")
                    .and_then(|p| p.as_object_mut())
                    .expect("properties");
                if let Some(c) = capacity {
                    props.insert("count".into(), c.into());
                }
                if let Some(t) = tags {
                    let mut all: std::collections::BTreeMap<String, String> = props
                        .get("tags")
                        .and_then(|t| serde_json::from_value(t.clone()).ok())
                        .unwrap_or_default();
                    all.extend(t);
                    props.insert("tags".into(), serde_json::to_value(all).unwrap());
                }
                let (status, v) = self
                    .arm_json(writer, reqwest::Method::PUT, &path, Some(v), Some(&etag))
                    .await;
                assert!(status < 300, "rival write lands: {status} {v}");
                pool_etag(&v).expect("pool ETag after write")
            }
        }
    }

    /// A cluster-level write by `writer` (a tag on the managed cluster, as an upgrade or a
    /// Terraform apply would make): under AKS's scoping rule it changes every pool's ETag.
    pub async fn rival_cluster_write(&self, writer: &str) {
        let (status, mut v) = self
            .arm_json(
                writer,
                reqwest::Method::GET,
                &self.cluster_path(),
                None,
                None,
            )
            .await;
        assert_eq!(status, 200, "rival reads the cluster");
        let etag = v
            .get("etag")
            .or_else(|| v.get("eTag"))
            .and_then(|e| e.as_str())
            .map(str::to_string);
        let seq = v
            .pointer("/tags/rival")
            .and_then(|t| t.as_str())
            .unwrap_or("0")
            .len();
        v["tags"] = serde_json::json!({"rival": "x".repeat(seq + 1)});
        let (status, v) = self
            .arm_json(
                writer,
                reqwest::Method::PUT,
                &self.cluster_path(),
                Some(v),
                etag.as_deref(),
            )
            .await;
        assert!(status < 300, "cluster-level write lands: {status} {v}");
    }

    /// Capacity writes (PUTs of the resource itself) sent by the controller under test.
    pub fn our_puts(&self) -> Vec<RequestRecord> {
        let suffix = self.kind.path("");
        self.state
            .request_log()
            .into_iter()
            .filter(|r| r.method == "PUT" && r.writer.as_deref() == Some("controller"))
            .filter(|r| {
                let p = r.path.split('?').next().unwrap_or("");
                p.rsplit_once('/')
                    .is_some_and(|(head, _)| format!("{head}/").ends_with(&suffix))
            })
            .collect()
    }

    /// Requests by the controller under test (not the tests' own observers and rivals).
    pub fn our_requests(&self, method: &str, path_suffix: &str) -> Vec<RequestRecord> {
        self.requests(method, path_suffix)
            .into_iter()
            .filter(|r| r.writer.as_deref() == Some("controller"))
            .collect()
    }

    /// Instance LISTs the controller made for node group `name`.
    pub fn instance_lists(&self, name: &str) -> usize {
        let needle = match self.kind {
            Kind::Vmss => format!("/{name}/virtualMachines"),
            Kind::AgentPool => format!("/aks-{name}-"),
        };
        self.state
            .request_log()
            .into_iter()
            .filter(|r| {
                r.method == "GET"
                    && r.writer.as_deref() == Some("controller")
                    && r.path.contains(&needle)
                    && r.path.ends_with("/virtualMachines")
            })
            .count()
    }
}

/// Runs an async test body once per node-group kind: `mod <test> { fn vmss, fn aks_agent_pool }`.
#[macro_export]
macro_rules! for_each_kind {
    ($(#[$attr:meta])* async fn $name:ident($kind:ident: Kind) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($kind: Kind) $body

            $(#[$attr])*
            async fn vmss() {
                body(Kind::Vmss).await
            }

            $(#[$attr])*
            async fn aks_agent_pool() {
                body(Kind::AgentPool).await
            }
        }
    };
}

/// A whole replica (the daemon's wiring, `Replica::build` then `serve`) running in a task until
/// the returned token is cancelled.
pub async fn serve_replica(
    settings: Settings,
    metrics: Arc<Metrics>,
    dry_run: bool,
    identity: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let replica = vmss_capacity_controller::app::Replica::build(
        Arc::new(settings),
        metrics,
        vmss_capacity_controller::app::ReplicaOptions {
            dry_run,
            identity: Some(identity.into()),
        },
    )
    .await
    .expect("the replica builds");
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(replica.serve(stop.clone(), std::future::pending()));
    (stop, task)
}
