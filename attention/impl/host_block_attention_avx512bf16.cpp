// The AVX-512 block products of CPU decode attention, in two arithmetics (see
// host_block_attention.hpp for the contract): vdpbf16ps on bf16 pairs
// (avx512_bf16) and 16-lane fp32 FMAs on widened bf16 (avx512_fma, for CPUs
// whose vdpbf16ps runs fewer multiply-adds than their FMAs: the Intel VM
// measured runs it at half; cpu_path.hpp picks).
//
// Why it looks like this: `vdpbf16ps` multiplies 32 bf16 pairs and adds them
// into 16 fp32 lanes, twice the multiply-adds of an fp32 FMA and with no
// widening of the KV bytes, so the products below read KV as it is stored:
//  - QK^T, keys in 16-token tiles (GQA CpuResident): one 64-byte line holds dims
//    d and d+1 of 16 tokens; one word permute makes them 16 (d, d+1) pairs, and
//    each query head adds its broadcast (q_d, q_d+1) pair: lanes are tokens.
//  - QK^T, keys in token rows (token-major blocks, MLA's latent): lanes are
//    (head, phase) with token_row_phases(group) phases; a head's phases see
//    consecutive key pairs of one token (an 8- or 16-byte broadcast) and are
//    summed at the end. Groups of 16 and 8 go as two halves (8 heads x 2
//    phases, 4 x 4) that share each broadcast.
//  - PV, values in token rows (every layout): rows t and t+1 interleaved by one
//    unpack give (v_t, v_t+1) pairs per dim; each head adds its broadcast
//    (p_t, p_t+1) pair. Accumulators stay in registers across all token pairs
//    of a pass.
// Queries and softmax weights are rounded to bf16 for the products (tensor-core
// attention does the same); scores, softmax and sums stay fp32.
// The fp32 FMA products keep each layout and lane assignment and widen the KV
// bytes in registers instead (a bf16 is the high half of its fp32): tiled
// keys by two masked word permutes per line, token rows once per 8-row tile
// into L1, value rows into even and odd dims; queries and weights stay fp32,
// as broadcasts or vectors in the order the products read them. Tokens go in
// passes of 128 (fewer for token rows of several heads: pass_length),
// block-aligned, with an online softmax between passes and across the
// segments of a run, so that a pass's keys, values, scores and weights stay
// in L1/L2 and a run's state is normalised once.
//
// The code sits in a target region so that only these functions use AVX-512;
// the rest of the binary keeps the AVX2 baseline, and the dispatcher calls
// them only where the CPU runs them (framework/cpu_path.hpp).

#include "framework/avx512_diagnostics.hpp"  // first: before <immintrin.h>

#include "attention/impl/host_block_attention.hpp"

#ifdef WRITESCOPE_HOST_AVX512_BF16

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#include "attention/impl/host_avx512_math.hpp"  // in the target region

