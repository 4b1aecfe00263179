#pragma once
// Expert placement policies (DESIGN.md §5-6): which routed experts the GPU
// holds in its expert slots, and per layer and step which activated experts
// run on the GPU (resident, or loaded over PCIe first) and which on the CPU
// from host memory. The model executes the plan; policies only decide.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "moe/experts.hpp"

namespace writescope {

/// GPU expert slots: each holds the weights of one (layer, expert) or nothing.
/// Here and in the policies, `layer` counts MoE layers only (dense first
/// layers have no routed experts).
class ExpertResidency {
 public:
  ExpertResidency(int layers, int experts, int slots);
  int slots() const noexcept { return static_cast<int>(owners_.size()); }
  int layers() const noexcept { return layers_; }
  int experts() const noexcept { return experts_; }
  /// Slot holding (layer, expert), or -1.
  int slot_of(int layer, int expert) const;
  /// (layer, expert) in `slot`, or (-1, -1) when free.
  std::pair<int, int> owner(int slot) const { return owners_.at(static_cast<std::size_t>(slot)); }
  /// A free slot, or -1.
  int free_slot() const;
  /// Puts (layer, expert) in `slot`, evicting its previous owner.
  void assign(int slot, int layer, int expert);

 private:
  /// slot_of_'s entry of (layer, expert); std::out_of_range outside the model.
  std::size_t index(int layer, int expert) const;
  int layers_, experts_;
  std::vector<std::pair<int, int>> owners_;
  std::vector<int> slot_of_;  // (layer, expert) -> slot or -1
};

/// Copy one expert's weights from host memory to the GPU; slot -1 means a
/// staging buffer used for this step only.
struct ExpertLoad {
  int layer = 0, expert = 0, slot = -1;
};

/// One layer's activated experts by device.
struct ExpertPlan {
  std::vector<int> gpu;            // computed on the GPU: resident, or loaded by `loads` first
  std::vector<int> cpu;            // computed on the CPU from host memory
  std::vector<ExpertLoad> loads;   // performed before the GPU computes

  /// Whether the GPU's work for `layer` reads or writes one of `slots`: a
  /// resident expert's slot in `residency`, or a slot `loads` fill (the
  /// staging buffer is none). A copy in flight into such a slot must land first.
  bool touches_slots(int layer, const ExpertResidency& residency, const std::vector<int>& slots) const;
};

/// Seconds one expert costs each way, from the machine profile (decode: a
/// few tokens per expert, so weight bytes dominate).
struct ExpertCosts {
  double expert_bytes = 0;
  double flops_per_token = 0;    // 2 * 3 * hidden * intermediate
  double cpu_expert_gbps = 0, cpu_expert_gflops = 0;  // the bf16 expert kernel's calibrated rates
  double hbm_gbps = 0, link_gbps = 0, link_latency_s = 0;
  bool has_gpu = false;

  double cpu_seconds(int tokens) const;
  double gpu_seconds(int tokens) const;
  /// Moving the weights to the GPU (infinite without a GPU).
  double transfer_seconds() const;
};

class ExpertPolicy {
 public:
  virtual ~ExpertPolicy() = default;
  /// GPU expert slots to allocate when `fit` experts would fit in the VRAM
  /// left after weights and workspace (the KV cache gets what the slots leave).
  virtual int slots(int fit, int layers, int experts) const = 0;
  /// Loads before the first step.
  virtual std::vector<ExpertLoad> initial(const ExpertResidency&) { return {}; }
  /// Where `layer`'s activated experts run this step.
  virtual ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) = 0;
  /// Loads after `layer` ran (prefetch for the next layer).
  virtual std::vector<ExpertLoad> after_layer(int layer, const Routing& routing, const ExpertResidency& residency);
  /// Called once when warm-up ends (policies that profile popularity place experts now).
  virtual std::vector<ExpertLoad> end_warmup(const ExpertResidency&) { return {}; }
  /// Whether plans may give experts to the CPU.
  virtual bool computes_on_cpu() const { return true; }
  /// Whether experts are copied host -> GPU while decoding (such a policy wants its store page-locked).
  virtual bool loads_experts() const { return true; }
  /// Whether the policy places experts by routing it observes before end_warmup()
  /// (a profiling set of prompts, separate from the measured sequences).
  virtual bool profiles_routing() const { return false; }
};

/// Every routed expert on the CPU (KTransformers; WriteScope's default).
class CpuExpertPolicy final : public ExpertPolicy {
 public:
  int slots(int, int, int) const override { return 0; }
  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override;
  bool loads_experts() const override { return false; }
};

/// Every routed expert resident on the GPU (GPU-only); needs a slot for each.
class GpuExpertPolicy final : public ExpertPolicy {
 public:
  int slots(int, int layers, int experts) const override { return layers * experts; }
  std::vector<ExpertLoad> initial(const ExpertResidency& residency) override;
  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override;
  bool computes_on_cpu() const override { return false; }
  bool loads_experts() const override { return false; }  // once, before the first step
};

/// Where each expert runs, fixed by a function (tests).
enum class ExpertPlacement { gpu_resident, gpu_loaded, cpu };
class FixedExpertPolicy final : public ExpertPolicy {
 public:
  using Choice = std::function<ExpertPlacement(int layer, int expert)>;
  explicit FixedExpertPolicy(Choice choice) : choice_(std::move(choice)) {}
  int slots(int, int layers, int experts) const override { return layers * experts; }
  std::vector<ExpertLoad> initial(const ExpertResidency& residency) override;
  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override;

 private:
  Choice choice_;
};

}  // namespace writescope
