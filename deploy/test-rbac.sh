#!/usr/bin/env bash
# Checks the controller's Kubernetes RBAC against a real API server.
#
# Renders deploy/base with kustomize under throw-away names (a namespace and a name suffix of its
# own, through an overlay, the way an operator's overlay would rename it), applies only the
# Namespace, ServiceAccount, Role, ClusterRole and the two bindings (and the CRDs, which `can-i`
# needs to know the resources), and then, as that
# ServiceAccount (impersonation, `--as=system:serviceaccount:<ns>:<sa>`):
#   1. `kubectl auth can-i` says yes to every verb the controller needs and no to what it must
#      not have (Secrets, deleting nodes or pods, Leases or ConfigMaps of other names or in other
#      namespaces, core/v1 Events, wildcards);
#   2. real requests go through: the Lease and the status ConfigMap are created, read and
#      updated with their resourceVersion (a stale one is refused with 409, not 403), an
#      events.k8s.io/v1 Event is created and patched, Nodes/Pods/PDBs/DaemonSets are listed and
#      watched, a Node is patched, an eviction is authorised (404 for a pod that does not exist,
#      not 403); and Secrets, a Node delete and another Lease are refused with 403;
#   3. with VMSS_BIN=path/to/vmss-capacity-controller, the daemon itself runs with a token of that
#      ServiceAccount (and the emulator as Azure): it must win the Lease, write capacity, release
#      the Lease on SIGTERM, and log no 403.
# Everything it created is deleted on exit. The rules themselves are applied verbatim.
#
# Needs: curl, python3 with PyYAML (PYTHON, default `python3`), kubectl with kustomize v4+
# (KUBECTL, default `kubectl`), and KUBECONFIG pointing at a cluster where the caller may create
# namespaces, RBAC objects and Nodes, and impersonate (cluster-admin). CI runs it against ../shared/kube-apiserver (Kubernetes 1.20: policy/v1 is
# missing there, so PDBs are listed through policy/v1beta1; RBAC rules name the group `policy`,
# which covers both versions). It works the same against a real AKS cluster.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECTL="${KUBECTL:-kubectl}"
PYTHON="${PYTHON:-python3}"
TAG="${RBAC_TEST_TAG:-$(date +%s)-$$}"
NS="vmss-rbac-check-$TAG"
SUFFIX="-rbac-check-$TAG"
SA="vmss-capacity-controller$SUFFIX"
AS="system:serviceaccount:$NS:$SA"
NODE="vmss-rbac-check-node-$TAG"
# The names the controller's config uses (kubernetes.leaderElection.leaseName,
# kubernetes.statusConfigMap): resourceNames in the Role, not object references, so the
# rename does not touch them.
LEASE=vmss-capacity-controller
STATUS_CM=vmss-capacity-controller-status

WORK="$(mktemp -d "${TMPDIR:-/tmp}/test-rbac.XXXXXX")"
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*" >&2; }
k() { "$KUBECTL" "$@"; }
ksa() { "$KUBECTL" --as="$AS" "$@"; }

PROXY_PID=""
CTRL_PID=""
EMU_PID=""
cleanup() {
  local pid
  for pid in "$CTRL_PID" "$EMU_PID" "$PROXY_PID"; do
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  k delete node "$NODE" --ignore-not-found --wait=false >/dev/null 2>&1
  k delete clusterrolebinding "vmss-capacity-controller$SUFFIX" --ignore-not-found >/dev/null 2>&1
  k delete clusterrole "vmss-capacity-controller$SUFFIX" --ignore-not-found >/dev/null 2>&1
  finish_namespace "$NS"
  rm -rf "$WORK"
}

# Delete the test namespace. Without a kube-controller-manager (the namespace controller), a
# deleted namespace stays Terminating for ever; everything in it was created here and has been
# deleted, so the script then completes the deletion itself through the finalize subresource.
finish_namespace() {
  local ns="$1"
  k -n "$ns" delete lease,configmap,events.events.k8s.io,rolebinding,role,serviceaccount --all \
    --ignore-not-found --wait=false >/dev/null 2>&1
  k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1
  for _ in $(seq 1 20); do
    k get namespace "$ns" >/dev/null 2>&1 || return 0
    sleep 0.5
  done
  printf '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"},"spec":{"finalizers":[]}}\n' "$ns" \
    | k replace --raw "/api/v1/namespaces/$ns/finalize" -f - >/dev/null 2>&1
}
trap cleanup EXIT

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
# Waits up to $1 seconds for "$2..." to succeed.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  while [ $SECONDS -lt $deadline ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}
lease_holder() { k get lease "$LEASE" -n "$NS" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }

