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
// In the CUDA variant, the GPU's side of both (gpu_linear, gpu_experts) on
// weights in VRAM rotated past the GPU's L2, against the HBM copy bound, and
// its prompt chunks (gpu_prompt_linear: tiled against team kernel) against
// the roofline of HBM and the GPU's fp32 FMA peak.
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
/// bound (the measured peak of the product it runs there, linear_product_path,
/// over the layer's `multiply_adds_per_byte` of weights), GB/s over min(DRAM,
/// that), and the same against the rates `sampler` sampled.
void report_roofline(benchmark::State& state, double total_seconds, double bytes, CpuPath path,
                     double multiply_adds_per_byte, const HostRateSampler& sampler) {
  const double dram = report(state, total_seconds, bytes, bytes);
  const double compute_bound = measure_host_product_gmacs(linear_product_path(path)) / multiply_adds_per_byte;
  const double gbps = state.counters["GB/s"];
  state.counters["compute_bound_GB/s"] = compute_bound;
  state.counters["fraction_of_roofline"] = gbps / std::min(compute_bound, dram);
  bench::report_sampled_roofline(state, gbps, sampler, multiply_adds_per_byte);
}

/// Weight bytes the rotated copies add up to at least, so that every iteration
/// streams its weights from DRAM (see attention.cpp).
constexpr double rotated_weight_bytes = 512.0 * (1 << 20);

/// Copies of one (out, in) matrix of weights() adding up to at least
/// rotated_weight_bytes, for the iterations to take in turn.
template <class Scalar>
std::vector<Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace>> rotated_weights(int out, int in) {
  const int copies =
      static_cast<int>(std::ceil(rotated_weight_bytes / (static_cast<double>(out) * in * sizeof(Scalar))));
  std::vector<Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace>> w{weights<Scalar>(out, in)};
  for (int c = 1; c < copies; ++c) {
    w.push_back(advised_weights<Scalar>(out, in));
    Kokkos::deep_copy(w.back(), w.front());
  }
  return w;
}

/// range(0) = rows (batch), range(1) = out features, range(2) = in features.
void bf16_linear(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), out = static_cast<int>(state.range(1)),
            in = static_cast<int>(state.range(2));
  const double weight_bytes = 2.0 * out * in;
  const auto w = rotated_weights<bf16>(out, in);
  const int copies = static_cast<int>(w.size());
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", rows, in),
      y("writescope::benchmarks::y", rows, out);
  Kokkos::deep_copy(x, 0.5f);
  // The multiply-add peak of the product the layer runs on its path (16-lane
  // AVX-512F on both AVX-512 paths, tiles on amx_bf16), measured, over its
  // multiply-adds per weight byte (rows / 2). Not derived from vdpbf16ps: on
  // Zen 4/5 that runs twice the multiply-adds of the 16-lane FMA, on the
  // Intel hosts measured half.
  const CpuPath path = impl::linear_path(active_cpu_path(), rows, in, true);
  state.SetLabel(cpu_path_name(path));
  HostRateSampler sampler(linear_product_path(path));
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
  const auto w = rotated_weights<float>(out, in);
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", rows, in),
      y("writescope::benchmarks::y", rows, out);
  Kokkos::deep_copy(x, 0.5f);
  std::size_t next = 0;
  const double total = bench::run_fenced_iterations(state, HostExecSpace(), [&](const HostExecSpace&) {
    KokkosBlas::gemm("N", "T", 1.0f, x, w[next++ % w.size()], 0.0f, y);
  });
  report(state, total, 4.0 * out * in, 2.0 * out * in);
  state.counters["weight_copies"] = static_cast<double>(w.size());
}

/// The experts of cpu_experts and gpu_experts: range(0) tokens of Qwen3's
/// experts (768 x 2048, 8 a token) or DeepSeek's (1408 x 2048, 6 a token),
/// each token's taken from a window of twice its top-k, and a pool of them
/// (whole windows) of at least rotated_weight_bytes.
struct ExpertStepShape {
  int tokens, hidden = 2048, intermediate, per_token, window;
  double expert_bytes;
  int pool;
  ExpertStepShape(const benchmark::State& state, bool qwen3)
      : tokens(static_cast<int>(state.range(0))),
        intermediate(qwen3 ? 768 : 1408),
        per_token(qwen3 ? 8 : 6),
        window(2 * per_token),
        expert_bytes(3.0 * 2.0 * hidden * intermediate),
        pool(window * static_cast<int>(std::ceil(rotated_weight_bytes / expert_bytes / window))) {}
};

