# cmake -DCOMMAND=<writescope> -DPYTHON=<python3> -DSOURCE=<repo> -DFOLDER=<dir> -P run_report.cmake
# What ./run.sh does, on a tiny experiment: `writescope run` writes the results
# file (5 baselines and WriteScope with each of the 3 shared expert policies,
# 2 models x 2 contexts: 32 runs), a second run resumes (measures nothing), and
# report.py writes the report with its figures and both comparison tables.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}")
set(config ${SOURCE}/tests/cli/tiny_experiment.yaml)
set(profile ${SOURCE}/tests/cli/tiny_profile.yaml)
execute_process(COMMAND ${COMMAND} run ${config} --profile ${profile} --output ${FOLDER}/tiny.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "complete, [0-9]+ did not fit, 0 failed, 0 already in the file")
  message(FATAL_ERROR "run failed (${status}): ${out}\n${err}")
endif()
if(NOT err MATCHES "run 1/32: tiny-qwen3-moe gpu-only b2 64")
  message(FATAL_ERROR "no progress lines: ${err}")
endif()
execute_process(COMMAND ${COMMAND} run ${config} --profile ${profile} --output ${FOLDER}/tiny.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "0 complete, 0 did not fit, 0 failed, 32 already in the file")
  message(FATAL_ERROR "resume failed (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${PYTHON} ${SOURCE}/analysis/report.py ${FOLDER}/tiny.h5 -o ${FOLDER}/report
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "report failed (${status}): ${out}\n${err}")
endif()
foreach(figure report.md speedup_tiny-qwen3-moe.png alpha_tiny-deepseek-v2.png breakdown_tiny-qwen3-moe.png
        predicted_vs_measured.png roofline.png)
  if(NOT EXISTS ${FOLDER}/report/${figure})
    message(FATAL_ERROR "report.py did not write ${figure}")
  endif()
endforeach()
# WriteScope ran with each baseline's expert policy: both comparisons are there.
file(READ ${FOLDER}/report/report.md report)
if(NOT report MATCHES "same expert policy" OR NOT report MATCHES "System against system")
  message(FATAL_ERROR "report.md lacks the two comparison tables:\n${report}")
endif()
# Every run carries a checksum that `writescope verify` and report.py agree on;
# a run damaged behind it is found by both and measured again by `run`.
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/tiny.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "32 runs, 32 verified, 0 damaged, 0 without a checksum")
  message(FATAL_ERROR "verify of the intact file (${status}): ${out}\n${err}")
endif()
if(report MATCHES "damaged")
  message(FATAL_ERROR "report.py found damage in an intact file:\n${report}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
with h5py.File(sys.argv[1], 'r+') as f:
    run = f['runs'][sorted(f['runs'])[0]]
    run['step_seconds'][0] *= 0.5
    print(run.name)
" ${FOLDER}/tiny.h5 RESULT_VARIABLE status OUTPUT_VARIABLE damaged ERROR_VARIABLE err)
string(STRIP "${damaged}" damaged)
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/tiny.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT out MATCHES "DAMAGED .*checksum mismatch.*32 runs, 31 verified, 1 damaged")
  message(FATAL_ERROR "verify of the damaged file (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${PYTHON} ${SOURCE}/analysis/report.py ${FOLDER}/tiny.h5 -o ${FOLDER}/report
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ ${FOLDER}/report/report.md report)
if(NOT status EQUAL 0 OR NOT err MATCHES "${damaged}: checksum mismatch" OR NOT report MATCHES "1 damaged runs left out")
  message(FATAL_ERROR "report.py did not flag ${damaged} (${status}): ${err}")
endif()
execute_process(COMMAND ${COMMAND} run ${config} --profile ${profile} --output ${FOLDER}/tiny.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "31 already in the file" OR NOT err MATCHES "checksum mismatch.*measuring it again")
  message(FATAL_ERROR "run did not measure the damaged run again (${status}): ${out}\n${err}")
