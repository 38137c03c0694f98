#include "nn/linear.h"

#include <cmath>

#include "autograd/ops/matmul.h"
#include "nn/init.h"
#include "tensor/factory.h"

namespace frugal::nn {

Linear::Linear(int64_t in, int64_t out, LinearOptions options) : in_features(in), out_features(out) {
  FRUGAL_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=", in, " out=", out);
  weight = register_parameter("weight", empty({out, in}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (options.bias) {
    bias = register_parameter("bias", empty({out}));
    const double bound = 1.0 / std::sqrt(double(in));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  FRUGAL_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear: expected input (..., ", in_features, "), got ",
               x.describe());
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
         ", bias=" + (bias.defined() ? "true" : "false");
}

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim_) + ", end_dim=" + std::to_string(end_dim_);
}

}  // namespace frugal::nn
