#!/usr/bin/env bash
# The main job. Sets up everything on a fresh Debian 12 machine, builds the
# host variant, prints the machine description, writes this machine's profile
# and runs the benchmarks (bandwidth bounds, decode attention, split steps).
# Results go to results/ (machine.yaml, profile.yaml, benchmarks.json).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$("$repo/scripts/build.sh" host)
mkdir -p "$repo/results"
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
"$build/experiments/writescope" info
"$build/experiments/writescope" info --format yaml >"$repo/results/machine.yaml"
"$build/experiments/writescope" calibrate --output "$repo/results/profile.yaml"
"$build/benchmarks/writescope_benchmarks" --benchmark_out="$repo/results/benchmarks.json" \
  --benchmark_out_format=json "$@"
echo "run: wrote results/machine.yaml, results/profile.yaml and results/benchmarks.json" >&2
