#pragma once
// Two pieces of host-driven work at the same time: one on a new host thread,
// one on the calling thread (which keeps the OpenMP threads). Used where the
// GPU's share of a step is a chain of launches and fences that should not
// wait for the CPU's share.
//
// CUDA builds always give the GPU's share its own thread. Host-only builds run
// the two shares one after the other unless the worker thread is switched on
// (set_gpu_worker_thread, or WRITESCOPE_GPU_THREAD=1 in the environment), so
// that the host tests run the concurrent code paths on real threads. There the
// worker's Kokkos::OpenMP kernels run on the worker alone: Kokkos runs a
// kernel launched from a thread other than the one that initialised OpenMP
// serially on that thread.

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

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
inline std::atomic<long>& worker_threads_counter() {
  static std::atomic<long> count{0};
  return count;
}
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
/// Worker threads run_concurrently has started in this process.
inline long worker_threads_started() { return impl::worker_threads_counter().load(); }

/// Runs `on_thread` on a new thread and `here` on this one; returns when both
/// are done and rethrows the first exception either threw (an exception must
/// not escape a std::thread).
template <class OnThread, class Here>
void run_concurrently(OnThread&& on_thread, Here&& here) {
  std::exception_ptr thread_error, here_error;
  ++impl::worker_threads_counter();
  std::thread worker([&] {
    try {
      on_thread();
    } catch (...) {
      thread_error = std::current_exception();
    }
  });
  try {
    here();
  } catch (...) {
    here_error = std::current_exception();
  }
  worker.join();
  if (here_error) std::rethrow_exception(here_error);
  if (thread_error) std::rethrow_exception(thread_error);
}

}  // namespace writescope
