#include "experiments/predict.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>

#include "attention/kv_policy.hpp"
#include "experiments/impl/run_record.hpp"
#include "framework/results_store.hpp"
#include "scratch_dir.hpp"
#include "test_profile.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

/// A GPU machine of round numbers (a projection prices a GPU machine in any build).
MachineProfile round_profile() {
  MachineProfile p = test::tiny_profile();
  // The process's own count, which its runs record: `predict --compare` prices only runs of the profile's
  // count (the rates are those of 2 threads at 2 or more).
  p.cpu_threads = HostExecSpace().concurrency();
  p.has_gpu = true;
  p.hbm_gbps = 100;
  p.gpu_attention_gbps.clear();
  p.pinned_h2d_gbps = p.pinned_d2h_gbps = 10;
  p.pageable_h2d_gbps = p.pageable_d2h_gbps = 5;
  p.gpu_launch_latency_s = 1e-6;
  p.link_latency_s = 2e-6;
  p.cpu_launch_latency_s = 3e-6;
  p.cpu_expert_gbps = 4;
  p.cpu_expert_gflops = 8;
  return p;
}

ModelOptions first_fit_options(const MachineProfile& profile, std::uint64_t vram_budget,
                               std::shared_ptr<ExpertPolicy> experts) {
  ModelOptions options;
  options.vram_budget = vram_budget;
  options.pinned_kv_budget = std::uint64_t{1} << 20;
  options.block_tokens = 8;
  options.max_rows = 4;
  options.experts = std::move(experts);
  const RooflineModel roofline(ModelRates::from_profile(profile, "tiny-mixtral", profile.cpu_threads));
  options.kv_policy = [roofline](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<FirstFitKVPolicy>(roofline, shape, cache, Region::gpu_streamed);
  };
  return options;
}

/// A VRAM budget of the model's weights and workspace plus `blocks` KV blocks per layer.
std::uint64_t vram_for(const ModelConfig& config, const ModelOptions& options, std::uint64_t blocks) {
  const VramUse fixed = MoeModel::fixed_vram(config, options);
  return fixed.weights + fixed.workspace + MoeModel::kv_vram(config, options, blocks);
}

/// One measured step, no warm-up, of one sequence filled to 32 tokens (the step attends 33).
DecodeWorkload one_step_at_33_tokens() {
  DecodeWorkload workload;
  workload.context = 32;
  workload.planned_tokens = 64;
  workload.warmup_steps = 0;
  workload.measured_steps = 1;
  return workload;
}

// Two layers of tiny-mixtral (hidden 64, 4 query and 2 KV heads of 16, 4
// experts of 32, top 2, vocab 256), one sequence of 32 tokens whose KV fits
// VRAM, every routed expert on the CPU (KTransformers), one measured step,
// priced by hand from the profile's round numbers.
TEST(PredictTest, PricesATwoLayerStepAsComputedByHand) {
  const MachineProfile profile = round_profile();
  const ModelConfig config = model_preset("tiny-mixtral");
  const DecodeWorkload workload = one_step_at_33_tokens();
  const PricedSteps priced = price_decode(
      config, first_fit_options(profile, 8 << 20, std::make_shared<CpuExpertPolicy>()), profile, workload);
  ASSERT_EQ(priced.step_seconds.size(), 1u);

  // Attention: 33 tokens x 2 KV heads x (16 + 16) x 2 bytes = 4224 bytes in VRAM at 100 GB/s, plus the GPU latency.
  const double attention = 4224 / 100e9 + 1e-6;
  // Projections q, k, v, o (64x64, 32x64, 32x64, 64x64) in bf16 and two fp32 norms of 64: 25088 bytes, 17 launches.
  const double dense = 25088 / 100e9 + 17 * 1e-6;
  // Router 4x64 bf16 and 5 launches; each of the 2 experts (3 x 64 x 32 bf16 = 12288 bytes, 12288 FLOP for the
  // token) at max(12288 / 4 GB/s, 12288 / 8 GFLOP/s), both in one batch of 5 host launches; the token's
  // activations (256 bytes) to the host and back at 10 GB/s with the link latency each way; the GPU has no
  // experts to overlap.
  const double router = 512 / 100e9 + 5 * 1e-6;
  const double experts = 2 * 12288 / 4e9 + 5 * 3e-6;
  const double copies = 2 * (256 / 10e9 + 2e-6);
  const double layer = attention + dense + router + copies + experts;
  // The LM head (256 x 64 bf16), the logits (256 floats) back at 10 GB/s, 6 launches.
  const double step = 2 * layer + 32768 / 100e9 + 1024 / 10e9 + 6 * 1e-6;
  EXPECT_NEAR(priced.step_seconds[0], step, 1e-12);

  const std::vector<LayerRecord>& layers = priced.layers[0];
  ASSERT_EQ(layers.size(), 2u);
  for (const LayerRecord& r : layers) {
    EXPECT_NEAR(r.attention_gpu, attention, 1e-12);
    EXPECT_EQ(r.attention_cpu, 0);
    EXPECT_NEAR(r.experts_cpu, experts, 1e-12);
    EXPECT_NEAR(r.transfers, copies, 1e-12);
    EXPECT_NEAR(r.other, dense, 1e-12);
    EXPECT_EQ(r.region_bytes[int(Region::gpu_resident)], 4224);
    EXPECT_EQ(r.alpha, 0);
  }
}

