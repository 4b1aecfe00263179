// The AMX block products of CPU decode attention (amx_bf16 path; see
// host_block_attention.hpp for the contract): MLA's latent and GQA's blocks
// in tdpbf16ps tiles, the softmax in 16-lane AVX-512.
//
// Why it looks like this: MLA's 16 query heads share one latent row per
// token, read for both products, so both become tile products of 32 tokens
// at a time:
//  - scores as S^T = K Q^T: the A tiles are 16 token rows x 32 latent dims,
//    loaded straight from the block (a token row is the A row); the B tile is
//    16 query pairs x 16 heads (prepare_query_pairs_amx, pair-major). The
//    result has heads as columns, so the softmax runs with lanes = heads, one
//    token per vector, without transposes;
//  - values as O += P V: the A tile is P (16 heads x 32 tokens, bf16), one
//    16 x 16 word transpose of the weights per chunk; the B tiles are the
//    value rows interleaved in token pairs, two unpacks per 32 dims (their
//    lane order permutes the tile's columns, undone once at the end). O
//    (16 heads x value_dim fp32) is too large for the eight tiles and stays
//    in L1/L2 as 16 x 16 tiles, loaded and stored around each product.
// GQA's scores are S = Q K^T with the group's heads as rows (tiles of
// `group` rows): its head-major keys are 16-token tiles of dims x tokens, and
// one word permute per 64-byte line makes a line of the key tile a row of the
// B tile (token rows take one 16 x 16 word transpose per 32 dims instead);
// the softmax then runs with lanes = tokens and its weights are the A tile as
// they are; the values go as MLA's. Its chunks are the block's 32-token
// windows, masked to the segment; token-major blocks' KV heads go one after
// the other.
// The online softmax runs across the run's chunks and segments, rescaling O
// lazily; the rows of a chunk with fewer than 32 tokens are copied into
// zero-padded ones first (rows outside a segment may hold anything). Queries and weights are rounded to bf16, as on the avx512_bf16
// path. The kernel is a template over the tile backend
// (framework/impl/amx_tiles.hpp), so that its emulated instance is tested on
// machines without AMX.

#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "attention/impl/host_block_attention.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "framework/impl/amx_tiles.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#include "attention/impl/host_avx512_math.hpp"  // in the target region

namespace writescope::impl {
namespace {

constexpr int heads = 16;          // MLA's query heads per latent (amx_takes)
constexpr int chunk_tokens = 32;   // two score tiles; one weight tile's tokens
constexpr int max_key_dim = 1024;  // scratch bounds (amx_takes)
constexpr int max_value_dim = 1024;

/// Per-thread scratch of one run (MLA's layouts; GQA's where they differ).
struct alignas(64) TileRunState {
  float scores[chunk_tokens * heads];        // S^T (tokens, heads), scaled in place; GQA: S (heads, tokens)
  std::uint32_t weight_pairs[heads * 16];    // P, the A tile: (heads, token pairs) of bf16 pairs
  std::uint32_t key_pairs[2][16 * 16];       // GQA: a step's K^T B tiles, (key pairs, tokens) of bf16 pairs
  std::uint32_t value_pairs[2][2][16 * 16];  // per parity of the 32-dim step: its two B tiles
  float o[max_value_dim / 16][heads * 16];   // O as tiles of 16 columns (value_tile_column's order)
  bf16 padded[chunk_tokens * max_key_dim];   // a partial chunk's rows, zeros after them
};

/// Column n of the value tile `half` (0 or 1) of a 32-dim step holds dim
/// value_tile_column(half, n) of the step: _mm512_unpack{lo,hi}_epi16 pair
/// the four low (lo) or high (hi) elements of each 128-bit lane.
constexpr int value_tile_column(int half, int n) { return n / 4 * 8 + half * 4 + n % 4; }

/// The 16 x 16 words in r transposed in place: r[i] lane j <- r[j] lane i.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g to 4g + 3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i low01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), low23 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i high01 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                  high23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(low01, high01, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(low01, high01, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(low23, high23, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(low23, high23, 0xdd);
  }
}

