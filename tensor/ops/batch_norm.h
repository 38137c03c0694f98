#pragma once
// Batch normalization over (N, C, *) inputs, per channel, forward and backward (raw ops;
// the differentiable form is frugal::batch_norm in autograd/ops/batch_norm.h).
//
// Note [Batch norm statistics]
// Channel c normalizes its M = N * prod(*) values. In training the forward computes the
// batch mean and the biased variance var (what it normalizes with), returns mean and
// invstd = 1 / sqrt(var + eps) for the backward, and, when running statistics are given,
// updates them in place as PyTorch does:
//   running_mean = (1 - momentum) running_mean + momentum mean
//   running_var  = (1 - momentum) running_var  + momentum var M / (M - 1)   (unbiased)
// In eval it normalizes with the running statistics, and returns them as mean and
// invstd = 1 / sqrt(running_var + eps) (fresh copies: later updates of the running
// statistics do not disturb a pending backward). With xhat = (x - mean) invstd:
//   y = xhat weight + bias
//   grad_weight = sum_M(g xhat),  grad_bias = sum_M(g)
//   grad_x = weight invstd (g - grad_bias / M - xhat grad_weight / M)   (training)
//   grad_x = weight invstd g                                             (eval: constant statistics)
// Statistics, weight, bias and running statistics are all handled in the compute type
// (float32 for float32/float16/bfloat16 inputs, float64 for float64), and may be stored
// either in it or in the input's dtype: a float16 network may keep float32 parameters
// and statistics, as PyTorch's mixed-precision batch norm does (Note [Half types
// compute in f32]). The CPU reduces in double per channel (two passes); the CUDA kernels
// (tensor/cuda/batch_norm.cu) are frugal's own, see Note [CUDA batch norm kernels].
//
// Note [Channels-last batch norm]
// A channels-last input (Note [Channels-last layout] in tensor/memory_format.h) gets a
// channels-last output, and so do the backward's grad_x (and grad_residual). On CUDA,
// training on a float16/bfloat16 channels-last input with float32 weight and bias runs
// cuDNN's persistent NHWC batch norm (cudnnBatchNormalizationForwardTrainingEx /
// BackwardEx, CUDNN_BATCHNORM_SPATIAL_PERSISTENT; tensor/cuda/batch_norm_cudnn.cu),
// which reads the input once per pass in its native order. cuDNN also returns the
// batch mean and 1 / sqrt(var + eps), and updates running statistics with the
// unbiased variance and the momentum as above, so results are interchangeable with
// the own kernels'; it may also need a "reserve space" kept from the forward to the
// backward: BatchNormResult::reserve, defined exactly when cuDNN ran the forward (then
// the backward must go to cuDNN too, and is given it). Every other forward (eval, float32,
// float64, the CPU, a problem cuDNN declines) runs the own kernels on an NCHW copy and
// converts the result back. Every other backward on CUDA (no reserve space: eval, float32,
// float64, a forward cuDNN did not run, batch_norm_relu_backward_affine) reads its operands
// in place as (N*H*W, C) rows (Note [Channels-last batch norm backward] in
// tensor/cuda/batch_norm_channels_last.cu): grad_out and out are converted only when not
// channels-last already, and grad_x and grad_residual are written channels-last, with no
// NCHW copy; batch_norm_add_relu_backward applies ReLU's mask from out, and writes
// grad_residual, in the same passes. The CPU backward runs on NCHW copies.
//
// Note [Batch norm add ReLU]
// ResNet's block tail is relu(bn(x) + residual), and its other batch norms are followed
// by relu alone. batch_norm_add_relu computes either as one op (residual undefined: no
// add): cuDNN's CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION / BN_ACTIVATION on the path above
// (one pass over the activations instead of two or three, forward and backward), else
// the own apply kernel, which adds the residual and applies ReLU in the same pass. Either
// way bn(x) + residual is formed in float32 and rounded once: rounding bn(x) to a 16-bit
// type before the add would move bn(x) + residual by up to half an ulp of bn(x), so its
// sign, ReLU's mask and so the whole gradient g would flip wherever it lies that close
// to 0 (hundreds of elements per ResNet activation in float16). Its backward needs the
// output only for ReLU's mask:
//   gz = g (out > 0);  grad_residual = gz;  grad_x, grad_weight, grad_bias = batch_norm_backward(gz)
// batch_norm_relu_backward_affine is that backward without a residual, for a relu(bn(x)) whose
// output was never kept: bn folded into scale = weight invstd, shift = bias - mean scale (as
// Note [Convolution batch-norm fusion] in tensor/ops/conv_bn.h folds it), ReLU's mask is
// recomputed from a = x scale + shift, formed in the compute dtype by a multiply and then an
// add, each rounded (no FMA), the same bits on every path: gz = a <= 0 ? 0 : g, which is
// g (a > 0) except that a NaN a passes g, as ReLU's backward passes g where its output is NaN
// (unary_grad in tensor/ops/unary_math.h).
#include "tensor/tensor.h"

