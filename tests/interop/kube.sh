#!/usr/bin/env bash
# Interop: kubectl and the official Python Kubernetes client against the emulator's Kubernetes
# side over TLS, through the kubeconfig `emulator --kubeconfig-out` writes.
#
# Usage: tests/interop/kube.sh [BIN]   (BIN defaults to target/debug/vmss-capacity-controller)
#   VENV: reuse this virtual environment. KUBECTL: use this kubectl.
#   ORACLE_KUBECONFIG: run the same kubectl and Python checks against this (real) API server
#   first, so the checks themselves are known to describe real Kubernetes behaviour. The real
#   server needs its kube-controller-manager (the PDB's status comes from it).
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
k() { "$KUBECTL" "$@"; }
fail() { echo "FAIL ($where): $*" >&2; exit 1; }
ok() { echo "ok ($where): $*"; }
# json_check EXPR: reads a JSON document on stdin, fails unless the Python expression over `o` holds.
json_check() { python3 -c "import json,sys; o=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; }

# The kubectl checks, run against the server of $KUBECONFIG ($where names it in the messages).
# Everything a server may already hold is named with a fresh suffix, so a long-running real server
# can be reused; what the real server's controllers add (kube-root-ca.crt in every namespace) is
# tolerated.
kubectl_checks() {
  local sfx ns node pv rv
  sfx="$(date +%s)-$RANDOM"
  ns="kctl-$sfx"
  node="kctl-node-$sfx"
  k version >/dev/null 2>&1 || k version
  ok "kubectl version (discovery of /version)"
  k api-resources >"$tmp/api-resources"
  for r in leases configmaps nodes pods poddisruptionbudgets daemonsets events namespaces; do
    grep -qw "$r" "$tmp/api-resources" || fail "kubectl api-resources lacks $r"
  done
  ok "kubectl api-resources lists every served type"
  k create namespace "$ns" >/dev/null
  k -n "$ns" create configmap status --from-literal=a=1 >/dev/null
  rv=$(k -n "$ns" get configmap status -o jsonpath='{.metadata.resourceVersion}')
  k -n "$ns" get configmap status -o json | json_check "o['kind']=='ConfigMap' and o['apiVersion']=='v1' \
    and o['metadata']['name']=='status' and o['metadata']['namespace']=='$ns' and o['metadata']['uid'] \
    and o['metadata']['creationTimestamp'] and o['metadata']['resourceVersion']=='$rv' and '$rv'.isdigit() \
    and o['data']=={'a':'1'}" || fail "kubectl get -o json of one ConfigMap"
  ok "kubectl get -o json: kind, apiVersion, name, namespace, uid, creationTimestamp, resourceVersion, data"
  k -n "$ns" create configmap other --from-literal=b=2 >/dev/null
  k -n "$ns" get configmaps -o json | json_check "o['kind']=='List' \
    and {'status','other'} <= {i['metadata']['name'] for i in o['items']} \
    and all(i['kind']=='ConfigMap' and i['apiVersion']=='v1' and i['metadata']['resourceVersion'].isdigit() for i in o['items'])" \
    || fail "kubectl get configmaps -o json (a list)"
  ok "kubectl get (list) -o json: every item typed, with its resourceVersion"
  k -n "$ns" label configmap status owner=us >/dev/null
  k -n "$ns" patch configmap status --type merge -p '{"data":{"b":"2"}}' >/dev/null
  [[ "$(k -n "$ns" get configmap status -o jsonpath='{.data.b}/{.metadata.labels.owner}')" == "2/us" ]] \
    || fail "label + merge patch"
  ok "kubectl label and patch --type merge"
  k -n "$ns" get configmap status -o json \
    | python3 -c "import json,sys; o=json.load(sys.stdin); o['metadata']['resourceVersion']='$rv'; o['data']['c']='3'; print(json.dumps(o))" \
    >"$tmp/stale.json"
  if k replace -f "$tmp/stale.json" 2>"$tmp/replace.err"; then
    fail "kubectl replace with a stale resourceVersion succeeded"
  fi
  grep -q "Conflict\|the object has been modified" "$tmp/replace.err" \
    || { cat "$tmp/replace.err" >&2; fail "stale replace did not report a conflict"; }
  [[ "$(k -n "$ns" get configmap status -o jsonpath='{.data.c}')" == "" ]] || fail "the refused replace changed the object"
  ok "kubectl replace with a stale resourceVersion is refused with a conflict, and changes nothing"
  if k -n "$ns" create configmap status 2>"$tmp/create.err"; then
    fail "creating an existing ConfigMap succeeded"
  fi
  grep -q "AlreadyExists\|already exists" "$tmp/create.err" || { cat "$tmp/create.err" >&2; fail "no AlreadyExists"; }
  ok "kubectl create of an existing name is AlreadyExists"

  # A watch sees a change: the first line is the object as listed (the watch then runs from the
  # list's resourceVersion, so no change can slip between), the second the patched object.
  k -n "$ns" create configmap watched --from-literal=v=1 >/dev/null
  : >"$tmp/watch.out"
  timeout 20 "$KUBECTL" -n "$ns" get configmap watched -w --request-timeout=15s \
    -o jsonpath='{.data.v}{"\n"}' >"$tmp/watch.out" 2>"$tmp/watch.err" &
  local wpid=$! i
  for i in $(seq 1 100); do [[ -s "$tmp/watch.out" ]] && break; sleep 0.1; done
  [[ "$(head -1 "$tmp/watch.out")" == "1" ]] || { cat "$tmp/watch.err" >&2; fail "kubectl get -w printed no initial object"; }
  k -n "$ns" patch configmap watched --type merge -p '{"data":{"v":"2"}}' >/dev/null
  for i in $(seq 1 100); do [[ "$(sed -n 2p "$tmp/watch.out")" == "2" ]] && break; sleep 0.1; done
  kill "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true
  [[ "$(sed -n 2p "$tmp/watch.out")" == "2" ]] || { cat "$tmp/watch.out" "$tmp/watch.err" >&2; fail "kubectl get -w did not see the change"; }
  ok "kubectl get -w sees a change made after it started"

  cat >"$tmp/lease.yaml" <<YAML
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: vmss-capacity-controller, namespace: $ns}
spec: {holderIdentity: replica-a, leaseDurationSeconds: 15}
YAML
  k apply -f "$tmp/lease.yaml" >/dev/null
  [[ "$(k -n "$ns" get lease vmss-capacity-controller -o jsonpath='{.spec.holderIdentity}')" == "replica-a" ]] \
    || fail "kubectl apply of a Lease"
  ok "kubectl apply (client-side) creates a Lease"

  # A drain's eviction refused by a PodDisruptionBudget. policy/v1 where served (the emulator,
  # 1.21+), else policy/v1beta1 (a 1.20 server), picked by discovery as kubectl drain picks.
  # (Into a file first: `grep -q` stops reading at the match, and with pipefail the writer's
  # SIGPIPE would fail the pipeline.)
  k api-versions >"$tmp/api-versions"
  if grep -qx 'policy/v1' "$tmp/api-versions"; then pv=policy/v1; else pv=policy/v1beta1; fi
  k create -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $node}