run_controller_as_the_service_account() {
  local sub=00000000-0000-0000-0000-000000000000 rg=rg-rbac emu="" token server ca mport
  # The earlier steps left a Lease and a status ConfigMap: start from none, as a new install.
  k delete lease "$LEASE" -n "$NS" --ignore-not-found >/dev/null 2>&1
  k delete configmap "$STATUS_CM" -n "$NS" --ignore-not-found >/dev/null 2>&1
  "$VMSS_BIN" emulator --listen 127.0.0.1:0 > "$WORK/emulator.log" 2>&1 &
  EMU_PID=$!
  for _ in $(seq 1 60); do
    emu="$(grep -o 'emulator listening on http://127\.0\.0\.1:[0-9]*' "$WORK/emulator.log" | head -1 | sed 's/^emulator listening on //')"
    [ -n "$emu" ] && break
    sleep 0.5
  done
  [ -n "$emu" ] || { fail "controller run: the emulator did not start: $(tail -5 "$WORK/emulator.log")"; return; }
  curl -fsS -X POST "$emu/_emulator/scale-sets" -H 'content-type: application/json' \
    -d "{\"subscription\":\"$sub\",\"resource_group\":\"$rg\",\"name\":\"pool-a\",\"location\":\"westeurope\",\"sku_name\":\"Standard_D2s_v5\",\"tier\":\"Standard\",\"capacity\":1}" \
    >/dev/null || { fail "controller run: seeding the emulator"; return; }

  token="$(k create token "$SA" -n "$NS" --duration=1h 2>"$WORK/err")" \
    || { fail "controller run: kubectl create token: $(cat "$WORK/err")"; return; }
  server="$(k config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$(k config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  cat > "$WORK/sa.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: sa, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: sa, namespace: $NS}}]
current-context: c
YAML
  mport="$(free_port)"
  cat > "$WORK/config.yaml" <<YAML
azure:
  resourceManagerEndpoint: $emu
  authorityHost: $emu
  tenantId: t
  subscriptionId: $sub
  resourceGroup: $rg
  auth: {method: clientSecret, clientId: controller}
scanInterval: 1s
vmssCacheTTL: 2s
metricsListen: 127.0.0.1:$mport
# Pending pods drive capacity and scale-down is on: every watch and every verb the start-up
# RBAC check asks for (SelfSubjectAccessReview) is exercised as the ServiceAccount.
demand: pods
scaleDown: {enabled: true}
kubernetes:
  enabled: true
  kubeconfig: $WORK/sa.kubeconfig
  namespace: $NS
  leaderElection: {leaseName: $LEASE}
  statusConfigMap: $STATUS_CM
nodeGroups:
  - {name: pool-a, minSize: 1, maxSize: 5, desiredCapacity: 3}
