#pragma once
// The plain host reference model on a model's synthetic bf16 weights, and a
// logits comparison, for the model runtime and system tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moe/reference_model.hpp"
#include "moe/weights.hpp"

namespace writescope::test {

/// The reference model on the same bf16 weights, with a bf16 KV cache.
inline ReferenceModel reference_for(const ModelConfig& config, std::uint64_t seed) {
  std::vector<std::vector<float>> weights;
  for (const TensorSpec& spec : weight_specs(config)) {
    weights.emplace_back();
    for (bf16 v : synthetic_tensor<bf16>(spec, seed)) weights.back().push_back(to_float(v));
  }
  ReferenceModel model(config, std::move(weights));
  model.round_kv_cache_to_bf16(true);
  return model;
}

/// Runtime vs reference logits, relative to the largest |logit|. Both round
/// cached keys and values to bf16, so a last-bit fp32 difference in a key
/// (another summation order: AVX2, AVX-512 or scalar products) can flip its
/// bf16 rounding (2^-9 relative) and move the logits by a few 1e-4; a wrong
/// kernel moves them by 1e-2 and more.
inline constexpr double model_logit_tolerance = 1e-3;

/// Every logit within tolerance x (1 + the largest |expected|).
inline void expect_logits_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance,
                               const std::string& where) {
  ASSERT_EQ(actual.size(), expected.size()) << where;
  double scale = 0;
  for (float e : expected) scale = std::max(scale, static_cast<double>(std::abs(e)));
  for (std::size_t v = 0; v < expected.size(); ++v)
    ASSERT_NEAR(actual[v], expected[v], tolerance * (1 + scale)) << where << " vocab " << v;
}

}  // namespace writescope::test
