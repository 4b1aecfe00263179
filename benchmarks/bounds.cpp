#include "bounds.hpp"

#include <algorithm>
#include <cmath>

namespace writescope::bench {

double kv_bytes(const AttentionShape& shape, std::int64_t tokens) {
  return static_cast<double>(tokens) * shape.kv_heads *
         (shape.key_dim + (shape.values_in_keys ? 0 : shape.value_dim)) * sizeof(bf16);
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
#endif

}  // namespace writescope::bench
