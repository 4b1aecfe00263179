# cmake -DCOMMAND=<writescope> -DFOLDER=<dir> -P errors_after_the_output_before_them.cmake
# Standard output and error into one pipe (a batch job's log): an error shows
# after the output written before it. A profile that cannot be saved (a file
# size limit of 0, as a full disk) is printed, then the error.
file(REMOVE_RECURSE "${FOLDER}")
file(MAKE_DIRECTORY "${FOLDER}")
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 0; exec \"$0\" calibrate --output \"$1\" --tokens 256 --thread-counts 1 2>&1"
                        ${COMMAND} ${FOLDER}/profile.yaml
                COMMAND cat
  RESULTS_VARIABLE statuses OUTPUT_VARIABLE log)
list(GET statuses 0 status)
if(NOT status EQUAL 1 OR NOT log MATCHES "\ncpu:\n(.|\n)*\nwritescope: .*profile.yaml[^\n]*: cannot write the machine profile")
  message(FATAL_ERROR "status ${status}; the profile, then the error, expected in:\n${log}")
endif()
file(REMOVE_RECURSE "${FOLDER}")
