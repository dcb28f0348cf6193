//! The security settings of `deploy/` cannot silently regress: these tests read the kustomize
//! base as plain YAML (no kubectl, no cluster) and assert the locked-down pod, the probes, the
//! resources, the grace period, the NetworkPolicy's egress and the absence of RBAC.

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
fn pod_uses_no_host_namespaces_and_no_api_token() {
    let dep = deployment();
    let spec = at(&dep, &["spec", "template", "spec"]);
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(
            spec.get(key),
            Some(&Value::Bool(true)),
            "{key} must not be set"
        );
    }
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    let sa = only_document(&deploy_dir().join("base/serviceaccount.yaml"));
    assert_eq!(sa["automountServiceAccountToken"], Value::Bool(false));
    let volumes = spec
        .get("volumes")
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default();
    assert!(
        volumes.iter().all(|v| v.get("hostPath").is_none()),
        "no hostPath volumes"
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
fn config_is_mounted_read_only_and_single_replica() {
    let dep = deployment();
    assert_eq!(at(&dep, &["spec", "replicas"]).as_u64(), Some(1));
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

#[test]
fn no_rbac_object_grants_anything() {
    let mut files = Vec::new();
    all_yaml_files(&deploy_dir(), &mut files);
    assert!(
        files.len() > 10,
        "found only {} YAML files under deploy/",
        files.len()
    );
    for f in &files {
        for doc in documents(f) {
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
            assert!(
                !matches!(
                    kind,
                    "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding"
                ),
                "{}: {kind} found; the controller needs no Kubernetes API access (see \
                 deploy/base/serviceaccount.yaml before adding one)",
                f.display()
            );
        }
    }
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
