#pragma once
// Projection (`writescope predict`): what each system would do on a machine
// of a profile, from its roofline, without running a kernel.
//
// The systems' own placement and scheduling code runs unchanged (KV policy,
// write policy, expert policy, micro-batches, the split's α, its feedback
// fed with the priced times) on a
// bookkeeping-only InplaceKVCache and GPU expert slots that hold no weights,
// for the full-size models; each decode step is then priced with the
// profile's rates, component by component, with the devices overlapping as
// the model runtime overlaps them (moe/model.cpp). Nothing is allocated per
// token or per weight, so paper.yaml's models at 128K predict in seconds.
//
// What is modelled, per layer of a decode step (one micro-batch part at a time):
//  - attention: the KV policy's plan, resident bytes at the GPU's attention
//    rate, streamed bytes at the link's rate (plus latencies), CPU bytes at
//    the CPU attention rate of the shape; GPU and CPU shares overlap.
//  - the layer's dense weights (attention projections, norms, router, shared
//    and dense experts) read once at the dense rate (the GPU's HBM rate; on a
//    host-only profile the bf16 linear rate of the host kernels), plus a
//    fixed number of kernel launches.
//  - routed experts where the expert policy plans them: GPU ones at the dense
//    rate, loads at the link's rate (pinned or pageable, as the run's store),
//    CPU ones by the calibrated bf16 expert kernel; prefetches overlap the
//    next layer's attention. Routing is drawn uniformly (each token top-k
//    distinct experts, seeded): synthetic weights route near-uniformly, and
//    a real checkpoint's skew is not known before running it.
//  - the LM head and the logits' copy once per step.
// On a host-only profile (has_gpu false) the "GPU" work runs on the host as
// in a host build: nothing overlaps, and streamed KV and expert loads are
// host copies at half the DRAM read rate (each byte read and written).

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "experiments/harness.hpp"
#include "moe/model.hpp"

namespace writescope {

/// The decode workload of one run, as the harness drives the model.
struct DecodeWorkload {
  int batch = 1;
  std::int64_t context = 0;         // tokens per sequence before the warm-up steps (synthetic fill)
  std::int64_t planned_tokens = 0;  // what placement plans each sequence for (max_sequence_tokens)
  bool prefill_context = false;     // the context through the prefill path (max_rows chunks), not the synthetic fill
  int warmup_steps = 2, measured_steps = 8;
  int profile_tokens = 0;           // a routing-profiling prompt first (policies that profile routing)
  std::uint64_t seed = 1;           // the routing draws
};

/// The measured decode steps of a workload, priced.
struct PricedSteps {
  std::vector<double> step_seconds;                   // (measured steps)
  std::vector<std::vector<LayerRecord>> layers;       // (measured steps, layers): seconds, α, region bytes
  VramUse vram;
  HostUse host;
};

/// One layer of a decode step priced as MoeModel's layer_pipeline runs it,
/// in seconds: part j's feed-forward beside part j + 1's attention where
/// `overlap` (a GPU with its own driver thread), one after the other
/// otherwise. The expert prefetch stream: copies left from earlier layers
/// (`copies_left`) run beside the first attention stage, and where the
/// layer's plan uses a slot they fill (`waits`, as the runtime's
/// wait_for_prefetch) its first feed-forward waits for the rest; part j's prefetch (`issued[j]`) starts as its feed-forward ends, after the
/// copies before it. attention, feed_forward, issued: (parts).
struct LayerTimeline {
  double wall = 0;         // the layer, the exposed copies included
  double exposed = 0;      // copies the first feed-forward waited for
  double copies_left = 0;  // copies still running when the layer ends
};
LayerTimeline layer_timeline(const std::vector<double>& attention, const std::vector<double>& feed_forward,
                             const std::vector<double>& issued, double copies_left, bool waits, bool overlap);

/// Prices `workload` for a model of `config` with `options` (KV policy,
/// expert policy, budgets, micro-batches: what the model would be built
/// with) on `profile`. ModelBudgetError / KVBudgetError as the model would
/// raise them.
PricedSteps price_decode(const ModelConfig& config, const ModelOptions& options, const MachineProfile& profile,
                         const DecodeWorkload& workload);

struct PredictOptions {
  std::string output;  // results file (predicted = 1)
};

/// Prices every run of `config` on each of `profiles` (a machine profile per
/// GPU machine asked about) into `output`: the results schema with
/// `predicted` = 1 on the file and every run, whose `profile` names the
/// profile it was priced with, and `command` (the command line, where given)
/// as run records it. An existing output is replaced.
ExperimentSummary predict_experiment(const ExperimentConfig& config, const std::vector<MachineProfile>& profiles,
                                     const std::string& output, std::ostream& progress,
                                     const std::string& command = "");

/// Per system and component, how far predictions are from a file's measured
/// runs: each complete run priced with the profile it was measured with
/// (the file's /profile, its CPU figures replaced by `cpu_from` when given).
struct PredictionError {
  std::string system, component;  // component: "step" or a components/<name>, or "attention"
  int runs = 0;
  double median = 0, worst = 0;   // |predicted - measured| / measured
};
struct PredictionComparison {
  std::vector<PredictionError> errors;
  double median_step_error = 0, worst_step_error = 0;
  int runs = 0;
  std::string profile;                 // the profile the runs were priced with
  std::vector<std::string> unpriced;   // complete runs not compared: "<run>: <why>"
  int host_only_runs = 0;              // compared runs measured without a GPU, priced with a GPU profile
};
/// `progress`, where given, gets the number of complete runs to price first
/// and how many are priced every 5 seconds (a file of a whole paper's runs
/// takes a minute or more).
PredictionComparison compare_predictions(const std::string& results_file, const MachineProfile* cpu_from = nullptr,
                                         std::ostream* progress = nullptr);
/// The comparison as a table, ending in a line such as "median error 7.3% (worst 21.0%) over 40 runs".
std::string format_comparison(const PredictionComparison& comparison);

/// `base` with its CPU figures (threads, DRAM, path, FMA rate, expert and
/// attention rates, launch latency) from `cpu`: "my CPU with that GPU". The
/// name says so ("<base>+cpu:<cpu>") and so do its sources.
MachineProfile with_cpu_of(const MachineProfile& base, const MachineProfile& cpu);

}  // namespace writescope
