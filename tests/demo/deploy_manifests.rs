//! The security and availability settings of `deploy/` cannot silently regress: these tests read
//! the kustomize base as plain YAML (no kubectl, no cluster) and assert the locked-down pod, the
//! probes, the resources, the grace period, the NetworkPolicy's egress, two replicas with leader
//! election and a PDB that keeps one, the projected API token, and the exact Kubernetes RBAC.
//! `deploy/test-rbac.sh` checks the same RBAC against a real API server.

use serde::Deserialize;
use serde_yaml::Value;
use std::path::{Path, PathBuf};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every YAML document of one file.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: bad YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn only_document(path: &Path) -> Value {
    let mut docs = documents(path);
    assert_eq!(docs.len(), 1, "{} should hold one object", path.display());
    docs.remove(0)
}

/// `v["a"]["b"]...`, panicking with the path when a key is missing.
fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    let mut cur = v;
    for (i, key) in path.iter().enumerate() {
        cur = cur
            .get(*key)
            .unwrap_or_else(|| panic!("missing key {}", path[..=i].join(".")));
    }
    cur
}

fn deployment() -> Value {
    only_document(&deploy_dir().join("base/deployment.yaml"))
}

fn controller_container(dep: &Value) -> Value {
    let containers = at(dep, &["spec", "template", "spec", "containers"])
        .as_sequence()
        .expect("containers is a list");
    assert_eq!(containers.len(), 1, "one container, no sidecars");
    containers[0].clone()
}

fn all_yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("deploy/ is readable") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            all_yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

#[test]
fn pod_runs_as_non_root_uid_65532_with_runtime_default_seccomp() {
    let dep = deployment();
    let pod_sc = at(&dep, &["spec", "template", "spec", "securityContext"]);
    assert_eq!(pod_sc["runAsNonRoot"], Value::Bool(true));
    assert_eq!(pod_sc["runAsUser"].as_u64(), Some(65532));
    assert_eq!(
        at(pod_sc, &["seccompProfile", "type"]).as_str(),
        Some("RuntimeDefault")
    );

    let c = controller_container(&dep);
    let sc = at(&c, &["securityContext"]);
    assert_eq!(sc["runAsNonRoot"], Value::Bool(true));
    assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true));
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false));
    assert_ne!(sc.get("privileged"), Some(&Value::Bool(true)));
    assert_eq!(
        at(sc, &["seccompProfile", "type"]).as_str(),
        Some("RuntimeDefault")
    );
    let drop: Vec<&str> = at(sc, &["capabilities", "drop"])
        .as_sequence()
        .expect("drop is a list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(drop, ["ALL"]);
    assert!(
        sc["capabilities"].get("add").is_none(),
        "no capability may be added back"
    );
}

#[test]
fn pod_uses_no_host_namespaces_and_mounts_only_a_projected_api_token() {
    let dep = deployment();
    let spec = at(&dep, &["spec", "template", "spec"]);
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(
            spec.get(key),
            Some(&Value::Bool(true)),
            "{key} must not be set"
        );
    }
    // No implicit token: the only one is the explicit projected volume below.
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    let sa = only_document(&deploy_dir().join("base/serviceaccount.yaml"));
    assert_eq!(sa["automountServiceAccountToken"], Value::Bool(false));
    let volumes = at(spec, &["volumes"]).as_sequence().expect("volumes list");
    assert!(
        volumes.iter().all(|v| v.get("hostPath").is_none()),
        "no hostPath volumes"
    );
    assert!(
        volumes.iter().all(|v| v.get("secret").is_none()),
        "the base mounts no Secret (the API token is projected, not a token Secret)"
    );

    let c = controller_container(&dep);
    let mount = at(&c, &["volumeMounts"])
        .as_sequence()
        .expect("volumeMounts list")
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/var/run/secrets/kubernetes.io/serviceaccount"))
        .expect("the API token is mounted where kube-rs's in-cluster config reads it")
        .clone();
    assert_eq!(mount["readOnly"], Value::Bool(true));
    let volume = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume exists");
    let sources = at(volume, &["projected", "sources"])
        .as_sequence()
        .expect("a projected volume");
    let token = sources
        .iter()
        .find_map(|s| s.get("serviceAccountToken"))
        .expect("a serviceAccountToken source");
    assert_eq!(token["path"].as_str(), Some("token"));
    let expiry = token["expirationSeconds"]
        .as_u64()
        .expect("expirationSeconds is set");
    assert!(
        (600..=3600).contains(&expiry),
        "token lifetime {expiry}s: at least the API minimum, at most an hour"
    );
    assert!(
        token.get("audience").is_none(),
        "no audience: the token carries the API server's own audience"
    );
    let ca = sources
        .iter()
        .find_map(|s| s.get("configMap"))
        .expect("the cluster CA from a ConfigMap");
    assert_eq!(ca["name"].as_str(), Some("kube-root-ca.crt"));
    assert_eq!(ca["items"][0]["path"].as_str(), Some("ca.crt"));
    let ns = sources
        .iter()
        .find_map(|s| s.get("downwardAPI"))
        .expect("the namespace from the downward API");
    assert_eq!(ns["items"][0]["path"].as_str(), Some("namespace"));
    assert_eq!(
        ns["items"][0]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.namespace")
    );
}

