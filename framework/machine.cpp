#include "framework/machine.hpp"

#include <Kokkos_Core.hpp>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <sstream>

#include "framework/config.hpp"
#include "framework/cpu_path.hpp"
#include "framework/impl/read_words.hpp"
#include "framework/host_memory.hpp"
#include "framework/results_store.hpp"
#include "framework/runtime.hpp"
#include "framework/spaces.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

#ifndef WRITESCOPE_BUILD_TYPE
#define WRITESCOPE_BUILD_TYPE "unknown"
#endif
#ifndef WRITESCOPE_VERSION
#define WRITESCOPE_VERSION "unknown"
#endif

extern "C" const char* writescope_git_revision_string();

namespace writescope {
namespace {

/// Value of the first "key : value" line of a /proc file whose key is `key`.
std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    if (name != key) continue;
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return "";
}

std::string read_openmp_environment() {
  std::string out;
  for (const char* name : {"OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_SCHEDULE"}) {
    if (const char* value = std::getenv(name)) out += (out.empty() ? "" : " ") + std::string(name) + "=" + value;
  }
  return out;
}

std::string compiler_description() {
  std::ostringstream out;
#if defined(__clang__)
  out << "clang " << __clang_major__ << "." << __clang_minor__ << "." << __clang_patchlevel__;
#elif defined(__GNUC__)
  out << "gcc " << __GNUC__ << "." << __GNUC_MINOR__ << "." << __GNUC_PATCHLEVEL__;
#endif
#ifdef __CUDACC_VER_MAJOR__
  out << ", nvcc " << __CUDACC_VER_MAJOR__ << "." << __CUDACC_VER_MINOR__;
#endif
  return out.str();
}

}  // namespace

const char* git_revision() { return writescope_git_revision_string(); }

namespace {

std::optional<std::uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  return std::stoull(text);  // "max" (no limit) is not a number
}

/// The value of `key` in a memory.stat file ("inactive_file 123").
std::uint64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string name;
  std::uint64_t value = 0;
  while (in >> name >> value)
    if (name == key) return value;
  return 0;
}

/// What the memory cgroups of this process (and their ancestors, up to the
/// mount) still allow it: limit less use, reclaimable page cache counted free.
std::uint64_t cgroup_room() {
  std::uint64_t room = std::numeric_limits<std::uint64_t>::max();
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {
    // v2: "0::/path"; v1: "7:memory:/path".
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool v2 = controllers.empty(), v1 = controllers.find("memory") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string mount = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    for (std::filesystem::path group = line.substr(second + 1);; group = group.parent_path()) {
      const std::string dir = mount + (group == "/" ? std::string() : group.string());
      const auto limit = read_number(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"));
      const auto usage = read_number(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
      if (limit && usage) {
        const std::uint64_t cache = stat_value(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
        const std::uint64_t used = *usage > cache ? *usage - cache : 0;
        room = std::min(room, *limit > used ? *limit - used : 0);
      }
      if (group == "/" || group.empty() || group == group.parent_path()) break;
    }
  }
  return room;
}

/// What the address-space limit (`ulimit -v`) leaves this process beyond
/// what it has mapped: allocations past it fail however much memory is free.
std::uint64_t address_space_room() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
    return std::numeric_limits<std::uint64_t>::max();
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  statm >> pages;
  const std::uint64_t mapped = pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return limit.rlim_cur > mapped ? limit.rlim_cur - mapped : 0;
}

}  // namespace

std::uint64_t available_host_memory() {
  std::uint64_t available = std::numeric_limits<std::uint64_t>::max();
  const std::string mem_available = proc_field("/proc/meminfo", "MemAvailable");  // "20123456 kB"
  if (!mem_available.empty()) available = std::stoull(mem_available) * 1024;
  return std::min({available, cgroup_room(), address_space_room()});
}

MachineDescription MachineDescription::detect() {
  MachineDescription m;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) m.hostname = host;
  utsname uts{};
  if (uname(&uts) == 0) m.operating_system = std::string(uts.sysname) + " " + uts.release + " " + uts.machine;
  m.cpu_model = proc_field("/proc/cpuinfo", "model name");
  for (CpuPath path : supported_cpu_paths())
    m.cpu_paths += (m.cpu_paths.empty() ? "" : ", ") + std::string(cpu_path_name(path));
  m.cpu_path = cpu_path_name(active_cpu_path());
  m.amx = amx_description();
  if (!cpu_path_supported(CpuPath::amx_bf16) && m.amx != "not in CPUID")
    m.amx += "; amx_bf16 not offered: " + amx_bf16_unavailable_reason();
  m.logical_cpus = sysconf(_SC_NPROCESSORS_ONLN);
  m.host_threads = HostExecSpace().concurrency();
  m.openmp_environment = read_openmp_environment();
  m.thread_placement = writescope::thread_placement();
  const std::string mem_total = proc_field("/proc/meminfo", "MemTotal");  // "24576000 kB"
  if (!mem_total.empty()) m.memory_bytes = std::stoll(mem_total) * 1024;
  m.huge_pages = transparent_huge_pages();
  m.dram_read_load_bytes = impl::widest_load_bytes();
#ifdef KOKKOS_ENABLE_CUDA
  cudaDeviceProp prop{};
  const int device = Kokkos::Cuda().cuda_device();
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    m.gpu_name = prop.name;
    m.gpu_memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    m.gpu_compute_capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  }
