# cmake -DCOMMAND=<writescope> -DFOLDER=<dir> -P outputs_that_are_not_files.cmake
# Outputs a user may name that are not a plain file in a folder.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}")
# A named pipe: refused before any measuring, neither read (which would wait
# for a writer forever) nor replaced by a regular file.
execute_process(COMMAND mkfifo ${FOLDER}/pipe RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "mkfifo failed (${status})")
endif()
execute_process(COMMAND ${COMMAND} calibrate --output ${FOLDER}/pipe --tokens 256 --thread-counts 1
  TIMEOUT 60 RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 2 OR NOT err MATCHES "calibrate: --output .*/pipe is a pipe, not a file. give a file name")
  message(FATAL_ERROR "a pipe as --output: status ${status}; stderr:\n${err}")
endif()
execute_process(COMMAND sh -c "test -p \"$0\"" ${FOLDER}/pipe RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the pipe was replaced")
endif()
# A symbolic link to an earlier profile: the profile goes to the target, the link stays.
file(WRITE ${FOLDER}/target.yaml "")
file(CREATE_LINK target.yaml ${FOLDER}/link.yaml SYMBOLIC)
execute_process(COMMAND ${COMMAND} calibrate --output ${FOLDER}/link.yaml --tokens 256 --thread-counts 1
  RESULT_VARIABLE status ERROR_VARIABLE err)
file(READ ${FOLDER}/target.yaml profile)
if(NOT IS_SYMLINK ${FOLDER}/link.yaml)
  message(FATAL_ERROR "through a link: the link was replaced (status ${status}); stderr:\n${err}")
endif()
if(NOT status EQUAL 0 OR NOT profile MATCHES "cpu:")
  message(FATAL_ERROR "through a link: status ${status}; target:\n${profile}\nstderr:\n${err}")
endif()
# Output that cannot be written (a full disk) is an error, not status 0 with nothing written.
execute_process(COMMAND sh -c "\"$0\" info --format yaml > /dev/full" ${COMMAND}
  RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "writescope: info: the output could not be written \\(No space left on device\\)")
  message(FATAL_ERROR "info > /dev/full: status ${status}; stderr:\n${err}")
endif()
execute_process(COMMAND sh -c "\"$0\" help > /dev/full" ${COMMAND} RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT err MATCHES "writescope: help: the output could not be written \\(No space left on device\\)")
  message(FATAL_ERROR "help > /dev/full: status ${status}; stderr:\n${err}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
