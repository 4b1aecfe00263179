#include "moe/weights.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "framework/hash.hpp"
#include "framework/launch.hpp"
#include "framework/machine.hpp"

namespace writescope {
namespace {

/// out[i] = uniform in [-amplitude, amplitude) from a hash of base + i.
template <class Scalar>
struct SyntheticValues {
  Scalar* out;
  std::uint64_t base;
  double amplitude;
  void operator()(std::size_t i) const {
    const double unit = static_cast<double>(splitmix64(base + i) >> 11) * 0x1.0p-53;  // [0, 1)
    out[i] = from_float<Scalar>(static_cast<float>((2.0 * unit - 1.0) * amplitude));
  }
};

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

class SpecList {
 public:
  void linear(const std::string& name, std::int64_t out, std::int64_t in) { specs_.push_back({name, {out, in}, false}); }
  void norm(const std::string& name, std::int64_t size) { specs_.push_back({name, {size}, true}); }
  void swiglu(const std::string& prefix, std::int64_t hidden, std::int64_t intermediate, const char* gate,
              const char* up, const char* down) {
    linear(prefix + gate + ".weight", intermediate, hidden);
    linear(prefix + up + ".weight", intermediate, hidden);
    linear(prefix + down + ".weight", hidden, intermediate);
  }
  std::vector<TensorSpec> take() { return std::move(specs_); }

