#include "framework/spaces.hpp"

#include <gtest/gtest.h>

#include <numeric>

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
