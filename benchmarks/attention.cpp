// Decode attention over InplaceKVCache regions, in GB/s of KV read and as a
// fraction of the bound measured in the same process (bounds.hpp):
//   CPU in place (CpuResident head-major, CpuStreamed token-major) vs host DRAM read;
//   GPU in place (GpuResident) vs device memory bandwidth, on CUDA builds.
// One sequence of 8K, 32K or 128K tokens, bf16 KV, one layer, in rotated
// copies that together exceed the last-level cache. CPU figures also carry the
// compute ceiling of the instruction path that runs (its multiply-add peak /
// multiply-adds per KV byte; the label names the path) and
// fraction_of_roofline = GB/s / min(DRAM read, that ceiling), both bounds the
// best of five right after the timed iterations; and the same against both
// rates sampled between the iterations (fraction_of_sampled_roofline): what
// the machine gave while the kernel ran, where a shared machine's rates drift.
// cpu_decode_from_cache runs the same products over KV that stays in the
// last-level cache, against the compute ceiling alone: the kernel's efficiency
// apart from DRAM; cpu_decode_small_step the same over steps of 256 or 1024
// tokens, where the step's own work and how it spreads over the threads count.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>

#include "attention/decode.hpp"
#include "attention/host_prefetch.hpp"
#include "attention/split.hpp"
#include "bounds.hpp"
#include "framework/concurrent.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_memory.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

template <class PoolSpace>
using PoolOf = const Kokkos::View<bf16**, Kokkos::LayoutRight, PoolSpace>& (InplaceKVCache<bf16>::*)() const;

/// The step the decode benchmarks time: one query's decode attention over
/// the next of `caches` (rotated copies, or one cache), its KV read by
/// ExecSpace from each cache's `pool`.
template <class ExecSpace, class PoolSpace>
class DecodeStep {
 public:
  using MemSpace = typename ExecSpace::memory_space;
  /// `gpu_most_warps`: the GPU team kernel's warps at most (DecodeWorkspace).
  DecodeStep(const AttentionShape& shape, Region region, const bench::RotatedCaches& caches, PoolOf<PoolSpace> pool,
             int gpu_most_warps = max_gpu_decode_warps)
      : shape_(shape),
        region_(region),
        caches_(caches),
        pool_(pool),
        queries_("writescope::benchmarks::queries", 1, shape.q_heads, shape.key_dim),
        out_("writescope::benchmarks::out", 1, shape.q_heads, shape.value_dim) {
    Kokkos::deep_copy(queries_, 0.05f);
    workspace_.gpu_most_warps = gpu_most_warps;
  }
  void operator()(const ExecSpace& space) {
    const int c = next_++ % caches_.copies();
    const InplaceKVCache<bf16>& cache = *caches_.caches[c];
    decode_attention<ExecSpace, bf16, PoolSpace>(space, shape_, cache.geometry(), block_order(region_), queries_,
                                                 (cache.*pool_)(), caches_.segments[c], workspace_, out_);
  }
  /// What the last step's host product ran: "avx512_bf16, next pass into l2",
  /// and where measured, its tokens per pass: "..., passes of 32 tokens".
  std::string host_label() const {
    std::string label = std::string(cpu_path_name(workspace_.host_path)) + ", next pass into " +
                        prefetch_level_name(workspace_.host_next_pass);
    if (workspace_.host_pass > 0)
      label += ", passes of " + std::to_string(workspace_.host_pass) + " tokens";
    return label;
  }

 private:
  AttentionShape shape_;
  Region region_;
  const bench::RotatedCaches& caches_;
  PoolOf<PoolSpace> pool_;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries_;
  PartialState<MemSpace> out_;
  DecodeWorkspace<MemSpace> workspace_;
  int next_ = 0;
};

