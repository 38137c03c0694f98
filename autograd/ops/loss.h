#pragma once
// Differentiable losses (torch.nn.functional's cross_entropy, mse_loss, l1_loss, smooth_l1_loss,
// huber_loss, nll_loss and binary_cross_entropy_with_logits). Same semantics as the raw ops in tensor/ops/loss.h.
#include "tensor/ops/loss.h"  // Reduction, CrossEntropyOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.cross_entropy with class-index targets (int64/int32): logits (N, C),
/// (C) or (N, C, d1, ...); see Note [Fused cross entropy]. Differentiable in the logits.
/// With options.weight, torch's weighted loss (Note [Weighted cross entropy]). A floating
/// target of the logits' shape holds class probabilities (Note [Cross entropy with class
/// probabilities]), differentiable too.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

/// torch.nn.functional.mse_loss: mean (or sum, or none) of (input - target)^2; input and
/// target broadcast; differentiable in both.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

/// torch.nn.functional.l1_loss: |input - target|, reduced; differentiable in both (sign(d),
/// 0 at 0). Note [Pointwise regression losses].
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
/// torch.nn.functional.smooth_l1_loss: 0.5 d^2 / beta inside |d| < beta, |d| - 0.5 beta
/// outside; beta = 0 is l1_loss.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0);
/// torch.nn.functional.huber_loss: 0.5 d^2 inside |d| < delta, delta (|d| - 0.5 delta) outside.
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);

/// torch.nn.functional.nll_loss: -weight[t] * log_probs[t] per target, log_probs (N, C), (C)
/// or (N, C, d1, ...) as cross_entropy's logits; ignore_index entries give 0; Mean divides
/// the sum by the sum of the non-ignored targets' weights (NaN when it is 0, as PyTorch).
/// Differentiable in log_probs (not in weight, as PyTorch). nll_loss(log_softmax(x, 1), t) is
/// cross_entropy(x, t) with class weights.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const ops::NllLossOptions& options = {});

/// Options of binary_cross_entropy_with_logits, as torch's keyword arguments. Neither
/// weight is differentiated.
struct BceWithLogitsOptions {
  Tensor weight{};      // broadcasts to the input: a factor per element
  Tensor pos_weight{};  // broadcasts to the input (a (C) one along the last dim): the positives' factor
  Reduction reduction = Reduction::Mean;
};

/// torch.nn.functional.binary_cross_entropy_with_logits: per element
/// w * ((1 - y) x + (1 + (pw - 1) y) softplus(-x)), reduced (Mean: over every element).
/// Input and target of one shape and floating dtype; differentiable in both (Note
/// [Binary cross entropy with logits]).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& options = {});

namespace detail {
/// The operand checks of both binary cross entropies: input and target defined, of one
/// floating dtype and shape, on one device; weight and pos_weight (undefined: none)
/// floating, on that device, broadcasting to the input. Errors name `op`.
void check_binary_loss_operands(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight,
                                const Tensor& pos_weight = Tensor());
}  // namespace detail

}  // namespace frugal
