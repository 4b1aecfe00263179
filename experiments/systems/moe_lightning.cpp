// MoE-Lightning-style.
//
// The original (MoE-Lightning, ASPLOS '25): throughput-oriented offloading.
// Attention runs on the CPU over a KV cache kept in host memory; a fraction
// of the weights stays in GPU memory and the rest is paged to the GPU layer by
// layer, which computes the dense and expert parts; its CGOPipe schedule
// splits the batch into micro-batches so that the CPU's attention of one
// micro-batch overlaps the GPU's work on another and the paging of the next
// layer's weights; a hierarchical roofline model (HRM) picks the policy (what
// stays resident, micro-batch size, what runs where).
// Kept: the whole KV cache in host memory with attention on the CPU and no
// KV pool in VRAM; the routed experts of the first k MoE layers resident in
// VRAM, with k from the HRM (the fewest resident layers whose paging, at the
// link's rate, takes at most half of the step's CPU attention or GPU work, so
// that paging hides behind them with room to spare; as many as fit if none
// is enough); the other layers' experts paged into a double buffer, the next
// such layer's after each layer, on a copy stream that overlaps the next
// layer's attention (the GPU waits for it only before that layer's experts);
// micro-batches whose CPU attention overlaps the GPU's feed-forward of the
// previous micro-batch (CUDA builds), their number from the same roofline
// over the layers it pages (the HRM's wish within what the VRAM budget holds).
// Simplified: attention is always on the CPU and dense weights stay on the
// GPU (the DESIGN's setting); residency is chosen per layer, not per tensor.
// Without room for two layers of experts, each activated expert is paged into
// one staging buffer as it is needed.
#include <algorithm>
#include <cmath>

#include "experiments/systems.hpp"

namespace writescope {
namespace {

/// Per step of the whole batch, from the profile: the CPU's attention, the
/// GPU's expert compute, and the paging of one MoE layer's experts.
struct LightningTimes {
  double cpu_attention = 0, gpu_work = 0, layer_paging = 0;
};

LightningTimes lightning_times(const SystemContext& context) {
  const ModelConfig& c = context.model;
  const MachineProfile& p = context.profile;
  const AttentionShape shape = c.attention();
  LightningTimes t;
  const double kv_bytes = static_cast<double>(context.batch) * context.context * c.layers *
                          static_cast<double>(shape.kv_bytes_per_token(sizeof(bf16)));
  t.cpu_attention = kv_bytes / (ModelRates::from_profile(p, shape.name, p.cpu_threads).cpu_attention_gbps * 1e9);
  if (!p.has_gpu) return t;
  const int moe_layers = c.layers - c.dense_layers;
  const double active =
      c.experts * (1 - std::pow(1 - static_cast<double>(c.experts_per_token) / c.experts, context.batch));
  const double expert_bytes = static_cast<double>(MoeModel::expert_bytes(c));
  const double link = context.experts_pinned ? p.pinned_h2d_gbps : p.pageable_h2d_gbps;
  t.gpu_work = moe_layers * active * expert_bytes / (p.hbm_gbps * 1e9);
  t.layer_paging = c.experts * expert_bytes / (link * 1e9);
  return t;
}

}  // namespace

/// The HRM's resident MoE layers: the fewest whose remaining paging takes at
/// most half of max(CPU attention, GPU work); all of them without a GPU.
int moe_lightning_resident_layers(const SystemContext& context) {
  const int moe_layers = context.model.layers - context.model.dense_layers;
  const LightningTimes t = lightning_times(context);
  if (t.layer_paging <= 0) return moe_layers;
  const double hidden = 0.5 * std::max(t.cpu_attention, t.gpu_work) / t.layer_paging;  // layers of paging hidden
  return std::clamp(static_cast<int>(std::ceil(moe_layers - hidden)), 0, moe_layers);
}

namespace {

/// The HRM's `wanted` resident layers within `fit` expert slots: all of them
/// when they fit and the HRM wants all but two or more (two paging halves
/// would take as much); else as many as fit beside the two halves.
int resident_within(int wanted, int fit, int layers, int experts) {
  wanted = std::min(wanted, layers);
  if (fit >= layers * experts && wanted + 2 >= layers) return layers;
  return std::clamp(std::min(wanted, fit / experts - 2), 0, layers);
}

/// The expert slots the VRAM budget leaves after the weights and workspace
/// (MoeModel::vram_plan's `fit`, with this context's rows, block size and
/// streaming chunks).
int expert_slots_fit(const SystemContext& context) {
  const VramUse fixed = fixed_vram_of(context);
  const std::uint64_t used = fixed.weights + fixed.workspace, per_expert = MoeModel::expert_bytes(context.model);
  if (per_expert == 0 || context.vram_budget <= used) return 0;
  return static_cast<int>(std::min<std::uint64_t>((context.vram_budget - used) / per_expert, 1u << 30));
}

class PagedExperts final : public ExpertPolicy {
 public:
  PagedExperts(int experts, int resident_layers) : experts_(experts), wanted_(resident_layers) {}