/// `memory_bound()`: the memory bound in GB/s, called right after the timed
/// iterations (the host's DRAM read is measured afresh there: a shared
/// machine's rates drift between benchmarks; the GPU's HBM rate, of a device
/// the process has to itself, once per process).
/// `gpu_most_warps`: as DecodeStep's.
template <class ExecSpace, class PoolSpace, class MemoryBound>
void decode(benchmark::State& state, const AttentionShape& shape, Region region, PoolOf<PoolSpace> pool,
            MemoryBound memory_bound, int gpu_most_warps = max_gpu_decode_warps) {
  const std::int64_t tokens = state.range(0);
  const double kv_bytes = bench::kv_bytes(shape, tokens);
  const bench::RotatedCaches rotated = bench::rotated_caches(shape, region, tokens);
  const int copies = rotated.copies();
  DecodeStep<ExecSpace, PoolSpace> run(shape, region, rotated, pool, gpu_most_warps);
  const ExecSpace space;
  run(space);  // warm-up: workspace allocation, first touch of scratch
  // Counters common to both spaces; returns GB/s.
  auto report = [&](double total) {
    const double gbps = kv_bytes * static_cast<double>(state.iterations()) / total / 1e9;
    const double bound_gbps = memory_bound();
    state.SetBytesProcessed(static_cast<std::int64_t>(kv_bytes) * state.iterations());
    state.counters["GB/s"] = gbps;
    state.counters["bound_GB/s"] = bound_gbps;
    state.counters["fraction_of_bound"] = gbps / bound_gbps;
    if constexpr (std::is_same_v<ExecSpace, HostExecSpace>) state.counters["threads"] = space.concurrency();
    state.counters["kv_copies"] = copies;
    return gbps;
  };
  if constexpr (std::is_same_v<ExecSpace, HostExecSpace>) {
    // The ceiling of the instruction path the product runs on (its
    // multiply-adds per second, measured right after the kernel and sampled
    // while it ran) over the shape's multiply-adds per KV byte (QK^T and P.V
    // for each query head of a group).
    const CpuPath path = decode_product_path(shape, block_order(region));
    state.SetLabel(run.host_label());
    HostRateSampler sampler(path);
    const double gbps = report(bench::run_sampled_iterations(state, space, run, sampler));
    const double bound_gbps = state.counters["bound_GB/s"];
    const double compute_bound = measure_host_product_gmacs(path) / shape.fmas_per_byte(sizeof(bf16));
    state.counters["compute_bound_GB/s"] = compute_bound;
    state.counters["fraction_of_compute_bound"] = gbps / compute_bound;
    state.counters["fraction_of_roofline"] = gbps / std::min(bound_gbps, compute_bound);
    bench::report_sampled_roofline(state, gbps, sampler, shape.fmas_per_byte(sizeof(bf16)));
  } else {
    const double gbps = report(bench::run_fenced_iterations(state, space, run));
#ifdef KOKKOS_ENABLE_CUDA
    // The GPU kernel's products are fp32 FMAs on widened bf16: MLA (15 per byte) may be bound by them.
    const double compute_bound = bench::gpu_fp32_fma_gmacs() / shape.fmas_per_byte(sizeof(bf16));
    state.counters["compute_bound_GB/s"] = compute_bound;
    state.counters["fraction_of_roofline"] = gbps / std::min(state.counters["bound_GB/s"].value, compute_bound);
#endif
  }
}

void cpu_decode(benchmark::State& state, AttentionShape shape, Region region) {
  auto dram_read = [] { return measure_host_dram_read_gbps(); };
  if (region == Region::cpu_resident)
    decode<HostExecSpace, HostMemSpace>(state, shape, region, &InplaceKVCache<bf16>::host_pool, dram_read);
  else
    decode<HostExecSpace, PinnedMemSpace>(state, shape, region, &InplaceKVCache<bf16>::pinned_pool, dram_read);
}

/// At most a quarter of the smallest L3 at hand (32 MiB): where the system
/// reports a socket's or a host's L3 (532 MB on the Intel VM), a quarter of it
/// ran partly from DRAM (docs/cpu-kernels-log.md). A step over it still takes
/// 0.2 ms or more, so that its launches and merge stay a few percent.
constexpr std::int64_t from_cache_bytes = std::int64_t{8} << 20;

