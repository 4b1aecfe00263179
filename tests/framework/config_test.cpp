#include "framework/config.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace writescope {
namespace {

/// Runs `body`, requires a ConfigError, returns it for inspection.
template <class Body>
ConfigError expect_config_error(Body&& body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return ConfigError("", "", "");
}

const char* const sample = R"(
name: quick
seed: 7
ratio: 0.25
enabled: true
vram_budget: 32GiB
context_lengths: [8192, 32768]
models:
  - name: qwen3-30b-a3b
    layers: 4
  - name: mixtral-8x7b
    layers: two
)";

TEST(Config, ReadsTypedScalarsListsAndNestedNodes) {
  const auto config = ConfigNode::parse(sample, "sample.yaml");
  EXPECT_EQ(config.get<std::string>("name"), "quick");
  EXPECT_EQ(config.get<long>("seed"), 7);
  EXPECT_DOUBLE_EQ(config.get<double>("ratio"), 0.25);
  EXPECT_TRUE(config.get<bool>("enabled"));
  EXPECT_EQ(config.get_bytes("vram_budget"), 32ull << 30);
  EXPECT_EQ(config.get_list<long>("context_lengths"), (std::vector<long>{8192, 32768}));
  EXPECT_EQ(config.get_or<int>("absent", 42), 42);
  const auto models = config.elements("models");
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].path(), "models[0]");
  EXPECT_EQ(models[0].get<int>("layers"), 4);
}

TEST(Config, WrongTypeNamesFieldPathAndValue) {
  const auto config = ConfigNode::parse(sample, "sample.yaml");
  const auto models = config.elements("models");
  const auto e = expect_config_error([&] { models[1].get<int>("layers"); });
  EXPECT_EQ(e.source(), "sample.yaml");
  EXPECT_EQ(e.field(), "models[1].layers");
  EXPECT_EQ(e.reason(), "expected an integer, got 'two'");
  EXPECT_STREQ(e.what(), "sample.yaml: field 'models[1].layers': expected an integer, got 'two'");
}

TEST(Config, MissingFieldIsRequired) {
  const auto config = ConfigNode::parse(sample, "sample.yaml");
  const auto e = expect_config_error([&] { config.get<std::string>("output"); });
  EXPECT_EQ(e.field(), "output");
  EXPECT_EQ(e.reason(), "is required");
}

TEST(Config, NegativeValueIsNotUnsigned) {
  const auto config = ConfigNode::parse("steps: -3\n", "c.yaml");
  const auto e = expect_config_error([&] { config.get<unsigned long>("steps"); });
  EXPECT_EQ(e.reason(), "expected a non-negative integer, got '-3'");
}

// A name or path is one line: a YAML escape could put a line break into
// the log lines and report headings it goes into.
TEST(Config, TextIsOneLine) {
  const auto config = ConfigNode::parse("name: \"a\\nb\"\ntabbed: \"a\\tb\"\nblank: \"  \"\nplain: a b\n", "c.yaml");
  EXPECT_EQ(config.get_text("plain"), "a b");
  for (const char* key : {"name", "tabbed"}) {
    const auto e = expect_config_error([&] { config.get_text(key); });
    EXPECT_EQ(e.field(), key);
    EXPECT_EQ(e.reason(), "must be one line of text without control characters (it holds a line break, tab or other)");
  }
  EXPECT_EQ(expect_config_error([&] { config.get_text("blank"); }).reason(), "must not be empty");
}

TEST(Config, ListsAreCheckedElementByElement) {
  const auto config = ConfigNode::parse("lengths: [1024, big, 4096]\nempty: []\nscalar: 3\n", "c.yaml");
  auto e = expect_config_error([&] { config.get_list<long>("lengths"); });
  EXPECT_EQ(e.field(), "lengths[1]");
  e = expect_config_error([&] { config.get_list<long>("empty"); });
  EXPECT_EQ(e.reason(), "must not be empty");
  e = expect_config_error([&] { config.get_list<long>("scalar"); });
  EXPECT_EQ(e.reason(), "expected a list, got '3'");
  e = expect_config_error([&] { config.get<long>("lengths"); });
  EXPECT_EQ(e.reason(), "expected an integer, got a list");
}

