#include "experiments/harness.hpp"

#include <Kokkos_Core.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "attention/decode.hpp"
#include "attention/host_prefetch.hpp"
#include "framework/files.hpp"
#include "framework/log.hpp"
#include "framework/cpu_path.hpp"
#include "framework/machine.hpp"
#include "framework/results_store.hpp"
#include "framework/runtime.hpp"
#include "experiments/impl/run_record.hpp"
#include "layouts/inplace_kv_cache.hpp"

namespace writescope {

using impl::attempt_run;
using impl::prepare_run;
using impl::run_yaml;
using impl::RunFailure;
using impl::RunResult;
using impl::RunSetup;
using impl::write_experiment_attributes;
using impl::write_run;

namespace {

/// The schema a results file's root attribute `format` names (analysis/README.md).
constexpr char results_format[] = "writescope-results-1";

/// ", " between the entries of `items`.
std::string join_with(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}
std::string joined(const std::vector<std::string>& items) { return join_with(items, ", "); }

/// "32GiB", "256MiB", or the exact byte count: run ids must not round.
std::string exact_size(std::uint64_t bytes) {
  for (const auto& [size, name] : {std::pair{1ull << 30, "GiB"}, std::pair{1ull << 20, "MiB"}, std::pair{1ull << 10, "KiB"}})
    if (bytes >= size && bytes % size == 0) return std::to_string(bytes / size) + name;
  return std::to_string(bytes) + "B";
}

std::string format_tokens(std::int64_t tokens) {
  return tokens % 1024 == 0 ? std::to_string(tokens / 1024) + "K" : std::to_string(tokens);
}

std::string format_duration(double seconds) {
  const long s = std::lround(seconds);
  std::ostringstream out;
  if (s >= 3600) out << s / 3600 << "h";
  if (s >= 60) out << (s / 60) % 60 << "m";
  out << s % 60 << "s";
  return out.str();
}

ModelSpec parse_model(const ConfigNode& node) {
  node.allow_only({"preset", "layers", "hidden_scale"});
  ModelSpec spec;
  spec.preset = node.get<std::string>("preset");
  try {
    spec.config = model_preset(spec.preset);
  } catch (const std::invalid_argument& e) {
    node.fail("preset", e.what());
  }
  if (node.has("layers")) {
    // Never past the preset's: a model's KV bytes a token stay the preset's at most.
    spec.overrides.layers = static_cast<int>(node.get_integer("layers", 1, spec.config.layers, "the preset's layers"));
  }
  spec.overrides.hidden_scale = node.get_or<double>("hidden_scale", 1.0);
  if (!(spec.overrides.hidden_scale > 0 && spec.overrides.hidden_scale <= 1))
    node.fail("hidden_scale", "must be in (0, 1]");
  const ModelConfig preset = spec.config;
  try {
    spec.config = apply_overrides(spec.config, spec.overrides);
  } catch (const std::invalid_argument& e) {
    node.fail(e.what());
  }
  // The model as it runs names it: overrides that change nothing (the
  // preset's own layers) leave the preset's name, so that one model listed
  // two ways is refused as a repeat instead of measured twice.
  std::ostringstream label;
  label << spec.preset;
  if (spec.config.math_settings() != preset.math_settings()) {
    label << " (" << spec.config.layers << " layers";
    if (spec.overrides.hidden_scale != 1.0) label << ", hidden " << spec.config.hidden;
    label << ")";
  }
  spec.label = label.str();
  return spec;
}

/// What the systems of `run` are built for.
SystemContext system_context(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile) {
  SystemContext context{run.model->config, profile, run.batch, run.context, config.system_options};
  context.vram_budget = run.vram_budget;
  context.block_tokens = config.block_tokens;
  context.max_rows = std::max(run.batch, config.context_fill == "prefill" ? 256 : 1);
  // Streaming chunks of the profile's size (the smallest copy near full link
  // rate), but never more blocks than one layer of the whole batch holds: the
  // two landing buffers are VRAM workspace.
  const std::uint64_t kv_block_bytes =
      static_cast<std::uint64_t>(run.model->config.attention().block_geometry(config.block_tokens).block_elements()) *
      sizeof(bf16);
  const std::uint64_t layer_blocks = static_cast<std::uint64_t>(run.batch) *
                                     ((config.max_sequence_tokens + config.block_tokens - 1) / config.block_tokens);
  context.stream_chunk_blocks = static_cast<int>(
      std::clamp<std::uint64_t>((profile.link_chunk_bytes + kv_block_bytes - 1) / kv_block_bytes, 1, layer_blocks));
  if (!run.expert_policy.empty()) context.options.writescope_experts = run.expert_policy;
  return context;
}

/// Each entry of a setting list names runs of its own: a repeat would give two
/// runs one id (RunSpec::id) and measure one setting twice.
template <class T, class Name>
void refuse_repeats(const ConfigNode& node, const std::string& key, const std::vector<T>& values, Name name) {
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t j = i + 1; j < values.size(); ++j)
      if (values[i] == values[j])
        node.fail(key, "entries " + std::to_string(i + 1) + " and " + std::to_string(j + 1) + " are both " +
                           name(values[i]));
}

}  // namespace

ExperimentConfig ExperimentConfig::load(const std::string& path) {
  const ConfigNode root = ConfigNode::load_file(path);
  ExperimentConfig config = from_config(root);
  config.text = root.text();
  return config;
}

ExperimentConfig ExperimentConfig::from_config(const ConfigNode& root, bool recorded) {
  root.allow_only({"name", "output", "profile", "models", "systems", "batch_sizes", "contexts", "max_total_tokens",
                   "max_sequence_tokens", "budgets", "steps", "repetitions", "seed", "block_tokens", "context_fill",
                   "options"});
  ExperimentConfig c;
  c.name = root.get_text("name");
  c.canonical = YAML::Dump(root.yaml());
  c.output = root.get_text("output");
  c.profile = root.get_text("profile");
  for (const ConfigNode& model : root.elements("models")) c.models.push_back(parse_model(model));
  std::vector<std::string> labels;
  for (const ModelSpec& model : c.models) labels.push_back(model.label);
  refuse_repeats(root, "models", labels, [](const std::string& label) { return "'" + label + "'"; });
  c.systems = root.get_list<std::string>("systems");
  for (const std::string& system : c.systems) {
    const auto& known = system_names();
    if (std::find(known.begin(), known.end(), system) == known.end())
      root.fail("systems", "unknown system '" + system + "' (known: " + joined(known) + ")");
  }
  refuse_repeats(root, "systems", c.systems, [](const std::string& system) { return "'" + system + "'"; });
  // Far past any machine's memory, and short of overflowing a batch's
  // tokens x bytes a token (at most 2^17, Mixtral's: models never have more
  // layers than their preset) in the budgets' arithmetic.
  constexpr std::int64_t most_tokens = std::int64_t{1} << 40, most_batch_tokens = std::int64_t{1} << 44;
  constexpr int most_batch = 1 << 16, most_steps = 1 << 20;
  constexpr std::int64_t most_int = std::numeric_limits<int>::max();
  for (std::int64_t batch : root.get_integer_list("batch_sizes", 1, most_batch))
    c.batch_sizes.push_back(static_cast<int>(batch));
  refuse_repeats(root, "batch_sizes", c.batch_sizes, [](int batch) { return std::to_string(batch); });
  c.contexts = root.get_integer_list("contexts", 1, most_tokens);
  refuse_repeats(root, "contexts", c.contexts, [](std::int64_t context) { return std::to_string(context); });
  c.max_total_tokens =
      root.get_integer_or("max_total_tokens", 0, 0, std::numeric_limits<std::int64_t>::max(), "0: no limit");
  if (c.max_total_tokens > 0) {
    const std::int64_t fewest = std::int64_t{*std::min_element(c.batch_sizes.begin(), c.batch_sizes.end())} *
                                *std::min_element(c.contexts.begin(), c.contexts.end());
    if (fewest > c.max_total_tokens)
      root.fail("max_total_tokens", "leaves no run: the smallest batch x context is " + std::to_string(fewest) +
                                        " tokens, over " + std::to_string(c.max_total_tokens));
    // A batch size or context left without any run is most likely a slip: said, not silently dropped.
    const std::int64_t smallest_batch = *std::min_element(c.batch_sizes.begin(), c.batch_sizes.end()),
                       shortest = *std::min_element(c.contexts.begin(), c.contexts.end());
    std::vector<std::string> batches, contexts;
    for (int batch : c.batch_sizes)
      if (batch * shortest > c.max_total_tokens) batches.push_back(std::to_string(batch));
    for (std::int64_t context : c.contexts)
      if (smallest_batch * context > c.max_total_tokens) contexts.push_back(std::to_string(context));
    if (!recorded && (!batches.empty() || !contexts.empty()))
      log_warn("config '", c.name, "': max_total_tokens ", c.max_total_tokens, " leaves no run of",
               batches.empty() ? "" : " batch sizes " + joined(batches),
               batches.empty() || contexts.empty() ? "" : " and",
               contexts.empty() ? "" : " contexts " + joined(contexts));
  }
  const ConfigNode budgets = root.child("budgets");
  budgets.allow_only({"vram", "pinned", "host"});
  if (budgets.yaml()["vram"].IsSequence()) {
    for (const ConfigNode& v : budgets.elements("vram")) {
      const std::string text = v.as<std::string>();
      const auto bytes = parse_byte_size(text);
      if (!bytes || *bytes == 0)
        budgets.fail("vram", "entries must be positive byte sizes such as 32GiB; got '" + text + "'" +
                                 (bytes ? std::string() : ": " + byte_size_problem(text)));
      c.vram_budgets.push_back(*bytes);
    }
  } else {
    c.vram_budgets.push_back(budgets.get_bytes("vram"));
    if (c.vram_budgets.back() == 0) budgets.fail("vram", "must be a positive byte size such as 32GiB");
  }
  refuse_repeats(budgets, "vram", c.vram_budgets, [](std::uint64_t bytes) { return format_byte_size(bytes); });
  c.pinned_limit = budgets.get_bytes("pinned");
  c.host_budget = budgets.get_bytes("host");
  if (c.host_budget == 0) budgets.fail("host", "must be a positive byte size such as 112GiB");
  if (c.pinned_limit > c.host_budget)
    budgets.fail("pinned", "the pinned limit (" + format_byte_size(c.pinned_limit) +
                               ") is host memory too: it cannot exceed the host budget (" +
                               format_byte_size(c.host_budget) + ")");
  if (const auto steps = root.optional_child("steps")) {
    steps->allow_only({"warmup", "measured", "profile_tokens"});
    // A system's first step grows its buffers (a profiling prompt grows them
    // before it): measured, it would time allocations for some systems only.
    // Recorded configs of files from before this check may hold 0.
    c.warmup_steps = static_cast<int>(steps->get_integer_or(
        "warmup", c.warmup_steps, recorded ? 0 : 1, most_steps,
        recorded ? std::string() : "a first step grows buffers, and measured it would time their allocation"));
    c.measured_steps = static_cast<int>(steps->get_integer_or("measured", c.measured_steps, 1, most_steps));
    c.profile_tokens = static_cast<int>(steps->get_integer_or("profile_tokens", c.profile_tokens, 1, most_int));
  }
  const std::int64_t longest =
      *std::max_element(c.contexts.begin(), c.contexts.end()) + c.warmup_steps + c.measured_steps;
  // Stated, never derived from the runs: a default of the longest run's final
  // length would let the write policies plan for exactly where the runs end.
  if (!root.has("max_sequence_tokens") && !recorded)
    root.fail("max_sequence_tokens",
              "is required: the longest sequence the systems plan for (a server's configured maximum, at least " +
                  std::to_string(longest) + " tokens here)");
  const int largest_batch = *std::max_element(c.batch_sizes.begin(), c.batch_sizes.end());
  if (longest > most_batch_tokens / largest_batch)
    root.fail("contexts", "the longest context plus the warm-up and measured steps (" + std::to_string(longest) +
                              " tokens) times the largest batch (" + std::to_string(largest_batch) +
                              ") must be at most 2^44 tokens");
  c.max_sequence_tokens = root.get_integer_or(
      "max_sequence_tokens", longest, longest, most_batch_tokens / largest_batch,
      "from the longest context plus the warm-up and measured steps to 2^44 tokens over the largest batch, " +
          std::to_string(largest_batch));
  // Allowed, but then the longest runs' plan is their final length, which a
  // server planning for its own maximum would not know: said.
  if (!recorded && c.max_sequence_tokens == longest)
    log_warn("config '", c.name, "': max_sequence_tokens ", longest, " is where the longest runs end (context ",
             longest - c.warmup_steps - c.measured_steps, " + ", c.warmup_steps + c.measured_steps,
             " steps): their write policies plan for exactly their final length; give the servers' configured "
             "maximum");
  // The profiling prompt is a sequence the systems hold too: a stated one
  // past the planned maximum would not fit the plan (the default, 256, is
  // exempt, as configs before this check ran with it; a recorded config is
  // read as it was written).
  if (const auto steps = root.optional_child("steps");
      !recorded && steps && steps->has("profile_tokens") && c.profile_tokens > c.max_sequence_tokens)
    steps->fail("profile_tokens", "the profiling prompt (" + std::to_string(c.profile_tokens) +
                                      " tokens) must fit max_sequence_tokens (" +
                                      std::to_string(c.max_sequence_tokens) + "), the longest sequence planned for");
  c.repetitions = static_cast<int>(root.get_integer_or("repetitions", 1, 1, 1000));
  c.seed = static_cast<std::uint64_t>(root.get_integer_or("seed", 1, 0, std::numeric_limits<std::int64_t>::max()));
  c.block_tokens = static_cast<int>(root.get_integer_or("block_tokens", 64, 1, 4096));
  for (const ModelSpec& model : c.models)
    if (const std::string error = gpu_decode_block_tokens_error(model.config.attention(), c.block_tokens);
        !error.empty())
      root.fail("block_tokens", error);
  c.context_fill = root.has("context_fill") ? root.get_choice("context_fill", {"synthetic", "prefill"}) : "synthetic";
  if (const auto options = root.optional_child("options")) {
    options->allow_only({"expert_vram_share", "score_decay", "prefetch_experts", "writescope_experts"});
    SystemOptions& o = c.system_options;
    o.expert_vram_share = options->get_or<double>("expert_vram_share", o.expert_vram_share);
    if (!(o.expert_vram_share >= 0 && o.expert_vram_share <= 1)) options->fail("expert_vram_share", "must be in [0, 1]");
    o.score_decay = options->get_or<double>("score_decay", o.score_decay);
    if (!(o.score_decay >= 0 && o.score_decay < 1)) options->fail("score_decay", "must be in [0, 1)");
    o.prefetch_experts = static_cast<int>(options->get_integer_or("prefetch_experts", 0, 0, most_int));
    if (options->has("writescope_experts")) {
      const std::string choice = options->get<std::string>("writescope_experts");
      const auto& known = expert_policy_names();
      c.auto_writescope_experts = choice == "auto";
      if (!c.auto_writescope_experts && std::find(known.begin(), known.end(), choice) == known.end())
        options->fail("writescope_experts", "must be one of auto, " + joined(known) + ", got '" + choice + "'");
      if (!c.auto_writescope_experts) o.writescope_experts = choice;
    }
  }
  return c;
}