YAML
  ARM_CLIENT_SECRET=s3cret RUST_LOG=info "$VMSS_BIN" run --config "$WORK/config.yaml" > "$WORK/controller.log" 2>&1 &
  CTRL_PID=$!
  if wait_for 60 curl -fsS "http://127.0.0.1:$mport/readyz"; then pass "controller ready, as $AS"; else
    fail "controller run: not ready within 60 s: $(tail -5 "$WORK/controller.log")"; return; fi
  if wait_for 30 bash -c "[ -n \"\$($KUBECTL get lease $LEASE -n $NS -o jsonpath='{.spec.holderIdentity}')\" ]"; then
    pass "controller holds the Lease: $(lease_holder)"
  else
    fail "controller run: no Lease holder within 30 s: $(tail -5 "$WORK/controller.log")"
  fi
  if wait_for 30 bash -c "curl -fsS http://127.0.0.1:$mport/metrics | grep -q '^vmss_capacity_capacity_writes_total{.*result=\"ok\"'"; then
    pass "controller wrote capacity to Azure as the leader"
  else
    fail "controller run: no successful capacity write within 30 s: $(tail -5 "$WORK/controller.log")"
  fi
  # Not required (a build without the status writer passes), but shown: they went through too.
  if k get configmap "$STATUS_CM" -n "$NS" >/dev/null 2>&1; then
    echo "info status ConfigMap $STATUS_CM written by the controller"
  else
    echo "info no status ConfigMap (this build of the controller may not write one yet)"
  fi
  echo "info Events in $NS after the run: $(k get events.events.k8s.io -n "$NS" --no-headers 2>/dev/null \
    | grep -vc "rbac-check\.$TAG")"
  kill -TERM "$CTRL_PID" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$CTRL_PID" 2>/dev/null || break; sleep 0.2; done
  CTRL_PID=""
  if [ -z "$(lease_holder)" ]; then pass "controller released the Lease on SIGTERM"; else
    fail "controller run: the Lease is still held by $(lease_holder) after SIGTERM"; fi
  if grep -Eiq 'forbidden|\b403\b|kubernetes RBAC' "$WORK/controller.log"; then
    fail "controller run: the controller met a 403: $(grep -Ei 'forbidden|\b403\b|kubernetes RBAC' "$WORK/controller.log" | head -3)"
  else
    pass "controller log has no 403 and its start-up RBAC check passed ($(wc -l < "$WORK/controller.log") lines)"
  fi

  # The same configuration as a ServiceAccount no role is bound to: the start-up check refuses,
  # one line per missing verb with its `kubectl auth can-i` check, and the controller exits 1
  # before it watches or writes anything.
  k create serviceaccount "nobody$SUFFIX" -n "$NS" >/dev/null 2>&1
  local nobody
  nobody="$(k create token "nobody$SUFFIX" -n "$NS" --duration=1h 2>"$WORK/err")" \
    || { fail "start-up check: kubectl create token: $(cat "$WORK/err")"; return; }
  sed "s|token: \"$token\"|token: \"$nobody\"|" "$WORK/sa.kubeconfig" > "$WORK/nobody.kubeconfig"
  sed "s|$WORK/sa.kubeconfig|$WORK/nobody.kubeconfig|" "$WORK/config.yaml" > "$WORK/nobody.yaml"
  local rc=0
  ARM_CLIENT_SECRET=s3cret timeout 60 "$VMSS_BIN" run --once --config "$WORK/nobody.yaml" \
    > "$WORK/nobody.log" 2>&1 || rc=$?
  local lines
  lines="$(grep -c '^error: kubernetes RBAC: ' "$WORK/nobody.log")"
  if [ "$rc" = 1 ] \
    && grep -q "may not create leases.coordination.k8s.io in namespace $NS (needed to hold the Lease); fix: apply the ClusterRole and Role of deploy/base" "$WORK/nobody.log" \
    && grep -q "\`kubectl auth can-i list pods -A --as=system:serviceaccount:$NS:nobody$SUFFIX\`" "$WORK/nobody.log"; then
    pass "start-up check as a ServiceAccount without roles: exit 1, $lines one-line refusals with their can-i checks"
  else
    fail "start-up check as a ServiceAccount without roles: exit $rc: $(head -5 "$WORK/nobody.log")"
  fi
  echo "info first refusal: $(grep -m1 '^error: kubernetes RBAC: ' "$WORK/nobody.log")"
  if grep -q "may not list nodes" "$WORK/nobody.log" && ! grep -q "controller ready\|capacity write" "$WORK/nobody.log"; then
    pass "start-up check: every pod-demand read named, nothing watched or written"
  else
    fail "start-up check: $(cat "$WORK/nobody.log" | head -20)"
  fi
}

k version >/dev/null 2>&1 || { echo "FAIL: no API server reachable through KUBECONFIG=${KUBECONFIG:-}" >&2; exit 1; }

# --- render and apply the RBAC objects ---------------------------------------------------------
rel="$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$ROOT/deploy/base" "$WORK")"
cat > "$WORK/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $NS
nameSuffix: $SUFFIX
resources:
  - $rel
YAML
if ! k kustomize "$WORK" > "$WORK/all.yaml" 2> "$WORK/kustomize.err"; then
  echo "FAIL: kubectl kustomize: $(cat "$WORK/kustomize.err")" >&2; exit 1
fi
"$PYTHON" - "$WORK/all.yaml" "$WORK/rbac.yaml" <<'PY' || { echo "FAIL: could not pick the RBAC objects" >&2; exit 1; }
import sys, yaml
keep = ["Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] in keep]
docs.sort(key=lambda d: keep.index(d["kind"]))
found = sorted(d["kind"] for d in docs)
if found != sorted(keep):
    sys.exit(f"expected one each of {keep}, rendered {found}")
yaml.safe_dump_all(docs, open(sys.argv[2], "w"), sort_keys=False)
# The CRDs too: `can-i` answers "no" for a resource the server does not know.
crds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "CustomResourceDefinition"]
yaml.safe_dump_all(crds, open(sys.argv[2] + ".crds", "w"), sort_keys=False)
PY
if out="$(k apply -f "$WORK/rbac.yaml" 2>&1)"; then
  pass "applied $(grep -c '^kind:' "$WORK/rbac.yaml") RBAC objects as $AS"
