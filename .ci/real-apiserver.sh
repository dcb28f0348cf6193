#!/usr/bin/env bash
# Everything that needs a real Kubernetes API server, against kube-apiserver 1.20 + etcd from
# ../shared/kube-apiserver/ (installed here if missing, started on 127.0.0.1, stopped on exit; a
# server already running there, a developer's, is reused and left running):
#   1. every `#[ignore]`d test (ignored only because plain `cargo test` has no server);
#   2. kubectl and the Python kubernetes client against the emulator's Kubernetes side, the Python
#      checks first against the real server (the oracle);
#   3. deploy/base's RBAC: applied under throw-away names, every verb the controller needs allowed
#      and what it must not have refused for its ServiceAccount, and, with BIN (the release
#      binary), the daemon itself running with that ServiceAccount's token.
# Usage: .ci/real-apiserver.sh [BIN]
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
cargo test --locked -- --ignored
# kubectl and the Python kubernetes client against the emulator's Kubernetes side, with the Python
# checks run against the real server first.
ORACLE_KUBECONFIG="$KUBECONFIG" bash tests/interop/kube.sh "${1:-target/debug/vmss-capacity-controller}"

# shellcheck source=lib/install-tools.sh
. .ci/lib/install-tools.sh
venv=$(mktemp -d)/venv
trap 'stop; rm -rf "$(dirname "$venv")"' EXIT
ensure_kubectl "$venv" >/dev/null
PYTHON=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
    ensure_venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check PyYAML==6.0.2
    PYTHON="$venv/bin/python"
fi
KUBECTL="$KUBECTL" PYTHON="$PYTHON" VMSS_BIN="${1:-}" timeout 300 bash deploy/test-rbac.sh
