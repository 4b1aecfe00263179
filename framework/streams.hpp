#pragma once
// Independent GPU execution-space instances (one CUDA stream each), so that
// copies and kernels can overlap. In a host-only build they are ordinary host
// execution-space instances and everything runs in order.

#include <vector>

#include "framework/spaces.hpp"

namespace writescope {

class GpuStreams {
 public:
  explicit GpuStreams(int count);
  ~GpuStreams();
  GpuStreams(const GpuStreams&) = delete;
  GpuStreams& operator=(const GpuStreams&) = delete;

  const GpuExecSpace& operator[](int index) const { return instances_.at(index); }

 private:
  std::vector<GpuExecSpace> instances_;
#ifdef KOKKOS_ENABLE_CUDA
  std::vector<cudaStream_t> streams_;
#endif
};

}  // namespace writescope
