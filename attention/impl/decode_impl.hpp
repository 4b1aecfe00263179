#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/impl/host_block_attention.hpp"
#include "framework/launch.hpp"
#include "framework/math.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace impl {

/// What both decode kernels read and write: the segments' keys/values in
/// `pool`, the group's queries, and one partial state per segment (the team
/// kernel) or per run of segments (the host product).
template <class ExecSpace, class Scalar, class PoolSpace>
struct DecodeSegmentsData {
  using MemSpace = typename ExecSpace::memory_space;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> queries;  // (batch, q_heads, key_dim)
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace> pool;    // (slots, block_elements)
  Kokkos::View<const BlockSegment*, MemSpace> segments;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> segment_o;      // (segments, q_heads, value_dim)
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> segment_lse;     // (segments, q_heads)
  BlockGeometry geometry;
  BlockOrder order;
  int group;
  float scale;

  /// Where (batch entry, KV head)'s prepared query pairs start in the
  /// (batch, kv_heads, group * key_dim / 2) array of PrepareQueryPairsKernel.
  std::size_t query_pairs_offset(int batch_index, int kv_head) const {
    return (static_cast<std::size_t>(batch_index) * geometry.kv_heads + kv_head) * group * geometry.key_dim / 2;
  }
  /// Where (batch entry, KV head)'s prepared query lanes start in the
  /// (batch, kv_heads, lane_floats) array of PrepareQueryLanesKernel.
  std::size_t query_lanes_offset(int batch_index, int kv_head, int lane_floats) const {
    return (static_cast<std::size_t>(batch_index) * geometry.kv_heads + kv_head) * lane_floats;
  }
};

/// Query floats of a step (batch x q_heads x key_dim) up to which the host
/// products' queries are prepared on the launching thread (one sequence of
/// every supported shape: MLA's 16 x 576).
inline constexpr std::int64_t queries_prepared_here = 16 * 1024;
/// Floats of the runs' partial outputs (runs x q_heads x value_dim) up to
/// which the host products' merge runs on the launching thread: there it
/// took 1.6 / 6 / 10-11 us for 2 / 8 / 16 runs of Qwen3's or MLA's heads,
/// launched on 2 threads 4-6 us more each (Zen 5, a probe, medians of 2000).
inline constexpr std::int64_t runs_merged_here = 64 * 1024;

/// Host work item (batch entry, KV head): the group's queries as the bf16
/// pairs the AVX-512 BF16 product reads, once per call instead of per segment.
template <class ExecSpace, class Scalar, class PoolSpace>
struct PrepareQueryPairsKernel {
  DecodeSegmentsData<ExecSpace, Scalar, PoolSpace> data;
  Kokkos::View<std::uint32_t*, typename ExecSpace::memory_space> query_pairs;  // (batch, kv_heads, group * key_dim / 2)
  CpuPath path;  // avx512_bf16 or amx_bf16: whose order

  void operator()(int work) const {
#ifdef WRITESCOPE_HOST_AVX512_BF16
    const int b = work / data.geometry.kv_heads, kv_head = work % data.geometry.kv_heads;
    prepare_query_pairs(path, data.geometry, data.order, data.group, &data.queries(b, kv_head * data.group, 0),
                        &query_pairs(data.query_pairs_offset(b, kv_head)));
#else
    (void)work;
#endif
  }
};

/// Host work item (batch entry, KV head): the group's queries as the fp32
/// lanes the AVX-512 FMA product reads, once per call instead of per run.
template <class ExecSpace, class Scalar, class PoolSpace>
struct PrepareQueryLanesKernel {
  DecodeSegmentsData<ExecSpace, Scalar, PoolSpace> data;
  Kokkos::View<float*, typename ExecSpace::memory_space> query_lanes;  // (batch, kv_heads, lane_floats)
  int lane_floats;                                                      // impl::query_lane_floats

  void operator()(int work) const {
#ifdef WRITESCOPE_HOST_AVX512_BF16
    const int b = work / data.geometry.kv_heads, kv_head = work % data.geometry.kv_heads;
    prepare_query_lanes_avx512_fma(data.geometry, data.order, data.group, &data.queries(b, kv_head * data.group, 0),
                                   &query_lanes(data.query_lanes_offset(b, kv_head, lane_floats)));
#else
    (void)work;
#endif
  }
};

/// Whether a host work item takes every KV head of its segments (token-major
/// blocks with several KV heads: the heads share each token row, which is then
/// read once for all) or one.
inline bool host_takes_all_heads(const BlockGeometry& geometry, BlockOrder order) {
  return order == BlockOrder::token_major && geometry.kv_heads > 1;
}

