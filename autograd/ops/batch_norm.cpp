// batch_norm and the fused batch_norm_add_relu / batch_norm_relu, forward and backward
// side by side.
#include "autograd/ops/batch_norm.h"

#include <array>
#include <utility>

#include "autograd/checkpoint.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "autograd/recompute_cheap.h"
#include "core/instrument.h"
#include "tensor/ops/batch_norm.h"
#include "tensor/ops/binary.h"

namespace frugal {

using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

/// BatchNormBackward's formulas in differentiable ops (Note [Double backward]): {grad_x,
/// grad_weight, grad_bias} from g, x and weight joined to their history (weight undefined: none).
/// Training recomputes the batch statistics from x, so they carry its history; eval's running
/// statistics (mean, invstd) are constants.
TensorList batch_norm_graph_grads(const Tensor& g_in, const Tensor& saved_x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& invstd, double eps, bool training,
                                  std::pair<DType, DType> param_dtypes, std::array<bool, 3> wanted) {
  const DType compute = opmath_dtype(saved_x.dtype());
  const Tensor xv = saved_x.to(compute), g = g_in.to(compute);
  std::vector<int64_t> stat_dims{0};  // every dim but the channels'
  Shape channel(size_t(xv.dim()), 1);
  channel[1] = xv.size(1);
  for (int64_t d = 2; d < xv.dim(); ++d) stat_dims.push_back(d);
  auto stat_mean = [&](const Tensor& t) { return frugal::mean(t, stat_dims, /*keepdim=*/true); };
  Tensor xhat, rstd;
  if (training) {
    const Tensor centred = frugal::sub(xv, stat_mean(xv));
    rstd = frugal::rsqrt(frugal::add(stat_mean(frugal::square(centred)), eps));
    xhat = frugal::mul(centred, rstd);
  } else {
    rstd = invstd.to(compute).view(channel);
    xhat = frugal::mul(frugal::sub(xv, mean.to(compute).view(channel)), rstd);
  }
  TensorList out(3);
  if (wanted[0]) {
    const Tensor dxhat = weight.defined() ? frugal::mul(g, weight.to(compute).view(channel)) : g;
    const Tensor gx = training ? autograd::graph::normalized_input_grad(dxhat, xhat, rstd, stat_dims, true)
                               : frugal::mul(dxhat, rstd);
    out[0] = gx.to(saved_x.dtype());
  }
  if (wanted[1]) out[1] = frugal::sum(frugal::mul(g, xhat), stat_dims).to(param_dtypes.first);
  if (wanted[2]) out[2] = frugal::sum(g, stat_dims).to(param_dtypes.second);
  return out;
}

// out = (x - mean) * invstd * weight + bias  (Note [Batch norm statistics])
// grad_x = weight * invstd * (g - mean_M(g) - xhat * mean_M(g * xhat))  (training; eval: weight * invstd * g)
// grad_weight = sum_M(g * xhat), grad_bias = sum_M(g)
struct BatchNormBackward final : Node {
  SavedTensor x{this}, weight{this}, mean{this}, invstd{this};  // mean, invstd: (C) in the compute dtype
  SavedTensor reserve{this};  // cuDNN's reserve space (Note [Channels-last batch norm]); undefined elsewhere
  SavedTensor bias{this};     // only for the output's recipe (Note [Recomputable outputs])
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
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? autograd::graph::saved_input(*this, 1, weight) : Tensor();
    return batch_norm_graph_grads(grads[0], autograd::graph::saved_input(*this, 0, x), wv, mean.unpack(name()),
                                  invstd.unpack(name()), eps, training, {weight_dtype, bias_dtype},
                                  {wants_grad(*this, 0), wants_grad(*this, 1), wants_grad(*this, 2)});
  }
};

// out = relu(batch_norm(x) + residual), or relu(batch_norm(x))  (Note [Batch norm add ReLU])
// gz = g (out > 0), grad_residual = gz, grad_x/weight/bias = BatchNormBackward's formulas on gz
struct BatchNormAddReluBackward final : Node {
  // out for ReLU's mask; bias for cuDNN's fused backward
  SavedTensor x{this}, out{this}, weight{this}, bias{this}, mean{this}, invstd{this};
  SavedTensor reserve{this};
  SavedTensor residual_value{this};  // only for the output's recipe (Note [Recomputable outputs])
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
  // ReLU's mask on g (a constant), then batch norm's formulas (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor sv = out.unpack(name());
    const Tensor gz = frugal::masked_fill(grads[0], autograd::raw([&] { return ops::le(sv, 0.0); }), 0.0);
    const Tensor wv = weight.defined() ? autograd::graph::saved_input(*this, 2, weight) : Tensor();
    TensorList bn = batch_norm_graph_grads(gz, autograd::graph::saved_input(*this, 0, x), wv, mean.unpack(name()),
                                           invstd.unpack(name()), eps, training, {weight_dtype, bias_dtype},
                                           {wants_grad(*this, 0), wants_grad(*this, 2), wants_grad(*this, 3)});
    return {bn[0], wants_grad(*this, 1) ? gz : Tensor(), bn[1], bn[2]};
  }
};

