// Google Benchmark main for WriteScope: one Kokkos runtime, and a context that
// says what the numbers were measured with.
#include <benchmark/benchmark.h>

#include "attention/host_prefetch.hpp"
#include "framework/machine.hpp"
#include "framework/runtime.hpp"

#include <iostream>
#include <sstream>

namespace {

/// Kokkos' multi-line configuration as one line ("a; b; c") for the context.
std::string one_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, out;
  while (std::getline(lines, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    out += (out.empty() ? "" : "; ") + line.substr(first);
  }
  return out;
}

}  // namespace

int main(int argc, char* argv[]) try {
  writescope::Runtime runtime(argc, argv);
  const auto machine = writescope::MachineDescription::detect();
  for (const auto& [name, value] : machine.fields()) {
    std::visit([&, &name = name](const auto& v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
        benchmark::AddCustomContext(name, name == "kokkos_configuration" ? one_line(v) : v);
      else benchmark::AddCustomContext(name, std::to_string(v));
    }, value);
  }
  // Measured here, per attention shape, before any benchmark, rather than inside the first one's warm-up.
  for (const writescope::AttentionShape& shape : writescope::supported_attention_shapes()) {
    benchmark::AddCustomContext("cpu_decode_path " + shape.name, writescope::describe_decode_cpu_paths(shape));
    benchmark::AddCustomContext("next_pass_prefetch " + shape.name, writescope::describe_next_pass_prefetch(shape));
    benchmark::AddCustomContext("token_major_pass " + shape.name, writescope::describe_token_major_pass(shape));
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