namespace writescope::impl {
namespace {

constexpr int pass_tokens = 128;  // the longest pass; Work's arrays hold one
constexpr int tile_tokens = 16;
constexpr int max_key_dim = 1024;
constexpr int max_value_dim = 1024;

/// Key pairs per head and token-row step of the scores: 16 lanes of 4 heads
/// x 4 phases for groups of 4; groups of 16 and 8 in two halves of 16 lanes,
/// 8 heads x 2 phases and 4 x 4 (scores_rows_halves).
constexpr int token_row_phases(int group) { return group == 16 ? 2 : 4; }

inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}

/// The two halves of each 32-bit lane of bf16 pairs as fp32: (even, odd)
/// elements (a bf16 is the high half of its fp32).
inline __m512 even_elements(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }
inline __m512 odd_elements(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

/// Keeps a loaded line in a register: GCC otherwise folds its load into each
/// instruction that uses it, reading the line two or three times — from L2
/// or memory when it is on its way (the linear layer's 8 rows on Zen 5 from
/// DRAM: 27 -> 32 GB/s), or from a stack copy (the tiled scores).
inline void in_register(__m512i& line) { __asm__("" : "+v"(line)); }

/// Zeroes a 2-D register tile of accumulators (unrolled: GCC keeps an array of
/// vectors in registers only when every access is).
template <int Rows, int Columns>
inline void zero(__m512 (&acc)[Rows][Columns]) {
  WRITESCOPE_UNROLL(16)
  for (int r = 0; r < Rows; ++r)
    WRITESCOPE_UNROLL(16)
    for (int c = 0; c < Columns; ++c) acc[r][c] = _mm512_setzero_ps();
}

/// `Phases` consecutive bf16 pairs at p, repeated over the 16 lanes.
template <int Phases>
inline __m512i broadcast_pairs(const bf16* p) {
  if constexpr (Phases == 2) {
    long long words;
    std::memcpy(&words, p, sizeof words);
    return _mm512_set1_epi64(words);
  } else {
    static_assert(Phases == 4, "groups of 4 or 8 query heads, or 16 as two of 8");
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

/// Per-call state: the running softmax and the unnormalised output. scores:
/// (group, pass_tokens) fp32; weights: (group, pass_tokens / 2) bf16 pairs
/// (p_t, p_t+1), t counted from the pass start (vdpbf16ps products), or
/// weights_fp32 (group, pass_tokens) (fp32 FMA products); query_pairs: see
/// prepare_query_pairs (vdpbf16ps); query_lanes: see prepare_query_lanes
/// (fp32 FMA); widened_latent: MLA's pass widened to fp32 by the scores
/// (pass_tokens, widened_slots(key_dim)), each 32-element line as its 16
/// even then 16 odd elements, for the value products (fp32 FMA; else null).
struct Work {
  const std::uint32_t* query_pairs;
  const float* query_lanes;
  float* widened_latent;
  alignas(64) float scores[max_group * pass_tokens];
  union {
    alignas(64) std::uint32_t weights[max_group * pass_tokens / 2];
    alignas(64) float weights_fp32[max_group * pass_tokens];
  };
  float maxima[max_group];
  float sums[max_group];
};

/// `Tiles` consecutive 16-token key tiles from `keys`: Tiles x Group
/// independent accumulators, twice that where they are fewer than 12 (the
/// latency of vdpbf16ps x its 2 ports; even and odd pairs into separate
/// chains, added at the end). A pass of 32 tokens is 2 tiles: for Mixtral's
/// 4 heads, 8 chains ran its scores at a third of the peak (Zen 5, one
/// thread, KV in L2, 9-11 alternations, medians: the step at 32 tokens 0.35
/// -> 0.43-0.45 of the vdpbf16ps peak).
template <int Group, int Tiles>
inline void scores_tiles(const bf16* keys, std::int64_t tile_elements, int pairs, const std::uint32_t* query_pairs,
                         __m512 (&acc)[Tiles][Group], RowPrefetcher& ahead) {
  constexpr int chains = Tiles * Group >= 12 ? 1 : 2;
  const __m512i order = interleave_halves();
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  __m512 partial[chains][Tiles][Group];
  WRITESCOPE_UNROLL(2)
  for (int c = 0; c < chains; ++c) zero(partial[c]);
  auto pair = [&](int j, __m512(&into)[Tiles][Group]) {
    __m512i q[Group];
    WRITESCOPE_UNROLL(16)
    for (int h = 0; h < Group; ++h) q[h] = _mm512_set1_epi32(static_cast<int>(query_pairs[j * Group + h]));
    WRITESCOPE_UNROLL(4)
    for (int k = 0; k < Tiles; ++k) {
      const __m512i line =
          _mm512_permutexvar_epi16(order, _mm512_loadu_si512(keys + k * tile_elements + 2 * j * tile_tokens));
      WRITESCOPE_UNROLL(16)
      for (int h = 0; h < Group; ++h) into[k][h] = dot(into[k][h], line, q[h]);
    }
  };
  for (int j = 0; j < pairs; j += chains) {  // pairs is even (avx512_takes)
    prefetch.step(chains * Tiles);
    WRITESCOPE_UNROLL(2)
    for (int c = 0; c < chains; ++c) pair(j + c, partial[c]);
  }
  WRITESCOPE_UNROLL(4)
  for (int k = 0; k < Tiles; ++k)
    WRITESCOPE_UNROLL(16)
    for (int h = 0; h < Group; ++h)
      acc[k][h] = chains == 1 ? partial[0][k][h] : _mm512_add_ps(partial[0][k][h], partial[chains - 1][k][h]);
  ahead.take_progress(prefetch);
}

/// scores_tiles with fp32 FMAs: each key line gives dims d and d + 1 of its
/// 16 tokens as two fp32 vectors (one masked word permute each, straight
/// from the stored tile), and each query element is a broadcast from
/// query_lanes (pairs, Group, 2): one pointer reaches a step's elements (a
/// pointer per head spilled the accumulators). Heads outermost within a step,
/// so that each head's two broadcasts serve all tiles from two registers
/// (tiles outermost, GCC kept all 2 x Group broadcasts live, spilled
/// accumulators and reloaded the permute indices: Qwen3 head-major in cache
/// 15.1 -> 15.6 GB/s, one thread, median of ten alternations).
template <int Group, int Tiles>
inline void scores_tiles_fp32(const bf16* keys, std::int64_t tile_elements, int pairs, const float* query_lanes,
                              __m512 (&acc)[Tiles][Group], RowPrefetcher& ahead) {
  // Word 2i + 1 of the result is token i of dim d (first) or d + 1 (second); even words are zeroed.
  alignas(64) static constexpr std::int16_t dim_first[32] = {0, 0, 0, 1,  0, 2,  0, 3,  0, 4,  0, 5,  0, 6,  0, 7,
                                                             0, 8, 0, 9,  0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
  alignas(64) static constexpr std::int16_t dim_second[32] = {0, 16, 0, 17, 0, 18, 0, 19, 0, 20, 0, 21, 0, 22, 0, 23,
                                                              0, 24, 0, 25, 0, 26, 0, 27, 0, 28, 0, 29, 0, 30, 0, 31};
  constexpr __mmask32 odd_words = 0xaaaaaaaau;
  const __m512i first = _mm512_load_si512(dim_first), second = _mm512_load_si512(dim_second);
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  zero(acc);
  const bf16* tile_keys[Tiles];
  WRITESCOPE_UNROLL(4)
  for (int k = 0; k < Tiles; ++k) tile_keys[k] = keys + k * tile_elements;
  for (int j = 0; j < pairs; ++j) {
    prefetch.step(Tiles);
    __m512 dim[Tiles], next_dim[Tiles];
    WRITESCOPE_UNROLL(4)
    for (int k = 0; k < Tiles; ++k) {
      // A pointer per tile and the line held in a register: else GCC 12 stored
      // lines to the stack and permuted them from there, a store-forwarding
      // wait per step (scores in L2, both forms in one probe: Qwen3 x1.25,
      // Mixtral x1.08).
      __m512i line = _mm512_loadu_si512(tile_keys[k] + 2 * j * tile_tokens);
      in_register(line);
      dim[k] = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd_words, first, line));
      next_dim[k] = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd_words, second, line));
    }
    WRITESCOPE_UNROLL(16)
    for (int h = 0; h < Group; ++h) {
      const float* q = query_lanes + (j * Group + h) * 2;
      const __m512 q_dim = _mm512_set1_ps(q[0]), q_next_dim = _mm512_set1_ps(q[1]);
      WRITESCOPE_UNROLL(4)
      for (int k = 0; k < Tiles; ++k) {
        acc[k][h] = _mm512_fmadd_ps(dim[k], q_dim, acc[k][h]);
        acc[k][h] = _mm512_fmadd_ps(next_dim[k], q_next_dim, acc[k][h]);
      }
    }
  }
  ahead.take_progress(prefetch);
}

// The pass products (scores_tiled, scores_rows, values_rows) are kept out of
// attend: inlined, their loops lost registers to its state (Mixtral's
// key-tile offsets were reloaded from the stack every step; +7% in cache).

/// Scores of tokens [first, first + count) of the block (one pass), keys in
/// 16-token tiles: scores(h, t - first).
template <int Group, bool Fp32>
__attribute__((noinline)) void scores_tiled(const HostSegment<bf16>& s, int first, int count, Work& w,
                                            RowPrefetcher& ahead) {
  constexpr int tiles_at_once = 16 / Group;
  const BlockGeometry& g = s.geometry;
  const int pairs = g.key_dim / 2;
  const std::int64_t tile_elements = std::int64_t{tile_tokens} * g.key_dim;
  const __m512 scale = _mm512_set1_ps(s.scale);
  auto store = [&](int tile, const __m512(&acc)[Group]) {
    // Lane i is token tile + i; keep those inside the pass.
    const int begin = std::max(first, tile), end = std::min(first + count, tile + tile_tokens);
    const __mmask16 inside = static_cast<__mmask16>(((1u << (end - begin)) - 1u) << (begin - tile));
    WRITESCOPE_UNROLL(16)
    for (int h = 0; h < Group; ++h)
      _mm512_mask_storeu_ps(w.scores + h * pass_tokens + (tile - first), inside, _mm512_mul_ps(acc[h], scale));
  };
  auto product = [&](auto tiles, int tile, __m512(&acc)[decltype(tiles)::value][Group]) {
    constexpr int n = decltype(tiles)::value;
    const bf16* keys = s.block + g.key_offset(BlockOrder::head_major, tile, s.kv_head, 0);
    if constexpr (Fp32) scores_tiles_fp32<Group, n>(keys, tile_elements, pairs, w.query_lanes, acc, ahead);
    else scores_tiles<Group, n>(keys, tile_elements, pairs, w.query_pairs, acc, ahead);
  };
  // Tiles `n` at a time while they last.
  auto products = [&](auto tiles, int& tile, int end) {
    constexpr int n = decltype(tiles)::value;
    for (; tile + n * tile_tokens <= end; tile += n * tile_tokens) {
      __m512 acc[n][Group];
      product(tiles, tile, acc);
      WRITESCOPE_UNROLL(4)
      for (int k = 0; k < n; ++k) store(tile + k * tile_tokens, acc[k]);
    }
  };
  const int end = (first + count + tile_tokens - 1) / tile_tokens * tile_tokens;
  int tile = first - first % tile_tokens;
  products(std::integral_constant<int, tiles_at_once>{}, tile, end);
  // Passes of 32 tokens: two tiles at once (Mixtral's 4 heads).
  if constexpr (tiles_at_once > 2) products(std::integral_constant<int, 2>{}, tile, end);
  products(std::integral_constant<int, 1>{}, tile, end);
}

/// Scores of 8 tokens x 8 heads from lane sums (lane 2h + f: phase f of head
/// h): the phases added, then transposed in registers so that each head's 8
/// scores are one store (instead of 128 scalar adds and 64 stores per tile:
/// +3-4% for Qwen3's token rows in cache).
///   sums: (token) x 16 lanes; scores: (head, pass_tokens), from this tile's first token
inline void store_two_phase_scores(const __m512 (&sums)[8], float scale, float* scores) {
  __m512d pairs[4];  // qword h of pairs[k]: head h, tokens 2k and 2k + 1
  WRITESCOPE_UNROLL(4)
  for (int k = 0; k < 4; ++k) {
    const __m512 first = sums[2 * k], second = sums[2 * k + 1];
    const __m512 added_first = _mm512_add_ps(first, _mm512_permute_ps(first, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512 added_second = _mm512_add_ps(second, _mm512_permute_ps(second, _MM_SHUFFLE(2, 3, 0, 1)));
    pairs[k] = _mm512_castps_pd(_mm512_mask_blend_ps(0xaaaa, added_first, added_second));
  }
  const __m512i low_heads = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i high_heads = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  const __m512i even_heads = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i odd_heads = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  // Tokens 0-3 and 4-7 of heads 0-3 and 4-7, two tokens per qword.
  const __m512d tokens_low[2] = {_mm512_permutex2var_pd(pairs[0], low_heads, pairs[1]),
                                 _mm512_permutex2var_pd(pairs[0], high_heads, pairs[1])};
  const __m512d tokens_high[2] = {_mm512_permutex2var_pd(pairs[2], low_heads, pairs[3]),
                                  _mm512_permutex2var_pd(pairs[2], high_heads, pairs[3])};
  const __m512 scaled = _mm512_set1_ps(scale);
  WRITESCOPE_UNROLL(2)
  for (int half = 0; half < 2; ++half) {
    // Heads 4 * half + (0, 1) and 4 * half + (2, 3): 8 tokens in each 256-bit half.
    const __m512 first = _mm512_mul_ps(
        _mm512_castpd_ps(_mm512_permutex2var_pd(tokens_low[half], even_heads, tokens_high[half])), scaled);
    const __m512 second = _mm512_mul_ps(
        _mm512_castpd_ps(_mm512_permutex2var_pd(tokens_low[half], odd_heads, tokens_high[half])), scaled);
    float* head = scores + 4 * half * pass_tokens;
    _mm256_storeu_ps(head, _mm512_castps512_ps256(first));
    _mm256_storeu_ps(head + pass_tokens, _mm512_extractf32x8_ps(first, 1));
    _mm256_storeu_ps(head + 2 * pass_tokens, _mm512_castps512_ps256(second));
    _mm256_storeu_ps(head + 3 * pass_tokens, _mm512_extractf32x8_ps(second, 1));
  }
}

/// Scores of 8 tokens x 4 heads from lane sums (lane 4h + f: phase f of head
/// h): four tokens' phases added and transposed at once by in-lane unpacks
/// (128-bit lane h ends as head h's 4 scores), then each head's 8 scores are
/// one store (the phase sums and scalar stores of each token alone took a
/// quarter of Qwen3's fp32 token-row products in cache).
///   sums: (token) x 16 lanes; scores: (head, pass_tokens), from this tile's first token
inline void store_four_phase_scores(const __m512 (&sums)[8], float scale, float* scores) {
  __m512 quads[2];  // 128-bit lane h of quads[k]: head h, tokens 4k to 4k + 3
  WRITESCOPE_UNROLL(2)
  for (int k = 0; k < 2; ++k) {
    const __m512* t = sums + 4 * k;
    // Lane (h, j): phases j and j + 2 of tokens (0, 1, 0, 1) and (2, 3, 2, 3) added.
    const __m512 first = _mm512_add_ps(_mm512_unpacklo_ps(t[0], t[1]), _mm512_unpackhi_ps(t[0], t[1]));
    const __m512 second = _mm512_add_ps(_mm512_unpacklo_ps(t[2], t[3]), _mm512_unpackhi_ps(t[2], t[3]));
    const __m512d a = _mm512_castps_pd(first), b = _mm512_castps_pd(second);
    quads[k] = _mm512_mul_ps(
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b))),
        _mm512_set1_ps(scale));
  }
  // Heads (0, 1) and (2, 3): 8 tokens in each 256-bit half.
  const __m512i low_heads = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i high_heads = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 low = _mm512_permutex2var_ps(quads[0], low_heads, quads[1]);
  const __m512 high = _mm512_permutex2var_ps(quads[0], high_heads, quads[1]);
  _mm256_storeu_ps(scores, _mm512_castps512_ps256(low));
  _mm256_storeu_ps(scores + pass_tokens, _mm512_extractf32x8_ps(low, 1));
  _mm256_storeu_ps(scores + 2 * pass_tokens, _mm512_castps512_ps256(high));
  _mm256_storeu_ps(scores + 3 * pass_tokens, _mm512_extractf32x8_ps(high, 1));
}

