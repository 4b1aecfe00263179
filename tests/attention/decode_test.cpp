#include "attention/decode.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>

#include "attention/impl/host_block_attention.hpp"
#include "attention/reference.hpp"
#include "framework/cpu_path.hpp"
#include "cpu_paths.hpp"
#include "exec_spaces.hpp"
#include "kv_test_data.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {
namespace {

constexpr int default_block_tokens = 64;

/// test::for_each_cpu_path over the paths attend() runs. A CUDA build's
/// attend() pins the fp32 products (the GPU's states share every merge), so
/// the paths above them would repeat avx512_fma under their own names: they
/// are named as skipped (HostDecode in host_prefetch_test.cpp tests their
/// products in every build).
template <class Body>
void for_each_attended_cpu_path(Body&& body) {
  test::for_each_cpu_path([&](CpuPath path) {
    if (has_gpu && path > CpuPath::avx512_fma) {
      std::cout << "[ SKIPPED  ] CPU path " << cpu_path_name(path)
                << ": a CUDA build attends with the fp32 products (HostDecode tests this path's)\n";
      return;
    }
    body(path);
  });
}

template <class C>
class DecodeAttentionTest : public ::testing::Test {
 protected:
  using ExecSpace = typename C::Exec;
  using Scalar = typename C::Storage;
  using MemSpace = typename ExecSpace::memory_space;
  using State = PartialState<MemSpace>;

  /// Writes `lengths.size()` sequences into a fresh cache, block k of sequence s
  /// in all_regions[(k + s) % 4], and keeps the float copy for the reference.
  void build(const AttentionShape& shape, const std::vector<std::int64_t>& lengths,
             int block_tokens = default_block_tokens) {
    shape_ = shape;
    const BlockGeometry g = shape.block_geometry(block_tokens);
    std::int64_t blocks = 0;
    for (auto n : lengths) blocks += (n + block_tokens - 1) / block_tokens;
    const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(Scalar);
    cache_ = std::make_unique<InplaceKVCache<Scalar>>(KVCacheShape{1, g},
                                                      KVCacheBudgets{blocks * block_bytes, blocks * block_bytes,
                                                                     blocks * block_bytes},
                                                      BudgetPolicy::strict);
    keys_.clear();
    values_.clear();
    sequences_.clear();
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      const std::int64_t n = lengths[s];
      keys_.push_back(test::random_values<Scalar>(n * g.kv_heads * g.key_dim, 100 + s));
      values_.push_back(test::random_values<Scalar>(n * g.kv_heads * g.value_dim, 200 + s));
      const int seq = cache_->add_sequence();
      sequences_.push_back(seq);
      std::vector<Region> regions;
      for (int k = 0; k < cache_->new_blocks_needed(0, seq, n); ++k)
        regions.push_back(all_regions[(k + s) % region_count]);
      cache_->append(ExecSpace(), 0, seq, test::token_view<Scalar, MemSpace>(keys_[s], g.kv_heads, g.key_dim, 0, n),
                     test::token_view<Scalar, MemSpace>(values_[s], g.kv_heads, g.value_dim, 0, n), regions);
    }
    const auto q = test::random_values<float>(lengths.size() * shape.q_heads * shape.key_dim, 7);
    Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> host("writescope::test::queries", lengths.size(),
                                                                         shape.q_heads, shape.key_dim);
    std::copy(q.begin(), q.end(), host.data());
    queries_ = Kokkos::View<float***, Kokkos::LayoutRight, MemSpace>("writescope::test::queries", lengths.size(),
                                                                      shape.q_heads, shape.key_dim);
    Kokkos::deep_copy(queries_, host);
    host_queries_ = q;
  }

  /// Whether the host products of this fixture's blocks run on bf16 pairs on
  /// CPU path `path`: only in host-only builds, where the host spaces attend
  /// every region (attend()).
  bool bf16_products(CpuPath path) const {
    const CpuPath product_path = impl::host_product_path(path, cache_->geometry(), BlockOrder::head_major,
                                                         shape_.group(), std::is_same_v<Scalar, bf16>);
    return !has_gpu && test::host_bf16_products<Scalar>(product_path);
  }

  /// A state of the right shape (zeros; clear() makes it the empty state).
  State empty_state() const {
    return State("writescope::test::state", static_cast<int>(sequences_.size()), shape_.q_heads, shape_.value_dim);
  }

