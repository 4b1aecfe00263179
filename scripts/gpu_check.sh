#!/usr/bin/env bash
# The GPU check: everything one device call should answer, in stages that each
# have their own time limit (about 7 minutes in all on the GPU machine).
#
#   scripts/gpu_check.sh           on the GPU machine, over a carried gpu-bundle.tar.xz
#                                  (scripts/gpu_bundle.sh builds it here)
#   scripts/gpu_check.sh --host    the same stages on this machine's host build
#                                  (build/host, or $WRITESCOPE_BUILD), in 5-10 minutes
#                                  on a 2-core host
#
# Stages: 1 smoke   `writescope info` and the attention and execution-space
#                   tests on the accelerator's space alone (Cuda; OpenMP with
#                   --host); the check stops here if they fail
#         2 tests   the whole test suite
#         3 calibrate   the machine profile (profile.yaml), at 1 thread and
#                   at all the host's (writescope info's host_threads)
#         4 slice   experiments/configs/h200-slice.yaml (host-slice.yaml with
#                   --host) with the measured profile (the config's own where
#                   calibrate left none, which the summary says), and its report
#         5 benchmarks  bandwidth bounds, GPU resident decode (at 32K with teams
#                   of 4, 8 and 16 warps), the GPU's linear
#                   layer at 1, 8 and 16 rows and a step's experts (batched and
#                   one add each), the split sweep (its 0% point is the GPU
#                   streamed path), CPU decode, a 512-row prompt chunk at 16K
#                   on the host and on the GPU
#         6 host_kernels  the host kernels against their roofs on this host:
#                   CPU decode from the last-level cache, the expert linear
#                   layer at 1-8 rows, and how far the host overlaps DRAM with
#                   FMAs at 1, 4 and 16 multiply-adds per byte (host_overlap)
#                   (a stage of its own, so that a time-out
#                   here keeps stage 5's figures); where decode runs on AMX
#                   tiles, those kernels again on the vector path, for the
#                   tiles' gain
# The slice comes before the benchmarks: where the check runs out of seconds,
# the last stages are cut, and the slice is the measurement the others explain.
# On the GPU machine the summary also says whether the bundle was built from
# this tree's sources (sources.sha256 in the bundle); a stale one measures
# other code.
# WRITESCOPE_GPU_CHECK_STAGES (e.g. "smoke,tests,benchmarks") runs a subset, in
# order (a name that is no stage, or none, is an error, before anything runs);
# WRITESCOPE_BENCHMARK_FILTER and WRITESCOPE_HOST_KERNEL_FILTER replace
# stages 5 and 6's benchmark regexes (a stage whose filter matches no
# benchmark fails). WRITESCOPE_GPU_CHECK_SECONDS (default
# 540; 1200 with --host) bounds the whole check: a stage's limit is cut to
# what is left of it and a stage with under 15 s left is skipped, so that the
# results are packed before the device tool's 600 s per call run out.
# Everything goes into one folder that is packed as $OUT/gpu-check.tar.gz,
# beside $OUT/summary.txt: which stages passed and the headline figures
# (scripts/gpu_check_summary.py). Two files come back from the device.
# $OUT defaults to gpu-results/. The exit status is 0 only if every stage passed.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=gpu
usage() { echo "usage: scripts/gpu_check.sh [--host]" >&2; exit 2; }
[ $# -le 1 ] || usage
case "${1:-}" in
  --host) mode=host ;;
  "") ;;
  *) usage ;;
esac
# Stage names checked before anything runs: a typo would cost device time and pass with nothing run.
all_stages=smoke,tests,calibrate,slice,benchmarks,host_kernels
stages=${WRITESCOPE_GPU_CHECK_STAGES-$all_stages}
# Set but empty is a slip (a variable that expanded to nothing), not "all".
[ -n "$stages" ] || { echo "gpu_check: WRITESCOPE_GPU_CHECK_STAGES is set but empty; name stages ($all_stages) or unset it to run them all" >&2
                      exit 2; }
# Exact comma-separated names: "smoke, tests" would otherwise skip tests unsaid.
IFS=, read -ra listed <<<"$stages"
for stage in "${listed[@]}"; do
  case ",$all_stages," in
    *",$stage,"*) [ -n "$stage" ] && continue ;;
  esac
  echo "gpu_check: WRITESCOPE_GPU_CHECK_STAGES names '$stage', not a stage (comma-separated, no spaces); stages: $all_stages" >&2
  exit 2