/// Groups of 4: `Tokens` tokens from `keys` (row stride `stride`), lanes
/// (head, phase), 4 phases (groups of 8 and 16 go in halves:
/// scores_rows_halves). Two chunks per step into separate accumulators: 2 x
/// Tokens independent chains from Tokens row pointers, few enough to stay in
/// registers (16 rows spilled their pointers, a stack load per product).
template <int Tokens>
inline void scores_rows_tile(const bf16* keys, std::int64_t stride, int chunks, const std::uint32_t* query_pairs,
                             float scale, int column, Work& w, RowPrefetcher& ahead) {
  constexpr int phases = token_row_phases(4), group = 4;
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  __m512 even[Tokens], odd[Tokens];
  WRITESCOPE_UNROLL(8)
  for (int t = 0; t < Tokens; ++t) even[t] = odd[t] = _mm512_setzero_ps();
  int c = 0;
  for (; c + 2 <= chunks; c += 2) {
    prefetch.tick();
    const __m512i q0 = _mm512_load_si512(query_pairs + 16 * c), q1 = _mm512_load_si512(query_pairs + 16 * c + 16);
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t) {
      const bf16* row = keys + t * stride + 2 * phases * c;
      even[t] = dot(even[t], q0, broadcast_pairs<phases>(row));
      odd[t] = dot(odd[t], q1, broadcast_pairs<phases>(row + 2 * phases));
    }
  }
  if (c < chunks) {
    const __m512i q0 = _mm512_load_si512(query_pairs + 16 * c);
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t)
      even[t] = dot(even[t], q0, broadcast_pairs<phases>(keys + t * stride + 2 * phases * c));
  }
  // Every access to the accumulators in an unrolled loop, or GCC keeps them in memory.
  ahead.take_progress(prefetch);
  if constexpr (Tokens == 8) {
    __m512 sums[Tokens];
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t) sums[t] = _mm512_add_ps(even[t], odd[t]);
    store_four_phase_scores(sums, scale, w.scores + column);
    return;
  }
  alignas(64) float lanes[Tokens][16];
  WRITESCOPE_UNROLL(8)
  for (int t = 0; t < Tokens; ++t) _mm512_store_ps(lanes[t], _mm512_add_ps(even[t], odd[t]));
  for (int t = 0; t < Tokens; ++t)
    for (int h = 0; h < group; ++h) {
      float sum = 0;
      for (int f = 0; f < phases; ++f) sum += lanes[t][h * phases + f];
      w.scores[h * pass_tokens + column + t] = sum * scale;
    }
}

