#pragma once
// Which instruction path the host kernels (CPU decode attention, the bf16
// linear layer) take. One binary serves every development and GPU-host machine:
// the path is chosen at run time from the CPU's features and what the build
// compiled, and can be pinned (tests, comparisons) with set_cpu_path or the
// WRITESCOPE_CPU_PATH environment variable.

#include <string>
#include <vector>

namespace writescope {

/// Ordered from the plainest on; each falls back to the one before it.
///  - scalar: plain C++ loops, the reference of the others;
///  - avx2: 8-wide fp32 FMA on widened bf16 (the build's baseline ISA);
///  - avx512_fma: 16-wide fp32 FMA on widened bf16, fp32 queries and softmax
///    weights;
///  - avx512_bf16: 16-wide `vdpbf16ps` on bf16 pairs. Queries and softmax
///    weights are rounded to bf16 before their products (as tensor-core
///    attention does); accumulation stays fp32.
/// Both AVX-512 paths need AVX-512 BF16 CPUs (the kernels share one target
/// region; no machine of the project has AVX-512F without BF16). Which of them
/// is faster depends on the CPU: AMD Zen 4/5 run vdpbf16ps at twice the
/// multiply-adds of a 16-lane FMA, the Intel VM measured on 2026-12-01 at
/// half (faster_avx512_path).
///  - amx_bf16: AMX tile products (`tdpbf16ps`, 16 x 16 fp32 tiles of bf16
///    pairs) where a kernel has them (decode attention, the bf16 linear
///    layer's decode batches), elsewhere the faster AVX-512 path
///    (vector_path). Needs AMX-TILE and AMX-BF16 in
///    CPUID, AVX-512 BF16, and the OS's grant of the tile data state, which
///    this module requests for the process.
enum class CpuPath : int { scalar = 0, avx2 = 1, avx512_fma = 2, avx512_bf16 = 3, amx_bf16 = 4 };

/// "scalar", "avx2", "avx512_fma", "avx512_bf16", "amx_bf16".
const char* cpu_path_name(CpuPath path);
/// Inverse of cpu_path_name; throws std::invalid_argument naming the valid names.
CpuPath parse_cpu_path(const std::string& name);

/// Paths this binary compiled and this CPU (and OS) can run, plainest first.
const std::vector<CpuPath>& supported_cpu_paths();
/// The fastest supported path: the last one, or of the two AVX-512 paths the
/// faster one here (faster_avx512_path on avx512_product_rates).
CpuPath best_cpu_path();
/// The vector path a kernel without tile products takes on `path`: the
/// faster AVX-512 path for amx_bf16, `path` itself for the others.
CpuPath vector_path(CpuPath path);

/// Multiply-adds per second (10^9) of one thread's vdpbf16ps and 16-lane fp32
/// FMA chains, measured once per process (a few ms, best of five each,
/// alternating) where the AVX-512 paths run; zeros elsewhere.
struct Avx512ProductRates {
  double bf16_dot_gmacs = 0;
  double fp32_fma_gmacs = 0;
};
const Avx512ProductRates& avx512_product_rates();
/// avx512_fma where the 16-lane FMA runs more than 1.25 times the
/// multiply-adds of vdpbf16ps, else avx512_bf16: the fp32 products spend about
/// one ALU operation per two to four FMAs widening bf16, vdpbf16ps' about one
/// per eight, so at equal rates vdpbf16ps wins.
CpuPath faster_avx512_path(const Avx512ProductRates& rates);
bool cpu_path_supported(CpuPath path);
/// "" where amx_bf16 is supported, else why not, naming the check that
/// failed: no AVX-512 BF16, AMX-TILE / AMX-BF16 not in CPUID, Linux's refusal
/// of the tile data (with its errno), or the tiles' self-check against
/// EmulatedTiles (with the case and the first element that differed).
const std::string& amx_bf16_unavailable_reason();

/// AMX on this machine, recorded with results (MachineDescription::amx):
/// describe_amx of CPUID leaf 7's EDX and of whether the OS supports the
/// tile data state (arch_prctl ARCH_GET_XCOMP_SUPP; the amx_bf16 path asks
/// for it with ARCH_REQ_XCOMP_PERM).
std::string amx_description();
/// "not in CPUID" without AMX-TILE (EDX bit 24), else its extensions
/// ("amx_tile, amx_bf16, amx_int8": bits 24, 22, 25) and "; the OS supports
/// tile data" or "; the OS does not support tile data".
std::string describe_amx(unsigned cpuid7_edx, bool os_tile_data);

/// The path kernels take now: the one pinned by set_cpu_path, else
/// WRITESCOPE_CPU_PATH if set (an unsupported or unknown name is an error
/// naming the variable), else the best one.
CpuPath active_cpu_path();
/// Pins the path for the process; throws std::invalid_argument when unsupported.
void set_cpu_path(CpuPath path);
/// What pins the active path: "set_cpu_path", "WRITESCOPE_CPU_PATH", or ""
/// where it is the best one. Unpinned, host decode attention may take the
/// other AVX-512 path for a shape where it measured faster
/// (attention/host_prefetch.hpp); pinned, every kernel takes the pinned path.
const char* cpu_path_pinned_by();

/// Pins a path for a scope (tests), restoring the previous pin (or none) after.
class ScopedCpuPath {
 public:
  explicit ScopedCpuPath(CpuPath path);
  ~ScopedCpuPath();
  ScopedCpuPath(const ScopedCpuPath&) = delete;
  ScopedCpuPath& operator=(const ScopedCpuPath&) = delete;

 private:
  int previous_;  // the pin before, or none
};

}  // namespace writescope
