//! The application: one controller replica wired from its settings (ARM client, reconciler,
//! and with `kubernetes.enabled` the Kubernetes client, Events, leader election, the status
//! writer, the reflectors and the scale-up and scale-down loops). The CLI's `run` builds one;
//! `demo --kubernetes` builds two in one process; neither wiring lives in the CLI.

use crate::azure::arm::{http_client, ArmTarget};
use crate::azure::{credentials, ArmClient};
use crate::config::{self, Settings};
use crate::metrics::Metrics;
use crate::reconciler::Reconciler;
use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A process exit code chosen by a subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(pub u8);

/// Builds the ARM client (HTTP client, credential) for `settings`.
pub fn arm_client(settings: &Settings, metrics: Arc<Metrics>) -> anyhow::Result<Arc<ArmClient>> {
    let extra_root = match &settings.azure.ca_bundle_file {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("reading azure.caBundleFile {}", p.display()))?,
        ),
        None => None,
    };
    let http = http_client(settings.request_timeout, extra_root.as_deref())
        .context("building the HTTP client")?;
    let m = metrics.clone();
    let hook: credentials::MetricsHook = Arc::new(move |kind: &'static str, ok: bool| {
        if !ok {
            m.credential_errors_total.with_label_values(&[kind]).inc();
        }
    });
    let credential = credentials::build_credential(&settings.azure, http.clone(), Some(hook))
        .context("building the Azure credential")?;
    let target = ArmTarget {
        endpoint: settings.azure.resource_manager_endpoint.clone(),
        subscription: settings.azure.subscription_id.clone(),
        resource_group: settings.azure.resource_group.clone(),
    };
    Ok(Arc::new(ArmClient::new(target, credential, http, metrics)))
}

/// How a [`Replica`] is built beyond its settings.
#[derive(Debug, Clone, Default)]
pub struct ReplicaOptions {
    /// Plan and log, never write (`run --dry-run`).
    pub dry_run: bool,
    /// The Lease and Events identity; `None`: the pod name plus a random suffix
    /// ([`crate::kube::identity`]).
    pub identity: Option<String>,
}

/// One controller replica wired as `run` wires it: its ARM client, and with
/// `kubernetes.enabled` its Kubernetes client, Events recorder and poster, leader election on
/// the Lease (the fence of every Azure write), status writer and reflectors. `run` builds one;
/// `demo --kubernetes` builds two in one process.
pub struct Replica {
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    reconciler: Arc<Reconciler>,
    election: Option<Arc<crate::kube::lease::LeaderElection>>,
    /// `run --dry-run`: no write of any kind.
    dry_run: bool,
    identity: Option<String>,
    kube_client: Option<kube::Client>,
    /// Stops the Event poster and the status writer.
    kube_stop: CancellationToken,
    kube_tasks: Option<KubeTasks>,
    /// `demand: pods`: what the scale-up loop publishes to (the reconciler's demand source).
    pod_demand: Option<Arc<crate::autoscale::scale_up::PodDemand>>,
    events: Arc<dyn crate::notify::EventSink>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("identity", &self.identity)
            .field("election", &self.election)
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// Builds the replica and starts its Event poster and status writer (they write only while
    /// the fence lets this replica write). Nothing reconciles until [`Replica::serve`] or
    /// [`Replica::once`].
    pub async fn build(
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        options: ReplicaOptions,
    ) -> anyhow::Result<Self> {
        let arm = arm_client(&settings, metrics.clone())?;
        let kube_side = kube_side(&settings, metrics.clone(), options.identity).await?;
        let identity = kube_side.as_ref().map(|k| k.identity.clone());
        if let Some(id) = &identity {
            // One identity for the Lease, the Events and the Azure calls' User-Agent.
            arm.set_instance(id);
        }
        // A dry run writes nothing anywhere: it takes no Lease (every dry-running replica plans
        // on its own), posts no Event (it logs them) and writes no status ConfigMap; the
        // reconciler holds its Azure writes and scale-down only says what it would remove.
        let election = if options.dry_run {
            if kube_side.is_some() && settings.kubernetes.leader_election.enabled {
                tracing::info!("dry run: no Lease is taken; Events are logged, not posted, and no status is written");
            }
            None
        } else {
            leader_election(&settings, kube_side.as_ref())
        };
        let events: Arc<dyn crate::notify::EventSink> = match &kube_side {
            _ if options.dry_run => Arc::new(crate::notify::LogEvents),
            Some(k) => k.recorder.clone(),
            None => Arc::new(crate::notify::NoEvents),
        };
        let mut builder = Reconciler::builder(settings.clone(), arm, metrics.clone())
            .dry_run(options.dry_run)
            .events(events.clone());
        if let Some(e) = &election {
            builder = builder.fence(e.leadership());
        }
        let pod_demand = crate::autoscale::scale_up::demand_source(&settings);
        if let Some(d) = &pod_demand {
            builder = builder.demand(d.clone());
        }
        let reconciler = Arc::new(builder.build());
        let kube_client = kube_side.as_ref().map(|k| k.client.clone());
        // Events and the status ConfigMap: background tasks owned here, stopped by `kube_stop`.
        let kube_stop = CancellationToken::new();
        let kube_tasks = kube_side.filter(|_| !options.dry_run).map(|k| {
            let fence: Arc<dyn crate::fence::WriteFence> = match &election {
                Some(e) => e.leadership(),
                None => Arc::new(crate::fence::Unfenced),
            };
            k.spawn(
                &settings,
                reconciler.clone(),
                fence,
                metrics.clone(),
                kube_stop.clone(),
            )
        });
        Ok(Self {
            settings,
            metrics,
            reconciler,
            election,
            dry_run: options.dry_run,
            identity,
            kube_client,
            kube_stop,
            kube_tasks,
            pod_demand,
            events,
        })
    }

