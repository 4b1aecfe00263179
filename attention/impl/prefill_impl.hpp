#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/impl/decode_impl.hpp"
#include "attention/impl/host_tile_product.hpp"
#include "framework/host_gemm.hpp"
#include "framework/launch.hpp"
#include "framework/math.hpp"
#include "framework/spaces.hpp"

namespace writescope {

inline PrefillTiling prefill_tiling(const AttentionShape& shape, bool host) {
  // Host: the query tile (rows x group queries) sized so that its staged
  // queries and accumulators, (key_dim + value_dim) floats per query, take
  // about 256 KiB: a tile and one staged key tile stay in a core's L2 while
  // the key tiles stream by. At most 128 queries: more buys no reuse of a key
  // tile that already sits in L1. GPU: the same rows, key tiles of up to 32
  // tokens, as many as let the team's scores and staged keys and values stay
  // under 44 KiB of team scratch (48 KiB without opting in to more).
  const int per_query = 4 * (shape.key_dim + shape.value_dim);
  const int queries = std::max(shape.group(), std::min(128, (256 * 1024) / per_query));
  PrefillTiling tiling;
  tiling.rows = std::max(1, queries / shape.group());
  tiling.keys = host ? 64 : 32;
  auto team_bytes = [&](int keys) {
    return sizeof(float) * (static_cast<std::size_t>(tiling.rows) * shape.group() * (keys + 3) +
                            static_cast<std::size_t>(keys) * (shape.key_dim + shape.value_dim));
  };
  while (!host && tiling.keys > 1 && team_bytes(tiling.keys) > 44 * 1024) tiling.keys /= 2;
  return tiling;
}

inline double prefill_macs_per_query_key(const AttentionShape& shape) {
  return static_cast<double>(shape.q_heads) * (shape.key_dim + shape.value_dim);
}

namespace impl {

KOKKOS_INLINE_FUNCTION int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

/// Keys of a chunk's own token rows: one span, [key_begin, min(key_end, the
/// tile's last position + 1)), causally masked per row.
template <class Scalar, class MemSpace>
struct ChunkKeySource {
  TokenMajorView<Scalar, MemSpace> keys, values;  // values == keys when values_in_keys
  std::int64_t first_position, key_begin, key_end;

  KOKKOS_INLINE_FUNCTION int spans() const { return 1; }
  /// Tokens of the span that rows [row_begin, row_end) may see.
  KOKKOS_INLINE_FUNCTION int span_tokens(int, int row_end) const {
    const std::int64_t end = key_end < first_position + row_end ? key_end : first_position + row_end;
    return end > key_begin ? static_cast<int>(end - key_begin) : 0;
  }
  /// Of the span's tokens [first, first + count), how many row `row` sees.
  KOKKOS_INLINE_FUNCTION int visible(int, int first, int count, int row) const {
    const std::int64_t end = key_end < first_position + row + 1 ? key_end : first_position + row + 1;
    const std::int64_t seen = end - (key_begin + first);
    return seen <= 0 ? 0 : (seen < count ? static_cast<int>(seen) : count);
  }
  KOKKOS_INLINE_FUNCTION float key(int, int token, int head, int d) const {
    return to_float(keys(key_begin + token, head, d));
  }
  KOKKOS_INLINE_FUNCTION float value(int, int token, int head, int d) const {
    return to_float(values(key_begin + token, head, d));
  }
  // Host staging: token rows are contiguous over dims.
  const Scalar* key_row(int, int token, int head) const { return &keys(key_begin + token, head, 0); }
  const Scalar* value_row(int, int token, int head) const { return &values(key_begin + token, head, 0); }
  bool tiled_keys() const { return false; }
  int key_tile_tokens() const { return 1; }
  int token_begin(int) const { return 0; }
};

/// Keys of InplaceKVCache blocks: one span per segment, every token visible.
template <class Scalar, class PoolSpace, class MemSpace>
struct SegmentKeySource {
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace> pool;
  Kokkos::View<const BlockSegment*, MemSpace> segments;
  BlockGeometry geometry;
  BlockOrder order;

