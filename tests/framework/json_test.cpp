#include "framework/json.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace writescope {
namespace {

TEST(JsonSyntax, TakesJson) {
  for (const char* text : {R"({"a": [1, -2.5e3, 0, true, false, null], "b": {"c": "\"\u00e9\n"}})", "  []\n", "3",
                           R"({"architectures": ["Qwen3MoeForCausalLM"], "rms_norm_eps": 1e-06})",
                           "\xEF\xBB\xBF{\"a\": 1}"})  // a byte order mark, as readers take it
    EXPECT_EQ(json_syntax_error(text), "") << text;
}

// What the YAML reader would take from a config.json or safetensors header
// that is not JSON: each named, with where.
TEST(JsonSyntax, NamesWhatIsNotJsonAndWhere) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"# comment\n{}", "line 1, column 1: a comment (JSON has none)"},
      {"{\"a\": 1,}", "line 1, column 9: a trailing comma before '}'"},
      {"[1, 2,]", "line 1, column 7: a trailing comma before ']'"},
      {"{a: 1}", "line 1, column 2: an object key not in double quotes"},
      {"hidden_size: 64", "line 1, column 1: 'h' where a value should be (strings are in double quotes)"},
      {"{\"n\": 0x40}", "line 1, column 8: a hexadecimal number (JSON numbers are decimal)"},
      {"{\"n\": 012}", "line 1, column 8: a number with a leading zero"},
      {"{\"tie\": True}", "line 1, column 9: 'T' where a value should be (strings are in double quotes)"},
      {"{\"tie\": no}", "line 1, column 9: an unknown word (JSON has true, false and null)"},
      {"{\"a\": 1}\n}", "line 2, column 1: text after the JSON value"},
      {"{\"a\": \"b", "line 1, column 9: a string that does not end"},
      {"{\"a\": 1", "line 1, column 8: ',' or '}' expected in an object"},
      {"", "line 1, column 1: the text ends where a value should be"},
      {"{\"a\": 'b'}", "line 1, column 7: ''' where a value should be (strings are in double quotes)"},
      {"[\"\\x\"]", "line 1, column 4: an unknown escape in a string"},
      {"{", "line 1, column 2: the text ends inside an object"},
      {"{\"a\": 1,\n  // mine\n  \"b\": 2}", "line 2, column 3: a comment (JSON has none)"},
      {"[1,", "line 1, column 4: the text ends inside an array"},
      {std::string("[\x01]"), "line 1, column 2: byte 0x01 where a value should be"},
      {std::string("[\0]", 3), "line 1, column 2: byte 0x00 where a value should be"},
  };
  for (const auto& [text, error] : cases) EXPECT_EQ(json_syntax_error(text), error) << text;
  EXPECT_EQ(json_syntax_error(std::string(600, '[') + std::string(600, ']')).find("nested deeper than 512"),
            std::string("line 1, column 514: ").size())
      << "deep nesting is refused, not recursed into";
}

}  // namespace
}  // namespace writescope
