#include "moe/model_config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <string>

#include "moe/weights.hpp"

namespace writescope {
namespace {

TEST(ModelConfig, RealShapesMatchThePublishedParameterCounts) {
  // Totals from the model cards: 15.7B, 30.5B, 46.7B parameters.
  const std::pair<const char*, double> published[] = {
      {"deepseek-v2-lite", 15.7e9}, {"qwen3-30b-a3b", 30.5e9}, {"mixtral-8x7b", 46.7e9}};
  for (const auto& [name, parameters] : published) {
    const ModelConfig c = model_preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_NEAR(static_cast<double>(c.parameters()) / parameters, 1.0, 0.015) << name << ": " << c.parameters();
  }
}

TEST(ModelConfig, AttentionShapesMatchTheKernelsPresets) {
  for (const auto& [model, shape] : {std::pair{model_preset("qwen3-30b-a3b"), qwen3_30b_a3b_attention()},
                                     std::pair{model_preset("mixtral-8x7b"), mixtral_8x7b_attention()},
                                     std::pair{model_preset("deepseek-v2-lite"), deepseek_v2_lite_mla_attention()}}) {
    const AttentionShape a = model.attention();
    EXPECT_EQ(a.q_heads, shape.q_heads) << model.name;
    EXPECT_EQ(a.kv_heads, shape.kv_heads) << model.name;
    EXPECT_EQ(a.key_dim, shape.key_dim) << model.name;
    EXPECT_EQ(a.value_dim, shape.value_dim) << model.name;
    EXPECT_EQ(a.values_in_keys, shape.values_in_keys) << model.name;
  }
  // DeepSeek's softmax scale carries YaRN's mscale squared.
  const double mscale = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(model_preset("deepseek-v2-lite").attention().scale(), mscale * mscale / std::sqrt(192.0), 1e-6);
  EXPECT_EQ(model_preset("qwen3-30b-a3b").kv_elements_per_token(), 1024);
  EXPECT_EQ(model_preset("mixtral-8x7b").kv_elements_per_token(), 2048);
  EXPECT_EQ(model_preset("deepseek-v2-lite").kv_elements_per_token(), 576);
}

TEST(ModelConfig, TinyVariantsKeepTheArchitecture) {
  for (const char* name : {"tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"}) {
    const ModelConfig c = model_preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_LT(c.parameters(), 2'000'000) << name;
    EXPECT_EQ(c.attention().key_dim % 8, 0) << name;
  }
  EXPECT_TRUE(model_preset("tiny-deepseek-v2").mla());
  EXPECT_EQ(model_preset("tiny-deepseek-v2").dense_layers, 1);
  EXPECT_TRUE(model_preset("tiny-qwen3-moe").qk_norm);
  EXPECT_THROW(model_preset("llama-70b"), std::invalid_argument);
}

TEST(ModelConfig, OverridesScaleDownAndStayValid) {
  ModelOverrides overrides;
  overrides.layers = 4;
  overrides.hidden_scale = 0.25;
  const ModelConfig c = apply_overrides(model_preset("mixtral-8x7b"), overrides);
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.hidden, 1024);
  EXPECT_EQ(c.expert_intermediate, 3584);
  EXPECT_EQ(c.head_dim, 128);
  overrides.layers = 0;
  try {
    apply_overrides(model_preset("qwen3-30b-a3b"), overrides);
    FAIL() << "zero layers accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "layers");
  }
}

class HfConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& json) {
    path_ = ::testing::TempDir() + "writescope_config_" + std::to_string(::getpid()) + ".json";
    std::ofstream(path_) << json;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(HfConfigTest, ReadsTheThreeArchitectures) {
  const ModelConfig deepseek = load_hf_config(write(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "kv_lora_rank": 512, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "rms_norm_eps": 1e-06, "vocab_size": 102400, "rope_theta": 10000, "max_position_embeddings": 163840,
    "norm_topk_prob": false, "routed_scaling_factor": 1.0, "tie_word_embeddings": false,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}})"));
  const ModelConfig preset = model_preset("deepseek-v2-lite");
  EXPECT_EQ(deepseek.parameters(), preset.parameters());
  EXPECT_EQ(deepseek.rope_scaling.type, "yarn");
  EXPECT_FLOAT_EQ(deepseek.attention().scale(), preset.attention().scale());

  const ModelConfig qwen = load_hf_config(write(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "vocab_size": 151936, "tie_word_embeddings": false})"));
  EXPECT_EQ(qwen.parameters(), model_preset("qwen3-30b-a3b").parameters());
  EXPECT_TRUE(qwen.qk_norm);

