#include "framework/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "framework/json.hpp"

namespace writescope {
namespace {

template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_unsigned_v<T>) return "a non-negative integer";
  else return "an integer";
}

/// Whether `node` is written as a decimal integer, whatever its size.
bool integer_text(const YAML::Node& node) {
  const std::string s = node.IsScalar() ? node.Scalar() : std::string();
  const std::size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  return s.size() > sign && std::all_of(s.begin() + sign, s.end(), [](unsigned char c) { return std::isdigit(c); });
}

/// What `node` should have been: "an integer in [-2147483648, 2147483647]"
/// when it is an integer out of T's range, else T's kind.
template <class T>
std::string expected_value(const YAML::Node& node) {
  std::string text = type_name<T>();
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (integer_text(node) && !(std::is_unsigned_v<T> && node.Scalar()[0] == '-'))
      text += " in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
              std::to_string(std::numeric_limits<T>::max()) + "]";
  }
  return text;
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    default: return "an undefined value";
  }
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string join(std::initializer_list<std::string_view> words) {
  std::string out;
  for (auto w : words) out += (out.empty() ? "" : ", ") + std::string(w);
  return out;
}

/// Thrown by first_duplicate_key past max_yaml_values values.
struct TooManyValues {};

/// The first key that appears twice in one mapping of `node`, as "path (line
/// L)". `left`: values it may still look at (an alias is walked again where
/// it is used, so that ten lines of aliases can stand for 10^9 values).
std::optional<std::string> first_duplicate_key(const YAML::Node& node, const std::string& path, std::size_t& left) {
  if (left-- == 0) throw TooManyValues{};
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      if (auto found = first_duplicate_key(node[i], path + "[" + std::to_string(i) + "]", left)) return found;
  } else if (node.IsMap()) {
    std::unordered_set<std::string> seen;  // safetensors indexes list tens of thousands of tensors
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "?";
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (!seen.insert(key).second) return key_path + "' (line " + std::to_string(entry.first.Mark().line + 1) + ")";
      if (auto found = first_duplicate_key(entry.second, key_path, left)) return found;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> duplicate_key(const YAML::Node& root) {
  std::size_t left = max_yaml_values;
  try {
    if (auto found = first_duplicate_key(root, "", left)) return "key '" + *found + " appears twice in one mapping";
  } catch (const TooManyValues&) {
    return "holds more than " + std::to_string(max_yaml_values) +
           " values with its aliases (*name) expanded; write the values out, or fewer";
  }
  return std::nullopt;
}

ConfigError::ConfigError(std::string source, std::string field, std::string reason)
    : std::runtime_error(source + ": " + (field.empty() ? "" : "field '" + field + "': ") + reason),
      source_(std::move(source)),
      field_(std::move(field)),
      reason_(std::move(reason)) {}

std::string format_byte_size(std::uint64_t bytes) {
  std::ostringstream out;
  if (bytes < 1024) {
    out << bytes << "B";
    return out.str();
  }
  const auto [size, name] = bytes >= (1ull << 30)   ? std::pair{1ull << 30, "GiB"}
                            : bytes >= (1ull << 20) ? std::pair{1ull << 20, "MiB"}
                                                    : std::pair{1ull << 10, "KiB"};
  if (bytes % size == 0)
    out << bytes / size << name;
  else
    out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / static_cast<double>(size) << name;
  return out.str();
}

namespace {

/// parse_byte_size, or why `text` is not a byte size (in `problem`).
std::optional<std::uint64_t> read_byte_size(std::string_view text, std::string& problem) {
  // A decimal number ("12", "1.5", "2e9"), then spaces and a unit, if any:
  // no hexadecimal, no spaces inside the number or the unit.
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  const auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  std::size_t end = 0;
  const auto digits = [&] {
    const std::size_t begin = end;
    while (end < text.size() && is_digit(text[end])) ++end;
    return end > begin;
  };
  if (!digits()) {
    problem = !text.empty() && text.front() == '-' ? "a size is not negative" : "it does not start with a number";
    return std::nullopt;
  }
  if (end < text.size() && text[end] == '.') {
    ++end;
    if (!digits()) {
      problem = "no digit after the decimal point";
      return std::nullopt;
    }
  }
  if (end < text.size() && (text[end] == 'e' || text[end] == 'E') && end + 1 < text.size() &&
      (is_digit(text[end + 1]) || ((text[end + 1] == '+' || text[end + 1] == '-') && end + 2 < text.size() &&
                                   is_digit(text[end + 2])))) {
    end += is_digit(text[end + 1]) ? 1 : 2;
    digits();
  }
  const std::string number(text.substr(0, end));
  const double value = std::strtod(number.c_str(), nullptr);
  std::string_view unit = text.substr(end);
  while (!unit.empty() && is_space(unit.front())) unit.remove_prefix(1);
  std::string suffix(unit);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::pair<const char*, double> units[] = {
      {"", 1.0},      {"b", 1.0},     {"k", 1024.0},  {"kib", 1024.0},       {"kb", 1e3},
      {"m", 1 << 20}, {"mib", 1 << 20}, {"mb", 1e6},  {"g", 1 << 30},        {"gib", 1 << 30},
      {"gb", 1e9},    {"t", 0x1p40},  {"tib", 0x1p40}, {"tb", 1e12}};
  for (const auto& [name, scale] : units) {
    if (suffix != name) continue;
    // A fraction of a unit is rounded to a byte ("1.3MiB", as messages print
    // sizes); a fraction of a byte is an error.
    const double bytes = scale > 1 ? std::round(value * scale) : value;
    if (!std::isfinite(bytes) || bytes >= 0x1p64) {
      problem = "2^64 bytes or more";
      return std::nullopt;
    }
    if (bytes != std::floor(bytes)) {
      problem = "a fraction of a byte";
      return std::nullopt;
    }
    return static_cast<std::uint64_t>(bytes);
  }
  problem = "unknown unit '" + std::string(unit) +
            "' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K, M, G and T are KiB, MiB, GiB and TiB)";
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> parse_byte_size(std::string_view text) {
  std::string problem;
  return read_byte_size(text, problem);
}

std::string byte_size_problem(std::string_view text) {
  std::string problem;
  read_byte_size(text, problem);
  return problem;
}

ConfigNode::ConfigNode(YAML::Node node, std::string path, std::shared_ptr<const std::string> source,
                       std::shared_ptr<const std::string> text)
    : node_(std::move(node)), path_(std::move(path)), source_(std::move(source)), text_(std::move(text)) {}

namespace {
/// The text of the config file `path`; ConfigError where it cannot be read.
std::string config_file_text(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) throw ConfigError(path, "", "is a directory, not a config file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "", "cannot open the file for reading");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

ConfigNode ConfigNode::load_file(const std::string& path) { return parse(config_file_text(path), path); }

ConfigNode ConfigNode::load_json_file(const std::string& path) {
  const std::string text = config_file_text(path);
  if (const std::string error = json_syntax_error(text); !error.empty())
    throw ConfigError(path, "", "is not JSON: " + error);
  return parse(text, path);
}

namespace {
/// The offset of the first byte of `text` that does not begin or continue a
/// well-formed UTF-8 sequence (no overlong forms, surrogates or code points
/// past U+10FFFF), or npos.
std::size_t first_invalid_utf8(const std::string& text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    int continuation = 0;
    unsigned char low = 0x80, high = 0xbf;  // the second byte's range
    if (lead < 0x80) continuation = 0;
    else if (lead >= 0xc2 && lead <= 0xdf) continuation = 1;
    else if (lead >= 0xe0 && lead <= 0xef) {
      continuation = 2;
      if (lead == 0xe0) low = 0xa0;
      if (lead == 0xed) high = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      continuation = 3;
      if (lead == 0xf0) low = 0x90;
      if (lead == 0xf4) high = 0x8f;
    } else {
      return i;
    }
    for (int k = 1; k <= continuation; ++k) {
      if (i + k >= text.size()) return i;
      const unsigned char c = byte(i + k);
      if (k == 1 ? c < low || c > high : c < 0x80 || c > 0xbf) return i;
    }
    i += 1 + continuation;
  }
  return std::string::npos;
}
}  // namespace

ConfigNode ConfigNode::parse(const std::string& text, const std::string& source) {
  auto name = std::make_shared<const std::string>(source);
  // A binary file (an HDF5 file named by mistake) gets this, not a parser's
  // complaint quoting its bytes; YAML allows no such control characters.
  if (const auto binary = std::find_if(text.begin(), text.end(),
                                       [](unsigned char c) { return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f; });
      binary != text.end()) {
    std::ostringstream reason;
    reason << "is not a text file (control byte 0x" << std::hex << std::setw(2) << std::setfill('0')
           << static_cast<int>(static_cast<unsigned char>(*binary)) << std::dec << " at offset " << (binary - text.begin())
           << "; an HDF5 or other binary file?)";
    throw ConfigError(source, "", reason.str());
  }
  // Results and reports carry the config's text, and they are UTF-8.
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
    const std::size_t line_start = text.rfind('\n', bad == 0 ? 0 : bad - 1);
    const std::size_t column = line_start == std::string::npos || bad == 0 ? bad + 1 : bad - line_start;
    std::ostringstream reason;
    reason << "is not UTF-8 text (byte 0x" << std::hex << std::setw(2) << std::setfill('0')
           << static_cast<int>(static_cast<unsigned char>(text[bad])) << std::dec << " at line "
           << 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n') << ", byte "
           << column << " of the line); save it as UTF-8";
    throw ConfigError(source, "", reason.str());
  }
  try {
    // YAML::Load reads the first document and drops the rest silently.
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    if (documents.size() > 1)
      throw ConfigError(source, "", "holds " + std::to_string(documents.size()) +
                                        " YAML documents (separated by ---); a config is one");
    YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
    ConfigNode node(root, "", name, std::make_shared<const std::string>(text));
    if (!root.IsMap()) throw ConfigError(source, "", "expected a mapping at the top level, got " + describe(root));
    if (const auto duplicate = duplicate_key(root)) throw ConfigError(source, "", *duplicate);
    return node;
  } catch (const YAML::ParserException& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1), "",
                      "malformed YAML: " + e.msg);
  }
}

std::string ConfigNode::child_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void ConfigNode::fail(const std::string& reason) const { throw ConfigError(*source_, path_, reason); }
void ConfigNode::fail(const std::string& key, const std::string& reason) const {
  throw ConfigError(*source_, child_path(key), reason);
}

void ConfigNode::require_mapping() const {
  if (!node_.IsMap()) fail("expected a mapping, got " + describe(node_));
}

bool ConfigNode::has(const std::string& key) const {
  require_mapping();
  return static_cast<bool>(node_[key]);
}

YAML::Node ConfigNode::required(const std::string& key) const {
  require_mapping();
  YAML::Node value = node_[key];
  if (!value || value.IsNull()) fail(key, "is required");
  return value;
}

ConfigNode ConfigNode::child(const std::string& key) const {
  return ConfigNode(required(key), child_path(key), source_, text_);
}

std::optional<ConfigNode> ConfigNode::optional_child(const std::string& key) const {
  if (!has(key) || node_[key].IsNull()) return std::nullopt;
  return child(key);
}

std::vector<ConfigNode> ConfigNode::elements(const std::string& key) const {
  const YAML::Node list = required(key);
  if (!list.IsSequence()) fail(key, "expected a list, got " + describe(list));
  if (list.size() == 0) fail(key, "must not be empty");
  std::vector<ConfigNode> out;
  for (std::size_t i = 0; i < list.size(); ++i)
    out.push_back(ConfigNode(list[i], child_path(key) + "[" + std::to_string(i) + "]", source_, text_));
  return out;
}

namespace {
/// A string by its writer's word: quoted ("64", '7') or tagged (!!str 64).
bool string_scalar(const YAML::Node& node) {
  return node.IsScalar() && (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str");
}
}  // namespace

template <class T>
T ConfigNode::as() const {
  if (!node_.IsScalar()) fail("expected " + expected_value<T>(node_) + ", got " + describe(node_));
  // A quoted or tagged scalar is a string ("64" in JSON, '7' or !!str 7 in YAML), never a number or a truth value.
  if constexpr (!std::is_same_v<T, std::string>)
    if (string_scalar(node_)) fail(std::string("expected ") + type_name<T>() + ", got the string " + describe(node_));
  T value{};
  if (!YAML::convert<T>::decode(node_, value))
    fail("expected " + expected_value<T>(node_) + ", got " + describe(node_));
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(value)) fail("expected a finite number, got " + describe(node_));
  return value;
}

template <class T>
T ConfigNode::get(const std::string& key) const {
  return child(key).as<T>();
}

template <class T>
T ConfigNode::get_or(const std::string& key, T fallback) const {
  if (!has(key) || node_[key].IsNull()) return fallback;
  return get<T>(key);
}

template <class T>
std::vector<T> ConfigNode::get_list(const std::string& key) const {
  std::vector<T> out;
  for (const ConfigNode& element : elements(key)) out.push_back(element.as<T>());
  return out;
}

std::int64_t ConfigNode::as_integer(std::int64_t least, std::int64_t most, const std::string& range_note) const {
  const std::string range =
      "[" + std::to_string(least) + ", " + std::to_string(most) + "]" + (range_note.empty() ? "" : " (" + range_note + ")");
  if (string_scalar(node_))
    fail("expected an integer in " + range + ", got the string " + describe(node_));
  // Decimal digits only: YAML's reader takes 010 as octal 8 and 0x10 as 16.
  if (!integer_text(node_)) fail("expected an integer in " + range + ", got " + describe(node_));
  const std::string& text = node_.Scalar();
  const std::size_t digits = text[0] == '+' ? 1 : 0;
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data() + digits, text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) fail("must be in " + range + ", got " + describe(node_));
  if (value < least || value > most) fail("must be in " + range + ", got " + std::to_string(value));
  return value;
}

