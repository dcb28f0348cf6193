//! Problems a person can act on: what is wrong, with which object, and the fix (the `az` or
//! `kubectl` command, or the configuration key), in one line. Every refusal a user can meet at
//! start-up is one of these, worded here once, so a log line, an Event, a CLI error and
//! `explain` say the same thing.

use crate::config::{NodeGroupKind, NodeGroupSpec};
use std::fmt;

/// One problem: the object it concerns, what is wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The object, e.g. `node group pool-a` or `kubernetes RBAC`.
    pub object: String,
    /// What is wrong.
    pub what: String,
    /// What to do: a command or a configuration key.
    pub fix: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; fix: {}", self.object, self.what, self.fix)
    }
}

impl std::error::Error for Problem {}

impl Problem {
    /// A configured node group Azure does not list; `sub` and `default_rg` are `azure.`'s.
    pub fn node_group_missing(sub: &str, default_rg: &str, group: &NodeGroupSpec) -> Problem {
        let rg = group.resource_group.as_deref().unwrap_or(default_rg);
        match &group.kind {
            NodeGroupKind::Vmss => Problem {
                object: format!("node group {}", group.name),
                what: format!(
                    "no scale set named {} in resource group {rg} (subscription {sub}), so nothing is written for it",
                    group.name
                ),
                fix: format!(
                    "check the name with `az vmss list -g {rg} --subscription {sub} -o table` (on AKS: the node resource group MC_...), or remove it from nodeGroups"
                ),
            },
            NodeGroupKind::AksAgentPool { cluster } => Problem {
                object: format!("node group {}", group.name),
                what: format!(
                    "no agent pool named {} in managed cluster {cluster} (resource group {rg}, subscription {sub}), so nothing is written for it",
                    group.name
                ),
                fix: format!(
                    "check the names with `az aks nodepool list -g {rg} --cluster-name {cluster} --subscription {sub} -o table`, or fix nodeGroups[].cluster / resourceGroup"
                ),
            },
        }
    }

    /// An agent pool AKS's own cluster autoscaler scales: never written.
    pub fn aks_autoscaler(rg: &str, cluster: &str, pool: &str) -> Problem {
        Problem {
            object: format!("agent pool {pool} of managed cluster {cluster}"),
            what: "AKS's own cluster autoscaler scales it (enableAutoScaling: true), so this controller does not write it".into(),
            fix: format!(
                "`az aks nodepool update -g {rg} --cluster-name {cluster} -n {pool} --disable-cluster-autoscaler`, or remove it from nodeGroups"
            ),
        }
    }

    /// The API server cannot be reached (or does not accept the credentials).
    pub fn kube_unreachable(server: &str, error: &str) -> Problem {
        Problem {
            object: format!("kubernetes API server {server}"),
            what: format!("not reachable with these credentials ({error})"),
            fix: "check kubernetes.kubeconfig (or, in a pod, the ServiceAccount token and KUBERNETES_SERVICE_HOST) and try `kubectl get --raw /version` with the same kubeconfig; or set kubernetes.enabled: false".into(),
        }
    }

    /// RBAC refuses a verb the controller needs.
    pub fn rbac(
        user: &str,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        why: &str,
        name: Option<&str>,
    ) -> Problem {
        let (scope, flag) = match namespace {
            Some(ns) => (format!("in namespace {ns}"), format!("-n {ns}")),
            None => ("cluster-wide".to_string(), "-A".to_string()),
        };
        // `--as` only for an identity RBAC can name (a ServiceAccount, a user).
        let as_user = if user.contains(':') {
            format!(" --as={user}")
        } else {
            String::new()
        };
        Problem {
            object: "kubernetes RBAC".into(),
            what: format!("{user} may not {verb} {resource} {scope} (needed to {why})"),
            fix: format!(
                "apply the ClusterRole and Role of deploy/base (kubectl apply -k deploy/overlays/...){}, then check with `kubectl auth can-i {verb} {resource} {flag}{as_user}`",
                match name {
                    Some(n) => format!("; a renamed object ({n}) must be in the Role's resourceNames"),
                    None => String::new(),
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, kind: NodeGroupKind, rg: Option<&str>) -> NodeGroupSpec {
        NodeGroupSpec {
            name: name.into(),
            kind,
            resource_group: rg.map(str::to_string),
            min_size: 0,
            max_size: 3,
            desired_capacity: None,
            schedules: Vec::new(),
            max_scale_down_step: None,
        }
    }

    #[test]
    fn a_missing_scale_set_names_it_its_resource_group_and_the_az_command_that_lists_them() {
        let p = Problem::node_group_missing(
            "sub-1",
            "mc_rg",
            &group("pool-x", NodeGroupKind::Vmss, None),
        );
        let line = p.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(line
            .starts_with("node group pool-x: no scale set named pool-x in resource group mc_rg"));
        assert!(line.contains(
            "fix: check the name with `az vmss list -g mc_rg --subscription sub-1 -o table`"
        ));
    }

    #[test]
    fn a_missing_agent_pool_names_its_cluster_and_the_az_aks_command() {
        let kind = NodeGroupKind::AksAgentPool {
            cluster: "aks-prod".into(),
        };
        let line =
            Problem::node_group_missing("sub-1", "mc_rg", &group("user9", kind, Some("rg-prod")))
                .to_string();
        assert!(line.contains(
            "no agent pool named user9 in managed cluster aks-prod (resource group rg-prod"
        ));
        assert!(line.contains("`az aks nodepool list -g rg-prod --cluster-name aks-prod --subscription sub-1 -o table`"));
    }

    #[test]
    fn a_pool_under_aks_autoscaling_says_the_exact_command_that_turns_it_off() {
        let line = Problem::aks_autoscaler("rg-prod", "aks-prod", "user1").to_string();
        assert_eq!(
            line,
            "agent pool user1 of managed cluster aks-prod: AKS's own cluster autoscaler scales it (enableAutoScaling: true), so this controller does not write it; fix: `az aks nodepool update -g rg-prod --cluster-name aks-prod -n user1 --disable-cluster-autoscaler`, or remove it from nodeGroups"
        );
    }

    #[test]
    fn an_rbac_refusal_names_the_verb_the_scope_and_the_can_i_check() {
        let sa = "system:serviceaccount:vmss:vmss-capacity-controller";
        let line = Problem::rbac(sa, "list", "pods", None, "see pending pods", None).to_string();
        assert!(line.contains(&format!(
            "{sa} may not list pods cluster-wide (needed to see pending pods)"
        )));
        assert!(line.contains(&format!("`kubectl auth can-i list pods -A --as={sa}`")));
        let line = Problem::rbac(
            sa,
            "update",
            "leases/my-lease",
            Some("vmss"),
            "lead",
            Some("my-lease"),
        )
        .to_string();
        assert!(line.contains("may not update leases/my-lease in namespace vmss"));
        assert!(line.contains("a renamed object (my-lease) must be in the Role's resourceNames"));
        assert!(line.contains("`kubectl auth can-i update leases/my-lease -n vmss --as="));
    }
}