/// The host products over KV that stays in the last-level cache: one cache
/// of `tokens` tokens, or (0) of whole blocks filling a quarter of the LLC up
/// to from_cache_bytes, not rotated, with only the product
/// rate and the L2 read of a HostProductSampler sampled between iterations (a
/// DRAM read would evict the KV). Its fraction of the compute roof is the
/// kernel's own efficiency, apart from DRAM; cpu_decode's figures set against
/// it show what feeding the product from DRAM costs.
template <class PoolSpace>
void from_cache(benchmark::State& state, const AttentionShape& shape, Region region, PoolOf<PoolSpace> pool,
                std::int64_t tokens) {
  const HostExecSpace space;
  const std::int64_t llc = last_level_cache_bytes();
  if (tokens == 0)
    tokens = calibration_block_tokens *
             std::max<std::int64_t>(
                 1, static_cast<std::int64_t>(static_cast<double>(std::min(llc / 4, from_cache_bytes)) /
                                              bench::kv_bytes(shape, calibration_block_tokens)));
  bench::RotatedCaches one;
  one.caches.push_back(filled_cache(shape, region, tokens));
  one.segments.push_back(one.caches[0]->segments(0, region, {0}, {TokenRange{0, tokens}}));
  DecodeStep<HostExecSpace, PoolSpace> run(shape, region, one, pool);
  run(space);  // warm-up: workspace allocation, the KV into the cache
  const CpuPath path = decode_product_path(shape, block_order(region));
  state.SetLabel(run.host_label());
  HostProductSampler sampler(path);
  const double total = bench::run_sampled_iterations(state, space, run, sampler);
  const double kv_bytes = bench::kv_bytes(shape, tokens);
  const double gbps = kv_bytes * static_cast<double>(state.iterations()) / total / 1e9;
  const double multiply_adds_per_byte = shape.fmas_per_byte(sizeof(bf16));
  const double compute_bound = measure_host_product_gmacs(path) / multiply_adds_per_byte;
  const double sampled_compute_bound = sampler.product_gmacs() / multiply_adds_per_byte;
  state.SetBytesProcessed(static_cast<std::int64_t>(kv_bytes) * state.iterations());
  state.counters["GB/s"] = gbps;
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["llc_bytes"] = static_cast<double>(llc);
  state.counters["compute_bound_GB/s"] = compute_bound;
  state.counters["fraction_of_compute_bound"] = gbps / compute_bound;
  state.counters["sampled_compute_bound_GB/s"] = sampled_compute_bound;
  state.counters["fraction_of_sampled_compute_bound"] = gbps / sampled_compute_bound;
  state.counters["rate_samples"] = sampler.samples();
  state.counters["threads"] = space.concurrency();
  bench::report_sampled_l2(state, sampler);
}

void decode_from_cache(benchmark::State& state, const AttentionShape& shape, Region region, std::int64_t tokens) {
  if (region == Region::cpu_resident)
    from_cache<HostMemSpace>(state, shape, region, &InplaceKVCache<bf16>::host_pool, tokens);
  else from_cache<PinnedMemSpace>(state, shape, region, &InplaceKVCache<bf16>::pinned_pool, tokens);
}

void cpu_decode_from_cache(benchmark::State& state, AttentionShape shape, Region region) {
  decode_from_cache(state, shape, region, 0);
}

/// Steps of state.range(0) tokens from the cache: a block or a few, as a
/// layer's CPU share of a short sequence.
void cpu_decode_small_step(benchmark::State& state, AttentionShape shape, Region region) {
  decode_from_cache(state, shape, region, state.range(0));
}

#define WRITESCOPE_FROM_CACHE_BENCHMARK(name, ...)                                                             \
  BENCHMARK_CAPTURE(cpu_decode_from_cache, name, __VA_ARGS__)->UseManualTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK_CAPTURE(cpu_decode_small_step, name, __VA_ARGS__)                                                  \
      ->Arg(256)                                                                                               \
      ->Arg(1024)                                                                                              \
      ->UseManualTime()                                                                                        \
      ->Unit(benchmark::kMicrosecond)
WRITESCOPE_FROM_CACHE_BENCHMARK(qwen3_gqa_cpu_resident, qwen3_30b_a3b_attention(), Region::cpu_resident);
WRITESCOPE_FROM_CACHE_BENCHMARK(qwen3_gqa_cpu_streamed, qwen3_30b_a3b_attention(), Region::cpu_streamed);
WRITESCOPE_FROM_CACHE_BENCHMARK(mixtral_gqa_cpu_resident, mixtral_8x7b_attention(), Region::cpu_resident);
WRITESCOPE_FROM_CACHE_BENCHMARK(deepseek_mla_cpu_resident, deepseek_v2_lite_mla_attention(), Region::cpu_resident);
WRITESCOPE_FROM_CACHE_BENCHMARK(deepseek_mla_cpu_streamed, deepseek_v2_lite_mla_attention(), Region::cpu_streamed);
#undef WRITESCOPE_FROM_CACHE_BENCHMARK

