#pragma once
// Validated access to YAML configuration files.
//
// Every accessor knows the dotted path of the value it reads (e.g.
// "models[1].context_lengths[0]"), so any problem is reported as one
// ConfigError that names the file, the field and the reason.

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace writescope {

class ConfigError : public std::runtime_error {
 public:
  /// `field` is the dotted path of the offending value ("" for the whole document).
  ConfigError(std::string source, std::string field, std::string reason);
  const std::string& source() const noexcept { return source_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string source_, field_, reason_;
};

/// Parses "4096", "32GiB", "1.5 GB", "512 MiB", "64k" into bytes (binary
/// suffixes are powers of 1024, decimal ones powers of 1000; a fraction of a
/// unit is rounded to the nearest byte). Returns nothing for malformed,
/// negative, overflowing or fractional-byte text.
std::optional<std::uint64_t> parse_byte_size(std::string_view text);
/// Why parse_byte_size returns nothing for `text` ("2^64 bytes or more", "a
/// fraction of a byte", "unknown unit 'GiBB' (...)", ...); empty where it parses.
std::string byte_size_problem(std::string_view text);
/// Bytes for messages: "512B", "32GiB", "256MiB", or one decimal ("322.8MiB")
/// when not a whole number of the unit; parse_byte_size reads it back (to
/// the printed digit).
std::string format_byte_size(std::uint64_t bytes);

/// Values a config, profile or checkpoint header may hold, counted with its
/// YAML aliases expanded (a safetensors index of the largest models: about 10^5).
inline constexpr std::size_t max_yaml_values = 10'000'000;

/// Describes the first key given twice in one mapping of `root` (YAML keeps
/// both and lookups see the first: a silent "first value wins"), or a
/// document past max_yaml_values values (ten lines of aliases can stand for
/// 10^9, which every walk of it would take minutes over); nothing if neither.
std::optional<std::string> duplicate_key(const YAML::Node& root);

class ConfigNode {
 public:
  /// Throws ConfigError if the file cannot be read or is not valid YAML.
  static ConfigNode load_file(const std::string& path);
  /// A JSON file (config.json): its syntax checked as JSON first, since the
  /// YAML reader would take comments, trailing commas or `key: value` lines.
  static ConfigNode load_json_file(const std::string& path);
  /// `source` names the text in error messages (e.g. "<command line>").
  static ConfigNode parse(const std::string& text, const std::string& source);

  const std::string& path() const noexcept { return path_; }
  const std::string& source() const noexcept { return *source_; }
  /// The whole document's text as read (comments included).
  const std::string& text() const noexcept { return *text_; }
  bool has(const std::string& key) const;

  /// Required mapping or sequence child.
  ConfigNode child(const std::string& key) const;
  std::optional<ConfigNode> optional_child(const std::string& key) const;
  /// Elements of a required sequence child (an empty sequence is an error).
  std::vector<ConfigNode> elements(const std::string& key) const;

  /// Required scalar child converted to T (bool, integers, double, std::string).
  template <class T>
  T get(const std::string& key) const;
  template <class T>
  T get_or(const std::string& key, T fallback) const;
  /// Required non-empty sequence of scalars.
  template <class T>
  std::vector<T> get_list(const std::string& key) const;
  /// This node itself as a scalar T.
  template <class T>
  T as() const;

  /// Required integer child in [least, most], written in decimal digits
  /// (an optional sign; never YAML's octal or hexadecimal); `range_note`
  /// (e.g. "the preset's layers") follows the range in the error. Any number
  /// outside, even one past every integer type's range, is refused with it.
  std::int64_t get_integer(const std::string& key, std::int64_t least, std::int64_t most,
                           const std::string& range_note = {}) const;
  /// get_integer, or `fallback` where the child is absent or null.
  std::int64_t get_integer_or(const std::string& key, std::int64_t fallback, std::int64_t least, std::int64_t most,
                              const std::string& range_note = {}) const;
  /// Required non-empty sequence of integers, each in [least, most].
  std::vector<std::int64_t> get_integer_list(const std::string& key, std::int64_t least, std::int64_t most) const;
  /// This node itself as an integer in [least, most].
  std::int64_t as_integer(std::int64_t least, std::int64_t most, const std::string& range_note = {}) const;

  /// Required string with a character other than whitespace and no control
  /// character (a name, a path: one line).
  std::string get_text(const std::string& key) const;
  /// Required string that must be one of `choices`.
  std::string get_choice(const std::string& key, std::initializer_list<std::string_view> choices) const;
  /// Required byte size ("32GiB", "4096", ...), see parse_byte_size.
  std::uint64_t get_bytes(const std::string& key) const;

  /// The keys of this mapping, in order; ConfigError where this is not a
  /// mapping or a key is not a scalar.
  std::vector<std::string> keys() const;
  /// Throws for any key of this mapping not in `known` (catches typos).
  void allow_only(std::initializer_list<std::string_view> known) const;

  /// A ConfigError about this node (or its child `key`), for range checks
  /// that callers perform themselves.
  [[noreturn]] void fail(const std::string& reason) const;
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const;

  const YAML::Node& yaml() const noexcept { return node_; }

 private:
  ConfigNode(YAML::Node node, std::string path, std::shared_ptr<const std::string> source,
             std::shared_ptr<const std::string> text);
  std::string child_path(const std::string& key) const;
  YAML::Node required(const std::string& key) const;
  void require_mapping() const;

  YAML::Node node_;
  std::string path_;
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const std::string> text_;
};

}  // namespace writescope
