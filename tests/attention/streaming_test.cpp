#include "attention/streaming.hpp"

#include <gtest/gtest.h>

#include "attention/host_prefetch.hpp"
#include "attention/impl/host_block_attention.hpp"
#include "attention/reference.hpp"
#include "framework/streams.hpp"
#include "kv_test_data.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

template <class Scalar>
class StreamedDecodeTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(StreamedDecodeTest, Scalars);

TYPED_TEST(StreamedDecodeTest, ChunkedDoubleBufferedStreamingMatchesReference) {
  using Scalar = TypeParam;
  const AttentionShape shape = qwen3_30b_a3b_attention();
  constexpr int block_tokens = 32;
  const BlockGeometry g = shape.block_geometry(block_tokens);
  const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(Scalar);
  InplaceKVCache<Scalar> cache(KVCacheShape{1, g}, KVCacheBudgets{0, 40 * block_bytes, 40 * block_bytes},
                               BudgetPolicy::strict);
  // Sequence 0: 8 streamed blocks written in order (one contiguous slot run);
  // sequence 1: streamed blocks interleaved with CPU-resident ones.
  const std::vector<std::int64_t> lengths{250, 170};
  std::vector<std::vector<float>> keys, values;
  std::vector<int> sequences;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    keys.push_back(test::random_values<Scalar>(lengths[s] * g.kv_heads * g.key_dim, 30 + s));
    values.push_back(test::random_values<Scalar>(lengths[s] * g.kv_heads * g.value_dim, 40 + s));
    sequences.push_back(cache.add_sequence());
    std::vector<Region> regions;
    for (int k = 0; k < cache.new_blocks_needed(0, sequences[s], lengths[s]); ++k)
      regions.push_back(s == 0 || k % 2 == 0 ? Region::gpu_streamed : Region::cpu_resident);
    cache.append(HostExecSpace(), 0, sequences[s],
                 test::token_view<Scalar, HostMemSpace>(keys[s], g.kv_heads, g.key_dim, 0, lengths[s]),
                 test::token_view<Scalar, HostMemSpace>(values[s], g.kv_heads, g.value_dim, 0, lengths[s]), regions);
  }
  const std::vector<TokenRange> ranges{{0, 250}, {5, 170}};
  const auto segments = cache.segments(0, Region::gpu_streamed, sequences, ranges);
  const auto host_queries = test::random_values<float>(2 * shape.q_heads * shape.key_dim, 9);
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> staged("writescope::test::queries", 2, shape.q_heads,
                                                                   shape.key_dim);
  std::copy(host_queries.begin(), host_queries.end(), staged.data());
  auto queries = Kokkos::create_mirror_view_and_copy(GpuMemSpace(), staged);

  GpuStreams streams(2);
  for (int chunk_blocks : {1, 3, 100}) {
    SCOPED_TRACE("chunk_blocks " + std::to_string(chunk_blocks));
    StreamedDecode<Scalar> engine(shape, g, chunk_blocks);
    PartialState<GpuMemSpace> out("writescope::test::out", 2, shape.q_heads, shape.value_dim);
    engine.run(streams[0], streams[1], queries, cache.pinned_pool(), segments, out);
    streams[1].fence();
    // 8 + 3 streamed blocks in pinned slots 0..10 (sequence 1's land right
    // after sequence 0's): consecutive slots travel in one copy per chunk.
    EXPECT_EQ(engine.bytes_copied(), 11 * block_bytes);
    EXPECT_EQ(engine.copies_issued(), chunk_blocks == 1 ? 11 : chunk_blocks == 3 ? 4 : 1);
    auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
    auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
    for (int b = 0; b < 2; ++b) {
      // Reference over exactly the streamed tokens of the range, as written
      // above (not as the cache reports them): attend each streamed span
      // separately and merge in double.
      const std::vector<std::vector<TokenRange>> streamed{{{0, 250}}, {{5, 32}, {64, 96}, {128, 160}}};
      std::vector<std::vector<double>> part_o(streamed[b].size()), part_lse(streamed[b].size()),
          part_spread(streamed[b].size());
      for (std::size_t p = 0; p < streamed[b].size(); ++p)
        reference_decode(shape, host_queries.data() + b * shape.q_heads * shape.key_dim,
                         ReferenceKV{keys[b].data(), values[b].data(), lengths[b]}, streamed[b][p].begin,
                         streamed[b][p].end, part_o[p], part_lse[p], &part_spread[p]);
      // Each part weighs exp(lse) (relative to the largest); so do its squared terms.
      std::vector<double> merged_o(shape.q_heads * shape.value_dim, 0.0), merged_lse(shape.q_heads),
          merged_spread(shape.q_heads * shape.value_dim, 0.0);
      for (int h = 0; h < shape.q_heads; ++h) {
        double m = -INFINITY, total = 0;
        for (const auto& lse_of : part_lse) m = std::max(m, lse_of[h]);
        for (std::size_t p = 0; p < part_o.size(); ++p) {
          const double weight = std::exp(part_lse[p][h] - m);
          total += weight;
          for (int d = 0; d < shape.value_dim; ++d) {
            const int e = h * shape.value_dim + d;
            merged_o[e] += weight * part_o[p][e];
            merged_spread[e] += weight * weight * part_spread[p][e] * part_spread[p][e];
          }
        }
        merged_lse[h] = m + std::log(total);
        for (int d = 0; d < shape.value_dim; ++d) {
          merged_o[h * shape.value_dim + d] /= total;
          merged_spread[h * shape.value_dim + d] = std::sqrt(merged_spread[h * shape.value_dim + d]) / total;
        }
      }
      const bool rounded = test::host_bf16_products<Scalar>(impl::host_product_path(
          std::is_same_v<Scalar, bf16> ? active_decode_cpu_path(shape, BlockOrder::token_major) : active_cpu_path(), g,
          BlockOrder::token_major, shape.group(), std::is_same_v<Scalar, bf16>));
      for (int h = 0; h < shape.q_heads; ++h) {
        ASSERT_NEAR(lse(b, h), merged_lse[h], test::attention_lse_tolerance(rounded, merged_lse[h]));
        for (int d = 0; d < shape.value_dim; ++d)
          ASSERT_NEAR(o(b, h, d), merged_o[h * shape.value_dim + d], test::attention_o_tolerance(rounded, merged_spread[h * shape.value_dim + d]));
      }
    }
  }
}

