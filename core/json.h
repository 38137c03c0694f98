#pragma once
// A small, strict JSON reader and the one writer helper the safetensors header
// needs. Strict means RFC 8259 and nothing more: no comments, no trailing commas,
// no NaN, strings must be valid UTF-8, and (beyond the RFC, which leaves it open)
// an object may not repeat a key. Input comes from files we do not trust, so the
// parser never reads past the text it is given and limits how deeply values nest.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace frugal::json {

struct Member;

/// One parsed JSON value. Objects keep their members in document order; numbers keep
/// the literal as written, so integers of any size are read exactly (see as_uint64).
struct Value {
  enum class Type : uint8_t { Null, Bool, Number, String, Array, Object };

  Type type = Type::Null;
  bool boolean = false;         // Bool
  std::string text;             // String: decoded UTF-8; Number: the literal
  std::vector<Value> items;     // Array
  std::vector<Member> members;  // Object, in document order, keys unique

  bool is_string() const { return type == Type::String; }
  bool is_array() const { return type == Type::Array; }
  bool is_object() const { return type == Type::Object; }
  /// The number when it is a non-negative integer literal (no sign, fraction or
  /// exponent) that fits in 64 bits; nullopt otherwise.
  std::optional<uint64_t> as_uint64() const;
  /// The number as the nearest double (+-HUGE_VAL beyond its range), read the same in every
  /// locale (std::from_chars: strtod under a "de_DE" locale reads 0.1 as 0).
  std::optional<double> as_double() const;
  /// The member named `key` of an object, or nullptr.
  const Value* find(std::string_view key) const;
};

/// One member of an object.
struct Member {
  std::string key;
  Value value;
};

/// "null", "boolean", "number", "string", "array" or "object", for error messages.
const char* type_name(Value::Type type);

inline constexpr int kDefaultMaxDepth = 64;
/// The most values one document may hold (~90 MB of Values; a safetensors header of 100k
/// tensors holds 800k).
inline constexpr uint64_t kMaxValues = uint64_t(1) << 20;

/// Parses one JSON document. Whitespace may surround it; anything else after it is an
/// error. Nesting deeper than `max_depth` arrays/objects is rejected (the parser is
/// recursive). Throws frugal::Error "JSON: <what> at byte <offset> (line L, column C)";
/// offsets count from `first_byte`, where the text starts in its file (lines and columns
/// count within the text). The caller that read a file adds its path.
Value parse(std::string_view text, int max_depth = kDefaultMaxDepth, uint64_t first_byte = 0);

/// `s` as a JSON string literal, escaped exactly as serde_json (the writer behind the
/// Python safetensors library) escapes: `"` and `\`, \b \t \n \f \r, other control
/// characters as \u00XX; everything else, UTF-8 included, verbatim.
std::string quote(std::string_view s);

}  // namespace frugal::json
