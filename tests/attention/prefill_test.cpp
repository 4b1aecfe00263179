#include "attention/prefill.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "attention/reference.hpp"
#include "cpu_paths.hpp"
#include "exec_spaces.hpp"
#include "kv_test_data.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

constexpr BlockProduct both_products[] = {BlockProduct::automatic, BlockProduct::portable};

const char* product_name(BlockProduct product) {
  return product == BlockProduct::automatic ? "automatic product" : "portable product";
}

template <class MemSpace>
PartialState<Kokkos::HostSpace> to_host(const PartialState<MemSpace>& state) {
  PartialState<Kokkos::HostSpace> host;
  host.o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.o);
  host.lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.lse);
  return host;
}

template <class MemSpace>
Kokkos::View<const float***, Kokkos::LayoutRight, MemSpace> query_view(const std::vector<float>& values,
                                                                        std::int64_t rows, const AttentionShape& shape) {
  Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> staged("writescope::test::queries", rows,
                                                                        shape.q_heads, shape.key_dim);
  std::copy(values.begin(), values.end(), staged.data());
  return Kokkos::create_mirror_view_and_copy(MemSpace(), staged);
}

template <class C>
class PrefillAttentionTest : public ::testing::Test {
 protected:
  using ExecSpace = typename C::Exec;
  using Scalar = typename C::Storage;
  using MemSpace = typename ExecSpace::memory_space;

  /// Prefill of `chunk` queries at positions [first, first + chunk) over
  /// `tokens` keys restricted to [key_begin, key_end); returns the host copy.
  PartialState<Kokkos::HostSpace> run(const AttentionShape& shape, std::int64_t tokens, std::int64_t first,
                                      std::int64_t chunk, std::int64_t key_begin, std::int64_t key_end,
                                      BlockProduct product = BlockProduct::automatic) {
    keys_ = test::random_values<Scalar>(tokens * shape.kv_heads * shape.key_dim, 21);
    values_ = test::random_values<Scalar>(tokens * shape.kv_heads * shape.value_dim, 22);
    queries_ = test::random_values<float>(chunk * shape.q_heads * shape.key_dim, 23);
    PartialState<MemSpace> out("writescope::test::prefill", static_cast<int>(chunk), shape.q_heads, shape.value_dim);
    PrefillWorkspace<MemSpace> workspace;
    prefill_attention<ExecSpace, Scalar>(
        ExecSpace(), shape, query_view<MemSpace>(queries_, chunk, shape),
        test::token_view<Scalar, MemSpace>(keys_, shape.kv_heads, shape.key_dim, 0, tokens),
        test::token_view<Scalar, MemSpace>(values_, shape.kv_heads, shape.value_dim, 0, tokens), first, key_begin,
        key_end, workspace, out, product);
    ExecSpace().fence();
    return to_host(out);
  }

  std::vector<float> keys_, values_, queries_;
};

using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(PrefillAttentionTest, Cases, test::SpaceAndScalarName);

TYPED_TEST(PrefillAttentionTest, CausalChunkMatchesReference) {
  auto check = [&](BlockProduct product) {
    for (const AttentionShape& shape :
         {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()}) {
      SCOPED_TRACE(shape.name + ", " + product_name(product));
      // A chunk of 45 queries after 92 earlier tokens: query tiles and key
      // tiles end mid-chunk, the last key tile is partial.
      const std::int64_t first = 92, chunk = 45, tokens = first + chunk;
      const auto state = this->run(shape, tokens, first, chunk, 0, tokens, product);
      std::vector<double> reference;
      reference_prefill(shape, this->queries_.data(), chunk, first,
                        ReferenceKV{this->keys_.data(), this->values_.data(), tokens}, reference);
      for (std::int64_t i = 0; i < chunk; ++i) {
        for (int h = 0; h < shape.q_heads; ++h)
          for (int d = 0; d < shape.value_dim; ++d)
            ASSERT_NEAR(state.o(i, h, d), reference[(i * shape.q_heads + h) * shape.value_dim + d], 3e-4)
                << "query " << i << " head " << h << " d " << d;
        // lse: query i over keys [0, first + i + 1), as one decode query.
        std::vector<double> o, lse;
        reference_decode(shape, this->queries_.data() + i * shape.q_heads * shape.key_dim,
                         ReferenceKV{this->keys_.data(), this->values_.data(), tokens}, 0, first + i + 1, o, lse);
        for (int h = 0; h < shape.q_heads; ++h)
          ASSERT_NEAR(state.lse(i, h), lse[h], 1e-4 * (1 + std::abs(lse[h]))) << "query " << i << " head " << h;
      }
    }
  };
  test::for_each_cpu_path([&](CpuPath) { check(BlockProduct::automatic); });
  check(BlockProduct::portable);
}

