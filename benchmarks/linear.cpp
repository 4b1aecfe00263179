// Decode-time expert linear layers (memory-bound GEMVs with a few rows): the
// project's kernel on bf16 weights against OpenBLAS sgemm (through Kokkos
// Kernels) on the same weights widened to float, in GB/s of weight bytes
// actually streamed and of bf16-equivalent weight bytes, and as a fraction of
// the host DRAM read bound measured in the same run (and, for the project's
// kernel, of min(DRAM, the compute roof of the CPU path it runs; the label
// names the path), with weights rotated past the last-level cache; and the
// same against the rates sampled between iterations (bounds.hpp). Shapes: an expert's gate
// (or up) projection of Qwen3-30B-A3B (768 x 2048), DeepSeek-V2-Lite
// (1408 x 2048) and Mixtral-8x7B (14336 x 4096).
#include <benchmark/benchmark.h>

#include <KokkosBlas3_gemm.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_memory.hpp"
#include "moe/linear.hpp"

namespace writescope {
namespace {

/// Uninitialised (out, in) weights, paged as the model's host expert store (moe/model.cpp).
template <class Scalar>
Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace> advised_weights(int out, int in) {
  Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace> w(
      Kokkos::view_alloc(std::string("writescope::benchmarks::weights"), Kokkos::WithoutInitializing), out, in);
  advise_huge_pages(w);
  return w;
}

template <class Scalar>
Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace> weights(int out, int in) {
  const auto w = advised_weights<Scalar>(out, in);
  for (int j = 0; j < out; ++j)
    for (int c = 0; c < in; ++c) w(j, c) = from_float<Scalar>(static_cast<float>((j * 31 + c * 17) % 97 - 48) * 1e-3f);
  return w;
}

/// Counters against the DRAM read bound measured right after the timed
/// iterations (a shared machine's rates drift between benchmarks); returns it.
double report(benchmark::State& state, double total_seconds, double streamed_bytes, double bf16_bytes) {
  const double n = static_cast<double>(state.iterations());
  const double dram = measure_host_dram_read_gbps();
  state.counters["GB/s"] = streamed_bytes * n / total_seconds / 1e9;
  state.counters["bf16_equivalent_GB/s"] = bf16_bytes * n / total_seconds / 1e9;
  state.counters["bound_GB/s"] = dram;
  state.counters["fraction_of_bound"] = streamed_bytes * n / total_seconds / 1e9 / dram;
  return dram;
}

/// Weight bytes the rotated copies add up to at least, so that every iteration
/// streams its weights from DRAM (see attention.cpp).
constexpr double rotated_weight_bytes = 512.0 * (1 << 20);

/// range(0) = rows (batch), range(1) = out features, range(2) = in features.
void bf16_linear(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), out = static_cast<int>(state.range(1)),
            in = static_cast<int>(state.range(2));
  const double weight_bytes = 2.0 * out * in;
  const int copies = static_cast<int>(std::ceil(rotated_weight_bytes / weight_bytes));
  std::vector<Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace>> w{weights<bf16>(out, in)};
  for (int c = 1; c < copies; ++c) {
    w.push_back(advised_weights<bf16>(out, in));
    Kokkos::deep_copy(w.back(), w.front());
  }
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", rows, in),
      y("writescope::benchmarks::y", rows, out);
  Kokkos::deep_copy(x, 0.5f);
  // The multiply-add peak of the fp32 FMA the layer runs on its path (16-lane
  // AVX-512F on both AVX-512 paths), measured, over its multiply-adds per weight byte
  // (rows / 2). Not derived from vdpbf16ps: on Zen 4/5 that runs twice the
  // multiply-adds of the 16-lane FMA, on the Intel hosts measured half.
  const CpuPath path = impl::linear_path(active_cpu_path(), rows, in, true);
  state.SetLabel(cpu_path_name(path));
  HostRateSampler sampler(fp32_fma_path(path));
  int next = 0;
  const double total = bench::run_sampled_iterations(
      state, HostExecSpace(),
      [&](const HostExecSpace& s) { linear<HostExecSpace, bf16>(s, x, w[next++ % copies], y); }, sampler);
  const double dram = report(state, total, weight_bytes, weight_bytes);
  const double compute_bound = measure_host_fp32_fma_gmacs(path) * 2.0 / rows;
  const double gbps = state.counters["GB/s"];
  state.counters["compute_bound_GB/s"] = compute_bound;
  state.counters["fraction_of_roofline"] = gbps / std::min(compute_bound, dram);
  bench::report_sampled_roofline(state, gbps, sampler, rows / 2.0);
  state.counters["weight_copies"] = copies;
  state.counters["threads"] = HostExecSpace().concurrency();
}

void openblas_float_linear(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), out = static_cast<int>(state.range(1)),
            in = static_cast<int>(state.range(2));
  const auto w = weights<float>(out, in);
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", rows, in),
      y("writescope::benchmarks::y", rows, out);
  Kokkos::deep_copy(x, 0.5f);
  const double total = bench::run_fenced_iterations(state, HostExecSpace(), [&](const HostExecSpace&) {
    KokkosBlas::gemm("N", "T", 1.0f, x, w, 0.0f, y);
  });
  report(state, total, 4.0 * out * in, 2.0 * out * in);
}

#define WRITESCOPE_LINEAR_SHAPES(b)                                                                        \
  b->Args({1, 768, 2048})->Args({8, 768, 2048})->Args({1, 1408, 2048})->Args({1, 14336, 4096})           \
      ->Args({2, 14336, 4096})->Args({4, 14336, 4096})->Args({8, 14336, 4096})->Args({16, 14336, 4096})        \
      ->UseManualTime()                                                                                    \
      ->Unit(benchmark::kMicrosecond)
WRITESCOPE_LINEAR_SHAPES(BENCHMARK(bf16_linear)->Name("expert_linear/bf16_writescope"));
WRITESCOPE_LINEAR_SHAPES(BENCHMARK(openblas_float_linear)->Name("expert_linear/float_openblas"));
#undef WRITESCOPE_LINEAR_SHAPES

}  // namespace
}  // namespace writescope
