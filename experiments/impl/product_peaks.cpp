#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "experiments/impl/product_peaks.hpp"

#include "framework/simd.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16
#include <immintrin.h>

namespace writescope::impl {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
float bf16_dot_chains(float seed, std::int64_t iterations) {
  __m512 acc[peak_chains];
  for (int c = 0; c < peak_chains; ++c) acc[c] = _mm512_set1_ps(seed + c);
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // bf16 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // bf16 2^-24
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < peak_chains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  float sum = 0;
  alignas(64) float lanes[16];
  for (int c = 0; c < peak_chains; ++c) {
    _mm512_store_ps(lanes, acc[c]);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,fma")
float fp32_fma16_chains(float seed, std::int64_t iterations) {
  __m512 acc[peak_chains];
  for (int c = 0; c < peak_chains; ++c) acc[c] = _mm512_set1_ps(seed + c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < peak_chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  float sum = 0;
  alignas(64) float lanes[16];
  for (int c = 0; c < peak_chains; ++c) {
    _mm512_store_ps(lanes, acc[c]);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}
#pragma GCC pop_options

}  // namespace writescope::impl
#endif
