#pragma once
// The experiment harness (DESIGN.md §7): an experiment config (YAML) expands
// into runs (model × system × batch × context × VRAM budget × repetition);
// each run builds the system on the model runtime, fills the context, warms
// up, measures decode steps and becomes one group of an HDF5 results file
// (schema in analysis/README.md), committed on its own so that a killed
// experiment leaves every completed run readable and a re-run resumes.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "experiments/systems.hpp"
#include "framework/config.hpp"
#include "framework/roofline.hpp"
#include "moe/model_config.hpp"

namespace writescope {

struct ModelSpec {
  std::string preset;
  ModelOverrides overrides;
  ModelConfig config;  // the preset with the overrides applied
  std::string label;   // preset plus overrides, for legends
};

struct ExperimentConfig {
  std::string name;
  std::string text;          // the YAML it was read from (load() only)
  std::string output;        // results file
  std::string profile;       // machine profile: a file, or a bundled profile's name
  std::vector<ModelSpec> models;
  std::vector<std::string> systems;
  std::vector<int> batch_sizes;
  std::vector<std::int64_t> contexts;   // tokens per sequence
  std::int64_t max_total_tokens = 0;    // runs whose batch x context exceeds it are skipped; 0: no limit
  std::vector<std::uint64_t> vram_budgets;
  std::uint64_t pinned_budget = 0, host_budget = 0;
  int warmup_steps = 2, measured_steps = 8, repetitions = 1;
  std::uint64_t seed = 1;
  int block_tokens = 64;
  std::string context_fill = "synthetic";  // or "prefill": random prompt tokens through the prefill path
  SystemOptions system_options;
  bool auto_writescope_experts = true;     // WriteScope takes the strongest baseline's expert policy

  /// Reads and validates; ConfigError names the file, the field and the reason.
  static ExperimentConfig load(const std::string& path);
  static ExperimentConfig from_config(const ConfigNode& root);
};

struct RunSpec {
  const ModelSpec* model = nullptr;
  std::string system;
  int batch = 1;
  std::int64_t context = 0;
  std::uint64_t vram_budget = 0;
  int repetition = 0;
  /// Unique within an experiment; stable across re-runs (the resume key).
  std::string id() const;
};

/// Every run of the experiment in execution order: within a setting the
/// baselines run before WriteScope, so that it can take the strongest one's
/// expert policy.
std::vector<RunSpec> expand_runs(const ExperimentConfig& config);

/// Where shipped profiles are looked up, in order: $WRITESCOPE_PROFILES, then
/// share/writescope/profiles beside the program's folder (the build tree and
/// the GPU bundle both have it), then experiments/profiles under the working
/// directory. Found at run time: no path of the build machine is compiled in.
std::vector<std::filesystem::path> shipped_profile_folders();

/// Finds a machine profile: an existing file, else <name>.yaml in the first of
/// shipped_profile_folders() that has it.
MachineProfile find_profile(const std::string& name_or_path);

struct ExperimentSummary {
  int complete = 0, did_not_fit = 0, failed = 0, skipped = 0;  // skipped: already in the file
};

/// Runs the experiment into config.output; progress goes to `progress`
/// (a bar with ETA when `tty`, plain lines otherwise).
ExperimentSummary run_experiment(const ExperimentConfig& config, const MachineProfile& profile,
                                 std::ostream& progress, bool tty);

}  // namespace writescope
