#pragma once
// What a result was measured on: stored with every result so it can be
// reproduced and compared across machines.

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace writescope {

class ResultsGroup;

struct MachineDescription {
  using Value = std::variant<std::string, std::int64_t>;

  std::string hostname;
  std::string operating_system;  // uname: sysname release machine
  std::string cpu_model;
  std::string cpu_paths;            // host kernel paths this CPU and build run, comma-separated
  std::string cpu_path;             // the one host kernels take (framework/cpu_path.hpp)
  std::string amx;                  // amx_description(), and why amx_bf16 is not offered where CPUID has AMX
  std::int64_t logical_cpus = 0;    // online CPUs
  std::int64_t host_threads = 0;    // Kokkos host execution space concurrency
  std::string openmp_environment;   // OMP_* variables as set, "" when none
  std::string thread_placement;     // where the Runtime put OpenMP and the GPU driver (runtime.hpp)
  std::int64_t memory_bytes = 0;    // MemTotal
  std::string huge_pages;           // transparent huge page mode (host_memory.hpp): KV pools and weights use them
  std::int64_t dram_read_load_bytes = 0;  // load width of the host DRAM-read bound (framework/impl/read_words.hpp)
  std::string gpu_name;             // "" in a host-only build
  std::int64_t gpu_memory_bytes = 0;
  std::string gpu_compute_capability;
  std::string kokkos_version;
  std::string enabled_exec_spaces;  // comma-separated, EnabledExecSpaces order
  std::string kokkos_configuration; // Kokkos::print_configuration, detailed
  std::string compiler;
  std::string build_type;
  // An experiment's: per model, the choices its CPU decode attention measured
  // in this process (attention/host_prefetch.hpp host_attention_choices), one
  // "model: choices" line each; "" elsewhere (detect() leaves it).
  std::string host_attention_choices;
  std::string git_revision;         // `git describe --always --dirty` at build time
  std::string writescope_version;

  /// Reads the running machine; needs an initialized Kokkos runtime.
  static MachineDescription detect();

  /// Every field, in declaration order, named as in this struct.
  std::vector<std::pair<std::string, Value>> fields() const;
  /// Stores every field as an attribute of `group`.
  void store(ResultsGroup& group) const;
  /// The fields as a YAML mapping.
  std::string to_yaml() const;
  /// machine_setup_differences(stored_yaml, to_yaml()).
  std::vector<std::string> setup_differences(const std::string& stored_yaml) const;
};

/// Where the setup that decides measurements (CPU, its paths, thread count
/// and OpenMP settings and placement, memory, GPU, Kokkos, compiler, build
/// type, an experiment's host attention choices) of machine description
/// `now_yaml` differs from `then_yaml` (both
/// MachineDescription::to_yaml()), one "field: 'then' -> 'now'" each; empty
/// when the same. Host name and git revision are not setup: containers and
/// cluster nodes differ in names, and runs record their revision; nor is
/// amx, which no kernel uses (the CPU model and its paths already differ).
std::vector<std::string> machine_setup_differences(const std::string& then_yaml, const std::string& now_yaml);

/// Bytes of memory this process can still allocate without the kernel
/// killing it: /proc/meminfo's MemAvailable, or less when a cgroup (a
/// container, a batch job) or an address-space limit (`ulimit -v`) limits the
/// process to less. Only for checks made
/// before allocating; it changes as other processes run.
std::uint64_t available_host_memory();

/// The revision this binary was built from (see cmake/GitRevision.cmake).
const char* git_revision();

}  // namespace writescope
