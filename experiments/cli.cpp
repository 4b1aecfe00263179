#include "experiments/cli.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "attention/decode.hpp"
#include "attention/host_prefetch.hpp"
#include "experiments/calibration.hpp"
#include "experiments/harness.hpp"
#include "experiments/impl/descriptor_output.hpp"
#include "experiments/predict.hpp"
#include "framework/concurrent.hpp"
#include "framework/config.hpp"
#include "framework/cpu_path.hpp"
#include "framework/files.hpp"
#include "framework/log.hpp"
#include "framework/machine.hpp"
#include "framework/results_store.hpp"
#include "framework/runtime.hpp"
#include "framework/spaces.hpp"
#include "moe/model.hpp"

namespace writescope {
namespace {

/// The root attribute `format` of generate's --logits files.
constexpr char logits_format[] = "writescope-logits-1";

constexpr const char* usage_text =
    "usage: writescope <command> [options]\n"
    "\n"
    "commands:\n"
    "  info [--format text|yaml]   Kokkos configuration, enabled spaces, devices and memory\n"
    "  calibrate [--output FILE] [--name NAME] [--thread-counts 1,4,16] [--tokens N]\n"
    "                              measure this machine and write its profile (YAML; stdout\n"
    "                              without --output): bandwidths, latencies, CPU attention\n"
    "                              per model shape and thread count, the bf16 expert kernel;\n"
    "                              defaults: --name the host name, --thread-counts 1, 2, 4, ...\n"
    "                              and all host threads (a list without the process's own\n"
    "                              count gets it added), --tokens 32768 (at least 256)\n"
    "  generate --model NAME|CHECKPOINT_DIR --prompt 1,2,3|--prompt-file FILE --new-tokens N\n"
    "           [--layers N] [--hidden-scale S] [--seed S] [--block-tokens N] [--chunk-tokens N]\n"
    "           [--mla-form automatic|absorbed|decompressed] [--vram-budget BYTES]\n"
    "           [--host-budget BYTES] [--logits FILE.h5]\n"
    "                              prefill the prompt in chunks (default 256 tokens), then\n"
    "                              greedy decoding, printing the generated token ids; a prompt\n"
    "                              file holds ids separated by commas or whitespace; KV fills\n"
    "                              VRAM then host memory, routed experts run on the CPU;\n"
    "                              --logits stores every step's logits with the command, its\n"
    "                              settings and the CPU attention path this process measured\n"
    "                              (committed about every minute, less often once a commit\n"
    "                              takes over 6 s, and at the end; Ctrl-C\n"
    "                              or a closed output stops it keeping what it made);\n"
    "                              --mla-form (MLA models): how DeepSeek's prompt chunks\n"
    "                              attend (automatic: by cost); --seed, --layers and\n"
    "                              --hidden-scale: synthetic models only. Presets:\n"
    "                              deepseek-v2-lite, qwen3-30b-a3b, mixtral-8x7b and their\n"
    "                              tiny-deepseek-v2, tiny-qwen3-moe, tiny-mixtral; defaults:\n"
    "                              --block-tokens 256, --chunk-tokens 256, --vram-budget\n"
    "                              4GiB, --host-budget 1GiB, --seed 1\n"
    "  make-checkpoint --model NAME --output DIR [--seed S] [--dtype bf16|f16|f32]\n"
    "                  [--config-format hub|transformers5]\n"
    "                              write a synthetic Hugging Face checkpoint (config.json +\n"
    "                              model.safetensors) of a preset, e.g. a tiny test model\n"
    "  run CONFIG.yaml [--output FILE.h5] [--profile FILE|NAME] [--allow-different-machine]\n"
    "                              run an experiment (experiments/configs/*.yaml) into an\n"
    "                              HDF5 results file; runs already in the file are skipped\n"
    "                              (damaged ones measured again); a file of another machine\n"
    "                              setup is refused unless --allow-different-machine; Ctrl-C\n"
    "                              or SIGTERM stops it after the run in progress\n"
    "      [--shard K/N]           run share K (0-based) of N shares balanced by predicted cost,\n"
    "                              into CONFIG's output with .shard-K-of-N before .h5\n"
    "  predict CONFIG.yaml --profile NAME|FILE[,NAME|FILE...] [--cpu-from PROFILE] [--output FILE.h5]\n"
    "                              price every run of the experiment on each profile's roofline\n"
    "                              (no kernels, nothing allocated per token or weight) into a\n"
    "                              results file marked predicted (default: CONFIG's output with\n"
    "                              -predicted before .h5); --cpu-from takes the CPU figures from\n"
    "                              another profile, e.g. this machine's calibration\n"
    "  predict --compare FILE.h5 [--cpu-from PROFILE]\n"
    "                              price a file's measured runs with the profile they used and\n"
    "                              print the error per system and component\n"
    "  merge OUT.h5 IN.h5... [--allow-different-machine] [--allow-missing] [--drop-damaged]\n"
    "                              merge shards' results files of one experiment into a new file\n"
    "  verify FILE.h5              check every run of a results file against its checksum\n"
    "  help                        this text\n"
    "\n"
    "Kokkos options (--kokkos-threads=N, --kokkos-device=N, ...) may be given anywhere.\n";

/// A command line that asks for what does not exist or gives a wrong value.
/// The whole usage text follows the message only where the command or an
/// option is unknown; a wrong value gets its message and a pointer to help.
class UsageError : public std::runtime_error {
 public:
  enum class Usage { pointer, whole };
  explicit UsageError(const std::string& message, Usage usage = Usage::pointer)
      : std::runtime_error(message), usage_(usage) {}
  bool whole_usage() const noexcept { return usage_ == Usage::whole; }

