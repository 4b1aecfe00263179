#include "moe/expert_policy.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace writescope {

ExpertResidency::ExpertResidency(int layers, int experts, int slots)
    : layers_(layers),
      experts_(experts),
      owners_(static_cast<std::size_t>(slots), {-1, -1}),
      slot_of_(static_cast<std::size_t>(layers) * experts, -1) {}

std::size_t ExpertResidency::index(int layer, int expert) const {
  // An expert number past the model's would alias another layer's entry.
  if (layer < 0 || layer >= layers_ || expert < 0 || expert >= experts_)
    throw std::out_of_range("ExpertResidency: layer " + std::to_string(layer) + ", expert " + std::to_string(expert) +
                            " is outside its " + std::to_string(layers_) + " layers x " + std::to_string(experts_) +
                            " experts");
  return static_cast<std::size_t>(layer) * experts_ + expert;
}

int ExpertResidency::slot_of(int layer, int expert) const { return slot_of_[index(layer, expert)]; }

int ExpertResidency::free_slot() const {
  for (std::size_t s = 0; s < owners_.size(); ++s)
    if (owners_[s].first < 0) return static_cast<int>(s);
  return -1;
}

void ExpertResidency::assign(int slot, int layer, int expert) {
  auto& owner = owners_.at(static_cast<std::size_t>(slot));
  const std::size_t entry = index(layer, expert);
  if (owner.first >= 0) slot_of_[index(owner.first, owner.second)] = -1;
  if (const int previous = slot_of_[entry]; previous >= 0) owners_[static_cast<std::size_t>(previous)] = {-1, -1};
  owner = {layer, expert};
  slot_of_[entry] = slot;
}

double ExpertCosts::cpu_seconds(int tokens) const {
  // The kernel's two measured roofs: weight-bound at few tokens, compute-bound at many.
  return std::max(expert_bytes / (cpu_expert_gbps * 1e9), tokens * flops_per_token / (cpu_expert_gflops * 1e9));
}

double ExpertCosts::gpu_seconds(int) const { return has_gpu ? expert_bytes / (hbm_gbps * 1e9) : 0.0; }

double ExpertCosts::transfer_seconds() const {
  return has_gpu && link_gbps > 0 ? link_latency_s + expert_bytes / (link_gbps * 1e9)
                                  : std::numeric_limits<double>::infinity();
}

bool ExpertPlan::touches_slots(int layer, const ExpertResidency& residency, const std::vector<int>& slots) const {
  auto listed = [&](int slot) { return slot >= 0 && std::find(slots.begin(), slots.end(), slot) != slots.end(); };
  return std::any_of(gpu.begin(), gpu.end(), [&](int e) { return listed(residency.slot_of(layer, e)); }) ||
         std::any_of(loads.begin(), loads.end(), [&](const ExpertLoad& l) { return listed(l.slot); });
}

std::vector<ExpertLoad> ExpertPolicy::after_layer(int, const Routing&, const ExpertResidency&) { return {}; }

ExpertPlan CpuExpertPolicy::plan(int, const Routing& routing, const ExpertResidency&) {
  return ExpertPlan{{}, routing.active(), {}};
}

std::vector<ExpertLoad> GpuExpertPolicy::initial(const ExpertResidency& residency) {
  std::vector<ExpertLoad> loads;
  for (int layer = 0; layer < residency.layers(); ++layer)
    for (int e = 0; e < residency.experts(); ++e) loads.push_back({layer, e, layer * residency.experts() + e});
  return loads;
}

ExpertPlan GpuExpertPolicy::plan(int, const Routing& routing, const ExpertResidency&) {
  return ExpertPlan{routing.active(), {}, {}};
}

std::vector<ExpertLoad> FixedExpertPolicy::initial(const ExpertResidency& residency) {
  std::vector<ExpertLoad> loads;
  for (int layer = 0; layer < residency.layers(); ++layer)
    for (int e = 0; e < residency.experts(); ++e)
      if (choice_(layer, e) == ExpertPlacement::gpu_resident)
        loads.push_back({layer, e, layer * residency.experts() + e});
  return loads;
}

ExpertPlan FixedExpertPolicy::plan(int layer, const Routing& routing, const ExpertResidency&) {
  ExpertPlan plan;
  for (int e : routing.active()) {
    switch (choice_(layer, e)) {
      case ExpertPlacement::gpu_resident: plan.gpu.push_back(e); break;
      case ExpertPlacement::gpu_loaded:
        plan.gpu.push_back(e);
        plan.loads.push_back({layer, e, -1});
        break;
      case ExpertPlacement::cpu: plan.cpu.push_back(e); break;
    }
  }
  return plan;
}

}  // namespace writescope
