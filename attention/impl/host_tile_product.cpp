// Built by the host compiler alone in both variants (writescope_host_kernels).
#include "attention/impl/host_tile_product.hpp"

#include "framework/simd.hpp"

namespace writescope::impl {

CpuPath host_tile_product_path(CpuPath active) {
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2) return CpuPath::avx2;
#endif
  (void)active;
  return CpuPath::scalar;
}

namespace {

void tile_gemm_scalar(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                      int ldb, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const float x = a[i * a_row + p * a_col];
      for (int j = 0; j < n; ++j) c[i * ldc + j] += x * b[p * ldb + j];
    }
}

#ifdef WRITESCOPE_HOST_AVX2
void tile_gemm_avx2(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                    int ldb, float* c, int ldc) {
  for (int i = 0; i < m; i += 4) {
    const float* a0 = a + i * a_row;
    for (int j = 0; j < n; j += 16) {
      __m256 acc[8];
WRITESCOPE_UNROLL(4)
      for (int r = 0; r < 4; ++r) {
        acc[2 * r] = _mm256_loadu_ps(c + (i + r) * ldc + j);
        acc[2 * r + 1] = _mm256_loadu_ps(c + (i + r) * ldc + j + 8);
      }
      const float* bp = b + j;
      for (int p = 0; p < k; ++p, bp += ldb) {
        const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        const float* ap = a0 + p * a_col;
WRITESCOPE_UNROLL(4)
        for (int r = 0; r < 4; ++r) {
          const __m256 x = _mm256_broadcast_ss(ap + r * a_row);
          acc[2 * r] = _mm256_fmadd_ps(x, b0, acc[2 * r]);
          acc[2 * r + 1] = _mm256_fmadd_ps(x, b1, acc[2 * r + 1]);
        }
      }
WRITESCOPE_UNROLL(4)
      for (int r = 0; r < 4; ++r) {
        _mm256_storeu_ps(c + (i + r) * ldc + j, acc[2 * r]);
        _mm256_storeu_ps(c + (i + r) * ldc + j + 8, acc[2 * r + 1]);
      }
    }
  }
}
#endif

}  // namespace

void host_tile_gemm(CpuPath path, int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col,
                    const float* b, int ldb, float* c, int ldc) {
#ifdef WRITESCOPE_HOST_AVX2
  if (path >= CpuPath::avx2) {
    tile_gemm_avx2(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    return;
  }
#endif
  (void)path;
  tile_gemm_scalar(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}

}  // namespace writescope::impl
