#!/usr/bin/env bash
# Validates everything under deploy/ without a cluster:
#   1. `kubectl kustomize` renders the base, every overlay, and every component (on top of the
#      workload-identity overlay);
#   2. kubernetes-validate (PyPI, pinned) checks the rendered core objects against the
#      Kubernetes OpenAPI schemas, strictly (unknown fields are errors), for the oldest and the
#      newest Kubernetes versions we claim;
#   3. the Prometheus Operator objects (ServiceMonitor, PodMonitor, PrometheusRule), which have
#      no schema there, are checked structurally, and cross-checked against the Service and pod
#      (selectors match, named ports exist); the RBAC is checked (no wildcard, no Secrets,
#      bindings point at the package's ServiceAccount, the Role covers the config's Lease and
#      status ConfigMap names) and the pod mounts a projected API token;
#   4. `promtool check rules` on the PrometheusRule's spec.groups, extracted to a rules file;
#   5. the generated config.yaml of each overlay parses and has the contract's keys, and the
#      Grafana dashboard is valid JSON whose queries use only contract metric names;
#   6. self-tests: a deliberately broken object, a ClusterRole with a wildcard and a broken rule
#      MUST fail, so a validator that silently passes everything is caught.
# Optional: VMSS_BIN=path/to/vmss-capacity-controller also runs `check-config` on every
# overlay's rendered config (skipped when unset, or when the binary lacks the subcommand).
# Needs: bash, python3, network access to PyPI and Debian (first run only). Root for apt-get.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/install-tools.sh
. "$ROOT/.ci/lib/install-tools.sh"

KV_PIN="kubernetes-validate==1.37.0"
PYYAML_PIN="PyYAML==6.0.2"
# Oldest and newest Kubernetes versions the manifests are checked against. AKS' oldest supported
# minor moves forward; 1.30 is a conservative floor (PDB unhealthyPodEvictionPolicy needs 1.27+).
K8S_VERSIONS="${K8S_VERSIONS:-1.30.0 1.37.0}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/validate-manifests.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
VENV="${VALIDATE_VENV:-$WORK/venv}"
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*" >&2; }

ensure_kubectl "$VENV" || exit 1
ensure_venv "$VENV" || exit 1
echo "python: installing $KV_PIN $PYYAML_PIN into $VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$KV_PIN" "$PYYAML_PIN" \
  || { echo "FAIL: pip install $KV_PIN" >&2; exit 1; }
ensure_prometheus || exit 1
PY="$VENV/bin/python"

