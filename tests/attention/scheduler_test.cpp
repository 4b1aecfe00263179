#include "attention/scheduler.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "attention/kv_policy.hpp"
#include "kv_test_data.hpp"
#include "synthetic_rates.hpp"

namespace writescope {
namespace {

constexpr int block_tokens = 16;

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest()
      : shape_(mixtral_8x7b_attention()),
        geometry_(shape_.block_geometry(block_tokens)),
        block_bytes_(static_cast<std::uint64_t>(geometry_.block_elements()) * sizeof(bf16)) {}

  std::unique_ptr<InplaceKVCache<bf16>> make_cache(int vram_blocks, int layers = 1) {
    return std::make_unique<InplaceKVCache<bf16>>(
        KVCacheShape{layers, geometry_},
        KVCacheBudgets{vram_blocks * block_bytes_, 256 * block_bytes_, 256 * block_bytes_}, BudgetPolicy::strict);
  }

  /// Appends `tokens` tokens of arbitrary content where the scheduler says.
  void write(InplaceKVCache<bf16>& cache, WriteScopeScheduler<bf16>& scheduler, int layer, int sequence,
             std::int64_t tokens, std::int64_t expected, bool decode) {
    const auto regions = scheduler.place(layer, sequence, tokens, expected, decode);
    const auto data = test::random_values<bf16>(tokens * geometry_.kv_heads * geometry_.key_dim, 3);
    const auto view = test::token_view<bf16, HostMemSpace>(data, geometry_.kv_heads, geometry_.key_dim, 0, tokens);
    cache.append(HostExecSpace(), layer, sequence, view, view, regions);
  }

  /// Bytes of the fixture's KV that `segments` cover.
  double covered_bytes(const std::vector<BlockSegment>& segments) const {
    double tokens = 0;
    for (const BlockSegment& s : segments) tokens += s.token_count;
    return tokens * static_cast<double>(block_bytes_) / block_tokens;
  }

  std::int64_t count(const InplaceKVCache<bf16>& cache, int layer, int sequence, Region region) {
    const auto regions = cache.block_regions(layer, sequence);
    return std::count(regions.begin(), regions.end(), region);
  }

  /// The sequence's CPU-affine blocks: CpuResident's and the band's CpuStreamed.
  std::int64_t cpu_affine(const InplaceKVCache<bf16>& cache, int layer, int sequence) {
    return count(cache, layer, sequence, Region::cpu_resident) + count(cache, layer, sequence, Region::cpu_streamed);
  }

  AttentionShape shape_;
  BlockGeometry geometry_;
  std::uint64_t block_bytes_;
};

// Rates the scheduler would divide by are refused by name, not by the
// feedback estimator that starts from them.
TEST_F(SchedulerTest, RatesItCannotUseAreNamed) {
  auto cache = make_cache(4);
  const auto error_of = [&](const ModelRates& rates) -> std::string {
    try {
      WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(error_of(test::synthetic_rates(25, 0)),
            "scheduler: the CPU attention rates (CpuResident's and the band's) must be positive");
  EXPECT_EQ(error_of(test::synthetic_rates(0, 100)),
            "scheduler: a GPU machine's HBM and link rates must be positive, got 3000 and 0 GB/s");
  ModelRates host_only = test::synthetic_rates(0, 100);  // no GPU: no link, no HBM
  host_only.has_gpu = false;
  host_only.hbm_gbps = 0;
  EXPECT_EQ(error_of(host_only), "accepted");
}

TEST_F(SchedulerTest, PrefillFillsVramThenSplitsTheSpillByTheModel) {
  auto cache = make_cache(/*vram_blocks=*/20, /*layers=*/2);
  // Link 25 GB/s, CPU 100 GB/s: the CPU should own 80 % of the spilled blocks;
  // at half its rate (the headroom) 2/3 of them, which go to CpuResident.
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(25, 100)), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 130 * block_tokens, 130 * block_tokens, false);
  EXPECT_EQ(count(*cache, 0, seq, Region::gpu_resident), 10);  // half of the VRAM pool: two layers share it
  const double spilled = 120;
  EXPECT_NEAR(count(*cache, 0, seq, Region::cpu_resident) / spilled, 2.0 / 3.0, 0.02);
  EXPECT_NEAR(cpu_affine(*cache, 0, seq) / spilled, 0.8, 0.02);
  EXPECT_NEAR(count(*cache, 0, seq, Region::gpu_streamed) / spilled, 0.2, 0.02);
  // Layer 1 gets its own half of the VRAM pool.
  write(*cache, scheduler, 1, seq, 30 * block_tokens, 30 * block_tokens, false);
  EXPECT_EQ(count(*cache, 1, seq, Region::gpu_resident), 10);
}

// The blocks fixed in CpuResident are read head-major, the rest of the CPU's
// share token-major: a faster band kernel widens the CPU's share, not what
// prefill fixes on the host.
TEST_F(SchedulerTest, PrefillFixesOnTheHostWhatItsHeadMajorRateCanRead) {
  auto cache = make_cache(/*vram_blocks=*/0);
  ModelRates rates = test::synthetic_rates(25, 100);
  rates.cpu_streamed_attention_gbps = 400;
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 170 * block_tokens, 170 * block_tokens, false);
  const double spilled = 170;
  // Half of 100 GB/s against the link's 25: 2/3 fixed on the host; 400 against 25 for the CPU's share.
  EXPECT_NEAR(count(*cache, 0, seq, Region::cpu_resident) / spilled, 2.0 / 3.0, 0.02);
  EXPECT_NEAR(cpu_affine(*cache, 0, seq) / spilled, 400.0 / 425.0, 0.02);
}