  /// Attention over `region`'s blocks within `ranges`, run on ExecSpace when it
  /// can read the region's pool, else on a space that can, then copied over.
  State attend(Region region, const std::vector<TokenRange>& ranges, BlockProduct product) {
    // In a CUDA build the GPU's products share every merged state (kv_test_data.hpp).
    const ScopedCpuPath host_path(has_gpu ? test::fp32_cpu_path() : active_cpu_path());
    const auto segments = cache_->segments(0, region, sequences_, ranges);
    State out = empty_state();
    auto run = [&](const auto& pool) {
      using PoolSpace = typename std::decay_t<decltype(pool)>::memory_space;
      if constexpr (Kokkos::SpaceAccessibility<ExecSpace, PoolSpace>::accessible) {
        DecodeWorkspace<MemSpace> fresh;
        fresh.host_team_threads = reused_workspace_.host_team_threads = host_team_threads_;
        decode_attention<ExecSpace, Scalar, PoolSpace>(ExecSpace(), shape_, cache_->geometry(), block_order(region),
                                                       queries_, pool, segments,
                                                       reuse_workspace_ ? reused_workspace_ : fresh, out, product);
      } else {
        using Other = std::conditional_t<std::is_same_v<PoolSpace, HostMemSpace>, HostExecSpace, GpuExecSpace>;
        using OtherMem = typename Other::memory_space;
        auto queries = Kokkos::create_mirror_view_and_copy(OtherMem(), queries_);
        PartialState<OtherMem> there("writescope::test::there", out.batch(), out.q_heads(), out.value_dim());
        DecodeWorkspace<OtherMem> workspace;
        decode_attention<Other, Scalar, PoolSpace>(Other(), shape_, cache_->geometry(), block_order(region), queries,
                                                   pool, segments, workspace, there, product);
        Kokkos::deep_copy(out.o, there.o);
        Kokkos::deep_copy(out.lse, there.lse);
      }
    };
    if (region == Region::gpu_resident) run(cache_->vram_pool());
    else if (region == Region::cpu_resident) run(cache_->host_pool());
    else run(cache_->pinned_pool());
    Kokkos::fence();
    return out;
  }

  /// Compares a merged state with the reference over ranges[b] of each sequence.
  /// `bf16_products`: host products ran on bf16 pairs (test::host_bf16_products);
  /// the reference then takes the bf16-rounded queries.
  void expect_reference(const State& state, const std::vector<TokenRange>& ranges, bool bf16_products = false) {
    auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.o);
    auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.lse);
    std::vector<float> queries = host_queries_;
    if (bf16_products)
      for (float& q : queries) q = round_to<bf16>(q);
    for (std::size_t b = 0; b < sequences_.size(); ++b) {
      std::vector<double> ref_o, ref_lse, spread;
      reference_decode(shape_, queries.data() + b * shape_.q_heads * shape_.key_dim,
                       ReferenceKV{keys_[b].data(), values_[b].data(), cache_->length(0, sequences_[b])},
                       ranges[b].begin, ranges[b].end, ref_o, ref_lse, &spread);
      for (int h = 0; h < shape_.q_heads; ++h) {
        if (std::isinf(ref_lse[h])) {
          ASSERT_TRUE(std::isinf(lse(b, h)) && lse(b, h) < 0) << "batch " << b << " head " << h;
        } else {
          ASSERT_NEAR(lse(b, h), ref_lse[h], test::attention_lse_tolerance(bf16_products, ref_lse[h]))
              << "batch " << b << " head " << h;
        }
        for (int d = 0; d < shape_.value_dim; ++d)
          ASSERT_NEAR(o(b, h, d), ref_o[h * shape_.value_dim + d],
                      test::attention_o_tolerance(bf16_products, spread[h * shape_.value_dim + d]))
              << "batch " << b << " head " << h << " d " << d;
      }
    }
  }

  /// Whole-sequence ranges.
  std::vector<TokenRange> full_ranges() const {
    std::vector<TokenRange> ranges;
    for (int seq : sequences_) ranges.push_back(TokenRange{0, cache_->length(0, seq)});
    return ranges;
  }

  State attend_all_regions(const std::vector<TokenRange>& ranges, BlockProduct product) {
    std::vector<State> parts;
    for (Region region : all_regions) parts.push_back(attend(region, ranges, product));
    State merged = empty_state();
    merge(ExecSpace(), parts, merged);
    ExecSpace().fence();
    return merged;
  }

  AttentionShape shape_;
  bool reuse_workspace_ = false;  // attend() on ExecSpace keeps one workspace across calls and shapes
  DecodeWorkspace<MemSpace> reused_workspace_;
  int host_team_threads_ = 1;  // the team kernel's threads per team on host spaces
  std::unique_ptr<InplaceKVCache<Scalar>> cache_;
  std::vector<std::vector<float>> keys_, values_;
  std::vector<int> sequences_;
  std::vector<float> host_queries_;
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries_;
};

using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(DecodeAttentionTest, Cases, test::SpaceAndScalarName);