/// A head's weights are exp(score - reference), its reference at most
/// rescale_margin below its running maximum: O is rescaled only when a score
/// passes reference + margin (lazy rescaling, as in FlashAttention-3), not at
/// every new maximum, which in a run of a few blocks comes in most chunks.
/// Weights stay below e^8, far inside bf16's and fp32's range.
constexpr float rescale_margin = 8.0f;

/// Moves the references (lanes = heads, the first `rows`) where a chunk's
/// maxima pass them by the margin, rescaling sums and O's rows to match.
inline void follow_maxima(TileRunState& w, int value_tiles, int rows, __m512 chunk_max, __m512& references,
                          __m512& sums) {
  if (!_mm512_cmp_ps_mask(chunk_max, _mm512_add_ps(references, _mm512_set1_ps(rescale_margin)), _CMP_GT_OQ)) return;
  const __m512 grown = _mm512_max_ps(references, chunk_max);
  const __m512 factor = exp16(_mm512_sub_ps(references, grown));  // 0 from -inf: O and sums are still 0
  sums = _mm512_mul_ps(sums, factor);
  alignas(64) float factors[heads];
  _mm512_store_ps(factors, factor);
  for (int tile = 0; tile < value_tiles; ++tile)
    for (int h = 0; h < rows; ++h) {
      float* row = w.o[tile] + 16 * h;
      _mm512_store_ps(row, _mm512_mul_ps(_mm512_load_ps(row), _mm512_set1_ps(factors[h])));
    }
  references = grown;
}

/// The softmax of one chunk's scores (`tokens` valid of chunk_tokens) into
/// the running references and sums, rescaling O where a reference moved;
/// leaves the chunk's weights, as the A tile P (heads, 16 token pairs), in
/// weight_pairs.
inline void chunk_softmax(TileRunState& w, int tokens, float scale, int value_tiles, __m512& references,
                          __m512& sums) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 chunk_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int t = 0; t < tokens; ++t) {
    const __m512 score = _mm512_mul_ps(_mm512_load_ps(w.scores + heads * t), vscale);
    _mm512_store_ps(w.scores + heads * t, score);
    chunk_max = _mm512_max_ps(chunk_max, score);
  }
  follow_maxima(w, value_tiles, heads, chunk_max, references, sums);
  // (p_2j, p_2j+1) of each head: word h of row j; then rows = heads.
  const __m512i order = interleave_halves();
  __m512i pairs[16];
  for (int j = 0; j < 16; ++j) {
    __m512 p[2];
    for (int k = 0; k < 2; ++k) {
      const int t = 2 * j + k;
      p[k] = t < tokens ? exp16(_mm512_sub_ps(_mm512_load_ps(w.scores + heads * t), references))
                         : _mm512_setzero_ps();
      sums = _mm512_add_ps(sums, p[k]);
    }
    pairs[j] = _mm512_permutexvar_epi16(order, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p[1], p[0])));
  }
  transpose16(pairs);
  for (int h = 0; h < heads; ++h) _mm512_store_si512(w.weight_pairs + 16 * h, pairs[h]);
}

/// O += P V for one chunk: P in tile 5 (rows = heads), the value rows of its
/// chunk_tokens tokens `stride` bytes apart from `first`; per 32 dims the
/// rows interleaved in token pairs (tiles 2, 3) and O's two tiles (6, 7)
/// loaded, added to and stored.
template <class Tiles>
void add_values(Tiles& tiles, TileRunState& w, const BlockGeometry& g, const char* first, std::int64_t stride,
                RowPrefetcher& ahead) {
  tiles.template load<5>(w.weight_pairs, tile_row_bytes);
  for (int c = 0; c < g.value_dim / 32; ++c) {
    std::uint32_t* low = w.value_pairs[c % 2][0];
    std::uint32_t* high = w.value_pairs[c % 2][1];
    for (int j = 0; j < 16; ++j) {
      const __m512i a = _mm512_loadu_si512(first + 2 * j * stride + 64 * c);
      const __m512i b = _mm512_loadu_si512(first + (2 * j + 1) * stride + 64 * c);
      _mm512_store_si512(low + 16 * j, _mm512_unpacklo_epi16(a, b));
      _mm512_store_si512(high + 16 * j, _mm512_unpackhi_epi16(a, b));
    }
    tiles.template load<2>(low, tile_row_bytes);
    tiles.template load<3>(high, tile_row_bytes);
    tiles.template load<6>(w.o[2 * c], tile_row_bytes);
    tiles.template load<7>(w.o[2 * c + 1], tile_row_bytes);
    tiles.template dot<6, 5, 2>();
    tiles.template dot<7, 5, 3>();
    tiles.template store<6>(w.o[2 * c], tile_row_bytes);
    tiles.template store<7>(w.o[2 * c + 1], tile_row_bytes);
    ahead.tick();
  }
}