/// Split segments are cut on multiples of this many tokens from the block's
/// start, the host products' passes, into pieces of about this many or more
/// (64-token pieces ran slower than 128-token ones, Intel VM).
inline constexpr int host_piece_tokens = 128;

/// The host products' segments, each split along its tokens into up to
/// enough pieces that every thread has a work item, when the step has fewer
/// (`items_per_segment` per segment): a step over a block or a few otherwise
/// leaves threads idle (MLA over one 256-token block: one work item for all
/// threads; split, 0.13 -> 0.09 ms a step on two threads; more items than
/// threads gained nothing). Pieces keep their segment's order;
/// std::nullopt when no segment is split.
inline std::optional<std::vector<BlockSegment>> host_split_segments(const std::vector<BlockSegment>& segments,
                                                                    int items_per_segment, int concurrency) {
  const std::int64_t items = static_cast<std::int64_t>(segments.size()) * items_per_segment;
  const std::int64_t wanted = concurrency;
  if (items == 0 || items >= wanted) return std::nullopt;
  const int pieces_wanted = static_cast<int>((wanted + items - 1) / items);
  std::vector<BlockSegment> pieces;
  for (const BlockSegment& segment : segments) {
    const int first = segment.token_begin, end = first + segment.token_count;
    const int n = std::max(1, std::min(pieces_wanted, segment.token_count / host_piece_tokens));
    // Cut i on the multiple of host_piece_tokens nearest the even split's:
    // pieces of half of it or more, since the even pieces have all of it.
    int begin = first;
    for (int i = 1; i <= n; ++i) {
      const int even = first + static_cast<int>(std::int64_t{segment.token_count} * i / n);
      const int cut = i == n ? end : (even + host_piece_tokens / 2) / host_piece_tokens * host_piece_tokens;
      BlockSegment piece = segment;
      piece.token_begin = begin;
      piece.token_count = cut - begin;
      piece.position = segment.position + (begin - first);
      pieces.push_back(piece);
      begin = cut;
    }
  }
  return pieces;
}

/// Work items per thread that the host's runs of segments leave: 16 (work
/// stealing evens out a core that anything else slows), fewer, down to 4,
/// where the runs' partial outputs would come to more than 1% of the KV they
/// read: each run writes its heads' o and lse in fp32, and the merge reads them
/// again (MLA: 16 x 512 floats a run against 295 KB of KV a block; 16 -> 4
/// items a thread read +12% at 8K tokens and +4% at 32K, Zen 5, 2 threads,
/// alternated in one process; GQA head-major, 2-4 KB a work item, within 1-3%).
///   kv_bytes: the step's keys and values; output_bytes: one work item's o and lse
inline int host_items_per_thread(double kv_bytes, double output_bytes, int concurrency) {
  constexpr int most = 16, fewest = 4;
  constexpr double output_share = 0.01;
  const double items = kv_bytes * output_share / output_bytes / std::max(1, concurrency);
  return items >= most ? most : std::max(fewest, static_cast<int>(items));
}

/// The host's runs of segments: consecutive segments of one batch entry that
/// one work item attends with one running state, so that a partial state is
/// written to memory (and merged) once per run rather than once per block.
/// Runs are as long as leaves about `items_per_thread` work items per thread
/// (`items_per_run` per run), split evenly within a batch entry.
///   batch_offsets: (batch + 1) first segment of each batch entry
///   returns run_begins, (runs + 1): run r covers segments [run_begins[r], run_begins[r + 1]);
///   run_offsets: (batch + 1) first run of each batch entry
inline std::vector<int> host_segment_runs(const std::vector<int>& batch_offsets, int items_per_run, int concurrency,
                                          int items_per_thread, std::vector<int>& run_offsets) {
  const int segments = batch_offsets.back();
  const int runs_wanted = std::max(1, (items_per_thread * concurrency + items_per_run - 1) / items_per_run);
  const int longest = std::max(1, (segments + runs_wanted - 1) / runs_wanted);
  std::vector<int> run_begins{0};
  run_offsets.assign(batch_offsets.size(), 0);
  for (std::size_t b = 0; b + 1 < batch_offsets.size(); ++b) {
    const int first = batch_offsets[b], n = batch_offsets[b + 1] - first;
    const int runs = (n + longest - 1) / longest;
    for (int r = 1; r <= runs; ++r) run_begins.push_back(first + static_cast<int>(std::int64_t{n} * r / runs));
    run_offsets[b + 1] = static_cast<int>(run_begins.size()) - 1;
  }
  return run_begins;
}

