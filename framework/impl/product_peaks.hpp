#pragma once
// The AVX-512 multiply-add peaks' workloads, for writescope calibrate and for
// the choice between the two AVX-512 paths (cpu_path.cpp), without Kokkos: product_peaks.cpp is built by the host compiler alone in
// both variants (writescope_host_kernels in cmake/WriteScopeTarget.cmake).

#include <cstdint>
#include <string>

namespace writescope::impl {

/// Independent accumulator chains of the peak loops: enough to cover the
/// multiply-add latency times its ports, within the registers: 12 of the 16
/// AVX2 ones; 16 of the 32 AVX-512 ones (12 ran vdpbf16ps at 0.93 of the rate
/// of 16 on Zen 5, whose latency of 6 cycles x 2 ports asks for 12 at least).
inline constexpr int peak_chains = 12;
inline constexpr int avx512_peak_chains = 16;

/// avx512_peak_chains chains of `iterations` dependent vdpbf16ps each (32
/// multiply-adds apiece), started at seed + chain; returns the sum of their
/// lanes so that the work cannot be dropped. Only on CPUs with AVX-512 BF16.
float bf16_dot_chains(float seed, std::int64_t iterations);

/// The same with 16-lane fp32 FMAs (vfmadd on zmm registers, 16
/// multiply-adds apiece). Only on CPUs with AVX-512 BF16 (the AVX-512 paths,
/// whose prefill, linear and avx512_fma decode products these are).
float fp32_fma16_chains(float seed, std::int64_t iterations);

/// Multiply-adds of one tdpbf16ps (16 x 16 x 32).
inline constexpr double tile_dot_multiply_adds = 16.0 * 16 * 32;
/// Independent tile accumulators of amx_tile_chains (tdpbf16ps' latency is
/// about four times its issue interval).
inline constexpr int tile_chains = 4;

/// `iterations` steps of tile_chains dependent tdpbf16ps each, on this
/// thread's tiles (configured and released here); returns an element of the
/// accumulators so that the work cannot be dropped. Only where
/// cpu_path_supported(CpuPath::amx_bf16).
float amx_tile_chains(float seed, std::int64_t iterations);

/// "" where tdpbf16ps on this CPU gives EmulatedTiles' result for operands
/// of small integers (exact in any summation order), with whole tiles, short
/// ones and narrow ones, one operand loaded with a stride; else which tiles
/// differed and where (first_tile_difference). The dispatcher's check before
/// it trusts the amx_bf16 path. Only on CPUs with AMX-BF16 whose OS granted
/// the tile data.
std::string amx_tiles_mismatch();

}  // namespace writescope::impl
