#pragma once
// The AVX-512 BF16 multiply-add peak's workload for writescope calibrate,
// without Kokkos: product_peaks.cpp is built by the host compiler alone in
// both variants (writescope_host_kernels in cmake/WriteScopeTarget.cmake).

#include <cstdint>

namespace writescope::impl {

/// Independent accumulator chains of the peak loops: enough to cover the
/// multiply-add latency times its ports.
inline constexpr int peak_chains = 12;

/// peak_chains chains of `iterations` dependent vdpbf16ps each (32
/// multiply-adds apiece), started at seed + chain; returns the sum of their
/// lanes so that the work cannot be dropped. Only on CPUs with AVX-512 BF16.
float bf16_dot_chains(float seed, std::int64_t iterations);

}  // namespace writescope::impl