/// One chunk of `tokens` token rows (`stride` bytes apart; chunk_tokens rows
/// readable) into the run's state. Tiles: 0, 1 scores; 2, 3 keys, then value
/// pairs; 4 query pairs; 5 weights; 6, 7 O.
template <class Tiles>
void attend_chunk(Tiles& tiles, TileRunState& w, const BlockGeometry& g, const bf16* rows, std::int64_t stride,
                  int tokens, const std::uint32_t* query_pairs, float scale, RowPrefetcher& ahead,
                  __m512& references, __m512& sums) {
  const int key_steps = g.key_dim / 32;
  const char* first = reinterpret_cast<const char*>(rows);
  tiles.template zero<0>();
  tiles.template zero<1>();
  for (int c = 0; c < key_steps; ++c) {
    tiles.template load<4>(query_pairs + 256 * c, tile_row_bytes);
    tiles.template load<2>(first + 64 * c, stride);
    tiles.template load<3>(first + 16 * stride + 64 * c, stride);
    tiles.template dot<0, 2, 4>();
    tiles.template dot<1, 3, 4>();
    ahead.tick();
  }
  tiles.template store<0>(w.scores, tile_row_bytes);
  tiles.template store<1>(w.scores + 16 * heads, tile_row_bytes);
  chunk_softmax(w, tokens, scale, g.value_dim / 16, references, sums);
  add_values(tiles, w, g, first, stride, ahead);
}

/// The rows of the chunk of `s` from token `first` on (up to chunk_tokens).
RowPrefetcher chunk_rows(const HostSegment<bf16>& s, int first) {
  const BlockGeometry& g = s.geometry;
  const int count = std::min(chunk_tokens, s.token_begin + s.token_count - first);
  if (count <= 0) return {};
  return RowPrefetcher(s.block + g.key_offset(s.order, first, s.kv_head, 0),
                       g.key_token_stride(s.order) * sizeof(bf16), g.key_dim * sizeof(bf16), count);
}

/// O's first `rows` rows, their columns back in dim order and normalised, to
/// o (rows, value_dim); lse (rows) natural log.
void write_output(const TileRunState& w, int rows, int value_dim, __m512 references, __m512 sums, float* o,
                  float* lse) {
  alignas(64) float reference[heads], sum[heads];
  _mm512_store_ps(reference, references);
  _mm512_store_ps(sum, sums);
  alignas(64) static constexpr std::int32_t first_half[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr std::int32_t second_half[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                               12, 13, 14, 15, 28, 29, 30, 31};
  static_assert(value_tile_column(1, 0) == 4 && value_tile_column(0, 4) == 8, "the permutes below");
  const __m512i low_dims = _mm512_load_si512(first_half), high_dims = _mm512_load_si512(second_half);
  for (int h = 0; h < rows; ++h) {
    const __m512 inverse = _mm512_set1_ps(1.0f / sum[h]);
    for (int c = 0; c < value_dim / 32; ++c) {
      const __m512 low = _mm512_load_ps(w.o[2 * c] + 16 * h), high = _mm512_load_ps(w.o[2 * c + 1] + 16 * h);
      float* out = o + h * value_dim + 32 * c;
      _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutex2var_ps(low, low_dims, high), inverse));
      _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_permutex2var_ps(low, high_dims, high), inverse));
    }
    lse[h] = reference[h] + std::log(sum[h]);
  }
}

/// This thread's scratch, with O's first `value_tiles` tiles zeroed. On the
/// heap, once per thread: 140 KB of static TLS would be set up for every thread.
TileRunState& fresh_state(int value_tiles) {
  thread_local const std::unique_ptr<TileRunState> state = std::make_unique<TileRunState>();
  std::fill(&state->o[0][0], &state->o[0][0] + value_tiles * heads * 16, 0.0f);
  return *state;
}

