#pragma once

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/launch.hpp"

namespace writescope {
namespace impl {

/// gate <- silu(gate) * up over n floats read flat: one expert's (rows,
/// intermediate) products, or a batch's, one after another. A 1-D range
/// (elements_range): as one row, a batch's products pass a GPU's 2-D limit of
/// 1024 x 65535 columns at 4682 Mixtral entries (a 2341-token prompt chunk).
struct SiluMultiply {
  float* gate;
  const float* up;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const float g = gate[i];
    gate[i] = g / (1.0f + math::exp(-g)) * up[i];
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

/// out(r, :) += weights(i) * y(i, :) for the entries i = entries(k) of row r,
/// k in [first(r), first(r + 1)) ascending: the terms in that order.
template <class MemSpace>
struct WeightedSumRows {
  Matrix<MemSpace> out;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> y;  // (entries, columns)
  Kokkos::View<const int*, MemSpace> first, entries;             // (rows + 1), (entries)
  Kokkos::View<const float*, MemSpace> weights;                  // (entries)
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const {
    float sum = out(r, c);
    for (int k = first(r); k < first(r + 1); ++k) {
      const int i = entries(k);
      sum += weights(i) * y(i, c);
    }
    out(r, c) = sum;
  }
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

/// A (rows, columns) matrix over `m`'s storage, which grows by
/// scratch_span_after when rows * columns exceeds it: scratch buffers are
/// allocated a few times per run, never per layer or step, whatever mix of
/// shapes they serve (the shared and routed experts' widths differ). The
/// matrix does not own its storage: use it before the next call on the same `m`.
template <class View>
View scratch(View& m, const char* label, int rows, int columns) {
  const std::size_t wanted = static_cast<std::size_t>(rows) * static_cast<std::size_t>(columns);
  if (m.span() < wanted)
    m = View(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), 1,
             scratch_span_after(m.span(), wanted));
  return View(m.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(columns));
}

/// `values` copied on `space` into the front of `view`, which grows
/// geometrically when they do not fit; returns that front.
template <class ExecSpace, class T, class MemSpace>
auto upload_values(const ExecSpace& space, Kokkos::View<T*, MemSpace>& view, const char* label,
                   const std::vector<T>& values) {
  const std::size_t n = values.size();
  if (view.extent(0) < n)
    view = Kokkos::View<T*, MemSpace>(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing),
                                      std::max(n, 2 * view.extent(0)));
  const auto front = Kokkos::subview(view, std::make_pair(std::size_t{0}, n));
  Kokkos::deep_copy(
      space, front,
      Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(values.data(), n));
  return front;
}

}  // namespace impl

template <class ExecSpace, class Scalar>
void swiglu_expert(const ExecSpace& space, const ExpertWeights<Scalar, typename ExecSpace::memory_space>& expert,
                   const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
                   const Matrix<typename ExecSpace::memory_space>& y,
                   SwigluScratch<typename ExecSpace::memory_space>& scratch) {
  const int rows = static_cast<int>(x.extent(0));
  const auto gate = impl::scratch(scratch.gate, "writescope::moe::expert_gate", rows, expert.intermediate());
  const auto up = impl::scratch(scratch.up, "writescope::moe::expert_up", rows, expert.intermediate());
  linear<ExecSpace, Scalar>(space, x, expert.gate, gate);
  linear<ExecSpace, Scalar>(space, x, expert.up, up);
  launch_parallel_for("writescope::moe::silu_multiply",
                      elements_range(space, std::int64_t{rows} * expert.intermediate()),
                      impl::SiluMultiply{gate.data(), up.data()});
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
  impl::upload_values(space, rows_, "writescope::moe::expert_rows", host_rows_);
  impl::upload_values(space, weights_, "writescope::moe::expert_weights", host_weights_);
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
void ExpertRunner<ExecSpace, Scalar>::add(const ExecSpace& space, const std::vector<int>& expert_indices,
                                          const std::vector<ExpertWeights<Scalar, MemSpace>>& experts,
                                          const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x,
                                          const Matrix<MemSpace>& out) {
  if (expert_indices.size() != experts.size())
    throw std::invalid_argument("ExpertRunner::add: expert_indices and experts differ in length");
  const int rows = static_cast<int>(x.extent(0)), hidden = static_cast<int>(x.extent(1));
  entry_rows_.clear();
  entry_weights_.clear();
  std::vector<int> expert_first_entry{0};
  int intermediate_floats = 0;  // the gate (and up) products of every expert
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const int begin = offsets_.at(static_cast<std::size_t>(expert_indices[i]));
    const int end = offsets_.at(static_cast<std::size_t>(expert_indices[i]) + 1);
    entry_rows_.insert(entry_rows_.end(), host_rows_.begin() + begin, host_rows_.begin() + end);
    entry_weights_.insert(entry_weights_.end(), host_weights_.begin() + begin, host_weights_.begin() + end);
    expert_first_entry.push_back(static_cast<int>(entry_rows_.size()));
    intermediate_floats += (end - begin) * experts[i].intermediate();
  }
  const int n = static_cast<int>(entry_rows_.size());
  if (n == 0) return;
  // Each row's entries in the batch's order (a counting sort keeps it).
  row_first_entry_.assign(static_cast<std::size_t>(rows) + 1, 0);
  for (int r : entry_rows_) ++row_first_entry_[static_cast<std::size_t>(r) + 1];
  std::partial_sum(row_first_entry_.begin(), row_first_entry_.end(), row_first_entry_.begin());
  row_entries_.resize(static_cast<std::size_t>(n));
  std::vector<int> next(row_first_entry_.begin(), row_first_entry_.end() - 1);
  for (int k = 0; k < n; ++k) row_entries_[static_cast<std::size_t>(next[entry_rows_[k]]++)] = k;

  // The three index arrays in one copy (each copy to a GPU costs a launch's latency).
  batch_indices_.assign(entry_rows_.begin(), entry_rows_.end());
  batch_indices_.insert(batch_indices_.end(), row_first_entry_.begin(), row_first_entry_.end());
  batch_indices_.insert(batch_indices_.end(), row_entries_.begin(), row_entries_.end());
  const auto indices =
      impl::upload_values(space, batch_indices_view_, "writescope::moe::expert_batch_indices", batch_indices_);
  const auto entry_rows = Kokkos::subview(indices, std::make_pair(0, n));
  const auto row_first_entry = Kokkos::subview(indices, std::make_pair(n, n + rows + 1));
  const auto row_entries = Kokkos::subview(indices, std::make_pair(n + rows + 1, 2 * n + rows + 1));
  const auto weights =
      impl::upload_values(space, batch_weights_, "writescope::moe::expert_batch_weights", entry_weights_);

  const auto xs = impl::scratch(gathered_, "writescope::moe::gathered", n, hidden);
  launch_parallel_for("writescope::moe::gather", impl::rows_by_columns(space, n, hidden),
                      impl::GatherRows<MemSpace>{xs, x, entry_rows});
  // Every expert's (rows, intermediate) gate and up products, one after another.
  const auto gates = impl::scratch(swiglu_.gate, "writescope::moe::expert_gate", 1, intermediate_floats);
  const auto ups = impl::scratch(swiglu_.up, "writescope::moe::expert_up", 1, intermediate_floats);
  const auto ys = impl::scratch(expert_out_, "writescope::moe::expert_out", n, hidden);
  std::vector<LinearProblem<MemSpace, Scalar>> gate_and_up, down;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const int begin = expert_first_entry[i], count = expert_first_entry[i + 1] - begin;
    if (count == 0) continue;
    const auto entries = std::make_pair(begin, begin + count);
    const int intermediate = experts[i].intermediate();
    const Matrix<MemSpace> gate(gates.data() + offset, count, intermediate),
        up(ups.data() + offset, count, intermediate);
    offset += static_cast<std::size_t>(count) * intermediate;
    const auto x_expert = Kokkos::subview(xs, entries, Kokkos::ALL);
    gate_and_up.push_back({x_expert, experts[i].gate, gate});
    gate_and_up.push_back({x_expert, experts[i].up, up});
    down.push_back({gate, experts[i].down, Kokkos::subview(ys, entries, Kokkos::ALL)});
  }
  linear_batch<ExecSpace, Scalar>(space, gate_and_up);
  launch_parallel_for("writescope::moe::silu_multiply", elements_range(space, intermediate_floats),
                      impl::SiluMultiply{gates.data(), ups.data()});
  linear_batch<ExecSpace, Scalar>(space, down);
  launch_parallel_for("writescope::moe::weighted_sum", impl::rows_by_columns(space, rows, hidden),
                      impl::WeightedSumRows<MemSpace>{out, ys, row_first_entry, row_entries, weights});
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
