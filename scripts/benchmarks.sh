#!/usr/bin/env bash
# Builds the host variant and runs the kernel benchmarks (bandwidth bounds,
# decode attention, split steps, expert linear layers) into
# results/benchmarks.json. Extra arguments go to Google Benchmark
# (e.g. --benchmark_filter=cpu_decode).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$("$repo/scripts/build.sh" host)
mkdir -p "$repo/results"
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
"$build/benchmarks/writescope_benchmarks" --benchmark_out="$repo/results/benchmarks.json" \
  --benchmark_out_format=json "$@"
echo "benchmarks: wrote results/benchmarks.json" >&2
