#pragma once
// The innermost block product of CPU decode attention: one block segment, one
// KV head, its whole group of query heads.
//
// Why it looks like this: the CPU kernel is compute-bound (DESIGN.md §9), so
// every KV element is converted from bf16 once and reused from a register for
// all query heads of the group; scores, exponentials and the PV product run in
// 8-wide AVX2 vectors with the accumulators of a tile of query heads held in
// registers across a tile of tokens. Where the CPU has AVX-512 BF16 the
// products run as `vdpbf16ps` on bf16 pairs instead (twice the AVX2 FMA rate per
// core, no widening of KV; host_block_attention_avx512bf16.cpp). Without
// AVX2/FMA (or for dims that are not multiples of 8) a plain scalar loop
// computes the same thing. The path is chosen at run time (framework/cpu_path.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attention/impl/merge_weights.hpp"
#include "framework/bf16.hpp"
#include "attention/host_prefetch.hpp"
#include "framework/cpu_path.hpp"
#include "framework/math.hpp"
#include "framework/simd.hpp"
#include "layouts/kv_format.hpp"

namespace writescope::impl {

#ifdef WRITESCOPE_HOST_AVX2
using namespace writescope::simd;
#endif

/// Largest query-head group a KV head may serve (MLA: 16).
inline constexpr int max_group = 16;

/// Inputs of one block segment for one KV head.
template <class Scalar>
struct HostSegment {
  const Scalar* block;      // the block's first element
  BlockGeometry geometry;
  BlockOrder order;
  int kv_head;
  int token_begin;          // first token inside the block
  int token_count;
  const float* queries;     // (group, key_dim): the group's query heads, contiguous
  int group;
  float scale;
};

/// Scalar path. scores: (group, token_count) scratch; o: (group, value_dim); lse: (group).
template <class Scalar>
void host_segment_attention_scalar(const HostSegment<Scalar>& s, float* scores, float* o, float* lse) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  for (int q = 0; q < s.group; ++q) {
    for (int i = 0; i < n; ++i) {
      float dot = 0;
      for (int d = 0; d < g.key_dim; ++d)
        dot += s.queries[q * g.key_dim + d] *
               to_float(s.block[g.key_offset(s.order, s.token_begin + i, s.kv_head, d)]);
      scores[q * n + i] = dot * s.scale;
    }
    const float m = *std::max_element(scores + q * n, scores + (q + 1) * n);
    float sum = 0;
    for (int i = 0; i < n; ++i) sum += (scores[q * n + i] = math::exp(scores[q * n + i] - m));
    for (int d = 0; d < g.value_dim; ++d) {
      float acc = 0;
      for (int i = 0; i < n; ++i)
        acc += scores[q * n + i] * to_float(s.block[g.value_offset(s.order, s.token_begin + i, s.kv_head, d)]);
      o[q * g.value_dim + d] = acc / sum;
    }
    lse[q] = m + math::log(sum);
  }
}

#ifdef WRITESCOPE_HOST_AVX2

/// The request RowPrefetcher makes by default: the line to its level.
struct PrefetchLine {
  void operator()(const char* line, PrefetchLevel level) const {
    if (level == PrefetchLevel::l2) _mm_prefetch(line, _MM_HINT_T1);
    else _mm_prefetch(line, _MM_HINT_T0);
  }
};