// An append the cache cannot hold gives its placement back: the VRAM share it
// was given returns to the policy, and the retry after freeing gets it again.
TEST_F(SchedulerTest, AFailedAppendGivesItsPlacementBack) {
  InplaceKVCache<bf16> cache(KVCacheShape{1, geometry_}, KVCacheBudgets{2 * block_bytes_, block_bytes_, 0},
                             BudgetPolicy::strict);
  const ModelRates rates = test::synthetic_rates(50, 50);
  std::vector<std::unique_ptr<KVPolicy>> policies;
  policies.push_back(std::make_unique<FirstFitKVPolicy>(RooflineModel(rates), shape_, cache, Region::gpu_streamed));
  policies.push_back(std::make_unique<WriteScopeKVPolicy>(RooflineModel(rates), shape_, cache));
  for (const auto& policy : policies) {
    const int seq = cache.add_sequence();
    const auto append = [&](std::int64_t tokens) {
      const auto data = test::random_values<bf16>(tokens * geometry_.kv_heads * geometry_.key_dim, 3);
      const auto view = test::token_view<bf16, HostMemSpace>(data, geometry_.kv_heads, geometry_.key_dim, 0, tokens);
      policy->place_and_write(0, seq, tokens, tokens, false, [&](const std::vector<Region>& regions) {
        cache.append(HostExecSpace(), 0, seq, view, view, regions);
      });
    };
    // Four blocks: two in VRAM, two spilled where the one pinned block cannot hold them.
    EXPECT_THROW(append(4 * block_tokens), KVBudgetError);
    EXPECT_EQ(cache.length(0, seq), 0);
    append(2 * block_tokens);
    EXPECT_EQ(cache.block_regions(0, seq), (std::vector<Region>{Region::gpu_resident, Region::gpu_resident}));
    policy->released(0, cache.block_regions(0, seq));
    cache.free_sequence(seq);
  }
}

TEST_F(SchedulerTest, DecodeAppendsKeepTheCumulativeSplitAndStayInTheBand) {
  auto cache = make_cache(0);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(50, 50)), shape_, *cache);
  const int seq = cache->add_sequence();
  for (int t = 0; t < 64 * block_tokens; ++t) write(*cache, scheduler, 0, seq, 1, 64 * block_tokens, true);
  EXPECT_EQ(count(*cache, 0, seq, Region::cpu_resident), 0);  // decode never fixes blocks on the CPU
  EXPECT_NEAR(count(*cache, 0, seq, Region::cpu_streamed) / 64.0, 0.5, 0.03);
}