  const ModelConfig mixtral = load_hf_config(write(R"({
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "rope_theta": 1e6, "rms_norm_eps": 1e-05, "vocab_size": 32000})"));
  EXPECT_EQ(mixtral.parameters(), model_preset("mixtral-8x7b").parameters());
}

TEST_F(HfConfigTest, ErrorsNameTheFileAndField) {
  const std::string path = write(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 4096})");
  try {
    load_hf_config(path);
    FAIL() << "incomplete config accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.source(), path);
    EXPECT_EQ(e.field(), "num_hidden_layers");
    EXPECT_EQ(e.reason(), "is required");
  }
  try {
    load_hf_config(write(R"({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8,
      "vocab_size": 8, "rms_norm_eps": 1e-5, "num_attention_heads": 2, "num_experts_per_tok": 1})"));
    FAIL() << "unsupported architecture accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "architectures");
    EXPECT_NE(e.reason().find("LlamaForCausalLM"), std::string::npos);
  }
  try {
    load_hf_config(write(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 4, "num_local_experts": 4,
      "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "vocab_size": 100, "head_dim": 16})"));
    FAIL() << "kv heads not dividing q heads accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "num_key_value_heads");  // the key in config.json, not ModelConfig's field
  }
  try {
    load_hf_config(write(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": -1,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32,
      "num_experts": 8, "num_experts_per_tok": 9, "norm_topk_prob": true, "rms_norm_eps": 1e-6, "vocab_size": 100})"));
    FAIL() << "negative layers accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "num_hidden_layers");
    EXPECT_EQ(e.reason(), "must be at least 1");
  }  // Not JSON, though the YAML reader would take it: one error naming where.
  const std::string with_comment = write("# my edit\n" + std::string(R"({"architectures": ["MixtralForCausalLM"]})"));
  try {
    load_hf_config(with_comment);
    FAIL() << "a config.json with a comment accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.source(), with_comment);
    EXPECT_EQ(e.reason(), "is not JSON: line 1, column 1: a comment (JSON has none)");
  }
}

