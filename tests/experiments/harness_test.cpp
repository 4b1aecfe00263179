#include "experiments/harness.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "experiments/calibration.hpp"
#include "framework/results_store.hpp"
#include "test_profile.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

class HarnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("writescope_harness_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    output_ = (dir_ / "results.h5").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// A tiny experiment; `extra` is appended to the YAML.
  ExperimentConfig config(const std::string& extra = "") const {
    const std::string yaml = "name: test\noutput: " + output_ +
                             "\nprofile: test\n"
                             "models:\n  - {preset: tiny-mixtral}\n  - {preset: tiny-deepseek-v2, layers: 2}\n"
                             "systems: [ktransformers, writescope, gpu-only]\n"
                             "batch_sizes: [2]\ncontexts: [24, 40]\n"
                             "budgets: {vram: 12MiB, pinned: 8MiB, host: 8MiB}\n"
                             "steps: {warmup: 1, measured: 3}\nblock_tokens: 8\n" +
                             extra;
    return ExperimentConfig::from_config(ConfigNode::parse(yaml, "test.yaml"));
  }

  static std::string error_of(const std::string& yaml) {
    try {
      ExperimentConfig::from_config(ConfigNode::parse(yaml, "bad.yaml"));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
  std::string output_;
};

TEST_F(HarnessTest, BadConfigsNameTheFieldAndTheReason) {
  const std::string base =
      "name: x\noutput: x.h5\nprofile: p\nmodels: [{preset: tiny-mixtral}]\nbatch_sizes: [1]\ncontexts: [8]\n"
      "budgets: {vram: 1GiB, pinned: 1GiB, host: 1GiB}\n";
  EXPECT_NE(error_of(base + "systems: [vllm]\n").find("field 'systems': unknown system 'vllm'"), std::string::npos)
      << error_of(base + "systems: [vllm]\n");
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nrepetition: 2\n").find("did you mean 'repetitions'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "systems: [gpu-only, gpu-only]\n").find("listed twice"), std::string::npos);
  std::string bad_batch = base;
  bad_batch.replace(bad_batch.find("batch_sizes: [1]"), 16, "batch_sizes: [0]");
  EXPECT_NE(error_of(bad_batch + "systems: [gpu-only]\n").find("batch_sizes"), std::string::npos);
  std::string bad_model = base;
  bad_model.replace(bad_model.find("tiny-mixtral"), 12, "llama");
  EXPECT_NE(error_of(bad_model + "systems: [gpu-only]\n").find("unknown model 'llama'"), std::string::npos)
      << error_of(bad_model + "systems: [gpu-only]\n");
  EXPECT_NE(error_of(base + "systems: [gpu-only]\nsteps: {measured: 0}\n").find("measured"), std::string::npos);
  EXPECT_NE(error_of(base + "systems: [gpu-only]\ncontext_fill: random\n").find("context_fill"), std::string::npos);
  EXPECT_NE(error_of(base + "systems: [fiddler]\nsteps: {warmup: 0}\n").find("warmup must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of(base + "systems: [writescope]\noptions: {writescope_experts: vllm}\n")
                .find("must be one of auto, fiddler, ktransformers, hybrimoe, got 'vllm'"),
            std::string::npos);
}

TEST_F(HarnessTest, WritesTheSchemaAndResumes) {
  const ExperimentConfig experiment = config();
  const auto runs = expand_runs(experiment);
  ASSERT_EQ(runs.size(), 2u * 2u * 3u);
  EXPECT_EQ(runs[1].system, "gpu-only");
  EXPECT_EQ(runs[2].system, "writescope");  // after the baselines of its setting
  std::ostringstream progress;
  const ExperimentSummary first = run_experiment(experiment, test::tiny_profile(), progress, false);
  EXPECT_EQ(first.failed, 0) << progress.str();
  EXPECT_GT(first.complete, 0);
  EXPECT_NE(progress.str().find("run 1/12: tiny-mixtral ktransformers b2 24"), std::string::npos) << progress.str();

  const ResultsReader reader(output_);
  EXPECT_EQ(reader.string_attribute("/", "format"), "writescope-results-1");
  EXPECT_EQ(reader.string_attribute("/", "experiment"), "test");
  EXPECT_EQ(reader.string_attribute("/profile", "name"), "test");
  const auto names = reader.list("/runs");
  ASSERT_EQ(names.size(), runs.size());
  int complete = 0;
  for (const std::string& name : names) {
    const std::string g = "/runs/" + name;
    const std::string status = reader.string_attribute(g, "status");
    if (status != "complete") {
      EXPECT_EQ(status, "does_not_fit") << g;
      EXPECT_EQ(reader.string_attribute(g, "system"), "gpu-only") << g;
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

  // Another machine profile does not mix into the file.
  MachineProfile other = test::tiny_profile();
  other.cpu_gemv_gbps *= 2;
  try {
    run_experiment(changed, other, third_progress, false);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds runs of another machine profile"), std::string::npos) << e.what();
  }
}

TEST_F(HarnessTest, FailedRunsAreRecordedAndTheExperimentGoesOn) {
  // The VRAM budget cannot hold the weights of either model: every run is "does not fit".
  std::string yaml = "name: tight\noutput: " + output_ +
                     "\nprofile: test\nmodels: [{preset: tiny-mixtral}]\nsystems: [fiddler, hybrimoe]\n"
                     "batch_sizes: [1]\ncontexts: [16]\nbudgets: {vram: 64KiB, pinned: 1MiB, host: 1MiB}\n";
  const ExperimentConfig experiment = ExperimentConfig::from_config(ConfigNode::parse(yaml, "tight.yaml"));
  std::ostringstream progress;
  const ExperimentSummary summary = run_experiment(experiment, test::tiny_profile(), progress, false);
  EXPECT_EQ(summary.did_not_fit, 2);
  const ResultsReader reader(output_);
  for (const std::string& name : reader.list("/runs"))
    EXPECT_NE(reader.string_attribute("/runs/" + name, "reason").find("vram_budget"), std::string::npos);
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
