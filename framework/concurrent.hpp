#pragma once
// Two pieces of host-driven work at the same time: one on a worker thread,
// one on the calling thread (which keeps the OpenMP threads). Used where the
// GPU's share of a step is a chain of launches and fences that should not
// wait for the CPU's share.
//
// Workers are persistent: a small pool that grows to the deepest nesting of
// run_concurrently (2 when the MoE-Lightning pipeline's attention stage splits
// its own step) instead of a new thread per layer per step. They run on the GPU
// driver's CPU (gpu_driver_cpu()), which a CUDA build's Runtime leaves out of
// OpenMP's places, so the thread that launches and fences GPU work never waits
// for a core that an OpenMP thread holds; in a CUDA build each worker also
// selects Kokkos' device.
//
// CUDA builds always give the GPU's share a worker. Host-only builds run the
// two shares one after the other unless the worker is switched on
// (set_gpu_worker_thread, or WRITESCOPE_GPU_THREAD=1 in the environment), so
// that the host tests run the concurrent code paths on real threads. There the
// worker's Kokkos::OpenMP kernels run on the worker alone: Kokkos runs a
// kernel launched from a thread other than the one that initialised OpenMP
// serially on that thread.

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "framework/spaces.hpp"

namespace writescope {

namespace impl {
inline std::atomic<bool>& gpu_worker_thread_flag() {
  static std::atomic<bool> flag{[] {
    const char* value = std::getenv("WRITESCOPE_GPU_THREAD");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }()};
  return flag;
}
/// Runs `on_worker` on a pooled worker thread and `here` on this one; returns
/// when both are done and rethrows the first exception (here's first).
void run_on_worker(const std::function<void()>& on_worker, const std::function<void()>& here);
}  // namespace impl

/// Whether the GPU's share of a step runs on its own host thread.
inline bool gpu_worker_thread() { return has_gpu || impl::gpu_worker_thread_flag().load(); }
/// Switches the worker thread on or off in a host-only build (no effect in a CUDA build).
inline void set_gpu_worker_thread(bool on) { impl::gpu_worker_thread_flag().store(on); }
/// Sets the switch for its lifetime and restores it after (tests).
class ScopedGpuWorkerThread {
 public:
  explicit ScopedGpuWorkerThread(bool on) : previous_(impl::gpu_worker_thread_flag().exchange(on)) {}
  ~ScopedGpuWorkerThread() { impl::gpu_worker_thread_flag().store(previous_); }
  ScopedGpuWorkerThread(const ScopedGpuWorkerThread&) = delete;
  ScopedGpuWorkerThread& operator=(const ScopedGpuWorkerThread&) = delete;

 private:
  bool previous_;
};

/// Tasks run_concurrently has handed to workers in this process.
long worker_tasks_run();
/// Worker threads started in this process (the pool's size).
long worker_threads_started();

/// The CPU the workers run on: $WRITESCOPE_GPU_DRIVER_CPU if set (a CPU of
/// the process' start-up affinity mask, or "none"), else the highest CPU of
/// that mask when it has at least two; -1: the workers are not pinned.
/// Throws std::invalid_argument naming the variable for any other value, and
/// for the mask's only CPU (the host threads would have none).
int gpu_driver_cpu();
/// The CPUs of the process' affinity mask at start-up (before OpenMP binds
/// the main thread), in increasing order.
std::vector<int> startup_cpus();
/// Runs `body` with this thread's CPU affinity widened to startup_cpus() and
/// restores it after: a process started inside (calibration's measurements
/// in child processes) inherits every CPU, not the one CPU that OpenMP's main
/// thread is pinned to.
void with_startup_affinity(const std::function<void()>& body);
/// OpenMP places of every CPU in `cpus` except `excluded`, e.g. "{0},{1},{2}".
std::string openmp_places_without(const std::vector<int>& cpus, int excluded);

/// Runs `on_thread` on a worker thread and `here` on this one; returns when
/// both are done and rethrows the first exception either threw (here's first).
template <class OnThread, class Here>
void run_concurrently(OnThread&& on_thread, Here&& here) {
  impl::run_on_worker(std::function<void()>(std::ref(on_thread)), std::function<void()>(std::ref(here)));
}

}  // namespace writescope
