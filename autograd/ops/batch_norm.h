#pragma once
// Differentiable batch norm (torch.nn.functional.batch_norm) and the fused
// batch_norm_add_relu and batch_norm_relu of ResNet's blocks. Channels-last (NHWC) inputs
// give channels-last outputs (Note [Channels-last layout] in tensor/memory_format.h). Same
// semantics as the raw ops in tensor/ops/batch_norm.h.
#include "tensor/tensor.h"

namespace frugal {

/// `running` (a running statistic to update), or undefined while a checkpoint recomputes a
/// training forward, which updated it already (Note [Checkpoint recompute] in
/// autograd/checkpoint.cpp). Eval reads the running statistics and keeps them.
Tensor running_stat_to_update(const Tensor& running, bool training);
/// Tells a checkpoint's forward the op's mode and, in eval, that it read the running
/// statistics (Note [What a replay must find unchanged] in autograd/checkpoint.cpp).
void note_batch_norm_mode(const char* op, bool training, const Tensor& running_mean, const Tensor& running_var);

/// torch.nn.functional.batch_norm on x (N, C, *): training normalizes with the batch
/// statistics and updates running_mean/running_var in place (when given; not again in a
/// checkpoint's recompute); eval uses them.
/// weight and bias (C) may be undefined; (C) tensors may be float32 for float16/bfloat16 x.
/// Differentiable in x, weight and bias; saves x, weight and the (C) mean and invstd.
/// See Note [Batch norm statistics].
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

/// relu(batch_norm(x, ...) + residual), ResNet's block tail, as one op (cuDNN's fused
/// kernel for channels-last float16/bfloat16 training on CUDA; Note [Batch norm add ReLU]).
/// residual has x's shape and dtype. Differentiable in x, residual, weight and bias;
/// saves x, the output (for ReLU's mask), weight, and the (C) mean and invstd.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum = 0.1, double eps = 1e-5);

/// relu(batch_norm(x, ...)) as one op, likewise (cuDNN's CUDNN_BATCHNORM_OPS_BN_ACTIVATION);
/// with a defined `residual` it is batch_norm_add_relu.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5,
                       const Tensor& residual = Tensor());

}  // namespace frugal