/// MLA: a run of one latent's segments (16 heads).
template <class Tiles>
void attend_latent_run(Tiles& tiles, const HostSegment<bf16>* run, int count, const std::uint32_t* query_pairs,
                       const HostSegment<bf16>* following, float* o, float* lse) {
  const BlockGeometry& g = run[0].geometry;
  TileRunState& w = fresh_state(g.value_dim / 16);
  __m512 references = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sums = _mm512_setzero_ps();
  const std::int64_t row_elements = g.key_token_stride(run[0].order);
  tiles.configure(TileConfig{});
  for (int r = 0; r < count; ++r) {
    const HostSegment<bf16>& s = run[r];
    const HostSegment<bf16>* after = r + 1 < count ? &run[r + 1] : following;
    const int end = s.token_begin + s.token_count;
    for (int first = s.token_begin; first < end; first += chunk_tokens) {
      const int tokens = std::min(chunk_tokens, end - first);
      // The next chunk's rows, requested over this chunk's products.
      RowPrefetcher ahead = first + chunk_tokens < end ? chunk_rows(s, first + chunk_tokens)
                            : after != nullptr      ? chunk_rows(*after, after->token_begin)
                                                    : RowPrefetcher{};
      ahead.spread_over((g.key_dim + g.value_dim) / 32);
      const bf16* rows = s.block + g.key_offset(s.order, first, s.kv_head, 0);
      std::int64_t stride = row_elements * static_cast<std::int64_t>(sizeof(bf16));
      if (tokens < chunk_tokens) {
        for (int t = 0; t < tokens; ++t)
          std::memcpy(w.padded + t * g.key_dim, rows + t * row_elements, g.key_dim * sizeof(bf16));
        std::fill(w.padded + tokens * g.key_dim, w.padded + chunk_tokens * g.key_dim, bf16{0});
        rows = w.padded;
        stride = g.key_dim * static_cast<std::int64_t>(sizeof(bf16));
      }
      attend_chunk(tiles, w, g, rows, stride, tokens, query_pairs, s.scale, ahead, references, sums);
      ahead.finish();
    }
  }
  tiles.release();
  write_output(w, heads, g.value_dim, references, sums, o, lse);
}

