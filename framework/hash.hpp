#pragma once
// A 64-bit mixing function for deterministic pseudo-random values, callable on
// every execution space (synthetic weights and synthetic KV).
#include <Kokkos_Core.hpp>

#include <cstdint>

namespace writescope {

/// SplitMix64 (Steele, Lea and Flood): a bijective mix of x + the golden gamma.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace writescope
