#pragma once

#include <stdexcept>
#include <string>

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

template <class ExecSpace>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>> rows_by_columns(const ExecSpace& space, int rows, int columns) {
  return Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, columns});
}

/// Grows `m` to at least (rows, columns) and returns its leading (rows, columns)
/// block: scratch buffers are allocated once, not on every layer of every step.
template <class View>
View scratch(View& m, const char* label, int rows, int columns) {
  if (m.extent(0) < static_cast<std::size_t>(rows) || m.extent(1) != static_cast<std::size_t>(columns))
    m = View(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), rows, columns);
  return Kokkos::subview(m, std::make_pair(0, rows), Kokkos::ALL);
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
  Kokkos::parallel_for("writescope::moe::silu_multiply", impl::rows_by_columns(space, rows, expert.intermediate()),
                       impl::SiluMultiply<MemSpace>{gate, up});
  linear<ExecSpace, Scalar>(space, gate, expert.down, y);
}

template <class ExecSpace, class Scalar>
MoeFeedForward<ExecSpace, Scalar>::MoeFeedForward(Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> router,
                                                  std::vector<Weights> experts, std::vector<Weights> shared,
                                                  int experts_per_token, RouterKind kind, double scaling_factor)
    : router_(router),
      experts_(std::move(experts)),
      shared_(std::move(shared)),
      experts_per_token_(experts_per_token),
      kind_(kind),
      scaling_factor_(scaling_factor),
      counts_(experts_.size(), 0) {
  if (router_.extent(0) != experts_.size())
    throw std::invalid_argument("MoE: the router has " + std::to_string(router_.extent(0)) + " rows for " +
                                std::to_string(experts_.size()) + " experts");
  if (experts_per_token < 1 || experts_per_token > static_cast<int>(experts_.size()))
    throw std::invalid_argument("MoE: experts_per_token must be between 1 and the number of experts");
}

template <class ExecSpace, class Scalar>
void MoeFeedForward<ExecSpace, Scalar>::operator()(const ExecSpace& space,
                                                   const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x,
                                                   const Matrix<MemSpace>& out) {
  const int rows = static_cast<int>(x.extent(0)), hidden = static_cast<int>(x.extent(1));
  const int k = experts_per_token_;
  const auto logits = impl::scratch(logits_, "writescope::moe::router_logits", rows, static_cast<int>(experts_.size()));
  linear<ExecSpace, Scalar>(space, x, router_, logits);
  const auto chosen = impl::scratch(chosen_, "writescope::moe::chosen", rows, k);
  const auto weights = impl::scratch(route_weights_, "writescope::moe::route_weights", rows, k);
  route(space, kind_, scaling_factor_, logits, chosen, weights);
  const auto chosen_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), chosen);
  const auto weights_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), weights);
  Kokkos::deep_copy(space, out, 0.0f);

  std::fill(counts_.begin(), counts_.end(), 0);
  for (std::size_t e = 0; e < experts_.size(); ++e) {
    std::vector<int> token_rows;
    std::vector<float> token_weights;
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < k; ++j)
        if (chosen_host(r, j) == static_cast<int>(e)) {
          token_rows.push_back(r);
          token_weights.push_back(weights_host(r, j));
        }
    counts_[e] = static_cast<int>(token_rows.size());
    if (token_rows.empty()) continue;
    const int n = counts_[e];
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    const auto rows_view = Kokkos::create_mirror_view_and_copy(
        MemSpace(), Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(token_rows.data(), n));
    const auto weights_view = Kokkos::create_mirror_view_and_copy(
        MemSpace(), Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>(token_weights.data(), n));
    const auto xs = impl::scratch(gathered_, "writescope::moe::gathered", n, hidden);
    const auto ys = impl::scratch(expert_out_, "writescope::moe::expert_out", n, hidden);
    Kokkos::parallel_for("writescope::moe::gather", impl::rows_by_columns(space, n, hidden),
                         impl::GatherRows<MemSpace>{xs, x, rows_view});
    swiglu_expert<ExecSpace, Scalar>(space, experts_[e], xs, ys, swiglu_scratch_);
    Kokkos::parallel_for("writescope::moe::scatter_add", impl::rows_by_columns(space, n, hidden),
                         impl::ScatterAddRows<MemSpace>{out, ys, rows_view, weights_view});
  }
  if (!shared_.empty()) {
    const auto ys = impl::scratch(expert_out_, "writescope::moe::expert_out", rows, hidden);
    Kokkos::View<int*, MemSpace> all_rows("writescope::moe::all_rows", rows);
    Kokkos::View<float*, MemSpace> ones("writescope::moe::ones", rows);
    Kokkos::deep_copy(space, ones, 1.0f);
    const auto identity = Kokkos::create_mirror_view(all_rows);
    for (int r = 0; r < rows; ++r) identity(r) = r;
    Kokkos::deep_copy(space, all_rows, identity);
    for (const Weights& expert : shared_) {
      swiglu_expert<ExecSpace, Scalar>(space, expert, x, ys, swiglu_scratch_);
      Kokkos::parallel_for("writescope::moe::add_shared", impl::rows_by_columns(space, rows, hidden),
                           impl::ScatterAddRows<MemSpace>{out, ys, all_rows, ones});
    }
  }
}

}  // namespace writescope
