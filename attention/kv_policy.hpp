#pragma once
// KV placement and attention execution policies (DESIGN.md §6): where a
// system writes each new KV block, and which device reads which blocks in a
// decode step. Every system runs on the same InplaceKVCache and SplitDecode;
// only these decisions differ.
//
//  - WriteScopeKVPolicy: the four-region write policy and roofline + feedback
//    split of WriteScopeScheduler.
//  - FirstFitKVPolicy: a layer's share of VRAM first, then one spill region
//    (GpuStreamed: the pinned spill the GPU streams every step, as Fiddler,
//    KTransformers and HybriMoE keep it; CpuResident: MoE-Lightning's host
//    cache), or none (GPU-only).
//  - CallbackKVPolicy: regions chosen by a function (tests).
// The last two read every block on its affine device: GpuResident and
// GpuStreamed on the GPU, CpuResident and CpuStreamed on the CPU.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "attention/scheduler.hpp"
#include "attention/split.hpp"
#include "framework/roofline.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {

class KVPolicy {
 public:
  virtual ~KVPolicy() = default;

  /// Regions of the blocks that an append of `tokens` tokens to (layer,
  /// sequence) opens, for a sequence expected to reach `expected_tokens`.
  virtual std::vector<Region> place(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens,
                                    bool decode) = 0;
  /// The blocks each device reads in one step over ranges[i] of sequences[i],
  /// and the roofline model's prediction of that step (zero without a model).
  virtual SplitPlan plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                         SplitPrediction& prediction) const = 0;
  /// A step's measured times (feedback; ignored by static policies).
  virtual void observe(const SplitPlan& plan, const SplitTimings& timings);
  /// `regions` of (layer, a sequence) are about to be freed (their quotas return).
  virtual void released(int layer, const std::vector<Region>& regions);
  /// place(), then `write(regions)` (the cache's append or record_append of
  /// them). Where the write throws (a budget the cache cannot hold: it
  /// appends nothing), the placement's quotas return before the exception
  /// goes on, so that a caller may free memory and retry.
  template <class Write>
  void place_and_write(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens, bool decode,
                       const Write& write) {
    const std::vector<Region> regions = place(layer, sequence, tokens, expected_tokens, decode);
    try {
      write(regions);
    } catch (...) {
      released(layer, regions);
      throw;
    }
  }

  /// KV bytes of the segments' tokens.
  double segment_bytes(const std::vector<BlockSegment>& segments) const;
  double bytes_per_token() const;

 protected:
  KVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape, const InplaceKVCache<bf16>& cache);
  /// Every block read by its affine device.
  SplitPlan affine_plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                        SplitPrediction& prediction) const;

  std::optional<RooflineModel> model_;
  const InplaceKVCache<bf16>& cache_;
  double fmas_per_byte_;
};

class WriteScopeKVPolicy final : public KVPolicy {
 public:
  WriteScopeKVPolicy(const RooflineModel& model, const AttentionShape& shape, const InplaceKVCache<bf16>& cache,
                     SchedulerOptions options = {});
  std::vector<Region> place(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens,
                            bool decode) override;
  SplitPlan plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                 SplitPrediction& prediction) const override;
  void observe(const SplitPlan& plan, const SplitTimings& timings) override;
  void released(int layer, const std::vector<Region>& regions) override;

 private:
  WriteScopeScheduler<bf16> scheduler_;
};

class FirstFitKVPolicy final : public KVPolicy {
 public:
  /// `spill`: where blocks go once the layer's VRAM share is used;
  /// Region::gpu_resident means nowhere (the cache reports the full pool).
  /// `use_vram` false places every block in `spill`.
  /// `model` (optional) only predicts step times.
  FirstFitKVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape,
                   const InplaceKVCache<bf16>& cache, Region spill, bool use_vram = true);
  std::vector<Region> place(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens,
                            bool decode) override;
  SplitPlan plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                 SplitPrediction& prediction) const override;
  void released(int layer, const std::vector<Region>& regions) override;

 private:
  Region spill_;
  std::int64_t vram_quota_;                  // blocks per layer
  std::vector<std::int64_t> vram_blocks_;    // per layer, placed so far
};

/// Region of the block `block_index` of (layer, sequence), when it is opened.
using BlockPlacement = std::function<Region(int layer, int sequence, int block_index)>;

class CallbackKVPolicy final : public KVPolicy {
 public:
  CallbackKVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape,
                   const InplaceKVCache<bf16>& cache, BlockPlacement placement);
  std::vector<Region> place(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens,
                            bool decode) override;
  SplitPlan plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                 SplitPrediction& prediction) const override;

 private:
  BlockPlacement placement_;
};

}  // namespace writescope
