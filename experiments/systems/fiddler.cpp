// Fiddler-style.
//
// The original (Fiddler, ICLR '25): the most popular experts, from a profile
// of routing on sample data, stay in GPU memory up to its capacity; for every
// other activated expert, per layer, a latency model compares computing it on
// the CPU with copying its weights to the GPU and computing there, and picks
// the cheaper. KV and attention stay on the GPU.
// Kept: popularity from a profiling prompt separate from the measured
// sequences (its own seed; the harness prefills it and frees it before the
// measured sequences start), resident experts up to a share of the free VRAM,
// every slot filled in popularity order (ties, such as experts the profile
// never routed to, by layer and index), the per-expert CPU-or-transfer
// decision from the calibrated rates of the kernels that run (the project's
// bf16 expert kernel on the CPU; the pageable copy rate when the expert store
// is not page-locked); KV in VRAM up to the budget, the rest in one pinned
// region the GPU streams every step.
// Simplified: the transferred weights are not kept (one staging buffer).
#include <algorithm>
#include <numeric>

#include "experiments/systems.hpp"

namespace writescope {
namespace {

class FiddlerExperts final : public ExpertPolicy {
 public:
  FiddlerExperts(ExpertCosts costs, double vram_share) : costs_(costs), vram_share_(vram_share) {}

  int slots(int fit, int layers, int experts) const override {
    return std::min(layers * experts, static_cast<int>(fit * vram_share_));
  }

  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override {
    if (popularity_.empty()) popularity_.assign(static_cast<std::size_t>(residency.layers()) * residency.experts(), 0);
    ExpertPlan plan;
    for (int e : routing.active()) {
      const int tokens = static_cast<int>(routing.rows[e].size());
      if (profiling_) popularity_[static_cast<std::size_t>(layer) * residency.experts() + e] += tokens;
      if (residency.slot_of(layer, e) >= 0) {
        plan.gpu.push_back(e);
      } else if (costs_.cpu_seconds(tokens) <= costs_.transfer_seconds() + costs_.gpu_seconds(tokens)) {
        plan.cpu.push_back(e);
      } else {
        plan.gpu.push_back(e);
        plan.loads.push_back({layer, e, -1});
      }
    }
    return plan;
  }

  bool profiles_routing() const override { return true; }

  /// Every slot, most popular expert of the profile first.
  std::vector<ExpertLoad> end_warmup(const ExpertResidency& residency) override {
    profiling_ = false;
    popularity_.resize(static_cast<std::size_t>(residency.layers()) * residency.experts(), 0);
    std::vector<int> order(popularity_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return popularity_[a] > popularity_[b]; });
    std::vector<ExpertLoad> loads;
    for (int slot = 0; slot < residency.slots() && slot < static_cast<int>(order.size()); ++slot)
      loads.push_back({order[slot] / residency.experts(), order[slot] % residency.experts(), slot});
    return loads;
  }

 private:
  ExpertCosts costs_;
  double vram_share_;
  bool profiling_ = true;
  std::vector<long> popularity_;  // tokens routed to (layer, expert) by the profiling prompt
};

}  // namespace

std::shared_ptr<ExpertPolicy> fiddler_experts(const SystemContext& context) {
  return std::make_shared<FiddlerExperts>(expert_costs_of(context), context.options.expert_vram_share);
}

System make_fiddler(const SystemContext& context) {
  return first_fit_system("fiddler", context, Region::gpu_streamed, true, fiddler_experts(context));
}

}  // namespace writescope