/// The routings of a decode step's experts over `pool` experts: step i's
/// token t takes experts (5 t + j) mod window of window i, j < per_token.
struct ExpertSteps {
  std::vector<Routing> routings;
  std::vector<std::vector<int>> active;  // per step, its experts ascending

  ExpertSteps(int tokens, int per_token, int window, int pool) {
    for (int i = 0; i < pool / window; ++i) {
      Routing routing;
      routing.rows.resize(static_cast<std::size_t>(pool));
      routing.weights.resize(static_cast<std::size_t>(pool));
      for (int t = 0; t < tokens; ++t)
        for (int j = 0; j < per_token; ++j) {
          const int e = i * window + (5 * t + j) % window;
          routing.rows[static_cast<std::size_t>(e)].push_back(t);
          routing.weights[static_cast<std::size_t>(e)].push_back(1.0f / per_token);
        }
      active.push_back(routing.active());
      routings.push_back(std::move(routing));
    }
  }
  int steps() const { return static_cast<int>(routings.size()); }
  /// Per step, the weights of its experts out of the pool's.
  template <class Weights>
  std::vector<std::vector<Weights>> weights(const std::vector<Weights>& pool) const {
    std::vector<std::vector<Weights>> per_step;
    for (const auto& experts : active) {
      per_step.emplace_back();
      for (int e : experts) per_step.back().push_back(pool[static_cast<std::size_t>(e)]);
    }
    return per_step;
  }
};

/// One step of `runner` on step `step` of `steps`: batched, or one add per expert.
template <class ExecSpace>
void expert_step(const ExecSpace& space, ExpertRunner<ExecSpace, bf16>& runner, const ExpertSteps& steps,
                 const std::vector<std::vector<ExpertWeights<bf16, typename ExecSpace::memory_space>>>& weights,
                 int step, bool batched,
                 const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
                 const Matrix<typename ExecSpace::memory_space>& out) {
  const auto s = static_cast<std::size_t>(step);
  runner.upload(space, steps.routings[s]);
  if (batched) {
    runner.add(space, steps.active[s], weights[s], x, out);
  } else {
    for (std::size_t k = 0; k < steps.active[s].size(); ++k)
      runner.add(space, weights[s][k], steps.active[s][k], x, out);
  }
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
  const ExpertStepShape shape(state, qwen3);
  const int tokens = shape.tokens, hidden = shape.hidden, intermediate = shape.intermediate;
  const int per_token = shape.per_token, pool = shape.pool;
  const double expert_bytes = shape.expert_bytes;
  const bool batched = state.range(1) == 1;
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
  const ExpertSteps steps(tokens, per_token, shape.window, pool);
  const std::vector<std::vector<Weights>> active_weights = steps.weights(experts);
  // A step's experts, and its rows.
  const int touched = static_cast<int>(steps.active.front().size()), rows = tokens * per_token;
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> x("writescope::benchmarks::x", tokens, hidden),
      out("writescope::benchmarks::out", tokens, hidden);
  Kokkos::deep_copy(x, 0.5f);
  ExpertRunner<HostExecSpace, bf16> runner;
  const CpuPath path = impl::linear_path(active_cpu_path(), tokens, hidden, true);
  state.SetLabel(cpu_path_name(path));
  HostRateSampler sampler(linear_product_path(path));
  int next = 0;
  const double total = bench::run_sampled_iterations(
      state, HostExecSpace(),
      [&](const HostExecSpace& s) {
        expert_step(s, runner, steps, active_weights, next++ % steps.steps(), batched, x, out);
      },
      sampler);
  // Multiply-adds per weight byte: the experts' rows over 2 bytes a weight.
  report_roofline(state, total, touched * expert_bytes, path, static_cast<double>(rows) / touched / 2.0, sampler);
  state.counters["experts"] = touched;
  state.counters["expert_copies"] = pool;
  state.counters["threads"] = HostExecSpace().concurrency();
}

#ifdef KOKKOS_ENABLE_CUDA
/// Counters of a GPU kernel that streamed `bytes` of weights an iteration
/// against the device's copy bound (HBM) measured in the same process.
void report_hbm(benchmark::State& state, double total_seconds, double bytes) {
  const double gbps = bytes * static_cast<double>(state.iterations()) / total_seconds / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["bound_GB/s"] = bench::hbm_copy_gbps();
  state.counters["fraction_of_bound"] = gbps / bench::hbm_copy_gbps();
}

