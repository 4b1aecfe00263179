#include "moe/weights.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>

#include "framework/machine.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

TEST(Weights, SpecsCoverEveryParameterOfEveryArchitecture) {
  for (const auto& name : model_preset_names()) {
    const ModelConfig config = model_preset(name);
    const auto specs = weight_specs(config);
    std::int64_t total = 0;
    for (const auto& spec : specs) total += spec.elements();
    EXPECT_EQ(total, config.parameters()) << name;
  }
  const auto mixtral = weight_specs(model_preset("tiny-mixtral"));
  EXPECT_TRUE(std::any_of(mixtral.begin(), mixtral.end(), [](const TensorSpec& s) {
    return s.name == "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  }));
  const auto deepseek = weight_specs(model_preset("tiny-deepseek-v2"));
  EXPECT_TRUE(std::any_of(deepseek.begin(), deepseek.end(),
                          [](const TensorSpec& s) { return s.name == "model.layers.0.mlp.down_proj.weight"; }));
  EXPECT_TRUE(std::any_of(deepseek.begin(), deepseek.end(), [](const TensorSpec& s) {
    return s.name == "model.layers.2.mlp.shared_experts.up_proj.weight";
  }));
}

TEST(Weights, SyntheticValuesAreDeterministicAndScaled) {
  const TensorSpec spec{"model.layers.0.self_attn.q_proj.weight", {256, 1024}, false};
  const auto a = synthetic_tensor<float>(spec, 7);
  EXPECT_EQ(a, synthetic_tensor<float>(spec, 7));
  EXPECT_NE(a, synthetic_tensor<float>(spec, 8));
  EXPECT_NE(a, synthetic_tensor<float>(TensorSpec{"other", {256, 1024}, false}, 7));
  const double mean = std::accumulate(a.begin(), a.end(), 0.0) / a.size();
  double variance = 0;
  for (float x : a) variance += (x - mean) * (x - mean);
  variance /= a.size();
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(variance), 1.0 / std::sqrt(1024.0), 0.02 / std::sqrt(1024.0));
  const auto norm = synthetic_tensor<bf16>(TensorSpec{"n", {8}, true}, 7);
  for (bf16 x : norm) EXPECT_EQ(to_float(x), 1.0f);
}

TEST(Weights, SyntheticCheckpointsLoadBackForEachArchitecture) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_synthetic_" + std::to_string(::getpid()));
  for (const char* name : {"tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"}) {
    fs::remove_all(dir);
    const ModelConfig config = model_preset(name);
    write_synthetic_checkpoint(dir.string(), config, 3, TensorDType::bf16);
    const ModelConfig read = load_hf_config((dir / "config.json").string());
    EXPECT_EQ(read.parameters(), config.parameters()) << name;
    EXPECT_EQ(read.name, config.name);
    const SafetensorsCheckpoint checkpoint(dir.string());
    EXPECT_TRUE(unused_tensors(checkpoint, read).empty()) << name;
    // The file says what rebuilds it: the writer, the model, the seed and the build.
    EXPECT_EQ(checkpoint.metadata().at((dir / "model.safetensors").string()),
              (std::map<std::string, std::string>{{"git_revision", git_revision()},
                                                  {"model", config.name},
                                                  {"seed", "3"},
                                                  {"writer", "writescope make-checkpoint"}}))
        << name;
    // A config that leaves weights out (one layer fewer) names them.
    ModelConfig fewer_layers = read;
    fewer_layers.layers -= 1;
    const std::vector<std::string> unused = unused_tensors(checkpoint, fewer_layers);
    const std::string last_layer = "model.layers." + std::to_string(fewer_layers.layers) + ".";
    EXPECT_FALSE(unused.empty()) << name;
    for (const std::string& tensor : unused) EXPECT_EQ(tensor.rfind(last_layer, 0), 0u) << name << ": " << tensor;
    const auto weights = load_weights<bf16>(checkpoint, read);
    const auto specs = weight_specs(config);
    ASSERT_EQ(weights.size(), specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto expected = synthetic_tensor<bf16>(specs[i], 3);
      ASSERT_EQ(weights[i].size(), expected.size()) << specs[i].name;
      for (std::size_t k = 0; k < expected.size(); ++k)
        ASSERT_EQ(weights[i][k].bits, expected[k].bits) << specs[i].name << " element " << k;
    }
  }
  fs::remove_all(dir);
}

/// What check_checkpoint_sizes says of `config` against `checkpoint`: empty where it agrees.
std::string size_disagreement(const SafetensorsCheckpoint& checkpoint, const ModelConfig& config) {
  try {
    check_checkpoint_sizes(checkpoint, config);
    return {};
  } catch (const CheckpointError& e) {
    return e.what();
  }
}

// A config whose sizes its checkpoint's weights do not have is named by the
// first tensor that shows it, at once even where listing every tensor would
// not end (two billion experts).
TEST(Weights, ACheckpointThatDisagreesWithItsConfigIsNamedByATensor) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_sizes_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const ModelConfig config = model_preset("tiny-deepseek-v2");  // a dense first layer, shared experts
  ASSERT_EQ(config.dense_layers, 1);
  write_synthetic_checkpoint(dir.string(), config, 3, TensorDType::bf16);
  const SafetensorsCheckpoint checkpoint(dir.string());
  EXPECT_EQ(size_disagreement(checkpoint, config), "");
  const std::string intermediate = std::to_string(config.expert_intermediate);
  const std::string hidden = std::to_string(config.hidden);
  const std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>> cases = {
      {[](ModelConfig& c) { c.layers += 1; },
       "tensor 'model.layers." + std::to_string(config.layers) + ".input_layernorm.weight' ([" + hidden +
           "] by config.json's sizes) is not in the checkpoint"},
      {[](ModelConfig& c) { c.experts = 2000000000; },
       "tensor 'model.layers.1.mlp.gate.weight' has shape [" + std::to_string(config.experts) + ", " + hidden +
           "], where config.json's sizes give [2000000000, " + hidden + "]"},
      {[](ModelConfig& c) { c.vocab *= 2; }, "tensor 'model.embed_tokens.weight' has shape ["},
      {[](ModelConfig& c) { c.dense_intermediate += 1; }, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape ["},
      {[](ModelConfig& c) { c.expert_intermediate += 1; },
       "tensor 'model.layers.1.mlp.experts.0.gate_proj.weight' has shape [" + intermediate + ", "},
      {[](ModelConfig& c) { c.shared_experts += 1; },
       "tensor 'model.layers.1.mlp.shared_experts.gate_proj.weight' has shape ["},
      {[](ModelConfig& c) { c.kv_lora_rank += 1; },
       "tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape ["},
  };
  for (const auto& [edit, expected] : cases) {
    ModelConfig disagreeing = config;
    edit(disagreeing);
    const std::string said = size_disagreement(checkpoint, disagreeing);
    EXPECT_NE(said.find("checkpoint " + dir.string() + ": its config.json disagrees with its weights: " + expected),
              std::string::npos)
        << said;
  }
  // The last layer's last expert is looked at too: a checkpoint without its down projection.
  const fs::path partial = dir / "without_the_last_expert";
  fs::create_directories(partial);
  const std::string last = "model.layers." + std::to_string(config.layers - 1) + ".mlp.experts." +
                           std::to_string(config.experts - 1) + ".down_proj.weight";
  std::map<std::string, TensorToWrite> tensors;
  for (const TensorSpec& spec : weight_specs(config))
    if (spec.name != last)
      tensors[spec.name] = TensorToWrite{TensorDType::bf16, spec.shape, synthetic_tensor<float>(spec, 3)};
  write_safetensors((partial / "model.safetensors").string(), tensors);
  const std::string said = size_disagreement(SafetensorsCheckpoint(partial.string()), config);
  EXPECT_NE(said.find("tensor '" + last + "' ([" + hidden + ", " + intermediate + "] by config.json's sizes) is not"),
            std::string::npos)
      << said;
  fs::remove_all(dir);
}

// Tied embeddings (tie_word_embeddings): no lm_head.weight is written, read
// or counted, and a config that disagrees with the checkpoint says which.
TEST(Weights, TiedEmbeddingsHaveNoLmHead) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_tied_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const ModelConfig untied = model_preset("tiny-qwen3-moe");
  ModelConfig tied = untied;
  tied.tied_embeddings = true;
  EXPECT_EQ(tied.parameters(), untied.parameters() - std::int64_t{untied.vocab} * untied.hidden);
  std::int64_t specified = 0;
  for (const TensorSpec& spec : weight_specs(tied))
    specified += spec.elements();
  EXPECT_EQ(specified, tied.parameters());
  write_synthetic_checkpoint(dir.string(), tied, 3, TensorDType::bf16);
  const ModelConfig read = load_hf_config((dir / "config.json").string());
  EXPECT_TRUE(read.tied_embeddings);
  const SafetensorsCheckpoint checkpoint(dir.string());
  const std::vector<std::string> names = checkpoint.names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);
  EXPECT_TRUE(unused_tensors(checkpoint, read).empty());
  EXPECT_EQ(load_weights<bf16>(checkpoint, read).size(), weight_specs(tied).size());
  try {
    load_weights<bf16>(checkpoint, untied);
    ADD_FAILURE() << "an untied config loaded a tied checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'lm_head.weight' not found"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
  write_synthetic_checkpoint(dir.string(), untied, 3, TensorDType::bf16);
  EXPECT_EQ(unused_tensors(SafetensorsCheckpoint(dir.string()), tied), std::vector<std::string>{"lm_head.weight"});
  fs::remove_all(dir);
}

// A folder that already holds either file of a checkpoint (a real one, named
// by mistake) is left as it was: one error naming the file, nothing written.
TEST(Weights, ASyntheticCheckpointNeverOverwritesOne) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_existing_" + std::to_string(::getpid()));
  const ModelConfig config = model_preset("tiny-mixtral");
  for (const char* existing : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    SCOPED_TRACE(existing);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / existing) << "a real checkpoint's file";
    try {
      write_synthetic_checkpoint(dir.string(), config, 1, TensorDType::bf16);
      FAIL() << "an existing " << existing << " was overwritten";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find((dir / existing).string() + " already exists"), std::string::npos)
          << e.what();
    }
    std::ifstream kept(dir / existing);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "a real checkpoint's file");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "a file was added";
  }
  // A folder that cannot be made (a file of that name) is an error before anything is written.
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path blocked = dir / "nested";
  std::ofstream(blocked) << "a file where the folder would be";
  EXPECT_THROW(write_synthetic_checkpoint(blocked.string(), config, 1, TensorDType::bf16), CheckpointError);
  fs::remove_all(dir);
}

TEST(Weights, AMissingOrMisShapedTensorIsNamed) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("writescope_broken_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  write_synthetic_checkpoint(dir.string(), config, 1, TensorDType::f32);
  ModelConfig wider = config;
  wider.expert_intermediate = 48;  // the checkpoint has 32
  try {
    load_weights<float>(SafetensorsCheckpoint(dir.string()), wider);
    FAIL() << "mis-shaped experts accepted";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.layers.0.mlp.experts.0.gate_proj.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("has shape [32, 64], expected [48, 64]"), std::string::npos) << what;
  }
  ModelConfig deeper = config;
  deeper.layers = 3;
  try {
    load_weights<float>(SafetensorsCheckpoint(dir.string()), deeper);
    FAIL() << "missing layer accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.2.input_layernorm.weight' not found"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace writescope
