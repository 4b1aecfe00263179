#!/usr/bin/env bash
# The main job. Sets up everything on a fresh Debian 12 machine, builds the
# host variant, describes and measures this machine (results/machine.yaml; the
# machine profile results/profile.yaml, measured once: remove it to measure
# again), runs the default experiment (experiments/configs/quick.yaml: every
# system on scaled-down models) into results/quick.h5 and writes its report
# to results/report/ (report.md and figures). A second run resumes: runs
# already in results/quick.h5 are kept. Without a GPU it also projects the
# same experiment onto the shipped GPU profiles with this machine's CPU
# figures (writescope predict, results/projected.h5 and
# results/projected-report/, every title "Projected (not measured)") and says
# how far the projection is from this machine's measured runs
# (results/prediction-error.txt). The kernel benchmarks are separate:
# scripts/benchmarks.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$("$repo/scripts/build.sh" host)
cd "$repo"
mkdir -p results
"$build/experiments/writescope" info
"$build/experiments/writescope" info --format yaml >results/machine.yaml
[ -f results/profile.yaml ] || "$build/experiments/writescope" calibrate --output results/profile.yaml
# A run that fails is recorded in the file, and the report is written either
# way; an error that stops the experiment (a file of another build, say) prints
# no summary line, and then the old file is not reported as this run's.
status=0
summary=$("$build/experiments/writescope" run experiments/configs/quick.yaml --profile results/profile.yaml \
  --output results/quick.h5) || status=$?
if [ -z "$summary" ]; then
  echo "run: the experiment stopped (the error above); results/quick.h5 and results/report/ are as they were" >&2
  exit "$status"
fi
echo "$summary"
/usr/bin/python3 analysis/report.py results/quick.h5 -o results/report
echo "run: wrote results/quick.h5 and results/report/report.md" >&2
if grep -q "^has_gpu: false" results/profile.yaml; then
  "$build/experiments/writescope" predict --compare results/quick.h5 >results/prediction-error.txt || status=$?
  cat results/prediction-error.txt
  "$build/experiments/writescope" predict experiments/configs/quick.yaml --profile h200-pcie5,a100-pcie4,v100-pcie3 \
    --cpu-from results/profile.yaml --output results/projected.h5 || status=$?
  /usr/bin/python3 analysis/report.py results/projected.h5 -o results/projected-report || status=$?
  echo "run: projected (not measured) onto the shipped GPU profiles with this machine's CPU:" \
    "results/projected.h5, results/projected-report/report.md" >&2
fi
exit $status
