#!/usr/bin/env bash
# ctest scripts.slurm_array: experiments/slurm/paper-array.sbatch on the tiny
# experiment, with a stand-in `sbatch` that records what it is asked to
# submit: three array tasks write three shards, task 0 submits one merge job
# that depends on the whole array, and that job's command merges the shards
# into one file with every run and writes the report.
#   slurm_array.sh REPO BUILD SCRATCH
set -uo pipefail
repo=$1 build=$2 scratch=$3
fail() { echo "slurm_array: $*" >&2; exit 1; }
rm -rf "$scratch" && mkdir -p "$scratch/bin"
cat >"$scratch/bin/sbatch" <<'FAKE'
#!/usr/bin/env bash
printf '%s\n' "$@" >"$SBATCH_RECORD"
FAKE
chmod +x "$scratch/bin/sbatch"
export PATH=$scratch/bin:$PATH SBATCH_RECORD=$scratch/sbatch.args SLURM_SUBMIT_DIR=$scratch SLURM_ARRAY_JOB_ID=4242
export SHARDS=3 SLURM_ARRAY_TASK_COUNT=3 CONFIG=$repo/tests/cli/tiny_experiment.yaml PROFILE=$repo/tests/cli/tiny_profile.yaml
export OUTPUT=$scratch/results/tiny.h5 WRITESCOPE=$build/experiments/writescope REPORT=$repo/analysis/report.py
for task in 0 1 2; do
  SLURM_ARRAY_TASK_ID=$task "$repo/experiments/slurm/paper-array.sbatch" >"$scratch/task$task.log" 2>&1 ||
    fail "array task $task failed: $(tail -5 "$scratch/task$task.log")"
  [ -f "$scratch/results/tiny.shard-$task-of-3.h5" ] || fail "task $task wrote no shard file"
done
grep -qx -- "--dependency=afterok:4242" "$scratch/sbatch.args" || fail "the merge job does not wait for the array"
merge=$(grep -- "^--wrap=" "$scratch/sbatch.args" | sed 's/^--wrap=//')
[ -n "$merge" ] || fail "task 0 submitted no merge job"
bash -c "$merge" >"$scratch/merge.log" 2>&1 || fail "the merge job failed: $(cat "$scratch/merge.log")"
grep -q "merged 32 runs of 32 from 3 files" "$scratch/merge.log" || fail "merge: $(cat "$scratch/merge.log")"
[ -f "$scratch/results/tiny-report/report.md" ] || fail "no report"
"$WRITESCOPE" verify "$OUTPUT" | grep -q "32 runs, 32 verified, 0 damaged" || fail "the merged file does not verify"
rm -rf "$scratch"
