#include "nn/activation.h"

#include "autograd/ops/unary.h"

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

}  // namespace frugal::nn