// The team kernel with teams of several threads on the host: its barriers and
// team ranges then matter there as they do between a GPU's warps (teams of
// one thread would pass with any of them dropped).
TYPED_TEST(DecodeAttentionTest, TheTeamKernelMatchesReferenceWithTeamsOfSeveralThreads) {
  using Space = typename TestFixture::ExecSpace;
  if constexpr (!is_host_exec_space<Space>) {
    GTEST_SKIP() << "GPU teams are tested by MatchesReferenceForEveryModelShape";
  } else {
    if (Space().concurrency() < 2) GTEST_SKIP() << "a host space of one thread has teams of one";
    this->host_team_threads_ = Space().concurrency();
    for (const AttentionShape& shape :
         {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()}) {
      SCOPED_TRACE(shape.name);
      this->build(shape, {1, 150, 333});
      this->expect_reference(this->attend_all_regions(this->full_ranges(), BlockProduct::portable),
                             this->full_ranges());
    }
  }
}

TYPED_TEST(DecodeAttentionTest, MatchesReferenceForEveryModelShape) {
  // Head dims that are not multiples of 8 take the team kernel's one-element loads.
  AttentionShape odd_dims = qwen3_30b_a3b_attention();
  odd_dims.key_dim = 20;
  odd_dims.value_dim = 12;
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention(), odd_dims}) {
    SCOPED_TRACE("q_heads " + std::to_string(shape.q_heads) + " kv_heads " + std::to_string(shape.kv_heads) +
                 " key_dim " + std::to_string(shape.key_dim));
    // Lengths that are not multiples of the block size, and a one-token sequence.
    this->build(shape, {1, 150, 333});
    this->expect_reference(this->attend_all_regions(this->full_ranges(), BlockProduct::portable), this->full_ranges());
  }
}

// A server's workspace serves every layer and model it meets: one grown for
// wider heads must not leave the next shape's partial rows at its own stride.
TYPED_TEST(DecodeAttentionTest, AWorkspaceReusedAcrossShapesMatchesReference) {
  AttentionShape narrow = qwen3_30b_a3b_attention();
  narrow.value_dim = 64;
  this->reuse_workspace_ = true;
  for (const AttentionShape& shape : {deepseek_v2_lite_mla_attention(), qwen3_30b_a3b_attention(), narrow})
    for (BlockProduct product : {BlockProduct::automatic, BlockProduct::portable}) {
      SCOPED_TRACE(shape.name + " value_dim " + std::to_string(shape.value_dim) +
                   (product == BlockProduct::automatic ? ", automatic" : ", portable"));
      this->build(shape, {150, 333});
      this->expect_reference(this->attend_all_regions(this->full_ranges(), product), this->full_ranges(),
                             product == BlockProduct::automatic && this->bf16_products(active_cpu_path()));
    }
}

// The host product on every instruction path this machine runs (the others are
// named as skipped), with segments that start and end inside key tiles.
TYPED_TEST(DecodeAttentionTest, HostProductMatchesReferenceOnEveryCpuPath) {
  // Token-row keys in an odd number of chunks: the AVX-512 score product's
  // last chunk (4 key pairs for groups of 4) is not one of a pair.
  AttentionShape odd_chunks = mixtral_8x7b_attention();
  odd_chunks.name = "mixtral with 136-dim keys";
  odd_chunks.key_dim = 136;
  for_each_attended_cpu_path([&](CpuPath path) {
    for (const AttentionShape& shape :
         {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention(), odd_chunks}) {
      // 256-token blocks: segments span several of the AVX-512 product's
      // 128-token passes (online softmax between them).
      for (int block_tokens : {default_block_tokens, 256}) {
        SCOPED_TRACE(shape.name + ", blocks of " + std::to_string(block_tokens));
        this->build(shape, {1, 150, 333}, block_tokens);
        const bool rounded = this->bf16_products(path);
        this->expect_reference(this->attend_all_regions(this->full_ranges(), BlockProduct::automatic),
                               this->full_ranges(), rounded);
        std::vector<TokenRange> inner{{0, 1}, {7, 141}, {21, 300}};
        this->expect_reference(this->attend_all_regions(inner, BlockProduct::automatic), inner, rounded);
      }
    }
  });
}