/// Requests the cache lines of a set of equally spaced rows (the next pass's
/// keys or values) a few at a time, spread over the current pass's products
/// (and, for the AVX-512 values, its exponentials), so that memory streams
/// while they run: a burst of requests stalls once the core's misses in
/// flight are exhausted. Requests into L1 split the set into up
/// to four equal parts of a page or more (by rows, or a single row by lines)
/// requested in turn, one line of each: the L2 streamer then runs ahead in
/// four pages at once, where one sequential stream gave it a single page to
/// run in (Intel VM, cpu_decode at 32K / 128K, two threads, medians of four
/// alternations: Qwen3 head-major 13.5 -> 16.1 / 16.9 -> 19.4 GB/s, Mixtral
/// 16.2 -> 19.8 / 16.8 -> 21.2; MLA, compute-bound, unchanged). (Both vector
/// paths; here, before the AVX-512 file's target region, so that it is
/// compiled for the baseline in both.)
class RowPrefetcher {
 public:
  static constexpr int max_parts = 4;
  static constexpr std::int64_t page_bytes = 4096;
  RowPrefetcher() = default;
  RowPrefetcher(const void* first_row, std::int64_t stride_bytes, std::int64_t row_bytes, int rows,
                PrefetchLevel level = PrefetchLevel::l1)
      : row_(static_cast<const char*>(first_row)),
        stride_(stride_bytes),
        row_lines_(static_cast<int>((row_bytes + 63) / 64)),
        rows_left_(rows),
        lines_(row_lines_ * rows),
        level_(level) {
    // Parts of at least a page: a smaller one gives the streamer no page of its own.
    // Requests into L2 go as one stream: they need no streamer to run ahead (Zen 4,
    // head-major decode from DRAM, probe alternated 3 x 12: Qwen3 +5-8%, Mixtral +6-8%
    // against four parts).
    for (int parts = level == PrefetchLevel::l2 ? 1 : max_parts; parts > 1; parts /= 2) {
      if (rows % parts == 0 && rows / parts * stride_ >= page_bytes) {
        parts_ = parts, part_bytes_ = rows / parts * stride_, rows_left_ = rows / parts;
        break;
      }
      if (rows == 1 && row_lines_ % parts == 0 && std::int64_t{row_lines_ / parts} * 64 >= page_bytes) {
        parts_ = parts, part_bytes_ = std::int64_t{row_lines_ / parts} * 64, row_lines_ /= parts;
        break;
      }
    }
  }
  /// Requests `lines` more lines (whole groups of one line per part; the
  /// rest is owed to the next call). `request` sees each line's address and
  /// the level (tests record them).
  template <class Request = PrefetchLine>
  void step(int lines, Request request = {}) {
    credit_ += std::int64_t{lines} << 16;
    drain(request);
  }
  template <class Request = PrefetchLine>
  void finish(Request request = {}) {
    step(lines_, request);
  }
  /// Spreads the lines left over `ticks` calls of tick(): evenly, rather than
  /// a whole line or more per step and then none (a burst at that rate
  /// outruns the misses a core keeps in flight).
  void spread_over(std::int64_t ticks) {
    const std::int64_t left = (std::int64_t{rows_left_} * row_lines_ - line_) * parts_;
    per_tick_ = (left << 16) / std::max<std::int64_t>(1, ticks) + 1;
    credit_ = 0;
  }
  template <class Request = PrefetchLine>
  void tick(Request request = {}) {
    credit_ += per_tick_;
    drain(request);
  }
  /// Takes the progress of `copy`, a local copy that held this one's state in
  /// registers through a loop: field by field, since a whole assignment
  /// compiled to a 64-byte load of the copy's just-stored fields, a failed
  /// store forward per call (7% of the samples of Qwen3's token-row scores and
  /// of its value products, Zen 5).
  void take_progress(const RowPrefetcher& copy) {
    row_ = copy.row_;
    rows_left_ = copy.rows_left_;
    line_ = copy.line_;
    credit_ = copy.credit_;
  }
  int lines() const { return lines_; }
  /// How many parts the lines are requested in.
  int parts() const { return parts_; }

 private:
  template <class Request>
  void drain(Request request) {
    const std::int64_t group = std::int64_t{parts_} << 16;  // one line per part
    for (; credit_ >= group && rows_left_ > 0; credit_ -= group) {
      const char* line = row_ + 64 * line_;
      for (int p = 0; p < parts_; ++p) request(line + p * part_bytes_, level_);
      if (++line_ == row_lines_) line_ = 0, row_ += stride_, --rows_left_;
    }
  }
  const char* row_ = nullptr;  // part 0's row of the next group
  std::int64_t stride_ = 0;
  std::int64_t part_bytes_ = 0;  // from a line of part 0 to the same line of part 1
  int row_lines_ = 0;            // per part's row
  int rows_left_ = 0;            // per part
  int line_ = 0;
  int lines_ = 0;  // all parts'
  int parts_ = 1;
  std::int64_t per_tick_ = 0;  // lines per tick, 16.16 fixed point
  std::int64_t credit_ = 0;    // lines owed, the same
  PrefetchLevel level_ = PrefetchLevel::l1;
};

