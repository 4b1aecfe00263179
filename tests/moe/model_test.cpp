#include "moe/model.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "framework/concurrent.hpp"
#include "framework/host_memory.hpp"
#include "framework/machine.hpp"
#include "model_reference.hpp"

namespace writescope {
namespace {

using test::expect_logits_near;
using test::reference_for;

// The model runs on the machine's two devices (GpuExecSpace and
// HostExecSpace); its kernels are tested on every space in their own tests.

RooflineModel test_roofline() {
  ModelRates rates;
  rates.has_gpu = has_gpu;
  rates.hbm_gbps = 1000;
  rates.link_gbps = 20;
  rates.cpu_attention_gbps = 10;
  rates.cpu_streamed_attention_gbps = 10;
  rates.cpu_fma_glanes = 100;
  return RooflineModel(rates);
}

constexpr std::uint64_t mib = 1 << 20;

ModelOptions options_with(BlockPlacement placement, std::shared_ptr<ExpertPolicy> experts, int max_rows = 8) {
  ModelOptions options;
  options.vram_budget = 256 * mib;
  options.pinned_kv_budget = 4 * mib;
  options.host_kv_budget = 4 * mib;
  options.block_tokens = 4;
  options.max_rows = max_rows;
  options.stream_chunk_blocks = 2;
  options.kv_policy = [placement](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<CallbackKVPolicy>(test_roofline(), shape, cache, placement);
  };
  options.experts = std::move(experts);
  return options;
}

/// Blocks of 4 tokens cycle through all four regions.
const BlockPlacement every_region = [](int layer, int sequence, int block) {
  return static_cast<Region>((layer + sequence + block) % 4);
};

/// Experts cycle through GPU-resident, loaded for the step, and CPU.
std::shared_ptr<ExpertPolicy> mixed_experts() {
  return std::make_shared<FixedExpertPolicy>(
      [](int layer, int expert) { return static_cast<ExpertPlacement>((layer + expert) % 3); });
}


const char* const tiny_models[] = {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2"};

TEST(MoeModel, DecodeMatchesTheReferenceWhereverBlocksAndExpertsLive) {
  for (const char* name : tiny_models) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    MoeModel model = MoeModel::synthetic(config, 9, options_with(every_region, mixed_experts()));
    // Two sequences of different lengths decoded together.
    const std::vector<std::vector<int>> prompts{{5, 17, 200, 3, 99, 42, 7, 8, 11, 250, 1}, {31, 64, 128}};
    std::vector<ReferenceModel> references{reference_for(config, 9), reference_for(config, 9)};
    const int a = model.add_sequence(), b = model.add_sequence();
    for (std::size_t t = 0; t < prompts[0].size(); ++t) {
      std::vector<int> sequences{a}, tokens{prompts[0][t]};
      if (t < prompts[1].size()) sequences.push_back(b), tokens.push_back(prompts[1][t]);
      const auto logits = model.step(sequences, tokens);
      for (std::size_t i = 0; i < sequences.size(); ++i)
        expect_logits_near(logits[i], references[i].forward({tokens[i]}), test::model_logit_tolerance,
                           "step " + std::to_string(t) + " sequence " + std::to_string(i));
    }
    EXPECT_EQ(model.cache().length(0, a), static_cast<std::int64_t>(prompts[0].size()));
    for (Region region : {Region::gpu_resident, Region::gpu_streamed, Region::cpu_resident, Region::cpu_streamed})
      EXPECT_GT(model.cache().region_bytes(region), 0u) << region_name(region);
    EXPECT_THROW(model.step({a}, {config.vocab}), std::invalid_argument);
    EXPECT_THROW(model.step({a, a}, {1, 2}), std::invalid_argument);
  }
}

TEST(MoeModel, ChunkedPrefillMatchesTheReference) {
  for (const char* name : tiny_models) {
    const ModelConfig config = model_preset(name);
    // MLA's prompt chunks in both forms (the others have one).
    std::vector<MlaPromptForm> forms{MlaPromptForm::automatic};
    if (config.mla()) forms = {MlaPromptForm::absorbed, MlaPromptForm::decompressed};
    for (MlaPromptForm form : forms)
      // Chunks of 3, 4 and 5 tokens over blocks of 4 (3 and 4 do not divide
      // the prompt; 3 and 5 end inside blocks): later chunks read earlier ones
      // back from every region, in the prompt pass' plan.
      for (int chunk : {3, 4, 5}) {
        SCOPED_TRACE(std::string(name) + ", chunks of " + std::to_string(chunk) +
                     (form == MlaPromptForm::decompressed ? ", decompressed" : ""));
        ModelOptions options = options_with(every_region, mixed_experts(), chunk);
        options.mla_prompt_form = form;
        MoeModel model = MoeModel::synthetic(config, 3, options);
        ReferenceModel reference = reference_for(config, 3);
        const std::vector<int> prompt{5, 17, 200, 3, 99, 42, 7, 8, 11, 250};
        const int sequence = model.add_sequence();
        expect_logits_near(model.prefill(sequence, prompt), reference.forward(prompt), test::model_logit_tolerance,
                           "prefill");
        EXPECT_EQ(model.cache().length(config.layers - 1, sequence), static_cast<std::int64_t>(prompt.size()));
        for (Region region : all_regions)
          EXPECT_GT(model.cache().region_bytes(region), 0u) << region_name(region);
        for (int token : {9, 100, 2})
          expect_logits_near(model.step({sequence}, {token}).front(), reference.forward({token}),
                             test::model_logit_tolerance, "decode");
        EXPECT_THROW(model.prefill(sequence, {1}), std::invalid_argument);
      }
  }
}

// A prompt long enough that its later chunks stream the band's earlier blocks
// in several landing chunks of one block each (the test above streams at most
// one chunk per pass): 40 tokens in chunks of 8 over blocks of 4.
TEST(MoeModel, APromptStreamsTheBandInSeveralChunks) {
  for (const char* name : tiny_models) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    ModelOptions options = options_with(every_region, mixed_experts(), 8);
    options.stream_chunk_blocks = 1;
    MoeModel model = MoeModel::synthetic(config, 5, options);
    ReferenceModel reference = reference_for(config, 5);
    std::vector<int> prompt(40);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((37 * i + 11) % config.vocab);
    const int sequence = model.add_sequence();
    expect_logits_near(model.prefill(sequence, prompt), reference.forward(prompt), test::model_logit_tolerance,
                       "prefill");
    // Every layer holds 10 blocks, 2 or 3 of them in the streamed band.
    EXPECT_GE(model.cache().region_bytes(Region::gpu_streamed), 2 * config.layers * model.cache().block_bytes());
    expect_logits_near(model.step({sequence}, {9}).front(), reference.forward({9}), test::model_logit_tolerance,
                       "decode");
  }
}

// What the synthetic presets leave at 1 or 0 and a real checkpoint does not:
// every norm its own scales (all 1 in synthetic weights, where a norm wired
// to the wrong place changes nothing), DeepSeek's routed scaling factor,
// query LoRA and YaRN's rotation scale; and two sequences of different
// lengths decoded in one step (their positions differ in every row).
TEST(MoeModel, MatchesTheReferenceWithItsOwnNormsScalesAndLengths) {
  for (const char* name : tiny_models) {
    SCOPED_TRACE(name);
    ModelConfig config = model_preset(name);
    if (config.mla()) {
      config.routed_scaling_factor = 2.5, config.q_lora_rank = 16;
      config.rope_scaling.mscale_all_dim = 0;  // YaRN's rotation scaled (1 where the two mscales are equal)
      ASSERT_GT(RotaryEmbedding::for_model(config).scale, 1.05);  // 1 + 0.1 x 0.707 x ln 4
    }
    // The logits from the embedding, as Qwen3's small models tie them: there is no lm_head.weight.
    if (config.architecture == Architecture::qwen3_moe) config.tied_embeddings = true;
    std::vector<std::vector<bf16>> tensors;
    for (const TensorSpec& spec : weight_specs(config)) {
      tensors.push_back(synthetic_tensor<bf16>(spec, 5));
      if (!spec.is_norm) continue;
      const std::size_t offset = std::hash<std::string>{}(spec.name) % 61;
      for (std::size_t i = 0; i < tensors.back().size(); ++i)
        tensors.back()[i] = from_float<bf16>(0.5f + static_cast<float>((i * 37 + offset) % 100) / 100.0f);
    }
    std::size_t next = 0;
    const MoeModel::TensorSource source = [&](const TensorSpec&) { return tensors.at(next++); };
    MoeModel model(config, source, options_with(every_region, mixed_experts()));
    const auto reference = [&] {
      std::vector<std::vector<float>> weights;
      for (const auto& tensor : tensors) {
        weights.emplace_back();
        for (bf16 v : tensor) weights.back().push_back(to_float(v));
      }
      ReferenceModel r(config, std::move(weights));
      r.round_kv_cache_to_bf16(true);
      return r;
    };
    std::vector<ReferenceModel> references{reference(), reference()};
    const std::vector<std::vector<int>> prompts{{5, 17, 200, 3, 99, 42, 7}, {31, 64, 128}};
    std::vector<int> sequences;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      sequences.push_back(model.add_sequence());
      expect_logits_near(model.prefill(sequences[i], prompts[i]), references[i].forward(prompts[i]),
                         test::model_logit_tolerance, "prefill " + std::to_string(i));
    }
    for (const std::vector<int>& tokens : {std::vector<int>{9, 100}, {2, 77}, {250, 1}}) {
      const auto logits = model.step(sequences, tokens);
      for (std::size_t i = 0; i < sequences.size(); ++i)
        expect_logits_near(logits[i], references[i].forward({tokens[i]}), test::model_logit_tolerance,
                           "decode, sequence " + std::to_string(i));
    }
  }
}

