#pragma once
// JSON syntax (RFC 8259) checked before a JSON file is read with the YAML
// reader: YAML is a superset of JSON, so a config.json or safetensors header
// with comments, trailing commas, unquoted keys or hexadecimal numbers would
// otherwise be read as something the file's writer did not mean.

#include <string>
#include <string_view>

namespace writescope {

/// "" where `text` is one JSON value (with whitespace around it), else where
/// and why it is not: "line 3, column 14: a trailing comma before '}'".
std::string json_syntax_error(std::string_view text);

}  // namespace writescope
