// Google Benchmark main for WriteScope: one Kokkos runtime, and a context that
// says what the numbers were measured with.
#include <benchmark/benchmark.h>

#include "framework/machine.hpp"
#include "framework/runtime.hpp"

#include <iostream>

int main(int argc, char* argv[]) try {
  writescope::Runtime runtime(argc, argv);
  const auto machine = writescope::MachineDescription::detect();
  for (const auto& [name, value] : machine.fields()) {
    if (name == "kokkos_configuration") continue;  // multi-line; the fields below summarise it
    std::visit([&, &name = name](const auto& v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) benchmark::AddCustomContext(name, v);
      else benchmark::AddCustomContext(name, std::to_string(v));
    }, value);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
} catch (const writescope::RuntimeError& e) {
  std::cerr << "writescope_benchmarks: " << e.what() << "\n";
  return 1;
}