TEST(Config, ChoicesListTheAllowedValues) {
  const auto config = ConfigNode::parse("system: writescop\n", "c.yaml");
  const auto e = expect_config_error([&] { config.get_choice("system", {"writescope", "fiddler", "gpu-only"}); });
  EXPECT_EQ(e.reason(), "must be one of writescope, fiddler, gpu-only; got 'writescop'");
}

TEST(Config, UnknownKeysAreRejectedWithASuggestion) {
  const auto config = ConfigNode::parse("seed: 1\nrepetitons: 3\n", "c.yaml");
  auto e = expect_config_error([&] { config.allow_only({"seed", "repetitions", "output"}); });
  EXPECT_EQ(e.field(), "repetitons");
  EXPECT_EQ(e.reason(), "unknown field (did you mean 'repetitions'?)");
  const auto far = ConfigNode::parse("zzzzzz: 1\n", "c.yaml");
  e = expect_config_error([&] { far.allow_only({"seed", "output"}); });
  EXPECT_EQ(e.reason(), "unknown field (known fields: seed, output)");
  EXPECT_NO_THROW(config.allow_only({"seed", "repetitons"}));
  // A key that is not a name: the error says so, not yaml-cpp's conversion message.
  const auto list_key = ConfigNode::parse("budgets: {[vram, host]: 1GiB}\n", "c.yaml").child("budgets");
  e = expect_config_error([&] { list_key.allow_only({"vram", "host"}); });
  EXPECT_EQ(e.field(), "budgets");
  EXPECT_EQ(e.reason(), "expected a mapping with scalar keys, got a key that is a list");
}

TEST(Config, MalformedYamlGivesLineAndColumn) {
  const auto e = expect_config_error([] { ConfigNode::parse("a: 1\nb: [1, 2\n", "broken.yaml"); });
  EXPECT_EQ(e.source().rfind("broken.yaml:", 0), 0u) << e.source();
  EXPECT_NE(e.reason().find("malformed YAML"), std::string::npos);
}

TEST(Config, TopLevelMustBeAMapping) {
  const auto e = expect_config_error([] { ConfigNode::parse("- 1\n- 2\n", "list.yaml"); });
  EXPECT_EQ(e.reason(), "expected a mapping at the top level, got a list");
}

// Aliases (*name) are walked where they are used: nine lines of ten each
// stand for 10^9 values, which took minutes before the config's first error.
// Past max_yaml_values the document is that error; aliases below it read.
TEST(Config, AliasesThatExpandPastTheValueLimitAreOneError) {
  std::string bomb = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int level = 1; level < 9; ++level) {
    const std::string previous = "*a" + std::to_string(level - 1);
    bomb += "a" + std::to_string(level) + ": &a" + std::to_string(level) + " [" + previous;
    for (int i = 1; i < 10; ++i) bomb += ", " + previous;
    bomb += "]\n";
  }
  const auto e = expect_config_error([&] { ConfigNode::parse(bomb, "bomb.yaml"); });
  EXPECT_EQ(e.reason(), "holds more than " + std::to_string(max_yaml_values) +
                            " values with its aliases (*name) expanded; write the values out, or fewer");
  const auto few = ConfigNode::parse("base: &base {layers: 2}\nmodels: [*base, *base]\n", "aliases.yaml");
  EXPECT_EQ(few.child("base").get<int>("layers"), 2);
}

TEST(Config, UnreadableFileIsNamed) {
  const auto e = expect_config_error([] { ConfigNode::load_file("/nonexistent/writescope.yaml"); });
  EXPECT_EQ(e.source(), "/nonexistent/writescope.yaml");
  EXPECT_EQ(e.reason(), "cannot open the file for reading");
}

