#pragma once
// Differentiable convolution, pooling and batch norm for CNNs (torch.nn.functional's
// conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d, batch_norm) and the fused
// batch_norm_add_relu. Channels-last (NHWC) inputs give channels-last outputs
// (Note [Channels-last layout] in tensor/memory_format.h). Same semantics as the
// raw ops in tensor/ops/{conv,pool,batch_norm}.h; definitions in autograd/ops/conv.cpp.
#include "tensor/ops/conv.h"  // Int2, Conv2dOptions
#include "tensor/ops/pool.h"  // MaxPool2dOptions, AvgPool2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.conv2d: x (N, C, H, W) or (C, H, W), weight (K, C / groups, R, S),
/// bias (K) or undefined. Saves x only if the weight needs a gradient and the weight only
/// if x does.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& options = {});

/// torch.nn.functional.max_pool2d: saves the int64 argmax indices (not x).
Tensor max_pool2d(const Tensor& x, Int2 kernel, const MaxPool2dOptions& options = {});

/// torch.nn.functional.avg_pool2d: saves nothing but the shape.
Tensor avg_pool2d(const Tensor& x, Int2 kernel, const AvgPool2dOptions& options = {});

/// torch.nn.functional.adaptive_avg_pool2d: saves nothing but the shape.
Tensor adaptive_avg_pool2d(const Tensor& x, Int2 output_size);

/// torch.nn.functional.batch_norm on x (N, C, *): training normalizes with the batch
/// statistics and updates running_mean/running_var in place (when given); eval uses them.
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
