#include "experiments/calibration.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "attention/decode.hpp"
#include "attention/host_prefetch.hpp"
#include "framework/impl/product_peaks.hpp"
#include "framework/impl/read_words.hpp"
#include "framework/concurrent.hpp"
#include "framework/host_memory.hpp"
#include "moe/experts.hpp"
#include "framework/cpu_path.hpp"
#include "framework/launch.hpp"
#include "framework/machine.hpp"
#include "framework/simd.hpp"
#include "framework/timer.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace writescope {
namespace {

/// Elements per work item: long enough for a vectorised inner loop.
constexpr std::int64_t chunk = 1 << 15;
constexpr int repetitions = 5;

/// Keeps a result alive so the measured work cannot be optimised away.
template <class T>
void keep(const T& value) {
  volatile T sink = value;
  (void)sink;
}

std::int64_t chunks_of(const HostWords& words) {
  return (static_cast<std::int64_t>(words.extent(0)) + chunk - 1) / chunk;
}

struct FillChunks {
  HostWords words;
  void operator()(std::int64_t c) const {
    const std::int64_t end = std::min<std::int64_t>((c + 1) * chunk, words.extent(0));
    for (std::int64_t i = c * chunk; i < end; ++i) words(i) = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  }
};

/// Integer sum of each chunk, read with the CPU's widest loads
/// (impl::sum_words says why).
struct SumChunks {
  HostWords words;
  int load_bytes;
  void operator()(std::int64_t c, std::uint64_t& sum) const {
    const std::int64_t end = std::min<std::int64_t>((c + 1) * chunk, words.extent(0));
    sum += impl::sum_words(words.data() + c * chunk, end - c * chunk, load_bytes);
  }
};

struct CopyChunks {
  HostWords destination, source;
  void operator()(std::int64_t c) const {
    const std::int64_t end = std::min<std::int64_t>((c + 1) * chunk, source.extent(0));
    const std::uint64_t* from = source.data();
    std::uint64_t* to = destination.data();
    for (std::int64_t i = c * chunk; i < end; ++i) to[i] = from[i];
  }
};

/// Best rate (units per second / 10^9) of `repetitions` fenced runs of `work` doing `units`.
template <class ExecSpace, class Work>
double best_rate(const ExecSpace& space, double units, Work&& work) {
  double best = 0;
  for (int r = 0; r < repetitions; ++r) best = std::max(best, units / time_fenced(space, work) / 1e9);
  return best;
}

}  // namespace

HostWords first_touched(const std::string& label, std::int64_t bytes) {
  HostWords words(Kokkos::view_alloc(label, Kokkos::WithoutInitializing),
                  static_cast<std::size_t>(bytes) / sizeof(std::uint64_t));
  // Paged as the KV pools and weights the bounds are compared with.
  advise_huge_pages(words);
  launch_parallel_for("writescope::experiments::first_touch", Kokkos::RangePolicy<HostExecSpace>(0, chunks_of(words)),
                       FillChunks{words});
  Kokkos::fence();
  return words;
}

std::uint64_t read_words(const HostExecSpace& space, const HostWords& words) {
  std::uint64_t sum = 0;
  Kokkos::parallel_reduce("writescope::experiments::host_read",
                          Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(words)),
                          SumChunks{words, impl::widest_load_bytes()}, sum);
  return sum;
}

void copy_words(const HostExecSpace& space, const HostWords& destination, const HostWords& source) {
  launch_parallel_for("writescope::experiments::host_copy",
                       Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(source)),
                       CopyChunks{destination, source});
}

double measure_host_dram_read_gbps(std::int64_t bytes) {
  const HostWords words = first_touched("writescope::experiments::dram_read", bytes);
  std::uint64_t sum = 0;
  const double best = best_rate(HostExecSpace(), static_cast<double>(bytes),
                                [&](const HostExecSpace& space) { sum += read_words(space, words); });
  keep(sum);
  return best;
}

namespace {

constexpr int fma_chains = impl::peak_chains;
constexpr std::int64_t fma_iterations = 20'000'000;

#if defined(__AVX2__) && defined(__FMA__)
/// Per thread: iterations x fma_chains vector FMAs kept in registers.
struct FmaChains {
  float seed;
  std::int64_t iterations;
  void operator()(int, float& sink) const {
    __m256 acc[fma_chains];
    for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_set1_ps(seed + c);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (std::int64_t i = 0; i < iterations; ++i)
      for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float total = 0;
    for (int c = 0; c < fma_chains; ++c) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[c]);
      for (float lane : lanes) total += lane;
    }
    sink += total;
  }
};
#endif