/// GQA, KV head run[0].kv_head + head: S = Q K^T with the group's heads as
/// rows, so the softmax runs with lanes = tokens and its weights are the A
/// tile P as they are. The B tiles of key pairs come from head-major key
/// tiles (16 tokens, dims x tokens) by one word permute per 64-byte line, or
/// from token rows by a 16 x 16 word transpose per 32 dims. Chunks are the
/// block's 32-token windows, masked to the segment. Tiles (`group` rows where
/// marked *): 0*, 1* scores; 2, 3 key pairs, then value pairs; 4* queries;
/// 5* weights; 6*, 7* O.
template <class Tiles>
void attend_group_run(Tiles& tiles, const HostSegment<bf16>* run, int count, int head,
                      const std::uint32_t* query_rows, const HostSegment<bf16>* following, float* o, float* lse) {
  const BlockGeometry& g = run[0].geometry;
  const int group = run[0].group;
  const bool tiled = g.tiled_keys(run[0].order);
  const std::int64_t key_stride = g.key_token_stride(run[0].order) * static_cast<std::int64_t>(sizeof(bf16));
  TileRunState& w = fresh_state(g.value_dim / 16);
  __m512 references = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sums = _mm512_setzero_ps();
  const std::int64_t query_stride = g.key_dim * static_cast<std::int64_t>(sizeof(bf16));
  const std::int64_t value_stride = g.value_token_stride(run[0].order) * static_cast<std::int64_t>(sizeof(bf16));
  // Pair j of a step: dims 2j and 2j + 1 of the tile's 16 tokens interleaved.
  const __m512i pair_order = interleave_halves();
  tiles.configure(TileConfig{}.rows_of(0b11110011u, group));
  for (int r = 0; r < count; ++r) {
    const HostSegment<bf16>& s = run[r];
    const HostSegment<bf16>* after = r + 1 < count ? &run[r + 1] : following;
    const int end = s.token_begin + s.token_count;
    for (int window = s.token_begin / chunk_tokens * chunk_tokens; window < end; window += chunk_tokens) {
      const int begin = std::max(window, s.token_begin), stop = std::min(window + chunk_tokens, end);
      const auto valid = static_cast<__mmask32>((~0ull << (begin - window)) & ~(~0ull << (stop - window)));
      // The next window's keys and values, requested over this window's products.
      const HostSegment<bf16>* next = window + chunk_tokens < end ? &s : after;
      RowPrefetcher ahead_keys, ahead_values;
      if (next != nullptr) {
        const int next_window = next == &s ? window + chunk_tokens : next->token_begin / chunk_tokens * chunk_tokens;
        const int next_head = next->kv_head + head;
        // Head-major: the window's two key tiles are one run of bytes.
        ahead_keys = tiled ? RowPrefetcher(next->block + g.key_offset(next->order, next_window, next_head, 0), 0,
                                           std::int64_t{chunk_tokens} * g.key_dim * sizeof(bf16), 1)
                           : RowPrefetcher(next->block + g.key_offset(next->order, next_window, next_head, 0),
                                           key_stride, g.key_dim * sizeof(bf16), chunk_tokens);
        ahead_values = RowPrefetcher(next->block + g.value_offset(next->order, next_window, next_head, 0),
                                     value_stride, g.value_dim * sizeof(bf16), chunk_tokens);
      }
      ahead_keys.spread_over(g.key_dim / 32);
      ahead_values.spread_over((g.key_dim + g.value_dim) / 32);
      // Scores: per 32 dims, the B tiles of (dim 2j, dim 2j + 1) pairs of
      // each 16 tokens, times the queries' 32 dims.
      const bf16* keys = s.block + g.key_offset(s.order, window, s.kv_head + head, 0);
      tiles.template zero<0>();
      tiles.template zero<1>();
      for (int c = 0; c < g.key_dim / 32; ++c) {
        for (int half = 0; half < 2; ++half) {
          if (tiled) {
            const bf16* tile = keys + (std::int64_t{half} * g.key_dim + 32 * c) * 16;
            for (int j = 0; j < 16; ++j)
              _mm512_store_si512(w.key_pairs[half] + 16 * j,
                                 _mm512_permutexvar_epi16(pair_order, _mm512_loadu_si512(tile + 32 * j)));
          } else {
            const char* rows = reinterpret_cast<const char*>(keys) + 16 * half * key_stride + 64 * c;
            __m512i lines[16];
            for (int t = 0; t < 16; ++t) lines[t] = _mm512_loadu_si512(rows + t * key_stride);
            transpose16(lines);
            for (int j = 0; j < 16; ++j) _mm512_store_si512(w.key_pairs[half] + 16 * j, lines[j]);
          }
        }
        tiles.template load<4>(query_rows + 16 * c, query_stride);
        tiles.template load<2>(w.key_pairs[0], tile_row_bytes);
        tiles.template load<3>(w.key_pairs[1], tile_row_bytes);
        tiles.template dot<0, 4, 2>();
        tiles.template dot<1, 4, 3>();
        ahead_keys.tick();
        ahead_values.tick();
      }
      tiles.template store<0>(w.scores, 2 * tile_row_bytes);
      tiles.template store<1>(w.scores + 16, 2 * tile_row_bytes);
      // Softmax per head (lanes = tokens), the tokens outside the segment masked.
      const float minus_infinity = -std::numeric_limits<float>::infinity();
      const __m512 vscale = _mm512_set1_ps(s.scale);
      alignas(64) float chunk_maxima[heads];
      std::fill(chunk_maxima, chunk_maxima + heads, minus_infinity);
      __m512 scaled[heads][2];
      for (int h = 0; h < group; ++h)
        for (int half = 0; half < 2; ++half) {
          const auto lanes = static_cast<__mmask16>(valid >> (16 * half));
          scaled[h][half] = _mm512_mask_mul_ps(_mm512_set1_ps(minus_infinity), lanes,
                                               _mm512_load_ps(w.scores + 32 * h + 16 * half), vscale);
          chunk_maxima[h] = std::max(chunk_maxima[h], max16(scaled[h][half]));
        }
      follow_maxima(w, g.value_dim / 16, group, _mm512_load_ps(chunk_maxima), references, sums);
      alignas(64) float reference[heads], chunk_sums[heads] = {};
      _mm512_store_ps(reference, references);
      for (int h = 0; h < group; ++h) {
        const __m512 low = exp16(_mm512_sub_ps(scaled[h][0], _mm512_set1_ps(reference[h])));
        const __m512 high = exp16(_mm512_sub_ps(scaled[h][1], _mm512_set1_ps(reference[h])));
        chunk_sums[h] = sum16(_mm512_add_ps(low, high));
        _mm512_store_si512(w.weight_pairs + 16 * h, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low)));
      }
      sums = _mm512_add_ps(sums, _mm512_load_ps(chunk_sums));
      // Values: rows outside the segment may hold anything, so a partial
      // window's rows are copied, zeros around them.
      const char* values =
          reinterpret_cast<const char*>(s.block + g.value_offset(s.order, window, s.kv_head + head, 0));
      std::int64_t stride = value_stride;
      if (begin > window || stop < window + chunk_tokens) {
        std::fill(w.padded, w.padded + chunk_tokens * g.value_dim, bf16{0});
        for (int t = begin - window; t < stop - window; ++t)
          std::memcpy(w.padded + t * g.value_dim, values + t * value_stride, g.value_dim * sizeof(bf16));
        values = reinterpret_cast<const char*>(w.padded);
        stride = g.value_dim * static_cast<std::int64_t>(sizeof(bf16));
      }
      add_values(tiles, w, g, values, stride, ahead_values);
      ahead_keys.finish();
      ahead_values.finish();
    }
  }
  tiles.release();
  write_output(w, group, g.value_dim, references, sums, o, lse);
}

