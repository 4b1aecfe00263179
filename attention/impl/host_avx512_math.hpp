#pragma once
// Softmax arithmetic shared by the AVX-512 decode products
// (host_block_attention_avx512bf16.cpp, host_block_attention_amx.cpp).
// Include it only inside a `#pragma GCC target` region with AVX-512F: its
// functions take that region's target.

#include <immintrin.h>

#include <cstdint>

#include "framework/bf16.hpp"
#include "framework/simd.hpp"

namespace writescope::impl {
namespace {

/// exp(x) for 16 floats (simd::exp8's method); exactly 0 below -87, so
/// masked-out scores contribute nothing.
inline __m512 exp16(__m512 x) {
  using namespace simd::exp_coefficients;
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_low), _mm512_fnmadd_ps(n, _mm512_set1_ps(ln2_high), x));
  __m512 p = _mm512_set1_ps(polynomial[0]);
  for (int k = 1; k < 6; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(polynomial[k]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // p x 2^n in one instruction (n >= -126: a normal power), where exp8 builds
  // 2^n's bits in three: +1-2% for the AVX-512 decode products in L2 (Zen 5).
  return _mm512_maskz_scalef_ps(live, p, n);
}

/// Sum and maximum of 16 lanes (GCC 12's own 512-bit reductions warn about
/// their undefined vectors).
inline __m256 fold_halves(__m512 v, bool maximum) {
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
  return _mm512_castps512_ps256(maximum ? _mm512_max_ps(v, swapped) : _mm512_add_ps(v, swapped));
}
inline float sum16(__m512 v) { return simd::horizontal_sum(fold_halves(v, false)); }
inline float max16(__m512 v) { return simd::horizontal_max(fold_halves(v, true)); }

/// The _mm512_permutexvar_epi16 index whose word i is element (i % 2) * 16 +
/// i / 2: the two 16-word halves of a vector interleaved into 16 pairs (a key
/// line's dims d and d + 1 of 16 tokens into (d, d + 1) pairs; two rows'
/// weights into (p_t, p_t+1) pairs).
inline __m512i interleave_halves() {
  alignas(64) static constexpr std::int16_t order[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                         8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_load_si512(order);
}

/// (first, second) rounded to bf16 as one pair word (framework/bf16.hpp).
inline std::uint32_t bf16_pair(float first, float second) {
  return bf16_pair(from_float<bf16>(first), from_float<bf16>(second));
}

}  // namespace
}  // namespace writescope::impl
