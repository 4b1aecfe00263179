#pragma once
// The physical format of InplaceKVCache blocks.
//
// A block holds `block_tokens` consecutive tokens of one sequence for one
// layer: keys (kv_heads x key_dim per token) followed by values (kv_heads x
// value_dim per token) unless the values are the first value_dim entries of
// each key (MLA's absorbed form: the 512-wide latent is both).
//
// Two element orders exist inside a block:
//  - token-major (GpuResident, GpuStreamed, CpuStreamed): keys (tokens, kv_heads,
//    key_dim), values (tokens, kv_heads, value_dim). A run of tokens is one
//    contiguous range, so streaming and appending are plain copies.
//  - head-major (CpuResident): keys transposed per head in tiles of 16 tokens,
//    (kv_heads, tokens / 16, key_dim, 16), so that consecutive tokens sit in
//    consecutive SIMD lanes for the CPU's QK^T and each tile is one contiguous
//    4 KiB stream (a plain (key_dim, tokens) transpose makes the CPU walk
//    key_dim cache lines at a stride of block_tokens and stall on memory);
//    values (kv_heads, tokens, value_dim). Written once, with the transpose
//    done at write time. Blocks whose size is not a multiple of 16 use one
//    tile of block_tokens.
//    MLA's latent (values_in_keys) is not transposed: with one KV head, its
//    head-major order is token rows, which serve both of its products (QK^T
//    with the query heads in SIMD lanes, PV with value dims in lanes); a
//    transposed latent would need a second, token-contiguous copy for PV.

#include "framework/host_device.hpp"

#include <cstdint>

namespace writescope {

enum class Region : int { gpu_resident = 0, gpu_streamed = 1, cpu_resident = 2, cpu_streamed = 3 };
inline constexpr int region_count = 4;
inline constexpr Region all_regions[region_count] = {Region::gpu_resident, Region::gpu_streamed,
                                                     Region::cpu_resident, Region::cpu_streamed};

/// "GpuResident", "GpuStreamed", "CpuResident", "CpuStreamed".
const char* region_name(Region region);

enum class BlockOrder : int { token_major = 0, head_major = 1 };

constexpr BlockOrder block_order(Region region) {
  return region == Region::cpu_resident ? BlockOrder::head_major : BlockOrder::token_major;
}

/// Geometry of one block; all offsets are in elements from the block start.
struct BlockGeometry {
  int block_tokens = 256;
  int kv_heads = 1;
  int key_dim = 128;
  int value_dim = 128;
  bool values_in_keys = false;  // MLA: value d of a token is its key entry d

  WRITESCOPE_INLINE_FUNCTION std::int64_t key_elements() const {
    return std::int64_t{block_tokens} * kv_heads * key_dim;
  }
  WRITESCOPE_INLINE_FUNCTION std::int64_t block_elements() const {
    return key_elements() + (values_in_keys ? 0 : std::int64_t{block_tokens} * kv_heads * value_dim);
  }

  /// Tokens per key tile in head-major blocks.
  WRITESCOPE_INLINE_FUNCTION int key_tile_tokens() const { return block_tokens % 16 == 0 ? 16 : block_tokens; }

  /// Whether keys of a block in `order` are transposed into token tiles.
  WRITESCOPE_INLINE_FUNCTION bool tiled_keys(BlockOrder order) const {
    return order == BlockOrder::head_major && !values_in_keys;
  }

  WRITESCOPE_INLINE_FUNCTION std::int64_t key_offset(BlockOrder order, int token, int head, int d) const {
    if (!tiled_keys(order)) return (std::int64_t{token} * kv_heads + head) * key_dim + d;
    const int tile = key_tile_tokens();
    return ((std::int64_t{head} * (block_tokens / tile) + token / tile) * key_dim + d) * tile + token % tile;
  }
  WRITESCOPE_INLINE_FUNCTION std::int64_t value_offset(BlockOrder order, int token, int head, int d) const {
    if (values_in_keys) return key_offset(order, token, head, d);
    return key_elements() + (order == BlockOrder::token_major
                                 ? (std::int64_t{token} * kv_heads + head) * value_dim + d
                                 : (std::int64_t{head} * block_tokens + token) * value_dim + d);
  }
  /// Distance between the same (head, d) of consecutive tokens (within one key
  /// tile for head-major keys).
  WRITESCOPE_INLINE_FUNCTION std::int64_t key_token_stride(BlockOrder order) const {
    return tiled_keys(order) ? 1 : std::int64_t{kv_heads} * key_dim;
  }
  WRITESCOPE_INLINE_FUNCTION std::int64_t value_token_stride(BlockOrder order) const {
    if (values_in_keys) return key_token_stride(order);
    return order == BlockOrder::token_major ? std::int64_t{kv_heads} * value_dim : value_dim;
  }
  /// Distance between dims d and d + 1 of one token in a head-major key tile.
  WRITESCOPE_INLINE_FUNCTION std::int64_t key_dim_stride(BlockOrder order) const {
    return tiled_keys(order) ? key_tile_tokens() : 1;
  }
};

/// Tokens [token_begin, token_begin + token_count) of the block in pool slot
/// `slot`, belonging to the batch entry `batch_index`; the first of them is
/// token `position` of its sequence. Kernels take lists of these, sorted by
/// batch_index.
struct BlockSegment {
  int batch_index;
  int slot;
  int token_begin;
  int token_count;
  std::int64_t position;
};

}  // namespace writescope
