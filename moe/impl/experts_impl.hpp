#pragma once

#include <stdexcept>
#include <string>

#include "framework/launch.hpp"

namespace writescope {
namespace impl {

/// gate <- silu(gate) * up, element-wise.
template <class MemSpace>
struct SiluMultiply {
  Matrix<MemSpace> gate;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> up;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const {
    const float g = gate(r, c);
    gate(r, c) = g / (1.0f + math::exp(-g)) * up(r, c);
  }
};

/// gathered(i, :) = x(rows(i), :)
template <class MemSpace>
struct GatherRows {
  Matrix<MemSpace> gathered;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  Kokkos::View<const int*, MemSpace> rows;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int c) const { gathered(i, c) = x(rows(i), c); }
};

/// out(rows(i), :) += weights(i) * y(i, :); each row at most once per launch.
template <class MemSpace>
struct ScatterAddRows {
  Matrix<MemSpace> out;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> y;
  Kokkos::View<const int*, MemSpace> rows;
  Kokkos::View<const float*, MemSpace> weights;
  KOKKOS_INLINE_FUNCTION void operator()(int i, int c) const { out(rows(i), c) += weights(i) * y(i, c); }
};

/// out += y
template <class MemSpace>
struct AddRows {
  Matrix<MemSpace> out;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> y;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const { out(r, c) += y(r, c); }
};

/// Element-wise (row, column) kernels: host tiles of 1024 columns, so that a
/// decode step's one row spreads over the threads.
template <class ExecSpace>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>> rows_by_columns(const ExecSpace& space, int rows, int columns) {
  return rows_by_columns_policy(space, rows, columns, 1024);
}

/// A (rows, columns) matrix over `m`'s storage, which grows geometrically
/// when rows * columns exceeds it: scratch buffers are allocated a few times
/// per run, never per layer or step, whatever mix of shapes they serve (the
/// shared and routed experts' widths differ). The matrix does not own its
/// storage: use it before the next call on the same `m`.
template <class View>
View scratch(View& m, const char* label, int rows, int columns) {
  const std::size_t wanted = static_cast<std::size_t>(rows) * static_cast<std::size_t>(columns);
  if (m.span() < wanted)
    m = View(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), 1, std::max(wanted, 2 * m.span()));
  return View(m.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(columns));
}

}  // namespace impl

template <class ExecSpace, class Scalar>
void swiglu_expert(const ExecSpace& space, const ExpertWeights<Scalar, typename ExecSpace::memory_space>& expert,
                   const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
                   const Matrix<typename ExecSpace::memory_space>& y,
                   SwigluScratch<typename ExecSpace::memory_space>& scratch) {
  using MemSpace = typename ExecSpace::memory_space;
  const int rows = static_cast<int>(x.extent(0));
  const auto gate = impl::scratch(scratch.gate, "writescope::moe::expert_gate", rows, expert.intermediate());
  const auto up = impl::scratch(scratch.up, "writescope::moe::expert_up", rows, expert.intermediate());
  linear<ExecSpace, Scalar>(space, x, expert.gate, gate);
  linear<ExecSpace, Scalar>(space, x, expert.up, up);
  launch_parallel_for("writescope::moe::silu_multiply", impl::rows_by_columns(space, rows, expert.intermediate()),
                       impl::SiluMultiply<MemSpace>{gate, up});
  linear<ExecSpace, Scalar>(space, gate, expert.down, y);
}

inline std::vector<int> Routing::counts() const {
  std::vector<int> counts;
  for (const auto& r : rows) counts.push_back(static_cast<int>(r.size()));
  return counts;
}

inline std::vector<int> Routing::active() const {
  std::vector<int> experts;
  for (std::size_t e = 0; e < rows.size(); ++e)
    if (!rows[e].empty()) experts.push_back(static_cast<int>(e));
  return experts;
}

template <class ExecSpace, class Scalar>
Router<ExecSpace, Scalar>::Router(Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> weights,
                                  int experts_per_token, RouterKind kind, double scaling_factor)
    : weights_(weights), experts_per_token_(experts_per_token), kind_(kind), scaling_factor_(scaling_factor) {
  if (experts_per_token < 1 || experts_per_token > experts())
    throw std::invalid_argument("MoE: experts_per_token must be between 1 and the number of experts");
}