// MoE-Lightning's two micro-batches with a GPU, seconds by hand: attention 3
// and feed-forward 2 each; the first feed-forward prefetches 5 of the next
// layer's experts as it ends (at 5), beside the second attention (until 6)
// and the second feed-forward (until 8): 2 are left at the layer's end, and
// the next layer's first attention (3) hides them. Without a GPU nothing
// overlaps.
TEST(PredictTest, APrefetchRunsBesideTheRestOfItsLayerAndTheNextAttention) {
  const LayerTimeline first = layer_timeline({3, 3}, {2, 2}, {5, 0}, 0, true, true);
  EXPECT_DOUBLE_EQ(first.wall, 8);
  EXPECT_DOUBLE_EQ(first.exposed, 0);
  EXPECT_DOUBLE_EQ(first.copies_left, 2);
  const LayerTimeline next = layer_timeline({3, 3}, {2, 2}, {0, 0}, first.copies_left, true, true);
  EXPECT_DOUBLE_EQ(next.exposed, 0);
  EXPECT_DOUBLE_EQ(next.wall, 8);
  EXPECT_DOUBLE_EQ(next.copies_left, 0);
  // 9 seconds of copies: 6 left at the end, 3 hidden by the next attention, 3 waited for by the first
  // feed-forward, beside the second attention: 3 + max(3 + 2, 3) + 2.
  const LayerTimeline long_copy = layer_timeline({3, 3}, {2, 2}, {9, 0}, 0, true, true);
  EXPECT_DOUBLE_EQ(long_copy.copies_left, 6);
  const LayerTimeline waiting = layer_timeline({3, 3}, {2, 2}, {0, 0}, long_copy.copies_left, true, true);
  EXPECT_DOUBLE_EQ(waiting.exposed, 3);
  EXPECT_DOUBLE_EQ(waiting.wall, 10);
  // A wait shorter than the second attention costs nothing: 3 + max(1 + 2, 4) + 2.
  EXPECT_DOUBLE_EQ(layer_timeline({3, 4}, {2, 2}, {0, 0}, 4, true, true).wall, 9);
  // A dense layer (no experts) does not wait: its whole time hides the copies.
  const LayerTimeline dense = layer_timeline({3}, {2}, {0}, 6, false, true);
  EXPECT_DOUBLE_EQ(dense.exposed, 0);
  EXPECT_DOUBLE_EQ(dense.copies_left, 1);
  // Without a GPU the stages run one after the other (3 + 2 + 3 + 2), and
  // the first feed-forward waits for copies left over (12 - 3).
  const LayerTimeline host = layer_timeline({3, 3}, {2, 2}, {0, 0}, 12, true, false);
  EXPECT_DOUBLE_EQ(host.exposed, 9);
  EXPECT_DOUBLE_EQ(host.wall, 19);
  EXPECT_DOUBLE_EQ(host.copies_left, 0);
  // A second prefetch starts after the first has finished.
  const LayerTimeline two = layer_timeline({3, 3}, {2, 2}, {5, 4}, 0, true, true);
  EXPECT_DOUBLE_EQ(two.copies_left, 14 - 8);
}

// The same step with VRAM for 2 of the layer's 5 blocks: the first 16
// tokens are read in VRAM, the other 17 streamed over the link (latency
// included) by the GPU, and nothing goes to the CPU (a first-fit baseline).
TEST(PredictTest, PricesStreamedKvAtTheLinkRate) {
  const MachineProfile profile = round_profile();
  const ModelConfig config = model_preset("tiny-mixtral");
  const DecodeWorkload workload = one_step_at_33_tokens();
  ModelOptions options = first_fit_options(profile, 0, std::make_shared<CpuExpertPolicy>());
  options.vram_budget = vram_for(config, options, 2);
  const PricedSteps priced = price_decode(config, options, profile, workload);
  for (const LayerRecord& r : priced.layers.at(0)) {
    EXPECT_EQ(r.region_bytes[int(Region::gpu_resident)], 16 * 128);
    EXPECT_EQ(r.region_bytes[int(Region::gpu_streamed)], 17 * 128);
    EXPECT_NEAR(r.attention_gpu, 2048 / 100e9 + 2176 / 10e9 + 1e-6 + 2e-6, 1e-12);
    EXPECT_EQ(r.attention_cpu, 0);
  }
}

/// After each layer, the next layer's four experts prefetched into the four
/// slots (after the last layer, the first layer's, for the next step); a
/// routed expert runs on the GPU where it is resident and `gpu` allows it,
/// else on the CPU.
class PrefetchingExpertPolicy final : public ExpertPolicy {
 public:
  explicit PrefetchingExpertPolicy(bool gpu) : gpu_(gpu) {}
  int slots(int, int, int) const override { return 4; }
  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override {
    ExpertPlan plan;
    for (int e : routing.active()) (gpu_ && residency.slot_of(layer, e) >= 0 ? plan.gpu : plan.cpu).push_back(e);
    return plan;
  }
  std::vector<ExpertLoad> after_layer(int layer, const Routing&, const ExpertResidency& residency) override {
    const int next = (layer + 1) % residency.layers();
    return {{next, 0, 0}, {next, 1, 1}, {next, 2, 2}, {next, 3, 3}};
  }

 private:
  bool gpu_;
};

// Each layer's prefetch (4 experts of 12288 bytes at 10 GB/s, with a link
// latency of 20 us each: 84.9 us) is still copying when the next layer's GPU
// streams its KV: they share the link, each at half the rate while both run,
// so the streamed transfer and the copies both take min(copies, transfer)
// longer (all of a short transfer's 0.22 us at 33 tokens; 12.6 us of the
// copies at 1001 tokens). The next layer's experts, all resident, wait for
// the copies' end where its attention and dense weights (17.3 us) do not
// hide it; the LM head (6.4 us) hides part of the last layer's copies from
// the next step. Experts on the CPU use no slot the copies fill and wait for
// nothing, as the runtime's (MoeModel::wait_for_prefetch). The first layer
// of the first step streams alone (the warm-up's end drains the copies).
TEST(PredictTest, PrefetchCopiesShareTheLinkAndAreWaitedForWhereTheirSlotsAreUsed) {
  MachineProfile profile = round_profile();
  profile.link_latency_s = 20e-6;
  const ModelConfig config = model_preset("tiny-mixtral");
  const double copies = 4 * (20e-6 + 12288 / 10e9), dense = 25088 / 100e9 + 17e-6;
  const double lm_head = 32768 / 100e9 + 1024 / 10e9 + 6e-6, activations = 2 * (256 / 10e9 + 20e-6);
  for (const bool gpu : {true, false})
    for (const int context : {32, 1000}) {
      SCOPED_TRACE(std::to_string(context) + " tokens, experts " + (gpu ? "on the GPU" : "on the CPU"));
      DecodeWorkload workload = one_step_at_33_tokens();
      workload.context = context;
      workload.planned_tokens = 1024;
      workload.measured_steps = 2;
      ModelOptions options = first_fit_options(profile, 0, std::make_shared<PrefetchingExpertPolicy>(gpu));
      options.vram_budget = vram_for(config, options, 2) + 4 * MoeModel::expert_bytes(config);
      const PricedSteps priced = price_decode(config, options, profile, workload);
      ASSERT_EQ(priced.layers.size(), 2u);
      double left = 0;  // copies in flight at the layer's start, where followed
      for (std::size_t step = 0; step < 2; ++step)
        for (std::size_t layer = 0; layer < 2; ++layer) {
          SCOPED_TRACE("step " + std::to_string(step) + ", layer " + std::to_string(layer));
          const LayerRecord& r = priced.layers[step][layer];
          const double streamed = r.region_bytes[int(Region::gpu_streamed)];
          ASSERT_EQ(streamed, (context + 1 + step - 16) * 128.0);
          const double transfer = streamed / 10e9, shared = std::min(left, transfer);
          // Copies never waited for pile up: followed in the first step only.
          if (gpu || step == 0) {
            EXPECT_NEAR(r.attention_gpu, 2048 / 100e9 + transfer + 1e-6 + 20e-6 + shared, 1e-12);
            EXPECT_NEAR(r.streamed_seconds, transfer + 20e-6 + shared, 1e-12);
          }
          if (gpu && (step > 0 || layer > 0)) {  // the first layer's experts are copied after it
            const double wait = left + shared - (r.attention + dense);
            EXPECT_GT(wait, 0);
            EXPECT_NEAR(r.transfers, wait, 1e-12);
          } else {
            EXPECT_NEAR(r.transfers, activations, 1e-12);
          }
          left = copies;  // this layer's own, the earlier ones waited for (or, on the CPU, not followed)
          if (layer == 1) left -= lm_head;
        }
    }
}

