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

/// Throws unless x is (rows, in), w (out, in) and y (rows, out).
template <class X, class W, class Y>
void check_linear_shapes(const X& x, const W& w, const Y& y) {
  if (x.extent(1) != w.extent(1) || y.extent(0) != x.extent(0) || y.extent(1) != w.extent(0))
    throw std::invalid_argument("linear: need x (rows, in), w (out, in), y (rows, out)");
}

/// One product of the split-input decode paths, in raw host pointers.
struct SplitProblem {
  const float* x_split;  // each group of x's rows as split_even_odd (pair_inputs_amx on amx_bf16) lays it out
  const bf16* w;         // (out, in), row stride w_stride
  float* y;              // (rows, out), row stride y_stride
  std::int64_t w_stride, y_stride;
  int rows, in, out;
};

/// Host work item of the split-input decode paths: split_linear_features
/// weight rows of one problem on `path` (amx_bf16, an AVX-512 path or avx2;
/// linear_host.hpp), against each group of max_split_linear_rows input rows
/// in turn. Problem p owns the items [first_item[p], first_item[p + 1]).
struct LinearSplitHostKernel {
  const SplitProblem* problems;
  const int* first_item;  // problems + 1 entries
  int count;
  CpuPath path;

  void operator()(int item) const {
#ifdef WRITESCOPE_HOST_AVX2
    const int p = static_cast<int>(std::upper_bound(first_item, first_item + count + 1, item) - first_item) - 1;
    const SplitProblem& problem = problems[p];
    const int j0 = (item - first_item[p]) * split_linear_features;
    const int features = std::min(split_linear_features, problem.out - j0);
    const bf16* w = problem.w + j0 * problem.w_stride;
    // The weights of the next work item, which work stealing gives this
    // thread: requested during this item's last block, across matrices too.
    const bf16* next = item + 1 == first_item[p + 1] && p + 1 < count ? problems[p + 1].w
                                                                      : w + split_linear_features * problem.w_stride;
    for (int r0 = 0; r0 < problem.rows; r0 += max_split_linear_rows) {
      const int group = std::min(max_split_linear_rows, problem.rows - r0);
      const float* x_group = problem.x_split + static_cast<std::int64_t>(r0) * problem.in;
      float* y = problem.y + r0 * problem.y_stride + j0;
#ifdef WRITESCOPE_HOST_AVX512_BF16
      if (path == CpuPath::amx_bf16) {
        linear_features_amx(reinterpret_cast<const std::uint32_t*>(x_group), group, problem.in, w, problem.w_stride,
                            features, y, problem.y_stride);
        continue;
      }
      if (path >= CpuPath::avx512_fma) {
        linear_features_avx512(x_group, group, problem.in, w, problem.w_stride, features, y, problem.y_stride, next);
        continue;
      }
#endif
      linear_features_avx2(x_group, group, problem.in, w, problem.w_stride, features, y, problem.y_stride, next);
    }
#else
    (void)item;  // takes_split_inputs is false without a vector path
#endif
  }
};

/// x's rows as the split kernels take them on `path`, in groups of
/// max_split_linear_rows rows, each group 64-byte aligned (in % 16 == 0).
///   x: (rows, in), row stride x_stride; x_split: rows x in floats
inline void split_inputs(const float* x, std::int64_t x_stride, int rows, int in, CpuPath path, float* x_split) {
  for (int r0 = 0; r0 < rows; r0 += max_split_linear_rows) {
    const int group = std::min(max_split_linear_rows, rows - r0);
    float* group_split = x_split + static_cast<std::int64_t>(r0) * in;
#ifdef WRITESCOPE_HOST_AVX512_BF16
    if (path == CpuPath::amx_bf16) {
      pair_inputs_amx(x + r0 * x_stride, x_stride, group, in, reinterpret_cast<std::uint32_t*>(group_split));
      continue;
    }
#endif
    split_even_odd(x + r0 * x_stride, x_stride, group, in, path, group_split);
  }
}

/// The problems (on `path`, each taking split inputs) in one launch; their
/// inputs split first by the launching thread (host launches run to
/// completion), into 64-byte lines.
template <class ExecSpace>
void linear_split_host(const ExecSpace& space, CpuPath path,
                       const std::vector<LinearProblem<HostMemSpace, bf16>>& problems) {
  struct alignas(64) Line {
    float lanes[16];
  };
  thread_local std::vector<Line> x_split;
  thread_local std::vector<SplitProblem> split;
  thread_local std::vector<int> first_item;
  std::size_t lines = 0;
  for (const auto& p : problems) lines += (p.x.extent(0) * p.x.extent(1) + 15) / 16;
  x_split.resize(lines);
  split.clear();
  first_item.assign(1, 0);
  std::size_t line = 0;
  const LinearProblem<HostMemSpace, bf16>* before = nullptr;
  const float* x_split_floats = nullptr;
  for (const auto& p : problems) {
    const int rows = static_cast<int>(p.x.extent(0)), in = static_cast<int>(p.x.extent(1));
    const int out = static_cast<int>(p.w.extent(0));
    // An expert's gate and up products share their inputs: split once.
    if (!before || p.x.data() != before->x.data() || p.x.extent(0) != before->x.extent(0) ||
        p.x.extent(1) != before->x.extent(1) || p.x.stride(0) != before->x.stride(0)) {
      float* place = x_split[line].lanes;
      line += (static_cast<std::size_t>(rows) * in + 15) / 16;
      split_inputs(p.x.data(), static_cast<std::int64_t>(p.x.stride(0)), rows, in, path, place);
      x_split_floats = place;
    }
    before = &p;
    split.push_back(SplitProblem{x_split_floats, p.w.data(), p.y.data(), static_cast<std::int64_t>(p.w.stride(0)),
                                 static_cast<std::int64_t>(p.y.stride(0)), rows, in, out});
    first_item.push_back(first_item.back() + (out + split_linear_features - 1) / split_linear_features);
  }
  launch_parallel_for("writescope::moe::linear_host_split", work_stealing_range(space, first_item.back()),
                      LinearSplitHostKernel{split.data(), first_item.data(), static_cast<int>(split.size()), path});
}

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
  impl::check_linear_shapes(x, w, y);
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
        impl::linear_split_host(space, path, {LinearProblem<HostMemSpace, bf16>{x, w, y}});
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

template <class ExecSpace, class Scalar>
void linear_batch(const ExecSpace& space,
                  const std::vector<LinearProblem<typename ExecSpace::memory_space, Scalar>>& problems) {
  // Every shape checked before any product runs.
  for (const auto& p : problems) impl::check_linear_shapes(p.x, p.w, p.y);
  if constexpr (is_host_exec_space<ExecSpace> && std::is_same_v<Scalar, bf16>) {
    // The problems on the split path of the first one's choice share a launch.
    std::vector<LinearProblem<HostMemSpace, bf16>> batched;
    CpuPath batch_path = CpuPath::scalar;
    for (const auto& p : problems) {
      const int rows = static_cast<int>(p.x.extent(0)), in = static_cast<int>(p.x.extent(1));
      const CpuPath path = impl::linear_path(active_cpu_path(), rows, in, true);
      if (impl::takes_split_inputs(path, rows, in, true) && (batched.empty() || path == batch_path)) {
        batch_path = path;
        batched.push_back(p);
      } else {
        linear<ExecSpace, Scalar>(space, p.x, p.w, p.y);
      }
    }
    if (!batched.empty()) impl::linear_split_host(space, batch_path, batched);
  } else {
    for (const auto& p : problems) linear<ExecSpace, Scalar>(space, p.x, p.w, p.y);
  }
}

}  // namespace writescope