YAML
  k -n "$ns" create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec: {nodeName: $node, containers: [{name: c, image: registry.k8s.io/pause:3.9}]}
YAML
  k -n "$ns" patch pod web --subresource=status --type merge \
    -p '{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}' >/dev/null
  k -n "$ns" create -f - >/dev/null <<YAML
apiVersion: $pv
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
YAML
  # The budget's status (on a real server the controller-manager's disruption controller writes
  # it; without one the eviction would be refused only as "still being processed").
  local st=""
  for i in $(seq 1 300); do
    st="$(k -n "$ns" get pdb web -o jsonpath='{.status.currentHealthy}/{.status.desiredHealthy}/{.status.disruptionsAllowed}/{.status.expectedPods}')"
    [[ "$st" == "1/1/0/1" ]] && break
    sleep 0.1
  done
  [[ "$st" == "1/1/0/1" ]] || fail "the $pv PDB's status is '$st', not currentHealthy/desiredHealthy/disruptionsAllowed/expectedPods 1/1/0/1 (on a real server: is kube-controller-manager running?)"
  ok "a $pv PDB with minAvailable 1 over one Running+Ready pod reports 0 disruptions allowed"
  if k drain "$node" --ignore-daemonsets --force --timeout=5s >"$tmp/drain.out" 2>"$tmp/drain.err"; then
    fail "kubectl drain evicted a pod its PDB protects"
  fi
  grep -q "Cannot evict pod as it would violate the pod's disruption budget" "$tmp/drain.err" \
    || { cat "$tmp/drain.out" "$tmp/drain.err" >&2; fail "kubectl drain failed without the PDB's refusal"; }
  [[ "$(k get node "$node" -o jsonpath='{.spec.unschedulable}')" == "true" ]] || fail "kubectl drain did not cordon the node"
  [[ -z "$(k -n "$ns" get pod web -o jsonpath='{.metadata.deletionTimestamp}')" ]] || fail "the protected pod is being deleted"
  ok "kubectl drain cordons the node and its eviction is refused by the PDB; the pod stays"
  printf '{"apiVersion":"%s","kind":"Eviction","metadata":{"name":"web","namespace":"%s"}}' "$pv" "$ns" >"$tmp/eviction.json"
  if k create --raw "/api/v1/namespaces/$ns/pods/web/eviction" -f "$tmp/eviction.json" 2>"$tmp/evict.err" >/dev/null; then
    fail "a raw $pv Eviction of a protected pod succeeded"
  fi
  grep -q "TooManyRequests" "$tmp/evict.err" && grep -q "disruption budget" "$tmp/evict.err" \
    || { cat "$tmp/evict.err" >&2; fail "the raw eviction was not refused with 429 TooManyRequests"; }
  ok "a raw $pv Eviction (kubectl create --raw) is refused with 429 TooManyRequests"

  k -n "$ns" delete pod web --grace-period=0 --force >/dev/null 2>&1
  k delete node "$node" >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
  ok "kubectl delete (pod, node, namespace)"
}

if [[ -n "${ORACLE_KUBECONFIG:-}" ]]; then
  echo "--- kubectl and Python checks against the real API server ($ORACLE_KUBECONFIG) first"
  where="real API server" KUBECONFIG="$ORACLE_KUBECONFIG" kubectl_checks
  KUBECONFIG="$ORACLE_KUBECONFIG" "$venv/bin/python" "$here/test_python_kubernetes.py"
  echo "--- and the same against the emulator"
fi
export KUBECONFIG="$tmp/kubeconfig"
where="emulator" kubectl_checks
"$venv/bin/python" "$here/test_python_kubernetes.py"
echo "kube.sh: kubectl and the Python kubernetes client agree with the emulator"
