#pragma once
// Measurements of this machine: the bounds benchmarks report against, and the
// machine profile `writescope calibrate` writes for the roofline model.
// Bandwidths in GB/s (10^9 B/s), rates in 10^9 per second, latencies in seconds.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/shape.hpp"
#include "framework/cpu_path.hpp"
#include "framework/roofline.hpp"
#include "framework/spaces.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {

using HostWords = Kokkos::View<std::uint64_t*, HostMemSpace>;

/// `bytes` of host memory, first touched by the threads that read it later.
HostWords first_touched(const std::string& label, std::int64_t bytes);
/// Reads every word once on the host execution space: an integer sum with the
/// CPU's widest loads (impl::sum_words).
std::uint64_t read_words(const HostExecSpace& space, const HostWords& words);
/// destination = source on the host execution space.
void copy_words(const HostExecSpace& space, const HostWords& destination, const HostWords& source);

/// Best of five fenced reads of `bytes` with all host threads.
double measure_host_dram_read_gbps(std::int64_t bytes = std::int64_t{1} << 30);
/// Multiply-adds per second (10^9) of the product instruction of CPU path
/// `path`, all host threads: scalar fp32 FMA, 8-lane fp32 FMA (avx2), or
/// 16-lane fp32 FMA (avx512_fma) or vdpbf16ps, 32 bf16 multiply-adds each
/// (avx512_bf16). The compute roof of
/// the host kernels that run on that path.
double measure_host_product_gmacs(CpuPath path);
/// Multiply-adds per second (10^9) of the fp32 FMA that the prefill tile
/// product and the expert linear layer run on CPU path `path`, all host
/// threads: scalar, 8-lane (avx2) or 16-lane AVX-512F (both AVX-512 paths). Their
/// compute roof.
double measure_host_fp32_fma_gmacs(CpuPath path);
/// The path whose product (measure_host_product_gmacs) is `path`'s fp32 FMA:
/// avx512_fma for both AVX-512 paths, else `path` itself.
CpuPath fp32_fma_path(CpuPath path);
/// The path whose product the expert linear layer runs on its path `path`
/// (impl::linear_path): amx_bf16's tiles there, else fp32_fma_path. Its
/// measure_host_product_gmacs is the layer's compute roof.
CpuPath linear_product_path(CpuPath path);
/// Work and seconds added up over samples: their rate together (all the work
/// over all the time), as a kernel's rate over its iterations is, not the mean
/// of the samples' rates.
struct RateTotals {
  double work = 0, seconds = 0;
  void add(double sample_work, double sample_seconds) {
    work += sample_work;
    seconds += sample_seconds;
  }
  /// 0 before the first sample.
  double per_second() const { return seconds > 0 ? work / seconds : 0; }
};

/// The product rate of CPU path `path` (measure_host_product_gmacs' chains,
/// all host threads, about a millisecond a sample) sampled between a
/// kernel's timed iterations, alone: for kernels whose data must stay in the
/// caches between iterations. The rate is the samples' total work over their
/// total time, as a kernel's GB/s is.
///
/// Each sample also reads a slice per thread that stays in that core's L2
/// (half its L2, l2_slice_bytes), as the products' operands do: on the Intel
/// VM the kernels lose a third of their speed for seconds at a time while
/// L2 reads lose a quarter and the chains, which use registers alone, hardly
/// change. The L2 rates say whether a run fell in such a period; they are
/// context, not a bound.
class HostProductSampler {
 public:
  /// Product chain steps per thread of one sample (12 chains each).
  static constexpr std::int64_t product_iterations = 400'000;
  /// Reads of each thread's L2 slice per sample (the first sample's first
  /// brings it in).
  static constexpr int l2_passes = 8;

  explicit HostProductSampler(CpuPath path);
  void sample();
  int samples() const { return samples_; }
  /// Multiply-adds per second (10^9) of `path`'s product instruction, all host threads; 0 before the first sample.
  double product_gmacs() const;
  /// Bytes per second (10^9) read from the threads' L2 slices, all host
  /// threads: over all samples, and in the fastest sample; 0 before the first.
  double l2_read_gbps() const { return l2_bytes_.per_second() / 1e9; }
  double fastest_l2_read_gbps() const { return fastest_l2_read_gbps_; }

 private:
  CpuPath path_;
  int samples_ = 0;
  RateTotals multiply_adds_;
  HostWords l2_slices_;  // (threads x slice words): thread t's slice first touched and read by thread t
  RateTotals l2_bytes_;
  double fastest_l2_read_gbps_ = 0;
};

/// Half the L2 of one core (sysconf; 512 KiB where the system does not say),
/// in whole 64-byte lines: what a thread's L2 slice of HostProductSampler holds.
std::int64_t l2_slice_bytes();

/// The host's DRAM read and product rates sampled between a kernel's timed
/// iterations, to set its figure against what the machine gave while it ran:
/// a shared machine's rates drift within a benchmark (on the Intel VM both
/// vCPUs' FMA rate halves for seconds to minutes at a time), and a best-of-five bound
/// taken once is a peak the kernel may never have had. Each sample reads the
/// next slice of a buffer far larger than the last-level cache, from DRAM, and
/// takes a HostProductSampler sample; each rate is the samples' total work
/// over their total time.
class HostRateSampler {
 public:
  HostRateSampler(CpuPath path, std::int64_t buffer_bytes = std::int64_t{1} << 30,
                  std::int64_t slice_bytes = std::int64_t{1} << 26);
  void sample();
  int samples() const { return products_.samples(); }
  /// 0 before the first sample.
  double dram_read_gbps() const;
  /// Multiply-adds per second (10^9) of `path`'s product instruction, all host threads; 0 before the first sample.
  double product_gmacs() const { return products_.product_gmacs(); }
  /// HostProductSampler's L2 reads.
  double l2_read_gbps() const { return products_.l2_read_gbps(); }
  double fastest_l2_read_gbps() const { return products_.fastest_l2_read_gbps(); }

