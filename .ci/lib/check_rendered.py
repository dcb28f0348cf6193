"""Structural and cross-object checks of a rendered deploy/ overlay (used by validate-manifests.sh).

Usage:
  check_rendered.py RENDERED.yaml CORE_OUT.yaml RULES_OUT.yaml
      Writes the core (non Prometheus-Operator) objects to CORE_OUT for kubernetes-validate and
      the PrometheusRule's spec.groups to RULES_OUT for promtool; checks everything else here.
  check_rendered.py --dashboard DASHBOARD.json [ROOT]
      Every query's metrics must be registered in ROOT/src/metrics.rs.

Prints a one-line summary on success; prints every problem and exits 1 otherwise.
"""
import json
import re
import sys

import yaml

# ARCHITECTURE.md section 7 (plus build_info): the only metric names manifests may query.
CONTRACT_METRICS = {
    "reconcile_total", "reconcile_duration_seconds", "arm_requests_total",
    "arm_request_duration_seconds", "capacity_writes_total", "etag_conflicts_total",
    "cache_invalidations_total", "foreign_writes_total", "scale_set_capacity",
    "scale_set_desired_capacity", "scale_set_min_size", "scale_set_max_size",
    "cache_age_seconds", "arm_ratelimit_remaining", "throttle_wait_seconds_total",
    "last_successful_reconcile_timestamp_seconds", "credential_errors_total", "build_info",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Every metric the controller registers (src/metrics.rs), for the dashboard: it may also chart
# the pod-driven metrics of ARCHITECTURE.md sections 8-10 and round 3.
REGISTERED_RE = re.compile(
    r'\b(?:counter|int_gauge|gauge_vec|float_counter|gauge|histogram)\(\s*&registry,\s*"([a-z_]+)"'
)
NAMESPACE = "vmss-capacity-controller"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
AUTH_METHODS = {"workloadIdentity", "managedIdentity", "clientSecret", "azureCli"}
SEVERITIES = {"critical", "warning", "info"}

problems = []


def problem(msg):
    problems.append(msg)


def metric_names(expr):
    return set(re.findall(r"\bvmss_capacity_[a-z_]+", expr))


def check_metric(name, where, known=CONTRACT_METRICS):
    base = name[len("vmss_capacity_"):]
    for suffix in HISTOGRAM_SUFFIXES:
        if base.endswith(suffix) and base[: -len(suffix)] in known:
            return
    if base not in known:
        what = "the observability contract" if known is CONTRACT_METRICS else "src/metrics.rs"
        problem(f"{where}: metric {name} is not in {what}")


def registered_metrics(root):
    names = set(REGISTERED_RE.findall(open(f"{root}/src/metrics.rs").read()))
    if len(names) < len(CONTRACT_METRICS):
        problem(f"src/metrics.rs: only {len(names)} metric registrations found; the pattern is stale")
    return names


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def parse_duration(s):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", str(s))
    if not m:
        return None
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def check_rendered(path, core_out, rules_out, target):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        if d["kind"] in CLUSTER_SCOPED:
            if "namespace" in d["metadata"]:
                problem(f"{d['kind']}/{d['metadata']['name']}: cluster-scoped, but has a namespace")
        elif d["metadata"].get("namespace") != NAMESPACE:
            problem(f"{d['kind']}/{d['metadata']['name']}: namespace is not {NAMESPACE}")
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    with open(core_out, "w") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)

    (dep,) = by_kind.get("Deployment", [None])
    (svc,) = by_kind.get("Service", [None])
    (sa,) = by_kind.get("ServiceAccount", [None])
    if not (dep and svc and sa):
        problem("expected exactly one Deployment, Service and ServiceAccount")
        return
    pod = dep["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    (ctr,) = pod["spec"]["containers"]
    ctr_ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    svc_ports = {p["name"] for p in svc["spec"]["ports"]}

    if not matches(svc["spec"]["selector"], pod_labels):
        problem("Service selector does not match the pod labels")
    if pod["spec"].get("serviceAccountName") != sa["metadata"]["name"]:
        problem("pod does not use the package's ServiceAccount")
    if sa.get("automountServiceAccountToken") is not False:
        problem("ServiceAccount must set automountServiceAccountToken: false")

    check_rbac(by_kind, sa)

    # The Kubernetes API token: mounted explicitly (automount is off) where kube-rs looks.
    api_token_volumes = {
        v["name"] for v in pod["spec"].get("volumes", [])
        if any("serviceAccountToken" in src for src in v.get("projected", {}).get("sources", []))
    }
    if not any(m["mountPath"] == SA_TOKEN_DIR and m["name"] in api_token_volumes
               for m in ctr.get("volumeMounts", [])):
        problem(f"no projected serviceAccountToken volume mounted at {SA_TOKEN_DIR}")
    env_fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                  for e in ctr.get("env", [])}
    for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        if env_fields.get(name) != field:
            problem(f"env {name} must come from the downward API ({field})")

    # Volumes refer to objects that exist in the rendering (hash-suffixed names resolved).
    cm_names = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    secret_names = {d["metadata"]["name"] for d in by_kind.get("Secret", [])}
    mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
    config_cm = None
    secret_mounts = []
    for v in pod["spec"].get("volumes", []):
        if "configMap" in v:
            config_cm = cm_names.get(v["configMap"]["name"])
            if config_cm is None:
                problem(f"volume {v['name']}: ConfigMap {v['configMap']['name']} not rendered")
        if "secret" in v:
            if v["secret"]["secretName"] not in secret_names:
                problem(f"volume {v['name']}: Secret {v['secret']['secretName']} not rendered")
            for item in v["secret"].get("items", []):
                secret_mounts.append(f"{mounts.get(v['name'])}/{item['path']}")

    # The daemon's config, as the pod will read it.
    if config_cm is not None:
        cfg = yaml.safe_load(config_cm["data"]["config.yaml"])
        az = cfg.get("azure", {})
        for key in ("resourceManagerEndpoint", "authorityHost", "tenantId", "subscriptionId", "resourceGroup"):
            if not az.get(key):
                problem(f"config: azure.{key} missing")
        method = az.get("auth", {}).get("method")
        if method not in AUTH_METHODS:
            problem(f"config: azure.auth.method {method!r} not one of {sorted(AUTH_METHODS)}")
        listen = str(cfg.get("metricsListen", ""))
        if not listen.startswith("0.0.0.0:") or int(listen.rsplit(":", 1)[1]) != ctr_ports.get("metrics"):
            problem(f"config: metricsListen {listen!r} must be 0.0.0.0:<containerPort 'metrics'>")
        grace = parse_duration(cfg.get("shutdownGrace", "30s"))
        if grace is None or grace >= pod["spec"].get("terminationGracePeriodSeconds", 30):
            problem("config: shutdownGrace must be shorter than terminationGracePeriodSeconds")
        groups = cfg.get("nodeGroups") or []
        if not groups:
            problem("config: nodeGroups is empty")
        for g in groups:
            lo, hi, want = g.get("minSize"), g.get("maxSize"), g.get("desiredCapacity", g.get("minSize"))
            if not (isinstance(lo, int) and isinstance(hi, int) and lo <= want <= hi):
                problem(f"config: node group {g.get('name')}: need minSize <= desiredCapacity <= maxSize")
        kube = cfg.get("kubernetes") or {}
        le = kube.get("leaderElection") or {}
        if kube.get("enabled") is not True:
            problem("config: kubernetes.enabled must be true (leader election, status, Events)")
        if dep["spec"].get("replicas", 1) > 1 and le.get("enabled", True) is not True:
            problem("config: more than one replica needs kubernetes.leaderElection.enabled")
        if kube.get("namespace", NAMESPACE) != NAMESPACE:
            problem(f"config: kubernetes.namespace {kube.get('namespace')!r} is not the Role's {NAMESPACE}")
        own = {("coordination.k8s.io", "leases"): le.get("leaseName", "vmss-capacity-controller"),
               ("", "configmaps"): kube.get("statusConfigMap", "vmss-capacity-controller-status")}
        own_names = list(own.items())
        ca_status = kube.get("clusterAutoscalerStatusConfigMap", "cluster-autoscaler-status")
        if ca_status:
            # cluster-autoscaler's layout, and our own name for it when another autoscaler owns
            # that ConfigMap.
            own_names += [(("", "configmaps"), ca_status),
                          (("", "configmaps"), "vmss-capacity-controller-ca-status")]
        for (group, resource), name in own_names:
            if not role_allows(by_kind.get("Role", []), group, resource, name, {"get", "update"}):
                problem(f"config: the Role does not allow get and update of {resource}/{name}")
        is_overlay = target.startswith("overlay-") or target.startswith("component-")
        wi_label = pod_labels.get("azure.workload.identity/use") == "true"
        wi_annot = "azure.workload.identity/client-id" in sa["metadata"].get("annotations", {})
        if method == "workloadIdentity" and is_overlay and not (wi_label and wi_annot):
            problem("workloadIdentity needs the pod label azure.workload.identity/use and the SA client-id annotation")
        if method != "workloadIdentity" and (wi_label or wi_annot):
            problem(f"{method}: workload-identity label/annotation present but not used")
        if method == "clientSecret":
            f = az["auth"].get("clientSecretFile")
            if f not in secret_mounts:
                problem(f"clientSecret: clientSecretFile {f!r} is not a mounted Secret item {secret_mounts}")
            if any(e.get("name") == "ARM_CLIENT_SECRET" for e in ctr.get("env", [])):
                problem("clientSecret: the secret must come from a file, not ARM_CLIENT_SECRET")

    # Prometheus Operator objects.
    n_rules = 0
    for sm in by_kind.get("ServiceMonitor", []):
        if not matches(sm["spec"]["selector"].get("matchLabels"), svc["metadata"].get("labels", {})):
            problem("ServiceMonitor selector does not match the Service labels")
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in svc_ports:
                problem(f"ServiceMonitor port {ep.get('port')!r} is not a Service port {svc_ports}")
    for pm in by_kind.get("PodMonitor", []):
        if not matches(pm["spec"]["selector"].get("matchLabels"), pod_labels):
            problem("PodMonitor selector does not match the pod labels")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            if ep.get("port") not in ctr_ports:
                problem(f"PodMonitor port {ep.get('port')!r} is not a container port {set(ctr_ports)}")
    if by_kind.get("ServiceMonitor") and by_kind.get("PodMonitor"):
        problem("both a ServiceMonitor and a PodMonitor: every series would be scraped twice")
    for pr in by_kind.get("PrometheusRule", []):
        groups = pr["spec"].get("groups") or []
        if not groups:
            problem("PrometheusRule has no groups")
        for g in groups:
            for r in g.get("rules", []):
                n_rules += 1
                name = r.get("alert") or r.get("record")
                if "alert" in r:
                    if r.get("labels", {}).get("severity") not in SEVERITIES:
                        problem(f"alert {name}: severity label must be one of {sorted(SEVERITIES)}")
                    for a in ("summary", "description", "runbook"):
                        if not r.get("annotations", {}).get(a):
                            problem(f"alert {name}: annotation {a} missing")
                for m in metric_names(r.get("expr", "")):
                    check_metric(m, f"alert {name}")
        with open(rules_out, "w") as f:
            yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    kinds = ",".join(sorted(by_kind))
    return f"{len(docs)} objects ({kinds}), {n_rules} rules"


