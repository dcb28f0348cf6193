#!/usr/bin/env bash
# Interop: Kubernetes objects as the Go API server serializes them. The newest official Python
# `kubernetes` client (unpinned: it validates every answer strictly) reads every kind the emulator
# serves, its simulated Nodes and Running pods included, and kubectl prints them
# (`get pods/nodes/deployments/events [-o wide]`, `describe pod` with the controller's Event).
#
# Usage: tests/interop/kube-shapes.sh [BIN]   (BIN defaults to target/debug/vmss-capacity-controller)
#   VENV: reuse this virtual environment (its `kubernetes` is upgraded to the newest).
#   KUBECTL: use this kubectl.
#   ORACLE_KUBECONFIG: run the same Python and kubectl checks against this (real) API server first
#   (it needs its kube-controller-manager: Deployments make pods there), and compare the emulator's
#   Table columns with the ones it answered.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-target/debug/vmss-capacity-controller}"
[[ -x "$bin" ]] || { echo "kube-shapes.sh: no executable at $bin (build it first)" >&2; exit 2; }
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
# Unpinned on purpose: the newest client is the strictest reader.
"$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade kubernetes
echo "python kubernetes client: $("$venv/bin/python" -c 'import kubernetes; print(kubernetes.__version__)')"
ensure_kubectl "$venv"

fail() { echo "FAIL ($where): $*" >&2; exit 1; }
ok() { echo "ok ($where): $*"; }
name_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]] or '')" "$tmp/names.json" "$1"; }
# The header line of a kubectl table, its columns separated by single spaces. (Into a file
# first: `head` stops reading early, and with pipefail kubectl's SIGPIPE would fail the script.)
header() {
  "$KUBECTL" "$@" >"$tmp/table" 2>"$tmp/table.err" || { cat "$tmp/table.err" >&2; fail "kubectl $*"; }
  head -1 "$tmp/table" | tr -s ' ' | sed 's/ $//'
}

# kubectl against the objects test_kube_shapes.py left on the server of $KUBECONFIG.
kubectl_checks() {
  local ns pod node got
  ns="$(name_of namespace)"; pod="$(name_of pod)"; node="$(name_of node)"
  got="$(header get pods -n "$ns")"
  [[ "$got" == "NAME READY STATUS RESTARTS AGE" ]] || fail "kubectl get pods prints '$got'"
  got="$(header get pods -n "$ns" -o wide)"
  [[ "$got" == "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES" ]] \
    || fail "kubectl get pods -o wide prints '$got'"
  got="$("$KUBECTL" get pod "$pod" -n "$ns" -o wide --no-headers 2>/dev/null | awk '{print $2, $3, $7}')"
  [[ "$got" == "1/1 Running $node" ]] || fail "the pod's row is '$got', not '1/1 Running $node'"
  ok "kubectl get pods [-o wide]: NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES; the pod 1/1 Running on $node"
  got="$(header get nodes -o wide)"
  [[ "$got" == "NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE KERNEL-VERSION CONTAINER-RUNTIME" ]] \
    || fail "kubectl get nodes -o wide prints '$got'"
  got="$("$KUBECTL" get node "$node" --no-headers 2>/dev/null | awk '{print $2}')"
  [[ "$got" == "Ready" ]] || fail "the node's STATUS is '$got'"
  ok "kubectl get nodes -o wide: NAME STATUS ROLES AGE VERSION INTERNAL-IP EXTERNAL-IP OS-IMAGE KERNEL-VERSION CONTAINER-RUNTIME; $node Ready"
  got="$(header get deployments -n "$ns" -o wide)"
  [[ "$got" == "NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR" ]] \
    || fail "kubectl get deployments -o wide prints '$got'"
  got="$("$KUBECTL" get deployment web -n "$ns" -o wide --no-headers 2>/dev/null | awk '{print $2, $3, $4, $6, $7, $8}')"
  [[ "$got" == "2/2 2 2 web nginx:1.25 app=web" ]] || fail "the Deployment's row is '$got'"
  ok "kubectl get deployments -o wide: NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR; web 2/2"
  got="$(header get events -n "$ns")"
  [[ "$got" == "LAST SEEN TYPE REASON OBJECT MESSAGE" ]] || fail "kubectl get events prints '$got'"
  got="$(header get events -n "$ns" -o wide)"
  [[ "$got" == "LAST SEEN TYPE REASON OBJECT SUBOBJECT SOURCE MESSAGE FIRST SEEN COUNT NAME" ]] \
    || fail "kubectl get events -o wide prints '$got'"
  "$KUBECTL" get events -n "$ns" --field-selector reason=TriggeredScaleUp --no-headers 2>/dev/null >"$tmp/events"
  grep -q "Normal *TriggeredScaleUp *pod/$pod *pod triggered scale-up" "$tmp/events" \
    || { cat "$tmp/events" >&2; fail "kubectl get events lacks the TriggeredScaleUp row"; }
  ok "kubectl get events [-o wide]: LAST SEEN TYPE REASON OBJECT MESSAGE (wide: SUBOBJECT SOURCE FIRST SEEN COUNT NAME); the controller's event"
  "$KUBECTL" describe pod "$pod" -n "$ns" >"$tmp/describe" 2>/dev/null
  sed -n '/^Events:/,$p' "$tmp/describe" | grep -q "Normal *TriggeredScaleUp .*pod triggered scale-up" \
    || { cat "$tmp/describe" >&2; fail "kubectl describe pod shows no TriggeredScaleUp under Events"; }
  ok "kubectl describe pod shows the controller's TriggeredScaleUp under Events"
}

