#pragma once
// The host kernels of the linear layer, without Kokkos: built by the host
// compiler alone in both variants (linear_host.cpp, linear_avx512.cpp; see
// writescope_host_kernels in cmake/WriteScopeTarget.cmake), called by the
// Kokkos launchers of linear_impl.hpp.

#include <algorithm>
#include <cstdint>

#include "framework/bf16.hpp"
#include "framework/cpu_path.hpp"
#include "framework/simd.hpp"

namespace writescope {
namespace impl {

#ifdef WRITESCOPE_HOST_AVX2
using namespace writescope::simd;
#endif

/// Output features per host work item: four weight rows, each converted once
/// per pass and reused from registers for two input rows at a time.
inline constexpr int linear_features = 4;
/// Columns per L1-resident block of weights (4 rows x 512 bf16 = 4 KiB).
inline constexpr int linear_column_block = 512;
/// Input rows handled in one call of the vector path (decode batches).
inline constexpr int max_linear_rows = 32;

/// The decode paths for bf16 weights, rows <= max_split_linear_rows per call
/// of the kernels: the inputs are rearranged once per call by split_even_odd
/// into x_split: for each block of split_linear_column_block(path, rows)
/// columns, (rows, even | odd columns, width / 2) contiguous (x_split: rows x
/// in floats, 64-byte aligned), so that a block's rows neither share L1 sets
/// nor split lines and match the even and odd halves of a line of bf16
/// weights (one shift, one mask). In the kernels, each work item streams
/// `features` <= split_linear_features weight rows from w (row stride
/// w_stride) once against all input rows and writes y(r, f) (row stride
/// y_stride), requesting during its last column block the lines of `next`
/// (the first weight row of the next work item: the next rows of w, or the
/// next matrix's in a batch) as it would the rows of w, one kernel for both
/// paths (linear_split_kernel.hpp): AVX-512
/// with in % 32 == 0 (linear_avx512.cpp), avx2 with in % 16 == 0
/// (linear_host.cpp). fp32 FMAs: at 8 rows their peak is about the DRAM rate.
/// Up to max_linear_rows rows go in groups of max_split_linear_rows, each
/// split on its own (x_split: group after group); a work item runs every group
/// over its weight rows, which the later groups read from L2.
inline constexpr int max_split_linear_rows = 8;
/// Blocks of 512 columns (4 rows: 8 KiB of inputs) stay in L1 with the 16
/// weight rows' blocks; one row on the AVX-512 path in blocks of 2048 (fewer passes over
/// the weight rows: +8% in a probe, where the AVX2 kernel lost 20%); 5-8 rows
/// on the AVX-512 path, two groups over each weight line, in blocks of 256
/// (8 rows: 8 KiB; expert_linear at 8 rows, Zen 5, 7 alternations: +4 to +19%, median +10%;
/// at 2 and 4 rows within the VM's noise, and blocks of 1024-2048 lost 1-17%).
constexpr int split_linear_column_block(CpuPath path, int rows) {
  if (path < CpuPath::avx512_fma) return 512;
  return rows == 1 ? 2048 : rows > 4 ? 256 : 512;
}
inline constexpr int split_linear_features = 16;
void split_even_odd(const float* x, std::int64_t x_stride, int rows, int in, CpuPath path, float* x_split);
#ifdef WRITESCOPE_HOST_AVX512_BF16
void linear_features_avx512(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                            float* y, std::int64_t y_stride, const bf16* next);
/// The amx_bf16 path (linear_amx.cpp), in % 32 == 0, rows <=
/// max_split_linear_rows: pair_inputs_amx writes x (rows, in) as the B tiles
/// of each 32 input columns, (16 pairs, rows) words of the bf16 high halves
/// then of the low ones (rows x in words in all, in x_split's place);
/// linear_features_amx is the split kernels' contract on them, on AMX tiles
/// or (tests, on any CPU) on their emulation.
void pair_inputs_amx(const float* x, std::int64_t x_stride, int rows, int in, std::uint32_t* x_pairs);
void linear_features_amx(const std::uint32_t* x_pairs, int rows, int in, const bf16* w, std::int64_t w_stride,
                         int features, float* y, std::int64_t y_stride);
void linear_features_amx_emulated(const std::uint32_t* x_pairs, int rows, int in, const bf16* w,
                                  std::int64_t w_stride, int features, float* y, std::int64_t y_stride);
#endif
#ifdef WRITESCOPE_HOST_AVX2
void linear_features_avx2(const float* x_split, int rows, int in, const bf16* w, std::int64_t w_stride, int features,
                          float* y, std::int64_t y_stride, const bf16* next);
#endif

/// The instruction path linear() takes on the host for these operands.
inline CpuPath linear_path(CpuPath active, int rows, int in, bool bf16_weights) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  // Both AVX-512 paths run the same 16-lane fp32 FMA kernel here; amx_bf16 its tiles.
  if (active >= CpuPath::avx512_fma && bf16_weights && rows >= 1 && rows <= max_linear_rows && in % 32 == 0)
    return active == CpuPath::amx_bf16 ? active : vector_path(active);
#else
  (void)rows, (void)bf16_weights;
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2 && in % 8 == 0 && rows <= max_linear_rows) return CpuPath::avx2;
#else
  (void)in;
#endif
  (void)active;
  return CpuPath::scalar;
}

