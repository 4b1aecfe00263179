#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

// The AVX-512 decode linear layer: linear_split_kernel.hpp on 16-lane
// vectors, a 64-byte line of bf16 weights per load.

#include "moe/impl/linear_host.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16

#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

// Inside the target region: the shared kernel is compiled for AVX-512 here.
#include "moe/impl/linear_split_kernel.hpp"

namespace writescope::impl {
namespace {

struct Avx512Lines {
  using Vec = __m512;
  static constexpr int lanes = 16;
  static constexpr CpuPath path = CpuPath::avx512_fma;  // the kernel of both AVX-512 paths
  /// 32 registers: 16 accumulators, 4 weight rows against up to 4 input
  /// rows; 5-8 rows as 4 and the rest, the second group reading the 4 weight
  /// rows' lines from L1 (against 2 weight rows x 8 input rows, which loaded
  /// an input vector per 2 FMAs: expert_linear at 8 rows, 2 threads, Zen 5,
  /// 7 alternations: -2 to +17%, median +7%).
  static constexpr int first_rows(int rows) { return rows > 4 ? 4 : rows; }
  static constexpr int step(int) { return 4; }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, Vec v) { _mm512_store_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  template <bool LoadOnce>
  static void weights(const bf16* row, Vec& even, Vec& odd) {
    __m512i raw = _mm512_loadu_si512(row);
    if constexpr (LoadOnce) __asm__("" : "+v"(raw));
    even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static void in_registers(Vec& a, Vec& b) { __asm__("" : "+v"(a), "+v"(b)); }
  static float sum(Vec v) {
    const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    return simd::horizontal_sum(_mm512_castps512_ps256(_mm512_add_ps(v, swapped)));
  }
};

}  // namespace

void linear_features_avx512(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                            float* y, std::int64_t y_stride, const bf16* next) {
  split_kernel::linear_features<Avx512Lines>(x_split, rows, in, w, w_stride, features, y, y_stride, next);
}

}  // namespace writescope::impl

#pragma GCC pop_options

#endif  // WRITESCOPE_HOST_AVX512_BF16