  KOKKOS_INLINE_FUNCTION int spans() const { return static_cast<int>(segments.extent(0)); }
  KOKKOS_INLINE_FUNCTION int span_tokens(int span, int) const { return segments(span).token_count; }
  KOKKOS_INLINE_FUNCTION int visible(int, int, int count, int) const { return count; }
  KOKKOS_INLINE_FUNCTION float key(int span, int token, int head, int d) const {
    const BlockSegment& s = segments(span);
    return to_float(pool(s.slot, geometry.key_offset(order, s.token_begin + token, head, d)));
  }
  KOKKOS_INLINE_FUNCTION float value(int span, int token, int head, int d) const {
    const BlockSegment& s = segments(span);
    return to_float(pool(s.slot, geometry.value_offset(order, s.token_begin + token, head, d)));
  }
  const Scalar* key_row(int span, int token, int head) const {
    const BlockSegment& s = segments(span);
    return &pool(s.slot, geometry.key_offset(order, s.token_begin + token, head, 0));
  }
  const Scalar* value_row(int span, int token, int head) const {
    const BlockSegment& s = segments(span);
    return &pool(s.slot, geometry.value_offset(order, s.token_begin + token, head, 0));
  }
  /// Head-major blocks keep keys in (dim, 16 tokens) tiles: staged as K^T.
  bool tiled_keys() const { return geometry.tiled_keys(order); }
  int key_tile_tokens() const { return geometry.key_tile_tokens(); }
  int token_begin(int span) const { return segments(span).token_begin; }
};

/// What both prefill kernels share: work item = (query tile, KV head).
template <class ExecSpace, class Source>
struct PrefillData {
  using MemSpace = typename ExecSpace::memory_space;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> queries;  // (rows, q_heads, key_dim)
  Source source;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> o;  // (rows, q_heads, value_dim)
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> lse;  // (rows, q_heads)
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> items;  // (work items, floats per item)
  int kv_heads, group, key_dim, value_dim;
  float scale;
  PrefillTiling tiling;

  KOKKOS_INLINE_FUNCTION int rows() const { return static_cast<int>(queries.extent(0)); }
  KOKKOS_INLINE_FUNCTION int row_begin(int item) const { return (item / kv_heads) * tiling.rows; }
  KOKKOS_INLINE_FUNCTION int row_end(int item) const {
    const int end = row_begin(item) + tiling.rows;
    return end < rows() ? end : rows();
  }
};

/// Floats of PrefillHostKernel's staged tiles per work item.
struct HostPrefillLayout {
  int queries_padded, keys_padded, values_padded;  // query tile, key tile, value dims, each rounded up
  std::size_t q, k, v, s, o, stats, total;         // offsets

  HostPrefillLayout(const PrefillTiling& tiling, int group, int key_dim, int value_dim) {
    queries_padded = round_up(tiling.rows * group, 16);
    keys_padded = round_up(tiling.keys, 16);
    values_padded = round_up(value_dim, 16);
    q = 0;                                                      // Q (queries, key_dim) or Q^T (key_dim, queries)
    k = q + std::size_t(queries_padded) * key_dim;              // K (keys, key_dim) or K^T (key_dim, keys)
    v = k + std::size_t(keys_padded) * key_dim;                 // V (keys, values_padded)
    s = v + std::size_t(keys_padded) * values_padded;           // S / P, either orientation
    o = s + std::size_t(queries_padded) * keys_padded;          // O (queries, values_padded)
    stats = o + std::size_t(queries_padded) * values_padded;    // running max and sum per query
    total = stats + 2 * std::size_t(queries_padded);
  }
};

/// Host work item: stages the query tile once and each key tile in fp32, in
/// the orientation the keys are stored in (token rows: S^T = K Q^T; head-major
/// tiles: S = Q K^T), and runs both products through host_gemm.
template <class ExecSpace, class Source>
struct PrefillHostKernel {
  PrefillData<ExecSpace, Source> data;
  HostPrefillLayout layout;
  CpuPath path;