// DeepSeek-V2-Lite: 16 x (512 + 64 + 512) = 17408 multiply-adds per (row, key)
// absorbed, 16 x (128 + 64 + 128) = 5120 decompressed, 16 x 256 x 512 =
// 2097152 to decompress a key: from 2097152 / 12288 = 170.7 rows on.
TEST(MlaPromptForm, DecompressedFromTheChunkSizeWhereItCostsFewerMultiplyAdds) {
  const ModelConfig lite = model_preset("deepseek-v2-lite");
  EXPECT_FALSE(mla_prompt_cheaper_decompressed(lite, 1));
  EXPECT_FALSE(mla_prompt_cheaper_decompressed(lite, 170));
  EXPECT_TRUE(mla_prompt_cheaper_decompressed(lite, 171));
  EXPECT_TRUE(mla_prompt_cheaper_decompressed(lite, 256));
  EXPECT_FALSE(mla_prompt_cheaper_decompressed(model_preset("qwen3-30b-a3b"), 4096));
}

TEST(MoeModel, LogitsDoNotDependOnPlacement) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  const BlockPlacement gpu_blocks = [](int, int, int) { return Region::gpu_resident; };
  const BlockPlacement cpu_blocks = [](int, int, int) { return Region::cpu_resident; };
  MoeModel on_gpu = MoeModel::synthetic(config, 5, options_with(gpu_blocks, std::make_shared<GpuExpertPolicy>()));
  MoeModel on_cpu = MoeModel::synthetic(config, 5, options_with(cpu_blocks, std::make_shared<CpuExpertPolicy>()));
  MoeModel mixed = MoeModel::synthetic(config, 5, options_with(every_region, mixed_experts()));
  std::vector<int> sequences;
  for (MoeModel* model : {&on_gpu, &on_cpu, &mixed}) sequences.push_back(model->add_sequence());
  for (int token : {4, 8, 15, 16, 23, 42, 108, 7, 9}) {
    const auto expected = on_gpu.step({sequences[0]}, {token}).front();
    expect_logits_near(on_cpu.step({sequences[1]}, {token}).front(), expected, 1e-5, "CPU placement");
    expect_logits_near(mixed.step({sequences[2]}, {token}).front(), expected, 1e-5, "mixed placement");
  }
  // The experts ran where the policies said.
  for (const LayerRecord& r : on_gpu.last_records()) EXPECT_EQ(r.experts_cpu, 0);
  for (const LayerRecord& r : on_cpu.last_records()) EXPECT_GT(r.experts_cpu, 0);
}

