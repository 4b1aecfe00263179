#!/usr/bin/env bash
# ctest scripts.slurm_array: experiments/slurm/paper-array.sbatch on the tiny
# experiment, with a stand-in `sbatch` that records what it is asked to
# submit: three array tasks write three shards, task 0 submits
# paper-merge.sbatch with a dependency on the whole array, a resubmitted task
# submits nothing, and the merge script merges every run and writes the report.
#   slurm_array.sh REPO BUILD SCRATCH
set -uo pipefail
repo=$1 build=$2 scratch=$3
fail() { echo "slurm_array: $*" >&2; exit 1; }
rm -rf "$scratch" && mkdir -p "$scratch/bin"
cat >"$scratch/bin/sbatch" <<'FAKE'
#!/usr/bin/env bash
printf '%s\n' "$@" >>"$SBATCH_RECORD"
FAKE
chmod +x "$scratch/bin/sbatch"
export PATH=$scratch/bin:$PATH SBATCH_RECORD=$scratch/sbatch.args SLURM_SUBMIT_DIR=$repo SLURM_ARRAY_JOB_ID=4242
export SHARDS=3 CONFIG=$repo/tests/cli/tiny_experiment.yaml PROFILE=$repo/tests/cli/tiny_profile.yaml
export OUTPUT=$scratch/results/tiny.h5 WRITESCOPE=$build/experiments/writescope MPLBACKEND=Agg
for task in 0 1 2; do
  SLURM_ARRAY_TASK_COUNT=3 SLURM_ARRAY_TASK_ID=$task "$repo/experiments/slurm/paper-array.sbatch" \
    >"$scratch/task$task.log" 2>&1 || fail "array task $task failed: $(tail -5 "$scratch/task$task.log")"
  [ -f "$scratch/results/tiny.shard-$task-of-3.h5" ] || fail "task $task wrote no shard file"
done
[ "$(cat "$scratch/sbatch.args")" = "$(printf '%s\n' --dependency=afterok:4242 experiments/slurm/paper-merge.sbatch)" ] ||
  fail "task 0 submitted: $(cat "$scratch/sbatch.args")"
# Task 0 resubmitted alone (an array of one) resumes its shard and submits no second merge job.
SLURM_ARRAY_TASK_COUNT=1 SLURM_ARRAY_TASK_ID=0 "$repo/experiments/slurm/paper-array.sbatch" >"$scratch/again.log" 2>&1 ||
  fail "resubmitted task 0 failed: $(tail -5 "$scratch/again.log")"
[ "$(wc -l <"$scratch/sbatch.args")" -eq 2 ] || fail "a resubmitted task submitted another merge job"
(cd "$repo" && experiments/slurm/paper-merge.sbatch) >"$scratch/merge.log" 2>&1 ||
  fail "the merge job failed: $(cat "$scratch/merge.log")"
grep -q "merged 32 runs of 32 from 3 files" "$scratch/merge.log" || fail "merge: $(cat "$scratch/merge.log")"
grep -q "32 runs, 32 verified, 0 damaged" "$scratch/merge.log" || fail "the merged file does not verify"
[ -f "$scratch/results/tiny-report/report.md" ] || fail "no report"
rm -rf "$scratch"
