#include "framework/spaces.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <set>
#include <thread>

#include "framework/launch.hpp"

#include "exec_spaces.hpp"

namespace writescope {
namespace {

static_assert(std::tuple_size_v<impl::deduplicate<std::tuple<>, int, float, int, float, double>::type> == 3);
static_assert(std::is_same_v<impl::deduplicate<std::tuple<>, int, float, int>::type, std::tuple<int, float>>);
static_assert(impl::contains<EnabledExecSpaces, HostExecSpace>::value);
static_assert(impl::contains<EnabledExecSpaces, GpuExecSpace>::value);

/// sum_i weight(i) * values(i), on any execution space.
template <class View>
struct WeightedSum {
  View values;
  KOKKOS_INLINE_FUNCTION void operator()(int i, double& sum) const { sum += (i % 7 + 1) * values(i); }
};

/// values(i) = i * i / 2, written by the space under test.
template <class View>
struct FillSquares {
  View values;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const { values(i) = 0.5 * i * i; }
};

template <class ExecSpace>
class SpacesTest : public ::testing::Test {};
TYPED_TEST_SUITE(SpacesTest, test::ExecSpaceTypes, test::ExecSpaceName);

TYPED_TEST(SpacesTest, ParallelForAndReduceMatchAPlainLoop) {
  using ExecSpace = TypeParam;
  using View = Kokkos::View<double*, typename ExecSpace::memory_space>;
  constexpr int n = 100'003;
  const ExecSpace space;
  View values("writescope::test::values", n);
  Kokkos::parallel_for("writescope::test::fill", Kokkos::RangePolicy<ExecSpace>(space, 0, n), FillSquares<View>{values});
  double sum = 0;
  Kokkos::parallel_reduce("writescope::test::sum", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
                          WeightedSum<View>{values}, sum);
  double expected = 0;
  for (int i = 0; i < n; ++i) expected += (i % 7 + 1) * (0.5 * i * i);
  EXPECT_NEAR(sum, expected, 1e-12 * expected);

  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
  for (int i : {0, 1, 999, n - 1}) EXPECT_EQ(host(i), 0.5 * i * i);
}

/// hits(r, c) += 1 for each index pair the range hands out.
template <class View>
struct CountPairs {
  View hits;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const { Kokkos::atomic_add(&hits(r, c), 1); }
};

TYPED_TEST(SpacesTest, RowsByColumnsPolicyHandsOutEveryPairOnce) {
  using ExecSpace = TypeParam;
  using View = Kokkos::View<int**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  const ExecSpace space;
  // (rows, columns, host tile columns): whole rows (0), a tile wider than
  // the row, and tiles that do not divide it.
  for (const auto& [rows, columns, tile] : {std::tuple{1, 16, 1}, std::tuple{3, 1000, 64}, std::tuple{5, 7, 0},
                                            std::tuple{2, 5, 1024}}) {
    View hits("writescope::test::hits", rows, columns);
    launch_parallel_for("writescope::test::count_pairs", rows_by_columns_policy(space, rows, columns, tile),
                        CountPairs<View>{hits});
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), hits);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < columns; ++c)
        ASSERT_EQ(host(r, c), 1) << rows << " x " << columns << " in tiles of " << tile << ": (" << r << ", " << c
                                 << ")";
  }
}

