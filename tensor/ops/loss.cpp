#include "tensor/ops/loss.h"

#include <cmath>
#include <vector>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/unary.h"

namespace frugal::ops {

namespace {

DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

/// logits and target as rows: (R, C) and (R), classes moved last.
struct CrossEntropyRows {
  int64_t R = 0, C = 0;
  Tensor logits2d, target1d;
};

/// PyTorch's shape rules for class-index targets: logits (C) with a 0-d target, (N, C) with
/// (N), (N, C, d1, ...) with (N, d1, ...). Returns the number of classes.
int64_t check_class_target(const char* op, const Tensor& logits, const Tensor& target) {
  FRUGAL_CHECK(logits.defined() && target.defined(), op, ": undefined input or target");
  FRUGAL_CHECK(is_floating(logits.dtype()), op, ": expects a floating-point input, got ", logits.describe());
  FRUGAL_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, op,
               ": expects class indices (int64 or int32) as target, got ", target.describe());
  check_same_device(op, logits, target);
  FRUGAL_CHECK(logits.dim() >= 1, op, ": input must have a class dim, got ", logits.describe());
  Shape expected;  // the target's shape: logits' without the class dim
  if (logits.dim() >= 2) {
    expected = logits.sizes();
    expected.erase(expected.begin() + 1);
  }
  FRUGAL_CHECK(target.sizes() == expected, op, ": target ", target.describe(), " does not match input ",
               logits.describe(), " (expected target shape ", shape_str(expected), ")");
  return logits.dim() == 1 ? logits.size(0) : logits.size(1);
}

/// The message of a target outside [0, C) that is not ignore_index; values only, as it may be
/// built later on CUDA (Note [Deferred index checks]).
memory::CheckMessage bad_target_message(const char* op, int64_t C, int64_t ignore, const Tensor& target,
                                        const Tensor& logits) {
  return [op, C, ignore, sizes = target.sizes(), tdesc = target.describe(), ldesc = logits.describe()](int64_t value,
                                                                                                       int64_t row) {
    Shape pos(sizes.size());
    for (size_t d = pos.size(), i = size_t(row); d-- > 0;) {
      pos[d] = int64_t(i % size_t(sizes[d]));
      i /= size_t(sizes[d]);
    }
    return detail::str_cat(op, ": target ", value, " is out of range for ", C, " classes (valid range [0, ", C,
                           ") or ignore_index ", ignore, ") at position ", shape_str(pos), " of target ", tdesc,
                           " (input ", ldesc, ")");
  };
}

/// Checks the operands and brings the classes to the last dim: (N, C, d1, ...) is permuted
/// to (N, d1, ..., C) (a copy).
CrossEntropyRows cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& target,
                                    const CrossEntropyOptions& opts) {
  check_class_target(op, logits, target);
  FRUGAL_CHECK(!opts.weight.defined(), op, ": class weights (", opts.weight.describe(),
               ") are not taken by this fused op; frugal::cross_entropy takes them");
  FRUGAL_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0, op,
               ": label_smoothing must be in [0, 1], got ", opts.label_smoothing);
  const Shape& expected = target.sizes();
  CrossEntropyRows r;
  r.C = logits.dim() == 1 ? logits.size(0) : logits.size(1);
  r.R = numel_of(expected);
  if (logits.dim() <= 2) {
    r.logits2d = logits.contiguous().reshape({r.R, r.C});
  } else {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < logits.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    r.logits2d = logits.permute(perm).contiguous().reshape({r.R, r.C});
  }
  r.target1d = target.contiguous().reshape({r.R});
  return r;
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts) {
  constexpr const char* op = "cross_entropy";
  const CrossEntropyRows rows = cross_entropy_rows(op, logits, target, opts);
  const TensorOptions acc{compute_dtype(logits.dtype()), logits.device()};
  // lse in float64 whatever the logits' dtype: Note [Cross entropy keeps lse in float64].
  Tensor loss_rows = zeros({rows.R}, acc), lse = empty({rows.R}, {kFloat64, logits.device()});
  if (rows.R > 0) {
    IndexError e;
    FRUGAL_DEVICE_DISPATCH(op, logits.device(), cross_entropy_kernel, loss_rows, lse, rows.logits2d, rows.target1d,
                           opts.ignore_index, opts.label_smoothing, e);
    finish_index_check(e, bad_target_message(op, rows.C, opts.ignore_index, target, logits));
  }
  CrossEntropyResult r;
  r.lse = lse.reshape(target.sizes());
  switch (opts.reduction) {
    case Reduction::None: r.loss = loss_rows.to(logits.dtype()).reshape(target.sizes()); break;
    case Reduction::Sum: r.loss = sum(loss_rows).to(logits.dtype()); break;
    case Reduction::Mean:
      r.count = sum(ne(rows.target1d, double(opts.ignore_index))).to(acc.dtype);
      r.loss = div(sum(loss_rows), r.count).to(logits.dtype());
      break;
  }
  return r;
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& count, const CrossEntropyOptions& opts) {
  constexpr const char* op = "cross_entropy_backward";
  const CrossEntropyRows rows = cross_entropy_rows(op, logits, target, opts);
  const DType acc = compute_dtype(logits.dtype());
  FRUGAL_CHECK(lse.defined() && lse.numel() == rows.R && lse.dtype() == kFloat64, op, ": lse ",
               lse.defined() ? lse.describe() : "undefined", " is not the forward's (", rows.R, " values of float64)");
  check_same_device(op, logits, lse);
  const Shape loss_shape = opts.reduction == Reduction::None ? target.sizes() : Shape{};
  FRUGAL_CHECK(grad_loss.defined() && grad_loss.sizes() == loss_shape, op, ": grad_loss ",
               grad_loss.defined() ? grad_loss.describe() : "undefined", " must have the loss's shape ",
               shape_str(loss_shape));
  check_same_device(op, logits, grad_loss);
  // The per-row factor of the gradient: g itself (None), or one value for every row.
  Tensor scale = grad_loss.to(acc).contiguous();
  if (opts.reduction == Reduction::Mean) {
    FRUGAL_CHECK(count.defined() && count.numel() == 1, op, ": Reduction::Mean needs the forward's count of targets");
    scale = div(scale, count.to(acc));
  }
  Tensor grad2d = empty({rows.R, rows.C}, logits.options());
  if (grad2d.numel() > 0)
    FRUGAL_DEVICE_DISPATCH(op, logits.device(), cross_entropy_backward_kernel, grad2d, rows.logits2d, rows.target1d,
                           lse.contiguous().reshape({rows.R}), scale,
                           opts.reduction == Reduction::None ? int64_t(1) : int64_t(0), opts.ignore_index,
                           opts.label_smoothing);
  if (logits.dim() <= 2) return grad2d.reshape(logits.sizes());
  // (N * d1 * ..., C) -> (N, d1, ..., C) -> (N, C, d1, ...)
  Shape moved{logits.size(0)};
  for (int64_t d = 2; d < logits.dim(); ++d) moved.push_back(logits.size(d));
  moved.push_back(rows.C);
  std::vector<int64_t> perm{0, logits.dim() - 1};
  for (int64_t d = 1; d < logits.dim() - 1; ++d) perm.push_back(d);
  return grad2d.reshape(moved).permute(perm).contiguous();
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  constexpr const char* op = "mse_loss";
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  FRUGAL_CHECK(is_floating(input.dtype()) && input.dtype() == target.dtype(), op,
               ": expects input and target of one floating dtype, got ", input.describe(), " and ", target.describe());
  check_same_device(op, input, target);
  broadcast_shapes(input.sizes(), target.sizes(), op);
  const Tensor sq = square(sub(input, target));
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    case Reduction::Mean: break;
  }
  return mean(sq);
}