// Register tiles: a tile of query heads times a tile of 8-wide vectors, sized
// so that accumulators, operands and one broadcast fit the 16 AVX2 registers
// and each FMA needs at most 0.75 loads (Zen 3 / Intel: 2 FMAs and 2-3 loads
// per cycle), i.e. the product is FMA-bound, not load-bound.

/// Scores for keys stored head-major (tokens contiguous): `Heads` query heads
/// times `Vectors` x 8 tokens per register tile.
/// `keys` points at (token, d = 0) of the run, `row` apart per dim; scores go
/// to columns [i, i + 8 * Vectors).
template <int Heads, int Vectors, class Scalar>
inline void scores_head_major_tile(const HostSegment<Scalar>& s, const Scalar* keys, std::int64_t row, int q0,
                                   int i, float* scores) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  // Flat accumulators with fully unrolled loops: GCC keeps a 2-D array of
  // vectors in memory and stores it on every iteration, halving throughput.
  __m256 acc[Heads * Vectors];
WRITESCOPE_UNROLL(16)
  for (int a = 0; a < Heads * Vectors; ++a) acc[a] = _mm256_setzero_ps();
  const float* q = s.queries + q0 * g.key_dim;
  // The next run of keys follows this one in memory: request it one run ahead,
  // a cache line every 64 bytes of this run, so memory and FMAs overlap.
  const char* next_run = reinterpret_cast<const char*>(keys + g.key_dim * row);
  const std::int64_t dim_bytes = row * static_cast<std::int64_t>(sizeof(Scalar));
  // Dims per cache line of the run (one when a dim's keys fill a line or more).
  const int dims_per_line = static_cast<int>(std::max<std::int64_t>(1, 64 / dim_bytes));
  auto product = [&](int d) {
    __m256 k[Vectors];
    if constexpr (Vectors == 2) load16(keys + d * row, k[0], k[1]);
    else k[0] = load8(keys + d * row);
WRITESCOPE_UNROLL(8)
    for (int h = 0; h < Heads; ++h) {
      const __m256 b = _mm256_broadcast_ss(q + h * g.key_dim + d);
WRITESCOPE_UNROLL(4)
      for (int v = 0; v < Vectors; ++v) acc[h * Vectors + v] = _mm256_fmadd_ps(b, k[v], acc[h * Vectors + v]);
    }
  };
  int d = 0;
  if (dims_per_line == 2) {
    // bf16 keys in 16-token tiles: the loop issues one prefetch per line and no test per dim.
    for (; d + 2 <= g.key_dim; d += 2) {
      if (q0 == 0) _mm_prefetch(next_run + d * dim_bytes, _MM_HINT_T0);
      product(d);
      product(d + 1);
    }
  }
  for (; d < g.key_dim; ++d) {
    if (q0 == 0 && d % dims_per_line == 0) _mm_prefetch(next_run + d * dim_bytes, _MM_HINT_T0);
    product(d);
  }
  if constexpr (Vectors == 2 && load16_splits<Scalar>) {
WRITESCOPE_UNROLL(8)
    for (int h = 0; h < Heads; ++h) interleave16(acc[2 * h], acc[2 * h + 1]);
  }
  const __m256 scale = _mm256_set1_ps(s.scale);
WRITESCOPE_UNROLL(16)
  for (int a = 0; a < Heads * Vectors; ++a)
    _mm256_storeu_ps(scores + (q0 + a / Vectors) * n + i + 8 * (a % Vectors), _mm256_mul_ps(acc[a], scale));
}

/// Walks the segment's tokens in 8-token runs that lie inside one key tile:
/// runs(t, vectors) for 16 or 8 tokens starting at block token t, single(t)
/// for tokens outside whole runs.
template <class Scalar, class Runs, class Single>
void for_each_key_run(const HostSegment<Scalar>& s, Runs&& runs, Single&& single) {
  const int tile = s.geometry.key_tile_tokens();
  const int end = s.token_begin + s.token_count;
  int t = s.token_begin;
  while (t < end) {
    const int room = std::min(tile - t % tile, end - t);
    if (tile % 8 == 0 && t % 8 == 0 && room >= 16) {
      runs(t, 2);
      t += 16;
    } else if (tile % 8 == 0 && t % 8 == 0 && room >= 8) {
      runs(t, 1);
      t += 8;
    } else {
      single(t);
      t += 1;
    }
  }
}

