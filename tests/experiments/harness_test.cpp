#include "experiments/harness.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <map>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "attention/host_prefetch.hpp"
#include "experiments/calibration.hpp"
#include "experiments/impl/run_record.hpp"
#include "framework/cpu_path.hpp"
#include "framework/machine.hpp"
#include "framework/results_store.hpp"
#include "scratch_dir.hpp"
#include "test_profile.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

class HarnessTest : public ::testing::Test {
 protected:
  /// A tiny experiment; `extra` is appended to the YAML.
  ExperimentConfig config(const std::string& extra = "") const {
    const std::string yaml = "name: test\noutput: " + output_ +
                             "\nprofile: test\n"
                             "models:\n  - {preset: tiny-mixtral}\n  - {preset: tiny-deepseek-v2, layers: 2}\n"
                             "systems: [ktransformers, writescope, gpu-only]\n"
                             "batch_sizes: [2]\ncontexts: [24, 40]\nmax_sequence_tokens: 44\n"
                             "budgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\n"
                             "steps: {warmup: 1, measured: 3}\nblock_tokens: 8\n" +
                             extra;
    return ExperimentConfig::from_config(ConfigNode::parse(yaml, "test.yaml"));
  }

  /// The smallest experiment: tiny-mixtral at one batch and context, into output_.
  std::string small_yaml(const std::string& name, const std::string& systems = "[ktransformers, gpu-only]") const {
    return "name: " + name + "\noutput: " + output_ + "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: " +
           systems +
           "\nbatch_sizes: [1]\ncontexts: [16]\nmax_sequence_tokens: 19\n"
           "budgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\nsteps: {warmup: 1, measured: 2}\nblock_tokens: 8\n";
  }

  /// Where the object header of `object` lies in output_.
  haddr_t object_header(const std::string& object) const {
    const hid_t file = H5Fopen(output_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    H5O_info_t info;
    const bool found = file >= 0 && H5Oget_info_by_name(file, object.c_str(), &info, H5P_DEFAULT) >= 0;
    if (file >= 0) H5Fclose(file);
    return found ? info.addr : HADDR_UNDEF;
  }

  /// Resuming `experiment` stops before measuring with an error holding
  /// each of `expected`, and leaves output_ as it was.
  void expect_resume_stops_before_measuring(const ExperimentConfig& experiment,
                                            const std::vector<std::string>& expected) const {
    const auto size = fs::file_size(output_);
    std::ostringstream progress;
    try {
      run_experiment(experiment, test::tiny_profile(), progress, false);
      ADD_FAILURE() << "resumed onto a run it cannot replace";
    } catch (const ResultsError& e) {
      for (const std::string& part : expected) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_EQ(progress.str().find("run 1/2"), std::string::npos) << "measured before it stopped:\n" << progress.str();
    EXPECT_EQ(fs::file_size(output_), size);
  }

  static std::string error_of(const std::string& yaml) {
    try {
      ExperimentConfig::from_config(ConfigNode::parse(yaml, "bad.yaml"));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }

  const test::ScratchDir scratch_{"harness"};
  const fs::path dir_ = scratch_.path();
  const std::string output_ = (dir_ / "results.h5").string();
};

// A profile file's per-shape entries name presets' attention shapes (a typo
// would price nothing); a CPU attention rate above the DRAM read it reads
// its KV at is a warning.
TEST_F(HarnessTest, AProfileFileNamesPresetShapesAndWarnsOfAttentionFasterThanDram) {
  const std::string profile_text = R"(name: shapes
has_gpu: false
cpu: {threads: 4, dram_read_gbps: 20, fma_glanes: 100, expert_gbps: 10, expert_gflops: 50,
      attention_gbps: {qwen3-30b-a3b: {1: 4, 4: 25}}}
)";
  const std::string path = (dir_ / "shapes.yaml").string();
  std::string typo = profile_text;
  typo.replace(typo.find("qwen3-30b-a3b"), 13, "qwen4-99b");
  std::ofstream(path) << typo;
  try {
    find_profile(path);
    FAIL() << "a shape no preset has accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "cpu.attention_gbps.qwen4-99b");
    EXPECT_NE(e.reason().find("no model preset has this attention shape (presets: deepseek-v2-lite, qwen3-30b-a3b"),
              std::string::npos)
        << e.reason();
  }
  std::ofstream(path) << profile_text;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_profile(path).cpu_attention("qwen3-30b-a3b", 4), 25);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("warning: CPU attention of qwen3-30b-a3b at 4 threads (25 GB/s) is faster than "
                     "cpu.dram_read_gbps (20 GB/s)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("at 1 threads"), std::string::npos) << log;
}

TEST_F(HarnessTest, BadConfigsNameTheFieldAndTheReason) {
  const std::string base =
      "name: x\noutput: x.h5\nprofile: p\nmodels: [{preset: tiny-mixtral}]\nbatch_sizes: [1]\ncontexts: [8]\n"
      "budgets: {vram: 1GiB, pinned: 1GiB, host: 1GiB}\nmax_sequence_tokens: 64\n";
  EXPECT_NE(error_of(base + "systems: [vllm]\n").find("field 'systems': unknown system 'vllm'"), std::string::npos)
      << error_of(base + "systems: [vllm]\n");
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nrepetition: 2\n").find("did you mean 'repetitions'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "systems: [gpu-only, gpu-only]\n")
                .find("field 'systems': entries 1 and 2 are both 'gpu-only'"),
            std::string::npos);
  // A repeated setting would give two runs one id.
  auto replaced = [&](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to) + "systems: [gpu-only]\n";
  };
  EXPECT_NE(error_of(replaced(base, "batch_sizes: [1]", "batch_sizes: [1, 2, 1]"))
                .find("field 'batch_sizes': entries 1 and 3 are both 1"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(base, "contexts: [8]", "contexts: [8, 8]")).find("field 'contexts': entries 1 and 2"),
            std::string::npos);
  const std::string same_vram = replaced(base, "vram: 1GiB", "vram: [1GiB, 1024MiB]");
  EXPECT_NE(error_of(same_vram).find("field 'budgets.vram': entries 1 and 2"), std::string::npos)
      << error_of(same_vram);
  const std::string same_model =
      replaced(base, "[{preset: tiny-mixtral}]", "[{preset: tiny-mixtral}, {preset: tiny-mixtral}]");
  EXPECT_NE(error_of(same_model).find("field 'models': entries 1 and 2 are both 'tiny-mixtral'"), std::string::npos)
      << error_of(same_model);
  const std::string same_model_two_ways =
      replaced(base, "[{preset: tiny-mixtral}]", "[{preset: tiny-mixtral}, {preset: tiny-mixtral, layers: 2}]");
  EXPECT_NE(error_of(same_model_two_ways).find("field 'models': entries 1 and 2 are both 'tiny-mixtral'"),
            std::string::npos)
      << error_of(same_model_two_ways);
  std::string bad_batch = base;
  bad_batch.replace(bad_batch.find("batch_sizes: [1]"), 16, "batch_sizes: [0]");
  EXPECT_NE(error_of(bad_batch + "systems: [gpu-only]\n").find("batch_sizes"), std::string::npos);
  std::string bad_model = base;
  bad_model.replace(bad_model.find("tiny-mixtral"), 12, "llama");
  EXPECT_NE(error_of(bad_model + "systems: [gpu-only]\n").find("unknown model 'llama'"), std::string::npos)
      << error_of(bad_model + "systems: [gpu-only]\n");
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nsteps: {measured: 0}\n").find("measured"), std::string::npos);
  // A measured first step would time the buffers it grows (a profiling system's grew before it).
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nsteps: {warmup: 0}\n")
                .find("field 'steps.warmup': must be in [1, 1048576] (a first step grows buffers, and measured it "
                      "would time their allocation), got 0"),
            std::string::npos)
      << error_of(base + "systems: [gpu-only]\nsteps: {warmup: 0}\n");
  // Names and paths must say something; sizes stop short of overflowing the budgets' arithmetic.
  for (const auto& [from, to, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"name: x", "name: ''", "field 'name': must not be empty"},
           {"output: x.h5", "output: ' '", "field 'output': must not be empty"},
           {"profile: p", "profile: ''", "field 'profile': must not be empty"},
           {"contexts: [8]", "contexts: [8, 9223372036854775807]",
            "field 'contexts[1]': must be in [1, 1099511627776], got 9223372036854775807"},
           {"contexts: [8]", "contexts: [99999999999999999999]",
            "field 'contexts[0]': must be in [1, 1099511627776], got '99999999999999999999'"},
           {"batch_sizes: [1]", "batch_sizes: [65537]", "field 'batch_sizes[0]': must be in [1, 65536], got 65537"},
           {"max_sequence_tokens: 64", "max_sequence_tokens: 9223372036854775807",
            "17592186044416] (from the longest context plus the warm-up and measured steps to 2^44 tokens over the "
            "largest batch, 1), got 9223372036854775807"},
           {"vram: 1GiB", "vram: 0", "field 'budgets.vram': must be a positive byte size"},
           {"{preset: tiny-mixtral}", "{preset: tiny-mixtral, layers: 3}",
            "field 'models[0].layers': must be in [1, 2] (the preset's layers), got 3"},
           {"{preset: tiny-mixtral}", "{preset: tiny-mixtral, layers: 4294967297}",
            "field 'models[0].layers': must be in [1, 2] (the preset's layers), got 4294967297"},
           {"host: 1GiB", "host: 0", "field 'budgets.host': must be a positive byte size"},
           {"name: x", "name: x\nseed: 0x10", "field 'seed': expected an integer in [0, 9223372036854775807], got '0x10'"}}) {
    const std::string bad = replaced(base, from, to);
    EXPECT_NE(error_of(bad).find(message), std::string::npos) << error_of(bad);
  }
  std::string large_batch = replaced(base, "max_sequence_tokens: 64", "max_sequence_tokens: 268435457");
  large_batch.replace(large_batch.find("batch_sizes: [1]"), 16, "batch_sizes: [1, 65536]");
  EXPECT_NE(error_of(large_batch)
                .find("268435456] (from the longest context plus the warm-up and measured steps to 2^44 tokens "
                      "over the largest batch, 65536), got 268435457"),
            std::string::npos)
      << error_of(large_batch);
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nrepetitions: 1001\n").find("field 'repetitions': must be in [1, 1000]"),
            std::string::npos);
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nsteps: {warmup: 1048577}\n")
                .find("field 'steps.warmup': must be in [1, 1048576]"),
            std::string::npos);
  EXPECT_EQ(error_of(replaced(base, "pinned: 1GiB", "pinned: 0")), "no error");  // no page-locked memory at all
  EXPECT_NE(error_of(base + "systems: [gpu-only]\ncontext_fill: random\n").find("context_fill"), std::string::npos);
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nmax_total_tokens: 7\n")
                .find("field 'max_total_tokens': leaves no run: the smallest batch x context is 8 tokens, over 7"),
            std::string::npos)
      << error_of(base + "systems: [gpu-only]\nmax_total_tokens: 7\n");
  EXPECT_EQ(error_of(base + "systems: [gpu-only]\nmax_total_tokens: 8\n"), "no error");
  // A batch size or context that max_total_tokens leaves without a run is said.
  ::testing::internal::CaptureStderr();
  std::string dropping = base;
  dropping.replace(dropping.find("batch_sizes: [1]"), 16, "batch_sizes: [1, 4, 8]");
  dropping.replace(dropping.find("contexts: [8]"), 13, "contexts: [8, 16, 40]");
  EXPECT_EQ(error_of(dropping + "systems: [gpu-only]\nmax_total_tokens: 32\n"), "no error");
  const std::string dropped = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(dropped.find("config 'x': max_total_tokens 32 leaves no run of batch sizes 8 and contexts 40"),
            std::string::npos)
      << dropped;
  // A plan of exactly the longest runs' final length is allowed, and said.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(error_of(replaced(base, "max_sequence_tokens: 64", "max_sequence_tokens: 18")), "no error");
  const std::string exact_plan = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(exact_plan.find("config 'x': max_sequence_tokens 18 is where the longest runs end (context 8 + 10 "
                            "steps): their write policies plan for exactly their final length"),
            std::string::npos)
      << exact_plan;
  // The profiling prompt is a sequence of the plan: at most max_sequence_tokens.
  EXPECT_NE(error_of(base + "systems: [fiddler]\nsteps: {profile_tokens: 65}\n")
                .find("field 'steps.profile_tokens': the profiling prompt (65 tokens) must fit max_sequence_tokens (64)"),
            std::string::npos)
      << error_of(base + "systems: [fiddler]\nsteps: {profile_tokens: 65}\n");
  EXPECT_EQ(error_of(base + "systems: [fiddler]\nsteps: {profile_tokens: 64}\n"), "no error");
  EXPECT_NE(error_of(base + "systems: [fiddler]\nsteps: {profile_tokens: 0}\n").find("profile_tokens"),
            std::string::npos);
  const std::string past_int = base + "systems: [gpu-only]\nsteps: {measured: 99999999999}\n";
  EXPECT_NE(error_of(past_int).find("field 'steps.measured': must be in [1, 1048576], got 99999999999"),
            std::string::npos)
      << error_of(past_int);
  // The batch's tokens bound the longest sequence before max_sequence_tokens can.
  std::string huge_batch = replaced(base, "contexts: [8]", "contexts: [1073741824]");
  huge_batch.replace(huge_batch.find("batch_sizes: [1]"), 16, "batch_sizes: [65536]");
  EXPECT_NE(error_of(huge_batch).find("field 'contexts': the longest context plus the warm-up and measured steps "
                                      "(1073741834 tokens) times the largest batch (65536) must be at most 2^44 tokens"),
            std::string::npos)
      << error_of(huge_batch);
  const std::string short_maximum =
      replaced(base, "max_sequence_tokens: 64", "max_sequence_tokens: 12") + "steps: {warmup: 2, measured: 3}\n";
  EXPECT_NE(error_of(short_maximum)
                .find("field 'max_sequence_tokens': must be in [13, 17592186044416] (from the longest context plus "
                      "the warm-up and measured steps"),
            std::string::npos)
      << error_of(short_maximum);
  // Never the runs' final length by default: a server states its maximum.
  const std::string no_maximum = replaced(base, "max_sequence_tokens: 64\n", "");
  EXPECT_NE(error_of(no_maximum).find("field 'max_sequence_tokens': is required: the longest sequence the systems "
                                      "plan for (a server's configured maximum, at least 18 tokens here)"),
            std::string::npos)
      << error_of(no_maximum);
  // A results file's recorded config from before the field was required
  // planned for the longest context plus the steps.
  EXPECT_EQ(ExperimentConfig::from_config(ConfigNode::parse(no_maximum, "recorded.yaml"), true).max_sequence_tokens,
            18);
  std::string pinned_above_host = base;
  pinned_above_host.replace(pinned_above_host.find("pinned: 1GiB"), 12, "pinned: 2GiB");
  EXPECT_NE(error_of(pinned_above_host + "systems: [fiddler]\n").find("cannot exceed the host budget"),
            std::string::npos);
  EXPECT_NE(error_of(base + "systems: [writescope]\noptions: {writescope_experts: vllm}\n")
                .find("must be one of auto, fiddler, ktransformers, hybrimoe, got 'vllm'"),
            std::string::npos);
}

