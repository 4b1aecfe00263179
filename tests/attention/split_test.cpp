#include "attention/split.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "attention/impl/host_block_attention.hpp"
#include "attention/reference.hpp"
#include "framework/concurrent.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace {

std::vector<BlockSegment> sorted_concat(std::vector<BlockSegment> a, const std::vector<BlockSegment>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::stable_sort(a.begin(), a.end(),
                   [](const BlockSegment& x, const BlockSegment& y) { return x.batch_index < y.batch_index; });
  return a;
}

template <class Scalar>
class SplitDecodeTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(SplitDecodeTest, Scalars);

TYPED_TEST(SplitDecodeTest, BothDevicesTogetherMatchTheReferenceWhereverTheBandIsReadOverAnyRange) {
  using Scalar = TypeParam;
  const AttentionShape shape = mixtral_8x7b_attention();
  constexpr int block_tokens = 32;
  const BlockGeometry g = shape.block_geometry(block_tokens);
  const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(Scalar);
  InplaceKVCache<Scalar> cache(KVCacheShape{1, g}, KVCacheBudgets{8 * block_bytes, 16 * block_bytes, 8 * block_bytes},
                               BudgetPolicy::strict);
  const std::vector<std::int64_t> lengths{300, 90};
  std::vector<std::vector<float>> keys, values;
  std::vector<int> sequences;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    keys.push_back(test::random_values<Scalar>(lengths[s] * g.kv_heads * g.key_dim, 50 + s));
    values.push_back(test::random_values<Scalar>(lengths[s] * g.kv_heads * g.value_dim, 60 + s));
    sequences.push_back(cache.add_sequence());
    std::vector<Region> regions;
    for (int k = 0; k < cache.new_blocks_needed(0, sequences[s], lengths[s]); ++k)
      regions.push_back(all_regions[(k + s) % region_count]);
    cache.append(HostExecSpace(), 0, sequences[s],
                 test::token_view<Scalar, HostMemSpace>(keys[s], g.kv_heads, g.key_dim, 0, lengths[s]),
                 test::token_view<Scalar, HostMemSpace>(values[s], g.kv_heads, g.value_dim, 0, lengths[s]), regions);
  }
  const auto queries_data = test::random_values<float>(2 * shape.q_heads * shape.key_dim, 70);
  // In a CUDA build the GPU's products share the result (kv_test_data.hpp).
  const ScopedCpuPath host_path(has_gpu ? test::fp32_cpu_path() : active_cpu_path());
  const bool bf16_products =
      !has_gpu && test::host_bf16_products<Scalar>(impl::host_product_path(
                      active_cpu_path(), g, BlockOrder::head_major, shape.group(), std::is_same_v<Scalar, bf16>));
  // Whole sequences, then windows that begin and end inside blocks (a sliding window, a prompt chunk's earlier tokens).
  const std::vector<std::vector<TokenRange>> range_sets{{{0, lengths[0]}, {0, lengths[1]}}, {{45, 270}, {7, 61}}};
  // One instance for every batch: the second sequence alone, then both (its states grow), then the second again.
  SplitDecode<Scalar> split(shape, g, 2);
  for (const std::vector<TokenRange>& ranges : range_sets) {
    for (const std::vector<int>& batch : {std::vector<int>{1}, std::vector<int>{0, 1}, std::vector<int>{1}}) {
      const int rows = static_cast<int>(batch.size());
      SCOPED_TRACE("batch of " + std::to_string(rows) + ", first range [" + std::to_string(ranges[batch[0]].begin) +
                   ", " + std::to_string(ranges[batch[0]].end) + ")");
      std::vector<int> batch_sequences;
      std::vector<TokenRange> batch_ranges;
      Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> queries("writescope::test::queries", rows,
                                                                        shape.q_heads, shape.key_dim);
      for (int b = 0; b < rows; ++b) {
        batch_sequences.push_back(sequences[batch[b]]);
        batch_ranges.push_back(ranges[batch[b]]);
        std::copy_n(queries_data.data() + batch[b] * shape.q_heads * shape.key_dim, shape.q_heads * shape.key_dim,
                    queries.data() + b * shape.q_heads * shape.key_dim);
      }
      const auto segments = [&](Region region) { return cache.segments(0, region, batch_sequences, batch_ranges); };
      SplitPlan as_written{segments(Region::gpu_resident), segments(Region::gpu_streamed),
                           segments(Region::cpu_resident), segments(Region::cpu_streamed)};
      SplitPlan gpu_takes_band{segments(Region::gpu_resident),
                               sorted_concat(segments(Region::gpu_streamed), segments(Region::cpu_streamed)),
                               segments(Region::cpu_resident),
                               {}};
      SplitPlan cpu_takes_band{segments(Region::gpu_resident),
                               {},
                               segments(Region::cpu_resident),
                               sorted_concat(segments(Region::gpu_streamed), segments(Region::cpu_streamed))};
      PartialState<GpuMemSpace> out("writescope::test::split_out", rows, shape.q_heads, shape.value_dim);
      // Each plan with the two shares one after the other, then on two threads.
      const std::vector<std::pair<bool, const SplitPlan*>> runs{
          {false, &as_written}, {false, &gpu_takes_band}, {false, &cpu_takes_band},
          {true, &as_written},  {true, &gpu_takes_band},  {true, &cpu_takes_band}};
      for (const auto& [worker_thread, plan] : runs) {
        const ScopedGpuWorkerThread worker(worker_thread);
        const long threads_before = worker_tasks_run();
        const SplitTimings timings = split.run(cache, queries, *plan, out);
        EXPECT_EQ(worker_tasks_run() > threads_before, gpu_worker_thread());
        EXPECT_EQ(timings.streamed_bytes, plan->gpu_streamed.size() * block_bytes);
        EXPECT_GE(timings.step_seconds, std::max(timings.gpu_seconds, timings.cpu_seconds) * 0.99);
        // What feedback fits the link and HBM rates to: each GPU path's own
        // time, zero where it had nothing (the resident one, on a GPU, also
        // where it is not known exactly); on a host build they run in turn.
        EXPECT_EQ(timings.streamed_seconds > 0, !plan->gpu_streamed.empty());
        if (plan->gpu_resident.empty()) {
          EXPECT_EQ(timings.resident_seconds, 0.0);
        } else if (!has_gpu) {
          EXPECT_GT(timings.resident_seconds, 0.0);
        }
        EXPECT_LE(std::max(timings.streamed_seconds, timings.resident_seconds), timings.gpu_seconds * 1.01 + 1e-5);
        if (!has_gpu) {
          EXPECT_LE(timings.streamed_seconds + timings.resident_seconds, timings.gpu_seconds * 1.01 + 1e-5);
        }
        auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.o);
        auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.lse);
        for (int b = 0; b < rows; ++b) {
          const int s = batch[b];
          std::vector<double> ref_o, ref_lse, spread;
          reference_decode(shape, queries_data.data() + s * shape.q_heads * shape.key_dim,
                           ReferenceKV{keys[s].data(), values[s].data(), lengths[s]}, ranges[s].begin, ranges[s].end,
                           ref_o, ref_lse, &spread);
          for (int h = 0; h < shape.q_heads; ++h) {
            ASSERT_NEAR(lse(b, h), ref_lse[h], test::attention_lse_tolerance(bf16_products, ref_lse[h]));
            for (int d = 0; d < shape.value_dim; ++d)
              ASSERT_NEAR(o(b, h, d), ref_o[h * shape.value_dim + d],
                          test::attention_o_tolerance(bf16_products, spread[h * shape.value_dim + d]));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace writescope
