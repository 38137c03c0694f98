#include "models/pretrained.h"

#include "core/error.h"
#include "nn/safetensors.h"

namespace frugal::models {

void load_safetensors_into(nn::Module& model, const std::string& path, const TiedKeys& tied) {
  std::map<std::string, Tensor> state = nn::load_safetensors(path).tensors;
  for (const auto& [alias, source] : tied) {
    const bool has_alias = state.count(alias) > 0, has_source = state.count(source) > 0;
    if (has_alias && !has_source) state[source] = state[alias];
    else if (has_source && !has_alias) state[alias] = state[source];
    else if (has_alias && has_source) {
      const Tensor& a = state[alias];
      const Tensor& s = state[source];
      FRUGAL_CHECK(nn::same_values(a, s), "load_safetensors_into: '", path,
                   "' holds different values for the tied keys '", alias, "' ", a.describe(), " and '", source, "' ",
                   s.describe());
    }
  }
  try {
    model.load_state_dict(state, /*strict=*/true);
  } catch (const Error& e) {  // which file did not fit: the checks name keys and shapes only
    rethrow_with_context(e, "load_safetensors_into: " + path + ": ");
  }
}

}  // namespace frugal::models