namespace frugal::ops {

/// The outputs of batch_norm: y (x's shape and dtype), and the per-channel statistics it
/// normalized with, mean and invstd, of shape (C) in the compute dtype (float32, or float64
/// for float64 x). See Note [Batch norm statistics].
struct BatchNormResult {
  Tensor out, mean, invstd;
  Tensor reserve;  // cuDNN's reserve space (bytes) when cuDNN ran, else undefined (Note [Channels-last batch norm])
};

/// torch.nn.functional.batch_norm: x (N, C, *) floating; running_mean, running_var, weight,
/// bias of shape (C), each undefined or of x's dtype or the compute dtype, on x's device.
/// training: normalizes with the batch statistics and updates the running ones in place
/// (when defined; both or neither); eval: normalizes with the running statistics (required).
BatchNormResult batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                           const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

/// Which gradients batch_norm_backward should compute.
struct BatchNormGradMask {
  bool x = true, weight = true, bias = true;
  bool residual = true;  // batch_norm_add_relu only
};
/// grad_x (x's shape and dtype), grad_weight and grad_bias ((C), in the compute dtype),
/// grad_residual (batch_norm_add_relu only); undefined where not asked for.
struct BatchNormGrads {
  Tensor x, weight, bias, residual;
};

/// What a backward needs of its forward beyond its tensors: cuDNN's reserve space (the
/// forward's BatchNormResult::reserve, undefined when cuDNN did not run it), eps, and
/// (batch_norm_add_relu only) whether the forward added a residual.
struct BatchNormSaved {
  Tensor reserve;
  double eps = 1e-5;
  bool residual = true;
};

/// The gradients of batch_norm given grad_out (x's shape), the forward's x, weight (or
/// undefined), and the mean and invstd it returned; `training` as in the forward.
BatchNormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& invstd, bool training, BatchNormGradMask mask = {},
                                   const BatchNormSaved& saved = {});

/// relu(batch_norm(x, ...) + residual) as one op (Note [Batch norm add ReLU]); residual has
/// x's shape, dtype and device, or is undefined for relu(batch_norm(x, ...)). Arguments and
/// results otherwise as batch_norm.
BatchNormResult batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                                    const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                                    double momentum = 0.1, double eps = 1e-5);

/// The gradients of batch_norm_add_relu given grad_out, the forward's x and out, weight and
/// bias (either may be undefined), the mean and invstd and BatchNormSaved it returned.
BatchNormGrads batch_norm_add_relu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out,
                                            const Tensor& weight, const Tensor& bias, const Tensor& mean,
                                            const Tensor& invstd, bool training, BatchNormGradMask mask = {},
                                            const BatchNormSaved& saved = {});

/// The backward of relu(x * scale + shift) followed by nothing else, where scale and shift are the
/// forward's batch norm folded into one affine map per channel: scale = weight * invstd,
/// shift = bias - mean * scale (computed in the compute dtype), so relu(x*scale+shift) = relu(bn(x)).
/// ReLU's mask is recomputed from x, scale and shift (float multiply then add, no FMA), not read from a
/// stored output (Note [Batch norm add ReLU]). grad_x (x's shape, dtype, memory format), grad_weight,
/// grad_bias ((C), compute dtype) as batch_norm_backward; weight may be undefined (1). scale and shift:
/// (C) in the compute dtype, on x's device. mask.residual is ignored (there is no residual).
BatchNormGrads batch_norm_relu_backward_affine(const Tensor& grad_out, const Tensor& x, const Tensor& scale,
                                               const Tensor& shift, const Tensor& weight, const Tensor& mean,
                                               const Tensor& invstd, bool training, BatchNormGradMask mask = {});

