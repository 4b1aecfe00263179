// One Kokkos runtime for the whole test binary.
#include <gtest/gtest.h>

#include "framework/runtime.hpp"

#include <cstdlib>
#include <iostream>

int main(int argc, char* argv[]) {
  // Kokkos warns on stdout when OMP_PROC_BIND is unset, and ctest's test
  // discovery (--gtest_list_tests) would read the warning as three test
  // names. The OpenMP runtime has already started unbound: say so.
  setenv("OMP_PROC_BIND", "false", /*overwrite=*/0);
  try {
    writescope::Runtime runtime(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  } catch (const writescope::RuntimeError& e) {
    std::cerr << "writescope_tests: " << e.what() << "\n";
    return 1;
  }
}
