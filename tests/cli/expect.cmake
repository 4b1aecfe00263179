# cmake -DCOMMAND=<exe> -DARGS=<a|b> -DEXPECTED_STATUS=<n> -DEXPECTED_REGEX=<re> -P expect.cmake
# ARGS separates the command's arguments with '|'. Runs the command and checks its exit status and combined output.
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND ${COMMAND} ${args}
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
string(REPLACE "\n" " " flat "${all}")
if(NOT status EQUAL EXPECTED_STATUS)
  message(FATAL_ERROR "exit status ${status}, expected ${EXPECTED_STATUS}; output:\n${all}")
endif()
if(NOT flat MATCHES "${EXPECTED_REGEX}")
  message(FATAL_ERROR "output does not match '${EXPECTED_REGEX}':\n${all}")
endif()
