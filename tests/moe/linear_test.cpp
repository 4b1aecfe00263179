#include "moe/linear.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "cpu_paths.hpp"
#include "exec_spaces.hpp"
#include "kv_test_data.hpp"
#include "moe/impl/linear_host.hpp"

namespace writescope {
namespace {

template <class C>
class LinearTest : public ::testing::Test {};
using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(LinearTest, Cases, test::SpaceAndScalarName);

/// One product's operands on Mem, with the host values they hold.
template <class Scalar, class Mem>
struct Product {
  int rows, in, out;
  std::vector<float> x_values, w_values;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x, y;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> w;

  Product(int rows_, int in_, int out_, unsigned seed) : rows(rows_), in(in_), out(out_) {
    x_values = test::random_values<float>(rows * in, seed);
    w_values = test::random_values<Scalar>(out * in, seed + 1);
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> x_host("writescope::test::x", rows, in);
    Kokkos::View<Scalar**, Kokkos::LayoutRight, Kokkos::HostSpace> w_host("writescope::test::w", out, in);
    std::copy(x_values.begin(), x_values.end(), x_host.data());
    for (int i = 0; i < out * in; ++i) w_host.data()[i] = from_float<Scalar>(w_values[i]);
    x = Kokkos::create_mirror_view_and_copy(Mem(), x_host);
    w = Kokkos::create_mirror_view_and_copy(Mem(), w_host);
    y = Kokkos::View<float**, Kokkos::LayoutRight, Mem>("writescope::test::y", rows, out);
    // The products store y, never add to it.
    Kokkos::deep_copy(y, std::numeric_limits<float>::quiet_NaN());
  }

  /// y against x W^T in double.
  void expect_reference() const {
    const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < out; ++j) {
        double expected = 0;
        for (int c = 0; c < in; ++c) expected += static_cast<double>(x_values[r * in + c]) * w_values[j * in + c];
        ASSERT_NEAR(result(r, j), expected, 1e-4 * (1 + std::abs(expected))) << rows << "x" << in << "x" << out;
      }
  }
};

// Shapes with and without the vector fast paths: in % 32, in % 8, out % 16, out % 4, 1 to 9 rows;
// beyond max_linear_rows the GEMM path, with tail rows, a partial feature
// block and more than one 256-column block; decode rows over several
// column blocks of split inputs (512, or 256 for 5-8 rows on AVX-512), the
// last one partial (of 16 columns but not 32: AVX2 only); 9-32 rows in
// groups of 8 split rows, the last
// group partial (17: one row).
const std::vector<std::tuple<int, int, int>> linear_shapes{{1, 64, 12},   {5, 128, 36},   {3, 20, 7},    {8, 96, 35},
                                                           {2, 32, 16},   {7, 64, 18},    {9, 64, 20},   {8, 1056, 35},
                                                           {3, 544, 20},  {6, 1024, 18},  {4, 560, 9},   {1, 2080, 20},
                                                           {17, 544, 20}, {30, 1056, 18}, {37, 300, 70}, {64, 64, 130}};

/// y = x W^T against a double reference for every shape, one linear() each.
template <class ExecSpace, class Scalar, class Mem>
void expect_reference() {
  for (const auto& [rows, in, out] : linear_shapes) {
    const Product<Scalar, Mem> product(rows, in, out, 1);
    linear<ExecSpace, Scalar>(ExecSpace(), product.x, product.w, product.y);
    product.expect_reference();
  }
}

/// Every shape in one linear_batch, and each split-path shape twice with other
/// values (a work item of one problem run on another's operands fails).
template <class ExecSpace, class Scalar, class Mem>
void expect_batch_reference() {
  std::vector<Product<Scalar, Mem>> products;
  unsigned seed = 10;
  for (const auto& [rows, in, out] : linear_shapes) {
    products.emplace_back(rows, in, out, seed += 2);
    products.emplace_back(rows, in, out, seed += 2);
  }
  std::vector<LinearProblem<Mem, Scalar>> problems;
  for (const auto& p : products) problems.push_back({p.x, p.w, p.y});
  linear_batch<ExecSpace, Scalar>(ExecSpace(), problems);
  for (const auto& p : products) p.expect_reference();
}

// On every CPU path this machine runs (others named as skipped), all within
// fp32 accuracy (the AVX-512 BF16 path splits x into two bf16 parts).
TYPED_TEST(LinearTest, MatchesADoubleReferenceOnEveryCpuPath) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  test::for_each_cpu_path([](CpuPath) { expect_reference<ExecSpace, Scalar, Mem>(); });
}

// One launch for a decode step's products (linear_batch), on every CPU path.
TYPED_TEST(LinearTest, BatchesMatchADoubleReferenceOnEveryCpuPath) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  test::for_each_cpu_path([](CpuPath) { expect_batch_reference<ExecSpace, Scalar, Mem>(); });
}

