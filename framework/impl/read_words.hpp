#pragma once
// The DRAM-read workload of the host bounds (experiments/calibration.cpp),
// without Kokkos: read_words.cpp is built by the host compiler alone in both
// variants (writescope_host_kernels in cmake/WriteScopeTarget.cmake).

#include <cstdint>
#include <vector>

namespace writescope::impl {

/// Load widths (bytes) sum_words can read with on this CPU in this build,
/// narrowest first: 8 (the plain loop, as the compiler vectorises it) always,
/// 32 with AVX2, 64 with AVX-512F.
const std::vector<int>& supported_load_bytes();
/// The last of them: the widest loads this CPU runs.
int widest_load_bytes();

/// Sum (mod 2^64) of words[0, count), read with `load_bytes`-wide loads (one
/// of supported_load_bytes(); else std::invalid_argument) into independent
/// chains. Why the width matters: on the Intel VM of 2026-12-01, two threads
/// read DRAM at 25-27 GB/s with 64-byte loads, 21-23 GB/s with 32-byte ones
/// and 19 GB/s with a compiler-vectorised sum into one chain, so a narrower
/// reader understates the DRAM roof that the AVX-512 kernels are held to.
std::uint64_t sum_words(const std::uint64_t* words, std::int64_t count, int load_bytes);

}  // namespace writescope::impl
