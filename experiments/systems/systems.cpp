#include <algorithm>
#include <stdexcept>

#include "experiments/systems.hpp"

namespace writescope {

const std::vector<std::string>& system_names() {
  static const std::vector<std::string> names{"writescope", "fiddler",  "ktransformers",
                                              "moe-lightning", "hybrimoe", "gpu-only"};
  return names;
}

const std::vector<std::string>& expert_policy_names() {
  static const std::vector<std::string> names{"fiddler", "ktransformers", "hybrimoe"};
  return names;
}

System make_system(const std::string& name, const SystemContext& context) {
  if (name == "writescope") return make_writescope(context);
  if (name == "fiddler") return make_fiddler(context);
  if (name == "ktransformers") return make_ktransformers(context);
  if (name == "moe-lightning") return make_moe_lightning(context);
  if (name == "hybrimoe") return make_hybrimoe(context);
  if (name == "gpu-only") return make_gpu_only(context);
  std::string known;
  for (const std::string& n : system_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown system '" + name + "' (known: " + known + ")");
}

System first_fit_system(const std::string& name, const SystemContext& context, Region spill, bool use_vram,
                        std::shared_ptr<ExpertPolicy> experts) {
  const RooflineModel roofline = roofline_of(context);
  System system;
  system.expert_policy = name;
  if (spill != Region::gpu_resident) system.spill_region = spill;
  system.kv_policy = [roofline, spill, use_vram](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<FirstFitKVPolicy>(roofline, shape, cache, spill, use_vram);
  };
  system.experts = std::move(experts);
  return system;
}

RooflineModel roofline_of(const SystemContext& context) {
  const AttentionShape shape = context.model.attention();
  return RooflineModel(ModelRates::from_profile(context.profile, shape.name, context.profile.cpu_threads,
                                                shape.fmas_per_byte(sizeof(bf16))));
}

VramUse fixed_vram_of(const SystemContext& context) {
  ModelOptions options;
  options.vram_budget = context.vram_budget;
  options.block_tokens = context.block_tokens;
  options.max_rows = std::max(context.batch, context.max_rows);
  options.stream_chunk_blocks = context.stream_chunk_blocks;
  return MoeModel::fixed_vram(context.model, options);
}

ExpertCosts expert_costs_of(const SystemContext& context) {
  const ModelConfig& c = context.model;
  const MachineProfile& p = context.profile;
  ExpertCosts costs;
  costs.expert_bytes = static_cast<double>(MoeModel::expert_bytes(c));
  costs.flops_per_token = 6.0 * c.hidden * c.expert_intermediate;
  costs.cpu_expert_gbps = p.cpu_expert_gbps;
  costs.cpu_expert_gflops = p.cpu_expert_gflops;
  costs.hbm_gbps = p.hbm_gbps;
  costs.link_gbps = context.experts_pinned ? p.pinned_h2d_gbps : p.pageable_h2d_gbps;
  costs.link_latency_s = p.link_latency_s;
  costs.has_gpu = p.has_gpu;
  return costs;
}

}  // namespace writescope
