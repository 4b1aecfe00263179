#pragma once
// The WriteScope performance model (DESIGN.md §4): a machine profile, the
// roofline prediction of one decode step's attention on each device, the CPU
// share that minimises the step, and online estimates of the effective rates.
//
// Units: bytes, seconds, GB/s = 10^9 bytes per second, Glanes/s = 10^9 fp32
// lane-FMAs per second.

#include <map>
#include <string>

#include "framework/config.hpp"

namespace writescope {

/// Measured (writescope calibrate) or published figures of one machine.
struct MachineProfile {
  std::string name;
  bool has_gpu = true;
  double hbm_gbps = 0;              // device copy, read + written
  /// GPU decode attention over VRAM-resident KV, per attention shape name
  /// (writescope calibrate); shapes not listed use hbm_gbps.
  std::map<std::string, double> gpu_attention_gbps;
  double gpu_launch_latency_s = 0;  // fixed cost of the GPU share of a step
  /// The GPU's memory (gpu.memory, a byte size; calibrate: the device's
  /// total): no run's VRAM budget may exceed it. 0 where the profile does not say.
  std::uint64_t gpu_memory_bytes = 0;
  /// The GPU's fp32 lane-FMAs per second (10^9; gpu.fma_glanes, published):
  /// caps GPU attention at fma_glanes / (multiply-adds per KV byte) for the
  /// shapes without a measured gpu_attention_gbps (MLA's 15 per byte is
  /// compute-bound on a GPU too). 0 where the profile does not say.
  double gpu_fma_glanes = 0;
  double pinned_h2d_gbps = 0;
  double pinned_d2h_gbps = 0;
  double pageable_h2d_gbps = 0;
  double pageable_d2h_gbps = 0;
  double link_latency_s = 0;        // fixed cost of streaming in a step
  /// Bytes per streaming chunk: the smallest pinned H2D copy that reached 90%
  /// of pinned_h2d_gbps (writescope calibrate); 4 MiB where not measured.
  std::uint64_t link_chunk_bytes = std::uint64_t{4} << 20;
  int cpu_threads = 0;
  double cpu_dram_read_gbps = 0;
  /// The host kernels' instruction path (framework/cpu_path.hpp) the CPU
  /// figures were measured with; profiles written before paths existed: "avx2".
  std::string cpu_path = "avx2";
  /// Per attention shape name, the level the decode's AVX-512 products
  /// requested each next pass into while its CPU attention rates were
  /// measured ("l1", "l2"; attention/host_prefetch.hpp, measured per shape);
  /// empty in profiles that do not say.
  std::map<std::string, std::string> cpu_next_pass_prefetch;
  /// Per attention shape name, the tokens per pass the decode's AVX-512
  /// products took over token-major rows while its CPU attention rates were
  /// measured ("32", "64", "128"; measured per shape like the level), for the
  /// shapes whose products take one; empty in profiles that do not say.
  std::map<std::string, std::string> cpu_token_major_pass;
  /// Likewise their tokens per pass over head-major blocks, measured with the
  /// next-pass level, for the shapes whose products request it by level.
  std::map<std::string, std::string> cpu_head_major_pass;
  /// Per attention shape name, the CPU path the decode's products over
  /// head-major blocks took while its CPU attention rates were measured
  /// (cpu_path_name; measured per shape where both AVX-512 paths run, else the
  /// machine's); empty in profiles that do not say.
  std::map<std::string, std::string> cpu_decode_path;
  /// Likewise over token-major blocks, while cpu_streamed_attention_gbps was measured.
  std::map<std::string, std::string> cpu_streamed_decode_path;
  /// Multiply-adds per second (10^9) of that path's product instruction
  /// (8-lane fp32 FMA for avx2, 16-lane for avx512_fma, 32-pair vdpbf16ps for
  /// avx512_bf16).
  double cpu_fma_glanes = 0;
  double cpu_launch_latency_s = 0;  // fixed cost of the CPU share of a step
  /// The project's bf16 SwiGLU expert kernel on the host threads, from DRAM:
  /// weight bytes per second at one token, FLOP per second at 64 tokens.
  /// Profiles written before it was measured give OpenBLAS' float GEMV and
  /// GEMM rates (gemv_gbps, gemm_gflops) instead.
  double cpu_expert_gbps = 0;
  double cpu_expert_gflops = 0;
  /// CPU decode attention over CpuResident (head-major blocks in host
  /// memory), per attention shape name, per thread count.
  std::map<std::string, std::map<int, double>> cpu_attention_gbps;
  /// CPU decode attention over the pinned band (token-major blocks: the
  /// CpuStreamed share a step gives the CPU), likewise; shapes not listed
  /// (profiles measured before the band had its own rate) read the band at
  /// cpu_attention_gbps.
  std::map<std::string, std::map<int, double>> cpu_streamed_attention_gbps;
  /// Where each section's figures come from ("gpu", "link", "cpu" -> e.g.
  /// "measured by writescope calibrate", "published: datasheet ...",
  /// "assumed: ..."), so that a projection says what it rests on.
  std::map<std::string, std::string> sources;
  /// sources[section], or "not stated".
  std::string source_of(const std::string& section) const;

