#pragma once
// The Kokkos runtime for a WriteScope program: one per process, alive for the
// whole main(). A CUDA build checks for a usable GPU first, so a machine
// without one gets a clear error instead of an abort inside Kokkos.

#include <Kokkos_Core.hpp>

#include <optional>
#include <stdexcept>
#include <string>

namespace writescope {

class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Runtime {
 public:
  /// Consumes Kokkos' own --kokkos-* arguments from argv.
  Runtime(int& argc, char* argv[]);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  std::optional<Kokkos::ScopeGuard> guard_;
};

/// Kokkos' print_configuration output (backends, architecture, options).
std::string kokkos_configuration();

}  // namespace writescope