TEST(Config, ADuplicateKeyIsAnErrorNotFirstValueWins) {
  const auto top = expect_config_error([] { ConfigNode::parse("seed: 1\nsteps: 4\nseed: 2\n", "dup.yaml"); });
  EXPECT_EQ(top.reason(), "key 'seed' (line 3) appears twice in one mapping");
  const auto nested = expect_config_error(
      [] { ConfigNode::parse("models:\n  - name: a\n    layers: 2\n    layers: 3\n", "dup.yaml"); });
  EXPECT_EQ(nested.reason(), "key 'models[0].layers' (line 4) appears twice in one mapping");
  // JSON (config.json) goes through the same parser.
  const auto json = expect_config_error([] { ConfigNode::parse(R"({"a": {"b": 1, "b": 1}})", "config.json"); });
  EXPECT_EQ(json.reason(), "key 'a.b' (line 1) appears twice in one mapping");
  // The same key in two different mappings is fine.
  EXPECT_EQ(ConfigNode::parse("a: {x: 1}\nb: {x: 2}\n", "ok.yaml").child("b").get<int>("x"), 2);
}

// YAML::Load would read the first document and drop the rest: a second
// document (a pasted config, a forgotten edit after ---) is an error.
TEST(Config, ASecondDocumentIsAnErrorNotDropped) {
  const auto two = expect_config_error([] { ConfigNode::parse("seed: 1\n---\nseed: 9\n", "two.yaml"); });
  EXPECT_EQ(two.reason(), "holds 2 YAML documents (separated by ---); a config is one");
  EXPECT_EQ(ConfigNode::parse("---\nseed: 1\n", "one.yaml").get<int>("seed"), 1);
  const auto empty = expect_config_error([] { ConfigNode::parse("", "empty.yaml"); });
  EXPECT_NE(empty.reason().find("expected a mapping at the top level"), std::string::npos) << empty.reason();
}

TEST(Config, NumbersOutsideTheirTypesRangeAreErrors) {
  const auto config = ConfigNode::parse("layers: 4294967297\nbig: 1e400\nnan: .nan\nfine: 2147483647\n", "c.yaml");
  EXPECT_EQ(expect_config_error([&] { config.get<int>("layers"); }).reason(),
            "expected an integer in [-2147483648, 2147483647], got '4294967297'");
  EXPECT_EQ(config.get<long>("layers"), 4294967297L);
  EXPECT_EQ(expect_config_error([&] { config.get<double>("big"); }).reason(), "expected a number, got '1e400'");
  EXPECT_EQ(expect_config_error([&] { config.get<double>("nan"); }).reason(), "expected a finite number, got '.nan'");
  EXPECT_EQ(config.get<int>("fine"), 2147483647);
}

// A field's own range, not its C++ type's, whatever the number's size.
TEST(Config, BoundedIntegersNameTheFieldsRange) {
  const auto config = ConfigNode::parse(
      "steps: 12\nlow: 0\nhigh: 4294967297\nhuge: 99999999999999999999\nword: many\nfraction: 2.5\n"
      "list: [1, 2, 70000]\n",
      "c.yaml");
  EXPECT_EQ(config.get_integer("steps", 1, 12), 12);
  EXPECT_EQ(config.get_integer_or("absent", 7, 1, 4), 7);
  EXPECT_EQ(expect_config_error([&] { config.get_integer("low", 1, 12); }).reason(), "must be in [1, 12], got 0");
  EXPECT_EQ(expect_config_error([&] { config.get_integer("high", 1, 12, "the preset's layers"); }).reason(),
            "must be in [1, 12] (the preset's layers), got 4294967297");
  EXPECT_EQ(expect_config_error([&] { config.get_integer_or("huge", 1, 1, 12); }).reason(),
            "must be in [1, 12], got '99999999999999999999'");
  EXPECT_EQ(expect_config_error([&] { config.get_integer("word", 1, 12); }).reason(),
            "expected an integer in [1, 12], got 'many'");
  EXPECT_EQ(expect_config_error([&] { config.get_integer("fraction", 1, 12); }).reason(),
            "expected an integer in [1, 12], got '2.5'");
  EXPECT_EQ(config.get_integer_list("list", 1, 70000), (std::vector<std::int64_t>{1, 2, 70000}));
  // Decimal only: a leading zero is not octal, and hexadecimal is no integer here.
  const auto spelled = ConfigNode::parse("zero: 010\nplus: +16\nhex: 0x10\nminus: -5\n", "c.yaml");
  EXPECT_EQ(spelled.get_integer("zero", 1, 100), 10);
  EXPECT_EQ(spelled.get_integer("plus", 1, 100), 16);
  EXPECT_EQ(spelled.get_integer("minus", -9, 0), -5);
  EXPECT_EQ(expect_config_error([&] { spelled.get_integer("hex", 1, 100); }).reason(),
            "expected an integer in [1, 100], got '0x10'");
  const auto e = expect_config_error([&] { config.get_integer_list("list", 1, 65536); });
  EXPECT_EQ(e.field(), "list[2]");
  EXPECT_EQ(e.reason(), "must be in [1, 65536], got 70000");
}

