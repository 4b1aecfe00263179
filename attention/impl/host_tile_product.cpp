// Built by the host compiler alone in both variants (writescope_host_kernels).
#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "attention/impl/host_tile_product.hpp"

#include <algorithm>
#include <vector>

#include "framework/math.hpp"
#include "framework/simd.hpp"

namespace writescope::impl {

CpuPath host_tile_product_path(CpuPath active) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (active >= CpuPath::avx512_bf16) return CpuPath::avx512_bf16;
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2) return CpuPath::avx2;
#endif
  (void)active;
  return CpuPath::scalar;
}

namespace {

void tile_gemm_scalar(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                      int ldb, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const float x = a[i * a_row + p * a_col];
      for (int j = 0; j < n; ++j) c[i * ldc + j] += x * b[p * ldb + j];
    }
}

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
    // Queries that see nothing keep their state (factor 1); exp8 turns the
    // -inf - -inf of a query's first keys into 0, not NaN.
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

void tile_gemm_avx2(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                    int ldb, float* c, int ldc) {
  for (int i = 0; i < m; i += 4) {
    const float* a0 = a + i * a_row;
    for (int j = 0; j < n; j += 16) {
      __m256 acc[8];
WRITESCOPE_UNROLL(4)
      for (int r = 0; r < 4; ++r) {
        acc[2 * r] = _mm256_loadu_ps(c + (i + r) * ldc + j);
        acc[2 * r + 1] = _mm256_loadu_ps(c + (i + r) * ldc + j + 8);
      }
      const float* bp = b + j;
      for (int p = 0; p < k; ++p, bp += ldb) {
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        const float* ap = a0 + p * a_col;
WRITESCOPE_UNROLL(4)
        for (int r = 0; r < 4; ++r) {
          const __m256 x = _mm256_broadcast_ss(ap + r * a_row);
          acc[2 * r] = _mm256_fmadd_ps(x, b0, acc[2 * r]);
          acc[2 * r + 1] = _mm256_fmadd_ps(x, b1, acc[2 * r + 1]);
        }
      }
WRITESCOPE_UNROLL(4)
      for (int r = 0; r < 4; ++r) {
        _mm256_storeu_ps(c + (i + r) * ldc + j, acc[2 * r]);
        _mm256_storeu_ps(c + (i + r) * ldc + j + 8, acc[2 * r + 1]);
      }
    }
  }
}
#endif

#ifdef WRITESCOPE_HOST_AVX512_BF16
// 16-lane fp32 FMAs on CPUs with AVX-512 (the avx512_bf16 path implies
// AVX-512F): 8 rows x 2 vectors = 16 accumulators of the 32 zmm registers,
// 2 loads of B and 8 broadcasts per 16 FMAs.
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
template <int Vectors>
inline void tile_gemm_avx512_block(int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                                   int ldb, float* c, int ldc) {
  __m512 acc[8 * Vectors];
WRITESCOPE_UNROLL(8)
  for (int r = 0; r < 8; ++r)
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) acc[r * Vectors + v] = _mm512_loadu_ps(c + r * ldc + 16 * v);
  for (int p = 0; p < k; ++p, b += ldb) {
    __m512 bv[Vectors];
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
    const float* ap = a + p * a_col;
WRITESCOPE_UNROLL(8)
    for (int r = 0; r < 8; ++r) {
      const __m512 x = _mm512_set1_ps(ap[r * a_row]);
WRITESCOPE_UNROLL(2)
      for (int v = 0; v < Vectors; ++v) acc[r * Vectors + v] = _mm512_fmadd_ps(x, bv[v], acc[r * Vectors + v]);
    }
  }
WRITESCOPE_UNROLL(8)
  for (int r = 0; r < 8; ++r)
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r * Vectors + v]);
}

void tile_gemm_avx512(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                      int ldb, float* c, int ldc) {
  for (int i = 0; i < m; i += 8) {
    int j = 0;
    for (; j + 32 <= n; j += 32)
      tile_gemm_avx512_block<2>(k, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
    if (j < n) tile_gemm_avx512_block<1>(k, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
  }
}
#pragma GCC pop_options
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

void host_tile_gemm(CpuPath path, int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col,
                    const float* b, int ldb, float* c, int ldc) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (path >= CpuPath::avx512_bf16) {
    tile_gemm_avx512(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    return;
  }
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (path >= CpuPath::avx2) {
    tile_gemm_avx2(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    return;
  }
#endif
  (void)path;
  tile_gemm_scalar(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}

}  // namespace writescope::impl
