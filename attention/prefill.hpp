#pragma once
// Chunked causal prefill attention (DESIGN.md §3), tiled like FlashAttention-2.
//
// A work item is a tile of query rows (every query head of one KV head's
// group, so the tile is rows x group queries) against all its keys, in key
// tiles: S = Q K^T and O += P V as small GEMMs with an online softmax, the
// causal mask applied only where a key tile reaches the rows' positions.
// Keys come either from the chunk's own token rows (prefill_attention) or
// from InplaceKVCache blocks (prefill_segments_attention: the sequence's
// earlier tokens, read in place from whichever pool holds them, once per
// query tile). Both return partial states that merge with each other by
// log-sum-exp (partial_state.hpp).
//
// The structure is one Kokkos source for every execution space. Host spaces
// stage each key tile in fp32 and run the tile products on the instruction
// path active_cpu_path() allows (impl/host_tile_product.hpp); other spaces
// (and host spaces asked for BlockProduct::portable) run a team kernel.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "attention/decode.hpp"
#include "attention/partial_state.hpp"
#include "attention/shape.hpp"
#include "framework/bf16.hpp"
#include "layouts/kv_format.hpp"

namespace writescope {

/// Tokens of keys and values in one row-major View, (tokens, kv_heads, dim).
template <class Scalar, class MemSpace>
using TokenMajorView = Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemSpace>;

/// Query rows per work item and key tokens per tile of the prefill kernels.
struct PrefillTiling {
  int rows = 1;
  int keys = 64;
};
/// The tiling for `shape` on host spaces (the staged tiles of one work item
/// fit a core's L2) or on the GPU (the score tile fits team scratch).
PrefillTiling prefill_tiling(const AttentionShape& shape, bool host);

/// Multiply-adds of one query row of `shape` against one key: QK^T and P·V of
/// every query head (the prefill benchmarks' FLOP count is twice this).
double prefill_macs_per_query_key(const AttentionShape& shape);

/// Device-side buffers of the prefill kernels, reused across calls (their row
/// counts only grow; a call for another shape reallocates them).
template <class MemSpace>
struct PrefillWorkspace {
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> items;  // (work items, staged floats per item)
  Kokkos::View<BlockSegment*, MemSpace> segments;
};

/// Query i (position first_position + i) attends to keys
/// [key_begin, min(key_end, first_position + i + 1)).
///   queries: (chunk_tokens, q_heads, key_dim)
///   keys:    (tokens, kv_heads, key_dim) with tokens >= min(key_end, last position + 1)
///   values:  (tokens, kv_heads, value_dim); ignored when shape.values_in_keys
///   out:     (chunk_tokens, q_heads, value_dim), lse (chunk_tokens, q_heads), natural log;
///            queries with no key in range get the empty state.
template <class ExecSpace, class Scalar>
void prefill_attention(const ExecSpace& space, const AttentionShape& shape,
                       const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& keys,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& values,
                       std::int64_t first_position, std::int64_t key_begin, std::int64_t key_end,
                       PrefillWorkspace<typename ExecSpace::memory_space>& workspace,
                       const PartialState<typename ExecSpace::memory_space>& out,
                       BlockProduct product = BlockProduct::automatic);

/// Every query row attends every token of `segments`: tokens of one sequence
/// that all precede the rows' positions (no mask), e.g. a prompt's earlier
/// chunks in one region of the cache.
///   queries:  (rows, q_heads, key_dim) floats in ExecSpace's memory space
///   pool:     (slots, block_elements) blocks of `geometry` in `order`, readable by ExecSpace
///   segments: any order; their batch_index is ignored
///   out:      (rows, q_heads, value_dim) and (rows, q_heads), natural log;
///             no segments give the empty state
template <class ExecSpace, class Scalar, class PoolSpace>
void prefill_segments_attention(
    const ExecSpace& space, const AttentionShape& shape, const BlockGeometry& geometry, BlockOrder order,
    const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace>& pool, const std::vector<BlockSegment>& segments,
    PrefillWorkspace<typename ExecSpace::memory_space>& workspace,
    const PartialState<typename ExecSpace::memory_space>& out, BlockProduct product = BlockProduct::automatic);

/// What the queries of a call over block segments are: decode steps (batch
/// entry b's query reads the segments with batch_index b) or the rows of one
/// sequence's prompt chunk (every row reads every segment: tokens that all
/// precede the rows).
enum class AttentionPass { decode, prompt };

/// decode_attention or prefill_segments_attention, as `pass` says: queries
/// (batch or rows, q_heads, key_dim), out (the same rows, q_heads, value_dim).
template <class ExecSpace, class Scalar, class PoolSpace>
void attend_segments(AttentionPass pass, const ExecSpace& space, const AttentionShape& shape,
                     const BlockGeometry& geometry, BlockOrder order,
                     const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                     const Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace>& pool,
                     const std::vector<BlockSegment>& segments,
                     DecodeWorkspace<typename ExecSpace::memory_space>& decode_workspace,
                     PrefillWorkspace<typename ExecSpace::memory_space>& prefill_workspace,
                     const PartialState<typename ExecSpace::memory_space>& out) {
  if (pass == AttentionPass::decode)
    decode_attention<ExecSpace, Scalar, PoolSpace>(space, shape, geometry, order, queries, pool, segments,
                                                   decode_workspace, out);
  else
    prefill_segments_attention<ExecSpace, Scalar, PoolSpace>(space, shape, geometry, order, queries, pool, segments,
                                                             prefill_workspace, out);
}

}  // namespace writescope

#include "attention/impl/prefill_impl.hpp"