#define WRITESCOPE_DECODE_BENCHMARK(function, name, ...)                                      \
  BENCHMARK_CAPTURE(function, name, __VA_ARGS__)                                               \
      ->Arg(8192)->Arg(32768)->Arg(131072)->UseManualTime()->Unit(benchmark::kMillisecond)

WRITESCOPE_DECODE_BENCHMARK(cpu_decode, qwen3_gqa_cpu_resident, qwen3_30b_a3b_attention(), Region::cpu_resident);
WRITESCOPE_DECODE_BENCHMARK(cpu_decode, qwen3_gqa_cpu_streamed, qwen3_30b_a3b_attention(), Region::cpu_streamed);
WRITESCOPE_DECODE_BENCHMARK(cpu_decode, mixtral_gqa_cpu_resident, mixtral_8x7b_attention(), Region::cpu_resident);
WRITESCOPE_DECODE_BENCHMARK(cpu_decode, deepseek_mla_cpu_resident, deepseek_v2_lite_mla_attention(),
                            Region::cpu_resident);
WRITESCOPE_DECODE_BENCHMARK(cpu_decode, deepseek_mla_cpu_streamed, deepseek_v2_lite_mla_attention(),
                            Region::cpu_streamed);

/// Split steps over copies of one band taken in turn (rotated_caches), so that
/// every step reads its KV from DRAM: `plan_of(blocks)` splits a copy's blocks.
class RotatedSplitSteps {
 public:
  RotatedSplitSteps(const AttentionShape& shape, std::int64_t tokens, SplitDecode<bf16>& split)
      : rotated_(rotated_caches(shape, Region::gpu_streamed, tokens)),
        split_(split),
        queries_("writescope::benchmarks::queries", 1, shape.q_heads, shape.key_dim),
        out_("writescope::benchmarks::split_out", 1, shape.q_heads, shape.value_dim) {
    Kokkos::deep_copy(queries_, 0.05f);
  }
  /// Every copy's blocks, in order (the copies are alike).
  const std::vector<BlockSegment>& blocks() const { return rotated_.segments.front(); }
  int copies() const { return rotated_.copies(); }
  double block_bytes() const { return static_cast<double>(rotated_.caches.front()->block_bytes()); }

  template <class PlanOf>
  SplitTimings run(PlanOf plan_of) {
    const int copy = next_++ % rotated_.copies();
    return split_.run(*rotated_.caches[copy], queries_, plan_of(rotated_.segments[copy]), out_);
  }
  /// Mean step time over `runs` runs.
  template <class PlanOf>
  double mean_step_seconds(PlanOf plan_of, int runs) {
    double total = 0;
    for (int r = 0; r < runs; ++r) total += run(plan_of).step_seconds;
    return total / runs;
  }

 private:
  RotatedCaches rotated_;
  SplitDecode<bf16>& split_;
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> queries_;
  PartialState<GpuMemSpace> out_;
  int next_ = 0;
};

