#pragma once
// The innermost product of host prefill attention (prefill.hpp): a small fp32
// GEMM on tiles staged in L1/L2, C += A · B, in register tiles whose FMAs
// outnumber their loads (so the product is FMA-bound on Zen 3/4/5 and Intel
// cores): 4 x 16 with 8-wide FMAs (avx2), 8 x 32 with 16-wide FMAs where the
// CPU has AVX-512 (the avx512_bf16 path; fp32 products, as the tiles are
// fp32). The path is chosen at run time (framework/cpu_path.hpp); the scalar
// loop is the fallback.

#include <cstdint>

#include "framework/cpu_path.hpp"

namespace writescope::impl {

/// The path host_tile_gemm takes when `active` is allowed: avx512_bf16 (its
/// AVX-512F FMAs) or avx2 where compiled and allowed, else scalar.
CpuPath host_tile_product_path(CpuPath active);

/// c (m, n) += a (m, k) · b (k, n).
///   a: element (i, p) at a[i * a_row + p * a_col] (either orientation of a staged tile)
///   b: row-major, leading dimension ldb; c: row-major, leading dimension ldc
/// The avx2 path needs m % 4 == 0 and n % 16 == 0, the avx512_bf16 path
/// m % 8 == 0 and n % 16 == 0 (callers pad their tiles).
void host_tile_gemm(CpuPath path, int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col,
                    const float* b, int ldb, float* c, int ldc);

/// The online-softmax step of one staged score tile, and the rescale of the
/// query tile's accumulators. Query x's score for key j sits at
/// scores[x * query_stride + j * key_stride] (one stride is 1); keys
/// j >= seen[x] are masked (causal mask, padding).
///   queries: rows of the tile (seen, maxima, sums, corrections and o hold that many);
///            the avx2 path needs a multiple of 8 when query_stride == 1
///   keys:    key columns, a multiple of 8 on the avx2 path
/// Afterwards every score holds p = exp(score - new max) or 0; maxima and sums
/// are updated (a query that sees no key keeps them); o's rows (query, value_dims
/// of leading dimension ldo) are multiplied by exp(old max - new max).
void host_tile_softmax(CpuPath path, float* scores, std::int64_t query_stride, std::int64_t key_stride, int queries,
                       int keys, const int* seen, float* maxima, float* sums, float* o, int ldo, int value_dims);

}  // namespace writescope::impl
