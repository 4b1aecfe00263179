#include "moe/model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "exec_spaces.hpp"

namespace writescope {
namespace {

template <class ExecSpace>
class MoeModelTest : public ::testing::Test {};
TYPED_TEST_SUITE(MoeModelTest, test::ExecSpaceTypes, test::ExecSpaceName);

/// The reference model on the same bf16 weights, with a bf16 KV cache.
ReferenceModel reference_for(const ModelConfig& config, std::uint64_t seed) {
  std::vector<std::vector<float>> weights;
  for (const TensorSpec& spec : weight_specs(config)) {
    weights.emplace_back();
    for (bf16 v : synthetic_tensor<bf16>(spec, seed)) weights.back().push_back(to_float(v));
  }
  ReferenceModel model(config, std::move(weights));
  model.round_kv_cache_to_bf16(true);
  return model;
}

TYPED_TEST(MoeModelTest, DecodeMatchesTheReferenceWhereverBlocksLive) {
  using ExecSpace = TypeParam;
  constexpr bool reads_host = Kokkos::SpaceAccessibility<ExecSpace, HostMemSpace>::accessible;
  for (const char* name : {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    // Blocks of 4 tokens cycle through the regions this space can read.
    const BlockPlacement placement = [](int layer, int sequence, int block) {
      const Region readable[] = {Region::gpu_resident, Region::gpu_streamed, Region::cpu_streamed,
                                 Region::cpu_resident};
      return readable[(layer + sequence + block) % (reads_host ? 4 : 3)];
    };
    const std::uint64_t mib = 1 << 20;
    MoeModel<ExecSpace> model =
        MoeModel<ExecSpace>::synthetic(config, 9, 4, KVCacheBudgets{mib, mib, mib}, placement);
    // Two sequences of different lengths decoded together.
    const std::vector<std::vector<int>> prompts{{5, 17, 200, 3, 99, 42, 7, 8, 11, 250, 1}, {31, 64, 128}};
    std::vector<ReferenceModel> references{reference_for(config, 9), reference_for(config, 9)};
    const int a = model.add_sequence(), b = model.add_sequence();
    for (std::size_t t = 0; t < prompts[0].size(); ++t) {
      std::vector<int> sequences{a}, tokens{prompts[0][t]};
      if (t < prompts[1].size()) sequences.push_back(b), tokens.push_back(prompts[1][t]);
      const auto logits = model.step(sequences, tokens);
      for (std::size_t i = 0; i < sequences.size(); ++i) {
        const auto expected = references[i].forward({tokens[i]});
        double scale = 0;
        for (float e : expected) scale = std::max(scale, static_cast<double>(std::abs(e)));
        for (std::size_t v = 0; v < expected.size(); ++v)
          ASSERT_NEAR(logits[i][v], expected[v], 1e-4 * (1 + scale)) << "step " << t << " sequence " << i << " vocab " << v;
      }
    }
    EXPECT_EQ(model.cache().length(0, a), static_cast<std::int64_t>(prompts[0].size()));
    EXPECT_THROW(model.step({a}, {config.vocab}), std::invalid_argument);
  }
}

}  // namespace
}  // namespace writescope