/// One step split at a CPU share of range(1) percent over a sequence whose
/// blocks all sit in the movable band (pinned): the GPU streams the first
/// blocks, the CPU attends the rest in place, at the same time on CUDA builds
/// (one after the other on host-only builds, where both shares use the host).
/// The bound, measured in this process: where the shares overlap, the sum of
/// the two paths' rates, each alone over the whole band, but at most the
/// host's DRAM read (both read the band from it); one after the other (a
/// host-only build), the rate at which the two alone would read their shares
/// in turn.
/// Every step reads the next of copies of the band adding up to 512 MiB.
void split_decode(benchmark::State& state, AttentionShape shape) {
  const std::int64_t tokens = state.range(0);
  const double cpu_share = static_cast<double>(state.range(1)) / 100.0;
  SplitDecode<bf16> split(shape, shape.block_geometry(calibration_block_tokens), 16);
  RotatedSplitSteps steps(shape, tokens, split);
  const auto cut =
      static_cast<std::ptrdiff_t>(std::llround((1.0 - cpu_share) * static_cast<double>(steps.blocks().size())));
  const auto split_at_cut = [cut](const std::vector<BlockSegment>& blocks) {
    SplitPlan plan;
    plan.gpu_streamed.assign(blocks.begin(), blocks.begin() + cut);
    plan.cpu_pinned.assign(blocks.begin() + cut, blocks.end());
    return plan;
  };
  const double kv_bytes = bench::kv_bytes(shape, tokens);
  // Each path alone over the whole band (warm-up run first).
  const auto gpu_alone = [](const std::vector<BlockSegment>& blocks) {
    SplitPlan plan;
    plan.gpu_streamed = blocks;
    return plan;
  };
  const auto cpu_alone = [](const std::vector<BlockSegment>& blocks) {
    SplitPlan plan;
    plan.cpu_pinned = blocks;
    return plan;
  };
  constexpr int alone_runs = 5;
  steps.mean_step_seconds(gpu_alone, 1);
  const double gpu_path_alone_gbps = kv_bytes / steps.mean_step_seconds(gpu_alone, alone_runs) / 1e9;
  steps.mean_step_seconds(cpu_alone, 1);
  const double cpu_path_alone_gbps = kv_bytes / steps.mean_step_seconds(cpu_alone, alone_runs) / 1e9;

  steps.run(split_at_cut);  // warm-up: workspaces
  double total = 0, gpu = 0, cpu = 0;
  for (auto _ : state) {
    const SplitTimings t = steps.run(split_at_cut);
    state.SetIterationTime(t.step_seconds);
    total += t.step_seconds;
    gpu += t.gpu_seconds;
    cpu += t.cpu_seconds;
  }
  const double n = static_cast<double>(state.iterations());
  const double gbps = kv_bytes * n / total / 1e9;
  const auto gpu_blocks = static_cast<double>(cut);
  const auto cpu_blocks = static_cast<double>(steps.blocks().size()) - gpu_blocks;
  state.counters["cpu_share"] = cpu_share;
  state.counters["GB/s"] = gbps;
  if (gpu_blocks > 0) state.counters["gpu_path_GB/s"] = steps.block_bytes() * gpu_blocks * n / gpu / 1e9;
  if (cpu_blocks > 0) state.counters["cpu_path_GB/s"] = steps.block_bytes() * cpu_blocks * n / cpu / 1e9;
  state.counters["kv_copies"] = steps.copies();
  state.counters["gpu_path_alone_GB/s"] = gpu_path_alone_gbps;
  state.counters["cpu_path_alone_GB/s"] = cpu_path_alone_gbps;
  state.counters["sum_bound_GB/s"] = gpu_path_alone_gbps + cpu_path_alone_gbps;
  const double dram_read = bench::host_dram_read_gbps();
  state.counters["host_dram_read_GB/s"] = dram_read;
  const double bound = gpu_worker_thread()
                           ? std::min(gpu_path_alone_gbps + cpu_path_alone_gbps, dram_read)
                           : 1.0 / ((1.0 - cpu_share) / gpu_path_alone_gbps + cpu_share / cpu_path_alone_gbps);
  state.counters["bound_GB/s"] = bound;
  state.counters["fraction_of_bound"] = gbps / bound;
}
BENCHMARK_CAPTURE(split_decode, qwen3_gqa_band, qwen3_30b_a3b_attention())
    ->ArgsProduct({{32768, 131072}, {0, 25, 50, 75, 100}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

#ifdef KOKKOS_ENABLE_CUDA
/// range(1): the team kernel's warps at most (16: its rule; fewer, for the
/// next GPU session to measure against it), counter `team_warps`.
void gpu_decode(benchmark::State& state, AttentionShape shape) {
  const int most_warps = static_cast<int>(state.range(1));
  decode<GpuExecSpace, GpuMemSpace>(
      state, shape, Region::gpu_resident, &InplaceKVCache<bf16>::vram_pool, [] { return bench::hbm_copy_gbps(); },
      most_warps);
  state.counters["team_warps"] = gpu_decode_team(shape, calibration_block_tokens, most_warps).team_size;
}
#define WRITESCOPE_GPU_DECODE_BENCHMARK(name, shape)                       \
  BENCHMARK_CAPTURE(gpu_decode, name, shape)                               \
      ->ArgNames({"", "warps"})                                            \
      ->ArgsProduct({{8192, 32768, 131072}, {4, 8, max_gpu_decode_warps}}) \
      ->UseManualTime()                                                    \
      ->Unit(benchmark::kMillisecond)
WRITESCOPE_GPU_DECODE_BENCHMARK(qwen3_gqa_gpu_resident, qwen3_30b_a3b_attention());
WRITESCOPE_GPU_DECODE_BENCHMARK(deepseek_mla_gpu_resident, deepseek_v2_lite_mla_attention());
#undef WRITESCOPE_GPU_DECODE_BENCHMARK
#endif
#undef WRITESCOPE_DECODE_BENCHMARK

}  // namespace
}  // namespace writescope