else
  echo "FAIL: kubectl apply: $out" >&2; exit 1
fi
if out="$(k apply -f "$WORK/rbac.yaml.crds" 2>&1 && k wait --for=condition=Established --timeout=30s -f "$WORK/rbac.yaml.crds" 2>&1)"; then
  pass "applied and established $(grep -c '^kind:' "$WORK/rbac.yaml.crds") CRDs (ProvisioningRequest, CapacityBuffer)"
else
  echo "FAIL: kubectl apply of the CRDs: $out" >&2; exit 1
fi

# --- 1. kubectl auth can-i -----------------------------------------------------------------------
# can WANT VERB RESOURCE [kubectl flags...]
can() {
  local want="$1"; shift
  local got
  got="$(k auth can-i "$@" --as="$AS" 2>/dev/null | tail -1)"
  if [ "$got" = "$want" ]; then pass "can-i $* -> $got"; else fail "can-i $* -> '${got}', want $want"; fi
}
N=(-n "$NS")
for v in get update; do
  can yes "$v" "leases.coordination.k8s.io/$LEASE" "${N[@]}"
  can yes "$v" "configmaps/$STATUS_CM" "${N[@]}"
  # cluster-autoscaler's layout, and our own name for it when another autoscaler owns that one.
  can yes "$v" "configmaps/cluster-autoscaler-status" "${N[@]}"
  can yes "$v" "configmaps/vmss-capacity-controller-ca-status" "${N[@]}"
done
can yes create leases.coordination.k8s.io "${N[@]}"
can yes create configmaps "${N[@]}"
can yes create events.events.k8s.io "${N[@]}"
can yes patch events.events.k8s.io "${N[@]}"
# Pod Events (TriggeredScaleUp, NotTriggerScaleUp) live in the pod's namespace.
can yes create events.events.k8s.io -n default
can yes create events.events.k8s.io -A
for v in get list watch patch; do can yes "$v" nodes; done
for v in get list watch; do
  can yes "$v" pods -A
  can yes "$v" poddisruptionbudgets.policy -A
  can yes "$v" daemonsets.apps -A
  can yes "$v" persistentvolumeclaims -A
  can yes "$v" persistentvolumes
  can yes "$v" storageclasses.storage.k8s.io
  can yes "$v" csinodes.storage.k8s.io
  can yes "$v" namespaces
  can yes "$v" provisioningrequests.autoscaling.x-k8s.io -A
  can yes "$v" podtemplates -A
  can yes "$v" capacitybuffers.autoscaling.x-k8s.io -A
  can yes "$v" deployments.apps -A
  can yes "$v" replicasets.apps -A
  can yes "$v" statefulsets.apps -A
  can yes "$v" jobs.batch -A
  can yes "$v" resourcequotas -A
done
can yes update provisioningrequests.autoscaling.x-k8s.io --subresource=status -A
can yes update capacitybuffers.autoscaling.x-k8s.io --subresource=status -A
can no update capacitybuffers.autoscaling.x-k8s.io -A
can no delete capacitybuffers.autoscaling.x-k8s.io -A
can no create capacitybuffers.autoscaling.x-k8s.io -A
can no update deployments.apps -A
can no patch deployments.apps/scale -A
can no delete jobs.batch -A
can no update provisioningrequests.autoscaling.x-k8s.io -A
can no delete provisioningrequests.autoscaling.x-k8s.io -A
can no create podtemplates -A
can no update resourcequotas --subresource=status -A
can no update namespaces
can no delete namespaces
can no update persistentvolumeclaims -A
can no delete persistentvolumes
can yes create pods --subresource=eviction -A

