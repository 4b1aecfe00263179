// The host linear kernels, built by the host compiler alone in both variants
// (writescope_host_kernels in cmake/WriteScopeTarget.cmake).
#include "moe/impl/linear_host.hpp"

#include <vector>

#include "framework/host_gemm.hpp"

namespace writescope::impl {

void split_even_odd(const float* x, std::int64_t x_stride, int rows, int in, CpuPath path, float* x_split) {
  const int block = split_linear_column_block(path, rows);
  for (int c0 = 0; c0 < in; c0 += block) {
    const int width = std::min(in, c0 + block) - c0;
    for (int r = 0; r < rows; ++r) {
      const float* row = x + r * x_stride + c0;
      float* even = x_split + static_cast<std::int64_t>(c0) * rows + r * width;
      float* odd = even + width / 2;
      for (int c = 0; c < width / 2; ++c) even[c] = row[2 * c], odd[c] = row[2 * c + 1];
    }
  }
}

#ifdef WRITESCOPE_HOST_AVX2
namespace {

// The AVX2 twin of linear_avx512.cpp's decode kernel: 16 bf16 weights (one
// 32-byte load) become even and odd fp32 halves with one shift and one mask,
// against the split inputs; 16 registers hold Rows x Features <= 8
// accumulators, the converted weights and one pair of inputs.

/// Bytes ahead of the current column that each weight row is requested from memory.
constexpr int prefetch_bytes_avx2 = 1024;

/// Columns [c0, c1) of `Features` weight rows against `Rows` input rows,
/// accumulators carried across blocks in `partial`.
///   x_block: the block's inputs, (Rows, even | odd, width / 2), contiguous
/// Width: c1 - c0 where known when compiled (full blocks: immediate offsets),
/// else 0.
template <int Rows, int Features, int Width>
void features_block_avx2(const float* x_block, const bf16* w, std::int64_t w_stride, int c0, int c1,
                         float (*partial)[8]) {
  const bool first = c0 == 0;  // no partial sums yet: the stack array is not cleared per work item
  const int width = Width > 0 ? Width : c1 - c0;
  __m256 acc[Rows][Features];
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f)
      acc[r][f] = first ? _mm256_setzero_ps() : _mm256_load_ps(partial[r * Features + f]);
  const float* x = x_block;
  for (int c = c0; c < c1; c += 16, x += 8) {
    __m256 even[Features], odd[Features];
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) {
      const bf16* row = w + f * w_stride + c;
      _mm_prefetch(reinterpret_cast<const char*>(row) + prefetch_bytes_avx2, _MM_HINT_T0);
      load16(row, even[f], odd[f]);
    }
    WRITESCOPE_UNROLL(8)
    for (int r = 0; r < Rows; ++r) {
      __m256 x_even = _mm256_load_ps(x + r * width), x_odd = _mm256_load_ps(x + r * width + width / 2);
      // In registers: GCC would fold the loads into every feature's FMA.
      if constexpr (Features > 1) __asm__("" : "+x"(x_even), "+x"(x_odd));
      WRITESCOPE_UNROLL(4)
      for (int f = 0; f < Features; ++f)
        acc[r][f] = _mm256_fmadd_ps(odd[f], x_odd, _mm256_fmadd_ps(even[f], x_even, acc[r][f]));
    }
  }
  WRITESCOPE_UNROLL(8)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(4)
    for (int f = 0; f < Features; ++f) _mm256_store_ps(partial[r * Features + f], acc[r][f]);
}

/// One column block of every weight row in groups of `Step`; partial[f0]
/// holds (row, feature - f0) for the group starting at f0.
template <int Rows, int Step, int Width>
void block_features_avx2(const float* x_block, const bf16* w, std::int64_t w_stride, int features, int c0, int c1,
                         float (*partial)[Rows * Step][8]) {
  int f = 0;
  for (; f + Step <= features; f += Step)
    features_block_avx2<Rows, Step, Width>(x_block, w + f * w_stride, w_stride, c0, c1, partial[f]);
  for (; f < features; ++f)
    features_block_avx2<Rows, 1, Width>(x_block, w + f * w_stride, w_stride, c0, c1, partial[f]);
}

