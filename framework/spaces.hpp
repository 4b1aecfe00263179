#pragma once
// Execution and memory spaces used throughout WriteScope.
//
// In a CUDA build the GPU aliases name Kokkos' CUDA spaces and the pinned space
// is page-locked host memory the GPU can DMA from. In a host-only build every
// alias collapses onto the host, so the same code paths (and tests) run there,
// only slower.

#include <Kokkos_Core.hpp>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace writescope {

using HostExecSpace = Kokkos::DefaultHostExecutionSpace;
using HostMemSpace = Kokkos::HostSpace;

#ifdef KOKKOS_ENABLE_CUDA
using GpuExecSpace = Kokkos::Cuda;
using GpuMemSpace = Kokkos::CudaSpace;
/// Page-locked host memory: DMA-able by the GPU, ordinary DRAM to the CPU.
using PinnedMemSpace = Kokkos::CudaHostPinnedSpace;
inline constexpr bool has_gpu = true;
#else
using GpuExecSpace = HostExecSpace;
using GpuMemSpace = HostMemSpace;
using PinnedMemSpace = HostMemSpace;
inline constexpr bool has_gpu = false;
#endif

/// True for execution spaces that run on the host and use host memory.
template <class ExecSpace>
inline constexpr bool is_host_exec_space = Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible &&
                                           std::is_same_v<typename ExecSpace::memory_space, Kokkos::HostSpace>;

namespace impl {

template <class List, class T>
struct contains;
template <class T, class... Ts>
struct contains<std::tuple<Ts...>, T>
    : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};

template <class Done, class... Rest>
struct deduplicate {
  using type = Done;
};
template <class... Done, class T, class... Rest>
struct deduplicate<std::tuple<Done...>, T, Rest...> {
  using type = typename std::conditional_t<
      contains<std::tuple<Done...>, T>::value,
      deduplicate<std::tuple<Done...>, Rest...>,
      deduplicate<std::tuple<Done..., T>, Rest...>>::type;
};

}  // namespace impl

/// Every enabled execution space exactly once, as a std::tuple of types
/// (e.g. <Cuda, OpenMP, Serial> or, host-only, <OpenMP, Serial>). Kernels are
/// tested on each of them.
using EnabledExecSpaces = typename impl::deduplicate<std::tuple<>, GpuExecSpace,
                                                     HostExecSpace
#ifdef KOKKOS_ENABLE_SERIAL
                                                     ,
                                                     Kokkos::Serial
#endif
                                                     >::type;

/// Human-readable names of the enabled execution spaces, in EnabledExecSpaces order.
template <class Tuple = EnabledExecSpaces>
struct ExecSpaceNames;
template <class... Spaces>
struct ExecSpaceNames<std::tuple<Spaces...>> {
  static std::vector<std::string> get() { return {Spaces::name()...}; }
};

}  // namespace writescope
