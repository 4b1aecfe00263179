// One Kokkos runtime for the whole test binary.
#include <gtest/gtest.h>

#include "framework/runtime.hpp"

int main(int argc, char* argv[]) {
  writescope::Runtime runtime(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