/// Per thread, scalar: iterations / 8 x fma_chains dependent scalar FMAs.
struct ScalarFmaChains {
  float seed;
  std::int64_t iterations;
  void operator()(int, float& sink) const {
    float acc[fma_chains];
    for (int c = 0; c < fma_chains; ++c) acc[c] = seed + c;
    for (std::int64_t i = 0; i < iterations / 8; ++i)
      for (int c = 0; c < fma_chains; ++c) acc[c] = std::fma(acc[c], 0.999999f, 1e-7f);
    for (float a : acc) sink += a;
  }
};

#ifdef WRITESCOPE_HOST_AVX512_BF16
/// Per thread: iterations x impl::avx512_peak_chains vdpbf16ps (32 multiply-adds each).
struct Bf16DotChains {
  float seed;
  std::int64_t iterations;
  void operator()(int, float& sink) const { sink += impl::bf16_dot_chains(seed, iterations); }
};
/// Per thread: iterations x impl::avx512_peak_chains 16-lane fp32 FMAs (AVX-512F).
struct Fma16Chains {
  float seed;
  std::int64_t iterations;
  void operator()(int, float& sink) const { sink += impl::fp32_fma16_chains(seed, iterations); }
};
/// Per thread: iterations x tile_chains tdpbf16ps (amx_bf16).
struct TileDotChains {
  float seed;
  std::int64_t iterations;
  void operator()(int, float& sink) const { sink += impl::amx_tile_chains(seed, iterations); }
};
#endif

/// One fenced run of `chains` on every host thread: seconds.
template <class Chains>
double chains_seconds(const HostExecSpace& space, Chains chains) {
  const int threads = space.concurrency();
  return time_fenced(space, [&](const HostExecSpace& s) {
    float sum = 0;
    Kokkos::parallel_reduce("writescope::experiments::product_peak", Kokkos::RangePolicy<HostExecSpace>(s, 0, threads),
                            chains, sum);
    keep(sum);
  });
}

/// Multiply-adds (all threads) and seconds of one run of `iterations` steps of
/// the product chains of CPU path `path` on every host thread.
struct ProductRun {
  double multiply_adds = 0, seconds = 0;
};
ProductRun run_product_chains(CpuPath path, std::int64_t iterations) {
  const HostExecSpace space;
  const double steps = static_cast<double>(space.concurrency()) * static_cast<double>(iterations) * fma_chains;
  const double avx512_steps = steps / fma_chains * impl::avx512_peak_chains;
  switch (path) {
    case CpuPath::amx_bf16:
#ifdef WRITESCOPE_HOST_AVX512_BF16
    {
      // A tdpbf16ps issues about every 16 cycles: a sixteenth of the steps
      // takes about as long as the vector chains.
      const std::int64_t tile_iterations = std::max<std::int64_t>(1, iterations * fma_chains / impl::tile_chains / 16);
      const double tile_steps = static_cast<double>(space.concurrency()) * tile_iterations * impl::tile_chains;
      return {tile_steps * impl::tile_dot_multiply_adds,
              chains_seconds(space, TileDotChains{1.0f, tile_iterations})};
    }
#else
      break;
#endif
    case CpuPath::avx512_bf16:
#ifdef WRITESCOPE_HOST_AVX512_BF16
      return {avx512_steps * 32, chains_seconds(space, Bf16DotChains{1.0f, iterations})};
#else
      break;
#endif
    case CpuPath::avx512_fma:
#ifdef WRITESCOPE_HOST_AVX512_BF16
      return {avx512_steps * 16, chains_seconds(space, Fma16Chains{1.0f, iterations})};
#else
      break;
#endif
    case CpuPath::avx2:
#if defined(__AVX2__) && defined(__FMA__)
      return {steps * 8, chains_seconds(space, FmaChains{1.0f, iterations})};
#else
      break;
#endif
    case CpuPath::scalar:
      return {steps / 8, chains_seconds(space, ScalarFmaChains{1.0f, iterations})};
  }
  throw std::invalid_argument(std::string("host product chains: CPU path '") + cpu_path_name(path) +
                              "' is not compiled in");
}

/// Best rate (10^9 multiply-adds per second) of `repetitions` runs of path's chains.
double best_product_gmacs(CpuPath path) {
  double best = 0;
  for (int r = 0; r < repetitions; ++r) {
    const ProductRun run = run_product_chains(path, fma_iterations);
    best = std::max(best, run.multiply_adds / run.seconds / 1e9);
  }
  return best;
}

}  // namespace

