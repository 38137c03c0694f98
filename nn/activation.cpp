#include "nn/activation.h"

#include <cmath>
#include <string>

#include "autograd/ops/activation.h"
#include "autograd/ops/unary.h"
#include "tensor/factory.h"

namespace frugal::nn {

Tensor ReLU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return relu(x);
}
Tensor GELU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return approximate_ ? gelu_tanh(x) : gelu(x);
}
Tensor Tanh::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return frugal::tanh(x);
}
Tensor SiLU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return silu(x);
}
Tensor Sigmoid::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return sigmoid(x);
}

// The parameters are checked here, at construction, as PyTorch's modules would fail on first
// use: a bad module is refused before it is placed in a model.
LeakyReLU::LeakyReLU(double negative_slope) : negative_slope_(negative_slope) {
  FRUGAL_CHECK(std::isfinite(negative_slope), "LeakyReLU: negative_slope must be finite, got ", negative_slope);
}
Tensor LeakyReLU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return leaky_relu(x, negative_slope_);
}
std::string LeakyReLU::extra_repr() const { return "negative_slope=" + std::to_string(negative_slope_); }

ELU::ELU(double alpha) : alpha_(alpha) { FRUGAL_CHECK(std::isfinite(alpha), "ELU: alpha must be finite, got ", alpha); }
Tensor ELU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return elu(x, alpha_);
}
std::string ELU::extra_repr() const { return "alpha=" + std::to_string(alpha_); }

Hardtanh::Hardtanh(double min_val, double max_val) : min_val_(min_val), max_val_(max_val) {
  FRUGAL_CHECK(!std::isnan(min_val) && !std::isnan(max_val) && min_val <= max_val,
               "Hardtanh: min_val must not be greater than max_val (nor NaN), got ", min_val, " and ", max_val);
}
Tensor Hardtanh::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return hardtanh(x, min_val_, max_val_);
}
std::string Hardtanh::extra_repr() const {
  return "min_val=" + std::to_string(min_val_) + ", max_val=" + std::to_string(max_val_);
}

Tensor Hardsigmoid::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return hardsigmoid(x);
}
Tensor Hardswish::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return hardswish(x);
}
Tensor Mish::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return mish(x);
}
Tensor LogSigmoid::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return logsigmoid(x);
}
Tensor SELU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return selu(x);
}

CELU::CELU(double alpha) : alpha_(alpha) {
  FRUGAL_CHECK(std::isfinite(alpha) && alpha != 0.0, "CELU: alpha must be finite and nonzero, got ", alpha);
}
Tensor CELU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return celu(x, alpha_);
}
std::string CELU::extra_repr() const { return "alpha=" + std::to_string(alpha_); }

Tensor Softsign::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return softsign(x);
}
Tensor Tanhshrink::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return tanhshrink(x);
}

Hardshrink::Hardshrink(double lambd) : lambd_(lambd) {
  FRUGAL_CHECK(!std::isnan(lambd), "Hardshrink: lambd must not be NaN");
}
Tensor Hardshrink::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return hardshrink(x, lambd_);
}
std::string Hardshrink::extra_repr() const { return "lambd=" + std::to_string(lambd_); }

Softshrink::Softshrink(double lambd) : lambd_(lambd) {
  FRUGAL_CHECK(lambd >= 0.0, "Softshrink: lambd must be >= 0, got ", lambd);
}
Tensor Softshrink::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return softshrink(x, lambd_);
}
std::string Softshrink::extra_repr() const { return "lambd=" + std::to_string(lambd_); }

Threshold::Threshold(double threshold, double value) : threshold_(threshold), value_(value) {
  FRUGAL_CHECK(!std::isnan(threshold), "Threshold: threshold must not be NaN");
}
Tensor Threshold::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return threshold(x, threshold_, value_);
}
std::string Threshold::extra_repr() const {
  return "threshold=" + std::to_string(threshold_) + ", value=" + std::to_string(value_);
}

Tensor GLU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return glu(x, dim_);
}

PReLU::PReLU(int64_t num_parameters, double init) {
  FRUGAL_CHECK(num_parameters >= 1, "PReLU: num_parameters must be positive, got ", num_parameters);
  weight = register_parameter("weight", full({num_parameters}, init));
}
Tensor PReLU::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return prelu(x, weight);
}

}  // namespace frugal::nn