// Long sequences: the host product attends runs of many consecutive segments
// with one running state (the AVX-512 path's online softmax across blocks, the
// others' merge per segment), on every CPU path.
TYPED_TEST(DecodeAttentionTest, RunsOfManySegmentsMatchReferenceOnEveryCpuPath) {
  const int threads = HostExecSpace().concurrency();
  // Each region holds every fourth 32-token block; 16 per thread and a few more
  // leave runs of two segments or more for any number of work items per run.
  const int block_tokens = 32, blocks_per_region = 16 * threads + 8;
  const std::int64_t length = std::int64_t{4} * blocks_per_region * block_tokens - 13;
  for (int items_per_run : {1, 4, 8}) {
    std::vector<int> run_offsets;
    const std::vector<int> runs =
        impl::host_segment_runs({0, blocks_per_region - 1}, items_per_run, threads, 16, run_offsets);
    int longest = 0;
    for (std::size_t r = 0; r + 1 < runs.size(); ++r) longest = std::max(longest, runs[r + 1] - runs[r]);
    ASSERT_GE(longest, 2) << "the test no longer covers runs of segments";
  }
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()}) {
    SCOPED_TRACE(shape.name);
    this->build(shape, {length, 150}, block_tokens);
    for_each_attended_cpu_path([&](CpuPath path) {
      const bool rounded = this->bf16_products(path);
      this->expect_reference(this->attend_all_regions(this->full_ranges(), BlockProduct::automatic),
                             this->full_ranges(), rounded);
      std::vector<TokenRange> inner{{21, length - 100}, {7, 141}};
      this->expect_reference(this->attend_all_regions(inner, BlockProduct::automatic), inner, rounded);
    });
  }
}

// A step over a block or two: the host products split the blocks into
// passes so that both threads work; the pieces' states merge to the reference.
TYPED_TEST(DecodeAttentionTest, HostProductSplitsFewBlocksOnEveryCpuPath) {
  const int threads = HostExecSpace().concurrency();
  if (threads < 2) GTEST_SKIP() << "one host thread: the host products split nothing";
  // One whole 256-token block in each CPU region (the fifth, partial, in the GPU's).
  constexpr int block_tokens = 256;
  const std::int64_t length = 4 * block_tokens + 100;
  int split_regions = 0;
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()}) {
    SCOPED_TRACE(shape.name);
    this->build(shape, {length}, block_tokens);
    const std::vector<TokenRange> full = this->full_ranges(), inner{{70, length - 3}};
    for (Region region : {Region::cpu_resident, Region::cpu_streamed}) {
      const auto segments = this->cache_->segments(0, region, this->sequences_, full);
      const int items = impl::host_takes_all_heads(this->cache_->geometry(), block_order(region)) ? 1 : shape.kv_heads;
      if (impl::host_split_segments(segments, items, threads)) ++split_regions;
    }
    for_each_attended_cpu_path([&](CpuPath path) {
      const bool rounded = this->bf16_products(path);
      this->expect_reference(this->attend_all_regions(full, BlockProduct::automatic), full, rounded);
      this->expect_reference(this->attend_all_regions(inner, BlockProduct::automatic), inner, rounded);
    });
  }
  // Qwen3's token-major region and both of MLA's have one work item a block.
  EXPECT_GE(split_regions, 3) << "the test no longer covers split blocks";
}

TEST(HostSplitSegments, CutsFewSegmentsIntoWholePassesInOrder) {
  // (batch, slot, first token, tokens, position); blocks of 1024 tokens.
  const std::vector<BlockSegment> segments{
      {0, 3, 0, 1024, 0}, {0, 9, 7, 600, 1031}, {1, 4, 100, 100, 5}, {1, 6, 100, 300, 105}};
  // Enough items already, or one thread: nothing split.
  EXPECT_FALSE(impl::host_split_segments(segments, 4, 12).has_value());
  EXPECT_FALSE(impl::host_split_segments(segments, 1, 1).has_value());
  EXPECT_FALSE(impl::host_split_segments({}, 1, 16).has_value());
  for (int threads : {6, 8, 64}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    const auto pieces = impl::host_split_segments(segments, 1, threads);
    ASSERT_TRUE(pieces.has_value());
    // Up to enough pieces for every thread, in whole passes of the block.
    const int wanted = (threads + 3) / 4;
    std::size_t next = 0;
    for (const BlockSegment& segment : segments) {
      const int expected = std::max(1, std::min(wanted, segment.token_count / impl::host_piece_tokens));
      int begin = segment.token_begin;
      for (int k = 0; k < expected; ++k, ++next) {
        ASSERT_LT(next, pieces->size());
        const BlockSegment& piece = (*pieces)[next];
        EXPECT_EQ(piece.batch_index, segment.batch_index);
        EXPECT_EQ(piece.slot, segment.slot);
        EXPECT_EQ(piece.token_begin, begin) << "piece " << next << " does not follow the one before";
        EXPECT_GE(piece.token_count, expected > 1 ? impl::host_piece_tokens / 2 : 1);
        EXPECT_EQ(piece.position, segment.position + (begin - segment.token_begin));
        begin += piece.token_count;
        if (k + 1 < expected) {
          EXPECT_EQ(begin % impl::host_piece_tokens, 0) << "a cut inside a pass";
        }
      }
      EXPECT_EQ(begin, segment.token_begin + segment.token_count) << "a segment not covered";
    }
    EXPECT_EQ(next, pieces->size());
  }
}

