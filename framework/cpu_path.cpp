#include "framework/cpu_path.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "framework/impl/product_peaks.hpp"
#include "framework/simd.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace writescope {
namespace {

constexpr CpuPath all_paths[] = {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_fma, CpuPath::avx512_bf16,
                                 CpuPath::amx_bf16};

constexpr unsigned amx_bf16_bit = 1u << 22, amx_tile_bit = 1u << 24, amx_int8_bit = 1u << 25;
constexpr int xfeature_xtiledata = 18;

/// CPUID leaf 7's EDX (0 where there is none).
unsigned cpuid7_edx() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return edx;
#endif
  return 0;
}

bool cpu_runs(CpuPath path);

/// Why this process cannot take the amx_bf16 path, "" where it can: asked
/// once, the tile data from Linux (ARCH_REQ_XCOMP_PERM, 5.16+; without the
/// grant a tile instruction faults), then the tiles' own result checked
/// before any kernel trusts them.
std::string amx_bf16_refusal() {
#if defined(WRITESCOPE_HOST_AVX512_BF16) && defined(__x86_64__)
  if (!cpu_runs(CpuPath::avx512_bf16)) return "no AVX-512 BF16";
  const unsigned edx = cpuid7_edx();
  if (!(edx & amx_tile_bit) || !(edx & amx_bf16_bit)) return "AMX-TILE and AMX-BF16 are not both in CPUID";
  constexpr int arch_req_xcomp_perm = 0x1023;  // asm/prctl.h
  if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0)
    return std::string("Linux did not grant the tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  const std::string mismatch = impl::amx_tiles_mismatch();
  if (!mismatch.empty()) return "the tiles' self-check failed: " + mismatch;
  return "";
#else
  return "this build has no AVX-512 BF16 kernels";
#endif
}

bool cpu_runs(CpuPath path) {
  switch (path) {
    case CpuPath::scalar:
      return true;
    case CpuPath::avx2:
#ifdef WRITESCOPE_HOST_AVX2
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case CpuPath::avx512_fma:
    case CpuPath::avx512_bf16:
#ifdef WRITESCOPE_HOST_AVX512_BF16
      // libgcc's check includes the OS's XSAVE support for the zmm state.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
      return false;
#endif
    case CpuPath::amx_bf16:
      return amx_bf16_unavailable_reason().empty();
  }
  return false;
}

std::vector<CpuPath> detect() {
  std::vector<CpuPath> paths;
  for (CpuPath path : all_paths)
    if (cpu_runs(path)) paths.push_back(path);
  return paths;
}

/// Why `path`, which this CPU or build does not run, is refused: for
/// amx_bf16 the check that failed.
std::string refusal_of(CpuPath path) {
  return path == CpuPath::amx_bf16 ? ": " + amx_bf16_unavailable_reason() : "";
}

constexpr int unset = -1;
std::atomic<int> pinned{unset};  // by set_cpu_path

const char* environment_variable() {
  const char* value = std::getenv("WRITESCOPE_CPU_PATH");
  return value == nullptr || *value == '\0' ? nullptr : value;
}

CpuPath from_environment() {
  const char* value = environment_variable();
  if (value == nullptr) return best_cpu_path();
  CpuPath path;
  try {
    path = parse_cpu_path(value);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string("WRITESCOPE_CPU_PATH: ") + error.what());
  }
  if (!cpu_path_supported(path))
    throw std::invalid_argument(std::string("WRITESCOPE_CPU_PATH: this CPU or build cannot run '") + value + "'" +
                                refusal_of(path) + " (best here: " + cpu_path_name(best_cpu_path()) + ")");
  return path;
}

}  // namespace

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::scalar:
      return "scalar";
    case CpuPath::avx2:
      return "avx2";
    case CpuPath::avx512_fma:
      return "avx512_fma";
    case CpuPath::avx512_bf16:
      return "avx512_bf16";
    case CpuPath::amx_bf16:
      return "amx_bf16";
  }
  return "unknown";
}

CpuPath parse_cpu_path(const std::string& name) {
  std::string known;
  for (CpuPath path : all_paths) {
    if (name == cpu_path_name(path)) return path;
    known += (known.empty() ? "" : ", ") + std::string(cpu_path_name(path));
  }
  throw std::invalid_argument("unknown CPU path '" + name + "' (known: " + known + ")");
}

