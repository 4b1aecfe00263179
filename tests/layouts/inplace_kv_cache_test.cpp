#include "layouts/inplace_kv_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "exec_spaces.hpp"
#include "framework/host_memory.hpp"
#include "kv_test_data.hpp"

namespace writescope {
namespace test {

struct InplaceKVCachePeer {
  /// An append of `tokens` tokens whose write of any token at or past
  /// `failing_at` (counted from the append's first) throws, as a failed copy does.
  template <class Scalar>
  static void append_failing_at(InplaceKVCache<Scalar>& cache, int layer, int sequence, std::int64_t tokens,
                                const std::vector<Region>& regions, std::int64_t failing_at) {
    cache.place_tokens(layer, sequence, tokens, regions,
                       [&](const auto&, int, std::int64_t first, std::int64_t count) {
                         if (first + count > failing_at) throw std::runtime_error("injected copy failure");
                       });
  }
};

}  // namespace test

namespace {

constexpr int heads = 2, key_dim = 8, value_dim = 4, block_tokens = 16;

KVCacheShape small_shape(bool values_in_keys = false) {
  return KVCacheShape{2, BlockGeometry{block_tokens, heads, key_dim, values_in_keys ? 6 : value_dim, values_in_keys}};
}

/// Budgets in whole blocks of small_shape() with Scalar storage.
template <class Scalar>
KVCacheBudgets blocks_of(int vram, int pinned, int host, bool values_in_keys = false) {
  const auto bytes = static_cast<std::uint64_t>(small_shape(values_in_keys).block.block_elements()) * sizeof(Scalar);
  return KVCacheBudgets{vram * bytes, pinned * bytes, host * bytes};
}

template <class C>
class InplaceKVCacheTest : public ::testing::Test {
 protected:
  using ExecSpace = typename C::Exec;
  using Scalar = typename C::Storage;
  using MemSpace = typename ExecSpace::memory_space;

  /// Appends tokens [first, first + count) of the test data.
  void append(InplaceKVCache<Scalar>& cache, int layer, int sequence, std::int64_t first, std::int64_t count,
              const std::vector<Region>& regions) {
    const auto& g = cache.geometry();
    const auto keys = test::token_view<Scalar, MemSpace>(keys_, g.kv_heads, g.key_dim, first, count);
    const auto values = test::token_view<Scalar, MemSpace>(values_, g.kv_heads, g.value_dim, first, count);
    cache.append(ExecSpace(), layer, sequence, keys, values, regions);
  }

  /// The slots of `sequence`'s layer-0 blocks in `region`, in token order.
  std::vector<int> slots_of(const InplaceKVCache<Scalar>& cache, Region region, int sequence) {
    std::vector<int> slots;
    for (const BlockSegment& segment : cache.segments(0, region, {sequence}, {TokenRange{0, cache.length(0, sequence)}}))
      slots.push_back(segment.slot);
    return slots;
  }

  /// Every stored token reads back as written.
  void expect_tokens(const InplaceKVCache<Scalar>& cache, int layer, int sequence, std::int64_t first) {
    const auto& g = cache.geometry();
    std::vector<float> key(g.key_dim), value(g.value_dim);
    for (std::int64_t t = 0; t < cache.length(layer, sequence); ++t)
      for (int h = 0; h < g.kv_heads; ++h) {
        cache.read_token(layer, sequence, t, h, key.data(), value.data());
        for (int d = 0; d < g.key_dim; ++d)
          ASSERT_EQ(key[d], keys_[((first + t) * g.kv_heads + h) * g.key_dim + d]) << "token " << t << " d " << d;
        for (int d = 0; d < g.value_dim; ++d) {
          const float expected = g.values_in_keys ? keys_[((first + t) * g.kv_heads + h) * g.key_dim + d]
                                                  : values_[((first + t) * g.kv_heads + h) * g.value_dim + d];
          ASSERT_EQ(value[d], expected) << "token " << t << " value d " << d;
        }
      }
  }