done
# The host build's stages have longer limits (a 2-core CI machine).
budget=${WRITESCOPE_GPU_CHECK_SECONDS:-$([ "$mode" = gpu ] && echo 540 || echo 1200)}
case $budget in
  "" | *[!0-9]*) echo "gpu_check: WRITESCOPE_GPU_CHECK_SECONDS must be a whole number of seconds, not '$budget'" >&2
                 exit 2 ;;
esac
check_started=$(date +%s)
out=${OUT:-$repo/gpu-results}
mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "gpu_check: OUT=$out cannot be made a folder" >&2; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
work=$scratch/gpu-check
mkdir -p "$work"

if [ "$mode" = gpu ]; then
  tar -C "$scratch" -xJf "$repo/gpu-bundle.tar.xz" || { echo "gpu_check: cannot unpack gpu-bundle.tar.xz" >&2; exit 1; }
  bin=$scratch/gpu-bundle/bin
  # Whether the bundle was built from this tree's sources: a stale one measures other code.
  sums=$scratch/gpu-bundle/sources.sha256
  if [ ! -s "$sums" ]; then
    echo "bundle: no sources.sha256 (packed before the check compared sources)"
  elif stale=$(cd "$repo" && sha256sum --check --quiet "$sums" 2>/dev/null | sed 's/: .*//'); [ -z "$stale" ]; then
    echo "bundle: built from this tree's sources ($(wc -l <"$sums") files)"
  else
    echo "bundle: STALE: $(wc -l <<<"$stale") of its $(wc -l <"$sums") source files differ in this tree:" \
      "$(head -5 <<<"$stale" | tr '\n' ' ')"
  fi >"$work/bundle.txt"
  # cuBLAS does not travel in the bundle: /usr/local/cuda's, else a Python
  # nvidia package's (nvidia/cublas/lib for CUDA 12, nvidia/cu13/lib for 13):
  # every such folder, and the loader takes the version the bundle names.
  cublas=$(python3 - 2>/dev/null <<'PYTHON'
import glob, os, nvidia
folders = {os.path.dirname(path) for root in nvidia.__path__
           for path in glob.glob(os.path.join(root, "*", "lib", "libcublas.so.*"))}
print(":".join(sorted(folders)))
PYTHON
)
  export LD_LIBRARY_PATH=$scratch/gpu-bundle/lib:/usr/local/cuda/lib64:${cublas:+$cublas:}${LD_LIBRARY_PATH:-}
  export WRITESCOPE_PROFILES=$scratch/gpu-bundle/share/writescope/profiles
  writescope=$bin/writescope tests=$bin/writescope_tests benchmarks=$bin/writescope_benchmarks
  space=Cuda
  slice_config=$repo/experiments/configs/h200-slice.yaml
  profile_option=(--profile "$work/profile.yaml")
  bench_filter="^(pcie/.*/1024/|hbm/.*/1024/|host_dram/read/1024/|gpu_decode/.*/32768/|gpu_decode/.*/131072/warps:16/|gpu_linear/bf16_writescope/(1|8|16)/14336/4096/|gpu_experts/qwen3/tokens:1/|gpu_prompt_linear/.*/256/|split_decode/.*/131072/(0|25|50|75|100)/|cpu_decode/qwen3.*/32768/|cpu_decode/.*/131072/|prefill/.*/16384/|gpu_prefill/.*/16384/)"
  host_kernel_filter="^(cpu_decode_from_cache/|expert_linear/bf16_writescope/(1|2|4|8)/14336/4096/|cpu_experts/qwen3/tokens:1/|host_overlap/fmas_per_line:(4|16|64)/)"
  vector_kernel_filter="^(cpu_decode_from_cache/|cpu_decode/(deepseek_mla|qwen3_gqa)_cpu_resident/131072/|expert_linear/bf16_writescope/(1|8)/14336/4096/)"
  limits=(smoke:45 tests:120 calibrate:75 slice:125 benchmarks:140 host_kernels:120)