/// Whether linear() runs linear_path's choice with split inputs (above).
inline bool takes_split_inputs(CpuPath path, int rows, int in, bool bf16_weights) {
  return bf16_weights && rows >= 1 && rows <= max_linear_rows &&
         (path >= CpuPath::avx512_fma || (path == CpuPath::avx2 && in % 16 == 0));
}

/// y(r, f) = sum over c of x(r, c) w(f, c), for f < features (<= linear_features)
/// and r < rows: x (rows, in) with row stride x_stride, w (features, in) with
/// row stride w_stride, y (rows, features) with row stride y_stride. `vector`:
/// linear_path chose avx2 (a full group of linear_features rows takes it).
/// What the split kernels do not take: float weights, and bf16 weights with
/// in % 16 != 0.
template <class Scalar>
void linear_features_host(const float* x, std::int64_t x_stride, int rows, int in, const Scalar* w,
                          std::int64_t w_stride, int features, float* y, std::int64_t y_stride, bool vector) {
#ifdef WRITESCOPE_HOST_AVX2
  if (vector && features == linear_features) {
    // Columns in blocks that stay in L1, so every pair of input rows reuses
    // the block of weights read from memory by the first pair.
    alignas(32) float totals[max_linear_rows / 2][8] = {};
    for (int c0 = 0; c0 < in; c0 += linear_column_block) {
      const int c1 = std::min(in, c0 + linear_column_block);
      for (int r0 = 0; r0 < rows; r0 += 2) {
        const int pair = std::min(2, rows - r0);
        __m256 acc[8];
        for (auto& a : acc) a = _mm256_setzero_ps();
        for (int c = c0; c < c1; c += 8) {
          __m256 weights[linear_features];
          WRITESCOPE_UNROLL(4)
          for (int f = 0; f < linear_features; ++f) weights[f] = load8(w + f * w_stride + c);
          WRITESCOPE_UNROLL(2)
          for (int p = 0; p < 2; ++p) {
            if (p == pair) break;
            const __m256 xv = _mm256_loadu_ps(x + (r0 + p) * x_stride + c);
            WRITESCOPE_UNROLL(4)
            for (int f = 0; f < linear_features; ++f)
              acc[p * 4 + f] = _mm256_fmadd_ps(weights[f], xv, acc[p * 4 + f]);
          }
        }
        float* total = totals[r0 / 2];
        _mm256_store_ps(total, _mm256_add_ps(_mm256_load_ps(total), sum_lanes8(acc)));
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int f = 0; f < linear_features; ++f) y[r * y_stride + f] = totals[r / 2][(r % 2) * 4 + f];
    return;
  }
#endif
  (void)vector;
  for (int r = 0; r < rows; ++r)
    for (int f = 0; f < features; ++f) {
      float sum = 0;
      for (int c = 0; c < in; ++c) sum += x[r * x_stride + c] * to_float(w[f * w_stride + c]);
      y[r * y_stride + f] = sum;
    }
}

/// Output features per work item of the many-rows path.
inline constexpr int gemm_linear_features = 64;

/// More than max_linear_rows rows (prompt chunks): y(r, f) for `features` <=
/// gemm_linear_features weight rows as a GEMM, x against blocks of W^T
/// staged in fp32 (256 input columns x 64 features, in L1/L2), on
/// host_gemm's `path` (framework/host_gemm.hpp).
///   x: (rows, in), row stride x_stride; w: (features, in), row stride w_stride;
///   y: (rows, features), row stride y_stride
template <class Scalar>
void linear_features_gemm(const float* x, std::int64_t x_stride, int rows, int in, const Scalar* w,
                          std::int64_t w_stride, int features, float* y, std::int64_t y_stride, CpuPath path);

extern template void linear_features_host<float>(const float*, std::int64_t, int, int, const float*, std::int64_t,
                                                 int, float*, std::int64_t, bool);
extern template void linear_features_host<bf16>(const float*, std::int64_t, int, int, const bf16*, std::int64_t, int,
                                                float*, std::int64_t, bool);
extern template void linear_features_gemm<float>(const float*, std::int64_t, int, int, const float*, std::int64_t, int,
                                                 float*, std::int64_t, CpuPath);
extern template void linear_features_gemm<bf16>(const float*, std::int64_t, int, int, const bf16*, std::int64_t, int,
                                                float*, std::int64_t, CpuPath);

}  // namespace impl
}  // namespace writescope
