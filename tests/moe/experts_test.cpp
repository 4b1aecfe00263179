#include "moe/experts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "exec_spaces.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace {

constexpr int hidden = 32, intermediate = 24, experts = 6, rows = 5, top_k = 2;

/// Host copy of a (out, in) weight matrix and its device View.
template <class Scalar, class Mem>
struct TestMatrix {
  std::vector<float> values;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> view;
  TestMatrix(int out, int in, unsigned seed) : values(test::random_values<Scalar>(out * in, seed, 0.3f)) {
    Kokkos::View<Scalar**, Kokkos::LayoutRight, Kokkos::HostSpace> host("writescope::test::w", out, in);
    for (int i = 0; i < out * in; ++i) host.data()[i] = from_float<Scalar>(values[i]);
    view = Kokkos::create_mirror_view_and_copy(Mem(), host);
  }
};

std::vector<double> reference_expert(const std::vector<float>& gate, const std::vector<float>& up,
                                     const std::vector<float>& down, const float* x) {
  std::vector<double> h(intermediate), y(hidden, 0.0);
  for (int i = 0; i < intermediate; ++i) {
    double g = 0, u = 0;
    for (int c = 0; c < hidden; ++c) g += static_cast<double>(gate[i * hidden + c]) * x[c], u += static_cast<double>(up[i * hidden + c]) * x[c];
    h[i] = g / (1 + std::exp(-g)) * u;
  }
  for (int j = 0; j < hidden; ++j)
    for (int i = 0; i < intermediate; ++i) y[j] += down[j * intermediate + i] * h[i];
  return y;
}

/// The model's feed-forward on one space: route, then every activated expert
/// (one at a time, or `batched` in one add) and the shared ones; returns the
/// tokens each expert received.
template <class ExecSpace, class Scalar, class Weights>
std::vector<int> feed_forward(
    Router<ExecSpace, Scalar>& router, const std::vector<Weights>& routed, const std::vector<Weights>& shared,
    const Kokkos::View<const float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& x,
    const Matrix<typename ExecSpace::memory_space>& out, bool batched) {
  const ExecSpace space;
  ExpertRunner<ExecSpace, Scalar> runner;
  const Routing routing = router(space, x);
  Kokkos::deep_copy(space, out, 0.0f);
  runner.upload(space, routing);
  if (batched) {
    std::vector<Weights> active;
    for (int e : routing.active()) active.push_back(routed[e]);
    runner.add(space, routing.active(), active, x, out);
  } else {
    for (int e : routing.active()) runner.add(space, routed[e], e, x, out);
  }
  for (const Weights& expert : shared) runner.add_all(space, expert, x, out);
  space.fence();
  return routing.counts();
}

template <class C>
class RouterAndExpertsTest : public ::testing::Test {};
using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(RouterAndExpertsTest, Cases, test::SpaceAndScalarName);

