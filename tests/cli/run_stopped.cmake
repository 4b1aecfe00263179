# cmake -DCOMMAND=<writescope> -DPYTHON=<python3> -DSOURCE=<repo> -DFOLDER=<dir> -P run_stopped.cmake
# SIGTERM (or Ctrl-C's SIGINT) during `writescope run` stops the experiment
# after the run in progress, saying so, and then dies of that signal;
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
# Started as a background job of a shell without job control is (SIGINT
# ignored): SIGINT changes nothing, SIGTERM stops it after the run in
# progress, and it then dies of SIGTERM itself, so that a calling script stops.
execute_process(COMMAND ${PYTHON} -c "
import signal, subprocess, sys, time
folder, run = sys.argv[1], sys.argv[2:]
with open(folder + '/out.txt', 'w') as out, open(folder + '/err.txt', 'w') as err:
    child = subprocess.Popen(run, stdout=out, stderr=err,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.time() + 600
    while 'run 2/4' not in open(folder + '/err.txt').read() and time.time() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    time.sleep(0.5)
    if 'stopping after' in open(folder + '/err.txt').read():
        sys.exit('a SIGINT ignored for the background job stopped it')
    child.send_signal(signal.SIGTERM)
    status = child.wait()
    if status != -signal.SIGTERM:
        sys.exit(f'status {status}, not death by SIGTERM')
" ${FOLDER} ${run}
  RESULT_VARIABLE status ERROR_VARIABLE python_err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${python_err}")
endif()
file(READ ${FOLDER}/out.txt out)
file(READ ${FOLDER}/err.txt err)
if(NOT out MATCHES "slow.h5: 2 complete, 0 did not fit, 0 failed, 0 already in the file, stopped by SIGTERM"
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
