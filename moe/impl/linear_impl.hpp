#pragma once

#include <stdexcept>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "framework/cpu_path.hpp"
#include "framework/host_gemm.hpp"
#include "framework/launch.hpp"
#include "framework/spaces.hpp"
#include "moe/impl/linear_host.hpp"

namespace writescope {
namespace impl {

/// Host work item of the split-input decode paths: split_linear_features
/// weight rows on `path` (amx_bf16, an AVX-512 path or avx2; linear_host.hpp),
/// against each group of max_split_linear_rows input rows in turn.
struct LinearSplitHostKernel {
  const float* x_split;  // each group of x's rows as split_even_odd (pair_inputs_amx on amx_bf16) lays it out
  Kokkos::View<const bf16**, Kokkos::LayoutRight, HostMemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> y;
  CpuPath path;

  void operator()(int block) const {
#ifdef WRITESCOPE_HOST_AVX2
    const int rows = static_cast<int>(y.extent(0)), in = static_cast<int>(w.extent(1));
    const int j0 = block * split_linear_features;
    const int features = std::min(split_linear_features, static_cast<int>(w.extent(0)) - j0);
    const auto w_stride = static_cast<std::int64_t>(w.stride(0)), y_stride = static_cast<std::int64_t>(y.stride(0));
    for (int r0 = 0; r0 < rows; r0 += max_split_linear_rows) {
      const int group = std::min(max_split_linear_rows, rows - r0);
      const float* x_group = x_split + static_cast<std::int64_t>(r0) * in;
#ifdef WRITESCOPE_HOST_AVX512_BF16
      if (path == CpuPath::amx_bf16) {
        linear_features_amx(reinterpret_cast<const std::uint32_t*>(x_group), group, in, &w(j0, 0), w_stride,
                            features, &y(r0, j0), y_stride);
        continue;
      }
      if (path >= CpuPath::avx512_fma) {
        linear_features_avx512(x_group, group, in, &w(j0, 0), w_stride, features, &y(r0, j0), y_stride);
        continue;
      }
#endif
      linear_features_avx2(x_group, group, in, &w(j0, 0), w_stride, features, &y(r0, j0), y_stride);
    }
#else
    (void)block;  // takes_split_inputs is false without a vector path
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
    const int out = static_cast<int>(w.extent(0));
    const int j0 = block * linear_features;
    linear_features_host(x.data(), static_cast<std::int64_t>(x.stride(0)), static_cast<int>(x.extent(0)),
                         static_cast<int>(w.extent(1)), &w(j0, 0), static_cast<std::int64_t>(w.stride(0)),
                         std::min(linear_features, out - j0), &y(0, j0), static_cast<std::int64_t>(y.stride(0)),
                         vector);
  }
};

/// Host work item of the many-rows path: gemm_linear_features weight rows.
template <class Scalar>
struct LinearGemmHostKernel {
  Kokkos::View<const float**, Kokkos::LayoutRight, HostMemSpace> x;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, HostMemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> y;
  CpuPath path;  // host_gemm_path, once per launch

  void operator()(int block) const {
    const int out = static_cast<int>(w.extent(0));
    const int j0 = block * gemm_linear_features;
    linear_features_gemm(x.data(), static_cast<std::int64_t>(x.stride(0)), static_cast<int>(x.extent(0)),
                         static_cast<int>(w.extent(1)), &w(j0, 0), static_cast<std::int64_t>(w.stride(0)),
                         std::min(gemm_linear_features, out - j0), &y(0, j0), static_cast<std::int64_t>(y.stride(0)),
                         path);
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
    if (rows > impl::max_linear_rows) {
      // Prompt chunks: weights are reused by many rows, so the layer is a GEMM, not a stream of weights.
      launch_parallel_for(
          "writescope::moe::linear_host_gemm",
          Kokkos::RangePolicy<ExecSpace>(space, 0, (out + impl::gemm_linear_features - 1) / impl::gemm_linear_features),
          impl::LinearGemmHostKernel<Scalar>{x, w, y, host_gemm_path(active_cpu_path())});
      return;
    }
    const CpuPath path = impl::linear_path(active_cpu_path(), rows, in, std::is_same_v<Scalar, bf16>);
    if constexpr (std::is_same_v<Scalar, bf16>) {
      if (impl::takes_split_inputs(path, rows, in, true)) {
        // Inputs split once per call, by the launching thread (host launches
        // run to completion), into 64-byte lines.
        struct alignas(64) Line {
          float lanes[16];
        };
        thread_local std::vector<Line> x_split;
        x_split.resize((static_cast<std::size_t>(rows) * in + 15) / 16);
        float* x_split_floats = x_split.data()->lanes;
        const auto x_stride = static_cast<std::int64_t>(x.stride(0));
        // Groups lie 8 x in floats apart (in % 16 == 0): each 64-byte aligned.
        for (int r0 = 0; r0 < rows; r0 += impl::max_split_linear_rows) {
          const int group = std::min(impl::max_split_linear_rows, rows - r0);
          float* group_split = x_split_floats + static_cast<std::int64_t>(r0) * in;
#ifdef WRITESCOPE_HOST_AVX512_BF16
          if (path == CpuPath::amx_bf16) {
            impl::pair_inputs_amx(x.data() + r0 * x_stride, x_stride, group, in,
                                  reinterpret_cast<std::uint32_t*>(group_split));
            continue;
          }
#endif
          impl::split_even_odd(x.data() + r0 * x_stride, x_stride, group, in, path, group_split);
        }
        launch_parallel_for("writescope::moe::linear_host_split",
                             work_stealing_range(space, (out + impl::split_linear_features - 1) / impl::split_linear_features),
                             impl::LinearSplitHostKernel{x_split_floats, w, y, path});
        return;
      }
    }
    launch_parallel_for("writescope::moe::linear_host",
                         work_stealing_range(space, (out + impl::linear_features - 1) / impl::linear_features),
                         impl::LinearHostKernel<Scalar>{x, w, y, path == CpuPath::avx2});
  } else {
    launch_parallel_for("writescope::moe::linear", Kokkos::TeamPolicy<ExecSpace>(space, out, 4, 32),
                         impl::LinearTeamKernel<ExecSpace, Scalar>{x, w, y});
  }
}

}  // namespace writescope
