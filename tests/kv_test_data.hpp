#pragma once
// Deterministic keys, values and queries for layout and attention tests, already
// rounded to the storage precision so the reference sees what the cache holds.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "framework/bf16.hpp"

namespace writescope::test {

/// `count` normally distributed floats (mean 0, stddev `scale`) rounded to Scalar.
template <class Scalar>
std::vector<float> random_values(std::size_t count, unsigned seed, float scale = 1.0f) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(count);
  for (float& x : out) x = round_to<Scalar>(normal(engine));
  return out;
}

/// Rows [first, first + count) of a (tokens, heads, dim) float array as a
/// Scalar View in MemSpace.
template <class Scalar, class MemSpace>
Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemSpace> token_view(const std::vector<float>& data, int heads,
                                                                        int dim, std::int64_t first,
                                                                        std::int64_t count) {
  Kokkos::View<Scalar***, Kokkos::LayoutRight, Kokkos::HostSpace> host("writescope::test::tokens", count, heads, dim);
  for (std::int64_t t = 0; t < count; ++t)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < dim; ++d)
        host(t, h, d) = from_float<Scalar>(data[((first + t) * heads + h) * dim + d]);
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemSpace> device("writescope::test::tokens", count, heads, dim);
  Kokkos::deep_copy(device, host);
  return device;
}

}  // namespace writescope::test
