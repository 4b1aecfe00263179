#include "framework/runtime.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "framework/concurrent.hpp"
#include "framework/spaces.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>

#include "framework/log.hpp"
#endif

namespace writescope {
namespace {

std::string placement = "OpenMP placement from the environment";
/// Where place_openmp_threads pinned OpenMP thread t: placed_cpus[t % size]
/// (empty: not placed here), beside the GPU driver's CPU (-1: none).
std::vector<int> placed_cpus;
int placed_driver_cpu = -1;

/// Gives OpenMP every start-up CPU but the GPU driver's (-1: none), one
/// thread pinned to each, before Kokkos starts its thread pool (which then
/// reuses these threads).
void place_openmp_threads(int driver_cpu) {
  std::vector<int> cpus;
  for (int cpu : startup_cpus())
    if (cpu != driver_cpu) cpus.push_back(cpu);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads(static_cast<int>(cpus.size()));
#pragma omp parallel
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[static_cast<std::size_t>(omp_get_thread_num()) % cpus.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  placed_cpus = cpus;
  placed_driver_cpu = driver_cpu;
}

/// `text` as an integer in [least, most], or nullopt.
std::optional<int> integer_in(const std::string& text, int least, int most) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < least || value > most)
    return std::nullopt;
  return value;
}

/// See Runtime's constructor: checked before Kokkos reads them.
void check_kokkos_arguments(int argc, char* argv[]) {
  struct Bound {
    const char* name;
    int least, most;
  };
  constexpr int any = std::numeric_limits<int>::max();
  // Kokkos 3.4's integer arguments (which it reads with std::stoi before it
  // checks them), with their unprefixed names, and Kokkos 4's thread count.
  static const Bound bounds[] = {{"--kokkos-threads", 1, max_host_threads}, {"--kokkos-num-threads", 1, max_host_threads},
                                 {"--kokkos-numa", 0, any},                 {"--kokkos-device-id", 0, any},
                                 {"--kokkos-device", 0, any},               {"--kokkos-num-devices", 1, any},
                                 {"--kokkos-ndevices", 1, any}};
  // Kokkos 3.4 also reads these older spellings but leaves them in argv, for
  // the program, whose commands would take them for their own options.
  static const std::pair<const char*, const char*> unprefixed[] = {
      {"--threads", "--kokkos-threads"},         {"--numa", "--kokkos-numa"},
      {"--device-id", "--kokkos-device-id"},     {"--device", "--kokkos-device"},
      {"--num-devices", "--kokkos-num-devices"}, {"--ndevices", "--kokkos-num-devices"}};
  std::vector<std::string> given;  // Kokkos takes a repeated argument's last value, silently
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    for (const auto& [old_name, name] : unprefixed)
      if (argument == old_name || argument.rfind(std::string(old_name) + "=", 0) == 0)
        throw ArgumentError(std::string(old_name) + " is Kokkos' older spelling; give " + name + "=N, got '" +
                            argument + "'");
    for (const Bound& bound : bounds) {
      const std::string name = bound.name;
      if (argument != name && argument.rfind(name + "=", 0) != 0) continue;
      if (std::count(given.begin(), given.end(), name)) throw ArgumentError(name + " given twice; give it once");
      given.push_back(name);
      std::string value = argument.size() > name.size() ? argument.substr(name.size() + 1) : "";
      // The device counts may name a device to skip: N,K.
      const bool devices = name.find("devices") != std::string::npos;
      std::optional<std::string> skipped;
      if (const auto comma = value.find(','); devices && comma != std::string::npos) {
        skipped = value.substr(comma + 1);
        value.resize(comma);
      }
      if (!integer_in(value, bound.least, bound.most) || (skipped && !integer_in(*skipped, 0, any)))
        throw ArgumentError(name + " must be given as " + name + (devices ? "=N[,K]" : "=N") + ", N an integer in [" +
                            std::to_string(bound.least) + ", " + std::to_string(bound.most) + "]" +
                            (bound.most == max_host_threads ? " (the most host threads Kokkos' OpenMP backend holds)"
                                                            : "") +
                            ", got '" + argument + "'");
    }
  }
  // OpenMP's list form ("8,4": nested levels) starts with the outer count.
  // An empty OMP_NUM_THREADS is OpenMP's default; Kokkos refuses an empty KOKKOS_NUM_THREADS.
  for (const char* variable : {"OMP_NUM_THREADS", "KOKKOS_NUM_THREADS"})
    if (const char* threads = std::getenv(variable); threads && (*threads || variable[0] == 'K')) {
      const std::string text = threads, outer = text.substr(0, text.find(','));
      if (!integer_in(outer, 1, max_host_threads))
        throw RuntimeError(std::string(variable) + " must be an integer in [1, " + std::to_string(max_host_threads) +
                           "] (the most host threads Kokkos' OpenMP backend holds), got '" + text + "'");
    }
  for (const char* variable : {"KOKKOS_NUMA", "KOKKOS_DEVICE_ID"})
    if (const char* number = std::getenv(variable); number && !integer_in(number, 0, any))
      throw RuntimeError(std::string(variable) + " must be an integer in [0, " + std::to_string(any) + "], got '" +
                         number + "'");
}

}  // namespace

