#pragma once
// Float math usable in host and device code. Kokkos 3.4 keeps these under
// Kokkos::Experimental and Kokkos 4 moves them, so kernels use these instead.

#include <Kokkos_Core.hpp>

#include <cmath>

namespace writescope::math {

KOKKOS_INLINE_FUNCTION constexpr float negative_infinity() { return -__builtin_huge_valf(); }

KOKKOS_INLINE_FUNCTION float exp(float x) {
#ifdef __CUDA_ARCH__
  return ::expf(x);
#else
  return std::exp(x);
#endif
}

KOKKOS_INLINE_FUNCTION float log(float x) {
#ifdef __CUDA_ARCH__
  return ::logf(x);
#else
  return std::log(x);
#endif
}

KOKKOS_INLINE_FUNCTION double exp(double x) {
#ifdef __CUDA_ARCH__
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

KOKKOS_INLINE_FUNCTION double sqrt(double x) {
#ifdef __CUDA_ARCH__
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

KOKKOS_INLINE_FUNCTION double cos(double x) {
#ifdef __CUDA_ARCH__
  return ::cos(x);
#else
  return std::cos(x);
#endif
}

KOKKOS_INLINE_FUNCTION double sin(double x) {
#ifdef __CUDA_ARCH__
  return ::sin(x);
#else
  return std::sin(x);
#endif
}

}  // namespace writescope::math
