#pragma once
// Reading model configs from JSON (Hugging Face's config.json keys for BERT, frugal's own
// documented keys for ResNet and ViT). Every getter checks the value's type and names the
// key and the file's purpose in its error.
#include <initializer_list>
#include <string>
#include <string_view>

#include "nn/json.h"

namespace frugal::models {

/// Parses the JSON object in `path`; throws naming the file if it is unreadable or not an object.
json::Value read_json_file(const std::string& path);

/// config[key] as an integer, or `fallback` when absent. `what` names the config in errors.
int64_t json_int(const json::Value& config, std::string_view key, int64_t fallback, const char* what);
double json_double(const json::Value& config, std::string_view key, double fallback, const char* what);
bool json_bool(const json::Value& config, std::string_view key, bool fallback, const char* what);
std::string json_string(const json::Value& config, std::string_view key, const std::string& fallback, const char* what);

/// Throws listing every key of `config` not in `known` (for configs that frugal defines,
/// where a misspelt key should not pass silently).
void json_check_keys(const json::Value& config, std::initializer_list<std::string_view> known, const char* what);

}  // namespace frugal::models
