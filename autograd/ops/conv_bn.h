#pragma once
// Differentiable convolution + batch-norm fusions of ResNet's blocks: a convolution that also
// returns its output's batch statistics, and relu(batch_norm(.)) fused into the next
// convolution (Note [Convolution batch-norm fusion] in tensor/ops/conv_bn.h). Same results as
// conv2d, batch_norm_relu and conv2d composed, to rounding.
#include "tensor/ops/conv.h"  // Conv2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// A convolution's output with its per-channel sum and sum of squares ((C) float32, float64
/// for float64; undefined when not computed), which a following bn_relu_conv2d normalizes
/// with instead of reading the output again. The sums are not differentiable. `version` is
/// out's version when they were taken: after an in-place change of out, bn_relu_conv2d
/// computes them afresh.
struct ConvWithStats {
  Tensor out, sum, sq_sum;
  uint64_t version = 0;
};

/// A batch norm as bn_relu_conv2d applies it: the module's tensors (each undefined or (C),
/// as for batch_norm) and settings. `training` normalizes with the batch statistics and
/// updates the running ones; otherwise the running statistics normalize.
struct BatchNormArgs {
  Tensor running_mean, running_var, weight, bias;
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
};

/// conv2d(x, weight) without bias, and (when `stats`) the output's channel sums.
/// Differentiable in x and weight, with conv2d's backward and saved tensors.
ConvWithStats conv2d_stats(const Tensor& x, const Tensor& weight, const Conv2dOptions& options = {}, bool stats = true);

/// conv2d(relu(batch_norm(x.out, bn)), weight) without bias, and (when `stats`) the output's
/// channel sums. In training the batch norm takes its statistics from x's sums (computed
/// here when x has none) and updates the running statistics as batch_norm does.
/// Differentiable in x.out, bn.weight, bn.bias and weight. Saves x.out, weight and (C)
/// tensors only: relu(batch_norm(x.out)) is neither written in the forward (where cuDNN
/// fuses it into the convolution) nor kept, and the backward recomputes it.
ConvWithStats bn_relu_conv2d(const ConvWithStats& x, const BatchNormArgs& bn, const Tensor& weight,
                             const Conv2dOptions& options = {}, bool stats = true);

}  // namespace frugal
