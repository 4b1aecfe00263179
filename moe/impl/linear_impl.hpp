#pragma once

#include <stdexcept>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "framework/cpu_path.hpp"
#include "framework/simd.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace impl {

#ifdef WRITESCOPE_HOST_AVX2
using namespace writescope::simd;
#endif

/// Output features per host work item: four weight rows, each converted once
/// per pass and reused from registers for two input rows at a time.
inline constexpr int linear_features = 4;
/// Columns per L1-resident block of weights (4 rows x 512 bf16 = 4 KiB).
inline constexpr int linear_column_block = 512;
/// Input rows handled in one call of the vector path (decode batches).
inline constexpr int max_linear_rows = 32;

#ifdef WRITESCOPE_HOST_AVX512_BF16
/// The AVX-512 decode path (linear_avx512.cpp; taken on the avx512_bf16 CPU
/// path): x (rows, in; row stride x_stride) split into even and odd columns (rows, in) once per
/// call, and y(r, f) for `features` weight rows from w (row stride w_stride)
/// against rows <= max_avx512_linear_rows input rows, in % 32 == 0.
void split_even_odd_avx512(const float* x, std::int64_t x_stride, int rows, int in, float* x_split);
void linear_features_avx512(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                            float* y, std::int64_t y_stride);
#endif
/// Input rows the AVX-512 path takes at once. Measured on a Zen 5 (Mixtral
/// expert, 14336 x 4096): 0.86 / 0.78 / 0.70 of DRAM read at 1 / 2 / 4 rows,
/// but 0.23 at 8 rows against the AVX2 kernel's 0.52, so 5 rows and more stay
/// on the AVX2 kernel.
inline constexpr int max_avx512_linear_rows = 4;
/// Output features per work item of the AVX-512 path.
inline constexpr int avx512_linear_features = 16;

/// The instruction path linear() takes on the host for these operands.
inline CpuPath linear_path(CpuPath active, int rows, int in, bool bf16_weights) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (active >= CpuPath::avx512_bf16 && bf16_weights && rows >= 1 && rows <= max_avx512_linear_rows && in % 32 == 0)
    return CpuPath::avx512_bf16;
#else
  (void)rows, (void)bf16_weights;
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2 && in % 8 == 0 && rows <= max_linear_rows) return CpuPath::avx2;
#else
  (void)in;
#endif
  (void)active;
  return CpuPath::scalar;
}

/// Host work item of the AVX-512 path: avx512_linear_features weight rows.
struct LinearAvx512HostKernel {
  const float* x_split;  // (rows, in): even columns, then odd columns, per row
  Kokkos::View<const bf16**, Kokkos::LayoutRight, HostMemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> y;

  void operator()(int block) const {
#ifdef WRITESCOPE_HOST_AVX512_BF16
    const int out = static_cast<int>(w.extent(0));
    const int j0 = block * avx512_linear_features;
    linear_features_avx512(x_split, static_cast<int>(y.extent(0)), static_cast<int>(w.extent(1)), &w(j0, 0),
                                static_cast<std::int64_t>(w.stride(0)), std::min(avx512_linear_features, out - j0),
                                &y(0, j0), static_cast<std::int64_t>(y.stride(0)));
#else
    (void)block;
#endif
  }
};

template <class Scalar>
struct LinearHostKernel {
  Kokkos::View<const float**, Kokkos::LayoutRight, HostMemSpace> x;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, HostMemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> y;
  bool vector;  // linear_path chose avx2