std::string RunSpec::id() const {
  std::ostringstream out;
  out << model->label << " | " << system << (expert_policy.empty() ? "" : " (" + expert_policy + " experts)")
      << " | batch " << batch << " | context " << context << " | vram " << exact_size(vram_budget) << " | rep "
      << repetition;
  return group_name(out.str());
}

namespace {

/// The context WriteScope's own expert policy is picked in for `setting`: its
/// expert copies priced at the link rate the contract leaves them (pageable
/// where the pinned limit cannot hold the store beside its KV band), as its
/// run will copy them.
SystemContext expert_choice_context(const ExperimentConfig& config, const RunSpec& setting,
                                    const MachineProfile& profile) {
  SystemContext context = system_context(config, setting, profile);
  RunSpec copying = setting;
  copying.system = "writescope";
  copying.expert_policy = "hybrimoe";  // a policy that copies experts, so the plan decides their pinning
  try {
    context.experts_pinned = impl::prepare_run(config, copying, profile).options.pin_experts;
  } catch (const ModelBudgetError&) {
    // The run does not fit whichever policy it takes.
  }
  return context;
}

}  // namespace

void check_profile_prices(const ExperimentConfig& config, const MachineProfile& profile) {
  // Every system plans with the CPU's attention rate: a profile without the
  // model's shape would fail every run one by one.
  for (const ModelSpec& model : config.models) {
    const std::string shape = model.config.attention().name;
    if (!profile.cpu_attention_gbps.count(shape) || profile.cpu_attention_gbps.at(shape).empty())
      throw std::invalid_argument("machine profile '" + profile.name + "' has no CPU attention rate for shape '" +
                                  shape + "' (model '" + model.label + "'): calibrate that machine with writescope " +
                                  "calibrate (projections with writescope predict can take the CPU figures of a profile that "
                                  "has it: --cpu-from)");
  }
}

std::vector<RunSpec> expand_runs(const ExperimentConfig& config, const MachineProfile& profile) {
  check_profile_prices(config, profile);
  std::vector<std::string> baselines, shared_policies;
  for (const std::string& s : config.systems)
    if (s != "writescope") baselines.push_back(s);
  for (const std::string& policy : expert_policy_names())
    if (std::count(baselines.begin(), baselines.end(), policy)) shared_policies.push_back(policy);
  const bool writescope = std::count(config.systems.begin(), config.systems.end(), "writescope") > 0;
  std::vector<RunSpec> runs;
  for (const ModelSpec& model : config.models)
    for (std::uint64_t vram : config.vram_budgets)
      for (int batch : config.batch_sizes)
        for (std::int64_t context : config.contexts) {
          if (config.max_total_tokens > 0 && batch * context > config.max_total_tokens) continue;
          const RunSpec setting{&model, "", "", true, batch, context, vram, 0};
          std::vector<RunSpec> systems;  // the setting's runs of repetition 0
          for (const std::string& system : baselines) {
            RunSpec run = setting;
            run.system = system;
            systems.push_back(run);
          }
          if (writescope) {
            const std::string choice = config.auto_writescope_experts
                                           ? writescope_expert_choice(expert_choice_context(config, setting, profile))
                                           : config.system_options.writescope_experts;
            std::vector<std::string> policies = shared_policies;
            if (!std::count(policies.begin(), policies.end(), choice)) policies.push_back(choice);
            for (const std::string& policy : policies)
              systems.push_back(RunSpec{&model, "writescope", policy, policy == choice, batch, context, vram, 0});
          }
          // A repetition's systems back to back, so that the machine's drift
          // (the Zen 5 VM's DRAM read moved between 32 and 62 GB/s within
          // minutes) falls on every system alike, not on whichever ran its
          // repetitions last: repetitions in pairs, the second the first
          // reversed (a system k-th in one is k-th from the end in the other),
          // each pair rotated by one more (the first and last change).
          const auto count = static_cast<int>(systems.size());
          for (int rep = 0; rep < config.repetitions; ++rep)
            for (int i = 0; i < count; ++i) {
              const int k = rep % 2 == 0 ? i : count - 1 - i;
              RunSpec run = systems[static_cast<std::size_t>((k + rep / 2) % count)];
              run.repetition = rep;
              runs.push_back(run);
            }
        }
  return runs;
}

Shard Shard::parse(const std::string& text) {
  Shard shard;
  const auto slash = text.find('/');
  std::size_t used_index = 0, used_count = 0;
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    shard.index = std::stoi(text.substr(0, slash), &used_index);
    shard.count = std::stoi(text.substr(slash + 1), &used_count);
  } catch (const std::exception&) {
    used_index = 0;
  }
  if (used_index == 0 || used_index != slash || used_count != text.size() - slash - 1 || shard.count < 1 ||
      shard.index < 0 || shard.index >= shard.count)
    throw std::invalid_argument("--shard must be K/N with 0 <= K < N (K as a Slurm array task id), got '" + text + "'");
  return shard;
}

double predicted_run_seconds(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile) {
  const ModelConfig& m = run.model->config;
  const double dram = std::max(1.0, profile.cpu_dram_read_gbps) * 1e9;
  const double experts_rate = (profile.cpu_expert_gbps > 0 ? profile.cpu_expert_gbps : profile.cpu_dram_read_gbps) * 1e9;
  const double kv_per_token = static_cast<double>(m.kv_elements_per_token()) * sizeof(bf16) * m.layers;
  const double steps = config.warmup_steps + config.measured_steps;
  const double context_tokens = static_cast<double>(run.batch) * static_cast<double>(run.context);
  const double active_experts = std::min<double>(static_cast<double>(run.batch) * m.experts_per_token, m.experts);
  const double build = static_cast<double>(MoeModel::expert_store_bytes(m)) / dram;
  const double fill = context_tokens * kv_per_token / dram;
  const double attention = steps * (context_tokens + run.batch * steps / 2) * kv_per_token / dram;
  const double experts = steps * (m.layers - m.dense_layers) * active_experts *
                         static_cast<double>(MoeModel::expert_bytes(m)) / std::max(1.0, experts_rate);
  return build + fill + attention + experts;
}

std::vector<RunSpec> shard_runs(const std::vector<RunSpec>& runs, const ExperimentConfig& config,
                                const MachineProfile& profile, Shard shard) {
  // A setting's systems are compared with each other, so they share a node
  // (one machine setup: the report compares runs within one).
  auto same_setting = [](const RunSpec& a, const RunSpec& b) {
    return a.model == b.model && a.vram_budget == b.vram_budget && a.batch == b.batch && a.context == b.context &&
           a.repetition == b.repetition;
  };
  std::vector<std::size_t> setting_of(runs.size());
  std::vector<double> setting_cost;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::size_t first = 0;
    while (!same_setting(runs[first], runs[i])) ++first;
    if (first == i) {
      setting_of[i] = setting_cost.size();
      setting_cost.push_back(0);
    } else {
      setting_of[i] = setting_of[first];
    }
    setting_cost[setting_of[i]] += predicted_run_seconds(config, runs[i], profile);
  }
  std::vector<std::size_t> by_cost(setting_cost.size());
  for (std::size_t s = 0; s < by_cost.size(); ++s) by_cost[s] = s;
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](std::size_t a, std::size_t b) { return setting_cost[a] > setting_cost[b]; });
  // Shards past the settings' count get none (the first least-loaded shard is
  // always among the first `settings`): no allocation as large as the count.
  std::vector<double> load(std::max<std::size_t>(1, std::min<std::size_t>(shard.count, setting_cost.size())), 0.0);
  std::vector<bool> mine(setting_cost.size(), false);
  for (std::size_t s : by_cost) {
    const auto least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[static_cast<std::size_t>(least)] += setting_cost[s];
    mine[s] = least == shard.index;
  }
  std::vector<RunSpec> share;
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (mine[setting_of[i]]) share.push_back(runs[i]);
  return share;
}

