#pragma once
// The Kokkos model runtime for decode (DESIGN.md §5), on one execution space:
// embedding, per layer RMSNorm, attention projections (GQA with Qwen3's q/k
// norms), rotary embeddings, KV appends into an InplaceKVCache with blocks
// placed by a caller-chosen policy, split-KV decode attention over every
// region the space can read, merged by log-sum-exp, output projection, the MoE
// feed-forward, residuals, final norm and LM head. bf16 weights, fp32
// activations.
//
// MLA (DeepSeek-V2) and the CPU + GPU split execution come next; an MLA
// config is refused with a clear error until then.

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

  ModelConfig config_;
  AttentionShape shape_;
  BlockPlacement placement_;
  std::map<std::string, Weight> weights_;
  std::map<std::string, Norm> norms_;
  std::vector<MoeFeedForward<ExecSpace, bf16>> feed_forward_;  // per MoE layer
  std::unique_ptr<InplaceKVCache<bf16>> cache_;
  Kokkos::View<const double*, MemSpace> inverse_frequencies_;
  float rope_scale_ = 1.0f;
  DecodeWorkspace<MemSpace> workspace_;
};

}  // namespace writescope

#include "moe/impl/model_impl.hpp"
