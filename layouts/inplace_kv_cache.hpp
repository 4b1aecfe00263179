#pragma once
// InplaceKVCache: a KV cache whose blocks get their physical region when they
// are written and keep it until their sequence is freed (DESIGN.md §2).
//
// Three pools back the four regions, each preallocated from its byte budget:
//   VRAM pool   (GpuMemSpace)    -> GpuResident
//   pinned pool (PinnedMemSpace) -> GpuStreamed and CpuStreamed (the movable band)
//   host pool   (HostMemSpace)   -> CpuResident
// A pool slot holds one block (one layer of one sequence, block_tokens tokens)
// in the order of its region (kv_format.hpp). Which device reads which block is
// the scheduler's choice; the cache only enumerates block segments per region.

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/bf16.hpp"
#include "framework/spaces.hpp"
#include "layouts/kv_format.hpp"

namespace writescope {

class KVCacheError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A block's pool (and, with fall_back, every pool on its chain) is full.
class KVBudgetError : public KVCacheError {
 public:
  using KVCacheError::KVCacheError;
};

struct KVCacheShape {
  int layers = 1;
  BlockGeometry block;  // tokens per block, heads, key/value dims
};

/// Byte budgets of the three pools. A pool holds floor(budget / block bytes) blocks.
struct KVCacheBudgets {
  std::uint64_t vram_bytes = 0;
  std::uint64_t pinned_bytes = 0;
  std::uint64_t host_bytes = 0;
};

/// What happens when a block's pool is full.
///  - strict: throw KVCacheError naming the region, the budget and the block.
///  - fall_back: GpuResident -> GpuStreamed -> CpuResident, CpuStreamed ->
///    CpuResident, CpuResident -> CpuStreamed; KVCacheError only when every
///    pool on the chain is full. Callers see the region actually used in
///    block_regions() and region_bytes().
enum class BudgetPolicy { strict, fall_back };

/// Whether the pools hold data. A bookkeeping cache allocates no pool: it
/// places blocks and enumerates segments exactly as an allocated one (so the
/// KV policies can plan on it, as `writescope predict` does for full-size
/// models) but takes only record_append(), never append().
enum class KVStorage { allocated, bookkeeping };

/// Tokens [begin, end) of one sequence.
struct TokenRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

namespace test {
struct InplaceKVCachePeer;  // tests: appends whose writes fail part-way
}  // namespace test

template <class Scalar>
class InplaceKVCache {
 public:
  template <class MemSpace>
  using Pool = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemSpace>;  // (slots, block_elements)
  /// Keys (tokens, kv_heads, key_dim) or values (tokens, kv_heads, value_dim), row-major.
  template <class MemSpace>
  using TokenView = Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemSpace>;

  InplaceKVCache(const KVCacheShape& shape, const KVCacheBudgets& budgets, BudgetPolicy policy,
                 KVStorage storage = KVStorage::allocated);

  const KVCacheShape& shape() const noexcept { return shape_; }
  const BlockGeometry& geometry() const noexcept { return shape_.block; }
  std::uint64_t block_bytes() const noexcept;

  /// A new, empty sequence; returns its id.
  int add_sequence();
  /// Returns every block of the sequence to its pool; the id becomes invalid.
  void free_sequence(int sequence);
  /// Tokens written to `layer` of `sequence`.
  std::int64_t length(int layer, int sequence) const;

  /// Appends tokens to `layer` of `sequence`: first into the free space of the
  /// sequence's last block (whose region is already fixed), then into new
  /// blocks, the k-th new block placed in `new_block_regions[k]` (subject to the
  /// budget policy). `new_block_regions` must name exactly new_blocks_needed()
  /// regions. `values` is ignored when values are stored in the keys.
  /// Copies run on `space`, which must be able to read MemSpace; the call
  /// returns when the data is in place.
  template <class ExecSpace, class MemSpace>
  void append(const ExecSpace& space, int layer, int sequence, const TokenView<MemSpace>& keys,
              const TokenView<MemSpace>& values, const std::vector<Region>& new_block_regions);

