#pragma once
// Losses as raw ops: cross_entropy (fused log-softmax + NLL, with label smoothing and
// ignore_index) and its backward, and mse_loss. The differentiable forms are
// frugal::cross_entropy / frugal::mse_loss in autograd/ops/loss.h.
//
// Note [Fused cross entropy]
// For a row x of C logits with target t, smoothing e and lse = log(sum_c exp(x_c)),
// PyTorch's loss is (1 - e) * nll + (e / C) * sum_c(-log_softmax(x)_c), that is
//   loss = (1 - e) * (lse - x_t) + e * (lse - mean_c(x_c)),
// and 0 for a row whose target is ignore_index. One kernel reads each row once and
// folds the online (max, sum of exp) pair of Note [Stable softmax] together with
// sum_c x_c, so it produces lse and the loss without materializing log_softmax. Mean
// divides the sum of the row losses by the number of non-ignored targets (NaN when
// there are none, as in PyTorch), which stays on the device: no host sync. The
// gradient needs only lse, saved per row (8 bytes, not a C-wide softmax):
//   dloss/dx_c = scale_row * (exp(x_c - lse) - (1 - e) * [c == t] - e / C)
// with scale_row the incoming gradient (divided by the count for Mean), 0 for
// ignored rows; one elementwise kernel writes it. Row losses and the count are
// kept in the compute type (float32; float64 for float64 logits), lse in float64
// (Note [Cross entropy keeps lse in float64]), and the reduced loss is rounded once to
// the logits' dtype. A target outside [0, C) other than
// ignore_index throws frugal::Error (on CUDA through a device flag read at the next
// synchronization, as the index ops do: Note [Deferred index checks]).
//
// Note [Cross entropy keeps lse in float64]
// A confident row has lse - x_t tiny while lse itself is large: logits (100, 90, ...) give
// a loss of 4.5e-5, but lse = 100.0000454 rounded to float32 moves by up to 3.8e-6 (half
// an ulp of 100), 8% of the loss; at logits near 1000 the rounding is larger than the loss,
// which then reads 0, and so does the target's gradient exp(x_t - lse) - 1. That error is
// u |lse|, not the u (|loss| + log C) that rounding the logits themselves can cause: a
// silent wrong answer, not conditioning. So the kernels form each row's loss from
// (m - x_t) + log(sum exp(x - m)) (m the row max, log(...) in [0, log C]) without rounding
// lse first, and save lse in float64 for every logits dtype (8 bytes a row): the backward
// takes x - lse in float64 and rounds that difference, which is small where it matters, to
// the compute type before its exp. PyTorch's log_softmax + nll_loss keep lse - m implicitly
// (log_softmax is stored relative to the max) and are accurate here too; fused kernels
// that keep a float32 lse (Apex's xentropy) are not. tests/cpu/test_probe_numerics.cpp
// holds the bounds.
#include <cstdint>

#include "tensor/ops/index.h"
#include "tensor/tensor.h"

namespace frugal {

/// How a loss reduces its per-element values (as PyTorch's `reduction=`).
enum class Reduction { None, Mean, Sum };

/// Options of cross_entropy, as torch.nn.functional.cross_entropy's keyword arguments.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // targets equal to this contribute nothing
  double label_smoothing = 0.0;  // in [0, 1]
  Reduction reduction = Reduction::Mean;
  /// Class weights (C), floating, not differentiated (Note [Weighted cross entropy] in
  /// autograd/ops/loss.cpp). Taken by frugal::cross_entropy only; the fused kernels refuse it.
  Tensor weight{};
};

}  // namespace frugal

namespace frugal::ops {

/// The outputs of cross_entropy: the loss (None: the target's shape; otherwise 0-d; the
/// logits' dtype), the per-row logsumexp (the target's shape, float64: Note [Cross entropy
/// keeps lse in float64]) and, for
/// Reduction::Mean, the 0-d number of non-ignored targets (compute dtype; else undefined).
struct CrossEntropyResult {
  Tensor loss, lse, count;
};

/// torch.nn.functional.cross_entropy with class-index targets: logits (N, C), (C) or
/// (N, C, d1, ...) (classes at dim 1), target int64/int32 of shape (N), () or (N, d1, ...).
/// See Note [Fused cross entropy].
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts = {});

/// Gradient of cross_entropy with respect to the logits (the logits' shape and dtype), given
/// the loss gradient (the loss's shape) and the forward's lse and count.
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& count, const CrossEntropyOptions& opts = {});

