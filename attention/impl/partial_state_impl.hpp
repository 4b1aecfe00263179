#pragma once

#include <stdexcept>

#include "attention/impl/merge_weights.hpp"
#include "framework/launch.hpp"
#include "framework/math.hpp"

namespace writescope {
namespace impl {

template <class MemSpace>
struct MergeIntoKernel {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> other_o;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> other_lse;

  KOKKOS_INLINE_FUNCTION void operator()(int b, int h) const {
    float w_a, w_b, merged;
    merge_weights(lse(b, h), other_lse(b, h), w_a, w_b, merged);
    for (int d = 0; d < static_cast<int>(o.extent(2)); ++d) o(b, h, d) = w_a * o(b, h, d) + w_b * other_o(b, h, d);
    lse(b, h) = merged;
  }
};

template <class MemSpace>
struct ClearKernel {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;

  KOKKOS_INLINE_FUNCTION void operator()(int b, int h) const {
    for (int d = 0; d < static_cast<int>(o.extent(2)); ++d) o(b, h, d) = 0.0f;
    lse(b, h) = math::negative_infinity();
  }
};

/// One (batch entry, head) per index pair, each a tile on host spaces.
template <class ExecSpace>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>> batch_heads_policy(const ExecSpace& space, int batch, int heads) {
  return rows_by_columns_policy(space, batch, heads, 1);
}

}  // namespace impl

template <class ExecSpace, class MemSpace>
void merge_into(const ExecSpace& space, const PartialState<MemSpace>& accumulator,
                const PartialState<MemSpace>& other) {
  if (accumulator.o.extent(0) != other.o.extent(0) || accumulator.o.extent(1) != other.o.extent(1) ||
      accumulator.o.extent(2) != other.o.extent(2))
    throw std::invalid_argument("merge_into: partial states of different shapes");
  launch_parallel_for("writescope::attention::merge_into",
                       impl::batch_heads_policy(space, accumulator.batch(), accumulator.q_heads()),
                       impl::MergeIntoKernel<MemSpace>{accumulator.o, accumulator.lse, other.o, other.lse});
}

template <class ExecSpace, class MemSpace>
void clear(const ExecSpace& space, const PartialState<MemSpace>& state) {
  launch_parallel_for("writescope::attention::clear", impl::batch_heads_policy(space, state.batch(), state.q_heads()),
                       impl::ClearKernel<MemSpace>{state.o, state.lse});
}

template <class ExecSpace, class MemSpace>
void merge(const ExecSpace& space, const std::vector<PartialState<MemSpace>>& parts,
           const PartialState<MemSpace>& out) {
  clear(space, out);
  for (const auto& part : parts) merge_into(space, out, part);
}

}  // namespace writescope