// JSON's "64" and YAML's '7' are strings: a config.json of quoted numbers is
// refused, not read as numbers.
TEST(Config, QuotedScalarsAreStrings) {
  const auto config = ConfigNode::parse("{\"hidden_size\": \"64\", \"norm\": \"yes\", \"seed\": '7', \"name\": \"64\"}",
                                        "config.json");
  EXPECT_EQ(expect_config_error([&] { config.get<int>("hidden_size"); }).reason(),
            "expected an integer, got the string '64'");
  EXPECT_EQ(expect_config_error([&] { config.get<bool>("norm"); }).reason(),
            "expected true or false, got the string 'yes'");
  EXPECT_EQ(expect_config_error([&] { config.get_integer("seed", 0, 9); }).reason(),
            "expected an integer in [0, 9], got the string '7'");
  EXPECT_EQ(config.get<std::string>("name"), "64");
  // So is a scalar tagged as one.
  const auto tagged = ConfigNode::parse("contexts: [!!str 512, 1024]\nlayers: !!str 2\n", "experiment.yaml");
  EXPECT_EQ(expect_config_error([&] { tagged.get_integer_list("contexts", 1, 4096); }).reason(),
            "expected an integer in [1, 4096], got the string '512'");
  EXPECT_EQ(expect_config_error([&] { tagged.get<int>("layers"); }).reason(), "expected an integer, got the string '2'");
}

TEST(Config, ABinaryFileIsNotAConfigFile) {
  const std::string hdf5_signature("\x89HDF\r\n\x1a\n\0\0", 10);
  EXPECT_EQ(expect_config_error([&] { ConfigNode::parse(hdf5_signature, "results.h5"); }).reason(),
            "is not a text file (control byte 0x1a at offset 6; an HDF5 or other binary file?)");
  EXPECT_EQ(ConfigNode::parse("a: 1\r\nb:\t2\n", "crlf.yaml").get<int>("b"), 2);
}

