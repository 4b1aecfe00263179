#include "framework/impl/fma_stream.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/cpu_path.hpp"

namespace writescope {
namespace {

struct alignas(64) Line {
  float lanes[16];
};

// Every line read once and multiplied in fmas_per_line times, on every path
// that runs here: small integers, so that any order of the sums is exact.
TEST(FmaStream, MultipliesEveryLineInAsManyTimesAsAsked) {
  std::vector<Line> lines(301);
  for (std::size_t i = 0; i < lines.size(); ++i)
    for (int lane = 0; lane < 16; ++lane) lines[i].lanes[lane] = static_cast<float>((i * 16 + lane) % 5) - 1;
  for (CpuPath path : supported_cpu_paths())
    for (int fmas : impl::fma_stream_intensities)
      for (std::int64_t count : {0, 1, 7, 301})
        for (std::int64_t prefetch : {0, 4096}) {
          double read = 0;
          for (std::int64_t i = 0; i < count; ++i)
            for (float value : lines[i].lanes) read += value;
          EXPECT_EQ(impl::fma_stream(path, lines.data()->lanes, count, fmas, 2.0f, prefetch), 2.0 * fmas * read)
              << cpu_path_name(path) << ", " << fmas << " FMAs per line, " << count << " lines, prefetch "
              << prefetch;
        }
}

TEST(FmaStream, AnIntensityItDoesNotRunNamesIt) {
  const Line line{};
  try {
    impl::fma_stream(CpuPath::scalar, line.lanes, 1, 3, 1.0f, 0);
    FAIL() << "3 FMAs per line accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 FMAs per line (one of 2, 4, 8, 16, 32, 64)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace writescope