  std::vector<float> keys_ = test::random_values<Scalar>(4096 * heads * key_dim, 11);
  std::vector<float> values_ = test::random_values<Scalar>(4096 * heads * key_dim, 12);
};

using Cases = test::SpacesTimesScalars<EnabledExecSpaces, float, bf16>::type;
TYPED_TEST_SUITE(InplaceKVCacheTest, Cases, test::SpaceAndScalarName);

TYPED_TEST(InplaceKVCacheTest, EveryRegionStoresTokensAcrossPartialBlocks) {
  using Storage = typename TestFixture::Scalar;
  for (bool values_in_keys : {false, true}) {
    InplaceKVCache<Storage> cache(small_shape(values_in_keys), blocks_of<Storage>(4, 8, 4, values_in_keys),
                                 BudgetPolicy::strict);
    const int seq = cache.add_sequence();
    // 20 tokens: one full block + 4; then 30 more: fill the second block, open two more.
    this->append(cache, 0, seq, 0, 20, {Region::gpu_resident, Region::cpu_resident});
    ASSERT_EQ(cache.new_blocks_needed(0, seq, 30), 2);
    this->append(cache, 0, seq, 20, 30, {Region::gpu_streamed, Region::cpu_streamed});
    EXPECT_EQ(cache.length(0, seq), 50);
    std::vector<float> key(cache.geometry().key_dim), value(cache.geometry().value_dim);
    for (int head : {-1, cache.geometry().kv_heads})
      EXPECT_THROW(cache.read_token(0, seq, 0, head, key.data(), value.data()), KVCacheError) << "head " << head;
    // Past the length, inside the last block's unwritten tail as beyond it.
    for (std::int64_t position : {50, 63, 64, -1})
      EXPECT_THROW(cache.read_token(0, seq, position, 0, key.data(), value.data()), KVCacheError) << position;
    EXPECT_EQ(cache.length(1, seq), 0);
    EXPECT_EQ(cache.block_regions(0, seq), (std::vector<Region>{Region::gpu_resident, Region::cpu_resident,
                                                                Region::gpu_streamed, Region::cpu_streamed}));
    this->expect_tokens(cache, 0, seq, 0);
  }
}

TYPED_TEST(InplaceKVCacheTest, BlocksOfSeveralKeyTilesStoreTokensInEveryRegion) {
  using Storage = typename TestFixture::Scalar;
  // 64 tokens: four key tiles of 16 in a head-major block; 24: one tile of the whole block.
  for (int tokens : {64, 24}) {
    SCOPED_TRACE("blocks of " + std::to_string(tokens) + " tokens");
    const BlockGeometry g{tokens, heads, key_dim, value_dim, false};
    const auto block_bytes = static_cast<std::uint64_t>(g.block_elements()) * sizeof(Storage);
    InplaceKVCache<Storage> cache(KVCacheShape{1, g}, KVCacheBudgets{3 * block_bytes, 3 * block_bytes, 3 * block_bytes},
                                  BudgetPolicy::strict);
    for (Region region : all_regions) {
      SCOPED_TRACE(region_name(region));
      const int seq = cache.add_sequence();
      // Appends that start inside a tile, on a tile boundary, and single decode tokens.
      std::int64_t length = 0;
      for (std::int64_t count : {std::int64_t{5}, std::int64_t{11}, std::int64_t{2 * tokens - 19}, std::int64_t{1},
                                 std::int64_t{1}, std::int64_t{tokens}}) {
        this->append(cache, 0, seq, length, count,
                     std::vector<Region>(cache.new_blocks_needed(0, seq, count), region));
        length += count;
      }
      ASSERT_EQ(cache.length(0, seq), length);
      this->expect_tokens(cache, 0, seq, 0);
      cache.free_sequence(seq);
    }
  }
}

TYPED_TEST(InplaceKVCacheTest, DecodeAppendsFillTheLastBlockInItsRegion) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(2, 4, 4), BudgetPolicy::strict);
  const int seq = cache.add_sequence();
  this->append(cache, 1, seq, 0, 10, {Region::cpu_resident});
  for (int t = 10; t < 40; ++t) {
    const int needed = cache.new_blocks_needed(1, seq, 1);
    this->append(cache, 1, seq, t, 1, std::vector<Region>(needed, Region::cpu_streamed));
    const auto regions = cache.block_regions(1, seq);
    ASSERT_EQ(regions.front(), Region::cpu_resident) << "a written block changed region";
  }
  EXPECT_EQ(cache.block_regions(1, seq),
            (std::vector<Region>{Region::cpu_resident, Region::cpu_streamed, Region::cpu_streamed}));
  this->expect_tokens(cache, 1, seq, 0);
}