CpuPath fp32_fma_path(CpuPath path) { return path >= CpuPath::avx512_fma ? CpuPath::avx512_fma : path; }

CpuPath linear_product_path(CpuPath path) { return path == CpuPath::amx_bf16 ? path : fp32_fma_path(path); }

double measure_host_fp32_fma_gmacs(CpuPath path) { return best_product_gmacs(fp32_fma_path(path)); }

double measure_host_product_gmacs(CpuPath path) { return best_product_gmacs(path); }

std::int64_t l2_slice_bytes() {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const std::int64_t bytes = l2 > 0 ? l2 : std::int64_t{1} << 20;
  return std::max<std::int64_t>(64, bytes / 2 / 64 * 64);
}

namespace {

/// Thread t's slice of `slices` (RangePolicy(0, threads), static: thread t
/// takes item t): first touched by FillSlice, read `passes` times by ReadSlice.
struct FillSlice {
  HostWords slices;
  std::int64_t slice_words;
  void operator()(int t) const {
    for (std::int64_t i = t * slice_words; i < (t + 1) * slice_words; ++i) slices(i) = static_cast<std::uint64_t>(i);
  }
};
struct ReadSlice {
  HostWords slices;
  std::int64_t slice_words;
  int passes, load_bytes;
  void operator()(int t, std::uint64_t& sum) const {
    for (int p = 0; p < passes; ++p) sum += impl::sum_words(slices.data() + t * slice_words, slice_words, load_bytes);
  }
};

}  // namespace

HostProductSampler::HostProductSampler(CpuPath path) : path_(path) {
  run_product_chains(path_, 1);  // fails here, not in sample(), for a path not compiled in
  const HostExecSpace space;
  const std::int64_t slice_words = l2_slice_bytes() / static_cast<std::int64_t>(sizeof(std::uint64_t));
  l2_slices_ = HostWords(Kokkos::view_alloc("writescope::experiments::sampled_l2_read", Kokkos::WithoutInitializing),
                         static_cast<std::size_t>(space.concurrency() * slice_words));
  launch_parallel_for("writescope::experiments::first_touch_l2",
                      Kokkos::RangePolicy<HostExecSpace>(space, 0, space.concurrency()),
                      FillSlice{l2_slices_, slice_words});
  space.fence();
}

void HostProductSampler::sample() {
  const ProductRun run = run_product_chains(path_, product_iterations);
  multiply_adds_.add(run.multiply_adds, run.seconds);
  const HostExecSpace space;
  const std::int64_t slice_words = static_cast<std::int64_t>(l2_slices_.extent(0)) / space.concurrency();
  std::uint64_t sum = 0;
  const double seconds = time_fenced(space, [&](const HostExecSpace& s) {
    Kokkos::parallel_reduce("writescope::experiments::l2_read", Kokkos::RangePolicy<HostExecSpace>(s, 0, s.concurrency()),
                            ReadSlice{l2_slices_, slice_words, l2_passes, impl::widest_load_bytes()}, sum);
  });
  keep(sum);
  const double bytes = static_cast<double>(l2_slices_.extent(0)) * sizeof(std::uint64_t) * l2_passes;
  l2_bytes_.add(bytes, seconds);
  fastest_l2_read_gbps_ = std::max(fastest_l2_read_gbps_, bytes / seconds / 1e9);
  ++samples_;
}

double HostProductSampler::product_gmacs() const { return multiply_adds_.per_second() / 1e9; }

HostRateSampler::HostRateSampler(CpuPath path, std::int64_t buffer_bytes, std::int64_t slice_bytes)
    : products_(path), slice_words_(slice_bytes / static_cast<std::int64_t>(sizeof(std::uint64_t))) {
  if (slice_bytes <= 0 || slice_bytes % static_cast<std::int64_t>(sizeof(std::uint64_t)) != 0)
    throw std::invalid_argument("HostRateSampler: slice_bytes (" + std::to_string(slice_bytes) +
                                ") must be a positive multiple of 8");
  if (buffer_bytes < 2 * slice_bytes)
    throw std::invalid_argument("HostRateSampler: buffer_bytes (" + std::to_string(buffer_bytes) +
                                ") must hold at least two slices of " + std::to_string(slice_bytes) +
                                " bytes, so that a slice is not read again while still cached");
  words_ = first_touched("writescope::experiments::sampled_dram_read", buffer_bytes);
}