TYPED_TEST(RouterAndExpertsTest, RouteGatherAndAddLikeAPlainLoop) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  using Weights = ExpertWeights<Scalar, Mem>;
  TestMatrix<Scalar, Mem> router(experts, hidden, 1);
  std::vector<TestMatrix<Scalar, Mem>> gates, ups, downs;
  for (int e = 0; e <= experts; ++e) {  // the last one is the shared expert
    gates.emplace_back(intermediate, hidden, 10 + e);
    ups.emplace_back(intermediate, hidden, 20 + e);
    downs.emplace_back(hidden, intermediate, 30 + e);
  }
  std::vector<Weights> routed;
  for (int e = 0; e < experts; ++e) routed.push_back(Weights{gates[e].view, ups[e].view, downs[e].view});
  const Weights shared{gates[experts].view, ups[experts].view, downs[experts].view};
  const auto x_values = test::random_values<float>(rows * hidden, 40);
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> x_host("writescope::test::x", rows, hidden);
  std::copy(x_values.begin(), x_values.end(), x_host.data());
  const auto x = Kokkos::create_mirror_view_and_copy(Mem(), x_host);

  for (const auto& [kind, batched] :
       {std::pair{RouterKind::normalized_topk, false}, std::pair{RouterKind::scaled_topk, false},
        std::pair{RouterKind::normalized_topk, true}, std::pair{RouterKind::scaled_topk, true}}) {
    SCOPED_TRACE(batched ? "experts batched" : "one expert at a time");
    const bool with_shared = kind == RouterKind::scaled_topk;  // DeepSeek style
    Router<ExecSpace, Scalar> route_tokens(router.view, top_k, kind, 1.25);
    Matrix<Mem> out("writescope::test::out", rows, hidden);
    const std::vector<int> routed_counts = feed_forward(
        route_tokens, routed, with_shared ? std::vector<Weights>{shared} : std::vector<Weights>{}, x, out, batched);
    const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    std::vector<int> counts(experts, 0);
    for (int r = 0; r < rows; ++r) {
      const float* xr = x_values.data() + r * hidden;
      std::vector<double> logits(experts);
      for (int e = 0; e < experts; ++e)
        for (int c = 0; c < hidden; ++c) logits[e] += static_cast<double>(router.values[e * hidden + c]) * xr[c];
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
      double total = 0, chosen = 0;
      for (double l : logits) total += std::exp(l - logits[order[0]]);
      for (int j = 0; j < top_k; ++j) chosen += std::exp(logits[order[j]] - logits[order[0]]) / total;
      std::vector<double> expected(hidden, 0.0);
      for (int j = 0; j < top_k; ++j) {
        const int e = order[j];
        ++counts[e];
        const double p = std::exp(logits[e] - logits[order[0]]) / total;
        const double w = kind == RouterKind::normalized_topk ? p / chosen : 1.25 * p;
        const auto y = reference_expert(gates[e].values, ups[e].values, downs[e].values, xr);
        for (int c = 0; c < hidden; ++c) expected[c] += w * y[c];
      }
      if (with_shared) {
        const auto y = reference_expert(gates[experts].values, ups[experts].values, downs[experts].values, xr);
        for (int c = 0; c < hidden; ++c) expected[c] += y[c];
      }
      for (int c = 0; c < hidden; ++c) ASSERT_NEAR(result(r, c), expected[c], 1e-4) << "row " << r << " column " << c;
    }
    EXPECT_EQ(routed_counts, counts);
  }
  EXPECT_THROW((Router<ExecSpace, Scalar>(router.view, experts + 1, RouterKind::scaled_topk, 1.0)),
               std::invalid_argument);
}

// A batch with an expert of no rows, one of a single row, groups of split
// rows (7, 9, 12) and one past max_linear_rows (33: the GEMM path), given out
// of order and with split-path shapes in both products: the same sums as one
// expert at a time, in the same order, and as a double reference.
TYPED_TEST(RouterAndExpertsTest, BatchedExpertsAddLikeOneAtATime) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  using Weights = ExpertWeights<Scalar, Mem>;
  constexpr int tokens = 40, wide = 64, inner = 96;
  const std::vector<int> order{5, 0, 2, 1, 4, 3}, sizes{0, 1, 7, 9, 33, 12};
  std::vector<TestMatrix<Scalar, Mem>> gates, ups, downs;
  Routing routing;
  for (int e = 0; e < static_cast<int>(sizes.size()); ++e) {
    gates.emplace_back(inner, wide, 50 + e);
    ups.emplace_back(inner, wide, 60 + e);
    downs.emplace_back(wide, inner, 70 + e);
    std::vector<int> chosen;  // t -> (7 t + 3 e) mod 40 is one to one: sizes[e] tokens, ascending
    for (int t = 0; t < tokens; ++t)
      if ((t * 7 + e * 3) % tokens < sizes[e]) chosen.push_back(t);
    routing.rows.push_back(chosen);
    std::vector<float> weights;
    for (int t : chosen) weights.push_back(0.1f + 0.01f * static_cast<float>(t + e));
    routing.weights.push_back(weights);
  }
  std::vector<Weights> batch;
  for (int e : order) batch.push_back(Weights{gates[e].view, ups[e].view, downs[e].view});
  const auto x_values = test::random_values<float>(tokens * wide, 80);
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> x_host("writescope::test::x", tokens, wide);
  std::copy(x_values.begin(), x_values.end(), x_host.data());
  const auto x = Kokkos::create_mirror_view_and_copy(Mem(), x_host);
  const ExecSpace space;
  ExpertRunner<ExecSpace, Scalar> runner;
  runner.upload(space, routing);
  Matrix<Mem> batched("writescope::test::batched", tokens, wide),
      one_at_a_time("writescope::test::single", tokens, wide);
  Kokkos::deep_copy(batched, 0.5f);
  Kokkos::deep_copy(one_at_a_time, 0.5f);
  runner.add(space, order, batch, x, batched);
  for (std::size_t i = 0; i < order.size(); ++i) runner.add(space, batch[i], order[i], x, one_at_a_time);
  space.fence();
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), batched);
  const auto single = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), one_at_a_time);
  std::vector<double> expected(static_cast<std::size_t>(tokens) * wide, 0.5);
  for (int e : order)
    for (std::size_t k = 0; k < routing.rows[e].size(); ++k) {
      const int t = routing.rows[e][k];
      std::vector<double> h(inner);
      for (int i = 0; i < inner; ++i) {
        double g = 0, u = 0;
        for (int c = 0; c < wide; ++c) {
          g += static_cast<double>(gates[e].values[i * wide + c]) * x_values[t * wide + c];
          u += static_cast<double>(ups[e].values[i * wide + c]) * x_values[t * wide + c];
        }
        h[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int j = 0; j < wide; ++j) {
        double y = 0;
        for (int i = 0; i < inner; ++i) y += downs[e].values[j * inner + i] * h[i];
        expected[static_cast<std::size_t>(t) * wide + j] += routing.weights[e][k] * y;
      }
    }
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < wide; ++c) {
      ASSERT_NEAR(got(t, c), single(t, c), 1e-6 * (1 + std::abs(single(t, c)))) << "token " << t << " column " << c;
      ASSERT_NEAR(got(t, c), expected[static_cast<std::size_t>(t) * wide + c], 1e-4)
          << "token " << t << " column " << c;
    }
  EXPECT_THROW(runner.add(space, {order[0]}, batch, x, batched), std::invalid_argument);
}

