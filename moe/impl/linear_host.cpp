// The host linear kernels, built by the host compiler alone in both variants
// (writescope_host_kernels in cmake/WriteScopeTarget.cmake).
#include "moe/impl/linear_host.hpp"

#include <vector>

#include "framework/host_gemm.hpp"

namespace writescope::impl {

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
