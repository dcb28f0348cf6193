#!/usr/bin/env bash
# A real Prometheus scrape of the real daemon, against the emulator, with a rival writer.
#
#   .ci/prometheus-scrape.sh path/to/vmss-capacity-controller
#
# 1. starts `BIN emulator --listen 127.0.0.1:0` and reads its URL from its first lines;
# 2. seeds two scale sets through the emulator's control API;
# 3. runs `BIN run --config FILE` (client secret from ARM_CLIENT_SECRET, scanInterval 1s);
# 4. runs a rival writer that changes pool-a's capacity every 2 s (30 times at most), so the
#    controller's cached ETags go stale and its writes meet 412s;
# 5. starts Debian's Prometheus on loopback (scrape_interval 1s, temp storage) and waits for it
#    to collect the series;
# 6. asserts through Prometheus' HTTP API: up == 1; successful capacity writes > 0; conflicts
#    counted (etag_conflicts_total or precondition_failed writes) > 0; the contract's metric
#    names present; min/max sane; and, once the rival stops, pool-a's capacity in Prometheus
#    equals the emulator's (read through ARM with a token) and the plan's (5);
# 7. `promtool check metrics` on a raw /metrics scrape.
# Everything it starts is stopped on exit (by PID); every wait is bounded; any failure exits 1
# with a message saying which assertion failed, and the tails of the logs.
set -uo pipefail

BIN="${1:-}"
[ -n "$BIN" ] && [ -x "$BIN" ] || { echo "usage: $0 path/to/vmss-capacity-controller" >&2; exit 2; }
BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/install-tools.sh
. "$ROOT/.ci/lib/install-tools.sh"

SUB="00000000-0000-0000-0000-000000000000"
RG="rg-ci"
TENANT="t"
PROM_WAIT_SECS="${PROM_WAIT_SECS:-90}"     # bound on waiting for writes and conflicts to show
RIVAL_ITERATIONS="${RIVAL_ITERATIONS:-30}" # the rival writes at most this many times, every 2 s

WORK="$(mktemp -d "${TMPDIR:-/tmp}/prometheus-scrape.XXXXXX")"
declare -a PIDS=()
RIVAL_PID=""
CTRL_PID=""
FAILED_MSG=""