if [[ -n "${ORACLE_KUBECONFIG:-}" ]]; then
  where="real API server"
  echo "--- Python and kubectl checks against the real API server ($ORACLE_KUBECONFIG) first"
  KUBECONFIG="$ORACLE_KUBECONFIG" ORACLE=1 TABLES="$tmp/tables.json" NAMES="$tmp/names.json" \
    "$venv/bin/python" "$here/test_kube_shapes.py"
  KUBECONFIG="$ORACLE_KUBECONFIG" kubectl_checks
  # What the checks made on the real server (the namespace takes its objects with it).
  KUBECONFIG="$ORACLE_KUBECONFIG" "$KUBECTL" delete namespace "$(name_of namespace)" --wait=false >/dev/null 2>&1 || true
  for what in "node/$(name_of made_node)" "csinode/$(name_of made_node)" "storageclass/$(name_of storage_class)" "pv/$(name_of pv)"; do
    KUBECONFIG="$ORACLE_KUBECONFIG" "$KUBECTL" delete "$what" --wait=false >/dev/null 2>&1 || true
  done
  echo "--- and the same against the emulator"
fi

"$bin" emulator --listen 127.0.0.1:0 --tls --cert-out "$tmp/ca.pem" --kubeconfig-out "$tmp/kubeconfig" \
  --simulate-cluster --boot-delay 1s --scale-set pool:Standard_D4s_v5:2 \
  >"$tmp/emulator.out" 2>"$tmp/emulator.err" &
emu_pid=$!
for _ in $(seq 1 100); do
  grep -q '^emulator listening on' "$tmp/emulator.out" 2>/dev/null && [[ -s "$tmp/kubeconfig" ]] && break
  kill -0 "$emu_pid" 2>/dev/null || { echo "kube-shapes.sh: emulator exited early:" >&2; cat "$tmp/emulator.err" >&2; exit 1; }
  sleep 0.1
done
export KUBECONFIG="$tmp/kubeconfig"
where="emulator"
TABLES="$tmp/tables.json" NAMES="$tmp/names.json" "$venv/bin/python" "$here/test_kube_shapes.py"
kubectl_checks
echo "kube-shapes.sh: the newest Python kubernetes client and kubectl read every kind the emulator serves"
