# cmake -DSOURCE_DIR=<repo> -DOUTPUT=<file.cpp> -P GitRevision.cmake
# Writes the source's `git describe --always --dirty` into OUTPUT, touching the
# file only when the revision changed so that nothing relinks needlessly. A
# modified tree's revision ends in "-dirty-" and 12 hex digits of a hash of
# its changes (the diff against HEAD and the untracked files' names and
# contents): two different edits of one commit are two revisions, which
# resume and merge keep apart.
execute_process(
  COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE status ERROR_QUIET)
if(NOT status EQUAL 0 OR revision STREQUAL "")
  set(revision "unknown (not a git checkout)")
elseif(revision MATCHES "-dirty$")
  execute_process(COMMAND git -C "${SOURCE_DIR}" diff HEAD --binary
    OUTPUT_VARIABLE changes RESULT_VARIABLE diff_status ERROR_QUIET)
  execute_process(COMMAND git -C "${SOURCE_DIR}" -c core.quotePath=false ls-files --others --exclude-standard
    OUTPUT_VARIABLE untracked RESULT_VARIABLE list_status ERROR_QUIET)
  if(NOT diff_status EQUAL 0 OR NOT list_status EQUAL 0)
    message(FATAL_ERROR "GitRevision: cannot list the changes of the modified tree ${SOURCE_DIR}")
  endif()
  # A list item is split at ';' but not inside '[' ']': both brackets stand in
  # for themselves (as ASCII 1 and 2) until the item is read.
  string(ASCII 1 open)
  string(ASCII 2 close)
  string(REPLACE "[" "${open}" untracked "${untracked}")
  string(REPLACE "]" "${close}" untracked "${untracked}")
  string(REPLACE ";" "\\;" untracked "${untracked}")
  string(REPLACE "\n" ";" untracked "${untracked}")
  foreach(name IN LISTS untracked)
    string(REPLACE "${open}" "[" name "${name}")
    string(REPLACE "${close}" "]" name "${name}")
    # A name git quotes (a newline or a quote in it) is hashed as named.
    if(EXISTS "${SOURCE_DIR}/${name}" AND NOT IS_DIRECTORY "${SOURCE_DIR}/${name}")
      file(SHA256 "${SOURCE_DIR}/${name}" content)
      string(APPEND changes "untracked ${name} ${content}\n")
    elseif(NOT name STREQUAL "")
      string(APPEND changes "untracked ${name}\n")
    endif()
  endforeach()
  string(SHA256 digest "${changes}")
  string(SUBSTRING "${digest}" 0 12 digest)
  set(revision "${revision}-${digest}")
endif()
set(content "extern \"C\" const char* writescope_git_revision_string() { return \"${revision}\"; }\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" previous)
endif()
if(NOT "${previous}" STREQUAL "${content}")
  file(WRITE "${OUTPUT}" "${content}")
endif()