#endif
  m.kokkos_version = std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) +
                     "." + std::to_string(KOKKOS_VERSION % 100);
  for (const auto& name : ExecSpaceNames<>::get())
    m.enabled_exec_spaces += (m.enabled_exec_spaces.empty() ? "" : ",") + name;
  m.kokkos_configuration = writescope::kokkos_configuration();
  m.compiler = compiler_description();
  m.build_type = WRITESCOPE_BUILD_TYPE;
  m.git_revision = writescope::git_revision();
  m.writescope_version = WRITESCOPE_VERSION;
  return m;
}

std::vector<std::pair<std::string, MachineDescription::Value>> MachineDescription::fields() const {
  return {{"hostname", hostname},
          {"operating_system", operating_system},
          {"cpu_model", cpu_model},
          {"cpu_paths", cpu_paths},
          {"cpu_path", cpu_path},
          {"amx", amx},
          {"logical_cpus", logical_cpus},
          {"host_threads", host_threads},
          {"openmp_environment", openmp_environment},
          {"thread_placement", thread_placement},
          {"memory_bytes", memory_bytes},
          {"huge_pages", huge_pages},
          {"dram_read_load_bytes", dram_read_load_bytes},
          {"gpu_name", gpu_name},
          {"gpu_memory_bytes", gpu_memory_bytes},
          {"gpu_compute_capability", gpu_compute_capability},
          {"kokkos_version", kokkos_version},
          {"enabled_exec_spaces", enabled_exec_spaces},
          {"kokkos_configuration", kokkos_configuration},
          {"compiler", compiler},
          {"build_type", build_type},
          {"host_attention_choices", host_attention_choices},
          {"git_revision", git_revision},
          {"writescope_version", writescope_version}};
}

void MachineDescription::store(ResultsGroup& group) const {
  for (const auto& [name, value] : fields())
    std::visit([&, &name = name](const auto& v) { group.set_attribute(name, v); }, value);
}

std::string MachineDescription::to_yaml() const {
  YAML::Emitter yaml;
  yaml << YAML::BeginMap;
  for (const auto& [name, value] : fields()) {
    yaml << YAML::Key << name << YAML::Value;
    if (const auto* text = std::get_if<std::string>(&value)) {
      if (text->find('\n') != std::string::npos) yaml << YAML::Literal;
      yaml << *text;
    } else {
      yaml << std::get<std::int64_t>(value);
    }
  }
  yaml << YAML::EndMap;
  return yaml.c_str();
}

std::vector<std::string> MachineDescription::setup_differences(const std::string& stored_yaml) const {
  return machine_setup_differences(stored_yaml, to_yaml());
}

std::vector<std::string> machine_setup_differences(const std::string& then_yaml, const std::string& now_yaml) {
  static const char* const setup[] = {"cpu_model",       "cpu_paths",          "cpu_path",        "logical_cpus",
                                      "host_threads",    "openmp_environment", "thread_placement", "memory_bytes",
                                      "huge_pages",      "dram_read_load_bytes",
                                      "gpu_name",        "gpu_memory_bytes",   "gpu_compute_capability",
                                      "kokkos_version",  "enabled_exec_spaces", "compiler",        "build_type",
                                      "host_attention_choices"};
  const YAML::Node then = ConfigNode::parse(then_yaml, "a recorded machine setup").yaml(),
                   now = ConfigNode::parse(now_yaml, "a machine setup").yaml();
  auto value = [](const YAML::Node& machine, const char* name) {
    return machine[name] && machine[name].IsScalar() ? machine[name].Scalar() : std::string("(not recorded)");
  };
  std::vector<std::string> differences;
  for (const char* name : setup)
    if (value(then, name) != value(now, name))
      differences.push_back(std::string(name) + ": '" + value(then, name) + "' -> '" + value(now, name) + "'");
  return differences;
}

}  // namespace writescope
