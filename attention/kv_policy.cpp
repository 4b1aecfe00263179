#include "attention/kv_policy.hpp"

#include <algorithm>

namespace writescope {

KVPolicy::KVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape, const InplaceKVCache<bf16>& cache)
    : model_(model), cache_(cache), fmas_per_byte_(shape.fmas_per_byte(sizeof(bf16))) {}

void KVPolicy::observe(const SplitPlan&, const SplitTimings&) {}

void KVPolicy::released(int, const std::vector<Region>&) {}

double KVPolicy::bytes_per_token() const {
  return static_cast<double>(cache_.block_bytes()) / cache_.geometry().block_tokens;
}

double KVPolicy::segment_bytes(const std::vector<BlockSegment>& segments) const {
  return writescope::segment_bytes(segments, bytes_per_token());
}

SplitPlan KVPolicy::affine_plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                                SplitPrediction& prediction) const {
  SplitPlan plan;
  plan.gpu_resident = cache_.segments(layer, Region::gpu_resident, sequences, ranges);
  plan.gpu_streamed = cache_.segments(layer, Region::gpu_streamed, sequences, ranges);
  plan.cpu_resident = cache_.segments(layer, Region::cpu_resident, sequences, ranges);
  plan.cpu_pinned = cache_.segments(layer, Region::cpu_streamed, sequences, ranges);
  prediction = model_ ? model_->predict(plan_bytes(plan, bytes_per_token()), segment_bytes(plan.cpu_pinned),
                                        fmas_per_byte_, 0)
                      : SplitPrediction{};
  return plan;
}

WriteScopeKVPolicy::WriteScopeKVPolicy(const RooflineModel& model, const AttentionShape& shape,
                                       const InplaceKVCache<bf16>& cache, SchedulerOptions options)
    : KVPolicy(std::nullopt, shape, cache), scheduler_(model, shape, cache, options) {}

std::vector<Region> WriteScopeKVPolicy::place(int layer, int sequence, std::int64_t tokens,
                                              std::int64_t expected_tokens, bool decode) {
  return scheduler_.place(layer, sequence, tokens, expected_tokens, decode);
}

SplitPlan WriteScopeKVPolicy::plan(int layer, const std::vector<int>& sequences,
                                   const std::vector<TokenRange>& ranges, SplitPrediction& prediction) const {
  return scheduler_.plan(layer, sequences, ranges, &prediction);
}

void WriteScopeKVPolicy::observe(const SplitPlan& plan, const SplitTimings& timings) {
  scheduler_.observe(plan, timings);
}

void WriteScopeKVPolicy::released(int layer, const std::vector<Region>& regions) {
  scheduler_.released(layer, regions);
}

FirstFitKVPolicy::FirstFitKVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape,
                                   const InplaceKVCache<bf16>& cache, Region spill, bool use_vram)
    : KVPolicy(model, shape, cache),
      spill_(spill),
      vram_quota_(use_vram ? cache.capacity_blocks(Region::gpu_resident) / cache.shape().layers : 0),
      vram_blocks_(static_cast<std::size_t>(cache.shape().layers), 0) {}

std::vector<Region> FirstFitKVPolicy::place(int layer, int sequence, std::int64_t tokens, std::int64_t,
                                            bool) {
  std::vector<Region> regions;
  for (int k = 0; k < cache_.new_blocks_needed(layer, sequence, tokens); ++k) {
    if (vram_blocks_[layer] < vram_quota_ || spill_ == Region::gpu_resident) {
      ++vram_blocks_[layer];
      regions.push_back(Region::gpu_resident);
    } else {
      regions.push_back(spill_);
    }
  }
  return regions;
}

SplitPlan FirstFitKVPolicy::plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                                 SplitPrediction& prediction) const {
  return affine_plan(layer, sequences, ranges, prediction);
}

void FirstFitKVPolicy::released(int layer, const std::vector<Region>& regions) {
  vram_blocks_[layer] -= std::count(regions.begin(), regions.end(), Region::gpu_resident);
}

CallbackKVPolicy::CallbackKVPolicy(std::optional<RooflineModel> model, const AttentionShape& shape,
                                   const InplaceKVCache<bf16>& cache, BlockPlacement placement)
    : KVPolicy(model, shape, cache), placement_(std::move(placement)) {}

std::vector<Region> CallbackKVPolicy::place(int layer, int sequence, std::int64_t tokens, std::int64_t, bool) {
  std::vector<Region> regions;
  const int opened = static_cast<int>(cache_.block_regions(layer, sequence).size());
  for (int k = 0; k < cache_.new_blocks_needed(layer, sequence, tokens); ++k)
    regions.push_back(placement_(layer, sequence, opened + k));
  return regions;
}

SplitPlan CallbackKVPolicy::plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                                 SplitPrediction& prediction) const {
  return affine_plan(layer, sequences, ranges, prediction);
}

}  // namespace writescope
