#include "moe/safetensors.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <unordered_set>
#include <utility>
#include <vector>

#include "framework/config.hpp"
#include "framework/files.hpp"
#include "framework/json.hpp"
#include "framework/log.hpp"

namespace writescope {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

namespace {

/// Where and why the JSON parser stopped, without the parser's own prefix.
std::string json_problem(const YAML::Exception& e) {
  if (e.mark.is_null()) return ": " + e.msg;
  return " (line " + std::to_string(e.mark.line + 1) + ", column " + std::to_string(e.mark.column + 1) + "): " + e.msg;
}

namespace fs = std::filesystem;

TensorDType parse_dtype(const std::string& name, const std::string& where) {
  if (name == "F32") return TensorDType::f32;
  if (name == "F16") return TensorDType::f16;
  if (name == "BF16") return TensorDType::bf16;
  throw CheckpointError(where + ": unsupported dtype '" + name + "' (expected F32, F16 or BF16)");
}

/// IEEE binary16 -> float, exact.
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return float_from_bits(bits);
}

/// float -> IEEE binary16, round to nearest even (for writing test checkpoints).
std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = bits_from_float(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;              // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;             // overflow -> inf
  if (magnitude < 0x38800000u) {                                   // subnormal or zero
    const float scaled = std::fabs(value) * 16777216.0f;           // 2^24: units of the smallest subnormal
    return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
  }
  const std::uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((rounded - 0x38000000u) >> 13);
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

const char* dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::f32: return "F32";
    case TensorDType::f16: return "F16";
    case TensorDType::bf16: return "BF16";
  }
  return "?";
}

std::size_t dtype_bytes(TensorDType dtype) { return dtype == TensorDType::f32 ? 4 : 2; }

std::int64_t TensorInfo::elements() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

/// A non-negative integer of a header field; `where` names the file and tensor.
template <class Integer>
Integer header_integer(const YAML::Node& node, const std::string& where, const char* field) {
  Integer value{};
  // A JSON string ("64", a quoted scalar: tag "!") is not a number.
  const bool quoted = node.IsScalar() && node.Tag() == "!";
  const bool read = node.IsScalar() && !quoted && YAML::convert<Integer>::decode(node, value);
  bool negative = false;
  if constexpr (std::is_signed_v<Integer>) negative = value < 0;
  if (!read || negative)
    throw CheckpointError(where + ": " + field + " holds " +
                          (quoted ? "the string \"" + node.Scalar() + "\""
                                  : "'" + (node.IsScalar() ? node.Scalar() : std::string("a non-number")) + "'") +
                          ", not a non-negative integer");
  return value;
}

}  // namespace