/// Groups of 16 (MLA) and 8: two halves of 16 / Phases heads x Phases phases
/// side by side (lanes as scores_rows_tile's), so that each key broadcast
/// feeds two products (MLA: 10 loads per 16 products instead of 18, where the
/// form with lanes (head) and a 4-byte broadcast per product ran at about 70%
/// of the vdpbf16ps peak in L1; Qwen3's token rows, with an 8-byte broadcast
/// per product before: the step in L2 +5-6%, +6-10% without the next pass's
/// requests, Zen 5; from DRAM within the VM's noise). query_pairs: per chunk
/// of Phases pairs, the first half's heads then the second's, lanes (h, f).
template <int Phases, int Tokens>
inline void scores_rows_halves(const bf16* keys, std::int64_t stride, int chunks, const std::uint32_t* query_pairs,
                               float scale, int column, Work& w, RowPrefetcher& ahead) {
  constexpr int heads = 16 / Phases;  // per half
  RowPrefetcher prefetch = ahead;     // a local copy stays in registers
  __m512 low[Tokens], high[Tokens];   // the first half's heads, the second's
  WRITESCOPE_UNROLL(8)
  for (int t = 0; t < Tokens; ++t) low[t] = high[t] = _mm512_setzero_ps();
  for (int c = 0; c < chunks; ++c) {
    prefetch.tick();
    const __m512i q_low = _mm512_load_si512(query_pairs + 32 * c),
                  q_high = _mm512_load_si512(query_pairs + 32 * c + 16);
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t) {
      const __m512i key = broadcast_pairs<Phases>(keys + t * stride + 2 * Phases * c);
      low[t] = dot(low[t], q_low, key);
      high[t] = dot(high[t], q_high, key);
    }
  }
  ahead.take_progress(prefetch);
  if constexpr (Tokens == 8) {
    if constexpr (Phases == 2) {
      store_two_phase_scores(low, scale, w.scores + column);
      store_two_phase_scores(high, scale, w.scores + heads * pass_tokens + column);
    } else {
      store_four_phase_scores(low, scale, w.scores + column);
      store_four_phase_scores(high, scale, w.scores + heads * pass_tokens + column);
    }
  } else {
    alignas(64) float lanes[2][16];
    _mm512_store_ps(lanes[0], low[0]);
    _mm512_store_ps(lanes[1], high[0]);
    for (int h = 0; h < 2 * heads; ++h) {
      float sum = 0;
      for (int f = 0; f < Phases; ++f) sum += lanes[h / heads][Phases * (h % heads) + f];
      w.scores[h * pass_tokens + column] = sum * scale;
    }
  }
}

/// The fp32 token-row scores' layout for a group: `halves` vectors of
/// `heads` heads x `phases` phases each (16: 2 x 8 x 2; 8: 2 x 4 x 4; 4: 1 x
/// 4 x 4); each row is widened in whole 32-element lines (`slots`).
struct Fp32RowLayout {
  int halves, heads, phases;
};
constexpr Fp32RowLayout fp32_row_layout(int group) {
  return {group == 4 ? 1 : 2, group == 4 ? 4 : group / 2, group == 4 ? 4 : 32 / group};
}
constexpr int widened_slots(int key_dim) { return (key_dim + 31) / 32 * 32; }

/// `Phases` (2 or 4) consecutive floats at p, repeated over the 16 lanes (a
/// function, not a lambda: lambdas do not take the target region's options).
template <int Phases>
inline __m512 broadcast_floats(const float* p) {
  if constexpr (Phases == 2) {
    double both;
    std::memcpy(&both, p, sizeof both);
    return _mm512_castpd_ps(_mm512_set1_pd(both));
  } else {
    return _mm512_broadcast_f32x4(_mm_load_ps(p));
  }
}

/// Token-row scores with fp32 FMAs: lanes (head, phase) as in
/// scores_rows_tile, for the heads of a group in `halves` vectors (16: two
/// halves of 8 heads x 2 phases; 8: two of 4 heads x 4 phases; 4: one of 4 x
/// 4) that share each key broadcast. The tile's rows are widened to fp32
/// once, into L1, so that each broadcast is a load and no ALU operation (two
/// per broadcast when widened in place: 0.52 of the FMA peak for MLA in
/// cache). query_lanes: see prepare_query_lanes.
///   widened: (Tokens, widened_slots(key_dim)) fp32, 64-byte aligned: the
///   rows as each 32-element line's 16 even then 16 odd elements, zeros past
///   key_dim (written here)
template <int Group, int Tokens>
inline void scores_rows_tile_fp32(const bf16* keys, std::int64_t stride, int key_dim, float* widened,
                                  const float* query_lanes, float scale, int column, Work& w, RowPrefetcher& ahead) {
  constexpr Fp32RowLayout layout = fp32_row_layout(Group);
  constexpr int halves = layout.halves, heads = layout.heads, phases = layout.phases;
  const int slots = widened_slots(key_dim), lines = slots / 32, chunks = slots / (2 * phases);
  const int whole_lines = key_dim / 32;
  auto widen = [&](int t, int line, __m512i pairs) {
    _mm512_store_ps(widened + t * slots + 32 * line, even_elements(pairs));
    _mm512_store_ps(widened + t * slots + 32 * line + 16, odd_elements(pairs));
  };
  for (int t = 0; t < Tokens; ++t) {
    for (int line = 0; line < whole_lines; ++line) widen(t, line, _mm512_loadu_si512(keys + t * stride + 32 * line));
    if (whole_lines < lines)
      widen(t, whole_lines,
            _mm512_maskz_loadu_epi16((__mmask32{1} << (key_dim % 32)) - 1, keys + t * stride + 32 * whole_lines));
  }
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  __m512 acc[halves][Tokens];
  zero(acc);
  for (int c = 0; c < chunks; ++c) {
    prefetch.tick();
    __m512 q[halves][2];
    WRITESCOPE_UNROLL(2)
    for (int half = 0; half < halves; ++half)
      WRITESCOPE_UNROLL(2)
      for (int e = 0; e < 2; ++e) q[half][e] = _mm512_load_ps(query_lanes + ((c * halves + half) * 2 + e) * 16);
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t) {
      const float* row = widened + t * slots + 2 * phases * c;
      const __m512 first = broadcast_floats<phases>(row), second = broadcast_floats<phases>(row + phases);
      WRITESCOPE_UNROLL(2)
      for (int half = 0; half < halves; ++half) {
        acc[half][t] = _mm512_fmadd_ps(first, q[half][0], acc[half][t]);
        acc[half][t] = _mm512_fmadd_ps(second, q[half][1], acc[half][t]);
      }
    }
  }
  ahead.take_progress(prefetch);
  if constexpr (Tokens == 8) {
    WRITESCOPE_UNROLL(2)
    for (int half = 0; half < halves; ++half) {
      float* scores = w.scores + half * heads * pass_tokens + column;
      if constexpr (phases == 2) store_two_phase_scores(acc[half], scale, scores);
      else store_four_phase_scores(acc[half], scale, scores);
    }
    return;
  }
  WRITESCOPE_UNROLL(2)
  for (int half = 0; half < halves; ++half)
    WRITESCOPE_UNROLL(8)
    for (int t = 0; t < Tokens; ++t) {
      // Each head's phases summed into its first lane.
      __m512 sum = _mm512_add_ps(acc[half][t], _mm512_permute_ps(acc[half][t], _MM_SHUFFLE(2, 3, 0, 1)));
      if constexpr (phases == 4) sum = _mm512_add_ps(sum, _mm512_permute_ps(sum, _MM_SHUFFLE(1, 0, 3, 2)));
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, _mm512_mul_ps(sum, _mm512_set1_ps(scale)));
      for (int h = 0; h < heads; ++h) w.scores[(half * heads + h) * pass_tokens + column + t] = lanes[h * phases];
    }
}

