#pragma once
// The Kokkos model runtime for decode (DESIGN.md §5), on one execution space:
// embedding, per layer RMSNorm, attention projections (GQA with Qwen3's q/k
// norms), rotary embeddings, KV appends into an InplaceKVCache with blocks
// placed by a caller-chosen policy, split-KV decode attention over every
// region the space can read, merged by log-sum-exp, output projection, the MoE
// feed-forward, residuals, final norm and LM head. bf16 weights, fp32
// activations. MLA runs in the absorbed form: the cache holds the normalised
// latent and the roped k_pe (576 wide for DeepSeek-V2-Lite), queries are
// absorbed into the latent, and the latent output is expanded per head.
//
// The CPU + GPU split execution of attention and experts comes next.

#include <Kokkos_Core.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention/decode.hpp"
#include "layouts/inplace_kv_cache.hpp"
#include "moe/experts.hpp"
#include "moe/reference_model.hpp"
#include "moe/weights.hpp"

namespace writescope {

/// Region of the block `block_index` of (layer, sequence), when it is opened.
using BlockPlacement = std::function<Region(int layer, int sequence, int block_index)>;

template <class ExecSpace>
class MoeModel {
 public:
  using MemSpace = typename ExecSpace::memory_space;

  /// `weights` in weight_specs(config) order (bf16 values); the KV cache is
  /// sized by `budgets` with blocks of `block_tokens` tokens.
  MoeModel(const ModelConfig& config, const std::vector<std::vector<bf16>>& weights, int block_tokens,
           const KVCacheBudgets& budgets, BlockPlacement placement);
  static MoeModel synthetic(const ModelConfig& config, std::uint64_t seed, int block_tokens,
                            const KVCacheBudgets& budgets, BlockPlacement placement);

  const ModelConfig& config() const noexcept { return config_; }
  const InplaceKVCache<bf16>& cache() const noexcept { return *cache_; }
  int add_sequence() { return cache_->add_sequence(); }

  /// One token for each of `sequences`; returns their logits (batch, vocab).
  std::vector<std::vector<float>> step(const std::vector<int>& sequences, const std::vector<int>& tokens);

 private:
  using Weight = Kokkos::View<const bf16**, Kokkos::LayoutRight, MemSpace>;
  using Norm = Kokkos::View<const float*, MemSpace>;
  const Weight& weight(const std::string& name) const;
  const Norm& norm(const std::string& name) const;
  void attention(int layer, const std::vector<int>& sequences, const Matrix<MemSpace>& h,
                 const Matrix<MemSpace>& out);
  void mla_attention(int layer, const std::vector<int>& sequences, const Matrix<MemSpace>& h,
                     const Matrix<MemSpace>& out);
  Kokkos::View<const std::int64_t*, MemSpace> positions_of(int layer, const std::vector<int>& sequences) const;
  /// Appends one cache row per sequence (keys, then values unless stored in the keys).
  std::vector<TokenRange> append(int layer, const std::vector<int>& sequences,
                                 const Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace>& rows);
  /// Attention over every region this space can read, merged into `merged`.
  void attend(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
              const Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace>& queries,
              const PartialState<MemSpace>& merged);

  ModelConfig config_;
  AttentionShape shape_;
  BlockPlacement placement_;
  std::map<std::string, Weight> weights_;
  std::map<std::string, Norm> norms_;
  std::vector<MoeFeedForward<ExecSpace, bf16>> feed_forward_;  // per MoE layer
  std::vector<ExpertWeights<bf16, MemSpace>> dense_;             // DeepSeek's first dense layers
  SwigluScratch<MemSpace> dense_scratch_;
  std::unique_ptr<InplaceKVCache<bf16>> cache_;
  Kokkos::View<const double*, MemSpace> inverse_frequencies_;
  float rope_scale_ = 1.0f;
  DecodeWorkspace<MemSpace> workspace_;
};

}  // namespace writescope

#include "moe/impl/model_impl.hpp"