namespace {

/// Whether the checkpoint's file `path` is there; CheckpointError where a
/// name is taken by something no file can be read from (a folder, a device,
/// a link to nothing), which would otherwise fail as a stream or file-system error.
bool checkpoint_file_present(const fs::path& path) {
  std::error_code error;
  if (fs::is_symlink(path, error) && !fs::exists(path, error))
    throw CheckpointError(path.string() + ": a symbolic link to " + fs::read_symlink(path, error).string() +
                          ", which does not exist");
  if (!fs::exists(path, error)) return false;
  if (const std::string why = not_a_file_reason(path.string()); !why.empty())
    throw CheckpointError(path.string() + ": " + why + "; a checkpoint's weights and index are files");
  return true;
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& folder) : folder_(folder) {
  if (!fs::is_directory(folder_)) throw CheckpointError("checkpoint " + folder_ + ": no such folder");
  const fs::path index = fs::path(folder_) / "model.safetensors.index.json";
  const bool indexed = checkpoint_file_present(index),
             single = checkpoint_file_present(fs::path(folder_) / "model.safetensors");
  // Which weights would load is not the user's to guess.
  if (indexed && single)
    throw CheckpointError("checkpoint " + folder_ + ": holds both model.safetensors and model.safetensors.index.json "
                          "(which weights load is unclear); remove one");
  if (indexed) {
    YAML::Node root;
    try {
      std::ifstream in(index, std::ios::binary);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      if (const std::string error = json_syntax_error(text); !error.empty())
        throw CheckpointError(index.string() + ": not JSON (" + error + ")");
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      throw CheckpointError(index.string() + ": malformed JSON" + json_problem(e));
    }
    if (const auto duplicate = duplicate_key(root)) throw CheckpointError(index.string() + ": " + *duplicate);
    const YAML::Node map = root["weight_map"];
    if (!map || !map.IsMap()) throw CheckpointError(index.string() + ": no 'weight_map' object");
    std::map<std::string, std::pair<std::string, int>> files;  // file -> (the first tensor listed in it, tensors)
    for (const auto& entry : map) {
      if (!entry.first.IsScalar() || !entry.second.IsScalar() || entry.second.Tag() != "!")
        throw CheckpointError(index.string() + ": weight_map entries must map a tensor name to a file name (a string)");
      // A file of the checkpoint's folder, as Hugging Face shards are: never a path out of it.
      const std::string& file = entry.second.Scalar();
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
        throw CheckpointError(index.string() + ": weight_map maps tensor '" + entry.first.Scalar() + "' to '" + file +
                              "'; give the name of a file in the checkpoint's folder");
      auto& [first, count] = files[file];
      if (count++ == 0) first = entry.first.Scalar();
    }
    // A shard the index lists but the folder lacks is most often a download that stopped.
    for (const auto& [file, listed] : files)
      if (!checkpoint_file_present(fs::path(folder_) / file))
        throw CheckpointError((fs::path(folder_) / file).string() + ": does not exist, but " + index.string() +
                              " lists it for " + std::to_string(listed.second) + " tensors (the first: '" +
                              listed.first + "'); was the download complete?");
    for (const auto& entry : files) add_file(entry.first);
    for (const auto& entry : map) {
      const auto name = entry.first.as<std::string>();
      const auto found = tensors_.find(name);
      if (found == tensors_.end() || found->second.file != (fs::path(folder_) / entry.second.as<std::string>()).string())
        throw CheckpointError(index.string() + ": tensor '" + name + "' is listed in " +
                              entry.second.as<std::string>() + " but that file does not hold it");
    }
    // A shard's tensors the index leaves out are not the checkpoint's: the
    // Hub's repositories reuse shards that carry others (vLLM and
    // transformers load by the index too). Dropped, and said.
    std::unordered_set<std::string> listed;
    for (const auto& entry : map) listed.insert(entry.first.Scalar());
    std::size_t unlisted = 0;
    std::string first_unlisted;
    for (auto tensor = tensors_.begin(); tensor != tensors_.end();) {
      if (listed.count(tensor->first)) {
        ++tensor;
        continue;
      }
      if (unlisted++ == 0) first_unlisted = "'" + tensor->first + "' of " + tensor->second.file;
      tensor = tensors_.erase(tensor);
    }
    if (unlisted > 0)
      log_warn("checkpoint ", folder_, ": ", unlisted, " tensors of its shards are not in ", index.string(),
               "'s weight_map and are not loaded (the first: ", first_unlisted, ")");
  } else if (single) {
    add_file("model.safetensors");
  } else {
    throw CheckpointError("checkpoint " + folder_ + ": neither model.safetensors nor model.safetensors.index.json");
  }
}

void SafetensorsCheckpoint::add_file(const std::string& file_name) {
  const std::string path = (fs::path(folder_) / file_name).string();
  checkpoint_file_present(path);  // a shard that is a pipe would be waited on forever
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot open the file");
  const std::uint64_t size = fs::file_size(path);
  unsigned char length_bytes[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(length_bytes), 8))
    throw CheckpointError(path + ": truncated (no header length)");
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  // The format's own limit (the reference reader's): a damaged length is not read as gigabytes of header.
  constexpr std::uint64_t max_header_length = 100'000'000;
  if (header_length > max_header_length)
    throw CheckpointError(path + ": the header length, " + std::to_string(header_length) +
                          " bytes, is past safetensors' limit of " + std::to_string(max_header_length) +
                          ": not a safetensors file, or damaged");
  if (header_length > size - 8) throw CheckpointError(path + ": truncated (header longer than the file)");
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  if (const std::string error = json_syntax_error(header); !error.empty())
    throw CheckpointError(path + ": the header is not JSON (" + error + ")");
  YAML::Node root;
  try {
    root = YAML::Load(header);
  } catch (const YAML::Exception& e) {
    throw CheckpointError(path + ": malformed header JSON" + json_problem(e));
  }
  if (!root.IsMap()) throw CheckpointError(path + ": the header is not a JSON object");
  if (const auto duplicate = duplicate_key(root)) throw CheckpointError(path + ": header: " + *duplicate);
  const std::uint64_t data_start = 8 + header_length;
  std::vector<std::pair<std::uint64_t, std::string>> in_file;  // (begin, name) of this file's tensors
  for (const auto& entry : root) {
    const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "?";
    if (name == "__metadata__") {
      // The format's metadata: strings to strings.
      bool strings = entry.second.IsMap();
      for (const auto& item : entry.second)
        strings = strings && item.second.IsScalar() && item.second.Tag() == "!";
      if (!strings) throw CheckpointError(path + ": __metadata__ must map strings to strings");
      for (const auto& item : entry.second) metadata_[path][item.first.Scalar()] = item.second.Scalar();
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    const YAML::Node node = entry.second;
    if (!node.IsMap() || !node["dtype"] || !node["shape"] || !node["data_offsets"] ||
        !node["data_offsets"].IsSequence() || node["data_offsets"].size() != 2 || !node["shape"].IsSequence())
      throw CheckpointError(where + ": needs dtype, shape and data_offsets [begin, end]");
    TensorInfo info;
    info.file = path;
    if (!node["dtype"].IsScalar()) throw CheckpointError(where + ": dtype is not a string");
    info.dtype = parse_dtype(node["dtype"].Scalar(), where);
    for (const auto& d : node["shape"]) info.shape.push_back(header_integer<std::int64_t>(d, where, "shape"));
    const std::uint64_t offsets[2] = {header_integer<std::uint64_t>(node["data_offsets"][0], where, "data_offsets"),
                                      header_integer<std::uint64_t>(node["data_offsets"][1], where, "data_offsets")};
    if (offsets[0] > offsets[1])
      throw CheckpointError(where + ": data_offsets [" + std::to_string(offsets[0]) + ", " +
                            std::to_string(offsets[1]) + "] run backwards");
    if (offsets[1] > size - data_start)  // compared before adding data_start: no wrap-around
      throw CheckpointError(where + ": data_offsets [" + std::to_string(offsets[0]) + ", " +
                            std::to_string(offsets[1]) + "] lie beyond the end of the file's " +
                            std::to_string(size - data_start) + " bytes of data: truncated, or wrong offsets");
    info.begin = data_start + offsets[0];
    info.end = data_start + offsets[1];
    // The shape's bytes, checked: a product beyond 63 bits would wrap to a size that matches.
    std::uint64_t needed = dtype_bytes(info.dtype);
    for (std::int64_t d : info.shape)
      if (__builtin_mul_overflow(needed, static_cast<std::uint64_t>(d), &needed) || needed > (1ull << 62))
        throw CheckpointError(where + ": shape " + shape_text(info.shape) + " holds more bytes than any file");
    if (info.end - info.begin != needed)
      throw CheckpointError(where + ": data_offsets hold " + std::to_string(info.end - info.begin) +
                            " bytes, shape " + shape_text(info.shape) + " of " + dtype_name(info.dtype) + " needs " +
                            std::to_string(needed));
    if (!tensors_.emplace(name, info).second)
      throw CheckpointError(where + ": also present in " + tensors_.at(name).file);
    if (info.end > info.begin) in_file.emplace_back(info.begin, name);  // an empty tensor holds no bytes
  }
  // Tensors share no bytes (as the format's reference reader requires): two
  // names over one range would load the same values twice.
  std::sort(in_file.begin(), in_file.end());
  for (std::size_t i = 1; i < in_file.size(); ++i) {
    const TensorInfo& before = tensors_.at(in_file[i - 1].second);
    const TensorInfo& after = tensors_.at(in_file[i].second);
    if (after.begin < before.end)
      throw CheckpointError(path + ": tensors '" + in_file[i - 1].second + "' and '" + in_file[i].second +
                            "' overlap: data_offsets [" + std::to_string(before.begin - data_start) + ", " +
                            std::to_string(before.end - data_start) + ") and [" +
                            std::to_string(after.begin - data_start) + ", " + std::to_string(after.end - data_start) +
                            ")");
  }
  // The data is the tensors' and nothing else's, as the reference reader
  // requires: bytes between or after them are a damaged or foreign file.
  std::uint64_t covered = 0;
  for (const auto& [begin, name] : in_file) {
    if (begin - data_start != covered)
      throw CheckpointError(path + ": bytes [" + std::to_string(covered) + ", " + std::to_string(begin - data_start) +
                            ") of the data belong to no tensor (before tensor '" + name + "')");
    covered = tensors_.at(name).end - data_start;
  }
  if (covered != size - data_start)
    throw CheckpointError(path + ": " + std::to_string(size - data_start - covered) +
                          " bytes after the last tensor's data belong to no tensor (its tensors end at byte " +
                          std::to_string(data_start + covered) + " of " + std::to_string(size) + ")");
}

const TensorInfo& SafetensorsCheckpoint::info(const std::string& tensor) const {
  const auto found = tensors_.find(tensor);
  if (found == tensors_.end()) throw CheckpointError("checkpoint " + folder_ + ": tensor '" + tensor + "' not found");
  return found->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& entry : tensors_) out.push_back(entry.first);
  return out;
}