/// Host work item: the vectorised block product over a run of segments, for
/// one KV head (head-major blocks: each head's keys and values are
/// contiguous) or for all of them (token-major blocks with several KV heads:
/// the heads share each token row, which is then read once for all).
template <class ExecSpace, class Scalar, class PoolSpace>
struct DecodeSegmentsHostKernel {
  DecodeSegmentsData<ExecSpace, Scalar, PoolSpace> data;
  Kokkos::View<const int*, typename ExecSpace::memory_space> run_begins;  // (runs + 1), host_segment_runs
  CpuPath path;                          // host_product_path, once per launch
  PrefetchLevel next_pass;               // impl::next_pass_level, once per launch
  int requested_pass;                    // active_head_major_pass / active_token_major_pass (0: the products' rule)
  const std::uint32_t* query_pairs;      // PrepareQueryPairsKernel's output (avx512_bf16, amx_bf16 only)
  const float* query_lanes;              // PrepareQueryLanesKernel's output (avx512_fma only)
  int lane_floats;                       // its floats per (batch entry, KV head)
  bool all_heads;                        // host_takes_all_heads: one work item per run, else one per (run, KV head)
  int work_items;

  int items_per_run() const { return all_heads ? 1 : data.geometry.kv_heads; }

  /// Segment `s` for one KV head.
  HostSegment<Scalar> input(int s, int kv_head) const {
    const BlockSegment segment = data.segments(s);
    return HostSegment<Scalar>{&data.pool(segment.slot, 0), data.geometry,      data.order,
                               kv_head,                     segment.token_begin, segment.token_count,
                               &data.queries(segment.batch_index, kv_head * data.group, 0), data.group,
                               data.scale};
  }

  void operator()(int work) const {
    const int run = work / items_per_run();
    const int first = run_begins(run), last = run_begins(run + 1);
    const int kv_head = all_heads ? 0 : work % items_per_run();
    const int heads = all_heads ? data.geometry.kv_heads : 1;
    std::vector<HostSegment<Scalar>> segments;
    segments.reserve(last - first);
    for (int s = first; s < last; ++s) segments.push_back(input(s, kv_head));
    const int batch_index = data.segments(first).batch_index;
    std::vector<const std::uint32_t*> pairs;
    std::vector<const float*> lanes;
    for (int h = kv_head; h < kv_head + heads; ++h) {
      if (query_pairs) pairs.push_back(query_pairs + data.query_pairs_offset(batch_index, h));
      if (query_lanes) lanes.push_back(query_lanes + data.query_lanes_offset(batch_index, h, lane_floats));
    }
    // Each thread runs consecutive work items (but for stolen ones): the next
    // one's first segment is what this thread reads after the run.
    const int next = std::min(work + 1, work_items - 1);
    const HostSegment<Scalar> following = input(run_begins(next / items_per_run()), next % items_per_run());
    const int q0 = kv_head * data.group;
    host_run_attention(segments.data(), last - first, heads, &data.segment_o(run, q0, 0), &data.segment_lse(run, q0),
                       path, query_pairs ? pairs.data() : nullptr, work + 1 < work_items ? &following : nullptr,
                       query_lanes ? lanes.data() : nullptr, next_pass, requested_pass);
  }
};

/// Team scratch of DecodeSegmentsTeamKernel, in floats: scores (group,
/// block_tokens), maxima and sums (group each), then the slices' partial
/// outputs (token_splits, group, value_dim) when token_splits > 1.
KOKKOS_INLINE_FUNCTION std::size_t decode_team_scratch_floats(int group, int block_tokens, int value_dim,
                                                              int token_splits) {
  const std::size_t g = static_cast<std::size_t>(group);
  return g * (static_cast<std::size_t>(block_tokens) + 2) +
         (token_splits > 1 ? static_cast<std::size_t>(token_splits) * g * static_cast<std::size_t>(value_dim) : 0);
}

