#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "framework/impl/product_peaks.hpp"

#include <string>

#include "framework/impl/amx_tiles.hpp"
#include "framework/simd.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16
#include <immintrin.h>

namespace writescope::impl {

// One target region for both: they run only on the avx512_bf16 CPU path, and
// the shared loop must inline their steps.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")
/// Runs `iterations` steps of avx512_peak_chains accumulators started at seed +
/// chain; returns the sum of their lanes, so that the work cannot be dropped.
template <class Step>
inline float chains(float seed, std::int64_t iterations, Step step) {
  __m512 acc[avx512_peak_chains];
  for (int c = 0; c < avx512_peak_chains; ++c) acc[c] = _mm512_set1_ps(seed + c);
  for (std::int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < avx512_peak_chains; ++c) acc[c] = step(acc[c]);
  float sum = 0;
  alignas(64) float lanes[16];
  for (int c = 0; c < avx512_peak_chains; ++c) {
    _mm512_store_ps(lanes, acc[c]);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}

float fp32_fma16_chains(float seed, std::int64_t iterations) {
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  return chains(seed, iterations, [&](__m512 acc) { return _mm512_fmadd_ps(acc, a, b); });
}

float bf16_dot_chains(float seed, std::int64_t iterations) {
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // bf16 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));  // bf16 2^-24
  return chains(seed, iterations, [&](__m512 acc) { return _mm512_dpbf16_ps(acc, a, b); });
}
#pragma GCC pop_options

float amx_tile_chains(float seed, std::int64_t iterations) {
  static_assert(tile_chains == 4, "the step below names four accumulators");
  alignas(64) float operand[tile_rows * 16];
  for (float& value : operand) value = seed;  // as bf16 pairs: any finite values
  AmxTiles tiles;
  tiles.configure(TileConfig{});
  tiles.zero<0>(), tiles.zero<1>(), tiles.zero<2>(), tiles.zero<3>();
  tiles.load<4>(operand, tile_row_bytes), tiles.load<5>(operand, tile_row_bytes);
  tiles.load<6>(operand, tile_row_bytes), tiles.load<7>(operand, tile_row_bytes);
  for (std::int64_t i = 0; i < iterations; ++i) {
    tiles.dot<0, 4, 6>();
    tiles.dot<1, 4, 7>();
    tiles.dot<2, 5, 6>();
    tiles.dot<3, 5, 7>();
  }
  alignas(64) float result[tile_rows * 16];
  tiles.store<3>(result, tile_row_bytes);
  tiles.release();
  return result[0];
}

namespace {
/// One tile product C += A B on `Tiles` configured by `config` (tiles 0, 1,
/// 2: C, A, B): C (rows x 16 fp32), A (rows x 32 bf16, `a_stride` bytes
/// apart), B (16 x 32 bf16).
template <class Tiles>
void one_tile_product(Tiles& tiles, const TileConfig& config, float* c, const bf16* a, std::int64_t a_stride,
                      const bf16* b) {
  tiles.configure(config);
  tiles.template load<0>(c, tile_row_bytes);
  tiles.template load<1>(a, a_stride);
  tiles.template load<2>(b, tile_row_bytes);
  tiles.template dot<0, 1, 2>();
  tiles.template store<0>(c, tile_row_bytes);
  tiles.release();
}
}  // namespace

std::string amx_tiles_mismatch() {
  // A's rows 128 bytes apart (a strided load), every tile whole, then C and
  // A of 8 rows (the short tiles of the GQA decode product), then C and B of
  // 4 columns (the narrow tiles of the linear layer).
  alignas(64) bf16 a[2 * tile_rows * 32], b[tile_rows * 32];
  alignas(64) float c[2][tile_rows * 16];
  for (int i = 0; i < 2 * tile_rows * 32; ++i) a[i] = from_float<bf16>(static_cast<float>(i * 7 % 9) - 4);
  for (int i = 0; i < tile_rows * 32; ++i) b[i] = from_float<bf16>(static_cast<float>(i * 5 % 7) - 3);
  AmxTiles hardware;
  EmulatedTiles emulated;
  const struct {
    const char* name;
    TileConfig config;
  } cases[] = {{"whole tiles", TileConfig{}},
               {"tiles of 8 rows", TileConfig{}.rows_of(0b011u, 8)},
               {"tiles of 16 bytes", TileConfig{}.bytes_of(0b101u, 16)}};
  for (const auto& tile_case : cases) {
    for (int i = 0; i < tile_rows * 16; ++i) c[0][i] = c[1][i] = static_cast<float>(i % 11);
    one_tile_product(hardware, tile_case.config, c[0], a, 2 * tile_row_bytes, b);
    one_tile_product(emulated, tile_case.config, c[1], a, 2 * tile_row_bytes, b);
    const std::string difference = first_tile_difference(c[0], c[1], tile_rows);
    if (!difference.empty()) return std::string(tile_case.name) + ": " + difference;
  }
  return "";
}

}  // namespace writescope::impl
#endif
