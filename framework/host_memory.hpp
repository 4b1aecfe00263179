#pragma once
// Host allocations that kernels stream (KV pools, expert weights) backed by
// transparent huge pages.
//
// Why: a CPU decode step walks a block's keys and values in passes and
// requests the next pass ahead; with 4 KiB pages most of those requests also
// miss the TLB, and under a hypervisor each miss is a two-level page walk.
// Measured on a Zen 5 VM (one core, 512 MiB of KV): CPU decode attention
// 13-24% faster from 2 MiB pages, while a plain sequential read gains < 5%,
// so DRAM-read bounds are measured on memory advised the same way.

#include <cstddef>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

namespace writescope {

/// The kernel's transparent huge page mode: "always", "madvise" or "never"
/// (the bracketed choice of /sys/kernel/mm/transparent_hugepage/enabled), or
/// "unavailable" where the kernel has none.
std::string transparent_huge_pages();

/// Bytes of the last-level cache: the C library's figure (a VM may report
/// its host's whole L3: 508 MiB on a 2-vCPU Zen 5 VM), 32 MiB, a Zen CCD's,
/// where it gives none.
std::int64_t last_level_cache_bytes();

/// Whether that mode acts on advice ("always" or "madvise").
bool huge_pages_advisable();

/// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes)
/// with huge pages (madvise MADV_HUGEPAGE); call it before the first touch.
/// Does nothing for less than one huge page, nor where the mode is "never"
/// or unavailable: an advice, not a requirement.
void advise_huge_pages(const void* data, std::size_t bytes);

/// The same for a View's memory when it lives in Kokkos::HostSpace (other
/// spaces, e.g. CUDA's page-locked host space, are left as allocated).
template <class View>
void advise_huge_pages(const View& view) {
  if constexpr (std::is_same_v<typename View::memory_space, Kokkos::HostSpace>)
    advise_huge_pages(view.data(), view.span() * sizeof(typename View::value_type));
}

/// Whether the mapping that holds the first whole 2 MiB page inside
/// [data, data + bytes) carries the huge-page advice (VmFlags "hg" in
/// /proc/self/smaps): what advise_huge_pages asked for, whether or not the
/// kernel had free huge pages at the first touch. False without a whole
/// huge page inside or where smaps cannot be read.
bool huge_pages_advised(const void* data, std::size_t bytes);

}  // namespace writescope
