// WriteScope (this project, DESIGN.md §2-4).
//
// KV blocks are written into the InplaceKVCache's four regions by the
// WriteScope scheduler, each decode step's attention is split along the
// sequence between the GPU (resident + streamed) and the CPU (in place) by the
// roofline model plus online feedback, and the partial results are merged by
// log-sum-exp. Experts follow a baseline's policy (SystemOptions::
// writescope_experts): the harness runs WriteScope with each baseline's expert
// policy (the same-expert-policy comparison) and with its own choice, fixed
// before the run by writescope_expert_choice or the config.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "experiments/systems.hpp"

namespace writescope {

System make_writescope(const SystemContext& context) {
  const RooflineModel roofline = roofline_of(context);
  System system;
  system.expert_policy = context.options.writescope_experts;
  system.spills_to_both = true;
  system.vram_kv = context.profile.has_gpu;  // without a GPU its write policy keeps every block on the CPU
  system.kv_policy = [roofline](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<WriteScopeKVPolicy>(roofline, shape, cache);
  };
  if (system.expert_policy == "ktransformers")
    system.experts = std::make_shared<CpuExpertPolicy>();
  else if (system.expert_policy == "fiddler")
    system.experts = fiddler_experts(context);
  else if (system.expert_policy == "hybrimoe")
    system.experts = hybrimoe_experts(context);
  else
    throw std::invalid_argument("writescope: expert policy '" + system.expert_policy +
                                "' is not one of fiddler, ktransformers, hybrimoe");
  return system;
}

std::map<std::string, double> writescope_expert_estimates(const SystemContext& context) {
  const ModelConfig& c = context.model;
  const ExpertCosts costs = expert_costs_of(context);
  const RooflineModel roofline = roofline_of(context);
  const AttentionShape shape = c.attention();
  const VramUse fixed = fixed_vram_of(context);
  const double free_vram = std::max(0.0, static_cast<double>(context.vram_budget) - fixed.weights - fixed.workspace);
  const int moe_layers = c.layers - c.dense_layers;
  const double experts = c.experts, batch = context.batch;
  // Experts a step activates per layer, and tokens per activated expert.
  const double active = experts * (1 - std::pow(1 - c.experts_per_token / experts, batch));
  const double tokens = std::max(1, static_cast<int>(std::lround(batch * c.experts_per_token / active)));
  const double cpu = costs.cpu_seconds(static_cast<int>(tokens)), gpu = costs.gpu_seconds(static_cast<int>(tokens));
  const double loaded = costs.transfer_seconds() + gpu;
  const int prefetch = context.options.prefetch_experts > 0 ? context.options.prefetch_experts : c.experts_per_token;
  const double kv_per_layer =
      batch * context.context * static_cast<double>(shape.kv_bytes_per_token(sizeof(bf16)));

  std::map<std::string, double> estimates;
  for (const std::string& policy : expert_policy_names()) {
    const double slots =
        policy == "ktransformers"
            ? 0.0
            : std::min<double>(moe_layers * experts,
                               std::floor(free_vram / costs.expert_bytes) * context.options.expert_vram_share);
    const double resident = moe_layers > 0 && experts > 0 ? slots / (moe_layers * experts) : 0;
    double expert_seconds = active * cpu;  // ktransformers: every activated expert on the CPU
    if (policy == "fiddler") {
      // Resident ones on the GPU; each other one where it is cheaper.
      expert_seconds = cpu <= loaded ? std::max(resident * active * gpu, (1 - resident) * active * cpu)
                                     : resident * active * gpu + (1 - resident) * active * loaded;  // finite here
    }
    const double vram_kv = std::max(0.0, free_vram - slots * costs.expert_bytes) / c.layers;
    const StepBytes bytes{std::min(kv_per_layer, vram_kv), 0, std::max(0.0, kv_per_layer - vram_kv)};
    const SplitPrediction split = roofline.best_split(bytes, shape.fmas_per_byte(sizeof(bf16)), 0);
    double attention = split.step_seconds;
    if (policy == "hybrimoe") {
      // The greedy split balances the devices: the GPU takes m loaded experts beside its resident ones.
      const double others = (1 - resident) * active;
      const double m = std::clamp((others * cpu - resident * active * gpu) / (loaded + cpu), 0.0, others);
      expert_seconds = std::max(resident * active * gpu + (m > 0 ? m * loaded : 0.0), (others - m) * cpu);
      // Its prefetch copies the next layer's likely experts that are not cached beside that layer's
      // attention, sharing the link with its streamed KV (each at half the rate while both run);
      // what the attention does not hide, the experts wait for.
      if (costs.has_gpu && resident < 1) {
        const double copies = prefetch * (1 - resident) * costs.transfer_seconds();
        const double streamed_bytes = bytes.movable - split.cpu_movable_bytes;
        const double streamed = streamed_bytes > 0 ? streamed_bytes / (roofline.rates().link_gbps * 1e9) : 0.0;
        const double shared = std::min(copies, streamed);
        attention = std::max(split.gpu_seconds + shared, split.cpu_seconds);
        expert_seconds += std::max(0.0, copies + shared - attention);
      }
    }
    estimates[policy] = c.layers * attention + moe_layers * expert_seconds;
  }
  return estimates;
}

std::string writescope_expert_choice(const SystemContext& context) {
  const std::map<std::string, double> estimates = writescope_expert_estimates(context);
  std::string best;
  double best_seconds = std::numeric_limits<double>::infinity();
  for (const std::string& policy : expert_policy_names())
    if (estimates.at(policy) < best_seconds) best_seconds = estimates.at(policy), best = policy;
  return best;
}

}  // namespace writescope
