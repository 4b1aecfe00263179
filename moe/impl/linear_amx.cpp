// The AMX decode linear layer (amx_bf16 path): y^T = W x^T in tdpbf16ps
// tiles.
//
// Why it looks like this: the weights are read once per call and are the
// layer's whole cost, so they go into the tiles as they are stored: the A
// tile is 16 weight rows x 32 input columns, loaded straight from W (no
// repacking, no widening). The inputs are the B tiles, (input pair, row)
// words prepared once per call; to stay near the fp32 result of the vector
// paths each input is split into a bf16 high half and the bf16 rounding of
// the rest (x - high), two products per step: the error is that of the
// second rounding, about 2^-17 of x. The accumulators are y^T tiles of
// (features, rows) fp32, two of them (even and odd steps) so that
// consecutive products do not wait on each other.

#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "moe/impl/linear_host.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16

#include <cstdint>

#include "framework/impl/amx_tiles.hpp"

namespace writescope::impl {
namespace {

/// The (features, rows) tile product over all of `in`. Tiles: 0, 1
/// accumulators (features x rows); 2, 3 weights (features x 32 columns);
/// 4, 5 and 6, 7 the input pairs' high and low halves (16 pairs x rows) of
/// even and odd steps.
template <class Tiles>
void linear_tiles(Tiles& tiles, const std::uint32_t* x_pairs, int rows, int in, const bf16* w, std::int64_t w_stride,
                  int features, float* y, std::int64_t y_stride) {
  tiles.configure(TileConfig{}.rows_of(0b1111u, features).bytes_of(0b11110011u, 4 * rows));
  tiles.template zero<0>();
  tiles.template zero<1>();
  const std::int64_t weight_stride = w_stride * static_cast<std::int64_t>(sizeof(bf16)), pair_stride = 4 * rows;
  const int steps = in / 32;
  const std::uint32_t* pairs = x_pairs;  // a step's high tile, then its low tile
  int c = 0;
  for (; c + 1 < steps; c += 2, pairs += 2 * 32 * rows) {
    tiles.template load<2>(w + 32 * c, weight_stride);
    tiles.template load<4>(pairs, pair_stride);
    tiles.template load<5>(pairs + 16 * rows, pair_stride);
    tiles.template dot<0, 2, 4>();
    tiles.template dot<0, 2, 5>();
    tiles.template load<3>(w + 32 * (c + 1), weight_stride);
    tiles.template load<6>(pairs + 32 * rows, pair_stride);
    tiles.template load<7>(pairs + 48 * rows, pair_stride);
    tiles.template dot<1, 3, 6>();
    tiles.template dot<1, 3, 7>();
  }
  if (c < steps) {
    tiles.template load<2>(w + 32 * c, weight_stride);
    tiles.template load<4>(pairs, pair_stride);
    tiles.template load<5>(pairs + 16 * rows, pair_stride);
    tiles.template dot<0, 2, 4>();
    tiles.template dot<0, 2, 5>();
  }
  float even[tile_rows * 16], odd[tile_rows * 16];
  tiles.template store<0>(even, tile_row_bytes);
  tiles.template store<1>(odd, tile_row_bytes);
  tiles.release();
  for (int f = 0; f < features; ++f)
    for (int r = 0; r < rows; ++r) y[r * y_stride + f] = even[16 * f + r] + odd[16 * f + r];
}

}  // namespace

void pair_inputs_amx(const float* x, std::int64_t x_stride, int rows, int in, std::uint32_t* x_pairs) {
  for (int c = 0; c < in / 32; ++c)
    for (int p = 0; p < 16; ++p)
      for (int r = 0; r < rows; ++r) {
        const float first = x[r * x_stride + 32 * c + 2 * p], second = x[r * x_stride + 32 * c + 2 * p + 1];
        const bf16 first_high = from_float<bf16>(first), second_high = from_float<bf16>(second);
        std::uint32_t* step = x_pairs + static_cast<std::int64_t>(c) * 32 * rows;
        step[p * rows + r] = bf16_pair(first_high, second_high);
        step[(16 + p) * rows + r] = bf16_pair(from_float<bf16>(first - to_float(first_high)),
                                              from_float<bf16>(second - to_float(second_high)));
      }
}

void linear_features_amx(const std::uint32_t* x_pairs, int rows, int in, const bf16* w, std::int64_t w_stride,
                         int features, float* y, std::int64_t y_stride) {
  AmxTiles tiles;
  linear_tiles(tiles, x_pairs, rows, in, w, w_stride, features, y, y_stride);
}

void linear_features_amx_emulated(const std::uint32_t* x_pairs, int rows, int in, const bf16* w,
                                  std::int64_t w_stride, int features, float* y, std::int64_t y_stride) {
  EmulatedTiles tiles;
  linear_tiles(tiles, x_pairs, rows, in, w, w_stride, features, y, y_stride);
}

}  // namespace writescope::impl

#endif  // WRITESCOPE_HOST_AVX512_BF16