void HostRateSampler::sample() {
  const HostExecSpace space;
  const std::int64_t slices = static_cast<std::int64_t>(words_.extent(0)) / slice_words_;
  const std::int64_t first = next_slice_ * slice_words_;
  next_slice_ = (next_slice_ + 1) % slices;
  const HostWords slice = Kokkos::subview(words_, Kokkos::make_pair(first, first + slice_words_));
  std::uint64_t sum = 0;
  const double read_seconds = time_fenced(space, [&](const HostExecSpace& s) { sum = read_words(s, slice); });
  keep(sum);
  read_bytes_.add(static_cast<double>(slice_words_) * sizeof(std::uint64_t), read_seconds);
  products_.sample();
}

double HostRateSampler::dram_read_gbps() const { return read_bytes_.per_second() / 1e9; }

namespace {

/// A small host kernel: one store per element.
struct SmallHostWork {
  Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> rows;
  void operator()(int row, int column) const { rows(row, column) = static_cast<float>(row + column); }
};

constexpr std::int64_t fill_chunk = 4096;

}  // namespace

double measure_host_launch_latency_s() {
  // The model's small kernels (norms, residuals, gathers of a few rows) are
  // two-dimensional launches each waited for (impl::rows_by_columns, the
  // element-wise kernels' range): the median of such a kernel over a few
  // rows, not the best case of an empty one.
  const HostExecSpace space;
  const Kokkos::View<float**, Kokkos::LayoutRight, HostMemSpace> rows("writescope::experiments::rows", 4, 64);
  std::vector<double> seconds;
  for (int r = 0; r < 201; ++r)
    seconds.push_back(time_fenced(space, [&](const HostExecSpace& s) {
      launch_parallel_for("writescope::experiments::small",
                           impl::rows_by_columns(s, 4, 64), SmallHostWork{rows});
    }));
  std::nth_element(seconds.begin(), seconds.begin() + 100, seconds.end());
  return seconds[100];
}

ExpertKernelRates measure_cpu_expert_rates() {
  // Qwen3-30B-A3B's expert shape, rotating over experts whose weights
  // (32 x 9.4 MB) exceed any last-level cache: the bf16 SwiGLU kernels the
  // systems' CPU experts run, from DRAM. Weight-bound: a decode token's 8
  // experts in one batch, as the model runs a step's CPU experts
  // (ExpertRunner::add over many); compute-bound: one expert at 64 tokens.
  constexpr int hidden = 2048, intermediate = 768, experts = 32, many_rows = 64;
  using Weights = Kokkos::View<bf16**, Kokkos::LayoutRight, HostMemSpace>;
  std::vector<ExpertWeights<bf16, HostMemSpace>> store;
  for (int e = 0; e < experts; ++e) {
    Weights gate("writescope::experiments::expert_gate", intermediate, hidden),
        up("writescope::experiments::expert_up", intermediate, hidden),
        down("writescope::experiments::expert_down", hidden, intermediate);
    Kokkos::deep_copy(gate, from_float<bf16>(0.01f));
    Kokkos::deep_copy(up, from_float<bf16>(0.02f));
    Kokkos::deep_copy(down, from_float<bf16>(0.03f));
    store.push_back({gate, up, down});
  }
  SwigluScratch<HostMemSpace> scratch;
  const double weights = 3.0 * hidden * intermediate;
  auto many_rows_rate = [&] {
    Matrix<HostMemSpace> x("writescope::experiments::expert_x", many_rows, hidden),
        y("writescope::experiments::expert_y", many_rows, hidden);
    Kokkos::deep_copy(x, 1.0f);
    int next = 0;
    return best_rate(HostExecSpace(), 2.0 * weights * many_rows, [&](const HostExecSpace& space) {
      swiglu_expert<HostExecSpace, bf16>(space, store[next], x, y, scratch);
      next = (next + 1) % experts;
    });
  };
  auto decode_step_rate = [&] {
    constexpr int per_token = 8;
    Matrix<HostMemSpace> x("writescope::experiments::expert_x", 1, hidden),
        y("writescope::experiments::expert_y", 1, hidden);
    Kokkos::deep_copy(x, 1.0f);
    Routing routing;
    routing.rows.assign(per_token, {0});
    routing.weights.assign(per_token, {1.0f / per_token});
    ExpertRunner<HostExecSpace, bf16> runner;
    runner.upload(HostExecSpace(), routing);
    const std::vector<int> chosen = routing.active();
    std::vector<ExpertWeights<bf16, HostMemSpace>> batch(per_token);
    int next = 0;
    return best_rate(HostExecSpace(), per_token * weights * sizeof(bf16), [&](const HostExecSpace& space) {
      for (auto& expert : batch) expert = store[next++ % experts];
      runner.add(space, chosen, batch, x, y);
    });
  };
  return {decode_step_rate(), many_rows_rate()};
}

