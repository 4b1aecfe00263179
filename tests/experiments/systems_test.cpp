#include "experiments/systems.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "framework/concurrent.hpp"
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
void expect_matches_the_reference_within_its_budgets(const std::string& name) {
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
    } else if (name == "writescope") {
      // Without a GPU in the profile everything is the CPU's, in its regions;
      // with one, VRAM first and CPU-affine blocks beyond (WriteScopeWithAGpu
      // checks the whole placement).
      if (context.profile.has_gpu) {
        EXPECT_GT(vram, 0u);
      } else {
        EXPECT_EQ(vram + streamed, 0u);
      }
      EXPECT_GT(host + cpu_band, 0u);
    } else {
      EXPECT_GT(vram, 0u);
      EXPECT_GT(streamed, 0u);
      EXPECT_EQ(host + cpu_band, 0u);
    }
    EXPECT_LE(vram, use.kv);
  }
}

TEST_P(SystemsTest, MatchesTheReferenceWithinItsBudgets) { expect_matches_the_reference_within_its_budgets(GetParam()); }

// The same with the GPU's share of each step (split attention, GPU experts,
// MoE-Lightning's feed-forward stage) on its own host thread, as in a CUDA build.
TEST_P(SystemsTest, MatchesTheReferenceWithTheGpuShareOnItsOwnThread) {
  const ScopedGpuWorkerThread worker(true);
  const long threads_before = worker_tasks_run();
  expect_matches_the_reference_within_its_budgets(GetParam());
  EXPECT_GT(worker_tasks_run(), threads_before);
}

