#pragma once
// Math usable in host and device code. Kokkos 3.4 keeps these under
// Kokkos::Experimental and Kokkos 4 moves them, so kernels use these instead.

#include "framework/host_device.hpp"

#include <cmath>

namespace writescope::math {

WRITESCOPE_INLINE_FUNCTION constexpr float negative_infinity() { return -__builtin_huge_valf(); }

// name(type): CUDA's global-namespace function in device code, std:: on the host.
#ifdef __CUDA_ARCH__
#define WRITESCOPE_MATH_FUNCTION(name, type, device_function) \
  WRITESCOPE_INLINE_FUNCTION type name(type x) { return ::device_function(x); }
#else
#define WRITESCOPE_MATH_FUNCTION(name, type, device_function) \
  WRITESCOPE_INLINE_FUNCTION type name(type x) { return std::name(x); }
#endif

WRITESCOPE_MATH_FUNCTION(exp, float, expf)
WRITESCOPE_MATH_FUNCTION(log, float, logf)
WRITESCOPE_MATH_FUNCTION(exp, double, exp)
WRITESCOPE_MATH_FUNCTION(sqrt, double, sqrt)
WRITESCOPE_MATH_FUNCTION(cos, double, cos)
WRITESCOPE_MATH_FUNCTION(sin, double, sin)

#undef WRITESCOPE_MATH_FUNCTION

}  // namespace writescope::math