std::unique_ptr<InplaceKVCache<bf16>> filled_cache(const AttentionShape& shape, Region region, std::int64_t tokens) {
  const BlockGeometry g = shape.block_geometry(calibration_block_tokens);
  const std::int64_t blocks = (tokens + calibration_block_tokens - 1) / calibration_block_tokens;
  const std::uint64_t bytes = static_cast<std::uint64_t>(blocks * g.block_elements()) * sizeof(bf16);
  KVCacheBudgets budgets;
  if (region == Region::gpu_resident) budgets.vram_bytes = bytes;
  else if (region == Region::cpu_resident) budgets.host_bytes = bytes;
  else budgets.pinned_bytes = bytes;
  auto cache = std::make_unique<InplaceKVCache<bf16>>(KVCacheShape{1, g}, budgets, BudgetPolicy::strict);
  const int sequence = cache->add_sequence();
  using Tokens = Kokkos::View<bf16***, Kokkos::LayoutRight, HostMemSpace>;
  Tokens keys("writescope::experiments::keys", fill_chunk, g.kv_heads, g.key_dim);
  Tokens values("writescope::experiments::values", fill_chunk, g.kv_heads, g.value_dim);
  std::mt19937 engine(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < keys.size(); ++i) keys.data()[i] = from_float<bf16>(normal(engine));
  for (std::size_t i = 0; i < values.size(); ++i) values.data()[i] = from_float<bf16>(normal(engine));
  for (std::int64_t written = 0; written < tokens; written += fill_chunk) {
    const std::int64_t count = std::min(fill_chunk, tokens - written);
    const auto range = std::make_pair(std::int64_t{0}, count);
    const std::vector<Region> regions(cache->new_blocks_needed(0, sequence, count), region);
    cache->append<HostExecSpace, HostMemSpace>(HostExecSpace(), 0, sequence,
                                               Kokkos::subview(keys, range, Kokkos::ALL, Kokkos::ALL),
                                               Kokkos::subview(values, range, Kokkos::ALL, Kokkos::ALL), regions);
  }
  return cache;
}

namespace {

double decode_kv_bytes(const AttentionShape& shape, std::int64_t tokens) {
  return static_cast<double>(tokens) * static_cast<double>(shape.kv_bytes_per_token(sizeof(bf16)));
}

}  // namespace

namespace {

/// rotated_caches' copies of `tokens` tokens of `shape`.
int rotated_copies(const AttentionShape& shape, std::int64_t tokens) {
  constexpr double rotated_bytes = 512.0 * (1 << 20);
  // At most 64 copies: short sequences (a quick calibration) stay quick and still exceed the LLC.
  return std::min(64, static_cast<int>(std::ceil(rotated_bytes / decode_kv_bytes(shape, tokens))));
}

}  // namespace

std::uint64_t rotated_cache_bytes(std::int64_t tokens) {
  double most = 0;
  for (const AttentionShape& shape : supported_attention_shapes())
    most = std::max(most, rotated_copies(shape, tokens) * decode_kv_bytes(shape, tokens));
  return static_cast<std::uint64_t>(most);
}

RotatedCaches rotated_caches(const AttentionShape& shape, Region region, std::int64_t tokens) {
  if (tokens < 1)
    throw std::invalid_argument("rotated_caches: tokens must be positive, got " + std::to_string(tokens));
  const int copies = rotated_copies(shape, tokens);
  RotatedCaches rotated;
  for (int c = 0; c < copies; ++c) {
    rotated.caches.push_back(filled_cache(shape, region, tokens));
    rotated.segments.push_back(rotated.caches.back()->segments(0, region, {0}, {TokenRange{0, tokens}}));
  }
  return rotated;
}