#[test]
fn pod_name_and_namespace_come_from_the_downward_api() {
    let c = controller_container(&deployment());
    let env = at(&c, &["env"]).as_sequence().expect("env list");
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let var = env
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("env {name} is set"));
        assert_eq!(
            at(var, &["valueFrom", "fieldRef", "fieldPath"]).as_str(),
            Some(field),
            "{name}"
        );
    }
}

#[test]
fn two_replicas_roll_one_at_a_time_without_dropping_below_two() {
    let dep = deployment();
    assert_eq!(at(&dep, &["spec", "replicas"]).as_u64(), Some(2));
    let strategy = at(&dep, &["spec", "strategy"]);
    assert_eq!(strategy["type"].as_str(), Some("RollingUpdate"));
    assert_eq!(
        at(strategy, &["rollingUpdate", "maxUnavailable"]).as_u64(),
        Some(0)
    );
    assert_eq!(
        at(strategy, &["rollingUpdate", "maxSurge"]).as_u64(),
        Some(1)
    );
}

#[test]
fn replicas_prefer_different_nodes_without_requiring_it() {
    let dep = deployment();
    let spec = at(&dep, &["spec", "template", "spec"]);
    let labels = at(&dep, &["spec", "template", "metadata", "labels"]);
    let anti = at(spec, &["affinity", "podAntiAffinity"]);
    assert!(
        anti.get("requiredDuringSchedulingIgnoredDuringExecution")
            .is_none(),
        "required anti-affinity would leave a replica Pending on a one-node pool"
    );
    let preferred = at(anti, &["preferredDuringSchedulingIgnoredDuringExecution"])
        .as_sequence()
        .expect("preferred terms");
    assert!(preferred.iter().any(|t| {
        let term = &t["podAffinityTerm"];
        term["topologyKey"].as_str() == Some("kubernetes.io/hostname")
            && term["labelSelector"]["matchLabels"] == *labels
    }));
    for c in at(spec, &["topologySpreadConstraints"])
        .as_sequence()
        .expect("topologySpreadConstraints list")
    {
        assert_eq!(c["whenUnsatisfiable"].as_str(), Some("ScheduleAnyway"));
    }
}

#[test]
fn pod_disruption_budget_keeps_one_replica_and_lets_unhealthy_pods_go() {
    let pdb = only_document(&deploy_dir().join("base/poddisruptionbudget.yaml"));
    assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1"));
    assert_eq!(at(&pdb, &["spec", "minAvailable"]).as_u64(), Some(1));
    assert!(at(&pdb, &["spec"]).get("maxUnavailable").is_none());
    assert_eq!(
        at(&pdb, &["spec", "unhealthyPodEvictionPolicy"]).as_str(),
        Some("AlwaysAllow")
    );
    let dep = deployment();
    assert_eq!(
        at(&pdb, &["spec", "selector", "matchLabels"]),
        at(&dep, &["spec", "template", "metadata", "labels"]),
        "the budget selects exactly the controller's pods"
    );
    assert!(
        at(&dep, &["spec", "replicas"]).as_u64() > Some(1),
        "minAvailable 1 with one replica would block every drain"
    );
}

