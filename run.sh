#!/usr/bin/env bash
# The main job. Sets up everything on a fresh Debian 12 machine, builds the
# host variant, describes and measures this machine (results/machine.yaml; the
# machine profile results/profile.yaml, measured once: remove it to measure
# again), runs the default experiment (experiments/configs/quick.yaml: every
# system on scaled-down models) into results/quick.h5 and writes its report
# to results/report/ (report.md and figures). A second run resumes: runs
# already in results/quick.h5 are kept. The kernel benchmarks are separate:
# scripts/benchmarks.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$("$repo/scripts/build.sh" host)
cd "$repo"
mkdir -p results
"$build/experiments/writescope" info
"$build/experiments/writescope" info --format yaml >results/machine.yaml
[ -f results/profile.yaml ] || "$build/experiments/writescope" calibrate --output results/profile.yaml
# A run that fails is recorded in the file; the report is written either way.
status=0
"$build/experiments/writescope" run experiments/configs/quick.yaml --profile results/profile.yaml \
  --output results/quick.h5 || status=$?
/usr/bin/python3 analysis/report.py results/quick.h5 -o results/report
echo "run: wrote results/quick.h5 and results/report/report.md" >&2
exit $status