// Two experts that every one of 1025 tokens chooses: the batch's SwiGLU
// products are 2050 x 32768 floats, past the 1024 x 65535 columns of a GPU's
// 2-D tiles (where, read as one row, they would not launch), so the SiLU
// product runs over a 1-D range. Sampled tokens against a double reference.
template <class ExecSpace>
class LargeExpertBatchTest : public ::testing::Test {};
TYPED_TEST_SUITE(LargeExpertBatchTest, test::ExecSpaceTypes, test::ExecSpaceName);

TYPED_TEST(LargeExpertBatchTest, ProductsPastAGpuTilesColumnsRunWhole) {
  using ExecSpace = TypeParam;
  using Mem = typename ExecSpace::memory_space;
  using Weights = ExpertWeights<bf16, Mem>;
  constexpr int tokens = 1025, wide = 8, inner = 32768, chosen_by_all = 2;
  static_assert(std::int64_t{chosen_by_all} * tokens * inner > std::int64_t{1024} * 65535);
  std::vector<TestMatrix<bf16, Mem>> gates, ups, downs;
  Routing routing;
  std::vector<int> every_token(tokens);
  std::iota(every_token.begin(), every_token.end(), 0);
  for (int e = 0; e < chosen_by_all; ++e) {
    gates.emplace_back(inner, wide, 90 + e);
    ups.emplace_back(inner, wide, 92 + e);
    downs.emplace_back(wide, inner, 94 + e);
    routing.rows.push_back(every_token);
    routing.weights.push_back(std::vector<float>(tokens, 0.5f + 0.25f * static_cast<float>(e)));
  }
  std::vector<Weights> batch;
  for (int e = 0; e < chosen_by_all; ++e) batch.push_back(Weights{gates[e].view, ups[e].view, downs[e].view});
  const auto x_values = test::random_values<float>(tokens * wide, 96);
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> x_host("writescope::test::x", tokens, wide);
  std::copy(x_values.begin(), x_values.end(), x_host.data());
  const auto x = Kokkos::create_mirror_view_and_copy(Mem(), x_host);
  const ExecSpace space;
  ExpertRunner<ExecSpace, bf16> runner;
  runner.upload(space, routing);
  Matrix<Mem> out("writescope::test::out", tokens, wide);
  runner.add(space, {0, 1}, batch, x, out);
  space.fence();
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int t : {0, 1, 511, 1023, 1024}) {
    std::vector<double> expected(wide, 0.0);
    for (int e = 0; e < chosen_by_all; ++e) {
      const float* xt = x_values.data() + t * wide;
      for (int i = 0; i < inner; ++i) {
        double g = 0, u = 0;
        for (int c = 0; c < wide; ++c) {
          g += static_cast<double>(gates[e].values[i * wide + c]) * xt[c];
          u += static_cast<double>(ups[e].values[i * wide + c]) * xt[c];
        }
        const double h = g / (1 + std::exp(-g)) * u;
        for (int j = 0; j < wide; ++j) expected[j] += routing.weights[e][t] * downs[e].values[j * inner + i] * h;
      }
    }
    for (int c = 0; c < wide; ++c)
      ASSERT_NEAR(got(t, c), expected[c], 1e-4 * (1 + std::abs(expected[c]))) << "token " << t << " column " << c;
  }
}

}  // namespace
}  // namespace writescope
