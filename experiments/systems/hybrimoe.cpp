// HybriMoE-style.
//
// The original (HybriMoE, DAC '25): attention on the GPU; per layer, the
// activated experts are split between CPU and GPU by a greedy simulation
// (the cached experts first, then the others, each by load: the GPU takes
// from the front, the CPU from the back, each time to the device that would
// finish its pick first; a GPU pick that is not cached waits for its copy,
// the copies running one after another beside the GPU's work), a
// score-aware expert cache keeps experts with high exponentially decayed
// routing scores on the GPU, and the next layer's likely experts are
// prefetched while the current layer runs.
// Kept: the greedy split with costs from the machine profile (a non-resident
// expert on the GPU pays its transfer), the decayed-score cache over a share
// of the free VRAM (a loaded expert replaces the lowest-scored resident when
// it scores higher), prefetch of the next layer's highest-scored experts; KV
// in VRAM up to the budget, the rest in one pinned region streamed every step.
// Prefetches run on a copy stream beside the next layer's attention; its
// experts wait for them.
// The cache is warmed as Fiddler's slots are, from the same profiling prompt
// (its own seed, prefilled and freed before the measured sequences): its
// routing scores the experts, and at the end of the warm-up every free slot
// takes the highest-scored expert not yet cached (ties by layer and index),
// so that neither system is measured while its slots still fill (prefetch
// alone needs scores, and where copies are dear the greedy split copies
// nothing on demand).
// Simplified: the split's costs come from the profile, not from online
// measurements, and carry no fixed cost for the CPU's first expert (the
// original's intercept).
#include <algorithm>
#include <numeric>

#include "experiments/systems.hpp"

namespace writescope {
namespace {

class HybriMoeExperts final : public ExpertPolicy {
 public:
  HybriMoeExperts(ExpertCosts costs, double vram_share, double decay, int prefetch)
      : costs_(costs), vram_share_(vram_share), decay_(decay), prefetch_(prefetch) {}

  int slots(int fit, int layers, int experts) const override {
    return std::min(layers * experts, static_cast<int>(fit * vram_share_));
  }

  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override {
    update_scores(layer, routing, residency);
    std::vector<int> active = routing.active();
    const auto tokens = [&](int e) { return static_cast<int>(routing.rows[e].size()); };
    const auto cached = [&](int e) { return residency.slot_of(layer, e) >= 0; };
    std::stable_sort(active.begin(), active.end(), [&](int a, int b) {
      return cached(a) != cached(b) ? cached(a) : tokens(a) > tokens(b);
    });
    ExpertPlan plan;
    double gpu_time = 0, cpu_time = 0, copies_time = 0;  // each device's finish; the last copy's end
    std::size_t most = 0, least = active.size();
    while (most < least) {
      const int first = active[most], last = active[least - 1];
      // A copy ends after those before it; the GPU's pick starts once both its copy and its work before have.
      const double copy_end = cached(first) ? 0.0 : copies_time + costs_.transfer_seconds();
      const double gpu_finish = std::max(gpu_time, copy_end) + costs_.gpu_seconds(tokens(first));
      const double cpu_finish = cpu_time + costs_.cpu_seconds(tokens(last));
      if (gpu_finish <= cpu_finish) {
        if (!cached(first)) copies_time = copy_end;
        gpu_time = gpu_finish;
        plan.gpu.push_back(first);
        ++most;
      } else {
        cpu_time = cpu_finish;
        plan.cpu.push_back(last);
        --least;
      }
    }
    ExpertResidency cache = residency;
    for (int e : plan.gpu)
      if (cache.slot_of(layer, e) < 0) plan.loads.push_back({layer, e, cache_slot(layer, e, plan.gpu, cache)});
    return plan;
  }

  bool profiles_routing() const override { return true; }

  /// Every free slot, the highest-scored experts not cached first.
  std::vector<ExpertLoad> end_warmup(const ExpertResidency& residency) override {
    ensure_scores(residency);
    std::vector<int> order(scores_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores_[a] > scores_[b]; });
    ExpertResidency cache = residency;
    std::vector<ExpertLoad> loads;
    for (const int i : order) {
      const int layer = i / experts_, expert = i % experts_;
      if (cache.slot_of(layer, expert) >= 0) continue;
      const int slot = cache.free_slot();
      if (slot < 0) break;
      cache.assign(slot, layer, expert);
      loads.push_back({layer, expert, slot});
    }
    return loads;
  }

  /// Prefetch: the next layer's highest-scored experts that are not cached.
  std::vector<ExpertLoad> after_layer(int layer, const Routing&, const ExpertResidency& residency) override {
    const int next = layer + 1;
    if (next >= residency.layers() || residency.slots() == 0) return {};
    std::vector<int> order(static_cast<std::size_t>(residency.experts()));
    for (int e = 0; e < residency.experts(); ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(next, a) > score(next, b); });
    order.resize(std::min<std::size_t>(order.size(), static_cast<std::size_t>(prefetch_)));
    ExpertResidency cache = residency;
    std::vector<ExpertLoad> loads;
    for (int e : order) {
      if (score(next, e) <= 0 || cache.slot_of(next, e) >= 0) continue;
      const int slot = cache_slot(next, e, order, cache);
      if (slot >= 0) loads.push_back({next, e, slot});
    }
    return loads;
  }

 private:
  double& score(int layer, int expert) { return scores_[static_cast<std::size_t>(layer) * experts_ + expert]; }

  void ensure_scores(const ExpertResidency& residency) {
    if (!scores_.empty()) return;
    experts_ = residency.experts();
    scores_.assign(static_cast<std::size_t>(residency.layers()) * experts_, 0.0);
  }

  void update_scores(int layer, const Routing& routing, const ExpertResidency& residency) {
    ensure_scores(residency);
    for (int e = 0; e < experts_; ++e) {
      double weight = 0;
      for (float w : routing.weights[e]) weight += w;
      score(layer, e) = decay_ * score(layer, e) + (1 - decay_) * weight;
    }
  }

  /// A slot for (layer, expert) in `cache`: a free one, else the lowest-scored
  /// resident scoring below it and not in `keep` of the same layer; -1 (a
  /// staging buffer) otherwise. Updates `cache`.
  int cache_slot(int layer, int expert, const std::vector<int>& keep, ExpertResidency& cache) {
    int slot = cache.free_slot();
    if (slot < 0) {
      double lowest = score(layer, expert);
      for (int s = 0; s < cache.slots(); ++s) {
        const auto [l, e] = cache.owner(s);
        if (l == layer && std::find(keep.begin(), keep.end(), e) != keep.end()) continue;
        if (score(l, e) < lowest) lowest = score(l, e), slot = s;
      }
    }
    if (slot >= 0) cache.assign(slot, layer, expert);
    return slot;
  }

  ExpertCosts costs_;
  double vram_share_, decay_;
  int prefetch_;
  int experts_ = 0;
  std::vector<double> scores_;  // (layer, expert): decayed sum of routing weights
};

}  // namespace

std::shared_ptr<ExpertPolicy> hybrimoe_experts(const SystemContext& context) {
  const int prefetch =
      context.options.prefetch_experts > 0 ? context.options.prefetch_experts : context.model.experts_per_token;
  return std::make_shared<HybriMoeExperts>(expert_costs_of(context), context.options.expert_vram_share,
                                           context.options.score_decay, prefetch);
}

System make_hybrimoe(const SystemContext& context) {
  return first_fit_system("hybrimoe", context, Region::gpu_streamed, true, hybrimoe_experts(context));
}

}  // namespace writescope
