#pragma once

#include <stdexcept>

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

/// x += y
template <class MemSpace>
struct AddInPlace {
  Matrix<MemSpace> x;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> y;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const { x(r, c) += y(r, c); }
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
template <class MemSpace>
struct AbsorbQueries {
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> q;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> kv_b;
  int heads, nope, rope, value_dim, latent;
  KOKKOS_INLINE_FUNCTION void operator()(int bh, int l) const {
    const int b = bh / heads, h = bh % heads;
    const int q0 = h * (nope + rope);
    if (l < latent) {
      float sum = 0;
      for (int d = 0; d < nope; ++d) sum += to_float(kv_b(h * (nope + value_dim) + d, l)) * q(b, q0 + d);
      queries(b, h, l) = sum;
    } else {
      queries(b, h, l) = q(b, q0 + nope + (l - latent));
    }
  }
};

/// MLA, absorbed: values(b, h * v + d) = sum_l w_vb(h, d, l) o_latent(b, h, l).
template <class MemSpace>
struct ExpandValues {
  Matrix<MemSpace> values;
  Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> o_latent;
  Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace> kv_b;
  int heads, nope, value_dim, latent;
  KOKKOS_INLINE_FUNCTION void operator()(int bh, int d) const {
    const int b = bh / heads, h = bh % heads;
    float sum = 0;
    for (int l = 0; l < latent; ++l) sum += to_float(kv_b(h * (nope + value_dim) + nope + d, l)) * o_latent(b, h, l);
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

template <class MemSpace, class HostValues>
auto to_space(const char* label, const HostValues& values, std::size_t rows, std::size_t columns) {
  Kokkos::View<bf16**, Kokkos::LayoutRight, Kokkos::HostSpace> host(std::string(label), rows, columns);
  std::copy(values.begin(), values.end(), host.data());
  return Kokkos::create_mirror_view_and_copy(MemSpace(), host);
}

}  // namespace impl

template <class ExecSpace>
MoeModel<ExecSpace>::MoeModel(const ModelConfig& config, const std::vector<std::vector<bf16>>& weights,
                              int block_tokens, const KVCacheBudgets& budgets, BlockPlacement placement)
    : config_(config), shape_(config.attention()), placement_(std::move(placement)) {
  config_.validate();
  const auto specs = weight_specs(config_);
  if (specs.size() != weights.size())
    throw std::invalid_argument("model " + config_.name + ": " + std::to_string(weights.size()) +
                                " weight tensors for " + std::to_string(specs.size()) + " specs");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    if (static_cast<std::int64_t>(weights[i].size()) != spec.elements())
      throw std::invalid_argument("model " + config_.name + ": tensor '" + spec.name + "' has the wrong size");
    if (spec.is_norm) {
      Kokkos::View<float*, Kokkos::HostSpace> host("writescope::moe::norm", weights[i].size());
      for (std::size_t k = 0; k < weights[i].size(); ++k) host(k) = to_float(weights[i][k]);
      norms_[spec.name] = Kokkos::create_mirror_view_and_copy(MemSpace(), host);
    } else {
      weights_[spec.name] = impl::to_space<MemSpace>("writescope::moe::weight", weights[i], spec.shape[0], spec.shape[1]);
    }
  }
  const bool mixtral = config_.architecture == Architecture::mixtral;
  for (int layer = 0; layer < config_.layers; ++layer) {
    const std::string moe = "model.layers." + std::to_string(layer) + (mixtral ? ".block_sparse_moe." : ".mlp.");
    if (layer < config_.dense_layers) {
      dense_.push_back(ExpertWeights<bf16, MemSpace>{weight(moe + "gate_proj.weight"), weight(moe + "up_proj.weight"),
                                                     weight(moe + "down_proj.weight")});
      continue;
    }
    std::vector<ExpertWeights<bf16, MemSpace>> shared;
    if (config_.shared_experts > 0)
      shared.push_back(ExpertWeights<bf16, MemSpace>{weight(moe + "shared_experts.gate_proj.weight"),
                                                     weight(moe + "shared_experts.up_proj.weight"),
                                                     weight(moe + "shared_experts.down_proj.weight")});
    std::vector<ExpertWeights<bf16, MemSpace>> experts;
    for (int e = 0; e < config_.experts; ++e) {
      const std::string p = moe + "experts." + std::to_string(e) + ".";
      experts.push_back(mixtral ? ExpertWeights<bf16, MemSpace>{weight(p + "w1.weight"), weight(p + "w3.weight"),
                                                                 weight(p + "w2.weight")}
                                : ExpertWeights<bf16, MemSpace>{weight(p + "gate_proj.weight"),
                                                                 weight(p + "up_proj.weight"),
                                                                 weight(p + "down_proj.weight")});
    }
    feed_forward_.emplace_back(weight(moe + "gate.weight"), std::move(experts), std::move(shared),
                               config_.experts_per_token,
                               config_.normalize_topk ? RouterKind::normalized_topk : RouterKind::scaled_topk,
                               config_.routed_scaling_factor);
  }
  cache_ = std::make_unique<InplaceKVCache<bf16>>(KVCacheShape{config_.layers, shape_.block_geometry(block_tokens)},
                                                  budgets, BudgetPolicy::strict);
  const RotaryEmbedding rope = RotaryEmbedding::for_model(config_);
  Kokkos::View<double*, Kokkos::HostSpace> frequencies("writescope::moe::inverse_frequencies",
                                                       rope.inverse_frequencies.size());
  std::copy(rope.inverse_frequencies.begin(), rope.inverse_frequencies.end(), frequencies.data());
  inverse_frequencies_ = Kokkos::create_mirror_view_and_copy(MemSpace(), frequencies);
  rope_scale_ = static_cast<float>(rope.scale);
}

template <class ExecSpace>
MoeModel<ExecSpace> MoeModel<ExecSpace>::synthetic(const ModelConfig& config, std::uint64_t seed, int block_tokens,
                                                   const KVCacheBudgets& budgets, BlockPlacement placement) {
  std::vector<std::vector<bf16>> weights;
  for (const TensorSpec& spec : weight_specs(config)) weights.push_back(synthetic_tensor<bf16>(spec, seed));
  return MoeModel(config, weights, block_tokens, budgets, std::move(placement));
}

template <class ExecSpace>
const typename MoeModel<ExecSpace>::Weight& MoeModel<ExecSpace>::weight(const std::string& name) const {
  return weights_.at(name);
}

template <class ExecSpace>
const typename MoeModel<ExecSpace>::Norm& MoeModel<ExecSpace>::norm(const std::string& name) const {
  return norms_.at(name);
}

template <class ExecSpace>
std::vector<TokenRange> MoeModel<ExecSpace>::append(int layer, const std::vector<int>& sequences,
                                                    const Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace>& rows) {
  const ExecSpace space;
  const BlockGeometry& g = cache_->geometry();
  std::vector<TokenRange> ranges;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    const int sequence = sequences[b];
    std::vector<Region> regions;
    const int opened = static_cast<int>(cache_->block_regions(layer, sequence).size());
    for (int n = 0; n < cache_->new_blocks_needed(layer, sequence, 1); ++n)
      regions.push_back(placement_(layer, sequence, opened + n));
    using Token = Kokkos::View<const bf16***, Kokkos::LayoutRight, MemSpace>;
    const bf16* keys = &rows(b, 0);
    const bf16* values = g.values_in_keys ? keys : keys + std::int64_t{g.kv_heads} * g.key_dim;
    cache_->append<ExecSpace, MemSpace>(space, layer, sequence, Token(keys, 1, g.kv_heads, g.key_dim),
                                        Token(values, 1, g.kv_heads, g.value_dim), regions);
    ranges.push_back(TokenRange{0, cache_->length(layer, sequence)});
  }
  return ranges;
}

