#pragma once
// How host decode attention streams KV through its passes, chosen per machine
// and attention shape by measuring the kernel itself, once per process:
//  - the cache level it requests the next pass of a head-major block into,
//    while the current pass's products run (AVX-512 paths). On AMD Zen 4, L2
//    (one stream) beat L1 (four streams) by 10-30% for Qwen3 and Mixtral; on
//    AMD Zen 5 it cost them 15-30% one day, and the next, in one process, cost
//    Qwen3 15-20% and gained Mixtral 8-17%. Each level is timed with passes of
//    32, 64 and 128 tokens, and the head-major passes take the length
//    measured with the level taken (Zen 5: L1 with 32 tokens, where a pass and
//    the next fit L1, led Mixtral by 10-25%). Pinned with
//    set_next_pass_prefetch or WRITESCOPE_NEXT_PASS_PREFETCH ("l1" or "l2"),
//    the passes with WRITESCOPE_HEAD_MAJOR_PASS (32, 64 or 128).
//  - the tokens per pass over token-major blocks whose rows several KV heads
//    share (GQA CpuStreamed): Zen 4 read Qwen3 fastest in passes of 64 tokens
//    (128 KiB), Zen 5 in passes of 32 (64 KiB), 5-17% ahead of 64. Pinned
//    with ScopedTokenMajorPass or WRITESCOPE_TOKEN_MAJOR_PASS (32, 64 or 128).
//  - the product path, where the machine's is one of the two AVX-512 paths and
//    no path is pinned (cpu_path_pinned_by): the machine's path is chosen by
//    the products' peak rates (faster_avx512_path), which for DRAM-bound
//    shapes say little: on Zen 5 Mixtral's step ran 4-19% faster on the
//    16-lane FMAs than on vdpbf16ps, whose peak is twice as high. Each path
//    is timed with its own measured level and passes.
// Tests and comparisons pin them; results and `writescope info` say which
// was taken and why.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

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

/// The pass lengths measured, in tokens (at most the products' pass of 128
/// tokens).
inline constexpr std::array<int, 3> pass_lengths = {32, 64, 128};

/// What a measurement of one attention shape timed: one decode step of the
/// probe (one sequence of the shape over `kv_bytes` of KV from DRAM:
/// next_pass_probe_bytes) with each choice, alternated, on `path` with all
/// host threads, medians.
struct HostProbe {
  bool measured = false;  // false where the shape's products do not take the choice here (impl::honours_*)
  std::string path;       // cpu_path_name of the path measured (both, for the product path)
  std::string probe;      // the probe's shape and block order, e.g. "qwen3-30b-a3b (32 query / 4 KV heads), head-major"
  std::int64_t kv_bytes = 0;    // a step's KV
  std::int64_t pool_bytes = 0;  // the windows the steps take in turn (next_pass_probe_windows)
  int windows_read = 0;         // distinct windows the timed steps read
  int alternations = 0;
  std::vector<CpuPath> paths_run;  // per choice, the path its steps ran (the launch's record)
};

/// The measurement behind the next-pass level of one attention shape and its
/// head-major passes, taken together (head-major KV): with the next pass
/// requested into L1 and 32-token passes, a pass and the next fit L1, which
/// neither choice alone finds (Zen 5: Mixtral 10-25% ahead of either level at
/// 128 tokens).
struct NextPassPrefetchMeasurement : HostProbe {
  std::array<std::array<double, pass_lengths.size()>, 2> pass_ms{};  // per level (l1, l2), per length
  std::array<int, 2> pass_for{};  // per level: fastest_pass of its figures against 128 tokens
  double l1_ms = 0, l2_ms = 0;    // each level at its pass
  PrefetchLevel faster = PrefetchLevel::l1;
};

/// The probe's KV for a last-level cache of `last_level_cache_bytes`: twice
/// that, at least 64 MiB, at most 256 MiB (a VM may report its host's whole
/// L3: 508 MiB on a 2-vCPU Zen 5 VM, whose core shares 32 MiB; a 1 GiB probe
/// took 4 s).
std::int64_t next_pass_probe_bytes(std::int64_t last_level_cache_bytes);

/// Windows of `step_bytes` (next_pass_probe_bytes) that the probe's steps
/// read in turn: as many as fit in 512 MiB, at least 2, so that each step's KV
/// comes from DRAM. Over the same 64 MiB each time, part of it came back
/// from a 32 MiB L3 (Zen 5 VM, 2 threads: a plain read of 64 MiB over and
/// over ran at 75-80 GB/s, of 512 MiB at 43-45), which no decode of a long
/// context sees.
int next_pass_probe_windows(std::int64_t step_bytes);

