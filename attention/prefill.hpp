#pragma once
// Chunked causal prefill attention (DESIGN.md §3): the queries of a prompt
// chunk attend to the layer's keys up to their own position, on the GPU side
// before the chunk's K/V is written into its InplaceKVCache regions.
//
// One team per (query token, KV head) runs an online softmax over key tiles
// held in team scratch, for the KV head's whole group of query heads. The
// result is a partial state (batch = chunk tokens), so a prefill over keys
// [key_begin, key_end) merges with attention over other key ranges (e.g.
// earlier tokens already placed in CPU regions) by log-sum-exp.

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "attention/partial_state.hpp"
#include "attention/shape.hpp"
#include "framework/bf16.hpp"

namespace writescope {

/// Tokens of keys and values in one row-major View, (tokens, kv_heads, dim).
template <class Scalar, class MemSpace>
using TokenMajorView = Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemSpace>;

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
                       const PartialState<typename ExecSpace::memory_space>& out);

}  // namespace writescope

#include "attention/impl/prefill_impl.hpp"
