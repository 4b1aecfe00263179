#pragma once

#include <cmath>
#include <stdexcept>

#include "framework/launch.hpp"

namespace writescope {
namespace impl {

template <class MemSpace>
struct RmsNormKernel {
  Matrix<MemSpace> x;
  Kokkos::View<const float*, MemSpace> scale;
  int width;
  double eps;

  KOKKOS_INLINE_FUNCTION void operator()(int r, int group) const {
    const int begin = group * width;
    double sum = 0;
    for (int i = 0; i < width; ++i) sum += static_cast<double>(x(r, begin + i)) * x(r, begin + i);
    const double inverse = 1.0 / math::sqrt(sum / width + eps);
    for (int i = 0; i < width; ++i) x(r, begin + i) = static_cast<float>(x(r, begin + i) * inverse * scale(i));
  }
};

template <class MemSpace>
struct RopeKernel {
  Matrix<MemSpace> x;
  Kokkos::View<const std::int64_t*, MemSpace> positions;
  Kokkos::View<const double*, MemSpace> inverse_frequencies;
  float scale;
  int offset, stride, dim;
  bool interleaved_input;

  KOKKOS_INLINE_FUNCTION void operator()(int r, int slice) const {
    const int begin = slice * stride + offset;
    const int half = dim / 2;
    for (int i = 0; i < half; ++i) {
      // With interleaved input, the rotated pair (i, i + half) is (2i, 2i + 1).
      const int first = interleaved_input ? begin + 2 * i : begin + i;
      const int second = interleaved_input ? begin + 2 * i + 1 : begin + i + half;
      const double angle = static_cast<double>(positions(r)) * inverse_frequencies(i);
      const double c = math::cos(angle) * scale, s = math::sin(angle) * scale;
      const double a = x(r, first), b = x(r, second);
      x(r, first) = static_cast<float>(a * c - b * s);
      x(r, second) = static_cast<float>(b * c + a * s);
    }
    if (interleaved_input) {
      // Store in the rotate-half order the reference produces: evens first.
      float rotated[256];
      for (int i = 0; i < half; ++i) {
        rotated[i] = x(r, begin + 2 * i);
        rotated[i + half] = x(r, begin + 2 * i + 1);
      }
      for (int i = 0; i < dim; ++i) x(r, begin + i) = rotated[i];
    }
  }
};

template <class MemSpace>
struct RouteKernel {
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> logits;
  Kokkos::View<int**, Kokkos::LayoutRight, MemSpace> experts_out;
  Matrix<MemSpace> weights_out;
  bool normalize;
  double scaling_factor;

  KOKKOS_INLINE_FUNCTION void operator()(int r) const {
    const int experts = static_cast<int>(logits.extent(1));
    const int k = static_cast<int>(experts_out.extent(1));
    // Selection by repeated arg-max: k is small (2 to 8).
    for (int slot = 0; slot < k; ++slot) {
      int best = -1;
      for (int e = 0; e < experts; ++e) {
        bool taken = false;
        for (int j = 0; j < slot; ++j) taken = taken || experts_out(r, j) == e;
        if (!taken && (best < 0 || logits(r, e) > logits(r, best))) best = e;
      }
      experts_out(r, slot) = best;
    }
    const double m = logits(r, experts_out(r, 0));
    double total = 0;
    for (int e = 0; e < experts; ++e) total += math::exp(static_cast<double>(logits(r, e)) - m);
    double chosen = 0;
    for (int slot = 0; slot < k; ++slot)
      chosen += math::exp(static_cast<double>(logits(r, experts_out(r, slot))) - m) / total;
    for (int slot = 0; slot < k; ++slot) {
      const double p = math::exp(static_cast<double>(logits(r, experts_out(r, slot))) - m) / total;
      weights_out(r, slot) = static_cast<float>(normalize ? p / chosen : p * scaling_factor);
    }
  }
};

}  // namespace impl

template <class ExecSpace>
void rms_norm(const ExecSpace& space, const Matrix<typename ExecSpace::memory_space>& x,
              const Kokkos::View<const float*, typename ExecSpace::memory_space>& scale, int width, double eps) {
  if (width < 1 || x.extent(1) % static_cast<std::size_t>(width) != 0 || scale.extent(0) != static_cast<std::size_t>(width))
    throw std::invalid_argument("rms_norm: width must divide the columns and match the scale");
  const int groups = static_cast<int>(x.extent(1)) / width;
  launch_parallel_for("writescope::moe::rms_norm",
                       rows_by_columns_policy(space, static_cast<int>(x.extent(0)), groups, 1),
                       impl::RmsNormKernel<typename ExecSpace::memory_space>{x, scale, width, eps});
}

template <class ExecSpace>
void apply_rope(const ExecSpace& space, const Matrix<typename ExecSpace::memory_space>& x,
                const Kokkos::View<const std::int64_t*, typename ExecSpace::memory_space>& positions,
                const Kokkos::View<const double*, typename ExecSpace::memory_space>& inverse_frequencies, float scale,
                int offset, int stride, int dim, bool interleaved_input) {
  if (dim % 2 != 0 || dim > 256 || inverse_frequencies.extent(0) != static_cast<std::size_t>(dim / 2) ||
      offset + dim > stride || x.extent(1) % static_cast<std::size_t>(stride) != 0 || positions.extent(0) != x.extent(0))
    throw std::invalid_argument("apply_rope: need an even dim <= 256 inside each stride and one position per row");
  const int slices = static_cast<int>(x.extent(1)) / stride;
  launch_parallel_for(
      "writescope::moe::rope",
      rows_by_columns_policy(space, static_cast<int>(x.extent(0)), slices, 1),
      impl::RopeKernel<typename ExecSpace::memory_space>{x, positions, inverse_frequencies, scale, offset, stride, dim,
                                                         interleaved_input});
}

template <class ExecSpace>
void route(const ExecSpace& space, RouterKind kind, double scaling_factor,
           const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& logits,
           const Kokkos::View<int**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& experts_out,
           const Matrix<typename ExecSpace::memory_space>& weights_out) {
  if (experts_out.extent(0) != logits.extent(0) || weights_out.extent(0) != logits.extent(0) ||
      experts_out.extent(1) != weights_out.extent(1) || experts_out.extent(1) > logits.extent(1) ||
      experts_out.extent(1) == 0)
    throw std::invalid_argument("route: outputs must be (rows, k) with 1 <= k <= experts");
  launch_parallel_for("writescope::moe::route",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, static_cast<int>(logits.extent(0))),
                       impl::RouteKernel<typename ExecSpace::memory_space>{
                           logits, experts_out, weights_out, kind == RouterKind::normalized_topk, scaling_factor});
}

}  // namespace writescope