else
  build=${WRITESCOPE_BUILD:-$repo/build/host}
  writescope=$build/experiments/writescope tests=$build/tests/writescope_tests
  benchmarks=$build/benchmarks/writescope_benchmarks
  space=OpenMP
  slice_config=$repo/experiments/configs/host-slice.yaml
  # The host has no GPU: the slice plans with its config's GPU profile instead
  # of the one measured here, so that its split is exercised.
  profile_option=()
  bench_filter="^(host_dram/read/1024/|split_decode/.*/32768/(0|50|100)/|cpu_decode/qwen3_gqa_cpu_resident/8192/|prefill/qwen3_gqa/4096/)"
  host_kernel_filter="^(cpu_decode_from_cache/qwen3_gqa_cpu_resident/|expert_linear/bf16_writescope/8/768/2048/|cpu_experts/qwen3/tokens:1/batched:1/|host_overlap/fmas_per_line:16/)"
  vector_kernel_filter="^cpu_decode_from_cache/deepseek_mla_cpu_resident/"
  limits=(smoke:120 tests:240 calibrate:120 slice:180 benchmarks:240 host_kernels:120)
fi
slice_profile=${profile_option[*]:-}
# On the GPU machine the Runtime places the threads itself (framework/runtime.hpp:
# the GPU driver on a CPU of its own, OpenMP pinned to the others).
[ "$mode" = host ] && export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
bench_filter=${WRITESCOPE_BENCHMARK_FILTER:-$bench_filter}
host_kernel_filter=${WRITESCOPE_HOST_KERNEL_FILTER:-$host_kernel_filter}
export slice_profile writescope tests benchmarks space slice_config bench_filter host_kernel_filter vector_kernel_filter work
export repo

# Whether the programs load: the check stops if writescope or the tests do
# not; the benchmarks alone (Kokkos Kernels' cuBLAS) only fail their stages.
libraries_found() {
  local missing
  missing=$(ldd "$@" 2>&1 | grep 'not found') || return 0
  echo "gpu_check: libraries not found for $* (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}):"
  echo "$missing"
  return 1
}
stage_smoke() {
  nvidia-smi >"$work/nvidia-smi.txt" 2>&1
  libraries_found "$writescope" "$tests" || return 1
  libraries_found "$benchmarks" || echo "gpu_check: the benchmarks and host_kernels stages will fail"
  "$writescope" info >"$work/info.txt" 2>&1 || return 1
  "$tests" --gtest_filter="*/$space*:StreamedDecodeTest*:SplitDecodeTest*" --gtest_output=xml:"$work/smoke.xml"
}
stage_tests() {
  "$tests" --gtest_output=xml:"$work/tests.xml"
}
stage_calibrate() {
  # 1 thread and all of them: the slice runs at all, and each thread count
  # between would cost two child processes per shape (a CUDA context and a
  # cache each).
  local threads counts=
  threads=$(sed -n 's/^ *host_threads: *\([0-9][0-9]*\)$/\1/p' "$work/info.txt" 2>/dev/null)
  [ -n "$threads" ] && [ "$threads" -gt 1 ] && counts="--thread-counts 1,$threads"
  "$writescope" calibrate --output "$work/profile.yaml" $counts
}
# Whether $1 (a benchmark run's JSON) holds a run: a filter that matches
# nothing exits 0 with no runs, which is no measurement.
benchmarks_ran() {
  grep -q '"run_name"' "$1" 2>/dev/null && return 0
  echo "gpu_check: no benchmark in $(basename "$1") (the filter '$2' matched none)"
  return 1
}
stage_benchmarks() {
  libraries_found "$benchmarks" || return 1
  "$benchmarks" --benchmark_filter="$bench_filter" --benchmark_min_time=0.1 \
    --benchmark_out="$work/benchmarks.json" --benchmark_out_format=json || return 1
  benchmarks_ran "$work/benchmarks.json" "$bench_filter"
}
stage_host_kernels() {
  libraries_found "$benchmarks" || return 1
  "$benchmarks" --benchmark_filter="$host_kernel_filter" --benchmark_min_time=0.1 \
    --benchmark_out="$work/host_kernels.json" --benchmark_out_format=json || return 1
  benchmarks_ran "$work/host_kernels.json" "$host_kernel_filter" || return 1
  # Where the tiles run, their kernels again on the vector path: the tiles' gain in one run.
  local vector
  vector=$(sed -n 's/^ *amx_bf16: .* the other kernels on \([a-z0-9_]*\)$/\1/p' "$work/info.txt")
  [ -n "$vector" ] || return 0
  WRITESCOPE_CPU_PATH=$vector "$benchmarks" --benchmark_filter="$vector_kernel_filter" --benchmark_min_time=0.1 \
    --benchmark_out="$work/host_kernels_vector.json" --benchmark_out_format=json || return 1
  benchmarks_ran "$work/host_kernels_vector.json" "$vector_kernel_filter"
}
stage_slice() {
  # The host build drives its "GPU" share from a thread of its own, as a CUDA build does.
  [ "$space" = OpenMP ] && export WRITESCOPE_GPU_THREAD=${WRITESCOPE_GPU_THREAD:-1}
  "$writescope" run "$slice_config" $slice_profile --output "$work/slice.h5" || return 1
  local python
  for python in /usr/bin/python3 python3; do
    if "$python" -c 'import h5py, matplotlib, numpy' 2>/dev/null; then
      MPLBACKEND=Agg "$python" "$repo/analysis/report.py" "$work/slice.h5" -o "$work/slice-report"
      return
    fi
  done
  echo "gpu_check: no Python 3 with h5py, matplotlib and numpy: report skipped (slice.h5 is in the archive)"
}
export -f libraries_found benchmarks_ran stage_smoke stage_tests stage_calibrate stage_benchmarks stage_host_kernels stage_slice