    /// The reconciler (its caches, its status).
    pub fn reconciler(&self) -> Arc<Reconciler> {
        self.reconciler.clone()
    }

    /// The metrics this replica counts in.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether this replica leads, when leader election is on (the fence of its Azure writes).
    pub fn leadership(&self) -> Option<Arc<crate::kube::lease::Leadership>> {
        self.election.as_ref().map(|e| e.leadership())
    }

    /// The Lease and Events identity, when `kubernetes.enabled`.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// `run --once`: one Lease attempt, one pass, the status written, the Lease released.
    pub async fn once(self) -> ExitCode {
        let Replica {
            reconciler,
            election,
            kube_stop,
            kube_tasks,
            ..
        } = self;
        if let Some(e) = &election {
            // One attempt: a pass by a replica that does not get the Lease writes nothing.
            if let Err(err) = e.try_acquire_or_renew().await {
                tracing::warn!(error = %err, "lease attempt failed: this pass will not write");
            }
        }
        let pass = reconciler.run_once().await;
        if let Some(tasks) = &kube_tasks {
            // The leader of this one pass says what it did before it lets go of the Lease.
            tasks.write_status_now(&reconciler).await;
        }
        if let Some(e) = &election {
            e.release().await;
        }
        stop_kube_tasks(kube_stop, kube_tasks).await;
        match pass {
            Ok(report) => {
                tracing::info!(
                    planned = report.planned,
                    written = report.written,
                    conflicts = report.conflicts,
                    held = report.held,
                    "pass complete"
                );
                ExitCode(0)
            }
            Err(e) => {
                tracing::error!(error = %e, cause = ?std::error::Error::source(&e).map(|s| s.to_string()), "pass failed");
                ExitCode(1)
            }
        }
    }