TEST(MoeModel, RecordsTheBytesEachRegionServed) {
  const ModelConfig config = model_preset("tiny-mixtral");
  MoeModel model = MoeModel::synthetic(config, 2, options_with(every_region, std::make_shared<CpuExpertPolicy>()));
  const int a = model.add_sequence(), b = model.add_sequence();
  for (int t = 0; t < 9; ++t) model.step({a, b}, {t + 1, t + 2});
  const double bytes_per_token = static_cast<double>(model.cache().block_bytes()) / 4;
  for (int layer = 0; layer < config.layers; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    // Count each region's tokens from where the cache says the blocks are.
    std::array<double, region_count> counted{};
    for (int sequence : {a, b}) {
      const std::vector<Region> regions = model.cache().block_regions(layer, sequence);
      const std::int64_t length = model.cache().length(layer, sequence);
      for (std::size_t k = 0; k < regions.size(); ++k)
        counted[int(regions[k])] += std::min<std::int64_t>(4, length - 4 * static_cast<std::int64_t>(k)) * bytes_per_token;
    }
    const LayerRecord& record = model.last_records()[layer];
    for (Region region : all_regions)
      EXPECT_DOUBLE_EQ(record.region_bytes[int(region)], counted[int(region)]) << region_name(region);
    EXPECT_GT(record.attention, 0);
    EXPECT_GT(record.predicted_attention, 0);
    EXPECT_GT(record.experts_cpu, 0);
    EXPECT_GT(record.feed_forward, 0);
    // The affine plan: the CPU reads exactly the CpuResident and CpuStreamed blocks.
    const double cpu_tokens_bytes = counted[int(Region::cpu_resident)] + counted[int(Region::cpu_streamed)];
    EXPECT_NEAR(record.alpha, cpu_tokens_bytes / (2 * 9 * bytes_per_token), 1e-12);
  }
}

// assign moves an expert between slots and evicts a slot's owner, keeping
// the slot -> expert and expert -> slot maps the inverse of each other.
TEST(ExpertResidency, AssignMovesAndEvictsKeepingBothMapsConsistent) {
  ExpertResidency residency(2, 4, 3);  // 2 layers of 4 experts, 3 slots
  const auto consistent = [&] {
    for (int s = 0; s < residency.slots(); ++s) {
      if (const auto [layer, expert] = residency.owner(s); layer >= 0) {
        EXPECT_EQ(residency.slot_of(layer, expert), s);
      }
    }
    for (int layer = 0; layer < 2; ++layer)
      for (int expert = 0; expert < 4; ++expert) {
        if (const int s = residency.slot_of(layer, expert); s >= 0) {
          EXPECT_EQ(residency.owner(s), std::make_pair(layer, expert));
        }
      }
  };
  EXPECT_EQ(residency.free_slot(), 0);
  residency.assign(0, 0, 1);
  residency.assign(1, 1, 2);
  EXPECT_EQ(residency.free_slot(), 2);
  consistent();
  residency.assign(2, 0, 1);  // moved: its old slot frees
  EXPECT_EQ(residency.slot_of(0, 1), 2);
  EXPECT_EQ(residency.owner(0), std::make_pair(-1, -1));
  EXPECT_EQ(residency.free_slot(), 0);
  consistent();
  residency.assign(1, 0, 3);  // evicts (1, 2)
  EXPECT_EQ(residency.slot_of(1, 2), -1);
  EXPECT_EQ(residency.owner(1), std::make_pair(0, 3));
  consistent();
  residency.assign(1, 0, 3);  // into its own slot: nothing changes
  EXPECT_EQ(residency.slot_of(0, 3), 1);
  EXPECT_EQ(residency.free_slot(), 0);
  consistent();
}

// An expert number past the model's would alias the next layer's entry.
TEST(ExpertResidency, RefusesAnExpertOrLayerOutsideTheModel) {
  ExpertResidency residency(2, 4, 3);  // 2 layers of 4 experts, 3 slots
  residency.assign(0, 1, 0);
  EXPECT_THROW(residency.slot_of(0, 4), std::out_of_range);  // would read (1, 0)
  EXPECT_THROW(residency.slot_of(-1, 0), std::out_of_range);
  EXPECT_THROW(residency.assign(1, 0, 4), std::out_of_range);
  EXPECT_THROW(residency.assign(1, 2, 0), std::out_of_range);
  EXPECT_EQ(residency.owner(1), std::make_pair(-1, -1));  // nothing taken by the refused ones
  EXPECT_EQ(residency.slot_of(1, 0), 0);
}

