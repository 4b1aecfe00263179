#include "bounds.hpp"

#include <cmath>

namespace writescope::bench {

double kv_bytes(const AttentionShape& shape, std::int64_t tokens) {
  return static_cast<double>(tokens) * shape.kv_heads *
         (shape.key_dim + (shape.values_in_keys ? 0 : shape.value_dim)) * sizeof(bf16);
}

RotatedCaches rotated_caches(const AttentionShape& shape, Region region, std::int64_t tokens) {
  constexpr double rotated_bytes = 512.0 * (1 << 20);
  const int copies = static_cast<int>(std::ceil(rotated_bytes / kv_bytes(shape, tokens)));
  RotatedCaches rotated;
  for (int c = 0; c < copies; ++c) {
    rotated.caches.push_back(filled_cache(shape, region, tokens));
    rotated.segments.push_back(rotated.caches.back()->segments(0, region, {0}, {TokenRange{0, tokens}}));
  }
  return rotated;
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
