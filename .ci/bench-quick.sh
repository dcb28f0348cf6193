#!/usr/bin/env bash
# Runs every benchmark in quick mode so CI checks that they build, run and print their figures
# (not how fast they are: CI machines are noisy). A few seconds each after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_QUICK=1
# The cost comparison simulates hours of a day, twice: one hour is enough to show it runs.
export BENCH_COST_HOURS=1
# Every bench in one build (cargo compiles them side by side); `cargo bench` also builds the
# daemon binary the memory bench spawns (CARGO_BIN_EXE_...). The runs below rebuild nothing.
cargo bench --locked --no-run
for bench in planner scale_up pod_to_write lost_race fleet cost cache conflict_recovery arm_calls memory; do
    echo "::group::bench $bench"
    out=$(cargo bench --locked --bench "$bench" -- --quick 2>&1) || { echo "$out"; echo "bench $bench failed"; exit 1; }
    echo "$out"
    grep -q "goal" <<<"$out" || { echo "bench $bench printed no goal line"; exit 1; }
    echo "::endgroup::"
done
if [ -f benches/emulator.rs ] && grep -q 'name = "emulator"' Cargo.toml; then
    echo "::group::bench emulator"
    cargo bench --locked --bench emulator -- --quick
    echo "::endgroup::"
fi
echo "all benchmarks ran in quick mode"
