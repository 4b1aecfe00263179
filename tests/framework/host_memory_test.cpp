#include "framework/host_memory.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include "framework/spaces.hpp"

namespace writescope {
namespace {

TEST(HostMemory, NamesTheTransparentHugePageMode) {
  const std::string mode = transparent_huge_pages();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never" || mode == "unavailable") << mode;
}

// An advised host allocation carries the huge-page advice (whether the
// kernel then finds free huge pages depends on the machine's load); a plain
// one does not, nor does a range without a whole huge page inside. The plain
// one is a fresh mapping: memory from the allocator may lie where an earlier
// test's advised allocation was, and keep its advice after the free.
TEST(HostMemory, AdvisesHostMemoryForHugePages) {
  if (!huge_pages_advisable()) GTEST_SKIP() << "transparent huge pages: " << transparent_huge_pages();
  constexpr std::size_t bytes = std::size_t{16} << 20;
  Kokkos::View<char*, HostMemSpace> advised(Kokkos::view_alloc(std::string("advised"), Kokkos::WithoutInitializing),
                                            bytes);
  void* plain = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(plain, MAP_FAILED);
  advise_huge_pages(advised);
  EXPECT_TRUE(huge_pages_advised(advised.data(), bytes));
  EXPECT_FALSE(huge_pages_advised(plain, bytes));
  munmap(plain, bytes);
  char small[4096] = {};
  advise_huge_pages(small, sizeof small);
  EXPECT_FALSE(huge_pages_advised(small, sizeof small));
}

}  // namespace
}  // namespace writescope
