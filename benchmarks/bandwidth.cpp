// Bandwidth bounds that every later kernel is measured against: host DRAM
// read and copy (STREAM-like), how much of memory and compute time the host
// overlaps at each intensity (host_overlap), and on CUDA builds pinned and
// pageable host<->device copies and device-to-device copies.
//
// Each benchmark uses manual time, fenced before start and stop, and reports
// `GB/s` (10^9 bytes per second) over the bytes it moves: read-only kernels
// count bytes read; copies count bytes read plus bytes written for in-memory
// copies (STREAM convention) and bytes transferred for host<->device copies.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "bounds.hpp"
#include "framework/cpu_path.hpp"
#include "framework/host_memory.hpp"
#include "framework/impl/fma_stream.hpp"
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

/// 64-byte lines of the overlap stream, in chunks of 2 MiB per work item.
constexpr std::int64_t line_floats = 16, chunk_lines = (2 * mebibyte) / 64;
/// The stream's request lead: on the Intel VM 4-16 KiB ran a 16-FMA stream
/// at 22-25 GB/s, 64-128 KiB at 20-23 and none at 14.
constexpr std::int64_t overlap_prefetch_bytes = 8192;

using HostFloats = Kokkos::View<float*, HostMemSpace>;

/// fma_stream over the stream's chunk `item`.
struct FmaStreamChunks {
  const float* lines;
  std::int64_t total_lines;
  int fmas_per_line;
  CpuPath path;
  void operator()(std::int64_t item, float& sum) const {
    const std::int64_t first = item * chunk_lines;
    sum += impl::fma_stream(path, lines + first * line_floats, std::min(chunk_lines, total_lines - first),
                            fmas_per_line, 1.0f, overlap_prefetch_bytes);
  }
};

/// fma_stream over slice item / repeats: under the static schedule, each
/// thread walks its own slice `repeats` times.
struct FmaStreamSlices {
  const float* lines;
  std::int64_t slice_lines, repeats;
  int fmas_per_line;
  CpuPath path;
  void operator()(std::int64_t item, float& sum) const {
    sum += impl::fma_stream(path, lines + item / repeats * slice_lines * line_floats, slice_lines, fmas_per_line,
                            1.0f, overlap_prefetch_bytes);
  }
};

template <class Functor>
float run_fma_stream(const HostExecSpace& space, const Functor& functor, std::int64_t items) {
  float sum = 0;
  Kokkos::parallel_reduce("writescope::benchmarks::fma_stream", Kokkos::RangePolicy<HostExecSpace>(space, 0, items),
                          functor, sum);
  return sum;
}

/// A stream of 64-byte lines with range(0) 16-lane FMAs per line on the fp32
/// FMA of the active CPU path, 1 GiB from DRAM per iteration (the DRAM read
/// bound's size) against 64 MiB over a slice of L2 per thread (l2_slice_bytes):
///   GB/s, in_cache_GB/s: the stream from DRAM, and in L2 (best of five)
///   bound_GB/s: the DRAM read; compute_bound_GB/s: the FMA peak over the
///     multiply-adds per byte (multiply_adds_per_byte = range(0) / 4)
///   overlap: GB/s over min(DRAM read, in cache), 1 where memory and the FMAs
///     overlap fully and about max/(DRAM + in cache) where their times add up:
///     what a kernel of this intensity can reach here at most.
void host_overlap(benchmark::State& state) {
  const int fmas_per_line = static_cast<int>(state.range(0));
  const CpuPath path = fp32_fma_path(active_cpu_path());
  state.SetLabel(cpu_path_name(path));
  const HostExecSpace space;
  const std::int64_t threads = space.concurrency();
  const std::int64_t stream_lines = 1024 * mebibyte / 64, slice_lines = l2_slice_bytes() / 64;
  HostFloats stream(
      Kokkos::view_alloc(std::string("writescope::benchmarks::overlap_stream"), Kokkos::WithoutInitializing),
      stream_lines * line_floats);
  advise_huge_pages(stream);
  HostFloats slices("writescope::benchmarks::overlap_slices", threads * slice_lines * line_floats);
  Kokkos::deep_copy(stream, 1.0f);
  Kokkos::deep_copy(slices, 1.0f);
  const FmaStreamChunks from_dram{stream.data(), stream_lines, fmas_per_line, path};
  const std::int64_t dram_items = (stream_lines + chunk_lines - 1) / chunk_lines;
  float sink = 0;
  const double total = bench::run_fenced_iterations(
      state, space, [&](const HostExecSpace& s) { sink += run_fma_stream(s, from_dram, dram_items); });
  const std::int64_t repeats = std::max<std::int64_t>(1, 64 * mebibyte / 64 / (threads * slice_lines));
  const FmaStreamSlices in_cache{slices.data(), slice_lines, repeats, fmas_per_line, path};
  double best_in_cache = 0;
  for (int round = 0; round < 5; ++round) {
    const double seconds = time_fenced(
        space, [&](const HostExecSpace& s) { sink += run_fma_stream(s, in_cache, threads * repeats); });
    best_in_cache = std::max(best_in_cache, 64.0 * slice_lines * threads * repeats / seconds / 1e9);
  }
  benchmark::DoNotOptimize(sink);
  const double gbps = 64.0 * stream_lines * static_cast<double>(state.iterations()) / total / 1e9;
  const double dram = measure_host_dram_read_gbps();
  const double multiply_adds_per_byte = fmas_per_line / 4.0;
  state.counters["GB/s"] = gbps;
  state.counters["in_cache_GB/s"] = best_in_cache;
  state.counters["bound_GB/s"] = dram;
  state.counters["compute_bound_GB/s"] = measure_host_fp32_fma_gmacs(path) / multiply_adds_per_byte;
  state.counters["multiply_adds_per_byte"] = multiply_adds_per_byte;
  state.counters["fraction_of_bound"] = gbps / dram;
  state.counters["overlap"] = gbps / std::min(dram, best_in_cache);
  state.counters["threads"] = static_cast<double>(threads);
}

BENCHMARK(host_read)->Name("host_dram/read")->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(host_copy)->Name("host_dram/copy")->Arg(256)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(host_overlap)
    ->Name("host_overlap")
    ->ArgName("fmas_per_line")
    ->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Arg(64)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

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