TEST_F(SchedulerTest, PlanSplitsTheBandAndCoversEveryBlockOnce) {
  auto cache = make_cache(4);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(25, 100)), shape_, *cache);
  const int a = cache->add_sequence(), b = cache->add_sequence();
  write(*cache, scheduler, 0, a, 40 * block_tokens + 5, 40 * block_tokens + 5, false);
  write(*cache, scheduler, 0, b, 17 * block_tokens, 17 * block_tokens, false);
  const std::vector<TokenRange> ranges{{0, 40 * block_tokens + 5}, {0, 17 * block_tokens}};
  SplitPrediction prediction;
  const SplitPlan plan = scheduler.plan(0, {a, b}, ranges, &prediction);
  std::int64_t tokens = 0;
  for (const auto* list : {&plan.gpu_resident, &plan.gpu_streamed, &plan.cpu_resident, &plan.cpu_pinned}) {
    EXPECT_TRUE(std::is_sorted(list->begin(), list->end(), [](const BlockSegment& x, const BlockSegment& y) {
      return x.batch_index < y.batch_index;
    }));
    for (const auto& s : *list) tokens += s.token_count;
  }
  EXPECT_EQ(tokens, 57 * block_tokens + 5);
  // Every block of each pool exactly once: the band's two regions share the pinned pool.
  using Key = std::tuple<int, int, int, int, std::int64_t>;
  const auto keys = [](std::initializer_list<const std::vector<BlockSegment>*> lists) {
    std::multiset<Key> out;
    for (const auto* list : lists)
      for (const BlockSegment& s : *list) out.insert({s.batch_index, s.slot, s.token_begin, s.token_count, s.position});
    return out;
  };
  const auto in_cache = [&](Region region) { return cache->segments(0, region, {a, b}, ranges); };
  const auto vram = in_cache(Region::gpu_resident), host = in_cache(Region::cpu_resident),
             cpu_band = in_cache(Region::cpu_streamed), gpu_band = in_cache(Region::gpu_streamed);
  EXPECT_EQ(keys({&plan.gpu_resident}), keys({&vram}));
  EXPECT_EQ(keys({&plan.cpu_resident}), keys({&host}));
  EXPECT_EQ(keys({&plan.gpu_streamed, &plan.cpu_pinned}), keys({&cpu_band, &gpu_band}));
  // The band goes mostly to the CPU (80 % of all KV on the CPU at the optimum).
  EXPECT_NEAR(prediction.alpha, 0.8 * (1 - 4.0 / 58), 0.05);
  EXPECT_LT(std::abs(prediction.gpu_seconds - prediction.cpu_seconds), 0.1 * prediction.step_seconds);
}

/// Pinned-pool slots of `segments` (the band's blocks are told apart by slot).
// Decode appends one block at a time: after k spilled blocks the CPU-affine
// ones are the CPU's share of k rounded to the nearest block, every time.
TEST_F(SchedulerTest, EachSpilledBlockKeepsTheCpusShareRoundedToTheNearestBlock) {
  auto cache = make_cache(/*vram_blocks=*/0);
  const ModelRates rates = test::synthetic_rates(25, 100);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  const int blocks = 40;
  const double share = RooflineModel(rates)
                           .best_split(StepBytes{0, 0, blocks * static_cast<double>(block_bytes_)},
                                       shape_.fmas_per_byte(sizeof(bf16)), 0)
                           .cpu_movable_bytes /
                       (blocks * static_cast<double>(block_bytes_));
  ASSERT_NEAR(share, 0.8, 0.01);
  const int seq = cache->add_sequence();
  for (int k = 1; k <= blocks; ++k) {
    write(*cache, scheduler, 0, seq, block_tokens, blocks * block_tokens, /*decode=*/true);
    EXPECT_EQ(count(*cache, 0, seq, Region::cpu_streamed), static_cast<std::int64_t>(std::floor(share * k + 0.5)))
        << "after " << k << " blocks";
  }
}

// The fixed share is priced at the headroom's fraction of the CPU's compute
// limit too, not only of its bandwidth: a CPU limited by its FMAs to 100 GB/s
// (of 1000 of bandwidth) against a 25 GB/s link fixes 2/3 of the spill on
// the host (50 against 25), and takes 0.8 of it in all.
TEST_F(SchedulerTest, TheFixedShareHasHeadroomOnTheCpusComputeLimit) {
  auto cache = make_cache(/*vram_blocks=*/0);
  ModelRates rates = test::synthetic_rates(25, 1000);
  rates.cpu_fma_glanes = 100 * shape_.fmas_per_byte(sizeof(bf16));
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 120 * block_tokens, 120 * block_tokens, false);
  const double spilled = 120;
  EXPECT_NEAR(count(*cache, 0, seq, Region::cpu_resident) / spilled, 2.0 / 3.0, 0.02);
  EXPECT_NEAR(cpu_affine(*cache, 0, seq) / spilled, 0.8, 0.02);
}

// A full host pool sends the rest of prefill's fixed share to the band: the
// append fits, and the CPU keeps its whole share there.
TEST_F(SchedulerTest, AFullHostPoolSendsTheFixedShareToTheBand) {
  InplaceKVCache<bf16> cache(KVCacheShape{1, geometry_}, KVCacheBudgets{0, 256 * block_bytes_, 10 * block_bytes_},
                             BudgetPolicy::strict);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(25, 100)), shape_, cache);
  const int seq = cache.add_sequence();
  ASSERT_NO_THROW(write(cache, scheduler, 0, seq, 130 * block_tokens, 130 * block_tokens, false));
  EXPECT_EQ(count(cache, 0, seq, Region::cpu_resident), 10);
  EXPECT_NEAR(cpu_affine(cache, 0, seq) / 130.0, 0.8, 0.02);
}

