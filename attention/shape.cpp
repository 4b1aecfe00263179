#include "attention/shape.hpp"

#include <stdexcept>

namespace writescope {

void AttentionShape::validate() const {
  if (q_heads < 1 || kv_heads < 1 || key_dim < 1 || value_dim < 1)
    throw std::invalid_argument("attention shape: head counts and dims must be positive");
  if (q_heads % kv_heads != 0)
    throw std::invalid_argument("attention shape: q_heads (" + std::to_string(q_heads) +
                                ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  if (values_in_keys && value_dim > key_dim)
    throw std::invalid_argument("attention shape: values stored in keys need value_dim <= key_dim");
}

AttentionShape qwen3_30b_a3b_attention() { return AttentionShape{"qwen3-30b-a3b", 32, 4, 128, 128, false, 0.0f}; }
AttentionShape mixtral_8x7b_attention() { return AttentionShape{"mixtral-8x7b", 32, 8, 128, 128, false, 0.0f}; }
AttentionShape deepseek_v2_lite_mla_attention() {
  return AttentionShape{"deepseek-v2-lite", 16, 1, 576, 512, true, 1.0f / std::sqrt(192.0f)};
}

std::vector<AttentionShape> supported_attention_shapes() {
  return {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()};
}

AttentionShape attention_shape(const std::string& name) {
  for (const AttentionShape& shape : supported_attention_shapes())
    if (shape.name == name) return shape;
  throw std::invalid_argument("unknown attention shape '" + name +
                              "' (expected qwen3-30b-a3b, mixtral-8x7b or deepseek-v2-lite)");
}

}  // namespace writescope
