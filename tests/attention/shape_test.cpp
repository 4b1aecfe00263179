#include "attention/shape.hpp"

#include <gtest/gtest.h>

#include "framework/bf16.hpp"

namespace writescope {
namespace {

// The KV bytes a decode step reads per token, by hand from the published
// shapes: calibration, the benchmarks and the systems' cost models count
// bytes with it, so a wrong count would pass off a wrong GB/s everywhere.
TEST(AttentionShape, KvBytesPerTokenAndMultiplyAddsPerByteByHand) {
  struct Expected {
    const char* name;
    std::int64_t bytes;    // per token, bf16
    double fmas_per_byte;  // group x (key_dim + value_dim) per head's KV bytes
  };
  // Qwen3-30B-A3B: 4 KV heads of 128 + 128, groups of 8. Mixtral-8x7B: 8 KV
  // heads of 128 + 128, groups of 4. DeepSeek-V2-Lite (absorbed MLA): one
  // latent of 512 + 64 read as keys and as values, 16 heads of 576 + 512.
  for (const Expected& e : {Expected{"qwen3-30b-a3b", 4 * 256 * 2, 8.0 * 256 / 512},
                            Expected{"mixtral-8x7b", 8 * 256 * 2, 4.0 * 256 / 512},
                            Expected{"deepseek-v2-lite", 576 * 2, 16.0 * (576 + 512) / 1152}}) {
    SCOPED_TRACE(e.name);
    const AttentionShape shape = attention_shape(e.name);
    EXPECT_EQ(shape.kv_bytes_per_token(sizeof(bf16)), e.bytes);
    EXPECT_DOUBLE_EQ(shape.fmas_per_byte(sizeof(bf16)), e.fmas_per_byte);
    // What the cache stores per token.
    const BlockGeometry geometry = shape.block_geometry(256);
    EXPECT_EQ(geometry.block_elements() * static_cast<std::int64_t>(sizeof(bf16)) / 256, e.bytes);
  }
}

}  // namespace
}  // namespace writescope