cleanup() {
  local rc=$?
  # Stop what we started, newest first, by PID: TERM, a bounded wait, then KILL.
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do
    local pid="${PIDS[$i]}"
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ $rc != 0 ]; then
    for log in emulator controller prometheus rival; do
      [ -s "$WORK/$log.log" ] && { echo "--- last lines of $log.log"; tail -n 25 "$WORK/$log.log"; }
    done
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "FAIL prometheus-scrape: $*" >&2; exit 1; }
ok() { echo "ok   $*"; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Waits up to $1 seconds for command "$2..." to succeed.
wait_for() {
  local secs="$1"; shift
  local deadline=$((SECONDS + secs))
  while [ $SECONDS -lt $deadline ]; do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# EMULATOR CONTROL API. The shapes below follow the brief given to the emulator's author; if the
# emulator's /_emulator/ routes differ, adjust these three functions only.
# ---------------------------------------------------------------------------------------------
emu_seed() { # name capacity
  curl -fsS -X POST "$EMU/_emulator/scale-sets" -H 'content-type: application/json' \
    -d "{\"subscription\":\"$SUB\",\"resource_group\":\"$RG\",\"name\":\"$1\",\"location\":\"westeurope\",\"sku_name\":\"Standard_D2s_v5\",\"tier\":\"Standard\",\"capacity\":$2,\"tags\":{\"owner\":\"ci\"}}"
}
emu_rival_write() { # name capacity
  curl -fsS -X POST "$EMU/_emulator/scale-sets/$SUB/$RG/$1/capacity" -H 'content-type: application/json' \
    -d "{\"capacity\":$2,\"writer\":\"rival\"}"
}
# An ARM token for reading the emulator as a client would: the AAD-style endpoint with the same
# client credentials as the controller, else the emulator's test shortcut.
emu_token() {
  curl -fsS -X POST "$EMU/$TENANT/oauth2/v2.0/token" \
      --data-urlencode grant_type=client_credentials --data-urlencode client_id=controller \
      --data-urlencode client_secret=s3cret --data-urlencode "scope=$EMU/.default" 2>/dev/null \
    || curl -fsS "$EMU/_emulator/token?client_id=ci"
}
# pool capacity as ARM reports it (GET of the scale set, sku.capacity).
emu_capacity() { # name
  local tok
  tok="$(emu_token | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])')" || return 1
  curl -fsS -H "Authorization: Bearer $tok" \
    "$EMU/subscriptions/$SUB/resourceGroups/$RG/providers/Microsoft.Compute/virtualMachineScaleSets/$1?api-version=2024-07-01" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["sku"]["capacity"])'
}
# ---------------------------------------------------------------------------------------------

ensure_prometheus || exit 1

# 1. emulator
"$BIN" emulator --listen 127.0.0.1:0 > "$WORK/emulator.log" 2>&1 &
PIDS+=($!)
EMU=""
for _ in $(seq 1 60); do
  EMU="$(grep -o 'emulator listening on http://127\.0\.0\.1:[0-9]*' "$WORK/emulator.log" | head -1 | sed 's/^emulator listening on //')"
  [ -n "$EMU" ] && break
  kill -0 "${PIDS[0]}" 2>/dev/null || die "the emulator exited before saying where it listens"
  sleep 0.5
done
[ -n "$EMU" ] || die "no 'emulator listening on http://127.0.0.1:PORT' line within 30 s"
ok "emulator at $EMU"

# 2. seed: pool-a and pool-b start away from their plan (5 and 2), so the controller must write.
emu_seed pool-a 3 >/dev/null || die "seeding pool-a through POST $EMU/_emulator/scale-sets failed"
emu_seed pool-b 0 >/dev/null || die "seeding pool-b failed"
ok "seeded pool-a (capacity 3) and pool-b (capacity 0)"

# Where the conflicts come from. A 412 needs the rival's write to land between the controller's
# read and its PUT. Every PUT to pool-a is held 2.5 s by the emulator before it is handled (a
# latency fault), and the rival writes pool-a every 2 s, so each of those writes meets a rival
# change in its window and must be refused with 412: the conflicts are certain, not lucky.
# CONFLICT_FAULT_CMD overrides the injection (run with EMU, SUB and RG exported).
: "${CONFLICT_FAULT_CMD:=curl -fsS -X POST \"\$EMU/_emulator/faults\" -H 'content-type: application/json' -d '{\"method\":\"PUT\",\"path_contains\":\"pool-a\",\"kind\":{\"type\":\"latency\",\"ms\":2500}}'}"
export EMU SUB RG
bash -c "$CONFLICT_FAULT_CMD" > "$WORK/fault.log" 2>&1 || die "CONFLICT_FAULT_CMD failed: $(cat "$WORK/fault.log")"
ok "conflict window injected: every PUT to pool-a waits 2.5 s in the emulator"

# 3. controller
MPORT="$(free_port)"
cat > "$WORK/config.yaml" <<YAML
azure:
  resourceManagerEndpoint: $EMU
  authorityHost: $EMU
  tenantId: $TENANT
  subscriptionId: $SUB
  resourceGroup: $RG
  auth:
    method: clientSecret
    clientId: controller
enableVMSSEtag: true
scanInterval: 1s
vmssCacheTTL: 2s
metricsListen: 127.0.0.1:$MPORT
nodeGroups:
  - {name: pool-a, minSize: 1, maxSize: 10, desiredCapacity: 5}
  - {name: pool-b, minSize: 0, maxSize: 5, desiredCapacity: 2}
YAML
ARM_CLIENT_SECRET=s3cret RUST_LOG="${RUST_LOG:-info}" "$BIN" run --config "$WORK/config.yaml" > "$WORK/controller.log" 2>&1 &
CTRL_PID=$!
PIDS+=("$CTRL_PID")
wait_for 60 curl -fsS "http://127.0.0.1:$MPORT/readyz" \
  || die "controller not ready on http://127.0.0.1:$MPORT/readyz within 60 s"
curl -fsS "http://127.0.0.1:$MPORT/healthz" >/dev/null || die "/healthz not OK after /readyz was"
ok "controller ready (metrics on 127.0.0.1:$MPORT)"

# 4. rival writer: bounded loop, pool-a between values off the plan.
(
  for i in $(seq 1 "$RIVAL_ITERATIONS"); do
    emu_rival_write pool-a $(( (i % 2) ? 2 : 8 )) >/dev/null 2>&1 || echo "rival write $i failed"
    sleep 2
  done
) > "$WORK/rival.log" 2>&1 &
RIVAL_PID=$!
PIDS+=("$RIVAL_PID")
ok "rival writer started ($RIVAL_ITERATIONS writes at most, every 2 s)"

# 5. Prometheus
PPORT="$(free_port)"
cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: vmss-capacity-controller
    static_configs:
      - targets: ["127.0.0.1:$MPORT"]
YAML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PPORT" --log.level=warn > "$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
PROM="http://127.0.0.1:$PPORT"
wait_for 30 curl -fsS "$PROM/-/ready" || die "Prometheus not ready on $PROM within 30 s"
ok "Prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') scraping every 1 s at $PROM"

# Instant query; prints the sum of the result's values, or "none" when the result is empty.
q() {
  curl -fsS "$PROM/api/v1/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
r = json.load(sys.stdin)
if r.get("status") != "success":
    sys.exit("query failed: %s" % r)
v = r["data"]["result"]
print(sum(float(s["value"][1]) for s in v) if v else "none")'
}
positive() { local v; v="$(q "$1")" && [ "$v" != none ] && python3 -c "import sys; sys.exit(0 if float('$v') > 0 else 1)"; }

# 6. assertions
wait_for 20 positive 'up{job="vmss-capacity-controller"}' || die "up{job=\"vmss-capacity-controller\"} never became 1"
ok "up == 1"
WRITES='sum(vmss_capacity_capacity_writes_total{result="ok"})'
CONFLICTS='(sum(vmss_capacity_etag_conflicts_total) or vector(0)) + (sum(vmss_capacity_capacity_writes_total{result="precondition_failed"}) or vector(0))'
wait_for "$PROM_WAIT_SECS" positive "$WRITES" || die "no successful capacity write seen ($WRITES = $(q "$WRITES")) within ${PROM_WAIT_SECS}s"
ok "successful capacity writes: $(q "$WRITES")"
wait_for "$PROM_WAIT_SECS" positive "$CONFLICTS" \
  || die "no ETag conflict counted within ${PROM_WAIT_SECS}s although a rival writer ran (etag_conflicts_total = $(q 'sum(vmss_capacity_etag_conflicts_total)'), precondition_failed writes = $(q 'sum(vmss_capacity_capacity_writes_total{result="precondition_failed"})'))"
ok "conflicts counted: etag_conflicts_total=$(q 'sum(vmss_capacity_etag_conflicts_total)') precondition_failed=$(q 'sum(vmss_capacity_capacity_writes_total{result="precondition_failed"})') foreign_writes=$(q 'sum(vmss_capacity_foreign_writes_total)')"

# Metric names the contract requires to exist once writes and conflicts happened.
NAMES="$(curl -fsS "$PROM/api/v1/label/__name__/values" | python3 -c '
import json, sys; print(" ".join(n for n in json.load(sys.stdin)["data"] if n.startswith("vmss_capacity_")))')"
missing=""
for n in build_info reconcile_total reconcile_duration_seconds_bucket arm_requests_total \
         arm_request_duration_seconds_bucket capacity_writes_total etag_conflicts_total \
         cache_invalidations_total scale_set_capacity scale_set_desired_capacity \
         scale_set_min_size scale_set_max_size cache_age_seconds \
         last_successful_reconcile_timestamp_seconds; do
  case " $NAMES " in *" vmss_capacity_$n "*) ;; *) missing="$missing vmss_capacity_$n" ;; esac
