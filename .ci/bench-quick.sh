#!/usr/bin/env bash
# Runs every benchmark in quick mode so CI checks that they build, run and print their figures
# (not how fast they are: CI machines are noisy). A few seconds each after the build.
#
#   BENCH_PROFILE   the cargo profile to build them with (default `bench`, i.e. optimized).
#                   CI uses `dev`: the benches then share every dependency the tests built in
#                   target/debug, and only the bench binaries themselves are compiled.
#   BENCH_BUILT     a file to create once the build is done (CI's other cargo commands wait on
#                   the target directory's lock until then; this says when they may start).
#   BENCH_RUN_NICE  how much lower than the build the runs go (CI: 9 more, the lowest priority).
#   BENCH_JOBS      how many benchmarks run at once (default 1; CI: 2, on the cores its other
#                   checks leave idle while they wait). Each one's output is printed whole, in
#                   order.
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_QUICK=1
# The cost comparison simulates hours of a day, twice: one hour is enough to show it runs.
export BENCH_COST_HOURS=1
profile=${BENCH_PROFILE:-bench}
# Every bench in one build (cargo compiles them side by side); `cargo bench` also builds the
# daemon binary the memory bench spawns (CARGO_BIN_EXE_...). The binaries then run directly, so
# no cargo command holds the target directory's lock while a benchmark runs.
# (`--bench` as cargo passes it: without it criterion runs each benchmark once, as a test.)
built=$(mktemp)
trap 'rm -f "$built"' EXIT
cargo bench --locked --profile "$profile" --no-run --message-format=json-render-diagnostics >"$built"
[ -z "${BENCH_BUILT:-}" ] || touch "$BENCH_BUILT"
declare -A exe
while read -r name path; do exe[$name]=$path; done < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
' "$built")
benches=(planner scale_up pod_to_write lost_race fleet cost cache conflict_recovery arm_calls memory emulator)
for bench in "${benches[@]}"; do
    [ -n "${exe[$bench]:-}" ] || { echo "bench $bench was not built"; exit 1; }
done
out_dir=$(mktemp -d)
trap 'rm -f "$built"; rm -rf "$out_dir"' EXIT
run_one() {
    local bench=$1 t0=$SECONDS rc=0
    nice -n "${BENCH_RUN_NICE:-0}" "${exe[$bench]}" --quick --bench >"$out_dir/$bench.out" 2>&1 || rc=$?
    echo "$rc $((SECONDS - t0))" >"$out_dir/$bench.done"
}
jobs_max=${BENCH_JOBS:-1}
for bench in "${benches[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    run_one "$bench" &
done
wait
failed=0
for bench in "${benches[@]}"; do
    echo "::group::bench $bench"
    cat "$out_dir/$bench.out"
    read -r rc secs <"$out_dir/$bench.done"
    if [ "$rc" != 0 ]; then echo "bench $bench failed (exit $rc)"; failed=1
    # The emulator's bench measures requests per second and states no goal.
    elif [ "$bench" != emulator ] && ! grep -q "goal" "$out_dir/$bench.out"; then
        echo "bench $bench printed no goal line"; failed=1
    fi
    echo "::endgroup:: ($secs s)"
done
[ "$failed" = 0 ] || exit 1
echo "all benchmarks ran in quick mode ($profile profile, $jobs_max at a time)"
