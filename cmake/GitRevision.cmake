# cmake -DSOURCE_DIR=<repo> -DOUTPUT=<file.cpp> -P GitRevision.cmake
# Writes the source's `git describe --always --dirty` into OUTPUT, touching the
# file only when the revision changed so that nothing relinks needlessly.
execute_process(
  COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE status ERROR_QUIET)
if(NOT status EQUAL 0 OR revision STREQUAL "")
  set(revision "unknown (not a git checkout)")
endif()
set(content "extern \"C\" const char* writescope_git_revision_string() { return \"${revision}\"; }\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" previous)
endif()
if(NOT "${previous}" STREQUAL "${content}")
  file(WRITE "${OUTPUT}" "${content}")
endif()