/// Scores of every query head for keys stored head-major: each key run (one
/// 4 KiB tile for bf16) is read from memory once and reused from L1 by every
/// tile of `Heads` query heads.
template <int Heads, class Scalar>
void scores_head_major(const HostSegment<Scalar>& s, float* scores) {
  const BlockGeometry& g = s.geometry;
  const std::int64_t row = g.key_dim_stride(BlockOrder::head_major);
  auto key = [&](int t, int d) { return s.block + g.key_offset(BlockOrder::head_major, t, s.kv_head, d); };
  for_each_key_run(
      s,
      [&](int t, int vectors) {
        int q0 = 0;
        for (; q0 + Heads <= s.group; q0 += Heads) {
          if (vectors == 2) scores_head_major_tile<Heads, 2>(s, key(t, 0), row, q0, t - s.token_begin, scores);
          else scores_head_major_tile<Heads, 1>(s, key(t, 0), row, q0, t - s.token_begin, scores);
        }
        for (; q0 < s.group; ++q0) {
          if (vectors == 2) scores_head_major_tile<1, 2>(s, key(t, 0), row, q0, t - s.token_begin, scores);
          else scores_head_major_tile<1, 1>(s, key(t, 0), row, q0, t - s.token_begin, scores);
        }
      },
      [&](int t) {
        for (int h = 0; h < s.group; ++h) {
          float dot = 0;
          for (int d = 0; d < g.key_dim; ++d) dot += s.queries[h * g.key_dim + d] * to_float(*key(t, d));
          scores[h * s.token_count + t - s.token_begin] = dot * s.scale;
        }
      });
}

/// Scores for keys stored token-major (dims contiguous), for `heads` KV heads
/// from s.kv_head on (their query groups follow s.queries): 4 token rows at a
/// time and each head in turn, so that the rows are read once and in address
/// order (the heads share a row); query heads in pairs, 4 tokens x 2 heads
/// reduced across lanes eight sums at a time. scores: (heads, group, token_count).
template <class Scalar>
void scores_token_major(const HostSegment<Scalar>& s, int heads, float* scores) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count, group = s.group;
  const std::int64_t stride = g.key_token_stride(BlockOrder::token_major);
  const std::int64_t head_stride = g.key_offset(BlockOrder::token_major, 0, 1, 0);
  const Scalar* rows = s.block + g.key_offset(BlockOrder::token_major, s.token_begin, s.kv_head, 0);
  // One token's key against one query head.
  auto single = [&](const Scalar* key, const float* q) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < g.key_dim; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(key + d), acc);
    return horizontal_sum(acc) * s.scale;
  };
  // A step's 4 rows cover 4 KiB or more (Qwen3: one page), and the hardware
  // prefetchers start over at each page: the rows two steps ahead are
  // requested during each step.
  const std::int64_t row_bytes = std::int64_t{heads} * g.key_dim * static_cast<std::int64_t>(sizeof(Scalar));
  const int pairs = std::max(1, heads * (group / 2));
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    RowPrefetcher ahead = i + 8 < n ? RowPrefetcher(rows + (i + 8) * stride, stride * sizeof(Scalar), row_bytes,
                                                    std::min(4, n - (i + 8)))
                                    : RowPrefetcher();
    const int lines_per_pair = (ahead.lines() + pairs - 1) / pairs;
    for (int h = 0; h < heads; ++h) {
      const Scalar* keys = rows + i * stride + h * head_stride;
      const float* queries = s.queries + h * group * g.key_dim;
      float* head_scores = scores + h * group * n;
      int q0 = 0;
      for (; q0 + 2 <= group; q0 += 2) {
        ahead.step(lines_per_pair);
        const float* q = queries + q0 * g.key_dim;
        __m256 acc[8];
        for (auto& a : acc) a = _mm256_setzero_ps();
        for (int d = 0; d < g.key_dim; d += 8) {
          const __m256 q_a = _mm256_loadu_ps(q + d), q_b = _mm256_loadu_ps(q + g.key_dim + d);
          for (int t = 0; t < 4; ++t) {
            const __m256 k = load8(keys + t * stride + d);
            acc[2 * t] = _mm256_fmadd_ps(q_a, k, acc[2 * t]);
            acc[2 * t + 1] = _mm256_fmadd_ps(q_b, k, acc[2 * t + 1]);
          }
        }
        alignas(32) float sums[8];
        _mm256_store_ps(sums, _mm256_mul_ps(sum_lanes8(acc), _mm256_set1_ps(s.scale)));
        for (int t = 0; t < 4; ++t) {
          head_scores[q0 * n + i + t] = sums[2 * t];
          head_scores[(q0 + 1) * n + i + t] = sums[2 * t + 1];
        }
      }
      for (; q0 < group; ++q0)
        for (int t = 0; t < 4; ++t)
          head_scores[q0 * n + i + t] = single(keys + t * stride, queries + q0 * g.key_dim);
    }
    ahead.finish();
  }
  for (; i < n; ++i)
    for (int h = 0; h < heads; ++h)
      for (int q = 0; q < group; ++q)
        scores[(h * group + q) * n + i] =
            single(rows + i * stride + h * head_stride, s.queries + (h * group + q) * g.key_dim);
}