// The same step on a host-only profile, as a host build runs it: the
// "streamed" 17 tokens are first copied at half the DRAM read rate (no link,
// no link latency), then the host reads all 33 tokens token-major at the
// band's rate (8 GB/s at 2 threads) with its launch latency; nothing is
// on the CPU side of the split.
TEST(PredictTest, PricesHostOnlyAttentionAsAHostBuildRunsIt) {
  MachineProfile profile = round_profile();
  profile.has_gpu = false;
  profile.cpu_dram_read_gbps = 40;  // the host copy at 20 GB/s, the pinned "link" at 10
  const ModelConfig config = model_preset("tiny-mixtral");
  ModelOptions options = first_fit_options(profile, 0, std::make_shared<CpuExpertPolicy>());
  options.vram_budget = vram_for(config, options, 2);
  const PricedSteps priced = price_decode(config, options, profile, one_step_at_33_tokens());
  // 1 multiply-add per byte (2 query heads x 32 dims per 64 bytes of a head's key and value) at 100 G lanes/s.
  const double copy = 2176 / 20e9;
  const double read = std::max(4224 / 8e9, 4224 * 1.0 / 100e9) + 3e-6;
  for (const LayerRecord& r : priced.layers.at(0)) {
    EXPECT_EQ(r.region_bytes[int(Region::gpu_resident)], 16 * 128);
    EXPECT_EQ(r.region_bytes[int(Region::gpu_streamed)], 17 * 128);
    EXPECT_NEAR(r.streamed_seconds, copy, 1e-15);
    EXPECT_NEAR(r.attention_gpu, read + copy, 1e-15);
    EXPECT_NEAR(r.attention, read + copy, 1e-15);
    EXPECT_EQ(r.attention_cpu, 0);
  }
}

// The GPU side's experts priced as the runtime runs them (moe/model.cpp):
// a run of resident experts as one batch, a staged expert alone. Two layers
// of tiny-mixtral, one token, its 2 experts each 12288 bytes at 100 GB/s.
TEST(PredictTest, PricesTheGpusExpertsAsTheRuntimeBatchesThem) {
  const ModelConfig config = model_preset("tiny-mixtral");
  const MachineProfile profile = round_profile();
  for (const bool staged : {false, true}) {
    // Every expert resident, or expert 1 staged for its layer and the rest resident.
    auto placement = [staged](int, int expert) {
      return staged && expert == 1 ? ExpertPlacement::gpu_loaded : ExpertPlacement::gpu_resident;
    };
    const PricedSteps priced =
        price_decode(config, first_fit_options(profile, 16 << 20, std::make_shared<FixedExpertPolicy>(placement)),
                     profile, one_step_at_33_tokens());
    ASSERT_EQ(priced.layers.size(), 1u);
    bool saw_staged = false;
    for (const LayerRecord& r : priced.layers[0]) {
      const double products = 2 * 12288 / 100e9;
      // One batch of 2 groups of rows: gather, silu, weighted sums, one launch of the 4 gate and up products, one
      // of the 2 down products, two copies: 7 launches. Where a routed expert is staged, it runs alone (6
      // launches) and the other is a batch of one group (7).
      const bool routed_staged = r.transfers > 0;
      saw_staged = saw_staged || routed_staged;
      EXPECT_NEAR(r.experts_gpu, products + (routed_staged ? 13e-6 : 7e-6), 1e-12)
          << (staged ? "with" : "without") << " a staged expert";
    }
    EXPECT_EQ(saw_staged, staged) << "expert 1 was not routed in any layer";
  }
}

// Experts split between the devices: with a GPU its experts (and their
// loads) run beside the CPU's, so the feed-forward costs the larger side;
// a host-only profile runs them one after the other, as a host build does.
TEST(PredictTest, TheDevicesExpertsOverlapOnlyWithAGpu) {
  const ModelConfig config = model_preset("tiny-mixtral");
  DecodeWorkload workload;
  workload.batch = 4;
  workload.context = 16;
  workload.planned_tokens = 64;
  workload.measured_steps = 3;
  for (const bool gpu : {true, false}) {
    MachineProfile profile = round_profile();
    profile.has_gpu = gpu;
    auto placement = [](int, int expert) {
      return expert == 0 ? ExpertPlacement::gpu_resident
                         : expert == 1 ? ExpertPlacement::gpu_loaded : ExpertPlacement::cpu;
    };
    const PricedSteps priced =
        price_decode(config, first_fit_options(profile, 16 << 20, std::make_shared<FixedExpertPolicy>(placement)),
                     profile, workload);
    // Router (4 x 64 bf16) and its 5 launches; the 4 rows' activations (1024 bytes) to the CPU and back.
    const double router = gpu ? 512 / 100e9 + 5e-6 : 512 / 4e9 + 4 * 256 * 2 / 8e9 + 5 * 3e-6;
    const double copy = gpu ? 1024 / 10e9 + 2e-6 : 1024 / 10e9;
    bool both = false;
    for (const auto& step : priced.layers)
      for (const LayerRecord& r : step) {
        const double copies = r.experts_cpu > 0 ? 2 * copy : 0.0, loads = r.transfers - copies;
        const double experts = gpu ? std::max(r.experts_gpu + loads, r.experts_cpu)
                                   : r.experts_gpu + loads + r.experts_cpu;
        EXPECT_NEAR(r.feed_forward, router + copies + experts, 1e-12) << (gpu ? "GPU" : "host-only") << " profile";
        both = both || (r.experts_gpu > 0 && r.experts_cpu > 0);
      }
    EXPECT_TRUE(both) << "no layer had experts on both devices";
  }
}

/// The split tests' options: tiny-qwen3-moe's blocks of 8 tokens, VRAM for
/// 40 of the 2 x 88 blocks a layer needs at split_workload()'s lengths, and
/// WriteScope's write policy on the profile's rates.
ModelOptions split_options(const ModelConfig& config, const MachineProfile& profile, bool feedback) {
  ModelOptions options;
  options.pinned_kv_budget = options.host_kv_budget = std::uint64_t{1} << 20;
  options.block_tokens = 8;
  options.max_rows = 2;
  options.vram_budget = vram_for(config, options, 40);
  const RooflineModel roofline(ModelRates::from_profile(profile, config.attention().name, profile.cpu_threads));
  options.kv_policy = [roofline, feedback](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    SchedulerOptions scheduler;
    scheduler.feedback = feedback;
    return std::make_unique<WriteScopeKVPolicy>(roofline, shape, cache, scheduler);
  };
  return options;
}

