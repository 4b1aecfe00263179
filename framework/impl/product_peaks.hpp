#pragma once
// The AVX-512 multiply-add peaks' workloads, for writescope calibrate and for
// the choice between the two AVX-512 paths (cpu_path.cpp), without Kokkos: product_peaks.cpp is built by the host compiler alone in
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

/// The same with 16-lane fp32 FMAs (vfmadd on zmm registers, 16
/// multiply-adds apiece). Only on CPUs with AVX-512 BF16 (the AVX-512 paths,
/// whose prefill, linear and avx512_fma decode products these are).
float fp32_fma16_chains(float seed, std::int64_t iterations);

}  // namespace writescope::impl