  /// Reads and validates a profile; errors name the file and the field.
  static MachineProfile load(const std::string& path);
  static MachineProfile from_config(const ConfigNode& root);
  std::string to_yaml() const;
  /// Writes atomically (temporary file + rename), so a profile is never half
  /// written; through symbolic links to their target. A device, pipe or folder
  /// at `path` is an error, not replaced.
  void save(const std::string& path) const;

  /// CPU attention GB/s for `shape` at `threads` (the largest measured thread
  /// count not above it, else the smallest); throws std::out_of_range naming
  /// the shape when it was not measured.
  double cpu_attention(const std::string& shape, int threads) const;
  /// CPU attention GB/s over the pinned band for `shape` at `threads`, chosen
  /// the same way from cpu_streamed_attention_gbps, else cpu_attention.
  double cpu_streamed_attention(const std::string& shape, int threads) const;
  /// GPU decode attention GB/s over VRAM-resident KV for `shape` (hbm_gbps when not measured).
  double gpu_attention(const std::string& shape) const;
};

/// Rates the model computes with, for one attention shape.
struct ModelRates {
  bool has_gpu = true;
  double hbm_gbps = 0;  // GPU attention over VRAM-resident KV
  double link_gbps = 0;
  double cpu_attention_gbps = 0;           // over CpuResident (head-major)
  double cpu_streamed_attention_gbps = 0;  // over the pinned band (token-major)
  double cpu_fma_glanes = 0;
  double gpu_latency_s = 0;
  double link_latency_s = 0;
  double cpu_latency_s = 0;

  /// `fmas_per_byte`: the shape's lane-FMAs per KV byte (AttentionShape::fmas_per_byte), for the GPU's
  /// compute cap; 0: none.
  static ModelRates from_profile(const MachineProfile& profile, const std::string& shape, int threads,
                                 double fmas_per_byte = 0);
};

/// KV bytes of one step (one layer, the whole batch) by where they live.
struct StepBytes {
  double gpu_resident = 0;  // VRAM: GPU only
  double cpu_resident = 0;  // host memory: CPU only
  double movable = 0;       // pinned band: streamed by the GPU or read in place by the CPU
  double total() const { return gpu_resident + cpu_resident + movable; }
};

struct SplitPrediction {
  double cpu_movable_bytes = 0;  // the band's bytes given to the CPU
  double alpha = 0;              // CPU share of all the step's KV bytes
  double gpu_seconds = 0;
  double cpu_seconds = 0;
  double step_seconds = 0;
};

class RooflineModel {
 public:
  explicit RooflineModel(const ModelRates& rates) : rates_(rates) {}

  const ModelRates& rates() const noexcept { return rates_; }
  ModelRates& rates() noexcept { return rates_; }

  /// GPU share: resident bytes at HBM speed plus streamed bytes at link speed, plus latencies.
  double gpu_seconds(double resident_bytes, double streamed_bytes) const;
  /// The CPU's attention read time: `resident_bytes` (CpuResident's,
  /// head-major) at cpu_attention_gbps plus `band_bytes` (token-major) at
  /// cpu_streamed_attention_gbps.
  double cpu_attention_seconds(double resident_bytes, double band_bytes) const;
  /// CPU share: max(resident bytes / resident attention bandwidth + band
  /// bytes / band attention bandwidth, FMAs / FMA peak) + latency + the CPU's
  /// expert work in the same phase. `resident_bytes` are CpuResident's
  /// (head-major), `band_bytes` token-major (the band, or on a machine
  /// without a GPU also GpuResident's).
  double cpu_seconds(double resident_bytes, double band_bytes, double fmas_per_byte, double expert_seconds) const;

  /// The step with `cpu_movable_bytes` of the band on the CPU.
  SplitPrediction predict(const StepBytes& bytes, double cpu_movable_bytes, double fmas_per_byte,
                          double expert_seconds) const;
  /// The CPU share of the band that minimises the step (the devices finish
  /// together where they can; else the band goes wholly to one side).
  SplitPrediction best_split(const StepBytes& bytes, double fmas_per_byte, double expert_seconds) const;

 private:
  ModelRates rates_;
};

/// EWMA estimate of an effective rate with outlier rejection. A sample further
/// than `outlier_ratio` from the estimate (either way) is held back; once
/// `confirmations` consecutive samples agree on the same side, the estimate
/// jumps to their mean (a real drift, such as the CPU slowing down under
/// expert work), so the plan follows within that many samples: the
/// scheduler takes one per layer (and micro-batch) of a step, not one per step.
class RateEstimator {
 public:
  explicit RateEstimator(double initial, double weight = 0.3, double outlier_ratio = 1.5, int confirmations = 3);
  void observe(double rate);
  /// Moves the estimate `weight` of the way to `target` (a device left
  /// untimed drifts back towards its profile).
  void relax(double target, double weight) { value_ += weight * (target - value_); }
  double value() const noexcept { return value_; }

 private:
  double value_, weight_, outlier_ratio_;
  int confirmations_;
  int pending_side_ = 0;  // -1 below, +1 above, 0 none
  int pending_count_ = 0;
  double pending_sum_ = 0;
};

}  // namespace writescope
