#pragma once
// WRITESCOPE_INLINE_FUNCTION marks the small functions that kernels on every
// execution space share (bf16, math, the KV block format): Kokkos'
// KOKKOS_INLINE_FUNCTION, except in the translation units of host kernels,
// which the host compiler builds alone in both variants
// (WRITESCOPE_HOST_COMPILER_ONLY, set by writescope_host_kernels() in
// cmake/WriteScopeTarget.cmake). Kokkos' headers need nvcc in a CUDA build,
// so those units see none of them and get plain `inline` functions instead.
#ifdef WRITESCOPE_HOST_COMPILER_ONLY
#define WRITESCOPE_INLINE_FUNCTION inline
#else
#include <Kokkos_Core.hpp>
#define WRITESCOPE_INLINE_FUNCTION KOKKOS_INLINE_FUNCTION
#endif
