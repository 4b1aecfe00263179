#include "framework/runtime.hpp"

#include <sstream>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace writescope {

Runtime::Runtime(int& argc, char* argv[]) {
#ifdef KOKKOS_ENABLE_CUDA
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0)
    throw RuntimeError(std::string("this is a CUDA build of WriteScope but no CUDA device is usable (") +
                       (status != cudaSuccess ? cudaGetErrorString(status) : "no devices") +
                       "); run the host build (scripts/build.sh host) on machines without a GPU");
#endif
  guard_.emplace(argc, argv);
}

std::string kokkos_configuration() {
  std::ostringstream out;
  Kokkos::print_configuration(out, true);
  return out.str();
}

}  // namespace writescope
