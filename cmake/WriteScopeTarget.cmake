# writescope_warnings(<target>): the project's warning set, on the target only.
# nvcc_wrapper forwards host-compiler flags itself, so the same list serves both.
function(writescope_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wno-unknown-pragmas)
endfunction()

# writescope_host_kernels(<target> <source>...): translation units of host
# kernels (intrinsics, GCC pragmas) that the host compiler builds alone in
# both variants, so that a CUDA build runs the same machine code on the CPU as
# a host-only build (nvcc's front end drops `#pragma GCC unroll` and needs
# every Kokkos header to come through it). They include no Kokkos header
# (framework/host_device.hpp); in a CUDA build nvcc_wrapper's --host-only runs
# its host compiler with the target's flags.
function(writescope_host_kernels target)
  target_sources(${target} PRIVATE ${ARGN})
  set_source_files_properties(${ARGN} PROPERTIES COMPILE_DEFINITIONS WRITESCOPE_HOST_COMPILER_ONLY)
  if(Kokkos_ENABLE_CUDA)
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS --host-only)
  endif()
endfunction()