/// The saved tensor, or undefined when it was not saved.
Tensor unpack_if(const SavedTensor& t, const std::string& node) { return t.defined() ? t.unpack(node) : Tensor(); }

/// Under a RecomputeCheapOutputs guard, registers out = batch_norm(x) as a recipe over the
/// node's saved tensors (Note [Recomputable outputs]); the node saves bias for it.
void register_batch_norm_recipe(const std::shared_ptr<BatchNormBackward>& node, const Tensor& out, const Tensor& bias) {
  if (!autograd::RecomputeCheapOutputs::active()) return;
  if (bias.defined()) node->bias = bias;
  autograd::recompute::register_output(out, node, "batch_norm", 1, [](const BatchNormBackward& n) {
    const std::string name = n.name();
    return ops::batch_norm_apply(n.x.unpack(name), Tensor(), false, n.mean.unpack(name), n.invstd.unpack(name),
                                 unpack_if(n.weight, name), unpack_if(n.bias, name));
  });
}

/// The same for out = relu(batch_norm(x) + residual): the node saves bias and the residual
/// (as a recipe when it is one); a recipe longer than the guard allows is not registered, and
/// the residual not saved (Note [Recomputable outputs], residuals). Returns whether it registered.
bool register_batch_norm_relu_recipe(const std::shared_ptr<BatchNormAddReluBackward>& node, const Tensor& out,
                                     const Tensor& bias, const Tensor& residual) {
  if (!autograd::RecomputeCheapOutputs::active()) return false;
  int length = 1;
  if (residual.defined()) {
    node->residual_value = residual;
    if (const auto r = node->residual_value.recipe()) length += r->length;
    if (length > autograd::RecomputeCheapOutputs::max_recipe_length()) {
      node->residual_value.reset();
      return false;
    }
  }
  if (bias.defined()) node->bias = bias;
  autograd::recompute::register_output(
      out, node, residual.defined() ? "batch_norm_add_relu" : "batch_norm_relu", length,
      [](const BatchNormAddReluBackward& n) {
        const std::string name = n.name();
        return ops::batch_norm_apply(n.x.unpack(name), unpack_if(n.residual_value, name), true, n.mean.unpack(name),
                                     n.invstd.unpack(name), unpack_if(n.weight, name), unpack_if(n.bias, name));
      });
  return true;
}

}  // namespace

void note_batch_norm_mode(const char* op, bool training, const Tensor& running_mean, const Tensor& running_var) {
  autograd::note_mode(op, training);
  if (training) return;  // eval normalizes by the running statistics: a replay reads them again
  if (running_mean.defined()) autograd::detail::note_checkpoint_read(running_mean);
  if (running_var.defined()) autograd::detail::note_checkpoint_read(running_var);
}

Tensor running_stat_to_update(const Tensor& running, bool training) {
  return training && autograd::in_checkpoint_recompute() ? Tensor() : running;
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  core::OpScope scope("batch_norm");  // keeps a low-precision input (Note [Autocast])
  note_batch_norm_mode("batch_norm", training, running_mean, running_var);
  ops::BatchNormResult r = autograd::raw([&] {
    return ops::batch_norm(x, running_stat_to_update(running_mean, training),
                           running_stat_to_update(running_var, training), weight, bias, training, momentum, eps);
  });
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
    register_batch_norm_recipe(node, r.out, bias);
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
  note_batch_norm_mode("batch_norm_relu", training, running_mean, running_var);
  ops::BatchNormResult r = autograd::raw([&] {
    return ops::batch_norm_add_relu(x, residual, running_stat_to_update(running_mean, training),
                                    running_stat_to_update(running_var, training), weight, bias, training, momentum,
                                    eps);
  });
  if (auto node = make_node<BatchNormAddReluBackward>({x, residual, weight, bias})) {
    node->x = x;
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
    // Saved after the recipe is registered, so that it is saved as one (Note [Recomputable outputs]).
    register_batch_norm_relu_recipe(node, r.out, bias, residual);
    node->out = r.out;
  }
  return r.out;
}

}  // namespace frugal
