#!/usr/bin/env bash
# Builds the host variant and runs the kernel benchmarks (bandwidth bounds,
# decode attention, split steps, expert linear layers) into
# results/benchmarks.json. Extra arguments go to Google Benchmark
# (e.g. --benchmark_filter=cpu_decode); results/benchmarks.json is replaced
# only by a run that finishes with at least one benchmark.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Arguments checked before the build: each is a Google Benchmark or Kokkos option.
listing=
for arg; do
  case $arg in
    --benchmark_out=* | --benchmark_out_format=*)
      echo "benchmarks.sh: it writes results/benchmarks.json itself; got '$arg'" >&2
      exit 2 ;;
    --benchmark_list_tests | --benchmark_list_tests=true) listing=1 ;;
    --benchmark_*=* | --kokkos-*=*) ;;
    *) echo "usage: scripts/benchmarks.sh [--benchmark_OPTION=VALUE ...] [--kokkos-OPTION=VALUE ...]; got '$arg'" >&2
       exit 2 ;;
  esac
done
build=$("$repo/scripts/build.sh" host)
mkdir -p "$repo/results"
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
# A listing measures nothing and leaves the results as they are.
[ -z "$listing" ] || exec "$build/benchmarks/writescope_benchmarks" "$@"
# Written beside and renamed: an interrupted run leaves the last results whole.
partial=$repo/results/benchmarks.json.partial
trap 'rm -f "$partial"' EXIT
"$build/benchmarks/writescope_benchmarks" --benchmark_out="$partial" --benchmark_out_format=json "$@"
if ! grep -q '"run_name"' "$partial"; then
  echo "benchmarks: no benchmark ran (a filter that matches none?); results/benchmarks.json is left as it was" >&2
  exit 1
fi
mv "$partial" "$repo/results/benchmarks.json"
echo "benchmarks: wrote results/benchmarks.json" >&2
