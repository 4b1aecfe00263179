#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "framework/impl/product_peaks.hpp"

#include "framework/simd.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16
#include <immintrin.h>

namespace writescope::impl {

// One target region for both: they run only on the avx512_bf16 CPU path, and
// the shared loop must inline their steps.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")
/// Runs `iterations` steps of peak_chains accumulators started at seed +
/// chain; returns the sum of their lanes, so that the work cannot be dropped.
template <class Step>
inline float chains(float seed, std::int64_t iterations, Step step) {
  __m512 acc[peak_chains];
  for (int c = 0; c < peak_chains; ++c) acc[c] = _mm512_set1_ps(seed + c);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < peak_chains; ++c) acc[c] = step(acc[c]);
  float sum = 0;
  alignas(64) float lanes[16];
  for (int c = 0; c < peak_chains; ++c) {
    _mm512_store_ps(lanes, acc[c]);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}

float fp32_fma16_chains(float seed, std::int64_t iterations) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  return chains(seed, iterations, [&](__m512 acc) { return _mm512_fmadd_ps(acc, a, b); });
}

float bf16_dot_chains(float seed, std::int64_t iterations) {
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // bf16 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // bf16 2^-24
  return chains(seed, iterations, [&](__m512 acc) { return _mm512_dpbf16_ps(acc, a, b); });
}
#pragma GCC pop_options

}  // namespace writescope::impl
#endif
