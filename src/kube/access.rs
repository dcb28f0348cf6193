//! Start-up check of the Kubernetes side: the API server answers, and RBAC grants every verb
//! this configuration needs (asked with SelfSubjectAccessReview, the API behind `kubectl auth
//! can-i`). What is missing comes back as [`Problem`]s, one line each with the fix, before the
//! controller starts watching and writing: a missing verb would otherwise surface as a 403
//! buried in a watch's retries.

use crate::config::{DemandKind, Settings};
use crate::problem::Problem;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;
use std::time::Duration;

/// One permission the controller needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// The verb (`list`, `watch`, `update`, ...).
    pub verb: &'static str,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource's plural.
    pub resource: &'static str,
    /// A subresource (`eviction`).
    pub subresource: Option<&'static str>,
    /// The namespace; None: cluster-wide (every namespace, or a cluster-scoped resource).
    pub namespace: Option<String>,
    /// The object's name, for a Role that grants the verb on named objects only.
    pub name: Option<String>,
    /// What the controller does with it, for the message.
    pub why: &'static str,
}

impl Need {
    /// `resource[.group][/subresource]`, as `kubectl auth can-i` takes it.
    pub fn resource_name(&self) -> String {
        let mut s = self.resource.to_string();
        if !self.group.is_empty() {
            s = format!("{s}.{}", self.group);
        }
        if let Some(name) = &self.name {
            s = format!("{s}/{name}");
        }
        if let Some(sub) = self.subresource {
            s = format!("{s} --subresource={sub}");
        }
        s
    }
}

/// Every permission `settings` needs, as the ClusterRole and Role of `deploy/base` grant them.
/// A dry run writes nothing, takes no Lease and writes no status: only the watches' reads.
pub fn needs(settings: &Settings, dry_run: bool) -> Vec<Need> {
    let k = &settings.kubernetes;
    let need = |verb, group, resource, namespace: Option<&str>, why| Need {
        verb,
        group,
        resource,
        subresource: None,
        namespace: namespace.map(str::to_string),
        name: None,
        why,
    };
    let ns = Some(k.namespace.as_str());
    // The Role grants reading and updating the Lease and the status ConfigMaps by name only.
    let named = |verb, group, resource, name: &str, why| Need {
        name: Some(name.to_string()),
        ..need(verb, group, resource, ns, why)
    };
    let mut out = Vec::new();
    // The reflectors run whenever the Kubernetes side is on (readiness waits for them).
    let reads: [(&str, &str, &str); 9] = [
        ("", "nodes", "map nodes to node groups"),
        ("", "pods", "see pending and running pods"),
        (
            "policy",
            "poddisruptionbudgets",
            "respect disruption budgets",
        ),
        ("apps", "daemonsets", "count DaemonSet pods on new nodes"),
        ("", "persistentvolumeclaims", "simulate volumes"),
        ("", "persistentvolumes", "simulate volumes"),
        ("storage.k8s.io", "storageclasses", "simulate volumes"),
        ("storage.k8s.io", "csinodes", "count volume attach limits"),
        ("", "namespaces", "match namespace selectors"),
    ];
    for (group, resource, why) in reads {
        for verb in ["list", "watch"] {
            out.push(need(verb, group, resource, None, why));
        }
    }
    if dry_run {
        return out;
    }
    if k.leader_election.enabled {
        let lease = &k.leader_election.lease_name;
        out.push(need(
            "create",
            "coordination.k8s.io",
            "leases",
            ns,
            "hold the Lease",
        ));
        for verb in ["get", "update"] {
            out.push(named(
                verb,
                "coordination.k8s.io",
                "leases",
                lease,
                "hold the Lease",
            ));
        }
    }
    let status = "write the status ConfigMap";
    out.push(need("create", "", "configmaps", ns, status));
    // cluster-autoscaler's layout goes under our own name when another autoscaler owns its
    // ConfigMap (crate::kube::ca_status::FALLBACK_CA_STATUS_CONFIG_MAP).
    let fallback = k
        .ca_status_config_map
        .as_ref()
        .map(|_| crate::config::FALLBACK_CA_STATUS_CONFIG_MAP.to_string());
    for name in std::iter::once(&k.status_config_map)
        .chain(&k.ca_status_config_map)
        .chain(&fallback)
    {
        for verb in ["get", "update"] {
            out.push(named(verb, "", "configmaps", name, status));
        }
    }
    // Events about its writes in its namespace; with pod demand, pods' Events in theirs. A
    // repeated Event is a patch of its series count.
    let events_scope = if settings.pod_demand.kind == DemandKind::Pods {
        None
    } else {
        ns
    };
    for verb in ["create", "patch"] {
        out.push(need(
            verb,
            "events.k8s.io",
            "events",
            events_scope,
            "post Events",
        ));
    }
    // The capacity APIs, when served: read the objects and what they refer to, write their
    // status (guarded by the resourceVersion read).
    let pd = &settings.pod_demand;
    if pd.provisioning_requests {
        let why = "serve ProvisioningRequests";
        out.push(need(
            "list",
            "autoscaling.x-k8s.io",
            "provisioningrequests",
            None,
            why,
        ));
        out.push(Need {
            subresource: Some("status"),
            ..need(
                "update",
                "autoscaling.x-k8s.io",
                "provisioningrequests",
                None,
                why,
            )
        });
        out.push(need("get", "", "podtemplates", None, why));
    }
    if pd.capacity_buffer_controller {
        let why = "serve CapacityBuffers";
        out.push(need(
            "list",
            "autoscaling.x-k8s.io",
            "capacitybuffers",
            None,
            why,
        ));
        out.push(Need {
            subresource: Some("status"),
            ..need(
                "update",
                "autoscaling.x-k8s.io",
                "capacitybuffers",
                None,
                why,
            )
        });
        out.push(need("get", "", "podtemplates", None, why));
        out.push(need(
            "list",
            "",
            "resourcequotas",
            None,
            "cut CapacityBuffers by ResourceQuotas",
        ));
    }
    if settings.pod_demand.kind == DemandKind::Pods && settings.scale_down.enabled {
        let taint = "taint nodes before removing them";
        out.push(need("get", "", "nodes", None, taint));
        out.push(need("patch", "", "nodes", None, taint));
        out.push(Need {
            subresource: Some("eviction"),
            ..need("create", "", "pods", None, "drain nodes")
        });
    }
    out
}