/// (input - target)^2 reduced as `reduction` (None keeps the broadcast shape), as
/// torch.nn.functional.mse_loss; input and target broadcast and share a floating dtype.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// Note [Pointwise regression losses]
// l1_loss, smooth_l1_loss and huber_loss are functions of d = input - target alone, as
// torch.nn.functional's:
//   l1:        |d|
//   smooth_l1: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta   (beta = 0: l1)
//   huber:     0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)
// (huber = delta * smooth_l1 with beta = delta.) Their derivatives in d are torch's backward
// formulas, written out rather than taken through a `where` of the two branches: the branch a
// `where` does not pick still gets a zero gradient, and 0 * (the other branch's derivative)
// is NaN at an infinite d, where torch's sign(d) gives +-1 (and +-delta for huber):
//   l1: sign(d) (0 at 0)   smooth_l1: d / beta inside, sign(d) outside   huber: d inside,
//   delta sign(d) outside.
// At |d| = beta (delta) both sides agree. A NaN d gives NaN in value and gradient (PyTorch
// 1.13's l1 gradient there is 0, its sign(NaN); a NaN that reaches a loss should show),
// except where the incoming gradient is 0: a NaN target that a mask or `where` kept out of
// the loss gives the gradient 0 there, as PyTorch's.
// 16-bit inputs are computed in float32 and rounded once, as PyTorch's CPU kernels do.
// smooth_l1 with beta = 0 is l1 in the gradient too, 0 at d = 0, as PyTorch 2's
// F.smooth_l1_loss, which calls l1_loss when beta = 0 (Debian's PyTorch 1.13 gives -1 there).
enum class PointwiseLoss { L1, SmoothL1, Huber };
/// "l1_loss", "smooth_l1_loss", "huber_loss".
const char* pointwise_loss_name(PointwiseLoss kind);
/// The loss of Note [Pointwise regression losses]; input and target broadcast, one floating
/// dtype; `param` is beta (SmoothL1, >= 0) or delta (Huber, > 0), ignored for L1.
Tensor pointwise_loss(PointwiseLoss kind, const Tensor& input, const Tensor& target, double param,
                      Reduction reduction = Reduction::Mean);
/// The elementwise derivative of the unreduced loss in d, times g (g broadcasts with d).
Tensor pointwise_loss_backward(PointwiseLoss kind, const Tensor& g, const Tensor& d, double param);

/// torch.nn.functional.nll_loss's options.
struct NllLossOptions {
  Tensor weight{};  // (C) weight of each class, or undefined (all 1)
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
};
/// What nll_loss takes from its target (frugal::nll_loss in autograd/ops/loss.h gathers with
/// it): `index`, the target with ignored entries set to 0 (safe to gather), `weight`, each
/// entry's weight in the input's dtype (0 where ignored; weight[t], or 1), and `valid`, bool,
/// false where the target is ignore_index (a class weight of 0 is not that). Checks the shapes
/// as cross_entropy does and the range of the targets (on CUDA at the next synchronization:
/// Note [Deferred index checks]).
/// target with its ignored entries (valid false) set to 0, after checking the others lie in
/// [0, C); a bad one is named with its position in `target` and `input`'s description (on
/// CUDA at the next synchronization: Note [Deferred index checks]).
Tensor checked_class_index(const char* op, const Tensor& target, const Tensor& valid, int64_t C, int64_t ignore_index,
                           const Tensor& input);
struct NllTargets {
  Tensor index, weight, valid;
};
/// `op` names the caller in errors (cross_entropy with class weights uses it too).
NllTargets nll_targets(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options,
                       const char* op = "nll_loss");

}  // namespace frugal::ops

// Backend kernels: logits (R, C) contiguous, R > 0; target (R) contiguous int32/int64;
// loss: (R) in opmath of the logits; lse: (R) float64; grad_logits (R, C) contiguous.
namespace frugal::ops::cpu {
/// loss, lse: (R); logits: (R, C); target: (R). A bad target is reported through err.
void cross_entropy_kernel(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          int64_t ignore_index, double label_smoothing, IndexError& err);
/// grad: (R, C); logits: (R, C); target, lse: (R); scale: (R) (scale_stride 1) or one element (stride 0)
void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   const Tensor& scale, int64_t scale_stride, int64_t ignore_index,
                                   double label_smoothing);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void cross_entropy_kernel(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          int64_t ignore_index, double label_smoothing, IndexError& err);
void cross_entropy_backward_kernel(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   const Tensor& scale, int64_t scale_stride, int64_t ignore_index,
                                   double label_smoothing);
}  // namespace frugal::ops::cuda
