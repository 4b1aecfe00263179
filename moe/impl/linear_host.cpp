// The host linear kernels, built by the host compiler alone in both variants
// (writescope_host_kernels in cmake/WriteScopeTarget.cmake).
#include "moe/impl/linear_host.hpp"

#include <vector>

#include "framework/host_gemm.hpp"
#ifdef WRITESCOPE_HOST_AVX2
#include "moe/impl/linear_split_kernel.hpp"
#endif

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

struct Avx2Lines {
  using Vec = __m256;
  static constexpr int lanes = 8;
  static constexpr CpuPath path = CpuPath::avx2;
  /// 16 registers: up to 8 accumulators beside the converted weights.
  static constexpr int step(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }
  static constexpr int first_rows(int rows) { return rows; }  // one group
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_load_ps(p); }
  static void store(float* p, Vec v) { _mm256_store_ps(p, v); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  /// Folded or not, the same here: a register for the 32-byte load moved nothing (Zen 5, 2-8 rows).
  template <bool LoadOnce>
  static void weights(const bf16* row, Vec& even, Vec& odd) { load16(row, even, odd); }
  static void in_registers(Vec& a, Vec& b) { __asm__("" : "+x"(a), "+x"(b)); }
  static float sum(Vec v) { return horizontal_sum(v); }
};

}  // namespace

void linear_features_avx2(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                          float* y, std::int64_t y_stride, const bf16* next) {
  split_kernel::linear_features<Avx2Lines>(x_split, rows, in, w, w_stride, features, y, y_stride, next);
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