TYPED_TEST(InplaceKVCacheTest, StrictBudgetNamesRegionAndBudget) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(1, 1, 1), BudgetPolicy::strict);
  const int seq = cache.add_sequence();
  this->append(cache, 0, seq, 0, block_tokens, {Region::gpu_resident});
  try {
    this->append(cache, 0, seq, block_tokens, 1, {Region::gpu_resident});
    FAIL() << "over-budget append accepted";
  } catch (const KVCacheError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("GpuResident"), std::string::npos) << what;
    EXPECT_NE(what.find("VRAM budget holds 1 blocks"), std::string::npos) << what;
  }
  // Nothing was written by the failed append.
  EXPECT_EQ(cache.length(0, seq), block_tokens);
  this->expect_tokens(cache, 0, seq, 0);
}

// A budget under one block holds none: the append's error says so rather
// than "holds 0 blocks ... all are in use".
TYPED_TEST(InplaceKVCacheTest, ABudgetUnderOneBlockIsNamedAsSuch) {
  using Storage = typename TestFixture::Scalar;
  KVCacheBudgets budgets = blocks_of<Storage>(1, 1, 1);
  const std::uint64_t block = budgets.vram_bytes;
  budgets.vram_bytes = block - 1;
  InplaceKVCache<Storage> cache(small_shape(), budgets, BudgetPolicy::fall_back);
  const int seq = cache.add_sequence();
  this->append(cache, 0, seq, 0, block_tokens, {Region::cpu_resident});
  this->append(cache, 0, seq, block_tokens, block_tokens, {Region::cpu_streamed});
  try {
    this->append(cache, 0, seq, 2 * block_tokens, 1, {Region::gpu_resident});
    FAIL() << "an append into a budget under one block accepted";
  } catch (const KVBudgetError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the VRAM budget of " + std::to_string(block - 1) + " bytes is smaller than one block (" +
                        std::to_string(block) + " bytes), and the fallback regions' pools are full"),
              std::string::npos)
        << what;
  }
}

// A prompt chunk whose last block finds no room leaves the sequence, its
// blocks and the pools as they were: a caller may free memory and retry.
TYPED_TEST(InplaceKVCacheTest, AnAppendThatRunsOutOfBudgetPartWayChangesNothing) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(2, 1, 2), BudgetPolicy::strict);
  const int seq = cache.add_sequence();
  this->append(cache, 0, seq, 0, 5, {Region::gpu_resident});
  const std::array<std::uint64_t, region_count> bytes_before{
      cache.region_bytes(Region::gpu_resident), cache.region_bytes(Region::gpu_streamed),
      cache.region_bytes(Region::cpu_resident), cache.region_bytes(Region::cpu_streamed)};
  // 11 tokens fill the open block, then a VRAM block, a host block, and a second pinned block the budget lacks.
  const std::vector<Region> regions{Region::gpu_resident, Region::cpu_resident, Region::gpu_streamed,
                                    Region::cpu_streamed};
  EXPECT_THROW(this->append(cache, 0, seq, 5, 11 + 4 * block_tokens - 2, regions), KVBudgetError);
  EXPECT_EQ(cache.length(0, seq), 5);
  EXPECT_EQ(cache.block_regions(0, seq), std::vector<Region>{Region::gpu_resident});
  for (Region region : all_regions)
    EXPECT_EQ(cache.region_bytes(region), bytes_before[int(region)]) << region_name(region);
  this->expect_tokens(cache, 0, seq, 0);
  // Every block the failed append took is free again: the same chunk fits without its last block.
  this->append(cache, 0, seq, 5, 11 + 3 * block_tokens,
               {Region::gpu_resident, Region::cpu_resident, Region::cpu_streamed});
  EXPECT_EQ(cache.length(0, seq), 5 + 11 + 3 * block_tokens);
  this->expect_tokens(cache, 0, seq, 0);
  this->append(cache, 0, seq, 5 + 11 + 3 * block_tokens, block_tokens, {Region::cpu_resident});
}