TEST(HostSegmentRuns, CoverEachBatchEntryInOrderWithEnoughWorkItems) {
  // Batch entries of 100, 3, 0 and 97 segments.
  const std::vector<int> batch_offsets{0, 100, 103, 103, 200};
  for (int items_per_thread : {4, 16})
    for (int items_per_run : {1, 4, 16})
      for (int threads : {1, 2, 16, 64}) {
        SCOPED_TRACE(std::to_string(items_per_run) + " items per run, " + std::to_string(threads) + " threads, " +
                     std::to_string(items_per_thread) + " items per thread wanted");
        std::vector<int> run_offsets;
        const std::vector<int> runs =
            impl::host_segment_runs(batch_offsets, items_per_run, threads, items_per_thread, run_offsets);
        ASSERT_EQ(run_offsets.size(), batch_offsets.size());
        EXPECT_EQ(runs.front(), 0);
        EXPECT_EQ(runs.back(), 200);
        EXPECT_EQ(run_offsets.back(), static_cast<int>(runs.size()) - 1);
        int longest = 0;
        for (std::size_t b = 0; b + 1 < batch_offsets.size(); ++b) {
          // Runs of entry b start at its first segment and end at its last.
          EXPECT_EQ(runs[run_offsets[b]], batch_offsets[b]);
          EXPECT_EQ(runs[run_offsets[b + 1]], batch_offsets[b + 1]);
          for (int r = run_offsets[b]; r < run_offsets[b + 1]; ++r) {
            ASSERT_LT(runs[r], runs[r + 1]) << "run " << r << " is empty";
            longest = std::max(longest, runs[r + 1] - runs[r]);
          }
        }
        // Splitting evenly within batch entries leaves at least half of the
        // work items wanted, and not many more.
        const int work_items = (static_cast<int>(runs.size()) - 1) * items_per_run;
        EXPECT_GE(work_items, std::min(200 * items_per_run, items_per_thread / 2 * threads));
        if (items_per_thread * threads <= 4 * items_per_run) {
          EXPECT_GT(longest, 20);  // few threads: long runs
        }
        // Each of the 4 entries rounds its runs up by one at most.
        const int runs_wanted = (items_per_thread * threads + items_per_run - 1) / items_per_run;
        EXPECT_LE(static_cast<int>(runs.size()) - 1, runs_wanted + 4);
      }
}

TEST(HostSegmentRuns, ItemsPerThreadKeepTheRunsOutputsNearAHundredthOfTheirKv) {
  // MLA at 8K tokens on 2 threads: 9.4 MB of KV, 32 KB of output a run.
  const double mla_kv = 8192.0 * 576 * 2, mla_output = 16 * 513 * 4.0;
  EXPECT_EQ(impl::host_items_per_thread(mla_kv, mla_output, 2), 4);
  // At 128K tokens 16 * 2 runs are 0.2% of it.
  EXPECT_EQ(impl::host_items_per_thread(16 * mla_kv, mla_output, 2), 16);
  // Between: 1% of the KV over one run's output, per thread.
  EXPECT_EQ(impl::host_items_per_thread(4 * mla_kv, mla_output, 2),
            static_cast<int>(4 * mla_kv * 0.01 / mla_output / 2));
  // GQA head-major: 8 heads x 128 dims a work item against 16 MB at 8K tokens.
  EXPECT_EQ(impl::host_items_per_thread(8192.0 * 4 * 256 * 2, 8 * 129 * 4.0, 2), 16);
  // Many threads never get fewer than 4 each.
  EXPECT_EQ(impl::host_items_per_thread(mla_kv, mla_output, 64), 4);
}

