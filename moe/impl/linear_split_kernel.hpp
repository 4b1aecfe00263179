#pragma once
// The split-input decode kernel of the linear layer (contract and layout in
// linear_host.hpp), written once for the vector paths: linear_avx512.cpp
// includes it inside its AVX-512 target region with 16-lane operations,
// linear_host.cpp with 8-lane AVX2 ones.
//
// Why it looks like this: decode GEMVs stream each weight once for a handful of
// input rows, so the product must keep up with DRAM. One load of bf16 weights
// becomes even- and odd-column fp32 vectors with one shift and one mask,
// against the inputs split once per call to match; the products are fp32
// FMAs, exact to fp32. (vdpbf16ps would need the inputs in bf16: rounding them
// moved the tiny models' logits by 1e-2, and a two-part bf16 split, at the
// same instruction count as these FMAs, still by 4e-4.) Each work item streams
// its weight rows once, a few at a time against every input row, and requests
// each row's next block (the next work item's first) one block ahead.
//
// Lines, the path's operations on one vector of `lanes` floats (`Vec`):
//   path; first_rows(rows): the first group of input rows (the rest, if
//   any, go second, against the same weight lines from L1); step(rows):
//   weight rows per pass for a group of `rows` (rows x step accumulators fit
//   the registers); zero(); load(p) (aligned); store(p, v); fmadd(a, b, c);
//   weights<LoadOnce>(row, even, odd): 2 x lanes bf16 at row as even and odd
//   columns; LoadOnce: the line loaded once into a register for the shift and
//   the mask, where GCC folds the load into both, i.e. reads each line twice
//   (Zen 5, 8 rows from DRAM: 27 -> 32 GB/s; 1 row lost 7% with it, so only
//   from 2 rows on);
//   in_registers(a, b): keeps a and b in registers (GCC folds their loads
//   into every feature's FMA otherwise, past the loads per cycle the FMAs
//   leave room for); sum(v): the lanes' sum.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "framework/bf16.hpp"
#include "moe/impl/linear_host.hpp"

namespace writescope::impl::split_kernel {

/// Columns [c0, c1) of `Features` weight rows against `Rows` input rows:
/// Rows x Features accumulators, carried across blocks in `partial`.
///   x_block: the block's inputs, (Rows, even | odd, width / 2), contiguous
///   ahead: bytes from a weight to the one requested from memory meanwhile
/// Width: c1 - c0 where known when compiled (full blocks: the inputs' offsets
/// become immediates instead of 2 x Rows address registers, which spilled),
/// else 0. Request: whether to request the lines `ahead` (not where another
/// group of input rows has just read these weights, and requested them).
template <class Lines, int Rows, int Features, int Width, bool Request = true>
void features_block(const float* x_block, const bf16* w, std::int64_t w_stride, int c0, int c1, std::int64_t ahead,
                    float (*partial)[Lines::lanes]) {
  using Vec = typename Lines::Vec;
  const bool first = c0 == 0;  // no partial sums yet: the stack array is not cleared per work item
  const int width = Width > 0 ? Width : c1 - c0;
  Vec acc[Rows][Features];
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) acc[r][f] = first ? Lines::zero() : Lines::load(partial[r * Features + f]);
  const float* x = x_block;
  for (int c = c0; c < c1; c += 2 * Lines::lanes, x += Lines::lanes) {
    Vec even[Features], odd[Features];
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) {
      const bf16* row = w + f * w_stride + c;
      // One request per 64-byte line (a step reads 2 x lanes bf16: half a line on AVX2), into L2: a
      // block ahead is 16 to 64 KiB, which in L1 evicted the inputs and the lines in use (Intel VM,
      // in the benchmark, 1 row: 19 -> 21 GB/s, 8 rows: 17 -> 19 GB/s).
      if (Request && (2 * Lines::lanes >= 32 || c % 32 == 0))
        _mm_prefetch(reinterpret_cast<const char*>(row) + ahead, _MM_HINT_T1);
      Lines::template weights<(Rows > 1)>(row, even[f], odd[f]);
    }
    WRITESCOPE_UNROLL(8)
    for (int r = 0; r < Rows; ++r) {
      Vec x_even = Lines::load(x + r * width), x_odd = Lines::load(x + r * width + width / 2);
      if constexpr (Features > 1) Lines::in_registers(x_even, x_odd);
      WRITESCOPE_UNROLL(4)
      for (int f = 0; f < Features; ++f)
        acc[r][f] = Lines::fmadd(odd[f], x_odd, Lines::fmadd(even[f], x_even, acc[r][f]));
    }
  }
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) Lines::store(partial[r * Features + f], acc[r][f]);
}