std::string thread_placement() {
  std::string text = placement;
  if (!placed_cpus.empty()) {
    // The CPUs of the threads Kokkos runs: --kokkos-threads may take fewer than were pinned.
    const std::size_t threads =
        Kokkos::is_initialized() ? static_cast<std::size_t>(HostExecSpace().concurrency()) : placed_cpus.size();
    const std::vector<int> used(placed_cpus.begin(),
                                placed_cpus.begin() + static_cast<std::ptrdiff_t>(std::min(threads, placed_cpus.size())));
    text = "OpenMP threads pinned by WriteScope to " + openmp_places_without(used, -1);
    if (placed_driver_cpu >= 0) text = "GPU driver on CPU " + std::to_string(placed_driver_cpu) + "; " + text;
  }
  // The GPU's share on a worker in a host build runs its kernels serially on that worker (concurrent.hpp).
  return text + (!has_gpu && gpu_worker_thread() ? "; the GPU's share of a step on a worker thread" : "");
}

Runtime::Runtime(int& argc, char* argv[]) {
  check_kokkos_arguments(argc, argv);
  if (const char* worker = std::getenv("WRITESCOPE_GPU_THREAD");  // empty: as unset
      worker != nullptr && *worker != '\0' && std::string(worker) != "0" && std::string(worker) != "1")
    throw RuntimeError(std::string("WRITESCOPE_GPU_THREAD must be 0 or 1 (1: a host build runs the GPU's share of a "
                                   "step on a worker thread), got '") +
                       worker + "'");
  const int driver_cpu = gpu_driver_cpu();  // a bad WRITESCOPE_GPU_DRIVER_CPU stops here, named
  const bool placed_here = std::getenv("OMP_PLACES") == nullptr && std::getenv("OMP_PROC_BIND") == nullptr;
  if (placed_here)
    place_openmp_threads(has_gpu ? driver_cpu : -1);
  else if (has_gpu && driver_cpu >= 0)
    placement += "; GPU driver on CPU " + std::to_string(driver_cpu);
  // A thread per CPU by default: on a host of more CPUs than Kokkos' pool holds, the pool's.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && omp_get_max_threads() > max_host_threads)
    omp_set_num_threads(max_host_threads);
#ifdef KOKKOS_ENABLE_CUDA
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0)
    throw RuntimeError(std::string("this is a CUDA build of WriteScope but no CUDA device is usable (") +
                       (status != cudaSuccess ? cudaGetErrorString(status) : "no devices") +
                       "); run the host build (scripts/build.sh host) on machines without a GPU");
#endif
  // Kokkos warns when OMP_PROC_BIND is unset; the threads are pinned above,
  // so it sees the variable while it starts (OpenMP read its environment
  // long before; this changes nothing else) and the environment is restored.
  if (placed_here) setenv("OMP_PROC_BIND", "true", 1);
  guard_.emplace(argc, argv);
  if (placed_here) unsetenv("OMP_PROC_BIND");
#ifdef KOKKOS_ENABLE_CUDA
  // Threads waiting on the GPU yield their CPU instead of spinning on it
  // (CUDA's default with one context). Nested GPU drivers share the driver's
  // CPU (MoE-Lightning's feed-forward beside the split attention's GPU
  // share), and two spinning waits on one CPU hold each other up for a
  // scheduler slice; alone on its CPU a yielding wait returns as soon.
  cudaError_t scheduling = cudaSetDevice(Kokkos::Cuda().cuda_device());
  if (scheduling == cudaSuccess) scheduling = cudaSetDeviceFlags(cudaDeviceScheduleYield);
  if (scheduling != cudaSuccess) {
    cudaGetLastError();  // not left for the next check to report
    log_warn("runtime: waits on the GPU keep CUDA's default scheduling (", cudaGetErrorString(scheduling), ")");
  }
#endif
}

std::string kokkos_configuration() {
  std::ostringstream out;
  Kokkos::print_configuration(out, true);
  return out.str();
}

}  // namespace writescope