// A write that fails part-way (a copy, a staging allocation) leaves the
// sequence as it was, as a budget that runs out does: every block but the
// last stays full, so the next append's tokens land at the right positions.
TYPED_TEST(InplaceKVCacheTest, AnAppendWhoseWriteFailsPartWayChangesNothing) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(4, 4, 4), BudgetPolicy::strict);
  const int seq = cache.add_sequence();
  this->append(cache, 0, seq, 0, 5, {Region::gpu_resident});
  std::array<std::uint64_t, region_count> bytes_before{}, token_bytes_before{};
  for (Region region : all_regions) {
    bytes_before[int(region)] = cache.region_bytes(region);
    token_bytes_before[int(region)] = cache.region_token_bytes(region);
  }
  // 11 tokens fill the open block, then three new blocks; the write fails in the second.
  const std::vector<Region> regions{Region::cpu_resident, Region::gpu_streamed, Region::cpu_streamed};
  EXPECT_THROW(test::InplaceKVCachePeer::append_failing_at(cache, 0, seq, 11 + 3 * block_tokens, regions,
                                                            11 + block_tokens + 3),
               std::runtime_error);
  EXPECT_EQ(cache.length(0, seq), 5);
  EXPECT_EQ(cache.block_regions(0, seq), std::vector<Region>{Region::gpu_resident});
  for (Region region : all_regions) {
    EXPECT_EQ(cache.region_bytes(region), bytes_before[int(region)]) << region_name(region);
    EXPECT_EQ(cache.region_token_bytes(region), token_bytes_before[int(region)]) << region_name(region);
  }
  this->append(cache, 0, seq, 5, 11 + 3 * block_tokens, regions);
  EXPECT_EQ(cache.length(0, seq), 5 + 11 + 3 * block_tokens);
  this->expect_tokens(cache, 0, seq, 0);
}

TYPED_TEST(InplaceKVCacheTest, FallBackFollowsTheDocumentedChain) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(1, 1, 1), BudgetPolicy::fall_back);
  const int seq = cache.add_sequence();
  this->append(cache, 0, seq, 0, 3 * block_tokens,
               {Region::gpu_resident, Region::gpu_resident, Region::gpu_resident});
  EXPECT_EQ(cache.block_regions(0, seq),
            (std::vector<Region>{Region::gpu_resident, Region::gpu_streamed, Region::cpu_resident}));
  this->expect_tokens(cache, 0, seq, 0);
  EXPECT_THROW(this->append(cache, 0, seq, 3 * block_tokens, 1, {Region::cpu_streamed}), KVCacheError);
  // The CPU's two pools fall back to each other.
  for (const Region first : {Region::cpu_resident, Region::cpu_streamed}) {
    InplaceKVCache<Storage> host_only(small_shape(), blocks_of<Storage>(0, 1, 1), BudgetPolicy::fall_back);
    const int sequence = host_only.add_sequence();
    this->append(host_only, 0, sequence, 0, 2 * block_tokens, {first, first});
    const Region other = first == Region::cpu_resident ? Region::cpu_streamed : Region::cpu_resident;
    EXPECT_EQ(host_only.block_regions(0, sequence), (std::vector<Region>{first, other}));
    this->expect_tokens(host_only, 0, sequence, 0);
  }
}

