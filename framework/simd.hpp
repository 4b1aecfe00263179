#pragma once
// AVX2 building blocks of the host kernels (attention block products, linear
// layers), compiled where the build targets AVX2 + FMA (the project's host
// baseline) and never in device code. WRITESCOPE_HOST_AVX2 says they exist;
// WRITESCOPE_HOST_AVX512_BF16 says the AVX-512 BF16 kernels are compiled too
// (whether the CPU runs them is decided at run time: framework/cpu_path.hpp).

#include <type_traits>

#include "framework/bf16.hpp"
#include "framework/math.hpp"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#define WRITESCOPE_HOST_AVX2 1
// The AVX-512 BF16 kernels are compiled (with a target pragma, so that the rest
// of the binary keeps the AVX2 baseline) by GCC >= 10 outside nvcc.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define WRITESCOPE_HOST_AVX512_BF16 1
#endif
#endif

// Full unrolling of the register-tile loops (GCC keeps un-unrolled arrays of
// vectors in memory). nvcc's front end does not know the GCC pragma.
#if defined(__CUDACC__)
#define WRITESCOPE_UNROLL(n)
#else
#define WRITESCOPE_STRINGIFY(x) #x
#define WRITESCOPE_UNROLL(n) _Pragma(WRITESCOPE_STRINGIFY(GCC unroll n))
#endif

#ifdef WRITESCOPE_HOST_AVX2
namespace writescope::simd {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}

/// Sixteen consecutive elements as two float vectors. For bf16 the halves are
/// the even and the odd elements (one load, one shift, one mask: cheaper than
/// widening two halves); `interleave16` restores element order afterwards.
inline void load16(const float* p, __m256& first, __m256& second) {
  first = _mm256_loadu_ps(p);
  second = _mm256_loadu_ps(p + 8);
}
inline void load16(const bf16* p, __m256& even, __m256& odd) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
template <class Scalar>
inline constexpr bool load16_splits = std::is_same_v<Scalar, bf16>;

/// Undoes load16's even/odd split for two result vectors of 8 lanes each.
inline void interleave16(__m256& even, __m256& odd) {
  const __m256 low = _mm256_unpacklo_ps(even, odd), high = _mm256_unpackhi_ps(even, odd);
  even = _mm256_permute2f128_ps(low, high, 0x20);
  odd = _mm256_permute2f128_ps(low, high, 0x31);
}

inline float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

inline float horizontal_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

/// Cephes' exp: x = n ln2 + r with ln2 split in two parts, e^r by a degree-5
/// polynomial (highest power first); shared by exp8 and the AVX-512 exp16.
namespace exp_coefficients {
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float ln2_high = 0.693359375f;
inline constexpr float ln2_low = -2.12194440e-4f;
inline constexpr float polynomial[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_coefficients

/// exp(x) for 8 floats, relative error < 2e-7 over the range softmax uses
/// (x <= 0); x below -87 is clamped there: e^-87 (about 1.6e-38), never 0.
inline __m256 exp8(__m256 x) {
  using namespace exp_coefficients;
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_low), _mm256_fnmadd_ps(n, _mm256_set1_ps(ln2_high), x));
  __m256 p = _mm256_set1_ps(polynomial[0]);
  for (int k = 1; k < 6; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(polynomial[k]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

/// Eight sums at once: lane j of the result is the sum of the lanes of a[j].
inline __m256 sum_lanes8(const __m256 (&a)[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

}  // namespace writescope::simd
#endif