# What it must not have.
can no get secrets "${N[@]}"
can no list secrets -A
can no get "secrets/vmss-capacity-controller-azure" "${N[@]}"
can no delete nodes
can no update nodes
can no create nodes
can no delete pods -A
can no create pods -A
can no patch pods -A
can no update pods/status -A
can no get leases.coordination.k8s.io/kube-controller-manager "${N[@]}"
can no update leases.coordination.k8s.io/other "${N[@]}"
can no list leases.coordination.k8s.io "${N[@]}"
can no delete "leases.coordination.k8s.io/$LEASE" "${N[@]}"
can no get "leases.coordination.k8s.io/$LEASE" -n kube-system
can no create leases.coordination.k8s.io -n kube-system
can no update "leases.coordination.k8s.io/$LEASE" -n default
can no get configmaps/kube-root-ca.crt "${N[@]}"
can no update configmaps/other "${N[@]}"
can no create configmaps -n kube-system
can no delete "configmaps/$STATUS_CM" "${N[@]}"
can no create events "${N[@]}"
can no delete events.events.k8s.io -A
can no update events.events.k8s.io -A
can no delete poddisruptionbudgets.policy -A
can no update daemonsets.apps -A
can no create deployments.apps "${N[@]}"
can no escalate clusterroles.rbac.authorization.k8s.io
can no bind clusterroles.rbac.authorization.k8s.io
can no impersonate users
can no '*' '*'

# --- 2. real requests as the ServiceAccount ----------------------------------------------------
# expect_ok DESCRIPTION CMD...: succeeds. expect_refused CODE-TEXT DESCRIPTION CMD...: fails with
# that text in the error (Forbidden, Conflict, NotFound), so a 403 is never taken for a 409/404.
expect_ok() {
  local what="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then pass "$what"; else fail "$what: $out"; fi
}
expect_refused() {
  local reason="$1" what="$2"; shift 2
  local out
  if out="$("$@" 2>&1)"; then
    fail "$what: succeeded, want $reason"
  elif grep -qi "$reason" <<<"$out"; then
    pass "$what -> $reason"
  else
    fail "$what: want $reason, got: $out"
  fi
}

# The Lease, as leader election uses it: create, get, update with the resourceVersion read.
cat > "$WORK/lease.yaml" <<YAML
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: $LEASE, namespace: $NS}
spec: {holderIdentity: rbac-check_0, leaseDurationSeconds: 15}
YAML
expect_ok "create Lease $LEASE" ksa create -f "$WORK/lease.yaml"
if ksa get lease "$LEASE" -n "$NS" -o yaml > "$WORK/lease-read.yaml" 2> "$WORK/err"; then
  pass "get Lease $LEASE"
  sed 's/holderIdentity: rbac-check_0/holderIdentity: rbac-check_1/' "$WORK/lease-read.yaml" > "$WORK/lease-renew.yaml"
  expect_ok "update Lease $LEASE with its resourceVersion" ksa replace -f "$WORK/lease-renew.yaml"
  # The same resourceVersion again is now stale: the server must answer 409, which proves the
  # update was authorised and judged on its precondition.
  expect_refused Conflict "update Lease $LEASE with a stale resourceVersion" ksa replace -f "$WORK/lease-renew.yaml"
else
  fail "get Lease $LEASE: $(cat "$WORK/err")"
fi
expect_refused Forbidden "create Lease in kube-system" ksa create -n kube-system -f - <<<"$(sed "s/namespace: $NS/namespace: kube-system/" "$WORK/lease.yaml")"
expect_refused Forbidden "list Leases" ksa get leases -n "$NS"

# The status ConfigMap: create, get, update with the resourceVersion read.
expect_ok "create ConfigMap $STATUS_CM" ksa create configmap "$STATUS_CM" -n "$NS" --from-literal=status.yaml='leader: rbac-check'
if ksa get configmap "$STATUS_CM" -n "$NS" -o yaml > "$WORK/cm-read.yaml" 2> "$WORK/err"; then
  pass "get ConfigMap $STATUS_CM"
  sed 's/leader: rbac-check/leader: rbac-check-2/' "$WORK/cm-read.yaml" > "$WORK/cm-update.yaml"
  expect_ok "update ConfigMap $STATUS_CM with its resourceVersion" ksa replace -f "$WORK/cm-update.yaml"
else
  fail "get ConfigMap $STATUS_CM: $(cat "$WORK/err")"
fi
expect_refused Forbidden "get ConfigMap kube-root-ca.crt" ksa get configmap kube-root-ca.crt -n "$NS"

