#!/usr/bin/env bash
# Interop test: Azure's official Python SDK against the ARM emulator over TLS.
#
# Usage: tests/interop/run.sh [BIN [EXTRA_ARGS...]]
#   BIN defaults to target/debug/vmss-capacity-controller and is run as
#   `BIN [EXTRA_ARGS...] emulator --listen 127.0.0.1:0 --tls --cert-out CA.pem` when it is the
#   controller binary, or `BIN --listen ... --tls --cert-out ...` otherwise (e.g.
#   target/debug/examples/emulator). Builds nothing itself.
#   VENV: reuse this virtual environment instead of creating one in a temp dir.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-target/debug/vmss-capacity-controller}"
if [[ ! -x "$bin" ]]; then
  echo "run.sh: no executable at $bin (build it first)" >&2
  exit 2
fi
tmp="$(mktemp -d)"
emu_pid=""
cleanup() {
  if [[ -n "$emu_pid" ]]; then
    kill "$emu_pid" 2>/dev/null || true
    wait "$emu_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

venv="${VENV:-$tmp/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"

case "$(basename "$bin")" in
  vmss-capacity-controller) sub=(emulator) ;;
  *) sub=() ;;
esac
"$bin" "${sub[@]}" --listen 127.0.0.1:0 --tls --cert-out "$tmp/ca.pem" >"$tmp/emulator.out" 2>"$tmp/emulator.err" &
emu_pid=$!

url=""
for _ in $(seq 1 100); do
  url="$(sed -n 's/^emulator listening on \(https:\/\/[^ ]*\)$/\1/p' "$tmp/emulator.out" | head -n1)"
  [[ -n "$url" ]] && break
  if ! kill -0 "$emu_pid" 2>/dev/null; then
    echo "run.sh: emulator exited early:" >&2
    cat "$tmp/emulator.err" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z "$url" ]]; then
  echo "run.sh: emulator never printed its listening line" >&2
  exit 1
fi
echo "run.sh: emulator at $url"

EMULATOR_URL="$url" EMULATOR_CA="$tmp/ca.pem" \
  REQUESTS_CA_BUNDLE="$tmp/ca.pem" SSL_CERT_FILE="$tmp/ca.pem" \
  "$venv/bin/python" "$here/test_python_sdk.py"