// A config in Latin-1 (or with a stray byte) is refused where it is read:
// runs and reports carry its text, which must be UTF-8.
TEST(Config, TextThatIsNotUtf8IsNotAConfigFile) {
  EXPECT_EQ(expect_config_error([] { ConfigNode::parse("a: 1\n# Ren\xe9\nb: 2\n", "latin1.yaml"); }).reason(),
            "is not UTF-8 text (byte 0xe9 at line 2, byte 6 of the line); save it as UTF-8");
  EXPECT_EQ(expect_config_error([] { ConfigNode::parse("\xc0\xaf: 1\n", "overlong.yaml"); }).reason(),
            "is not UTF-8 text (byte 0xc0 at line 1, byte 1 of the line); save it as UTF-8");
  for (const char* bad : {"name: \xed\xa0\x80\n", "name: \xf4\x90\x80\x80\n", "name: \xe2\x82\n"})
    EXPECT_NE(expect_config_error([&] { ConfigNode::parse(bad, "bad.yaml"); }).reason().find("is not UTF-8 text"),
              std::string::npos)
        << bad;
  // Two-, three- and four-byte characters are text.
  EXPECT_EQ(ConfigNode::parse("name: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n", "utf8.yaml").get<std::string>("name"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(Config, AFolderIsNotAConfigFile) {
  const auto e = expect_config_error([] { ConfigNode::load_file(::testing::TempDir()); });
  EXPECT_EQ(e.reason(), "is a directory, not a config file");
}

TEST(Config, LoadsFromFile) {
  const std::string path = ::testing::TempDir() + "writescope_config_test.yaml";
  std::ofstream(path) << "steps: 12\n";
  EXPECT_EQ(ConfigNode::load_file(path).get<int>("steps"), 12);
  std::remove(path.c_str());
}

TEST(Config, CallerRangeChecksUseTheSamePath) {
  const auto config = ConfigNode::parse("model: {layers: 0}\n", "c.yaml");
  const auto model = config.child("model");
  const auto e = expect_config_error([&] {
    if (model.get<int>("layers") < 1) model.fail("layers", "must be at least 1");
  });
  EXPECT_STREQ(e.what(), "c.yaml: field 'model.layers': must be at least 1");
}

TEST(ByteSize, ParsesBinaryAndDecimalSuffixes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("32GiB"), 32ull << 30);
  EXPECT_EQ(parse_byte_size("32 gb"), 32'000'000'000ull);
  EXPECT_EQ(parse_byte_size("1.5 MiB"), 3ull << 19);
  EXPECT_EQ(parse_byte_size("64k"), 65536u);
  EXPECT_EQ(parse_byte_size("2T"), 2ull << 40);
  EXPECT_EQ(parse_byte_size(" 2e9 "), 2'000'000'000ull);
  EXPECT_EQ(parse_byte_size("3E+3 KiB"), 3000ull << 10);
}

TEST(ByteSize, FormatsWhatItParses) {
  EXPECT_EQ(format_byte_size(32ull << 30), "32GiB");
  EXPECT_EQ(format_byte_size(256ull << 20), "256MiB");
  EXPECT_EQ(format_byte_size(64ull << 10), "64KiB");
  EXPECT_EQ(format_byte_size(338475776), "322.8MiB");
  EXPECT_EQ(format_byte_size(300), "300B");
  for (std::uint64_t bytes : {32ull << 30, 256ull << 20, 3ull << 19, 300ull, 0ull})
    EXPECT_EQ(parse_byte_size(format_byte_size(bytes)), bytes) << bytes;
  // What a message prints, a user may copy into a config: it reads back to the printed digit.
  for (std::uint64_t bytes : {338475776ull, 1363149ull, 1500ull, (5ull << 30) + 12345})
    EXPECT_NEAR(static_cast<double>(parse_byte_size(format_byte_size(bytes)).value()), static_cast<double>(bytes),
                0.05 * (bytes >= (1ull << 30) ? 1 << 30 : bytes >= (1ull << 20) ? 1 << 20 : 1 << 10))
        << format_byte_size(bytes);
  EXPECT_EQ(parse_byte_size("1.3MiB"), 1363149u);  // 1363148.8 bytes, rounded
}

TEST(ByteSize, RejectsMalformedValues) {
  // Spaces inside the number or unit and hexadecimal are not sizes ("2 9 0 0 KiB" read as 2900KiB).
  for (const char* bad : {"", "-1", "+5", "GiB", "12 parsecs", "0.5", "1e30", "nan", "inf GB", "2 9 0 0 KiB",
                          "0x2f0000", "1 G iB", "1..5GiB", ".5GiB", "5.GiB", "1e", "1e+GiB"})
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << bad;
}

TEST(ByteSize, SaysWhyATextIsNoSize) {
  EXPECT_EQ(byte_size_problem("32GiB"), "");
  EXPECT_EQ(byte_size_problem("1e30"), "2^64 bytes or more");
  EXPECT_EQ(byte_size_problem("20000000TiB"), "2^64 bytes or more");
  EXPECT_EQ(byte_size_problem("1.5"), "a fraction of a byte");
  EXPECT_EQ(byte_size_problem("-1"), "a size is not negative");
  EXPECT_EQ(byte_size_problem("GiB"), "it does not start with a number");
  EXPECT_EQ(byte_size_problem("5.GiB"), "no digit after the decimal point");
  EXPECT_EQ(byte_size_problem("12 GiBB").rfind("unknown unit 'GiBB' (B, KiB", 0), 0u) << byte_size_problem("12 GiBB");
  // A config's field says it after the value.
  const ConfigNode root = ConfigNode::parse("host: 1e30\n", "c.yaml");
  const auto e = expect_config_error([&] { root.get_bytes("host"); });
  EXPECT_STREQ(e.what(),
               "c.yaml: field 'host': expected a byte size such as 4096, 512MiB or 32GB; got '1e30': 2^64 bytes or more");
}

}  // namespace
}  // namespace writescope