TEST(ExpertPlan, TouchesTheSlotsOfItsResidentExpertsAndOfItsLoads) {
  ExpertResidency residency(3, 4, 6);
  residency.assign(0, 0, 1);  // layer 0's expert 1 in slot 0
  residency.assign(1, 0, 2);
  residency.assign(4, 1, 3);  // layer 1's expert 3, as a prefetch would put it
  ExpertPlan layer0;
  layer0.gpu = {1, 2, 0};
  layer0.loads = {{0, 0, -1}};  // expert 0 through the staging buffer
  layer0.cpu = {3};
  EXPECT_FALSE(layer0.touches_slots(0, residency, {4, 5}));
  EXPECT_TRUE(layer0.touches_slots(0, residency, {1}));
  EXPECT_FALSE(layer0.touches_slots(0, residency, {}));
  ExpertPlan layer1;
  layer1.gpu = {0, 3};
  layer1.loads = {{1, 0, 2}};
  EXPECT_TRUE(layer1.touches_slots(1, residency, {4, 5}));  // its resident expert's slot
  EXPECT_TRUE(layer1.touches_slots(1, residency, {2}));     // the slot its load fills
  EXPECT_FALSE(layer1.touches_slots(1, residency, {0, 1, 3}));
  // Layer 0's slots are not layer 1's: expert 1 of layer 1 is not resident.
  layer1.gpu = {1};
  layer1.loads.clear();
  EXPECT_FALSE(layer1.touches_slots(1, residency, {0}));
}

/// A broken policy: the first activated expert on the GPU without loading it,
/// the others on the CPU.
class UnloadedGpuExpertPolicy final : public ExpertPolicy {
 public:
  int slots(int, int, int) const override { return 0; }
  ExpertPlan plan(int, const Routing& routing, const ExpertResidency&) override {
    ExpertPlan plan;
    for (int e = 0; e < static_cast<int>(routing.rows.size()); ++e)
      if (!routing.rows[e].empty()) (plan.gpu.empty() ? plan.gpu : plan.cpu).push_back(e);
    return plan;
  }
};

TEST(MoeModel, RunsTheGpuShareOnItsOwnThreadAndPassesItsErrorsBack) {
  const ScopedGpuWorkerThread worker(true);
  const ModelConfig config = model_preset("tiny-mixtral");
  MoeModel model = MoeModel::synthetic(config, 9, options_with(every_region, mixed_experts()));
  ReferenceModel reference = reference_for(config, 9);
  const int sequence = model.add_sequence();
  const long threads_before = worker_tasks_run();
  for (int token : {5, 17, 200, 3, 99, 42, 7, 8, 11})
    expect_logits_near(model.step({sequence}, {token}).front(), reference.forward({token}),
                       test::model_logit_tolerance, "decode");
  EXPECT_GT(worker_tasks_run(), threads_before);

  // The GPU's experts fail on the worker thread; the caller gets the error.
  MoeModel broken =
      MoeModel::synthetic(config, 9, options_with(every_region, std::make_shared<UnloadedGpuExpertPolicy>()));
  const int b = broken.add_sequence();
  try {
    broken.step({b}, {5});
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("neither resident nor loaded"), std::string::npos) << e.what();
  }
}

/// Labels of the Kokkos allocations made while an AllocationCounter lives.
std::vector<std::string> counted_allocations;
void count_allocation(Kokkos_Profiling_SpaceHandle, const char* label, const void*, std::uint64_t) {
  counted_allocations.emplace_back(label);
}
struct AllocationCounter {
  AllocationCounter() {
    counted_allocations.clear();
    Kokkos::Tools::Experimental::set_allocate_data_callback(count_allocation);
  }
  ~AllocationCounter() { Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr); }
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;
};

// Decode steps reuse their buffers: over 8 warm steps (every region read,
// experts on both devices, the GPU share on its worker thread) buffers grow
// only now and then, geometrically as the sequences lengthen (a label serves a
// few workspaces, each growing at most once here), instead of being allocated
// per step or per layer (no cudaMalloc, cudaHostAlloc or host View in the loop).
TEST(MoeModel, DecodeStepsReuseTheirBuffers) {
  const ScopedGpuWorkerThread worker(true);
  for (const char* name : {"tiny-qwen3-moe", "tiny-deepseek-v2"}) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    MoeModel model = MoeModel::synthetic(config, 9, options_with(every_region, mixed_experts()));
    const std::vector<int> sequences{model.add_sequence(), model.add_sequence()};
    model.prefill(sequences[0], {5, 17, 200, 3, 99, 42, 7});
    model.prefill(sequences[1], {8, 11, 64});
    std::vector<int> tokens{1, 2};
    for (int step = 0; step < 3; ++step) model.step(sequences, tokens);
    constexpr int steps = 8;
    std::vector<std::string> allocations;
    {
      const AllocationCounter counter;
      for (int step = 0; step < steps; ++step) model.step(sequences, tokens);
      allocations = counted_allocations;
    }
    std::map<std::string, int> per_buffer;
    for (const std::string& label : allocations) ++per_buffer[label];
    for (const auto& [label, count] : per_buffer)
      EXPECT_LT(count, steps) << label << " allocated " << count << " times in " << steps << " steps";
  }
}

