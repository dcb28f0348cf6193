//! ResourceQuotas as CapacityBuffers meet them: how many of a buffer's pods a namespace's quotas
//! still admit. Cluster-autoscaler 1.35's `resourceQuotaAllocator`, rule for rule: the buffers of
//! a namespace are served in order, each pod's requests count under their own name and under
//! `requests.<name>` (`cpu` and `requests.cpu`), a quota admits `floor((hard − used − what the
//! buffers before took) / request)` pods for each resource it limits that the pod requests, a
//! quota whose scopes do not match the pod is skipped, and the smallest count wins. A buffer cut
//! below what it asked for is `LimitedByQuotas`, naming the quotas. The `pods` count is not
//! charged (cluster-autoscaler leaves it out too: buffer pods are not created). Pure code.

use super::fit::pod_requests;
use super::quantity::{parse, Milli};
use k8s_openapi::api::core::v1::{PodAffinityTerm, PodSpec, ResourceQuota};
use std::collections::{BTreeMap, HashMap};

/// What the buffers served so far took, per quota (`uid`, else name) and quota resource name.
pub type Reserved = HashMap<String, BTreeMap<String, Milli>>;

/// What [`admit`] decided for one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// How many of the pods asked for the quotas admit.
    pub replicas: i64,
    /// The quotas that admit fewer than were asked for, by name (empty: not limited).
    pub blocking: Vec<String>,
}

/// A pod's requests under the names quotas use: `cpu` and `requests.cpu`, and so on for each
/// resource it requests (limits stand in for missing requests, as the API server defaults
/// them). Empty for a pod that requests nothing.
pub fn quota_requests(spec: &PodSpec) -> BTreeMap<String, Milli> {
    let mut out = BTreeMap::new();
    for (name, value) in pod_requests(spec).iter() {
        if value <= 0 || name == "pods" {
            continue;
        }
        out.insert(name.to_string(), value);
        out.insert(format!("requests.{name}"), value);
    }
    out
}

/// How many of `replicas` pods of `spec` the namespace's `quotas` admit after `reserved`, and
/// which quotas cut them; the admitted pods are added to `reserved` for the buffers after.
/// `None` when the pod requests nothing (no quota can count it: cluster-autoscaler leaves such a
/// buffer alone).
pub fn admit(
    quotas: &[ResourceQuota],
    spec: &PodSpec,
    replicas: i64,
    reserved: &mut Reserved,
) -> Option<Admitted> {
    let requests = quota_requests(spec);
    if requests.is_empty() {
        return None;
    }
    let mut allowed = replicas;
    let mut blocking = Vec::new();
    let mut matching = Vec::new();
    for quota in quotas {
        if !scopes_match(quota, spec, &requests) {
            continue;
        }
        let id = quota_id(quota);
        let fit = fits(quota, &requests, reserved.get(&id));
        if fit < replicas {
            blocking.push(quota.metadata.name.clone().unwrap_or_default());
        }
        allowed = allowed.min(fit);
        matching.push((id, quota));
    }
    if allowed > 0 {
        for (id, quota) in matching {
            let hard = quota.status.as_ref().and_then(|s| s.hard.as_ref());
            let taken = reserved.entry(id).or_default();
            for (name, per) in &requests {
                if hard.is_some_and(|h| h.contains_key(name)) {
                    *taken.entry(name.clone()).or_default() +=
                        per.saturating_mul(Milli::from(allowed));
                }
            }
        }
    }
    Some(Admitted {
        replicas: allowed.max(0),
        blocking,
    })
}

/// The quota's identity within a pass.
fn quota_id(quota: &ResourceQuota) -> String {
    quota
        .metadata
        .uid
        .clone()
        .or_else(|| quota.metadata.name.clone())
        .unwrap_or_default()
}