/// Two sequences of 700 tokens planned to 1024, one warm-up step.
DecodeWorkload split_workload(int measured_steps) {
  DecodeWorkload workload;
  workload.batch = 2;
  workload.context = 700;
  workload.planned_tokens = 1024;
  workload.warmup_steps = 1;
  workload.measured_steps = measured_steps;
  return workload;
}

// The projection runs WriteScope's scheduler itself: its split (α, the bytes
// per region) equals what the scheduler plans inside the real model for the
// same profile and budgets (feedback off, so the profile's rates decide).
TEST(PredictTest, PredictedSplitEqualsTheSchedulersPlan) {
  const MachineProfile profile = round_profile();
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  const ModelOptions options = split_options(config, profile, false);
  const DecodeWorkload workload = split_workload(3);
  const PricedSteps priced = price_decode(config, options, profile, workload);

  MoeModel model = MoeModel::synthetic(config, 5, options);
  std::vector<int> sequences;
  for (int b = 0; b < workload.batch; ++b) {
    sequences.push_back(model.add_sequence(workload.planned_tokens));
    model.fill_context(sequences.back(), workload.context, 11 + b);
  }
  std::vector<int> tokens{1, 2};
  bool split = false;
  for (int step = 0; step < workload.warmup_steps + workload.measured_steps; ++step) {
    if (step == 0) model.end_warmup();  // as price_decode: before the first step
    model.step(sequences, tokens);
    if (step < workload.warmup_steps) continue;
    const auto& predicted = priced.layers.at(static_cast<std::size_t>(step - workload.warmup_steps));
    for (int layer = 0; layer < config.layers; ++layer) {
      const LayerRecord& measured = model.last_records()[layer];
      EXPECT_DOUBLE_EQ(predicted[layer].alpha, measured.alpha) << "step " << step << ", layer " << layer;
      for (int region = 0; region < 4; ++region)
        EXPECT_DOUBLE_EQ(predicted[layer].region_bytes[region], measured.region_bytes[region])
            << "step " << step << ", layer " << layer << ", region " << region;
      split = split || (measured.alpha > 0 && measured.alpha < 1);
    }
  }
  EXPECT_TRUE(split) << "the budgets should make the scheduler split the attention between the devices";
}

// The projection's feedback observes the times it priced, at the profile's
// own rates: it learns them back, so the split, the steps and the
// scheduler's own predictions equal those priced with feedback off. At an
// HBM rate of 1 GB/s the resident kernel (320 tokens x 128 bytes: 41 us
// with its launch) outlasts the CPU's whole band, so its time is sampled too.
TEST(PredictTest, FeedbackOnThePricedTimesLearnsTheProfilesRates) {
  for (const double hbm_gbps : {100.0, 1.0}) {
    SCOPED_TRACE("HBM " + std::to_string(hbm_gbps) + " GB/s");
    MachineProfile profile = round_profile();
    profile.hbm_gbps = hbm_gbps;
    const ModelConfig config = model_preset("tiny-qwen3-moe");
    const auto priced = [&](bool feedback) {
      return price_decode(config, split_options(config, profile, feedback), profile, split_workload(4));
    };
    const PricedSteps with = priced(true), without = priced(false);
    bool split = false;
    for (std::size_t step = 0; step < with.layers.size(); ++step) {
      EXPECT_NEAR(with.step_seconds[step], without.step_seconds[step], 1e-9 * without.step_seconds[step]);
      for (int layer = 0; layer < config.layers; ++layer) {
        const LayerRecord &learnt = with.layers[step][layer], &given = without.layers[step][layer];
        EXPECT_DOUBLE_EQ(learnt.alpha, given.alpha) << "step " << step << ", layer " << layer;
        EXPECT_NEAR(learnt.predicted_attention, given.predicted_attention, 1e-9 * given.predicted_attention)
            << "step " << step << ", layer " << layer;
        for (int region = 0; region < 4; ++region)
          EXPECT_DOUBLE_EQ(learnt.region_bytes[region], given.region_bytes[region]);
        split = split || (given.alpha > 0 && given.alpha < 1);
      }
    }
    EXPECT_TRUE(split);
  }
}

// Where the warm-up ends moves no step: it ends before the first step (after
// the profiling prompt for a policy that profiles routing, as HybriMoE's),
// so the steps priced after two warm-up steps are the third to fifth of five
// priced with none. (Ended between them, it drained what the warm-up left in
// flight; the tiny models here leave no copy in flight across steps, so this
// pins the rule, not that drain.)
TEST(PredictTest, WarmUpStepsAreStepsLikeTheOthers) {
  MachineProfile profile = round_profile();
  profile.pinned_h2d_gbps = profile.pageable_h2d_gbps = 0.01;  // slow expert copies
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(
      "name: warm-up\noutput: unused.h5\nprofile: test\nmodels: [{preset: tiny-mixtral}]\n"
      "systems: [hybrimoe, moe-lightning]\nbatch_sizes: [4]\ncontexts: [64]\nmax_sequence_tokens: 128\n"
      "budgets: {vram: 4MiB, pinned: 8MiB, host: 24MiB}\nsteps: {warmup: 2, measured: 3}\nblock_tokens: 8\n",
      "warm-up.yaml"));
  for (const RunSpec& run : expand_runs(experiment, profile)) {
    SCOPED_TRACE(run.id());
    // A fresh system each time: its expert policy keeps state.
    const auto priced = [&](DecodeWorkload workload) {
      const impl::RunSetup setup = impl::prepare_run(experiment, run, profile);
      EXPECT_EQ(setup.profiles, run.system == "hybrimoe");
      workload.profile_tokens = setup.profiles ? experiment.profile_tokens : 0;
      return price_decode(run.model->config, setup.options, profile, workload).step_seconds;
    };
    DecodeWorkload workload;
    workload.batch = run.batch;
    workload.context = run.context;
    workload.planned_tokens = experiment.max_sequence_tokens;
    workload.warmup_steps = 0;
    workload.measured_steps = 5;
    const std::vector<double> all = priced(workload);
    workload.warmup_steps = 2;
    workload.measured_steps = 3;
    EXPECT_EQ(priced(workload), std::vector<double>(all.begin() + 2, all.end()));
  }
}

// More VRAM keeps more KV off the link: the prediction of a system whose
// placement changes moves the right way (and a VRAM budget that fits all of
// it stops changing it).
TEST(PredictTest, MoreVramPredictsFasterStepsForAStreamingBaseline) {
  const MachineProfile profile = round_profile();
  const ModelConfig config = model_preset("tiny-mixtral");
  DecodeWorkload workload;
  workload.context = 2000;
  workload.planned_tokens = 2048;
  workload.measured_steps = 2;
  auto step_with = [&](std::uint64_t blocks) {
    ModelOptions options = first_fit_options(profile, 0, std::make_shared<CpuExpertPolicy>());
    options.vram_budget = vram_for(config, options, blocks);
    const PricedSteps priced = price_decode(config, options, profile, workload);
    return priced.step_seconds.back();
  };
  // A layer of the sequence needs 251 blocks of 8 tokens at the last step.
  const double small = step_with(50), larger = step_with(150), enough = step_with(251);
  EXPECT_GT(small, larger);
  EXPECT_GT(larger, enough);
  EXPECT_DOUBLE_EQ(enough, step_with(400));
}

