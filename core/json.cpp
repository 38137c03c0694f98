#include "core/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/utf8.h"

namespace frugal::json {

namespace {

// Recursive descent over `text`. Every read goes through peek()/at_end(), which
// check the position against the end first: no input can make it read out of bounds.
class Parser {
 public:
  Parser(std::string_view text, int max_depth, uint64_t first_byte)
      : text_(text), max_depth_(max_depth), first_byte_(first_byte) {}

  Value document() {
    skip_space();
    Value v = value(0);
    skip_space();
    if (!at_end()) fail("unexpected '", printable(peek()), "' after the value");
    return v;
  }

 private:
  // Located at the failing check, not here (Note [Error locations]).
  template <typename... Args>
  [[noreturn]] void fail(ErrorSite first, const Args&... rest) const {
    const std::string_view before = text_.substr(0, std::min(pos_, text_.size()));
    const size_t line = 1 + size_t(std::count(before.begin(), before.end(), '\n'));
    const size_t newline = before.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    detail::throw_error(first, detail::str_cat("JSON: ", first.text, rest..., " at byte ", first_byte_ + pos_,
                                               " (line ", line, ", column ", pos_ - line_start + 1, ")"));
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) return std::string(1, c);
    static const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c) {
    if (at_end()) fail("expected '", c, "' but the text ended");
    if (peek() != c) fail("expected '", c, "' but found '", printable(peek()), "'");
    ++pos_;
  }

  Value value(int depth) {
    if (at_end()) fail("expected a value but the text ended");
    // Each Value is ~90 bytes: a 100 MB text of "[0,0,...]" would otherwise build 5 GB of them.
    if (++values_ > kMaxValues)
      fail("more than ", kMaxValues, " values (a JSON document frugal reads holds far fewer)");
    const char c = peek();
    if (c == '{' || c == '[') {
      if (depth >= max_depth_) fail("values nested deeper than ", max_depth_, " levels");
      return c == '{' ? object(depth + 1) : array(depth + 1);
    }
    Value v;
    if (c == '"') {
      v.type = Value::Type::String;
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = Value::Type::Number;
      v.text = number();
    } else if (literal("true")) {
      v.type = Value::Type::Bool;
      v.boolean = true;
    } else if (literal("false")) {
      v.type = Value::Type::Bool;
    } else if (!literal("null")) {
      fail("unexpected '", printable(c), "'");
    }
    return v;
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value object(int depth) {
    Value v;
    v.type = Value::Type::Object;
    std::vector<size_t> key_pos;  // where each key starts, for the duplicate-key message
    expect('{');
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      key_pos.push_back(pos_);
      std::string key = string();
      skip_space();
      expect(':');
      skip_space();
      v.members.push_back({std::move(key), value(depth)});
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      break;
    }
    // Duplicate keys: sort member indices by key and compare neighbours.
    std::vector<size_t> order(v.members.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v.members[a].key < v.members[b].key; });
    for (size_t i = 1; i < order.size(); ++i) {
      const std::string& key = v.members[order[i]].key;
      if (key == v.members[order[i - 1]].key) {
        pos_ = key_pos[std::max(order[i], order[i - 1])];  // the second occurrence
        fail("duplicate key ", quote(key));
      }
    }
    return v;
  }

  Value array(int depth) {
    Value v;
    v.type = Value::Type::Array;
    expect('[');
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      skip_space();
      v.items.push_back(value(depth));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  std::string number() {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      if (pos_ == from) fail("expected a digit in the number");
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') fail("leading zero in the number");
    } else {
      digits();
    }
    if (peek() == '.') {
      ++pos_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      if (at_end()) fail("the text ended inside a \\u escape");
      const char c = peek();
      unsigned d;
      if (c >= '0' && c <= '9') d = unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') d = unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = unsigned(c - 'A' + 10);
      else fail("bad hex digit '", printable(c), "' in a \\u escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  // Copies one well-formed UTF-8 sequence starting at pos_ (first byte >= 0x80), or fails.
  // Rejects overlong forms, surrogates (U+D800..U+DFFF) and code points above U+10FFFF.
  void utf8_sequence(std::string& out) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(text_[pos_ + i]); };
    const unsigned b0 = byte(0);
    unsigned lo, hi;  // allowed range of the second byte
    const size_t len = utf8_lead(b0, &lo, &hi);
    if (len == 0) fail("invalid UTF-8 byte ", printable(char(b0)), " in a string");
    if (text_.size() - pos_ < len) fail("truncated UTF-8 sequence in a string");
    for (size_t i = 1; i < len; ++i) {
      const unsigned b = byte(i);
      if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) fail("invalid UTF-8 sequence in a string");
    }
    out.append(text_.substr(pos_, len));
    pos_ += len;
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      const char c = peek();
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (u < 0x20) fail("unescaped control character ", printable(c), " in a string");
      if (u >= 0x80) {
        utf8_sequence(out);
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) fail("unterminated escape in a string");
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (!literal("\\u")) fail("high surrogate not followed by a low surrogate");
            const unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("invalid escape '\\", printable(e), "' in a string");
      }
    }
  }

  std::string_view text_;
  int max_depth_;
  uint64_t first_byte_;
  uint64_t values_ = 0;
  size_t pos_ = 0;
};

}  // namespace

std::optional<double> Value::as_double() const {
  if (type != Type::Number || text.empty()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) return text[0] == '-' ? -HUGE_VAL : HUGE_VAL;  // as strtod
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<uint64_t> Value::as_uint64() const {
  if (type != Type::Number || text.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;  // sign, fraction or exponent
    if (__builtin_mul_overflow(v, uint64_t(10), &v) || __builtin_add_overflow(v, uint64_t(c - '0'), &v))
      return std::nullopt;
  }
  return v;
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const char* type_name(Value::Type type) {
  switch (type) {
    case Value::Type::Null: return "null";
    case Value::Type::Bool: return "boolean";
    case Value::Type::Number: return "number";
    case Value::Type::String: return "string";
    case Value::Type::Array: return "array";
    case Value::Type::Object: return "object";
  }
  return "?";
}

Value parse(std::string_view text, int max_depth, uint64_t first_byte) {
  return Parser(text, max_depth, first_byte).document();
}

namespace {
/// The length of the well-formed UTF-8 sequence at s[i] (lead byte >= 0x80), or 0 when it is
/// not one (a stray continuation byte, a truncated or overlong sequence, a surrogate, > U+10FFFF).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = b(0);
  const size_t n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (n == 0 || lead > 0xF4 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  if (n == 3 && ((lead == 0xE0 && b(1) < 0xA0) || (lead == 0xED && b(1) >= 0xA0))) return 0;  // overlong, surrogate
  if (n == 4 && ((lead == 0xF0 && b(1) < 0x90) || (lead == 0xF4 && b(1) >= 0x90))) return 0;  // overlong, > U+10FFFF
  return n;
}
}  // namespace

std::string quote(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {  // JSON text is UTF-8: a byte that starts no valid sequence becomes U+FFFD
      const size_t n = utf8_sequence(s, i);
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out.append(s.substr(i, n));
        i += n - 1;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace frugal::json
