// rms_norm, forward and backward side by side (Note [RMS norm is layer norm around zero]).
#include "autograd/ops/rms_norm.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
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
  std::string name() const override { return "RmsNormBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor wv = weight.defined() ? weight.unpack(name()) : Tensor();
    const ops::RmsNormGrads g =
        ops::rms_norm_backward(grads[0], x.unpack(name()), normalized_shape, rstd.unpack(name()), wv,
                               {.x = wants_grad(*this, 0), .weight = wants_grad(*this, 1)});
    return {g.x, g.weight};
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
