// Built by the host compiler alone in both variants (writescope_host_kernels).
#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "framework/host_gemm.hpp"

#include "framework/simd.hpp"

namespace writescope {

CpuPath host_gemm_path(CpuPath active) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (active >= CpuPath::avx512_fma) return vector_path(active);
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2) return CpuPath::avx2;
#endif
  (void)active;
  return CpuPath::scalar;
}

int host_gemm_row_multiple(CpuPath path) {
  path = host_gemm_path(path);
  return path >= CpuPath::avx512_fma ? 8 : path == CpuPath::avx2 ? 4 : 1;
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
using namespace simd;

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

#ifdef WRITESCOPE_HOST_AVX512_BF16
// 16-lane fp32 FMAs on CPUs with AVX-512 (the AVX-512 paths imply
// AVX-512F): 8 rows x 2 vectors = 16 accumulators of the 32 zmm registers,
// 2 loads of B and 8 broadcasts per 16 FMAs.
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
template <int Vectors>
inline void tile_gemm_avx512_block(int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                                   int ldb, float* c, int ldc) {
  __m512 acc[8 * Vectors];
WRITESCOPE_UNROLL(8)
  for (int r = 0; r < 8; ++r)
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) acc[r * Vectors + v] = _mm512_loadu_ps(c + r * ldc + 16 * v);
  for (int p = 0; p < k; ++p, b += ldb) {
    __m512 bv[Vectors];
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
    const float* ap = a + p * a_col;
WRITESCOPE_UNROLL(8)
    for (int r = 0; r < 8; ++r) {
      const __m512 x = _mm512_set1_ps(ap[r * a_row]);
WRITESCOPE_UNROLL(2)
      for (int v = 0; v < Vectors; ++v) acc[r * Vectors + v] = _mm512_fmadd_ps(x, bv[v], acc[r * Vectors + v]);
    }
  }
WRITESCOPE_UNROLL(8)
  for (int r = 0; r < 8; ++r)
WRITESCOPE_UNROLL(2)
    for (int v = 0; v < Vectors; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r * Vectors + v]);
}

void tile_gemm_avx512(int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col, const float* b,
                      int ldb, float* c, int ldc) {
  for (int i = 0; i < m; i += 8) {
    int j = 0;
    for (; j + 32 <= n; j += 32)
      tile_gemm_avx512_block<2>(k, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
    if (j < n) tile_gemm_avx512_block<1>(k, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j, ldc);
  }
}
#pragma GCC pop_options
#endif

}  // namespace

void host_gemm(CpuPath path, int m, int n, int k, const float* a, std::int64_t a_row, std::int64_t a_col,
               const float* b, int ldb, float* c, int ldc) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (path >= CpuPath::avx512_fma) {
    tile_gemm_avx512(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    return;
  }
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (path >= CpuPath::avx2) {
    tile_gemm_avx2(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
    return;
  }
#endif
  (void)path;
  tile_gemm_scalar(m, n, k, a, a_row, a_col, b, ldb, c, ldc);
}

}  // namespace writescope
