#include "framework/impl/read_words.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/cpu_path.hpp"

namespace writescope {
namespace {

TEST(ReadWords, EveryLoadWidthSumsAsThePlainLoopDoes) {
  // Lengths around the widest step (4 chains x 8 words) and starts off any
  // vector alignment, so that the tails and unaligned loads are exercised.
  std::vector<std::uint64_t> words(5000);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
  for (int width : impl::supported_load_bytes())
    for (std::int64_t first : {0, 1, 3})
      for (std::int64_t count : {0, 1, 31, 32, 33, 4093}) {
        const std::uint64_t expected =
            std::accumulate(words.begin() + first, words.begin() + first + count, std::uint64_t{0});
        EXPECT_EQ(impl::sum_words(words.data() + first, count, width), expected)
            << width << "-byte loads, words [" << first << ", " << first + count << ")";
      }
}

TEST(ReadWords, TheWidestLoadsAreThoseOfTheAvx512PathsWhereTheyRun) {
  const std::vector<int>& widths = impl::supported_load_bytes();
  EXPECT_EQ(widths.front(), 8);
  EXPECT_TRUE(std::is_sorted(widths.begin(), widths.end()));
  EXPECT_EQ(impl::widest_load_bytes(), widths.back());
  // The DRAM roof of an AVX-512 kernel is read with 64-byte loads.
  if (cpu_path_supported(CpuPath::avx512_fma)) {
    EXPECT_EQ(impl::widest_load_bytes(), 64);
  } else if (cpu_path_supported(CpuPath::avx2)) {
    EXPECT_GE(impl::widest_load_bytes(), 32);
  }
}

TEST(ReadWords, AWidthTheCpuDoesNotRunNamesTheWidth) {
  const std::uint64_t word = 1;
  try {
    impl::sum_words(&word, 1, 16);
    FAIL() << "16-byte loads accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("load_bytes 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace writescope
