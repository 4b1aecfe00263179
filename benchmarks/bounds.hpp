#pragma once
// Bandwidth bounds measured in the running benchmark process, so every kernel
// figure can be reported as a fraction of a bound from the same run.

#include <Kokkos_Core.hpp>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "framework/spaces.hpp"
#include "framework/timer.hpp"

namespace writescope::bench {

using HostWords = Kokkos::View<std::uint64_t*, HostMemSpace>;

/// `bytes` of host memory, first touched by the threads that read it later.
HostWords first_touched(const std::string& label, std::int64_t bytes);
/// Reads every word once on the host execution space (a vectorised integer sum).
std::uint64_t read_words(const HostExecSpace& space, const HostWords& words);
/// destination = source on the host execution space.
void copy_words(const HostExecSpace& space, const HostWords& destination, const HostWords& source);

/// Runs `work(space)` once per benchmark iteration, fenced before and after,
/// as the iteration's manual time; returns the total seconds.
template <class ExecSpace, class Work>
double run_fenced_iterations(benchmark::State& state, const ExecSpace& space, Work&& work) {
  double total = 0;
  for (auto _ : state) {
    const double seconds = time_fenced(space, work);
    state.SetIterationTime(seconds);
    total += seconds;
  }
  return total;
}

/// Host DRAM read bandwidth in GB/s (10^9 B/s): best of several fenced reads of
/// 1 GiB with all host threads, measured once per process.
double host_dram_read_gbps();

/// Host fp32 multiply-add throughput in 10^9 lane-FMAs per second (one FMA on
/// one float lane counts once) with all host threads and the widest vectors
/// this build uses (8-wide AVX2 FMA), measured once per process. The ceiling
/// of any fp32 kernel on this CPU.
double host_fma_glanes();

#ifdef KOKKOS_ENABLE_CUDA
/// Pinned host -> device copy bandwidth in GB/s, measured once per process.
double pinned_h2d_gbps();
/// Device memory bandwidth in GB/s (bytes read + written by a device copy), once per process.
double hbm_copy_gbps();
#endif

}  // namespace writescope::bench