/// The fp32 FMA products' queries of one group (queries (group, key_dim)), in
/// the order they read them (query_lane_floats). Tiled keys: (pairs, group,
/// 2), element 2j + e of head h at (j, h, e). Token rows
/// (scores_rows_tile_fp32): per chunk of 2 x phases widened slots, per half,
/// the chunk's first then second `phases` slots, lane (h, f) holding the
/// element of slot f of head half * heads + h (slot r of a line is its
/// element 2r, or 2(r - 16) + 1 from r = 16 on; zero past key_dim):
/// (chunks, halves, 2, 16).
void prepare_query_lanes(bool tiled, int group, int key_dim, const float* queries, float* query_lanes) {
  if (tiled) {
    for (int j = 0; j < key_dim / 2; ++j)
      for (int h = 0; h < group; ++h)
        for (int e = 0; e < 2; ++e) query_lanes[(j * group + h) * 2 + e] = queries[h * key_dim + 2 * j + e];
    return;
  }
  const auto [halves, heads, phases] = fp32_row_layout(group);
  for (int c = 0; c < widened_slots(key_dim) / (2 * phases); ++c)
    for (int half = 0; half < halves; ++half)
      for (int e = 0; e < 2; ++e)
        for (int f = 0; f < phases; ++f) {
          const int slot = 2 * phases * c + e * phases + f, r = slot % 32;
          const int element = slot - r + (r < 16 ? 2 * r : 2 * (r - 16) + 1);
          for (int h = 0; h < heads; ++h)
            query_lanes[((c * halves + half) * 2 + e) * 16 + h * phases + f] =
                element < key_dim ? queries[(half * heads + h) * key_dim + element] : 0.0f;
        }
}

/// Scores of tokens [first, first + count), keys in token rows, for `heads`
/// KV heads from s.kv_head on (w: one Work per head): 8 rows at a time, each
/// head in turn, so that the rows' bytes are read in address order (heads
/// share a token-major row). query_pairs are arranged per chunk of
/// token_row_phases(Group) pairs: lane h * phases + f holds pair
/// (chunk * phases + f) of head h.
template <int Group, bool Fp32>
__attribute__((noinline)) void scores_rows(const HostSegment<bf16>& s, int first, int count, Work* w, int heads,
                                           RowPrefetcher& ahead) {
  const BlockGeometry& g = s.geometry;
  const std::int64_t stride = g.key_token_stride(s.order);
  const std::int64_t head_stride = g.key_offset(s.order, 0, 1, 0) - g.key_offset(s.order, 0, 0, 0);
  const bf16* keys = s.block + g.key_offset(s.order, first, s.kv_head, 0);
  constexpr int phases = token_row_phases(Group);
  const int chunks = g.key_dim / (2 * phases);  // vdpbf16ps
  // The next pass's keys are requested evenly over the tiles' steps (chunks,
  // or pairs of chunks for vdpbf16ps' smaller groups).
  const int slots = widened_slots(g.key_dim);
  const int steps_per_tile = Fp32 ? slots / (2 * fp32_row_layout(Group).phases) : Group >= 8 ? chunks : chunks / 2;
  ahead.spread_over(std::int64_t{count / 8 + count % 8} * heads * steps_per_tile);
  // The fp32 tiles' widened rows: MLA's pass buffer (read again by the value
  // products), else an 8-row tile that stays in L1.
  alignas(64) float tile_rows[Fp32 ? 8 * max_key_dim : 1];
  // 8 tokens x 2 chunks (groups of 16: x 2 halves): 16 independent
  // accumulators (12 cover vdpbf16ps' latency x 2 ports); single tokens last.
  auto tile = [&](auto tokens, int t, int h) {
    constexpr int n = decltype(tokens)::value;
    const bf16* rows = keys + t * stride + h * head_stride;
    if constexpr (Fp32)
      scores_rows_tile_fp32<Group, n>(rows, stride, g.key_dim,
                                      w[h].widened_latent ? w[h].widened_latent + t * slots : tile_rows,
                                      w[h].query_lanes, s.scale, t, w[h], ahead);
    else if constexpr (Group >= 8)
      scores_rows_halves<phases, n>(rows, stride, chunks, w[h].query_pairs, s.scale, t, w[h], ahead);
    else scores_rows_tile<n>(rows, stride, chunks, w[h].query_pairs, s.scale, t, w[h], ahead);
  };
  int t = 0;
  for (; t + 8 <= count; t += 8)
    for (int h = 0; h < heads; ++h) tile(std::integral_constant<int, 8>{}, t, h);
  for (; t < count; ++t)
    for (int h = 0; h < heads; ++h) tile(std::integral_constant<int, 1>{}, t, h);
}

/// The next pass's value lines requested during one step of
/// exponentiate_heads (8 exponentials of 16 lanes), in value-product ticks
/// (token pairs, or tokens for the fp32 FMA products): a step takes about
/// 9.5 ticks' time (Qwen3 head-major in L2, Zen 4); about half that rate
/// read best from DRAM (against 2 and 8 ticks: within 1-3%).
constexpr int exponent_step_ticks = 4;

/// Softmax numerators of one pass for heads [h0, h0 + 4) with the online
/// update: rescales the running output when a head's maximum grows; writes
/// (p_t, p_t+1) bf16 pairs (or fp32 weights for the fp32 FMA products). The
/// four heads go side by side, so that their reductions and exponentials
/// (each a long dependency chain) overlap. `ahead` (the next pass's values)
/// ticks exponent_step_ticks times per step.
template <bool Fp32>
void exponentiate_heads(int h0, int count, int value_dim, float* o, Work& w, RowPrefetcher& ahead) {
  constexpr int heads = 4;
  const __mmask16 all = 0xffff;
  __m512 vmax[heads];
  WRITESCOPE_UNROLL(4)
  for (int h = 0; h < heads; ++h) vmax[h] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < count; i += 16) {
    const __mmask16 inside = count - i >= 16 ? all : static_cast<__mmask16>((1u << (count - i)) - 1u);
    WRITESCOPE_UNROLL(4)
    for (int h = 0; h < heads; ++h)
      vmax[h] = _mm512_mask_max_ps(vmax[h], inside, vmax[h], _mm512_loadu_ps(w.scores + (h0 + h) * pass_tokens + i));
  }
  __m512 m[heads], vsum[heads];
  WRITESCOPE_UNROLL(4)
  for (int h = 0; h < heads; ++h) {
    float& running = w.maxima[h0 + h];
    const float maximum = std::max(running, max16(vmax[h]));
    if (maximum > running && w.sums[h0 + h] > 0) {
      const float rescale = std::exp(running - maximum);
      w.sums[h0 + h] *= rescale;
      for (int d = 0; d < value_dim; ++d) o[(h0 + h) * value_dim + d] *= rescale;
    }
    running = maximum;
    m[h] = _mm512_set1_ps(maximum);
    vsum[h] = _mm512_setzero_ps();
  }
  for (int i = 0; i < count; i += 32) {
    for (int k = 0; k < exponent_step_ticks; ++k) ahead.tick();
    const __mmask16 low = count - i >= 16 ? all : static_cast<__mmask16>((1u << std::max(0, count - i)) - 1u);
    const __mmask16 high = count - i >= 32 ? all : static_cast<__mmask16>((1u << std::max(0, count - i - 16)) - 1u);
    WRITESCOPE_UNROLL(4)
    for (int h = 0; h < heads; ++h) {
      const float* row = w.scores + (h0 + h) * pass_tokens + i;
      const __m512 a = _mm512_maskz_mov_ps(low, exp16(_mm512_sub_ps(_mm512_loadu_ps(row), m[h])));
      const __m512 b = _mm512_maskz_mov_ps(high, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + 16), m[h])));
      vsum[h] = _mm512_add_ps(vsum[h], _mm512_add_ps(a, b));
      if constexpr (Fp32) {
        _mm512_storeu_ps(w.weights_fp32 + (h0 + h) * pass_tokens + i, a);
        _mm512_storeu_ps(w.weights_fp32 + (h0 + h) * pass_tokens + i + 16, b);
      } else {
        _mm512_storeu_si512(w.weights + (h0 + h) * (pass_tokens / 2) + i / 2,
                            reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
      }
    }
  }
  WRITESCOPE_UNROLL(4)
  for (int h = 0; h < heads; ++h) w.sums[h0 + h] += sum16(vsum[h]);
}