class PredictFileTest : public ::testing::Test {
 protected:
  ExperimentConfig config() const {
    const std::string yaml = "name: projected\noutput: " + (dir_ / "measured.h5").string() +
                             "\nprofile: test\nmodels:\n  - {preset: tiny-mixtral}\n"
                             "systems: [ktransformers, writescope, gpu-only]\n"
                             "batch_sizes: [2]\ncontexts: [24, 400]\nmax_sequence_tokens: 404\n"
                             "budgets: {vram: [4MiB, 12MiB], pinned: 8MiB, host: 24MiB}\n"
                             "steps: {warmup: 1, measured: 3}\nblock_tokens: 8\n";
    return ExperimentConfig::from_config(ConfigNode::parse(yaml, "projected.yaml"));
  }
  /// config() at one context and VRAM budget: the runs a comparison test measures.
  ExperimentConfig small_config() const {
    ExperimentConfig small = config();
    small.contexts = {24};
    small.vram_budgets = {12u << 20};
    return small;
  }

  const test::ScratchDir scratch_{"predict"};
  const fs::path dir_ = scratch_.path();
};

// Profiles whose names are stored under one group name ('/' and '.' become
// '_') are one error naming both, before anything is written.
TEST_F(PredictFileTest, ProfilesStoredUnderOneNameAreRefused) {
  MachineProfile underscore = round_profile(), slash = round_profile();
  underscore.name = "a_b";
  slash.name = "a/b";
  const std::string output = (dir_ / "projected.h5").string();
  std::ostringstream progress;
  try {
    predict_experiment(config(), {underscore, slash}, output, progress);
    FAIL() << "two profiles under one name accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "predict: --profile: profiles 'a_b' and 'a/b' would be stored under one name "
                                     "('a_b': '/' and '.' become '_'); rename one");
  }
  EXPECT_FALSE(fs::exists(output));
}

TEST_F(PredictFileTest, WritesEveryRunOfEveryProfileMarkedPredicted) {
  MachineProfile other = round_profile();
  other.name = "slow-link";
  other.pinned_h2d_gbps = other.pinned_d2h_gbps = 1;
  const std::string output = (dir_ / "projected.h5").string();
  std::ostringstream progress;
  const ExperimentSummary summary =
      predict_experiment(config(), {round_profile(), other}, output, progress, "writescope predict c.yaml --profile x");
  EXPECT_GT(summary.complete, 0);
  EXPECT_EQ(summary.failed, 0);
  const ResultsReader reader(output);
  EXPECT_EQ(reader.int_attribute("/", "predicted"), 1);
  EXPECT_TRUE(reader.exists("/profiles/slow-link"));
  const std::vector<std::string> runs = reader.list("/runs");
  EXPECT_EQ(runs.size(), 2 * expand_runs(config(), round_profile()).size());
  std::map<std::string, int> per_profile;
  for (const std::string& run : runs) {
    const std::string g = "/runs/" + run;
    EXPECT_EQ(reader.int_attribute(g, "predicted"), 1);
    EXPECT_EQ(reader.string_attribute(g, "command"), "writescope predict c.yaml --profile x");  // as run's
    EXPECT_EQ(run_damage(reader, g), "");
    ++per_profile[reader.string_attribute(g, "profile")];
  }
  EXPECT_EQ(per_profile["test"], per_profile["slow-link"]);
  EXPECT_NE(progress.str().find("projected, not measured"), std::string::npos);

  // A projection that cannot be written keeps the earlier one; one that can
  // replaces it whole, as a fresh file holds it.
  const std::string both = ResultsReader(output).checksum("/runs");
  {
    const ResultsStore writer(output);
    EXPECT_THROW(predict_experiment(config(), {round_profile()}, output, progress), ResultsError);
  }
  EXPECT_EQ(ResultsReader(output).checksum("/runs"), both);
  predict_experiment(config(), {round_profile()}, output, progress);
  const std::string fresh = (dir_ / "fresh.h5").string();
  predict_experiment(config(), {round_profile()}, fresh, progress);
  EXPECT_EQ(ResultsReader(output).list("/profiles"), std::vector<std::string>{"test"});
  EXPECT_EQ(ResultsReader(output).list("/runs").size(), runs.size() / 2);
  EXPECT_EQ(fs::file_size(output), fs::file_size(fresh));
  // A projection stopped before its commit leaves an empty file, which the next one takes.
  const std::string stopped = (dir_ / "stopped.h5").string();
  { const ResultsStore empty(stopped); }
  predict_experiment(config(), {round_profile()}, stopped, progress);
  EXPECT_EQ(ResultsReader(stopped).list("/runs").size(), runs.size() / 2);
  // A projection is replaced saying so (and whose, where it is another experiment's); an empty file silently.
  EXPECT_NE(progress.str().find("predict: replacing " + output + "'s projection (" + std::to_string(runs.size()) +
                                " runs)\n"),
            std::string::npos)
      << progress.str();
  EXPECT_EQ(progress.str().find("replacing " + stopped), std::string::npos) << progress.str();
  ExperimentConfig another = config();
  another.name = "another";
  std::ostringstream replacing;
  predict_experiment(another, {round_profile()}, stopped, replacing);
  EXPECT_NE(replacing.str().find("predict: replacing " + stopped + "'s projection of experiment 'projected'"),
            std::string::npos)
      << replacing.str();
}

// A VRAM budget over the GPU's memory (gpu.memory) is the machine's limit:
// every system's run at it does not fit, saying why; the smaller budget's
// runs are priced.
TEST_F(PredictFileTest, ABudgetOverTheProfilesGpuMemoryFitsNoSystem) {
  MachineProfile small_card = round_profile();
  small_card.gpu_memory_bytes = std::uint64_t{8} << 20;
  const std::string output = (dir_ / "projected.h5").string();
  std::ostringstream progress;
  predict_experiment(config(), {small_card}, output, progress);
  const ResultsReader reader(output);
  int over = 0, priced = 0;
  for (const std::string& run : reader.list("/runs")) {
    const std::string g = "/runs/" + run;
    if (reader.int_attribute(g, "vram_budget_bytes") == std::int64_t{12} << 20) {
      ++over;
      EXPECT_EQ(reader.string_attribute(g, "status"), "does_not_fit") << run;
      EXPECT_EQ(reader.string_attribute(g, "reason"),
                "device memory: budgets.vram of 12MiB is more than the 8MiB of GPU memory of profile test (gpu.memory)")
          << run;
    } else {
      priced += reader.string_attribute(g, "status") == "complete";
    }
  }
  EXPECT_EQ(over, static_cast<int>(expand_runs(config(), small_card).size() / 2));
  EXPECT_GT(priced, 0);
}

