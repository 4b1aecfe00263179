#include "attention/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace writescope {

namespace {

/// `rates`, refused with one message naming them where the scheduler cannot
/// divide by them (before the feedback's estimators start from them).
const ModelRates& usable_rates(const ModelRates& rates) {
  if (!(rates.cpu_attention_gbps > 0 && rates.cpu_streamed_attention_gbps > 0))
    throw std::invalid_argument("scheduler: the CPU attention rates (CpuResident's and the band's) must be positive");
  if (rates.has_gpu && !(rates.hbm_gbps > 0 && rates.link_gbps > 0)) {
    std::ostringstream why;
    why << "scheduler: a GPU machine's HBM and link rates must be positive, got " << rates.hbm_gbps << " and "
        << rates.link_gbps << " GB/s";
    throw std::invalid_argument(why.str());
  }
  return rates;
}

}  // namespace

template <class Scalar>
WriteScopeScheduler<Scalar>::WriteScopeScheduler(const RooflineModel& model, const AttentionShape& shape,
                                                 const InplaceKVCache<Scalar>& cache, SchedulerOptions options)
    : model_(model),
      profile_(usable_rates(model.rates())),
      shape_(shape),
      cache_(cache),
      options_(options),
      fmas_per_byte_(shape.fmas_per_byte(sizeof(Scalar))),
      bytes_per_token_(static_cast<double>(cache.block_bytes()) / cache.geometry().block_tokens),
      cpu_speed_(1.0),
      link_rate_(model.rates().has_gpu ? model.rates().link_gbps * 1e9 : 1.0),
      resident_rate_(model.rates().has_gpu ? model.rates().hbm_gbps * 1e9 : 1.0),
      resident_blocks_(static_cast<std::size_t>(cache.shape().layers), 0) {
  if (!(options.resident_headroom > 0 && options.resident_headroom <= 1))
    throw std::invalid_argument("scheduler: resident_headroom must be in (0, 1]");
  if (!(options.untimed_relaxation >= 0 && options.untimed_relaxation <= 1))
    throw std::invalid_argument("scheduler: untimed_relaxation must be in [0, 1]");
}

template <class Scalar>
std::vector<Region> WriteScopeScheduler<Scalar>::place(int layer, int sequence, std::int64_t tokens,
                                                       std::int64_t expected_tokens, bool decode) {
  const int block_tokens = cache_.geometry().block_tokens;
  const int needed = cache_.new_blocks_needed(layer, sequence, tokens);
  std::vector<Region> existing = cache_.block_regions(layer, sequence);
  const std::int64_t vram_quota = model_.rates().has_gpu
                                      ? cache_.capacity_blocks(Region::gpu_resident) / cache_.shape().layers
                                      : 0;
  // The CPU's share of the spilled blocks at the expected length, and the part
  // of it that may be fixed in CpuResident.
  const std::int64_t expected_blocks =
      std::max<std::int64_t>((expected_tokens + block_tokens - 1) / block_tokens,
                             static_cast<std::int64_t>(existing.size()) + needed);
  std::int64_t resident = std::count(existing.begin(), existing.end(), Region::gpu_resident);
  const std::int64_t expected_resident =
      std::min<std::int64_t>(expected_blocks, resident + std::max<std::int64_t>(0, vram_quota - resident_blocks_[layer]));
  const double block_bytes = static_cast<double>(cache_.block_bytes());
  StepBytes expected{static_cast<double>(expected_resident) * block_bytes, 0,
                     static_cast<double>(expected_blocks - expected_resident) * block_bytes};
  const double cpu_fraction =
      expected.movable > 0 ? model_.best_split(expected, fmas_per_byte_, 0).cpu_movable_bytes / expected.movable : 0;
  // The share fixed in CpuResident is read head-major: priced at that kernel's rate, with headroom.
  RooflineModel cautious = model_;
  cautious.rates().cpu_attention_gbps *= options_.resident_headroom;
  cautious.rates().cpu_streamed_attention_gbps = cautious.rates().cpu_attention_gbps;
  cautious.rates().cpu_fma_glanes *= options_.resident_headroom;
  const double resident_fraction =
      expected.movable > 0 ? cautious.best_split(expected, fmas_per_byte_, 0).cpu_movable_bytes / expected.movable : 0;

  std::int64_t cpu_resident = std::count(existing.begin(), existing.end(), Region::cpu_resident);
  std::int64_t cpu_affine = cpu_resident + std::count(existing.begin(), existing.end(), Region::cpu_streamed);
  std::int64_t spilled = static_cast<std::int64_t>(existing.size()) - resident;
  // A full host pool sends prefill's CPU-affine blocks to the band instead.
  std::int64_t host_free = cache_.capacity_blocks(Region::cpu_resident) -
                           static_cast<std::int64_t>(cache_.region_bytes(Region::cpu_resident) / cache_.block_bytes());
  std::vector<Region> regions;
  for (int k = 0; k < needed; ++k) {
    Region region;
    if (resident_blocks_[layer] < vram_quota) {
      region = Region::gpu_resident;
      ++resident_blocks_[layer];
      ++resident;
    } else {
      const double target = static_cast<double>(spilled + 1);
      if (!decode && host_free > 0 && static_cast<double>(cpu_resident) + 0.5 <= resident_fraction * target) {
        region = Region::cpu_resident;
        --host_free;
        ++cpu_resident;
        ++cpu_affine;
      } else if (static_cast<double>(cpu_affine) + 0.5 <= cpu_fraction * target) {
        region = Region::cpu_streamed;
        ++cpu_affine;
      } else {
        region = model_.rates().has_gpu ? Region::gpu_streamed : Region::cpu_streamed;
      }
      ++spilled;
    }
    regions.push_back(region);
  }
  return regions;
}