TEST(MoeModel, BudgetsTooSmallAreClearErrors) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  const VramUse fixed = MoeModel::fixed_vram(config, options_with(every_region, mixed_experts()));
  ModelOptions options = options_with(every_region, std::make_shared<CpuExpertPolicy>());
  options.vram_budget = fixed.weights + fixed.workspace - 1;
  try {
    MoeModel::synthetic(config, 1, options);
    FAIL() << "no error";
  } catch (const ModelBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("vram_budget"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs at least"), std::string::npos) << e.what();
  }
  // Room for the weights but not for every expert of the GPU-only policy.
  options = options_with(every_region, std::make_shared<GpuExpertPolicy>());
  options.vram_budget = fixed.weights + fixed.workspace + MoeModel::expert_bytes(config);
  try {
    MoeModel::synthetic(config, 1, options);
    FAIL() << "no error";
  } catch (const ModelBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("routed experts on the GPU"), std::string::npos) << e.what();
  }
  // What the slots leave is the KV cache's VRAM pool and the decode states of its blocks.
  options = options_with(every_region, std::make_shared<CpuExpertPolicy>());
  options.vram_budget = fixed.weights + fixed.workspace + 3 * mib;
  const MoeModel model = MoeModel::synthetic(config, 1, options);
  const VramUse& use = model.vram_use();
  EXPECT_LE(use.weights + use.workspace + use.expert_slots + use.kv, options.vram_budget);
  // Whole blocks per layer, each with the decode state the GPU keeps for it.
  const AttentionShape shape = config.attention();
  const std::uint64_t block_bytes = model.cache().block_bytes();
  const std::uint64_t state_bytes = static_cast<std::uint64_t>(shape.q_heads) * (shape.value_dim + 1) * sizeof(float);
  const std::uint64_t per_layer = config.layers * block_bytes + state_bytes;
  EXPECT_EQ(use.kv, 3 * mib / per_layer * config.layers * block_bytes);
  EXPECT_EQ(model.cache().capacity_blocks(Region::gpu_resident),
            static_cast<std::int64_t>(use.kv / model.cache().block_bytes()));
}

// The routed experts the CPU streams at decode ask for huge pages
// (framework/host_memory.hpp).
TEST(MoeModel, AsksForHugePagesForItsHostExperts) {
  if (!huge_pages_advisable()) GTEST_SKIP() << "transparent huge pages: " << transparent_huge_pages();
  ModelConfig config = model_preset("tiny-mixtral");
  config.expert_intermediate = 2048;  // several MiB of experts
  const MoeModel model = MoeModel::synthetic(config, 8, options_with(every_region, mixed_experts()));
  const auto [data, bytes] = host_expert_memory(*model.host_experts());
  ASSERT_GE(bytes, std::uint64_t{4} << 20);
  EXPECT_TRUE(huge_pages_advised(data, bytes));
}

TEST(MoeModel, SharesItsRoutedExpertsWithAModelOfTheSameWeights) {
  const ModelConfig config = model_preset("tiny-mixtral");
  MoeModel first = MoeModel::synthetic(config, 8, options_with(every_region, mixed_experts()));
  ModelOptions options = options_with(every_region, mixed_experts());
  options.host_experts = first.host_experts();
  int routed_tensors_read = 0;
  MoeModel second(config,
                  [&](const TensorSpec& spec) {
                    routed_tensors_read += spec.name.find(".experts.") != std::string::npos;
                    return synthetic_tensor<bf16>(spec, 8);
                  },
                  options);
  EXPECT_EQ(routed_tensors_read, 0);
  EXPECT_EQ(second.host_experts(), first.host_experts());
  const int a = first.add_sequence(), b = second.add_sequence();
  expect_logits_near(second.prefill(b, {3, 1, 4, 1, 5}), first.prefill(a, {3, 1, 4, 1, 5}), 0, "prefill");
  // Another model's experts do not fit.
  ModelOptions wrong = options_with(every_region, mixed_experts());
  wrong.host_experts = first.host_experts();
  EXPECT_THROW(MoeModel::synthetic(model_preset("tiny-qwen3-moe"), 8, wrong), std::invalid_argument);
  // Nor those of a model that differs only in its experts' width.
  ModelConfig wider = first.config();
  wider.expert_intermediate *= 2;
  EXPECT_THROW(MoeModel::synthetic(wider, 8, wrong), std::invalid_argument);
}

// Host memory is counted as it is held: the expert store (page-locked or
// not, shared by models of the same weights), the KV pools and the pinned
// staging buffers; page-locking changes nothing in the results.
TEST(MoeModel, HostUseCountsItsPinnedAndPageableMemory) {
  const ModelConfig config = model_preset("tiny-mixtral");
  ModelOptions pinned = options_with(every_region, mixed_experts());
  MoeModel first = MoeModel::synthetic(config, 8, pinned);
  const int a = first.add_sequence();
  const auto expected = first.prefill(a, {3, 1, 4, 1, 5});
  const HostUse use = first.host_use();
  EXPECT_TRUE(use.experts_pinned);
  EXPECT_EQ(use.experts, MoeModel::expert_store_bytes(config));
  const std::uint64_t block_bytes =
      static_cast<std::uint64_t>(config.attention().block_geometry(4).block_elements()) * sizeof(bf16);
  EXPECT_EQ(use.kv_pinned, pinned.pinned_kv_budget / block_bytes * block_bytes);
  EXPECT_EQ(use.kv_host, pinned.host_kv_budget / block_bytes * block_bytes);
  EXPECT_GT(use.staging_pinned, 0u);
  EXPECT_LE(use.staging_pinned, MoeModel::pinned_staging_bytes(config, pinned));
  EXPECT_EQ(use.pinned(), use.experts + use.kv_pinned + use.staging_pinned);
  EXPECT_EQ(use.total(), use.experts + use.kv_pinned + use.kv_host + use.staging_pinned);

  ModelOptions pageable = options_with(every_region, mixed_experts());
  pageable.pin_experts = false;
  pageable.host_experts = first.host_experts();
  MoeModel second = MoeModel::synthetic(config, 8, pageable);
  EXPECT_FALSE(second.host_use().experts_pinned);
  EXPECT_EQ(second.host_use().pinned(), second.host_use().kv_pinned + second.host_use().staging_pinned);
  const int b = second.add_sequence();
  expect_logits_near(second.prefill(b, {3, 1, 4, 1, 5}), expected, 0, "pageable experts");

  // A policy that never copies experts to the GPU leaves them pageable, pin_experts or not (a full-size
  // Mixtral would otherwise page-lock 84 GiB for nothing).
  ModelOptions cpu_experts = options_with(every_region, std::make_shared<CpuExpertPolicy>());
  ASSERT_TRUE(cpu_experts.pin_experts);
  const MoeModel third = MoeModel::synthetic(config, 8, cpu_experts);
  EXPECT_FALSE(third.host_use().experts_pinned);
  EXPECT_EQ(third.host_use().pinned(), third.host_use().kv_pinned + third.host_use().staging_pinned);
}