TEST_F(PredictFileTest, NeverOverwritesMeasuredRunsAndComparesOnlyMeasuredOnes) {
  const std::string measured = (dir_ / "measured.h5").string();
  std::ostringstream progress;
  const ExperimentConfig small = small_config();
  run_experiment(small, round_profile(), progress, false);
  const std::string before = ResultsReader(measured).checksum("/runs");
  try {
    predict_experiment(small, {round_profile()}, measured, progress);
    FAIL() << "a projection overwrote measured runs";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds measured runs"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ResultsReader(measured).checksum("/runs"), before);

  const PredictionComparison comparison = compare_predictions(measured);
  EXPECT_EQ(comparison.runs, static_cast<int>(expand_runs(small, round_profile()).size()));
  EXPECT_TRUE(comparison.unpriced.empty());
  EXPECT_EQ(comparison.profile, "test");
  const std::string text = format_comparison(comparison);
  EXPECT_NE(text.find("median error "), std::string::npos) << text;
  {  // A CPU that cannot price the runs is the reason given, not "no complete runs".
    MachineProfile shapeless = round_profile();
    shapeless.cpu_attention_gbps.clear();
    shapeless.cpu_streamed_attention_gbps.clear();
    try {
      compare_predictions(measured, &shapeless);
      ADD_FAILURE() << "compared runs no profile could price";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("complete runs could be priced; the first: "), std::string::npos)
          << e.what();
    }
  }
  // A GPU profile's runs measured on a host build say what their error measures.
  EXPECT_EQ(comparison.host_only_runs, has_gpu ? 0 : comparison.runs);
  EXPECT_EQ(text.find("came from a build without a GPU") != std::string::npos, !has_gpu) << text;

  const std::string projected = (dir_ / "projected.h5").string();
  predict_experiment(small, {round_profile()}, projected, progress);
  {  // Memory as the runs held it: the pinned staging buffers only as far as they grew (none for a GPU-only run's experts).
    const ResultsReader measured_runs(measured), projected_runs(projected);
    for (const std::string& run : measured_runs.list("/runs")) {
      if (measured_runs.string_attribute("/runs/" + run, "status") != "complete") continue;
      const std::string priced = "/runs/" + group_name("test__" + run);
      for (const char* field : {"pinned_bytes", "host_bytes"})
        EXPECT_EQ(projected_runs.int_attribute(priced, field), measured_runs.int_attribute("/runs/" + run, field))
            << run << ": " << field;
    }
  }
  try {
    compare_predictions(projected);
    FAIL() << "compared predictions with predictions";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds predicted runs"), std::string::npos) << e.what();
  }
  // An HDF5 file that no experiment wrote is named as such, and no projection goes into it.
  {
    const std::string foreign = (dir_ / "foreign.h5").string();
    {
      ResultsStore store(foreign);
      auto txn = store.begin();
      txn.root().set_attribute("owner", "another program");
      txn.commit();
    }
    try {
      predict_experiment(small, {round_profile()}, foreign, progress);
      FAIL() << "a projection went into another program's file";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("foreign.h5 is not a projection's results file"), std::string::npos)
          << e.what();
    }
    const std::string empty = (dir_ / "empty.h5").string();
    ResultsStore{empty};
    try {
      compare_predictions(empty);
      FAIL() << "compared an empty file";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("empty.h5 is not an experiment's results file (no 'format' attribute)"),
                std::string::npos)
          << e.what();
    }
    // Another version of the format is refused here as run and report.py refuse it.
    const std::string newer = (dir_ / "newer.h5").string();
    fs::copy_file(measured, newer);
    {
      ResultsStore store(newer);
      auto txn = store.begin();
      txn.root().set_attribute("format", "writescope-results-9");
      txn.commit();
    }
    try {
      compare_predictions(newer);
      FAIL() << "compared a file of another format";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("newer.h5 is not an experiment's results file (format "
                                           "'writescope-results-9', not 'writescope-results-1')"),
                std::string::npos)
          << e.what();
    }
  }
  // Nor do measured runs go beside projections, or projections into a merge.
  ExperimentConfig into_projection = small;
  into_projection.output = projected;
  EXPECT_THROW(run_experiment(into_projection, round_profile(), progress, false), std::invalid_argument);
  EXPECT_THROW(merge_results((dir_ / "merged.h5").string(), {projected}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir_ / "merged.h5"));
}