/// Portable work item (segment, KV head) as one team, shaped for GPUs
/// (flash-decoding): every lane of the team takes one token and computes its
/// scores for all the group's query heads at once (no reduction per score;
/// keys in 16-byte loads, many in flight); one team thread per query head
/// takes the softmax with vector-lane reductions; then lanes take (query head,
/// 8 value dims) items over `token_splits` slices of the tokens, so that a
/// warp reads whole value rows and every lane has work, and the slices are
/// summed in team scratch.
template <class ExecSpace, class Scalar, class PoolSpace>
struct DecodeSegmentsTeamKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Scratch = Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

  DecodeSegmentsData<ExecSpace, Scalar, PoolSpace> data;
  int token_splits;  // slices of the tokens in the P·V phase (1: no scratch for partial sums)
  bool eight_wide;   // key and value rows are 16-byte aligned runs of multiples of 8 elements

  /// Its team scratch in floats (decode_team_scratch_floats).
  KOKKOS_INLINE_FUNCTION std::size_t scratch_floats() const {
    return decode_team_scratch_floats(data.group, data.geometry.block_tokens, data.geometry.value_dim, token_splits);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto& geometry = data.geometry;
    const BlockOrder order = data.order;
    const int group = data.group;
    const int kv_head = team.league_rank() % geometry.kv_heads;
    const int s = team.league_rank() / geometry.kv_heads;
    const BlockSegment segment = data.segments(s);
    const int n = segment.token_count;
    const int block_tokens = geometry.block_tokens;
    const Scalar* block = &data.pool(segment.slot, 0);
    const int q0 = kv_head * group;
    const float* query = &data.queries(segment.batch_index, q0, 0);  // (group, key_dim), rows contiguous
    Scratch scratch(team.team_scratch(0), scratch_floats());
    float* scores = scratch.data();
    float* maxima = scores + group * block_tokens;
    float* sums = maxima + group;
    float* partial = sums + group;

    // Scores: one token per lane, all query heads of the group; four 16-byte
    // key loads in flight per lane.
    auto add_products = [&](const float* key_chunk, const float* query_row, float& dot) {
      float x[8];
      load_eight(query_row, x);
      for (int j = 0; j < 8; ++j) dot += x[j] * key_chunk[j];
    };
    if (eight_wide) {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, n), [&](int i) {
        const Scalar* key = block + geometry.key_offset(order, segment.token_begin + i, kv_head, 0);
        float dot[max_group];
        for (int q = 0; q < max_group; ++q) dot[q] = 0;
        int d = 0;
        for (; d + 32 <= geometry.key_dim; d += 32) {
          float k[4][8];
          for (int u = 0; u < 4; ++u) load_eight(key + d + 8 * u, k[u]);
          for (int q = 0; q < max_group; ++q) {
            if (q >= group) break;
            for (int u = 0; u < 4; ++u) add_products(k[u], query + q * geometry.key_dim + d + 8 * u, dot[q]);
          }
        }
        for (; d < geometry.key_dim; d += 8) {
          float k[8];
          load_eight(key + d, k);
          for (int q = 0; q < max_group; ++q) {
            if (q >= group) break;
            add_products(k, query + q * geometry.key_dim + d, dot[q]);
          }
        }
        for (int q = 0; q < max_group; ++q) {
          if (q >= group) break;
          scores[q * block_tokens + i] = dot[q] * data.scale;
        }
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, n), [&](int i) {
        const int token = segment.token_begin + i;
        float dot[max_group];
        for (int q = 0; q < max_group; ++q) dot[q] = 0;
        for (int d = 0; d < geometry.key_dim; ++d) {
          const float k = to_float(block[geometry.key_offset(order, token, kv_head, d)]);
          for (int q = 0; q < max_group; ++q) {
            if (q >= group) break;
            dot[q] += query[q * geometry.key_dim + d] * k;
          }
        }
        for (int q = 0; q < max_group; ++q) {
          if (q >= group) break;
          scores[q * block_tokens + i] = dot[q] * data.scale;
        }
      });
    }
    team.team_barrier();

    // Softmax per query head: scores become exp(score - max), with their sum.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, group), [&](int q) {
      float* row = scores + q * block_tokens;
      float m = math::negative_infinity();
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, n), [&](int i, float& best) { best = row[i] > best ? row[i] : best; },
          Kokkos::Max<float>(m));
      float sum = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, n),
          [&](int i, float& acc) {
            const float p = math::exp(row[i] - m);
            row[i] = p;
            acc += p;
          },
          sum);
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        maxima[q] = m;
        sums[q] = sum;
      });
    });
    team.team_barrier();

    // P·V: items (query head, `width` value dims), each over one slice of the
    // tokens; four value rows in flight per lane on the 16-byte path.
    const int width = eight_wide ? 8 : 1;
    const int chunks = geometry.value_dim / width;
    const int items = group * chunks;
    const std::int64_t value_stride = geometry.value_token_stride(order);
    auto finish_item = [&](int split, int q, int d0, const float* acc) {
      for (int j = 0; j < width; ++j) {
        if (token_splits == 1)
          data.segment_o(s, q0 + q, d0 + j) = acc[j] / sums[q];
        else
          partial[(split * group + q) * geometry.value_dim + d0 + j] = acc[j];
      }
    };
    if (eight_wide) {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, items * token_splits), [&](int work) {
        const int split = work / items, item = work % items;
        const int q = item / chunks, d0 = (item % chunks) * 8;
        const int first = n * split / token_splits, last = n * (split + 1) / token_splits;
        const float* p = scores + q * block_tokens;
        const Scalar* value = block + geometry.value_offset(order, segment.token_begin + first, kv_head, d0);
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = first;
        for (; i + 4 <= last; i += 4, value += 4 * value_stride) {
          float v[4][8];
          for (int u = 0; u < 4; ++u) load_eight(value + u * value_stride, v[u]);
          for (int u = 0; u < 4; ++u)
            for (int j = 0; j < 8; ++j) acc[j] += p[i + u] * v[u][j];
        }
        for (; i < last; ++i, value += value_stride) {
          float v[8];
          load_eight(value, v);
          for (int j = 0; j < 8; ++j) acc[j] += p[i] * v[j];
        }
        finish_item(split, q, d0, acc);
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, items * token_splits), [&](int work) {
        const int split = work / items, item = work % items;
        const int q = item / chunks, d = item % chunks;
        const int first = n * split / token_splits, last = n * (split + 1) / token_splits;
        float acc[1] = {0};
        for (int i = first; i < last; ++i)
          acc[0] += scores[q * block_tokens + i] *
                    to_float(block[geometry.value_offset(order, segment.token_begin + i, kv_head, d)]);
        finish_item(split, q, d, acc);
      });
    }
    if (token_splits > 1) {
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group * geometry.value_dim), [&](int e) {
        const int q = e / geometry.value_dim, d = e % geometry.value_dim;
        float total = 0;
        for (int split = 0; split < token_splits; ++split) total += partial[(split * group + q) * geometry.value_dim + d];
        data.segment_o(s, q0 + q, d) = total / sums[q];
      });
    }
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, group),
                         [&](int q) { data.segment_lse(s, q0 + q) = maxima[q] + math::log(sums[q]); });
  }
};