/// The identity RBAC sees, when it can be told: the `sub` of a ServiceAccount token, the
/// kubeconfig's current user's, or a pod's own.
fn user(settings: &Settings) -> String {
    const TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    let token = match &settings.kubernetes.kubeconfig {
        Some(path) => kubeconfig_token(path),
        None => std::fs::read_to_string(TOKEN).ok(),
    };
    token
        .and_then(|jwt| subject(&jwt))
        .unwrap_or_else(|| "this controller's identity".into())
}

/// The token (inline or from its file) of a kubeconfig's current user, if it has one.
fn kubeconfig_token(path: &std::path::Path) -> Option<String> {
    use secrecy::ExposeSecret;
    let config = kube::config::Kubeconfig::read_from(path).ok()?;
    let current = config.current_context.as_deref()?;
    let user = config
        .contexts
        .iter()
        .find(|c| c.name == current)?
        .context
        .as_ref()?
        .user
        .clone()?;
    let auth = config
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    match (&auth.token, &auth.token_file) {
        (Some(t), _) => Some(t.expose_secret().to_string()),
        (None, Some(file)) => std::fs::read_to_string(file).ok(),
        (None, None) => None,
    }
}

/// The `sub` claim of a JWT (not verified: it only names the identity in a message).
fn subject(jwt: &str) -> Option<String> {
    use base64::Engine;
    let payload = jwt.trim().split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims["sub"].as_str().map(str::to_string)
}

/// Checks the API server and RBAC; `reach` bounds the wait for the API server to answer (it
/// may be starting with the controller). Empty: all granted. When the API server cannot answer
/// SelfSubjectAccessReviews at all, RBAC is not judged here (the watches will say).
pub async fn check(
    client: &kube::Client,
    settings: &Settings,
    dry_run: bool,
    reach: Duration,
) -> Vec<Problem> {
    let server = settings.kubernetes.kubeconfig.as_ref().map_or_else(
        || "(in-cluster)".to_string(),
        |p| format!("of {}", p.display()),
    );
    let deadline = tokio::time::Instant::now() + reach;
    let mut wait = Duration::from_millis(500);
    loop {
        // Each try is bounded too: a server that accepts and never answers must not hold the
        // start for the client's own read timeout.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let answer = match tokio::time::timeout(left, client.apiserver_version()).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {reach:?}")),
        };
        match answer {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() + wait > deadline => {
                return vec![Problem::kube_unreachable(&server, &e)];
            }
            Err(e) => {
                tracing::info!(error = %e, "the Kubernetes API server does not answer yet; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let user = user(settings);
    let mut problems = Vec::new();
    for n in needs(settings, dry_run) {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(n.verb.into()),
                    group: Some(n.group.into()),
                    resource: Some(n.resource.into()),
                    subresource: n.subresource.map(str::to_string),
                    namespace: n.namespace.clone(),
                    name: n.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => problems.push(Problem::rbac(
                &user,
                n.verb,
                &n.resource_name(),
                n.namespace.as_deref(),
                n.why,
                n.name.as_deref(),
            )),
            Err(e) => {
                tracing::warn!(error = %e, "could not ask the API server what RBAC allows (SelfSubjectAccessReview): not checked at start-up");
                return problems;
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_token_names_its_account() {
        use base64::Engine;
        let claims =
            serde_json::json!({"sub": "system:serviceaccount:vmss:controller", "aud": ["x"]});
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string());
        let jwt = format!("eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln\n");
        assert_eq!(
            subject(&jwt).as_deref(),
            Some("system:serviceaccount:vmss:controller")
        );
        assert_eq!(subject("not a jwt"), None);
    }

    #[test]
    fn kubectl_can_i_names_carry_the_group_and_the_subresource() {
        let n = Need {
            verb: "create",
            group: "",
            resource: "pods",
            subresource: Some("eviction"),
            namespace: None,
            name: None,
            why: "drain",
        };
        assert_eq!(n.resource_name(), "pods --subresource=eviction");
        let n = Need {
            group: "coordination.k8s.io",
            resource: "leases",
            subresource: None,
            ..n
        };
        assert_eq!(n.resource_name(), "leases.coordination.k8s.io");
        let n = Need {
            name: Some("vmss-capacity-controller".into()),
            ..n
        };
        assert_eq!(
            n.resource_name(),
            "leases.coordination.k8s.io/vmss-capacity-controller"
        );
    }
}