  void operator()(int block) const {
    const int in = static_cast<int>(w.extent(1));
    const int out = static_cast<int>(w.extent(0));
    const int rows = static_cast<int>(x.extent(0));
    const int j0 = block * linear_features;
    const int features = std::min(linear_features, out - j0);
#ifdef WRITESCOPE_HOST_AVX2
    if (vector && features == linear_features) {
      // Columns in blocks that stay in L1, so every pair of input rows reuses
      // the block of weights read from memory by the first pair.
      alignas(32) float totals[max_linear_rows / 2][8] = {};
      for (int c0 = 0; c0 < in; c0 += linear_column_block) {
        const int c1 = std::min(in, c0 + linear_column_block);
        for (int r0 = 0; r0 < rows; r0 += 2) {
          const int pair = std::min(2, rows - r0);
          __m256 acc[8];
          for (auto& a : acc) a = _mm256_setzero_ps();
          for (int c = c0; c < c1; c += 8) {
            __m256 weights[linear_features];
            WRITESCOPE_UNROLL(4)
            for (int f = 0; f < linear_features; ++f) weights[f] = load8(&w(j0 + f, c));
            WRITESCOPE_UNROLL(2)
            for (int p = 0; p < 2; ++p) {
              if (p == pair) break;
              const __m256 xv = _mm256_loadu_ps(&x(r0 + p, c));
              WRITESCOPE_UNROLL(4)
              for (int f = 0; f < linear_features; ++f)
                acc[p * 4 + f] = _mm256_fmadd_ps(weights[f], xv, acc[p * 4 + f]);
            }
          }
          float* total = totals[r0 / 2];
          _mm256_store_ps(total, _mm256_add_ps(_mm256_load_ps(total), sum_lanes8(acc)));
        }
      }
      for (int r = 0; r < rows; ++r)
        for (int f = 0; f < linear_features; ++f) y(r, j0 + f) = totals[r / 2][(r % 2) * 4 + f];
      return;
    }
#endif
    for (int r = 0; r < rows; ++r)
      for (int f = 0; f < features; ++f) {
        float sum = 0;
        for (int c = 0; c < in; ++c) sum += x(r, c) * to_float(w(j0 + f, c));
        y(r, j0 + f) = sum;
      }
  }
};

/// Portable: one team per output feature, its threads over input rows and
/// vector lanes over the reduction (coalesced reads of the weight row).
template <class ExecSpace, class Scalar>
struct LinearTeamKernel {
  using MemSpace = typename ExecSpace::memory_space;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int j = team.league_rank();
    const int in = static_cast<int>(w.extent(1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<int>(x.extent(0))), [&](int r) {
      float sum = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, in), [&](int c, float& acc) { acc += x(r, c) * to_float(w(j, c)); }, sum);
      Kokkos::single(Kokkos::PerThread(team), [&]() { y(r, j) = sum; });
    });
  }
};

}  // namespace impl

template <class ExecSpace, class Scalar>
void linear(const ExecSpace& space,
            const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
            const Kokkos::View<const Scalar**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& w,
            const Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& y) {
  if (x.extent(1) != w.extent(1) || y.extent(0) != x.extent(0) || y.extent(1) != w.extent(0))
    throw std::invalid_argument("linear: need x (rows, in), w (out, in), y (rows, out)");
  const int out = static_cast<int>(w.extent(0));
  if constexpr (is_host_exec_space<ExecSpace>) {
    const int rows = static_cast<int>(x.extent(0)), in = static_cast<int>(x.extent(1));
    const CpuPath path = impl::linear_path(active_cpu_path(), rows, in, std::is_same_v<Scalar, bf16>);
#ifdef WRITESCOPE_HOST_AVX512_BF16
    if constexpr (std::is_same_v<Scalar, bf16>) {
      if (path == CpuPath::avx512_bf16) {
        // Inputs split once per call, by the launching thread (host launches run to completion).
        thread_local std::vector<float> x_split;
        x_split.resize(static_cast<std::size_t>(rows) * in);
        impl::split_even_odd_avx512(x.data(), static_cast<std::int64_t>(x.stride(0)), rows, in,
                                    x_split.data());
        Kokkos::parallel_for("writescope::moe::linear_host_avx512",
                             Kokkos::RangePolicy<ExecSpace>(
                                 space, 0, (out + impl::avx512_linear_features - 1) / impl::avx512_linear_features),
                             impl::LinearAvx512HostKernel{x_split.data(), w, y});
        return;
      }
    }
#endif
    Kokkos::parallel_for("writescope::moe::linear_host",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, (out + impl::linear_features - 1) / impl::linear_features),
                         impl::LinearHostKernel<Scalar>{x, w, y, path == CpuPath::avx2});
  } else {
    Kokkos::parallel_for("writescope::moe::linear", Kokkos::TeamPolicy<ExecSpace>(space, out, 4, 32),
                         impl::LinearTeamKernel<ExecSpace, Scalar>{x, w, y});
  }
}

}  // namespace writescope
