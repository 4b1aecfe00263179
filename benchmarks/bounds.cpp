#include "bounds.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>


#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace writescope::bench {
namespace {

/// Elements per work item: long enough for a vectorised inner loop.
constexpr std::int64_t chunk = 1 << 15;
constexpr std::int64_t bound_bytes = std::int64_t{1} << 30;
constexpr int bound_repetitions = 5;

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

/// Integer sum of each chunk: associative, so the compiler vectorises it.
struct SumChunks {
  HostWords words;
  void operator()(std::int64_t c, std::uint64_t& sum) const {
    const std::int64_t end = std::min<std::int64_t>((c + 1) * chunk, words.extent(0));
    const std::uint64_t* data = words.data();
    std::uint64_t local = 0;
    for (std::int64_t i = c * chunk; i < end; ++i) local += data[i];
    sum += local;
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

/// Best GB/s of `repetitions` fenced runs of `work` moving `bytes`.
template <class ExecSpace, class Work>
double best_gbps(const ExecSpace& space, double bytes, Work&& work) {
  double best = 0;
  for (int r = 0; r < bound_repetitions; ++r) best = std::max(best, bytes / time_fenced(space, work) / 1e9);
  return best;
}

}  // namespace

HostWords first_touched(const std::string& label, std::int64_t bytes) {
  HostWords words(Kokkos::view_alloc(label, Kokkos::WithoutInitializing),
                  static_cast<std::size_t>(bytes) / sizeof(std::uint64_t));
  Kokkos::parallel_for("writescope::benchmarks::first_touch", Kokkos::RangePolicy<HostExecSpace>(0, chunks_of(words)),
                       FillChunks{words});
  Kokkos::fence();
  return words;
}

std::uint64_t read_words(const HostExecSpace& space, const HostWords& words) {
  std::uint64_t sum = 0;
  Kokkos::parallel_reduce("writescope::benchmarks::host_read",
                          Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(words)), SumChunks{words}, sum);
  return sum;
}

void copy_words(const HostExecSpace& space, const HostWords& destination, const HostWords& source) {
  Kokkos::parallel_for("writescope::benchmarks::host_copy",
                       Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(source)),
                       CopyChunks{destination, source});
}

double host_dram_read_gbps() {
  static const double gbps = [] {
    const HostWords words = first_touched("writescope::benchmarks::bound_read", bound_bytes);
    std::uint64_t sink = 0;
    const double best = best_gbps(HostExecSpace(), static_cast<double>(bound_bytes),
                                  [&](const HostExecSpace& space) { sink += read_words(space, words); });
    benchmark::DoNotOptimize(sink);
    return best;
  }();
  return gbps;
}

namespace {

constexpr int fma_chains = 12;  // independent chains: enough to cover FMA latency x ports
constexpr std::int64_t fma_iterations = 20'000'000;

/// Per thread: fma_iterations x fma_chains vector FMAs kept in registers.
struct FmaChains {
  float seed;
  void operator()(int, float& sink) const {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[fma_chains];
    for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_set1_ps(seed + c);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (std::int64_t i = 0; i < fma_iterations; ++i)
      for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float total = 0;
    for (int c = 0; c < fma_chains; ++c) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[c]);
      for (float lane : lanes) total += lane;
    }
    sink += total;
#else
    float acc[fma_chains];
    for (int c = 0; c < fma_chains; ++c) acc[c] = seed + c;
    for (std::int64_t i = 0; i < fma_iterations; ++i)
      for (int c = 0; c < fma_chains; ++c) acc[c] = acc[c] * 0.999999f + 1e-7f;
    for (float a : acc) sink += a;
#endif
  }
};

#if defined(__AVX2__) && defined(__FMA__)
constexpr int fma_lanes = 8;
#else
constexpr int fma_lanes = 1;
#endif

}  // namespace

double host_fma_glanes() {
  static const double glanes = [] {
    const HostExecSpace space;
    const int threads = space.concurrency();
    const double lane_fmas = static_cast<double>(threads) * fma_iterations * fma_chains * fma_lanes;
    return best_gbps(space, lane_fmas, [&](const HostExecSpace& s) {
      float sink = 0;
      Kokkos::parallel_reduce("writescope::benchmarks::fma_peak", Kokkos::RangePolicy<HostExecSpace>(s, 0, threads),
                              FmaChains{1.0f}, sink);
      benchmark::DoNotOptimize(sink);
    });
  }();
  return glanes;
}

#ifdef KOKKOS_ENABLE_CUDA
namespace {
template <class Destination, class Source>
double copy_gbps(double bytes_factor) {
  Kokkos::View<std::uint8_t*, Source> source("writescope::benchmarks::bound_source", bound_bytes);
  Kokkos::View<std::uint8_t*, Destination> destination("writescope::benchmarks::bound_destination", bound_bytes);
  return best_gbps(GpuExecSpace(), bytes_factor * static_cast<double>(bound_bytes),
                   [&](const GpuExecSpace& space) { Kokkos::deep_copy(space, destination, source); });
}
}  // namespace

double pinned_h2d_gbps() {
  static const double gbps = copy_gbps<GpuMemSpace, PinnedMemSpace>(1.0);
  return gbps;
}

double hbm_copy_gbps() {
  static const double gbps = copy_gbps<GpuMemSpace, GpuMemSpace>(2.0);
  return gbps;
}
#endif

}  // namespace writescope::bench
