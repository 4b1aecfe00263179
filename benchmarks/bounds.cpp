#include "bounds.hpp"

#include <algorithm>
#include <cmath>

#include "framework/launch.hpp"

namespace writescope::bench {

double kv_bytes(const AttentionShape& shape, std::int64_t tokens) {
  return static_cast<double>(tokens) * static_cast<double>(shape.kv_bytes_per_token(sizeof(bf16)));
}

void report_sampled_roofline(benchmark::State& state, double gbps, const HostRateSampler& sampler,
                             double multiply_adds_per_byte) {
  const double dram = sampler.dram_read_gbps(), compute = sampler.product_gmacs() / multiply_adds_per_byte;
  state.counters["sampled_bound_GB/s"] = dram;
  state.counters["sampled_compute_bound_GB/s"] = compute;
  state.counters["fraction_of_sampled_roofline"] = gbps / std::min(dram, compute);
  state.counters["rate_samples"] = sampler.samples();
  report_sampled_l2(state, sampler);
}

double host_dram_read_gbps() {
  static const double gbps = measure_host_dram_read_gbps();
  return gbps;
}

#ifdef KOKKOS_ENABLE_CUDA
double pinned_h2d_gbps() {
  static const double gbps = measure_copy_gbps<GpuMemSpace, PinnedMemSpace>(std::int64_t{1} << 30);
  return gbps;
}

double hbm_copy_gbps() {
  static const double gbps = measure_copy_gbps<GpuMemSpace, GpuMemSpace>(std::int64_t{1} << 30, 2.0);
  return gbps;
}

namespace {

/// FMA chains per thread of FmaPeakKernel: enough to cover the FMA latency
/// from one thread's registers.
constexpr int fma_peak_chains = 8;

/// Each thread runs `steps` x fma_peak_chains dependent-per-chain FMAs and
/// stores their sum, so that none is dropped.
struct FmaPeakKernel {
  Kokkos::View<float*, GpuMemSpace> sums;
  int steps;

  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    float chains[fma_peak_chains];
    for (int c = 0; c < fma_peak_chains; ++c) chains[c] = static_cast<float>(i + c) * 1e-7f;
    const float a = 0.999f, b = 1e-3f;
    for (int s = 0; s < steps; ++s)
      for (int c = 0; c < fma_peak_chains; ++c) chains[c] = chains[c] * a + b;
    float total = 0;
    for (int c = 0; c < fma_peak_chains; ++c) total += chains[c];
    sums(i) = total;
  }
};

}  // namespace

double gpu_fp32_fma_gmacs() {
  static const double gmacs = [] {
    const int threads = 1 << 22, steps = 1024;  // ~30k threads per SM of an H200: every scheduler busy
    const FmaPeakKernel kernel{Kokkos::View<float*, GpuMemSpace>("writescope::benchmarks::fma_peak", threads), steps};
    const GpuExecSpace space;
    double best = 0;
    for (int round = 0; round < 5; ++round) {
      const double seconds = time_fenced(space, [&](const GpuExecSpace& s) {
        launch_parallel_for("writescope::benchmarks::fma_peak", Kokkos::RangePolicy<GpuExecSpace>(s, 0, threads),
                            kernel);
      });
      best = std::max(best, static_cast<double>(threads) * steps * fma_peak_chains / seconds / 1e9);
    }
    return best;
  }();
  return gmacs;
}
#endif

}  // namespace writescope::bench
