#include "framework/cpu_path.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "framework/simd.hpp"

namespace writescope {
namespace {

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
    case CpuPath::avx512_bf16:
#ifdef WRITESCOPE_HOST_AVX512_BF16
      // libgcc's check includes the OS's XSAVE support for the zmm state.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
      return false;
#endif
  }
  return false;
}

std::vector<CpuPath> detect() {
  std::vector<CpuPath> paths;
  for (CpuPath path : {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_bf16})
    if (cpu_runs(path)) paths.push_back(path);
  return paths;
}

constexpr int unset = -1;
std::atomic<int> pinned{unset};

CpuPath from_environment() {
  const char* value = std::getenv("WRITESCOPE_CPU_PATH");
  if (value == nullptr || *value == '\0') return best_cpu_path();
  CpuPath path;
  try {
    path = parse_cpu_path(value);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string("WRITESCOPE_CPU_PATH: ") + error.what());
  }
  if (!cpu_path_supported(path))
    throw std::invalid_argument(std::string("WRITESCOPE_CPU_PATH: this CPU or build cannot run '") + value +
                                "' (best here: " + cpu_path_name(best_cpu_path()) + ")");
  return path;
}

}  // namespace

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::scalar:
      return "scalar";
    case CpuPath::avx2:
      return "avx2";
    case CpuPath::avx512_bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

CpuPath parse_cpu_path(const std::string& name) {
  for (CpuPath path : {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_bf16})
    if (name == cpu_path_name(path)) return path;
  throw std::invalid_argument("unknown CPU path '" + name + "' (known: scalar, avx2, avx512_bf16)");
}

const std::vector<CpuPath>& supported_cpu_paths() {
  static const std::vector<CpuPath> paths = detect();
  return paths;
}

CpuPath best_cpu_path() { return supported_cpu_paths().back(); }

bool cpu_path_supported(CpuPath path) {
  for (CpuPath supported : supported_cpu_paths())
    if (supported == path) return true;
  return false;
}

CpuPath active_cpu_path() {
  const int current = pinned.load(std::memory_order_relaxed);
  if (current != unset) return static_cast<CpuPath>(current);
  const CpuPath path = from_environment();
  int expected = unset;
  pinned.compare_exchange_strong(expected, static_cast<int>(path));
  return static_cast<CpuPath>(pinned.load(std::memory_order_relaxed));
}

void set_cpu_path(CpuPath path) {
  if (!cpu_path_supported(path))
    throw std::invalid_argument(std::string("CPU path '") + cpu_path_name(path) +
                                "' is not supported by this CPU or build (best here: " +
                                cpu_path_name(best_cpu_path()) + ")");
  pinned.store(static_cast<int>(path), std::memory_order_relaxed);
}

}  // namespace writescope
