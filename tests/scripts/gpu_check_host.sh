#!/usr/bin/env bash
# ctest scripts.gpu_check_host: scripts/gpu_check.sh --host on this build
# writes exactly summary.txt and gpu-check.tar.gz, runs every stage, and its
# summary carries the slice's checks; with a smoke stage that fails it stops
# there, says so, and still packs what it has; out of its seconds
# (WRITESCOPE_GPU_CHECK_SECONDS) it skips the stages left and still packs;
# where MLA runs on AMX it also runs MLA on the vector path; over a carried
# bundle (the GPU machine's flow) it says whether the bundle is stale; a
# budget that is not a number is one error, and so are a stage name that is
# no stage, a second argument and an OUT that cannot be a folder (before
# anything runs); a benchmark stage whose filter matches none fails.
#   gpu_check_host.sh REPO BUILD SCRATCH
set -uo pipefail
repo=$1 build=$2 scratch=$3
fail() { echo "gpu_check_host: $*" >&2; [ -f "$out/summary.txt" ] && cat "$out/summary.txt" >&2; exit 1; }
# Whether folder $1 holds exactly the check's two files.
two_files() { [ "$(ls "$1" | tr '\n' ' ')" = "gpu-check.tar.gz summary.txt " ]; }
# A build folder $1 whose three programs are the shell command $2.
stand_in_build() {
  local program
  mkdir -p "$1/experiments" "$1/tests" "$1/benchmarks"
  for program in experiments/writescope tests/writescope_tests benchmarks/writescope_benchmarks; do
    printf '#!/bin/sh\n%s\n' "$2" >"$1/$program" && chmod +x "$1/$program"
  done
}
rm -rf "$scratch" && mkdir -p "$scratch"

out=$scratch/out
OUT=$out WRITESCOPE_BUILD=$build "$repo/scripts/gpu_check.sh" --host >"$scratch/check.log" 2>&1 ||
  fail "the check failed on the host build (see $scratch/check.log)"
two_files "$out" || fail "expected 2 files in $out, got: $(ls "$out")"
for stage in smoke tests calibrate benchmarks host_kernels slice; do
  grep -q "^  $stage passed " "$out/summary.txt" || fail "stage $stage is not reported passed"
done
for line in "tests: [0-9]+ tests, 0 failed" "split_decode/qwen3_gqa_band/32768/50 +share 0.50" \
            "^  amx_bf16: (decode attention and the bf16 linear layer on AMX tiles|not offered: [A-Za-z])" \
            "^  qwen3-30b-a3b +(l1|l2)(, passes of [0-9]+ tokens)? \(" "^  qwen3-30b-a3b +([0-9]+ tokens|not measured) \(" \
            "check: alpha strictly between 0 and 1: yes" "check: at least half of WriteScope's KV outside VRAM: yes" \
            "speedup of writescope over the best baseline" \
            "cpu_decode/qwen3_gqa_cpu_resident/8192 .* of roofline .* of the rates sampled while it ran" \
            "prefill/qwen3_gqa/4096 +[0-9]+ GFLOP/s  [0-9.]+ of (avx2|avx512_fma|avx512_bf16|scalar) [0-9]+ GFLOP/s \([0-9]+ us a prompt token, 2 threads\)" \
            "expert_linear/bf16_writescope/8/768/2048 .* of roofline .*, 2 threads\); .* of the rates sampled.*; L2 reads [0-9.]+ of their fastest" \
            "cpu_experts/qwen3/tokens:1/batched:1 .* of roofline .*, 2 threads\); .* of the rates sampled.*; L2 reads [0-9.]+ of their fastest" \
            "cpu_decode_from_cache/qwen3_gqa_cpu_resident .* of .* tokens, 2 threads\); .* of the rate sampled.*; L2 reads [0-9.]+ of their fastest" \
            "host_overlap/fmas_per_line:16 +[0-9.]+  [0-9.]+ of min\(DRAM [0-9]+, in cache [0-9]+\): the most a kernel of 4 multiply-adds per byte reaches here"; do
  grep -Eq "$line" "$out/summary.txt" || fail "summary.txt lacks '$line'"
done
archive=$(tar -tzf "$out/gpu-check.tar.gz")
for file in summary.txt stages.txt tests.xml profile.yaml benchmarks.json host_kernels.json slice.h5 \
            slice-report/report.md; do
  grep -qx "gpu-check/$file" <<<"$archive" || fail "the archive lacks $file"
done

# A smoke stage that fails: programs that exit 1 stand in for the build.
broken=$scratch/broken
stand_in_build "$broken" 'echo "stand-in failure"; exit 1'
out=$scratch/out-broken
if OUT=$out WRITESCOPE_BUILD=$broken "$repo/scripts/gpu_check.sh" --host >"$scratch/broken.log" 2>&1; then
  fail "a failing smoke stage exited 0"
