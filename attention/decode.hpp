#pragma once
// Split-KV decode attention over InplaceKVCache block segments (DESIGN.md §3).
//
// One call attends one query token per batch entry over a list of block
// segments that all live in one pool (one memory space, one block order), and
// returns a partial state per (batch entry, query head). Work is split along
// the sequence (flash-decoding): on the GPU every (segment, KV head) pair is an
// independent work item producing a partial state for the KV head's group of
// query heads; on the host a work item takes a run of a batch entry's
// consecutive segments (impl::host_segment_runs) with one state, for one KV
// head or, in token-major blocks, for all of them. A second kernel merges the
// states of each batch entry by log-sum-exp. Partial states of different
// pools, devices or regions merge the same way (partial_state.hpp).
//
// The structure is one Kokkos source for every execution space. Only the
// innermost block product is specialised: host spaces use the vectorised
// product of impl/host_block_attention.hpp on the instruction path that
// active_cpu_path() allows (framework/cpu_path.hpp), other spaces (and host
// spaces when asked for BlockProduct::portable) a team kernel with vector lanes
// over the head dimension.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/host_prefetch.hpp"
#include "attention/partial_state.hpp"
#include "attention/shape.hpp"
#include "framework/bf16.hpp"
#include "layouts/kv_format.hpp"

namespace writescope {

enum class BlockProduct {
  automatic,  // the fastest product for the execution space
  portable,   // the team kernel on every space (tests use it to cover both)
};

/// The most warps a GPU decode team takes by its rule.
inline constexpr int max_gpu_decode_warps = 16;
/// How the GPU runs decode_attention's team kernel for blocks of
/// `block_tokens` tokens: warps for one lane per token and four lanes per P·V
/// item, at most `most_warps`; the P·V phase in token_splits slices, and the
/// team scratch that needs (scores of the group, maxima and sums, the slices'
/// partial sums), which fewer warps never raise. The rule's 16 warps of 110
/// registers fill a streaming multiprocessor's registers with one team
/// (ptxas, sm_90), so teams of fewer warps are measured beside it
/// (benchmark gpu_decode's warps).
struct GpuDecodeTeam {
  int team_size = 1, vector_length = 1, token_splits = 1;
  std::size_t scratch_bytes = 0;
};
GpuDecodeTeam gpu_decode_team(const AttentionShape& shape, int block_tokens, int most_warps = max_gpu_decode_warps);
/// The shared memory a CUDA block gets without opting in to more (sm_90's
/// sharedMemPerBlock), which Kokkos checks each team launch against.
inline constexpr std::size_t gpu_block_shared_memory = 48 * 1024;
/// Shared memory the team takes on CUDA: its scratch, ahead of it what Kokkos
/// (3.4 and 4) reserves for team reductions, a double per thread row plus
/// two, and the 8 bytes Kokkos 3.4's team kernel declares itself (its
/// base_thread_id), which its own check leaves out: a team over the block's
/// shared memory by those does not run.
inline std::size_t gpu_team_shared_bytes(const GpuDecodeTeam& team) {
  return team.scratch_bytes + sizeof(double) * (static_cast<std::size_t>(team.team_size) + 2) + sizeof(std::int64_t);
}
/// Why blocks of `block_tokens` tokens cannot run on the GPU for `shape`
/// (their team's shared memory is over the block's, with the largest that
/// fits), or "" when they can. Configs check it when they are read, on every
/// build.
std::string gpu_decode_block_tokens_error(const AttentionShape& shape, int block_tokens);

/// Device-side buffers of decode_attention, reused across calls (their row
/// counts only grow; a call for another shape reallocates them).
template <class MemSpace>
struct DecodeWorkspace {
  Kokkos::View<BlockSegment*, MemSpace> segments;
  Kokkos::View<int*, MemSpace> batch_offsets;                  // (batch + 1)
  // One partial state per segment (per run of segments on the host product).
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> segment_o;  // (segments, q_heads, value_dim)
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> segment_lse;  // (segments, q_heads)
  Kokkos::View<std::uint32_t*, MemSpace> query_pairs;  // host AVX-512 BF16 path: (batch, kv_heads, group * key_dim / 2)
  Kokkos::View<float*, MemSpace> query_lanes;  // host AVX-512 FMA path: (batch, kv_heads, impl::query_lane_floats)
  Kokkos::View<int*, MemSpace> run_begins;  // host product: (runs + 1) segment runs, impl::host_segment_runs
  // The last launch's host product: its path, the level it requested each
  // next pass into and the tokens per pass it asked for (0: the products'
  // rule; benchmarks and `writescope info` report them).
  CpuPath host_path = CpuPath::scalar;
  PrefetchLevel host_next_pass = PrefetchLevel::l1;
  int host_pass = 0;
  // The GPU team kernel's warps at most (gpu_decode_team; benchmarks sweep it).
  int gpu_most_warps = max_gpu_decode_warps;
  // Threads per team of the team kernel on host spaces, at most their
  // concurrency: 1, or more in tests, so that its barriers and team ranges
  // run as the GPU's warps do.
  int host_team_threads = 1;
};

/// Attends queries(b, :, :) over the segments with batch_index b, for every b.
///   queries:  (batch, q_heads, key_dim) floats in ExecSpace's memory space
///   pool:     (slots, block_elements) blocks of `geometry` in `order`, readable by ExecSpace
///   segments: sorted by batch_index; batch entries without segments get the empty state
///   out:      (batch, q_heads, value_dim) and (batch, q_heads); lse is natural log
template <class ExecSpace, class Scalar, class PoolSpace>
void decode_attention(const ExecSpace& space, const AttentionShape& shape, const BlockGeometry& geometry,
                      BlockOrder order,
                      const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                      const Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace>& pool,
                      const std::vector<BlockSegment>& segments,
                      DecodeWorkspace<typename ExecSpace::memory_space>& workspace,
                      const PartialState<typename ExecSpace::memory_space>& out,
                      BlockProduct product = BlockProduct::automatic);

}  // namespace writescope

#include "attention/impl/decode_impl.hpp"
