// WriteScope's scheduled split against its alternatives on the same kernels
// (DESIGN.md §4): one sequence of 8K-128K tokens written by the scheduler's
// write policy into the movable band (decode placement: CpuStreamed and
// GpuStreamed, token-major pinned blocks that either device can read), then a
// decode loop of plan -> split step -> feedback. The alternatives read the
// same cache: the whole band streamed to the GPU (GPU-streaming only) and the
// whole band read in place by the CPU (CPU only). All three report the same
// statistic: the mean step time over the same number of steps after one
// warm-up step; WriteScope's step includes its plan and its feedback, costs
// the fixed alternatives do not have. Counters: GB/s of KV per step, speedups over both
// alternatives, the model's mean relative prediction error, final alpha and
// the alpha the model started from. On host-only builds the "GPU" share runs
// on the host, so the figures exercise the machinery but say nothing about a GPU.
#include <Kokkos_Timer.hpp>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>

#include "attention/scheduler.hpp"
#include "bounds.hpp"

namespace writescope {
namespace {

constexpr std::int64_t write_chunk = 4096;

ModelRates measured_rates(const AttentionShape& shape) {
  ModelRates r;
  r.has_gpu = has_gpu;
#ifdef KOKKOS_ENABLE_CUDA
  r.hbm_gbps = bench::hbm_copy_gbps();
  r.link_gbps = bench::pinned_h2d_gbps();
#else
  r.hbm_gbps = r.link_gbps = bench::host_dram_read_gbps();
#endif
  r.cpu_attention_gbps = measure_cpu_attention_gbps(shape, BlockOrder::head_major, 8192);
  r.cpu_streamed_attention_gbps = measure_cpu_attention_gbps(shape, BlockOrder::token_major, 8192);
  return r;
}

constexpr int measured_steps = 20;

/// Mean step time of `plan` over `measured_steps` steps after one warm-up step.
double mean_step(SplitDecode<bf16>& split, const InplaceKVCache<bf16>& cache, const SplitPlan& plan,
                 const Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace>& queries,
                 const PartialState<GpuMemSpace>& out) {
  split.run(cache, queries, plan, out);
  double total = 0;
  for (int r = 0; r < measured_steps; ++r) total += split.run(cache, queries, plan, out).step_seconds;
  return total / measured_steps;
}

void scheduled_decode(benchmark::State& state, AttentionShape shape) {
  const std::int64_t tokens = state.range(0);
  const BlockGeometry g = shape.block_geometry(256);
  const auto blocks = static_cast<std::uint64_t>((tokens + 255) / 256);
  const std::uint64_t bytes = blocks * static_cast<std::uint64_t>(g.block_elements()) * sizeof(bf16);
  InplaceKVCache<bf16> cache(KVCacheShape{1, g}, KVCacheBudgets{0, bytes, bytes}, BudgetPolicy::strict);
  const RooflineModel model(measured_rates(shape));
  WriteScopeScheduler<bf16> scheduler(model, shape, cache);
  const int sequence = cache.add_sequence();
  {
    Kokkos::View<bf16***, Kokkos::LayoutRight, HostMemSpace> keys("writescope::benchmarks::keys", write_chunk,
                                                                 g.kv_heads, g.key_dim);
    Kokkos::deep_copy(keys, bf16{0x3c00});  // 0.0078125: content does not change the timing
    for (std::int64_t written = 0; written < tokens; written += write_chunk) {
      const std::int64_t count = std::min(write_chunk, tokens - written);
      const auto range = std::make_pair(std::int64_t{0}, count);
      const auto view = Kokkos::subview(keys, range, Kokkos::ALL, Kokkos::ALL);
      cache.append<HostExecSpace, HostMemSpace>(HostExecSpace(), 0, sequence, view, view,
                                                scheduler.place(0, sequence, count, tokens, true));
    }
  }
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> queries("writescope::benchmarks::queries", 1,
                                                                    shape.q_heads, shape.key_dim);
  Kokkos::deep_copy(queries, 0.05f);
  PartialState<GpuMemSpace> out("writescope::benchmarks::out", 1, shape.q_heads, shape.value_dim);
  SplitDecode<bf16> split(shape, g, 16);
  const std::vector<TokenRange> range{{0, tokens}};
  SplitPrediction first;
  split.run(cache, queries, scheduler.plan(0, {sequence}, range, &first), out);  // warm-up
  double total = 0, error = 0, alpha = 0;
  for (auto _ : state) {
    SplitPrediction predicted;
    const Kokkos::Timer step;  // split.run returns fenced
    const SplitPlan plan = scheduler.plan(0, {sequence}, range, &predicted);
    const SplitTimings measured = split.run(cache, queries, plan, out);
    scheduler.observe(plan, measured);
    const double seconds = step.seconds();
    state.SetIterationTime(seconds);
    total += seconds;
    error += std::abs(predicted.step_seconds - measured.step_seconds) / measured.step_seconds;
    alpha = predicted.alpha;
  }
  const double steps = static_cast<double>(state.iterations());

  // The alternatives, on the same cache: the whole band on one device.
  const std::vector<BlockSegment> cpu_band = cache.segments(0, Region::cpu_streamed, {sequence}, range),
                                  gpu_band = cache.segments(0, Region::gpu_streamed, {sequence}, range);
  std::vector<BlockSegment> band = cpu_band;
  band.insert(band.end(), gpu_band.begin(), gpu_band.end());
  std::sort(band.begin(), band.end(), [](const BlockSegment& a, const BlockSegment& b) { return a.position < b.position; });
  SplitPlan streaming_only, cpu_only;
  streaming_only.gpu_streamed = band;
  cpu_only.cpu_pinned = band;
  const double streaming_seconds = mean_step(split, cache, streaming_only, queries, out);
  const double cpu_seconds = mean_step(split, cache, cpu_only, queries, out);

  const double writescope_seconds = total / steps;
  const double kv_bytes = static_cast<double>(tokens) * static_cast<double>(shape.kv_bytes_per_token(sizeof(bf16)));
  state.counters["GB/s"] = kv_bytes / writescope_seconds / 1e9;
  state.counters["speedup_vs_gpu_streaming"] = streaming_seconds / writescope_seconds;
  state.counters["speedup_vs_cpu_only"] = cpu_seconds / writescope_seconds;
  state.counters["prediction_error"] = error / steps;
  state.counters["alpha_start"] = first.alpha;
  state.counters["alpha_end"] = alpha;
}

// One cache, read every step: contexts whose KV (Qwen3: 2 KiB a token, 256
// and 512 MiB) is larger than the largest last-level cache at hand (105 MiB,
// the GPU machine's host), as the model's rates (calibrated from DRAM)
// assume; at 32K (64 MiB) the step partly read the L3.
BENCHMARK_CAPTURE(scheduled_decode, qwen3_gqa, qwen3_30b_a3b_attention())
    ->Arg(131072)->Arg(262144)->Iterations(measured_steps)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace writescope