std::vector<std::filesystem::path> shipped_profile_folders() {
  std::vector<std::filesystem::path> folders;
  if (const char* folder = std::getenv("WRITESCOPE_PROFILES")) folders.emplace_back(folder);
  std::error_code error;
  const auto executable = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) folders.push_back(executable.parent_path().parent_path() / "share" / "writescope" / "profiles");
  folders.emplace_back("experiments/profiles");
  return folders;
}

namespace {

/// The profile in the file `path`, whose per-shape entries must name model
/// presets' attention shapes (the shapes `calibrate` measures and configs
/// run); a CPU attention rate above the DRAM read rate, which it reads its
/// KV at, is worth a warning.
MachineProfile load_profile_file(const std::string& path) {
  MachineProfile profile = MachineProfile::load(path);
  const std::vector<std::string> presets = model_preset_names();
  auto check_shapes = [&](const std::string& field, const auto& by_shape) {
    for (const auto& entry : by_shape)
      if (std::find(presets.begin(), presets.end(), entry.first) == presets.end())
        throw ConfigError(path, field + "." + entry.first,
                          "no model preset has this attention shape (presets: " + model_preset_list() + ")");
  };
  check_shapes("gpu.attention_gbps", profile.gpu_attention_gbps);
  check_shapes("cpu.attention_gbps", profile.cpu_attention_gbps);
  check_shapes("cpu.streamed_attention_gbps", profile.cpu_streamed_attention_gbps);
  check_shapes("cpu.decode_path", profile.cpu_decode_path);
  check_shapes("cpu.streamed_decode_path", profile.cpu_streamed_decode_path);
  check_shapes("cpu.next_pass_prefetch", profile.cpu_next_pass_prefetch);
  check_shapes("cpu.head_major_pass", profile.cpu_head_major_pass);
  check_shapes("cpu.token_major_pass", profile.cpu_token_major_pass);
  for (const auto* rates : {&profile.cpu_attention_gbps, &profile.cpu_streamed_attention_gbps})
    for (const auto& [shape, by_threads] : *rates)
      for (const auto& [threads, gbps] : by_threads)
        if (gbps > profile.cpu_dram_read_gbps)
          log_info("profile ", path, ": warning: CPU attention of ", shape, " at ", threads, " threads (", gbps,
                   " GB/s) is faster than cpu.dram_read_gbps (", profile.cpu_dram_read_gbps,
                   " GB/s), the rate it reads its KV at; check both");
  return profile;
}

}  // namespace

void create_output_folder(const std::string& option, const std::string& path) {
  // Checked before any folder is made: "out/" would make out and then be
  // refused. An existing folder is left to the writer, which names a file to give.
  std::error_code error;
  if (const std::string why = not_a_file_reason(path); !why.empty() && !std::filesystem::is_directory(path, error))
    throw std::invalid_argument(option + " " + path + " " + why + "; give a file name");
  const auto parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::filesystem::create_directories(parent, error);
  if (error)
    throw std::invalid_argument(option + " " + path + ": its folder " + parent.string() + " cannot be created (" +
                                error.message() + ")");
}

MachineProfile find_profile(const std::string& name_or_path) {
  if (std::filesystem::is_regular_file(name_or_path)) return load_profile_file(name_or_path);
  std::string searched;
  for (const std::filesystem::path& folder : shipped_profile_folders()) {
    const std::filesystem::path path = folder / (name_or_path + ".yaml");
    if (std::filesystem::is_regular_file(path)) return load_profile_file(path.string());
    searched += (searched.empty() ? "" : ", ") + folder.string();
  }
  throw std::invalid_argument("profile '" + name_or_path + "' is neither a file nor a profile in " + searched +
                              " (`writescope calibrate --output FILE` measures one)");
}

namespace {

/// A bar on a terminal; otherwise a line at each run's start and end, and
/// within a run, at most every `line_seconds`, its phase (logs of long runs
/// under a batch system show them moving). The ETA is the experiment's once a
/// run has finished; during the first run's decode steps, that run's own.
class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  Progress(std::ostream& out, bool tty, std::size_t runs, double line_seconds)
      : out_(out), tty_(tty), runs_(runs), line_seconds_(line_seconds) {}

  void start_run(std::size_t index, const RunSpec& run) {
    index_ = index;
    run_seconds_left_.reset();
    run_start_ = last_line_ = Clock::now();
    label_ = run.model->preset + " " + run.system + (run.expert_policy.empty() ? "" : "[" + run.expert_policy + "]") +
             " b" + std::to_string(run.batch) + " " +
             format_tokens(run.context) + (run.repetition ? " r" + std::to_string(run.repetition) : "");
    if (!tty_) out_ << "run " << index + 1 << "/" << runs_ << ": " << label_ << eta() << std::endl;
    draw("");
  }
  /// `run_seconds_left`: the current run's estimate of its own time left, if it has one.
  void step(const std::string& phase, std::optional<double> run_seconds_left = std::nullopt) {
    run_seconds_left_ = run_seconds_left;
    if (tty_) {
      draw(phase);
    } else if (const auto now = Clock::now(); std::chrono::duration<double>(now - last_line_).count() >= line_seconds_) {
      last_line_ = now;
      out_ << "run " << index_ + 1 << "/" << runs_ << ": " << label_ << ": " << phase << eta() << std::endl;
    }
  }
  void finish_run(double seconds, const std::string& outcome) {
    elapsed_ += seconds;
    ++measured_;
    if (tty_) out_ << "\r\033[K";
    out_ << "run " << index_ + 1 << "/" << runs_ << ": " << label_ << ": " << outcome << std::endl;
  }

 private:
  /// The runs left at the mean run's time, less what the current run has taken.
  std::string eta() const {
    if (measured_ == 0)
      return run_seconds_left_ ? " (ETA of this run " + format_duration(*run_seconds_left_) + ")" : "";
    const double per_run = elapsed_ / measured_;
    const double in_run = std::chrono::duration<double>(Clock::now() - run_start_).count();
    return " (ETA " + format_duration(std::max(0.0, per_run * static_cast<double>(runs_ - index_) - in_run)) + ")";
  }
  void draw(const std::string& phase) {
    if (!tty_) return;
    constexpr int width = 24;
    const int filled = static_cast<int>(width * index_ / std::max<std::size_t>(1, runs_));
    out_ << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '-') << "] " << index_ + 1 << "/"
         << runs_ << " " << label_ << (phase.empty() ? "" : " " + phase) << eta() << std::flush;
  }

  std::ostream& out_;
  bool tty_;
  std::size_t runs_, index_ = 0, measured_ = 0;
  double line_seconds_, elapsed_ = 0;
  std::optional<double> run_seconds_left_;
  Clock::time_point run_start_, last_line_;
  std::string label_;
};

/// The routed experts of the last model built, for the next run of the same model.
struct ExpertCache {
  const ModelSpec* model = nullptr;
  std::shared_ptr<HostExpertStore> experts;
};

/// Host memory a system lays out under the one memory contract.
struct HostMemoryPlan {
  bool experts_pinned = false;
  std::uint64_t kv_pinned = 0, kv_host = 0;
};

/// Bytes of KV that `system`'s write policy fixes in the host pool when
/// `batch` prompts of `context` tokens are filled as MoeModel fills them
/// (sequence by sequence, chunks of fill_chunk_tokens), planned for
/// `planned_tokens`, with room in every pool: what a system that spills to
/// both pools wants of its host pool. Layers decide alike, so one layer is placed on a bookkeeping cache.
std::uint64_t host_pool_wish(const System& system, const ModelConfig& c, std::uint64_t vram_kv,
                             const BlockGeometry& geometry, int batch, std::int64_t context,
                             std::int64_t planned_tokens) {
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(geometry.block_elements()) * sizeof(bf16);
  const std::uint64_t prompt_blocks = static_cast<std::uint64_t>(batch) *
                                      static_cast<std::uint64_t>((context + geometry.block_tokens - 1) /
                                                                 geometry.block_tokens);
  const std::uint64_t room = prompt_blocks * block_bytes;
  InplaceKVCache<bf16> cache(KVCacheShape{c.layers, geometry}, KVCacheBudgets{vram_kv, room, room},
                             BudgetPolicy::strict, KVStorage::bookkeeping);
  const std::unique_ptr<KVPolicy> policy = system.kv_policy(c.attention(), cache);
  for (int s = 0; s < batch; ++s) {
    const int sequence = cache.add_sequence();
    for (std::int64_t begin = 0; begin < context; begin += MoeModel::fill_chunk_tokens) {
      const std::int64_t count = std::min(MoeModel::fill_chunk_tokens, context - begin);
      policy->place_and_write(0, sequence, count, std::max(planned_tokens, begin + count), false,
                              [&](const std::vector<Region>& regions) {
                                cache.record_append(0, sequence, count, regions);
                              });
    }
  }
  return cache.region_bytes(Region::cpu_resident) * static_cast<std::uint64_t>(c.layers);
}

