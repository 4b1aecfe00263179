#include "experiments/cli.hpp"

#include <yaml-cpp/yaml.h>

#include <iostream>
#include <string>
#include <vector>

#include "framework/config.hpp"
#include "framework/machine.hpp"
#include "framework/results_store.hpp"
#include "framework/runtime.hpp"
#include "framework/spaces.hpp"

namespace writescope {
namespace {

constexpr const char* usage_text =
    "usage: writescope <command> [options]\n"
    "\n"
    "commands:\n"
    "  info [--format text|yaml]   Kokkos configuration, enabled spaces, devices and memory\n"
    "  help                        this text\n"
    "\n"
    "Kokkos options (--kokkos-num-threads=N, --kokkos-device-id=N, ...) may be given anywhere.\n";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class Space>
std::string space_name() {
  return Space::name();
}

void print_text(std::ostream& out, const MachineDescription& machine) {
  out << "WriteScope " << machine.writescope_version << " (" << machine.git_revision << ", "
      << machine.build_type << ", " << machine.compiler << ")\n\n";
  out << "Spaces\n"
      << "  execution spaces (tested): " << machine.enabled_exec_spaces << "\n"
      << "  GPU execution space:       " << space_name<GpuExecSpace>()
      << (has_gpu ? "" : "  (host-only build: the GPU path runs on the host)") << "\n"
      << "  GPU memory space:          " << space_name<GpuMemSpace>() << "\n"
      << "  pinned memory space:       " << space_name<PinnedMemSpace>() << "\n"
      << "  host memory space:         " << space_name<HostMemSpace>() << "\n\n";
  out << "Machine\n";
  for (const auto& [name, value] : machine.fields()) {
    if (name == "kokkos_configuration") continue;
    out << "  " << name << ": ";
    std::visit([&](const auto& v) { out << v; }, value);
    out << "\n";
  }
  out << "\nKokkos configuration\n" << machine.kokkos_configuration;
}

void print_yaml(std::ostream& out, const MachineDescription& machine) {
  YAML::Emitter yaml;
  yaml << YAML::BeginMap;
  for (const auto& [name, value] : machine.fields()) {
    yaml << YAML::Key << name << YAML::Value;
    if (const auto* text = std::get_if<std::string>(&value)) {
      if (text->find('\n') != std::string::npos) yaml << YAML::Literal;
      yaml << *text;
    } else {
      yaml << std::get<std::int64_t>(value);
    }
  }
  yaml << YAML::EndMap;
  out << yaml.c_str() << "\n";
}

int info_command(const std::vector<std::string>& args, std::ostream& out) {
  std::string format = "text";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--format" && i + 1 < args.size()) {
      format = args[++i];
    } else if (args[i].rfind("--format=", 0) == 0) {
      format = args[i].substr(9);
    } else {
      throw UsageError("info: unknown option '" + args[i] + "'");
    }
  }
  if (format != "text" && format != "yaml")
    throw UsageError("info: --format must be text or yaml, got '" + format + "'");
  const MachineDescription machine = MachineDescription::detect();
  if (format == "yaml") print_yaml(out, machine);
  else print_text(out, machine);
  return 0;
}

}  // namespace

int run_cli(int argc, char* argv[], std::ostream& out, std::ostream& err) {
  try {
    Runtime runtime(argc, argv);
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) throw UsageError("no command given");
    const std::string& command = args.front();
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "info") return info_command(rest, out);
    if (command == "help" || command == "--help" || command == "-h") {
      out << usage_text;
      return 0;
    }
    throw UsageError("unknown command '" + command + "'");
  } catch (const UsageError& e) {
    err << "writescope: " << e.what() << "\n\n" << usage_text;
    return 2;
  } catch (const ConfigError& e) {
    err << "writescope: configuration error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    err << "writescope: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace writescope
