#pragma once
// The pieces of an MoE layer's feed-forward (DESIGN.md §5): the router picks
// the top-k experts of every token; each SwiGLU expert runs on the tokens
// routed to it (gathered into one contiguous batch, so its weights stream
// once) and adds its weighted result; the model runs the experts on the
// devices the expert policy chooses.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <vector>

#include "moe/layer_kernels.hpp"
#include "moe/linear.hpp"

namespace writescope {

/// One SwiGLU expert: gate and up (intermediate, hidden), down (hidden, intermediate).
template <class Scalar, class MemSpace>
struct ExpertWeights {
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> gate, up, down;
  int hidden() const { return static_cast<int>(gate.extent(1)); }
  int intermediate() const { return static_cast<int>(gate.extent(0)); }
};

/// The elements a scratch buffer of `span` holds after a request for `wanted`:
/// as many, at least doubling when it grows, so that buffers serving many
/// shapes are allocated a few times per run (impl::scratch; the projection
/// sizes the runtime's pinned staging by it).
constexpr std::size_t scratch_span_after(std::size_t span, std::size_t wanted) {
  return span >= wanted ? span : (wanted > 2 * span ? wanted : 2 * span);
}

/// Intermediate activations of swiglu_expert, (rows, intermediate) each; they
/// grow as needed and are reused across calls.
template <class MemSpace>
struct SwigluScratch {
  Matrix<MemSpace> gate, up;
};

/// y = down(silu(gate x) * up x) for every row of x.
///   x: (rows, hidden), y: (rows, hidden)
template <class ExecSpace, class Scalar>
void swiglu_expert(const ExecSpace& space, const ExpertWeights<Scalar, typename ExecSpace::memory_space>& expert,
                   const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
                   const Matrix<typename ExecSpace::memory_space>& y,
                   SwigluScratch<typename ExecSpace::memory_space>& scratch);

/// Tokens routed to each expert by one router call, on the host.
struct Routing {
  std::vector<std::vector<int>> rows;       // per expert: rows of x routed to it, ascending
  std::vector<std::vector<float>> weights;  // per expert: the routing weight of each of those rows
  /// Tokens each expert received.
  std::vector<int> counts() const;
  /// Experts that received at least one token, ascending.
  std::vector<int> active() const;
};

/// The router of one MoE layer: softmax top-k of x W_router^T, gathered per expert on the host.
template <class ExecSpace, class Scalar>
class Router {
 public:
  using MemSpace = typename ExecSpace::memory_space;
  /// `weights`: (experts, hidden)
  Router(Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> weights, int experts_per_token, RouterKind kind,
         double scaling_factor);
  int experts() const { return static_cast<int>(weights_.extent(0)); }
  /// x: (rows, hidden)
  Routing operator()(const ExecSpace& space, const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x);

 private:
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> weights_;
  int experts_per_token_;
  RouterKind kind_;
  double scaling_factor_;
  Matrix<MemSpace> logits_, route_weights_;
  Kokkos::View<int**, Kokkos::LayoutRight, MemSpace> chosen_;
  Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace> chosen_host_;
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> weights_host_;
};

/// Runs SwiGLU experts on gathered rows and adds their weighted outputs; owns
/// the scratch so that no call allocates once sizes are reached.
template <class ExecSpace, class Scalar>
class ExpertRunner {
 public:
  using MemSpace = typename ExecSpace::memory_space;
  /// Copies every expert's routed rows and weights to MemSpace in one go, on
  /// `space` (asynchronous: fence `space` before the next upload).
  void upload(const ExecSpace& space, const Routing& routing);
  /// out(r, :) += w * expert(x(r, :)) for the rows r (weights w) the last
  /// upload routed to `expert_index`.
  ///   x: (rows, hidden), out: (rows, hidden)
  void add(const ExecSpace& space, const ExpertWeights<Scalar, MemSpace>& expert, int expert_index,
           const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x, const Matrix<MemSpace>& out);
  /// add() of each experts[i] as expert expert_indices[i], in that order, as
  /// one batch: a gather, then the gate and up products of every expert, their
  /// SiLU products, the down products and the weighted sums, one launch each
  /// (linear_batch; on a GPU, a launch per 6 groups of up to 8 rows), and two
  /// copies of the batch's indices and weights, where one expert at a time
  /// costs six launches an expert (on the host, a fork and join each, against
  /// 1-3 MB of weights per matrix for Qwen3's and DeepSeek's experts; on a
  /// GPU, a launch's latency each against 2-4 us of reading those weights).
  /// Each row of out receives its experts' terms in the order given, as add()
  /// one at a time adds them.
  ///   x: (rows, hidden), out: (rows, hidden)
  void add(const ExecSpace& space, const std::vector<int>& expert_indices,
           const std::vector<ExpertWeights<Scalar, MemSpace>>& experts,
           const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x, const Matrix<MemSpace>& out);
  /// out += expert(x) for every row (shared experts).
  void add_all(const ExecSpace& space, const ExpertWeights<Scalar, MemSpace>& expert,
               const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace>& x, const Matrix<MemSpace>& out);

 private:
  Matrix<MemSpace> gathered_, expert_out_;
  std::vector<int> offsets_, host_rows_;  // expert e's rows are [offsets_[e], offsets_[e + 1])
  std::vector<float> host_weights_;
  Kokkos::View<int*, MemSpace> rows_;
  Kokkos::View<float*, MemSpace> weights_;
  SwigluScratch<MemSpace> swiglu_;
  // The batch's entries (a routed row of one expert each, experts in the
  // order given) and, per row of x, its entries in that order.
  std::vector<int> entry_rows_, row_first_entry_, row_entries_;
  std::vector<float> entry_weights_;
  // entry_rows_, row_first_entry_ and row_entries_ one after another, and its copy on MemSpace.
  std::vector<int> batch_indices_;
  Kokkos::View<int*, MemSpace> batch_indices_view_;
  Kokkos::View<float*, MemSpace> batch_weights_;
};

}  // namespace writescope

#include "moe/impl/experts_impl.hpp"
