#pragma once
// Runs a test body once per CPU instruction path this machine and build run,
// with that path pinned; names the paths skipped.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "framework/cpu_path.hpp"

namespace writescope::test {

/// Why `path` does not run here, for skip messages: for amx_bf16, the check
/// that refused it.
inline std::string unsupported_reason(CpuPath path) {
  return path == CpuPath::amx_bf16 ? amx_bf16_unavailable_reason() : "not supported by this CPU or build";
}

template <class Body>
void for_each_cpu_path(Body&& body) {
  for (CpuPath path :
       {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_fma, CpuPath::avx512_bf16, CpuPath::amx_bf16}) {
    if (!cpu_path_supported(path)) {
      std::cout << "[ SKIPPED  ] CPU path " << cpu_path_name(path) << ": " << unsupported_reason(path) << "\n";
      continue;
    }
    ScopedCpuPath pinned(path);
    SCOPED_TRACE(std::string("CPU path ") + cpu_path_name(path));
    body(path);
  }
}

}  // namespace writescope::test
