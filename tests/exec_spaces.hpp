#pragma once
// Typed-test parameter list: every enabled execution space once.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "framework/spaces.hpp"

namespace writescope::test {

template <class Tuple>
struct AsGTestTypes;
template <class... Spaces>
struct AsGTestTypes<std::tuple<Spaces...>> {
  using type = ::testing::Types<Spaces...>;
};

using ExecSpaceTypes = typename AsGTestTypes<EnabledExecSpaces>::type;

/// An execution space paired with a storage type, for kernels templated on both.
template <class ExecSpace, class Scalar>
struct SpaceAndScalar {
  using Exec = ExecSpace;
  using Storage = Scalar;
};

/// ::testing::Types of SpaceAndScalar for every enabled space and every Scalars.
template <class Space, class... Scalars>
struct SpaceRow {
  using type = std::tuple<SpaceAndScalar<Space, Scalars>...>;
};
template <class Tuple, class... Scalars>
struct SpacesTimesScalars;
template <class... Spaces, class... Scalars>
struct SpacesTimesScalars<std::tuple<Spaces...>, Scalars...> {
  using tuple = decltype(std::tuple_cat(std::declval<typename SpaceRow<Spaces, Scalars...>::type>()...));
  using type = typename AsGTestTypes<tuple>::type;
};

/// Test names read "OpenMP", "Cuda", "Serial" instead of 0, 1, 2.
struct ExecSpaceName {
  template <class Space>
  static std::string GetName(int) {
    return Space::name();
  }
};

/// Test names read "OpenMP_float", "Serial_bf16", ...
struct SpaceAndScalarName {
  template <class Case>
  static std::string GetName(int) {
    return std::string(Case::Exec::name()) + (std::is_same_v<typename Case::Storage, float> ? "_float" : "_bf16");
  }
};

}  // namespace writescope::test
