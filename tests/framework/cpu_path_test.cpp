#include "framework/cpu_path.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "framework/impl/amx_tiles.hpp"
#include "framework/impl/product_peaks.hpp"
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
  EXPECT_EQ(cpu_path_supported(CpuPath::avx512_fma), bf16);
  // Linux lists the AMX flags only where it supports the tile data state.
  EXPECT_EQ(cpu_path_supported(CpuPath::amx_bf16), bf16 && flags.count("amx_tile") && flags.count("amx_bf16"))
      << amx_description() << "; " << amx_bf16_unavailable_reason();
#endif
}

// Where amx_bf16 is refused, the reason names the check that failed, and a
// request for the path repeats it.
TEST(CpuPath, AmxRefusalNamesTheCheckThatFailed) {
  const std::string& reason = amx_bf16_unavailable_reason();
  EXPECT_EQ(cpu_path_supported(CpuPath::amx_bf16), reason.empty()) << reason;
  const auto flags = proc_cpu_flags();
#ifdef WRITESCOPE_HOST_AVX512_BF16
  if (!flags.empty() && !flags.count("avx512_bf16")) {
    EXPECT_EQ(reason, "no AVX-512 BF16");
  } else if (!flags.empty() && !(flags.count("amx_tile") && flags.count("amx_bf16"))) {
    EXPECT_EQ(reason, "AMX-TILE and AMX-BF16 are not both in CPUID");
  }
#else
  EXPECT_EQ(reason, "this build has no AVX-512 BF16 kernels");
#endif
  if (reason.empty()) return;
  try {
    set_cpu_path(CpuPath::amx_bf16);
    FAIL() << "an unsupported amx_bf16 was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("not supported by this CPU or build: " + reason), std::string::npos)
        << error.what();
  }
}

// The self-check's report: the first element, row by row, whose bits differ.
TEST(Amx, FirstTileDifferenceNamesTheElement) {
  float tiles[impl::tile_rows * 16], emulated[impl::tile_rows * 16];
  for (int i = 0; i < impl::tile_rows * 16; ++i) tiles[i] = emulated[i] = static_cast<float>(i % 11);
  EXPECT_EQ(impl::first_tile_difference(tiles, emulated, impl::tile_rows), "");
  tiles[10 * 16 + 2] = 0.5f;  // past 8 rows: not compared there
  EXPECT_EQ(impl::first_tile_difference(tiles, emulated, 8), "");
  tiles[3 * 16 + 5] = -0.0f, emulated[3 * 16 + 5] = 0.0f;
  EXPECT_EQ(impl::first_tile_difference(tiles, emulated, impl::tile_rows), "C[3][5] is -0 on the tiles, 0 emulated");
  EXPECT_EQ(impl::first_tile_difference(tiles, emulated, 3), "");
  EXPECT_EQ(impl::first_tile_difference(tiles, emulated, 4), "C[3][5] is -0 on the tiles, 0 emulated");
}

// AMX as recorded with results: what CPUID says, read here as the kernel
// reports it, and each extension's bit named in the description.
TEST(Amx, DescriptionAgreesWithTheKernelsCpuFlags) {
  const auto flags = proc_cpu_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const std::string description = amx_description();
  EXPECT_EQ(description.rfind("amx_tile", 0) == 0, flags.count("amx_tile") == 1) << description;
  for (const char* extension : {"amx_bf16", "amx_int8"})
    EXPECT_EQ(description.find(extension) != std::string::npos, flags.count(extension) == 1) << description;
}

TEST(Amx, DescribesEachExtensionAndTheOsSupport) {
  EXPECT_EQ(describe_amx(0, true), "not in CPUID");
  EXPECT_EQ(describe_amx(1u << 22, true), "not in CPUID");  // AMX-BF16 without AMX-TILE
  EXPECT_EQ(describe_amx(1u << 24, false), "amx_tile; the OS does not support tile data");
  EXPECT_EQ(describe_amx((1u << 24) | (1u << 22), true), "amx_tile, amx_bf16; the OS supports tile data");
  EXPECT_EQ(describe_amx((1u << 24) | (1u << 25) | (1u << 22), true),
            "amx_tile, amx_bf16, amx_int8; the OS supports tile data");
}