/// Sizes `system`'s KV pools for `planned_tokens` per sequence (what a server
/// is configured for; a profiling prompt of `profile_tokens` before them)
/// within the contract: all host memory of its data within `host_budget`, all
/// it pins within `pinned_limit`. The KV band and the host pool come first
/// (without them the system cannot run); the expert store is page-locked only
/// if the system copies experts to the GPU and the pinned limit still holds it.
/// Where host memory cannot give both of WriteScope's pools the whole spill,
/// its host pool keeps what its write policy fixes there for the run's prompts
/// (`context` tokens each) and the band takes the rest. ModelBudgetError names
/// the bytes when the run's own KV (`run_tokens` per sequence) or the experts
/// cannot fit.
HostMemoryPlan plan_host_memory(const System& system, const ModelConfig& c, const ModelOptions& options, int batch,
                                std::int64_t context, std::int64_t planned_tokens, std::int64_t profile_tokens,
                                std::int64_t run_tokens, std::uint64_t host_budget, std::uint64_t pinned_limit) {
  HostMemoryPlan plan;
  const std::uint64_t experts = MoeModel::expert_store_bytes(c);
  const std::uint64_t staging = MoeModel::pinned_staging_bytes(c, options);
  if (experts + staging > host_budget)
    throw ModelBudgetError("host budget " + format_byte_size(host_budget) + " cannot hold the routed experts (" +
                           format_byte_size(experts) + ") and staging buffers (" + format_byte_size(staging) + ")");
  if (staging > pinned_limit)
    throw ModelBudgetError("pinned limit " + format_byte_size(pinned_limit) + " cannot hold the staging buffers (" +
                           format_byte_size(staging) + ")");
  const VramUse vram = MoeModel::vram_plan(c, options);
  const BlockGeometry geometry = c.attention().block_geometry(options.block_tokens);
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(geometry.block_elements()) * sizeof(bf16);
  const std::uint64_t layer_block_bytes = block_bytes * static_cast<std::uint64_t>(c.layers);
  const std::uint64_t vram_blocks = vram.kv / layer_block_bytes;  // per layer
  auto spilled = [&](int sequences, std::int64_t tokens) {
    const std::uint64_t blocks = static_cast<std::uint64_t>(sequences) *
                                 static_cast<std::uint64_t>((tokens + options.block_tokens - 1) / options.block_tokens);
    return (blocks > vram_blocks ? blocks - vram_blocks : 0) * layer_block_bytes;
  };
  const std::uint64_t planned = std::max(spilled(batch, planned_tokens), spilled(1, profile_tokens));
  const std::uint64_t needed = std::max(spilled(batch, run_tokens), spilled(1, profile_tokens));
  const std::uint64_t host_left = host_budget - experts - staging;
  const std::uint64_t pinned_left = pinned_limit - staging;
  // What the KV beyond VRAM may use: WriteScope's write policy keeps `wish`
  // in its host pool and sends every other block to the band.
  std::uint64_t usable = 0;
  if (system.spills_to_both) {
    const std::uint64_t wish =
        std::min({host_pool_wish(system, c, vram.kv, geometry, batch, context, planned_tokens), planned, host_left});
    plan.kv_pinned = std::min({planned, pinned_left, host_left - wish});
    plan.kv_host = std::min(planned, host_left - plan.kv_pinned);  // at least `wish`
    usable = plan.kv_pinned + wish;
  } else if (system.spill_region == Region::gpu_streamed) {
    plan.kv_pinned = std::min({planned, pinned_left, host_left});
    usable = plan.kv_pinned;
  } else if (system.spill_region == Region::cpu_resident) {
    plan.kv_host = std::min(planned, host_left);
    usable = plan.kv_host;
  }
  if ((system.spill_region || system.spills_to_both) && needed > usable)
    throw ModelBudgetError(
        "the KV cache beyond VRAM needs " + format_byte_size(needed) + " of " +
        (system.spills_to_both                            ? "pinned and host"
         : system.spill_region == Region::gpu_streamed ? "pinned"
                                                          : "host") +
        " memory but the contract leaves " + format_byte_size(usable) +
        (system.spills_to_both ? " (a band of " + format_byte_size(plan.kv_pinned) + " and the host pool's " +
                                     format_byte_size(usable - plan.kv_pinned) + " its write policy fills)"
                               : std::string()) +
        " (host budget " + format_byte_size(host_budget) + " less routed experts " + format_byte_size(experts) +
        " and staging " + format_byte_size(staging) + "; pinned limit " + format_byte_size(pinned_limit) + ")");
  plan.experts_pinned = system.experts->loads_experts() && experts <= pinned_left - plan.kv_pinned;
  return plan;
}

}  // namespace

namespace impl {

namespace {

/// Kokkos 3's messages for a View it could not allocate (impl/Kokkos_MemorySpace.cpp).
constexpr std::string_view kokkos_allocation_failures[] = {"Kokkos failed to allocate memory",
                                                           "Kokkos encountered an allocation failure"};

/// An exception's text as one line: Kokkos' allocation failures span lines
/// and end in a note about tracebacks that says nothing about the run.
std::string one_line(std::string text) {
  constexpr std::string_view traceback_note = "Traceback functionality not available";
  if (const auto at = text.find(traceback_note); at != std::string::npos) text.erase(at, traceback_note.size());
  std::string line;
  for (const char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c));
    if (space && (line.empty() || line.back() == ' ')) continue;
    line += space ? ' ' : c;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

/// Memory the budgets allowed but the machine (or a limit on the process)
/// did not give: the run does not fit here, and resume tries host memory
/// again. Kokkos names the space: "Cuda" and "CudaUVM" are the device's.
RunFailure refused_allocation(const std::string& what) {
  const bool device = what.find("MemorySpace named \"Cuda\"") != std::string::npos ||
                      what.find("MemorySpace named \"CudaUVM\"") != std::string::npos;
  return {"does_not_fit", std::string(device ? "device" : "host") + " memory: an allocation failed (" + what + ")"};
}

}  // namespace

std::optional<RunResult> attempt_run(const std::function<RunResult()>& run, RunFailure& failure) {
  try {
    return run();
  } catch (const ModelBudgetError& e) {
    // The budget as the experiment's config names it, not as the model's options do.
    const std::string message = e.what(), option = "vram_budget: ";
    failure = {"does_not_fit",
               message.rfind(option, 0) == 0 ? "budgets.vram: " + message.substr(option.size()) : message};
  } catch (const KVBudgetError& e) {
    failure = {"does_not_fit", e.what()};
  } catch (const std::bad_alloc& e) {
    failure = refused_allocation(one_line(e.what()));
  } catch (const std::exception& e) {
    // Kokkos 3 reports a View it could not allocate as a std::runtime_error.
    const std::string what = one_line(e.what());
    const bool allocation = std::any_of(std::begin(kokkos_allocation_failures), std::end(kokkos_allocation_failures),
                                        [&](std::string_view m) { return what.find(m) != std::string::npos; });
    failure = allocation ? refused_allocation(what) : RunFailure{"failed", what};
  }
  return std::nullopt;
}

void RunResult::add_step(const std::vector<LayerRecord>& layers) {
  double predicted = 0, wall = 0, bytes[4] = {0, 0, 0, 0}, streamed_bytes = 0, streamed_seconds = 0;
  for (const LayerRecord& r : layers) {
    predicted += r.predicted_attention;
    wall += r.attention;
    alpha.push_back(r.alpha);
    const double values[] = {r.attention_gpu, r.attention_cpu, r.experts_gpu, r.experts_cpu, r.transfers, r.other};
    for (int k = 0; k < 6; ++k) components[component_names[k]].push_back(values[k]);
    for (int region = 0; region < 4; ++region) bytes[region] += r.region_bytes[region];
    streamed_bytes += r.streamed_bytes;
    streamed_seconds += r.streamed_seconds;
  }
  streamed_gbps.push_back(streamed_seconds > 0 ? streamed_bytes / streamed_seconds / 1e9 : 0.0);
  predicted_attention.push_back(predicted);
  attention.push_back(wall);
  for (int region = 0; region < 4; ++region) region_bytes[region].push_back(bytes[region]);
}

RunSetup prepare_run(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile) {
  // A budget the card cannot hold: the machine's limit, the same for every system.
  if (profile.has_gpu && profile.gpu_memory_bytes > 0 && run.vram_budget > profile.gpu_memory_bytes)
    throw ModelBudgetError("device memory: budgets.vram of " + format_byte_size(run.vram_budget) + " is more than the " +
                           format_byte_size(profile.gpu_memory_bytes) + " of GPU memory of profile " + profile.name +
                           " (gpu.memory)");
  RunSetup setup{system_context(config, run, profile), {}, {}, false};
  const ModelConfig& model_config = run.model->config;
  SystemContext& context = setup.context;
  System& system = setup.system;
  ModelOptions& options = setup.options;
  system = make_system(run.system, context);
  const std::int64_t final_tokens = run.context + config.warmup_steps + config.measured_steps;

  options.vram_budget = run.vram_budget;
  options.block_tokens = config.block_tokens;
  options.max_rows = context.max_rows;
  options.micro_batches = system.micro_batches;
  options.vram_kv = system.vram_kv;
  options.experts = system.experts;
  options.stream_chunk_blocks = context.stream_chunk_blocks;
  setup.profiles = system.experts->profiles_routing();
  const bool profiles = setup.profiles;
  const HostMemoryPlan memory =
      plan_host_memory(system, model_config, options, run.batch, run.context, config.max_sequence_tokens,
                       profiles ? config.profile_tokens : 0, final_tokens, config.host_budget, config.pinned_limit);
  if (system.experts->loads_experts() && !memory.experts_pinned) {
    // Its expert copies run at the pageable rate: the policy must know.
    context.experts_pinned = false;
    system = make_system(run.system, context);
    options.micro_batches = system.micro_batches;
    options.vram_kv = system.vram_kv;
  }
  options.experts = system.experts;
  options.kv_policy = system.kv_policy;
  options.pin_experts = memory.experts_pinned;
  options.pinned_kv_budget = memory.kv_pinned;
  options.host_kv_budget = memory.kv_host;
  if (run.system == "gpu-only") {
    const VramUse fixed = MoeModel::fixed_vram(model_config, options);
    const std::uint64_t experts = MoeModel::expert_store_bytes(model_config);
    const std::uint64_t blocks_per_sequence = static_cast<std::uint64_t>((final_tokens + config.block_tokens - 1) /
                                                                         config.block_tokens);
    const std::uint64_t kv = MoeModel::kv_vram(model_config, options, blocks_per_sequence * run.batch);
    const std::uint64_t needed = fixed.weights + fixed.workspace + experts + kv;
    if (needed > run.vram_budget)
      throw ModelBudgetError("needs " + format_byte_size(needed) + " of VRAM (weights " + format_byte_size(fixed.weights) +
                             ", routed experts " + format_byte_size(experts) + ", KV " + format_byte_size(kv) +
                             ", workspace " + format_byte_size(fixed.workspace) + ") but the budget is " +
                             format_byte_size(run.vram_budget));
  }
  return setup;
}

}  // namespace impl