/// How many pods of `requests` `quota` admits: for each resource in `status.hard` the pod
/// requests, what is left of it (hard − used − reserved; 0 when nothing is) over the request,
/// rounded down; the smallest.
fn fits(
    quota: &ResourceQuota,
    requests: &BTreeMap<String, Milli>,
    reserved: Option<&BTreeMap<String, Milli>>,
) -> i64 {
    let Some(status) = &quota.status else {
        return i64::MAX;
    };
    let mut most = i64::MAX;
    for (name, hard) in status.hard.iter().flatten() {
        let Some(per) = requests.get(name).copied().filter(|p| *p > 0) else {
            continue;
        };
        let Ok(hard) = parse(&hard.0) else { continue };
        let used = status
            .used
            .as_ref()
            .and_then(|u| u.get(name))
            .and_then(|q| parse(&q.0).ok())
            .unwrap_or(0);
        let taken = reserved.and_then(|r| r.get(name)).copied().unwrap_or(0);
        let available = hard - used - taken;
        if available < 0 {
            return 0;
        }
        most = most.min(i64::try_from(available / per).unwrap_or(i64::MAX));
    }
    most
}

/// Whether a buffer pod of `spec` falls under `quota`: every scope of `spec.scopes` and every
/// expression of `spec.scopeSelector` matches (a buffer pod is never terminating).
fn scopes_match(quota: &ResourceQuota, spec: &PodSpec, requests: &BTreeMap<String, Milli>) -> bool {
    let Some(qs) = &quota.spec else { return true };
    let scopes = qs
        .scopes
        .iter()
        .flatten()
        .map(|s| (s.as_str(), "Exists", &[][..]));
    let expressions = qs
        .scope_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .map(|e| {
            (
                e.scope_name.as_str(),
                e.operator.as_str(),
                e.values.as_deref().unwrap_or_default(),
            )
        });
    scopes
        .chain(expressions)
        .all(|(scope, operator, values)| scope_matches(scope, operator, values, spec, requests))
}

fn scope_matches(
    scope: &str,
    operator: &str,
    values: &[String],
    spec: &PodSpec,
    requests: &BTreeMap<String, Milli>,
) -> bool {
    let best_effort = !requests.contains_key("cpu") && !requests.contains_key("memory");
    match scope {
        "NotTerminating" => true,
        "Terminating" => false,
        "BestEffort" => best_effort,
        "NotBestEffort" => !best_effort,
        "PriorityClass" => {
            let class = spec.priority_class_name.as_deref().unwrap_or_default();
            match operator {
                "Exists" => !class.is_empty(),
                "DoesNotExist" => class.is_empty(),
                "In" => !class.is_empty() && values.iter().any(|v| v == class),
                "NotIn" => class.is_empty() || !values.iter().any(|v| v == class),
                // Not a valid operator: the API server refuses it; never a match.
                _ => false,
            }
        }
        "CrossNamespacePodAffinity" => cross_namespace_affinity(spec),
        _ => false,
    }
}