/// `w` copied into a new View of GPU memory.
template <class Scalar>
Kokkos::View<Scalar**, Kokkos::LayoutRight, GpuMemSpace> on_gpu(
    const Kokkos::View<Scalar**, Kokkos::LayoutRight, HostMemSpace>& w) {
  Kokkos::View<Scalar**, Kokkos::LayoutRight, GpuMemSpace> copy(
      Kokkos::view_alloc(std::string("writescope::benchmarks::gpu_weights"), Kokkos::WithoutInitializing), w.extent(0),
      w.extent(1));
  Kokkos::deep_copy(copy, w);
  return copy;
}

/// The GPU linear benchmarks' operands: range(0) rows of x and y, and bf16
/// weights (range(1) out x range(2) in) in VRAM, in copies adding up to
/// rotated_weight_bytes (past the GPU's L2), taken in turn.
struct GpuLinearOperands {
  explicit GpuLinearOperands(const benchmark::State& state)
      : weight_bytes(2.0 * static_cast<double>(state.range(1)) * static_cast<double>(state.range(2))),
        x("writescope::benchmarks::x", state.range(0), state.range(2)),
        y("writescope::benchmarks::y", state.range(0), state.range(1)) {
    const auto host_weights = weights<bf16>(static_cast<int>(state.range(1)), static_cast<int>(state.range(2)));
    const int copies = static_cast<int>(std::ceil(rotated_weight_bytes / weight_bytes));
    for (int c = 0; c < copies; ++c) w.push_back(on_gpu(host_weights));
    Kokkos::deep_copy(x, 0.5f);
  }
  const Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMemSpace>& next_weights() { return w[next++ % w.size()]; }

  double weight_bytes;
  std::vector<Kokkos::View<const bf16**, Kokkos::LayoutRight, GpuMemSpace>> w;
  Kokkos::View<float**, Kokkos::LayoutRight, GpuMemSpace> x, y;
  std::size_t next = 0;
};

/// The GPU's linear layer (linear() on the GPU: impl::linear_team) on bf16
/// weights in VRAM, copies rotated past the GPU's L2; ranges as bf16_linear's.
void gpu_bf16_linear(benchmark::State& state) {
  GpuLinearOperands operands(state);
  const double total = bench::run_fenced_iterations(state, GpuExecSpace(), [&](const GpuExecSpace& s) {
    linear<GpuExecSpace, bf16>(s, operands.x, operands.next_weights(), operands.y);
  });
  report_hbm(state, total, operands.weight_bytes);
  state.counters["weight_copies"] = static_cast<double>(operands.w.size());
}

/// A prompt chunk's linear layer on the GPU: range(0) rows against bf16
/// weights (range(1) out x range(2) in) in VRAM, copies rotated past the
/// GPU's L2, by the tiled kernel (what linear() runs beyond max_linear_rows
/// rows) or the decode team kernel (groups of 8 rows, each streaming the
/// weights), against the problem's roofline: max(weights once over HBM,
/// multiply-adds over the fp32 FMA peak), both measured in this process.
void gpu_prompt_linear(benchmark::State& state, bool tiled) {
  GpuLinearOperands operands(state);
  const double weight_bytes = operands.weight_bytes,
               multiply_adds = static_cast<double>(state.range(0)) * state.range(1) * state.range(2);
  const double total = bench::run_fenced_iterations(state, GpuExecSpace(), [&](const GpuExecSpace& s) {
    const auto& weights = operands.next_weights();
    if (tiled)
      impl::linear_tiled<GpuExecSpace, bf16>(s, operands.x, weights, operands.y);
    else
      impl::linear_team<GpuExecSpace, bf16>(s, {{operands.x, weights, operands.y}});
  });
  const double seconds = total / static_cast<double>(state.iterations());
  const double hbm = bench::hbm_copy_gbps(), peak = bench::gpu_fp32_fma_gmacs();
  state.counters["GFLOP/s"] = 2 * multiply_adds / seconds / 1e9;
  state.counters["compute_bound_GFLOP/s"] = 2 * peak;
  state.counters["GB/s"] = weight_bytes / seconds / 1e9;
  state.counters["bound_GB/s"] = hbm;
  state.counters["fraction_of_roofline"] = std::max(weight_bytes / (hbm * 1e9), multiply_adds / (peak * 1e9)) / seconds;
  state.counters["weight_copies"] = static_cast<double>(operands.w.size());
}