TYPED_TEST(InplaceKVCacheTest, AccountsBytesAndFreesSequences) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(2, 2, 2), BudgetPolicy::strict);
  const std::uint64_t block = cache.block_bytes();
  EXPECT_EQ(block, static_cast<std::uint64_t>(block_tokens * heads * (key_dim + value_dim)) * sizeof(Storage));
  const int a = cache.add_sequence(), b = cache.add_sequence();
  this->append(cache, 0, a, 0, 20, {Region::gpu_streamed, Region::cpu_streamed});
  this->append(cache, 0, b, 0, 5, {Region::cpu_resident});
  EXPECT_EQ(cache.region_bytes(Region::gpu_streamed), block);
  EXPECT_EQ(cache.region_bytes(Region::cpu_streamed), block);
  EXPECT_EQ(cache.region_bytes(Region::cpu_resident), block);
  EXPECT_EQ(cache.region_bytes(Region::gpu_resident), 0u);
  EXPECT_EQ(cache.region_token_bytes(Region::cpu_streamed), 4 * block / block_tokens);
  // The pinned pool is full; freeing a returns both of its blocks.
  EXPECT_THROW(this->append(cache, 1, b, 0, 1, {Region::gpu_streamed}), KVCacheError);
  cache.free_sequence(a);
  EXPECT_EQ(cache.region_bytes(Region::gpu_streamed), 0u);
  EXPECT_EQ(cache.region_token_bytes(Region::gpu_streamed), 0u);
  EXPECT_EQ(cache.region_token_bytes(Region::cpu_streamed), 0u);
  EXPECT_EQ(cache.region_token_bytes(Region::cpu_resident), 5 * block / block_tokens);
  EXPECT_THROW(cache.length(0, a), KVCacheError);
  this->append(cache, 1, b, 0, 32, {Region::gpu_streamed, Region::cpu_streamed});
  EXPECT_EQ(cache.region_bytes(Region::gpu_streamed) + cache.region_bytes(Region::cpu_streamed), 2 * block);
  this->expect_tokens(cache, 1, b, 0);
}

// A sequence's next block takes the slot after its previous one where that is
// free, before any lower freed slot: consecutive blocks stay one contiguous
// run, which the GPU streams in one copy.
TYPED_TEST(InplaceKVCacheTest, ASequenceKeepsContiguousSlotsWhereItCan) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(0, 8, 0), BudgetPolicy::strict);
  const int other = cache.add_sequence(), seq = cache.add_sequence();
  this->append(cache, 0, other, 0, block_tokens, {Region::gpu_streamed});
  this->append(cache, 0, seq, 0, 2 * block_tokens, {Region::gpu_streamed, Region::cpu_streamed});
  cache.free_sequence(other);  // slot 0 is free, below the sequence's run (1, 2)
  this->append(cache, 0, seq, 2 * block_tokens, block_tokens, {Region::gpu_streamed});
  std::vector<int> slots = this->slots_of(cache, Region::gpu_streamed, seq);
  for (const int slot : this->slots_of(cache, Region::cpu_streamed, seq)) slots.push_back(slot);
  std::sort(slots.begin(), slots.end());
  EXPECT_EQ(slots, (std::vector<int>{1, 2, 3}));
  // A new sequence takes the lowest free slot.
  const int next = cache.add_sequence();
  this->append(cache, 0, next, 0, 1, {Region::cpu_streamed});
  EXPECT_EQ(cache.segments(0, Region::cpu_streamed, {next}, {TokenRange{0, 1}}).front().slot, 0);
  this->expect_tokens(cache, 0, seq, 0);
}

