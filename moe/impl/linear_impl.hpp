#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>
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

/// Weight rows of one thread of LinearTeamKernel (a warp on GPUs): each
/// load of x feeds this many of them, which keeps a warp's loads of x from
/// L1 within L1's bandwidth at 8 input rows (4 x fewer than one weight row).
inline constexpr int linear_team_features = 4;
/// Input rows of one LinearTeamKernel launch; more go in groups of these.
inline constexpr int linear_team_rows = 8;

/// `Width` consecutive elements from p as floats: eight in one 16-byte load
/// (p 16-byte aligned), or one.
template <class T>
KOKKOS_INLINE_FUNCTION void load_run(const T* p, float (&out)[8]) {
  load_eight(p, out);
}
template <class T>
KOKKOS_INLINE_FUNCTION void load_run(const T* p, float (&out)[1]) {
  out[0] = to_float(*p);
}

/// One product of LinearTeamKernel in raw pointers of its memory space: up
/// to linear_team_rows input rows.
///   x: (rows, in), row stride x_stride; w: (out, in), row stride w_stride;
///   y: (rows, out), row stride y_stride
template <class Scalar>
struct TeamProblem {
  const float* x;
  const Scalar* w;
  float* y;
  int x_stride, w_stride, y_stride;
  int rows, in, out;
  bool eight_wide;  // rows of x and w are 16-byte aligned runs of multiples of 8 elements
};

/// Products of one LinearTeamKernel launch: few enough that the kernel's
/// closure stays under the 512 bytes Kokkos 3.x passes as a kernel argument
/// (launch_parallel_for).
inline constexpr int max_team_problems = 6;

/// Portable, shaped for GPUs (the GEMVs of decode): each team thread takes
/// linear_team_features weight rows of one problem against its input rows
/// (at most Rows), its vector lanes (a warp) striding the columns eight at a
/// time, so that a warp reads 512 contiguous bytes of each bf16 weight row
/// per step, with every sum in registers until a reduction over the lanes.
/// Problem p owns the teams [first_team[p], first_team[p + 1]).
template <class ExecSpace, class Scalar, int Rows>
struct LinearTeamKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  TeamProblem<Scalar> problems[max_team_problems];
  int first_team[max_team_problems + 1];
  int count;
  int vector_length;  // the policy's: each lane adds its own sums once in the final reductions

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    int p = 0;
    while (p + 1 < count && team.league_rank() >= first_team[p + 1]) ++p;
    const TeamProblem<Scalar>& problem = problems[p];
    const int j0 = ((team.league_rank() - first_team[p]) * team.team_size() + team.team_rank()) * linear_team_features;
    if (j0 >= problem.out) return;
    if (problem.eight_wide)
      products<8>(team, problem, j0);
    else
      products<1>(team, problem, j0);
  }

  template <int Width>
  KOKKOS_INLINE_FUNCTION void products(const Member& team, const TeamProblem<Scalar>& problem, int j0) const {
    // Past the last weight row, a thread's rows repeat it and are not stored.
    const Scalar* w_rows[linear_team_features];
    for (int f = 0; f < linear_team_features; ++f)
      w_rows[f] =
          problem.w + static_cast<std::int64_t>(j0 + f < problem.out ? j0 + f : problem.out - 1) * problem.w_stride;
    // Each lane's own sums, in registers: a reduction over a struct of them
    // would go through local memory (Kokkos shuffles it word by word through
    // its address).
    float sums[Rows][linear_team_features] = {};
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, problem.in / Width), [&](int step) {
      const int c = step * Width;
      float weights[linear_team_features][Width];
      for (int f = 0; f < linear_team_features; ++f) load_run(w_rows[f] + c, weights[f]);
      for (int r = 0; r < Rows; ++r) {
        if (r >= problem.rows) break;
        float inputs[Width];
        load_run(problem.x + static_cast<std::int64_t>(r) * problem.x_stride + c, inputs);
        for (int f = 0; f < linear_team_features; ++f)
          for (int e = 0; e < Width; ++e) sums[r][f] += inputs[e] * weights[f][e];
      }
    });
    for (int r = 0; r < Rows; ++r) {
      if (r >= problem.rows) break;
      for (int f = 0; f < linear_team_features; ++f) {
        float total = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, vector_length), [&](int, float& lanes) { lanes += sums[r][f]; }, total);
        if (j0 + f < problem.out)
          Kokkos::single(Kokkos::PerThread(team),
                         [&]() { problem.y[static_cast<std::int64_t>(r) * problem.y_stride + j0 + f] = total; });
      }
    }
  }
};

