// MoE-Lightning-style.
//
// The original (MoE-Lightning, ASPLOS '25): throughput-oriented offloading.
// Attention runs on the CPU over a KV cache kept in host memory; the weights
// of each layer are paged to the GPU, which computes the dense and expert
// parts; its CGOPipe schedule splits the batch into micro-batches so that the
// CPU's attention of one micro-batch overlaps the GPU's work on another and
// the paging of the next layer's weights; a hierarchical roofline model (HRM)
// picks the policy (micro-batch size, what runs where).
// Kept: the whole KV cache in host memory with attention on the CPU; every
// routed expert of a layer paged into a GPU buffer (double-buffered: the next
// layer's experts are paged after each layer) and computed on the GPU;
// micro-batches whose CPU attention overlaps the GPU's feed-forward of the
// previous micro-batch (CUDA builds); the number of micro-batches chosen by a
// two-level roofline over the machine profile (CPU attention vs. GPU compute
// plus paging).
// Simplified: attention is always on the CPU and dense weights stay on the
// GPU (the DESIGN's setting); paging runs between layers, not concurrently
// with compute. Without room for two layers of experts, each activated expert
// is paged into one staging buffer as it is needed.
#include <algorithm>
#include <cmath>

#include "experiments/systems.hpp"

namespace writescope {
namespace {

class PagedExperts final : public ExpertPolicy {
 public:
  explicit PagedExperts(int experts) : experts_(experts) {}

  int slots(int fit, int, int experts) const override { return fit >= 2 * experts ? 2 * experts : 0; }

  ExpertPlan plan(int layer, const Routing& routing, const ExpertResidency& residency) override {
    ExpertPlan plan;
    plan.gpu = routing.active();
    if (residency.slots() == 0) {
      for (int e : plan.gpu) plan.loads.push_back({layer, e, -1});
    } else {
      for (int e : plan.gpu)
        if (residency.slot_of(layer, e) < 0) plan.loads.push_back({layer, e, half(layer) + e});
    }
    return plan;
  }

  bool computes_on_cpu() const override { return false; }

  /// Pages the next layer's experts (the first layer's after the last) into the other half.
  std::vector<ExpertLoad> after_layer(int layer, const Routing&, const ExpertResidency& residency) override {
    const int next = (layer + 1) % residency.layers();
    // With an odd number of layers the first and the last share a half: the
    // first layer's experts are then paged when it runs, not over the last's
    // while other micro-batches still need them.
    if (residency.slots() == 0 || half(next) == half(layer)) return {};
    std::vector<ExpertLoad> loads;
    for (int e = 0; e < residency.experts(); ++e)
      if (residency.slot_of(next, e) < 0) loads.push_back({next, e, half(next) + e});
    return loads;
  }

 private:
  /// First slot of the half that holds `layer`'s experts (layers alternate halves).
  int half(int layer) const { return (layer % 2) * experts_; }

  int experts_;
};

/// CGOPipe's micro-batch count by a two-level roofline: with n micro-batches,
/// a layer takes about max(CPU attention of the batch, GPU work + paging)
/// plus one micro-batch of the other stage to fill the pipeline.
int micro_batches(const SystemContext& context) {
  const ModelConfig& c = context.model;
  const MachineProfile& p = context.profile;
  if (!p.has_gpu || context.batch < 2) return 1;
  const AttentionShape shape = c.attention();
  const double kv_bytes = static_cast<double>(context.batch) * context.context *
                          (shape.kv_heads * (shape.key_dim + (shape.values_in_keys ? 0 : shape.value_dim))) * 2.0;
  const double cpu_attention = kv_bytes / (ModelRates::from_profile(p, shape.name, p.cpu_threads).cpu_attention_gbps * 1e9);
  // Every expert of a layer is paged; the activated ones are computed.
  const double active = c.experts * (1 - std::pow(1 - static_cast<double>(c.experts_per_token) / c.experts, context.batch));
  const double expert_bytes = static_cast<double>(MoeModel::expert_bytes(c));
  const double gpu_work = active * expert_bytes / (p.hbm_gbps * 1e9) + c.experts * expert_bytes / (p.pinned_h2d_gbps * 1e9);
  int best = 1;
  double best_time = cpu_attention + gpu_work;
  for (int n = 2; n <= std::min(context.batch, 16); n *= 2) {
    const double per_step_overhead = 2 * n * (p.gpu_launch_latency_s + p.cpu_launch_latency_s);
    const double time = std::max(cpu_attention, gpu_work) + std::min(cpu_attention, gpu_work) / n + per_step_overhead;
    if (time < best_time) best = n, best_time = time;
  }
  return best;
}

}  // namespace

System make_moe_lightning(const SystemContext& context) {
  System system = first_fit_system("moe-lightning", context, Region::cpu_resident, false,
                                   std::make_shared<PagedExperts>(context.model.experts));
  system.micro_batches = micro_batches(context);
  return system;
}

}  // namespace writescope
