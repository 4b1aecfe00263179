# cmake -DCOMMAND=<writescope> -DFOLDER=<dir> -P make_checkpoint_failed_write.cmake
# A checkpoint whose files cannot be written in full (here a file size limit
# of 0, as a full disk) is one error, and leaves no half checkpoint behind,
# which a second try would take for an existing one.
file(REMOVE_RECURSE "${FOLDER}")
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 0; exec \"$0\" make-checkpoint --model tiny-mixtral --output \"$1\""
                        ${COMMAND} ${FOLDER}
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "make-checkpoint --output: .*/model.safetensors: write failed \\(File too large\\)")
  message(FATAL_ERROR "status ${status}; stderr:\n${err}")
endif()
if(EXISTS ${FOLDER}/config.json OR EXISTS ${FOLDER}/model.safetensors OR EXISTS ${FOLDER}/model.safetensors.partial)
  message(FATAL_ERROR "a half checkpoint is left in ${FOLDER}")
endif()
# Killed part-way (the file size limit's signal, as a Ctrl-C would): no
# file under a checkpoint's names, and the next try writes the checkpoint.
execute_process(COMMAND sh -c "ulimit -f 100; exec \"$0\" make-checkpoint --model tiny-mixtral --output \"$1\""
                        ${COMMAND} ${FOLDER}
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(status EQUAL 0 OR EXISTS ${FOLDER}/config.json OR EXISTS ${FOLDER}/model.safetensors)
  message(FATAL_ERROR "killed while writing (${status}), it left a checkpoint's file in ${FOLDER}")
endif()
execute_process(COMMAND ${COMMAND} make-checkpoint --model tiny-mixtral --output ${FOLDER}
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the second try failed (${status}):\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
