#include "nn/group_norm.h"

#include <sstream>

#include "autograd/ops/group_norm.h"
#include "tensor/factory.h"

namespace frugal::nn {

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options)
    : num_groups_(num_groups), num_channels_(num_channels), eps_(options.eps) {
  FRUGAL_CHECK(num_groups > 0 && num_channels > 0, "GroupNorm: num_groups and num_channels must be positive, got ",
               num_groups, " and ", num_channels);
  FRUGAL_CHECK(num_channels % num_groups == 0, "GroupNorm: num_channels ", num_channels,
               " must be divisible by num_groups ", num_groups);
  if (options.affine) {
    weight = register_parameter("weight", ones({num_channels}));
    bias = register_parameter("bias", zeros({num_channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return group_norm(x, num_groups_, weight, bias, eps_);
}

std::string GroupNorm::extra_repr() const {
  std::ostringstream os;
  os << num_groups_ << ", " << num_channels_ << ", eps=" << eps_ << ", affine=" << (weight.defined() ? "true" : "false");
  return os.str();
}

}  // namespace frugal::nn
