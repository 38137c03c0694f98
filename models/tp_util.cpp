#include "models/tp_util.h"

#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"

namespace frugal::models {

using parallel::tp_rank;
using parallel::tp_size;

Shape tp_full_shape(const Tensor& local, TensorSplit split, int size) {
  Shape s = local.sizes();
  if (split.dim >= 0) s[size_t(split.dim)] *= size;
  return s;
}

Tensor tp_shard_of(const Tensor& full, TensorSplit split, int rank, int size) {
  if (split.dim < 0) return full;
  const int64_t block = full.size(split.dim) / split.blocks, n = block / size;
  if (split.blocks == 1) return full.narrow(split.dim, rank * n, n);
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < split.blocks; ++b) pieces.push_back(full.narrow(split.dim, b * block + rank * n, n));
  return cat(pieces, split.dim);
}

int64_t tp_heads_per_rank(int64_t heads, const parallel::CommPtr& comm, const char* model, const char* what) {
  const int p = parallel::tp_size(comm);
  FRUGAL_CHECK(heads % p == 0, model, ": ", what, " (", heads, ") must be divisible by the tensor-parallel size ", p);
  return heads / p;
}

Tensor tp_gather_full(const Tensor& local, TensorSplit split, const parallel::CommPtr& comm) {
  const int p = tp_size(comm);
  if (split.dim < 0 || p == 1) return local.detach().clone();
  // all_gather stacks the ranks' shards on a new leading dim: (p, ..., blocks * n, ...).
  // View the split dim as (blocks, n), move p between the two and merge the three.
  const Tensor in = local.detach().contiguous();
  const int64_t dim = split.dim;
  Shape stacked = in.sizes();
  stacked.insert(stacked.begin(), p);
  Tensor buf = empty(stacked, in.options());
  comm->all_gather(in, buf)->wait();
  Shape blocked = stacked;
  blocked[size_t(dim) + 1] = in.size(dim) / split.blocks;
  blocked.insert(blocked.begin() + dim + 1, split.blocks);  // (p, ..., blocks, n, ...)
  std::vector<int64_t> order;
  for (int64_t d = 1; d <= dim; ++d) order.push_back(d);
  order.insert(order.end(), {dim + 1, 0, dim + 2});
  for (int64_t d = dim + 3; d < int64_t(blocked.size()); ++d) order.push_back(d);
  return buf.view(blocked).permute(order).reshape(tp_full_shape(in, split, p));
}

std::map<std::string, TensorSplit> tp_linear_splits(const nn::Module& model) {
  std::map<std::string, TensorSplit> splits;
  for (const auto& [name, module] : model.named_modules()) {
    if (std::dynamic_pointer_cast<parallel::ColumnParallelLinear>(module))
      splits[name + ".weight"] = {0}, splits[name + ".bias"] = {0};
    else if (std::dynamic_pointer_cast<parallel::RowParallelLinear>(module)) splits[name + ".weight"] = {1};
  }
  return splits;
}

void tp_load_full(const nn::NamedTensors& state, const std::map<std::string, Tensor>& full,
                  const std::function<TensorSplit(const std::string&)>& split_of, const parallel::CommPtr& comm,
                  const char* model) {
  std::string missing, unexpected, mismatched;
  std::map<std::string, bool> known;
  for (const auto& [key, local] : state) {
    known[key] = true;
    auto it = full.find(key);
    if (it == full.end()) {
      missing += " '" + key + "'";
      continue;
    }
    const Shape want = tp_full_shape(local, split_of(key), tp_size(comm));
    if (it->second.sizes() != want)
      mismatched += " '" + key + "' (" + it->second.describe() + ", expected " + shape_str(want) + ")";
  }
  for (const auto& [key, t] : full)
    if (!known.count(key)) unexpected += " '" + key + "'";
  FRUGAL_CHECK(missing.empty() && unexpected.empty() && mismatched.empty(), "load_full_state_dict: ", model,
               " does not match the state dict.", missing.empty() ? "" : " Missing:", missing,
               unexpected.empty() ? "" : " Unexpected:", unexpected,
               mismatched.empty() ? "" : " Mismatched:", mismatched);
  autograd::NoGradGuard no_grad;
  for (const auto& [key, local] : state) {
    const Tensor src = tp_shard_of(full.at(key), split_of(key), tp_rank(comm), tp_size(comm));
    local.detach().copy_(src.to(local.device(), local.dtype()));
  }
}

}  // namespace frugal::models
