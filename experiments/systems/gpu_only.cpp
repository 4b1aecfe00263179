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
  return first_fit_system("gpu-only", context, Region::gpu_resident, true, std::make_shared<GpuExpertPolicy>());
}

}  // namespace writescope