/// The elementwise pass of batch_norm / batch_norm_add_relu alone, from given statistics:
/// out = (x - mean) invstd weight + bias (+ residual when defined, then ReLU when `relu`),
/// formed in the compute dtype and rounded once, as the forward's own kernels do. Updates
/// nothing. x (N, C, *) floating; mean and invstd (C) in the compute dtype (a forward's
/// BatchNormResult::mean and invstd); weight, bias as in batch_norm; residual (or undefined)
/// of x's shape, dtype and device. out has x's memory format: a channels-last x is read in
/// place as (N*H*W, C) rows. It regenerates a forward's output from what its backward keeps
/// (Note [Recomputable outputs] in autograd/recompute_cheap.cpp).
Tensor batch_norm_apply(const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean, const Tensor& invstd,
                        const Tensor& weight, const Tensor& bias);

}  // namespace frugal::ops

// Backend kernels. x, out, grad_out, grad_x: contiguous (N, C, HW) with N * C * HW > 0;
// every (C) tensor contiguous in the compute dtype opmath_t<T>, weight/bias/running
// statistics possibly undefined.
namespace frugal::ops::cpu {
/// Batch mean and invstd of x; updates running_mean/running_var in place when defined.
void batch_norm_stats_kernel(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& x, int64_t N, int64_t C, int64_t HW,
                             double momentum, double eps);
/// out = (x - mean) invstd weight + bias (+ residual when defined, then ReLU when `relu`), in
/// opmath_t<T>, rounded once
void batch_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                             int64_t HW);
/// grad_x (or undefined), grad_weight, grad_bias (or undefined) from grad_out and the forward's x, mean, invstd,
/// weight.
void batch_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                const Tensor& weight, bool training, int64_t N, int64_t C, int64_t HW);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void batch_norm_stats_kernel(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& x, int64_t N, int64_t C, int64_t HW,
                             double momentum, double eps);
void batch_norm_apply_kernel(const Tensor& out, const Tensor& x, const Tensor& residual, bool relu, const Tensor& mean,
                             const Tensor& invstd, const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                             int64_t HW);
void batch_norm_backward_kernel(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                const Tensor& weight, bool training, int64_t N, int64_t C, int64_t HW);

/// The backward of batch norm on channels-last tensors read in place, with ReLU's mask when
/// asked (Note [Channels-last batch norm backward] in tensor/cuda/batch_norm_channels_last.cu).
/// grad_out, x, out, grad_x, grad_residual: channels-last (N, C, H, W) of x's dtype, dense
/// (rows = N*H*W, C) memory, rows * C > 0; out (or undefined), scale and shift (or undefined)
/// pick gz: g (out > 0) when out is defined, g (x scale + shift > 0) when scale and shift
/// are, else g. mean, invstd, scale, shift, weight (or undefined: 1): (C) contiguous in the
/// compute dtype. Writes grad_x, grad_residual = gz ((rows, C)), grad_weight, grad_bias ((C),
/// compute dtype), each only when defined.
void batch_norm_backward_channels_last_kernel(const Tensor& grad_x, const Tensor& grad_residual,
                                              const Tensor& grad_weight, const Tensor& grad_bias,
                                              const Tensor& grad_out, const Tensor& x, const Tensor& out,
                                              const Tensor& scale, const Tensor& shift, const Tensor& mean,
                                              const Tensor& invstd, const Tensor& weight, bool training, int64_t rows,
                                              int64_t C);

// cuDNN's persistent NHWC batch norm (Note [Channels-last batch norm]); CUDA builds only.
// Every 4-D tensor is channels-last (N, C, H, W) of x's dtype (float16 or bfloat16); the
// (C) tensors are contiguous float32; residual, running_mean and running_var may be undefined.

/// Runs the training forward out = bn(x), then + residual (when defined), then ReLU
/// (when `relu`; always with a residual), writes mean and invstd, updates the running
/// statistics, and returns the reserve space; returns an undefined tensor, having
/// written nothing, when cuDNN does not take the problem.
Tensor batch_norm_cudnn_forward(const Tensor& out, const Tensor& mean, const Tensor& invstd, const Tensor& x,
                                const Tensor& residual, bool relu, const Tensor& weight, const Tensor& bias,
                                const Tensor& running_mean, const Tensor& running_var, double momentum, double eps);
/// The backward of batch_norm_cudnn_forward with the same `relu`: grad_x, grad_weight,
/// grad_bias (all required) and grad_residual (required exactly when the forward had a
/// residual). With ReLU, `out` is the forward's output and `bias` its bias.
void batch_norm_cudnn_backward(const Tensor& grad_x, const Tensor& grad_residual, const Tensor& grad_weight,
                               const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x, const Tensor& out,
                               bool relu, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                               const Tensor& invstd, const Tensor& reserve, double eps);
}  // namespace frugal::ops::cuda