// The slot after a sequence's last block, freed by another sequence, is
// taken before a lower freed one: the sequence's run stays contiguous.
TYPED_TEST(InplaceKVCacheTest, AFreedSlotAfterASequencesLastBlockIsTakenFirst) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(0, 8, 0), BudgetPolicy::strict);
  const int low = cache.add_sequence(), seq = cache.add_sequence(), mid = cache.add_sequence();
  for (const int sequence : {low, seq, mid}) this->append(cache, 0, sequence, 0, block_tokens, {Region::gpu_streamed});
  cache.free_sequence(low);  // slot 0
  cache.free_sequence(mid);  // slot 2, right after seq's block in slot 1
  this->append(cache, 0, seq, block_tokens, block_tokens, {Region::gpu_streamed});
  EXPECT_EQ(this->slots_of(cache, Region::gpu_streamed, seq), (std::vector<int>{1, 2}));
  this->expect_tokens(cache, 0, seq, 0);
}

// A budget the machine cannot give (1 PiB, past any address space) is one
// error naming its pool, not Kokkos' allocation failure.
TEST(InplaceKVCachePools, ABudgetTheMachineCannotGiveIsOneErrorNamingItsPool) {
  const BlockGeometry g{256, 8, 128, 128, false};  // 2 MiB blocks of float: 2^29 slots index
  const std::uint64_t block = static_cast<std::uint64_t>(g.block_elements()) * sizeof(float);
  const std::uint64_t pebibyte = std::uint64_t{1} << 50;
  const std::pair<const char*, KVCacheBudgets> cases[] = {{"VRAM", {pebibyte, block, block}},
                                                          {"pinned", {block, pebibyte, block}},
                                                          {"host", {block, block, pebibyte}}};
  for (const auto& [pool, budgets] : cases) {
    try {
      InplaceKVCache<float> cache(KVCacheShape{1, g}, budgets, BudgetPolicy::strict);
      ADD_FAILURE() << "a " << pool << " pool of 1 PiB was allocated";
    } catch (const KVCacheError& e) {
      EXPECT_NE(std::string(e.what()).find("KV cache: the " + std::string(pool) + " budget of " +
                                           std::to_string(pebibyte) + " bytes (536870912 blocks) cannot be allocated"),
                std::string::npos)
          << e.what();
    }
  }
}

// The host pools a CPU decode step streams ask for huge pages
// (framework/host_memory.hpp).
TEST(InplaceKVCacheHostPools, AskForHugePages) {
  if (!huge_pages_advisable()) GTEST_SKIP() << "transparent huge pages: " << transparent_huge_pages();
  const std::uint64_t bytes = std::uint64_t{16} << 20;
  InplaceKVCache<float> cache(small_shape(), KVCacheBudgets{0, bytes, bytes}, BudgetPolicy::strict);
  EXPECT_TRUE(huge_pages_advised(cache.host_pool().data(), cache.host_pool().span() * sizeof(float)));
  if (std::is_same_v<PinnedMemSpace, Kokkos::HostSpace>) {
    EXPECT_TRUE(huge_pages_advised(cache.pinned_pool().data(), cache.pinned_pool().span() * sizeof(float)));
  }
}