/// o(q, :) += sum_i p(q, i) * value(i, :) for values with dims contiguous:
/// `Heads` heads x 16 dims per register tile. Tokens are taken 16 at a time and
/// every head tile runs over the same 16 x 16 slice, so values are read from
/// memory once and reused from L1.
/// For bf16 the 16 dims of each output slice are kept in load16's even/odd
/// order while tokens accumulate; values_rows restores the order at the end.
template <int Heads, class Scalar>
inline void values_rows_tile(const Scalar* values, std::int64_t stride, const float* p, int n, int i0, int i1,
                             float* o, int value_dim) {
  __m256 acc[Heads * 2];
WRITESCOPE_UNROLL(16)
  for (int a = 0; a < Heads * 2; ++a) acc[a] = _mm256_loadu_ps(o + (a / 2) * value_dim + 8 * (a % 2));
  for (int i = i0; i < i1; ++i) {
    __m256 v0, v1;
    load16(values + i * stride, v0, v1);
WRITESCOPE_UNROLL(8)
    for (int h = 0; h < Heads; ++h) {
      const __m256 b = _mm256_broadcast_ss(p + h * n + i);
      acc[2 * h] = _mm256_fmadd_ps(b, v0, acc[2 * h]);
      acc[2 * h + 1] = _mm256_fmadd_ps(b, v1, acc[2 * h + 1]);
    }
  }
WRITESCOPE_UNROLL(16)
  for (int a = 0; a < Heads * 2; ++a) _mm256_storeu_ps(o + (a / 2) * value_dim + 8 * (a % 2), acc[a]);
}

template <int Heads, class Scalar>
void values_rows(const HostSegment<Scalar>& s, const float* p, float* o) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  const std::int64_t stride = g.value_token_stride(s.order);
  const Scalar* values = s.block + g.value_offset(s.order, s.token_begin, s.kv_head, 0);
  constexpr int token_tile = 16;
  const std::int64_t row_bytes = g.value_dim * static_cast<std::int64_t>(sizeof(Scalar));
  const int slices = g.value_dim / 16;
  for (int i0 = 0; i0 < n; i0 += token_tile) {
    const int i1 = std::min(n, i0 + token_tile);
    // The next token tile's value rows, requested while this one is multiplied.
    RowPrefetcher ahead = i1 < n ? RowPrefetcher(values + i1 * stride, stride * sizeof(Scalar), row_bytes,
                                                 std::min(token_tile, n - i1))
                                 : RowPrefetcher();
    const int lines_per_slice = (ahead.lines() + slices - 1) / slices;
    for (int d = 0; d < g.value_dim; d += 16) {
      ahead.step(lines_per_slice);
      int q0 = 0;
      for (; q0 + Heads <= s.group; q0 += Heads)
        values_rows_tile<Heads>(values + d, stride, p + q0 * n, n, i0, i1, o + q0 * g.value_dim + d, g.value_dim);
      for (; q0 < s.group; ++q0)
        values_rows_tile<1>(values + d, stride, p + q0 * n, n, i0, i1, o + q0 * g.value_dim + d, g.value_dim);
    }
  }
  if constexpr (load16_splits<Scalar>) {
    for (int q = 0; q < s.group; ++q)
      for (int d = 0; d < g.value_dim; d += 16) {
        __m256 even = _mm256_loadu_ps(o + q * g.value_dim + d), odd = _mm256_loadu_ps(o + q * g.value_dim + d + 8);
        interleave16(even, odd);
        _mm256_storeu_ps(o + q * g.value_dim + d, even);
        _mm256_storeu_ps(o + q * g.value_dim + d + 8, odd);
      }
  }
}

