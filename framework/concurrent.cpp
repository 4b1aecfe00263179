#include "framework/concurrent.hpp"

#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace writescope {
namespace {

std::atomic<long> tasks_run{0};
std::atomic<long> threads_started{0};

/// Read before main(), so before OpenMP binds the main thread to one CPU
/// (workers started later would inherit that single CPU).
const std::vector<int> startup_mask = [] {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}();

/// Restricts the calling thread to `cpus`.
void pin_to(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/// One persistent thread that runs one task at a time.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) { ++threads_started; }
  ~Worker() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start(const std::function<void()>& task) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      error_ = nullptr;
    }
    wake_.notify_all();
  }
  /// Waits for the task start() handed over; returns what it threw, if anything.
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return task_ == nullptr; });
    return error_;
  }

 private:
  void loop() {
    // A GPU driver gets its CPU of its own; otherwise (host builds, or no CPU
    // to spare) the worker may run on any start-up CPU, not only on the one
    // OpenMP's main thread, which started it, is pinned to.
    int cpu = -1;
    try {
      if (has_gpu) cpu = gpu_driver_cpu();
    } catch (const std::invalid_argument&) {
      // Runtime reports a bad WRITESCOPE_GPU_DRIVER_CPU at start-up.
    }
    pin_to(cpu >= 0 ? std::vector<int>{cpu} : startup_mask);
#ifdef KOKKOS_ENABLE_CUDA
    cudaSetDevice(Kokkos::Cuda().cuda_device());
#endif
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || task_ != nullptr; });
      if (stop_) return;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*task_)();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      task_ = nullptr;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void()>* task_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads exist
};

/// Idle workers; a caller takes one (or starts one when none is idle) and
/// gives it back, so nested run_concurrently calls each get their own.
class WorkerPool {
 public:
  Worker& acquire() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.empty()) {
      workers_.push_back(std::make_unique<Worker>());
      return *workers_.back();
    }
    Worker& worker = *idle_.back();
    idle_.pop_back();
    return worker;
  }
  void release(Worker& worker) {
    const std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(&worker);
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> idle_;
};

WorkerPool& pool() {
  static WorkerPool workers;
  return workers;
}

}  // namespace

namespace impl {
void run_on_worker(const std::function<void()>& on_worker, const std::function<void()>& here) {
  Worker& worker = pool().acquire();
  ++tasks_run;
  worker.start(on_worker);
  std::exception_ptr here_error;
  try {
    here();
  } catch (...) {
    here_error = std::current_exception();
  }
  const std::exception_ptr worker_error = worker.wait();
  pool().release(worker);
  if (here_error) std::rethrow_exception(here_error);
  if (worker_error) std::rethrow_exception(worker_error);
}
}  // namespace impl

long worker_tasks_run() { return tasks_run.load(); }
long worker_threads_started() { return threads_started.load(); }

std::vector<int> startup_cpus() { return startup_mask; }

void with_startup_affinity(const std::function<void()>& body) {
  cpu_set_t saved, startup;
  CPU_ZERO(&startup);
  for (int cpu : startup_mask) CPU_SET(cpu, &startup);
  const bool widened = pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0 &&
                       pthread_setaffinity_np(pthread_self(), sizeof(startup), &startup) == 0;
  try {
    body();
  } catch (...) {
    if (widened) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
    throw;
  }
  if (widened) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
}

int gpu_driver_cpu() {
  if (const char* value = std::getenv("WRITESCOPE_GPU_DRIVER_CPU")) {
    const std::string text(value);
    if (text == "none") return -1;
    for (int cpu : startup_mask) {
      if (text != std::to_string(cpu)) continue;
      if (startup_mask.size() < 2)
        throw std::invalid_argument("WRITESCOPE_GPU_DRIVER_CPU: CPU " + text +
                                    " is the only CPU this process may run on; the host threads need another "
                                    "(or 'none': the driver shares it)");
      return cpu;
    }
    throw std::invalid_argument("WRITESCOPE_GPU_DRIVER_CPU: '" + text +
                                "' is neither 'none' nor a CPU this process may run on");
  }
  return startup_mask.size() >= 2 ? startup_mask.back() : -1;
}

std::string openmp_places_without(const std::vector<int>& cpus, int excluded) {
  std::string places;
  for (int cpu : cpus)
    if (cpu != excluded) places += (places.empty() ? "{" : ",{") + std::to_string(cpu) + "}";
  return places;
}

}  // namespace writescope
