#include "nn/rms_norm.h"

#include <sstream>

#include "autograd/ops/rms_norm.h"
#include "tensor/factory.h"

namespace frugal::nn {

RMSNorm::RMSNorm(Shape normalized_shape, RMSNormOptions options)
    : shape_(std::move(normalized_shape)), eps_(options.eps) {
  FRUGAL_CHECK(!shape_.empty(), "RMSNorm: normalized_shape must not be empty");
  if (options.elementwise_affine) weight = register_parameter("weight", ones(shape_));
}

Tensor RMSNorm::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return rms_norm(x, shape_, weight, eps_);
}

std::string RMSNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_str(shape_) << ", eps=";
  if (eps_) os << *eps_;
  else os << "None";
  os << ", elementwise_affine=" << (weight.defined() ? "true" : "false");
  return os.str();
}

}  // namespace frugal::nn
