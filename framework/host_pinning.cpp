#include "framework/host_pinning.hpp"

#include <Kokkos_Core.hpp>

#include <stdexcept>
#include <string>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

#include "framework/config.hpp"

namespace writescope {

HostPinning::HostPinning(void* data, std::size_t bytes) : data_(data), bytes_(bytes) {
#ifdef KOKKOS_ENABLE_CUDA
  if (bytes_ == 0) return;
  if (const cudaError_t error = cudaHostRegister(data_, bytes_, cudaHostRegisterPortable); error != cudaSuccess) {
    cudaGetLastError();  // clear it, so that later calls do not report it again
    throw std::runtime_error("cannot pin " + format_byte_size(bytes_) + " of host memory: " +
                             cudaGetErrorString(error));
  }
#endif
}

HostPinning::~HostPinning() {
#ifdef KOKKOS_ENABLE_CUDA
  if (bytes_ != 0) cudaHostUnregister(data_);
#endif
}

}  // namespace writescope
