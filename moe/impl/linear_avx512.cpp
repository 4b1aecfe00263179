#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

// The AVX-512 decode linear layer (see linear_host.hpp for the contract and
// the split inputs' layout; linear_host.cpp has its AVX2 twin).
//
// Why it looks like this: decode GEMVs stream each weight once for a handful of
// input rows, so the product must keep up with DRAM. A 64-byte line of bf16
// weights becomes two 16-lane fp32 vectors with one shift and one mask (even
// and odd columns), against the inputs split once per call to match; the
// products are fp32 FMAs, exact to fp32. (vdpbf16ps would need the inputs in
// bf16: rounding them moved the tiny models' logits by 1e-2, and a two-part
// bf16 split, at the same instruction count as these FMAs, still by 4e-4.)
// Each work item streams a few weight rows once, against every input row at
// once, and prefetches them.

#include "moe/impl/linear_host.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")

namespace writescope::impl {
namespace {

/// Bytes ahead of the current column that each weight row is requested from memory.
constexpr int prefetch_bytes = 1024;

inline float sum16(__m512 v) {
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
  return simd::horizontal_sum(_mm512_castps512_ps256(_mm512_add_ps(v, swapped)));
}

/// Columns [c0, c1) of `Features` weight rows against `Rows` input rows:
/// Rows x Features accumulators of 16 lanes, carried across blocks in `partial`.
///   x_block: the block's inputs, (Rows, even | odd, width / 2), contiguous
/// Width: c1 - c0 where known when compiled (full blocks: the inputs' offsets
/// become immediates instead of 2 x Rows address registers, which spilled),
/// else 0.
template <int Rows, int Features, int Width>
void features_block(const float* x_block, const bf16* w, std::int64_t w_stride, int c0, int c1, float (*partial)[16]) {
  const bool first = c0 == 0;  // no partial sums yet: the stack array is not cleared per work item
  const int width = Width > 0 ? Width : c1 - c0;
  const __m512i odd_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[Rows][Features];
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f)
      acc[r][f] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial[r * Features + f]);
  const float* x = x_block;
  for (int c = c0; c < c1; c += 32, x += 16) {
    __m512 even[Features], odd[Features];
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) {
      const bf16* row = w + f * w_stride + c;
      _mm_prefetch(reinterpret_cast<const char*>(row) + prefetch_bytes, _MM_HINT_T0);
      const __m512i raw = _mm512_loadu_si512(row);
      even[f] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      odd[f] = _mm512_castsi512_ps(_mm512_and_si512(raw, odd_mask));
    }
    WRITESCOPE_UNROLL(8)
    for (int r = 0; r < Rows; ++r) {
      __m512 x_even = _mm512_load_ps(x + r * width), x_odd = _mm512_load_ps(x + r * width + width / 2);
      // In registers: GCC would fold the loads into every feature's FMA,
      // doubling the loads past the two per cycle that the FMAs leave room for.
      if constexpr (Features > 1) __asm__("" : "+v"(x_even), "+v"(x_odd));
      WRITESCOPE_UNROLL(4)
      for (int f = 0; f < Features; ++f)
        acc[r][f] = _mm512_fmadd_ps(odd[f], x_odd, _mm512_fmadd_ps(even[f], x_even, acc[r][f]));
    }
  }
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) _mm512_store_ps(partial[r * Features + f], acc[r][f]);
}

/// One column block of every weight row in groups of `Step`; partial[f0]
/// holds (row, feature - f0) for the group starting at f0.
template <int Rows, int Step, int Width>
void block_features(const float* x_block, const bf16* w, std::int64_t w_stride, int features, int c0, int c1,
                    float (*partial)[Rows * Step][16]) {
  int f = 0;
  for (; f + Step <= features; f += Step)
    features_block<Rows, Step, Width>(x_block, w + f * w_stride, w_stride, c0, c1, partial[f]);
  for (; f < features; ++f) features_block<Rows, 1, Width>(x_block, w + f * w_stride, w_stride, c0, c1, partial[f]);
}

/// Weight rows in groups of `step`, Rows x step <= 16 accumulators: each
/// weight line is converted once for all input rows. Column blocks outermost
/// so that the block's inputs stay in L1.
template <int Rows>
void rows_block(const float* x_split, int in, const bf16* w, std::int64_t w_stride, int features, float* y,
                std::int64_t y_stride) {
  constexpr int step = Rows > 4 ? 2 : 4;
  alignas(64) float partial[split_linear_features][Rows * step][16];
  constexpr int block = split_linear_column_block(CpuPath::avx512_bf16, Rows);
  for (int c0 = 0; c0 < in; c0 += block) {
    const int c1 = std::min(in, c0 + block);
    const float* x_block = x_split + static_cast<std::int64_t>(c0) * Rows;
    if (c1 - c0 == block) block_features<Rows, step, block>(x_block, w, w_stride, features, c0, c1, partial);
    else block_features<Rows, step, 0>(x_block, w, w_stride, features, c0, c1, partial);
  }
  int f = 0;
  for (; f + step <= features; f += step)
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < step; ++k) y[r * y_stride + f + k] = sum16(_mm512_load_ps(partial[f][r * step + k]));
  for (; f < features; ++f)
    for (int r = 0; r < Rows; ++r) y[r * y_stride + f] = sum16(_mm512_load_ps(partial[f][r]));
}

}  // namespace

void linear_features_avx512(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                            float* y, std::int64_t y_stride) {
  switch (rows) {
    case 1: return rows_block<1>(x_split, in, w, w_stride, features, y, y_stride);
    case 2: return rows_block<2>(x_split, in, w, w_stride, features, y, y_stride);
    case 3: return rows_block<3>(x_split, in, w, w_stride, features, y, y_stride);
    case 4: return rows_block<4>(x_split, in, w, w_stride, features, y, y_stride);
    case 5: return rows_block<5>(x_split, in, w, w_stride, features, y, y_stride);
    case 6: return rows_block<6>(x_split, in, w, w_stride, features, y, y_stride);
    case 7: return rows_block<7>(x_split, in, w, w_stride, features, y, y_stride);
    default: return rows_block<8>(x_split, in, w, w_stride, features, y, y_stride);
  }
}

}  // namespace writescope::impl

#pragma GCC pop_options

#endif  // WRITESCOPE_HOST_AVX512_BF16