// "My CPU with that GPU" prices the runs the file holds: WriteScope's own
// expert policy and its system-comparison flag stay those the runs were
// measured with, even where the other CPU would have picked another.
TEST_F(PredictFileTest, ComparesEveryMeasuredRunWithTheCpuOfAnotherProfile) {
  ExperimentConfig automatic = ExperimentConfig::from_config(ConfigNode::parse(
      "name: projected\noutput: " + (dir_ / "measured.h5").string() +
          "\nprofile: test\nmodels:\n  - {preset: tiny-mixtral}\nsystems: [ktransformers, writescope]\n"
          "batch_sizes: [2]\ncontexts: [24]\nmax_sequence_tokens: 28\nbudgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\n"
          "steps: {warmup: 1, measured: 3}\nblock_tokens: 8\noptions: {writescope_experts: auto}\n",
      "auto.yaml"));
  MachineProfile fast_cpu = round_profile();
  fast_cpu.name = "fast-cpu";
  fast_cpu.cpu_expert_gbps = 4000;
  fast_cpu.cpu_expert_gflops = 8000;
  auto ids = [&](const MachineProfile& profile) {
    std::vector<std::string> out;
    for (const RunSpec& run : expand_runs(automatic, profile))
      out.push_back(run.id() + (run.system_comparison ? " (system comparison)" : ""));
    return out;
  };
  ASSERT_NE(ids(round_profile()), ids(with_cpu_of(round_profile(), fast_cpu)))
      << "the fast CPU must change WriteScope's expert choice for this test to mean anything";
  std::ostringstream progress;
  const ExperimentSummary measured = run_experiment(automatic, round_profile(), progress, false);
  ASSERT_GT(measured.complete, 0) << progress.str();
  const PredictionComparison comparison = compare_predictions(automatic.output, &fast_cpu);
  EXPECT_EQ(comparison.runs, measured.complete) << format_comparison(comparison);
  EXPECT_TRUE(comparison.unpriced.empty()) << format_comparison(comparison);
  EXPECT_EQ(comparison.profile, "test+cpu:fast-cpu");

  // A damaged run, and one whose settings are not the experiment's, are named, not dropped.
  const std::vector<std::string> runs = ResultsReader(automatic.output).list("/runs");
  ASSERT_GE(runs.size(), 2u);
  {
    ResultsStore store(automatic.output);
    auto txn = store.begin();
    ResultsGroup group = txn.root().open_group("runs");
    ResultsGroup damaged = group.open_group(runs[0]);
    damaged.remove("step_seconds");
    damaged.write("step_seconds", std::vector<double>(3, 1e-9));
    ResultsGroup foreign = group.open_group(runs[1]);
    foreign.set_attribute("config", std::string("{}"));
    foreign.set_attribute("checksum", foreign.checksum());
    txn.commit();
  }
  const PredictionComparison after = compare_predictions(automatic.output, &fast_cpu);
  EXPECT_EQ(after.runs, measured.complete - 2);
  const std::string text = format_comparison(after);
  EXPECT_NE(text.find("not compared: " + runs[0] + ": checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("not compared: " + runs[1] + ": its settings are not a run of the file's experiment"),
            std::string::npos)
      << text;
  // Seconds that are no measurement (NaN, none at all) under a matching checksum: named, not averaged.
  auto rewritten = [&](const std::vector<double>* step_seconds) {
    ResultsStore store(automatic.output);
    auto txn = store.begin();
    ResultsGroup run = txn.root().open_group("runs").open_group(runs[0]);
    run.remove("step_seconds");
    if (step_seconds) run.write("step_seconds", *step_seconds);
    run.set_attribute("checksum", run.checksum());
    txn.commit();
    return format_comparison(compare_predictions(automatic.output, &fast_cpu));
  };
  const std::vector<double> not_a_number{0.1, std::nan(""), 0.1};
  const std::string nan_text = rewritten(&not_a_number);
  EXPECT_NE(nan_text.find("not compared: " + runs[0] +
                          ": its step_seconds (3 values) are not all positive finite seconds"),
            std::string::npos)
      << nan_text;
  EXPECT_EQ(nan_text.find("nan%"), std::string::npos) << nan_text;
  const std::string none_text = rewritten(nullptr);
  EXPECT_NE(none_text.find("not compared: " + runs[0] + ": it has no step_seconds"), std::string::npos) << none_text;
}

// Runs measured with another thread count than the profile's: its CPU rates
// do not hold for them, so they are named, not priced (with another profile's
// CPU, --cpu-from, they are priced at its count).
TEST_F(PredictFileTest, RunsOfAnotherThreadCountThanTheProfilesAreNotCompared) {
  const std::string measured = (dir_ / "measured.h5").string();
  std::ostringstream progress;
  const ExperimentConfig small = small_config();
  MachineProfile other_threads = round_profile();
  other_threads.cpu_threads = HostExecSpace().concurrency() + 5;
  run_experiment(small, other_threads, progress, false);
  try {
    compare_predictions(measured);
    FAIL() << "runs of another thread count priced with the profile's rates";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(": it ran with " + std::to_string(HostExecSpace().concurrency()) +
                                         " host threads, the profile's CPU rates are for " +
                                         std::to_string(other_threads.cpu_threads)),
              std::string::npos)
        << e.what();
  }
  MachineProfile cpu = round_profile();
  cpu.cpu_threads = HostExecSpace().concurrency() + 3;  // another machine's count, neither the run's nor the file's
  EXPECT_EQ(compare_predictions(measured, &cpu).runs, static_cast<int>(expand_runs(small, other_threads).size()));
}

// With another profile's CPU a system may choose otherwise (MoE-Lightning's
// micro-batches, here one where the CPU's launches cost a second): that run
// is named, not priced as if it were the one measured.
TEST_F(PredictFileTest, RunsWhoseChoicesAnotherCpuWouldChangeAreNotCompared) {
  const std::string measured = (dir_ / "measured.h5").string();
  std::ostringstream progress;
  const ExperimentConfig lightning = ExperimentConfig::from_config(ConfigNode::parse(
      "name: projected\noutput: " + measured + "\nprofile: test\nmodels:\n  - {preset: tiny-mixtral}\n"
      "systems: [moe-lightning]\nbatch_sizes: [2]\ncontexts: [24]\nmax_sequence_tokens: 404\n"
      "budgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\nsteps: {warmup: 1, measured: 3}\nblock_tokens: 8\n",
      "lightning.yaml"));
  // A slow CPU attention and free launches: two micro-batches overlap it with the GPU's work.
  MachineProfile slow_attention = round_profile();
  slow_attention.gpu_launch_latency_s = slow_attention.cpu_launch_latency_s = 0;
  for (auto* rates : {&slow_attention.cpu_attention_gbps, &slow_attention.cpu_streamed_attention_gbps})
    for (auto& [shape, by_threads] : *rates)
      for (auto& [threads, gbps] : by_threads) gbps = 1e-3;
  run_experiment(lightning, slow_attention, progress, false);
  const ResultsReader reader(measured);
  const std::string run = "/runs/" + reader.list("/runs").front();
  ASSERT_EQ(reader.int_attribute(run, "micro_batches"), 2);
  EXPECT_EQ(compare_predictions(measured).runs, 1);
  MachineProfile slow_launches = round_profile();
  slow_launches.cpu_launch_latency_s = 1;
  try {
    compare_predictions(measured, &slow_launches);
    FAIL() << "a run priced with micro-batches other than it ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(": it ran " + std::to_string(reader.int_attribute(run, "micro_batches")) +
                                         " micro-batches, the profile's CPU would choose 1"),
              std::string::npos)
        << e.what();
  }
}

