// The host linear kernels, built by the host compiler alone in both variants
// (writescope_host_kernels in cmake/WriteScopeTarget.cmake).
#include "moe/impl/linear_host.hpp"

namespace writescope::impl {

template void linear_features_host<float>(const float*, std::int64_t, int, int, const float*, std::int64_t, int,
                                          float*, std::int64_t, bool);
template void linear_features_host<bf16>(const float*, std::int64_t, int, int, const bf16*, std::int64_t, int, float*,
                                         std::int64_t, bool);

}  // namespace writescope::impl
