#pragma once
// Layer normalization over the trailing dims, forward and backward (raw ops; the
// differentiable form is frugal::layer_norm in autograd/ops/norm.h).
//
// Note [Layer norm statistics]
// x is seen as (M, N): M rows (the leading dims) of N = numel(normalized_shape)
// elements. The forward computes each row's mean and rstd = 1 / sqrt(var + eps)
// (biased variance, as PyTorch) in one kernel, two passes over the row (mean, then
// sum((x - mean)^2), which never cancels catastrophically as E[x^2] - E[x]^2 can),
// and returns them for the backward, so the backward never recomputes them. They are
// stored in the compute type: float32 for float32/float16/bfloat16 inputs, float64
// for float64 (see Note [Half types compute in f32]); that is 8 bytes per row, not a
// copy of x. With xhat = (x - mean) * rstd and dxhat = g * weight, the backward is
// (llm.c layernorm_backward):
//   dx      = rstd * (dxhat - mean_N(dxhat) - xhat * mean_N(dxhat * xhat))
//   dweight = sum_M(g * xhat),  dbias = sum_M(g)
// dx is one kernel (a row reduction of the two means, then the write); dweight and
// dbias are one column reduction over the rows, deterministic (no atomics).
#include "tensor/tensor.h"

namespace frugal::ops {

/// The outputs of layer_norm: y (x's shape and dtype), and the per-row statistics
/// mean and rstd with the leading (non-normalized) dims of x as their shape, in the
/// compute dtype (float32, or float64 for float64 x). See Note [Layer norm statistics].
struct LayerNormResult {
  Tensor out, mean, rstd;
};

/// (x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape` dims,
/// as torch.nn.functional.layer_norm. weight and bias have `normalized_shape` and x's
/// dtype and device, and either may be undefined (no scale / no shift). Floating dtypes.
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                           const Tensor& bias = Tensor(), double eps = 1e-5);

/// Which gradients layer_norm_backward should compute.
struct LayerNormGradMask {
  bool x = true, weight = true, bias = true;
};
/// grad_x (x's shape), grad_weight and grad_bias (normalized_shape); undefined where not asked
/// for or where weight / bias is absent.
struct LayerNormGrads {
  Tensor x, weight, bias;
};

/// The gradients of layer_norm given grad_out (x's shape), the forward's x, mean, rstd and
/// weight (undefined: no scale). `has_bias` says whether the forward had a bias.
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight, bool has_bias,
                                   LayerNormGradMask mask = {});

/// The elementwise pass of layer_norm alone, from given statistics: out = (x - mean) * rstd
/// * weight + bias per row, in the compute dtype and rounded once, exactly as layer_norm's
/// kernels write it. x, weight and bias as in layer_norm; mean and rstd a forward's
/// LayerNormResult::mean and rstd. It regenerates a forward's output from what its backward
/// keeps (Note [Recomputable outputs] in autograd/recompute_cheap.cpp).
Tensor layer_norm_apply(const Tensor& x, const Shape& normalized_shape, const Tensor& mean, const Tensor& rstd,
                        const Tensor& weight = Tensor(), const Tensor& bias = Tensor());

/// float32 for float32/float16/bfloat16, float64 for float64: the dtype of mean and rstd.
DType norm_stats_dtype(DType t);
/// Checks x against normalized_shape (layer_norm and rms_norm); returns the leading dims
/// (the rows' shape).
Shape check_normalized_input(const char* op, const Tensor& x, const Shape& normalized_shape);
/// Checks an affine parameter p (undefined: none) of a norm over x: `shape` (described to
/// the user as `shape_name`), x's dtype and device.
void check_norm_param(const char* op, const char* what, const Tensor& p, const Tensor& x, const Shape& shape,
                      const char* shape_name);

}  // namespace frugal::ops

// Backend kernels: every tensor contiguous, M * N > 0. weight/bias (N) may be undefined;
// mean, rstd: (M) in opmath_t of x's dtype. An undefined mean makes them RMS norm's kernels
// (Note [RMS norm is layer norm around zero] in tensor/ops/rms_norm.h).
namespace frugal::ops::cpu {
/// out, x: (M, N); weight, bias: (N) or undefined; mean, rstd: (M)
void layer_norm_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, int64_t M, int64_t N, double eps);
/// out, x: (M, N); weight, bias: (N) or undefined; mean, rstd: (M)
void layer_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& weight, const Tensor& bias, int64_t M, int64_t N);
/// grad_x (or undefined), grad_out, x: (M, N); mean, rstd: (M); weight: (N) or undefined;
/// grad_weight, grad_bias: (N) or undefined.
void layer_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, int64_t M, int64_t N);
/// The scalar loops: what the two above run but for float32, and the reference their vectorized
/// float32 rows are tested against (Note [Vectorized layer norm] in tensor/cpu/norm_kernel.cpp).
void layer_norm_kernel_generic(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                               const Tensor& weight, const Tensor& bias, int64_t M, int64_t N, double eps);
void layer_norm_backward_kernel_generic(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                        const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                        const Tensor& weight, int64_t M, int64_t N);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void layer_norm_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       const Tensor& bias, int64_t M, int64_t N, double eps);
void layer_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& weight, const Tensor& bias, int64_t M, int64_t N);
void layer_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                const Tensor& weight, int64_t M, int64_t N);
}  // namespace frugal::ops::cuda
