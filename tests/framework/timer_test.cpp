#include "framework/timer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
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

/// An execution space whose work runs in the background until fence(), as a
/// GPU stream's does: on the host spaces a kernel is done when it returns, so
/// only this shows whether the timer fences.
class BackgroundSpace {
 public:
  /// Starts `seconds` of work that finishes in the background.
  void launch(double seconds) const {
    *pending_ = std::async(std::launch::async, [seconds] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    });
  }
  void fence() const {
    if (pending_->valid()) pending_->get();
  }

 private:
  std::shared_ptr<std::future<void>> pending_ = std::make_shared<std::future<void>>();
};

TEST(FencedTimer, WaitsForWorkLaunchedBeforeStopAndExcludesWorkLaunchedBeforeStart) {
  constexpr double work_seconds = 0.2;
  const BackgroundSpace space;
  FencedTimer<BackgroundSpace> timer(space);
  timer.start();
  space.launch(work_seconds);
  EXPECT_GE(timer.seconds(), work_seconds);  // without the fence in seconds(): about 0

  space.launch(work_seconds);
  timer.start();
  EXPECT_LT(timer.seconds(), work_seconds / 2);  // without the fence in start(): about work_seconds
}

TEST(FencedTimer, TimeFencedMeasuresTheWork) {
  const double seconds = time_fenced(HostExecSpace(), [](const HostExecSpace&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  EXPECT_GE(seconds, 0.030);
}

}  // namespace
}  // namespace writescope
