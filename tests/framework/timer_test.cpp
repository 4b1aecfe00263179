#include "framework/timer.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "exec_spaces.hpp"

namespace writescope {
namespace {

/// Busy work whose result depends on every iteration.
template <class View>
struct Accumulate {
  View out;
  long iterations;
  KOKKOS_INLINE_FUNCTION void operator()(int) const {
    double x = 0.0;
    for (long k = 0; k < iterations; ++k) x = x * 0.999999 + 1e-6;
    out() = x;
  }
};

template <class ExecSpace>
class FencedTimerTest : public ::testing::Test {};
TYPED_TEST_SUITE(FencedTimerTest, test::ExecSpaceTypes, test::ExecSpaceName);

TYPED_TEST(FencedTimerTest, IncludesAsynchronousWorkLaunchedBeforeStop) {
  using ExecSpace = TypeParam;
  using View = Kokkos::View<double, typename ExecSpace::memory_space>;
  const ExecSpace space;
  View out("writescope::test::out");
  FencedTimer<ExecSpace> timer(space);
  timer.start();
  Kokkos::parallel_for("writescope::test::busy", Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
                       Accumulate<View>{out, 20'000'000});
  const double fenced = timer.seconds();
  // The fence inside seconds() completed the kernel: its result is there now.
  double result = 0;
  Kokkos::deep_copy(result, out);
  EXPECT_GT(result, 0.5);
  EXPECT_GT(fenced, 0.0);
  EXPECT_LE(timer.seconds() - fenced, 1.0);
}

TEST(FencedTimer, TimeFencedMeasuresTheWork) {
  const double seconds = time_fenced(HostExecSpace(), [](const HostExecSpace&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  EXPECT_GE(seconds, 0.030);
}

}  // namespace
}  // namespace writescope