  void operator()(int item) const {
    const auto& d = data;
    const int kv_head = item % d.kv_heads;
    const int r0 = d.row_begin(item), r1 = d.row_end(item);
    const int m = (r1 - r0) * d.group;
    const int mp = layout.queries_padded, tp = layout.keys_padded, dvp = layout.values_padded;
    const int dk = d.key_dim, dv = d.value_dim;
    float* base = &d.items(item, 0);
    float* q = base + layout.q;
    float* k = base + layout.k;
    float* v = base + layout.v;
    float* s = base + layout.s;
    float* o = base + layout.o;
    float* maxima = base + layout.stats;
    float* sums = maxima + mp;
    const bool transposed = d.source.tiled_keys();  // S = Q K^T (else S^T = K Q^T)
    std::vector<int> seen(static_cast<std::size_t>(mp));
    // Query x = (row - r0) * group + g, scaled; padding rows are zero.
    for (int x = 0; x < mp; ++x)
      for (int c = 0; c < dk; ++c) {
        const float value =
            x < m ? d.queries(r0 + x / d.group, kv_head * d.group + x % d.group, c) * d.scale : 0.0f;
        (transposed ? q[std::size_t(x) * dk + c] : q[std::size_t(c) * mp + x]) = value;
      }
    std::fill(o, o + std::size_t(mp) * dvp, 0.0f);
    for (int x = 0; x < mp; ++x) {
      maxima[x] = math::negative_infinity();
      sums[x] = 0;
    }
    // Scores of query x, key j: S (mp, tp) or S^T (tp, mp).
    const std::int64_t s_query = transposed ? tp : 1, s_key = transposed ? 1 : mp;
    for (int span = 0; span < d.source.spans(); ++span) {
      const int tokens = d.source.span_tokens(span, r1);
      for (int first = 0; first < tokens; first += tp) {
        const int n = std::min(tp, tokens - first);
        stage_keys(span, first, n, kv_head, k, v);
        std::fill(s, s + std::size_t(mp) * tp, 0.0f);
        if (transposed)
          host_gemm(path, mp, tp, dk, q, dk, 1, k, tp, s, tp);
        else
          host_gemm(path, tp, mp, dk, k, dk, 1, q, mp, s, mp);
        // Online softmax per query; keys it does not see (and padding) get p = 0.
        for (int x = 0; x < mp; ++x) seen[x] = x < m ? d.source.visible(span, first, n, r0 + x / d.group) : 0;
        host_tile_softmax(path, s, s_query, s_key, mp, tp, seen.data(), maxima, sums, o, dvp, dv);
        host_gemm(path, mp, dvp, tp, s, s_query, s_key, v, dvp, o, dvp);
      }
    }
    for (int x = 0; x < m; ++x) {
      const int row = r0 + x / d.group, head = kv_head * d.group + x % d.group;
      const float inverse = sums[x] > 0 ? 1.0f / sums[x] : 0.0f;
      for (int c = 0; c < dv; ++c) d.o(row, head, c) = o[std::size_t(x) * dvp + c] * inverse;
      d.lse(row, head) = sums[x] > 0 ? maxima[x] + math::log(sums[x]) : math::negative_infinity();
    }
  }

  /// Keys [first, first + n) of the span in fp32: K^T (key_dim, tp) for tiled
  /// keys, else K (tp, key_dim); V (tp, values_padded). Padding is zero.
  void stage_keys(int span, int first, int n, int kv_head, float* k, float* v) const {
    const int tp = layout.keys_padded, dk = data.key_dim;
    const auto& source = data.source;
    if (source.tiled_keys()) {
      // Runs of tokens inside one (dim, tile) key tile are contiguous per dim.
      const int tile = source.key_tile_tokens();
      for (int j = 0; j < n;) {
        const int run = std::min(n - j, tile - (source.token_begin(span) + first + j) % tile);
        const auto* keys = source.key_row(span, first + j, kv_head);
        for (int c = 0; c < dk; ++c)
          for (int t = 0; t < run; ++t) k[std::size_t(c) * tp + j + t] = to_float(keys[std::size_t(c) * tile + t]);
        j += run;
      }
      for (int c = 0; c < dk; ++c) std::fill(k + std::size_t(c) * tp + n, k + std::size_t(c) * tp + tp, 0.0f);
    } else {
      for (int j = 0; j < n; ++j) {
        const auto* keys = source.key_row(span, first + j, kv_head);
        for (int c = 0; c < dk; ++c) k[std::size_t(j) * dk + c] = to_float(keys[c]);
      }
      std::fill(k + std::size_t(n) * dk, k + std::size_t(tp) * dk, 0.0f);
    }
    stage_values(span, first, n, kv_head, v);
  }

