#pragma once
// The innermost block product of CPU decode attention: one block segment, one
// KV head, its whole group of query heads.
//
// Why it looks like this: the CPU kernel is compute-bound (DESIGN.md §9), so
// every KV element is converted from bf16 once and reused from a register for
// all query heads of the group; scores, exponentials and the PV product run in
// 8-wide AVX2 vectors with the accumulators of a tile of query heads held in
// registers across a tile of tokens. Without AVX2/FMA (or for dims that are not
// multiples of 8) a plain scalar loop computes the same thing.

#include <algorithm>
#include <cmath>

#include "framework/bf16.hpp"
#include "framework/math.hpp"
#include "layouts/kv_format.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#define WRITESCOPE_HOST_AVX2 1
#endif

namespace writescope::impl {

/// Largest query-head group a KV head may serve (MLA: 16).
inline constexpr int max_group = 16;

/// Inputs of one block segment for one KV head.
template <class Scalar>
struct HostSegment {
  const Scalar* block;      // the block's first element
  BlockGeometry geometry;
  BlockOrder order;
  int kv_head;
  int token_begin;          // first token inside the block
  int token_count;
  const float* queries;     // (group, key_dim): the group's query heads, contiguous
  int group;
  float scale;
};

/// Scalar path. scores: (group, token_count) scratch; o: (group, value_dim); lse: (group).
template <class Scalar>
void host_segment_attention_scalar(const HostSegment<Scalar>& s, float* scores, float* o, float* lse) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  for (int q = 0; q < s.group; ++q) {
    for (int i = 0; i < n; ++i) {
      float dot = 0;
      for (int d = 0; d < g.key_dim; ++d)
        dot += s.queries[q * g.key_dim + d] *
               to_float(s.block[g.key_offset(s.order, s.token_begin + i, s.kv_head, d)]);
      scores[q * n + i] = dot * s.scale;
    }
    const float m = *std::max_element(scores + q * n, scores + (q + 1) * n);
    float sum = 0;
    for (int i = 0; i < n; ++i) sum += (scores[q * n + i] = math::exp(scores[q * n + i] - m));
    for (int d = 0; d < g.value_dim; ++d) {
      float acc = 0;
      for (int i = 0; i < n; ++i)
        acc += scores[q * n + i] * to_float(s.block[g.value_offset(s.order, s.token_begin + i, s.kv_head, d)]);
      o[q * g.value_dim + d] = acc / sum;
    }
    lse[q] = m + math::log(sum);
  }
}

#ifdef WRITESCOPE_HOST_AVX2

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

inline float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

inline float horizontal_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

/// exp(x) for 8 floats, relative error < 2e-7 over the range softmax uses
/// (x <= 0); results below e^-87 flush to 0. Cephes' range reduction and
/// degree-5 polynomial.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

/// Scores of `Tile` query heads for keys stored head-major (tokens contiguous):
/// 8 tokens per vector, each key vector converted once for all heads of the tile.
template <int Tile, class Scalar>
void scores_head_major(const HostSegment<Scalar>& s, int q0, float* scores) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  const Scalar* keys = s.block + g.key_offset(BlockOrder::head_major, s.token_begin, s.kv_head, 0);
  const std::int64_t row = g.block_tokens;  // distance between dims d and d + 1
  const __m256 scale = _mm256_set1_ps(s.scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 acc[Tile];
    for (int t = 0; t < Tile; ++t) acc[t] = _mm256_setzero_ps();
    for (int d = 0; d < g.key_dim; ++d) {
      const __m256 k = load8(keys + d * row + i);
      for (int t = 0; t < Tile; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(s.queries + (q0 + t) * g.key_dim + d), k, acc[t]);
    }
    for (int t = 0; t < Tile; ++t) _mm256_storeu_ps(scores + (q0 + t) * n + i, _mm256_mul_ps(acc[t], scale));
  }
  for (; i < n; ++i)
    for (int t = 0; t < Tile; ++t) {
      float dot = 0;
      for (int d = 0; d < g.key_dim; ++d) dot += s.queries[(q0 + t) * g.key_dim + d] * to_float(keys[d * row + i]);
      scores[(q0 + t) * n + i] = dot * s.scale;
    }
}

/// Scores of `Tile` query heads for keys stored token-major (dims contiguous).
template <int Tile, class Scalar>
void scores_token_major(const HostSegment<Scalar>& s, int q0, float* scores) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  for (int i = 0; i < n; ++i) {
    const Scalar* key = s.block + g.key_offset(BlockOrder::token_major, s.token_begin + i, s.kv_head, 0);
    __m256 acc[Tile];
    for (int t = 0; t < Tile; ++t) acc[t] = _mm256_setzero_ps();
    for (int d = 0; d < g.key_dim; d += 8) {
      const __m256 k = load8(key + d);
      for (int t = 0; t < Tile; ++t)
        acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(s.queries + (q0 + t) * g.key_dim + d), k, acc[t]);
    }
    for (int t = 0; t < Tile; ++t) scores[(q0 + t) * n + i] = horizontal_sum(acc[t]) * s.scale;
  }
}