// The GPU's kernel (impl::linear_team, what linear() and linear_batch() run
// off the host) on every space, each shape alone and all of them twice in
// one call: rows in groups of 8 (1, 2, 4 and 8 per launch), up to 6 groups of
// any products a launch, weight rows past the last of a thread's 4, columns
// eight at a time and one at a time.
TYPED_TEST(LinearTest, TeamKernelMatchesADoubleReference) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  for (const auto& [rows, in, out] : linear_shapes) {
    const Product<Scalar, Mem> product(rows, in, out, 3);
    impl::linear_team<ExecSpace, Scalar>(ExecSpace(), {{product.x, product.w, product.y}});
    product.expect_reference();
  }
  std::vector<Product<Scalar, Mem>> products;
  unsigned seed = 30;
  for (int copy = 0; copy < 2; ++copy)
    for (const auto& [rows, in, out] : linear_shapes) products.emplace_back(rows, in, out, seed += 2);
  std::vector<LinearProblem<Mem, Scalar>> problems;
  for (const auto& p : products) problems.push_back({p.x, p.w, p.y});
  impl::linear_team<ExecSpace, Scalar>(ExecSpace(), problems);
  for (const auto& p : products) p.expect_reference();
}

// The GPU's prompt-chunk kernel (impl::linear_tiled, what linear() and
// linear_batch() run off the host beyond max_linear_rows rows) on every
// space: every decode shape, and tiles cut at each edge (rows, features and
// columns one past, one short of and at a tile's size; several tiles each way).
TYPED_TEST(LinearTest, TiledKernelMatchesADoubleReference) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  auto shapes = linear_shapes;
  shapes.insert(shapes.end(), {{1, 1, 1}, {64, 32, 64}, {65, 33, 63}, {63, 31, 65}, {130, 100, 129}, {200, 544, 70}});
  unsigned seed = 50;
  for (const auto& [rows, in, out] : shapes) {
    const Product<Scalar, Mem> product(rows, in, out, seed += 2);
    impl::linear_tiled<ExecSpace, Scalar>(ExecSpace(), product.x, product.w, product.y);
    product.expect_reference();
  }
}

TYPED_TEST(LinearTest, RejectsMismatchedShapes) {
  using ExecSpace = typename TypeParam::Exec;
  using Scalar = typename TypeParam::Storage;
  using Mem = typename ExecSpace::memory_space;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("writescope::test::x", 2, 8), y("writescope::test::y", 2, 3);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> w("writescope::test::w", 4, 8);
  EXPECT_THROW((linear<ExecSpace, Scalar>(ExecSpace(), x, w, y)), std::invalid_argument);
  EXPECT_THROW((linear_batch<ExecSpace, Scalar>(ExecSpace(), {LinearProblem<Mem, Scalar>{x, w, y}})),
               std::invalid_argument);
}

#ifdef WRITESCOPE_HOST_AVX512_BF16
/// The AMX linear kernel (`kernel`: hardware or emulated tiles) on split
/// groups of 1 to 8 rows, whole and partial feature blocks, weight rows
/// further apart than `in`, against a double reference: inputs split into
/// bf16 high and low halves stay near fp32 (one bf16 input alone misses the
/// tolerance by far).
template <class Kernel>
void expect_tile_linear(Kernel kernel) {
  for (const auto& [rows, in, features] :
       std::vector<std::tuple<int, int, int>>{{1, 32, 16}, {3, 96, 5}, {8, 256, 16}, {5, 4096, 13}}) {
    const std::int64_t w_stride = in + 32, y_stride = features + 3;
    const auto x = test::random_values<float>(rows * in, 3);
    const auto w_values = test::random_values<bf16>(static_cast<int>(features * w_stride), 4);
    std::vector<bf16> w(w_values.size());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = from_float<bf16>(w_values[i]);
    std::vector<std::uint32_t> pairs(static_cast<std::size_t>(rows) * in);
    impl::pair_inputs_amx(x.data(), in, rows, in, pairs.data());
    std::vector<float> y(static_cast<std::size_t>(rows * y_stride), -1.0f);
    kernel(pairs.data(), rows, in, w.data(), w_stride, features, y.data(), y_stride);
    for (int r = 0; r < rows; ++r)
      for (int f = 0; f < features; ++f) {
        // Rounding errors of independent terms add up like their root sum of squares.
        double expected = 0, squares = 0;
        for (int c = 0; c < in; ++c) {
          const double term = static_cast<double>(x[r * in + c]) * to_float(w[f * w_stride + c]);
          expected += term, squares += term * term;
        }
        ASSERT_NEAR(y[r * y_stride + f], expected, 1e-4 * (1 + std::sqrt(squares)))
            << rows << " rows x " << in << " x " << features << " features, row " << r << " feature " << f;
      }
  }
}

TEST(LinearAmx, EmulatedTilesMatchADoubleReference) { expect_tile_linear(impl::linear_features_amx_emulated); }

// Where amx_bf16 runs, linear() takes the tiles on every CPU path test as well.
TEST(LinearAmx, HardwareTilesMatchADoubleReference) {
  if (!cpu_path_supported(CpuPath::amx_bf16))
    GTEST_SKIP() << "amx_bf16: " << test::unsupported_reason(CpuPath::amx_bf16);
  expect_tile_linear(impl::linear_features_amx);
}
#endif

// A decode batch the fastest path silently refuses would run on a slower one
// and still pass every accuracy test; this catches it.
TEST(LinearDispatch, DecodeBatchesOfExpertWeightsTakeTheBestCpuPath) {
  for (int rows = 1; rows <= impl::max_linear_rows; ++rows)
    for (int in : {2048, 4096, 14336})
      EXPECT_EQ(impl::linear_path(best_cpu_path(), rows, in, true), best_cpu_path()) << rows << " rows x " << in;
}

}  // namespace
}  // namespace writescope