/// The run for `kv_heads` KV heads from run[0].kv_head on (several only in
/// token-major GQA blocks), one after the other: o (kv_heads, group,
/// value_dim), lse (kv_heads, group).
template <class Tiles>
void attend_run(Tiles& tiles, const HostSegment<bf16>* run, int count, int kv_heads,
                const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following, float* o, float* lse) {
  if (run[0].geometry.values_in_keys) return attend_latent_run(tiles, run, count, query_pairs[0], following, o, lse);
  const int rows = run[0].group;
  for (int h = 0; h < kv_heads; ++h)
    attend_group_run(tiles, run, count, h, query_pairs[h], following, o + h * rows * run[0].geometry.value_dim,
                     lse + h * rows);
}

}  // namespace

bool amx_takes(const BlockGeometry& g, BlockOrder order, int group) {
  if (g.key_dim % 32 != 0 || g.value_dim % 32 != 0 || g.key_dim > max_key_dim || g.value_dim > max_value_dim)
    return false;
  if (g.values_in_keys) return group == heads && g.kv_heads == 1 && g.value_dim <= g.key_dim;
  return (!g.tiled_keys(order) || g.key_tile_tokens() == 16) && g.block_tokens % chunk_tokens == 0 && group >= 1 &&
         group <= heads;
}

void prepare_query_pairs_amx(const BlockGeometry& g, int group, const float* queries, std::uint32_t* query_pairs) {
  for (int j = 0; j < g.key_dim / 2; ++j)
    for (int h = 0; h < group; ++h)
      query_pairs[g.values_in_keys ? j * group + h : h * g.key_dim / 2 + j] =
          bf16_pair(queries[h * g.key_dim + 2 * j], queries[h * g.key_dim + 2 * j + 1]);
}

void host_run_attention_amx(const HostSegment<bf16>* run, int count, int heads,
                            const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following, float* o,
                            float* lse) {
  AmxTiles tiles;
  attend_run(tiles, run, count, heads, query_pairs, following, o, lse);
}

void host_run_attention_amx_emulated(const HostSegment<bf16>* run, int count, int heads,
                                     const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following,
                                     float* o, float* lse) {
  EmulatedTiles tiles;
  attend_run(tiles, run, count, heads, query_pairs, following, o, lse);
}

}  // namespace writescope::impl

#pragma GCC pop_options

#endif  // WRITESCOPE_HOST_AVX512_BF16