/// l2 only where its step is at least 3% faster than l1's: L1 requests are
/// the ones measured on every machine, and a smaller difference is within
/// a shared machine's noise.
PrefetchLevel faster_prefetch_level(double l1_ms, double l2_ms);

/// Measures both levels, each with every pass length, on the active CPU path
/// for `shape` (its heads and dimensions) the first time that shape asks in
/// this process (about 0.2-0.6 s: the probe's allocation and first touch,
/// then 6 x 8 steps). Call it from a thread that runs host kernels (it
/// launches them); safe from several.
const NextPassPrefetchMeasurement& next_pass_prefetch_measurement(const AttentionShape& shape);

/// The level host decode attention of `shape` takes now: the pinned one
/// (set_next_pass_prefetch), else WRITESCOPE_NEXT_PASS_PREFETCH (an unknown
/// name is an error naming the variable), else the one measured faster for
/// the shape.
PrefetchLevel active_next_pass_prefetch(const AttentionShape& shape);
/// Pins the level for the process (every shape).
void set_next_pass_prefetch(PrefetchLevel level);
/// The tokens per pass host decode attention of `shape` takes over head-major
/// blocks now: WRITESCOPE_HEAD_MAJOR_PASS (32, 64 or 128; calibrate's
/// processes for other thread counts take the parent's), else the length
/// measured with the active level (pass_for); 0 where the products do not
/// request the next pass by level (impl::honours_next_pass_level).
int active_head_major_pass(const AttentionShape& shape);
/// One line for results and `writescope info`: the shape's level (and, where
/// measured, its head-major pass) and where they came from, e.g. "l1, passes
/// of 32 tokens (measured on avx512_bf16, qwen3-30b-a3b (32 query / 4 KV
/// heads), head-major, 256 MiB a step over 512 MiB, medians of 7: l1 at
/// 32/64/128 tokens 4.811 5.120 5.338 ms, l2 at 32/64/128 tokens 5.902 6.310
/// 7.067 ms)", "l1 (WRITESCOPE_NEXT_PASS_PREFETCH)".
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

/// "32", "64", "128" to a length of pass_lengths; throws
/// std::invalid_argument naming `what` ("unknown <what> '7'") and the valid ones.
int parse_pass_length(const std::string& tokens, const std::string& what);
/// parse_pass_length of a token-major pass.
int parse_token_major_pass(const std::string& tokens);

/// The measurement behind the token-major pass of one attention shape
/// (token-major KV), per length of pass_lengths.
struct TokenMajorPassMeasurement : HostProbe {
  std::array<double, pass_lengths.size()> ms{};  // per length
  int rule = 0;           // the products' own length for the shape (impl::token_major_pass_rule)
  int fastest = 0;        // fastest_pass; 0 where not measured
};

/// The length of pass_lengths whose median step (`ms`) is shortest, but the
/// rule's unless another is at least 3% faster than it (the noise of a shared
/// machine).
int fastest_pass(const std::array<double, pass_lengths.size()>& ms, int rule);

/// Measures every length on the active CPU path for `shape` the first time
/// that shape asks in this process (as next_pass_prefetch_measurement, about
/// 0.2-0.6 s); safe from several threads.
const TokenMajorPassMeasurement& token_major_pass_measurement(const AttentionShape& shape);

/// The tokens per pass host decode attention of `shape` takes over token-major
/// rows of several heads now: the pinned length (ScopedTokenMajorPass), else
/// WRITESCOPE_TOKEN_MAJOR_PASS (an unknown length is an error naming the
/// variable), else the measured one; 0 where the products keep their own rule
/// (impl::honours_token_major_pass is false for the shape here).
int active_token_major_pass(const AttentionShape& shape);
/// One line for results and `writescope info`, e.g. "32 tokens (measured on
/// avx512_bf16, qwen3-30b-a3b (32 query / 4 KV heads), token-major, 256 MiB
/// a step over 512 MiB, medians of 7: 32 tokens 5.791 ms, 64 tokens 6.334
/// ms, 128 tokens 6.147 ms; the rule's 64)", "not measured (<probe> on <path>
/// passes by its own rule)".
std::string describe_token_major_pass(const AttentionShape& shape);

/// Pins a token-major pass length for a scope (tests, comparisons), restoring
/// the previous pin (or none) after.
class ScopedTokenMajorPass {
 public:
  explicit ScopedTokenMajorPass(int tokens);
  ~ScopedTokenMajorPass();
  ScopedTokenMajorPass(const ScopedTokenMajorPass&) = delete;
  ScopedTokenMajorPass& operator=(const ScopedTokenMajorPass&) = delete;

 private:
  int previous_;
};

