# writescope_warnings(<target>): the project's warning set, on the target only.
# nvcc_wrapper forwards host-compiler flags itself, so the same list serves both.
function(writescope_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wno-unknown-pragmas)
endfunction()