template <class ExecSpace>
void MoeModel<ExecSpace>::attend(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                                 const Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace>& queries,
                                 const PartialState<MemSpace>& merged) {
  const ExecSpace space;
  clear(space, merged);
  auto attend_region = [&](Region region, const auto& pool) {
    using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
    const auto segments = cache_->segments(layer, region, sequences, ranges);
    if (segments.empty()) return;
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible) {
      PartialState<MemSpace> part("writescope::moe::attention_part", merged.batch(), merged.q_heads(),
                                  merged.value_dim());
      decode_attention<ExecSpace, bf16, PoolSpace>(space, shape_, cache_->geometry(), block_order(region), queries,
                                                   pool, segments, workspace_, part);
      merge_into(space, merged, part);
    } else {
      throw std::runtime_error(std::string("model: ") + ExecSpace::name() + " cannot read " + region_name(region) +
                               " blocks; place them where it can, or use the split executor");
    }
  };
  attend_region(Region::gpu_resident, cache_->vram_pool());
  attend_region(Region::gpu_streamed, cache_->pinned_pool());
  attend_region(Region::cpu_streamed, cache_->pinned_pool());
  attend_region(Region::cpu_resident, cache_->host_pool());
}

template <class ExecSpace>
void MoeModel<ExecSpace>::mla_attention(int layer, const std::vector<int>& sequences, const Matrix<MemSpace>& h,
                                        const Matrix<MemSpace>& out) {
  const ExecSpace space;
  const ModelConfig& c = config_;
  const int batch = static_cast<int>(sequences.size());
  const int heads = c.q_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vdim = c.v_head_dim,
            latent = c.kv_lora_rank;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  Matrix<MemSpace> q("writescope::moe::q", batch, heads * (nope + rope));
  if (c.q_lora_rank > 0) {
    Matrix<MemSpace> compressed_q("writescope::moe::q_a", batch, c.q_lora_rank);
    linear<ExecSpace, bf16>(space, h, weight(p + "q_a_proj.weight"), compressed_q);
    rms_norm(space, compressed_q, norm(p + "q_a_layernorm.weight"), c.q_lora_rank, c.rms_eps);
    linear<ExecSpace, bf16>(space, compressed_q, weight(p + "q_b_proj.weight"), q);
  } else {
    linear<ExecSpace, bf16>(space, h, weight(p + "q_proj.weight"), q);
  }
  Matrix<MemSpace> compressed("writescope::moe::kv_a", batch, latent + rope), normed("writescope::moe::latent", batch, latent);
  linear<ExecSpace, bf16>(space, h, weight(p + "kv_a_proj_with_mqa.weight"), compressed);
  Kokkos::deep_copy(space, normed, Kokkos::subview(compressed, Kokkos::ALL, std::make_pair(0, latent)));
  rms_norm(space, normed, norm(p + "kv_a_layernorm.weight"), latent, c.rms_eps);
  const auto positions = positions_of(layer, sequences);
  apply_rope(space, q, positions, inverse_frequencies_, rope_scale_, nope, nope + rope, rope, true);
  apply_rope(space, compressed, positions, inverse_frequencies_, rope_scale_, latent, latent + rope, rope, true);
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> rows("writescope::moe::latent_rows", batch, latent + rope);
  Kokkos::parallel_for("writescope::moe::pack_latent", impl::rows_by_columns(space, batch, latent + rope),
                       impl::PackLatentRow<MemSpace>{rows, normed, compressed});
  space.fence();
  const auto ranges = append(layer, sequences, rows);

  const auto& kv_b = weight(p + "kv_b_proj.weight");
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries("writescope::moe::mla_queries", batch, heads,
                                                                latent + rope);
  Kokkos::parallel_for("writescope::moe::absorb_queries", impl::rows_by_columns(space, batch * heads, latent + rope),
                       impl::AbsorbQueries<MemSpace>{queries, q, kv_b, heads, nope, rope, vdim, latent});
  PartialState<MemSpace> merged("writescope::moe::attention", batch, heads, latent);
  attend(layer, sequences, ranges, queries, merged);
  Matrix<MemSpace> values("writescope::moe::mla_values", batch, heads * vdim);
  Kokkos::parallel_for("writescope::moe::expand_values", impl::rows_by_columns(space, batch * heads, vdim),
                       impl::ExpandValues<MemSpace>{values, merged.o, kv_b, heads, nope, vdim, latent});
  linear<ExecSpace, bf16>(space, values, weight(p + "o_proj.weight"), out);
}