/// The measurement behind the product path of one attention shape and block
/// order: a step on each AVX-512 path, each with its own measured choices.
struct ProductPathMeasurement : HostProbe {
  double bf16_ms = 0, fma_ms = 0;          // avx512_bf16's and avx512_fma's step
  CpuPath machine = CpuPath::avx512_bf16;  // the machine's path (active_cpu_path)
  CpuPath faster = CpuPath::avx512_bf16;   // faster_product_path; the machine's where not measured
};

/// The other AVX-512 path than `machine` only where its step is at least 3%
/// faster (the noise of a shared machine).
CpuPath faster_product_path(CpuPath machine, double bf16_ms, double fma_ms);

/// Measures both AVX-512 paths for `shape` over blocks in `order` the first
/// time they are asked in this process (with their own levels and passes
/// first: about 0.5-1.5 s); measured only where the machine's path is one of
/// them and both products take the shape (impl::measures_product_path).
const ProductPathMeasurement& product_path_measurement(const AttentionShape& shape, BlockOrder order);

/// The CPU path host decode attention of `shape` over bf16 blocks in `order`
/// asks for (impl::host_product_path applies what its products take): the
/// pinned one (set_cpu_path, WRITESCOPE_CPU_PATH), else the machine's
/// active_cpu_path where it is not an AVX-512 path, else the one measured
/// faster for the shape and order.
CpuPath active_decode_cpu_path(const AttentionShape& shape, BlockOrder order);
/// The path the products of `shape` run over bf16 blocks in `order` now:
/// impl::host_product_path of active_decode_cpu_path (what a launch records
/// in DecodeWorkspace::host_path).
CpuPath decode_product_path(const AttentionShape& shape, BlockOrder order);
/// One line for results and `writescope info`, e.g. "avx512_fma (measured on
/// avx512_bf16 and avx512_fma, mixtral-8x7b (32 query / 8 KV heads),
/// head-major, 256 MiB a step over 512 MiB, medians of 7: avx512_bf16 5.911
/// ms, avx512_fma 5.502 ms; the machine's avx512_bf16)", "avx2
/// (WRITESCOPE_CPU_PATH)"; it names the path the products run, and the one
/// asked where they do not take the shape: "avx2 (avx512_bf16, the machine's
/// path, does not take tiny-qwen3-moe (4 query / 2 KV heads), head-major)".
std::string describe_decode_cpu_path(const AttentionShape& shape, BlockOrder order);
/// Both orders' for results: "head-major: <describe_decode_cpu_path>;
/// token-major: <describe_decode_cpu_path>".
std::string describe_decode_cpu_paths(const AttentionShape& shape);
/// What the products of `shape` take in this process, without the
/// measurements behind it: "head-major avx512_bf16, next pass into l2,
/// passes of 64 tokens; token-major avx512_bf16, passes of 32 tokens" (the
/// level and passes only where the products take them). Another process may
/// measure its way to other choices (4-30% apart): a setup of an experiment.
std::string host_attention_choices(const AttentionShape& shape);

namespace impl {
/// Makes `m` the shape's measurement on the path its head-major products take
/// (active_decode_cpu_path; tests: levels that
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

/// Makes `m` the shape's token-major measurement on the path its token-major
/// products take (tests).
void replace_token_major_pass_measurement(const AttentionShape& shape, const TokenMajorPassMeasurement& m);
/// Whether the products of `path` take a token-major pass length for `shape`:
/// the AVX-512 products of token rows shared by several KV heads (MLA's one
/// latent row, read by both products, keeps passes of 128 tokens; AMX passes
/// by its tiles).
bool honours_token_major_pass(CpuPath path, const AttentionShape& shape);
/// Makes `m` the product path measurement of `shape` in `order` for the
/// machine's path (tests).
void replace_product_path_measurement(const AttentionShape& shape, BlockOrder order, const ProductPathMeasurement& m);
/// The probes' pools of KV filled in this process so far (tests: a product
/// path measurement fills one for all of its probes).
int probe_pools_filled();
/// Whether the product path is measured on a machine whose path is
/// `machine`: one of the two AVX-512 paths (AMX machines keep their tiles).
bool measures_product_path(CpuPath machine);
/// The products' own length where none is measured or pinned: 128 tokens,
/// halved down to 32 while a pass's keys and values exceed 128 KiB (Zen 4).
///   token_bytes: the keys and values of one token row, all of its heads
constexpr int token_major_pass_rule(std::int64_t token_bytes) {
  constexpr std::int64_t max_pass_bytes = 128 << 10;
  int tokens = pass_lengths.back();
  while (tokens > pass_lengths.front() && tokens * token_bytes > max_pass_bytes) tokens /= 2;
  return tokens;
}
}  // namespace impl

}  // namespace writescope
