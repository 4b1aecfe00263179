// Decode-time expert linear layers (memory-bound GEMVs with a few rows): the
// project's kernel on bf16 weights against OpenBLAS sgemm (through Kokkos
// Kernels) on the same weights widened to float, in GB/s of weight bytes
// actually streamed and of bf16-equivalent weight bytes, and as a fraction of
// the host DRAM read bound measured in the same run (and, for the project's
// kernel, of min(DRAM, the compute roof of the CPU path it runs; the label
// names the path), with weights rotated past the last-level cache; and the
// same against the rates sampled between iterations (bounds.hpp). Shapes: an expert's gate
// (or up) projection of Qwen3-30B-A3B (768 x 2048), DeepSeek-V2-Lite
// (1408 x 2048) and Mixtral-8x7B (14336 x 4096). And cpu_experts: a decode
// step's routed experts of one layer, batched in one add or one add each.
#include "moe/linear.hpp"

#include <benchmark/benchmark.h>

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bounds.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_memory.hpp"
#include "moe/experts.hpp"

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

/// report()'s counters and the roofline of a layer on `path`: the compute
/// bound (the measured peak of the path's fp32 FMA over the layer's
/// `multiply_adds_per_byte` of weights), GB/s over min(DRAM, that), and the
/// same against the rates `sampler` sampled.
void report_roofline(benchmark::State& state, double total_seconds, double bytes, CpuPath path,
                     double multiply_adds_per_byte, const HostRateSampler& sampler) {
  const double dram = report(state, total_seconds, bytes, bytes);
  const double compute_bound = measure_host_fp32_fma_gmacs(path) / multiply_adds_per_byte;
  const double gbps = state.counters["GB/s"];
  state.counters["compute_bound_GB/s"] = compute_bound;
  state.counters["fraction_of_roofline"] = gbps / std::min(compute_bound, dram);
  bench::report_sampled_roofline(state, gbps, sampler, multiply_adds_per_byte);
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
  report_roofline(state, total, weight_bytes, path, rows / 2.0, sampler);
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

/// A decode step's routed experts of one MoE layer on the host, through the
/// model's ExpertRunner: `qwen3`: Qwen3-30B-A3B's experts (768 x 2048, 8 a
/// token), else DeepSeek-V2-Lite's (1408 x 2048, 6 a token); range(0) =
/// tokens, range(1) = 1: the experts batched in one add (the model's way), 0:
/// one add per expert, for comparison. Each token takes its experts from a
/// window of twice as many, so that experts are shared between tokens as
/// routing shares them; the windows rotate through copies of experts past the
/// last-level cache. Bytes: the weights of the experts a step touches, once.
void cpu_experts(benchmark::State& state, bool qwen3) {
  const int tokens = static_cast<int>(state.range(0)), hidden = 2048, intermediate = qwen3 ? 768 : 1408;
  const int per_token = qwen3 ? 8 : 6, window = 2 * per_token;
  const bool batched = state.range(1) == 1;
  const double expert_bytes = 3.0 * 2.0 * hidden * intermediate;
  const int pool = window * static_cast<int>(std::ceil(rotated_weight_bytes / expert_bytes / window));
  using Weights = ExpertWeights<bf16, HostMemSpace>;
  const auto gate = weights<bf16>(intermediate, hidden), up = weights<bf16>(intermediate, hidden),
             down = weights<bf16>(hidden, intermediate);
  std::vector<Weights> experts;
  for (int e = 0; e < pool; ++e) {
    const auto g = advised_weights<bf16>(intermediate, hidden), u = advised_weights<bf16>(intermediate, hidden),
               d = advised_weights<bf16>(hidden, intermediate);
    Kokkos::deep_copy(g, gate), Kokkos::deep_copy(u, up), Kokkos::deep_copy(d, down);
    experts.push_back(Weights{g, u, d});
  }
  // Step i's routing: token t takes experts (5 t + j) mod window, j < per_token, of window i.
  const int steps = pool / window;
  std::vector<Routing> routings(static_cast<std::size_t>(steps));
  std::vector<std::vector<int>> active(static_cast<std::size_t>(steps));
  std::vector<std::vector<Weights>> active_weights(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    Routing& routing = routings[static_cast<std::size_t>(i)];
    routing.rows.resize(static_cast<std::size_t>(pool));
    routing.weights.resize(static_cast<std::size_t>(pool));
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < per_token; ++j) {
        const int e = i * window + (5 * t + j) % window;
        routing.rows[static_cast<std::size_t>(e)].push_back(t);
        routing.weights[static_cast<std::size_t>(e)].push_back(1.0f / per_token);
      }
    active[static_cast<std::size_t>(i)] = routing.active();
    for (int e : routing.active())
      active_weights[static_cast<std::size_t>(i)].push_back(experts[static_cast<std::size_t>(e)]);
  }
  const int touched = static_cast<int>(active.front().size()), rows = tokens * per_token;  // a step's experts, rows
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", tokens, hidden),
      out("writescope::benchmarks::out", tokens, hidden);
  Kokkos::deep_copy(x, 0.5f);
  ExpertRunner<HostExecSpace, bf16> runner;
  const CpuPath path = impl::linear_path(active_cpu_path(), tokens, hidden, true);
  state.SetLabel(cpu_path_name(path));
  HostRateSampler sampler(fp32_fma_path(path));
  int next = 0;
  const double total = bench::run_sampled_iterations(
      state, HostExecSpace(),
      [&](const HostExecSpace& s) {
        const auto step = static_cast<std::size_t>(next++ % steps);
        runner.upload(s, routings[step]);
        if (batched) {
          runner.add(s, active[step], active_weights[step], x, out);
        } else {
          for (std::size_t k = 0; k < active[step].size(); ++k)
            runner.add(s, active_weights[step][k], active[step][k], x, out);
        }
      },
      sampler);
  // Multiply-adds per weight byte: the experts' rows over 2 bytes a weight.
  report_roofline(state, total, touched * expert_bytes, path, static_cast<double>(rows) / touched / 2.0, sampler);
  state.counters["experts"] = touched;
  state.counters["expert_copies"] = pool;
  state.counters["threads"] = HostExecSpace().concurrency();
}

#define WRITESCOPE_EXPERT_STEPS(b) \
  b->ArgNames({"tokens", "batched"})->ArgsProduct({{1, 4}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(cpu_experts, qwen3, true));
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(cpu_experts, deepseek, false));
#undef WRITESCOPE_EXPERT_STEPS

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