  /// k resident layers, then two paging halves; fewer resident layers when
  /// `fit` is short; none and no halves below two layers' experts.
  int slots(int fit, int layers, int experts) const override {
    const int resident = resident_for(fit, layers, experts);
    if (resident == layers) return layers * experts;
    return fit >= (resident + 2) * experts ? (resident + 2) * experts : 0;
  }

  std::vector<ExpertLoad> initial(const ExpertResidency& residency) override {
    std::vector<ExpertLoad> loads;
    for (int layer = 0; layer < resident(residency); ++layer)
      for (int e = 0; e < residency.experts(); ++e) loads.push_back({layer, e, layer * residency.experts() + e});
    return loads;
  }

  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override {
    ExpertPlan plan;
    plan.gpu = routing.active();
    for (int e : plan.gpu) {
      if (residency.slot_of(layer, e) >= 0) continue;
      plan.loads.push_back({layer, e, residency.slots() == 0 ? -1 : half(layer, residency) + e});
    }
    return plan;
  }

  bool computes_on_cpu() const override { return false; }

  /// Pages the next paged layer's experts (after the last, the first paged
  /// one) into its half while the next layer's attention runs.
  std::vector<ExpertLoad> after_layer(int layer, const Routing&, const ExpertResidency& residency) override {
    const int first_paged = resident(residency);
    if (residency.slots() == 0 || first_paged == residency.layers()) return {};
    const int next = layer + 1 < residency.layers() ? layer + 1 : first_paged;
    // The first paged layer and the last share a half when the paged layers are
    // odd in number: it is then paged when it runs, not over the last's
    // experts while other micro-batches still need them.
    if (next < first_paged || half(next, residency) == half(layer, residency)) return {};
    std::vector<ExpertLoad> loads;
    for (int e = 0; e < residency.experts(); ++e)
      if (residency.slot_of(next, e) < 0) loads.push_back({next, e, half(next, residency) + e});
    return loads;
  }

 private:
  int resident_for(int fit, int layers, int experts) const { return resident_within(wanted_, fit, layers, experts); }
  /// Resident layers of the allocated slots (slots() above is their inverse).
  int resident(const ExpertResidency& residency) const {
    if (residency.slots() == residency.layers() * experts_) return residency.layers();
    return residency.slots() == 0 ? 0 : residency.slots() / experts_ - 2;
  }
  /// First slot of the half that holds paged `layer`'s experts (paged layers alternate halves).
  int half(int layer, const ExpertResidency& residency) const {
    const int first_paged = resident(residency);
    return (first_paged + (layer - first_paged) % 2) * experts_;
  }

  int experts_, wanted_;
};

/// CGOPipe's micro-batch count by the two-level roofline: with n
/// micro-batches, a step takes about max(CPU attention, GPU work + paging
/// left exposed) plus one micro-batch of the other stage to fill the pipeline.
int micro_batches(const SystemContext& context, int paged_layers) {
  const MachineProfile& p = context.profile;
  if (!p.has_gpu || context.batch < 2) return 1;
  const LightningTimes t = lightning_times(context);
  const double gpu = std::max(t.gpu_work, paged_layers * t.layer_paging);
  int best = 1;
  double best_time = t.cpu_attention + gpu;
  for (int n = 2; n <= std::min(context.batch, 16); n *= 2) {
    const double per_step_overhead = 2 * n * (p.gpu_launch_latency_s + p.cpu_launch_latency_s);
    const double time = std::max(t.cpu_attention, gpu) + std::min(t.cpu_attention, gpu) / n + per_step_overhead;
    if (time < best_time) best = n, best_time = time;
  }
  return best;
}

}  // namespace

System make_moe_lightning(const SystemContext& context) {
  const int wanted = moe_lightning_resident_layers(context);
  System system = first_fit_system("moe-lightning", context, Region::cpu_resident, false,
                                   std::make_shared<PagedExperts>(context.model.experts, wanted));
  system.vram_kv = false;
  // The pipeline pages what the VRAM budget leaves of the HRM's wish.
  const int moe_layers = context.model.layers - context.model.dense_layers;
  const int resident = context.model.experts > 0
                           ? resident_within(wanted, expert_slots_fit(context), moe_layers, context.model.experts)
                           : moe_layers;
  system.micro_batches = micro_batches(context, moe_layers - resident);
  return system;
}

}  // namespace writescope