/// linear() of every problem by LinearTeamKernel on any space (the GPU's
/// linear layers; on host spaces, teams of one lane, for tests): each
/// problem's rows in groups of linear_team_rows, up to max_team_problems
/// groups a launch.
template <class ExecSpace, class Scalar>
void linear_team(const ExecSpace& space,
                 const std::vector<LinearProblem<typename ExecSpace::memory_space, Scalar>>& problems) {
  for (const auto& p : problems) check_linear_shapes(p.x, p.w, p.y);
  constexpr bool host = is_host_exec_space<ExecSpace>;
  const int team_size = host ? 1 : 4, vector_length = host ? 1 : 32;
  const int threads_features = team_size * linear_team_features;
  thread_local std::vector<TeamProblem<Scalar>> groups;
  groups.clear();
  for (const auto& p : problems) {
    const int rows = static_cast<int>(p.x.extent(0)), in = static_cast<int>(p.w.extent(1));
    const bool eight_wide = in % 8 == 0 && p.x.stride(0) % 8 == 0 && p.w.stride(0) % 8 == 0 &&
                            reinterpret_cast<std::uintptr_t>(p.x.data()) % 16 == 0 &&
                            reinterpret_cast<std::uintptr_t>(p.w.data()) % 16 == 0;
    for (int r0 = 0; r0 < rows; r0 += linear_team_rows)
      groups.push_back(TeamProblem<Scalar>{p.x.data() + r0 * p.x.stride(0), p.w.data(), p.y.data() + r0 * p.y.stride(0),
                                           static_cast<int>(p.x.stride(0)), static_cast<int>(p.w.stride(0)),
                                           static_cast<int>(p.y.stride(0)), std::min(linear_team_rows, rows - r0), in,
                                           static_cast<int>(p.w.extent(0)), eight_wide});
  }
  for (std::size_t g0 = 0; g0 < groups.size(); g0 += max_team_problems) {
    const int count = static_cast<int>(std::min<std::size_t>(max_team_problems, groups.size() - g0));
    int most_rows = 0;
    for (int g = 0; g < count; ++g) most_rows = std::max(most_rows, groups[g0 + g].rows);
    auto launch = [&](auto rows_of_kernel) {
      LinearTeamKernel<ExecSpace, Scalar, decltype(rows_of_kernel)::value> kernel{};
      kernel.count = count;
      kernel.vector_length = vector_length;
      for (int g = 0; g < count; ++g) {
        kernel.problems[g] = groups[g0 + g];
        kernel.first_team[g + 1] =
            kernel.first_team[g] + (groups[g0 + g].out + threads_features - 1) / threads_features;
      }
      launch_parallel_for("writescope::moe::linear",
                          Kokkos::TeamPolicy<ExecSpace>(space, kernel.first_team[count], team_size, vector_length),
                          kernel);
    };
    if (most_rows == 1)
      launch(std::integral_constant<int, 1>());
    else if (most_rows == 2)
      launch(std::integral_constant<int, 2>());
    else if (most_rows <= 4)
      launch(std::integral_constant<int, 4>());
    else
      launch(std::integral_constant<int, 8>());
  }
}

/// Output tile of LinearTileKernel: rows x features of y per team, over
/// column steps of linear_tile_columns staged in team scratch.
inline constexpr int linear_tile_rows = 64, linear_tile_features = 64, linear_tile_columns = 32;
/// Each thread's register block of the tile: linear_tile_micro rows x
/// linear_tile_micro features, strided by the tile's size / linear_tile_micro
/// so that a warp's scratch reads are broadcasts (x) and consecutive words (w).
inline constexpr int linear_tile_micro = 8;
/// Threads of one tile (a GPU team): one register block each.
inline constexpr int linear_tile_threads =
    (linear_tile_rows / linear_tile_micro) * (linear_tile_features / linear_tile_micro);