/// Merges the segments of each (batch entry, query head) by log-sum-exp. Host
/// spaces take one (b, q) per index of a 2-D range, a tile each
/// (rows_by_columns_policy; rows vectorise over the value dims); other spaces
/// (and the portable product) one team per (b, q) with vector lanes over them.
template <class ExecSpace>
struct MergeSegmentsKernel {
  using MemSpace = typename ExecSpace::memory_space;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::View<const int*, MemSpace> batch_offsets;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> segment_o;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> segment_lse;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;

  /// The largest lse of (b, q)'s segments and the sum of exp(lse - largest).
  KOKKOS_INLINE_FUNCTION void totals(int first, int last, int q, float& m, float& total) const {
    m = math::negative_infinity();
    for (int s = first; s < last; ++s) m = segment_lse(s, q) > m ? segment_lse(s, q) : m;
    total = 0;
    if (m == math::negative_infinity()) return;
    for (int s = first; s < last; ++s) total += math::exp(segment_lse(s, q) - m);
  }

  KOKKOS_INLINE_FUNCTION void operator()(int b, int q) const {
    const int first = batch_offsets(b), last = batch_offsets(b + 1);
    float m, total;
    totals(first, last, q, m, total);
    const int value_dim = static_cast<int>(o.extent(2));
    // One exponential per segment: weights outside, dimensions inside, on
    // contiguous rows (LayoutRight) so that host compilers vectorise them.
    float* out = &o(b, q, 0);
    for (int d = 0; d < value_dim; ++d) out[d] = 0;
    if (m == math::negative_infinity()) {
      lse(b, q) = m;
      return;
    }
    for (int s = first; s < last; ++s) {
      const float weight = math::exp(segment_lse(s, q) - m) / total;
      const float* part = &segment_o(s, q, 0);
      for (int d = 0; d < value_dim; ++d) out[d] += weight * part[d];
    }
    lse(b, q) = m + math::log(total);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int q_heads = static_cast<int>(o.extent(1));
    const int b = team.league_rank() / q_heads, q = team.league_rank() % q_heads;
    const int first = batch_offsets(b), last = batch_offsets(b + 1);
    float m, total;
    totals(first, last, q, m, total);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, static_cast<int>(o.extent(2))), [&](int d) {
      float acc = 0;
      if (m != math::negative_infinity())
        for (int s = first; s < last; ++s) acc += math::exp(segment_lse(s, q) - m) / total * segment_o(s, q, d);
      o(b, q, d) = acc;
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { lse(b, q) = m == math::negative_infinity() ? m : m + math::log(total); });
  }
};

template <class View, std::size_t... I>
View allocate_with_extents(const char* label, const std::size_t* extents, std::index_sequence<I...>) {
  return View(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), extents[I]...);
}

