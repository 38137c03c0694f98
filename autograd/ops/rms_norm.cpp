// rms_norm, forward and backward side by side (Note [RMS norm is layer norm around zero]).
#include "autograd/ops/rms_norm.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "autograd/recompute_cheap.h"
#include "core/instrument.h"
#include "tensor/ops/rms_norm.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// out = x * rstd * weight, per row of the normalized dims
// grad_x = rstd * (gw - xhat * mean(gw * xhat)), gw = g * weight, xhat = x * rstd
// grad_weight = sum_rows(g * xhat)
struct RmsNormBackward final : Node {
  SavedTensor x{this}, weight{this}, rstd{this};  // rstd: one float per row
  Shape normalized_shape;
  double eps = 0;  // for the double backward's recomputed rstd
  std::string name() const override { return "RmsNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const ops::RmsNormGrads g =
        ops::rms_norm_backward(grads[0], x.unpack(name()), normalized_shape, rstd.unpack(name()), wv,
                               {.x = wants_grad(*this, 0), .weight = wants_grad(*this, 1)});
    return {g.x, g.weight};
  }
  // The same formula in differentiable ops, rstd recomputed from x (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor xv = autograd::graph::saved_input(*this, 0, x);
    const Tensor g = autograd::in_dtype(grads[0], xv.dtype());
    const int64_t lead = xv.dim() - int64_t(normalized_shape.size());
    std::vector<int64_t> rows, features;
    for (int64_t d = 0; d < xv.dim(); ++d) (d < lead ? rows : features).push_back(d);
    auto row_mean = [&](const Tensor& t) { return frugal::mean(t, features, /*keepdim=*/true); };
    const Tensor rstd_v = frugal::rsqrt(frugal::add(row_mean(frugal::square(xv)), eps));
    const Tensor xhat = frugal::mul(xv, rstd_v);
    const Tensor gw = weight.defined() ? frugal::mul(g, autograd::graph::saved_input(*this, 1, weight)) : g;
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::graph::normalized_input_grad(gw, xhat, rstd_v, features, false);
    if (wants_grad(*this, 1)) {
      const Tensor gx = frugal::mul(g, xhat);
      out[1] = rows.empty() ? gx : frugal::sum(gx, rows);
    }
    return out;
  }
};

}  // namespace

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  core::OpScope scope("rms_norm");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&x, &weight}))
    return rms_norm((*c)[0], normalized_shape, (*c)[1], eps);
  ops::RmsNormResult r = autograd::raw([&] { return ops::rms_norm(x, normalized_shape, weight, eps); });
  if (auto node = make_node<RmsNormBackward>({x, weight})) {
    node->x = x;
    if (weight.defined()) node->weight = weight;
    node->rstd = r.rstd;
    node->normalized_shape = normalized_shape;
    node->eps = eps.value_or(ops::rms_norm_default_eps(x.dtype()));
    autograd::record(node, {r.out});
    if (autograd::RecomputeCheapOutputs::active()) {  // out = rms_norm_apply from what backward keeps
      autograd::recompute::register_output(r.out, node, "rms_norm", 1, [](const RmsNormBackward& n) {
        const std::string name = n.name();
        return ops::rms_norm_apply(n.x.unpack(name), n.normalized_shape, n.rstd.unpack(name),
                                   n.weight.defined() ? n.weight.unpack(name) : Tensor());
      });
    }
  }
  return r.out;
}

}  // namespace frugal