// A freed sequence returns its blocks to their pools and its VRAM share to
// the KV policy: the next sequence is placed as the first one was.
TEST(MoeModel, FreedSequencesReturnTheirBlocksAndVramShare) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  ModelOptions options = options_with(every_region, mixed_experts());
  const VramUse fixed = MoeModel::fixed_vram(config, options);
  options.vram_budget = fixed.weights + fixed.workspace + MoeModel::expert_store_bytes(config) +
                        MoeModel::kv_vram(config, options, 3);
  options.kv_policy = [](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<FirstFitKVPolicy>(test_roofline(), shape, cache, Region::gpu_streamed);
  };
  MoeModel model = MoeModel::synthetic(config, 8, options);
  auto regions_after_fill = [&] {
    const int sequence = model.add_sequence();
    model.fill_context(sequence, 20, 1);
    std::array<std::uint64_t, 4> bytes{};
    for (int r = 0; r < 4; ++r) bytes[r] = model.cache().region_bytes(static_cast<Region>(r));
    model.free_sequence(sequence);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(model.cache().region_bytes(static_cast<Region>(r)), 0u);
    return bytes;
  };
  const auto first = regions_after_fill();
  EXPECT_GT(first[static_cast<int>(Region::gpu_resident)], 0u);
  EXPECT_GT(first[static_cast<int>(Region::gpu_streamed)], 0u);
  EXPECT_EQ(regions_after_fill(), first);
}

// A checkpoint saved in the Hub's config format and the same one in
// transformers 5's give identical logits (every architecture; DeepSeek's YaRN
// travels in rope_parameters in the second).
TEST(MoeModel, CheckpointsInEitherConfigFormatGiveIdenticalLogits) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_config_formats_" + std::to_string(::getpid()));
  for (const char* name : {"tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    std::vector<std::vector<float>> logits;
    for (ConfigFormat format : {ConfigFormat::hub, ConfigFormat::transformers5}) {
      fs::remove_all(dir);
      write_synthetic_checkpoint(dir.string(), model_preset(name), 4, TensorDType::bf16, format);
      const ModelConfig config = load_hf_config((dir / "config.json").string());
      MoeModel model = MoeModel::from_checkpoint(SafetensorsCheckpoint(dir.string()), config,
                                                 options_with(every_region, mixed_experts()));
      logits.push_back(model.prefill(model.add_sequence(), {3, 1, 4, 1, 5, 9, 2, 6}));
    }
    expect_logits_near(logits[1], logits[0], 0, "transformers 5 vs Hub");
  }
  fs::remove_all(dir);
}