Tensor checked_class_index(const char* op, const Tensor& target, const Tensor& valid, int64_t C, int64_t ignore_index,
                           const Tensor& input) {
  Tensor index = where(valid, target, zeros({}, {target.dtype(), target.device()}));
  // Ignored entries are 0 in the index, the others the target's own values: checking the
  // index against [0, C) passes every ignored entry and names a bad value as given.
  check_index_range(index, C, bad_target_message(op, C, ignore_index, target, input));
  return index;
}

NllTargets nll_targets(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options, const char* op) {
  const int64_t C = check_class_target(op, log_probs, target);
  const Tensor& weight = options.weight;
  if (weight.defined()) {
    FRUGAL_CHECK(weight.dim() == 1 && weight.size(0) == C && is_floating(weight.dtype()), op,
                 ": weight must be a floating (C) tensor with C = ", C, ", got ", weight.describe());
    check_same_device(op, log_probs, weight);
  }
  NllTargets r;
  const Tensor& valid = r.valid = ne(target, double(options.ignore_index));
  r.index = checked_class_index(op, target, valid, C, options.ignore_index, log_probs);
  r.weight = valid.to(log_probs.dtype());
  if (weight.defined())
    r.weight =
        mul(r.weight, index_select(weight.to(log_probs.dtype()), 0, r.index.reshape({-1})).reshape(target.sizes()));
  return r;
}

