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

#include "bounds.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace {

constexpr std::int64_t mebibyte = std::int64_t{1} << 20;

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
  const double total = bench::run_fenced_iterations(state, space, [&](const HostExecSpace& s) {
    benchmark::DoNotOptimize(read_words(s, words));
  });
  report(state, bytes, total);
  state.counters["threads"] = space.concurrency();
}

void host_copy(benchmark::State& state) {
  const std::int64_t bytes = state.range(0) * mebibyte;
  const HostWords source = first_touched("writescope::benchmarks::copy_source", bytes);
  const HostWords destination = first_touched("writescope::benchmarks::copy_destination", bytes);
  const HostExecSpace space;
  const double total = bench::run_fenced_iterations(
      state, space, [&](const HostExecSpace& s) { copy_words(s, destination, source); });
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
  const double total = bench::run_fenced_iterations(
      state, GpuExecSpace(), [&](const GpuExecSpace& s) { Kokkos::deep_copy(s, destination, source); });
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