#ifdef WRITESCOPE_HOST_AVX2
// The prefetcher changes no result, so the accuracy tests cannot see a line it
// skips or requests twice, parts requested one after another instead of in
// turn, or a line requested to another cache level; this records its requests.
TEST(RowPrefetcher, RequestsEveryLineOnceWithItsPartsInTurn) {
  struct Case {
    int rows;
    std::int64_t row_bytes, stride;
    int parts;
  };
  // Rows split 4, 2 or 1 ways; one row split by lines; rows not whole lines;
  // parts of at least a page (4 KiB) only.
  for (const Case& c : {Case{128, 256, 256, 4}, Case{10, 1152, 1152, 2}, Case{3, 1024, 2048, 1},
                        Case{1, 32768, 0, 4}, Case{1, 144 * 64, 0, 2}, Case{1, 9 * 64, 0, 1},
                        Case{8, 1000, 4096, 4}, Case{16, 256, 256, 1}, Case{4, 1152, 1152, 1}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " rows of " + std::to_string(c.row_bytes) + " bytes");
    const int row_lines = static_cast<int>((c.row_bytes + 63) / 64);
    std::vector<std::int64_t> expected;
    for (int r = 0; r < c.rows; ++r)
      for (int l = 0; l < row_lines; ++l) expected.push_back(r * c.stride + 64 * l);
    const char* base = reinterpret_cast<const char*>(std::uintptr_t{1} << 20);
    for (const PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
      SCOPED_TRACE(level == PrefetchLevel::l1 ? "into L1" : "into L2");
      impl::RowPrefetcher ahead(base, c.stride, c.row_bytes, c.rows, level);
      EXPECT_EQ(ahead.lines(), static_cast<int>(expected.size()));
      // Requests into L2 go as one stream.
      const int parts = level == PrefetchLevel::l1 ? c.parts : 1;
      EXPECT_EQ(ahead.parts(), parts);
      std::vector<std::int64_t> requested;
      int other_level = 0;
      auto record = [&](const char* line, PrefetchLevel requested_level) {
        requested.push_back(line - base);
        other_level += requested_level != level;
      };
      // A third in steps of 3 lines, a third spread over ticks, the rest at the end.
      const int third = ahead.lines() / 3;
      for (int owed = 0; owed + 3 <= third; owed += 3) ahead.step(3, record);
      ahead.spread_over(50);
      for (int t = 0; t < 25; ++t) ahead.tick(record);
      ahead.finish(record);
      // Consecutive requests go to the parts in turn: the first is each part's first line.
      const std::int64_t part = static_cast<std::int64_t>(expected.size() / parts);
      for (int p = 0; p < parts && p < static_cast<int>(requested.size()); ++p)
        EXPECT_EQ(requested[p], expected[p * part]) << "request " << p;
      std::sort(requested.begin(), requested.end());
      EXPECT_EQ(requested, expected);
      EXPECT_EQ(other_level, 0) << "requests to the other cache level";
    }
  }
}

// The products tick a local copy of the prefetcher, which keeps its state in
// registers, and hand its progress back (take_progress) after each tile: the
// requests must be the ones the prefetcher makes uninterrupted, tick for tick.
TEST(RowPrefetcher, ALocalCopyHandsBackItsProgressExactly) {
  const char* base = reinterpret_cast<const char*>(std::uintptr_t{1} << 20);
  for (const PrefetchLevel level : {PrefetchLevel::l1, PrefetchLevel::l2}) {
    SCOPED_TRACE(level == PrefetchLevel::l1 ? "into L1" : "into L2");
    // 128 rows of 256 bytes, 512 lines (four parts into L1) over 300 ticks: a
    // fractional credit per tick, and lines owed across the copies.
    impl::RowPrefetcher direct(base, 256, 256, 128, level), through_copies = direct;
    direct.spread_over(300);
    through_copies.spread_over(300);
    std::vector<std::vector<std::int64_t>> direct_ticks, copied_ticks;
    auto recorder = [&](std::vector<std::vector<std::int64_t>>& ticks) {
      return [&ticks, base](const char* line, PrefetchLevel) { ticks.back().push_back(line - base); };
    };
    for (int t = 0; t < 300; ++t) {
      direct_ticks.emplace_back();
      direct.tick(recorder(direct_ticks));
    }
    // Tiles of 7 ticks, as a product's loop over a tile.
    for (int t = 0; t < 300;) {
      impl::RowPrefetcher local = through_copies;
      for (int k = 0; k < 7 && t < 300; ++k, ++t) {
        copied_ticks.emplace_back();
        local.tick(recorder(copied_ticks));
      }
      through_copies.take_progress(local);
    }
    EXPECT_EQ(copied_ticks, direct_ticks);
    std::vector<std::int64_t> direct_rest, copied_rest;
    direct.finish([&](const char* line, PrefetchLevel) { direct_rest.push_back(line - base); });
    through_copies.finish([&](const char* line, PrefetchLevel) { copied_rest.push_back(line - base); });
    EXPECT_EQ(copied_rest, direct_rest);
  }
}
#endif

// A model shape the fastest path silently refuses would run on a slower one
// and still pass every accuracy test; this catches it (writescope info shows it).
TEST(DecodeAttentionDispatch, EveryModelShapeTakesTheBestCpuPath) {
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()})
    for (Region region : {Region::cpu_resident, Region::cpu_streamed, Region::gpu_streamed})
      EXPECT_EQ(impl::host_product_path(best_cpu_path(), shape.block_geometry(256), block_order(region), shape.group(),
                                        true),
                best_cpu_path())
          << shape.name << " " << region_name(region);
}

