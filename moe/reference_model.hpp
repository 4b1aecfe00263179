#pragma once
// A plain host implementation of the three architectures (DESIGN.md §5), one
// sequence at a time, with double accumulation and no tricks: what the Kokkos
// runtime is tested against. It follows the Hugging Face implementations:
// RMSNorm, rotary embeddings (DeepSeek's YaRN and its rope-dimension
// interleave), GQA with Qwen3's per-head q/k norms, MLA (computed either
// decompressed per head as in the original, or in the absorbed form over the
// 576-wide latent cache that the decode kernels use), the three routers
// (Mixtral: softmax of the top-k logits; Qwen3: softmax then normalised top-k;
// DeepSeek: softmax top-k times the routed scaling factor, plus shared
// experts), SwiGLU experts, dense first layers, final norm, LM head.

#include <map>
#include <string>
#include <vector>

#include "moe/model_config.hpp"
#include "moe/weights.hpp"

namespace writescope {

/// Rotary angles per position: inverse frequencies and the cos/sin scale
/// (YaRN's mscale ratio; 1 otherwise) for a rotated width of `dim`.
struct RotaryEmbedding {
  std::vector<double> inverse_frequencies;  // dim / 2 of them
  double scale = 1.0;

  static RotaryEmbedding for_model(const ModelConfig& config);
  /// Rotates x (dim values) in place at `position`, "rotate half" convention:
  /// pairs (i, i + dim/2).
  void apply(float* x, int dim, std::int64_t position) const;
};

class ReferenceModel {
 public:
  enum class MlaForm { decompressed, absorbed };

  /// `weights` in weight_specs(config) order.
  ReferenceModel(ModelConfig config, std::vector<std::vector<float>> weights, MlaForm mla_form = MlaForm::absorbed);
  static ReferenceModel synthetic(const ModelConfig& config, std::uint64_t seed,
                                  MlaForm mla_form = MlaForm::absorbed);

  const ModelConfig& config() const noexcept { return config_; }
  /// Appends `tokens` to the sequence (causally, through the KV cache) and
  /// returns the logits after the last one (vocab values).
  std::vector<float> forward(const std::vector<int>& tokens);
  /// Greedy decoding: feeds the prompt, then `new_tokens` argmax tokens.
  std::vector<int> generate(const std::vector<int>& prompt, int new_tokens);
  /// Forgets the sequence (empties the KV cache).
  void reset();
  std::int64_t length() const noexcept { return length_; }
  /// Store cached keys and values rounded to bf16, as the runtime's KV cache
  /// does, so the two can be compared closely.
  void round_kv_cache_to_bf16(bool round) { round_kv_ = round; }

 private:
  const std::vector<float>& weight(const std::string& name) const;
  /// Appends one token's cached row, rounded to bf16 when asked to.
  void cache_row(std::vector<float>& cache, const std::vector<float>& row) const;
  std::vector<float> attention(int layer, const std::vector<float>& x, std::int64_t position);
  std::vector<float> gqa_attention(int layer, const std::vector<float>& x, std::int64_t position);
  std::vector<float> mla_attention(int layer, const std::vector<float>& x, std::int64_t position);
  std::vector<float> mlp(int layer, const std::vector<float>& x) const;
  std::vector<float> token_step(int token);

  ModelConfig config_;
  MlaForm mla_form_;
  std::vector<std::vector<float>> weights_;
  std::map<std::string, std::size_t> index_;  // tensor name -> position in weights_
  RotaryEmbedding rope_;
  // Per layer: GQA keys and values (tokens, kv_heads, head_dim) each; MLA the
  // normalised latent + roped k_pe (tokens, kv_lora_rank + qk_rope_head_dim).
  std::vector<std::vector<float>> keys_, values_;
  std::int64_t length_ = 0;
  bool round_kv_ = false;
};

}  // namespace writescope
