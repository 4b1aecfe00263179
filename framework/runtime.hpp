#pragma once
// The Kokkos runtime for a WriteScope program: one per process, alive for the
// whole main(). A CUDA build checks for a usable GPU first, so a machine
// without one gets a clear error instead of an abort inside Kokkos.
//
// Thread placement: unless OMP_PLACES or OMP_PROC_BIND say otherwise, the
// program places OpenMP itself: one thread pinned to each CPU of its start-up
// affinity mask (OMP_NUM_THREADS, if set, still chooses how many), except, in
// a CUDA build, the CPU of the host thread that drives the GPU's share of a
// step (framework/concurrent.hpp, gpu_driver_cpu()). Kokkos' advice to set
// OMP_PROC_BIND is then not printed: the threads are placed. thread_placement()
// says which placement holds (`writescope info`, every results file).

#include <Kokkos_Core.hpp>

#include <optional>
#include <stdexcept>
#include <string>

namespace writescope {

class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A Kokkos command-line argument that cannot be taken (a usage error).
class ArgumentError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

/// The most host threads a process may ask for: Kokkos 3.4's OpenMP backend
/// keeps a pool of 512 and overruns it past that.
inline constexpr int max_host_threads = 512;

class Runtime {
 public:
  /// Consumes Kokkos' own --kokkos-* arguments from argv. Throws
  /// ArgumentError naming the argument where a thread count is not an
  /// integer in [1, max_host_threads] or a NUMA or device argument not one
  /// in [0, 2^31) (Kokkos itself crashes on the first, and on the others
  /// answers "stoi"), and RuntimeError for the same in OMP_NUM_THREADS,
  /// KOKKOS_NUM_THREADS, KOKKOS_NUMA or KOKKOS_DEVICE_ID.
  Runtime(int& argc, char* argv[]);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  std::optional<Kokkos::ScopeGuard> guard_;
};

/// How the Runtime placed OpenMP's threads and the GPU driver's, in words,
/// and in a host build whether the GPU's share of a step runs on a worker
/// thread (WRITESCOPE_GPU_THREAD; MachineDescription::thread_placement).
std::string thread_placement();

/// Kokkos' print_configuration output (backends, architecture, options).
std::string kokkos_configuration();

}  // namespace writescope
