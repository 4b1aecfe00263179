# cmake -DCOMMAND=<writescope> -DSOURCE=<repo> -DFOLDER=<dir> -P run_stopped.cmake
# SIGTERM (or Ctrl-C's SIGINT) during `writescope run` stops the experiment
# after the run in progress, saying so, with exit status 128 + the signal;
# verify counts the runs still to measure, and the same command resumes them.
# A SIGINT the shell has the process ignore (a background job's) stays ignored.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}")
# Runs of a few seconds each, so that the signal comes while the second runs.
file(WRITE ${FOLDER}/slow.yaml "name: cli-slow\noutput: slow.h5\nprofile: tiny_profile.yaml\n"
  "models: [{preset: tiny-qwen3-moe}]\nsystems: [gpu-only, ktransformers]\nbatch_sizes: [2]\ncontexts: [64, 128]\n"
  "max_sequence_tokens: 5200\nbudgets: {vram: [16MiB], pinned: 4MiB, host: 64MiB}\n"
  "steps: {warmup: 1, measured: 5000}\nblock_tokens: 16\n")
set(run ${COMMAND} run ${FOLDER}/slow.yaml --profile ${SOURCE}/tests/cli/tiny_profile.yaml --output ${FOLDER}/slow.h5)
string(REPLACE ";" " " run_line "${run}")
# A background job of a shell without job control: SIGINT ignored, SIGTERM not.
execute_process(COMMAND sh -c "${run_line} >'${FOLDER}/out.txt' 2>'${FOLDER}/err.txt' & pid=$!
  tries=0
  until grep -q 'run 2/4' '${FOLDER}/err.txt' || [ $tries -ge 12000 ]; do sleep 0.05; tries=$((tries + 1)); done
  kill -INT $pid
  sleep 0.5
  grep -q 'stopping after' '${FOLDER}/err.txt' && echo taken >'${FOLDER}/sigint.txt'
  kill -TERM $pid
  wait $pid"
  RESULT_VARIABLE status)
if(EXISTS ${FOLDER}/sigint.txt)
  message(FATAL_ERROR "a SIGINT ignored for the background job stopped it")
endif()
file(READ ${FOLDER}/out.txt out)
file(READ ${FOLDER}/err.txt err)
if(NOT status EQUAL 143 OR NOT out MATCHES "slow.h5: 2 complete, 0 did not fit, 0 failed, 0 already in the file, stopped by SIGTERM"
   OR NOT err MATCHES "run: stopping after the run in progress.*run: stopped by SIGTERM before run 3/4. the file keeps the runs written")
  message(FATAL_ERROR "run stopped by SIGTERM (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/slow.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "2 runs, 2 verified, 0 damaged, 0 without a checksum. 2 of its 4 planned runs not in the file")
  message(FATAL_ERROR "verify of the stopped file (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${run} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "2 complete, 0 did not fit, 0 failed, 2 already in the file\n")
  message(FATAL_ERROR "resuming the stopped file (${status}): ${out}\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