/// Records which host thread ran each index pair.
struct RecordThreads {
  std::mutex* lock;
  std::set<std::size_t>* threads;
  void operator()(int, int) const {
    const std::lock_guard<std::mutex> hold(*lock);
    threads->insert(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  }
};

// Kokkos' default host tile of a 2-D range is 2 rows x every column: a
// decode step's (1 sequence, heads) merge ran on one thread.
TEST(Spaces, OneRowOfARowsByColumnsRangeSpreadsOverTheHostThreads) {
  const HostExecSpace space;
  if (space.concurrency() < 2) GTEST_SKIP() << "one host thread";
  std::mutex lock;
  std::set<std::size_t> threads;
  launch_parallel_for("writescope::test::record_threads", rows_by_columns_policy(space, 1, 64, 1),
                      RecordThreads{&lock, &threads});
  EXPECT_GE(threads.size(), 2u);
}

/// Does nothing at (row, column).
struct NoWork {
  KOKKOS_INLINE_FUNCTION void operator()(int, int) const {}
};

// A GPU kernel that does not start is an error naming it, not outputs left
// as they were: here a 2-D range of 65536 one-column tiles, past CUDA's grid
// limit in y, which Kokkos 3.4 launches unchecked (GPU builds only).
TEST(Spaces, AGpuKernelThatDoesNotLaunchIsAnErrorNamingIt) {
  if constexpr (!has_gpu) {
    GTEST_SKIP() << "no GPU space in this build";
  } else {
    const GpuExecSpace space;
    const Kokkos::MDRangePolicy<GpuExecSpace, Kokkos::Rank<2>> past_the_grid(space, {0, 0}, {1, 65536}, {1, 1});
    try {
      launch_parallel_for("writescope::test::past_the_grid", past_the_grid, NoWork{});
      FAIL() << "a launch past the grid limit returned";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("writescope::test::past_the_grid: the CUDA kernel did not launch"),
                std::string::npos)
          << e.what();
    }
    // The error is taken: the next launch runs.
    launch_parallel_for("writescope::test::within_the_grid", rows_by_columns_policy(space, 1, 65536, 0), NoWork{});
    space.fence();
  }
}

// A GPU tile spans at most 65535 tiles of columns (CUDA's grid limit in y,
// which Kokkos 3.4 does not enforce: a launch past it does not run) and at
// most a block's 1024 threads; 256 columns where that fits.
TEST(Spaces, GpuTilesKeepEveryRangeWithinCudasGridAndBlock) {
  EXPECT_EQ(impl::gpu_tile_columns(1), 1);
  EXPECT_EQ(impl::gpu_tile_columns(100), 100);
  EXPECT_EQ(impl::gpu_tile_columns(2048), 256);
  EXPECT_EQ(impl::gpu_tile_columns(22 * 8 * 768), 256);  // 22 Qwen3 rows' SwiGLU product
  for (int columns : {256 * 65535, 256 * 65535 + 1, 586 * 14336 * 2, 1024 * 65535}) {
    const int tile = impl::gpu_tile_columns(columns);
    EXPECT_LE((static_cast<std::int64_t>(columns) + tile - 1) / tile, 65535) << columns << " columns";
    EXPECT_LE(tile, 1024) << columns << " columns";
    EXPECT_EQ(tile % 32, 0) << columns << " columns: whole warps";
  }
  try {
    impl::gpu_tile_columns(1024 * 65535 + 1);
    ADD_FAILURE() << "a range past 1024 x 65535 columns was tiled";
  } catch (const std::length_error& e) {
    EXPECT_NE(std::string(e.what()).find("a GPU launch over 67107841 columns needs tiles of 1025 columns"),
              std::string::npos)
        << e.what();
  }
}

TEST(Spaces, PinnedAndGpuBuffersRoundTripThroughHost) {
  constexpr int n = 4096;
  Kokkos::View<float*, HostMemSpace> host("writescope::test::host", n);
  for (int i = 0; i < n; ++i) host(i) = static_cast<float>(i) * 0.25f;
  Kokkos::View<float*, PinnedMemSpace> pinned("writescope::test::pinned", n);
  Kokkos::View<float*, GpuMemSpace> device("writescope::test::device", n);
  Kokkos::View<float*, HostMemSpace> back("writescope::test::back", n);
  const GpuExecSpace gpu;
  Kokkos::deep_copy(gpu, pinned, host);
  Kokkos::deep_copy(gpu, device, pinned);
  Kokkos::deep_copy(gpu, back, device);
  gpu.fence();
  for (int i = 0; i < n; ++i) ASSERT_EQ(back(i), host(i)) << i;
}

TEST(Spaces, NamesFollowTheEnabledList) {
  const auto names = ExecSpaceNames<>::get();
  EXPECT_EQ(names.size(), std::tuple_size_v<EnabledExecSpaces>);
  EXPECT_EQ(names.front(), std::string(GpuExecSpace::name()));
  EXPECT_EQ(std::count(names.begin(), names.end(), std::string(HostExecSpace::name())), 1);
}

}  // namespace
}  // namespace writescope