// A bookkeeping cache (no pools) places blocks in the same slots as an
// allocated one under the same appends and frees, and takes no data.
TEST(InplaceKVCacheBookkeeping, PlacesBlocksAsTheAllocatedCacheDoes) {
  using Tokens = Kokkos::View<const float***, Kokkos::LayoutRight, HostMemSpace>;
  const KVCacheShape shape = small_shape();
  const KVCacheBudgets budgets = blocks_of<float>(6, 6, 6);
  InplaceKVCache<float> allocated(shape, budgets, BudgetPolicy::fall_back);
  InplaceKVCache<float> bookkeeping(shape, budgets, BudgetPolicy::fall_back, KVStorage::bookkeeping);
  EXPECT_EQ(bookkeeping.vram_pool().span(), 0u);
  EXPECT_EQ(bookkeeping.capacity_blocks(Region::cpu_streamed), allocated.capacity_blocks(Region::cpu_streamed));
  const Kokkos::View<float***, Kokkos::LayoutRight, HostMemSpace> keys("writescope::test::keys", 40, heads, key_dim),
      values("writescope::test::values", 40, heads, value_dim);
  const Region cycle[] = {Region::gpu_resident, Region::cpu_streamed, Region::cpu_resident, Region::gpu_streamed};
  int next_region = 0;
  std::vector<int> live;
  auto append = [&](int layer, int sequence, std::int64_t tokens) {
    std::vector<Region> regions(allocated.new_blocks_needed(layer, sequence, tokens));
    for (Region& r : regions) r = cycle[next_region++ % 4];
    const auto range = std::make_pair(std::int64_t{0}, tokens);
    allocated.append(HostExecSpace(), layer, sequence, Tokens(Kokkos::subview(keys, range, Kokkos::ALL, Kokkos::ALL)),
                     Tokens(Kokkos::subview(values, range, Kokkos::ALL, Kokkos::ALL)), regions);
    bookkeeping.record_append(layer, sequence, tokens, regions);
  };
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < 2; ++s) {
      live.push_back(allocated.add_sequence());
      ASSERT_EQ(bookkeeping.add_sequence(), live.back());
      for (int layer = 0; layer < 2; ++layer) append(layer, live.back(), 17 + 5 * s + round);
    }
    for (int layer = 0; layer < 2; ++layer)
      for (int sequence : live) {
        EXPECT_EQ(bookkeeping.block_regions(layer, sequence), allocated.block_regions(layer, sequence));
        for (const Region region : cycle) {
          const auto a = allocated.segments(layer, region, {sequence}, {TokenRange{0, 64}});
          const auto b = bookkeeping.segments(layer, region, {sequence}, {TokenRange{0, 64}});
          ASSERT_EQ(a.size(), b.size());
          for (std::size_t i = 0; i < a.size(); ++i) {
            EXPECT_EQ(a[i].slot, b[i].slot);
            EXPECT_EQ(a[i].token_count, b[i].token_count);
          }
        }
      }
    allocated.free_sequence(live.front());
    bookkeeping.free_sequence(live.front());
    live.erase(live.begin());
  }
  for (const Region region : cycle) EXPECT_EQ(bookkeeping.region_bytes(region), allocated.region_bytes(region));
  EXPECT_THROW(allocated.record_append(0, live.back(), 1, {}), KVCacheError);
  const std::int64_t length = bookkeeping.length(0, live.back());
  EXPECT_THROW(bookkeeping.record_append(0, live.back(), -1, {}), KVCacheError);  // not "nothing appended"
  EXPECT_EQ(bookkeeping.length(0, live.back()), length);
  EXPECT_THROW(bookkeeping.append(HostExecSpace(), 0, live.back(),
                                  Tokens(Kokkos::subview(keys, std::make_pair(0, 1), Kokkos::ALL, Kokkos::ALL)),
                                  Tokens(Kokkos::subview(values, std::make_pair(0, 1), Kokkos::ALL, Kokkos::ALL)), {}),
               KVCacheError);
}