/// cpu_experts on the GPU: the experts in VRAM, copies rotated past the
/// GPU's L2, through the model's GPU ExpertRunner; against the HBM bound.
void gpu_experts(benchmark::State& state, bool qwen3) {
  const ExpertStepShape shape(state, qwen3);
  const int tokens = shape.tokens, hidden = shape.hidden, intermediate = shape.intermediate, pool = shape.pool;
  using Weights = ExpertWeights<bf16, GpuMemSpace>;
  const auto gate = weights<bf16>(intermediate, hidden), up = weights<bf16>(intermediate, hidden),
             down = weights<bf16>(hidden, intermediate);
  std::vector<Weights> experts;
  for (int e = 0; e < pool; ++e) experts.push_back(Weights{on_gpu(gate), on_gpu(up), on_gpu(down)});
  const ExpertSteps steps(tokens, shape.per_token, shape.window, pool);
  const std::vector<std::vector<Weights>> active_weights = steps.weights(experts);
  Kokkos::View<float**, Kokkos::LayoutRight, GpuMemSpace> x("writescope::benchmarks::x", tokens, hidden),
      out("writescope::benchmarks::out", tokens, hidden);
  Kokkos::deep_copy(x, 0.5f);
  ExpertRunner<GpuExecSpace, bf16> runner;
  int next = 0;
  const double total = bench::run_fenced_iterations(state, GpuExecSpace(), [&](const GpuExecSpace& s) {
    expert_step(s, runner, steps, active_weights, next++ % steps.steps(), state.range(1) == 1, x, out);
  });
  report_hbm(state, total, static_cast<double>(steps.active.front().size()) * shape.expert_bytes);
  state.counters["experts"] = static_cast<double>(steps.active.front().size());
}
#endif

#define WRITESCOPE_EXPERT_STEPS(b) \
  b->ArgNames({"tokens", "batched"})->ArgsProduct({{1, 4}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(cpu_experts, qwen3, true));
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(cpu_experts, deepseek, false));
#ifdef KOKKOS_ENABLE_CUDA
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(gpu_experts, qwen3, true));
WRITESCOPE_EXPERT_STEPS(BENCHMARK_CAPTURE(gpu_experts, deepseek, false));
#endif
#undef WRITESCOPE_EXPERT_STEPS

#define WRITESCOPE_LINEAR_SHAPES(b)                                                                        \
  b->Args({1, 768, 2048})->Args({8, 768, 2048})->Args({1, 1408, 2048})->Args({1, 14336, 4096})           \
      ->Args({2, 14336, 4096})->Args({4, 14336, 4096})->Args({8, 14336, 4096})->Args({16, 14336, 4096})        \
      ->UseManualTime()                                                                                    \
      ->Unit(benchmark::kMicrosecond)
WRITESCOPE_LINEAR_SHAPES(BENCHMARK(bf16_linear)->Name("expert_linear/bf16_writescope"));
WRITESCOPE_LINEAR_SHAPES(BENCHMARK(openblas_float_linear)->Name("expert_linear/float_openblas"));
#ifdef KOKKOS_ENABLE_CUDA
WRITESCOPE_LINEAR_SHAPES(BENCHMARK(gpu_bf16_linear)->Name("gpu_linear/bf16_writescope"));
// Prompt chunks of 64 and 256 rows on a Qwen3 expert's gate and a Mixtral expert's.
#define WRITESCOPE_PROMPT_SHAPES(b) \
  b->Args({64, 768, 2048})          \
      ->Args({256, 768, 2048})      \
      ->Args({64, 14336, 4096})     \
      ->Args({256, 14336, 4096})    \
      ->UseManualTime()             \
      ->Unit(benchmark::kMicrosecond)
WRITESCOPE_PROMPT_SHAPES(BENCHMARK_CAPTURE(gpu_prompt_linear, tiled, true));
WRITESCOPE_PROMPT_SHAPES(BENCHMARK_CAPTURE(gpu_prompt_linear, team, false));
#undef WRITESCOPE_PROMPT_SHAPES
#endif
#undef WRITESCOPE_LINEAR_SHAPES

}  // namespace
}  // namespace writescope
