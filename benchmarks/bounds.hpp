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
/// as the iteration's manual time, then `between(seconds)` outside that time;
/// returns the total seconds.
template <class ExecSpace, class Work, class Between>
double run_fenced_iterations(benchmark::State& state, const ExecSpace& space, Work&& work, Between&& between) {
  double total = 0;
  for (auto _ : state) {
    const double seconds = time_fenced(space, work);
    state.SetIterationTime(seconds);
    total += seconds;
    between(seconds);
  }
  return total;
}

template <class ExecSpace, class Work>
double run_fenced_iterations(benchmark::State& state, const ExecSpace& space, Work&& work) {
  return run_fenced_iterations(state, space, work, [](double) {});
}

/// run_fenced_iterations, sampling the host's rates (`sampler`: a
/// HostRateSampler, or a HostProductSampler where the data must stay cached)
/// between iterations: after the first and then whenever `sample_every`
/// seconds of timed work have passed since the last sample, so short kernels
/// are not drowned in samples.
template <class ExecSpace, class Work, class Sampler>
double run_sampled_iterations(benchmark::State& state, const ExecSpace& space, Work&& work, Sampler& sampler,
                              double sample_every = 0.01) {
  double since_sample = sample_every;
  return run_fenced_iterations(state, space, work, [&](double seconds) {
    since_sample += seconds;
    if (since_sample < sample_every) return;
    sampler.sample();
    since_sample = 0;
  });
}

/// The counters of a host kernel of `gbps` against the rates sampled while it
/// ran, beside its best-of-five bounds: sampled_bound_GB/s (DRAM read),
/// sampled_compute_bound_GB/s (the sampled multiply-add rate over the kernel's
/// `multiply_adds_per_byte`), fraction_of_sampled_roofline (GB/s / the lower
/// of the two), rate_samples, and report_sampled_l2's.
void report_sampled_roofline(benchmark::State& state, double gbps, const HostRateSampler& sampler,
                             double multiply_adds_per_byte);

/// The sampler's L2 reads (HostProductSampler says why), as context:
/// sampled_l2_read_GB/s (over all samples) and l2_read_of_fastest (that over
/// the fastest sample's: below 1 where the run fell in slow periods).
template <class Sampler>
void report_sampled_l2(benchmark::State& state, const Sampler& sampler) {
  state.counters["sampled_l2_read_GB/s"] = sampler.l2_read_gbps();
  state.counters["l2_read_of_fastest"] = sampler.l2_read_gbps() / sampler.fastest_l2_read_gbps();
}

/// Bytes of bf16 keys and values of `tokens` tokens of `shape`.
double kv_bytes(const AttentionShape& shape, std::int64_t tokens);

using writescope::rotated_caches;  // experiments/calibration.hpp
using writescope::RotatedCaches;

/// Host DRAM read bandwidth (GB/s), all host threads, 1 GiB.
double host_dram_read_gbps();
#ifdef KOKKOS_ENABLE_CUDA
/// Pinned host -> device copy bandwidth (GB/s).
double pinned_h2d_gbps();
/// Device memory bandwidth (GB/s, bytes read + written by a device copy).
double hbm_copy_gbps();
/// The GPU's fp32 FMA peak (G multiply-adds/s): independent register chains
/// on every SM, best of five launches.
double gpu_fp32_fma_gmacs();
#endif

}  // namespace writescope::bench
