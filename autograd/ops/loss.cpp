// The losses, forward and backward side by side.
#include "autograd/ops/loss.h"

#include <limits>
#include <string>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/loss.h"
#include "tensor/ops/reduce.h"
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
  // The same formula in differentiable ops (Note [Double backward]): softmax(x) has history;
  // the targets' one-hot rows, the smoothing and the ignored rows are constants.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor x = autograd::graph::saved_input(*this, 0, logits), t = target.unpack(name());
    const int64_t class_dim = x.dim() == 1 ? 0 : 1, classes = x.size(class_dim);
    const double e = options.label_smoothing;
    Shape class_axis(size_t(x.dim()), 1);
    class_axis[size_t(class_dim)] = classes;
    const Tensor tc = t.unsqueeze(class_dim);  // broadcasts along the classes
    const Tensor target_part = autograd::raw([&] {  // (1 - e) onehot(t) + e / C, as x's dtype
      const Tensor onehot = ops::eq(arange(classes, {kInt64, x.device()}).reshape(class_axis), tc).to(x.dtype());
      return ops::add(ops::mul(onehot, 1.0 - e), e / double(classes));
    });
    const Tensor ignored = autograd::raw([&] { return ops::eq(tc, double(options.ignore_index)); });
    const Tensor d = frugal::masked_fill(frugal::sub(frugal::softmax(x, class_dim), target_part), ignored, 0.0);
    const Tensor g = autograd::in_dtype(grads[0], x.dtype());
    switch (options.reduction) {
      case Reduction::None: return {frugal::mul(d, g.unsqueeze(class_dim))};
      case Reduction::Sum: return {frugal::mul(d, g)};
      case Reduction::Mean: break;
    }
    return {frugal::mul(d, frugal::div(g, count.unpack(name()).to(x.dtype())))};
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
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    const Tensor a = autograd::graph::saved_input(*this, 0, input), b = autograd::graph::saved_input(*this, 1, target);
    const Tensor diff = frugal::sub(a, b);
    const double factor = reduction == Reduction::Mean ? 2.0 / double(diff.numel()) : 2.0;
    const Tensor d = frugal::mul(frugal::mul(diff, factor), grads[0]);
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = autograd::graph::sum_to(d, a.sizes());
    if (wants_grad(*this, 1)) out[1] = frugal::neg(autograd::graph::sum_to(d, b.sizes()));
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
  // Note [Pointwise regression losses]'s derivative in differentiable ops: d / beta (d for
  // huber) inside, a constant sign outside, of zero derivative there.
  bool has_graph_backward() const override { return true; }
  TensorList apply_graph(TensorList&& grads) override {
    namespace graph = autograd::graph;
    const Tensor a = graph::saved_input(*this, 0, input), b = graph::saved_input(*this, 1, target);
    const Tensor diff = frugal::sub(a, b);
    const Tensor g = reduction == Reduction::Mean ? frugal::div(grads[0], double(diff.numel())) : grads[0];
    const bool has_inside = kind != ops::PointwiseLoss::L1 && param > 0;
    const double outside_scale = kind == ops::PointwiseLoss::Huber ? param : 1.0;
    const Tensor dd = diff.detach();
    const Tensor sign = autograd::raw([&] {
      return ops::mul(ops::sub(ops::gt(dd, 0.0).to(dd.dtype()), ops::lt(dd, 0.0).to(dd.dtype())), outside_scale);
    });
    Tensor slope = sign;
    if (has_inside) {
      const Tensor inside = autograd::raw([&] { return ops::lt(ops::abs(dd), param); });
      const double k = kind == ops::PointwiseLoss::SmoothL1 ? 1.0 / param : 1.0;
      slope = frugal::where(inside, frugal::mul(diff, k), sign);
    }
    const Tensor d = frugal::mul(slope, g);
    TensorList out(2);
    if (wants_grad(*this, 0)) out[0] = graph::with_zero_derivative(graph::sum_to(d, a.sizes()), *this, 0);
    if (wants_grad(*this, 1)) out[1] = graph::with_zero_derivative(frugal::neg(graph::sum_to(d, b.sizes())), *this, 1);
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

namespace {

/// nll_loss from targets nll_targets already checked and weighed (`t`, for `target`): a
/// composition of differentiable ops (gather, mul, sum, div), so its gradient is theirs.
Tensor nll_loss_of_targets(const Tensor& log_probs, const Tensor& target, const ops::NllTargets& t,
                           Reduction reduction) {
  const Tensor picked =
      log_probs.dim() == 1 ? gather(log_probs, 0, t.index.reshape({1})) : gather(log_probs, 1, t.index.unsqueeze(1));
  // Ignored targets are masked, not only weighted by 0: when every target is ignored, Mean
  // divides by a total weight of 0, and inf * 0 would send NaN into the ignored rows'
  // gradients, where PyTorch gives 0 (the loss itself is NaN in both).
  const Tensor zero = zeros({}, t.weight.options());
  const Tensor loss = where(t.valid, neg(mul(picked.reshape(target.sizes()), t.weight)), zero);
  switch (reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: break;
  }
  return div(sum(loss), sum(t.weight));
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const ops::NllLossOptions& options) {
  core::OpScope scope("nll_loss");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&log_probs})) return nll_loss((*c)[0], target, options);
  ops::NllLossOptions raw_options = options;
  if (raw_options.weight.defined()) raw_options.weight = raw_options.weight.detach();
  const ops::NllTargets t = autograd::raw([&] { return ops::nll_targets(log_probs, target, raw_options); });
  return nll_loss_of_targets(log_probs, target, t, options.reduction);
}

