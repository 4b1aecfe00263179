// Built by the host compiler alone in both variants (writescope_host_kernels).
#include "attention/impl/host_tile_product.hpp"

#include <algorithm>
#include <vector>

#include "framework/math.hpp"
#include "framework/simd.hpp"

namespace writescope::impl {

namespace {

/// exp(old max - new max) per query: the factor of its accumulators.
void softmax_scalar(float* scores, std::int64_t query_stride, std::int64_t key_stride, int queries, int keys,
                    const int* seen, float* maxima, float* sums, float* corrections) {
  for (int x = 0; x < queries; ++x) {
    float* row = scores + x * query_stride;
    corrections[x] = 1;
    if (seen[x] == 0) {
      for (int j = 0; j < keys; ++j) row[j * key_stride] = 0;
      continue;
    }
    float best = math::negative_infinity();
    for (int j = 0; j < seen[x]; ++j) best = std::max(best, row[j * key_stride]);
    const float updated = std::max(maxima[x], best);
    corrections[x] = math::exp(maxima[x] - updated);  // 0 while nothing was seen yet
    float sum = 0;
    for (int j = 0; j < keys; ++j) {
      const float p = j < seen[x] ? math::exp(row[j * key_stride] - updated) : 0.0f;
      row[j * key_stride] = p;
      sum += p;
    }
    sums[x] = sums[x] * corrections[x] + sum;
    maxima[x] = updated;
  }
}

#ifdef WRITESCOPE_HOST_AVX2
using namespace simd;

const __m256i lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

/// Rows of keys contiguous (key_stride 1): one query at a time, 8 keys per vector.
void softmax_avx2_key_rows(float* scores, std::int64_t query_stride, int queries, int keys, const int* seen,
                           float* maxima, float* sums, float* corrections) {
  const __m256 minus_infinity = _mm256_set1_ps(math::negative_infinity());
  for (int x = 0; x < queries; ++x) {
    float* row = scores + x * query_stride;
    corrections[x] = 1;
    const __m256i limit = _mm256_set1_epi32(seen[x]);
    if (seen[x] == 0) {
      for (int j = 0; j < keys; j += 8) _mm256_storeu_ps(row + j, _mm256_setzero_ps());
      continue;
    }
    __m256 best = minus_infinity;
    for (int j = 0; j < keys; j += 8) {
      const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, _mm256_add_epi32(lane_index, _mm256_set1_epi32(j))));
      best = _mm256_max_ps(best, _mm256_blendv_ps(minus_infinity, _mm256_loadu_ps(row + j), in));
    }
    const float updated = std::max(maxima[x], horizontal_max(best));
    corrections[x] = math::exp(maxima[x] - updated);
    const __m256 shift = _mm256_set1_ps(updated);
    __m256 total = _mm256_setzero_ps();
    for (int j = 0; j < keys; j += 8) {
      const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, _mm256_add_epi32(lane_index, _mm256_set1_epi32(j))));
      const __m256 p = _mm256_and_ps(in, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift)));
      _mm256_storeu_ps(row + j, p);
      total = _mm256_add_ps(total, p);
    }
    sums[x] = sums[x] * corrections[x] + horizontal_sum(total);
    maxima[x] = updated;
  }
}

/// Rows of queries contiguous (query_stride 1): 8 queries per vector, walking the keys.
void softmax_avx2_query_rows(float* scores, std::int64_t key_stride, int queries, int keys, const int* seen,
                             float* maxima, float* sums, float* corrections) {
  const __m256 minus_infinity = _mm256_set1_ps(math::negative_infinity());
  for (int x = 0; x < queries; x += 8) {
    const __m256i limit = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(seen + x));
    __m256 best = minus_infinity;
    for (int j = 0; j < keys; ++j) {
      const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, _mm256_set1_epi32(j)));
      best = _mm256_max_ps(best, _mm256_blendv_ps(minus_infinity, _mm256_loadu_ps(scores + j * key_stride + x), in));
    }
    const __m256 old = _mm256_loadu_ps(maxima + x);
    const __m256 any = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, _mm256_setzero_si256()));
    // Queries that see nothing keep their state (factor 1). A query's first
    // keys give exp8(-inf) (or of NaN, for one that saw nothing): exp8 clamps
    // to e^-87, a factor that only ever multiplies sums and accumulators of 0.
    const __m256 updated = _mm256_blendv_ps(old, _mm256_max_ps(old, best), any);
    const __m256 correction = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(old, updated)), any);
    __m256 total = _mm256_setzero_ps();
    for (int j = 0; j < keys; ++j) {
      float* at = scores + j * key_stride + x;
      const __m256 in = _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, _mm256_set1_epi32(j)));
      const __m256 p = _mm256_and_ps(in, exp8(_mm256_sub_ps(_mm256_loadu_ps(at), updated)));
      _mm256_storeu_ps(at, p);
      total = _mm256_add_ps(total, p);
    }
    _mm256_storeu_ps(sums + x, _mm256_fmadd_ps(_mm256_loadu_ps(sums + x), correction, total));
    _mm256_storeu_ps(maxima + x, updated);
    _mm256_storeu_ps(corrections + x, correction);
  }
}

#endif

}  // namespace

void host_tile_softmax(CpuPath path, float* scores, std::int64_t query_stride, std::int64_t key_stride, int queries,
                       int keys, const int* seen, float* maxima, float* sums, float* o, int ldo, int value_dims) {
  float corrections[512];
  std::vector<float> many;
  float* factor = corrections;
  if (queries > 512) {
    many.resize(static_cast<std::size_t>(queries));
    factor = many.data();
  }
#ifdef WRITESCOPE_HOST_AVX2
  if (path >= CpuPath::avx2 && key_stride == 1)
    softmax_avx2_key_rows(scores, query_stride, queries, keys, seen, maxima, sums, factor);
  else if (path >= CpuPath::avx2)
    softmax_avx2_query_rows(scores, key_stride, queries, keys, seen, maxima, sums, factor);
  else
#endif
    softmax_scalar(scores, query_stride, key_stride, queries, keys, seen, maxima, sums, factor);
  (void)path;
  for (int x = 0; x < queries; ++x) {
    if (factor[x] == 1.0f) continue;
    float* row = o + static_cast<std::int64_t>(x) * ldo;
    for (int c = 0; c < value_dims; ++c) row[c] *= factor[x];
  }
}

}  // namespace writescope::impl