/// Gives `view` at least `extents[0]` rows, at least doubling when too few (a
/// sequence that gains a segment per step reallocates a few times per run, not
/// every step), and exactly the other extents: the host products address a
/// row's entries by pointer at the stride of the shape they are called for.
template <class View, class... Extents>
void grow(View& view, const char* label, Extents... extents) {
  constexpr std::size_t rank = sizeof...(Extents);
  const std::size_t wanted[rank] = {static_cast<std::size_t>(extents)...};
  bool fits = view.data() != nullptr && view.extent(0) >= wanted[0];
  for (std::size_t r = 1; r < rank; ++r) fits = fits && view.extent(r) == wanted[r];
  if (fits) return;
  std::size_t grown[rank];
  grown[0] = view.extent(0) >= wanted[0] ? view.extent(0) : std::max(wanted[0], 2 * view.extent(0));
  for (std::size_t r = 1; r < rank; ++r) grown[r] = wanted[r];
  view = allocate_with_extents<View>(label, grown, std::make_index_sequence<rank>{});
}

}  // namespace impl

inline GpuDecodeTeam gpu_decode_team(const AttentionShape& shape, int block_tokens, int most_warps) {
  GpuDecodeTeam team;
  const int items = std::max(1, shape.group() * shape.value_dim / 8);
  team.team_size = std::max(
      1, std::min({max_gpu_decode_warps, most_warps, std::max((block_tokens + 31) / 32, (4 * items + 31) / 32)}));
  team.vector_length = 32;
  team.token_splits = std::max(1, std::min(8, team.team_size * team.vector_length / items));
  team.scratch_bytes =
      sizeof(float) * impl::decode_team_scratch_floats(shape.group(), block_tokens, shape.value_dim, team.token_splits);
  return team;
}

inline std::string gpu_decode_block_tokens_error(const AttentionShape& shape, int block_tokens) {
  const GpuDecodeTeam team = gpu_decode_team(shape, block_tokens);
  const std::size_t shared = gpu_team_shared_bytes(team);
  if (shared <= gpu_block_shared_memory) return "";
  int largest = block_tokens;
  while (largest > 1 && gpu_team_shared_bytes(gpu_decode_team(shape, largest)) > gpu_block_shared_memory) --largest;
  return std::to_string(block_tokens) + " tokens per block need " + std::to_string(shared) +
         " bytes of GPU shared memory a team (" + std::to_string(team.scratch_bytes) + " of scratch) for " + shape.name +
         "'s attention (" + std::to_string(shape.group()) + " query heads per KV head), over the " +
         std::to_string(gpu_block_shared_memory) + " bytes a block gets; at most " + std::to_string(largest) + " fit";
}