#[test]
fn probes_point_at_healthz_and_readyz_on_the_metrics_port() {
    let c = controller_container(&deployment());
    assert_eq!(
        at(&c, &["livenessProbe", "httpGet", "path"]).as_str(),
        Some("/healthz")
    );
    assert_eq!(
        at(&c, &["readinessProbe", "httpGet", "path"]).as_str(),
        Some("/readyz")
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            at(&c, &[probe, "httpGet", "port"]).as_str(),
            Some("metrics")
        );
    }
    let ports = at(&c, &["ports"]).as_sequence().expect("ports list");
    assert!(ports.iter().any(
        |p| p["name"].as_str() == Some("metrics") && p["containerPort"].as_u64() == Some(8085)
    ));
}

#[test]
fn cpu_and_memory_requests_and_limits_are_set() {
    let c = controller_container(&deployment());
    for kind in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            let v = at(&c, &["resources", kind, res]);
            assert!(
                v.as_str().is_some_and(|s| !s.is_empty()),
                "resources.{kind}.{res} must be set"
            );
        }
    }
}

#[test]
fn termination_grace_outlasts_the_controllers_30s_shutdown_grace() {
    let dep = deployment();
    let grace = at(
        &dep,
        &["spec", "template", "spec", "terminationGracePeriodSeconds"],
    )
    .as_u64()
    .expect("terminationGracePeriodSeconds is a number");
    assert!(
        grace > 30,
        "terminationGracePeriodSeconds {grace} must exceed shutdownGrace 30s"
    );
}

#[test]
fn config_is_mounted_read_only_and_passed_with_run() {
    let dep = deployment();
    let c = controller_container(&dep);
    let mounts = at(&c, &["volumeMounts"])
        .as_sequence()
        .expect("volumeMounts list");
    let config = mounts
        .iter()
        .find(|m| m["mountPath"].as_str() == Some("/etc/vmss-capacity-controller"))
        .expect("config mounted at /etc/vmss-capacity-controller");
    assert_eq!(config["readOnly"], Value::Bool(true));
    let args: Vec<&str> = at(&c, &["args"])
        .as_sequence()
        .expect("args list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--config",
            "/etc/vmss-capacity-controller/config.yaml"
        ]
    );
}

#[test]
fn network_policy_allows_egress_only_to_dns_and_https_and_ingress_only_to_metrics() {
    let np = only_document(&deploy_dir().join("base/networkpolicy.yaml"));
    let types: Vec<&str> = at(&np, &["spec", "policyTypes"])
        .as_sequence()
        .expect("policyTypes list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        types.contains(&"Ingress") && types.contains(&"Egress"),
        "both directions restricted"
    );

    let mut egress_ports = Vec::new();
    for rule in at(&np, &["spec", "egress"])
        .as_sequence()
        .expect("egress list")
    {
        let ports = rule
            .get("ports")
            .and_then(Value::as_sequence)
            .expect("every egress rule names its ports (a rule without ports allows all)");
        for p in ports {
            let port = p["port"].as_u64().expect("numeric port");
            assert!(
                port == 53 || port == 443,
                "egress to port {port} is not allowed"
            );
            egress_ports.push(port);
        }
    }
    assert!(egress_ports.contains(&53) && egress_ports.contains(&443));

    for rule in at(&np, &["spec", "ingress"])
        .as_sequence()
        .expect("ingress list")
    {
        let ports = rule
            .get("ports")
            .and_then(Value::as_sequence)
            .expect("every ingress rule names its ports");
        for p in ports {
            assert_eq!(
                p["port"].as_u64(),
                Some(8085),
                "ingress only to the metrics port"
            );
        }
    }
}

/// One RBAC rule, as `(apiGroups, resources, resourceNames, verbs)`, for exact comparison.
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .map(|x| x.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn rule(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Rule {
    let own = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect();
    (own(groups), own(resources), own(names), own(verbs))
}

/// The object of `kind` in `file`, and the rules of it when it is a role.
fn rbac_object(file: &str, kind: &str) -> Value {
    documents(&deploy_dir().join("base").join(file))
        .into_iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("{file} holds a {kind}"))
}

fn rules_of(role: &Value) -> Vec<Rule> {
    at(role, &["rules"])
        .as_sequence()
        .expect("rules list")
        .iter()
        .map(|r| {
            (
                strings(r, "apiGroups"),
                strings(r, "resources"),
                strings(r, "resourceNames"),
                strings(r, "verbs"),
            )
        })
        .collect()
}

/// Every YAML document under deploy/ (base, overlays, components).
fn every_deploy_document() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    all_yaml_files(&deploy_dir(), &mut files);
    assert!(
        files.len() > 10,
        "found only {} YAML files under deploy/",
        files.len()
    );
    files
        .into_iter()
        .flat_map(|f| documents(&f).into_iter().map(move |d| (f.clone(), d)))
        .collect()
}

