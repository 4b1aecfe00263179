#!/usr/bin/env bash
# The main job. Sets up everything on a fresh Debian 12 machine, builds the
# host variant, measures this machine (results/machine.yaml and the machine
# profile results/profile.yaml), runs the default experiment
# (experiments/configs/quick.yaml: every system on scaled-down models) into
# results/quick.h5 and writes its report to results/report/ (report.md and
# figures). Extra arguments go to `writescope run` (e.g. --output FILE).
# The kernel benchmarks are separate: scripts/benchmarks.sh.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$("$repo/scripts/build.sh" host)
cd "$repo"
mkdir -p results
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
"$build/experiments/writescope" info
"$build/experiments/writescope" info --format yaml >results/machine.yaml
"$build/experiments/writescope" calibrate --output results/profile.yaml
"$build/experiments/writescope" run experiments/configs/quick.yaml --profile results/profile.yaml "$@"
/usr/bin/python3 analysis/report.py results/quick.h5 -o results/report
echo "run: wrote results/quick.h5 and results/report/report.md" >&2
