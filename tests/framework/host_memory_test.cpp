#include "framework/host_memory.hpp"

#include <gtest/gtest.h>

#include "framework/spaces.hpp"

namespace writescope {
namespace {

TEST(HostMemory, NamesTheTransparentHugePageMode) {
  const std::string mode = transparent_huge_pages();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never" || mode == "unavailable") << mode;
}

// An advised host allocation is backed by 2 MiB pages once touched, where the
// kernel grants them on advice; a plain one under "madvise" is not.
TEST(HostMemory, AdvisedHostMemoryGetsHugePages) {
  const std::string mode = transparent_huge_pages();
  if (mode != "always" && mode != "madvise") GTEST_SKIP() << "transparent huge pages: " << mode;
  constexpr std::size_t bytes = std::size_t{16} << 20;
  Kokkos::View<char*, HostMemSpace> advised(Kokkos::view_alloc(std::string("advised"), Kokkos::WithoutInitializing),
                                            bytes);
  advise_huge_pages(advised);
  Kokkos::deep_copy(advised, 1);
  EXPECT_GE(huge_page_bytes(advised.data(), bytes), std::size_t{2} << 20);
  if (mode == "madvise") {
    Kokkos::View<char*, HostMemSpace> plain(Kokkos::view_alloc(std::string("plain"), Kokkos::WithoutInitializing),
                                            bytes);
    Kokkos::deep_copy(plain, 1);
    EXPECT_EQ(huge_page_bytes(plain.data(), bytes), 0u);
  }
}

TEST(HostMemory, SmallRangesAreLeftAlone) {
  char small[4096] = {};
  advise_huge_pages(small, sizeof small);  // no whole huge page inside: nothing to advise
  EXPECT_EQ(huge_page_bytes(small, sizeof small), 0u);
}

}  // namespace
}  // namespace writescope