namespace {

RunResult measure(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile,
                  ExpertCache& cache, Progress& progress) {
  const ModelConfig& model_config = run.model->config;
  RunSetup setup = prepare_run(config, run, profile);
  const SystemContext& context = setup.context;
  const System& system = setup.system;
  ModelOptions& options = setup.options;
  const bool profiles = setup.profiles;
  progress.step("building");
  // Every run of a model has the same weights (step times do not depend on
  // them), so its routed experts are generated once and shared (page-locked
  // or not per run); the context and the tokens differ per repetition.
  if (cache.model != run.model) cache = ExpertCache{};  // one store in host memory at a time
  options.host_experts = cache.experts;
  MoeModel model = MoeModel::synthetic(model_config, config.seed, options);
  cache = ExpertCache{run.model, model.host_experts()};
  const std::uint64_t seed = config.seed + 7919ull * static_cast<std::uint64_t>(run.repetition);
  std::mt19937_64 random(seed);
  if (profiles) {
    // A profiling prompt of its own seed, freed before the measured sequences start.
    progress.step("profiling");
    std::mt19937_64 profile_random(~seed);
    std::vector<int> prompt(static_cast<std::size_t>(config.profile_tokens));
    for (int& t : prompt) t = static_cast<int>(profile_random() % static_cast<std::uint64_t>(model_config.vocab));
    const int sequence = model.add_sequence(config.max_sequence_tokens);
    model.prefill(sequence, prompt);
    model.free_sequence(sequence);
    model.end_warmup();
  }
  std::vector<int> sequences;
  std::vector<int> tokens;
  for (int b = 0; b < run.batch; ++b) {
    progress.step("context " + std::to_string(b + 1) + "/" + std::to_string(run.batch));
    const int sequence = model.add_sequence(config.max_sequence_tokens);
    sequences.push_back(sequence);
    if (config.context_fill == "prefill") {
      std::vector<int> prompt(static_cast<std::size_t>(run.context));
      for (int& t : prompt) t = static_cast<int>(random() % static_cast<std::uint64_t>(model_config.vocab));
      const auto logits = model.prefill(sequence, prompt, [&](std::int64_t done, std::int64_t total) {
        progress.step("context " + std::to_string(b + 1) + "/" + std::to_string(run.batch) + ": prefill " +
                      format_tokens(done) + "/" + format_tokens(total));
      });
      tokens.push_back(static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    } else {
      model.fill_context(sequence, run.context, seed + static_cast<std::uint64_t>(b));
      tokens.push_back(static_cast<int>(random() % static_cast<std::uint64_t>(model_config.vocab)));
    }
  }
  RunResult result;
  result.micro_batches = system.micro_batches;
  result.planned_sequence_tokens = model.expected_tokens(sequences.front());
  result.vram = model.vram_use();
  result.attention_fmas_per_byte = model.attention_shape().fmas_per_byte(sizeof(bf16));
  const ModelRates rates = roofline_of(context).rates();
  result.cpu_attention_gbps = rates.cpu_attention_gbps;
  result.cpu_streamed_attention_gbps = rates.cpu_streamed_attention_gbps;
  const int steps = config.warmup_steps + config.measured_steps;
  const auto steps_begin = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    const bool measured = step >= config.warmup_steps;
    // Policies that place experts by what they profile end their warm-up
    // after the profiling prompt; for the rest it ends before the first step,
    // so that warm-up flows into the measured steps as the steps flow into
    // each other (ended between them, it drained the prefetch stream untimed).
    if (step == 0 && !profiles) model.end_warmup();
    std::optional<double> seconds_left;  // the steps left at the mean step's time so far
    if (step > 0)
      seconds_left = std::chrono::duration<double>(std::chrono::steady_clock::now() - steps_begin).count() / step *
                     (steps - step);
    progress.step((measured ? "step " + std::to_string(step - config.warmup_steps + 1) + "/" +
                                  std::to_string(config.measured_steps)
                            : "warm-up"),
                  seconds_left);
    // A step is tokens in to the next tokens out: the greedy pick is timed
    // too, so that nothing a system leaves running (a prefetch across steps)
    // overlaps host work outside the clock.
    const auto begin = std::chrono::steady_clock::now();
    const auto logits = model.step(sequences, tokens);
    for (std::size_t b = 0; b < logits.size(); ++b)
      tokens[b] = static_cast<int>(std::max_element(logits[b].begin(), logits[b].end()) - logits[b].begin());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (!measured) continue;
    result.step_seconds.push_back(seconds);
    result.add_step(model.last_records());
  }
  result.host = model.host_use();
  return result;
}

}  // namespace

namespace impl {

/// Everything that defines `run` (the resume key compares it), as YAML.
std::string run_yaml(const ExperimentConfig& config, const RunSpec& run) {
  const ModelConfig& m = run.model->config;
  YAML::Emitter yaml;
  yaml << YAML::BeginMap << YAML::Key << "model" << YAML::Value << YAML::BeginMap << YAML::Key << "preset"
       << YAML::Value << run.model->preset << YAML::Key << "layers" << YAML::Value << m.layers << YAML::Key
       << "hidden_scale" << YAML::Value << run.model->overrides.hidden_scale << YAML::EndMap << YAML::Key << "system"
       << YAML::Value << run.system << YAML::Key << "expert_policy" << YAML::Value << run.expert_policy << YAML::Key
       << "system_comparison" << YAML::Value << run.system_comparison << YAML::Key << "batch" << YAML::Value
       << run.batch << YAML::Key << "context"
       << YAML::Value << run.context << YAML::Key << "budgets" << YAML::Value << YAML::BeginMap << YAML::Key << "vram"
       << YAML::Value << exact_size(run.vram_budget) << YAML::Key << "pinned" << YAML::Value
       << exact_size(config.pinned_limit) << YAML::Key << "host" << YAML::Value << exact_size(config.host_budget)
       << YAML::EndMap << YAML::Key << "steps" << YAML::Value << YAML::BeginMap << YAML::Key << "warmup"
       << YAML::Value << config.warmup_steps << YAML::Key << "measured" << YAML::Value << config.measured_steps
       << YAML::EndMap << YAML::Key << "seed" << YAML::Value << config.seed << YAML::Key << "repetition"
       << YAML::Value << run.repetition << YAML::Key << "block_tokens" << YAML::Value << config.block_tokens
       << YAML::Key << "context_fill" << YAML::Value << config.context_fill << YAML::Key << "max_sequence_tokens"
       << YAML::Value << config.max_sequence_tokens << YAML::Key << "profile_tokens" << YAML::Value
       << config.profile_tokens << YAML::Key << "options" << YAML::Value
       << YAML::BeginMap << YAML::Key << "expert_vram_share" << YAML::Value
       << config.system_options.expert_vram_share << YAML::Key << "score_decay" << YAML::Value
       << config.system_options.score_decay << YAML::Key << "prefetch_experts" << YAML::Value
       << config.system_options.prefetch_experts << YAML::EndMap << YAML::EndMap;
  return yaml.c_str();
}

void write_run(ResultsGroup& runs, const std::string& name, const ExperimentConfig& config, const RunSpec& run,
               const std::string& profile_name, const std::string& machine_yaml, const std::optional<RunResult>& result,
               const RunFailure& failure) {
  ResultsGroup g = runs.create_group(name);
  const ModelConfig& m = run.model->config;
  g.set_attribute("model", run.model->preset);
  g.set_attribute("model_label", run.model->label);
  g.set_attribute("system", run.system);
  g.set_attribute("batch", static_cast<std::int64_t>(run.batch));
  g.set_attribute("context", run.context);
  g.set_attribute("vram_budget_bytes", static_cast<std::int64_t>(run.vram_budget));
  g.set_attribute("pinned_limit_bytes", static_cast<std::int64_t>(config.pinned_limit));
  g.set_attribute("max_sequence_tokens", config.max_sequence_tokens);
  g.set_attribute("expert_policy", run.expert_policy.empty() ? run.system : run.expert_policy);
  g.set_attribute("system_comparison", static_cast<std::int64_t>(run.system_comparison));
  g.set_attribute("host_budget_bytes", static_cast<std::int64_t>(config.host_budget));
  g.set_attribute("repetition", static_cast<std::int64_t>(run.repetition));
  g.set_attribute("seed", static_cast<std::int64_t>(config.seed));
  g.set_attribute("status", result ? std::string("complete") : failure.status);
  g.set_attribute("reason", result ? std::string() : failure.reason);
  g.set_attribute("config", run_yaml(config, run));
  g.set_attribute("git_revision", git_revision());
  g.set_attribute("profile", profile_name);
  g.set_attribute("machine", machine_yaml);
  if (!result) return;
  const RunResult& r = *result;
  const std::size_t steps = r.step_seconds.size(), layers = static_cast<std::size_t>(m.layers);
  double total = 0;
  for (double s : r.step_seconds) total += s;
  g.set_attribute("tokens_per_second", static_cast<double>(run.batch * steps) / total);
  g.set_attribute("mean_step_seconds", total / static_cast<double>(steps));
  g.set_attribute("layers", static_cast<std::int64_t>(m.layers));
  g.set_attribute("attention_fmas_per_byte", r.attention_fmas_per_byte);
  g.set_attribute("cpu_attention_gbps", r.cpu_attention_gbps);
  g.set_attribute("cpu_streamed_attention_gbps", r.cpu_streamed_attention_gbps);
  g.set_attribute("micro_batches", static_cast<std::int64_t>(r.micro_batches));
  g.set_attribute("planned_sequence_tokens", r.planned_sequence_tokens);
  g.set_attribute("pinned_bytes", static_cast<std::int64_t>(r.host.pinned()));
  g.set_attribute("host_bytes", static_cast<std::int64_t>(r.host.total()));
  g.set_attribute("experts_pinned", static_cast<std::int64_t>(r.host.experts_pinned));
  g.set_attribute("vram_weights_bytes", static_cast<std::int64_t>(r.vram.weights));
  g.set_attribute("vram_workspace_bytes", static_cast<std::int64_t>(r.vram.workspace));
  g.set_attribute("vram_expert_slot_bytes", static_cast<std::int64_t>(r.vram.expert_slots));
  g.set_attribute("vram_kv_bytes", static_cast<std::int64_t>(r.vram.kv));
  g.write("step_seconds", r.step_seconds);
  g.write("predicted_attention_seconds", r.predicted_attention);
  g.write("attention_seconds", r.attention);
  g.write("streamed_gbps", r.streamed_gbps);
  g.write("alpha", r.alpha, {steps, layers});
  ResultsGroup components = g.create_group("components");
  for (const auto& [component, values] : r.components) components.write(component, values, {steps, layers});
  ResultsGroup regions = g.create_group("region_bytes");
  const char* region_names[] = {"gpu_resident", "gpu_streamed", "cpu_resident", "cpu_streamed"};  // Region order
  for (int region = 0; region < 4; ++region) regions.write(region_names[region], r.region_bytes[region]);
}

/// What a results file says about its experiment, written while it holds no
/// runs: a resumed file keeps the record of its first runs (each run records its own).
void write_experiment_attributes(ResultsGroup root, const ExperimentConfig& config, const MachineProfile& p,
                                 const std::string& machine_yaml, Shard shard, std::size_t planned_runs) {
  root.set_attribute("format", results_format);
  root.set_attribute("planned_runs", static_cast<std::int64_t>(planned_runs));
  root.set_attribute("experiment", config.name);
  root.set_attribute("config", config.text.empty() ? config.canonical : config.text);
  root.set_attribute("config_canonical", config.canonical);
  root.set_attribute("git_revision", git_revision());
  root.set_attribute("kokkos_configuration", kokkos_configuration());
  root.set_attribute("machine", machine_yaml);
  if (root.has("profile")) root.remove("profile");
  ResultsGroup profile = root.create_group("profile");
  profile.set_attribute("name", p.name);
  profile.set_attribute("yaml", p.to_yaml());
  profile.set_attribute("has_gpu", static_cast<std::int64_t>(p.has_gpu));
  profile.set_attribute("hbm_gbps", p.hbm_gbps);
  profile.set_attribute("pinned_h2d_gbps", p.pinned_h2d_gbps);
  profile.set_attribute("pageable_h2d_gbps", p.pageable_h2d_gbps);
  profile.set_attribute("cpu_dram_read_gbps", p.cpu_dram_read_gbps);
  profile.set_attribute("cpu_fma_glanes", p.cpu_fma_glanes);
  profile.set_attribute("cpu_expert_gbps", p.cpu_expert_gbps);
  profile.set_attribute("cpu_threads", static_cast<std::int64_t>(p.cpu_threads));
  profile.set_attribute("cpu_path", p.cpu_path);
  if (!root.has("runs")) root.create_group("runs");
  if (shard.count > 1) root.set_attribute("shard", shard.text());
  else if (root.has_attribute("shard")) root.remove_attribute("shard");
}

}  // namespace impl

