#pragma once
// A small fp32 GEMM for the host kernels that work on tiles staged in L1/L2
// (prefill attention's tile products, linear layers of many rows),
// C += A · B, in register tiles whose FMAs outnumber their loads, so that it
// is FMA-bound on Zen 3/4/5 and Intel cores: 4 x 16 with 8-wide FMAs (avx2),
// 8 x 32 with 16-wide FMAs where the CPU has AVX-512 (both AVX-512 paths'
// AVX-512F). The path is chosen at run time (cpu_path.hpp); the scalar loop
// is the fallback. Built by the host compiler alone in both variants.

#include <cstdint>

#include "framework/cpu_path.hpp"

namespace writescope {

/// The path host_gemm takes when `active` is allowed: `active` if an AVX-512
/// path (their AVX-512F FMAs), avx2 where compiled and allowed, else scalar.
CpuPath host_gemm_path(CpuPath active);

/// c (m, n) += a (m, k) · b (k, n).
///   a: element (i, p) at a[i * a_row + p * a_col] (either orientation of a staged tile)
///   b: row-major, leading dimension ldb; c: row-major, leading dimension ldc
/// The avx2 path needs m % 4 == 0 and n % 16 == 0, the AVX-512 paths
/// m % 8 == 0 and n % 16 == 0 (callers pad their tiles); scalar takes any.
void host_gemm(CpuPath path, int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col,
               const float* b, int ldb, float* c, int ldc);

/// The multiple of rows host_gemm's `path` needs; callers run any remaining
/// rows on CpuPath::scalar (linear_features_gemm does).
int host_gemm_row_multiple(CpuPath path);

}  // namespace writescope