template <class Scalar>
std::vector<Scalar> SafetensorsCheckpoint::read(const std::string& tensor,
                                                const std::vector<std::int64_t>& expected_shape) const {
  const auto found = tensors_.find(tensor);
  if (found == tensors_.end())
    throw CheckpointError("checkpoint " + folder_ + ": tensor '" + tensor + "' not found (expected shape " +
                          shape_text(expected_shape) + ")");
  const TensorInfo& t = found->second;
  if (t.shape != expected_shape)
    throw CheckpointError(t.file + ": tensor '" + tensor + "' has shape " + shape_text(t.shape) + ", expected " +
                          shape_text(expected_shape));
  std::ifstream in(t.file, std::ios::binary);
  std::vector<unsigned char> raw(t.end - t.begin);
  in.seekg(static_cast<std::streamoff>(t.begin));
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size())))
    throw CheckpointError(t.file + ": tensor '" + tensor + "': read failed (file changed or truncated)");
  const auto n = static_cast<std::size_t>(t.elements());
  std::vector<Scalar> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float value;
    if (t.dtype == TensorDType::f32) {
      std::memcpy(&value, raw.data() + 4 * i, 4);
    } else {
      std::uint16_t half;
      std::memcpy(&half, raw.data() + 2 * i, 2);
      value = t.dtype == TensorDType::bf16 ? to_float(bf16{half}) : half_to_float(half);
    }
    if (!std::isfinite(value))
      throw CheckpointError(t.file + ": tensor '" + tensor + "': element " + std::to_string(i) + " is " +
                            (std::isnan(value) ? "NaN" : "Inf") + "; the checkpoint is damaged or was saved from a diverged model");
    out[i] = from_float<Scalar>(value);
  }
  return out;
}