  /// Values [first, first + n) of the span as V (tp, values_padded), padding zero.
  void stage_values(int span, int first, int n, int kv_head, float* v) const {
    const int tp = layout.keys_padded, dvp = layout.values_padded, dv = data.value_dim;
    for (int j = 0; j < n; ++j) {
      const auto* values = data.source.value_row(span, first + j, kv_head);
      float* row = v + std::size_t(j) * dvp;
      for (int c = 0; c < dv; ++c) row[c] = to_float(values[c]);
      std::fill(row + dv, row + dvp, 0.0f);
    }
    std::fill(v + std::size_t(n) * dvp, v + std::size_t(tp) * dvp, 0.0f);
  }
};

/// Portable work item as one team, shaped for GPUs: the query tile and its
/// accumulators in the work item's global buffer; each key tile's keys and
/// values staged once in team scratch (every query of the tile reads them)
/// beside its scores; lanes take (query, key) scores with a vector reduction
/// over dims, threads take a query's softmax, lanes take (query, value dim)
/// items of P·V.
template <class ExecSpace, class Source>
struct PrefillTeamKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Scratch = Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  PrefillData<ExecSpace, Source> data;

  /// Per work item in `items`: queries (rows x group, key_dim), accumulators (rows x group, value_dim).
  KOKKOS_INLINE_FUNCTION std::size_t item_floats() const {
    return std::size_t(data.tiling.rows) * data.group * (data.key_dim + data.value_dim);
  }
  /// Team scratch: scores (queries, keys), max, sum and correction per query,
  /// then the key tile's keys (keys, key_dim) and values (keys, value_dim).
  KOKKOS_INLINE_FUNCTION std::size_t scratch_floats() const {
    return std::size_t(data.tiling.rows) * data.group * (data.tiling.keys + 3) +
           std::size_t(data.tiling.keys) * (data.key_dim + data.value_dim);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto& d = data;
    const int item = team.league_rank();
    const int kv_head = item % d.kv_heads;
    const int r0 = d.row_begin(item), r1 = d.row_end(item);
    const int m = (r1 - r0) * d.group, tile = d.tiling.keys;
    float* q = &d.items(item, 0);
    float* acc = q + std::size_t(m) * d.key_dim;
    Scratch scratch(team.team_scratch(0), scratch_floats());
    float* scores = scratch.data();
    float* maxima = scores + m * tile;
    float* sums = maxima + m;
    float* corrections = sums + m;
    float* keys = scratch.data() + std::size_t(d.tiling.rows) * d.group * (tile + 3);
    float* values = keys + tile * d.key_dim;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m * d.key_dim), [&](int e) {
      const int x = e / d.key_dim, c = e % d.key_dim;
      q[e] = d.queries(r0 + x / d.group, kv_head * d.group + x % d.group, c) * d.scale;
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m * d.value_dim), [&](int e) { acc[e] = 0; });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m), [&](int x) {
      maxima[x] = math::negative_infinity();
      sums[x] = 0;
    });
    team.team_barrier();
    for (int span = 0; span < d.source.spans(); ++span) {
      const int tokens = d.source.span_tokens(span, r1);
      for (int first = 0; first < tokens; first += tile) {
        const int n = tokens - first < tile ? tokens - first : tile;
        Kokkos::parallel_for(Kokkos::TeamVectorRange(team, n * (d.key_dim + d.value_dim)), [&](int e) {
          if (e < n * d.key_dim)
            keys[e] = d.source.key(span, first + e / d.key_dim, kv_head, e % d.key_dim);
          else
            values[e - n * d.key_dim] =
                d.source.value(span, first + (e - n * d.key_dim) / d.value_dim, kv_head, (e - n * d.key_dim) % d.value_dim);
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m * n), [&](int e) {
          const int x = e / n, j = e % n;
          float dot = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, d.key_dim),
              [&](int c, float& sum) { sum += q[x * d.key_dim + c] * keys[j * d.key_dim + c]; }, dot);
          Kokkos::single(Kokkos::PerThread(team), [&]() { scores[x * tile + j] = dot; });
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](int x) {
          Kokkos::single(Kokkos::PerThread(team), [&]() {
            const int seen = d.source.visible(span, first, n, r0 + x / d.group);
            float* row = scores + x * tile;
            float best = math::negative_infinity();
            for (int j = 0; j < seen; ++j) best = row[j] > best ? row[j] : best;
            const float updated = seen > 0 && best > maxima[x] ? best : maxima[x];
            const float correction = seen > 0 ? math::exp(maxima[x] - updated) : 1.0f;
            float sum = 0;
            for (int j = 0; j < n; ++j) {
              const float p = j < seen ? math::exp(row[j] - updated) : 0.0f;
              row[j] = p;
              sum += p;
            }
            corrections[x] = correction;
            sums[x] = sums[x] * correction + sum;
            maxima[x] = updated;
          });
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m * d.value_dim), [&](int e) {
          const int x = e / d.value_dim, c = e % d.value_dim;
          float sum = acc[e] * corrections[x];
          for (int j = 0; j < n; ++j) sum += scores[x * tile + j] * values[j * d.value_dim + c];
          acc[e] = sum;
        });
        team.team_barrier();
      }
    }
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m * d.value_dim), [&](int e) {
      const int x = e / d.value_dim, c = e % d.value_dim;
      d.o(r0 + x / d.group, kv_head * d.group + x % d.group, c) = sums[x] > 0 ? acc[e] / sums[x] : 0.0f;
    });
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, m), [&](int x) {
      d.lse(r0 + x / d.group, kv_head * d.group + x % d.group) =
          sums[x] > 0 ? maxima[x] + math::log(sums[x]) : math::negative_infinity();
    });
  }
};