// Two runs back to back, with no fence between them: the second run's first
// copies wait until the first run's last kernels have read the landing
// buffers (an odd number of one-block chunks ends the first run in buffer 0,
// which the second fills first). Each run's states equal those of the same
// run made alone.
TEST(StreamedDecode, BackToBackRunsKeepEachOthersBuffers) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  constexpr int block_tokens = 32, blocks = 11;
  const BlockGeometry g = shape.block_geometry(block_tokens);
  const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(bf16);
  InplaceKVCache<bf16> cache(KVCacheShape{1, g}, KVCacheBudgets{0, blocks * block_bytes, 0}, BudgetPolicy::strict);
  const std::int64_t length = blocks * block_tokens;
  const auto keys = test::random_values<bf16>(length * g.kv_heads * g.key_dim, 50);
  const auto values = test::random_values<bf16>(length * g.kv_heads * g.value_dim, 51);
  const int sequence = cache.add_sequence();
  cache.append(HostExecSpace(), 0, sequence, test::token_view<bf16, HostMemSpace>(keys, g.kv_heads, g.key_dim, 0, length),
               test::token_view<bf16, HostMemSpace>(values, g.kv_heads, g.value_dim, 0, length),
               std::vector<Region>(blocks, Region::gpu_streamed));
  const auto host_queries = test::random_values<float>(shape.q_heads * shape.key_dim, 52);
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> staged("writescope::test::queries", 1, shape.q_heads,
                                                                   shape.key_dim);
  std::copy(host_queries.begin(), host_queries.end(), staged.data());
  const auto queries = Kokkos::create_mirror_view_and_copy(GpuMemSpace(), staged);
  // Two different ranges, so that a run that read the other's blocks shows.
  const auto first = cache.segments(0, Region::gpu_streamed, {sequence}, {TokenRange{0, length}});
  const auto second = cache.segments(0, Region::gpu_streamed, {sequence}, {TokenRange{3, length - 40}});
  GpuStreams streams(2);
  StreamedDecode<bf16> engine(shape, g, 1);
  const auto state = [&] {
    return PartialState<GpuMemSpace>("writescope::test::out", 1, shape.q_heads, shape.value_dim);
  };
  const auto host_copy = [](const PartialState<GpuMemSpace>& out) {
    auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
    auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
    std::vector<float> all(o.data(), o.data() + o.span());
    all.insert(all.end(), lse.data(), lse.data() + lse.span());
    return all;
  };
  const PartialState<GpuMemSpace> first_out = state(), second_out = state();
  engine.run(streams[0], streams[1], queries, cache.pinned_pool(), first, first_out);
  EXPECT_EQ(engine.copies_issued(), blocks);  // an odd number of chunks: the last in buffer 0
  engine.run(streams[0], streams[1], queries, cache.pinned_pool(), second, second_out);
  streams[1].fence();
  for (const auto& [segments, out] : {std::pair{first, first_out}, std::pair{second, second_out}}) {
    const PartialState<GpuMemSpace> alone = state();
    engine.run(streams[0], streams[1], queries, cache.pinned_pool(), segments, alone);
    streams[1].fence();
    EXPECT_EQ(host_copy(out), host_copy(alone));
  }
  EXPECT_NE(host_copy(first_out), host_copy(second_out));
  // And each is its range's attention (a host build runs the two in turn,
  // where the comparison above cannot fail).
  const bool rounded = test::host_bf16_products<bf16>(impl::host_product_path(
      active_decode_cpu_path(shape, BlockOrder::token_major), g, BlockOrder::token_major, shape.group(), true));
  for (const auto& [range, out] : {std::pair{TokenRange{0, length}, first_out}, {TokenRange{3, length - 40}, second_out}}) {
    std::vector<double> ref_o, ref_lse, spread;
    reference_decode(shape, host_queries.data(), ReferenceKV{keys.data(), values.data(), length}, range.begin,
                     range.end, ref_o, ref_lse, &spread);
    auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
    auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
    for (int h = 0; h < shape.q_heads; ++h) {
      ASSERT_NEAR(lse(0, h), ref_lse[h], test::attention_lse_tolerance(rounded, ref_lse[h])) << range.begin;
      for (int d = 0; d < shape.value_dim; ++d)
        ASSERT_NEAR(o(0, h, d), ref_o[h * shape.value_dim + d],
                    test::attention_o_tolerance(rounded, spread[h * shape.value_dim + d]))
            << range.begin;
    }
  }
}

