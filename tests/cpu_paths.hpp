#pragma once
// Runs a test body once per CPU instruction path this machine and build run,
// with that path pinned; names the paths skipped.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "framework/cpu_path.hpp"

namespace writescope::test {

template <class Body>
void for_each_cpu_path(Body&& body) {
  for (CpuPath path :
       {CpuPath::scalar, CpuPath::avx2, CpuPath::avx512_fma, CpuPath::avx512_bf16, CpuPath::amx_bf16}) {
    if (!cpu_path_supported(path)) {
      std::cout << "[ SKIPPED  ] CPU path " << cpu_path_name(path) << ": not supported by this CPU or build\n";
      continue;
    }
    ScopedCpuPath pinned(path);
    SCOPED_TRACE(std::string("CPU path ") + cpu_path_name(path));
    body(path);
  }
}

}  // namespace writescope::test
