#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "framework/impl/fma_stream.hpp"

#include <stdexcept>
#include <string>

#include "framework/simd.hpp"

namespace writescope::impl {
namespace {

/// Enough chains to cover the FMA latency times its ports, no more than the
/// registers hold beside the line.
constexpr int most_chains = 12;

template <int Fmas>
float stream_scalar(const float* lines, std::int64_t count, float multiplier) {
  float acc[16] = {};
  for (std::int64_t i = 0; i < count; ++i)
    for (int f = 0; f < Fmas; ++f)
      for (int lane = 0; lane < 16; ++lane) acc[lane] += lines[16 * i + lane] * multiplier;
  float sum = 0;
  for (float lane : acc) sum += lane;
  return sum;
}

#ifdef WRITESCOPE_HOST_AVX2
template <int Fmas>
float stream_avx2(const float* lines, std::int64_t count, float multiplier, std::int64_t prefetch_bytes) {
  constexpr int chains = 2 * Fmas < most_chains ? 2 * Fmas : most_chains;
  __m256 acc[chains];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const __m256 k = _mm256_set1_ps(multiplier);
  for (std::int64_t i = 0; i < count; ++i) {
    const float* line = lines + 16 * i;
    if (prefetch_bytes != 0) _mm_prefetch(reinterpret_cast<const char*>(line) + prefetch_bytes, _MM_HINT_T0);
    const __m256 low = _mm256_load_ps(line), high = _mm256_load_ps(line + 8);
    WRITESCOPE_UNROLL(64)
    for (int f = 0; f < Fmas; ++f) {
      acc[2 * f % chains] = _mm256_fmadd_ps(low, k, acc[2 * f % chains]);
      acc[(2 * f + 1) % chains] = _mm256_fmadd_ps(high, k, acc[(2 * f + 1) % chains]);
    }
  }
  for (int c = 1; c < chains; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  return simd::horizontal_sum(acc[0]);
}
#endif

#ifdef WRITESCOPE_HOST_AVX512_BF16
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
template <int Fmas>
float stream_avx512(const float* lines, std::int64_t count, float multiplier, std::int64_t prefetch_bytes) {
  constexpr int chains = Fmas < most_chains ? Fmas : most_chains;
  __m512 acc[chains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const __m512 k = _mm512_set1_ps(multiplier);
  for (std::int64_t i = 0; i < count; ++i) {
    const float* line = lines + 16 * i;
    if (prefetch_bytes != 0) _mm_prefetch(reinterpret_cast<const char*>(line) + prefetch_bytes, _MM_HINT_T0);
    const __m512 x = _mm512_load_ps(line);
    WRITESCOPE_UNROLL(64)
    for (int f = 0; f < Fmas; ++f) acc[f % chains] = _mm512_fmadd_ps(x, k, acc[f % chains]);
  }
  for (int c = 1; c < chains; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  return _mm512_reduce_add_ps(acc[0]);
}
#pragma GCC pop_options
#endif

template <int Fmas>
float stream(CpuPath path, const float* lines, std::int64_t count, float multiplier, std::int64_t prefetch_bytes) {
  switch (path) {
    case CpuPath::scalar:
      return stream_scalar<Fmas>(lines, count, multiplier);
#ifdef WRITESCOPE_HOST_AVX2
    case CpuPath::avx2:
      return stream_avx2<Fmas>(lines, count, multiplier, prefetch_bytes);
#endif
#ifdef WRITESCOPE_HOST_AVX512_BF16
    case CpuPath::avx512_fma:
    case CpuPath::avx512_bf16:
    case CpuPath::amx_bf16:
      return stream_avx512<Fmas>(lines, count, multiplier, prefetch_bytes);
#endif
    default:
      break;
  }
  throw std::invalid_argument(std::string("fma_stream: no fp32 FMA of path ") + cpu_path_name(path) + " in this build");
}

}  // namespace

float fma_stream(CpuPath path, const float* lines, std::int64_t count, int fmas_per_line, float multiplier,
                 std::int64_t prefetch_bytes) {
  if (!cpu_path_supported(path))
    throw std::invalid_argument(std::string("fma_stream: path ") + cpu_path_name(path) + " does not run here");
  switch (fmas_per_line) {
    case 2: return stream<2>(path, lines, count, multiplier, prefetch_bytes);
    case 4: return stream<4>(path, lines, count, multiplier, prefetch_bytes);
    case 8: return stream<8>(path, lines, count, multiplier, prefetch_bytes);
    case 16: return stream<16>(path, lines, count, multiplier, prefetch_bytes);
    case 32: return stream<32>(path, lines, count, multiplier, prefetch_bytes);
    case 64: return stream<64>(path, lines, count, multiplier, prefetch_bytes);
  }
  throw std::invalid_argument("fma_stream: " + std::to_string(fmas_per_line) +
                              " FMAs per line (one of 2, 4, 8, 16, 32, 64)");
}

}  // namespace writescope::impl
