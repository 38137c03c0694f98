#pragma once
// Differentiable 2-D convolution (torch.nn.functional.conv2d). Channels-last (NHWC)
// inputs give channels-last outputs (Note [Channels-last layout] in
// tensor/memory_format.h). Same semantics as the raw op in tensor/ops/conv.h.
#include "tensor/ops/conv.h"  // Int2, Conv2dOptions, ConvTranspose2dOptions
#include "tensor/tensor.h"

namespace frugal {

/// torch.nn.functional.conv2d: x (N, C, H, W) or (C, H, W), weight (K, C / groups, R, S),
/// bias (K) or undefined. Saves x only if the weight needs a gradient and the weight only
/// if x does.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& options = {});

/// torch.nn.functional.conv_transpose2d: x (N, C_in, H, W) or (C_in, H, W), weight (C_in,
/// C_out / groups, R, S), bias (C_out) or undefined (Note [Transposed convolution] in
/// tensor/ops/conv.h). Saves x only if the weight needs a gradient and the weight only if x
/// does; differentiable to any order.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& options = {});

/// Records conv2d's backward for `out` = conv2d(x, weight, bias, options) computed by a fused
/// raw op (conv2d_stats in autograd/ops/conv_bn.h): the same node and saved tensors as conv2d.
void record_conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Conv2dOptions& options);

}  // namespace frugal
