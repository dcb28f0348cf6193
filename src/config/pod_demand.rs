//! What drives capacity (`demand`) and, with `demand: pods`, how pending pods are turned into
//! capacity: cluster-autoscaler's flags under their own names (`expander`,
//! `expendablePodsPriorityCutoff`, `maxNodeProvisionTime`), so its users find them where they
//! expect, plus the batching window of a burst.

use super::raw::{HumanDuration, RawConfig};
use super::validate::positive;
use super::Problems;
use std::collections::BTreeMap;
use std::time::Duration;

/// cluster-autoscaler's `--max-node-provision-time`.
pub const DEFAULT_MAX_NODE_PROVISION_TIME: Duration = Duration::from_secs(15 * 60);

/// Where a node group's wanted capacity comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DemandKind {
    /// Schedules and `desiredCapacity` (the default; no Kubernetes needed).
    #[default]
    Configured,
    /// Pending pods (needs `kubernetes.enabled`); schedules and `desiredCapacity` act as a floor.
    Pods,
}

/// `demand` and the pod-demand keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDemandSettings {
    /// `demand`.
    pub kind: DemandKind,
    /// `expander` (with `expanderPriorities` for `priority`).
    pub expander: Expander,
    /// `expendablePodsPriorityCutoff`: pods below this priority never ask for capacity.
    pub priority_cutoff: i32,
    /// `maxNodeProvisionTime`: a requested node not registered by then is given up on.
    pub max_node_provision_time: Duration,
    /// `podBatchIdle`: a burst's batch closes after this long without a new pending pod.
    pub batch_idle: Duration,
    /// `podBatchMax`: and at the latest this long after it opened.
    pub batch_max: Duration,
    /// `balanceSimilarNodeGroups` (cluster-autoscaler's `--balance-similar-node-groups`): a
    /// scale-up is split across the groups similar to the one the expander chose.
    pub balance_similar_node_groups: bool,
    /// `enableProvisioningRequests` (cluster-autoscaler's `--enable-provisioning-requests`):
    /// serve `autoscaling.x-k8s.io/v1` ProvisioningRequests of the classes
    /// `check-capacity.autoscaling.x-k8s.io` and `best-effort-atomic-scale-up.autoscaling.x-k8s.io`.
    pub provisioning_requests: bool,
    /// `capacityBufferControllerEnabled` (cluster-autoscaler's
    /// `--capacity-buffer-controller-enabled`): read `autoscaling.x-k8s.io/v1beta1`
    /// CapacityBuffers of the `buffer.x-k8s.io/active-capacity` strategy and write their status.
    pub capacity_buffer_controller: bool,
    /// `capacityBufferPodInjectionEnabled` (`--capacity-buffer-pod-injection-enabled`): the
    /// buffers' virtual pods join scale-up (after the pending pods) and scale-down.
    pub capacity_buffer_pod_injection: bool,
}

impl Default for PodDemandSettings {
    fn default() -> Self {
        Self {
            kind: DemandKind::Configured,
            expander: Expander::LeastWaste,
            priority_cutoff: EXPENDABLE_PRIORITY_CUTOFF,
            max_node_provision_time: DEFAULT_MAX_NODE_PROVISION_TIME,
            batch_idle: BATCH_IDLE,
            batch_max: BATCH_MAX,
            balance_similar_node_groups: false,
            capacity_buffer_controller: false,
            capacity_buffer_pod_injection: false,
            provisioning_requests: false,
        }
    }
}

