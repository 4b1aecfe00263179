#include "framework/concurrent.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace writescope {
namespace {

TEST(RunConcurrently, RunsBothAtTheSameTime) {
  // Each side waits for the other to start: this only finishes if they overlap.
  std::atomic<int> started{0};
  auto side = [&] {
    ++started;
    while (started.load() < 2) std::this_thread::yield();
  };
  run_concurrently(side, side);
  EXPECT_EQ(started.load(), 2);
}

TEST(RunConcurrently, RethrowsAfterBothFinished) {
  std::atomic<bool> here_done{false}, thread_done{false};
  EXPECT_THROW(run_concurrently([] { throw std::runtime_error("thread"); }, [&] { here_done = true; }),
               std::runtime_error);
  EXPECT_TRUE(here_done);
  try {
    run_concurrently([&] { thread_done = true; }, [] { throw std::invalid_argument("here"); });
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "here");
  }
  EXPECT_TRUE(thread_done);
}

TEST(RunConcurrently, WorkersPersistAndNestedCallsGetTheirOwn) {
  run_concurrently([] {}, [] {});  // the pool has at least one worker now
  const long threads = worker_threads_started();
  const long tasks = worker_tasks_run();
  for (int i = 0; i < 50; ++i) run_concurrently([] {}, [] {});
  EXPECT_EQ(worker_threads_started(), threads) << "a new thread per call";
  EXPECT_EQ(worker_tasks_run(), tasks + 50);
  // A call nested on the calling side while the first worker is busy runs at
  // the same time on a second worker (waiting for the first would deadlock here).
  std::atomic<int> started{0};
  auto side = [&] {
    ++started;
    while (started.load() < 3) std::this_thread::yield();
  };
  run_concurrently(side, [&] { run_concurrently(side, side); });
  EXPECT_EQ(started.load(), 3);
  EXPECT_LE(worker_threads_started(), threads + 1);
}

std::vector<int> current_thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

// A GPU build's driver thread gets the last start-up CPU to itself; without
// a GPU (or a CPU to spare) the worker may run on every start-up CPU, not
// only on the one CPU its starting thread is pinned to.
TEST(GpuDriverCpu, WorkersRunOnTheDriversCpuOrAnyStartupCpu) {
  const std::vector<int> startup = startup_cpus();
  ASSERT_FALSE(startup.empty());
  std::vector<int> worker_cpus;
  run_concurrently([&] { worker_cpus = current_thread_cpus(); }, [] {});
  EXPECT_EQ(gpu_driver_cpu(), startup.size() < 2 ? -1 : startup.back());
  if (has_gpu && startup.size() >= 2)
    EXPECT_EQ(worker_cpus, std::vector<int>{startup.back()});
  else
    EXPECT_EQ(worker_cpus, startup);
}

TEST(GpuDriverCpu, TheEnvironmentChoosesOrIsOneClearError) {
  const char* previous = std::getenv("WRITESCOPE_GPU_DRIVER_CPU");
  const std::string saved = previous ? previous : "";
  setenv("WRITESCOPE_GPU_DRIVER_CPU", std::to_string(startup_cpus().front()).c_str(), 1);
  if (startup_cpus().size() >= 2)
    EXPECT_EQ(gpu_driver_cpu(), startup_cpus().front());
  else  // cli.info_gpu_driver_on_the_only_cpu runs this case whatever the machine
    EXPECT_THROW(gpu_driver_cpu(), std::invalid_argument);
  setenv("WRITESCOPE_GPU_DRIVER_CPU", "none", 1);
  EXPECT_EQ(gpu_driver_cpu(), -1);
  setenv("WRITESCOPE_GPU_DRIVER_CPU", "99999", 1);
  try {
    gpu_driver_cpu();
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("WRITESCOPE_GPU_DRIVER_CPU: '99999'"), std::string::npos) << e.what();
  }
  if (previous)
    setenv("WRITESCOPE_GPU_DRIVER_CPU", saved.c_str(), 1);
  else
    unsetenv("WRITESCOPE_GPU_DRIVER_CPU");
}

TEST(GpuDriverCpu, OpenMPPlacesLeaveTheDriverOut) {
  EXPECT_EQ(openmp_places_without({0, 1, 2, 3}, 3), "{0},{1},{2}");
  EXPECT_EQ(openmp_places_without({2, 5, 7}, 5), "{2},{7}");
  EXPECT_EQ(openmp_places_without({0, 1}, -1), "{0},{1}");
}

}  // namespace
}  // namespace writescope