: >"$work/stages.txt"
failed=
for entry in "${limits[@]}"; do
  name=${entry%%:*} limit=${entry##*:}
  case ",$stages," in
    *",$name,"*) ;;
    *) continue ;;
  esac
  if [ "$name" = slice ] && [ "$mode" = gpu ] && [ ! -s "$work/profile.yaml" ]; then
    # Still measured, planned with the config's shipped profile: the results record which.
    slice_profile=
    echo "gpu_check: no measured profile (calibrate failed or did not run): the slice plans with its config's profile" |
      tee "$work/slice_profile.txt"
  fi
  left=$((budget - ($(date +%s) - check_started)))
  if [ "$left" -lt 15 ]; then
    echo "$name skipped 0 $limit no time left of the check's ${budget}s" >>"$work/stages.txt"
    echo "gpu_check: stage $name skipped: no time left of the check's ${budget}s"
    failed="$failed $name"
    continue
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  started=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c "stage_$name" >"$work/$name.log" 2>&1
  status=$?
  seconds=$(($(date +%s) - started))
  result=passed
  [ "$status" -ne 0 ] && result=failed failed="$failed $name"
  [ "$status" -eq 124 ] || [ "$status" -eq 137 ] && result=timed_out
  echo "$name $result $seconds $limit exit=$status" >>"$work/stages.txt"
  echo "gpu_check: stage $name $result in ${seconds}s (limit ${limit}s)"
  if [ "$name" = smoke ] && [ "$result" != passed ]; then
    echo "gpu_check: smoke failed: the remaining stages are not run" | tee -a "$work/stages.txt"
    tail -40 "$work/smoke.log"
    break
  fi
done

summary=$out/summary.txt
{
  echo "gpu_check ($mode) $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "stages (name result seconds limit):"
  sed 's/^/  /' "$work/stages.txt"
  cat "$work/bundle.txt" "$work/slice_profile.txt" 2>/dev/null
} >"$summary"
summarised=
# A Python with h5py and numpy first (the slice's figures), else any.
for python in $(for p in /usr/bin/python3 python3; do "$p" -c 'import h5py, numpy' 2>/dev/null && echo "$p"; done) \
              /usr/bin/python3 python3; do
  if "$python" -c 'import json' 2>/dev/null; then
    "$python" "$repo/scripts/gpu_check_summary.py" "$work" >>"$summary" 2>>"$work/summary.log" && summarised=1
    break
  fi
done
[ -n "$summarised" ] || echo "headline figures: none (no Python 3 ran scripts/gpu_check_summary.py)" >>"$summary"
cp "$summary" "$work/"
tar -C "$scratch" -czf "$out/gpu-check.tar.gz" gpu-check
cat "$summary"
[ -z "$failed" ]
