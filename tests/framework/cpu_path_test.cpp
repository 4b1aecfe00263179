#include "framework/cpu_path.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "framework/simd.hpp"

namespace writescope {
namespace {

/// The CPU flags the kernel reports, read independently of the dispatcher.
std::set<std::string> proc_cpu_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string flag; words >> flag;) flags.insert(flag);
      return flags;
    }
  return {};
}

TEST(CpuPath, DetectionAgreesWithTheKernelsCpuFlags) {
  const auto flags = proc_cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  EXPECT_TRUE(cpu_path_supported(CpuPath::scalar));
#ifdef WRITESCOPE_HOST_AVX2
  EXPECT_EQ(cpu_path_supported(CpuPath::avx2), flags.count("avx2") && flags.count("fma"));
#endif
#ifdef WRITESCOPE_HOST_AVX512_BF16
  const bool bf16 = flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512vl") &&
                    flags.count("avx512_bf16");
  EXPECT_EQ(cpu_path_supported(CpuPath::avx512_bf16), bf16);
#endif
}

TEST(CpuPath, TheBestSupportedPathIsActiveUnlessPinned) {
  ASSERT_EQ(std::getenv("WRITESCOPE_CPU_PATH"), nullptr) << "the test expects no pinned path in its environment";
  const auto& paths = supported_cpu_paths();
  ASSERT_FALSE(paths.empty());
  for (std::size_t i = 1; i < paths.size(); ++i) EXPECT_LT(paths[i - 1], paths[i]);
  EXPECT_EQ(best_cpu_path(), paths.back());
  EXPECT_EQ(active_cpu_path(), best_cpu_path());
  {
    ScopedCpuPath pinned(CpuPath::scalar);
    EXPECT_EQ(active_cpu_path(), CpuPath::scalar);
  }
  EXPECT_EQ(active_cpu_path(), best_cpu_path());
}

TEST(CpuPath, UnknownOrUnsupportedPathsAreRefusedByName) {
  try {
    parse_cpu_path("avx512");
    FAIL() << "an unknown name was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("unknown CPU path 'avx512' (known: scalar, avx2, avx512_bf16)"),
              std::string::npos)
        << error.what();
  }
  for (CpuPath path : {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_bf16}) {
    EXPECT_EQ(parse_cpu_path(cpu_path_name(path)), path);
    if (!cpu_path_supported(path)) {
      EXPECT_THROW(set_cpu_path(path), std::invalid_argument);
      EXPECT_EQ(active_cpu_path(), best_cpu_path());
    }
  }
}

}  // namespace
}  // namespace writescope
