#pragma once
// Convolution + batch-norm fusions of ResNet's training forward, as raw ops. The
// differentiable forms are conv2d_stats and bn_relu_conv2d in autograd/ops/conv_bn.h.
//
// Note [Convolution batch-norm fusion]
// A ResNet bottleneck runs conv -> bn -> relu -> conv -> bn -> relu -> conv -> bn (+ x) ->
// relu. Unfused, each bn + relu reads the convolution's output y twice (statistics, then
// normalize + ReLU) and writes a = relu(bn(y)), which the next convolution reads, and keeps
// for its weight gradient. cuDNN's graph API fuses both ends into the convolutions (NVIDIA's
// MLPerf ResNet; cudnn-frontend's "SBRCS" sample), and these ops use it:
//   conv2d_stats          y = conv(x, w) and, per output channel, sum(y) and sum(y^2)
//                         (a GENSTATS node on the convolution's output tile, float32)
//   batch_norm_finalize   bn's mean, invstd (and the running statistics' update) from those
//                         sums, folded with bn's weight and bias into one affine map per
//                         channel: scale = weight invstd, shift = bias - mean scale
//   scale_bias_relu_conv2d  z = conv(relu(y scale + shift), w') and z's sums: bn + ReLU as
//                         the next convolution's prologue, so a is never written
// On the H200 (bench/probe_conv_bn_fusion) the fused convolution costs what the plain one
// costs plus 0-25%, against a plain convolution plus bn + ReLU's two passes. The backward
// (autograd/ops/conv_bn.cpp) recomputes a for the weight gradient and ReLU's mask from y,
// scale and shift, so a is not kept either: the memory of relu(bn(.)) outputs goes too.
// The variance comes from the sums as E[y^2] - E[y]^2 (formed in float64 from float32 sums,
// clamped at 0), as cuDNN's fused batch norm does: this loses precision only where a
// channel's |mean| is many times its standard deviation, which a convolution's output in
// training is not. cuDNN's fused prologue takes scale and shift in the data type (float32
// ones plan no engine on cuDNN 9.14), so bn_relu_conv2d rounds them to float16 for a float16
// input, on every path (forward, backward and devices agree): a relative error of 2^-12 in
// scale, and of 2^-12 |shift| in x scale + shift, where |shift| ~ |mean| / std (a
// convolution's output: O(1)) -- the error the stored float16 a carries anyway. ReLU's mask
// flips where x scale + shift lies that close to 0, and each flip passes or stops a whole
// gradient entry: a layer's input gradient is ~0.5% off float64 in the 2-norm (the unfused
// ops: ~0.05%; tests/gpu/test_conv_bn_cuda.cpp), and a ResNet's gradients stay within twice
// the unfused network's error (the same test, against float32). bfloat16
// would round them to 2^-9, so its prologue is not fused: a is materialized, then the
// convolution + statistics graph runs. The fused graphs take channels-last float16/bfloat16
// operands, 16-byte aligned, groups = 1, channel counts multiple of 8, on cuDNN >= 9;
// anything else, or a problem no engine plans, runs the same arithmetic as separate ops
// (conv2d, the channel sums as float64 reductions, scale_bias_relu), also the CPU's path.
// The backward's grad_x takes batch norm's weight invstd where the forward used the rounded
// scale: a difference of 2^-12 relative, below the gradient's own float16 rounding.
#include "tensor/ops/conv.h"
#include "tensor/tensor.h"

namespace frugal::ops {

/// A convolution's output and, when computed, its per-output-channel sum and sum of
/// squares ((K) in the compute dtype: float32, float64 for float64).
struct ConvStats {
  Tensor out, sum, sq_sum;
};

/// conv2d(x, weight) without bias, and (when `stats`) out's channel sums (see the Note).
ConvStats conv2d_stats(const Tensor& x, const Tensor& weight, const Conv2dOptions& options = {}, bool stats = true);

/// The per-channel sum and sum of squares of y (N, C, *), in the compute dtype, as separate
/// reductions: what conv2d_stats computes when no fused graph runs.
ConvStats channel_sums(const Tensor& y);

/// A batch norm folded into one affine map per channel (see the Note); all (C) in the
/// compute dtype: mean and invstd as batch_norm returns them (for its backward), and
/// scale = weight invstd, shift = bias - mean scale (weight 1, bias 0 where undefined).
struct BatchNormAffine {
  Tensor mean, invstd, scale, shift;
};

/// bn's statistics for an input of `count` values per channel whose sums are `sum` and
/// `sq_sum` ((C), compute dtype): training normalizes with mean = sum / count and the
/// biased variance, and updates running_mean / running_var (when defined) as batch_norm does
/// (Note [Batch norm statistics]); eval uses the running statistics (the sums are then
/// ignored and may be undefined). weight, bias and running statistics: (C) in `dtype` or
/// the compute dtype of `dtype` (the input's dtype), or undefined. `half_affine` rounds
/// scale and shift to values float16 holds (what cuDNN's fused prologue takes, see the Note).
BatchNormAffine batch_norm_finalize(const Tensor& sum, const Tensor& sq_sum, int64_t count, DType dtype,
                                    const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                    const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5,
                                    bool half_affine = false);

/// Checks that `t`, the scale or shift (`what`) of a per-channel affine map over x (N, C, *),
/// is (C) in x's compute dtype (float32, float64 for float64) on x's device; the error names
/// `op`, `what`, t and x.
void check_affine_map(const char* op, const char* what, const Tensor& t, const Tensor& x);

/// relu(x * scale + shift) per channel c of x (N, C, *), in the compute dtype and rounded
/// once; scale and shift (C) in the compute dtype. The input of scale_bias_relu_conv2d's
/// convolution, as its fallback and its backward form it. Keeps x's memory format.
Tensor scale_bias_relu(const Tensor& x, const Tensor& scale, const Tensor& shift);

/// conv2d(scale_bias_relu(x, scale, shift), weight) without bias, and (when `stats`) the
/// output's channel sums (see the Note).
ConvStats scale_bias_relu_conv2d(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& weight,
                                 const Conv2dOptions& options = {}, bool stats = true);

}  // namespace frugal::ops

// Backend kernels. (C) tensors contiguous in the compute dtype; the running statistics
// undefined or contiguous compute-dtype tensors updated in place.
namespace frugal::ops::cpu {
void batch_norm_finalize_kernel(const BatchNormAffine& out, const Tensor& sum, const Tensor& sq_sum, int64_t count,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, bool training, double momentum, double eps, bool half_affine);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void batch_norm_finalize_kernel(const BatchNormAffine& out, const Tensor& sum, const Tensor& sq_sum, int64_t count,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, bool training, double momentum, double eps, bool half_affine);
/// Runs conv(prologue(x), w) -> y, with y's sums when sum is defined, as one cuDNN graph
/// (tensor/cuda/conv_bn_graph.cu): the prologue is relu(x * scale + shift) when scale is
/// defined, nothing otherwise. Returns false, having written nothing, when the graph API
/// has no plan for it (the caller then runs the separate ops). Every 4-D operand
/// channels-last float16/bfloat16; scale, shift (C) of x's dtype; sum, sq_sum float32 (K).
bool conv_bn_graph(const Conv2dGeometry& g, const Tensor& y, const Tensor& sum, const Tensor& sq_sum, const Tensor& x,
                   const Tensor& scale, const Tensor& shift, const Tensor& w);
/// How many conv_bn_graph calls in this process ran a fused graph (for tests and benchmarks
/// that must know the fusion happened).
int64_t conv_bn_graph_runs();
}  // namespace frugal::ops::cuda
