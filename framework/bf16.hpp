#pragma once
// bfloat16 storage for Kokkos 3.4, which has no bf16 type: a 16-bit word that
// holds the upper half of an IEEE float. Arithmetic always happens in float;
// conversion to float is exact, conversion from float rounds to nearest even.

#include "framework/host_device.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace writescope {

struct bf16 {
  std::uint16_t bits;
};

WRITESCOPE_INLINE_FUNCTION float float_from_bits(std::uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

WRITESCOPE_INLINE_FUNCTION std::uint32_t bits_from_float(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

WRITESCOPE_INLINE_FUNCTION float to_float(float value) { return value; }
WRITESCOPE_INLINE_FUNCTION float to_float(bf16 value) { return float_from_bits(std::uint32_t{value.bits} << 16); }

/// Float -> Scalar (float or bf16); bf16 rounds to nearest even, NaN stays NaN.
template <class Scalar>
WRITESCOPE_INLINE_FUNCTION Scalar from_float(float value) {
  if constexpr (std::is_same_v<Scalar, float>) {
    return value;
  } else {
    const std::uint32_t bits = bits_from_float(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((bits >> 16) | 0x40u)};
    const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(rounded >> 16)};
  }
}

/// Two bf16 as one word, `first` in the low half: the order of a pair in the
/// vdpbf16ps and tdpbf16ps operands.
WRITESCOPE_INLINE_FUNCTION std::uint32_t bf16_pair(bf16 first, bf16 second) {
  return std::uint32_t{first.bits} | (std::uint32_t{second.bits} << 16);
}

/// The value `value` takes after a round trip through Scalar.
template <class Scalar>
WRITESCOPE_INLINE_FUNCTION float round_to(float value) {
  return to_float(from_float<Scalar>(value));
}

/// Eight consecutive elements of a row as floats, in one 16-byte load for bf16
/// (two for float): `p` must be 16-byte aligned.
struct alignas(16) SixteenBytes {
  std::uint32_t words[4];
};
WRITESCOPE_INLINE_FUNCTION SixteenBytes load_sixteen_bytes(const void* p) {
#ifdef __CUDA_ARCH__
  return *static_cast<const SixteenBytes*>(p);
#else
  SixteenBytes bytes;
  std::memcpy(&bytes, p, sizeof bytes);
  return bytes;
#endif
}
WRITESCOPE_INLINE_FUNCTION void load_eight(const bf16* p, float (&out)[8]) {
  const SixteenBytes bytes = load_sixteen_bytes(p);
  for (int j = 0; j < 4; ++j) {  // little-endian: element 2j is the low half of word j
    out[2 * j] = float_from_bits(bytes.words[j] << 16);
    out[2 * j + 1] = float_from_bits(bytes.words[j] & 0xffff0000u);
  }
}
WRITESCOPE_INLINE_FUNCTION void load_eight(const float* p, float (&out)[8]) {
  for (int half = 0; half < 2; ++half) {
    const SixteenBytes bytes = load_sixteen_bytes(p + 4 * half);
    for (int j = 0; j < 4; ++j) out[4 * half + j] = float_from_bits(bytes.words[j]);
  }
}

}  // namespace writescope
