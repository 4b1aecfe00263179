#include "moe/layer_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "exec_spaces.hpp"
#include "kv_test_data.hpp"
#include "moe/reference_model.hpp"

namespace writescope {
namespace {

template <class ExecSpace>
class LayerKernelsTest : public ::testing::Test {
 protected:
  using MemSpace = typename ExecSpace::memory_space;

  Matrix<MemSpace> matrix(const std::vector<float>& values, int rows, int columns) {
    Matrix<Kokkos::HostSpace> host("writescope::test::matrix", rows, columns);
    std::copy(values.begin(), values.end(), host.data());
    Matrix<MemSpace> device("writescope::test::matrix", rows, columns);
    Kokkos::deep_copy(device, host);
    return device;
  }
  template <class T>
  Kokkos::View<T*, MemSpace> vector(const std::vector<T>& values) {
    Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(
        const_cast<T*>(values.data()), values.size());
    Kokkos::View<T*, MemSpace> device("writescope::test::vector", values.size());
    Kokkos::deep_copy(device, host);
    return device;
  }
  template <class View>
  static auto to_host(const View& view) {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  }
};
TYPED_TEST_SUITE(LayerKernelsTest, test::ExecSpaceTypes, test::ExecSpaceName);

TYPED_TEST(LayerKernelsTest, RmsNormOverRowsAndOverHeads) {
  const int rows = 5, columns = 48;
  const auto values = test::random_values<float>(rows * columns, 1, 3.0f);
  const auto scale_row = test::random_values<float>(columns, 2);
  const auto scale_head = test::random_values<float>(16, 3);
  for (int width : {columns, 16}) {
    const auto& scale = width == columns ? scale_row : scale_head;
    auto x = this->matrix(values, rows, columns);
    rms_norm(TypeParam(), x, this->vector(scale), width, 1e-6);
    const auto result = this->to_host(x);
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < columns / width; ++g) {
        double sum = 0;
        for (int i = 0; i < width; ++i) sum += std::pow(values[r * columns + g * width + i], 2);
        const double inverse = 1 / std::sqrt(sum / width + 1e-6);
        for (int i = 0; i < width; ++i)
          ASSERT_NEAR(result(r, g * width + i), values[r * columns + g * width + i] * inverse * scale[i], 1e-5);
      }
  }
}

TYPED_TEST(LayerKernelsTest, RopeMatchesTheReferenceRotation) {
  for (const char* model : {"qwen3-30b-a3b", "deepseek-v2-lite"}) {
    const ModelConfig config = model_preset(model);
    const RotaryEmbedding rope = RotaryEmbedding::for_model(config);
    const bool deepseek = config.mla();
    const int dim = deepseek ? config.qk_rope_head_dim : config.head_dim;
    // Qwen3: 4 heads of 128; DeepSeek: 3 heads of nope 128 + rope 64 (rope at offset 128).
    const int stride = deepseek ? 192 : 128, offset = deepseek ? 128 : 0, heads = deepseek ? 3 : 4;
    const int rows = 3;
    const auto values = test::random_values<float>(rows * heads * stride, 4);
    const std::vector<std::int64_t> positions{0, 17, 40000};
    auto x = this->matrix(values, rows, heads * stride);
    apply_rope(TypeParam(), x, this->vector(positions), this->vector(rope.inverse_frequencies),
               static_cast<float>(rope.scale), offset, stride, dim, deepseek);
    const auto result = this->to_host(x);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h) {
        std::vector<float> expected(values.begin() + (r * heads + h) * stride,
                                    values.begin() + (r * heads + h + 1) * stride);
        float* part = expected.data() + offset;
        if (deepseek) {  // the reference gathers evens then odds before rotating
          std::vector<float> copy(part, part + dim);
          for (int i = 0; i < dim / 2; ++i) part[i] = copy[2 * i], part[i + dim / 2] = copy[2 * i + 1];
        }
        rope.apply(part, dim, positions[r]);
        for (int i = 0; i < stride; ++i)
          ASSERT_NEAR(result(r, h * stride + i), expected[i], 2e-5) << model << " row " << r << " head " << h << " " << i;
      }
  }
}

TYPED_TEST(LayerKernelsTest, RoutersPickTheTopKWithTheirWeights) {
  using Mem = typename TypeParam::memory_space;
  const int rows = 6, experts = 64, k = 6;
  auto logits_values = test::random_values<float>(rows * experts, 5, 2.0f);
  logits_values[3] = logits_values[7] = 9.0f;  // a tie in row 0: the lower index wins first
  const auto logits = this->matrix(logits_values, rows, experts);
  for (RouterKind kind : {RouterKind::normalized_topk, RouterKind::scaled_topk}) {
    Kokkos::View<int**, Kokkos::LayoutRight, Mem> chosen("writescope::test::chosen", rows, k);
    Matrix<Mem> weights("writescope::test::weights", rows, k);
    route(TypeParam(), kind, 1.5, logits, chosen, weights);
    const auto chosen_host = this->to_host(chosen);
    const auto weights_host = this->to_host(weights);
    for (int r = 0; r < rows; ++r) {
      const float* row = logits_values.data() + r * experts;
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
      double total = 0, selected = 0;
      for (int e = 0; e < experts; ++e) total += std::exp(row[e] - row[order[0]]);
      for (int j = 0; j < k; ++j) selected += std::exp(row[order[j]] - row[order[0]]) / total;
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(chosen_host(r, j), order[j]) << "row " << r;
        const double p = std::exp(row[order[j]] - row[order[0]]) / total;
        ASSERT_NEAR(weights_host(r, j), kind == RouterKind::normalized_topk ? p / selected : 1.5 * p, 1e-6);
      }
    }
    EXPECT_EQ(chosen_host(0, 0), 3);
    EXPECT_EQ(chosen_host(0, 1), 7);
  }
}

}  // namespace
}  // namespace writescope
