#!/usr/bin/env bash
# Runs the tests that need a real Kubernetes API server (every `#[ignore]`d test: they are ignored
# only because plain `cargo test` has no server) against kube-apiserver 1.20 + etcd from
# ../shared/kube-apiserver/ (installed here if missing, started on 127.0.0.1, stopped on exit).
# A server already running there (a developer's) is reused and left running.
set -euo pipefail
cd "$(dirname "$0")/.."
KA=${KUBE_APISERVER_DIR:-../shared/kube-apiserver}
export K8S_TEST_DIR=${K8S_TEST_DIR:-/tmp/k8stest}
export KUBECONFIG="$K8S_TEST_DIR/kubeconfig"
bash "$KA/install.sh"
started=0
API_PORT=${API_PORT:-16443}
if ! curl -skf --max-time 3 -H "Authorization: Bearer test-token" "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then
    bash "$KA/start.sh"
    started=1
fi
stop() { if [ "$started" = 1 ]; then bash "$KA/stop.sh" || true; fi; }
trap stop EXIT
# Other real-server checks (RBAC) are sourced here when present.
if [ -f .ci/rbac-real-apiserver.sh ]; then
    bash .ci/rbac-real-apiserver.sh
fi
cargo test --locked -- --ignored
# kubectl and the Python kubernetes client against the emulator's Kubernetes side, with the Python
# checks run against the real server first (the debug binary exists: cargo test built it).
ORACLE_KUBECONFIG="$KUBECONFIG" bash tests/interop/kube.sh target/debug/vmss-capacity-controller
