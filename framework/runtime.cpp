#include "framework/runtime.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <sstream>
#include <vector>

#include "framework/concurrent.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>

#include "framework/log.hpp"
#endif

namespace writescope {
namespace {

std::string placement = "OpenMP placement from the environment";

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
  placement = "OpenMP threads pinned by WriteScope to " + openmp_places_without(startup_cpus(), driver_cpu);
  if (driver_cpu >= 0) placement = "GPU driver on CPU " + std::to_string(driver_cpu) + "; " + placement;
}

}  // namespace

std::string thread_placement() { return placement; }

Runtime::Runtime(int& argc, char* argv[]) {
  const int driver_cpu = gpu_driver_cpu();  // a bad WRITESCOPE_GPU_DRIVER_CPU stops here, named
  const bool placed_here = std::getenv("OMP_PLACES") == nullptr && std::getenv("OMP_PROC_BIND") == nullptr;
  if (placed_here)
    place_openmp_threads(has_gpu ? driver_cpu : -1);
  else if (has_gpu && driver_cpu >= 0)
    placement += "; GPU driver on CPU " + std::to_string(driver_cpu);
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