endif()
# The projection: the measured runs priced with their own profile, then the
# experiment priced on two shipped GPU profiles with this profile's CPU, its
# report titled as a projection; measured runs are never overwritten.
execute_process(COMMAND ${COMMAND} predict --compare ${FOLDER}/tiny.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "writescope\\[hybrimoe\\] +step.*median error [0-9.]+% \\(worst [0-9.]+%\\) over 32 runs"
   OR NOT err MATCHES "predict --compare: 32 complete runs to price")
  message(FATAL_ERROR "predict --compare (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${COMMAND} predict ${config} --profile h200-pcie5,a100-pcie4 --cpu-from ${profile}
                        --output ${FOLDER}/projected.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0 OR NOT out MATCHES "projected.h5: [0-9]+ predicted, [0-9]+ do not fit, 0 failed \\(projected, not measured\\)")
  message(FATAL_ERROR "predict (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${PYTHON} ${SOURCE}/analysis/report.py ${FOLDER}/projected.h5 -o ${FOLDER}/projected
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ ${FOLDER}/projected/report.md projected)
if(NOT status EQUAL 0 OR NOT projected MATCHES "^# Projected \\(not measured\\)"
   OR NOT EXISTS ${FOLDER}/projected/projected_speedup_a100-pcie4_cpu_cli-test.png)
  file(GLOB written ${FOLDER}/projected/*)
  message(FATAL_ERROR "report of the projection (${status}): ${err}\n${written}\n${projected}")
endif()
execute_process(COMMAND ${COMMAND} predict ${config} --profile h200-pcie5 --cpu-from ${profile} --output ${FOLDER}/tiny.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "tiny.h5 holds measured runs; a projection never overwrites them")
  message(FATAL_ERROR "predict over measured runs (${status}): ${out}\n${err}")
endif()
# A run whose recorded settings were edited fails its checksum: said once, as damaged.
file(COPY_FILE ${FOLDER}/tiny.h5 ${FOLDER}/settings.h5)
execute_process(COMMAND ${PYTHON} -c "
import sys, h5py
with h5py.File(sys.argv[1], 'r+') as f:
    run = f['runs'][sorted(f['runs'])[1]]
    settings = run.attrs['config']
    settings = settings.decode() if isinstance(settings, bytes) else settings
    run.attrs['config'] = settings.replace('seed: 1', 'seed: 2')
" ${FOLDER}/settings.h5 RESULT_VARIABLE status)
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/settings.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR out MATCHES "STRAY" OR NOT out MATCHES "DAMAGED .*32 runs, 31 verified, 1 damaged, 0 without a checksum\n")
  message(FATAL_ERROR "verify of a run with edited settings (${status}): ${out}\n${err}")
endif()
# verify names a run group that is no run of the experiment, and where the
# recorded profile no longer reads, says so and still gives the checksums' count.
file(COPY_FILE ${FOLDER}/tiny.h5 ${FOLDER}/edited.h5)
execute_process(COMMAND ${PYTHON} -c "
import re, sys, h5py
with h5py.File(sys.argv[1], 'r+') as f:
    f['runs'].move(sorted(f['runs'])[0], 'renamed')
" ${FOLDER}/edited.h5 RESULT_VARIABLE status)
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/edited.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
# The renamed run's own id is one of the 32 planned runs, and no longer in the file.
if(NOT status EQUAL 1 OR NOT out MATCHES "STRAY renamed: not a run of the file's experiment.*32 runs, 32 verified, 0 damaged, 0 without a checksum, 1 not of the experiment. 1 of its 32 planned runs not in the file")
  message(FATAL_ERROR "verify of a renamed run (${status}): ${out}\n${err}")
endif()
execute_process(COMMAND ${PYTHON} -c "
import re, sys, h5py
with h5py.File(sys.argv[1], 'r+') as f:
    yaml = f['profile'].attrs['yaml']
    yaml = yaml.decode() if isinstance(yaml, bytes) else yaml
    f['profile'].attrs['yaml'] = re.sub(r'threads: [0-9]+', 'threads: 600', yaml)
" ${FOLDER}/edited.h5 RESULT_VARIABLE status)
execute_process(COMMAND ${COMMAND} verify ${FOLDER}/edited.h5 RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT out MATCHES "cannot check which runs belong to the experiment: .*cpu.threads.*32 runs, 32 verified")
  message(FATAL_ERROR "verify of a file whose profile does not read (${status}): ${out}\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
