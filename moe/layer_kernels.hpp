#pragma once
// Element-wise and routing kernels of an MoE layer, one Kokkos source for
// every execution space (DESIGN.md §5): RMSNorm, rotary embeddings and the
// three routers. They follow the reference model (reference_model.hpp)
// operation for operation, in float.

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "framework/math.hpp"

namespace writescope {

template <class MemSpace>
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, MemSpace>;

/// x(r, :) <- x(r, :) / rms(x(r, :)) * scale(:), over groups of `width`
/// columns (width = columns: whole rows; width = head_dim: per head, as
/// Qwen3's q/k norms).
///   x: (rows, columns), scale: (width)
template <class ExecSpace>
void rms_norm(const ExecSpace& space, const Matrix<typename ExecSpace::memory_space>& x,
              const Kokkos::View<const float*, typename ExecSpace::memory_space>& scale, int width, double eps);

/// Rotates `dim`-wide slices starting at column `offset` of every `stride`
/// columns of x in place, row r at position positions(r), "rotate half"
/// convention; `interleaved_input` first gathers evens then odds (DeepSeek).
///   x: (rows, columns), positions: (rows), inverse_frequencies: (dim / 2)
template <class ExecSpace>
void apply_rope(const ExecSpace& space, const Matrix<typename ExecSpace::memory_space>& x,
                const Kokkos::View<const std::int64_t*, typename ExecSpace::memory_space>& positions,
                const Kokkos::View<const double*, typename ExecSpace::memory_space>& inverse_frequencies, float scale,
                int offset, int stride, int dim, bool interleaved_input);

enum class RouterKind {
  normalized_topk,  // softmax, top-k, renormalised (Qwen3, Mixtral)
  scaled_topk,      // softmax, top-k, times a scaling factor (DeepSeek-V2)
};

/// Top-k experts of each row of router logits and their weights.
///   logits: (rows, experts); experts_out: (rows, k); weights_out: (rows, k)
/// Ties go to the lower expert index, as a stable sort does.
template <class ExecSpace>
void route(const ExecSpace& space, RouterKind kind, double scaling_factor,
           const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& logits,
           const Kokkos::View<int**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& experts_out,
           const Matrix<typename ExecSpace::memory_space>& weights_out);

}  // namespace writescope

#include "moe/impl/layer_kernels_impl.hpp"
