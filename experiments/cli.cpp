#include "experiments/cli.hpp"

#include <yaml-cpp/yaml.h>

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/calibration.hpp"
#include "framework/config.hpp"
#include "framework/log.hpp"
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
    "  calibrate [--output FILE] [--name NAME] [--thread-counts 1,4,16] [--tokens N]\n"
    "                              measure this machine and write its profile (YAML; stdout\n"
    "                              without --output): bandwidths, latencies, CPU attention\n"
    "                              per model shape and thread count, GEMV/GEMM throughput\n"
    "  help                        this text\n"
    "\n"
    "Kokkos options (--kokkos-threads=N, --kokkos-device=N, ...) may be given anywhere.\n";

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

/// Options of the form --name VALUE or --name=VALUE, for commands with no positional arguments.
std::map<std::string, std::string> parse_options(const std::string& command, const std::vector<std::string>& args,
                                                 std::initializer_list<std::string> known) {
  std::map<std::string, std::string> options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const auto equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError(command + ": option '" + name + "' needs a value");
    }
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UsageError(command + ": unknown option '" + name + "'");
    options[name] = value;
  }
  return options;
}

long positive_integer(const std::string& command, const std::string& option, const std::string& text) {
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 1)
    throw UsageError(command + ": " + option + " must be a positive integer, got '" + text + "'");
  return value;
}

void progress_line(const std::string& line) { log_info("calibrate: ", line); }

int calibrate_command(const std::vector<std::string>& args, std::ostream& out) {
  auto options = parse_options("calibrate", args, {"--output", "--name", "--thread-counts", "--tokens"});
  CalibrationOptions calibration;
  calibration.name = options["--name"];
  if (options.count("--tokens")) calibration.attention_tokens = positive_integer("calibrate", "--tokens", options["--tokens"]);
  if (options.count("--thread-counts")) {
    std::stringstream list(options["--thread-counts"]);
    for (std::string item; std::getline(list, item, ',');)
      calibration.thread_counts.push_back(static_cast<int>(positive_integer("calibrate", "--thread-counts", item)));
  }
  char executable[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
  if (length <= 0) throw std::runtime_error("calibrate: cannot find this program's path in /proc/self/exe");
  calibration.executable.assign(executable, static_cast<std::size_t>(length));
  const MachineProfile profile = calibrate_machine(calibration, progress_line);
  if (options.count("--output")) {
    profile.save(options["--output"]);
    progress_line("wrote " + options["--output"]);
  } else {
    out << profile.to_yaml();
  }
  return 0;
}

int calibrate_attention_command(const std::vector<std::string>& args, std::ostream& out) {
  auto options = parse_options("calibrate-attention", args, {"--shape", "--tokens"});
  if (!options.count("--shape")) throw UsageError("calibrate-attention: --shape is required");
  const long tokens =
      options.count("--tokens") ? positive_integer("calibrate-attention", "--tokens", options["--tokens"]) : 32768;
  out << std::setprecision(17) << measure_cpu_attention_gbps(attention_shape(options["--shape"]), tokens) << "\n";
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
    if (command == "calibrate") return calibrate_command(rest, out);
    // Internal: one CPU attention measurement at this process' thread count.
    if (command == "calibrate-attention") return calibrate_attention_command(rest, out);
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