fn cross_namespace_affinity(spec: &PodSpec) -> bool {
    let crosses = |t: &PodAffinityTerm| {
        t.namespaces.as_ref().is_some_and(|n| !n.is_empty()) || t.namespace_selector.is_some()
    };
    let Some(a) = &spec.affinity else {
        return false;
    };
    let affinity = a.pod_affinity.as_ref().is_some_and(|p| {
        p.required_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .any(crosses)
            || p.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .any(|w| crosses(&w.pod_affinity_term))
    });
    let anti = a.pod_anti_affinity.as_ref().is_some_and(|p| {
        p.required_during_scheduling_ignored_during_execution
            .iter()
            .flatten()
            .any(crosses)
            || p.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .any(|w| crosses(&w.pod_affinity_term))
    });
    affinity || anti
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(cpu: &str, memory: &str) -> PodSpec {
        serde_json::from_value(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}))
        .unwrap()
    }

    fn quota(
        name: &str,
        quota_spec: serde_json::Value,
        hard: serde_json::Value,
        used: serde_json::Value,
    ) -> ResourceQuota {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "web", "uid": format!("uid-{name}")},
            "spec": quota_spec,
            "status": {"hard": hard, "used": used},
        }))
        .unwrap()
    }

    #[test]
    fn a_quota_admits_what_is_left_of_it_over_each_pods_request_rounded_down() {
        // 10 cpus hard, 4.5 used: 5.5 left, a pod of 2 cpus: 2 pods.
        let q = quota(
            "compute",
            json!({}),
            json!({"requests.cpu": "10"}),
            json!({"requests.cpu": "4500m"}),
        );
        let got = admit(&[q], &spec("2", "1Gi"), 5, &mut Reserved::new()).unwrap();
        assert_eq!(
            got,
            Admitted {
                replicas: 2,
                blocking: vec!["compute".into()]
            }
        );
    }

    #[test]
    fn buffers_of_one_namespace_share_a_quota_in_order() {
        let q = quota(
            "compute",
            json!({}),
            json!({"cpu": "6", "memory": "100Gi"}),
            json!({}),
        );
        let mut reserved = Reserved::new();
        let first = admit(
            std::slice::from_ref(&q),
            &spec("2", "1Gi"),
            2,
            &mut reserved,
        )
        .unwrap();
        assert_eq!(
            first,
            Admitted {
                replicas: 2,
                blocking: vec![]
            },
            "4 of 6 cpus taken"
        );
        let second = admit(&[q], &spec("1", "1Gi"), 3, &mut reserved).unwrap();
        assert_eq!(
            second,
            Admitted {
                replicas: 2,
                blocking: vec!["compute".into()]
            }
        );
    }

    #[test]
    fn the_smallest_count_of_every_matching_quota_and_resource_wins_and_each_cutting_quota_is_named(
    ) {
        let cpu = quota("cpu", json!({}), json!({"requests.cpu": "8"}), json!({}));
        let memory = quota(
            "memory",
            json!({}),
            json!({"requests.memory": "3Gi"}),
            json!({}),
        );
        let roomy = quota("roomy", json!({}), json!({"limits.cpu": "1"}), json!({}));
        let got = admit(
            &[cpu, memory, roomy],
            &spec("1", "1Gi"),
            10,
            &mut Reserved::new(),
        )
        .unwrap();
        assert_eq!(got.replicas, 3);
        assert_eq!(got.blocking, vec!["cpu".to_string(), "memory".to_string()]);
    }

    #[test]
    fn a_quota_already_over_its_hard_limit_admits_none() {
        let q = quota(
            "compute",
            json!({}),
            json!({"cpu": "4"}),
            json!({"cpu": "5"}),
        );
        let got = admit(&[q], &spec("100m", "1Gi"), 3, &mut Reserved::new()).unwrap();
        assert_eq!(got.replicas, 0);
    }

    #[test]
    fn quotas_whose_scopes_do_not_match_the_pod_are_skipped() {
        let best_effort = quota(
            "be",
            json!({"scopes": ["BestEffort"]}),
            json!({"cpu": "0"}),
            json!({}),
        );
        let terminating = quota(
            "t",
            json!({"scopes": ["Terminating"]}),
            json!({"cpu": "0"}),
            json!({}),
        );
        let other_class = quota(
            "class",
            json!({"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
            json!({"cpu": "0"}),
            json!({}),
        );
        let not_best_effort = quota(
            "nbe",
            json!({"scopes": ["NotBestEffort", "NotTerminating"]}),
            json!({"cpu": "3"}),
            json!({}),
        );
        let got = admit(
            &[best_effort, terminating, other_class, not_best_effort],
            &spec("1", "1Gi"),
            5,
            &mut Reserved::new(),
        )
        .unwrap();
        assert_eq!(
            got,
            Admitted {
                replicas: 3,
                blocking: vec!["nbe".into()]
            }
        );
    }

    #[test]
    fn a_priority_class_scope_matches_the_pods_class() {
        let mut s = spec("1", "1Gi");
        s.priority_class_name = Some("high".into());
        let q = quota(
            "class",
            json!({"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
            json!({"cpu": "1"}),
            json!({}),
        );
        assert_eq!(
            admit(&[q], &s, 4, &mut Reserved::new()).unwrap().replicas,
            1
        );
    }

    #[test]
    fn a_pod_that_requests_nothing_is_left_to_no_quota() {
        let empty: PodSpec =
            serde_json::from_value(json!({"containers": [{"name": "c"}]})).unwrap();
        let q = quota("compute", json!({}), json!({"cpu": "0"}), json!({}));
        assert_eq!(admit(&[q], &empty, 3, &mut Reserved::new()), None);
    }
}