/// Softmax numerators in place: scores(q, :) <- exp(scores(q, :) - max); returns max and sum per head.
inline void exponentiate(float* scores, int group, int n, float* maxima, float* sums) {
  for (int q = 0; q < group; ++q) {
    float* row = scores + q * n;
    __m256 vmax = _mm256_set1_ps(math::negative_infinity());
    int i = 0;
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(row + i));
    float m = horizontal_max(vmax);
    for (int j = i; j < n; ++j) m = std::max(m, row[j]);
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), vm));
      _mm256_storeu_ps(row + i, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    float sum = horizontal_sum(vsum);
    for (int j = i; j < n; ++j) sum += (row[j] = math::exp(row[j] - m));
    maxima[q] = m;
    sums[q] = sum;
  }
}

#endif  // WRITESCOPE_HOST_AVX2

#ifdef WRITESCOPE_HOST_AVX512_BF16
/// The AVX-512 paths (host_block_attention_avx512bf16.cpp): whether they
/// take blocks of this geometry and order with `group` query heads per KV
/// head; the group's queries (group, key_dim) in the order the path's
/// products read them, prepared once per batch entry and KV head, not per
/// run: for avx512_bf16 as bf16 pairs (group * key_dim / 2 words), for
/// avx512_fma as fp32 lanes (query_lane_floats(group, key_dim) floats, a
/// whole number of 64-byte lines: keep them line-aligned, a vector load
/// across two lines ran MLA's scores up to 25% slower); the product itself
/// (same contract as host_run_attention), one online softmax per head across
/// the run's segments: in vdpbf16ps (avx512_bf16) or in 16-lane fp32 FMAs
/// (avx512_fma).
bool avx512_takes(const BlockGeometry& g, BlockOrder order, int group);
void prepare_query_pairs_avx512_bf16(const BlockGeometry& g, BlockOrder order, int group, const float* queries,
                                     std::uint32_t* query_pairs);
int query_lane_floats(int group, int key_dim);
void prepare_query_lanes_avx512_fma(const BlockGeometry& g, BlockOrder order, int group, const float* queries,
                                    float* query_lanes);
void host_run_attention_avx512_bf16(const HostSegment<bf16>* run, int count, int heads,
                                    const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following,
                                    PrefetchLevel next_pass, int requested_pass, float* o, float* lse);
void host_run_attention_avx512_fma(const HostSegment<bf16>* run, int count, int heads,
                                   const float* const* query_lanes, const HostSegment<bf16>* following,
                                   PrefetchLevel next_pass, int requested_pass, float* o, float* lse);

/// The AMX tile products (host_block_attention_amx.cpp): whether they take
/// blocks of this geometry and order with `group` query heads per KV head
/// (MLA: one latent, 16 heads, values in the keys; GQA: 16-token key tiles or
/// token rows, blocks of whole 32-token chunks); the group's queries
/// (group, key_dim) as bf16 pairs, group * key_dim / 2 words: for MLA
/// pair-major (pair j of head h at j * group + h), for GQA head-major (at
/// h * key_dim / 2 + j); the product (host_run_attention's contract, one
/// query_pairs per head), on AMX tiles or (tests, on any AVX-512 BF16 CPU)
/// on their emulation.
bool amx_takes(const BlockGeometry& g, BlockOrder order, int group);
void prepare_query_pairs_amx(const BlockGeometry& g, int group, const float* queries, std::uint32_t* query_pairs);
void host_run_attention_amx(const HostSegment<bf16>* run, int count, int heads,
                            const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following, float* o,
                            float* lse);