namespace {

/// The machine setups a results file records: the first, then /other_machines.
std::vector<std::string> recorded_machines(const ResultsReader& reader) {
  // Each read as YAML here, so that a garbled one is named by its file and place.
  auto checked = [&](const std::string& object) {
    const std::string yaml = reader.string_attribute(object, "machine");
    ConfigNode::parse(yaml, reader.path() + ":" + object + "@machine");
    return yaml;
  };
  std::vector<std::string> machines{checked("/")};
  if (reader.exists("/other_machines"))
    for (const std::string& name : reader.list("/other_machines")) machines.push_back(checked("/other_machines/" + name));
  return machines;
}

/// `node` spelled one way for comparison: mappings in key order, and, with
/// `byte_sizes`, scalars as bytes (200MiB and 209715200 are one budget).
std::string canonical_yaml(const YAML::Node& node, bool byte_sizes) {
  if (node.IsMap()) {
    std::map<std::string, std::string> entries;
    for (const auto& entry : node) entries[YAML::Dump(entry.first)] = canonical_yaml(entry.second, byte_sizes);
    std::string text = "{";
    for (const auto& [key, value] : entries) text += key + ": " + value + ", ";
    return text + "}";
  }
  if (node.IsSequence()) {
    std::string text = "[";
    for (const auto& element : node) text += canonical_yaml(element, byte_sizes) + ", ";
    return text + "]";
  }
  if (byte_sizes && node.IsScalar())
    if (const auto bytes = parse_byte_size(node.Scalar())) return std::to_string(*bytes);
  return YAML::Dump(node);
}

/// The top-level fields of `c` whose defaults can be written out, as its runs
/// take them (defaults filled in, numbers exact): `seed: 1` written out is
/// the seed left out. Every field such a key holds is here, so that equal
/// strings mean the same runs.
std::map<std::string, std::string> resolved_fields(const ExperimentConfig& c) {
  auto exact = [](double value) {
    std::ostringstream out;
    out << std::setprecision(std::numeric_limits<double>::max_digits10) << value;
    return out.str();
  };
  std::string models;
  for (const ModelSpec& model : c.models)
    models += model.preset + " layers " + std::to_string(model.config.layers) + " hidden_scale " +
              exact(model.overrides.hidden_scale) + "; ";
  const SystemOptions& o = c.system_options;
  return {{"models", models},
          {"max_total_tokens", std::to_string(c.max_total_tokens)},
          {"max_sequence_tokens", std::to_string(c.max_sequence_tokens)},
          {"steps", "warmup " + std::to_string(c.warmup_steps) + " measured " + std::to_string(c.measured_steps) +
                        " profile_tokens " + std::to_string(c.profile_tokens)},
          {"repetitions", std::to_string(c.repetitions)},
          {"seed", std::to_string(c.seed)},
          {"block_tokens", std::to_string(c.block_tokens)},
          {"context_fill", c.context_fill},
          {"options", "expert_vram_share " + exact(o.expert_vram_share) + " score_decay " + exact(o.score_decay) +
                          " prefetch_experts " + std::to_string(o.prefetch_experts) + " writescope_experts " +
                          (c.auto_writescope_experts ? std::string("auto") : o.writescope_experts)}};
}

/// The top-level fields in which a recorded experiment config (YAML) and
/// `current` differ, in the order they first appear, each with both values
/// ("seed: 1 in the file, 2 here": `recorded_name`, `current_name`). Where
/// the results go (`output`) and where the profile was read from (`profile`)
/// do not identify the experiment: the profile's own content is compared by
/// itself. Values compare as canonical_yaml spells them, and those with
/// defaults as the runs take them (resolved_fields). The sources name each
/// text in a ConfigError where it is not a valid experiment config.
std::vector<std::string> experiment_differences(const std::string& recorded, const std::string& recorded_source,
                                                const std::string& current, const std::string& current_source,
                                                const std::string& recorded_name, const std::string& current_name) {
  const ConfigNode recorded_root = ConfigNode::parse(recorded, recorded_source),
                   current_root = ConfigNode::parse(current, current_source);
  const YAML::Node a = recorded_root.yaml(), b = current_root.yaml();
  // A config this build cannot read (another revision's) compares as written.
  auto resolved_or_none = [](const ConfigNode& root) {
    try {
      return resolved_fields(ExperimentConfig::from_config(root, true));
    } catch (const std::exception&) {
      return std::map<std::string, std::string>{};
    }
  };
  const auto resolved_a = resolved_or_none(recorded_root), resolved_b = resolved_or_none(current_root);
  std::vector<std::string> keys, differing;
  for (const YAML::Node* node : {&a, &b})
    for (const auto& entry : *node)
      if (const auto key = entry.first.as<std::string>(); std::find(keys.begin(), keys.end(), key) == keys.end())
        keys.push_back(key);
  for (const std::string& key : keys) {
    if (key == "output" || key == "profile") continue;
    auto text = [&](const YAML::Node& node) {
      return node[key] ? canonical_yaml(node[key], key == "budgets") : std::string("(absent)");
    };
    // Each side's value on one line, as written (cut short past 60 characters).
    auto shown = [&](const YAML::Node& node) {
      if (!node[key]) return std::string("(absent)");
      YAML::Emitter line;
      line << YAML::Flow << node[key];
      const std::string value = line.c_str();
      return value.size() > 60 ? value.substr(0, 57) + "..." : value;
    };
    const auto resolved = resolved_a.find(key), other = resolved_b.find(key);
    if (text(a) != text(b) &&
        (resolved == resolved_a.end() || other == resolved_b.end() || resolved->second != other->second))
      differing.push_back(key + ": " + shown(a) + " " + recorded_name + ", " + shown(b) + " " + current_name);
  }
  return differing;
}

/// The recorded experiment config of a results file: its canonical form, or
/// its text in files written before that was kept.
std::string recorded_experiment(const ResultsReader& reader) {
  return reader.string_attribute("/", reader.has_attribute("/", "config_canonical") ? "config_canonical" : "config");
}

}  // namespace

RecordedExperiment read_recorded_experiment(const ResultsReader& reader) {
  return {ExperimentConfig::from_config(
              ConfigNode::parse(recorded_experiment(reader), reader.path() + ": its experiment config"), true),
          MachineProfile::from_config(
              ConfigNode::parse(reader.string_attribute("/profile", "yaml"), reader.path() + ":/profile@yaml"))};
}

namespace {

struct ResumeCheck {
  bool needs_attributes = false;  // the file holds no runs yet
  /// Where this process's machine setup is another than the file's
  /// (allowed), N of /other_machines/machine_N (0: none): it is recorded with
  /// the first run it adds, never without one.
  std::size_t another_setup = 0;
};

/// Whether setup differences (machine_setup_differences) are only in the
/// host attention choices: on the same machine another process may measure
/// its way to others (4-30% apart), a setup of its own that the report
/// compares apart, which resume and merge add without --allow-different-machine.
bool only_attention_choices(const std::vector<std::string>& differences) {
  return std::all_of(differences.begin(), differences.end(),
                     [](const std::string& d) { return d.rfind("host_attention_choices: ", 0) == 0; });
}

/// Resuming mixes runs into a file only of the same experiment (comments,
/// layout, `output` and `profile` aside), machine profile and machine setup; with
/// allow_different_machine (or where only the host attention choices differ)
/// another setup is recorded beside the first (/other_machines) and every run
/// keeps its own.
ResumeCheck check_resume(const ExperimentConfig& config, const MachineProfile& profile, const RunOptions& options,
                         const MachineDescription& machine) {
  const ResultsReader reader(config.output);
  // Another program's HDF5 file is left as it is: writing the experiment's
  // attributes would replace its own (and its /profile).
  if (const std::string problem = results_format_problem(reader); !problem.empty() && !reader.holds_nothing())
    throw std::invalid_argument(config.output + " is not a writescope results file (" + problem +
                                "); write to another --output");
  if (reader.has_attribute("/", "predicted"))
    throw std::invalid_argument(config.output + " holds predicted runs (writescope predict); measured runs go to "
                                "another --output, never beside projections");
  if (!reader.exists("/runs") || reader.list("/runs").empty()) return {true, 0};  // nothing measured yet
  // As verify and predict --compare refuse it: runs without the attributes that say what they are.
  if (const std::string problem = results_file_problem(reader); !problem.empty())
    throw std::invalid_argument(config.output + " holds runs but is not a complete results file (" + problem +
                                "); write to another --output");
  if (const auto differing =
          experiment_differences(recorded_experiment(reader), config.output + ": its experiment config",
                                 config.canonical, "the experiment config", "in the file", "here");
      !differing.empty())
    throw std::invalid_argument(config.output + " holds runs of another experiment config (it differs in " +
                                join_with(differing, "; ") +
                                "); write to another --output, or remove the file to start over");
  if (reader.string_attribute("/profile", "yaml") != profile.to_yaml())
    throw std::invalid_argument(config.output + " holds runs of another machine profile; write to another --output, "
                                "or remove the file to start over");
  // As merge requires: one build per file, so that its runs compare systems, not builds.
  if (const std::string recorded = reader.string_attribute("/", "git_revision"); recorded != git_revision())
    throw std::invalid_argument(config.output + " holds runs of git revision '" + recorded + "' but this build is '" +
                                git_revision() + "'; resume with a build of that revision, or write to another "
                                "--output");
  const std::string shard = reader.has_attribute("/", "shard") ? reader.string_attribute("/", "shard") : "0/1";
  if (shard != options.shard.text())
    throw std::invalid_argument(config.output + " holds the runs of " +
                                (shard == "0/1" ? std::string("the whole experiment (no --shard)") : "shard " + shard) +
                                ", not of " +
                                (options.shard.count == 1 ? std::string("the whole experiment")
                                                          : "shard " + options.shard.text()) +
                                "; give the same --shard or another --output");
  const std::vector<std::string> recorded = recorded_machines(reader);
  for (const std::string& yaml : recorded)
    if (machine.setup_differences(yaml).empty()) return {false, 0};
  for (const std::string& yaml : recorded) {
    const std::vector<std::string> differences = machine.setup_differences(yaml);
    if (only_attention_choices(differences)) {
      log_info("run: ", config.output, ": this process took other host attention choices than the file's runs "
               "(each process measures them): ", differences.front(), "; the runs it adds are of another setup, "
               "which the report compares apart");
      return {false, recorded.size()};
    }
  }
  const std::vector<std::string> differences = machine.setup_differences(recorded.front());
  std::string listed;
  for (const std::string& d : differences) listed += "\n  " + d;
  if (!options.allow_different_machine)
    throw std::invalid_argument(config.output + " holds runs measured with another machine setup:" + listed +
                                "\nresume with the same setup, write to another --output, or pass "
                                "--allow-different-machine to add runs of this setup (each run records its own)");
  log_info("run: ", config.output, ": runs it adds will be of another machine setup (allowed):", listed);
  return {false, recorded.size()};
}

/// Records this process's setup beside the file's others as /other_machines/machine_`index`.
void record_another_setup(ResultsGroup root, std::size_t index, const std::string& machine_yaml) {
  ResultsGroup others =
      root.has("other_machines") ? root.open_group("other_machines") : root.create_group("other_machines");
  others.create_group("machine_" + std::to_string(index)).set_attribute("machine", machine_yaml);
}

}  // namespace

