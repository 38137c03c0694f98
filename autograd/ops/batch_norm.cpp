// batch_norm and the fused batch_norm_add_relu / batch_norm_relu, forward and backward
// side by side.
#include "autograd/ops/batch_norm.h"

#include "autograd/function.h"
#include "core/instrument.h"
#include "tensor/ops/batch_norm.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = (x - mean) * invstd * weight + bias  (Note [Batch norm statistics])
// grad_x = weight * invstd * (g - mean_M(g) - xhat * mean_M(g * xhat))  (training; eval: weight * invstd * g)
// grad_weight = sum_M(g * xhat), grad_bias = sum_M(g)
struct BatchNormBackward final : Node {
  SavedTensor x{this}, weight{this}, mean{this}, invstd{this};  // mean, invstd: (C) in the compute dtype
  SavedTensor reserve{this};  // cuDNN's reserve space (Note [Channels-last batch norm]); undefined elsewhere
  double eps = 1e-5;
  bool training = false;
  DType weight_dtype = kFloat32, bias_dtype = kFloat32;
  std::string name() const override { return "BatchNormBackward"; }
  ops::BatchNormSaved with_reserve() const { return {reserve.unpack(name()), eps}; }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    ops::BatchNormGrads g = ops::batch_norm_backward(
        grads[0], x.unpack(name()), wv, mean.unpack(name()), invstd.unpack(name()), training,
        {.x = wants_grad(*this, 0), .weight = wants_grad(*this, 1), .bias = wants_grad(*this, 2)}, with_reserve());
    if (g.weight.defined()) g.weight = g.weight.to(weight_dtype);  // the compute dtype -> the parameter's
    if (g.bias.defined()) g.bias = g.bias.to(bias_dtype);
    return {g.x, g.weight, g.bias};
  }
};

// out = relu(batch_norm(x) + residual), or relu(batch_norm(x))  (Note [Batch norm add ReLU])
// gz = g (out > 0), grad_residual = gz, grad_x/weight/bias = BatchNormBackward's formulas on gz
struct BatchNormAddReluBackward final : Node {
  // out for ReLU's mask; bias for cuDNN's fused backward
  SavedTensor x{this}, out{this}, weight{this}, bias{this}, mean{this}, invstd{this};
  SavedTensor reserve{this};
  double eps = 1e-5;
  bool residual = true;
  bool training = false;
  DType weight_dtype = kFloat32, bias_dtype = kFloat32;
  std::string name() const override { return "BatchNormAddReluBackward"; }
  ops::BatchNormSaved with_reserve() const { return {reserve.unpack(name()), eps, residual}; }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const Tensor bv = bias.defined() ? bias.unpack(name()) : Tensor();
    ops::BatchNormGrads g = ops::batch_norm_add_relu_backward(grads[0], x.unpack(name()), out.unpack(name()), wv, bv,
                                                              mean.unpack(name()), invstd.unpack(name()), training,
                                                              {.x = wants_grad(*this, 0),
                                                               .weight = wants_grad(*this, 2),
                                                               .bias = wants_grad(*this, 3),
                                                               .residual = wants_grad(*this, 1)},
                                                              with_reserve());
    if (g.weight.defined()) g.weight = g.weight.to(weight_dtype);
    if (g.bias.defined()) g.bias = g.bias.to(bias_dtype);
    return {g.x, g.residual, g.weight, g.bias};
  }
};

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  core::OpScope scope("batch_norm");  // keeps a low-precision input (Note [Autocast])
  ops::BatchNormResult r = autograd::raw(
      [&] { return ops::batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps); });
  if (auto node = make_node<BatchNormBackward>({x, weight, bias})) {
    node->x = x;
    if (weight.defined()) {
      node->weight = weight;
      node->weight_dtype = weight.dtype();
    }
    if (bias.defined()) node->bias_dtype = bias.dtype();
    node->mean = r.mean;
    node->invstd = r.invstd;
    node->reserve = r.reserve;
    node->eps = eps;
    node->training = training;
    autograd::record(node, {r.out});
  }
  return r.out;
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps) {
  FRUGAL_CHECK(residual.defined(), "batch_norm_add_relu: residual is undefined (batch_norm_relu takes none)");
  return batch_norm_relu(x, running_mean, running_var, weight, bias, training, momentum, eps, residual);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, const Tensor& residual) {
  // Keeps low-precision inputs, as batch_norm (Note [Autocast]).
  core::OpScope scope(residual.defined() ? "batch_norm_add_relu" : "batch_norm_relu");
  ops::BatchNormResult r = autograd::raw([&] {
    return ops::batch_norm_add_relu(x, residual, running_mean, running_var, weight, bias, training, momentum, eps);
  });
  if (auto node = make_node<BatchNormAddReluBackward>({x, residual, weight, bias})) {
    node->x = x;
    node->out = r.out;
    if (weight.defined()) {
      node->weight = weight;
      node->weight_dtype = weight.dtype();
    }
    if (bias.defined()) {
      if (r.reserve.defined()) node->bias = bias;  // only cuDNN's fused backward reads it
      node->bias_dtype = bias.dtype();
    }
    node->mean = r.mean;
    node->invstd = r.invstd;
    node->reserve = r.reserve;
    node->eps = eps;
    node->residual = residual.defined();
    node->training = training;
    autograd::record(node, {r.out});
  }
  return r.out;
}

}  // namespace frugal
