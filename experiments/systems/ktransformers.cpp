// KTransformers-style.
//
// The original (KTransformers, SOSP '25 line of work): attention, the router
// and shared experts on the GPU; routed experts on the CPU with AMX/AVX-512
// kernels from host memory; the GPU's shared experts run while the CPU computes
// the routed ones; the KV cache lives in VRAM.
// Kept: routed experts on the CPU, shared experts on the GPU at the same time
// (the model runs them on two threads in CUDA builds); the KV cache in VRAM up
// to the budget, the rest in one pinned region the GPU streams every step.
// Simplified: the CPU expert kernel is this project's bf16 AVX2 GEMV, not AMX;
// no CUDA graphs.
#include "experiments/systems.hpp"

namespace writescope {

System make_ktransformers(const SystemContext& context) {
  return first_fit_system("ktransformers", context, Region::gpu_streamed, true, std::make_shared<CpuExpertPolicy>());
}

}  // namespace writescope
