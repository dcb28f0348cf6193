#!/usr/bin/env bash
# Everything that needs a real Kubernetes API server, against kube-apiserver 1.20 + etcd +
# kube-controller-manager from ../shared/kube-apiserver/ (installed here if missing, started on
# 127.0.0.1 on ports of its own, stopped on exit):
#   1. every `#[ignore]`d test (ignored only because plain `cargo test` has no server);
#   2. kubectl and the Python kubernetes client: the same checks first against the real server
#      (the oracle), then against the emulator's Kubernetes side (kube.sh; kube-shapes.sh: every
#      kind read by the newest, strict client, kubectl's tables and describe, simulated Nodes);
#   3. deploy/base's RBAC: applied under throw-away names, every verb the controller needs allowed
#      and what it must not have refused for its ServiceAccount, and, with BIN (the release
#      binary), the daemon itself running with that ServiceAccount's token.
# Usage: .ci/real-apiserver.sh [BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/install-tools.sh
. .ci/lib/install-tools.sh
# Where the API server kit lives: KUBE_APISERVER_DIR, else ../shared/kube-apiserver beside the
# clone, else the machine's /work/shared/kube-apiserver.
KA=""
for d in "${KUBE_APISERVER_DIR:-}" ../shared/kube-apiserver /work/shared/kube-apiserver; do
    if [ -n "$d" ] && [ -f "$d/start.sh" ]; then KA=$d; break; fi
done
if [ -z "$KA" ]; then
    echo "WARNING: no kube-apiserver kit (KUBE_APISERVER_DIR, ../shared/kube-apiserver, /work/shared/kube-apiserver):"
    echo "WARNING: SKIPPING the real-server checks; kubectl and Python kubernetes run against the emulator only."
    bash tests/interop/kube.sh "${1:-target/debug/vmss-capacity-controller}"
    bash tests/interop/kube-shapes.sh "${1:-target/debug/vmss-capacity-controller}"
    exit 0
fi
echo "kube-apiserver kit: $KA"
# Its own server, on its own ports and state directory, with the controller-manager (PDB status,
# garbage collection): never a developer's server that may lack it.
export K8S_TEST_DIR=${CI_K8S_TEST_DIR:-/tmp/k8stest-ci}
export API_PORT=${CI_API_PORT:-16643}
export ETCD_PORT=${CI_ETCD_PORT:-23990}
export KUBECONFIG="$K8S_TEST_DIR/kubeconfig"
with_apt_lock bash "$KA/install.sh"
bash "$KA/stop.sh" >/dev/null 2>&1 || true
rm -rf "$K8S_TEST_DIR"
bash "$KA/start.sh"
stop() { bash "$KA/stop.sh" || true; rm -rf "$K8S_TEST_DIR"; }
trap stop EXIT
# (The demo report's Chromium test is ignored too, but has its own step in .ci/run.)
cargo test --locked -- --ignored --skip report::
# kubectl and the Python kubernetes client: each check on the real server, then on the emulator.
ORACLE_KUBECONFIG="$KUBECONFIG" bash tests/interop/kube.sh "${1:-target/debug/vmss-capacity-controller}"
# Objects as the Go API server serializes them: the newest (strict) Python client and kubectl's
# tables and describe, on the real server (the oracle, Table columns included), then on the
# emulator's simulated cluster.
ORACLE_KUBECONFIG="$KUBECONFIG" bash tests/interop/kube-shapes.sh "${1:-target/debug/vmss-capacity-controller}"

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
