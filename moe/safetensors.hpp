#pragma once
// Reading (and, for tests and tools, writing) Hugging Face safetensors
// checkpoints: one `model.safetensors` file, or shards listed by
// `model.safetensors.index.json`.
//
// File format: an 8-byte little-endian header length N, N bytes of JSON
// mapping tensor names to {dtype, shape, data_offsets: [begin, end)} (offsets
// relative to the end of the header), then the data. Every problem — a missing
// file or tensor, a truncated file, a shape or dtype that does not match —
// is one CheckpointError naming the file, the tensor and what was expected.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/bf16.hpp"

namespace writescope {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class TensorDType { f32, f16, bf16 };

/// "F32", "F16", "BF16".
const char* dtype_name(TensorDType dtype);
std::size_t dtype_bytes(TensorDType dtype);

/// A tensor's shape as its errors print it: "[4, 64]".
std::string shape_text(const std::vector<std::int64_t>& shape);

struct TensorInfo {
  std::string file;  // the shard holding it
  TensorDType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // absolute byte offsets in `file`
  std::uint64_t end = 0;
  std::int64_t elements() const;
};

class SafetensorsCheckpoint {
 public:
  /// `folder` holds model.safetensors or model.safetensors.index.json plus shards.
  explicit SafetensorsCheckpoint(const std::string& folder);

  const std::string& folder() const noexcept { return folder_; }
  bool contains(const std::string& tensor) const { return tensors_.count(tensor) != 0; }
  const TensorInfo& info(const std::string& tensor) const;
  std::vector<std::string> names() const;
  /// Each file's `__metadata__` (strings to strings), by file path; files without one are absent.
  const std::map<std::string, std::map<std::string, std::string>>& metadata() const noexcept { return metadata_; }

  /// Reads `tensor`, which must have exactly `expected_shape`, converted to
  /// float or bf16 (bf16 to float is exact; float to bf16 rounds to nearest even).
  template <class Scalar>
  std::vector<Scalar> read(const std::string& tensor, const std::vector<std::int64_t>& expected_shape) const;

 private:
  void add_file(const std::string& file_name);

  std::string folder_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::map<std::string, std::string>> metadata_;
};

/// A tensor to write: float values stored as `dtype`.
struct TensorToWrite {
  TensorDType dtype = TensorDType::f32;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

/// Writes one safetensors file (tests, tools, synthetic checkpoints), with `metadata` as its `__metadata__`.
void write_safetensors(const std::string& path, const std::map<std::string, TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

extern template std::vector<float> SafetensorsCheckpoint::read<float>(const std::string&,
                                                                     const std::vector<std::int64_t>&) const;
extern template std::vector<bf16> SafetensorsCheckpoint::read<bf16>(const std::string&,
                                                                   const std::vector<std::int64_t>&) const;

}  // namespace writescope
