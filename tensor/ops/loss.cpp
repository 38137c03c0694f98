#include "tensor/ops/loss.h"

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

/// Checks the operands (PyTorch's shape rules for class-index targets) and brings the
/// classes to the last dim: (N, C, d1, ...) is permuted to (N, d1, ..., C) (a copy).
CrossEntropyRows cross_entropy_rows(const char* op, const Tensor& logits, const Tensor& target,
                                    const CrossEntropyOptions& opts) {
  FRUGAL_CHECK(logits.defined() && target.defined(), op, ": undefined logits or target");
  FRUGAL_CHECK(is_floating(logits.dtype()), op, ": expects floating-point logits, got ", logits.describe());
  FRUGAL_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, op,
               ": expects class indices (int64 or int32) as target, got ", target.describe());
  check_same_device(op, logits, target);
  FRUGAL_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0, op,
               ": label_smoothing must be in [0, 1], got ", opts.label_smoothing);
  FRUGAL_CHECK(logits.dim() >= 1, op, ": logits must have a class dim, got ", logits.describe());
  Shape expected;  // the target's shape: logits' without the class dim
  if (logits.dim() >= 2) {
    expected = logits.sizes();
    expected.erase(expected.begin() + 1);
  }
  FRUGAL_CHECK(target.sizes() == expected, op, ": target ", target.describe(), " does not match logits ",
               logits.describe(), " (expected target shape ", shape_str(expected), ")");
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
    // Values only: on CUDA the message may be built later (Note [Deferred index checks]).
    finish_index_check(e, [op, C = rows.C, ignore = opts.ignore_index, sizes = target.sizes(),
                           tdesc = target.describe(), ldesc = logits.describe()](int64_t value, int64_t row) {
      Shape pos(sizes.size());
      for (size_t d = pos.size(), i = size_t(row); d-- > 0;) {
        pos[d] = int64_t(i % size_t(sizes[d]));
        i /= size_t(sizes[d]);
      }
      return detail::str_cat(op, ": target ", value, " is out of range for ", C, " classes (valid range [0, ", C,
                             ") or ignore_index ", ignore, ") at position ", shape_str(pos), " of target ", tdesc,
                             " (logits ", ldesc, ")");
    });
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
               lse.defined() ? lse.describe() : "undefined", " is not the forward's (", rows.R,
               " values of float64)");
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

}  // namespace frugal::ops
