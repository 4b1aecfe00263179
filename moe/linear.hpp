#pragma once
// Linear layers of the model, y = x W^T, with weights kept in their storage
// type (bf16 or float) and fp32 accumulation.
//
// Why not Kokkos Kernels here: Kokkos Kernels 3.4 reaches OpenBLAS / cuBLAS
// only for float and double, so bf16 weights would have to be widened to
// float first, doubling the bytes that decode, a memory-bound GEMV with a
// handful of rows, has to stream. benchmarks/linear.cpp measures this kernel
// against OpenBLAS sgemm on float weights in the same run.

#include <Kokkos_Core.hpp>
#include <vector>

#include "framework/bf16.hpp"

namespace writescope {

/// y(r, j) = sum_c x(r, c) * w(j, c).
///   x: (rows, in) float, w: (out, in) Scalar, y: (rows, out) float
template <class ExecSpace, class Scalar>
void linear(const ExecSpace& space,
            const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
            const Kokkos::View<const Scalar**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& w,
            const Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& y);

/// One product of linear_batch, shapes as linear's.
///   x: (rows, in) float, w: (out, in) Scalar, y: (rows, out) float
template <class MemSpace, class Scalar>
struct LinearProblem {
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> y;
};

/// linear() of every problem (independent: no y is another's x). On the host
/// the problems that take the split-input decode path (bf16 weights, up to
/// max_linear_rows rows) share one launch, so that a decode step's experts pay
/// one fork and join instead of one per matrix, and the threads' work
/// stealing runs on across matrices instead of waiting at each one's end;
/// the rest take linear() one by one. On other spaces (GPUs), problems of up
/// to max_linear_rows rows share launches of the team kernel (groups of up to
/// 8 rows, 6 a launch); larger ones (prompt chunks) take the tiled kernel one
/// by one.
template <class ExecSpace, class Scalar>
void linear_batch(const ExecSpace& space,
                  const std::vector<LinearProblem<typename ExecSpace::memory_space, Scalar>>& problems);

}  // namespace writescope

#include "moe/impl/linear_impl.hpp"
