#pragma once
// launch_parallel_for: Kokkos::parallel_for for the project's top-level
// kernels, checked at compile time so that two host threads may launch on the
// GPU at the same time (the GPU driver workers of framework/concurrent.hpp and
// the main thread do), and checked after launch on CUDA.
//
// Why: Kokkos 3.x's CUDA back end passes a kernel's closure (the functor with
// its policy and launch state) of 512 bytes or more through one device-wide
// constant-memory buffer, with no lock between host threads or streams; two
// such launches at once could run with each other's functor. Below that size
// the closure travels as a kernel argument, which is safe. Every project
// kernel launches through here, so a functor that grows past the limit stops
// the CUDA build instead of racing.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "framework/spaces.hpp"

namespace writescope {
namespace impl {

#if defined(KOKKOS_ENABLE_CUDA) && KOKKOS_VERSION < 40000
template <class Functor, class Policy>
constexpr bool closure_is_kernel_argument() {
  if constexpr (std::is_same_v<typename Policy::execution_space, Kokkos::Cuda>)
    return sizeof(Kokkos::Impl::ParallelFor<Functor, Policy, Kokkos::Cuda>) <
           Kokkos::Impl::CudaTraits::ConstantMemoryUseThreshold;
  else
    return true;
}
#else
template <class Functor, class Policy>
constexpr bool closure_is_kernel_argument() {
  return true;
}
#endif

}  // namespace impl

/// A host range [0, n) scheduled by work stealing: each thread starts on its
/// own consecutive items and takes others' last ones when it is done, so that
/// a core slowed by anything else on the machine does not hold up the launch
/// (a shared 2-vCPU VM ran the decode products about 10% faster than with
/// static ranges).
template <class ExecSpace>
Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>> work_stealing_range(const ExecSpace& space, int n) {
  return Kokkos::RangePolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>>(space, 0, n, Kokkos::ChunkSize(1));
}

namespace impl {
/// Columns of a GPU tile for a range of `columns`: 256, fewer where the range
/// is narrower, and more where 256-column tiles would be over 65535 (CUDA's
/// grid limit in y, which Kokkos 3.4's MDRange launch does not enforce: it
/// caps the grid at the x limit, and a launch over the y limit does not run).
/// Throws where even 1024-column tiles (a block's most threads) are too few.
inline int gpu_tile_columns(int columns) {
  constexpr int preferred = 256, most = 1024, grid_y_limit = 65535;
  const int needed = static_cast<int>((static_cast<std::int64_t>(columns) + grid_y_limit - 1) / grid_y_limit);
  if (needed > most)
    throw std::length_error("a GPU launch over " + std::to_string(columns) + " columns needs tiles of " +
                            std::to_string(needed) + " columns, over a block's " + std::to_string(most) +
                            " threads");
  // Past 256, whole warps: a block of 257 threads would start a ninth warp for one.
  constexpr int warp = 32;
  if (needed > preferred) return (needed + warp - 1) / warp * warp;
  return std::max(1, std::min(columns, preferred));
}
}  // namespace impl

/// The 2-D range [0, rows) x [0, columns). Host spaces split it into tiles
/// of one row and `host_tile_columns` columns (whole rows where 0): Kokkos'
/// default host tile is 2 rows x every column, so a range of one or two rows
/// (a decode step's (batch 1, heads), one token's features) ran on a single
/// thread (the decode merge of MLA at 8K tokens, 32 runs: 85 -> 45 us a step,
/// Zen 5, 2 threads). GPUs take tiles of one row and impl::gpu_tile_columns
/// columns: a CUDA block is (tile rows, tile columns) threads, so Kokkos'
/// default tile (16 rows x 2 columns) left 15 of every 16 threads idle at one
/// row, gave each warp 16 rows' scattered addresses, and past 131070 columns
/// (the SwiGLU product of 22 Qwen3 rows) did not run at all; with one row a
/// warp reads 32 consecutive columns.
template <class ExecSpace>
Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>> rows_by_columns_policy(const ExecSpace& space, int rows, int columns,
                                                                          int host_tile_columns) {
  const int tile = is_host_exec_space<ExecSpace> ? (host_tile_columns > 0 ? host_tile_columns : columns)
                                                 : impl::gpu_tile_columns(columns);
  return Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0}, {rows, columns}, {1, tile});
}

/// The 1-D range [0, n) of an element-wise kernel over n elements read flat,
/// for any n on every space (CUDA's range launch strides its grid over the
/// range); a (rows, columns) range of one row stops at 1024 x 65535 columns on
/// a GPU (impl::gpu_tile_columns).
template <class ExecSpace>
Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>> elements_range(const ExecSpace& space,
                                                                              std::int64_t n) {
  return Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n);
}

template <class Policy, class Functor>
void launch_parallel_for(const std::string& label, const Policy& policy, const Functor& functor) {
  static_assert(impl::closure_is_kernel_argument<Functor, Policy>(),
                "this kernel's closure is too large to travel as a CUDA kernel argument, so launches from two "
                "host threads at once would share Kokkos' constant buffer (framework/launch.hpp): make the "
                "functor smaller");
  Kokkos::parallel_for(label, policy, functor);
#ifdef KOKKOS_ENABLE_CUDA
  // Kokkos 3.4 checks a CUDA launch only with bounds checking on: a kernel
  // that did not start (registers or shared memory for its block, a grid past
  // a limit) would leave its outputs as they were, silently.
  if constexpr (std::is_same_v<typename Policy::execution_space, Kokkos::Cuda>) {
    if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess)
      throw std::runtime_error(label + ": the CUDA kernel did not launch, or an earlier one failed: " +
                               cudaGetErrorString(error));
  }
#endif
}

}  // namespace writescope