// The Hub's format and transformers 5's (rope_parameters, Qwen3's
// num_local_experts) of every architecture read to the same settings, the
// preset's own; the model computed from them is the same.
TEST_F(HfConfigTest, HubAndTransformers5FormatsReadAlike) {
  for (const char* name : {"deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b", "tiny-deepseek-v2", "tiny-qwen3-moe",
                           "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    const ModelConfig preset = model_preset(name);
    const ModelConfig hub = load_hf_config(write(hf_config_json(preset, ConfigFormat::hub, TensorDType::bf16)));
    EXPECT_EQ(hub.config_format, "hub");
    const ModelConfig v5 =
        load_hf_config(write(hf_config_json(preset, ConfigFormat::transformers5, TensorDType::bf16)));
    EXPECT_EQ(v5.config_format, "transformers-5");
    EXPECT_EQ(hub.math_settings(), preset.math_settings());
    EXPECT_EQ(v5.math_settings(), preset.math_settings());
  }
}

TEST_F(HfConfigTest, RotarySpellingsAndDefaultsAreExplicit) {
  const std::string qwen = R"("architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32,
    "num_experts_per_tok": 2, "rms_norm_eps": 1e-06, "vocab_size": 100)";
  // YaRN spelled "type" (older DeepSeek) and "rope_type" (newer), Qwen3's experts under either name.
  const ModelConfig older = load_hf_config(write("{" + qwen + R"(, "num_experts": 8, "norm_topk_prob": true,
    "rope_theta": 5e5, "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 256}})"));
  const ModelConfig newer = load_hf_config(write("{" + qwen + R"(, "num_local_experts": 8, "norm_topk_prob": true,
    "rope_parameters": {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 256}})"));
  EXPECT_EQ(older.math_settings(), newer.math_settings());
  EXPECT_EQ(newer.rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(newer.rope_theta, 5e5);
  EXPECT_EQ(newer.experts, 8);
  // No rope_theta: the architecture's published default, not one for all (Mixtral's is 1e6).
  const ModelConfig mixtral = load_hf_config(write(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "vocab_size": 100})"));
  EXPECT_DOUBLE_EQ(mixtral.rope_theta, 1e6);

  auto error_of = [&](const std::string& json) -> std::pair<std::string, std::string> {
    try {
      load_hf_config(write(json));
    } catch (const ConfigError& e) {
      return {e.field(), e.reason()};
    }
    return {"", "accepted"};
  };
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "norm_topk_prob": true,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "llama3", "factor": 8}})"),
            std::make_pair(std::string("rope_parameters.rope_type"),
                           std::string("unsupported rope type 'llama3' (supported: default, yarn)")));
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "rope_theta": 1e6})").first, "norm_topk_prob");
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "num_local_experts": 16, "norm_topk_prob": true})").first,
            "num_experts");
  // Neither spelling: the Hub's is named, with the other.
  EXPECT_EQ(error_of("{" + qwen + R"(, "norm_topk_prob": true})"),
            std::make_pair(std::string("num_experts"), std::string("is required (or num_local_experts)")));
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "norm_topk_prob": true, "rope_theta": 1e6,
    "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}})").first, "rope_theta");
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "norm_topk_prob": true,
    "rope_scaling": {"factor": 4}})").first, "rope_scaling.rope_type");
  // YaRN's numbers where its formulas need them (a factor of 0 gave NaN frequencies), and rotary widths the
  // kernels rotate.
  for (const auto& [scaling, field] :
       {std::pair{R"("factor": 0, "original_max_position_embeddings": 256)", "rope_scaling.factor"},
        std::pair{R"("factor": -4, "original_max_position_embeddings": 256)", "rope_scaling.factor"},
        std::pair{R"("factor": 4, "original_max_position_embeddings": 0)",
                  "rope_scaling.original_max_position_embeddings"},
        std::pair{R"("factor": 4, "original_max_position_embeddings": 256, "beta_slow": 0)",
                  "rope_scaling.beta_slow"},
        std::pair{R"("factor": 4, "original_max_position_embeddings": 256, "beta_fast": 1, "beta_slow": 32)",
                  "rope_scaling.beta_fast"},
        std::pair{R"("factor": 4, "original_max_position_embeddings": 256, "mscale": -1)", "rope_scaling.mscale"}})
    EXPECT_EQ(error_of("{" + qwen + R"(, "num_experts": 8, "norm_topk_prob": true,
      "rope_scaling": {"type": "yarn", )" + scaling + "}}").first, field) << scaling;
  std::string odd_head = qwen;
  odd_head.replace(odd_head.find(R"("head_dim": 16)"), 14, R"("head_dim": 15)");
  EXPECT_EQ(error_of("{" + odd_head + R"(, "num_experts": 8, "norm_topk_prob": true})"),
            std::make_pair(std::string("head_dim"),
                           std::string("must be even and at most 256 (the rotary kernels rotate pairs of up to 256 "
                                       "dimensions), got 15")));
  // transformers 5's rotary settings are named where that format keeps them.
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_local_experts": 8, "norm_topk_prob": true,
    "rope_parameters": {"rope_theta": 0, "rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 256}})")
                .first,
            "rope_parameters.rope_theta");
  EXPECT_EQ(error_of("{" + qwen + R"(, "num_local_experts": 8, "norm_topk_prob": true,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 256}})")
                .first,
            "rope_parameters.factor");
  // No query heads: a named error, not a division by zero while Mixtral's head_dim default is computed.
  EXPECT_EQ(error_of(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 0, "num_key_value_heads": 2, "num_local_experts": 4,
    "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "vocab_size": 100})").first, "num_attention_heads");
}

