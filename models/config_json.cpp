#include "models/config_json.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "memory/error.h"

namespace frugal::models {

json::Value read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FRUGAL_CHECK(in.good(), "read_json_file: cannot open '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  json::Value v = json::parse(text.str());
  FRUGAL_CHECK(v.is_object(), "read_json_file: '", path, "' holds a JSON ", json::type_name(v.type),
               ", expected an object");
  return v;
}

namespace {
const json::Value* member(const json::Value& config, std::string_view key, json::Value::Type type, const char* what) {
  const json::Value* v = config.find(key);
  if (!v || v->type == json::Value::Type::Null) return nullptr;
  FRUGAL_CHECK(v->type == type, what, " config: '", key, "' must be a ", json::type_name(type), ", got a ",
               json::type_name(v->type));
  return v;
}
}  // namespace

int64_t json_int(const json::Value& config, std::string_view key, int64_t fallback, const char* what) {
  const json::Value* v = member(config, key, json::Value::Type::Number, what);
  if (!v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v->text.c_str(), &end, 10);
  FRUGAL_CHECK(end && *end == '\0', what, " config: '", key, "' must be an integer, got ", v->text);
  return n;
}

double json_double(const json::Value& config, std::string_view key, double fallback, const char* what) {
  const json::Value* v = member(config, key, json::Value::Type::Number, what);
  return v ? std::strtod(v->text.c_str(), nullptr) : fallback;
}

bool json_bool(const json::Value& config, std::string_view key, bool fallback, const char* what) {
  const json::Value* v = member(config, key, json::Value::Type::Bool, what);
  return v ? v->boolean : fallback;
}

std::string json_string(const json::Value& config, std::string_view key, const std::string& fallback,
                        const char* what) {
  const json::Value* v = member(config, key, json::Value::Type::String, what);
  return v ? v->text : fallback;
}

void json_check_keys(const json::Value& config, std::initializer_list<std::string_view> known, const char* what) {
  std::string unknown;
  for (const json::Member& m : config.members)
    if (std::find(known.begin(), known.end(), m.key) == known.end()) unknown += (unknown.empty() ? "" : ", ") + m.key;
  if (unknown.empty()) return;
  std::string list;
  for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
  FRUGAL_FAIL(what, " config: unknown keys ", unknown, " (known: ", list, ")");
}

}  // namespace frugal::models
