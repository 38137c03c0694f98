#pragma once
// cross_entropy(linear(x, weight, bias), target) without the logits: the rows are taken
// in chunks, so the (N, C) logits and their gradient never exist at once, and rows whose
// target is ignore_index are skipped (Note [Fused linear cross entropy]). For a language
// model's head, where C is the vocabulary, these are the largest tensors of a step.
#include "tensor/ops/loss.h"  // CrossEntropyOptions
#include "tensor/tensor.h"

namespace frugal {

struct LinearCrossEntropyOptions {
  /// Reduction Mean or Sum (None needs the per-row logits); no class weights (use
  /// cross_entropy(linear(...)) for them).
  CrossEntropyOptions loss;
  /// Rows per chunk; 0 picks a quarter of the rows, at least 256 and at most 64 MiB of
  /// float32 logits.
  int64_t chunk_rows = 0;
};

/// cross_entropy(linear(x, weight, bias), target, options.loss): x (..., H), weight (C, H),
/// bias (C) or undefined, target (...) int64/int32. Differentiable in x, weight and bias.
/// Under autocast the products run in the autocast dtype and the loss in float32, as the
/// unfused pair would; outside it a float16/bfloat16 problem's loss is float32 too (the unfused
/// pair would round it to 16 bits: the fused loss keeps its float32 sum, as llm.c's). The
/// gradients come back in the inputs' own dtypes. A Mean over no kept row (every target ignored,
/// or none) is NaN, with gradients 0, as PyTorch's.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& target,
                            const LinearCrossEntropyOptions& options = {});

}  // namespace frugal
