#!/usr/bin/env bash
# Server-side throughput of the emulator, measured by an external load generator (wrk, Debian's
# package), so the client does not share the emulator's process. Usage: run.sh BIN [SECONDS]
set -euo pipefail
BIN=${1:-target/release/vmss-capacity-controller}
SECS=${2:-10}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
LOG=$(mktemp)
"$BIN" emulator --listen 127.0.0.1:0 --lro-delay 0s > "$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 1 50); do URL=$(sed -n 's/^emulator listening on //p' "$LOG"); [ -n "$URL" ] && break; sleep 0.1; done
SUB=00000000-0000-0000-0000-000000000000; RG=rg-wrk
curl -fsS -X POST "$URL/_emulator/scale-sets" -H 'content-type: application/json' \
  -d "{\"subscription\":\"$SUB\",\"resource_group\":\"$RG\",\"name\":\"wrk-0\",\"location\":\"westeurope\",\"sku_name\":\"Standard_D2s_v5\",\"tier\":\"Standard\",\"capacity\":3,\"tags\":{}}" >/dev/null
TOKEN=$(curl -fsS "$URL/_emulator/token?client_id=wrk" | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])')
export TOKEN
for path in "virtualMachineScaleSets/wrk-0"; do
  echo "== conditional PUT (If-Match: *), $SECS s, 8 connections"
  wrk -t1 -c8 -d"${SECS}s" -s "$(dirname "$0")/conditional-put.lua" \
    "$URL/subscriptions/$SUB/resourceGroups/$RG/providers/Microsoft.Compute/$path?api-version=2024-07-01"
done
