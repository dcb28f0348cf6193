//! The `kubernetes:` section: whether and how the controller joins the cluster (its Lease,
//! status ConfigMap and Events live in `namespace`). Off by default: without it the controller
//! behaves exactly as a single replica without Kubernetes. These keys are a contract.

use super::raw::{HumanDuration, RawKubernetes, RawLeaderElection};
use super::validate::positive;
use super::Problems;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// cluster-autoscaler's `--leader-elect-lease-duration`.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// cluster-autoscaler's `--leader-elect-renew-deadline`.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// cluster-autoscaler's `--leader-elect-retry-period`.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);
/// Default Lease name.
pub const DEFAULT_LEASE_NAME: &str = "vmss-capacity-controller";
/// Default status ConfigMap name.
pub const DEFAULT_STATUS_CONFIG_MAP: &str = "vmss-capacity-controller-status";
/// Namespace when neither the YAML nor `POD_NAMESPACE` names one (cluster-autoscaler's).
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// `kubernetes:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// Talk to Kubernetes at all (default false).
    pub enabled: bool,
    /// A kubeconfig file; `None`: in-cluster service account, else `KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// Where the Lease, the status ConfigMap and the Events live (`POD_NAMESPACE`, else
    /// `kube-system`).
    pub namespace: String,
    /// `kubernetes.leaderElection`.
    pub leader_election: LeaderElectionSettings,
    /// The status ConfigMap's name.
    pub status_config_map: String,
    /// cluster-autoscaler's status ConfigMap, written in its layout beside ours
    /// (`clusterAutoscalerStatusConfigMap`, default `cluster-autoscaler-status`; `""`: not
    /// written). Needs `demand: pods` (its node counts come from the cluster's Nodes).
    pub ca_status_config_map: Option<String>,
}

/// `kubernetes.leaderElection`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionSettings {
    /// Elect a leader (default true when Kubernetes is enabled).
    pub enabled: bool,
    /// The Lease's name.
    pub lease_name: String,
    /// Validity of a Lease after its last renewal.
    pub lease_duration: Duration,
    /// How long a leader tries to renew before it stops leading (and writing).
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            kubeconfig: None,
            namespace: DEFAULT_NAMESPACE.into(),
            leader_election: LeaderElectionSettings::default(),
            status_config_map: DEFAULT_STATUS_CONFIG_MAP.into(),
            ca_status_config_map: Some(DEFAULT_CA_STATUS_CONFIG_MAP.into()),
        }
    }
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            lease_name: DEFAULT_LEASE_NAME.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }
}

/// A DNS-1123 label (namespaces): lowercase letters, digits and '-', at most 63, alphanumeric ends.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (object names): dot-separated labels, at most 253.
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

fn name(
    value: Option<String>,
    default: &str,
    path: &str,
    ok: fn(&str) -> bool,
    rule: &str,
    problems: &mut Problems,
) -> String {
    match value {
        Some(v) if ok(&v) => v,
        Some(v) => {
            problems.push(path, format!("{v:?} is not a valid name: {rule}"));
            default.to_string()
        }
        None => default.to_string(),
    }
}

const SUBDOMAIN_RULE: &str =
    "lowercase letters, digits, '-' and '.', starting and ending alphanumeric, at most 253";
const LABEL_RULE: &str =
    "lowercase letters, digits and '-', starting and ending alphanumeric, at most 63";

