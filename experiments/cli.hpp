#pragma once
// The `writescope` command line. Later issues add calibrate, run, generate.

#include <iosfwd>

namespace writescope {

/// Runs one command; returns the process exit status (0 ok, 1 failure, 2 usage
/// error). Kokkos' --kokkos-* options are consumed before dispatch.
int run_cli(int argc, char* argv[], std::ostream& out, std::ostream& err);

}  // namespace writescope
