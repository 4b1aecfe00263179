// Prefill attention of one prompt chunk, prefill/<shape>/<tokens>: the chunk's
// last row sits at position `tokens`; its rows attend their own chunk
// causally and the `tokens - chunk` earlier tokens read in place from
// InplaceKVCache blocks (the host pool, head-major, as the CPU reads them),
// in rotated copies that together exceed the last-level cache.
//
// Reported as a FLOP rate (2 per multiply-add of QK^T and P·V) and as
// fraction_of_compute_bound: that rate over the peak of the fp32 FMA the tile
// products run (8 or 16 lanes: the label names the path), measured in the
// same process right after the kernel. Per-token time at 4K, 16K and
// 64K shows the cost growing with position (linear per token, quadratic in
// total), not with rows x tokens of memory traffic.
#include <benchmark/benchmark.h>

#include "attention/prefill.hpp"
#include "bounds.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_gemm.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

constexpr std::int64_t chunk_rows = 512;

void prefill(benchmark::State& state, AttentionShape shape) {
  using MemSpace = HostMemSpace;
  const std::int64_t tokens = state.range(0);
  const std::int64_t earlier = tokens - chunk_rows;
  const bench::RotatedCaches rotated = bench::rotated_caches(shape, Region::cpu_resident, earlier);
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
  const HostExecSpace space;
  int next = 0;
  auto run = [&](const HostExecSpace& s) {
    const int c = next++ % copies;
    prefill_attention<HostExecSpace, bf16>(s, shape, queries, keys, values, 0, 0, chunk_rows, own_workspace, own);
    prefill_segments_attention<HostExecSpace, bf16, HostMemSpace>(s, shape, caches[c]->geometry(),
                                                                  BlockOrder::head_major, queries,
                                                                  caches[c]->host_pool(), segments[c],
                                                                  earlier_workspace, out);
    merge_into(s, out, own);
  };
  run(space);  // warm-up: workspace allocation, first touch
  const double total = bench::run_fenced_iterations(state, space, run);
  const double n = static_cast<double>(state.iterations());
  // Row i sees the earlier tokens and i + 1 of its chunk's.
  const double query_keys = static_cast<double>(chunk_rows) * earlier + chunk_rows * (chunk_rows + 1) / 2.0;
  const double gflops = 2 * prefill_macs_per_query_key(shape) * query_keys * n / total / 1e9;
  const CpuPath path = host_gemm_path(active_cpu_path());
  const double bound_gflops = 2 * measure_host_fp32_fma_gmacs(path);
  state.SetLabel(cpu_path_name(path));
  state.counters["GFLOP/s"] = gflops;
  state.counters["compute_bound_GFLOP/s"] = bound_gflops;
  state.counters["fraction_of_compute_bound"] = gflops / bound_gflops;
  state.counters["us_per_token"] = total / n / chunk_rows * 1e6;
  state.counters["threads"] = space.concurrency();
  state.counters["kv_copies"] = copies;
}

#define WRITESCOPE_PREFILL_BENCHMARK(name, shape)                                              \
  BENCHMARK_CAPTURE(prefill, name, shape)->Arg(4096)->Arg(16384)->Arg(65536)->UseManualTime() \
      ->Unit(benchmark::kMillisecond)
WRITESCOPE_PREFILL_BENCHMARK(qwen3_gqa, qwen3_30b_a3b_attention());
WRITESCOPE_PREFILL_BENCHMARK(mixtral_gqa, mixtral_8x7b_attention());
WRITESCOPE_PREFILL_BENCHMARK(deepseek_mla, deepseek_v2_lite_mla_attention());
#undef WRITESCOPE_PREFILL_BENCHMARK

}  // namespace
}  // namespace writescope