  /// The bookkeeping of append() without data: the tokens count as written
  /// and new blocks are placed as append() would place them. Only for a
  /// KVStorage::bookkeeping cache (KVCacheError otherwise: an allocated
  /// cache would hold tokens nobody wrote).
  void record_append(int layer, int sequence, std::int64_t tokens, const std::vector<Region>& new_block_regions);
  /// Number of new blocks an append of `tokens` tokens would open.
  int new_blocks_needed(int layer, int sequence, std::int64_t tokens) const;

  /// Regions of the blocks of `layer` of `sequence`, in token order.
  std::vector<Region> block_regions(int layer, int sequence) const;

  /// Segments of `layer`'s blocks in `region` that intersect ranges[i] of
  /// sequences[i]; batch_index is i. Sorted by batch_index, then token order.
  std::vector<BlockSegment> segments(int layer, Region region, const std::vector<int>& sequences,
                                     const std::vector<TokenRange>& ranges) const;

  /// Bytes of the blocks currently placed in `region` (whole blocks).
  std::uint64_t region_bytes(Region region) const;
  /// Bytes of the tokens currently stored in `region`.
  std::uint64_t region_token_bytes(Region region) const;
  /// Blocks each pool can hold in total.
  std::int64_t capacity_blocks(Region region) const;

  const Pool<GpuMemSpace>& vram_pool() const noexcept { return vram_pool_; }
  const Pool<PinnedMemSpace>& pinned_pool() const noexcept { return pinned_pool_; }
  const Pool<HostMemSpace>& host_pool() const noexcept { return host_pool_; }

  /// Copies one token's key and value back out, as floats (for tests and tools).
  /// key: key_dim floats, value: value_dim floats.
  void read_token(int layer, int sequence, std::int64_t position, int head, float* key, float* value) const;

 private:
  friend struct test::InplaceKVCachePeer;
  struct Block {
    Region region;
    int slot;
    int tokens;
  };
  enum PoolId { vram = 0, pinned = 1, host = 2 };
  static PoolId pool_of(Region region);

  const Block& block_at(int layer, int sequence, std::int64_t position) const;
  std::vector<Block>& blocks(int layer, int sequence);
  const std::vector<Block>& blocks(int layer, int sequence) const;
  void check_sequence(int sequence) const;
  Block allocate_block(Region requested, int layer, int sequence);
  /// Returns `block`'s slot to its pool and takes it out of the region counts.
  void release_block(const Block& block);
  /// Appends `tokens` tokens' bookkeeping; write(block, token_in_block, first, count) copies the data.
  template <class Write>
  void place_tokens(int layer, int sequence, std::int64_t tokens, const std::vector<Region>& new_block_regions,
                    const Write& write);

  template <class ExecSpace, class MemSpace>
  void write_tokens(const ExecSpace& space, const Block& block, int token_in_block, const TokenView<MemSpace>& keys,
                    const TokenView<MemSpace>& values, std::int64_t first, std::int64_t count);

  KVCacheShape shape_;
  BudgetPolicy policy_;
  Pool<GpuMemSpace> vram_pool_;
  Pool<PinnedMemSpace> pinned_pool_;
  Pool<HostMemSpace> host_pool_;
  /// A pool's free slots: every slot from next_unused on, and those freed below it.
  struct FreeSlots {
    std::uint64_t budget_bytes = 0;  // as given: a budget under one block holds none
    int capacity = 0, next_unused = 0;
    std::set<int> freed;
    bool empty() const { return freed.empty() && next_unused >= capacity; }
    /// `preferred` if free, else the lowest free slot.
    int take(int preferred);
    void give(int slot) { freed.insert(slot); }
  };
  KVStorage storage_;
  std::array<FreeSlots, 3> free_slots_;
  std::array<std::int64_t, region_count> region_blocks_{};
  std::array<std::int64_t, region_count> region_tokens_{};
  // blocks_[sequence][layer]; a freed sequence has no layers.
  std::vector<std::vector<std::vector<Block>>> blocks_;
  std::vector<bool> live_;
  // Host copies of the keys and values a CpuResident write transposes, grown
  // geometrically and reused (no allocation per append).
  Kokkos::View<Scalar*, HostMemSpace> staging_[2];
};

extern template class InplaceKVCache<float>;
extern template class InplaceKVCache<bf16>;

}  // namespace writescope

#include "layouts/impl/inplace_kv_cache_append.hpp"
