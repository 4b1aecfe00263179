#pragma once
// What `writescope run` and `writescope predict` share: how a run is set up
// (its system, budgets and pools) and how its record is written, so that a
// predicted run is built from the same decisions and lands in the same schema.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "experiments/harness.hpp"
#include "framework/results_store.hpp"

namespace writescope::impl {

/// Why a run did not complete.
struct RunFailure {
  std::string status;  // "does_not_fit" or "failed"
  std::string reason;
};

/// The record of one completed run, measured or predicted.
struct RunResult {
  std::vector<double> step_seconds, predicted_attention, attention;
  std::vector<double> alpha;                              // (steps, layers)
  std::map<std::string, std::vector<double>> components;  // each (steps, layers)
  std::vector<double> region_bytes[4];                    // each (steps)
  std::vector<double> streamed_gbps;                      // (steps): the GPU's streamed path, all layers
  int micro_batches = 1;
  std::int64_t planned_sequence_tokens = 0;  // the length the policies planned each sequence for
  VramUse vram;
  HostUse host;
  double attention_fmas_per_byte = 0;
  double cpu_attention_gbps = 0, cpu_streamed_attention_gbps = 0;  // the model's CpuResident and band rates

  /// Appends one step's layer records (step_seconds excluded).
  void add_step(const std::vector<LayerRecord>& layers);
};

/// LayerRecord's components as the schema names them.
inline constexpr const char* component_names[] = {"attention_gpu", "attention_cpu", "experts_gpu",
                                                  "experts_cpu",   "transfers",     "other"};

/// A run's system and model options, as the harness builds them: budgets,
/// pools within the one memory contract, the policies.
struct RunSetup {
  SystemContext context;
  System system;
  ModelOptions options;  // all but host_experts
  bool profiles = false;  // the expert policy profiles routing on a prompt of its own first
};

/// `run()`'s result, or nothing with `failure` saying why: "does_not_fit" for
/// a budget error (ModelBudgetError, KVBudgetError) or memory the machine did
/// not give (std::bad_alloc, or Kokkos' allocation failure, a
/// std::runtime_error: "host memory: ..." or "device memory: ..."), "failed"
/// for any other; reasons are one line.
std::optional<RunResult> attempt_run(const std::function<RunResult()>& run, RunFailure& failure);

/// ModelBudgetError when the run cannot fit its budgets.
RunSetup prepare_run(const ExperimentConfig& config, const RunSpec& run, const MachineProfile& profile);

/// Everything that defines `run` (the resume key compares it), as YAML.
std::string run_yaml(const ExperimentConfig& config, const RunSpec& run);

/// The run's group `name` in `runs` (schema: analysis/README.md), without its checksum.
void write_run(ResultsGroup& runs, const std::string& name, const ExperimentConfig& config, const RunSpec& run, const std::string& profile_name,
               const std::string& machine_yaml, const std::optional<RunResult>& result, const RunFailure& failure);

/// The file's experiment attributes and /profile; `planned_runs`: the runs
/// the file is to hold (its shard's, every profile's), so that a report can
/// tell a file some of whose runs never ran.
void write_experiment_attributes(ResultsGroup root, const ExperimentConfig& config, const MachineProfile& p,
                                 const std::string& machine_yaml, Shard shard, std::size_t planned_runs);

}  // namespace writescope::impl
