#pragma once
// Deterministic keys, values and queries for layout and attention tests, already
// rounded to the storage precision so the reference sees what the cache holds.

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <random>
#include <vector>

#include "framework/bf16.hpp"
#include "framework/cpu_path.hpp"

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

/// Whether host decode products of Scalar KV run on bf16 pairs on
/// `product_path` (impl::host_product_path's choice for the blocks:
/// avx512_bf16, or amx_bf16's tiles): queries and softmax weights are then
/// rounded to bf16 (relative 2^-9) before their products.
template <class Scalar>
bool host_bf16_products(CpuPath product_path) {
  return std::is_same_v<Scalar, bf16> &&
         (product_path == CpuPath::avx512_bf16 || product_path == CpuPath::amx_bf16);
}

/// The CPU path for host products in a result that GPU products share: in a
/// CUDA build a merged state holds both, and the reference can round the
/// queries for all of them or none, so the host products there run on the
/// best fp32 path at or below the active one (avx512_fma where a bf16 path is
/// pinned; the bf16 products are tested where the host spaces do everything,
/// and by HostDecode).
inline CpuPath fp32_cpu_path() { return std::min(active_cpu_path(), CpuPath::avx512_fma); }

/// Decode-attention tolerances against the double reference, an output's in
/// units of its spread (reference_decode: sqrt(sum p^2 v^2) / sum p, the size
/// of its terms; over N tokens of unit-normal values about 1/sqrt(N)), so that
/// a segment of a long sequence attended twice or skipped still shows. With
/// bf16 products the queries' and the softmax weights' rounding (2^-9) moved
/// an output by at most 7.5e-3 spreads and lse by 1.3e-3 (Zen 5, every shape
/// and path of DecodeAttentionTest); fp32 products by 8.5e-6 spreads and lse
/// by 1.5e-6. The bounds leave 5-10 times that.
inline double attention_o_tolerance(bool bf16_products, double spread) {
  return bf16_products ? 2e-5 + 6e-2 * spread : 1e-6 + 1e-4 * spread;
}
inline double attention_lse_tolerance(bool bf16_products, double lse) {
  return bf16_products ? 2e-3 * (1 + std::abs(lse)) : 2e-5;
}

}  // namespace writescope::test