template <class Scalar>
void WriteScopeScheduler<Scalar>::released(int layer, const std::vector<Region>& regions) {
  resident_blocks_[layer] -= std::count(regions.begin(), regions.end(), Region::gpu_resident);
}

template <class Scalar>
double WriteScopeScheduler<Scalar>::segment_bytes(const std::vector<BlockSegment>& segments) const {
  return writescope::segment_bytes(segments, bytes_per_token_);
}

template <class Scalar>
StepBytes WriteScopeScheduler<Scalar>::bytes_of(const SplitPlan& plan) const {
  return plan_bytes(plan, bytes_per_token_);
}

template <class Scalar>
SplitPlan WriteScopeScheduler<Scalar>::plan(int layer, const std::vector<int>& sequences,
                                            const std::vector<TokenRange>& ranges,
                                            SplitPrediction* prediction) const {
  SplitPlan plan;
  plan.gpu_resident = cache_.segments(layer, Region::gpu_resident, sequences, ranges);
  plan.cpu_resident = cache_.segments(layer, Region::cpu_resident, sequences, ranges);
  // The band in the order the CPU takes it: its own blocks first.
  std::vector<BlockSegment> band = cache_.segments(layer, Region::cpu_streamed, sequences, ranges);
  const std::vector<BlockSegment> gpu_band = cache_.segments(layer, Region::gpu_streamed, sequences, ranges);
  band.insert(band.end(), gpu_band.begin(), gpu_band.end());
  StepBytes bytes{segment_bytes(plan.gpu_resident), segment_bytes(plan.cpu_resident), segment_bytes(band)};
  const double cpu_target = model_.best_split(bytes, fmas_per_byte_, 0).cpu_movable_bytes;
  double cpu_bytes = 0;
  std::size_t cut = 0;
  for (; cut < band.size(); ++cut) {
    const double next = band[cut].token_count * bytes_per_token_;
    if (cpu_bytes + 0.5 * next > cpu_target) break;
    cpu_bytes += next;
  }
  if (!model_.rates().has_gpu) cut = band.size();  // the host reads the whole band
  plan.cpu_pinned.assign(band.begin(), band.begin() + cut);
  plan.gpu_streamed.assign(band.begin() + cut, band.end());
  sort_by_batch_and_slot(plan.cpu_pinned);
  sort_by_batch_and_slot(plan.gpu_streamed);
  if (prediction) *prediction = model_.predict(bytes, segment_bytes(plan.cpu_pinned), fmas_per_byte_, 0);
  return plan;
}

template <class Scalar>
void WriteScopeScheduler<Scalar>::observe(const SplitPlan& plan, const SplitTimings& timings) {
  if (!options_.feedback) return;
  // A rate from a time that is mostly the fixed latency is noise: a
  // microsecond either way in either makes it any number. Only times of at
  // least twice the latency are samples. `work` is bytes, or for the CPU the
  // seconds its bytes take at the profile's rates.
  const auto sample = [](RateEstimator& rate, double work, double seconds, double latency) {
    if (!(work > 0 && seconds > latency && seconds >= 2 * latency)) return false;
    rate.observe(work / (seconds - latency));
    return true;
  };
  const StepBytes bytes = bytes_of(plan);
  const double cpu_profile_seconds =
      RooflineModel(profile_).cpu_attention_seconds(bytes.cpu_resident, segment_bytes(plan.cpu_pinned));
  // A device whose share of the band gives no sample (none, or too short to
  // time: a few blocks left it by a low estimate) drifts back to the
  // profile's rate, so that one bad spell cannot keep it out of the split
  // for good; where its share is timed, the samples correct the drift.
  const bool band = !plan.cpu_pinned.empty() || !plan.gpu_streamed.empty();
  if (sample(cpu_speed_, cpu_profile_seconds, timings.cpu_seconds, model_.rates().cpu_latency_s))
    cpu_timed_ = true;
  else if (band)
    cpu_speed_.relax(1.0, options_.untimed_relaxation);
  if (model_.rates().has_gpu) {
    if (!sample(link_rate_, segment_bytes(plan.gpu_streamed), timings.streamed_seconds,
                model_.rates().link_latency_s) &&
        band)
      link_rate_.relax(profile_.link_gbps * 1e9, options_.untimed_relaxation);
    // The resident kernel is timed only where it ends after the streamed
    // path (split.cpp): one that ends before it is no slower than the
    // profile says as far as the step can tell, so its rate drifts back.
    if (!sample(resident_rate_, bytes.gpu_resident, timings.resident_seconds, model_.rates().gpu_latency_s) &&
        bytes.gpu_resident > 0)
      resident_rate_.relax(profile_.hbm_gbps * 1e9, options_.untimed_relaxation);
    model_.rates().link_gbps = link_rate_.value() / 1e9;
    model_.rates().hbm_gbps = resident_rate_.value() / 1e9;
  }
  // A measured rate already includes the CPU's compute limit; until the CPU
  // has been timed, the profile's rates and limit stand.
  if (cpu_timed_) {
    model_.rates().cpu_attention_gbps = cpu_speed_.value() * profile_.cpu_attention_gbps;
    model_.rates().cpu_streamed_attention_gbps = cpu_speed_.value() * profile_.cpu_streamed_attention_gbps;
    model_.rates().cpu_fma_glanes = 0;
  }
}

template class WriteScopeScheduler<float>;
template class WriteScopeScheduler<bf16>;

}  // namespace writescope
