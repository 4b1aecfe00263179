#pragma once
// Model rates of an imaginary machine for scheduler and roofline tests.
#include "framework/roofline.hpp"

namespace writescope::test {

/// HBM 3000 GB/s, the given link and CPU attention bandwidths (the CPU's the
/// same over both block orders), no latencies, no FMA limit.
inline ModelRates synthetic_rates(double link_gbps, double cpu_gbps) {
  ModelRates r;
  r.hbm_gbps = 3000;
  r.link_gbps = link_gbps;
  r.cpu_attention_gbps = cpu_gbps;
  r.cpu_streamed_attention_gbps = cpu_gbps;
  return r;
}

}  // namespace writescope::test
