// One Kokkos runtime for the whole test binary.
#include <gtest/gtest.h>

#include "framework/runtime.hpp"

#include <iostream>

int main(int argc, char* argv[]) {
  try {
    writescope::Runtime runtime(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  } catch (const writescope::RuntimeError& e) {
    std::cerr << "writescope_tests: " << e.what() << "\n";
    return 1;
  }
}
