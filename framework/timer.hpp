#pragma once
// Wall-clock timers that fence an execution-space instance before reading the
// clock, so asynchronous GPU work launched before start() or stop() is
// attributed to the right interval.

#include <Kokkos_Core.hpp>

#include <chrono>

namespace writescope {

template <class ExecSpace>
class FencedTimer {
 public:
  explicit FencedTimer(const ExecSpace& space = ExecSpace()) : space_(space) {}

  /// Fences the instance, then starts the clock.
  void start() {
    space_.fence();
    start_ = Clock::now();
  }
  /// Fences the instance, then returns the seconds since start().
  double seconds() const {
    space_.fence();
    return seconds_unfenced();
  }
  /// The seconds since start(), without a fence: where another instance's
  /// fence just returned, when that happened on this clock.
  double seconds_unfenced() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  ExecSpace space_;
  Clock::time_point start_ = Clock::now();
};

/// Seconds taken by `work(space)`, fenced on both sides.
template <class ExecSpace, class Work>
double time_fenced(const ExecSpace& space, Work&& work) {
  FencedTimer<ExecSpace> timer(space);
  timer.start();
  work(space);
  return timer.seconds();
}

}  // namespace writescope
