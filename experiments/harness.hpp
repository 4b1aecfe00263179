#pragma once
// The experiment harness (DESIGN.md §7): an experiment config (YAML) expands
// into runs (model × system × batch × context × VRAM budget × repetition);
// each run builds the system on the model runtime, fills the context, warms
// up, measures decode steps and becomes one group of an HDF5 results file
// (schema in analysis/README.md), committed on its own so that a killed
// experiment leaves every completed run readable and a re-run resumes.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
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
  std::string canonical;     // the parsed YAML re-emitted (no comments, one layout): what identifies it
  std::string output;        // results file
  std::string profile;       // machine profile: a file, or a bundled profile's name
  std::vector<ModelSpec> models;
  std::vector<std::string> systems;
  std::vector<int> batch_sizes;
  std::vector<std::int64_t> contexts;   // tokens per sequence
  std::int64_t max_total_tokens = 0;    // runs whose batch x context exceeds it are skipped; 0: no limit
  std::vector<std::uint64_t> vram_budgets;
  /// The one memory contract of every system: host_budget bounds all host
  /// memory of its data (routed experts, KV pools, staging; pinned included),
  /// pinned_limit all it page-locks (expert store, KV band, staging).
  std::uint64_t pinned_limit = 0, host_budget = 0;
  /// The longest sequence the systems plan for (a server's configured
  /// maximum): write policies and pool sizes use it, never a run's final length.
  std::int64_t max_sequence_tokens = 0;
  int warmup_steps = 2, measured_steps = 8, repetitions = 1;
  int profile_tokens = 256;  // the profiling prompt of policies that profile routing (Fiddler, HybriMoE)
  std::uint64_t seed = 1;
  int block_tokens = 64;
  std::string context_fill = "synthetic";  // or "prefill": random prompt tokens through the prefill path
  SystemOptions system_options;
  /// WriteScope's own expert policy is what its roofline picks before each
  /// setting runs (writescope_expert_choice), not a fixed name.
  bool auto_writescope_experts = true;

  /// Reads and validates; ConfigError names the file, the field and the reason.
  static ExperimentConfig load(const std::string& path);
  /// `recorded`: the config a results file holds (merge, predict --compare);
  /// files written before max_sequence_tokens was required planned for the
  /// longest context plus the steps, which a recorded config without it takes.
  static ExperimentConfig from_config(const ConfigNode& root, bool recorded = false);
};

struct RunSpec {
  const ModelSpec* model = nullptr;
  std::string system;
  std::string expert_policy;       // WriteScope: the baseline whose expert policy it runs; else empty
  bool system_comparison = true;   // false: a WriteScope run only for the same-expert-policy comparison
  int batch = 1;
  std::int64_t context = 0;
  std::uint64_t vram_budget = 0;
  int repetition = 0;
  /// Unique within an experiment; stable across re-runs (the resume key).
  std::string id() const;
};

/// std::invalid_argument where `profile` has no CPU attention rate for a
/// model's attention shape (every run would fail): checked before outputs are made.
void check_profile_prices(const ExperimentConfig& config, const MachineProfile& profile);

/// Every run of the experiment in execution order: within a setting the
/// baselines, then WriteScope once with each listed baseline's expert policy
/// (fiddler, ktransformers, hybrimoe: the same-expert-policy comparison) and
/// once more with its own choice (config, or its roofline's pick on
/// `profile`) if that is not among them; repetition by repetition, in pairs
/// that run that order rotated by the pair's index, then reversed (every
/// system as early as late, so drift falls on none). std::invalid_argument
/// where the profile has no CPU attention rate for a model's attention shape.
std::vector<RunSpec> expand_runs(const ExperimentConfig& config, const MachineProfile& profile);

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
  int stopped_by = 0;  // the signal (RunOptions::stop) that stopped it before its last run; 0: none
};

/// Share `index` (0-based, as a Slurm array task id) of `count` shares of an
/// experiment's runs.
struct Shard {
  int index = 0, count = 1;
  /// "K/N" with 0 <= K < N; std::invalid_argument says what is wrong otherwise.
  static Shard parse(const std::string& text);
  std::string text() const { return std::to_string(index) + "/" + std::to_string(count); }
};

/// Seconds a run should take on `profile` by the roofline (building the
/// model's expert store, filling the context, the warm-up and measured
/// steps' KV and expert reads): what balances shards. Not a measurement.
double predicted_run_seconds(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile);

/// The runs of `shard`, in `runs` order. A setting's runs (every system at
/// one model, VRAM budget, batch, context and repetition: what the report
/// compares) stay in one share; settings go, largest predicted cost first, to
/// the share with the least predicted time so far (ties to the lower share).
/// Deterministic; the shares are disjoint and cover `runs`.
std::vector<RunSpec> shard_runs(const std::vector<RunSpec>& runs, const ExperimentConfig& config,
                                const MachineProfile& profile, Shard shard);

