#!/usr/bin/env bash
# Interop: kubectl and the official Python Kubernetes client against the emulator's Kubernetes
# side over TLS, through the kubeconfig `emulator --kubeconfig-out` writes.
#
# Usage: tests/interop/kube.sh [BIN]   (BIN defaults to target/debug/vmss-capacity-controller)
#   VENV: reuse this virtual environment. KUBECTL: use this kubectl.
#   ORACLE_KUBECONFIG: also run the Python checks against this (real) API server first, so the
#   checks themselves are known to describe real Kubernetes behaviour.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-target/debug/vmss-capacity-controller}"
[[ -x "$bin" ]] || { echo "kube.sh: no executable at $bin (build it first)" >&2; exit 2; }
tmp="$(mktemp -d)"
emu_pid=""
cleanup() {
  if [[ -n "$emu_pid" ]]; then kill "$emu_pid" 2>/dev/null || true; wait "$emu_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

venv="${VENV:-$tmp/venv}"
# shellcheck source=/dev/null
source "$root/.ci/lib/install-tools.sh"
ensure_venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements-kube.txt"
ensure_kubectl "$venv"

"$bin" emulator --listen 127.0.0.1:0 --tls --cert-out "$tmp/ca.pem" --kubeconfig-out "$tmp/kubeconfig" \
  >"$tmp/emulator.out" 2>"$tmp/emulator.err" &
emu_pid=$!
for _ in $(seq 1 100); do
  grep -q '^emulator listening on' "$tmp/emulator.out" 2>/dev/null && [[ -s "$tmp/kubeconfig" ]] && break
  kill -0 "$emu_pid" 2>/dev/null || { echo "kube.sh: emulator exited early:" >&2; cat "$tmp/emulator.err" >&2; exit 1; }
  sleep 0.1
done
export KUBECONFIG="$tmp/kubeconfig"
k() { "$KUBECTL" "$@"; }
ok() { echo "ok: $*"; }

k version >/dev/null 2>&1 || k version
ok "kubectl version (discovery of /version)"
k api-resources >"$tmp/api-resources"
for r in leases configmaps nodes pods poddisruptionbudgets daemonsets events namespaces; do
  grep -qw "$r" "$tmp/api-resources" || { echo "FAIL: kubectl api-resources lacks $r" >&2; exit 1; }
done
ok "kubectl api-resources lists every served type"
k create namespace kctl >/dev/null
k -n kctl create configmap status --from-literal=a=1 >/dev/null
rv=$(k -n kctl get configmap status -o jsonpath='{.metadata.resourceVersion}')
k -n kctl label configmap status owner=us >/dev/null
k -n kctl patch configmap status --type merge -p '{"data":{"b":"2"}}' >/dev/null
[[ "$(k -n kctl get configmap status -o jsonpath='{.data.b}/{.metadata.labels.owner}')" == "2/us" ]] \
  || { echo "FAIL: label + merge patch" >&2; exit 1; }
ok "kubectl label and patch --type merge"
k -n kctl get configmap status -o json \
  | python3 -c "import json,sys; o=json.load(sys.stdin); o['metadata']['resourceVersion']='$rv'; o['data']['c']='3'; print(json.dumps(o))" \
  >"$tmp/stale.json"
if k replace -f "$tmp/stale.json" 2>"$tmp/replace.err"; then
  echo "FAIL: kubectl replace with a stale resourceVersion succeeded" >&2; exit 1
fi
grep -q "Conflict\|the object has been modified" "$tmp/replace.err" \
  || { echo "FAIL: stale replace did not report a conflict:" >&2; cat "$tmp/replace.err" >&2; exit 1; }
ok "kubectl replace with a stale resourceVersion is refused with a conflict"
if k -n kctl create configmap status 2>"$tmp/create.err"; then
  echo "FAIL: creating an existing ConfigMap succeeded" >&2; exit 1
fi
grep -q "AlreadyExists\|already exists" "$tmp/create.err" || { cat "$tmp/create.err" >&2; exit 1; }
ok "kubectl create of an existing name is AlreadyExists"
cat >"$tmp/lease.yaml" <<YAML
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: vmss-capacity-controller, namespace: kctl}
spec: {holderIdentity: replica-a, leaseDurationSeconds: 15}
YAML
k apply -f "$tmp/lease.yaml" >/dev/null
[[ "$(k -n kctl get lease vmss-capacity-controller -o jsonpath='{.spec.holderIdentity}')" == "replica-a" ]] \
  || { echo "FAIL: kubectl apply of a Lease" >&2; exit 1; }
ok "kubectl apply (client-side) creates a Lease"
k delete namespace kctl >/dev/null
ok "kubectl delete namespace"

if [[ -n "${ORACLE_KUBECONFIG:-}" ]]; then
  echo "--- the same Python checks against the real API server ($ORACLE_KUBECONFIG)"
  KUBECONFIG="$ORACLE_KUBECONFIG" "$venv/bin/python" "$here/test_python_kubernetes.py"
  echo "--- and against the emulator"
fi
"$venv/bin/python" "$here/test_python_kubernetes.py"
echo "kube.sh: kubectl and the Python kubernetes client agree with the emulator"
