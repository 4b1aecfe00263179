#include "moe/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace writescope {
namespace {

ModelConfig deepseek_v2_lite() {
  ModelConfig c;
  c.name = "deepseek-v2-lite";
  c.architecture = Architecture::deepseek_v2;
  c.layers = 27;
  c.hidden = 2048;
  c.vocab = 102400;
  c.max_position = 163840;
  c.rms_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.rope_scaling = RopeScaling{"yarn", 40.0, 4096, 32.0, 1.0, 0.707, 0.707};
  c.q_heads = 16;
  c.kv_heads = 16;
  c.q_lora_rank = 0;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.head_dim = 192;
  c.experts = 64;
  c.experts_per_token = 6;
  c.expert_intermediate = 1408;
  c.shared_experts = 2;
  c.normalize_topk = false;
  c.routed_scaling_factor = 1.0;
  c.dense_layers = 1;
  c.dense_intermediate = 10944;
  return c;
}

ModelConfig qwen3_30b_a3b() {
  ModelConfig c;
  c.name = "qwen3-30b-a3b";
  c.architecture = Architecture::qwen3_moe;
  c.layers = 48;
  c.hidden = 2048;
  c.vocab = 151936;
  c.max_position = 40960;
  c.rms_eps = 1e-6;
  c.rope_theta = 1e6;
  c.q_heads = 32;
  c.kv_heads = 4;
  c.head_dim = 128;
  c.qk_norm = true;
  c.experts = 128;
  c.experts_per_token = 8;
  c.expert_intermediate = 768;
  c.normalize_topk = true;
  return c;
}

ModelConfig mixtral_8x7b() {
  ModelConfig c;
  c.name = "mixtral-8x7b";
  c.architecture = Architecture::mixtral;
  c.layers = 32;
  c.hidden = 4096;
  c.vocab = 32000;
  c.max_position = 32768;
  c.rms_eps = 1e-5;
  c.rope_theta = 1e6;
  c.q_heads = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.experts = 8;
  c.experts_per_token = 2;
  c.expert_intermediate = 14336;
  c.normalize_topk = true;
  return c;
}

/// Same architecture and structure, sizes small enough for a test to run a
/// whole model in milliseconds (head dims stay multiples of 8 for the kernels).
ModelConfig tiny(ModelConfig c, const std::string& name) {
  c.name = name;
  c.layers = c.architecture == Architecture::deepseek_v2 ? 3 : 2;
  c.hidden = 64;
  c.vocab = 256;
  c.max_position = 4096;
  if (c.mla()) {
    c.q_heads = c.kv_heads = 4;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.v_head_dim = 16;
    c.head_dim = 24;
    c.rope_scaling = RopeScaling{"yarn", 4.0, 256, 32.0, 1.0, 0.707, 0.707};
    c.experts = 8;
    c.experts_per_token = 2;
    c.expert_intermediate = 32;
    c.dense_intermediate = 96;
  } else {
    c.q_heads = 4;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.experts = c.architecture == Architecture::mixtral ? 4 : 8;
    c.experts_per_token = 2;
    c.expert_intermediate = 32;
  }
  return c;
}

int scaled(int size, double scale) {
  return std::max(16, static_cast<int>(std::lround(size * scale / 16.0)) * 16);
}

/// YaRN's attention-temperature factor (DeepSeek's yarn_get_mscale).
double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

const char* architecture_name(Architecture architecture) {
  switch (architecture) {
    case Architecture::deepseek_v2: return "deepseek_v2";
    case Architecture::qwen3_moe: return "qwen3_moe";
    case Architecture::mixtral: return "mixtral";
  }
  return "?";
}

AttentionShape ModelConfig::attention() const {
  AttentionShape s;
  s.name = name;
  s.q_heads = q_heads;
  if (mla()) {
    s.kv_heads = 1;
    s.key_dim = kv_lora_rank + qk_rope_head_dim;
    s.value_dim = kv_lora_rank;
    s.values_in_keys = true;
    double scale = 1.0 / std::sqrt(static_cast<double>(qk_nope_head_dim + qk_rope_head_dim));
    if (rope_scaling.type == "yarn") {
      const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
      scale *= m * m;
    }
    s.softmax_scale = static_cast<float>(scale);
  } else {
    s.kv_heads = kv_heads;
    s.key_dim = s.value_dim = head_dim;
    s.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }
  return s;
}

std::int64_t ModelConfig::kv_elements_per_token() const {
  return mla() ? std::int64_t{kv_lora_rank} + qk_rope_head_dim : std::int64_t{2} * kv_heads * head_dim;
}

std::int64_t ModelConfig::parameters() const {
  const std::int64_t h = hidden;
  std::int64_t attention_params;
  if (mla()) {
    const std::int64_t q_dim = std::int64_t{q_heads} * (qk_nope_head_dim + qk_rope_head_dim);
    const std::int64_t q = q_lora_rank > 0 ? h * q_lora_rank + q_lora_rank + std::int64_t{q_lora_rank} * q_dim : h * q_dim;
    attention_params = q + h * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank +
                       std::int64_t{kv_lora_rank} * q_heads * (qk_nope_head_dim + v_head_dim) +
                       std::int64_t{q_heads} * v_head_dim * h;
  } else {
    attention_params = h * q_heads * head_dim + 2 * h * kv_heads * head_dim + std::int64_t{q_heads} * head_dim * h +
                       (qk_norm ? 2 * head_dim : 0);
  }
  const std::int64_t expert = 3 * h * expert_intermediate;
  const std::int64_t moe_mlp = std::int64_t{experts} * expert + std::int64_t{shared_experts} * expert + h * experts;
  const std::int64_t dense_mlp = 3 * h * dense_intermediate;
  const std::int64_t norms = 2 * h;
  const std::int64_t layer_sum = std::int64_t{layers} * (attention_params + norms) +
                                 std::int64_t{dense_layers} * dense_mlp +
                                 std::int64_t{layers - dense_layers} * moe_mlp;
  const std::int64_t embeddings = std::int64_t{vocab} * h * (tied_embeddings ? 1 : 2);
  return layer_sum + embeddings + h;
}

std::int64_t ModelConfig::norm_parameters() const {
  // Per layer: input and post-attention norms; Qwen3's q/k norms; MLA's q_a and kv_a norms. Then the final norm.
  const std::int64_t per_layer = 2 * std::int64_t{hidden} + (qk_norm ? 2 * head_dim : 0) +
                                 (mla() ? std::int64_t{q_lora_rank} + kv_lora_rank : 0);
  return std::int64_t{layers} * per_layer + hidden;
}

std::int64_t ModelConfig::routed_expert_parameters() const {
  return std::int64_t{layers - dense_layers} * experts * 3 * std::int64_t{hidden} * expert_intermediate;
}

void ModelConfig::validate() const {
  const std::string source = "model " + name;
  auto require = [&](bool ok, const char* field, const std::string& reason) {
    if (!ok) throw ConfigError(source, field, reason);
  };
  require(layers >= 1, "layers", "must be at least 1");
  require(hidden >= 1, "hidden", "must be positive");
  require(vocab >= 1, "vocab", "must be positive");
  require(max_position >= 0, "max_position", "must not be negative (0: not known)");
  require(q_heads >= 1, "q_heads", "must be positive");
  if (mla()) {
    require(qk_nope_head_dim > 0, "qk_nope_head_dim", "must be positive (MLA)");
    require(qk_rope_head_dim > 0, "qk_rope_head_dim", "must be positive (MLA)");
    require(v_head_dim > 0, "v_head_dim", "must be positive (MLA)");
  } else {
    require(kv_heads >= 1 && q_heads % kv_heads == 0, "kv_heads", "must divide the number of query heads");
    require(head_dim >= 1, "head_dim", "must be positive");
  }
  require(experts >= 1, "experts", "must be at least 1");
  require(experts_per_token >= 1 && experts_per_token <= experts, "experts_per_token",
          "must be between 1 and the number of experts");
  require(expert_intermediate >= 1, "expert_intermediate", "must be positive");
  require(dense_layers >= 0 && dense_layers <= layers, "dense_layers", "must be between 0 and the number of layers");
  require(dense_layers == 0 || dense_intermediate >= 1, "dense_intermediate", "dense layers need a size");
  require(rms_eps > 0, "rms_eps", "must be positive");
  require(rope_theta > 0, "rope_theta", "must be positive");
  require(rope_scaling.type == "none" || rope_scaling.type == "yarn", "rope_scaling.type",
          "must be none or yarn, got '" + rope_scaling.type + "'");
  const int rope_dim = mla() ? qk_rope_head_dim : head_dim;
  require(rope_dim % 2 == 0 && rope_dim <= 256, mla() ? "qk_rope_head_dim" : "head_dim",
          "must be even and at most 256 (the rotary kernels rotate pairs of up to 256 dimensions), got " +
              std::to_string(rope_dim));
  require(q_lora_rank >= 0, "q_lora_rank", "must not be negative");
  require(shared_experts >= 0, "shared_experts", "must not be negative");
  require(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0, "routed_scaling_factor",
          "must be positive (it scales the routed experts' sum)");
  if (rope_scaling.type == "yarn") {
    // YaRN divides by the factor and takes logarithms of the others.
    // A factor under 1 would shrink the context YaRN stretches (transformers warns of it).
    require(std::isfinite(rope_scaling.factor) && rope_scaling.factor >= 1, "rope_scaling.factor",
            "must be at least 1 (YaRN stretches the original context by it)");
    require(rope_scaling.original_max_position >= 1, "rope_scaling.original_max_position_embeddings",
            "must be positive");
    require(rope_scaling.beta_slow > 0, "rope_scaling.beta_slow", "must be positive");
    require(rope_scaling.beta_fast > rope_scaling.beta_slow, "rope_scaling.beta_fast",
            "must be larger than beta_slow (the correction range runs from beta_fast's dimension to beta_slow's)");
    require(rope_scaling.mscale >= 0 && rope_scaling.mscale_all_dim >= 0, "rope_scaling.mscale",
            "mscale and mscale_all_dim must not be negative");
  }
}

std::vector<std::string> model_preset_names() {
  return {"deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b", "tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"};
}

ModelConfig model_preset(const std::string& name) {
  if (name == "deepseek-v2-lite") return deepseek_v2_lite();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b();
  if (name == "mixtral-8x7b") return mixtral_8x7b();
  if (name == "tiny-deepseek-v2") return tiny(deepseek_v2_lite(), name);
  if (name == "tiny-qwen3-moe") return tiny(qwen3_30b_a3b(), name);
  if (name == "tiny-mixtral") return tiny(mixtral_8x7b(), name);
  throw std::invalid_argument("unknown model '" + name + "' (known: " + model_preset_list() + ")");
}

std::string model_preset_list() {
  std::string list;
  for (const auto& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

ModelConfig apply_overrides(ModelConfig c, const ModelOverrides& overrides) {
  if (overrides.layers) {
    c.layers = *overrides.layers;
    c.dense_layers = std::min(c.dense_layers, c.layers);
  }
  if (!(overrides.hidden_scale > 0)) throw std::invalid_argument("model overrides: hidden_scale must be positive");
  if (overrides.hidden_scale != 1.0) {
    c.hidden = scaled(c.hidden, overrides.hidden_scale);
    c.expert_intermediate = scaled(c.expert_intermediate, overrides.hidden_scale);
    if (c.dense_intermediate > 0) c.dense_intermediate = scaled(c.dense_intermediate, overrides.hidden_scale);
  }
  c.validate();
  return c;
}

std::string ModelConfig::math_settings() const {
  std::ostringstream out;
  out.precision(17);
  out << "architecture: " << architecture_name(architecture) << "\nlayers: " << layers << "\nhidden: " << hidden
      << "\nvocab: " << vocab
      << "\ntied_embeddings: " << tied_embeddings << "\nrms_eps: " << rms_eps << "\nrope_theta: " << rope_theta
      << "\nrope_type: " << rope_scaling.type;
  if (rope_scaling.type == "yarn")
    out << "\nrope_factor: " << rope_scaling.factor
        << "\nrope_original_max_position: " << rope_scaling.original_max_position
        << "\nrope_beta_fast: " << rope_scaling.beta_fast << "\nrope_beta_slow: " << rope_scaling.beta_slow
        << "\nrope_mscale: " << rope_scaling.mscale << "\nrope_mscale_all_dim: " << rope_scaling.mscale_all_dim;
  out << "\nq_heads: " << q_heads << "\nkv_heads: " << kv_heads << "\nhead_dim: " << head_dim
      << "\nqk_norm: " << qk_norm << "\nq_lora_rank: " << q_lora_rank << "\nkv_lora_rank: " << kv_lora_rank
      << "\nqk_nope_head_dim: " << qk_nope_head_dim << "\nqk_rope_head_dim: " << qk_rope_head_dim
      << "\nv_head_dim: " << v_head_dim << "\nexperts: " << experts << "\nexperts_per_token: " << experts_per_token
      << "\nexpert_intermediate: " << expert_intermediate << "\nshared_experts: " << shared_experts
      << "\nnorm_topk_prob: " << normalize_topk << "\nrouted_scaling_factor: " << routed_scaling_factor
      << "\nfirst_dense_layers: " << dense_layers << "\ndense_intermediate: " << dense_intermediate
      << "\nsoftmax_scale: " << attention().scale() << "\n";
  return out.str();
}

namespace {

/// An integer the config may spell two ways (`first`, else `second`); both
/// given with different values is an error naming them.
int one_of_two(const ConfigNode& root, const char* first, const char* second) {
  if (root.has(first) && root.has(second) && root.get<int>(first) != root.get<int>(second))
    root.fail(first, std::string("disagrees with ") + second);
  if (!root.has(first) && !root.has(second)) root.fail(first, std::string("is required (or ") + second + ")");
  return root.has(first) ? root.get<int>(first) : root.get<int>(second);
}

/// Rotary settings from the Hub format (top-level rope_theta, rope_scaling
/// with "type" or "rope_type") or transformers 5's rope_parameters
/// (rope_theta and rope_type inside). `default_theta`: the architecture's
/// published default, used only when the config gives none.
void read_rope(const ConfigNode& root, double default_theta, ModelConfig& c) {
  const bool v5 = root.has("rope_parameters");
  c.config_format = v5 ? "transformers-5" : "hub";
  std::optional<ConfigNode> scaling = v5 ? root.optional_child("rope_parameters") : root.optional_child("rope_scaling");
  if (scaling && scaling->yaml().IsNull()) scaling.reset();
  if (v5 && root.has("rope_scaling") && !root.yaml()["rope_scaling"].IsNull())
    root.fail("rope_scaling", "given beside rope_parameters: a config holds one of the two formats");
  const bool theta_inside = v5 && scaling && scaling->has("rope_theta");
  if (theta_inside && root.has("rope_theta") && root.get<double>("rope_theta") != scaling->get<double>("rope_theta"))
    root.fail("rope_theta", "disagrees with rope_parameters.rope_theta");
  c.rope_theta = theta_inside ? scaling->get<double>("rope_theta") : root.get_or<double>("rope_theta", default_theta);
  c.rope_scaling = RopeScaling{};
  if (!scaling) return;
  const char* type_key = scaling->has("rope_type") ? "rope_type" : "type";
  if (!scaling->has(type_key)) scaling->fail("rope_type", "is required");
  const std::string type = scaling->get<std::string>(type_key);
  if (type == "default") return;
  if (type != "yarn") scaling->fail(type_key, "unsupported rope type '" + type + "' (supported: default, yarn)");
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = scaling->get<double>("factor");
  c.rope_scaling.original_max_position = scaling->get<int>("original_max_position_embeddings");
  // Defaults of DeepSeek-V2's reference YaRN (modeling_deepseek.py,
  // DeepseekV2YarnRotaryEmbedding: beta_fast=32, beta_slow=1, mscale=1, mscale_all_dim=0).
  c.rope_scaling.beta_fast = scaling->get_or<double>("beta_fast", 32.0);
  c.rope_scaling.beta_slow = scaling->get_or<double>("beta_slow", 1.0);
  c.rope_scaling.mscale = scaling->get_or<double>("mscale", 1.0);
  c.rope_scaling.mscale_all_dim = scaling->get_or<double>("mscale_all_dim", 0.0);
  // transformers' newer YaRN options that DeepSeek's reference YaRN does not have.
  if (scaling->has("attention_factor"))
    scaling->fail("attention_factor", "is not supported: the attention factor follows from mscale and mscale_all_dim "
                                      "as in DeepSeek's reference YaRN");
  if (!scaling->get_or<bool>("truncate", true))
    scaling->fail("truncate", "false is not supported: DeepSeek's reference YaRN rounds the correction range");
}

/// `key`, when the config gives it, must hold `supported` (what the runtime
/// computes): settings of architecture variants it does not implement are
/// errors, not silently different models.
template <class T>
void require_supported(const ConfigNode& root, const char* key, T supported, const std::string& what) {
  if (root.has(key) && !root.yaml()[key].IsNull() && root.get<T>(key) != supported)
    root.fail(key, "is not supported (only " + what + " is implemented)");
}

}  // namespace

ModelConfig load_hf_config(const std::string& config_json) {
  const ConfigNode root = ConfigNode::load_json_file(config_json);
  const auto architectures = root.get_list<std::string>("architectures");
  // Which one the weights are would be a guess.
  if (architectures.size() != 1)
    root.fail("architectures", "must name one architecture, not " + std::to_string(architectures.size()));
  const std::string& kind = architectures.front();
  ModelConfig c;
  c.name = root.get_or<std::string>("_name_or_path", config_json);
  c.layers = root.get<int>("num_hidden_layers");
  c.hidden = root.get<int>("hidden_size");
  c.vocab = root.get<int>("vocab_size");
  c.max_position = root.get_or<int>("max_position_embeddings", 0);
  c.tied_embeddings = root.get_or<bool>("tie_word_embeddings", false);
  c.rms_eps = root.get<double>("rms_norm_eps");
  c.q_heads = root.get<int>("num_attention_heads");
  c.kv_heads = root.get_or<int>("num_key_value_heads", c.q_heads);
  c.experts_per_token = root.get<int>("num_experts_per_tok");
  require_supported<std::string>(root, "hidden_act", "silu", "SwiGLU with silu");
  require_supported(root, "attention_bias", false, "attention without biases");
  // Published defaults, where a config may leave a field out, are those of the
  // architectures' configuration classes: DeepSeek's configuration_deepseek.py
  // (the Hub's remote code), transformers' configuration_qwen3_moe.py and
  // configuration_mixtral.py.
  if (kind == "DeepseekV2ForCausalLM") {
    c.architecture = Architecture::deepseek_v2;
    read_rope(root, 10000.0, c);  // DeepseekV2Config: rope_theta=10000.0
    require_supported<std::string>(root, "topk_method", "greedy", "greedy top-k routing");
    require_supported<std::string>(root, "scoring_func", "softmax", "softmax router scores");
    require_supported(root, "moe_layer_freq", 1, "an MoE block in every layer after the dense ones");
    // DeepseekV2Config: q_lora_rank=1536; null (DeepSeek-V2-Lite) means no query LoRA.
    c.q_lora_rank = !root.has("q_lora_rank")                ? 1536
                    : root.yaml()["q_lora_rank"].IsNull() ? 0
                                                            : root.get<int>("q_lora_rank");
    c.kv_lora_rank = root.get<int>("kv_lora_rank");
    if (c.kv_lora_rank < 1) root.fail("kv_lora_rank", "must be positive (DeepSeek-V2's attention is MLA)");
    c.qk_nope_head_dim = root.get<int>("qk_nope_head_dim");
    c.qk_rope_head_dim = root.get<int>("qk_rope_head_dim");
    c.v_head_dim = root.get<int>("v_head_dim");
    c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
    c.experts = root.get<int>("n_routed_experts");
    c.expert_intermediate = root.get<int>("moe_intermediate_size");
    // Required: DeepSeek's DeepseekV2Config defaults to none, transformers' to 2.
    // null means none. DeepseekV2Config: norm_topk_prob=False,
    // routed_scaling_factor=1.0, first_k_dense_replace=0.
    if (!root.has("n_shared_experts"))
      root.fail("n_shared_experts", "is required (DeepSeek's configuration defaults to none, transformers' to 2)");
    c.shared_experts = root.yaml()["n_shared_experts"].IsNull() ? 0 : root.get<int>("n_shared_experts");
    c.normalize_topk = root.get_or<bool>("norm_topk_prob", false);
    c.routed_scaling_factor = root.get_or<double>("routed_scaling_factor", 1.0);
    c.dense_layers = root.get_or<int>("first_k_dense_replace", 0);
    c.dense_intermediate = root.get<int>("intermediate_size");
  } else if (kind == "Qwen3MoeForCausalLM") {
    c.architecture = Architecture::qwen3_moe;
    read_rope(root, 10000.0, c);  // Qwen3MoeConfig: rope_theta=10000.0
    c.head_dim = root.get<int>("head_dim");
    c.qk_norm = true;
    require_supported(root, "decoder_sparse_step", 1, "an MoE block in every layer");
    if (root.has("mlp_only_layers") && root.yaml()["mlp_only_layers"].IsSequence() &&
        root.yaml()["mlp_only_layers"].size() > 0)
      root.fail("mlp_only_layers", "is not supported (only an MoE block in every layer is implemented)");
    require_supported(root, "use_sliding_window", false, "full attention");
    // The Hub writes num_experts, transformers 5 num_local_experts.
    c.experts = one_of_two(root, "num_experts", "num_local_experts");
    c.expert_intermediate = root.get<int>("moe_intermediate_size");
    // Required: Qwen3MoeConfig's default (False) is not what Qwen3-30B-A3B uses (true).
    c.normalize_topk = root.get<bool>("norm_topk_prob");
  } else if (kind == "MixtralForCausalLM") {
    c.architecture = Architecture::mixtral;
    read_rope(root, 1e6, c);  // MixtralConfig: rope_theta=1e6
    // MixtralConfig: head_dim=None (absent or null) is hidden_size / num_attention_heads. validate()
    // refuses fewer than one query head; no division by zero before it.
    c.head_dim = root.get_or<int>("head_dim", c.hidden / std::max(c.q_heads, 1));
    // MixtralConfig: max_position_embeddings=4096*32, the length a window is compared with.
    c.max_position = root.get_or<int>("max_position_embeddings", 4096 * 32);
    c.experts = root.get<int>("num_local_experts");
    c.expert_intermediate = root.get<int>("intermediate_size");
    c.normalize_topk = true;  // Mixtral's router always renormalises its top-k
    // A window at least as long as the context changes nothing.
    if (root.has("sliding_window") && !root.yaml()["sliding_window"].IsNull() &&
        root.get<long>("sliding_window") < c.max_position)
      root.fail("sliding_window", "is not supported (only full attention is implemented; a window of " +
                                      std::to_string(root.get<long>("sliding_window")) +
                                      " tokens changes attention beyond it)");
  } else {
    root.fail("architectures", "unsupported architecture '" + kind +
                                   "' (expected DeepseekV2ForCausalLM, Qwen3MoeForCausalLM or MixtralForCausalLM)");
  }
  // model_type, where given, is the same architecture's (transformers picks the class by it).
  if (root.has("model_type"))
    if (const std::string model_type = root.get<std::string>("model_type");
        model_type != architecture_name(c.architecture))
      root.fail("model_type", "'" + model_type + "' is not " + kind + "'s ('" + architecture_name(c.architecture) +
                                  "')");
  // validate() names ModelConfig's fields; errors name the config.json key read.
  auto key_of = [&](const std::string& field) -> std::string {
    const bool deepseek = c.architecture == Architecture::deepseek_v2, mixtral = c.architecture == Architecture::mixtral;
    if (field == "layers") return "num_hidden_layers";
    if (field == "hidden") return "hidden_size";
    if (field == "vocab") return "vocab_size";
    if (field == "q_heads") return "num_attention_heads";
    if (field == "kv_heads") return "num_key_value_heads";
    if (field == "experts")
      return deepseek ? "n_routed_experts" : mixtral || !root.has("num_experts") ? "num_local_experts" : "num_experts";
    if (field == "experts_per_token") return "num_experts_per_tok";
    if (field == "expert_intermediate") return mixtral ? "intermediate_size" : "moe_intermediate_size";
    if (field == "dense_layers") return "first_k_dense_replace";
    if (field == "dense_intermediate") return "intermediate_size";
    if (field == "rms_eps") return "rms_norm_eps";
    if (field == "shared_experts") return "n_shared_experts";
    if (field == "head_dim" && mixtral && (!root.has("head_dim") || root.yaml()["head_dim"].IsNull()))
      return "hidden_size / num_attention_heads";
    if (field == "max_position") return "max_position_embeddings";
    // transformers 5 keeps the rotary settings in rope_parameters.
    if (c.config_format == "transformers-5" && (field == "rope_theta" || field.rfind("rope_scaling.", 0) == 0))
      return "rope_parameters." + field.substr(field.find('.') + 1);
    return field;
  };
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(config_json, key_of(e.field()), e.reason());
  }
  return c;
}

}  // namespace writescope
