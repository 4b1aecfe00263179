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
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> packed;
  Kokkos::View<const float**, Kokkos::LayoutRight, MemSpace> x;
  KOKKOS_INLINE_FUNCTION void operator()(int r, int c) const { packed(r, c) = from_float<bf16>(x(r, c)); }
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
  if (config_.mla())
    throw std::invalid_argument("model " + config_.name +
                                ": the Kokkos runtime does not run MLA (DeepSeek-V2) yet; use the reference model");
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
    std::vector<ExpertWeights<bf16, MemSpace>> experts;
    for (int e = 0; e < config_.experts; ++e) {
      const std::string p = moe + "experts." + std::to_string(e) + ".";
      experts.push_back(mixtral ? ExpertWeights<bf16, MemSpace>{weight(p + "w1.weight"), weight(p + "w3.weight"),
                                                                 weight(p + "w2.weight")}
                                : ExpertWeights<bf16, MemSpace>{weight(p + "gate_proj.weight"),
                                                                 weight(p + "up_proj.weight"),
                                                                 weight(p + "down_proj.weight")});
    }
    feed_forward_.emplace_back(weight(moe + "gate.weight"), std::move(experts),
                               std::vector<ExpertWeights<bf16, MemSpace>>{}, config_.experts_per_token,
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
void MoeModel<ExecSpace>::attention(int layer, const std::vector<int>& sequences, const Matrix<MemSpace>& h,
                                    const Matrix<MemSpace>& out) {
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
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> positions_host("writescope::moe::positions", batch);
  for (int b = 0; b < batch; ++b) positions_host(b) = cache_->length(layer, sequences[b]);
  const auto positions = Kokkos::create_mirror_view_and_copy(MemSpace(), positions_host);
  apply_rope(space, q, positions, inverse_frequencies_, rope_scale_, 0, hd, hd, false);
  apply_rope(space, k, positions, inverse_frequencies_, rope_scale_, 0, hd, hd, false);

  // Append this step's keys and values, block regions from the placement policy.
  Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace> k16("writescope::moe::k16", batch, kvh * hd),
      v16("writescope::moe::v16", batch, kvh * hd);
  Kokkos::parallel_for("writescope::moe::pack_keys", impl::rows_by_columns(space, batch, kvh * hd),
                       impl::PackBf16<MemSpace>{k16, k});
  Kokkos::parallel_for("writescope::moe::pack_values", impl::rows_by_columns(space, batch, kvh * hd),
                       impl::PackBf16<MemSpace>{v16, v});
  space.fence();
  std::vector<TokenRange> ranges;
  for (int b = 0; b < batch; ++b) {
    const int sequence = sequences[b];
    std::vector<Region> regions;
    const int opened = static_cast<int>(cache_->block_regions(layer, sequence).size());
    for (int n = 0; n < cache_->new_blocks_needed(layer, sequence, 1); ++n)
      regions.push_back(placement_(layer, sequence, opened + n));
    using Token = Kokkos::View<const bf16***, Kokkos::LayoutRight, MemSpace>;
    cache_->append<ExecSpace, MemSpace>(space, layer, sequence, Token(&k16(b, 0), 1, kvh, hd),
                                        Token(&v16(b, 0), 1, kvh, hd), regions);
    ranges.push_back(TokenRange{0, cache_->length(layer, sequence)});
  }

  // Attention over every region this space can read, merged.
  const Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> queries(q.data(), batch, qh, hd);
  PartialState<MemSpace> merged("writescope::moe::attention", batch, qh, hd);
  clear(space, merged);
  auto attend = [&](Region region, const auto& pool) {
    using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
    const auto segments = cache_->segments(layer, region, sequences, ranges);
    if (segments.empty()) return;
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible) {
      PartialState<MemSpace> part("writescope::moe::attention_part", batch, qh, hd);
      decode_attention<ExecSpace, bf16, PoolSpace>(space, shape_, cache_->geometry(), block_order(region), queries,
                                                   pool, segments, workspace_, part);
      merge_into(space, merged, part);
    } else {
      throw std::runtime_error(std::string("model: ") + ExecSpace::name() + " cannot read " + region_name(region) +
                               " blocks; place them where it can, or use the split executor");
    }
  };
  attend(Region::gpu_resident, cache_->vram_pool());
  attend(Region::gpu_streamed, cache_->pinned_pool());
  attend(Region::cpu_streamed, cache_->pinned_pool());
  attend(Region::cpu_resident, cache_->host_pool());
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
    feed_forward_[layer](space, h, branch);
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
