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
  const __m512i exponent = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(live, p, _mm512_castsi512_ps(exponent));
}

/// Sum and maximum of 16 lanes (GCC 12's own 512-bit reductions warn about
/// their undefined vectors).
inline __m256 fold_halves(__m512 v, bool maximum) {
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
  return _mm512_castps512_ps256(maximum ? _mm512_max_ps(v, swapped) : _mm512_add_ps(v, swapped));
}
inline float sum16(__m512 v) { return simd::horizontal_sum(fold_halves(v, false)); }
inline float max16(__m512 v) { return simd::horizontal_max(fold_halves(v, true)); }

/// (first, second) rounded to bf16 as one word, first in the low half: the
/// order of a pair in vdpbf16ps and tdpbf16ps operands.
inline std::uint32_t bf16_pair(float first, float second) {
  return std::uint32_t{from_float<bf16>(first).bits} | (std::uint32_t{from_float<bf16>(second).bits} << 16);
}

}  // namespace
}  // namespace writescope::impl
