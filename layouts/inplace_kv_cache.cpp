#include "layouts/inplace_kv_cache.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "framework/host_memory.hpp"

namespace writescope {

const char* region_name(Region region) {
  switch (region) {
    case Region::gpu_resident: return "GpuResident";
    case Region::gpu_streamed: return "GpuStreamed";
    case Region::cpu_resident: return "CpuResident";
    case Region::cpu_streamed: return "CpuStreamed";
  }
  return "?";
}

namespace {

constexpr const char* pool_description[3] = {"VRAM", "pinned", "host"};

/// Next region to try when `region`'s pool is full (fall_back policy), or itself at the end of the chain.
Region fallback_of(Region region) {
  switch (region) {
    case Region::gpu_resident: return Region::gpu_streamed;
    case Region::gpu_streamed: return Region::cpu_resident;
    case Region::cpu_streamed: return Region::cpu_resident;
    case Region::cpu_resident: return Region::cpu_streamed;
  }
  return region;
}

/// The pool of `budget` bytes, in whole blocks. Its memory is taken here (on
/// a GPU machine VRAM and page-locked host memory at once), so a budget the
/// machine cannot give is one KVCacheError naming the pool.
template <class Pool>
Pool allocate_pool(const char* label, const char* description, std::uint64_t budget, std::uint64_t block_bytes,
                   std::int64_t block_elements) {
  const auto slots = static_cast<std::int64_t>(budget / block_bytes);
  Pool pool;
  try {
    pool = Pool(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), static_cast<std::size_t>(slots),
                static_cast<std::size_t>(block_elements));
  } catch (const std::exception& e) {  // Kokkos reports a failed allocation as std::runtime_error
    throw KVCacheError("KV cache: the " + std::string(description) + " budget of " + std::to_string(budget) +
                       " bytes (" + std::to_string(slots) + " blocks) cannot be allocated on this machine: " +
                       e.what());
  }
  advise_huge_pages(pool);  // host pools: before the first write touches them
  return pool;
}

}  // namespace

