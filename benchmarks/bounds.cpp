#include "bounds.hpp"

namespace writescope::bench {

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