 private:
  Usage usage_;
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
  out << "\nCPU decode attention (bf16 KV): the path each product takes\n";
  for (const AttentionShape& shape : supported_attention_shapes()) {
    out << "  " << std::left << std::setw(18) << shape.name << std::right;
    for (Region region : {Region::cpu_resident, Region::cpu_streamed})
      out << "  " << region_name(region) << ": " << cpu_path_name(decode_product_path(shape, block_order(region)));
    out << "\n";
  }
  if (cpu_path_supported(CpuPath::avx512_bf16)) {
    const Avx512ProductRates& rates = avx512_product_rates();
    out << "  AVX-512 multiply-adds, one thread: vdpbf16ps " << std::fixed << std::setprecision(1)
        << rates.bf16_dot_gmacs << ", 16-lane fp32 FMA " << rates.fp32_fma_gmacs << " GMAC/s: the faster path is "
        << cpu_path_name(faster_avx512_path(rates)) << "\n"
        << std::defaultfloat;
  }
  out << "  product path (measured per shape where both AVX-512 paths run):\n";
  for (const AttentionShape& shape : supported_attention_shapes())
    for (Region region : {Region::cpu_resident, Region::cpu_streamed})
      out << "    " << std::left << std::setw(18) << shape.name << std::setw(13) << region_name(region) << std::right
          << describe_decode_cpu_path(shape, block_order(region)) << "\n";
  out << "  next pass of head-major blocks requested into (measured per shape):\n";
  for (const AttentionShape& shape : supported_attention_shapes())
    out << "    " << std::left << std::setw(18) << shape.name << std::right << describe_next_pass_prefetch(shape) << "\n";
  out << "  tokens per pass over token-major rows (measured per shape):\n";
  for (const AttentionShape& shape : supported_attention_shapes())
    out << "    " << std::left << std::setw(18) << shape.name << std::right << describe_token_major_pass(shape) << "\n";
  if (cpu_path_supported(CpuPath::amx_bf16))
    out << "  amx_bf16: decode attention and the bf16 linear layer on AMX tiles; the other kernels on "
        << cpu_path_name(vector_path(CpuPath::amx_bf16)) << "\n";
  else
    out << "  amx_bf16: not offered: " << amx_bf16_unavailable_reason() << "\n";
  if (*cpu_path_pinned_by() != '\0')
    out << "  (pinned by " << cpu_path_pinned_by() << "; the best path here is " << cpu_path_name(best_cpu_path())
        << ")\n";
  out << "\nKokkos configuration\n" << machine.kokkos_configuration;
}

/// print_text's facts for scripts: the machine's fields (as results store
/// them), then the spaces and where each CPU decode product runs and why.
void print_yaml(std::ostream& out, const MachineDescription& machine) {
  YAML::Emitter yaml;
  yaml << YAML::BeginMap;
  yaml << YAML::Key << "spaces" << YAML::Value << YAML::BeginMap;
  yaml << YAML::Key << "gpu_execution_space" << YAML::Value << space_name<GpuExecSpace>();
  yaml << YAML::Key << "gpu_memory_space" << YAML::Value << space_name<GpuMemSpace>();
  yaml << YAML::Key << "pinned_memory_space" << YAML::Value << space_name<PinnedMemSpace>();
  yaml << YAML::Key << "host_memory_space" << YAML::Value << space_name<HostMemSpace>();
  yaml << YAML::EndMap;
  yaml << YAML::Key << "cpu_decode" << YAML::Value << YAML::BeginMap;
  for (const AttentionShape& shape : supported_attention_shapes()) {
    yaml << YAML::Key << shape.name << YAML::Value << YAML::BeginMap;
    for (Region region : {Region::cpu_resident, Region::cpu_streamed}) {
      const BlockOrder order = block_order(region);
      yaml << YAML::Key << region_name(region) << YAML::Value << YAML::BeginMap;
      yaml << YAML::Key << "path" << YAML::Value << cpu_path_name(decode_product_path(shape, order));
      yaml << YAML::Key << "chosen" << YAML::Value << describe_decode_cpu_path(shape, order);
      yaml << YAML::EndMap;
    }
    yaml << YAML::Key << "next_pass_prefetch" << YAML::Value << describe_next_pass_prefetch(shape);
    yaml << YAML::Key << "token_major_pass" << YAML::Value << describe_token_major_pass(shape);
    yaml << YAML::EndMap;
  }
  yaml << YAML::EndMap;
  if (cpu_path_supported(CpuPath::avx512_bf16)) {
    const Avx512ProductRates& rates = avx512_product_rates();
    yaml << YAML::Key << "avx512_multiply_adds_gmacs" << YAML::Value << YAML::BeginMap;
    yaml << YAML::Key << "vdpbf16ps" << YAML::Value << rates.bf16_dot_gmacs;
    yaml << YAML::Key << "fp32_fma" << YAML::Value << rates.fp32_fma_gmacs;
    yaml << YAML::Key << "faster_path" << YAML::Value << cpu_path_name(faster_avx512_path(rates));
    yaml << YAML::EndMap;
  }
  yaml << YAML::Key << "amx_bf16" << YAML::Value
       << (cpu_path_supported(CpuPath::amx_bf16) ? std::string("offered")
                                                 : "not offered: " + amx_bf16_unavailable_reason());
  if (*cpu_path_pinned_by() != '\0') {
    yaml << YAML::Key << "cpu_path_pinned_by" << YAML::Value << cpu_path_pinned_by();
    yaml << YAML::Key << "best_cpu_path" << YAML::Value << cpu_path_name(best_cpu_path());
  }
  yaml << YAML::EndMap;
  out << machine.to_yaml() << "\n" << yaml.c_str() << "\n";
}

/// Options of the form --name VALUE or --name=VALUE, for commands with no
/// positional arguments: each at most once, each with a value that is not
/// empty (an unset shell variable) and not the next option.
std::map<std::string, std::string> parse_options(const std::string& command, const std::vector<std::string>& args,
                                                 std::initializer_list<std::string> known) {
  std::map<std::string, std::string> options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    if (name.rfind("--", 0) != 0)
      throw UsageError(command + ": unexpected argument '" + name + "' (options are --name VALUE or --name=VALUE)");
    const auto equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      // The command's own options, not the whole help: the one line that matters stays in view.
      std::string listed;
      for (const std::string& option : known) listed += (listed.empty() ? "" : ", ") + option;
      throw UsageError(command + ": unknown option '" + name + "' (its options: " + listed + ")");
    }
    if (value.empty()) throw UsageError(command + ": " + name + " needs a value");
    if (options.count(name))
      throw UsageError(command + ": " + name + " given twice ('" + options[name] + "' and '" + value +
                       "'); give it once" + (name == "--profile" ? " (several: a comma-separated list)" : ""));
    options[name] = value;
  }
  return options;
}

}  // namespace

int info_command(const std::vector<std::string>& args, std::ostream& out) {
  std::string format = "text";
  if (auto options = parse_options("info", args, {"--format"}); options.count("--format")) format = options["--format"];
  if (format != "text" && format != "yaml")
    throw UsageError("info: --format must be text or yaml, got '" + format + "'");
  const MachineDescription machine = MachineDescription::detect();
  if (format == "yaml") print_yaml(out, machine);
  else print_text(out, machine);
  return 0;
}