TYPED_TEST(InplaceKVCacheTest, SegmentsCoverExactlyTheRequestedRanges) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(4, 4, 4), BudgetPolicy::strict);
  const int a = cache.add_sequence(), b = cache.add_sequence();
  this->append(cache, 0, a, 0, 40, {Region::gpu_streamed, Region::cpu_resident, Region::gpu_streamed});
  this->append(cache, 0, b, 0, 17, {Region::gpu_streamed, Region::gpu_streamed});
  const auto segments = cache.segments(0, Region::gpu_streamed, {b, a}, {TokenRange{3, 17}, TokenRange{10, 35}});
  ASSERT_EQ(segments.size(), 4u);
  // b (batch index 0): tokens 3..15 of block 0 and token 16 (block 1, first token).
  EXPECT_EQ(segments[0].batch_index, 0);
  EXPECT_EQ(segments[0].token_begin, 3);
  EXPECT_EQ(segments[0].token_count, 13);
  EXPECT_EQ(segments[1].token_begin, 0);
  EXPECT_EQ(segments[1].token_count, 1);
  // a (batch index 1): tokens 10..15 of block 0, then block 2 up to token 34.
  EXPECT_EQ(segments[2].batch_index, 1);
  EXPECT_EQ(segments[2].token_begin, 10);
  EXPECT_EQ(segments[2].token_count, 6);
  EXPECT_EQ(segments[3].token_begin, 0);
  EXPECT_EQ(segments[3].token_count, 3);
  std::vector<std::int64_t> positions;
  for (const auto& segment : segments) positions.push_back(segment.position);
  EXPECT_EQ(positions, (std::vector<std::int64_t>{3, 16, 10, 32}));
  EXPECT_TRUE(cache.segments(0, Region::cpu_resident, {a}, {TokenRange{0, 16}}).empty());
  // A range past the sequence's length ends at its last written token, not its last block's end.
  const auto past = cache.segments(0, Region::gpu_streamed, {b}, {TokenRange{0, 100}});
  ASSERT_EQ(past.size(), 2u);
  EXPECT_EQ(past[0].token_count + past[1].token_count, 17);
  EXPECT_EQ(past[1].token_count, 1);
}

TYPED_TEST(InplaceKVCacheTest, RejectsMismatchedInput) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(4, 4, 4), BudgetPolicy::strict);
  const int seq = cache.add_sequence();
  EXPECT_THROW(this->append(cache, 0, seq, 0, 20, {Region::gpu_resident}), KVCacheError);  // needs two regions
  EXPECT_THROW(this->append(cache, 2, seq, 0, 1, {Region::gpu_resident}), KVCacheError);   // no layer 2
  EXPECT_THROW(this->append(cache, 0, 7, 0, 1, {Region::gpu_resident}), KVCacheError);     // no sequence 7
  EXPECT_THROW(cache.new_blocks_needed(0, seq, -1), KVCacheError);  // every append asks it first
  EXPECT_EQ(cache.length(0, seq), 0);
  EXPECT_THROW(InplaceKVCache<Storage>(KVCacheShape{0, small_shape().block}, {}, BudgetPolicy::strict), KVCacheError);
  for (const BlockGeometry& geometry : {BlockGeometry{0, heads, key_dim, value_dim, false},
                                        BlockGeometry{block_tokens, 0, key_dim, value_dim, false},
                                        BlockGeometry{block_tokens, heads, key_dim, key_dim + 1, true}})
    EXPECT_THROW(InplaceKVCache<Storage>(KVCacheShape{1, geometry}, {}, BudgetPolicy::strict), KVCacheError);
}

// A sequence whose previous block is in a pool's last slot takes a freed
// slot, not the one past the pool's end.
TYPED_TEST(InplaceKVCacheTest, ABlockAfterThePoolsLastSlotTakesAFreedOne) {
  using Storage = typename TestFixture::Scalar;
  InplaceKVCache<Storage> cache(small_shape(), blocks_of<Storage>(0, 2, 0), BudgetPolicy::strict);
  const int other = cache.add_sequence(), seq = cache.add_sequence();
  this->append(cache, 0, other, 0, block_tokens, {Region::cpu_streamed});  // slot 0
  this->append(cache, 0, seq, 0, block_tokens, {Region::cpu_streamed});    // slot 1, the last
  cache.free_sequence(other);
  this->append(cache, 0, seq, block_tokens, block_tokens, {Region::cpu_streamed});
  EXPECT_EQ(this->slots_of(cache, Region::cpu_streamed, seq), (std::vector<int>{1, 0}));
  this->expect_tokens(cache, 0, seq, 0);
}

}  // namespace
}  // namespace writescope
