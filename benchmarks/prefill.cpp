// Prefill attention of one prompt chunk, prefill/<shape>/<tokens> on the host
// and gpu_prefill/<shape>/<tokens> on the GPU (CUDA builds): the chunk's last
// row sits at position `tokens`; its rows attend their own chunk causally and
// the `tokens - chunk` earlier tokens read in place from InplaceKVCache blocks
// (the host pool, head-major, as the CPU reads them; on the GPU the VRAM pool,
// token-major, as GpuResident holds them), in rotated copies that together
// exceed the last-level cache.
//
// Reported as a FLOP rate (2 per multiply-add of QK^T and P·V) and as
// fraction_of_compute_bound: that rate over the peak of the fp32 FMA the tile
// products run (on the host 8 or 16 lanes: the label names the path; on the
// GPU its CUDA cores' fp32 FMA), measured in the same process right after
// the kernel. Per-token time at 4K, 16K and 64K shows the cost growing with
// position (linear per token, quadratic in total), not with rows x tokens of
// memory traffic.
#include <benchmark/benchmark.h>

#include <string>
#include <type_traits>

#include "attention/prefill.hpp"
#include "bounds.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_gemm.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

constexpr std::int64_t chunk_rows = 512;

template <class PoolSpace>
using PoolOf = const Kokkos::View<bf16**, Kokkos::LayoutRight, PoolSpace>& (InplaceKVCache<bf16>::*)() const;

/// The chunk on ExecSpace, its earlier tokens in `region`'s blocks read from
/// each cache's `pool`. `compute_bound_gflops()`, called right after the timed
/// iterations, gives the bound and `label` names it.
template <class ExecSpace, class PoolSpace, class ComputeBound>
void prefill_chunk(benchmark::State& state, const AttentionShape& shape, Region region, PoolOf<PoolSpace> pool,
                   ComputeBound compute_bound_gflops, const std::string& label) {
  using MemSpace = typename ExecSpace::memory_space;
  const std::int64_t tokens = state.range(0);
  const std::int64_t earlier = tokens - chunk_rows;
  const bench::RotatedCaches rotated = bench::rotated_caches(shape, region, earlier);
  const int copies = rotated.copies();
  const auto& caches = rotated.caches;
  const auto& segments = rotated.segments;
  // The chunk's own queries, keys and values (token rows, as the model produces them).
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries("writescope::benchmarks::queries", chunk_rows,
                                                                shape.q_heads, shape.key_dim);
  Kokkos::View<bf16***, Kokkos::LayoutRight, MemSpace> keys("writescope::benchmarks::keys", chunk_rows, shape.kv_heads,
                                                            shape.key_dim);
  Kokkos::View<bf16***, Kokkos::LayoutRight, MemSpace> values("writescope::benchmarks::values", chunk_rows,
                                                              shape.kv_heads, shape.value_dim);
  Kokkos::deep_copy(queries, 0.05f);
  Kokkos::deep_copy(keys, from_float<bf16>(0.5f));
  Kokkos::deep_copy(values, from_float<bf16>(0.25f));
  PartialState<MemSpace> own("writescope::benchmarks::own", chunk_rows, shape.q_heads, shape.value_dim);
  PartialState<MemSpace> out("writescope::benchmarks::out", chunk_rows, shape.q_heads, shape.value_dim);
  PrefillWorkspace<MemSpace> own_workspace, earlier_workspace;
  const ExecSpace space;
  int next = 0;
  auto run = [&](const ExecSpace& s) {
    const int c = next++ % copies;
    prefill_attention<ExecSpace, bf16>(s, shape, queries, keys, values, 0, 0, chunk_rows, own_workspace, own);
    prefill_segments_attention<ExecSpace, bf16, PoolSpace>(s, shape, caches[c]->geometry(), block_order(region),
                                                           queries, ((*caches[c]).*pool)(), segments[c],
                                                           earlier_workspace, out);
    merge_into(s, out, own);
  };
  run(space);  // warm-up: workspace allocation, first touch
  const double total = bench::run_fenced_iterations(state, space, run);
  const double n = static_cast<double>(state.iterations());
  // Row i sees the earlier tokens and i + 1 of its chunk's.
  const double query_keys = static_cast<double>(chunk_rows) * earlier + chunk_rows * (chunk_rows + 1) / 2.0;
  const double gflops = 2 * prefill_macs_per_query_key(shape) * query_keys * n / total / 1e9;
  const double bound_gflops = compute_bound_gflops();
  state.SetLabel(label);
  state.counters["GFLOP/s"] = gflops;
  state.counters["compute_bound_GFLOP/s"] = bound_gflops;
  state.counters["fraction_of_compute_bound"] = gflops / bound_gflops;
  state.counters["us_per_token"] = total / n / chunk_rows * 1e6;
  if constexpr (std::is_same_v<ExecSpace, HostExecSpace>) state.counters["threads"] = space.concurrency();
  state.counters["kv_copies"] = copies;
}

void prefill(benchmark::State& state, AttentionShape shape) {
  const CpuPath path = host_gemm_path(active_cpu_path());
  prefill_chunk<HostExecSpace, HostMemSpace>(
      state, shape, Region::cpu_resident, &InplaceKVCache<bf16>::host_pool,
      [path] { return 2 * measure_host_fp32_fma_gmacs(path); }, cpu_path_name(path));
}

#define WRITESCOPE_PREFILL_BENCHMARK(name, shape)                                              \
  BENCHMARK_CAPTURE(prefill, name, shape)->Arg(4096)->Arg(16384)->Arg(65536)->UseManualTime() \
      ->Unit(benchmark::kMillisecond)
WRITESCOPE_PREFILL_BENCHMARK(qwen3_gqa, qwen3_30b_a3b_attention());
WRITESCOPE_PREFILL_BENCHMARK(mixtral_gqa, mixtral_8x7b_attention());
WRITESCOPE_PREFILL_BENCHMARK(deepseek_mla, deepseek_v2_lite_mla_attention());
#undef WRITESCOPE_PREFILL_BENCHMARK

#ifdef KOKKOS_ENABLE_CUDA
void gpu_prefill(benchmark::State& state, AttentionShape shape) {
  prefill_chunk<GpuExecSpace, GpuMemSpace>(
      state, shape, Region::gpu_resident, &InplaceKVCache<bf16>::vram_pool,
      [] { return 2 * bench::gpu_fp32_fma_gmacs(); }, "cuda fp32 FMA");
}
BENCHMARK_CAPTURE(gpu_prefill, qwen3_gqa, qwen3_30b_a3b_attention())
    ->Arg(16384)->Arg(65536)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpu_prefill, deepseek_mla, deepseek_v2_lite_mla_attention())
    ->Arg(16384)->Arg(65536)->UseManualTime()->Unit(benchmark::kMillisecond);
#endif

}  // namespace
}  // namespace writescope