const char* pointwise_loss_name(PointwiseLoss kind) {
  switch (kind) {
    case PointwiseLoss::L1: return "l1_loss";
    case PointwiseLoss::SmoothL1: return "smooth_l1_loss";
    case PointwiseLoss::Huber: return "huber_loss";
  }
  return "?";
}

namespace {
void check_pointwise_loss(PointwiseLoss kind, const Tensor& input, const Tensor& target, double param) {
  const char* op = pointwise_loss_name(kind);
  FRUGAL_CHECK(input.defined() && target.defined(), op, ": undefined input or target");
  FRUGAL_CHECK(is_floating(input.dtype()) && input.dtype() == target.dtype(), op,
               ": expects input and target of one floating dtype, got ", input.describe(), " and ", target.describe());
  check_same_device(op, input, target);
  broadcast_shapes(input.sizes(), target.sizes(), op);
  if (kind == PointwiseLoss::SmoothL1)
    FRUGAL_CHECK(std::isfinite(param) && param >= 0, op, ": beta must be finite and >= 0, got ", param);
  if (kind == PointwiseLoss::Huber)
    FRUGAL_CHECK(std::isfinite(param) && param > 0, op, ": delta must be finite and > 0, got ", param);
}
}  // namespace

// Note [Pointwise regression losses]
Tensor pointwise_loss(PointwiseLoss kind, const Tensor& input, const Tensor& target, double param,
                      Reduction reduction) {
  check_pointwise_loss(kind, input, target, param);
  // 16-bit inputs are computed in float32 and rounded once: d^2 of a float16 d above 256
  // overflows before the division by beta (smooth_l1(300, beta 1000) is 45, not inf).
  const DType dtype = input.dtype(), acc = compute_dtype(dtype);
  const Tensor d = sub(input.to(acc), target.to(acc)), z = abs(d);
  Tensor loss;
  if (kind == PointwiseLoss::L1 || (kind == PointwiseLoss::SmoothL1 && param == 0)) {
    loss = z;
  } else {
    const double scale = kind == PointwiseLoss::SmoothL1 ? 1.0 : param;  // huber = delta * smooth_l1(beta = delta)
    const Tensor inside = mul(square(d), 0.5 * scale / param);
    // scale (|d| - beta / 2), not scale |d| - scale beta / 2: a huge delta's delta^2 overflows
    const Tensor below = affine(z, 1.0, -0.5 * param);
    const Tensor outside = scale == 1.0 ? below : mul(below, scale);
    loss = where(lt(z, param), inside, outside);
  }
  switch (reduction) {
    case Reduction::None: return loss.to(dtype);
    case Reduction::Sum: return sum(loss).to(dtype);
    case Reduction::Mean: break;
  }
  return mean(loss).to(dtype);
}

Tensor pointwise_loss_backward(PointwiseLoss kind, const Tensor& g, const Tensor& d, double param) {
  const Tensor gd = g.sizes() == d.sizes() ? g : g.expand(d.sizes()).contiguous();
  const Tensor sign_g = unary_backward(UnaryOp::Abs, gd, d);  // g sign(d), 0 at 0, NaN at NaN unless g is 0
  if (kind == PointwiseLoss::L1 || (kind == PointwiseLoss::SmoothL1 && param == 0)) return sign_g;
  const double scale = kind == PointwiseLoss::SmoothL1 ? 1.0 : param;
  const DType acc = compute_dtype(d.dtype());  // as the forward: d g of 16-bit values may overflow
  const Tensor inside = mul(mul(d.to(acc), gd.to(acc)), scale / param).to(d.dtype());
  return where(lt(abs(d), param), inside, mul(sign_g, scale));
}

}  // namespace frugal::ops
