#pragma once
// The log-sum-exp merge of two partial attention states, shared by the
// Kokkos merge kernels and the host block products (which the host compiler
// builds alone: no Kokkos here, see framework/host_device.hpp).

#include "framework/host_device.hpp"
#include "framework/math.hpp"

namespace writescope::impl {

/// Weights (w_a, w_b) and merged lse of two log-sum-exps (natural log); -inf
/// inputs are empty states.
WRITESCOPE_INLINE_FUNCTION void merge_weights(float lse_a, float lse_b, float& w_a, float& w_b, float& lse) {
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == math::negative_infinity()) {
    w_a = w_b = 0.0f;
    lse = m;
    return;
  }
  const float e_a = math::exp(lse_a - m);
  const float e_b = math::exp(lse_b - m);
  const float sum = e_a + e_b;
  lse = m + math::log(sum);
  w_a = e_a / sum;
  w_b = e_b / sum;
}

}  // namespace writescope::impl
