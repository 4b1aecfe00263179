#pragma once
// A machine profile for tests: this build's GPU (or none), round rates, and
// CPU attention rates (CpuResident's and the band's) for the tiny and the real
// model shapes.
#include "framework/roofline.hpp"
#include "framework/spaces.hpp"

namespace writescope::test {

inline MachineProfile tiny_profile() {
  MachineProfile p;
  p.name = "test";
  p.has_gpu = has_gpu;
  p.hbm_gbps = 1000;
  p.pinned_h2d_gbps = p.pinned_d2h_gbps = 20;
  p.pageable_h2d_gbps = p.pageable_d2h_gbps = 5;
  p.gpu_launch_latency_s = p.link_latency_s = 1e-5;
  p.cpu_threads = 2;
  p.cpu_dram_read_gbps = 20;
  p.cpu_fma_glanes = 100;
  p.cpu_launch_latency_s = 1e-6;
  p.cpu_expert_gbps = 15;
  p.cpu_expert_gflops = 100;
  for (const char* shape : {"tiny-qwen3-moe", "tiny-mixtral", "tiny-deepseek-v2", "qwen3-30b-a3b", "mixtral-8x7b",
                            "deepseek-v2-lite"}) {
    p.cpu_attention_gbps[shape] = {{1, 5}, {2, 10}};
    p.cpu_streamed_attention_gbps[shape] = {{1, 4}, {2, 8}};  // the band's token-major kernel, a little slower
  }
  return p;
}

}  // namespace writescope::test