 private:
  HostProductSampler products_;
  std::int64_t slice_words_;
  HostWords words_;
  std::int64_t next_slice_ = 0;
  RateTotals read_bytes_;
};
/// Median time of a small two-dimensional host kernel, launched and fenced.
double measure_host_launch_latency_s();
/// The project's bf16 SwiGLU expert kernels on the host, from DRAM: weight
/// bytes per second (10^9) of a decode token's 8 experts in one batch (as the
/// model runs a step's CPU experts), FLOP per second (10^9) of one expert at
/// 64 tokens.
struct ExpertKernelRates {
  double gbps = 0, gflops = 0;
};
ExpertKernelRates measure_cpu_expert_rates();

/// Tokens per KV block of the caches the CPU attention rates are measured on
/// (the paper's configs use it); smaller blocks run the kernels slower.
inline constexpr int calibration_block_tokens = 256;

/// A one-layer bf16 cache holding one sequence of `tokens` tokens, all in `region`.
std::unique_ptr<InplaceKVCache<bf16>> filled_cache(const AttentionShape& shape, Region region, std::int64_t tokens);

/// Copies of one sequence of `tokens` tokens filled into `region`
/// (filled_cache), with each copy's segments over the whole sequence, that
/// together hold at least 512 MiB of KV: several times any last-level cache
/// of the machines at hand (32 MiB per Zen CCD, up to 105 MiB on the GPU
/// machine's host), so a measurement that rotates through them (the
/// calibration's CPU attention, the benchmarks) reads its KV from DRAM every
/// iteration. At most 64 copies: a short sequence (a quick calibration's
/// --tokens) stays quick and may partly hit the cache.
struct RotatedCaches {
  std::vector<std::unique_ptr<InplaceKVCache<bf16>>> caches;
  std::vector<std::vector<BlockSegment>> segments;
  int copies() const { return static_cast<int>(caches.size()); }
};
RotatedCaches rotated_caches(const AttentionShape& shape, Region region, std::int64_t tokens);
/// The KV bytes rotated_caches holds for `tokens` tokens of the supported
/// shape that needs most: what one attention measurement allocates at once.
std::uint64_t rotated_cache_bytes(std::int64_t tokens);

/// CPU decode attention over `tokens` tokens read from DRAM (rotated_caches):
/// over CpuResident's head-major blocks in host memory for
/// BlockOrder::head_major, over the pinned band's token-major blocks
/// (CpuStreamed) for token_major. KV bytes per second, best of five.
double measure_cpu_attention_gbps(const AttentionShape& shape, BlockOrder order, std::int64_t tokens);

/// The command that measures measure_cpu_attention_gbps in `order` with
/// `threads` OpenMP threads in a process of its own (`executable
/// calibrate-attention`), with this process' product path for the order,
/// next-pass level and passes of the order for `shape` pinned: every thread
/// count's rate is then of the choices the profile records, not of the
/// child's own probes.
std::string cpu_attention_child_command(const std::string& executable, const AttentionShape& shape,
                                        BlockOrder order, int threads, std::int64_t tokens);

/// GPU decode attention over `tokens` VRAM-resident tokens (the kernel the
/// split runs, not a copy): KV bytes per second, best of five.
double measure_gpu_attention_gbps(const AttentionShape& shape, std::int64_t tokens);

/// The smallest of `sizes` (bytes, increasing) whose rate in `gbps` reaches
/// `fraction` of `bound_gbps`; the largest size when none does.
std::uint64_t smallest_size_reaching(const std::vector<std::uint64_t>& sizes, const std::vector<double>& gbps,
                                     double bound_gbps, double fraction);

#ifdef KOKKOS_ENABLE_CUDA
/// Best of five copies of `bytes` from Source to Destination; bytes_factor 2 counts read + write.
template <class Destination, class Source>
double measure_copy_gbps(std::int64_t bytes, double bytes_factor = 1.0);
/// Smallest time of a 4-byte copy from Source to Destination.
template <class Destination, class Source>
double measure_copy_latency_s();
/// Smallest time of an empty kernel on the GPU.
double measure_gpu_launch_latency_s();
#endif

struct CalibrationOptions {
  std::string name;                 // profile name; default: the host name
  std::vector<int> thread_counts;   // CPU attention sweep; default 1, 2, 4, ... and all threads
  std::int64_t attention_tokens = 32768;
  std::string executable;           // this program, re-run once per thread count
};

/// Measures everything a MachineProfile holds. CPU attention at other thread
/// counts runs in child processes of `options.executable` (Kokkos fixes the
/// thread count at start-up): cpu_attention_child_command, once per block
/// order. `progress` receives one line per measurement.
MachineProfile calibrate_machine(const CalibrationOptions& options, void (*progress)(const std::string&));

}  // namespace writescope