TEST_F(HarnessTest, WritesTheSchemaAndResumes) {
  const ExperimentConfig experiment = config();
  const auto runs = expand_runs(experiment, test::tiny_profile());
  // Per setting (2 models x 2 contexts): two baselines, then WriteScope with
  // KTransformers' experts and, if its roofline picks another policy, with that.
  ASSERT_GE(runs.size(), 2u * 2u * 3u);
  ASSERT_LE(runs.size(), 2u * 2u * 4u);
  EXPECT_EQ(runs[1].system, "gpu-only");
  EXPECT_EQ(runs[2].system, "writescope");  // after the baselines of its setting
  EXPECT_EQ(runs[2].expert_policy, "ktransformers");
  EXPECT_EQ(std::count_if(runs.begin(), runs.end(),
                          [](const RunSpec& r) { return r.system == "writescope" && r.system_comparison; }),
            4);
  std::ostringstream progress;
  RunOptions options;
  options.command = "writescope run 'test experiment.yaml'";
  const ExperimentSummary first = run_experiment(experiment, test::tiny_profile(), progress, false, options);
  EXPECT_EQ(first.failed, 0) << progress.str();
  EXPECT_GT(first.complete, 0);
  EXPECT_NE(progress.str().find("run 1/" + std::to_string(runs.size()) + ": tiny-mixtral ktransformers b2 24"),
            std::string::npos)
      << progress.str();

  const ResultsReader reader(output_);
  EXPECT_EQ(reader.string_attribute("/", "format"), "writescope-results-1");
  EXPECT_EQ(reader.string_attribute("/", "experiment"), "test");
  EXPECT_EQ(reader.string_attribute("/profile", "name"), "test");
  const auto names = reader.list("/runs");
  ASSERT_EQ(names.size(), runs.size());
  // Each run records the product path, the next-pass level and the token-major pass of its own model's
  // attention shape.
  std::map<std::string, std::string> path_of_run, next_pass_of_run, token_major_pass_of_run;
  for (const RunSpec& run : runs) {
    path_of_run[run.id()] = describe_decode_cpu_paths(run.model->config.attention());
    next_pass_of_run[run.id()] = describe_next_pass_prefetch(run.model->config.attention());
    token_major_pass_of_run[run.id()] = describe_token_major_pass(run.model->config.attention());
  }
  int complete = 0;
  for (const std::string& name : names) {
    const std::string g = "/runs/" + name;
    EXPECT_EQ(reader.string_attribute(g, "cpu_decode_path"), path_of_run.at(name)) << g;
    EXPECT_EQ(reader.string_attribute(g, "next_pass_prefetch"), next_pass_of_run.at(name)) << g;
    EXPECT_EQ(reader.string_attribute(g, "token_major_pass"), token_major_pass_of_run.at(name)) << g;
    // When and by which command each run was measured.
    EXPECT_EQ(reader.string_attribute(g, "command"), options.command) << g;
    const std::regex utc("20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]Z");
    const std::string started = reader.string_attribute(g, "started"), finished = reader.string_attribute(g, "finished");
    EXPECT_TRUE(std::regex_match(started, utc)) << started;
    EXPECT_TRUE(std::regex_match(finished, utc)) << finished;
    EXPECT_LE(started, finished) << g;
    const std::string status = reader.string_attribute(g, "status");
    if (status != "complete") {
      EXPECT_EQ(status, "does_not_fit") << g;
      EXPECT_EQ(reader.string_attribute(g, "system"), "gpu-only") << g << ": " << reader.string_attribute(g, "reason");
      EXPECT_NE(reader.string_attribute(g, "reason").find("of VRAM"), std::string::npos);
      continue;
    }
    ++complete;
    const std::int64_t layers = reader.int_attribute(g, "layers"), batch = reader.int_attribute(g, "batch"),
                       context = reader.int_attribute(g, "context");
    EXPECT_EQ(reader.shape(g + "/alpha"), (std::vector<std::size_t>{3, static_cast<std::size_t>(layers)}));
    EXPECT_EQ(reader.shape(g + "/components/experts_cpu"),
              (std::vector<std::size_t>{3, static_cast<std::size_t>(layers)}));
    const auto steps = reader.read<double>(g + "/step_seconds");
    double total = 0;
    for (double s : steps) total += s;
    EXPECT_NEAR(reader.double_attribute(g, "tokens_per_second"), batch * 3 / total, 1e-9);
    // The model's CPU rates over both block orders, the profile's at its 2 threads.
    const ModelRates rates =
        ModelRates::from_profile(test::tiny_profile(), model_preset(reader.string_attribute(g, "model")).attention().name, 2);
    EXPECT_EQ(reader.double_attribute(g, "cpu_attention_gbps"), rates.cpu_attention_gbps) << g;
    EXPECT_EQ(reader.double_attribute(g, "cpu_streamed_attention_gbps"), rates.cpu_streamed_attention_gbps) << g;
    // Step s reads every token written so far: context + warm-up + s + 1 per sequence and layer.
    const ModelConfig model = model_preset(reader.string_attribute(g, "model"));
    const BlockGeometry geometry = model.attention().block_geometry(8);
    const double bytes_per_token = static_cast<double>(geometry.block_elements()) * sizeof(bf16) / 8;
    std::vector<double> read(3, 0.0);
    for (const char* region : {"gpu_resident", "gpu_streamed", "cpu_resident", "cpu_streamed"}) {
      const auto bytes = reader.read<double>(g + "/region_bytes/" + region);
      for (std::size_t s = 0; s < 3; ++s) read[s] += bytes[s];
    }
    for (std::size_t s = 0; s < 3; ++s)
      EXPECT_DOUBLE_EQ(read[s], static_cast<double>(layers * batch * (context + 1 + s + 1)) * bytes_per_token) << g;
    // The GPU's streamed rate per step: positive exactly in the steps that streamed.
    const auto streamed = reader.read<double>(g + "/region_bytes/gpu_streamed");
    const auto streamed_gbps = reader.read<double>(g + "/streamed_gbps");
    ASSERT_EQ(streamed_gbps.size(), 3u) << g;
    for (std::size_t s = 0; s < 3; ++s) EXPECT_EQ(streamed_gbps[s] > 0, streamed[s] > 0) << g << " step " << s;
  }
  EXPECT_EQ(complete, first.complete);

  // A re-run finds every run in the file and measures nothing.
  std::ostringstream again;
  const ExperimentSummary second = run_experiment(experiment, test::tiny_profile(), again, false);
  EXPECT_EQ(second.skipped, static_cast<int>(runs.size()));
  EXPECT_EQ(second.complete + second.did_not_fit + second.failed, 0);
  EXPECT_EQ(again.str(), "");

  // A changed definition (here the block size) is measured again, replacing the old groups.
  ExperimentConfig changed = experiment;
  changed.block_tokens = 16;
  std::ostringstream third_progress;
  const ExperimentSummary third = run_experiment(changed, test::tiny_profile(), third_progress, false);
  EXPECT_EQ(third.skipped, 0);
  EXPECT_EQ(third.complete + third.did_not_fit, static_cast<int>(runs.size()));
  EXPECT_EQ(ResultsReader(output_).list("/runs").size(), runs.size());

  // Another machine profile does not mix into the file; one whose CPU
  // attention ran with the other next-pass level is named first.
  MachineProfile other = test::tiny_profile();
  other.cpu_expert_gbps *= 2;
  const AttentionShape first_shape = changed.models[0].config.attention();
  const std::string other_level = active_next_pass_prefetch(first_shape) == PrefetchLevel::l1 ? "l2" : "l1";
  other.cpu_next_pass_prefetch[first_shape.name] = other_level;
  ::testing::internal::CaptureStderr();
  try {
    run_experiment(changed, other, third_progress, false);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds runs of another machine profile"), std::string::npos) << e.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("run: warning: profile 'test' measured CPU attention of " + first_shape.name +
                     " with the next pass requested into " + other_level),
            std::string::npos)
      << log;
}

// A profile measured with another product path (for either block order),
// next-pass level or pass than this process takes for a shape is named,
// choice by choice, with what this process takes and how to pin the profile's.
TEST(ThreadCountMismatch, NamesBothCountsWhereTheProfileDescribesThisKindOfMachine) {
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = false;
  profile.cpu_threads = 2;
  EXPECT_EQ(thread_count_mismatch(profile, 2), "");
  EXPECT_EQ(thread_count_mismatch(profile, 1),
            "run: warning: profile '" + profile.name +
                "' measured the CPU with 2 threads but this process runs 1; the systems plan the CPU's share at the "
                "profile's rates for 2 (give --kokkos-threads=2, or re-run writescope calibrate with this thread "
                "count)");
  profile.has_gpu = true;
  EXPECT_EQ(thread_count_mismatch(profile, 1).empty(), !has_gpu) << "a GPU machine's profile on a host build";
}