void host_run_attention_amx_emulated(const HostSegment<bf16>* run, int count, int heads,
                                     const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following,
                                     float* o, float* lse);
#endif

#ifdef WRITESCOPE_HOST_AVX512_BF16
/// The queries of one (batch entry, KV head) as the bf16 pairs that `path`'s
/// products read (avx512_bf16 or amx_bf16).
inline void prepare_query_pairs(CpuPath path, const BlockGeometry& g, BlockOrder order, int group,
                                const float* queries, std::uint32_t* query_pairs) {
  if (path == CpuPath::amx_bf16) prepare_query_pairs_amx(g, group, queries, query_pairs);
  else prepare_query_pairs_avx512_bf16(g, order, group, queries, query_pairs);
}
#endif

/// The instruction path host_run_attention takes for these blocks.
inline CpuPath host_product_path(CpuPath active, const BlockGeometry& g, BlockOrder order, int group, bool bf16_kv) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (active == CpuPath::amx_bf16 && bf16_kv && amx_takes(g, order, group)) return active;
  active = vector_path(active);
  if (active >= CpuPath::avx512_fma && bf16_kv && avx512_takes(g, order, group)) return active;
#else
  (void)order, (void)group, (void)bf16_kv;
#endif
#ifdef WRITESCOPE_HOST_AVX2
  if (active >= CpuPath::avx2 && g.key_dim % 8 == 0 && g.value_dim % 16 == 0) return CpuPath::avx2;
#endif
  (void)g, (void)active;
  return CpuPath::scalar;
}

/// One segment for `heads` KV heads from s.kv_head on (several only in
/// token-major blocks; their query groups follow s.queries) on the AVX2 or
/// scalar path: o (heads, group, value_dim) normalised, lse (heads, group)
/// natural log. scores: scratch of heads * group * token_count floats.
template <class Scalar>
void host_segment_attention(const HostSegment<Scalar>& s, int heads, float* scores, float* o, float* lse,
                            CpuPath path) {
  const BlockGeometry& g = s.geometry;
  const int n = s.token_count;
  auto head = [&](int h) {
    HostSegment<Scalar> segment = s;
    segment.kv_head += h;
    segment.queries += h * s.group * g.key_dim;
    return segment;
  };
#ifdef WRITESCOPE_HOST_AVX2
  if (path >= CpuPath::avx2 && n > 0) {
    if (g.tiled_keys(s.order)) scores_head_major<4>(s, scores);
    else scores_token_major(s, heads, scores);
    for (int h = 0; h < heads; ++h) {
      float* head_scores = scores + h * s.group * n;
      float* head_o = o + h * s.group * g.value_dim;
      float maxima[max_group], sums[max_group];
      exponentiate(head_scores, s.group, n, maxima, sums);
      std::fill(head_o, head_o + s.group * g.value_dim, 0.0f);
      values_rows<4>(head(h), head_scores, head_o);
      for (int q = 0; q < s.group; ++q) {
        const float inverse = 1.0f / sums[q];
        for (int d = 0; d < g.value_dim; ++d) head_o[q * g.value_dim + d] *= inverse;
        lse[h * s.group + q] = maxima[q] + math::log(sums[q]);
      }
    }
    return;
  }
#endif
  (void)path;
  for (int h = 0; h < heads; ++h)
    host_segment_attention_scalar(head(h), scores, o + h * s.group * g.value_dim, lse + h * s.group);
}

/// (o, lse) <- the log-sum-exp merge of (o, lse) and (part_o, part_lse):
/// o, part_o (rows, value_dim); lse, part_lse (rows), natural log.
inline void merge_state(float* o, float* lse, const float* part_o, const float* part_lse, int rows, int value_dim) {
  for (int q = 0; q < rows; ++q) {
    float w_state, w_part;
    merge_weights(lse[q], part_lse[q], w_state, w_part, lse[q]);
    float* row = o + q * value_dim;
    const float* part = part_o + q * value_dim;
    for (int d = 0; d < value_dim; ++d) row[d] = w_state * row[d] + w_part * part[d];
  }
}