// Settings of architecture variants the runtime does not implement are errors
// naming the field, not silently another model (cross-check against the
// architectures' reference code, moe/README.md).
TEST_F(HfConfigTest, UnimplementedVariantsAreRefused) {
  const std::string deepseek = hf_config_json(model_preset("tiny-deepseek-v2"), ConfigFormat::hub, TensorDType::bf16);
  const std::string qwen = hf_config_json(model_preset("tiny-qwen3-moe"), ConfigFormat::hub, TensorDType::bf16);
  const std::string mixtral = hf_config_json(model_preset("tiny-mixtral"), ConfigFormat::hub, TensorDType::bf16);
  // One more field after the opening brace.
  auto with = [](const std::string& json, const std::string& field) { return "{" + field + "," + json.substr(1); };
  auto error_of = [&](const std::string& json) -> std::string {
    try {
      load_hf_config(write(json));
    } catch (const ConfigError& e) {
      return e.field() + ": " + e.reason();
    }
    return "accepted";
  };
  // Values the formulas cannot use are named by their own key.
  const std::string no_scaling =
      std::regex_replace(deepseek, std::regex(R"("routed_scaling_factor": [0-9.e+-]+,)"), "");
  ASSERT_NE(no_scaling, deepseek);
  EXPECT_EQ(error_of(with(no_scaling, R"("routed_scaling_factor": -1)")),
            "routed_scaling_factor: must be positive (it scales the routed experts' sum)");
  const std::string bad_value_dim = std::regex_replace(deepseek, std::regex(R"("v_head_dim": [0-9]+)"), R"("v_head_dim": 0)");
  ASSERT_NE(bad_value_dim, deepseek);
  EXPECT_EQ(error_of(bad_value_dim), "v_head_dim: must be positive (MLA)");
  EXPECT_EQ(error_of(with(deepseek, R"("topk_method": "group_limited_greedy")")),
            "topk_method: is not supported (only greedy top-k routing is implemented)");
  EXPECT_EQ(error_of(with(deepseek, R"("moe_layer_freq": 2)")).substr(0, 16), "moe_layer_freq: ");
  EXPECT_EQ(error_of(with(deepseek, R"("scoring_func": "sigmoid")")).substr(0, 14), "scoring_func: ");
  EXPECT_EQ(error_of(with(qwen, R"("decoder_sparse_step": 2)")).substr(0, 21), "decoder_sparse_step: ");
  EXPECT_EQ(error_of(with(qwen, R"("mlp_only_layers": [1])")).substr(0, 17), "mlp_only_layers: ");
  EXPECT_EQ(error_of(with(qwen, R"("use_sliding_window": true)")).substr(0, 20), "use_sliding_window: ");
  EXPECT_EQ(error_of(with(qwen, R"("attention_bias": true)")).substr(0, 16), "attention_bias: ");
  EXPECT_EQ(error_of(with(mixtral, R"("hidden_act": "gelu")")),
            "hidden_act: is not supported (only SwiGLU with silu is implemented)");
  EXPECT_EQ(error_of(with(mixtral, R"("sliding_window": 4)")).substr(0, 16), "sliding_window: ");
  // Without max_position_embeddings a window is compared with MixtralConfig's default, not with 0.
  const std::string no_max_position =
      std::regex_replace(mixtral, std::regex(R"("max_position_embeddings": [0-9]+,)"), "");
  ASSERT_NE(no_max_position, mixtral);
  EXPECT_EQ(error_of(with(no_max_position, R"("sliding_window": 4096)")).substr(0, 16), "sliding_window: ");
  EXPECT_EQ(error_of(with(no_max_position, R"("sliding_window": 131072)")), "accepted");
  // null is MixtralConfig's default as well (transformers writes None as null): the window is compared with
  // 131072, and head_dim is hidden_size / num_attention_heads.
  const std::string null_max_position = with(no_max_position, R"("max_position_embeddings": null)");
  EXPECT_EQ(error_of(with(null_max_position, R"("sliding_window": 4096)")).substr(0, 16), "sliding_window: ");
  EXPECT_EQ(load_hf_config(write(null_max_position)).max_position, 4096 * 32);
  const std::string no_head_dim = std::regex_replace(mixtral, std::regex(R"("head_dim": [0-9]+,)"), "");
  ASSERT_NE(no_head_dim, mixtral);
  const ModelConfig tiny_mixtral = model_preset("tiny-mixtral");
  EXPECT_EQ(load_hf_config(write(with(no_head_dim, R"("head_dim": null)"))).head_dim,
            tiny_mixtral.hidden / tiny_mixtral.q_heads);
  EXPECT_EQ(error_of(std::regex_replace(mixtral, std::regex(R"("max_position_embeddings": [0-9]+)"),
                                        R"("max_position_embeddings": -5)")),
            "max_position_embeddings: must not be negative (0: not known)");
  // DeepSeek-V2's attention is MLA: no latent is an error, not GQA.
  const std::string no_latent =
      std::regex_replace(deepseek, std::regex(R"("kv_lora_rank": [0-9]+)"), R"("kv_lora_rank": 0)");
  ASSERT_NE(no_latent, deepseek);
  EXPECT_EQ(error_of(no_latent).substr(0, 14), "kv_lora_rank: ");
  // The values that leave the math as implemented are fine.
  for (const std::string& json :
       {with(deepseek, R"("topk_method": "greedy", "moe_layer_freq": 1, "scoring_func": "softmax")"),
        with(qwen, R"("decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": false)"),
        with(mixtral, R"("sliding_window": null, "hidden_act": "silu", "attention_bias": false)"),
        with(mixtral, R"("sliding_window": 1000000)")})
    EXPECT_EQ(error_of(json), "accepted") << json;
  // n_shared_experts must be given (the two published defaults differ); a
  // missing q_lora_rank is DeepseekV2Config's 1536, null none.
  const std::string no_shared = std::regex_replace(deepseek, std::regex(R"("n_shared_experts": [0-9]+,)"), "");
  EXPECT_EQ(error_of(no_shared).substr(0, 18), "n_shared_experts: ");
  const std::string no_q_lora = std::regex_replace(deepseek, std::regex(R"("q_lora_rank": [a-z0-9]+,)"), "");
  ASSERT_NE(no_q_lora, deepseek);
  EXPECT_EQ(load_hf_config(write(no_q_lora)).q_lora_rank, 1536);
  // One architecture, and a model_type of that architecture (transformers picks its class by model_type).
  const std::string llama =
      std::regex_replace(qwen, std::regex(R"("model_type": "qwen3_moe")"), R"("model_type": "llama")");
  ASSERT_NE(llama, qwen);
  EXPECT_EQ(error_of(llama), "model_type: 'llama' is not Qwen3MoeForCausalLM's ('qwen3_moe')");
  const std::string two = std::regex_replace(qwen, std::regex(R"(\["Qwen3MoeForCausalLM"\])"),
                                             R"(["Qwen3MoeForCausalLM", "MixtralForCausalLM"])");
  ASSERT_NE(two, qwen);
  EXPECT_EQ(error_of(two), "architectures: must name one architecture, not 2");
  // YaRN stretches a context: a factor under 1 is no YaRN.
  const std::string lite = hf_config_json(model_preset("deepseek-v2-lite"), ConfigFormat::hub, TensorDType::bf16);
  const std::string shrinking = std::regex_replace(lite, std::regex(R"("factor": [0-9.e+]+)"), R"("factor": 0.5)");
  ASSERT_NE(shrinking, lite);
  EXPECT_EQ(error_of(shrinking), "rope_scaling.factor: must be at least 1 (YaRN stretches the original context by it)");
}