TEST(AttentionChoiceMismatches, NameEachChoiceTheProfileMeasuredOtherwise) {
  const AttentionShape shape = qwen3_30b_a3b_attention();
  MachineProfile profile = test::tiny_profile();
  EXPECT_TRUE(attention_choice_mismatches(profile, shape).empty()) << "nothing stated";
  const std::string path = cpu_path_name(decode_product_path(shape, BlockOrder::head_major));
  const std::string streamed_path = cpu_path_name(decode_product_path(shape, BlockOrder::token_major));
  const std::string level = prefetch_level_name(active_next_pass_prefetch(shape));
  const int pass = active_token_major_pass(shape), head_major_pass = active_head_major_pass(shape);
  profile.cpu_decode_path[shape.name] = path;
  profile.cpu_streamed_decode_path[shape.name] = streamed_path;
  profile.cpu_next_pass_prefetch[shape.name] = level;
  if (pass > 0) profile.cpu_token_major_pass[shape.name] = std::to_string(pass);
  if (head_major_pass > 0) profile.cpu_head_major_pass[shape.name] = std::to_string(head_major_pass);
  EXPECT_TRUE(attention_choice_mismatches(profile, shape).empty()) << "the same choices";
  const std::string other_path = path == "avx2" ? "scalar" : "avx2";
  const std::string other_streamed_path = streamed_path == "avx2" ? "scalar" : "avx2";
  const std::string other_level = level == "l1" ? "l2" : "l1", other_pass = pass == 32 ? "128" : "32";
  profile.cpu_decode_path[shape.name] = other_path;
  profile.cpu_streamed_decode_path[shape.name] = other_streamed_path;
  profile.cpu_next_pass_prefetch[shape.name] = other_level;
  profile.cpu_token_major_pass[shape.name] = other_pass;
  const std::string other_head_major_pass = head_major_pass == 32 ? "128" : "32";
  profile.cpu_head_major_pass[shape.name] = other_head_major_pass;
  profile.cpu_next_pass_prefetch["mixtral-8x7b"] = "l3";  // another shape's: not this one's business
  const std::vector<std::string> warnings = attention_choice_mismatches(profile, shape);
  ASSERT_EQ(warnings.size(), 3u + (head_major_pass > 0) + (pass > 0));
  // The warning for a choice stated as `stated` where this process takes `described`, pinned by `variable`.
  const auto expected_warning = [](const std::string& choice, const std::string& stated,
                                   const std::string& described, const std::string& variable) {
    return "run: warning: profile 'test' measured CPU attention of qwen3-30b-a3b with " + choice + " " + stated +
           " but this process takes " + described +
           "; its CPU attention rates may be off by 10-30% (re-run writescope calibrate, or set " + variable + "=" +
           stated + ")";
  };
  EXPECT_EQ(warnings[0], expected_warning("the head-major products on", other_path,
                                          describe_decode_cpu_path(shape, BlockOrder::head_major),
                                          "WRITESCOPE_CPU_PATH"));
  EXPECT_EQ(warnings[1], expected_warning("the token-major products on", other_streamed_path,
                                          describe_decode_cpu_path(shape, BlockOrder::token_major),
                                          "WRITESCOPE_CPU_PATH"));
  EXPECT_EQ(warnings[2], expected_warning("the next pass requested into", other_level,
                                          describe_next_pass_prefetch(shape), "WRITESCOPE_NEXT_PASS_PREFETCH"));
  if (head_major_pass > 0) {
    EXPECT_EQ(warnings[3], expected_warning("head-major passes of", other_head_major_pass,
                                            describe_next_pass_prefetch(shape), "WRITESCOPE_HEAD_MAJOR_PASS"));
  }
  if (pass > 0) {
    EXPECT_EQ(warnings.back(), expected_warning("token-major passes of", other_pass, describe_token_major_pass(shape),
                                                "WRITESCOPE_TOKEN_MAJOR_PASS"));
  } else {
    std::cout << "[ SKIPPED  ] the token-major pass: " << cpu_path_name(active_cpu_path())
              << " passes by its own rule\n";
  }
  // Paths the profile measured differently per order: WRITESCOPE_CPU_PATH, which pins both, restores neither.
  MachineProfile split_paths = test::tiny_profile();
  const std::string head_major_other = path == "scalar" ? "avx2" : "scalar";
  split_paths.cpu_decode_path[shape.name] = head_major_other;
  for (const char* other : {"avx512_fma", "avx2", "scalar"})
    if (other != streamed_path && other != head_major_other) split_paths.cpu_streamed_decode_path[shape.name] = other;
  const std::vector<std::string> split_warnings = attention_choice_mismatches(split_paths, shape);
  ASSERT_EQ(split_warnings.size(), 2u);
  for (const std::string& warning : split_warnings) {
    EXPECT_EQ(warning.find("WRITESCOPE_CPU_PATH"), std::string::npos) << warning;
    EXPECT_NE(warning.find("(re-run writescope calibrate)"), std::string::npos) << warning;
  }
}

TEST_F(HarnessTest, RepetitionsRunInTurnSoThatEverySystemRunsEarlyAndLateAlike) {
  const std::vector<RunSpec> runs = expand_runs(config("repetitions: 4\n"), test::tiny_profile());
  auto setting = [](const RunSpec& run) {
    return run.model->label + " " + std::to_string(run.vram_budget) + " " + std::to_string(run.batch) + " " +
           std::to_string(run.context);
  };
  auto system = [](const RunSpec& run) { return run.system + "/" + run.expert_policy; };
  // Each setting's runs together, repetition by repetition.
  std::map<std::string, std::vector<std::vector<std::string>>> order;  // setting -> repetition -> systems
  std::string previous;
  std::set<std::string> finished;
  for (const RunSpec& run : runs) {
    const std::string here = setting(run);
    if (here != previous) {
      EXPECT_TRUE(finished.insert(here).second) << here << " interrupted";
      previous = here;
    }
    auto& repetitions = order[here];
    ASSERT_GE(run.repetition + 1, static_cast<int>(repetitions.size())) << here << ": repetitions out of turn";
    if (run.repetition == static_cast<int>(repetitions.size())) repetitions.emplace_back();
    repetitions.back().push_back(system(run));
  }
  ASSERT_EQ(order.size(), 4u);  // 2 models x 2 contexts
  for (const auto& [here, repetitions] : order) {
    ASSERT_EQ(repetitions.size(), 4u) << here;
    const std::size_t count = repetitions[0].size();
    ASSERT_GE(count, 3u) << here;  // two baselines and WriteScope
    // Each pair of repetitions puts every system as early as late (positions
    // k and count - 1 - k): its mean position is the middle, WriteScope's too.
    std::map<std::string, std::vector<std::size_t>> positions;
    for (const std::vector<std::string>& systems : repetitions) {
      ASSERT_EQ(systems.size(), count) << here;
      for (std::size_t k = 0; k < count; ++k) positions[systems[k]].push_back(k);
    }
    ASSERT_EQ(positions.size(), count) << here;
    for (const auto& [name, at] : positions)
      for (std::size_t pair = 0; pair < 2; ++pair)
        EXPECT_EQ(at[2 * pair] + at[2 * pair + 1], count - 1) << here << " " << name << " pair " << pair;
    // The pairs start with different systems, so no system always follows the same one.
    EXPECT_NE(repetitions[0].front(), repetitions[2].front()) << here;
  }
}

// Damage HDF5 cannot unlink (a run's object header): resume stops before
// measuring and names the way out, merge --drop-damaged, which copies the
// intact runs into a file that resumes.
TEST_F(HarnessTest, ARunThatCannotBeRemovedStopsResumeBeforeMeasuring) {
  const std::string yaml = small_yaml("damaged");
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "damaged.yaml"));
  std::ostringstream quiet;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), quiet, false).complete, 2) << quiet.str();
  const std::string damaged = ResultsReader(output_).list("/runs").front();
  const haddr_t header = object_header("/runs/" + damaged);
  ASSERT_NE(header, HADDR_UNDEF);
  {  // The header's version byte zeroed: the group neither reads nor unlinks.
    std::fstream bytes(output_, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekp(static_cast<std::streamoff>(header));
    bytes.put('\0');
  }
  ASSERT_NE(run_damage(ResultsReader(output_), "/runs/" + damaged), "");
  expect_resume_stops_before_measuring(
      experiment, {"run '" + damaged + "' is unreadable", "nothing was measured. Copy its intact runs into a new file "
                                                          "with `writescope merge NEW.h5 " + output_ +
                                                              " --drop-damaged --allow-missing`"});
  // Without --drop-damaged merge refuses the file and says how to go on.
  const std::string repaired = (dir_ / "repaired.h5").string();
  MergeOptions drop;
  drop.allow_missing = true;
  try {
    merge_results(repaired, {output_}, drop);
    ADD_FAILURE() << "merged a damaged run";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("or pass --drop-damaged to leave it out"), std::string::npos) << e.what();
  }
  MergeOptions drop_only;
  drop_only.drop_damaged = true;
  try {
    merge_results(repaired, {output_}, drop_only);
    ADD_FAILURE() << "merged without the dropped run";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("runs are in no input (dropped as damaged)"), std::string::npos) << e.what();
  }
  drop.drop_damaged = true;
  const std::vector<std::string> lines = merge_results(repaired, {output_}, drop);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "dropped (damaged) from " + output_ + ": " + damaged), lines.end());
  EXPECT_EQ(ResultsReader(repaired).list("/runs").size(), 1u);
  ExperimentConfig resumed = experiment;
  resumed.output = repaired;
  const ExperimentSummary summary = run_experiment(resumed, test::tiny_profile(), quiet, false);
  EXPECT_EQ(summary.complete, 1);
  EXPECT_EQ(summary.skipped, 1);
  EXPECT_EQ(run_damage(ResultsReader(repaired), "/runs/" + damaged), "");
}

// A run damaged so that reading it crashes the HDF5 library: verify names
// it, resume stops before measuring (unlinking it would read it) with the
// same way out, and merge --drop-damaged copies the other run.
TEST_F(HarnessTest, ARunThatCrashesTheHdf5LibraryStopsResumeBeforeMeasuring) {
  const std::string yaml = small_yaml("crashing");
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "crashing.yaml"));
  std::ostringstream quiet;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), quiet, false).complete, 2) << quiet.str();
  const std::string damaged = ResultsReader(output_).list("/runs").front(), g = "/runs/" + damaged;
  const haddr_t header = object_header(g);
  ASSERT_NE(header, HADDR_UNDEF);
  std::string intact;
  {
    std::ifstream in(output_, std::ios::binary);
    intact.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // A 4-byte field of the run's object header or what it points to, made huge.
  bool crashes = false;
  for (std::size_t at = header; at + 4 <= std::min(intact.size(), header + 4096) && !crashes; at += 4) {
    std::string damaged_bytes = intact;
    damaged_bytes.replace(at, 4, "\xff\xff\xff\x7f");
    std::ofstream(output_, std::ios::binary | std::ios::trunc) << damaged_bytes;
    try {
      crashes = ResultsReader(output_).crashes_reading(g);
    } catch (const ResultsError&) {  // damage that crashes it outside the run
    }
  }
  if (!crashes) GTEST_SKIP() << "this HDF5 library crashes on no damage of the run's header tried";
  EXPECT_NE(run_damage(ResultsReader(output_), g).find("crashes reading it"), std::string::npos);
  expect_resume_stops_before_measuring(
      experiment, {"the file cannot be changed around it (the HDF5 library crashes reading the run); nothing was "
                   "measured. Copy its intact runs into a new file with `writescope merge NEW.h5 " + output_ +
                   " --drop-damaged --allow-missing`"});
  const std::string repaired = (dir_ / "repaired.h5").string();
  MergeOptions drop;
  drop.allow_missing = drop.drop_damaged = true;
  const std::vector<std::string> lines = merge_results(repaired, {output_}, drop);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "dropped (damaged) from " + output_ + ": " + damaged), lines.end());
  EXPECT_EQ(ResultsReader(repaired).list("/runs").size(), 1u);
}

// Memory the budgets allowed but the machine refused does not fit (and is
// tried again on resume); reasons are one line, without Kokkos' traceback note.
TEST(AttemptRun, AnAllocationTheMachineRefusesDoesNotFit) {
  // Kokkos 3.4's message (impl/Kokkos_MemorySpace.cpp), as the KV cache passes it on.
  auto kokkos_failure = [](const std::string& space) {
    return "KV cache: the pinned budget of 6442450944 bytes (2 blocks) cannot be allocated on this machine: Kokkos "
           "failed to allocate memory for label \"writescope::layouts::pinned_pool\".  Allocation using MemorySpace "
           "named \"" + space + "\" failed with the following error:  Allocation of size 6 G failed, likely due to "
           "insufficient memory.\n\nTraceback functionality not available\n";
  };
  impl::RunFailure failure;
  EXPECT_FALSE(impl::attempt_run([&]() -> impl::RunResult { throw KVCacheError(kokkos_failure("Host")); }, failure));
  EXPECT_EQ(failure.status, "does_not_fit");
  EXPECT_EQ(failure.reason,
            "host memory: an allocation failed (KV cache: the pinned budget of 6442450944 bytes (2 blocks) cannot be "
            "allocated on this machine: Kokkos failed to allocate memory for label "
            "\"writescope::layouts::pinned_pool\". Allocation using MemorySpace named \"Host\" failed with the "
            "following error: Allocation of size 6 G failed, likely due to insufficient memory.)");
  EXPECT_FALSE(impl::attempt_run([&]() -> impl::RunResult { throw std::runtime_error(kokkos_failure("Cuda")); }, failure));
  EXPECT_EQ(failure.reason.rfind("device memory: an allocation failed (", 0), 0u) << failure.reason;
  EXPECT_FALSE(impl::attempt_run(
      []() -> impl::RunResult {
        throw std::runtime_error("Kokkos encountered an allocation failure, then another allocation failure while "
                                 "trying to create the error message.");
      },
      failure));
  EXPECT_EQ(failure.status, "does_not_fit");
  EXPECT_FALSE(impl::attempt_run([]() -> impl::RunResult { throw std::bad_alloc(); }, failure));
  EXPECT_EQ(failure.status, "does_not_fit");
  EXPECT_EQ(failure.reason.rfind("host memory: an allocation failed (", 0), 0u) << failure.reason;
  EXPECT_FALSE(impl::attempt_run([]() -> impl::RunResult { throw std::runtime_error("two\nlines\n"); }, failure));
  EXPECT_EQ(failure.status, "failed");
  EXPECT_EQ(failure.reason, "two lines");
  // A budget too small is named as the experiment's config names it.
  EXPECT_FALSE(impl::attempt_run(
      []() -> impl::RunResult { throw ModelBudgetError("vram_budget: 1.0MiB cannot hold tiny-mixtral's weights"); },
      failure));
  EXPECT_EQ(failure.status, "does_not_fit");
  EXPECT_EQ(failure.reason, "budgets.vram: 1.0MiB cannot hold tiny-mixtral's weights");
}

