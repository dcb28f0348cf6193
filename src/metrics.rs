//! Every metric the daemon exports, registered next to its definition into one registry that
//! `main` (or a test) creates and passes down. Names are a contract (ARCHITECTURE.md section 7);
//! `tests/metrics_names.rs` scrapes `/metrics` and asserts them so docs and code cannot drift.
//!
//! The `scale_set` label only ever takes names of configured or discovered node groups, so its
//! cardinality is bounded by configuration.

use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use std::time::Instant;

const NAMESPACE: &str = "vmss_capacity";

/// Buckets for ARM latency and reconcile duration, in seconds (loopback to slow ARM).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The controller's metrics. Cheap to clone handles live inside; share it behind an `Arc`.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Reconcile passes by result (`ok`, `error`).
    pub reconcile_total: IntCounterVec,
    /// Duration of one reconcile pass.
    pub reconcile_duration_seconds: HistogramVec,
    /// ARM requests by operation and HTTP status code (`transport` when no status).
    pub arm_requests_total: IntCounterVec,
    /// ARM request latency by operation.
    pub arm_request_duration_seconds: HistogramVec,
    /// Capacity writes by scale set and result (`ok`, `precondition_failed`, `throttled`, `quota`, `error`).
    pub capacity_writes_total: IntCounterVec,
    /// What became of a 412 (`skipped`, `retried_ok`, `gave_up`, `gone`).
    pub etag_conflicts_total: IntCounterVec,
    /// Cache invalidations by cache (`instance`, `size`, `scale_set`) and reason.
    pub cache_invalidations_total: IntCounterVec,
    /// ETag changes the controller did not cause, per scale set.
    pub foreign_writes_total: IntCounterVec,
    /// Last known capacity per scale set.
    pub scale_set_capacity: IntGaugeVec,
    /// Planned capacity per scale set.
    pub scale_set_desired_capacity: IntGaugeVec,
    /// Configured minimum per scale set.
    pub scale_set_min_size: IntGaugeVec,
    /// 1 per node group, labelled with its kind (`vmss`, `aksAgentPool`): join on `scale_set`
    /// to split any per-group metric by kind.
    pub node_group_info: IntGaugeVec,
    /// Configured maximum per scale set.
    pub scale_set_max_size: IntGaugeVec,
    /// Instances seen by the last instance-cache refresh, per scale set.
    pub scale_set_instances: IntGaugeVec,
    /// Age of the cached scale-set entry, seconds.
    pub cache_age_seconds: GaugeVec,
    /// Last `x-ms-ratelimit-remaining-*` value seen, by scope (header suffix or policy).
    pub arm_ratelimit_remaining: IntGaugeVec,
    /// The same counts as the budget view reads them: by scope (`subscription`, `tenant`, or a
    /// provider such as `Microsoft.Compute`) and policy (`reads`, `writes`, `deletes`, or the
    /// provider's policy name).
    pub arm_budget_remaining: IntGaugeVec,
    /// Seconds of `Retry-After` deadlines that held calls back (the extension of each gate).
    pub throttle_wait_seconds_total: Counter,
    /// Unix time of the last reconcile pass that succeeded.
    pub last_successful_reconcile_timestamp_seconds: Gauge,
    /// 1 while this replica holds the Lease and its renewal is fresh (it may write), else 0.
    pub leader: Gauge,
    /// Times this replica became or stopped being the leader.
    pub leader_transitions_total: Counter,
    /// Kubernetes objects in the reflectors' caches, by kind (`nodes`, `pods`, ...).
    pub kube_objects_cached: IntGaugeVec,
    /// Watches that restarted, by kind and reason (`error`: the watch failed and is resumed;
    /// `relist`: a full list again, e.g. after 410 Gone).
    pub kube_watch_restarts_total: IntCounterVec,
    /// Seconds since the newest watch event (or full list) of a kind arrived.
    pub kube_newest_event_age_seconds: GaugeVec,
    /// 1 while a kind's watch is healthy (its last list completed and no error since), else 0.
    pub kube_watch_healthy: IntGaugeVec,
    /// 1 while scale-down (and deleting unregistered instances) is halted, by reason
    /// (`watch_failing`, `too_many_unready`), else 0.
    pub scale_down_halted: IntGaugeVec,
    /// Writes refused before sending, by scale set and reason (`no_etag`, `budget`, `cooldown`, `backoff`, `gated`).
    pub writes_held_total: IntCounterVec,
    /// Long-running operations by final status (`succeeded`, `failed`, `canceled`, `timeout`, `error`).
    pub lro_total: IntCounterVec,
    /// Token acquisition failures by credential kind.
    pub credential_errors_total: IntCounterVec,
    /// Build information, always 1.
    pub build_info: IntGaugeVec,
    /// Kubernetes Events posted (created, or a series bumped), by reason.
    pub kube_events_total: IntCounterVec,
    /// Events not posted, by why (`queue_full`, `rate_limited`, `api_error`, `closed`).
    pub kube_events_dropped_total: IntCounterVec,
    /// Status ConfigMap writes by result (`created`, `updated`, `conflict`, `error`); a
    /// `conflict` is one 409 met, followed by a re-read.
    pub kube_status_writes_total: IntCounterVec,
    /// Pending pods at the last scale-up decision, by type (`pending`: asking for capacity;
    /// `fits_no_group`; `not_simulated`: constraints this controller does not simulate).
    pub unschedulable_pods_count: IntGaugeVec,
    /// Pods a group could not take at the last decision, by group and reason (the predicate
    /// that failed, `max_size`, `provision_timeout`, `quota`, `unknown_size`, ...).
    pub pods_unfit: IntGaugeVec,
    /// New nodes that scale-up decisions asked of each group (the write itself is in
    /// `capacity_writes_total`).
    pub scaled_up_nodes_total: IntCounterVec,
    /// Scale-ups given up on, by group and reason (`provision_timeout`: requested nodes did not
    /// register within `maxNodeProvisionTime`; `quota`, `sku_not_available`,
    /// `allocation_failed`: Azure refused the allocation and the offering was marked
    /// unavailable).
    pub failed_scale_ups_total: IntCounterVec,
    /// `template_mismatches_total{scale_set,key}`: new nodes that registered otherwise than the
    /// template their scale-up was planned with, per differing key.
    pub template_mismatches_total: IntCounterVec,
    /// The share left of the emptiest ARM bucket of each class (`reads`, `writes`, `deletes`)
    /// as Azure last reported it, against the most it ever showed.
    pub arm_budget_fraction: GaugeVec,
    /// Spot VMs Azure took back, by node group: seen as a node of a spot group vanishing and
    /// the scale set shrinking without a delete or write of ours in flight.
    pub spot_evictions_total: IntCounterVec,
    /// vCPUs the subscription's quota leaves, by region and usage (a VM family such as
    /// `standardDSv5Family`, `cores` for the regional total, `lowPriorityCores` for spot), for
    /// the usages the node groups draw from, as last read.
    pub quota_remaining_vcpus: IntGaugeVec,
    /// USD per hour of one node of each group, as the last scale-up decision priced it (the
    /// configured override, else the retail or embedded list price, else the 999 sentinel).
    pub node_group_price_per_hour: GaugeVec,
    /// Price refreshes from the retail prices API that failed (the last good prices stay), by
    /// reason (`request`, `status`, `malformed`, `invalid_price`, `currency`, `too_many_pages`,
    /// `url`).
    pub price_refresh_failures_total: IntCounterVec,
    /// Scale-up decisions made (one per closed batch of pending pods, or a re-check).
    pub scale_up_decisions_total: IntCounterVec,
    /// Time to make one scale-up decision (pure planning, no I/O).
    pub scale_up_decision_duration_seconds: HistogramVec,
    /// Nodes of each group unneeded at the last scale-down pass (cluster-autoscaler's
    /// `unneeded_nodes_count`, per group).
    pub unneeded_nodes_count: IntGaugeVec,
    /// Nodes removed (their instance deleted and confirmed by Azure), by group and reason
    /// (`empty`, `underutilized`, `unready`, `unregistered`: an instance that never became a Node;
    /// `leftover`: a node a previous leader tainted whose VM was then gone or deleted again).
    pub scaled_down_nodes_total: IntCounterVec,
    /// Removals started and not finished, by group and where they stopped (`aborted`: the
    /// re-check after the taint, or the pods left on the node lost their room during its
    /// drain, `drain_failed`, `refused`: the guards before the delete,
    /// `delete_failed`: Azure said no or its operation failed).
    pub failed_scale_downs_total: IntCounterVec,
    /// Instance deletes sent (scale-down), by group and result (`accepted`,
    /// `precondition_failed`, `error`); kept apart from `capacity_writes_total`, which counts
    /// capacity numbers written.
    pub instance_deletes_total: IntCounterVec,
    /// Pod evictions by result (`evicted`, `blocked`: a PodDisruptionBudget's 429, `gone`,
    /// `failed`).
    pub evicted_pods_total: IntCounterVec,
    /// Deletion-cost hints written to pods (`consolidation.deletionCostHints`), by action (`set`,
    /// `clear`) and result (`ok`, `conflict`: the pod changed since it was read, `gone`,
    /// `error`).
    pub deletion_cost_hints_total: IntCounterVec,
    /// Soft taints (`PreferNoSchedule`, on the nodes scale-down would remove) written, by action
    /// (`add`, `remove`) and result (`ok`, `unchanged`: the node was already so, `conflict`:
    /// still changed after the re-reads, `not_found`, `other`, `skipped`: past
    /// `maxBulkSoftTaintTime`).
    pub soft_taint_writes_total: IntCounterVec,
}