TEST(MoeModel, LoadsACheckpointAndNamesWhatIsMissing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_model_checkpoint_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const ModelConfig config = model_preset("tiny-deepseek-v2");
  write_synthetic_checkpoint(dir.string(), config, 6, TensorDType::bf16);
  const SafetensorsCheckpoint checkpoint(dir.string());
  MoeModel loaded = MoeModel::from_checkpoint(checkpoint, config, options_with(every_region, mixed_experts()));
  MoeModel synthetic = MoeModel::synthetic(config, 6, options_with(every_region, mixed_experts()));
  const int a = loaded.add_sequence(), b = synthetic.add_sequence();
  expect_logits_near(loaded.prefill(a, {3, 1, 4, 1, 5}), synthetic.prefill(b, {3, 1, 4, 1, 5}), 0, "prefill");
  // A config with one more layer than the checkpoint holds.
  ModelConfig deeper = config;
  deeper.layers += 1;
  try {
    MoeModel::from_checkpoint(checkpoint, deeper, options_with(every_region, mixed_experts()));
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers." + std::to_string(config.layers)), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}


// A model too large for the machine is refused before anything is allocated,
// naming the bytes, and quickly even for 100,000 layers (no tensor lists).
TEST(MoeModel, HostMemoryBeyondTheMachineIsAClearErrorBeforeAllocating) {
  ModelConfig config = model_preset("tiny-qwen3-moe");
  config.layers = 100'000;
  ModelOptions options = options_with(every_region, mixed_experts());
  options.vram_budget = std::uint64_t{1} << 50;
  options.host_kv_budget = std::uint64_t{1} << 50;  // a pebibyte of KV pool
  EXPECT_GT(MoeModel::host_bytes_needed(config, options), available_host_memory());
  try {
    MoeModel model = MoeModel::synthetic(config, 1, options);
    FAIL() << "no error";
  } catch (const ModelBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("host memory: tiny-qwen3-moe with these budgets needs"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("available"), std::string::npos) << e.what();
  }
  // What a tiny model needs is what it allocates at most.
  const ModelConfig tiny = model_preset("tiny-qwen3-moe");
  MoeModel model = MoeModel::synthetic(tiny, 1, options_with(every_region, mixed_experts()));
  const HostUse use = model.host_use();
  EXPECT_GE(MoeModel::host_bytes_needed(tiny, options_with(every_region, mixed_experts())),
            use.total() + (has_gpu ? 0 : model.vram_use().weights + model.vram_use().kv));
  // Beyond what the model keeps, loading holds its largest tensor (the embeddings here) as an F32 file
  // gives it and as its bf16 copy.
  const ModelOptions tiny_options = options_with(every_region, mixed_experts());
  const VramUse vram = MoeModel::vram_plan(tiny, tiny_options);
  const std::uint64_t kept = MoeModel::expert_store_bytes(tiny) + tiny_options.pinned_kv_budget +
                             tiny_options.host_kv_budget + MoeModel::pinned_staging_bytes(tiny, tiny_options) +
                             (has_gpu ? 0 : vram.weights + vram.workspace + vram.expert_slots + vram.kv);
  EXPECT_GE(MoeModel::host_bytes_needed(tiny, tiny_options) - kept,
            static_cast<std::uint64_t>(tiny.vocab) * tiny.hidden * (sizeof(float) + sizeof(bf16)));
}

// NaN or Inf in a forward pass stops it with an error naming where: the first
// such layer when each layer is checked (generate), else the logits.
TEST(MoeModel, NonFiniteValuesAreNamedByLayerOrLogits) {
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  // Layer 1's output projection at the largest bf16 overflows its attention output.
  const MoeModel::TensorSource overflowing = [](const TensorSpec& spec) {
    auto values = synthetic_tensor<bf16>(spec, 3);
    if (spec.name == "model.layers.1.self_attn.o_proj.weight")
      for (bf16& v : values) v = from_float<bf16>(3e38f);
    return values;
  };
  for (bool check_finite : {true, false}) {
    ModelOptions options = options_with(every_region, mixed_experts());
    options.check_finite = check_finite;
    MoeModel model(config, overflowing, options);
    try {
      model.prefill(model.add_sequence(), {1, 2, 3});
      ADD_FAILURE() << "no NonFiniteError";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find(check_finite ? "the output of layer 1 holds NaN or Inf"
                                                        : "the logits of row 2 hold NaN or Inf"),
                std::string::npos)
          << e.what();
    }
  }
}

// Checkpoints store weights as F32, F16 or BF16; the runtime keeps bf16. An
// F32 checkpoint rounds to exactly the synthetic bf16 weights; an F16 one
// (rounded twice) runs as the reference does on the same file.
TEST(MoeModel, WeightsStoredAsF32F16OrBf16Load) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_dtypes_" + std::to_string(::getpid()));
  const std::vector<int> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  for (const char* name : tiny_models) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    MoeModel synthetic = MoeModel::synthetic(config, 4, options_with(every_region, mixed_experts()));
    const auto expected = synthetic.prefill(synthetic.add_sequence(), prompt);
    for (TensorDType dtype : {TensorDType::bf16, TensorDType::f32, TensorDType::f16}) {
      SCOPED_TRACE(dtype_name(dtype));
      fs::remove_all(dir);
      write_synthetic_checkpoint(dir.string(), config, 4, dtype);
      const SafetensorsCheckpoint checkpoint(dir.string());
      MoeModel loaded = MoeModel::from_checkpoint(checkpoint, config, options_with(every_region, mixed_experts()));
      const auto logits = loaded.prefill(loaded.add_sequence(), prompt);
      if (dtype != TensorDType::f16) {
        expect_logits_near(logits, expected, 0, "against the synthetic bf16 weights");
        continue;
      }
      std::vector<std::vector<float>> stored;
      for (const auto& tensor : load_weights<bf16>(checkpoint, config)) {
        stored.emplace_back();
        for (bf16 v : tensor) stored.back().push_back(to_float(v));
      }
      ReferenceModel reference(config, std::move(stored));
      reference.round_kv_cache_to_bf16(true);
      expect_logits_near(logits, reference.forward(prompt), test::model_logit_tolerance, "against the reference");
    }
  }
  fs::remove_all(dir);
}

// What storing weights and the KV cache in bf16 costs: the runtime against the
// reference on the unrounded fp32 weights with an fp32 KV cache (both from
// the same synthetic values), over a prompt and decode steps. The figures are
// printed (and kept as test properties) for moe/README.md; the bound is a
// regression guard, a few times what bf16 rounding gives today.
TEST(MoeModel, Bf16StorageErrorAgainstFp32Math) {
  const std::vector<int> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  const std::vector<int> decoded{97, 9, 33, 200, 7, 81, 150, 2};
  for (const char* name : tiny_models) {
    SCOPED_TRACE(name);
    const ModelConfig config = model_preset(name);
    std::vector<std::vector<float>> weights;
    for (const TensorSpec& spec : weight_specs(config)) weights.push_back(synthetic_tensor<float>(spec, 8));
    ReferenceModel fp32(config, std::move(weights));
    MoeModel model = MoeModel::synthetic(config, 8, options_with(every_region, mixed_experts()));
    const int sequence = model.add_sequence();
    std::vector<std::pair<std::vector<float>, std::vector<float>>> steps;  // (runtime, fp32) per step
    steps.emplace_back(model.prefill(sequence, prompt), fp32.forward(prompt));
    for (int token : decoded) steps.emplace_back(model.step({sequence}, {token}).front(), fp32.forward({token}));
    std::vector<double> errors;  // |runtime - fp32| relative to the step's largest |fp32 logit|
    for (const auto& [runtime, exact] : steps) {
      ASSERT_EQ(runtime.size(), exact.size());
      double scale = 0;
      for (float e : exact) scale = std::max(scale, static_cast<double>(std::abs(e)));
      for (std::size_t v = 0; v < exact.size(); ++v) errors.push_back(std::abs(runtime[v] - exact[v]) / scale);
    }
    std::sort(errors.begin(), errors.end());
    const double median = errors[errors.size() / 2], worst = errors.back();
    std::printf("[ bf16 vs fp32 ] %s: logit error relative to the largest |logit|: max %.2e, median %.2e\n", name,
                worst, median);
    ::testing::Test::RecordProperty(std::string(name) + "_max_relative_logit_error", std::to_string(worst));
    ::testing::Test::RecordProperty(std::string(name) + "_median_relative_logit_error", std::to_string(median));
    EXPECT_LT(worst, 0.05);
    EXPECT_LT(median, 0.01);
    // The comparison sees bf16 rounding at all (an fp32 run would agree to ~1e-6).
    EXPECT_GT(median, 1e-5);
  }
}