// A written config.json says what transformers needs to load it: the
// model_type its class is picked by, and the weights' dtype in each format's key.
TEST_F(HfConfigTest, WrittenConfigsNameTheirModelTypeAndDtype) {
  const ModelConfig qwen = model_preset("tiny-qwen3-moe");
  const std::string hub = hf_config_json(qwen, ConfigFormat::hub, TensorDType::f16);
  EXPECT_NE(hub.find(R"("model_type": "qwen3_moe")"), std::string::npos) << hub;
  EXPECT_NE(hub.find(R"("torch_dtype": "float16")"), std::string::npos) << hub;
  const std::string v5 =
      hf_config_json(model_preset("tiny-deepseek-v2"), ConfigFormat::transformers5, TensorDType::f32);
  EXPECT_NE(v5.find(R"("model_type": "deepseek_v2")"), std::string::npos) << v5;
  EXPECT_NE(v5.find(R"("dtype": "float32")"), std::string::npos) << v5;
  const std::string mixtral = hf_config_json(model_preset("tiny-mixtral"), ConfigFormat::hub, TensorDType::bf16);
  EXPECT_NE(mixtral.find(R"("model_type": "mixtral")"), std::string::npos) << mixtral;
  EXPECT_NE(mixtral.find(R"("torch_dtype": "bfloat16")"), std::string::npos) << mixtral;
}

// Memory plans use closed forms; they must count what the tensor list holds.
TEST(ModelConfig, ClosedFormCountsMatchTheTensorList) {
  for (const std::string& name : model_preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = model_preset(name);
    std::int64_t total = 0, norms = 0, routed = 0;
    for (const TensorSpec& spec : weight_specs(c)) {
      total += spec.elements();
      if (spec.is_norm) norms += spec.elements();
      if (spec.name.find(".experts.") != std::string::npos) routed += spec.elements();
    }
    EXPECT_EQ(c.parameters(), total);
    EXPECT_EQ(c.norm_parameters(), norms);
    EXPECT_EQ(c.routed_expert_parameters(), routed);
  }
}

// DeepSeek's MoEGate renormalises only for top_k > 1; the other routers whenever asked.
TEST(ModelConfig, DeepSeekRenormalisesOnlyAboveTopOne) {
  for (const char* name : {"tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"}) {
    ModelConfig c = model_preset(name);
    c.normalize_topk = true;
    c.experts_per_token = 1;
    EXPECT_EQ(c.router_normalizes(), c.architecture != Architecture::deepseek_v2) << name;
    c.experts_per_token = 2;
    EXPECT_TRUE(c.router_normalizes()) << name;
  }
}

}  // namespace
}  // namespace writescope