template std::vector<float> SafetensorsCheckpoint::read<float>(const std::string&,
                                                              const std::vector<std::int64_t>&) const;
template std::vector<bf16> SafetensorsCheckpoint::read<bf16>(const std::string&,
                                                            const std::vector<std::int64_t>&) const;

void write_safetensors(const std::string& path, const std::map<std::string, TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::ostringstream header;
  header << "{";
  std::uint64_t offset = 0;
  bool first = true;
  if (!metadata.empty()) {
    header << "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      header << (first ? "" : ",") << "\"" << json_escape(key) << "\":\"" << json_escape(value) << "\"";
      first = false;
    }
    header << "}";
    first = false;
  }
  for (const auto& [name, t] : tensors) {
    std::int64_t elements = 1;
    for (auto d : t.shape) elements *= d;
    if (static_cast<std::size_t>(elements) != t.values.size())
      throw CheckpointError(path + ": tensor '" + name + "' has " + std::to_string(t.values.size()) +
                            " values for shape " + shape_text(t.shape));
    const std::uint64_t bytes = static_cast<std::uint64_t>(elements) * dtype_bytes(t.dtype);
    header << (first ? "" : ",") << "\"" << json_escape(name) << "\":{\"dtype\":\"" << dtype_name(t.dtype)
           << "\",\"shape\":" << shape_text(t.shape) << ",\"data_offsets\":[" << offset << "," << offset + bytes
           << "]}";
    offset += bytes;
    first = false;
  }
  header << "}";
  const std::string text = header.str();
  // Written beside `path` and renamed over it when whole: a writer killed or
  // out of space leaves no truncated file under the name readers take.
  const std::string partial = path + ".partial";
  std::ofstream out(partial, std::ios::binary | std::ios::trunc);
  if (!out) throw CheckpointError(partial + ": cannot create the file (" + std::strerror(errno) + ")");
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xffu);
  out.write(reinterpret_cast<const char*>(length_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) {
    for (float value : t.values) {
      if (t.dtype == TensorDType::f32) {
        out.write(reinterpret_cast<const char*>(&value), 4);
      } else {
        const std::uint16_t half = t.dtype == TensorDType::bf16 ? from_float<bf16>(value).bits : float_to_half(value);
        out.write(reinterpret_cast<const char*>(&half), 2);
      }
    }
  }
  out.flush();
  const int write_error = out ? 0 : errno;
  out.close();
  std::error_code renamed;
  if (write_error == 0 && !out.fail()) std::filesystem::rename(partial, path, renamed);
  if (write_error != 0 || out.fail() || renamed) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw CheckpointError(path + ": write failed (" +
                          (renamed ? renamed.message() : std::string(std::strerror(write_error ? write_error : EIO))) +
                          ")");
  }
}

}  // namespace writescope