impl Metrics {
    /// Creates every metric and registers it in a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Metrics {
            reconcile_total: counter(
                &registry,
                "reconcile_total",
                "Reconcile passes by result.",
                &["result"],
            ),
            reconcile_duration_seconds: histogram(
                &registry,
                "reconcile_duration_seconds",
                "Duration of one reconcile pass.",
                &[],
            ),
            arm_requests_total: counter(
                &registry,
                "arm_requests_total",
                "ARM requests by operation and status code.",
                &["operation", "code"],
            ),
            arm_request_duration_seconds: histogram(
                &registry,
                "arm_request_duration_seconds",
                "ARM request latency by operation.",
                &["operation"],
            ),
            capacity_writes_total: counter(
                &registry,
                "capacity_writes_total",
                "Capacity writes by scale set and result.",
                &["scale_set", "result"],
            ),
            etag_conflicts_total: counter(
                &registry,
                "etag_conflicts_total",
                "412 Precondition Failed answers by what the controller did next.",
                &["scale_set", "outcome"],
            ),
            cache_invalidations_total: counter(
                &registry,
                "cache_invalidations_total",
                "Cache invalidations by cache and reason.",
                &["cache", "reason"],
            ),
            foreign_writes_total: counter(
                &registry,
                "foreign_writes_total",
                "Changes to a scale set that this controller did not make.",
                &["scale_set"],
            ),
            scale_set_capacity: int_gauge(
                &registry,
                "scale_set_capacity",
                "Last known capacity.",
                &["scale_set"],
            ),
            scale_set_desired_capacity: int_gauge(
                &registry,
                "scale_set_desired_capacity",
                "Planned capacity.",
                &["scale_set"],
            ),
            scale_set_min_size: int_gauge(
                &registry,
                "scale_set_min_size",
                "Configured minimum.",
                &["scale_set"],
            ),
            node_group_info: int_gauge(
                &registry,
                "node_group_info",
                "1 per node group; its kind: vmss or aksAgentPool.",
                &["scale_set", "kind"],
            ),
            scale_set_max_size: int_gauge(
                &registry,
                "scale_set_max_size",
                "Configured maximum.",
                &["scale_set"],
            ),
            scale_set_instances: int_gauge(
                &registry,
                "scale_set_instances",
                "Instances seen by the last instance-cache refresh.",
                &["scale_set"],
            ),
            cache_age_seconds: gauge_vec(
                &registry,
                "cache_age_seconds",
                "Age of the cached scale-set entry.",
                &["scale_set"],
            ),
            arm_ratelimit_remaining: int_gauge(
                &registry,
                "arm_ratelimit_remaining",
                "Last x-ms-ratelimit-remaining value seen, by scope.",
                &["scope"],
            ),
            arm_budget_remaining: int_gauge(
                &registry,
                "arm_budget_remaining",
                "What Azure last said is left of a throttling bucket (x-ms-ratelimit-remaining-*), by scope (subscription, tenant, or the provider of a x-ms-ratelimit-remaining-resource policy) and policy.",
                &["scope", "policy"],
            ),
            throttle_wait_seconds_total: float_counter(
                &registry,
                "throttle_wait_seconds_total",
                "Seconds of Retry-After that held calls back.",
            ),
            leader: gauge(
                &registry,
                "leader",
                "1 while this replica holds the Lease with a fresh renewal (it may write to Azure).",
            ),
            leader_transitions_total: float_counter(
                &registry,
                "leader_transitions_total",
                "Times this replica became or stopped being the leader.",
            ),
            kube_objects_cached: int_gauge(
                &registry,
                "kube_objects_cached",
                "Kubernetes objects in the reflectors' caches, by kind.",
                &["kind"],
            ),
            kube_watch_restarts_total: counter(
                &registry,
                "kube_watch_restarts_total",
                "Watches restarted, by kind and reason (error, relist).",
                &["kind", "reason"],
            ),
            kube_newest_event_age_seconds: gauge_vec(
                &registry,
                "kube_newest_event_age_seconds",
                "Seconds since the newest watch event or full list of a kind arrived.",
                &["kind"],
            ),
            kube_watch_healthy: int_gauge(
                &registry,
                "kube_watch_healthy",
                "1 while a kind's watch is healthy (last list complete, no error since), else 0.",
                &["kind"],
            ),
            scale_down_halted: int_gauge(
                &registry,
                "scale_down_halted",
                "1 while scale-down and unregistered-instance deletes are halted, by reason.",
                &["reason"],
            ),
            last_successful_reconcile_timestamp_seconds: gauge(
                &registry,
                "last_successful_reconcile_timestamp_seconds",
                "Unix time of the last successful reconcile pass.",
            ),
            writes_held_total: counter(
                &registry,
                "writes_held_total",
                "Planned writes not sent, by reason.",
                &["scale_set", "reason"],
            ),
            lro_total: counter(
                &registry,
                "lro_total",
                "Long-running operations by final status.",
                &["status"],
            ),
            credential_errors_total: counter(
                &registry,
                "credential_errors_total",
                "Token acquisition failures by credential kind.",
                &["kind"],
            ),
            build_info: int_gauge(&registry, "build_info", "Build information.", &["version"]),
            // Kubernetes Events and the status ConfigMap (src/kube/events.rs, src/kube/status.rs).
            kube_events_total: counter(
                &registry,
                "kube_events_total",
                "Kubernetes Events posted (created or series bumped), by reason.",
                &["reason"],
            ),
            kube_events_dropped_total: counter(
                &registry,
                "kube_events_dropped_total",
                "Kubernetes Events not posted, by why.",
                &["why"],
            ),
            kube_status_writes_total: counter(
                &registry,
                "kube_status_writes_total",
                "Status ConfigMap writes by result; conflict counts each 409 met.",
                &["result"],
            ),
            unschedulable_pods_count: int_gauge(
                &registry,
                "unschedulable_pods_count",
                "Pending pods at the last scale-up decision, by type.",
                &["type"],
            ),
            pods_unfit: int_gauge(
                &registry,
                "pods_unfit",
                "Pending pods a node group could not take at the last decision, by reason.",
                &["scale_set", "reason"],
            ),
            scaled_up_nodes_total: counter(
                &registry,
                "scaled_up_nodes_total",
                "New nodes asked of a node group by scale-up decisions.",
                &["scale_set"],
            ),
            failed_scale_ups_total: counter(
                &registry,
                "failed_scale_ups_total",
                "Scale-ups given up on, by node group and reason.",
                &["scale_set", "reason"],
            ),
            template_mismatches_total: counter(
                &registry,
                "template_mismatches_total",
                "New nodes that registered otherwise than the template their scale-up was planned with, by node group and differing key (a label key, taint/<key>, allocatable/<resource>).",
                &["scale_set", "key"],
            ),
            arm_budget_fraction: gauge_vec(
                &registry,
                "arm_budget_fraction",
                "Share left of the emptiest ARM bucket of each class, as Azure last reported it (x-ms-ratelimit-remaining-*), against the most it ever showed.",
                &["class"],
            ),
            spot_evictions_total: counter(
                &registry,
                "spot_evictions_total",
                "Spot VMs Azure evicted (the scale set shrank under a vanished node with no delete of ours in flight), by node group.",
                &["scale_set"],
            ),
            quota_remaining_vcpus: int_gauge(
                &registry,
                "quota_remaining_vcpus",
                "vCPUs the subscription's quota leaves, by region and usage (family, cores, lowPriorityCores), as last read.",
                &["location", "family"],
            ),
            node_group_price_per_hour: gauge_vec(
                &registry,
                "node_group_price_per_hour",
                "USD per hour of one node of each group, as the last scale-up decision priced it (override, retail or embedded list price, or the 999 sentinel).",
                &["scale_set"],
            ),
            price_refresh_failures_total: counter(
                &registry,
                "price_refresh_failures_total",
                "Price refreshes from Azure's retail prices API that failed (the last good prices stay), by reason.",
                &["reason"],
            ),
            scale_up_decisions_total: counter(
                &registry,
                "scale_up_decisions_total",
                "Scale-up decisions, by trigger (batch: a burst of pending pods closed; recheck; refusal: Azure refused an allocation planned for).",
                &["trigger"],
            ),
            scale_up_decision_duration_seconds: histogram(
                &registry,
                "scale_up_decision_duration_seconds",
                "Time to make one scale-up decision.",
                &[],
            ),
            unneeded_nodes_count: int_gauge(
                &registry,
                "unneeded_nodes_count",
                "Nodes of a node group unneeded at the last scale-down pass.",
                &["scale_set"],
            ),
            scaled_down_nodes_total: counter(
                &registry,
                "scaled_down_nodes_total",
                "Nodes removed (instance deleted, confirmed by Azure), by node group and reason.",
                &["scale_set", "reason"],
            ),
            failed_scale_downs_total: counter(
                &registry,
                "failed_scale_downs_total",
                "Node removals started and not finished, by node group and where they stopped.",
                &["scale_set", "reason"],
            ),
            instance_deletes_total: counter(
                &registry,
                "instance_deletes_total",
                "Instance deletes sent by scale-down, by node group and result.",
                &["scale_set", "result"],
            ),
            evicted_pods_total: counter(
                &registry,
                "evicted_pods_total",
                "Pod evictions by result.",
                &["result"],
            ),
            deletion_cost_hints_total: counter(
                &registry,
                "deletion_cost_hints_total",
                "Deletion-cost hints written to pods, by action and result.",
                &["action", "result"],
            ),
            soft_taint_writes_total: counter(
                &registry,
                "soft_taint_writes_total",
                "Soft taints (PreferNoSchedule) added to or removed from nodes scale-down would remove, by action and result.",
                &["action", "result"],
            ),
            registry,
        };
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        m
    }

    /// The registry, for callers that add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the text format; an error would mean a
        // malformed metric family, which registration already rejects.
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Starts timing an ARM call; record it with [`ArmTimer::finish`].
    pub fn arm_timer(&self, operation: &'static str) -> ArmTimer<'_> {
        ArmTimer {
            metrics: self,
            operation,
            start: Instant::now(),
        }
    }

    /// Sum of a counter over all label values (tests and the demo summary).
    pub fn counter_sum(counter: &IntCounterVec, matching: &[(&str, &str)]) -> u64 {
        use prometheus::core::Collector;
        counter
            .collect()
            .iter()
            .flat_map(|mf| mf.get_metric())
            .filter(|m| {
                matching.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Times one ARM call and records its status code.
pub struct ArmTimer<'a> {
    metrics: &'a Metrics,
    operation: &'static str,
    start: Instant,
}

impl ArmTimer<'_> {
    /// Records the call's latency and its status code (`"transport"`, `"gated"` when none).
    pub fn finish(self, code: &str) {
        self.metrics
            .arm_request_duration_seconds
            .with_label_values(&[self.operation])
            .observe(self.start.elapsed().as_secs_f64());
        self.metrics
            .arm_requests_total
            .with_label_values(&[self.operation, code])
            .inc();
    }
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NAMESPACE)
}

// Registration only fails for duplicate or invalid names, which are constants here: a failure is
// a programming error caught by every test that builds `Metrics`.
fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(opts(name, help), labels).expect("valid counter definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique counter name");
    c
}

fn int_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(opts(name, help), labels).expect("valid gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique gauge name");
    g
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(opts(name, help), labels).expect("valid gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique gauge name");
    g
}

fn float_counter(registry: &Registry, name: &str, help: &str) -> Counter {
    let c = Counter::with_opts(opts(name, help)).expect("valid counter definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique counter name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::with_opts(opts(name, help)).expect("valid gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique gauge name");
    g
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help)
        .namespace(NAMESPACE)
        .buckets(LATENCY_BUCKETS.to_vec());
    let h = HistogramVec::new(opts, labels).expect("valid histogram definition");
    registry
        .register(Box::new(h.clone()))
        .expect("unique histogram name");
    h
}