/// o(h, 32c + i) += dim i of the chunk's two accumulators acc[h][2c] and
/// acc[h][2c + 1], which hold dims 0-15 at the lanes `first` names
/// (permutex2var indices over the pair) and dims 16-31 at those of `second`.
template <int Heads, int Accumulators>
inline void add_value_tiles(const __m512 (&acc)[Heads][Accumulators], const std::int32_t* first,
                            const std::int32_t* second, float* o, int value_dim) {
  constexpr int Chunks = Accumulators / 2;
  const __m512i first_order = _mm512_load_si512(first), second_order = _mm512_load_si512(second);
  WRITESCOPE_UNROLL(16)
  for (int h = 0; h < Heads; ++h)
    WRITESCOPE_UNROLL(2)
    for (int c = 0; c < Chunks; ++c) {
      float* out = o + h * value_dim + 32 * c;
      const __m512 a = acc[h][2 * c], b = acc[h][2 * c + 1];
      _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), _mm512_permutex2var_ps(a, first_order, b)));
      _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_loadu_ps(out + 16), _mm512_permutex2var_ps(a, second_order, b)));
    }
}

/// o(h, :) += sum over token pairs of (p_t, p_t+1) . (v_t, v_t+1), values in
/// token rows: `Heads` heads x `Chunks` x 32 dims of accumulators in registers.
template <int Heads, int Chunks>
inline void values_tile(const bf16* values, std::int64_t stride, int count, const std::uint32_t* weights,
                        float* o, int value_dim, RowPrefetcher& ahead) {
  __m512 acc[Heads][2 * Chunks];
  zero(acc);
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  auto pair = [&](const bf16* first, const bf16* second, int k) {
    prefetch.tick();
    WRITESCOPE_UNROLL(4)
    for (int c = 0; c < Chunks; ++c) {
      __m512i a = _mm512_loadu_si512(first + 32 * c);
      __m512i b = second ? _mm512_loadu_si512(second + 32 * c) : _mm512_setzero_si512();
      in_register(a);
      in_register(b);
      const __m512i low = _mm512_unpacklo_epi16(a, b), high = _mm512_unpackhi_epi16(a, b);
      WRITESCOPE_UNROLL(16)
      for (int h = 0; h < Heads; ++h) {
        const __m512i p = _mm512_set1_epi32(static_cast<int>(weights[h * (pass_tokens / 2) + k]));
        acc[h][2 * c] = dot(acc[h][2 * c], low, p);
        acc[h][2 * c + 1] = dot(acc[h][2 * c + 1], high, p);
      }
    }
  };
  int k = 0;
  for (; 2 * k + 1 < count; ++k) pair(values + 2 * k * stride, values + (2 * k + 1) * stride, k);
  if (2 * k < count) pair(values + 2 * k * stride, nullptr, k);
  ahead.take_progress(prefetch);
  // Lane j of `low` in 128-bit lane L is dim 8L + j, of `high` dim 8L + 4 + j.
  alignas(64) static constexpr std::int32_t first_half[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr std::int32_t second_half[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                               12, 13, 14, 15, 28, 29, 30, 31};
  add_value_tiles(acc, first_half, second_half, o, value_dim);
}

/// values_tile with fp32 FMAs: each token row's 32-dim chunk widened once into
/// its even and odd dims, each head's weight p_t a broadcast from the fp32
/// weights (Heads, pass_tokens) folded into the FMA: no pairing of rows.
/// Rows of bf16 as stored, or of fp32 already widened (MLA's widened_latent:
/// no widening here, 2 of every 18 vector operations of the product).
template <int Heads, int Chunks, class Row>
inline void values_tile_fp32(const Row* values, std::int64_t stride, int count, const float* weights, float* o,
                             int value_dim, RowPrefetcher& ahead) {
  __m512 acc[Heads][2 * Chunks];  // (head, even / odd dims of each chunk)
  zero(acc);
  RowPrefetcher prefetch = ahead;  // a local copy stays in registers
  for (int t = 0; t < count; ++t) {
    prefetch.tick();
    WRITESCOPE_UNROLL(4)
    for (int c = 0; c < Chunks; ++c) {
      __m512 even, odd;
      if constexpr (std::is_same_v<Row, float>) {
        even = _mm512_load_ps(values + t * stride + 32 * c);
        odd = _mm512_load_ps(values + t * stride + 32 * c + 16);
      } else {
        __m512i line = _mm512_loadu_si512(values + t * stride + 32 * c);
        in_register(line);
        even = even_elements(line), odd = odd_elements(line);
      }
      WRITESCOPE_UNROLL(16)
      for (int h = 0; h < Heads; ++h) {
        const __m512 p = _mm512_set1_ps(weights[h * pass_tokens + t]);
        acc[h][2 * c] = _mm512_fmadd_ps(even, p, acc[h][2 * c]);
        acc[h][2 * c + 1] = _mm512_fmadd_ps(odd, p, acc[h][2 * c + 1]);
      }
    }
  }
  ahead.take_progress(prefetch);
  // Dims 2j and 2j + 1 of a chunk are lane j of its even and odd accumulators.
  alignas(64) static constexpr std::int32_t first_half[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  alignas(64) static constexpr std::int32_t second_half[16] = {8,  24, 9,  25, 10, 26, 11, 27,
                                                               12, 28, 13, 29, 14, 30, 15, 31};
  add_value_tiles(acc, first_half, second_half, o, value_dim);
}

/// The prefetch ticks of one head's value products over `count` tokens (in
/// Heads x Chunks register tiles): one per token pair per tile, or per token
/// for the fp32 FMA products.
template <int Heads, int Chunks, bool Fp32>
int value_ticks(const BlockGeometry& g, int group, int count) {
  return (group / Heads) * (g.value_dim / (32 * Chunks)) * (Fp32 ? count : (count + 1) / 2);
}

template <int Heads, int Chunks, bool Fp32>
__attribute__((noinline)) void values_rows(const HostSegment<bf16>& s, int first, int count, const Work& w, float* o,
                                           RowPrefetcher& ahead) {
  const BlockGeometry& g = s.geometry;
  const std::int64_t stride = g.value_token_stride(s.order);
  const bf16* values = s.block + g.value_offset(s.order, first, s.kv_head, 0);
  for (int h = 0; h < s.group; h += Heads)
    for (int d = 0; d < g.value_dim; d += 32 * Chunks) {
      float* out = o + h * g.value_dim + d;
      if constexpr (Fp32) {
        const float* weights = w.weights_fp32 + h * pass_tokens;
        if (w.widened_latent)
          values_tile_fp32<Heads, Chunks>(w.widened_latent + d, widened_slots(g.key_dim), count, weights, out,
                                          g.value_dim, ahead);
        else
          values_tile_fp32<Heads, Chunks>(values + d, stride, count, weights, out, g.value_dim, ahead);
      } else {
        values_tile<Heads, Chunks>(values + d, stride, count, w.weights + h * (pass_tokens / 2), out, g.value_dim,
                                   ahead);
      }
    }
}

/// The rows of tokens [first, first + count) of the block for `heads` KV
/// heads from s.kv_head on (several only in token-major rows): keys (tiles or
/// rows) or values, requested to `level`.
RowPrefetcher key_rows(const HostSegment<bf16>& s, int first, int count, int heads, PrefetchLevel level) {
  const BlockGeometry& g = s.geometry;
  if (count <= 0) return {};
  const bf16* start = s.block + g.key_offset(s.order, first, s.kv_head, 0);
  if (g.tiled_keys(s.order)) {
    const int tiles = (first + count - 1) / tile_tokens - first / tile_tokens + 1;
    const bf16* tile = s.block + g.key_offset(s.order, first - first % tile_tokens, s.kv_head, 0);
    return RowPrefetcher(tile, 0, static_cast<std::int64_t>(tiles) * tile_tokens * g.key_dim * sizeof(bf16), 1,
                         level);
  }
  return RowPrefetcher(start, g.key_token_stride(s.order) * sizeof(bf16),
                       std::int64_t{heads} * g.key_dim * sizeof(bf16), count, level);
}
RowPrefetcher value_rows(const HostSegment<bf16>& s, int first, int count, int heads, PrefetchLevel level) {
  const BlockGeometry& g = s.geometry;
  if (count <= 0 || g.values_in_keys) return {};
  return RowPrefetcher(s.block + g.value_offset(s.order, first, s.kv_head, 0),
                       g.value_token_stride(s.order) * sizeof(bf16), std::int64_t{heads} * g.value_dim * sizeof(bf16),
                       count, level);
}

/// Tokens per pass: the length measured for the shape and block order
/// (`requested_pass`, attention/host_prefetch.hpp), or where none is (0)
/// pass_tokens, and for token rows (GQA token-major) token_major_pass_rule:
/// with the next pass requested beside them, longer passes crowded L2 (Zen 4,
/// from DRAM, probe alternated in one process, medians: Qwen3 token-major, 4
/// heads, 64 tokens +6-16% (four rounds), 32 +2-6%; Mixtral token-major, 8
/// heads, 32 tokens +7-10%, 64 +2-4%; Zen 5: Qwen3 32 tokens +5-17% over 64
/// in fast memory periods). Head-major blocks, 64 KiB a pass, lost 4-8% at
/// 64 tokens on Zen 4 (next pass into L2); on Zen 5, with it into L1, 32
/// tokens led by 10-25%. MLA, one latent read by both products, keeps 128
/// (3-4% ahead of 64).
int pass_length(const BlockGeometry& g, bool tiled, int heads, int requested_pass) {
  if (g.values_in_keys) return pass_tokens;
  if (requested_pass > 0) return std::min(requested_pass, pass_tokens);
  if (tiled) return pass_tokens;
  return token_major_pass_rule(std::int64_t{heads} * (g.key_dim + g.value_dim) * std::int64_t{sizeof(bf16)});
}

/// The first 64-byte line of a buffer of floats allocated `line_floats` longer.
constexpr std::size_t line_floats = 16;
float* first_line(std::vector<float>& buffer) {
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (line_floats - address / sizeof(float) % line_floats) % line_floats;
}

/// The run for `heads` KV heads from run[0].kv_head on (one Work, one state
/// each): o (heads, Group, value_dim), lse (heads, Group). Products in
/// vdpbf16ps on query_pairs, or (Fp32) in fp32 FMAs on query_lanes (one per head).
template <int Group, bool Fp32>
void attend(const HostSegment<bf16>* run, int run_count, int heads, const std::uint32_t* const* query_pairs,
            const float* const* query_lanes, const HostSegment<bf16>* following, PrefetchLevel next_pass,
            int requested_pass, float* o, float* lse) {
  const BlockGeometry& g = run[0].geometry;
  const bool tiled = g.tiled_keys(run[0].order);
  // `next_pass`: for head-major blocks L2, as one stream, or L1, as the
  // machine's measurement chose (attention/host_prefetch.hpp; the launcher
  // applies impl::next_pass_level). Zen 4, 2 threads, from DRAM, probe
  // alternated in one process, 8-12 alternations, medians, L2 against L1:
  // Mixtral +19-31% on vdpbf16ps and +8-18% on fp32 FMAs (four parts), then
  // +6-8% from one stream; Qwen3 keys +3-8%, one stream +5-8%, its values
  // +6-9% more. Zen 5: Qwen3 and Mixtral -15 to -30%.
  const int pass = pass_length(g, tiled, heads, requested_pass);
  const int state = Group * g.value_dim;
  // The value products' register tiles: heads x 32-dim chunks.
  constexpr int value_heads = Group >= 8 ? 8 : Group, value_chunks = Group >= 8 ? 1 : 2;
  // Per thread, kept: a fresh vector per run zeroed 17 KB per head (and
  // faulted pages in) for state that every pass overwrites.
  thread_local std::vector<Work> w;
  if (static_cast<int>(w.size()) < heads) w.resize(heads);
  // MLA on fp32 FMAs: the pass's latent widened once, for scores and values.
  const bool widen_latent = Fp32 && g.values_in_keys && !tiled;
  const auto latent_floats = static_cast<std::size_t>(pass_tokens * widened_slots(g.key_dim));
  // Per thread, kept: zeroing or mapping 300 KB per run cost 2% of MLA's.
  thread_local std::vector<float> widened_latent;
  if (widen_latent && widened_latent.size() < heads * latent_floats + line_floats)
    widened_latent.resize(heads * latent_floats + line_floats);
  for (int h = 0; h < heads; ++h) {
    w[h].query_pairs = Fp32 ? nullptr : query_pairs[h];
    w[h].query_lanes = Fp32 ? query_lanes[h] : nullptr;
    w[h].widened_latent = widen_latent ? first_line(widened_latent) + h * latent_floats : nullptr;
    std::fill(w[h].maxima, w[h].maxima + Group, -std::numeric_limits<float>::infinity());
    std::fill(w[h].sums, w[h].sums + Group, 0.0f);
  }
  std::fill(o, o + heads * state, 0.0f);
  for (int r = 0; r < run_count; ++r) {
    const HostSegment<bf16>& s = run[r];
    const HostSegment<bf16>* after = r + 1 < run_count ? &run[r + 1] : following;
    const int end = s.token_begin + s.token_count;
    for (int first = s.token_begin; first < end;) {
      const int next = std::min(end, (first / pass + 1) * pass);
      const int count = next - first;
      // What the next pass reads: of this segment, or the first pass of the
      // segment this thread attends next.
      const HostSegment<bf16>& ahead = next < end || after == nullptr ? s : *after;
      const int ahead_first = next < end ? next : ahead.token_begin;
      const int ahead_count =
          std::min(ahead.token_begin + ahead.token_count, (ahead_first / pass + 1) * pass) - ahead_first;
      // MLA's values are its keys: half of the next pass's rows are requested
      // during each product, so that memory streams through the whole pass.
      const int during_scores = g.values_in_keys ? ahead_count / 2 : ahead_count;
      RowPrefetcher next_keys = key_rows(ahead, ahead_first, during_scores, heads, next_pass),
                    next_values = g.values_in_keys ? key_rows(ahead, ahead_first + during_scores,
                                                              ahead_count - during_scores, heads, next_pass)
                                                   : value_rows(ahead, ahead_first, ahead_count, heads, next_pass);
      if (tiled) scores_tiled<Group, Fp32>(s, first, count, w[0], next_keys);
      else scores_rows<Group, Fp32>(s, first, count, w.data(), heads, next_keys);
      next_keys.finish();
      // The next pass's values (or the rest of MLA's latent) are requested
      // over every head's exponentials and value products: with requests in
      // the value products only, memory idled during the exponentials (Zen
      // 4, from DRAM, three rounds of eight alternations, medians: Qwen3
      // head-major +5-7%, token-major +4-7%, Mixtral -2 to +5%).
      const int exponent_steps = Group / 4 * ((count + 31) / 32);
      next_values.spread_over(std::int64_t{heads} * (exponent_steps * exponent_step_ticks +
                                                      value_ticks<value_heads, value_chunks, Fp32>(g, Group, count)));
      for (int h = 0; h < heads; ++h) {
        HostSegment<bf16> head = s;
        head.kv_head += h;
        float* head_o = o + h * state;
        for (int h0 = 0; h0 < Group; h0 += 4)
          exponentiate_heads<Fp32>(h0, count, g.value_dim, head_o, w[h], next_values);
        values_rows<value_heads, value_chunks, Fp32>(head, first, count, w[h], head_o, next_values);
      }
      next_values.finish();
      first = next;
    }
  }
  for (int h = 0; h < heads; ++h)
    for (int q = 0; q < Group; ++q) {
      const float inverse = 1.0f / w[h].sums[q];
      float* row = o + h * state + q * g.value_dim;
      for (int d = 0; d < g.value_dim; ++d) row[d] *= inverse;
      lse[h * Group + q] = w[h].maxima[q] + std::log(w[h].sums[q]);
    }
}

}  // namespace

bool avx512_takes(const BlockGeometry& g, BlockOrder order, int group) {
  if (group != 4 && group != 8 && group != 16) return false;
  if (g.key_dim > max_key_dim || g.value_dim > max_value_dim) return false;
  const int value_tile = group >= 8 ? 32 : 64;
  if (g.value_dim % value_tile != 0) return false;
  // Tiled keys in whole pairs of pairs: scores_tiles' two chains.
  if (g.tiled_keys(order)) return g.key_dim % 4 == 0 && g.key_tile_tokens() == tile_tokens;
  return g.key_dim % (2 * token_row_phases(group)) == 0;
}

void prepare_query_pairs_avx512_bf16(const BlockGeometry& g, BlockOrder order, int group, const float* queries,
                                     std::uint32_t* query_pairs) {
  const int pairs = g.key_dim / 2;
  // Each head's (q_2j, q_2j+1) pairs, 16 at a time.
  alignas(64) std::uint32_t rows[max_group * max_key_dim / 2];
  for (int h = 0; h < group; ++h) {
    const float* q = queries + h * g.key_dim;
    std::uint32_t* row = rows + h * pairs;
    int j = 0;
    for (; j + 16 <= pairs; j += 16) {
      const __m512 first = _mm512_loadu_ps(q + 2 * j), second = _mm512_loadu_ps(q + 2 * j + 16);
      _mm512_storeu_si512(row + j, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(second, first)));
    }
    for (; j < pairs; ++j) row[j] = bf16_pair(q[2 * j], q[2 * j + 1]);
  }
  if (g.tiled_keys(order)) {
    // Pair j of every head together: one pointer reaches a step's pairs.
    for (int j = 0; j < pairs; ++j)
      for (int h = 0; h < group; ++h) query_pairs[j * group + h] = rows[h * pairs + j];
    return;
  }
  // Token rows: chunk c holds lanes (h, f) = pair c * phases + f of head h
  // (groups of 16: heads 0-7, then 8-15, in two vectors).
  const int phases = token_row_phases(group), lanes = group * phases;
  for (int c = 0; c < pairs / phases; ++c)
    for (int h = 0; h < group; ++h)
      for (int f = 0; f < phases; ++f) query_pairs[lanes * c + h * phases + f] = rows[h * pairs + c * phases + f];
}

