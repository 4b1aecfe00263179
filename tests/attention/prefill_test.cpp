#include "attention/prefill.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attention/reference.hpp"
#include "exec_spaces.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace {

template <class C>
class PrefillAttentionTest : public ::testing::Test {
 protected:
  using ExecSpace = typename C::Exec;
  using Scalar = typename C::Storage;
  using MemSpace = typename ExecSpace::memory_space;

  /// Prefill of `chunk` queries at positions [first, first + chunk) over
  /// `tokens` keys restricted to [key_begin, key_end); returns the host copy.
  PartialState<Kokkos::HostSpace> run(const AttentionShape& shape, std::int64_t tokens, std::int64_t first,
                                      std::int64_t chunk, std::int64_t key_begin, std::int64_t key_end) {
    keys_ = test::random_values<Scalar>(tokens * shape.kv_heads * shape.key_dim, 21);
    values_ = test::random_values<Scalar>(tokens * shape.kv_heads * shape.value_dim, 22);
    queries_ = test::random_values<float>(chunk * shape.q_heads * shape.key_dim, 23);
    Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> staged("writescope::test::queries", chunk,
                                                                          shape.q_heads, shape.key_dim);
    std::copy(queries_.begin(), queries_.end(), staged.data());
    auto queries = Kokkos::create_mirror_view_and_copy(MemSpace(), staged);
    PartialState<MemSpace> out("writescope::test::prefill", static_cast<int>(chunk), shape.q_heads, shape.value_dim);
    prefill_attention<ExecSpace, Scalar>(
        ExecSpace(), shape, queries, test::token_view<Scalar, MemSpace>(keys_, shape.kv_heads, shape.key_dim, 0, tokens),
        test::token_view<Scalar, MemSpace>(values_, shape.kv_heads, shape.value_dim, 0, tokens), first, key_begin,
        key_end, out);
    ExecSpace().fence();
    PartialState<Kokkos::HostSpace> host;
    host.o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
    host.lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
    return host;
  }

  std::vector<float> keys_, values_, queries_;
};

using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(PrefillAttentionTest, Cases, test::SpaceAndScalarName);

TYPED_TEST(PrefillAttentionTest, CausalChunkMatchesReference) {
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()}) {
    SCOPED_TRACE("key_dim " + std::to_string(shape.key_dim) + " kv_heads " + std::to_string(shape.kv_heads));
    // A chunk of 45 queries after 92 earlier tokens: key tiles of 64 end mid-chunk.
    const std::int64_t first = 92, chunk = 45, tokens = first + chunk;
    const auto state = this->run(shape, tokens, first, chunk, 0, tokens);
    std::vector<double> reference;
    reference_prefill(shape, this->queries_.data(), chunk, first,
                      ReferenceKV{this->keys_.data(), this->values_.data(), tokens}, reference);
    for (std::int64_t i = 0; i < chunk; ++i)
      for (int h = 0; h < shape.q_heads; ++h)
        for (int d = 0; d < shape.value_dim; ++d)
          ASSERT_NEAR(state.o(i, h, d), reference[(i * shape.q_heads + h) * shape.value_dim + d], 3e-4)
              << "query " << i << " head " << h << " d " << d;
  }
}

TYPED_TEST(PrefillAttentionTest, KeyRangesMergeToTheFullAttention) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  const std::int64_t first = 70, chunk = 30, tokens = 100;
  auto older = this->run(shape, tokens, first, chunk, 0, 50);
  auto newer = this->run(shape, tokens, first, chunk, 50, tokens);
  auto whole = this->run(shape, tokens, first, chunk, 0, tokens);
  merge_into(Kokkos::DefaultHostExecutionSpace(), older, newer);
  Kokkos::fence();
  for (std::int64_t i = 0; i < chunk; ++i)
    for (int h = 0; h < shape.q_heads; ++h) {
      ASSERT_NEAR(older.lse(i, h), whole.lse(i, h), 1e-4 * (1 + std::abs(whole.lse(i, h))));
      for (int d = 0; d < shape.value_dim; ++d) ASSERT_NEAR(older.o(i, h, d), whole.o(i, h, d), 2e-5);
    }
}

TYPED_TEST(PrefillAttentionTest, QueriesBeforeTheKeyRangeGetTheEmptyState) {
  const AttentionShape shape = mixtral_8x7b_attention();
  // Queries at positions 0..9 with keys [5, 20): positions 0..4 see no key.
  const auto state = this->run(shape, 20, 0, 10, 5, 20);
  for (int i = 0; i < 10; ++i) {
    if (i < 5) {
      EXPECT_EQ(state.lse(i, 0), -INFINITY) << i;
      EXPECT_EQ(state.o(i, 0, 0), 0.0f) << i;
    } else {
      EXPECT_TRUE(std::isfinite(state.lse(i, 0))) << i;
    }
  }
}

}  // namespace
}  // namespace writescope