template <class ExecSpace>
Kokkos::View<const std::int64_t*, typename ExecSpace::memory_space> MoeModel<ExecSpace>::positions_of(
    int layer, const std::vector<int>& sequences) const {
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> positions("writescope::moe::positions", sequences.size());
  for (std::size_t b = 0; b < sequences.size(); ++b) positions(b) = cache_->length(layer, sequences[b]);
  return Kokkos::create_mirror_view_and_copy(MemSpace(), positions);
}

template <class ExecSpace>
void MoeModel<ExecSpace>::attention(int layer, const std::vector<int>& sequences, const Matrix<MemSpace>& h,
                                    const Matrix<MemSpace>& out) {
  if (config_.mla()) return mla_attention(layer, sequences, h, out);
  const ExecSpace space;
  const int batch = static_cast<int>(sequences.size());
  const int hd = config_.head_dim, qh = config_.q_heads, kvh = config_.kv_heads;
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  Matrix<MemSpace> q("writescope::moe::q", batch, qh * hd), k("writescope::moe::k", batch, kvh * hd),
      v("writescope::moe::v", batch, kvh * hd);
  linear<ExecSpace, bf16>(space, h, weight(p + "q_proj.weight"), q);
  linear<ExecSpace, bf16>(space, h, weight(p + "k_proj.weight"), k);
  linear<ExecSpace, bf16>(space, h, weight(p + "v_proj.weight"), v);
  if (config_.qk_norm) {
    rms_norm(space, q, norm(p + "q_norm.weight"), hd, config_.rms_eps);
    rms_norm(space, k, norm(p + "k_norm.weight"), hd, config_.rms_eps);
  }
  const auto positions = positions_of(layer, sequences);
  apply_rope(space, q, positions, inverse_frequencies_, rope_scale_, 0, hd, hd, false);
  apply_rope(space, k, positions, inverse_frequencies_, rope_scale_, 0, hd, hd, false);

  // This step's keys and values as the cache stores them: one row of keys then values per sequence.
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> rows("writescope::moe::kv_rows", batch, 2 * kvh * hd);
  Kokkos::parallel_for("writescope::moe::pack_keys", impl::rows_by_columns(space, batch, kvh * hd),
                       impl::PackBf16<MemSpace>{Kokkos::subview(rows, Kokkos::ALL, std::make_pair(0, kvh * hd)), k});
  Kokkos::parallel_for("writescope::moe::pack_values", impl::rows_by_columns(space, batch, kvh * hd),
                       impl::PackBf16<MemSpace>{Kokkos::subview(rows, Kokkos::ALL, std::make_pair(kvh * hd, 2 * kvh * hd)), v});
  space.fence();
  const auto ranges = append(layer, sequences, rows);
  const Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> queries(q.data(), batch, qh, hd);
  PartialState<MemSpace> merged("writescope::moe::attention", batch, qh, hd);
  attend(layer, sequences, ranges, queries, merged);
  const Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> attended(merged.o.data(), batch, qh * hd);
  linear<ExecSpace, bf16>(space, attended, weight(p + "o_proj.weight"), out);
}