TYPED_TEST(PrefillAttentionTest, KeyRangesMergeToTheFullAttention) {
  for (BlockProduct product : both_products) {
    SCOPED_TRACE(product_name(product));
    const AttentionShape shape = qwen3_30b_a3b_attention();
    const std::int64_t first = 70, chunk = 30, tokens = 100;
    auto older = this->run(shape, tokens, first, chunk, 0, 50, product);
    auto newer = this->run(shape, tokens, first, chunk, 50, tokens, product);
    auto whole = this->run(shape, tokens, first, chunk, 0, tokens, product);
    merge_into(Kokkos::DefaultHostExecutionSpace(), older, newer);
    Kokkos::fence();
    for (std::int64_t i = 0; i < chunk; ++i)
      for (int h = 0; h < shape.q_heads; ++h) {
        ASSERT_NEAR(older.lse(i, h), whole.lse(i, h), 1e-4 * (1 + std::abs(whole.lse(i, h))));
        for (int d = 0; d < shape.value_dim; ++d) ASSERT_NEAR(older.o(i, h, d), whole.o(i, h, d), 2e-5);
      }
  }
}

TYPED_TEST(PrefillAttentionTest, QueriesBeforeTheKeyRangeGetTheEmptyState) {
  for (BlockProduct product : both_products) {
    SCOPED_TRACE(product_name(product));
    const AttentionShape shape = mixtral_8x7b_attention();
    // Queries at positions 0..9 with keys [5, 20): positions 0..4 see no key.
    const auto state = this->run(shape, 20, 0, 10, 5, 20, product);
    for (int i = 0; i < 10; ++i) {
      if (i < 5) {
        EXPECT_EQ(state.lse(i, 0), -INFINITY) << i;
        EXPECT_EQ(state.o(i, 0, 0), 0.0f) << i;
      } else {
        EXPECT_TRUE(std::isfinite(state.lse(i, 0))) << i;
      }
    }
  }
}

/// Rows of a prompt chunk over a sequence's earlier tokens held in
/// InplaceKVCache blocks of every region (each pool read by a space that can).
template <class C>
class PrefillSegmentsTest : public ::testing::Test {
 protected:
  using ExecSpace = typename C::Exec;
  using Scalar = typename C::Storage;
  using MemSpace = typename ExecSpace::memory_space;

  /// One sequence of `tokens` tokens, block k in all_regions[k % 4].
  void build(const AttentionShape& shape, std::int64_t tokens, int block_tokens, std::int64_t rows) {
    shape_ = shape;
    const BlockGeometry g = shape.block_geometry(block_tokens);
    const std::int64_t blocks = (tokens + block_tokens - 1) / block_tokens;
    const auto bytes = static_cast<std::uint64_t>(blocks * g.block_elements()) * sizeof(Scalar);
    cache_ = std::make_unique<InplaceKVCache<Scalar>>(KVCacheShape{1, g}, KVCacheBudgets{bytes, bytes, bytes},
                                                      BudgetPolicy::strict);
    keys_ = test::random_values<Scalar>(tokens * g.kv_heads * g.key_dim, 31);
    values_ = test::random_values<Scalar>(tokens * g.kv_heads * g.value_dim, 32);
    sequence_ = cache_->add_sequence();
    std::vector<Region> regions;
    for (int k = 0; k < cache_->new_blocks_needed(0, sequence_, tokens); ++k)
      regions.push_back(all_regions[k % region_count]);
    cache_->append(ExecSpace(), 0, sequence_,
                   test::token_view<Scalar, MemSpace>(keys_, g.kv_heads, g.key_dim, 0, tokens),
                   test::token_view<Scalar, MemSpace>(values_, g.kv_heads, g.value_dim, 0, tokens), regions);
    queries_ = test::random_values<float>(rows * shape.q_heads * shape.key_dim, 33);
    rows_ = rows;
  }

  /// Every row over `region`'s blocks within [begin, end), on ExecSpace when it
  /// can read the region's pool, else on a space that can.
  PartialState<Kokkos::HostSpace> attend(Region region, std::int64_t begin, std::int64_t end, BlockProduct product) {
    const auto segments = cache_->segments(0, region, {sequence_}, {TokenRange{begin, end}});
    PartialState<Kokkos::HostSpace> result;
    auto run = [&](const auto& pool) {
      using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
      using Exec = std::conditional_t<Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible, ExecSpace,
                                      std::conditional_t<std::is_same_v<PoolSpace, HostMemSpace>, HostExecSpace,
                                                         GpuExecSpace>>;
      using Mem = typename Exec::memory_space;
      PartialState<Mem> out("writescope::test::segments", static_cast<int>(rows_), shape_.q_heads, shape_.value_dim);
      PrefillWorkspace<Mem> workspace;
      prefill_segments_attention<Exec, Scalar, PoolSpace>(Exec(), shape_, cache_->geometry(), block_order(region),
                                                          query_view<Mem>(queries_, rows_, shape_), pool, segments,
                                                          workspace, out, product);
      Exec().fence();
      result = to_host(out);
    };
    if (region == Region::gpu_resident) run(cache_->vram_pool());
    else if (region == Region::cpu_resident) run(cache_->host_pool());
    else run(cache_->pinned_pool());
    return result;
  }