/// The input rows of a call in one or two groups, each multiplied with
/// `step` weight rows at a time (Lines::first_rows).
template <class Lines, int Rows>
struct RowGroups {
  static constexpr int first = Lines::first_rows(Rows), second = Rows - first;
  static constexpr int step = Lines::step(first);
  static_assert(second == 0 || Lines::step(second) == step, "both groups take the same weight rows at a time");
};

/// One column block of every weight row in groups of `Step`, against the
/// first group of input rows and then (from L1) the second; first[f0] and
/// second[f0] hold (row, feature - f0) for the group starting at f0.
template <class Lines, class Groups, int Width>
void block_features(const float* x_block, const bf16* w, std::int64_t w_stride, int features, int c0, int c1,
                    std::int64_t ahead, float (*first)[Groups::first * Groups::step][Lines::lanes],
                    float (*second)[std::max(1, Groups::second) * Groups::step][Lines::lanes]) {
  constexpr int step = Groups::step;
  const float* second_x = x_block + Groups::first * (c1 - c0);
  auto features_rows = [&](auto features_at_once, int f) {
    constexpr int n = decltype(features_at_once)::value;
    features_block<Lines, Groups::first, n, Width>(x_block, w + f * w_stride, w_stride, c0, c1, ahead, first[f]);
    if constexpr (Groups::second > 0)
      features_block<Lines, Groups::second, n, Width, false>(second_x, w + f * w_stride, w_stride, c0, c1, ahead,
                                                             second[f]);
  };
  int f = 0;
  for (; f + step <= features; f += step) features_rows(std::integral_constant<int, step>{}, f);
  for (; f < features; ++f) features_rows(std::integral_constant<int, 1>{}, f);
}

/// Column blocks outermost, so that the block's inputs stay in L1 while
/// every group of weight rows meets them.
template <class Lines, int Rows>
void rows_block(const float* x_split, int in, const bf16* w, std::int64_t w_stride, int features, float* y,
                std::int64_t y_stride, const bf16* next) {
  using Groups = RowGroups<Lines, Rows>;
  constexpr int step = Groups::step;
  constexpr int block = split_linear_column_block(Lines::path, Rows);
  alignas(64) float first[split_linear_features][Groups::first * step][Lines::lanes];
  alignas(64) float second[split_linear_features][std::max(1, Groups::second) * step][Lines::lanes];
  for (int c0 = 0; c0 < in; c0 += block) {
    const int c1 = std::min(in, c0 + block);
    const float* x_block = x_split + static_cast<std::int64_t>(c0) * Rows;
    // Each weight row's next block is requested while this one is multiplied;
    // during the last block, the first block of the same row of `next`: the
    // next work item's, which work stealing gives this thread (but for the
    // other threads' last items it takes), in the same matrix or the next
    // one of a batch (each thread starting every matrix cold otherwise).
    const std::int64_t ahead =
        c1 < in
            ? static_cast<std::int64_t>(sizeof(bf16)) * block
            : static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(next) - reinterpret_cast<std::uintptr_t>(w)) -
                  static_cast<std::int64_t>(sizeof(bf16)) * c0;
    if (c1 - c0 == block)
      block_features<Lines, Groups, block>(x_block, w, w_stride, features, c0, c1, ahead, first, second);
    else block_features<Lines, Groups, 0>(x_block, w, w_stride, features, c0, c1, ahead, first, second);
  }
  // Row r of the call: row r of the first group, or r - Groups::first of the second.
  auto total = [&](int r, int f, int k, int at_once) {
    const float* lanes = r < Groups::first ? first[f][r * at_once + k] : second[f][(r - Groups::first) * at_once + k];
    return Lines::sum(Lines::load(lanes));
  };
  int f = 0;
  for (; f + step <= features; f += step)
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < step; ++k) y[r * y_stride + f + k] = total(r, f, k, step);
  for (; f < features; ++f)
    for (int r = 0; r < Rows; ++r) y[r * y_stride + f] = total(r, f, 0, 1);
}

/// linear_features_avx512 / linear_features_avx2 (linear_host.hpp) on Lines.
template <class Lines>
void linear_features(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                     float* y, std::int64_t y_stride, const bf16* next) {
  switch (rows) {
    case 1: return rows_block<Lines, 1>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 2: return rows_block<Lines, 2>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 3: return rows_block<Lines, 3>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 4: return rows_block<Lines, 4>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 5: return rows_block<Lines, 5>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 6: return rows_block<Lines, 6>(x_split, in, w, w_stride, features, y, y_stride, next);
    case 7: return rows_block<Lines, 7>(x_split, in, w, w_stride, features, y, y_stride, next);
    default: return rows_block<Lines, 8>(x_split, in, w, w_stride, features, y, y_stride, next);
  }
}

}  // namespace writescope::impl::split_kernel
