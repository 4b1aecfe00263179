#include "moe/reference_model.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

namespace writescope {
namespace {

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(RotaryEmbedding, DotProductsDependOnlyOnTheDistance) {
  const RotaryEmbedding rope = RotaryEmbedding::for_model(model_preset("qwen3-30b-a3b"));
  std::vector<float> q(128), k(128);
  for (int i = 0; i < 128; ++i) q[i] = std::sin(0.3f * i), k[i] = std::cos(0.7f * i);
  auto rotated_dot = [&](std::int64_t m, std::int64_t n) {
    auto qm = q, kn = k;
    rope.apply(qm.data(), 128, m);
    rope.apply(kn.data(), 128, n);
    return dot(qm, kn);
  };
  EXPECT_NEAR(rotated_dot(7, 3), rotated_dot(1007, 1003), 1e-3);
  EXPECT_NEAR(rotated_dot(0, 0), dot(q, k), 1e-4);
  auto norm = q;
  rope.apply(norm.data(), 128, 12345);
  EXPECT_NEAR(dot(norm, norm), dot(q, q), 1e-3);
  // It rotates: another distance, another product; and pair (1, 65) turns by
  // position x theta^(-2/128) with Qwen3's theta of 10^6 (rotate-half pairs).
  EXPECT_GT(std::abs(rotated_dot(7, 3) - rotated_dot(7, 7)), 0.1);
  std::vector<float> unit(128, 0.0f);
  unit[1] = 1.0f;
  rope.apply(unit.data(), 128, 5);
  const double angle = 5 * std::pow(1e6, -2.0 / 128);
  EXPECT_NEAR(unit[1], std::cos(angle), 1e-6);
  EXPECT_NEAR(unit[65], std::sin(angle), 1e-6);
}

TEST(RotaryEmbedding, DeepSeekYarnFrequencies) {
  // dim 64, theta 1e4, factor 40, original 4096, beta 32 / 1: dims below 10
  // keep their frequency, dims from 23 on are divided by the factor.
  const RotaryEmbedding rope = RotaryEmbedding::for_model(model_preset("deepseek-v2-lite"));
  ASSERT_EQ(rope.inverse_frequencies.size(), 32u);
  EXPECT_DOUBLE_EQ(rope.inverse_frequencies[0], 1.0);
  EXPECT_NEAR(rope.inverse_frequencies[5], std::pow(1e4, -10.0 / 64), 1e-15);
  EXPECT_NEAR(rope.inverse_frequencies[31], std::pow(1e4, -62.0 / 64) / 40, 1e-15);
  const double ramp = (16 - 10) / 13.0;  // between the correction dims 10 and 23
  EXPECT_NEAR(rope.inverse_frequencies[16], std::pow(1e4, -32.0 / 64) * (ramp / 40 + (1 - ramp)), 1e-15);
  EXPECT_DOUBLE_EQ(rope.scale, 1.0);  // mscale == mscale_all_dim
}

// Where mscale_all_dim differs from mscale, YaRN scales the rotation:
// DeepSeek's 0.707 over 0 at factor 40 is 1 + 0.1 x 0.707 x ln 40.
TEST(RotaryEmbedding, YarnScalesTheRotationByTheMscaleRatio) {
  ModelConfig config = model_preset("deepseek-v2-lite");
  config.rope_scaling.mscale = 0.707;
  config.rope_scaling.mscale_all_dim = 0;
  const RotaryEmbedding rope = RotaryEmbedding::for_model(config);
  const double scale = 1 + 0.1 * 0.707 * std::log(40.0);
  EXPECT_NEAR(rope.scale, scale, 1e-12);
  std::vector<float> x(64, 0.0f);
  x[0] = 1.0f;
  rope.apply(x.data(), 64, 3);
  EXPECT_NEAR(x[0], std::cos(3.0) * scale, 1e-6);  // the first pair's frequency is 1
  EXPECT_NEAR(x[32], std::sin(3.0) * scale, 1e-6);
}

TEST(ReferenceModel, AbsorbedMlaEqualsTheDecompressedOriginal) {
  const ModelConfig config = model_preset("tiny-deepseek-v2");
  ReferenceModel absorbed = ReferenceModel::synthetic(config, 5, ReferenceModel::MlaForm::absorbed);
  ReferenceModel original = ReferenceModel::synthetic(config, 5, ReferenceModel::MlaForm::decompressed);
  const std::vector<int> prompt{3, 141, 59, 26, 5, 35, 89, 79};
  const auto a = absorbed.forward(prompt), b = original.forward(prompt);
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(b[i]))) << i;
  EXPECT_EQ(absorbed.generate({1, 2}, 6), original.generate({1, 2}, 6));
}

TEST(ReferenceModel, EveryArchitectureRunsFiniteAndDeterministic) {
  for (const char* name : {"tiny-deepseek-v2", "tiny-qwen3-moe", "tiny-mixtral"}) {
    ReferenceModel model = ReferenceModel::synthetic(model_preset(name), 11);
    const auto logits = model.forward({10, 20, 30, 40});
    ASSERT_EQ(logits.size(), static_cast<std::size_t>(model.config().vocab));
    double spread = 0;
    for (float l : logits) {
      ASSERT_TRUE(std::isfinite(l)) << name;
      spread += std::abs(l - logits[0]);
    }
    EXPECT_GT(spread, 1e-3) << name << ": logits carry no information";
    EXPECT_EQ(model.length(), 4);
    // The KV cache is exact: continuing equals recomputing from scratch.
    const auto next = model.forward({50});
    ReferenceModel again = ReferenceModel::synthetic(model_preset(name), 11);
    const auto whole = again.forward({10, 20, 30, 40, 50});
    EXPECT_EQ(next, whole) << name;
    model.reset();
    const auto generated = model.generate({7, 8, 9}, 5);
    EXPECT_EQ(generated.size(), 5u);
    EXPECT_EQ(generated, ReferenceModel::synthetic(model_preset(name), 11).generate({7, 8, 9}, 5)) << name;
    EXPECT_THROW(model.forward({model.config().vocab}), std::invalid_argument);
  }
}

TEST(ReferenceModel, CheckpointWeightsGiveTheSameModel) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("writescope_reference_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const ModelConfig config = model_preset("tiny-qwen3-moe");
  write_synthetic_checkpoint(dir.string(), config, 4, TensorDType::bf16);
  const ModelConfig loaded_config = load_hf_config((dir / "config.json").string());
  ReferenceModel loaded(loaded_config, load_weights<float>(SafetensorsCheckpoint(dir.string()), loaded_config));
  // The same weights, rounded to bf16 as stored.
  std::vector<std::vector<float>> rounded;
  for (const TensorSpec& spec : weight_specs(config)) {
    const auto values = synthetic_tensor<bf16>(spec, 4);
    rounded.emplace_back();
    for (bf16 v : values) rounded.back().push_back(to_float(v));
  }
  ReferenceModel expected(config, std::move(rounded));
  EXPECT_EQ(loaded.forward({1, 2, 3}), expected.forward({1, 2, 3}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace writescope
