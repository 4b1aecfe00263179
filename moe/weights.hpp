#pragma once
// The weight tensors of a model: their Hugging Face names and shapes for each
// architecture, deterministic synthetic values, and loading from a checkpoint.
//
// Shapes follow the checkpoints: linear layers are (out_features, in_features),
// row-major. Synthetic weights are seeded per tensor name (so any subset of
// tensors can be generated independently, in any order) and scaled by
// 1/sqrt(in_features) so activations stay finite through every layer; norm
// weights are 1.

#include <cstdint>
#include <string>
#include <vector>

#include "moe/model_config.hpp"
#include "moe/safetensors.hpp"

namespace writescope {

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  bool is_norm = false;  // a norm's scale vector (synthetic value 1)
  std::int64_t elements() const;
};

/// Every weight tensor of `config`, in checkpoint naming, in layer order.
std::vector<TensorSpec> weight_specs(const ModelConfig& config);

/// Deterministic synthetic values of `spec` for `seed`, converted to Scalar.
template <class Scalar>
std::vector<Scalar> synthetic_tensor(const TensorSpec& spec, std::uint64_t seed);

/// The config.json formats checkpoints come in: the Hub's (top-level
/// rope_theta and rope_scaling, Qwen3's num_experts) and transformers 5's
/// (rope_parameters with rope_type, Qwen3's num_local_experts).
enum class ConfigFormat { hub, transformers5 };

/// `config` as a config.json of `format` (load_hf_config reads it back), with
/// the model_type transformers picks its class by and `dtype`, the weights'.
std::string hf_config_json(const ModelConfig& config, ConfigFormat format, TensorDType dtype);

/// Writes a complete synthetic checkpoint (config.json + model.safetensors) of a
/// small model, e.g. for tests and examples; the values equal synthetic_tensor.
/// Throws CheckpointError, writing nothing, where either file already exists.
void write_synthetic_checkpoint(const std::string& folder, const ModelConfig& config, std::uint64_t seed,
                                TensorDType dtype, ConfigFormat format = ConfigFormat::hub);

/// The tensors of `checkpoint` that `config` does not use (a config.json that
/// disagrees with its weights: fewer layers, tied embeddings beside an
/// lm_head, no shared experts), by name.
std::vector<std::string> unused_tensors(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

/// Throws CheckpointError, naming the tensor and both shapes, where the
/// tensors that fix `config`'s sizes (embedding, head, the first, first
/// routed and last layers with their first and last experts) are missing
/// from `checkpoint` or shaped otherwise: a config.json that disagrees with
/// its weights, found before anything is sized from it (two billion experts
/// listed tensor by tensor until memory runs out; a budget blamed for a
/// vocabulary the weights do not have).
void check_checkpoint_sizes(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

/// Reads every tensor of weight_specs(config) from `checkpoint`, checking shapes.
template <class Scalar>
std::vector<std::vector<Scalar>> load_weights(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

extern template std::vector<float> synthetic_tensor<float>(const TensorSpec&, std::uint64_t);
extern template std::vector<bf16> synthetic_tensor<bf16>(const TensorSpec&, std::uint64_t);
extern template std::vector<std::vector<float>> load_weights<float>(const SafetensorsCheckpoint&, const ModelConfig&);
extern template std::vector<std::vector<bf16>> load_weights<bf16>(const SafetensorsCheckpoint&, const ModelConfig&);

}  // namespace writescope
