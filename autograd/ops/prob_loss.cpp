// The losses on probabilities, binary_cross_entropy and kl_div, forward and backward side by side.
#include "autograd/ops/prob_loss.h"

#include <limits>
#include <string>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/loss.h"  // detail::check_binary_loss_operands
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/index.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"
#include "tensor/shape.h"

namespace frugal {

using autocast::Policy;
using autograd::make_node;
using autograd::SavedTensor;
using autograd::wants_grad;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Note [Binary cross entropy]
// aten's forward, per element (y - 1) max(log1p(-x), -100) - y max(log x, -100), times the
// weight: the clamp keeps a saturated probability (x = 0 or 1) finite, 100 per element.
// 16-bit operands are computed in float32 and the result rounded once (PyTorch's kernels
// compute in float32 too). The backward is a node of its own because its input gradient is
// aten's formula, not the clamped forward's derivative:
//   d/dx = w (x - y) / max(x (1 - x), 1e-12),
// finite at x = 0 and 1, where the clamped forward's derivative would be 0 and no gradient
// would move a saturated prediction. The target's gradient is the forward's own derivative,
//   d/dy = w (max(log1p(-x), -100) - max(log x, -100)),
// which is PyTorch's w (log(1 - x) - log x) = -w logit(x) wherever a logarithm is above -100
// (x in [3.8e-44, 1 - 1e-16] in float64); at x = 0 or 1 PyTorch's is +-inf and this is
// +-100, finite. An input outside [0, 1], or NaN, is an error, as PyTorch's CPU kernel ("all
// elements of input should be between 0 and 1"); so is such a target, which PyTorch 1.13
// does not check (a target of 2 is no probability: its loss is meaningless). The
// check is ops::check_index_range over (x outside [0, 1]) as an index into one slot: at once
// on the CPU, and on CUDA a deferred check read at the next synchronization, with no host
// sync at the op (Note [Deferred index checks] in memory/deferred_checks.h), where PyTorch's
// CUDA kernel asserts on the device. Under autocast it is refused, as PyTorch: the logarithms
// of probabilities rounded to 16 bits saturate, and the sigmoid before it is better folded
// into binary_cross_entropy_with_logits, which autocast runs in float32.

// max(log x, -100) and max(log(1 - x), -100), the forward's and the target gradient's terms.
Tensor clamped_log(const Tensor& x) { return ops::clamp(ops::log(x), -100.0, kInf); }
Tensor clamped_log1m(const Tensor& x) { return ops::clamp(ops::log1p(ops::neg(x)), -100.0, kInf); }

struct BinaryCrossEntropyBackward final : autograd::Node {
  SavedTensor input{this}, target{this}, weight{this};  // weight: in the compute dtype, or not saved
  Reduction reduction = Reduction::Mean;
  std::string name() const override { return "BinaryCrossEntropyBackward"; }
  autograd::TensorList apply(autograd::TensorList&& grads) override {
    const Tensor saved_x = input.unpack(name());
    const DType compute = opmath_dtype(saved_x.dtype());
    const Tensor x = saved_x.to(compute), y = target.unpack(name()).to(compute);
    Tensor g = grads[0].to(compute);  // 0-d, or x's shape (None)
    if (reduction == Reduction::Mean) g = ops::div(g, double(x.numel()));
    if (weight.defined()) g = ops::mul(g, weight.unpack(name()));
    autograd::TensorList out(2);
    if (wants_grad(*this, 0)) {
      const Tensor denominator = ops::clamp(ops::mul(x, ops::affine(x, -1.0, 1.0)), 1e-12, kInf);
      out[0] = ops::div(ops::mul(g, ops::sub(x, y)), denominator).to(saved_x.dtype());
    }
    if (wants_grad(*this, 1)) out[1] = ops::mul(g, ops::sub(clamped_log1m(x), clamped_log(x))).to(saved_x.dtype());
    return out;
  }
  // The same formula in differentiable ops, x and y joined to their history (Note [Double backward]).
  bool has_graph_backward() const override { return true; }
  autograd::TensorList apply_graph(autograd::TensorList&& grads) override {
    const Tensor saved_x = autograd::graph::saved_input(*this, 0, input);
    const DType compute = opmath_dtype(saved_x.dtype());
    const Tensor x = saved_x.to(compute), y = autograd::graph::saved_input(*this, 1, target).to(compute);
    Tensor g = grads[0].to(compute);
    if (reduction == Reduction::Mean) g = frugal::div(g, double(x.numel()));
    if (weight.defined()) g = frugal::mul(g, weight.unpack(name()));
    autograd::TensorList out(2);
    if (wants_grad(*this, 0)) {
      const Tensor denominator = frugal::clamp(frugal::mul(x, frugal::rsub(x, 1.0)), 1e-12, kInf);
      out[0] = frugal::div(frugal::mul(g, frugal::sub(x, y)), denominator).to(saved_x.dtype());
    }
    if (wants_grad(*this, 1)) {
      const Tensor log_x = frugal::clamp(frugal::log(x), -100.0, kInf);
      const Tensor log_1mx = frugal::clamp(frugal::log1p(frugal::neg(x)), -100.0, kInf);
      out[1] = frugal::mul(g, frugal::sub(log_1mx, log_x)).to(saved_x.dtype());
    }
    return out;
  }
};

// Throws (or, on CUDA, files a deferred check) for an element of `input` outside [0, 1];
// `what` names it in the message ("input" or "target").
void check_probabilities(const char* op, const char* what, const Tensor& input) {
  if (input.numel() == 0) return;
  const Tensor outside = autograd::raw(
      [&] { return ops::logical_not(ops::logical_and(ops::ge(input, 0.0), ops::le(input, 1.0))).to(kInt32); });
  ops::check_index_range(
      outside, 1, [op, what, sizes = input.sizes(), desc = input.describe()](int64_t, int64_t position) {
        Shape at(sizes.size());
        for (size_t d = sizes.size(); d-- > 0;) {
          at[d] = position % sizes[d];
          position /= sizes[d];
        }
        return detail::str_cat(op, ": all elements of ", what, " should be between 0 and 1, but the one at ",
                               shape_str(at), " of ", what, " ", desc, " is outside [0, 1] or NaN");
      });
}

void check_bce_operands(const char* op, const Tensor& input, const Tensor& target, const BceOptions& options) {
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  FRUGAL_CHECK(!autocast::is_enabled(input.device().type), op,
               ": unsafe to autocast (many models put a sigmoid right before it, and the logarithms of 16-bit "
               "probabilities saturate), as in PyTorch; use binary_cross_entropy_with_logits on the logits, which "
               "is safe to autocast; got input ",
               input.describe());
  detail::check_binary_loss_operands(op, input, target, options.weight);
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BceOptions& options) {
  constexpr const char* op = "binary_cross_entropy";
  core::OpScope scope(op);
  check_bce_operands(op, input, target, options);
  check_probabilities(op, "input", input);
  check_probabilities(op, "target", target);
  const DType compute = opmath_dtype(input.dtype());
  const Tensor w = options.weight.defined() ? options.weight.detach().to(compute) : Tensor();
  const Tensor out = autograd::raw([&] {
    const Tensor x = input.to(compute), y = target.to(compute);
    Tensor loss = ops::sub(ops::mul(ops::sub(y, 1.0), clamped_log1m(x)), ops::mul(y, clamped_log(x)));
    if (w.defined()) loss = ops::mul(loss, w);
    switch (options.reduction) {
      case Reduction::None: break;
      case Reduction::Sum: loss = ops::sum(loss); break;
      case Reduction::Mean: loss = ops::mean(loss); break;  // no elements: NaN, as PyTorch
    }
    return loss.to(input.dtype());
  });
  if (auto node = make_node<BinaryCrossEntropyBackward>({input, target})) {
    node->input = input;
    node->target = target;
    if (w.defined()) node->weight = w;
    node->reduction = options.reduction;
    autograd::record(node, {out});
  }
  return out;
}

// Note [KL divergence]
// aten's composite, xlogy(t, t) - t x, or e^t (t - x) with log_target, then the reduction,
// built here from differentiable ops. xlogy(t, t) is written t log(t == 0 ? 1 : t): 0 at
// t = 0 with no 0 * -inf in the forward and none in the backward (the where() hands the
// constant 1 to the log there, so no gradient flows through log 0: the classic trap of
// where(t == 0, 0, t log t) is a NaN gradient). The input's gradient is -t, everywhere. The
// target's is log t + 1 - x for t > 0, as PyTorch; at t = 0 it is -x, taking t log t's
// derivative there as 0 where PyTorch's xlogy backward gives NaN (0 / 0) and the one-sided
// limit is -inf: one zero probability must not turn a whole target gradient NaN. A target
// below 0 is no distribution: its log, and so the loss, is NaN, as in PyTorch.
Tensor kl_div(const Tensor& input, const Tensor& target, const KlDivOptions& options) {
  constexpr const char* op = "kl_div";
  core::OpScope scope(op);
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  if (auto c = autocast::cast_inputs(Policy::Float32, {&input, &target})) return kl_div((*c)[0], (*c)[1], options);
  FRUGAL_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()), op,
               ": expects floating input and target, got ", input.describe(), " and ", target.describe());
  check_same_device(op, input, target);
  broadcast_shapes(input.sizes(), target.sizes(), op);  // throws, naming the op, when they do not broadcast
  Tensor pointwise;
  if (options.log_target) {
    pointwise = mul(exp(target), sub(target, input));
  } else {
    const Tensor safe = where(eq(target, 0.0), ones_like(target), target);
    pointwise = sub(mul(target, log(safe)), mul(target, input));
  }
  switch (options.reduction) {
    case KlDivReduction::None: return pointwise;
    case KlDivReduction::Sum: return sum(pointwise);
    case KlDivReduction::Mean: return mean(pointwise);
    case KlDivReduction::BatchMean: break;
  }
  // The sum per sample; a 0-d input has no batch dim and divides by 1, as PyTorch.
  return input.dim() == 0 ? sum(pointwise) : div(sum(pointwise), double(input.size(0)));
}

}  // namespace frugal