namespace {

/// Decode attention of one query over `tokens` tokens, all in `region` of a
/// one-layer cache, read by ExecSpace from `pool` (in PoolSpace) in `order`:
/// KV bytes per second, best of five.
template <class ExecSpace, class PoolSpace, class PoolOf>
double measure_decode_gbps(const AttentionShape& shape, std::int64_t tokens, Region region, BlockOrder order,
                           PoolOf pool_of) {
  using MemSpace = typename ExecSpace::memory_space;
  // Copies rotated past the last-level cache: the rate of KV read from
  // DRAM, as a long context's decode step reads it.
  const RotatedCaches rotated = rotated_caches(shape, region, tokens);
  Kokkos::View<float***, Kokkos::LayoutRight, MemSpace> queries("writescope::experiments::queries", 1, shape.q_heads,
                                                                shape.key_dim);
  Kokkos::deep_copy(queries, 0.05f);
  PartialState<MemSpace> out("writescope::experiments::out", 1, shape.q_heads, shape.value_dim);
  DecodeWorkspace<MemSpace> workspace;
  int next = 0;
  auto run = [&](const ExecSpace& space) {
    const InplaceKVCache<bf16>& cache = *rotated.caches[next];
    decode_attention<ExecSpace, bf16, PoolSpace>(space, shape, cache.geometry(), order, queries, (cache.*pool_of)(),
                                                 rotated.segments[next], workspace, out);
    next = (next + 1) % rotated.copies();
  };
  run(ExecSpace());
  return best_rate(ExecSpace(), decode_kv_bytes(shape, tokens), run);
}

}  // namespace

double measure_cpu_attention_gbps(const AttentionShape& shape, BlockOrder order, std::int64_t tokens) {
  if (order == BlockOrder::head_major)
    return measure_decode_gbps<HostExecSpace, HostMemSpace>(shape, tokens, Region::cpu_resident, order,
                                                            &InplaceKVCache<bf16>::host_pool);
  return measure_decode_gbps<HostExecSpace, PinnedMemSpace>(shape, tokens, Region::cpu_streamed, order,
                                                            &InplaceKVCache<bf16>::pinned_pool);
}

std::string cpu_attention_child_command(const std::string& executable, const AttentionShape& shape,
                                        BlockOrder order, int threads, std::int64_t tokens) {
  const bool head_major = order == BlockOrder::head_major;
  std::ostringstream command;
  // KOKKOS_NUM_THREADS as well: where the parent's environment sets it, Kokkos takes it over OMP_NUM_THREADS.
  command << "KOKKOS_NUM_THREADS=" << threads << " OMP_NUM_THREADS=" << threads << " OMP_PROC_BIND=spread OMP_PLACES=threads WRITESCOPE_CPU_PATH="
          << cpu_path_name(active_decode_cpu_path(shape, order))
          << " WRITESCOPE_NEXT_PASS_PREFETCH=" << prefetch_level_name(active_next_pass_prefetch(shape));
  const int pass = head_major ? active_head_major_pass(shape) : active_token_major_pass(shape);
  if (pass > 0) command << (head_major ? " WRITESCOPE_HEAD_MAJOR_PASS=" : " WRITESCOPE_TOKEN_MAJOR_PASS=") << pass;
  command << " '" << executable << "' calibrate-attention --shape " << shape.name << " --order "
          << (head_major ? "head-major" : "token-major") << " --tokens " << tokens << " --thread-count " << threads;
  return command.str();
}

double measure_gpu_attention_gbps(const AttentionShape& shape, std::int64_t tokens) {
  return measure_decode_gbps<GpuExecSpace, GpuMemSpace>(shape, tokens, Region::gpu_resident, BlockOrder::token_major,
                                                        &InplaceKVCache<bf16>::vram_pool);
}