/// o(q, :) += sum_i p(q, i) * value(i, :) for `Tile` heads, values with dims
/// contiguous. Tokens are taken 16 at a time so that their value rows stay in
/// L1 while every 8-wide slice of the output is accumulated in registers.
template <int Tile, class Scalar>
void values_rows(const HostSegment<Scalar>& s, int q0, const float* p, float* o) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  const std::int64_t stride = g.value_token_stride(s.order);
  const Scalar* values = s.block + g.value_offset(s.order, s.token_begin, s.kv_head, 0);
  constexpr int token_tile = 16;
  for (int i0 = 0; i0 < n; i0 += token_tile) {
    const int i1 = std::min(n, i0 + token_tile);
    for (int d = 0; d < g.value_dim; d += 8) {
      __m256 acc[Tile];
      for (int t = 0; t < Tile; ++t) acc[t] = _mm256_loadu_ps(o + (q0 + t) * g.value_dim + d);
      for (int i = i0; i < i1; ++i) {
        const __m256 v = load8(values + i * stride + d);
        for (int t = 0; t < Tile; ++t) acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (q0 + t) * n + i), v, acc[t]);
      }
      for (int t = 0; t < Tile; ++t) _mm256_storeu_ps(o + (q0 + t) * g.value_dim + d, acc[t]);
    }
  }
}

/// Same for values stored with tokens contiguous (MLA latent in a head-major block).
template <int Tile, class Scalar>
void values_columns(const HostSegment<Scalar>& s, int q0, const float* p, float* o) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  const std::int64_t row = g.block_tokens;
  const Scalar* values = s.block + g.value_offset(BlockOrder::head_major, s.token_begin, s.kv_head, 0);
  for (int d = 0; d < g.value_dim; ++d) {
    __m256 acc[Tile];
    for (int t = 0; t < Tile; ++t) acc[t] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = load8(values + d * row + i);
      for (int t = 0; t < Tile; ++t) acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(p + (q0 + t) * n + i), v, acc[t]);
    }
    for (int t = 0; t < Tile; ++t) {
      float sum = horizontal_sum(acc[t]);
      for (int j = i; j < n; ++j) sum += p[(q0 + t) * n + j] * to_float(values[d * row + j]);
      o[(q0 + t) * g.value_dim + d] = sum;
    }
  }
}

/// Calls body.template operator()<Tile>(q0) for tiles of at most 8 heads covering the group.
template <class Body>
void for_each_head_tile(int group, Body&& body) {
  for (int q0 = 0; q0 < group; q0 += 8) {
    switch (std::min(8, group - q0)) {
      case 1: body.template operator()<1>(q0); break;
      case 2: body.template operator()<2>(q0); break;
      case 3: body.template operator()<3>(q0); break;
      case 4: body.template operator()<4>(q0); break;
      case 5: body.template operator()<5>(q0); break;
      case 6: body.template operator()<6>(q0); break;
      case 7: body.template operator()<7>(q0); break;
      default: body.template operator()<8>(q0); break;
    }
  }
}

/// Softmax numerators in place: scores(q, :) <- exp(scores(q, :) - max); returns max and sum per head.
inline void exponentiate(float* scores, int group, int n, float* maxima, float* sums) {
  for (int q = 0; q < group; ++q) {
    float* row = scores + q * n;
    __m256 vmax = _mm256_set1_ps(math::negative_infinity());
    int i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(row + i));
    float m = horizontal_max(vmax);
    for (int j = i; j < n; ++j) m = std::max(m, row[j]);
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), vm));
      _mm256_storeu_ps(row + i, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    float sum = horizontal_sum(vsum);
    for (int j = i; j < n; ++j) sum += (row[j] = math::exp(row[j] - m));
    maxima[q] = m;
    sums[q] = sum;
  }
}

template <class Scalar>
struct ScoresTile {
  const HostSegment<Scalar>& s;
  float* scores;
  template <int Tile>
  void operator()(int q0) const {
    if (s.order == BlockOrder::head_major) scores_head_major<Tile>(s, q0, scores);
    else scores_token_major<Tile>(s, q0, scores);
  }
};

template <class Scalar>
struct ValuesTile {
  const HostSegment<Scalar>& s;
  const float* p;
  float* o;
  template <int Tile>
  void operator()(int q0) const {
    if (s.order == BlockOrder::head_major && s.geometry.values_in_keys) values_columns<Tile>(s, q0, p, o);
    else values_rows<Tile>(s, q0, p, o);
  }
};

#endif  // WRITESCOPE_HOST_AVX2

/// One segment, one KV head, the whole group: o (group, value_dim) normalised,
/// lse (group) natural log. scores: scratch of group * token_count floats.
template <class Scalar>
void host_segment_attention(const HostSegment<Scalar>& s, float* scores, float* o, float* lse) {
#ifdef WRITESCOPE_HOST_AVX2
  const BlockGeometry& g = s.geometry;
  if (g.key_dim % 8 == 0 && g.value_dim % 8 == 0 && s.token_count > 0) {
    for_each_head_tile(s.group, ScoresTile<Scalar>{s, scores});
    float maxima[max_group], sums[max_group];
    exponentiate(scores, s.group, s.token_count, maxima, sums);
    std::fill(o, o + s.group * g.value_dim, 0.0f);
    for_each_head_tile(s.group, ValuesTile<Scalar>{s, scores, o});
    for (int q = 0; q < s.group; ++q) {
      const float inverse = 1.0f / sums[q];
      for (int d = 0; d < g.value_dim; ++d) o[q * g.value_dim + d] *= inverse;
      lse[q] = maxima[q] + math::log(sums[q]);
    }
    return;
  }
#endif
  host_segment_attention_scalar(s, scores, o, lse);
}

}  // namespace writescope::impl
