#pragma once
// Differentiable losses on probabilities: torch.nn.functional's binary_cross_entropy and
// kl_div (autograd/ops/prob_loss.cpp). The losses on logits live in autograd/ops/loss.h.
#include "tensor/ops/loss.h"  // Reduction
#include "tensor/tensor.h"

namespace frugal {

/// Options of binary_cross_entropy, as torch's keyword arguments. The weight is not
/// differentiated.
struct BceOptions {
  Tensor weight{};  // broadcasts to the input: a factor per element
  Reduction reduction = Reduction::Mean;
};

/// torch.nn.functional.binary_cross_entropy: the input holds probabilities; per element
/// -w (y max(log x, -100) + (1 - y) max(log(1 - x), -100)), reduced (Mean: over every
/// element). Input and target of one shape and floating dtype. An input outside [0, 1] (or
/// NaN) throws, naming its position: at the op on the CPU, at the next synchronization on
/// CUDA. Differentiable in both, with PyTorch's backward (Note [Binary cross entropy]).
/// Refused under autocast, as PyTorch: binary_cross_entropy_with_logits is the safe form.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BceOptions& options = {});

/// kl_div's reductions: Reduction's, and BatchMean, the sum divided by input.size(0) (the KL
/// divergence per sample; a 0-d input divides by 1). Mean, PyTorch's default, is the mean
/// over every element, not the divergence.
enum class KlDivReduction { None, Mean, Sum, BatchMean };

/// Options of kl_div, as torch's keyword arguments.
struct KlDivOptions {
  KlDivReduction reduction = KlDivReduction::Mean;
  bool log_target = false;  // the target holds log-probabilities
};

/// torch.nn.functional.kl_div: the input holds log-probabilities; per element
/// t (log t - x), 0 where t = 0, or e^t (t - x) with log_target. Input and target broadcast,
/// floating (mixed dtypes promote). Differentiable in both (Note [KL divergence]).
Tensor kl_div(const Tensor& input, const Tensor& target, const KlDivOptions& options = {});

}  // namespace frugal
