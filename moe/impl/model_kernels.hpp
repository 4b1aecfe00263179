#pragma once
// Element-wise kernels of the model runtime (model.cpp).

#include <Kokkos_Core.hpp>

#include "framework/bf16.hpp"
#include "framework/hash.hpp"
#include "framework/spaces.hpp"
#include "moe/layer_kernels.hpp"

namespace writescope {
namespace impl {

/// x(b, c) = embedding(tokens(b), c)
template <class MemSpace>
struct EmbedRows {
  Matrix<MemSpace> x;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> embedding;
  Kokkos::View<const int*, MemSpace> tokens;
  KOKKOS_INLINE_FUNCTION void operator()(int b, int c) const { x(b, c) = to_float(embedding(tokens(b), c)); }
};

/// found() = 1 if any x(b, c) is NaN or Inf (v - v is 0 for finite v only).
template <class MemSpace>
struct FlagNonFinite {
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  Kokkos::View<int, MemSpace> found;
  KOKKOS_INLINE_FUNCTION void operator()(int b, int c) const {
    const float v = x(b, c);
    if (!(v - v == 0.0f)) found() = 1;
  }
};

/// packed(b, c) = bf16(x(b, c)): one token's keys or values per row, as the cache stores them.
template <class MemSpace>
struct PackBf16 {
  Kokkos::View<bf16**, Kokkos::LayoutStride, MemSpace> packed;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const { packed(r, c) = from_float<bf16>(x(r, c)); }
};

/// MLA, absorbed: queries(b, h, l) = sum_d w_kb(h, d, l) q_nope(b, h, d) for the
/// latent part, and the roped q_pe copied after it.
///   q: (batch, heads * (nope + rope)), kv_b: (heads * (nope + v), latent),
///   queries: (batch, heads, latent + rope)
template <class MemSpace, int Span>
struct AbsorbQueries {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> q;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> kv_b;
  int heads, nope, rope, value_dim, latent;
  /// Columns [span * Span, span * Span + Span) of queries(b, h, :): the sum
  /// over d walks rows of kv_b, each read as a contiguous span of columns
  /// (vectorised on the host; Span 1 on GPUs, whose neighbouring threads read
  /// neighbouring columns).
  KOKKOS_INLINE_FUNCTION void operator()(int bh, int span) const {
    const int b = bh / heads, h = bh % heads;
    const int q0 = h * (nope + rope), first = span * Span;
    const int end = first + Span < latent ? first + Span : latent;
    if (end - first == Span) {
      // A whole span: one branch-free loop the host vectorises.
      float sum[Span] = {};
      for (int d = 0; d < nope; ++d) {
        const float qd = q(b, q0 + d);
        const bf16* row = &kv_b(h * (nope + value_dim) + d, first);
        for (int j = 0; j < Span; ++j) sum[j] += to_float(row[j]) * qd;
      }
      for (int j = 0; j < Span; ++j) queries(b, h, first + j) = sum[j];
    } else {
      for (int l = first; l < end; ++l) {
        float sum = 0;
        for (int d = 0; d < nope; ++d) sum += to_float(kv_b(h * (nope + value_dim) + d, l)) * q(b, q0 + d);
        queries(b, h, l) = sum;
      }
    }
    for (int l = first > latent ? first : latent; l < first + Span && l < latent + rope; ++l)
      queries(b, h, l) = q(b, q0 + nope + (l - latent));
  }
};

/// MLA, absorbed: values(b, h * v + d) = sum_l w_vb(h, d, l) o_latent(b, h, l).
template <class MemSpace, int Lanes>
struct ExpandValues {
  Matrix<MemSpace> values;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> o_latent;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> kv_b;
  int heads, nope, value_dim, latent;
  /// The sum over l in `Lanes` interleaved partial sums (independent, so the
  /// host vectorises them; 1 on GPUs), added up at the end.
  KOKKOS_INLINE_FUNCTION void operator()(int bh, int d) const {
    const int b = bh / heads, h = bh % heads;
    const bf16* row = &kv_b(h * (nope + value_dim) + nope + d, 0);
    const float* o = &o_latent(b, h, 0);
    float partial[Lanes] = {};
    int l = 0;
    for (; l + Lanes <= latent; l += Lanes)
      for (int j = 0; j < Lanes; ++j) partial[j] += to_float(row[l + j]) * o[l + j];
    float sum = 0;
    for (int j = 0; j < Lanes; ++j) sum += partial[j];
    for (; l < latent; ++l) sum += to_float(row[l]) * o[l];
    values(b, h * value_dim + d) = sum;
  }
};

/// The cached MLA row: the normalised latent, then the roped k_pe.
template <class MemSpace>
struct PackLatentRow {
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> packed;  // (batch, latent + rope)
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> latent;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> compressed;  // (batch, latent + rope), k_pe roped
  KOKKOS_INLINE_FUNCTION void operator()(int b, int c) const {
    const int width = static_cast<int>(latent.extent(1));
    packed(b, c) = from_float<bf16>(c < width ? latent(b, c) : compressed(b, c));
  }
};

/// MLA, decompressed: rows(t, :) = the cached latent row t (latent + rope
/// bf16 elements), gathered from a pool at element offset starts(t).
template <class MemSpace>
struct GatherLatentRows {
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> rows;  // (tokens, latent + rope)
  const bf16* pool;
  Kokkos::View<const std::int64_t*, MemSpace> starts;  // (tokens): element offset of row t in the pool
  KOKKOS_INLINE_FUNCTION void operator()(int t, int c) const { rows(t, c) = pool[starts(t) + c]; }
};

/// MLA, decompressed: latent(t, l) = rows(t, l) in float, l < latent.
template <class MemSpace>
struct WidenLatent {
  Kokkos::View<float**, Kokkos::LayoutRight, MemSpace> latent;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> rows;
  KOKKOS_INLINE_FUNCTION void operator()(int t, int l) const { latent(t, l) = to_float(rows(t, l)); }
};

/// MLA, decompressed: per head, keys (t, h, :) = [k_nope, k_pe] and values
/// (t, h, :) = v from expanded(t, h * (nope + v) + :) = kv_b_proj(latent) and
/// the cached (roped) k_pe of rows(t, latent:).
template <class MemSpace>
struct SplitExpanded {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> keys;    // (tokens, heads, nope + rope)
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> values;  // (tokens, heads, v)
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> expanded;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> rows;
  int heads, nope, rope, value_dim, latent;
  KOKKOS_INLINE_FUNCTION void operator()(int th, int c) const {
    const int t = th / heads, h = th % heads;
    if (c < nope) keys(t, h, c) = expanded(t, h * (nope + value_dim) + c);
    else if (c < nope + rope) keys(t, h, c) = to_float(rows(t, latent + c - nope));
    else values(t, h, c - nope - rope) = expanded(t, h * (nope + value_dim) + nope + (c - nope - rope));
  }
};

/// rows(t, c) = a hash of (stream, first_token + t, c) mapped to [-1, 1).
struct SyntheticRows {
  Kokkos::View<bf16**, Kokkos::LayoutRight, GpuMemSpace> rows;
  std::uint64_t stream;
  std::int64_t first_token;
  KOKKOS_INLINE_FUNCTION void operator()(int t, int c) const {
    const std::uint64_t element = static_cast<std::uint64_t>(first_token + t) * rows.extent(1) + c;
    const std::uint64_t z = splitmix64(stream ^ splitmix64(element));
    rows(t, c) = from_float<bf16>(static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
};

}  // namespace impl
}  // namespace writescope
