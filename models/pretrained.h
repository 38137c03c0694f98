#pragma once
// Loading PyTorch-written checkpoints (safetensors) into frugal models, with the weight
// tying that Hugging Face models use (see Note [Tied weights] in models/bert.h).
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace frugal::models {

/// Pairs (alias, source) of state-dict keys that name one tensor, e.g.
/// ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight").
using TiedKeys = std::vector<std::pair<std::string, std::string>>;

/// Loads the safetensors file at `path` into `model` with load_state_dict(strict). A
/// checkpoint may omit either key of a tied pair (save_pretrained drops the alias, as the
/// safetensors library refuses shared tensors): the present one fills both. When both are
/// present they must be equal, since the model holds one tensor for the two.
void load_safetensors_into(nn::Module& model, const std::string& path, const TiedKeys& tied = {});

}  // namespace frugal::models
