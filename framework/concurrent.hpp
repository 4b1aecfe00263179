#pragma once
// Two pieces of host-driven work at the same time: one on a new host thread,
// one on the calling thread (which keeps the OpenMP threads). Used where the
// GPU's share of a step is a chain of launches and fences that should not
// wait for the CPU's share.

#include <exception>
#include <thread>
#include <utility>

namespace writescope {

/// Runs `on_thread` on a new thread and `here` on this one; returns when both
/// are done and rethrows the first exception either threw (an exception must
/// not escape a std::thread).
template <class OnThread, class Here>
void run_concurrently(OnThread&& on_thread, Here&& here) {
  std::exception_ptr thread_error, here_error;
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