/// The keys, validated; every problem is pushed with its path. `kubernetes_enabled` is the
/// already-validated `kubernetes.enabled`.
pub(super) fn pod_demand_settings(
    raw: &mut RawConfig,
    kubernetes_enabled: bool,
    problems: &mut Problems,
) -> PodDemandSettings {
    let defaults = PodDemandSettings::default();
    let kind = match raw.demand.take().as_deref() {
        None | Some("configured") => DemandKind::Configured,
        Some("pods") => DemandKind::Pods,
        Some(other) => {
            problems.push(
                "demand",
                format!("unknown demand source {other:?}: expected \"configured\" or \"pods\""),
            );
            DemandKind::Configured
        }
    };
    if kind == DemandKind::Pods && !kubernetes_enabled {
        problems.push(
            "demand",
            "\"pods\" needs the cluster: set kubernetes.enabled: true",
        );
    }
    let priorities = raw.expander_priorities.take();
    let expander = match raw.expander.take() {
        None => Expander::LeastWaste,
        Some(text) => expanders(&text, priorities.as_ref(), problems),
    };
    if priorities.is_some() && !uses_priority(&expander) {
        problems.push("expanderPriorities", "only used with expander: priority");
    }
    let d = |v: Option<HumanDuration>, default, key: &str, problems: &mut Problems| {
        positive(v, default, key, problems)
    };
    let batch_idle = d(
        raw.pod_batch_idle.take(),
        defaults.batch_idle,
        "podBatchIdle",
        problems,
    );
    let batch_max = d(
        raw.pod_batch_max.take(),
        defaults.batch_max,
        "podBatchMax",
        problems,
    );
    if batch_idle > batch_max {
        problems.push(
            "podBatchIdle",
            format!("must not be longer than podBatchMax ({batch_max:?})"),
        );
    }
    let provisioning_requests = raw.enable_provisioning_requests.take().unwrap_or(false);
    if provisioning_requests && kind != DemandKind::Pods {
        problems.push(
            "enableProvisioningRequests",
            "needs demand: pods (a request's pods are planned as pending pods are)",
        );
    }
    let capacity_buffer_controller = raw
        .capacity_buffer_controller_enabled
        .take()
        .unwrap_or(false);
    let capacity_buffer_pod_injection = raw
        .capacity_buffer_pod_injection_enabled
        .take()
        .unwrap_or(false);
    if capacity_buffer_controller && kind != DemandKind::Pods {
        problems.push(
            "capacityBufferControllerEnabled",
            "needs demand: pods (a buffer's pods are planned as pending pods are)",
        );
    }
    if capacity_buffer_pod_injection && !capacity_buffer_controller {
        problems.push(
            "capacityBufferPodInjectionEnabled",
            "needs capacityBufferControllerEnabled: true (the pods injected are those of the buffers this controller resolves)",
        );
    }
    PodDemandSettings {
        kind,
        provisioning_requests,
        capacity_buffer_controller,
        capacity_buffer_pod_injection,
        expander,
        priority_cutoff: raw
            .expendable_pods_priority_cutoff
            .take()
            .unwrap_or(defaults.priority_cutoff),
        max_node_provision_time: d(
            raw.max_node_provision_time.take(),
            defaults.max_node_provision_time,
            "maxNodeProvisionTime",
            problems,
        ),
        batch_idle,
        batch_max,
        balance_similar_node_groups: raw.balance_similar_node_groups.take().unwrap_or(false),
    }
}

/// `expander`: one name, or several joined by commas as cluster-autoscaler's
/// `--expander=priority,least-waste` (each keeps its best options, the last one picks).
fn expanders(
    text: &str,
    priorities: Option<&BTreeMap<i32, Vec<String>>>,
    problems: &mut Problems,
) -> Expander {
    let mut list = Vec::new();
    for name in text.split(',').map(str::trim) {
        let e = match name {
            "least-waste" => Expander::LeastWaste,
            "most-pods" => Expander::MostPods,
            "random" => Expander::Random,
            "price" => Expander::Price,
            "least-cost" => Expander::LeastCost,
            "priority" => match priorities {
                Some(p) => Expander::Priority(priority_tiers(p, problems)),
                None => {
                    problems.push(
                        "expanderPriorities",
                        "required with expander: priority (priority -> list of node-group name regexes, as cluster-autoscaler's priority ConfigMap)",
                    );
                    continue;
                }
            },
            other => {
                problems.push(
                    "expander",
                    format!(
                        "unknown expander {other:?}: expected least-waste, most-pods, priority, random, price or least-cost, or several joined by commas"
                    ),
                );
                continue;
            }
        };
        if list.contains(&e) {
            problems.push("expander", format!("{name:?} is named twice"));
            continue;
        }
        list.push(e);
    }
    match list.len() {
        0 => Expander::LeastWaste,
        1 => list.remove(0),
        _ => Expander::Chain(list),
    }
}

