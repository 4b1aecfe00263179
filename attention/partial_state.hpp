#pragma once
// Partial attention states and their log-sum-exp merge (DESIGN.md §3).
//
// A partial state over a set of keys holds, per (sequence, query head), the
// softmax-weighted mean of the values `o` and `lse = log(sum_t exp(s_t))`, the
// natural-log log-sum-exp of the scaled scores. An empty key set has
// lse = -inf and o = 0, and merges as a no-op:
//   lse = m + log(exp(lse_a - m) + exp(lse_b - m)),  m = max(lse_a, lse_b)
//   o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>
#include <vector>

namespace writescope {

template <class MemSpace>
struct PartialState {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;  // (batch, q_heads, value_dim)
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;  // (batch, q_heads), natural log

  PartialState() = default;
  PartialState(const std::string& label, int batch, int q_heads, int value_dim)
      : o(label + "_o", batch, q_heads, value_dim), lse(label + "_lse", batch, q_heads) {}
  /// Not zeroed, for states a kernel overwrites: such a state may be made on
  /// any host thread (zeroing runs on the memory space's default execution
  /// space, which a host thread other than Kokkos' own cannot use).
  PartialState(std::decay_t<decltype(Kokkos::WithoutInitializing)>, const std::string& label, int batch, int q_heads, int value_dim)
      : o(Kokkos::view_alloc(label + "_o", Kokkos::WithoutInitializing), batch, q_heads, value_dim),
        lse(Kokkos::view_alloc(label + "_lse", Kokkos::WithoutInitializing), batch, q_heads) {}

  int batch() const { return static_cast<int>(o.extent(0)); }
  int q_heads() const { return static_cast<int>(o.extent(1)); }
  int value_dim() const { return static_cast<int>(o.extent(2)); }
};

/// accumulator <- merge(accumulator, other), on `space`. Shapes must match.
template <class ExecSpace, class MemSpace>
void merge_into(const ExecSpace& space, const PartialState<MemSpace>& accumulator, const PartialState<MemSpace>& other);

/// Merge of any number of partial states (none gives lse = -inf, o = 0).
template <class ExecSpace, class MemSpace>
void merge(const ExecSpace& space, const std::vector<PartialState<MemSpace>>& parts, const PartialState<MemSpace>& out);

/// Sets every state to the empty state (o = 0, lse = -inf).
template <class ExecSpace, class MemSpace>
void clear(const ExecSpace& space, const PartialState<MemSpace>& state);

}  // namespace writescope

#include "attention/impl/partial_state_impl.hpp"
