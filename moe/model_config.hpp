#pragma once
// Model configurations of the supported MoE architectures (DESIGN.md §5): the
// real shapes of DeepSeek-V2-Lite (MLA), Qwen3-30B-A3B and Mixtral-8x7B, tiny
// variants of each for tests, overrides for scaled-down runs, and reading a
// Hugging Face config.json.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/shape.hpp"
#include "framework/config.hpp"

namespace writescope {

enum class Architecture { deepseek_v2, qwen3_moe, mixtral };

/// "deepseek_v2", "qwen3_moe", "mixtral".
const char* architecture_name(Architecture architecture);

/// YaRN rope scaling as in DeepSeek-V2's config ("none" elsewhere).
struct RopeScaling {
  std::string type = "none";
  double factor = 1.0;
  int original_max_position = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

/// Epsilon of MLA's inner norms (q_a_layernorm, kv_a_layernorm): DeepSeek's
/// modeling_deepseek.py builds them with DeepseekV2RMSNorm's default 1e-6,
/// whatever rms_norm_eps says.
inline constexpr double mla_inner_norm_eps = 1e-6;

struct ModelConfig {
  std::string name;
  /// Where a config.json's rotary settings came from: "hub" (top-level
  /// rope_theta and rope_scaling) or "transformers-5" (rope_parameters); ""
  /// for presets.
  std::string config_format;
  Architecture architecture = Architecture::qwen3_moe;
  int layers = 0;
  int hidden = 0;
  int vocab = 0;
  int max_position = 0;
  bool tied_embeddings = false;
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  // Attention. GQA: q_heads query heads of head_dim over kv_heads KV heads.
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool qk_norm = false;  // Qwen3: RMSNorm on each query and key head
  // MLA (DeepSeek): kv_lora_rank > 0. Queries have qk_nope + qk_rope dims per head.
  int q_lora_rank = 0;   // 0: no query LoRA
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  // Mixture of experts.
  int experts = 0;
  int experts_per_token = 0;
  int expert_intermediate = 0;
  int shared_experts = 0;      // DeepSeek: always-active experts of expert_intermediate each
  bool normalize_topk = false;  // Qwen3 / Mixtral renormalise the top-k probabilities
  double routed_scaling_factor = 1.0;
  int dense_layers = 0;        // DeepSeek: the first layers use a dense MLP
  int dense_intermediate = 0;

  bool mla() const { return kv_lora_rank > 0; }
  /// Whether the router renormalises its top-k weights (else it scales them
  /// by routed_scaling_factor). DeepSeek's MoEGate renormalises only for
  /// top_k > 1 ("if self.top_k > 1 and self.norm_topk_prob").
  bool router_normalizes() const {
    return normalize_topk && (architecture != Architecture::deepseek_v2 || experts_per_token > 1);
  }
  /// The decode attention this model runs: GQA, or MLA in absorbed form
  /// (latent + rope dims per token, output in the latent), with the model's
  /// softmax scale (YaRN's mscale included).
  AttentionShape attention() const;
  /// KV cache elements stored per token and layer.
  std::int64_t kv_elements_per_token() const;
  /// Parameters of the whole model (embeddings, layers, final norm, LM head).
  std::int64_t parameters() const;
  /// Of those, the norms' scale vectors (kept in fp32) and the routed experts'
  /// weights: closed forms, so that memory plans never list every tensor.
  std::int64_t norm_parameters() const;
  std::int64_t routed_expert_parameters() const;
  /// Throws ConfigError (source "model <name>") naming the first inconsistent field.
  void validate() const;
  /// Every resolved setting that changes the math, one "name: value" line
  /// each (rotary, heads, LoRA ranks, experts, routing): what `generate
  /// --verbose` prints, and equal for configs that compute the same model.
  std::string math_settings() const;
};

/// Real shapes: "deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b"; tiny
/// variants of each architecture for tests: "tiny-deepseek-v2", "tiny-qwen3-moe",
/// "tiny-mixtral". std::invalid_argument lists the names otherwise.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
/// The preset names for messages: "deepseek-v2-lite, qwen3-30b-a3b, ...".
std::string model_preset_list();

/// Scaled-down variants: fewer layers, and hidden / intermediate sizes scaled
/// (rounded to multiples of 16; head counts and head dims stay).
struct ModelOverrides {
  std::optional<int> layers;
  double hidden_scale = 1.0;
};
ModelConfig apply_overrides(ModelConfig config, const ModelOverrides& overrides);

/// Reads a Hugging Face config.json of a supported architecture
/// (DeepseekV2ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM).
ModelConfig load_hf_config(const std::string& config_json);

}  // namespace writescope
