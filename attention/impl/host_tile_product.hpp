#pragma once
// The host prefill kernel's online-softmax step on staged score tiles; its
// products are framework/host_gemm.hpp's.

#include <cstdint>

#include "framework/cpu_path.hpp"

namespace writescope::impl {

/// The online-softmax step of one staged score tile, and the rescale of the
/// query tile's accumulators. Query x's score for key j sits at
/// scores[x * query_stride + j * key_stride] (one stride is 1); keys
/// j >= seen[x] are masked (causal mask, padding).
///   queries: rows of the tile (seen, maxima, sums and o hold that many);
///            the avx2 path needs a multiple of 8 when query_stride == 1
///   keys:    key columns, a multiple of 8 on the avx2 path
/// Afterwards every score holds p = exp(score - new max) or 0; maxima and sums
/// are updated (a query that sees no key keeps them); o's rows (query, value_dims
/// of leading dimension ldo) are multiplied by exp(old max - new max).
void host_tile_softmax(CpuPath path, float* scores, std::int64_t query_stride, std::int64_t key_stride, int queries,
                       int keys, const int* seen, float* maxima, float* sums, float* o, int ldo, int value_dims);

}  // namespace writescope::impl