#[test]
fn the_namespaced_role_grants_exactly_its_lease_and_its_status_config_map() {
    let role = rbac_object("rbac-namespaced.yaml", "Role");
    assert_eq!(
        rules_of(&role),
        [
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["vmss-capacity-controller"],
                &["get", "update"]
            ),
            rule(&["coordination.k8s.io"], &["leases"], &[], &["create"]),
            rule(
                &[""],
                &["configmaps"],
                &[
                    "vmss-capacity-controller-status",
                    "cluster-autoscaler-status",
                    "vmss-capacity-controller-ca-status"
                ],
                &["get", "update"]
            ),
            rule(&[""], &["configmaps"], &[], &["create"]),
        ]
    );
}

#[test]
fn the_cluster_role_grants_exactly_reads_a_node_patch_evictions_events_and_provisioning_request_and_capacity_buffer_status(
) {
    let role = rbac_object("rbac-cluster.yaml", "ClusterRole");
    assert!(
        role.get("aggregationRule").is_none(),
        "an aggregated role grants whatever is aggregated into it"
    );
    let read = ["get", "list", "watch"];
    assert_eq!(
        rules_of(&role),
        [
            rule(&[""], &["nodes"], &[], &["get", "list", "watch", "patch"]),
            rule(&[""], &["pods"], &[], &read),
            rule(&[""], &["pods/eviction"], &[], &["create"]),
            rule(&["policy"], &["poddisruptionbudgets"], &[], &read),
            rule(&["apps"], &["daemonsets"], &[], &read),
            rule(
                &[""],
                &["persistentvolumeclaims", "persistentvolumes"],
                &[],
                &read
            ),
            rule(
                &["storage.k8s.io"],
                &["storageclasses", "csinodes"],
                &[],
                &read
            ),
            rule(&[""], &["namespaces"], &[], &read),
            rule(
                &["autoscaling.x-k8s.io"],
                &["provisioningrequests"],
                &[],
                &read
            ),
            rule(
                &["autoscaling.x-k8s.io"],
                &["provisioningrequests/status"],
                &[],
                &["update"]
            ),
            rule(&[""], &["podtemplates"], &[], &read),
            rule(&["autoscaling.x-k8s.io"], &["capacitybuffers"], &[], &read),
            rule(
                &["autoscaling.x-k8s.io"],
                &["capacitybuffers/status"],
                &[],
                &["update"]
            ),
            rule(
                &["apps"],
                &["deployments", "replicasets", "statefulsets"],
                &[],
                &read
            ),
            rule(&["batch"], &["jobs"], &[], &read),
            rule(&[""], &["resourcequotas"], &[], &read),
            rule(&["events.k8s.io"], &["events"], &[], &["create", "patch"]),
        ]
    );
}

#[test]
fn no_rbac_rule_anywhere_uses_a_wildcard_escalates_or_touches_secrets() {
    let mut roles = 0;
    for (f, doc) in every_deploy_document() {
        if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
            continue;
        }
        roles += 1;
        for (groups, resources, names, verbs) in rules_of(&doc) {
            for x in groups.iter().chain(&resources).chain(&names).chain(&verbs) {
                assert!(!x.contains('*'), "{}: wildcard {x:?}", f.display());
            }
            assert!(
                !resources.iter().any(|r| r.starts_with("secrets")),
                "{}: Secrets are never granted",
                f.display()
            );
            for v in [
                "escalate",
                "bind",
                "impersonate",
                "delete",
                "deletecollection",
            ] {
                assert!(
                    !verbs.iter().any(|x| x == v),
                    "{}: verb {v} is not needed",
                    f.display()
                );
            }
        }
    }
    assert_eq!(roles, 2, "one Role and one ClusterRole under deploy/");
}

