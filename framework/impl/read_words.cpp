#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "framework/impl/read_words.hpp"

#include <stdexcept>
#include <string>

#include "framework/simd.hpp"

namespace writescope::impl {
namespace {

/// Independent accumulators: a line or more per step keeps as many loads in
/// flight as the core allows, not one chain's worth.
constexpr int chains = 4;

std::uint64_t sum_scalar(const std::uint64_t* words, std::int64_t count) {
  std::uint64_t sum = 0;
  for (std::int64_t i = 0; i < count; ++i) sum += words[i];
  return sum;
}

#ifdef WRITESCOPE_HOST_AVX2
std::uint64_t sum_avx2(const std::uint64_t* words, std::int64_t count) {
  constexpr std::int64_t step = chains * 4;
  __m256i acc[chains];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  std::int64_t i = 0;
  for (; i + step <= count; i += step)
    for (int c = 0; c < chains; ++c)
      acc[c] = _mm256_add_epi64(acc[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 4 * c)));
  for (int c = 1; c < chains; ++c) acc[0] = _mm256_add_epi64(acc[0], acc[c]);
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + sum_scalar(words + i, count - i);
}
#endif

#ifdef WRITESCOPE_HOST_AVX512_BF16
#pragma GCC push_options
#pragma GCC target("avx512f")
std::uint64_t sum_avx512(const std::uint64_t* words, std::int64_t count) {
  constexpr std::int64_t step = chains * 8;
  __m512i acc[chains];
  for (__m512i& a : acc) a = _mm512_setzero_si512();
  std::int64_t i = 0;
  for (; i + step <= count; i += step)
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_add_epi64(acc[c], _mm512_loadu_si512(words + i + 8 * c));
  for (int c = 1; c < chains; ++c) acc[0] = _mm512_add_epi64(acc[0], acc[c]);
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, acc[0]);
  std::uint64_t sum = 0;
  for (std::uint64_t lane : lanes) sum += lane;
  return sum + sum_scalar(words + i, count - i);
}
#pragma GCC pop_options
#endif

std::vector<int> detect_load_bytes() {
  std::vector<int> widths{8};
#ifdef WRITESCOPE_HOST_AVX2
  if (__builtin_cpu_supports("avx2")) widths.push_back(32);
#endif
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (__builtin_cpu_supports("avx512f")) widths.push_back(64);
#endif
  return widths;
}

}  // namespace

const std::vector<int>& supported_load_bytes() {
  static const std::vector<int> widths = detect_load_bytes();
  return widths;
}

int widest_load_bytes() { return supported_load_bytes().back(); }

std::uint64_t sum_words(const std::uint64_t* words, std::int64_t count, int load_bytes) {
  bool supported = false;
  for (int width : supported_load_bytes()) supported = supported || width == load_bytes;
  if (!supported)
    throw std::invalid_argument("sum_words: load_bytes " + std::to_string(load_bytes) +
                                " is not a load width this CPU and build run");
  switch (load_bytes) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
    case 64:
      return sum_avx512(words, count);
#endif
#ifdef WRITESCOPE_HOST_AVX2
    case 32:
      return sum_avx2(words, count);
#endif
    default:
      return sum_scalar(words, count);
  }
}

}  // namespace writescope::impl