/// The `kubernetes:` section, validated; every problem is pushed with its path.
pub(super) fn kubernetes_settings(
    raw: Option<RawKubernetes>,
    env: &HashMap<String, String>,
    problems: &mut Problems,
) -> KubernetesSettings {
    let raw = raw.unwrap_or_default();
    let default_namespace = env
        .get("POD_NAMESPACE")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    let namespace = match raw.namespace {
        Some(ns) => name(
            Some(ns),
            &default_namespace,
            "kubernetes.namespace",
            dns_label,
            LABEL_RULE,
            problems,
        ),
        None if dns_label(&default_namespace) => default_namespace,
        None => {
            problems.push(
                "env POD_NAMESPACE",
                format!("{default_namespace:?} is not a valid namespace: {LABEL_RULE}"),
            );
            DEFAULT_NAMESPACE.into()
        }
    };
    if let Some(path) = &raw.kubeconfig {
        if path.as_os_str().is_empty() {
            problems.push("kubernetes.kubeconfig", "must be a file path");
        }
    }
    KubernetesSettings {
        enabled: raw.enabled.unwrap_or(false),
        kubeconfig: raw.kubeconfig.filter(|p| !p.as_os_str().is_empty()),
        namespace,
        leader_election: leader_election(raw.leader_election.unwrap_or_default(), problems),
        status_config_map: name(
            raw.status_config_map,
            DEFAULT_STATUS_CONFIG_MAP,
            "kubernetes.statusConfigMap",
            dns_subdomain,
            SUBDOMAIN_RULE,
            problems,
        ),
        ca_status_config_map: match raw.cluster_autoscaler_status_config_map {
            Some(v) if v.is_empty() => None,
            v => Some(name(
                v,
                DEFAULT_CA_STATUS_CONFIG_MAP,
                "kubernetes.clusterAutoscalerStatusConfigMap",
                dns_subdomain,
                SUBDOMAIN_RULE,
                problems,
            )),
        },
    }
}

fn leader_election(raw: RawLeaderElection, problems: &mut Problems) -> LeaderElectionSettings {
    let d = |v: Option<HumanDuration>, default, key: &str, problems: &mut Problems| {
        positive(
            v,
            default,
            &format!("kubernetes.leaderElection.{key}"),
            problems,
        )
    };
    let lease_duration = d(
        raw.lease_duration,
        DEFAULT_LEASE_DURATION,
        "leaseDuration",
        problems,
    );
    let renew_deadline = d(
        raw.renew_deadline,
        DEFAULT_RENEW_DEADLINE,
        "renewDeadline",
        problems,
    );
    let retry_period = d(
        raw.retry_period,
        DEFAULT_RETRY_PERIOD,
        "retryPeriod",
        problems,
    );
    // The Lease stores whole seconds: a standby reading `leaseDurationSeconds` must never count
    // a shorter lease than the leader's fence assumes.
    if lease_duration.subsec_nanos() != 0 {
        problems.push(
            "kubernetes.leaderElection.leaseDuration",
            format!(
                "must be whole seconds (the Lease stores leaseDurationSeconds), got {lease_duration:?}"
            ),
        );
    }
    // client-go's rules: a leader must give up before its lease can expire, and try more than
    // once (with 20 % jitter) before it gives up.
    if renew_deadline >= lease_duration {
        problems.push(
            "kubernetes.leaderElection.renewDeadline",
            format!(
                "must be shorter than leaseDuration ({lease_duration:?}): a leader must stop writing before another replica can acquire the lease"
            ),
        );
    }
    if retry_period.mul_f64(1.2) >= renew_deadline {
        problems.push(
            "kubernetes.leaderElection.retryPeriod",
            format!(
                "must be shorter than renewDeadline ({renew_deadline:?}) divided by 1.2 (the retry jitter)"
            ),
        );
    }
    LeaderElectionSettings {
        enabled: raw.enabled.unwrap_or(true),
        lease_name: name(
            raw.lease_name,
            DEFAULT_LEASE_NAME,
            "kubernetes.leaderElection.leaseName",
            dns_subdomain,
            SUBDOMAIN_RULE,
            problems,
        ),
        lease_duration,
        renew_deadline,
        retry_period,
    }
}

/// The cluster-autoscaler-format status ConfigMap's name by default, as cluster-autoscaler
/// names it.
pub const DEFAULT_CA_STATUS_CONFIG_MAP: &str = "cluster-autoscaler-status";

/// Where the cluster-autoscaler-format status goes when the ConfigMap of
/// `clusterAutoscalerStatusConfigMap` exists without this controller's owner annotation:
/// another autoscaler (AKS's managed cluster-autoscaler) writes that one.
pub const FALLBACK_CA_STATUS_CONFIG_MAP: &str = "vmss-capacity-controller-ca-status";