def role_allows(roles, group, resource, name, verbs):
    """Whether the Roles together grant every verb of `verbs` on `resource` named `name`."""
    granted = set()
    for role in roles:
        for r in role.get("rules", []):
            if group in r.get("apiGroups", []) and resource in r.get("resources", []) \
                    and (not r.get("resourceNames") or name in r["resourceNames"]):
                granted |= set(r.get("verbs", []))
    return verbs <= granted


def check_rbac(by_kind, sa):
    """No wildcard, no Secrets; every binding points at a rendered role and at the package's SA."""
    roles = {("Role", d["metadata"]["name"]) for d in by_kind.get("Role", [])}
    roles |= {("ClusterRole", d["metadata"]["name"]) for d in by_kind.get("ClusterRole", [])}
    if roles != {("Role", "vmss-capacity-controller"), ("ClusterRole", "vmss-capacity-controller")}:
        problem(f"expected one Role and one ClusterRole, found {sorted(roles)}")
    for kind in ("Role", "ClusterRole"):
        for d in by_kind.get(kind, []):
            if d.get("aggregationRule"):
                problem(f"{kind}/{d['metadata']['name']}: aggregationRule grants whatever is aggregated")
            for r in d.get("rules", []):
                for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                    if any("*" in x for x in r.get(key, [])):
                        problem(f"{kind}/{d['metadata']['name']}: wildcard in {key}: {r}")
                if "nonResourceURLs" in r:
                    problem(f"{kind}/{d['metadata']['name']}: nonResourceURLs are not needed: {r}")
                if "secrets" in r.get("resources", []):
                    problem(f"{kind}/{d['metadata']['name']}: grants access to Secrets: {r}")
                if {"escalate", "bind", "impersonate"} & set(r.get("verbs", [])):
                    problem(f"{kind}/{d['metadata']['name']}: privilege-escalation verb: {r}")
    bindings = by_kind.get("RoleBinding", []) + by_kind.get("ClusterRoleBinding", [])
    if len(bindings) != 2:
        problem(f"expected one RoleBinding and one ClusterRoleBinding, found {len(bindings)}")
    for b in bindings:
        ref = b["roleRef"]
        if (ref["kind"], ref["name"]) not in roles:
            problem(f"{b['kind']}/{b['metadata']['name']}: roleRef {ref['kind']}/{ref['name']} not rendered")
        if b["kind"] == "RoleBinding" and ref["kind"] != "Role":
            problem(f"RoleBinding/{b['metadata']['name']}: must bind the namespaced Role")
        want = [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
        if b.get("subjects") != want:
            problem(f"{b['kind']}/{b['metadata']['name']}: subjects {b.get('subjects')} != {want}")


def check_dashboard(path, root):
    dash = json.load(open(path))
    known = registered_metrics(root)
    panels = []
    stack = list(dash.get("panels", []))
    while stack:
        p = stack.pop()
        stack.extend(p.get("panels", []))
        if p.get("type") != "row":
            panels.append(p)
    n_queries = 0
    for p in panels:
        for t in p.get("targets", []):
            n_queries += 1
            for m in metric_names(t.get("expr", "")):
                check_metric(m, f"panel {p.get('title')!r}", known)
            if not t.get("expr"):
                problem(f"panel {p.get('title')!r}: target without expr")
    if not any(v.get("type") == "datasource" for v in dash.get("templating", {}).get("list", [])):
        problem("dashboard: no datasource template variable (hard-coded datasource)")
    if len(panels) < 6:
        problem(f"dashboard: only {len(panels)} panels")
    return f"{len(panels)} panels, {n_queries} queries"


if __name__ == "__main__":
    if sys.argv[1] == "--dashboard":
        # The dashboard lives in ROOT/deploy/grafana/.
        root = sys.argv[3] if len(sys.argv) > 3 else sys.argv[2].rsplit("/deploy/", 1)[0]
        summary = check_dashboard(sys.argv[2], root)
    else:
        target = sys.argv[4] if len(sys.argv) > 4 else sys.argv[1].rsplit("/", 1)[-1].rsplit(".", 1)[0]
        summary = check_rendered(sys.argv[1], sys.argv[2], sys.argv[3], target)
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(summary)