fi
grep -q "^  smoke failed " "$out/summary.txt" || fail "the failed smoke stage is not in summary.txt"
grep -q "the remaining stages are not run" "$out/summary.txt" || fail "summary.txt does not say the check stopped"
grep -q "^  tests " "$out/summary.txt" && fail "stages after a failed smoke stage ran"
two_files "$out" || fail "expected 2 files after a failed smoke stage"
# A check that runs out of its seconds: stand-ins that pass after 4 s (smoke
# runs two: 8 s); with 20 s for the whole check, smoke runs, every later stage
# is skipped, and the results are still packed.
slow=$scratch/slow
stand_in_build "$slow" 'sleep 4'
out=$scratch/out-slow
if OUT=$out WRITESCOPE_BUILD=$slow WRITESCOPE_GPU_CHECK_SECONDS=20 "$repo/scripts/gpu_check.sh" --host \
     >"$scratch/slow.log" 2>&1; then
  fail "a check whose stages were skipped for time exited 0"
fi
grep -q "^  smoke passed " "$out/summary.txt" || fail "smoke did not run within the check's seconds"
for stage in tests calibrate benchmarks host_kernels slice; do
  grep -q "^  $stage skipped 0 [0-9]* no time left of the check's 20s" "$out/summary.txt" ||
    fail "stage $stage is not reported skipped for time"
done
two_files "$out" || fail "expected 2 files after a check out of time"
# A host whose `writescope info` says decode runs on AMX tiles: the
# host_kernels stage runs those kernels again with the vector path it names
# pinned. Stand-ins write
# the path they ran with and their filter as their JSON.
amx=$scratch/amx
stand_in_build "$amx" 'case "$1" in info) echo "  amx_bf16: decode attention and the bf16 linear layer on AMX tiles; the other kernels on avx512_fma" ;; esac
for arg; do case "$arg" in --benchmark_out=*)
  printf "{\"context\": {\"cpu_path\": \"%s\", \"filter\": \"%s\"}, \"benchmarks\": [{\"name\": \"stand-in\", \"run_name\": \"stand-in\", \"run_type\": \"iteration\"}]}\n" "${WRITESCOPE_CPU_PATH:-}" "$1" >"${arg#--benchmark_out=}" ;;
esac; done'
out=$scratch/out-amx
OUT=$out WRITESCOPE_BUILD=$amx WRITESCOPE_GPU_CHECK_STAGES=smoke,host_kernels "$repo/scripts/gpu_check.sh" --host \
  >"$scratch/amx.log" 2>&1 || fail "the check with AMX stand-ins failed (see $scratch/amx.log)"
vector_run=$(tar -xzOf "$out/gpu-check.tar.gz" gpu-check/host_kernels_vector.json 2>/dev/null) ||
  fail "on AMX the archive lacks host_kernels_vector.json"
grep -q '"cpu_path": "avx512_fma", "filter": "--benchmark_filter=^cpu_decode_from_cache/deepseek_mla_cpu_resident/"' \
  <<<"$vector_run" || fail "the vector path's run was not pinned to avx512_fma: $vector_run"
grep -q '"cpu_path": "",' <<<"$(tar -xzOf "$out/gpu-check.tar.gz" gpu-check/host_kernels.json)" ||
  fail "the host_kernels run had a path pinned"
# The GPU machine's flow over a carried bundle, with stand-ins for its
# programs, in a tree of its own: the summary says whether the bundle was
# built from the tree's sources; calibrate runs at 1 thread and all of
# `writescope info`'s host_threads; where calibrate fails the slice still
# runs, with its config's profile, and the summary says so.
tree=$scratch/tree
mkdir -p "$tree/scripts" "$tree/experiments/configs" "$scratch/pack/gpu-bundle/bin"
cp "$repo/scripts/gpu_check.sh" "$repo/scripts/gpu_check_summary.py" "$tree/scripts/"
touch "$tree/experiments/configs/h200-slice.yaml"
echo "source" >"$tree/source.txt"
(cd "$tree" && sha256sum source.txt experiments/configs/h200-slice.yaml) >"$scratch/pack/gpu-bundle/sources.sha256"
for program in writescope writescope_tests writescope_benchmarks; do
  printf '#!/bin/sh
case "$1" in info) echo "  host_threads: 6" ;; calibrate) echo "calibrate $*"; exit 1 ;; run) echo "run $*" ;; esac
' \
    >"$scratch/pack/gpu-bundle/bin/$program"
  chmod +x "$scratch/pack/gpu-bundle/bin/$program"
done
tar -C "$scratch/pack" -cJf "$tree/gpu-bundle.tar.xz" gpu-bundle
out=$scratch/out-bundle
OUT=$out WRITESCOPE_GPU_CHECK_STAGES=smoke,calibrate,slice "$tree/scripts/gpu_check.sh" >"$scratch/bundle.log" 2>&1
grep -q "^bundle: built from this tree's sources (2 files)" "$out/summary.txt" ||
  fail "the summary does not say the bundle matches the tree"