    /// The daemon: reflectors, `/metrics` (when `metricsListen`), the elector, the reconcile
    /// loop, until `shutdown` is cancelled or `signal` completes (SIGTERM in `run`). On the way
    /// out the elector releases the Lease and the Kubernetes tasks stop.
    pub async fn serve(
        self,
        shutdown: CancellationToken,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Replica {
            settings,
            metrics,
            reconciler,
            election,
            dry_run,
            kube_client,
            kube_stop,
            kube_tasks,
            pod_demand,
            events,
            identity,
            ..
        } = self;
        let ca_client = kube_client.clone();
        // The reflectors start before the loop so their first full lists overlap the first
        // scale-set refresh; /readyz waits for both.
        let node_actions: Option<Arc<dyn crate::kube::nodes::NodeActions>> = kube_client
            .as_ref()
            .filter(|_| settings.scale_down.enabled)
            .map(|c| {
                Arc::new(crate::kube::nodes::KubeNodeActions::new(c.clone()))
                    as Arc<dyn crate::kube::nodes::NodeActions>
            });
        // ProvisioningRequests' status is written like our other Kubernetes writes: not in a
        // dry run (`kube_tasks` is then absent).
        let provreq_client = kube_client
            .clone()
            .filter(|_| settings.pod_demand.provisioning_requests && kube_tasks.is_some());
        // CapacityBuffers' status likewise.
        let buffer_client = kube_client
            .clone()
            .filter(|_| settings.pod_demand.capacity_buffer_controller && kube_tasks.is_some());
        let (cluster, reflectors) = match kube_client {
            Some(client) => {
                let (view, tasks) =
                    crate::kube::reflect::start(client, metrics.clone(), shutdown.clone()).await;
                (Some(view), tasks)
            }
            None => (None, Vec::new()),
        };
        // cluster-autoscaler's status ConfigMap, in its layout, beside our own (not in a dry
        // run: `kube_tasks` is then absent).
        let ca_status_task = match (
            &settings.kubernetes.ca_status_config_map,
            ca_client,
            &cluster,
            kube_tasks.as_ref(),
        ) {
            (Some(name), Some(client), Some(view), Some(tasks)) => {
                use crate::kube::ca_status::{
                    CA_LAST_UPDATED_ANNOTATION, CA_STATUS_OWNER, CA_STATUS_OWNER_ANNOTATION,
                    FALLBACK_CA_STATUS_CONFIG_MAP,
                };
                // Ours only: one found without our owner annotation is another autoscaler's
                // (AKS's managed cluster-autoscaler writes `cluster-autoscaler-status`), and
                // ours then goes under our own name.
                let writer = |name: &str| {
                    crate::kube::status::StatusWriter::new(
                        Arc::new(crate::kube::status::KubeConfigMaps::new(
                            client.clone(),
                            &settings.kubernetes.namespace,
                            name,
                        )),
                        name,
                        identity.as_deref().unwrap_or_default(),
                    )
                    .annotation(CA_LAST_UPDATED_ANNOTATION)
                    .owner(CA_STATUS_OWNER_ANNOTATION, CA_STATUS_OWNER)
                    .metrics(metrics.clone())
                };
                let writers = CaStatusWriters {
                    primary: writer(name),
                    fallback: (name != FALLBACK_CA_STATUS_CONFIG_MAP)
                        .then(|| writer(FALLBACK_CA_STATUS_CONFIG_MAP)),
                };
                Some(tokio::spawn(write_ca_status(
                    writers,
                    reconciler.clone(),
                    view.clone(),
                    settings.clone(),
                    tasks.fence.clone(),
                    shutdown.clone(),
                )))
            }
            _ => None,
        };
        // `demand: pods`: batches pending pods into scale-up decisions for the reconciler.
        let mut bookings = None;
        let mut prices = None;
        let replace_demand = pod_demand.clone();
        let scale_up_task = match (pod_demand, &cluster) {
            (Some(demand), Some(view)) => {
                let mut scale_up = crate::autoscale::scale_up::ScaleUpLoop::new(
                    settings.clone(),
                    demand,
                    reconciler.clone(),
                    view.clone(),
                    metrics.clone(),
                    events.clone(),
                );
                if let Some(client) = provreq_client {
                    scale_up = scale_up
                        .provisioning_requests(crate::kube::provreq::KubeProvReqs::new(client));
                }
                if let Some(client) = buffer_client {
                    scale_up = scale_up.capacity_buffers(
                        crate::kube::buffer::KubeBuffers::new(client),
                        settings.pod_demand.capacity_buffer_pod_injection,
                    );
                }
                bookings = scale_up.bookings();
                prices = Some(scale_up.prices());
                Some(tokio::spawn(scale_up.run(shutdown.clone())))
            }
            _ => None,
        };
        // `scaleDown.enabled`: removes unneeded nodes, one instance at a time through Azure.
        let scale_down_task = match (node_actions, &cluster) {
            (Some(actions), Some(view)) => {
                let mut down = crate::autoscale::scale_down::ScaleDownLoop::new(
                    settings.clone(),
                    reconciler.clone(),
                    view.clone(),
                    actions,
                    metrics.clone(),
                    events,
                )
                .dry_run(dry_run)
                .bookings(bookings)
                .demand(replace_demand);
                // Consolidation prices savings from the scale-up loop's book (one table).
                if let Some(p) = prices {
                    down = down.prices(p);
                }
                Some(tokio::spawn(down.run(shutdown.clone())))
            }
            _ => None,
        };
        let mut http_task = None;
        if let Some(addr) = settings.metrics_listen {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(crate::http::serve(
                addr,
                metrics.clone(),
                reconciler.clone(),
                crate::http::Readiness {
                    election: election.as_ref().map(|e| e.leadership()),
                    cluster: cluster.clone(),
                },
                shutdown.clone(),
                tx,
            ));
            match rx.await {
                Ok(bound) => tracing::info!(%bound, "serving /metrics, /healthz, /readyz"),
                Err(_) => {
                    let err = task
                        .await
                        .map_err(anyhow::Error::from)
                        .and_then(|r| r.map_err(anyhow::Error::from));
                    bail!("cannot listen on {addr}: {err:?}");
                }
            }
            http_task = Some(task);
        }
        let signals = shutdown.clone();
        let signal_task = tokio::spawn(async move {
            tokio::select! {
                _ = signal => {
                    tracing::info!("signal received: shutting down");
                    signals.cancel();
                }
                _ = signals.cancelled() => {}
            }
        });
        // The elector releases the Lease as soon as shutdown starts: the fence then holds any
        // write the last pass has not sent yet, and a standby takes over within a retry period.
        let election_task = election.map(|e| {
            let leadership = e.leadership();
            let stop = shutdown.clone();
            let gauges = tokio::spawn(publish_leadership(
                leadership,
                metrics.clone(),
                stop.clone(),
            ));
            (tokio::spawn(async move { e.run(stop).await }), gauges)
        });
        reconciler.run(shutdown.clone()).await;
        shutdown.cancel();
        let _ = signal_task.await;
        if let Some((elector, gauges)) = election_task {
            let _ = elector.await;
            let _ = gauges.await;
        }
        if let Some(task) = scale_up_task {
            let _ = task.await;
        }
        if let Some(task) = scale_down_task {
            let _ = task.await;
        }
        if let Some(task) = ca_status_task {
            let _ = task.await;
        }
        for task in reflectors {
            let _ = task.await;
        }
        stop_kube_tasks(kube_stop, kube_tasks).await;
        if let Some(task) = http_task {
            let _ = task.await;
        }
        Ok(())
    }
}

