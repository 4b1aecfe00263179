// WriteScope (this project, DESIGN.md §2-4).
//
// KV blocks are written into the InplaceKVCache's four regions by the
// WriteScope scheduler, each decode step's attention is split along the
// sequence between the GPU (resident + streamed) and the CPU (in place) by the
// roofline model plus online feedback, and the partial results are merged by
// log-sum-exp. Experts follow a baseline's policy (SystemOptions::
// writescope_experts; the harness picks the strongest baseline of each
// setting), so that the comparison isolates the KV format and the split.
#include <stdexcept>

#include "experiments/systems.hpp"

namespace writescope {

System make_writescope(const SystemContext& context) {
  const RooflineModel roofline = roofline_of(context);
  System system;
  system.expert_policy = context.options.writescope_experts;
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

}  // namespace writescope