template <class Scalar>
InplaceKVCache<Scalar>::InplaceKVCache(const KVCacheShape& shape, const KVCacheBudgets& budgets, BudgetPolicy policy,
                                       KVStorage storage)
    : shape_(shape), policy_(policy), storage_(storage) {
  const BlockGeometry& g = shape_.block;
  if (shape_.layers < 1) throw KVCacheError("KV cache: layers must be at least 1, got " + std::to_string(shape_.layers));
  if (g.block_tokens < 1 || g.kv_heads < 1 || g.key_dim < 1 || g.value_dim < 1)
    throw KVCacheError("KV cache: block_tokens, kv_heads, key_dim and value_dim must be positive");
  if (g.values_in_keys && g.value_dim > g.key_dim)
    throw KVCacheError("KV cache: values stored in keys need value_dim <= key_dim, got " +
                       std::to_string(g.value_dim) + " > " + std::to_string(g.key_dim));
  const std::uint64_t bytes = block_bytes();
  const std::uint64_t budget[3] = {budgets.vram_bytes, budgets.pinned_bytes, budgets.host_bytes};
  for (int pool = 0; pool < 3; ++pool) {
    const std::uint64_t slots = budget[pool] / bytes;
    if (slots > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      throw KVCacheError("KV cache: the " + std::string(pool_description[pool]) + " budget of " +
                         std::to_string(budget[pool]) + " bytes holds " +
                         std::to_string(slots) + " blocks, more than a pool can index");
    free_slots_[pool].capacity = static_cast<int>(slots);
    free_slots_[pool].budget_bytes = budget[pool];
  }
  if (storage_ == KVStorage::bookkeeping) return;
  vram_pool_ = allocate_pool<Pool<GpuMemSpace>>("writescope::layouts::vram_pool", pool_description[0],
                                                budgets.vram_bytes, bytes, g.block_elements());
  pinned_pool_ = allocate_pool<Pool<PinnedMemSpace>>("writescope::layouts::pinned_pool", pool_description[1],
                                                     budgets.pinned_bytes, bytes, g.block_elements());
  host_pool_ = allocate_pool<Pool<HostMemSpace>>("writescope::layouts::host_pool", pool_description[2],
                                                 budgets.host_bytes, bytes, g.block_elements());
}

template <class Scalar>
int InplaceKVCache<Scalar>::FreeSlots::take(int preferred) {
  if (freed.erase(preferred) == 1) return preferred;
  if (preferred == next_unused && next_unused < capacity) return next_unused++;
  if (!freed.empty() && (next_unused >= capacity || *freed.begin() < next_unused)) {
    const int lowest = *freed.begin();
    freed.erase(freed.begin());
    return lowest;
  }
  return next_unused++;
}

template <class Scalar>
std::uint64_t InplaceKVCache<Scalar>::block_bytes() const noexcept {
  return static_cast<std::uint64_t>(shape_.block.block_elements()) * sizeof(Scalar);
}

template <class Scalar>
typename InplaceKVCache<Scalar>::PoolId InplaceKVCache<Scalar>::pool_of(Region region) {
  switch (region) {
    case Region::gpu_resident: return vram;
    case Region::cpu_resident: return host;
    default: return pinned;
  }
}

template <class Scalar>
int InplaceKVCache<Scalar>::add_sequence() {
  blocks_.emplace_back(static_cast<std::size_t>(shape_.layers));
  live_.push_back(true);
  return static_cast<int>(blocks_.size()) - 1;
}

template <class Scalar>
void InplaceKVCache<Scalar>::check_sequence(int sequence) const {
  if (sequence < 0 || sequence >= static_cast<int>(blocks_.size()) || !live_[sequence])
    throw KVCacheError("KV cache: no live sequence " + std::to_string(sequence));
}

template <class Scalar>
std::vector<typename InplaceKVCache<Scalar>::Block>& InplaceKVCache<Scalar>::blocks(int layer, int sequence) {
  check_sequence(sequence);
  if (layer < 0 || layer >= shape_.layers)
    throw KVCacheError("KV cache: layer " + std::to_string(layer) + " out of range [0, " +
                       std::to_string(shape_.layers) + ")");
  return blocks_[sequence][layer];
}

template <class Scalar>
const std::vector<typename InplaceKVCache<Scalar>::Block>& InplaceKVCache<Scalar>::blocks(int layer,
                                                                                          int sequence) const {
  return const_cast<InplaceKVCache*>(this)->blocks(layer, sequence);
}

template <class Scalar>
void InplaceKVCache<Scalar>::free_sequence(int sequence) {
  check_sequence(sequence);
  for (const auto& layer : blocks_[sequence])
    for (const Block& block : layer) release_block(block);
  blocks_[sequence].clear();
  live_[sequence] = false;
}

template <class Scalar>
std::int64_t InplaceKVCache<Scalar>::length(int layer, int sequence) const {
  std::int64_t tokens = 0;
  for (const Block& block : blocks(layer, sequence)) tokens += block.tokens;
  return tokens;
}

template <class Scalar>
void InplaceKVCache<Scalar>::record_append(int layer, int sequence, std::int64_t tokens,
                                          const std::vector<Region>& new_block_regions) {
  if (storage_ != KVStorage::bookkeeping)
    throw KVCacheError("record_append: only a bookkeeping cache takes tokens without data; use append()");
  place_tokens(layer, sequence, tokens, new_block_regions, [](const Block&, int, std::int64_t, std::int64_t) {});
}

template <class Scalar>
int InplaceKVCache<Scalar>::new_blocks_needed(int layer, int sequence, std::int64_t tokens) const {
  // Every append asks here first: a negative count would pass as appending nothing.
  if (tokens < 0)
    throw KVCacheError("KV cache: an append of " + std::to_string(tokens) + " tokens to layer " +
                       std::to_string(layer) + ", sequence " + std::to_string(sequence) + " (a count is not negative)");
  const auto& list = blocks(layer, sequence);
  const std::int64_t room = list.empty() ? 0 : shape_.block.block_tokens - list.back().tokens;
  const std::int64_t overflow = std::max<std::int64_t>(0, tokens - room);
  return static_cast<int>((overflow + shape_.block.block_tokens - 1) / shape_.block.block_tokens);
}

template <class Scalar>
typename InplaceKVCache<Scalar>::Block InplaceKVCache<Scalar>::allocate_block(Region requested, int layer,
                                                                              int sequence) {
  const auto& list = blocks(layer, sequence);
  Region region = requested;
  for (int attempt = 0; attempt < region_count; ++attempt) {
    auto& free = free_slots_[pool_of(region)];
    if (!free.empty()) {
      // Prefer the slot after the sequence's previous block in the same pool,
      // so consecutive blocks form one contiguous run for streaming copies.
      const bool follows = !list.empty() && pool_of(list.back().region) == pool_of(region);
      const int slot = free.take(follows ? list.back().slot + 1 : -1);
      region_blocks_[static_cast<int>(region)] += 1;
      return Block{region, slot, 0};
    }
    if (policy_ == BudgetPolicy::strict || fallback_of(region) == requested) break;
    region = fallback_of(region);
  }
  const PoolId pool = pool_of(requested);
  const std::int64_t capacity = capacity_blocks(requested);
  const std::string budget = std::string("the ") + pool_description[pool] + " budget";
  throw KVBudgetError(
      std::string("KV cache: no room for a ") + region_name(requested) + " block of layer " + std::to_string(layer) +
      ", sequence " + std::to_string(sequence) + ": " +
      (capacity == 0 ? budget + " of " + std::to_string(free_slots_[pool].budget_bytes) +
                           " bytes is smaller than one block (" + std::to_string(block_bytes()) + " bytes)"
                     : budget + " holds " + std::to_string(capacity) + " blocks of " +
                           std::to_string(block_bytes()) + " bytes and all are in use") +
      (policy_ == BudgetPolicy::fall_back ? ", and the fallback regions' pools are full" : ""));
}

template <class Scalar>
void InplaceKVCache<Scalar>::release_block(const Block& block) {
  free_slots_[pool_of(block.region)].give(block.slot);
  region_blocks_[static_cast<int>(block.region)] -= 1;
  region_tokens_[static_cast<int>(block.region)] -= block.tokens;
}

template <class Scalar>
std::vector<Region> InplaceKVCache<Scalar>::block_regions(int layer, int sequence) const {
  std::vector<Region> regions;
  for (const Block& block : blocks(layer, sequence)) regions.push_back(block.region);
  return regions;
}

template <class Scalar>
std::vector<BlockSegment> InplaceKVCache<Scalar>::segments(int layer, Region region,
                                                           const std::vector<int>& sequences,
                                                           const std::vector<TokenRange>& ranges) const {
  if (sequences.size() != ranges.size())
    throw KVCacheError("KV cache: segments needs one token range per sequence");
  std::vector<BlockSegment> out;
  const int block_tokens = shape_.block.block_tokens;
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const auto& list = blocks(layer, sequences[i]);
    for (std::size_t b = 0; b < list.size(); ++b) {
      if (list[b].region != region) continue;
      const std::int64_t block_start = static_cast<std::int64_t>(b) * block_tokens;
      const std::int64_t begin = std::max(ranges[i].begin, block_start);
      const std::int64_t end = std::min(ranges[i].end, block_start + list[b].tokens);
      if (begin >= end) continue;
      out.push_back(BlockSegment{static_cast<int>(i), list[b].slot, static_cast<int>(begin - block_start),
                                 static_cast<int>(end - begin), begin});
    }
  }
  return out;
}