// A stop asked (a signal, RunOptions::stop) ends the experiment before its
// next run, saying so; the file keeps what was written and resumes.
TEST_F(HarnessTest, AStopEndsTheExperimentBeforeItsNextRun) {
  const ExperimentConfig config = ExperimentConfig::from_config(ConfigNode::parse(small_yaml("stop"), "stop.yaml"));
  std::atomic<int> stop{SIGINT};
  RunOptions options;
  options.stop = &stop;
  std::ostringstream progress;
  const ExperimentSummary stopped = run_experiment(config, test::tiny_profile(), progress, false, options);
  EXPECT_EQ(stopped.stopped_by, SIGINT);
  EXPECT_EQ(stopped.complete + stopped.did_not_fit + stopped.failed + stopped.skipped, 0);
  EXPECT_NE(progress.str().find("run: stopped by SIGINT before run 1/2; the file keeps the runs written"),
            std::string::npos)
      << progress.str();
  stop = 0;
  const ExperimentSummary resumed = run_experiment(config, test::tiny_profile(), progress, false, options);
  EXPECT_EQ(resumed.stopped_by, 0);
  EXPECT_EQ(resumed.complete + resumed.did_not_fit, 2);
}

/// Progress text that sets `stop` to SIGTERM once `mark` has been written.
class StopWhenWritten : public std::stringbuf {
 public:
  StopWhenWritten(std::atomic<int>& stop, std::string mark) : stop_(stop), mark_(std::move(mark)) {}

 protected:
  int sync() override {
    if (str().find(mark_) != std::string::npos) stop_ = SIGTERM;
    return 0;
  }

 private:
  std::atomic<int>& stop_;
  std::string mark_;
};

// A stop asked during the last run: every run is written, and the stop is
// still said, so that the command dies of its signal and a calling script stops.
TEST_F(HarnessTest, AStopDuringTheLastRunIsStillSaid) {
  const ExperimentConfig config = ExperimentConfig::from_config(ConfigNode::parse(small_yaml("last"), "last.yaml"));
  std::atomic<int> stop{0};
  RunOptions options;
  options.stop = &stop;
  StopWhenWritten text(stop, "run 2/2");
  std::ostream progress(&text);
  const ExperimentSummary summary = run_experiment(config, test::tiny_profile(), progress, false, options);
  EXPECT_EQ(summary.complete + summary.did_not_fit, 2) << text.str();
  EXPECT_EQ(summary.stopped_by, SIGTERM);
  EXPECT_NE(text.str().find("run: SIGTERM came during the last run; every run is written"), std::string::npos)
      << text.str();
}

// A run group renamed by hand is no run of the experiment, nor is one whose
// recorded settings are not the experiment's (which resume would measure
// again): verify names both.
TEST_F(HarnessTest, RunsNotOfTheExperimentAreNamed) {
  const std::string yaml = small_yaml("strays");
  std::ostringstream quiet;
  run_experiment(ExperimentConfig::from_config(ConfigNode::parse(yaml, "strays.yaml")), test::tiny_profile(), quiet,
                 false);
  using Strays = std::map<std::string, std::string>;
  EXPECT_EQ(runs_not_of_the_experiment(ResultsReader(output_)), Strays{});
  const std::vector<std::string> runs = ResultsReader(output_).list("/runs");
  ASSERT_GE(runs.size(), 2u);
  {
    ResultsStore store(output_);
    auto txn = store.begin();
    txn.root().open_group("runs").copy_group(ResultsReader(output_), "/runs/" + runs[0], "renamed");
    const std::string settings = ResultsReader(output_).string_attribute("/runs/" + runs[1], "config");
    const std::size_t seed = settings.find("seed: 1");
    ASSERT_NE(seed, std::string::npos) << settings;
    txn.root().open_group("runs").open_group(runs[1]).set_attribute(
        "config", settings.substr(0, seed) + "seed: 5" + settings.substr(seed + 7));
    txn.commit();
  }
  EXPECT_EQ(runs_not_of_the_experiment(ResultsReader(output_)),
            (Strays{{"renamed", "not a run of the file's experiment"},
                    {runs[1], "its recorded settings (its 'config') are not those the file's experiment gives this run"}}));
}

// Resume keeps a file honest: a comment-only edit is the same experiment and
// the file does not grow; another build is refused; a damaged run is measured
// again; another machine setup is refused unless allowed, and then recorded
// beside the first.
TEST_F(HarnessTest, ResumeChecksTheConfigTheRunsAndTheMachine) {
  const std::string yaml = small_yaml("resume");
  const auto experiment = [&](const std::string& text) {
    return ExperimentConfig::from_config(ConfigNode::parse(text, "resume.yaml"));
  };
  std::ostringstream progress;
  const ExperimentSummary first = run_experiment(experiment(yaml), test::tiny_profile(), progress, false);
  ASSERT_EQ(first.complete, 2) << progress.str();
  const auto size = fs::file_size(output_);
  std::ostringstream quiet;
  const ExperimentSummary again =
      run_experiment(experiment("# a comment\n" + yaml + "# the end\n"), test::tiny_profile(), quiet, false);
  EXPECT_EQ(again.skipped, 2);
  // Another experiment is refused, naming the fields it differs in.
  auto resume_error = [&](const std::string& text) {
    try {
      run_experiment(experiment(text), test::tiny_profile(), quiet, false);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("resumed");
  };
  EXPECT_NE(resume_error(yaml + "seed: 2\n")
                .find("holds runs of another experiment config (it differs in seed: (absent) in the file, 2 here)"),
            std::string::npos)
      << resume_error(yaml + "seed: 2\n");
  auto replaced = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  const std::string more_contexts = replaced(yaml, "contexts: [16]", "contexts: [8, 16]") + "seed: 2\n";
  EXPECT_NE(resume_error(more_contexts)
                .find("(it differs in contexts: [16] in the file, [8, 16] here; seed: (absent) in the file, 2 here)"),
            std::string::npos)
      << resume_error(more_contexts);
  EXPECT_EQ(fs::file_size(output_), size) << "resuming grew the file";
  // Keys in another order and a budget spelled in bytes are the same experiment.
  const std::string respelled =
      replaced(yaml, "budgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}", "budgets: {host: 25165824, vram: 12MiB, pinned: 8MiB}");
  ASSERT_NE(respelled, yaml);
  EXPECT_EQ(resume_error(respelled), "resumed");
  // Defaults written out are the same experiment; another value is not.
  const std::string defaults_written_out =
      replaced(replaced(yaml, "{preset: tiny-mixtral}",
                        "{preset: tiny-mixtral, layers: " + std::to_string(model_preset("tiny-mixtral").layers) +
                            ", hidden_scale: 1.0}"),
               "steps: {warmup: 1, measured: 2}", "steps: {measured: 2, warmup: 1}") +
      "seed: 1\nrepetitions: 1\ncontext_fill: synthetic\nmax_total_tokens: 0\n"
      "options: {score_decay: 0.8, expert_vram_share: 0.5, prefetch_experts: 0, writescope_experts: auto}\n";
  EXPECT_EQ(resume_error(defaults_written_out), "resumed");
  EXPECT_NE(resume_error(yaml + "options: {score_decay: 0.5}\n")
                .find("(it differs in options: (absent) in the file, {score_decay: 0.5} here)"),
            std::string::npos)
      << resume_error(yaml + "options: {score_decay: 0.5}\n");
  // Where the results go and where the profile was read from do not identify
  // the experiment: a file moved along with its config's output resumes.
  const std::string moved = output_ + ".moved.h5";
  fs::copy_file(output_, moved);
  EXPECT_EQ(run_experiment(experiment(replaced(replaced(yaml, output_, moved), "profile: test", "profile: elsewhere")),
                           test::tiny_profile(), quiet, false)
                .skipped,
            2);
  fs::remove(moved);
  {  // A copy with its root attributes damaged: each damage named, never resumed into.
    const std::string garbled = output_ + ".garbled.h5";
    const auto damaged_copy = [&](auto damage) {
      fs::remove(garbled);
      fs::copy_file(output_, garbled);
      ResultsStore store(garbled);
      auto txn = store.begin();
      damage(txn.root());
      txn.commit();
    };
    const auto config_error = [&]() -> std::string {
      try {
        run_experiment(experiment(replaced(yaml, output_, garbled)), test::tiny_profile(), quiet, false);
      } catch (const ConfigError& e) {
        return e.what();
      }
      return "resumed";
    };
    // A garbled recorded config or machine setup is named, not a YAML parser's message alone.
    damaged_copy([](ResultsGroup root) { root.set_attribute("config_canonical", "name: [x"); });
    EXPECT_EQ(config_error().rfind(garbled + ": its experiment config:1:", 0), 0u) << config_error();
    damaged_copy([](ResultsGroup root) { root.set_attribute("machine", "host_threads: [1"); });
    EXPECT_EQ(config_error().rfind(garbled + ":/@machine:1:", 0), 0u) << config_error();
    // Runs whose file lost the config they were measured under: refused, as verify refuses the file.
    damaged_copy([](ResultsGroup root) { root.remove_attribute("config"); });
    EXPECT_NE(resume_error(replaced(yaml, output_, garbled))
                  .find(garbled + " holds runs but is not a complete results file (no 'config' attribute)"),
              std::string::npos)
        << resume_error(replaced(yaml, output_, garbled));
    fs::remove(garbled);
  }

  // Runs of another build are not resumed into.
  auto set_revision = [&](const std::string& revision) {
    ResultsStore store(output_);
    auto txn = store.begin();
    txn.root().set_attribute("git_revision", revision);
    txn.commit();
  };
  set_revision("0123456789ab-dirty");
  try {
    run_experiment(experiment(yaml), test::tiny_profile(), quiet, false);
    ADD_FAILURE() << "resumed runs of another build";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds runs of git revision '0123456789ab-dirty' but this build is '" +
                                         std::string(git_revision()) + "'"),
              std::string::npos)
        << e.what();
  }
  set_revision(git_revision());

  // Damage one run's data behind its checksum: verify-style check and re-measurement.
  const std::string damaged = ResultsReader(output_).list("/runs").front();
  {
    ResultsStore store(output_);
    auto txn = store.begin();
    ResultsGroup run = txn.root().open_group("runs").open_group(damaged);
    const auto steps = ResultsReader(output_).read<double>("/runs/" + damaged + "/step_seconds");
    run.remove("step_seconds");
    run.write("step_seconds", std::vector<double>(steps.size(), 1e-9));
    txn.commit();
  }
  EXPECT_NE(run_damage(ResultsReader(output_), "/runs/" + damaged).find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(run_damage(ResultsReader(output_), "/runs/" + ResultsReader(output_).list("/runs").back()), "");
  const ExperimentSummary repaired = run_experiment(experiment(yaml), test::tiny_profile(), quiet, false);
  EXPECT_EQ(repaired.complete, 1);
  EXPECT_EQ(repaired.skipped, 1);
  EXPECT_EQ(run_damage(ResultsReader(output_), "/runs/" + damaged), "");
  {  // A run that lost its checksum in a file whose build gives every run one.
    ResultsStore store(output_);
    auto txn = store.begin();
    txn.root().open_group("runs").open_group(damaged).remove_attribute("checksum");
    txn.commit();
  }
  EXPECT_NE(run_damage(ResultsReader(output_), "/runs/" + damaged).find("no checksum, though the build"),
            std::string::npos);
  EXPECT_EQ(run_experiment(experiment(yaml), test::tiny_profile(), quiet, false).complete, 1);
  EXPECT_EQ(run_damage(ResultsReader(output_), "/runs/" + damaged), "");

  // The file's runs came from another thread setup.
  {
    ResultsStore store(output_);
    auto txn = store.begin();
    std::string machine = ResultsReader(output_).string_attribute("/", "machine");
    const auto at = machine.find("host_threads: ");
    machine.replace(at, machine.find('\n', at) - at, "host_threads: 977");
    txn.root().set_attribute("machine", machine);
    txn.commit();
  }
  try {
    run_experiment(experiment(yaml), test::tiny_profile(), quiet, false);
    FAIL() << "another machine setup accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("another machine setup:\n  host_threads: '977' -> '"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--allow-different-machine"), std::string::npos);
  }
  RunOptions allow;
  allow.allow_different_machine = true;
  // A complete file takes no run of this setup, so it records none.
  EXPECT_EQ(run_experiment(experiment(yaml), test::tiny_profile(), quiet, false, allow).skipped, 2);
  EXPECT_FALSE(ResultsReader(output_).exists("/other_machines"));
  {  // One run to measure again: the setup goes in with it.
    ResultsStore store(output_);
    auto txn = store.begin();
    ResultsGroup run = txn.root().open_group("runs").open_group(damaged);
    run.set_attribute("checksum", "crc32:00000000");
    txn.commit();
  }
  const ExperimentSummary added = run_experiment(experiment(yaml), test::tiny_profile(), quiet, false, allow);
  EXPECT_EQ(added.complete, 1);
  EXPECT_EQ(added.skipped, 1);
  const ResultsReader reader(output_);
  EXPECT_NE(reader.string_attribute("/", "machine").find("host_threads: 977"), std::string::npos);
  ASSERT_EQ(reader.list("/other_machines").size(), 1u);
  MachineDescription now = MachineDescription::detect();
  now.host_attention_choices = experiment_attention_choices(experiment(yaml));
  EXPECT_EQ(now.setup_differences(
                reader.string_attribute("/other_machines/" + reader.list("/other_machines").front(), "machine")),
            std::vector<std::string>{});
  // Now recorded, the second setup resumes without the flag.
  EXPECT_EQ(run_experiment(experiment(yaml), test::tiny_profile(), quiet, false).skipped, 2);
}