grep -q "^  smoke passed " "$out/summary.txt" || fail "smoke with stand-ins did not pass (see $scratch/bundle.log)"
tar -xzOf "$out/gpu-check.tar.gz" gpu-check/calibrate.log | grep -q -- "--thread-counts 1,6$" ||
  fail "calibrate did not run at 1 and 6 threads"
grep -q "^  slice " "$out/summary.txt" || fail "the slice did not run after calibrate failed"
tar -xzOf "$out/gpu-check.tar.gz" gpu-check/slice.log | grep -q "^run .*h200-slice.yaml --output" ||
  fail "the slice did not run with its config's profile after calibrate failed"
grep -q "no measured profile (calibrate failed or did not run): the slice plans with its config's profile" "$out/summary.txt" ||
  fail "the summary does not say the slice planned with its config's profile"
echo "changed" >"$tree/source.txt"
out=$scratch/out-stale
OUT=$out WRITESCOPE_GPU_CHECK_STAGES=smoke "$tree/scripts/gpu_check.sh" >"$scratch/stale.log" 2>&1
grep -q "^bundle: STALE: 1 of its 2 source files differ in this tree: source.txt" "$out/summary.txt" ||
  fail "the summary does not name the source that changed since the bundle was built"
# A budget that is not a number: one error naming the variable, nothing run.
if message=$(OUT=$scratch/out-bad WRITESCOPE_BUILD=$slow WRITESCOPE_GPU_CHECK_SECONDS=5m \
               "$repo/scripts/gpu_check.sh" --host 2>&1); then
  fail "a budget of '5m' was accepted"
fi
grep -q "WRITESCOPE_GPU_CHECK_SECONDS must be a whole number of seconds, not '5m'" <<<"$message" ||
  fail "the bad budget's error does not name it: $message"
[ -e "$scratch/out-bad" ] && fail "a check with a bad budget wrote $scratch/out-bad"
# Mistakes that would cost a device call are refused before anything runs:
# a stage name that is no stage, no stage named, a second argument, an OUT that cannot be a folder.
for mistake in "STAGES=smoke,bench" "STAGES=smoke, tests" "STAGES=" "ARGUMENT=--host extra" "OUT=$scratch/two_files_of_out/sub"; do
  stages=smoke arguments=--host out=$scratch/out-mistake
  case $mistake in
    STAGES=*) stages=${mistake#STAGES=} ;;
    ARGUMENT=*) arguments=${mistake#ARGUMENT=} ;;
    OUT=*) out=${mistake#OUT=} ;;
  esac
  touch "$scratch/two_files_of_out"
  # shellcheck disable=SC2086 # the arguments split as a shell gives them
  message=$(OUT=$out WRITESCOPE_BUILD=$slow WRITESCOPE_GPU_CHECK_STAGES=$stages "$repo/scripts/gpu_check.sh" $arguments 2>&1)
  status=$?
  [ "$status" -eq 2 ] || fail "$mistake: exit status $status, not 2: $message"
  [ -e "$scratch/out-mistake" ] && fail "$mistake: it wrote $scratch/out-mistake"
  grep -q "sleep\|stage smoke" <<<"$message" && fail "$mistake: a stage ran: $message"
done
grep -q "names 'bench', not a stage (comma-separated, no spaces); stages: smoke,tests" <<<"$(OUT=$scratch/out-mistake WRITESCOPE_GPU_CHECK_STAGES=bench \
  "$repo/scripts/gpu_check.sh" --host 2>&1)" || fail "an unknown stage's error does not name it"
# A benchmark filter that matches nothing: Google Benchmark exits 0 with no
# runs; the stage fails, and the summary says the file holds none.
empty=$scratch/empty
stand_in_build "$empty" 'for arg; do case "$arg" in --benchmark_out=*) echo "{\"benchmarks\": []}" >"${arg#--benchmark_out=}" ;; esac; done'
out=$scratch/out-empty
if OUT=$out WRITESCOPE_BUILD=$empty WRITESCOPE_GPU_CHECK_STAGES=smoke,benchmarks "$repo/scripts/gpu_check.sh" --host \
     >"$scratch/empty.log" 2>&1; then
  fail "a benchmarks stage that ran no benchmark exited 0"
fi
grep -q "^  benchmarks failed " "$out/summary.txt" || fail "the benchmarks stage without runs is not reported failed"
tar -xzOf "$out/gpu-check.tar.gz" gpu-check/benchmarks.log | grep -q "no benchmark in benchmarks.json (the filter" ||
  fail "the benchmarks stage does not say its filter matched none"
grep -q "^profile: no profile.yaml (the stage did not run)" "$out/summary.txt" ||
  fail "the summary does not say calibrate did not run"
echo "gpu_check_host: passed"