std::string run_damage(const ResultsReader& reader, const std::string& group) {
  try {
    // Runs carry checksums since files carry config_canonical (one change):
    // in such a file a run without one lost it.
    if (!reader.has_attribute(group, "checksum"))
      return reader.has_attribute("/", "config_canonical")
                 ? "no checksum, though the build that wrote this file gives every run one: the run is damaged"
                 : "";  // written before runs carried checksums
    const std::string stored = reader.string_attribute(group, "checksum"), now = reader.checksum(group);
    if (stored != now) return "checksum mismatch (stored " + stored + ", contents " + now + "): the run is damaged";
    return "";
  } catch (const ResultsError& e) {
    return std::string("unreadable (") + e.what() + ")";
  }
}

std::string stray_run_reason(const ResultsReader& reader, const std::string& id, const ExperimentConfig& config,
                             const std::vector<RunSpec>& runs) {
  const auto run = std::find_if(runs.begin(), runs.end(), [&](const RunSpec& r) { return r.id() == id; });
  if (run == runs.end()) return "not a run of the file's experiment";
  // The settings resume matches runs by: a run edited or copied from another
  // experiment would be measured again. Only a file of this build spells
  // them as run_yaml does here.
  const std::string group = "/runs/" + id;
  if (reader.has_attribute("/", "git_revision") && reader.string_attribute("/", "git_revision") == git_revision() &&
      reader.has_attribute(group, "config") && reader.string_attribute(group, "config") != run_yaml(config, *run))
    return "its recorded settings (its 'config') are not those the file's experiment gives this run";
  return "";
}

std::map<std::string, std::string> runs_not_of_the_experiment(const ResultsReader& reader) {
  if (reader.has_attribute("/", "predicted") || !reader.exists("/runs")) return {};
  const RecordedExperiment recorded = read_recorded_experiment(reader);
  const std::vector<RunSpec> runs = expand_runs(recorded.config, recorded.profile);
  std::map<std::string, std::string> strays;
  for (const std::string& id : reader.list("/runs"))
    if (std::string why = stray_run_reason(reader, id, recorded.config, runs); !why.empty()) strays[id] = std::move(why);
  return strays;
}

std::string results_format_problem(const ResultsReader& reader) {
  if (!reader.has_attribute("/", "format")) return "no 'format' attribute";
  if (const std::string format = reader.string_attribute("/", "format"); format != results_format)
    return "format '" + format + "', not '" + results_format + "'";
  return "";
}

std::string results_file_problem(const ResultsReader& reader) {
  // The format first: another kind of file is named as such, not by the attributes it lacks.
  if (std::string problem = results_format_problem(reader); !problem.empty()) return problem;
  for (const char* attribute : {"config", "machine"})
    if (!reader.has_attribute("/", attribute)) return std::string("no '") + attribute + "' attribute";
  return "";
}

std::string thread_count_mismatch(const MachineProfile& profile, int host_threads) {
  // A GPU machine's profile on a host build describes another machine altogether (said on its own).
  if ((profile.has_gpu && !has_gpu) || host_threads == profile.cpu_threads) return "";
  return "run: warning: profile '" + profile.name + "' measured the CPU with " + std::to_string(profile.cpu_threads) +
         " threads but this process runs " + std::to_string(host_threads) +
         "; the systems plan the CPU's share at the profile's rates for " + std::to_string(profile.cpu_threads) +
         " (give --kokkos-threads=" + std::to_string(profile.cpu_threads) +
         ", or re-run writescope calibrate with this thread count)";
}

std::vector<std::string> attention_choice_mismatches(const MachineProfile& profile, const AttentionShape& shape) {
  std::vector<std::string> warnings;
  // `variable`: the environment variable that pins the choice, if any.
  const auto compare = [&](const std::map<std::string, std::string>& stated_by_shape, const std::string& taken,
                           const std::string& described, const char* what, const char* variable) {
    const auto stated = stated_by_shape.find(shape.name);
    if (stated != stated_by_shape.end() && stated->second != taken)
      warnings.push_back("run: warning: profile '" + profile.name + "' measured CPU attention of " + shape.name +
                         " with " + what + " " + stated->second + " but this process takes " + described +
                         "; its CPU attention rates may be off by 10-30% (re-run writescope calibrate" +
                         (variable ? std::string(", or set ") + variable + "=" + stated->second : std::string()) +
                         ")");
  };
  // WRITESCOPE_CPU_PATH pins both block orders: it restores the profile's paths only where they are one.
  const auto stated_path = [&](const std::map<std::string, std::string>& by_shape) {
    const auto found = by_shape.find(shape.name);
    return found == by_shape.end() ? std::string() : found->second;
  };
  const std::string head_major_path = stated_path(profile.cpu_decode_path),
                    token_major_path = stated_path(profile.cpu_streamed_decode_path);
  const char* path_variable = head_major_path.empty() || token_major_path.empty() || head_major_path == token_major_path
                                  ? "WRITESCOPE_CPU_PATH"
                                  : nullptr;
  compare(profile.cpu_decode_path, cpu_path_name(decode_product_path(shape, BlockOrder::head_major)),
          describe_decode_cpu_path(shape, BlockOrder::head_major), "the head-major products on", path_variable);
  compare(profile.cpu_streamed_decode_path, cpu_path_name(decode_product_path(shape, BlockOrder::token_major)),
          describe_decode_cpu_path(shape, BlockOrder::token_major), "the token-major products on", path_variable);
  compare(profile.cpu_next_pass_prefetch, prefetch_level_name(active_next_pass_prefetch(shape)),
          describe_next_pass_prefetch(shape), "the next pass requested into", "WRITESCOPE_NEXT_PASS_PREFETCH");
  if (const int tokens = active_head_major_pass(shape); tokens > 0)
    compare(profile.cpu_head_major_pass, std::to_string(tokens), describe_next_pass_prefetch(shape),
            "head-major passes of", "WRITESCOPE_HEAD_MAJOR_PASS");
  if (const int tokens = active_token_major_pass(shape); tokens > 0)
    compare(profile.cpu_token_major_pass, std::to_string(tokens), describe_token_major_pass(shape),
            "token-major passes of", "WRITESCOPE_TOKEN_MAJOR_PASS");
  return warnings;
}

std::string experiment_attention_choices(const ExperimentConfig& config) {
  std::string choices;
  for (const ModelSpec& model : config.models)
    choices += (choices.empty() ? "" : "\n") + model.label + ": " + host_attention_choices(model.config.attention());
  return choices;
}

ExperimentSummary run_experiment(const ExperimentConfig& config, const MachineProfile& profile,
                                 std::ostream& progress_out, bool tty, const RunOptions& options) {
  if (!has_gpu && profile.has_gpu)
    log_info("run: profile '", profile.name, "' describes a GPU machine but this build has no GPU; ",
             "the systems plan for that machine and run on the host");
  if (profile.cpu_path != cpu_path_name(active_cpu_path()))
    log_info("run: warning: profile '", profile.name, "' measured the CPU kernels on the ", profile.cpu_path,
             " path but this process runs ", cpu_path_name(active_cpu_path()),
             "; its CPU rates do not describe these kernels (re-run writescope calibrate)");
  if (const std::string warning = thread_count_mismatch(profile, Kokkos::DefaultHostExecutionSpace().concurrency()); !warning.empty())
    log_info(warning);
  // Measured now, per model's attention shape, before any timed step; each
  // measured run records its model's.
  std::map<std::string, std::string> decode_cpu_path, next_pass_prefetch, token_major_pass;  // by model label
  for (const ModelSpec& model : config.models) {
    const AttentionShape shape = model.config.attention();
    decode_cpu_path[model.label] = describe_decode_cpu_paths(shape);
    next_pass_prefetch[model.label] = describe_next_pass_prefetch(shape);
    token_major_pass[model.label] = describe_token_major_pass(shape);
    for (const std::string& warning : attention_choice_mismatches(profile, shape)) log_info(warning);
  }
  create_output_folder("output", config.output);
  MachineDescription machine = MachineDescription::detect();
  machine.host_attention_choices = experiment_attention_choices(config);
  const std::string machine_yaml = machine.to_yaml();
  ResultsStore store(config.output);
  const std::vector<RunSpec> all_runs = expand_runs(config, profile);
  const std::vector<RunSpec> runs =
      options.shard.count > 1 ? shard_runs(all_runs, config, profile, options.shard) : all_runs;
  ResumeCheck resume = check_resume(config, profile, options, machine);
  if (resume.needs_attributes) {
    auto txn = store.begin();
    write_experiment_attributes(txn.root(), config, profile, machine_yaml, options.shard, runs.size());
    txn.commit();
  }
  if (options.shard.count > 1)
    log_info("run: shard ", options.shard.text(), ": ", runs.size(), " of the experiment's ", all_runs.size(), " runs",
             runs.empty() ? " (more shards than settings: a setting's systems share one shard)" : "");
  Progress progress(progress_out, tty, runs.size(), options.progress_line_seconds);
  ExpertCache expert_cache;
  ExperimentSummary summary;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (const int signal = options.stop ? options.stop->load() : 0; signal != 0) {
      summary.stopped_by = signal;
      progress_out << "run: stopped by " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << " before run " << i + 1 << "/"
                   << runs.size() << "; the file keeps the runs written: the same command resumes it" << std::endl;
      break;
    }
    const RunSpec& run = runs[i];
    const std::string id = run.id();
    // Resume: a run already in the file with the same definition is kept,
    // unless it failed; a changed definition is measured again.
    if (store.contains("runs/" + id)) {
      const std::string g = "/runs/" + id;
      const ResultsReader reader(config.output);
      const std::string damage = run_damage(reader, g);
      if (!damage.empty()) {
        // Removed first, so that damage HDF5 cannot unlink stops here and not
        // after the measurement.
        try {
          // Unlinking it would read it too.
          if (reader.crashes_reading(g)) throw ResultsError("the HDF5 library crashes reading the run");
          auto txn = store.begin();
          txn.root().open_group("runs").remove(id);
          txn.commit();
          log_info("run: ", id, ": ", damage, "; measuring it again");
        } catch (const ResultsError& e) {
          throw ResultsError(config.output + ": run '" + id + "' is " + damage +
                             ", and the file cannot be changed around it (" + e.what() +
                             "); nothing was measured. Copy its intact runs into a new file with `writescope merge "
                             "NEW.h5 " + config.output + " --drop-damaged --allow-missing` and resume with --output "
                             "NEW.h5");
        }
      } else {
        // A run the machine's free memory refused may fit another time: measured again, as failed runs are.
        const std::string status = reader.string_attribute(g, "status");
        const bool retry = status == "failed" ||
                           (status == "does_not_fit" && reader.string_attribute(g, "reason").rfind("host memory:", 0) == 0);
        if (!retry && reader.string_attribute(g, "config") == run_yaml(config, run)) {
          ++summary.skipped;
          continue;
        }
      }
    }
    progress.start_run(i, run);
    const std::string started_utc = utc_time_now();
    const auto started = std::chrono::steady_clock::now();
    RunFailure failure;
    const std::optional<RunResult> result =
        attempt_run([&] { return measure(config, run, profile, expert_cache, progress); }, failure);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    try {
      auto txn = store.begin();
      if (resume.another_setup > 0) record_another_setup(txn.root(), resume.another_setup, machine_yaml);
      ResultsGroup runs_group = txn.root().open_group("runs");
      if (runs_group.has(id)) runs_group.remove(id);
      write_run(runs_group, id, config, run, profile.name, machine_yaml, result, failure);
      ResultsGroup written = runs_group.open_group(id);
      written.set_attribute("cpu_decode_path", decode_cpu_path.at(run.model->label));
      written.set_attribute("next_pass_prefetch", next_pass_prefetch.at(run.model->label));
      written.set_attribute("token_major_pass", token_major_pass.at(run.model->label));
      // When and by which command: runs compared in one file may come from several processes.
      written.set_attribute("started", started_utc);
      written.set_attribute("finished", utc_time_now());
      if (!options.command.empty()) written.set_attribute("command", options.command);
      written.set_attribute("checksum", written.checksum());
      txn.commit();
      resume.another_setup = 0;
    } catch (const ResultsError& e) {
      // The committed runs stay as they were; the experiment cannot go on.
      throw ResultsError(std::string(e.what()) + " (while writing run " + id + "; the " +
                         std::to_string(summary.complete + summary.did_not_fit + summary.failed + summary.skipped) +
                         " runs before it are in the file)");
    }
    std::ostringstream outcome;
    if (result) {
      double total = 0;
      for (double s : result->step_seconds) total += s;
      outcome << std::fixed << std::setprecision(2) << run.batch * result->step_seconds.size() / total
              << " tokens/s";
      ++summary.complete;
    } else {
      outcome << (failure.status == "does_not_fit" ? "does not fit: " : "failed: ") << failure.reason;
      ++(failure.status == "does_not_fit" ? summary.did_not_fit : summary.failed);
    }
    progress.finish_run(seconds, outcome.str());
  }
  // Asked during the last run: every run is written, and the stop is still said (a calling script stops too).
  if (const int signal = options.stop ? options.stop->load() : 0; signal != 0 && summary.stopped_by == 0) {
    summary.stopped_by = signal;
    progress_out << "run: " << (signal == SIGINT ? "SIGINT" : "SIGTERM")
                 << " came during the last run; every run is written" << std::endl;
  }
  return summary;
}

