// layer_norm, forward and backward side by side (Note [Layer norm statistics]).
#include "autograd/ops/norm.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "autograd/recompute_cheap.h"
#include "core/instrument.h"
#include "tensor/ops/norm.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = (x - mean) * rstd * weight + bias, per row of the normalized dims
// grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * weight
// grad_weight = sum_rows(g * xhat), grad_bias = sum_rows(g)
struct LayerNormBackward final : Node {
  SavedTensor x{this}, weight{this}, mean{this}, rstd{this};  // mean, rstd: one float per row
  SavedTensor bias{this};  // only for the output's recipe (Note [Recomputable outputs])
  Shape normalized_shape;
  double eps = 0;  // for the double backward's recomputed rstd
  bool has_bias = false;
  std::string name() const override { return "LayerNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor xv = x.unpack(name());
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const ops::LayerNormGrads g = ops::layer_norm_backward(
        grads[0], xv, normalized_shape, mean.unpack(name()), rstd.unpack(name()), wv, has_bias,
        {.x = wants_grad(*this, 0), .weight = wants_grad(*this, 1), .bias = wants_grad(*this, 2)});
    return {g.x, g.weight, g.bias};
  }
  // The same formula in differentiable ops, with mean and rstd recomputed from x so that they
  // carry its history (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor xv = autograd::graph::saved_input(*this, 0, x);
    const Tensor g = autograd::in_dtype(grads[0], xv.dtype());
    const int64_t lead = xv.dim() - int64_t(normalized_shape.size());
    std::vector<int64_t> rows, features;  // the dims summed over for weight and bias; normalized
    for (int64_t d = 0; d < xv.dim(); ++d) (d < lead ? rows : features).push_back(d);
    auto row_mean = [&](const Tensor& t) { return frugal::mean(t, features, /*keepdim=*/true); };
    auto over_rows = [&](const Tensor& t) { return rows.empty() ? t : frugal::sum(t, rows); };
    const Tensor centred = frugal::sub(xv, row_mean(xv));
    const Tensor rstd_v = frugal::rsqrt(frugal::add(row_mean(frugal::square(centred)), eps));
    const Tensor xhat = frugal::mul(centred, rstd_v);
    const Tensor gw = weight.defined() ? frugal::mul(g, autograd::graph::saved_input(*this, 1, weight)) : g;
    TensorList out(3);
    if (wants_grad(*this, 0)) out[0] = autograd::graph::normalized_input_grad(gw, xhat, rstd_v, features, true);
    if (wants_grad(*this, 1)) out[1] = over_rows(frugal::mul(g, xhat));
    if (has_bias && wants_grad(*this, 2)) out[2] = over_rows(g);
    return out;
  }
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  core::OpScope scope("layer_norm");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x, &weight, &bias}))
    return layer_norm((*c)[0], normalized_shape, (*c)[1], (*c)[2], eps);
  ops::LayerNormResult r = autograd::raw([&] { return ops::layer_norm(x, normalized_shape, weight, bias, eps); });
  if (auto node = make_node<LayerNormBackward>({x, weight, bias})) {
    node->x = x;
    if (weight.defined()) node->weight = weight;
    node->mean = r.mean;
    node->rstd = r.rstd;
    node->normalized_shape = normalized_shape;
    node->eps = eps;
    node->has_bias = bias.defined();
    autograd::record(node, {r.out});
    if (autograd::RecomputeCheapOutputs::active()) {  // out = layer_norm_apply from what backward keeps
      if (bias.defined()) node->bias = bias;
      autograd::recompute::register_output(r.out, node, "layer_norm", 1, [](const LayerNormBackward& n) {
        const std::string name = n.name();
        return ops::layer_norm_apply(n.x.unpack(name), n.normalized_shape, n.mean.unpack(name), n.rstd.unpack(name),
                                     n.weight.defined() ? n.weight.unpack(name) : Tensor(),
                                     n.bias.defined() ? n.bias.unpack(name) : Tensor());
      });
    }
  }
  return r.out;
}

}  // namespace frugal