const std::vector<CpuPath>& supported_cpu_paths() {
  static const std::vector<CpuPath> paths = detect();
  return paths;
}

CpuPath best_cpu_path() {
  const CpuPath last = supported_cpu_paths().back();
  return last == CpuPath::avx512_bf16 ? faster_avx512_path(avx512_product_rates()) : last;
}

CpuPath vector_path(CpuPath path) {
  return path == CpuPath::amx_bf16 ? faster_avx512_path(avx512_product_rates()) : path;
}

const Avx512ProductRates& avx512_product_rates() {
  static const Avx512ProductRates rates = [] {
    Avx512ProductRates measured;
#ifdef WRITESCOPE_HOST_AVX512_BF16
    if (!cpu_runs(CpuPath::avx512_bf16)) return measured;
    constexpr std::int64_t iterations = 50'000;  // 600k instructions: about 0.1-0.5 ms
    const double multiply_adds = static_cast<double>(iterations) * impl::avx512_peak_chains;
    auto rate = [&](auto chains, double per_instruction) {
      const auto start = std::chrono::steady_clock::now();
      volatile float sink = chains(1.0f, iterations);
      (void)sink;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return multiply_adds * per_instruction / seconds / 1e9;
    };
    for (int round = 0; round < 5; ++round) {
      measured.bf16_dot_gmacs = std::max(measured.bf16_dot_gmacs, rate(impl::bf16_dot_chains, 32));
      measured.fp32_fma_gmacs = std::max(measured.fp32_fma_gmacs, rate(impl::fp32_fma16_chains, 16));
    }
#endif
    return measured;
  }();
  return rates;
}

CpuPath faster_avx512_path(const Avx512ProductRates& rates) {
  return rates.fp32_fma_gmacs > 1.25 * rates.bf16_dot_gmacs ? CpuPath::avx512_fma : CpuPath::avx512_bf16;
}

bool cpu_path_supported(CpuPath path) {
  for (CpuPath supported : supported_cpu_paths())
    if (supported == path) return true;
  return false;
}

const std::string& amx_bf16_unavailable_reason() {
  static const std::string reason = amx_bf16_refusal();
  return reason;
}

std::string describe_amx(unsigned cpuid7_edx, bool os_tile_data) {
  if (!(cpuid7_edx & amx_tile_bit)) return "not in CPUID";
  std::string description = "amx_tile";
  if (cpuid7_edx & amx_bf16_bit) description += ", amx_bf16";
  if (cpuid7_edx & amx_int8_bit) description += ", amx_int8";
  return description + (os_tile_data ? "; the OS supports tile data" : "; the OS does not support tile data");
}

std::string amx_description() {
#if defined(__x86_64__)
  constexpr int arch_get_xcomp_supp = 0x1021;  // Linux 5.16+, asm/prctl.h
  unsigned long features = 0;
  const bool os_tile_data =
      syscall(SYS_arch_prctl, arch_get_xcomp_supp, &features) == 0 && (features >> xfeature_xtiledata & 1u);
  return describe_amx(cpuid7_edx(), os_tile_data);
#else
  return describe_amx(0, false);
#endif
}

CpuPath active_cpu_path() {
  if (const int path = pinned.load(std::memory_order_relaxed); path != unset) return static_cast<CpuPath>(path);
  static const CpuPath unpinned = from_environment();
  return unpinned;
}

void set_cpu_path(CpuPath path) {
  if (!cpu_path_supported(path))
    throw std::invalid_argument(std::string("CPU path '") + cpu_path_name(path) +
                                "' is not supported by this CPU or build" + refusal_of(path) + " (best here: " +
                                cpu_path_name(best_cpu_path()) + ")");
  pinned.store(static_cast<int>(path), std::memory_order_relaxed);
}

const char* cpu_path_pinned_by() {
  if (pinned.load(std::memory_order_relaxed) != unset) return "set_cpu_path";
  static const bool from_environment = environment_variable() != nullptr;  // read once, as active_cpu_path
  return from_environment ? "WRITESCOPE_CPU_PATH" : "";
}

ScopedCpuPath::ScopedCpuPath(CpuPath path) : previous_(pinned.load()) { set_cpu_path(path); }

ScopedCpuPath::~ScopedCpuPath() { pinned.store(previous_); }

}  // namespace writescope