// The GPU team's rule, and teams capped at fewer warps (the benchmark's
// sweep): the cap holds, the P·V slices never need more lanes than the team
// has, and fewer warps never need more scratch than the rule (which the
// block_tokens check is made against).
TEST(GpuDecodeTeam, FewerWarpsNeverNeedMoreScratchThanTheRule) {
  for (const AttentionShape& shape :
       {qwen3_30b_a3b_attention(), mixtral_8x7b_attention(), deepseek_v2_lite_mla_attention()})
    for (int block_tokens : {16, 256, 763}) {
      const GpuDecodeTeam rule = gpu_decode_team(shape, block_tokens);
      EXPECT_LE(rule.team_size, max_gpu_decode_warps);
      for (int most_warps : {1, 4, 8, max_gpu_decode_warps}) {
        const GpuDecodeTeam capped = gpu_decode_team(shape, block_tokens, most_warps);
        const std::string what = shape.name + ", " + std::to_string(block_tokens) + " tokens, " +
                                 std::to_string(most_warps) + " warps at most";
        EXPECT_EQ(capped.team_size, std::min(most_warps, rule.team_size)) << what;
        const int items = shape.group() * shape.value_dim / 8;  // P·V items of 8 value dims
        if (capped.token_splits > 1) {
          EXPECT_LE(capped.token_splits * items, capped.team_size * capped.vector_length) << what;
        }
        EXPECT_LE(capped.scratch_bytes, rule.scratch_bytes) << what;
      }
    }
}

// Kokkos launches a team only where its scratch, the 8 * (team_size + 2)
// bytes it reserves ahead of it and the 8 bytes of its kernel's own shared
// variable fit a block's 48 KiB of shared memory. MLA's team is 16 warps with
// 64 * (block_tokens + 2) bytes of scratch: 763 tokens take 48960 + 152 =
// 49112 bytes, 764 take 49024 + 152 = 49176. Mixtral's (16 warps, 8 slices)
// 16 * block_tokens + 16416: 2036 tokens take 48992 + 152 = 49144, 2037
// 49008 + 152 = 49160, which Kokkos' own check (without the 8) accepts.
TEST(GpuDecodeTeam, BlocksAreAcceptedWhereTheTeamFitsABlocksSharedMemory) {
  const AttentionShape mla = deepseek_v2_lite_mla_attention(), mixtral = mixtral_8x7b_attention();
  EXPECT_EQ(gpu_decode_block_tokens_error(mla, 763), "");
  EXPECT_NE(gpu_decode_block_tokens_error(mla, 764), "");
  EXPECT_EQ(gpu_decode_block_tokens_error(mixtral, 2036), "");
  EXPECT_NE(gpu_decode_block_tokens_error(mixtral, 2037), "");
  for (const AttentionShape& shape : {qwen3_30b_a3b_attention(), mixtral, mla})
    for (int block_tokens = 16; block_tokens <= 4096; ++block_tokens)
      ASSERT_EQ(gpu_decode_block_tokens_error(shape, block_tokens).empty(),
                gpu_team_shared_bytes(gpu_decode_team(shape, block_tokens)) <= gpu_block_shared_memory)
          << shape.name << ", " << block_tokens << " tokens";
}

#ifdef WRITESCOPE_HOST_AVX512_BF16
// The AVX-512 tiled score product takes key pairs two at a time (two
// accumulator chains): keys in an odd number of pairs go to another path.
TEST(DecodeAttentionDispatch, TiledKeysInAnOddNumberOfPairsLeaveTheAvx512Products) {
  BlockGeometry g = mixtral_8x7b_attention().block_geometry(256);
  EXPECT_TRUE(impl::avx512_takes(g, BlockOrder::head_major, 4));
  g.key_dim = 126;
  EXPECT_FALSE(impl::avx512_takes(g, BlockOrder::head_major, 4));
  g.key_dim = 124;
  EXPECT_TRUE(impl::avx512_takes(g, BlockOrder::head_major, 4));
}
#endif

TYPED_TEST(DecodeAttentionTest, SplitAtAnyPointAndMergeEqualsMonolithic) {
  this->build(qwen3_30b_a3b_attention(), {200, 257, 64});
  // Split points: at the ends, on block edges and inside blocks.
  for (const auto& splits : std::vector<std::vector<std::int64_t>>{{0, 0, 0}, {200, 257, 64}, {64, 128, 32},
                                                                   {1, 256, 63}, {137, 3, 17}}) {
    std::vector<TokenRange> head, tail;
    for (std::size_t b = 0; b < splits.size(); ++b) {
      head.push_back(TokenRange{0, splits[b]});
      tail.push_back(TokenRange{splits[b], this->cache_->length(0, this->sequences_[b])});
    }
    auto merged = this->attend_all_regions(head, BlockProduct::automatic);
    merge_into(typename TestFixture::ExecSpace(), merged, this->attend_all_regions(tail, BlockProduct::portable));
    typename TestFixture::ExecSpace().fence();
    this->expect_reference(merged, this->full_ranges(), this->bf16_products(active_cpu_path()));
  }
}