/// Whether the expander (or one of a chain) is `priority`.
fn uses_priority(e: &Expander) -> bool {
    match e {
        Expander::Priority(_) => true,
        Expander::Chain(list) => list.iter().any(uses_priority),
        _ => false,
    }
}

/// `expanderPriorities`, as cluster-autoscaler's priority ConfigMap: priority → regexes of
/// node-group names (anchored, as there). Higher priorities first.
fn priority_tiers(
    raw: &BTreeMap<i32, Vec<String>>,
    problems: &mut Problems,
) -> Vec<(i32, Vec<String>)> {
    let mut tiers = Vec::new();
    for (prio, patterns) in raw.iter().rev() {
        let mut ok = Vec::new();
        for (i, p) in patterns.iter().enumerate() {
            match regex::Regex::new(&format!("^(?:{p})$")) {
                Ok(_) => ok.push(p.clone()),
                Err(e) => problems.push(
                    format!("expanderPriorities.{prio}[{i}]"),
                    format!("{p:?} is not a valid regular expression: {e}"),
                ),
            }
        }
        if patterns.is_empty() {
            problems.push(
                format!("expanderPriorities.{prio}"),
                "an empty list matches no node group",
            );
        }
        tiers.push((*prio, ok));
    }
    tiers
}

/// cluster-autoscaler's `--expendable-pods-priority-cutoff` default.
pub const EXPENDABLE_PRIORITY_CUTOFF: i32 = -10;
/// Close a batch of pending pods after this long without a new one.
pub const BATCH_IDLE: Duration = Duration::from_secs(1);
/// Close a batch of pending pods this long after it opened, however busy.
pub const BATCH_MAX: Duration = Duration::from_secs(10);

/// An expander, as `--expander` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expander {
    /// The option whose new nodes would leave the least cpu and memory unused (the default).
    LeastWaste,
    /// The option that schedules the most pods.
    MostPods,
    /// The option of the highest-priority group: `(priority, name regexes)` tiers, higher first;
    /// ties are broken by least waste.
    Priority(Vec<(i32, Vec<String>)>),
    /// Any option, chosen by the seed.
    Random,
    /// cluster-autoscaler's `price`: the cost of the new nodes against the pods they serve,
    /// times how far the group's node size is from the size the cluster's node count suggests.
    Price,
    /// Karpenter's "least cost": the fewest dollars per hour of new nodes for the pods they
    /// serve, without `price`'s preference for a node size.
    LeastCost,
    /// Several, in order: each keeps its best options (ties included), the last one picks.
    Chain(Vec<Expander>),
}

impl Expander {
    /// The name `expander` takes (a chain: its names joined by commas).
    pub fn name(&self) -> String {
        match self {
            Expander::LeastWaste => "least-waste".into(),
            Expander::MostPods => "most-pods".into(),
            Expander::Priority(_) => "priority".into(),
            Expander::Random => "random".into(),
            Expander::Price => "price".into(),
            Expander::LeastCost => "least-cost".into(),
            Expander::Chain(list) => list
                .iter()
                .map(Expander::name)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Whether it reads prices (`price`, `least-cost`, or a chain holding one).
    pub fn uses_prices(&self) -> bool {
        match self {
            Expander::Price | Expander::LeastCost => true,
            Expander::Chain(list) => list.iter().any(Expander::uses_prices),
            _ => false,
        }
    }
}