/// Weight rows in groups of `step` (Rows x step <= 8 accumulators); column
/// blocks outermost so that the block's inputs stay in L1.
template <int Rows>
void rows_block_avx2(const float* x_split, int in, const bf16* w, std::int64_t w_stride, int features, float* y,
                     std::int64_t y_stride) {
  constexpr int step = Rows <= 2 ? 4 : Rows <= 4 ? 2 : 1;
  alignas(32) float partial[split_linear_features][Rows * step][8];
  constexpr int block = split_linear_column_block(CpuPath::avx2, Rows);
  for (int c0 = 0; c0 < in; c0 += block) {
    const int c1 = std::min(in, c0 + block);
    const float* x_block = x_split + static_cast<std::int64_t>(c0) * Rows;
    if (c1 - c0 == block) block_features_avx2<Rows, step, block>(x_block, w, w_stride, features, c0, c1, partial);
    else block_features_avx2<Rows, step, 0>(x_block, w, w_stride, features, c0, c1, partial);
  }
  int f = 0;
  for (; f + step <= features; f += step)
    for (int r = 0; r < Rows; ++r)
      for (int k = 0; k < step; ++k)
        y[r * y_stride + f + k] = horizontal_sum(_mm256_load_ps(partial[f][r * step + k]));
  for (; f < features; ++f)
    for (int r = 0; r < Rows; ++r) y[r * y_stride + f] = horizontal_sum(_mm256_load_ps(partial[f][r]));
}

}  // namespace

void linear_features_avx2(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                          float* y, std::int64_t y_stride) {
  switch (rows) {
    case 1: return rows_block_avx2<1>(x_split, in, w, w_stride, features, y, y_stride);
    case 2: return rows_block_avx2<2>(x_split, in, w, w_stride, features, y, y_stride);
    case 3: return rows_block_avx2<3>(x_split, in, w, w_stride, features, y, y_stride);
    case 4: return rows_block_avx2<4>(x_split, in, w, w_stride, features, y, y_stride);
    case 5: return rows_block_avx2<5>(x_split, in, w, w_stride, features, y, y_stride);
    case 6: return rows_block_avx2<6>(x_split, in, w, w_stride, features, y, y_stride);
    case 7: return rows_block_avx2<7>(x_split, in, w, w_stride, features, y, y_stride);
    default: return rows_block_avx2<8>(x_split, in, w, w_stride, features, y, y_stride);
  }
}
#endif

template <class Scalar>
void linear_features_gemm(const float* x, std::int64_t x_stride, int rows, int in, const Scalar* w,
                          std::int64_t w_stride, int features, float* y, std::int64_t y_stride, CpuPath path) {
  constexpr int column_block = 256, width = gemm_linear_features;
  // Per thread, reused by its work items.
  thread_local std::vector<float> staged, totals;
  staged.resize(static_cast<std::size_t>(column_block) * width);
  totals.assign(static_cast<std::size_t>(rows) * width, 0.0f);
  // The vector path takes whole register tiles of rows; the rest go through the scalar loop.
  const int tiled_rows = rows / host_gemm_row_multiple(path) * host_gemm_row_multiple(path);
  for (int c0 = 0; c0 < in; c0 += column_block) {
    const int columns = std::min(column_block, in - c0);
    for (int f = 0; f < width; ++f)
      for (int c = 0; c < columns; ++c)
        staged[static_cast<std::size_t>(c) * width + f] = f < features ? to_float(w[f * w_stride + c0 + c]) : 0.0f;
    if (tiled_rows > 0)
      host_gemm(path, tiled_rows, width, columns, x + c0, x_stride, 1, staged.data(), width, totals.data(), width);
    if (rows > tiled_rows)
      host_gemm(CpuPath::scalar, rows - tiled_rows, width, columns, x + tiled_rows * x_stride + c0, x_stride, 1,
                staged.data(), width, totals.data() + static_cast<std::size_t>(tiled_rows) * width, width);
  }
  for (int r = 0; r < rows; ++r)
    for (int f = 0; f < features; ++f) y[r * y_stride + f] = totals[static_cast<std::size_t>(r) * width + f];
}

template void linear_features_gemm<float>(const float*, std::int64_t, int, int, const float*, std::int64_t, int,
                                          float*, std::int64_t, CpuPath);
template void linear_features_gemm<bf16>(const float*, std::int64_t, int, int, const bf16*, std::int64_t, int, float*,
                                         std::int64_t, CpuPath);

template void linear_features_host<float>(const float*, std::int64_t, int, int, const float*, std::int64_t, int,
                                          float*, std::int64_t, bool);
template void linear_features_host<bf16>(const float*, std::int64_t, int, int, const bf16*, std::int64_t, int, float*,
                                         std::int64_t, bool);

}  // namespace writescope::impl