struct RunOptions {
  /// Resume a file whose runs were measured with another machine setup
  /// (machine_setup_differences); the new setup is recorded beside the old.
  bool allow_different_machine = false;
  /// Run only this share of the runs (the file records it; resume needs the same share).
  Shard shard;
  /// Off a terminal, the least time between two progress lines within a run.
  double progress_line_seconds = 30;
  /// The command line that runs the experiment, recorded with each run it
  /// measures (a resumed file's runs come from several).
  std::string command;
  /// Set (to a signal number) when the experiment is to stop: no run starts after it.
  const std::atomic<int>* stop = nullptr;
};

/// A warning where this process runs `host_threads` host threads and
/// `profile`, measured on this kind of machine (a GPU profile on a GPU build,
/// a host profile on any), measured its CPU with another count: the systems
/// plan the CPU's share at the profile's rates for its count. Empty if none.
std::string thread_count_mismatch(const MachineProfile& profile, int host_threads);

/// One warning per choice of the host decode kernels for `shape` (the
/// next-pass level, the token-major pass) that `profile` states and this
/// process takes otherwise: the profile's CPU attention rates were measured
/// with the other. run_experiment logs them.
std::vector<std::string> attention_choice_mismatches(const MachineProfile& profile, const AttentionShape& shape);

/// MachineDescription::host_attention_choices of an experiment in this
/// process: "<model label>: <host_attention_choices of its shape>" per model,
/// one a line. Part of the setup: a resume whose process took other choices
/// adds runs of another setup (the only difference that needs no
/// --allow-different-machine), which the report compares apart.
std::string experiment_attention_choices(const ExperimentConfig& config);

/// Runs the experiment into config.output; progress goes to `progress`
/// (a bar with ETA when `tty`, plain lines otherwise). Runs already in the
/// file with the same definition are kept unless failed or damaged
/// (checksum mismatch: measured again, saying so).
ExperimentSummary run_experiment(const ExperimentConfig& config, const MachineProfile& profile,
                                 std::ostream& progress, bool tty, const RunOptions& options = {});

/// Merges results files of shards of one experiment into `output` (a new
/// file) as if one process had run them: every input must hold the same
/// experiment config, git revision and machine profile, and the same machine
/// setup unless allowed (differences are named); every run
/// must match its checksum and belong to the experiment; a run in two inputs
/// must have the same checksum; every run of the experiment must be in some
/// input unless `allow_missing`. Runs are written in the experiment's order;
/// nothing is left at `output` when it fails. Returns one line per fact worth
/// saying (runs merged, runs missing).
struct MergeOptions {
  bool allow_different_machine = false;  // inputs of several machine setups (each run records its own)
  bool allow_missing = false;            // write even when runs of the experiment are in no input
  bool drop_damaged = false;             // leave out a run that fails its checksum or does not read (listed)
};
std::vector<std::string> merge_results(const std::string& output, const std::vector<std::string>& inputs,
                                       const MergeOptions& options = {});

/// Creates the folder of the output file `path` where it is missing (`run`,
/// `predict`, `merge` and `calibrate` do); std::invalid_argument naming
/// `option` and the system's reason where it cannot be, or, before making
/// anything, where `path` cannot be a file (ends in '/', a pipe or device).
void create_output_folder(const std::string& option, const std::string& path);

class ResultsReader;

/// Why the run group `group` of the file `reader` reads cannot be trusted (its
/// checksum does not match its contents, it lost its checksum, or it does not
/// read); "" if it can, or if it predates checksums.
std::string run_damage(const ResultsReader& reader, const std::string& group);

/// Why run group `id` of `reader` is no run of `config`, whose runs are
/// `runs` (expand_runs), or "" where it is one: no run has its id (renamed,
/// added by hand), or its recorded settings, which resume matches runs by,
/// are not those the experiment gives it (edited, or of another experiment).
std::string stray_run_reason(const ResultsReader& reader, const std::string& id, const ExperimentConfig& config,
                             const std::vector<RunSpec>& runs);
/// The run groups of a measured results file that are no run of its
/// recorded experiment, each with stray_run_reason.
std::map<std::string, std::string> runs_not_of_the_experiment(const ResultsReader& reader);

/// The experiment a measured results file records (its canonical config, or
/// the config as written in files that predate it) and the profile its runs
/// were planned with: what expand_runs needs to name the file's runs.
struct RecordedExperiment {
  ExperimentConfig config;
  MachineProfile profile;
};
RecordedExperiment read_recorded_experiment(const ResultsReader& reader);

/// Why the file `reader` reads is not of this results format: "no 'format'
/// attribute", "format 'x', not 'writescope-results-1'"; "" when it is.
std::string results_format_problem(const ResultsReader& reader);

/// Why the file `reader` reads is not an experiment's results file of this
/// format (what `writescope run` writes): its format problem first, then "no
/// 'config' attribute" or "no 'machine' attribute"; "" when it is one.
std::string results_file_problem(const ResultsReader& reader);

}  // namespace writescope