TEST(CpuPath, TheBestSupportedPathIsActiveUnlessPinned) {
  ASSERT_EQ(std::getenv("WRITESCOPE_CPU_PATH"), nullptr) << "the test expects no pinned path in its environment";
  const auto& paths = supported_cpu_paths();
  ASSERT_FALSE(paths.empty());
  for (std::size_t i = 1; i < paths.size(); ++i) EXPECT_LT(paths[i - 1], paths[i]);
  if (paths.back() == CpuPath::amx_bf16) {
    EXPECT_EQ(best_cpu_path(), CpuPath::amx_bf16);
    EXPECT_EQ(vector_path(CpuPath::amx_bf16), faster_avx512_path(avx512_product_rates()));
  } else if (paths.back() == CpuPath::avx512_bf16) {
    const Avx512ProductRates& rates = avx512_product_rates();
    EXPECT_GT(rates.bf16_dot_gmacs, 0);
    EXPECT_GT(rates.fp32_fma_gmacs, 0);
    EXPECT_EQ(best_cpu_path(), faster_avx512_path(rates))
        << "vdpbf16ps " << rates.bf16_dot_gmacs << ", fp32 FMA " << rates.fp32_fma_gmacs << " GMAC/s";
  } else {
    EXPECT_EQ(best_cpu_path(), paths.back());
  }
  EXPECT_EQ(active_cpu_path(), best_cpu_path());
  EXPECT_STREQ(cpu_path_pinned_by(), "");
  {
    ScopedCpuPath pinned(CpuPath::scalar);
    EXPECT_EQ(active_cpu_path(), CpuPath::scalar);
    EXPECT_STREQ(cpu_path_pinned_by(), "set_cpu_path");
    {
      ScopedCpuPath best(best_cpu_path());
      EXPECT_STREQ(cpu_path_pinned_by(), "set_cpu_path") << "the best path pinned is still pinned";
    }
    EXPECT_EQ(active_cpu_path(), CpuPath::scalar) << "the outer pin restored";
  }
  EXPECT_EQ(active_cpu_path(), best_cpu_path());
  EXPECT_STREQ(cpu_path_pinned_by(), "") << "unpinned again, not pinned to the path it had";
}

TEST(CpuPath, TheAvx512PathWithMoreMultiplyAddsIsTheBest) {
  // Zen 4/5: vdpbf16ps at twice the 16-lane FMA's multiply-adds; the Intel hosts at half.
  EXPECT_EQ(faster_avx512_path({200, 100}), CpuPath::avx512_bf16);
  EXPECT_EQ(faster_avx512_path({42, 87}), CpuPath::avx512_fma);
  // At equal rates vdpbf16ps, with fewer widening operations per multiply-add, stays.
  EXPECT_EQ(faster_avx512_path({80, 90}), CpuPath::avx512_bf16);
}

TEST(CpuPath, KernelsWithoutTileProductsTakeTheFasterVectorPathOnAmx) {
  for (CpuPath path : {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_fma, CpuPath::avx512_bf16})
    EXPECT_EQ(vector_path(path), path) << cpu_path_name(path);
  const CpuPath vector = vector_path(CpuPath::amx_bf16);
  EXPECT_EQ(vector, faster_avx512_path(avx512_product_rates()));
}

#ifdef WRITESCOPE_HOST_AVX512_BF16
// The AVX-512 peak loops run the chains that the rates count: with no steps,
// their sums are the chains' starting values, seed + chain in each of 16 lanes.
TEST(CpuPath, Avx512PeakLoopsRunTheChainsTheirRatesCount) {
  if (!cpu_path_supported(CpuPath::avx512_bf16)) GTEST_SKIP() << "no AVX-512 BF16 here";
  constexpr int chains = impl::avx512_peak_chains;
  const float starts = 16.0f * (chains * 0.5f + chains * (chains - 1) / 2.0f);
  EXPECT_EQ(impl::bf16_dot_chains(0.5f, 0), starts);
  EXPECT_EQ(impl::fp32_fma16_chains(0.5f, 0), starts);
}
#endif

TEST(CpuPath, UnknownOrUnsupportedPathsAreRefusedByName) {
  try {
    parse_cpu_path("avx512");
    FAIL() << "an unknown name was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(
                  "unknown CPU path 'avx512' (known: scalar, avx2, avx512_fma, avx512_bf16, amx_bf16)"),
              std::string::npos)
        << error.what();
  }
  for (CpuPath path :
       {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_fma, CpuPath::avx512_bf16, CpuPath::amx_bf16}) {
    EXPECT_EQ(parse_cpu_path(cpu_path_name(path)), path);
    if (!cpu_path_supported(path)) {
      EXPECT_THROW(set_cpu_path(path), std::invalid_argument);
      EXPECT_EQ(active_cpu_path(), best_cpu_path());
    }
  }
}

}  // namespace
}  // namespace writescope
