#pragma once
// The overlap workload of the host bounds (benchmarks/bandwidth.cpp,
// host_overlap), without Kokkos: fma_stream.cpp is built by the host compiler
// alone in both variants (writescope_host_kernels in
// cmake/WriteScopeTarget.cmake). A stream of 64-byte lines, each followed by
// a fixed number of register FMAs and nothing else: its rate from DRAM
// against its rate in cache says how much of the memory time and the compute
// time this machine overlaps for a kernel of that many multiply-adds per
// byte, the most any kernel of that intensity can reach here.

#include <cstdint>

#include "framework/cpu_path.hpp"

namespace writescope::impl {

/// 16-lane FMAs per 64-byte line that fma_stream runs: 0.5 to 16
/// multiply-adds per byte (the expert linear layer: rows / 2; Qwen3's decode
/// products 4, Mixtral's 2, MLA's 15).
inline constexpr int fma_stream_intensities[] = {2, 4, 8, 16, 32, 64};

/// Lines [0, count) of `lines` (64-byte aligned, 16 floats each), each loaded
/// once and multiplied into register chains `fmas_per_line` times,
/// acc = line * multiplier + acc, with the fp32 FMA of `path`
/// (fp32_fma_path: 16-lane on the AVX-512 paths and amx_bf16, twice as many
/// 8-lane ones on avx2, plain multiply-adds on scalar), and requested into L1
/// `prefetch_bytes` ahead (0, or the scalar path: not requested). Returns the sum of the chains'
/// lanes: with multiplier 1, fmas_per_line times the sum of the floats read
/// (exact for small integers). std::invalid_argument where fmas_per_line is not
/// one of fma_stream_intensities or `path` does not run here.
float fma_stream(CpuPath path, const float* lines, std::int64_t count, int fmas_per_line, float multiplier,
                 std::int64_t prefetch_bytes);

}  // namespace writescope::impl
