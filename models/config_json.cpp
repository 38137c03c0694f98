#include "models/config_json.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "nn/file.h"

namespace frugal::models {

namespace {
constexpr uint64_t kMaxConfigBytes = 64 << 20;  // a config.json is a few KB; this is no config
}

json::Value read_json_file(const std::string& path) {
  const std::string text = nn::ReadOnlyFile(path, "read_json_file").read_all(kMaxConfigBytes);
  json::Value v;
  try {
    v = json::parse(text);
  } catch (const Error& e) {
    rethrow_with_context(e, "read_json_file: " + path + ": ");  // the parser knows no paths
  }
  FRUGAL_CHECK(v.is_object(), "read_json_file: ", path, " holds a JSON ", json::type_name(v.type),
               ", expected an object");
  return v;
}

std::string config_name(const char* model, const std::string& file) {
  return std::string(model) + " config" + (file.empty() ? "" : " " + file);
}

namespace {
const json::Value* member(const json::Value& config, std::string_view key, json::Value::Type type,
                          const std::string& what) {
  const json::Value* v = config.find(key);
  if (!v || v->type == json::Value::Type::Null) return nullptr;
  FRUGAL_CHECK(v->type == type, what, ": '", key, "' must be a ", json::type_name(type), ", got a ",
               json::type_name(v->type));
  return v;
}
}  // namespace

int64_t json_int(const json::Value& config, std::string_view key, int64_t fallback, const std::string& what, int64_t lo,
                 int64_t hi) {
  const json::Value* v = member(config, key, json::Value::Type::Number, what);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v->text.c_str(), &end, 10);
  const bool integer = end && *end == '\0';
  FRUGAL_CHECK(integer && errno != ERANGE && n >= lo && n <= hi, what, ": '", key, "' must be an integer in [", lo,
               ", ", hi, "], got ", v->text);
  return n;
}

double json_double(const json::Value& config, std::string_view key, double fallback, const std::string& what, double lo,
                   double hi) {
  const json::Value* v = member(config, key, json::Value::Type::Number, what);
  if (!v) return fallback;
  const double x = v->as_double().value_or(NAN);  // locale-independent: Note in core/json.h
  FRUGAL_CHECK(std::isfinite(x) && x >= lo && x <= hi, what, ": '", key, "' must be a finite number in [", lo, ", ", hi,
               "], got ", v->text);
  return x;
}

bool json_bool(const json::Value& config, std::string_view key, bool fallback, const std::string& what) {
  const json::Value* v = member(config, key, json::Value::Type::Bool, what);
  return v ? v->boolean : fallback;
}

std::string json_string(const json::Value& config, std::string_view key, const std::string& fallback,
                        const std::string& what) {
  const json::Value* v = member(config, key, json::Value::Type::String, what);
  return v ? v->text : fallback;
}

autograd::CheckpointPolicy json_checkpoint_policy(const json::Value& config, autograd::CheckpointPolicy fallback,
                                                  const std::string& what) {
  const std::string name = json_string(config, "checkpoint_policy", autograd::to_string(fallback), what);
  const auto policy = autograd::parse_checkpoint_policy(name);
  FRUGAL_CHECK(policy, what, ": 'checkpoint_policy' must be \"full\" or \"selective\", got \"", name, "\"");
  return *policy;
}

void json_check_keys(const json::Value& config, std::initializer_list<std::string_view> known,
                     const std::string& what) {
  std::string unknown;
  for (const json::Member& m : config.members)
    if (std::find(known.begin(), known.end(), m.key) == known.end()) unknown += (unknown.empty() ? "" : ", ") + m.key;
  if (unknown.empty()) return;
  std::string list;
  for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
  FRUGAL_FAIL(what, ": unknown keys ", unknown, " (known: ", list, ")");
}

}  // namespace frugal::models