// Logits of a known-good state, kept in the repository: the reference model
// (bf16 weights, bf16 KV cache) on each tiny model's synthetic weights, a
// prompt and greedy decode steps. A change that alters the numbers of both the
// runtime and the reference (a preset, the rotary settings, the synthetic
// weights, the config reader) fails here although they still agree. After an
// intended change, rewrite the file and say why in the commit:
//   WRITESCOPE_WRITE_GOLDEN=1 ./tests/writescope_tests --gtest_filter=MoeModel.ReproducesTheGoldenLogits
}  // namespace
namespace test {
extern const char* const golden_logits_text;  // tests/data/golden_logits.txt
}  // namespace test
namespace {

struct GoldenCase {
  std::string model;
  std::vector<int> prompt, decoded;        // decoded: the tokens fed after the prompt
  std::vector<std::vector<float>> logits;  // after the prompt, then after each decoded token
};

// Where WRITESCOPE_WRITE_GOLDEN rewrites the file; the tests read the copy
// built into the binary (tests/golden_logits.cpp.in).
const char* const golden_path = WRITESCOPE_TEST_DATA_DIR "/golden_logits.txt";
constexpr std::uint64_t golden_seed = 2026;

std::vector<GoldenCase> read_golden() {
  std::istringstream in(test::golden_logits_text);
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    if (!(fields >> key) || key[0] == '#') continue;
    if (key == "model") {
      cases.emplace_back();
      fields >> cases.back().model;
      continue;
    }
    if (cases.empty()) throw std::runtime_error(std::string(golden_path) + ": '" + key + "' before 'model'");
    GoldenCase& c = cases.back();
    if (key == "prompt" || key == "decoded") {
      for (int token; fields >> token;) (key == "prompt" ? c.prompt : c.decoded).push_back(token);
    } else if (key == "logits") {
      c.logits.emplace_back();
      for (float v; fields >> v;) c.logits.back().push_back(v);
    } else {
      throw std::runtime_error(std::string(golden_path) + ": unknown line '" + key + "'");
    }
  }
  return cases;
}

void write_golden() {
  std::ofstream out(golden_path);
  out << "# Logits of the reference model (bf16 weights, bf16 KV cache) on synthetic weights, seed " << golden_seed
      << ".\n# Written by MoeModel.ReproducesTheGoldenLogits with WRITESCOPE_WRITE_GOLDEN=1 (tests/README.md).\n";
  const std::vector<int> prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  for (const char* name : tiny_models) {
    ReferenceModel reference = reference_for(model_preset(name), golden_seed);
    std::vector<std::vector<float>> logits{reference.forward(prompt)};
    std::vector<int> decoded;
    for (int step = 0; step < 3; ++step) {
      const auto& last = logits.back();
      decoded.push_back(static_cast<int>(std::max_element(last.begin(), last.end()) - last.begin()));
      logits.push_back(reference.forward({decoded.back()}));
    }
    out << "model " << name << "\nprompt";
    for (int t : prompt) out << ' ' << t;
    out << "\ndecoded";
    for (int t : decoded) out << ' ' << t;
    out << '\n';
    char value[32];
    for (const auto& step : logits) {
      out << "logits";
      for (float v : step) out << ' ' << (std::snprintf(value, sizeof value, "%.9g", v), value);
      out << '\n';
    }
  }
}

TEST(MoeModel, ReproducesTheGoldenLogits) {
  if (std::getenv("WRITESCOPE_WRITE_GOLDEN")) {
    write_golden();
    GTEST_SKIP() << "wrote " << golden_path;
  }
  const std::vector<GoldenCase> cases = read_golden();
  ASSERT_EQ(cases.size(), std::size(tiny_models));
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_golden_" + std::to_string(::getpid()));
  for (const GoldenCase& golden : cases) {
    SCOPED_TRACE(golden.model);
    ASSERT_EQ(golden.logits.size(), golden.decoded.size() + 1);
    // The reference agrees to the last bits (double accumulation, one order).
    ReferenceModel reference = reference_for(model_preset(golden.model), golden_seed);
    expect_logits_near(reference.forward(golden.prompt), golden.logits[0], 1e-5, "reference, prompt");
    for (std::size_t t = 0; t < golden.decoded.size(); ++t)
      expect_logits_near(reference.forward({golden.decoded[t]}), golden.logits[t + 1], 1e-5,
                         "reference, decode step " + std::to_string(t));
    // The runtime, from a checkpoint in transformers 5's format, within its tolerance.
    fs::remove_all(dir);
    write_synthetic_checkpoint(dir.string(), model_preset(golden.model), golden_seed, TensorDType::bf16,
                               ConfigFormat::transformers5);
    MoeModel model = MoeModel::from_checkpoint(SafetensorsCheckpoint(dir.string()),
                                               load_hf_config((dir / "config.json").string()),
                                               options_with(every_region, mixed_experts()));
    const int sequence = model.add_sequence();
    expect_logits_near(model.prefill(sequence, golden.prompt), golden.logits[0], test::model_logit_tolerance,
                       "runtime, prompt");
    for (std::size_t t = 0; t < golden.decoded.size(); ++t)
      expect_logits_near(model.step({sequence}, {golden.decoded[t]}).front(), golden.logits[t + 1],
                         test::model_logit_tolerance, "runtime, decode step " + std::to_string(t));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace writescope