INSTANTIATE_TEST_SUITE_P(EverySystem, SystemsTest, ::testing::ValuesIn(system_names()),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// --- WriteScope on a machine with a GPU (the host build's GPU space) ---------

/// The test profile with a GPU: the link twice as fast as CPU attention, so
/// that the model gives the CPU about a third of the spilled KV; no fixed
/// latencies, which would outweigh the few KV bytes of the tiny models.
MachineProfile gpu_profile() {
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.gpu_launch_latency_s = profile.link_latency_s = profile.cpu_launch_latency_s = 0;
  return profile;
}

/// Blocks each region of `cache` holds in `layer` over `sequences`.
std::array<std::int64_t, region_count> blocks_per_region(const InplaceKVCache<bf16>& cache, int layer,
                                                         const std::vector<int>& sequences) {
  std::array<std::int64_t, region_count> blocks{};
  for (int sequence : sequences)
    for (Region region : cache.block_regions(layer, sequence)) ++blocks[int(region)];
  return blocks;
}

// The systems' roofline caps GPU attention by the GPU's FMA rate at the
// model's multiply-adds per KV byte.
TEST(SystemsRoofline, CapsGpuAttentionByTheGpusMultiplyAdds) {
  MachineProfile profile = gpu_profile();
  profile.gpu_fma_glanes = 300;
  for (const char* name : {"tiny-deepseek-v2", "tiny-mixtral"}) {
    const ModelConfig config = model_preset(name);
    const SystemContext context{config, profile, 1, 64, SystemOptions{}};
    const double fmas_per_byte = config.attention().fmas_per_byte(sizeof(bf16));
    EXPECT_DOUBLE_EQ(roofline_of(context).rates().hbm_gbps, std::min(profile.hbm_gbps, 300 / fmas_per_byte)) << name;
  }
  EXPECT_LT(roofline_of(SystemContext{model_preset("tiny-deepseek-v2"), profile, 1, 64, SystemOptions{}}).rates().hbm_gbps,
            profile.hbm_gbps);
}

// Prefill and decode of two sequences: VRAM takes each layer's first blocks,
// the rest spills into every other region, each step's attention is split
// between the two devices, and the logits are the reference model's.
TEST(WriteScopeWithAGpu, WritesVramFirstSpillsIntoEveryRegionAndSplitsEveryStep) {
  for (const char* model_name : {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(model_name);
    const ModelConfig config = model_preset(model_name);
    constexpr int prompt_tokens = 12, decode_steps = 8;
    const SystemContext context{config, gpu_profile(), 2, prompt_tokens + decode_steps, SystemOptions{}};
    System system = make_system("writescope", context);
    // The profile's rates alone decide here: with feedback, the measured rates
    // of these tiny blocks (launch latencies, on whichever machine runs the
    // test) would move the CPU's share and with it whether CpuResident is
    // written at all. Feedback has its own test below.
    const RooflineModel roofline = roofline_of(context);
    system.kv_policy = [roofline](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
      SchedulerOptions options;
      options.feedback = false;
      return std::make_unique<WriteScopeKVPolicy>(roofline, shape, cache, options);
    };
    MoeModel model = MoeModel::synthetic(config, 4, options_for(config, system, 0, 3));
    const std::int64_t vram_blocks = model.cache().capacity_blocks(Region::gpu_resident) / config.layers;
    ASSERT_GT(vram_blocks, 0);

    std::vector<ReferenceModel> references{reference_for(config, 4), reference_for(config, 4)};
    std::vector<int> sequences, tokens;
    for (int i = 0; i < 2; ++i) {
      std::vector<int> prompt;
      for (int t = 0; t < prompt_tokens; ++t) prompt.push_back((37 * t + 11 * i + 5) % config.vocab);
      sequences.push_back(model.add_sequence(context.context));
      expect_logits_near(model.prefill(sequences[i], prompt), references[i].forward(prompt),
                         test::model_logit_tolerance, "prefill");
      tokens.push_back(1 + i);
    }
    std::array<double, region_count> served{};
    for (int step = 0; step < decode_steps; ++step) {
      const auto logits = model.step(sequences, tokens);
      for (std::size_t i = 0; i < sequences.size(); ++i) {
        expect_logits_near(logits[i], references[i].forward({tokens[i]}), test::model_logit_tolerance,
                           "step " + std::to_string(step));
        tokens[i] = static_cast<int>(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
      }
      for (int layer = 0; layer < config.layers; ++layer) {
        const LayerRecord& record = model.last_records()[layer];
        EXPECT_GT(record.alpha, 0) << "step " << step << " layer " << layer;
        EXPECT_LT(record.alpha, 1) << "step " << step << " layer " << layer;
        for (int r = 0; r < region_count; ++r) served[r] += record.region_bytes[r];
      }
    }
    // VRAM first: each layer's share of the pool went to the first blocks written.
    for (int layer = 0; layer < config.layers; ++layer) {
      const auto blocks = blocks_per_region(model.cache(), layer, sequences);
      EXPECT_EQ(blocks[int(Region::gpu_resident)], vram_blocks) << "layer " << layer;
      const auto first = model.cache().block_regions(layer, sequences[0]);
      for (int k = 0; k < vram_blocks; ++k) EXPECT_EQ(first.at(k), Region::gpu_resident) << "layer " << layer;
      // The spill reaches the band on both sides and CpuResident.
      for (Region region : {Region::gpu_streamed, Region::cpu_streamed, Region::cpu_resident})
        EXPECT_GT(blocks[int(region)], 0) << "layer " << layer << " " << region_name(region);
    }
    // Every path served bytes: VRAM and streamed on the GPU, host and band on the CPU.
    for (Region region : all_regions) EXPECT_GT(served[int(region)], 0) << region_name(region);
  }
}

// A prompt prefilled in chunks leaves the same four-region layout as the
// synthetic fill of the same length: WriteScope's write policy places every
// chunk as it is produced, and prompt passes give it no feedback.
TEST(WriteScopeWithAGpu, APrefilledContextHasTheSyntheticFillsLayout) {
  for (const char* model_name : {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(model_name);
    const ModelConfig config = model_preset(model_name);
    constexpr int context_tokens = 45;  // chunks of 8 (max_rows), the last one partial
    const SystemContext context{config, gpu_profile(), 1, context_tokens + 1, SystemOptions{}};
    const System system = make_system("writescope", context);
    MoeModel prefilled = MoeModel::synthetic(config, 4, options_for(config, system, 0, 3));
    MoeModel filled = MoeModel::synthetic(config, 4, options_for(config, system, 0, 3));
    const int a = prefilled.add_sequence(context.context), b = filled.add_sequence(context.context);
    std::vector<int> prompt;
    for (int t = 0; t < context_tokens; ++t) prompt.push_back((29 * t + 3) % config.vocab);
    prefilled.prefill(a, prompt);
    filled.fill_context(b, context_tokens, 1);
    std::array<std::int64_t, region_count> total{};
    for (int layer = 0; layer < config.layers; ++layer) {
      EXPECT_EQ(prefilled.cache().block_regions(layer, a), filled.cache().block_regions(layer, b)) << "layer " << layer;
      const auto blocks = blocks_per_region(prefilled.cache(), layer, {a});
      for (int r = 0; r < region_count; ++r) total[r] += blocks[r];
    }
    for (Region region : all_regions) EXPECT_GT(total[int(region)], 0) << region_name(region);
  }
}

/// Attention rates (GB/s) measured in a run: each device's bytes over its
/// time, the median over every layer of every step (a few steps of a shared
/// machine stall for milliseconds).
struct MeasuredRates {
  double cpu_gbps = 0, link_gbps = 0;
};

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

MeasuredRates measured_rates(const std::vector<std::vector<LayerRecord>>& steps) {
  std::vector<double> cpu, link;
  for (const auto& records : steps)
    for (const LayerRecord& r : records) {
      const double cpu_bytes = r.region_bytes[int(Region::cpu_resident)] + r.region_bytes[int(Region::cpu_streamed)];
      const double streamed = r.region_bytes[int(Region::gpu_streamed)];
      if (cpu_bytes > 0 && r.attention_cpu > 0) cpu.push_back(cpu_bytes / r.attention_cpu / 1e9);
      if (streamed > 0 && r.attention_gpu > 0) link.push_back(streamed / r.attention_gpu / 1e9);
    }
  return {median(cpu), median(link)};
}

/// WriteScope on tiny-mixtral with `profile`, two sequences of long
/// synthetic contexts, no VRAM for KV: the records of each of `steps` steps.
std::vector<std::vector<LayerRecord>> writescope_steps(const MachineProfile& profile, int steps) {
  const ModelConfig config = model_preset("tiny-mixtral");
  constexpr std::int64_t context_tokens = 16384;
  const SystemContext context{config, profile, 2, context_tokens, SystemOptions{}};
  const System system = make_system("writescope", context);
  ModelOptions options = options_for(config, system, 0, 0);
  options.block_tokens = 16;
  options.stream_chunk_blocks = 64;
  options.pinned_kv_budget = options.host_kv_budget = 32 * mib;
  const VramUse fixed = MoeModel::fixed_vram(config, options);
  options.vram_budget = fixed.weights + fixed.workspace;
  MoeModel model = MoeModel::synthetic(config, 4, options);
  std::vector<int> sequences, tokens{1, 2};
  for (int i = 0; i < 2; ++i) {
    sequences.push_back(model.add_sequence(context_tokens + steps));
    model.fill_context(sequences[i], context_tokens, 7 + i);
  }
  std::vector<std::vector<LayerRecord>> records;
  for (int step = 0; step < steps; ++step) {
    model.step(sequences, tokens);
    records.push_back(model.last_records());
  }
  return records;
}

/// CPU share of a step's KV, over all layers.
double step_alpha(const std::vector<LayerRecord>& records) {
  double cpu = 0, total = 0;
  for (const LayerRecord& r : records) {
    cpu += r.region_bytes[int(Region::cpu_resident)] + r.region_bytes[int(Region::cpu_streamed)];
    for (double bytes : r.region_bytes) total += bytes;
  }
  return cpu / total;
}

/// `profile` with tiny-mixtral's CPU attention at `gbps` over both block
/// orders (the runs below measure the CPU's share as one rate).
void set_cpu_attention(MachineProfile& profile, double gbps) {
  profile.cpu_attention_gbps["tiny-mixtral"] = profile.cpu_streamed_attention_gbps["tiny-mixtral"] = {{1, gbps},
                                                                                                     {2, gbps}};
}

/// A profile of this machine's rates on this path, measured by a first run
/// (no latencies, no FMA limit: measured rates include them).
MachineProfile measured_profile(MeasuredRates& measured) {
  MachineProfile profile = gpu_profile();
  profile.cpu_fma_glanes = 1e6;
  profile.pinned_h2d_gbps = 5;
  set_cpu_attention(profile, 5);
  auto steps = writescope_steps(profile, 6);
  steps.erase(steps.begin());  // warm-up
  measured = measured_rates(steps);
  profile.pinned_h2d_gbps = measured.link_gbps;
  set_cpu_attention(profile, measured.cpu_gbps);
  return profile;
}

// A profile whose CPU rate is wrong by 3x either way: the first steps split
// at the profile's optimum, then feedback moves alpha within a few steps
// towards the optimum of the rates measured in the same steps (the per-step
// records show it). When the CPU is slower than claimed (a slowdown), only the
// blocks fixed in CpuResident at half the claimed rate may keep alpha above
// that optimum. The optimum comes from the same steps because this machine's
// rates drift between runs when other work shares its cores.
TEST(WriteScopeWithAGpu, FeedbackMovesAlphaTowardsTheOptimumWhenTheProfilesCpuRateIsWrong) {
  MeasuredRates first_run;
  const MachineProfile measured = measured_profile(first_run);
  ASSERT_GT(first_run.cpu_gbps, 0);
  ASSERT_GT(first_run.link_gbps, 0);
  const double c = first_run.cpu_gbps, l = first_run.link_gbps;
  constexpr int steps = 12, settle_steps = 4;
  for (const double error : {3.0, 1.0 / 3.0}) {
    MachineProfile profile = measured;
    set_cpu_attention(profile, error * c);
    const auto records = writescope_steps(profile, steps);
    const std::vector<std::vector<LayerRecord>> settled_records(records.begin() + settle_steps, records.end());
    MeasuredRates rates = measured_rates(settled_records);
    if (rates.link_gbps == 0) rates.link_gbps = l;  // the CPU took the whole band
    const double optimum = rates.cpu_gbps / (rates.cpu_gbps + rates.link_gbps);  // no VRAM
    // Where the profile's optimum put the first step, and the lowest alpha the
    // CpuResident blocks allow (placed at half the claimed rate).
    const double alpha_before = step_alpha(records.front());
    const double claimed_optimum = error * c / (error * c + l);
    const double resident_floor = 0.5 * error * c / (0.5 * error * c + l);
    const double target = std::max(optimum, resident_floor);
    std::vector<double> settled;
    std::string trajectory;
    for (int step = 0; step < steps; ++step) {
      trajectory += " " + std::to_string(step_alpha(records[step]));
      if (step >= settle_steps) settled.push_back(step_alpha(records[step]));
    }
    SCOPED_TRACE("CPU rate claimed " + std::to_string(error) + "x the measured " + std::to_string(c) +
                 " GB/s (link " + std::to_string(l) + " GB/s); measured in these steps: CPU " +
                 std::to_string(rates.cpu_gbps) + ", link " + std::to_string(rates.link_gbps) +
                 "; alpha per step:" + trajectory + "; target " + std::to_string(target));
    EXPECT_NEAR(alpha_before, claimed_optimum, 0.05);
    // The median over the settled steps tolerates a step or two that a stall
    // throws off (the estimator follows three agreeing samples).
    EXPECT_LT(std::abs(median(settled) - target), std::max(0.05, 0.5 * std::abs(alpha_before - target)));
  }
}

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

/// The test profile with a GPU and a link without latency: an expert's copy
/// costs its bytes alone, so the expert policies' choices compare by hand.
MachineProfile gpu_without_link_latency() {
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.link_latency_s = 0;
  return profile;
}

TEST(Systems, HybriMoeSplitsGreedilyAndCachesByScore) {
  // GPU compute is free but a copy costs a lot: the cached expert goes to
  // the GPU, every other one to the CPU (on the GPU it would wait for its copy).
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.hbm_gbps = 1e9;            // GPU compute is free...
  profile.pinned_h2d_gbps = 1e-3;    // ...but a transfer costs a lot
  const ModelConfig config = model_preset("tiny-qwen3-moe");  // 8 experts
  SystemContext context{config, profile, 4, 16, SystemOptions{}};
  const auto policy = hybrimoe_experts(context);
  ExpertResidency residency(config.layers, config.experts, 2);
  residency.assign(0, 0, 3);  // expert 3 of layer 0 is cached
  const ExpertPlan plan = policy->plan(0, routing_of({1, 0, 2, 4, 0, 0, 1, 0}), residency);
  EXPECT_EQ(plan.gpu, std::vector<int>{3});
  std::vector<int> cpu = plan.cpu;
  std::sort(cpu.begin(), cpu.end());
  EXPECT_EQ(cpu, (std::vector<int>{0, 2, 6}));
  EXPECT_TRUE(plan.loads.empty());
}

// The split gives each pick to the device that would finish it first (as
// HybriMoE's own scheduler does), not to the one idle longest. An expert of
// tiny-mixtral is B = 12288 bytes: B / 1000 GB/s on the GPU, B / 15 GB/s on
// the CPU (bytes-bound at a token), and a copy B / 20 GB/s (no link latency).
TEST(Systems, HybriMoeGivesEachExpertToTheDeviceThatFinishesItFirst) {
  MachineProfile profile = gpu_without_link_latency();
  const ModelConfig config = model_preset("tiny-mixtral");
  ExpertResidency residency(config.layers, config.experts, 2);
  residency.assign(0, 0, 0);
  residency.assign(1, 0, 3);
  const auto plan = [&](const Routing& routing) {
    const SystemContext context{config, profile, 4, 16, SystemOptions{}};
    return hybrimoe_experts(context)->plan(0, routing, residency);
  };
  // Both of a token's experts cached: both on the GPU (the idle CPU took the second).
  const ExpertPlan cached = plan(routing_of({1, 0, 0, 1}));
  EXPECT_EQ(cached.gpu, (std::vector<int>{0, 3}));
  EXPECT_TRUE(cached.cpu.empty());
  EXPECT_TRUE(cached.loads.empty());
  // Expert 2 not cached: on the GPU it ends after its copy, B / 20 + B / 1000 < B / 15: the GPU, loaded.
  const ExpertPlan copied = plan(routing_of({1, 0, 1, 0}));
  EXPECT_EQ(copied.gpu, (std::vector<int>{0, 2}));
  ASSERT_EQ(copied.loads.size(), 1u);
  EXPECT_EQ(copied.loads.front().expert, 2);
  // Two uncached: the copies run one after the other, so the second would end at 2B / 20 + B / 1000 on the
  // GPU: the CPU finishes it first.
  const ExpertPlan two_copies = plan(routing_of({0, 1, 1, 0}));
  EXPECT_EQ(two_copies.gpu, (std::vector<int>{1}));
  EXPECT_EQ(two_copies.cpu, (std::vector<int>{2}));
  // Over a link of 1 GB/s the copy alone takes B / 1: the CPU finishes it first. The cached expert 0 still
  // goes first to the GPU, although expert 2 has more tokens (cached experts lead the order).
  profile.pinned_h2d_gbps = 1;
  const ExpertPlan slow_link = plan(routing_of({1, 0, 3, 0}));
  EXPECT_EQ(slow_link.gpu, (std::vector<int>{0}));
  EXPECT_EQ(slow_link.cpu, (std::vector<int>{2}));
  EXPECT_TRUE(slow_link.loads.empty());
}

TEST(Systems, HybriMoePrefetchEvictsOnlyALowerScoredResidentOutsideItsPicks) {
  // Scores are decayed routing weights: one step of 0.5 per token, decay 0.8 (0.1 per token).
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  ASSERT_EQ(config.experts, 8);
  ASSERT_EQ(config.experts_per_token, 2);  // the picks: layer 1's two highest scores
  ASSERT_GE(config.layers, 2);
  SystemContext context{config, test::tiny_profile(), 4, 16, SystemOptions{}};
  const auto policy = hybrimoe_experts(context);
  ExpertResidency scoring(config.layers, config.experts, 2);
  policy->plan(0, routing_of({0, 2, 0, 0, 0, 7, 0, 0}), scoring);  // layer 0: expert 1 at 0.2, expert 5 at 0.7
  policy->plan(1, routing_of({0, 0, 8, 6, 0, 0, 0, 0}), scoring);  // layer 1: expert 2 at 0.8, expert 3 at 0.6
  using Load = std::tuple<int, int, int>;                           // (layer, expert, slot)
  const auto prefetch = [&](const ExpertResidency& residency) {
    std::vector<Load> loads;
    for (const ExpertLoad& load : policy->after_layer(0, Routing{}, residency))
      loads.emplace_back(load.layer, load.expert, load.slot);
    return loads;
  };
  {  // Layer 1's picks are experts 2 and 3; 3 is cached at 0.6, below 2's 0.8, but is a pick: layer 0's 5 (0.7) goes.
    ExpertResidency residency(config.layers, config.experts, 2);
    residency.assign(0, 0, 5);
    residency.assign(1, 1, 3);
    EXPECT_EQ(prefetch(residency), (std::vector<Load>{{1, 2, 0}}));
  }
  {  // The lowest-scored resident goes (expert 1 at 0.2, not 5 at 0.7); then 3 (0.6) scores below every
     // resident left (5, and 2 just loaded, a pick) and is not prefetched.
    ExpertResidency residency(config.layers, config.experts, 2);
    residency.assign(0, 0, 5);
    residency.assign(1, 0, 1);
    EXPECT_EQ(prefetch(residency), (std::vector<Load>{{1, 2, 1}}));
  }
}

// Fiddler runs an expert that has no slot where it finishes first: on the
// CPU in place, or copied to a staging buffer (slot -1) and run on the GPU.
// tiny-mixtral's expert is B = 12288 bytes: B / 15 GB/s on the CPU (bytes-bound
// at a token), B / 20 GB/s over the link plus B / 1000 on the GPU.
TEST(Systems, FiddlerRunsAnUncachedExpertWhereItFinishesFirst) {
  MachineProfile profile = gpu_without_link_latency();
  const ModelConfig config = model_preset("tiny-mixtral");
  ExpertResidency residency(config.layers, config.experts, 1);
  residency.assign(0, 0, 0);
  const auto plan = [&] {
    const SystemContext context{config, profile, 4, 16, SystemOptions{}};
    return fiddler_experts(context)->plan(0, routing_of({1, 1, 0, 0}), residency);
  };
  const ExpertPlan copied = plan();  // the copy and the GPU (0.051 B ns) before the CPU (0.067 B ns)
  EXPECT_EQ(copied.gpu, (std::vector<int>{0, 1}));
  ASSERT_EQ(copied.loads.size(), 1u);
  EXPECT_EQ(copied.loads.front().expert, 1);
  EXPECT_EQ(copied.loads.front().slot, -1);
  EXPECT_TRUE(copied.cpu.empty());
  profile.pinned_h2d_gbps = 10;  // the copy alone now takes 0.1 B ns: the CPU
  const ExpertPlan in_place = plan();
  EXPECT_EQ(in_place.gpu, (std::vector<int>{0}));
  EXPECT_EQ(in_place.cpu, (std::vector<int>{1}));
  EXPECT_TRUE(in_place.loads.empty());
}

// HybriMoE's scores decay: a layer's second step weighs its routing by 0.2
// and the first step's scores by 0.8; it prefetches at most `prefetch_experts`
// of the next layer's highest scores.
TEST(Systems, HybriMoeScoresDecayAndItPrefetchesOnlyItsShare) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");  // 8 experts
  SystemOptions options;
  options.prefetch_experts = 2;
  SystemContext context{config, test::tiny_profile(), 4, 16, options};
  const auto policy = hybrimoe_experts(context);
  ExpertResidency empty(config.layers, config.experts, 4);
  // Layer 1, step one (0.2 x 0.5 per token): expert 2 at 0.9, expert 3 at 0.3. Step two routes only
  // expert 4 (5 tokens): 2 at 0.72, 3 at 0.24, 4 at 0.5. The weights the other way round would put 4
  // first (2.0), no decay leave 4 alone; 3 is the third, beyond the share.
  policy->plan(1, routing_of({0, 0, 9, 3, 0, 0, 0, 0}), empty);
  policy->plan(1, routing_of({0, 0, 0, 0, 5, 0, 0, 0}), empty);
  std::vector<int> prefetched;
  for (const ExpertLoad& load : policy->after_layer(0, Routing{}, empty)) {
    EXPECT_EQ(load.layer, 1);
    prefetched.push_back(load.expert);
  }
  EXPECT_EQ(prefetched, (std::vector<int>{2, 4}));  // two of the four slots, the highest scores first
}

// MoE-Lightning's paging over two halves of slots: with no resident layer
// (a link fast enough that the HRM pages all of them) and room for two
// layers' experts, an activated expert is loaded into its layer's half, and
// after each layer the next paged layer's experts go into the other half;
// after the last, the first paged layer again, unless an odd count of paged
// layers puts the two in one half.
TEST(Systems, MoeLightningPagesTheNextLayerIntoTheOtherHalf) {
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.pinned_h2d_gbps = profile.pageable_h2d_gbps = 1e6;
  for (const int layers : {4, 3}) {
    SCOPED_TRACE(std::to_string(layers) + " layers");
    ModelConfig config = model_preset("tiny-qwen3-moe");  // 8 experts
    config.layers = layers;
    const int experts = config.experts;
    const SystemContext context{config, profile, 4, 16, SystemOptions{}};
    ASSERT_EQ(moe_lightning_resident_layers(context), 0);
    const auto policy = make_moe_lightning(context).experts;
    ASSERT_EQ(policy->slots(2 * experts, layers, experts), 2 * experts);
    ExpertResidency residency(layers, experts, 2 * experts);
    EXPECT_TRUE(policy->initial(residency).empty());
    const ExpertPlan plan = policy->plan(1, routing_of({0, 0, 1, 0, 0, 0, 0, 0}), residency);
    ASSERT_EQ(plan.loads.size(), 1u);
    EXPECT_EQ(plan.loads.front().slot, experts + 2);  // layer 1's half
    const auto pages = [&](int layer) {
      std::vector<std::pair<int, int>> loads;  // (layer, slot)
      for (const ExpertLoad& load : policy->after_layer(layer, Routing{}, residency))
        loads.emplace_back(load.layer, load.slot);
      return loads;
    };
    std::vector<std::pair<int, int>> layer_1, layer_0;
    for (int e = 0; e < experts; ++e) layer_1.emplace_back(1, experts + e), layer_0.emplace_back(0, e);
    EXPECT_EQ(pages(0), layer_1);
    const std::vector<std::pair<int, int>> after_last = layers % 2 == 0 ? layer_0 : std::vector<std::pair<int, int>>{};
    EXPECT_EQ(pages(layers - 1), after_last);
  }
}

/// The profiling prompt of the policies that profile routing, in these
/// tests: layer 0 routes 1, 5 and 2 tokens to experts 0, 2 and 7, layer 1
/// three to expert 1.
void profile_routing(ExpertPolicy& policy, const ExpertResidency& residency) {
  EXPECT_TRUE(policy.profiles_routing());
  policy.plan(0, routing_of({1, 0, 5, 0, 0, 0, 0, 2}), residency);
  policy.plan(1, routing_of({0, 3, 0, 0, 0, 0, 0, 0}), residency);
}

TEST(Systems, FiddlerFillsEverySlotInTheProfilesPopularityOrder) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");  // 8 experts
  SystemContext context{config, test::tiny_profile(), 4, 16, SystemOptions{}};
  const auto policy = fiddler_experts(context);
  ExpertResidency residency(config.layers, config.experts, 5);
  profile_routing(*policy, residency);
  const auto loads = policy->end_warmup(residency);
  // The profile's four experts by popularity, then the first expert it never routed to.
  std::vector<std::pair<int, int>> placed;
  for (const ExpertLoad& load : loads) placed.emplace_back(load.layer, load.expert);
  EXPECT_EQ(placed, (std::vector<std::pair<int, int>>{{0, 2}, {1, 1}, {0, 7}, {0, 0}, {0, 1}}));
  for (std::size_t s = 0; s < loads.size(); ++s) EXPECT_EQ(loads[s].slot, static_cast<int>(s));
}

// HybriMoE's cache is warmed from the profiling prompt as Fiddler's slots
// are: at the end of the warm-up every free slot takes the highest-scored
// expert not cached (then, among experts the prompt never routed to, by
// layer and index); a cached expert keeps its slot.
TEST(Systems, HybriMoeWarmsItsCacheFromTheProfilingPrompt) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");  // 8 experts
  SystemContext context{config, test::tiny_profile(), 4, 16, SystemOptions{}};
  const auto policy = hybrimoe_experts(context);
  ExpertResidency residency(config.layers, config.experts, 5);
  residency.assign(0, 1, 1);  // layer 1's expert 1 in slot 0
  profile_routing(*policy, residency);
  std::vector<std::pair<int, int>> placed;
  std::vector<int> slots;
  for (const ExpertLoad& load : policy->end_warmup(residency)) {
    placed.emplace_back(load.layer, load.expert);
    slots.push_back(load.slot);
  }
  EXPECT_EQ(placed, (std::vector<std::pair<int, int>>{{0, 2}, {0, 7}, {0, 0}, {0, 1}}));
  EXPECT_EQ(slots, (std::vector<int>{1, 2, 3, 4}));
}

// Fiddler and HybriMoE price a CPU expert at the calibrated rate of the bf16
// expert kernel, and a copy at the link rate of where the experts live.
TEST(Systems, ExpertCostsComeFromTheKernelThatRunsAndTheStoresLink) {
  SystemContext context{model_preset("tiny-mixtral"), test::tiny_profile(), 1, 16, SystemOptions{}};
  context.profile.has_gpu = true;
  const ExpertCosts pinned = expert_costs_of(context);
  EXPECT_DOUBLE_EQ(pinned.cpu_seconds(1), pinned.expert_bytes / (context.profile.cpu_expert_gbps * 1e9));
  EXPECT_DOUBLE_EQ(pinned.cpu_seconds(1000), 1000 * pinned.flops_per_token / (context.profile.cpu_expert_gflops * 1e9));
  context.experts_pinned = false;
  const ExpertCosts pageable = expert_costs_of(context);
  EXPECT_DOUBLE_EQ(pageable.transfer_seconds() - context.profile.link_latency_s,
                   pageable.expert_bytes / (context.profile.pageable_h2d_gbps * 1e9));
  EXPECT_GT(pageable.transfer_seconds(), pinned.transfer_seconds());
}

// MoE-Lightning keeps the layers its roofline (HRM) wants resident, as many
// as each budget allows, pages the rest through two halves, and leaves no KV
// pool in VRAM.
TEST(Systems, MoeLightningKeepsWhatItsRooflineWantsResident) {
  ModelOverrides eight_layers;
  eight_layers.layers = 8;
  const ModelConfig config = apply_overrides(model_preset("tiny-mixtral"), eight_layers);
  const int experts = config.experts;
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  auto slots_with_room_for = [&](int room) {
    const System system = make_system("moe-lightning", SystemContext{config, profile, 2, 64, SystemOptions{}});
    ModelOptions options;
    options.block_tokens = 8;
    options.max_rows = 2;
    options.experts = system.experts;
    options.vram_kv = system.vram_kv;
    const VramUse fixed = MoeModel::fixed_vram(config, options);
    options.vram_budget =
        fixed.weights + fixed.workspace + static_cast<std::uint64_t>(room) * MoeModel::expert_bytes(config);
    const VramUse use = MoeModel::vram_plan(config, options);
    EXPECT_EQ(use.kv, 0u);
    return static_cast<int>(use.expert_slots / MoeModel::expert_bytes(config));
  };
  // A slow link: paging would dominate, so the HRM wants every layer; the budget caps them.
  profile.pinned_h2d_gbps = 1e-3;
  EXPECT_EQ(moe_lightning_resident_layers(SystemContext{config, profile, 2, 64, SystemOptions{}}), 8);
  EXPECT_EQ(slots_with_room_for(4 * experts + 1), (2 + 2) * experts);  // 2 resident layers + 2 halves
  EXPECT_EQ(slots_with_room_for(6 * experts + 1), (4 + 2) * experts);  // 4 resident layers + 2 halves
  EXPECT_EQ(slots_with_room_for(8 * experts), 8 * experts);            // all resident, no halves
  EXPECT_EQ(slots_with_room_for(experts), 0);                          // no room for halves: staging
  // A faster link: paging partly hides behind the CPU's attention, so the HRM
  // keeps fewer layers resident however much room there is.
  bool partial = false;
  for (double link = 1e-3; link < 1e9 && !partial; link *= 3) {
    profile.pinned_h2d_gbps = link;
    const int wanted = moe_lightning_resident_layers(SystemContext{config, profile, 2, 64, SystemOptions{}});
    if (wanted > 0 && wanted + 2 < 8) {
      partial = true;
      EXPECT_EQ(slots_with_room_for(8 * experts), (wanted + 2) * experts) << "link " << link;
    }
  }
  EXPECT_TRUE(partial);
  profile.pinned_h2d_gbps = 1e9;
  EXPECT_EQ(moe_lightning_resident_layers(SystemContext{config, profile, 2, 64, SystemOptions{}}), 0);
}

// MoE-Lightning's micro-batches are priced on the layers it will page: the
// HRM's wish within what the VRAM budget holds. A budget that caps residency
// leaves more paging to overlap with the CPU's attention, and more
// micro-batches pay for themselves.
TEST(Systems, MoeLightningsMicroBatchesFollowTheLayersTheBudgetLeavesPaged) {
  ModelOverrides eight_layers;
  eight_layers.layers = 8;
  SystemContext context{apply_overrides(model_preset("tiny-mixtral"), eight_layers), test::tiny_profile(), 4, 4096,
                        SystemOptions{}};
  context.profile.has_gpu = true;
  context.profile.pinned_h2d_gbps = 1e-3;  // paging dominates: the HRM wants every layer resident
  context.profile.gpu_launch_latency_s = context.profile.cpu_launch_latency_s = 1e-4;
  context.block_tokens = 8;
  const ModelConfig& config = context.model;
  ASSERT_EQ(moe_lightning_resident_layers(context), 8);
  ModelOptions options;
  options.block_tokens = context.block_tokens;
  options.max_rows = context.batch;
  const VramUse fixed = MoeModel::fixed_vram(config, options);
  auto micro_batches_with_room_for = [&](int experts) {
    context.vram_budget =
        fixed.weights + fixed.workspace + static_cast<std::uint64_t>(experts) * MoeModel::expert_bytes(config);
    return make_system("moe-lightning", context).micro_batches;
  };
  // Every layer resident: only the GPU's (small) expert work beside the CPU's
  // attention, not worth a second micro-batch's launches.
  EXPECT_EQ(micro_batches_with_room_for(8 * config.experts), 1);
  // Two layers resident and six paged over the slow link: the CPU's attention
  // hides under the paging in micro-batches.
  EXPECT_GT(micro_batches_with_room_for(4 * config.experts), 1);
}

// WriteScope's expert choice follows the machine: free GPU experts behind a
// fast link favour the GPU-expert policies, a GPU that cannot load experts
// leaves the CPU policy.
TEST(Systems, WriteScopesExpertChoiceFollowsItsRoofline) {
  // Long sequences: the KV does not fit in VRAM, so slots cost attention time.
  SystemContext context{model_preset("tiny-mixtral"), test::tiny_profile(), 4, 100000, SystemOptions{}};
  context.profile.has_gpu = true;
  context.vram_budget = 64 << 20;
  context.block_tokens = 8;
  context.profile.cpu_expert_gbps = 1e-3;  // CPU experts are very slow
  EXPECT_NE(writescope_expert_choice(context), "ktransformers");
  context.profile.cpu_expert_gbps = 1e6;   // CPU experts are free, copies crawl
  context.profile.pinned_h2d_gbps = context.profile.pageable_h2d_gbps = 1e-6;
  context.vram_budget = 16 << 20;          // and slots would cost the KV its VRAM
  EXPECT_EQ(writescope_expert_choice(context), "ktransformers");
}

// HybriMoE's prefetch copies the next layer's likely experts beside that
// layer's attention: where the attention is short and the link slow, that
// traffic decides against HybriMoE's policy, which would otherwise win by
// balancing the two devices.
TEST(Systems, WriteScopesExpertChoiceCountsHybriMoesPrefetch) {
  SystemContext context{model_preset("tiny-mixtral"), test::tiny_profile(), 4, 16, SystemOptions{}};
  context.profile.has_gpu = true;
  context.profile.gpu_launch_latency_s = context.profile.cpu_launch_latency_s = 1e-8;
  context.profile.cpu_expert_gbps = 0.01;  // an expert on the CPU: 1.2 us
  context.profile.pinned_h2d_gbps = context.profile.pageable_h2d_gbps = 0.01;  // a copy: 11 us with the latency
  context.block_tokens = 8;
  ModelOptions options;
  options.block_tokens = context.block_tokens;
  options.max_rows = context.batch;
  const VramUse fixed = MoeModel::fixed_vram(context.model, options);
  // Room for 8 experts: the policies with slots keep 4 of the 8 routed experts resident.
  context.vram_budget = fixed.weights + fixed.workspace + 8 * MoeModel::expert_bytes(context.model) + 1024;
  context.options.prefetch_experts = 2;
  EXPECT_EQ(writescope_expert_choice(context), "fiddler");
  context.options.prefetch_experts = 0;  // 0: experts_per_token (2) as well
  EXPECT_EQ(writescope_expert_choice(context), "fiddler");
}

// HybriMoE's prefetch shares the link with the KV that WriteScope's GPU
// streams in the same attention (each at half the rate while both run): with
// the split balanced and the KV mostly streamed, one more prefetched expert
// costs every layer its copy, though the attention's time would hide it.
TEST(Systems, WriteScopesExpertEstimateSharesTheLinkWithStreamedKv) {
  SystemContext context{model_preset("tiny-mixtral"), test::tiny_profile(), 4, 100000, SystemOptions{}};
  context.profile.has_gpu = true;
  context.block_tokens = 8;
  ModelOptions options;
  options.block_tokens = context.block_tokens;
  options.max_rows = context.batch;
  const VramUse fixed = MoeModel::fixed_vram(context.model, options);
  // Room for no expert slot: every prefetched expert is copied, and the KV (51 MB a layer) is streamed.
  context.vram_budget = fixed.weights + fixed.workspace + MoeModel::expert_bytes(context.model) - 1;
  context.options.prefetch_experts = 1;
  const double one = writescope_expert_estimates(context).at("hybrimoe");
  context.options.prefetch_experts = 2;
  const double two = writescope_expert_estimates(context).at("hybrimoe");
  const double copy = expert_costs_of(context).transfer_seconds();  // 11 us, far below a layer's attention
  EXPECT_NEAR(two - one, context.model.layers * copy, 1e-6 * two);
}

}  // namespace
}  // namespace writescope