#[test]
fn both_bindings_bind_their_own_role_to_the_controllers_service_account() {
    let sa = only_document(&deploy_dir().join("base/serviceaccount.yaml"));
    let sa_name = at(&sa, &["metadata", "name"]);
    for (file, binding, role) in [
        ("rbac-namespaced.yaml", "RoleBinding", "Role"),
        ("rbac-cluster.yaml", "ClusterRoleBinding", "ClusterRole"),
    ] {
        let b = rbac_object(file, binding);
        let r = rbac_object(file, role);
        assert_eq!(
            at(&b, &["roleRef", "apiGroup"]).as_str(),
            Some("rbac.authorization.k8s.io")
        );
        assert_eq!(at(&b, &["roleRef", "kind"]).as_str(), Some(role));
        assert_eq!(at(&b, &["roleRef", "name"]), at(&r, &["metadata", "name"]));
        let subjects = at(&b, &["subjects"]).as_sequence().expect("subjects list");
        assert_eq!(subjects.len(), 1, "{binding}: one subject");
        assert_eq!(subjects[0]["kind"].as_str(), Some("ServiceAccount"));
        assert_eq!(&subjects[0]["name"], sa_name);
        assert!(
            subjects[0].get("namespace").is_none(),
            "{binding}: the subject's namespace is left to kustomize's `namespace:`, so an \
             overlay that moves the controller moves the subject too"
        );
    }
    let kustomization = only_document(&deploy_dir().join("base/kustomization.yaml"));
    let resources = strings(&kustomization, "resources");
    for f in [
        "serviceaccount.yaml",
        "rbac-namespaced.yaml",
        "rbac-cluster.yaml",
    ] {
        assert!(resources.iter().any(|r| r == f), "{f} is in the base");
    }
}

#[test]
fn every_config_joins_the_cluster_with_leader_election_on_the_names_the_role_allows() {
    let role = rules_of(&rbac_object("rbac-namespaced.yaml", "Role"));
    let allowed = |resource: &str, name: &str| {
        role.iter().any(|(_, resources, names, verbs)| {
            resources.iter().any(|r| r == resource)
                && names.iter().any(|n| n == name)
                && verbs.iter().any(|v| v == "update")
        })
    };
    let mut configs = 0;
    for (f, doc) in every_deploy_document() {
        if f.file_name().and_then(|n| n.to_str()) != Some("config.yaml") {
            continue;
        }
        configs += 1;
        let k = at(&doc, &["kubernetes"]);
        assert_eq!(k["enabled"], Value::Bool(true), "{}", f.display());
        assert!(
            k.get("namespace").is_none(),
            "{}: namespace is left to POD_NAMESPACE",
            f.display()
        );
        let le = at(k, &["leaderElection"]);
        assert_ne!(
            le.get("enabled"),
            Some(&Value::Bool(false)),
            "{}",
            f.display()
        );
        let lease = le["leaseName"]
            .as_str()
            .unwrap_or("vmss-capacity-controller");
        let status = k["statusConfigMap"]
            .as_str()
            .unwrap_or("vmss-capacity-controller-status");
        assert!(allowed("leases", lease), "{}: Lease {lease}", f.display());
        assert!(
            allowed("configmaps", status),
            "{}: ConfigMap {status}",
            f.display()
        );
        let ca_status = k["clusterAutoscalerStatusConfigMap"]
            .as_str()
            .unwrap_or("cluster-autoscaler-status");
        assert!(
            ca_status.is_empty() || allowed("configmaps", ca_status),
            "{}: ConfigMap {ca_status}",
            f.display()
        );
        // Our own name for that layout, when another autoscaler owns the ConfigMap.
        assert!(
            ca_status.is_empty() || allowed("configmaps", "vmss-capacity-controller-ca-status"),
            "{}: ConfigMap vmss-capacity-controller-ca-status",
            f.display()
        );
    }
    assert_eq!(configs, 4, "the base's config and one per overlay");
}

#[test]
fn etag_mode_is_switched_on_explicitly() {
    let c = controller_container(&deployment());
    let env = at(&c, &["env"]).as_sequence().expect("env list");
    assert!(env
        .iter()
        .any(|e| e["name"].as_str() == Some("AZURE_ENABLE_VMSS_ETAG")
            && e["value"].as_str() == Some("true")));
    assert!(
        env.iter()
            .all(|e| e["name"].as_str() != Some("ARM_CLIENT_SECRET")),
        "secrets never as plain env in the base"
    );
}