// The comparison's figures against runs whose measured steps are set to
// known errors of the prediction: e = |predicted - measured| / measured per
// run, its median and worst over the runs and per system.
TEST_F(PredictFileTest, ComparesWithTheMedianAndWorstOfEachRunsRelativeError) {
  ExperimentConfig experiment = config();
  std::ostringstream progress;
  const ExperimentSummary measured = run_experiment(experiment, round_profile(), progress, false);
  ASSERT_GE(measured.complete, 4) << progress.str();
  const std::string projected = (dir_ / "projected.h5").string();
  predict_experiment(experiment, {round_profile()}, projected, progress);
  std::map<std::string, double> predicted_step;  // by the run's settings (its config attribute)
  {
    const ResultsReader reader(projected);
    for (const std::string& run : reader.list("/runs")) {
      const std::vector<double> steps = reader.read<double>("/runs/" + run + "/step_seconds");
      predicted_step[reader.string_attribute("/runs/" + run, "config")] =
          std::accumulate(steps.begin(), steps.end(), 0.0) / static_cast<double>(steps.size());
    }
  }
  // Errors 0.02, 0.04, ... and one of 0.9, each run's steps all equal.
  std::vector<double> errors;
  std::map<std::string, std::vector<double>> by_system;
  {
    ResultsStore store(experiment.output);
    auto txn = store.begin();
    ResultsGroup runs = txn.root().open_group("runs");
    const std::vector<std::string> names = ResultsReader(experiment.output).list("/runs");
    for (const std::string& name : names) {
      const ResultsReader reader(experiment.output);
      if (reader.string_attribute("/runs/" + name, "status") != "complete") continue;
      const double p = predicted_step.at(reader.string_attribute("/runs/" + name, "config"));
      const double e =
          errors.size() + 1 == static_cast<std::size_t>(measured.complete) ? 0.9 : 0.02 * (errors.size() + 1);
      const std::string system = reader.string_attribute("/runs/" + name, "system");
      const std::size_t steps = reader.read<double>("/runs/" + name + "/step_seconds").size();
      ResultsGroup run = runs.open_group(name);
      run.remove("step_seconds");
      run.write("step_seconds", std::vector<double>(steps, p / (1 + e)));
      run.set_attribute("checksum", run.checksum());
      errors.push_back(e);
      by_system[system == "writescope" ? "writescope[" + reader.string_attribute("/runs/" + name, "expert_policy") + "]"
                                       : system]
          .push_back(e);
    }
    txn.commit();
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const PredictionComparison comparison = compare_predictions(experiment.output);
  ASSERT_EQ(comparison.runs, static_cast<int>(errors.size())) << format_comparison(comparison);
  EXPECT_NEAR(comparison.median_step_error, median(errors), 1e-9) << format_comparison(comparison);
  EXPECT_NEAR(comparison.worst_step_error, 0.9, 1e-9);
  int systems = 0;
  for (const PredictionError& e : comparison.errors) {
    if (e.component != "step") continue;
    ++systems;
    ASSERT_TRUE(by_system.count(e.system)) << e.system;
    EXPECT_EQ(e.runs, static_cast<int>(by_system[e.system].size())) << e.system;
    EXPECT_NEAR(e.median, median(by_system[e.system]), 1e-9) << e.system;
    EXPECT_NEAR(e.worst, *std::max_element(by_system[e.system].begin(), by_system[e.system].end()), 1e-9) << e.system;
  }
  EXPECT_EQ(systems, static_cast<int>(by_system.size()));
}

TEST(PredictProfileTest, CpuFromAnotherProfileKeepsTheGpuAndSaysWhere) {
  MachineProfile gpu = round_profile();
  gpu.name = "a-gpu";
  gpu.sources["gpu"] = "published: a datasheet";
  MachineProfile cpu = test::tiny_profile();
  cpu.name = "my-host";
  cpu.cpu_threads = 7;
  cpu.cpu_expert_gbps = 33;
  cpu.cpu_decode_path = {{"mixtral-8x7b", "avx512_fma"}};
  cpu.cpu_streamed_decode_path = {{"mixtral-8x7b", "avx512_bf16"}};
  cpu.cpu_streamed_attention_gbps["mixtral-8x7b"] = {{7, 4.5}};
  // Every CPU field its own value, none the GPU profile's.
  cpu.cpu_attention_gbps["mixtral-8x7b"] = {{7, 3.5}};
  cpu.cpu_dram_read_gbps = 33.5;
  cpu.cpu_path = "scalar";
  cpu.cpu_next_pass_prefetch = {{"mixtral-8x7b", "l2"}};
  cpu.cpu_token_major_pass = {{"mixtral-8x7b", "64"}};
  cpu.cpu_head_major_pass = {{"mixtral-8x7b", "32"}};
  cpu.cpu_fma_glanes = 55;
  cpu.cpu_launch_latency_s = 9e-6;
  cpu.cpu_expert_gflops = 77;
  for (const auto& [field, same] :
       {std::pair{"cpu_attention_gbps", gpu.cpu_attention_gbps == cpu.cpu_attention_gbps},
        {"cpu_dram_read_gbps", gpu.cpu_dram_read_gbps == cpu.cpu_dram_read_gbps},
        {"cpu_path", gpu.cpu_path == cpu.cpu_path},
        {"cpu_next_pass_prefetch", gpu.cpu_next_pass_prefetch == cpu.cpu_next_pass_prefetch},
        {"cpu_token_major_pass", gpu.cpu_token_major_pass == cpu.cpu_token_major_pass},
        {"cpu_head_major_pass", gpu.cpu_head_major_pass == cpu.cpu_head_major_pass},
        {"cpu_fma_glanes", gpu.cpu_fma_glanes == cpu.cpu_fma_glanes},
        {"cpu_launch_latency_s", gpu.cpu_launch_latency_s == cpu.cpu_launch_latency_s},
        {"cpu_expert_gflops", gpu.cpu_expert_gflops == cpu.cpu_expert_gflops}})
    ASSERT_FALSE(same) << field << " is the GPU profile's already";
  cpu.sources["cpu"] = "measured by writescope calibrate on my-host";
  const MachineProfile mixed = with_cpu_of(gpu, cpu);
  EXPECT_EQ(mixed.cpu_attention_gbps, cpu.cpu_attention_gbps);
  EXPECT_EQ(ModelRates::from_profile(mixed, "mixtral-8x7b", 7).cpu_attention_gbps, 3.5);
  EXPECT_EQ(mixed.cpu_dram_read_gbps, 33.5);
  EXPECT_EQ(mixed.cpu_path, "scalar");
  EXPECT_EQ(mixed.cpu_next_pass_prefetch, cpu.cpu_next_pass_prefetch);
  EXPECT_EQ(mixed.cpu_token_major_pass, cpu.cpu_token_major_pass);
  EXPECT_EQ(mixed.cpu_head_major_pass, cpu.cpu_head_major_pass);
  EXPECT_EQ(mixed.cpu_fma_glanes, 55);
  EXPECT_EQ(mixed.cpu_launch_latency_s, 9e-6);
  EXPECT_EQ(mixed.cpu_expert_gflops, 77);
  EXPECT_EQ(mixed.name, "a-gpu+cpu:my-host");
  EXPECT_EQ(mixed.hbm_gbps, gpu.hbm_gbps);
  EXPECT_EQ(mixed.cpu_threads, 7);
  EXPECT_EQ(mixed.cpu_expert_gbps, 33);
  EXPECT_EQ(mixed.cpu_decode_path, cpu.cpu_decode_path);
  EXPECT_EQ(mixed.cpu_streamed_decode_path, cpu.cpu_streamed_decode_path);
  EXPECT_EQ(mixed.cpu_streamed_attention("mixtral-8x7b", 7), 4.5);
  EXPECT_EQ(mixed.source_of("gpu"), "published: a datasheet");
  EXPECT_NE(mixed.source_of("cpu").find("my-host"), std::string::npos);
  // The sources survive the profile's YAML.
  const MachineProfile read = MachineProfile::from_config(ConfigNode::parse(mixed.to_yaml(), "mixed.yaml"));
  EXPECT_EQ(read.source_of("cpu"), mixed.source_of("cpu"));
  EXPECT_EQ(read.source_of("link"), "not stated");
}

}  // namespace
}  // namespace writescope
