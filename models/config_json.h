#pragma once
// Reading model configs from JSON (Hugging Face's config.json keys for BERT, frugal's own
// documented keys for ResNet and ViT). Every getter checks the value's type and range and
// names the key, the model and the file (when the config came from one) in its error.
//
// Note [Config ranges]
// A config is untrusted input: {"num_classes": 4611686018427387904} once built a
// Linear whose weight wrapped to 0 bytes, and the first write segfaulted. Every size a
// config gives is an integer in [1, kMaxConfigDim] (cuBLAS and cuDNN take int dims, so
// nothing larger can run), every count of layers or blocks in [1, kMaxConfigLayers], and
// the divisibility a model needs (hidden % heads) is checked by its reader. Products of
// sizes that are each in range can still be too large: those are left to the tensor
// factories, which check every element and byte count (Note [Size overflow]).
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "autograd/checkpoint.h"
#include "core/json.h"

namespace frugal::models {

inline constexpr int64_t kMaxConfigDim = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kMaxConfigLayers = 10000;

/// Parses the JSON object in `path`; throws naming the file if it is unreadable, not
/// JSON (with the byte, line and column) or not an object.
json::Value read_json_file(const std::string& path);

/// How errors name a config: "ViT config" or, read from `file`, "ViT config vit.json".
std::string config_name(const char* model, const std::string& file);

/// config[key] as an integer in [lo, hi], or `fallback` when absent (or null). `what`
/// (config_name) names the config in errors.
int64_t json_int(const json::Value& config, std::string_view key, int64_t fallback, const std::string& what,
                 int64_t lo = std::numeric_limits<int64_t>::min(), int64_t hi = std::numeric_limits<int64_t>::max());
/// config[key] as a finite number in [lo, hi], or `fallback`.
double json_double(const json::Value& config, std::string_view key, double fallback, const std::string& what,
                   double lo = std::numeric_limits<double>::lowest(), double hi = std::numeric_limits<double>::max());
bool json_bool(const json::Value& config, std::string_view key, bool fallback, const std::string& what);
std::string json_string(const json::Value& config, std::string_view key, const std::string& fallback,
                        const std::string& what);

/// config["checkpoint_policy"]: "full" or "selective" (Note [Selective checkpoint]), or
/// `fallback` when absent.
autograd::CheckpointPolicy json_checkpoint_policy(const json::Value& config, autograd::CheckpointPolicy fallback,
                                                  const std::string& what);

/// Throws listing every key of `config` not in `known` (for configs that frugal defines,
/// where a misspelt key should not pass silently).
void json_check_keys(const json::Value& config, std::initializer_list<std::string_view> known, const std::string& what);

}  // namespace frugal::models