int query_lane_floats(int group, int key_dim) { return group * widened_slots(key_dim); }

void prepare_query_lanes_avx512_fma(const BlockGeometry& g, BlockOrder order, int group, const float* queries,
                                    float* query_lanes) {
  prepare_query_lanes(g.tiled_keys(order), group, g.key_dim, queries, query_lanes);
}

namespace {

/// attend for the run's group (avx512_takes admits 4, 8 and 16).
template <bool Fp32>
void attend_group(const HostSegment<bf16>* run, int count, int heads, const std::uint32_t* const* query_pairs,
                  const float* const* query_lanes, const HostSegment<bf16>* following, PrefetchLevel next_pass,
                  int requested_pass, float* o, float* lse) {
  switch (run[0].group) {
    case 4:
      return attend<4, Fp32>(run, count, heads, query_pairs, query_lanes, following, next_pass, requested_pass, o, lse);
    case 8:
      return attend<8, Fp32>(run, count, heads, query_pairs, query_lanes, following, next_pass, requested_pass, o, lse);
    default:
      return attend<16, Fp32>(run, count, heads, query_pairs, query_lanes, following, next_pass, requested_pass, o, lse);
  }
}

}  // namespace

void host_run_attention_avx512_bf16(const HostSegment<bf16>* run, int count, int heads,
                                    const std::uint32_t* const* query_pairs, const HostSegment<bf16>* following,
                                    PrefetchLevel next_pass, int requested_pass, float* o, float* lse) {
  attend_group<false>(run, count, heads, query_pairs, nullptr, following, next_pass, requested_pass, o, lse);
}

void host_run_attention_avx512_fma(const HostSegment<bf16>* run, int count, int heads,
                                   const float* const* query_lanes, const HostSegment<bf16>* following,
                                   PrefetchLevel next_pass, int requested_pass, float* o, float* lse) {
  attend_group<true>(run, count, heads, nullptr, query_lanes, following, next_pass, requested_pass, o, lse);
}

}  // namespace writescope::impl

#pragma GCC pop_options

#endif  // WRITESCOPE_HOST_AVX512_BF16
