#include "moe/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "scratch_dir.hpp"

namespace writescope {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  /// Values exactly representable in f16 and bf16 (and a half subnormal).
  static std::vector<float> exact_values(std::size_t n) {
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = (static_cast<float>(i % 17) - 8.0f) * 0.125f;
    if (n > 3) out[3] = std::ldexp(1.0f, -20);  // subnormal in f16, normal in bf16
    return out;
  }

  /// Expects a CheckpointError whose message contains every part.
  template <class Body>
  void expect_error(Body&& body, std::initializer_list<std::string> parts) {
    try {
      body();
      ADD_FAILURE() << "no CheckpointError";
    } catch (const CheckpointError& e) {
      for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }

  const test::ScratchDir scratch_{"ckpt"};
  const fs::path dir_ = scratch_.path();
};

TEST_F(SafetensorsTest, EveryDTypeRoundTrips) {
  std::map<std::string, TensorToWrite> tensors;
  tensors["a.f32"] = {TensorDType::f32, {2, 3}, {1.5f, -2.25f, 3e-30f, 4.0f, 1e30f, -0.0f}};
  tensors["b.f16"] = {TensorDType::f16, {4, 5}, exact_values(20)};
  tensors["c.bf16"] = {TensorDType::bf16, {20}, exact_values(20)};
  write_safetensors((dir_ / "model.safetensors").string(), tensors, {{"seed", "7"}, {"quote\"d", "a\\b"}});
  const SafetensorsCheckpoint checkpoint(dir_.string());
  EXPECT_EQ(checkpoint.names().size(), 3u);  // __metadata__ is no tensor
  EXPECT_EQ(checkpoint.metadata().at((dir_ / "model.safetensors").string()),
            (std::map<std::string, std::string>{{"seed", "7"}, {"quote\"d", "a\\b"}}));
  EXPECT_EQ(checkpoint.info("b.f16").dtype, TensorDType::f16);
  EXPECT_EQ(checkpoint.read<float>("a.f32", {2, 3}), tensors["a.f32"].values);
  EXPECT_EQ(checkpoint.read<float>("b.f16", {4, 5}), tensors["b.f16"].values);
  EXPECT_EQ(checkpoint.read<float>("c.bf16", {20}), tensors["c.bf16"].values);
  const auto as_bf16 = checkpoint.read<bf16>("a.f32", {2, 3});
  EXPECT_EQ(to_float(as_bf16[0]), 1.5f);
  EXPECT_EQ(to_float(as_bf16[1]), -2.25f);
}

TEST_F(SafetensorsTest, ShardsListedByTheIndex) {
  write_safetensors((dir_ / "model-00001-of-00002.safetensors").string(),
                    {{"layers.0.w", {TensorDType::bf16, {2, 2}, {1, 2, 3, 4}}}});
  write_safetensors((dir_ / "model-00002-of-00002.safetensors").string(),
                    {{"layers.1.w", {TensorDType::f32, {3}, {5, 6, 7}}}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata": {"total_size": 20}, "weight_map": {"layers.0.w": "model-00001-of-00002.safetensors",
            "layers.1.w": "model-00002-of-00002.safetensors"}})";
  const SafetensorsCheckpoint checkpoint(dir_.string());
  EXPECT_EQ(checkpoint.read<float>("layers.1.w", {3}), (std::vector<float>{5, 6, 7}));
  EXPECT_EQ(checkpoint.read<float>("layers.0.w", {2, 2}), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(SafetensorsTest, ErrorsNameFileTensorAndExpectation) {
  const std::string file = (dir_ / "model.safetensors").string();
  write_safetensors(file, {{"w", {TensorDType::f32, {4, 8}, std::vector<float>(32, 1.0f)}}});
  const SafetensorsCheckpoint checkpoint(dir_.string());
  expect_error([&] { checkpoint.read<float>("w", {8, 4}); }, {file, "'w'", "shape [4, 8], expected [8, 4]"});
  expect_error([&] { checkpoint.read<float>("router", {64, 2048}); },
               {dir_.string(), "'router' not found", "expected shape [64, 2048]"});
  // Truncated: the last bytes of the data are gone.
  fs::resize_file(file, fs::file_size(file) - 10);
  expect_error([&] { SafetensorsCheckpoint truncated(dir_.string()); }, {file, "'w'", "beyond the end", "truncated"});
  // A header that is not JSON.
  std::ofstream(file, std::ios::binary) << std::string("\x05\x00\x00\x00\x00\x00\x00\x00{oops", 13);
  expect_error([&] { SafetensorsCheckpoint broken(dir_.string()); },
               {file, "the header is not JSON (line 1, column 2: an object key not in double quotes)"});
  // A length past the format's limit (here 2^32 + 2 in a sparse file that long): not read as 4 GiB of header.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << std::string("\x02\x00\x00\x00\x01\x00\x00\x00{}", 10);
  fs::resize_file(file, (std::uint64_t{1} << 32) + 10);
  expect_error([&] { SafetensorsCheckpoint damaged(dir_.string()); },
               {file, "the header length, 4294967298 bytes, is past safetensors' limit of 100000000"});
  expect_error([&] { SafetensorsCheckpoint missing((dir_ / "nowhere").string()); }, {"no such folder"});
  fs::remove(file);
  expect_error([&] { SafetensorsCheckpoint empty(dir_.string()); }, {"neither model.safetensors"});
}

// Non-finite weights are found on loading, named; so are duplicate header keys
// and header values of the wrong kind (not "bad conversion").
TEST_F(SafetensorsTest, DamagedValuesAndHeadersAreNamed) {
  const std::string file = (dir_ / "model.safetensors").string();
  for (TensorDType dtype : {TensorDType::f32, TensorDType::f16, TensorDType::bf16}) {
    for (float bad : {std::nanf(""), INFINITY}) {
      std::vector<float> values(12, 0.5f);
      values[7] = bad;
      write_safetensors(file, {{"layers.3.w", {dtype, {3, 4}, values}}});
      const SafetensorsCheckpoint checkpoint(dir_.string());
      expect_error([&] { checkpoint.read<bf16>("layers.3.w", {3, 4}); },
                   {file, "'layers.3.w'", std::string("element 7 is ") + (std::isnan(bad) ? "NaN" : "Inf")});
    }
  }
  auto write_header = [&](const std::string& header, std::size_t data_bytes = 8) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    std::ofstream(file, std::ios::binary) << bytes << header << std::string(data_bytes, '\0');
  };
  write_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "key 'w' (line 1) appears twice"});
  write_header(R"({"w": {"dtype": "F32", "shape": ["two"], "data_offsets": [0, 8]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "tensor 'w'", "shape holds the string \"two\""});
  // Numbers in quotes are strings, a comment is no JSON, metadata maps strings to strings.
  write_header(R"({"w": {"dtype": "F32", "shape": [1, "2"], "data_offsets": [0, 8]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "tensor 'w'", "shape holds the string \"2\""});
  write_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", 8]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "data_offsets holds the string \"0\""});
  write_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}} # written by hand");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; },
               {file, "the header is not JSON (line 1, column 63: text after the JSON value)"});
  write_header(R"({"__metadata__": {"format": 5}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "__metadata__ must map strings to strings"});
  write_header(R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})");
  EXPECT_NO_THROW(SafetensorsCheckpoint{dir_.string()});
  write_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "tensor 'w'", "data_offsets holds '-8'"});
  // Two names over shared bytes, and a shape whose byte count wraps to the range given.
  write_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; },
               {file, "tensors 'a' and 'b' overlap: data_offsets [0, 8) and [4, 12)"});
  write_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})");
  EXPECT_NO_THROW(SafetensorsCheckpoint{dir_.string()});
  write_header(R"({"w": {"dtype": "BF16", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; }, {file, "tensor 'w'", "holds more bytes than any file"});
  // The data is the tensors' alone (as the reference reader requires): no bytes after or between them.
  write_header(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 24);
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; },
               {file, "16 bytes after the last tensor's data belong to no tensor"});
  write_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12);
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; },
               {file, "bytes [4, 8) of the data belong to no tensor (before tensor 'b')"});
  // Offsets past the data are named as written, not as file positions.
  write_header(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [99999999, 99999999]}})");
  expect_error([&] { SafetensorsCheckpoint{dir_.string()}; },
               {file, "data_offsets [99999999, 99999999] lie beyond the end of the file's 8 bytes of data"});
}