// The spill's split counts the VRAM blocks the sequence will have: read at
// 25 GB/s, as slow as the link, 20 resident blocks of 50 leave the CPU more
// than half of the other 30; a second sequence, the VRAM share taken, none.
TEST_F(SchedulerTest, TheSpillsSplitCountsTheSequencesVramBlocks) {
  auto cache = make_cache(/*vram_blocks=*/20);
  ModelRates rates = test::synthetic_rates(25, 25);
  rates.hbm_gbps = 25;
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  const double block = static_cast<double>(block_bytes_);
  const auto share = [&](double resident_blocks, double movable_blocks) {
    return RooflineModel(rates)
               .best_split(StepBytes{resident_blocks * block, 0, movable_blocks * block},
                           shape_.fmas_per_byte(sizeof(bf16)), 0)
               .cpu_movable_bytes /
           (movable_blocks * block);
  };
  ASSERT_GT(share(20, 30), share(0, 50) + 0.2);  // the two readings differ
  const int a = cache->add_sequence();
  write(*cache, scheduler, 0, a, 50 * block_tokens, 50 * block_tokens, false);
  EXPECT_EQ(count(*cache, 0, a, Region::gpu_resident), 20);
  EXPECT_NEAR(static_cast<double>(cpu_affine(*cache, 0, a)), share(20, 30) * 30, 1.0);
  const int b = cache->add_sequence();
  write(*cache, scheduler, 0, b, 30 * block_tokens, 30 * block_tokens, false);
  EXPECT_EQ(count(*cache, 0, b, Region::gpu_resident), 0);
  EXPECT_NEAR(static_cast<double>(cpu_affine(*cache, 0, b)), share(0, 30) * 30, 1.0);
}

std::set<int> slots_of(const std::vector<BlockSegment>& segments) {
  std::set<int> slots;
  for (const BlockSegment& s : segments) slots.insert(s.slot);
  return slots;
}

TEST_F(SchedulerTest, TheCpuTakesItsOwnBandBlocksFirstAndTheGpuStreamsItsOwnFirst) {
  auto cache = make_cache(0);
  const int seq = cache->add_sequence();
  // 10 CpuStreamed blocks, then 10 GpuStreamed ones.
  std::vector<Region> regions(10, Region::cpu_streamed);
  regions.insert(regions.end(), 10, Region::gpu_streamed);
  const auto data = test::random_values<bf16>(20 * block_tokens * geometry_.kv_heads * geometry_.key_dim, 5);
  const auto view = test::token_view<bf16, HostMemSpace>(data, geometry_.kv_heads, geometry_.key_dim, 0, 20 * block_tokens);
  cache->append(HostExecSpace(), 0, seq, view, view, regions);
  const std::vector<TokenRange> range{{0, 20 * block_tokens}};
  const std::set<int> cpu_streamed = slots_of(cache->segments(0, Region::cpu_streamed, {seq}, range)),
                      gpu_streamed = slots_of(cache->segments(0, Region::gpu_streamed, {seq}, range));
  ASSERT_EQ(cpu_streamed.size(), 10u);
  // CPU at a third of the link's rate: a quarter of the band, all of it CpuStreamed.
  {
    WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(75, 25)), shape_, *cache);
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    const std::set<int> cpu = slots_of(plan.cpu_pinned);
    EXPECT_EQ(cpu.size(), 5u);
    EXPECT_TRUE(std::includes(cpu_streamed.begin(), cpu_streamed.end(), cpu.begin(), cpu.end()));
  }
  // CPU three times the link's rate: three quarters, including every CpuStreamed block.
  {
    WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(25, 75)), shape_, *cache);
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    const std::set<int> gpu = slots_of(plan.gpu_streamed);
    EXPECT_EQ(gpu.size(), 5u);
    EXPECT_TRUE(std::includes(gpu_streamed.begin(), gpu_streamed.end(), gpu.begin(), gpu.end()));
  }
}