namespace {

/// Writes the merged runs into `store`: `first`'s experiment attributes and
/// profile, every machine setup, and each run from the input `source` names,
/// in `runs` order.
void write_merged_into(ResultsStore& store, const ResultsReader& first, const std::vector<ResultsReader>& readers,
                       const std::vector<RunSpec>& runs, const std::map<std::string, std::size_t>& source,
                       const std::vector<std::string>& machines) {
  auto txn = store.begin();
  ResultsGroup root = txn.root();
  for (const char* name : {"format", "experiment", "config", "config_canonical", "git_revision", "kokkos_configuration"})
    root.set_attribute(name, first.string_attribute("/", name));
  root.set_attribute("machine", machines.front());
  root.set_attribute("planned_runs", static_cast<std::int64_t>(runs.size()));
  root.copy_group(first, "/profile", "profile");
  if (machines.size() > 1) {
    ResultsGroup others = root.create_group("other_machines");
    for (std::size_t m = 1; m < machines.size(); ++m)
      others.create_group("machine_" + std::to_string(m)).set_attribute("machine", machines[m]);
  }
  ResultsGroup merged = root.create_group("runs");
  for (const RunSpec& run : runs)
    if (const auto found = source.find(run.id()); found != source.end())
      merged.copy_group(readers[found->second], "/runs/" + run.id(), run.id());
  txn.commit();
}

/// Writes the merged file `output` (write_merged_into); a failure removes the
/// empty file this call created, never another process' file or lock.
void write_merged(const std::string& output, const ResultsReader& first, const std::vector<ResultsReader>& readers,
                  const std::vector<RunSpec>& runs, const std::map<std::string, std::size_t>& source,
                  const std::vector<std::string>& machines) {
  ResultsStore store(output);  // creates the file, empty; held locked
  // Only an empty file is this merge's to remove again: one with runs is
  // another merge's, finished since merge_results found no file.
  if (!store.groups().empty())
    throw std::invalid_argument("merge: " + output + " exists; merge writes a new file");
  try {
    write_merged_into(store, first, readers, runs, source, machines);
  } catch (...) {
    std::error_code ignored;  // no empty output to refuse the next try
    std::filesystem::remove(output, ignored);
    throw;
  }
}

}  // namespace

std::vector<std::string> merge_results(const std::string& output, const std::vector<std::string>& inputs,
                                       const MergeOptions& options) {
  if (inputs.empty()) throw std::invalid_argument("merge: no input files");
  if (std::filesystem::exists(output))
    throw std::invalid_argument("merge: " + output + " exists; merge writes a new file");
  std::vector<ResultsReader> readers;
  for (const std::string& input : inputs) {
    // A shard still running would be merged without its later runs (--allow-missing hides it).
    if (results_file_being_written(input))
      throw std::invalid_argument("merge: " + input +
                                  " is being written (its lock is held: its run has not ended); merge it once that "
                                  "run ends");
    readers.emplace_back(input);
    // Another kind of file (a generate --logits file, another program's) or a
    // shard without the attributes that say what its runs are.
    if (const std::string problem = results_file_problem(readers.back()); !problem.empty())
      throw std::invalid_argument("merge: " + input + " is not a writescope results file (" + problem +
                                  "); merge combines the results files of writescope run");
    if (readers.back().has_attribute("/", "predicted"))
      throw std::invalid_argument("merge: " + input + " holds predicted runs (writescope predict); merge combines "
                                  "measured shards, and a projection is written whole");
  }
  const ResultsReader& first = readers.front();
  auto text = [](const ResultsReader& r, const std::string& object, const std::string& name) {
    return r.has_attribute(object, name) ? r.string_attribute(object, name) : std::string("(none)");
  };
  // The same experiment, build and profile, named where they differ.
  for (std::size_t i = 1; i < readers.size(); ++i) {
    const ResultsReader& r = readers[i];
    for (const auto& [object, name, what] :
         {std::tuple<const char*, const char*, const char*>{"/", "format", "results format"},
          {"/", "git_revision", "git revision"},
          {"/profile", "yaml", "machine profile"}})
      if (text(r, object, name) != text(first, object, name))
        throw std::invalid_argument("merge: " + inputs[i] + " and " + inputs[0] + " differ in their " + what +
                                    (std::string(name) == "git_revision" || std::string(name) == "format"
                                         ? " ('" + text(r, object, name) + "' and '" + text(first, object, name) + "')"
                                         : std::string()));
    if (const auto differing =
            experiment_differences(recorded_experiment(first), inputs[0] + ": its experiment config",
                                   recorded_experiment(r), inputs[i] + ": its experiment config", "in " + inputs[0],
                                   "in " + inputs[i]);
        !differing.empty())
      throw std::invalid_argument("merge: " + inputs[i] + " and " + inputs[0] + " differ in their experiment config (" +
                                  join_with(differing, "; ") + ")");
  }
  // Every machine setup of the inputs, once.
  std::vector<std::string> machines;
  for (const ResultsReader& r : readers) {
    for (const std::string& machine : recorded_machines(r))
      if (std::none_of(machines.begin(), machines.end(),
                       [&](const std::string& m) { return machine_setup_differences(m, machine).empty(); }))
        machines.push_back(machine);
  }
  const auto another_machine = [&](const std::string& m) {
    return !only_attention_choices(machine_setup_differences(machines.front(), m));
  };
  const auto other_machine = std::find_if(machines.begin(), machines.end(), another_machine);
  if (other_machine != machines.end() && !options.allow_different_machine) {
    std::string listed;
    for (const std::string& d : machine_setup_differences(machines.front(), *other_machine)) listed += "\n  " + d;
    throw std::invalid_argument("merge: the inputs were measured with different machine setups:" + listed +
                                "\npass --allow-different-machine to merge them (each run records its own)");
  }
  // The experiment's runs, in its order: every input run must be one of them.
  const RecordedExperiment recorded = read_recorded_experiment(first);
  const std::vector<RunSpec> runs = expand_runs(recorded.config, recorded.profile);
  std::map<std::string, std::size_t> source;  // run id -> input holding it
  std::vector<std::string> dropped;  // "dropped (damaged) from <input>: <run>"
  std::set<std::string> dropped_runs;
  for (std::size_t i = 0; i < readers.size(); ++i) {
    for (const std::string& id : readers[i].list("/runs")) {
      const std::string group = "/runs/" + id;
      // Damage first: a damaged run's attributes may not read.
      if (const std::string damage = run_damage(readers[i], group); !damage.empty()) {
        if (options.drop_damaged) {
          dropped.push_back("dropped (damaged) from " + inputs[i] + ": " + id);
          dropped_runs.insert(id);
          continue;
        }
        throw std::invalid_argument("merge: " + inputs[i] + ": run '" + id + "' is " + damage +
                                    "; run its shard again (it measures damaged runs again), or pass --drop-damaged "
                                    "to leave it out");
      }
      if (const std::string why = stray_run_reason(readers[i], id, recorded.config, runs); !why.empty())
        throw std::invalid_argument("merge: " + inputs[i] + ": run '" + id + "': " + why);
      const auto [at, added] = source.emplace(id, i);
      if (!added && text(readers[at->second], group, "checksum") != text(readers[i], group, "checksum"))
        throw std::invalid_argument("merge: run '" + id + "' is in " + inputs[at->second] + " and " + inputs[i] +
                                    " with different results");
    }
  }
  std::vector<std::string> missing;
  for (const RunSpec& run : runs)
    if (!source.count(run.id())) missing.push_back(run.id());
  if (!missing.empty() && !options.allow_missing) {
    std::string listed;
    for (const std::string& id : missing) listed += "\n  " + id;
    const auto missing_dropped = static_cast<std::size_t>(
        std::count_if(missing.begin(), missing.end(), [&](const std::string& id) { return dropped_runs.count(id); }));
    const std::string why =
        missing_dropped == 0                ? "a shard did not finish?"
        : missing_dropped == missing.size() ? "dropped as damaged"
                                            : std::to_string(missing_dropped) + " dropped as damaged, the others: a "
                                                                                "shard did not finish?";
    throw std::invalid_argument("merge: " + std::to_string(missing.size()) + " of the experiment's " +
                                std::to_string(runs.size()) + " runs are in no input (" + why + "):" + listed +
                                "\npass --allow-missing to merge what there is");
  }
  write_merged(output, first, readers, runs, source, machines);
  std::vector<std::string> lines{"merged " + std::to_string(source.size()) + " runs of " + std::to_string(runs.size()) +
                                 " from " + std::to_string(inputs.size()) + " files into " + output};
  lines.insert(lines.end(), dropped.begin(), dropped.end());
  for (const std::string& id : missing) lines.push_back("missing: " + id);
  return lines;
}

}  // namespace writescope
