//! Shared fixtures for the controller's tests: an emulator, settings pointing at it, and a
//! reconciler whose credential is a token minted by the emulator.
#![allow(dead_code)] // each test binary uses a different subset

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
        shutdown_grace: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        quota_cooldown: Duration::from_secs(300),
        node_groups: groups,
        auto_discovery: None,
    }
}

pub struct Harness {
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
/// `client_id` with `secret` read from a file, built by the real `cli::arm_client` path (which
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
        let arm = vmss_capacity_controller::cli::arm_client(&settings, metrics.clone())
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