/// A run of segments for `heads` KV heads from run[0].kv_head on and their
/// whole groups: consecutive segments of one batch entry (same queries, group
/// and scale), attended as one state per head, so that it is written (and
/// merged with other runs) once, not once per block. Several heads only for
/// token-major blocks, whose token rows the heads share: each row is then
/// read once for all of them.
///   run: (count) segments of the first head; the next heads' query groups
///        follow its queries (run[0].queries + h * group * key_dim)
///   o: (heads, group, value_dim) normalised; lse: (heads, group) natural log
/// `path` comes from host_product_path. avx512_bf16 and amx_bf16 only:
/// query_pairs, one per head, from prepare_query_pairs (by path); avx512_fma only:
/// query_lanes, one per head, from prepare_query_lanes_avx512_fma; `following`, the segment
/// this thread likely attends after the run (or null), whose first keys and
/// values it prefetches; `next_pass`, the level the AVX-512 products request
/// each next pass into (impl::next_pass_level of active_next_pass_prefetch);
/// `requested_pass`, their tokens per pass (but MLA's), from
/// active_head_major_pass or active_token_major_pass by the blocks' order, or
/// 0 for their own rule.
/// The other paths attend each segment (for all heads, reading token-major
/// rows once) and merge it into the heads' states.
template <class Scalar>
void host_run_attention(const HostSegment<Scalar>* run, int count, int heads, float* o, float* lse, CpuPath path,
                        const std::uint32_t* const* query_pairs = nullptr,
                        const HostSegment<Scalar>* following = nullptr, const float* const* query_lanes = nullptr,
                        PrefetchLevel next_pass = PrefetchLevel::l1, int requested_pass = 0) {
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if constexpr (std::is_same_v<Scalar, bf16>) {
    if (path == CpuPath::avx512_bf16) {
      host_run_attention_avx512_bf16(run, count, heads, query_pairs, following, next_pass, requested_pass, o, lse);
      return;
    }
    if (path == CpuPath::avx512_fma) {
      host_run_attention_avx512_fma(run, count, heads, query_lanes, following, next_pass, requested_pass, o, lse);
      return;
    }
    if (path == CpuPath::amx_bf16) {
      host_run_attention_amx(run, count, heads, query_pairs, following, o, lse);
      return;
    }
  }
#endif
  (void)query_pairs, (void)following, (void)query_lanes, (void)next_pass, (void)requested_pass;
  const int rows = heads * run[0].group, value_dim = run[0].geometry.value_dim;
  int longest = 0;
  for (int i = 0; i < count; ++i) longest = std::max(longest, run[i].token_count);
  std::vector<float> scores(static_cast<std::size_t>(rows) * longest), part_o, part_lse(rows);
  if (count > 1) part_o.resize(static_cast<std::size_t>(rows) * value_dim);
  host_segment_attention(run[0], heads, scores.data(), o, lse, path);
  for (int i = 1; i < count; ++i) {
    host_segment_attention(run[i], heads, scores.data(), part_o.data(), part_lse.data(), path);
    merge_state(o, lse, part_o.data(), part_lse.data(), rows, value_dim);
  }
}

// Instantiated once, in host_block_attention.cpp, which the host compiler
// builds alone in both variants: the Kokkos kernels that call it (nvcc in a
// CUDA build) run the same machine code as a host-only build's.
extern template void host_run_attention<float>(const HostSegment<float>*, int, int, float*, float*, CpuPath,
                                               const std::uint32_t* const*, const HostSegment<float>*,
                                               const float* const*, PrefetchLevel, int);
extern template void host_run_attention<bf16>(const HostSegment<bf16>*, int, int, float*, float*, CpuPath,
                                              const std::uint32_t* const*, const HostSegment<bf16>*,
                                              const float* const*, PrefetchLevel, int);

}  // namespace writescope::impl