/// The writers of cluster-autoscaler's status ConfigMap: the configured name, and ours for
/// when another autoscaler owns that one.
struct CaStatusWriters {
    primary: crate::kube::status::StatusWriter,
    fallback: Option<crate::kube::status::StatusWriter>,
}

/// Writes cluster-autoscaler's status ConfigMap every `scanInterval` while `fence` lets this
/// replica write and the cluster view is synced (its node counts come from it). The configured
/// ConfigMap is written only while it is ours (created by us, carrying our owner annotation):
/// found without it, it is another autoscaler's, left alone from then on, with one warning, and
/// ours goes under [`crate::kube::ca_status::FALLBACK_CA_STATUS_CONFIG_MAP`].
async fn write_ca_status(
    writers: CaStatusWriters,
    reconciler: Arc<Reconciler>,
    view: Arc<crate::kube::reflect::ClusterView>,
    settings: Arc<Settings>,
    fence: Arc<dyn crate::fence::WriteFence>,
    shutdown: CancellationToken,
) {
    use crate::kube::status::StatusError;
    use crate::node_groups::ca_status::{build, CaInput, Transitions};
    let mut transitions = Transitions::default();
    let CaStatusWriters { primary, fallback } = writers;
    // The writer in use; `None` once both names turned out to be another program's.
    let mut writer = Some(primary);
    let mut fallback = fallback;
    loop {
        let Some(current) = writer.as_ref() else {
            return;
        };
        if fence.check().is_ok() && view.synced() {
            let groups: Vec<_> = reconciler
                .node_groups()
                .groups()
                .iter()
                .map(|g| (g.clone(), crate::node_groups::backing(&settings, g)))
                .collect();
            // The one status model, ours and cluster-autoscaler's format alike.
            let status = reconciler.node_groups().status();
            let nodes: Vec<_> = view.nodes.snapshot().values().cloned().collect();
            let unneeded = reconciler.node_groups().unneeded();
            let doc = build(
                &CaInput {
                    groups: &groups,
                    status: &status,
                    nodes: &nodes,
                    unneeded: &unneeded,
                    running: reconciler.health().ready(),
                    startup: settings.pod_demand.max_node_provision_time,
                    ok_unready: settings.scale_down.ok_total_unready_count,
                    max_unready_percent: settings.scale_down.max_total_unready_percentage,
                    now: reconciler.node_groups().timestamp(),
                },
                &mut transitions,
            );
            let yaml = match serde_yaml::to_string(&doc) {
                Ok(yaml) => yaml,
                Err(e) => {
                    tracing::warn!(error = %e, "could not serialise cluster-autoscaler's status; next pass tries again");
                    String::new()
                }
            };
            let mut written = if yaml.is_empty() {
                Ok(())
            } else {
                current.write_yaml(&yaml, &doc.time).await.map(|_| ())
            };
            if let Err(StatusError::Foreign { name, .. }) = &written {
                match fallback.take() {
                    Some(next) => {
                        tracing::warn!(
                            config_map = %name,
                            instead = next.name(),
                            annotation = crate::kube::ca_status::CA_STATUS_OWNER_ANNOTATION,
                            "cluster-autoscaler's status ConfigMap exists without this controller's owner annotation: another autoscaler writes it (AKS's managed cluster-autoscaler does), so it is left alone and ours, in its layout, is written under our own name instead"
                        );
                        written = next.write_yaml(&yaml, &doc.time).await.map(|_| ());
                        writer = Some(next);
                    }
                    None => {
                        tracing::warn!(config_map = %name, "cluster-autoscaler's status ConfigMap exists without this controller's owner annotation and there is no other name to write: not written from now on");
                        writer = None;
                        written = Ok(());
                    }
                }
                if let Err(StatusError::Foreign { name, .. }) = &written {
                    tracing::warn!(config_map = %name, "our own name for cluster-autoscaler's status is taken by a ConfigMap without our owner annotation too: not written from now on");
                    writer = None;
                    written = Ok(());
                }
            }
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not write cluster-autoscaler's status ConfigMap; next pass tries again");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.scan_interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// What `run` needs of Kubernetes when `kubernetes.enabled`: the client, this replica's
/// identity, and the Events recorder with its poster.
struct KubeSide {
    client: kube::Client,
    identity: String,
    recorder: Arc<crate::kube::events::EventRecorder>,
    poster: crate::kube::events::EventPoster,
}

async fn kube_side(
    settings: &Settings,
    metrics: Arc<Metrics>,
    identity: Option<String>,
) -> anyhow::Result<Option<KubeSide>> {
    use crate::kube::events::{EventRecorder, KubeEvents, RecorderConfig, QUEUE_CAPACITY};
    let k = &settings.kubernetes;
    if !k.enabled {
        return Ok(None);
    }
    let client = kube_client(k).await?;
    let identity = identity.unwrap_or_else(crate::kube::identity);
    let (recorder, poster) = EventRecorder::new(
        RecorderConfig {
            namespace: k.namespace.clone(),
            identity: identity.clone(),
            status_config_map: k.status_config_map.clone(),
            lease: k
                .leader_election
                .enabled
                .then(|| k.leader_election.lease_name.clone()),
        },
        Arc::new(KubeEvents::new(client.clone())),
        metrics,
        QUEUE_CAPACITY,
    );
    Ok(Some(KubeSide {
        client,
        identity,
        recorder: Arc::new(recorder),
        poster,
    }))
}

/// The Event poster and the status writer, running.
struct KubeTasks {
    poster: tokio::task::JoinHandle<()>,
    status: tokio::task::JoinHandle<()>,
    writer: Arc<crate::kube::status::StatusWriter>,
    fence: Arc<dyn crate::fence::WriteFence>,
}

impl KubeTasks {
    /// One status write now, if this replica may write.
    async fn write_status_now(&self, reconciler: &Reconciler) {
        if self.fence.check().is_ok() {
            if let Err(e) = self.writer.write(reconciler.status()).await {
                tracing::warn!(error = %e, "could not write the status ConfigMap");
            }
        }
    }
}

impl KubeSide {
    /// Spawns the Event poster and the status writer (every `scanInterval`, while `fence` lets
    /// this replica write).
    fn spawn(
        self,
        settings: &Settings,
        reconciler: Arc<Reconciler>,
        fence: Arc<dyn crate::fence::WriteFence>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> KubeTasks {
        let k = &settings.kubernetes;
        let writer = Arc::new(
            crate::kube::status::StatusWriter::new(
                Arc::new(crate::kube::status::KubeConfigMaps::new(
                    self.client,
                    &k.namespace,
                    &k.status_config_map,
                )),
                &k.status_config_map,
                &self.identity,
            )
            .metrics(metrics),
        );
        let recorder = self.recorder.clone();
        let status = tokio::spawn(writer.clone().run(
            move || reconciler.status(),
            fence.clone(),
            settings.scan_interval,
            move |cm| recorder.set_status_uid(cm.metadata.uid.clone()),
            stop.clone(),
        ));
        KubeTasks {
            poster: tokio::spawn(self.poster.run(stop)),
            status,
            writer,
            fence,
        }
    }
}

/// Stops the Kubernetes tasks; the poster gets a few seconds to post what is queued (the
/// leadership hand-over), so an unreachable API server cannot hold the shutdown.
async fn stop_kube_tasks(stop: CancellationToken, tasks: Option<KubeTasks>) {
    stop.cancel();
    let Some(tasks) = tasks else {
        return;
    };
    for mut task in [tasks.status, tasks.poster] {
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// The Lease candidate when `kubernetes.enabled` and `kubernetes.leaderElection.enabled`,
/// reporting to the Events recorder.
fn leader_election(
    settings: &Settings,
    kube_side: Option<&KubeSide>,
) -> Option<Arc<crate::kube::lease::LeaderElection>> {
    let k = &settings.kubernetes;
    let side = kube_side.filter(|_| k.enabled && k.leader_election.enabled)?;
    let le = &k.leader_election;
    let identity = side.identity.clone();
    tracing::info!(lease = %le.lease_name, namespace = %k.namespace, %identity, "leader election on");
    let store = crate::kube::KubeLeases::new(side.client.clone(), &k.namespace, &le.lease_name);
    Some(Arc::new(crate::kube::lease::LeaderElection::new(
        crate::kube::lease::LeaseConfig {
            name: le.lease_name.clone(),
            identity,
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
        },
        Arc::new(store),
        side.recorder.clone(),
    )))
}

/// The Kubernetes client the standard way: `kubernetes.kubeconfig`, else the in-cluster service
/// account, else `KUBECONFIG` / `~/.kube/config`.
pub(crate) async fn kube_client(k: &config::KubernetesSettings) -> anyhow::Result<kube::Client> {
    let config = match &k.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("kubernetes.kubeconfig: reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubernetes.kubeconfig: {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("kubernetes: no in-cluster service account and no usable KUBECONFIG")?,
    };
    // No retries inside the client: each caller has its own policy (the elector its retry
    // period, the watches their backoff, the status writer the next pass), and kube-rs's default
    // retry of 503s could hold one call for minutes after the API server returns.
    let mut config = config;
    config.default_retry = false;
    kube::Client::try_from(config).context("kubernetes: building the client")
}

/// Keeps `leader` (1 only while the fence lets writes go) and `leader_transitions_total` current.
async fn publish_leadership(
    leadership: Arc<crate::kube::lease::Leadership>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    use crate::fence::WriteFence;
    let mut counted = 0;
    loop {
        metrics
            .leader
            .set(if leadership.check().is_ok() { 1.0 } else { 0.0 });
        let t = leadership.transitions();
        if t > counted {
            metrics
                .leader_transitions_total
                .inc_by((t - counted) as f64);
            counted = t;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.cancelled() => break,
        }
    }
    metrics.leader.set(0.0);
}