# An events.k8s.io/v1 Event: create, then a strategic-merge patch of its series, as the
# controller's recorder aggregates repeats.
now="$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)"
cat > "$WORK/event.yaml" <<YAML
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: rbac-check.$TAG, namespace: $NS}
eventTime: "$now"
reportingController: vmss-capacity-controller
reportingInstance: rbac-check
action: Write
reason: CapacityWritten
type: Normal
note: rbac check
regarding: {apiVersion: coordination.k8s.io/v1, kind: Lease, name: $LEASE, namespace: $NS}
YAML
expect_ok "create events.k8s.io/v1 Event" ksa create -f "$WORK/event.yaml"
# A bare PATCH, as the controller sends it: `kubectl patch` would GET first, which the Role does
# not grant (and the controller does not need). Through `kubectl proxy --as`, so any kubeconfig
# credential works.
"$KUBECTL" --as="$AS" proxy --port=0 > "$WORK/proxy.out" 2>&1 &  # not through k(): $! must be kubectl itself, so cleanup can stop it
PROXY_PID=$!
port=""
for _ in $(seq 1 50); do
  port="$(sed -n 's/^Starting to serve on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/proxy.out")"
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then
  fail "kubectl proxy did not start: $(cat "$WORK/proxy.out")"
else
  code="$(curl -s -o "$WORK/patch.out" -w '%{http_code}' -X PATCH \
    -H 'Content-Type: application/strategic-merge-patch+json' \
    --data "{\"series\":{\"count\":2,\"lastObservedTime\":\"$now\"}}" \
    "http://127.0.0.1:$port/apis/events.k8s.io/v1/namespaces/$NS/events/rbac-check.$TAG")"
  if [ "$code" = 200 ]; then pass "patch the Event's series (PATCH -> 200)"; else fail "patch the Event: HTTP $code $(cat "$WORK/patch.out")"; fi
  code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/apis/events.k8s.io/v1/namespaces/$NS/events/rbac-check.$TAG")"
  if [ "$code" = 403 ]; then pass "get the Event -> 403 (not needed, not granted)"; else fail "get the Event: HTTP $code, want 403"; fi
fi

# Cluster-wide reads, as the reflectors do them: list, then a watch (ended by timeoutSeconds).
for path in /api/v1/nodes /api/v1/pods /apis/apps/v1/daemonsets /apis/policy/v1beta1/poddisruptionbudgets; do
  expect_ok "list $path" ksa get --raw "$path?limit=1"
  expect_ok "watch $path" ksa get --raw "$path?watch=1&timeoutSeconds=1"
done
expect_refused Forbidden "list Secrets in all namespaces" ksa get --raw "/api/v1/secrets?limit=1"
expect_refused Forbidden "get Secrets in its namespace" ksa get secrets -n "$NS"

# A Node: patch (taint/cordon) allowed, delete refused. The node is created by the caller.
cat > "$WORK/node.yaml" <<YAML
apiVersion: v1
kind: Node
metadata: {name: $NODE, labels: {vmss-rbac-check: "true"}}
YAML
if k create -f "$WORK/node.yaml" >/dev/null 2> "$WORK/err"; then
  expect_ok "patch Node (cordon)" ksa patch node "$NODE" --type=merge -p '{"spec":{"unschedulable":true}}'
  expect_refused Forbidden "delete Node" ksa delete node "$NODE" --wait=false
  expect_refused Forbidden "update Node" ksa replace -f "$WORK/node.yaml"
else
  fail "create Node $NODE as the caller: $(cat "$WORK/err")"
fi

# Eviction of a pod that does not exist: authorised (404 NotFound), not refused (403).
printf '{"apiVersion":"policy/v1beta1","kind":"Eviction","metadata":{"name":"no-such-pod","namespace":"%s"}}\n' "$NS" > "$WORK/eviction.json"
expect_refused NotFound "evict a missing pod (authorised, so 404)" ksa create --raw "/api/v1/namespaces/$NS/pods/no-such-pod/eviction" -f "$WORK/eviction.json"
expect_refused Forbidden "delete pods" ksa delete pod no-such-pod -n "$NS"

# --- 3. optional: the controller itself, as the ServiceAccount ----------------------------------
# With VMSS_BIN=path/to/vmss-capacity-controller: the real daemon runs with a kubeconfig holding a
# token of the ServiceAccount (TokenRequest, audience: the API server's, one hour) and the
# emulator as Azure. It must win the Lease, write capacity, and release the Lease on SIGTERM, all
# with exactly these rules, and log no 403.
if [ -n "${VMSS_BIN:-}" ]; then
  run_controller_as_the_service_account
fi

echo
echo "test-rbac: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