// The band is cut between the devices at the block nearest the CPU's
// target: 1.6 blocks of 3 are 2, 1.4 are 1 (not always the floor, which
// halves a small band's CPU share, nor the ceiling).
TEST_F(SchedulerTest, TheBandIsCutAtTheBlockNearestTheCpusTarget) {
  auto cache = make_cache(0);
  const int seq = cache->add_sequence();
  const std::vector<Region> regions(3, Region::cpu_streamed);
  const auto data = test::random_values<bf16>(3 * block_tokens * geometry_.kv_heads * geometry_.key_dim, 5);
  const auto view = test::token_view<bf16, HostMemSpace>(data, geometry_.kv_heads, geometry_.key_dim, 0, 3 * block_tokens);
  cache->append(HostExecSpace(), 0, seq, view, view, regions);
  const std::vector<TokenRange> range{{0, 3 * block_tokens}};
  for (const auto& [link, cpu, nearest] : {std::tuple<double, double, std::size_t>{7, 8, 2}, {8, 7, 1}}) {
    const ModelRates rates = test::synthetic_rates(link, cpu);
    const double target = RooflineModel(rates)
                              .best_split(StepBytes{0, 0, 3 * static_cast<double>(block_bytes_)},
                                          shape_.fmas_per_byte(sizeof(bf16)), 0)
                              .cpu_movable_bytes /
                          static_cast<double>(block_bytes_);
    WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    EXPECT_EQ(plan.cpu_pinned.size(), nearest) << "link " << link << ", CPU " << cpu << ": target " << target;
    EXPECT_EQ(static_cast<double>(nearest), std::round(target)) << target;
    EXPECT_EQ(plan.cpu_pinned.size() + plan.gpu_streamed.size(), 3u);
  }
}

// The band's blocks alternate between its two regions in consecutive slots:
// each device's share goes in slot order, so that the GPU's share is one
// copy per run of consecutive slots (StreamedDecode) and the CPU reads its
// share in address order, not the CPU's blocks first.
TEST_F(SchedulerTest, EachDeviceTakesItsShareOfTheBandInSlotOrder) {
  auto cache = make_cache(0);
  const int seq = cache->add_sequence();
  std::vector<Region> regions;
  for (int b = 0; b < 20; ++b) regions.push_back(b % 2 ? Region::gpu_streamed : Region::cpu_streamed);
  const auto data = test::random_values<bf16>(20 * block_tokens * geometry_.kv_heads * geometry_.key_dim, 5);
  const auto view = test::token_view<bf16, HostMemSpace>(data, geometry_.kv_heads, geometry_.key_dim, 0, 20 * block_tokens);
  cache->append(HostExecSpace(), 0, seq, view, view, regions);
  const std::vector<TokenRange> range{{0, 20 * block_tokens}};
  const auto slot_order = [](const BlockSegment& x, const BlockSegment& y) { return x.slot < y.slot; };
  for (double cpu_gbps : {5.0, 25.0, 75.0}) {
    WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(75, cpu_gbps)), shape_, *cache);
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    SCOPED_TRACE("CPU at " + std::to_string(cpu_gbps) + " GB/s: " + std::to_string(plan.gpu_streamed.size()) +
                 " blocks on the GPU, " + std::to_string(plan.cpu_pinned.size()) + " on the CPU");
    ASSERT_GT(plan.gpu_streamed.size(), 1u);
    EXPECT_TRUE(std::is_sorted(plan.gpu_streamed.begin(), plan.gpu_streamed.end(), slot_order));
    EXPECT_TRUE(std::is_sorted(plan.cpu_pinned.begin(), plan.cpu_pinned.end(), slot_order));
  }
}

TEST_F(SchedulerTest, FeedbackFollowsACpuSlowdownAndItsEnd) {
  auto cache = make_cache(0);
  const ModelRates believed = test::synthetic_rates(50, 50);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(believed), shape_, *cache, SchedulerOptions{0.5});
  const int seq = cache->add_sequence();
  for (int t = 0; t < 256 * block_tokens; t += block_tokens)
    write(*cache, scheduler, 0, seq, block_tokens, 256 * block_tokens, true);
  const std::vector<TokenRange> range{{0, 256 * block_tokens}};

  // The true machine: link 50 GB/s; the CPU runs at 50 GB/s, drops to 20 GB/s
  // (expert work or another process) for steps 30..69, then recovers.
  auto true_cpu = [](int step) { return step >= 30 && step < 70 ? 20.0 : 50.0; };
  auto optimum = [&](int step) { return true_cpu(step) / (true_cpu(step) + 50.0); };
  constexpr int settle_steps = 4;  // confirmations (3) + one step to replan
  for (int step = 0; step < 100; ++step) {
    SplitPrediction predicted;
    const SplitPlan plan = scheduler.plan(0, {seq}, range, &predicted);
    const StepBytes bytes = scheduler.bytes_of(plan);
    double cpu_bytes = 0;
    for (const auto& s : plan.cpu_pinned) cpu_bytes += s.token_count;
    cpu_bytes *= static_cast<double>(cache->block_bytes()) / block_tokens;
    SplitTimings measured;
    // 3 % noise, and one wild sample that the estimator must ignore.
    const double noise = 1.0 + 0.03 * ((step * 7919) % 11 - 5) / 5.0;
    measured.cpu_seconds = cpu_bytes / (true_cpu(step) * 1e9) * noise * (step == 15 ? 8.0 : 1.0);
    measured.gpu_seconds = (bytes.movable - cpu_bytes) / 50e9;
    measured.streamed_seconds = measured.gpu_seconds;  // the GPU only streams here
    measured.step_seconds = std::max(measured.cpu_seconds, measured.gpu_seconds);
    // Every step but the few right after a change must be at the optimum:
    // the single wild sample at step 15 must not move the plan at all.
    const bool settled = !(step >= 30 && step < 30 + settle_steps) && !(step >= 70 && step < 70 + settle_steps);
    if (settled) {
      EXPECT_NEAR(predicted.alpha, optimum(step), 0.03) << "step " << step;
    }
    scheduler.observe(plan, measured);
  }
}

