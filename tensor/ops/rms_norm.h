#pragma once
// RMS normalization over the trailing dims, forward and backward (raw ops; the
// differentiable form is frugal::rms_norm in autograd/ops/rms_norm.h).
//
// Note [RMS norm is layer norm around zero]
// rms_norm (torch.nn.functional.rms_norm) is layer norm with the mean fixed at zero: each
// row of N = numel(normalized_shape) elements gets rstd = 1 / sqrt(mean_N(x^2) + eps), and
// y = x * rstd * weight, with no bias. So it runs on layer norm's kernels
// (tensor/cpu/norm.cpp, tensor/cuda/norm.cu, Note [CUDA layer norm kernels]) with their mean
// undefined: the forward skips the mean's pass (its pass over squared deviations, taken
// from zero, is the mean of squares), and only rstd is kept for the backward, 4 bytes a row
// (float32 for float32/float16/bfloat16 inputs, float64 for float64: Note [Layer norm
// statistics]). With xhat = x * rstd and dxhat = g * weight, the backward is layer norm's
// without its mean_N(dxhat) term, since no mean was subtracted:
//   dx      = rstd * (dxhat - xhat * mean_N(dxhat * xhat))
//   dweight = sum_M(g * xhat)
// eps defaults, as torch's kernels do, to the machine epsilon of the compute type: float32's
// (2^-23) for float32, float16 and bfloat16 inputs, float64's (2^-52) for float64.
#include <optional>

#include "tensor/tensor.h"

namespace frugal::ops {

/// The eps rms_norm uses when none is given: the epsilon of x's compute type (see Note [RMS
/// norm is layer norm around zero]).
double rms_norm_default_eps(DType x);

/// The outputs of rms_norm: y (x's shape and dtype), and the per-row rstd with the leading
/// (non-normalized) dims of x as its shape, in the compute dtype (float32, or float64 for
/// float64 x).
struct RmsNormResult {
  Tensor out, rstd;
};

/// x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dims, as
/// torch.nn.functional.rms_norm. weight has `normalized_shape` and x's dtype and device, or
/// is undefined (no scale). eps: rms_norm_default_eps(x.dtype()) when nullopt. Floating dtypes.
RmsNormResult rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                       std::optional<double> eps = std::nullopt);

/// Which gradients rms_norm_backward should compute.
struct RmsNormGradMask {
  bool x = true, weight = true;
};
/// grad_x (x's shape) and grad_weight (normalized_shape); undefined where not asked for or
/// where weight is absent.
struct RmsNormGrads {
  Tensor x, weight;
};

/// The gradients of rms_norm given grad_out (x's shape), the forward's x, rstd and weight
/// (undefined: no scale).
RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                               const Tensor& rstd, const Tensor& weight, RmsNormGradMask mask = {});

/// The elementwise pass of rms_norm alone, from a forward's rstd: out = x * rstd * weight per
/// row, rounded once, exactly as rms_norm writes it. It regenerates a forward's output from
/// what its backward keeps (Note [Recomputable outputs] in autograd/recompute_cheap.cpp).
Tensor rms_norm_apply(const Tensor& x, const Shape& normalized_shape, const Tensor& rstd,
                      const Tensor& weight = Tensor());

}  // namespace frugal::ops