TYPED_TEST(DecodeAttentionTest, EmptyRangesGiveMinusInfinityAndMergeAsNoOps) {
  this->build(mixtral_8x7b_attention(), {100, 0, 40});
  std::vector<TokenRange> ranges = this->full_ranges();
  ranges[2] = TokenRange{20, 20};  // empty on purpose
  const auto state = this->attend_all_regions(ranges, BlockProduct::automatic);
  this->expect_reference(state, ranges, this->bf16_products(active_cpu_path()));
  auto lse = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.lse);
  EXPECT_EQ(lse(1, 0), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(lse(2, 5), -std::numeric_limits<float>::infinity());
  // Merging an empty state changes nothing, bit for bit.
  auto merged = this->empty_state();
  Kokkos::deep_copy(merged.o, state.o);
  Kokkos::deep_copy(merged.lse, state.lse);
  const auto empty = this->empty_state();
  clear(typename TestFixture::ExecSpace(), empty);
  merge_into(typename TestFixture::ExecSpace(), merged, empty);
  typename TestFixture::ExecSpace().fence();
  auto before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), state.o);
  auto after = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), merged.o);
  for (std::size_t i = 0; i < before.size(); ++i) ASSERT_EQ(before.data()[i], after.data()[i]);
  // States of other shapes are refused, not merged past their ends.
  for (const auto& [rows, heads, dims] : {std::tuple{2, 32, 128}, {3, 16, 128}, {3, 32, 64}}) {
    const typename TestFixture::State other("writescope::test::other_shape", rows, heads, dims);
    EXPECT_THROW(merge_into(typename TestFixture::ExecSpace(), merged, other), std::invalid_argument)
        << rows << " x " << heads << " x " << dims;
  }
}

TYPED_TEST(DecodeAttentionTest, RejectsUnsortedOrOutOfPoolSegments) {
  this->build(qwen3_30b_a3b_attention(), {70, 70});
  using Exec = typename TestFixture::ExecSpace;
  auto state = this->empty_state();
  DecodeWorkspace<typename TestFixture::MemSpace> workspace;
  auto pool = this->cache_->pinned_pool();
  using PoolSpace = typename decltype(pool)::memory_space;
  if constexpr (Kokkos::SpaceAccessibility<Exec, PoolSpace>::accessible) {
    const BlockGeometry g = this->cache_->geometry();
    auto call = [&](std::vector<BlockSegment> segments) {
      decode_attention<Exec, typename TestFixture::Scalar, PoolSpace>(
          Exec(), this->shape_, g, BlockOrder::token_major, this->queries_, pool, segments, workspace, state);
    };
    EXPECT_THROW(call({{1, 0, 0, 4, 0}, {0, 0, 0, 4, 0}}), std::invalid_argument);
    EXPECT_THROW(call({{0, 0, 60, 8, 60}}), std::invalid_argument);
    EXPECT_THROW(call({{0, 1000, 0, 4, 0}}), std::invalid_argument);
    EXPECT_THROW(call({{2, 0, 0, 4, 0}}), std::invalid_argument);
  }
}

TEST(Merge, MatchesTheLogSumExpFormulaInDouble) {
  using Mem = HostMemSpace;
  PartialState<Mem> a("a", 2, 3, 5), b("b", 2, 3, 5);
  const auto values = test::random_values<float>(2 * 2 * 3 * 5 + 12, 5);
  std::size_t k = 0;
  for (auto* state : {&a, &b})
    for (int i = 0; i < 2; ++i)
      for (int h = 0; h < 3; ++h) {
        state->lse(i, h) = 3.0f * values[k++];
        for (int d = 0; d < 5; ++d) state->o(i, h, d) = values[k++ % values.size()];
      }
  PartialState<Mem> merged("m", 2, 3, 5);
  merge(HostExecSpace(), std::vector<PartialState<Mem>>{a, b}, merged);
  HostExecSpace().fence();
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 3; ++h) {
      const double la = a.lse(i, h), lb = b.lse(i, h), m = std::max(la, lb);
      const double lse = m + std::log(std::exp(la - m) + std::exp(lb - m));
      EXPECT_NEAR(merged.lse(i, h), lse, 1e-5);
      for (int d = 0; d < 5; ++d)
        EXPECT_NEAR(merged.o(i, h, d), std::exp(la - lse) * a.o(i, h, d) + std::exp(lb - lse) * b.o(i, h, d), 1e-5);
    }
}

}  // namespace
}  // namespace writescope