namespace {

// Note [Weighted cross entropy]
// With class weights w, torch.nn.functional.cross_entropy is
//   (1 - e) * nll_loss(log_softmax(x), t, w) + (e / C) * smooth,
//   smooth_i = -sum_c w_c * log_softmax(x)_ic   (0 for an ignored target),
// where Mean divides both terms by the sum of w[t_i] over the targets kept (not by their
// count), Sum adds them up and None keeps one per target (aten's
// cross_entropy_loss_label_smoothing). It is composed here from differentiable ops: the
// fused kernel (Note [Fused cross entropy]) keeps only the logsumexp per row, while this
// path holds a (N, C) log_softmax for backward, which a user asking for weights pays for.
Tensor weighted_cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  const Tensor weight = options.weight.detach();
  const ops::NllLossOptions nll_options{
      .weight = weight, .ignore_index = options.ignore_index, .reduction = options.reduction};
  FRUGAL_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
               "cross_entropy: label_smoothing must be in [0, 1], got ", options.label_smoothing);
  // Checks the operands (with cross_entropy's name) before log_softmax sees them.
  const ops::NllTargets t =
      autograd::raw([&] { return ops::nll_targets(logits, target, nll_options, "cross_entropy"); });
  const int64_t class_dim = logits.dim() == 1 ? 0 : 1, C = logits.size(class_dim);
  const Tensor log_probs = log_softmax(logits, class_dim);
  const Tensor nll = nll_loss_of_targets(log_probs, target, t, options.reduction);  // t: checked and weighed once
  if (options.label_smoothing == 0.0) return nll;
  Shape along_classes(size_t(logits.dim()), 1);
  along_classes[size_t(class_dim)] = C;
  const Tensor zero = zeros({}, log_probs.options());
  const Tensor per_target =
      where(t.valid, neg(sum(mul(log_probs, weight.to(logits.dtype()).view(along_classes)), {class_dim})), zero);
  Tensor smooth = per_target;
  if (options.reduction == Reduction::Sum) smooth = sum(per_target);
  if (options.reduction == Reduction::Mean) smooth = div(sum(per_target), ops::sum(t.weight));
  return add(mul(nll, 1.0 - options.label_smoothing), mul(smooth, options.label_smoothing / double(C)));
}