// What stands at a checkpoint file's name must be a file, and one layout at a time.
TEST_F(SafetensorsTest, NamesTakenByOtherThanOneLayoutsFiles) {
  const fs::path single = dir_ / "model.safetensors", index = dir_ / "model.safetensors.index.json";
  write_safetensors(single.string(), {{"x", {TensorDType::f32, {1}, {1}}}});
  fs::create_directory(index);
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {index.string(), "is a folder; a checkpoint's weights and index are files"});
  fs::remove(index);
  std::ofstream(index) << R"({"weight_map": {"x": "model.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {"holds both model.safetensors and model.safetensors.index.json", "remove one"});
  fs::remove(index);
  fs::remove(single);
  fs::create_symlink("gone.safetensors", single);
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {single.string(), "a symbolic link to gone.safetensors, which does not exist"});
  fs::remove(single);
  // A shard the index names that is a pipe: refused, not opened (which would wait for a writer).
  ASSERT_EQ(::mkfifo((dir_ / "pipe.safetensors").c_str(), 0600), 0);
  std::ofstream(index) << R"({"weight_map": {"x": "pipe.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {(dir_ / "pipe.safetensors").string(), "is a pipe, not a file"});
}

TEST_F(SafetensorsTest, IndexMustMatchTheShards) {
  write_safetensors((dir_ / "a.safetensors").string(), {{"x", {TensorDType::f32, {1}, {1}}}});
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"y": "a.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); }, {"'y'", "a.safetensors", "does not hold it"});
  // A shard is a file of the folder: no path out of it, no folder, no number.
  for (const char* file : {"\"/etc/passwd\"", "\"../a.safetensors\"", "\".\"", "\"\""}) {
    std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": )" << file << "}}";
    expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
                 {"weight_map maps tensor 'x' to", "give the name of a file in the checkpoint's folder"});
  }
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": 5}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); }, {"to a file name (a string)"});
  // A shard's tensor the index leaves out is not the checkpoint's (reused shards carry such): not loaded.
  write_safetensors((dir_ / "a.safetensors").string(),
                    {{"x", {TensorDType::f32, {1}, {1}}}, {"z", {TensorDType::f32, {1}, {2}}}});
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": "a.safetensors"}})";
  const SafetensorsCheckpoint indexed(dir_.string());
  EXPECT_EQ(indexed.names(), std::vector<std::string>{"x"});
  expect_error([&] { indexed.info("z"); }, {"'z' not found"});
  // A shard the index lists and the folder lacks (a download that stopped) is named with its tensors.
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "w2": "model-00002-of-00002.safetensors",
                            "w3": "model-00002-of-00002.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {"model-00002-of-00002.safetensors: does not exist", "model.safetensors.index.json",
                "for 2 tensors (the first: 'w2')"});
  // One tensor in two shards: which copy loads is not guessed, even where the index names one.
  write_safetensors((dir_ / "b.safetensors").string(), {{"x", {TensorDType::f32, {1}, {3}}}});
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "b.safetensors", "z": "a.safetensors"}})";
  expect_error([&] { SafetensorsCheckpoint checkpoint(dir_.string()); },
               {"b.safetensors", "'x'", "also present in", "a.safetensors"});
}

}  // namespace
}  // namespace writescope