# --- 1. render -------------------------------------------------------------------------------
declare -a TARGETS=()
TARGETS+=("base=$ROOT/deploy/base")
for o in "$ROOT"/deploy/overlays/*/; do
  o="${o%/}"; TARGETS+=("overlay-$(basename "$o")=$o")
done
for c in "$ROOT"/deploy/components/*/; do
  c="${c%/}"; name="component-$(basename "$c")"
  mkdir -p "$WORK/$name"
  # kustomize wants relative paths to other kustomizations.
  rel() { python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$1" "$WORK/$name"; }
  cat > "$WORK/$name/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
# As in a user's overlay: its namespace also applies to the component's objects.
namespace: vmss-capacity-controller
resources:
  - $(rel "$ROOT/deploy/overlays/workload-identity")
components:
  - $(rel "$c")
YAML
  TARGETS+=("$name=$WORK/$name")
done

mkdir -p "$WORK/rendered"
for t in "${TARGETS[@]}"; do
  name="${t%%=*}"; dir="${t#*=}"
  if "$KUBECTL" kustomize "$dir" > "$WORK/rendered/$name.yaml" 2> "$WORK/rendered/$name.err"; then
    pass "render $name ($(grep -c '^kind:' "$WORK/rendered/$name.yaml") objects)"
  else
    fail "render $name: $(cat "$WORK/rendered/$name.err")"
    rm -f "$WORK/rendered/$name.yaml"
  fi
done

# --- 2.+3.+5. schema, structure, cross-checks --------------------------------------------------
for f in "$WORK"/rendered/*.yaml; do
  name="$(basename "$f" .yaml)"
  # Split core objects (schema-validated) from Prometheus Operator objects (structural checks).
  if ! out="$("$PY" "$ROOT/.ci/lib/check_rendered.py" "$f" "$WORK/rendered/$name.core.yaml" "$WORK/rules-$name.yaml" 2>&1)"; then
    fail "structure $name:"$'\n'"$out"
  else
    pass "structure $name: $out"
  fi
  for v in $K8S_VERSIONS; do
    if out="$("$VENV/bin/kubernetes-validate" -k "$v" --strict --quiet "$WORK/rendered/$name.core.yaml" 2>&1)"; then
      pass "kubernetes-validate --strict $name against $v"
    else
      fail "kubernetes-validate --strict $name against $v:"$'\n'"$out"
    fi
  done
done

# --- 4. promtool check rules -----------------------------------------------------------------
RULES="$WORK/rules-overlay-workload-identity.yaml"
if out="$(promtool check rules "$RULES" 2>&1)"; then
  pass "promtool check rules ($(echo "$out" | grep -o 'SUCCESS: [0-9]* rules found' || echo "$out" | tail -1))"
else
  fail "promtool check rules:"$'\n'"$out"
fi
if [ -f "$ROOT/deploy/prometheus/alerts.test.yaml" ]; then
  cp "$ROOT/deploy/prometheus/alerts.test.yaml" "$WORK/alerts.test.yaml"
  cp "$RULES" "$WORK/alerts.rules.yaml"
  if out="$(cd "$WORK" && promtool test rules alerts.test.yaml 2>&1)"; then
    pass "promtool test rules (alert unit tests)"
  else
    fail "promtool test rules:"$'\n'"$out"
  fi
fi

# Grafana dashboard: valid JSON, every query uses contract metric names only.
if out="$("$PY" "$ROOT/.ci/lib/check_rendered.py" --dashboard "$ROOT/deploy/grafana/vmss-capacity-controller.json" 2>&1)"; then
  pass "grafana dashboard: $out"
else
  fail "grafana dashboard:"$'\n'"$out"
fi

# --- 6. self-tests: the validators must be able to fail ------------------------------------------
cat > "$WORK/broken.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          image: x
          securityContext: {readOnlyRootFileSystem: true}   # wrong case: must be rejected
YAML
if "$VENV/bin/kubernetes-validate" -k 1.37.0 --strict --quiet "$WORK/broken.yaml" >/dev/null 2>&1; then
  fail "self-test: kubernetes-validate --strict accepted an unknown field"
else
  pass "self-test: kubernetes-validate --strict rejects an unknown field"
fi
# A wildcard verb added to the rendered ClusterRole must be caught by the RBAC checks.
if [ -f "$WORK/rendered/overlay-workload-identity.yaml" ]; then
  "$PY" - "$WORK/rendered/overlay-workload-identity.yaml" "$WORK/broken-rbac.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "ClusterRole":
        d["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]})
yaml.safe_dump_all(docs, open(sys.argv[2], "w"), sort_keys=False)
PY
  if "$PY" "$ROOT/.ci/lib/check_rendered.py" "$WORK/broken-rbac.yaml" "$WORK/broken-rbac.core.yaml" \
       "$WORK/broken-rbac.rules.yaml" overlay-broken >/dev/null 2>&1; then
    fail "self-test: the RBAC check accepted a wildcard verb on Secrets"
  else
    pass "self-test: the RBAC check rejects a wildcard verb on Secrets"
  fi
fi
printf 'groups:\n- name: g\n  rules:\n  - alert: A\n    expr: rate(x[5m]\n' > "$WORK/broken-rules.yaml"
if promtool check rules "$WORK/broken-rules.yaml" >/dev/null 2>&1; then
  fail "self-test: promtool accepted a broken expression"
else
  pass "self-test: promtool rejects a broken expression"
fi

# --- optional: the daemon's own config check -------------------------------------------------------
if [ -n "${VMSS_BIN:-}" ]; then
  if "$VMSS_BIN" check-config --help >/dev/null 2>&1; then
    for f in "$WORK"/rendered/overlay-*.yaml; do
      case "$f" in *.core.yaml) continue ;; esac   # the schema-validation copy of the same overlay
      name="$(basename "$f" .yaml)"
      "$PY" - "$f" "$WORK/$name.config.yaml" <<'PY'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "ConfigMap" and "config.yaml" in d.get("data", {}):
        open(sys.argv[2], "w").write(d["data"]["config.yaml"])
PY
      # Files the pod gets from its Secret exist only in the pod: point them at a stand-in, so
      # check-config judges the configuration, not this machine's filesystem.
      printf 'stand-in-secret\n' > "$WORK/client-secret"
      sed -i "s#/var/run/secrets/azure/client-secret#$WORK/client-secret#" "$WORK/$name.config.yaml"
      # The env a pod would have: what the webhook / overlay injects.
      if out="$(env AZURE_CLIENT_ID=00000000-0000-0000-0000-000000000000 \
                    AZURE_FEDERATED_TOKEN_FILE=/var/run/secrets/azure/tokens/azure-identity-token \
                    "$VMSS_BIN" check-config --config "$WORK/$name.config.yaml" 2>&1)"; then
        pass "check-config $name"
      else
        fail "check-config $name:"$'\n'"$out"
      fi
    done
  else
    echo "skip check-config: $VMSS_BIN has no check-config subcommand"
  fi
fi

echo
echo "validate-manifests: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
