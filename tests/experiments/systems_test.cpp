#include "experiments/systems.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "model_reference.hpp"
#include "test_profile.hpp"

namespace writescope {
namespace {

using test::expect_logits_near;
using test::reference_for;

constexpr std::uint64_t mib = 1 << 20;

/// A VRAM budget with room for the weights, workspace, `experts` routed
/// experts and `kv_blocks` KV blocks of 4 tokens per layer.
ModelOptions options_for(const ModelConfig& config, const System& system, int experts, int kv_blocks) {
  ModelOptions options;
  options.block_tokens = 4;
  options.max_rows = 8;
  options.stream_chunk_blocks = 2;
  options.kv_policy = system.kv_policy;
  options.experts = system.experts;
  options.micro_batches = system.micro_batches;
  const VramUse fixed = MoeModel::fixed_vram(config, options);
  const std::uint64_t block_bytes =
      static_cast<std::uint64_t>(config.attention().block_geometry(4).block_elements()) * sizeof(bf16);
  options.vram_budget = fixed.weights + fixed.workspace + experts * MoeModel::expert_bytes(config) +
                        static_cast<std::uint64_t>(kv_blocks) * config.layers * block_bytes;
  options.pinned_kv_budget = 4 * mib;
  options.host_kv_budget = 4 * mib;
  return options;
}


class SystemsTest : public ::testing::TestWithParam<std::string> {};

// Every system decodes two sequences together (MoE-Lightning in two
// micro-batches) and matches the reference, within its budgets.
TEST_P(SystemsTest, MatchesTheReferenceWithinItsBudgets) {
  const std::string name = GetParam();
  for (const char* model_name : {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(model_name);
    const ModelConfig config = model_preset(model_name);
    SystemContext context{config, test::tiny_profile(), 2, 12, SystemOptions{}};
    context.options.expert_vram_share = 1.0;  // expert slots take what the KV blocks below leave
    System system = make_system(name, context);
    if (name == "moe-lightning") system.micro_batches = 2;
    const int moe_layers = config.layers - config.dense_layers;
    // Room for a third of the experts and 2 KV blocks per layer: the rest spills.
    const int experts = name == "gpu-only" || name == "moe-lightning" ? 2 * config.experts * moe_layers
                        : name == "fiddler" || name == "hybrimoe"    ? config.experts * moe_layers / 3
                                                                     : 0;
    const int kv_blocks = name == "gpu-only" ? 8 : 2;
    const ModelOptions options = options_for(config, system, experts, kv_blocks);
    MoeModel model = MoeModel::synthetic(config, 4, options);
    const VramUse& use = model.vram_use();
    EXPECT_LE(use.weights + use.workspace + use.expert_slots + use.kv, options.vram_budget);

    const std::vector<std::vector<int>> prompts{{5, 17, 200, 3, 99}, {31, 64, 128, 7, 8}};
    std::vector<ReferenceModel> references{reference_for(config, 4), reference_for(config, 4)};
    std::vector<int> sequences, tokens;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      sequences.push_back(model.add_sequence(12));
      expect_logits_near(model.prefill(sequences[i], prompts[i]), references[i].forward(prompts[i]),
                         test::model_logit_tolerance, "prefill");
      tokens.push_back(1 + static_cast<int>(i));
    }
    for (int step = 0; step < 6; ++step) {
      if (step == 2) model.end_warmup();
      const auto logits = model.step(sequences, tokens);
      for (std::size_t i = 0; i < sequences.size(); ++i) {
        expect_logits_near(logits[i], references[i].forward({tokens[i]}), test::model_logit_tolerance,
                           "step " + std::to_string(step));
        tokens[i] = static_cast<int>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
      }
    }
    // Each system's KV stays where its policy puts it.
    const auto& cache = model.cache();
    const std::uint64_t vram = cache.region_bytes(Region::gpu_resident),
                        streamed = cache.region_bytes(Region::gpu_streamed),
                        host = cache.region_bytes(Region::cpu_resident),
                        cpu_band = cache.region_bytes(Region::cpu_streamed);
    if (name == "gpu-only") {
      EXPECT_GT(vram, 0u);
      EXPECT_EQ(streamed + host + cpu_band, 0u);
    } else if (name == "moe-lightning") {
      EXPECT_GT(host, 0u);
      EXPECT_EQ(vram + streamed + cpu_band, 0u);
    } else if (name != "writescope") {
      EXPECT_GT(vram, 0u);
      EXPECT_GT(streamed, 0u);
      EXPECT_EQ(host + cpu_band, 0u);
    }
    EXPECT_LE(vram, use.kv);
  }
}

INSTANTIATE_TEST_SUITE_P(EverySystem, SystemsTest, ::testing::ValuesIn(system_names()),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Systems, UnknownNamesAreClearErrors) {
  SystemContext context{model_preset("tiny-mixtral"), test::tiny_profile(), 1, 16, SystemOptions{}};
  try {
    make_system("vllm", context);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown system 'vllm' (known: writescope, fiddler"), std::string::npos)
        << e.what();
  }
  context.options.writescope_experts = "moe-lightning";
  EXPECT_THROW(make_system("writescope", context), std::invalid_argument);
}

Routing routing_of(const std::vector<int>& tokens_per_expert) {
  Routing routing;
  int row = 0;
  for (int tokens : tokens_per_expert) {
    routing.rows.emplace_back();
    routing.weights.emplace_back();
    for (int t = 0; t < tokens; ++t) routing.rows.back().push_back(row++), routing.weights.back().push_back(0.5f);
  }
  return routing;
}

TEST(Systems, HybriMoeSplitsGreedilyAndCachesByScore) {
  // GPU and CPU cost about the same per expert: the GPU takes the most loaded
  // experts, the CPU the least loaded, alternating by accumulated time.
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.hbm_gbps = 1e9;            // GPU compute is free...
  profile.pinned_h2d_gbps = 1e-3;    // ...but a transfer costs a lot
  const ModelConfig config = model_preset("tiny-mixtral");
  SystemContext context{config, profile, 4, 16, SystemOptions{}};
  const auto policy = hybrimoe_experts(context);
  ExpertResidency residency(config.layers, config.experts, 2);
  residency.assign(0, 0, 3);  // expert 3 of layer 0 is cached
  const ExpertPlan plan = policy->plan(0, routing_of({1, 0, 2, 4, 0, 0, 1, 0}), residency);
  // Expert 3 (most tokens, resident) goes to the GPU at no cost; the GPU's
  // next candidate (expert 2) would pay a transfer, so after it the CPU takes the rest.
  ASSERT_FALSE(plan.gpu.empty());
  EXPECT_EQ(plan.gpu.front(), 3);
  std::vector<int> all = plan.gpu;
  all.insert(all.end(), plan.cpu.begin(), plan.cpu.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int>{0, 2, 3, 6}));
  for (int e : plan.cpu) EXPECT_NE(e, 3);
  // A non-resident GPU expert is loaded into the free slot.
  for (int e : plan.gpu)
    if (e != 3) {
      ASSERT_EQ(plan.loads.size(), 1u);
      EXPECT_EQ(plan.loads.front().expert, e);
      EXPECT_EQ(plan.loads.front().slot, 1);
    }
}

TEST(Systems, FiddlerPlacesTheWarmUpsMostPopularExperts) {
  const ModelConfig config = model_preset("tiny-mixtral");
  SystemContext context{config, test::tiny_profile(), 4, 16, SystemOptions{}};
  const auto policy = fiddler_experts(context);
  ExpertResidency residency(config.layers, config.experts, 2);
  policy->plan(0, routing_of({1, 0, 5, 0, 0, 0, 0, 2}), residency);
  policy->plan(1, routing_of({0, 3, 0, 0, 0, 0, 0, 0}), residency);
  const auto loads = policy->end_warmup(residency);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].layer, 0);
  EXPECT_EQ(loads[0].expert, 2);
  EXPECT_EQ(loads[1].layer, 1);
  EXPECT_EQ(loads[1].expert, 1);
}

}  // namespace
}  // namespace writescope