done
[ -z "$missing" ] || die "series missing in Prometheus:$missing (present: $NAMES)"
ok "contract series present ($(echo "$NAMES" | wc -w) vmss_capacity_* names)"
[ "$(q 'vmss_capacity_scale_set_min_size{scale_set="pool-a"}')" = "1.0" ] || die "scale_set_min_size{pool-a} is $(q 'vmss_capacity_scale_set_min_size{scale_set="pool-a"}'), want 1"
[ "$(q 'vmss_capacity_scale_set_max_size{scale_set="pool-a"}')" = "10.0" ] || die "scale_set_max_size{pool-a} is $(q 'vmss_capacity_scale_set_max_size{scale_set="pool-a"}'), want 10"
ok "min/max of pool-a are 1/10"

# Stop the rival, then the controller must converge and Prometheus must agree with the emulator.
kill -TERM "$RIVAL_PID" 2>/dev/null; wait "$RIVAL_PID" 2>/dev/null
same_capacity() {
  local emu prom
  emu="$(emu_capacity pool-a)" || return 1
  prom="$(q 'vmss_capacity_scale_set_capacity{scale_set="pool-a"}')" || return 1
  LAST_SEEN="emulator=$emu prometheus=$prom"
  [ "$prom" != none ] && [ "${prom%.0}" = "$emu" ] && [ "$emu" = 5 ]
}
LAST_SEEN=""
wait_for 45 same_capacity \
  || die "pool-a did not settle at the plan (5) with Prometheus equal to the emulator within 45 s after the rival stopped (last: $LAST_SEEN)"
ok "pool-a: Prometheus' vmss_capacity_scale_set_capacity equals the emulator's capacity (5)"

# 7. promtool check metrics on the raw exposition.
curl -fsS "http://127.0.0.1:$MPORT/metrics" > "$WORK/metrics.txt" || die "GET /metrics failed"
if out="$(promtool check metrics < "$WORK/metrics.txt" 2>&1)"; then
  ok "promtool check metrics: clean ($(grep -c '^vmss_capacity_' "$WORK/metrics.txt") samples)"
else
  echo "$out" >&2
  die "promtool check metrics reported problems in the exposition"
fi

# Graceful shutdown (informational): SIGTERM, and the controller should exit within its grace.
kill -TERM "$CTRL_PID" 2>/dev/null
for _ in $(seq 1 350); do kill -0 "$CTRL_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$CTRL_PID" 2>/dev/null; then
  echo "note: controller still running 35 s after SIGTERM (shutdownGrace is 30 s)"
else
  wait "$CTRL_PID"; echo "note: controller exited with status $? after SIGTERM"
fi

echo "prometheus-scrape: all assertions passed"
