#include "framework/streams.hpp"

#include <stdexcept>
#include <string>

namespace writescope {

GpuStreams::GpuStreams(int count) {
  for (int i = 0; i < count; ++i) {
#ifdef KOKKOS_ENABLE_CUDA
    cudaStream_t stream = nullptr;
    const cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status != cudaSuccess) throw std::runtime_error(std::string("cudaStreamCreate: ") + cudaGetErrorString(status));
    streams_.push_back(stream);
    instances_.emplace_back(stream);
#else
    instances_.emplace_back();
#endif
  }
}

GpuStreams::~GpuStreams() {
  for (const auto& instance : instances_) instance.fence();
  instances_.clear();
#ifdef KOKKOS_ENABLE_CUDA
  for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
#endif
}

}  // namespace writescope
