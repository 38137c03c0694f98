// The losses, forward and backward side by side.
#include "autograd/ops/loss.h"

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/unary.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::Node;
using autograd::SavedTensor;
using autograd::TensorList;
using autograd::wants_grad;

namespace {

// loss_row = (1 - e) * (lse - x_t) + e * (lse - mean(x)), reduced (Note [Fused cross entropy])
// grad_logits = scale_row * (softmax(x) - (1 - e) * onehot(t) - e / C), softmax = exp(x - lse)
struct CrossEntropyBackward final : Node {
  SavedTensor logits{this}, target{this}, lse{this}, count{this};  // lse: one value per row; count: 0-d (Mean only)
  CrossEntropyOptions options;
  std::string name() const override { return "CrossEntropyBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor cv = count.defined() ? count.unpack(name()) : Tensor();
    return {ops::cross_entropy_backward(grads[0], logits.unpack(name()), target.unpack(name()), lse.unpack(name()), cv,
                                        options)};
  }
};

// out = reduce((a - b)^2), N = number of elements averaged (Mean)
// grad_a = sum_to(2 (a - b) g / N, a), grad_b = -sum_to(2 (a - b) g / N, b)
struct MseLossBackward final : Node {
  SavedTensor input{this}, target{this};  // the inputs themselves: a - b is recomputed, not kept
  Reduction reduction = Reduction::Mean;
  std::string name() const override { return "MseLossBackward"; }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(name()), b = target.unpack(name());
    const Tensor diff = ops::sub(a, b);
    const double factor = reduction == Reduction::Mean ? 2.0 / double(diff.numel()) : 2.0;
    const Tensor d = ops::mul(ops::mul(diff, factor), grads[0]);  // g broadcasts (0-d unless None)
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::sum_to(d, a.sizes());
    if (wants_grad(*this, 1)) out[1] = ops::neg(autograd::sum_to(d, b.sizes()));
    return out;
  }
};

// out = reduce(loss(a - b)); the derivative in d is Note [Pointwise regression losses]'s.
struct PointwiseLossBackward final : Node {
  SavedTensor input{this}, target{this};  // as MseLossBackward: d is recomputed, not kept
  ops::PointwiseLoss kind = ops::PointwiseLoss::L1;
  double param = 0;
  Reduction reduction = Reduction::Mean;
  std::string name() const override {
    switch (kind) {
      case ops::PointwiseLoss::L1: return "L1LossBackward";
      case ops::PointwiseLoss::SmoothL1: return "SmoothL1LossBackward";
      case ops::PointwiseLoss::Huber: return "HuberLossBackward";
    }
    return "?";
  }
  TensorList apply(TensorList&& grads) override {
    const Tensor a = input.unpack(name()), b = target.unpack(name());
    const Tensor diff = ops::sub(a, b);
    const Tensor g = reduction == Reduction::Mean ? ops::div(grads[0], double(diff.numel())) : grads[0];
    const Tensor d = ops::pointwise_loss_backward(kind, g, diff, param);
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::sum_to(d, a.sizes());
    if (wants_grad(*this, 1)) out[1] = ops::neg(autograd::sum_to(d, b.sizes()));
    return out;
  }
};

Tensor recorded_pointwise_loss(ops::PointwiseLoss kind, const Tensor& input, const Tensor& target, double param,
                      Reduction reduction) {
  core::OpScope scope(ops::pointwise_loss_name(kind));
  if (auto c = autocast::cast_inputs(Policy::Float32, {&input, &target}))
    return recorded_pointwise_loss(kind, (*c)[0], (*c)[1], param, reduction);
  Tensor out = autograd::raw([&] { return ops::pointwise_loss(kind, input, target, param, reduction); });
  if (auto node = make_node<PointwiseLossBackward>({input, target})) {
    node->input = input;
    node->target = target;
    node->kind = kind;
    node->param = param;
    node->reduction = reduction;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return recorded_pointwise_loss(ops::PointwiseLoss::L1, input, target, 0.0, reduction);
}
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  return recorded_pointwise_loss(ops::PointwiseLoss::SmoothL1, input, target, beta, reduction);
}
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  return recorded_pointwise_loss(ops::PointwiseLoss::Huber, input, target, delta, reduction);
}

// A composition of differentiable ops (gather, mul, sum, div): its gradient is theirs.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const ops::NllLossOptions& options) {
  core::OpScope scope("nll_loss");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&log_probs})) return nll_loss((*c)[0], target, options);
  ops::NllLossOptions raw_options = options;
  if (raw_options.weight.defined()) raw_options.weight = raw_options.weight.detach();
  const ops::NllTargets t = autograd::raw([&] { return ops::nll_targets(log_probs, target, raw_options); });
  const Tensor picked = log_probs.dim() == 1 ? gather(log_probs, 0, t.index.reshape({1}))
                                             : gather(log_probs, 1, t.index.unsqueeze(1));
  const Tensor loss = neg(mul(picked.reshape(target.sizes()), t.weight));
  switch (options.reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: break;
  }
  return div(sum(loss), sum(t.weight));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  core::OpScope scope("cross_entropy");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&logits})) return cross_entropy((*c)[0], target, options);
  ops::CrossEntropyResult r = autograd::raw([&] { return ops::cross_entropy(logits, target, options); });
  if (auto node = make_node<CrossEntropyBackward>({logits})) {
    node->logits = logits;
    node->target = target;
    node->lse = r.lse;
    if (r.count.defined()) node->count = r.count;
    node->options = options;
    autograd::record(node, {r.loss});
  }
  return r.loss;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  core::OpScope scope("mse_loss");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&input, &target})) return mse_loss((*c)[0], (*c)[1], reduction);
  Tensor out = autograd::raw([&] { return ops::mse_loss(input, target, reduction); });
  if (auto node = make_node<MseLossBackward>({input, target})) {
    node->input = input;
    node->target = target;
    node->reduction = reduction;
    autograd::record(node, {out});
  }
  return out;
}

}  // namespace frugal