// A step times CpuResident's head-major kernel and the band's token-major one
// together: feedback learns the CPU's speed against the profile and scales
// both rates by it, so that each stays priced at its own kernel's rate.
TEST_F(SchedulerTest, FeedbackScalesBothCpuRatesByTheMeasuredSpeed) {
  auto cache = make_cache(/*vram_blocks=*/0);
  ModelRates rates = test::synthetic_rates(25, 100);
  rates.cpu_streamed_attention_gbps = 50;
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 128 * block_tokens, 128 * block_tokens, false);
  ASSERT_GT(count(*cache, 0, seq, Region::cpu_resident), 0);
  const std::vector<TokenRange> range{{0, 128 * block_tokens}};
  const double bytes_per_token = static_cast<double>(block_bytes_) / block_tokens;
  // The machine's CPU runs both kernels at 0.6 of the profile's rates.
  const auto cpu_seconds = [&](const SplitPlan& plan) {
    double band = 0;
    for (const BlockSegment& s : plan.cpu_pinned) band += s.token_count * bytes_per_token;
    return scheduler.bytes_of(plan).cpu_resident / 60e9 + band / 30e9;
  };
  for (int step = 0; step < 6; ++step) {
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    ASSERT_FALSE(plan.cpu_pinned.empty());
    SplitTimings measured;
    measured.cpu_seconds = cpu_seconds(plan);
    double streamed = 0;
    for (const BlockSegment& s : plan.gpu_streamed) streamed += s.token_count * bytes_per_token;
    measured.streamed_seconds = measured.gpu_seconds = streamed / 25e9;
    scheduler.observe(plan, measured);
  }
  EXPECT_NEAR(scheduler.model().rates().link_gbps, 25, 1e-6);
  EXPECT_NEAR(scheduler.model().rates().cpu_attention_gbps, 60, 1e-6);
  EXPECT_NEAR(scheduler.model().rates().cpu_streamed_attention_gbps, 30, 1e-6);
  SplitPrediction predicted;
  const SplitPlan plan = scheduler.plan(0, {seq}, range, &predicted);
  EXPECT_NEAR(predicted.cpu_seconds, cpu_seconds(plan), 1e-12);
}

// A resident kernel slower than the profile says is learnt as such and not
// charged to the link: each rate comes from its own timing.
TEST_F(SchedulerTest, FeedbackKeepsTheCpuComputeLimitUntilTheCpuIsTimed) {
  auto cache = make_cache(/*vram_blocks=*/64);
  ModelRates rates = test::synthetic_rates(50, 50);
  rates.cpu_fma_glanes = 7;
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  SplitTimings gpu_only;
  gpu_only.gpu_seconds = gpu_only.resident_seconds = 1e-3;
  SplitPlan all_in_vram;
  all_in_vram.gpu_resident.push_back(BlockSegment{0, 0, 0, block_tokens, 0});
  scheduler.observe(all_in_vram, gpu_only);  // no CPU share: nothing measured of the CPU
  EXPECT_EQ(scheduler.model().rates().cpu_fma_glanes, 7);
  SplitPlan on_cpu;
  on_cpu.cpu_resident.push_back(BlockSegment{0, 0, 0, block_tokens, 0});
  SplitTimings cpu_timed;
  cpu_timed.cpu_seconds = 1e-3;
  scheduler.observe(on_cpu, cpu_timed);
  EXPECT_EQ(scheduler.model().rates().cpu_fma_glanes, 0);  // the measured rate includes the limit
}

