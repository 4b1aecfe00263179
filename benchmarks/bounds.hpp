#pragma once
// Bounds measured once in the running benchmark process (experiments/
// calibration.hpp), so every kernel figure can be reported as a fraction of a
// bound from the same run, the fenced manual-time loop they all use, and the
// KV caches the attention benchmarks rotate through.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/shape.hpp"
#include "experiments/calibration.hpp"
#include "framework/timer.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope::bench {

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

/// Bytes of bf16 keys and values of `tokens` tokens of `shape`.
double kv_bytes(const AttentionShape& shape, std::int64_t tokens);

/// Copies of one sequence of `tokens` tokens filled into `region`
/// (filled_cache), with each copy's segments over the whole sequence, that
/// together hold at least 512 MiB of KV: several times any last-level cache
/// of the machines at hand (32 MiB per Zen CCD, up to 105 MiB on the GPU
/// machine's host), so a benchmark that rotates through them reads its KV from
/// DRAM every iteration.
struct RotatedCaches {
  std::vector<std::unique_ptr<InplaceKVCache<bf16>>> caches;
  std::vector<std::vector<BlockSegment>> segments;
  int copies() const { return static_cast<int>(caches.size()); }
};
RotatedCaches rotated_caches(const AttentionShape& shape, Region region, std::int64_t tokens);

/// Host DRAM read bandwidth (GB/s), all host threads, 1 GiB.
double host_dram_read_gbps();
#ifdef KOKKOS_ENABLE_CUDA
/// Pinned host -> device copy bandwidth (GB/s).
double pinned_h2d_gbps();
/// Device memory bandwidth (GB/s, bytes read + written by a device copy).
double hbm_copy_gbps();
#endif

}  // namespace writescope::bench
