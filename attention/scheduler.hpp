#pragma once
// The WriteScope scheduler (DESIGN.md §4): where new KV blocks are written,
// which blocks each device reads in a step, and how measured step times move
// both.
//
//  - Write policy: a layer's blocks fill its share of the VRAM pool first
//    (GpuResident). Spilled blocks are split so that the CPU-affine fraction
//    tracks the model's best CPU share at the sequence's expected length.
//    Prefill places CPU-affine blocks in CpuResident only up to the share the
//    CPU would get at `resident_headroom` times its rate, so that a slower CPU
//    can hand work back (and only while the host pool has room); the rest of
//    the CPU-affine blocks, and all decode appends for the CPU, go to
//    CpuStreamed, which like GpuStreamed stays in the movable band.
//  - Plan: per step, the band is split by the model: the CPU takes CpuStreamed
//    blocks first, then GpuStreamed ones; the GPU streams the rest.
//  - Feedback: measured CPU, link and GPU-resident rates update the model
//    (RateEstimator), each from its own timing, so a slow resident kernel is
//    not charged to the link; the next plan moves the band at once and new
//    writes follow.

#include <vector>

#include "attention/shape.hpp"
#include "attention/split.hpp"
#include "framework/roofline.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {

struct SchedulerOptions {
  double resident_headroom = 0.5;  // CpuResident share computed at this fraction of the CPU's rate
  bool feedback = true;            // observe() replaces the profile's rates by measured ones
  /// Per observe() in which a device's work gave no sample (none of the
  /// band, a share too short to time, a resident kernel that ended before the
  /// streamed path): how far its rate moves back towards the profile's. A
  /// spell of contention then cannot keep it out of the split for good.
  double untimed_relaxation = 0.05;
};

template <class Scalar>
class WriteScopeScheduler {
 public:
  WriteScopeScheduler(const RooflineModel& model, const AttentionShape& shape, const InplaceKVCache<Scalar>& cache,
                      SchedulerOptions options = {});

  /// Regions for the blocks an append of `tokens` tokens to (layer, sequence)
  /// opens, for a sequence expected to reach `expected_tokens` tokens.
  std::vector<Region> place(int layer, int sequence, std::int64_t tokens, std::int64_t expected_tokens,
                            bool decode);

  /// The blocks each device reads in one step over ranges[i] of sequences[i].
  SplitPlan plan(int layer, const std::vector<int>& sequences, const std::vector<TokenRange>& ranges,
                 SplitPrediction* prediction = nullptr) const;

  /// `regions` of (layer, a sequence) are about to be freed: their VRAM share returns.
  void released(int layer, const std::vector<Region>& regions);

  /// Updates the model from a step's measured times.
  void observe(const SplitPlan& plan, const SplitTimings& timings);

  const RooflineModel& model() const noexcept { return model_; }
  /// fp32 lane-FMAs per KV byte of this attention shape (QK^T and P.V of every query head).
  double fmas_per_byte() const noexcept { return fmas_per_byte_; }
  StepBytes bytes_of(const SplitPlan& plan) const;

 private:
  double segment_bytes(const std::vector<BlockSegment>& segments) const;

  RooflineModel model_;
  ModelRates profile_;  // the rates as given, before any feedback
  AttentionShape shape_;
  const InplaceKVCache<Scalar>& cache_;
  SchedulerOptions options_;
  double fmas_per_byte_;
  double bytes_per_token_;
  /// The CPU's measured speed as a multiple of the profile's attention rates
  /// (both block orders: a step times them together); the link's and VRAM's
  /// rates in bytes per second.
  RateEstimator cpu_speed_, link_rate_, resident_rate_;
  bool cpu_timed_ = false;  // whether observe() has had a CPU share to time
  std::vector<std::int64_t> resident_blocks_;  // per layer, placed by this scheduler
};

extern template class WriteScopeScheduler<float>;
extern template class WriteScopeScheduler<bf16>;

}  // namespace writescope