// Each process measures the host attention's choices (product path, next
// pass level, passes) per model: a resume whose process took others, 4-30%
// apart, adds its runs as another setup (which the report compares apart),
// without --allow-different-machine; another machine still needs it.
TEST_F(HarnessTest, AResumeThatTookOtherHostAttentionChoicesAddsAnotherSetup) {
  const std::string yaml = small_yaml("choices");
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "choices.yaml"));
  std::ostringstream quiet;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), quiet, false).complete, 2) << quiet.str();
  const std::string choices = experiment_attention_choices(experiment);
  ASSERT_EQ(choices.find('\n'), std::string::npos) << "one model: " << choices;
  EXPECT_EQ(choices.rfind("tiny-mixtral: head-major ", 0), 0u) << choices;
  const auto recorded_choices = [](const std::string& machine) {
    const YAML::Node node = YAML::Load(machine)["host_attention_choices"];
    return node ? node.as<std::string>() : std::string("(none)");
  };
  {
    const ResultsReader reader(output_);
    EXPECT_EQ(recorded_choices(reader.string_attribute("/runs/" + reader.list("/runs").front(), "machine")), choices);
  }
  const auto recorded_elsewhere = [&](const std::string& field, const std::string& value) {
    ResultsStore store(output_);
    auto txn = store.begin();
    std::string machine = ResultsReader(output_).string_attribute("/", "machine");
    const auto at = machine.find(field + ": ");
    ASSERT_NE(at, std::string::npos) << machine;
    machine.replace(at, machine.find('\n', at) - at, field + ": " + value);
    txn.root().set_attribute("machine", machine);
    if (txn.root().has("other_machines")) txn.root().remove("other_machines");
    txn.root().open_group("runs").remove(ResultsReader(output_).list("/runs").front());
    txn.commit();
  };
  recorded_elsewhere("host_attention_choices", "'tiny-mixtral: recorded by another process'");
  EXPECT_EQ(run_experiment(experiment, test::tiny_profile(), quiet, false).complete, 1);
  {
    const ResultsReader reader(output_);
    ASSERT_EQ(reader.list("/other_machines").size(), 1u);
    EXPECT_EQ(recorded_choices(reader.string_attribute("/other_machines/" + reader.list("/other_machines").front(),
                                                       "machine")),
              choices);
  }
  // Other choices on another machine: that difference still needs the flag.
  recorded_elsewhere("host_threads", "977");
  try {
    run_experiment(experiment, test::tiny_profile(), quiet, false);
    FAIL() << "runs of another machine resumed without --allow-different-machine";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("another machine setup:\n  host_threads: '977' -> '"), std::string::npos)
        << e.what();
  }
}

// An HDF5 file of another program named as the output is refused before
// anything is written: its attributes and its /profile stay as they were.
TEST_F(HarnessTest, AnotherProgramsFileIsNotTakenOver) {
  const ExperimentConfig experiment = config();
  const auto contents = [&] {
    std::ifstream in(output_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const bool with_format : {true, false}) {
    fs::remove(output_);
    {
      ResultsStore store(output_);
      auto txn = store.begin();
      if (with_format) txn.root().set_attribute("format", "another-tool-2");
      txn.root().create_group("profile").set_attribute("owner", "another tool");
      txn.commit();
    }
    const std::string before = contents();
    std::ostringstream progress;
    try {
      run_experiment(experiment, test::tiny_profile(), progress, false);
      ADD_FAILURE() << "wrote into another program's file";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(output_ + " is not a writescope results file (" +
                                           (with_format ? "format 'another-tool-2', not 'writescope-results-1'"
                                                        : "no 'format' attribute") +
                                           ")"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(contents(), before);
  }
}

// Off a terminal (a batch system's log) a run's phases show as plain lines,
// at most one per progress_line_seconds, with the time left: the
// experiment's once a run has finished, the first run's own before.
TEST_F(HarnessTest, PlainProgressShowsTheRunsPhases) {
  const std::string yaml = small_yaml("plain");
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "plain.yaml"));
  RunOptions every_phase;
  every_phase.progress_line_seconds = 0;
  std::ostringstream progress;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), progress, false, every_phase).complete, 2)
      << progress.str();
  const std::string text = progress.str();
  EXPECT_NE(text.find("run 1/2: tiny-mixtral ktransformers b1 16: warm-up\n"), std::string::npos) << text;
  // Before a run has finished, the first run's own steps give its time left.
  EXPECT_NE(text.find("run 1/2: tiny-mixtral ktransformers b1 16: step 2/2 (ETA of this run "), std::string::npos)
      << text;
  EXPECT_NE(text.find("run 2/2: tiny-mixtral gpu-only b1 16: step 2/2 (ETA "), std::string::npos) << text;
  EXPECT_EQ(text.find("\r"), std::string::npos) << "terminal codes off a terminal";
  // The default spacing keeps a short run to its first and last lines.
  fs::remove(output_);
  std::ostringstream quiet;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), quiet, false).complete, 2) << quiet.str();
  EXPECT_EQ(quiet.str().find(": step "), std::string::npos) << quiet.str();
}

// Contexts built from real prompts: accepted up to the paper's longest, and
// a prompt longer than one chunk (256 rows) goes through the prefill path
// (its progress shows on a terminal) and fills the context the decode steps
// then read in full.
TEST_F(HarnessTest, PromptsFillContextsThroughPrefill) {
  const std::string yaml = "name: test\noutput: " + output_ +
                           "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [writescope]\n"
                           "batch_sizes: [1]\nbudgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\n"
                           "steps: {warmup: 1, measured: 2}\nblock_tokens: 8\ncontext_fill: prefill\n";
  EXPECT_EQ(error_of(yaml + "contexts: [131072]\nmax_sequence_tokens: 131075\n"), "no error");
  constexpr std::int64_t context = 300;
  const ExperimentConfig experiment =
      ExperimentConfig::from_config(ConfigNode::parse(yaml + "contexts: [300]\nmax_sequence_tokens: 303\n", "prefill.yaml"));
  std::ostringstream progress;
  const ExperimentSummary summary = run_experiment(experiment, test::tiny_profile(), progress, true);
  ASSERT_EQ(summary.failed, 0) << progress.str();
  ASSERT_GT(summary.complete, 0) << progress.str();
  EXPECT_NE(progress.str().find("context 1/1: prefill 256/300"), std::string::npos) << progress.str();
  const ResultsReader reader(output_);
  for (const std::string& name : reader.list("/runs")) {
    const std::string g = "/runs/" + name;
    ASSERT_EQ(reader.string_attribute(g, "status"), "complete") << g;
    EXPECT_EQ(reader.int_attribute(g, "context"), context);
    const ModelConfig model = model_preset("tiny-mixtral");
    const double bytes_per_token =
        static_cast<double>(model.attention().block_geometry(8).block_elements()) * sizeof(bf16) / 8;
    std::vector<double> read(2, 0.0);
    for (const char* region : {"gpu_resident", "gpu_streamed", "cpu_resident", "cpu_streamed"}) {
      const auto bytes = reader.read<double>(g + "/region_bytes/" + region);
      for (std::size_t s = 0; s < 2; ++s) read[s] += bytes[s];
    }
    for (std::size_t s = 0; s < 2; ++s)
      EXPECT_DOUBLE_EQ(read[s], static_cast<double>(model.layers * (context + 1 + s + 1)) * bytes_per_token) << g;
  }
}

// A context larger than the machine can hold is a "does not fit" record that
// names the bytes, decided before any pool is allocated or filled.
TEST_F(HarnessTest, AContextBeyondTheMachinesMemoryDoesNotFit) {
  const std::string yaml = "name: huge\noutput: " + output_ +
                           "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [ktransformers]\n"
                           "batch_sizes: [1]\ncontexts: [1099511627776]\nmax_sequence_tokens: 1099511627786\n"
                           "budgets: {vram: 12MiB, pinned: 1024TiB, host: 4096TiB}\n";
  std::ostringstream progress;
  const ExperimentSummary summary = run_experiment(ExperimentConfig::from_config(ConfigNode::parse(yaml, "huge.yaml")),
                                                   test::tiny_profile(), progress, false);
  EXPECT_EQ(summary.did_not_fit, 1) << progress.str();
  const ResultsReader reader(output_);
  const std::string reason = reader.string_attribute("/runs/" + reader.list("/runs").front(), "reason");
  EXPECT_NE(reason.find("of host memory"), std::string::npos) << reason;
  EXPECT_NE(reason.find("available"), std::string::npos) << reason;
}

TEST(Shard, SharesAreDisjointCoverTheRunsAndBalanceTheirPredictedCost) {
  EXPECT_EQ(Shard::parse("2/8").text(), "2/8");
  for (const char* bad : {"8/8", "-1/4", "1", "1/0", "a/4", "1/4x", "/4"})
    EXPECT_THROW(Shard::parse(bad), std::invalid_argument) << bad;
  const ExperimentConfig config = ExperimentConfig::from_config(ConfigNode::parse(
      "name: s\noutput: s.h5\nprofile: p\nmodels: [{preset: tiny-mixtral}, {preset: tiny-deepseek-v2}]\n"
      "systems: [ktransformers, fiddler, writescope]\nbatch_sizes: [1, 4]\n"
      "contexts: [1024, 4096, 16384, 65536]\nmax_sequence_tokens: 131072\nbudgets: {vram: 12MiB, pinned: 1GiB, host: 2GiB}\n",
      "s.yaml"));
  const MachineProfile profile = test::tiny_profile();
  const std::vector<RunSpec> runs = expand_runs(config, profile);
  // A setting: what the report compares its systems within.
  auto setting = [](const RunSpec& run) {
    return run.model->label + " " + std::to_string(run.vram_budget) + " " + std::to_string(run.batch) + " " +
           std::to_string(run.context) + " " + std::to_string(run.repetition);
  };
  std::map<std::string, double> setting_cost;
  for (const RunSpec& run : runs) setting_cost[setting(run)] += predicted_run_seconds(config, run, profile);
  for (int count : {1, 3, 5}) {
    std::multiset<std::string> seen;
    std::map<std::string, int> share_of_setting;
    std::vector<double> load;
    double largest = 0;
    for (int index = 0; index < count; ++index) {
      load.push_back(0);
      std::string previous;
      std::size_t position = 0;
      for (const RunSpec& run : shard_runs(runs, config, profile, Shard{index, count})) {
        seen.insert(run.id());
        // Every system of a setting in one share.
        EXPECT_EQ(share_of_setting.emplace(setting(run), index).first->second, index) << run.id();
        load.back() += predicted_run_seconds(config, run, profile);
        largest = std::max(largest, setting_cost[setting(run)]);
        // In the experiment's order.
        while (position < runs.size() && runs[position].id() != run.id()) ++position;
        EXPECT_LT(position, runs.size()) << run.id() << " out of order";
      }
    }
    EXPECT_EQ(seen.size(), runs.size());
    for (const RunSpec& run : runs) EXPECT_EQ(seen.count(run.id()), 1u) << run.id();
    // Greedy by cost: no share exceeds another by more than one setting's cost.
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
  }
  // More shards than settings: the first shards take a setting each, the rest
  // none; a count as large as --shard takes (2^31 - 1) costs nothing per shard.
  std::set<std::string> settings;
  for (const RunSpec& run : runs) settings.insert(setting(run));
  const int count = static_cast<int>(settings.size());
  for (int index = 0; index < count; ++index) {
    std::vector<std::string> few, many;
    for (const RunSpec& run : shard_runs(runs, config, profile, Shard{index, count})) few.push_back(run.id());
    for (const RunSpec& run : shard_runs(runs, config, profile, Shard{index, std::numeric_limits<int>::max()}))
      many.push_back(run.id());
    EXPECT_FALSE(few.empty()) << index;
    EXPECT_EQ(many, few) << index;
  }
  EXPECT_TRUE(shard_runs(runs, config, profile, Shard{count, std::numeric_limits<int>::max()}).empty());
  // Cost, not count: a 64K-token run predicts more than a 1K one.
  RunSpec small = runs.front(), large = runs.front();
  small.context = 1024;
  large.context = 65536;
  EXPECT_GT(predicted_run_seconds(config, large, profile), 10 * predicted_run_seconds(config, small, profile));
}

