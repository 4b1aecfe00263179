#pragma once
// The `writescope` command line. Later issues add calibrate, run, generate.

#include <iosfwd>
#include <string>
#include <vector>

namespace writescope {

/// Runs one command; returns the process exit status (0 ok, 1 failure, 2 usage
/// error). Kokkos' --kokkos-* options are consumed before dispatch.
int run_cli(int argc, char* argv[], std::ostream& out, std::ostream& err);

/// `writescope info [--format text|yaml]` once Kokkos runs: the spaces, the
/// machine and where each CPU decode product runs; yaml: the machine's fields
/// as results store them, then `spaces`, `cpu_decode` (per shape and CPU
/// region: `path`, `chosen`; `next_pass_prefetch`, `token_major_pass`),
/// `amx_bf16` and, where pinned, `cpu_path_pinned_by` and `best_cpu_path`.
int info_command(const std::vector<std::string>& args, std::ostream& out);

}  // namespace writescope