/// Portable, shaped for GPUs (prompt chunks: more than max_linear_rows rows,
/// where the team kernel would stream the weights once per linear_team_rows
/// rows): a team stages a linear_tile_columns-wide step of its tile's rows of
/// x and of w (widened to fp32) in scratch, column-major with a padded stride
/// (stores without bank conflicts), and each thread adds its
/// linear_tile_micro^2 products per column from registers: the weights are
/// read from memory once per linear_tile_rows rows of x. `Blocks`: register
/// blocks per thread, 1 on GPUs (teams of linear_tile_threads); on host
/// spaces (tests) a team of one thread takes them all.
///   x: (rows, in); w: (out, in); y: (rows, out)
template <class ExecSpace, class Scalar, int Blocks>
struct LinearTileKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using MemSpace = typename ExecSpace::memory_space;
  /// (linear_tile_columns, padded_tile) floats: column c's tile rows contiguous.
  using Stage =
      Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr int padded_tile = linear_tile_rows + 1;
  static_assert(linear_tile_rows == linear_tile_features, "x and w share one staging shape");

  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemSpace> w;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> y;
  int feature_tiles;

  /// Team scratch of the two stages, in bytes.
  static std::size_t scratch_bytes() { return 2 * Stage::shmem_size(linear_tile_columns, padded_tile); }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    constexpr int stride = linear_tile_rows / linear_tile_micro;  // between a block's rows (and features)
    const int rows = static_cast<int>(x.extent(0)), in = static_cast<int>(x.extent(1)),
              out = static_cast<int>(w.extent(0));
    const int r0 = team.league_rank() / feature_tiles * linear_tile_rows,
              j0 = team.league_rank() % feature_tiles * linear_tile_features;
    const Stage x_stage(team.team_scratch(0), linear_tile_columns, padded_tile),
        w_stage(team.team_scratch(0), linear_tile_columns, padded_tile);
    float sums[Blocks][linear_tile_micro][linear_tile_micro] = {};
    for (int c0 = 0; c0 < in; c0 += linear_tile_columns) {
      // Consecutive threads take consecutive columns of a row: coalesced reads.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, linear_tile_rows * linear_tile_columns), [&](int i) {
        const int t = i / linear_tile_columns, c = i % linear_tile_columns;
        const bool column = c0 + c < in;
        x_stage(c, t) = column && r0 + t < rows ? x(r0 + t, c0 + c) : 0.0f;
        w_stage(c, t) = column && j0 + t < out ? to_float(w(j0 + t, c0 + c)) : 0.0f;
      });
      team.team_barrier();
      for (int b = 0; b < Blocks; ++b) {
        const int block = team.team_rank() + b * team.team_size();
        const int br = block / stride, bf = block % stride;
        for (int c = 0; c < linear_tile_columns; ++c) {
          float inputs[linear_tile_micro], weights[linear_tile_micro];
          for (int m = 0; m < linear_tile_micro; ++m) {
            inputs[m] = x_stage(c, br + m * stride);
            weights[m] = w_stage(c, bf + m * stride);
          }
          for (int i = 0; i < linear_tile_micro; ++i)
            for (int j = 0; j < linear_tile_micro; ++j) sums[b][i][j] += inputs[i] * weights[j];
        }
      }
      team.team_barrier();
    }
    for (int b = 0; b < Blocks; ++b) {
      const int block = team.team_rank() + b * team.team_size();
      const int br = block / stride, bf = block % stride;
      for (int i = 0; i < linear_tile_micro; ++i) {
        const int r = r0 + br + i * stride;
        if (r >= rows) break;
        for (int j = 0; j < linear_tile_micro; ++j) {
          const int f = j0 + bf + j * stride;
          if (f < out) y(r, f) = sums[b][i][j];
        }
      }
    }
  }
};

/// linear() of one product by LinearTileKernel on any space (the GPU's
/// prompt chunks; on host spaces, teams of one thread, for tests).
template <class ExecSpace, class Scalar>
void linear_tiled(const ExecSpace& space,
                  const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
                  const Kokkos::View<const Scalar**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& w,
                  const Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& y) {
  check_linear_shapes(x, w, y);
  const int rows = static_cast<int>(x.extent(0)), out = static_cast<int>(w.extent(0));
  if (rows == 0 || out == 0) return;
  const int row_tiles = (rows + linear_tile_rows - 1) / linear_tile_rows;
  const int feature_tiles = (out + linear_tile_features - 1) / linear_tile_features;
  auto launch = [&](auto blocks) {
    using Kernel = LinearTileKernel<ExecSpace, Scalar, decltype(blocks)::value>;
    const int team_size = linear_tile_threads / decltype(blocks)::value;
    Kokkos::TeamPolicy<ExecSpace> policy(space, row_tiles * feature_tiles, team_size);
    policy.set_scratch_size(0, Kokkos::PerTeam(Kernel::scratch_bytes()));
    launch_parallel_for("writescope::moe::linear_tiled", policy, Kernel{x, w, y, feature_tiles});
  };
  if constexpr (is_host_exec_space<ExecSpace>)
    launch(std::integral_constant<int, linear_tile_threads>());
  else
    launch(std::integral_constant<int, 1>());
}

}  // namespace impl

template <class ExecSpace, class Scalar>
void linear(const ExecSpace& space,
            const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
            const Kokkos::View<const Scalar**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& w,
            const Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& y) {
  impl::check_linear_shapes(x, w, y);
  if constexpr (is_host_exec_space<ExecSpace>) {
    const int out = static_cast<int>(w.extent(0));
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
    // Off the host, linear_batch chooses between the tiled and the team kernel.
    linear_batch<ExecSpace, Scalar>(space, {{x, w, y}});
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
  } else if constexpr (is_host_exec_space<ExecSpace>) {
    for (const auto& p : problems) linear<ExecSpace, Scalar>(space, p.x, p.w, p.y);
  } else {
    // Prompt chunks one by one on the tiled kernel; decode rows batched on the team kernel.
    std::vector<LinearProblem<typename ExecSpace::memory_space, Scalar>> decode_rows;
    for (const auto& p : problems) {
      if (static_cast<int>(p.x.extent(0)) > impl::max_linear_rows)
        impl::linear_tiled(space, p.x, p.w, p.y);
      else
        decode_rows.push_back(p);
    }
    if (!decode_rows.empty()) impl::linear_team(space, decode_rows);
  }
}

}  // namespace writescope