// Three shards of an experiment merged: the same runs and schema as one
// process running it all; inputs that do not belong together are refused.
TEST_F(HarnessTest, ShardsMergeIntoWhatOneProcessWrites) {
  const std::string yaml = "name: shards\noutput: " + output_ +
                           "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [ktransformers, writescope]\n"
                           "batch_sizes: [1]\ncontexts: [16, 24, 32]\nmax_sequence_tokens: 35\nbudgets: {vram: 12MiB, pinned: 8MiB, host: 24MiB}\n"
                           "steps: {warmup: 1, measured: 2}\nblock_tokens: 8\n";
  ExperimentConfig whole = ExperimentConfig::from_config(ConfigNode::parse(yaml, "shards.yaml"));
  std::ostringstream progress;
  run_experiment(whole, test::tiny_profile(), progress, false);
  std::vector<std::string> shards;
  for (int k = 0; k < 3; ++k) {
    ExperimentConfig share = whole;
    share.output = (dir_ / ("shard" + std::to_string(k) + ".h5")).string();
    RunOptions options;
    options.shard = Shard{k, 3};
    run_experiment(share, test::tiny_profile(), progress, false, options);
    shards.push_back(share.output);
    // Each file says how many runs it is to hold: its shard's.
    const ResultsReader shard_file(share.output);
    EXPECT_EQ(shard_file.int_attribute("/", "planned_runs"),
              static_cast<std::int64_t>(shard_file.list("/runs").size()));
    // A shard resumes as itself only.
    RunOptions other = options;
    other.shard = Shard{(k + 1) % 3, 3};
    EXPECT_THROW(run_experiment(share, test::tiny_profile(), progress, false, other), std::invalid_argument);
  }
  const std::string merged = (dir_ / "merged.h5").string();
  const auto lines = merge_results(merged, shards);
  EXPECT_EQ(lines.front(), "merged " + std::to_string(expand_runs(whole, test::tiny_profile()).size()) + " runs of " +
                               std::to_string(expand_runs(whole, test::tiny_profile()).size()) + " from 3 files into " +
                               merged);
  const ResultsReader one(output_), many(merged);
  EXPECT_EQ(many.list("/runs"), one.list("/runs"));
  for (const char* attribute : {"format", "experiment", "config_canonical", "git_revision", "machine"})
    EXPECT_EQ(many.string_attribute("/", attribute), one.string_attribute("/", attribute)) << attribute;
  EXPECT_FALSE(many.has_attribute("/", "shard"));
  // The merged file holds the whole experiment: resuming a shard into it says so, and the other way round.
  const auto resume_error = [&](const std::string& file, Shard shard) {
    ExperimentConfig into = whole;
    into.output = file;
    RunOptions options;
    options.shard = shard;
    try {
      run_experiment(into, test::tiny_profile(), progress, false, options);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("resumed");
  };
  EXPECT_NE(resume_error(merged, Shard{0, 3}).find("holds the runs of the whole experiment (no --shard), not of shard 0/3"),
            std::string::npos)
      << resume_error(merged, Shard{0, 3});
  EXPECT_NE(resume_error(shards[1], Shard{}).find("holds the runs of shard 1/3, not of the whole experiment"),
            std::string::npos)
      << resume_error(shards[1], Shard{});
  const auto all_runs = static_cast<std::int64_t>(expand_runs(whole, test::tiny_profile()).size());
  EXPECT_EQ(one.int_attribute("/", "planned_runs"), all_runs);
  EXPECT_EQ(many.int_attribute("/", "planned_runs"), all_runs);
  for (const std::string& run : one.list("/runs")) {
    const std::string g = "/runs/" + run;
    EXPECT_EQ(many.list(g), one.list(g)) << g;
    EXPECT_EQ(many.string_attribute(g, "status"), one.string_attribute(g, "status")) << g;
    EXPECT_EQ(run_damage(many, g), "") << g;
    if (one.string_attribute(g, "status") == "complete") {
      EXPECT_EQ(many.shape(g + "/alpha"), one.shape(g + "/alpha")) << g;
    }
  }
  auto merge_error = [&](const std::vector<std::string>& inputs) {
    std::filesystem::remove(dir_ / "refused.h5");
    try {
      merge_results((dir_ / "refused.h5").string(), inputs);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("merged");
  };
  EXPECT_NE(merge_error({shards[0], output_}).find("with different results"), std::string::npos);
  {  // A shard whose run has not ended is not merged, not even with --allow-missing.
    const ResultsStore running(shards[1]);
    EXPECT_NE(merge_error(shards).find("merge: " + shards[1] + " is being written (its lock is held: its run has "
                                       "not ended)"),
              std::string::npos)
        << merge_error(shards);
  }
  {  // A file of this format without the attributes that say what its runs are: named, not an HDF5 error.
    const std::string bare = (dir_ / "bare.h5").string();
    {
      ResultsStore store(bare);
      auto txn = store.begin();
      txn.root().set_attribute("format", "writescope-results-1");
      txn.commit();
    }
    EXPECT_NE(merge_error({shards[0], bare})
                  .find("merge: " + bare + " is not a writescope results file (no 'config' attribute)"),
              std::string::npos)
        << merge_error({shards[0], bare});
  }
  // A shard missing: refused (nothing written) unless asked to merge what there is.
  EXPECT_NE(merge_error({shards[0], shards[1]}).find("are in no input (a shard did not finish?)"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "refused.h5"));
  {  // Merged anyway, the file still plans every run: a report counts those missing.
    MergeOptions partial;
    partial.allow_missing = true;
    merge_results((dir_ / "partial.h5").string(), {shards[0], shards[1]}, partial);
    const ResultsReader reader((dir_ / "partial.h5").string());
    EXPECT_EQ(reader.int_attribute("/", "planned_runs"), all_runs);
    EXPECT_LT(static_cast<std::int64_t>(reader.list("/runs").size()), all_runs);
  }
  ExperimentConfig another = ExperimentConfig::from_config(ConfigNode::parse(yaml + "seed: 5\n", "other.yaml"));
  another.output = (dir_ / "another.h5").string();
  RunOptions first_share;
  first_share.shard = Shard{0, 3};
  run_experiment(another, test::tiny_profile(), progress, false, first_share);
  EXPECT_NE(merge_error({shards[1], another.output})
                .find("differ in their experiment config (seed: (absent) in " + shards[1] + ", 5 in " + another.output +
                      ")"),
            std::string::npos)
      << merge_error({shards[1], another.output});
  {  // Shard 1 measured by a process that took other host attention choices: another setup, without the flag.
    const std::string original = ResultsReader(shards[1]).string_attribute("/", "machine");
    auto record = [&](const std::string& machine) {
      ResultsStore store(shards[1]);
      auto txn = store.begin();
      txn.root().set_attribute("machine", machine);
      txn.commit();
    };
    std::string machine = original;
    const auto at = machine.find("host_attention_choices: ");
    ASSERT_NE(at, std::string::npos) << machine;
    machine.replace(at, machine.find('\n', at) - at, "host_attention_choices: 'tiny-mixtral: other choices'");
    record(machine);
    const std::string choices = (dir_ / "choices.h5").string();
    merge_results(choices, shards);
    EXPECT_EQ(ResultsReader(choices).list("/other_machines").size(), 1u);
    record(original);
  }
  {  // Shard 2 measured with another thread count.
    ResultsStore store(shards[2]);
    auto txn = store.begin();
    std::string machine = ResultsReader(shards[2]).string_attribute("/", "machine");
    const auto at = machine.find("host_threads: ");
    machine.replace(at, machine.find('\n', at) - at, "host_threads: 977");
    txn.root().set_attribute("machine", machine);
    txn.commit();
  }
  EXPECT_NE(merge_error(shards).find("different machine setups:\n  host_threads:"), std::string::npos);
  std::filesystem::remove(dir_ / "refused.h5");
  MergeOptions mixed;
  mixed.allow_different_machine = true;
  merge_results((dir_ / "refused.h5").string(), shards, mixed);
  EXPECT_EQ(ResultsReader((dir_ / "refused.h5").string()).list("/other_machines").size(), 1u);
  try {
    merge_results(merged, shards);
    ADD_FAILURE() << "merged into an existing file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(merged + " exists"), std::string::npos) << e.what();
  }
}

// Resume measures again a failed run and one the machine's free memory
// refused (it may fit another time); a run whose budgets cannot hold it stays.
TEST_F(HarnessTest, ResumeMeasuresFailedAndMemoryShortRunsAgain) {
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(small_yaml("retry"), "retry.yaml"));
  std::ostringstream progress;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), progress, false).complete, 2) << progress.str();
  const std::string run = ResultsReader(output_).list("/runs").front();
  const auto mark = [&](const std::string& status, const std::string& reason) {
    ResultsStore store(output_);
    auto txn = store.begin();
    ResultsGroup group = txn.root().open_group("runs").open_group(run);
    group.set_attribute("status", status);
    group.set_attribute("reason", reason);
    group.set_attribute("checksum", group.checksum());  // intact, not damaged: the status decides
    txn.commit();
  };
  for (const auto& [status, reason] : {std::pair<std::string, std::string>{"failed", "CUDA error: launch failure"},
                                       {"does_not_fit", "host memory: the model needs 9 GiB, 2 GiB are free"}}) {
    SCOPED_TRACE(status);
    mark(status, reason);
    const ExperimentSummary resumed = run_experiment(experiment, test::tiny_profile(), progress, false);
    EXPECT_EQ(resumed.complete, 1);
    EXPECT_EQ(resumed.skipped, 1);
    EXPECT_EQ(ResultsReader(output_).string_attribute("/runs/" + run, "status"), "complete");
  }
  mark("does_not_fit", "budgets.vram: the weights need 9 GiB");
  EXPECT_EQ(run_experiment(experiment, test::tiny_profile(), progress, false).skipped, 2);
  EXPECT_EQ(ResultsReader(output_).string_attribute("/runs/" + run, "status"), "does_not_fit");
}

// Fiddler's slots are placed from its profiling prompt before the measured
// steps: with room for every expert, no measured step copies one and every
// expert runs on the GPU side.
TEST_F(HarnessTest, FiddlersSlotsArePlacedBeforeTheMeasuredSteps) {
  const ExperimentConfig experiment = ExperimentConfig::from_config(
      ConfigNode::parse(small_yaml("fiddler", "[fiddler]") + "options: {expert_vram_share: 1}\n", "fiddler.yaml"));
  std::ostringstream progress;
  ASSERT_EQ(run_experiment(experiment, test::tiny_profile(), progress, false).complete, 1) << progress.str();
  const ResultsReader reader(output_);
  const std::string run = "/runs/" + reader.list("/runs").front();
  const auto sum = [&](const std::string& component) {
    const auto values = reader.read<double>(run + "/components/" + component);
    return std::accumulate(values.begin(), values.end(), 0.0);
  };
  EXPECT_EQ(sum("transfers"), 0.0);
  EXPECT_EQ(sum("experts_cpu"), 0.0);
  EXPECT_GT(sum("experts_gpu"), 0.0);
}

TEST_F(HarnessTest, FailedRunsAreRecordedAndTheExperimentGoesOn) {
  // The VRAM budget cannot hold the weights of either model: every run is "does not fit".
  std::string yaml = "name: tight\noutput: " + output_ +
                     "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [fiddler, hybrimoe]\n"
                     "batch_sizes: [1]\ncontexts: [16]\nmax_sequence_tokens: 26\nbudgets: {vram: 64KiB, pinned: 1MiB, host: 1MiB}\n";
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "tight.yaml"));
  std::ostringstream progress;
  const ExperimentSummary summary = run_experiment(experiment, test::tiny_profile(), progress, false);
  EXPECT_EQ(summary.did_not_fit, 2);
  const ResultsReader reader(output_);
  for (const std::string& name : reader.list("/runs"))
    EXPECT_EQ(reader.string_attribute("/runs/" + name, "reason").rfind("budgets.vram: ", 0), 0u)
        << reader.string_attribute("/runs/" + name, "reason");
}