std::int64_t ConfigNode::get_integer(const std::string& key, std::int64_t least, std::int64_t most,
                                     const std::string& range_note) const {
  return child(key).as_integer(least, most, range_note);
}

std::int64_t ConfigNode::get_integer_or(const std::string& key, std::int64_t fallback, std::int64_t least,
                                        std::int64_t most, const std::string& range_note) const {
  if (!has(key) || node_[key].IsNull()) return fallback;
  return get_integer(key, least, most, range_note);
}

std::vector<std::int64_t> ConfigNode::get_integer_list(const std::string& key, std::int64_t least,
                                                       std::int64_t most) const {
  std::vector<std::int64_t> out;
  for (const ConfigNode& element : elements(key)) out.push_back(element.as_integer(least, most));
  return out;
}

std::string ConfigNode::get_text(const std::string& key) const {
  const auto value = get<std::string>(key);
  if (std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isspace(c); }))
    fail(key, "must not be empty");
  // Names and paths go into log lines, report headings and file names.
  if (std::any_of(value.begin(), value.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
    fail(key, "must be one line of text without control characters (it holds a line break, tab or other)");
  return value;
}

std::string ConfigNode::get_choice(const std::string& key, std::initializer_list<std::string_view> choices) const {
  const auto value = get<std::string>(key);
  if (std::find(choices.begin(), choices.end(), value) == choices.end())
    fail(key, "must be one of " + join(choices) + "; got '" + value + "'");
  return value;
}

std::uint64_t ConfigNode::get_bytes(const std::string& key) const {
  const auto text = get<std::string>(key);
  const auto bytes = parse_byte_size(text);
  if (!bytes)
    fail(key, "expected a byte size such as 4096, 512MiB or 32GB; got '" + text + "': " + byte_size_problem(text));
  return *bytes;
}

std::vector<std::string> ConfigNode::keys() const {
  require_mapping();
  std::vector<std::string> names;
  for (const auto& entry : node_) {
    if (!entry.first.IsScalar())
      fail("expected a mapping with scalar keys, got a key that is " + describe(entry.first));
    names.push_back(entry.first.Scalar());
  }
  return names;
}

void ConfigNode::allow_only(std::initializer_list<std::string_view> known) const {
  for (const std::string& key : keys()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string_view closest;
    std::size_t best = std::numeric_limits<std::size_t>::max();
    for (auto candidate : known) {
      const std::size_t d = edit_distance(key, candidate);
      if (d < best) best = d, closest = candidate;
    }
    std::string reason = "unknown field";
    if (best <= 2) reason += " (did you mean '" + std::string(closest) + "'?)";
    else reason += " (known fields: " + join(known) + ")";
    fail(key, reason);
  }
}

#define WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(T)                        \
  template T ConfigNode::as<T>() const;                                   \
  template T ConfigNode::get<T>(const std::string&) const;                \
  template T ConfigNode::get_or<T>(const std::string&, T) const;          \
  template std::vector<T> ConfigNode::get_list<T>(const std::string&) const;

WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(bool)
WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(int)
WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(long)
WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(unsigned long)
WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(double)
WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS(std::string)
#undef WRITESCOPE_INSTANTIATE_CONFIG_ACCESSORS

}  // namespace writescope