template <class Scalar>
std::uint64_t InplaceKVCache<Scalar>::region_bytes(Region region) const {
  return static_cast<std::uint64_t>(region_blocks_[static_cast<int>(region)]) * block_bytes();
}

template <class Scalar>
std::uint64_t InplaceKVCache<Scalar>::region_token_bytes(Region region) const {
  return static_cast<std::uint64_t>(region_tokens_[static_cast<int>(region)]) * block_bytes() /
         static_cast<std::uint64_t>(shape_.block.block_tokens);
}

template <class Scalar>
std::int64_t InplaceKVCache<Scalar>::capacity_blocks(Region region) const {
  return free_slots_[pool_of(region)].capacity;
}

template <class Scalar>
const typename InplaceKVCache<Scalar>::Block& InplaceKVCache<Scalar>::block_at(int layer, int sequence,
                                                                               std::int64_t position) const {
  const auto& list = blocks(layer, sequence);
  const std::int64_t index = position / shape_.block.block_tokens;
  if (position < 0 || index >= static_cast<std::int64_t>(list.size()) ||
      position % shape_.block.block_tokens >= list[index].tokens)
    throw KVCacheError("KV cache: token " + std::to_string(position) + " of sequence " + std::to_string(sequence) +
                       " has not been written");
  return list[index];
}

template <class Scalar>
void InplaceKVCache<Scalar>::read_token(int layer, int sequence, std::int64_t position, int head, float* key,
                                        float* value) const {
  if (storage_ == KVStorage::bookkeeping) throw KVCacheError("read_token: a bookkeeping cache holds no data");
  const Block& block = block_at(layer, sequence, position);
  const BlockGeometry& g = shape_.block;
  if (head < 0 || head >= g.kv_heads)
    throw KVCacheError("read_token: KV head " + std::to_string(head) + " of " + std::to_string(g.kv_heads));
  const BlockOrder order = block_order(block.region);
  const int token = static_cast<int>(position % g.block_tokens);
  std::vector<Scalar> host_block(static_cast<std::size_t>(g.block_elements()));
  Kokkos::View<Scalar*, HostMemSpace, Kokkos::MemoryUnmanaged> target(host_block.data(), host_block.size());
  auto copy_from = [&](const auto& pool) { Kokkos::deep_copy(target, Kokkos::subview(pool, block.slot, Kokkos::ALL)); };
  switch (pool_of(block.region)) {
    case vram: copy_from(vram_pool_); break;
    case pinned: copy_from(pinned_pool_); break;
    default: copy_from(host_pool_); break;
  }
  for (int d = 0; d < g.key_dim; ++d) key[d] = to_float(host_block[g.key_offset(order, token, head, d)]);
  for (int d = 0; d < g.value_dim; ++d) value[d] = to_float(host_block[g.value_offset(order, token, head, d)]);
}

template class InplaceKVCache<float>;
template class InplaceKVCache<bf16>;

}  // namespace writescope
