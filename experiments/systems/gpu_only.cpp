// GPU-only, vLLM-like.
//
// The original: weights and a paged KV cache entirely in GPU memory; requests
// whose KV does not fit wait or are preempted.
// Kept: every weight, every routed expert and every KV block in VRAM;
// attention and experts on the GPU.
// Simplified: no paging or preemption. A run whose weights and KV exceed the
// VRAM budget is recorded as "does not fit" with the bytes it needs.
#include "experiments/systems.hpp"

namespace writescope {

System make_gpu_only(const SystemContext& context) {
  const RooflineModel roofline = roofline_of(context);
  System system;
  system.name = "gpu-only";
  system.expert_policy = "gpu-only";
  system.kv_policy = [roofline](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<FirstFitKVPolicy>(roofline, shape, cache, Region::gpu_resident);
  };
  system.experts = std::make_shared<GpuExpertPolicy>();
  return system;
}

}  // namespace writescope