 private:
  std::vector<TensorSpec> specs_;
};

}  // namespace

std::int64_t TensorSpec::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

/// Which routed experts layer_specs lists: all, or the first and the last.
enum class Experts { all, first_and_last };

/// The tensors of layer `layer` of `c`, in weight_specs order.
void layer_specs(SpecList& s, const ModelConfig& c, int layer, Experts experts) {
  const std::int64_t h = c.hidden;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  s.norm(p + "input_layernorm.weight", h);
  s.norm(p + "post_attention_layernorm.weight", h);
  if (c.mla()) {
    const std::int64_t q_dim = std::int64_t{c.q_heads} * (c.qk_nope_head_dim + c.qk_rope_head_dim);
    if (c.q_lora_rank > 0) {
      s.linear(p + "self_attn.q_a_proj.weight", c.q_lora_rank, h);
      s.norm(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank);
      s.linear(p + "self_attn.q_b_proj.weight", q_dim, c.q_lora_rank);
    } else {
      s.linear(p + "self_attn.q_proj.weight", q_dim, h);
    }
    s.linear(p + "self_attn.kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, h);
    s.norm(p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
    s.linear(p + "self_attn.kv_b_proj.weight", std::int64_t{c.q_heads} * (c.qk_nope_head_dim + c.v_head_dim),
             c.kv_lora_rank);
    s.linear(p + "self_attn.o_proj.weight", h, std::int64_t{c.q_heads} * c.v_head_dim);
  } else {
    s.linear(p + "self_attn.q_proj.weight", std::int64_t{c.q_heads} * c.head_dim, h);
    s.linear(p + "self_attn.k_proj.weight", std::int64_t{c.kv_heads} * c.head_dim, h);
    s.linear(p + "self_attn.v_proj.weight", std::int64_t{c.kv_heads} * c.head_dim, h);
    s.linear(p + "self_attn.o_proj.weight", h, std::int64_t{c.q_heads} * c.head_dim);
    if (c.qk_norm) {
      s.norm(p + "self_attn.q_norm.weight", c.head_dim);
      s.norm(p + "self_attn.k_norm.weight", c.head_dim);
    }
  }
  if (layer < c.dense_layers) {
    s.swiglu(p + "mlp.", h, c.dense_intermediate, "gate_proj", "up_proj", "down_proj");
    return;
  }
  const bool mixtral = c.architecture == Architecture::mixtral;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  s.linear(moe + "gate.weight", c.experts, h);
  auto expert = [&](int e) {
    const std::string prefix = moe + "experts." + std::to_string(e) + ".";
    if (mixtral) s.swiglu(prefix, h, c.expert_intermediate, "w1", "w3", "w2");
    else s.swiglu(prefix, h, c.expert_intermediate, "gate_proj", "up_proj", "down_proj");
  };
  if (experts == Experts::all) {
    for (int e = 0; e < c.experts; ++e) expert(e);
  } else {
    expert(0);
    if (c.experts > 1) expert(c.experts - 1);
  }
  if (c.shared_experts > 0)
    s.swiglu(moe + "shared_experts.", h, std::int64_t{c.shared_experts} * c.expert_intermediate, "gate_proj",
             "up_proj", "down_proj");
}

/// weight_specs of the layers `layers` lists (ascending, each once).
std::vector<TensorSpec> specs_of_layers(const ModelConfig& c, const std::vector<int>& layers, Experts experts) {
  SpecList s;
  s.linear("model.embed_tokens.weight", c.vocab, c.hidden);
  for (int layer : layers) layer_specs(s, c, layer, experts);
  s.norm("model.norm.weight", c.hidden);
  if (!c.tied_embeddings) s.linear("lm_head.weight", c.vocab, c.hidden);
  return s.take();
}

}  // namespace

std::vector<TensorSpec> weight_specs(const ModelConfig& c) {
  std::vector<int> layers(static_cast<std::size_t>(c.layers));
  std::iota(layers.begin(), layers.end(), 0);
  return specs_of_layers(c, layers, Experts::all);
}

void check_checkpoint_sizes(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  // The first layer, the first with routed experts, the last; their first and last experts.
  const std::set<int> layers{0, std::min(config.dense_layers, config.layers - 1), config.layers - 1};
  for (const TensorSpec& spec :
       specs_of_layers(config, std::vector<int>(layers.begin(), layers.end()), Experts::first_and_last)) {
    const std::string disagrees =
        "checkpoint " + checkpoint.folder() + ": its config.json disagrees with its weights: tensor '" + spec.name + "' ";
    if (!checkpoint.contains(spec.name))
      throw CheckpointError(disagrees + "(" + shape_text(spec.shape) +
                            " by config.json's sizes) is not in the checkpoint");
    if (const TensorInfo& info = checkpoint.info(spec.name); info.shape != spec.shape)
      throw CheckpointError(disagrees + "has shape " + shape_text(info.shape) + ", where config.json's sizes give " +
                            shape_text(spec.shape));
  }
}

template <class Scalar>
std::vector<Scalar> synthetic_tensor(const TensorSpec& spec, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(spec.elements());
  std::vector<Scalar> out(n);
  if (spec.is_norm) {
    for (auto& x : out) x = from_float<Scalar>(1.0f);
    return out;
  }
  // Uniform with standard deviation 1/sqrt(in_features): sqrt(3) / sqrt(in) amplitude.
  const double amplitude = std::sqrt(3.0 / static_cast<double>(spec.shape.back()));
  // Element i depends on i only, so the host threads split the tensor (full-size models have 10^10 values).
  launch_parallel_for("writescope::moe::synthetic_tensor",
                       Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, n),
                       SyntheticValues<Scalar>{out.data(), name_hash(spec.name) ^ splitmix64(seed), amplitude});
  Kokkos::DefaultHostExecutionSpace().fence();
  return out;
}

template std::vector<float> synthetic_tensor<float>(const TensorSpec&, std::uint64_t);
template std::vector<bf16> synthetic_tensor<bf16>(const TensorSpec&, std::uint64_t);

std::string hf_config_json(const ModelConfig& c, ConfigFormat format, TensorDType dtype) {
  const bool v5 = format == ConfigFormat::transformers5;
  std::ostringstream j;
  j.precision(17);
  const char* kind = c.architecture == Architecture::deepseek_v2 ? "DeepseekV2ForCausalLM"
                     : c.architecture == Architecture::qwen3_moe ? "Qwen3MoeForCausalLM"
                                                                 : "MixtralForCausalLM";
  const char* torch_dtype = dtype == TensorDType::bf16 ? "bfloat16" : dtype == TensorDType::f16 ? "float16" : "float32";
  j << "{\n  \"architectures\": [\"" << kind << "\"],\n  \"model_type\": \"" << architecture_name(c.architecture)
    << "\",\n  \"" << (v5 ? "dtype" : "torch_dtype") << "\": \"" << torch_dtype << "\",\n  \"_name_or_path\": \""
    << c.name << "\",\n"
    << "  \"hidden_size\": " << c.hidden << ",\n  \"num_hidden_layers\": " << c.layers << ",\n"
    << "  \"num_attention_heads\": " << c.q_heads << ",\n  \"num_key_value_heads\": " << c.kv_heads << ",\n"
    << "  \"vocab_size\": " << c.vocab << ",\n  \"max_position_embeddings\": " << c.max_position << ",\n"
    << "  \"rms_norm_eps\": " << c.rms_eps << ",\n"
    << "  \"num_experts_per_tok\": " << c.experts_per_token << ",\n"
    << "  \"tie_word_embeddings\": " << (c.tied_embeddings ? "true" : "false") << ",\n";
  if (c.architecture == Architecture::deepseek_v2) {
    j << "  \"q_lora_rank\": " << (c.q_lora_rank > 0 ? std::to_string(c.q_lora_rank) : "null") << ",\n"
      << "  \"kv_lora_rank\": " << c.kv_lora_rank << ",\n  \"qk_nope_head_dim\": " << c.qk_nope_head_dim << ",\n"
      << "  \"qk_rope_head_dim\": " << c.qk_rope_head_dim << ",\n  \"v_head_dim\": " << c.v_head_dim << ",\n"
      << "  \"n_routed_experts\": " << c.experts << ",\n  \"moe_intermediate_size\": " << c.expert_intermediate
      << ",\n  \"n_shared_experts\": " << c.shared_experts << ",\n  \"norm_topk_prob\": "
      << (c.normalize_topk ? "true" : "false") << ",\n  \"routed_scaling_factor\": " << c.routed_scaling_factor
      << ",\n  \"first_k_dense_replace\": " << c.dense_layers << ",\n  \"intermediate_size\": "
      << c.dense_intermediate;
  } else if (c.architecture == Architecture::qwen3_moe) {
    j << "  \"head_dim\": " << c.head_dim << ",\n  \"" << (v5 ? "num_local_experts" : "num_experts") << "\": " << c.experts
      << ",\n  \"moe_intermediate_size\": " << c.expert_intermediate << ",\n  \"norm_topk_prob\": "
      << (c.normalize_topk ? "true" : "false");
  } else {
    j << "  \"head_dim\": " << c.head_dim << ",\n  \"num_local_experts\": " << c.experts
      << ",\n  \"intermediate_size\": " << c.expert_intermediate;
  }
  // Rotary settings: top-level (Hub; YaRN as rope_scaling with "type") or
  // all in rope_parameters (transformers 5, "rope_type").
  const bool yarn = c.rope_scaling.type == "yarn";
  std::ostringstream yarn_fields;
  yarn_fields.precision(17);
  if (yarn)
    yarn_fields << ", \"factor\": " << c.rope_scaling.factor << ", \"original_max_position_embeddings\": "
                << c.rope_scaling.original_max_position << ", \"beta_fast\": " << c.rope_scaling.beta_fast
                << ", \"beta_slow\": " << c.rope_scaling.beta_slow << ", \"mscale\": " << c.rope_scaling.mscale
                << ", \"mscale_all_dim\": " << c.rope_scaling.mscale_all_dim;
  if (v5) {
    j << ",\n  \"rope_parameters\": {\"rope_theta\": " << c.rope_theta << ", \"rope_type\": \""
      << (yarn ? "yarn" : "default") << "\"" << yarn_fields.str() << "}";
  } else {
    j << ",\n  \"rope_theta\": " << c.rope_theta;
    if (yarn) j << ",\n  \"rope_scaling\": {\"type\": \"yarn\"" << yarn_fields.str() << "}";
  }
  j << "\n}\n";
  return j.str();
}

void write_synthetic_checkpoint(const std::string& folder, const ModelConfig& config, std::uint64_t seed,
                                TensorDType dtype, ConfigFormat format) {
  config.validate();
  const std::filesystem::path config_path = std::filesystem::path(folder) / "config.json",
                              weights_path = std::filesystem::path(folder) / "model.safetensors";
  // A checkpoint is never overwritten: the folder may hold a real one (a
  // sharded one's index included, which readers would take over the new file).
  const std::filesystem::path index_path = std::filesystem::path(folder) / "model.safetensors.index.json";
  for (const auto& path : {config_path, weights_path, index_path}) {
    std::error_code error;
    const auto type = std::filesystem::symlink_status(path, error).type();
    if (type == std::filesystem::file_type::not_found) continue;
    if (error) throw CheckpointError(path.string() + ": cannot tell whether it exists (" + error.message() + ")");
    throw CheckpointError(path.string() + " already exists; a checkpoint is written only where none of "
                          "config.json, model.safetensors and model.safetensors.index.json is");
  }
  // Every tensor is made in memory (fp32) before the file is written: a
  // full-size preset needs tens of GiB, refused here rather than by the allocator.
  std::uint64_t elements = 0;
  for (const TensorSpec& spec : weight_specs(config)) elements += static_cast<std::uint64_t>(spec.elements());
  const std::uint64_t memory = elements * sizeof(float), file = elements * dtype_bytes(dtype);
  if (const std::uint64_t available = available_host_memory(); memory > available)
    throw CheckpointError(folder + ": " + config.name + "'s synthetic weights take " + format_byte_size(memory) +
                          " of memory while written, but this machine has " + format_byte_size(available) +
                          " available (synthetic checkpoints are for the tiny presets)");
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) throw CheckpointError(folder + ": cannot create the folder (" + error.message() + ")");
  if (const auto space = std::filesystem::space(folder, error); !error && space.available < file)
    throw CheckpointError(folder + ": " + config.name + "'s model.safetensors takes " + format_byte_size(file) +
                          " but its file system has " + format_byte_size(space.available) + " free");
  // The weights first, config.json last: a folder with config.json is a
  // checkpoint, and a writer stopped before it leaves none (only a .partial
  // file, which the next try replaces).
  try {
    std::map<std::string, TensorToWrite> tensors;
    for (const TensorSpec& spec : weight_specs(config))
      tensors[spec.name] = TensorToWrite{dtype, spec.shape, synthetic_tensor<float>(spec, seed)};
    // What rebuilds the weights, once the folder is all that is left of them.
    write_safetensors(weights_path.string(), tensors,
                      {{"writer", "writescope make-checkpoint"}, {"model", config.name},
                       {"seed", std::to_string(seed)}, {"git_revision", git_revision()}});
    const std::filesystem::path partial = config_path.string() + ".partial";
    std::ofstream config_file(partial, std::ios::binary | std::ios::trunc);
    if (!config_file) throw CheckpointError(partial.string() + ": cannot create the file");
    if (!(config_file << hf_config_json(config, format, dtype)) || !config_file.flush())
      throw CheckpointError(partial.string() + ": write failed");
    config_file.close();
    std::error_code renamed;
    std::filesystem::rename(partial, config_path, renamed);
    if (renamed) throw CheckpointError(config_path.string() + ": write failed (" + renamed.message() + ")");
  } catch (...) {
    std::error_code ignored;  // no half checkpoint, which a second try would take for one
    std::filesystem::remove(config_path.string() + ".partial", ignored);
    std::filesystem::remove(weights_path, ignored);
    throw;
  }
}

std::vector<std::string> unused_tensors(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  std::set<std::string> used;
  for (const TensorSpec& spec : weight_specs(config)) used.insert(spec.name);
  std::vector<std::string> unused;
  for (const std::string& name : checkpoint.names())
    if (used.count(name) == 0) unused.push_back(name);
  return unused;
}

template <class Scalar>
std::vector<std::vector<Scalar>> load_weights(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  std::vector<std::vector<Scalar>> out;
  for (const TensorSpec& spec : weight_specs(config)) out.push_back(checkpoint.read<Scalar>(spec.name, spec.shape));
  return out;
}

template std::vector<std::vector<float>> load_weights<float>(const SafetensorsCheckpoint&, const ModelConfig&);
template std::vector<std::vector<bf16>> load_weights<bf16>(const SafetensorsCheckpoint&, const ModelConfig&);

}  // namespace writescope