template <class ExecSpace>
std::vector<std::vector<float>> MoeModel<ExecSpace>::step(const std::vector<int>& sequences,
                                                          const std::vector<int>& tokens) {
  if (sequences.size() != tokens.size() || sequences.empty())
    throw std::invalid_argument("model: step needs one token per sequence");
  for (int token : tokens)
    if (token < 0 || token >= config_.vocab)
      throw std::invalid_argument("model: token " + std::to_string(token) + " outside the vocabulary of " +
                                  std::to_string(config_.vocab));
  const ExecSpace space;
  const int batch = static_cast<int>(sequences.size()), hidden = config_.hidden;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const auto token_view = Kokkos::create_mirror_view_and_copy(
      MemSpace(), Kokkos::View<const int*, Kokkos::HostSpace, Unmanaged>(tokens.data(), tokens.size()));
  Matrix<MemSpace> x("writescope::moe::x", batch, hidden), h("writescope::moe::h", batch, hidden),
      branch("writescope::moe::branch", batch, hidden);
  Kokkos::parallel_for("writescope::moe::embed", impl::rows_by_columns(space, batch, hidden),
                       impl::EmbedRows<MemSpace>{x, weight("model.embed_tokens.weight"), token_view});
  for (int layer = 0; layer < config_.layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    Kokkos::deep_copy(space, h, x);
    rms_norm(space, h, norm(p + "input_layernorm.weight"), hidden, config_.rms_eps);
    attention(layer, sequences, h, branch);
    Kokkos::parallel_for("writescope::moe::residual", impl::rows_by_columns(space, batch, hidden),
                         impl::AddInPlace<MemSpace>{x, branch});
    Kokkos::deep_copy(space, h, x);
    rms_norm(space, h, norm(p + "post_attention_layernorm.weight"), hidden, config_.rms_eps);
    if (layer < config_.dense_layers)
      swiglu_expert<ExecSpace, bf16>(space, dense_[layer], h, branch, dense_scratch_);
    else
      feed_forward_[layer - config_.dense_layers](space, h, branch);
    Kokkos::parallel_for("writescope::moe::residual", impl::rows_by_columns(space, batch, hidden),
                         impl::AddInPlace<MemSpace>{x, branch});
  }
  rms_norm(space, x, norm("model.norm.weight"), hidden, config_.rms_eps);
  Matrix<MemSpace> logits("writescope::moe::logits", batch, config_.vocab);
  linear<ExecSpace, bf16>(space, x,
                          weight(config_.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), logits);
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), logits);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) out[b].assign(&host(b, 0), &host(b, 0) + config_.vocab);
  return out;
}

}  // namespace writescope