template <class ExecSpace, class Scalar>
Routing Router<ExecSpace, Scalar>::operator()(const ExecSpace& space,
                                              const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x) {
  const int rows = static_cast<int>(x.extent(0)), k = experts_per_token_;
  const auto logits = impl::scratch(logits_, "writescope::moe::router_logits", rows, experts());
  linear<ExecSpace, Scalar>(space, x, weights_, logits);
  const auto chosen = impl::scratch(chosen_, "writescope::moe::chosen", rows, k);
  const auto weights = impl::scratch(route_weights_, "writescope::moe::route_weights", rows, k);
  route(space, kind_, scaling_factor_, logits, chosen, weights);
  // Copies on `space` only: a plain deep_copy would fence every stream of the device.
  const auto chosen_host = impl::scratch(chosen_host_, "writescope::moe::chosen_on_host", rows, k);
  const auto weights_host = impl::scratch(weights_host_, "writescope::moe::route_weights_on_host", rows, k);
  Kokkos::deep_copy(space, chosen_host, chosen);
  Kokkos::deep_copy(space, weights_host, weights);
  space.fence();
  Routing routing;
  routing.rows.resize(static_cast<std::size_t>(experts()));
  routing.weights.resize(static_cast<std::size_t>(experts()));
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j) {
      routing.rows[chosen_host(r, j)].push_back(r);
      routing.weights[chosen_host(r, j)].push_back(weights_host(r, j));
    }
  return routing;
}

template <class ExecSpace, class Scalar>
void ExpertRunner<ExecSpace, Scalar>::upload(const ExecSpace& space, const Routing& routing) {
  offsets_.assign(1, 0);
  host_rows_.clear();
  host_weights_.clear();
  for (std::size_t e = 0; e < routing.rows.size(); ++e) {
    host_rows_.insert(host_rows_.end(), routing.rows[e].begin(), routing.rows[e].end());
    host_weights_.insert(host_weights_.end(), routing.weights[e].begin(), routing.weights[e].end());
    offsets_.push_back(static_cast<int>(host_rows_.size()));
  }
  const std::size_t n = host_rows_.size();
  if (rows_.extent(0) < n) {
    rows_ = Kokkos::View<int*, MemSpace>(
        Kokkos::view_alloc(std::string("writescope::moe::expert_rows"), Kokkos::WithoutInitializing), n);
    weights_ = Kokkos::View<float*, MemSpace>(
        Kokkos::view_alloc(std::string("writescope::moe::expert_weights"), Kokkos::WithoutInitializing), n);
  }
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  Kokkos::deep_copy(space, Kokkos::subview(rows_, std::make_pair(std::size_t{0}, n)),
                    Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(host_rows_.data(), n));
  Kokkos::deep_copy(space, Kokkos::subview(weights_, std::make_pair(std::size_t{0}, n)),
                    Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(host_weights_.data(), n));
}

template <class ExecSpace, class Scalar>
void ExpertRunner<ExecSpace, Scalar>::add(const ExecSpace& space, const ExpertWeights<Scalar, MemSpace>& expert,
                                          int expert_index,
                                          const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x,
                                          const Matrix<MemSpace>& out) {
  const int begin = offsets_.at(static_cast<std::size_t>(expert_index)), end = offsets_.at(expert_index + 1);
  const int n = end - begin, hidden = static_cast<int>(x.extent(1));
  if (n == 0) return;
  const auto rows = Kokkos::subview(rows_, std::make_pair(begin, end));
  const auto weights = Kokkos::subview(weights_, std::make_pair(begin, end));
  const auto xs = impl::scratch(gathered_, "writescope::moe::gathered", n, hidden);
  const auto ys = impl::scratch(expert_out_, "writescope::moe::expert_out", n, hidden);
  launch_parallel_for("writescope::moe::gather", impl::rows_by_columns(space, n, hidden),
                       impl::GatherRows<MemSpace>{xs, x, rows});
  swiglu_expert<ExecSpace, Scalar>(space, expert, xs, ys, swiglu_);
  launch_parallel_for("writescope::moe::scatter_add", impl::rows_by_columns(space, n, hidden),
                       impl::ScatterAddRows<MemSpace>{out, ys, rows, weights});
}

template <class ExecSpace, class Scalar>
void ExpertRunner<ExecSpace, Scalar>::add_all(const ExecSpace& space, const ExpertWeights<Scalar, MemSpace>& expert,
                                              const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x,
                                              const Matrix<MemSpace>& out) {
  const int rows = static_cast<int>(x.extent(0)), hidden = static_cast<int>(x.extent(1));
  const auto ys = impl::scratch(expert_out_, "writescope::moe::expert_out", rows, hidden);
  swiglu_expert<ExecSpace, Scalar>(space, expert, x, ys, swiglu_);
  launch_parallel_for("writescope::moe::add_shared", impl::rows_by_columns(space, rows, hidden),
                       impl::AddRows<MemSpace>{out, ys});
}

}  // namespace writescope
