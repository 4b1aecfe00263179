#pragma once
// Which cache level host decode attention requests the next pass of a
// head-major block into, while the current pass's products run (AVX-512 paths).
// Which is faster depends on the machine and on the attention shape (2
// threads, from DRAM, alternated): on AMD Zen 4, L2 (one stream) beat L1 (four
// streams) by 10-30% for Qwen3 and Mixtral; on AMD Zen 5 it cost them 15-30%
// one day, and the next, in one process, cost Qwen3 15-20% and gained Mixtral
// 8-17%. So one binary measures both levels on the kernel itself, once per
// process and attention shape, and takes the faster; it can be pinned (tests,
// comparisons) with set_next_pass_prefetch or the
// WRITESCOPE_NEXT_PASS_PREFETCH environment variable ("l1" or "l2").

#include <cstdint>
#include <string>

#include "attention/shape.hpp"
#include "framework/cpu_path.hpp"

namespace writescope {

/// `prefetcht0` (into L1) or `prefetcht1` (into L2 only, which leaves the
/// core's L1 misses in flight to the products' own loads).
enum class PrefetchLevel : int { l1 = 0, l2 = 1 };

/// "l1", "l2".
const char* prefetch_level_name(PrefetchLevel level);
/// Inverse of prefetch_level_name; throws std::invalid_argument naming the valid names.
PrefetchLevel parse_prefetch_level(const std::string& name);

/// The measurement behind the choice for one attention shape: the median time
/// of one decode step of the probe (one sequence of the shape over `kv_bytes`
/// of head-major KV, from DRAM: next_pass_probe_bytes) with each level,
/// alternated, on `path` with all host threads.
struct NextPassPrefetchMeasurement {
  bool measured = false;  // false where the shape's products do not honour the level here (impl::honours_next_pass_level)
  std::string path;       // cpu_path_name of the path measured
  std::string probe;      // the probe's shape, e.g. "qwen3-30b-a3b (32 query / 4 KV heads), head-major"
  std::int64_t kv_bytes = 0;
  int alternations = 0;
  double l1_ms = 0, l2_ms = 0;
  PrefetchLevel faster = PrefetchLevel::l1;
};

/// The probe's KV for a last-level cache of `last_level_cache_bytes`: twice
/// that, at least 64 MiB, at most 256 MiB (a VM may report its host's whole
/// L3: 508 MiB on a 2-vCPU Zen 5 VM, whose core shares 32 MiB; a 1 GiB probe
/// took 4 s).
std::int64_t next_pass_probe_bytes(std::int64_t last_level_cache_bytes);

/// l2 only where its step is at least 3% faster than l1's: L1 requests are
/// the ones measured on every machine, and a smaller difference is within
/// a shared machine's noise.
PrefetchLevel faster_prefetch_level(double l1_ms, double l2_ms);

/// Measures both levels on the active CPU path for `shape` (its heads and
/// dimensions) the first time that shape asks in this process (about 0.1-0.5
/// s: the probe's allocation and first touch, then 2 x 8 steps). Call it from
/// a thread that runs host kernels (it launches them); safe from several.
const NextPassPrefetchMeasurement& next_pass_prefetch_measurement(const AttentionShape& shape);

/// The level host decode attention of `shape` takes now: the pinned one
/// (set_next_pass_prefetch), else WRITESCOPE_NEXT_PASS_PREFETCH (an unknown
/// name is an error naming the variable), else the one measured faster for
/// the shape.
PrefetchLevel active_next_pass_prefetch(const AttentionShape& shape);
/// Pins the level for the process (every shape).
void set_next_pass_prefetch(PrefetchLevel level);
/// One line for results and `writescope info`: the shape's level and where it
/// came from, e.g. "l1 (measured on avx512_bf16, qwen3-30b-a3b (32 query / 4
/// KV heads), head-major, 256 MiB, medians of 7: l1 5.338 ms, l2 7.067 ms)",
/// "l1 (WRITESCOPE_NEXT_PASS_PREFETCH)".
std::string describe_next_pass_prefetch(const AttentionShape& shape);

/// Pins a level for a scope (tests), restoring the previous pin (or none) after.
class ScopedNextPassPrefetch {
 public:
  explicit ScopedNextPassPrefetch(PrefetchLevel level);
  ~ScopedNextPassPrefetch();
  ScopedNextPassPrefetch(const ScopedNextPassPrefetch&) = delete;
  ScopedNextPassPrefetch& operator=(const ScopedNextPassPrefetch&) = delete;

 private:
  int previous_;
};

namespace impl {
/// Makes `m` the shape's measurement on the active path (tests: levels that
/// differ by shape on any machine); references to the one it replaces dangle.
void replace_next_pass_prefetch_measurement(const AttentionShape& shape, const NextPassPrefetchMeasurement& m);
/// Whether the products of `path` request the next pass by level for blocks
/// of this kind: the AVX-512 products of head-major (tiled-key) blocks, but
/// not where the fp32 products of groups over 4 are compute-bound (L2
/// requests cost them 3-8% on Zen 4); token rows (GQA token-major, MLA) stay
/// with L1, where L2 lost up to 10%; other paths make no next-pass requests.
bool honours_next_pass_level(CpuPath path, bool tiled_keys, int group);
/// The level those products request the next pass into: `requested`
/// (active_next_pass_prefetch) where honours_next_pass_level, else l1.
PrefetchLevel next_pass_level(CpuPath path, bool tiled_keys, int group, PrefetchLevel requested);
}  // namespace impl

}  // namespace writescope