namespace {

/// `text` as a T in [least, most] (by default at most T's largest value): "4294967297" for an int is an error, not 1.
template <class T = int>
T positive_integer(const std::string& command, const std::string& option, const std::string& text, T least = 1,
                   T most = std::numeric_limits<T>::max()) {
  T value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  // A negative number is an integer out of an unsigned option's range, not "not an integer".
  const bool negative = text.size() > 1 && text[0] == '-' &&
                        std::all_of(text.begin() + 1, text.end(), [](unsigned char c) { return std::isdigit(c); });
  if (error == std::errc::result_out_of_range || (std::is_unsigned_v<T> && negative) ||
      (error == std::errc() && end == text.data() + text.size() && (value < least || value > most)))
    throw UsageError(command + ": " + option + " must be an integer in [" + std::to_string(least) + ", " +
                     std::to_string(most) + "], got '" + text + "'");
  if (error != std::errc() || end != text.data() + text.size())
    throw UsageError(command + ": " + option + " must be " + (least == 1 ? "a positive" : "an") + " integer, got '" +
                     text + "'");
  return value;
}

void progress_line(const std::string& line) { log_info("calibrate: ", line); }

/// An output file named on the command line, refused as a usage error (exit
/// status 2, for every command alike) before any work where it cannot be a
/// file (a folder included) or its folder cannot be made; the folder is made
/// otherwise.
void prepare_output_option(const std::string& option, const std::string& path) {
  if (const std::string why = not_a_file_reason(path); !why.empty())
    throw UsageError(option + " " + path + " " + why + "; give a file name");
  try {
    create_output_folder(option, path);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

/// Refuses an --output `path` that a file cannot be written to (a folder, a
/// missing or read-only folder) before minutes of measuring go into it.
void check_profile_output(const std::string& command, const std::string& path) {
  if (path == "-")
    throw UsageError(command + ": --output - is no file name; without --output the profile goes to stdout");
  // A device, pipe or socket: its reading below could wait forever, and the
  // rename would replace it (/dev/null) with a file.
  prepare_output_option(command + ": --output", path);
  // Calibrating again replaces a profile, an outdated one included (a YAML
  // mapping with a name and a cpu section), or an empty file; any other file
  // (results, a config) is kept.
  if (std::filesystem::exists(path)) {
    std::string why;
    try {
      std::ifstream file(path, std::ios::binary);
      std::ostringstream text;
      text << file.rdbuf();
      const std::string contents = text.str();
      const bool blank = std::all_of(contents.begin(), contents.end(), [](unsigned char c) { return std::isspace(c); });
      if (!blank) {
        const ConfigNode node = ConfigNode::parse(contents, path);
        if (!node.has("name") || !node.has("cpu")) why = "it has no 'name' and 'cpu' at its top";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty())
      throw UsageError(command + ": --output " + path + " exists and is not a machine profile (" + why +
                       "); a profile replaces only an earlier profile: give another --output or remove the file");
  }
  // A file beside it, as MachineProfile::save writes one: a name of its own
  // (mkstemp), so that no existing file is truncated or removed.
  std::string probe = followed_symlinks(path) + ".partial.XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    throw UsageError(command + ": --output " + path + " cannot be written (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

int calibrate_command(const std::vector<std::string>& args, std::ostream& out) {
  auto options = parse_options("calibrate", args, {"--output", "--name", "--thread-counts", "--tokens"});
  // Its own thread count is the profile's (and the default sweep's last): oversubscribed, every rate would be.
  if (const int threads = HostExecSpace().concurrency(), cpus = static_cast<int>(startup_cpus().size()); threads > cpus)
    throw UsageError("calibrate: this process runs " + std::to_string(threads) + " host threads on " +
                     std::to_string(cpus) + " CPUs (OMP_NUM_THREADS, KOKKOS_NUM_THREADS or --kokkos-threads); run "
                     "it with at most " + std::to_string(cpus));
  CalibrationOptions calibration;
  if (options.count("--name")) {
    calibration.name = options["--name"];
    if (std::all_of(calibration.name.begin(), calibration.name.end(), [](unsigned char c) { return std::isspace(c); }))
      throw UsageError("calibrate: --name must not be blank");
    // The name goes into logs, reports' tables and HDF5 group names, a line each.
    if (calibration.name.front() == '-') throw UsageError("calibrate: --name must not start with '-'");
    if (!std::all_of(calibration.name.begin(), calibration.name.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; }))
      throw UsageError("calibrate: --name must be printable ASCII (letters, digits, punctuation and spaces)");
  }
  // At most 2^24: far past any context a profile prices, and a KV pool the machine can hold.
  // At least one block: fewer tokens time a step's fixed costs, not its reading (0.1 GB/s at 1 token).
  if (options.count("--tokens"))
    calibration.attention_tokens = positive_integer<std::int64_t>("calibrate", "--tokens", options["--tokens"],
                                                                  calibration_block_tokens, std::int64_t{1} << 24);
  // What one attention measurement holds at once (the GPU's reads 8 times the tokens): refused before any
  // measurement, not by the allocator after minutes of them.
  const auto too_large = [&](const char* memory, std::uint64_t needed, std::uint64_t available, const char* what) {
    if (needed > available)
      throw UsageError("calibrate: --tokens " + std::to_string(calibration.attention_tokens) + " needs " +
                       format_byte_size(needed) + " of " + memory + " for one attention measurement's KV, but this "
                       "machine has " + format_byte_size(available) + what);
  };
  too_large("host memory", rotated_cache_bytes(calibration.attention_tokens), available_host_memory(), " available");
#ifdef KOKKOS_ENABLE_CUDA
  too_large("GPU memory", rotated_cache_bytes(8 * calibration.attention_tokens),
            static_cast<std::uint64_t>(MachineDescription::detect().gpu_memory_bytes), " in all");
#endif
  if (options.count("--thread-counts")) {
    // getline drops a trailing empty entry: "1," would calibrate 1 alone, silently.
    if (const std::string& text = options["--thread-counts"]; text.empty() || text.back() == ',')
      throw UsageError("calibrate: --thread-counts '" + text + "' ends in an empty entry (a list such as 1,2,4)");
    std::stringstream list(options["--thread-counts"]);
    for (std::string item; std::getline(list, item, ',');) {
      const int threads = positive_integer("calibrate", "--thread-counts", item, 1, max_host_threads);
      // More threads than CPUs would record an oversubscribed rate under that count.
      if (const int cpus = static_cast<int>(startup_cpus().size()); threads > cpus)
        throw UsageError("calibrate: --thread-counts names " + std::to_string(threads) + " threads, more than the " +
                         std::to_string(cpus) + " CPUs this process may run on");
      if (std::find(calibration.thread_counts.begin(), calibration.thread_counts.end(), threads) !=
          calibration.thread_counts.end())
        throw UsageError("calibrate: --thread-counts names " + std::to_string(threads) + " twice in '" +
                         options["--thread-counts"] + "'");
      calibration.thread_counts.push_back(threads);
    }
  }
  char executable[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
  if (length <= 0) throw std::runtime_error("calibrate: cannot find this program's path in /proc/self/exe");
  calibration.executable.assign(executable, static_cast<std::size_t>(length));
  if (options.count("--output")) check_profile_output("calibrate", options["--output"]);
  const MachineProfile profile = calibrate_machine(calibration, progress_line);
  if (options.count("--output")) {
    try {
      profile.save(options["--output"]);
    } catch (const std::exception&) {
      out << profile.to_yaml();  // the measurements, where the file could not take them
      throw;
    }
    progress_line("wrote " + options["--output"]);
  } else {
    out << profile.to_yaml();
  }
  return 0;
}

int calibrate_attention_command(const std::vector<std::string>& args, std::ostream& out) {
  auto options = parse_options("calibrate-attention", args, {"--shape", "--order", "--tokens", "--thread-count"});
  // The thread count its rate is recorded under, checked against the one it runs.
  if (options.count("--thread-count")) {
    const int threads = positive_integer("calibrate-attention", "--thread-count", options["--thread-count"]);
    if (const int running = HostExecSpace().concurrency(); running != threads)
      throw std::runtime_error("calibrate-attention: runs " + std::to_string(running) + " host threads, not the " +
                               std::to_string(threads) + " of --thread-count (KOKKOS_NUM_THREADS or --kokkos-threads)");
  }
  if (!options.count("--shape")) throw UsageError("calibrate-attention: --shape is required");
  const std::int64_t tokens =
      options.count("--tokens") ? positive_integer<std::int64_t>("calibrate-attention", "--tokens", options["--tokens"]) : 32768;
  const std::string order = options.count("--order") ? options["--order"] : "head-major";
  if (order != "head-major" && order != "token-major")
    throw UsageError("calibrate-attention: --order must be head-major or token-major, got '" + order + "'");
  out << std::setprecision(17)
      << measure_cpu_attention_gbps(attention_shape(options["--shape"]),
                                    order == "head-major" ? BlockOrder::head_major : BlockOrder::token_major, tokens)
      << "\n";
  return 0;
}

/// At most 2^24 prompt tokens (a prompt file of about 100 MB): far past the
/// presets' positions, and read before any memory for the model is taken.
constexpr std::int64_t most_prompt_tokens = std::int64_t{1} << 24;

/// Token ids separated by commas or whitespace (or both; two commas with
/// nothing between them are refused, and so is a trailing comma except at the
/// end of a file), each in [0, vocab), at most most_prompt_tokens; given
/// piece by piece, so that a file is read
/// only as far as it is good. Errors are std::invalid_argument naming
/// `source` and quoting the bad item (cut short, bytes other than printable
/// ASCII escaped).
class TokenIds {
 public:
  /// `file`: a comma may end the text (programs write lists so); on the
  /// command line a trailing comma, as a doubled one, leaves an id out.
  TokenIds(int vocab, std::string source, bool file)
      : vocab_(vocab), source_(std::move(source)), file_(file) {}

  /// Parses `text`'s items up to its last separator (all of it when `last`);
  /// returns how much of `text` it took.
  std::size_t add(std::string_view text, bool last) {
    std::size_t at = 0, end_of_items = text.size();
    if (!last) {
      const std::size_t separator = text.find_last_of(separators);
      end_of_items = separator == std::string_view::npos ? 0 : separator + 1;
    }
    while (at < end_of_items) {
      if (std::isspace(static_cast<unsigned char>(text[at]))) {
        ++at;
        continue;
      }
      if (text[at] == ',') {
        if (after_comma_) fail("");
        after_comma_ = true;
        ++at;
        continue;
      }
      const std::size_t end = std::min(text.find_first_of(separators, at), end_of_items);
      const std::string_view item = text.substr(at, end - at);
      if (item.size() > longest_item) fail(item);  // the same rule wherever the file's blocks split
      int value = -1;
      const auto [stop, error] = std::from_chars(item.data(), item.data() + item.size(), value);
      if (error != std::errc() || stop != item.data() + item.size() || value < 0 || value >= vocab_) fail(item);
      if (static_cast<std::int64_t>(tokens_.size()) == most_prompt_tokens)
        throw std::invalid_argument("generate: " + source_ + " holds more than " + std::to_string(most_prompt_tokens) +
                                    " tokens");
      tokens_.push_back(value);
      after_comma_ = false;
      at = end;
    }
    // No id is this long: a file of one endless "token" stops here.
    if (text.size() - end_of_items > longest_item) fail(text.substr(end_of_items));
    return end_of_items;
  }

  std::vector<int> finish() {
    if (tokens_.empty()) throw std::invalid_argument("generate: " + source_ + " holds no token");
    if (after_comma_ && !file_) fail("");
    return std::move(tokens_);
  }

 private:
  static constexpr const char* separators = ", \t\r\n\v\f";
  static constexpr std::size_t longest_item = 64;

  [[noreturn]] void fail(std::string_view item) const {
    std::string shown;
    for (const char c : item.substr(0, 24)) {
      if (c >= 0x20 && c < 0x7f) {
        shown += c;
      } else {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned char>(c));
        shown += escaped;
      }
    }
    if (item.size() > 24) shown += "...";
    throw std::invalid_argument("generate: " + source_ + " must be token ids in [0, " + std::to_string(vocab_) +
                                ") (the model's vocabulary) separated by commas or whitespace; token " +
                                std::to_string(tokens_.size() + 1) + " is '" + shown + "'");
  }

  int vocab_;
  std::string source_;
  bool file_;
  std::vector<int> tokens_;
  bool after_comma_ = true;  // at the start, or since the last comma no id came
};

/// The prompt of --prompt or --prompt-file (exactly one of them).
std::vector<int> prompt_tokens(std::map<std::string, std::string>& options, int vocab) {
  if (options.count("--prompt") == options.count("--prompt-file"))
    throw UsageError("generate: give the prompt with exactly one of --prompt and --prompt-file");
  if (options.count("--prompt")) {
    TokenIds ids(vocab, "--prompt", false);
    try {
      ids.add(options["--prompt"], true);
      return ids.finish();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  // The file's contents are not a usage error: their message alone, exit status 1.
  const std::string& path = options["--prompt-file"];
  std::ifstream file(path, std::ios::binary);
  if (std::filesystem::is_directory(path) || !file)
    throw UsageError("generate: --prompt-file " + path + " cannot be read (" +
                     (std::filesystem::is_directory(path) ? std::string("it is a folder") : std::strerror(errno)) +
                     ")");
  TokenIds ids(vocab, "--prompt-file " + path, true);
  std::string pending;
  std::vector<char> block(1 << 20);
  while (file.read(block.data(), static_cast<std::streamsize>(block.size())) || file.gcount() > 0) {
    pending.append(block.data(), static_cast<std::size_t>(file.gcount()));
    pending.erase(0, ids.add(pending, false));
  }
  if (file.bad()) throw std::runtime_error("generate: --prompt-file " + path + ": read failed");
  ids.add(pending, true);
  return ids.finish();
}

/// Which weights a checkpoint folder holds, short of reading their data
/// again: each file the model loads (shards, index) with its bytes and
/// modification time (UTC), then the dtypes its tensors are stored in.
std::pair<std::string, std::string> checkpoint_files(const SafetensorsCheckpoint& checkpoint,
                                                     const std::string& folder) {
  std::set<std::string> files, dtypes;
  for (const std::string& name : checkpoint.names()) {
    const TensorInfo& info = checkpoint.info(name);
    files.insert(info.file);
    dtypes.insert(dtype_name(info.dtype));
  }
  if (const auto index = std::filesystem::path(folder) / "model.safetensors.index.json";
      std::filesystem::exists(index))
    files.insert(index.string());
  std::string described, stored;
  for (const std::string& file : files) {
    struct stat status {};
    if (::stat(file.c_str(), &status) != 0)
      throw CheckpointError(file + ": cannot be examined (" + std::strerror(errno) + ")");
    described += (described.empty() ? "" : "; ") + std::filesystem::path(file).filename().string() + ": " +
                 std::to_string(status.st_size) + " bytes, modified " + utc_time(status.st_mtime);
    // Its own record of what wrote it (a synthetic checkpoint's seed and build), where it has one.
    if (const auto found = checkpoint.metadata().find(file); found != checkpoint.metadata().end()) {
      std::string entries;
      for (const auto& [key, value] : found->second) entries += (entries.empty() ? "" : ", ") + key + ": " + value;
      described += " (metadata: " + entries + ")";
    }
  }
  for (const std::string& dtype : dtypes) stored += (stored.empty() ? "" : ", ") + dtype;
  return {described, stored};
}

/// The signal that asked a generation or an experiment to stop (SIGINT,
/// SIGTERM), 0 while none did: lock-free, so the handler may set it and any
/// thread read it.
std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
/// What the handler writes when asked: set before the handler is installed.
const char* volatile stop_notice = "";
/// When the first request came (CLOCK_MONOTONIC, ns; 0: none yet).
std::atomic<long long> first_stop_ns{0};
static_assert(std::atomic<long long>::is_always_lock_free);
extern "C" void ask_to_stop(int signal) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const long long ns = now.tv_sec * 1000000000LL + now.tv_nsec;
  long long first = 0;
  if (first_stop_ns.compare_exchange_strong(first, ns)) {
    stop_signal.store(signal);
    // write(2) is safe in a handler; the log is not.
    const char* notice = stop_notice;
    const ssize_t ignored = ::write(STDERR_FILENO, notice, std::strlen(notice));
    (void)ignored;
    return;
  }
  // One request can come twice at once (timeout(1) signals the process and
  // then its process group): only one a second or more later stops at once.
  if (ns - first < 1000000000LL) return;
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  ::sigaction(signal, &default_action, nullptr);
  ::raise(signal);
}

/// While alive: SIGINT and SIGTERM set stop_signal and write `notice` (the
/// command stops at its next step or run, keeping what it wrote; another,
/// a second or more later, stops it at once), and SIGPIPE is ignored, so that a closed standard
/// output shows as a failed write (`generate ... | head`) instead of killing
/// the process with nothing committed.
class StopSignals {
 public:
  explicit StopSignals(const char* notice) {
    stop_signal.store(0);
    first_stop_ns.store(0);
    stop_notice = notice;
    struct sigaction stop {};
    stop.sa_handler = ask_to_stop;
    // Writes blocked on a full pipe go on (no EINTR taken for a closed output).
    stop.sa_flags = SA_RESTART;
    sigemptyset(&stop.sa_mask);
    for (const auto& [number, saved] : {std::pair{SIGINT, &interrupt_}, std::pair{SIGTERM, &terminate_}}) {
      sigaction(number, nullptr, saved);
      // A signal the shell ignores for this process (a background job's SIGINT) stays ignored.
      if (saved->sa_handler != SIG_IGN) sigaction(number, &stop, nullptr);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &pipe_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &interrupt_, nullptr);
    sigaction(SIGTERM, &terminate_, nullptr);
    sigaction(SIGPIPE, &pipe_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction interrupt_ {}, terminate_ {}, pipe_ {};
};

/// A generation stopped on request: `reason` says why, `exit_status` is the process's.
struct GenerationStopped {
  std::string reason;
  int exit_status;
};

/// Throws GenerationStopped where a signal asked the generation to stop.
void stop_if_asked() {
  if (const int signal = stop_signal.load(); signal != 0)
    throw GenerationStopped{std::string("stopped by ") + (signal == SIGINT ? "SIGINT" : "SIGTERM"), 128 + signal};
}

/// The command line as typed, each argument quoted where the shell would split or expand it.
std::string command_line(const std::vector<std::string>& args) {
  std::string line = "writescope";
  for (const std::string& arg : args) {
    const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](unsigned char c) {
      return std::isalnum(c) || (c != 0 && std::strchr("-_=.,/:+@%", c) != nullptr);
    });
    if (plain) {
      line += " " + arg;
      continue;
    }
    line += " '";
    for (char c : arg) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += "'";
  }
  return line;
}

/// This process's command line as typed (run_cli sets it before Kokkos takes
/// its options out of argv): what a run or a generation records.
std::string command_as_typed;

int generate_command(const std::vector<std::string>& args, std::ostream& out) {
  // From the start: a Ctrl-C while the model is built stops it at its first step.
  const StopSignals signals("\ngenerate: stopping after the step in progress (again to stop at once)\n");
  auto options = parse_options("generate", args,
                               {"--model", "--prompt", "--prompt-file", "--new-tokens", "--layers", "--hidden-scale",
                                "--seed", "--block-tokens", "--chunk-tokens", "--mla-form", "--host-budget",
                                "--vram-budget", "--logits"});
  for (const char* required : {"--model", "--new-tokens"})
    if (!options.count(required)) throw UsageError(std::string("generate: ") + required + " is required");
  const int new_tokens = positive_integer("generate", "--new-tokens", options["--new-tokens"]);
  const std::string& model_name = options["--model"];
  const bool from_checkpoint = std::filesystem::is_directory(model_name);
  // A folder named as a preset would silently stand for it (or the preset for it).
  if (const std::vector<std::string> presets = model_preset_names();
      from_checkpoint && std::find(presets.begin(), presets.end(), model_name) != presets.end())
    throw UsageError("generate: --model " + model_name + " names both a preset and a folder here; give ./" +
                     model_name + " for the checkpoint folder, or run elsewhere for the preset");
  ModelConfig config;
  if (from_checkpoint) {
    config = load_hf_config(model_name + "/config.json");
  } else {
    const std::vector<std::string> presets = model_preset_names();
    if (std::find(presets.begin(), presets.end(), model_name) == presets.end()) {
      throw UsageError("generate: --model " + model_name + " is neither a preset (" + model_preset_list() +
                       ") nor a checkpoint folder" +
                       (std::filesystem::exists(model_name) ? " (it is a file; give the folder that holds config.json)"
                                                             : " (no such folder)"));
    }
    config = model_preset(model_name);
  }
  ModelOverrides overrides;
  // As a config's layers: at most the preset's.
  if (options.count("--layers"))
    overrides.layers = positive_integer("generate", "--layers", options["--layers"], 1, config.layers);
  if (options.count("--hidden-scale")) {
    const std::string& text = options["--hidden-scale"];
    std::size_t parsed = 0;
    try {
      overrides.hidden_scale = std::stod(text, &parsed);
    } catch (const std::exception&) {
      parsed = 0;
    }
    // (0, 1], as a config's hidden_scale: the synthetic model's width times this.
    if (parsed == 0 || parsed != text.size() || !(overrides.hidden_scale > 0 && overrides.hidden_scale <= 1))
      throw UsageError("generate: --hidden-scale must be a number in (0, 1], got '" + text + "'");
  }
  if (from_checkpoint && (overrides.layers || overrides.hidden_scale != 1.0 || options.count("--seed")))
    throw UsageError("generate: --layers, --hidden-scale and --seed apply to synthetic models, not to checkpoint " +
                     model_name);
  config = apply_overrides(config, overrides);
  const std::vector<int> prompt = prompt_tokens(options, config.vocab);
  // At most 8192: a chunk's experts' products are counted in int (Mixtral's: 28672 floats a token).
  const int chunk_tokens = options.count("--chunk-tokens")
                               ? positive_integer("generate", "--chunk-tokens", options["--chunk-tokens"], 1, 8192)
                               : 256;
  const int block_tokens = options.count("--block-tokens")
                               ? positive_integer("generate", "--block-tokens", options["--block-tokens"], 1, 4096)
                               : 256;
  if (const std::string error = gpu_decode_block_tokens_error(config.attention(), block_tokens); !error.empty())
    throw UsageError("generate: --block-tokens: " + error);
  auto byte_option = [&](const char* name, std::uint64_t fallback) {
    if (!options.count(name)) return fallback;
    const auto parsed = parse_byte_size(options[name]);
    if (!parsed || *parsed == 0)
      throw UsageError(std::string("generate: ") + name + " must be a positive byte size such as 512MiB, got '" +
                       options[name] + "'" + (parsed ? std::string() : ": " + byte_size_problem(options[name])));
    return *parsed;
  };
  const std::uint64_t host_budget = byte_option("--host-budget", std::uint64_t{1} << 30);
  const std::uint64_t vram_budget = byte_option("--vram-budget", std::uint64_t{4} << 30);
  const std::uint64_t seed = options.count("--seed") ? positive_integer<std::uint64_t>("generate", "--seed", options["--seed"], 0) : 1;
  // KV blocks fill the VRAM budget first, then host memory; routed experts run on the CPU.
  ModelOptions model_options;
  model_options.vram_budget = vram_budget;
  model_options.host_kv_budget = host_budget;
  model_options.block_tokens = block_tokens;
  model_options.max_rows = chunk_tokens;
  if (options.count("--mla-form")) {
    const std::string& form = options["--mla-form"];
    if (!config.mla())
      throw UsageError("generate: --mla-form applies to models with MLA attention (DeepSeek), not to " + config.name);
    if (form == "automatic") model_options.mla_prompt_form = MlaPromptForm::automatic;
    else if (form == "absorbed") model_options.mla_prompt_form = MlaPromptForm::absorbed;
    else if (form == "decompressed") model_options.mla_prompt_form = MlaPromptForm::decompressed;
    else throw UsageError("generate: --mla-form must be automatic, absorbed or decompressed, got '" + form + "'");
  }
  model_options.kv_policy = [](const AttentionShape& shape, const InplaceKVCache<bf16>& cache) {
    return std::make_unique<FirstFitKVPolicy>(std::nullopt, shape, cache, Region::cpu_resident);
  };
  // --logits: the file and group are set up before generating, and every
  // step's logits go into it as they come, so problems show before the work
  // and an error at step n keeps steps 0 to n-1 (committed with the error).
  std::optional<ResultsStore> store;
  std::optional<ResultsTransaction> txn;
  std::optional<ResultsGroup> group;
  std::string group_name;
  // The checkpoint's headers, read once: a damaged one is refused before any output is made.
  std::optional<SafetensorsCheckpoint> checkpoint;
  if (from_checkpoint) {
    checkpoint.emplace(model_name);
    check_checkpoint_sizes(*checkpoint, config);
  }
  if (options.count("--logits")) prepare_output_option("generate: --logits", options["--logits"]);
  const bool new_logits_file = options.count("--logits") && !std::filesystem::exists(options["--logits"]);
  if (options.count("--logits")) {
    // Generations go only beside others: a results file or another program's
    // is left as it is (no lock file beside it either). Files from before the
    // format attribute hold only generate_N groups.
    // What the group records of a checkpoint, gathered before the file is touched.
    std::pair<std::string, std::string> weights;
    std::string config_text;
    if (checkpoint) {
      weights = checkpoint_files(*checkpoint, model_name);
      std::ifstream config_json(model_name + "/config.json", std::ios::binary);
      config_text.assign(std::istreambuf_iterator<char>(config_json), std::istreambuf_iterator<char>{});
      if (!config_json) throw CheckpointError(model_name + "/config.json: cannot be read again for the logits file");
    }
    // The store's own refusals (not HDF5, another writer) name the file; the option is said too.
    try {
      if (!new_logits_file) {
        const ResultsReader reader(options["--logits"]);
        const std::string format = reader.has_attribute("/", "format") ? reader.string_attribute("/", "format") : "";
        const std::vector<std::string> groups = reader.list("/");
        const bool earlier_logits =
            format.empty() && !groups.empty() &&
            std::all_of(groups.begin(), groups.end(),
                        [](const std::string& g) { return g.rfind("generate_", 0) == 0; });
        if (format != logits_format && !earlier_logits && !reader.holds_nothing())
          throw std::invalid_argument("generate: --logits " + options["--logits"] +
                                      " is not a logits file of writescope generate (format '" +
                                      (format.empty() ? std::string("none") : format) + "'); name another file");
      }
      store.emplace(options["--logits"]);
    } catch (const ResultsError& e) {
      throw ResultsError(std::string("generate: --logits ") + e.what());
    }
    for (int n = 0; group_name.empty() || store->contains(group_name); ++n) group_name = "generate_" + std::to_string(n);
    txn.emplace(store->begin());
    txn->root().set_attribute("format", logits_format);
    group.emplace(txn->root().create_group(group_name));
    group->write("prompt", std::vector<std::int32_t>(prompt.begin(), prompt.end()));
    group->set_attribute("model", config.name);
    group->set_attribute("command", command_as_typed);
    if (!from_checkpoint) group->set_attribute("seed", static_cast<std::int64_t>(seed));
    group->set_attribute("weights", from_checkpoint ? std::filesystem::absolute(model_name).lexically_normal().string()
                                                    : std::string("synthetic"));
    if (checkpoint) {
      group->set_attribute("weights_files", weights.first);
      group->set_attribute("weights_dtypes", weights.second);
      group->set_attribute("weights_config", config_text);
    }
    group->set_attribute("new_tokens", static_cast<std::int64_t>(new_tokens));
    group->set_attribute("chunk_tokens", static_cast<std::int64_t>(chunk_tokens));
    group->set_attribute("block_tokens", static_cast<std::int64_t>(block_tokens));
    group->set_attribute("vram_budget", static_cast<std::int64_t>(vram_budget));
    group->set_attribute("host_budget", static_cast<std::int64_t>(host_budget));
    if (config.mla()) group->set_attribute("mla_form", options.count("--mla-form") ? options["--mla-form"] : "automatic");
    group->set_attribute("config_format", from_checkpoint ? config.config_format : std::string("preset"));
    group->set_attribute("math_settings", config.math_settings());
    auto machine = group->create_group("machine");
    MachineDescription::detect().store(machine);
  }
  log_info("generate: ", config.name, " (", config.layers, config.layers == 1 ? " layer" : " layers", ", hidden ",
           config.hidden, ", ",
           from_checkpoint ? "checkpoint weights" : "synthetic weights", ")");
  if (from_checkpoint)
    log_info("generate: read ", model_name, "/config.json in the ", config.config_format, " format: rope_theta ",
             config.rope_theta, ", rope type ", config.rope_scaling.type, ", ", config.experts, " experts, top ",
             config.experts_per_token, " (every setting that changes the math: the logits file's math_settings)");
  if (const std::int64_t positions = static_cast<std::int64_t>(prompt.size()) + new_tokens;
      config.max_position > 0 && positions > config.max_position)
    log_info("generate: warning: the prompt and the new tokens reach ", positions,
             " positions, past the model's max_position_embeddings (", config.max_position,
             from_checkpoint ? "): the positions beyond are outside what it was trained for"
                             : "): a trained model of this shape would be past what it was trained for");
  // The host attention's paths, levels and passes are measured per process
  // (the paths' steps can be within 3% of each other, so another process may
  // take the other one and round differently): now, before the timed steps,
  // and recorded with the logits.
  const AttentionShape shape = config.attention();
  const std::string cpu_decode_path = describe_decode_cpu_paths(shape);
  log_info("generate: CPU attention: ", cpu_decode_path, " (setting WRITESCOPE_CPU_PATH pins a path)");
  if (group) {
    group->set_attribute("cpu_decode_path", cpu_decode_path);
    group->set_attribute("next_pass_prefetch", describe_next_pass_prefetch(shape));
    group->set_attribute("token_major_pass", describe_token_major_pass(shape));
  }
  model_options.check_finite = true;
  // No step ran: a logits file this call created would hold nothing.
  auto remove_new_logits_file = [&] {
    if (!new_logits_file) return;
    group.reset();
    txn.reset();
    store.reset();
    std::filesystem::remove(options["--logits"]);
  };
  // A full-size model's weights take minutes to make or read, with nothing else to show for them.
  log_info("generate: ", from_checkpoint ? "reading" : "making", " the weights (",
           format_byte_size(config.parameters() * sizeof(bf16)), " as bf16) ...");
  const auto build_started = std::chrono::steady_clock::now();
  MoeModel model = [&] {
    try {
      if (!from_checkpoint) return MoeModel::synthetic(config, seed, model_options);
      // As transformers warns: weights the config leaves out are most often a config.json that disagrees with them.
      if (const std::vector<std::string> unused = unused_tensors(*checkpoint, config); !unused.empty())
        log_info("generate: warning: ", unused.size(), " tensors of ", model_name,
                 " are not used by its config.json (", unused.front(), unused.size() > 1 ? ", ..." : "",
                 "); check num_hidden_layers, tie_word_embeddings, n_shared_experts and the like");
      return MoeModel::from_checkpoint(*checkpoint, config, model_options);
    } catch (const ModelBudgetError& e) {
      remove_new_logits_file();
      // Budgets are options here, not a config's fields.
      const std::string message = e.what(), vram = "vram_budget: ";
      if (message.rfind(vram, 0) == 0) throw ModelBudgetError("generate: --vram-budget " + message.substr(vram.size()));
      if (message.rfind("host memory: ", 0) == 0)
        throw ModelBudgetError("generate: " + message + " (--host-budget sets the host KV pool)");
      throw;
    } catch (...) {
      remove_new_logits_file();
      throw;
    }
  }();
  const double build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - build_started).count();
  log_info("generate: weights ready in ", std::round(build_seconds * 10) / 10, " s");
  // Known now, found otherwise only when the blocks run out: the budgets' KV blocks against the positions'.
  const std::int64_t positions = static_cast<std::int64_t>(prompt.size()) + new_tokens;
  const std::int64_t blocks_per_layer = (positions + block_tokens - 1) / block_tokens;
  const InplaceKVCache<bf16>& kv = model.cache();
  const std::int64_t blocks_held = kv.capacity_blocks(Region::gpu_resident) +
                                   kv.capacity_blocks(Region::gpu_streamed) + kv.capacity_blocks(Region::cpu_resident);
  // Not even the prompt fits: no token could be generated, so nothing starts.
  if (const std::int64_t prompt_blocks = (static_cast<std::int64_t>(prompt.size()) + block_tokens - 1) / block_tokens;
      prompt_blocks * config.layers > blocks_held) {
    remove_new_logits_file();
    throw ModelBudgetError("generate: the prompt's " + std::to_string(prompt.size()) + " tokens need " +
                           std::to_string(prompt_blocks * config.layers) + " KV blocks (" +
                           std::to_string(config.layers) + " layers x " + std::to_string(prompt_blocks) + " of " +
                           std::to_string(block_tokens) + " tokens) but --vram-budget and --host-budget hold " +
                           std::to_string(blocks_held) + "; give larger budgets");
  }
  if (blocks_per_layer * config.layers > blocks_held)
    log_info("generate: warning: the prompt and the new tokens need ", blocks_per_layer * config.layers, " KV blocks (",
             config.layers, " layers x ", blocks_per_layer, " of ", block_tokens,
             " tokens) but --vram-budget and --host-budget hold ", blocks_held, ": it stops at about position ",
             blocks_held / config.layers * block_tokens, " (give larger budgets or fewer --new-tokens)");
  const int sequence = model.add_sequence(positions);
  int steps = 0;  // tokens generated
  // status: "in progress" (a commit on the way), "complete", "failed" (with
  // `error`) or "stopped" (with `stopped`: a signal, a closed output).
  auto commit = [&](const std::string& status, const std::string& why) {
    group->set_attribute("steps", static_cast<std::int64_t>(steps));
    group->set_attribute("complete", static_cast<std::int64_t>(status == "complete"));
    group->set_attribute("status", status);
    if (status == "failed") group->set_attribute("error", why);
    if (status == "stopped") group->set_attribute("stopped", why);
    txn->commit();
  };
  const auto started = std::chrono::steady_clock::now();
  auto last_commit = started;
  // Each commit copies the file: commit once a minute has passed, and no more
  // than a tenth of the time, so long generations do not spend it copying.
  std::chrono::steady_clock::duration commit_interval = std::chrono::minutes(1);
  std::int64_t committed_steps = 0;
  std::chrono::steady_clock::time_point prefilled;
  bool prefilling = true;
  try {
    // A long prompt says how far it got, at most every 5 seconds.
    auto last_report = started;
    std::vector<float> logits = model.prefill(sequence, prompt, [&](std::int64_t done, std::int64_t total) {
      stop_if_asked();
      const auto now = std::chrono::steady_clock::now();
      if (done == total || now - last_report < std::chrono::seconds(5)) return;
      last_report = now;
      const double seconds = std::chrono::duration<double>(now - started).count();
      log_info("generate: prefill ", done, "/", total, " tokens (", done / seconds, " tokens/s)");
    });
    prefilled = std::chrono::steady_clock::now();
    prefilling = false;
    while (steps < new_tokens) {
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out << (steps ? " " : "") << next << std::flush;
      const bool output_closed = !out;
      if (group) {
        group->append("logits", logits, logits.size());
        group->append("generated", std::vector<std::int32_t>{next});
      }
      ++steps;
      // Asked to stop, or no one reads the tokens: the steps made are kept (none once all are made).
      if (steps < new_tokens) {
        stop_if_asked();
        if (output_closed) throw GenerationStopped{"standard output closed", 1};
      }
      // A killed process keeps what was committed.
      if (group && steps < new_tokens && std::chrono::steady_clock::now() - last_commit > commit_interval) {
        const auto begin = std::chrono::steady_clock::now();
        commit("in progress", "");
        committed_steps = steps;
        txn.emplace(store->begin());
        group.emplace(txn->root().open_group(group_name));
        last_commit = std::chrono::steady_clock::now();
        commit_interval = std::max<std::chrono::steady_clock::duration>(std::chrono::minutes(1),
                                                                          10 * (last_commit - begin));
      }
      if (steps < new_tokens) logits = model.step({sequence}, {next}).front();
    }
  } catch (const GenerationStopped& stopped) {
    out << std::endl;
    // A closed output is said here: cleared, the command line's final flush says it no more.
    out.clear();
    const std::string done = "generate: " + stopped.reason + " after " + std::to_string(steps) + " of " +
                             std::to_string(new_tokens) + " tokens";
    if (!group) {
      log_info(done);
      return stopped.exit_status;
    }
    commit("stopped", stopped.reason);
    log_info(done, "; their logits are in ", options["--logits"], ":/", group_name);
    return stopped.exit_status;
  } catch (const ResultsError& e) {
    // The logits file itself failed (e.g. no space): nothing more can be committed to it.
    out << std::endl;
    throw ResultsError(std::string(e.what()) + " (the logits file keeps the " + std::to_string(committed_steps) +
                       " tokens committed before)");
  } catch (const std::exception& e) {
    out << std::endl;
    const std::string error = "generate: " +
                              (prefilling ? std::string("prefill") : "decoding token " + std::to_string(steps + 1)) +
                              ": " + e.what();
    if (!group) throw std::runtime_error(error);
    try {
      commit("failed", error);
    } catch (const ResultsError& stored) {
      throw std::runtime_error(error + "; and its logits could not be stored: " + stored.what() +
                               " (the logits file keeps the " + std::to_string(committed_steps) +
                               " tokens committed before)");
    }
    throw std::runtime_error(error + " (the " + std::to_string(steps) + " tokens before it and their logits are in " +
                             options["--logits"] + ":/" + group_name + ")");
  }
  const double decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefilled).count();
  out << std::endl;  // before the log line on standard error, where both go to one file
  log_info("generate: prompt ", prompt.size(), " tokens in ",
           std::chrono::duration<double>(prefilled - started).count(), " s (",
           prompt.size() / std::chrono::duration<double>(prefilled - started).count(), " tokens/s); ",
           new_tokens - 1, " decode steps at ", new_tokens > 1 ? (new_tokens - 1) / decode_seconds : 0.0,
           " tokens/s");
  if (group) {
    commit("complete", "");
    log_info("generate: logits of ", steps, " steps in ", options["--logits"], ":/", group_name);
  }
  return 0;
}

int make_checkpoint_command(const std::vector<std::string>& args) {
  auto options = parse_options("make-checkpoint", args, {"--model", "--output", "--seed", "--dtype", "--config-format"});
  for (const char* required : {"--model", "--output"})
    if (!options.count(required)) throw UsageError(std::string("make-checkpoint: ") + required + " is required");
  const std::string dtype = options.count("--dtype") ? options["--dtype"] : "bf16";
  if (dtype != "bf16" && dtype != "f16" && dtype != "f32")
    throw UsageError("make-checkpoint: --dtype must be bf16, f16 or f32, got '" + dtype + "'");
  const std::uint64_t seed =
      options.count("--seed") ? positive_integer<std::uint64_t>("make-checkpoint", "--seed", options["--seed"], 0) : 1;
  const std::string format = options.count("--config-format") ? options["--config-format"] : "hub";
  if (format != "hub" && format != "transformers5")
    throw UsageError("make-checkpoint: --config-format must be hub or transformers5, got '" + format + "'");
  if (const std::vector<std::string> presets = model_preset_names();
      std::find(presets.begin(), presets.end(), options["--model"]) == presets.end())
    throw UsageError("make-checkpoint: --model " + options["--model"] + " is not a preset (" + model_preset_list() +
                     ")");
  const ModelConfig model = model_preset(options["--model"]);
  try {
    write_synthetic_checkpoint(options["--output"], model, seed,
                               dtype == "bf16" ? TensorDType::bf16 : dtype == "f16" ? TensorDType::f16 : TensorDType::f32,
                               format == "hub" ? ConfigFormat::hub : ConfigFormat::transformers5);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string("make-checkpoint --output: ") + e.what());
  }
  log_info("make-checkpoint: wrote ", options["--output"]);
  return 0;
}

/// find_profile, its error prefixed with `source` (the option or field that named the profile).
MachineProfile profile_named_by(const std::string& source, const std::string& name_or_path) {
  try {
    return find_profile(name_or_path);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": " + e.what());
  } catch (const ConfigError& e) {  // a file that is no profile (an experiment config, a results file)
    throw ConfigError(source + ": " + e.source(), e.field(), e.reason());
  }
}

int run_command(const std::vector<std::string>& args, std::ostream& out) {
  if (args.empty()) throw UsageError("run: the experiment config is required");
  if (args.front().rfind("--", 0) == 0)
    throw UsageError("run: the experiment config comes first (run CONFIG.yaml [options]), got '" + args.front() + "'");
  std::vector<std::string> rest(args.begin() + 1, args.end());
  // From the start: a Ctrl-C while the first run is set up stops the experiment after it.
  const StopSignals signals(
      "\nrun: stopping after the run in progress; the runs written are kept (again to stop at once)\n");
  RunOptions run_options;
  run_options.command = command_as_typed;
  run_options.stop = &stop_signal;
  if (const auto flag = std::find(rest.begin(), rest.end(), "--allow-different-machine"); flag != rest.end()) {
    run_options.allow_different_machine = true;
    rest.erase(flag);
    if (std::find(rest.begin(), rest.end(), "--allow-different-machine") != rest.end())
      throw UsageError("run: --allow-different-machine given twice; give it once");
  }
  auto options = parse_options("run", rest, {"--output", "--profile", "--shard", "--allow-different-machine"});
  if (options.count("--allow-different-machine"))
    throw UsageError("run: --allow-different-machine takes no value, got '" + options["--allow-different-machine"] +
                     "'");
  ExperimentConfig config = ExperimentConfig::load(args.front());
  if (options.count("--shard")) {
    try {
      run_options.shard = Shard::parse(options["--shard"]);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("run: ") + e.what());
    }
    // Each share into a file of its own: results/x.h5 -> results/x.shard-2-of-8.h5.
    const std::filesystem::path output = config.output;
    config.output = (output.parent_path() / (output.stem().string() + ".shard-" + std::to_string(run_options.shard.index) +
                                             "-of-" + std::to_string(run_options.shard.count) + output.extension().string()))
                        .string();
  }
  if (options.count("--output")) config.output = options["--output"];
  std::string profile_source = "--profile";
  if (options.count("--profile")) {
    config.profile = options["--profile"];
  } else {
    profile_source = args.front() + ": field 'profile'";
    // A profile file named relative to the config is found beside it, wherever run starts.
    const std::filesystem::path beside = std::filesystem::path(args.front()).parent_path() / config.profile;
    if (std::filesystem::path(config.profile).is_relative() && std::filesystem::is_regular_file(beside))
      config.profile = beside.string();
  }
  const MachineProfile profile = profile_named_by("run: " + profile_source, config.profile);
  // The output's folder once nothing else refuses the run (expand_runs refuses a profile that cannot price it).
  const std::size_t run_count = expand_runs(config, profile).size();
  if (options.count("--output")) prepare_output_option("run: --output", options["--output"]);
  log_info("run: ", config.name, ": ", run_count, " runs",
           run_options.shard.count > 1 ? " (shard " + run_options.shard.text() + " of them)" : std::string(), " into ",
           config.output, " (profile ", profile.name, ")");
  const ExperimentSummary summary = run_experiment(config, profile, std::cerr, isatty(STDERR_FILENO) != 0, run_options);
  out << config.output << ": " << summary.complete << " complete, " << summary.did_not_fit << " did not fit, "
      << summary.failed << " failed, " << summary.skipped << " already in the file"
      << (summary.stopped_by != 0 ? std::string(", stopped by ") + (summary.stopped_by == SIGINT ? "SIGINT" : "SIGTERM")
                                  : std::string())
      << "\n";
  if (summary.stopped_by != 0) return 128 + summary.stopped_by;
  return summary.failed > 0 ? 1 : 0;
}

int predict_command(const std::vector<std::string>& args, std::ostream& out) {
  const bool compare = !args.empty() && args.front() == "--compare";
  if (args.empty()) throw UsageError("predict: give an experiment config, or --compare FILE.h5");
  if (args.front().rfind("--", 0) == 0 && !compare)
    throw UsageError("predict: the experiment config comes first (predict CONFIG.yaml --profile ...), or --compare "
                     "FILE.h5, got '" + args.front() + "'");
  if (std::count(args.begin(), args.end(), "--compare") > (compare ? 1 : 0))
    throw UsageError(compare ? "predict: --compare given twice; compare one file at a time"
                             : "predict: --compare takes no experiment config; give predict --compare FILE.h5");
  std::vector<std::string> rest(args.begin() + 1, args.end());
  std::optional<MachineProfile> cpu;
  if (compare) {
    if (rest.empty() || rest.front().rfind("--", 0) == 0) throw UsageError("predict: --compare needs a results file");
    const std::string file = rest.front();
    for (const char* option : {"--profile", "--output"})
      for (const std::string& arg : rest)
        if (arg == option || arg.rfind(std::string(option) + "=", 0) == 0)
          throw UsageError(std::string("predict: --compare prices each run with the profile it was measured with "
                                       "and writes nothing; ") +
                           option + " is for predict CONFIG.yaml (--cpu-from swaps the CPU figures)");
    auto options = parse_options("predict", std::vector<std::string>(rest.begin() + 1, rest.end()), {"--cpu-from"});
    if (options.count("--cpu-from")) cpu = profile_named_by("predict: --cpu-from", options["--cpu-from"]);
    try {
      out << format_comparison(compare_predictions(file, cpu ? &*cpu : nullptr, &std::cerr));
    } catch (const ResultsError& e) {  // the store's refusals name the file; the option is said too
      throw ResultsError(std::string("predict --compare ") + e.what());
    }
    return 0;
  }
  auto options = parse_options("predict", rest, {"--profile", "--cpu-from", "--output"});
  const ExperimentConfig config = ExperimentConfig::load(args.front());
  if (!options.count("--profile")) throw UsageError("predict: --profile is required (a shipped name or a profile file)");
  if (options.count("--cpu-from")) cpu = profile_named_by("predict: --cpu-from", options["--cpu-from"]);
  std::vector<MachineProfile> profiles;
  std::vector<std::string> names;
  const std::string& listed = options["--profile"];
  for (std::size_t begin = 0, end = 0; end != std::string::npos; begin = end + 1) {
    end = listed.find(',', begin);
    const std::string name = listed.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (name.empty()) throw UsageError("predict: --profile: empty name in '" + listed + "'");
    if (std::count(names.begin(), names.end(), name))
      throw UsageError("predict: --profile names '" + name + "' twice in '" + listed + "'");
    names.push_back(name);
    const MachineProfile loaded = profile_named_by("predict: --profile", name);
    const MachineProfile profile = cpu ? with_cpu_of(loaded, *cpu) : loaded;
    for (std::size_t q = 0; q < profiles.size(); ++q)
      if (profiles[q].name == profile.name)
        throw UsageError("predict: --profile: '" + names[q] + "' and '" + name + "' are both profile '" + loaded.name +
                         "' (the name in a profile's file); rename one");
    profiles.push_back(profile);
  }
  std::string output = options.count("--output") ? options["--output"] : "";
  // As run: the output's folder once the profiles price the experiment.
  for (const MachineProfile& profile : profiles) check_profile_prices(config, profile);
  if (!output.empty()) prepare_output_option("predict: --output", output);
  if (output.empty()) {
    // The config's output names the measured file; the projection goes beside it.
    if (const std::string why = not_a_file_reason(config.output); !why.empty())
      throw ConfigError(args.front(), "output",
                        config.output + " " + why +
                            "; give a results file name (predict writes beside it, with -predicted before .h5)");
    const std::filesystem::path measured = config.output;
    output = (measured.parent_path() / (measured.stem().string() + "-predicted" + measured.extension().string())).string();
    create_output_folder("predict: " + args.front() + ": field 'output', with -predicted:", output);
  }
  const ExperimentSummary summary = [&] {
    try {
      return predict_experiment(config, profiles, output, std::cerr, command_as_typed);
    } catch (const ResultsError& e) {  // its one results file is the output
      throw ResultsError((options.count("--output") ? std::string("predict: --output ")
                                                    : "predict: output (the config's, -predicted) ") +
                         e.what());
    }
  }();
  out << output << ": " << summary.complete << " predicted, " << summary.did_not_fit << " do not fit, "
      << summary.failed << " failed (projected, not measured)\n";
  return summary.failed > 0 ? 1 : 0;
}

int merge_command(const std::vector<std::string>& args, std::ostream& out) {
  std::vector<std::string> files;
  MergeOptions merge;
  for (const std::string& arg : args) {
    bool* flag = arg == "--allow-different-machine" ? &merge.allow_different_machine
                 : arg == "--allow-missing"         ? &merge.allow_missing
                 : arg == "--drop-damaged"          ? &merge.drop_damaged
                                                    : nullptr;
    if (flag && *flag) throw UsageError("merge: " + arg + " given twice");
    if (flag) *flag = true;
    else if (arg.rfind("--", 0) == 0)
      throw UsageError("merge: unknown option '" + arg +
                       "' (its options: --allow-different-machine, --allow-missing, --drop-damaged)");
    else if (const auto same = std::find_if(files.begin(), files.end(), [&](const std::string& file) {
               std::error_code error;  // a file that does not exist is only itself
               return file == arg || std::filesystem::equivalent(file, arg, error);
             });
             same != files.end())
      throw UsageError("merge: " + arg + " given twice" + (*same == arg ? "" : " (as " + *same + ")") +
                       (same == files.begin() ? "; the first file is the output, the rest the inputs" : ""));
    else files.push_back(arg);
  }
  if (files.size() < 2) throw UsageError("merge: give the output file and at least one input file");
  const std::vector<std::string> inputs(files.begin() + 1, files.end());
  // Inputs that are not there are named before the output's folder is made.
  for (const std::string& input : inputs) {
    std::error_code error;
    if (!std::filesystem::exists(input, error))
      throw UsageError("merge: input " + input + " does not exist" + (error ? " (" + error.message() + ")" : ""));
  }
  prepare_output_option("merge: output", files.front());
  for (const std::string& line : merge_results(files.front(), inputs, merge)) out << line << "\n";
  return 0;
}

/// Checks every run group against its checksum and that it is a run of the
/// file's experiment; prints one line per damaged, unverifiable or stray run
/// and a summary; exit status 1 when any is damaged or stray, or the
/// experiment's runs cannot be listed.
int verify_command(const std::vector<std::string>& args, std::ostream& out) {
  for (const std::string& arg : args)
    if (arg.rfind("--", 0) == 0) throw UsageError("verify: unknown option '" + arg + "' (it takes none)");
  if (args.size() != 1) throw UsageError("verify: give one results file");
  const std::string& file = args.front();
  const ResultsReader reader(file);
  if (const std::string problem = results_file_problem(reader); !problem.empty())
    throw std::runtime_error(file + ": not an experiment's results file (" + problem +
                             "); verify checks files that `writescope run` wrote");
  const std::vector<std::string> runs = reader.exists("/runs") ? reader.list("/runs") : std::vector<std::string>{};
  int damaged = 0, unverified = 0;
  std::vector<std::string> damaged_runs;
  for (const std::string& run : runs) {
    const std::string group = "/runs/" + run;
    if (const std::string damage = run_damage(reader, group); !damage.empty()) {
      out << "DAMAGED " << run << ": " << damage << "\n";
      damaged_runs.push_back(run);
      ++damaged;
    } else if (!reader.has_attribute(group, "checksum")) {
      out << "unverified " << run << ": written before runs carried checksums\n";
      ++unverified;
    }
  }
  // A recorded config or profile this build no longer reads leaves the checksums' verdict standing.
  std::map<std::string, std::string> strays;
  bool names_checked = true;
  try {
    strays = runs_not_of_the_experiment(reader);
  } catch (const std::exception& e) {
    out << "cannot check which runs belong to the experiment: " << e.what() << "\n";
    names_checked = false;
  }
  // A damaged run is said once: its settings are part of what its checksum failed on.
  for (const std::string& run : damaged_runs) strays.erase(run);
  for (const auto& [run, why] : strays) out << "STRAY " << run << ": " << why << "\n";
  out << file << ": " << runs.size() << " runs, " << runs.size() - damaged - unverified << " verified, " << damaged
      << " damaged, " << unverified << " without a checksum"
      << (strays.empty() ? "" : ", " + std::to_string(strays.size()) + " not of the experiment");
  // A run stopped part-way (or a shard) holds fewer runs than it planned: complete as far as it goes.
  if (reader.has_attribute("/", "planned_runs"))
    if (const std::int64_t planned = reader.int_attribute("/", "planned_runs");
        planned > static_cast<std::int64_t>(runs.size() - strays.size()))
      out << "; " << planned - static_cast<std::int64_t>(runs.size() - strays.size()) << " of its " << planned
          << " planned runs not in the file";
  out << "\n";
  return damaged > 0 || !strays.empty() || !names_checked ? 1 : 0;
}

}  // namespace

