#pragma once
// GroupNorm: normalization over groups of channels (torch.nn.GroupNorm).
#include <cstdint>

#include "nn/module.h"

namespace frugal::nn {

/// torch.nn.GroupNorm's settings.
struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;  // learnable per-channel "weight" (ones) and "bias" (zeros)
};

/// torch.nn.GroupNorm: x (N, C, *) with C = num_channels split into num_groups groups; each
/// sample's group is normalized by its own mean and biased variance, then scaled and shifted
/// per channel (frugal::group_norm in autograd/ops/group_norm.h). Same in train and eval.
class GroupNorm : public UnaryModule {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GroupNorm"; }
  /// "2, 6, eps=1e-05, affine=true"
  std::string extra_repr() const override;

  Tensor weight, bias;  // (num_channels), undefined without affine

 private:
  int64_t num_groups_, num_channels_;
  double eps_;
};

}  // namespace frugal::nn