// Two rows over one sequence's blocks (a batch may name a sequence twice):
// a chunk copies each pool slot once and both rows read it from there.
TEST(StreamedDecode, RowsSharingBlocksCopyEachBlockOnce) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  const BlockGeometry g = shape.block_geometry(32);
  const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(bf16);
  InplaceKVCache<bf16> cache(KVCacheShape{1, g}, KVCacheBudgets{0, 8 * block_bytes, 0}, BudgetPolicy::strict);
  const std::int64_t length = 250;
  const auto keys = test::random_values<bf16>(length * g.kv_heads * g.key_dim, 60);
  const auto values = test::random_values<bf16>(length * g.kv_heads * g.value_dim, 61);
  const int sequence = cache.add_sequence();
  cache.append(HostExecSpace(), 0, sequence, test::token_view<bf16, HostMemSpace>(keys, g.kv_heads, g.key_dim, 0, length),
               test::token_view<bf16, HostMemSpace>(values, g.kv_heads, g.value_dim, 0, length),
               std::vector<Region>(8, Region::gpu_streamed));
  const std::vector<TokenRange> ranges{{0, length}, {40, 200}};
  const auto segments = cache.segments(0, Region::gpu_streamed, {sequence, sequence}, ranges);
  const auto host_queries = test::random_values<float>(2 * shape.q_heads * shape.key_dim, 62);
  Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> staged("writescope::test::queries", 2, shape.q_heads,
                                                                   shape.key_dim);
  std::copy(host_queries.begin(), host_queries.end(), staged.data());
  const auto queries = Kokkos::create_mirror_view_and_copy(GpuMemSpace(), staged);
  GpuStreams streams(2);
  StreamedDecode<bf16> engine(shape, g, 100);
  PartialState<GpuMemSpace> out("writescope::test::out", 2, shape.q_heads, shape.value_dim);
  engine.run(streams[0], streams[1], queries, cache.pinned_pool(), segments, out);
  streams[1].fence();
  EXPECT_EQ(engine.bytes_copied(), 8 * block_bytes);
  EXPECT_EQ(engine.copies_issued(), 1);
  auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
  auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
  const bool rounded = test::host_bf16_products<bf16>(impl::host_product_path(
      active_decode_cpu_path(shape, BlockOrder::token_major), g, BlockOrder::token_major, shape.group(), true));
  for (int b = 0; b < 2; ++b) {
    std::vector<double> ref_o, ref_lse, spread;
    reference_decode(shape, host_queries.data() + b * shape.q_heads * shape.key_dim,
                     ReferenceKV{keys.data(), values.data(), length}, ranges[b].begin, ranges[b].end, ref_o, ref_lse,
                     &spread);
    for (int h = 0; h < shape.q_heads; ++h) {
      ASSERT_NEAR(lse(b, h), ref_lse[h], test::attention_lse_tolerance(rounded, ref_lse[h])) << "row " << b;
      for (int d = 0; d < shape.value_dim; ++d)
        ASSERT_NEAR(o(b, h, d), ref_o[h * shape.value_dim + d],
                    test::attention_o_tolerance(rounded, spread[h * shape.value_dim + d]))
            << "row " << b;
    }
  }
}

TEST(StreamedDecode, EmptySegmentListGivesEmptyStates) {
  const AttentionShape shape = mixtral_8x7b_attention();
  const BlockGeometry g = shape.block_geometry(16);
  InplaceKVCache<bf16> cache(KVCacheShape{1, g}, KVCacheBudgets{0, 1 << 20, 0}, BudgetPolicy::strict);
  Kokkos::View<float***, Kokkos::LayoutRight, GpuMemSpace> queries("writescope::test::queries", 1, shape.q_heads,
                                                                   shape.key_dim);
  PartialState<GpuMemSpace> out("writescope::test::out", 1, shape.q_heads, shape.value_dim);
  GpuStreams streams(2);
  StreamedDecode<bf16> engine(shape, g, 4);
  engine.run(streams[0], streams[1], queries, cache.pinned_pool(), {}, out);
  streams[1].fence();
  auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
  for (int h = 0; h < shape.q_heads; ++h) EXPECT_EQ(lse(0, h), -INFINITY);
  EXPECT_EQ(engine.bytes_copied(), 0u);
  EXPECT_THROW(StreamedDecode<bf16>(shape, g, 0), std::invalid_argument);
}

}  // namespace
}  // namespace writescope