// A share so small that its time is mostly the fixed latency teaches nothing:
// 0.1 us above a 20 us latency would read as 655 GB/s for one block.
TEST_F(SchedulerTest, FeedbackIgnoresTimesThatAreMostlyLatency) {
  auto cache = make_cache(/*vram_blocks=*/0);
  ModelRates rates = test::synthetic_rates(50, 50);
  rates.cpu_latency_s = 20e-6;
  WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
  SplitPlan one_block;
  one_block.cpu_resident.push_back(BlockSegment{0, 0, 0, block_tokens, 0});
  SplitTimings barely;
  barely.cpu_seconds = 20.1e-6;
  for (int step = 0; step < 5; ++step) scheduler.observe(one_block, barely);
  EXPECT_EQ(scheduler.model().rates().cpu_attention_gbps, 50);
  // A share whose work outweighs the latency is a sample: 40 GB/s moves the estimate by its weight (0.3).
  SplitPlan many_blocks;
  many_blocks.cpu_resident.push_back(BlockSegment{0, 0, 0, 64 * block_tokens, 0});
  SplitTimings timed;
  timed.cpu_seconds = 20e-6 + 64.0 * static_cast<double>(block_bytes_) / 40e9;
  scheduler.observe(many_blocks, timed);
  EXPECT_NEAR(scheduler.model().rates().cpu_attention_gbps, 47, 1e-6);
}

// Contention that drives the link's estimate so low that the GPU gets none of
// the band must not keep it out for good: untimed, the link's rate drifts back
// towards the profile's until the GPU gets a share and is timed again.
TEST_F(SchedulerTest, AStarvedDeviceIsTimedAgain) {
  auto cache = make_cache(/*vram_blocks=*/0);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(50, 50)), shape_, *cache);
  const int seq = cache->add_sequence();
  for (int t = 0; t < 256 * block_tokens; t += block_tokens)
    write(*cache, scheduler, 0, seq, block_tokens, 256 * block_tokens, true);
  const std::vector<TokenRange> range{{0, 256 * block_tokens}};
  auto tokens_of = [](const std::vector<BlockSegment>& segments) {
    double tokens = 0;
    for (const BlockSegment& s : segments) tokens += s.token_count;
    return tokens;
  };
  const double bytes_per_token = static_cast<double>(block_bytes_) / block_tokens;
  // One layer's step on a CPU of `cpu_gbps` and a link of `link_gbps`.
  auto step = [&](double cpu_gbps, double link_gbps) {
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    SplitTimings measured;
    measured.cpu_seconds = tokens_of(plan.cpu_pinned) * bytes_per_token / (cpu_gbps * 1e9);
    measured.streamed_seconds = measured.gpu_seconds =
        tokens_of(plan.gpu_streamed) * bytes_per_token / (link_gbps * 1e9);
    scheduler.observe(plan, measured);
    return plan;
  };
  for (int i = 0; i < 3; ++i) step(50, 0.01);  // three confirmations of a link at 0.01 GB/s
  ASSERT_LT(scheduler.model().rates().link_gbps, 0.1);
  EXPECT_TRUE(step(50, 50).gpu_streamed.empty()) << "the GPU gets none of the band";
  for (int i = 0; i < 200; ++i) step(50, 50);
  EXPECT_NEAR(scheduler.model().rates().link_gbps, 50, 2.5);
  EXPECT_FALSE(step(50, 50).gpu_streamed.empty());
  // The same for the CPU, whose band share is all it has here (no CpuResident blocks).
  for (int i = 0; i < 3; ++i) step(0.01, 50);
  ASSERT_LT(scheduler.model().rates().cpu_attention_gbps, 0.1);
  EXPECT_TRUE(step(50, 50).cpu_pinned.empty()) << "the CPU gets none of the band";
  for (int i = 0; i < 200; ++i) step(50, 50);
  EXPECT_NEAR(scheduler.model().rates().cpu_attention_gbps, 50, 2.5);
  EXPECT_FALSE(step(50, 50).cpu_pinned.empty());
}

// A low CPU estimate can leave the CPU a few blocks whose time is mostly its
// launch latency, too short to be a sample: the estimate still drifts back,
// or the CPU kept those blocks for good (the relaxation ran only where its
// share was empty). Slow spells at several rates, so that one of them leaves
// such a share on this shape.
TEST_F(SchedulerTest, ACpuShareTooShortToTimeStillDriftsBack) {
  auto cache = make_cache(/*vram_blocks=*/0);
  const int seq = cache->add_sequence();
  ModelRates rates = test::synthetic_rates(50, 50);
  rates.cpu_latency_s = 20e-6;
  auto seconds_at = [&](const std::vector<BlockSegment>& segments, double gbps) {
    return covered_bytes(segments) / (gbps * 1e9);
  };
  {
    WriteScopeScheduler<bf16> placing(RooflineModel(rates), shape_, *cache);
    for (int t = 0; t < 256 * block_tokens; t += block_tokens)
      write(*cache, placing, 0, seq, block_tokens, 256 * block_tokens, true);
  }
  const std::vector<TokenRange> range{{0, 256 * block_tokens}};
  int short_shares = 0;
  for (const double slow_gbps : {1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02}) {
    WriteScopeScheduler<bf16> scheduler(RooflineModel(rates), shape_, *cache);
    auto step = [&](double cpu_gbps) {
      const SplitPlan plan = scheduler.plan(0, {seq}, range);
      SplitTimings measured;
      measured.cpu_seconds = plan.cpu_pinned.empty() ? 0 : rates.cpu_latency_s + seconds_at(plan.cpu_pinned, cpu_gbps);
      measured.streamed_seconds = measured.gpu_seconds = seconds_at(plan.gpu_streamed, 50);
      scheduler.observe(plan, measured);
      return plan;
    };
    for (int i = 0; i < 10; ++i) step(slow_gbps);
    const SplitPlan after = step(50);
    if (after.cpu_pinned.empty() || rates.cpu_latency_s + seconds_at(after.cpu_pinned, 50) >= 2 * rates.cpu_latency_s)
      continue;  // not the case: an empty share, or one long enough to time
    ++short_shares;
    for (int i = 0; i < 300; ++i) step(50);
    EXPECT_NEAR(scheduler.model().rates().cpu_attention_gbps, 50, 5) << "after a spell at " << slow_gbps << " GB/s";
  }
  EXPECT_GT(short_shares, 0) << "no spell left the CPU a share too short to time";
}