/// Runs the prefill work items of `source` on `space`: the host kernel on
/// host spaces (unless `product` is portable), else the team kernel.
template <class ExecSpace, class Source>
void launch_prefill(const ExecSpace& space, const AttentionShape& shape, const Source& source,
                    const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                    PrefillWorkspace<typename ExecSpace::memory_space>& workspace,
                    const PartialState<typename ExecSpace::memory_space>& out, BlockProduct product) {
  constexpr bool host = is_host_exec_space<ExecSpace>;
  const bool host_product = host && product == BlockProduct::automatic;
  const PrefillTiling tiling = prefill_tiling(shape, host_product);
  const int rows = static_cast<int>(queries.extent(0));
  const int work_items = (rows + tiling.rows - 1) / tiling.rows * shape.kv_heads;
  if (work_items == 0) return;
  PrefillData<ExecSpace, Source> data{queries,        source,        out.o,           out.lse,
                                      workspace.items, shape.kv_heads, shape.group(), shape.key_dim,
                                      shape.value_dim, shape.scale(), tiling};
  if constexpr (host) {
    if (host_product) {
      const HostPrefillLayout layout(tiling, shape.group(), shape.key_dim, shape.value_dim);
      grow(workspace.items, "writescope::attention::prefill_items", work_items, layout.total);
      data.items = workspace.items;
      // Items differ in work (a causal tile sees more keys the later it is): taken one at a time, not in
      // contiguous ranges that leave the last thread the longest.
      launch_parallel_for("writescope::attention::prefill_host", work_stealing_range(space, work_items),
                          PrefillHostKernel<ExecSpace, Source>{data, layout, host_gemm_path(active_cpu_path())});
      return;
    }
  }
  PrefillTeamKernel<ExecSpace, Source> kernel{data};
  grow(workspace.items, "writescope::attention::prefill_items", work_items, kernel.item_floats());
  kernel.data.items = workspace.items;
  Kokkos::TeamPolicy<ExecSpace> policy(space, work_items, host ? 1 : 4, host ? 1 : 32);
  policy.set_scratch_size(0, Kokkos::PerTeam(kernel.scratch_floats() * sizeof(float)));
  launch_parallel_for("writescope::attention::prefill", policy, kernel);
}

}  // namespace impl

