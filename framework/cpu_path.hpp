#pragma once
// Which instruction path the host kernels (CPU decode attention, the bf16
// linear layer) take. One binary serves every development and GPU-host machine:
// the path is chosen at run time from the CPU's features and what the build
// compiled, and can be pinned (tests, comparisons) with set_cpu_path or the
// WRITESCOPE_CPU_PATH environment variable.

#include <string>
#include <vector>

namespace writescope {

/// Ordered from the plainest to the fastest.
///  - scalar: plain C++ loops, the reference of the others;
///  - avx2: 8-wide fp32 FMA on widened bf16 (the build's baseline ISA);
///  - avx512_bf16: 16-wide `vdpbf16ps` on bf16 pairs. Queries and softmax
///    weights are rounded to bf16 before their products (as tensor-core
///    attention does); accumulation stays fp32.
/// An AVX-512F path without BF16 is not offered: no machine of the project
/// (AMD Zen 4/5, the GPU machine's Intel host) has AVX-512F without BF16.
/// AMX tiles are not used yet (no machine at hand to test them on).
enum class CpuPath : int { scalar = 0, avx2 = 1, avx512_bf16 = 2 };

/// "scalar", "avx2", "avx512_bf16".
const char* cpu_path_name(CpuPath path);
/// Inverse of cpu_path_name; throws std::invalid_argument naming the valid names.
CpuPath parse_cpu_path(const std::string& name);

/// Paths this binary compiled and this CPU (and OS) can run, plainest first.
const std::vector<CpuPath>& supported_cpu_paths();
/// The fastest supported path.
CpuPath best_cpu_path();
bool cpu_path_supported(CpuPath path);

/// The path kernels take now: WRITESCOPE_CPU_PATH if set (an unsupported or
/// unknown name is an error naming the variable), else the best one.
CpuPath active_cpu_path();
/// Pins the path for the process; throws std::invalid_argument when unsupported.
void set_cpu_path(CpuPath path);

/// Pins a path for a scope (tests), restoring the previous one after.
class ScopedCpuPath {
 public:
  explicit ScopedCpuPath(CpuPath path) : previous_(active_cpu_path()) { set_cpu_path(path); }
  ~ScopedCpuPath() { set_cpu_path(previous_); }
  ScopedCpuPath(const ScopedCpuPath&) = delete;
  ScopedCpuPath& operator=(const ScopedCpuPath&) = delete;

 private:
  CpuPath previous_;
};

}  // namespace writescope