  /// The four regions' states merged, against the reference over [begin, end) for every row.
  void expect_reference(std::int64_t begin, std::int64_t end, BlockProduct product) {
    std::vector<PartialState<Kokkos::HostSpace>> parts;
    for (Region region : all_regions) parts.push_back(attend(region, begin, end, product));
    PartialState<Kokkos::HostSpace> merged("writescope::test::merged", static_cast<int>(rows_), shape_.q_heads,
                                           shape_.value_dim);
    merge(HostExecSpace(), parts, merged);
    HostExecSpace().fence();
    // The data depend only on the shape (fixed seeds): one reference per shape and range.
    auto& reference = references_[shape_.name + " " + std::to_string(begin) + " " + std::to_string(end)];
    if (reference.empty())
      for (std::int64_t r = 0; r < rows_; ++r) {
        reference.emplace_back();
        std::vector<double> lse;
        reference_decode(shape_, queries_.data() + r * shape_.q_heads * shape_.key_dim,
                         ReferenceKV{keys_.data(), values_.data(), cache_->length(0, sequence_)}, begin, end,
                         reference.back().first, lse);
        reference.back().second = lse;
      }
    for (std::int64_t r = 0; r < rows_; ++r) {
      const std::vector<double>& o = reference[r].first;
      const std::vector<double>& lse = reference[r].second;
      for (int h = 0; h < shape_.q_heads; ++h) {
        ASSERT_NEAR(merged.lse(r, h), lse[h], 1e-4 * (1 + std::abs(lse[h]))) << "row " << r << " head " << h;
        for (int d = 0; d < shape_.value_dim; ++d)
          ASSERT_NEAR(merged.o(r, h, d), o[h * shape_.value_dim + d], 3e-4)
              << "row " << r << " head " << h << " d " << d;
      }
    }
  }

  AttentionShape shape_;
  std::unique_ptr<InplaceKVCache<Scalar>> cache_;
  std::vector<float> keys_, values_, queries_;
  int sequence_ = 0;
  std::int64_t rows_ = 0;
  std::map<std::string, std::vector<std::pair<std::vector<double>, std::vector<double>>>> references_;  // o, lse per row
};

TYPED_TEST_SUITE(PrefillSegmentsTest, Cases, test::SpaceAndScalarName);

TYPED_TEST(PrefillSegmentsTest, EveryRowReadsEveryRegionLikeTheReference) {
  // Blocks of 64 and 24 tokens (head-major key tiles of 16 and of the whole
  // block); 37 rows end mid query tile; a range that starts and ends inside blocks.
  auto check = [&](BlockProduct product, const std::vector<int>& block_sizes) {
    for (const AttentionShape& shape :
         {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()})
      for (int block_tokens : block_sizes) {
        SCOPED_TRACE(shape.name + ", blocks of " + std::to_string(block_tokens) + ", " + product_name(product));
        this->build(shape, 200, block_tokens, 37);
        this->expect_reference(0, 200, product);
        this->expect_reference(5, 181, product);
      }
  };
  test::for_each_cpu_path([&](CpuPath) { check(BlockProduct::automatic, {64, 24}); });
  check(BlockProduct::portable, {24});
}

TYPED_TEST(PrefillSegmentsTest, NoSegmentsGiveTheEmptyState) {
  this->build(mixtral_8x7b_attention(), 10, 64, 3);
  const auto state = this->attend(Region::cpu_resident, 0, 10, BlockProduct::automatic);  // block 0 is in VRAM
  for (int r = 0; r < 3; ++r) EXPECT_EQ(state.lse(r, 0), -INFINITY) << r;
}

// The prefill tiles and linear layers of many rows run host_gemm on the path
// host_gemm_path picks: a faster path compiled in but not picked would still
// pass every accuracy test.
TEST(HostGemmDispatch, TakesTheBestCpuPath) {
  EXPECT_EQ(host_gemm_path(best_cpu_path()), best_cpu_path());
}

}  // namespace
}  // namespace writescope