template <class ExecSpace, class Scalar>
void prefill_attention(const ExecSpace& space, const AttentionShape& shape,
                       const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& keys,
                       const TokenMajorView<Scalar, typename ExecSpace::memory_space>& values,
                       std::int64_t first_position, std::int64_t key_begin, std::int64_t key_end,
                       PrefillWorkspace<typename ExecSpace::memory_space>& workspace,
                       const PartialState<typename ExecSpace::memory_space>& out, BlockProduct product) {
  shape.validate();
  const auto chunk = static_cast<std::int64_t>(queries.extent(0));
  if (queries.extent(1) != static_cast<std::size_t>(shape.q_heads) ||
      queries.extent(2) != static_cast<std::size_t>(shape.key_dim))
    throw std::invalid_argument("prefill_attention: queries must be (chunk_tokens, q_heads, key_dim)");
  if (keys.extent(1) != static_cast<std::size_t>(shape.kv_heads) ||
      keys.extent(2) != static_cast<std::size_t>(shape.key_dim))
    throw std::invalid_argument("prefill_attention: keys must be (tokens, kv_heads, key_dim)");
  if (!shape.values_in_keys && (values.extent(0) != keys.extent(0) ||
                                values.extent(1) != static_cast<std::size_t>(shape.kv_heads) ||
                                values.extent(2) != static_cast<std::size_t>(shape.value_dim)))
    throw std::invalid_argument("prefill_attention: values must be (tokens, kv_heads, value_dim)");
  if (first_position < 0 || key_begin < 0 || key_begin > key_end)
    throw std::invalid_argument("prefill_attention: need 0 <= key_begin <= key_end and first_position >= 0");
  const std::int64_t needed = std::min(key_end, first_position + chunk);
  if (static_cast<std::int64_t>(keys.extent(0)) < needed)
    throw std::invalid_argument("prefill_attention: keys hold " + std::to_string(keys.extent(0)) +
                                " tokens but the chunk needs " + std::to_string(needed));
  if (out.batch() != chunk || out.q_heads() != shape.q_heads || out.value_dim() != shape.value_dim)
    throw std::invalid_argument("prefill_attention: out must be (chunk_tokens, q_heads, value_dim)");
  using MemSpace = typename ExecSpace::memory_space;
  const impl::ChunkKeySource<Scalar, MemSpace> source{keys, shape.values_in_keys ? keys : values, first_position,
                                                      key_begin, key_end};
  impl::launch_prefill(space, shape, source, queries, workspace, out, product);
}

template <class ExecSpace, class Scalar, class PoolSpace>
void prefill_segments_attention(
    const ExecSpace& space, const AttentionShape& shape, const BlockGeometry& geometry, BlockOrder order,
    const Kokkos::View<const float***, Kokkos::LayoutRight, typename ExecSpace::memory_space>& queries,
    const Kokkos::View<const Scalar**, Kokkos::LayoutRight, PoolSpace>& pool, const std::vector<BlockSegment>& segments,
    PrefillWorkspace<typename ExecSpace::memory_space>& workspace,
    const PartialState<typename ExecSpace::memory_space>& out, BlockProduct product) {
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible,
                "prefill_segments_attention: the execution space cannot read the pool's memory space");
  shape.validate();
  if (shape.kv_heads != geometry.kv_heads || shape.key_dim != geometry.key_dim ||
      shape.value_dim != geometry.value_dim || shape.values_in_keys != geometry.values_in_keys)
    throw std::invalid_argument("prefill_segments_attention: attention shape and block geometry disagree");
  const int rows = static_cast<int>(queries.extent(0));
  if (queries.extent(1) != static_cast<std::size_t>(shape.q_heads) ||
      queries.extent(2) != static_cast<std::size_t>(shape.key_dim) || out.batch() != rows ||
      out.q_heads() != shape.q_heads || out.value_dim() != shape.value_dim)
    throw std::invalid_argument(
        "prefill_segments_attention: queries must be (rows, q_heads, key_dim) and out (rows, q_heads, value_dim)");
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const BlockSegment& seg = segments[s];
    if (seg.slot < 0 || seg.slot >= static_cast<int>(pool.extent(0)) || seg.token_begin < 0 || seg.token_count < 1 ||
        seg.token_begin + seg.token_count > geometry.block_tokens)
      throw std::invalid_argument("prefill_segments_attention: segment " + std::to_string(s) +
                                  " lies outside the pool");
  }
  if (segments.empty()) {
    clear(space, out);
    return;
  }
  const int count = static_cast<int>(segments.size());
  impl::grow(workspace.segments, "writescope::attention::prefill_segments", count);
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  Kokkos::deep_copy(space, Kokkos::subview(workspace.segments, std::make_pair(0, count)),
                    Kokkos::View<const BlockSegment*, Kokkos::HostSpace, Unmanaged>(segments.data(), count));
  using MemSpace = typename ExecSpace::memory_space;
  const impl::SegmentKeySource<Scalar, PoolSpace, MemSpace> source{
      pool, Kokkos::subview(workspace.segments, std::make_pair(0, count)), geometry, order};
  impl::launch_prefill(space, shape, source, queries, workspace, out, product);
}

}  // namespace writescope