namespace {

/// How a child ended, from pclose's wait status.
std::string exit_description(int status) {
  if (status == -1) return "its status is unknown";
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

/// Runs cpu_attention_child_command and reads the rate it prints last.
double attention_in_child(const std::string& executable, const AttentionShape& shape, BlockOrder order, int threads,
                          std::int64_t tokens) {
  const std::string command = cpu_attention_child_command(executable, shape, order, threads, tokens) + " 2>&1";
  std::FILE* pipe = nullptr;
  with_startup_affinity([&] { pipe = popen(command.c_str(), "r"); });
  if (pipe == nullptr) throw std::runtime_error("calibrate: cannot start '" + command + "'");
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  std::string last = output;
  while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
  last = last.substr(last.find_last_of('\n') == std::string::npos ? 0 : last.find_last_of('\n') + 1);
  try {
    if (status == 0) return std::stod(last);
  } catch (const std::exception&) {
  }
  throw std::runtime_error("calibrate: '" + command + "' failed (" +
                           (status == 0 ? std::string("no rate printed last") : exit_description(status)) +
                           "): " + output);
}

}  // namespace

MachineProfile calibrate_machine(const CalibrationOptions& options, void (*progress)(const std::string&)) {
  MachineProfile p;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  p.name = options.name.empty() ? std::string(host) : options.name;
  p.has_gpu = has_gpu;
  // How, so that a quick calibration (few --tokens: partly from cache) is told from a full one.
  char date[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &utc);
  const std::string how = "measured by writescope calibrate on " + std::string(host) + " (build " + git_revision() +
                          ", " + date + ", CPU attention over " + std::to_string(options.attention_tokens) +
                          " tokens)";
  for (const char* section : {"gpu", "link", "cpu"})
    if (has_gpu || std::string(section) == "cpu") p.sources[section] = how;
  const HostExecSpace space;
  p.cpu_threads = space.concurrency();
  auto step = [&](const std::string& what, double& field, auto measure) {
    progress(what + " ...");
    field = measure();
  };
  step("host DRAM read bandwidth", p.cpu_dram_read_gbps, [] { return measure_host_dram_read_gbps(); });
  p.cpu_path = cpu_path_name(active_cpu_path());
  step("host product throughput (" + p.cpu_path + ")", p.cpu_fma_glanes,
       [] { return measure_host_product_gmacs(active_cpu_path()); });
  step("host launch latency", p.cpu_launch_latency_s, [] { return measure_host_launch_latency_s(); });
  ExpertKernelRates expert;
  step("CPU bf16 expert kernel", p.cpu_expert_gbps, [&] { return (expert = measure_cpu_expert_rates()).gbps; });
  p.cpu_expert_gflops = expert.gflops;
  std::vector<int> threads = options.thread_counts;
  if (threads.empty()) {
    for (int t = 1; t < p.cpu_threads; t *= 2) threads.push_back(t);
    threads.push_back(p.cpu_threads);
  } else if (std::find(threads.begin(), threads.end(), p.cpu_threads) == threads.end()) {
    // The systems price the CPU at the profile's own thread count: without a rate
    // at it, every plan would take the rate of another count.
    progress("--thread-counts leaves out this process's " + std::to_string(p.cpu_threads) +
             " threads, at which the profile's rates are used: measuring those too");
    threads.push_back(p.cpu_threads);
  }
  for (const AttentionShape& shape : supported_attention_shapes()) {
    // This process's path and level for the shape (measured per shape), which its rates at all threads use.
    progress("product path of the decode over head-major blocks, " + shape.name + " ...");
    p.cpu_decode_path[shape.name] = cpu_path_name(decode_product_path(shape, BlockOrder::head_major));
    progress("product path of the decode over token-major blocks, " + shape.name + " ...");
    p.cpu_streamed_decode_path[shape.name] = cpu_path_name(decode_product_path(shape, BlockOrder::token_major));
    progress("next-pass prefetch level of the decode products, " + shape.name + " ...");
    p.cpu_next_pass_prefetch[shape.name] = prefetch_level_name(active_next_pass_prefetch(shape));
    if (const int tokens = active_head_major_pass(shape); tokens > 0)
      p.cpu_head_major_pass[shape.name] = std::to_string(tokens);
    progress("token-major pass of the decode products, " + shape.name + " ...");
    if (const int tokens = active_token_major_pass(shape); tokens > 0)
      p.cpu_token_major_pass[shape.name] = std::to_string(tokens);
    // CpuResident's head-major blocks and the band's token-major ones: a step reads both.
    for (const auto& [order, rates, where] :
         {std::tuple{BlockOrder::head_major, &p.cpu_attention_gbps, "CpuResident"},
          std::tuple{BlockOrder::token_major, &p.cpu_streamed_attention_gbps, "the pinned band"}})
      for (int t : threads) {
        progress("CPU attention over " + std::string(where) + ", " + shape.name + ", " + std::to_string(t) +
                 " threads ...");
        (*rates)[shape.name][t] =
            t == p.cpu_threads ? measure_cpu_attention_gbps(shape, order, options.attention_tokens)
                               : attention_in_child(options.executable, shape, order, t, options.attention_tokens);
      }
  }
#ifdef KOKKOS_ENABLE_CUDA
  constexpr std::int64_t copy_bytes = std::int64_t{256} << 20;
  step("HBM bandwidth", p.hbm_gbps, [] { return measure_copy_gbps<GpuMemSpace, GpuMemSpace>(copy_bytes, 2.0); });
  step("pinned H2D", p.pinned_h2d_gbps, [] { return measure_copy_gbps<GpuMemSpace, PinnedMemSpace>(copy_bytes); });
  step("pinned D2H", p.pinned_d2h_gbps, [] { return measure_copy_gbps<PinnedMemSpace, GpuMemSpace>(copy_bytes); });
  step("pageable H2D", p.pageable_h2d_gbps, [] { return measure_copy_gbps<GpuMemSpace, HostMemSpace>(copy_bytes); });
  step("pageable D2H", p.pageable_d2h_gbps, [] { return measure_copy_gbps<HostMemSpace, GpuMemSpace>(copy_bytes); });
  step("link latency", p.link_latency_s, [] { return measure_copy_latency_s<GpuMemSpace, PinnedMemSpace>(); });
  p.gpu_memory_bytes = static_cast<std::uint64_t>(MachineDescription::detect().gpu_memory_bytes);
  for (const AttentionShape& shape : supported_attention_shapes())
    step("GPU attention over VRAM-resident KV, " + shape.name, p.gpu_attention_gbps[shape.name],
         [&] { return measure_gpu_attention_gbps(shape, options.attention_tokens * 8); });
  {
    // Streaming chunks: the smallest single pinned copy at 90% of the link.
    progress("streaming chunk size ...");
    std::vector<std::uint64_t> sizes;
    std::vector<double> rates;
    for (std::uint64_t bytes = std::uint64_t{256} << 10; bytes <= (std::uint64_t{64} << 20); bytes *= 2) {
      sizes.push_back(bytes);
      rates.push_back(measure_copy_gbps<GpuMemSpace, PinnedMemSpace>(static_cast<std::int64_t>(bytes)));
    }
    p.link_chunk_bytes = smallest_size_reaching(sizes, rates, p.pinned_h2d_gbps, 0.9);
  }
  step("GPU launch latency", p.gpu_launch_latency_s, [] { return measure_gpu_launch_latency_s(); });
#endif
  return p;
}

std::uint64_t smallest_size_reaching(const std::vector<std::uint64_t>& sizes, const std::vector<double>& gbps,
                                     double bound_gbps, double fraction) {
  if (sizes.empty() || sizes.size() != gbps.size())
    throw std::invalid_argument("smallest_size_reaching: one rate per size, at least one");
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (gbps[i] >= fraction * bound_gbps) return sizes[i];
  return sizes.back();
}

#ifdef KOKKOS_ENABLE_CUDA
template <class Destination, class Source>
double measure_copy_gbps(std::int64_t bytes, double bytes_factor) {
  Kokkos::View<std::uint8_t*, Source> source("writescope::experiments::copy_source", bytes);
  Kokkos::View<std::uint8_t*, Destination> destination("writescope::experiments::copy_destination", bytes);
  return best_rate(GpuExecSpace(), bytes_factor * static_cast<double>(bytes),
                   [&](const GpuExecSpace& space) { Kokkos::deep_copy(space, destination, source); });
}

template double measure_copy_gbps<GpuMemSpace, PinnedMemSpace>(std::int64_t, double);
template double measure_copy_gbps<PinnedMemSpace, GpuMemSpace>(std::int64_t, double);
template double measure_copy_gbps<GpuMemSpace, HostMemSpace>(std::int64_t, double);
template double measure_copy_gbps<HostMemSpace, GpuMemSpace>(std::int64_t, double);
template double measure_copy_gbps<GpuMemSpace, GpuMemSpace>(std::int64_t, double);

template <class Destination, class Source>
double measure_copy_latency_s() {
  Kokkos::View<std::uint8_t*, Source> source("writescope::experiments::latency_source", 4);
  Kokkos::View<std::uint8_t*, Destination> destination("writescope::experiments::latency_destination", 4);
  double best = 1e9;
  for (int r = 0; r < 50; ++r)
    best = std::min(best, time_fenced(GpuExecSpace(), [&](const GpuExecSpace& space) {
                      Kokkos::deep_copy(space, destination, source);
                    }));
  return best;
}
template double measure_copy_latency_s<GpuMemSpace, PinnedMemSpace>();

namespace {
struct EmptyDeviceWork {
  KOKKOS_INLINE_FUNCTION void operator()(int) const {}
};
}  // namespace

double measure_gpu_launch_latency_s() {
  double best = 1e9;
  for (int r = 0; r < 200; ++r)
    best = std::min(best, time_fenced(GpuExecSpace(), [](const GpuExecSpace& space) {
                      launch_parallel_for("writescope::experiments::empty_kernel",
                                           Kokkos::RangePolicy<GpuExecSpace>(space, 0, 1), EmptyDeviceWork{});
                    }));
  return best;
}
#endif

}  // namespace writescope
