# cmake -DCOMMAND=<writescope> -DCONFIG_DIR=<tests/cli> -DFOLDER=<dir> -P refused_before_any_work.cmake
# Inputs that cannot work get one message naming the file and the field,
# before any work, and leave no file behind.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}/existing")
file(WRITE "${FOLDER}/afile" "")
file(READ "${CONFIG_DIR}/tiny_experiment.yaml" experiment)
set(profile "${CONFIG_DIR}/tiny_profile.yaml")

# predict without --output writes beside the config's output: a folder there is refused, not written as "-predicted".
foreach(case "slash|${FOLDER}/existing/|ends in '/', as a folder does"
             "folder|${FOLDER}/existing|is a folder")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 name)
  list(GET case 1 output)
  list(GET case 2 why)
  string(REPLACE "output: tiny.h5" "output: ${output}" config "${experiment}")
  file(WRITE "${FOLDER}/${name}.yaml" "${config}")
  execute_process(COMMAND ${COMMAND} predict ${FOLDER}/${name}.yaml --profile ${profile}
    RESULT_VARIABLE status ERROR_VARIABLE err)
  file(GLOB written "${FOLDER}/existing/*" "${FOLDER}/*predicted*")
  if(NOT status EQUAL 1 OR written OR NOT err MATCHES
     "^writescope: configuration error: [^\n]*/${name}.yaml: field 'output': [^\n]*/existing/? ${why}. give a results file name \\(predict writes beside it, with -predicted before .h5\\)\n$")
    message(FATAL_ERROR "predict, output ${output}: status ${status}, written '${written}'; stderr:\n${err}")
  endif()
endforeach()
# Its folder cannot be made: the config and its field are named, not an --output never given.
string(REPLACE "output: tiny.h5" "output: ${FOLDER}/afile/x.h5" config "${experiment}")
file(WRITE "${FOLDER}/in_a_file.yaml" "${config}")
execute_process(COMMAND ${COMMAND} predict ${FOLDER}/in_a_file.yaml --profile ${profile}
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES
   "^writescope: predict: [^\n]*/in_a_file.yaml: field 'output', with -predicted: [^\n]*/afile/x-predicted.h5: its folder [^\n]*/afile cannot be created \\(Not a directory\\)\n$")
  message(FATAL_ERROR "predict, output in a file: status ${status}; stderr:\n${err}")
endif()

# A budget that cannot hold the prompt: one refusal, no warning first, no logits file.
execute_process(COMMAND ${COMMAND} generate --model tiny-qwen3-moe --prompt 1,2 --new-tokens 50 --vram-budget 2.9MiB
                        --host-budget 1 --logits ${FOLDER}/refused.h5
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR EXISTS ${FOLDER}/refused.h5 OR err MATCHES "warning" OR NOT out STREQUAL "" OR NOT err MATCHES
   "writescope: generate: the prompt's 2 tokens need [0-9]+ KV blocks \\([0-9]+ layers x 1 of 256 tokens\\) but --vram-budget and --host-budget hold 0. give larger budgets\n$")
  message(FATAL_ERROR "generate, no room for the prompt: status ${status}; stdout:\n${out}\nstderr:\n${err}")
endif()

# merge takes results files: a logits file is named as what it is, and no output is made.
execute_process(COMMAND ${COMMAND} generate --model tiny-qwen3-moe --prompt 1,2 --new-tokens 2 --logits ${FOLDER}/logits.h5
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "generate --logits: status ${status}; stderr:\n${err}")
endif()
execute_process(COMMAND ${COMMAND} merge ${FOLDER}/merged.h5 ${FOLDER}/logits.h5
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR EXISTS ${FOLDER}/merged.h5 OR NOT err MATCHES
   "^writescope: merge: [^\n]*/logits.h5 is not a writescope results file \\(format 'writescope-logits-1', not 'writescope-results-1'\\). merge combines the results files of writescope run\n$")
  message(FATAL_ERROR "merge of a logits file: status ${status}; stderr:\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
