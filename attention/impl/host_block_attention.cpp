// The host block products, built by the host compiler alone in both variants
// (writescope_host_kernels in cmake/WriteScopeTarget.cmake).
#include "attention/impl/host_block_attention.hpp"

namespace writescope::impl {

template void host_run_attention<float>(const HostSegment<float>*, int, int, float*, float*, CpuPath,
                                        const std::uint32_t* const*, const HostSegment<float>*, const float* const*, PrefetchLevel,
                                        int);
template void host_run_attention<bf16>(const HostSegment<bf16>*, int, int, float*, float*, CpuPath,
                                       const std::uint32_t* const*, const HostSegment<bf16>*, const float* const*, PrefetchLevel,
                                       int);

}  // namespace writescope::impl