// One memory contract: whatever each system pins (experts, KV band, staging)
// stays within the one pinned limit, all its host memory within the host
// budget, and the run records both; a run that cannot fit says so with bytes.
TEST_F(HarnessTest, EverySystemPinsWithinTheOneLimitAndRecordsIt) {
  const std::uint64_t experts = MoeModel::expert_store_bytes(model_preset("tiny-mixtral"));
  const std::uint64_t pinned = 2 * experts, host = 4 * experts;
  const std::string yaml =
      "name: contract\noutput: " + output_ +
      "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\n"
      "systems: [gpu-only, ktransformers, fiddler, hybrimoe, moe-lightning, writescope]\n"
      "batch_sizes: [2]\ncontexts: [40, 400]\nmax_sequence_tokens: 403\nbudgets: {vram: 3MiB, pinned: " +
      std::to_string(pinned) + "B, host: " + std::to_string(host) +
      "B}\nsteps: {warmup: 1, measured: 2, profile_tokens: 16}\nblock_tokens: 8\n";
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "contract.yaml"));
  std::ostringstream progress;
  const ExperimentSummary summary = run_experiment(experiment, test::tiny_profile(), progress, false);
  EXPECT_EQ(summary.failed, 0) << progress.str();
  const ResultsReader reader(output_);
  std::set<std::string> complete_systems, pinned_experts;
  for (const std::string& name : reader.list("/runs")) {
    const std::string g = "/runs/" + name;
    EXPECT_EQ(reader.int_attribute(g, "pinned_limit_bytes"), static_cast<std::int64_t>(pinned)) << g;
    EXPECT_EQ(reader.int_attribute(g, "host_budget_bytes"), static_cast<std::int64_t>(host)) << g;
    if (reader.string_attribute(g, "status") != "complete") {
      EXPECT_EQ(reader.string_attribute(g, "status"), "does_not_fit") << g;
      EXPECT_NE(reader.string_attribute(g, "reason").find("iB"), std::string::npos) << g;  // names the bytes
      continue;
    }
    const std::string system = reader.string_attribute(g, "system");
    complete_systems.insert(system);
    const std::int64_t pinned_bytes = reader.int_attribute(g, "pinned_bytes");
    EXPECT_LE(pinned_bytes, static_cast<std::int64_t>(pinned)) << g;
    EXPECT_LE(reader.int_attribute(g, "host_bytes"), static_cast<std::int64_t>(host)) << g;
    EXPECT_GE(reader.int_attribute(g, "host_bytes"), static_cast<std::int64_t>(experts)) << g;
    if (reader.int_attribute(g, "experts_pinned")) {
      pinned_experts.insert(system);
      EXPECT_GE(pinned_bytes, static_cast<std::int64_t>(experts)) << g;
    }
  }
  // Every system runs in 3 MiB of VRAM (GPU-only at the short context only);
  // the CPU-expert policy never pins its experts, the paging one does.
  EXPECT_EQ(complete_systems, (std::set<std::string>{"gpu-only", "ktransformers", "fiddler", "hybrimoe",
                                                     "moe-lightning", "writescope"}));
  EXPECT_EQ(pinned_experts.count("ktransformers"), 0u);
  EXPECT_EQ(pinned_experts.count("moe-lightning"), 1u);
}

// A run that needs more pinned memory than the limit is "does not fit" with the bytes.
TEST_F(HarnessTest, KVBeyondThePinnedLimitDoesNotFit) {
  const std::uint64_t experts = MoeModel::expert_store_bytes(model_preset("tiny-mixtral"));
  const std::string yaml = "name: small\noutput: " + output_ +
                           "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [ktransformers]\n"
                           "batch_sizes: [4]\ncontexts: [4000]\nmax_sequence_tokens: 4010\nbudgets: {vram: 6MiB, pinned: 256KiB, host: " +
                           std::to_string(experts + (8 << 20)) + "B}\nblock_tokens: 8\n";
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "small.yaml"));
  std::ostringstream progress;
  EXPECT_EQ(run_experiment(experiment, test::tiny_profile(), progress, false).did_not_fit, 1);
  const ResultsReader reader(output_);
  const std::string reason = reader.string_attribute("/runs/" + reader.list("/runs").front(), "reason");
  EXPECT_NE(reason.find("of pinned memory but the contract leaves"), std::string::npos) << reason;
  EXPECT_NE(reason.find("pinned limit 256KiB"), std::string::npos) << reason;
}

// Where host memory cannot give both of WriteScope's pools the whole spill,
// its host pool keeps what its write policy fixes there for the run's prompts
// and the band the rest (the band once took it all, leaving no pool).
TEST_F(HarnessTest, WriteScopesHostPoolKeepsWhatItsWritePolicyFixesThereWhenHostMemoryIsShort) {
  MachineProfile gpu = test::tiny_profile();
  gpu.has_gpu = true;  // the CPU then keeps only a share of the spill
  gpu.gpu_launch_latency_s = gpu.link_latency_s = gpu.cpu_launch_latency_s = 0;
  auto experiment = [&](std::uint64_t host) {
    const std::string yaml = "name: pools\noutput: " + output_ +
                             "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [writescope]\n"
                             "batch_sizes: [2]\ncontexts: [4000]\nmax_sequence_tokens: 4003\nbudgets: {vram: 3MiB, pinned: " +
                             std::to_string(host) + "B, host: " + std::to_string(host) +
                             "B}\nsteps: {warmup: 1, measured: 2}\nblock_tokens: 8\n";
    return ExperimentConfig::from_config(ConfigNode::parse(yaml, "pools.yaml"));
  };
  auto options_with = [&](std::uint64_t host) {
    const ExperimentConfig config = experiment(host);
    return impl::prepare_run(config, expand_runs(config, gpu).front(), gpu).options;
  };
  const ModelOptions roomy = options_with(64 << 20);
  const std::uint64_t planned = roomy.pinned_kv_budget;
  ASSERT_GT(planned, 0u) << "the KV must spill beyond VRAM";
  EXPECT_EQ(roomy.host_kv_budget, planned);  // room for the whole spill in each pool

  const ModelConfig model = model_preset("tiny-mixtral");
  const std::uint64_t short_host =
      MoeModel::expert_store_bytes(model) + MoeModel::pinned_staging_bytes(model, roomy) + planned;
  const ModelOptions short_of_host = options_with(short_host);
  EXPECT_GT(short_of_host.host_kv_budget, 0u);
  EXPECT_LT(short_of_host.host_kv_budget, planned);
  EXPECT_EQ(short_of_host.pinned_kv_budget + short_of_host.host_kv_budget, planned);

  // The run fills its host pool exactly: each step's CPU reads all of it.
  std::ostringstream progress;
  ASSERT_EQ(run_experiment(experiment(short_host), gpu, progress, false).complete, 1) << progress.str();
  const ResultsReader reader(output_);
  const auto served = reader.read<double>("/runs/" + reader.list("/runs").front() + "/region_bytes/cpu_resident");
  ASSERT_FALSE(served.empty());
  for (double bytes : served) EXPECT_EQ(bytes, static_cast<double>(short_of_host.host_kv_budget));

  // A band that cannot take the rest does not fit, before anything is allocated, whatever the host pool could hold.
  const std::uint64_t wish = short_of_host.host_kv_budget;
  const ExperimentConfig short_band = experiment(64 << 20);
  ExperimentConfig band_config = short_band;
  band_config.pinned_limit = MoeModel::pinned_staging_bytes(model, roomy) + (planned - wish) / 2;
  try {
    impl::prepare_run(band_config, expand_runs(band_config, gpu).front(), gpu);
    ADD_FAILURE() << "a band short of the spill was accepted";
  } catch (const ModelBudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("of pinned and host memory but the contract leaves " +
                                         format_byte_size((planned - wish) / 2 + wish) + " (a band of"),
              std::string::npos)
        << e.what();
  }
}

// No oracle: the policies plan each sequence for the configured longest
// sequence, so a longer measurement (a later final length) changes nothing
// they decide; WriteScope's own expert policy comes from its roofline before
// the run, whichever baselines run beside it.
TEST_F(HarnessTest, PoliciesPlanForTheConfiguredLengthNotTheRunsFinal) {
  // A machine with a GPU (the host build's GPU space), whose roofline splits
  // spilled KV between the devices: there the planned length moves blocks
  // (without one every spilled byte goes to the CPU, whatever the plan).
  MachineProfile profile = test::tiny_profile();
  profile.has_gpu = true;
  profile.gpu_launch_latency_s = profile.link_latency_s = profile.cpu_launch_latency_s = 0;
  auto regions_of = [&](int measured, const std::string& name, int planned) {
    const std::string output = (dir_ / (name + ".h5")).string();
    const std::string yaml = "name: plan\noutput: " + output +
                             "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [writescope]\n"
                             "batch_sizes: [2]\ncontexts: [200]\nmax_sequence_tokens: " + std::to_string(planned) +
                             "\nbudgets: {vram: 512KiB, pinned: 8MiB, host: 64MiB}\nsteps: {warmup: 1, measured: " +
                             std::to_string(measured) + "}\nblock_tokens: 8\n";
    std::ostringstream progress;
    run_experiment(ExperimentConfig::from_config(ConfigNode::parse(yaml, "plan.yaml")), profile, progress, false);
    const ResultsReader reader(output);
    const std::string g = "/runs/" + reader.list("/runs").front();
    EXPECT_EQ(reader.string_attribute(g, "status"), "complete") << progress.str();
    EXPECT_EQ(reader.int_attribute(g, "planned_sequence_tokens"), planned);
    // VRAM's bytes and the spilled ones: which device takes a block spilled
    // in the warm-up step follows its measured times (the scheduler's feedback).
    const auto first_step_bytes = [&](const char* region) {
      return reader.read<double>(g + "/region_bytes/" + region).front();
    };
    std::vector<double> first_step{first_step_bytes("gpu_resident"), first_step_bytes("gpu_streamed") +
                                                                        first_step_bytes("cpu_resident") +
                                                                        first_step_bytes("cpu_streamed")};
    first_step.push_back(static_cast<double>(reader.int_attribute(g, "pinned_bytes")));
    first_step.push_back(static_cast<double>(reader.int_attribute(g, "host_bytes")));
    return first_step;
  };
  const std::vector<double> planned_far = regions_of(1, "short", 400);
  EXPECT_EQ(planned_far, regions_of(199, "long", 400));
  // The control: the plan itself does move them, so the equality above could fail.
  EXPECT_NE(planned_far, regions_of(1, "planned_near", 202));
}

TEST_F(HarnessTest, WriteScopesExpertPolicyIsFixedBeforeTheRun) {
  // Every baseline expert policy among the systems gets a WriteScope run with
  // the same experts; WriteScope's own choice stands for it against the systems.
  const ExperimentConfig experiment = config();
  const MachineProfile profile = test::tiny_profile();
  for (const RunSpec& run : expand_runs(experiment, profile)) {
    if (run.system != "writescope") {
      EXPECT_TRUE(run.expert_policy.empty());
      EXPECT_TRUE(run.system_comparison);
      continue;
    }
    SystemContext context{run.model->config, profile, run.batch, run.context, experiment.system_options};
    context.vram_budget = run.vram_budget;
    context.block_tokens = experiment.block_tokens;
    const std::string choice = writescope_expert_choice(context);
    EXPECT_EQ(run.system_comparison, run.expert_policy == choice) << run.id();
    EXPECT_TRUE(run.expert_policy == "ktransformers" || run.expert_policy == choice) << run.id();
  }
  // The choice does not depend on which baselines ran (or how fast): a
  // WriteScope-only experiment and one with a baseline record the same one.
  auto chosen = [&](const std::string& systems, const std::string& name) {
    const std::string output = (dir_ / (name + ".h5")).string();
    const std::string yaml = "name: choice\noutput: " + output +
                             "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: " + systems +
                             "\nbatch_sizes: [2]\ncontexts: [40]\nmax_sequence_tokens: 42\nbudgets: {vram: 4MiB, pinned: 16MiB, host: 64MiB}\n"
                             "steps: {warmup: 1, measured: 1}\nblock_tokens: 8\n";
    std::ostringstream progress;
    run_experiment(ExperimentConfig::from_config(ConfigNode::parse(yaml, "choice.yaml")), profile, progress, false);
    const ResultsReader reader(output);
    std::string policy;
    for (const std::string& run : reader.list("/runs"))
      if (reader.string_attribute("/runs/" + run, "system") == "writescope" &&
          reader.int_attribute("/runs/" + run, "system_comparison") == 1)
        policy = reader.string_attribute("/runs/" + run, "expert_policy");
    return policy;
  };
  const std::string alone = chosen("[writescope]", "alone");
  EXPECT_FALSE(alone.empty());
  EXPECT_EQ(chosen("[hybrimoe, fiddler, ktransformers, writescope]", "beside"), alone);
}

