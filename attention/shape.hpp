#pragma once
// Attention head geometry of the supported models.

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "layouts/kv_format.hpp"

namespace writescope {

struct AttentionShape {
  std::string name = "custom";  // model name; machine profiles key CPU attention rates by it
  int q_heads = 32;
  int kv_heads = 4;      // MLA: 1 (the shared latent)
  int key_dim = 128;     // MLA: kv_lora_rank + rope dims (512 + 64)
  int value_dim = 128;   // MLA: kv_lora_rank (512); values are the keys' first value_dim entries
  bool values_in_keys = false;
  float softmax_scale = 0.0f;  // scores are scale * q.k; 0 means 1/sqrt(key_dim)

  int group() const { return q_heads / kv_heads; }
  float scale() const { return softmax_scale > 0 ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(key_dim)); }
  /// The KV block geometry that stores this attention's keys and values.
  BlockGeometry block_geometry(int block_tokens) const {
    return BlockGeometry{block_tokens, kv_heads, key_dim, value_dim, values_in_keys};
  }
  /// Throws std::invalid_argument unless q_heads is a positive multiple of kv_heads etc.
  void validate() const;
  /// KV bytes of one token stored `scalar_bytes` wide: its keys and (unless
  /// they are the keys, MLA's latent) values of every KV head; what a decode
  /// step reads per token.
  std::int64_t kv_bytes_per_token(std::size_t scalar_bytes) const {
    return std::int64_t{kv_heads} * (key_dim + (values_in_keys ? 0 : value_dim)) * static_cast<std::int64_t>(scalar_bytes);
  }
  /// fp32 lane-FMAs per KV byte when the cache stores `scalar_bytes`-wide
  /// elements (QK^T and P.V of every query head of a group).
  double fmas_per_byte(std::size_t scalar_bytes) const {
    return static_cast<double>(group()) * (key_dim + value_dim) * kv_heads /
           static_cast<double>(kv_bytes_per_token(scalar_bytes));
  }
};

/// The shape of a supported model by name ("qwen3-30b-a3b", "mixtral-8x7b",
/// "deepseek-v2-lite"); std::invalid_argument lists the names otherwise.
AttentionShape attention_shape(const std::string& name);
/// Every supported model's shape.
std::vector<AttentionShape> supported_attention_shapes();

/// Qwen3-30B-A3B: 32 query / 4 KV heads, d = 128.
AttentionShape qwen3_30b_a3b_attention();
/// Mixtral-8x7B: 32 query / 8 KV heads, d = 128.
AttentionShape mixtral_8x7b_attention();
/// DeepSeek-V2-Lite, absorbed MLA: 16 query heads over one latent of 512 + 64
/// rope dims; the output is in the 512-wide latent. Scale 1/sqrt(128 + 64)
/// (qk_nope_head_dim + qk_rope_head_dim) as in the model.
AttentionShape deepseek_v2_lite_mla_attention();

}  // namespace writescope
