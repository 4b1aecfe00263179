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

AttentionShape qwen3_30b_a3b_attention() { return AttentionShape{32, 4, 128, 128, false, 0.0f}; }
AttentionShape mixtral_8x7b_attention() { return AttentionShape{32, 8, 128, 128, false, 0.0f}; }
AttentionShape deepseek_v2_lite_mla_attention() {
  return AttentionShape{16, 1, 576, 512, true, 1.0f / std::sqrt(192.0f)};
}

}  // namespace writescope
