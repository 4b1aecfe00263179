#!/usr/bin/env bash
# Runs on the GPU machine over a carried gpu-bundle.tar.xz (scripts/gpu_bundle.sh):
# the machine description, the whole test suite on every enabled execution
# space (Cuda included), the machine profile (writescope calibrate) and the
# benchmarks (bandwidth bounds, decode attention, split steps). Everything it
# writes goes to $OUT (default: gpu-results/): info.txt, tests.xml, tests.log,
# profile.yaml, benchmarks.json, then the experiment slice
# experiments/configs/h200-slice.yaml (full-size Qwen3-30B-A3B at 32K) as
# h200-slice.h5 with its report. WRITESCOPE_BENCHMARK_FILTER narrows the
# benchmarks (a Google Benchmark regex); WRITESCOPE_SKIP_SLICE=1 skips the slice.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$repo/gpu-results}
mkdir -p "$out"
unpacked=$(mktemp -d)
tar -C "$unpacked" -xJf "$repo/gpu-bundle.tar.xz"
bundle=$unpacked/gpu-bundle
export LD_LIBRARY_PATH=$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export OMP_PROC_BIND=spread OMP_PLACES=threads
status=0
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
"$bundle/bin/writescope" info >"$out/info.txt" 2>&1 || status=1
"$bundle/bin/writescope_tests" --gtest_output=xml:"$out/tests.xml" >"$out/tests.log" 2>&1 || status=1
tail -3 "$out/tests.log"
"$bundle/bin/writescope" calibrate --output "$out/profile.yaml" 2>"$out/calibrate.log" || status=1
"$bundle/bin/writescope_benchmarks" --benchmark_out="$out/benchmarks.json" --benchmark_out_format=json \
  --benchmark_min_time=0.2 ${WRITESCOPE_BENCHMARK_FILTER:+--benchmark_filter=$WRITESCOPE_BENCHMARK_FILTER} \
  2>&1 | grep -E 'manual_time|^Benchmark' || status=1
if [ -z "${WRITESCOPE_SKIP_SLICE:-}" ]; then
  "$bundle/bin/writescope" run "$repo/experiments/configs/h200-slice.yaml" --profile "$out/profile.yaml" \
    --output "$out/h200-slice.h5" 2>"$out/h200-slice.log" || status=1
  tail -20 "$out/h200-slice.log"
  # The report needs h5py and matplotlib there; the results file comes back either way.
  /usr/bin/python3 "$repo/analysis/report.py" "$out/h200-slice.h5" -o "$out/h200-slice-report" ||
    echo "gpu_check: no report (analysis/report.py failed); h200-slice.h5 is in \$OUT" >&2
fi
exit $status
