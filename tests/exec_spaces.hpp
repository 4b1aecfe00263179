#pragma once
// Typed-test parameter list: every enabled execution space once.
#include <gtest/gtest.h>

#include <tuple>

#include "framework/spaces.hpp"

namespace writescope::test {

template <class Tuple>
struct AsGTestTypes;
template <class... Spaces>
struct AsGTestTypes<std::tuple<Spaces...>> {
  using type = ::testing::Types<Spaces...>;
};

using ExecSpaceTypes = typename AsGTestTypes<EnabledExecSpaces>::type;

/// Test names read "OpenMP", "Cuda", "Serial" instead of 0, 1, 2.
struct ExecSpaceName {
  template <class Space>
  static std::string GetName(int) {
    return Space::name();
  }
};

}  // namespace writescope::test