// Where the pinned limit cannot hold the expert store beside the KV band, the
// systems copy experts at the pageable rate, and every choice made before the
// run says so: WriteScope's own expert policy is picked at that rate, and
// MoE-Lightning records the micro-batches it runs with.
TEST_F(HarnessTest, ExpertCopiesArePricedAtTheRateTheContractLeavesThem) {
  // An H200-like machine, where these settings flip both choices.
  MachineProfile gpu = test::tiny_profile();
  gpu.has_gpu = true;
  gpu.hbm_gbps = 4200;
  gpu.pinned_h2d_gbps = 55;
  gpu.pageable_h2d_gbps = 7.9;
  gpu.gpu_launch_latency_s = gpu.link_latency_s = 1e-4;
  gpu.cpu_launch_latency_s = 2e-4;
  gpu.cpu_threads = 16;
  gpu.cpu_dram_read_gbps = 87;
  gpu.cpu_expert_gbps = 60;
  gpu.cpu_expert_gflops = 1700;
  for (auto& [shape, rates] : gpu.cpu_attention_gbps) rates = {{16, 40}};
  auto experiment = [&](std::uint64_t pinned) {
    const std::string yaml = "name: rates\noutput: " + output_ +
                             "\nprofile: test\nmodels: [{preset: mixtral-8x7b, layers: 8}]\n"
                             "systems: [writescope, moe-lightning]\nbatch_sizes: [4]\ncontexts: [131072]\n"
                             "max_sequence_tokens: 163840\nbudgets: {vram: 24GiB, pinned: " +
                             std::to_string(pinned) + "B, host: 96GiB}\nblock_tokens: 256\n";
    return ExperimentConfig::from_config(ConfigNode::parse(yaml, "rates.yaml"));
  };
  auto run_of = [&](const ExperimentConfig& config, const std::string& system) {
    for (const RunSpec& run : expand_runs(config, gpu))
      if (run.system == system && run.system_comparison) return run;
    throw std::logic_error("no run of " + system);
  };
  auto context_of = [&](const ExperimentConfig& config, const RunSpec& run) {
    SystemContext context{run.model->config, gpu, run.batch, run.context, config.system_options};
    context.vram_budget = run.vram_budget;
    context.block_tokens = config.block_tokens;
    return context;
  };
  // What `system` pins beside the experts (its KV band, staging), and a
  // limit one byte short of the experts beside that.
  const ExperimentConfig roomy = experiment(std::uint64_t{90} << 30);
  const auto short_limit_for = [&](const std::string& system) {
    const RunSpec run = run_of(roomy, system);
    const ModelOptions options = impl::prepare_run(roomy, run, gpu).options;
    EXPECT_TRUE(options.pin_experts) << system;
    return experiment(options.pinned_kv_budget + MoeModel::pinned_staging_bytes(run.model->config, options) +
                      MoeModel::expert_store_bytes(run.model->config) - 1);
  };
  const RunSpec roomy_run = run_of(roomy, "writescope");
  const ExperimentConfig short_limit = short_limit_for("writescope");

  SystemContext context = context_of(short_limit, run_of(short_limit, "writescope"));
  const std::string pinned_choice = writescope_expert_choice(context);
  context.experts_pinned = false;
  const std::string pageable_choice = writescope_expert_choice(context);
  ASSERT_NE(pinned_choice, pageable_choice) << "the rates must change the choice for this test";
  EXPECT_EQ(roomy_run.expert_policy, pinned_choice);
  EXPECT_EQ(run_of(short_limit, "writescope").expert_policy, pageable_choice);

  const ExperimentConfig lightning_limit = short_limit_for("moe-lightning");
  const RunSpec lightning = run_of(lightning_limit, "moe-lightning");
  SystemContext lightning_context = context_of(lightning_limit, lightning);
  const int pinned_micro_batches = make_system("moe-lightning", lightning_context).micro_batches;
  lightning_context.experts_pinned = false;
  const int pageable_micro_batches = make_system("moe-lightning", lightning_context).micro_batches;
  ASSERT_NE(pinned_micro_batches, pageable_micro_batches) << "the rates must change the count for this test";
  const impl::RunSetup setup = impl::prepare_run(lightning_limit, lightning, gpu);
  EXPECT_FALSE(setup.options.pin_experts);
  EXPECT_EQ(setup.options.micro_batches, pageable_micro_batches);
}

// A run's forward passes carry a prompt chunk's rows where prompts go
// through prefill, and its KV streams in chunks of the profile's size, at
// most one layer of the batch: the systems are built with the same (their
// VRAM plans price that workspace).
TEST_F(HarnessTest, RunsCarryPrefillRowsAndStreamChunksOfTheProfilesSize) {
  MachineProfile profile = test::tiny_profile();
  const ExperimentConfig prefill = config("context_fill: prefill\n");
  const RunSpec run = expand_runs(prefill, profile).front();
  const std::uint64_t block_bytes =
      static_cast<std::uint64_t>(run.model->config.attention().block_geometry(8).block_elements()) * sizeof(bf16);
  profile.link_chunk_bytes = 3 * block_bytes - 1;
  impl::RunSetup setup = impl::prepare_run(prefill, run, profile);
  EXPECT_EQ(setup.options.max_rows, 256);
  EXPECT_EQ(setup.context.max_rows, 256);
  EXPECT_EQ(setup.options.stream_chunk_blocks, 3);
  EXPECT_EQ(setup.context.stream_chunk_blocks, 3);
  profile.link_chunk_bytes = std::uint64_t{1} << 40;
  setup = impl::prepare_run(config(), expand_runs(config(), profile).front(), profile);
  EXPECT_EQ(setup.options.max_rows, 2);  // the batch
  EXPECT_EQ(setup.options.stream_chunk_blocks, 2 * ((44 + 7) / 8));  // one layer of the batch at max_sequence_tokens
}

// The processes that time CPU attention at other thread counts take this
// process' choices for the shape and block order, which the profile records,
// not their own.
TEST(CalibrationCommand, ChildProcessesTakeTheParentsChoices) {
  for (const char* preset : {"qwen3-30b-a3b", "deepseek-v2-lite"})
    for (const BlockOrder order : {BlockOrder::head_major, BlockOrder::token_major}) {
      const AttentionShape shape = model_preset(preset).attention();
      const bool head_major = order == BlockOrder::head_major;
      const std::string command = cpu_attention_child_command("/opt/ws/writescope", shape, order, 1, 4096);
      const auto has = [&](const std::string& part) { return command.find(part) != std::string::npos; };
      EXPECT_EQ(command.rfind("KOKKOS_NUM_THREADS=1 OMP_NUM_THREADS=1 ", 0), 0u) << command;
      EXPECT_TRUE(has(std::string(" WRITESCOPE_CPU_PATH=") + cpu_path_name(active_decode_cpu_path(shape, order)) + " "))
          << command;
      EXPECT_TRUE(has(std::string(" WRITESCOPE_NEXT_PASS_PREFETCH=") +
                      prefetch_level_name(active_next_pass_prefetch(shape)) + " "))
          << command;
      const int head_major_pass = active_head_major_pass(shape), token_major_pass = active_token_major_pass(shape);
      EXPECT_EQ(has(" WRITESCOPE_HEAD_MAJOR_PASS=" + std::to_string(head_major_pass) + " "),
                head_major && head_major_pass > 0)
          << command;
      EXPECT_EQ(has(" WRITESCOPE_TOKEN_MAJOR_PASS=" + std::to_string(token_major_pass) + " "),
                !head_major && token_major_pass > 0)
          << command;
      EXPECT_TRUE(has(" '/opt/ws/writescope' calibrate-attention --shape " + shape.name + " --order " +
                      (head_major ? "head-major" : "token-major") + " --tokens 4096 --thread-count 1"))
          << command;
    }
}

// Calibrate measures the kernels the systems run: the GPU decode kernel over
// VRAM-resident KV (the host stands in for it here) and the bf16 expert kernel.
TEST(Calibration, MeasuresTheKernelsTheSystemsRun) {
  EXPECT_GT(measure_gpu_attention_gbps(model_preset("tiny-qwen3-moe").attention(), 4096), 0);
  const ExpertKernelRates expert = measure_cpu_expert_rates();
  EXPECT_GT(expert.gbps, 0);
  EXPECT_GT(expert.gflops, 0);
}

// The expert linear layer's roof is the product it runs: AMX tiles on
// amx_bf16, the 16-lane fp32 FMA on both other AVX-512 paths.
TEST(Calibration, TheLinearLayersRoofIsTheProductItRuns) {
  EXPECT_EQ(linear_product_path(CpuPath::amx_bf16), CpuPath::amx_bf16);
  EXPECT_EQ(linear_product_path(CpuPath::avx512_bf16), CpuPath::avx512_fma);
  EXPECT_EQ(linear_product_path(CpuPath::avx512_fma), CpuPath::avx512_fma);
  EXPECT_EQ(linear_product_path(CpuPath::avx2), CpuPath::avx2);
  EXPECT_EQ(linear_product_path(CpuPath::scalar), CpuPath::scalar);
}

// No tokens would leave no copy to rotate (and a division by zero in the step).
TEST(Calibration, RotatedCachesNeedTokens) {
  const AttentionShape shape = model_preset("tiny-qwen3-moe").attention();
  EXPECT_THROW(rotated_caches(shape, Region::cpu_resident, 0), std::invalid_argument);
  EXPECT_GE(rotated_caches(shape, Region::cpu_resident, 64).copies(), 1);
}

// Sampled rates add up the samples' work and time: one second of 10 units and
// four of 10 make 4 per second (the mean of the two rates would be 6.25).
TEST(Calibration, SampledRatesAreTheSamplesWorkOverTheirTime) {
  RateTotals totals;
  EXPECT_EQ(totals.per_second(), 0);
  totals.add(10, 1);
  totals.add(10, 4);
  EXPECT_DOUBLE_EQ(totals.per_second(), 4);
}

// Takes `samples` samples of a fresh sampler of `path`'s products: it counts
// them, reports no product rate before the first, and a positive one after
// that is not above the best-of-five rate of the same chains by more than the
// drift of a shared machine (its samples may be far below it: a vCPU
// preempted for a few of its milliseconds); the same for its L2 reads.
template <class Sampler>
void expect_product_samples(Sampler& sampler, CpuPath path, int samples) {
  EXPECT_EQ(sampler.samples(), 0);
  EXPECT_EQ(sampler.product_gmacs(), 0);
  EXPECT_EQ(sampler.l2_read_gbps(), 0);
  EXPECT_EQ(sampler.fastest_l2_read_gbps(), 0);
  for (int s = 0; s < samples; ++s) sampler.sample();
  EXPECT_EQ(sampler.samples(), samples);
  EXPECT_GT(sampler.product_gmacs(), 0);
  EXPECT_LT(sampler.product_gmacs(), 4 * measure_host_product_gmacs(path));
  // The L2 reads: over all samples no faster than the fastest sample, and
  // faster than DRAM (a slice that left the L2, or a rate counted over the
  // wrong bytes, would not be).
  EXPECT_GT(sampler.l2_read_gbps(), 0);
  EXPECT_LE(sampler.l2_read_gbps(), sampler.fastest_l2_read_gbps());
  // Tests of another process on the same cores (ctest -j) can slow every
  // sample of a round; more rounds find a quiet one, where a slice that left
  // the L2 is never faster than DRAM.
  const double dram_read_gbps = measure_host_dram_read_gbps(std::int64_t{256} << 20);
  for (int round = 0; round < 4 && sampler.fastest_l2_read_gbps() <= dram_read_gbps; ++round)
    for (int s = 0; s < samples; ++s) sampler.sample();
  EXPECT_GT(sampler.fastest_l2_read_gbps(), dram_read_gbps);
}

// The sampler of both rates: its DRAM read rate too, none before the first
// sample and positive after.
TEST(Calibration, ASamplerReportsWhatItSampled) {
  const CpuPath path = active_cpu_path();
  HostRateSampler sampler(path, std::int64_t{4} << 20, std::int64_t{1} << 20);
  EXPECT_EQ(sampler.dram_read_gbps(), 0);
  expect_product_samples(sampler, path, 20);
  EXPECT_GT(sampler.dram_read_gbps(), 0);
}

// The products-only sampler (kernels whose data must stay cached).
TEST(Calibration, AProductSamplerReportsWhatItSampled) {
  const CpuPath path = active_cpu_path();
  HostProductSampler sampler(path);
  expect_product_samples(sampler, path, 5);
}

TEST(Calibration, ASamplerOfBadSizesNamesTheSizeAndTheReason) {
  auto error_of = [](std::int64_t buffer, std::int64_t slice) -> std::string {
    try {
      HostRateSampler(active_cpu_path(), buffer, slice);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of(std::int64_t{1} << 20, 12).find("slice_bytes (12) must be a positive multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of(std::int64_t{1} << 20, std::int64_t{1} << 20).find("buffer_bytes (1048576) must hold at least two slices"),
            std::string::npos);
}

// The streaming chunk calibrate writes: the smallest copy size at 90% of the link.
TEST(StreamingChunk, SmallestSizeThatReachesTheFraction) {
  const std::vector<std::uint64_t> sizes{1 << 20, 2 << 20, 4 << 20, 8 << 20};
  EXPECT_EQ(smallest_size_reaching(sizes, {20, 40, 49.6, 54}, 55, 0.9), std::uint64_t{4} << 20);
  EXPECT_EQ(smallest_size_reaching(sizes, {50, 52, 53, 54}, 55, 0.9), std::uint64_t{1} << 20);
  EXPECT_EQ(smallest_size_reaching(sizes, {10, 20, 30, 40}, 55, 0.9), std::uint64_t{8} << 20);  // none: the largest
  EXPECT_THROW(smallest_size_reaching(sizes, {1, 2}, 55, 0.9), std::invalid_argument);
}

}  // namespace
}  // namespace writescope