// The resident kernel is timed only where it ends after the streamed path: a
// low HBM estimate from a slow spell still drifts back once it ends first,
// or it stayed low for good (its time is never reported again), and the CPU
// kept band blocks the GPU would have read sooner. A CPU of 5 GB/s, so that
// the GPU streams most of the band at either estimate.
TEST_F(SchedulerTest, AResidentRateNoLongerTimedDriftsBack) {
  auto cache = make_cache(/*vram_blocks=*/64);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(50, 5)), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 192 * block_tokens, 192 * block_tokens, false);
  const std::vector<TokenRange> range{{0, 192 * block_tokens}};
  auto step = [&](double hbm_gbps) {
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    const StepBytes bytes = scheduler.bytes_of(plan);
    const double streamed_bytes = covered_bytes(plan.gpu_streamed);
    SplitTimings measured;
    const double resident = bytes.gpu_resident / (hbm_gbps * 1e9);
    measured.streamed_seconds = streamed_bytes / 50e9;
    measured.resident_seconds = resident > measured.streamed_seconds ? resident : 0;  // as split.cpp reports it
    measured.gpu_seconds = std::max(resident, measured.streamed_seconds);
    measured.cpu_seconds = (bytes.total() - bytes.gpu_resident - streamed_bytes) / 5e9;
    scheduler.observe(plan, measured);
    return streamed_bytes;
  };
  for (int i = 0; i < 10; ++i) step(10);  // a spell at 10 GB/s: timed, past the streamed path
  ASSERT_LT(scheduler.model().rates().hbm_gbps, 20);
  ASSERT_GT(step(3000), 0) << "the GPU streams part of the band, which now ends after the resident kernel";
  for (int i = 0; i < 300; ++i) step(3000);
  EXPECT_NEAR(scheduler.model().rates().hbm_gbps, 3000, 300);
}

TEST_F(SchedulerTest, FeedbackFitsTheResidentRateApartFromTheLink) {
  auto cache = make_cache(/*vram_blocks=*/64);
  WriteScopeScheduler<bf16> scheduler(RooflineModel(test::synthetic_rates(50, 50)), shape_, *cache);
  const int seq = cache->add_sequence();
  write(*cache, scheduler, 0, seq, 192 * block_tokens, 192 * block_tokens, false);
  const std::vector<TokenRange> range{{0, 192 * block_tokens}};
  for (int step = 0; step < 10; ++step) {
    const SplitPlan plan = scheduler.plan(0, {seq}, range);
    const StepBytes bytes = scheduler.bytes_of(plan);
    const double streamed_bytes = covered_bytes(plan.gpu_streamed);
    ASSERT_GT(bytes.gpu_resident, 0);
    ASSERT_GT(streamed_bytes, 0);
    SplitTimings measured;
    measured.resident_seconds = bytes.gpu_resident / 200e9;  // 200 GB/s, not the profile's 3000
    measured.streamed_seconds = streamed_bytes / 50e9;       // the link as believed
    measured.gpu_seconds = std::max(measured.resident_seconds, measured.streamed_seconds);
    measured.cpu_seconds = (bytes.total() - bytes.gpu_resident - streamed_bytes) / 50e9;
    scheduler.observe(plan, measured);
  }
  EXPECT_NEAR(scheduler.model().rates().hbm_gbps, 200, 1);
  EXPECT_NEAR(scheduler.model().rates().link_gbps, 50, 0.5);
}

}  // namespace
}  // namespace writescope
