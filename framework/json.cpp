#include "framework/json.hpp"

#include <cctype>
#include <cstdio>

namespace writescope {
namespace {

/// A recursive-descent check of one JSON value; the first error ends it.
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view text) : text_(text) {}

  std::string check() {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") at_ = 3;  // a UTF-8 byte order mark, which readers skip
    skip_space();
    value(0);
    skip_space();
    if (error_.empty() && at_ < text_.size()) fail("text after the JSON value");
    return error_;
  }

 private:
  // Nesting beyond this is refused rather than recursed into.
  static constexpr int deepest = 512;

  bool failed() const { return !error_.empty(); }
  bool at_end() const { return at_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[at_]; }

  void fail(const std::string& why) {
    if (failed()) return;
    int line = 1, column = 1;
    for (std::size_t i = 0; i < at_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    error_ = "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + why;
  }

  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }

  void value(int depth) {
    if (depth > deepest) return fail("nested deeper than " + std::to_string(deepest) + " levels");
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return string();
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default:
        if (at_end()) return fail("the text ends where a value should be");
        if (peek() == '-' || std::isdigit(static_cast<unsigned char>(peek()))) return number();
        if (peek() == '/' || peek() == '#') return fail("a comment (JSON has none)");
        if (!std::isprint(static_cast<unsigned char>(peek()))) {
          char byte[8];
          std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(peek()));
          return fail(std::string("byte ") + byte + " where a value should be");
        }
        return fail(std::string("'") + peek() + "' where a value should be (strings are in double quotes)");
    }
  }

  void object(int depth) {
    ++at_;  // '{'
    skip_space();
    if (peek() == '}') {
      ++at_;
      return;
    }
    for (;;) {
      if (at_end()) return fail("the text ends inside an object");
      if (peek() == '/' || peek() == '#') return fail("a comment (JSON has none)");
      if (peek() != '"') return fail(peek() == '}' ? "a trailing comma before '}'" : "an object key not in double quotes");
      string();
      if (failed()) return;
      skip_space();
      if (peek() != ':') return fail("':' expected after an object key");
      ++at_;
      skip_space();
      value(depth + 1);
      if (failed()) return;
      skip_space();
      if (peek() == '}') {
        ++at_;
        return;
      }
      if (peek() != ',') return fail("',' or '}' expected in an object");
      ++at_;
      skip_space();
    }
  }

  void array(int depth) {
    ++at_;  // '['
    skip_space();
    if (peek() == ']') {
      ++at_;
      return;
    }
    for (;;) {
      if (at_end()) return fail("the text ends inside an array");
      if (peek() == ']') return fail("a trailing comma before ']'");
      value(depth + 1);
      if (failed()) return;
      skip_space();
      if (peek() == ']') {
        ++at_;
        return;
      }
      if (peek() != ',') return fail("',' or ']' expected in an array");
      ++at_;
      skip_space();
    }
  }

  void string() {
    ++at_;  // '"'
    while (at_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[at_]);
      if (c == '"') {
        ++at_;
        return;
      }
      if (c < 0x20) return fail("a control character inside a string");
      if (c == '\\') {
        ++at_;
        const char escaped = peek();
        if (escaped == 'u') {
          for (int i = 1; i <= 4; ++i)
            if (!std::isxdigit(static_cast<unsigned char>(at_ + i < text_.size() ? text_[at_ + i] : '\0')))
              return fail("'\\u' needs four hexadecimal digits");
          at_ += 4;
        } else if (at_end() || std::string_view("\"\\/bfnrt").find(escaped) == std::string_view::npos) {
          return fail("an unknown escape in a string");
        }
      }
      ++at_;
    }
    fail("a string that does not end");
  }

  void digits() {
    while (std::isdigit(static_cast<unsigned char>(peek()))) ++at_;
  }

  void number() {
    if (peek() == '-') ++at_;
    if (peek() == '0') {
      ++at_;
      if (std::isdigit(static_cast<unsigned char>(peek()))) return fail("a number with a leading zero");
      if (peek() == 'x' || peek() == 'X') return fail("a hexadecimal number (JSON numbers are decimal)");
    } else if (std::isdigit(static_cast<unsigned char>(peek()))) {
      digits();
    } else {
      return fail("a '-' without digits");
    }
    if (peek() == '.') {
      ++at_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return fail("a '.' without digits after it");
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++at_;
      if (peek() == '+' || peek() == '-') ++at_;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) return fail("an exponent without digits");
      digits();
    }
  }

  void literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return fail("an unknown word (JSON has true, false and null)");
    at_ += word.size();
    if (std::isalnum(static_cast<unsigned char>(peek())) || peek() == '_')
      return fail("an unknown word (JSON has true, false and null)");
  }

  std::string_view text_;
  std::size_t at_ = 0;
  std::string error_;
};

}  // namespace

std::string json_syntax_error(std::string_view text) { return JsonChecker(text).check(); }

}  // namespace writescope