int run_cli(int argc, char* argv[], std::ostream& out, std::ostream& err) {
  // Help before Kokkos starts: it would print its own for --help.
  // "-h" after an option that takes a value and has no "=" is that value
  // (--name -h), as parse_options takes it.
  const std::vector<std::string> given(argv + 1, argv + argc);
  const auto takes_a_value = [](const std::string& arg) {
    return arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos && arg != "--allow-different-machine" &&
           arg != "--allow-missing" && arg != "--drop-damaged";
  };
  bool help = !given.empty() && given.front() == "help";
  for (std::size_t i = 0; i < given.size(); ++i)
    help = help || given[i] == "--help" || (given[i] == "-h" && (i == 0 || !takes_a_value(given[i - 1])));
  // Why the output's first write failed (0: not known), which may be long before its final flush.
  const auto first_write_error = [&out] {
    const auto* descriptor = dynamic_cast<const impl::DescriptorOutput*>(out.rdbuf());
    return descriptor ? descriptor->first_error() : errno;
  };
  const auto not_written = [&err](const std::string& command, int error) {
    err << "writescope: " << command << ": the output could not be written"
        << (error != 0 ? std::string(" (") + std::strerror(error) + ")" : std::string()) << "\n";
    return 1;
  };
  if (help) {
    out << usage_text;
    errno = 0;
    return out.flush() ? 0 : not_written("help", first_write_error());
  }
  try {
    command_as_typed = command_line(given);  // Kokkos' options too, which it takes out of argv
    Runtime runtime(argc, argv);
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) throw UsageError("no command given", UsageError::Usage::whole);
    const std::string& command = args.front();
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    const auto dispatch = [&] {
      if (command == "info") return info_command(rest, out);
      if (command == "calibrate") return calibrate_command(rest, out);
      if (command == "predict") return predict_command(rest, out);
      if (command == "generate") return generate_command(rest, out);
      if (command == "make-checkpoint") return make_checkpoint_command(rest);
      if (command == "run") return run_command(rest, out);
      if (command == "verify") return verify_command(rest, out);
      if (command == "merge") return merge_command(rest, out);
      // Internal: one CPU attention measurement at this process' thread count.
      if (command == "calibrate-attention") return calibrate_attention_command(rest, out);
      // An option where the command goes: a misspelt one (Kokkos takes out the ones it knows).
      if (command.rfind("-", 0) == 0)
        throw UsageError("unknown option '" + command + "' before the command: give the command first (writescope " +
                         "COMMAND [options])");
      throw UsageError("unknown command '" + command + "'", UsageError::Usage::whole);
    };
    const int status = dispatch();
    // What went to the output must have arrived (a full disk, a closed
    // descriptor): a profile or listing lost is a failure, not status 0.
    errno = 0;
    // A closed pipe (`| head`) is the reader's choice, and generate says so itself.
    if (!out.flush())
      if (const int error = first_write_error(); error != EPIPE) return not_written(command, error);
    // Stopped by a signal it caught: dies of it after its output, so that a
    // calling shell script stops too (bash goes on after a child that merely
    // exits 130).
    if (const int signal = stop_signal.load(); signal != 0 && status == 128 + signal) {
      std::fflush(nullptr);
      std::signal(signal, SIG_DFL);
      std::raise(signal);
    }
    return status;
  } catch (const UsageError& e) {
    err << "writescope: " << e.what() << "\n";
    if (e.whole_usage()) err << "\n" << usage_text;
    else err << "(`writescope help` lists the commands and their options)\n";
    return 2;
  } catch (const ArgumentError& e) {
    err << "writescope: " << e.what() << "\n(`writescope help` lists the commands and their options)\n";
    return 2;
  } catch (const CheckpointError& e) {
    err << "writescope: checkpoint error: " << e.what() << "\n";
    return 1;
  } catch (const ConfigError& e) {
    err << "writescope: configuration error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    err << "writescope: " << e.what() << "\n";
    return 1;
  } catch (const H5::Exception& e) {
    // HDF5's C++ exceptions do not derive from std::exception; the results
    // store turns its own into ResultsError, so this is a library call elsewhere.
    err << "writescope: HDF5 error in " << e.getFuncName() << ": " << e.getDetailMsg() << "\n";
    return 1;
  }
}

}  // namespace writescope
