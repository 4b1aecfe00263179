// Bandwidth bounds that every later kernel is measured against: host DRAM
// read and copy (STREAM-like), and on CUDA builds pinned and pageable
// host<->device copies and device-to-device copies.
//
// Each benchmark uses manual time, fenced before start and stop, and reports
// `GB/s` (10^9 bytes per second) over the bytes it moves: read-only kernels
// count bytes read; copies count bytes read plus bytes written for in-memory
// copies (STREAM convention) and bytes transferred for host<->device copies.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "framework/spaces.hpp"
#include "framework/timer.hpp"

namespace writescope {
namespace {

constexpr std::int64_t mebibyte = std::int64_t{1} << 20;
/// Elements per work item: long enough for a vectorised inner loop.
constexpr std::int64_t chunk = 1 << 15;

using HostWords = Kokkos::View<std::uint64_t*, HostMemSpace>;

/// Touches each chunk from the thread that will read it later (first touch).
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

std::int64_t chunks_of(const HostWords& words) {
  return (static_cast<std::int64_t>(words.extent(0)) + chunk - 1) / chunk;
}

HostWords first_touched(const std::string& label, std::int64_t bytes) {
  HostWords words(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), bytes / sizeof(std::uint64_t));
  Kokkos::parallel_for("writescope::benchmarks::first_touch",
                       Kokkos::RangePolicy<HostExecSpace>(0, chunks_of(words)), FillChunks{words});
  Kokkos::fence();
  return words;
}

void report(benchmark::State& state, std::int64_t bytes_per_iteration, double total_seconds) {
  const auto bytes = static_cast<double>(bytes_per_iteration) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["GB/s"] = bytes / total_seconds / 1e9;
  state.counters["MiB"] = static_cast<double>(state.range(0));
}

void host_read(benchmark::State& state) {
  const std::int64_t bytes = state.range(0) * mebibyte;
  const HostWords words = first_touched("writescope::benchmarks::read", bytes);
  const HostExecSpace space;
  FencedTimer<HostExecSpace> timer(space);
  double total = 0;
  for (auto _ : state) {
    std::uint64_t sum = 0;
    timer.start();
    Kokkos::parallel_reduce("writescope::benchmarks::host_read",
                            Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(words)), SumChunks{words}, sum);
    const double seconds = timer.seconds();
    benchmark::DoNotOptimize(sum);
    state.SetIterationTime(seconds);
    total += seconds;
  }
  report(state, bytes, total);
  state.counters["threads"] = space.concurrency();
}

void host_copy(benchmark::State& state) {
  const std::int64_t bytes = state.range(0) * mebibyte;
  const HostWords source = first_touched("writescope::benchmarks::copy_source", bytes);
  const HostWords destination = first_touched("writescope::benchmarks::copy_destination", bytes);
  const HostExecSpace space;
  FencedTimer<HostExecSpace> timer(space);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    Kokkos::parallel_for("writescope::benchmarks::host_copy",
                         Kokkos::RangePolicy<HostExecSpace>(space, 0, chunks_of(source)),
                         CopyChunks{destination, source});
    const double seconds = timer.seconds();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  report(state, 2 * bytes, total);
  state.counters["threads"] = space.concurrency();
}

BENCHMARK(host_read)->Name("host_dram/read")->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(host_copy)->Name("host_dram/copy")->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);

#ifdef KOKKOS_ENABLE_CUDA
using Bytes = std::uint8_t;

/// Copies `range(0)` MiB from a buffer in SourceSpace to one in DestinationSpace
/// on one CUDA stream; `bytes_factor` is 2 for device-to-device copies.
template <class DestinationSpace, class SourceSpace>
void device_copy(benchmark::State& state, int bytes_factor) {
  const std::int64_t bytes = state.range(0) * mebibyte;
  Kokkos::View<Bytes*, SourceSpace> source("writescope::benchmarks::source", bytes);
  Kokkos::View<Bytes*, DestinationSpace> destination("writescope::benchmarks::destination", bytes);
  Kokkos::deep_copy(source, Bytes{1});
  const GpuExecSpace space;
  FencedTimer<GpuExecSpace> timer(space);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    Kokkos::deep_copy(space, destination, source);
    const double seconds = timer.seconds();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  report(state, bytes_factor * bytes, total);
}

void pinned_h2d(benchmark::State& s) { device_copy<GpuMemSpace, PinnedMemSpace>(s, 1); }
void pinned_d2h(benchmark::State& s) { device_copy<PinnedMemSpace, GpuMemSpace>(s, 1); }
void pageable_h2d(benchmark::State& s) { device_copy<GpuMemSpace, HostMemSpace>(s, 1); }
void pageable_d2h(benchmark::State& s) { device_copy<HostMemSpace, GpuMemSpace>(s, 1); }
void device_to_device(benchmark::State& s) { device_copy<GpuMemSpace, GpuMemSpace>(s, 2); }

#define WRITESCOPE_COPY_BENCHMARK(fn, name) \
  BENCHMARK(fn)->Name(name)->Arg(64)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond)
WRITESCOPE_COPY_BENCHMARK(pinned_h2d, "pcie/pinned_h2d");
WRITESCOPE_COPY_BENCHMARK(pinned_d2h, "pcie/pinned_d2h");
WRITESCOPE_COPY_BENCHMARK(pageable_h2d, "pcie/pageable_h2d");
WRITESCOPE_COPY_BENCHMARK(pageable_d2h, "pcie/pageable_d2h");
WRITESCOPE_COPY_BENCHMARK(device_to_device, "hbm/device_to_device");
#undef WRITESCOPE_COPY_BENCHMARK
#endif

}  // namespace
}  // namespace writescope