// Note [Cross entropy with class probabilities]
// A floating target of the logits' shape holds class probabilities (soft labels, as mixup
// and cutmix make): loss_i = -sum_c w_c y'_ic log_softmax(x)_ic, y' = (1 - e) y + e / C.
// Mean divides the sum by the number of rows (numel / C), never by the weights; Sum adds
// them; None keeps one per row (aten's cross_entropy_loss_prob_target). ignore_index has
// no meaning here: a non-negative one is an error, as in PyTorch. The dtypes promote as
// PyTorch's (float16 logits, float32 target: a float32 loss). Composed of differentiable
// ops, so the target gets its gradient too.
Tensor probability_cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  constexpr const char* op = "cross_entropy";
  FRUGAL_CHECK(is_floating(logits.dtype()) && logits.dim() >= 1 && target.sizes() == logits.sizes(), op,
               ": a floating target holds class probabilities and must have the shape of floating logits; got "
               "target ",
               target.describe(), " and logits ", logits.describe());
  check_same_device(op, logits, target);
  FRUGAL_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0, op,
               ": label_smoothing must be in [0, 1], got ", options.label_smoothing);
  FRUGAL_CHECK(options.ignore_index < 0, op,
               ": ignore_index is not supported for a floating (class probability) "
               "target, got ignore_index = ",
               options.ignore_index, " with target ", target.describe());
  const int64_t class_dim = logits.dim() == 1 ? 0 : 1, C = logits.size(class_dim);
  Tensor y = target;  // log_softmax(x) * y promotes: float16 logits with a float32 target give a float32 loss
  if (options.label_smoothing > 0.0)
    y = add(mul(y, 1.0 - options.label_smoothing), options.label_smoothing / double(C));
  Tensor picked = mul(log_softmax(logits, class_dim), y);
  if (options.weight.defined()) {
    const Tensor& w = options.weight;
    FRUGAL_CHECK(w.dim() == 1 && w.size(0) == C && is_floating(w.dtype()), op,
                 ": weight must be a floating (C) tensor with C = ", C, ", got ", w.describe());
    check_same_device(op, logits, w);
    Shape along_classes(size_t(logits.dim()), 1);
    along_classes[size_t(class_dim)] = C;
    picked = mul(picked, w.detach().to(picked.dtype()).view(along_classes));
  }
  switch (options.reduction) {
    case Reduction::None: return neg(sum(picked, {class_dim}));
    case Reduction::Sum: return neg(sum(picked));
    case Reduction::Mean: break;
  }
  const int64_t rows = C == 0 ? 0 : logits.numel() / C;  // 0 rows: 0 / 0 = NaN, as torch
  return div(neg(sum(picked)), double(rows));
}

}  // namespace

void detail::check_binary_loss_operands(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight,
                                        const Tensor& pos_weight) {
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  FRUGAL_CHECK(is_floating(input.dtype()) && input.dtype() == target.dtype(), op,
               ": expects input and target of one floating dtype, got ", input.describe(), " and ", target.describe());
  FRUGAL_CHECK(input.sizes() == target.sizes(), op, ": target ", target.describe(), " must have the input's size ",
               input.describe());
  check_same_device(op, input, target);
  for (const Tensor* w : {&weight, &pos_weight})
    if (w->defined()) {
      const std::string which = std::string(op) + (w == &weight ? " weight" : " pos_weight");
      FRUGAL_CHECK(is_floating(w->dtype()), which, " ", w->describe(), " must be floating");
      check_same_device(which.c_str(), input, *w);
      FRUGAL_CHECK(broadcast_shapes(input.sizes(), w->sizes(), which.c_str()) == input.sizes(), which, " ",
                   w->describe(), " does not broadcast to the input ", input.describe());
    }
}

// Note [Binary cross entropy with logits]
// loss = (1 - y) x + lw softplus(-x), lw = 1 + (pw - 1) y, times the weight: aten's
// formula, with log1p(exp(-|x|)) + max(-x, 0) written as softplus(-x) with an infinite
// threshold, which is exact for every x (the softplus kernel is the stable form, Note in
// tensor/ops/unary_math.h). Composed of differentiable ops, so the gradient in x is
// w (lw sigmoid(x) - pw y) and the one in y is w (-x + (pw - 1) softplus(-x)), everywhere:
// building softplus from |x| and relu instead would give x's gradient 0 at x = 0 (both
// kinks' conventions), where it is -0.5 for y = 0 (zero-initialised logits hit that).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& options) {
  constexpr const char* op = "binary_cross_entropy_with_logits";
  core::OpScope scope(op);
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&input, &target}))
    return binary_cross_entropy_with_logits((*c)[0], (*c)[1], options);
  detail::check_binary_loss_operands(op, input, target, options.weight, options.pos_weight);
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor softplus_neg = softplus(neg(input), 1.0, inf);
  Tensor log_weight_term = softplus_neg;
  if (options.pos_weight.defined()) {
    const Tensor pw = options.pos_weight.detach().to(input.dtype());
    log_weight_term = mul(add(mul(sub(pw, 1.0), target), 1.0), softplus_neg);
  }
  Tensor loss = add(mul(rsub(target, 1.0), input), log_weight_term);
  if (options.weight.defined()) loss = mul(loss, options.weight.detach().to(input.dtype()));
  switch (options.reduction) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: break;
  }
  return mean(loss);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  core::OpScope scope("cross_entropy");
  // A floating target (class probabilities) is cast too, as torch.autocast's float32 list casts
  // every floating argument; class indices are integers and stay as they are.
  if (auto c = autocast::cast_inputs(Policy::Float32, {&logits, &target}))
    return cross_entropy((*c)[0], (*c)[1], options);
  if (logits.defined() && target.defined() && is_floating(target.dtype()))
    return probability_cross_entropy(logits, target, options);
  if (options.weight.defined()) return weighted_cross_entropy(logits, target, options);
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