template <class ExecSpace, class Scalar, class PoolSpace>
void decode_attention(const ExecSpace& space, const AttentionShape& shape, const BlockGeometry& geometry,
                      BlockOrder order,
                      const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                      const Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace>& pool,
                      const std::vector<BlockSegment>& segments,
                      DecodeWorkspace<typename ExecSpace::memory_space>& workspace,
                      const PartialState<typename ExecSpace::memory_space>& out, BlockProduct product) {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible,
                "decode_attention: the execution space cannot read the pool's memory space");
  shape.validate();
  const int batch = static_cast<int>(queries.extent(0));
  if (shape.kv_heads != geometry.kv_heads || shape.key_dim != geometry.key_dim ||
      shape.value_dim != geometry.value_dim || shape.values_in_keys != geometry.values_in_keys)
    throw std::invalid_argument("decode_attention: attention shape and block geometry disagree");
  if (shape.group() > impl::max_group)
    throw std::invalid_argument("decode_attention: at most " + std::to_string(impl::max_group) +
                                " query heads per KV head are supported, got " + std::to_string(shape.group()));
  if (queries.extent(1) != static_cast<std::size_t>(shape.q_heads) ||
      queries.extent(2) != static_cast<std::size_t>(shape.key_dim) || out.batch() != batch ||
      out.q_heads() != shape.q_heads || out.value_dim() != shape.value_dim)
    throw std::invalid_argument("decode_attention: queries must be (batch, q_heads, key_dim) and out (batch, q_heads, value_dim)");

  // Segment list checked; the host products' split when they are few.
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const BlockSegment& seg = segments[s];
    if (seg.batch_index < 0 || seg.batch_index >= batch || (s > 0 && seg.batch_index < segments[s - 1].batch_index))
      throw std::invalid_argument("decode_attention: segments must be sorted by a batch_index in [0, batch)");
    if (seg.slot < 0 || seg.slot >= static_cast<int>(pool.extent(0)) || seg.token_begin < 0 || seg.token_count < 1 ||
        seg.token_begin + seg.token_count > geometry.block_tokens)
      throw std::invalid_argument("decode_attention: segment " + std::to_string(s) + " lies outside the pool");
  }
  const bool host_products = is_host_exec_space<ExecSpace> && product == BlockProduct::automatic;
  bool merge_here = false;  // set by the host products where their runs are few
  const bool all_heads = impl::host_takes_all_heads(geometry, order);
  const int items_per_run = all_heads ? 1 : geometry.kv_heads;
  const std::optional<std::vector<BlockSegment>> pieces =
      host_products ? impl::host_split_segments(segments, items_per_run, space.concurrency()) : std::nullopt;
  const std::vector<BlockSegment>& work_segments = pieces ? *pieces : segments;
  // Per-batch offsets; both copied to the device.
  std::vector<int> offsets(static_cast<std::size_t>(batch) + 1, 0);
  for (const BlockSegment& seg : work_segments) offsets[seg.batch_index + 1] += 1;
  for (int b = 0; b < batch; ++b) offsets[b + 1] += offsets[b];
  const int count = static_cast<int>(work_segments.size());
  impl::grow(workspace.segments, "writescope::attention::segments", std::max(count, 1));
  impl::grow(workspace.batch_offsets, "writescope::attention::batch_offsets", batch + 1);
  impl::grow(workspace.segment_o, "writescope::attention::segment_o", std::max(count, 1), shape.q_heads,
             shape.value_dim);
  impl::grow(workspace.segment_lse, "writescope::attention::segment_lse", std::max(count, 1), shape.q_heads);
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  Kokkos::deep_copy(space, Kokkos::subview(workspace.segments, std::make_pair(0, count)),
                    Kokkos::View<const BlockSegment*, Kokkos::HostSpace, Unmanaged>(work_segments.data(), count));
  Kokkos::deep_copy(space, Kokkos::subview(workspace.batch_offsets, std::make_pair(0, batch + 1)),
                    Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(offsets.data(), batch + 1));

  const int work_items = count * geometry.kv_heads;
  const impl::DecodeSegmentsData<ExecSpace, Scalar, PoolSpace> data{
      queries,  pool,  workspace.segments, workspace.segment_o, workspace.segment_lse,
      geometry, order, shape.group(),      shape.scale()};
  auto launch_team_kernel = [&] {
    constexpr bool host = is_host_exec_space<ExecSpace>;
    // Host spaces run teams of one lane (more threads where a test asks);
    // their 2 slices keep the sliced P·V path under test.
    const GpuDecodeTeam gpu = gpu_decode_team(shape, geometry.block_tokens, workspace.gpu_most_warps);
    const int team_size = host ? std::clamp(workspace.host_team_threads, 1, space.concurrency()) : gpu.team_size;
    const int vector_length = host ? 1 : gpu.vector_length;
    const int token_splits = host ? 2 : gpu.token_splits;
    const bool eight_wide = !geometry.tiled_keys(order) && geometry.key_dim % 8 == 0 &&
                            geometry.value_dim % 8 == 0 && geometry.block_elements() % 8 == 0 &&
                            reinterpret_cast<std::uintptr_t>(pool.data()) % 16 == 0 &&
                            reinterpret_cast<std::uintptr_t>(queries.data()) % 16 == 0;
    const impl::DecodeSegmentsTeamKernel<ExecSpace, Scalar, PoolSpace> kernel{data, token_splits, eight_wide};
    Kokkos::TeamPolicy<ExecSpace> policy(space, work_items, team_size, vector_length);
    policy.set_scratch_size(0, Kokkos::PerTeam(kernel.scratch_floats() * sizeof(float)));
    launch_parallel_for("writescope::attention::decode_segments", policy, kernel);
  };
  if (work_items > 0) {
    if constexpr (is_host_exec_space<ExecSpace>) {
      if (host_products) {
        // Over bf16 KV, the path measured for the shape (host_prefetch.hpp);
        // other KV takes the plainer paths, whose choice is the machine's.
        constexpr bool bf16_kv = std::is_same_v<Scalar, bf16>;
        const CpuPath path = impl::host_product_path(bf16_kv ? active_decode_cpu_path(shape, order) : active_cpu_path(),
                                                     geometry, order, shape.group(), bf16_kv);
        // Asked only where the products honour it: the first such launch of a
        // process measures the levels (host_prefetch.hpp).
        const PrefetchLevel next_pass = impl::honours_next_pass_level(path, geometry.tiled_keys(order), shape.group())
                                            ? active_next_pass_prefetch(shape)
                                            : PrefetchLevel::l1;
        // Likewise the tokens per pass, by the blocks' order.
        const bool tiled = geometry.tiled_keys(order);
        const int requested_pass =
            tiled ? (impl::honours_next_pass_level(path, true, shape.group()) ? active_head_major_pass(shape) : 0)
                  : (impl::honours_token_major_pass(path, shape) ? active_token_major_pass(shape) : 0);
        workspace.host_path = path;
        workspace.host_next_pass = next_pass;
        workspace.host_pass = requested_pass;
        // The AVX-512 paths' queries in the order their products read them,
        // once per (batch entry, KV head).
        const std::uint32_t* query_pairs = nullptr;
        const float* query_lanes = nullptr;
        int lane_floats = 0;
        const int items = batch * geometry.kv_heads;
        // A step's few queries are prepared on this thread: a launch (a fork
        // and join) cost 5-9 us a step against 0.4-2 us of work for one
        // sequence (Zen 5, 2 threads).
        const bool prepare_here = std::int64_t{batch} * shape.q_heads * shape.key_dim <= impl::queries_prepared_here;
        auto prepare = [&](const char* label, const auto& kernel) {
          if (prepare_here)
            for (int item = 0; item < items; ++item) kernel(item);
          else launch_parallel_for(label, Kokkos::RangePolicy<ExecSpace>(space, 0, items), kernel);
        };
        if (path == CpuPath::avx512_bf16 || path == CpuPath::amx_bf16) {
          impl::grow(workspace.query_pairs, "writescope::attention::query_pairs",
                     static_cast<std::size_t>(items) * shape.q_heads / geometry.kv_heads * shape.key_dim / 2);
          prepare("writescope::attention::prepare_query_pairs",
                  impl::PrepareQueryPairsKernel<ExecSpace, Scalar, PoolSpace>{data, workspace.query_pairs, path});
          query_pairs = workspace.query_pairs.data();
        }
#ifdef WRITESCOPE_HOST_AVX512_BF16
        if (path == CpuPath::avx512_fma) {
          lane_floats = impl::query_lane_floats(shape.group(), shape.key_dim);
          impl::grow(workspace.query_lanes, "writescope::attention::query_lanes",
                     static_cast<std::size_t>(items) * lane_floats);
          prepare(
              "writescope::attention::prepare_query_lanes",
              impl::PrepareQueryLanesKernel<ExecSpace, Scalar, PoolSpace>{data, workspace.query_lanes, lane_floats});
          query_lanes = workspace.query_lanes.data();
        }
#endif
        using HostKernel = impl::DecodeSegmentsHostKernel<ExecSpace, Scalar, PoolSpace>;
        std::vector<int> run_offsets;
        double kv_bytes = 0;
        for (const BlockSegment& seg : work_segments) kv_bytes += seg.token_count;
        kv_bytes *= static_cast<double>(geometry.block_elements()) / geometry.block_tokens * sizeof(Scalar);
        const double output_bytes =
            (all_heads ? shape.q_heads : shape.group()) * (shape.value_dim + 1.0) * sizeof(float);
        const std::vector<int> run_begins = impl::host_segment_runs(
            offsets, items_per_run, space.concurrency(),
            impl::host_items_per_thread(kv_bytes, output_bytes, space.concurrency()), run_offsets);
        const int runs = static_cast<int>(run_begins.size()) - 1;
        merge_here = std::int64_t{runs} * shape.q_heads * shape.value_dim <= impl::runs_merged_here;
        impl::grow(workspace.run_begins, "writescope::attention::run_begins", runs + 1);
        Kokkos::deep_copy(space, Kokkos::subview(workspace.run_begins, std::make_pair(0, runs + 1)),
                          Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(run_begins.data(), runs + 1));
        // The merge below reads each batch entry's runs instead of its segments.
        Kokkos::deep_copy(space, Kokkos::subview(workspace.batch_offsets, std::make_pair(0, batch + 1)),
                          Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(run_offsets.data(), batch + 1));
        launch_parallel_for("writescope::attention::decode_segments_host", work_stealing_range(space, runs * items_per_run),
                             HostKernel{data, workspace.run_begins, path, next_pass, requested_pass, query_pairs, query_lanes,
                                        lane_floats, all_heads, runs * items_per_run});
      } else {
        launch_team_kernel();
      }
    } else {
      launch_team_kernel();
    }
  }
  const impl::MergeSegmentsKernel<ExecSpace> merge{workspace.batch_offsets, workspace.segment_o, workspace.segment_lse,
                                                   out.o, out.lse};
  // The portable product merges with the GPU's team kernel too, so host tests cover it.
  if (merge_here) {
    space.fence();
    for (int b = 0; b < batch; ++b)
      for (int q = 0; q < shape.q_heads; ++q) merge(b, q);
  } else if (host_products)
    launch_parallel_for("writescope::attention::merge_segments",
                         rows_by_columns_policy(space, batch, shape.q_heads, 1), merge);
  else
    launch_parallel_for("writescope::attention::merge_segments",
                         Kokkos::TeamPolicy<ExecSpace>(space, batch * shape.q_heads, 1, 32), merge);
}

}  // namespace writescope
