#pragma once
// InplaceKVCache::append and its copies, templated on where the new tokens live.

#include <string>

#include "framework/launch.hpp"

namespace writescope {
namespace impl {

/// Scatters tokens (tokens, kv_heads, dim) into a head-major block at the
/// offsets of kv_format.hpp: keys in tiles of key_tile_tokens() tokens,
/// (kv_heads, block_tokens / tile, key_dim, tile), where the block tiles
/// them (tiled_keys; MLA's latent stays in token rows), values in
/// (kv_heads, tokens, dim).
template <class Scalar>
struct TransposeIntoHeadMajor {
  Kokkos::View<Scalar*, HostMemSpace, Kokkos::MemoryUnmanaged> block;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, HostMemSpace> source;
  BlockGeometry geometry;
  int first_token;  // position of source's token 0 inside the block
  bool keys;        // keys or values

  KOKKOS_INLINE_FUNCTION void operator()(int head, int token) const {
    const int dim = static_cast<int>(source.extent(2));
    for (int d = 0; d < dim; ++d) {
      const auto offset = keys ? geometry.key_offset(BlockOrder::head_major, first_token + token, head, d)
                               : geometry.value_offset(BlockOrder::head_major, first_token + token, head, d);
      block(offset) = source(token, head, d);
    }
  }
};

/// Tokens [first, first + count) of `tokens` (tokens, kv_heads, dim), as one
/// flat range of count * kv_heads * dim elements.
template <class Scalar, class MemSpace>
Kokkos::View<const Scalar*, MemSpace, Kokkos::MemoryUnmanaged> flat_tokens(
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemSpace>& tokens, std::int64_t first, std::int64_t count) {
  const std::int64_t per_token = static_cast<std::int64_t>(tokens.extent(1) * tokens.extent(2));
  return Kokkos::View<const Scalar*, MemSpace, Kokkos::MemoryUnmanaged>(tokens.data() + first * per_token,
                                                                      static_cast<std::size_t>(count * per_token));
}

}  // namespace impl

template <class Scalar>
template <class Write>
void InplaceKVCache<Scalar>::place_tokens(int layer, int sequence, std::int64_t tokens,
                                          const std::vector<Region>& new_block_regions, const Write& write) {
  const BlockGeometry& g = shape_.block;
  const int needed = new_blocks_needed(layer, sequence, tokens);
  if (static_cast<int>(new_block_regions.size()) != needed)
    throw KVCacheError("append: " + std::to_string(tokens) + " tokens open " + std::to_string(needed) +
                       " new blocks but " + std::to_string(new_block_regions.size()) + " regions were given");

  std::vector<Block>& list = blocks(layer, sequence);
  // Every new block is taken before a token is written. An append the budgets
  // cannot hold, or whose write fails (a copy, the staging buffer's
  // allocation), leaves the sequence and the pools as they were: every block
  // but the last stays full, which the segments' positions rest on.
  const std::size_t kept = list.size();
  const std::size_t first = kept > 0 && list[kept - 1].tokens < g.block_tokens ? kept - 1 : kept;
  const int first_tokens = first < kept ? list[first].tokens : 0;
  const auto region_tokens_before = region_tokens_;
  try {
    for (Region region : new_block_regions) list.push_back(allocate_block(region, layer, sequence));
    std::int64_t written = 0;
    std::size_t next = first;
    while (written < tokens) {
      Block& block = list[next++];
      const std::int64_t count = std::min<std::int64_t>(tokens - written, g.block_tokens - block.tokens);
      write(block, block.tokens, written, count);
      block.tokens += static_cast<int>(count);
      region_tokens_[static_cast<int>(block.region)] += count;
      written += count;
    }
  } catch (...) {
    for (std::size_t b = kept; b < list.size(); ++b) release_block(list[b]);
    list.resize(kept);
    if (first < kept) list[first].tokens = first_tokens;
    region_tokens_ = region_tokens_before;
    throw;
  }
}

template <class Scalar>
template <class ExecSpace, class MemSpace>
void InplaceKVCache<Scalar>::append(const ExecSpace& space, int layer, int sequence, const TokenView<MemSpace>& keys,
                                    const TokenView<MemSpace>& values,
                                    const std::vector<Region>& new_block_regions) {
  const BlockGeometry& g = shape_.block;
  const auto tokens = static_cast<std::int64_t>(keys.extent(0));
  if (keys.extent(1) != static_cast<std::size_t>(g.kv_heads) || keys.extent(2) != static_cast<std::size_t>(g.key_dim))
    throw KVCacheError("append: keys must be (tokens, " + std::to_string(g.kv_heads) + ", " +
                       std::to_string(g.key_dim) + "), got (" + std::to_string(keys.extent(0)) + ", " +
                       std::to_string(keys.extent(1)) + ", " + std::to_string(keys.extent(2)) + ")");
  if (!g.values_in_keys &&
      (values.extent(0) != keys.extent(0) || values.extent(1) != static_cast<std::size_t>(g.kv_heads) ||
       values.extent(2) != static_cast<std::size_t>(g.value_dim)))
    throw KVCacheError("append: values must be (" + std::to_string(tokens) + ", " + std::to_string(g.kv_heads) +
                       ", " + std::to_string(g.value_dim) + ")");
  if (storage_ == KVStorage::bookkeeping)
    throw KVCacheError("append: a bookkeeping cache holds no data; use record_append()");
  place_tokens(layer, sequence, tokens, new_block_regions,
               [&](const Block& block, int token_in_block, std::int64_t first, std::int64_t count) {
                 try {
                   write_tokens(space, block, token_in_block, keys, values, first, count);
                 } catch (...) {
                   // Copies already queued on `space` land before place_tokens gives their blocks back,
                   // so that an append on another stream cannot take a slot an old copy still fills.
                   space.fence();
                   throw;
                 }
               });
  space.fence();
}

template <class Scalar>
template <class ExecSpace, class MemSpace>
void InplaceKVCache<Scalar>::write_tokens(const ExecSpace& space, const Block& block, int token_in_block,
                                          const TokenView<MemSpace>& keys, const TokenView<MemSpace>& values,
                                          std::int64_t first, std::int64_t count) {
  const BlockGeometry& g = shape_.block;
  const BlockOrder order = block_order(block.region);
  if (order == BlockOrder::token_major) {
    // Token-major: the run of tokens is one contiguous range, in keys and in values.
    auto copy_into = [&](auto& pool) {
      using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
      Scalar* base = pool.data() + static_cast<std::int64_t>(block.slot) * g.block_elements();
      const auto key_source = impl::flat_tokens(keys, first, count);
      Kokkos::View<Scalar*, PoolSpace, Kokkos::MemoryUnmanaged> key_target(
          base + g.key_offset(order, token_in_block, 0, 0), key_source.extent(0));
      Kokkos::deep_copy(space, key_target, key_source);
      if (g.values_in_keys) return;
      const auto value_source = impl::flat_tokens(values, first, count);
      Kokkos::View<Scalar*, PoolSpace, Kokkos::MemoryUnmanaged> value_target(
          base + g.value_offset(order, token_in_block, 0, 0), value_source.extent(0));
      Kokkos::deep_copy(space, value_target, value_source);
    };
    if (pool_of(block.region) == vram) copy_into(vram_pool_);
    else copy_into(pinned_pool_);
    return;
  }
  // Head-major (CpuResident): bring the tokens to the host, transpose on the host.
  using HostTokens = Kokkos::View<Scalar***, Kokkos::LayoutRight, HostMemSpace>;
  const auto range = std::make_pair(first, first + count);
  auto to_host = [&](const TokenView<MemSpace>& source, Kokkos::View<Scalar*, HostMemSpace>& buffer) {
    const std::size_t elements = static_cast<std::size_t>(count) * source.extent(1) * source.extent(2);
    if (buffer.extent(0) < elements)
      buffer = Kokkos::View<Scalar*, HostMemSpace>(
          Kokkos::view_alloc(std::string("writescope::layouts::staged_tokens"), Kokkos::WithoutInitializing),
          std::max(elements, 2 * buffer.extent(0)));
    const HostTokens staged(buffer.data(), count, source.extent(1), source.extent(2));
    Kokkos::deep_copy(space, staged, Kokkos::subview(source, range, Kokkos::ALL, Kokkos::ALL));
    space.fence();
    return staged;
  };
  Kokkos::View<Scalar*, HostMemSpace, Kokkos::MemoryUnmanaged> target(
      host_pool_.data() + static_cast<std::int64_t>(block.slot) * g.block_elements(),
      static_cast<std::size_t>(g.block_elements()));
  // 64 source tokens a work item: one thread writes a key tile's lines where
  // the append starts on a tile boundary.
  const auto heads_by_tokens = rows_by_columns_policy(HostExecSpace(), g.kv_heads, count, 64);
  launch_parallel_for("writescope::layouts::transpose_keys", heads_by_tokens,
                       impl::TransposeIntoHeadMajor<Scalar>{target, to_host(keys, staging_[0]), g, token_in_block, true});
  if (!g.values_in_keys)
    launch_parallel_for("writescope::layouts::transpose_values", heads_by_tokens,
                         impl::TransposeIntoHeadMajor<Scalar>{target, to_host(values, staging_[1]), g, token_in_block, false});
  HostExecSpace().fence();
}

}  // namespace writescope
